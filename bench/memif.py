#!/usr/bin/env python3
"""memif: DPDK testpmd's memif client through vale into a native port, against DPDK's own memif
link with no switch (the floor).

For each frame size and run, alternating:

    vale:  testpmd txonly [net_memif client] -> vale0:cnf =valed= vale0:b -> vale-pktgen rx
    floor: testpmd txonly [net_memif client] -> [net_memif server] testpmd rxonly

valed is the memif server of port vale0:cnf (`vale-ctl attach vale0:cnf --memif SOCK`); the
sender's frames go to the MAC vale-pktgen announces on vale0:b. rx pps: vale-pktgen's frames
counted at vale0:b (valed's rx_packets of the port) over --seconds after a warm-up; the floor's
is peers.memif_run (testpmd's Rx-pps). CPU layout: the sender's forwarding lcore on the first
CPU, valed and vale-pktgen on the last (the floor: the receiver's forwarding lcore there); on
two vCPUs the switch and the receiver share a CPU that the floor's receiver has alone. Each
figure is the median of --runs, with min and max; the ratio is vale's median over the floor's.

    cargo build --release && bench/memif.py [--runs 5] [--seconds 2] [--sizes 60,1514]

Needs root (testpmd's runtime directories, apt-get for dpdk-dev). JSON:
bench/results/memif.json.
"""
import os, time

import common, peers
from common import summary, ratio, mpps, fmt_ratio

SIZES = "60,1514"
TX_MAC, RX_MAC = "02:00:00:00:0f:01", "02:00:00:00:0f:02"


def cpus():
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit("bench/memif.py needs two CPUs")
    return {"tx": str(allowed[0]), "valed": str(allowed[-1]), "rx": str(allowed[-1])}


def vale_run(size, a, lay, dpdk):
    """One run through vale: {rx_pps, valed_cores}."""
    v = common.Valed(layout={"name": "memif", **lay}, persistent=False)
    sock = os.path.join(v.run_dir, "cnf.sock")
    v.ctl("attach", "vale0:cnf", "--memif", sock)
    rx = common.spawn(v.pktgen("vale0:b", "rx", lay["rx"], "--announce", "-S", RX_MAC, "-T", a.seconds + a.warmup + 60),
                      env=v.env, stdout=common.subprocess.DEVNULL, stderr=common.subprocess.DEVNULL)
    tp = None
    try:
        v.wait_ports(["vale0:b"], announced=True)
        tp = peers.Testpmd("mtx", [f"net_memif0,role=client,id=0,socket={sock},socket-abstract=no,mac={TX_MAC}"],
                           "txonly", lay["tx"], [f"--txpkts={size}", f"--eth-peer=0,{RX_MAC}"], dpdk=dpdk)
        tp.wait_forwarding()
        deadline = time.monotonic() + 30
        while v.ports()["vale0:b"]["counters"]["rx_packets"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing reached vale0:b in 30 s:\n{tp.tail()}")
            time.sleep(0.05)
        time.sleep(a.warmup)
        b0, c0, t0 = v.ports()["vale0:b"]["counters"]["rx_packets"], common.cpu_seconds(v.pid), time.monotonic()
        time.sleep(a.seconds)
        b1, c1, t1 = v.ports()["vale0:b"]["counters"]["rx_packets"], common.cpu_seconds(v.pid), time.monotonic()
        return {"rx_pps": (b1 - b0) / (t1 - t0), "valed_cores": (c1 - c0) / (t1 - t0)}
    finally:
        if tp:
            tp.kill()
        common.stop(rx)
        common.stop(v.proc, common.signal.SIGTERM)


def main(argv=None):
    ap = common.parser(__doc__, "memif", runs=5, seconds=2.0, peers=False, layouts=("memif",))
    ap.add_argument("--sizes", default=SIZES, help=f"frame lengths without FCS (default {SIZES})")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds before counting (default 1)")
    a = common.parse(ap, argv)
    common.need_root("testpmd")
    peers.ensure_dpdk()
    dpdk = peers.dpdk_env()
    lay = cpus()
    results = []
    for size in common.int_list(a.sizes):
        runs = {"vale": [], "floor": []}
        for i in range(a.runs):
            runs["vale"].append(vale_run(size, a, lay, dpdk))
            runs["floor"].append(peers.memif_run(size, a.seconds, a.warmup))
            print(f"{size} B run {i + 1}: vale {runs['vale'][-1]['rx_pps'] / 1e6:.2f} Mpps, "
                  f"floor {runs['floor'][-1]['rx_pps'] / 1e6:.2f} Mpps", flush=True)
        r = {"frame_len": size,
             "vale": {k: summary([x[k] for x in runs["vale"]]) for k in runs["vale"][0]},
             "floor": {"rx_pps": summary([x["rx_pps"] for x in runs["floor"]])}}
        r["ratio"] = ratio(r["vale"]["rx_pps"], r["floor"]["rx_pps"])
        results.append(r)
    print(f"\ntestpmd memif client -> vale -> vale-pktgen, vs testpmd <-> testpmd over memif; "
          f"{a.runs} runs of {a.seconds} s; {common.describe()}")
    common.table(["len", "vale Mpps", "floor Mpps", "vale/floor", "valed cores"],
                 [[r["frame_len"], mpps(r["vale"]["rx_pps"]), mpps(r["floor"]["rx_pps"]), fmt_ratio(r["ratio"]),
                   f"{r['vale']['valed_cores']['median']:.2f}"] for r in results])
    common.write_report(a.out, "memif", a, {"name": "memif", **lay}, results)


if __name__ == "__main__":
    common.main_guard(main)

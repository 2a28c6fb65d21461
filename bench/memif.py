#!/usr/bin/env python3
"""memif: DPDK testpmd's memif client through vale into a native port, against DPDK's own memif
link with no switch (the floor).

For each frame size and run, alternating:

    vale:  testpmd txonly [net_memif client] -> vale0:cnf =valed= vale0:b -> vale-pktgen rx
    floor: testpmd txonly [net_memif client] -> [net_memif server] testpmd rxonly

valed is the memif server of port vale0:cnf (`vale-ctl attach vale0:cnf --memif SOCK`); the
sender's frames go to the MAC vale-pktgen announces on vale0:b. rx pps: vale-pktgen's frames
counted at vale0:b (valed's rx_packets of the port) over --seconds after a warm-up; the floor's
is peers.memif_run (testpmd's Rx-pps). Each figure is the median of --runs, with min and max;
the ratio is vale's median over the floor's.

CPU layout (--layout, or --cpus TX,VALED,RX): which CPU the sender (testpmd's two lcores),
valed (all its threads) and the receiver (vale-pktgen) run on; the floor's sender gets the
sender's CPU and its receiver (testpmd rxonly) the receiver's.

    split  sender on the first CPU; valed and vale-pktgen on the last (the floor: its
           receiver's forwarding lcore there alone, main lcores crossed as peers.MEMIF_LAYOUT
           has them). The default: not like for like on 2 CPUs, where the switch and the
           receiver share a CPU that the floor's receiver has alone.
    ends   sender and receiver share the first CPU on both sides; valed alone on the last
           (the endpoints placed alike; the switch gets the CPU the floor leaves idle, as it
           gets a core of its own on a host with one per party).
    one    every party of both sides on the first CPU.
    own    sender, valed and receiver a CPU each, on distinct cores where there are (3 CPUs or
           more; what --cpus does by hand).

    cargo build --release && bench/memif.py [--runs 5] [--seconds 2] [--sizes 60,1514]
    bench/memif.py --cpus 2,4,6        # a host with a core per party: sender cpu2, valed
                                       # cpu4, receiver cpu6; the floor's testpmds cpu2, cpu6

Needs root (testpmd's runtime directories, apt-get for dpdk-dev). JSON:
bench/results/memif.json.
"""
import os, time

import common, peers
from common import summary, ratio, mpps, fmt_ratio

SIZES = "60,1514"
TX_MAC, RX_MAC = "02:00:00:00:0f:01", "02:00:00:00:0f:02"


LAYOUTS = ("split", "ends", "one", "own")


def cpus(layout, given=None):
    """{tx, valed, rx, floor}: the CPU of each party (taskset lists) and the floor's
    {tx, rx} (None: peers.MEMIF_LAYOUT, the split layout's crossed main lcores)."""
    allowed = sorted(os.sched_getaffinity(0))
    if given:
        parts = given.split(",")
        if len(parts) != 3 or not all(x.strip().isdigit() for x in parts):
            raise SystemExit(f"--cpus takes three CPUs TX,VALED,RX (e.g. 2,4,6), not '{given}'")
        tx, valed, rx = (x.strip() for x in parts)
        bad = [c for c in (tx, valed, rx) if int(c) not in allowed]
        if bad:
            raise SystemExit(f"--cpus: CPU {bad[0]} is not one this process may run on ({allowed})")
        return {"tx": tx, "valed": valed, "rx": rx, "floor": {"tx": tx, "rx": rx}}
    if layout == "one":
        c = str(allowed[0])
        return {"tx": c, "valed": c, "rx": c, "floor": {"tx": c, "rx": c}}
    if len(allowed) < 2:
        raise SystemExit(f"bench/memif.py --layout {layout} needs two CPUs (--layout one runs on one)")
    first, last = str(allowed[0]), str(allowed[-1])
    if layout == "ends":
        return {"tx": first, "valed": last, "rx": first, "floor": {"tx": first, "rx": first}}
    if layout == "own":
        own = common.spread_cpus(3)
        if len(own) < 3:
            raise SystemExit(f"--layout own needs three CPUs, this machine has {len(allowed)}")
        tx, valed, rx = (str(c) for c in own)
        return {"tx": tx, "valed": valed, "rx": rx, "floor": {"tx": tx, "rx": rx}}
    if peers.MEMIF_LAYOUT["tx"]["forwarding"] != first or peers.MEMIF_LAYOUT["rx"]["forwarding"] != last:
        return {"tx": first, "valed": last, "rx": last, "floor": {"tx": first, "rx": last}}
    return {"tx": first, "valed": last, "rx": last, "floor": None}


def vale_run(size, a, lay, dpdk):
    """One run through vale: {rx_pps, valed_cores}."""
    v = common.Valed(layout={"name": "memif", **{k: lay[k] for k in ("tx", "valed", "rx")}}, persistent=False)
    sock = os.path.join(v.run_dir, "cnf.sock")
    v.ctl("attach", "vale0:cnf", "--memif", sock)
    rx = common.spawn(v.pktgen("vale0:b", "rx", lay["rx"], "--announce", "-S", RX_MAC, "-T", a.seconds + a.warmup + 60),
                      env=v.env, stdout=common.subprocess.DEVNULL, stderr=common.subprocess.DEVNULL)
    tp = None
    try:
        v.wait_ports(["vale0:b"], announced=True)
        if a.moderation:
            v.ctl("set", "vale0:b", "moderation", str(a.moderation))
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
    ap = common.parser(__doc__, "memif", runs=5, seconds=2.0, peers=False, layouts=LAYOUTS)
    ap.add_argument("--cpus", metavar="TX,VALED,RX",
                    help="the sender's, valed's and the receiver's CPU (the floor's sender and "
                         "receiver get the first and the last); overrides --layout")
    ap.add_argument("--sizes", default=SIZES, help=f"frame lengths without FCS (default {SIZES})")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds before counting (default 1)")
    ap.add_argument("--moderation", type=int, default=0, metavar="US",
                    help="interrupt moderation of the receiving port vale0:b, in microseconds "
                         "(vale-ctl set vale0:b moderation US: fewer wake-ups of a receiver that shares "
                         "valed's CPU; default 0, none)")
    ap.add_argument("--dpdk", metavar="DIR", help="a relocatable DPDK folder (bin/dpdk-testpmd, lib/, pmds/: "
                                                  "the peer bundle) instead of Debian's packages")
    a = common.parse(ap, argv)
    common.need_root("testpmd")
    if not a.dpdk:
        peers.ensure_dpdk()
    dpdk = peers.dpdk_env(a.dpdk)
    lay = cpus(a.layout, a.cpus)
    name = f"cpus {a.cpus}" if a.cpus else a.layout
    results = []
    for size in common.int_list(a.sizes):
        runs = {"vale": [], "floor": []}
        for i in range(a.runs):
            runs["vale"].append(vale_run(size, a, lay, dpdk))
            runs["floor"].append(peers.memif_run(size, a.seconds, a.warmup, cpus=lay["floor"], dpdk=dpdk))
            print(f"{size} B run {i + 1}: vale {runs['vale'][-1]['rx_pps'] / 1e6:.2f} Mpps, "
                  f"floor {runs['floor'][-1]['rx_pps'] / 1e6:.2f} Mpps", flush=True)
        r = {"frame_len": size,
             "vale": {k: summary([x[k] for x in runs["vale"]]) for k in runs["vale"][0]},
             "floor": {"rx_pps": summary([x["rx_pps"] for x in runs["floor"]])}}
        r["ratio"] = ratio(r["vale"]["rx_pps"], r["floor"]["rx_pps"])
        results.append(r)
    mod = f"; vale0:b moderation {a.moderation} us" if a.moderation else ""
    print(f"\ntestpmd memif client -> vale -> vale-pktgen, vs testpmd <-> testpmd over memif; "
          f"{a.runs} runs of {a.seconds} s; layout {name} (sender cpu {lay['tx']}, valed cpu {lay['valed']}, "
          f"receiver cpu {lay['rx']}){mod}; {common.describe()}")
    common.table(["len", "vale Mpps", "floor Mpps", "vale/floor", "valed cores"],
                 [[r["frame_len"], mpps(r["vale"]["rx_pps"]), mpps(r["floor"]["rx_pps"]), fmt_ratio(r["ratio"]),
                   f"{r['vale']['valed_cores']['median']:.2f}"] for r in results])
    floor = lay["floor"] or {r: peers.MEMIF_LAYOUT[r]["forwarding"] for r in ("tx", "rx")}
    common.write_report(a.out, "memif", a, {"name": name, "tx": lay["tx"], "valed": lay["valed"], "rx": lay["rx"],
                                            "floor_tx": floor["tx"], "floor_rx": floor["rx"]}, results)


if __name__ == "__main__":
    common.main_guard(main)

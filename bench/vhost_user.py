#!/usr/bin/env python3
"""vhost-user: DPDK virtio_user front ends through vale, and through DPDK's own vhost back end.

For each frame size and run, three parties, each the same in both systems but the middle:

    vale: testpmd txonly [virtio_user] -> vale1:vm1 =valed= vale1:vm2 -> [virtio_user] testpmd rxonly
    peer: testpmd txonly [virtio_user] -> [net_vhost0] testpmd io [net_vhost1] -> [virtio_user] testpmd rxonly

valed's two vhost-user ports are on one switch (vale1, nothing else on it) and listen at their
sockets, as DPDK's vhost PMD does; the virtio_user front ends connect (queues=1,
queue_size=1024). The middle testpmd forwards port 0 to port 1 (io mode). The sender sends
--txpkts=LEN frames to the receiver's MAC (an rx-only receiver never sends, so vale floods
them: to vm2, the only other port). rx pps is the receiver's RX-packets over --seconds after a
warm-up, read with `show port stats 0` (interactive testpmd); tx pps the sender's TX-packets
over the same time (what its driver queued); middle cores: CPU seconds per second of valed or
of the middle testpmd. Each figure is the median of --runs, with min and max; vale and peer
runs alternate; the ratio is vale's median rx pps over the peer's.

CPU layouts: three parties busy-poll (the peer) or nearly (vale under load) and a 2-vCPU machine
has two CPUs: split (default) pins the sender's lcores on cpu0 and the receiver's on cpu1, the
middle (valed, or the middle testpmd's lcores) runs on both; shared pins nothing; pinned
(--cpus A,B,C, e.g. on a 16-core machine) gives each party a CPU of its own: sender A,
middle B, receiver C (both lcores of a testpmd on its CPU; valed's threads all on B).

Fixed offered loads (--loads 0.5,1,2,4, in Mpps): testpmd 22.11's txonly has no rate limit,
so the sender is then vhost-paced (crates/vale-tests/src/bin/vhost-paced.rs), a vhost-user
front end of vale's own that posts frames at the rate for --seconds, in bursts every 20 us,
and mostly sleeps (on two vCPUs the three busy-polling parties of the saturation runs starve
each other). Same sender, same testpmd rxonly receiver, vale or the vhost PMD in the middle;
per load: frames posted (offered), frames the receiver counted (delivered), loss = 1 -
delivered / offered, and the frames the sender could not post because the middle had not
returned its descriptors yet (backlog: the middle did not keep up).

    cargo build --release && bench/vhost_user.py [--runs 5] [--seconds 2] [--sizes 60,1514]
                                                 [--layout split|shared|pinned --cpus 2,4,6]
                                                 [--loads 0.5,1,2,4]

Needs root (testpmd's runtime directories, apt-get for dpdk-dev).
"""
import os, shutil, sys, tempfile, time

import common, peers
from common import summary, ratio, mpps, fmt_ratio, on_exit

SIZES = "60,1514"
TX_MAC, RX_MAC = "02:00:00:00:0e:01", "02:00:00:00:0e:02"
LAYOUTS = ("pinned", "shared", "split")


def cpu_sets(a):
    """{tx, middle, rx}: the CPU set (EAL/taskset syntax) of each party."""
    allowed = sorted(os.sched_getaffinity(0))
    every = ",".join(str(c) for c in allowed)
    if a.layout == "pinned":
        cpus = common.int_list(a.cpus or "")
        if len(cpus) < 3 or len(set(cpus)) != len(cpus) or any(c not in allowed for c in cpus):
            raise SystemExit(f"--layout pinned needs --cpus with 3 distinct CPUs of {every} (sender, middle, receiver)")
        return {"tx": str(cpus[0]), "middle": str(cpus[1]), "rx": str(cpus[2])}
    if a.layout == "shared":
        return {"tx": every, "middle": every, "rx": every}
    if len(allowed) < 2:
        raise SystemExit("--layout split needs two CPUs")
    return {"tx": str(allowed[0]), "middle": f"{allowed[0]},{allowed[1]}", "rx": str(allowed[1])}


class Side:
    """The sender and receiver testpmd of one run, on sockets s0 (sender) and s1 (receiver)."""

    def __init__(self, s0, s1, size, cpus, dpdk, limit=30.0):
        """`limit`: seconds each testpmd may take to connect and start (longer for a middle
        under valgrind)."""
        self.rx = receiver(s1, cpus, dpdk, limit)
        vu = "net_virtio_user0,path={},queues=1,queue_size=1024,mac={}"
        self.tx = peers.Testpmd("tx", [vu.format(s0, TX_MAC)], "txonly", cpus["tx"],
                                [f"--txpkts={size}", f"--eth-peer=0,{RX_MAC}"], dpdk=dpdk)
        self.tx.wait_forwarding(limit)

    def measure(self, seconds, warmup, middle_pid):
        """Waits for traffic at the receiver, then the warm-up, then counts over `seconds`."""
        deadline = time.monotonic() + 30
        while self.rx.stats()["rx"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing reached the receiver in 30 s:\ntx: {self.tx.tail()}\nrx: {self.rx.tail()}")
            time.sleep(0.05)
        time.sleep(warmup)
        r0, t0, c0 = self.rx.stats(), self.tx.stats(), common.cpu_seconds(middle_pid)
        time.sleep(seconds)
        r1, t1, c1 = self.rx.stats(), self.tx.stats(), common.cpu_seconds(middle_pid)
        return {"rx_pps": (r1["rx"] - r0["rx"]) / (r1["t"] - r0["t"]),
                "tx_pps": (t1["tx"] - t0["tx"]) / (t1["t"] - t0["t"]),
                "middle_cores": (c1 - c0) / (r1["t"] - r0["t"])}

    def close(self):
        self.tx.kill()
        self.rx.kill()


def vale_run(v, socks, size, a, cpus, dpdk):
    side = Side(*socks, size, cpus, dpdk)
    try:
        ports = v.wait_state("up")
        before = ports["vale1:vm2"]["counters"]
        r = side.measure(a.seconds, a.warmup, v.pid)
        after = v.ports()["vale1:vm2"]["counters"]
        r["vm2_rx_drops"] = after["rx_drops"] - before["rx_drops"]
    finally:
        side.close()
    v.wait_state("down")
    return r


def paced(sock, size, mpps_load, a, rx):
    """vhost-paced into `sock` at the load, counted at testpmd `rx`: {offered, delivered, loss,
    backlog} (frames per second over the sender's seconds, loss a fraction)."""
    before = rx.stats()["rx"]
    out = common.subprocess.run(
        [f"{common.BIN}/vhost-paced", "--socket", sock, "--rate", str(mpps_load * 1e6),
         "--seconds", str(a.seconds), "--len", str(size), "--dst", RX_MAC],
        capture_output=True, text=True, timeout=a.seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(f"vhost-paced: {out.stderr.strip()}")
    r = common.json.loads(out.stdout.strip().splitlines()[-1])
    time.sleep(0.3)
    got = rx.stats()["rx"] - before
    return {"offered_pps": r["posted"] / r["seconds"], "delivered_pps": got / r["seconds"],
            "loss": 1 - got / max(r["posted"], 1), "backlog_pps": r["backlog"] / r["seconds"]}


def receiver(sock, cpus, dpdk, limit=30.0):
    """The receiving testpmd (rxonly, virtio_user at `sock`), forwarding (within `limit` s)."""
    rx = peers.Testpmd("rx", [f"net_virtio_user0,path={sock},queues=1,queue_size=1024,mac={RX_MAC}"],
                       "rxonly", cpus["rx"], dpdk=dpdk)
    rx.wait_forwarding(limit)
    return rx


def vale_load_run(v, socks, size, load, a, cpus, dpdk):
    rx = receiver(socks[1], cpus, dpdk)
    try:
        v.wait_state("up", ports=("vale1:vm2",))
        return paced(socks[0], size, load, a, rx)
    finally:
        rx.kill()


def vhost_pmd(d, cpus, dpdk):
    """The peer's middle: testpmd's vhost PMD forwarding (io) between two sockets it listens at
    in `d`; (testpmd, sender's socket, receiver's socket)."""
    s0, s1 = f"{d}/vhost0.sock", f"{d}/vhost1.sock"
    for s in (s0, s1):
        if os.path.exists(s):
            os.unlink(s)
    mid = peers.Testpmd("vh", [f"net_vhost0,iface={s0},queues=1", f"net_vhost1,iface={s1},queues=1"], "io",
                        cpus["middle"], dpdk=dpdk)
    return mid, s0, s1


def peer_load_run(d, size, load, a, cpus, dpdk):
    mid, s0, s1 = vhost_pmd(d, cpus, dpdk)
    try:
        mid.wait_forwarding()
        rx = receiver(s1, cpus, dpdk)
        try:
            return paced(s0, size, load, a, rx)
        finally:
            rx.kill()
    finally:
        mid.kill()


def loads_main(a, v, socks, d, sizes, cpus, dpdk, systems):
    """The fixed-load runs: a table per size of offered, delivered and loss for each system."""
    results = []
    for s in sizes:
        for load in common.float_list(a.loads):
            runs = {k: [] for k in systems}
            for i in range(a.runs):
                runs["vale"].append(vale_load_run(v, socks, s, load, a, cpus, dpdk))
                if "dpdk_vhost" in systems:
                    runs["dpdk_vhost"].append(peer_load_run(d, s, load, a, cpus, dpdk))
                print(f"{s} B at {load} Mpps run {i + 1}: " + ", ".join(
                    f"{k} {runs[k][-1]['delivered_pps'] / 1e6:.3f} Mpps ({runs[k][-1]['loss'] * 100:.2f}% lost)"
                    for k in systems), flush=True)
            r = {"frame_len": s, "load_mpps": load}
            for k in systems:
                r[k] = {f: summary([x[f] for x in runs[k]]) for f in runs[k][0]}
            results.append(r)
    rows = []
    for r in results:
        row = [r["frame_len"], r["load_mpps"]]
        for k in systems:
            x = r[k]
            row += [mpps(x["offered_pps"]), mpps(x["delivered_pps"]), f"{x['loss']['median'] * 100:.2f}%"]
        rows.append(row)
    print(f"\nvhost-paced -> middle -> virtio_user rxonly, {a.runs} runs of {a.seconds} s per load; "
          f"layout {a.layout}: sender cpu {cpus['tx']}, middle cpu {cpus['middle']}, receiver cpu {cpus['rx']}")
    headers = ["len", "load Mpps"]
    for k in systems:
        name = "vale" if k == "vale" else "vhost PMD"
        headers += [f"{name} offered", f"{name} delivered", f"{name} loss"]
    common.table(headers, rows)
    return results


def peer_run(d, size, a, cpus, dpdk):
    mid, s0, s1 = vhost_pmd(d, cpus, dpdk)
    try:
        mid.wait_forwarding()
        side = Side(s0, s1, size, cpus, dpdk)
        try:
            return side.measure(a.seconds, a.warmup, mid.proc.pid)
        finally:
            side.close()
    finally:
        mid.kill()


class ValeVhost(common.Valed):
    """valed (pinned to the middle's CPUs) with vale1:vm1 and vale1:vm2 listening at `socks`."""

    def __init__(self, cpus, socks, busy_poll_us=0, wrapper=()):
        super().__init__({"valed": cpus["middle"], "tx": cpus["tx"], "rx": cpus["rx"]},
                         extra=("--busy-poll-us", str(busy_poll_us)), wrapper=wrapper)
        for port, s in zip(("vale1:vm1", "vale1:vm2"), socks):
            self.ctl("attach", port, "--vhost-user", s)

    def wait_state(self, state, limit=30.0, ports=("vale1:vm1", "vale1:vm2")):
        deadline = time.monotonic() + limit
        while True:
            p = self.ports()
            if all(p[n]["state"] == state for n in ports):
                return p
            if time.monotonic() > deadline:
                raise RuntimeError(f"vale1's vhost-user ports not {state} after {limit:g} s: {p}")
            time.sleep(0.02)


def main():
    ap = common.parser(__doc__, "vhost_user", seconds=2.0, peers=True, layouts=LAYOUTS)
    ap.add_argument("--sizes", default=SIZES, help=f"frame sizes, 60-1514 (default {SIZES})")
    ap.add_argument("--cpus", help="with --layout pinned: sender, middle and receiver CPUs, e.g. 2,4,6 "
                                   "(given alone, it implies --layout pinned)")
    ap.add_argument("--busy-poll-us", type=int, default=0,
                    help="valed --busy-poll-us: how long its threads keep looking at a dry ring or guest "
                         "before they sleep (default 0, valed's default)")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of traffic before counting (default 1; --quick 0.5)")
    ap.add_argument("--loads", metavar="MPPS", help="fixed offered loads instead of saturation, "
                                                    "e.g. 0.5,1,2,4 (Mpps; the sender is vhost-paced)")
    ap.add_argument("--dpdk", metavar="DIR", help="a relocatable DPDK folder (bin/dpdk-testpmd, lib/, pmds/) "
                                                  "instead of Debian's packages")
    a = common.parse(ap)
    if a.cpus and a.layout != "pinned":
        if any(x.startswith("--layout") for x in sys.argv[1:]):
            ap.error("--cpus goes with --layout pinned")
        a.layout = "pinned"
    if a.quick:
        a.warmup = min(a.warmup, 0.5)
    sizes = common.int_list(a.sizes)
    if any(not 60 <= s <= 1514 for s in sizes):
        ap.error("sizes must be 60..1514")
    common.need_root("bench/vhost_user.py (testpmd)")
    cpus = cpu_sets(a)
    dpdk = peers.dpdk_env(a.dpdk)

    d = tempfile.mkdtemp(prefix="vb-vhost-")
    on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    socks = (f"{d}/vm1.sock", f"{d}/vm2.sock")
    v = ValeVhost(cpus, socks, a.busy_poll_us)

    systems = ["vale"] + ([] if a.no_peers else ["dpdk_vhost"])
    if a.loads:
        if a.out == os.path.join(common.RESULTS, "vhost_user.json"):
            a.out = os.path.join(common.RESULTS, "vhost_user_loads.json")
        results = loads_main(a, v, socks, d, sizes, cpus, dpdk, systems)
        common.stop(v.proc, common.signal.SIGTERM)
        layout = {"name": a.layout, "sender": cpus["tx"], "receiver_lcores": cpus["rx"],
                  "middle": cpus["middle"], "valed_busy_poll_us": a.busy_poll_us}
        setup = {"sender": "vhost-paced: VERSION_1 only, queue_size 1024, bursts every 20 us",
                 "receiver": "testpmd rxonly, net_virtio_user0 queues=1 queue_size=1024",
                 "loss": "1 - receiver's RX-packets delta / frames posted"}
        common.write_report(a.out, "vhost_user_loads", a, layout, results, setup=setup, systems=systems)
        return
    results = []
    for s in sizes:
        runs = {k: [] for k in systems}
        for i in range(a.runs):
            runs["vale"].append(vale_run(v, socks, s, a, cpus, dpdk))
            if "dpdk_vhost" in systems:
                runs["dpdk_vhost"].append(peer_run(d, s, a, cpus, dpdk))
            print(f"{s} B run {i + 1}: " + ", ".join(f"{k} {runs[k][-1]['rx_pps'] / 1e6:.2f} Mpps" for k in systems),
                  flush=True)
        r = {"frame_len": s}
        for k in systems:
            r[k] = {f: summary([x[f] for x in runs[k]]) for f in runs[k][0]}
        if "dpdk_vhost" in systems:
            r["ratio"] = ratio(r["vale"]["rx_pps"], r["dpdk_vhost"]["rx_pps"])
        results.append(r)
    common.stop(v.proc, common.signal.SIGTERM)

    rows = []
    for r in results:
        row = [r["frame_len"], mpps(r["vale"]["rx_pps"]), mpps(r["vale"]["tx_pps"]),
               f"{r['vale']['middle_cores']['median']:.2f}"]
        if "dpdk_vhost" in systems:
            row += [mpps(r["dpdk_vhost"]["rx_pps"]), mpps(r["dpdk_vhost"]["tx_pps"]),
                    f"{r['dpdk_vhost']['middle_cores']['median']:.2f}", fmt_ratio(r["ratio"])]
        rows.append(row)
    print(f"\nvirtio_user txonly -> middle -> virtio_user rxonly, {a.runs} runs of {a.seconds} s "
          f"(warm-up {a.warmup} s); layout {a.layout}: sender cpu {cpus['tx']}, middle cpu {cpus['middle']}, "
          f"receiver cpu {cpus['rx']}; valed --busy-poll-us {a.busy_poll_us}")
    headers = ["len", "vale rx Mpps (min-max)", "vale tx Mpps", "valed cores"]
    if "dpdk_vhost" in systems:
        headers += ["vhost PMD rx Mpps", "vhost PMD tx Mpps", "middle cores", "vale/vhost PMD"]
    common.table(headers, rows)
    layout = {"name": a.layout, "sender_lcores": cpus["tx"], "receiver_lcores": cpus["rx"],
              "middle": cpus["middle"], "note": "each testpmd: main and forwarding lcore on its CPU set; "
                                                "valed: taskset on the middle's CPU set, 1 worker",
              "valed_busy_poll_us": a.busy_poll_us}
    setup = {
        "dpdk": peers.testpmd_version() if not a.dpdk else "DPDK from --dpdk folder",
        "front_ends": "testpmd -i --auto-start, --no-huge -m 512 --single-file-segments, "
                      "--total-num-mbufs=16384, net_virtio_user0 queues=1 queue_size=1024, burst 32",
        "vale": "valed, vale1:vm1 and vale1:vm2 vhost-user (valed listens); frames flooded to vm2",
        "dpdk_vhost": "testpmd --forward-mode=io, net_vhost0 and net_vhost1 (queues=1, server)",
        "counting": "rx pps: receiver's RX-packets delta over --seconds; tx pps: sender's TX-packets delta",
    }
    common.write_report(a.out, "vhost_user", a, layout, results, setup=setup, systems=systems,
                        warmup=a.warmup, ratio="median rx pps through vale / median rx pps through the vhost PMD")


if __name__ == "__main__":
    common.main_guard(main)

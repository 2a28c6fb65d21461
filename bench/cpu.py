#!/usr/bin/env python3
"""CPU cost: valed's CPU seconds per million packets under load, and its CPU while idle.

Busy: one sender to one receiver (as bench/sizes.py) at each --sizes; valed's user+system CPU
time (/proc/PID/stat) over the sender's run, divided by the frames sent, in CPU seconds per
million packets. Peers in the same run: ovs-vswitchd (Open vSwitch userspace datapath, its CPU
over the measured seconds / frames delivered), and the two DPDK testpmd processes over memif
(both busy-poll: about 2 cores whatever the rate).

Idle: --idle-ports persistent ports plus --idle-clients vale-pktgen receivers holding ports
and waiting (after a burst of traffic to each), then valed's CPU over --idle-seconds, as a
fraction of one core (target: under 1%). ovs-vswitchd's idle CPU with its ports is the peer.

    cargo build --release && bench/cpu.py [--runs 5] [--seconds 2] [--idle-seconds 5]
"""
import subprocess, time

import common, peers
from common import summary, fmt_ratio


def fmt(s, digits=3):
    return "-" if not s else f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def main():
    ap = common.parser(__doc__, "cpu")
    ap.add_argument("--sizes", default="60,1514", help="frame sizes for the busy measurement (default 60,1514)")
    ap.add_argument("--idle-seconds", type=float, default=5, help="seconds of each idle measurement (default 5; --quick 1)")
    ap.add_argument("--idle-ports", type=int, default=64, help="persistent ports while idle (default 64)")
    ap.add_argument("--idle-clients", type=int, default=8, help="vale-pktgen receivers holding ports while idle (default 8)")
    ap.add_argument("--peers", default="ovs,dpdk_memif", help="which peers, of ovs, dpdk_memif (default both)")
    a = common.parse(ap)
    if a.quick:
        a.idle_seconds = min(a.idle_seconds, 1)
    sizes = common.int_list(a.sizes)
    which = [] if a.no_peers else [p for p in a.peers.split(",") if p]
    known = ("ovs", "dpdk_memif")
    if any(p not in known for p in which):
        ap.error(f"--peers takes {', '.join(known)}")
    if which:
        common.need_root("bench/cpu.py with peers (use --no-peers for vale alone)")

    v = common.Valed(a.layout)
    busy = []
    for s in sizes:
        runs = [v.run(s, a.seconds) for _ in range(a.runs)]
        busy.append({"frame_len": s, "vale": {
            "valed_cpu_s_per_mpkt": summary([common.cpu_per_mpkt(x["valed_cpu_s"], x["tx"]["packets"]) for x in runs]),
            "valed_cores": summary([x["valed_cpu_s"] / x["wall_s"] for x in runs]),
            "rx_pps": summary([common.rx_pps(x) for x in runs])}})
        print(f"vale {s} B: {fmt(busy[-1]['vale']['valed_cpu_s_per_mpkt'], 4)} CPU s per Mpkt", flush=True)

    # Idle: persistent ports, clients holding ports after a burst, then nothing.
    for i in range(a.idle_ports):
        v.ctl("create", f"vale0:idle{i}")
    clients = [common.spawn(v.pktgen(f"vale0:c{i}", "rx", v.layout["rx"], "-T", a.idle_seconds * a.runs + 60),
                            env=v.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i in range(a.idle_clients)]
    v.wait_ports([f"vale0:c{i}" for i in range(a.idle_clients)])
    common.sh(v.pktgen("vale0:a", "tx", v.layout["tx"], "-n", 10000), env=v.env)   # a broadcast burst to all
    time.sleep(0.5)
    idle_runs = [v.idle_cpu(a.idle_seconds) for _ in range(a.runs)]
    listed = len(v.ports())
    for c in clients:
        common.stop(c)
    common.stop(v.proc, common.signal.SIGTERM)
    idle = {"vale": {"ports": listed, "persistent_ports": a.idle_ports + 1, "clients": a.idle_clients,
                     "valed_cores": summary(idle_runs)}}
    print(f"vale idle, {listed} ports: {fmt(idle['vale']['valed_cores'], 5)} of a core", flush=True)
    layout = {"vale": v.cpu_layout()}
    setup = {"vale": "vale-pktgen tx vale0:a -> valed -> vale-pktgen rx vale0:b (broadcast); valed CPU = "
                     "utime+stime delta over the sender's run / frames sent"}

    if "ovs" in which:
        o = peers.Ovs()
        for r in busy:
            if r["frame_len"] > 1514:
                continue
            runs = [peers.trafgen_run(o, r["frame_len"], a.seconds) for _ in range(a.runs)]
            r["ovs"] = {"switch_cpu_s_per_mpkt": summary([common.cpu_per_mpkt(x["switch_cpu_s"], x["rx_packets"])
                                                          for x in runs]),
                        "switch_cores": summary([x["switch_cpu_s"] / a.seconds for x in runs]),
                        "rx_pps": summary([x["rx_pps"] for x in runs])}
            print(f"ovs {r['frame_len']} B: {fmt(r['ovs']['switch_cpu_s_per_mpkt'])} CPU s per Mpkt", flush=True)
        time.sleep(0.5)
        idle_ovs = []
        for _ in range(a.runs):
            c0, t0 = common.cpu_seconds(o.switch_pid), time.monotonic()
            time.sleep(a.idle_seconds)
            idle_ovs.append((common.cpu_seconds(o.switch_pid) - c0) / (time.monotonic() - t0))
        idle["ovs"] = {"ports": len(o.sw_ports) + 1, "switch_cores": summary(idle_ovs)}
        setup["ovs"] = {**o.setup_note(), "cpu": "ovs-vswitchd utime+stime over the measured seconds / frames "
                                                 "delivered"}
        layout["ovs"] = {"tx": "0 (trafgen, taskset)", "switch": "ovs-vswitchd, not pinned"}
        o.close()
    if "dpdk_memif" in which:
        for r in busy:
            if r["frame_len"] > 1514:
                continue
            runs = [peers.memif_run(r["frame_len"], a.seconds) for _ in range(a.runs)]
            r["dpdk_memif"] = {"cpu_s_per_mpkt": summary([x["cpu_s_per_mpkt"] for x in runs]),
                               "cores": summary([x["cores"] for x in runs]),
                               "rx_pps": summary([x["rx_pps"] for x in runs])}
            print(f"dpdk memif {r['frame_len']} B: {fmt(r['dpdk_memif']['cpu_s_per_mpkt'])} CPU s per Mpkt "
                  "(both processes)", flush=True)
        setup["dpdk_memif"] = f"{peers.testpmd_version()}: CPU of both testpmd processes (sender and receiver: " \
                              "no switch) / frames received"
        layout["dpdk_memif"] = {"tx_forwarding_lcore": "0", "rx_forwarding_lcore": "1"}
    for r in busy:
        vr = r["vale"]["valed_cpu_s_per_mpkt"]
        r["ratio"] = {"ovs": common.ratio(vr, r["ovs"]["switch_cpu_s_per_mpkt"]) if "ovs" in r else None,
                      "dpdk_memif": common.ratio(vr, r["dpdk_memif"]["cpu_s_per_mpkt"]) if "dpdk_memif" in r else None}

    print(f"\nCPU seconds per million packets, {a.runs} runs of {a.seconds} s; vale layout {a.layout}: "
          f"valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, rx cpu {v.layout['rx']}")
    common.table(["len", "valed", "valed cores", "ovs-vswitchd", "vale/ovs", "testpmd x2 (memif)", "vale/memif"],
                 [[r["frame_len"], fmt(r["vale"]["valed_cpu_s_per_mpkt"], 4), fmt(r["vale"]["valed_cores"], 2),
                   fmt(r.get("ovs", {}).get("switch_cpu_s_per_mpkt")), fmt_ratio(r["ratio"]["ovs"]),
                   fmt(r.get("dpdk_memif", {}).get("cpu_s_per_mpkt")), fmt_ratio(r["ratio"]["dpdk_memif"])]
                  for r in busy])
    iv = idle["vale"]["valed_cores"]
    print(f"idle: valed {iv['median'] * 100:.3f}% of a core (max {iv['max'] * 100:.3f}%) with {listed} ports "
          f"({a.idle_clients} held by waiting clients), target < 1%"
          + (f"; ovs-vswitchd {idle['ovs']['switch_cores']['median'] * 100:.2f}% with 3 ports" if "ovs" in idle else ""))
    common.write_report(a.out, "cpu", a, layout, {"busy": busy, "idle": idle}, setup=setup,
                        idle_seconds=a.idle_seconds,
                        ratio="vale's CPU s per Mpkt / the peer's (lower is better for vale)")


if __name__ == "__main__":
    common.main_guard(main)

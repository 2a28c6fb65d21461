#!/usr/bin/env python3
"""Round-trip latency (VALE paper, figure 12): ping-pong between two processes through vale.

vale: `vale-pktgen -f pong --announce` on vale0:b echoes every frame; `vale-pktgen -f ping` on
vale0:a sends one frame to b's MAC, waits for its echo, and sends the next, for --seconds. Both
sleep in poll between frames (no busy-polling), as in the paper's experiment. Each run reports
min, median, 99th percentile and max; the table gives the median over runs of each.

Peer: the Linux bridge between veths in namespaces, `ping -i 0.001` (ICMP echo of the same
frame size) from one namespace to the other: the reply comes from the kernel itself, no
process wakes up on that side. The ratio is the bridge's median RTT / vale's.

    cargo build --release && bench/latency.py [--runs 5] [--seconds 2] [--sizes 60,1514]
"""
import json, subprocess

import common, peers
from common import summary


def fmt(s):
    return "-" if not s else f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def vale_ping(v, size, seconds):
    pong = common.spawn(v.pktgen("vale0:b", "pong", v.layout["rx"], "-T", seconds + 30, "--announce",
                                 "-S", common.mac_of(1)), env=v.env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    try:
        v.wait_ports(["vale0:b"], announced=True)
        out = common.sh(v.pktgen("vale0:a", "ping", v.layout["tx"], "-l", size, "-T", seconds,
                                 "-D", common.mac_of(1)), timeout=seconds + 30, env=v.env)
    finally:
        common.stop(pong)
    rtt = json.loads(out).get("rtt")
    if not rtt:
        raise RuntimeError(f"vale-pktgen ping measured nothing: {out}")
    return rtt


def main():
    ap = common.parser(__doc__, "latency")
    ap.add_argument("--sizes", default="60,1514", help="frame sizes (default 60,1514; the paper also has 256..1024)")
    a = common.parse(ap)
    sizes = common.int_list(a.sizes)
    if any(not 60 <= s <= 1514 for s in sizes):
        ap.error("sizes must be 60..1514")
    if not a.no_peers:
        common.need_root("bench/latency.py with the Linux bridge (use --no-peers for vale alone)")

    v = common.Valed(a.layout)
    results = []
    for s in sizes:
        runs = [vale_ping(v, s, a.seconds) for _ in range(a.runs)]
        results.append({"switch": "vale", "frame_len": s, "samples": sum(r["samples"] for r in runs),
                        **{k: summary([r[f"{k}_us"] for r in runs]) for k in ("min", "median", "p99", "max")}})
        print(f"vale {s} B: median RTT {fmt(results[-1]['median'])} us", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    layout = {"vale": v.cpu_layout(ping=v.layout["tx"], pong=v.layout["rx"])}
    setup = {"vale": "vale-pktgen ping vale0:a -> valed -> vale-pktgen pong vale0:b (--announce, unicast), "
                     "both sleeping in poll"}
    if not a.no_peers:
        b = peers.LinuxBridge()
        b.addresses()
        for s in sizes:
            per_run = []
            for _ in range(a.runs):
                rtts = sorted(peers.kernel_ping(b, s, max(10, int(a.seconds * 1000)), timeout=a.seconds * 5 + 30))
                at = lambda q: rtts[round((len(rtts) - 1) * q)]
                per_run.append({"samples": len(rtts), "min_us": at(0), "median_us": at(0.5), "p99_us": at(0.99),
                                "max_us": at(1)})
            results.append({"switch": "linux_bridge", "frame_len": s, "samples": sum(r["samples"] for r in per_run),
                            **{k: summary([r[f"{k}_us"] for r in per_run]) for k in ("min", "median", "p99", "max")}})
            print(f"linux bridge {s} B: median RTT {fmt(results[-1]['median'])} us", flush=True)
        setup["linux_bridge"] = {**b.setup_note(), "client": "ping -i 0.001 (iputils), taskset -c 0",
                                 "server": "the kernel's ICMP echo reply (no process)",
                                 "resolution": "ping prints times in 1 us steps"}
        layout["linux_bridge"] = {"ping": "0", "switch": "kernel softirq", "pong": "kernel"}

    for r in results:
        if r["switch"] == "vale":
            peer = next((p for p in results if p["switch"] == "linux_bridge" and p["frame_len"] == r["frame_len"]), None)
            r["linux_bridge_over_vale"] = common.ratio(peer["median"], r["median"]) if peer else None
    print(f"\nround-trip time, us, {a.runs} runs of {a.seconds} s; vale layout {a.layout}: valed cpu "
          f"{v.layout['valed']}, ping cpu {v.layout['tx']}, pong cpu {v.layout['rx']}")
    common.table(["switch", "len", "min", "median", "p99", "samples", "bridge/vale (median)"],
                 [[r["switch"], r["frame_len"], fmt(r["min"]), fmt(r["median"]), fmt(r["p99"]), r["samples"],
                   common.fmt_ratio(r.get("linux_bridge_over_vale")) if r["switch"] == "vale" else ""]
                  for r in results])
    common.write_report(a.out, "latency", a, layout, results, setup=setup, unit="microseconds",
                        ratio="median RTT through the Linux bridge (kernel ping) / median RTT through vale")


if __name__ == "__main__":
    common.main_guard(main)

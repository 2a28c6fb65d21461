#!/usr/bin/env python3
"""The bound of the machine: the least work any switch that isolates its ports does.

`bare-copy` (crates/vale-tests/src/bin/bare-copy.rs) moves frames from one thread to another
through a netmap-style single-producer/single-consumer ring in shared memory (vale's slots,
buffers and CSB indices), one copy per frame and nothing else: no lookup, no system call, no
second port. Each thread is pinned to a CPU of its own (--cpus P,C; default the first two CPUs
on distinct cores: cpu0 and cpu1 on a 2-vCPU machine). The producer copies each frame from a
prefilled source buffer into the slot's buffer, as valed copies from a sender's buffer into a
receiver's; the consumer reads the slot and gives it back, as `vale-pktgen -f rx` does
(--touch: it also reads each 64-byte chunk of the payload).

A vale figure over this one, measured on the same machine in the same run, says how much of
the machine the switch leaves unused; bench/sizes.py measures it beside vale (`bare_copy`),
and bench/summary.py shows vale's rates as a fraction of it.

    cargo build --release && bench/bound.py [--runs 5] [--seconds 2] [--sizes 60,1514] [--cpus 0,1]

Needs no root. Prints a table and writes bench/results/bound.json.
"""
import json, os, subprocess, sys

import common
from common import summary, mpps

SIZES = "60,1514"
EXE = os.path.join(common.BIN, "bare-copy")


def default_cpus():
    return ",".join(str(c) for c in common.spread_cpus(2))


def run(size, seconds, cpus=None, touch=False):
    """One bare-copy run: its JSON report ({len, pps, packets, seconds, cpus, ...})."""
    if not os.path.exists(EXE):
        sys.exit(f"{EXE} missing: run cargo build --release first")
    cmd = ["timeout", "-s", "KILL", f"{seconds + 10:.0f}", EXE, "--len", str(size),
           "--seconds", str(seconds), "--cpus", cpus or default_cpus()]
    if touch:
        cmd.append("--touch")
    return json.loads(common.sh(cmd, timeout=seconds + 15))


def measure(sizes, runs, seconds, cpus=None, touch=False):
    """{size: {rx_pps: summary}} over `runs` runs of each size."""
    return {s: {"rx_pps": summary([run(s, seconds, cpus, touch)["pps"] for _ in range(runs)])} for s in sizes}


def setup_note(cpus=None, touch=False):
    return (f"bare-copy: producer thread on cpu{(cpus or default_cpus()).split(',')[0]} copies each frame "
            f"(64-byte chunks) from a prefilled source buffer into a slot's buffer, consumer thread on "
            f"cpu{(cpus or default_cpus()).split(',')[1]} reads the slot{' and every 64-byte chunk' if touch else ''}; "
            "1024 slots, 2112-byte buffers, indices published once per batch of up to 512")


def main():
    ap = common.parser(__doc__, "bound", peers=False)
    ap.add_argument("--sizes", default=SIZES, help=f"frame sizes, 14-2112 (default {SIZES})")
    ap.add_argument("--cpus", help="producer and consumer CPUs (default: the first two on distinct cores)")
    ap.add_argument("--touch", action="store_true", help="the consumer also reads every 64-byte chunk of each frame")
    a = common.parse(ap)
    sizes = common.int_list(a.sizes)
    if any(not 14 <= s <= 2112 for s in sizes):
        ap.error("sizes must be 14..2112 (one buffer)")
    cpus = a.cpus or default_cpus()
    if len(set(cpus.split(","))) != 2:
        ap.error("--cpus takes two distinct CPUs; this machine has " + str(len(common.cpu_topology())))
    res = measure(sizes, a.runs, a.seconds, cpus, a.touch)
    layout = {"name": "bare_copy", "producer": cpus.split(",")[0], "consumer": cpus.split(",")[1]}
    where = f"producer cpu{layout['producer']}, consumer cpu{layout['consumer']}"
    print(f"\nbare copy between two cores, {a.runs} runs of {a.seconds} s; {common.describe(where)}")
    common.table(["len", "Mpps (min-max)", "Gbit/s", "ns/frame"],
                 [[s, mpps(r["rx_pps"]), f"{r['rx_pps']['median'] * s * 8 / 1e9:.1f}",
                   f"{1e9 / r['rx_pps']['median']:.1f}"] for s, r in res.items()])
    common.write_report(a.out, "bound", a, layout, [{"frame_len": s, "bare_copy": r} for s, r in res.items()],
                        setup={"bare_copy": setup_note(cpus, a.touch)})


if __name__ == "__main__":
    common.main_guard(main)

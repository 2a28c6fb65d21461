#!/usr/bin/env python3
"""Instructions a frame: what one forwarding worker executes per frame, counted, not timed.

valed runs under valgrind's callgrind, counting only inside `Pipeline::forward` (gather,
lookup, delivery: the whole forwarding path, without the worker's sleeps and wake-ups);
`vale-pktgen` sends --frames frames a -> b as fast as it can (full batches) into a receiver
with a deep ring (nothing dropped), and the count is divided by the frames. The figure does
not move with the host's load or its CPU model (only with the compiler and the code), so it
tells two builds apart where timed runs on a small or busy machine cannot: set VALE_BIN_DIR to
another build's target/release to count it (and --out to keep both JSONs). It says nothing of
cache misses, which the timed experiments see.

    cargo build --release && bench/instructions.py [--frames 200000] [--sizes 60,1514]

Needs valgrind (installed with apt-get when missing, as root) and no other root. Writes
bench/results/instructions.json.
"""
import json, os, re, signal, subprocess, tempfile

import common

SIZES = "60,1514"


def count(size, frames):
    """Instructions in Pipeline::forward and all it calls, and the receiver's report."""
    fd, out = tempfile.mkstemp(prefix="vale-callgrind-")
    os.close(fd)
    common.on_exit(lambda: os.path.exists(out) and os.unlink(out))
    v = common.Valed("shared", persistent=False,
                     wrapper=["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
                              "--toggle-collect=*Pipeline::forward*"])
    rx = common.spawn(v.pktgen("vale0:b", "rx", v.layout["rx"], "-n", frames, "--slots", 4096, "-T", 300),
                      env=v.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    common.on_exit(lambda: common.stop(rx))
    v.wait_ports(["vale0:b"])
    common.sh(v.pktgen("vale0:a", "tx", v.layout["tx"], "-l", size, "-n", frames), env=v.env, timeout=300)
    report = json.loads(rx.communicate(timeout=300)[0])
    # valed ends on SIGTERM; callgrind writes its counts as it exits.
    common.stop(v.proc, signal.SIGTERM)
    with open(out) as f:
        total = sum(int(x) for x in re.findall(r"^summary: (\d+)", f.read(), re.M))
    return total, report


def main():
    ap = common.parser(__doc__, "instructions", runs=1, peers=False)
    ap.add_argument("--frames", type=int, default=200000, help="frames per size (default 200000)")
    ap.add_argument("--sizes", default=SIZES, help=f"frame sizes (default {SIZES})")
    a = common.parse(ap)
    common.need_binaries()
    if a.quick:
        a.frames = min(a.frames, 20000)
    if not common.shutil.which("valgrind"):
        common.need_root("installing valgrind")
        common.ensure_packages(["valgrind"], ["valgrind"])
    res = []
    for s in common.int_list(a.sizes):
        counts = []
        for _ in range(a.runs):
            total, rx = count(s, a.frames)
            if rx["packets"] != a.frames or rx["drops"] != 0:
                raise RuntimeError(f"the receiver got {rx['packets']} of {a.frames} frames, {rx['drops']} dropped")
            counts.append(total / a.frames)
        res.append({"frame_len": s, "frames": a.frames, "instructions_per_frame": common.summary(counts)})
        print(f"{s} B: {counts[len(counts) // 2]:.1f} instructions a frame", flush=True)
    common.table(["len", "instructions/frame"],
                 [[r["frame_len"], f"{r['instructions_per_frame']['median']:.1f}"] for r in res])
    common.write_report(a.out, "instructions", a, {"name": "callgrind", "binaries": common.BIN}, res)


if __name__ == "__main__":
    common.main_guard(main)

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
import json, os, re, subprocess, tempfile, time

import common

SIZES = "60,1514"


def count(size, frames):
    """Instructions in Pipeline::forward and all it calls, and the receiver's report."""
    run_dir = tempfile.mkdtemp(prefix="vale-bench-")
    out = os.path.join(run_dir, "callgrind.out")
    env = dict(os.environ, VALE_RUN_DIR=run_dir, VALE_NO_AUTOSTART="1")
    valed = common.spawn(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
                          "--toggle-collect=*Pipeline::forward*", f"{common.BIN}/valed", "--run-dir", run_dir],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    common.on_exit(lambda: common.stop(valed))
    sock = os.path.join(run_dir, "valed.sock")
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if valed.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("valed did not start under valgrind")
        time.sleep(0.1)
    pktgen = f"{common.BIN}/vale-pktgen"
    rx = common.spawn([pktgen, "-i", "vale0:b", "-f", "rx", "-n", str(frames), "--slots", "4096", "-T", "300",
                       "-q", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    common.on_exit(lambda: common.stop(rx))
    time.sleep(1)
    common.sh([pktgen, "-i", "vale0:a", "-f", "tx", "-l", str(size), "-n", str(frames), "-q", "--json"],
              env=env, timeout=300)
    report = json.loads(rx.communicate(timeout=300)[0])
    common.stop(valed)
    with open(out) as f:
        total = sum(int(x) for x in re.findall(r"^summary: (\d+)", f.read(), re.M))
    subprocess.run(["rm", "-rf", run_dir])
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

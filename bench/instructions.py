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

With --paths vhost-user (or native,vhost-user) it counts the vhost-user path:
DPDK testpmd's virtio_user txonly -> vale1:vm1 =valed= vale1:vm2 -> virtio_user rxonly, as
bench/vhost_user.py runs it, with valed under callgrind. valed is counted whole (every thread)
over --seconds of traffic and divided by the frames it delivered to vm2 meanwhile; the
receiver's count must agree within 2%. The receiver shares its CPU with the sender, so while
it is off that CPU valed may take frames it then drops at vm2 (no buffers, its rx ring full):
their work is in the count, which is also given divided by the frames taken from the sender
(vm1's tx counter), with the share dropped; the figure per delivered frame follows that share,
which follows the host's load. Under callgrind valed is some fifty times slower than
the front ends, so it is busy all the while: the figure is the user-space work a frame costs
(the kernel's part of a kick or an interrupt is not counted). It needs root and testpmd
(dpdk-dev and its virtio_user and ring mempool drivers, installed when missing).

    bench/instructions.py --paths vhost-user [--seconds 20] [--sizes 60,1514]

DPDK's vhost PMD is not counted beside it: it busy-polls, so under callgrind its count is
mostly empty polls (in one run, 2.93 M receive polls for 95 k bursts that held frames), which
says nothing of its work a frame at full speed.

Needs valgrind (installed with apt-get when missing, as root); the native path no other root.
Writes bench/results/instructions.json.
"""
import json, os, re, signal, subprocess, tempfile, time

import common
import peers
import vhost_user

SIZES = "60,1514"


def count(size, frames):
    """Instructions in Pipeline::forward and all it calls, and the receiver's report."""
    out, wrapper = callgrind_out()
    v = common.Valed("shared", persistent=False,
                     wrapper=[*wrapper, "--collect-atstart=no",
                              # a method defined in a child module of forward is named
                              # `forward::gather::<impl ...Pipeline>::forward`: both forms, so
                              # builds before and after that split count the same function
                              "--toggle-collect=*Pipeline::forward*",
                              "--toggle-collect=*Pipeline>::forward*"])
    rx = common.spawn(v.pktgen("vale0:b", "rx", v.layout["rx"], "-n", frames, "--slots", 4096, "-T", 300),
                      env=v.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    common.on_exit(lambda: common.stop(rx))
    v.wait_ports(["vale0:b"])
    common.sh(v.pktgen("vale0:a", "tx", v.layout["tx"], "-l", size, "-n", frames), env=v.env, timeout=300)
    report = json.loads(rx.communicate(timeout=300)[0])
    # valed ends on SIGTERM; callgrind writes its counts as it exits.
    common.stop(v.proc, signal.SIGTERM)
    return callgrind_total(out), report


def callgrind_total(path):
    """The instructions a callgrind output file counts (each thread's part, summed)."""
    with open(path) as f:
        return sum(int(x) for x in re.findall(r"^summary: (\d+)", f.read(), re.M))


def callgrind_out():
    """A file name for callgrind's output, and the command that runs a program under it."""
    fd, out = tempfile.mkstemp(prefix="vale-callgrind-")
    os.close(fd)
    common.on_exit(lambda: [os.unlink(f) for f in (out, f"{out}.1") if os.path.exists(f)])
    return out, ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]


def vhost_window(v, out, rx, seconds, warmup):
    """Instructions of valed (`v`, under callgrind), the frames it delivered to vm2 (its own
    counter), the frames the receiving testpmd `rx` counted and the frames valed took from
    the sender (vm1's tx counter), over `seconds` after a warm-up.
    callgrind's counters are zeroed at the start and dumped (to `out`.1) at the end; each count
    is read just before and just after each of the two, and the mean of each pair taken."""
    deadline = time.monotonic() + 300
    while rx.stats()["rx"] == 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing reached the receiver in 300 s:\n{rx.tail()}")
        time.sleep(0.5)
    time.sleep(warmup)
    def read():
        ports = v.ports()
        return (ports["vale1:vm2"]["counters"]["rx_packets"], rx.stats()["rx"],
                ports["vale1:vm1"]["counters"]["tx_packets"])
    marks = []
    for op in ("-z", "-d"):
        before = read()
        common.sh(["callgrind_control", op, str(v.pid)], timeout=120)
        after = read()
        marks.append([(x + y) / 2 for x, y in zip(before, after)])
        if op == "-z":
            time.sleep(seconds)
    return (callgrind_total(f"{out}.1"), marks[1][0] - marks[0][0], marks[1][1] - marks[0][1],
            marks[1][2] - marks[0][2])


def vhost_count(size, a, cpus, dpdk, d):
    """(instructions, frames delivered to vm2, frames received, frames taken from the sender)
    of valed forwarding `size`-byte
    frames from a virtio_user sender to a virtio_user receiver."""
    out, wrapper = callgrind_out()
    socks = (f"{d}/vm1.sock", f"{d}/vm2.sock")
    v = vhost_user.ValeVhost(cpus, socks, wrapper=wrapper)
    try:
        side = vhost_user.Side(*socks, size, cpus, dpdk, limit=300)
        try:
            return vhost_window(v, out, side.rx, a.seconds, a.warmup)
        finally:
            side.close()
    finally:
        common.stop(v.proc, signal.SIGTERM, wait=120)


def vhost_path(a, sizes):
    """The vhost-user path: a result per size."""
    common.need_root("the vhost-user path (testpmd)")
    common.ensure_packages(["callgrind_control"], ["valgrind"])
    dpdk = peers.dpdk_env()
    allowed = sorted(os.sched_getaffinity(0))
    # The front ends share the first CPU (each is far faster than valed under callgrind);
    # valed has the last.
    cpus = {"tx": str(allowed[0]), "rx": str(allowed[0]), "middle": str(allowed[-1])}
    d = tempfile.mkdtemp(prefix="vb-instr-")
    common.on_exit(lambda: common.shutil.rmtree(d, ignore_errors=True))
    res = []
    for s in sizes:
        counts, frames, taken_counts, drops = [], [], [], []
        for _ in range(a.runs):
            total, n, got, taken = vhost_count(s, a, cpus, dpdk, d)
            if n < 1000:
                raise RuntimeError(f"only {n:.0f} frames crossed in {a.seconds} s")
            if abs(got - n) > 0.02 * n:
                raise RuntimeError(f"valed delivered {n:.0f} frames to vm2, the receiver counted {got:.0f}")
            counts.append(total / n)
            frames.append(n)
            taken_counts.append(total / max(taken, 1))
            drops.append(1 - n / max(taken, 1))
        res.append({"path": "vhost-user", "frame_len": s, "frames": common.summary(frames),
                    "instructions_per_frame": common.summary(counts),
                    "instructions_per_frame_taken": common.summary(taken_counts),
                    "dropped_at_vm2": common.summary(drops)})
        med = lambda xs: common.summary(xs)["median"]
        print(f"vhost-user {s} B: {med(counts):.1f} instructions a frame delivered "
              f"({med(taken_counts):.1f} a frame taken from the sender, {100 * med(drops):.0f}% of "
              f"those dropped at vm2; medians)", flush=True)
    return res


def native_path(a, sizes):
    """The native path, a -> b: a result per size."""
    res = []
    for s in sizes:
        counts = []
        for _ in range(a.runs):
            total, rx = count(s, a.frames)
            if rx["packets"] != a.frames or rx["drops"] != 0:
                raise RuntimeError(f"the receiver got {rx['packets']} of {a.frames} frames, {rx['drops']} dropped")
            counts.append(total / a.frames)
        res.append({"path": "native", "frame_len": s, "frames": a.frames,
                    "instructions_per_frame": common.summary(counts)})
        print(f"native {s} B: {counts[len(counts) // 2]:.1f} instructions a frame", flush=True)
    return res


def main():
    ap = common.parser(__doc__, "instructions", runs=1, seconds=20.0, peers=False)
    ap.add_argument("--frames", type=int, default=200000, help="native path: frames per size (default 200000)")
    ap.add_argument("--sizes", default=SIZES, help=f"frame sizes (default {SIZES})")
    ap.add_argument("--paths", default="native",
                    help="native (vale-pktgen a -> b, Pipeline::forward counted), vhost-user (DPDK "
                         "virtio_user -> vm1, vm2 -> virtio_user, all of valed counted over --seconds); "
                         "comma-separated (default native)")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="vhost-user path: seconds of traffic before counting (default 5)")
    a = common.parse(ap)
    paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    if not paths or any(x not in ("native", "vhost-user") for x in paths):
        ap.error("--paths takes native, vhost-user or both")
    common.need_binaries()
    if a.quick:
        a.frames = min(a.frames, 20000)
        a.seconds = max(a.seconds, 5.0)   # valed under callgrind moves some 100000 frames a second
        a.warmup = min(a.warmup, 2.0)
    if not common.shutil.which("valgrind"):
        common.need_root("installing valgrind")
        common.ensure_packages(["valgrind"], ["valgrind"])
    sizes = common.int_list(a.sizes)
    res = native_path(a, sizes) if "native" in paths else []
    if "vhost-user" in paths:
        res += vhost_path(a, sizes)
    what = {"native": "native a -> b (Pipeline::forward)",
            "vhost-user": "virtio_user -> vm1, vm2 -> virtio_user (all of valed)"}
    common.table(["path", "len", "instructions/frame"],
                 [[what[r["path"]], r["frame_len"], f"{r['instructions_per_frame']['median']:.1f}"] for r in res])
    common.write_report(a.out, "instructions", a, {"name": "callgrind", "binaries": common.BIN}, res)


if __name__ == "__main__":
    common.main_guard(main)

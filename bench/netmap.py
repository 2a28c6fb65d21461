#!/usr/bin/env python3
"""A netmap program through libvale-netmap against the same program on libvale's own API.

bench/c/nm_pktgen.c is one sender and one receiver whose ring loops are shared and whose
open, sync and wait calls come from one of two APIs, chosen when it is compiled:
- native: libvale's API (vale_open, vale_txsync/vale_rxsync, vale_poll);
- preload: netmap's API (nmport_open, ioctl NIOCTXSYNC/NIOCRXSYNC, poll() on the netmap
  descriptor), built without vale and run with LD_PRELOAD=libvale_netmap.so, as an existing
  netmap binary runs;
- linked: the same netmap-API program linked with libvale_netmap.so (recompiled for vale).
Sender on vale0:a, receiver on vale0:b, taken in turn in every run (so that a busy machine hurts
them alike); the figure is the receiver's frames over the sender's seconds, and its ratio to
native in the same run.

    cargo build --release && bench/netmap.py [--runs 5] [--seconds 2] [--lens 60,1514]
"""
import os, subprocess, tempfile

import common
from common import summary, ratio, mpps

VARIANTS = ("native", "preload", "linked")


def build(d):
    """Compiles vale's libnetmap.a and the three programs into d."""
    inc = os.path.join(common.ROOT, "crates", "libvale", "include")
    src = os.path.join(common.ROOT, "bench", "c", "nm_pktgen.c")
    cc = ["cc", "-O2", "-Wall", "-Wextra", "-Werror"]
    common.sh([*cc, "-c", "-I", f"{inc}/vale-netmap", "-o", f"{d}/nmport.o",
               os.path.join(common.ROOT, "crates", "vale-netmap", "c", "nmport.c")])
    common.sh(["ar", "rcs", f"{d}/libnetmap.a", f"{d}/nmport.o"])
    common.sh([*cc, "-DVALE_NATIVE", "-I", inc, src, "-o", f"{d}/native", "-L", common.BIN, "-lvale",
               f"-Wl,-rpath,{common.BIN}"])
    common.sh([*cc, "-I", f"{inc}/vale-netmap", src, "-o", f"{d}/preload", "-L", d, "-lnetmap"])
    common.sh([*cc, "-I", f"{inc}/vale-netmap", src, "-o", f"{d}/linked", "-L", d, "-lnetmap", "-L", common.BIN,
               "-lvale_netmap", f"-Wl,-rpath,{common.BIN}"])


def run(v, d, variant, length, seconds):
    env = dict(v.env)
    if variant == "preload":
        env["LD_PRELOAD"] = os.path.join(common.BIN, "libvale_netmap.so")
    prog = os.path.join(d, variant)
    rx = common.spawn(["taskset", "-c", v.layout["rx"], prog, "rx", "vale0:b", str(length), str(seconds)],
                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        v.wait_ports(["vale0:b"])
        tx = subprocess.run(["taskset", "-c", v.layout["tx"], prog, "tx", "vale0:a", str(length), str(seconds)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=seconds + 30, stdin=subprocess.DEVNULL)
        if tx.returncode != 0:
            raise RuntimeError(f"{variant} tx failed: {tx.stderr.strip()[-2000:]}")
        out, err = rx.communicate(timeout=seconds + 30)
    finally:
        common.stop(rx)
    _, frames, secs = tx.stdout.split()
    received = int(out.split()[1])
    return {"tx_frames": int(frames), "tx_seconds": float(secs), "rx_frames": received,
            "rx_pps": received / float(secs)}


def main():
    ap = common.parser(__doc__, "netmap", seconds=2.0, peers=False)
    ap.add_argument("--lens", type=common.int_list, default=[60, 1514],
                    help="frame sizes in bytes, comma-separated (default 60,1514)")
    a = common.parse(ap)
    d = tempfile.mkdtemp(prefix="vale-bench-netmap-")
    common.on_exit(lambda: common.shutil.rmtree(d, ignore_errors=True))
    build(d)
    v = common.Valed(a.layout)
    runs = {(n, m): [] for n in a.lens for m in VARIANTS}
    for i in range(a.runs):
        for n in a.lens:
            for m in VARIANTS:
                r = run(v, d, m, n, a.seconds)
                runs[(n, m)].append(r)
                print(f"run {i + 1} {n} B {m}: rx {r['rx_pps'] / 1e6:.2f} Mpps", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    results = []
    for n in a.lens:
        base = summary([x["rx_pps"] for x in runs[(n, "native")]])
        for m in VARIANTS:
            s = summary([x["rx_pps"] for x in runs[(n, m)]])
            # The ratio of each run to native in the same run, then the median of those.
            per_run = [x["rx_pps"] / b["rx_pps"] for x, b in zip(runs[(n, m)], runs[(n, "native")])]
            results.append({"api": m, "frame_len": n, "rx_pps": s, "ratio_to_native": ratio(s, base),
                            "per_run_ratio_median": common.statistics.median(per_run)})
    print(f"\nnetmap API through libvale-netmap vs libvale's own, {a.runs} runs of {a.seconds} s; layout "
          f"{a.layout}: valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, rx cpu {v.layout['rx']}")
    common.table(["frame", "API", "rx Mpps median (min-max)", "vs native (median of per-run ratios)"],
                 [[f"{r['frame_len']} B", r["api"], mpps(r["rx_pps"]), f"{r['per_run_ratio_median']:.3f}"]
                  for r in results])
    common.write_report(a.out, "netmap", a, {"vale": v.cpu_layout()}, results,
                        setup={"vale": "bench/c/nm_pktgen.c tx vale0:a -> valed -> nm_pktgen rx vale0:b, "
                               "built for libvale's API (native) or netmap's (preload, linked)"},
                        ratio="per run: rx pps of the API / rx pps of native in the same run; median")


if __name__ == "__main__":
    common.main_guard(main)

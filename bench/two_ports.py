#!/usr/bin/env python3
"""One sender to one receiver through a vale switch: rate by frame size, median of N runs.

Starts a valed of its own, then for each frame size runs `vale-pktgen -f rx` on vale0:b and
`vale-pktgen -f tx` on vale0:a for --seconds, N times, each process pinned as --layout says.
Prints a table and writes JSON (sizes, runs, medians, min, max, CPU layout, date, machine).

    cargo build --release && bench/two_ports.py [--runs 5] [--seconds 3] [--sizes 60,1514]
"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, tempfile, time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")

LAYOUTS = {
    # name: (valed cpus, tx cpus, rx cpus)
    "split": ("1", "0", "0"),     # switch alone on cpu1; sender and receiver share cpu0
    "shared": ("0,1", "0,1", "0,1"),  # no pinning: the scheduler decides
}


def machine():
    model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} vCPU, Linux {platform.release()}"


def run_once(run_dir, size, seconds, layout):
    vcpu, txcpu, rxcpu = LAYOUTS[layout]
    env = dict(os.environ, VALE_RUN_DIR=run_dir, VALE_NO_AUTOSTART="1")
    rx = subprocess.Popen(["taskset", "-c", rxcpu, f"{BIN}/vale-pktgen", "-i", "vale0:b", "-f", "rx",
                           "-q", "--json", "-T", str(seconds + 2)], env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    tx = subprocess.run(["taskset", "-c", txcpu, f"{BIN}/vale-pktgen", "-i", "vale0:a", "-f", "tx",
                         "-l", str(size), "-q", "--json", "-T", str(seconds)],
                        env=env, stdout=subprocess.PIPE, text=True, check=True, timeout=seconds + 20)
    out, _ = rx.communicate(timeout=seconds + 20)
    return json.loads(tx.stdout), json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--sizes", default="60,1514")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="split")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "two_ports.json"))
    a = ap.parse_args()
    for b in ("valed", "vale-pktgen"):
        if not os.path.exists(f"{BIN}/{b}"):
            sys.exit(f"{BIN}/{b} missing: run cargo build --release first")
    run_dir = tempfile.mkdtemp(prefix="vale-bench-")
    vcpu = LAYOUTS[a.layout][0]
    valed = subprocess.Popen(["taskset", "-c", vcpu, f"{BIN}/valed", "--run-dir", run_dir,
                              "--workers", str(a.workers)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(os.path.join(run_dir, "valed.sock")):
                break
            time.sleep(0.02)
        results = []
        for size in [int(s) for s in a.sizes.split(",")]:
            tx_pps, rx_pps = [], []
            for _ in range(a.runs):
                t, r = run_once(run_dir, size, a.seconds, a.layout)
                tx_pps.append(t["pps"])
                rx_pps.append(r["pps"])
            results.append({
                "frame_len": size,
                "tx_pps": {"median": statistics.median(tx_pps), "min": min(tx_pps), "max": max(tx_pps), "runs": tx_pps},
                "rx_pps": {"median": statistics.median(rx_pps), "min": min(rx_pps), "max": max(rx_pps), "runs": rx_pps},
            })
    finally:
        valed.terminate()
        valed.wait()
        shutil.rmtree(run_dir, ignore_errors=True)
    vcpu, txcpu, rxcpu = LAYOUTS[a.layout]
    report = {
        "experiment": "two_ports",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "cpu_layout": {"valed": vcpu, "valed_workers": a.workers, "tx": txcpu, "rx": rxcpu, "name": a.layout},
        "runs": a.runs,
        "seconds": a.seconds,
        "results": results,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"two ports, {a.runs} runs of {a.seconds} s, layout {a.layout}: valed cpu {vcpu}, tx cpu {txcpu}, rx cpu {rxcpu}")
    print(f"{'len':>6} {'tx Mpps (min-max)':>22} {'rx Mpps (min-max)':>22} {'rx Gbit/s':>10}")
    for r in results:
        t, x = r["tx_pps"], r["rx_pps"]
        print(f"{r['frame_len']:>6} {t['median']/1e6:>8.2f} ({t['min']/1e6:.2f}-{t['max']/1e6:.2f}) "
              f"{x['median']/1e6:>8.2f} ({x['min']/1e6:.2f}-{x['max']/1e6:.2f}) "
              f"{x['median']*r['frame_len']*8/1e9:>10.2f}")
    print(f"JSON: {a.out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Runs every experiment of bench/ in one go, then draws the plots.

In this order, each as its own command with the options given here passed on: bound.py,
sizes.py, batch.py, destinations.py, ports.py, scale.py, latency.py, cpu.py, host_ports.py,
vhost_user.py, guests.py, modules.py, capture.py, netmap.py, then plot.py (PNGs in docs/bench/)
and summary.py (Markdown tables in bench/results/summary.md). Each prints its table
and writes bench/results/<name>.json; this script prints how long each took and writes
bench/results/run_all.json (the list of experiments, their exit status and durations).
A full run (defaults: 5 runs per point) takes about 30 minutes on a 2-vCPU machine;
--quick (2 runs of 0.5 s, fewer points) about 4 minutes.

    cargo build --release && bench/run_all.py [--quick] [--runs N] [--seconds S] [--only sizes,cpu]

Needs root for the peers (namespaces, apt-get); --no-peers measures vale alone.
"""
import argparse, json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

EXPERIMENTS = ["bound", "sizes", "batch", "destinations", "ports", "scale", "latency", "cpu", "host_ports",
               "vhost_user", "guests", "modules", "capture", "netmap"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, help="runs per point (default: each experiment's, 5)")
    ap.add_argument("--seconds", type=float, help="measured seconds per run (default: each experiment's)")
    ap.add_argument("--quick", action="store_true", help="2 runs of 0.5 s and fewer points: checks that all works")
    ap.add_argument("--slots", type=int, help="slots per ring of vale-pktgen in every experiment (default its own, 1024)")
    ap.add_argument("--layout", choices=sorted(common.LAYOUTS), default="split", help="vale's CPU layout (default split)")
    ap.add_argument("--no-peers", action="store_true", help="vale alone: no Linux bridge, OVS or DPDK")
    ap.add_argument("--only", default=",".join(EXPERIMENTS), help=f"which experiments (default all: {','.join(EXPERIMENTS)})")
    ap.add_argument("--no-plot", action="store_true", help="do not run plot.py at the end")
    a = ap.parse_args()
    if a.layout == "own" and common.LAYOUTS["own"] is None:
        ap.error(f"--layout own needs 3 CPUs; this machine has {len(common.cpu_topology())}")
    only = [e for e in a.only.split(",") if e]
    bad = [e for e in only if e not in EXPERIMENTS]
    if bad:
        ap.error(f"unknown experiments {bad}; choose from {EXPERIMENTS}")
    common.need_binaries()

    done, t_all = [], time.monotonic()
    for e in only:
        cmd = [sys.executable, os.path.join(HERE, f"{e}.py"), "--layout", a.layout]
        if e == "vhost_user" and a.layout == "own":   # its own name for a CPU per party
            own = common.LAYOUTS["own"]
            cmd[-2:] = ["--layout", "pinned", "--cpus", f"{own['tx']},{own['valed']},{own['rx']}"]
        if a.runs:
            cmd += ["--runs", str(a.runs)]
        if a.seconds:
            cmd += ["--seconds", str(a.seconds)]
        if a.slots:
            cmd += ["--slots", str(a.slots)]
        if a.quick:
            cmd.append("--quick")
        if a.no_peers and e in ("host_ports", "vhost_user", "guests"):
            continue    # nothing but a comparison with a peer; vale's side of vhost_user needs testpmd too
        if a.no_peers and e not in ("ports", "modules", "bound", "scale", "capture", "netmap"):
            cmd.append("--no-peers")
        print(f"\n=== {e}: {' '.join(os.path.relpath(c) if c.startswith('/') else c for c in cmd[1:])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(cmd).returncode
        done.append({"experiment": e, "exit": rc, "seconds": round(time.monotonic() - t0, 1)})
        print(f"=== {e}: exit {rc}, {done[-1]['seconds']} s", flush=True)
    if not a.no_plot:
        rc = subprocess.run([sys.executable, os.path.join(HERE, "plot.py")]).returncode
        done.append({"experiment": "plot", "exit": rc, "seconds": None})
    os.makedirs(common.RESULTS, exist_ok=True)
    with open(os.path.join(common.RESULTS, "summary.md"), "w") as f:
        rc = subprocess.run([sys.executable, os.path.join(HERE, "summary.py")], stdout=f).returncode
    done.append({"experiment": "summary", "exit": rc, "seconds": None})
    print(f"Markdown tables: {os.path.relpath(os.path.join(common.RESULTS, 'summary.md'))}")
    total = round(time.monotonic() - t_all, 1)
    os.makedirs(common.RESULTS, exist_ok=True)
    with open(os.path.join(common.RESULTS, "run_all.json"), "w") as f:
        json.dump({"date": common.utc_now(), "machine": common.machine(), "quick": a.quick, "layout": a.layout,
                   "total_seconds": total, "experiments": done}, f, indent=2)
    print(f"\nall done in {total:.0f} s:")
    for d in done:
        print(f"  {d['experiment']:>12}: exit {d['exit']}" + (f", {d['seconds']:.0f} s" if d["seconds"] else ""))
    sys.exit(1 if any(d["exit"] for d in done) else 0)


if __name__ == "__main__":
    main()

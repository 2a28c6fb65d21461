#!/usr/bin/env python3
"""vale against the Linux bridge: receive rate per frame size and their ratio.

Reads bench/results/two_ports.json (bench/two_ports.py: through vale) and
bench/results/linux_bridge.json (bench/linux_bridge.py: through the Linux bridge). For each
frame size in either file it prints vale's rx Mpps, the bridge's rx Mpps (median of runs,
min-max) and the ratio of the medians (vale / bridge). It writes bench/results/compare.json
with both inputs' dates and CPU layouts. It warns when the two files come from different
machines or were measured more than --max-apart hours apart: the ratio only means something
when both were measured together.

    cargo build --release && bench/two_ports.py && sudo bench/linux_bridge.py && bench/compare.py
"""
import argparse, json, os, sys
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")


def load(path, what):
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        sys.exit(f"{path} missing: run {what} first")
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    for k in ("experiment", "date", "machine", "cpu_layout", "runs", "seconds", "results"):
        if k not in data:
            sys.exit(f"{path}: no '{k}' key; is it output of {what}?")
    return data


def rx_by_size(data):
    return {r["frame_len"]: r["rx_pps"] for r in data["results"]}


def mpps(s):
    return f"{s['median']/1e6:.2f} ({s['min']/1e6:.2f}-{s['max']/1e6:.2f})" if s else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vale", default=os.path.join(RESULTS, "two_ports.json"), help="two_ports.py's JSON")
    ap.add_argument("--bridge", default=os.path.join(RESULTS, "linux_bridge.json"), help="linux_bridge.py's JSON")
    ap.add_argument("--out", default=os.path.join(RESULTS, "compare.json"))
    ap.add_argument("--max-apart", type=float, default=1.0,
                    help="warn when the two measurements are more than this many hours apart (default 1)")
    a = ap.parse_args()
    vale = load(a.vale, "bench/two_ports.py")
    bridge = load(a.bridge, "sudo bench/linux_bridge.py")

    warnings = []
    if vale["machine"] != bridge["machine"]:
        warnings.append(f"different machines: vale on {vale['machine']!r}, bridge on {bridge['machine']!r}")
    try:
        apart = abs((datetime.fromisoformat(vale["date"]) - datetime.fromisoformat(bridge["date"])).total_seconds())
        if apart > a.max_apart * 3600:
            warnings.append(f"measured {apart/3600:.1f} h apart ({vale['date']} and {bridge['date']})")
    except (TypeError, ValueError):
        warnings.append("unreadable dates: cannot tell whether both were measured together")

    v, b = rx_by_size(vale), rx_by_size(bridge)
    rows = []
    for size in sorted(set(v) | set(b)):
        vs, bs = v.get(size), b.get(size)
        ratio = vs["median"] / bs["median"] if vs and bs and bs["median"] > 0 else None
        rows.append({"frame_len": size, "vale_rx_pps": vs, "bridge_rx_pps": bs, "ratio": ratio})

    report = {
        "experiment": "compare",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": vale["machine"],
        "ratio": "median rx pps through vale / median rx pps through the Linux bridge",
        "inputs": {
            name: {"file": os.path.relpath(path, ROOT), "experiment": d["experiment"], "date": d["date"],
                   "machine": d["machine"], "cpu_layout": d["cpu_layout"], "runs": d["runs"], "seconds": d["seconds"]}
            for name, path, d in (("vale", a.vale, vale), ("bridge", a.bridge, bridge))
        },
        "warnings": warnings,
        "results": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)

    vl, bl = vale["cpu_layout"], bridge["cpu_layout"]
    print(f"vale:   {vale['date']}, {vale['runs']} runs of {vale['seconds']} s, layout {vl.get('name', '?')}")
    print(f"bridge: {bridge['date']}, {bridge['runs']} runs of {bridge['seconds']} s, layout {bl.get('name', '?')}")
    print(f"{'len':>6} {'vale rx Mpps (min-max)':>24} {'bridge rx Mpps (min-max)':>26} {'vale/bridge':>12}")
    for r in rows:
        ratio = f"{r['ratio']:.1f}x" if r["ratio"] is not None else "-"
        print(f"{r['frame_len']:>6} {mpps(r['vale_rx_pps']):>24} {mpps(r['bridge_rx_pps']):>26} {ratio:>12}")
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"JSON: {a.out}")


if __name__ == "__main__":
    main()

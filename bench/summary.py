#!/usr/bin/env python3
"""Prints the results of the experiments as Markdown tables (docs/benchmarks.md).

Reads bench/results/{bound,sizes,batch,destinations,ports,scale,latency,cpu,host_ports,guests}.json,
whichever exist, and prints one table each, with the date, the runs, the machine (CPU model,
CPUs, cores) and the CPU layout they were measured with. vale's rates are also shown as a
fraction of the bare-copy bound (bench/bound.py) at the same frame size: the one measured in
the same run (sizes.json's bare_copy), else bound.json's or sizes.json's when they were taken
on the same machine (the table says which).

    bench/summary.py [--results bench/results] > results.md
"""
import argparse, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import fmt_ratio  # noqa: E402


def m(s, d=2, scale=1e-6):
    return "–" if not s else f"{s['median'] * scale:.{d}f} ({s['min'] * scale:.{d}f}–{s['max'] * scale:.{d}f})"


def layout_text(lay):
    """A CPU layout of a JSON in a few words: {name, valed, tx, rx, ...} or {system: {...}}."""
    if not isinstance(lay, dict):
        return str(lay)
    if "vale" in lay and isinstance(lay["vale"], dict):
        lay = lay["vale"]
    if "producer" in lay:
        return f"bare copy (producer cpu {lay['producer']}, consumer cpu {lay['consumer']})"
    if "valed" in lay and "tx" in lay:
        return (f"{lay.get('name', '?')} (valed cpu {lay['valed']}, {lay.get('valed_workers', 1)} worker(s); "
                f"tx cpu {lay['tx']}; rx cpu {lay['rx']})")
    return lay.get("note") or lay.get("name") or json.dumps(lay)


def head(d, what):
    q = " **quick run: not worth quoting**" if d.get("quick") else ""
    load = d.get("loadavg")
    busy = f"; load average {load['start'][0]:.1f} → {load['end'][0]:.1f}" if load else ""
    print(f"\n**{what}** — {d['date'][:16].replace('T', ' ')} UTC, {d['runs']} runs of {d['seconds']} s{q}\n")
    print(f"Machine: {d.get('machine', '?')}; vale layout: {layout_text(d.get('cpu_layout'))}{busy}.\n")


_bounds = {}
SENDER_BOUND = ("linux_bridge", "linux_bridge_percpu", "ovs", "dpdk_memif")   # sizes.py's peers with a trafgen sender bound


def bound_of(results, d, frame_len):
    """(bare-copy pps, where from) for vale figures of `d` at `frame_len`, or (None, None)."""
    if not _bounds:
        for name in ("sizes", "bound"):
            b = common.load_result(results, name)
            for r in (b or {}).get("results", []):
                if r.get("bare_copy"):
                    _bounds.setdefault((b["machine"], r["frame_len"]),
                                       (r["bare_copy"]["rx_pps"]["median"], f"{name}.json, {b['date'][:16]}"))
        _bounds[None] = True
    return _bounds.get((d.get("machine"), frame_len), (None, None))


def of_bound(pps, bound):
    """'31%' of a pps figure over the bound, or '–'."""
    return "–" if not pps or not bound else f"{100 * pps / bound:.0f}%"


def bound_note(sources):
    sources = {s for s in sources if s}
    if sources:
        print(f"\n% of bound: vale's median over the bare-copy bound at the same frame size ({'; '.join(sorted(sources))}).")


def rows(headers, body):
    print("| " + " | ".join(headers) + " |")
    print("|" + " --- |" * len(headers))
    for r in body:
        print("| " + " | ".join(str(c) for c in r) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=common.RESULTS, help="where the JSON is (default bench/results)")
    a = ap.parse_args()
    any_ = False

    d = common.load_result(a.results, "bound")
    if d:
        any_ = True
        head(d, "The bound of the machine: one copy between two cores (bare-copy)")
        rows(["frame", "Mpps", "Gbit/s", "ns per frame"],
             [[f"{r['frame_len']} B", m(r["bare_copy"]["rx_pps"]),
               f"{r['bare_copy']['rx_pps']['median'] * r['frame_len'] * 8 / 1e9:.1f}",
               f"{1e9 / r['bare_copy']['rx_pps']['median']:.1f}"] for r in d["results"]])
    d = common.load_result(a.results, "sizes")
    if d:
        any_ = True
        head(d, "Rate vs frame size (fig. 11)")
        systems = d.get("systems") or ["vale", *d.get("peers", [])]
        names = {"bare_copy": "bound (bare copy)", "linux_bridge": "bridge, 1 trafgen",
                 "linux_bridge_percpu": "bridge, trafgen per CPU", "ovs": "OVS", "dpdk_memif": "DPDK memif"}
        lay = d.get("cpu_layout", {})
        ncpu = {k: (lay.get(k) or {}).get("cpus") for k in systems}
        peers = [k for k in systems[1:] if any(k in r for r in d["results"])]

        def cell(r, k):
            x = r.get(k)
            if not x:
                return "–"
            sb = x.get("sender_bound_pps")
            return (m(x["rx_pps"], 3 if x["rx_pps"]["median"] < 1e6 else 2)
                    + (f"; sender alone {sb['median'] / 1e6:.3f}" if sb else "")
                    + (" **sender-limited**" if x.get("sender_limited") else ""))
        head_cells = ["frame", f"vale Mpps ({ncpu['vale'] or '?'} CPUs)", "Gbit/s"]
        for k in peers:
            head_cells += [f"{names.get(k, k)} Mpps ({ncpu.get(k) or '?'} CPUs)",
                           "vale % of bound" if k == "bare_copy" else f"vale/{names.get(k, k)}"]
        body = []
        for r in d["results"]:
            row = [f"{r['frame_len']} B", m(r["vale"]["rx_pps"]),
                   f"{r['vale']['rx_pps']['median'] * r['frame_len'] * 8 / 1e9:.1f}"]
            for k in peers:
                row += [cell(r, k), of_bound(r["vale"]["rx_pps"]["median"], r[k]["rx_pps"]["median"])
                        if k == "bare_copy" and k in r else fmt_ratio(r["ratio"].get(k))]
            body.append(row)
        rows(head_cells, body)
        differ = {k: n for k, n in ncpu.items() if n != ncpu["vale"]}
        if differ:
            print(f"\nCPUs each system could use differ: vale {ncpu['vale']}; "
                  + ", ".join(f"{names.get(k, k)} {n}" for k, n in differ.items()) + ".")
        if any(r.get(k, {}).get("sender_bound_pps") for r in d["results"] for k in SENDER_BOUND):
            print("\nsender alone: the same trafgen into a veth whose peer drops every frame (memif: the same testpmd "
                  "txonly on DPDK's null driver), same run; "
                  "sender-limited: the peer reached 90% or more of it, so the figure is the sender's, not the switch's.")
    d = common.load_result(a.results, "batch")
    if d:
        any_ = True
        head(d, f"Rate vs batch size, {d['results'][0]['frame_len']} B, vale rx Mpps (figs. 8–10)")
        sweeps = d["results"]
        ref = d.get("linux_bridge")
        batches = [p["batch"] for p in sweeps[0]["points"]]
        rows(["batch"] + [f"{s['sweep']} sweep" for s in sweeps],
             [[b] + [m(s["points"][i]["rx_pps"]) for s in sweeps] for i, b in enumerate(batches)])
        if ref:
            print(f"\nLinux bridge at the same size, same run: {m(ref['rx_pps'], 3)} Mpps.")
        b, src = bound_of(a.results, d, sweeps[0]["frame_len"])
        if b:
            best = max(p["rx_pps"]["median"] for s_ in sweeps for p in s_["points"])
            print(f"\nBest vale figure {best / 1e6:.2f} Mpps = {of_bound(best, b)} of the bare-copy bound "
                  f"{b / 1e6:.2f} Mpps ({src}).")
    d = common.load_result(a.results, "destinations")
    if d:
        any_ = True
        head(d, "Rate per destination vs destinations, broadcast (figs. 6, 7)")
        vale = [r for r in d["results"] if r["switch"] == "vale"]
        peer = {(r["frame_len"], r["destinations"]): r for r in d["results"] if r["switch"] == "linux_bridge"}
        srcs = [bound_of(a.results, d, r["frame_len"])[1] for r in vale]
        rows(["frame", "dests", "vale Mpps/dest", "ns per copy", "delivered, % of bound", "bridge Mpps/dest",
              "vale/bridge"],
             [[f"{r['frame_len']} B", r["destinations"], m(r["per_destination_pps"]),
               f"{r['ns_per_delivered_packet']:.1f}",
               of_bound(r["delivered_pps"]["median"] if isinstance(r["delivered_pps"], dict) else r["delivered_pps"],
                        bound_of(a.results, d, r["frame_len"])[0]),
               m(peer.get((r["frame_len"], r["destinations"]), {}).get("per_destination_pps"), 3),
               fmt_ratio(r.get("ratio_to_linux_bridge"))] for r in vale])
        bound_note(srcs)
    d = common.load_result(a.results, "ports")
    if d:
        any_ = True
        head(d, "Unicast rate vs ports on the switch")
        rows(["ports", "frame", "vale Mpps", "% of bound", "vs fewest", "flooded"],
             [[r["ports"], f"{r['frame_len']} B", m(r["rx_pps"]),
               of_bound(r["rx_pps"]["median"], bound_of(a.results, d, r["frame_len"])[0]),
               fmt_ratio(r["ratio_to_fewest_ports"]), r["flooded"]] for r in d["results"]])
        bound_note([bound_of(a.results, d, r["frame_len"])[1] for r in d["results"]])
    d = common.load_result(a.results, "scale")
    if d:
        any_ = True
        head(d, "Many cores: aggregate rate with W workers")
        body = []
        for r in d["results"]:
            b = bound_of(a.results, d, r["frame_len"])[0]
            body.append([r["experiment"], r["workers"], r["clients"], f"{r['frame_len']} B", m(r["rx_pps"]),
                         of_bound(r["rx_pps"]["median"], b), fmt_ratio(r.get("vs_one")),
                         " ".join(f"{s_['median']:.2f}" for s_ in r["worker_cores"].values())])
        rows(["experiment", "W", "N", "frame", "aggregate Mpps", "% of bound", "vs W=1, N=1", "cores per worker"],
             body)
        bound_note([bound_of(a.results, d, r["frame_len"])[1] for r in d["results"]])
        for sk in d.get("skipped", []):
            print(f"\nSkipped {sk['experiment']} W={sk['workers']} N={sk['clients']}: needs {sk['cpus_needed']} CPUs.")
    d = common.load_result(a.results, "latency")
    if d:
        any_ = True
        head(d, "Round-trip time, µs (fig. 12)")
        rows(["path", "frame", "min", "median", "p99"],
             [[("vale ping-pong" if r["switch"] == "vale" else "Linux bridge, kernel ping"), f"{r['frame_len']} B",
               m(r["min"], 1, 1), m(r["median"], 1, 1), m(r["p99"], 1, 1)] for r in d["results"]])
    d = common.load_result(a.results, "cpu")
    if d:
        any_ = True
        head(d, "CPU seconds per million packets")
        busy = d["results"]["busy"]
        rows(["frame", "valed", "ovs-vswitchd", "vale/OVS", "testpmd ×2 (memif)", "vale/memif"],
             [[f"{r['frame_len']} B", m(r["vale"]["valed_cpu_s_per_mpkt"], 4, 1),
               m(r.get("ovs", {}).get("switch_cpu_s_per_mpkt"), 2, 1), fmt_ratio(r["ratio"].get("ovs")),
               m(r.get("dpdk_memif", {}).get("cpu_s_per_mpkt"), 3, 1), fmt_ratio(r["ratio"].get("dpdk_memif"))]
              for r in busy])
        i = d["results"]["idle"]
        print(f"\nIdle: valed used {i['vale']['valed_cores']['median'] * 100:.2f}% of a core (max "
              f"{i['vale']['valed_cores']['max'] * 100:.2f}%) over {d['idle_seconds']} s with {i['vale']['ports']} "
              f"ports ({i['vale']['clients']} held by waiting clients)"
              + (f"; ovs-vswitchd {i['ovs']['switch_cores']['median'] * 100:.2f}% with {i['ovs']['ports']} ports."
                 if "ovs" in i else "."))
    d = common.load_result(a.results, "host_ports")
    if d:
        any_ = True
        head(d, "Namespaces through TAP and NIC ports vs the Linux bridge")
        r = d["results"]
        if "tcp" in r:
            t = r["tcp"]
            rows(["TCP, one stream, iperf3", "Gbit/s", "vale/bridge"],
                 [["vale, TAP ports", m(t["vale_tap"]["bps"], 2, 1e-9), fmt_ratio(t["ratio"])],
                  ["Linux bridge, veths", m(t["linux_bridge"]["bps"], 2, 1e-9), ""]])
            print()
        if "pps_60B" in r:
            names = {"linux_bridge": "Linux bridge, veth → veth", "sender_floor": "bound: the veth's peer drops every frame"}
            body = []
            for k, v in r["pps_60B"].items():
                name = names.get(k) or "vale, veth → NIC port (" + k.replace("vale_nic_", "").replace(
                    "_moderation_", ", moderation ").replace("us", " µs") + ") → native port"
                body.append([name, m(v["rx_pps"], 3), fmt_ratio(v.get("ratio"))])
            rows(["60-byte frames from one trafgen", "rx Mpps", "vale/bridge"], body)
    d = common.load_result(a.results, "guests")
    if d:
        any_ = True
        d = dict(d, seconds=d.get("iperf_seconds", d["seconds"]))
        head(d, "Two guests (QEMU TCG), TCP through vale's vhost-user ports vs QEMU TAPs on the Linux bridge")
        r = d["results"]
        names = {"vale": "vale, vhost-user ports", "linux_bridge": "Linux bridge, QEMU TAP (vhost=off)"}
        rows(["TCP, one stream, iperf3", "Gbit/s", "bytes per frame at the receiver", "vale/bridge"],
             [[name, m(r[k]["bps"], 2, 1e-9), m(r[k]["rx_frame_bytes"], 0, 1),
               fmt_ratio(r.get("ratio")) if k == "vale" else ""] for k, name in names.items() if k in r])
        print(f"\nLayout: {d['cpu_layout']['note']}.")
    if not any_:
        sys.exit(f"no results in {a.results}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Prints the results of the experiments as Markdown tables (the README's Benchmarks section).

Reads bench/results/{sizes,batch,destinations,ports,latency,cpu,host_ports,guests}.json, whichever exist, and
prints one table each, with the date, the runs and the CPU layout they were measured with.

    bench/summary.py [--results bench/results] > results.md
"""
import argparse, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import fmt_ratio  # noqa: E402


def m(s, d=2, scale=1e-6):
    return "–" if not s else f"{s['median'] * scale:.{d}f} ({s['min'] * scale:.{d}f}–{s['max'] * scale:.{d}f})"


def head(d, what):
    q = " **quick run: not worth quoting**" if d.get("quick") else ""
    print(f"\n**{what}** — {d['date'][:16].replace('T', ' ')} UTC, {d['runs']} runs of {d['seconds']} s{q}\n")


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

    d = common.load_result(a.results, "sizes")
    if d:
        any_ = True
        head(d, "Rate vs frame size (fig. 11)")
        rows(["frame", "vale Mpps", "Gbit/s", "Linux bridge Mpps", "vale/bridge", "OVS Mpps", "vale/OVS",
              "DPDK memif Mpps", "vale/memif"],
             [[f"{r['frame_len']} B", m(r["vale"]["rx_pps"]),
               f"{r['vale']['rx_pps']['median'] * r['frame_len'] * 8 / 1e9:.1f}",
               m(r.get("linux_bridge", {}).get("rx_pps"), 3), fmt_ratio(r["ratio"].get("linux_bridge")),
               m(r.get("ovs", {}).get("rx_pps"), 3), fmt_ratio(r["ratio"].get("ovs")),
               m(r.get("dpdk_memif", {}).get("rx_pps")), fmt_ratio(r["ratio"].get("dpdk_memif"))]
              for r in d["results"]])
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
    d = common.load_result(a.results, "destinations")
    if d:
        any_ = True
        head(d, "Rate per destination vs destinations, broadcast (figs. 6, 7)")
        vale = [r for r in d["results"] if r["switch"] == "vale"]
        peer = {(r["frame_len"], r["destinations"]): r for r in d["results"] if r["switch"] == "linux_bridge"}
        rows(["frame", "dests", "vale Mpps/dest", "ns per copy", "bridge Mpps/dest", "vale/bridge"],
             [[f"{r['frame_len']} B", r["destinations"], m(r["per_destination_pps"]),
               f"{r['ns_per_delivered_packet']:.1f}",
               m(peer.get((r["frame_len"], r["destinations"]), {}).get("per_destination_pps"), 3),
               fmt_ratio(r.get("ratio_to_linux_bridge"))] for r in vale])
    d = common.load_result(a.results, "ports")
    if d:
        any_ = True
        head(d, "Unicast rate vs ports on the switch")
        rows(["ports", "frame", "vale Mpps", "vs fewest", "flooded"],
             [[r["ports"], f"{r['frame_len']} B", m(r["rx_pps"]), fmt_ratio(r["ratio_to_fewest_ports"]), r["flooded"]]
              for r in d["results"]])
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

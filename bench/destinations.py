#!/usr/bin/env python3
"""Rate vs number of destinations (VALE paper, figures 6 and 7): broadcast to 1..8 receivers.

One sender on vale0:a sends broadcast frames (vale-pktgen's default destination); N receivers
(vale0:r1..rN, `vale-pktgen -f rx`) each get a copy. The rate reported is per destination:
the frames all receivers got together, divided by N (the input rate when nothing is dropped);
figure 7's per-packet time is 1e9 / (that rate x N), the switch's time per delivered copy.
The peer is the Linux bridge flooding broadcast frames from one veth to N veths in namespaces.

    cargo build --release && bench/destinations.py [--runs 5] [--seconds 1.5] [--dests 1,...,8]
"""
import common, peers
from common import summary, ratio, mpps, fmt_ratio

DESTS = "1,2,3,4,5,6,7,8"
BRIDGE_DESTS = "1,2,4,8"


def main():
    ap = common.parser(__doc__, "destinations", seconds=1.5)
    ap.add_argument("--dests", default=DESTS, help=f"numbers of receivers for vale (default {DESTS}; --quick: 1,4,8)")
    ap.add_argument("--bridge-dests", default=BRIDGE_DESTS,
                    help=f"numbers of receivers for the Linux bridge (default {BRIDGE_DESTS}; --quick: 1,8)")
    ap.add_argument("--sizes", default="60,1514", help="frame sizes (default 60,1514)")
    a = common.parse(ap)
    if a.quick:
        a.dests = "1,4,8" if a.dests == DESTS else a.dests
        a.bridge_dests = "1,8" if a.bridge_dests == BRIDGE_DESTS else a.bridge_dests
    dests, bdests, sizes = common.int_list(a.dests), common.int_list(a.bridge_dests), common.int_list(a.sizes)
    if any(not 1 <= n <= 64 for n in dests + bdests):
        ap.error("numbers of destinations must be 1..64")
    if not a.no_peers:
        common.need_root("bench/destinations.py with the Linux bridge (use --no-peers for vale alone)")

    v = common.Valed(a.layout)
    results = []
    for s in sizes:
        for n in dests:
            ports = [f"vale0:r{i}" for i in range(1, n + 1)]
            runs = [v.run(s, a.seconds, rx_ports=ports) for _ in range(a.runs)]
            results.append({
                "switch": "vale", "frame_len": s, "destinations": n,
                "input_pps": summary([x["tx"]["pps"] for x in runs]),
                "delivered_pps": summary([common.rx_pps(x) for x in runs]),
                "per_destination_pps": summary([common.rx_pps(x) / n for x in runs]),
                "rx_drops": summary([sum(y["drops"] for y in x["rx"]) for x in runs]),
            })
            print(f"vale {s} B, {n} dest: {mpps(results[-1]['per_destination_pps'])} Mpps per destination", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    layout = {"vale": v.cpu_layout(rx_note="all receivers on the rx cpus")}
    setup = {"vale": "vale-pktgen tx vale0:a (broadcast) -> valed -> N x vale-pktgen rx vale0:rI"}

    if not a.no_peers:
        for n in bdests:
            b = peers.LinuxBridge(n_rx=n)
            for s in sizes:
                runs = [peers.trafgen_run(b, s, a.seconds, dst="ff:ff:ff:ff:ff:ff") for _ in range(a.runs)]
                results.append({
                    "switch": "linux_bridge", "frame_len": s, "destinations": n,
                    "input_pps": summary([x["tx_pps"] for x in runs]),
                    "delivered_pps": summary([x["rx_pps"] for x in runs]),
                    "per_destination_pps": summary([x["rx_pps"] / n for x in runs]),
                })
                print(f"linux bridge {s} B, {n} dest: {mpps(results[-1]['per_destination_pps'], 3)} Mpps "
                      "per destination", flush=True)
            setup["linux_bridge"] = {**b.setup_note(), "sender": f"{peers.trafgen_version()}, -P 1, broadcast",
                                     "rx": "sum of the N receiving veths' rx_packets"}
            b.close()   # this bridge's namespaces go now, before the next one is built
        layout["linux_bridge"] = {"tx": "0 (trafgen, taskset)", "switch": "kernel softirq", "rx": "kernel counters"}

    for r in results:
        r["ns_per_delivered_packet"] = 1e9 / r["delivered_pps"]["median"] if r["delivered_pps"]["median"] else None
        if r["switch"] == "vale":
            peer = next((p for p in results if p["switch"] == "linux_bridge" and p["frame_len"] == r["frame_len"]
                         and p["destinations"] == r["destinations"]), None)
            r["ratio_to_linux_bridge"] = ratio(r["per_destination_pps"], peer["per_destination_pps"]) if peer else None

    print(f"\nrate vs destinations (broadcast), {a.runs} runs of {a.seconds} s; vale layout {a.layout}: "
          f"valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, all rx cpu {v.layout['rx']}")
    rows = []
    for r in results:
        if r["switch"] != "vale":
            continue
        peer = next((p for p in results if p["switch"] == "linux_bridge" and p["frame_len"] == r["frame_len"]
                     and p["destinations"] == r["destinations"]), None)
        rows.append([r["frame_len"], r["destinations"], mpps(r["per_destination_pps"]), mpps(r["delivered_pps"]),
                     f"{r['ns_per_delivered_packet']:.1f}", mpps(peer["per_destination_pps"], 3) if peer else "-",
                     fmt_ratio(r.get("ratio_to_linux_bridge"))])
    common.table(["len", "dests", "vale Mpps/dest", "vale delivered Mpps", "ns/copy", "bridge Mpps/dest",
                  "vale/bridge"], rows)
    common.write_report(a.out, "destinations", a, layout, results, setup=setup,
                        ratio="median per-destination rx pps through vale / the same through the Linux bridge")


if __name__ == "__main__":
    common.main_guard(main)

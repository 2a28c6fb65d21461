#!/usr/bin/env python3
"""Rate vs frame size (VALE paper, figure 11): one sender to one receiver, through vale and its peers.

For each frame size (bytes without FCS; 9000 travels as a chain of slots) and run:
- vale: `vale-pktgen -f rx` on vale0:b, then `vale-pktgen -f tx` on vale0:a for --seconds,
  broadcast destination (pktgen's default), valed's CPU time over the run;
- the Linux bridge between veths in network namespaces (trafgen -> br0 -> kernel counter),
  unicast to a static fdb entry, MTU 9000 so the 9000-byte frames pass;
- Open vSwitch, userspace datapath, the same veths (sizes up to 1514);
- DPDK testpmd txonly -> rxonly over memif, two processes, no switch: the floor (up to 1514).
Each figure is the median of --runs, with min and max, and each peer's is also given as vale's
ratio to it. The per-packet time (ns = 1e9 / rx pps) is what figure 11 plots.

    cargo build --release && bench/sizes.py [--runs 5] [--seconds 2] [--sizes 60,...,9000]

Needs root for the peers (namespaces, apt-get); --no-peers measures vale alone.
"""
import common, peers
from common import summary, ratio, mpps, fmt_ratio

SIZES = "60,128,256,512,1024,1514,9000"
QUICK_SIZES = "60,1514,9000"
PEER_MAX = {"linux_bridge": 9000, "ovs": 1514, "dpdk_memif": 1514}


def main():
    ap = common.parser(__doc__, "sizes")
    ap.add_argument("--sizes", default=SIZES, help=f"frame sizes, 60-9000 (default {SIZES}; --quick: {QUICK_SIZES})")
    ap.add_argument("--peers", default="linux_bridge,ovs,dpdk_memif",
                    help="which peers, of linux_bridge, ovs, dpdk_memif (default all three)")
    a = common.parse(ap)
    if a.quick and a.sizes == SIZES:
        a.sizes = QUICK_SIZES
    sizes = common.int_list(a.sizes)
    if any(not 60 <= s <= 9000 for s in sizes):
        ap.error("sizes must be 60..9000")
    which = [] if a.no_peers else [p for p in a.peers.split(",") if p]
    known = ("linux_bridge", "ovs", "dpdk_memif")
    if any(p not in known for p in which):
        ap.error(f"--peers takes {', '.join(known)}")
    if which:
        common.need_root("bench/sizes.py with peers (use --no-peers for vale alone)")

    results = {s: {"frame_len": s} for s in sizes}
    # vale
    v = common.Valed(a.layout)
    for s in sizes:
        runs = [v.run(s, a.seconds) for _ in range(a.runs)]
        r = results[s]
        r["vale"] = {
            "tx_pps": summary([x["tx"]["pps"] for x in runs]),
            "rx_pps": summary([common.rx_pps(x) for x in runs]),
            "rx_drops": summary([sum(y["drops"] for y in x["rx"]) for x in runs]),
            "valed_cpu_s_per_mpkt": summary([common.cpu_per_mpkt(x["valed_cpu_s"], x["tx"]["packets"]) for x in runs]),
        }
        print(f"vale {s} B: {mpps(r['vale']['rx_pps'])} Mpps", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    setup = {"vale": "vale-pktgen tx vale0:a -> valed (learning bridge, broadcast destination) -> "
                     "vale-pktgen rx vale0:b; rx pps from the receiver's report"}
    layout = {"vale": v.cpu_layout()}

    if "linux_bridge" in which:
        b = peers.LinuxBridge(mtu=9000)
        for s in [s for s in sizes if s <= PEER_MAX["linux_bridge"]]:
            runs = [peers.trafgen_run(b, s, a.seconds) for _ in range(a.runs)]
            results[s]["linux_bridge"] = {"tx_pps": summary([x["tx_pps"] for x in runs]),
                                          "rx_pps": summary([x["rx_pps"] for x in runs])}
            print(f"linux bridge {s} B: {mpps(results[s]['linux_bridge']['rx_pps'])} Mpps", flush=True)
        setup["linux_bridge"] = {**b.setup_note(), "sender": f"{peers.trafgen_version()}, -P 1"}
        layout["linux_bridge"] = {"tx": "0 (trafgen, taskset)", "switch": "kernel softirq, not pinned",
                                  "rx": "kernel counter"}
    if "ovs" in which:
        o = peers.Ovs()
        for s in [s for s in sizes if s <= PEER_MAX["ovs"]]:
            runs = [peers.trafgen_run(o, s, a.seconds) for _ in range(a.runs)]
            results[s]["ovs"] = {
                "tx_pps": summary([x["tx_pps"] for x in runs]),
                "rx_pps": summary([x["rx_pps"] for x in runs]),
                "switch_cpu_s_per_mpkt": summary([common.cpu_per_mpkt(x["switch_cpu_s"], x["rx_packets"]) for x in runs]),
            }
            print(f"ovs {s} B: {mpps(results[s]['ovs']['rx_pps'])} Mpps", flush=True)
        setup["ovs"] = {**o.setup_note(), "sender": f"{peers.trafgen_version()}, -P 1"}
        layout["ovs"] = {"tx": "0 (trafgen, taskset)", "switch": "ovs-vswitchd, not pinned", "rx": "kernel counter"}
    if "dpdk_memif" in which:
        for s in [s for s in sizes if s <= PEER_MAX["dpdk_memif"]]:
            runs = [peers.memif_run(s, a.seconds) for _ in range(a.runs)]
            results[s]["dpdk_memif"] = {"rx_pps": summary([x["rx_pps"] for x in runs]),
                                        "tx_pps": summary([x["tx_pps"] for x in runs]),
                                        "cpu_s_per_mpkt": summary([x["cpu_s_per_mpkt"] for x in runs])}
            print(f"dpdk memif {s} B: {mpps(results[s]['dpdk_memif']['rx_pps'])} Mpps", flush=True)
        setup["dpdk_memif"] = f"{peers.testpmd_version()}: testpmd txonly (client) -> memif -> testpmd rxonly " \
                              "(server), --no-huge -m 512, burst 32; rx pps = mean of rxonly's per-second Rx-pps"
        layout["dpdk_memif"] = {"tx_forwarding_lcore": peers.MEMIF_LAYOUT["tx"]["forwarding"],
                                "rx_forwarding_lcore": peers.MEMIF_LAYOUT["rx"]["forwarding"],
                                "main_lcores": "tx 1, rx 0 (print stats, mostly asleep)"}

    rows, out = [], []
    for s in sizes:
        r = results[s]
        vr = r["vale"]["rx_pps"]
        r["ns_per_packet"] = {k: 1e9 / r[k]["rx_pps"]["median"] for k in ("vale", *which)
                              if k in r and r[k]["rx_pps"]["median"]}
        r["ratio"] = {k: ratio(vr, r[k]["rx_pps"]) for k in which if k in r}
        out.append(r)
        rows.append([s, mpps(vr), f"{vr['median'] * s * 8 / 1e9:.1f}", f"{r['ns_per_packet']['vale']:.1f}"]
                    + [f"{mpps(r[k]['rx_pps'], 3)} {fmt_ratio(r['ratio'][k])}" if k in r else "-" for k in which])
    print(f"\nrate vs frame size, {a.runs} runs of {a.seconds} s; vale layout {a.layout}: "
          f"valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, rx cpu {v.layout['rx']}")
    common.table(["len", "vale rx Mpps (min-max)", "Gbit/s", "ns/pkt"]
                 + [f"{k} Mpps, vale/it" for k in which], rows)
    common.write_report(a.out, "sizes", a, layout, out, setup=setup, peers=which,
                        ratio="median rx pps through vale / median rx pps through the peer")


if __name__ == "__main__":
    common.main_guard(main)

#!/usr/bin/env python3
"""Rate vs frame size (VALE paper, figure 11): one sender to one receiver, through vale and its peers.

For each frame size (bytes without FCS; 9000 travels as a chain of slots) and run:
- vale: `vale-pktgen -f rx` on vale0:b, then `vale-pktgen -f tx` on vale0:a for --seconds,
  broadcast destination (pktgen's default), valed's CPU time over the run;
- the Linux bridge between veths in network namespaces (trafgen -> br0 -> kernel counter),
  unicast to a static fdb entry, MTU 9000 so the 9000-byte frames pass: with one trafgen
  pinned on cpu0 (linux_bridge) and with one trafgen per CPU (linux_bridge_percpu, the bridge
  at its best: its softirq runs on every sending CPU);
- Open vSwitch, userspace datapath, the same veths, one trafgen (sizes up to 1514);
- DPDK testpmd txonly -> rxonly over memif, two processes, no switch: the floor (up to 1514);
- the bound of the machine (bare_copy, bench/bound.py): one copy per frame between two cores
  through a netmap-style ring, nothing else (sizes up to 2112; no root; --no-bound skips it).
Each peer's sender is also measured with nothing behind it (trafgen: its veth's peer drops
every frame, as bench/host_ports.py does for NIC ports; memif: testpmd txonly on DPDK's null
driver, librte-net-null23): the sender bound; a peer whose rate is
within 10% of its sender's bound is marked sender-limited: the figure is the sender's, not the
switch's. Each figure is the median of --runs, with min and max, and each peer's is also given
as vale's ratio to it, and each system's CPU count (where vale and a peer get different numbers
of CPUs, the table says so). The per-packet time (ns = 1e9 / rx pps) is what figure 11 plots.

    cargo build --release && bench/sizes.py [--runs 5] [--seconds 2] [--sizes 60,...,9000] [--layout split|shared|own]

Needs root for the peers (namespaces, apt-get); --no-peers measures vale alone (and the bound).
"""
import bound, common, peers
from common import summary, ratio, mpps, fmt_ratio

SIZES = "60,128,256,512,1024,1514,9000"
QUICK_SIZES = "60,1514,9000"
PEERS = ("linux_bridge", "linux_bridge_percpu", "ovs", "dpdk_memif")
PEER_MAX = {"linux_bridge": 9000, "linux_bridge_percpu": 9000, "ovs": 1514, "dpdk_memif": 1514, "bare_copy": 2112}
# How each trafgen peer sends (peers.trafgen_run's cpus): one process on cpu0, or one per CPU.
SENDERS = {"linux_bridge": "0", "linux_bridge_percpu": peers.PER_CPU, "ovs": "0"}
SENDER_LIMITED = 0.9      # a peer at or above this share of its sender's bound is sender-limited


def trafgen_peer(key, sizes, a, results):
    """Runs trafgen peer `key` at each size; returns (setup note, cpu layout)."""
    topo = peers.Ovs() if key == "ovs" else peers.LinuxBridge(mtu=9000)
    for s in [s for s in sizes if s <= PEER_MAX[key]]:
        runs = [peers.trafgen_run(topo, s, a.seconds, cpus=SENDERS[key]) for _ in range(a.runs)]
        r = results[s][key] = {"tx_pps": summary([x["tx_pps"] for x in runs]),
                               "rx_pps": summary([x["rx_pps"] for x in runs])}
        if key == "ovs":
            r["switch_cpu_s_per_mpkt"] = summary([common.cpu_per_mpkt(x["switch_cpu_s"], x["rx_packets"]) for x in runs])
        print(f"{key} {s} B: {mpps(r['rx_pps'])} Mpps", flush=True)
    topo.close()
    ncpu = len(common.cpu_topology())
    per_cpu = SENDERS[key] == peers.PER_CPU
    sender = f"{peers.trafgen_version()}, " + (f"one process per CPU ({ncpu}), pinned by trafgen" if per_cpu
                                              else f"-P 1, taskset -c {SENDERS[key]}")
    layout = {"tx": "every CPU (trafgen per CPU)" if per_cpu else f"{SENDERS[key]} (trafgen, taskset)",
              "switch": "ovs-vswitchd, not pinned" if key == "ovs" else
              "kernel softirq on the sending CPU(s)", "rx": "kernel counter",
              "cpus": ncpu if per_cpu or key == "ovs" else 1}
    return {**topo.setup_note(), "sender": sender}, layout


def sender_bound(cpus, sizes, a):
    """{size: rx pps summary} of trafgen (as peers.trafgen_run's cpus says) into a veth whose
    peer drops every frame (host_ports.SenderFloor): what that sender reaches with no switch."""
    from host_ports import SenderFloor
    out = {}
    for s in sizes:
        # MTU 9000 as the bridge's veths have, so that 9000-byte frames go out whole.
        topo = SenderFloor(mtu=9000)
        out[s] = summary([peers.trafgen_run(topo, s, a.seconds, cpus=cpus)["rx_pps"] for _ in range(a.runs)])
        topo.close()
        print(f"sender bound (trafgen {cpus}) {s} B: {mpps(out[s], 3)} Mpps", flush=True)
    return out


def main():
    ap = common.parser(__doc__, "sizes")
    ap.add_argument("--sizes", default=SIZES, help=f"frame sizes, 60-9000 (default {SIZES}; --quick: {QUICK_SIZES})")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"which peers, of {', '.join(PEERS)} (default all)")
    ap.add_argument("--no-bound", action="store_true", help="do not measure the bare-copy bound (bench/bound.py)")
    ap.add_argument("--no-sender-bound", action="store_true",
                    help="do not measure the peers' senders alone (no sender-limited marks)")
    a = common.parse(ap)
    if a.quick and a.sizes == SIZES:
        a.sizes = QUICK_SIZES
    sizes = common.int_list(a.sizes)
    if any(not 60 <= s <= 9000 for s in sizes):
        ap.error("sizes must be 60..9000")
    which = [] if a.no_peers else [p for p in a.peers.split(",") if p]
    if any(p not in PEERS for p in which):
        ap.error(f"--peers takes {', '.join(PEERS)}")
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
    systems = ["vale"]

    if not a.no_bound:
        cpus = bound.default_cpus()
        for s, r in bound.measure([s for s in sizes if s <= PEER_MAX["bare_copy"]], a.runs, a.seconds, cpus).items():
            results[s]["bare_copy"] = r
            print(f"bare copy {s} B: {mpps(r['rx_pps'])} Mpps", flush=True)
        setup["bare_copy"] = bound.setup_note(cpus)
        layout["bare_copy"] = {"producer": cpus.split(",")[0], "consumer": cpus.split(",")[1], "cpus": 2}
        systems.append("bare_copy")
    for key in which:
        if key in SENDERS:
            setup[key], layout[key] = trafgen_peer(key, sizes, a, results)
        elif key == "dpdk_memif":
            for s in [s for s in sizes if s <= PEER_MAX["dpdk_memif"]]:
                runs = [peers.memif_run(s, a.seconds) for _ in range(a.runs)]
                results[s]["dpdk_memif"] = {"rx_pps": summary([x["rx_pps"] for x in runs]),
                                            "tx_pps": summary([x["tx_pps"] for x in runs]),
                                            "cpu_s_per_mpkt": summary([x["cpu_s_per_mpkt"] for x in runs])}
                print(f"dpdk memif {s} B: {mpps(results[s]['dpdk_memif']['rx_pps'])} Mpps", flush=True)
            if not a.no_sender_bound:
                for s in [s for s in sizes if s <= PEER_MAX["dpdk_memif"]]:
                    r = results[s]["dpdk_memif"]
                    r["sender_bound_pps"] = summary([peers.memif_sender_alone(s, a.seconds)["tx_pps"]
                                                     for _ in range(a.runs)])
                    r["sender_limited"] = r["rx_pps"]["median"] >= SENDER_LIMITED * r["sender_bound_pps"]["median"]
                    print(f"sender bound (testpmd txonly -> null) {s} B: {mpps(r['sender_bound_pps'])} Mpps", flush=True)
            setup["dpdk_memif"] = f"{peers.testpmd_version()}: testpmd txonly (client) -> memif -> testpmd rxonly " \
                                  "(server), --no-huge -m 512, burst 32; rx pps = mean of rxonly's per-second Rx-pps"
            layout["dpdk_memif"] = {"tx_forwarding_lcore": peers.MEMIF_LAYOUT["tx"]["forwarding"],
                                    "rx_forwarding_lcore": peers.MEMIF_LAYOUT["rx"]["forwarding"],
                                    "main_lcores": "tx 1, rx 0 (print stats, mostly asleep)", "cpus": 2}
        systems.append(key)
    # The trafgen senders alone, once per way of sending: the bound of the peers that use them.
    bounds = {}
    if not a.no_sender_bound:
        for key in [k for k in which if k in SENDERS]:
            cpus = SENDERS[key]
            if cpus not in bounds:
                bounds[cpus] = sender_bound(cpus, [s for s in sizes if s <= PEER_MAX[key]], a)
            for s in [s for s in sizes if s in bounds[cpus] and key in results[s]]:
                r = results[s][key]
                r["sender_bound_pps"] = bounds[cpus][s]
                r["sender_limited"] = r["rx_pps"]["median"] >= SENDER_LIMITED * bounds[cpus][s]["median"]
        setup["sender_bound"] = "the same trafgen into a veth whose peer drops every frame (bench/host_ports.py's " \
                                "SenderFloor); memif: the same testpmd txonly on DPDK's null driver; " \
                                f"sender_limited: the peer's median rx pps >= {SENDER_LIMITED} x that"

    rows, out = [], []
    for s in sizes:
        r = results[s]
        vr = r["vale"]["rx_pps"]
        r["ns_per_packet"] = {k: 1e9 / r[k]["rx_pps"]["median"] for k in systems
                              if k in r and r[k]["rx_pps"]["median"]}
        r["ratio"] = {k: ratio(vr, r[k]["rx_pps"]) for k in systems[1:] if k in r}
        out.append(r)
        rows.append([s, mpps(vr), f"{vr['median'] * s * 8 / 1e9:.1f}", f"{r['ns_per_packet']['vale']:.1f}"]
                    + [f"{mpps(r[k]['rx_pps'], 3)} {fmt_ratio(r['ratio'][k])}" + (" sender-limited" if r[k].get("sender_limited") else "")
                       if k in r else "-" for k in systems[1:]])
    cpus = {k: layout[k].get("cpus") for k in systems}
    print(f"\nrate vs frame size, {a.runs} runs of {a.seconds} s; {common.describe()}\nvale layout {a.layout}: "
          f"valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, rx cpu {v.layout['rx']}")
    print("CPUs each system could use: " + ", ".join(f"{k} {n or '?'}" for k, n in cpus.items())
          + ("" if len(set(cpus.values())) == 1 else " (not the same: see cpu_layout)"))
    common.table(["len", "vale rx Mpps (min-max)", "Gbit/s", "ns/pkt"]
                 + [f"{k} Mpps, vale/it" for k in systems[1:]], rows)
    common.write_report(a.out, "sizes", a, layout, out, setup=setup, peers=which, systems=systems,
                        ratio="median rx pps through vale / median rx pps through the peer (or the bound)")


if __name__ == "__main__":
    common.main_guard(main)

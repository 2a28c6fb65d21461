#!/usr/bin/env python3
"""One sender to one receiver through the Linux bridge: the baseline for bench/two_ports.py.

The same experiment as two_ports.py, with the kernel in vale's place (peers.LinuxBridge):

    [vb-tx-PID-1] veth0 --- p-tx [vb-sw-PID-1: br0] p-rx0 --- rx0 [vb-rx-PID-1]

Three network namespaces (named with this process's pid), two veth pairs made inside them and
a bridge in the middle one, with br_netfilter off there
(net.bridge.bridge-nf-call-{iptables,ip6tables,arptables}=0) and a static fdb entry for the
receiver's MAC, so the bridge forwards unicast from the first frame. IPv6 is off in the three
namespaces and no interface has an address. The host's own interfaces and sysctls are not
touched. Everything is deleted on exit, on an error and on Ctrl-C or SIGTERM.

For each frame size and run, `trafgen -P 1` (pinned on cpu0) sends Ethernet+IPv4+UDP frames
to the receiver's MAC; once frames flow and --warmup has passed, the sender veth's tx_packets
and the receiver veth's rx_packets are read, and again --seconds later: pps = delta / time.
The receiver is the kernel (a counter, no process); the bridge runs in softirq, mostly on the
sending CPU. Writes bench/results/linux_bridge.json with the same keys as two_ports.json plus
"setup"; bench/compare.py gives vale's figures as ratios against it. Needs root; installs
netsniff-ng (trafgen) and iproute2 with apt-get when missing.

    bench/linux_bridge.py [--runs 5] [--seconds 3] [--sizes 60,1514]
"""
import common, peers
from common import summary


def main():
    ap = common.parser(__doc__, "linux_bridge", seconds=3.0, peers=False)
    ap.add_argument("--sizes", default="60,1514", help="frame sizes without FCS, 42..9000 (default 60,1514)")
    ap.add_argument("--warmup", type=float, default=0.5, help="seconds of sending before measuring (default 0.5)")
    a = common.parse(ap)
    sizes = common.int_list(a.sizes)
    if any(not 42 <= s <= 9000 for s in sizes):
        ap.error("frame sizes must be 42..9000")
    common.need_root("bench/linux_bridge.py")
    b = peers.LinuxBridge(mtu=9000 if max(sizes) > 1514 else 1500)
    results = []
    for s in sizes:
        runs = [peers.trafgen_run(b, s, a.seconds, a.warmup) for _ in range(a.runs)]
        results.append({"frame_len": s, "tx_pps": summary([x["tx_pps"] for x in runs]),
                        "rx_pps": summary([x["rx_pps"] for x in runs])})
    b.close()
    print(f"Linux bridge, {a.runs} runs of {a.seconds} s: trafgen cpu 0, bridge in softirq (not pinned), "
          "rx = kernel counter")
    common.table(["len", "tx Mpps (min-max)", "rx Mpps (min-max)", "rx Gbit/s"],
                 [[r["frame_len"], common.mpps(r["tx_pps"]), common.mpps(r["rx_pps"]),
                   f"{r['rx_pps']['median'] * r['frame_len'] * 8 / 1e9:.2f}"] for r in results])
    common.write_report(a.out, "linux_bridge", a,
                        {"bridge": "kernel softirq, not pinned", "tx": "0", "rx": "kernel (rx_packets, no process)"},
                        results, setup={**b.setup_note(), "sender": f"{peers.trafgen_version()}, -P 1",
                                        "warmup_seconds": a.warmup})


if __name__ == "__main__":
    common.main_guard(main)

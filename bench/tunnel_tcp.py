#!/usr/bin/env python3
"""TCP between two containers across a VXLAN tunnel: vale's TAP and vxlan ports against Linux's
veths, bridges and vxlan devices, both directions, in the same run.

vale: one valed in a network namespace of its own; container C0 on TAP port vale0:c, C1 on
vale1:c, switches vale0 and vale1 joined by vxlan ports (VNI 5) over 127.0.0.1 and 127.0.0.2
(lo). The containers' MTU is 1450 (docs/spanning-hosts.md); their TCP segments of up to 64 KiB
(TSO) cross the TAP ports whole and the tunnel port segments them, sending each with
UDP_SEGMENT; the far tunnel port receives them merged (UDP_GRO). After the runs the tunnel
ports' counters are read: TSO frames, UDP_SEGMENT sends and their datagrams, merged buffers
received.

    C0 - vale0:c [vale0] vale0:t ~~ UDP 4789 over lo ~~ vale1:t [vale1] vale1:c - C1

Linux (peer): bench/tunnel.py's topology, two bridges joined by vxlan devices over a veth
underlay of MTU 1500, each namespace's veth (MTU 1450) on a bridge:

    [tx] veth0 - p-tx [sw: br0 + vx] u1 ~~ UDP 4789 ~~ u2 [sw2: br0 + vx] p-rx0 - rx0 [rx]

iperf3, one stream, --runs runs of --seconds each way; medians (min-max) and the ratio.
Nothing is pinned: iperf3, the kernel's softirqs and valed's threads share the CPUs. Needs
root; installs iperf3 with apt-get when missing. Everything is removed on exit.

VALE_BIN_DIR=DIR measures another build's binaries (an earlier one, for before/after figures);
--no-gro sets VALE_TUNNEL_NO_GRO for valed (receive without UDP_GRO, for measuring it).

    bench/tunnel_tcp.py [--runs 5] [--seconds 3] [--no-peers] [--no-gro]
"""
import os

import common, peers, host_ports, tunnel
from common import sh, summary

ADDR = ["10.93.0.1", "10.93.0.2"]
COUNTERS = ("tso-frames", "gso-sends", "gso-segments", "gro-buffers", "gro-segments", "too-big")


def counters(line):
    """The tunnel port's counters named in COUNTERS, from its `negotiated` line (absent ones:
    None, as in builds before them)."""
    words = (line or "").replace(";", " ").split()
    out = {}
    for name in COUNTERS:
        out[name] = int(words[words.index(name) + 1]) if name in words else None
    return out


def split(runs, seconds):
    """Summaries of the runs' bits per second and of their CPU seconds per GB carried."""
    return (summary([bps for bps, _ in runs]),
            summary([cpu / (bps / 8 * max(1, round(seconds)) / 1e9) for bps, cpu in runs]))


def vale_runs(a):
    ns = host_ports.Namespaces("vt-tcp")
    home = ns.add("home")
    if a.no_gro:
        os.environ["VALE_TUNNEL_NO_GRO"] = "1"
    v = common.Valed("shared", netns=home, persistent=False)
    hosts = []
    for i in range(2):
        tap = f"vttap{i}"
        v.ctl("attach", f"vale{i}:c", "--tap", tap)
        h = ns.add(f"c{i}")
        sh(["ip", "-n", home, "link", "set", tap, "netns", h])
        sh(["ip", "-n", h, "link", "set", tap, "mtu", "1450"])
        sh(["ip", "-n", h, "addr", "add", f"{ADDR[i]}/24", "dev", tap])
        sh(["ip", "-n", h, "link", "set", tap, "up"])
        hosts.append(h)
    for i, (me, peer) in enumerate((("127.0.0.1", "127.0.0.2"), ("127.0.0.2", "127.0.0.1"))):
        v.ctl("attach", f"vale{i}:t", "vxlan", f"vni={tunnel.VNI}", f"local={me}", f"remote={peer}")
    sh(["ip", "netns", "exec", hosts[0], "ping", "-c", "2", "-i", "0.2", "-W", "2", ADDR[1]])
    out = {}
    for name, (c, s) in (("0to1", (0, 1)), ("1to0", (1, 0))):
        runs = []
        for _ in range(a.runs):
            c0 = common.cpu_seconds(v.pid)
            bps, cpu = host_ports.iperf3(hosts[c], hosts[s], ADDR[s], a.seconds, cpu=True)
            runs.append((bps, cpu + common.cpu_seconds(v.pid) - c0))
        out[name], out[name + "_cpu"] = split(runs, a.seconds)
    # valed shows the counters about once a second.
    common.time.sleep(1.5)
    ports = v.ports()
    out["counters"] = {p: counters(ports[p].get("negotiated")) for p in ("vale0:t", "vale1:t")}
    common.stop(v.proc, common.signal.SIGTERM)
    ns.close()
    os.environ.pop("VALE_TUNNEL_NO_GRO", None)
    return out


def linux_runs(a):
    lx = tunnel.LinuxVxlan(mtu=1450)
    lx.addresses()
    tx_ip, rx_ip = ("%d.%d.%d.%d" % peers.TX_IP), ("%d.%d.%d.%d" % peers.RX_IP)
    lx.x("tx", "ping", "-c", "2", "-i", "0.2", "-W", "2", rx_ip)
    out = {}
    for name, (c, s, addr) in (("0to1", ("tx", "rx", rx_ip)), ("1to0", ("rx", "tx", tx_ip))):
        runs = [host_ports.iperf3(lx.ns[c], lx.ns[s], addr, a.seconds, cpu=True) for _ in range(a.runs)]
        out[name], out[name + "_cpu"] = split(runs, a.seconds)
    lx.close()
    return out


def cpu_per_gb(s):
    return f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})" if s else "-"


def main():
    ap = common.parser(__doc__, "tunnel_tcp", seconds=3.0)
    ap.add_argument("--no-gro", action="store_true", help="valed receives without UDP_GRO")
    a = common.parse(ap)
    common.need_root("bench/tunnel_tcp.py")
    common.ensure_packages(["iperf3", "ping"], ["iperf3", "iputils-ping"])
    vale = vale_runs(a)
    linux = None if a.no_peers else linux_runs(a)
    rows = []
    for d in ("0to1", "1to0"):
        row = [d, host_ports.gbps(vale[d]), cpu_per_gb(vale[d + "_cpu"])]
        if linux:
            row += [host_ports.gbps(linux[d]), cpu_per_gb(linux[d + "_cpu"]),
                    common.fmt_ratio(common.ratio(vale[d], linux[d])),
                    common.fmt_ratio(common.ratio(linux[d + "_cpu"], vale[d + "_cpu"]))]
        rows.append(row)
    print(f"TCP across a VXLAN tunnel, iperf3 one stream, {a.runs} runs of {a.seconds:g} s each way, "
          f"{common.describe()}; valed from {common.BIN}{', UDP_GRO off' if a.no_gro else ''}")
    heads = ["direction", "vale Gbit/s", "vale CPU s/GB"] + (
        [] if a.no_peers else ["Linux vxlan Gbit/s", "Linux CPU s/GB", "vale / Linux", "Linux / vale CPU"])
    common.table(heads, rows)
    for p, c in vale["counters"].items():
        print(f"{p}: " + " ".join(f"{k} {'-' if v is None else v}" for k, v in c.items()))
    results = [{"direction": d, "vale_bps": vale[d], "vale_cpu_s_per_gb": vale[d + "_cpu"],
                **({"linux_bps": linux[d], "linux_cpu_s_per_gb": linux[d + "_cpu"]} if linux else {})}
               for d in ("0to1", "1to0")]
    common.write_report(a.out, "tunnel_tcp", a, {"name": "unpinned"}, results,
                        counters=vale["counters"], bin_dir=common.BIN, gro=not a.no_gro)


if __name__ == "__main__":
    common.main_guard(main)

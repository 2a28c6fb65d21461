#!/usr/bin/env python3
"""Frames per second through two tunnel ports: vale's vxlan ports against Linux's vxlan devices.

vale: one valed in a network namespace of its own, switches vale0 and vale1 joined by vxlan
ports (VNI 5) over 127.0.0.1 and 127.0.0.2; vale-pktgen sends on vale0:a and receives on
vale1:b (rx rate reported):

    vale-pktgen -> vale0:a [vale0] vale0:t ~~ UDP 4789 over lo ~~ vale1:t [vale1] vale1:b -> vale-pktgen

Linux (peer): the same path with the kernel's bridge and vxlan device on each side, the
underlay a veth between two namespaces, trafgen sending into a veth and the receiving veth's
rx_packets counting:

    [tx] veth0 - p-tx [sw: br0 + vx] u1 ~~ UDP 4789 ~~ u2 [sw2: br0 + vx] p-rx0 - rx0 [rx]

Static fdb entries for the receiver's MAC on both bridges, so unicast is forwarded from the
first frame; IPv6 off; br_netfilter off. Everything is removed on exit. Needs root; installs
netsniff-ng (trafgen) with apt-get when missing (not with --no-peers).

    bench/tunnel.py [--runs 5] [--seconds 2] [--sizes 60,1514] [--no-peers]
"""
import common, peers
from common import sh, summary

VNI = "5"


class LinuxVxlan(peers.Topo):
    """Two bridges joined by vxlan devices over a veth underlay (see the module's doc)."""
    name = "linux_vxlan"

    def __init__(self, mtu=1500):
        super().__init__(1, mtu, tag="vt")
        sw = self.ns["sw"]
        sw2 = sw.replace("-sw-", "-sw2-")
        sh(["ip", "netns", "add", sw2])
        self._made.append(sw2)
        self.ns["sw2"] = sw2
        self.x("sw2", "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
               "net.ipv6.conf.default.disable_ipv6=1")
        sh(["ip", "-n", sw, "link", "set", "p-rx0", "netns", sw2])
        # The underlay: MTU large enough for the frames plus 50 bytes.
        sh(["ip", "-n", sw, "link", "add", "u1", "mtu", str(mtu + 50), "type", "veth", "peer", "name", "u2",
            "mtu", str(mtu + 50), "netns", sw2])
        for ns, dev, me, peer, port in ((sw, "u1", "10.99.0.1", "10.99.0.2", "p-tx"),
                                        (sw2, "u2", "10.99.0.2", "10.99.0.1", "p-rx0")):
            sh(["ip", "-n", ns, "addr", "add", f"{me}/24", "dev", dev])
            sh(["ip", "-n", ns, "link", "set", dev, "up"])
            sh(["ip", "-n", ns, "link", "add", "vx", "mtu", str(mtu), "type", "vxlan", "id", VNI,
                "dstport", "4789", "local", me, "remote", peer, "dev", dev])
            sh(["ip", "-n", ns, "link", "add", "br0", "mtu", str(mtu), "type", "bridge", "stp_state", "0"])
            for t in ("iptables", "ip6tables", "arptables"):
                sh(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.bridge.bridge-nf-call-{t}=0"])
            for d in (port, "vx"):
                sh(["ip", "-n", ns, "link", "set", d, "master", "br0"])
                sh(["ip", "-n", ns, "link", "set", d, "up"])
            sh(["ip", "-n", ns, "link", "set", "br0", "up"])
        sh(["bridge", "-n", sw, "fdb", "add", peers.rx_mac(0), "dev", "vx", "master", "static"])
        sh(["bridge", "-n", sw2, "fdb", "add", peers.rx_mac(0), "dev", "p-rx0", "master", "static"])
        self.wait_forwarding(lambda: sh(["bridge", "-n", sw, "link", "show"]).count("state forwarding") >= 2
                             and sh(["bridge", "-n", sw2, "link", "show"]).count("state forwarding") >= 2)
        self.switch_pid = None


def vale_runs(a, size):
    ns = f"vt-vale-{common.os.getpid()}"
    sh(["ip", "netns", "add", ns])
    common.on_exit(lambda: sh(["ip", "netns", "del", ns], check=False))
    sh(["ip", "-n", ns, "link", "set", "lo", "up"])
    v = common.Valed(layout=a.layout, netns=ns)
    for port, me, peer in (("vale0:t", "127.0.0.1", "127.0.0.2"), ("vale1:t", "127.0.0.2", "127.0.0.1")):
        v.ctl("attach", port, "vxlan", f"vni={VNI}", f"local={me}", f"remote={peer}")
    runs = [v.run(size, a.seconds, rx_ports=("vale1:b",), tx_port="vale0:a") for _ in range(a.runs)]
    common.stop(v.proc, common.signal.SIGTERM)
    sh(["ip", "netns", "del", ns], check=False)
    return [common.rx_pps(r) for r in runs]


def main():
    ap = common.parser(__doc__, "tunnel", seconds=2.0)
    ap.add_argument("--sizes", default="60,1514", help="frame sizes without FCS (default 60,1514)")
    a = common.parse(ap)
    common.need_root("bench/tunnel.py")
    sizes = common.int_list(a.sizes)
    rows, results = [], []
    linux = None if a.no_peers else LinuxVxlan()
    for s in sizes:
        vale = summary(vale_runs(a, s))
        r = {"frame_len": s, "vale_rx_pps": vale}
        row = [s, common.mpps(vale, 3)]
        if linux:
            lx = summary([peers.trafgen_run(linux, s, a.seconds)["rx_pps"] for _ in range(a.runs)])
            r["linux_rx_pps"] = lx
            row += [common.mpps(lx, 3), common.fmt_ratio(common.ratio(vale, lx))]
        rows.append(row)
        results.append(r)
    if linux:
        linux.close()
    print(f"Two tunnel ports, {a.runs} runs of {a.seconds} s, {common.describe()}")
    heads = ["len", "vale rx Mpps"] + ([] if a.no_peers else ["Linux vxlan rx Mpps", "vale / Linux"])
    common.table(heads, rows)
    common.write_report(a.out, "tunnel", a, {"layout": a.layout}, results)


if __name__ == "__main__":
    common.main_guard(main)

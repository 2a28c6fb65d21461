#!/usr/bin/env python3
"""Frames per second through two tunnel ports: vale's vxlan ports against Linux's vxlan devices.

vale: two valeds, each in a network namespace of its own, joined by a veth (MTU 1550, as the
peer's underlay); switch vale0 of the first and vale1 of the second joined by vxlan ports (VNI
5); vale-pktgen sends on vale0:a and receives on vale1:b (rx rate reported):

    vale-pktgen -> vale0:a [vale0] vale0:t ~~ UDP 4789 over a veth ~~ vale1:t [vale1] vale1:b -> vale-pktgen

With --underlay lo, one valed holds both switches and the tunnel runs over 127.0.0.1 and
127.0.0.2 inside its namespace (there a 64-datagram UDP_SEGMENT send reaches a UDP_GRO socket
without being cut into datagrams, which flatters vale).

Linux (peer): the same path with the kernel's bridge and vxlan device on each side, the
underlay a veth between two namespaces, trafgen sending into a veth and the receiving veth's
rx_packets counting:

    [tx] veth0 - p-tx [sw: br0 + vx] u1 ~~ UDP 4789 ~~ u2 [sw2: br0 + vx] p-rx0 - rx0 [rx]

Static fdb entries for the receiver's MAC on both bridges, so unicast is forwarded from the
first frame; IPv6 off; br_netfilter off. Everything is removed on exit. Needs root; installs
netsniff-ng (trafgen) with apt-get when missing (not with --no-peers).

    bench/tunnel.py [--runs 5] [--seconds 2] [--sizes 60,1514] [--no-peers] [--loads 0.25,0.5]
                    [--underlay veth|lo]

Fixed offered loads (--loads, fractions of the capacity each system showed in the same run):
after the saturation runs of a size, vale-pktgen sends paced (--rate) and trafgen sends paced
(-b PPS, an exact frame count); per load the frames sent and received (vale: the two
vale-pktgen reports, the receiver's ring 4096 slots deep so that a receiving client that is
descheduled for a while on a crowded CPU does not count as the tunnel's loss; Linux: the sender veth's tx_packets and the receiving veth's rx_packets,
read once everything arrived) and the loss, 1 - received / sent. For vale, where frames were
lost: the ports' drop counters and the receiving host's UDP receive-buffer errors.
"""
import json, os, subprocess, tempfile, time

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


def udp_rcvbuf_errors(ns):
    """The namespace's UDP RcvbufErrors (datagrams a full socket buffer dropped)."""
    lines = [l.split() for l in sh(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]).splitlines()
             if l.startswith("Udp:")]
    return int(lines[1][lines[0].index("RcvbufErrors")])


DROPS = (("vale0:t", "rx_drops"), ("vale1:t", "tx_drops"))
RX_SLOTS = 4096     # the receiving vale-pktgen's ring in the paced runs


def settle(t, port, quiet=0.3, limit=10.0):
    """Waits until `port`'s counters stop moving (for `quiet` s, at most `limit` s): what a
    saturation run left in the tunnel's socket buffer (16 MiB) must not be counted as received
    by the next paced run."""
    deadline, last, since = time.monotonic() + limit, None, time.monotonic()
    while time.monotonic() < deadline:
        now = t.ports()[port]["counters"]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.05)


class ValeTunnel:
    """vale's side: vale0:a -> vale0:t ~~ vale1:t -> vale1:b. Underlay "veth" (the default, as
    the Linux peer's): two valeds, each in a network namespace of its own, joined by a veth of
    the peer's MTU; "lo": one valed, both switches, over 127.0.0.1 and 127.0.0.2 (there a
    `UDP_SEGMENT` send reaches the receiving socket uncut)."""

    def __init__(self, a, underlay):
        tag = f"vt-vale-{os.getpid()}"
        if underlay == "lo":
            self.ns = [tag]
            ends = (("127.0.0.1", "127.0.0.2"), ("127.0.0.2", "127.0.0.1"))
        else:
            self.ns = [f"{tag}-1", f"{tag}-2"]
            ends = (("10.98.0.1", "10.98.0.2"), ("10.98.0.2", "10.98.0.1"))
        for ns in self.ns:
            sh(["ip", "netns", "add", ns])
            common.on_exit(lambda ns=ns: sh(["ip", "netns", "del", ns], check=False))
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        if underlay == "veth":
            n1, n2 = self.ns
            sh(["ip", "-n", n1, "link", "add", "u1", "mtu", "1550", "type", "veth", "peer", "name", "u2",
                "mtu", "1550", "netns", n2])
            for ns, dev, (me, _) in ((n1, "u1", ends[0]), (n2, "u2", ends[1])):
                sh(["ip", "-n", ns, "addr", "add", f"{me}/24", "dev", dev])
                sh(["ip", "-n", ns, "link", "set", dev, "up"])
        self.tx = common.Valed(layout=a.layout, netns=self.ns[0])
        self.rx = self.tx if underlay == "lo" else common.Valed(layout=a.layout, netns=self.ns[1],
                                                                persistent=False)
        for v, port, (me, peer) in ((self.tx, "vale0:t", ends[0]), (self.rx, "vale1:t", ends[1])):
            v.ctl("attach", port, "vxlan", f"vni={VNI}", f"local={me}", f"remote={peer}")

    def ports(self):
        return {**self.tx.ports(), **self.rx.ports()}

    def run(self, size, seconds, tx_args=(), rx_args=()):
        """One run, vale-pktgen a -> b: as common.Valed.run, across the two valeds."""
        if self.tx is self.rx:
            return self.tx.run(size, seconds, rx_ports=("vale1:b",), tx_port="vale0:a", tx_args=tx_args,
                               rx_args=rx_args)
        log = tempfile.TemporaryFile(mode="w+")
        rx = common.spawn(self.rx.pktgen("vale1:b", "rx", self.rx.layout["rx"], "-T", seconds + 30, *rx_args),
                          env=self.rx.env, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            self.rx.wait_ports(["vale1:b"])
            tx = subprocess.run(self.tx.pktgen("vale0:a", "tx", self.tx.layout["tx"], "-l", size, "-T", seconds,
                                               *tx_args),
                                env=self.tx.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                timeout=seconds + 30, stdin=subprocess.DEVNULL)
            if tx.returncode != 0:
                raise RuntimeError(f"vale-pktgen tx failed: {tx.stderr.strip()[-2000:]}")
            time.sleep(0.1)
        finally:
            common.stop(rx)
        return {"tx": json.loads(tx.stdout), "rx": common.pktgen_reports([(rx, log)], "rx")}

    def close(self):
        for v in {id(self.tx): self.tx, id(self.rx): self.rx}.values():
            common.stop(v.proc, common.signal.SIGTERM)
        for ns in self.ns:
            sh(["ip", "netns", "del", ns], check=False)


def vale_runs(a, size, loads=()):
    """Saturation runs (rx pps each), then for each fraction of `loads` of their median the
    paced runs ({sent, received, loss, drops})."""
    t = ValeTunnel(a, a.underlay)
    runs = [common.rx_pps(t.run(size, a.seconds)) for _ in range(a.runs)]
    paced = {}
    for f in loads:
        rate = int(f * summary(runs)["median"])
        paced[f] = []
        for _ in range(a.runs):
            settle(t, "vale1:t")
            before, e0 = t.ports(), udp_rcvbuf_errors(t.ns[-1])
            # A deep ring at the receiving client: what is measured is the tunnel's loss, not
            # that of a client descheduled on a crowded CPU (the Linux side counts at a veth).
            r = t.run(size, a.seconds, tx_args=("-R", rate), rx_args=("--slots", RX_SLOTS))
            time.sleep(0.2)
            after, e1 = t.ports(), udp_rcvbuf_errors(t.ns[-1])
            sent, got = r["tx"]["packets"], sum(x["packets"] for x in r["rx"])
            drops = {f"{p} {c}": after[p]["counters"][c] - before[p]["counters"][c] for p, c in DROPS}
            drops["udp rcvbuf errors"] = e1 - e0
            drops["vale1:b rx_drops"] = sum(x["drops"] for x in r["rx"])
            paced[f].append({"rate_pps": rate, "sent": sent, "received": got, "loss": 1 - got / max(sent, 1),
                             "drops": {k: d for k, d in drops.items() if d}})
    t.close()
    return runs, paced


def linux_paced(topo, size, rate, seconds):
    """trafgen at `rate` pps for about `seconds` (an exact frame count) through `topo`:
    {rate_pps, sent, received, loss}, read once the last frames arrived."""
    count = int(rate * seconds)
    cfg = tempfile.NamedTemporaryFile(mode="w", suffix=".cfg", prefix="vb-trafgen-", delete=False)
    common.on_exit(lambda: os.path.exists(cfg.name) and os.unlink(cfg.name))
    cfg.write(peers.trafgen_config(size, peers.rx_mac(0)))
    cfg.close()
    limit = peers.START_WAIT + 3 * seconds + 5
    _, tx0, rx0 = topo.counters()
    out = subprocess.run(["ip", "netns", "exec", topo.ns["tx"], "taskset", "-c", "0",
                          "timeout", "-s", "INT", "-k", "3", f"{limit:.1f}",
                          "trafgen", "-i", cfg.name, "-o", "veth0", "-P", "1", "-n", str(count),
                          "-b", f"{rate}pps", "--no-sock-mem", "-Q", "-C"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=limit + 10)
    os.unlink(cfg.name)
    if out.returncode != 0:
        raise RuntimeError(f"trafgen failed: {out.stdout.strip()[-2000:]}")
    time.sleep(0.3)
    _, tx1, rx1 = topo.counters()
    sent, got = tx1 - tx0, rx1 - rx0
    return {"rate_pps": rate, "sent": sent, "received": got, "loss": 1 - got / max(sent, 1)}


def main():
    ap = common.parser(__doc__, "tunnel", seconds=2.0)
    ap.add_argument("--sizes", default="60,1514", help="frame sizes without FCS (default 60,1514)")
    ap.add_argument("--underlay", choices=("veth", "lo"), default="veth",
                    help="vale's underlay: veth (default; two valeds in two namespaces joined by a veth, "
                         "as the Linux peer) or lo (one valed, both switches over 127.0.0.1/.2)")
    ap.add_argument("--loads", metavar="FRACTIONS", default="",
                    help="also fixed offered loads, as fractions of each system's measured capacity "
                         "(e.g. 0.25,0.5): frames sent, received and lost at each")
    a = common.parse(ap)
    common.need_root("bench/tunnel.py")
    sizes = common.int_list(a.sizes)
    loads = common.float_list(a.loads) if a.loads else []
    rows, load_rows, results = [], [], []
    linux = None if a.no_peers else LinuxVxlan()
    for s in sizes:
        vale_runs_pps, vale_paced = vale_runs(a, s, loads)
        vale = summary(vale_runs_pps)
        r = {"frame_len": s, "vale_rx_pps": vale}
        row = [s, common.mpps(vale, 3)]
        if linux:
            lx = summary([peers.trafgen_run(linux, s, a.seconds)["rx_pps"] for _ in range(a.runs)])
            r["linux_rx_pps"] = lx
            row += [common.mpps(lx, 3), common.fmt_ratio(common.ratio(vale, lx))]
        if loads:
            r["loads"] = []
            for f in loads:
                lr = {"fraction": f, "vale": vale_paced[f]}
                cells = [s, f"{f:g}"]
                systems = [("vale", vale_paced[f])]
                if linux:
                    rate = int(f * lx["median"])
                    lr["linux"] = [linux_paced(linux, s, rate, a.seconds) for _ in range(a.runs)]
                    systems.append(("linux", lr["linux"]))
                for name, runs in systems:
                    sent, got = sum(x["sent"] for x in runs), sum(x["received"] for x in runs)
                    worst = max(x["loss"] for x in runs)
                    cells += [common.mpps(summary([x["rate_pps"] for x in runs]), 3), f"{sent}/{got}",
                              f"{(1 - got / max(sent, 1)) * 100:.3f}% (worst run {worst * 100:.3f}%)"]
                r["loads"].append(lr)
                load_rows.append(cells)
                for x in vale_paced[f]:
                    if x["drops"]:
                        print(f"{s} B at {f:g}: vale lost {x['sent'] - x['received']}: {x['drops']}")
        rows.append(row)
        results.append(r)
    if linux:
        linux.close()
    print(f"Two tunnel ports, underlay {a.underlay}, {a.runs} runs of {a.seconds} s, {common.describe()}")
    heads = ["len", "vale rx Mpps"] + ([] if a.no_peers else ["Linux vxlan rx Mpps", "vale / Linux"])
    common.table(heads, rows)
    if loads:
        print(f"\nFixed loads (fraction of each one's median capacity above), {a.runs} runs of {a.seconds} s each")
        heads = ["len", "load", "vale offered Mpps", "vale sent/received", "vale loss"]
        if linux:
            heads += ["Linux offered Mpps", "Linux sent/received", "Linux loss"]
        common.table(heads, load_rows)
    common.write_report(a.out, "tunnel", a, {"layout": a.layout, "underlay": a.underlay}, results)


if __name__ == "__main__":
    common.main_guard(main)

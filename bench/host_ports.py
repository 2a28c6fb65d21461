#!/usr/bin/env python3
"""Namespaces on a switch: vale's TAP and NIC ports against the Linux bridge, in the same run.

Two experiments (--experiments tcp or pps runs one), each the median of --runs runs of
--seconds, with min and max:

- tcp: iperf3, one TCP stream, between two network namespaces. Through vale, each namespace
  has a TAP port (TSO and checksum offload on; 64 KiB segments cross the switch whole). Through
  the Linux bridge, each namespace has a veth into a bridge (TSO on, as veths come). Also
  valed's CPU seconds (user + system) per GB carried.
- pps: 60-byte frames from trafgen in a namespace, out of a veth. Through vale, the veth's
  peer is a NIC port (AF_XDP native, AF_XDP generic, AF_PACKET: --modes; each with no
  moderation and with --moderation) and the receiver a native port (vale-pktgen rx, counted by
  valed); through the Linux bridge, the same veth layout as bench/linux_bridge.py, the receiver
  a veth counted by the kernel. A last row measures the bound: the same trafgen into a veth
  whose peer drops every frame at once.

Nothing is pinned: iperf3, trafgen, the kernel's softirqs and valed's threads share both vCPUs,
as they would on a host. Needs root; installs iperf3, ethtool, netsniff-ng and iproute2 with
apt-get if missing. Every namespace is removed on exit, error, Ctrl-C and SIGTERM.

    cargo build --release && bench/host_ports.py [--runs 5] [--seconds 3] [--experiments tcp]
        [--modes xdp,xdp-generic,packet]
"""
import json, os, subprocess, time

import common, peers
from common import sh, summary, ratio, fmt_ratio, on_exit

ADDR = ["10.91.0.1", "10.91.0.2"]


def gbps(s):
    if not s:
        return "-"
    return f"{s['median']/1e9:.2f} ({s['min']/1e9:.2f}-{s['max']/1e9:.2f})"


class Namespaces:
    """Network namespaces of this run, deleted (with what runs in them) at exit."""

    def __init__(self, tag):
        self.names = []
        self.tag = f"{tag}-{os.getpid()}"
        on_exit(self.close)

    def add(self, k):
        name = f"{self.tag}-{k}"
        sh(["ip", "netns", "add", name])
        self.names.append(name)
        sh(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def close(self):
        for n in self.names:
            pids = sh(["ip", "netns", "pids", n], check=False).split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            sh(["ip", "netns", "del", n], check=False)
        self.names = []


def iperf3(client_ns, server_ns, addr, seconds, cpu=False):
    """Bits per second the receiver saw, one TCP stream for `seconds` (whole seconds, at least 1:
    iperf3 takes no fractions). With `cpu`: (bits per second, CPU seconds): what iperf3's client
    and server used, as iperf3 reports it, plus the kernel's softirq threads meanwhile (on a
    local path the kernel's work runs in their system calls or in those threads)."""
    sh(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-D", "-p", "5201"])
    time.sleep(0.3)
    soft = softirq_seconds() if cpu else 0
    out = json.loads(sh(["ip", "netns", "exec", client_ns, "iperf3", "-c", addr, "-p", "5201", "-t",
                         str(max(1, round(seconds))), "-J"], timeout=seconds + 30))["end"]
    bps = out["sum_received"]["bits_per_second"]
    if not cpu:
        return bps
    u = out["cpu_utilization_percent"]
    secs = out["sum_received"]["seconds"]
    return bps, (u["host_total"] + u["remote_total"]) / 100 * secs + softirq_seconds() - soft


def softirq_seconds():
    """CPU seconds of the kernel's ksoftirqd threads so far."""
    return sum(common.cpu_seconds(int(p)) for p in sh(["pgrep", "-x", "ksoftirqd/.*"]).split())


def tcp_vale(args):
    ns = Namespaces("vh-tap")
    home = ns.add("home")
    v = common.Valed("shared", netns=home)
    hosts = []
    for i in range(2):
        tap = f"vhtap{i}"
        v.ctl("attach", f"vale0:t{i}", "--tap", tap)
        h = ns.add(f"h{i}")
        sh(["ip", "-n", home, "link", "set", tap, "netns", h])
        sh(["ip", "-n", h, "addr", "add", f"{ADDR[i]}/24", "dev", tap])
        sh(["ip", "-n", h, "link", "set", tap, "up"])
        hosts.append(h)
    sh(["ip", "netns", "exec", hosts[0], "ping", "-c", "1", "-W", "2", ADDR[1]])
    runs = []
    for _ in range(args.runs):
        c0 = common.cpu_seconds(v.pid)
        bps = iperf3(hosts[0], hosts[1], ADDR[1], args.seconds)
        runs.append((bps, common.cpu_seconds(v.pid) - c0))
    common.stop(v.proc, common.signal.SIGTERM)
    ns.close()
    return {"bps": summary([r[0] for r in runs]), "valed_cpu_s": summary([r[1] for r in runs])}


def tcp_bridge(args):
    b = peers.LinuxBridge()
    b.addresses()
    tx_ip, rx_ip = ("%d.%d.%d.%d" % peers.TX_IP), ("%d.%d.%d.%d" % peers.RX_IP)
    sh(["ip", "netns", "exec", b.ns["tx"], "ping", "-c", "1", "-W", "2", rx_ip])
    runs = [iperf3(b.ns["tx"], b.ns["rx"], rx_ip, args.seconds) for _ in range(args.runs)]
    b.close()
    return {"bps": summary(runs), "sender_ip": tx_ip}


class ValeNic(peers.Topo):
    """The veth layout of the bridge peer, but the sender's veth peer (p-tx) is a NIC port of
    a valed running in the middle namespace, and the receiver a native port (vale-pktgen rx)
    that announces rx_mac(0); frames are counted at the receiver by valed."""
    name = "vale_nic"

    def __init__(self, mode, moderation_us=0):
        super().__init__(n_rx=1, tag="vh")
        sw = self.ns["sw"]
        sh(["ip", "-n", sw, "link", "set", "p-tx", "up"])
        self.v = common.Valed("shared", netns=sw)
        self.v.ctl("attach", "vale0:eth", "--iface", "p-tx", "--mode", mode)
        self.mode = self.v.ports()["vale0:eth"]["mode"]
        self.v.ctl("set", "vale0:eth", "moderation", str(moderation_us))
        self.rx = common.spawn(self.v.pktgen("vale0:b", "rx", "0,1", "-T", "100000", "--announce",
                                             "-S", peers.rx_mac(0)),
                               env=self.v.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.v.wait_ports(["vale0:b"], announced=True)
        self.switch_pid = self.v.pid

    def counters(self):
        t0 = time.monotonic()
        tx = int(self.x("tx", "cat", "/sys/class/net/veth0/statistics/tx_packets"))
        rx = self.v.ports()["vale0:b"]["counters"]["rx_packets"]
        return (t0 + time.monotonic()) / 2, tx, rx

    def close(self):
        if hasattr(self, "rx"):
            common.stop(self.rx)
            common.stop(self.v.proc, common.signal.SIGTERM)
        super().close()


class SenderFloor(peers.Topo):
    """The same veth pair with nothing behind the sender's peer: the kernel drops each frame at
    once. What one trafgen reaches here bounds what any switch behind that veth can get."""
    name = "sender_floor"

    def __init__(self, mtu=1500):
        super().__init__(n_rx=1, mtu=mtu, tag="vf")
        sh(["ip", "-n", self.ns["sw"], "link", "set", "p-tx", "up"])
        self.switch_pid = None

    def counters(self):
        t0 = time.monotonic()
        tx = int(self.x("tx", "cat", "/sys/class/net/veth0/statistics/tx_packets"))
        rx = int(self.x("sw", "cat", "/sys/class/net/p-tx/statistics/rx_packets"))
        return (t0 + time.monotonic()) / 2, tx, rx


def pps_runs(topo, args):
    runs = [peers.trafgen_run(topo, 60, args.seconds, cpus="0,1") for _ in range(args.runs)]
    out = {"tx_pps": summary([r["tx_pps"] for r in runs]), "rx_pps": summary([r["rx_pps"] for r in runs])}
    if topo.switch_pid:
        out["switch_cpu_s"] = summary([r["switch_cpu_s"] for r in runs])
    topo.close()
    return out


def main():
    ap = common.parser(__doc__, "host_ports", runs=5, seconds=3.0, peers=False)
    ap.add_argument("--experiments", default="tcp,pps", help="tcp, pps or both (default tcp,pps)")
    ap.add_argument("--modes", default="xdp,xdp-generic,packet",
                    help="NIC port modes for the pps experiment (default xdp,xdp-generic,packet)")
    ap.add_argument("--moderation", type=int, default=30,
                    help="a second run of each NIC mode with this moderation of the NIC port, "
                         "microseconds between wake-ups of its thread; 0: no second run (default 30)")
    a = common.parse(ap)
    common.need_root("bench/host_ports.py")
    peers.ensure_netns_tools()
    common.ensure_packages(["iperf3", "ethtool"], ["iperf3", "ethtool"])
    which = a.experiments.split(",")
    results = {}
    if "tcp" in which:
        # Alternate vale and the bridge run by run, so drifts of the machine hit both.
        vale, bridge, cpu = [], [], []
        for _ in range(a.runs):
            one = argparse_like(a, runs=1)
            v = tcp_vale(one)
            vale.append(v["bps"]["median"])
            # valed's CPU seconds per GB carried: what a TAP port costs, less sensitive than
            # the rate to what else runs on the machine.
            gb = v["bps"]["median"] * max(1, round(a.seconds)) / 8 / 1e9
            cpu.append(v["valed_cpu_s"]["median"] / gb if gb else 0.0)
            bridge.append(tcp_bridge(one)["bps"]["median"])
        results["tcp"] = {"vale_tap": {"bps": summary(vale), "valed_cpu_s_per_gb": summary(cpu)},
                          "linux_bridge": {"bps": summary(bridge)}}
        r = ratio(results["tcp"]["vale_tap"]["bps"], results["tcp"]["linux_bridge"]["bps"])
        results["tcp"]["ratio"] = r
        c = results["tcp"]["vale_tap"]["valed_cpu_s_per_gb"]
        common.table(["TCP, one stream", "Gbit/s median (min-max)", "vale / bridge", "valed CPU s/GB"],
                     [["vale, TAP ports", gbps(results["tcp"]["vale_tap"]["bps"]), fmt_ratio(r),
                       f"{c['median']:.3f} ({c['min']:.3f}-{c['max']:.3f})"],
                      ["Linux bridge, veths", gbps(results["tcp"]["linux_bridge"]["bps"]), "", ""]])
    if "pps" in which:
        res = {"linux_bridge": pps_runs(peers.LinuxBridge(), a)}
        rows = [["Linux bridge, veth -> veth", common.mpps(res["linux_bridge"]["rx_pps"], 3), ""]]
        for m in a.modes.split(","):
            for mod in sorted({0, a.moderation}):
                t = ValeNic(m, mod)
                key = f"vale_nic_{t.mode}" + (f"_moderation_{mod}us" if mod else "")
                res[key] = pps_runs(t, a)
                res[key]["ratio"] = ratio(res[key]["rx_pps"], res["linux_bridge"]["rx_pps"])
                name = f"vale, veth ({t.mode}{f', moderation {mod} us' if mod else ''}) -> native port"
                rows.append([name, common.mpps(res[key]["rx_pps"], 3), fmt_ratio(res[key]["ratio"])])
        res["sender_floor"] = pps_runs(SenderFloor(), a)
        res["sender_floor"]["ratio"] = ratio(res["sender_floor"]["rx_pps"], res["linux_bridge"]["rx_pps"])
        rows.append(["(bound) veth peer drops every frame", common.mpps(res["sender_floor"]["rx_pps"], 3),
                     fmt_ratio(res["sender_floor"]["ratio"])])
        results["pps_60B"] = res
        common.table(["60-byte frames from trafgen", "rx Mpps median (min-max)", "vale / bridge"], rows)
    layout = {"name": "unpinned", "note": "iperf3 / trafgen (trafgen: taskset -c 0,1), kernel softirqs and "
                                          "valed's threads all share both vCPUs"}
    common.write_report(a.out, "host_ports", a, layout, results,
                        setup={"tcp": "iperf3 -t SECONDS, one stream, 10.91.0.0/24 (vale) or 198.18.0.0/24 "
                                      "(bridge); vale and bridge runs alternate",
                               "pps": f"{peers.trafgen_version()} -P 1, 60-byte UDP to the receiver's MAC"})


def argparse_like(a, **over):
    """A copy of the parsed options with some changed."""
    import copy
    b = copy.copy(a)
    for k, v in over.items():
        setattr(b, k, v)
    return b


if __name__ == "__main__":
    common.main_guard(main)

"""The peers vale is measured against, each started and stopped by the bench itself.

- LinuxBridge: the kernel's bridge between veths in network namespaces, trafgen as the sender,
  kernel counters as the receiver(s).
- Ovs: Open vSwitch's userspace datapath (datapath_type=netdev), ovsdb-server and ovs-vswitchd
  started by hand in a temporary directory, in the middle namespace of the same veth layout.
- memif_run: DPDK testpmd txonly -> rxonly over a memif link, two processes, no switch.
- kernel_ping: ICMP echo through the Linux bridge, for round-trip times.

Layout of the namespace peers (PID is the bench's pid, N the number of receivers):

    [vb-tx-PID] veth0 --- p-tx [vb-sw-PID: br0] p-rx0..p-rxN-1 --- rx0..rxN-1 [vb-rx-PID]

Nothing touches the host's interfaces or sysctls; the namespaces, daemons and files are removed
on exit, on an error, on Ctrl-C and on SIGTERM (common.install_cleanup).
"""
import os, re, shutil, signal, subprocess, tempfile, threading, time

import common
from common import sh, spawn, stop, on_exit, cpu_seconds

TX_MAC = "02:00:00:00:01:01"
TX_IP, RX_IP = (198, 18, 0, 1), (198, 18, 0, 2)    # the benchmarking range; used only in our namespaces
PER_CPU = "per-cpu"      # trafgen_run's cpus for one trafgen process per CPU
MAX_PPS = 20_000_000    # trafgen's frame-count bound = this x its time bound: far above any veth here
START_WAIT = 5.0        # seconds trafgen may take before its first frame shows in tx_packets


def rx_mac(i):
    return f"02:00:00:00:02:{i:02x}"


def ensure_netns_tools():
    common.ensure_packages(["trafgen", "ip", "bridge", "taskset", "timeout", "ping"],
                           ["netsniff-ng", "iproute2", "util-linux", "coreutils", "iputils-ping"])


_serial = [0]


class Topo:
    """Three namespaces (tx, sw, rx) and the veth pairs between them; no switch yet."""

    def __init__(self, n_rx=1, mtu=1500, tag="vb"):
        common.need_root("the Linux bridge and Open vSwitch peers")
        ensure_netns_tools()
        _serial[0] += 1
        sfx = f"{os.getpid()}-{_serial[0]}"
        self.ns = {k: f"{tag}-{k}-{sfx}" for k in ("tx", "sw", "rx")}
        self.n_rx = n_rx
        self.mtu = mtu
        self.rx_devs = [f"rx{i}" for i in range(n_rx)]
        self.sw_ports = ["p-tx"] + [f"p-rx{i}" for i in range(n_rx)]
        self._made = []
        on_exit(self.close)
        for k in ("tx", "sw", "rx"):
            sh(["ip", "netns", "add", self.ns[k]])
            self._made.append(self.ns[k])
            # IPv6 off before any link exists: no RS/DAD/MLD frames in the counters.
            self.x(k, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                   "net.ipv6.conf.default.disable_ipv6=1")
        # Links are made inside the namespaces: nothing ever appears in the host's namespace.
        sh(["ip", "-n", self.ns["tx"], "link", "add", "veth0", "mtu", str(mtu), "address", TX_MAC,
            "type", "veth", "peer", "name", "p-tx", "mtu", str(mtu), "netns", self.ns["sw"]])
        for i, dev in enumerate(self.rx_devs):
            sh(["ip", "-n", self.ns["rx"], "link", "add", dev, "mtu", str(mtu), "address", rx_mac(i),
                "type", "veth", "peer", "name", f"p-rx{i}", "mtu", str(mtu), "netns", self.ns["sw"]])
        sh(["ip", "-n", self.ns["tx"], "link", "set", "veth0", "up"])
        for dev in self.rx_devs:
            sh(["ip", "-n", self.ns["rx"], "link", "set", dev, "up"])

    def close(self):
        """Deletes the namespaces (with their veths and bridge); stops what runs in them first."""
        for p in getattr(self, "daemons", []):
            stop(p, signal.SIGTERM)
        while self._made:
            sh(["ip", "netns", "del", self._made.pop()], check=False)

    def x(self, k, *args, timeout=common.CMD_TIMEOUT):
        """Runs a command in namespace k and returns its stdout."""
        return sh(["ip", "netns", "exec", self.ns[k], *args], timeout=timeout)

    def counters(self):
        """(time, sender's tx_packets, sum of the receivers' rx_packets), one read each."""
        t0 = time.monotonic()
        tx = int(self.x("tx", "cat", "/sys/class/net/veth0/statistics/tx_packets"))
        rx = self.x("rx", "cat", *[f"/sys/class/net/{d}/statistics/rx_packets" for d in self.rx_devs])
        return (t0 + time.monotonic()) / 2, tx, sum(int(v) for v in rx.split())

    def wait_forwarding(self, ports_up):
        deadline = time.monotonic() + 5
        while not ports_up():
            if time.monotonic() > deadline:
                raise RuntimeError("switch ports not forwarding after 5 s")
            time.sleep(0.05)

    def addresses(self):
        """IPv4 addresses for kernel_ping: TX_IP on the sender, RX_IP on receiver 0."""
        sh(["ip", "-n", self.ns["tx"], "addr", "add", "%d.%d.%d.%d/24" % TX_IP, "dev", "veth0"])
        sh(["ip", "-n", self.ns["rx"], "addr", "add", "%d.%d.%d.%d/24" % RX_IP, "dev", self.rx_devs[0]])


class LinuxBridge(Topo):
    """The Linux bridge br0 in the middle namespace, br_netfilter off there, and a static fdb
    entry for receiver 0's MAC so unicast is forwarded from the first frame."""
    name = "linux_bridge"

    def __init__(self, n_rx=1, mtu=1500):
        super().__init__(n_rx, mtu)
        sw = self.ns["sw"]
        sh(["ip", "-n", sw, "link", "add", "br0", "mtu", str(mtu), "type", "bridge", "stp_state", "0"])
        # br_netfilter is built in and on: bridged IPv4 would go through iptables (per namespace).
        self.sysctls = {}
        for t in ("iptables", "ip6tables", "arptables"):
            key = f"net.bridge.bridge-nf-call-{t}"
            self.x("sw", "sysctl", "-qw", f"{key}=0")
            self.sysctls[key] = int(self.x("sw", "sysctl", "-n", key))
            if self.sysctls[key] != 0:
                raise RuntimeError(f"{key} is still {self.sysctls[key]} in {sw}")
        for port in self.sw_ports:
            sh(["ip", "-n", sw, "link", "set", port, "master", "br0"])
            sh(["ip", "-n", sw, "link", "set", port, "up"])
        sh(["ip", "-n", sw, "link", "set", "br0", "up"])
        sh(["bridge", "-n", sw, "fdb", "add", rx_mac(0), "dev", "p-rx0", "master", "static"])
        fdb = sh(["bridge", "-n", sw, "fdb", "show", "br", "br0"])
        if not re.search(rf"{rx_mac(0)} dev p-rx0 .*static", fdb):
            raise RuntimeError(f"static fdb entry for {rx_mac(0)} missing:\n{fdb}")
        self.wait_forwarding(lambda: sh(["bridge", "-n", sw, "link", "show"]).count("state forwarding")
                             >= len(self.sw_ports))
        self.switch_pid = None   # the bridge is kernel softirq: no process to account

    def setup_note(self):
        return {"switch": "Linux bridge br0 (kernel, softirq), STP off, static fdb entry for the "
                          "receiver's MAC", "sysctls_switch_ns": self.sysctls, "mtu": self.mtu}


class Ovs(Topo):
    """Open vSwitch, userspace datapath, in the middle namespace; the veth ends are its ports
    (type system, i.e. AF_PACKET sockets in ovs-vswitchd), NORMAL action (MAC learning), a
    static fdb entry for receiver 0's MAC (ovs-appctl fdb/add)."""
    name = "ovs"

    def __init__(self, n_rx=1, mtu=1500):
        ensure_ovs()
        super().__init__(n_rx, mtu)
        self.dir = tempfile.mkdtemp(prefix="vb-ovs-")
        on_exit(lambda: shutil.rmtree(self.dir, ignore_errors=True))
        d = self.dir
        self.env = dict(os.environ, OVS_RUNDIR=d, OVS_LOGDIR=d, OVS_DBDIR=d, OVS_SYSCONFDIR=d)
        self.db = f"unix:{d}/db.sock"
        sh(["ovsdb-tool", "create", f"{d}/conf.db", "/usr/share/openvswitch/vswitch.ovsschema"])
        ns = ["ip", "netns", "exec", self.ns["sw"]]
        self.log = open(f"{d}/daemons.log", "w")
        self.ovsdb = spawn([*ns, "ovsdb-server", f"{d}/conf.db", f"--remote=punix:{d}/db.sock",
                            f"--unixctl={d}/ovsdb.ctl", f"--pidfile={d}/ovsdb.pid", "--log-file=" + f"{d}/ovsdb.log"],
                           env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        self.daemons = [self.ovsdb]
        self._wait_file(f"{d}/db.sock", self.ovsdb)
        self.vsctl("--no-wait", "init")
        self.vswitchd = spawn([*ns, "ovs-vswitchd", self.db, f"--unixctl={d}/vswitchd.ctl",
                               f"--pidfile={d}/vswitchd.pid", f"--log-file={d}/vswitchd.log"],
                              env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        self.daemons.insert(0, self.vswitchd)
        self._wait_file(f"{d}/vswitchd.ctl", self.vswitchd)
        self.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
        for port in self.sw_ports:
            self.vsctl("add-port", "br0", port)
            sh(["ip", "-n", self.ns["sw"], "link", "set", port, "up"])
        if mtu > 1500:
            for port in self.sw_ports:
                self.vsctl("set", "interface", port, f"mtu_request={mtu}")
        self.appctl("fdb/add", "br0", "p-rx0", "0", rx_mac(0))
        self.wait_forwarding(lambda: all(
            self.vsctl("get", "interface", p, "ofport").strip() not in ("", "-1", "[]") for p in self.sw_ports))
        self.switch_pid = self._vswitchd_pid()
        self.version = sh(["ovs-vswitchd", "--version"]).splitlines()[0]

    def _wait_file(self, path, proc):
        deadline = time.monotonic() + 10
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not appear; see {self.dir}/*.log: "
                                   f"{open(self.log.name).read()[-1500:]}")
            time.sleep(0.02)

    def _vswitchd_pid(self):
        """The pid of ovs-vswitchd itself (we started `ip netns exec`, which execs it)."""
        with open(f"{self.dir}/vswitchd.pid") as f:
            return int(f.read().strip())

    def vsctl(self, *args):
        return sh(["ovs-vsctl", f"--db={self.db}", "--timeout=20", *args], env=self.env)

    def appctl(self, *args):
        return sh(["ovs-appctl", "-t", f"{self.dir}/vswitchd.ctl", *args], env=self.env)

    def setup_note(self):
        return {"switch": f"{self.version}, userspace datapath (datapath_type=netdev), ports type "
                          "system (veth), NORMAL action, static fdb entry for the receiver's MAC",
                "mtu": self.mtu}


def ensure_ovs():
    common.ensure_packages(["/usr/sbin/ovs-vswitchd", "/usr/sbin/ovsdb-server", "ovs-vsctl", "ovsdb-tool"],
                           ["openvswitch-switch"])


def trafgen_config(size, dst):
    """Ethernet + IPv4 + UDP, `size` bytes without FCS; trafgen fills in the IPv4 checksum."""
    hexs = lambda bs: ", ".join(f"0x{x:02x}" for x in bs)
    mac = lambda m: bytes(int(x, 16) for x in m.split(":"))
    fields = [
        hexs(mac(dst)),                             # destination MAC
        hexs(mac(TX_MAC)),                          # source MAC: the sender's veth
        "0x08, 0x00",                               # EtherType IPv4
        "0x45, 0x00",                               # version 4, IHL 5; TOS 0
        hexs((size - 14).to_bytes(2, "big")),       # IPv4 total length
        "0x00, 0x00, 0x40, 0x00",                   # id 0, don't fragment
        "0x40, 0x11",                               # TTL 64, protocol UDP
        "csumip(14, 33)",                           # IPv4 header checksum over bytes 14..33
        hexs(bytes(TX_IP)),
        hexs(bytes(RX_IP)),
        "0x04, 0xd2, 0x16, 0x2e",                   # UDP ports 1234 -> 5678
        hexs((size - 34).to_bytes(2, "big")),       # UDP length
        "0x00, 0x00",                               # UDP checksum: none
    ]
    if size > 42:
        fields.append(f"fill(0x00, {size - 42})")  # payload
    return "{\n  " + ",\n  ".join(fields) + "\n}\n"


def trafgen_run(topo, size, seconds, warmup=0.5, dst=None, cpus="0"):
    """One trafgen run through `topo`; returns {tx_pps, rx_pps, switch_cpu_s, tx_packets, rx_packets}.

    `trafgen -P 1` (one sending process, pinned with taskset -c cpus) sends Ethernet+IPv4+UDP
    frames of exactly `size` bytes to dst (default: receiver 0's MAC); with cpus=PER_CPU,
    trafgen without -P and taskset: one sending process per CPU, each pinned by trafgen to its
    CPU (the Linux bridge at its best: its softirq runs on every sending CPU). Once frames flow and
    `warmup` seconds have passed, the sender veth's tx_packets and the receivers' rx_packets are
    read, and again `seconds` later. switch_cpu_s is the CPU time of the switch process (OVS)
    between the reads, None for the kernel bridge.
    """
    dst = dst or rx_mac(0)
    cfg = tempfile.NamedTemporaryFile(mode="w", suffix=".cfg", prefix="vb-trafgen-", delete=False)
    on_exit(lambda: os.path.exists(cfg.name) and os.unlink(cfg.name))
    cfg.write(trafgen_config(size, dst))
    cfg.close()
    limit = START_WAIT + warmup + seconds + 5        # trafgen's time bound
    # -P 1: one sending process (default: one per CPU). --no-sock-mem, -Q: leave the host's
    # socket-memory sysctls and IRQ affinities alone (trafgen 0.6.8 lists -A for --no-sock-mem
    # but rejects it). -C: no CPU stats. (-q would mean "use the qdisc path", not quiet.)
    pin = [] if cpus == PER_CPU else ["taskset", "-c", cpus]
    procs = [] if cpus == PER_CPU else ["-P", "1"]
    cmd = ["ip", "netns", "exec", topo.ns["tx"], *pin,
           "timeout", "-s", "INT", "-k", "3", f"{limit:.1f}",
           "trafgen", "-i", cfg.name, "-o", "veth0", *procs, "-n", str(int(MAX_PPS * limit)),
           "--no-sock-mem", "-Q", "-C"]
    if size > 1514:
        cmd.append("-J")    # jumbo support: bigger frames in trafgen's packet ring (default 2048 B)
    log = tempfile.TemporaryFile(mode="w+")
    p = spawn(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        _, base, _ = topo.counters()
        deadline = time.monotonic() + START_WAIT
        while topo.counters()[1] == base:
            if p.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"trafgen sent nothing (exit {p.poll()}): {log.read().strip()[-2000:]}")
            time.sleep(0.05)
        time.sleep(warmup)
        c0 = cpu_seconds(topo.switch_pid) if topo.switch_pid else None
        t0, tx0, rx0 = topo.counters()
        time.sleep(seconds)
        t1, tx1, rx1 = topo.counters()
        c1 = cpu_seconds(topo.switch_pid) if topo.switch_pid else None
        if p.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"trafgen ended during the measurement (exit {p.returncode}): "
                               f"{log.read().strip()[-2000:]}")
    finally:
        stop(p)
        log.close()
        os.unlink(cfg.name)
    dt = t1 - t0
    return {"tx_pps": (tx1 - tx0) / dt, "rx_pps": (rx1 - rx0) / dt, "tx_packets": tx1 - tx0,
            "rx_packets": rx1 - rx0, "switch_cpu_s": None if c0 is None else c1 - c0}


def trafgen_version():
    out = subprocess.run(["trafgen", "-v"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=common.CMD_TIMEOUT, stdin=subprocess.DEVNULL).stdout   # exits 1
    return (out.strip().splitlines() or ["trafgen"])[0]


def kernel_ping(topo, size, count, interval=0.001, timeout=60):
    """Round-trip times (microseconds) of `count` ICMP echoes of `size`-byte frames from the
    sender's namespace to receiver 0's, through the switch of `topo` (needs topo.addresses())."""
    payload = size - 14 - 20 - 8     # Ethernet, IPv4, ICMP headers
    if payload < 16:
        raise ValueError(f"frame size {size} too small for ping's timestamped payload")
    ip = "%d.%d.%d.%d" % RX_IP
    topo.x("tx", "ping", "-c", "3", "-i", "0.01", "-W", "1", ip)     # ARP resolved before timing
    out = topo.x("tx", "taskset", "-c", "0", "ping", "-n", "-c", str(count), "-i", f"{interval:g}",
                 "-s", str(payload), "-W", "1", ip, timeout=timeout)
    return [float(m) * 1000 for m in re.findall(r"time=([0-9.]+) ms", out)]


# ---------------------------------------------------------------- DPDK testpmd over memif

def ensure_dpdk():
    common.ensure_packages(["dpdk-testpmd", "/usr/lib/x86_64-linux-gnu/librte_net_memif.so.23",
                            "/usr/lib/x86_64-linux-gnu/librte_mempool_ring.so.23"],
                           ["dpdk-dev", "librte-net-memif23", "librte-mempool-ring23"])


# Each testpmd has a main lcore (prints stats, mostly asleep) and one forwarding lcore.
MEMIF_LAYOUT = {"rx": {"lcores": "0,1", "main": "0", "forwarding": "1"},
                "tx": {"lcores": "1,0", "main": "1", "forwarding": "0"}}


def memif_lcores(cpus=None):
    """Each testpmd's EAL lcore arguments: MEMIF_LAYOUT's (main lcore on the other's CPU), or,
    with `cpus` ({"tx": CPU, "rx": CPU}), both lcores of each on its own CPU there (the
    forwarding lcore and its main lcore, mostly asleep, as the Testpmd class places them)."""
    if cpus is None:
        return {r: ["-l", MEMIF_LAYOUT[r]["lcores"], "--main-lcore", MEMIF_LAYOUT[r]["main"]] for r in ("rx", "tx")}
    return {r: ["--lcores", f"0@({cpus[r]}),1@({cpus[r]})", "--main-lcore", "0"] for r in ("rx", "tx")}


def memif_run(size, seconds, warmup=1.0, burst=32, cpus=None, dpdk=None):
    """DPDK testpmd txonly -> rxonly over memif, two processes; returns {rx_pps, tx_pps, cores,
    cpu_s_per_mpkt, rx_packets}. rx_pps is the mean of the receiver's per-second Rx-pps
    readings while the sender ran, after `warmup` (the first and last readings, partial
    seconds, are left out; at least one second is measured). cores: CPU time of both processes per second over the measured
    seconds (both busy-poll: about 2); cpu_s_per_mpkt: that per million received packets.
    `cpus`: {"tx": CPU, "rx": CPU} for each testpmd (see memif_lcores; default MEMIF_LAYOUT).
    `dpdk`: dpdk_env's (command, environment, EAL arguments); default Debian's testpmd."""
    if dpdk is None:
        ensure_dpdk()
        dpdk = ("dpdk-testpmd", None, [])
    testpmd, env, dpdk_eal = dpdk
    secs = max(1, round(seconds))      # testpmd reports once a second
    d = tempfile.mkdtemp(prefix="vb-memif-")
    on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    tag = f"vb{os.getpid()}x{int(time.monotonic() * 1000) % 100000}"
    sock = f"{d}/memif.sock"
    eal = ["--no-huge", "-m", "512", "--no-pci", "--log-level=lib.eal:error", *dpdk_eal]
    common_args = ["--total-num-mbufs=16384", "--stats-period", "1", "--auto-start", f"--burst={burst}"]
    procs, logs = {}, {}
    for role in ("rx", "tx"):
        on_exit(lambda r=role: shutil.rmtree(f"/var/run/dpdk/{tag}{r}", ignore_errors=True))
    try:
        for role, mode, extra in (("rx", "rxonly", []), ("tx", "txonly", [f"--txpkts={size}"])):
            memif = f"net_memif0,role={'server' if role == 'rx' else 'client'},id=0,socket={sock},socket-abstract=no"
            if common.SLOTS:
                # The same ring depth as vale's clients (memif's rsize: log2 of its slots).
                memif += f",rsize={common.SLOTS.bit_length() - 1}"
            logs[role] = open(f"{d}/{role}.log", "w+")
            # stdbuf -oL: line-buffered stats, so they can be read while testpmd runs.
            procs[role] = spawn(["stdbuf", "-oL", testpmd, *memif_lcores(cpus)[role], *eal,
                                 "--file-prefix", f"{tag}{role}", "--vdev", memif, "--",
                                 *common_args, f"--forward-mode={mode}", *extra],
                                stdout=logs[role], stderr=subprocess.STDOUT, env=env)
            if role == "rx":
                deadline = time.monotonic() + 10
                while not os.path.exists(sock):
                    if procs["rx"].poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"testpmd rx did not open {sock}: {_tail(logs['rx'])}")
                    time.sleep(0.02)
        # Wait for the first second with traffic (testpmd's EAL start-up takes a while), then
        # the warm-up; CPU time is taken over the next `seconds`, then one spare second.
        deadline = time.monotonic() + 20
        while not [x for x in re.findall(r"Rx-pps:\s+(\d+)", _tail(logs["rx"], 10**7)) if int(x) > 0]:
            for role, p in procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"testpmd {role} exited ({p.returncode}): {_tail(logs[role])}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no traffic over memif after 20 s: {_tail(logs['tx'])}")
            time.sleep(0.05)
        time.sleep(warmup)
        c0, t0 = sum(cpu_seconds(p.pid) for p in procs.values()), time.monotonic()
        time.sleep(secs)
        c1, t1 = sum(cpu_seconds(p.pid) for p in procs.values()), time.monotonic()
        time.sleep(1.5)
        for role in ("tx", "rx"):
            stop(procs[role], signal.SIGINT, 5)
    finally:
        for p in procs.values():
            stop(p, signal.SIGKILL, 2)
    text = {r: _tail(f, 10**7) for r, f in logs.items()}
    rx = [int(v) for v in re.findall(r"Rx-pps:\s+(\d+)", text["rx"])]
    tx = [int(v) for v in re.findall(r"Tx-pps:\s+(\d+)", text["tx"])]
    total = [int(v) for v in re.findall(r"RX-packets:\s+(\d+)", text["rx"])]

    def steady(v, skip):
        v = [x for x in v if x > 0]
        v = v[skip:skip + secs] or v[1:-1] or v
        return sum(v) / len(v) if v else None

    # The first reading with traffic is a partial second; then come the warm-up seconds.
    r = steady(rx, 1 + round(warmup))
    if r is None:
        raise RuntimeError(f"testpmd rxonly counted nothing:\nrx: {text['rx'][-1500:]}\ntx: {text['tx'][-1500:]}")
    cores = (c1 - c0) / (t1 - t0)
    return {"rx_pps": r, "tx_pps": steady(tx, 1), "cores": cores, "cpu_s_per_mpkt": cores / (r / 1e6),
            "rx_packets": max(total or [0])}


def memif_sender_alone(size, seconds, warmup=1.0, burst=32):
    """memif_run's sender with nothing behind it: the same testpmd txonly (same lcores, burst
    and mbufs) on DPDK's null driver, which frees every frame it is given. Returns
    {tx_pps}: the mean of its per-second Tx-pps readings after `warmup`."""
    common.ensure_packages(["/usr/lib/x86_64-linux-gnu/librte_net_null.so.23"], ["librte-net-null23"])
    ensure_dpdk()
    secs = max(1, round(seconds))
    d = tempfile.mkdtemp(prefix="vb-null-")
    on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    prefix = f"vb{os.getpid()}x{int(time.monotonic() * 1000) % 100000}null"
    on_exit(lambda: shutil.rmtree(f"/var/run/dpdk/{prefix}", ignore_errors=True))
    lay = MEMIF_LAYOUT["tx"]
    log = open(f"{d}/tx.log", "w+")
    p = spawn(["stdbuf", "-oL", "dpdk-testpmd", "-l", lay["lcores"], "--main-lcore", lay["main"], "--no-huge",
               "-m", "512", "--no-pci", "--log-level=lib.eal:error", "--file-prefix", prefix,
               "--vdev", "net_null0", "--", "--total-num-mbufs=16384", "--stats-period", "1", "--auto-start",
               f"--burst={burst}", "--forward-mode=txonly", f"--txpkts={size}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not [x for x in re.findall(r"Tx-pps:\s+(\d+)", _tail(log, 10**7)) if int(x) > 0]:
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"testpmd txonly on net_null sent nothing: {_tail(log)}")
            time.sleep(0.05)
        time.sleep(warmup + secs + 1.5)
    finally:
        stop(p, signal.SIGKILL, 2)
        shutil.rmtree(f"/var/run/dpdk/{prefix}", ignore_errors=True)
    tx = [int(v) for v in re.findall(r"Tx-pps:\s+(\d+)", _tail(log, 10**7)) if int(v) > 0]
    log.close()
    tx = tx[1 + round(warmup):1 + round(warmup) + secs] or tx
    return {"tx_pps": sum(tx) / len(tx)}


def _tail(f, n=1500):
    f.flush()
    f.seek(0)
    return f.read()[-n:]


def testpmd_version():
    try:
        out = sh(["dpkg-query", "-W", "-f", "${Version}", "dpdk-dev"])
        return f"DPDK {out.strip()} (Debian dpdk-dev)"
    except (RuntimeError, OSError):
        return "DPDK"


# ---------------------------------------------------------------- testpmd, interactive

def dpdk_env(folder=None):
    """(testpmd command, environment, extra EAL arguments): Debian's testpmd (its drivers
    installed with apt-get when missing), or, with `folder`, a relocatable DPDK folder holding
    bin/dpdk-testpmd, lib/ (its libraries) and pmds/ (the drivers, loaded with -d; EAL refuses a
    driver folder under a world-writable directory such as /tmp)."""
    if folder:
        folder = os.path.abspath(folder)
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(folder, "lib"))
        return os.path.join(folder, "bin", "dpdk-testpmd"), env, ["-d", os.path.join(folder, "pmds")]
    lib = "/usr/lib/x86_64-linux-gnu"
    common.ensure_packages(["dpdk-testpmd", "stdbuf", f"{lib}/librte_net_virtio.so.23",
                            f"{lib}/librte_net_vhost.so.23", f"{lib}/librte_mempool_ring.so.23"],
                           ["dpdk-dev", "librte-net-virtio23", "librte-net-vhost23", "librte-mempool-ring23"])
    return "dpdk-testpmd", None, []


class Testpmd:
    """One testpmd in interactive mode (`-i --auto-start`): commands go in through a pipe, its
    output (line-buffered by stdbuf) is read as it comes, so its port counters can be read
    while it forwards. Both its lcores (main, mostly asleep on the command line, and
    forwarding) run on `cpus` (a CPU or a list, EAL's --lcores set). Stopped with SIGSTOP then
    SIGKILL (never a signal it handles: DPDK peers have crashed on their way out); its runtime
    directory is removed."""

    def __init__(self, name, vdevs, mode, cpus, args=(), dpdk=(None, None, []), main_cpus=None):
        """`main_cpus`: the main lcore's CPU set, when not `cpus` (a forwarding lcore made
        real-time with realtime() leaves nothing of its CPU to a main lcore beside it)."""
        exe, env, eal = dpdk
        self.name = name
        self.prefix = f"vb{os.getpid()}x{name}"
        on_exit(lambda: shutil.rmtree(f"/var/run/dpdk/{self.prefix}", ignore_errors=True))
        cmd = ["stdbuf", "-oL", exe, "--lcores", f"0@({main_cpus or cpus}),1@({cpus})", "--main-lcore", "0",
               "--no-huge", "-m", "512", "--no-pci", "--single-file-segments", "--log-level=lib.eal:error",
               # The vhost library's INFO lines (a front end connecting) land amid the prompt
               # and the echo of a command, which then cannot be found (seen: `clea` VHOST_CONFIG
               # ... `r fwd stats`): only its warnings and errors.
               "--log-level=lib.vhost.config:warning",
               "--file-prefix", self.prefix, *eal]
        for v in vdevs:
            cmd += ["--vdev", v]
        cmd += ["--", "-i", "--auto-start", "--total-num-mbufs=16384", f"--forward-mode={mode}", *args]
        self.cmd = cmd
        self.out = bytearray()
        self.lock = threading.Lock()
        self.proc = spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        on_exit(self.kill)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            b = self.proc.stdout.read1(65536)
            if not b:
                return
            with self.lock:
                self.out += b

    def text(self, start=0):
        with self.lock:
            return self.out[start:].decode(errors="replace")

    def tail(self, n=2000):
        return self.text()[-n:]

    def wait_for(self, what, start=0, limit=30.0):
        """Waits until the output after byte `start` holds `what`; the offset after it."""
        deadline = time.monotonic() + limit
        w = what.encode()
        while True:
            with self.lock:
                i = self.out.find(w, start)
            if i >= 0:
                return i + len(w)
            if self.proc.poll() is not None:
                time.sleep(0.1)
                raise RuntimeError(f"testpmd {self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"testpmd {self.name}: no {what!r} after {limit:g} s:\n{self.tail()}")
            time.sleep(0.01)

    def command(self, line):
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def wait_forwarding(self, limit=30.0):
        at = self.wait_for("Start automatic packet forwarding", 0, limit)
        self.wait_for("testpmd> ", at, limit)

    def realtime(self, priority=1):
        """Makes the forwarding lcore's thread SCHED_FIFO `priority` (root): it busy-polls, so it
        then takes up to the kernel's RT share (95%) of its CPU whatever else runs there.
        Returns the thread ids it changed."""
        tids = []
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
            if name.startswith(("rte-worker", "lcore-worker")):
                os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(priority))
                tids.append(int(tid))
        if not tids:
            raise RuntimeError(f"testpmd {self.name}: no forwarding lcore thread to make real-time")
        return tids

    def stats(self, port=0, limit=10.0):
        """{rx, tx, t}: the port's RX-packets and TX-packets now, and when they were read (the
        middle of the command's round trip)."""
        with self.lock:
            start = len(self.out)
        t0 = time.monotonic()
        self.command(f"show port stats {port}")
        at = self.wait_for(f"NIC statistics for port {port} ", start, limit)
        end = self.wait_for("\n", self.wait_for("TX-bytes:", at, limit), limit)
        t1 = time.monotonic()
        block = self.text(at)[:end - at]
        rx, tx = re.search(r"RX-packets:\s+(\d+)", block), re.search(r"TX-packets:\s+(\d+)", block)
        if not rx or not tx:
            raise RuntimeError(f"testpmd {self.name}: unreadable stats:\n{block}")
        return {"rx": int(rx.group(1)), "tx": int(tx.group(1)), "t": (t0 + t1) / 2}

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stop(self.proc, signal.SIGKILL, 5)
        shutil.rmtree(f"/var/run/dpdk/{self.prefix}", ignore_errors=True)

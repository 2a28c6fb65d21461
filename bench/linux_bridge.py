#!/usr/bin/env python3
"""One sender to one receiver through the Linux bridge: the baseline for bench/two_ports.py.

The same experiment as two_ports.py, with the kernel in vale's place:

    [vbr-tx-PID] veth0 --- p-tx [vbr-br-PID: br0] p-rx --- veth0 [vbr-rx-PID]

It makes three network namespaces (named with this process's pid), two veth pairs inside
them and a bridge in the middle one. br_netfilter is turned off there
(net.bridge.bridge-nf-call-{iptables,ip6tables,arptables}=0), and a static fdb entry for the
receiver's MAC means the bridge forwards unicast from the first frame. IPv6 is off in the
three namespaces and no interface has an address, so only the test frames are counted and
the receiver's IP stack drops them without answering. The host's own interfaces and sysctls
are not touched. Everything is deleted on exit, on an error and on Ctrl-C or SIGTERM.

For each frame size and run, `trafgen -P 1` sends Ethernet+IPv4+UDP frames from vbr-tx's
veth0 to vbr-rx's veth0. Sizes don't include the FCS (60 is the minimum Ethernet frame). The
IPv4 checksum is valid and the UDP checksum is 0. trafgen is bounded by `timeout` and by a
frame count. Once frames flow, the script waits --warmup seconds and reads two counters with
`ip netns exec NS cat /sys/class/net/veth0/statistics/...`: tx_packets of the sender's veth
and rx_packets of the receiver's veth. It reads them again --seconds later and stops trafgen.
pps = counter delta / time between the two reads.

The receiver is the kernel: no process. The bridge runs in softirq wherever the kernel puts
it (with veth, mostly on the sending CPU). --layout split pins trafgen on cpu0, like
two_ports.py's sender. --layout shared runs it without taskset, but trafgen 0.6.8 pins its
sending fork to cpu0 by itself anyway. The JSON records the CPU affinity of trafgen's sending
process as it actually ran.

It prints a table and writes JSON to bench/results/linux_bridge.json, with the same keys as
two_ports.json plus "setup". bench/compare.py then gives vale's figures as ratios against
the bridge.

Needs root (namespaces, packet sockets). If netsniff-ng (trafgen) or iproute2 are missing, it
installs them with apt-get.

    sudo bench/linux_bridge.py [--runs 5] [--seconds 3] [--sizes 60,1514] [--layout split]
"""
import argparse, atexit, json, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from two_ports import ROOT, machine  # noqa: E402  (one description of the machine for both JSONs)

LAYOUTS = {
    # name: cpus for `taskset -c` on trafgen, or None for no pinning
    "split": "0",      # sender on cpu0; bridge/veth softirq goes where the kernel puts it
    "shared": None,    # no taskset (trafgen 0.6.8 still pins its sending fork to cpu0 itself)
}
TX_MAC, RX_MAC = "02:00:00:00:00:01", "02:00:00:00:00:02"
TX_IP, RX_IP = (198, 18, 0, 1), (198, 18, 0, 2)   # benchmarking range; never configured anywhere
MAX_PPS = 20_000_000   # trafgen's frame-count bound = this x its time bound: far above any veth here
START_WAIT = 5.0       # seconds trafgen may take before the first frame shows in tx_packets
CMD_TIMEOUT = 30       # seconds, for every short command
TOOLS = ("trafgen", "ip", "bridge", "sysctl", "taskset", "timeout")

PID = os.getpid()
NS = {k: f"vbr-{k}-{PID}" for k in ("tx", "br", "rx")}
_created = []   # namespaces made so far, deleted by cleanup()
_procs = []     # trafgen process groups still running, killed by cleanup()


def sh(args, timeout=CMD_TIMEOUT):
    """Run a command and return its stdout; on failure raise with its stderr."""
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def nsx(ns, *args, timeout=CMD_TIMEOUT):
    return sh(["ip", "netns", "exec", NS[ns], *args], timeout=timeout)


def ensure_tools():
    missing = [t for t in TOOLS if not shutil.which(t)]
    if not missing:
        return
    print(f"installing netsniff-ng iproute2 (missing: {', '.join(missing)})", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "netsniff-ng", "iproute2"]
    if subprocess.run(cmd, env=env, timeout=900, stdin=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, timeout=900, check=True, stdin=subprocess.DEVNULL)
        subprocess.run(cmd, env=env, timeout=900, check=True, stdin=subprocess.DEVNULL)
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        sys.exit(f"still missing after apt-get install netsniff-ng iproute2: {', '.join(missing)}")


def stop(p, sig=signal.SIGINT, wait=5):
    """Signal trafgen's whole process group (it forks), then SIGKILL it if it lingers."""
    for s in (sig, signal.SIGKILL):
        if p.poll() is not None:
            break
        try:
            os.killpg(p.pid, s)
        except ProcessLookupError:
            break
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    if p in _procs and p.poll() is not None:
        _procs.remove(p)


def cleanup():
    for p in list(_procs):
        stop(p, signal.SIGKILL)
    while _created:
        ns = _created.pop()
        try:
            subprocess.run(["ip", "netns", "del", ns], timeout=CMD_TIMEOUT, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"cleanup: ip netns del {ns}: {e}", file=sys.stderr)


def on_signal(signum, _frame):
    raise SystemExit(f"stopped by signal {signum}")   # unwinds through the finally: cleanup()


def setup():
    """Namespaces, veths, bridge; returns the bridge namespace's br_netfilter sysctls."""
    for k in ("tx", "br", "rx"):
        sh(["ip", "netns", "add", NS[k]])
        _created.append(NS[k])
        # IPv6 off before any link exists: no RS/DAD/MLD frames in the counters.
        nsx(k, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    # Links are made inside the namespaces: nothing ever appears in the host's namespace.
    sh(["ip", "-n", NS["tx"], "link", "add", "veth0", "address", TX_MAC, "type", "veth",
        "peer", "name", "p-tx", "netns", NS["br"]])
    sh(["ip", "-n", NS["rx"], "link", "add", "veth0", "address", RX_MAC, "type", "veth",
        "peer", "name", "p-rx", "netns", NS["br"]])
    sh(["ip", "-n", NS["br"], "link", "add", "br0", "type", "bridge", "stp_state", "0"])
    # br_netfilter is built in and on: bridged IPv4 would go through iptables (per namespace).
    nf = {}
    for t in ("iptables", "ip6tables", "arptables"):
        key = f"net.bridge.bridge-nf-call-{t}"
        nsx("br", "sysctl", "-qw", f"{key}=0")
        nf[key] = int(nsx("br", "sysctl", "-n", key).strip())
        if nf[key] != 0:
            raise RuntimeError(f"{key} is still {nf[key]} in {NS['br']}")
    for port in ("p-tx", "p-rx"):
        sh(["ip", "-n", NS["br"], "link", "set", port, "master", "br0"])
        sh(["ip", "-n", NS["br"], "link", "set", port, "up"])
    sh(["ip", "-n", NS["br"], "link", "set", "br0", "up"])
    for k in ("tx", "rx"):
        sh(["ip", "-n", NS[k], "link", "set", "veth0", "up"])
    sh(["bridge", "-n", NS["br"], "fdb", "add", RX_MAC, "dev", "p-rx", "master", "static"])
    fdb = sh(["bridge", "-n", NS["br"], "fdb", "show", "br", "br0"])
    if not re.search(rf"{RX_MAC} dev p-rx .*static", fdb):
        raise RuntimeError(f"static fdb entry for {RX_MAC} missing:\n{fdb}")
    for _ in range(100):   # carrier and forwarding state on both ports (STP off: immediate)
        ports = sh(["bridge", "-n", NS["br"], "link", "show"])
        if ports.count("state forwarding") >= 2:
            break
        time.sleep(0.05)
    else:
        raise RuntimeError(f"bridge ports not forwarding:\n{ports}")
    return nf


def trafgen_config(size):
    """Ethernet + IPv4 + UDP, `size` bytes without FCS; trafgen fills in the IPv4 checksum."""
    hexs = lambda bs: ", ".join(f"0x{x:02x}" for x in bs)
    mac = lambda m: bytes(int(x, 16) for x in m.split(":"))
    fields = [
        hexs(mac(RX_MAC)),                          # destination MAC: the receiver's veth
        hexs(mac(TX_MAC)),                          # source MAC
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


def counter(ns, name):
    """(monotonic time of the read, value) of veth0's statistics/<name> in namespace ns."""
    t0 = time.monotonic()
    v = int(nsx(ns, "cat", f"/sys/class/net/veth0/statistics/{name}").strip())
    return (t0 + time.monotonic()) / 2, v


def trafgen_affinity(pgid):
    """Cpus_allowed_list of trafgen's sending processes (its forks) in process group pgid."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            rest = stat[stat.rindex(")") + 2:].split()
            procs[int(d)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(rest[1]), int(rest[2]))
        except (OSError, ValueError, IndexError):
            continue
    ours = [pid for pid, (comm, _, pgrp) in procs.items() if comm == "trafgen" and pgrp == pgid]
    senders = [pid for pid in ours if procs.get(procs[pid][1], ("",))[0] == "trafgen"] or ours
    out = set()
    for pid in senders:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out.add(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return sorted(out)


def run_once(cfg_path, seconds, warmup, layout):
    """One trafgen run; returns (tx pps, rx pps, trafgen affinities seen)."""
    limit = START_WAIT + warmup + seconds + 5        # trafgen's time bound
    cmd = ["ip", "netns", "exec", NS["tx"]]
    if LAYOUTS[layout] is not None:
        cmd += ["taskset", "-c", LAYOUTS[layout]]
    # -P 1: one sending process (default: one per CPU). --no-sock-mem, -Q: leave the host's
    # socket-memory sysctls and IRQ affinities alone (trafgen 0.6.8 lists -A for --no-sock-mem
    # but rejects it). -C: no CPU stats. (-q would mean "use the qdisc path", not quiet.)
    cmd += ["timeout", "-s", "INT", "-k", "3", f"{limit:.1f}",
            "trafgen", "-i", cfg_path, "-o", "veth0", "-P", "1", "-n", str(int(MAX_PPS * limit)),
            "--no-sock-mem", "-Q", "-C"]
    log = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    _procs.append(p)
    try:
        _, base = counter("tx", "tx_packets")
        deadline = time.monotonic() + START_WAIT
        while counter("tx", "tx_packets")[1] == base:
            if p.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"trafgen sent nothing (exit {p.poll()}): {log.read().strip()[-2000:]}")
            time.sleep(0.05)
        time.sleep(warmup)
        aff = trafgen_affinity(p.pid)
        t0, r0 = counter("tx", "tx_packets"), counter("rx", "rx_packets")
        time.sleep(seconds)
        t1, r1 = counter("tx", "tx_packets"), counter("rx", "rx_packets")
        if p.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"trafgen ended during the measurement (exit {p.returncode}): "
                               f"{log.read().strip()[-2000:]}")
    finally:
        stop(p)
        log.close()
    return (t1[1] - t0[1]) / (t1[0] - t0[0]), (r1[1] - r0[1]) / (r1[0] - r0[0]), aff


def summary(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs per frame size (default 5)")
    ap.add_argument("--seconds", type=float, default=3, help="measured seconds per run (default 3)")
    ap.add_argument("--warmup", type=float, default=0.5,
                    help="seconds of sending before the measurement starts (default 0.5)")
    ap.add_argument("--sizes", default="60,1514", help="frame sizes without FCS, 42..1514 (default 60,1514)")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="split",
                    help="split: trafgen pinned on cpu0 with taskset; shared: no taskset (trafgen "
                         "pins its sender to cpu0 itself) (default split)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "linux_bridge.json"))
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    bad = [s for s in sizes if not 42 <= s <= 1514]
    if bad:
        ap.error(f"frame sizes must be 42..1514 (Ethernet+IPv4+UDP headers, MTU 1500): {bad}")
    if a.runs < 1 or a.seconds <= 0 or a.warmup < 0:
        ap.error("--runs must be >= 1, --seconds > 0, --warmup >= 0")
    if os.geteuid() != 0:
        sys.exit("linux_bridge.py needs root (network namespaces, veth, packet sockets, apt-get): "
                 "run it as sudo bench/linux_bridge.py")
    ensure_tools()

    atexit.register(cleanup)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    cfg_dir = tempfile.mkdtemp(prefix="vbr-bench-")
    affinities = set()
    try:
        nf = setup()
        results = []
        for size in sizes:
            cfg_path = os.path.join(cfg_dir, f"udp{size}.cfg")
            with open(cfg_path, "w") as f:
                f.write(trafgen_config(size))
            tx_pps, rx_pps = [], []
            for _ in range(a.runs):
                t, r, aff = run_once(cfg_path, a.seconds, a.warmup, a.layout)
                tx_pps.append(t)
                rx_pps.append(r)
                affinities.update(aff)
            results.append({"frame_len": size, "tx_pps": summary(tx_pps), "rx_pps": summary(rx_pps)})
    finally:
        cleanup()
        shutil.rmtree(cfg_dir, ignore_errors=True)

    txcpu = LAYOUTS[a.layout] or "not pinned"
    version = subprocess.run(["trafgen", "-v"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=CMD_TIMEOUT, stdin=subprocess.DEVNULL).stdout.strip().splitlines()  # exits 1
    report = {
        "experiment": "linux_bridge",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "cpu_layout": {
            "bridge": "kernel softirq, not pinned",
            "tx": txcpu,
            "tx_affinity_seen": sorted(affinities),
            "rx": "kernel (veth rx_packets counter, no process)",
            "name": a.layout,
        },
        "runs": a.runs,
        "seconds": a.seconds,
        "results": results,
        "setup": {
            "path": "trafgen -> veth -> br0 (Linux bridge) -> veth, three network namespaces",
            "sender": f"{version[0] if version else 'trafgen'}, -P 1 (one process), packet-socket "
                      "qdisc bypass, Ethernet+IPv4+UDP, UDP checksum 0",
            "fdb": "static entry for the receiver's MAC on the bridge",
            "sysctls_bridge_ns": nf,
            "warmup_seconds": a.warmup,
            "count": "tx: sender veth tx_packets delta; rx: receiver veth rx_packets delta; "
                     "pps = delta / time between the reads",
        },
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"Linux bridge, {a.runs} runs of {a.seconds} s, layout {a.layout}: trafgen cpu {txcpu} "
          f"(affinity seen: {', '.join(sorted(affinities)) or '?'}), bridge in softirq (not pinned), "
          f"rx = kernel counter")
    print(f"{'len':>6} {'tx Mpps (min-max)':>22} {'rx Mpps (min-max)':>22} {'rx Gbit/s (min-max)':>22}")
    for r in results:
        t, x, n = r["tx_pps"], r["rx_pps"], r["frame_len"] * 8 / 1e9
        print(f"{r['frame_len']:>6} {t['median']/1e6:>8.2f} ({t['min']/1e6:.2f}-{t['max']/1e6:.2f}) "
              f"{x['median']/1e6:>8.2f} ({x['min']/1e6:.2f}-{x['max']/1e6:.2f}) "
              f"{x['median']*n:>8.2f} ({x['min']*n:.2f}-{x['max']*n:.2f})")
    print(f"JSON: {a.out}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted; namespaces and trafgen cleaned up")

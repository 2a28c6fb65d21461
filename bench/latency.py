#!/usr/bin/env python3
"""Round-trip latency (VALE paper, figure 12): ping-pong between two processes through vale.

vale: `vale-pktgen -f pong --announce` on vale0:b echoes every frame; `vale-pktgen -f ping` on
vale0:a sends one frame to b's MAC, waits for its echo, and sends the next, for --seconds. Both
sleep in poll between frames (no busy-waiting), as in the paper's experiment; valed runs with
its defaults, so its forwarding thread spins briefly on a ring in an active exchange (`valed
--spin-us`, 50 µs) before it sleeps. Each run reports
min, median, 99th percentile and max; the table gives the median over runs of each.

Peer: the Linux bridge between veths in namespaces, `ping -i 0.001` (ICMP echo of the same
frame size) from one namespace to the other: the reply comes from the kernel itself, no
process wakes up on that side. The ratio is the bridge's median RTT / vale's.

Busy variants (the "busy" table and JSON list; --variants none skips them): the same
ping-pong with some parties never sleeping. valed busy-polls with `--busy-poll-us`
(--busy-poll-us here, default 1000), clients busy-wait with `vale-pktgen --busy` (they spin on
the ring indices in shared memory and ask valed for no interrupt):

    valed-busy     valed busy-polls, ping and pong sleep
    busy-clients   ping and pong busy-wait, valed sleeps (their kicks wake it)
    busy-ping      valed busy-polls and ping busy-waits, pong sleeps
    busy           nobody sleeps: valed busy-polls, ping and pong busy-wait
    busy-1thread   nobody sleeps, and the two clients are one thread: libvale's example
                   busy_pingpong (crates/libvale/examples/; built here if missing) sends from
                   one port, spins until the frame is at the other, echoes it, spins until it
                   is back; valed busy-polls. The round trip takes the path of `busy` (client,
                   valed, client, valed, client, no sleep, no system call) with the two
                   clients' turns in one thread, so it needs 2 CPUs where `busy` needs 3

A busy party wants a CPU of its own. With 3 or more vCPUs each party gets one (valed, ping,
pong on cpus 1, 2, 3, or 0, 1, 2 with three); --busy-cpus V,P,Q sets them. With 2 vCPUs
someone shares: valed-busy takes the split layout (valed cpu1, both clients cpu0),
busy-clients puts ping on cpu0 and pong and valed on cpu1, busy-ping puts the sleeping pong
on valed's cpu1 (its wake-up preempts valed's spin), and busy has two spinners on one CPU
(ping and pong on cpu0; the table marks such rows "oversubscribed"): they yield the CPU to
each other between looks, and sleep while other tasks keep it (vale_abi::spin). The column
"/sleep" is a busy row's median over the sleeping median of the main table, same frame size
(measured minutes apart: compare it over several runs on a busy machine), and "crowded"
the waits of ping (summed over runs) that slept because its CPU was crowded; "floor" the
round trip of a bare index between the same CPUs (`bare-copy --rtt` ping<->valed plus
valed<->pong: the four hops' index moves and nothing else; for busy-1thread twice the round
trip between its CPU and valed's; none where two parties share a CPU), "/floor" the busy
median over it: on a machine whose host moves its vCPUs (a line's round trip here went from
0.1 to 0.5 us and back between runs) the ratio says more than the median. The sleeping rows
of the main table are untouched by all this.

Like with like (the "like-for-like" table and JSON list; --like none skips it): the kernel's
ICMP echo answers in softirq, no process wakes on the far side, so it is not the peer of a
ping-pong between two processes. The peer is two processes doing UDP request/response through
the Linux bridge: `udp-pingpong` (crates/vale-tests/src/bin/udp-pingpong.rs; the same frame
size on the wire, both sleeping in recv) in the namespaces of peers.LinuxBridge, beside vale's
vale-pktgen ping and pong in the same CPU layout, in the same run:

    one-cpu    everything on cpu0: valed, ping and pong; the bridge's ping and pong (the
               bridge runs in their softirq)
    two-cpus   ping on cpu0, pong on cpu1; valed beside pong on cpu1

and the VM path in the same layouts: a ping-pong between two vhost-user front ends
(`vhost-paced --role ping|pong`, each sleeping in poll on its receive queue's call eventfd
between frames, as a guest's driver sleeps on its interrupt) through vale (vale1:vm1,
vale1:vm2, valed listening; in its default mode, and polling with --busy-poll-us, like with
like for the PMD) and through DPDK's vhost PMD (testpmd --forward-mode=io between net_vhost0
and net_vhost1, both its lcores where valed would be: it busy-polls, sharing that CPU with
whoever else is there). --no-vm skips the VM path (it needs testpmd).

    cargo build --release && bench/latency.py [--runs 5] [--seconds 2] [--sizes 60,1514]
    bench/latency.py --no-peers --variants busy,busy-ping --busy-cpus 2,4,6 --sizes 60
    bench/latency.py --variants none --like one-cpu,two-cpus     # the like-for-like table alone
"""
import json, os, subprocess, time

import common, peers
from common import summary


def fmt(s):
    return "-" if not s else f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


# name: (valed busy-polls, ping busy-waits, pong busy-waits)
VARIANTS = {
    "valed-busy": (True, False, False),
    "busy-clients": (False, True, True),
    "busy-ping": (True, True, False),
    "busy": (True, True, True),
    "busy-1thread": (True, True, True),
}
# Where each party runs with 2 vCPUs, per variant: (valed, ping, pong).
TWO_CPU_LAYOUT = {
    "valed-busy": ("1", "0", "0"),
    "busy-clients": ("1", "0", "1"),
    "busy-ping": ("1", "0", "1"),
    "busy": ("1", "0", "0"),
    "busy-1thread": ("1", "0", "0"),
}
PINGPONG = os.path.join(common.BIN, "examples", "busy_pingpong")
UDP_PINGPONG = os.path.join(common.BIN, "udp-pingpong")
VHOST_PACED = os.path.join(common.BIN, "vhost-paced")
# Like-for-like layouts: (valed or the middle, ping, pong).
LIKE = {"one-cpu": ("0", "0", "0"), "two-cpus": ("1", "0", "1")}
UDP_PORT = 7007
PING_MAC, PONG_MAC = "02:00:00:00:0e:01", "02:00:00:00:0e:02"


def rtt_summary(runs):
    """{samples, min, median, p99, max} over runs of ping reports (each a summary over runs)."""
    return {"samples": sum(r["samples"] for r in runs),
            **{k: summary([r[f"{k}_us"] for r in runs]) for k in ("min", "median", "p99", "max")}}


def bridge_udp(b, size, seconds, ping_cpu, pong_cpu):
    """udp-pingpong between the bridge's sender and receiver namespaces: ping's report."""
    ip = "%d.%d.%d.%d" % peers.RX_IP
    pong = common.spawn(["ip", "netns", "exec", b.ns["rx"], "taskset", "-c", pong_cpu, UDP_PINGPONG, "pong",
                         "--bind", f"{ip}:{UDP_PORT}", "--seconds", str(seconds + 30)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        b.x("tx", "ping", "-c", "2", "-i", "0.05", "-W", "1", ip)       # ARP resolved, pong bound
        out = common.sh(["ip", "netns", "exec", b.ns["tx"], "taskset", "-c", ping_cpu, UDP_PINGPONG, "ping",
                         "--to", f"{ip}:{UDP_PORT}", "--len", str(size), "--seconds", str(seconds)],
                        timeout=seconds + 30)
    finally:
        common.stop(pong, common.signal.SIGTERM)
    return json.loads(out)


class VmPath:
    """The two vhost-user sockets of the VM path, with vale (valed's vale1:vm1 and vm2) or
    DPDK's vhost PMD (testpmd io) listening at them, on the layout's middle CPU."""

    serial = 0

    def __init__(self, system, cpus, d, dpdk, valed_args=()):
        self.system, self.cpus = system, cpus
        VmPath.serial += 1     # fresh socket paths: a killed testpmd leaves its sockets behind
        self.socks = tuple(f"{d}/{system}-{VmPath.serial}-{i}.sock" for i in (0, 1))
        if system == "vale":
            self.v = common.Valed({"name": "vm-path", "valed": cpus[0], "tx": cpus[1], "rx": cpus[2]},
                                  extra=valed_args)
            for port, sock in zip(("vale1:vm1", "vale1:vm2"), self.socks):
                self.v.ctl("attach", port, "--vhost-user", sock)
            self.pid = self.v.pid
        else:
            self.mid = peers.Testpmd("lat", [f"net_vhost0,iface={self.socks[0]},queues=1",
                                             f"net_vhost1,iface={self.socks[1]},queues=1"], "io", cpus[0], dpdk=dpdk)
            self.mid.wait_forwarding()
        deadline = time.monotonic() + 10
        while not all(os.path.exists(x) for x in self.socks):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: no socket at {' or '.join(self.socks)} after 10 s")
            time.sleep(0.02)

    def wait_up(self, port, limit=30.0):
        if self.system != "vale":
            time.sleep(0.5)       # testpmd says nothing when a front end is set up
            return
        deadline = time.monotonic() + limit
        while self.v.ports()[port]["state"] != "up":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{port} not up after {limit:g} s")
            time.sleep(0.02)

    def ping(self, size, seconds):
        pong = common.spawn(["taskset", "-c", self.cpus[2], VHOST_PACED, "--socket", self.socks[1], "--role", "pong",
                             "--mac", PONG_MAC, "--seconds", str(seconds + 30)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.wait_up("vale1:vm2")
            out = common.sh(["taskset", "-c", self.cpus[1], VHOST_PACED, "--socket", self.socks[0], "--role", "ping",
                             "--mac", PING_MAC, "--dst", PONG_MAC, "--len", str(size), "--seconds", str(seconds)],
                            timeout=seconds + 60)
        finally:
            common.stop(pong, common.signal.SIGTERM)
        if self.system == "vale":
            deadline = time.monotonic() + 10     # both ports down before the next run's front ends
            while any(p["state"] == "up" for n, p in self.v.ports().items() if n.startswith("vale1:")):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        return json.loads(out)

    def close(self):
        if self.system == "vale":
            common.stop(self.v.proc, common.signal.SIGTERM)
        else:
            self.mid.kill()


def like_for_like(a, sizes, names):
    """The like-for-like table: per layout and size, vale's ping-pong and the bridge's UDP
    request/response, and (unless --no-vm) the VM path through vale and through the vhost PMD."""
    import tempfile, shutil
    cpus_ok = sorted(os.sched_getaffinity(0))
    d = tempfile.mkdtemp(prefix="vb-lat-")
    common.on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    dpdk = None if a.no_vm else peers.dpdk_env()
    b = peers.LinuxBridge()
    b.addresses()
    rows = []
    for name in names:
        cpus = LIKE[name]
        if any(int(c) not in cpus_ok for c in cpus):
            print(f"like-for-like {name}: needs CPUs {', '.join(sorted(set(cpus)))}; skipped", flush=True)
            continue
        v = common.Valed({"name": name, "valed": cpus[0], "tx": cpus[1], "rx": cpus[2]})
        vm = {} if a.no_vm else {"vale_vhost_user": VmPath("vale", cpus, d, dpdk)}
        for s in sizes:
            vm_keys = ["vale_vhost_user", "vale_vhost_user_busy", "dpdk_vhost"]
            runs = {k: [] for k in ["vale", "linux_bridge_udp"] + ([] if a.no_vm else vm_keys)}
            for _ in range(a.runs):
                runs["vale"].append(vale_ping(v, s, a.seconds))
                runs["linux_bridge_udp"].append(bridge_udp(b, s, a.seconds, cpus[1], cpus[2]))
                if not a.no_vm:
                    runs["vale_vhost_user"].append(vm["vale_vhost_user"].ping(s, a.seconds))
                    # The polling middles (testpmd; valed with --busy-poll-us, like with like
                    # for it) are started for their runs only, so that they do not take the CPU
                    # from the other systems' runs.
                    for k, system, args in (("vale_vhost_user_busy", "vale", ("--busy-poll-us", str(a.busy_poll_us))),
                                            ("dpdk_vhost", "dpdk_vhost", ())):
                        peer = VmPath(system, cpus, d, dpdk, args)
                        try:
                            runs[k].append(peer.ping(s, a.seconds))
                        finally:
                            peer.close()
            r = {"layout": name, "cpus": {"middle": cpus[0], "ping": cpus[1], "pong": cpus[2]}, "frame_len": s}
            for k, x in runs.items():
                r[k] = rtt_summary(x)
                if k in vm_keys:
                    r[k]["lost"] = sum(y.get("lost", 0) for y in x)
            r["vale_over_bridge_udp"] = common.ratio(r["vale"]["median"], r["linux_bridge_udp"]["median"])
            if not a.no_vm:
                r["vale_over_vhost_pmd"] = common.ratio(r["vale_vhost_user"]["median"], r["dpdk_vhost"]["median"])
                r["vale_busy_over_vhost_pmd"] = common.ratio(r["vale_vhost_user_busy"]["median"],
                                                             r["dpdk_vhost"]["median"])
            rows.append(r)
            print(f"like-for-like {name} {s} B: " + ", ".join(f"{k} {fmt(r[k]['median'])}" for k in runs) + " us",
                  flush=True)
        common.stop(v.proc, common.signal.SIGTERM)
        for x in vm.values():
            x.close()
    b.close()
    return rows


def vale_ping(v, size, seconds, ping_args=(), pong_args=()):
    pong = common.spawn(v.pktgen("vale0:b", "pong", v.layout["rx"], "-T", seconds + 30, "--announce",
                                 "-S", common.mac_of(1), *pong_args), env=v.env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    try:
        v.wait_ports(["vale0:b"], announced=True)
        out = common.sh(v.pktgen("vale0:a", "ping", v.layout["tx"], "-l", size, "-T", seconds,
                                 "-D", common.mac_of(1), *ping_args), timeout=seconds + 30, env=v.env)
    finally:
        common.stop(pong)
    report = json.loads(out)
    rtt = report.get("rtt")
    if not rtt:
        raise RuntimeError(f"vale-pktgen ping measured nothing: {out}")
    # With --busy: the waits that slept because the CPU was crowded.
    return dict(rtt, crowded_waits=report.get("crowded_waits"))


def one_thread_ping(v, size, seconds):
    """busy_pingpong (both clients in one busy thread) on v's tx CPU; its RTT report."""
    out = common.sh(["taskset", "-c", v.layout["tx"], PINGPONG, str(seconds), str(size)],
                    timeout=seconds + 30, env=v.env)
    return json.loads(out)


def variant_cpus(name, fixed):
    """(valed, ping, pong) CPUs of a busy variant: `fixed` (--busy-cpus), else one each."""
    if fixed:
        return tuple(fixed)
    n = os.cpu_count() or 1
    if n >= 3:
        cpus = ("1", "2", "3") if n >= 4 else ("0", "1", "2")
        # The one thread of busy-1thread plays both clients on the ping CPU.
        return cpus if name != "busy-1thread" else (cpus[0], cpus[1], cpus[1])
    if n == 2:
        return TWO_CPU_LAYOUT[name]
    return ("0", "0", "0")


def oversubscribed(cpus, busy):
    """Whether two busy parties share a CPU: they can only take turns on it. (A sleeping party
    beside one spinner is fine: its wake-up preempts the spinner.)"""
    return any(busy[i] and busy[j] and set(cpus[i].split(",")) & set(cpus[j].split(","))
               for i in range(3) for j in range(i + 1, 3))


def line_floor(cpus, one_thread=False):
    """The round trip of a bare index ping -> valed -> pong -> valed -> ping on these CPUs
    (valed, ping, pong), in us: bare-copy --rtt ping<->valed plus valed<->pong; None where
    two of them share a CPU, but for `one_thread` (busy-1thread: ping and pong are one thread
    on one CPU, and the floor is twice its round trip with valed's)."""
    valed, ping, pong = cpus
    if len({valed, ping, pong}) != (2 if one_thread else 3) or valed in (ping, pong):
        return None
    total = 0.0
    for pair in ((ping, valed), (valed, pong)):
        out = common.sh([os.path.join(common.BIN, "bare-copy"), "--rtt", "--seconds", "0.5", "--warmup", "0.1",
                         "--cpus", ",".join(pair)])
        total += json.loads(out)["rtt_ns"] / 1000
    return total


def busy_variants(a, sizes, names, fixed_cpus):
    rows = []
    for name in names:
        valed_busy, ping_busy, pong_busy = VARIANTS[name]
        cpus = variant_cpus(name, fixed_cpus)
        extra = ["--busy-poll-us", str(a.busy_poll_us)] if valed_busy else []
        v = common.Valed({"name": name, "valed": cpus[0], "tx": cpus[1], "rx": cpus[2]}, extra=extra)
        ping_args = ["--busy"] if ping_busy else []
        pong_args = ["--busy"] if pong_busy else []
        if name == "busy-1thread":
            ping_args = pong_args = []
        floor = line_floor(cpus, one_thread=name == "busy-1thread")
        for s in sizes:
            if name == "busy-1thread":
                runs = [one_thread_ping(v, s, a.seconds) for _ in range(a.runs)]
            else:
                runs = [vale_ping(v, s, a.seconds, ping_args, pong_args) for _ in range(a.runs)]
            rows.append({"variant": name, "frame_len": s, "samples": sum(r["samples"] for r in runs),
                         "cpus": {"valed": cpus[0], "ping": cpus[1], "pong": cpus[2]},
                         "busy": {"valed": valed_busy, "ping": ping_busy, "pong": pong_busy},
                         "valed_args": extra, "ping_args": ping_args, "pong_args": pong_args,
                         "line_floor_us": floor,
                         "oversubscribed": name != "busy-1thread"
                                           and oversubscribed(cpus, (valed_busy, ping_busy, pong_busy)),
                         "ping_crowded_waits": (sum(r["crowded_waits"] for r in runs)
                                                if ping_busy and all(r.get("crowded_waits") is not None
                                                                     for r in runs) else None),
                         **{k: summary([r[f"{k}_us"] for r in runs]) for k in ("min", "median", "p99", "max")}})
            print(f"vale {name} {s} B: median RTT {fmt(rows[-1]['median'])} us", flush=True)
        common.stop(v.proc, common.signal.SIGTERM)
    return rows


def main():
    ap = common.parser(__doc__, "latency")
    ap.add_argument("--sizes", default="60,1514", help="frame sizes (default 60,1514; the paper also has 256..1024)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="busy variants to measure besides the sleeping ping-pong, comma-separated, "
                         f"of {', '.join(VARIANTS)}; 'none' for none (default all)")
    ap.add_argument("--busy-cpus", metavar="V,P,Q",
                    help="CPUs of valed, ping and pong in the busy variants (default: one each where "
                         "the machine has 3 or more; see above for 2); busy-1thread's one thread takes "
                         "ping's")
    ap.add_argument("--like", default=",".join(LIKE),
                    help="like-for-like layouts (vale beside two processes doing UDP request/response through "
                         f"the Linux bridge, and the VM path), of {', '.join(LIKE)}; 'none' for none (default both)")
    ap.add_argument("--no-vm", action="store_true",
                    help="no VM path in the like-for-like table (it needs DPDK's testpmd)")
    ap.add_argument("--busy-poll-us", type=int, default=1000,
                    help="valed --busy-poll-us in the variants where valed busy-polls, and in the VM path's "
                         "'vale polling' column (default 1000)")
    a = common.parse(ap)
    sizes = common.int_list(a.sizes)
    names = [] if a.variants == "none" else [n.strip() for n in a.variants.split(",") if n.strip()]
    if any(n not in VARIANTS for n in names):
        ap.error(f"--variants: unknown variant in {a.variants!r} (known: {', '.join(VARIANTS)})")
    fixed_cpus = [c.strip() for c in a.busy_cpus.split(",")] if a.busy_cpus else None
    if fixed_cpus is not None and (len(fixed_cpus) != 3 or not all(c.isdigit() for c in fixed_cpus)):
        ap.error("--busy-cpus takes three CPU numbers: valed,ping,pong")
    if "busy-1thread" in names:
        # Not built by `cargo build --release`; a no-op when it is up to date.
        common.sh(["cargo", "build", "--release", "--manifest-path", os.path.join(common.ROOT, "Cargo.toml"),
                   "-p", "libvale", "--example", "busy_pingpong"], timeout=600)
    if any(not 60 <= s <= 1514 for s in sizes):
        ap.error("sizes must be 60..1514")
    like = [] if a.like == "none" or a.no_peers else [n.strip() for n in a.like.split(",") if n.strip()]
    if any(n not in LIKE for n in like):
        ap.error(f"--like: unknown layout in {a.like!r} (known: {', '.join(LIKE)})")
    if not a.no_peers:
        common.need_root("bench/latency.py with the Linux bridge (use --no-peers for vale alone)")

    load_before = os.getloadavg()[0]
    v = common.Valed(a.layout)
    results = []
    for s in sizes:
        runs = [vale_ping(v, s, a.seconds) for _ in range(a.runs)]
        results.append({"switch": "vale", "frame_len": s, "samples": sum(r["samples"] for r in runs),
                        **{k: summary([r[f"{k}_us"] for r in runs]) for k in ("min", "median", "p99", "max")}})
        print(f"vale {s} B: median RTT {fmt(results[-1]['median'])} us", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    busy = busy_variants(a, sizes, names, fixed_cpus)
    layout = {"vale": v.cpu_layout(ping=v.layout["tx"], pong=v.layout["rx"])}
    for name in names:
        layout[f"vale {name}"] = dict(next(r["cpus"] for r in busy if r["variant"] == name), name=name)
    setup = {"vale": "vale-pktgen ping vale0:a -> valed -> vale-pktgen pong vale0:b (--announce, unicast), "
                     "both sleeping in poll"}
    if not a.no_peers:
        b = peers.LinuxBridge()
        b.addresses()
        for s in sizes:
            per_run = []
            for _ in range(a.runs):
                rtts = sorted(peers.kernel_ping(b, s, max(10, int(a.seconds * 1000)), timeout=a.seconds * 5 + 30))
                at = lambda q: rtts[round((len(rtts) - 1) * q)]
                per_run.append({"samples": len(rtts), "min_us": at(0), "median_us": at(0.5), "p99_us": at(0.99),
                                "max_us": at(1)})
            results.append({"switch": "linux_bridge", "frame_len": s, "samples": sum(r["samples"] for r in per_run),
                            **{k: summary([r[f"{k}_us"] for r in per_run]) for k in ("min", "median", "p99", "max")}})
            print(f"linux bridge {s} B: median RTT {fmt(results[-1]['median'])} us", flush=True)
        setup["linux_bridge"] = {**b.setup_note(), "client": "ping -i 0.001 (iputils), taskset -c 0",
                                 "server": "the kernel's ICMP echo reply (no process)",
                                 "resolution": "ping prints times in 1 us steps"}
        layout["linux_bridge"] = {"ping": "0", "switch": "kernel softirq", "pong": "kernel"}

    for r in results:
        if r["switch"] == "vale":
            peer = next((p for p in results if p["switch"] == "linux_bridge" and p["frame_len"] == r["frame_len"]), None)
            r["linux_bridge_over_vale"] = common.ratio(peer["median"], r["median"]) if peer else None
    print(f"\nround-trip time, us, {a.runs} runs of {a.seconds} s; vale layout {a.layout}: valed cpu "
          f"{v.layout['valed']}, ping cpu {v.layout['tx']}, pong cpu {v.layout['rx']}")
    common.table(["switch", "len", "min", "median", "p99", "samples", "bridge/vale (median)"],
                 [[r["switch"], r["frame_len"], fmt(r["min"]), fmt(r["median"]), fmt(r["p99"]), r["samples"],
                   common.fmt_ratio(r.get("linux_bridge_over_vale")) if r["switch"] == "vale" else ""]
                  for r in results])
    for r in busy:
        sleeping = next((x for x in results if x["switch"] == "vale" and x["frame_len"] == r["frame_len"]), None)
        r["over_sleeping"] = common.ratio(r["median"], sleeping["median"]) if sleeping else None
    if busy:
        def who(r, party):
            return f"{r['cpus'][party]}{'*' if r['busy'][party] else ''}"
        print(f"\nround-trip time with busy parties, us, {a.runs} runs of {a.seconds} s; CPU of each party, "
              f"* = busy (valed --busy-poll-us {a.busy_poll_us}, vale-pktgen --busy)")
        common.table(["variant", "valed", "ping", "pong", "len", "min", "median", "p99", "max", "samples", "/sleep",
                      "floor", "/floor", "crowded", ""],
                     [[r["variant"], who(r, "valed"), who(r, "ping"), who(r, "pong"), r["frame_len"], fmt(r["min"]),
                       fmt(r["median"]), fmt(r["p99"]), fmt(r["max"]), r["samples"],
                       common.fmt_ratio(r["over_sleeping"]),
                       "-" if r["line_floor_us"] is None else f"{r['line_floor_us']:.2f}",
                       common.fmt_ratio(common.ratio(r["median"], {"median": r["line_floor_us"]})
                                        if r["line_floor_us"] else None),
                       "-" if r["ping_crowded_waits"] is None else r["ping_crowded_waits"],
                       "oversubscribed" if r["oversubscribed"] else ""] for r in busy])
        setup["vale_busy"] = (f"as vale, with valed --busy-poll-us {a.busy_poll_us} where valed is busy and "
                              "vale-pktgen --busy where a client is (spins on the CSB, asks for no interrupt); "
                              "each party pinned (taskset) as cpus says")
    like_rows = like_for_like(a, sizes, like) if like else []
    if like_rows:
        print(f"\nlike with like: round-trip time, us, median over {a.runs} runs of {a.seconds} s (min-max of the "
              f"runs' medians); vale and the Linux bridge: two sleeping processes; VM path: two sleeping vhost-user "
              f"front ends; {common.machine()}")
        heads = ["layout", "middle", "ping", "pong", "len", "vale", "bridge UDP", "vale/bridge"]
        if not a.no_vm:
            heads += ["vale vhost-user", "vale polling", "vhost PMD", "vale/PMD", "polling/PMD"]
        rows = []
        for r in like_rows:
            row = [r["layout"], r["cpus"]["middle"], r["cpus"]["ping"], r["cpus"]["pong"], r["frame_len"],
                   fmt(r["vale"]["median"]), fmt(r["linux_bridge_udp"]["median"]),
                   common.fmt_ratio(r["vale_over_bridge_udp"])]
            if not a.no_vm:
                row += [fmt(r["vale_vhost_user"]["median"]), fmt(r["vale_vhost_user_busy"]["median"]),
                        fmt(r["dpdk_vhost"]["median"]), common.fmt_ratio(r["vale_over_vhost_pmd"]),
                        common.fmt_ratio(r["vale_busy_over_vhost_pmd"])]
            rows.append(row)
        common.table(heads, rows)
        setup["like_for_like"] = {
            "vale": "vale-pktgen ping / pong (sleeping), valed on the middle CPU",
            "linux_bridge_udp": "udp-pingpong ping / pong in the sender's and receiver's namespaces of the Linux "
                                "bridge (br_netfilter off, static fdb), frames of the same size on the wire",
            "vale_vhost_user": "vhost-paced --role ping / pong (sleeping in poll on the rx call eventfd), "
                               "valed's vale1:vm1 and vale1:vm2 listening",
            "vale_vhost_user_busy": f"the same with valed --busy-poll-us {a.busy_poll_us}: its vhost-user "
                                    "threads (one per queue pair, one pair a port here) poll, as the vhost PMD does",
            "dpdk_vhost": "the same front ends, testpmd --forward-mode=io between net_vhost0 and net_vhost1 "
                          "(busy-polling, both lcores on the middle CPU)"}
        if not a.no_vm:
            setup["like_for_like"]["dpdk"] = peers.testpmd_version()
    # Anything else running shows here: each busy party wants a CPU to itself.
    setup["loadavg_before_after"] = [load_before, os.getloadavg()[0]]
    print(f"1-minute load average before and after: {load_before:.2f}, {os.getloadavg()[0]:.2f}")
    common.write_report(a.out, "latency", a, layout, results, setup=setup, unit="microseconds",
                        ratio="median RTT through the Linux bridge (kernel ping) / median RTT through vale",
                        busy=busy, like_for_like=like_rows)


if __name__ == "__main__":
    common.main_guard(main)

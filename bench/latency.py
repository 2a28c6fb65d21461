#!/usr/bin/env python3
"""Round-trip latency (VALE paper, figure 12): ping-pong between two processes through vale.

vale: `vale-pktgen -f pong --announce` on vale0:b echoes every frame; `vale-pktgen -f ping` on
vale0:a sends one frame to b's MAC, waits for its echo, and sends the next, for --seconds. Both
sleep in poll between frames (no busy-polling), as in the paper's experiment. Each run reports
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
the waits of ping (summed over runs) that slept because its CPU was crowded. The sleeping
rows of the main table are untouched by all this.

    cargo build --release && bench/latency.py [--runs 5] [--seconds 2] [--sizes 60,1514]
    bench/latency.py --no-peers --variants busy,busy-ping --busy-cpus 2,4,6 --sizes 60
"""
import json, os, subprocess

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
        for s in sizes:
            if name == "busy-1thread":
                runs = [one_thread_ping(v, s, a.seconds) for _ in range(a.runs)]
            else:
                runs = [vale_ping(v, s, a.seconds, ping_args, pong_args) for _ in range(a.runs)]
            rows.append({"variant": name, "frame_len": s, "samples": sum(r["samples"] for r in runs),
                         "cpus": {"valed": cpus[0], "ping": cpus[1], "pong": cpus[2]},
                         "busy": {"valed": valed_busy, "ping": ping_busy, "pong": pong_busy},
                         "valed_args": extra, "ping_args": ping_args, "pong_args": pong_args,
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
    ap.add_argument("--busy-poll-us", type=int, default=1000,
                    help="valed --busy-poll-us in the variants where valed busy-polls (default 1000)")
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
                      "crowded", ""],
                     [[r["variant"], who(r, "valed"), who(r, "ping"), who(r, "pong"), r["frame_len"], fmt(r["min"]),
                       fmt(r["median"]), fmt(r["p99"]), fmt(r["max"]), r["samples"],
                       common.fmt_ratio(r["over_sleeping"]),
                       "-" if r["ping_crowded_waits"] is None else r["ping_crowded_waits"],
                       "oversubscribed" if r["oversubscribed"] else ""] for r in busy])
        setup["vale_busy"] = (f"as vale, with valed --busy-poll-us {a.busy_poll_us} where valed is busy and "
                              "vale-pktgen --busy where a client is (spins on the CSB, asks for no interrupt); "
                              "each party pinned (taskset) as cpus says")
    # Anything else running shows here: each busy party wants a CPU to itself.
    setup["loadavg_before_after"] = [load_before, os.getloadavg()[0]]
    print(f"1-minute load average before and after: {load_before:.2f}, {os.getloadavg()[0]:.2f}")
    common.write_report(a.out, "latency", a, layout, results, setup=setup, unit="microseconds",
                        ratio="median RTT through the Linux bridge (kernel ping) / median RTT through vale",
                        busy=busy)


if __name__ == "__main__":
    common.main_guard(main)

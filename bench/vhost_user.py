#!/usr/bin/env python3
"""vhost-user: DPDK virtio_user front ends through vale, and through DPDK's own vhost back end.

For each frame size and run, three parties, each the same in both systems but the middle:

    vale: testpmd txonly [virtio_user] -> vale1:vm1 =valed= vale1:vm2 -> [virtio_user] testpmd rxonly
    peer: testpmd txonly [virtio_user] -> [net_vhost0] testpmd io [net_vhost1] -> [virtio_user] testpmd rxonly

valed's two vhost-user ports are on one switch (vale1, nothing else on it) and listen at their
sockets, as DPDK's vhost PMD does; the virtio_user front ends connect (queues=1,
queue_size=1024). The middle testpmd forwards port 0 to port 1 (io mode). The sender sends
--txpkts=LEN frames to the receiver's MAC (an rx-only receiver never sends, so vale floods
them: to vm2, the only other port). rx pps is the receiver's RX-packets over --seconds after a
warm-up, read with `show port stats 0` (interactive testpmd); tx pps the sender's TX-packets
over the same time (what its driver queued); middle cores: CPU seconds per second of valed or
of the middle testpmd. Each figure is the median of --runs, with min and max; vale and peer
runs alternate; the ratio is vale's median rx pps over the peer's.

CPU layouts: three parties busy-poll (the peer) or nearly (vale under load) and a 2-vCPU machine
has two CPUs: alone (--cost's default) pins the middle on the last CPU and both testpmd on the
first; split (default) pins the sender's lcores on cpu0 and the receiver's on cpu1, the
middle (valed, or the middle testpmd's lcores) runs on both; shared pins nothing; pinned
(--cpus A,B,C, e.g. on a 16-core machine) gives each party a CPU of its own: sender A,
middle B, receiver C (both lcores of a testpmd on its CPU; valed's threads all on B).

Fixed offered loads (--loads 0.5,1,2,4, in Mpps): testpmd 22.11's txonly has no rate limit,
so the sender is then vhost-paced (crates/vale-tests/src/bin/vhost-paced.rs), a vhost-user
front end of vale's own that posts frames at the rate for --seconds, in bursts every 20 us,
and mostly sleeps (on two vCPUs the three busy-polling parties of the saturation runs starve
each other). Same sender, same testpmd rxonly receiver, vale or the vhost PMD in the middle;
per load: frames posted (offered), frames the receiver counted (delivered), loss = 1 -
delivered / offered, and the frames the sender could not post because the middle had not
returned its descriptors yet (backlog: the middle did not keep up).

Cost per frame (--cost): the same sender (vhost-paced --sync), receiver and middles at fixed
loads (default 0.5,1,1.5,2,3,4 Mpps; each system up to the first load at which its median loss
exceeds --loss-limit), and per load the CPU cycles the middle spent per delivered frame:
valed's, from the run time of all its threads (/proc/PID/task/*/schedstat) over the sending,
times the TSC rate (common.tsc_rate); the vhost PMD's, from testpmd's --record-core-cycles
(TSC cycles of its forwarding loop in bursts that received something: 22.11 does not count
empty polls) and from its threads' run time (busy polling included). Beside them the sender's
bound (vhost-paced into a vhost PMD port that frees every frame) and the receiver's (a vhost
PMD port sending as fast as it can into the receiver), on the same CPUs. The sender negotiates
event indices (as Linux's virtio-net does) and takes no transmit interrupts; --moderation US
sets the sending port's moderation knob, which with event indices spaces the sender's kicks
about US apart (docs/virtual-machines.md). Default layout
alone: the middle alone on the last CPU, sender and receiver on the first; --rt makes the
middle SCHED_FIFO. --receiver sink (--loads, --cost) receives with vhost-paced --role sink
instead of testpmd rxonly: a front end that sleeps on its interrupt and takes its buffers as
Linux's NAPI does (--sink-bufs of them), so that on two CPUs it leaves the sender the CPU they
share, where a busy-polling receiver takes most of it; the sender then stamps each frame with
the time it posts it and the sink counts each frame's delay (vhost-paced --stamp): median and
99th percentile per system and load, in the tables and the JSON (delay_us_*), the price of
--moderation beside what it saves. JSON: bench/results/vhost_user_cost.json.
See bench/README.md.

    cargo build --release && bench/vhost_user.py [--runs 5] [--seconds 2] [--sizes 60,1514]
                                                 [--layout split|shared|pinned|alone --cpus 2,4,6]
                                                 [--loads 0.5,1,2,4] [--cost [--rt] [--loss-limit F]]
                                                 [--moderation US] [--rx-moderation US]

Needs root (testpmd's runtime directories, apt-get for dpdk-dev).
"""
import os, re, shutil, sys, tempfile, time

import common, peers
from common import summary, ratio, mpps, fmt_ratio, on_exit

SIZES = "60,1514"
TX_MAC, RX_MAC = "02:00:00:00:0e:01", "02:00:00:00:0e:02"
LAYOUTS = ("alone", "pinned", "shared", "split")
COST_LOADS = "0.5,1,1.5,2,3,4"
LOSS_LIMIT = 0.001    # --cost: a load is delivered "without loss" below this fraction lost (--loss-limit)
RECEIVERS = {"testpmd": "testpmd rxonly, net_virtio_user0 queues=1 queue_size=1024",
             "sink": "vhost-paced --role sink --event-idx --stamp: queue_size 1024, sleeps in poll on "
                     "its call eventfd, takes and gives back buffers with interrupts off until dry (NAPI), "
                     "counts each stamped frame's delay"}
CYCLES_RE = (r"CPU cycles/packet=([0-9.]+) \(total cycles=(\d+) / total (\w+) packets=(\d+)\) "
             r"at (\d+) MHz Clock")


def cpu_sets(a):
    """{tx, middle, rx}: the CPU set (EAL/taskset syntax) of each party."""
    allowed = sorted(os.sched_getaffinity(0))
    every = ",".join(str(c) for c in allowed)
    if a.layout == "pinned":
        cpus = common.int_list(a.cpus or "")
        if len(cpus) < 3 or len(set(cpus)) != len(cpus) or any(c not in allowed for c in cpus):
            raise SystemExit(f"--layout pinned needs --cpus with 3 distinct CPUs of {every} (sender, middle, receiver)")
        return {"tx": str(cpus[0]), "middle": str(cpus[1]), "rx": str(cpus[2])}
    if a.layout == "shared":
        return {"tx": every, "middle": every, "rx": every}
    if a.layout == "alone":
        if len(allowed) < 2:
            raise SystemExit("--layout alone needs two CPUs")
        return {"tx": str(allowed[0]), "middle": str(allowed[-1]), "rx": str(allowed[0])}
    if len(allowed) < 2:
        raise SystemExit("--layout split needs two CPUs")
    return {"tx": str(allowed[0]), "middle": f"{allowed[0]},{allowed[1]}", "rx": str(allowed[1])}


class Side:
    """The sender and receiver testpmd of one run, on sockets s0 (sender) and s1 (receiver)."""

    def __init__(self, s0, s1, size, cpus, dpdk, limit=30.0):
        """`limit`: seconds each testpmd may take to connect and start (longer for a middle
        under valgrind)."""
        self.rx = receiver(s1, cpus, dpdk, limit=limit)
        vu = "net_virtio_user0,path={},queues=1,queue_size=1024,mac={}"
        self.tx = peers.Testpmd("tx", [vu.format(s0, TX_MAC)], "txonly", cpus["tx"],
                                [f"--txpkts={size}", f"--eth-peer=0,{RX_MAC}"], dpdk=dpdk)
        self.tx.wait_forwarding(limit)

    def measure(self, seconds, warmup, middle_pid):
        """Waits for traffic at the receiver, then the warm-up, then counts over `seconds`."""
        deadline = time.monotonic() + 30
        while self.rx.stats()["rx"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing reached the receiver in 30 s:\ntx: {self.tx.tail()}\nrx: {self.rx.tail()}")
            time.sleep(0.05)
        time.sleep(warmup)
        r0, t0, c0 = self.rx.stats(), self.tx.stats(), common.cpu_seconds(middle_pid)
        time.sleep(seconds)
        r1, t1, c1 = self.rx.stats(), self.tx.stats(), common.cpu_seconds(middle_pid)
        return {"rx_pps": (r1["rx"] - r0["rx"]) / (r1["t"] - r0["t"]),
                "tx_pps": (t1["tx"] - t0["tx"]) / (t1["t"] - t0["t"]),
                "middle_cores": (c1 - c0) / (r1["t"] - r0["t"])}

    def close(self):
        self.tx.kill()
        self.rx.kill()


def vale_run(v, socks, size, a, cpus, dpdk):
    side = Side(*socks, size, cpus, dpdk)
    try:
        ports = v.wait_state("up")
        before = ports["vale1:vm2"]["counters"]
        r = side.measure(a.seconds, a.warmup, v.pid)
        after = v.ports()["vale1:vm2"]["counters"]
        r["vm2_rx_drops"] = after["rx_drops"] - before["rx_drops"]
    finally:
        side.close()
    v.wait_state("down")
    return r


def sender_prefix(a, cpus):
    """How --cost starts vhost-paced: on the sender's CPUs (not real-time: a SCHED_FIFO sender
    woken every 20 us starved the DPDK back end's vhost-events thread beside it here)."""
    return ["taskset", "-c", cpus["tx"]] if getattr(a, "cost", False) else []


def rt_middle(a, t):
    """With --rt, testpmd `t`'s forwarding lcore made SCHED_FIFO 1 (the middle's treatment)."""
    if a.rt:
        t.realtime(1)
    return t


def main_cpus(a, cpus):
    """Where a middle testpmd's main lcore goes: beside the sender with --rt (its forwarding
    lcore then owns the middle's CPU), else with its forwarding lcore."""
    return cpus["tx"] if a.rt else None


def stamping(a):
    """vhost-paced's --stamp where the receiver is the sink (which counts the delays)."""
    return ["--stamp"] if getattr(a, "receiver", "testpmd") == "sink" else []


def delay_fields(after):
    """The delay fields of a run from the receiver's count after it (the sink's delays of
    the frames it took since the count before; None with testpmd)."""
    d = after.get("delay") or {}
    return {"delay_us_median": d.get("median"), "delay_us_p99": d.get("p99"), "delay_us_max": d.get("max")}


def paced(sock, size, mpps_load, a, rx, cpus=None, event_idx=False):
    """vhost-paced into `sock` at the load, counted at testpmd `rx`: {offered, delivered, loss,
    backlog} (frames per second over the sender's seconds, loss a fraction), and the frames'
    delays where the receiver counts them."""
    before = rx.stats()["rx"]
    out = common.subprocess.run(
        [*(sender_prefix(a, cpus) if cpus else []), f"{common.BIN}/vhost-paced", "--socket", sock, "--rate", str(mpps_load * 1e6),
         "--seconds", str(a.seconds), "--len", str(size), "--dst", RX_MAC, *(["--event-idx"] if event_idx else []),
         *stamping(a)],
        capture_output=True, text=True, timeout=a.seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(f"vhost-paced: {out.stderr.strip()}")
    r = common.json.loads(out.stdout.strip().splitlines()[-1])
    time.sleep(0.3)
    after = rx.stats()
    got = after["rx"] - before
    return {"offered_pps": r["posted"] / r["seconds"], "delivered_pps": got / r["seconds"],
            "loss": 1 - got / max(r["posted"], 1), "backlog_pps": r["backlog"] / r["seconds"],
            **delay_fields(after)}


class Talking:
    """A vhost-paced of the bench's that talks by lines: it prints a JSON line when set up and
    one for each line it is given on its standard input, and ends when that input closes."""

    def __init__(self, args, what):
        self.what = what
        self.proc = common.spawn(args, stdin=common.subprocess.PIPE, stdout=common.subprocess.PIPE,
                                 stderr=common.subprocess.PIPE, text=True)

    def line(self, limit):
        """Its next line, parsed, within `limit` s; else it is killed and the error quotes its
        standard error."""
        import select
        r, _, _ = select.select([self.proc.stdout], [], [], limit)
        line = self.proc.stdout.readline() if r else ""
        if not line:
            common.stop(self.proc, common.signal.SIGKILL, 2)
            raise RuntimeError(f"{self.what}: no answer in {limit:g} s: {self.proc.stderr.read()[-1500:]}")
        return common.json.loads(line)

    def ask(self, text, limit):
        """Gives it `text` (a line) and returns its answer."""
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.line(limit)

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        common.stop(self.proc, common.signal.SIGTERM, 5)


class Sink(Talking):
    """vhost-paced --role sink --stamp at `sock` on the receiver's CPUs (--receiver sink): a
    receiver that sleeps on its interrupt and takes its buffers as a guest's driver does
    (NAPI), where testpmd rxonly busy-polls, and counts the delay of each frame the sender
    stamped; stats() and kill() as a Testpmd's."""

    def __init__(self, sock, cpus, bufs=1024, limit=30.0):
        super().__init__(["taskset", "-c", cpus["rx"], f"{common.BIN}/vhost-paced", "--socket", sock, "--role",
                          "sink", "--mac", RX_MAC, "--event-idx", "--bufs", str(bufs), "--stamp"],
                         "vhost-paced --role sink")
        self.line(limit)

    def stats(self, limit=10.0):
        """{rx, tx, t, delay}: the frames taken so far (tx 0), when they were read, and the
        delays (µs: samples, median, p99, max) of the frames taken since the last stats()."""
        t0 = time.monotonic()
        r = self.ask("", limit)
        return {"rx": r["rx"], "tx": 0, "t": (t0 + time.monotonic()) / 2, "delay": r.get("delay_us")}

    def kill(self):
        self.close()


def receiver_setup(a):
    """What the reports say of the receiver."""
    if a.receiver == "sink":
        return f"{RECEIVERS['sink']}; {a.sink_bufs} buffers posted"
    return RECEIVERS["testpmd"]


def receiver(sock, cpus, dpdk, a=None, limit=30.0):
    """The receiver at `sock`, taking frames (within `limit` s): testpmd rxonly on virtio_user,
    or with `a.receiver` "sink" vhost-paced's sink."""
    if getattr(a, "receiver", "testpmd") == "sink":
        return Sink(sock, cpus, a.sink_bufs, limit)
    rx = peers.Testpmd("rx", [f"net_virtio_user0,path={sock},queues=1,queue_size=1024,mac={RX_MAC}"],
                       "rxonly", cpus["rx"], dpdk=dpdk)
    rx.wait_forwarding(limit)
    return rx


def vale_load_run(v, socks, size, load, a, cpus, dpdk):
    rx = receiver(socks[1], cpus, dpdk, a)
    try:
        v.wait_state("up", ports=("vale1:vm2",))
        return paced(socks[0], size, load, a, rx)
    finally:
        rx.kill()


def vhost_pmd(d, cpus, dpdk, args=(), main=None):
    """The peer's middle: testpmd's vhost PMD forwarding (io) between two sockets it listens at
    in `d` (more testpmd `args`); (testpmd, sender's socket, receiver's socket)."""
    s0, s1 = f"{d}/vhost0.sock", f"{d}/vhost1.sock"
    for s in (s0, s1):
        if os.path.exists(s):
            os.unlink(s)
    mid = peers.Testpmd("vh", [f"net_vhost0,iface={s0},queues=1", f"net_vhost1,iface={s1},queues=1"], "io",
                        cpus["middle"], list(args), dpdk=dpdk, main_cpus=main)
    return mid, s0, s1


def peer_load_run(d, size, load, a, cpus, dpdk):
    mid, s0, s1 = vhost_pmd(d, cpus, dpdk)
    try:
        mid.wait_forwarding()
        rx = receiver(s1, cpus, dpdk, a)
        try:
            return paced(s0, size, load, a, rx)
        finally:
            rx.kill()
    finally:
        mid.kill()


def loads_main(a, v, socks, d, sizes, cpus, dpdk, systems):
    """The fixed-load runs: a table per size of offered, delivered and loss for each system."""
    results = []
    for s in sizes:
        for load in common.float_list(a.loads):
            runs = {k: [] for k in systems}
            for i in range(a.runs):
                runs["vale"].append(vale_load_run(v, socks, s, load, a, cpus, dpdk))
                if "dpdk_vhost" in systems:
                    runs["dpdk_vhost"].append(peer_load_run(d, s, load, a, cpus, dpdk))
                print(f"{s} B at {load} Mpps run {i + 1}: " + ", ".join(
                    f"{k} {runs[k][-1]['delivered_pps'] / 1e6:.3f} Mpps ({runs[k][-1]['loss'] * 100:.2f}% lost)"
                    for k in systems), flush=True)
            r = {"frame_len": s, "load_mpps": load}
            for k in systems:
                r[k] = {f: summary([x[f] for x in runs[k]]) for f in runs[k][0]}
            results.append(r)
    rows = []
    for r in results:
        row = [r["frame_len"], r["load_mpps"]]
        for k in systems:
            x = r[k]
            row += [mpps(x["offered_pps"]), mpps(x["delivered_pps"]), f"{x['loss']['median'] * 100:.2f}%"]
            row += [fmt_delay(x)] if stamping(a) else []
        rows.append(row)
    print(f"\nvhost-paced -> middle -> {receiver_setup(a)}, {a.runs} runs of {a.seconds} s per load; "
          f"layout {a.layout}: sender cpu {cpus['tx']}, middle cpu {cpus['middle']}, receiver cpu {cpus['rx']}"
          + (f"; the sending port's moderation {a.moderation} us, the receiving port's {a.rx_moderation}; "
             "delay: sender's post to the sink's "
             "pass, median/p99 us" if stamping(a) else ""))
    headers = ["len", "load Mpps"]
    for k in systems:
        name = "vale" if k == "vale" else "vhost PMD"
        headers += [f"{name} offered", f"{name} delivered", f"{name} loss"]
        headers += [f"{name} delay"] if stamping(a) else []
    common.table(headers, rows)
    return results



# ---------------------------------------------------------------- --cost: cycles per frame

class SyncPaced(Talking):
    """vhost-paced --sync into `sock` at the load: connected and set up first (ready()), then
    sending when told (go()), then connected until closed, so that the middle's threads all
    live between the reads around the sending."""

    def __init__(self, sock, size, mpps_load, a, cpus):
        self.seconds = a.seconds
        super().__init__([*sender_prefix(a, cpus), f"{common.BIN}/vhost-paced", "--socket", sock,
                          "--rate", str(mpps_load * 1e6), "--seconds", str(a.seconds), "--len", str(size),
                          "--dst", RX_MAC, "--sync", "--event-idx", *stamping(a)], "vhost-paced --sync")

    def ready(self, limit=30.0):
        self.line(limit)

    def go(self):
        return self.ask("go", self.seconds + 30)


def cost_window(paced, rx, middle_pid, before=None, after=None):
    """Sends the load and reads, around it: the receiver's count, the middle's threads; returns
    (vhost-paced's report, with the receiver's count after the sending under "receiver" (the
    sink's delays), frames delivered, thread_delta of the middle, what `after` returned).
    `before`/`after`: what to do right before the sending starts and right after it ends
    (testpmd's fwd stats)."""
    r0 = rx.stats()["rx"]
    if before:
        before()
    c0 = common.thread_times(middle_pid)
    rep = paced.go()
    c1 = common.thread_times(middle_pid)
    extra = after() if after else None
    time.sleep(0.3)          # the last frames the middle forwarded reach the receiver's count
    r1 = rx.stats()
    rep["receiver"] = r1
    return rep, r1["rx"] - r0, common.thread_delta(c0, c1), extra


def cost_figures(rep, got, threads, hz):
    """The fields every system's cost run has: offered, delivered, loss, backlog, the frames'
    delays (with the sink), middle's CPU cycles per delivered frame, its threads' share
    (cycles per frame by thread name)."""
    secs = rep["seconds"]
    per = lambda ns: ns * hz / 1e9 / got if got else None
    return {"offered_pps": rep["posted"] / secs, "delivered_pps": got / secs,
            "loss": 1 - got / max(rep["posted"], 1), "backlog_pps": rep["backlog"] / secs,
            **delay_fields(rep["receiver"]),
            "cpu_cycles_per_frame": per(threads["total_ns"]),
            "cores": threads["total_ns"] / 1e9 / secs,
            "threads": {n: {"cycles_per_frame": per(x["run_ns"]), "threads": x["threads"],
                            "waited_runnable_ms": x["delay_ns"] / 1e6, "preempted": x["nonvoluntary"]}
                        for n, x in threads["by_name"].items() if x["run_ns"] > 0},
            "threads_ended": threads["ended"]}


def cost_vale_run(v, socks, size, load, a, cpus, dpdk, hz):
    rx = receiver(socks[1], cpus, dpdk, a)
    try:
        v.wait_state("up", ports=("vale1:vm2",))
        paced = SyncPaced(socks[0], size, load, a, cpus)
        try:
            paced.ready()
            v.wait_state("up")
            rep, got, threads, _ = cost_window(paced, rx, v.pid)
        finally:
            paced.close()
    finally:
        rx.kill()
    return cost_figures(rep, got, threads, hz)


def fwd_cycles(mid):
    """testpmd's `show fwd stats all` (with --record-core-cycles): {cycles, packets, mhz}: the
    TSC cycles its forwarding lcore spent in bursts that received something since the last
    `clear fwd stats all`, and the packets it received; None when it received nothing."""
    with mid.lock:
        start = len(mid.out)
    mid.command("show fwd stats all")
    end = mid.wait_for("Accumulated forward statistics", start)
    end = mid.wait_for("+++++\n", end)
    try:
        end = mid.wait_for("MHz Clock", end, limit=2.0)
    except RuntimeError:
        return None
    m = re.search(CYCLES_RE, mid.text(start)[:end - start])
    if not m:
        raise RuntimeError(f"testpmd {mid.name}: no cycles line:\n{mid.text(start)[-2000:]}")
    return {"cycles": int(m.group(2)), "packets": int(m.group(4)), "mhz": int(m.group(5)),
            "printed_cycles_per_packet": float(m.group(1))}


def cost_peer_run(d, size, load, a, cpus, dpdk, hz):
    mid, s0, s1 = vhost_pmd(d, cpus, dpdk, ["--record-core-cycles"], main_cpus(a, cpus))
    try:
        mid.wait_forwarding()
        rt_middle(a, mid)
        rx = receiver(s1, cpus, dpdk, a)
        try:
            paced = SyncPaced(s0, size, load, a, cpus)
            try:
                paced.ready()

                def clear():
                    with mid.lock:
                        start = len(mid.out)
                    mid.command("clear fwd stats all")
                    mid.wait_for("testpmd> ", start)
                rep, got, threads, fwd = cost_window(paced, rx, mid.proc.pid, clear, lambda: fwd_cycles(mid))
            finally:
                paced.close()
        finally:
            rx.kill()
    finally:
        mid.kill()
    r = cost_figures(rep, got, threads, hz)
    # testpmd's own count: cycles of non-empty bursts over the packets its ports received.
    r["testpmd_cycles_per_frame"] = fwd["cycles"] / fwd["packets"] if fwd and fwd["packets"] else None
    r["testpmd_cycles_per_delivered_frame"] = fwd["cycles"] / got if fwd and got else None
    r["testpmd_mhz"] = fwd["mhz"] if fwd else None
    return r


def sender_bound_run(d, size, load, a, cpus, dpdk):
    """The sender with the cheapest middle: vhost-paced at the load into a testpmd (on the
    middle's CPUs) whose port 0 receives and frees every frame (rxonly), the receiver connected
    to its port 1 and polling as in the measured runs (it gets nothing); {offered, delivered,
    loss, backlog}, delivered counted at port 0."""
    s0, s1 = f"{d}/bound0.sock", f"{d}/bound1.sock"
    for x in (s0, s1):
        if os.path.exists(x):
            os.unlink(x)
    sink = peers.Testpmd("vs", [f"net_vhost0,iface={s0},queues=1", f"net_vhost1,iface={s1},queues=1"], "rxonly",
                         cpus["middle"], dpdk=dpdk, main_cpus=main_cpus(a, cpus))
    try:
        sink.wait_forwarding()
        rt_middle(a, sink)
        rx = receiver(s1, cpus, dpdk, a)
        try:
            return paced(s0, size, load, a, sink, cpus, event_idx=a.cost)
        finally:
            rx.kill()
    finally:
        sink.kill()


def receiver_bound_run(d, size, a, cpus, dpdk):
    """The receiver alone: a testpmd whose vhost PMD port (on the middle's CPUs) sends
    --txpkts=size frames as fast as it can (txonly) to the receiver (virtio_user rxonly);
    {rx_pps}: what the receiver counts."""
    s1 = f"{d}/bound1.sock"
    if os.path.exists(s1):
        os.unlink(s1)
    src = peers.Testpmd("vt", [f"net_vhost0,iface={s1},queues=1"], "txonly", cpus["middle"],
                        [f"--txpkts={size}", f"--eth-peer=0,{RX_MAC}"], dpdk=dpdk, main_cpus=main_cpus(a, cpus))
    try:
        src.wait_forwarding()
        rt_middle(a, src)
        rx = receiver(s1, cpus, dpdk, a)
        try:
            deadline = time.monotonic() + 30
            while rx.stats()["rx"] == 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"receiver bound: nothing received in 30 s:\n{src.tail()}")
                time.sleep(0.05)
            time.sleep(a.warmup)
            r0 = rx.stats()
            time.sleep(a.seconds)
            r1 = rx.stats()
        finally:
            rx.kill()
    finally:
        src.kill()
    return {"rx_pps": (r1["rx"] - r0["rx"]) / (r1["t"] - r0["t"])}


def med(s, k):
    return s[k]["median"] if s and s.get(k) else None


def fmt_cycles(x):
    return "-" if x is None else f"{x:,.0f}"


def fmt_delay(x):
    """A system's delays as median/p99 µs (medians of the runs), or -."""
    m, p = med(x, "delay_us_median"), med(x, "delay_us_p99")
    return "-" if m is None or p is None else f"{m:.1f}/{p:.1f}"


def cost_main(a, v, socks, d, sizes, cpus, dpdk, systems):
    """--cost: per size and load, the middle's cycles per delivered frame of each system, the
    sender's bound at the load, the receiver's bound at the size; a system stops at the first
    load it loses frames at (median loss above --loss-limit)."""
    hz = common.tsc_rate()["hz"]
    loads = common.float_list(a.loads or COST_LOADS)
    results, bounds = [], []
    for s in sizes:
        rb = summary([receiver_bound_run(d, s, a, cpus, dpdk)["rx_pps"] for _ in range(a.runs)])
        bounds.append({"frame_len": s, "receiver_rx_pps": rb})
        print(f"{s} B: receiver bound {mpps(rb)} Mpps", flush=True)
        going = set(systems)
        for load in loads:
            if not going:
                break
            runs = {k: [] for k in systems + ["sender_bound"] if k in going or k == "sender_bound"}
            for i in range(a.runs):
                if "vale" in going:
                    runs["vale"].append(cost_vale_run(v, socks, s, load, a, cpus, dpdk, hz))
                if "dpdk_vhost" in going:
                    runs["dpdk_vhost"].append(cost_peer_run(d, s, load, a, cpus, dpdk, hz))
                runs["sender_bound"].append(sender_bound_run(d, s, load, a, cpus, dpdk))
                print(f"{s} B at {load} Mpps run {i + 1}: " + ", ".join(
                    f"{k} {x[-1]['delivered_pps'] / 1e6:.3f} Mpps ({x[-1]['loss'] * 100:.2f}% lost)"
                    + (f", {fmt_cycles(x[-1].get('cpu_cycles_per_frame'))} cycles/frame" if k != "sender_bound" else "")
                    + (f" (testpmd's {fmt_cycles(x[-1]['testpmd_cycles_per_frame'])})" if k == "dpdk_vhost" else "")
                    for k, x in runs.items()), flush=True)
            r = {"frame_len": s, "load_mpps": load}
            for k, x in runs.items():
                r[k] = {f: summary([y[f] for y in x]) for f in x[0] if f not in ("threads", "threads_ended")}
                if k != "sender_bound":
                    r[k]["threads"] = [y["threads"] for y in x]
                    r[k]["threads_ended"] = sum(y["threads_ended"] for y in x)
            vc, pc = med(r.get("vale"), "cpu_cycles_per_frame"), med(r.get("dpdk_vhost"), "testpmd_cycles_per_frame")
            pw = med(r.get("dpdk_vhost"), "cpu_cycles_per_frame")
            r["ratio_to_testpmd_cycles"] = vc / pc if vc and pc else None
            r["ratio_to_testpmd_cpu"] = vc / pw if vc and pw else None
            results.append(r)
            for k in list(going):
                if r[k]["loss"]["median"] > a.loss_limit:
                    going.discard(k)
    print(f"\nvhost-paced -> middle -> {receiver_setup(a)}: the middle's CPU cycles per delivered frame "
          f"(TSC at {hz / 1e6:.1f} MHz), {a.runs} runs of {a.seconds} s per load, medians; "
          f"layout {a.layout}: sender cpu {cpus['tx']}, middle cpu {cpus['middle']}, receiver cpu {cpus['rx']}; "
          f"the sending port's moderation {a.moderation} us, the receiving port's {a.rx_moderation}; "
          f"{common.machine()}")
    print("vale: all of valed's threads' CPU time; testpmd: its forwarding loop's TSC cycles in bursts that "
          "received something (--record-core-cycles), and all its threads' CPU time (busy-polling included)"
          + ("; delay: from the sender's post to the sink's pass that took the frame, median/p99 us "
             "(medians of the runs)" if stamping(a) else ""))
    rows = []
    for r in results:
        v_, p_ = r.get("vale"), r.get("dpdk_vhost")
        rb = next(b for b in bounds if b["frame_len"] == r["frame_len"])["receiver_rx_pps"]
        lost = lambda x: "-" if not x else f"{x['delivered_pps']['median'] / 1e6:.2f} ({x['loss']['median'] * 100:.2f}%)"
        sb = r["sender_bound"]
        delays = [fmt_delay(v_), fmt_delay(p_)] if stamping(a) else []
        rows.append([r["frame_len"], r["load_mpps"], lost(v_), fmt_cycles(med(v_, "cpu_cycles_per_frame")),
                     lost(p_), fmt_cycles(med(p_, "testpmd_cycles_per_frame")),
                     fmt_cycles(med(p_, "cpu_cycles_per_frame")), fmt_ratio(r["ratio_to_testpmd_cycles"]),
                     fmt_ratio(r["ratio_to_testpmd_cpu"]), *delays,
                     f"{sb['offered_pps']['median'] / 1e6:.2f}/{sb['delivered_pps']['median'] / 1e6:.2f}",
                     f"{rb['median'] / 1e6:.2f}"])
    common.table(["len", "load", "vale Mpps (lost)", "valed cyc/frame", "PMD Mpps (lost)", "testpmd cyc/frame",
                  "testpmd CPU cyc/frame", "vale/testpmd", "vale/testpmd CPU",
                  *(["vale delay us", "PMD delay us"] if stamping(a) else []), "sender bound off/dlv",
                  "rx bound Mpps"], rows)
    return results, bounds


def peer_run(d, size, a, cpus, dpdk):
    mid, s0, s1 = vhost_pmd(d, cpus, dpdk)
    try:
        mid.wait_forwarding()
        side = Side(s0, s1, size, cpus, dpdk)
        try:
            return side.measure(a.seconds, a.warmup, mid.proc.pid)
        finally:
            side.close()
    finally:
        mid.kill()


class ValeVhost(common.Valed):
    """valed (pinned to the middle's CPUs) with vale1:vm1 and vale1:vm2 listening at `socks`."""

    def __init__(self, cpus, socks, busy_poll_us=0, wrapper=(), moderation_us=0, rx_moderation_us=0):
        """`wrapper`: a command valed runs under (valgrind; chrt for --rt); `moderation_us`:
        the sending port's (vale1:vm1) moderation knob (kicks from its guest);
        `rx_moderation_us`: the receiving port's (vale1:vm2: interrupts to its guest)."""
        super().__init__({"valed": cpus["middle"], "tx": cpus["tx"], "rx": cpus["rx"]},
                         extra=("--busy-poll-us", str(busy_poll_us)), wrapper=wrapper)
        for port, s in zip(("vale1:vm1", "vale1:vm2"), socks):
            self.ctl("attach", port, "--vhost-user", s)
        if moderation_us:
            self.ctl("set", "vale1:vm1", "moderation", str(moderation_us))
        if rx_moderation_us:
            self.ctl("set", "vale1:vm2", "moderation", str(rx_moderation_us))

    def wait_state(self, state, limit=30.0, ports=("vale1:vm1", "vale1:vm2")):
        deadline = time.monotonic() + limit
        while True:
            p = self.ports()
            if all(p[n]["state"] == state for n in ports):
                return p
            if time.monotonic() > deadline:
                raise RuntimeError(f"vale1's vhost-user ports not {state} after {limit:g} s: {p}")
            time.sleep(0.02)


def main():
    ap = common.parser(__doc__, "vhost_user", seconds=2.0, peers=True, layouts=LAYOUTS)
    ap.add_argument("--sizes", default=SIZES, help=f"frame sizes, 60-1514 (default {SIZES})")
    ap.add_argument("--cpus", help="with --layout pinned: sender, middle and receiver CPUs, e.g. 2,4,6 "
                                   "(given alone, it implies --layout pinned)")
    ap.add_argument("--busy-poll-us", type=int, default=0,
                    help="valed --busy-poll-us: how long its threads keep looking at a dry ring or guest "
                         "before they sleep (default 0, valed's default)")
    ap.add_argument("--moderation", type=int, default=0, metavar="US",
                    help="the sending vhost-user port's moderation knob (vale-ctl set vale1:vm1 moderation US): "
                         "with --cost, whose sender negotiates event indices, kick moderation: the sender's "
                         "kicks about every US while it streams (default 0: off)")
    ap.add_argument("--rx-moderation", type=int, default=0, metavar="US",
                    help="the receiving vhost-user port's moderation knob (vale-ctl set vale1:vm2 moderation "
                         "US): at most one interrupt to the receiver every US (default 0: off; the vhost PMD "
                         "has no such knob)")
    ap.add_argument("--receiver", choices=("testpmd", "sink"), default="testpmd",
                    help="with --loads and --cost: the receiver, testpmd rxonly on virtio_user (busy-polling; "
                         "default) or vhost-paced --role sink (sleeps on its interrupt and takes its buffers "
                         "as a guest's driver does, event indices negotiated: on two CPUs it leaves the sender "
                         "the CPU they share)")
    ap.add_argument("--sink-bufs", type=int, default=1024, metavar="N",
                    help="with --receiver sink: the receive buffers it posts, 1-1024 (default 1024, as testpmd's "
                         "queue; QEMU's virtio-net posts 256)")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of traffic before counting (default 1; --quick 0.5)")
    ap.add_argument("--loads", metavar="MPPS", help="fixed offered loads instead of saturation, "
                                                    "e.g. 0.5,1,2,4 (Mpps; the sender is vhost-paced)")
    ap.add_argument("--cost", action="store_true",
                    help="cycles per frame of the middle (valed, the vhost PMD's io forwarding) at fixed loads "
                         f"(--loads, default {COST_LOADS}; each system up to the first load it loses frames "
                         "at), the sender's and the receiver's bounds beside them; default layout alone")
    ap.add_argument("--loss-limit", type=float, default=LOSS_LIMIT, metavar="FRACTION",
                    help=f"with --cost: a system is measured at higher loads only while its median loss stays "
                         f"at or below this (default {LOSS_LIMIT:g}; 1 measures every load)")
    ap.add_argument("--rt", action="store_true",
                    help="with --cost: the middle real-time (SCHED_FIFO 1: valed's threads, the forwarding lcore "
                         "of each DPDK back end; a middle testpmd's main lcore then goes to the sender's CPU), "
                         "so that on a machine others load the middle keeps its CPU (the DPDK back end then "
                         "takes 95%% of it while it runs); root")
    ap.add_argument("--nice", type=int, default=0,
                    help="scheduling priority of everything the bench starts (setpriority on itself, which "
                         "its children inherit; negative needs root): on a machine others load, -10 keeps "
                         "their compilers from taking the measured parties' CPU (default 0)")
    ap.add_argument("--dpdk", metavar="DIR", help="a relocatable DPDK folder (bin/dpdk-testpmd, lib/, pmds/) "
                                                  "instead of Debian's packages")
    a = common.parse(ap)
    if a.cpus and a.layout != "pinned":
        if any(x.startswith("--layout") for x in sys.argv[1:]):
            ap.error("--cpus goes with --layout pinned")
        a.layout = "pinned"
    if a.cost and not a.cpus and not any(x.startswith("--layout") for x in sys.argv[1:]):
        a.layout = "alone"
    if a.quick:
        a.warmup = min(a.warmup, 0.5)
    if not 1 <= a.sink_bufs <= 1024:
        ap.error("--sink-bufs must be 1..1024")
    sizes = common.int_list(a.sizes)
    if any(not 60 <= s <= 1514 for s in sizes):
        ap.error("sizes must be 60..1514")
    common.need_root("bench/vhost_user.py (testpmd)")
    if a.nice:
        os.setpriority(os.PRIO_PROCESS, 0, a.nice)
    cpus = cpu_sets(a)
    dpdk = peers.dpdk_env(a.dpdk)

    d = tempfile.mkdtemp(prefix="vb-vhost-")
    on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    socks = (f"{d}/vm1.sock", f"{d}/vm2.sock")
    v = ValeVhost(cpus, socks, a.busy_poll_us, wrapper=("chrt", "-f", "1") if a.rt else (),
                  moderation_us=a.moderation, rx_moderation_us=a.rx_moderation)

    systems = ["vale"] + ([] if a.no_peers else ["dpdk_vhost"])
    if a.cost:
        if a.out == os.path.join(common.RESULTS, "vhost_user.json"):
            a.out = os.path.join(common.RESULTS, "vhost_user_cost.json")
        results, bounds = cost_main(a, v, socks, d, sizes, cpus, dpdk, systems)
        common.stop(v.proc, common.signal.SIGTERM)
        layout = {"name": a.layout, "sender": cpus["tx"], "receiver_lcores": cpus["rx"],
                  "middle": cpus["middle"], "valed_busy_poll_us": a.busy_poll_us, "nice": a.nice,
                  "middle_realtime": a.rt, "valed_moderation_us": a.moderation,
                  "valed_rx_moderation_us": a.rx_moderation}
        setup = {"dpdk": peers.testpmd_version() if not a.dpdk else "DPDK from --dpdk folder",
                 "sender": "vhost-paced --sync --event-idx on the sender's CPUs: VERSION_1 and EVENT_IDX, "
                           "queue_size 1024, bursts every 20 us, transmit interrupts off",
                 "receiver": receiver_setup(a),
                 "dpdk_vhost": "testpmd --forward-mode=io --record-core-cycles, net_vhost0 and net_vhost1",
                 "vale_cycles": "sum over valed's threads of /proc/PID/task/TID/schedstat run time between the "
                                "sender's start and the return of its last descriptor, x TSC rate / frames "
                                "the receiver counted",
                 "testpmd_cycles": "testpmd 22.11 --record-core-cycles: rdtsc around each call of the io "
                                   "forwarding function, added only when the burst received frames (an empty "
                                   "poll returns before the count), over `clear fwd stats all` .. `show fwd "
                                   "stats all` around the sending; divided by the frames its ports received",
                 "testpmd_cpu_cycles": "as vale_cycles, for all of testpmd's threads (busy polling included)",
                 "sender_bound": "vhost-paced at the load into testpmd net_vhost0 rxonly on the middle's CPUs",
                 "receiver_bound": "testpmd net_vhost0 txonly on the middle's CPUs into the receiver",
                 "loss_limit": a.loss_limit}
        common.write_report(a.out, "vhost_user_cost", a, layout, results, setup=setup, systems=systems,
                            bounds=bounds, tsc=common.tsc_rate(), unit="TSC cycles per delivered frame",
                            ratio="vale's cycles per frame / testpmd's (its count; its CPU time)")
        return
    if a.loads:
        if a.out == os.path.join(common.RESULTS, "vhost_user.json"):
            a.out = os.path.join(common.RESULTS, "vhost_user_loads.json")
        results = loads_main(a, v, socks, d, sizes, cpus, dpdk, systems)
        common.stop(v.proc, common.signal.SIGTERM)
        layout = {"name": a.layout, "sender": cpus["tx"], "receiver_lcores": cpus["rx"],
                  "middle": cpus["middle"], "valed_busy_poll_us": a.busy_poll_us}
        setup = {"sender": "vhost-paced: VERSION_1 only, queue_size 1024, bursts every 20 us, "
                           "transmit interrupts off",
                 "receiver": receiver_setup(a),
                 "loss": "1 - receiver's RX-packets delta / frames posted"}
        common.write_report(a.out, "vhost_user_loads", a, layout, results, setup=setup, systems=systems)
        return
    results = []
    for s in sizes:
        runs = {k: [] for k in systems}
        for i in range(a.runs):
            runs["vale"].append(vale_run(v, socks, s, a, cpus, dpdk))
            if "dpdk_vhost" in systems:
                runs["dpdk_vhost"].append(peer_run(d, s, a, cpus, dpdk))
            print(f"{s} B run {i + 1}: " + ", ".join(f"{k} {runs[k][-1]['rx_pps'] / 1e6:.2f} Mpps" for k in systems),
                  flush=True)
        r = {"frame_len": s}
        for k in systems:
            r[k] = {f: summary([x[f] for x in runs[k]]) for f in runs[k][0]}
        if "dpdk_vhost" in systems:
            r["ratio"] = ratio(r["vale"]["rx_pps"], r["dpdk_vhost"]["rx_pps"])
        results.append(r)
    common.stop(v.proc, common.signal.SIGTERM)

    rows = []
    for r in results:
        row = [r["frame_len"], mpps(r["vale"]["rx_pps"]), mpps(r["vale"]["tx_pps"]),
               f"{r['vale']['middle_cores']['median']:.2f}"]
        if "dpdk_vhost" in systems:
            row += [mpps(r["dpdk_vhost"]["rx_pps"]), mpps(r["dpdk_vhost"]["tx_pps"]),
                    f"{r['dpdk_vhost']['middle_cores']['median']:.2f}", fmt_ratio(r["ratio"])]
        rows.append(row)
    print(f"\nvirtio_user txonly -> middle -> virtio_user rxonly, {a.runs} runs of {a.seconds} s "
          f"(warm-up {a.warmup} s); layout {a.layout}: sender cpu {cpus['tx']}, middle cpu {cpus['middle']}, "
          f"receiver cpu {cpus['rx']}; valed --busy-poll-us {a.busy_poll_us}")
    headers = ["len", "vale rx Mpps (min-max)", "vale tx Mpps", "valed cores"]
    if "dpdk_vhost" in systems:
        headers += ["vhost PMD rx Mpps", "vhost PMD tx Mpps", "middle cores", "vale/vhost PMD"]
    common.table(headers, rows)
    layout = {"name": a.layout, "sender_lcores": cpus["tx"], "receiver_lcores": cpus["rx"],
              "middle": cpus["middle"], "note": "each testpmd: main and forwarding lcore on its CPU set; "
                                                "valed: taskset on the middle's CPU set, 1 worker",
              "valed_busy_poll_us": a.busy_poll_us}
    setup = {
        "dpdk": peers.testpmd_version() if not a.dpdk else "DPDK from --dpdk folder",
        "front_ends": "testpmd -i --auto-start, --no-huge -m 512 --single-file-segments, "
                      "--total-num-mbufs=16384, net_virtio_user0 queues=1 queue_size=1024, burst 32",
        "vale": "valed, vale1:vm1 and vale1:vm2 vhost-user (valed listens); frames flooded to vm2",
        "dpdk_vhost": "testpmd --forward-mode=io, net_vhost0 and net_vhost1 (queues=1, server)",
        "counting": "rx pps: receiver's RX-packets delta over --seconds; tx pps: sender's TX-packets delta",
    }
    common.write_report(a.out, "vhost_user", a, layout, results, setup=setup, systems=systems,
                        warmup=a.warmup, ratio="median rx pps through vale / median rx pps through the vhost PMD")


if __name__ == "__main__":
    common.main_guard(main)

#!/usr/bin/env python3
"""Many VMs on one switch: 64 vhost-user ports with connected, idle front ends, then 16 of them
sending at a fixed rate each, all on the machine's CPUs as they are (no pinning).

    valed: vale1:vm0 .. vale1:vm63 (vhost-user, listening) + vale1:rx (native, vale-pktgen rx)

Idle: each port gets a front end of vale's own (crates/vale-tests/src/bin/vhost-paced.rs with
--rate 0: it connects, shares its memory, sets up both queues and kicks nothing) and valed's
CPU time is read over --idle-seconds once every port is up. Reported: valed's share of one
core, its threads (/proc/PID/task) and resident memory (VmRSS) before any port, with the ports
attached and no front end, and with every front end connected; per port, the differences.

Busy: the front ends of the first --busy ports are replaced by vhost-paced senders at --rate
Mpps each (bursts every --tick-us), every one from its own source MAC to the MAC the receiver
announced (vale-pktgen rx --announce), so frames are forwarded, not flooded; the other ports
stay connected and idle. Per sender: frames posted (offered), frames valed took from its queue
(the port's tx_packets), and the sender's backlog (frames it could not post because valed had
not yet returned its descriptors: valed did not keep up). Delivered: the frames vale-pktgen
counted, against the sum posted. Target (issue: many VMs on one switch): valed 0.00% of a core
with 64 idle ports; 16 senders at 0.1 Mpps each on two CPUs: nothing lost.

    cargo build --release && bench/vhost_many.py [--runs 3] [--seconds 3] [--ports 64]
                                                 [--busy 16] [--rate 0.1] [--idle-seconds 10]
"""
import os, signal, subprocess, tempfile, time

import common
from common import summary

RX_MAC = "02:00:00:00:0f:01"


def status(pid):
    """(resident KiB, threads) of a process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/task"))


def src_mac(i):
    return f"02:00:00:01:{(i >> 8) & 0xff:02x}:{i & 0xff:02x}"


def front_end(sock, rate_mpps, seconds, a, i):
    """A vhost-paced on `sock`: idle with rate 0, else sending `rate_mpps` to the receiver."""
    return common.spawn([f"{common.BIN}/vhost-paced", "--socket", sock, "--rate", str(rate_mpps * 1e6),
                         "--seconds", str(seconds), "--len", str(a.size), "--dst", RX_MAC,
                         "--mac", src_mac(i), "--tick-us", str(a.tick_us)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_state(v, ports, state, limit=30.0):
    deadline = time.monotonic() + limit
    while True:
        info = v.ports()
        if all(info[p]["state"] == state for p in ports):
            return info
        if time.monotonic() > deadline:
            bad = {p: info[p]["state"] for p in ports if info[p]["state"] != state}
            raise RuntimeError(f"ports not {state} after {limit:g} s: {bad}")
        time.sleep(0.05)


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def busy_run(v, socks, names, a):
    """One run of the busy phase: {per_port: [...], posted, taken, delivered, rx_drops}."""
    log = tempfile.TemporaryFile(mode="w+")
    rx = common.spawn(v.pktgen("vale1:rx", "rx", v.layout["rx"], "-T", a.seconds + 30, "--announce",
                               "-S", RX_MAC, "--slots", "4096"),
                      env=v.env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        v.wait_ports(["vale1:rx"], announced=True)
        before = v.ports()
        senders = [front_end(socks[i], a.rate, a.seconds, a, i) for i in range(a.busy)]
        outs = []
        for p in senders:
            out, err = p.communicate(timeout=a.seconds + 60)
            if p.returncode != 0:
                raise RuntimeError(f"vhost-paced failed: {err.strip()[-2000:]}")
            outs.append(common.json.loads(out.strip().splitlines()[-1]))
        time.sleep(0.3)
        after = v.ports()
    finally:
        common.stop(rx)
    delivered = common.pktgen_reports([(rx, log)], "rx")[0]["packets"]
    per_port = []
    for i in range(a.busy):
        n = names[i]
        taken = after[n]["counters"]["tx_packets"] - before[n]["counters"]["tx_packets"]
        per_port.append({"port": n, "posted": outs[i]["posted"], "taken": taken, "backlog": outs[i]["backlog"],
                         "seconds": outs[i]["seconds"]})
    rxd = after["vale1:rx"]["counters"]["rx_drops"] - before["vale1:rx"]["counters"]["rx_drops"]
    posted = sum(p["posted"] for p in per_port)
    return {"per_port": per_port, "posted": posted, "taken": sum(p["taken"] for p in per_port),
            "backlog": sum(p["backlog"] for p in per_port), "delivered": delivered, "rx_drops": rxd,
            "loss": 1 - delivered / max(posted, 1)}


def main():
    ap = common.parser(__doc__, "vhost_many", runs=3, seconds=3.0, peers=False)
    ap.add_argument("--ports", type=int, default=64, help="vhost-user ports with a front end (default 64)")
    ap.add_argument("--busy", type=int, default=16, help="of them, how many send (default 16)")
    ap.add_argument("--rate", type=float, default=0.1, help="Mpps each sender offers (default 0.1)")
    ap.add_argument("--size", type=int, default=60, help="frame length, 60-1514 (default 60)")
    ap.add_argument("--tick-us", type=int, default=200,
                    help="microseconds between a sender's bursts (default 200: 20 frames a burst at 0.1 Mpps)")
    ap.add_argument("--idle-seconds", type=float, default=10.0,
                    help="seconds over which the idle CPU is read (default 10; one clock tick is 10 ms)")
    a = common.parse(ap)
    if a.quick:
        a.idle_seconds = min(a.idle_seconds, 2.0)
    if not 1 <= a.busy <= a.ports <= 1024:
        ap.error("need 1 <= --busy <= --ports <= 1024")

    v = common.Valed("shared", persistent=False)
    d = tempfile.mkdtemp(prefix="vale-many-")
    common.on_exit(lambda: common.shutil.rmtree(d, ignore_errors=True))
    names = [f"vale1:vm{i}" for i in range(a.ports)]
    socks = [os.path.join(d, f"vm{i}.sock") for i in range(a.ports)]
    v.ctl("create", "vale1:rx")
    base = status(v.pid)
    t0 = time.monotonic()
    for n, s in zip(names, socks):
        v.ctl("attach", n, "--vhost-user", s)
    attach_s = time.monotonic() - t0
    attached = status(v.pid)
    idle = [front_end(s, 0, 3600, a, i) for i, s in enumerate(socks)]
    common.on_exit(lambda: stop_all(idle))
    wait_state(v, names, "up", limit=60)
    time.sleep(1)
    connected = status(v.pid)
    idle_cores = [v.idle_cpu(a.idle_seconds) for _ in range(a.runs)]
    per_port = {"rss_kib_no_front_end": (attached[0] - base[0]) / a.ports,
                "rss_kib_connected": (connected[0] - base[0]) / a.ports,
                "threads_no_front_end": (attached[1] - base[1]) / a.ports,
                "threads_connected": (connected[1] - base[1]) / a.ports}
    print(f"{a.ports} vhost-user ports attached in {attach_s:.2f} s; valed: threads {base[1]} -> {attached[1]} "
          f"(attached) -> {connected[1]} (front ends connected), RSS {base[0]} -> {attached[0]} -> {connected[0]} KiB",
          flush=True)
    print(f"idle: valed {summary(idle_cores)['median'] * 100:.2f}% of a core (median of {a.runs} x "
          f"{a.idle_seconds:g} s)", flush=True)

    # The busy phase: the first --busy ports' idle front ends go, senders take their place.
    stop_all(idle[:a.busy])
    wait_state(v, names[:a.busy], "down")
    runs = []
    for r in range(a.runs):
        c0 = common.cpu_seconds(v.pid)
        t = time.monotonic()
        x = busy_run(v, socks, names, a)
        x["valed_cores"] = (common.cpu_seconds(v.pid) - c0) / (time.monotonic() - t)
        runs.append(x)
        print(f"run {r + 1}: posted {x['posted']}, taken {x['taken']}, delivered {x['delivered']} "
              f"({x['loss'] * 100:.3f}% lost), backlog {x['backlog']}, rx drops {x['rx_drops']}, "
              f"valed {x['valed_cores']:.2f} cores", flush=True)
        wait_state(v, names[:a.busy], "down")
    stop_all(idle)

    print(f"\n{a.ports} connected vhost-user ports, {a.busy} sending {a.rate:g} Mpps each of {a.size} B "
          f"({a.runs} runs of {a.seconds:g} s), nothing pinned")
    common.table(["sender", "posted (median)", "taken by valed", "backlog", "lost"],
                 [[names[i], int(summary([x["per_port"][i]["posted"] for x in runs])["median"]),
                   int(summary([x["per_port"][i]["taken"] for x in runs])["median"]),
                   int(summary([x["per_port"][i]["backlog"] for x in runs])["median"]),
                   int(summary([x["per_port"][i]["posted"] - x["per_port"][i]["taken"] for x in runs])["median"])]
                  for i in range(a.busy)])
    results = {"ports": a.ports, "busy": a.busy, "rate_mpps": a.rate, "frame_len": a.size,
               "attach_seconds": attach_s, "idle_valed_cores": summary(idle_cores),
               "valed_before": {"rss_kib": base[0], "threads": base[1]},
               "valed_attached": {"rss_kib": attached[0], "threads": attached[1]},
               "valed_connected": {"rss_kib": connected[0], "threads": connected[1]},
               "per_port": per_port,
               "busy_runs": runs,
               "loss": summary([x["loss"] for x in runs]),
               "backlog": summary([x["backlog"] for x in runs]),
               "busy_valed_cores": summary([x["valed_cores"] for x in runs])}
    print(f"per port: {per_port['threads_connected']:.2f} threads, {per_port['rss_kib_connected']:.0f} KiB "
          f"resident with its front end connected ({per_port['rss_kib_no_front_end']:.0f} KiB without)")
    print(f"busy: loss median {results['loss']['median'] * 100:.3f}%, backlog median "
          f"{int(results['backlog']['median'])}, valed {results['busy_valed_cores']['median']:.2f} cores")
    common.write_report(a.out, "vhost_many", a, {"vale": {"name": "shared", "valed": v.layout["valed"],
                                                          "front_ends": "unpinned"}}, results,
                        setup={"vale": f"{a.ports} x vhost-paced (idle, --rate 0) on vale1:vm*; "
                                       f"{a.busy} x vhost-paced --rate {a.rate}e6 -> vale1:rx "
                                       "(vale-pktgen rx --announce)"})


if __name__ == "__main__":
    common.main_guard(main)

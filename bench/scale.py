#!/usr/bin/env python3
"""Many cores: aggregate rate of one switch with W workers (`valed --workers W`).

Three experiments, each for every W of --workers and every N of --clients, native ports only
(vale-pktgen; no root, no iproute2, no apt, so it runs on a bare many-core machine):

- pairs: N independent pairs on switch vale0, a_i -> b_i, unicast (each receiver announces
  its MAC, each sender sends to its receiver's MAC; the senders' source MACs differ);
- incast: N senders a_0..a_N-1 -> one receiver b_0 (unicast to its MAC);
- broadcast: one sender a_0 -> N receivers b_0..b_N-1 (broadcast destination).

Per run: the receivers start and announce themselves, then the senders all start at once for
--seconds. The aggregate is the sum of the receivers' rates (each over its first to last
frame); per-worker CPU is each valed worker thread's (`vale-worker-K`) utime+stime from
/proc/PID/task/TID/stat over the senders' run, in cores (CPU seconds per second).
`per_worker_share` shows how evenly the workers were loaded. valed gives each new port's tx
ring to the next worker in turn; the receivers open first, then the senders, so N >= W
senders land on W distinct workers.

CPU layouts (--layout):
- split (default): valed (all its workers) on cpu1, every sender and receiver on cpu0: what a
  2-vCPU machine can do; it measures the switch's scaling only as far as two CPUs let it;
- shared: nothing pinned;
- own: each worker, sender and receiver a CPU of its own (W + 2N CPUs for pairs, on distinct
  cores first): valed is pinned to W CPUs, each client to one. Points that do not fit the
  machine are skipped (and listed).

    cargo build --release && bench/scale.py [--workers 1,2] [--clients 1,2] [--experiments pairs,incast,broadcast]
    bench/scale.py --layout own --workers 1,2,4,8 --clients 1,2,4,8     # a 16-core machine

Prints a table per experiment and writes bench/results/scale.json.
"""
import json, os, subprocess, tempfile, time

import common
from common import summary, mpps, spawn, stop

EXPERIMENTS = ("pairs", "incast", "broadcast")


def worker_cpu(pid):
    """{thread name: CPU seconds} of valed's worker threads, from /proc/PID/task/*/stat."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue   # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name.startswith("vale-worker-"):
            fields = stat[stat.rindex(")") + 2:].split()
            out[name] = out.get(name, 0) + (int(fields[11]) + int(fields[12])) / common.CLK_TCK
    return out


def plan(experiment, n):
    """(senders, receivers, destination of sender i or None for broadcast)."""
    if experiment == "pairs":
        return n, n, lambda i: common.mac_of(i + 1)
    if experiment == "incast":
        return n, 1, lambda i: common.mac_of(1)
    return 1, n, lambda i: None


def cpus_for(layout, workers, senders, receivers):
    """{valed, tx: [per sender], rx: [per receiver]} CPU lists, or None if `own` does not fit."""
    if layout != "own":
        lay = common.LAYOUTS[layout]
        return {"valed": lay["valed"], "tx": [lay["tx"]] * senders, "rx": [lay["rx"]] * receivers}
    need = workers + senders + receivers
    cpus = [str(c) for c in common.spread_cpus(need)]
    if len(cpus) < need:
        return None
    return {"valed": ",".join(cpus[:workers]), "tx": cpus[workers:workers + senders],
            "rx": cpus[workers + senders:]}


def one_run(v, experiment, n, size, seconds, cpus):
    """Receivers, then all senders at once; returns {rx_pps, tx_pps, workers: {name: cores}}."""
    senders, receivers, dst = plan(experiment, n)
    unicast = experiment != "broadcast"
    rxs = []
    for i in range(receivers):
        extra = ["--announce", "-S", common.mac_of(i + 1)] if unicast else []
        log = tempfile.TemporaryFile(mode="w+")
        rxs.append((spawn(v.pktgen(f"vale0:b{i}", "rx", cpus["rx"][i], "-T", seconds + 30, *extra),
                          env=v.env, stdout=subprocess.PIPE, stderr=log, text=True), log))
    txs = []
    try:
        v.wait_ports([f"vale0:b{i}" for i in range(receivers)], announced=unicast)
        w0, t0 = worker_cpu(v.pid), time.monotonic()
        for i in range(senders):
            cmd = v.pktgen(f"vale0:a{i}", "tx", cpus["tx"][i], "-l", size, "-T", seconds)
            if dst(i):
                cmd += ["-D", dst(i)]
            log = tempfile.TemporaryFile(mode="w+")
            txs.append((spawn(cmd, env=v.env, stdout=subprocess.PIPE, stderr=log, text=True), log))
        for p, _ in txs:
            p.wait(timeout=seconds + 30)
        w1, t1 = worker_cpu(v.pid), time.monotonic()
        time.sleep(0.1)   # let the receivers read the last delivered frames
    finally:
        for p, _ in rxs + txs:
            stop(p)

    tx, rx = common.pktgen_reports(txs, "tx"), common.pktgen_reports(rxs, "rx")
    return {"rx_pps": sum(r["pps"] for r in rx), "tx_pps": sum(r["pps"] for r in tx),
            "rx_drops": sum(r["drops"] for r in rx),
            "workers": {k: (w1.get(k, 0) - w0.get(k, 0)) / (t1 - t0) for k in sorted(set(w0) | set(w1))}}


def main():
    ap = common.parser(__doc__, "scale", runs=3, seconds=2.0, peers=False)
    ap.add_argument("--workers", default="1,2", help="valed worker counts (default 1,2)")
    ap.add_argument("--clients", default="1,2", help="N: pairs, incast senders, broadcast receivers (default 1,2)")
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS), help=f"of {', '.join(EXPERIMENTS)} (default all)")
    ap.add_argument("--size", type=int, default=60, help="frame length (default 60)")
    a = common.parse(ap)
    workers, clients = common.int_list(a.workers), common.int_list(a.clients)
    which = [e for e in a.experiments.split(",") if e]
    if any(e not in EXPERIMENTS for e in which) or not workers or not clients or min(workers + clients) < 1:
        ap.error(f"--experiments takes {', '.join(EXPERIMENTS)}; --workers and --clients numbers >= 1")
    if a.layout == "own":
        print(f"layout own: {len(common.cpu_topology())} CPUs; points needing more are skipped", flush=True)

    results, skipped = [], []
    for w in workers:
        # The valed of this worker count runs on the CPUs of its largest own-layout point that fits.
        points = []
        for e in which:
            for n in clients:
                s, r, _ = plan(e, n)
                c = cpus_for(a.layout, w, s, r)
                if c is None:
                    skipped.append({"experiment": e, "workers": w, "clients": n,
                                    "cpus_needed": w + s + r})
                else:
                    points.append((e, n, c))
        if not points:
            continue
        clients_cpus = ",".join(str(x) for x in sorted(set().union(
            *(common.cpu_set(x) for _, _, c in points for x in c["tx"] + c["rx"]))))
        lay = {"valed": points[0][2]["valed"], "tx": clients_cpus, "rx": clients_cpus, "name": a.layout}
        v = common.Valed(lay, workers=w, persistent=False)
        for e, n, c in points:
            runs = [one_run(v, e, n, a.size, a.seconds, c) for _ in range(a.runs)]
            names = sorted({k for r in runs for k in r["workers"]})
            per_worker = {k: summary([r["workers"].get(k, 0) for r in runs]) for k in names}
            total = sum(s["median"] for s in per_worker.values())
            res = {"experiment": e, "workers": w, "clients": n, "frame_len": a.size,
                   "rx_pps": summary([r["rx_pps"] for r in runs]), "tx_pps": summary([r["tx_pps"] for r in runs]),
                   "rx_drops": summary([r["rx_drops"] for r in runs]),
                   "worker_cores": per_worker,
                   "per_worker_share": {k: s["median"] / total if total else None for k, s in per_worker.items()},
                   "cpus": {"valed": c["valed"], "tx": c["tx"], "rx": c["rx"]}}
            results.append(res)
            print(f"{e} W={w} N={n}: {mpps(res['rx_pps'])} Mpps; workers "
                  + ", ".join(f"{s['median']:.2f}" for s in per_worker.values()) + " cores", flush=True)
        stop(v.proc, common.signal.SIGTERM)

    # Scaling: each point over the same experiment's W=1, N=1 figure (pairs: over W x that).
    base = {r["experiment"]: r["rx_pps"]["median"] for r in results if r["workers"] == 1 and r["clients"] == 1}
    for r in results:
        b = base.get(r["experiment"])
        r["vs_one"] = r["rx_pps"]["median"] / b if b else None
        if r["experiment"] == "pairs" and b:
            r["scaling_efficiency"] = r["rx_pps"]["median"] / (min(r["workers"], r["clients"]) * b)
    print(f"\nscale, {a.size} B, {a.runs} runs of {a.seconds} s; {common.describe(a.layout)}")
    for e in which:
        rows = [[r["workers"], r["clients"], mpps(r["rx_pps"]), common.fmt_ratio(r["vs_one"]),
                 " ".join(f"{s['median']:.2f}" for s in r["worker_cores"].values()),
                 f"valed {r['cpus']['valed']}; tx {' '.join(r['cpus']['tx'])}; rx {' '.join(r['cpus']['rx'])}"]
                for r in results if r["experiment"] == e]
        if rows:
            print(f"\n{e}:")
            common.table(["W", "N", "aggregate rx Mpps (min-max)", "vs W=1,N=1", "cores per worker", "CPUs"], rows)
    for s in skipped:
        print(f"skipped {s['experiment']} W={s['workers']} N={s['clients']}: needs {s['cpus_needed']} CPUs")
    layout = {"name": a.layout, "note": {"split": "valed (all workers) on cpu1, every client on cpu0",
                                         "shared": "nothing pinned",
                                         "own": "each worker, sender and receiver a CPU of its own"}[a.layout]}
    common.write_report(a.out, "scale", a, layout, results, skipped=skipped,
                        setup={"valed": "valed --workers W, learning bridge; ports vale0:aI (senders), vale0:bI "
                                        "(receivers), receivers opened first",
                               "clients": "vale-pktgen tx/rx, batch 512; unicast receivers --announce",
                               "worker_cores": "per valed worker thread, CPU seconds per second over the senders' run"})


if __name__ == "__main__":
    common.main_guard(main)

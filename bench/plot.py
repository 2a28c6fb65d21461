#!/usr/bin/env python3
"""Draws the VALE paper's figures (PNG) from the JSON the experiments wrote.

Reads bench/results/{destinations,batch,sizes,latency,ports,cpu}.json (whichever exist) and
writes into --outdir (default docs/bench/):
  fig06_destinations.png   rate per destination vs number of destinations (vale, Linux bridge)
  fig07_ns_per_copy.png    vale's time per delivered copy vs number of destinations
  fig08_10_batch.png       rate vs switch, receiver and sender batch size
  fig11_sizes.png          per-packet time and rate vs frame size (vale, bridge, OVS, DPDK memif)
  fig12_latency.png        round-trip time vs frame size (vale, Linux bridge)
  ports.png                unicast rate vs number of ports on the switch
  cpu.png                  CPU seconds per million packets (valed, ovs-vswitchd, testpmd x2)
  vhost_cost.png           the VM path's middle, CPU cycles per delivered frame vs offered load
                           (valed; testpmd's vhost PMD io forwarding, its own count and its CPU time)
  latency_like.png         round-trip time, like with like: vale vs two processes through the
                           Linux bridge (UDP), and the VM path through vale vs the vhost PMD
Each figure's title carries the date and the points are medians, with min-max bars. Uses
matplotlib; if it is missing, installs python3-matplotlib with apt-get (needs root).

    bench/plot.py [--results bench/results] [--outdir docs/bench]
"""
import argparse, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

LABEL = {"vale": "vale", "linux_bridge": "Linux bridge", "ovs": "Open vSwitch (userspace)",
         "dpdk_memif": "DPDK memif, no switch"}


# vhost_cost.png rings the points where more than this fraction was lost.
LOSSY = 0.001

SYSTEM_PYTHON = "/usr/bin/python3"   # the distribution's, which python3-matplotlib is for


def load_matplotlib():
    try:
        import matplotlib
    except ImportError:
        if not os.path.exists("/usr/lib/python3/dist-packages/matplotlib"):
            if os.geteuid() != 0:
                sys.exit("matplotlib missing: apt-get install python3-matplotlib (as root), or run plot.py as root")
            common.ensure_packages(["/usr/lib/python3/dist-packages/matplotlib"], ["python3-matplotlib"])
        # Another python3 (a virtualenv, pyenv) runs us: go on with the system's.
        if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.path.exists(SYSTEM_PYTHON):
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__), *sys.argv[1:]])
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter
    global PLAIN
    PLAIN = ScalarFormatter
    return plt


PLAIN = None   # matplotlib's ScalarFormatter, once loaded: 1024 rather than 2^10 on log axes


def bars(s, scale=1.0):
    """(median, [[below], [above]]) of a summary, for errorbar()."""
    m = s["median"] * scale
    return m, [[m - s["min"] * scale], [s["max"] * scale - m]]


def line(ax, xs, summaries, label, scale=1.0, **kw):
    pts = [(x, s) for x, s in zip(xs, summaries) if s]
    if not pts:
        return
    ms = [s["median"] * scale for _, s in pts]
    lo = [s["median"] * scale - s["min"] * scale for _, s in pts]
    hi = [s["max"] * scale - s["median"] * scale for _, s in pts]
    ax.errorbar([x for x, _ in pts], ms, yerr=[lo, hi], marker="o", ms=4, capsize=3, label=label, **kw)


def title(ax, text, data):
    ax.set_title(f"{text}\n{data['date'][:16].replace('T', ' ')} UTC, {data['runs']} runs of {data['seconds']} s"
                 + (" (quick)" if data.get("quick") else ""), fontsize=9)


def save(plt, fig, outdir, name, made):
    fig.tight_layout()
    path = os.path.join(outdir, name)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    made.append((path, os.path.getsize(path)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=common.RESULTS, help="where the JSON is (default bench/results)")
    ap.add_argument("--outdir", default=os.path.join(common.ROOT, "docs", "bench"), help="where the PNGs go (default docs/bench)")
    a = ap.parse_args()
    plt = load_matplotlib()
    os.makedirs(a.outdir, exist_ok=True)
    made = []

    d = common.load_result(a.results, "destinations")
    if d:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for sw in ("vale", "linux_bridge"):
            for size in sorted({r["frame_len"] for r in d["results"]}):
                rs = sorted((r for r in d["results"] if r["switch"] == sw and r["frame_len"] == size),
                            key=lambda r: r["destinations"])
                line(ax, [r["destinations"] for r in rs], [r["per_destination_pps"] for r in rs],
                     f"{LABEL[sw]}, {size} B", 1e-6, ls="-" if sw == "vale" else "--")
        ax.set_yscale("log")
        ax.set_xlabel("destinations (broadcast)")
        ax.set_ylabel("Mpps per destination")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        title(ax, "Fig. 6: forwarding rate vs number of destinations", d)
        save(plt, fig, a.outdir, "fig06_destinations.png", made)

        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for size in sorted({r["frame_len"] for r in d["results"]}):
            rs = sorted((r for r in d["results"] if r["switch"] == "vale" and r["frame_len"] == size),
                        key=lambda r: r["destinations"])
            ax.plot([r["destinations"] for r in rs], [r["ns_per_delivered_packet"] for r in rs], marker="o",
                    label=f"vale, {size} B")
        ax.set_xlabel("destinations (broadcast)")
        ax.set_ylabel("ns per delivered copy")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        title(ax, "Fig. 7: time per delivered packet vs number of destinations", d)
        save(plt, fig, a.outdir, "fig07_ns_per_copy.png", made)

    d = common.load_result(a.results, "batch")
    if d:
        names = {"switch": "Fig. 8: switch batch (tx, rx 1024)", "rx": "Fig. 9: receiver batch (switch, tx 1024)",
                 "tx": "Fig. 10: sender batch (switch 1024)"}
        sweeps = [r for r in d["results"] if r["sweep"] in ("switch", "rx", "tx")]
        fig, axes = plt.subplots(1, len(sweeps), figsize=(4.2 * len(sweeps), 3.8), squeeze=False)
        for ax, r in zip(axes[0], sweeps):
            line(ax, [p["batch"] for p in r["points"]], [p["rx_pps"] for p in r["points"]],
                 "vale" + (", rx batch 1024" if r["sweep"] == "tx" else ""), 1e-6)
            if r["sweep"] == "tx":
                r1 = next((x for x in d["results"] if x["sweep"] == "tx_rx1"), None)
                if r1:
                    line(ax, [p["batch"] for p in r1["points"]], [p["rx_pps"] for p in r1["points"]],
                         "vale, rx batch 1", 1e-6)
            if d.get("linux_bridge"):
                ax.axhline(d["linux_bridge"]["rx_pps"]["median"] / 1e6, color="gray", ls="--", label="Linux bridge")
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(PLAIN())
            ax.set_xlabel("batch size (frames)")
            ax.set_ylabel("Mpps received")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            ax.set_title(names[r["sweep"]], fontsize=9)
        fig.suptitle(f"Rate vs batch size, {d['results'][0]['frame_len']}-byte frames, "
                     f"{d['date'][:16].replace('T', ' ')} UTC, {d['runs']} runs of {d['seconds']} s"
                     + (" (quick)" if d.get("quick") else ""), fontsize=9)
        save(plt, fig, a.outdir, "fig08_10_batch.png", made)

    d = common.load_result(a.results, "sizes")
    if d:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for sw in ("vale", "linux_bridge", "ovs", "dpdk_memif"):
            rs = [r for r in d["results"] if sw in r]
            if not rs:
                continue
            ax1.plot([r["frame_len"] for r in rs], [r["ns_per_packet"].get(sw) for r in rs], marker="o", label=LABEL[sw])
            line(ax2, [r["frame_len"] for r in rs], [r[sw]["rx_pps"] for r in rs], LABEL[sw], 1e-6)
        for ax in (ax1, ax2):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("frame size (bytes)")
            ax.xaxis.set_major_formatter(PLAIN())
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
        ax1.set_ylabel("ns per packet")
        ax2.set_ylabel("Mpps received")
        title(ax1, "Fig. 11: per-packet time vs frame size", d)
        title(ax2, "rate vs frame size", d)
        save(plt, fig, a.outdir, "fig11_sizes.png", made)

    d = common.load_result(a.results, "latency")
    if d:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for sw in ("vale", "linux_bridge"):
            rs = [r for r in d["results"] if r["switch"] == sw]
            if not rs:
                continue
            ms = [r["median"]["median"] for r in rs]
            ax.errorbar([r["frame_len"] for r in rs], ms,
                        yerr=[[m - r["min"]["median"] for m, r in zip(ms, rs)],
                              [r["p99"]["median"] - m for m, r in zip(ms, rs)]],
                        marker="o", capsize=3, label=f"{LABEL[sw]}" + (" (kernel ping)" if sw != "vale" else " (ping-pong)"))
        ax.set_xlabel("frame size (bytes)")
        ax.set_ylabel("round-trip time, us (median; bars: min to p99)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        title(ax, "Fig. 12: round-trip time vs frame size", d)
        save(plt, fig, a.outdir, "fig12_latency.png", made)

    d = common.load_result(a.results, "ports")
    if d:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for size in sorted({r["frame_len"] for r in d["results"]}):
            rs = [r for r in d["results"] if r["frame_len"] == size]
            line(ax, [r["ports"] for r in rs], [r["rx_pps"] for r in rs], f"vale, unicast, {size} B", 1e-6)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("ports on the switch")
        ax.set_ylabel("Mpps received")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        title(ax, "Unicast rate vs number of ports", d)
        save(plt, fig, a.outdir, "ports.png", made)

    d = common.load_result(a.results, "cpu")
    if d:
        busy = d["results"]["busy"]
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        keys = [("vale", "valed_cpu_s_per_mpkt", "valed"), ("ovs", "switch_cpu_s_per_mpkt", "ovs-vswitchd"),
                ("dpdk_memif", "cpu_s_per_mpkt", "testpmd x2 (memif, no switch)")]
        w = 0.8 / len(keys)
        for i, (k, field, label) in enumerate(keys):
            xs = [j + i * w for j, r in enumerate(busy) if k in r]
            ys = [r[k][field]["median"] for r in busy if k in r]
            if xs:
                ax.bar(xs, ys, width=w, label=label)
        ax.set_xticks([j + w * (len(keys) - 1) / 2 for j in range(len(busy))])
        ax.set_xticklabels([f"{r['frame_len']} B" for r in busy])
        ax.set_yscale("log")
        ax.set_ylabel("CPU seconds per million packets")
        ax.legend(fontsize=8)
        idle = d["results"]["idle"]["vale"]
        title(ax, f"CPU cost; valed idle with {idle['ports']} ports: "
                  f"{idle['valed_cores']['median'] * 100:.2f}% of a core", d)
        save(plt, fig, a.outdir, "cpu.png", made)

    d = common.load_result(a.results, "vhost_user_cost")
    if d:
        sizes = sorted({r["frame_len"] for r in d["results"]})
        fig, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 4.2), squeeze=False)
        series = [("vale", "cpu_cycles_per_frame", "valed (all threads' CPU time)", "-"),
                  ("dpdk_vhost", "testpmd_cycles_per_frame", "vhost PMD io (testpmd's count: non-empty bursts)", "--"),
                  ("dpdk_vhost", "cpu_cycles_per_frame", "vhost PMD io (testpmd's CPU time, busy polls included)", ":")]
        for ax, size in zip(axes[0], sizes):
            rs = [r for r in d["results"] if r["frame_len"] == size]
            for k, field, label, ls in series:
                pts = [r for r in rs if r.get(k) and r[k].get(field)]
                line(ax, [r["load_mpps"] for r in pts], [r[k][field] for r in pts], label, ls=ls)
                lossy = [r for r in pts if r[k]["loss"]["median"] > LOSSY]
                ax.scatter([r["load_mpps"] for r in lossy], [r[k][field]["median"] for r in lossy], s=80,
                           facecolors="none", edgecolors="red", zorder=3)
            ax.set_yscale("log")
            ax.set_xlabel("offered load, Mpps (vhost-paced)")
            ax.set_ylabel("TSC cycles per frame")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
            lay = d["cpu_layout"]
            rx = "sink" if "sink" in d.get("setup", {}).get("receiver", "") else "testpmd"
            mod = lay.get("valed_moderation_us", 0)
            rx_mod = lay.get("valed_rx_moderation_us", 0)
            mod = f"{mod} us" + (f" (receiving port {rx_mod} us)" if rx_mod else "")
            title(ax, f"VM path's middle, {size} B; cpus: sender {lay['sender']}, middle {lay['middle']}, "
                      f"receiver ({rx}) {lay['receiver_lcores']}\nmoderation {mod}; red ring: > {LOSSY:.1%} lost; load average "
                      f"{d['loadavg']['start'][0]:.1f}", d)
        save(plt, fig, a.outdir, "vhost_cost.png", made)

    d = common.load_result(a.results, "latency")
    if d and d.get("like_for_like"):
        rows = d["like_for_like"]
        systems = [("vale", "vale (native ports)"), ("linux_bridge_udp", "two processes, UDP, Linux bridge"),
                   ("vale_vhost_user", "VM path: vale"), ("vale_vhost_user_busy", "VM path: vale polling"),
                   ("dpdk_vhost", "VM path: DPDK vhost PMD io")]
        labels = [f"{r['layout']}\n{r['frame_len']} B" for r in rows]
        fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(rows)), 4.2))
        w = 0.8 / len(systems)
        for i, (k, label) in enumerate(systems):
            xs = [j + i * w for j, r in enumerate(rows) if r.get(k)]
            if not xs:
                continue
            ms = [r[k]["median"]["median"] for r in rows if r.get(k)]
            lo = [r[k]["median"]["median"] - r[k]["median"]["min"] for r in rows if r.get(k)]
            hi = [r[k]["median"]["max"] - r[k]["median"]["median"] for r in rows if r.get(k)]
            ax.bar(xs, ms, width=w, yerr=[lo, hi], capsize=2, label=label)
        ax.set_xticks([j + w * (len(systems) - 1) / 2 for j in range(len(rows))], labels, fontsize=8)
        # One run stuck on a crowded CPU (a polling middle's may take ms) would flatten the rest:
        # the axis stops above the largest median, such a bar's whisker runs off the top.
        top = max(r[k]["median"]["median"] for r in rows for k, _ in systems if r.get(k))
        ax.set_ylim(0, 1.5 * top)
        ax.set_ylabel("median round-trip time, us (bars: runs' min-max)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
        title(ax, f"Ping-pong, like with like; load average {d['loadavg']['start'][0]:.1f}", d)
        save(plt, fig, a.outdir, "latency_like.png", made)

    d = common.load_result(a.results, "modules")
    if d:
        rs = d["results"]
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.2))
        names = [r["module"] for r in rs]
        for i, r in enumerate(rs):
            m, err = bars(r["ratio_to_learning_per_run"])
            ax.bar(i, m, yerr=err, capsize=3, color="tab:blue")
        ax.axhline(0.75, ls="--", lw=0.8, color="gray")
        ax.axhline(0.5, ls=":", lw=0.8, color="gray")
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("rate / learning's, same run")
        ax.grid(alpha=0.3, axis="y")
        title(ax, "lookup modules, 60 B", d)
        cost = [r for r in rs if r.get("ns_per_frame")]
        for k, (traffic, colour) in enumerate([("one-flow", "tab:green"), ("65536-flows", "tab:red")]):
            bx.bar([i + 0.4 * k for i in range(len(cost))], [r["ns_per_frame"].get(traffic, 0) for r in cost],
                   width=0.4, label=traffic, color=colour)
        bx.set_yscale("log")
        bx.set_xticks([i + 0.2 for i in range(len(cost))], [r["module"] for r in cost], rotation=35, ha="right",
                      fontsize=8)
        bx.set_ylabel("ns per frame, the module call alone")
        bx.legend(fontsize=8)
        bx.grid(alpha=0.3, axis="y")
        title(bx, "cost of lookup()", d)
        save(plt, fig, a.outdir, "modules.png", made)

    if not made:
        sys.exit(f"no results in {a.results}: run bench/run_all.py (or an experiment) first")
    for path, size in made:
        print(f"{os.path.relpath(path)}: {size // 1024} KiB")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Rate vs batch size (VALE paper, figures 8, 9 and 10): switch, receiver and sender batches.

One sender (vale0:a) to one receiver (vale0:b), 60-byte frames by default. Three sweeps over
--batches (1 to 1024), each keeping the other two batches at 1024 as the paper does:
- switch: `vale-ctl set vale0 batch N`, frames valed gathers from a source ring per pass (fig. 8);
- rx: `vale-pktgen -f rx -b N`, frames the receiver reads per rxsync (fig. 9);
- tx: `vale-pktgen -f tx -b N`, frames the sender queues per txsync (fig. 10, top curve);
and with --tx-rx1 a fourth, the tx sweep with a receiver batch of 1 (fig. 10, bottom curve).
The Linux bridge has no batch knob: its rate at the same frame size, measured in the same run,
is the reference each figure is given as a ratio to.

    cargo build --release && bench/batch.py [--runs 5] [--seconds 1] [--batches 1,2,4,...,1024]
"""
import common, peers
from common import summary, ratio, mpps, fmt_ratio

BATCHES = "1,2,4,8,16,32,64,128,256,512,1024"
QUICK_BATCHES = "1,16,1024"
FULL = 1024


def main():
    ap = common.parser(__doc__, "batch", seconds=1.0)
    ap.add_argument("--batches", default=BATCHES, help=f"batch sizes, 1-1024 (default {BATCHES}; --quick: {QUICK_BATCHES})")
    ap.add_argument("--len", type=int, default=60, help="frame size in bytes (default 60)")
    ap.add_argument("--sweeps", default="switch,rx,tx", help="which sweeps, of switch, rx, tx (default all three)")
    ap.add_argument("--tx-rx1", action="store_true", help="also sweep the sender's batch with a receiver batch of 1")
    a = common.parse(ap)
    if a.quick and a.batches == BATCHES:
        a.batches = QUICK_BATCHES
    batches = common.int_list(a.batches)
    if any(not 1 <= b <= 1024 for b in batches):
        ap.error("batch sizes must be 1..1024")
    sweeps = [s for s in a.sweeps.split(",") if s]
    if any(s not in ("switch", "rx", "tx") for s in sweeps):
        ap.error("--sweeps takes switch, rx, tx")
    if a.tx_rx1:
        sweeps.append("tx_rx1")
    if not a.no_peers:
        common.need_root("bench/batch.py with the Linux bridge reference (use --no-peers for vale alone)")

    v = common.Valed(a.layout)
    results = []
    for sweep in sweeps:
        points = []
        for n in batches:
            sw, tx, rx = FULL, FULL, FULL
            if sweep == "switch":
                sw = n
            elif sweep == "rx":
                rx = n
            else:
                tx, rx = n, (1 if sweep == "tx_rx1" else FULL)
            v.set_batch(sw)
            runs = [v.run(a.len, a.seconds, tx_args=["-b", tx], rx_args=["-b", rx]) for _ in range(a.runs)]
            points.append({"batch": n, "switch_batch": sw, "tx_batch": tx, "rx_batch": rx,
                           "tx_pps": summary([x["tx"]["pps"] for x in runs]),
                           "rx_pps": summary([common.rx_pps(x) for x in runs]),
                           "rx_drops": summary([sum(y["drops"] for y in x["rx"]) for x in runs])})
            print(f"{sweep} batch {n}: rx {mpps(points[-1]['rx_pps'])} Mpps", flush=True)
        results.append({"sweep": sweep, "frame_len": a.len, "points": points})
    common.stop(v.proc, common.signal.SIGTERM)

    ref, setup = None, {"vale": f"vale-pktgen tx vale0:a -> valed -> vale-pktgen rx vale0:b, {a.len}-byte "
                                "broadcast frames; the batches not swept are 1024"}
    layout = {"vale": v.cpu_layout()}
    if not a.no_peers:
        b = peers.LinuxBridge()
        runs = [peers.trafgen_run(b, a.len, a.seconds) for _ in range(a.runs)]
        ref = {"frame_len": a.len, "rx_pps": summary([x["rx_pps"] for x in runs]),
               "tx_pps": summary([x["tx_pps"] for x in runs])}
        setup["linux_bridge"] = {**b.setup_note(), "sender": f"{peers.trafgen_version()}, -P 1"}
        layout["linux_bridge"] = {"tx": "0 (trafgen, taskset)", "switch": "kernel softirq", "rx": "kernel counter"}
        print(f"linux bridge {a.len} B: {mpps(ref['rx_pps'])} Mpps", flush=True)
    for r in results:
        for p in r["points"]:
            p["ratio_to_linux_bridge"] = ratio(p["rx_pps"], ref["rx_pps"]) if ref else None

    print(f"\nrate vs batch size, {a.len}-byte frames, {a.runs} runs of {a.seconds} s; layout {a.layout}: "
          f"valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, rx cpu {v.layout['rx']}")
    if ref:
        print(f"Linux bridge reference: {mpps(ref['rx_pps'], 3)} Mpps")
    rows = []
    for i, n in enumerate(batches):
        row = [n]
        for r in results:
            p = r["points"][i]
            row.append(f"{mpps(p['rx_pps'])} {fmt_ratio(p['ratio_to_linux_bridge'])}")
        rows.append(row)
    common.table(["batch"] + [f"{r['sweep']} sweep: rx Mpps (min-max) vale/bridge" for r in results], rows)
    common.write_report(a.out, "batch", a, layout, results, linux_bridge=ref, setup=setup,
                        ratio="median rx pps through vale / median rx pps through the Linux bridge")


if __name__ == "__main__":
    common.main_guard(main)

#!/usr/bin/env python3
"""Rate vs number of attached ports (mSwitch: a unicast packet costs the same whatever the ports).

Unicast from vale0:a to vale0:b while the switch holds 2, 16, 64, 254 or 1024 ports. The
extra ports are persistent ports made with `vale-ctl create vale0:pI` (in the switch's port
table, no client). The receiver runs `vale-pktgen -f rx --announce -S MAC` so the learning
bridge learns its MAC before the sender starts, and the sender sends to that MAC (-D): the
frames are forwarded, not flooded. After each count the extra ports' counters are checked:
`flooded` is the number of frames they were offered beyond the receivers' announcements
(should be 0). Each rate is also given as a ratio to the rate with 2 ports (target: >= 0.9
with 1024). No peer: a Linux bridge or OVS with 1024 veth ports is not built here.

    cargo build --release && bench/ports.py [--runs 5] [--seconds 1.5] [--ports 2,16,64,254,1024]
"""
import time

import common
from common import summary, mpps, fmt_ratio

PORTS = "2,16,64,254,1024"


def main():
    ap = common.parser(__doc__, "ports", seconds=1.5, peers=False)
    ap.add_argument("--ports", default=PORTS, help=f"numbers of ports on the switch, 2-2048, rising (default {PORTS})")
    ap.add_argument("--sizes", default="60", help="frame sizes (default 60)")
    a = common.parse(ap)
    counts, sizes = common.int_list(a.ports), common.int_list(a.sizes)
    if counts != sorted(counts) or any(not 2 <= n <= 2048 for n in counts):
        ap.error("--ports must be rising numbers in 2..2048")

    v = common.Valed(a.layout)
    rx_mac = common.mac_of(1)
    results, made = [], 0
    for n in counts:
        t0 = time.monotonic()
        while made < n - 2:
            made += 1
            v.ctl("create", f"vale0:p{made}")
        create_s = time.monotonic() - t0
        for s in sizes:
            before = v.ports()
            runs = [v.run(s, a.seconds, dst=rx_mac, announce=True) for _ in range(a.runs)]
            after = v.ports()
            extra = [f"vale0:p{i}" for i in range(1, made + 1)]
            offered = sum((after[p]["counters"]["rx_packets"] + after[p]["counters"]["rx_drops"])
                          - (before[p]["counters"]["rx_packets"] + before[p]["counters"]["rx_drops"]) for p in extra)
            listed = max(x["ports_listed"] for x in runs)   # the sender's port included
            results.append({
                "ports": n, "ports_listed": listed, "frame_len": s,
                "tx_pps": summary([x["tx"]["pps"] for x in runs]),
                "rx_pps": summary([common.rx_pps(x) for x in runs]),
                "rx_drops": summary([sum(y["drops"] for y in x["rx"]) for x in runs]),
                "flooded": offered - a.runs * len(extra),   # one announcement per run per extra port
                "create_seconds": create_s,
            })
            print(f"{n} ports ({listed} listed), {s} B: {mpps(results[-1]['rx_pps'])} Mpps, "
                  f"flooded {results[-1]['flooded']}", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    for r in results:
        base = next(x for x in results if x["frame_len"] == r["frame_len"])
        r["ratio_to_fewest_ports"] = common.ratio(r["rx_pps"], base["rx_pps"])

    print(f"\nrate vs attached ports (unicast a -> b), {a.runs} runs of {a.seconds} s; layout {a.layout}: "
          f"valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, rx cpu {v.layout['rx']}")
    common.table(["ports", "len", "rx Mpps (min-max)", f"vs {counts[0]} ports", "flooded", "create s"],
                 [[r["ports"], r["frame_len"], mpps(r["rx_pps"]), fmt_ratio(r["ratio_to_fewest_ports"]),
                   r["flooded"], f"{r['create_seconds']:.2f}"] for r in results])
    common.write_report(a.out, "ports", a, {"vale": v.cpu_layout()}, results,
                        setup={"vale": "vale-pktgen tx vale0:a -D <b's MAC> -> valed -> vale-pktgen rx vale0:b "
                                       "--announce; extra ports: persistent (vale-ctl create), no client"},
                        ratio="median rx pps with N ports / median rx pps with the fewest ports")


if __name__ == "__main__":
    common.main_guard(main)

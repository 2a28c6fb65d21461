#!/usr/bin/env python3
"""One sender to one receiver through a vale switch: rate by frame size, median of N runs.

Starts a valed of its own, then for each frame size runs `vale-pktgen -f rx` on vale0:b and
`vale-pktgen -f tx` on vale0:a for --seconds, N times, each process pinned as --layout says.
Prints a table and writes JSON (sizes, runs, medians, min, max, CPU layout, date, machine).
bench/sizes.py is the same experiment with more sizes and the peers; this one stays for
bench/compare.py.

    cargo build --release && bench/two_ports.py [--runs 5] [--seconds 3] [--sizes 60,1514]
"""
import common
from common import summary


def main():
    ap = common.parser(__doc__, "two_ports", seconds=3.0, peers=False)
    ap.add_argument("--sizes", default="60,1514", help="frame sizes, 60-9000 (default 60,1514)")
    ap.add_argument("--workers", type=int, default=1, help="valed worker threads (default 1)")
    a = common.parse(ap)
    v = common.Valed(a.layout, a.workers)
    results = []
    for size in common.int_list(a.sizes):
        runs = [v.run(size, a.seconds) for _ in range(a.runs)]
        results.append({"frame_len": size, "tx_pps": summary([x["tx"]["pps"] for x in runs]),
                        "rx_pps": summary([common.rx_pps(x) for x in runs])})
    common.stop(v.proc, common.signal.SIGTERM)
    lay = v.layout
    print(f"two ports, {a.runs} runs of {a.seconds} s, layout {a.layout}: valed cpu {lay['valed']}, "
          f"tx cpu {lay['tx']}, rx cpu {lay['rx']}")
    common.table(["len", "tx Mpps (min-max)", "rx Mpps (min-max)", "rx Gbit/s"],
                 [[r["frame_len"], common.mpps(r["tx_pps"]), common.mpps(r["rx_pps"]),
                   f"{r['rx_pps']['median'] * r['frame_len'] * 8 / 1e9:.2f}"] for r in results])
    common.write_report(a.out, "two_ports", a, v.cpu_layout(), results)


if __name__ == "__main__":
    common.main_guard(main)

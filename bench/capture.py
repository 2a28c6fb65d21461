#!/usr/bin/env python3
"""What capturing a port costs its stream: `vale-ctl capture` on the sender's port.

One sender (vale0:a) to one receiver (vale0:b), 60-byte frames by default, in runs of three
modes taken in turn (so that a busy machine hurts them alike):
- none: no capture;
- reading: `vale-ctl capture vale0:a --dir tx -w /dev/null`, a reader that keeps up as best
  it can (what it cannot take is counted as capture drops);
- stopped: the same into a pipe nobody reads: the reader stops once the pipe is full, and
  every frame after that is a capture drop.
The figure is the receiver's rate in each mode, and its ratio to the rate with no capture.
The capture reader runs on the clients' CPUs.

    cargo build --release && bench/capture.py [--runs 5] [--seconds 2] [--len 60]
"""
import subprocess

import common
from common import summary, ratio, mpps

MODES = ("none", "reading", "stopped")


def main():
    ap = common.parser(__doc__, "capture", seconds=2.0, peers=False)
    ap.add_argument("--len", type=int, default=60, help="frame size in bytes (default 60)")
    a = common.parse(ap)
    v = common.Valed(a.layout)
    runs = {m: [] for m in MODES}
    drops = {m: [] for m in MODES}
    for i in range(a.runs):
        for m in MODES:
            cap = None
            if m != "none":
                out = subprocess.DEVNULL if m == "reading" else subprocess.PIPE
                cap = common.spawn(["taskset", "-c", v.layout["rx"], f"{common.BIN}/vale-ctl", "--run-dir",
                                    v.run_dir, "capture", "vale0:a", "--dir", "tx", "-w", "-"],
                                   stdout=out, stderr=subprocess.PIPE, text=True)
                common.time.sleep(0.3)
            try:
                r = v.run(a.len, a.seconds)
            finally:
                if cap:
                    common.stop(cap)
            if cap:
                if m == "stopped":
                    cap.stdout.close()
                err = cap.stderr.read()
                words = err.split()
                d = int(words[words.index("dropped") - 1]) if "dropped" in words else None
                drops[m].append(d)
            runs[m].append(r)
            print(f"run {i + 1} {m}: rx {common.rx_pps(r) / 1e6:.2f} Mpps", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    results = []
    base = summary([common.rx_pps(x) for x in runs["none"]])
    for m in MODES:
        s = summary([common.rx_pps(x) for x in runs[m]])
        results.append({"mode": m, "frame_len": a.len, "rx_pps": s,
                        "tx_pps": summary([x["tx"]["pps"] for x in runs[m]]),
                        "capture_drops": drops[m] or None,
                        "ratio_to_none": ratio(s, base)})
    print(f"\ncapture cost, {a.len}-byte frames, {a.runs} runs of {a.seconds} s; layout {a.layout}: "
          f"valed cpu {v.layout['valed']}, tx cpu {v.layout['tx']}, rx and reader cpu {v.layout['rx']}")
    common.table(["capture of vale0:a tx", "rx Mpps median (min-max)", "vs none"],
                 [[r["mode"], mpps(r["rx_pps"]), f"{r['ratio_to_none']:.2f}"] for r in results])
    common.write_report(a.out, "capture", a, {"vale": v.cpu_layout()}, results,
                        setup={"vale": "vale-pktgen tx vale0:a -> valed -> vale-pktgen rx vale0:b, "
                               "with vale-ctl capture vale0:a --dir tx (none, reading to /dev/null, "
                               "stopped: into a pipe nobody reads)"},
                        ratio="median rx pps with the capture / median rx pps with none")


if __name__ == "__main__":
    common.main_guard(main)

#!/usr/bin/env python3
"""What one user's capture filters cost another user's stream.

A checked stream: vale-pktgen sends --frames 60-byte frames at --rate from vale0:a to vale0:b,
whose receiver counts them; the lost ones are the figure. Beside it, in each mode:
- alone: nothing else;
- senders: --senders vale-pktgen senders at full speed from ports of a switch of their own
  (vale1:p0..), frames to nowhere;
- filters: the same senders, each port with --captures captures (`vale-ctl capture --dir tx`)
  whose filter, a tcpdump expression of --terms `len = N` tests that no frame passes, compiles
  to about 1.7 instructions a term (libpcap) and rejects every frame.
Modes run in turn, --runs times. valed has one worker: every port shares it. The captures'
budget drops (frames their filters had no budget for) are read from vale-ctl's summary.

    cargo build --release && bench/capture_filters.py [--runs 3] [--frames 3000000] [--rate 200000]
"""
import subprocess
import tempfile

import common

MODES = ("alone", "senders", "filters")


def main():
    ap = common.parser(__doc__, "capture_filters", runs=3, peers=False)
    ap.add_argument("--frames", type=int, default=3_000_000, help="frames of the checked stream")
    ap.add_argument("--rate", type=int, default=200_000, help="its rate, frames a second")
    ap.add_argument("--senders", type=int, default=4, help="ports sending beside it (default 4)")
    ap.add_argument("--captures", type=int, default=8, help="captures per sending port (default 8)")
    ap.add_argument("--terms", type=int, default=950, help="`len = N` tests in each filter (default 950)")
    a = common.parse(ap)
    if a.quick:
        a.frames = min(a.frames, 200_000)
    seconds = a.frames / a.rate
    expr = " or ".join(f"len = {2000 + i}" for i in range(a.terms))
    v = common.Valed(a.layout)
    v.ctl("create", "vale0:b")
    lost = {m: [] for m in MODES}
    budget_drops = []
    for i in range(a.runs):
        for m in MODES:
            procs = []
            if m != "alone":
                for s in range(a.senders):
                    port = f"vale1:p{s}"
                    v.ctl("create", port)
                    if m == "filters":
                        for _ in range(a.captures):
                            procs.append(common.spawn(
                                ["taskset", "-c", v.layout["rx"], f"{common.BIN}/vale-ctl", "--run-dir",
                                 v.run_dir, "capture", port, "--dir", "tx", "-w", "/dev/null", expr],
                                stderr=subprocess.PIPE, text=True))
                    procs.append(common.spawn(v.pktgen(port, "tx", v.layout["tx"], "-l", 60, "-T",
                                                       seconds + 60), env=v.env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                common.time.sleep(1.0)
            log = tempfile.TemporaryFile(mode="w+")
            rx = common.spawn(v.pktgen("vale0:b", "rx", v.layout["rx"], "-T", seconds + 60, "-n", a.frames),
                              env=v.env, stdout=subprocess.PIPE, stderr=log, text=True)
            try:
                v.wait_ports(["vale0:b"])
                tx = subprocess.run(v.pktgen("vale0:a", "tx", v.layout["tx"], "-l", 60, "-n", a.frames,
                                             "-R", a.rate), env=v.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, timeout=seconds + 60,
                                    stdin=subprocess.DEVNULL)
                if tx.returncode != 0:
                    raise RuntimeError(f"vale-pktgen tx failed: {tx.stderr.strip()[-2000:]}")
                common.time.sleep(0.5)
            finally:
                common.stop(rx)
                drops = 0
                for p in procs:
                    common.stop(p)
                    if p.stderr:
                        words = p.stderr.read().split()
                        if "budget)" in words:
                            drops += int(words[words.index("over") - 1])
                for s in range(a.senders if m != "alone" else 0):
                    v.ctl("destroy", f"vale1:p{s}")
            got = common.pktgen_reports([(rx, log)], "rx")[0]["packets"]
            lost[m].append(a.frames - got)
            if m == "filters":
                budget_drops.append(drops)
            print(f"run {i + 1} {m}: lost {a.frames - got} of {a.frames}"
                  + (f"; capture budget drops {drops}" if m == "filters" else ""), flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    results = [{"mode": m, "lost": lost[m], "lost_median": common.summary(lost[m])} for m in MODES]
    print(f"\nframes lost of {a.frames} at {a.rate} f/s, {a.runs} runs; {a.senders} senders, "
          f"{a.captures} captures each, {a.terms}-term filters; layout {a.layout}")
    common.table(["beside the stream", "lost, each run"], [[r["mode"], " ".join(map(str, r["lost"]))]
                                                            for r in results])
    common.write_report(a.out, "capture_filters", a, {"vale": v.cpu_layout()}, results,
                        budget_drops=budget_drops,
                        setup={"vale": "vale-pktgen tx vale0:a -> valed -> vale-pktgen rx vale0:b, with "
                               "senders on vale1 and filtered captures of their ports"})


if __name__ == "__main__":
    common.main_guard(main)

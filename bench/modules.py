#!/usr/bin/env python3
"""Rate per lookup module (issue: modular switching logic), and the cost of the module call.

One sender (vale0:a) to one receiver (vale0:b) at 60 bytes, the switch's lookup module set
in turn to: learning (the default), hub, vlan, flow with 10, 1000 and 100000 rules, flow
under two many-masks rule sets (1024 distinct masks each: the "tuple space explosion"),
and the C example module of examples/c-lookup (static_port, to=vale0:b). `flow-masks`
puts its prefixes where the stream's addresses never begin (prefix tracking skips every
table); `flow-masks-adversarial` puts them on the stream's own addresses and misses only by
the UDP destination port, so that a frame whose addresses vary (`--vary saddr`) still
probes hundreds of tables: the worst case, measured. The modules take turns
within each run, so every figure has a learning figure of the same run beside it: the
ratio to learning is what to quote on a shared machine.

The flow rule sets are those of `bench_rules` in crates/vale-switch/src/lookup/flow.rs: N-1
rules in four shapes (udp host+port, tcp source host, /24 networks, udp source host+port)
over addresses the stream never uses, above the stream's own rule (udp 10.0.0.1 -> 10.0.0.2
port 4321, output:vale0:b), so a frame of the stream would visit every mask. vale-pktgen
sends one flow, so the flow module decides it once a batch run (a repeat of the previous
frame's key) and the rate shows the per-frame parse; the cost of a search that misses every
cache is measured by the module-call benchmark below, with 65536 distinct flows, and by the
rates with `--flows 65536` (vale-pktgen --flows: the stream's UDP source port takes 65536
values in turn, so the stream's rule still matches every frame but no cache does; with
`--vary saddr` its IPv4 source address does instead, which the many-masks sets look at).

The module-call cost (ns a frame, the module alone, batches of 512 from memory) comes from
`cargo test --release -p vale-switch --lib lookup_cost -- --ignored` (--no-cost: skip it).

    cargo build --release && bench/modules.py [--runs 3] [--seconds 2] [--flows 65536 [--vary saddr]]
"""
import json
import os
import subprocess
import tempfile

import common
from common import summary, ratio, mpps, fmt_ratio


def bench_rules(shape, n, to="vale0:b"):
    """The same text as bench_rules() of crates/vale-switch/src/lookup/flow.rs."""
    out = []
    ip = lambda i: f"{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
    if shape in ("masks", "masks-adversarial"):
        src, dst, tail = (("245.255.255.254", "245.255.255.253", "") if shape == "masks"
                          else ("10.0.0.1", "10.0.0.2", ",tp_dst=9"))
        for a in range(1, 33):
            for b in range(1, 33):
                out.append(f"prio=100 udp,nw_src={src}/{a},nw_dst={dst}/{b}{tail} actions=drop")
    else:
        for i in range(max(n - 1, 0)):
            k = i % 4
            if k == 0:
                out.append(f"prio=100 udp,nw_dst=11.{ip(i)},tp_dst={1000 + i % 1000} actions=drop")
            elif k == 1:
                out.append(f"prio=90 tcp,nw_src=12.{ip(i)},tp_dst=80 actions=drop")
            elif k == 2:
                out.append(f"prio=80 ip,nw_dst=13.{ip((i & ~255) | (i >> 2 & 255))}/24 actions=drop")
            else:
                out.append(f"prio=70 udp,nw_src=14.{ip(i)},tp_src={1 + i % 60000} actions=drop")
    out.append(f"prio=50 udp,nw_dst=10.0.0.2,tp_dst=4321 actions=output:{to}")
    return "\n".join(out) + "\n"


def build_c_example(tmp):
    so = os.path.join(tmp, "libstatic_port.so")
    common.sh(["cc", "-std=c11", "-O2", "-shared", "-fPIC", "-I", os.path.join(common.ROOT, "crates/vale-switch/include"),
               os.path.join(common.ROOT, "examples/c-lookup/static_port.c"), "-o", so])
    return so


def module_cost():
    """{(module, traffic): ns a frame} from the lookup_cost measurement."""
    p = subprocess.run(["cargo", "test", "--release", "-q", "-p", "vale-switch", "--lib", "lookup_cost", "--",
                        "--ignored", "--nocapture"], cwd=common.ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"lookup_cost failed: {p.stderr[-2000:]}")
    out = []
    for line in p.stdout.splitlines():
        if line.startswith("LOOKUP_COST "):
            out.append(json.loads(line[len("LOOKUP_COST "):]))
    return out


def main():
    ap = common.parser(__doc__, "modules", runs=3, seconds=2.0, peers=False)
    ap.add_argument("--no-cost", action="store_true", help="skip the module-call measurement (cargo test)")
    ap.add_argument("--flows", type=int, default=1, help="flows of the stream (vale-pktgen --flows; default 1)")
    ap.add_argument("--vary", choices=["sport", "saddr"], default="sport",
                    help="what tells the flows apart (vale-pktgen --vary): UDP source port or IPv4 source address")
    a = common.parse(ap)
    tmp = tempfile.mkdtemp(prefix="vale-modules-")
    common.on_exit(lambda: common.shutil.rmtree(tmp, ignore_errors=True))
    files = {}
    for name, shape, n in [("flow-10", "flow", 10), ("flow-1000", "flow", 1000), ("flow-100000", "flow", 100000),
                           ("flow-masks", "masks", 0), ("flow-masks-adversarial", "masks-adversarial", 0)]:
        files[name] = os.path.join(tmp, f"{name}.rules")
        with open(files[name], "w") as f:
            f.write(bench_rules(shape, n))
    so = build_c_example(tmp)
    modules = [
        ("learning", ["learning"]),
        ("hub", ["hub"]),
        ("vlan", ["vlan"]),
        ("flow-10", ["flow", "--rules", files["flow-10"]]),
        ("flow-1000", ["flow", "--rules", files["flow-1000"]]),
        ("flow-100000", ["flow", "--rules", files["flow-100000"]]),
        ("flow-masks", ["flow", "--rules", files["flow-masks"]]),
        ("flow-masks-adversarial", ["flow", "--rules", files["flow-masks-adversarial"]]),
        ("c-example", [so, "--arg", "to=vale0:b"]),
    ]
    v = common.Valed(a.layout)
    runs = {m: [] for m, _ in modules}
    counters = {}
    for r in range(a.runs):
        for name, args in modules:
            v.ctl("lookup", "vale0", *args)
            x = v.run(60, a.seconds, tx_args=("--flows", a.flows, "--vary", a.vary))
            runs[name].append(x)
            counters[name] = json.loads(v.ctl("lookup", "vale0", "--json"))["counters"]
            print(f"run {r + 1}/{a.runs} {name}: {common.rx_pps(x) / 1e6:.2f} Mpps", flush=True)
    common.stop(v.proc, common.signal.SIGTERM)
    cost = [] if a.no_cost else module_cost()
    learning = summary([common.rx_pps(x) for x in runs["learning"]])
    results = []
    for name, _ in modules:
        rx = summary([common.rx_pps(x) for x in runs[name]])
        # Per run, against learning's figure of the same run.
        per_run = [common.rx_pps(x) / common.rx_pps(l) for x, l in zip(runs[name], runs["learning"])]
        results.append({
            "module": name, "frame_len": 60,
            "tx_pps": summary([x["tx"]["pps"] for x in runs[name]]),
            "rx_pps": rx,
            "ratio_to_learning": ratio(rx, learning),
            "ratio_to_learning_per_run": summary(per_run),
            "module_counters": counters.get(name, []),
            "ns_per_frame": {c["traffic"]: c["ns_per_frame"] for c in cost if c["module"] == name},
        })
    print(f"modules, 60 B, {a.flows} flow(s) by {a.vary}, {a.runs} runs of {a.seconds} s, layout {a.layout}")
    common.table(["module", "rx Mpps (min-max)", "vs learning", "per-run ratio (min-max)",
                  "module ns/frame: one flow", "65536 flows"],
                 [[r["module"], mpps(r["rx_pps"]), fmt_ratio(r["ratio_to_learning"]),
                   f"{r['ratio_to_learning_per_run']['median']:.2f} ({r['ratio_to_learning_per_run']['min']:.2f}-"
                   f"{r['ratio_to_learning_per_run']['max']:.2f})",
                   r["ns_per_frame"].get("one-flow", "-"), r["ns_per_frame"].get("65536-flows", "-")]
                  for r in results])
    common.write_report(a.out, "modules", a, v.cpu_layout(), results, module_cost=cost,
                        setup=f"vale-pktgen tx vale0:a (60 B, {a.flows} udp flow(s) by {a.vary}, broadcast MAC) -> valed (module) -> "
                              "vale-pktgen rx vale0:b")


if __name__ == "__main__":
    common.main_guard(main)

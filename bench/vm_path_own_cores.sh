#!/usr/bin/env bash
# The VM path's checks that need a core per party, in one run of about 8 minutes: what a
# 2-vCPU machine cannot show (docs/benchmarks.md "VM path: a receiver on interrupts" and
# "Busy ping-pong: fewer cache-line waits").
#
#   bench/vm_path_own_cores.sh [A,B,C] [DPDK_DIR]
#
# A, B, C: three CPUs on distinct cores, the sender's, the middle's and the receiver's
# (default 2,3,4); DPDK_DIR: a relocatable DPDK folder (the peer bundle's; default: Debian's
# dpdk-dev). Binaries from VALE_BIN_DIR or target/release (valed, vale-ctl, vale-pktgen,
# vhost-paced, bare-copy). Needs root. JSONs into OUT (default bench/results), a log on
# standard output:
#
#   1. the floor: a bare index's round trip between the middle's CPU and each other one;
#   2. busy mode: ping, valed and pong busy on B, A, C (`bench/latency.py --variants busy`),
#      against the 2 µs target;
#   3. cycles a frame and each frame's delay, vale against the vhost PMD, the receiver on
#      interrupts (`--receiver sink`), 60 and 1514 B at 0.5-4 Mpps, kick moderation 200 µs
#      and 0.
set -euo pipefail
cd "$(dirname "$0")/.."
cpus=${1:-2,3,4}
dpdk=${2:-}
out=${OUT:-bench/results}
bin=${VALE_BIN_DIR:-target/release}
IFS=, read -r a b c <<< "$cpus"
if [[ -z "$a" || -z "$b" || -z "$c" || "$a" == "$b" || "$b" == "$c" || "$a" == "$c" ]]; then
    echo "usage: $0 [A,B,C] [DPDK_DIR]: three distinct CPUs" >&2
    exit 2
fi
dpdk_arg=()
[[ -n "$dpdk" ]] && dpdk_arg=(--dpdk "$dpdk")
mkdir -p "$out"
step() { echo "== $(date -u +%H:%M:%S) $*"; }

step "floor: bare-copy --rtt, $b with $a and with $c"
"$bin/bare-copy" --rtt --seconds 1 --cpus "$b,$a"
"$bin/bare-copy" --rtt --seconds 1 --cpus "$b,$c"

step "busy mode: valed on $b, ping on $a, pong on $c"
bench/latency.py --no-peers --like none --no-vm --variants busy --busy-cpus "$b,$a,$c" \
    --sizes 60,1514 --runs 5 --seconds 1 --out "$out/latency_busy_own.json"

for m in 200 0; do
    step "cycles a frame and delay, moderation $m"
    bench/vhost_user.py "${dpdk_arg[@]}" --cost --cpus "$cpus" --receiver sink --moderation "$m" \
        --runs 3 --seconds 1 --sizes 60,1514 --loads 0.5,1,2,4 --loss-limit 1 \
        --out "$out/vhost_user_cost_sink_m$m.json"
done
step done

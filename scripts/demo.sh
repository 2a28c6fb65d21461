#!/usr/bin/env bash
# Builds vale and runs the main job: a valed of its own, switch vale0 with two ports, 60-byte
# and 1514-byte traffic from vale0:a to vale0:b for a few seconds each, and what moved.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${SECONDS_EACH:-3}

cargo build --release --workspace --quiet
bin=target/release
run_dir=$(mktemp -d -t vale-demo.XXXXXX)
export VALE_RUN_DIR=$run_dir
cleanup() {
    kill "${rx_pid:-}" "${tx_pid:-}" 2>/dev/null || true
    [ -n "${valed_pid:-}" ] && kill "$valed_pid" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$run_dir"
}
trap cleanup EXIT

echo "== valed (run dir $run_dir)"
$bin/valed 2>"$run_dir/valed.log" &
valed_pid=$!
for _ in $(seq 100); do [ -S "$run_dir/valed.sock" ] && break; sleep 0.05; done

for len in 60 1514; do
    echo "== $len-byte frames, vale0:a -> vale0:b, $SECONDS_EACH s"
    $bin/vale-pktgen -i vale0:b -f rx -q -T $((SECONDS_EACH + 2)) &
    rx_pid=$!
    sleep 0.5
    $bin/vale-pktgen -i vale0:a -f tx -l "$len" -T "$SECONDS_EACH" &
    tx_pid=$!
    sleep $((SECONDS_EACH - 1))
    echo "-- the switch, mid-run:"
    $bin/vale-ctl list
    wait "$tx_pid" "$rx_pid"
done

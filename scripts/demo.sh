#!/usr/bin/env bash
# Builds vale and runs the main job: a valed of its own, switch vale0 with two ports, 60-byte
# and 1514-byte traffic from vale0:a to vale0:b for a few seconds each, and what moved. As root,
# also two network namespaces on TAP ports of switch vale1, pinging each other (installing
# iproute2 and iputils-ping when they are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${SECONDS_EACH:-3}

cargo build --release --workspace --quiet
bin=target/release
run_dir=$(mktemp -d -t vale-demo.XXXXXX)
export VALE_RUN_DIR=$run_dir
ns_tag="vale-demo-$$"
cleanup() {
    kill "${rx_pid:-}" "${tx_pid:-}" 2>/dev/null || true
    ip netns del "$ns_tag-1" 2>/dev/null || true
    ip netns del "$ns_tag-2" 2>/dev/null || true
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

# The namespace part needs root, iproute2 and ping: a fresh Debian has no ping, so root gets
# what is missing from Debian's packages; anyone else is told what to install.
if [ "$(id -u)" != 0 ]; then
    echo "== (TAP ports: run as root to see two namespaces on a switch)"
    exit 0
fi
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v ping >/dev/null 2>&1 || missing+=(iputils-ping)
if ((${#missing[@]})); then
    echo "== installing ${missing[*]} for the namespace part"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null; then
        echo "== (TAP ports skipped: could not install ${missing[*]})"
        exit 0
    fi
fi
echo "== two network namespaces on TAP ports vale1:h1 and vale1:h2"
for i in 1 2; do
    tap="vdemo$$-$i"
    tap=${tap:0:15}
    $bin/vale-ctl attach "vale1:h$i" --tap "$tap"
    ip netns add "$ns_tag-$i"
    ip link set "$tap" netns "$ns_tag-$i"
    ip -n "$ns_tag-$i" addr add "10.99.0.$i/24" dev "$tap"
    ip -n "$ns_tag-$i" link set "$tap" up
done
ip netns exec "$ns_tag-1" ping -c 3 -i 0.2 10.99.0.2
$bin/vale-ctl list vale1

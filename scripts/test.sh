#!/usr/bin/env bash
# Installs what the tests need, then builds vale and runs every test: unit tests, the
# end-to-end tests against a real valed, the tests of TAP and NIC ports with the Linux stack
# in network namespaces (these need root), the C ABI check, formatting and lints.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
# The TAP and NIC port tests: namespaces, veths, the Linux stack's own tools.
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
    else
        echo "test.sh: please install: ${need[*]}" >&2
        exit 1
    fi
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "test.sh: cargo (Rust 1.87 or newer) is needed: see README.md" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo fmt --all --check
cargo clippy --workspace --all-targets --release -- -D warnings
# The end-to-end tests run the binaries built here, from the same profile.
cargo build --release --workspace
cargo test --release --workspace

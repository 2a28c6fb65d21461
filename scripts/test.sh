#!/usr/bin/env bash
# Installs what the tests need, then builds vale and runs every test: unit tests, the
# end-to-end tests against a real valed, the tests of TAP and NIC ports with the Linux stack
# in network namespaces, of QEMU guests and of DPDK testpmd on vhost-user ports (these need
# root), the C ABI check, the Debian package (built from this build, installed into a
# directory of its own, run from there), formatting and lints.
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
# The BGP EVPN test: FRR's zebra and bgpd on each side of a tunnel.
[ -x /usr/lib/frr/bgpd ] || need+=(frr)
# The package test: scripts/package-deb.sh strips with binutils and packs with dpkg-deb; the
# C program finds the installed libvale through pkg-config; systemd-analyze verifies the unit
# (systemd is in most Debian images: installing it is skipped there).
command -v objdump >/dev/null 2>&1 || need+=(binutils)
command -v pkg-config >/dev/null 2>&1 || need+=(pkgconf)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# The capture tests read vale-ctl capture's files with the real readers.
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v tshark >/dev/null 2>&1 || need+=(tshark)
if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ]; then
        # tshark's package asks whether non-root users may capture: no (vale's captures
        # need no capture rights of the kernel's).
        echo "wireshark-common wireshark-common/install-setuid boolean false" |
            debconf-set-selections 2>/dev/null || true
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
    else
        echo "test.sh: please install: ${need[*]}" >&2
        exit 1
    fi
fi
# The guest tests: QEMU (TCG) boots Debian's kernel with an initramfs the tests build from
# busybox and the kernel's virtio modules. Kernel and busybox are unpacked (not installed) into
# the target dir: no bootloader hooks, and busybox-static would conflict with busybox.
guest="${CARGO_TARGET_DIR:-target}/guest"
guest_ok() { compgen -G "$guest/root/boot/vmlinuz-*" >/dev/null && [ -x "$guest/root/bin/busybox" ]; }
if ! command -v qemu-system-x86_64 >/dev/null 2>&1 || ! guest_ok; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        command -v qemu-system-x86_64 >/dev/null 2>&1 ||
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86
        if ! guest_ok; then
            # linux-image-amd64 names the current kernel package; take its image and the
            # virtio modules only.
            kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
            debs=$(mktemp -d)
            (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "$kpkg" busybox-static)
            rm -rf "$guest/root" && mkdir -p "$guest/root"
            dpkg-deb --fsys-tarfile "$debs/${kpkg}"_*.deb |
                tar -x -C "$guest/root" --wildcards './boot/vmlinuz-*' '*/drivers/virtio/virtio*.ko' '*/virtio_net.ko' '*failover.ko'
            dpkg -x "$debs"/busybox-static_*.deb "$guest/root"
            rm -rf "$debs"
        fi
    else
        echo "test.sh: the guest tests need root to install qemu-system-x86 and a kernel;" \
            "they will be skipped" >&2
    fi
fi
# The DPDK tests: testpmd (in dpdk-dev) with its virtio_user and ring mempool drivers, as a
# vhost-user front end without a VM, and its memif driver, as a memif client.
dpdk_ok() {
    command -v dpdk-testpmd >/dev/null 2>&1 &&
        compgen -G "/usr/lib/*/dpdk/pmds-*/librte_net_virtio.so*" >/dev/null &&
        compgen -G "/usr/lib/*/dpdk/pmds-*/librte_net_memif.so*" >/dev/null
}
if ! dpdk_ok; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            dpdk-dev librte-net-virtio23 librte-net-memif23 librte-mempool-ring23
    else
        echo "test.sh: the DPDK tests need root to install dpdk-dev; they will be skipped" >&2
    fi
fi
# install_quiet PACKAGE... -- UNIT...: installs packages whose system services the tests do not
# use (they start daemons of their own): the services are kept from starting at install
# (policy-rc.d), and where a booted systemd started them anyway, the UNITs are stopped and
# disabled.
install_quiet() {
    local pkgs=()
    while [ "$1" != -- ]; do pkgs+=("$1"); shift; done
    shift
    apt-get update -qq
    local policy=/usr/sbin/policy-rc.d own_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
    if [ -n "$own_policy" ]; then rm -f "$policy"; fi
    if [ -d /run/systemd/system ]; then
        systemctl disable --now "$@" >/dev/null 2>&1 || true
    fi
}
# The Open vSwitch interop tests (tests/tunnel_ovs.rs) run ovsdb-server and ovs-vswitchd of
# their own in network namespaces, with their own database and sockets: the package's system
# service is not needed (install_quiet).
if ! command -v ovs-vswitchd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        install_quiet openvswitch-switch -- openvswitch-switch ovs-vswitchd ovsdb-server
    else
        echo "test.sh: the Open vSwitch tests need root to install openvswitch-switch;" \
            "they will be skipped" >&2
    fi
fi
# The libvirt tests (tests/libvirt.rs) run a libvirtd and virtlogd of their own in mount and
# PID namespaces of their own, with their own configuration: the package's system services are
# not needed (install_quiet).
if ! command -v virsh >/dev/null 2>&1 || [ ! -x /usr/sbin/libvirtd ]; then
    if [ "$(id -u)" = 0 ]; then
        install_quiet libvirt-daemon-system libvirt-clients -- libvirtd libvirtd.socket \
            libvirtd-ro.socket libvirtd-admin.socket virtlogd virtlogd.socket \
            virtlogd-admin.socket virtlockd virtlockd.socket virtlockd-admin.socket libvirt-guests
    else
        echo "test.sh: the libvirt tests need root to install libvirt-daemon-system;" \
            "they will be skipped" >&2
    fi
fi
# The metrics test: a real Prometheus server scrapes valed --metrics (run with a temporary
# configuration and storage; the package's own service is not needed: install_quiet).
if ! command -v prometheus >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        install_quiet prometheus -- prometheus
    else
        echo "test.sh: the Prometheus test needs root to install prometheus; it will be skipped" >&2
    fi
fi
# The CNI tests (tests/cni.rs): podman with its CNI backend and runc, the reference plugins
# (host-local), and cnitool, built from its Go module into the target dir (only if missing).
# The tests give podman a configuration, storage and state of their own; the package's
# services are not needed.
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 ||
    [ ! -x /usr/lib/cni/host-local ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            podman runc containernetworking-plugins
    else
        echo "test.sh: the CNI tests need root to install podman, runc and" \
            "containernetworking-plugins; they will be skipped" >&2
    fi
fi
cnitool_dir="$(pwd)/${CARGO_TARGET_DIR:-target}/cnitool"
case "${CARGO_TARGET_DIR:-}" in /*) cnitool_dir="$CARGO_TARGET_DIR/cnitool" ;; esac
if [ ! -x "$cnitool_dir/cnitool" ]; then
    if command -v go >/dev/null 2>&1; then
        GOBIN="$cnitool_dir" go install github.com/containernetworking/cni/cnitool@v1.2.3 ||
            echo "test.sh: cannot build cnitool (no Go module proxy?); the cnitool test will" \
                "be skipped" >&2
    else
        echo "test.sh: no go to build cnitool; the cnitool test will be skipped" >&2
    fi
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "test.sh: cargo (Rust 1.89 or newer) is needed: see README.md" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo fmt --all --check
cargo clippy --workspace --all-targets --release -- -D warnings
# The end-to-end tests run the binaries built here, from the same profile.
cargo build --release --workspace
cargo test --release --workspace

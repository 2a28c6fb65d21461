#!/usr/bin/env bash
# Builds the Debian package of vale from the release build, with dpkg-deb only:
#
#     cargo build --release --workspace      # or: scripts/package-deb.sh --build
#     scripts/package-deb.sh [-o DIR]        # writes DIR/vale_<version>_<arch>.deb (DIR: target/debian)
#
# It packages what target/release holds (CARGO_TARGET_DIR is honoured; --from DIR names
# another directory of built binaries) and compiles nothing itself unless given --build, so
# the test suite packages the very build it tests.
# The package holds valed, vale-ctl and vale-pktgen; the CNI plugin vale-cni in /usr/lib/cni
# (docs/containers.md); libvale.so and libvale.a with vale.h,
# vale_lookup.h and libvale.pc; for netmap programs, libvale-netmap.so (preload or link),
# libnetmap.a (compiled here from crates/vale-netmap/c/nmport.c), the netmap headers under
# /usr/include/vale-netmap and vale-netmap.pc; the systemd unit valed.service (not enabled on install);
# /etc/default/valed, the options the unit gives valed; /etc/vale/valed.toml, the
# configuration (switches, ports, modules, knobs) valed applies at start; and the man pages, rendered from the
# binaries' own clap definitions (TOOL --write-man-pages DIR, crates/vale-man). The last line
# printed is the path of the package.
set -euo pipefail
cd "$(dirname "$0")/.."

out=""
build=0
from=""
while (($#)); do
    case "$1" in
    -o) out="$2"; shift 2 ;;
    --build) build=1; shift ;;
    --from) from="$2"; shift 2 ;;
    *) echo "usage: $0 [--build] [--from DIR] [-o DIR]" >&2; exit 2 ;;
    esac
done
target="${CARGO_TARGET_DIR:-target}"
out="${out:-$target/debian}"
rel="${from:-$target/release}"
if ((build)); then
    cargo build --release --workspace
fi
for f in valed vale-ctl vale-pktgen vale-cni libvale.so libvale.a libvale_netmap.so; do
    if [ ! -f "$rel/$f" ]; then
        echo "package-deb.sh: $rel/$f is missing: run cargo build --release --workspace (or --build)" >&2
        exit 1
    fi
done

version=$(awk '/^\[workspace.package\]/ {p = 1; next} /^\[/ {p = 0}
               p && $1 == "version" {gsub(/"/, "", $3); print $3; exit}' Cargo.toml)
arch=$(dpkg --print-architecture)
multiarch=$(cc -print-multiarch 2>/dev/null || true)
if [ -z "$multiarch" ]; then
    multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/vale-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
lib="$root/usr/lib/$multiarch"
install -d "$root/DEBIAN" "$root/usr/bin" "$lib/pkgconfig" "$root/usr/include" \
    "$root/usr/lib/systemd/system" "$root/etc/default" "$root/etc/vale" "$root/usr/share/doc/vale" \
    "$root/usr/share/man/man1" "$root/usr/share/man/man8" "$root/usr/lib/cni"

# The release profile keeps line tables for the benchmarks' profiles; the package does not.
for b in valed vale-ctl vale-pktgen; do
    install -m 755 "$rel/$b" "$root/usr/bin/$b"
    strip --strip-unneeded "$root/usr/bin/$b"
done
# Where containernetworking-plugins puts the reference plugins: runtimes look there.
install -m 755 "$rel/vale-cni" "$root/usr/lib/cni/vale-cni"
strip --strip-unneeded "$root/usr/lib/cni/vale-cni"
install -m 644 "$rel/libvale.so" "$lib/libvale.so"
strip --strip-unneeded "$lib/libvale.so"
install -m 644 "$rel/libvale.a" "$lib/libvale.a"
strip --strip-debug "$lib/libvale.a"
install -m 644 crates/libvale/include/vale.h crates/vale-switch/include/vale_lookup.h \
    "$root/usr/include/"
sed -e "s/@VERSION@/$version/" -e "s/@MULTIARCH@/$multiarch/" packaging/libvale.pc.in \
    >"$lib/pkgconfig/libvale.pc"
# netmap programs: the device library under the name netmap users link and preload, vale's
# libnetmap (plain C, like netmap's) and the headers, in a directory of their own so that they
# never shadow a real netmap's.
install -m 644 "$rel/libvale_netmap.so" "$lib/libvale-netmap.so"
strip --strip-unneeded "$lib/libvale-netmap.so"
cp -r crates/libvale/include/vale-netmap "$root/usr/include/vale-netmap"
chmod -R u=rwX,go=rX "$root/usr/include/vale-netmap"
cc -O2 -c -I crates/libvale/include/vale-netmap -o "$stage/nmport.o" crates/vale-netmap/c/nmport.c
ar rcs "$lib/libnetmap.a" "$stage/nmport.o"
sed -e "s/@VERSION@/$version/" -e "s/@MULTIARCH@/$multiarch/" packaging/vale-netmap.pc.in \
    >"$lib/pkgconfig/vale-netmap.pc"
install -m 644 packaging/valed.service "$root/usr/lib/systemd/system/valed.service"
install -m 644 packaging/valed.default "$root/etc/default/valed"
install -m 644 packaging/valed.toml "$root/etc/vale/valed.toml"
install -m 644 packaging/deb/copyright "$root/usr/share/doc/vale/copyright"
install -m 755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$root/DEBIAN/"
printf '%s\n' /etc/default/valed /etc/vale/valed.toml >"$root/DEBIAN/conffiles"

# Man pages from the same clap definitions as --help: valed in section 8, the tools in 1,
# dated by the last commit when there is one.
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && epoch=$(git log -1 --format=%ct 2>/dev/null); then
    export SOURCE_DATE_EPOCH="$epoch"
fi
"$rel/valed" --write-man-pages "$root/usr/share/man/man8" >/dev/null
"$rel/vale-ctl" --write-man-pages "$root/usr/share/man/man1" >/dev/null
"$rel/vale-pktgen" --write-man-pages "$root/usr/share/man/man1" >/dev/null
gzip -9n "$root"/usr/share/man/man*/*

# Depends: the newest glibc symbol version any shipped object needs, and libgcc_s (unwinding).
elves=("$root"/usr/bin/* "$root/usr/lib/cni/vale-cni" "$lib/libvale.so" "$lib/libvale-netmap.so")
glibc=$(objdump -T "${elves[@]}" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: vale
Version: $version
Architecture: $arch
Maintainer: vale developers <vale@localhost>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1
Section: net
Priority: optional
Description: software Ethernet switch in user space (VALE-style)
 vale connects processes, containers (TAP), NICs (AF_XDP, AF_PACKET) and virtual
 machines (vhost-user) on software switches at millions of packets per second, with no
 kernel module: netmap-compatible rings in shared memory and the batched forwarding of
 the VALE and mSwitch papers.
 .
 This package holds the daemon valed and its systemd unit, the control tool vale-ctl,
 the traffic tool vale-pktgen, the client library libvale (shared and static, C
 headers, pkg-config file), and for netmap programs libvale-netmap.so (preloaded, or
 linked), netmap-compatible headers and libnetmap.a.
CONTROL

mkdir -p "$out"
deb="$out/vale_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zgzip --build "$root" "$deb" >/dev/null
echo "$deb"

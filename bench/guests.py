#!/usr/bin/env python3
"""Two virtual machines talking TCP: through vale's vhost-user ports vs through QEMU's own TAP
devices on a Linux bridge, in the same run.

Both paths run the same two guests (QEMU under TCG, one vCPU and 256 MiB each, Debian's
kernel with a busybox initramfs, virtio-net with QEMU's default offloads: checksums, TSO,
merged rx buffers) and the same load, one TCP stream from g1 to g2 (`iperf3 -c -t SECONDS
-O 1`: the first second, slow start and TCG's first translations, is left out). The guests
are booted by target/release/guest-pair (the test harness's guests), fresh for each run:

- vale: a valed of our own with two vhost-user ports, vale0:g1 and vale0:g2, valed listening
  on their sockets; QEMU connects (`-netdev vhost-user`, guest RAM in shared memory). valed
  moves each frame from one guest's memory into the other's; TSO segments cross whole. The
  receiving port's counters (`vale-ctl list --json`) give the average frame size.
- bridge: what a host without vale runs here: QEMU `-netdev tap,...,vhost=off` (this kernel
  has no vhost-net) for each guest, both TAPs ports of a Linux bridge, all in a network
  namespace of its own (bridge-nf-call sysctls off there). QEMU's I/O thread moves the frames
  between the guest and its TAP; the kernel bridges them (GSO frames cross whole too).

Runs alternate, vale then bridge, --runs times; each path's figure is the median of its runs
(receiver's Gbit/s) with min and max; the ratio divides the medians. With --cpus A,B each
QEMU is pinned to a CPU of its own (and --valed-cpus pins valed); by default nothing is
pinned: on a 2-vCPU machine both QEMUs (each a TCG vCPU thread and an I/O thread), valed and
the kernel's bridge share the two vCPUs. Needs root (namespaces, TAP devices, apt-get);
installs qemu-system-x86, iperf3 and iproute2 if missing, and unpacks a kernel and busybox
into target/guest/root as scripts/test.sh does. Everything it starts or makes (QEMU, valed,
the namespace with its bridge and TAPs, sockets, temporary directories) goes on exit, on an
error, on Ctrl-C and on SIGTERM. About 2.5 minutes with the defaults (a boot takes 5-15 s), 1 with
--quick.

    cargo build --release && bench/guests.py [--runs 5] [--seconds 5] [--cpus A,B] [--moderation US]
"""
import glob, json, os, shutil, subprocess, tempfile, time

import common
from common import sh, summary, ratio, fmt_ratio, on_exit
from host_ports import Namespaces, gbps

GUEST_PAIR = os.path.join(common.BIN, "guest-pair")
GUEST_ROOT = os.path.join(common.ROOT, "target", "guest", "root")
PORTS = ["vale0:g1", "vale0:g2"]
BRIDGE_SYSCTLS = ["net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0",
                  "net.bridge.bridge-nf-call-arptables=0", "net.ipv6.conf.all.disable_ipv6=1",
                  "net.ipv6.conf.default.disable_ipv6=1"]


def ensure_guest_kit():
    """QEMU, iperf3 and ip on the host; a kernel with virtio modules and a static busybox in
    target/guest/root (unpacked from Debian's packages, not installed) unless there is one."""
    common.ensure_packages(["qemu-system-x86_64", "iperf3", "ip"], ["qemu-system-x86", "iperf3", "iproute2"])
    if glob.glob(os.path.join(GUEST_ROOT, "boot", "vmlinuz-*")) and os.path.exists(
            os.path.join(GUEST_ROOT, "bin", "busybox")):
        return
    print("unpacking a kernel and busybox into target/guest/root", flush=True)
    deps = sh(["apt-cache", "depends", "linux-image-amd64"])
    kpkg = next(line.split()[1] for line in deps.splitlines() if "Depends: linux-image-" in line)
    debs = tempfile.mkdtemp(prefix="vale-bench-debs-")
    on_exit(lambda: shutil.rmtree(debs, ignore_errors=True))
    subprocess.run(["apt-get", "download", "-qq", "-o", "APT::Sandbox::User=root", kpkg, "busybox-static"],
                   cwd=debs, check=True, timeout=600, stdin=subprocess.DEVNULL)
    shutil.rmtree(GUEST_ROOT, ignore_errors=True)
    os.makedirs(GUEST_ROOT)
    deb = glob.glob(os.path.join(debs, f"{kpkg}_*.deb"))[0]
    fsys = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", GUEST_ROOT, "--wildcards", "./boot/vmlinuz-*",
                    "*/drivers/virtio/virtio*.ko", "*/virtio_net.ko", "*failover.ko"],
                   stdin=fsys.stdout, check=True, timeout=600)
    fsys.wait()
    sh(["dpkg", "-x", glob.glob(os.path.join(debs, "busybox-static_*.deb"))[0], GUEST_ROOT], timeout=600)


class ValePath:
    """valed with two vhost-user ports; valed listens on their sockets."""
    name = "vale"

    def __init__(self, valed_cpus=None, moderation_us=0):
        self.v = common.Valed("shared", cpus=valed_cpus or f"0-{os.cpu_count() - 1}", persistent=False)
        self.socks = [os.path.join(self.v.run_dir, f"g{i + 1}.sock") for i in range(2)]
        for port, sock in zip(PORTS, self.socks):
            self.v.ctl("attach", port, "--vhost-user", sock)
            if moderation_us:
                self.v.ctl("set", port, "moderation", str(moderation_us))

    def args(self, n):
        return ["--path", "vale", "--vhost-user", ",".join(self.socks), "--run-dir", self.v.run_dir,
                "--ports", ",".join(PORTS), "--valed-pid", str(self.v.pid)]

    def settle(self):
        """Waits until the last run's guests are gone from both ports."""
        deadline = time.monotonic() + 10
        while any(self.v.ports()[p]["state"] != "down" for p in PORTS):
            if time.monotonic() > deadline:
                raise RuntimeError(f"ports still up after their guests left: {self.v.ports()}")
            time.sleep(0.05)


class BridgePath:
    """A namespace with bridge br0; each run's QEMUs make their TAPs there, guest-pair makes
    them ports of br0. The TAPs go with their QEMU."""
    name = "linux_bridge"

    def __init__(self):
        self.ns = Namespaces("vg")
        self.home = self.ns.add("br")
        sh(["ip", "netns", "exec", self.home, "sysctl", "-qw", *BRIDGE_SYSCTLS])
        sh(["ip", "-n", self.home, "link", "add", "br0", "type", "bridge", "stp_state", "0"])
        sh(["ip", "-n", self.home, "link", "set", "br0", "up"])

    def args(self, n):
        # Names of their own per run: no wait for the last run's TAPs to go.
        return ["--path", "bridge", "--netns", self.home, "--taps", f"vgtap{n}a,vgtap{n}b", "--bridge", "br0"]

    def settle(self):
        pass


def guest_pair(path, n, a):
    """A fresh pair of guests on `path` and one iperf3 run between them: guest-pair's report."""
    cmd = [GUEST_PAIR, *path.args(n), "--runs", "1", "--seconds", str(a.iperf_seconds),
           "--omit", str(a.omit)]
    if a.cpus:
        cmd += ["--cpus", a.cpus]
    if a.no_offloads:
        cmd += ["--no-offloads"]
    log = tempfile.TemporaryFile(mode="w+")
    # The guests' consoles and command sockets go under a directory of ours: removed at exit
    # even where guest-pair was killed.
    p = common.spawn(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ, TMPDIR=a.tmp))
    try:
        out, _ = p.communicate(timeout=180 + a.iperf_seconds * 20)
    except subprocess.TimeoutExpired:
        common.stop(p, common.signal.SIGKILL)
        out = ""
    if p.returncode != 0 or not out.strip():
        log.seek(0)
        raise RuntimeError(f"guest-pair {path.name} failed (exit {p.returncode}):\n{log.read()[-4000:]}")
    path.settle()
    return json.loads(out)


def rest_cpu(r):
    """CPU seconds the machine was busy during a run beyond the QEMUs and valed: interrupts and
    softirqs not charged to a process (the bridge's work may be there), and anything else that
    ran (a compiler, another benchmark)."""
    return r["machine_busy_s"] - sum(r["qemu_cpu_s"]) - (r.get("valed_cpu_s") or 0)


def path_summary(reports):
    """The figures of one path over its runs."""
    runs = [r for rep in reports for r in rep["runs"]]
    out = {
        "bps": summary([r["bits_per_second"] for r in runs]),
        "sender_bps": summary([r["sender_bits_per_second"] for r in runs]),
        "retransmits": summary([r["retransmits"] for r in runs]),
        # Bytes per frame the receiving guest's port (vale) or TAP (bridge) handed it.
        "rx_frame_bytes": summary([r["rx_bytes"] / r["rx_frames"] for r in runs if r.get("rx_frames")]),
        "qemu_cpu_s": summary([sum(r["qemu_cpu_s"]) for r in runs]),
        "rest_cpu_s": summary([rest_cpu(r) for r in runs]),
        "boot_s": summary([max(rep["boot_s"]) for rep in reports]),
    }
    if any(r.get("valed_cpu_s") is not None for r in runs):
        out["valed_cpu_s"] = summary([r["valed_cpu_s"] for r in runs])
    if any(r.get("port_drops") is not None for r in runs):
        out["port_drops"] = summary([r["port_drops"] for r in runs])
    return out


def main():
    ap = common.parser(__doc__, "guests", runs=5, seconds=5.0, peers=False)
    ap.add_argument("--paths", default="vale,bridge", help="vale, bridge or both (default vale,bridge)")
    ap.add_argument("--omit", type=int, default=1,
                    help="seconds at the start of each iperf3 run left out of the figures (default 1)")
    ap.add_argument("--cpus", help="A,B: pin g1's QEMU to CPU A and g2's to CPU B (default: nothing pinned)")
    ap.add_argument("--moderation", type=int, default=0, metavar="US",
                    help="vale's ports' moderation knob (interrupts toward the guests; their kicks, which "
                         "Linux's virtio-net spaces by event indices; default 0: off)")
    ap.add_argument("--valed-cpus", help="CPU list for valed, taskset -c syntax (default: any)")
    ap.add_argument("--no-offloads", action="store_true",
                    help="the guests' virtio-net devices without checksum and segmentation offloads: every "
                         "TCP segment a frame of at most 1514 bytes (default: QEMU's offloads on)")
    a = common.parse(ap)
    a.iperf_seconds = max(1, round(a.seconds))    # iperf3 takes whole seconds
    paths = [p for p in a.paths.split(",") if p]
    if not paths or any(p not in ("vale", "bridge") for p in paths):
        ap.error("--paths takes vale, bridge or both")
    if a.cpus and len(common.int_list(a.cpus)) != 2:
        ap.error("--cpus takes two CPUs, A,B")
    common.need_root("bench/guests.py")
    ensure_guest_kit()
    if not os.path.exists(GUEST_PAIR):
        raise SystemExit(f"{GUEST_PAIR} missing: run cargo build --release first")

    ncpu = os.cpu_count()
    if a.cpus:
        cpus = common.int_list(a.cpus)
        note = (f"g1's QEMU on cpu{cpus[0]}, g2's on cpu{cpus[1]}; valed on "
                f"{'cpus ' + a.valed_cpus if a.valed_cpus else 'any CPU'}; the bridge in the kernel, "
                f"in softirq on the CPUs of the QEMUs")
    else:
        note = (f"nothing pinned: both QEMUs (each a TCG vCPU thread and an I/O thread), valed and the "
                f"kernel's bridge share the machine's {ncpu} vCPUs"
                + (f"; valed on cpus {a.valed_cpus}" if a.valed_cpus else ""))
    print(f"{common.machine()}\nlayout: {note}", flush=True)
    load0 = os.getloadavg()
    if load0[0] > 0.5:
        print(f"warning: load average {load0[0]:.2f} before the runs: something else is running, "
              f"the figures will move", flush=True)

    a.tmp = tempfile.mkdtemp(prefix="vale-bench-guests-")
    on_exit(lambda: shutil.rmtree(a.tmp, ignore_errors=True))
    made = {}
    if "vale" in paths:
        made["vale"] = ValePath(a.valed_cpus, a.moderation)
    if "bridge" in paths:
        made["bridge"] = BridgePath()
    reports = {p: [] for p in paths}
    t0 = time.monotonic()
    for n in range(a.runs):
        for p in paths:      # alternating: drifts of the machine hit both paths
            rep = guest_pair(made[p], n, a)
            rep["run"] = n + 1
            reports[p].append(rep)
            r = rep["runs"][0]
            size = f", {r['rx_bytes'] / r['rx_frames']:.0f} B per frame at g2" if r.get("rx_frames") else ""
            print(f"run {n + 1}/{a.runs} {p:>6}: {r['bits_per_second'] / 1e9:6.3f} Gbit/s, "
                  f"{r['retransmits']} retransmits"
                  + (f", {r['port_drops']} lost at the ports" if r.get("port_drops") is not None else "")
                  + f"{size}; CPU s: QEMUs {sum(r['qemu_cpu_s']):.1f}"
                  + (f", valed {r['valed_cpu_s']:.1f}" if r.get("valed_cpu_s") is not None else "")
                  + f", rest {rest_cpu(r):.1f} (guests booted in {max(rep['boot_s']):.1f} s)", flush=True)
    wall = time.monotonic() - t0

    results = {}
    keys = {"vale": "vale", "bridge": "linux_bridge"}
    for p in paths:
        results[keys[p]] = path_summary(reports[p])
    r = ratio(results.get("vale", {}).get("bps"), results.get("linux_bridge", {}).get("bps"))
    results["ratio"] = r
    names = {"vale": "vale, vhost-user ports", "linux_bridge": "Linux bridge, QEMU TAP (vhost=off)"}

    def frame(s):
        return "-" if not s else f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"

    print()
    common.table(["TCP g1 -> g2, one stream", "Gbit/s median (min-max)", "B/frame at g2", "vale / bridge"],
                 [[names[k], gbps(results[k]["bps"]), frame(results[k]["rx_frame_bytes"]),
                   fmt_ratio(r) if k == "vale" else ""] for k in names if k in results])
    print(f"layout: {note}")
    # More than a tenth of the machine busy with something else over a run: not a quiet run.
    limit = 0.1 * ncpu * (a.iperf_seconds + a.omit)
    noisy = [f"{p} run {rep['run']}" for p in paths for rep in reports[p] if rest_cpu(rep["runs"][0]) > limit]
    if noisy:
        print(f"warning: the machine was busy beyond the guests and valed (more than {limit:.1f} CPU s) in "
              f"{', '.join(noisy)}: something else ran; compare only quiet runs", flush=True)
    layout = {"name": "pinned" if a.cpus else "unpinned", "qemu": a.cpus.split(",") if a.cpus else None,
              "valed": a.valed_cpus, "valed_workers": 1, "note": note}
    load1 = os.getloadavg()
    common.write_report(
        a.out, "guests", a, layout, results,
        iperf_seconds=a.iperf_seconds, omit_seconds=a.omit, paths=paths, wall_seconds=round(wall, 1),
        noisy_runs=noisy,
        reports={keys[p]: reports[p] for p in paths},
        ratio="vale's median receiver Gbit/s / the Linux bridge's",
        setup={"guests": "QEMU -accel tcg -smp 1 -m 256, virtio-net-pci "
                         + ("without offloads" if a.no_offloads else "with QEMU's default offloads")
                         + " (vectors=0), Debian kernel, busybox initramfs with iperf3; a fresh pair per run",
               "vale": "valed --workers 1, vale0:g1 and vale0:g2 attached --vhost-user (valed listens, QEMU "
                       "reconnect=1), guest RAM memory-backend-memfd share=on",
               "linux_bridge": "QEMU -netdev tap,script=no,downscript=no,vhost=off in a namespace of its own; "
                               "both TAPs ports of bridge br0 (STP off), " + ", ".join(BRIDGE_SYSCTLS),
               "load": f"iperf3 -c G2 -t {a.iperf_seconds} -O {a.omit} -J in g1, one stream; receiver's "
                       "bits per second; runs alternate vale, bridge",
               "rx_frame_bytes": "bytes / frames handed to g2 during the run: vale0:g2's rx counters (vale), "
                                 "the TAP's tx counters (bridge)",
               "loadavg_before_after": [round(load0[0], 2), round(load1[0], 2)],
               "versions": {"qemu": sh(["qemu-system-x86_64", "--version"]).splitlines()[0],
                            "iperf3": sh(["iperf3", "--version"], check=False).splitlines()[0]}})


if __name__ == "__main__":
    common.main_guard(main)

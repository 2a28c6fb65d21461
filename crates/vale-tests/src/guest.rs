//! Linux guests under QEMU for tests that need a real virtual machine on a switch.
//!
//! A guest is Debian's kernel with an initramfs built here from a static busybox, the kernel's
//! virtio modules and (when the host has it) iperf3 with its libraries. Its `/init` loads the
//! modules, configures `eth0` from the kernel command line (`vale.ip=`, `vale.mac=`,
//! `vale.mtu=`) and then serves commands on its second serial port, which QEMU connects to a
//! socket of the test's: one command a line, run by the guest's shell; the answer is what it
//! printed, then a line `@@vale-guest-exit STATUS`. The first serial port is the console,
//! kept in a file whose tail explains a failed boot.
//!
//! QEMU runs under TCG (no KVM here), one vCPU, 256 MiB; a boot takes 5–15 s, two side by side
//! about as long as one. The network device is a virtio-net-pci on the netdev the caller names
//! (`tap,...` today, `vhost-user,...` with a shared memory backend later), so the same harness
//! serves every kind of port.
//!
//! `scripts/test.sh` unpacks the kernel and busybox into `target/guest/root`; an installed
//! kernel (`/boot`, `/lib/modules`) and a static busybox on the host serve as well. The
//! initramfs is built once per test run and cached under `target/guest`, keyed by its inputs.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{which, TempDir};

/// Bound of a guest's boot, from QEMU's start to the guest's ready line.
pub const BOOT_LIMIT: Duration = Duration::from_secs(60);

/// The modules virtio-net needs in Debian's kernel, in the order they load.
const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "failover",
    "net_failover",
    "virtio_net",
];

const READY: &str = "@@vale-guest-ready";
const EXIT: &str = "\n@@vale-guest-exit ";

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "vale-guest: $*"; poweroff -f; }
for m in MODULES; do
    insmod /lib/modules/$m.ko || fail "insmod $m failed"
done
for a in $(cat /proc/cmdline); do
    case $a in
    vale.ip=*) ip=${a#vale.ip=} ;;
    vale.mac=*) mac=${a#vale.mac=} ;;
    vale.mtu=*) mtu=${a#vale.mtu=} ;;
    esac
done
n=0
while [ ! -e /sys/class/net/eth0 ]; do
    n=$((n + 1)); [ $n -gt 100 ] && fail "no eth0"
    sleep 0.1
done
ip link set lo up
[ -n "$mac" ] && { ip link set eth0 address "$mac" || fail "bad MAC $mac"; }
[ -n "$mtu" ] && { ip link set eth0 mtu "$mtu" || fail "bad MTU $mtu"; }
[ -n "$ip" ] && { ip addr add "$ip" dev eth0 || fail "bad address $ip"; }
ip link set eth0 up || fail "eth0 does not come up"
exec 3<>/dev/ttyS1 || fail "no command port"
stty raw -echo <&3
echo "vale-guest: eth0 $ip up, serving commands"
echo "READY" >&3
while IFS= read -r line <&3; do
    sh -c "$line" </dev/null >/tmp/out 2>&1
    rc=$?
    cat /tmp/out >&3
    printf '\n@@vale-guest-exit %d\n' $rc >&3
done
fail "command port closed"
"#;

/// What a guest needs from the host: QEMU, a kernel with its virtio modules, busybox.
#[derive(Clone, Debug)]
pub struct Kit {
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub kernel_version: String,
    pub initramfs: PathBuf,
}

/// The kit, or why there is none. Built once per test process.
pub fn kit() -> Result<&'static Kit, String> {
    static KIT: OnceLock<Result<Kit, String>> = OnceLock::new();
    KIT.get_or_init(find_kit).as_ref().map_err(Clone::clone)
}

/// Whether guest tests can run here: `Some(reason)` when they must be skipped (not root, or
/// QEMU or a kernel missing outside CI). Under CI, as root, a missing piece fails the test:
/// `scripts/test.sh` installs them there.
pub fn skip_reason() -> Option<String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Some("guest tests need root (TAP devices, network namespaces)".into());
    }
    match kit() {
        Ok(_) => None,
        Err(e) if std::env::var_os("CI").is_none() => {
            Some(format!("{e} (scripts/test.sh installs what guests need)"))
        }
        Err(e) => panic!("guest tests cannot run under CI: {e}"),
    }
}

/// The target dir of the running test (`target/<profile>/deps/<test>` -> `target`) or
/// binary (`target/<profile>/<binary>` -> `target`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let mut dir = exe.parent().expect("profile dir");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("profile dir");
    }
    dir.parent().expect("target dir").to_path_buf()
}

fn find_kit() -> Result<Kit, String> {
    let qemu = which("qemu-system-x86_64").ok_or("qemu-system-x86_64 is not installed")?;
    let cache = target_dir().join("guest");
    let unpacked = cache.join("root");
    let (kernel, version, modules) = find_kernel(&unpacked)
        .or_else(|| find_kernel(Path::new("/")))
        .ok_or("no kernel with virtio modules (target/guest/root/boot or /boot)")?;
    let busybox = [unpacked.join("bin/busybox"), PathBuf::from("/bin/busybox")]
        .into_iter()
        .find(|p| is_static(p))
        .ok_or("no static busybox (target/guest/root/bin/busybox or /bin/busybox)")?;

    let mut files: Vec<(String, PathBuf)> = vec![("bin/busybox".into(), busybox)];
    for m in MODULES {
        files.push((format!("lib/modules/{m}.ko"), modules[*m].clone()));
    }
    if let Some(iperf3) = which("iperf3") {
        files.extend(with_libraries(&iperf3, "usr/bin/iperf3"));
    }
    let init = INIT
        .replace("MODULES", &MODULES.join(" "))
        .replace("READY", READY);

    // The cache key: this file (the init script and the archive's layout) and every file's
    // path, size and modification time.
    let mut h = DefaultHasher::new();
    include_str!("guest.rs").hash(&mut h);
    for (dst, src) in &files {
        dst.hash(&mut h);
        let md = std::fs::metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
        md.len().hash(&mut h);
        md.modified().ok().hash(&mut h);
    }
    let initramfs = cache.join(format!("initramfs-{version}-{:016x}.cpio", h.finish()));
    if !initramfs.exists() {
        std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        let cpio = build_cpio(&init, &files)?;
        // Written aside and renamed: test processes running at once each see a whole file.
        let tmp = cache.join(format!(".initramfs-{}.tmp", std::process::id()));
        std::fs::write(&tmp, cpio).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &initramfs).map_err(|e| format!("{}: {e}", initramfs.display()))?;
        // Archives of earlier inputs are of no more use.
        for e in std::fs::read_dir(&cache).into_iter().flatten().flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("initramfs-") && e.path() != initramfs {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(Kit {
        qemu,
        kernel,
        kernel_version: version,
        initramfs,
    })
}

/// `ldd` says a static binary is "not a dynamic executable" and fails.
fn is_static(p: &Path) -> bool {
    p.is_file()
        && Command::new("ldd")
            .arg(p)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| !s.success())
}

/// A kernel under `root/boot` whose `root/lib/modules/<version>` has every module of
/// [`MODULES`]: the image, its version and each module's file.
fn find_kernel(
    root: &Path,
) -> Option<(
    PathBuf,
    String,
    std::collections::HashMap<&'static str, PathBuf>,
)> {
    let mut images: Vec<PathBuf> = std::fs::read_dir(root.join("boot"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .collect();
    images.sort();
    images.into_iter().rev().find_map(|image| {
        let name = image.file_name()?.to_str()?;
        let version = name.strip_prefix("vmlinuz-")?.to_string();
        let mut found = std::collections::HashMap::new();
        walk(&root.join("lib/modules").join(&version), &mut |p| {
            let stem = p
                .file_name()
                .and_then(|n| n.to_str())?
                .strip_suffix(".ko")?;
            let m = MODULES.iter().find(|m| **m == stem)?;
            found.insert(*m, p.to_path_buf());
            Some(())
        });
        (found.len() == MODULES.len()).then_some((image, version, found))
    })
}

fn walk(dir: &Path, f: &mut impl FnMut(&Path) -> Option<()>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, f);
        } else {
            f(&p);
        }
    }
}

/// `binary` at `dst` and the libraries `ldd` names, each at the path `ldd` shows.
fn with_libraries(binary: &Path, dst: &str) -> Vec<(String, PathBuf)> {
    let mut out = vec![(dst.to_string(), binary.to_path_buf())];
    let Ok(o) = Command::new("ldd").arg(binary).output() else {
        return out;
    };
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        // "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            out.push((p.trim_start_matches('/').to_string(), PathBuf::from(p)));
        }
    }
    out
}

/// A newc cpio archive (the format the kernel unpacks as initramfs) with `/init`, `files`
/// (destination, source; symlinks followed), their directories and `/dev/console`.
fn build_cpio(init: &str, files: &[(String, PathBuf)]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut ino = 1u32;
    let mut entry = |out: &mut Vec<u8>, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]| {
        let hdr = format!(
            "070701{ino:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        ino += 1;
        out.extend_from_slice(hdr.as_bytes());
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.resize(out.len().next_multiple_of(4), 0);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(4), 0);
    };
    let mut dirs: Vec<String> = [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (dst, _) in files {
        let mut p = Path::new(dst).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.push(d.to_string_lossy().into_owned());
            p = d.parent();
        }
    }
    dirs.sort_by_key(|d| (d.matches('/').count(), d.clone()));
    dirs.dedup();
    for d in &dirs {
        entry(&mut out, d, 0o040755, (0, 0), &[]);
    }
    entry(&mut out, "dev/console", 0o020600, (5, 1), &[]);
    entry(&mut out, "init", 0o100755, (0, 0), init.as_bytes());
    for (dst, src) in files {
        let data = std::fs::read(src).map_err(|e| format!("{}: {e}", src.display()))?;
        entry(&mut out, dst, 0o100755, (0, 0), &data);
    }
    entry(&mut out, "TRAILER!!!", 0, (0, 0), &[]);
    Ok(out)
}

/// How to boot one guest.
#[derive(Clone, Debug)]
pub struct GuestConfig {
    /// Names the guest in errors.
    pub name: String,
    /// `-netdev` value without its id, e.g. `tap,ifname=NAME,script=no,downscript=no,vhost=off`
    /// or `vhost-user,chardev=c0` (give the chardev and memory backend in `extra`).
    pub netdev: String,
    /// More QEMU arguments: `-object memory-backend-memfd,id=mem,size=256M,share=on -numa
    /// node,memdev=mem` for vhost-user, say.
    pub extra: Vec<String>,
    /// eth0's address, CIDR.
    pub ip: String,
    /// eth0's MAC address.
    pub mac: String,
    /// eth0's MTU, if not the default.
    pub mtu: Option<u32>,
    /// Offer the device's checksum and segmentation offloads to the guest. Off, the guest
    /// sends and takes only finished frames of at most one MTU.
    pub offloads: bool,
    /// Network namespace QEMU runs in (where its TAP device appears).
    pub netns: Option<String>,
    /// CPUs QEMU (all its threads) may run on; empty: any.
    pub cpus: Vec<usize>,
    /// The guest's own CPUs (QEMU's `-smp`).
    pub smp: u32,
    /// More properties of the virtio-net device, e.g. `,mq=on,host_mtu=9000`.
    pub device: String,
}

impl GuestConfig {
    /// A guest on TAP device `tap` (QEMU creates it), offloads off.
    pub fn tap(name: &str, tap: &str, ip: &str, mac: &str) -> GuestConfig {
        GuestConfig {
            name: name.to_string(),
            netdev: format!("tap,ifname={tap},script=no,downscript=no,vhost=off"),
            extra: Vec::new(),
            ip: ip.to_string(),
            mac: mac.to_string(),
            mtu: None,
            offloads: false,
            netns: None,
            cpus: Vec::new(),
            smp: 1,
            device: String::new(),
        }
    }

    /// A guest whose device is a vhost-user device at socket `sock`, offloads on: QEMU
    /// connects to valed listening there, or, `server`, listens there itself for valed to
    /// connect.
    pub fn vhost_user(name: &str, sock: &Path, server: bool, ip: &str, mac: &str) -> GuestConfig {
        let role = if server {
            "server=on,wait=off"
        } else {
            "reconnect=1"
        };
        GuestConfig {
            name: name.to_string(),
            netdev: "vhost-user,chardev=c0".to_string(),
            extra: [
                "-chardev",
                &format!("socket,id=c0,path={},{role}", sock.display()),
                // vhost-user needs the guest's RAM in memory valed can map.
                "-object",
                "memory-backend-memfd,id=mem,size=256M,share=on",
                "-numa",
                "node,memdev=mem",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            ip: ip.to_string(),
            mac: mac.to_string(),
            mtu: None,
            offloads: true,
            netns: None,
            cpus: Vec::new(),
            smp: 1,
            device: String::new(),
        }
    }
}

/// The answer to one command.
#[derive(Debug)]
pub struct Answer {
    pub status: i32,
    pub output: String,
}

/// The guest kernel's command line for `cfg`: the console on the first serial port, and
/// eth0's address, MAC and MTU for `/init`.
pub fn cmdline(cfg: &GuestConfig) -> String {
    // no_timer_check: under TCG on a loaded host the guest kernel's check that the timer
    // interrupt reaches the IO-APIC can time out, and it panics ("IO-APIC + timer doesn't
    // work", seen with a load average of 12 on two vCPUs).
    let mut append = format!(
        "console=ttyS0 panic=-1 quiet no_timer_check ipv6.disable=1 vale.ip={} vale.mac={}",
        cfg.ip, cfg.mac
    );
    if let Some(mtu) = cfg.mtu {
        append += &format!(" vale.mtu={mtu}");
    }
    append
}

/// A running guest; QEMU is killed when it is dropped (and when the test process dies). A
/// guest whose QEMU another program starts (libvirt) is made with [`Guest::external`].
pub struct Guest {
    pub name: String,
    /// QEMU, when the harness started it.
    child: Option<Child>,
    dir: TempDir,
    listener: UnixListener,
    cmd: Option<BufReader<UnixStream>>,
    started: Instant,
}

impl Guest {
    /// Starts QEMU for `cfg`, not waiting for the guest: see [`Guest::wait_ready`]. Starting
    /// several guests first and then waiting for each boots them side by side.
    pub fn start(cfg: &GuestConfig) -> Guest {
        let kit = kit().unwrap_or_else(|e| panic!("guest {}: {e}", cfg.name));
        let dir = TempDir::new("guest");
        let sock = dir.0.join("cmd.sock");
        let listener = UnixListener::bind(&sock).expect("bind the command socket");
        let console = dir.0.join("console.log");
        let append = cmdline(cfg);
        let mut device = format!(
            "virtio-net-pci,netdev=n0,mac={},romfile=,vectors=0",
            cfg.mac
        );
        if !cfg.offloads {
            device += ",csum=off,guest_csum=off,gso=off,guest_tso4=off,guest_tso6=off,\
                       guest_ecn=off,guest_ufo=off,host_tso4=off,host_tso6=off,host_ecn=off,\
                       host_ufo=off,mrg_rxbuf=off";
        }
        device += &cfg.device;
        let smp = cfg.smp.to_string();
        let mut c = match &cfg.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&kit.qemu);
                c
            }
            None => Command::new(&kit.qemu),
        };
        c.args(["-accel", "tcg", "-m", "256", "-smp", &smp, "-nodefaults"])
            .args(["-display", "none", "-monitor", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(&kit.kernel)
            .arg("-initrd")
            .arg(&kit.initramfs)
            .args(["-append", &append])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-chardev")
            .arg(format!("socket,id=cmd,path={}", sock.display()))
            .args(["-serial", "chardev:cmd"])
            .args(["-netdev", &format!("{},id=n0", cfg.netdev)])
            .args(["-device", &device])
            .args(&cfg.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("qemu.err")).expect("qemu.err"));
        // SAFETY: a CPU set built before the fork and async-signal-safe syscalls between fork
        // and exec. QEMU (and its TAP device) goes when the test process does, however it
        // ends; the CPU set is inherited through `ip netns exec` by QEMU and its threads.
        let cpus = (!cfg.cpus.is_empty()).then(|| {
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for &cpu in &cfg.cpus {
                unsafe { libc::CPU_SET(cpu, &mut set) };
            }
            set
        });
        unsafe {
            c.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if let Some(set) = &cpus {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("guest {}: start QEMU: {e}", cfg.name));
        Guest {
            name: cfg.name.clone(),
            child: Some(child),
            dir,
            listener,
            cmd: None,
            started: Instant::now(),
        }
    }

    /// A guest whose QEMU another program starts: the harness listens at
    /// [`Guest::command_socket`] for QEMU's second serial port (a client of it) and expects
    /// the console in the file [`Guest::console_path`]. QEMU's own errors are read from
    /// `qemu.err` in [`Guest::dir`] (a link to where that program keeps them, say). Call
    /// [`Guest::booting`] when QEMU starts, then [`Guest::wait_ready`].
    pub fn external(name: &str) -> Guest {
        let dir = TempDir::new("guest");
        let listener = UnixListener::bind(dir.0.join("cmd.sock")).expect("bind the command socket");
        Guest {
            name: name.to_string(),
            child: None,
            dir,
            listener,
            cmd: None,
            started: Instant::now(),
        }
    }

    /// Where the harness listens for the guest's command port.
    pub fn command_socket(&self) -> PathBuf {
        self.dir.0.join("cmd.sock")
    }

    /// The file the guest's console goes to.
    pub fn console_path(&self) -> PathBuf {
        self.dir.0.join("console.log")
    }

    /// The guest's directory (console, command socket, QEMU's errors).
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// A QEMU of an external guest starts (again): forget the last command connection and
    /// count [`BOOT_LIMIT`] from now.
    pub fn booting(&mut self) {
        self.cmd = None;
        self.started = Instant::now();
    }

    /// QEMU's process id (`ip netns exec` execs QEMU: the same process).
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("guest {}: its QEMU is not the harness's", self.name))
            .id()
    }

    /// Starts QEMU for `cfg` and waits until the guest serves commands.
    pub fn boot(cfg: &GuestConfig) -> Guest {
        let mut g = Guest::start(cfg);
        g.wait_ready();
        g
    }

    /// Waits (up to [`BOOT_LIMIT`] from the start) until the guest is ready; fails with the
    /// console's tail if it does not come up. Returns how long the boot took.
    pub fn wait_ready(&mut self) -> Duration {
        let deadline = self.started + BOOT_LIMIT;
        self.listener.set_nonblocking(true).expect("nonblocking");
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => self.fail(&format!("accept the command port: {e}")),
            }
            self.check_alive();
            if Instant::now() >= deadline {
                self.fail("QEMU never connected its command port");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        stream.set_nonblocking(false).expect("blocking");
        let mut r = BufReader::new(stream);
        let mut line = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(&format!("not ready after {BOOT_LIMIT:?}"));
            }
            r.get_ref()
                .set_read_timeout(Some(left.min(Duration::from_millis(500))))
                .expect("timeout");
            match r.read_line(&mut line) {
                Ok(0) => self.fail("QEMU closed the command port"),
                Ok(_) if line.ends_with('\n') => {
                    if line.trim() == READY {
                        break;
                    }
                    line.clear();
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    self.check_alive()
                }
                Err(e) => self.fail(&format!("read the command port: {e}")),
            }
        }
        self.cmd = Some(r);
        self.started.elapsed()
    }

    fn check_alive(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if let Ok(Some(st)) = child.try_wait() {
            self.fail(&format!("QEMU exited ({st})"));
        }
    }

    /// The last lines of the guest's console and of QEMU's own errors.
    pub fn console_tail(&self) -> String {
        let tail = |f: &str, n: usize| {
            let s = std::fs::read_to_string(self.dir.0.join(f)).unwrap_or_default();
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        };
        format!(
            "--- console ---\n{}\n--- qemu ---\n{}",
            tail("console.log", 30),
            tail("qemu.err", 10)
        )
    }

    fn fail(&self, why: &str) -> ! {
        panic!(
            "guest {}: {why} ({:.1?} after start)\n{}",
            self.name,
            self.started.elapsed(),
            self.console_tail()
        )
    }

    /// Runs `cmd` (one line of shell) in the guest, waiting up to `limit` for it to finish.
    pub fn run(&mut self, cmd: &str, limit: Duration) -> Answer {
        assert!(!cmd.contains('\n'), "one line per command");
        let Some(r) = self.cmd.as_mut() else {
            panic!("guest {}: not ready", self.name)
        };
        let deadline = Instant::now() + limit;
        let sent = r.get_mut().write_all(format!("{cmd}\n").as_bytes());
        if let Err(e) = sent {
            self.fail(&format!("send {cmd:?}: {e}"));
        }
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&buf);
            if let Some(at) = text.find(EXIT) {
                let rest = &text[at + EXIT.len()..];
                if let Some(end) = rest.find('\n') {
                    let status = rest[..end].trim().parse().unwrap_or(-1);
                    return Answer {
                        status,
                        output: text[..at].to_string(),
                    };
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(&format!(
                    "{cmd:?} did not finish in {limit:?}; so far: {text}"
                ));
            }
            let r = self.cmd.as_mut().expect("ready");
            r.get_ref().set_read_timeout(Some(left)).expect("timeout");
            match r.read(&mut chunk) {
                Ok(0) => self.fail(&format!("command port closed during {cmd:?}")),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => self.fail(&format!("read the answer to {cmd:?}: {e}")),
            }
        }
    }

    /// Runs `cmd`, which must succeed within `limit`; returns its output.
    pub fn ok(&mut self, cmd: &str, limit: Duration) -> String {
        let a = self.run(cmd, limit);
        if a.status != 0 {
            self.fail(&format!(
                "{cmd:?} failed with status {}: {}",
                a.status, a.output
            ));
        }
        a.output
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

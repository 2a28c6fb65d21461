//! Test harness: starts a real valed in a run directory of its own and drives it with the
//! real tools (vale-ctl, vale-pktgen) and with in-process libvale clients.
//!
//! The binaries are the ones cargo built beside the test executable, so run
//! `cargo build --release --workspace` before `cargo test --release --workspace` (the README's
//! test command does both).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vale_abi::control::{PortInfo, SwitchInfo, SOCKET_NAME};

/// Path of a workspace binary built in the same profile as the running test.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace, same profile)",
        p.display()
    );
    p
}

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "vale-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A valed of the test's own, killed when dropped.
pub struct Valed {
    pub dir: TempDir,
    child: Child,
}

impl Valed {
    pub fn start() -> Valed {
        Self::start_with(&[])
    }

    /// Starts valed with extra arguments and waits until its socket answers.
    pub fn start_with(args: &[&str]) -> Valed {
        let dir = TempDir::new("valed");
        let log = std::fs::File::create(dir.0.join("valed.log")).expect("log file");
        let child = Command::new(bin("valed"))
            .arg("--run-dir")
            .arg(&dir.0)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start valed");
        let v = Valed { dir, child };
        v.wait_ready();
        v
    }

    fn wait_ready(&self) {
        let sock = self.dir.0.join(SOCKET_NAME);
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&sock).is_err() {
            assert!(
                Instant::now() < deadline,
                "valed did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn run_dir(&self) -> &Path {
        &self.dir.0
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether valed is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("valed.log")).unwrap_or_default()
    }

    /// Options to open a port of this valed from the test process (never autostarts).
    pub fn options(&self) -> vale::OpenOptions {
        let mut o = vale::OpenOptions::new();
        o.run_dir(&self.dir.0).autostart(false);
        o
    }

    pub fn open(&self, name: &str) -> vale::Port {
        self.options()
            .open(name)
            .unwrap_or_else(|e| panic!("open {name}: {e}"))
    }

    /// `vale-ctl --run-dir DIR ARGS...`
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(bin("vale-ctl"))
            .arg("--run-dir")
            .arg(&self.dir.0)
            .args(args)
            .output()
            .expect("run vale-ctl")
    }

    /// `vale-pktgen --run-dir DIR ARGS...`, not yet started.
    pub fn pktgen(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin("vale-pktgen"));
        c.arg("--run-dir").arg(&self.dir.0).args(args);
        c.env("VALE_NO_AUTOSTART", "1");
        c
    }

    /// Every switch, through `vale-ctl list --json`.
    pub fn list(&self) -> Vec<SwitchInfo> {
        let out = self.ctl(&["list", "--json"]);
        assert!(
            out.status.success(),
            "vale-ctl list failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Vec<SwitchInfo>>(&out.stdout).expect("list --json parses")
    }

    /// One port's entry, if it exists.
    pub fn port(&self, name: &str) -> Option<PortInfo> {
        self.list()
            .into_iter()
            .flat_map(|s| s.ports)
            .find(|p| p.name == name)
    }

    /// Open descriptors of valed.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("proc fd")
            .count()
    }

    /// valed's resident set size, KiB.
    pub fn rss_kib(&self) -> u64 {
        proc_status_field(self.pid(), "VmRSS:")
    }

    /// valed's CPU time (user + system), in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("proc stat");
        // Fields after the ")" of the command name: utime is the 12th, stime the 13th.
        let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }
}

pub fn proc_status_field(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Drop for Valed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Clock ticks per second, for [`Valed::cpu_ticks`].
pub fn ticks_per_second() -> u64 {
    // SAFETY: plain sysconf call.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as u64 }
}

/// An Ethernet frame of `len` bytes from `src` to `dst` whose payload encodes `seq`, so a
/// receiver can check every byte.
pub fn test_frame(len: usize, src: [u8; 6], dst: [u8; 6], seq: u64) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..22].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in f[22..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    f
}

/// Queues `frame` on tx ring 0 (chained over slots if needed). False if the ring lacks room.
pub fn send_frame(port: &vale::Port, frame: &[u8]) -> bool {
    let ring = port.tx_ring(0);
    let bsize = ring.buf_size() as usize;
    let need = frame.len().div_ceil(bsize) as u32;
    if ring.space() < need {
        return false;
    }
    let mut cur = ring.cur();
    let mut chunks = frame.chunks(bsize).peekable();
    while let Some(c) = chunks.next() {
        let slot = ring.slot(cur);
        ring.buf(slot.buf_idx)[..c.len()].copy_from_slice(c);
        slot.len = c.len() as u16;
        slot.flags = if chunks.peek().is_some() {
            vale::NS_MOREFRAG
        } else {
            0
        };
        cur = ring.next(cur);
    }
    ring.set_cur(cur);
    ring.set_head(cur);
    true
}

/// Takes every complete frame waiting on rx ring 0, reassembling chains.
pub fn recv_frames(port: &vale::Port) -> Vec<Vec<u8>> {
    port.rxsync(0).expect("rxsync");
    let ring = port.rx_ring(0);
    let mut out = Vec::new();
    let mut cur = ring.cur();
    let mut release = cur;
    let mut frame = Vec::new();
    while cur != ring.tail() {
        let slot = ring.slot(cur);
        frame.extend_from_slice(&ring.buf(slot.buf_idx)[..slot.len as usize]);
        cur = ring.next(cur);
        if slot.flags & vale::NS_MOREFRAG == 0 {
            out.push(std::mem::take(&mut frame));
            release = cur;
        }
    }
    ring.set_cur(release);
    ring.set_head(release);
    port.rxsync(0).expect("rxsync");
    out
}

/// Waits up to `timeout` for frames on rx ring 0.
pub fn wait_frames(port: &vale::Port, timeout: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = recv_frames(port);
        if !got.is_empty() || Instant::now() >= deadline {
            return got;
        }
        port.poll(
            vale::Events {
                readable: true,
                writable: false,
            },
            Some(deadline.saturating_duration_since(Instant::now())),
        )
        .expect("poll");
    }
}

pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
pub const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
pub const MAC_C: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
pub const BROADCAST: [u8; 6] = [0xff; 6];

//! DPDK's testpmd as a peer: its `net_virtio_user` driver is a vhost-user front end without a
//! virtual machine, so a testpmd on a vale vhost-user port sends and receives through vale as
//! a guest's virtio-net driver would, at DPDK's rates.
//!
//! Each testpmd runs in interactive mode with its commands on a pipe and its output read as it
//! comes (line-buffered through `stdbuf`): the tests stop forwarding with `stop`, read the
//! port's counters with `show port stats 0` while the port stays up, and end it with `quit`
//! (or SIGKILL). No hugepages: `--no-huge -m 512 --single-file-segments` (the shared memory
//! that the back end maps is memfd), a pool of 16384 mbufs, two lcores, and a runtime
//! directory (`--file-prefix`) of its own, removed when the testpmd is dropped.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};

use crate::which;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Directories where Debian's DPDK keeps its drivers (`pmds-<ABI>`).
const LIB_DIRS: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/dpdk",
    "/usr/lib64/dpdk",
    "/usr/lib/dpdk",
];

/// Whether a driver `librte_<name>.so*` is installed where EAL loads drivers from.
fn has_driver(name: &str) -> bool {
    let prefix = format!("librte_{name}.so");
    LIB_DIRS.iter().any(|d| {
        std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .any(|pmds| {
                std::fs::read_dir(pmds.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|f| f.file_name().to_string_lossy().starts_with(&prefix))
            })
    })
}

/// Whether testpmd tests can run here: `Some(reason)` when they must be skipped (not root, or
/// testpmd or its virtio_user driver missing outside CI). Under CI, as root, a missing piece
/// fails the test: `scripts/test.sh` installs them there.
pub fn skip_reason() -> Option<String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Some("DPDK tests need root (testpmd's runtime directory, vale host ports)".into());
    }
    let missing = if which("dpdk-testpmd").is_none() {
        Some("dpdk-testpmd is not installed")
    } else if !has_driver("net_virtio") {
        Some("DPDK's virtio_user driver (librte_net_virtio) is not installed")
    } else if !has_driver("mempool_ring") {
        Some("DPDK's ring mempool driver (librte_mempool_ring) is not installed")
    } else if which("stdbuf").is_none() {
        Some("stdbuf (coreutils) is not installed")
    } else {
        None
    }?;
    if std::env::var_os("CI").is_none() {
        Some(format!(
            "{missing} (scripts/test.sh installs dpdk-dev, which has it)"
        ))
    } else {
        panic!("DPDK tests cannot run under CI: {missing}")
    }
}

/// What a testpmd forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Sends 64-byte frames (60 without the FCS) from the port's MAC to `peer`, as fast as the
    /// ring takes them.
    TxOnly,
    /// Counts and frees whatever arrives.
    RxOnly,
}

/// One testpmd with one virtio_user port.
pub struct TestpmdConfig {
    /// The vhost-user socket.
    pub path: PathBuf,
    /// Yes: testpmd listens at `path` (virtio_user `server=1`), the back end connects.
    pub server: bool,
    pub mac: String,
    pub mode: Mode,
    /// Where txonly frames go.
    pub peer: String,
}

/// A running testpmd: killed, reaped and its runtime directory removed when dropped.
pub struct Testpmd {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    prefix: String,
}

/// The counters of `show port stats 0` (the driver's own: frames handed to or taken from the
/// virtqueues).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    pub rx_packets: u64,
    pub rx_missed: u64,
    pub rx_errors: u64,
    pub rx_nombuf: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
}

impl Testpmd {
    pub fn start(cfg: &TestpmdConfig) -> Testpmd {
        let mut vdev = format!(
            "net_virtio_user0,path={},queues=1,queue_size=1024,mac={}",
            cfg.path.display(),
            cfg.mac
        );
        if cfg.server {
            vdev.push_str(",server=1");
        }
        Testpmd::start_vdev(&vdev, cfg.mode, &cfg.peer, &[])
    }

    /// A testpmd on port `vdev` (any `--vdev` argument: `net_memif0,...`), forwarding in
    /// `mode` (txonly frames to `peer`), with `extra` testpmd options (`--rxq=2`).
    pub fn start_vdev(vdev: &str, mode: Mode, peer: &str, extra: &[&str]) -> Testpmd {
        static N: AtomicU32 = AtomicU32::new(0);
        let prefix = format!(
            "vale-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mode = match mode {
            Mode::TxOnly => "txonly",
            Mode::RxOnly => "rxonly",
        };
        let mut cmd = Command::new("stdbuf");
        cmd.args([
            "-oL",
            "-eL",
            "dpdk-testpmd",
            "-l",
            "0,1",
            "--main-lcore",
            "0",
        ])
        .args([
            "--no-huge",
            "-m",
            "512",
            "--no-pci",
            "--single-file-segments",
        ])
        .args(["--log-level=lib.eal:error", "--file-prefix", &prefix])
        .args(["--vdev", vdev, "--", "-i", "--auto-start"])
        .args(["--total-num-mbufs=16384", &format!("--forward-mode={mode}")])
        .arg(format!("--eth-peer=0,{peer}"))
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start dpdk-testpmd");
        let out = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let pipes: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("stdout")),
            Box::new(child.stderr.take().expect("stderr")),
        ];
        for mut p in pipes {
            let out = out.clone();
            readers.push(std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = p.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    out.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }));
        }
        Testpmd {
            stdin: child.stdin.take(),
            child,
            out,
            readers,
            prefix,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits until its output after byte `from` holds `what`; the test fails, with the output,
    /// if testpmd exits first or nothing comes by `deadline`. The offset just past it.
    pub fn wait_for(&mut self, what: &str, from: usize, deadline: Instant) -> usize {
        loop {
            {
                let o = self.out.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(i) = o.get(from..).and_then(|s| s.find(what)) {
                    return from + i + what.len();
                }
            }
            if let Some(st) = self.exited() {
                // Let the readers take the last of its output.
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "testpmd exited ({st}) before printing {what:?}:\n{}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "testpmd did not print {what:?} in time:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends one command line.
    pub fn command(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("testpmd's stdin");
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| panic!("testpmd command {line:?}: {e}"));
    }

    /// Waits (until `deadline`) for forwarding to have started: its prompt after the start.
    pub fn wait_forwarding(&mut self, deadline: Instant) {
        let at = self.wait_for("Start automatic packet forwarding", 0, deadline);
        self.wait_for("testpmd> ", at, deadline);
    }

    /// Stops forwarding: nothing more is sent or taken from the queues; the port stays up.
    pub fn stop(&mut self, deadline: Instant) {
        let from = self.out.lock().unwrap_or_else(|e| e.into_inner()).len();
        self.command("stop");
        self.wait_for("Done.", from, deadline);
    }

    /// The port's counters now.
    pub fn port_stats(&mut self, deadline: Instant) -> PortStats {
        let from = self.out.lock().unwrap_or_else(|e| e.into_inner()).len();
        self.command("show port stats 0");
        let start = self.wait_for("NIC statistics for port 0", from, deadline);
        let end = self.wait_for("TX-bytes:", start, deadline);
        // The rest of the TX line.
        let end = self.wait_for("\n", end, deadline);
        let o = self.output();
        let block = &o[start..end];
        let field = |name: &str| -> u64 {
            let at = block
                .find(name)
                .unwrap_or_else(|| panic!("no {name} in testpmd's stats: {block}"));
            block[at + name.len()..]
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("bad {name} in testpmd's stats: {block}"))
        };
        PortStats {
            rx_packets: field("RX-packets:"),
            rx_missed: field("RX-missed:"),
            rx_errors: field("RX-errors:"),
            rx_nombuf: field("RX-nombuf:"),
            tx_packets: field("TX-packets:"),
            tx_errors: field("TX-errors:"),
        }
    }

    /// `quit`: it stops its port (the back end sees the connection end) and exits; fails the
    /// test if it has not by `deadline`.
    pub fn quit(mut self, deadline: Instant) {
        self.command("quit");
        while self.exited().is_none() {
            assert!(
                Instant::now() < deadline,
                "testpmd did not quit in time:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let st = self.exited().expect("exited");
        assert!(st.success(), "testpmd quit with {st}:\n{}", self.output());
    }

    /// SIGKILL, at once: the front end vanishes with its queues as they are.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        // EAL's runtime directory of a process run as root.
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

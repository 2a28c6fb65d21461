//! DPDK's testpmd as a peer: its `net_virtio_user` driver is a vhost-user front end without a
//! virtual machine, so a testpmd on a vale vhost-user port sends and receives through vale as
//! a guest's virtio-net driver would, at DPDK's rates; its `net_memif` driver is a memif
//! client, the same on a vale memif port.
//!
//! [`Front`] is the harness of both port kinds' tests ([`Attach`] says which kind, and how it
//! is attached): a valed with the port, testpmd started on it txonly (counted by vale-pktgen
//! rx on vale0:b) or rxonly (fed by vale-pktgen tx on vale0:a), every count adding up;
//! [`both_ways`] and [`killed_then_replaced`] are the tests themselves.
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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vale_abi::control::PortCounters;

use crate::{num, report, serial, stop_pktgen, wait_until, wait_until_every, which, Kid, Valed, T};

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

/// Whether testpmd tests of a port attached as `attach` can run here: `Some(reason)` when
/// they must be skipped (not root, or testpmd or its driver for that port missing outside CI).
/// Under CI, as root, a missing piece fails the test: `scripts/test.sh` installs them there.
pub fn skip_reason(attach: Attach) -> Option<String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Some("DPDK tests need root (testpmd's runtime directory, vale host ports)".into());
    }
    let missing = if which("dpdk-testpmd").is_none() {
        Some("dpdk-testpmd is not installed")
    } else if attach != Attach::Memif && !has_driver("net_virtio") {
        Some("DPDK's virtio_user driver (librte_net_virtio) is not installed")
    } else if attach == Attach::Memif && !has_driver("net_memif") {
        Some("DPDK's memif driver (librte_net_memif, in librte-net-memif23) is not installed")
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
    /// A testpmd on port `vdev` (any `--vdev` argument: `net_memif0,...`), forwarding in
    /// `mode` (txonly frames to `peer`), with `extra` testpmd options (`--rxq=2`).
    pub fn start(vdev: &str, mode: Mode, peer: &str, extra: &[&str]) -> Testpmd {
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

/// How the vale port that a testpmd fronts is attached, and so testpmd's driver for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// vhost-user, valed listening at the socket: testpmd's `net_virtio_user` connects.
    VhostUserListening,
    /// vhost-user, valed connecting (`--client`) to a testpmd that listens (virtio_user
    /// `server=1`).
    VhostUserConnecting,
    /// memif, valed the server: testpmd's `net_memif` in client role.
    Memif,
}

/// Bound of the waits that involve testpmd starting or a queue draining on a loaded machine.
pub const SLOW: Duration = Duration::from_secs(60);
/// Frames vale must have taken from a txonly testpmd before it is stopped.
pub const FROM_TESTPMD: u64 = 100_000;
/// Frames vale-pktgen sends toward an rxonly testpmd.
pub const TO_TESTPMD: u64 = 200_000;

/// A test file's names: the port testpmd fronts and the MAC addresses of the ends.
#[derive(Clone, Copy, Debug)]
pub struct Names {
    /// The vale port ("vale0:vm1"); its socket is `vm1.sock` in valed's run directory.
    pub port: &'static str,
    /// testpmd's port.
    pub mac: &'static str,
    /// vale-pktgen's sink on vale0:b.
    pub mac_b: &'static str,
    /// vale-pktgen's sink on vale0:d, the other pair's.
    pub mac_d: &'static str,
}

/// `port`'s name without its switch ("vm1"), as the messages say it.
fn short(port: &str) -> &str {
    port.rsplit(':').next().unwrap_or(port)
}

/// A valed with a port for a testpmd front end, and the steps of the tests that run frames
/// through it both ways: what testpmd's driver says it queued or took, what valed counts for
/// the port and for the native ports, and what vale-pktgen counted must add up exactly, each
/// difference being a named drop counter.
pub struct Front {
    pub v: Valed,
    pub sock: PathBuf,
    pub attach: Attach,
    pub names: Names,
}

impl Front {
    /// A valed with port `names.port` attached as `attach`, down: no front end yet.
    pub fn new(attach: Attach, names: Names) -> Front {
        let v = Valed::start();
        let sock = v.run_dir().join(format!("{}.sock", short(names.port)));
        let kind = match attach {
            Attach::Memif => "--memif",
            _ => "--vhost-user",
        };
        let mut args = vec!["attach", names.port, kind, sock.to_str().unwrap()];
        if attach == Attach::VhostUserConnecting {
            args.push("--client");
        }
        v.ctl_ok(&args);
        let f = Front {
            v,
            sock,
            attach,
            names,
        };
        assert_eq!(f.state(), "down", "no front end yet");
        f
    }

    /// Starts a testpmd with `queues` queue pairs on the port and waits until vale serves it
    /// and it forwards.
    pub fn testpmd(&self, mode: Mode, peer: &str, queues: usize) -> Testpmd {
        let (sock, mac) = (self.sock.display(), self.names.mac);
        let vdev = match self.attach {
            Attach::Memif => {
                format!("net_memif0,role=client,socket={sock},socket-abstract=no,mac={mac}")
            }
            a => format!(
                "net_virtio_user0,path={sock},queues={queues},queue_size=1024,mac={mac}{}",
                if a == Attach::VhostUserConnecting {
                    ",server=1"
                } else {
                    ""
                }
            ),
        };
        let q = [format!("--rxq={queues}"), format!("--txq={queues}")];
        let extra: Vec<&str> = if queues > 1 {
            q.iter().map(String::as_str).collect()
        } else {
            vec![]
        };
        let mut tp = Testpmd::start(&vdev, mode, peer, &extra);
        tp.wait_forwarding(Instant::now() + SLOW);
        assert!(
            wait_until_every(SLOW, Duration::from_millis(20), || self.state() == "up"),
            "{} is not up with testpmd there; valed's log:\n{}\ntestpmd:\n{}",
            self.names.port,
            self.v.log(),
            tp.output()
        );
        // What testpmd's driver took is listed: the rings each way (memif); the features and
        // queue pairs (vhost-user: DPDK 22.11's virtio_user acks MRG_RXBUF of the net
        // features valed offers, no offloads).
        let want = match self.attach {
            Attach::Memif => vec![format!("{queues} C2S and {queues} S2C rings")],
            _ => vec![
                "features ".to_string(),
                format!("queue pairs {queues} in use of 4"),
            ],
        };
        let negotiated = self.v.port(self.names.port).unwrap().negotiated;
        assert!(
            negotiated
                .as_deref()
                .is_some_and(|n| want.iter().all(|w| n.contains(w.as_str()))),
            "vale-ctl list: {negotiated:?}, wanted {want:?}"
        );
        tp
    }

    pub fn state(&self) -> String {
        self.v
            .port(self.names.port)
            .map(|p| p.state)
            .unwrap_or_default()
    }

    /// The port's counters.
    pub fn counters(&self) -> PortCounters {
        self.v.counters(self.names.port)
    }

    pub fn wait_down(&self, why: &str) {
        assert!(
            wait_until_every(SLOW, Duration::from_millis(20), || self.state() == "down"),
            "{} is not down after {why}; valed's log:\n{}",
            self.names.port,
            self.v.log()
        );
    }

    /// A vale-pktgen sink on `port` that announces `mac` (so the switch learns it) and keeps
    /// every frame it is sent (a deep ring), until SIGINT or 300 s.
    pub fn sink(&self, port: &str, mac: &str) -> Kid {
        let cmd = self.v.pktgen(&[
            "-i",
            port,
            "-f",
            "rx",
            "--announce",
            "-S",
            mac,
            "--slots",
            "4096",
            "-T",
            "300",
            "--json",
        ]);
        let k = self
            .v
            .spawn_client(cmd, &format!("vale-pktgen rx {port}"), port);
        assert!(
            wait_until(T, || self.v.counters(port).tx_packets == 1),
            "no announcement from {port}"
        );
        k
    }

    /// Stops the sink on vale0:b (see [`Front::sink`]) and checks its count: vale-pktgen
    /// counted each frame vale delivered to b; vale's drops toward b are its own. b's counters.
    pub fn b_counted(&self, b: Kid) -> PortCounters {
        let bc = self.v.counters("vale0:b");
        let r = stop_pktgen(b, "vale-pktgen rx b");
        assert_eq!(
            (num(&r, "packets"), num(&r, "drops")),
            (bc.rx_packets, bc.rx_drops),
            "vale-pktgen's count vs valed's counters of b: {r}"
        );
        assert_eq!(num(&r, "bytes"), bc.rx_bytes, "{r}");
        bc
    }

    /// The other pair: vale-pktgen tx on vale0:c sending 1000 frames a second (until SIGINT
    /// or 300 s) to d, a sink announcing `names.mac_d` that the caller started; flowing.
    pub fn c_to_d(&self) -> Kid {
        let v = &self.v;
        v.ctl_ok(&["create", "vale0:c"]);
        let c = Kid::spawn(
            v.pktgen(&[
                "-i",
                "vale0:c",
                "-f",
                "tx",
                "-R",
                "1000",
                "-T",
                "300",
                "-D",
                self.names.mac_d,
                "--json",
            ]),
            "vale-pktgen tx c",
        );
        assert!(
            wait_until(T, || v.counters("vale0:d").rx_packets > 1),
            "c -> d does not flow: {:?}",
            v.counters("vale0:c")
        );
        c
    }

    /// Stops the other pair (see [`Front::c_to_d`]) and checks that it lost nothing: each
    /// frame c sent reached d, with `others` frames from other ports (b's announcement), or
    /// at least those of c where `others` is None. c's counters.
    pub fn c_to_d_lost_nothing(&self, c: Kid, d: Kid, others: Option<u64>) -> PortCounters {
        let v = &self.v;
        let cr = stop_pktgen(c, "vale-pktgen tx c");
        let cc = v.counters("vale0:c");
        assert_eq!(
            (cc.tx_packets, cc.tx_drops),
            (num(&cr, "packets"), 0),
            "{cr}"
        );
        let want = cc.tx_packets + others.unwrap_or(0);
        let mut dc = v.counters("vale0:d");
        assert!(
            wait_until(T, || {
                dc = v.counters("vale0:d");
                let got = dc.rx_packets + dc.rx_drops;
                got == want || others.is_none() && got > want
            }),
            "c sent {} frames, d took {} and dropped {} (with {others:?} from other ports)",
            cc.tx_packets,
            dc.rx_packets,
            dc.rx_drops
        );
        assert_eq!(dc.rx_drops, 0, "the other pair lost frames: {dc:?}");
        let dr = stop_pktgen(d, "vale-pktgen rx d");
        assert_eq!(num(&dr, "packets"), dc.rx_packets, "{dr}");
        cc
    }

    /// Waits until every frame the port forwarded since `before` (its and b's counters then)
    /// reached vale0:b or is counted as dropped there.
    pub fn wait_landed_at_b(&self, before: (PortCounters, PortCounters)) {
        let mut last = (self.counters(), self.v.counters("vale0:b"));
        let ok = wait_until(SLOW, || {
            last = (self.counters(), self.v.counters("vale0:b"));
            let (c, b) = &last;
            let sent = c.tx_packets - before.0.tx_packets - (c.tx_drops - before.0.tx_drops);
            let landed = b.rx_packets - before.1.rx_packets + b.rx_drops - before.1.rx_drops;
            sent == landed
        });
        assert!(
            ok,
            "what {} forwarded does not add up at b: before {before:?}, now {last:?}",
            short(self.names.port)
        );
    }

    /// Runs a txonly testpmd (`queues` queue pairs) toward vale0:b until vale took at least
    /// FROM_TESTPMD frames from it, stops its forwarding and checks the count on both sides:
    /// every frame the driver queued was taken by vale (forwarded: the port's tx_packets, or
    /// refused: bad_input), and each forwarded one reached b or is one of b's rx_drops.
    /// Returns the testpmd, still up.
    pub fn txonly_to_b(&self, queues: usize) -> Testpmd {
        let before = (self.counters(), self.v.counters("vale0:b"));
        let mut tp = self.testpmd(Mode::TxOnly, self.names.mac_b, queues);
        let flowed = wait_until_every(SLOW, Duration::from_millis(20), || {
            self.counters().tx_packets >= before.0.tx_packets + FROM_TESTPMD
        });
        assert!(
            flowed,
            "vale took only {} frames from testpmd; valed's log:\n{}\ntestpmd:\n{}",
            self.counters().tx_packets - before.0.tx_packets,
            self.v.log(),
            tp.output()
        );
        let deadline = Instant::now() + SLOW;
        tp.stop(deadline);
        let s = tp.port_stats(deadline);
        assert_eq!(s.tx_errors, 0, "{s:?}");
        let mut c = self.counters();
        let taken = wait_until(SLOW, || {
            c = self.counters();
            c.tx_packets + c.bad_input - before.0.tx_packets - before.0.bad_input == s.tx_packets
        });
        assert!(
            taken,
            "testpmd queued {} frames, vale took {} (forwarded) + {} (bad input)",
            s.tx_packets,
            c.tx_packets - before.0.tx_packets,
            c.bad_input - before.0.bad_input
        );
        assert_eq!(c.bad_input, before.0.bad_input, "{c:?}");
        // b announced itself: unicast, nothing without a destination.
        assert_eq!(c.tx_drops, before.0.tx_drops, "{c:?}");
        self.wait_landed_at_b(before);
        tp
    }
}

/// testpmd txonly -> the port -> vale0:b (vale-pktgen rx), then vale-pktgen tx on vale0:a ->
/// the port -> testpmd rxonly, each frame accounted for; `queues` queue pairs. Skipped, saying
/// why, where testpmd or its driver is missing (see [`skip_reason`]).
pub fn both_ways(attach: Attach, names: Names, queues: usize) {
    if let Some(why) = skip_reason(attach) {
        eprintln!("skipped: {why}");
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let s = Front::new(attach, names);
    let (v, who) = (&s.v, short(names.port));

    // testpmd -> b.
    let b = s.sink("vale0:b", names.mac_b);
    let tp = s.txonly_to_b(queues);
    let bc = s.b_counted(b);
    eprintln!(
        "testpmd -> vale: {} frames forwarded; b took {}, {} dropped at b's ring",
        s.counters().tx_packets,
        bc.rx_packets,
        bc.rx_drops
    );
    assert!(bc.rx_packets > 0, "nothing reached b: {bc:?}");
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");

    // a -> testpmd. a is persistent: its counters stay listed after vale-pktgen exits.
    v.ctl_ok(&["create", "vale0:a"]);
    let mut tp = s.testpmd(Mode::RxOnly, names.mac_b, queues);
    // After the connection: frames left from before it were dropped when it came.
    let before = s.counters();
    let n = TO_TESTPMD.to_string();
    let tx = v.pktgen(&[
        "-i", "vale0:a", "-f", "tx", "-n", &n, "-D", names.mac, "--json",
    ]);
    let t = report(
        &Kid::spawn(tx, "vale-pktgen tx").finish(Duration::from_secs(120)),
        "vale-pktgen tx",
    );
    assert_eq!(
        (num(&t, "packets"), num(&t, "drops")),
        (TO_TESTPMD, 0),
        "{t}"
    );
    let a = v.counters("vale0:a");
    assert_eq!((a.tx_packets, a.tx_drops), (TO_TESTPMD, 0), "{a:?}");
    // Every frame reaches testpmd's driver or is one of the port's rx_drops (its ring in
    // valed was full, or the front end's buffers were too small: then bad_input too).
    let (mut st, mut c) = (Default::default(), before);
    let adds_up = wait_until_every(SLOW, Duration::from_millis(100), || {
        st = tp.port_stats(Instant::now() + SLOW);
        c = s.counters();
        st.rx_packets + c.rx_drops - before.rx_drops == TO_TESTPMD
    });
    assert!(
        adds_up,
        "a sent {TO_TESTPMD}; testpmd took {}, {who} dropped {}: {st:?} {c:?}",
        st.rx_packets,
        c.rx_drops - before.rx_drops
    );
    assert_eq!(c.bad_input, before.bad_input, "{c:?}");
    assert_eq!((st.rx_errors, st.rx_missed), (0, 0), "{st:?}");
    assert!(st.rx_packets > 0, "nothing reached testpmd: {st:?} {c:?}");
    eprintln!(
        "vale -> testpmd: {} frames taken, {} dropped at {who}",
        st.rx_packets,
        c.rx_drops - before.rx_drops
    );
    tp.stop(Instant::now() + SLOW);
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");

    // Detached: valed's socket (where valed listens) goes with the port.
    v.ctl_ok(&["detach", names.port]);
    if attach != Attach::VhostUserConnecting {
        assert!(
            !s.sock.exists(),
            "{} is left after detach",
            s.sock.display()
        );
    }
    eprintln!("test took {:.1?}", t0.elapsed());
}

/// A txonly testpmd killed (SIGKILL) while it sends; a new one on the same socket is served
/// and accounted for like the first; another pair of the switch (vale-pktgen c -> d, 1000
/// frames a second) loses nothing meanwhile, and valed lives on. The valed, for checks of the
/// kind's own; None where the test is skipped (see [`skip_reason`]).
pub fn killed_then_replaced(attach: Attach, names: Names) -> Option<Front> {
    if let Some(why) = skip_reason(attach) {
        eprintln!("skipped: {why}");
        return None;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let mut s = Front::new(attach, names);
    let v = &s.v;

    // The other pair: d first, so that b's announcement (a broadcast) is the one frame d gets
    // that c did not send.
    let d = s.sink("vale0:d", names.mac_d);
    let b = s.sink("vale0:b", names.mac_b);
    assert!(
        wait_until(T, || {
            let c = v.counters("vale0:d");
            c.rx_packets + c.rx_drops == 1
        }),
        "b's announcement did not reach d: {:?}",
        v.counters("vale0:d")
    );
    let c = s.c_to_d();

    // The first testpmd: accounted for up to its stop, then let go again and killed while it
    // sends.
    let mut tp = s.txonly_to_b(1);
    tp.command("start");
    let at = s.counters().tx_packets;
    assert!(
        wait_until_every(SLOW, Duration::from_millis(20), || s.counters().tx_packets
            > at + FROM_TESTPMD),
        "testpmd did not start again: {}",
        tp.output()
    );
    let d_at_kill = v.counters("vale0:d").rx_packets;
    tp.kill();
    s.wait_down("testpmd was killed");
    // What vale took from the killed front end before it went reached b or is counted there
    // (frames it had queued and vale had not taken died with it: no one counts those).
    s.wait_landed_at_b((PortCounters::default(), PortCounters::default()));
    if attach == Attach::VhostUserConnecting {
        // The killed testpmd left its socket file; a new one refuses to listen over it.
        std::fs::remove_file(&s.sock).expect("remove the killed testpmd's socket");
    }

    // The next testpmd on the same socket is served and accounted for exactly.
    let tp = s.txonly_to_b(1);
    let d_after = v.counters("vale0:d").rx_packets;
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");
    assert!(
        d_after > d_at_kill,
        "c -> d stalled while testpmd was replaced: {d_at_kill} then {d_after}"
    );

    // The other pair lost nothing: each frame c sent reached d (with b's announcement).
    let cc = s.c_to_d_lost_nothing(c, d, Some(1));
    let bc = s.b_counted(b);
    assert!(s.v.alive(), "valed died; its log:\n{}", s.v.log());
    eprintln!(
        "c -> d: {} frames; testpmd -> b: {} frames, {} dropped at b; test took {:.1?}",
        cc.tx_packets,
        bc.rx_packets,
        bc.rx_drops,
        t0.elapsed()
    );
    Some(s)
}

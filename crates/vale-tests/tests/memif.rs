//! memif ports: DPDK's testpmd with its `net_memif` driver in client role on a vale memif
//! port (valed the server), both ways, every frame accounted for; and a hostile memif client
//! of the test's own beside a checked stream.
//!
//! Needs root and testpmd with its memif driver (`scripts/test.sh` installs dpdk-dev);
//! skipped, saying why, where they are missing outside CI. The tests of this file run one at a
//! time: a testpmd busy-polls a CPU.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vale_abi::control::PortCounters;
use vale_tests::dpdk::{skip_reason, Mode, Testpmd};
use vale_tests::*;

/// testpmd's memif port, vale-pktgen's sinks.
const MAC_CNF: &str = "02:00:00:00:e0:01";
const MAC_B: &str = "02:00:00:00:e0:0b";

/// Bound of the waits that involve testpmd starting or a queue draining on a loaded machine.
const SLOW: Duration = Duration::from_secs(60);
/// Frames vale must have taken from a txonly testpmd before it is stopped.
const FROM_TESTPMD: u64 = 100_000;
/// Frames vale-pktgen sends toward an rxonly testpmd.
const TO_TESTPMD: u64 = 200_000;

struct Setup {
    v: Valed,
    sock: PathBuf,
}

fn skip() -> Option<String> {
    skip_reason().or_else(|| {
        let found = [
            "/usr/lib/x86_64-linux-gnu/dpdk",
            "/usr/lib64/dpdk",
            "/usr/lib/dpdk",
        ]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .flat_map(|p| std::fs::read_dir(p.path()).into_iter().flatten().flatten())
        .any(|f| {
            f.file_name()
                .to_string_lossy()
                .starts_with("librte_net_memif.so")
        });
        match (found, std::env::var_os("CI").is_some()) {
            (true, _) => None,
            (false, false) => {
                Some("DPDK's memif driver (librte-net-memif23) is not installed".into())
            }
            (false, true) => panic!("memif tests cannot run under CI: no librte_net_memif"),
        }
    })
}

impl Setup {
    /// A valed with memif port vale0:cnf.
    fn new() -> Setup {
        let v = Valed::start();
        let sock = v.run_dir().join("cnf.sock");
        v.ctl_ok(&["attach", "vale0:cnf", "--memif", sock.to_str().unwrap()]);
        let s = Setup { v, sock };
        assert_eq!(s.state(), "down", "no client yet");
        s
    }

    /// Starts a testpmd memif client on vale0:cnf and waits until vale serves it and it
    /// forwards.
    fn testpmd(&self, mode: Mode, peer: &str, queues: usize) -> Testpmd {
        let vdev = format!(
            "net_memif0,role=client,socket={},socket-abstract=no,mac={MAC_CNF}",
            self.sock.display()
        );
        let q = [format!("--rxq={queues}"), format!("--txq={queues}")];
        let extra: Vec<&str> = if queues > 1 {
            q.iter().map(String::as_str).collect()
        } else {
            vec![]
        };
        let mut tp = Testpmd::start_vdev(&vdev, mode, peer, &extra);
        tp.wait_forwarding(Instant::now() + SLOW);
        assert!(
            wait_until_every(SLOW, Duration::from_millis(20), || self.state() == "up"),
            "vale0:cnf is not up with testpmd there; valed's log:\n{}\ntestpmd:\n{}",
            self.v.log(),
            tp.output()
        );
        let negotiated = self.v.port("vale0:cnf").unwrap().negotiated;
        let want = format!("{queues} C2S and {queues} S2C rings");
        assert!(
            negotiated.as_deref().is_some_and(|n| n.contains(&want)),
            "vale-ctl list: {negotiated:?}, wanted {want}"
        );
        tp
    }

    fn state(&self) -> String {
        self.v
            .port("vale0:cnf")
            .map(|p| p.state)
            .unwrap_or_default()
    }

    fn cnf(&self) -> PortCounters {
        self.v.counters("vale0:cnf")
    }

    fn wait_down(&self, why: &str) {
        assert!(
            wait_until_every(SLOW, Duration::from_millis(20), || self.state() == "down"),
            "vale0:cnf is not down after {why}; valed's log:\n{}",
            self.v.log()
        );
    }

    /// A vale-pktgen sink on `port` that announces `mac` and keeps every frame (a deep ring).
    fn sink(&self, port: &str, mac: &str) -> Kid {
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

    /// Waits until every frame cnf forwarded since `before` reached b or is counted as
    /// dropped there.
    fn wait_landed_at_b(&self, before: (PortCounters, PortCounters)) {
        let mut last = (self.cnf(), self.v.counters("vale0:b"));
        let ok = wait_until(SLOW, || {
            last = (self.cnf(), self.v.counters("vale0:b"));
            let (c, b) = &last;
            let sent = c.tx_packets - before.0.tx_packets - (c.tx_drops - before.0.tx_drops);
            let landed = b.rx_packets - before.1.rx_packets + b.rx_drops - before.1.rx_drops;
            sent == landed
        });
        assert!(
            ok,
            "what cnf forwarded does not add up at b: before {before:?}, now {last:?}"
        );
    }

    /// A txonly testpmd toward vale0:b until vale took FROM_TESTPMD frames from it; stopped
    /// and accounted for: every frame it queued was taken by vale and reached b or is one of
    /// b's drops. The testpmd, still connected.
    fn txonly_to_b(&self, queues: usize) -> Testpmd {
        let before = (self.cnf(), self.v.counters("vale0:b"));
        let mut tp = self.testpmd(Mode::TxOnly, MAC_B, queues);
        let flowed = wait_until_every(SLOW, Duration::from_millis(20), || {
            self.cnf().tx_packets >= before.0.tx_packets + FROM_TESTPMD
        });
        assert!(
            flowed,
            "vale took only {} frames from testpmd; valed's log:\n{}\ntestpmd:\n{}",
            self.cnf().tx_packets - before.0.tx_packets,
            self.v.log(),
            tp.output()
        );
        let deadline = Instant::now() + SLOW;
        tp.stop(deadline);
        let s = tp.port_stats(deadline);
        assert_eq!(s.tx_errors, 0, "{s:?}");
        let mut c = self.cnf();
        let taken = wait_until(SLOW, || {
            c = self.cnf();
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
        assert_eq!(c.tx_drops, before.0.tx_drops, "{c:?}");
        self.wait_landed_at_b(before);
        tp
    }
}

/// Stops vale-pktgen `k` with SIGINT; its JSON report.
fn stop_pktgen(k: Kid, what: &str) -> serde_json::Value {
    k.signal(libc::SIGINT);
    report(&k.finish(T), what)
}

fn num(r: &serde_json::Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("report field {field} missing or not an integer: {r}"))
}

/// testpmd txonly -> vale0:cnf -> vale0:b (vale-pktgen rx), then vale-pktgen tx on vale0:a ->
/// vale0:cnf -> testpmd rxonly, each frame accounted for; `queues` queue pairs.
fn both_ways(queues: usize) {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let s = Setup::new();
    let v = &s.v;

    let b = s.sink("vale0:b", MAC_B);
    let tp = s.txonly_to_b(queues);
    let bc = v.counters("vale0:b");
    let r = stop_pktgen(b, "vale-pktgen rx");
    assert_eq!(
        (num(&r, "packets"), num(&r, "drops")),
        (bc.rx_packets, bc.rx_drops),
        "vale-pktgen's count vs valed's counters of b: {r}"
    );
    assert!(bc.rx_packets > 0, "nothing reached b: {bc:?}");
    eprintln!(
        "testpmd -> vale: {} frames forwarded; b took {}, {} dropped at b's ring",
        s.cnf().tx_packets,
        bc.rx_packets,
        bc.rx_drops
    );
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");

    // a -> testpmd.
    v.ctl_ok(&["create", "vale0:a"]);
    let mut tp = s.testpmd(Mode::RxOnly, MAC_B, queues);
    let before = s.cnf();
    let n = TO_TESTPMD.to_string();
    let tx = v.pktgen(&[
        "-i", "vale0:a", "-f", "tx", "-n", &n, "-D", MAC_CNF, "--json",
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
    let (mut st, mut c) = (Default::default(), before);
    let adds_up = wait_until_every(SLOW, Duration::from_millis(100), || {
        st = tp.port_stats(Instant::now() + SLOW);
        c = s.cnf();
        st.rx_packets + c.rx_drops - before.rx_drops == TO_TESTPMD
    });
    assert!(
        adds_up,
        "a sent {TO_TESTPMD}; testpmd took {}, cnf dropped {}: {st:?} {c:?}",
        st.rx_packets,
        c.rx_drops - before.rx_drops
    );
    assert_eq!(c.bad_input, before.bad_input, "{c:?}");
    assert_eq!((st.rx_errors, st.rx_missed), (0, 0), "{st:?}");
    assert!(st.rx_packets > 0, "nothing reached testpmd: {st:?} {c:?}");
    eprintln!(
        "vale -> testpmd: {} frames taken, {} dropped at cnf",
        st.rx_packets,
        c.rx_drops - before.rx_drops
    );
    tp.stop(Instant::now() + SLOW);
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");

    v.ctl_ok(&["detach", "vale0:cnf"]);
    assert!(
        !s.sock.exists(),
        "{} is left after detach",
        s.sock.display()
    );
    eprintln!("test took {:.1?}", t0.elapsed());
}

#[test]
fn testpmd_memif_client_both_ways() {
    both_ways(1);
}

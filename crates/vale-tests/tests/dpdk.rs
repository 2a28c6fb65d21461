//! DPDK's testpmd on vale's vhost-user ports: its `net_virtio_user` driver is a real vhost-user
//! front end (no VM), so vale's device side meets DPDK's virtio driver at full rate. Both
//! socket roles: valed listening (virtio_user `path=`) and valed connecting to a testpmd that
//! listens (virtio_user `server=1`).
//!
//! Every frame is accounted for, with no rate threshold: what testpmd's driver says it queued
//! or took, what valed counts for the vhost-user port and for the native ports, and what
//! vale-pktgen counted must add up exactly, each difference being a named drop counter.
//!
//! Needs root and testpmd with its virtio_user driver (`scripts/test.sh` installs dpdk-dev);
//! skipped, saying why, where they are missing outside CI. The tests of this file run one at a
//! time: a testpmd busy-polls a CPU.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vale_abi::control::PortCounters;
use vale_tests::dpdk::{skip_reason, Mode, Testpmd, TestpmdConfig};
use vale_tests::*;

/// testpmd's virtio_user port, vale-pktgen's sink, and the other pair's ends.
const MAC_VM: &str = "02:00:00:00:d0:01";
const MAC_B: &str = "02:00:00:00:d0:0b";
const MAC_D: &str = "02:00:00:00:d0:0d";

/// Bound of the waits that involve testpmd starting or a queue draining on a loaded machine.
const SLOW: Duration = Duration::from_secs(60);
/// Frames vale must have taken from a txonly testpmd before it is stopped.
const FROM_TESTPMD: u64 = 100_000;
/// Frames vale-pktgen sends toward an rxonly testpmd.
const TO_TESTPMD: u64 = 200_000;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// valed listens at the socket; testpmd connects.
    ValedListens,
    /// testpmd listens (`server=1`); valed connects.
    ValedConnects,
}

struct Setup {
    v: Valed,
    sock: PathBuf,
    role: Role,
}

impl Setup {
    /// A valed with vhost-user port vale0:vm1 in `role`.
    fn new(role: Role) -> Setup {
        let v = Valed::start();
        let sock = v.run_dir().join("vm1.sock");
        let mut args = vec![
            "attach",
            "vale0:vm1",
            "--vhost-user",
            sock.to_str().unwrap(),
        ];
        if role == Role::ValedConnects {
            args.push("--client");
        }
        v.ctl_ok(&args);
        assert_eq!(
            v.port("vale0:vm1").unwrap().state,
            "down",
            "no front end yet"
        );
        Setup { v, sock, role }
    }

    /// Starts a testpmd on vale0:vm1 and waits until vale serves it and it forwards.
    fn testpmd(&self, mode: Mode, peer: &str) -> Testpmd {
        let mut tp = Testpmd::start(&TestpmdConfig {
            path: self.sock.clone(),
            server: self.role == Role::ValedConnects,
            mac: MAC_VM.to_string(),
            mode,
            peer: peer.to_string(),
        });
        let deadline = Instant::now() + SLOW;
        tp.wait_forwarding(deadline);
        assert!(
            wait_until_every(SLOW, Duration::from_millis(20), || self.state() == "up"),
            "vale0:vm1 is not up with testpmd there; valed's log:\n{}\ntestpmd:\n{}",
            self.v.log(),
            tp.output()
        );
        // What testpmd's driver took is listed (DPDK 22.11's virtio_user acks MRG_RXBUF of
        // the net features valed offers, one queue pair, no offloads).
        let negotiated = self.v.port("vale0:vm1").unwrap().negotiated;
        assert!(
            negotiated
                .as_deref()
                .is_some_and(|n| n.contains("features ") && n.contains("queue pairs 1 in use of 4")),
            "vale-ctl list: {negotiated:?}"
        );
        tp
    }

    fn state(&self) -> String {
        self.v
            .port("vale0:vm1")
            .map(|p| p.state)
            .unwrap_or_default()
    }

    fn vm(&self) -> vale_abi::control::PortCounters {
        self.v.counters("vale0:vm1")
    }

    fn wait_down(&self, why: &str) {
        assert!(
            wait_until_every(SLOW, Duration::from_millis(20), || self.state() == "down"),
            "vale0:vm1 is not down after {why}; valed's log:\n{}",
            self.v.log()
        );
    }

    /// A vale-pktgen sink on `port` that announces `mac` (so the switch learns it) and keeps
    /// every frame it is sent (a deep ring), until SIGINT or 300 s.
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

    /// Waits until every frame vm1 forwarded since `before` (vm1's and b's counters then)
    /// reached vale0:b or is counted as dropped there.
    fn wait_landed_at_b(&self, before: (PortCounters, PortCounters)) {
        let mut last = (self.vm(), self.v.counters("vale0:b"));
        let ok = wait_until(SLOW, || {
            last = (self.vm(), self.v.counters("vale0:b"));
            let (vm, b) = &last;
            let sent = vm.tx_packets - before.0.tx_packets - (vm.tx_drops - before.0.tx_drops);
            let landed = b.rx_packets - before.1.rx_packets + b.rx_drops - before.1.rx_drops;
            sent == landed
        });
        assert!(
            ok,
            "what vm1 forwarded does not add up at b: before {before:?}, now {last:?}"
        );
    }

    /// Runs a txonly testpmd toward vale0:b until vale took at least FROM_TESTPMD frames from
    /// it, stops its forwarding and checks the count on both sides: every frame the driver
    /// queued was taken by vale (forwarded: vm1's tx_packets, or refused: bad_input), and each
    /// forwarded one reached b or is one of b's rx_drops. Returns the testpmd, still up.
    fn txonly_to_b(&self) -> Testpmd {
        let before = (self.vm(), self.v.counters("vale0:b"));
        let mut tp = self.testpmd(Mode::TxOnly, MAC_B);
        let flowed = wait_until_every(SLOW, Duration::from_millis(20), || {
            self.vm().tx_packets >= before.0.tx_packets + FROM_TESTPMD
        });
        assert!(
            flowed,
            "vale took only {} frames from testpmd; valed's log:\n{}\ntestpmd:\n{}",
            self.vm().tx_packets - before.0.tx_packets,
            self.v.log(),
            tp.output()
        );
        let deadline = Instant::now() + SLOW;
        tp.stop(deadline);
        let s = tp.port_stats(deadline);
        assert_eq!(s.tx_errors, 0, "{s:?}");
        let mut vm = self.vm();
        let taken = wait_until(SLOW, || {
            vm = self.vm();
            vm.tx_packets + vm.bad_input - before.0.tx_packets - before.0.bad_input == s.tx_packets
        });
        assert!(
            taken,
            "testpmd queued {} frames, vale took {} (forwarded) + {} (bad input)",
            s.tx_packets,
            vm.tx_packets - before.0.tx_packets,
            vm.bad_input - before.0.bad_input
        );
        assert_eq!(vm.bad_input, before.0.bad_input, "{vm:?}");
        // b announced itself: unicast, nothing without a destination.
        assert_eq!(vm.tx_drops, before.0.tx_drops, "{vm:?}");
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

/// testpmd txonly -> vale0:vm1 -> vale0:b (vale-pktgen rx), then vale-pktgen tx on vale0:a ->
/// vale0:vm1 -> testpmd rxonly, each frame accounted for.
fn both_ways(role: Role) {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let s = Setup::new(role);
    let v = &s.v;

    // testpmd -> b.
    let b = s.sink("vale0:b", MAC_B);
    let tp = s.txonly_to_b();
    let bc = v.counters("vale0:b");
    let r = stop_pktgen(b, "vale-pktgen rx");
    // vale-pktgen counted each frame vale delivered to b; vale's drops toward b are its own.
    assert_eq!(
        (num(&r, "packets"), num(&r, "drops")),
        (bc.rx_packets, bc.rx_drops),
        "vale-pktgen's count vs valed's counters of b: {r}"
    );
    assert_eq!(num(&r, "bytes"), bc.rx_bytes, "{r}");
    let vm = s.vm();
    eprintln!(
        "testpmd -> vale: {} frames forwarded; b took {}, {} dropped at b's ring",
        vm.tx_packets, bc.rx_packets, bc.rx_drops
    );
    assert!(bc.rx_packets > 0, "nothing reached b: {bc:?}");
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");

    // a -> testpmd. a is persistent: its counters stay listed after vale-pktgen exits.
    v.ctl_ok(&["create", "vale0:a"]);
    let mut tp = s.testpmd(Mode::RxOnly, MAC_B);
    // After the connection: frames left from before it were dropped when it came.
    let before = s.vm();
    let n = TO_TESTPMD.to_string();
    let tx = v.pktgen(&[
        "-i", "vale0:a", "-f", "tx", "-n", &n, "-D", MAC_VM, "--json",
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
    // Every frame reaches testpmd's driver or is one of vm1's rx_drops (its ring in valed was
    // full, or the guest's buffers were too small: then bad_input too).
    let (mut st, mut vm) = (Default::default(), before);
    let adds_up = wait_until_every(SLOW, Duration::from_millis(100), || {
        st = tp.port_stats(Instant::now() + SLOW);
        vm = s.vm();
        st.rx_packets + vm.rx_drops - before.rx_drops == TO_TESTPMD
    });
    assert!(
        adds_up,
        "a sent {TO_TESTPMD}; testpmd took {}, vm1 dropped {}: {st:?} {vm:?}",
        st.rx_packets,
        vm.rx_drops - before.rx_drops
    );
    assert_eq!(vm.bad_input, before.bad_input, "{vm:?}");
    assert_eq!((st.rx_errors, st.rx_missed), (0, 0), "{st:?}");
    assert!(st.rx_packets > 0, "nothing reached testpmd: {st:?} {vm:?}");
    eprintln!(
        "vale -> testpmd: {} frames taken, {} dropped at vm1",
        st.rx_packets,
        vm.rx_drops - before.rx_drops
    );
    tp.stop(Instant::now() + SLOW);
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");

    // Detached: valed's socket (server role) goes with the port.
    v.ctl_ok(&["detach", "vale0:vm1"]);
    if role == Role::ValedListens {
        assert!(
            !s.sock.exists(),
            "{} is left after detach",
            s.sock.display()
        );
    }
    eprintln!("test took {:.1?}", t0.elapsed());
}

#[test]
fn testpmd_both_ways_valed_listening() {
    both_ways(Role::ValedListens);
}

#[test]
fn testpmd_both_ways_valed_connecting() {
    both_ways(Role::ValedConnects);
}

/// A txonly testpmd killed (SIGKILL) while it sends; a new one on the same socket is served
/// and accounted for like the first; another pair of the switch (vale-pktgen c -> d, 1000
/// frames a second) loses nothing meanwhile, and valed lives on.
fn killed_then_replaced(role: Role) {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let s = Setup::new(role);
    let v = &s.v;

    // The other pair: d first, so that b's announcement (a broadcast) is the one frame d gets
    // that c did not send.
    let d = s.sink("vale0:d", MAC_D);
    let b = s.sink("vale0:b", MAC_B);
    assert!(
        wait_until(T, || {
            let c = v.counters("vale0:d");
            c.rx_packets + c.rx_drops == 1
        }),
        "b's announcement did not reach d: {:?}",
        v.counters("vale0:d")
    );
    v.ctl_ok(&["create", "vale0:c"]);
    let c = Kid::spawn(
        v.pktgen(&[
            "-i", "vale0:c", "-f", "tx", "-R", "1000", "-T", "300", "-D", MAC_D, "--json",
        ]),
        "vale-pktgen tx c",
    );
    assert!(
        wait_until(T, || v.counters("vale0:d").rx_packets > 1),
        "c -> d does not flow: {:?}",
        v.counters("vale0:c")
    );

    // The first testpmd: accounted for up to its stop, then let go again and killed while it
    // sends.
    let mut tp = s.txonly_to_b();
    tp.command("start");
    let at = v.counters("vale0:vm1").tx_packets;
    assert!(
        wait_until_every(SLOW, Duration::from_millis(20), || s.vm().tx_packets
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
    if role == Role::ValedConnects {
        // The killed testpmd left its socket file; a new one refuses to listen over it.
        std::fs::remove_file(&s.sock).expect("remove the killed testpmd's socket");
    }

    // The next testpmd on the same socket is served and accounted for exactly.
    let tp = s.txonly_to_b();
    let d_after = v.counters("vale0:d").rx_packets;
    tp.quit(Instant::now() + SLOW);
    s.wait_down("testpmd quit");
    assert!(
        d_after > d_at_kill,
        "c -> d stalled while testpmd was replaced: {d_at_kill} then {d_after}"
    );

    // The other pair lost nothing: each frame c sent reached d (with b's announcement).
    let cr = stop_pktgen(c, "vale-pktgen tx c");
    let cc = v.counters("vale0:c");
    assert_eq!(
        (cc.tx_packets, cc.tx_drops),
        (num(&cr, "packets"), 0),
        "{cr}"
    );
    let mut dc = v.counters("vale0:d");
    assert!(
        wait_until(T, || {
            dc = v.counters("vale0:d");
            dc.rx_packets + dc.rx_drops == cc.tx_packets + 1
        }),
        "c sent {} frames, d took {} and dropped {} (with b's announcement)",
        cc.tx_packets,
        dc.rx_packets,
        dc.rx_drops
    );
    assert_eq!(dc.rx_drops, 0, "the other pair lost frames: {dc:?}");
    let dr = stop_pktgen(d, "vale-pktgen rx d");
    assert_eq!(num(&dr, "packets"), dc.rx_packets, "{dr}");
    let bc = v.counters("vale0:b");
    let br = stop_pktgen(b, "vale-pktgen rx b");
    assert_eq!(
        (num(&br, "packets"), num(&br, "drops")),
        (bc.rx_packets, bc.rx_drops),
        "{br}"
    );
    let mut v = s.v;
    assert!(v.alive(), "valed died; its log:\n{}", v.log());
    eprintln!(
        "c -> d: {} frames; testpmd -> b: {} frames, {} dropped at b; test took {:.1?}",
        cc.tx_packets,
        bc.rx_packets,
        bc.rx_drops,
        t0.elapsed()
    );
}

#[test]
fn testpmd_killed_then_replaced_valed_listening() {
    killed_then_replaced(Role::ValedListens);
}

#[test]
fn testpmd_killed_then_replaced_valed_connecting() {
    killed_then_replaced(Role::ValedConnects);
}

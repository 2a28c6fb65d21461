//! Ports and valed coming and going: killed clients, open/close churn, valed's own exit, and
//! one valed per run directory.

use std::time::{Duration, Instant};

use vale_tests::*;

// The tests of this file count the test process's own descriptors and mappings, which the
// other tests would disturb: they run one at a time (see [`serial`]).

fn own_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Mappings of port regions in the test process.
fn own_vale_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| l.contains("memfd:vale:"))
        .count()
}

/// valed's descriptor count once it stops changing (control connections of vale-ctl and of
/// closed ports are torn down by valed's threads shortly after the peer goes).
fn settled_fd_count(v: &Valed) -> usize {
    let mut last = v.fd_count();
    let mut same = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while same < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let n = v.fd_count();
        if n == last {
            same += 1;
        } else {
            same = 0;
            last = n;
        }
    }
    last
}

/// Requires every switch of `v` to be gone within 2 s (`when` says when, in a failure).
fn assert_no_ports_left(v: &Valed, when: &str) {
    assert!(
        wait_until_every(Duration::from_secs(2), Duration::from_millis(5), || v
            .list()
            .is_empty()),
        "ports left {when}: {:?}",
        v.list().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
}

#[test]
fn sigkill_of_a_client_frees_its_port_at_once() {
    let _g = serial();
    let mut v = Valed::start();
    let kid = v.spawn_client(
        v.pktgen(&["-i", "vale0:k", "-f", "rx", "-q"]),
        "vale-pktgen",
        "vale0:k",
    );
    // SIGKILL: no chance for the client to say goodbye.
    kid.signal(libc::SIGKILL);
    let t0 = Instant::now();
    kid.finish(T);
    let gone = wait_until_every(Duration::from_secs(1), Duration::from_millis(5), || {
        v.port("vale0:k").is_none()
    });
    let took = t0.elapsed();
    assert!(
        gone,
        "vale0:k still listed {took:?} after its owner was killed: {:?}",
        v.port("vale0:k")
    );
    assert!(
        took <= Duration::from_secs(1),
        "port freed only after {took:?}"
    );
    eprintln!("port freed {took:?} after SIGKILL");
    // The name is free again, and the new port works.
    let k = v.open("vale0:k");
    let b = v.open("vale0:b");
    send_and_expect(
        &k,
        &b,
        &test_frame(100, MAC_A, MAC_B, 1),
        "the new vale0:k's frame",
    );
    assert_eq!(
        v.port("vale0:k").and_then(|p| p.owner_pid),
        Some(std::process::id())
    );
    assert!(v.alive(), "valed died: {}", v.log());
}

#[test]
fn open_close_churn_leaks_nothing() {
    let _g = serial();
    let mut v = Valed::start();
    let own_fds_before = own_fd_count();
    let own_maps_before = own_vale_mappings();
    let names = ["vale0:c", "vale1:c"];
    let cycle = |i: usize| {
        let name = names[i % 2];
        let mut o = v.options();
        if i.is_multiple_of(5) {
            o.rings(4, 4);
        }
        if i.is_multiple_of(7) {
            o.slots(64).buf_size(128);
        }
        // Closing is synchronous: the name is free again the moment drop returns.
        let p = o
            .open(name)
            .unwrap_or_else(|e| panic!("cycle {i}: open {name}: {e}"));
        let want = if i.is_multiple_of(5) { 4 } else { 1 };
        assert_eq!(p.params().tx_rings, want);
        p.txsync(0).expect("txsync");
        p.rxsync(0).expect("rxsync");
        drop(p);
    };
    let t0 = Instant::now();
    for i in 0..50 {
        cycle(i);
    }
    assert_no_ports_left(&v, "after warm-up");
    let fds_warm = settled_fd_count(&v);
    let rss_warm = v.rss_kib();
    for i in 50..1000 {
        cycle(i);
    }
    let churn = t0.elapsed();
    assert_no_ports_left(&v, "after 1000 cycles");
    let fds_end = settled_fd_count(&v);
    let rss_end = v.rss_kib();
    eprintln!(
        "1000 cycles in {churn:?}: valed fds {fds_warm} -> {fds_end}, \
         rss {rss_warm} KiB -> {rss_end} KiB; own fds {own_fds_before} -> {}",
        own_fd_count()
    );
    assert!(v.alive(), "valed died: {}", v.log());
    assert_eq!(fds_end, fds_warm, "valed leaks descriptors");
    assert!(
        rss_end < rss_warm + 2048,
        "valed's RSS grew from {rss_warm} KiB to {rss_end} KiB over 950 cycles"
    );
    assert_eq!(
        own_fd_count(),
        own_fds_before,
        "libvale leaks descriptors in the client"
    );
    assert_eq!(
        own_vale_mappings(),
        own_maps_before,
        "libvale leaks region mappings in the client"
    );
}

#[test]
fn sigterm_exits_cleanly_and_clients_survive() {
    let _g = serial();
    let mut v = Valed::start();
    let (a, b) = v.open_ab();
    send_and_expect(&a, &b, &test_frame(60, MAC_A, MAC_B, 0), "a->b");
    let sock = v.run_dir().join(vale_abi::control::SOCKET_NAME);
    assert!(sock.exists());

    v.signal(libc::SIGTERM);
    let t0 = Instant::now();
    let exited = wait_until_every(Duration::from_secs(2), Duration::from_millis(5), || {
        !v.alive()
    });
    let took = t0.elapsed();
    assert!(exited, "valed still running 2 s after SIGTERM: {}", v.log());
    eprintln!("valed exited {took:?} after SIGTERM");
    assert!(
        !sock.exists(),
        "valed left its socket {} behind",
        sock.display()
    );
    assert!(
        v.log().contains("valed exiting"),
        "valed's log does not say it exited: {}",
        v.log()
    );

    // The clients still hold their mappings: ring operations work on the memory and nothing
    // crashes, but every sync, wait and control request says valed went away: a wait at
    // once, a sync within a few milliseconds (it looks at most once per clock tick).
    let client = std::thread::spawn(move || {
        let f = test_frame(60, MAC_A, MAC_B, 1);
        let sent = send_frame(&a, &f);
        let soon = Instant::now() + Duration::from_secs(1);
        let fails_soon = |sync: &dyn Fn() -> std::io::Result<()>| loop {
            match sync() {
                Err(e) => return Err(e.kind()),
                Ok(()) if Instant::now() >= soon => return Ok(()),
                Ok(()) => std::thread::sleep(Duration::from_micros(100)),
            }
        };
        let tx = fails_soon(&|| a.txsync(0));
        let rx = fails_soon(&|| b.rxsync(0));
        let t = Instant::now();
        let got = b.poll(READABLE, None).map_err(|e| e.kind());
        let waited = t.elapsed();
        let counters = a.counters();
        let t = Instant::now();
        drop(a);
        drop(b);
        (sent, tx, rx, got, waited, counters.is_err(), t.elapsed())
    });
    let (sent, tx, rx, got, waited, counters_failed, closing) = join_by(
        "a client operation after valed exited",
        client,
        Instant::now() + Duration::from_secs(5),
    );
    assert!(sent, "the tx ring had room");
    let gone = Err(std::io::ErrorKind::ConnectionReset);
    assert_eq!(tx, gone, "txsync after valed exit");
    assert_eq!(rx, gone, "rxsync after valed exit");
    assert_eq!(
        got,
        Err(std::io::ErrorKind::ConnectionReset),
        "poll after valed exit"
    );
    assert!(
        waited < Duration::from_millis(100),
        "poll waited {waited:?}"
    );
    assert!(
        counters_failed,
        "a control request to a dead valed did not fail"
    );
    assert!(
        closing < Duration::from_millis(500),
        "closing took {closing:?}"
    );
    // Opening without a valed fails (no autostart here) instead of hanging.
    let opened = std::thread::spawn({
        let o = v.options();
        move || o.open("vale0:z").map(|_| ()).map_err(|e| e.to_string())
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    assert!(join_by("an open with no valed running", opened, deadline).is_err());
}

#[test]
fn second_valed_on_the_same_run_dir_refuses_to_start() {
    let _g = serial();
    let mut v = Valed::start();
    let a = v.open("vale0:a");
    let out = valed_refusing(v.run_dir(), &[]);
    assert_exit(&out, "second valed", 1, "another valed is running");
    // The first one is untouched: alive, socket in place, old and new ports work.
    assert!(v.alive(), "first valed died: {}", v.log());
    assert!(v.run_dir().join(vale_abi::control::SOCKET_NAME).exists());
    let b = v.open("vale0:b");
    one_at_a_time(&a, &b, 10);
    assert_eq!(
        v.port("vale0:a").unwrap().owner_pid,
        Some(std::process::id())
    );
    assert_eq!(v.list().len(), 1);
}

/// Closing a port and opening the same name again at once, from the same process, as a
/// program that reconfigures its port would.
#[test]
fn immediate_reopen_of_a_closed_port_succeeds() {
    let _g = serial();
    let v = Valed::start();
    let mut failures = Vec::new();
    for i in 0..1000 {
        match v.options().open("vale0:c") {
            Ok(p) => drop(p),
            Err(e) => {
                failures.push((i, e.to_string()));
                // Let valed catch up before the next cycle.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 1000 immediate reopens failed, first: {:?}",
        failures.len(),
        failures.first()
    );
}

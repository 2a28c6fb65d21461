//! End-to-end forwarding: frames through a real valed, sent and received by libvale clients
//! and by vale-pktgen, checked byte for byte and against valed's counters.
//!
//! The tests of this file run one at a time (see [`serial`]): several take timings or rates,
//! and the machine may have few CPUs.

use std::time::{Duration, Instant};

use vale::{Port, PortParams};
use vale_tests::*;

const MAC_D: [u8; 6] = [2, 0, 0, 0, 0, 0xd];

fn assert_nothing(port: &Port) {
    let got = recv_frames(port);
    assert!(
        got.is_empty(),
        "{} received {} unexpected frame(s)",
        port.name(),
        got.len()
    );
}

/// Sends `frame` from `from`, so the bridge learns its source there, and takes whatever
/// `others` received of it off their rings.
fn learn(from: &Port, frame: Vec<u8>, others: &[&Port]) {
    send_all(from, &[frame]);
    for p in others {
        recv_frames(p);
    }
}

/// None of `ports` dropped a frame or was blamed for bad input.
fn assert_clean(v: &Valed, ports: &[&str]) {
    for p in ports {
        let k = v.counters(p);
        assert_eq!(
            (k.rx_drops, k.tx_drops, k.bad_input),
            (0, 0, 0),
            "{p}: {k:?}"
        );
    }
}

/// Sends `n` checked frames from `tx` to `rx` with at most `window` in flight (so a full
/// receive ring never drops), and checks that each arrives once, whole and in order.
fn stream(tx: &Port, rx: &Port, src: [u8; 6], dst: [u8; 6], n: u64, window: u64) {
    let len = |seq: u64| 60 + (seq * 7 % 1455) as usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut got) = (0u64, 0u64);
    while got < n {
        assert!(
            Instant::now() < deadline,
            "{} -> {}: {got} of {n} frames after 60 s",
            tx.name(),
            rx.name()
        );
        while sent < n && sent - got < window {
            if !send_frame(tx, &test_frame(len(sent), src, dst, sent)) {
                break;
            }
            sent += 1;
        }
        tx.txsync(0).expect("txsync");
        let frames = recv_frames(rx);
        if frames.is_empty() {
            rx.poll(READABLE, Some(Duration::from_millis(100)))
                .expect("poll");
            continue;
        }
        for f in frames {
            assert!(got < sent, "{}: a frame nobody sent", rx.name());
            let want = test_frame(len(got), src, dst, got);
            assert!(
                f == want,
                "{}: frame {got} differs (len {}, want {})",
                rx.name(),
                f.len(),
                want.len()
            );
            got += 1;
        }
    }
}

fn float(r: &serde_json::Value, field: &str) -> f64 {
    r[field]
        .as_f64()
        .unwrap_or_else(|| panic!("report field {field} missing or not a number: {r}"))
}

/// vale-pktgen tx on vale0:a, vale-pktgen rx on vale0:b: every frame sent is received or
/// counted as dropped at b, and the reports agree with valed's counters.
fn pktgen_pair(len: u64, dst: &str, tx_extra: &[&str], rx_extra: &[&str]) {
    let _s = serial();
    let v = Valed::start();
    let count = 200_000u64;
    // a is persistent, so its counters stay listed after the sender exits.
    v.ctl_ok(&["create", "vale0:a"]);
    let mut rx = v.pktgen(&["-i", "vale0:b", "-f", "rx", "-T", "120", "--json"]);
    rx.args(rx_extra);
    let rx = v.spawn_client(rx, "vale-pktgen rx", "vale0:b");
    let (l, n) = (len.to_string(), count.to_string());
    let mut tx = v.pktgen(&[
        "-i", "vale0:a", "-f", "tx", "-l", &l, "-n", &n, "-D", dst, "--json",
    ]);
    tx.args(tx_extra);
    let tx = Kid::spawn(tx, "vale-pktgen tx").finish(Duration::from_secs(60));
    let t = report(&tx, "vale-pktgen tx");
    assert_eq!(t["mode"], "tx", "{t}");
    assert_eq!(t["port"], "vale0:a", "{t}");
    assert_eq!(num(&t, "frame_len"), len, "{t}");
    assert_eq!(num(&t, "packets"), count, "{t}");
    assert_eq!(num(&t, "bytes"), count * len, "{t}");
    assert_eq!(num(&t, "drops"), 0, "{t}");
    let secs = float(&t, "seconds");
    assert!(secs > 0.0, "{t}");
    let pps = float(&t, "pps");
    assert!((pps * secs / count as f64 - 1.0).abs() < 0.01, "pps: {t}");
    let bps = float(&t, "bps");
    assert!(
        (bps * secs / (8 * count * len) as f64 - 1.0).abs() < 0.01,
        "bps: {t}"
    );
    assert!(t.get("rtt").is_none(), "tx has no rtt: {t}");

    // Every frame reaches b's ring or is counted as dropped there.
    assert!(
        wait_until(T, || {
            let c = v.counters("vale0:b");
            c.rx_packets + c.rx_drops >= count
        }),
        "b accounts for fewer than {count} frames: {:?}",
        v.counters("vale0:b")
    );
    // Let the receiver read what was delivered; take valed's view while it still holds b,
    // then stop it.
    std::thread::sleep(Duration::from_millis(500));
    let list = v.list();
    rx.signal(libc::SIGTERM);
    let rx_out = rx.finish(T);
    let r = report(&rx_out, "vale-pktgen rx");

    assert_eq!(list.len(), 1);
    let a = list[0].ports.iter().find(|p| p.name == "vale0:a").unwrap();
    let b = list[0].ports.iter().find(|p| p.name == "vale0:b").unwrap();
    assert!(a.persistent);
    assert_eq!(a.counters.tx_packets, count, "{a:?}");
    assert_eq!(a.counters.tx_bytes, count * len, "{a:?}");
    assert_eq!((a.counters.tx_drops, a.counters.bad_input), (0, 0), "{a:?}");
    assert_eq!(a.counters.rx_packets, 0, "{a:?}");
    let bc = b.counters;
    assert_eq!(bc.rx_packets + bc.rx_drops, count, "{bc:?}");
    assert_eq!(bc.rx_bytes, bc.rx_packets * len, "{bc:?}");
    assert_eq!((bc.tx_packets, bc.bad_input), (0, 0), "{bc:?}");
    assert!(bc.rx_packets > 0, "nothing delivered: {bc:?}");

    assert_eq!(r["mode"], "rx", "{r}");
    assert_eq!(r["port"], "vale0:b", "{r}");
    assert_eq!(num(&r, "packets"), bc.rx_packets, "rx report vs valed: {r}");
    assert_eq!(num(&r, "bytes"), bc.rx_bytes, "rx report vs valed: {r}");
    assert_eq!(num(&r, "drops"), bc.rx_drops, "rx report vs valed: {r}");
    assert_eq!(num(&r, "packets") + num(&r, "drops"), count, "{r}");
}

#[test]
fn pktgen_60_byte_frames_all_accounted_for() {
    pktgen_pair(60, "ff:ff:ff:ff:ff:ff", &[], &[]);
}

#[test]
fn pktgen_1514_byte_frames_all_accounted_for() {
    // An unknown unicast destination: flooded, so b gets it.
    pktgen_pair(1514, "02:00:00:00:00:0b", &[], &[]);
}

#[test]
fn pktgen_9000_byte_jumbo_chains_all_accounted_for() {
    pktgen_pair(9000, "ff:ff:ff:ff:ff:ff", &[], &[]);
}

#[test]
fn pktgen_multi_ring_small_buffer_ports_all_accounted_for() {
    // 4 tx rings of 512-byte buffers (18-slot chains) into 2 rx rings of 256 slots.
    pktgen_pair(
        9000,
        "ff:ff:ff:ff:ff:ff",
        &["--tx-rings", "4", "--buf-size", "512"],
        &["--rx-rings", "2", "--slots", "256"],
    );
}

#[test]
fn pktgen_multi_ring_short_frames_all_accounted_for() {
    pktgen_pair(
        60,
        "ff:ff:ff:ff:ff:ff",
        &["--tx-rings", "3", "--slots", "64", "-b", "16"],
        &["--rx-rings", "4"],
    );
}

#[test]
fn pktgen_rx_batch_of_one_all_accounted_for() {
    pktgen_pair(60, "ff:ff:ff:ff:ff:ff", &["-b", "4"], &["-b", "1"]);
}

/// `vale-pktgen -f rx --announce` makes the learning bridge learn the receiver: unicast to its
/// MAC reaches it and no other port (a persistent third port sees only the announcement).
#[test]
fn pktgen_announce_lets_unicast_skip_flooding() {
    let _s = serial();
    let v = Valed::start();
    let mac = "02:00:00:00:00:0b";
    v.ctl_ok(&["create", "vale0:a"]);
    v.ctl_ok(&["create", "vale0:c"]);
    let rx = v.pktgen(&[
        "-i",
        "vale0:b",
        "-f",
        "rx",
        "-T",
        "120",
        "--json",
        "--announce",
        "-S",
        mac,
        "-b",
        "64",
    ]);
    let rx = v.spawn_client(rx, "vale-pktgen rx", "vale0:b");
    assert!(
        wait_until(T, || v.counters("vale0:b").tx_packets == 1),
        "no announcement from b: {:?}",
        v.counters("vale0:b")
    );
    let count = 50_000u64;
    let n = count.to_string();
    let tx = v.pktgen(&["-i", "vale0:a", "-f", "tx", "-n", &n, "-D", mac, "--json"]);
    let t = report(
        &Kid::spawn(tx, "vale-pktgen tx").finish(Duration::from_secs(60)),
        "vale-pktgen tx",
    );
    assert_eq!(num(&t, "packets"), count, "{t}");
    assert!(
        wait_until(T, || {
            let c = v.counters("vale0:b");
            c.rx_packets + c.rx_drops >= count
        }),
        "b accounts for fewer than {count} frames: {:?}",
        v.counters("vale0:b")
    );
    let c = v.counters("vale0:c");
    assert_eq!(
        c.rx_packets + c.rx_drops,
        1,
        "c saw more than the announcement: {c:?}"
    );
    let a = v.counters("vale0:a");
    assert_eq!(
        a.rx_packets + a.rx_drops,
        1,
        "a saw more than the announcement: {a:?}"
    );
    // Let the receiver read what was delivered; take valed's view while it still holds b.
    std::thread::sleep(Duration::from_millis(500));
    let b = v.counters("vale0:b");
    rx.signal(libc::SIGTERM);
    let r = report(&rx.finish(T), "vale-pktgen rx");
    assert_eq!(num(&r, "packets"), b.rx_packets, "{r}");
    assert_eq!(b.rx_packets + b.rx_drops, count, "{b:?}");
}

/// `--announce` is refused where it means nothing.
#[test]
fn pktgen_announce_only_for_receivers() {
    let _s = serial();
    let v = Valed::start();
    let out = run_bounded(
        &mut v.pktgen(&["-i", "vale0:a", "-f", "tx", "-n", "1", "--announce"]),
        T,
    );
    assert_exit(
        &out,
        "vale-pktgen",
        1,
        "--announce is for -f rx and -f pong",
    );
}

/// Sends each size from `a` to `b` and checks it arrives whole, as one frame, in as many
/// slots as b's buffer size requires.
fn jumbo_between(a: &Port, b: &Port, src: [u8; 6], dst: [u8; 6], sizes: &[usize]) {
    let bsize = b.params().buf_size as usize;
    let ring = b.rx_ring(0);
    for (seq, &len) in sizes.iter().enumerate() {
        let f = test_frame(len, src, dst, seq as u64);
        send_all(a, std::slice::from_ref(&f));
        b.rxsync(0).unwrap();
        let (cur, tail) = (ring.cur(), ring.tail());
        let slots = (tail + ring.num_slots() - cur) % ring.num_slots();
        assert_eq!(
            slots as usize,
            len.div_ceil(bsize),
            "{len}-byte frame into {bsize}-byte buffers"
        );
        // Every slot of the chain but the last is full and marked NS_MOREFRAG.
        let mut s = cur;
        for k in 0..slots {
            let slot = ring.slot(s);
            let last = k + 1 == slots;
            assert_eq!(
                slot.flags & vale::NS_MOREFRAG == 0,
                last,
                "slot {k} of {len}"
            );
            if !last {
                assert_eq!(slot.len as usize, bsize, "slot {k} of {len}");
            }
            s = ring.next(s);
        }
        let got = recv_frames(b);
        assert_eq!(got.len(), 1, "{len}-byte frame: {} frames", got.len());
        assert!(got[0] == f, "{len}-byte frame differs");
    }
}

#[test]
fn jumbo_frames_arrive_byte_identical() {
    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_ab();
    let sizes = [60, 1514, 1515, 2047, 2048, 2049, 4096, 9000, 65536];
    jumbo_between(&a, &b, MAC_A, MAC_B, &sizes);
    let total: u64 = sizes.iter().map(|&s| s as u64).sum();
    let ac = v.counters("vale0:a");
    let bc = v.counters("vale0:b");
    assert_eq!((ac.tx_packets, ac.tx_bytes), (sizes.len() as u64, total));
    assert_eq!((bc.rx_packets, bc.rx_bytes), (sizes.len() as u64, total));
    assert_eq!((ac.bad_input, bc.rx_drops), (0, 0));
}

#[test]
fn jumbo_frames_between_different_buffer_sizes() {
    let _s = serial();
    let v = Valed::start();
    let a = v.open("vale0:a");
    let b = v.options().buf_size(512).open("vale0:b").unwrap();
    let c = v
        .options()
        .buf_size(128)
        .slots(2048)
        .open("vale0:c")
        .unwrap();
    assert_eq!(b.params().buf_size, 512);
    assert_eq!(b.rx_ring(0).buf_size(), 512);
    assert_eq!(v.port("vale0:b").unwrap().buf_size, 512);
    let sizes = [60, 511, 512, 513, 1515, 2048, 4096, 9000, 65536];
    // Default-size buffers into 512-byte ones (c gets the flood too: drain it).
    jumbo_between(&a, &b, MAC_A, MAC_B, &sizes);
    assert_eq!(recv_frames(&c).len(), sizes.len());
    // 512 into default-size ones (a is learnt now: b's frames go to a only).
    jumbo_between(&b, &a, MAC_B, MAC_A, &sizes);
    assert_nothing(&c);
    // 128 into 512, and a 65536-byte frame of exactly 512 slots of 128 bytes.
    jumbo_between(&c, &b, MAC_C, MAC_B, &sizes);
    jumbo_between(&b, &c, MAC_B, MAC_C, &sizes);
    assert_clean(&v, &["vale0:a", "vale0:b", "vale0:c"]);
}

#[test]
fn chain_cut_by_head_waits_for_its_last_slot() {
    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_ab();
    let f = test_frame(5000, MAC_A, MAC_B, 7);
    let mut ring = a.tx_ring(0);
    let bsize = ring.buf_size() as usize;
    assert_eq!(f.chunks(bsize).len(), 3);
    let cur = write_chain(&mut ring, f.chunks(bsize), true);
    // Publish the first two slots only.
    let two = ring.next(ring.next(ring.cur()));
    ring.set_cur(two);
    ring.set_head(two);
    a.txsync(0).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    a.txsync(0).unwrap();
    assert_eq!(
        ring.space(),
        ring.num_slots() - 3,
        "valed took part of a chain"
    );
    assert!(wait_frames(&b, Duration::from_millis(50)).is_empty());
    assert_eq!(v.counters("vale0:a").bad_input, 0);
    // Then the last one.
    ring.set_cur(cur);
    ring.set_head(cur);
    a.txsync(0).unwrap();
    let got = recv_n(&b, 1);
    assert!(got[0] == f, "the completed chain differs");
    assert_eq!(v.counters("vale0:a").tx_packets, 1);
}

/// Queues `frames[r]` on tx ring `r` of `port`, for every r, syncs each ring, and waits until
/// valed took them all.
fn send_on_rings(port: &Port, frames: &[Vec<Vec<u8>>]) {
    for (r, ring_frames) in (0u32..).zip(frames) {
        for f in ring_frames {
            assert!(send_frame_on(port, r, f), "no room on tx ring {r}");
        }
        port.txsync(r).unwrap();
    }
    for r in 0..frames.len() as u32 {
        wait_tx_drained(port, r);
    }
}

/// Expects exactly `frames[r]`, in order, on rx ring `r` of `port`, for every r.
fn expect_on_rings(port: &Port, frames: &[Vec<Vec<u8>>]) {
    for (r, want) in (0u32..).zip(frames) {
        let got = recv_ring(port, r);
        assert!(
            got == *want,
            "{} rx ring {r}: {} frames, want {}, or not the frames sent",
            port.name(),
            got.len(),
            want.len()
        );
    }
}

#[test]
fn port_geometry_is_reported_and_every_tx_ring_forwards() {
    let _s = serial();
    let v = Valed::start();
    let mut o = v.options();
    o.rings(4, 4).slots(256);
    let a = o.open("vale0:a").unwrap();
    let b = o.open("vale0:b").unwrap();
    let c = v.options().rings(1, 2).open("vale0:c").unwrap();
    let want = PortParams {
        tx_rings: 4,
        rx_rings: 4,
        slots: 256,
        buf_size: vale::DEFAULT_BUF_SIZE,
    };
    assert_eq!(*a.params(), want);
    assert_eq!(*b.params(), want);
    for r in 0..4 {
        for ring in [a.tx_ring(r), a.rx_ring(r)] {
            assert_eq!(
                (ring.num_slots(), ring.buf_size()),
                (256, vale::DEFAULT_BUF_SIZE)
            );
        }
        assert_eq!(
            a.tx_ring(r).space(),
            255,
            "a fresh tx ring has n-1 free slots"
        );
    }
    for (name, tx, rx, slots) in [
        ("vale0:a", 4, 4, 256),
        ("vale0:b", 4, 4, 256),
        ("vale0:c", 1, 2, 1024),
    ] {
        let p = v.port(name).unwrap();
        assert_eq!(
            (p.tx_rings, p.rx_rings, p.slots, p.buf_size),
            (tx, rx, slots, vale::DEFAULT_BUF_SIZE),
            "{p:?}"
        );
        assert_eq!(p.owner_pid, Some(std::process::id()));
    }

    // One frame on each of a's tx rings. MAC_B is unknown: b and c both get them.
    let one: Vec<Vec<Vec<u8>>> = (0..4u64)
        .map(|r| vec![test_frame(100 + r as usize, MAC_A, MAC_B, r)])
        .collect();
    send_on_rings(&a, &one);
    // Frames from source ring r land on rx ring r modulo the destination's rx rings.
    expect_on_rings(&b, &one);
    // c has two rx rings: source rings 0 and 2 share its ring 0, 1 and 3 its ring 1 (in no
    // particular order between source rings).
    for r in 0..2u32 {
        let mut got = recv_ring(&c, r);
        got.sort();
        let mut want = [one[r as usize].clone(), one[r as usize + 2].clone()].concat();
        want.sort();
        assert!(got == want, "c rx ring {r}: {} frames", got.len());
    }
    let ac = v.counters("vale0:a");
    assert_eq!(ac.tx_packets, 4);
    assert_eq!(v.counters("vale0:b").rx_packets, 4);
    assert_eq!(v.counters("vale0:c").rx_packets, 4);

    // Several rings at once, many frames each: all arrive, in order per ring.
    let many: Vec<Vec<Vec<u8>>> = (0..4u64)
        .map(|r| {
            (0..200)
                .map(|k| test_frame(64, MAC_A, MAC_B, r * 1000 + k))
                .collect()
        })
        .collect();
    send_on_rings(&a, &many);
    expect_on_rings(&b, &many);
    assert_eq!(v.counters("vale0:b").rx_drops, 0);
}

#[test]
fn bad_geometry_is_refused_naming_the_field() {
    let _s = serial();
    let v = Valed::start();
    // The default geometry but for one field.
    let with = |set: fn(&mut PortParams)| {
        let mut p = PortParams::default();
        set(&mut p);
        p
    };
    let cases = [
        ("slots", with(|p| p.slots = 1000)),
        ("slots", with(|p| p.slots = 32)),
        ("slots", with(|p| p.slots = 8192)),
        ("tx rings", with(|p| p.tx_rings = 17)),
        ("rx rings", with(|p| p.rx_rings = 17)),
        ("tx rings", with(|p| p.tx_rings = 0)),
        ("buffer size", with(|p| p.buf_size = 100)),
        ("buffer size", with(|p| p.buf_size = 2000)),
    ];
    for (field, params) in cases {
        let mut o = v.options();
        o.params = params;
        let e = o
            .open("vale0:a")
            .err()
            .unwrap_or_else(|| panic!("{params:?} accepted"));
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        let m = e.to_string();
        assert!(
            m.contains(field),
            "{params:?}: message {m:?} does not name {field}"
        );
    }
    // Each field valid, the whole too large.
    let mut o = v.options();
    o.rings(16, 16).slots(4096).buf_size(16384);
    let m = o
        .open("vale0:a")
        .err()
        .expect("2 GiB port accepted")
        .to_string();
    assert!(m.contains("port memory"), "{m}");
    // Nothing was created, and valed still serves.
    assert!(v.list().is_empty());
    let _a = v
        .options()
        .slots(64)
        .buf_size(128)
        .rings(16, 16)
        .open("vale0:a")
        .unwrap();
    assert_eq!(v.port("vale0:a").unwrap().tx_rings, 16);
}

#[test]
fn learning_bridge_floods_unknown_then_forwards_to_the_learnt_port() {
    let _s = serial();
    let v = Valed::start();
    let (a, b, c) = v.open_abc();

    // Nothing is learnt: a's frame for MAC_B is flooded to b and c.
    let f = test_frame(60, MAC_A, MAC_B, 0);
    send_all(&a, std::slice::from_ref(&f));
    assert_eq!(recv_n(&b, 1), vec![f.clone()]);
    assert_eq!(recv_n(&c, 1), vec![f]);
    assert_eq!(v.counters("vale0:a").tx_drops, 0);

    // MAC_A was learnt on a: b's reply goes to a only.
    let r = test_frame(60, MAC_B, MAC_A, 1);
    send_all(&b, std::slice::from_ref(&r));
    assert_eq!(recv_n(&a, 1), vec![r]);
    assert_nothing(&c);
    assert_nothing(&b);
    let c_before = v.counters("vale0:c");
    assert_eq!(c_before.rx_packets, 1);

    // MAC_B was learnt on b: 100 frames go to b only.
    let frames: Vec<Vec<u8>> = (0..100)
        .map(|s| test_frame(60 + s as usize, MAC_A, MAC_B, 100 + s))
        .collect();
    send_all(&a, &frames);
    assert_eq!(recv_n(&b, 100), frames);
    assert_nothing(&c);
    assert_nothing(&a);
    assert_eq!(v.counters("vale0:c"), c_before, "c's counters moved");
    assert_eq!(v.counters("vale0:b").rx_packets, 101);

    // Broadcast still reaches everybody but the sender.
    let bc = test_frame(60, MAC_A, BROADCAST, 1000);
    send_all(&a, std::slice::from_ref(&bc));
    assert_eq!(recv_n(&b, 1), vec![bc.clone()]);
    assert_eq!(recv_n(&c, 1), vec![bc]);
    assert_nothing(&a);
    // A multicast (group bit) too.
    let mc = test_frame(60, MAC_A, [0x01, 0, 0x5e, 0, 0, 1], 1001);
    send_all(&a, std::slice::from_ref(&mc));
    assert_eq!(recv_n(&b, 1), vec![mc.clone()]);
    assert_eq!(recv_n(&c, 1), vec![mc]);

    // A frame to the sender's own address has nowhere to go: a tx drop, delivered nowhere.
    let own = test_frame(60, MAC_A, MAC_A, 1002);
    send_all(&a, std::slice::from_ref(&own));
    assert_nothing(&a);
    assert_nothing(&b);
    assert_nothing(&c);
    let ac = v.counters("vale0:a");
    assert_eq!((ac.tx_packets, ac.tx_drops), (104, 1), "{ac:?}");
}

#[test]
fn hub_lookup_floods_learnt_unicast() {
    let _s = serial();
    let v = Valed::start();
    let (a, b, c) = v.open_abc();
    assert_eq!(v.list()[0].lookup, "learning");
    // Teach the bridge where MAC_A and MAC_B are.
    learn(&a, test_frame(60, MAC_A, MAC_B, 0), &[&b, &c]);
    learn(&b, test_frame(60, MAC_B, MAC_A, 1), &[&a, &c]);
    send_all(&a, &[test_frame(60, MAC_A, MAC_B, 2)]);
    assert_eq!(recv_n(&b, 1).len(), 1);
    assert_nothing(&c);

    v.ctl_ok(&["set", "vale0", "lookup", "hub"]);
    assert_eq!(v.list()[0].lookup, "hub");
    let frames: Vec<Vec<u8>> = (0..10)
        .map(|s| test_frame(80, MAC_A, MAC_B, 10 + s))
        .collect();
    send_all(&a, &frames);
    assert_eq!(recv_n(&b, 10), frames);
    assert_eq!(recv_n(&c, 10), frames);
    assert_nothing(&a);
    // Under the hub even a frame to the sender's own address goes everywhere else.
    let own = test_frame(60, MAC_A, MAC_A, 99);
    send_all(&a, std::slice::from_ref(&own));
    assert_eq!(recv_n(&b, 1), vec![own.clone()]);
    assert_eq!(recv_n(&c, 1), vec![own]);
    assert_nothing(&a);
}

#[test]
fn unknown_lookup_module_is_refused() {
    let _s = serial();
    let v = Valed::start();
    let _a = v.open("vale0:a");
    v.ctl_fails(
        &["set", "vale0", "lookup", "nosuch"],
        1,
        "no lookup module 'nosuch' (known: learning, hub, vlan, flow; or the path of a shared object)",
    );
    assert_eq!(v.list()[0].lookup, "learning", "the module changed anyway");
    v.ctl_fails(
        &["set", "vale9", "lookup", "hub"],
        1,
        "no such switch 'vale9'",
    );
}

#[test]
fn full_rx_ring_drops_and_counts_without_blocking_the_sender() {
    let _s = serial();
    let v = Valed::start();
    let a = v.open("vale0:a");
    let b = v.options().slots(64).open("vale0:b").unwrap();
    let frames: Vec<Vec<u8>> = (0..1000).map(|s| test_frame(60, MAC_A, MAC_B, s)).collect();
    let start = Instant::now();
    for f in &frames {
        send_waiting(&a, f);
    }
    a.txsync(0).unwrap();
    wait_tx_drained(&a, 0);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "valed took {took:?} for 1000 frames toward a full ring"
    );
    let bc = v.counters("vale0:b");
    assert_eq!(bc.rx_packets, 63, "a 64-slot ring holds 63 frames: {bc:?}");
    assert_eq!(bc.rx_drops, 1000 - 63, "{bc:?}");
    assert_eq!(bc.rx_bytes, 63 * 60, "{bc:?}");
    let ac = v.counters("vale0:a");
    assert_eq!((ac.tx_packets, ac.tx_drops), (1000, 0), "{ac:?}");

    // The 63 first frames wait intact on the ring.
    let got = recv_frames(&b);
    assert_eq!(got.len(), 63);
    assert!(got == frames[..63], "the queued frames changed");
    // With room again, new frames arrive.
    let more: Vec<Vec<u8>> = (0..10)
        .map(|s| test_frame(61, MAC_A, MAC_B, 5000 + s))
        .collect();
    send_all(&a, &more);
    assert_eq!(recv_n(&b, 10), more);
    let bc = v.counters("vale0:b");
    assert_eq!((bc.rx_packets, bc.rx_drops), (73, 937), "{bc:?}");
}

#[test]
fn batch_knob_of_one_still_forwards_in_order() {
    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_ab();
    assert_eq!(v.list()[0].batch, 512);
    v.ctl_ok(&["set", "vale0", "batch", "1"]);
    assert_eq!(v.list()[0].batch, 1);
    // 100 frames queued at once, taken one per pass.
    let frames: Vec<Vec<u8>> = (0..100)
        .map(|s| test_frame(60 + s as usize, MAC_A, MAC_B, s))
        .collect();
    for f in &frames {
        assert!(send_frame(&a, f));
    }
    a.txsync(0).unwrap();
    assert_eq!(recv_n(&b, 100), frames);
    stream(&a, &b, MAC_A, MAC_B, 5000, 200);

    for (value, message) in [
        ("0", "batch must be 1 to 2048, not 0"),
        ("5000", "batch must be 1 to 2048, not 5000"),
        ("-1", "batch must be a number"),
        ("many", "batch must be a number"),
    ] {
        v.ctl_fails(&["set", "vale0", "batch", value], 1, message);
    }
    assert_eq!(v.list()[0].batch, 1, "a refused value changed the batch");
    v.ctl_ok(&["set", "vale0", "batch", "2048"]);
    assert_eq!(v.list()[0].batch, 2048);
    stream(&a, &b, MAC_A, MAC_B, 5000, 500);
}

#[test]
fn valed_batch_option_sets_the_batch_of_new_switches() {
    let _s = serial();
    let v = Valed::start_with(&["--batch", "7"]);
    let (a, b) = v.open_ab();
    assert_eq!(v.list()[0].batch, 7);
    stream(&a, &b, MAC_A, MAC_B, 2000, 100);
}

#[test]
fn two_workers_forward_two_streams_concurrently() {
    let _s = serial();
    let v = Valed::start_with(&["--workers", "2"]);
    // Rings go to workers round-robin in opening order: a and c land on different workers.
    let a = v.open("vale0:a");
    let c = v.open("vale0:c");
    let b = v.open("vale0:b");
    let d = v.open("vale0:d");
    // (valed listens before it starts its workers: count them once it has answered.)
    let workers = std::fs::read_dir(format!("/proc/{}/task", v.pid()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("vale-worker-"))
        .count();
    assert_eq!(
        workers, 2,
        "valed --workers 2 runs {workers} worker threads"
    );
    // Let the bridge learn b and d, then drain everything.
    learn(&b, test_frame(60, MAC_B, BROADCAST, 0), &[&a, &c, &d]);
    learn(&d, test_frame(60, MAC_D, BROADCAST, 0), &[&a, &b, &c]);
    let n = 50_000;
    std::thread::scope(|s| {
        s.spawn(|| stream(&a, &b, MAC_A, MAC_B, n, 256));
        s.spawn(|| stream(&c, &d, MAC_C, MAC_D, n, 256));
    });
    assert_nothing(&b);
    assert_nothing(&d);
    for (tx, rx) in [("vale0:a", "vale0:b"), ("vale0:c", "vale0:d")] {
        let t = v.counters(tx);
        let r = v.counters(rx);
        assert_eq!(
            (t.tx_packets, t.tx_drops, t.bad_input),
            (n, 0, 0),
            "{tx}: {t:?}"
        );
        // +1: the other receiver's broadcast.
        assert_eq!((r.rx_packets, r.rx_drops), (n + 1, 0), "{rx}: {r:?}");
    }
}

/// valed's forwarding workers, as `vale-ctl top` sees them.
fn workers(v: &Valed) -> Vec<vale_abi::control::WorkerInfo> {
    use vale_abi::control::{self, Reply, Request};
    let sock =
        std::os::unix::net::UnixStream::connect(v.run_dir().join(control::SOCKET_NAME)).unwrap();
    match control::exchange(&sock, &Request::Workers).unwrap() {
        Some((Reply::Workers { workers }, _)) => workers,
        other => panic!("workers: {other:?}"),
    }
}

/// Opens vale0:a, b, c, d in that order (with two workers, a and c land on worker 0) and lets
/// the bridge learn b and d.
fn four_ports_b_and_d_learnt(v: &Valed) -> [Port; 4] {
    let a = v.open("vale0:a");
    let b = v.open("vale0:b");
    let c = v.open("vale0:c");
    let d = v.open("vale0:d");
    learn(&b, test_frame(60, MAC_B, BROADCAST, 0), &[&a, &c, &d]);
    learn(&d, test_frame(60, MAC_D, BROADCAST, 0), &[&a, &b, &c]);
    [a, b, c, d]
}

/// Rings are dealt to workers in turn as ports open: opened a, b, c, d, the two senders a and
/// c land on worker 0 and worker 1 serves only receivers. Worker 0 hands one of them to worker
/// 1, which then forwards too; every frame of both streams arrives, in order, across the
/// hand-off.
#[test]
fn a_worker_with_two_sending_rings_hands_one_to_an_idle_worker() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let _s = serial();
    let v = Valed::start_with(&["--workers", "2"]);
    let [a, b, c, d] = four_ports_b_and_d_learnt(&v);
    // Worker 1 took the two broadcasts (its counters follow its pass a moment later).
    assert!(
        wait_until(Duration::from_secs(5), || workers(&v)[1].slots == 2),
        "{:?}",
        workers(&v)
    );
    let w = workers(&v);
    assert_eq!(
        w.iter().map(|w| (w.rings, w.slots)).collect::<Vec<_>>(),
        [(2, 0), (2, 2)],
        "{w:?}"
    );
    let idle_slots = w[1].slots;
    let (stop, rounds) = (
        AtomicBool::new(false),
        [AtomicU64::new(0), AtomicU64::new(0)],
    );
    let chunk = 5000;
    let handed = std::thread::scope(|s| {
        for (k, (tx, rx, src, dst)) in [(&a, &b, MAC_A, MAC_B), (&c, &d, MAC_C, MAC_D)]
            .into_iter()
            .enumerate()
        {
            let (stop, rounds) = (&stop, &rounds);
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    stream(tx, rx, src, dst, chunk, 256);
                    rounds[k].fetch_add(1, Relaxed);
                }
            });
        }
        let handed = wait_until(Duration::from_secs(20), || {
            workers(&v)[1].slots > idle_slots
        });
        stop.store(true, Relaxed);
        handed
    });
    let w = workers(&v);
    assert!(handed, "worker 1 never forwarded: {w:?}");
    assert_eq!(
        w.iter().map(|w| w.rings).collect::<Vec<_>>(),
        [1, 3],
        "{w:?}"
    );
    for (k, (tx, rx)) in [("vale0:a", "vale0:b"), ("vale0:c", "vale0:d")]
        .into_iter()
        .enumerate()
    {
        let n = rounds[k].load(Relaxed) * chunk;
        assert!(n > 0);
        let (t, r) = (v.counters(tx), v.counters(rx));
        assert_eq!(
            (t.tx_packets, t.tx_drops, t.bad_input),
            (n, 0, 0),
            "{tx}: {t:?}"
        );
        assert_eq!((r.rx_packets, r.rx_drops), (n + 1, 0), "{rx}: {r:?}");
    }
}

/// Ports that come and go while their rings are being handed between workers leave nothing
/// behind: each round opens four ports (so both senders often share a worker), streams
/// through them long enough for a hand-off, and closes them all; afterwards no worker serves
/// a ring and valed holds the descriptors it held before.
#[test]
fn rings_handed_between_workers_leave_with_their_ports() {
    let _s = serial();
    let v = Valed::start_with(&["--workers", "2"]);
    let fds_before = v.fd_count();
    let mut handed = 0;
    for round in 0..6 {
        let [a, b, c, d] = four_ports_b_and_d_learnt(&v);
        let before: Vec<u32> = workers(&v).iter().map(|w| w.rings).collect();
        let deadline = Instant::now() + Duration::from_millis(300);
        std::thread::scope(|s| {
            for (tx, rx, src, dst) in [(&a, &b, MAC_A, MAC_B), (&c, &d, MAC_C, MAC_D)] {
                s.spawn(move || {
                    while Instant::now() < deadline {
                        stream(tx, rx, src, dst, 2000, 256);
                    }
                });
            }
        });
        let after: Vec<u32> = workers(&v).iter().map(|w| w.rings).collect();
        if after != before {
            handed += 1;
        }
        eprintln!("round {round}: rings per worker {before:?} -> {after:?}");
        drop((a, b, c, d));
    }
    assert!(handed > 0, "no round handed a ring over");
    assert!(
        wait_until(Duration::from_secs(5), || {
            workers(&v).iter().all(|w| w.rings == 0) && v.fd_count() == fds_before
        }),
        "left behind: {:?}, {} descriptors (had {fds_before})",
        workers(&v),
        v.fd_count()
    );
    assert!(v.list().is_empty(), "{:?}", v.list());
}

#[test]
fn unicast_to_a_port_that_left_is_flooded_and_counted() {
    let _s = serial();
    let mut v = Valed::start();
    let (a, b, c) = v.open_abc();
    learn(&b, test_frame(60, MAC_B, MAC_A, 0), &[&a, &c]);
    send_all(&a, &[test_frame(60, MAC_A, MAC_B, 1)]);
    assert_eq!(recv_n(&b, 1).len(), 1);
    assert_nothing(&c);

    drop(b);
    assert!(
        wait_until(Duration::from_secs(2), || v.port("vale0:b").is_none()),
        "vale0:b still listed after its client closed it"
    );
    // MAC_B is forgotten with its port: flooded (to c), not lost.
    let frames: Vec<Vec<u8>> = (0..10)
        .map(|s| test_frame(60, MAC_A, MAC_B, 10 + s))
        .collect();
    send_all(&a, &frames);
    assert_eq!(recv_n(&c, 10), frames);
    let ac = v.counters("vale0:a");
    assert_eq!(ac.tx_packets, 11, "{ac:?}");

    // A new port takes b's index: it must not inherit b's address.
    let d = v.open("vale0:d");
    send_all(&a, &frames);
    assert_eq!(recv_n(&c, 10), frames);
    assert_eq!(recv_n(&d, 10), frames);

    // Alone on the switch, a's frames go nowhere; valed survives and counts them as sent.
    drop(c);
    drop(d);
    assert!(wait_until(Duration::from_secs(2), || v.list()[0]
        .ports
        .len()
        == 1));
    send_all(&a, &frames);
    let ac = v.counters("vale0:a");
    assert_eq!(ac.tx_packets, 31, "{ac:?}");
    assert!(v.alive(), "valed died: {}", v.log());
    assert_nothing(&a);
}

/// Queues one frame of `len` bytes whose first slot `bad` may spoil, syncs, waits until
/// valed took it, and restores the slot's buffer.
fn send_spoiled(a: &Port, len: usize, seq: u64, bad: impl FnOnce(&mut vale::NetmapSlot)) {
    let mut ring = a.tx_ring(0);
    let f = test_frame(len.max(22), MAC_A, MAC_B, seq);
    let cur = ring.cur();
    let (slot, buf) = ring.slot_and_buf(cur);
    let idx = slot.buf_idx;
    buf[..f.len().min(2048)].copy_from_slice(&f[..f.len().min(2048)]);
    slot.len = len as u16;
    slot.flags = 0;
    bad(slot);
    ring.advance(1);
    a.txsync(0).unwrap();
    wait_tx_drained(a, 0);
    let slot = ring.slot_mut(cur);
    slot.buf_idx = idx;
    slot.flags = 0;
}

#[test]
fn malformed_slots_count_as_bad_input_and_deliver_nothing() {
    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_ab();
    let num_bufs = 2 + 2 * 1024;
    type Spoil = Box<dyn FnOnce(&mut vale::NetmapSlot)>;
    let cases: Vec<(&str, usize, Spoil)> = vec![
        ("runt of 10 bytes", 10, Box::new(|_| {})),
        ("runt of 13 bytes", 13, Box::new(|_| {})),
        ("buf_idx 0", 60, Box::new(|s| s.buf_idx = 0)),
        ("buf_idx 1", 60, Box::new(|s| s.buf_idx = 1)),
        (
            "buf_idx past the pool",
            60,
            Box::new(move |s| s.buf_idx = num_bufs),
        ),
        ("buf_idx u32::MAX", 60, Box::new(|s| s.buf_idx = u32::MAX)),
        (
            "len > buf_size",
            vale::DEFAULT_BUF_SIZE as usize + 1,
            Box::new(|_| {}),
        ),
        ("len 65535", 65535, Box::new(|_| {})),
        ("NS_INDIRECT", 60, Box::new(|s| s.flags |= 0x10)),
    ];
    let mut seq = 0;
    for (k, (what, len, spoil)) in cases.into_iter().enumerate() {
        send_spoiled(&a, len, seq, spoil);
        let ac = v.counters("vale0:a");
        assert_eq!(ac.bad_input, k as u64 + 1, "{what}: {ac:?}");
        assert_eq!(ac.tx_packets, k as u64, "{what}: counted as sent: {ac:?}");
        assert_nothing(&b);
        seq += 1;
        // The next good frame goes through.
        let good = test_frame(60, MAC_A, MAC_B, seq);
        send_all(&a, std::slice::from_ref(&good));
        assert_eq!(recv_n(&b, 1), vec![good], "after {what}");
        seq += 1;
    }
    let bad = v.counters("vale0:a").bad_input;

    // A 14-byte frame (just the header) is fine.
    send_spoiled(&a, 14, seq, |_| {});
    let got = recv_n(&b, 1);
    assert_eq!(got[0].len(), 14);
    assert_eq!(v.counters("vale0:a").bad_input, bad);

    // A chain with a bad slot in the middle is dropped whole, counted once.
    let mut ring = a.tx_ring(0);
    let f = test_frame(5000, MAC_A, MAC_B, 1000);
    let middle = ring.next(ring.cur());
    let cur = write_chain(&mut ring, f.chunks(2048), true);
    let saved = ring.slot(middle).buf_idx;
    ring.slot_mut(middle).buf_idx = 0;
    ring.set_cur(cur);
    ring.set_head(cur);
    a.txsync(0).unwrap();
    wait_tx_drained(&a, 0);
    ring.slot_mut(middle).buf_idx = saved;
    assert_eq!(v.counters("vale0:a").bad_input, bad + 1);
    assert_nothing(&b);

    // A chain longer than 65536 bytes is refused; one of exactly 65536 goes through.
    let too_long = test_frame(65537, MAC_A, MAC_B, 1001);
    send_all(&a, std::slice::from_ref(&too_long));
    assert_eq!(v.counters("vale0:a").bad_input, bad + 2);
    assert_nothing(&b);
    let longest = test_frame(65536, MAC_A, MAC_B, 1002);
    send_all(&a, std::slice::from_ref(&longest));
    assert!(recv_n(&b, 1)[0] == longest);

    // Bad and good frames in one batch: the good ones arrive, in order.
    let g1 = test_frame(70, MAC_A, MAC_B, 2000);
    let g2 = test_frame(71, MAC_A, MAC_B, 2001);
    assert!(send_frame(&a, &g1));
    let slot = ring.slot_mut(ring.cur());
    let saved = slot.buf_idx;
    slot.buf_idx = 0;
    slot.len = 60;
    slot.flags = 0;
    let bad_at = ring.cur();
    ring.advance(1);
    assert!(send_frame(&a, &g2));
    a.txsync(0).unwrap();
    wait_tx_drained(&a, 0);
    ring.slot_mut(bad_at).buf_idx = saved;
    assert_eq!(recv_n(&b, 2), vec![g1, g2]);
    let ac = v.counters("vale0:a");
    assert_eq!(ac.bad_input, bad + 3, "{ac:?}");
    // b lost nothing and did nothing wrong.
    let bc = v.counters("vale0:b");
    assert_eq!((bc.rx_drops, bc.bad_input), (0, 0), "{bc:?}");
}

#[test]
fn bad_buffer_index_on_an_rx_ring_costs_the_receiver_only() {
    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_ab();
    let mut ring = b.rx_ring(0);
    // b spoils the slot valed fills next (its ring is empty: cur == tail).
    let at = ring.cur();
    let saved = ring.slot(at).buf_idx;
    ring.slot_mut(at).buf_idx = 0;
    let f = test_frame(60, MAC_A, MAC_B, 0);
    send_all(&a, std::slice::from_ref(&f));
    let bc = v.counters("vale0:b");
    assert_eq!(
        (bc.rx_packets, bc.rx_drops, bc.bad_input),
        (0, 1, 1),
        "{bc:?}"
    );
    let ac = v.counters("vale0:a");
    assert_eq!((ac.tx_packets, ac.bad_input), (1, 0), "{ac:?}");
    assert_nothing(&b);
    // Repaired, the slot takes frames again.
    ring.slot_mut(at).buf_idx = saved;
    send_all(&a, std::slice::from_ref(&f));
    assert_eq!(recv_n(&b, 1), vec![f]);
}

#[test]
fn chain_of_uneven_fragments_arrives_as_one_frame() {
    let _s = serial();
    let v = Valed::start();
    let a = v.open("vale0:a");
    let b = v.options().buf_size(512).open("vale0:b").unwrap();
    // Fragments need not be full: 100, 0, 1500, 7 and 2048 bytes.
    let sizes = [100usize, 0, 1500, 7, 2048];
    let f = test_frame(sizes.iter().sum(), MAC_A, MAC_B, 3);
    let mut rest = &f[..];
    let chunks: Vec<&[u8]> = sizes
        .iter()
        .map(|&n| {
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            chunk
        })
        .collect();
    queue_chain(&mut a.tx_ring(0), chunks.into_iter(), true);
    a.txsync(0).unwrap();
    let got = recv_n(&b, 1);
    assert!(got[0] == f, "reassembled frame differs");
    let bc = v.counters("vale0:b");
    assert_eq!((bc.rx_packets, bc.rx_bytes), (1, f.len() as u64));
    assert_eq!(v.counters("vale0:a").bad_input, 0);
}

#[test]
fn no_learn_flag_keeps_the_source_address_unlearnt() {
    let _s = serial();
    let v = Valed::start();
    let (a, b, c) = v.open_abc();
    // a's first frame carries NS_NO_LEARN: MAC_A stays unknown.
    let f = test_frame(60, MAC_A, BROADCAST, 0);
    let mut ring = a.tx_ring(0);
    let cur = ring.cur();
    let (slot, buf) = ring.slot_and_buf(cur);
    buf[..60].copy_from_slice(&f);
    slot.len = 60;
    slot.flags = vale::NS_NO_LEARN;
    ring.advance(1);
    a.txsync(0).unwrap();
    wait_tx_drained(&a, 0);
    recv_n(&b, 1);
    recv_n(&c, 1);
    send_all(&b, &[test_frame(60, MAC_B, MAC_A, 1)]);
    assert_eq!(recv_n(&a, 1).len(), 1);
    assert_eq!(
        recv_n(&c, 1).len(),
        1,
        "MAC_A was learnt despite NS_NO_LEARN"
    );
    // Without the flag it is learnt.
    send_all(&a, &[test_frame(60, MAC_A, BROADCAST, 2)]);
    recv_n(&b, 1);
    recv_n(&c, 1);
    send_all(&b, &[test_frame(60, MAC_B, MAC_A, 3)]);
    assert_eq!(recv_n(&a, 1).len(), 1);
    assert_nothing(&c);
}

#[test]
fn two_workers_deliver_to_one_port_concurrently() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let _s = serial();
    let v = Valed::start_with(&["--workers", "2"]);
    // a's ring goes to worker 0, c's to worker 1; both send to b.
    let a = v.open("vale0:a");
    let c = v.open("vale0:c");
    let b = v.open("vale0:b");
    learn(&b, test_frame(60, MAC_B, BROADCAST, 0), &[&a, &c]);
    let n = 30_000u64;
    let window = 256u64;
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let send = |port: &Port, src: [u8; 6], k: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut sent = 0u64;
        while sent < n {
            assert!(Instant::now() < deadline, "{}: sent {sent}", port.name());
            if sent - done[k].load(Relaxed) < window
                && send_frame(
                    port,
                    &test_frame(60 + (sent % 64) as usize, src, MAC_B, sent),
                )
            {
                sent += 1;
                if !sent.is_multiple_of(32) {
                    continue;
                }
            } else {
                std::thread::yield_now();
            }
            port.txsync(0).unwrap();
        }
        port.txsync(0).unwrap();
    };
    std::thread::scope(|s| {
        s.spawn(|| send(&a, MAC_A, 0));
        s.spawn(|| send(&c, MAC_C, 1));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut next = [0u64; 2];
        while next[0] < n || next[1] < n {
            assert!(Instant::now() < deadline, "b got {next:?} of {n} each");
            let frames = recv_frames(&b);
            if frames.is_empty() {
                b.poll(READABLE, Some(Duration::from_millis(100))).unwrap();
                continue;
            }
            for f in frames {
                let (k, src) = if f[6..12] == MAC_A {
                    (0, MAC_A)
                } else {
                    (1, MAC_C)
                };
                let want = test_frame(60 + (next[k] % 64) as usize, src, MAC_B, next[k]);
                assert!(
                    f == want,
                    "frame {} from source {k} differs or is out of order",
                    next[k]
                );
                next[k] += 1;
                done[k].store(next[k], Relaxed);
            }
        }
    });
    let bc = v.counters("vale0:b");
    assert_eq!((bc.rx_packets, bc.rx_drops), (2 * n, 0), "{bc:?}");
}

#[test]
fn pktgen_ping_pong_measures_round_trips() {
    let _s = serial();
    let v = Valed::start();
    let pong = v.spawn_client(
        v.pktgen(&["-i", "vale0:b", "-f", "pong", "-T", "60", "--json"]),
        "vale-pktgen pong",
        "vale0:b",
    );
    let ping = Kid::spawn(
        v.pktgen(&[
            "-i", "vale0:a", "-f", "ping", "-n", "500", "-l", "1514", "--json",
        ]),
        "vale-pktgen ping",
    )
    .finish(Duration::from_secs(30));
    let r = report(&ping, "vale-pktgen ping");
    assert_eq!(r["mode"], "ping", "{r}");
    assert_eq!(num(&r, "packets"), 500, "{r}");
    assert_eq!(num(&r, "drops"), 0, "{r}");
    let rtt = &r["rtt"];
    assert_eq!(rtt["samples"], 500, "{r}");
    let (min, med, p99, max) = (
        float(rtt, "min_us"),
        float(rtt, "median_us"),
        float(rtt, "p99_us"),
        float(rtt, "max_us"),
    );
    assert!(0.0 < min && min <= med && med <= p99 && p99 <= max, "{r}");
    let bc = v.counters("vale0:b");
    assert_eq!((bc.rx_packets, bc.tx_packets), (500, 500), "{bc:?}");
    assert_eq!(bc.rx_bytes, 500 * 1514, "{bc:?}");
    pong.signal(libc::SIGTERM);
    let p = report(&pong.finish(T), "vale-pktgen pong");
    assert_eq!(num(&p, "packets"), 500, "{p}");
}

/// Voluntary context switches (sleeps) of valed's forwarding thread so far.
fn worker_sleeps(v: &Valed) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", v.pid())).expect("proc task");
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "vale-worker-0")
        })
        .map(|t| {
            let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            s.lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

const B_MAC: &str = "02:00:00:00:00:0b";

/// Round trips of two sleeping vale-pktgen (ping, pong) through `v`: the forwarding thread's
/// sleeps during them, and valed's CPU ticks in the second after.
fn ping_pong_sleeps(v: &Valed, n: u64) -> (u64, u64) {
    let pong = v.spawn_client(
        v.pktgen(&[
            "-i",
            "vale0:b",
            "-f",
            "pong",
            "-T",
            "60",
            "--announce",
            "-S",
            B_MAC,
        ]),
        "vale-pktgen pong",
        "vale0:b",
    );
    assert!(
        wait_until(T, || v.counters("vale0:b").tx_packets >= 1),
        "pong's announcement"
    );
    let before = worker_sleeps(v);
    let ping = Kid::spawn(
        v.pktgen(&[
            "-i",
            "vale0:a",
            "-f",
            "ping",
            "-n",
            &n.to_string(),
            "-D",
            B_MAC,
            "--json",
        ]),
        "vale-pktgen ping",
    )
    .finish(Duration::from_secs(60));
    let r = report(&ping, "vale-pktgen ping");
    assert_eq!(num(&r, "packets"), n, "{r}");
    let sleeps = worker_sleeps(v) - before;
    std::thread::sleep(Duration::from_millis(100));
    let t0 = v.cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let idle = v.cpu_ticks() - t0;
    pong.signal(libc::SIGTERM);
    pong.finish(T);
    (sleeps, idle)
}

/// valed's adaptive spin (the default, `--spin-us`): a ring whose next frame came soon after it
/// ran dry is polled that long before the forwarding thread sleeps, so a ping-pong in progress
/// costs valed's thread (nearly) no sleep and wake-up per frame, where `--spin-us 0` sleeps at
/// least once a round trip; and once the exchange ends valed costs nothing (one spin, then
/// sleep). The spin here is generous (1 ms) so that a loaded machine's slower turns still fall
/// within it.
#[test]
fn an_exchange_in_progress_is_spun_for_and_an_idle_port_costs_nothing() {
    let _s = serial();
    let n = 2000;
    let off = Valed::start_with(&["--spin-us", "0"]);
    let (sleeps_off, _) = ping_pong_sleeps(&off, n);
    drop(off);
    let on = Valed::start_with(&["--spin-us", "1000"]);
    let (sleeps_on, idle_on) = ping_pong_sleeps(&on, n);
    eprintln!("forwarding thread sleeps for {n} round trips: {sleeps_off} without a spin, {sleeps_on} with");
    assert!(
        sleeps_off >= n / 2,
        "without a spin the forwarding thread sleeps about once a round trip: {sleeps_off} for {n}"
    );
    assert!(
        sleeps_on * 4 < sleeps_off,
        "with the spin it sleeps far less: {sleeps_on} against {sleeps_off} for {n} round trips"
    );
    assert!(
        idle_on <= 1,
        "idle after the exchange: {idle_on} ticks of CPU in a second"
    );
}

/// The `head` valed reads for region ring `k` of `port` (the CSB's client half).
fn csb_head(port: &Port, k: u32) -> &std::sync::atomic::AtomicU32 {
    let h = port.region();
    // SAFETY: the CSB lies inside the port's mapping, at the offset valed wrote and libvale
    // checked; `head` is the first, 4-byte aligned, field of each ring's 128-byte pair.
    unsafe {
        &*((h as *const vale_abi::region::RegionHeader as *const u8)
            .add(h.csb_ofs as usize + 128 * k as usize)
            as *const std::sync::atomic::AtomicU32)
    }
}

#[test]
fn bad_rx_head_drops_frames_for_that_port_only() {
    use std::sync::atomic::Ordering::SeqCst;
    let _s = serial();
    let v = Valed::start();
    let (a, b, c) = v.open_abc();
    // b publishes an rx head past its ring (region ring 1 is its rx ring 0).
    let head = csb_head(&b, 1);
    assert_eq!(head.load(SeqCst), 0);
    head.store(5000, SeqCst);
    for s in 0..5 {
        send_all(&a, &[test_frame(60, MAC_A, BROADCAST, s)]);
    }
    // c is not affected.
    assert_eq!(recv_n(&c, 5).len(), 5);
    let bc = v.counters("vale0:b");
    assert_eq!((bc.rx_packets, bc.rx_drops), (0, 5), "{bc:?}");
    assert!((1..=5).contains(&bc.bad_input), "{bc:?}");
    assert_eq!(v.counters("vale0:c").bad_input, 0);
    assert!(recv_frames(&b).is_empty());
    // recv_frames synced b's ring: the good head is back, and frames arrive again.
    assert_eq!(head.load(SeqCst), 0);
    let f = test_frame(60, MAC_A, BROADCAST, 99);
    send_all(&a, std::slice::from_ref(&f));
    assert_eq!(recv_n(&b, 1), vec![f]);
}

#[test]
fn zero_copy_buffer_swaps_are_accepted() {
    let _s = serial();
    let v = Valed::start();
    let (a, b, c) = v.open_abc();
    // Learn a and c, so b's forwarded frames go to c only and a's to b only.
    learn(&c, test_frame(60, MAC_C, MAC_A, 0), &[&a, &b]);
    learn(&a, test_frame(60, MAC_A, MAC_C, 0), &[&c]);
    learn(&b, test_frame(60, MAC_B, MAC_A, 0), &[&a]);
    // b bridges frames from a to c without copying: it moves each rx buffer into a tx slot
    // and the tx slot's buffer into the rx slot, as netmap's zero-copy bridge does.
    for round in 0..3u64 {
        let frames: Vec<Vec<u8>> = (0..300)
            .map(|s| {
                let mut f = test_frame(60 + s as usize, MAC_A, MAC_B, round * 1000 + s);
                f[..6].copy_from_slice(&MAC_B);
                f
            })
            .collect();
        send_all(&a, &frames);
        b.rxsync(0).unwrap();
        let (mut rx, mut tx) = (b.rx_ring(0), b.tx_ring(0));
        let mut n = 0;
        while !rx.is_empty() {
            let (rc, tc) = (rx.cur(), tx.cur());
            let (rs, rbuf) = rx.slot_and_buf(rc);
            let ts = tx.slot_mut(tc);
            // Rewrite the destination in place, then swap.
            rbuf[..6].copy_from_slice(&MAC_C);
            std::mem::swap(&mut rs.buf_idx, &mut ts.buf_idx);
            ts.len = rs.len;
            ts.flags = vale::NS_BUF_CHANGED;
            rs.flags = vale::NS_BUF_CHANGED;
            rx.advance(1);
            tx.advance(1);
            n += 1;
        }
        assert_eq!(n, 300);
        b.rxsync(0).unwrap();
        b.txsync(0).unwrap();
        let got = recv_n(&c, 300);
        for (k, (g, f)) in got.iter().zip(&frames).enumerate() {
            let mut want = f.clone();
            want[..6].copy_from_slice(&MAC_C);
            assert!(*g == want, "round {round}, frame {k}");
        }
    }
    assert_clean(&v, &["vale0:a", "vale0:b", "vale0:c"]);
}

#[test]
fn a_sender_waiting_for_room_is_woken_in_time() {
    let _s = serial();
    let v = Valed::start();
    let a = v.options().slots(64).open("vale0:a").unwrap();
    let _b = v.open("vale0:b");
    let n = 20_000u64;
    let start = Instant::now();
    let mut longest = Duration::ZERO;
    let mut waits = 0;
    let f = test_frame(60, MAC_A, MAC_B, 0);
    for _ in 0..n {
        while !send_frame(&a, &f) {
            let t = Instant::now();
            // A long timeout: a lost tx interrupt would show as a stall.
            a.poll(WRITABLE, Some(Duration::from_secs(2))).unwrap();
            longest = longest.max(t.elapsed());
            waits += 1;
        }
        a.txsync(0).unwrap();
    }
    wait_tx_drained(&a, 0);
    assert!(waits > 0, "the 64-slot ring never filled");
    assert!(
        longest < Duration::from_secs(1),
        "a wait for room took {longest:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    let bc = v.counters("vale0:b");
    assert_eq!(bc.rx_packets + bc.rx_drops, n, "{bc:?}");
    assert_eq!(v.counters("vale0:a").tx_packets, n);
}

#[test]
fn a_learnt_address_follows_its_host_to_another_port() {
    let _s = serial();
    let v = Valed::start();
    let (a, b, c) = v.open_abc();
    // MAC_B speaks from b ...
    learn(&b, test_frame(60, MAC_B, BROADCAST, 0), &[&a, &c]);
    send_all(&a, &[test_frame(60, MAC_A, MAC_B, 1)]);
    assert_eq!(recv_n(&b, 1).len(), 1);
    assert_nothing(&c);
    // ... then from c: frames for it follow.
    learn(&c, test_frame(60, MAC_B, BROADCAST, 2), &[&a, &b]);
    let f = test_frame(60, MAC_A, MAC_B, 3);
    send_all(&a, std::slice::from_ref(&f));
    assert_eq!(recv_n(&c, 1), vec![f]);
    assert_nothing(&b);
}

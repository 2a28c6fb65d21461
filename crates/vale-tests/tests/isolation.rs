//! One client must not cost another: a MAC flood must not make the learning bridge forget (and
//! so flood) other ports' stations, and a client that writes its kick eventfd in a loop must
//! not starve the other rings of its worker.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vale_tests::*;

/// Sets its flag when dropped (also when a test panics), so helper threads always stop.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Release);
    }
}

// ---- a MAC flood ------------------------------------------------------------------------------

/// xorshift64*: random source addresses, deterministic.
struct Rng(u64);

impl Rng {
    /// A unicast, locally administered MAC.
    fn mac(&mut self) -> [u8; 6] {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        [(r[0] & 0xfc) | 2, r[1], r[2], r[3], r[4], r[5]]
    }
}

/// Sends 60-byte frames to `dst`, each from a new random source address, as fast as valed
/// takes them, until `stop`. Returns how many it sent.
fn mac_flood(x: &vale::Port, dst: [u8; 6], stop: &AtomicBool) -> u64 {
    let mut ring = x.tx_ring(0);
    let mut rng = Rng(0x0f10_0d5e_ed00_0001);
    let mut sent = 0u64;
    while !stop.load(Relaxed) {
        x.txsync(0).expect("txsync x");
        let room = ring.space();
        if room == 0 {
            x.poll(WRITABLE, Some(Duration::from_millis(20)))
                .expect("poll x");
            continue;
        }
        let mut cur = ring.cur();
        for _ in 0..room {
            let (slot, buf) = ring.slot_and_buf(cur);
            buf[..6].copy_from_slice(&dst);
            buf[6..12].copy_from_slice(&rng.mac());
            buf[12..14].copy_from_slice(&[0x88, 0xb5]);
            slot.len = 60;
            slot.flags = 0;
            cur = ring.next(cur);
        }
        ring.set_cur(cur);
        ring.set_head(cur);
        sent += room as u64;
    }
    x.txsync(0).expect("txsync x");
    sent
}

/// What b made of a's stream.
#[derive(Debug, Default)]
struct StreamCheck {
    /// Frames of the stream received whole, in order.
    got: u64,
    /// Sequence numbers skipped.
    lost: u64,
    /// Frames from a that were out of order or not what a sent.
    bad: u64,
    /// Frames not from a (the flood, if the bridge floods it to b).
    others: u64,
    next: u64,
}

/// Frames of the checked stream.
const STREAM: u64 = 60_000;
/// The stream is paced to last about this long.
const STREAM_TIME: Duration = Duration::from_millis(3000);
/// Frames a may send ahead of what b received: b's ring never overflows.
const WINDOW: u64 = 256;

/// A port that floods frames from random source addresses at full rate cannot make the
/// learning bridge forget a quiet station of another port: the unicast stream a->b, between
/// two ports that learnt each other first, is never flooded to the flooder, and loses nothing.
#[test]
fn mac_flood_does_not_leak_other_ports_unicast() {
    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_learnt_pair();
    // b says nothing more: its entry is what the flood would push out.
    let x = Arc::new(v.open("vale0:x"));

    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_exit = SetOnDrop(stop.clone());
    // The flood goes to a, a known station: it loads a's ring (which nobody reads), not b's.
    let flooder = std::thread::spawn({
        let (x, stop) = (x.clone(), stop.clone());
        move || mac_flood(&x, MAC_A, &stop)
    });
    // The flood is under way before the stream starts.
    assert!(
        wait_until(T, || v.counters("vale0:x").tx_packets > 10_000),
        "the flood did not start: {:?}",
        v.counters("vale0:x")
    );

    // b checks a's stream; it counts rather than stops at the first fault, so that a failure
    // says what the flooder saw. `received`: one past the highest sequence number b got.
    let received = Arc::new(AtomicU64::new(0));
    let sent_all = Arc::new(AtomicBool::new(false));
    let receiver = std::thread::spawn({
        let (b, received, sent_all) = (b.clone(), received.clone(), sent_all.clone());
        move || {
            let mut s = StreamCheck::default();
            let mut quiet_since = Instant::now();
            while received.load(Relaxed) < STREAM {
                let frames = recv_frames(&b);
                if frames.is_empty() {
                    let quiet = quiet_since.elapsed();
                    if sent_all.load(Acquire) && quiet > Duration::from_secs(1)
                        || quiet > Duration::from_secs(10)
                    {
                        break;
                    }
                    b.poll(READABLE, Some(Duration::from_millis(50)))
                        .expect("poll b");
                    continue;
                }
                quiet_since = Instant::now();
                for f in frames {
                    if f.len() < 22 || f[6..12] != MAC_A {
                        s.others += 1;
                        continue;
                    }
                    let seq = u64::from_le_bytes(f[14..22].try_into().unwrap());
                    if seq < s.next || f != test_frame(60, MAC_A, MAC_B, seq) {
                        s.bad += 1;
                        continue;
                    }
                    s.lost += seq - s.next;
                    s.got += 1;
                    s.next = seq + 1;
                }
                received.store(s.next, Release);
            }
            s
        }
    });
    let t0 = Instant::now();
    let mut seq = 0u64;
    while seq < STREAM {
        let due = (t0.elapsed().as_micros() as u64 * STREAM / STREAM_TIME.as_micros() as u64)
            .min(received.load(Acquire) + WINDOW)
            .min(STREAM);
        if seq >= due {
            assert!(
                t0.elapsed() < STREAM_TIME + Duration::from_secs(20),
                "a: b stopped receiving (sent {seq})"
            );
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        while seq < due {
            let f = test_frame(60, MAC_A, MAC_B, seq);
            if !send_frame(&a, &f) {
                break;
            }
            seq += 1;
        }
        a.txsync(0).expect("txsync a");
    }
    sent_all.store(true, Release);
    let stream = join_by(
        "b's receiver",
        receiver,
        Instant::now() + Duration::from_secs(20),
    );
    let stream_time = t0.elapsed();
    stop.store(true, Release);
    let flooded = join_by("the flooder", flooder, Instant::now() + T);

    let (cb, cx) = (v.counters("vale0:b"), v.counters("vale0:x"));
    let xp = v.port("vale0:x").unwrap();
    eprintln!(
        "mac flood: {flooded} frames from random addresses in {:?} beside {STREAM} frames \
         a->b in {stream_time:?} ({stream:?}); x holds {} addresses, x: {cx:?}",
        stream_time, xp.learnt
    );
    // What reached x while it flooded can only be a's stream, flooded.
    let leaked = cx.rx_packets + cx.rx_drops;
    assert!(
        leaked <= 100,
        "x saw {leaked} frames of a's unicast to b: {cx:?}"
    );
    assert_eq!(
        (stream.got, stream.lost, stream.bad),
        (STREAM, 0, 0),
        "a's stream at b: {stream:?}; b: {cb:?}"
    );
    assert_eq!(cb.rx_drops, 0, "b lost frames: {cb:?}");
    assert!(
        flooded > 10 * STREAM,
        "the flood was too weak to mean anything: {flooded} frames"
    );
    assert!(xp.learnt <= xp.learn_limit, "{xp:?}");
    assert!(cx.learn_refused > 0, "{cx:?}");
}

// ---- a kick storm -----------------------------------------------------------------------------

/// Writes 1 into the descriptor `target` names, in a tight loop, until `stop`. Returns how
/// many writes it made.
fn write_loop(target: &AtomicI32, stop: &AtomicBool) -> u64 {
    let one: u64 = 1;
    let mut n = 0u64;
    while !stop.load(Relaxed) {
        let fd = target.load(Relaxed);
        for _ in 0..64 {
            // SAFETY: writes 8 bytes from a live u64 to a descriptor the test holds open.
            unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
        }
        n += 64;
    }
    n
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("rates are numbers"));
    v[v.len() / 2]
}

/// A client that writes its kick eventfd in a tight loop with nothing to send: valed does not
/// wake up for it, its real kicks are still served, and a pair on the same worker keeps its
/// rate (compared, in alternating slices of the same run, with the same thread writing an
/// eventfd valed does not watch: the same load on the CPUs, none of it aimed at valed).
#[test]
fn kick_storm_costs_nothing_and_loses_no_kick() {
    let _s = serial();
    let mut v = Valed::start();
    // x first: open_with_kick tells x's kick eventfd from the others by when valed watched it.
    let (x, x_kick) = open_with_kick(&v, &v.options(), "vale0:x");
    let b = v.open("vale0:b");
    // b is learnt, so x's frames below go to b alone.
    send_and_expect(&b, &x, &test_frame(60, MAC_B, BROADCAST, 0), "b's hello");

    let target = Arc::new(AtomicI32::new(x_kick));
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_exit = SetOnDrop(stop.clone());
    let writer = std::thread::spawn({
        let (target, stop) = (target.clone(), stop.clone());
        move || write_loop(&target, &stop)
    });

    // 1. On an idle switch, the storm does not keep valed busy.
    std::thread::sleep(Duration::from_millis(100));
    let t0 = v.cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let idle_ticks = v.cpu_ticks() - t0;
    eprintln!(
        "kick storm on an idle switch: valed used {idle_ticks} ticks in 1 s ({} per s)",
        ticks_per_second()
    );
    assert!(
        idle_ticks * 100 <= 10 * ticks_per_second(),
        "a kick storm kept valed busy: {idle_ticks} ticks in 1 s"
    );

    // 2. A kick with work is served, storm or not (x's txsync kicks: its ring sleeps).
    for seq in 1..=20 {
        let f = test_frame(60 + seq as usize, MAC_C, MAC_B, seq);
        send_and_expect(&x, &b, &f, &format!("x's frame {seq} during its storm"));
    }

    // 3. A pair a->c beside the storm, in slices that alternate the writer's target.
    let mac_c = "02:00:00:00:00:0c";
    let rx = v.pktgen(&[
        "-i",
        "vale0:c",
        "-f",
        "rx",
        "-T",
        "60",
        "-q",
        "--json",
        "--announce",
        "-S",
        mac_c,
    ]);
    let _rx = v.spawn_client(rx, "vale-pktgen rx", "vale0:c");
    assert!(
        wait_until(T, || v.counters("vale0:c").tx_packets == 1),
        "no announcement from c"
    );
    let private = vale_abi::eventfd::new().expect("eventfd");
    const SLICES: usize = 16;
    const SLICE: Duration = Duration::from_millis(300);
    let seconds = ((SLICES as u32 + 2) * SLICE).as_secs() + 1;
    let tx = v.pktgen(&[
        "-i",
        "vale0:a",
        "-f",
        "tx",
        "-l",
        "60",
        "-T",
        &seconds.to_string(),
        "-D",
        mac_c,
        "-q",
        "--json",
    ]);
    let tx = v.spawn_client(tx, "vale-pktgen tx", "vale0:a");
    let c_rx = || {
        let c = v.counters("vale0:c");
        c.rx_packets + c.rx_drops
    };
    std::thread::sleep(SLICE);
    let mut rates = [Vec::new(), Vec::new()];
    let (mut last, mut at) = (c_rx(), Instant::now());
    for i in 0..SLICES {
        let storm = i % 2 == 1;
        target.store(if storm { x_kick } else { private.as_raw_fd() }, Relaxed);
        std::thread::sleep(SLICE);
        let (now, t) = (c_rx(), Instant::now());
        rates[storm as usize].push((now - last) as f64 / (t - at).as_secs_f64());
        (last, at) = (now, t);
    }
    stop.store(true, Release);
    let writes = join_by("the writer", writer, Instant::now() + T);
    report(&tx.finish(Duration::from_secs(30)), "vale-pktgen tx");
    let (quiet, storm) = (median(rates[0].clone()), median(rates[1].clone()));
    eprintln!(
        "kick storm beside a pair: {:.2} Mpps beside the spinner, {:.2} Mpps beside the storm \
         (ratio {:.2}); {writes} writes; slices {rates:.0?}",
        quiet / 1e6,
        storm / 1e6,
        storm / quiet
    );
    assert!(
        storm >= 0.5 * quiet,
        "the storm costs the pair {:.0}%",
        100.0 * (1.0 - storm / quiet)
    );
    let cx = v.counters("vale0:x");
    assert_eq!(cx.tx_packets, 20, "{cx:?}");
    assert!(v.alive(), "valed died: {}", v.log());
}

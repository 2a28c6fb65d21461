//! One client must not cost another: a MAC flood must not make the learning bridge forget (and
//! so flood) other ports' stations.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
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
    let ring = x.tx_ring(0);
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
            let slot = ring.slot(cur);
            let buf = ring.buf(slot.buf_idx);
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
    let a = Arc::new(v.open("vale0:a"));
    // A deep rx ring, so b keeps up with a's stream without a drop.
    let b = Arc::new(v.options().slots(4096).open("vale0:b").expect("open b"));
    send_and_expect(
        &a,
        &b,
        &test_frame(60, MAC_A, BROADCAST, u64::MAX),
        "a's hello",
    );
    send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, u64::MAX), "b's hello");
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
    let stream = join_by("b's receiver", receiver, Instant::now() + Duration::from_secs(20));
    let stream_time = t0.elapsed();
    stop.store(true, Release);
    let flooded = join_by("the flooder", flooder, Instant::now() + T);

    let (cb, cx) = (v.counters("vale0:b"), v.counters("vale0:x"));
    let xp = v.port("vale0:x").unwrap();
    eprintln!(
        "mac flood: {flooded} frames from random addresses in {:?} beside {STREAM} frames \
         a->b in {stream_time:?} ({stream:?}); x holds {} addresses, x: {cx:?}",
        stream_time,
        xp.learnt
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

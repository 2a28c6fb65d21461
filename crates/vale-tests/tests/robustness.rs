//! valed against clients that misbehave, and against the races of its own sleep/wake-up
//! protocol: hostile memory writes, bad indices, chains that never end, idle CPU, and a long
//! ping-pong that would hang on a single lost wake-up.

use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vale_abi::csb::{CsbAtok, CsbKtoa, CSB_RING_SIZE};
use vale_abi::netmap::{NetmapRing, NetmapSlot, RING_SLOTS_OFS};
use vale_abi::region::FIRST_SLOT_BUF;
use vale_tests::*;

// The tests that load both cores run one at a time (see [`serial`]), so each keeps its time
// budget.

/// How often the waits of this file look.
const LOOK: Duration = Duration::from_millis(5);

// ---- small helpers --------------------------------------------------------------------------

/// xorshift64*: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A value a checker has to get right: 0, 1, the limit and its neighbours, huge ones,
    /// and now and then a plausible one.
    fn edgy(&mut self, limit: u32) -> u32 {
        match self.below(10) {
            0 => 0,
            1 => 1,
            2 => limit.wrapping_sub(1),
            3 => limit,
            4 => limit.wrapping_add(5),
            5 => u32::MAX,
            6 => 1 << 31,
            7 => self.next() as u32,
            _ => self.below(limit.max(1) as u64) as u32,
        }
    }
}

/// The CSB and ring indices of every ring of a port, for failure messages.
fn ring_state(name: &str, raw: &Raw) -> String {
    let mut s = String::new();
    for i in 0..raw.rings {
        let (at, kt) = (raw.atok(i), raw.ktoa(i));
        // SAFETY: ring header inside the mapping; read only.
        let (head, cur, tail) = unsafe {
            let r = raw.ring(i);
            (
                (&raw const (*r).head).read_volatile(),
                (&raw const (*r).cur).read_volatile(),
                (&raw const (*r).tail).read_volatile(),
            )
        };
        s += &format!(
            "{name} {} ring {}: ring head {head} cur {cur} tail {tail} | atok head {} cur {} \
             appl_need_kick {} | ktoa hwcur {} hwtail {} kern_need_kick {}\n",
            if i < raw.tx_rings { "tx" } else { "rx" },
            if i < raw.tx_rings {
                i
            } else {
                i - raw.tx_rings
            },
            at.head.load(Relaxed),
            at.cur.load(Relaxed),
            at.appl_need_kick.load(Relaxed),
            kt.hwcur.load(Relaxed),
            kt.hwtail.load(Relaxed),
            kt.kern_need_kick.load(Relaxed),
        );
    }
    s
}

/// valed's CPU ticks over `d`.
fn cpu_over(v: &Valed, d: Duration) -> u64 {
    let t0 = v.cpu_ticks();
    std::thread::sleep(d);
    v.cpu_ticks() - t0
}

/// Sends one frame, waiting (poll writable, bounded) while the tx ring lacks room. Returns
/// how many times it had to sleep because the ring was full.
fn send_counting_sleeps(port: &vale::Port, frame: &[u8], what: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sleeps = 0;
    loop {
        if send_frame(port, frame) {
            return sleeps;
        }
        port.txsync(0).expect("txsync");
        if send_frame(port, frame) {
            return sleeps;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "lost wake-up? {what}: no room on the tx ring for 5 s"
        );
        if port.tx_ring(0).space() == 0 {
            sleeps += 1;
            let ev = port.poll(WRITABLE, Some(left)).expect("poll");
            assert!(
                ev.writable,
                "lost wake-up: {what} slept 5 s on a full tx ring and valed never freed a slot"
            );
        } else {
            // Some room, not enough for this frame: valed is working on the ring right now.
            std::thread::yield_now();
        }
    }
}

/// Receives exactly `k` frames, sleeping in poll; a 5 s silence is a lost wake-up.
fn recv_exactly(port: &vale::Port, k: usize, what: &str) -> Vec<Vec<u8>> {
    let mut got = Vec::with_capacity(k);
    loop {
        got.extend(recv_frames(port));
        if got.len() >= k {
            break;
        }
        let ev = port
            .poll(READABLE, Some(Duration::from_secs(5)))
            .expect("poll");
        if !ev.readable {
            got.extend(recv_frames(port));
            panic!(
                "lost wake-up: {what} slept 5 s in poll waiting for {k} frames and had {} \
                 (after one more look)",
                got.len()
            );
        }
    }
    assert_eq!(got.len(), k, "{what}: more frames than sent");
    got
}

// ---- raw access to a port's region, as a hostile client would have it -----------------------

/// Everything of one port's region, by address, from its header.
#[derive(Clone, Copy)]
struct Raw {
    base: *mut u8,
    rings_ofs: u64,
    ring_size: u64,
    csb_ofs: u64,
    bufs_ofs: u64,
    rings: u32,
    tx_rings: u32,
    num_slots: u32,
    num_bufs: u32,
    buf_size: u32,
}

// SAFETY: plain shared memory that outlives every user (the port is dropped after the threads
// that use this are joined).
unsafe impl Send for Raw {}
unsafe impl Sync for Raw {}

impl Raw {
    fn of(p: &vale::Port) -> Raw {
        let h = p.region();
        let base = p.region() as *const _ as *mut u8;
        // The same place, by the netmap way.
        assert_eq!(
            base.wrapping_add(h.nifp_ofs as usize),
            p.nifp() as *mut u8,
            "region() and nifp() disagree"
        );
        Raw {
            base,
            rings_ofs: h.rings_ofs,
            ring_size: h.ring_size as u64,
            csb_ofs: h.csb_ofs,
            bufs_ofs: h.bufs_ofs,
            rings: h.tx_rings + h.rx_rings,
            tx_rings: h.tx_rings,
            num_slots: h.num_slots,
            num_bufs: h.num_bufs,
            buf_size: h.buf_size,
        }
    }
    /// Ring `i` in region order (tx rings, then rx rings).
    fn ring(&self, i: u32) -> *mut NetmapRing {
        self.base
            .wrapping_add((self.rings_ofs + i as u64 * self.ring_size) as usize)
            .cast()
    }
    fn slot(&self, i: u32, s: u32) -> *mut NetmapSlot {
        assert!(s < self.num_slots);
        (self.ring(i) as *mut u8)
            .wrapping_add(RING_SLOTS_OFS + 16 * s as usize)
            .cast()
    }
    fn atok(&self, i: u32) -> &CsbAtok {
        // SAFETY: inside the mapping, 64-byte aligned (layout of vale-abi).
        unsafe {
            &*(self
                .base
                .add((self.csb_ofs + (i as usize * CSB_RING_SIZE) as u64) as usize)
                as *const CsbAtok)
        }
    }
    fn ktoa(&self, i: u32) -> &CsbKtoa {
        // SAFETY: as above.
        unsafe {
            &*(self
                .base
                .add((self.csb_ofs + (i as usize * CSB_RING_SIZE) as u64 + 64) as usize)
                as *const CsbKtoa)
        }
    }
    fn buf(&self, idx: u32) -> *mut u8 {
        assert!(idx < self.num_bufs);
        self.base
            .wrapping_add((self.bufs_ofs + idx as u64 * self.buf_size as u64) as usize)
    }
}

// ---- 1. a hostile client among good ones -----------------------------------------------------

const STREAM: u64 = 100_000;
/// The stream is paced to last this long, microseconds.
const STREAM_US: u64 = 2_500_000;
/// A fourth station, behind a.
const MAC_D: [u8; 6] = [2, 0, 0, 0, 0, 0xd];
/// The hostile port's own address: every frame it can send is from and to it.
const MAC_X: [u8; 6] = [2, 0, 0, 0, 0, 0xe];
const WINDOW: u64 = 256;

fn stream_len(seq: u64) -> usize {
    if seq.is_multiple_of(997) {
        5000 // a three-slot chain
    } else {
        60 + (seq.wrapping_mul(37) % 1455) as usize
    }
}

/// Sets its flag when dropped (also when a test panics).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Release);
    }
}

/// What the scribbler did.
#[derive(Default, Debug)]
struct Scribbled {
    rounds: u64,
    writes: u64,
    txsync_errors: u64,
    kicks: u64,
}

fn scribble(x: &vale::Port, raw: Raw, kick_fd: RawFd, stop: &AtomicBool) -> Scribbled {
    let mut rng = Rng::new(0x5c21_bb1e);
    let mut s = Scribbled::default();
    let n = raw.num_slots;
    let t0 = Instant::now();
    while !stop.load(Relaxed) || t0.elapsed() < Duration::from_secs(3) {
        for _ in 0..16 {
            let ring = rng.below(raw.rings as u64) as u32;
            let r = raw.ring(ring);
            // SAFETY (all writes below): addresses inside x's own mapping, written volatile
            // since valed reads them concurrently; garbage is the point.
            unsafe {
                match rng.below(8) {
                    0 => {
                        // Ring header fields (valed must not read them at all).
                        match rng.below(6) {
                            0 => (&raw mut (*r).head).write_volatile(rng.edgy(n)),
                            1 => (&raw mut (*r).cur).write_volatile(rng.edgy(n)),
                            2 => (&raw mut (*r).tail).write_volatile(rng.edgy(n)),
                            3 => (&raw mut (*r).buf_ofs).write_volatile(rng.next() as i64),
                            4 => (&raw mut (*r).num_slots).write_volatile(rng.edgy(n)),
                            _ => (&raw mut (*r).nr_buf_size).write_volatile(rng.edgy(raw.buf_size)),
                        }
                    }
                    1..=3 => {
                        // A slot: index, length, flags.
                        let sl = raw.slot(ring, rng.below(n as u64) as u32);
                        let idx = match rng.below(4) {
                            0 => rng.edgy(raw.num_bufs),
                            _ => FIRST_SLOT_BUF + rng.below((raw.num_bufs - 2) as u64) as u32,
                        };
                        let len = match rng.below(5) {
                            0 => rng.edgy(raw.buf_size) as u16,
                            1 => 0,
                            2 => 1,
                            3 => 14 + rng.below(100) as u16,
                            _ => rng.next() as u16,
                        };
                        let flags = match rng.below(6) {
                            0 => 0,
                            1 => vale::NS_MOREFRAG,
                            2 => vale_abi::netmap::NS_INDIRECT,
                            3 => vale::NS_MOREFRAG | vale_abi::netmap::NS_INDIRECT,
                            4 => u16::MAX,
                            _ => rng.next() as u16,
                        };
                        (&raw mut (*sl).buf_idx).write_volatile(idx);
                        (&raw mut (*sl).len).write_volatile(len);
                        (&raw mut (*sl).flags).write_volatile(flags);
                        (&raw mut (*sl).ptr).write_volatile(rng.next());
                    }
                    4 | 5 => {
                        // Buffer bytes.
                        let b =
                            raw.buf(FIRST_SLOT_BUF + rng.below((raw.num_bufs - 2) as u64) as u32);
                        // Past the MAC addresses, so every frame x sends stays addressed
                        // to x itself (see the test).
                        let off = 12 + rng.below(raw.buf_size as u64 - 20) as usize;
                        (b.add(off) as *mut u64).write_unaligned(rng.next());
                    }
                    _ => {
                        // The CSB: head, cur, appl_need_kick of this ring.
                        let a = raw.atok(ring);
                        match rng.below(3) {
                            0 => a.head.store(rng.edgy(n), Release),
                            1 => a.cur.store(rng.edgy(n), Release),
                            _ => a.appl_need_kick.store(rng.edgy(2), Release),
                        }
                    }
                }
            }
            s.writes += 1;
        }
        // Wake valed the way a client does (publishes whatever the ring header now holds).
        if x.txsync(0).is_err() {
            s.txsync_errors += 1;
        }
        if rng.below(4) == 0 {
            kick(kick_fd);
            s.kicks += 1;
        }
        s.rounds += 1;
        if s.rounds % 8 == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    s
}

#[test]
fn hostile_client_does_not_disturb_the_others() {
    let _g = serial();
    let mut v = Valed::start();
    let a = Arc::new(v.open("vale0:a"));
    // A deep rx ring, so b keeps up with a's stream without a drop.
    let b = Arc::new(v.options().slots(4096).open("vale0:b").expect("open b"));
    // The switch learns a and b before x arrives, so a's stream goes to b alone: x never
    // holds a copy of a's frames that it could send again (with a's address in them).
    let hello_a = test_frame(60, MAC_A, BROADCAST, u64::MAX);
    send_and_expect(&a, &b, &hello_a, "a's hello");
    let hello_b = test_frame(60, MAC_B, MAC_A, u64::MAX);
    send_and_expect(&b, &a, &hello_b, "b's hello");
    let (x, x_kick) = open_with_kick(&v, &v.options(), "vale0:x");
    let x = Arc::new(x);
    let raw = Raw::of(&x);
    // Every buffer of x starts with "to x, from x" and the scribbler never writes those 12
    // bytes: whatever garbage x sends, the bridge learns x's address on x and sends the frame
    // back to its source, which is a drop. x attacks valed, not the others' rings (a client
    // flooding other ports is a load problem, not an isolation one).
    for idx in FIRST_SLOT_BUF..raw.num_bufs {
        // SAFETY: x's own buffer, before the scribbler starts.
        unsafe {
            let b = raw.buf(idx);
            std::ptr::copy_nonoverlapping(MAC_X.as_ptr(), b, 6);
            std::ptr::copy_nonoverlapping(MAC_X.as_ptr(), b.add(6), 6);
        }
    }
    let t0 = Instant::now();

    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    // However this test ends, the scribbler stops.
    let _stop_on_exit = SetOnDrop(stop.clone());

    let scribbler = std::thread::spawn({
        let (x, stop) = (x.clone(), stop.clone());
        move || scribble(&x, raw, x_kick, &stop)
    });

    // b drains its ring until a's stream is complete and x has stopped (x floods b too).
    let x_done = Arc::new(AtomicBool::new(false));
    let receiver = std::thread::spawn({
        let (b, received, x_done) = (b.clone(), received.clone(), x_done.clone());
        move || {
            let mut next = 0u64;
            let mut others = 0u64;
            let mut last_progress = Instant::now();
            while next < STREAM || !x_done.load(Acquire) {
                let frames = recv_frames(&b);
                if frames.is_empty() {
                    assert!(
                        next == STREAM || last_progress.elapsed() < Duration::from_secs(10),
                        "b: no frame from a for 10 s (received {next} of {STREAM})"
                    );
                    b.poll(READABLE, Some(Duration::from_millis(100)))
                        .expect("poll");
                    continue;
                }
                for f in frames {
                    let ours = f.len() >= 22 && f[6..12] == MAC_A && f[12..14] == [0x88, 0xb5];
                    if !ours {
                        others += 1;
                        continue;
                    }
                    let seq = u64::from_le_bytes(f[14..22].try_into().unwrap());
                    assert_eq!(seq, next, "b: frame {next} lost or out of order");
                    let want = test_frame(stream_len(seq), MAC_A, MAC_B, seq);
                    assert!(f == want, "b: frame {seq} is not what a sent");
                    next += 1;
                    last_progress = Instant::now();
                }
                received.store(next, Release);
            }
            others
        }
    });

    let sender = std::thread::spawn({
        let (a, received) = (a.clone(), received.clone());
        move || {
            let mut seq = 0u64;
            while seq < STREAM {
                let deadline = Instant::now() + Duration::from_secs(10);
                while seq - received.load(Acquire) >= WINDOW {
                    assert!(
                        Instant::now() < deadline,
                        "a: b received nothing for 10 s (sent {seq})"
                    );
                    std::thread::sleep(Duration::from_micros(20));
                }
                // Paced, so the stream lasts about as long as the scribbler's attack.
                let due = t0.elapsed().as_micros() as u64 * STREAM / STREAM_US;
                if seq >= due {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                let burst = (received.load(Acquire) + WINDOW - seq)
                    .min(32)
                    .min(due - seq);
                for _ in 0..burst {
                    let f = test_frame(stream_len(seq), MAC_A, MAC_B, seq);
                    send_counting_sleeps(&a, &f, "a");
                    if seq.is_multiple_of(64) {
                        // Now and then a frame for x, so valed also writes into x's (hostile)
                        // rx ring. It keeps x's buffers addressed to x, and its source is not
                        // a's address: what x may send back of it is not a's stream. (Until
                        // the bridge has learnt x, it floods to b too, which b ignores.)
                        let noise = test_frame(60 + (seq % 900) as usize, MAC_D, MAC_X, seq);
                        send_counting_sleeps(&a, &noise, "a");
                    }
                    seq += 1;
                    if seq == STREAM {
                        break;
                    }
                }
                a.txsync(0).expect("txsync a");
            }
        }
    });

    let deadline = Instant::now() + Duration::from_secs(40);
    join_by("a's sender", sender, deadline);
    let stream_time = t0.elapsed();
    stop.store(true, Relaxed);
    let s = join_by("the scribbler", scribbler, deadline);
    // What x sent last has been forwarded once valed gave its slots back; then b is done.
    std::thread::sleep(Duration::from_millis(100));
    x_done.store(true, Release);
    let others = join_by("b's receiver", receiver, deadline);
    eprintln!(
        "hostile: {STREAM} frames a->b in {stream_time:?}, {others} other frames at b; \
         scribbler: {s:?}"
    );

    assert!(v.alive(), "valed died: {}", v.log());
    let (ca, cb, cx) = (
        v.counters("vale0:a"),
        v.counters("vale0:b"),
        v.counters("vale0:x"),
    );
    eprintln!("a: {ca:?}\nb: {cb:?}\nx: {cx:?}");
    assert!(cx.bad_input > 0, "x's garbage was never counted: {cx:?}");
    assert_eq!(ca.bad_input, 0, "a is blamed for x's garbage");
    assert_eq!(cb.bad_input, 0, "b is blamed for x's garbage");
    assert_eq!(cb.rx_drops, 0, "b lost frames");
    assert!(ca.tx_packets >= STREAM, "a: {ca:?}");
    assert_eq!(received.load(Acquire), STREAM);

    // x goes; its name is free again and a fresh x works.
    drop(Arc::try_unwrap(x).ok().expect("x has no other user"));
    assert!(
        wait_until_every(Duration::from_secs(2), LOOK, || v.port("vale0:x").is_none()),
        "vale0:x still listed after its client closed it"
    );
    let x = v.open("vale0:x");
    // Whatever of the old x's garbage b has not read yet.
    while !recv_frames(&b).is_empty() {}
    let f = test_frame(200, MAC_C, MAC_B, 42);
    send_and_expect(&x, &b, &f, "b did not get the fresh x's frame");
    let cx = v.counters("vale0:x");
    assert_eq!(cx.bad_input, 0, "the fresh x inherited counters: {cx:?}");
    assert_eq!(cx.tx_packets, 1);
    assert!(v.alive());
}

// ---- 2. a bad head, published once -----------------------------------------------------------

#[test]
fn bad_head_is_counted_once_and_costs_no_cpu() {
    let mut v = Valed::start();
    let (x, x_kick) = open_with_kick(&v, &v.options(), "vale0:x");
    let raw = Raw::of(&x);
    let n = raw.num_slots;
    let bad = n + 5;
    raw.atok(0).head.store(bad, Release);
    fence(SeqCst);
    kick(x_kick);
    assert!(
        wait_until_every(Duration::from_secs(2), LOOK, || v
            .counters("vale0:x")
            .bad_input
            >= 1),
        "valed never counted head {bad} on a {n}-slot ring as bad input"
    );
    // Let valed settle, then watch it for a second, kicked a few more times with the same
    // (still bad) head.
    std::thread::sleep(Duration::from_millis(100));
    let t0 = v.cpu_ticks();
    for _ in 0..5 {
        kick(x_kick);
        std::thread::sleep(Duration::from_millis(200));
    }
    let ticks = v.cpu_ticks() - t0;
    let c = v.counters("vale0:x");
    eprintln!(
        "bad head: bad_input {}, valed cpu {ticks} ticks in 1 s ({} per s)",
        c.bad_input,
        ticks_per_second()
    );
    assert_eq!(
        c.bad_input, 1,
        "one bad head published once must count once"
    );
    assert!(
        ticks * 100 <= 5 * ticks_per_second(),
        "valed used {ticks} ticks in 1 s after one bad head: it spins"
    );
    assert_eq!(c.tx_packets, 0);
    // The ring was left untouched.
    assert_eq!(raw.ktoa(0).hwcur.load(Acquire), 0);

    // The client comes back to its senses: a good head, and frames flow again.
    let b = v.open("vale0:b");
    send_and_expect(&x, &b, &test_frame(64, MAC_C, MAC_B, 7), "x's good frame");
    let c = v.counters("vale0:x");
    assert_eq!((c.bad_input, c.tx_packets), (1, 1));
    assert!(v.alive(), "valed died: {}", v.log());
}

// ---- 3. half a chain, forever ----------------------------------------------------------------

/// Queues `chunks` on x's tx ring 0 as (part of) a chain, one a slot, and publishes them; the
/// last ends the chain if `last_ends`.
fn queue_fragments(x: &vale::Port, chunks: &[&[u8]], last_ends: bool) {
    queue_chain(&mut x.tx_ring(0), chunks.iter().copied(), last_ends);
}

#[test]
fn unfinished_chain_waits_without_spinning() {
    let mut v = Valed::start();
    let (a, b) = v.open_ab();
    let x = v.open("vale0:x");
    let whole = test_frame(180, MAC_C, MAC_B, 77);
    let chunks: Vec<&[u8]> = whole.chunks(60).collect();
    // Two slots of three, both saying "more follows".
    queue_fragments(&x, &chunks[..2], false);
    x.txsync(0).unwrap();
    let raw = Raw::of(&x);

    // Others keep working.
    one_at_a_time(&a, &b, 500);
    std::thread::sleep(Duration::from_millis(100));
    let ticks = cpu_over(&v, Duration::from_secs(1));
    eprintln!("unfinished chain: valed cpu {ticks} ticks in 1 s");
    assert!(
        ticks * 100 <= 5 * ticks_per_second(),
        "valed used {ticks} ticks in 1 s with half a chain pending: it spins on that ring"
    );
    // valed took nothing of the chain and blamed nobody.
    assert_eq!(
        raw.ktoa(0).hwcur.load(Acquire),
        0,
        "half a chain was consumed"
    );
    let cx = v.counters("vale0:x");
    assert_eq!((cx.bad_input, cx.tx_packets), (0, 0), "{cx:?}");

    // The rest arrives: the frame goes through whole.
    queue_fragments(&x, &chunks[2..], true);
    x.txsync(0).unwrap();
    assert_eq!(wait_frames(&b, Duration::from_secs(5)), vec![whole]);
    let cx = v.counters("vale0:x");
    assert_eq!((cx.bad_input, cx.tx_packets), (0, 1), "{cx:?}");
    assert!(v.alive(), "valed died: {}", v.log());
}

/// docs/abi.md: "A chain that is too long, or has a bad slot anywhere, is dropped whole as
/// bad input", and "a chain that head cuts in two waits for the rest". Here the published
/// half of a chain already holds a bad slot; the rest comes later.
#[test]
fn bad_slot_in_unfinished_chain_drops_the_whole_chain() {
    let mut v = Valed::start();
    let b = v.open("vale0:b");
    let x = v.open("vale0:x");
    let whole = test_frame(180, MAC_C, MAC_B, 5);
    let chunks: Vec<&[u8]> = whole.chunks(60).collect();
    // First slot: a reserved buffer index (bad), "more follows"; published alone.
    let first = x.tx_ring(0).cur();
    queue_fragments(&x, &chunks[..1], false);
    let good_idx = x.tx_ring(0).slot(first).buf_idx;
    x.tx_ring(0).slot_mut(first).buf_idx = 0;
    x.txsync(0).unwrap();
    assert!(
        wait_until_every(Duration::from_secs(2), LOOK, || v
            .counters("vale0:x")
            .bad_input
            == 1),
        "the bad slot was not counted: {:?}",
        v.counters("vale0:x")
    );
    // The rest of the same chain.
    queue_fragments(&x, &chunks[1..], true);
    x.txsync(0).unwrap();
    let got = wait_frames(&b, Duration::from_millis(500));
    // Put the buffer back where it belongs before anything else uses the ring.
    x.tx_ring(0).slot_mut(first).buf_idx = good_idx;
    let cx = v.counters("vale0:x");
    assert!(
        got.is_empty(),
        "b received {} frame(s) made of the tail of a chain that was dropped as bad \
         (lengths {:?}); x: {cx:?}",
        got.len(),
        got.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert_eq!(cx.tx_packets, 0, "{cx:?}");
    assert!(v.alive());
}

// ---- 4. a ring full of one chain -------------------------------------------------------------

#[test]
fn ring_full_of_morefrag_is_bad_input_and_consumed() {
    let mut v = Valed::start();
    let (a, b) = v.open_ab();
    // 64 slots: a 63-slot chain (within the 512-slot limit) that cannot go on; 1024 slots: a
    // 1023-slot chain (over the limit too).
    for (name, slots) in [("vale0:x", 64u32), ("vale0:y", 1024)] {
        let x = v
            .options()
            .slots(slots)
            .open(name)
            .unwrap_or_else(|e| panic!("open {name}: {e}"));
        let ring = x.tx_ring(0);
        assert_eq!(ring.space(), slots - 1);
        let payload = test_frame(60, MAC_C, MAC_B, 1);
        let chunks: Vec<&[u8]> = (0..slots - 1).map(|_| &payload[..]).collect();
        queue_fragments(&x, &chunks, false);
        assert_eq!(ring.space(), 0);
        x.txsync(0).unwrap();
        // valed gives the whole ring back.
        let ev = x.poll(WRITABLE, Some(Duration::from_secs(5))).unwrap();
        assert!(ev.writable, "{name}: valed never gave the slots back");
        assert_eq!(ring.space(), slots - 1, "{name}: not all slots came back");
        let c = v.counters(name);
        assert_eq!(c.bad_input, 1, "{name}: {c:?}");
        assert_eq!(c.tx_packets, 0, "{name}: {c:?}");
        // The chain is not over until a slot without NS_MOREFRAG ends it: that slot is the
        // dropped chain's last, skipped, not a frame of its own.
        queue_fragments(&x, &[&payload[..]], true);
        x.txsync(0).unwrap();
        assert!(
            wait_frames(&b, Duration::from_millis(300)).is_empty(),
            "{name}: the end of a dropped chain was forwarded"
        );
        let c = v.counters(name);
        assert_eq!((c.bad_input, c.tx_packets), (1, 0), "{name}: {c:?}");
        // x itself still works...
        let f = test_frame(100, MAC_C, MAC_B, 2);
        send_and_expect(
            &x,
            &b,
            &f,
            &format!("{name}'s good frame after the bad chain"),
        );
        // ...and so do the others.
        one_at_a_time(&a, &b, 100);
        assert_eq!(v.counters(name).bad_input, 1);
    }
    assert!(v.alive(), "valed died: {}", v.log());
    assert_eq!(v.counters("vale0:a").bad_input, 0);
    assert_eq!(v.counters("vale0:b").bad_input, 0);
}

// ---- 5. idle is free -------------------------------------------------------------------------

#[test]
fn idle_ports_cost_no_cpu_before_and_after_traffic() {
    let v = Valed::start();
    let ports: Vec<Arc<vale::Port>> = (0..20)
        .map(|i| Arc::new(v.open(&format!("vale0:p{i}"))))
        .collect();
    // One client sleeping in poll through the whole idle window.
    let sleeper = std::thread::spawn({
        let p = ports[19].clone();
        move || p.poll(READABLE, Some(Duration::from_millis(2300))).unwrap()
    });
    std::thread::sleep(Duration::from_millis(200));
    let idle = cpu_over(&v, Duration::from_secs(2));
    let ev = join_by(
        "the sleeping client",
        sleeper,
        Instant::now() + Duration::from_secs(5),
    );
    assert_eq!(ev, vale::Events::default(), "nothing was sent");

    // A burst: 200k frames p0 -> p1, then nothing.
    let n = 200_000u64;
    let received = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let rx = std::thread::spawn({
        let (p, received) = (ports[1].clone(), received.clone());
        move || {
            let mut got = 0;
            while got < n {
                let k = wait_frames(&p, Duration::from_secs(5)).len() as u64;
                assert!(k > 0, "p1: nothing for 5 s ({got} of {n})");
                got += k;
                received.store(got, Release);
            }
        }
    });
    let tx = std::thread::spawn({
        let (p, received) = (ports[0].clone(), received.clone());
        move || {
            let f = test_frame(60, MAC_A, MAC_B, 0);
            let mut sent = 0;
            while sent < n {
                let deadline = Instant::now() + Duration::from_secs(5);
                while sent - received.load(Acquire) >= 512 {
                    assert!(Instant::now() < deadline, "p0: window stuck");
                    std::thread::sleep(Duration::from_micros(20));
                }
                for _ in 0..64 {
                    send_counting_sleeps(&p, &f, "p0");
                    sent += 1;
                }
                p.txsync(0).unwrap();
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    join_by("p0's sender", tx, deadline);
    join_by("p1's receiver", rx, deadline);
    let burst = t0.elapsed();
    let busy = cpu_over(&v, Duration::from_secs(2));
    let hz = ticks_per_second();
    eprintln!(
        "idle: 20 ports, valed {idle} ticks in 2 s; burst of {n} frames in {burst:?}; \
         {busy} ticks in the 2 s after it ({hz} ticks/s)"
    );
    assert!(
        idle <= 2,
        "valed used {idle} ticks in 2 s with 20 idle ports"
    );
    assert!(
        busy <= 2,
        "valed used {busy} ticks in the 2 s after the traffic stopped: it does not go idle"
    );
    let c = v.counters("vale0:p1");
    assert_eq!(c.rx_packets, n, "{c:?}");
}

// ---- 6. no lost wake-up ----------------------------------------------------------------------

/// One round of the ping-pong, decided by a generator both sides run in step: the lengths
/// of a's frames (small ones take one slot of a's 128-byte buffers, big ones 21), then the
/// lengths of b's replies (one slot each way).
fn plan(rng: &mut Rng) -> (Vec<usize>, Vec<usize>) {
    let k = 1 + rng.below(4) as usize;
    let big = rng.below(4) == 0;
    let out = (0..k)
        .map(|_| {
            if big {
                21 * 128
            } else {
                60 + rng.below(69) as usize
            }
        })
        .collect();
    let back = (0..k).map(|_| 60 + rng.below(69) as usize).collect();
    (out, back)
}

/// a and b, each in its own thread sleeping in poll, bounce small batches until `total`
/// frames have moved. Returns (elapsed, rounds, tx-full sleeps, interrupts a and b took).
fn ping_pong(args: &[&str], total: u64) -> (Duration, u64, u64, u64) {
    let mut v = Valed::start_with(args);
    // The ports outlive the threads (the failure report reads their rings).
    let a = Arc::new(
        v.options()
            .slots(64)
            .buf_size(128)
            .open("vale0:a")
            .expect("open a"),
    );
    let b = Arc::new(v.options().slots(64).open("vale0:b").expect("open b"));
    let (raw_a, raw_b) = (Raw::of(&a), Raw::of(&b));
    let seed = 0xfeed_u64;
    let t0 = Instant::now();
    // Frames moved as each side counts them (both run the same plan, so both stop after the
    // same round); shared only for the failure report.
    let moved_a = Arc::new(AtomicU64::new(0));
    let moved_b = Arc::new(AtomicU64::new(0));

    let tb = std::thread::spawn({
        let (b, moved) = (b.clone(), moved_b.clone());
        move || {
            let mut rng = Rng::new(seed);
            let mut seq = 0u64;
            while moved.load(Acquire) < total {
                let (out, back) = plan(&mut rng);
                let got = recv_exactly(&b, out.len(), "b");
                for (f, &len) in got.iter().zip(&out) {
                    assert!(
                        *f == test_frame(len, MAC_A, MAC_B, seq),
                        "b: frame {seq} differs from what a sent"
                    );
                    seq += 1;
                }
                let start = seq - out.len() as u64;
                for (i, &len) in back.iter().enumerate() {
                    let f = test_frame(len, MAC_B, MAC_A, start + i as u64);
                    send_counting_sleeps(&b, &f, "b");
                }
                b.txsync(0).expect("txsync b");
                moved.fetch_add(2 * out.len() as u64, Release);
            }
            b.interrupts()
        }
    });
    let ta = std::thread::spawn({
        let (a, moved) = (a.clone(), moved_a.clone());
        move || {
            let mut rng = Rng::new(seed);
            let (mut seq, mut rounds, mut sleeps) = (0u64, 0u64, 0u64);
            while moved.load(Acquire) < total {
                let (out, back) = plan(&mut rng);
                for (i, &len) in out.iter().enumerate() {
                    let f = test_frame(len, MAC_A, MAC_B, seq + i as u64);
                    sleeps += send_counting_sleeps(&a, &f, "a");
                }
                a.txsync(0).expect("txsync a");
                let got = recv_exactly(&a, back.len(), "a");
                for (i, (f, &len)) in got.iter().zip(&back).enumerate() {
                    assert!(
                        *f == test_frame(len, MAC_B, MAC_A, seq + i as u64),
                        "a: reply to frame {} differs",
                        seq + i as u64
                    );
                }
                seq += out.len() as u64;
                rounds += 1;
                moved.fetch_add(2 * out.len() as u64, Release);
            }
            (rounds, sleeps, a.interrupts())
        }
    });
    let explain = {
        let (v, moved_a, moved_b) = (&v, moved_a.clone(), moved_b.clone());
        move || {
            let mut s = ring_state("a", &raw_a) + &ring_state("b", &raw_b);
            for p in v.list().into_iter().flat_map(|s| s.ports) {
                s += &format!("{}: {:?}\n", p.name, p.counters);
            }
            s + &format!(
                "frames moved: {} as a counts, {} as b counts\nvaled log:\n{}",
                moved_a.load(Acquire),
                moved_b.load(Acquire),
                v.log()
            )
        }
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let (rounds, sleeps, ia) = join_or_explain("a", ta, deadline, &explain);
    let ib = join_or_explain("b", tb, deadline, &explain);
    let took = t0.elapsed();
    assert!(v.alive(), "valed died: {}", v.log());
    assert!(moved_a.load(Acquire) >= total);
    assert_eq!(moved_a.load(Acquire), moved_b.load(Acquire));
    (took, rounds, sleeps, ia + ib)
}

#[test]
fn no_lost_wakeup_in_a_million_frames() {
    let _g = serial();
    let total = 1_000_000;
    let (took, rounds, sleeps, irqs) = ping_pong(&[], total);
    eprintln!(
        "ping-pong, 1 worker: {total} frames in {rounds} rounds, {took:?}; \
         {sleeps} sleeps on a full tx ring; {irqs} interrupts"
    );
    assert!(sleeps > 0, "the tx-full wait was never exercised");
}

#[test]
fn no_lost_wakeup_with_two_workers() {
    let _g = serial();
    let total = 200_000;
    let (took, rounds, sleeps, irqs) = ping_pong(&["--workers", "2"], total);
    eprintln!(
        "ping-pong, 2 workers: {total} frames in {rounds} rounds, {took:?}; \
         {sleeps} sleeps on a full tx ring; {irqs} interrupts"
    );
}

//! The bound of the machine for a switch that isolates its ports: one copy per frame between
//! two cores, and nothing else (bench/bound.py, bench/sizes.py's `bare_copy` row).
//!
//! Two threads, each pinned to its own CPU (`--cpus P,C`, default 0,1), share one
//! single-producer/single-consumer ring in shared memory (a memfd, mapped `MAP_SHARED`), laid
//! out as vale's ports are: netmap slots (`struct netmap_slot`: buffer index, length, flags),
//! buffers of vale's default size (2112 bytes), and one CSB pair for the indices (the producer
//! publishes `head` in `nm_csb_atok`, the consumer gives slots back through `hwcur` in
//! `nm_csb_ktoa`), each index published once per batch as vale's clients and workers do.
//!
//! - The producer plays the switch's part: for each free slot it copies a `--len`-byte frame
//!   from a source buffer of its own (one of as many prefilled buffers as the ring has slots,
//!   taken in turn, as a sender's tx ring would hold them) into the slot's buffer, in whole
//!   64-byte chunks as valed's copy does, and sets the slot's length.
//! - The consumer plays the receiver's part: it reads each slot's length and gives the slots
//!   back, as `vale-pktgen -f rx` does; it reads no payload unless `--touch` (then it reads
//!   every 64-byte chunk of each frame).
//!
//! No lookup, no system call, no sleep: both threads spin. Counts what the consumer took over
//! `--seconds` after `--warmup`, and prints one JSON line: `{"len", "pps", "packets",
//! "seconds", "cpus", "slots", "batch", "touch"}`.
//!
//! `--rtt`: the floor of a busy ping-pong instead, the time an index takes to go to the other
//! CPU and back. The first thread publishes `head` and spins until the second, which spins on
//! `head`, answers with the same value in `hwcur` (the CSB's two lines, as a vale hop moves
//! them); round trips are timed in groups of 1000 over `--seconds`, and the JSON line is
//! `{"rtt_ns" (the median group's mean), "rtt_ns_min", "round_trips", "seconds", "cpus"}`. A
//! busy vale round trip (bench/latency.py's `busy`) moves such an index four times and the
//! frame's lines with it.
//!
//!     bare-copy [--len 60] [--seconds 2] [--warmup 0.3] [--cpus 0,1] [--batch 512] [--slots 1024] [--touch]
//!     bare-copy --rtt [--seconds 2] [--warmup 0.3] [--cpus 0,1]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vale_abi::csb::{CsbAtok, CsbKtoa};
use vale_abi::netmap::{ring_distance, ring_next, NetmapSlot};
use vale_abi::region::DEFAULT_BUF_SIZE;

const BUF: usize = DEFAULT_BUF_SIZE as usize;
const SLOTS_OFS: usize = 256;

struct Args {
    len: usize,
    seconds: f64,
    warmup: f64,
    cpus: [usize; 2],
    batch: u32,
    slots: u32,
    touch: bool,
    rtt: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        len: 60,
        seconds: 2.0,
        warmup: 0.3,
        cpus: [0, 1],
        batch: 512,
        slots: 1024,
        touch: false,
        rtt: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--touch" {
            a.touch = true;
            continue;
        }
        if k == "--rtt" {
            a.rtt = true;
            continue;
        }
        if k == "-h" || k == "--help" {
            return Err(String::new());
        }
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        let bad = || format!("bad value for {k}: {v}");
        match k.as_str() {
            "--len" => a.len = v.parse().map_err(|_| bad())?,
            "--seconds" => a.seconds = v.parse().map_err(|_| bad())?,
            "--warmup" => a.warmup = v.parse().map_err(|_| bad())?,
            "--batch" => a.batch = v.parse().map_err(|_| bad())?,
            "--slots" => a.slots = v.parse().map_err(|_| bad())?,
            "--cpus" => {
                let c: Vec<usize> = v
                    .split(',')
                    .map(|x| x.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|_| bad())?;
                a.cpus = c
                    .try_into()
                    .map_err(|_| format!("--cpus takes two CPUs, not {v}"))?;
            }
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if !(14..=BUF).contains(&a.len) {
        return Err(format!("--len must be 14..{BUF} (one buffer)"));
    }
    if a.slots < 2 || !a.slots.is_power_of_two() || a.batch == 0 {
        return Err("--slots must be a power of two >= 2 and --batch > 0".into());
    }
    if a.rtt && a.cpus[0] == a.cpus[1] {
        // Two spinners on one CPU take turns at the scheduler's pace: milliseconds.
        return Err("--rtt needs two different CPUs".into());
    }
    if !(a.seconds > 0.0 && a.warmup >= 0.0) {
        return Err("--seconds must be > 0 and --warmup >= 0".into());
    }
    Ok(a)
}

/// The shared ring: CSB pair at 0 and 64, slots at 256, buffers from the next page on.
struct Ring {
    base: *mut u8,
    size: usize,
    slots: u32,
    bufs_ofs: usize,
}

// The two threads share the mapping; who may write which part is the ring's protocol.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    fn new(slots: u32) -> std::io::Result<Ring> {
        let bufs_ofs =
            (SLOTS_OFS + slots as usize * size_of::<NetmapSlot>()).next_multiple_of(4096);
        let size = bufs_ofs + slots as usize * BUF;
        // SAFETY: plain system calls; results checked; the descriptor is closed once mapped.
        unsafe {
            let fd = libc::memfd_create(c"bare-copy".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 || libc::ftruncate(fd, size as libc::off_t) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            );
            libc::close(fd);
            if p == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            let r = Ring {
                base: p.cast(),
                size,
                slots,
                bufs_ofs,
            };
            for i in 0..slots {
                r.slot(i).write(NetmapSlot {
                    buf_idx: i,
                    len: 0,
                    flags: 0,
                    ptr: 0,
                });
            }
            Ok(r)
        }
    }
    fn atok(&self) -> &CsbAtok {
        // SAFETY: offset 0 of a page-aligned mapping, zero-filled: valid atomics.
        unsafe { &*self.base.cast::<CsbAtok>() }
    }
    fn ktoa(&self) -> &CsbKtoa {
        // SAFETY: as atok, at offset 64.
        unsafe { &*self.base.add(64).cast::<CsbKtoa>() }
    }
    fn slot(&self, i: u32) -> *mut NetmapSlot {
        // SAFETY: i < slots (callers index with ring_next), inside the mapping.
        unsafe {
            self.base
                .add(SLOTS_OFS)
                .cast::<NetmapSlot>()
                .add(i as usize)
        }
    }
    fn buf(&self, idx: u32) -> *mut u8 {
        // SAFETY: idx < slots: inside the mapping.
        unsafe { self.base.add(self.bufs_ofs + idx as usize * BUF) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used by any thread (both are joined).
        unsafe { libc::munmap(self.base.cast(), self.size) };
    }
}

fn pin(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity on the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "cannot pin to cpu{cpu}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// The producer: copies frames into free slots, publishes `head` once per batch.
fn produce(r: &Ring, a: &Args, stop: &AtomicBool) {
    let n = r.slots;
    let src: Vec<u8> = {
        // A frame per source buffer: broadcast destination, a source MAC, IPv4, zero payload.
        let mut frame = vec![0u8; BUF];
        frame[..6].copy_from_slice(&[0xff; 6]);
        frame[6..12].copy_from_slice(&[2, 0, 0, 0, 1, 1]);
        frame[12..14].copy_from_slice(&[8, 0]);
        frame.repeat(n as usize)
    };
    let chunked = (a.len + 63) & !63;
    let mut head = 0u32;
    while !stop.load(Relaxed) {
        let hwcur = r.ktoa().hwcur.load(Acquire);
        // Slots from head up to (not including) the one before hwcur are free.
        let space = ring_distance(head, (hwcur + n - 1) % n, n);
        let want = space.min(a.batch);
        if want == 0 {
            std::hint::spin_loop();
            continue;
        }
        for _ in 0..want {
            // SAFETY: slots [head, hwcur - 1) are the producer's until it publishes them.
            unsafe {
                let s = r.slot(head);
                let idx = (*s).buf_idx;
                std::ptr::copy_nonoverlapping(
                    src.as_ptr().add(head as usize * BUF),
                    r.buf(idx),
                    chunked,
                );
                (*s).len = a.len as u16;
                (*s).flags = 0;
            }
            head = ring_next(head, n);
        }
        r.atok().head.store(head, Release);
    }
}

/// The consumer: reads each frame's slot, gives the slots back once per batch.
fn consume(r: &Ring, a: &Args, stop: &AtomicBool, count: &AtomicU64) {
    let n = r.slots;
    let mut cur = 0u32;
    let mut total = 0u64;
    let mut sum = 0u64;
    while !stop.load(Relaxed) {
        let head = r.atok().head.load(Acquire);
        let avail = ring_distance(cur, head, n).min(a.batch);
        if avail == 0 {
            std::hint::spin_loop();
            continue;
        }
        for _ in 0..avail {
            // SAFETY: slots [cur, head) were published by the producer (Acquire above).
            unsafe {
                let s = r.slot(cur);
                let len = (*s).len as usize;
                sum = sum.wrapping_add(len as u64);
                if a.touch {
                    let b = r.buf((*s).buf_idx);
                    for off in (0..len).step_by(64) {
                        sum = sum.wrapping_add(b.add(off).read() as u64);
                    }
                }
            }
            cur = ring_next(cur, n);
        }
        r.ktoa().hwcur.store(cur, Release);
        total += avail as u64;
        count.store(total, Relaxed);
    }
    black_box(sum);
}

/// Round trips timed together in `--rtt` (a clock read per group, not per round trip).
const RTT_GROUP: u32 = 1000;

/// `--rtt`, the first thread: publishes a new `head`, spins until `hwcur` echoes it; the
/// mean of each group of round trips, in ns, until `stop` (the warm-up's groups left out).
fn ping(r: &Ring, a: &Args, stop: &AtomicBool) -> Vec<f64> {
    let (atok, ktoa) = (r.atok(), r.ktoa());
    let mut groups = Vec::new();
    let start = Instant::now();
    let mut v = 0u32;
    while !stop.load(Relaxed) {
        let t0 = Instant::now();
        for _ in 0..RTT_GROUP {
            v = v.wrapping_add(1);
            atok.head.store(v, Release);
            while ktoa.hwcur.load(Acquire) != v {
                std::hint::spin_loop();
            }
        }
        if start.elapsed().as_secs_f64() > a.warmup {
            groups.push(t0.elapsed().as_nanos() as f64 / f64::from(RTT_GROUP));
        }
    }
    atok.head.store(v.wrapping_add(1) | 1 << 31, Release);
    groups
}

/// `--rtt`, the second thread: echoes each new `head` in `hwcur` (a value with the top bit
/// set says stop).
fn pong(r: &Ring) {
    let (atok, ktoa) = (r.atok(), r.ktoa());
    let mut seen = 0u32;
    loop {
        let v = atok.head.load(Acquire);
        if v == seen {
            std::hint::spin_loop();
            continue;
        }
        if v & 1 << 31 != 0 {
            return;
        }
        seen = v;
        ktoa.hwcur.store(v, Release);
    }
}

/// `--rtt`: see the module docs.
fn rtt(ring: Arc<Ring>, a: Arc<Args>) -> Result<serde_json::Value, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let (r, cpu) = (ring.clone(), a.cpus[1]);
        std::thread::spawn(move || pin(cpu).map(|()| pong(&r)))
    };
    let timer = {
        let (r, a, stop) = (ring.clone(), a.clone(), stop.clone());
        std::thread::spawn(move || pin(a.cpus[0]).map(|()| ping(&r, &a, &stop)))
    };
    std::thread::sleep(Duration::from_secs_f64(a.warmup + a.seconds));
    stop.store(true, Relaxed);
    let groups = timer.join().expect("thread panicked");
    if groups.is_err() {
        // The echo thread waits for a stop that will not come: tell it.
        ring.atok().head.store(1 << 31, Release);
    }
    echo.join().expect("thread panicked")?;
    let mut groups = groups?;
    if groups.is_empty() {
        return Err("no group of round trips ended within --seconds".into());
    }
    groups.sort_by(f64::total_cmp);
    Ok(serde_json::json!({
        "rtt_ns": groups[groups.len() / 2], "rtt_ns_min": groups[0],
        "round_trips": groups.len() as u64 * u64::from(RTT_GROUP), "seconds": a.seconds,
        "cpus": a.cpus,
    }))
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            let usage = "usage: bare-copy [--len 60] [--seconds 2] [--warmup 0.3] [--cpus 0,1] \
                         [--batch 512] [--slots 1024] [--touch]\n       \
                         bare-copy --rtt [--seconds 2] [--warmup 0.3] [--cpus 0,1]";
            if e.is_empty() {
                println!("{usage}");
                return;
            }
            eprintln!("bare-copy: {e}\n{usage}");
            std::process::exit(2);
        }
    };
    let ring = match Ring::new(a.slots) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprintln!("bare-copy: cannot map the ring: {e}");
            std::process::exit(1);
        }
    };
    let a = Arc::new(a);
    if a.rtt {
        match rtt(ring, a) {
            Ok(report) => println!("{report}"),
            Err(e) => {
                eprintln!("bare-copy: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for role in 0..2 {
        let (r, a, stop, count) = (ring.clone(), a.clone(), stop.clone(), count.clone());
        threads.push(std::thread::spawn(move || {
            let pinned = pin(a.cpus[role]);
            if pinned.is_ok() {
                if role == 0 {
                    produce(&r, &a, &stop);
                } else {
                    consume(&r, &a, &stop, &count);
                }
            }
            pinned
        }));
    }
    std::thread::sleep(Duration::from_secs_f64(a.warmup));
    let (c0, t0) = (count.load(Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    let (c1, t1) = (count.load(Relaxed), Instant::now());
    stop.store(true, Relaxed);
    for t in threads {
        if let Err(e) = t.join().expect("thread panicked") {
            stop.store(true, Relaxed);
            eprintln!("bare-copy: {e}");
            std::process::exit(1);
        }
    }
    let secs = (t1 - t0).as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "len": a.len, "pps": (c1 - c0) as f64 / secs, "packets": c1 - c0, "seconds": secs,
            "cpus": a.cpus, "slots": a.slots, "batch": a.batch, "touch": a.touch,
        })
    );
}

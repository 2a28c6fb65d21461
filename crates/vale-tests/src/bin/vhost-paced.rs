//! A vhost-user front end that sends at a fixed rate: the offered load of bench/vhost_user.py's
//! `--loads` runs, the same for vale's vhost-user ports and for DPDK's vhost PMD.
//!
//! It connects to a vhost-user back end listening at `--socket`, shares 8 MiB of its own
//! memory, sets up queue pair 0 (receive queue without buffers: it only sends) and posts
//! `--len`-byte frames to `--dst` on the transmit queue at `--rate` frames per second for
//! `--seconds`, in bursts every 20 µs, reusing descriptors as the back end returns them. A
//! frame it cannot post because all descriptors are still with the back end is not sent
//! (counted as `backlog`: the back end did not keep up). Prints one JSON line: frames posted,
//! the seconds it took, the backlog, and the kicks it made. With `--rate 0` it posts nothing: a connected guest
//! whose driver is idle for `--seconds` (bench/vhost_many.py's idle ports). `--tick-us` sets
//! the time between bursts (many senders at low rates: fewer wake-ups each). Its transmit
//! interrupts are off, as a polling driver has them (it reclaims descriptors by reading the
//! used index). With `--event-idx` it negotiates event indices (VIRTIO_RING_F_EVENT_IDX),
//! as Linux's virtio-net does, and kicks only when its avail index passes the back end's
//! avail event (what vale's kick moderation sets ahead: docs/virtual-machines.md).
//!
//! With `--sync` (bench/vhost_user.py's `--cost`, which reads the middle's CPU time around
//! the sending) it prints `{"ready": true}` once the rings are set up and waits for a line on
//! its standard input before it sends; after its JSON line it stays connected until its
//! standard input closes, so the back end's threads are all alive between the two reads.
//!
//! `--role ping` and `--role pong` make it one end of a request/response exchange
//! (bench/latency.py's VM path): the receive queue gets 256 buffers of 2 KiB and interrupts
//! on. pong echoes every frame it receives (destination = the frame's source, source = its
//! own `--mac`); ping sends a `--len`-byte frame to `--dst`, waits for its echo (matched by a
//! sequence number), and sends the next, for `--seconds` (counted from the first echo: until
//! then it asks every 100 ms, for up to 10 s, while the far end sets up), then prints one JSON line with the
//! round-trip times in microseconds (`samples`, `min_us`, `median_us`, `p99_us`, `max_us`,
//! `lost`: requests without an echo within a second). Both sleep in poll(2) on the receive
//! queue's call eventfd between frames, as a guest's driver sleeps on its interrupt; with
//! `--busy` they spin on the used index instead. Transmit interrupts are off
//! (VRING_AVAIL_F_NO_INTERRUPT): they reclaim transmit descriptors by reading the used index.
//!
//! `--role sink` is a receiver as a guest's driver is one (bench/vhost_user.py's `--receiver
//! sink`): the receive queue (1024 entries) gets `--bufs` buffers of 2 KiB (default 1024;
//! QEMU's virtio-net posts 256) and interrupts on. It sleeps in poll(2) on the queue's call
//! eventfd; on a wake-up it turns interrupts off, takes every used buffer and gives it back
//! (one avail index store and at most one kick a pass, the kick only if the back end asks for
//! it) until the queue is dry, then turns interrupts on again (with `--event-idx`, through
//! the used event) and looks once more before it sleeps: a NAPI poll. Without `--stamp` it
//! never reads the frames. It prints `{"ready": true}` once set up, and for each line on its
//! standard input `{"rx": FRAMES, "bytes": BYTES}` (what it took so far, frame bytes without
//! the virtio-net header); it ends when its standard input closes, or after `--seconds`
//! (default 3600 for the sink).
//!
//! `--stamp`, given to the paced sender and to the sink, measures how long each frame took
//! from its sender to its receiver: the sender writes the time (CLOCK_MONOTONIC, ns) it posts
//! each frame into the frame (EtherType 0x88b6, IEEE local experimental, the time in its
//! first 8 bytes), and the sink, which then reads each frame, takes the time once a pass over
//! its used ring and counts each stamped frame's delay in a histogram of 100-ns steps up to
//! 20 ms (longer ones in the last, the maximum kept exact). Each answer of the sink then also
//! has `"delay_us": {"samples", "median", "p99", "max"}` of the frames taken since its last
//! answer: a frame's wait in the middle (moderation's included) and the receiver's wake-up.
//!
//!     vhost-paced --socket PATH --rate PPS [--seconds 2] [--len 60] [--dst MAC] [--mac MAC]
//!                 [--tick-us 20] [--sync] [--event-idx] [--stamp]
//!     vhost-paced --socket PATH --role sink [--seconds S] [--mac MAC] [--event-idx] [--bufs N]
//!                 [--stamp]
//!     vhost-paced --socket PATH --role pong [--seconds S] [--mac MAC] [--busy]
//!     vhost-paced --socket PATH --role ping --dst MAC [--seconds 2] [--len 60] [--mac MAC] [--busy]

use std::io::BufRead;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

const MEM: usize = 8 << 20;
const QSZ: u16 = 1024;
const HDR: usize = 12;
const BUF: u64 = 2048;
const BUFS_AT: u64 = 1 << 20;
/// The receive buffers of ping and pong: 256 of BUF bytes.
const RX_BUFS_AT: u64 = 4 << 20;
const RX_BUFS: u16 = 256;
const DESC_F_WRITE: u16 = 2;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// EtherType of ping and pong's frames (IEEE local experimental).
const ETH_PINGPONG: [u8; 2] = [0x88, 0xb5];
/// EtherType of `--stamp`'s frames (IEEE local experimental 2): the time posted after it.
const ETH_STAMPED: [u8; 2] = [0x88, 0xb6];
/// Where a stamped frame's time lies: after the virtio-net header and the Ethernet header.
const STAMP_AT: u64 = (HDR + 14) as u64;
/// The sink's delay histogram: steps of this many ns, up to `DELAY_STEPS` of them.
const DELAY_STEP_NS: u64 = 100;
const DELAY_STEPS: usize = 200_000;
/// How long ping waits for an echo before it counts the request lost.
const ECHO_LIMIT: Duration = Duration::from_secs(1);
/// How long ping tries, before it measures, to get a first echo.
const WARM_LIMIT: Duration = Duration::from_secs(10);
/// At most this many round trips are kept (memory bound of a long run).
const MAX_SAMPLES: usize = 8 << 20;
const F_VERSION_1: u64 = 1 << 32;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const USED_F_NO_NOTIFY: u16 = 1;
const F_EVENT_IDX: u64 = 1 << 29;

fn desc(q: u64) -> u64 {
    q * 0x10000
}
fn avail(q: u64) -> u64 {
    desc(q) + 0x4000
}
fn used(q: u64) -> u64 {
    desc(q) + 0x8000
}
/// The used event (EVENT_IDX): after the avail ring's entries.
fn used_event(q: u64) -> u64 {
    avail(q) + 4 + 2 * QSZ as u64
}

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Paced,
    Ping,
    Pong,
    Sink,
}

struct Args {
    socket: String,
    rate: f64,
    seconds: f64,
    len: usize,
    dst: [u8; 6],
    mac: [u8; 6],
    role: Role,
    sync: bool,
    busy: bool,
    tick: Duration,
    event_idx: bool,
    /// The sink's receive buffers.
    bufs: u16,
    /// The sender stamps its frames, the sink counts their delays.
    stamp: bool,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let b: Vec<u8> = s
        .split(':')
        .map(|x| u8::from_str_radix(x, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{s}: {e}"))?;
    b.try_into().map_err(|_| format!("{s}: not a MAC"))
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        socket: String::new(),
        rate: 0.0,
        seconds: 2.0,
        len: 60,
        dst: [2, 0, 0, 0, 0x0e, 2],
        mac: [2, 0, 0, 0, 0x0e, 1],
        role: Role::Paced,
        sync: false,
        busy: false,
        tick: Duration::from_micros(20),
        event_idx: false,
        bufs: QSZ,
        stamp: false,
    };
    let mut seconds_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--socket" => a.socket = v()?,
            "--rate" => a.rate = v()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--seconds" => {
                a.seconds = v()?.parse().map_err(|e| format!("--seconds: {e}"))?;
                seconds_given = true;
            }
            "--len" => a.len = v()?.parse().map_err(|e| format!("--len: {e}"))?,
            "--dst" => a.dst = parse_mac(&v()?).map_err(|e| format!("--dst {e}"))?,
            "--mac" => a.mac = parse_mac(&v()?).map_err(|e| format!("--mac {e}"))?,
            "--role" => {
                a.role = match v()?.as_str() {
                    "ping" => Role::Ping,
                    "pong" => Role::Pong,
                    "paced" => Role::Paced,
                    "sink" => Role::Sink,
                    r => return Err(format!("--role {r}: not ping, pong, sink or paced")),
                }
            }
            "--sync" => a.sync = true,
            "--busy" => a.busy = true,
            "--event-idx" => a.event_idx = true,
            "--stamp" => a.stamp = true,
            "--bufs" => {
                a.bufs = v()?.parse().map_err(|e| format!("--bufs: {e}"))?;
                if !(1..=QSZ).contains(&a.bufs) {
                    return Err(format!("--bufs: 1-{QSZ}"));
                }
            }
            "--tick-us" => {
                let us: u64 = v()?.parse().map_err(|e| format!("--tick-us: {e}"))?;
                if !(1..=1_000_000).contains(&us) {
                    return Err("--tick-us: 1-1000000".into());
                }
                a.tick = Duration::from_micros(us);
            }
            "-h" | "--help" => {
                println!(
                    "vhost-paced --socket PATH --rate PPS [--seconds S] [--len 60-1514] [--dst MAC] [--mac MAC] \
                     [--tick-us US] [--sync] [--event-idx] [--stamp]\n\
                     vhost-paced --socket PATH --role ping|pong [--seconds S] [--len 60-1514] [--dst MAC] \
                     [--mac MAC] [--busy]\n\
                     vhost-paced --socket PATH --role sink [--seconds S] [--mac MAC] [--event-idx] [--bufs N] \
                     [--stamp]"
                );
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.role == Role::Sink && !seconds_given {
        a.seconds = 3600.0;
    }
    if a.socket.is_empty()
        || !(60..=1514).contains(&a.len)
        || !a.seconds.is_finite()
        || a.seconds <= 0.0
    {
        return Err("need --socket, --len 60-1514 and --seconds above 0".into());
    }
    if a.role == Role::Paced && (!a.rate.is_finite() || a.rate < 0.0) {
        return Err("need a --rate of 0 (idle) or more (frames per second)".into());
    }
    if a.stamp && !matches!(a.role, Role::Paced | Role::Sink) {
        return Err("--stamp is for the paced sender and the sink".into());
    }
    Ok(a)
}

/// The front end's own memory, shared with the back end.
struct Memory {
    fd: OwnedFd,
    base: *mut u8,
}

impl Memory {
    fn new() -> Memory {
        // SAFETY: plain syscalls on a descriptor we own; the mapping lives as long as the
        // process.
        unsafe {
            let fd = libc::memfd_create(c"vhost-paced".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create");
            assert_eq!(libc::ftruncate(fd, MEM as i64), 0, "ftruncate");
            let p = libc::mmap(
                std::ptr::null_mut(),
                MEM,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "mmap");
            Memory {
                fd: OwnedFd::from_raw_fd(fd),
                base: p.cast(),
            }
        }
    }

    fn put(&self, at: u64, b: &[u8]) {
        assert!(at as usize + b.len() <= MEM);
        // SAFETY: inside our mapping.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.base.add(at as usize), b.len()) }
    }

    fn u16_at(&self, at: u64) -> u16 {
        // SAFETY: inside our mapping; the back end writes it concurrently.
        u16::from_le(unsafe { std::ptr::read_volatile(self.base.add(at as usize) as *const u16) })
    }

    fn set_u16(&self, at: u64, v: u16) {
        // SAFETY: inside our mapping.
        unsafe { std::ptr::write_volatile(self.base.add(at as usize) as *mut u16, v.to_le()) }
    }

    fn u32_at(&self, at: u64) -> u32 {
        assert!(at as usize + 4 <= MEM);
        // SAFETY: inside our mapping; the back end writes it concurrently.
        u32::from_le(unsafe { std::ptr::read_volatile(self.base.add(at as usize) as *const u32) })
    }

    /// `len` bytes at `at` (bounded by the mapping).
    fn get(&self, at: u64, len: usize) -> &[u8] {
        assert!(at as usize + len <= MEM);
        // SAFETY: inside our mapping; the back end does not write a buffer it has returned.
        unsafe { std::slice::from_raw_parts(self.base.add(at as usize), len) }
    }
}

/// A descriptor at `i` of queue `q`: buffer `addr`, `len` bytes, `flags`.
fn set_desc(m: &Memory, q: u64, i: u64, addr: u64, len: u32, flags: u16) {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    m.put(desc(q) + 16 * i, &d);
}

fn main() {
    let a = args().unwrap_or_else(|e| {
        eprintln!("vhost-paced: {e}");
        std::process::exit(2)
    });
    // SAFETY: a prctl of this process: sleeps of 20 µs, not 20 + 50.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000) };
    let m = Memory::new();
    let mut fe = Frontend::connect(&a.socket, 2).unwrap_or_else(|e| {
        eprintln!("vhost-paced: connect {}: {e}", a.socket);
        std::process::exit(1)
    });
    fe.set_owner().expect("SET_OWNER");
    let offered = fe.get_features().expect("GET_FEATURES");
    let want = F_VERSION_1 | F_PROTOCOL_FEATURES | if a.event_idx { F_EVENT_IDX } else { 0 };
    let event_idx = offered & want & F_EVENT_IDX != 0;
    fe.set_features(offered & want).expect("SET_FEATURES");
    if offered & F_PROTOCOL_FEATURES != 0 {
        fe.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
        fe.set_protocol_features(VhostUserProtocolFeatures::empty())
            .expect("SET_PROTOCOL_FEATURES");
    }
    fe.set_mem_table(&[VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: MEM as u64,
        userspace_addr: m.base as u64,
        mmap_offset: 0,
        mmap_handle: m.fd.as_raw_fd(),
    }])
    .expect("SET_MEM_TABLE");
    let kicks: Vec<EventFd> = (0..2).map(|_| EventFd::new(0).unwrap()).collect();
    let calls: Vec<EventFd> = (0..2)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    if a.role != Role::Paced {
        // Receive buffers posted before the queue starts (the sink: --bufs of them);
        // transmit interrupts off.
        let bufs = if a.role == Role::Sink {
            a.bufs
        } else {
            RX_BUFS
        };
        for i in 0..bufs as u64 {
            set_desc(&m, 0, i, RX_BUFS_AT + i * BUF, BUF as u32, DESC_F_WRITE);
            m.set_u16(avail(0) + 4 + 2 * i, i as u16);
        }
        m.set_u16(avail(0) + 2, bufs);
        m.set_u16(avail(1), AVAIL_F_NO_INTERRUPT);
    }
    for q in 0..2usize {
        fe.set_vring_num(q, QSZ).expect("SET_VRING_NUM");
        fe.set_vring_addr(
            q,
            &VringConfigData {
                queue_max_size: QSZ,
                queue_size: QSZ,
                flags: 0,
                desc_table_addr: m.base as u64 + desc(q as u64),
                used_ring_addr: m.base as u64 + used(q as u64),
                avail_ring_addr: m.base as u64 + avail(q as u64),
                log_addr: None,
            },
        )
        .expect("SET_VRING_ADDR");
        fe.set_vring_base(q, 0).expect("SET_VRING_BASE");
        fe.set_vring_call(q, &calls[q]).expect("SET_VRING_CALL");
        fe.set_vring_kick(q, &kicks[q]).expect("SET_VRING_KICK");
        if offered & F_PROTOCOL_FEATURES != 0 {
            fe.set_vring_enable(q, true).expect("SET_VRING_ENABLE");
        }
    }
    if a.role == Role::Sink {
        let _ = kicks[0].write(1);
        sink(&a, &m, &kicks[0], &calls[0], event_idx);
        drop(fe);
        return;
    }
    if a.role != Role::Paced {
        let _ = kicks[0].write(1);
        exchange(&a, &m, &kicks, &calls[0]);
        drop(fe);
        return;
    }
    let stdin = std::io::stdin();
    let mut line = String::new();
    if a.sync {
        println!("{{\"ready\": true}}");
        if stdin.lock().read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
    }

    // Every transmit descriptor i points at its own buffer, which holds a header and a frame.
    // Transmit interrupts off, as a polling driver has them: descriptors are reclaimed by
    // reading the used index (with event indices, the used event kept half the index space
    // ahead of it).
    let tx = 1u64;
    m.set_u16(avail(tx), AVAIL_F_NO_INTERRUPT);
    m.set_u16(used_event(tx), 0x8000);
    let mut frame = vec![0u8; HDR + a.len];
    frame[HDR..HDR + 6].copy_from_slice(&a.dst);
    frame[HDR + 6..HDR + 12].copy_from_slice(&a.mac);
    frame[HDR + 12..HDR + 14].copy_from_slice(match a.stamp {
        true => &ETH_STAMPED,
        false => &[0x08, 0x00],
    });
    for i in 0..QSZ as u64 {
        let at = BUFS_AT + i * BUF;
        m.put(at, &frame);
        set_desc(&m, tx, i, at, frame.len() as u32, 0);
    }

    // Post at the rate: `due` frames by now; free descriptors are those the back end has
    // returned (used index) plus those never posted.
    let (mut posted, mut backlog, mut kicked) = (0u64, 0u64, 0u64);
    let mut next_avail = 0u16;
    let start = Instant::now();
    let end = Duration::from_secs_f64(a.seconds);
    if a.rate == 0.0 {
        // An idle guest: connected, queues set up, nothing posted.
        std::thread::sleep(end);
    }
    let mut tick = start;
    loop {
        let now = Instant::now();
        let t = now - start;
        if t >= end {
            break;
        }
        let due = (t.as_secs_f64() * a.rate) as u64;
        let returned = m.u16_at(used(tx) + 2);
        let in_flight = next_avail.wrapping_sub(returned) as u64;
        if event_idx {
            m.set_u16(used_event(tx), returned.wrapping_add(0x8000));
        }
        let free = QSZ as u64 - in_flight;
        let want = due - posted - backlog;
        let n = want.min(free);
        backlog += want - n;
        if n != 0 {
            let posted_ns = if a.stamp { mono_ns() } else { 0 };
            for _ in 0..n {
                let slot = next_avail % QSZ;
                if a.stamp {
                    m.put(
                        BUFS_AT + slot as u64 * BUF + STAMP_AT,
                        &posted_ns.to_le_bytes(),
                    );
                }
                m.set_u16(avail(tx) + 4 + 2 * slot as u64, slot);
                next_avail = next_avail.wrapping_add(1);
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            m.set_u16(avail(tx) + 2, next_avail);
            posted += n;
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            if asks_kick(
                &m,
                tx,
                event_idx,
                next_avail,
                next_avail.wrapping_sub(n as u16),
            ) {
                let _ = kicks[tx as usize].write(1);
                kicked += 1;
            }
        }
        tick += a.tick;
        if let Some(d) = tick.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    let took = start.elapsed().as_secs_f64();
    // The frames still with the back end are given a moment to go.
    let settle = Instant::now();
    while m.u16_at(used(tx) + 2) != next_avail && settle.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "{{\"posted\": {posted}, \"seconds\": {took:.6}, \"backlog\": {backlog}, \"kicks\": {kicked}, \"rate\": {}}}",
        a.rate
    );
    if a.sync {
        // Connected (the back end's threads alive) until the bench has read what it needs.
        while stdin.lock().read_line(&mut line).unwrap_or(0) != 0 {}
    }
    drop(fe);
}

/// Whether the back end wants a kick for queue `q` now that its avail index went from `old`
/// to `new`: with event indices once the index passes the back end's avail event (after the
/// used ring's entries; the virtio spec's vring_need_event), else unless it said no.
fn asks_kick(m: &Memory, q: u64, event_idx: bool, new: u16, old: u16) -> bool {
    match event_idx {
        true => {
            let ev = m.u16_at(used(q) + 4 + 8 * QSZ as u64);
            new.wrapping_sub(ev).wrapping_sub(1) < new.wrapping_sub(old)
        }
        false => m_used_idx_flags(m, q) & USED_F_NO_NOTIFY == 0,
    }
}

/// `--role sink` (see the module's doc): takes and gives back receive buffers, NAPI-like,
/// until its standard input closes or `--seconds` pass.
fn sink(a: &Args, m: &Memory, kick: &EventFd, call: &EventFd, event_idx: bool) {
    use std::io::Write;
    use std::sync::atomic::{fence, Ordering};
    // Interrupts off while it takes buffers, on before it sleeps.
    let interrupts = |on: bool, seen: u16| match event_idx {
        true => m.set_u16(
            used_event(0),
            if on { seen } else { seen.wrapping_add(0x8000) },
        ),
        false => m.set_u16(avail(0), if on { 0 } else { AVAIL_F_NO_INTERRUPT }),
    };
    let (mut seen, mut next) = (0u16, a.bufs);
    let (mut frames, mut bytes) = (0u64, 0u64);
    let mut delays = a.stamp.then(Delays::new);
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{{\"ready\": true}}").and_then(|_| out.flush());
    let mut line = [0u8; 256];
    loop {
        let idx = m_used_idx(m, 0);
        if idx != seen {
            fence(Ordering::Acquire);
            let n = idx.wrapping_sub(seen);
            let now = delays.as_ref().map_or(0, |_| mono_ns());
            for k in 0..n {
                let at = used(0) + 4 + 8 * (seen.wrapping_add(k) % QSZ) as u64;
                // The back end's word for which buffer it used: ours are 0..QSZ, and a
                // wrong id only puts one buffer twice on the ring (the back end's fault to
                // see).
                let id = (m.u32_at(at) % QSZ as u32) as u16;
                let len = m.u32_at(at + 4) as u64;
                bytes += len.saturating_sub(HDR as u64);
                if let Some(d) = delays.as_mut() {
                    let buf = m.get(RX_BUFS_AT + id as u64 * BUF, BUF as usize);
                    d.frame(&buf[..(len as usize).min(buf.len())], now);
                }
                m.set_u16(avail(0) + 4 + 2 * (next.wrapping_add(k) % QSZ) as u64, id);
            }
            seen = idx;
            frames += n as u64;
            let old = next;
            next = next.wrapping_add(n);
            fence(Ordering::Release);
            m.set_u16(avail(0) + 2, next);
            fence(Ordering::SeqCst);
            if asks_kick(m, 0, event_idx, next, old) {
                let _ = kick.write(1);
            }
            continue;
        }
        interrupts(true, seen);
        fence(Ordering::SeqCst);
        if m_used_idx(m, 0) != seen {
            interrupts(false, seen);
            continue;
        }
        let now = Instant::now();
        if now >= end {
            break;
        }
        let mut p = [
            libc::pollfd {
                fd: call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = (end - now).as_millis().clamp(1, 1000) as i32;
        // SAFETY: two pollfds of ours.
        unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
        if p[0].revents != 0 {
            let _ = call.read();
        }
        if p[1].revents != 0 {
            // SAFETY: reads into our buffer, at most its length.
            let got = unsafe { libc::read(0, line.as_mut_ptr().cast(), line.len()) };
            if got <= 0 {
                break;
            }
            for _ in line[..got as usize].iter().filter(|&&b| b == b'\n') {
                let delay = match delays.as_mut() {
                    Some(d) => format!(", \"delay_us\": {}", d.take()),
                    None => String::new(),
                };
                let _ = writeln!(out, "{{\"rx\": {frames}, \"bytes\": {bytes}{delay}}}")
                    .and_then(|_| out.flush());
            }
        }
        interrupts(false, seen);
    }
}

/// CLOCK_MONOTONIC in ns: the clock `--stamp`'s sender and sink share.
fn mono_ns() -> u64 {
    vale_abi::clock::ns(libc::CLOCK_MONOTONIC)
}

/// The sink's count of stamped frames' delays (`--stamp`), since its last answer.
struct Delays {
    steps: Vec<u32>,
    samples: u64,
    max_ns: u64,
}

impl Delays {
    fn new() -> Delays {
        Delays {
            steps: vec![0; DELAY_STEPS],
            samples: 0,
            max_ns: 0,
        }
    }

    /// A frame of `b` (virtio-net header first) taken at `now`: its delay counted if it is
    /// stamped (a frame from elsewhere, or a time after `now`, is not).
    fn frame(&mut self, b: &[u8], now: u64) {
        let at = STAMP_AT as usize;
        if b.len() < at + 8 || b[HDR + 12..HDR + 14] != ETH_STAMPED {
            return;
        }
        let posted = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let Some(ns) = now.checked_sub(posted) else {
            return;
        };
        let step = ((ns / DELAY_STEP_NS) as usize).min(DELAY_STEPS - 1);
        self.steps[step] += 1;
        self.samples += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    /// The delays counted so far as JSON (µs), and a fresh count.
    fn take(&mut self) -> String {
        let at = |q: f64| {
            let want = ((self.samples as f64 * q).ceil() as u64).max(1);
            let mut sum = 0u64;
            for (k, &c) in self.steps.iter().enumerate() {
                sum += c as u64;
                if sum >= want {
                    // The step's middle.
                    return (k as f64 + 0.5) * DELAY_STEP_NS as f64 / 1000.0;
                }
            }
            0.0
        };
        let s = match self.samples {
            0 => "{\"samples\": 0}".to_string(),
            n => format!(
                "{{\"samples\": {n}, \"median\": {:.1}, \"p99\": {:.1}, \"max\": {:.1}}}",
                at(0.5),
                at(0.99),
                self.max_ns as f64 / 1000.0
            ),
        };
        self.steps.fill(0);
        (self.samples, self.max_ns) = (0, 0);
        s
    }
}

/// The receive side of ping and pong: queue 0's buffers, its used index seen so far, and the
/// next free slot of its avail ring.
struct Rx<'a> {
    m: &'a Memory,
    call: &'a EventFd,
    kick: &'a EventFd,
    busy: bool,
    seen: u16,
    avail: u16,
}

impl<'a> Rx<'a> {
    /// The next received frame (without its virtio-net header) as (descriptor, frame), waiting
    /// until `deadline`; None when none came. Give the descriptor back with `give`.
    fn next(&mut self, deadline: Instant) -> Option<(u16, &'a [u8])> {
        loop {
            if m_used_idx(self.m, 0) != self.seen {
                let at = used(0) + 4 + 8 * (self.seen % QSZ) as u64;
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                let (id, len) = (self.m.u32_at(at), self.m.u32_at(at + 4) as usize);
                self.seen = self.seen.wrapping_add(1);
                let id = id as u16;
                if id >= RX_BUFS || !(HDR..=BUF as usize).contains(&len) {
                    // Not ours or not a frame: give it back and go on.
                    self.give(id % RX_BUFS);
                    continue;
                }
                return Some((
                    id,
                    self.m
                        .get(RX_BUFS_AT + id as u64 * BUF + HDR as u64, len - HDR),
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if self.busy {
                std::hint::spin_loop();
                continue;
            }
            // Cleared first, then the index looked at again: a frame used after that look
            // comes with a signal that wakes the poll.
            let _ = self.call.read();
            if m_used_idx(self.m, 0) != self.seen {
                continue;
            }
            let mut p = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = (deadline - now).as_millis().clamp(1, 100) as i32;
            // SAFETY: one pollfd of ours.
            unsafe { libc::poll(&mut p, 1, ms) };
        }
    }

    /// Puts receive descriptor `id` back on the avail ring.
    fn give(&mut self, id: u16) {
        self.m
            .set_u16(avail(0) + 4 + 2 * (self.avail % QSZ) as u64, id);
        self.avail = self.avail.wrapping_add(1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.m.set_u16(avail(0) + 2, self.avail);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if m_used_idx_flags(self.m, 0) & USED_F_NO_NOTIFY == 0 {
            let _ = self.kick.write(1);
        }
    }
}

fn m_used_idx(m: &Memory, q: u64) -> u16 {
    m.u16_at(used(q) + 2)
}

fn m_used_idx_flags(m: &Memory, q: u64) -> u16 {
    m.u16_at(used(q))
}

/// The transmit side of ping and pong: one frame at a time from slot `next % QSZ`.
struct Tx<'a> {
    m: &'a Memory,
    kick: &'a EventFd,
    next: u16,
}

impl Tx<'_> {
    /// Posts `frame` (header prepended); false when every descriptor is still with the back end.
    fn send(&mut self, frame: &[u8]) -> bool {
        if self.next.wrapping_sub(m_used_idx(self.m, 1)) >= QSZ {
            return false;
        }
        let slot = (self.next % QSZ) as u64;
        let at = BUFS_AT + slot * BUF;
        self.m.put(at, &[0u8; HDR]);
        self.m.put(at + HDR as u64, frame);
        set_desc(self.m, 1, slot, at, (HDR + frame.len()) as u32, 0);
        self.m.set_u16(avail(1) + 4 + 2 * slot, slot as u16);
        self.next = self.next.wrapping_add(1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.m.set_u16(avail(1) + 2, self.next);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if m_used_idx_flags(self.m, 1) & USED_F_NO_NOTIFY == 0 {
            let _ = self.kick.write(1);
        }
        true
    }
}

/// ping or pong (see the module's doc), on queues set up with receive buffers.
fn exchange(a: &Args, m: &Memory, kicks: &[EventFd], call: &EventFd) {
    let mut rx = Rx {
        m,
        call,
        kick: &kicks[0],
        busy: a.busy,
        seen: 0,
        avail: RX_BUFS,
    };
    let mut tx = Tx {
        m,
        kick: &kicks[1],
        next: 0,
    };
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut out = vec![0u8; 1514];
    if a.role == Role::Pong {
        while let Some((id, f)) = rx.next(end) {
            let n = f.len().min(out.len());
            out[..n].copy_from_slice(&f[..n]);
            rx.give(id);
            if n < 14 {
                continue;
            }
            out.copy_within(6..12, 0);
            out[6..12].copy_from_slice(&a.mac);
            let _ = tx.send(&out[..n]);
        }
        return;
    }
    let mut frame = vec![0u8; a.len];
    frame[..6].copy_from_slice(&a.dst);
    frame[6..12].copy_from_slice(&a.mac);
    frame[12..14].copy_from_slice(&ETH_PINGPONG);
    let mut rtts: Vec<f64> = Vec::with_capacity(1 << 16);
    let (mut seq, mut lost) = (0u64, 0u64);
    // Warm-up: requests every 100 ms until one is echoed (the far end may still be setting
    // up), for at most WARM_LIMIT; the measured seconds start after it.
    let warm_end = Instant::now() + WARM_LIMIT;
    let mut echoed = false;
    while !echoed && Instant::now() < warm_end {
        seq += 1;
        frame[14..22].copy_from_slice(&seq.to_le_bytes());
        if !tx.send(&frame) {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let limit = Instant::now() + Duration::from_millis(100);
        while let Some((id, f)) = rx.next(limit) {
            echoed |= f.len() >= 22 && f[12..14] == ETH_PINGPONG && f[14..22] == seq.to_le_bytes();
            rx.give(id);
            if echoed {
                break;
            }
        }
    }
    if !echoed {
        eprintln!(
            "vhost-paced ping: no echo in {} s of warm-up",
            WARM_LIMIT.as_secs()
        );
        std::process::exit(1);
    }
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    while Instant::now() < end && rtts.len() < MAX_SAMPLES {
        seq += 1;
        frame[14..22].copy_from_slice(&seq.to_le_bytes());
        let t0 = Instant::now();
        if !tx.send(&frame) {
            lost += 1;
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let limit = t0 + ECHO_LIMIT;
        loop {
            let Some((id, f)) = rx.next(limit) else {
                lost += 1;
                break;
            };
            let ours = f.len() >= 22 && f[12..14] == ETH_PINGPONG && f[14..22] == seq.to_le_bytes();
            rx.give(id);
            if ours {
                rtts.push(t0.elapsed().as_secs_f64() * 1e6);
                break;
            }
        }
    }
    if rtts.is_empty() {
        eprintln!(
            "vhost-paced ping: no echo in {} s ({lost} requests lost)",
            a.seconds
        );
        std::process::exit(1);
    }
    println!("{}", vale_tests::rtt_report(&mut rtts, lost));
}

//! A vhost-user front end that sends at a fixed rate: the offered load of bench/vhost_user.py's
//! `--loads` runs, the same for vale's vhost-user ports and for DPDK's vhost PMD.
//!
//! It connects to a vhost-user back end listening at `--socket`, shares 8 MiB of its own
//! memory, sets up queue pair 0 (receive queue without buffers: it only sends) and posts
//! `--len`-byte frames to `--dst` on the transmit queue at `--rate` frames per second for
//! `--seconds`, in bursts every 20 µs, reusing descriptors as the back end returns them. A
//! frame it cannot post because all descriptors are still with the back end is not sent
//! (counted as `backlog`: the back end did not keep up). Prints one JSON line: frames posted,
//! the seconds it took, and the backlog. With `--rate 0` it posts nothing: a connected guest
//! whose driver is idle for `--seconds` (bench/vhost_many.py's idle ports). `--tick-us` sets
//! the time between bursts (many senders at low rates: fewer wake-ups each).
//!
//!     vhost-paced --socket PATH --rate PPS [--seconds 2] [--len 60] [--dst MAC] [--src MAC]
//!                 [--tick-us 20]

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
const F_VERSION_1: u64 = 1 << 32;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const USED_F_NO_NOTIFY: u16 = 1;

fn desc(q: u64) -> u64 {
    q * 0x10000
}
fn avail(q: u64) -> u64 {
    desc(q) + 0x4000
}
fn used(q: u64) -> u64 {
    desc(q) + 0x8000
}

struct Args {
    socket: String,
    rate: f64,
    seconds: f64,
    len: usize,
    dst: [u8; 6],
    src: [u8; 6],
    tick: Duration,
}

fn mac(k: &str, s: &str) -> Result<[u8; 6], String> {
    let b: Vec<u8> = s
        .split(':')
        .map(|x| u8::from_str_radix(x, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{k} {s}: {e}"))?;
    b.try_into().map_err(|_| format!("{k} {s}: not a MAC"))
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        socket: String::new(),
        rate: 0.0,
        seconds: 2.0,
        len: 60,
        dst: [2, 0, 0, 0, 0x0e, 2],
        src: [2, 0, 0, 0, 0x0e, 1],
        tick: Duration::from_micros(20),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--socket" => a.socket = v()?,
            "--rate" => a.rate = v()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--seconds" => a.seconds = v()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--len" => a.len = v()?.parse().map_err(|e| format!("--len: {e}"))?,
            "--dst" => a.dst = mac(&k, &v()?)?,
            "--src" => a.src = mac(&k, &v()?)?,
            "--tick-us" => {
                let us: u64 = v()?.parse().map_err(|e| format!("--tick-us: {e}"))?;
                if !(1..=1_000_000).contains(&us) {
                    return Err("--tick-us: 1-1000000".into());
                }
                a.tick = Duration::from_micros(us);
            }
            "-h" | "--help" => {
                println!(
                    "vhost-paced --socket PATH --rate PPS [--seconds S] [--len 60-1514] [--dst MAC] \
                     [--src MAC] [--tick-us US]"
                );
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.socket.is_empty() || !a.rate.is_finite() || a.rate < 0.0 || !(60..=1514).contains(&a.len) {
        return Err("need --socket, a --rate of 0 or more and --len 60-1514".into());
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
    fe.set_features(offered & (F_VERSION_1 | F_PROTOCOL_FEATURES))
        .expect("SET_FEATURES");
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
    let calls: Vec<EventFd> = (0..2).map(|_| EventFd::new(0).unwrap()).collect();
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

    // Every transmit descriptor i points at its own buffer, which holds a header and a frame.
    let tx = 1u64;
    let mut frame = vec![0u8; HDR + a.len];
    frame[HDR..HDR + 6].copy_from_slice(&a.dst);
    frame[HDR + 6..HDR + 12].copy_from_slice(&a.src);
    frame[HDR + 12..HDR + 14].copy_from_slice(&[0x08, 0x00]);
    for i in 0..QSZ as u64 {
        let at = BUFS_AT + i * BUF;
        m.put(at, &frame);
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&at.to_le_bytes());
        d[8..12].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        m.put(desc(tx) + 16 * i, &d);
    }

    // Post at the rate: `due` frames by now; free descriptors are those the back end has
    // returned (used index) plus those never posted.
    let (mut posted, mut backlog) = (0u64, 0u64);
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
        let in_flight = next_avail.wrapping_sub(m.u16_at(used(tx) + 2)) as u64;
        let free = QSZ as u64 - in_flight;
        let want = due - posted - backlog;
        let n = want.min(free);
        backlog += want - n;
        if n != 0 {
            for _ in 0..n {
                let slot = next_avail % QSZ;
                m.set_u16(avail(tx) + 4 + 2 * slot as u64, slot);
                next_avail = next_avail.wrapping_add(1);
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            m.set_u16(avail(tx) + 2, next_avail);
            posted += n;
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            if m.u16_at(used(tx)) & USED_F_NO_NOTIFY == 0 {
                let _ = kicks[tx as usize].write(1);
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
        "{{\"posted\": {posted}, \"seconds\": {took:.6}, \"backlog\": {backlog}, \"rate\": {}}}",
        a.rate
    );
}

//! UDP request/response between two processes: the kernel's peer of vale's ping-pong
//! (bench/latency.py's "like with like" tables).
//!
//! `pong` answers every datagram it receives on `--bind` with the same bytes, to its sender,
//! until `--seconds` pass without one. `ping` sends a datagram to `--to`, waits for its echo
//! (matched by a sequence number) and sends the next, for `--seconds`; the datagram's payload
//! is `--len` minus 42 bytes (Ethernet, IPv4 and UDP headers), so the frame on the wire is
//! `--len` bytes, as vale-pktgen's `-l`. Both sleep in recv(2) between datagrams, as two
//! processes on a host do. ping prints one JSON line with the round-trip times in microseconds:
//! `samples`, `min_us`, `median_us`, `p99_us`, `max_us`, `lost` (requests without an echo
//! within a second).
//!
//!     udp-pingpong pong --bind IP:PORT [--seconds 10]
//!     udp-pingpong ping --to IP:PORT [--len 60] [--seconds 2]

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// At most this many round trips are kept (memory bound of a long run).
const MAX_SAMPLES: usize = 8 << 20;
/// How long ping waits for an echo before it counts the request lost.
const ECHO_LIMIT: Duration = Duration::from_secs(1);
/// Ethernet (14), IPv4 (20) and UDP (8) headers: a frame of `--len` bytes carries `--len` - 42.
const HEADERS: usize = 42;

struct Args {
    role: String,
    addr: Option<SocketAddr>,
    len: usize,
    seconds: f64,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let role = it.next().unwrap_or_default();
    if role == "-h" || role == "--help" {
        println!("udp-pingpong pong --bind IP:PORT [--seconds S]\nudp-pingpong ping --to IP:PORT [--len 60-1514] [--seconds S]");
        std::process::exit(0);
    }
    if role != "ping" && role != "pong" {
        return Err(format!("first argument {role:?}: not ping or pong"));
    }
    let mut a = Args {
        seconds: if role == "pong" { 10.0 } else { 2.0 },
        role,
        addr: None,
        len: 60,
    };
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--bind" | "--to" => a.addr = Some(v()?.parse().map_err(|e| format!("{k}: {e}"))?),
            "--len" => a.len = v()?.parse().map_err(|e| format!("--len: {e}"))?,
            "--seconds" => a.seconds = v()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.addr.is_none() || !(60..=1514).contains(&a.len) || a.seconds <= 0.0 {
        return Err("need --bind or --to, --len 60-1514 and --seconds above 0".into());
    }
    Ok(a)
}

fn fail(what: &str, e: std::io::Error) -> ! {
    eprintln!("udp-pingpong: {what}: {e}");
    std::process::exit(1)
}

fn main() {
    let a = args().unwrap_or_else(|e| {
        eprintln!("udp-pingpong: {e}");
        std::process::exit(2)
    });
    let addr = a.addr.expect("checked in args");
    let mut buf = vec![0u8; 2048];
    if a.role == "pong" {
        let s = UdpSocket::bind(addr).unwrap_or_else(|e| fail(&format!("bind {addr}"), e));
        s.set_read_timeout(Some(Duration::from_secs_f64(a.seconds)))
            .unwrap_or_else(|e| fail("SO_RCVTIMEO", e));
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], from);
        }
        return;
    }
    let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap_or_else(|e| fail("bind", e));
    s.connect(addr)
        .unwrap_or_else(|e| fail(&format!("connect {addr}"), e));
    s.set_read_timeout(Some(ECHO_LIMIT))
        .unwrap_or_else(|e| fail("SO_RCVTIMEO", e));
    let mut req = vec![0u8; a.len - HEADERS];
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut rtts: Vec<f64> = Vec::with_capacity(1 << 16);
    let (mut seq, mut lost) = (0u64, 0u64);
    while Instant::now() < end && rtts.len() < MAX_SAMPLES {
        seq += 1;
        req[..8].copy_from_slice(&seq.to_le_bytes());
        let t0 = Instant::now();
        if let Err(e) = s.send(&req) {
            // No neighbour yet (ARP) or a full queue: counted, tried again.
            lost += 1;
            if lost > 1000 {
                fail(&format!("send to {addr}"), e);
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        loop {
            match s.recv(&mut buf) {
                Ok(n) if n >= 8 && buf[..8] == seq.to_le_bytes() => {
                    rtts.push(t0.elapsed().as_secs_f64() * 1e6);
                    break;
                }
                Ok(_) => continue,
                Err(_) => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    if rtts.is_empty() {
        eprintln!("udp-pingpong ping: no echo from {addr} in {} s", a.seconds);
        std::process::exit(1);
    }
    println!("{}", vale_tests::rtt_report(&mut rtts, lost));
}

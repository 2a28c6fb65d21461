//! Ping-pong through valed with both ends in one busy-waiting thread.
//!
//!     busy_pingpong [SECONDS] [FRAME_LEN]      (VALE_RUN_DIR names valed's run directory)
//!
//! Opens `valepp:a` and `valepp:b`, both in busy-wait mode, and for SECONDS (default 2)
//! sends a frame from a, spins until it arrives at b, echoes it from b, and spins until the
//! echo is back at a. It prints the round-trip times (min, median, 99th percentile, max, in
//! µs) as one JSON object, with the waits that slept because the CPU was crowded
//! (`crowded_waits`, see `vale::Spinner`).
//!
//! The path of every round trip is that of `vale-pktgen -f ping --busy` and `-f pong --busy`
//! on cores of their own: client, valed, client, valed, client, with nobody sleeping and no
//! system call. Here one thread plays both clients, one after the other, as they would take
//! turns anyway; so with valed busy-polling on a second CPU, two CPUs measure what three busy
//! parties would need three for. (What it does not have: two client cores' caches; the
//! shared rings move between valed's core and one other instead of two.)

use std::time::{Duration, Instant};

use vale::{Events, Port, Wait};

/// Queues `frame` on `port`'s tx ring 0 and publishes it.
fn send(port: &Port, frame: &[u8]) -> std::io::Result<()> {
    let mut ring = port.tx_ring(0);
    while ring.space() == 0 {
        port.poll(Events::WRITABLE, Some(Duration::from_secs(1)))?;
    }
    let cur = ring.cur();
    let (slot, buf) = ring.slot_and_buf(cur);
    buf[..frame.len()].copy_from_slice(frame);
    slot.len = frame.len() as u16;
    slot.flags = 0;
    ring.advance(1);
    port.txsync(0)
}

/// Spins until a frame is on `port`'s rx ring 0, copies it into `out` and releases it.
fn recv(port: &Port, out: &mut Vec<u8>) -> std::io::Result<()> {
    let mut ring = port.rx_ring(0);
    loop {
        port.rxsync(0)?;
        if !ring.is_empty() {
            break;
        }
        if port.poll(Events::READABLE, Some(Duration::from_secs(1)))? == Events::default() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{}: nothing arrived within a second", port.name()),
            ));
        }
    }
    let slot = ring.slot(ring.cur());
    out.clear();
    out.extend_from_slice(&ring.buf(slot.buf_idx)[..slot.len as usize]);
    ring.advance(1);
    port.rxsync(0)
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map_or(2.0, |s| s.parse().expect("SECONDS"));
    let len: usize = args.next().map_or(60, |s| s.parse().expect("FRAME_LEN"));
    assert!((60..=2048).contains(&len), "FRAME_LEN: 60..2048");
    let a = Port::open("valepp:a")?;
    let b = Port::open("valepp:b")?;
    a.set_wait(Wait::Busy);
    b.set_wait(Wait::Busy);
    // Broadcast from distinct sources: with two ports on the switch, each frame goes to the
    // other one only.
    let mut ping = vec![0u8; len];
    ping[..6].fill(0xff);
    ping[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xa]);
    ping[12..14].copy_from_slice(&[0x88, 0xb5]);
    let mut echo = Vec::with_capacity(len);
    let mut back = Vec::with_capacity(len);
    let mut rtt = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut seq = 0u64;
    while Instant::now() < end {
        seq += 1;
        ping[14..22].copy_from_slice(&seq.to_le_bytes());
        let t0 = Instant::now();
        send(&a, &ping)?;
        recv(&b, &mut echo)?;
        echo[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xb]);
        send(&b, &echo)?;
        recv(&a, &mut back)?;
        rtt.push(t0.elapsed().as_nanos() as u64);
        assert_eq!(back[14..22], seq.to_le_bytes(), "echo of ping {seq}");
    }
    rtt.sort_unstable();
    let at = |q: f64| rtt[((rtt.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    println!(
        "{{\"samples\":{},\"min_us\":{:.3},\"median_us\":{:.3},\"p99_us\":{:.3},\"max_us\":{:.3},\
         \"crowded_waits\":{}}}",
        rtt.len(),
        at(0.0),
        at(0.5),
        at(0.99),
        at(1.0),
        a.crowded_waits() + b.crowded_waits()
    );
    Ok(())
}

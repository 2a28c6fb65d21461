//! Periodic and final reports.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Running totals and the once-a-second line on stderr.
pub struct Meter {
    start: Instant,
    last: Instant,
    last_packets: u64,
    last_bytes: u64,
    pub packets: u64,
    pub bytes: u64,
    /// When traffic was first and last seen (receivers time their run by these).
    first_seen: Option<Instant>,
    last_seen: Option<Instant>,
    quiet: bool,
}

pub fn rate(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.2} G", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2} M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.2} K", n / 1e3)
    } else {
        format!("{n:.0} ")
    }
}

impl Meter {
    pub fn new(quiet: bool) -> Meter {
        let now = Instant::now();
        Meter {
            start: now,
            last: now,
            last_packets: 0,
            last_bytes: 0,
            packets: 0,
            bytes: 0,
            first_seen: None,
            last_seen: None,
            quiet,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Notes that traffic arrived now.
    pub fn seen(&mut self, now: Instant) {
        self.first_seen.get_or_insert(now);
        self.last_seen = Some(now);
    }

    /// From the first to the last arrival: a receiver's rate is not diluted by the time it
    /// waited before the sender started or after it stopped.
    pub fn active(&self) -> Duration {
        match (self.first_seen, self.last_seen) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => self.elapsed(),
        }
    }

    /// Prints a line when a second has passed since the last one.
    pub fn tick(&mut self, now: Instant) {
        let dt = now - self.last;
        if dt < Duration::from_secs(1) {
            return;
        }
        let s = dt.as_secs_f64();
        let pps = (self.packets - self.last_packets) as f64 / s;
        let bps = (self.bytes - self.last_bytes) as f64 * 8.0 / s;
        if !self.quiet {
            eprintln!(
                "vale-pktgen: {:7.3}s {}pps {}bps (total {} packets)",
                (now - self.start).as_secs_f64(),
                rate(pps),
                rate(bps),
                self.packets
            );
        }
        self.last = now;
        self.last_packets = self.packets;
        self.last_bytes = self.bytes;
    }
}

#[derive(Serialize, Debug, Default)]
pub struct Rtt {
    pub samples: usize,
    pub min_us: f64,
    pub median_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Rtt {
    pub fn from_ns(mut v: Vec<u64>) -> Option<Rtt> {
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
        Some(Rtt {
            samples: v.len(),
            min_us: at(0.0),
            median_us: at(0.5),
            p99_us: at(0.99),
            max_us: at(1.0),
        })
    }
}

#[derive(Serialize, Debug)]
pub struct Final {
    pub mode: String,
    pub port: String,
    pub frame_len: usize,
    pub packets: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub pps: f64,
    pub bps: f64,
    /// Frames valed dropped for this port during the run: toward it (rx, ping, pong) or from
    /// it (tx: no destination, or refused as bad input).
    pub drops: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtt: Option<Rtt>,
    /// With --busy: the waits that slept instead of spinning because the CPU was crowded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crowded_waits: Option<u64>,
}

impl Final {
    pub fn print(&self, json: bool) {
        if json {
            println!("{}", serde_json::to_string(self).expect("serialisable"));
            return;
        }
        println!(
            "{} on {}: {} packets, {} bytes in {:.3} s: {}pps {}bps, {} dropped",
            self.mode,
            self.port,
            self.packets,
            self.bytes,
            self.seconds,
            rate(self.pps),
            rate(self.bps),
            self.drops
        );
        if let Some(r) = &self.rtt {
            println!(
                "rtt over {} samples: min {:.1} us, median {:.1} us, p99 {:.1} us, max {:.1} us",
                r.samples, r.min_us, r.median_us, r.p99_us, r.max_us
            );
        }
        if let Some(n) = self.crowded_waits.filter(|&n| n != 0) {
            println!("{n} busy waits slept: others kept the CPU");
        }
    }
}

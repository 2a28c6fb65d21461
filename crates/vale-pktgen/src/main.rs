//! vale-pktgen: send, receive, or ping-pong frames through a vale port (the role of netmap's
//! pkt-gen).

mod frame;
mod report;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use vale::{Events, OpenOptions, Port, Spinner, Wait, NS_MOREFRAG};

use report::{Final, Meter, Rtt};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Function {
    /// Send frames as fast as the ring (or --rate) allows
    Tx,
    /// Count received frames
    Rx,
    /// Send one frame at a time and time its echo (run `pong` on another port)
    Ping,
    /// Echo every received frame back to its sender
    Pong,
}

/// Traffic source, sink and latency meter for vale ports.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "Traffic source, sink and latency meter for vale ports",
    long_about = "vale-pktgen opens a port of a vale switch (creating the switch and port, and \
starting valed if none runs) and sends, receives or ping-pongs frames through it with no \
system call per packet. It prints a line a second on stderr and a final report on stdout: \
packets, bytes, rate in packets and bits per second, the frames valed dropped for this port, \
and for ping the round-trip time (min, median, 99th percentile, max).\n\n\
Frames are Ethernet + IPv4 + UDP of exactly --len bytes (no FCS); bit rates count those \
bytes. Frames longer than a buffer travel as chains of slots marked NS_MOREFRAG.",
    after_help = "EXAMPLES:\n  vale-pktgen -i vale0:b -f rx &\n  vale-pktgen -i vale0:a -f tx -l 60 -T 5\n  \
vale-pktgen -i vale0:a -f tx -l 1514 -R 1000000 -n 5000000 -D 02:00:00:00:00:0b\n  \
vale-pktgen -i vale0:b -f rx -b 64 --announce -S 02:00:00:00:00:0b &   (learnt: unicast, no flood)\n  \
vale-pktgen -i vale0:p -f pong &\n  vale-pktgen -i vale0:q -f ping -n 10000 --json\n  \
taskset -c 1 valed --busy-poll-us 50 &   (each party on a CPU of its own: nobody ever sleeps)\n  \
taskset -c 2 vale-pktgen -i vale0:p -f pong --busy &\n  \
taskset -c 3 vale-pktgen -i vale0:q -f ping --busy -T 5\n\n\
STOPPING:\n  After --count packets, after --duration seconds, or on SIGINT/SIGTERM; each prints the final report.\n  \
On SIGINT/SIGTERM, -f rx first counts the frames already waiting on its rings.\n\n\
EXIT STATUS:\n  0 on success, 1 on an error (port cannot be opened, valed went away), 2 on bad usage.\n\n\
ENVIRONMENT:\n  VALE_RUN_DIR        valed's run directory (default /run/vale)\n  \
VALE_NO_AUTOSTART   set to 1 to fail instead of starting valed"
)]
struct Args {
    /// Port to open, valeX:Y
    #[arg(short = 'i', long = "port", value_name = "PORT")]
    port: String,
    /// What to do
    #[arg(short = 'f', long = "function", value_enum)]
    function: Function,
    /// Frame length in bytes, Ethernet header included, FCS excluded (60-9000)
    #[arg(short = 'l', long = "len", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(60..=9000))]
    len: u32,
    /// Frames handled per ring sync: at most this many are queued (tx) or read and released
    /// (rx, pong) before each txsync/rxsync (1-4096)
    #[arg(short = 'b', long = "batch", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch: u32,
    /// Send at most this many frames per second (tx, ping); 0 = no limit
    #[arg(short = 'R', long = "rate", default_value_t = 0, value_name = "PPS")]
    rate: u64,
    /// Spread frames over this many flows (tx), one frame each in turn (1-65536); --vary
    /// says what tells them apart
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    flows: u32,
    /// What differs between the --flows: the UDP source port (1024, 1025, ...) or the IPv4
    /// source address (10.0.0.1, 10.0.0.2, ...; the header checksum follows)
    #[arg(long, value_enum, default_value_t = frame::Vary::Sport, value_name = "FIELD")]
    vary: frame::Vary,
    /// Stop after this many frames (sent for tx and ping, received for rx and pong); 0 = no limit
    #[arg(short = 'n', long = "count", default_value_t = 0)]
    count: u64,
    /// Stop after this many seconds; 0 = no limit
    #[arg(
        short = 'T',
        long = "duration",
        default_value_t = 0.0,
        value_name = "SECONDS"
    )]
    duration: f64,
    /// Source MAC address (default: derived from the port name)
    #[arg(short = 'S', long = "src-mac", value_name = "MAC")]
    src_mac: Option<String>,
    /// Destination MAC address
    #[arg(
        short = 'D',
        long = "dst-mac",
        value_name = "MAC",
        default_value = "ff:ff:ff:ff:ff:ff"
    )]
    dst_mac: String,
    /// First send one broadcast frame from the source MAC, so that a learning switch learns
    /// this port and forwards unicast to it instead of flooding (-f rx and -f pong only: they
    /// never send otherwise)
    #[arg(long)]
    announce: bool,
    /// Busy-wait instead of sleeping (=US: spin at most US microseconds per wait, then sleep)
    ///
    /// Whenever it waits (for frames, for room on the tx ring, for the next --rate slot)
    /// vale-pktgen spins on the ring indices valed writes in shared
    /// memory, and tells valed not to interrupt it, so waiting costs no wake-up and no
    /// system call but a look, about once a millisecond, at whether valed is still there.
    /// With =US it spins at most US microseconds per wait and then sleeps as
    /// without --busy; plain --busy (or --busy=0) never sleeps and keeps a CPU 100% busy for
    /// the whole run, so give it a CPU of its own (taskset). On a CPU that other tasks want
    /// it gives way: it yields the CPU between looks (a partner on the same CPU runs at once),
    /// and while others keep the CPU it sleeps instead for a while (the report's
    /// crowded_waits counts those waits). Meant for -f ping and -f pong
    /// with valed --busy-poll-us, where no party sleeps and no kick or interrupt is needed
    /// per round trip; against a valed that sleeps it still works (vale-pktgen kicks valed when
    /// valed asks for it) and saves only its own wake-ups. A valed that goes away is noticed
    /// within about a millisecond, as without --busy
    #[arg(long, value_name = "US", num_args = 0..=1, require_equals = true,
          default_missing_value = "0")]
    busy: Option<u64>,
    /// Print the final report as one JSON object
    #[arg(long)]
    json: bool,
    /// No line a second on stderr
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Tx rings of the port (1-16)
    #[arg(long, default_value_t = 1)]
    tx_rings: u32,
    /// Rx rings of the port (1-16)
    #[arg(long, default_value_t = 1)]
    rx_rings: u32,
    /// Slots per ring (power of two, 64-4096)
    #[arg(long, default_value_t = 1024)]
    slots: u32,
    /// Buffer size in bytes (multiple of 64, 128-16384)
    #[arg(long, default_value_t = vale::DEFAULT_BUF_SIZE)]
    buf_size: u32,
    /// valed's run directory [env: VALE_RUN_DIR] [default: /run/vale]
    #[arg(long, value_name = "DIR")]
    run_dir: Option<std::path::PathBuf>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Relaxed);
}

fn main() {
    vale_man::write_if_asked("1", <Args as clap::CommandFactory>::command);
    if let Err(e) = run() {
        eprintln!("vale-pktgen: {e:#}");
        std::process::exit(1);
    }
}

/// When to stop.
struct Limits {
    count: u64,
    deadline: Option<Instant>,
}

impl Limits {
    fn done(&self, packets: u64, now: Instant) -> bool {
        STOP.load(Relaxed)
            || (self.count != 0 && packets >= self.count)
            || self.deadline.is_some_and(|d| now >= d)
    }

    /// How long a wait may last.
    fn wait(&self, now: Instant) -> Duration {
        let cap = Duration::from_millis(100);
        self.deadline
            .map_or(cap, |d| d.saturating_duration_since(now).min(cap))
    }
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut opts = OpenOptions::new();
    opts.rings(args.tx_rings, args.rx_rings)
        .slots(args.slots)
        .buf_size(args.buf_size);
    if let Some(d) = &args.run_dir {
        opts.run_dir(d);
    }
    let src = match &args.src_mac {
        Some(m) => frame::parse_mac(m)?,
        None => frame::mac_for(&args.port),
    };
    let dst = frame::parse_mac(&args.dst_mac)?;
    if !(args.duration >= 0.0 && args.duration.is_finite()) {
        bail!("bad --duration {}", args.duration);
    }
    if args.announce && !matches!(args.function, Function::Rx | Function::Pong) {
        bail!("--announce is for -f rx and -f pong");
    }
    let port = opts
        .open(&args.port)
        .with_context(|| format!("cannot open {}", args.port))?;
    port.set_wait(match args.busy {
        None => Wait::Sleep,
        Some(0) => Wait::Busy,
        Some(us) => Wait::BusyFor(Duration::from_micros(us)),
    });
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let limits = Limits {
        count: args.count,
        deadline: (args.duration > 0.0)
            .then(|| Instant::now() + Duration::from_secs_f64(args.duration)),
    };
    let before = port.counters().unwrap_or_default();
    let frame = frame::build(args.len as usize, src, dst);
    if args.announce {
        announce(&port, src)?;
    }
    let mut meter = Meter::new(args.quiet || args.json);
    let mut rtt = None;
    let mut lost = 0;
    match args.function {
        Function::Tx => tx(&port, &args, &frame, &limits, &mut meter)?,
        Function::Rx => rx(&port, args.batch, &limits, &mut meter)?,
        Function::Pong => pong(&port, args.batch, &limits, &mut meter)?,
        Function::Ping => {
            let (samples, l) = ping(&port, &args, &frame, &limits, &mut meter)?;
            rtt = Rtt::from_ns(samples);
            lost = l;
        }
    }
    let secs = match args.function {
        Function::Rx => meter.active(),
        _ => meter.elapsed(),
    }
    .as_secs_f64();
    let after = port.counters().unwrap_or_default();
    let drops = match args.function {
        Function::Tx => (after.tx_drops + after.bad_input) - (before.tx_drops + before.bad_input),
        Function::Ping => lost + after.rx_drops - before.rx_drops,
        _ => after.rx_drops - before.rx_drops,
    };
    Final {
        mode: format!("{:?}", args.function).to_lowercase(),
        port: args.port.clone(),
        frame_len: args.len as usize,
        packets: meter.packets,
        bytes: meter.bytes,
        seconds: secs,
        pps: meter.packets as f64 / secs.max(1e-9),
        bps: meter.bytes as f64 * 8.0 / secs.max(1e-9),
        drops,
        rtt,
        crowded_waits: args.busy.map(|_| port.crowded_waits()),
    }
    .print(args.json);
    Ok(())
}

/// Waits `d` between two frames of a --rate: sleeps, or with --busy spins (as long as the
/// port's busy wait would before it sleeps), pausing as a busy wait of libvale does: on a
/// crowded CPU it yields between looks at the clock, or sleeps at once (see `vale::Spinner`).
fn pause(port: &Port, d: Duration) {
    thread_local! {
        static SPINNER: Cell<Spinner> = const { Cell::new(Spinner::new()) };
    }
    let spin = match port.wait_mode() {
        Wait::Sleep => Duration::ZERO,
        Wait::Busy => d,
        Wait::BusyFor(s) => s.min(d),
    };
    let start = Instant::now();
    if !spin.is_zero() {
        let mut spinner = SPINNER.get();
        if spinner.begin() {
            while start.elapsed() < spin && spinner.pause() {}
        }
        SPINNER.set(spinner);
    }
    if let Some(rest) = d.checked_sub(start.elapsed()) {
        std::thread::sleep(rest);
    }
}

/// Writes `frame` into the slots from `cur` on, chaining with NS_MOREFRAG when it does not fit
/// one buffer; returns the slot after the last one used.
fn put_frame(ring: &mut vale::Ring, mut cur: u32, frame: &[u8], prefilled: bool) -> u32 {
    let bsize = ring.buf_size() as usize;
    let mut chunks = frame.chunks(bsize).peekable();
    while let Some(chunk) = chunks.next() {
        let slot = if prefilled {
            ring.slot_mut(cur)
        } else {
            let (slot, buf) = ring.slot_and_buf(cur);
            buf[..chunk.len()].copy_from_slice(chunk);
            slot
        };
        slot.len = chunk.len() as u16;
        slot.flags = if chunks.peek().is_some() {
            NS_MOREFRAG
        } else {
            0
        };
        cur = ring.next(cur);
    }
    cur
}

fn tx(
    port: &Port,
    args: &Args,
    frame: &[u8],
    limits: &Limits,
    meter: &mut Meter,
) -> anyhow::Result<()> {
    let rings = port.params().tx_rings;
    let per_frame = frame.len().div_ceil(port.params().buf_size as usize) as u32;
    // Frames that fit one buffer are written once, here; the loop only sets lengths.
    let prefilled = per_frame == 1;
    if prefilled {
        for r in 0..rings {
            let mut ring = port.tx_ring(r);
            for s in 0..ring.num_slots() {
                let idx = ring.slot(s).buf_idx;
                ring.buf_mut(idx)[..frame.len()].copy_from_slice(frame);
            }
        }
    }
    let start = Instant::now();
    let mut r = 0;
    loop {
        let now = Instant::now();
        meter.tick(now);
        if limits.done(meter.packets, now) {
            break;
        }
        let mut ring = port.tx_ring(r);
        let mut want = (ring.space() / per_frame).min(args.batch) as u64;
        if limits.count != 0 {
            want = want.min(limits.count - meter.packets);
        }
        if want == 0 {
            // No room: only a sync can give the slots valed took back, so wait in poll
            // (which syncs), whatever the rate allows.
            port.poll(Events::WRITABLE, Some(limits.wait(now)))?;
            r = (r + 1) % rings;
            continue;
        }
        if args.rate != 0 {
            let allowed = (args.rate as f64 * (now - start).as_secs_f64()) as u64 + 1;
            want = want.min(allowed.saturating_sub(meter.packets));
            if want == 0 {
                pause(port, Duration::from_micros(20));
                continue;
            }
        }
        let mut cur = ring.cur();
        for k in 0..want {
            let first = ring.slot(cur).buf_idx;
            cur = put_frame(&mut ring, cur, frame, prefilled);
            if args.flows > 1 {
                let flow = ((meter.packets + k) % args.flows as u64) as u16;
                frame::set_flow(ring.buf_mut(first), flow, args.vary);
            }
        }
        ring.set_cur(cur);
        ring.set_head(cur);
        port.txsync(r)?;
        meter.packets += want;
        meter.bytes += want * frame.len() as u64;
        r = (r + 1) % rings;
    }
    // Let valed take what is queued, so the counts are what left this port.
    let deadline = Instant::now() + Duration::from_secs(1);
    for r in 0..rings {
        let ring = port.tx_ring(r);
        while ring.space() < ring.num_slots() - 1 && Instant::now() < deadline {
            port.poll(Events::WRITABLE, Some(Duration::from_millis(10)))?;
        }
    }
    Ok(())
}

/// Sends one 60-byte broadcast frame from `src` and waits (up to a second) until valed has
/// taken it: from then on the switch knows which port `src` is behind.
fn announce(port: &Port, src: [u8; 6]) -> anyhow::Result<()> {
    let mut ring = port.tx_ring(0);
    let deadline = Instant::now() + Duration::from_secs(1);
    while ring.space() == 0 {
        if Instant::now() >= deadline {
            bail!("--announce: the tx ring stayed full for a second");
        }
        port.poll(Events::WRITABLE, Some(Duration::from_millis(10)))?;
    }
    let cur = ring.cur();
    let cur = put_frame(&mut ring, cur, &frame::build(60, src, [0xff; 6]), false);
    ring.set_cur(cur);
    ring.set_head(cur);
    port.txsync(0)?;
    while ring.space() < ring.num_slots() - 1 {
        if Instant::now() >= deadline {
            bail!("--announce: valed did not take the frame within a second");
        }
        port.poll(Events::WRITABLE, Some(Duration::from_millis(10)))?;
    }
    Ok(())
}

/// Receives from every rx ring, at most `batch` frames per ring before releasing them with an
/// rxsync; `each` sees every complete frame (all its slots) and says whether to keep going.
/// Returns when the rings had nothing or `batch` frames were taken from each, after releasing
/// what it read.
fn drain_rx(
    port: &Port,
    meter: &mut Meter,
    batch: u32,
    mut each: impl FnMut(&vale::Ring, &[u32]) -> bool,
) -> anyhow::Result<bool> {
    let mut got = false;
    // The slots of a frame of several slots; a frame of one slot (the usual case) is passed
    // without it.
    let mut chain: Vec<u32> = Vec::new();
    for r in 0..port.params().rx_rings {
        port.rxsync(r)?;
        let mut ring = port.rx_ring(r);
        // tail changes only in a sync: read it once, not once a frame.
        let tail = ring.tail();
        let mut cur = ring.cur();
        let mut release = cur;
        let mut frames = 0;
        let mut chain_bytes = 0u64;
        while cur != tail && frames < batch {
            let slot = ring.slot(cur);
            let (len, more) = (slot.len as u64, slot.flags & NS_MOREFRAG != 0);
            let this = cur;
            cur = ring.next(cur);
            chain_bytes += len;
            if more {
                chain.push(this);
                continue;
            }
            // Counted once the frame is whole (an incomplete chain is read again later).
            meter.bytes += chain_bytes;
            meter.packets += 1;
            chain_bytes = 0;
            frames += 1;
            got = true;
            let go = if chain.is_empty() {
                each(&ring, &[this])
            } else {
                chain.push(this);
                let go = each(&ring, &chain);
                chain.clear();
                go
            };
            release = cur;
            if !go {
                break;
            }
        }
        // An incomplete chain stays on the ring until its last slot arrives.
        chain.clear();
        ring.set_cur(release);
        ring.set_head(release);
        port.rxsync(r)?;
    }
    Ok(got)
}

fn rx(port: &Port, batch: u32, limits: &Limits, meter: &mut Meter) -> anyhow::Result<()> {
    loop {
        let now = Instant::now();
        meter.tick(now);
        if limits.done(meter.packets, now) {
            if STOP.load(Relaxed) {
                // Stopped from outside, maybe once the sender is done: what valed delivered
                // before the signal is counted too (one pass, bounded by the rings' sizes).
                drain_rx(port, meter, u32::MAX, |_, _| true)?;
            }
            return Ok(());
        }
        let got = drain_rx(port, meter, batch, |_, _| true)?;
        if got {
            meter.seen(now);
        } else {
            port.poll(Events::READABLE, Some(limits.wait(now)))?;
        }
    }
}

fn pong(port: &Port, batch: u32, limits: &Limits, meter: &mut Meter) -> anyhow::Result<()> {
    let mut txr = port.tx_ring(0);
    let mut echo = Vec::with_capacity(9000);
    loop {
        let now = Instant::now();
        meter.tick(now);
        if limits.done(meter.packets, now) {
            return Ok(());
        }
        let mut queued = false;
        let got = drain_rx(port, meter, batch, |ring, chain| {
            echo.clear();
            for &s in chain {
                let slot = ring.slot(s);
                echo.extend_from_slice(&ring.buf(slot.buf_idx)[..slot.len as usize]);
            }
            if echo.len() >= frame::ETH_HLEN {
                let (d, s) = echo.split_at_mut(6);
                d.swap_with_slice(&mut s[..6]);
                let need = echo.len().div_ceil(txr.buf_size() as usize) as u32;
                if txr.space() >= need {
                    let cur = txr.cur();
                    let cur = put_frame(&mut txr, cur, &echo, false);
                    txr.set_cur(cur);
                    txr.set_head(cur);
                    queued = true;
                }
            }
            true
        })?;
        if queued {
            port.txsync(0)?;
        }
        if !got {
            port.poll(Events::READABLE, Some(limits.wait(now)))?;
        }
    }
}

fn ping(
    port: &Port,
    args: &Args,
    frame: &[u8],
    limits: &Limits,
    meter: &mut Meter,
) -> anyhow::Result<(Vec<u64>, u64)> {
    let mut txr = port.tx_ring(0);
    let epoch = Instant::now();
    let mut f = frame.to_vec();
    let mut samples = Vec::new();
    let mut lost = 0u64;
    let mut seq = 0u32;
    let mut sent = 0u64;
    loop {
        let now = Instant::now();
        meter.tick(now);
        if limits.done(sent, now) {
            return Ok((samples, lost));
        }
        if args.rate != 0 {
            let next = Duration::from_secs_f64(sent as f64 / args.rate as f64);
            if now - epoch < next {
                pause(port, next - (now - epoch));
            }
        }
        seq = seq.wrapping_add(1);
        f[frame::SEQ_OFS..frame::SEQ_OFS + 4].copy_from_slice(&seq.to_le_bytes());
        let t0 = epoch.elapsed().as_nanos() as u64;
        f[frame::TS_OFS..frame::TS_OFS + 8].copy_from_slice(&t0.to_le_bytes());
        while txr.space() == 0 {
            port.poll(Events::WRITABLE, Some(Duration::from_millis(100)))?;
        }
        let cur = txr.cur();
        let cur = put_frame(&mut txr, cur, &f, false);
        txr.set_cur(cur);
        txr.set_head(cur);
        port.txsync(0)?;
        sent += 1;
        // Wait up to a second for the echo of this sequence number.
        let give_up = Instant::now() + Duration::from_secs(1);
        let mut answered = false;
        while !answered && Instant::now() < give_up && !STOP.load(Relaxed) {
            drain_rx(port, meter, u32::MAX, |ring, chain| {
                let slot = ring.slot(chain[0]);
                let b = &ring.buf(slot.buf_idx)[..slot.len as usize];
                if b.len() >= frame::TS_OFS + 8
                    && b[frame::PAYLOAD_OFS..frame::SEQ_OFS] == frame::MAGIC
                    && b[frame::SEQ_OFS..frame::TS_OFS] == seq.to_le_bytes()
                {
                    let t1 = epoch.elapsed().as_nanos() as u64;
                    let ts = u64::from_le_bytes(
                        b[frame::TS_OFS..frame::TS_OFS + 8]
                            .try_into()
                            .expect("8 bytes"),
                    );
                    samples.push(t1.saturating_sub(ts));
                    answered = true;
                }
                true
            })?;
            if !answered {
                port.poll(Events::READABLE, Some(Duration::from_millis(100)))?;
            }
        }
        if !answered {
            lost += 1;
        }
    }
}

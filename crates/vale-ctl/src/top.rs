//! `vale-ctl top`: live per-port rates, like top.
//!
//! Every interval it asks valed for the same counters `vale-ctl list` shows (and the workers'
//! counters) over the control socket, one connection for the whole run, and shows what
//! changed per second. Interactive on a terminal (the alternate screen, `q` or Ctrl-C to
//! leave); plain tables or JSON lines otherwise, for scripts.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, Context};
use vale_abi::control::{PortCounters, PortInfo, Reply, Request, SwitchInfo, WorkerInfo};

use crate::cli::TopCmd;
use crate::client::{ask, unexpected, Failure};

pub struct TopArgs<'a> {
    pub name: Option<&'a str>,
    pub interval: Duration,
    /// Tables to show before exiting (None: until q or Ctrl-C).
    pub count: Option<u64>,
    pub json: bool,
}

/// One look at valed's counters.
struct Sample {
    at: Instant,
    ports: Vec<(PortInfo, String)>,
    workers: Vec<WorkerInfo>,
}

fn sample(sock: &UnixStream, name: Option<&str>) -> Result<Sample, Failure> {
    let switches: Vec<SwitchInfo> = match ask(sock, &Request::List)? {
        Reply::List { switches } => switches,
        other => return Err(unexpected(&other)),
    };
    let workers = match ask(sock, &Request::Workers)? {
        Reply::Workers { workers } => workers,
        other => return Err(unexpected(&other)),
    };
    let at = Instant::now();
    let mut ports = Vec::new();
    for s in switches {
        if let Some(n) = name {
            if !n.contains(':') && s.name != n {
                continue;
            }
        }
        for p in s.ports {
            if name.is_some_and(|n| n.contains(':') && p.name != n) {
                continue;
            }
            ports.push((p, s.name.clone()));
        }
    }
    Ok(Sample { at, ports, workers })
}

/// A port's rates between two samples.
struct Rates {
    name: String,
    kind: String,
    state: String,
    /// None: the port is new since the last sample.
    rx_pps: Option<f64>,
    rx_bps: Option<f64>,
    tx_pps: Option<f64>,
    tx_bps: Option<f64>,
    drops: Option<f64>,
    bad: Option<f64>,
}

fn rates(prev: &Sample, now: &Sample) -> (Vec<Rates>, Vec<(u32, f64)>) {
    let secs = now.at.duration_since(prev.at).as_secs_f64().max(1e-6);
    let before: HashMap<&str, &PortCounters> = prev
        .ports
        .iter()
        .map(|(p, _)| (p.name.as_str(), &p.counters))
        .collect();
    let per = |a: u64, b: u64| Some(a.saturating_sub(b) as f64 / secs);
    let mut out: Vec<Rates> = now
        .ports
        .iter()
        .map(|(p, _)| {
            let c = &p.counters;
            let (rx_pps, rx_bps, tx_pps, tx_bps, drops, bad) = match before.get(p.name.as_str()) {
                Some(b) => (
                    per(c.rx_packets, b.rx_packets),
                    per(c.rx_bytes, b.rx_bytes).map(|v| v * 8.0),
                    per(c.tx_packets, b.tx_packets),
                    per(c.tx_bytes, b.tx_bytes).map(|v| v * 8.0),
                    per(c.rx_drops + c.tx_drops, b.rx_drops + b.tx_drops),
                    per(c.bad_input, b.bad_input),
                ),
                None => (None, None, None, None, None, None),
            };
            Rates {
                name: p.name.clone(),
                kind: p.kind.clone(),
                state: p.state.clone(),
                rx_pps,
                rx_bps,
                tx_pps,
                tx_bps,
                drops,
                bad,
            }
        })
        .collect();
    // Busiest first, then by name.
    let load =
        |r: &Rates| r.rx_pps.unwrap_or(0.0) + r.tx_pps.unwrap_or(0.0) + r.drops.unwrap_or(0.0);
    out.sort_by(|a, b| {
        load(b)
            .total_cmp(&load(a))
            .then_with(|| a.name.cmp(&b.name))
    });
    let busy = now
        .workers
        .iter()
        .map(|w| {
            let was = prev
                .workers
                .iter()
                .find(|x| x.id == w.id)
                .map_or(w.busy_ns, |x| x.busy_ns);
            (
                w.id,
                w.busy_ns.saturating_sub(was) as f64 / 1e9 / secs * 100.0,
            )
        })
        .collect();
    (out, busy)
}

/// 1234567 as `1.23M`.
fn si(v: Option<f64>) -> String {
    let Some(v) = v else { return "-".into() };
    let (div, unit) = match v {
        v if v >= 1e9 => (1e9, "G"),
        v if v >= 1e6 => (1e6, "M"),
        v if v >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let x = v / div;
    if unit.is_empty() {
        format!("{x:.0}")
    } else if x >= 100.0 {
        format!("{x:.0}{unit}")
    } else if x >= 10.0 {
        format!("{x:.1}{unit}")
    } else {
        format!("{x:.2}{unit}")
    }
}

/// The table, at most `rows` port lines.
fn render(ports: &[Rates], busy: &[(u32, f64)], interval: Duration, rows: usize) -> String {
    let mut s = String::new();
    let total = |f: fn(&Rates) -> Option<f64>| ports.iter().filter_map(f).sum::<f64>();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let _ = writeln!(
        s,
        "vale-ctl top  {:02}:{:02}:{:02} UTC  every {:.1} s  ports {}  rx {}pps {}bps  tx {}pps {}bps  drops {}/s",
        now / 3600 % 24,
        now / 60 % 60,
        now % 60,
        interval.as_secs_f64(),
        ports.len(),
        si(Some(total(|r| r.rx_pps))),
        si(Some(total(|r| r.rx_bps))),
        si(Some(total(|r| r.tx_pps))),
        si(Some(total(|r| r.tx_bps))),
        si(Some(total(|r| r.drops))),
    );
    let workers: Vec<String> = busy
        .iter()
        .map(|(id, b)| format!("{id}: {b:.0}%"))
        .collect();
    let _ = writeln!(s, "workers busy  {}", workers.join("  "));
    let _ = writeln!(s);
    let width = ports.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(
        s,
        "{:<width$}  {:<10}  {:<5}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}",
        "PORT", "KIND", "STATE", "RX-PPS", "RX-BPS", "TX-PPS", "TX-BPS", "DROPS/S", "BAD/S"
    );
    for r in ports.iter().take(rows) {
        let _ = writeln!(
            s,
            "{:<width$}  {:<10}  {:<5}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}",
            r.name,
            r.kind,
            r.state,
            si(r.rx_pps),
            si(r.rx_bps),
            si(r.tx_pps),
            si(r.tx_bps),
            si(r.drops),
            si(r.bad)
        );
    }
    if ports.len() > rows {
        let _ = writeln!(s, "... {} more ports", ports.len() - rows);
    }
    s
}

fn json(ports: &[Rates], busy: &[(u32, f64)], interval: Duration) -> String {
    let num = |v: Option<f64>| v.map_or(serde_json::Value::Null, |v| serde_json::json!(v));
    let ports: Vec<_> = ports
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.name, "kind": r.kind, "state": r.state,
                "rx_pps": num(r.rx_pps), "rx_bps": num(r.rx_bps),
                "tx_pps": num(r.tx_pps), "tx_bps": num(r.tx_bps),
                "drops_per_s": num(r.drops), "bad_input_per_s": num(r.bad),
            })
        })
        .collect();
    let workers: Vec<_> = busy
        .iter()
        .map(|(id, b)| serde_json::json!({"id": id, "busy_percent": b}))
        .collect();
    let v = serde_json::json!({
        "interval_s": interval.as_secs_f64(),
        "ports": ports,
        "workers": workers,
    });
    format!("{v}\n")
}

/// The terminal, made to give keys at once and no echo, with the alternate screen; given
/// back as it was when dropped.
struct Screen {
    saved: Option<libc::termios>,
}

impl Screen {
    fn take() -> Screen {
        let mut saved = None;
        let stdin = io::stdin();
        if stdin.is_terminal() {
            // SAFETY: tcgetattr/tcsetattr on stdin with a live struct.
            unsafe {
                let mut t: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(stdin.as_raw_fd(), &mut t) == 0 {
                    saved = Some(t);
                    t.c_lflag &= !(libc::ICANON | libc::ECHO);
                    t.c_cc[libc::VMIN] = 0;
                    t.c_cc[libc::VTIME] = 0;
                    libc::tcsetattr(stdin.as_raw_fd(), libc::TCSANOW, &t);
                }
            }
        }
        // Alternate screen, cursor hidden.
        print!("\x1b[?1049h\x1b[?25l");
        let _ = io::stdout().flush();
        Screen { saved }
    }

    /// Rows of the terminal (24 if it does not say).
    fn rows() -> usize {
        // SAFETY: TIOCGWINSZ fills a live struct.
        unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            if libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_row > 0 {
                return ws.ws_row as usize;
            }
        }
        24
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        print!("\x1b[?25h\x1b[?1049l");
        let _ = io::stdout().flush();
        if let Some(t) = &self.saved {
            // SAFETY: restores the settings read in take.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t);
            }
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP as a descriptor, so that they end the loop as `q` does and the
/// terminal is given back.
pub(crate) fn signals() -> io::Result<OwnedFd> {
    // SAFETY: signal-set manipulation with a local set; signalfd returns a new descriptor.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// What waiting for the next refresh ended with.
enum Wake {
    Time,
    Quit,
}

/// Waits until `deadline` unless a signal comes or `q` is typed.
fn wait(deadline: Instant, sig: &OwnedFd, keys: bool) -> Wake {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Wake::Time;
        }
        let mut fds = [
            libc::pollfd {
                fd: sig.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if keys { libc::STDIN_FILENO } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: poll on a live array.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n <= 0 {
            continue;
        }
        if fds[0].revents != 0 {
            return Wake::Quit;
        }
        if fds[1].revents != 0 {
            let mut buf = [0u8; 64];
            // SAFETY: read into a live buffer.
            let got = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
            if got <= 0 {
                // End of input: keys no longer matter; go on until the time is up.
                return wait(deadline, sig, false);
            }
            if buf[..got as usize]
                .iter()
                .any(|&b| b == b'q' || b == b'Q' || b == 3)
            {
                return Wake::Quit;
            }
        }
    }
}

/// `vale-ctl top [NAME] ...` as the command line gave it (`--once` came as `-n 1`).
pub(crate) fn command(sock: &UnixStream, c: &TopCmd, json: bool) -> Result<(), Failure> {
    run(
        sock,
        &TopArgs {
            name: c.name.as_deref(),
            interval: c.interval,
            count: c.count,
            json,
        },
    )
}

pub fn run(sock: &UnixStream, args: &TopArgs) -> Result<(), Failure> {
    let sig = signals().context("cannot watch signals")?;
    let live = args.count.is_none() && !args.json && io::stdout().is_terminal();
    let screen = live.then(Screen::take);
    let keys = screen.as_ref().is_some_and(|s| s.saved.is_some());
    let mut prev = sample(sock, args.name)?;
    if let Some(n) = args.name {
        if prev.ports.is_empty() {
            drop(screen);
            return Err(Failure::Refused(format!("no such switch or port '{n}'")));
        }
    }
    let mut shown = 0u64;
    let mut deadline = prev.at;
    loop {
        deadline += args.interval;
        if let Wake::Quit = wait(deadline, &sig, keys) {
            return Ok(());
        }
        let now = sample(sock, args.name)?;
        let (ports, busy) = rates(&prev, &now);
        let text = if args.json {
            json(&ports, &busy, args.interval)
        } else if live {
            // Home, the table, clear what is left of the screen.
            let rows = Screen::rows().saturating_sub(5).max(1);
            format!(
                "\x1b[H{}\x1b[J",
                render(&ports, &busy, args.interval, rows).replace('\n', "\x1b[K\n")
            )
        } else {
            let sep = if shown == 0 { "" } else { "\n" };
            format!("{sep}{}", render(&ports, &busy, args.interval, usize::MAX))
        };
        let mut out = io::stdout().lock();
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(anyhow!("cannot write output: {e}").into()),
            Ok(()) => {}
        }
        drop(out);
        shown += 1;
        if args.count.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        prev = now;
        // A slow valed or a suspended vale-ctl: start the next interval from now.
        if deadline < prev.at {
            deadline = prev.at;
        }
    }
}

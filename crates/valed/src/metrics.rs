//! `valed --metrics ADDR:PORT`: the counters of every port, lookup module and worker, and
//! valed's own memory and descriptors, in the Prometheus (OpenMetrics) text format over HTTP.
//!
//! The counters come from where the control socket's `list`, `lookup` and `workers` requests
//! take them ([`Engine::list`], [`Engine::lookup_info`], [`Engine::workers`]): copied out of
//! atomics under the control lock, which forwarding never takes. A scrape costs forwarding
//! nothing but cache lines.
//!
//! The format is written by `prometheus-client` (the Prometheus project's own Rust client),
//! through a [`Collector`] that encodes what one snapshot holds. The HTTP side is a few dozen
//! lines on a std `TcpListener`: one request per connection, answered and closed. A crate
//! (`tiny_http`, `hyper`) would bring its own threads or runtime for what Prometheus needs of
//! it, a GET and a body.
//!
//! Anyone who can reach ADDR may connect, so the listener is hostile-input code: at most
//! [`MAX_CONNS`] connections are served at once (more are closed at once), a request head is
//! at most [`MAX_REQUEST`] bytes and must arrive within [`REQUEST_TIME`], a reply that the
//! client does not take within [`REPLY_TIME`] is abandoned. Nothing a client sends can stop
//! the thread that accepts.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use vale_abi::control::{PortCounters, PortInfo};
use vale_switch::Engine;

/// Connections served at once; more are closed as soon as they are accepted.
pub const MAX_CONNS: usize = 16;
/// Largest request head (request line and headers) read.
pub const MAX_REQUEST: usize = 8 << 10;
/// Time a client has to send its whole request head.
pub const REQUEST_TIME: Duration = Duration::from_secs(5);
/// Time a client has to take the reply.
pub const REPLY_TIME: Duration = Duration::from_secs(10);

/// The content type of what `prometheus-client` writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` and serves metrics from a thread of their own. Fails (before valed serves
/// anything) if the address cannot be bound.
pub fn start(addr: SocketAddr, engine: Arc<Engine>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .with_context(|| format!("cannot serve metrics on {addr} (--metrics)"))?;
    let local = listener.local_addr().unwrap_or(addr);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Vale { engine }));
    let registry = Arc::new(registry);
    std::thread::Builder::new()
        .name("vale-metrics".into())
        .spawn(move || accept_loop(listener, registry))
        .context("cannot start the metrics thread")?;
    tracing::info!(%local, "metrics served at http://{local}/metrics");
    Ok(())
}

fn accept_loop(listener: TcpListener, registry: Arc<Registry>) {
    let busy = Arc::new(AtomicUsize::new(0));
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was taken: wait a
                // little rather than spin, and go on.
                tracing::debug!("metrics: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if busy.fetch_add(1, Relaxed) >= MAX_CONNS {
            busy.fetch_sub(1, Relaxed);
            // Closed unread: the client sees a reset or an empty reply and may retry.
            drop(stream);
            continue;
        }
        let (busy2, registry) = (busy.clone(), registry.clone());
        let spawned = std::thread::Builder::new()
            .name("vale-metrics-conn".into())
            .spawn(move || {
                let _ = serve(stream, &registry);
                busy2.fetch_sub(1, Relaxed);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Relaxed);
        }
    }
}

/// Reads one request from `stream`, answers it and closes.
fn serve(mut stream: TcpStream, registry: &Registry) -> io::Result<()> {
    let head = match read_head(&mut stream) {
        Ok(h) => h,
        Err(Bad::TooLarge) => {
            return reply(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request head too large\n",
                false,
            );
        }
        Err(Bad::Io(e)) => return Err(e),
    };
    let Some((method, target)) = request_line(&head) else {
        return reply(
            &mut stream,
            "400 Bad Request",
            "text/plain",
            b"bad request\n",
            false,
        );
    };
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return reply(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"only GET\n",
            false,
        );
    }
    if path != "/metrics" {
        return reply(
            &mut stream,
            "404 Not Found",
            "text/plain",
            b"not found: metrics are at /metrics\n",
            head_only,
        );
    }
    let mut body = String::with_capacity(64 << 10);
    if prometheus_client::encoding::text::encode(&mut body, registry).is_err() {
        return reply(
            &mut stream,
            "500 Internal Server Error",
            "text/plain",
            b"cannot encode metrics\n",
            head_only,
        );
    }
    reply(
        &mut stream,
        "200 OK",
        CONTENT_TYPE,
        body.as_bytes(),
        head_only,
    )
}

enum Bad {
    TooLarge,
    Io(io::Error),
}

/// The request head, up to and without its empty line, read within [`REQUEST_TIME`].
fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Bad> {
    let deadline = Instant::now() + REQUEST_TIME;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Bad::Io(io::ErrorKind::TimedOut.into()));
        }
        stream.set_read_timeout(Some(left)).map_err(Bad::Io)?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(Bad::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Bad::Io(e)),
        };
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = end_of_head(&head[from..]) {
            head.truncate(from + end);
            return Ok(head);
        }
        if head.len() > MAX_REQUEST {
            return Err(Bad::TooLarge);
        }
    }
}

/// Where the empty line that ends a request head starts (CRLF or bare LF lines).
fn end_of_head(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len())
        .find(|&i| bytes[i..].starts_with(b"\r\n\r\n") || bytes[i..].starts_with(b"\n\n"))
}

/// Method and target of a request line `METHOD TARGET HTTP/x.y`.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut words = line.split(' ');
    let (method, target, version) = (words.next()?, words.next()?, words.next()?);
    if words.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return None;
    }
    Some((method, target))
}

fn reply(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> io::Result<()> {
    stream.set_write_timeout(Some(REPLY_TIME))?;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + REPLY_TIME;
    write_by(stream, head.as_bytes(), deadline)?;
    if !head_only {
        write_by(stream, body, deadline)?;
    }
    stream.flush()?;
    // What the client may still send (a body, pipelined requests) is not read: shut the
    // write side so that it sees the end of the reply, then close.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

/// Writes all of `bytes` by `deadline`, however slowly the client reads.
fn write_by(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Encodes, at each scrape, what valed's counters hold then.
struct Vale {
    engine: Arc<Engine>,
}

impl fmt::Debug for Vale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("vale metrics")
    }
}

type Labels<'a> = Vec<(&'a str, &'a str)>;

/// One metric family: its samples, written under one descriptor.
fn family<'a, M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels<'a>, M)>,
) -> fmt::Result {
    let mut samples = samples.into_iter().peekable();
    let Some((_, first)) = samples.peek() else {
        return Ok(());
    };
    let kind: MetricType = first.metric_type();
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            // A family of one sample with no labels: `name value`, not `name{} value`.
            return value.encode(m);
        }
        value.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A label value and the counter that goes with it.
type Counter = fn(&PortCounters) -> u64;

/// A counter of every port, one sample per port and value of label `key` (none if empty).
fn per_port(
    enc: &mut DescriptorEncoder,
    ports: &[(&str, &PortInfo)],
    name: &str,
    help: &str,
    key: &'static str,
    values: &[(&'static str, Counter)],
) -> fmt::Result {
    family(
        enc,
        name,
        help,
        ports.iter().flat_map(|(sw, p)| {
            values.iter().map(move |(value, get)| {
                let mut labels = port_labels(sw, p);
                if !key.is_empty() {
                    labels.push((key, value));
                }
                counter(labels, get(&p.counters))
            })
        }),
    )
}

fn port_labels<'a>(sw: &'a str, p: &'a PortInfo) -> Labels<'a> {
    vec![
        ("switch", sw),
        ("port", p.name.as_str()),
        ("kind", p.kind.as_str()),
    ]
}

fn counter<'a>(labels: Labels<'a>, v: u64) -> (Labels<'a>, ConstCounter<u64>) {
    (labels, ConstCounter::new(v))
}

fn gauge<'a>(labels: Labels<'a>, v: i64) -> (Labels<'a>, ConstGauge<i64>) {
    (labels, ConstGauge::new(v))
}

impl Collector for Vale {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let switches = self.engine.list();
        let lookups: Vec<_> = switches
            .iter()
            .filter_map(|s| self.engine.lookup_info(&s.name).ok())
            .collect();
        let workers = self.engine.workers();

        // Per port: (switch, port, kind) and its counters.
        let ports: Vec<_> = switches
            .iter()
            .flat_map(|s| s.ports.iter().map(move |p| (s.name.as_str(), p)))
            .collect();
        per_port(
            &mut enc,
            &ports,
            "vale_port_packets",
            "Frames through the port, seen from the port: tx is what its client sent into \
             the switch, rx what the switch delivered to it",
            "direction",
            &[("rx", |c| c.rx_packets), ("tx", |c| c.tx_packets)],
        )?;
        per_port(
            &mut enc,
            &ports,
            "vale_port_bytes",
            "Bytes of those frames",
            "direction",
            &[("rx", |c| c.rx_bytes), ("tx", |c| c.tx_bytes)],
        )?;
        per_port(
            &mut enc,
            &ports,
            "vale_port_drops",
            "Frames dropped, by cause: rx_full, frames for the port dropped because its \
             receive ring was full, nobody held it, or its device refused them or was down; \
             no_destination, frames from the port that had nowhere to go",
            "cause",
            &[
                ("rx_full", |c| c.rx_drops),
                ("no_destination", |c| c.tx_drops),
            ],
        )?;
        per_port(
            &mut enc,
            &ports,
            "vale_port_bad_input",
            "Values the port's client wrote that valed refused (ring indices, buffer \
             indices, lengths, flags); each refused frame is dropped",
            "",
            &[("", |c| c.bad_input)],
        )?;
        per_port(
            &mut enc,
            &ports,
            "vale_port_learn_refused",
            "Source addresses of the port's frames the learning bridge did not learn \
             (learn-limit reached, or a full table); the frames are still forwarded",
            "",
            &[("", |c| c.learn_refused)],
        )?;
        family(
            &mut enc,
            "vale_port_up",
            "1 if the port is up, 0 if it is down (a device down or gone) or free (a persistent port nobody holds)",
            ports.iter().map(|(sw, p)| {
                gauge(port_labels(sw, p), i64::from(p.state == "up"))
            }),
        )?;
        family(
            &mut enc,
            "vale_port_learnt_addresses",
            "Source MAC addresses the switch's lookup holds for the port now",
            ports
                .iter()
                .map(|(sw, p)| gauge(port_labels(sw, p), i64::from(p.learnt))),
        )?;

        // Per switch.
        family(
            &mut enc,
            "vale_switch_ports",
            "Ports of the switch",
            switches
                .iter()
                .map(|s| gauge(vec![("switch", s.name.as_str())], s.ports.len() as i64)),
        )?;
        family(
            &mut enc,
            "vale_lookup_counter",
            "The lookup module's own counters, by name, as vale-ctl lookup shows them (some count events, some are sizes: all are given as gauges)",
            lookups.iter().flat_map(|l| {
                l.counters.iter().map(move |c| {
                    gauge(
                        vec![
                            ("switch", l.switch.as_str()),
                            ("module", l.module.as_str()),
                            ("counter", c.name.as_str()),
                        ],
                        c.value.min(i64::MAX as u64) as i64,
                    )
                })
            }),
        )?;

        // Per worker.
        let ids: Vec<String> = workers.iter().map(|w| w.id.to_string()).collect();
        let wl = |i: usize| vec![("worker", ids[i].as_str())];
        family(
            &mut enc,
            "vale_worker_busy_seconds",
            "CPU time of the forwarding thread: polling and forwarding, not sleeping",
            workers
                .iter()
                .enumerate()
                .map(|(i, w)| (wl(i), ConstCounter::new(w.busy_ns as f64 / 1e9))),
        )?;
        family(
            &mut enc,
            "vale_worker_batches",
            "Batches forwarded: passes over a ring that took at least one frame",
            workers
                .iter()
                .enumerate()
                .map(|(i, w)| counter(wl(i), w.batches)),
        )?;
        family(
            &mut enc,
            "vale_worker_slots",
            "Slots those batches took from their rings (a frame of several slots counts each)",
            workers
                .iter()
                .enumerate()
                .map(|(i, w)| counter(wl(i), w.slots)),
        )?;
        family(
            &mut enc,
            "vale_worker_rings",
            "Source rings the worker serves",
            workers
                .iter()
                .enumerate()
                .map(|(i, w)| gauge(wl(i), i64::from(w.rings))),
        )?;

        // valed itself, under the names every Prometheus client library uses.
        let me = process();
        family(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory of valed, bytes (port memory a client touched counts here too)",
            [gauge(vec![], me.rss_bytes as i64)],
        )?;
        family(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory of valed, bytes",
            [gauge(vec![], me.vm_bytes as i64)],
        )?;
        family(
            &mut enc,
            "process_open_fds",
            "Descriptors valed has open",
            [gauge(vec![], me.open_fds as i64)],
        )?;
        family(
            &mut enc,
            "process_max_fds",
            "Most descriptors valed may open",
            [gauge(vec![], me.max_fds as i64)],
        )?;
        family(
            &mut enc,
            "process_cpu_seconds",
            "CPU time of valed, all threads, seconds",
            [(vec![], ConstCounter::new(me.cpu_seconds))],
        )?;
        Ok(())
    }
}

/// What the kernel says of valed itself.
#[derive(Default)]
struct Process {
    rss_bytes: u64,
    vm_bytes: u64,
    open_fds: u64,
    max_fds: u64,
    cpu_seconds: f64,
}

fn process() -> Process {
    let mut me = Process::default();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        let mut f = statm
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        me.vm_bytes = f.next().unwrap_or(0) * page;
        me.rss_bytes = f.next().unwrap_or(0) * page;
    }
    // The directory itself holds one while it is read.
    me.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(0);
    // SAFETY: getrlimit with a live struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            me.max_fds = lim.rlim_cur;
        }
    }
    // SAFETY: getrusage with a live struct.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) == 0 {
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            me.cpu_seconds = secs(ru.ru_utime) + secs(ru.ru_stime);
        }
    }
    me
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            request_line(b"GET /metrics?x=1 HTTP/1.0"),
            Some(("GET", "/metrics?x=1"))
        );
        assert_eq!(request_line(b"GET /metrics"), None);
        assert_eq!(request_line(b"\x00\xff garbage"), None);
        assert_eq!(request_line(b"GET metrics HTTP/1.1"), None);
        assert_eq!(request_line(b"GET /a b HTTP/1.1"), None);
    }

    #[test]
    fn head_ends() {
        assert_eq!(end_of_head(b"GET / HTTP/1.0\r\n\r\n"), Some(14));
        assert_eq!(end_of_head(b"GET / HTTP/1.0\n\n"), Some(14));
        assert_eq!(end_of_head(b"GET / HTTP/1.0\r\n"), None);
    }
}

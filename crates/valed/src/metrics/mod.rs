//! `valed --metrics ADDR:PORT`: the counters of every port, lookup module and worker, and
//! valed's own memory and descriptors, in the Prometheus (OpenMetrics) text format over HTTP.
//!
//! The counters come from where the control socket's `list`, `lookup` and `workers` requests
//! take them ([`Engine::list`], [`Engine::lookup_info`], [`Engine::workers`]): copied out of
//! atomics under the control lock, which forwarding never takes. A scrape costs forwarding
//! nothing but cache lines.
//!
//! The format is written by `prometheus-client` (the Prometheus project's own Rust client),
//! through a [`Collector`] that encodes what one snapshot holds.
//!
//! The HTTP side is a small HTTP/1.x responder: one thread, one `poll` over the listener and
//! every connection, all non-blocking, each connection with a deadline of its own. One
//! request per connection, answered and closed. A thread per connection (what this was) let
//! sixteen clients that send nothing hold every place for 5 s at a time, and a scraper came
//! in between only by luck; here nothing a client does or fails to do delays another's
//! reply: a scrape is read as its bytes come and answered at once. A crate (`tiny_http`,
//! `hyper`) would bring threads of its own or an async runtime for what Prometheus needs, a
//! GET and a body, and the bounds below would still have to be set around it.
//!
//! Anyone who can reach ADDR may connect, so the listener is hostile-input code, and what it
//! holds is bounded:
//!
//! - at most [`MAX_CONNS`] connections at once; one more closes the connection that has been
//!   waiting longest for its request (a scraper sends its request as soon as it connects, so
//!   a flood must open [`MAX_CONNS`] connections in those few milliseconds to push it out);
//! - a request head is at most [`MAX_REQUEST`] bytes (`431` past it) and must arrive within
//!   [`REQUEST_TIME`] of the connection;
//! - a connection's send buffer is [`SEND_BUFFER`] (the kernel's own would grow to megabytes
//!   for a client that does not read): what the client has not taken stays in its reply;
//! - at most [`MAX_REPLIES`] replies are held at once, each a reply's bytes; one more
//!   abandons the reply that started first, and a reply not taken within [`REPLY_TIME`] is
//!   abandoned. An abandoned connection is reset, so that the kernel drops what it still
//!   held for it at once. So valed holds at most `MAX_CONNS × MAX_REQUEST` bytes of requests,
//!   `MAX_REPLIES` replies (about 850 bytes a port each), [`MAX_CONNS`] send buffers in the
//!   kernel and [`MAX_CONNS`] + 1 descriptors.
//!
//! A connection whose reply is all written has its write side shut and waits (within the
//! reply's time) for the client to close: closing first would reset the connection if the
//! client sent anything more, and the client could lose the reply's tail.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus_client::registry::Registry;
use vale_switch::Engine;

mod families;

/// Connections held at once; one more closes the one that has waited longest for its request.
pub const MAX_CONNS: usize = 64;
/// Replies held at once; one more abandons the one that started first.
pub const MAX_REPLIES: usize = 8;
/// Largest request head (request line and headers) read.
pub const MAX_REQUEST: usize = 8 << 10;
/// Time a client has to send its whole request head.
pub const REQUEST_TIME: Duration = Duration::from_secs(5);
/// Time a client has to take the reply.
pub const REPLY_TIME: Duration = Duration::from_secs(10);
/// The send buffer of a connection, bytes (the kernel doubles it for its bookkeeping).
const SEND_BUFFER: usize = 64 << 10;
/// Connections taken from the listener per wake-up, before the others get their turn.
const ACCEPT_BURST: usize = 16;
/// How long the listener is left alone after an accept failed for want of descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

/// The content type of what `prometheus-client` writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` and serves metrics from a thread of their own. Fails (before valed serves
/// anything) if the address cannot be bound.
pub fn start(addr: SocketAddr, engine: Arc<Engine>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .with_context(|| format!("cannot serve metrics on {addr} (--metrics)"))?;
    listener
        .set_nonblocking(true)
        .with_context(|| format!("cannot serve metrics on {addr} (--metrics)"))?;
    let local = listener.local_addr().unwrap_or(addr);
    let mut registry = Registry::default();
    registry.register_collector(families::collector(engine));
    std::thread::Builder::new()
        .name("vale-metrics".into())
        .spawn(move || Server::new(listener, registry).run())
        .context("cannot start the metrics thread")?;
    tracing::info!(%local, "metrics served at http://{local}/metrics");
    Ok(())
}

/// One client's connection.
struct Conn {
    stream: TcpStream,
    /// When it was accepted (while reading) or its reply started (while replying).
    since: Instant,
    state: State,
    /// To be closed at the end of this turn.
    closed: bool,
}

enum State {
    /// Its request head so far.
    Reading(Vec<u8>),
    /// The reply (head and body) and how much of it the kernel took.
    Replying(Vec<u8>, usize),
    /// The whole reply is with the kernel and the write side shut: waiting for the client to
    /// close (what it still sends is read and dropped).
    Sent,
}

/// What a step on a connection left of it.
enum Step {
    Keep,
    Close,
}

impl Conn {
    fn deadline(&self) -> Instant {
        match self.state {
            State::Reading(_) => self.since + REQUEST_TIME,
            State::Replying(..) | State::Sent => self.since + REPLY_TIME,
        }
    }

    /// What to wait for on its socket.
    fn events(&self) -> libc::c_short {
        match self.state {
            State::Replying(..) => libc::POLLOUT,
            State::Reading(_) | State::Sent => libc::POLLIN,
        }
    }

    /// Serves what its socket is ready for.
    fn step(&mut self, registry: &Registry) -> Step {
        match self.state {
            State::Reading(_) => self.read(registry),
            State::Replying(..) => self.write(),
            State::Sent => self.drain(),
        }
    }

    /// Closes it with a reset, for a client that let its deadline pass or was pushed out: the
    /// kernel lets go at once of what it still held for it (a reply not taken), instead of
    /// trying to deliver it for minutes after the close.
    fn abort(&mut self) {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt on our own socket with a live linger of the size given.
        unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const l).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        self.closed = true;
    }

    fn replying(&self) -> bool {
        matches!(self.state, State::Replying(..))
    }

    /// Reads what the client sent; once the head is whole, makes the reply and starts it.
    fn read(&mut self, registry: &Registry) -> Step {
        let State::Reading(head) = &mut self.state else {
            return Step::Keep;
        };
        let mut chunk = [0u8; 1024];
        let reply = loop {
            let n = match self.stream.read(&mut chunk) {
                Ok(0) => return Step::Close,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Keep,
                Err(_) => return Step::Close,
            };
            let from = head.len().saturating_sub(3);
            head.extend_from_slice(&chunk[..n]);
            if let Some(end) = end_of_head(&head[from..]) {
                break answer(&head[..from + end], registry);
            }
            if head.len() > MAX_REQUEST {
                break message(
                    "431 Request Header Fields Too Large",
                    "text/plain",
                    b"request head too large\n",
                    false,
                );
            }
        };
        self.since = Instant::now();
        self.state = State::Replying(reply, 0);
        self.write()
    }

    /// Writes what the client can take of the reply now; at its end, closes.
    fn write(&mut self) -> Step {
        let State::Replying(bytes, sent) = &mut self.state else {
            return Step::Keep;
        };
        while *sent < bytes.len() {
            match self.stream.write(&bytes[*sent..]) {
                Ok(0) => return Step::Close,
                Ok(n) => *sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Keep,
                Err(_) => return Step::Close,
            }
        }
        // Shut the write side so that the client sees the end of the reply, and wait for it
        // to close: closing first would reset the connection, and the client could lose the
        // reply's tail, if it sent anything more (a body, pipelined requests).
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        self.state = State::Sent;
        Step::Keep
    }

    /// Reads and drops what the client still sends, until it closes.
    fn drain(&mut self) -> Step {
        let mut chunk = [0u8; 1024];
        // Bounded, so that a client that sends without end does not keep the thread.
        for _ in 0..64 {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Step::Close,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Keep,
                Err(_) => return Step::Close,
            }
        }
        Step::Keep
    }
}

/// The listener and its connections, served by one thread.
struct Server {
    listener: TcpListener,
    registry: Registry,
    conns: Vec<Conn>,
    /// No accepts before this (valed was out of descriptors).
    paused_until: Option<Instant>,
}

impl Server {
    fn new(listener: TcpListener, registry: Registry) -> Server {
        Server {
            listener,
            registry,
            conns: Vec::with_capacity(MAX_CONNS),
            paused_until: None,
        }
    }

    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CONNS + 1);
        loop {
            let now = Instant::now();
            // Past their deadline: hung up on (a request head too slow, a reply not taken).
            for c in &mut self.conns {
                if c.deadline() <= now {
                    c.abort();
                }
            }
            self.conns.retain(|c| !c.closed);
            if self.paused_until.is_some_and(|t| t <= now) {
                self.paused_until = None;
            }
            let wake = self
                .conns
                .iter()
                .map(Conn::deadline)
                .chain(self.paused_until)
                .min();
            let ms = match wake {
                // Rounded up: woken before a deadline, nothing is due and the loop turns again.
                Some(t) => t.saturating_duration_since(now).as_millis() as i32 + 1,
                None => -1,
            };
            fds.clear();
            fds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: if self.paused_until.is_some() {
                    0
                } else {
                    libc::POLLIN
                },
                revents: 0,
            });
            fds.extend(self.conns.iter().map(|c| libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: c.events(),
                revents: 0,
            }));
            // SAFETY: `fds` is a live array of `fds.len()` pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n <= 0 {
                continue;
            }
            for (c, fd) in self.conns.iter_mut().zip(&fds[1..]) {
                if fd.revents == 0 {
                    continue;
                }
                c.closed = matches!(c.step(&self.registry), Step::Close);
            }
            self.bound_replies();
            self.conns.retain(|c| !c.closed);
            if fds[0].revents != 0 {
                self.accept();
            }
        }
    }

    /// Keeps at most [`MAX_REPLIES`] replies held: those that started first are abandoned.
    fn bound_replies(&mut self) {
        let held = |c: &&Conn| c.replying() && !c.closed;
        if self.conns.iter().filter(held).count() <= MAX_REPLIES {
            return;
        }
        let mut held: Vec<Instant> = self.conns.iter().filter(held).map(|c| c.since).collect();
        held.sort_unstable();
        // Those that started before the MAX_REPLIES latest.
        let cut = held[held.len() - MAX_REPLIES];
        tracing::debug!("metrics: more than {MAX_REPLIES} replies held: the oldest abandoned");
        for c in &mut self.conns {
            if c.replying() && c.since < cut {
                c.abort();
            }
        }
    }

    /// Takes the connections waiting at the listener (a burst of them).
    fn accept(&mut self) {
        for _ in 0..ACCEPT_BURST {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors, say: leave the listener alone a little rather than
                    // spin on it, and go on.
                    tracing::debug!("metrics: accept failed: {e}");
                    if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                        self.paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                        return;
                    }
                    continue;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            // A fixed send buffer (the kernel's own grows to megabytes for a client that
            // does not read): what the client has not taken stays in the reply, which the
            // bound on replies holds.
            let size: libc::c_int = SEND_BUFFER as libc::c_int;
            // SAFETY: setsockopt on our own socket with a live int of the size given.
            unsafe {
                libc::setsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_SNDBUF,
                    (&raw const size).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
            if self.conns.len() >= MAX_CONNS {
                // Full: the connection that has waited longest for its request (or, its reply
                // sent, for the client to close) goes.
                let oldest = self
                    .conns
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| !c.replying())
                    .min_by_key(|(_, c)| c.since)
                    .map(|(i, _)| i);
                match oldest {
                    Some(i) => {
                        self.conns[i].abort();
                        self.conns.remove(i);
                    }
                    // Only replies held (not with MAX_REPLIES < MAX_CONNS): the new one goes.
                    None => continue,
                }
            }
            self.conns.push(Conn {
                stream,
                since: Instant::now(),
                state: State::Reading(Vec::with_capacity(512)),
                closed: false,
            });
        }
    }
}

/// The reply to a request head.
fn answer(head: &[u8], registry: &Registry) -> Vec<u8> {
    let Some((method, target)) = request_line(head) else {
        return message("400 Bad Request", "text/plain", b"bad request\n", false);
    };
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return message("405 Method Not Allowed", "text/plain", b"only GET\n", false);
    }
    if path != "/metrics" {
        return message(
            "404 Not Found",
            "text/plain",
            b"not found: metrics are at /metrics\n",
            head_only,
        );
    }
    let mut body = String::with_capacity(64 << 10);
    if prometheus_client::encoding::text::encode(&mut body, registry).is_err() {
        return message(
            "500 Internal Server Error",
            "text/plain",
            b"cannot encode metrics\n",
            head_only,
        );
    }
    message("200 OK", CONTENT_TYPE, body.as_bytes(), head_only)
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

/// A whole reply: status line, headers and (unless `head_only`) `body`.
fn message(status: &str, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let mut out = Vec::with_capacity(head.len() + if head_only { 0 } else { body.len() });
    out.extend_from_slice(head.as_bytes());
    if !head_only {
        out.extend_from_slice(body);
    }
    out
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

//! memif ports: a memif client (DPDK's `net_memif` with `role=client`, VPP's or libmemif's
//! memif in client mode) as a port of the switch, valed being the memif server.
//!
//! The protocol is memif 2.0 as DPDK (`drivers/net/memif`: `memif.h`, `memif_socket.c`,
//! `rte_eth_memif.c`) and VPP (`src/plugins/memif`, `extras/libmemif`) speak it: control
//! messages over a Unix `SOCK_SEQPACKET` socket (`session.rs`), and the frames in shared
//! memory that the client provides (regions: memfds it passes with ADD_REGION), in rings
//! that it lays out there (`ring.rs`: C2S rings carry its frames to valed, S2C rings valed's
//! to it), each with an interrupt eventfd (ADD_RING). The layouts are in `wire.rs`.
//!
//! The client owns the memory, so everything in it is untrusted as a guest's memory is for
//! vhost-user: each ring index, descriptor region, offset and length is checked before use
//! (`ring.rs`), a region that the client shrinks under valed is caught by the same SIGBUS
//! guard as a guest's ([`super::guard`]), and every message is checked (`session.rs`). A
//! bad C2S descriptor costs its frame (the port's bad_input); a broken ring, a bad S2C
//! descriptor, a message out of turn cost the connection (bad_input, one log line), never
//! valed or another port.
//!
//! # The port's thread, and the forwarding threads
//!
//! One thread per port serves the listening socket, the one connection at a time (a second
//! client is told DISCONNECT "already connected"; one that does not finish its handshake
//! within [`session::HANDSHAKE_TIME`] is let go), and the C2S rings of all its queue pairs.
//! Each turn it takes what the client published on every C2S ring straight into the pipeline
//! (the frames stay in the client's buffers until the switch has copied them to their
//! destinations: one copy, [`Steps::ingress_direct`], one source ring per C2S ring so that
//! each keeps its order). Frames toward the client are written into the buffers it gave on
//! its S2C rings by the switch's forwarding threads themselves (`sink.rs`, a
//! [`DirectSink`]: one copy from the sender's buffer; a frame's S2C ring chosen by its MAC
//! addresses, so a flow stays in order); only when a ring is full do they wait in the
//! port's rx ring, which this thread then empties into the client ([`Steps::egress`]).
//!
//! While frames flow the thread polls and sets `MASK_INT` on the C2S rings (the client
//! then writes no eventfd). When the rings of a client that streams ([`STREAM`] frames or
//! more since the thread last asked for interrupts) run dry, the thread naps ([`NAP`], in
//! `epoll_pwait2`, with a timer slack of its own) with `MASK_INT` still set, for up to
//! [`LINGER`] after the last frame: a polling sender's bursts come closer than that, and
//! with `MASK_INT` clear it would write the eventfd after each one (DPDK's `net_memif` does,
//! even when the ring was full and it sent nothing: a system call per try, on the sender's
//! CPU), while a nap leaves the CPU to whoever shares it (the receiver). A client that sends
//! a frame now and then never makes a stream, and is served by interrupts at once. Idle (no
//! stream, or none for `LINGER`), it clears `MASK_INT`, looks at the rings once more and
//! sleeps in `epoll_wait` on the C2S eventfds (edge-triggered, never read: the client owns
//! them and may make them blocking), the port's rx interrupt line, the sockets and its stop
//! line: an idle client costs valed nothing. Toward the client this thread writes the S2C
//! ring's eventfd after frames were published unless the client set `MASK_INT` (a polling
//! client); the switch's threads that wrote them leave that write to it, since a client may
//! make its eventfd blocking and must not hold a thread of the switch.
//!
//! A client that hangs up, dies or says DISCONNECT ends its connection: the port goes down,
//! its mappings and descriptors are let go, what the switch sends to the port is dropped
//! (rx_drops), and the next client is served as the first was.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::socket::SocketName;
use super::{Device, DirectSink, Driver, HostState, Steps};
use crate::epoll;
use crate::offload::Caps;

mod error;
mod ring;
mod session;
mod sink;
mod wire;

use ring::Ring;
use session::{Conn, Live, Served};
use sink::{Out, Shared, Sink};

/// Queue pairs a client may have (rings each way).
pub const MAX_PAIRS: usize = 16;
/// Frames written toward the client per turn.
const EGRESS_BURST: usize = 256;
/// Frames taken since the thread last asked for interrupts that make a stream: when the rings
/// of such a client run dry, the thread naps rather than asking for interrupts at once.
const STREAM: u64 = 64;
/// How long after a stream's last frame the thread keeps napping with `MASK_INT` set.
const LINGER: Duration = Duration::from_micros(500);
/// One nap.
const NAP: Duration = Duration::from_micros(20);
/// The thread's timer slack (the kernel's default, 50 us, would be longer than a nap).
const NAP_SLACK_NS: libc::c_ulong = 2_000;
/// How often a busy thread looks at its sockets.
const CONTROL_EVERY: Duration = Duration::from_millis(1);

/// `memif`: `path` (the control socket valed listens at), `id` (the interface id a client
/// asks for).
pub const KIND: super::Kind = super::Kind {
    name: "memif",
    flag: super::Flag {
        long: "memif",
        value: Some("path"),
        help: "A memif control socket valed listens at, as the memif server",
    },
    about: "--memif PATH makes valed the memif server of a memif client (DPDK's \
'--vdev net_memif0,role=client,socket=PATH,socket-abstract=no', VPP's or libmemif's memif in \
client mode) through the Unix socket PATH, a SOCK_SEQPACKET socket valed makes there (PATH \
must be free or hold a stale socket, which valed replaces; detach removes it). --id N is the \
interface id the client must ask for (default 0). The client provides the shared memory \
and its rings; valed checks every ring index, descriptor and message, serves one client at \
a time with up to 16 queue pairs, polling or interrupt-driven, and the next client after \
one that left or died. The port is down while no client is connected; 'vale-ctl list' \
shows the client and its rings.",
    args: &[
        super::Arg::new(
            "path",
            "PATH",
            "The memif control socket (valed is the server)",
        )
        .shape(super::Shape::Path)
        .required(),
        super::Arg::new(
            "id",
            "N",
            "The memif interface id the client asks for (default 0)",
        )
        .shape(super::Shape::Range(0, u32::MAX as u64)),
    ],
    open: |args| {
        let path = super::required(args, "memif", "path")?;
        let id = match args.get("id") {
            None => 0,
            Some(v) => v.parse::<u32>().map_err(|_| {
                super::Error::invalid(format!("memif id must be 0 to {}, not '{v}'", u32::MAX))
            })?,
        };
        Ok(Box::new(Memif::open(path, id)?))
    },
    saved_args: &[],
    saved: |attached, device, mode| {
        attached.unwrap_or_else(|| {
            let mut a: super::KindArgs = [("path".into(), device.into())].into();
            if let Some(id) = mode.strip_prefix("id ") {
                a.insert("id".into(), id.into());
            }
            a
        })
    },
    // A DPDK memif client connects again by itself.
    restore: |args| (KIND.open)(args),
};

pub struct Memif {
    path: String,
    id: u32,
    listener: OwnedFd,
    /// Removed when the port's thread ends, if still valed's socket.
    _name: SocketName,
    sink: Arc<Sink>,
}

impl Memif {
    pub fn open(path: &str, id: u32) -> Result<Memif, super::Error> {
        if path.is_empty() || path.contains('\0') || !path.starts_with('/') {
            return Err(super::Error::invalid(format!(
                "bad memif socket path '{path}' (an absolute path: valed resolves none)"
            )));
        }
        let (listener, name) =
            super::socket::listen_as(std::path::Path::new(path), libc::SOCK_SEQPACKET)?;
        Ok(Memif {
            path: path.to_string(),
            id,
            listener,
            _name: name,
            sink: Arc::new(
                Sink::new().map_err(|e| super::Error::of_io(format!("memif port: {e}"), e))?,
            ),
        })
    }
}

impl Device for Memif {
    fn describe(&self) -> (&'static str, String, String) {
        ("memif", self.path.clone(), format!("id {}", self.id))
    }
    fn caps(&self) -> Caps {
        Caps::NONE
    }
    fn direct(&self) -> Option<Arc<dyn DirectSink>> {
        Some(self.sink.clone())
    }
    fn driver(self: Box<Self>) -> Box<dyn Driver> {
        self
    }
}

const TOKEN_STOP: u64 = 0;
const TOKEN_IRQ: u64 = 1;
const TOKEN_LISTEN: u64 = 2;
const TOKEN_CTRL: u64 = 3;
const TOKEN_RING: u64 = 4;
const TOKEN_WAKE: u64 = 5;

impl Driver for Memif {
    fn start(
        self: Box<Self>,
        steps: Steps,
        state: Arc<HostState>,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        let ep = epoll::new()?;
        epoll::add(&ep, state.stop.as_raw_fd(), TOKEN_STOP)?;
        epoll::add(&ep, steps.irq_fd(), TOKEN_IRQ)?;
        epoll::add(&ep, self.listener.as_raw_fd(), TOKEN_LISTEN)?;
        epoll::add(&ep, self.sink.wake.as_raw_fd(), TOKEN_WAKE)?;
        state.set_up(steps.port_name(), false, &"no memif client yet");
        let mut srv = Server {
            steps,
            state,
            ep,
            me: *self,
            conn: None,
            live: None,
            pieces: Vec::with_capacity(64),
            masked: true,
            hits_seen: super::guard::hits(),
            reported: false,
        };
        std::thread::Builder::new()
            .name("vale-memif".into())
            .spawn(move || srv.run())
    }
}

/// The port's thread.
struct Server {
    steps: Steps,
    state: Arc<HostState>,
    ep: OwnedFd,
    me: Memif,
    /// The control connection of the moment.
    conn: Option<Conn>,
    /// Its memory and rings, once connected.
    live: Option<Linked>,
    /// The data path's list of a chain's pieces, kept between turns.
    pieces: Vec<(*const u8, u32)>,
    /// valed polls the C2S rings (MASK_INT set in them).
    masked: bool,
    /// [`super::guard::hits`] when last looked at.
    hits_seen: u64,
    /// A bad frame of this connection was logged.
    reported: bool,
}

// SAFETY: the raw pointers in the scratch list only live within one turn.
unsafe impl Send for Server {}

impl Drop for Server {
    fn drop(&mut self) {
        // The port is gone: the switch's threads let go of the client's memory with the batch
        // at hand, though the sink itself may live a little longer.
        self.me.sink.set(None);
    }
}

/// A connected client's rings: the C2S rings, this thread's alone; the memory and the S2C
/// rings, shared with the switch's threads (see `sink.rs`).
struct Linked {
    c2s: Vec<Ring>,
    shared: Arc<Shared>,
}

impl Server {
    fn run(&mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
        let mut last_control = Instant::now();
        let mut last_tick = Instant::now();
        let mut last_moved = Instant::now();
        // Frames taken from the C2S rings since this thread last asked for interrupts.
        let mut streak = 0u64;
        // SAFETY: plain prctl on this thread; the naps below are short, and the kernel's
        // default slack (50 us) would stretch each to several times its length.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, NAP_SLACK_NS) };
        loop {
            if self.state.stopping.load(Relaxed) {
                return;
            }
            let moved_in = self.ingress();
            let (moved_out, blocked) = self.egress();
            let due = self.steps.fire_due();
            self.check_guard();
            if last_tick.elapsed() >= Duration::from_secs(1) {
                last_tick = Instant::now();
                if self.conn.as_ref().is_some_and(Conn::overdue) {
                    self.close(Some(error::Error::Late(session::HANDSHAKE_TIME)));
                }
            }
            if moved_in + moved_out != 0 {
                last_moved = Instant::now();
                streak += moved_in as u64;
                self.mask(true);
                if last_control.elapsed() >= CONTROL_EVERY {
                    last_control = Instant::now();
                    let n = epoll::wait(&self.ep, &mut events, 0).len();
                    if !self.handle(&events[..n]) {
                        return;
                    }
                }
                continue;
            }
            let spinning = last_moved.elapsed() < self.steps.busy_poll;
            // A stream that ran dry: naps with MASK_INT still set (see the module's docs).
            let napping = !spinning
                && streak >= STREAM
                && last_moved.elapsed() < LINGER
                && self.live.is_some();
            // Idle: ask for interrupts, look once more, then sleep.
            if !spinning && !napping {
                self.mask(false);
                streak = 0;
            }
            self.steps.want_irq(true);
            let pending = self.steps.rx_pending() && !blocked
                || self
                    .live
                    .as_ref()
                    .is_some_and(|l| l.c2s.iter().any(Ring::pending));
            let n = if napping && !pending {
                epoll::wait_for(&self.ep, &mut events, NAP).len()
            } else {
                let timeout = crate::drive::sleep_ms(pending || spinning, blocked, due);
                epoll::wait(&self.ep, &mut events, timeout).len()
            };
            self.steps.want_irq(false);
            last_control = Instant::now();
            if !self.handle(&events[..n]) {
                return;
            }
        }
    }

    /// Handles what epoll reported; false when the port is to stop.
    fn handle(&mut self, events: &[libc::epoll_event]) -> bool {
        for ev in events {
            match ev.u64 {
                TOKEN_STOP => return false,
                TOKEN_IRQ => self.steps.drain_irq(),
                TOKEN_LISTEN => self.accept(),
                TOKEN_CTRL => self.serve(),
                TOKEN_WAKE => {
                    vale_abi::eventfd::drain(&self.me.sink.wake);
                    self.kick_for_sink();
                    if let Some(why) = self.me.sink.broken() {
                        self.close(Some(why));
                    }
                }
                _ => {}
            }
        }
        true
    }

    /// Sends the interrupts the switch's threads left to this thread (see `sink.rs`).
    fn kick_for_sink(&mut self) {
        let want = self.me.sink.kicks.swap(0, Relaxed);
        if let (true, Some(l)) = (want != 0, self.live.as_ref()) {
            if let Err(e) = sink::kick(&l.shared, want) {
                self.close(Some(e.into()));
            }
        }
    }

    /// Sets or clears MASK_INT on the C2S rings (valed polls them, or sleeps on them).
    fn mask(&mut self, on: bool) {
        if self.masked == on {
            return;
        }
        self.masked = on;
        if let Some(live) = &self.live {
            for r in &live.c2s {
                r.want_irq(!on);
            }
            if !on {
                // The flags are out before the rings are looked at again (see `run`).
                fence(SeqCst);
            }
        }
    }

    fn accept(&mut self) {
        // A few per turn: a flood of connections waits in the backlog.
        for _ in 0..8 {
            // SAFETY: plain syscall; the descriptor is owned at once.
            let fd = unsafe {
                libc::accept4(
                    self.me.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                return;
            }
            // SAFETY: a fresh descriptor of ours.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let port = self.steps.port_name().to_string();
            if self.conn.is_some() {
                if let Ok(c) = Conn::start(fd, self.me.id, &port) {
                    c.say_disconnect("already connected");
                }
                continue;
            }
            match Conn::start(fd, self.me.id, &port) {
                Ok(c) => {
                    if let Err(e) = epoll::add(&self.ep, c.sock.as_raw_fd(), TOKEN_CTRL) {
                        tracing::error!(port, "memif: cannot watch a client's connection: {e}");
                        continue;
                    }
                    self.conn = Some(c);
                }
                Err(e) => tracing::debug!(port, "memif: a client left at once: {e}"),
            }
        }
    }

    fn serve(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        match conn.serve() {
            Served::Pending => {}
            Served::Closed(why) => self.close(why),
            Served::Connected(live) => self.connected(live),
        }
    }

    fn connected(&mut self, live: Live) {
        let linked = Linked {
            c2s: live.c2s,
            shared: Arc::new(Shared {
                regions: live.regions,
                s2c: live.s2c.into_iter().map(std::sync::Mutex::new).collect(),
            }),
        };
        let (n_c2s, n_s2c, slots) = (
            linked.c2s.len(),
            linked.shared.s2c.len(),
            linked.c2s[0].size,
        );
        for r in &linked.c2s {
            // Polling until the first idle turn.
            r.want_irq(false);
            if let Err(e) = epoll::add_edge(&self.ep, r.irq.as_raw_fd(), TOKEN_RING) {
                self.live = Some(linked);
                self.close(Some(error::Error::Io {
                    what: "cannot watch a ring's eventfd".into(),
                    source: e,
                }));
                return;
            }
        }
        self.masked = true;
        self.reported = false;
        let shown = format!(
            "client '{}' interface '{}', {} C2S and {} S2C rings of {} descriptors",
            live.client, live.if_name, n_c2s, n_s2c, slots
        );
        tracing::info!(port = %self.steps.port_name(), "memif client connected: {shown}");
        *self
            .state
            .negotiated
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = shown;
        self.me.sink.set(Some(linked.shared.clone()));
        self.live = Some(linked);
        self.state.set_up(self.steps.port_name(), true, &"");
    }

    /// Ends the connection: `why` the client broke something (counted, logged, said to it
    /// already), or None (it left).
    fn close(&mut self, why: Option<error::Error>) {
        let port = self.steps.port_name().to_string();
        // The switch's threads let go of the client's memory as they end their batch.
        self.me.sink.set(None);
        if let Some(live) = self.live.take() {
            for r in &live.c2s {
                epoll::del(&self.ep, r.irq.as_raw_fd());
            }
        }
        if let Some(conn) = self.conn.take() {
            if let Some(w) = &why {
                conn.say_disconnect(&w.to_string());
            }
            epoll::del(&self.ep, conn.sock.as_raw_fd());
        }
        self.state
            .negotiated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        match why {
            Some(w) => {
                self.steps.count_bad_input(1);
                tracing::warn!(port, "memif client refused: {w}; connection closed");
                self.state.set_up(&port, false, &w);
            }
            None => self
                .state
                .set_up(&port, false, &"the memif client disconnected"),
        }
    }

    /// A region the client shrank under valed ends the connection.
    fn check_guard(&mut self) {
        let hits = super::guard::hits();
        if self.hits_seen == hits {
            return;
        }
        self.hits_seen = hits;
        if self
            .live
            .as_ref()
            .is_some_and(|l| l.shared.regions.guard.hit())
        {
            self.close(Some(error::Error::Shrunk));
        }
    }

    /// The client's frames into the switch; how many were taken.
    fn ingress(&mut self) -> usize {
        let Some(live) = self.live.as_mut() else {
            return 0;
        };
        let (mut moved, mut bad, mut why, mut broken) = (0, 0, None, None);
        for (q, ring) in live.c2s.iter_mut().enumerate() {
            let regions = &live.shared.regions;
            let pieces = &mut self.pieces;
            let r = self.steps.ingress_direct(q as u32, |batch, limit| {
                ring.gather(regions, batch, limit, pieces)
            });
            match r {
                Ok(g) => {
                    ring.release();
                    moved += g.frames + g.bad as usize;
                    bad += g.bad;
                    if why.is_none() {
                        why = g.why;
                    }
                }
                Err(e) => {
                    broken = Some(e.in_ring("C2S", q));
                    break;
                }
            }
        }
        self.pieces.clear();
        if bad != 0 {
            self.steps.count_bad_input(bad);
            if let (false, Some(w)) = (self.reported, why) {
                self.reported = true;
                tracing::warn!(port = %self.steps.port_name(), "memif client: {w} (counted as bad input; further ones are counted only)");
            }
        }
        if broken.is_some() {
            self.close(broken);
        }
        moved
    }

    /// The frames that waited in the port's rx ring, to the client; how many, and whether
    /// they wait for room.
    fn egress(&mut self) -> (usize, bool) {
        let paused = self.live.is_none();
        let shared = self.live.as_ref().map(|l| l.shared.clone());
        let mut out = Out::new(shared.as_deref());
        let done = self.steps.egress(&mut out, EGRESS_BURST, paused);
        let broken = out.broken.take();
        drop(out);
        if broken.is_some() {
            self.close(broken);
        }
        (done.moved, done.blocked)
    }
}

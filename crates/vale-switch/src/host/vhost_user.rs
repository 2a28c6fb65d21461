//! vhost-user ports: a virtual machine (QEMU's `-netdev vhost-user`, any vhost-user front end)
//! as a port of the switch, valed being the virtio-net device.
//!
//! The protocol and the virtqueues are the rust-vmm crates' (`vhost-user-backend`,
//! `virtio-queue`, `vm-memory`). The library runs its own threads: one that answers the front
//! end's messages, and a worker per queue pair that sleeps on its queues' kick eventfds (pair
//! 0's also on the port's rx interrupt line) and on a timer, and calls [`Net::handle_event`],
//! which runs the port's [`Steps`] both ways. The port's own driver thread only waits for a front end (listening at
//! the socket, or connecting to it) and for the end of the connection or of the port.
//!
//! Negotiated: VERSION_1 (12-byte header), checksum and TCP segmentation offload both ways
//! (CSUM, HOST_TSO4/6, HOST_ECN; GUEST_CSUM, GUEST_TSO4/6, GUEST_ECN), merged rx buffers
//! (MRG_RXBUF), the event index (EVENT_IDX: notification suppression both ways), queue pairs
//! (MQ: 4 offered unless the port's `queues` says otherwise, up to 16, a library worker each),
//! the MTU and STATUS. What the guest acks becomes the port's offload capabilities ([`Caps`]):
//! a TSO segment crosses the switch whole toward a port that takes it, and is cut in software
//! toward one that does not.
//!
//! Guest memory is reached only through vm-memory's checked accessors: a descriptor outside
//! the guest's memory, a chain that loops or is cut, a header split anywhere, a frame too short
//! or too long, an offload request the guest did not negotiate or whose checksum fields point
//! outside the frame, or rx buffers too small cost a counted drop (the port's bad_input) and
//! one log line per connection, never a crash or a touch of memory outside the guest's.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Listener;
use vhost_user_backend::{
    VhostUserBackend, VhostUserDaemon, VringEpollHandler, VringMutex, VringState, VringT,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{
    Address, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion, MemoryRegionAddress,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use vale_abi::eventfd;

use super::guard::{self, Guarded};
use super::socket::SocketName;
use super::virtq::{
    guest_piece, guest_range, read_guest, write_guest, Desc, Popped, Virtq, VirtqError,
};
use super::{DevError, Device, Driver, Egress, HostState, Steps};
use crate::epoll;
use crate::forward::Pipeline;
use crate::kind::{Delivered, DirectSink, OutFrames};
use crate::offload::{self, Caps, Offload};
use crate::port::PortShared;
use vale_abi::region::{MAX_FRAGS, MAX_FRAME_LEN};

/// The virtio-net header of virtio 1.0 (`struct virtio_net_hdr_v1`): 12 bytes.
const HDR_LEN: usize = 12;
/// Largest frame taken from a guest: a TSO segment of 64 KiB.
const MAX_GUEST_FRAME: usize = MAX_FRAME_LEN as usize;
/// The virtio-net features offered (besides VERSION_1 and vhost-user's protocol features).
const NET_FEATURES: &[u32] = &[
    VIRTIO_NET_F_CSUM,
    VIRTIO_NET_F_GUEST_CSUM,
    VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_ECN,
    VIRTIO_NET_F_HOST_TSO4,
    VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_HOST_ECN,
    VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_NET_F_MQ,
    VIRTIO_NET_F_MTU,
    VIRTIO_NET_F_STATUS,
];

/// The name of a feature of [`NET_FEATURES`], as the virtio spec writes it.
fn feature_name(bit: u32) -> &'static str {
    match bit {
        VIRTIO_NET_F_CSUM => "csum",
        VIRTIO_NET_F_GUEST_CSUM => "guest_csum",
        VIRTIO_NET_F_GUEST_TSO4 => "guest_tso4",
        VIRTIO_NET_F_GUEST_TSO6 => "guest_tso6",
        VIRTIO_NET_F_GUEST_ECN => "guest_ecn",
        VIRTIO_NET_F_HOST_TSO4 => "host_tso4",
        VIRTIO_NET_F_HOST_TSO6 => "host_tso6",
        VIRTIO_NET_F_HOST_ECN => "host_ecn",
        VIRTIO_NET_F_MRG_RXBUF => "mrg_rxbuf",
        VIRTIO_RING_F_EVENT_IDX => "event_idx",
        VIRTIO_NET_F_MQ => "mq",
        VIRTIO_NET_F_MTU => "mtu",
        VIRTIO_NET_F_STATUS => "status",
        _ => "?",
    }
}

fn has(features: u64, bit: u32) -> bool {
    features & (1u64 << bit) != 0
}

/// What the guest acked, as the data path needs it.
#[derive(Clone, Copy, Default)]
struct Acked {
    /// The guest may send partial checksums, and TSO segments of these kinds.
    tx_csum: bool,
    tx_tso4: bool,
    tx_tso6: bool,
    tx_ecn: bool,
    /// A frame toward the guest may span several rx chains.
    mrg_rxbuf: bool,
    /// Longest frame without segmentation either way: the MTU the front end set plus an
    /// Ethernet header and a VLAN tag, once the guest acked VIRTIO_NET_F_MTU (the virtio
    /// spec: the driver sends nothing longer, the device delivers nothing longer).
    max_frame: usize,
}

impl Acked {
    /// `f`: the features acked; `mtu`: what the front end set (0: none).
    fn of(f: u64, mtu: u32) -> Acked {
        let tx_csum = has(f, VIRTIO_NET_F_CSUM);
        Acked {
            tx_csum,
            tx_tso4: tx_csum && has(f, VIRTIO_NET_F_HOST_TSO4),
            tx_tso6: tx_csum && has(f, VIRTIO_NET_F_HOST_TSO6),
            tx_ecn: tx_csum && has(f, VIRTIO_NET_F_HOST_ECN),
            mrg_rxbuf: has(f, VIRTIO_NET_F_MRG_RXBUF),
            max_frame: match mtu {
                m if m != 0 && has(f, VIRTIO_NET_F_MTU) => m as usize + MTU_OVERHEAD,
                _ => MAX_GUEST_FRAME,
            },
        }
    }

    /// The port's capabilities toward the guest.
    fn caps(f: u64) -> Caps {
        let csum = has(f, VIRTIO_NET_F_GUEST_CSUM);
        Caps::NONE
            .with(Caps::CSUM, csum)
            .with(Caps::TSO4, csum && has(f, VIRTIO_NET_F_GUEST_TSO4))
            .with(Caps::TSO6, csum && has(f, VIRTIO_NET_F_GUEST_TSO6))
            .with(Caps::ECN, csum && has(f, VIRTIO_NET_F_GUEST_ECN))
    }

    /// The offload request of a guest's tx header, checked against what the guest negotiated
    /// and against the frame's length (`flen`): None for a finished frame.
    fn offload(&self, hdr: &[u8; HDR_LEN], flen: usize) -> Result<Option<Offload>, Bad> {
        let mut h = [0u8; offload::VNET_HDR_LEN];
        h.copy_from_slice(&hdr[..offload::VNET_HDR_LEN]);
        let mut off = Offload::from_virtio(&h);
        // DATA_VALID and unknown bits mean nothing from a driver.
        off.flags &= offload::F_NEEDS_CSUM;
        let ecn = off.gso_type & offload::GSO_ECN != 0;
        let allowed = match off.gso_type & !offload::GSO_ECN {
            offload::GSO_NONE => !ecn,
            offload::GSO_TCPV4 => self.tx_tso4 && (!ecn || self.tx_ecn),
            offload::GSO_TCPV6 => self.tx_tso6 && (!ecn || self.tx_ecn),
            _ => false,
        };
        let csum = off.flags & offload::F_NEEDS_CSUM != 0;
        let segment = off.gso_type != offload::GSO_NONE;
        if !allowed || (csum && !self.tx_csum) || (segment && (!csum || off.gso_size == 0)) {
            return Err(Bad::Offload(off));
        }
        if csum && off.csum_start as usize + off.csum_offset as usize + 2 > flen {
            return Err(Bad::Offload(off));
        }
        Ok(off.needs_work().then_some(off))
    }
}
/// What a frame may hold beyond its MTU: an Ethernet header and a VLAN tag.
const MTU_OVERHEAD: usize = 18;
/// Largest MTU a front end may set: the largest frame less [`MTU_OVERHEAD`].
const MAX_MTU: u64 = (MAX_FRAME_LEN as usize - MTU_OVERHEAD) as u64;
/// Descriptors per queue a front end may ask for.
const QUEUE_SIZE: usize = 1024;
/// Frames moved per step before the other direction gets its turn.
const BURST: usize = 256;

/// Queue pairs a port offers unless its `queues` argument says otherwise, and at most.
pub const DEFAULT_PAIRS: usize = 4;
pub const MAX_PAIRS: usize = 16;

/// The queues of pair `p`: receive (toward the guest) and transmit.
fn rxq(p: usize) -> usize {
    2 * p
}
fn txq(p: usize) -> usize {
    2 * p + 1
}

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;
type Vring = VringMutex<Mem>;

/// `vhost-user`: `path` (the socket), `client` (yes: valed connects to a front end listening
/// there; no: valed listens there), `queues` (queue pairs offered, 1 to [`MAX_PAIRS`]).
pub const KIND: super::Kind = super::Kind {
    name: "vhost-user",
    args: &["path", "client", "queues"],
    open: |args| {
        let path = super::required(args, "vhost-user", "path")?;
        let pairs = match args.get("queues") {
            None => DEFAULT_PAIRS,
            Some(q) => match q.parse::<usize>() {
                Ok(n @ 1..=MAX_PAIRS) => n,
                _ => return Err(format!("queues must be 1 to {MAX_PAIRS}, not '{q}'")),
            },
        };
        Ok(Box::new(VhostUser::open(
            path,
            super::flag(args, "client")?,
            pairs,
        )?))
    },
};

pub struct VhostUser {
    path: String,
    client: bool,
    /// Queue pairs offered.
    pairs: usize,
    /// Server mode: bound at attach time, so a bad path fails the attach; and its name,
    /// removed at detach if it is still the socket bound (see [`super::socket`]).
    listener: Option<(Listener, SocketName)>,
    sink: Arc<RxSink>,
}

/// The way from the switch's forwarding threads straight into the guest's rx buffers (one
/// copy, no hand-over to the port's thread): the device of the connection of the moment.
#[derive(Default)]
struct RxSink {
    net: Mutex<Option<Net>>,
}

impl DirectSink for RxSink {
    fn send_batch(&self, frames: &mut dyn OutFrames, flow: u32) -> Delivered {
        let net = lock(&self.net).clone();
        match net {
            Some(net) => net.deliver(frames, flow),
            None => {
                // No guest: the frames are dropped (counted by the switch).
                let mut d = Delivered::default();
                while frames.next_frame().is_some() {
                    d.dropped += 1;
                }
                d
            }
        }
    }
}

impl VhostUser {
    pub fn open(path: &str, client: bool, pairs: usize) -> Result<VhostUser, String> {
        if path.is_empty() || path.contains('\0') {
            return Err(format!("bad vhost-user socket path '{path}'"));
        }
        // Client mode creates and removes nothing at `path`; server mode binds only a free
        // name or a stale socket, and never replaces anything else (see [`super::socket`]).
        let listener = if client {
            None
        } else {
            let (l, name) = super::socket::listen(std::path::Path::new(path))?;
            l.set_nonblocking(true)
                .map_err(|e| format!("cannot listen at '{path}': {e}"))?;
            // The library's listener, without a name of its own: it would remove whatever
            // is at `path` when dropped.
            Some((Listener::from(l), name))
        };
        Ok(VhostUser {
            path: path.to_string(),
            client,
            pairs,
            listener,
            sink: Arc::new(RxSink::default()),
        })
    }
}

impl Device for VhostUser {
    fn describe(&self) -> (&'static str, String, String) {
        let role = if self.client { "client" } else { "server" };
        ("vhost-user", self.path.clone(), role.to_string())
    }
    fn caps(&self) -> Caps {
        // None until a guest acks its features.
        Caps::NONE
    }
    fn direct(&self) -> Option<Arc<dyn DirectSink>> {
        Some(self.sink.clone())
    }
    fn driver(self: Box<Self>) -> Box<dyn Driver> {
        Box::new(Session {
            path: self.path,
            pairs: self.pairs,
            listener: self.listener,
            sink: self.sink,
        })
    }
}

/// The port's driver: one front end after the other, until the port is detached.
struct Session {
    path: String,
    pairs: usize,
    /// None: client mode.
    listener: Option<(Listener, SocketName)>,
    sink: Arc<RxSink>,
}

const TOKEN_STOP: u64 = 0;
const TOKEN_OTHER: u64 = 1;

impl Driver for Session {
    fn start(
        self: Box<Self>,
        steps: Steps,
        state: Arc<HostState>,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        let ep = epoll::new()?;
        epoll::add(&ep, state.stop.as_raw_fd(), TOKEN_STOP)?;
        if let Some((l, _)) = &self.listener {
            epoll::add(&ep, l.as_raw_fd(), TOKEN_OTHER)?;
        }
        // No front end yet.
        state.up.store(false, Relaxed);
        let steps = Arc::new(Mutex::new(steps));
        std::thread::Builder::new()
            .name("vale-vhost-user".into())
            .spawn(move || self.run(ep, steps, state))
    }
}

/// How long a detach waits for the library's threads to end.
const STOP_LIMIT_MS: i32 = 3000;

/// Whether `fd` is ready for `events` (`POLLIN`, `POLLOUT`) within `ms` (0: now).
fn poll_one(fd: RawFd, events: i16, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd of ours.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & events != 0 }
}

/// Interrupts the guest on the queue of `st`, unless its call eventfd cannot take a write
/// without waiting (a counter the front end filled: an interrupt is pending anyway). The
/// front end owns that descriptor's flags, so a plain write could stop this thread for as
/// long as the front end likes.
fn signal_guest(st: &VringState<Mem>) {
    let Some(call) = st.get_call() else { return };
    if poll_one(call.as_raw_fd(), libc::POLLOUT, 0) {
        let _ = call.notify();
    }
}

/// Waits on `ep` for `ms` (-1: for ever): true when the port is stopping.
fn wait_stop(ep: &OwnedFd, ms: i32, state: &HostState) -> bool {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
    let n = epoll::wait(ep, &mut events, ms).len();
    state.stopping.load(Relaxed) || events[..n].iter().any(|e| e.u64 == TOKEN_STOP)
}

impl Session {
    fn run(mut self, ep: OwnedFd, steps: Arc<Mutex<Steps>>, state: Arc<HostState>) {
        let name = lock(&steps).port_name().to_string();
        while !state.stopping.load(Relaxed) {
            let net = match Net::new(steps.clone(), state.clone(), self.pairs) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(port = %name, "vhost-user: cannot set up the device: {e}");
                    return;
                }
            };
            let mem = net.0.mem.clone();
            let mut daemon = match VhostUserDaemon::new("vale-vhost-user".into(), net.clone(), mem)
            {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(port = %name, "vhost-user: cannot start: {e}");
                    return;
                }
            };
            // The library runs one worker per queue pair. Pair 0's also sleeps on the port's
            // rx interrupt line and on the timer of deferred interrupts toward the guest; each
            // on the timer of its own deferred interrupts toward other ports.
            let handlers = daemon.get_epoll_handlers();
            let mut watch = vec![
                (0, net.0.irq_fd, net.ev_irq()),
                (0, net.0.guest_timer.as_raw_fd(), net.ev_guest_timer()),
            ];
            for (p, pair) in net.0.pairs.iter().enumerate() {
                watch.push((p, pair.timer.as_raw_fd(), net.ev_timer()));
            }
            for (p, fd, ev) in watch {
                let r = handlers
                    .get(p)
                    .map(|h| h.register_listener(fd, EventSet::IN, ev as u64));
                if !matches!(r, Some(Ok(()))) {
                    tracing::error!(port = %name, "vhost-user: cannot watch the port: {r:?}");
                    return;
                }
            }
            *lock(&net.0.handlers) = handlers.iter().map(Arc::downgrade).collect();
            drop(handlers);
            // A front end: accept one, or connect to it.
            let front = loop {
                if state.stopping.load(Relaxed) {
                    return;
                }
                match &mut self.listener {
                    Some((l, _)) => {
                        if wait_stop(&ep, -1, &state) {
                            return;
                        }
                        match l.accept() {
                            Ok(Some(s)) => break s,
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(port = %name, "vhost-user: accept: {e}");
                                if wait_stop(&ep, 100, &state) {
                                    return;
                                }
                            }
                        }
                    }
                    None => match std::os::unix::net::UnixStream::connect(&self.path) {
                        Ok(s) => break s,
                        Err(_) => {
                            // The front end is not listening yet: try again soon.
                            if wait_stop(&ep, 200, &state) {
                                return;
                            }
                        }
                    },
                }
            };
            let _ = front.set_nonblocking(false);
            *lock(&net.0.front) = front.try_clone().ok();
            {
                // Frames delivered while nobody was there are stale: dropped, not handed over.
                let mut s = lock(&steps);
                while s.egress(&mut Nowhere, usize::MAX, true).moved != 0 {}
                // Until this guest acks its features, it takes no offload work.
                s.set_caps(Caps::NONE);
                s.want_irq(true);
                // From now on frames for the guest are kept for it (in the port's rx ring
                // until its queues are ready), not dropped: before the front end can finish
                // its set-up and start sending.
                *lock(&self.sink.net) = Some(net.clone());
            }
            let relay = relay::backend_pair().and_then(|(mut l, back, _dir)| {
                daemon
                    .start(&mut l)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                let (net2, net3) = (net.clone(), net.clone());
                let answers = relay::Answers {
                    pairs: self.pairs as u64,
                    set_mtu: Box::new(move |mtu| net2.set_mtu(mtu)),
                    kick: Box::new(move |q, fd| net3.take_kick(q, fd)),
                };
                relay::Relay::start(front, back, &name, answers)
            });
            let relay = match relay {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(port = %name, "vhost-user: cannot serve the front end: {e}");
                    *lock(&self.sink.net) = None;
                    lock(&steps).want_irq(false);
                    continue;
                }
            };
            tracing::info!(port = %name, path = %self.path, "vhost-user front end connected");
            state.set_up(&name, true, &"");
            let Some(shutdown) = daemon.shutdown_handle() else {
                relay.join();
                continue;
            };
            let done = match eventfd::new() {
                Ok(fd) => Arc::new(fd),
                Err(e) => {
                    tracing::error!(port = %name, "vhost-user: {e}");
                    shutdown.shutdown();
                    relay.join();
                    return;
                }
            };
            let done2 = done.clone();
            let net2 = net.clone();
            let waiter = std::thread::Builder::new()
                .name("vale-vhost-wait".into())
                .spawn(move || {
                    let r = daemon.wait();
                    // Dropping the daemon ends and joins the library's worker thread: the
                    // queues and the guest's memory are let go now.
                    drop(daemon);
                    net2.close_forgotten();
                    eventfd::signal(&*done2);
                    r
                });
            let waiter = match waiter {
                Ok(w) => w,
                Err(e) => {
                    tracing::error!(port = %name, "vhost-user: {e}");
                    shutdown.shutdown();
                    relay.join();
                    return;
                }
            };
            let wait_ep = match epoll::new() {
                Ok(w) => w,
                Err(_) => {
                    shutdown.shutdown();
                    relay.join();
                    let _ = waiter.join();
                    return;
                }
            };
            let _ = epoll::add(&wait_ep, state.stop.as_raw_fd(), TOKEN_STOP);
            let _ = epoll::add(&wait_ep, done.as_raw_fd(), TOKEN_OTHER);
            let stopping = loop {
                if wait_stop(&wait_ep, 1000, &state) {
                    break true;
                }
                if eventfd::drain(&*done) != 0 {
                    break false;
                }
            };
            *lock(&self.sink.net) = None;
            if stopping {
                shutdown.shutdown();
                // The library's worker ends at its next wake-up, unless the front end holds it
                // in a blocking read or write of a descriptor it shares (their flags are the
                // front end's to change). Then its threads are left behind, so that detaching
                // never waits on a guest.
                if !poll_one(done.as_raw_fd(), libc::POLLIN, STOP_LIMIT_MS) {
                    tracing::error!(port = %name, "vhost-user: the front end holds the port's worker thread (a blocking eventfd of its own); leaving it behind");
                    relay.join();
                    return;
                }
            }
            relay.join();
            match waiter.join() {
                Ok(Ok(())) | Err(_) => {}
                Ok(Err(e)) => tracing::info!(port = %name, "vhost-user connection: {e}"),
            }
            drop(net);
            if stopping {
                return;
            }
            tracing::info!(port = %name, "vhost-user front end went away");
            state.set_up(&name, false, &"the front end went away");
            lock(&state.negotiated).clear();
            // What the switch delivered for the old guest is dropped, not handed to the next.
            let mut s = lock(&steps);
            s.want_irq(false);
            while s.egress(&mut Nowhere, usize::MAX, true).moved != 0 {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where frames go while no guest is there (never called: the egress step drops them).
struct Nowhere;

impl Egress for Nowhere {
    fn send(&mut self, _pieces: &[&[u8]], _off: Offload) -> Result<bool, DevError> {
        Err(DevError::Frame(io::Error::from_raw_os_error(libc::ENODEV)))
    }
    fn flush(&mut self) -> Result<(), DevError> {
        Ok(())
    }
}

/// The virtio-net device of one connection, as the library sees it.
#[derive(Clone)]
struct Net(Arc<NetInner>);

struct NetInner {
    /// One per queue pair, each served by its own library worker.
    pairs: Vec<Pair>,
    /// The guest's memory, as the library maps it from the front end's table.
    mem: Mem,
    irq_fd: RawFd,
    /// A hostile or broken guest was reported once on this connection.
    reported: AtomicBool,
    /// The virtio features the guest acked.
    features: AtomicU64,
    /// The MTU the front end set (0: none).
    mtu: std::sync::atomic::AtomicU32,
    /// The pairs whose queues the guest enabled (a bit each), as last seen by their workers.
    enabled: std::sync::atomic::AtomicU32,
    port: String,
    /// What `vale-ctl list` shows of the port.
    state: Arc<HostState>,
    /// The port's moderation knob, among others.
    shared: Arc<PortShared>,
    /// Interrupt moderation toward the guest, per queue: when it was last interrupted
    /// (nanoseconds since `epoch`), and whether an interrupt waits for the interval's end
    /// (the guest timer is armed for it).
    irq_last: Vec<AtomicU64>,
    irq_pending: Vec<AtomicBool>,
    epoch: std::time::Instant,
    /// Armed for the first deferred interrupt to the guest.
    guest_timer: OwnedFd,
    /// Descriptors the library takes over and never closes (see `exit_event`).
    forgotten: Mutex<Vec<RawFd>>,
    /// The mappings of the guest's memory tables, guarded against the front end shrinking
    /// them (see [`super::guard`]) for as long as they are mapped.
    guarded: Tables,
    /// [`guard::hits`] when last looked at.
    hits_seen: AtomicU64,
    /// The front end shrank the guest's memory: nothing more is read or written there.
    broken: AtomicBool,
    /// The connection, to end it from the data path.
    front: Mutex<Option<std::os::unix::net::UnixStream>>,
    /// The library's worker of each pair (not kept alive from here: they hold this device).
    handlers: Mutex<Vec<std::sync::Weak<VringEpollHandler<Net>>>>,
    /// The front end's kick eventfd of each queue (see `take_kick`).
    kicks: Mutex<Vec<Option<OwnedFd>>>,
}

/// The guest memory tables of a connection that valed maps, each guarded (see
/// [`super::guard`]) for exactly as long as it is mapped.
///
/// A table is mapped while anyone holds it: the library's current table, a worker in the
/// middle of a pass over an older one. Its guard must go before its mapping: a range left
/// registered after it was unmapped is soon another mapping's (mmap hands the same addresses
/// out again: another guest's memory, another port's rings), and a SIGBUS in any file mapping
/// that then lies in it made the handler map zero pages over the whole old range, over what
/// lives there now. So each table is held here with its guard, and let go (the guard first,
/// then the mapping) once nobody else holds it, as seen at the next table change or at the
/// connection's end: an old table may stay mapped until then, which costs only addresses.
#[derive(Default)]
pub(super) struct Tables(Mutex<Vec<Table>>);

/// A memory table and the guard of its ranges; the guard is dropped first (field order).
struct Table {
    guard: Guarded,
    mem: Arc<GuestMemoryMmap>,
}

impl Tables {
    /// Guards the table `mem` has now (once); lets go of those only this list still holds.
    pub(super) fn track(&self, mem: &Mem) {
        let now = mem.memory().into_inner();
        let mut list = lock(&self.0);
        list.retain(|t| Arc::strong_count(&t.mem) > 1);
        if list.iter().any(|t| Arc::ptr_eq(&t.mem, &now)) {
            return;
        }
        let ranges = now.iter().filter_map(|r| {
            let p = r.get_host_address(MemoryRegionAddress(0)).ok()?;
            Some((p as usize, r.len() as usize))
        });
        let guard = Guarded::new(ranges);
        list.push(Table { guard, mem: now });
    }

    /// Whether the handler found one of the tables' ranges shrunk.
    pub(super) fn hit(&self) -> bool {
        lock(&self.0).iter().any(|t| t.guard.hit())
    }

    /// How many tables are held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

/// A queue pair's own: what its worker forwards with, and scratch space.
struct Pair {
    /// The port's steps: pair 0 has the port's own (it also empties the port's rx ring
    /// toward the guest); the others a pipeline of their own for their transmit queue.
    steps: Arc<Mutex<Steps>>,
    /// Armed when this pair's forwarding deferred interrupts toward other ports (moderation).
    timer: OwnedFd,
    /// Its queues, receive and transmit, once the library has shown them to its worker.
    queues: std::sync::OnceLock<[Vring; 2]>,
    /// The data path's lists (descriptors, chains, a frame's pieces), kept between frames so
    /// that it allocates nothing once they have grown; the receive side's is used by whoever
    /// fills this pair's receive queue.
    scratch: Mutex<Scratch>,
}

#[derive(Default)]
struct Scratch {
    /// The guest transmit path's.
    tx: TxScratch,
    /// The pieces of the frame being written (see [`crate::forward::recycle`]).
    pieces: Vec<&'static [u8]>,
    /// The rx chains a frame toward the guest is written into: head index and how many of
    /// `descs` belong to it.
    chains: Vec<(u16, usize)>,
    /// Their descriptors.
    descs: Vec<Desc>,
}

impl Net {
    fn new(steps: Arc<Mutex<Steps>>, state: Arc<HostState>, pairs: usize) -> io::Result<Net> {
        let (irq_fd, port, shared) = {
            let s = lock(&steps);
            (s.irq_fd(), s.port_name().to_string(), s.shared())
        };
        let mut list = Vec::with_capacity(pairs);
        for p in 0..pairs {
            let steps = if p == 0 {
                steps.clone()
            } else {
                Arc::new(Mutex::new(lock(&steps).fork()))
            };
            list.push(Pair {
                steps,
                timer: epoll::new_timer()?,
                queues: std::sync::OnceLock::new(),
                scratch: Mutex::new(Scratch::default()),
            });
        }
        let queues = 2 * pairs;
        Ok(Net(Arc::new(NetInner {
            pairs: list,
            mem: GuestMemoryAtomic::new(GuestMemoryMmap::new()),
            irq_fd,
            reported: AtomicBool::new(false),
            features: AtomicU64::new(0),
            mtu: Default::default(),
            enabled: Default::default(),
            port,
            state,
            shared,
            irq_last: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            irq_pending: (0..queues).map(|_| AtomicBool::new(false)).collect(),
            epoch: std::time::Instant::now(),
            guest_timer: epoll::new_timer()?,
            forgotten: Mutex::new(Vec::new()),
            guarded: Tables::default(),
            hits_seen: AtomicU64::new(guard::hits()),
            broken: AtomicBool::new(false),
            front: Mutex::new(None),
            handlers: Mutex::new(Vec::new()),
            kicks: Mutex::new((0..queues).map(|_| None).collect()),
        })))
    }

    fn queues(&self) -> usize {
        2 * self.0.pairs.len()
    }

    /// Event ids of the workers' own descriptors (0..=queues are the library's).
    fn ev_irq(&self) -> u16 {
        self.queues() as u16 + 1
    }
    fn ev_timer(&self) -> u16 {
        self.queues() as u16 + 2
    }
    fn ev_guest_timer(&self) -> u16 {
        self.queues() as u16 + 3
    }
    fn ev_kick(&self) -> u16 {
        self.queues() as u16 + 4
    }

    /// The front end's kick eventfd of queue `index` (SET_VRING_KICK), which the library
    /// would read: the front end owns its flags and may make it blocking and read it itself,
    /// and the library's read would then wait for ever, holding the queue's lock, and with it
    /// every thread that delivers to this guest. Instead the queue's pair worker watches it
    /// edge-triggered (each write is an event) and never reads it, and the library gets an
    /// eventfd of valed's own that nobody writes. What the library is to get.
    fn take_kick(&self, index: u8, fd: OwnedFd) -> io::Result<OwnedFd> {
        let q = index as usize;
        let handler = lock(&self.0.handlers).get(q / 2).and_then(|h| h.upgrade());
        let (Some(handler), true) = (handler, q < self.queues()) else {
            // A queue the device does not have: the library refuses the message.
            return Ok(fd);
        };
        let et = EventSet::IN | EventSet::EDGE_TRIGGERED;
        let ev = self.ev_kick() as u64;
        let mut kicks = lock(&self.0.kicks);
        if let Some(old) = kicks[q].take() {
            let _ = handler.unregister_listener(old.as_raw_fd(), et, ev);
        }
        handler.register_listener(fd.as_raw_fd(), et, ev)?;
        kicks[q] = Some(fd);
        eventfd::new()
    }

    /// Closes the descriptors the library forgot, once its daemon (and the worker threads that
    /// used them) is gone. Each is checked to still be an eventfd first.
    fn close_forgotten(&self) {
        for fd in lock(&self.0.forgotten).drain(..) {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}"));
            if link.is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]") {
                // SAFETY: the library gave up this descriptor (into_raw_fd) and its only
                // user, a worker thread, has been joined.
                unsafe { libc::close(fd) };
            }
        }
    }

    /// Counts `n` malformed inputs; the first of a connection is logged.
    fn bad(&self, steps: &Steps, n: u64, why: &dyn std::fmt::Display) {
        if n != 0 {
            steps.count_bad_input(n);
            self.report(why);
        }
    }

    /// Interrupts the guest on queue `q` (of `st`), or, with the port's moderation knob set
    /// and the last interrupt less than an interval ago, once the interval is over: any
    /// thread may call this; pair 0's worker fires what waits (see `fire_deferred`).
    fn interrupt(&self, st: &VringState<Mem>, q: usize) {
        let m = self.0.shared.moderation_ns.load(Relaxed);
        if m == 0 {
            signal_guest(st);
            return;
        }
        let now = self.0.epoch.elapsed().as_nanos() as u64;
        let last = self.0.irq_last[q].load(Relaxed);
        if now.saturating_sub(last) >= m {
            self.0.irq_last[q].store(now, Relaxed);
            self.0.irq_pending[q].store(false, Relaxed);
            signal_guest(st);
        } else if !self.0.irq_pending[q].swap(true, Relaxed) {
            epoll::arm_timer(&self.0.guest_timer, (last + m - now).max(1000));
        }
    }

    /// Sends the deferred interrupts whose interval is over; re-arms the guest timer for the
    /// rest.
    fn fire_deferred(&self) {
        let m = self.0.shared.moderation_ns.load(Relaxed);
        let mut next = u64::MAX;
        // Queue 2p + k is pair p's k-th (receive, transmit).
        let queues = self.0.pairs.iter().enumerate().filter_map(|(p, pair)| {
            let [rx, tx] = pair.queues.get()?;
            Some([(rxq(p), rx), (txq(p), tx)])
        });
        for (q, vring) in queues.flatten() {
            if !self.0.irq_pending[q].load(Relaxed) {
                continue;
            }
            let now = self.0.epoch.elapsed().as_nanos() as u64;
            let last = self.0.irq_last[q].load(Relaxed);
            if now.saturating_sub(last) >= m && self.0.irq_pending[q].swap(false, Relaxed) {
                self.0.irq_last[q].store(now, Relaxed);
                signal_guest(&vring.get_ref());
            } else if self.0.irq_pending[q].load(Relaxed) {
                next = next.min(last + m - now);
            }
        }
        if next != u64::MAX {
            epoll::arm_timer(&self.0.guest_timer, next.max(1000));
        }
    }

    /// Guards the mappings of the memory table the library has now.
    fn guard_memory(&self) {
        self.0.guarded.track(&self.0.mem);
    }

    /// Whether the front end shrank the guest's memory under valed; the first time it is
    /// seen, the connection ends with one log line.
    fn shrank(&self) -> bool {
        if self.0.broken.load(Relaxed) {
            return true;
        }
        let hits = guard::hits();
        if self.0.hits_seen.swap(hits, Relaxed) == hits {
            return false;
        }
        if !self.0.guarded.hit() {
            return false;
        }
        if !self.0.broken.swap(true, Relaxed) {
            tracing::error!(port = %self.0.port, "vhost-user: the front end shrank the guest's memory under valed; connection closed");
            // Not through the steps, whose lock a worker may hold here.
            crate::port::add(&self.0.shared.stats.bad_input, 1);
            if let Some(f) = lock(&self.0.front).as_ref() {
                let _ = f.shutdown(std::net::Shutdown::Both);
            }
        }
        true
    }

    /// Logs the first malformed input of a connection.
    fn report(&self, why: &dyn std::fmt::Display) {
        if !self.0.reported.swap(true, Relaxed) {
            tracing::warn!(port = %self.0.port, "vhost-user guest: {why} (counted as bad input; further ones are counted only)");
        }
    }

    /// The pair whose receive queue takes frames of `flow` (see [`pair_of`]).
    fn rx_pair(&self, flow: u32) -> usize {
        pair_of(flow, self.0.enabled.load(Relaxed))
    }

    /// A forwarding thread's batch for the guest, straight into its rx buffers (of the queue
    /// of `flow`). Declines the rest when the guest has no buffers there now: those frames
    /// wait in the port's rx ring, and pair 0's worker sends them once the guest adds buffers
    /// (it kicks).
    fn deliver(&self, frames: &mut dyn OutFrames, flow: u32) -> Delivered {
        let mut d = Delivered::default();
        if self.shrank() {
            while frames.next_frame().is_some() {
                d.dropped += 1;
            }
            return d;
        }
        let p = self.rx_pair(flow);
        let Some([vring, _]) = self.0.pairs[p].queues.get() else {
            // No queues yet: the ring keeps the frames for the guest.
            d.declined = true;
            return d;
        };
        let ready = {
            let st = vring.get_ref();
            st.is_enabled() && st.get_queue().ready()
        };
        if !ready {
            if p != 0 && self.0.enabled.fetch_and(!(1 << p), Relaxed) & 1 << p != 0 {
                // The guest gave this pair up (fewer CPUs, `ethtool -L`): flows go to the
                // pairs it still uses from the next batch on.
                self.describe();
            }
            d.declined = true;
            return d;
        }
        let mem = self.0.mem.memory();
        let acked = self.acked_now();
        let pass = self.rx_pass(p, &mut vring.get_mut(), &mem, &acked, |out| {
            let mut pieces: Vec<&[u8]> = std::mem::take(&mut out.scratch.pieces);
            while let Some(f) = frames.next_frame() {
                pieces.clear();
                // SAFETY: the pipeline's iovecs point at live frame pieces of their length.
                pieces.extend(f.iov[1..].iter().map(|v| unsafe {
                    std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                }));
                let len = f.len as u64;
                match out.send(&pieces, f.offload) {
                    Ok(true) => {
                        d.frames += 1;
                        d.bytes += len;
                    }
                    Ok(false) => {
                        frames.put_back();
                        d.declined = true;
                        break;
                    }
                    Err(_) => d.dropped += 1,
                }
            }
            out.scratch.pieces = crate::forward::recycle(pieces);
        });
        match pass {
            Some(((), bad, why)) => {
                d.bad_input = bad;
                if bad != 0 {
                    self.report(&why);
                }
            }
            None => {
                self.report(&Bad::Rings);
                d.declined = true;
            }
        }
        // A fault in the guest's memory during the pass was mended with zeros.
        self.shrank();
        d
    }

    /// One pass over the receive queue of pair `p` (locked in `st`): `f` sends through a
    /// [`GuestRx`]; then the used chains are published and the guest interrupted if it asks
    /// to be, and the queue gets its new position. What `f` returned, and the bad chains met
    /// with the last reason; None when the queue's rings are not in guest memory.
    fn rx_pass<R>(
        &self,
        p: usize,
        st: &mut std::sync::MutexGuard<'_, VringState<Mem>>,
        mem: &GuestMemoryMmap,
        acked: &Acked,
        f: impl FnOnce(&mut GuestRx) -> R,
    ) -> Option<(R, u64, Bad)> {
        let vq = Virtq::new(st.get_queue(), mem)?;
        let mut scratch = lock(&self.0.pairs[p].scratch);
        let mut out = GuestRx {
            vq,
            mem,
            mrg_rxbuf: acked.mrg_rxbuf,
            max_frame: acked.max_frame,
            scratch: &mut scratch,
            used: 0,
            bad: 0,
            why: Bad::None,
        };
        let r = f(&mut out);
        // Chains returned for dropped frames are published too.
        let _ = out.flush();
        let mut vq = out.vq;
        if vq.needs_interrupt() {
            self.interrupt(st, rxq(p));
        }
        vq.finish(st.get_queue_mut());
        Some((r, out.bad, out.why))
    }

    /// Pair `p`'s worker: its transmit queue (and for pair 0 the port's rx ring toward the
    /// guest's receive queue 0) until nothing moves; then the guest's notifications are asked
    /// for again: on the transmit queue always, on receive queue 0 only while frames wait
    /// for buffers.
    fn pump(&self, p: usize, [rx, tx]: &[Vring; 2]) {
        if self.shrank() {
            return;
        }
        let pair = &self.0.pairs[p];
        let mut steps = lock(&pair.steps);
        let mem = self.0.mem.memory();
        let acked = self.acked_now();
        let busy_poll = steps.busy_poll;
        let rx = (p == 0).then_some(rx);
        self.note_enabled(p, tx);
        loop {
            notify(tx, false);
            if let Some(rx) = rx {
                notify(rx, false);
            }
            let mut rx_blocked = false;
            let mut tx_stuck;
            // With busy-polling, a dry guest is looked at again until the interval passes
            // since the last frame, before its notifications are turned on and the thread
            // sleeps (a kick and a wake-up less per burst, for a core kept busy).
            let mut dry_since: Option<std::time::Instant> = None;
            loop {
                let moved_in;
                (moved_in, tx_stuck) = self.guest_tx(p, &mut steps, tx, &mem, &acked);
                let mut moved_out = 0;
                if let Some(rx) = rx {
                    (moved_out, rx_blocked) = self.guest_rx(&mut steps, rx, &mem, &acked);
                }
                if moved_in + moved_out != 0 {
                    dry_since = None;
                    continue;
                }
                let since = *dry_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= busy_poll {
                    break;
                }
                std::hint::spin_loop();
            }
            // A chain the guest made available meanwhile is served now, not left for a
            // notification that will not come. An avail index that cannot be right waits
            // for the guest's next kick (looking again at once would spin for as long as
            // the guest leaves it so); memory the front end shrank ends the connection.
            let more_tx = notify(tx, true) && !tx_stuck;
            let more_rx = rx_blocked && rx.is_some_and(|rx| notify(rx, true));
            if self.shrank() || (!more_tx && !more_rx) {
                break;
            }
        }
        if let Some(ns) = steps.fire_due() {
            // At least 1 µs: a moderation deadline due now is served by the next event anyway.
            epoll::arm_timer(&pair.timer, ns.max(1000));
        }
    }

    /// Notes whether the guest has pair `p`'s transmit queue enabled (it enables a pair's
    /// queues together); the port's description follows.
    fn note_enabled(&self, p: usize, tx: &Vring) {
        let on = {
            let st = tx.get_ref();
            st.is_enabled() && st.get_queue().ready()
        };
        let bit = 1u32 << p;
        let was = self.0.enabled.load(Relaxed) & bit != 0;
        if on != was {
            if on {
                self.0.enabled.fetch_or(bit, Relaxed);
            } else {
                self.0.enabled.fetch_and(!bit, Relaxed);
            }
            self.describe();
        }
    }

    /// The MTU the front end gives the guest (NET_SET_MTU): false when out of range.
    fn set_mtu(&self, mtu: u64) -> bool {
        if !(68..=MAX_MTU).contains(&mtu) {
            return false;
        }
        self.0.mtu.store(mtu as u32, Relaxed);
        self.describe();
        true
    }

    /// What the guest negotiated, with the MTU the front end set.
    fn acked_now(&self) -> Acked {
        Acked::of(self.0.features.load(Relaxed), self.0.mtu.load(Relaxed))
    }

    fn acked(&self, features: u64) {
        self.0.features.store(features, Relaxed);
        let caps = Acked::caps(features);
        for pair in &self.0.pairs {
            lock(&pair.steps).set_caps(caps);
        }
        self.describe();
    }

    /// What `vale-ctl list` shows of the connection: features, queue pairs, MTU, offloads.
    fn describe(&self) {
        // Held while the state is read, not only while it is written: each caller changes its
        // part before it describes, so the last to write has read every change (two threads
        // describing at once could otherwise leave the older reading shown for good).
        let mut shown = lock(&self.0.state.negotiated);
        let features = self.0.features.load(Relaxed);
        let names: Vec<&str> = NET_FEATURES
            .iter()
            .filter(|&&bit| has(features, bit))
            .map(|&bit| feature_name(bit))
            .collect();
        let offloads = match Acked::caps(features).names() {
            n if n.is_empty() => "none".to_string(),
            n => n.join(","),
        };
        let mtu = match self.0.mtu.load(Relaxed) {
            0 => String::new(),
            m => format!("; mtu {m}"),
        };
        *shown = format!(
            "features {}; queue pairs {} in use of {}{mtu}; offloads to the guest {offloads}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(",")
            },
            self.0.enabled.load(Relaxed).count_ones(),
            self.0.pairs.len(),
        );
    }

    /// Guest transmit on pair `p`: a batch of the transmit queue's chains, forwarded from
    /// where they lie in guest memory (the switch's one copy reads them there), then returned
    /// used. The chains taken, and whether the avail ring could not be read.
    fn guest_tx(
        &self,
        p: usize,
        steps: &mut Steps,
        vring: &Vring,
        mem: &GuestMemoryMmap,
        acked: &Acked,
    ) -> (usize, bool) {
        let mut st = vring.get_mut();
        if !st.is_enabled() || !st.get_queue().ready() {
            return (0, false);
        }
        let Some(mut vq) = Virtq::new(st.get_queue(), mem) else {
            self.bad(steps, 1, &Bad::Rings);
            return (0, true);
        };
        let scratch = &self.0.pairs[p].scratch;
        let mut tx = std::mem::take(&mut lock(scratch).tx);
        let (mut used, mut bad, mut why, mut stuck) = (0usize, 0u64, Bad::None, false);
        steps.ingress_direct(p as u32, |batch, limit| {
            let limit = limit.min(BURST);
            tx.heads.clear();
            // Never reallocated within the batch: the pipeline holds pointers into it.
            tx.heads.reserve(BURST);
            while batch.batch_len() < limit && used < BURST {
                tx.descs.clear();
                let head = match vq.pop(&mut tx.descs) {
                    Popped::Empty => break,
                    Popped::Stuck(e) => {
                        bad += 1;
                        why = Bad::Queue(e);
                        stuck = true;
                        break;
                    }
                    Popped::Bad(head, e) => {
                        bad += 1;
                        why = Bad::Queue(e);
                        head
                    }
                    Popped::Chain(head) => {
                        if let Err(b) = tx.add_frame(mem, acked, batch) {
                            bad += 1;
                            why = b;
                        }
                        head
                    }
                };
                // Published only after the batch is forwarded: until then the guest must not
                // reuse the buffers.
                vq.push_used(head, 0);
                used += 1;
            }
        });
        lock(scratch).tx = tx;
        self.bad(steps, bad, &why);
        if used != 0 {
            vq.publish_used();
            if vq.needs_interrupt() {
                self.interrupt(&st, txq(p));
            }
        }
        vq.finish(st.get_queue_mut());
        (used, stuck)
    }

    /// Guest receive: what the switch delivered to the port's rx ring, into receive queue 0.
    /// Frames moved, and whether frames wait for the guest's buffers.
    fn guest_rx(
        &self,
        steps: &mut Steps,
        vring: &Vring,
        mem: &GuestMemoryMmap,
        acked: &Acked,
    ) -> (usize, bool) {
        let mut st = vring.get_mut();
        if !st.is_enabled() || !st.get_queue().ready() {
            return (0, false);
        }
        let pass = self.rx_pass(0, &mut st, mem, acked, |out| {
            steps.egress(out, BURST, false)
        });
        let Some((done, bad, why)) = pass else {
            self.bad(steps, 1, &Bad::Rings);
            return (0, false);
        };
        self.bad(steps, bad, &why);
        if done.blocked {
            // The guest has no buffers: its next kick on the rx queue brings us back.
            return (0, true);
        }
        (done.moved, false)
    }
}

/// The pair among `enabled` (a bit each) that takes frames of `flow` (see
/// [`DirectSink::send_batch`]): the same for the same flow while the guest's choice of pairs
/// stays, flows spread over the pairs; pair 0 when none or one is enabled.
pub(crate) fn pair_of(flow: u32, enabled: u32) -> usize {
    let n = enabled.count_ones();
    if n <= 1 {
        return 0;
    }
    // The (hash mod n)-th enabled pair; the multiply spreads source ports and rings alike.
    let mut k = (flow.wrapping_mul(0x9e37_79b9) >> 16) % n;
    let mut bits = enabled;
    while k != 0 {
        bits &= bits - 1;
        k -= 1;
    }
    bits.trailing_zeros() as usize
}

/// Turns the guest's notifications on a queue on or off (`VRING_USED_F_NO_NOTIFY`, or the
/// avail event with EVENT_IDX). Turning them on, true when the guest made chains available
/// since the device last looked.
fn notify(vring: &Vring, on: bool) -> bool {
    {
        let st = vring.get_ref();
        if !st.is_enabled() || !st.get_queue().ready() {
            return false;
        }
    }
    if on {
        vring.enable_notification().unwrap_or(false)
    } else {
        let _ = vring.disable_notification();
        false
    }
}

/// Why a chain was refused.
enum Bad {
    None,
    Queue(VirtqError),
    /// The queue's rings are not inside guest memory.
    Rings,
    Memory,
    Direction,
    Runt(usize),
    TooLong,
    /// A frame without segmentation longer than the MTU allows: (its length, the MTU).
    OverMtu(usize, usize),
    /// More pieces than a frame may have.
    Scattered,
    TooSmall(usize),
    Offload(Offload),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::None => write!(f, "no error"),
            Bad::Queue(e) => write!(f, "{e}"),
            Bad::Rings => write!(f, "queue rings outside guest memory"),
            Bad::Memory => write!(f, "descriptor outside guest memory"),
            Bad::Direction => write!(f, "descriptor of the wrong direction in a chain"),
            Bad::Runt(n) => write!(f, "frame of {n} bytes"),
            Bad::TooLong => write!(f, "frame longer than {MAX_GUEST_FRAME} bytes"),
            Bad::OverMtu(n, mtu) => write!(f, "frame of {n} bytes over the MTU of {mtu}"),
            Bad::Scattered => write!(f, "frame in more than {MAX_FRAGS} pieces"),
            Bad::TooSmall(n) => write!(f, "receive buffers too small for a frame of {n} bytes"),
            Bad::Offload(o) => write!(
                f,
                "offload request not negotiated or outside the frame (flags {:#x}, gso type {:#x}, \
                 gso size {}, csum start {}, csum offset {})",
                o.flags, o.gso_type, o.gso_size, o.csum_start, o.csum_offset
            ),
        }
    }
}

/// The lists of the guest transmit path, kept between batches.
#[derive(Default)]
struct TxScratch {
    /// The descriptors of the chain being read.
    descs: Vec<Desc>,
    /// Where the frame being read lies in valed's mapping of guest memory.
    pieces: Vec<(*const u8, u32)>,
    /// Copies of Ethernet headers the guest split over descriptors, one per frame of the
    /// batch (the lookup reads a frame's first piece, which must hold the whole header).
    heads: Vec<[u8; HEAD_COPY]>,
}

// SAFETY: the pointers are only used during one batch, under the scratch's lock.
unsafe impl Send for TxScratch {}

/// Bytes copied from the start of a frame whose Ethernet header is split.
const HEAD_COPY: usize = 64;

impl TxScratch {
    /// Adds the frame of the tx chain in `descs` to `batch` where it lies in guest memory;
    /// its virtio-net header (which may be split over any descriptors) is read aside and
    /// checked. Every address is checked against the memory table.
    fn add_frame(
        &mut self,
        mem: &GuestMemoryMmap,
        acked: &Acked,
        batch: &mut Pipeline,
    ) -> Result<(), Bad> {
        let mut hdr = [0u8; HDR_LEN];
        self.pieces.clear();
        let one = match self.descs[..] {
            [d] if !d.write
                && (HDR_LEN..=HDR_LEN + MAX_GUEST_FRAME).contains(&(d.len as usize)) =>
            {
                guest_range(mem, d.addr, d.len as usize)
            }
            _ => None,
        };
        let len = match one {
            // The common case: header and frame in one descriptor, in one region of guest
            // memory: one translation.
            Some(p) => {
                let len = self.descs[0].len as usize - HDR_LEN;
                // SAFETY: the descriptor's bytes lie in one mapped region (`guest_range`),
                // which `mem` keeps mapped until the batch is forwarded.
                unsafe {
                    std::ptr::copy_nonoverlapping(p, hdr.as_mut_ptr(), HDR_LEN);
                    self.pieces.push((p.add(HDR_LEN), len as u32));
                }
                len
            }
            None => self.gather(mem, &mut hdr)?,
        };
        if len < 14 {
            return Err(Bad::Runt(len));
        }
        let off = acked.offload(&hdr, len)?;
        if len > acked.max_frame && off.is_none_or(|o| o.gso_type == offload::GSO_NONE) {
            return Err(Bad::OverMtu(len, acked.max_frame - MTU_OVERHEAD));
        }
        let mut skip = 0usize;
        if (self.pieces[0].1 as usize) < 14 {
            // The Ethernet header is split: its first bytes are copied aside, one piece.
            let k = self.heads.len();
            self.heads.push([0; HEAD_COPY]);
            let head = &mut self.heads[k];
            let want = len.min(HEAD_COPY);
            for &(p, n) in &self.pieces {
                let c = (n as usize).min(want - skip);
                // SAFETY: `n` bytes at `p` are in one mapped region of guest memory (checked
                // by `guest_piece`); `head` is ours.
                unsafe { std::ptr::copy_nonoverlapping(p, head[skip..].as_mut_ptr(), c) };
                skip += c;
                if skip == want {
                    break;
                }
            }
            // SAFETY: `heads` is only cleared at the start of the next batch, and within one
            // it stays within the capacity reserved for it (one entry per chain, at most
            // BURST), so it is never moved while the pipeline holds this pointer.
            unsafe { batch.add_piece(head.as_ptr(), want as u32) };
        }
        for &(p, n) in &self.pieces {
            let n = n as usize;
            let cut = skip.min(n);
            skip -= cut;
            if cut < n {
                // SAFETY: inside one mapped region (see `guest_piece`); the caller keeps the
                // memory table (`mem`) alive until the batch is forwarded.
                unsafe { batch.add_piece(p.add(cut), (n - cut) as u32) };
            }
        }
        if !batch.end_frame(off) {
            return Err(Bad::Scattered);
        }
        Ok(())
    }

    /// The frame of the chain in `descs`, of any shape: its virtio-net header (which may be
    /// split over any descriptors) read into `hdr`, its pieces where they lie in guest memory
    /// (a descriptor may span regions of the memory table: one piece per region). Its length
    /// without the header.
    fn gather(&mut self, mem: &GuestMemoryMmap, hdr: &mut [u8; HDR_LEN]) -> Result<usize, Bad> {
        let mut got = 0usize;
        let mut len = 0usize;
        for d in &self.descs {
            if d.write {
                return Err(Bad::Direction);
            }
            let mut dlen = d.len as usize;
            let mut addr = d.addr;
            let s = (HDR_LEN - got).min(dlen);
            if s != 0 && !read_guest(mem, &mut hdr[got..got + s], addr) {
                return Err(Bad::Memory);
            }
            got += s;
            dlen -= s;
            addr = addr.checked_add(s as u64).ok_or(Bad::Memory)?;
            if dlen > MAX_GUEST_FRAME - len {
                return Err(Bad::TooLong);
            }
            len += dlen;
            while dlen != 0 {
                let (p, n) = guest_piece(mem, addr, dlen).ok_or(Bad::Memory)?;
                if self.pieces.len() == MAX_FRAGS as usize {
                    return Err(Bad::Scattered);
                }
                self.pieces.push((p, n as u32));
                addr = addr.checked_add(n as u64).ok_or(Bad::Memory)?;
                dlen -= n;
            }
        }
        if got < HDR_LEN {
            return Err(Bad::Runt(len));
        }
        Ok(len)
    }
}

/// The rx queue as the way out of the egress step and of the direct sink, for one pass.
struct GuestRx<'a, 'm> {
    vq: Virtq<'m>,
    mem: &'m GuestMemoryMmap,
    /// A frame may span several chains (their count is in its header's `num_buffers`).
    mrg_rxbuf: bool,
    /// Longer frames without segmentation are not the guest's to take (see [`Acked`]).
    max_frame: usize,
    scratch: &'a mut Scratch,
    used: usize,
    bad: u64,
    why: Bad,
}

impl GuestRx<'_, '_> {
    /// The common case, header and frame (`total` bytes) into the next chain when it is one
    /// writable descriptor that holds them, in one region of guest memory: one translation and
    /// no lists. Some(false) when the guest has no buffers now; None (nothing taken) when the
    /// chain is of another shape, or broken, for the general path to deal with.
    #[inline]
    fn send_in_one(&mut self, pieces: &[&[u8]], off: Offload, total: usize) -> Option<bool> {
        let vq = &mut self.vq;
        let start = vq.next_avail;
        let descs = &mut self.scratch.descs;
        descs.clear();
        let head = match vq.pop(descs) {
            Popped::Empty => return Some(false),
            Popped::Chain(head) => head,
            Popped::Stuck(_) | Popped::Bad(..) => {
                vq.next_avail = start;
                return None;
            }
        };
        let dst = match descs[..] {
            [d] if d.write && d.len as usize >= total => guest_range(self.mem, d.addr, total),
            _ => None,
        };
        let Some(dst) = dst else {
            vq.next_avail = start;
            return None;
        };
        let hdr = rx_header(off, 1);
        // SAFETY: `total` bytes at `dst` lie in one mapped region of guest memory (checked by
        // `guest_range`), which `self.mem` keeps mapped; header and pieces add up to `total`.
        unsafe {
            std::ptr::copy_nonoverlapping(hdr.as_ptr(), dst, HDR_LEN);
            let mut at = dst.add(HDR_LEN);
            for p in pieces {
                std::ptr::copy_nonoverlapping(p.as_ptr(), at, p.len());
                at = at.add(p.len());
            }
        }
        vq.push_used(head, total as u32);
        self.used += 1;
        Some(true)
    }
}

impl Egress for GuestRx<'_, '_> {
    fn send(&mut self, pieces: &[&[u8]], off: Offload) -> Result<bool, DevError> {
        let flen: usize = pieces.iter().map(|p| p.len()).sum();
        if flen > self.max_frame && off.gso_type == offload::GSO_NONE {
            // Over the guest's MTU: a drop of the port's, the guest did nothing wrong.
            return Err(DevError::Frame(io::Error::from_raw_os_error(
                libc::EMSGSIZE,
            )));
        }
        let total = HDR_LEN + flen;
        if let Some(sent) = self.send_in_one(pieces, off, total) {
            return Ok(sent);
        }
        let vq = &mut self.vq;
        let start = vq.next_avail;
        let s = &mut *self.scratch;
        s.chains.clear();
        s.descs.clear();
        // Gather chains until the frame fits: one without merged buffers, as many as needed
        // (never more than the queue holds) with them.
        let mut room = 0usize;
        let mut fail = None;
        while room < total {
            if s.chains.len() >= vq.size() as usize {
                fail = Some(Bad::TooSmall(flen));
                break;
            }
            let first = s.descs.len();
            let head = match vq.pop(&mut s.descs) {
                Popped::Empty => {
                    // Too few buffers now: the frame waits, and the chains stay the guest's.
                    vq.next_avail = start;
                    return Ok(false);
                }
                Popped::Stuck(e) => {
                    vq.next_avail = start;
                    self.bad += 1;
                    self.why = Bad::Queue(e);
                    return Ok(false);
                }
                Popped::Bad(head, e) => {
                    s.descs.truncate(first);
                    s.chains.push((head, 0));
                    fail = Some(Bad::Queue(e));
                    break;
                }
                Popped::Chain(head) => head,
            };
            s.chains.push((head, s.descs.len() - first));
            if s.descs[first..].iter().any(|d| !d.write) {
                fail = Some(Bad::Direction);
                break;
            }
            room += s.descs[first..]
                .iter()
                .map(|d| d.len as usize)
                .sum::<usize>();
            if !self.mrg_rxbuf && room < total {
                fail = Some(Bad::TooSmall(flen));
                break;
            }
        }
        let r = match fail {
            Some(b) => Err(b),
            None => copy_to_guest(
                self.mem,
                &s.descs,
                &rx_header(off, s.chains.len() as u16),
                pieces,
            ),
        };
        // Every chain taken goes back used: with the bytes written into it, or empty.
        let mut left = if r.is_ok() { total } else { 0 };
        let mut d = 0;
        for &(head, n) in &s.chains {
            let room: usize = s.descs[d..d + n].iter().map(|x| x.len as usize).sum();
            d += n;
            let written = room.min(left);
            left -= written;
            vq.push_used(head, written as u32);
            self.used += 1;
        }
        match r {
            Ok(()) => Ok(true),
            Err(b) => {
                self.bad += 1;
                self.why = b;
                Err(DevError::Frame(io::Error::from_raw_os_error(
                    libc::EMSGSIZE,
                )))
            }
        }
    }

    fn flush(&mut self) -> Result<(), DevError> {
        // The caller interrupts the guest (it holds the queue's call eventfd).
        if self.used != 0 {
            self.vq.publish_used();
        }
        self.used = 0;
        Ok(())
    }
}

/// The virtio-net header of a frame toward the guest: its offload fields and the number of
/// chains it spans.
fn rx_header(off: Offload, num_buffers: u16) -> [u8; HDR_LEN] {
    let mut hdr = [0u8; HDR_LEN];
    hdr[..offload::VNET_HDR_LEN].copy_from_slice(&off.to_virtio());
    hdr[offload::VNET_HDR_LEN..].copy_from_slice(&num_buffers.to_le_bytes());
    hdr
}

/// Writes header and frame, in order, into the writable descriptors `descs` (which hold at
/// least that many bytes).
fn copy_to_guest(
    mem: &GuestMemoryMmap,
    descs: &[Desc],
    hdr: &[u8],
    pieces: &[&[u8]],
) -> Result<(), Bad> {
    let mut srcs = std::iter::once(hdr).chain(pieces.iter().copied());
    let mut src: &[u8] = srcs.next().unwrap_or(&[]);
    for d in descs {
        let (mut addr, mut room) = (d.addr, d.len as usize);
        while room != 0 {
            while src.is_empty() {
                match srcs.next() {
                    Some(p) => src = p,
                    None => return Ok(()),
                }
            }
            let n = room.min(src.len());
            if !write_guest(mem, &src[..n], addr) {
                return Err(Bad::Memory);
            }
            addr = addr.checked_add(n as u64).ok_or(Bad::Memory)?;
            src = &src[n..];
            room -= n;
        }
    }
    // The caller gathered room for the whole frame.
    Ok(())
}

impl VhostUserBackend for Net {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.queues()
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        // QEMU's vhost-user net needs protocol features (it enables rings with them); see
        // `relay` for what it gets wrong about them.
        NET_FEATURES
            .iter()
            .fold(1 << VIRTIO_F_VERSION_1, |f, &bit| f | 1 << bit)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        self.acked(features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // REPLY_ACK the library adds itself; the relay answers GET_QUEUE_NUM,
        // GET_MAX_MEM_SLOTS and NET_SET_MTU.
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::MTU
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // A worker per queue pair.
        (0..self.0.pairs.len()).map(|p| 0b11 << rxq(p)).collect()
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn update_memory(&self, _mem: Mem) -> io::Result<()> {
        // The library replaced the table inside `self.0.mem`, the same atomic.
        self.guard_memory();
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()?;
        // The library (0.24) registers the consumer in its epoll set through `into_raw_fd` and
        // never closes it: one descriptor per connection, which a front end that connects
        // and leaves in a loop would turn into valed running out of them. Closed once the
        // library's threads are gone (see `close_forgotten`).
        lock(&self.0.forgotten).push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        // Worker `thread_id` serves pair `thread_id`: `vrings` are its receive and transmit
        // queues.
        let p = thread_id;
        let (Some(pair), [rx, tx]) = (self.0.pairs.get(p), vrings) else {
            return Ok(());
        };
        if device_event == self.ev_irq() {
            lock(&self.0.pairs[0].steps).drain_irq();
        } else if device_event == self.ev_timer() {
            eventfd::drain(&self.0.pairs[p].timer);
        } else if device_event == self.ev_guest_timer() {
            eventfd::drain(&self.0.guest_timer);
        }
        let queues = pair.queues.get_or_init(|| [rx.clone(), tx.clone()]);
        self.pump(p, queues);
        if p == 0 {
            self.fire_deferred();
        }
        Ok(())
    }
}

/// Between a front end and the library, valed passes every message through, but for these:
///
/// - QEMU (7.2) sends SET_VRING_ENABLE before SET_FEATURES has acked
///   VHOST_USER_F_PROTOCOL_FEATURES (at every device reset), and counts on it afterwards; the
///   library refuses it and would end the connection. Such a message is held, the latest per
///   ring, and passed on right after a SET_FEATURES that acks protocol features (without them
///   the rings are enabled by SET_FEATURES itself, and the held ones are dropped).
/// - GET_QUEUE_NUM is answered here with the queue *pairs* offered (what QEMU and DPDK
///   compare their `queues` with; the library would answer the number of virtqueues).
/// - GET_MAX_MEM_SLOTS is answered here with [`MAX_MEM_SLOTS`] (the library would allow 509
///   regions, each a descriptor and a mapping held by valed), and a front end that adds more
///   regions than that is disconnected.
/// - NET_SET_MTU (which the library does not know) is taken here.
/// - A memory region added again, or removed again, is answered here (QEMU 7.2 sends its
///   regions once per queue pair; the library would end the connection).
mod relay {
    use std::collections::BTreeSet;
    use std::io::{self, Read, Write};
    use std::net::Shutdown;
    use std::os::fd::{AsRawFd, OwnedFd, RawFd};
    use std::sync::{Arc, Mutex};

    use std::os::unix::net::UnixStream;
    use std::thread::JoinHandle;
    use vale_abi::control;

    const SET_FEATURES: u32 = 2;
    const SET_MEM_TABLE: u32 = 5;
    const GET_QUEUE_NUM: u32 = 17;
    const SET_VRING_KICK: u32 = 12;
    const SET_VRING_ENABLE: u32 = 18;
    /// SET_VRING_KICK without a descriptor (the back end would poll).
    const NO_FD: u64 = 0x100;
    const NET_SET_MTU: u32 = 20;
    const GET_MAX_MEM_SLOTS: u32 = 36;
    const ADD_MEM_REG: u32 = 37;
    const REM_MEM_REG: u32 = 38;
    const VERSION: u32 = 0x1;
    const REPLY: u32 = 0x4;
    const NEED_REPLY: u32 = 0x8;
    const PROTOCOL_FEATURES: u64 = 1 << 30;
    /// Largest message body taken (the protocol's own bound is far lower for what we accept).
    const MAX_BODY: usize = 64 << 10;
    /// Early ring enables kept (one per ring index).
    const MAX_EARLY: usize = 64;
    /// Most descriptors one message may carry (the protocol's bound).
    const MAX_FDS: usize = 8;
    /// Most guest memory regions a front end may have mapped at once.
    pub const MAX_MEM_SLOTS: usize = 32;

    /// What the relay answers or changes itself.
    pub struct Answers {
        /// Queue pairs offered.
        pub pairs: u64,
        /// Takes the MTU of NET_SET_MTU: false when it is out of range.
        pub set_mtu: Box<dyn Fn(u64) -> bool + Send>,
        /// Takes the front end's kick eventfd of a queue; gives what the library gets instead.
        pub kick: Box<dyn Fn(u8, OwnedFd) -> io::Result<OwnedFd> + Send>,
    }

    /// The two threads of one connection; joined by [`Relay::join`].
    pub struct Relay {
        threads: [JoinHandle<()>; 2],
    }

    fn bad(why: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, why)
    }

    impl Relay {
        pub fn start(
            front: UnixStream,
            back: UnixStream,
            port: &str,
            answers: Answers,
        ) -> io::Result<Relay> {
            let (f2, b2) = (front.try_clone()?, back.try_clone()?);
            // Both directions write to the front end: one whole message at a time.
            let writing = Arc::new(Mutex::new(()));
            let writing2 = writing.clone();
            let port = port.to_string();
            let down = std::thread::Builder::new()
                .name("vale-vhost-relay".into())
                .spawn(move || {
                    if let Err(e) = to_backend(&front, &back, &answers, &writing) {
                        if e.kind() == io::ErrorKind::InvalidData {
                            tracing::warn!(%port, "vhost-user front end: {e}; connection closed");
                        }
                    }
                    let _ = front.shutdown(Shutdown::Both);
                    let _ = back.shutdown(Shutdown::Both);
                })?;
            let up = std::thread::Builder::new()
                .name("vale-vhost-relay".into())
                .spawn(move || {
                    let _ = to_front(&b2, &f2, &writing2);
                    let _ = f2.shutdown(Shutdown::Both);
                    let _ = b2.shutdown(Shutdown::Both);
                })?;
            Ok(Relay {
                threads: [down, up],
            })
        }

        pub fn join(self) {
            for t in self.threads {
                let _ = t.join();
            }
        }
    }

    /// Receives into `buf` (all of it), with the descriptors that come along: at most
    /// `MAX_FDS` in all, however the front end spreads them over its bytes.
    fn recv_exact(s: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match control::recv_with_fds(s.as_raw_fd(), &mut buf[got..], fds)? {
                0 => return Ok(false),
                n => got += n,
            }
            if fds.len() > MAX_FDS {
                return Err(bad(format!(
                    "front end message with more than {MAX_FDS} descriptors"
                )));
            }
        }
        Ok(true)
    }

    /// Sends `buf` with `fds` attached to its first byte.
    fn send_all(s: &UnixStream, buf: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let sent = if raw.is_empty() {
            0
        } else {
            control::send_with_fds(s.as_raw_fd(), buf, &raw, false)?
        };
        let mut w = s;
        w.write_all(&buf[sent..])
    }

    /// The library's replies, to the front end whole (the other direction may write an
    /// answer of its own between two of them).
    fn to_front(back: &UnixStream, front: &UnixStream, writing: &Mutex<()>) -> io::Result<()> {
        let mut buf = vec![0u8; 12 + MAX_BODY];
        let mut b = back;
        loop {
            b.read_exact(&mut buf[..12])?;
            let size = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
            if size > MAX_BODY {
                return Err(bad(format!("backend message of {size} bytes")));
            }
            b.read_exact(&mut buf[12..12 + size])?;
            let _w = writing.lock().unwrap_or_else(|e| e.into_inner());
            let mut f = front;
            f.write_all(&buf[..12 + size])?;
        }
    }

    /// Answers request `req` with `value`.
    fn reply(front: &UnixStream, writing: &Mutex<()>, req: u32, value: u64) -> io::Result<()> {
        let mut m = [0u8; 20];
        m[..4].copy_from_slice(&req.to_le_bytes());
        m[4..8].copy_from_slice(&(VERSION | REPLY).to_le_bytes());
        m[8..12].copy_from_slice(&8u32.to_le_bytes());
        m[12..].copy_from_slice(&value.to_le_bytes());
        let _w = writing.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = front;
        f.write_all(&m)
    }

    fn to_backend(
        front: &UnixStream,
        back: &UnixStream,
        answers: &Answers,
        writing: &Mutex<()>,
    ) -> io::Result<()> {
        let mut protocol = false;
        let mut early: Vec<[u8; 20]> = Vec::new();
        // The guest memory regions the front end has given: (guest address, size).
        let mut regions: BTreeSet<(u64, u64)> = BTreeSet::new();
        let mut buf = vec![0u8; 12 + MAX_BODY];
        let mut fds = Vec::with_capacity(MAX_FDS);
        loop {
            fds.clear();
            if !recv_exact(front, &mut buf[..12], &mut fds)? {
                return Ok(());
            }
            let word = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
            let long = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
            let (req, flags, size) = (word(&buf, 0), word(&buf, 4), word(&buf, 8) as usize);
            if size > MAX_BODY {
                return Err(bad(format!("front end message {req} of {size} bytes")));
            }
            if size != 0 && !recv_exact(front, &mut buf[12..12 + size], &mut fds)? {
                return Ok(());
            }
            let body = &buf[12..12 + size];
            match req {
                SET_FEATURES if size == 8 => {
                    protocol = long(body, 0) & PROTOCOL_FEATURES != 0;
                    send_all(back, &buf[..12 + size], &fds)?;
                    if protocol {
                        // Now the library takes them: the enables QEMU sent too early.
                        for m in early.drain(..) {
                            send_all(back, &m, &[])?;
                        }
                    }
                    early.clear();
                    continue;
                }
                // Before protocol features are acked SET_VRING_ENABLE has no meaning yet (the
                // library would end the connection); QEMU counts on it once they are.
                SET_VRING_ENABLE if !protocol && flags & NEED_REPLY == 0 && size == 8 => {
                    let index = &buf[12..16];
                    early.retain(|m| &m[12..16] != index);
                    if early.len() < MAX_EARLY {
                        early.push(buf[..20].try_into().unwrap());
                    }
                    continue;
                }
                GET_QUEUE_NUM => {
                    reply(front, writing, req, answers.pairs)?;
                    continue;
                }
                SET_VRING_KICK if size == 8 && fds.len() == 1 && long(body, 0) & NO_FD == 0 => {
                    let fd = fds.pop().expect("one descriptor");
                    let own = (answers.kick)(long(body, 0) as u8, fd)?;
                    send_all(back, &buf[..12 + size], &[own])?;
                    continue;
                }
                GET_MAX_MEM_SLOTS => {
                    reply(front, writing, req, MAX_MEM_SLOTS as u64)?;
                    continue;
                }
                NET_SET_MTU => {
                    let ok = size == 8 && (answers.set_mtu)(long(body, 0));
                    if flags & NEED_REPLY != 0 {
                        reply(front, writing, req, u64::from(!ok))?;
                    }
                    continue;
                }
                // The memory table as the library will have it: (address, size) of each
                // region. A table message carries at most MAX_FDS regions.
                SET_MEM_TABLE if size >= 8 => {
                    let n = (word(body, 0) as usize).min((size - 8) / 32);
                    regions = (0..n)
                        .map(|k| (long(body, 8 + 32 * k), long(body, 16 + 32 * k)))
                        .collect();
                }
                // QEMU (7.2) sends its regions once per queue pair: a region the table has
                // already is taken (and its descriptor closed), one it no longer has is gone
                // (the library would end the connection on either).
                ADD_MEM_REG | REM_MEM_REG if size >= 24 => {
                    let region = (long(body, 8), long(body, 16));
                    let changed = if req == ADD_MEM_REG {
                        regions.insert(region)
                    } else {
                        regions.remove(&region)
                    };
                    if !changed {
                        if flags & NEED_REPLY != 0 {
                            reply(front, writing, req, 0)?;
                        }
                        continue;
                    }
                    if regions.len() > MAX_MEM_SLOTS {
                        return Err(bad(format!(
                            "front end adds more than {MAX_MEM_SLOTS} memory regions"
                        )));
                    }
                }
                _ => {}
            }
            send_all(back, &buf[..12 + size], &fds)?;
        }
    }

    /// A private directory (mode 0700, made by `mkdtemp`) for the library's listener: only
    /// valed's user can reach it. Removed when dropped.
    pub struct PrivateDir(std::path::PathBuf);

    impl Drop for PrivateDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A connected pair: the front end's side goes to the relay, the other to the library
    /// through a listener of its own in a private directory; drop the directory once the
    /// library has accepted.
    pub fn backend_pair() -> io::Result<(vhost::vhost_user::Listener, UnixStream, PrivateDir)> {
        use std::os::unix::ffi::OsStringExt;
        let mut tmpl = std::env::temp_dir()
            .join("vale-vhost-XXXXXX")
            .into_os_string()
            .into_vec();
        tmpl.push(0);
        // SAFETY: a NUL-terminated template that mkdtemp fills in place.
        if unsafe { libc::mkdtemp(tmpl.as_mut_ptr().cast()) }.is_null() {
            return Err(io::Error::last_os_error());
        }
        tmpl.pop();
        let dir = PrivateDir(std::ffi::OsString::from_vec(tmpl).into());
        let path = dir.0.join("backend.sock");
        let l = std::os::unix::net::UnixListener::bind(&path)?;
        let c = UnixStream::connect(&path)?;
        Ok((vhost::vhost_user::Listener::from(l), c, dir))
    }
}

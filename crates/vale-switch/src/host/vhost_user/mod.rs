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
//!
//! # The data path, and what a frame costs
//!
//! A frame from one guest to another is read once and written once: the sending pair's worker
//! pops the guest's transmit chain ([`Virtq::pop_one`] for the common one-descriptor chain),
//! checks its header (a header that asks for no offload costs two byte tests) and hands the
//! frame to the pipeline where it lies ([`Gather::push_frame`]); the pipeline's delivery
//! writes it straight into the receiving guest's buffer through the port's [`DirectSink`].
//! When that guest has no buffers, frames wait in its port's rx ring, and the next forwarding
//! thread that delivers to it first moves them into the guest itself ([`DirectSink::drain`],
//! pair 0's steps tried, never waited for) rather than queueing behind them until pair 0's
//! worker wakes. Used elements are published and the interrupt decided once per burst.
//! With the port's `moderation` set and event indices negotiated, a streaming guest is asked
//! for a kick only every interval's worth of chains (kick moderation, `rx.rs`'s `Pace`).
//!
//! Counted with callgrind (`bench/instructions.py --paths vhost-user`, testpmd's virtio_user
//! front ends, AMD EPYC, 2 vCPUs; docs/benchmarks.md has the runs and what each change
//! bought): a 60-byte frame delivered without drops costs all of valed about 420-430
//! instructions, down from about 985 (600 before the rx side's one-piece path, `copy_bytes`
//! and the generic egress); a frame taken from the sender and dropped at a receiver without
//! buffers about 195, down from about 530.
//!
//! # Files
//!
//! `features.rs` what is offered, acked and shown; `session.rs` a front end's connection and
//! the port's driver; `backend.rs` the library's calls into the device; `tx.rs` the guest's
//! transmit queues; `rx.rs` its receive queues; `relay.rs` the messages valed handles itself
//! between the front end and the library; this file the port, its sink and the device state
//! they share (interrupts, memory tables, queue pairs).

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
    Address, Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion, MemoryRegionAddress,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use vale_abi::eventfd;

use super::guard::{self, Guarded};
use super::peer_irq;
use super::socket::SocketName;
use super::virtq::{guest_piece, read_guest, write_guest, Desc, One, Popped, Virtq, VirtqError};
use super::{DevError, Device, Driver, Egress, HostState, Steps};
use crate::copy::copy_bytes;
use crate::drive::Gather;
use crate::epoll;
use crate::offload::{self, Caps, Offload};
use crate::port::PortShared;
use crate::sink::{Delivered, DirectSink, OutFrames};
use vale_abi::region::{MAX_FRAGS, MAX_FRAME_LEN};

mod backend;
mod features;
mod relay;
mod rx;
mod session;
mod tx;

use features::*;
use session::*;
use tx::*;

/// The virtio-net header of virtio 1.0 (`struct virtio_net_hdr_v1`): 12 bytes.
const HDR_LEN: usize = 12;
/// Largest frame taken from a guest: a TSO segment of 64 KiB.
const MAX_GUEST_FRAME: usize = MAX_FRAME_LEN as usize;

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
    flag: super::Flag {
        long: "vhost-user",
        value: Some("path"),
        help: "A vhost-user socket: valed listens there (connects with --client)",
    },
    about: "--vhost-user PATH makes valed the virtio-net device of a virtual machine (QEMU's \
'-netdev vhost-user', any vhost-user front end) through the Unix socket PATH: valed listens \
there, and serves one front end after the other (QEMU '-chardev socket,path=PATH,reconnect=1'). \
PATH must be free or hold a stale socket (one nobody listens at), which valed replaces; \
anything else there (a file, a directory, a socket in use) is refused and left as it is, and \
detach, and valed stopping on SIGTERM or SIGINT, remove PATH only while it is still valed's \
socket. With --client valed connects to a \
front end listening there instead (QEMU 'server=on,wait=off'), a second after the attach \
and a second after each disconnection (so that the front end has let the last connection go), \
and makes or removes nothing at PATH. The guest's RAM must be shared memory \
('-object memory-backend-memfd,...,share=on'). The port is down while no front end is connected. \
The port offers --queues queue pairs (QEMU '-netdev vhost-user,queues=N' with \
'-device virtio-net-pci,mq=on', up to as many); each pair has a thread of its own in valed, \
and the frames of one flow toward the guest stay on one receive queue. valed also offers \
the MTU ('-device virtio-net-pci,host_mtu=9000'; longer frames without segmentation are \
dropped both ways), link status, checksum and TCP segmentation \
offload both ways, merged receive buffers and event indices; 'vale-ctl list' shows what the \
guest took.",
    args: &[
        super::Arg::new("path", "PATH", "The vhost-user socket")
            .shape(super::Shape::Path)
            .required(),
        super::Arg::switch(
            "client",
            "Connect to a front end listening at the vhost-user socket",
        ),
        super::Arg::new(
            "queues",
            "N",
            "Queue pairs the vhost-user port offers, 1-16 (default 4)",
        )
        .shape(super::Shape::Range(1, MAX_PAIRS as u64)),
    ],
    open: |args| {
        let path = super::required(args, "vhost-user", "path")?;
        let pairs = match args.get("queues") {
            None => DEFAULT_PAIRS,
            Some(q) => match q.parse::<usize>() {
                Ok(n @ 1..=MAX_PAIRS) => n,
                _ => {
                    return Err(super::Error::invalid(format!(
                        "queues must be 1 to {MAX_PAIRS}, not '{q}'"
                    )))
                }
            },
        };
        Ok(Box::new(VhostUser::open(
            path,
            super::flag(args, "client")?,
            pairs,
        )?))
    },
    saved_args: &[],
    saved: |attached, device, mode| {
        attached.unwrap_or_else(|| {
            let mut a: super::KindArgs = [("path".into(), device.into())].into();
            if mode == "client" {
                a.insert("client".into(), "yes".into());
            }
            a
        })
    },
    // A QEMU with `reconnect` comes back to the socket by itself.
    restore: |args| (KIND.open)(args),
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
    fn drain(&self) {
        let net = lock(&self.net).clone();
        if let Some(net) = net {
            net.drain();
        }
    }

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
    pub fn open(path: &str, client: bool, pairs: usize) -> Result<VhostUser, super::Error> {
        if path.is_empty() || path.contains('\0') || !path.starts_with('/') {
            return Err(super::Error::invalid(format!(
                "bad vhost-user socket path '{path}' (an absolute path: valed resolves none)"
            )));
        }
        // Client mode creates and removes nothing at `path`; server mode binds only a free
        // name or a stale socket, and never replaces anything else (see [`super::socket`]).
        let listener = if client {
            None
        } else {
            let (l, name) = super::socket::listen(std::path::Path::new(path))?;
            l.set_nonblocking(true)
                .map_err(|e| super::Error::of_io(format!("cannot listen at '{path}': {e}"), e))?;
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
    /// A fault of the front end's (memory shrunk under valed, an interrupt eventfd that
    /// held a write) ended the connection: nothing more is read or written in its memory.
    broken: AtomicBool,
    /// A queue was taken up where its used ring stood (logged once).
    took_up: AtomicBool,
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
    /// Guards the table `mem` has now (once), in the room of user `uid` (the front end's);
    /// lets go of those only this list still holds. A table that cannot be guarded whole is
    /// an error: the caller ends the connection before anyone touches it.
    pub(super) fn track(&self, mem: &Mem, uid: u32) -> Result<(), guard::GuardError> {
        let now = mem.memory().into_inner();
        let mut list = lock(&self.0);
        list.retain(|t| Arc::strong_count(&t.mem) > 1);
        if list.iter().any(|t| Arc::ptr_eq(&t.mem, &now)) {
            return Ok(());
        }
        let ranges = now.iter().filter_map(|r| {
            let p = r.get_host_address(MemoryRegionAddress(0)).ok()?;
            Some((p as usize, r.len() as usize))
        });
        let guard = Guarded::new(uid, ranges)?;
        list.push(Table { guard, mem: now });
        Ok(())
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
    /// Armed when this pair's forwarding deferred interrupts toward other ports (moderation),
    /// or as kick moderation's backstop (see [`rx::Pace`]).
    timer: OwnedFd,
    /// Kick moderation's state (see [`rx::Pace`]), the pair's worker's alone.
    pace: rx::Pace,
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
                pace: rx::Pace::default(),
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
            took_up: AtomicBool::new(false),
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

    /// Nanoseconds since the connection began (the clock of moderation).
    fn now_ns(&self) -> u64 {
        self.0.epoch.elapsed().as_nanos() as u64
    }

    /// Interrupts the guest on queue `q` (of `st`), or, with the port's moderation knob set
    /// and the last interrupt less than an interval ago, once the interval is over: any
    /// thread may call this; pair 0's worker fires what waits (see `fire_deferred`).
    fn interrupt(&self, st: &VringState<Mem>, q: usize) {
        let m = self.0.shared.moderation_ns.load(Relaxed);
        if m == 0 {
            self.signal(st);
            return;
        }
        let now = self.now_ns();
        let last = self.0.irq_last[q].load(Relaxed);
        if now.saturating_sub(last) >= m {
            self.0.irq_last[q].store(now, Relaxed);
            self.0.irq_pending[q].store(false, Relaxed);
            self.signal(st);
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
            let now = self.now_ns();
            let last = self.0.irq_last[q].load(Relaxed);
            if now.saturating_sub(last) >= m && self.0.irq_pending[q].swap(false, Relaxed) {
                self.0.irq_last[q].store(now, Relaxed);
                self.signal(&vring.get_ref());
            } else if self.0.irq_pending[q].load(Relaxed) {
                next = next.min(last + m - now);
            }
        }
        if next != u64::MAX {
            epoll::arm_timer(&self.0.guest_timer, next.max(1000));
        }
    }

    /// Guards the mappings of the memory table the library has now; one that cannot be
    /// guarded ends the connection (nothing reads or writes it: see [`Net::end`]).
    fn guard_memory(&self) -> io::Result<()> {
        let uid = lock(&self.0.front)
            .as_ref()
            .map_or(u32::MAX, |f| super::socket::peer_uid(f.as_raw_fd()));
        self.0.guarded.track(&self.0.mem, uid).map_err(|e| {
            self.end(&e.to_string());
            io::Error::other(e)
        })
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
        self.end("the front end shrank the guest's memory under valed");
        true
    }

    /// Logs, once a connection, a queue taken up where its used ring stands (see
    /// [`Virtq::new`]): the front end kept its ring from an earlier back end.
    fn note_took_up(&self, q: usize, vq: &Virtq) {
        if let Some((avail, used, at)) = vq.took_up() {
            if !self.0.took_up.swap(true, Relaxed) {
                tracing::warn!(port = %self.0.port, "vhost-user: queue {q} taken up at used index {at} (the front end set it at avail {avail}, used {used}: it kept its ring from an earlier back end; chains that one had not returned are lost)");
            }
        }
    }

    /// Interrupts the guest on the queue of `st`; a front end that made the write sleep loses
    /// its connection.
    fn signal(&self, st: &VringState<Mem>) {
        if let Err(e) = signal_guest(st) {
            self.end(&e.to_string());
        }
    }

    /// Ends the connection from the data path, once, for a fault of the front end's: nothing
    /// more is read or written in the guest's memory.
    fn end(&self, why: &str) {
        if !self.0.broken.swap(true, Relaxed) {
            tracing::error!(port = %self.0.port, "vhost-user: {why}; connection closed");
            // Not through the steps, whose lock a worker may hold here.
            crate::port::add(&self.0.shared.stats.bad_input, 1);
            if let Some(f) = lock(&self.0.front).as_ref() {
                let _ = f.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Logs the first malformed input of a connection.
    fn report(&self, why: &dyn std::fmt::Display) {
        if !self.0.reported.swap(true, Relaxed) {
            tracing::warn!(port = %self.0.port, "vhost-user guest: {why} (counted as bad input; further ones are counted only)");
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

/// Asks the guest for a kick only once it has made `k` more chains available than the
/// device took (the used ring's avail event, with EVENT_IDX; kick moderation, see
/// `rx::Pace`): true when it has already. `notify(vring, true)` is this with `k` = 1.
fn kick_after(vring: &Vring, mem: &GuestMemoryMmap, k: u16) -> bool {
    let st = vring.get_ref();
    let q = st.get_queue();
    if !st.is_enabled() || !q.ready() {
        return false;
    }
    let next = q.next_avail();
    // The avail event follows the used ring's elements; the guest kicks once its avail
    // index passes it.
    let at = q.used_ring() + 4 + 8 * u64::from(q.size());
    let event = next.wrapping_add(k - 1);
    if mem
        .store(event.to_le(), vm_memory::GuestAddress(at), Relaxed)
        .is_err()
    {
        return false;
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    q.avail_idx(mem, std::sync::atomic::Ordering::Acquire)
        .is_ok_and(|idx| idx.0.wrapping_sub(next) >= k)
}

// SAFETY: the pointers are only used during one batch, under the scratch's lock.
unsafe impl Send for TxScratch {}

#[cfg(test)]
mod tests;

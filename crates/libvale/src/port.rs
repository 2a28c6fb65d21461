//! A port as its client sees it: the mapped region, its rings, and the sync calls.

use std::cell::Cell;
use std::io::{self, Read};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use vale_abi::control::{self, default_run_dir, PortCounters, Reply, Request};
use vale_abi::csb::{CsbAtok, CsbKtoa};
use vale_abi::error::{ErrorKind, Refused};
use vale_abi::netmap::{NetmapIf, NetmapRing, NetmapSlot, RING_SLOTS_OFS};
use vale_abi::region::{Layout, PortParams, RegionHeader, VALE_ABI_VERSION};
use vale_abi::spin::Spinner;
use vale_abi::{eventfd, pipe};

use crate::connect;

/// How to open a port: geometry, run directory, whether to start valed.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub params: PortParams,
    /// `None`: `VALE_RUN_DIR`, else `/run/vale`.
    pub run_dir: Option<PathBuf>,
    /// Start valed when none runs for the run directory (default: yes, unless the
    /// environment has `VALE_NO_AUTOSTART=1`).
    pub autostart: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            params: PortParams::default(),
            run_dir: None,
            autostart: std::env::var_os("VALE_NO_AUTOSTART")
                .is_none_or(|v| v.is_empty() || v == "0"),
        }
    }
}

impl OpenOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn rings(&mut self, tx: u32, rx: u32) -> &mut Self {
        self.params.tx_rings = tx;
        self.params.rx_rings = rx;
        self
    }
    pub fn slots(&mut self, n: u32) -> &mut Self {
        self.params.slots = n;
        self
    }
    pub fn buf_size(&mut self, n: u32) -> &mut Self {
        self.params.buf_size = n;
        self
    }
    pub fn run_dir(&mut self, d: impl Into<PathBuf>) -> &mut Self {
        self.run_dir = Some(d.into());
        self
    }
    pub fn autostart(&mut self, on: bool) -> &mut Self {
        self.autostart = on;
        self
    }

    /// Opens (and so creates, if need be) port `name` = `valeX:Y`.
    pub fn open(&self, name: &str) -> io::Result<Port> {
        let invalid = |message: String| {
            Refused {
                kind: ErrorKind::InvalidArgument,
                message,
            }
            .into_io()
        };
        vale_abi::name::parse_port(name).map_err(invalid)?;
        let layout = Layout::new(&self.params).map_err(invalid)?;
        let run_dir = self.run_dir.clone().unwrap_or_else(default_run_dir);
        let ctl = connect::connect(&run_dir, self.autostart)?;
        let req = Request::Open {
            port: name.to_string(),
            params: self.params,
            abi_version: VALE_ABI_VERSION,
        };
        let (reply, fds) = control::exchange(&ctl, &req)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "valed closed the connection")
        })?;
        match reply {
            Reply::Opened { .. } => {}
            Reply::Error { kind, message } => return Err(Refused { kind, message }.into_io()),
            other => {
                return Err(io::Error::other(format!(
                    "unexpected reply from valed: {other:?}"
                )))
            }
        }
        let rings = layout.num_rings() as usize;
        if fds.len() != 1 + 2 * rings {
            return Err(io::Error::other(format!(
                "valed sent {} descriptors, expected {}",
                fds.len(),
                1 + 2 * rings
            )));
        }
        let mut fds = fds.into_iter();
        let memfd = fds.next().expect("counted");
        let (mut kick, mut irq) = (Vec::with_capacity(rings), Vec::with_capacity(rings));
        for _ in 0..rings {
            kick.push(fds.next().expect("counted"));
            irq.push(fds.next().expect("counted"));
        }
        // SAFETY: maps the memfd valed sent, with the size both sides computed.
        let base = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                layout.region_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            NonNull::new_unchecked(p as *mut u8)
        };
        let port = Port {
            name: name.to_string(),
            forks_at_open: forks(),
            base,
            layout,
            ctl,
            memfd,
            kick,
            irq,
            interrupts: AtomicU64::new(0),
            crowded: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            looked_ns: AtomicU64::new(coarse_ns()),
            spin_ns: AtomicU64::new(0),
            waiter: Mutex::new(None),
            waiters: AtomicU32::new(0),
            busy: (0..rings).map(|_| AtomicBool::new(false)).collect(),
        };
        layout
            .check_header(port.region())
            .map_err(io::Error::other)?;
        // Start from valed's view of every ring.
        for i in 0..layout.num_rings() {
            let r = port.ring(i);
            let ktoa = port.ktoa(i);
            // SAFETY: ring header inside our mapping; only this thread uses it yet.
            unsafe {
                let cur = ktoa.hwcur.load(Acquire);
                (*r.ptr.as_ptr()).head = cur;
                (*r.ptr.as_ptr()).cur = cur;
                (*r.ptr.as_ptr()).tail = ktoa.hwtail.load(Acquire);
            }
        }
        Ok(port)
    }
}

/// An open port. Dropping it closes the port (valed frees it, unless it is persistent).
pub struct Port {
    name: String,
    /// [`forks`] when the port was opened: if it has changed, a process forked since, and
    /// the control connection may be shared with another process (see `Drop`).
    forks_at_open: u64,
    base: NonNull<u8>,
    layout: Layout,
    /// The connection that owns the port: valed frees the port when it closes.
    ctl: UnixStream,
    memfd: OwnedFd,
    /// Per region ring (tx, then rx): client-to-valed kick (eventfd), valed-to-client
    /// interrupt (read end of a pipe).
    kick: Vec<OwnedFd>,
    irq: Vec<OwnedFd>,
    /// Interrupts valed raised that `poll` consumed.
    interrupts: AtomicU64,
    /// Busy waits that slept because the CPU was crowded (see [`Port::crowded_waits`]).
    crowded: AtomicU64,
    /// The control connection was seen closed: valed is gone, and the port with it.
    gone: AtomicBool,
    /// When a sync last looked at the control connection (coarse clock, ns).
    looked_ns: AtomicU64,
    /// How [`Port::poll`] waits: 0 sleeps at once ([`Wait::Sleep`]), `u64::MAX` never
    /// sleeps ([`Wait::Busy`]), anything else spins that many ns first ([`Wait::BusyFor`]).
    spin_ns: AtomicU64,
    /// The descriptor of [`Port::fd`], made on first use.
    waiter: Mutex<Option<Arc<Waiter>>>,
    /// [`Waiter`]s made for this port so far. From the second on, the port is *shared*:
    /// several waiters may sleep on one ring at once (netmap's two descriptors on one port,
    /// one thread each), so `appl_need_kick` counts the waiters asking (a sync no longer
    /// clears it: only the waiter that asked withdraws its request), and a sync of a ring
    /// that another thread is syncing is skipped, as netmap skips a busy ring.
    waiters: AtomicU32,
    /// Per region ring: a sync is under way (taken only once the port is shared).
    busy: Box<[AtomicBool]>,
}

/// Forks seen by this process (and its ancestors since libvale was loaded): counted by the
/// fork handlers that [`forks`] installs on first use.
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_fork() {
    FORKS.fetch_add(1, SeqCst);
}

/// The number of forks so far, with the handlers that count them installed.
fn forks() -> u64 {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers plain functions that only bump an atomic (async-signal-safe),
        // in the parent and in the child of every later fork.
        unsafe { libc::pthread_atfork(None, Some(count_fork), Some(count_fork)) };
    });
    FORKS.load(SeqCst)
}

/// How [`Port::poll`] waits when nothing is ready yet (see [`Port::set_wait`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wait {
    /// Sleep in poll(2) on the rings' interrupt lines, with valed asked to interrupt the
    /// client (the default): an idle client costs no CPU, and each wake-up costs a system
    /// call and a trip through the scheduler on both sides.
    #[default]
    Sleep,
    /// Spin on the indices valed writes in the CSB, with valed asked *not* to interrupt the
    /// client. On a CPU of its own: no system call while waiting but one look at the control
    /// connection a millisecond (so a valed that has gone away is still noticed), and a
    /// whole core burned for as long as the wait lasts. On a CPU that other tasks want it
    /// gives way ([`crate::Spinner`]): it yields the CPU between looks, so a partner on the
    /// same CPU runs at once, and while the CPU goes to tasks that keep it, it sleeps as
    /// [`Wait::Sleep`] instead (counted in [`Port::crowded_waits`]), then tries again.
    Busy,
    /// Spin as [`Wait::Busy`] for up to this long per wait, then sleep as [`Wait::Sleep`]
    /// for the rest of it.
    BusyFor(Duration),
}

/// Spins between two looks at the clock and at valed's liveness, in a busy wait.
const SPINS_PER_LOOK: u32 = 128;

thread_local! {
    /// How busy waits of this thread pause: the CPU it runs on is what decides, whatever the
    /// port (see [`vale_abi::spin`]).
    static SPINNER: Cell<Spinner> = const { Cell::new(Spinner::new()) };
}

/// How a busy wait ended.
enum Spun {
    /// A ring is ready.
    Ready(Events),
    /// Its end passed.
    Ended,
    /// The CPU is crowded with tasks that do not give way: the wait sleeps instead.
    GaveWay,
}

/// How often, at most, a sync that found nothing new looks at the control connection.
const LOOK_EVERY_NS: u64 = 1_000_000;

/// A clock read without a system call (vDSO), at the kernel's tick resolution.
fn coarse_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain call with a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The error of every call on a port whose valed has gone away.
fn gone_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "valed went away (its control connection closed); the port is gone",
    )
}

/// Most rings a port has (both directions), plus the control connection: what `poll` watches.
const MAX_POLL_FDS: usize = 2 * vale_abi::region::MAX_RINGS as usize + 1;

/// The poll(2) bits that say a control connection is closed.
const CLOSED: libc::c_short = libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL;

// SAFETY: the mapping is shared memory; rings are used one thread per ring, as documented.
unsafe impl Send for Port {}
unsafe impl Sync for Port {}

/// What [`Port::poll`] waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    /// Some rx ring holds frames.
    pub readable: bool,
    /// Some tx ring has a free slot.
    pub writable: bool,
}

impl Events {
    /// Wait for frames to read.
    pub const READABLE: Events = Events {
        readable: true,
        writable: false,
    };
    /// Wait for room to send.
    pub const WRITABLE: Events = Events {
        readable: false,
        writable: true,
    };
}

/// Some rings of a port: tx rings `tx` and rx rings `rx`, numbered among the port's tx
/// (and rx) rings. A wait on a set syncs and watches those rings only, so threads that each
/// own a ring (netmap's `valeX:Y-N`) can each wait on their own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingSet {
    pub tx: Range<u32>,
    pub rx: Range<u32>,
}

impl RingSet {
    /// Tx ring `i` and rx ring `i`, as netmap binds `-N`.
    pub fn pair(i: u32) -> RingSet {
        RingSet {
            tx: i..i + 1,
            rx: i..i + 1,
        }
    }
}

/// The `epoll` data of the control connection in a [`Waiter`] (rings use their index).
const CTL_TOKEN: u64 = u64::MAX;

/// A pollable descriptor for some rings of a port, for a program's own event loop: an epoll
/// instance watching the interrupt lines of the rings and the control connection. It is
/// readable when valed raised the interrupt of an armed ring or went away.
///
/// valed raises a ring's interrupt only when the client asked for it (`appl_need_kick`), so
/// the loop is: [`Waiter::arm`]; if it says nothing is ready, sleep on [`Waiter::fd`] (with
/// the program's other descriptors); then sync the rings. A sync ends the request for
/// interrupts on its ring, so a busy client costs valed no system call.
pub struct Waiter {
    epoll: OwnedFd,
    set: RingSet,
    /// The directions ([`ASKED_RX`], [`ASKED_TX`]) this waiter asked interrupts for and has
    /// not withdrawn yet: only then can a line hold a byte for it, so only then is a look at
    /// them (a system call) worth making.
    asked: AtomicU8,
}

const ASKED_RX: u8 = 1;
const ASKED_TX: u8 = 2;

fn asked_bits(want: Events) -> u8 {
    (if want.readable { ASKED_RX } else { 0 }) | (if want.writable { ASKED_TX } else { 0 })
}

fn asked_events(bits: u8) -> Events {
    Events {
        readable: bits & ASKED_RX != 0,
        writable: bits & ASKED_TX != 0,
    }
}

impl Waiter {
    /// A descriptor for the rings of `set` (checked against the port).
    pub fn new(port: &Port, set: RingSet) -> io::Result<Waiter> {
        port.check_rings(&set)?;
        port.waiters.fetch_add(1, Relaxed);
        // SAFETY: plain syscall; the descriptor is ours from here on.
        let epoll = unsafe {
            let fd = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let add = |fd: RawFd, events: u32, token: u64| {
            let mut ev = libc::epoll_event { events, u64: token };
            // SAFETY: both descriptors are live; ev outlives the call.
            if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        add(port.ctl.as_raw_fd(), libc::EPOLLRDHUP as u32, CTL_TOKEN)?;
        let all = Events {
            readable: true,
            writable: true,
        };
        for i in port.wanted(&set, all) {
            add(
                port.irq[i as usize].as_raw_fd(),
                libc::EPOLLIN as u32,
                i as u64,
            )?;
        }
        Ok(Waiter {
            epoll,
            set,
            asked: AtomicU8::new(0),
        })
    }

    /// The descriptor to sleep on (readable: look at the rings again).
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// The rings this descriptor watches.
    pub fn rings(&self) -> &RingSet {
        &self.set
    }

    /// Consumes the interrupts that woke the descriptor, then syncs the rings (all tx rings
    /// of the set, and its rx rings if `want.readable`) and returns what is ready. If
    /// nothing is, it asks valed for interrupts on the rings `want` concerns and returns
    /// nothing: sleeping on [`Waiter::fd`] is then safe (no frame can slip by unnoticed).
    /// Fails with [`io::ErrorKind::ConnectionReset`] once valed is gone.
    pub fn arm(&self, port: &Port, want: Events) -> io::Result<Events> {
        let got = self.ready(port, want)?;
        if got != Events::default() {
            return Ok(got);
        }
        self.ask(port, want)
    }

    /// The second half of [`Waiter::arm`], for a caller that has just looked with
    /// [`Waiter::ready`] and found nothing: asks valed for interrupts on the rings `want`
    /// concerns, then looks once more; returns what is ready, or nothing when a sleep on
    /// [`Waiter::fd`] is safe.
    pub fn ask(&self, port: &Port, want: Events) -> io::Result<Events> {
        loop {
            // Ask, full fence, look once more: valed stores hwtail, fences, then reads the
            // flag, so it either interrupts us or we see its tail now (as in `poll_rings`).
            // Each direction is asked once until withdrawn: `appl_need_kick` counts waiters.
            let bits = asked_bits(want);
            let before = self.asked.fetch_or(bits, Relaxed);
            port.ask_interrupts(&self.set, asked_events(bits & !before), 1);
            fence(SeqCst);
            if !port.moved(&self.set, want) {
                return Ok(Events::default());
            }
            let got = port.ready(&self.set, want)?;
            if got != Events::default() {
                // No sleep follows: withdraw the request at once.
                self.withdraw(port);
                return Ok(got);
            }
        }
    }

    /// Withdraws the interrupt requests this waiter made; returns the directions they were
    /// for.
    fn withdraw(&self, port: &Port) -> u8 {
        let bits = self.asked.swap(0, Relaxed);
        if bits != 0 {
            port.ask_interrupts(&self.set, asked_events(bits), 0);
        }
        bits
    }

    /// Consumes the interrupts that woke the descriptor, syncs the rings (all tx rings of the
    /// set, and its rx rings if `want.readable`) and returns what is ready, asking for no
    /// interrupt: for a look after a wake-up, or without sleeping.
    pub fn ready(&self, port: &Port, want: Events) -> io::Result<Events> {
        self.consume(port)?;
        port.ready(&self.set, want)
    }

    /// The descriptors a sleep after [`Waiter::ask`] can watch instead of [`Waiter::fd`]:
    /// the control connection, then the interrupt lines of the rings `want` concerns, as
    /// poll(2) entries appended to `out`. Watching them directly saves the kernel a level of
    /// epoll on every wake-up; after the sleep, hand them to [`Waiter::woken`].
    pub fn lines(&self, port: &Port, want: Events, out: &mut Vec<libc::pollfd>) {
        out.extend(port.sleep_lines(&self.set, want));
    }

    /// After a sleep on [`Waiter::lines`]: empties the lines that were raised and notes a
    /// closed control connection (an error: valed is gone).
    pub fn woken(&self, port: &Port, lines: &[libc::pollfd]) -> io::Result<()> {
        self.withdraw(port);
        port.woken_lines(lines)
    }

    /// Empties the interrupt lines that are readable, and notes a closed control connection.
    fn consume(&self, port: &Port) -> io::Result<()> {
        // Nothing asked, nothing raised: no look (a byte valed wrote just before a sync
        // withdrew the request wakes one sleep, and the `ask` before that sleep sets the flag).
        let bits = self.withdraw(port);
        if bits == 0 {
            return if port.gone.load(Relaxed) {
                Err(gone_error())
            } else {
                Ok(())
            };
        }
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; MAX_POLL_FDS];
        // SAFETY: the array outlives the call and holds evs.len() entries; no wait.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                evs.as_mut_ptr(),
                evs.len() as i32,
                0,
            )
        };
        for ev in &evs[..n.max(0) as usize] {
            let token = ev.u64;
            if token == CTL_TOKEN {
                if ev.events & (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                    port.gone.store(true, Relaxed);
                    return Err(gone_error());
                }
            } else if let Some(irq) = port.irq.get(token as usize) {
                // Only the lines of the rings this waiter asked for, and lines no waiter
                // asks for (a byte raised as a request was withdrawn): another waiter of a
                // shared port may be asleep on the others, and its byte is its wake-up.
                let mine = port
                    .wanted(&self.set, asked_events(bits))
                    .any(|i| i as u64 == token);
                if mine || port.atok(token as u32).appl_need_kick.load(Relaxed) == 0 {
                    port.interrupts.fetch_add(pipe::drain(irq), Relaxed);
                }
            }
        }
        if port.gone.load(Relaxed) {
            return Err(gone_error());
        }
        Ok(())
    }
}

impl Port {
    /// Opens `name` with default options.
    pub fn open(name: &str) -> io::Result<Port> {
        OpenOptions::new().open(name)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Interrupts from valed that [`Port::poll`] has consumed so far (each one raised counts
    /// once; with interrupt moderation, several deliveries share one; a client that leaves
    /// thousands unread loses the surplus, which changes nothing: it has a wake-up pending).
    pub fn interrupts(&self) -> u64 {
        self.interrupts.load(Relaxed)
    }

    /// Busy waits ([`Wait::Busy`], [`Wait::BusyFor`]) on this port that slept instead of
    /// spinning because the waiting thread's CPU was crowded: other tasks kept it when the
    /// wait yielded it (see [`crate::Spinner`]). 0 on a CPU of the waiter's own.
    pub fn crowded_waits(&self) -> u64 {
        self.crowded.load(Relaxed)
    }

    /// Chooses how [`Port::poll`] waits from now on (the default is [`Wait::Sleep`]).
    ///
    /// Busy waiting changes nothing in the protocol: only the client's own flag,
    /// `appl_need_kick`, which a busy wait never sets, so valed never raises the interrupt
    /// line for it (no system call on valed's side either). What tells valed to look at
    /// the client's rings is unchanged: [`Port::txsync`] still kicks valed when, asleep, it
    /// asked for it, so a busy client works against a valed that sleeps (it saves only its
    /// own wake-ups) as against one that busy-polls (`valed --busy-poll-us`, whose rings
    /// stay awake and need no kick: then neither side notifies the other, and the client
    /// makes no system call per packet).
    pub fn set_wait(&self, wait: Wait) {
        let ns = match wait {
            Wait::Sleep => 0,
            Wait::Busy => u64::MAX,
            // A spin of 584 years or more is a spin without end in all but name.
            Wait::BusyFor(d) => u64::try_from(d.as_nanos())
                .unwrap_or(u64::MAX)
                .clamp(1, u64::MAX - 1),
        };
        self.spin_ns.store(ns, Relaxed);
    }

    /// How [`Port::poll`] waits (see [`Port::set_wait`]).
    pub fn wait_mode(&self) -> Wait {
        match self.spin_ns.load(Relaxed) {
            0 => Wait::Sleep,
            u64::MAX => Wait::Busy,
            ns => Wait::BusyFor(Duration::from_nanos(ns)),
        }
    }

    /// This port's counters as valed keeps them (one control round trip; not for a hot loop).
    pub fn counters(&self) -> io::Result<PortCounters> {
        match control::exchange(&self.ctl, &Request::List)? {
            Some((Reply::List { switches }, _)) => switches
                .iter()
                .flat_map(|s| s.ports.iter())
                .find(|p| p.name == self.name)
                .map(|p| p.counters)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("port '{}' is gone", self.name),
                    )
                }),
            Some((Reply::Error { kind, message }, _)) => Err(Refused { kind, message }.into_io()),
            _ => Err(io::Error::other("unexpected reply from valed")),
        }
    }

    pub fn params(&self) -> &PortParams {
        &self.layout.params
    }

    /// The region's layout, as this client computed it (and checked valed's header against).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The region's memfd, for a second mapping of the same memory (netmap's `mmap` of the
    /// netmap descriptor), and its size.
    pub fn memfd(&self) -> (RawFd, usize) {
        (self.memfd.as_raw_fd(), self.layout.region_size as usize)
    }

    /// The region header valed wrote (magic, ABI version, offsets).
    pub fn region(&self) -> &RegionHeader {
        // SAFETY: offset 0 of our mapping, checked size.
        unsafe { &*(self.base.as_ptr() as *const RegionHeader) }
    }

    /// The netmap interface descriptor, for netmap-style code.
    pub fn nifp(&self) -> *mut NetmapIf {
        // SAFETY: inside the mapping.
        unsafe { self.base.as_ptr().add(self.layout.nifp_ofs as usize) as *mut NetmapIf }
    }

    fn ring(&self, i: u32) -> Ring {
        // Our own layout, not the (writable) ring_ofs[] in the mapping.
        // SAFETY: both offsets lie inside the mapping.
        let (ring, bufs) = unsafe {
            (
                self.base.as_ptr().add(self.layout.ring_ofs(i) as usize),
                self.base.as_ptr().add(self.layout.bufs_ofs as usize),
            )
        };
        Ring {
            ptr: NonNull::new(ring as *mut NetmapRing).expect("mapped"),
            bufs: NonNull::new(bufs).expect("mapped"),
            num_bufs: self.layout.num_bufs,
            num_slots: self.layout.params.slots,
            buf_size: self.layout.params.buf_size,
        }
    }

    fn atok(&self, i: u32) -> &CsbAtok {
        // SAFETY: inside the mapping, 64-byte aligned.
        unsafe {
            &*(self.base.as_ptr().add(self.layout.csb_atok_ofs(i) as usize) as *const CsbAtok)
        }
    }

    fn ktoa(&self, i: u32) -> &CsbKtoa {
        // SAFETY: as above.
        unsafe {
            &*(self.base.as_ptr().add(self.layout.csb_ktoa_ofs(i) as usize) as *const CsbKtoa)
        }
    }

    fn tx_index(&self, ring: u32) -> io::Result<u32> {
        if ring < self.layout.params.tx_rings {
            Ok(ring)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no tx ring {ring}"),
            ))
        }
    }

    fn rx_index(&self, ring: u32) -> io::Result<u32> {
        if ring < self.layout.params.rx_rings {
            Ok(self.layout.params.tx_rings + ring)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no rx ring {ring}"),
            ))
        }
    }

    pub fn tx_ring(&self, ring: u32) -> Ring {
        self.ring(self.tx_index(ring).expect("tx ring index in range"))
    }

    pub fn rx_ring(&self, ring: u32) -> Ring {
        self.ring(self.rx_index(ring).expect("rx ring index in range"))
    }

    /// Publishes `head`/`cur` of region ring `i` and refreshes its `tail`.
    fn sync(&self, i: u32, may_kick: bool) -> io::Result<()> {
        let ring = self.ring(i);
        if self.gone.load(Relaxed) {
            return Err(gone_error());
        }
        if !self.shared() {
            return self.sync_ring(i, ring, ring.head(), ring.cur(), may_kick);
        }
        // Shared: one sync of a ring at a time (two would publish heads out of order); a
        // sync that finds the ring busy is skipped, as netmap's `nm_kr_tryget` does.
        let busy = &self.busy[i as usize];
        if busy.swap(true, Acquire) {
            return Ok(());
        }
        // Read the ring again under the flag: the other sync may have moved it.
        let r = self.sync_ring(i, ring, ring.head(), ring.cur(), may_kick);
        busy.store(false, Release);
        r
    }

    /// The body of [`Port::sync`], `head` and `cur` checked.
    fn sync_ring(&self, i: u32, ring: Ring, head: u32, cur: u32, may_kick: bool) -> io::Result<()> {
        let n = ring.num_slots();
        if head >= n || cur >= n {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring {i}: head {head} / cur {cur} out of range (slots {n})"),
            ));
        }
        let atok = self.atok(i);
        let ktoa = self.ktoa(i);
        // A sync means the client is awake: stop asking for interrupts on this ring (a wait
        // armed with `Waiter::arm` is over once the client looks at the ring again). Not on
        // a shared port: there the sync may be another thread's, and each waiter withdraws
        // its own request.
        if !self.shared() && atok.appl_need_kick.load(Relaxed) != 0 {
            atok.appl_need_kick.store(0, Relaxed);
        }
        atok.cur.store(cur, Relaxed);
        // Only this client writes head: what it holds is what valed was last told.
        let moved = atok.head.load(Relaxed) != head;
        // Release: the slots filled before head are visible to valed before head is.
        atok.head.store(head, Release);
        // A head that did not move gives valed nothing to do: no kick (a sync of an idle
        // ring must cost no system call, as netmap's CSB mode).
        if may_kick && moved {
            // Store head, full fence, then load kern_need_kick: valed stores the flag, fences,
            // then re-reads head, so either we see its flag and kick, or it sees our head.
            fence(SeqCst);
            if ktoa.kern_need_kick.load(Relaxed) != 0 {
                eventfd::signal(&self.kick[i as usize]);
            }
        }
        // Acquire: what valed wrote in the slots before hwtail is visible to us.
        let tail = ktoa.hwtail.load(Acquire);
        if tail == ring.tail() {
            // Nothing new: valed may be gone. Look now and then only, so a busy ring costs
            // no system call and an idle one about one a millisecond.
            self.check_alive()?;
        }
        ring.set_tail(tail);
        Ok(())
    }

    /// Looks at the control connection, at most every [`LOOK_EVERY_NS`]; fails if it is
    /// closed.
    fn check_alive(&self) -> io::Result<()> {
        let now = coarse_ns();
        if now.wrapping_sub(self.looked_ns.load(Relaxed)) < LOOK_EVERY_NS {
            return Ok(());
        }
        self.looked_ns.store(now, Relaxed);
        let mut p = self.ctl_pollfd();
        // SAFETY: one live pollfd, no wait.
        if unsafe { libc::poll(&mut p, 1, 0) } == 1 {
            self.note_ctl(p.revents)?;
        }
        Ok(())
    }

    /// The control connection as poll(2) watches it: for its closing only (replies to
    /// requests are read by whoever sent them).
    fn ctl_pollfd(&self) -> libc::pollfd {
        libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        }
    }

    /// Records what poll(2) said of the control connection; an error if it is closed.
    fn note_ctl(&self, revents: libc::c_short) -> io::Result<()> {
        if revents & CLOSED != 0 {
            self.gone.store(true, Relaxed);
            return Err(gone_error());
        }
        Ok(())
    }

    /// Sends what the client queued on tx ring `ring` (slots from the last `head` to the
    /// new one) and reclaims the slots valed is done with. Fails with
    /// [`io::ErrorKind::ConnectionReset`] once valed has gone away (noticed within about a
    /// millisecond of syncs that find nothing new).
    pub fn txsync(&self, ring: u32) -> io::Result<()> {
        self.sync(self.tx_index(ring)?, true)
    }

    /// Returns the slots before `head` of rx ring `ring` to valed and picks up new frames.
    /// Fails as [`Port::txsync`] once valed has gone away.
    pub fn rxsync(&self, ring: u32) -> io::Result<()> {
        // valed never waits on an rx ring: it reads head when it delivers.
        self.sync(self.rx_index(ring)?, false)
    }

    /// Every ring of the port.
    pub fn all_rings(&self) -> RingSet {
        RingSet {
            tx: 0..self.layout.params.tx_rings,
            rx: 0..self.layout.params.rx_rings,
        }
    }

    /// The rings `set` names, checked against the port: an error names a ring it lacks.
    pub fn check_rings(&self, set: &RingSet) -> io::Result<()> {
        let p = &self.layout.params;
        if set.tx.end > p.tx_rings || set.rx.end > p.rx_rings {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "rings tx {:?} rx {:?}: the port has {} tx and {} rx rings",
                    set.tx, set.rx, p.tx_rings, p.rx_rings
                ),
            ));
        }
        Ok(())
    }

    /// Syncs the rings of `set` that `want` names and says which are ready, without
    /// sleeping. The tx rings of the set are synced whatever `want` says, as netmap's poll
    /// does: slots queued before a wait for frames go out (a sync that moved nothing costs
    /// no system call).
    fn ready(&self, set: &RingSet, want: Events) -> io::Result<Events> {
        let mut got = Events::default();
        for r in set.tx.clone() {
            self.txsync(r)?;
            got.writable |= want.writable && self.tx_ring(r).space() > 0;
        }
        if want.readable {
            for r in set.rx.clone() {
                self.rxsync(r)?;
                got.readable |= !self.rx_ring(r).is_empty();
            }
        }
        Ok(got)
    }

    /// Region ring indices of `set` that `want` concerns.
    fn wanted(&self, set: &RingSet, want: Events) -> impl Iterator<Item = u32> {
        let t = self.layout.params.tx_rings;
        let tx = if want.writable { set.tx.clone() } else { 0..0 };
        let rx = if want.readable { set.rx.clone() } else { 0..0 };
        tx.chain(rx.start + t..rx.end + t)
    }

    /// Has valed moved `hwtail` past what the client last saw, on a ring of `set` that
    /// `want` concerns? A hint only (relaxed); a sync reads it again with acquire ordering.
    fn moved(&self, set: &RingSet, want: Events) -> bool {
        self.wanted(set, want)
            .any(|i| self.ktoa(i).hwtail.load(Relaxed) != self.ring(i).tail())
    }

    /// The busy wait of [`Port::poll`]: spins until a ring `want` names is ready, `end`
    /// passes (`None`: never), or the CPU is too crowded to spin on (see [`Spun`]). Fails as
    /// soon as valed is seen gone.
    ///
    /// It syncs the rings once (pushing out pending tx slots, and kicking valed if it
    /// sleeps, as a sleeping poll does), then only reads `hwtail` in the CSB, a cache line
    /// valed writes, until it moves; only then does it sync again. So a spin makes no
    /// system call of its own: a sync kicks only when valed sleeps on the ring and asked
    /// for it, and while nothing moves the spin does not sync at all, so it never kicks in
    /// a loop (which would get its ring muted). `appl_need_kick` stays 0, so valed raises no
    /// interrupt either.
    ///
    /// Between two looks it pauses as the thread's [`Spinner`] says: a CPU pause while the
    /// CPU is its own, a `sched_yield` while other tasks want it (a partner on the same CPU
    /// runs at once instead of after a time slice), and no spin at all while it backs off
    /// from a CPU that others keep (the wait sleeps instead). Every [`SPINS_PER_LOOK`] looks
    /// it reads the clock (vDSO, no system call) and, at most once a millisecond, polls the
    /// control connection without waiting: a valed that died ends the spin with the error of
    /// a gone port.
    fn spin(&self, set: &RingSet, want: Events, end: Option<Instant>) -> io::Result<Spun> {
        SPINNER.with(|cell| {
            let mut spinner = cell.get();
            let r = self.spin_with(&mut spinner, set, want, end);
            cell.set(spinner);
            r
        })
    }

    fn spin_with(
        &self,
        spinner: &mut Spinner,
        set: &RingSet,
        want: Events,
        end: Option<Instant>,
    ) -> io::Result<Spun> {
        if !spinner.begin() {
            return Ok(Spun::GaveWay);
        }
        let got = self.ready(set, want)?;
        if got != Events::default() {
            return Ok(Spun::Ready(got));
        }
        loop {
            for _ in 0..SPINS_PER_LOOK {
                // Relaxed: only a hint that something moved; the sync reads it again with
                // acquire ordering before the client touches a slot.
                if self.moved(set, want) {
                    spinner.worked();
                    let got = self.ready(set, want)?;
                    if got != Events::default() {
                        return Ok(Spun::Ready(got));
                    }
                }
                if !spinner.pause() {
                    return Ok(Spun::GaveWay);
                }
            }
            if self.gone.load(Relaxed) {
                return Err(gone_error());
            }
            self.check_alive()?;
            if end.is_some_and(|e| Instant::now() >= e) {
                return Ok(Spun::Ended);
            }
        }
    }

    /// The port's pollable descriptor: readable when a ring [`Port::arm`] armed may be ready,
    /// or when valed went away. For a program's own event loop (poll, select, epoll); it
    /// stays valid until the port is closed.
    pub fn fd(&self) -> io::Result<RawFd> {
        Ok(self.waiter()?.fd())
    }

    /// Gets the port ready for a sleep on [`Port::fd`]: syncs every ring (see
    /// [`Waiter::arm`]) and returns what is ready already, or nothing when the sleep is safe.
    pub fn arm(&self, want: Events) -> io::Result<Events> {
        self.waiter()?.arm(self, want)
    }

    fn waiter(&self) -> io::Result<Arc<Waiter>> {
        let mut w = self.waiter.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = &*w {
            return Ok(w.clone());
        }
        let made = Arc::new(Waiter::new(self, self.all_rings())?);
        *w = Some(made.clone());
        Ok(made)
    }

    /// What a sleep for `want` on the rings of `set` watches, as poll(2) entries: the
    /// control connection first (it closes when valed dies), then the interrupt lines of the
    /// rings `want` concerns.
    fn sleep_lines(&self, set: &RingSet, want: Events) -> impl Iterator<Item = libc::pollfd> + '_ {
        std::iter::once(self.ctl_pollfd()).chain(self.wanted(set, want).map(|i| libc::pollfd {
            fd: self.irq[i as usize].as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }))
    }

    /// After a sleep on [`Port::sleep_lines`]: empties the lines that were raised and notes a
    /// closed control connection (an error: valed is gone).
    fn woken_lines(&self, lines: &[libc::pollfd]) -> io::Result<()> {
        let Some((ctl, irqs)) = lines.split_first() else {
            return Ok(());
        };
        for p in irqs.iter().filter(|p| p.revents != 0) {
            self.interrupts.fetch_add(pipe::drain(&p.fd), Relaxed);
        }
        self.note_ctl(ctl.revents)
    }

    /// Asks (1) for interrupts on the rings of `set` that `want` concerns, or withdraws the
    /// request (0): `appl_need_kick` counts the waiters asking (valed raises the line while
    /// it is not 0); a withdrawal never takes it below 0 (a sync of an unshared port clears
    /// it).
    fn ask_interrupts(&self, set: &RingSet, want: Events, on: u32) {
        for i in self.wanted(set, want) {
            let flag = &self.atok(i).appl_need_kick;
            if on != 0 {
                flag.fetch_add(1, Relaxed);
            } else {
                let _ = flag.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
            }
        }
    }

    /// Is the port shared by several waiters (see `Port::waiters`)?
    fn shared(&self) -> bool {
        self.waiters.load(Relaxed) > 1
    }

    /// Waits until some rx ring has frames (`readable`) or some tx ring has room
    /// (`writable`), or `timeout` passes (`None`: forever). Syncs the rings it looks at.
    /// Also watches the control connection: fails with [`io::ErrorKind::ConnectionReset`]
    /// as soon as valed goes away.
    ///
    /// With [`Wait::Busy`] (see [`Port::set_wait`]) it never sleeps: it spins until a ring
    /// is ready or `timeout` passes, and fails once valed is gone (noticed within about a
    /// millisecond, or a clock tick); with [`Wait::BusyFor`] it spins up to that long, then
    /// sleeps.
    pub fn poll(&self, want: Events, timeout: Option<Duration>) -> io::Result<Events> {
        self.poll_rings(&self.all_rings(), want, timeout)
    }

    /// [`Port::poll`] on the rings of `set` only: it syncs and watches those and no others,
    /// so threads that each own a ring can each wait on theirs at the same time.
    pub fn poll_rings(
        &self,
        set: &RingSet,
        want: Events,
        timeout: Option<Duration>,
    ) -> io::Result<Events> {
        self.check_rings(set)?;
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let spin = self.spin_ns.load(Relaxed);
        if spin != 0 {
            let spin_end = (spin != u64::MAX).then(|| start + Duration::from_nanos(spin));
            let end = match (deadline, spin_end) {
                (Some(d), Some(s)) => Some(d.min(s)),
                (d, s) => d.or(s),
            };
            match self.spin(set, want, end)? {
                Spun::Ready(got) => return Ok(got),
                Spun::Ended => {
                    if spin == u64::MAX || deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(Events::default());
                    }
                }
                // The rest of the wait sleeps, as with Wait::Sleep.
                Spun::GaveWay => {
                    self.crowded.fetch_add(1, Relaxed);
                }
            }
        }
        loop {
            let got = self.ready(set, want)?;
            if got != Events::default() {
                return Ok(got);
            }
            let left = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(got);
                    }
                    (d - now).as_millis().clamp(1, i32::MAX as u128) as i32
                }
                None => -1,
            };
            // Ask for interrupts, full fence, then look once more: valed stores hwtail,
            // fences, then reads appl_need_kick, so it either interrupts us or we see its
            // tail here. Only then is sleeping safe.
            self.ask_interrupts(set, want, 1);
            fence(SeqCst);
            let mut closed = Ok(());
            if !self.moved(set, want) {
                let mut pfds = [self.ctl_pollfd(); MAX_POLL_FDS];
                let mut n = 0;
                for p in self.sleep_lines(set, want) {
                    pfds[n] = p;
                    n += 1;
                }
                // SAFETY: the array outlives the call and holds at least `n` entries.
                let r = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, left) };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                closed = self.woken_lines(&pfds[..n]);
            }
            self.ask_interrupts(set, want, 0);
            closed?;
        }
    }
}

/// Longest a close waits for valed to confirm the port is free.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl Drop for Port {
    fn drop(&mut self) {
        // Closing is synchronous: say we are done, then wait until valed, having freed the
        // port, closes its end. The name can be opened again as soon as this returns.
        //
        // Unless a fork came since the open: the control connection may then be another
        // process's too (a child holding the inherited port, or the parent of a child that
        // closes its copies), and a shutdown would end the port for both. Only this
        // process's descriptors close; valed frees the port when the last copy of the
        // connection closes, as the kernel ends a netmap port with its last descriptor.
        if forks() == self.forks_at_open
            && self.ctl.shutdown(std::net::Shutdown::Write).is_ok()
            && self.ctl.set_read_timeout(Some(CLOSE_WAIT)).is_ok()
        {
            let mut sink = [0u8; 256];
            while matches!((&self.ctl).read(&mut sink), Ok(n) if n > 0) {}
        }
        // SAFETY: unmaps exactly what `open` mapped.
        unsafe {
            libc::munmap(
                self.base.as_ptr() as *mut libc::c_void,
                self.layout.region_size as usize,
            )
        };
    }
}

/// A netmap ring of an open port, with netmap's helpers. Valid while its [`Port`] is.
#[derive(Clone, Copy)]
pub struct Ring {
    ptr: NonNull<NetmapRing>,
    bufs: NonNull<u8>,
    num_bufs: u32,
    // Geometry from the layout both sides computed, not from the ring header, which the
    // client may overwrite: the bounds checks below must hold whatever the header says.
    num_slots: u32,
    buf_size: u32,
}

impl Ring {
    #[inline(always)]
    fn hdr(&self) -> *mut NetmapRing {
        self.ptr.as_ptr()
    }
    #[inline(always)]
    pub fn num_slots(&self) -> u32 {
        self.num_slots
    }
    #[inline(always)]
    pub fn buf_size(&self) -> u32 {
        self.buf_size
    }
    #[inline(always)]
    pub fn head(&self) -> u32 {
        // SAFETY (all accessors): the ring header lies in the port's mapping; the client is
        // its only writer.
        unsafe { (*self.hdr()).head }
    }
    #[inline(always)]
    pub fn cur(&self) -> u32 {
        unsafe { (*self.hdr()).cur }
    }
    #[inline(always)]
    pub fn tail(&self) -> u32 {
        unsafe { (*self.hdr()).tail }
    }
    #[inline(always)]
    pub fn set_head(&self, v: u32) {
        unsafe { (*self.hdr()).head = v }
    }
    #[inline(always)]
    pub fn set_cur(&self, v: u32) {
        unsafe { (*self.hdr()).cur = v }
    }
    #[inline(always)]
    fn set_tail(&self, v: u32) {
        unsafe { (*self.hdr()).tail = v }
    }
    /// netmap's `nm_ring_next`.
    #[inline(always)]
    pub fn next(&self, i: u32) -> u32 {
        vale_abi::netmap::ring_next(i, self.num_slots())
    }
    /// netmap's `nm_ring_space`: slots from `cur` to `tail`.
    #[inline(always)]
    pub fn space(&self) -> u32 {
        vale_abi::netmap::ring_distance(self.cur(), self.tail(), self.num_slots())
    }
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.cur() == self.tail()
    }
    /// Moves `head` and `cur` forward by `n` slots.
    #[inline(always)]
    pub fn advance(&self, n: u32) {
        let v = (self.cur() + n) % self.num_slots();
        self.set_cur(v);
        self.set_head(v);
    }
    /// Slot `i` (`i` < `num_slots`).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub fn slot(&self, i: u32) -> &mut NetmapSlot {
        assert!(i < self.num_slots(), "slot index out of range");
        // SAFETY: in range; slots of a ring are the client's between head and tail.
        unsafe {
            &mut *((self.hdr() as *mut u8).add(RING_SLOTS_OFS + 16 * i as usize) as *mut NetmapSlot)
        }
    }
    /// Buffer `idx`, as netmap's `NETMAP_BUF(ring, idx)`.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub fn buf(&self, idx: u32) -> &mut [u8] {
        assert!(idx < self.num_bufs, "buffer index out of range");
        let size = self.buf_size() as usize;
        // SAFETY: index checked against the pool of this port's own mapping.
        unsafe { std::slice::from_raw_parts_mut(self.bufs.as_ptr().add(idx as usize * size), size) }
    }
}

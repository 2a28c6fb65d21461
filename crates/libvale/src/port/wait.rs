//! Waiting for a port's rings: sleeping on the interrupt lines (a [`Waiter`] per thread that
//! waits), or busy-waiting on the CSB ([`Wait::Busy`]), which gives way on a crowded CPU.

use super::*;

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
pub(super) const SPINS_PER_LOOK: u32 = 128;

thread_local! {
    /// How busy waits of this thread pause: the CPU it runs on is what decides, whatever the
    /// port (see [`vale_abi::spin`]).
    static SPINNER: Cell<Spinner> = const { Cell::new(Spinner::new()) };
}

/// How a busy wait ended.
pub(super) enum Spun {
    /// A ring is ready.
    Ready(Events),
    /// Its end passed.
    Ended,
    /// The CPU is crowded with tasks that do not give way: the wait sleeps instead.
    GaveWay,
}

/// How often, at most, a sync that found nothing new looks at the control connection.
pub(super) const LOOK_EVERY_NS: u64 = 1_000_000;

/// A clock read without a system call (vDSO), at the kernel's tick resolution.
pub(super) fn coarse_ns() -> u64 {
    vale_abi::clock::ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// Most rings a port has (both directions), plus the control connection: what `poll` watches.
pub(super) const MAX_POLL_FDS: usize = 2 * vale_abi::region::MAX_RINGS as usize + 1;

/// The poll(2) bits that say a control connection is closed.
pub(super) const CLOSED: libc::c_short =
    libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL;

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
pub(super) const CTL_TOKEN: u64 = u64::MAX;

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

pub(super) const ASKED_RX: u8 = 1;

pub(super) const ASKED_TX: u8 = 2;

pub(super) fn asked_bits(want: Events) -> u8 {
    (if want.readable { ASKED_RX } else { 0 }) | (if want.writable { ASKED_TX } else { 0 })
}

pub(super) fn asked_events(bits: u8) -> Events {
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
    /// Looks at the control connection, at most every [`LOOK_EVERY_NS`]; fails if it is
    /// closed.
    pub(super) fn check_alive(&self) -> io::Result<()> {
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
    pub(super) fn ctl_pollfd(&self) -> libc::pollfd {
        libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        }
    }

    /// Records what poll(2) said of the control connection; an error if it is closed.
    pub(super) fn note_ctl(&self, revents: libc::c_short) -> io::Result<()> {
        if revents & CLOSED != 0 {
            self.gone.store(true, Relaxed);
            return Err(gone_error());
        }
        Ok(())
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
    pub(super) fn ready(&self, set: &RingSet, want: Events) -> io::Result<Events> {
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
    pub(super) fn wanted(&self, set: &RingSet, want: Events) -> impl Iterator<Item = u32> {
        let t = self.layout.params.tx_rings;
        let tx = if want.writable { set.tx.clone() } else { 0..0 };
        let rx = if want.readable { set.rx.clone() } else { 0..0 };
        tx.chain(rx.start + t..rx.end + t)
    }

    /// Has valed moved `hwtail` past what the client last saw, on a ring of `set` that
    /// `want` concerns? A hint only (relaxed); a sync reads it again with acquire ordering.
    pub(super) fn moved(&self, set: &RingSet, want: Events) -> bool {
        let t = self.layout.params.tx_rings;
        self.wanted(set, want).any(|i| {
            let ring = self.ring(i);
            if i >= t {
                ring.prefetch_next();
            }
            self.ktoa(i).hwtail.load(Relaxed) != ring.tail()
        })
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
    pub(super) fn spin(
        &self,
        set: &RingSet,
        want: Events,
        end: Option<Instant>,
    ) -> io::Result<Spun> {
        SPINNER.with(|cell| {
            let mut spinner = cell.get();
            let r = self.spin_with(&mut spinner, set, want, end);
            cell.set(spinner);
            r
        })
    }

    pub(super) fn spin_with(
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

    pub(super) fn waiter(&self) -> io::Result<Arc<Waiter>> {
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
    pub(super) fn sleep_lines(
        &self,
        set: &RingSet,
        want: Events,
    ) -> impl Iterator<Item = libc::pollfd> + '_ {
        std::iter::once(self.ctl_pollfd()).chain(self.wanted(set, want).map(|i| libc::pollfd {
            fd: self.irq[i as usize].as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }))
    }

    /// After a sleep on [`Port::sleep_lines`]: empties the lines that were raised and notes a
    /// closed control connection (an error: valed is gone).
    pub(super) fn woken_lines(&self, lines: &[libc::pollfd]) -> io::Result<()> {
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
    pub(super) fn ask_interrupts(&self, set: &RingSet, want: Events, on: u32) {
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
    pub(super) fn shared(&self) -> bool {
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

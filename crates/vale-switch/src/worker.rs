//! Forwarding threads.
//!
//! Each worker serves a set of source tx rings. A ring is *active* while it has work: the
//! worker polls it batch after batch with `kern_need_kick` clear, so the client never makes a
//! system call. When a ring runs dry the worker sets `kern_need_kick`, fences, and looks at the
//! ring once more; only if nothing arrived does it drop the ring from the active list. A worker
//! with no active ring sleeps in `epoll_wait` on the kick eventfds: idle ports cost no CPU
//! (mSwitch). An optional busy-poll interval keeps a dry ring active a little longer, trading
//! CPU for latency. Without one, a ring is still kept active for up to the *adaptive spin*
//! (`valed --spin-us`, [`crate::DEFAULT_SPIN`]) when the last time it ran dry its next frame
//! came sooner than that: an exchange in progress (a request and its answer, a stream with
//! short gaps) then costs the client no kick and valed no wake-up per frame, while a ring whose
//! last gap was longer, or whose spin ran out, sleeps at once: an idle port costs nothing, and
//! a port that falls quiet costs one spin. While it polls dry rings only, the worker pauses
//! between passes as a [`Spinner`] says: on a CPU of its own it just spins; when other tasks want the CPU it yields
//! it after each dry pass (a busy client on the same CPU runs at once, not after a time slice);
//! and when the CPU goes to tasks that keep it, the spinner backs off and dry rings go to sleep
//! at once, as without busy-polling, until it tries again.
//!
//! Kicks cost valed no system call: kick eventfds are watched edge-triggered and never read
//! (each write of the client is an event; the counter just grows). A kick is work only if the
//! ring's `head` moved while it slept; any other kick (a client kicking in a loop, say) costs
//! a look at `head`, at most one per ring per pass of the loop. A ring whose kicks keep
//! bringing nothing is muted for a while (its eventfd leaves the epoll set), so a kick storm
//! neither wakes the worker nor touches its epoll instance; a muted ring is still looked at.
//!
//! Rings are dealt to workers in turn as ports open, which cannot know which rings will send:
//! two senders can land on one worker while another serves only idle rings. So every
//! [`LOOK_EVERY_NS`] a worker counts its busy rings (those that took [`BUSY_SLOTS`] or more
//! since its last look), and one that had two or more while another worker had none hands one
//! ring to it. The hand-off happens
//! between two batches of the giving worker, so the ring's frames keep their order.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::epoll;
use crate::forward::Pipeline;
use crate::port::Port;
use crate::switch::Switch;
use vale_abi::eventfd;
use vale_abi::spin::Spinner;

pub enum Cmd {
    /// Serve tx ring `ring` of `port`.
    Add {
        sw: Arc<Switch>,
        port: Arc<Port>,
        ring: u32,
    },
    /// Stop serving every ring of `port`; answer on `done` once no reference is left.
    Remove {
        port: Arc<Port>,
        done: mpsc::Sender<()>,
    },
}

/// The control plane's handle on a worker thread.
pub struct Worker {
    inbox: Mutex<Vec<Cmd>>,
    wake: OwnedFd,
    /// What the thread did, for `vale-ctl top` and the metrics.
    pub stats: WorkerStats,
}

/// A worker's counters. The thread is their only writer (plain loads and stores, no atomic
/// read-modify-write on the forwarding path); anyone may read them.
#[derive(Default)]
pub struct WorkerStats {
    /// The thread's kernel id, once it runs: its CPU time is the kernel's to tell
    /// (`/proc/self/task/TID/schedstat`), at no cost to forwarding.
    pub tid: AtomicU32,
    /// Passes over a ring that took at least one frame.
    pub batches: AtomicU64,
    /// Slots those passes took (a frame of several slots counts each).
    pub slots: AtomicU64,
    /// Source rings served now.
    pub rings: AtomicU32,
    /// Rings that forwarded between the worker's last two looks, and the engine clock of the
    /// last look (a worker that stopped looking has slept: see [`WorkerStats::idle`]). A
    /// worker that hands it a ring writes both too, so that no other picks it meanwhile.
    pub busy_rings: AtomicU32,
    pub looked_at: AtomicU64,
}

impl WorkerStats {
    /// No ring of this worker forwarded lately, at engine clock `now`.
    fn idle(&self, now: u64) -> bool {
        self.busy_rings.load(Relaxed) == 0
            || now.saturating_sub(self.looked_at.load(Relaxed)) > 2 * LOOK_EVERY_NS
    }

    /// Adds to counters only this thread writes.
    fn count(&self, batches: u64, slots: u64) {
        self.batches
            .store(self.batches.load(Relaxed) + batches, Relaxed);
        self.slots.store(self.slots.load(Relaxed) + slots, Relaxed);
    }

    /// Nanoseconds thread `tid` of this process spent on a CPU (0 if the kernel does not
    /// say).
    pub fn cpu_ns(tid: u32) -> u64 {
        if tid == 0 {
            return 0;
        }
        // schedstat: run time in ns, wait time, timeslices. Without CONFIG_SCHEDSTATS-like
        // support, stat's utime + stime (clock ticks).
        if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
            if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
                return ns;
            }
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
            return 0;
        };
        // Fields after the command name (which may hold spaces, closed by the last ')').
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // utime and stime are fields 14 and 15 of stat; rest starts at field 3.
        let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        ticks * (1_000_000_000 / hz)
    }
}

impl Worker {
    /// Starts worker thread `id`; `peers` will hold every worker, this one too (see
    /// [`Loop::look`]).
    pub fn spawn(
        id: usize,
        busy_poll: Duration,
        spin: Duration,
        epoch: Instant,
        peers: Arc<OnceLock<Vec<Arc<Worker>>>>,
    ) -> io::Result<Arc<Worker>> {
        let w = Arc::new(Worker {
            inbox: Mutex::new(Vec::new()),
            wake: eventfd::new()?,
            stats: WorkerStats::default(),
        });
        let me = w.clone();
        let mut lp = Loop::new(me, busy_poll, spin, epoch, peers)?;
        std::thread::Builder::new()
            .name(format!("vale-worker-{id}"))
            .spawn(move || lp.run())?;
        Ok(w)
    }

    pub fn send(&self, cmd: Cmd) {
        self.inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cmd);
        eventfd::signal(&self.wake);
    }
}

struct Source {
    sw: Arc<Switch>,
    port: Arc<Port>,
    ring: u32,
    active: bool,
    /// Engine clock when the ring was first seen dry (busy-poll and spin only).
    dry_since: Option<u64>,
    /// Engine clock when the ring ran dry before it went to sleep (adaptive spin only).
    slept_at: Option<u64>,
    /// Its last gap between running dry and its next frame was shorter than the adaptive
    /// spin: spin before sleeping next time.
    spin: bool,
    /// Kicks in a row that found no work (see [`Loop::kicked`]).
    spurious: u32,
    /// Mutes in a row, for the back-off; 0 once a kick brings work.
    mutes: u32,
    /// While muted: the engine clock when the kick eventfd is watched again.
    muted_until: Option<u64>,
    /// Slots taken since the worker's last look.
    moved: u64,
}

/// The adaptive spin of valed's default mode (`valed --spin-us`): longer than a sleeping
/// client's turn in a ping-pong across two CPUs (about 20 µs here), short enough that a port
/// falling quiet costs little. Measured in docs/benchmarks.md (latency).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Kicks in a row that bring no work before a ring is muted. A client that follows the
/// protocol makes at most one such kick per sleep of its ring (it kicked just as valed found
/// its new `head` by itself), and its next kick brings work.
const MUTE_AFTER: u32 = 64;
/// Spurious kicks a ring may make after a mute before the next one.
const REARM_GRACE: u32 = 4;
/// First mute, doubled at each mute in a row up to [`MUTE_MAX_NS`]: how long a client that
/// stormed and then sends real work may wait at worst for an idle worker to notice it.
const MUTE_MIN_NS: u64 = 1_000_000;
const MUTE_MAX_NS: u64 = 16_000_000;

/// How often a busy worker counts the rings that forward, and may hand one to an idle worker.
const LOOK_EVERY_NS: u64 = 100_000_000;
/// Passes of the loop between two readings of the clock for the look.
const LOOK_PASSES: u32 = 64;
/// While rings are active, passes between two looks at the epoll set (a system call, 0.1
/// µs or more; a dry pass costs tens of ns): a kick of a sleeping ring, a command or the timer
/// waits at most this many passes, a microsecond or two when they are dry.
const COLLECT_PASSES: u32 = 16;
/// A pass that moved this many slots or more is followed by a look at the epoll set at once
/// (its cost is small beside the pass's), so that a loaded worker still sees a sleeping
/// ring's kick within a pass or two; a pass that moved fewer (a ping-pong's frame) is not,
/// since the frame that answers it may come while the worker is in the system call.
const COLLECT_SLOTS: u64 = 32;
/// How often the adaptive spin is tried again on rings whose last gap was long, and for how
/// long each time (see [`Probe`]): longer than a slow round trip, so that every ring of
/// an exchange wakes in it.
const PROBE_EVERY_NS: u64 = 10_000_000;
const PROBE_WINDOW_NS: u64 = 300_000;
/// Dry passes in a row one reading of the clock serves for the dry rings' busy-poll and spin
/// intervals (a dry pass takes tens of ns, a reading about 20).
const CLOCK_PASSES: u32 = 8;
/// Slots a ring must have taken since the last look to count as busy (about 10000 frames a
/// second): a ring that carried a frame or two, an announcement say, is not load worth moving.
const BUSY_SLOTS: u64 = 1024;

const TOKEN_WAKE: u64 = u64::MAX;
const TOKEN_TIMER: u64 = u64::MAX - 1;

/// The adaptive spin's probe windows: now and then every ring that wakes spins, whatever its
/// last gap.
///
/// A ring spins before it sleeps only if its last gap was short, and the gaps of an exchange
/// are short only while its rings spin: once one round trip outlasts the spin (a client
/// descheduled a moment), every hop costs the worker a wake-up, the round trips stay longer
/// than the spin, and the spin never comes back (a sleeping ping-pong held at 56-115 µs
/// instead of 32 on the 2-vCPU machine). An exchange whose rings all spin together in a
/// window is fast again and keeps them spinning; an idle port (no wake-up) costs nothing, a
/// port whose frames really come far apart one vain spin a window.
#[derive(Default)]
struct Probe {
    /// Engine clock when the next window opens, and when the last one ends.
    next: u64,
    until: u64,
}

impl Probe {
    /// Whether a window is open at `now`, opening one if the last opened
    /// [`PROBE_EVERY_NS`] ago or more.
    fn open(&mut self, now: u64) -> bool {
        if now >= self.next {
            self.next = now + PROBE_EVERY_NS;
            self.until = now + PROBE_WINDOW_NS;
        }
        now < self.until
    }
}

struct Loop {
    me: Arc<Worker>,
    epoll: OwnedFd,
    /// Raises moderated interrupts on time.
    timer: OwnedFd,
    sources: Vec<Option<Source>>,
    active: Vec<usize>,
    /// Tokens of muted rings (not in the epoll set).
    muted: Vec<usize>,
    pipe: Pipeline,
    busy_poll_ns: u64,
    /// The adaptive spin, ns (0: none; unused with a busy-poll interval).
    spin_ns: u64,
    /// How the busy-poll pauses between dry passes (see [`Spinner`]).
    spinner: Spinner,
    /// Every worker (set once all have started).
    peers: Arc<OnceLock<Vec<Arc<Worker>>>>,
    /// Engine clock of the next look, and passes of the loop until the clock is read again.
    next_look: u64,
    passes: u32,
    /// Passes since the last look at the epoll set (see [`COLLECT_PASSES`]).
    quiet_passes: u32,
    /// The adaptive spin's probe windows.
    probe: Probe,
    /// The engine clock as last read for the dry rings, and dry passes since (see
    /// [`CLOCK_PASSES`]).
    clock_ns: Option<u64>,
    clock_passes: u32,
}

impl Loop {
    fn new(
        me: Arc<Worker>,
        busy_poll: Duration,
        spin: Duration,
        epoch: Instant,
        peers: Arc<OnceLock<Vec<Arc<Worker>>>>,
    ) -> io::Result<Loop> {
        let epoll = epoll::new()?;
        let timer = epoll::new_timer()?;
        epoll::add(&epoll, me.wake.as_raw_fd(), TOKEN_WAKE)?;
        epoll::add(&epoll, timer.as_raw_fd(), TOKEN_TIMER)?;
        Ok(Loop {
            me,
            epoll,
            timer,
            sources: Vec::new(),
            active: Vec::new(),
            muted: Vec::new(),
            pipe: Pipeline::new(epoch),
            busy_poll_ns: busy_poll.as_nanos() as u64,
            spin_ns: if busy_poll.is_zero() {
                spin.as_nanos() as u64
            } else {
                0
            },
            spinner: Spinner::new(),
            peers,
            next_look: LOOK_EVERY_NS,
            passes: 0,
            quiet_passes: 0,
            probe: Probe::default(),
            clock_ns: None,
            clock_passes: 0,
        })
    }

    fn run(&mut self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        self.me.stats.tid.store(tid, Relaxed);
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // Sleep only when no ring is active (and no longer than a mute lasts); otherwise
            // just collect new kicks.
            let timeout = if !self.active.is_empty() {
                0
            } else if self.muted.is_empty() {
                -1
            } else {
                self.mute_left_ms()
            };
            // Active rings are polled whatever their kicks say, so while there are some the
            // epoll set is looked at only every COLLECT_PASSES passes and after a pass that
            // moved COLLECT_SLOTS or more: a busy-polling worker's look at a ring is then tens
            // of ns apart, not a system call.
            let n = if timeout == 0 && self.quiet_passes < COLLECT_PASSES {
                0
            } else {
                self.quiet_passes = 0;
                // The clock reading kept for dry rings is not carried over a look that may
                // have slept.
                self.clock_ns = None;
                epoll::wait(&self.epoll, &mut events, timeout).len()
            };
            for ev in &events[..n] {
                match ev.u64 {
                    TOKEN_WAKE => {
                        eventfd::drain(&self.me.wake);
                        self.commands();
                    }
                    TOKEN_TIMER => {
                        eventfd::drain(&self.timer);
                    }
                    t => self.kicked(t as usize),
                }
            }
            if !self.muted.is_empty() {
                self.unmute_due();
            }
            let slots = self.round();
            let moved = slots != 0;
            self.quiet_passes = if slots >= COLLECT_SLOTS {
                COLLECT_PASSES
            } else {
                self.quiet_passes + 1
            };
            if (self.busy_poll_ns | self.spin_ns) != 0 && !self.active.is_empty() {
                // Every active ring was dry (busy-polled) unless something moved: pause, or
                // yield the CPU to whoever wants it; a spinner that backs off makes the next
                // round put the dry rings to sleep.
                if moved {
                    self.spinner.worked();
                } else {
                    self.spinner.pause();
                }
            }
            self.passes += 1;
            if self.passes >= LOOK_PASSES {
                self.passes = 0;
                let now = self.pipe.notifier.now_ns();
                if now >= self.next_look {
                    // Counts over a longer time than a look's (the worker slept meanwhile) say
                    // little of its load now: they are published, nothing is handed over.
                    let steady = now - self.next_look < LOOK_EVERY_NS;
                    self.next_look = now + LOOK_EVERY_NS;
                    self.look(now, steady);
                }
            }
            let next = self.pipe.notifier.fire_due();
            self.arm_timer(next);
        }
    }

    /// Counts the rings that took [`BUSY_SLOTS`] or more since the last look; with two or more
    /// (`steady`: looks came on time, the worker was busy throughout), hands the last of them
    /// to a worker that had none (one ring a look, so loads settle between moves).
    fn look(&mut self, now: u64, steady: bool) {
        let mut busy = 0u32;
        let mut give = None;
        for (token, s) in self.sources.iter_mut().enumerate() {
            if let Some(s) = s {
                if s.moved >= BUSY_SLOTS {
                    busy += 1;
                    give = Some(token);
                }
                s.moved = 0;
            }
        }
        self.me.stats.busy_rings.store(busy, Relaxed);
        self.me.stats.looked_at.store(now, Relaxed);
        let (Some(token), Some(peers)) = (give, self.peers.get()) else {
            return;
        };
        if busy < 2 || !steady {
            return;
        }
        let Some(idle) = peers
            .iter()
            .find(|w| !Arc::ptr_eq(w, &self.me) && w.stats.idle(now))
            .cloned()
        else {
            return;
        };
        let s = self.forget(token);
        tracing::debug!(port = %s.port.name(), ring = s.ring, "ring handed to an idle worker");
        // Claimed until that worker's own next look, so no other worker picks it this round.
        idle.stats.busy_rings.store(1, Relaxed);
        idle.stats.looked_at.store(now, Relaxed);
        idle.send(Cmd::Add {
            sw: s.sw,
            port: s.port,
            ring: s.ring,
        });
        self.publish_rings();
    }

    /// Tells the stats how many rings this worker serves now.
    fn publish_rings(&self) {
        let rings = self.sources.iter().flatten().count() as u32;
        self.me.stats.rings.store(rings, Relaxed);
    }

    /// Stops serving ring `token`: out of the epoll set and the active and muted lists.
    fn forget(&mut self, token: usize) -> Source {
        let s = self.sources[token].take().expect("a source");
        if let Some(t) = s
            .port
            .attachment
            .as_ref()
            .and_then(|a| a.tx.get(s.ring as usize))
        {
            // The fd is still open: we hold the port.
            epoll::del(&self.epoll, t.kick.as_raw_fd());
        }
        self.active.retain(|&t| t != token);
        self.muted.retain(|&t| t != token);
        s
    }

    fn commands(&mut self) {
        let cmds = std::mem::take(&mut *self.me.inbox.lock().unwrap_or_else(|e| e.into_inner()));
        for cmd in cmds {
            match cmd {
                Cmd::Add { sw, port, ring } => {
                    // A ring handed over by another worker may belong to a port that left
                    // meanwhile: this worker may have answered its removal already.
                    let Some(kick) = port
                        .attachment
                        .as_ref()
                        .filter(|a| !a.released.load(SeqCst))
                        .and_then(|a| a.tx.get(ring as usize))
                        .map(|t| t.kick.as_raw_fd())
                    else {
                        continue;
                    };
                    let token = match self.sources.iter().position(|s| s.is_none()) {
                        Some(t) => t,
                        None => {
                            self.sources.push(None);
                            self.sources.len() - 1
                        }
                    };
                    if let Err(e) = epoll::add_edge(&self.epoll, kick, token as u64) {
                        tracing::error!(port = %port.name(), "cannot watch kick eventfd: {e}");
                        continue;
                    }
                    self.sources[token] = Some(Source {
                        sw,
                        port,
                        ring,
                        active: false,
                        dry_since: None,
                        slept_at: None,
                        spin: false,
                        spurious: 0,
                        mutes: 0,
                        muted_until: None,
                        moved: 0,
                    });
                    // Packets may have been published before the ring was watched.
                    self.activate(token);
                }
                Cmd::Remove { port, done } => {
                    for token in 0..self.sources.len() {
                        let mine = self.sources[token]
                            .as_ref()
                            .is_some_and(|s| Arc::ptr_eq(&s.port, &port));
                        if mine {
                            self.forget(token);
                        }
                    }
                    self.pipe.notifier.forget(&port);
                    drop(port);
                    let _ = done.send(());
                }
            }
        }
        self.publish_rings();
    }

    /// A kick arrived: if the ring's `head` moved since it went to sleep, poll it from now on,
    /// without kicks. Otherwise the kick brought nothing and is ignored: the ring stays asleep
    /// with `kern_need_kick` set.
    ///
    /// No wake-up is lost by ignoring it: a client publishes `head` before it kicks, and the
    /// kick (a write system call) happens before epoll reports it, so the `head` read here is
    /// at least the one that kick was for. If it equals `seen_head`, that work was taken
    /// already (valed looked at the ring with the flag set before it slept); any later
    /// publication finds the flag set and kicks again, a new event (edge-triggered: every
    /// write is one).
    fn kicked(&mut self, token: usize) {
        let Some(Some(s)) = self.sources.get_mut(token) else {
            return;
        };
        if s.active || s.muted_until.is_some() {
            return;
        }
        let Some(a) = &s.port.attachment else { return };
        let head = a.region.atok(s.ring).head.load(Relaxed);
        if head != a.tx[s.ring as usize].seen_head.load(Relaxed) {
            s.spurious = 0;
            s.mutes = 0;
            self.activate(token);
            return;
        }
        s.spurious = s.spurious.saturating_add(1);
        if s.spurious < MUTE_AFTER {
            return;
        }
        // Kicks that keep bringing nothing: stop watching the eventfd for a while, so that
        // they cost this worker nothing at all, not even a wake-up.
        let period = (MUTE_MIN_NS << s.mutes.min(16)).min(MUTE_MAX_NS);
        s.mutes += 1;
        s.muted_until = Some(self.pipe.notifier.now_ns() + period);
        epoll::del(&self.epoll, a.tx[s.ring as usize].kick.as_raw_fd());
        self.muted.push(token);
    }

    /// Polls ring `token` from now on, without kicks.
    fn activate(&mut self, token: usize) {
        let Some(Some(s)) = self.sources.get_mut(token) else {
            return;
        };
        let Some(a) = &s.port.attachment else { return };
        a.region.ktoa(s.ring).kern_need_kick.store(0, Relaxed);
        s.dry_since = None;
        if let Some(slept) = s.slept_at.take() {
            // Spin before sleeping next time if the gap since it slept was short, or while a
            // probe window is open.
            let now = self.pipe.notifier.now_ns();
            s.spin = now - slept < self.spin_ns || (self.spin_ns != 0 && self.probe.open(now));
        }
        if !s.active {
            s.active = true;
            self.active.push(token);
        }
    }

    /// Milliseconds until the first muted ring is due, at least 1 (the sleep of `epoll_wait`).
    fn mute_left_ms(&self) -> i32 {
        let now = self.pipe.notifier.now_ns();
        let due = self
            .muted
            .iter()
            .filter_map(|&t| self.sources[t].as_ref()?.muted_until)
            .min()
            .unwrap_or(now);
        (due.saturating_sub(now).div_ceil(1_000_000)).clamp(1, 1000) as i32
    }

    /// Watches the kick eventfds of muted rings again once their time is up, and wakes a muted
    /// ring at once if its `head` moved (the worker is awake anyway).
    ///
    /// A kick made while the ring was muted is not lost, only delayed: valed never reads a
    /// kick eventfd, so its counter stays non-zero, and adding it back to the epoll set reports
    /// it at once (`EPOLL_CTL_ADD` checks readiness); [`Loop::kicked`] then finds the new
    /// `head`.
    fn unmute_due(&mut self) {
        let now = self.pipe.notifier.now_ns();
        let mut i = 0;
        while i < self.muted.len() {
            let token = self.muted[i];
            let s = self.sources[token].as_mut().expect("muted rings exist");
            let a = s.port.attachment.as_ref().expect("sources are attached");
            let txr = &a.tx[s.ring as usize];
            let moved = a.region.atok(s.ring).head.load(Relaxed) != txr.seen_head.load(Relaxed);
            if !moved && s.muted_until.is_some_and(|t| now < t) {
                i += 1;
                continue;
            }
            s.muted_until = None;
            // The eventfd reports at once (its counter is not zero): a client that stopped
            // storming stays watched, one that goes on is muted again after a few kicks.
            s.spurious = MUTE_AFTER - REARM_GRACE;
            self.muted.swap_remove(i);
            if let Err(e) = epoll::add_edge(&self.epoll, txr.kick.as_raw_fd(), token as u64) {
                tracing::error!(port = %s.port.name(), "cannot watch kick eventfd: {e}");
            }
            if moved {
                s.spurious = 0;
                s.mutes = 0;
                self.activate(token);
            }
        }
    }

    /// One batch from every active ring; rings that ran dry go back to sleep (after the
    /// busy-poll interval, unless the spinner backs off). The slots the rings took.
    fn round(&mut self) -> u64 {
        let (mut batches, mut slots) = (0u64, 0u64);
        let spinning = self.spinner.spinning();
        let busy_poll_ns = if self.busy_poll_ns != 0 && spinning {
            self.busy_poll_ns
        } else {
            0
        };
        let spin_ns = if spinning { self.spin_ns } else { 0 };
        // One clock reading serves every dry ring of up to CLOCK_PASSES dry passes in a row,
        // between two looks at the epoll set: a ring's dry time may be counted from that
        // many dry passes early.
        let mut clock = if self.clock_passes < CLOCK_PASSES {
            self.clock_passes += 1;
            self.clock_ns
        } else {
            None
        };
        let mut i = 0;
        while i < self.active.len() {
            let token = self.active[i];
            let s = self.sources[token].as_mut().expect("active rings exist");
            let took = self.pipe.forward(&s.sw, &s.port, s.ring);
            if took != 0 {
                batches += 1;
                slots += u64::from(took);
                s.moved += u64::from(took);
                s.dry_since = None;
                i += 1;
                continue;
            }
            if busy_poll_ns != 0 {
                let now = *clock.get_or_insert_with(|| self.pipe.notifier.now_ns());
                let since = *s.dry_since.get_or_insert(now);
                if now - since < busy_poll_ns {
                    i += 1;
                    continue;
                }
            } else if spin_ns != 0 && s.spin {
                let now = *clock.get_or_insert_with(|| self.pipe.notifier.now_ns());
                let since = *s.dry_since.get_or_insert(now);
                if now - since < spin_ns {
                    i += 1;
                    continue;
                }
                // Spun in vain: sleep at once next time, until a gap is short again.
                s.spin = false;
            }
            let a = s.port.attachment.as_ref().expect("sources are attached");
            let ktoa = a.region.ktoa(s.ring);
            ktoa.kern_need_kick.store(1, Relaxed);
            // Store the flag, full fence, then re-read head: the client stores head, fences,
            // then reads the flag, so either it kicks or we see its head here.
            fence(SeqCst);
            let head = a.region.atok(s.ring).head.load(Relaxed);
            if head != a.tx[s.ring as usize].seen_head.load(Relaxed) {
                ktoa.kern_need_kick.store(0, Relaxed);
                i += 1;
                continue;
            }
            s.active = false;
            if self.spin_ns != 0 {
                // The gap is counted from when the ring ran dry, spin included: frames 60 µs
                // apart with a 50 µs spin must not make every spin a vain one.
                s.slept_at = Some(s.dry_since.unwrap_or_else(|| self.pipe.notifier.now_ns()));
            }
            self.active.swap_remove(i);
        }
        if batches != 0 {
            // A pass that moved frames may have taken long: the next reads the clock afresh.
            self.clock_ns = None;
            self.me.stats.count(batches, slots);
        } else if clock != self.clock_ns {
            (self.clock_ns, self.clock_passes) = (clock, 0);
        }
        slots
    }

    fn arm_timer(&self, next_ns: Option<u64>) {
        if let Some(ns) = next_ns {
            epoll::arm_timer(&self.timer, ns);
        }
    }
}

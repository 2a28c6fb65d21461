//! Busy waiting that gives way on a crowded CPU.
//!
//! A busy waiter (a client in `Wait::Busy`, a valed worker with `--busy-poll-us`) spins on
//! shared memory instead of sleeping. With a CPU to itself that is the fastest wait there is;
//! with another runnable task on its CPU it is the slowest: the spinner keeps the CPU until the
//! scheduler ends its time slice (a millisecond or so), while the task it waits for — its
//! partner in a ping-pong, say — waits to run. Three busy parties on two vCPUs took 0.2–1 ms a
//! round trip where three sleeping ones took 0.1 ms.
//!
//! A [`Spinner`] watches for that and has three modes:
//!
//! - **spinning**: no system call. The caller calls [`Spinner::pause`] after every fruitless
//!   look at its rings; every pause reads the clock (vDSO). Two pauses more than [`GAP_NS`]
//!   apart mean the spinner was off its CPU for a while; if the thread's count of involuntary
//!   context switches moved meanwhile (`getrusage(RUSAGE_THREAD)`, `ru_nivcsw`, read then and
//!   every [`CHECK_NS`]), another task had the CPU for that long — one that waited for the
//!   spinner's time slice to end — so it goes on *yielding*. A task that wakes, preempts the
//!   spinner and soon sleeps again (a sleeping partner) leaves a short gap: it needs no yield.
//!   A partner that yields back within microseconds leaves no gap either, though it waited
//!   for the spinner's whole time slice: so a spin of [`CHECK_NS`] or more that ends with the
//!   count moved since its last reading goes on yielding too (see `spin_over`). A spinner
//!   made with [`Spinner::yielding_every`] also yields once in every so long of a fruitless
//!   spin, for a woken task that did not preempt it ([`YIELD_EVERY_NS`]).
//! - **yielding**: `sched_yield()` in every pause, so a runnable task on this CPU runs at once
//!   (a partner that yields too hands the CPU back within microseconds: three busy parties on
//!   one CPU take some 10 µs a round trip). One yield in [`SAMPLE_EVERY`] is bracketed by two
//!   readings of the count: if none of those let another task run during a whole
//!   [`CHECK_NS`], nobody is waiting for the CPU any more and it goes back to spinning. A yield
//!   that comes back only after [`LONG_YIELD_NS`], [`LONG_YIELDS`] times in a row, means the
//!   CPU went to a task that does not give way (a compiler, say): a spinner then waits for
//!   that task's time slices, where a sleeper's wake-up would preempt it, so it goes on
//!   *backing off*.
//! - **backing off**: the caller sleeps instead of spinning (its waits are those of a sleeping
//!   client or valed) for [`BACKOFF_MIN_NS`], doubled with each back-off in a row up to
//!   [`BACKOFF_MAX_NS`]; then it tries again, yielding (a spin would hold a still crowded CPU
//!   for a whole time slice before it noticed). A check without a late yield ends the row.
//!
//! So busy waiting is never much worse than sleeping: on a crowded CPU it either takes turns
//! at once or sleeps. `sched_yield` with nobody else runnable returns at once but is a system
//! call (about 0.5 µs on the 2-vCPU machine of bench/README.md, so one in every look would
//! add that to each hop of a round trip): a spinner alone on its CPU stays in the first mode,
//! which costs one clock read (about 20 ns) a pause and a `getrusage` (about 0.3 µs) a
//! [`CHECK_NS`].

/// Two pauses further apart than this: the spinner was off its CPU for longer than a sleeping
/// task's wake-up takes (a look at the rings takes nanoseconds).
pub const GAP_NS: u64 = 50_000;
/// How often the context switch count is read while spinning (a fresh baseline for a gap),
/// and the time without a yield that let another task run after which a yielding spinner
/// spins again.
pub const CHECK_NS: u64 = 1_000_000;
/// One yield in this many is bracketed by readings of the context switch count.
pub const SAMPLE_EVERY: u32 = 16;
/// A yield that takes this long handed the CPU to a task that kept it: a partner that yields
/// too hands it back within microseconds, a task that does not after its time slice.
pub const LONG_YIELD_NS: u64 = 200_000;
/// Long yields in a row before backing off (the first may be a partner that has not noticed
/// the crowd yet: it still spins without yielding until its slice ends).
pub const LONG_YIELDS: u32 = 2;
/// First back-off, and the longest (doubled with each back-off in a row).
pub const BACKOFF_MIN_NS: u64 = 20_000_000;
pub const BACKOFF_MAX_NS: u64 = 1_000_000_000;
/// For a spinner made with [`Spinner::yielding_every`]: a spin that has found nothing for
/// this long yields the CPU once, and again each time as long, so that a task woken on its CPU
/// that the scheduler did not let preempt it (Linux's EEVDF need not) runs then, not after the
/// spinner's time slice, which the spinner would only notice once it ended. For threads that
/// share CPUs as a matter of course: valed's vhost-user pair workers, a thread per queue pair
/// (two of them polling on one CPU with the front ends they serve: a round trip's 99th
/// percentile at 1-2 ms in most runs without, 23-57 µs with; docs/benchmarks.md). Not for
/// the rest: the native ping-pong's default mode, whose adaptive spin pauses this way too,
/// lost 0.3-1.7 µs of median and up to 20 µs of 99th percentile with it. Alone on its CPU a
/// yield returns at once (about 0.5 µs).
pub const YIELD_EVERY_NS: u64 = 10_000;

/// What a busy waiter does next (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Spin without system calls: the CPU is the waiter's own.
    Spinning,
    /// Yield the CPU between looks: other tasks want it and give it back.
    Yielding,
    /// Sleep instead of spinning until the monotonic clock reads `until` (ns).
    BackingOff { until: u64 },
}

/// The state of one busy-waiting thread (see the module docs). Plain data: keep one per
/// thread (the counts it reads are the thread's own).
#[derive(Clone, Copy, Debug)]
pub struct Spinner {
    mode: Mode,
    /// Clock of the last pause of the current spin; 0: none yet (the spin began, or the
    /// waiter found work, since: the time between says nothing of the CPU).
    last_pause: u64,
    /// Clock of the first pause of the current spin (0: none yet).
    spin_began: u64,
    /// Spinning: how long a spin goes without a yield (0: no limit), and when the current one
    /// yields next (see [`YIELD_EVERY_NS`]).
    yield_every: u64,
    next_yield: u64,
    /// Spinning: when the context switch count was read last (0: never); yielding: when the
    /// current check began.
    checked_at: u64,
    /// The count at its last reading.
    switches: i64,
    /// Yields made, and whether a sampled one let another task run since the last check.
    yields: u32,
    switched: bool,
    /// Long yields in a row, and whether one came since the last check.
    long_yields: u32,
    late: bool,
    /// Back-offs in a row.
    backoffs: u32,
}

impl Default for Spinner {
    fn default() -> Self {
        Self::new()
    }
}

impl Spinner {
    pub const fn new() -> Spinner {
        Spinner::yielding_every(0)
    }

    /// A spinner that, spinning, yields the CPU after every `ns` of a spin that finds nothing
    /// (0: never; see [`YIELD_EVERY_NS`]).
    pub const fn yielding_every(ns: u64) -> Spinner {
        Spinner {
            yield_every: ns,
            mode: Mode::Spinning,
            last_pause: 0,
            spin_began: 0,
            next_yield: 0,
            checked_at: 0,
            switches: 0,
            yields: 0,
            switched: false,
            long_yields: 0,
            late: false,
            backoffs: 0,
        }
    }

    /// The mode it is in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// At the start of a wait: whether to spin (false while backing off: sleep instead).
    pub fn begin(&mut self) -> bool {
        self.spin_over();
        self.may_spin(now_ns())
    }

    /// Whether a waiter that goes by rounds (a valed worker) may keep a dry ring polled now:
    /// false while backing off. No clock read unless it is backing off.
    pub fn spinning(&mut self) -> bool {
        match self.mode {
            Mode::BackingOff { .. } => self.may_spin(now_ns()),
            _ => true,
        }
    }

    /// The waiter found work: the time until its next pause is work, not a gap.
    pub fn worked(&mut self) {
        self.spin_over();
    }

    /// The current spin is over. One that went on for [`CHECK_NS`] or more and during which
    /// another task had the CPU (the count moved since its last reading) held the CPU for a
    /// whole time slice while that task waited: the partner that yields back within
    /// microseconds leaves no gap to see, so this is how such a spinner learns to yield too
    /// (two spinners on one CPU, one yielding and one not, took 1-4 ms a turn). No clock
    /// read; a `getrusage` only after a long spin.
    fn spin_over(&mut self) {
        if self.mode == Mode::Spinning
            && self.spin_began != 0
            && self.last_pause.wrapping_sub(self.spin_began) >= CHECK_NS
        {
            let fresh = self.checked_at != 0;
            if self.read_switches() && fresh {
                self.enter_yielding(self.last_pause);
            }
        }
        self.spin_began = 0;
        self.last_pause = 0;
    }

    /// After a look that found nothing: waits a little (a CPU pause, or a `sched_yield` when
    /// other tasks want the CPU) and says whether to go on spinning (false: sleep instead,
    /// the spinner is backing off).
    pub fn pause(&mut self) -> bool {
        let now = now_ns();
        match self.mode {
            Mode::Spinning => {
                let gap = self.last_pause != 0 && now - self.last_pause > GAP_NS;
                if self.last_pause == 0 {
                    self.spin_began = now;
                    self.next_yield = now + self.yield_every;
                }
                self.last_pause = now;
                if gap || now.wrapping_sub(self.checked_at) >= CHECK_NS {
                    let fresh = self.checked_at != 0;
                    let moved = self.read_switches();
                    self.checked_at = now;
                    if gap && moved && fresh {
                        self.enter_yielding(now);
                        return self.yield_now(now);
                    }
                }
                if self.yield_every != 0 && now >= self.next_yield {
                    // A task that runs long in this yield leaves a gap the next pause sees,
                    // as a preemption would.
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                    self.next_yield = now_ns() + self.yield_every;
                    return true;
                }
                std::hint::spin_loop();
                true
            }
            Mode::Yielding => {
                if now.wrapping_sub(self.checked_at) >= CHECK_NS {
                    self.checked_at = now;
                    if !self.late {
                        self.backoffs = 0;
                    }
                    self.late = false;
                    if !std::mem::take(&mut self.switched) {
                        // No yield of a whole check let anyone run: the CPU is ours again.
                        self.mode = Mode::Spinning;
                        self.read_switches();
                        self.last_pause = now;
                        std::hint::spin_loop();
                        return true;
                    }
                }
                self.yield_now(now)
            }
            Mode::BackingOff { .. } => self.may_spin(now),
        }
    }

    /// Whether to spin now (false while backing off), at clock `now`.
    fn may_spin(&mut self, now: u64) -> bool {
        match self.mode {
            Mode::BackingOff { until } if now < until => false,
            Mode::BackingOff { .. } => {
                // Try again, yielding: a CPU still crowded shows in two yields (a spin would
                // first hold it for a whole time slice); one that is free in a check.
                self.enter_yielding(now);
                true
            }
            _ => true,
        }
    }

    /// Yields from now on; the first check is [`CHECK_NS`] after `now`.
    fn enter_yielding(&mut self, now: u64) {
        self.mode = Mode::Yielding;
        self.checked_at = now;
        self.switched = false;
        self.long_yields = 0;
        self.late = false;
    }

    /// Yields the CPU; backs off after [`LONG_YIELDS`] long yields in a row.
    fn yield_now(&mut self, before: u64) -> bool {
        self.yields = self.yields.wrapping_add(1);
        let sample = self.yields.is_multiple_of(SAMPLE_EVERY);
        if sample {
            self.read_switches();
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
        let after = now_ns();
        if sample && self.read_switches() {
            self.switched = true;
        }
        self.last_pause = after;
        if after - before < LONG_YIELD_NS {
            self.long_yields = 0;
            return true;
        }
        self.switched = true;
        self.late = true;
        self.long_yields += 1;
        if self.long_yields < LONG_YIELDS {
            return true;
        }
        let backoff = (BACKOFF_MIN_NS << self.backoffs.min(16)).min(BACKOFF_MAX_NS);
        self.backoffs = self.backoffs.saturating_add(1);
        self.long_yields = 0;
        self.mode = Mode::BackingOff {
            until: after + backoff,
        };
        false
    }

    /// Reads the thread's count of involuntary context switches (a yield that let another
    /// task run counts as one too): whether it moved since the last reading.
    fn read_switches(&mut self) -> bool {
        // SAFETY: an all-zero rusage is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: fills the live struct; RUSAGE_THREAD needs nothing else.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
            return false;
        }
        let moved = ru.ru_nivcsw != self.switches;
        self.switches = ru.ru_nivcsw;
        moved
    }
}

/// The monotonic clock in ns (vDSO: no system call).
pub fn now_ns() -> u64 {
    crate::clock::ns(libc::CLOCK_MONOTONIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::*};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Pins the calling thread to `cpu`.
    fn pin(cpu: usize) {
        // SAFETY: an all-zero cpu_set_t is a valid (empty) set; the call reads a live set of
        // the size given, for the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0,
                "pin to cpu {cpu}"
            );
        }
    }

    /// A CPU this thread may run on.
    fn some_cpu() -> usize {
        // SAFETY: as in `pin`, reading the calling thread's set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .find(|&c| libc::CPU_ISSET(c, &set))
                .expect("a CPU")
        }
    }

    /// Two threads on one CPU pass a ball back and forth, each spinning until it is its turn:
    /// with pure spins every turn waits for the other's time slice to end (milliseconds);
    /// with a Spinner they yield to each other (microseconds), or sleep a little when a third
    /// task keeps the CPU. 2000 turns each within 5 s (a few ms when they yield; about 18 s
    /// when they spin without giving way).
    #[test]
    fn spinners_sharing_a_cpu_take_turns() {
        const TURNS: u64 = 2000;
        let cpu = some_cpu();
        let ball = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let deadline = start + Duration::from_secs(5);
        let players: Vec<_> = (0..2u64)
            .map(|me| {
                let ball = ball.clone();
                std::thread::spawn(move || {
                    pin(cpu);
                    let mut spinner = Spinner::new();
                    for turn in 0..TURNS {
                        let mine = 2 * turn + me;
                        if !spinner.begin() {
                            std::thread::sleep(Duration::from_micros(20));
                        }
                        while ball.load(Acquire) != mine {
                            if Instant::now() > deadline {
                                return Err(turn);
                            }
                            if !spinner.pause() {
                                std::thread::sleep(Duration::from_micros(20));
                            }
                        }
                        ball.store(mine + 1, Release);
                    }
                    Ok(())
                })
            })
            .collect();
        for (me, p) in players.into_iter().enumerate() {
            let r = p.join().expect("player");
            assert_eq!(
                r,
                Ok(()),
                "player {me} stopped at that turn of {TURNS}: spinners on one CPU did not take turns"
            );
        }
        eprintln!("{TURNS} round trips on one CPU in {:?}", start.elapsed());
    }
}

//! The generic driver: one thread per host port whose device is [`Polled`], asleep in
//! `epoll_wait` on the device's descriptors and the port's rx interrupt line, calling the
//! port's two [`Steps`] when either is ready, with interrupt moderation (a nap of the rest of
//! the interval before a sleep, so that frames gather into larger batches).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use super::{Driver, Polled, Steps};
use crate::epoll;
use crate::sink::HostState;

/// The generic driver of a polled device (a [`Device::driver`]).
pub fn polled(dev: Box<dyn Polled>) -> Box<dyn Driver> {
    Box::new(Generic(dev))
}

/// The generic driver: one thread per host port.
struct HostLoop {
    steps: Steps,
    state: Arc<HostState>,
    dev: Box<dyn Polled>,
    epoll: OwnedFd,
    /// The device's descriptors, watched unless paused.
    watched: Vec<RawFd>,
    /// A frame the device had no room for waits for the next round.
    blocked: bool,
    /// The device is down or away: frames to it are dropped, nothing is read from it, until
    /// it says it is up again.
    paused: bool,
}

const TOKEN_STOP: u64 = 0;
const TOKEN_IRQ: u64 = 1;
const TOKEN_DEV: u64 = 2;
/// Frames written to the device per round before the ingress side gets its turn.
const EGRESS_BURST: usize = 256;

/// The generic driver of a device: a [`HostLoop`] thread.
struct Generic(Box<dyn Polled>);

impl Driver for Generic {
    fn start(
        self: Box<Self>,
        steps: Steps,
        state: Arc<HostState>,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        let dev = self.0;
        let epoll = epoll::new()?;
        epoll::add(&epoll, state.stop.as_raw_fd(), TOKEN_STOP)?;
        epoll::add(&epoll, steps.irq_fd(), TOKEN_IRQ)?;
        let watched = dev.poll_fds();
        for &fd in &watched {
            epoll::add(&epoll, fd, TOKEN_DEV)?;
        }
        let name = format!("vale-{}", state.kind);
        let mut lp = HostLoop {
            steps,
            state,
            dev,
            epoll,
            watched,
            blocked: false,
            paused: false,
        };
        std::thread::Builder::new()
            .name(name)
            .spawn(move || lp.run())
    }
}

/// How long (ms) a host port's thread may sleep in `epoll_wait` once it has asked for
/// interrupts: not at all when `now` (work is waiting, or it still spins); with an interrupt
/// deferred by moderation (`due`, in ns from now), until it is due (1 ms to 1 s); while
/// `blocked` (a frame the device had no room for waits in the ring), 1 ms, to try again; else
/// 1 s, to look at the port's state.
pub(crate) fn sleep_ms(now: bool, blocked: bool, due: Option<u64>) -> i32 {
    if now {
        0
    } else if blocked || due.is_some() {
        due.map_or(1, |ns| (ns / 1_000_000).clamp(1, 1000) as i32)
    } else {
        1000
    }
}

impl HostLoop {
    fn run(&mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        let mut last_check = Instant::now();
        let mut woke_at = Instant::now();
        while !self.state.stopping.load(Relaxed) {
            let moved_in = self.ingress();
            let moved_out = self.egress();
            if last_check.elapsed().as_secs() >= 1 {
                last_check = Instant::now();
                let up = self.dev.is_up();
                if up && self.paused {
                    self.resume();
                }
                self.state
                    .set_up(self.steps.port_name(), up, &"the device is down or gone");
            }
            let due = self.steps.fire_due();
            if moved_in + moved_out != 0 {
                continue;
            }
            // Moderation: at most one wake-up per interval. Idle early, the thread naps out the
            // rest of the interval and looks again, so frames gather into larger batches
            // instead of each costing a wake-up.
            let moderation = self.steps.moderation_ns();
            let since = woke_at.elapsed().as_nanos() as u64;
            if since < moderation {
                std::thread::sleep(std::time::Duration::from_nanos(moderation - since));
                woke_at = Instant::now() - std::time::Duration::from_nanos(moderation);
                continue;
            }
            // Nothing moved: ask for an interrupt, then look once more before sleeping.
            self.steps.want_irq(true);
            let pending = self.steps.rx_pending();
            let timeout_ms = sleep_ms(pending && !self.blocked, self.blocked, due);
            let n = epoll::wait(&self.epoll, &mut events, timeout_ms).len();
            self.steps.want_irq(false);
            woke_at = Instant::now();
            for ev in &events[..n] {
                match ev.u64 {
                    TOKEN_STOP => return,
                    TOKEN_IRQ => self.steps.drain_irq(),
                    _ => {}
                }
            }
        }
    }

    /// Frames from the device into the switch, forwarded by this thread.
    fn ingress(&mut self) -> usize {
        if self.paused {
            return 0;
        }
        let dev = &mut self.dev;
        match self.steps.ingress(|side| dev.ingress(side)) {
            Ok(n) => n,
            Err((err, pause)) => {
                self.device_down(err, pause);
                0
            }
        }
    }

    /// Frames the switch delivered to the port, out to the device.
    fn egress(&mut self) -> usize {
        let done = self.steps.egress(&mut *self.dev, EGRESS_BURST, self.paused);
        self.blocked = done.blocked;
        if let Some((err, pause)) = done.down {
            self.device_down(err, pause);
        }
        done.moved
    }

    fn device_down(&mut self, err: io::Error, pause: bool) {
        self.state.set_up(self.steps.port_name(), false, &err);
        if pause && !self.paused {
            self.paused = true;
            for &fd in &self.watched {
                // The fd is still open: the device owns it.
                epoll::del(&self.epoll, fd);
            }
        }
    }

    fn resume(&mut self) {
        self.paused = false;
        for &fd in &self.watched {
            if let Err(e) = epoll::add(&self.epoll, fd, TOKEN_DEV) {
                tracing::error!(port = %self.steps.port_name(), "cannot watch the device again: {e}");
            }
        }
    }
}

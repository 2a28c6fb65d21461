//! Forwarding threads.
//!
//! Each worker serves a set of source tx rings. A ring is *active* while it has work: the
//! worker polls it batch after batch with `kern_need_kick` clear, so the client never makes a
//! system call. When a ring runs dry the worker sets `kern_need_kick`, fences, and looks at the
//! ring once more; only if nothing arrived does it drop the ring from the active list. A worker
//! with no active ring sleeps in `epoll_wait` on the kick eventfds: idle ports cost no CPU
//! (mSwitch). An optional busy-poll interval keeps a dry ring active a little longer, trading
//! CPU for latency.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering::*};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::epoll;
use crate::forward::Pipeline;
use crate::port::Port;
use crate::switch::Switch;
use vale_abi::eventfd;

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
}

impl Worker {
    /// Starts worker thread `id`.
    pub fn spawn(id: usize, busy_poll: Duration, epoch: Instant) -> io::Result<Arc<Worker>> {
        let w = Arc::new(Worker {
            inbox: Mutex::new(Vec::new()),
            wake: eventfd::new()?,
        });
        let me = w.clone();
        let mut lp = Loop::new(me, busy_poll, epoch)?;
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
    /// Engine clock when the ring was first seen dry (busy-poll only).
    dry_since: Option<u64>,
}

const TOKEN_WAKE: u64 = u64::MAX;
const TOKEN_TIMER: u64 = u64::MAX - 1;

struct Loop {
    me: Arc<Worker>,
    epoll: OwnedFd,
    /// Raises moderated interrupts on time.
    timer: OwnedFd,
    sources: Vec<Option<Source>>,
    active: Vec<usize>,
    pipe: Pipeline,
    busy_poll_ns: u64,
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Loop {
    fn new(me: Arc<Worker>, busy_poll: Duration, epoch: Instant) -> io::Result<Loop> {
        let epoll = epoll::new()?;
        // SAFETY: plain syscall; the result is checked before it is owned.
        let timer = unsafe {
            OwnedFd::from_raw_fd(check(libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            ))?)
        };
        epoll::add(&epoll, me.wake.as_raw_fd(), TOKEN_WAKE)?;
        epoll::add(&epoll, timer.as_raw_fd(), TOKEN_TIMER)?;
        Ok(Loop {
            me,
            epoll,
            timer,
            sources: Vec::new(),
            active: Vec::new(),
            pipe: Pipeline::new(epoch),
            busy_poll_ns: busy_poll.as_nanos() as u64,
        })
    }

    fn run(&mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // Sleep only when no ring is active; otherwise just collect new kicks.
            let timeout = if self.active.is_empty() { -1 } else { 0 };
            let n = epoll::wait(&self.epoll, &mut events, timeout).len();
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
            self.round();
            let next = self.pipe.notifier.fire_due();
            self.arm_timer(next);
        }
    }

    fn commands(&mut self) {
        let cmds = std::mem::take(&mut *self.me.inbox.lock().unwrap_or_else(|e| e.into_inner()));
        for cmd in cmds {
            match cmd {
                Cmd::Add { sw, port, ring } => {
                    let Some(kick) = port
                        .attachment
                        .as_ref()
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
                    if let Err(e) = epoll::add(&self.epoll, kick, token as u64) {
                        tracing::error!(port = %port.name(), "cannot watch kick eventfd: {e}");
                        continue;
                    }
                    self.sources[token] = Some(Source {
                        sw,
                        port,
                        ring,
                        active: false,
                        dry_since: None,
                    });
                    // Packets may have been published before the ring was watched.
                    self.kicked(token);
                }
                Cmd::Remove { port, done } => {
                    for slot in self.sources.iter_mut() {
                        if slot.as_ref().is_some_and(|s| Arc::ptr_eq(&s.port, &port)) {
                            let s = slot.take().expect("checked");
                            if let Some(t) = s
                                .port
                                .attachment
                                .as_ref()
                                .and_then(|a| a.tx.get(s.ring as usize))
                            {
                                // The fd is still open: we hold the port.
                                epoll::del(&self.epoll, t.kick.as_raw_fd());
                            }
                        }
                    }
                    let sources = &self.sources;
                    self.active.retain(|&t| sources[t].is_some());
                    self.pipe.notifier.forget(&port);
                    drop(port);
                    let _ = done.send(());
                }
            }
        }
    }

    /// A kick arrived (or may have): poll the ring from now on, without kicks.
    fn kicked(&mut self, token: usize) {
        let Some(Some(s)) = self.sources.get_mut(token) else {
            return;
        };
        let Some(a) = &s.port.attachment else { return };
        // The client holds this eventfd's file too and may have made it blocking.
        eventfd::drain_nowait(&a.tx[s.ring as usize].kick);
        a.region.ktoa(s.ring).kern_need_kick.store(0, Relaxed);
        s.dry_since = None;
        if !s.active {
            s.active = true;
            self.active.push(token);
        }
    }

    /// One batch from every active ring; rings that ran dry go back to sleep.
    fn round(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            let token = self.active[i];
            let s = self.sources[token].as_mut().expect("active rings exist");
            if self.pipe.forward(&s.sw, &s.port, s.ring) != 0 {
                s.dry_since = None;
                i += 1;
                continue;
            }
            if self.busy_poll_ns != 0 {
                let now = self.pipe.notifier.now_ns();
                let since = *s.dry_since.get_or_insert(now);
                if now - since < self.busy_poll_ns {
                    i += 1;
                    continue;
                }
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
            self.active.swap_remove(i);
        }
    }

    fn arm_timer(&self, next_ns: Option<u64>) {
        let Some(ns) = next_ns else { return };
        let ns = ns.max(1);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: plain syscall with a live struct.
        unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }
}

//! One front end's connection: the driver that serves the socket (listening or connecting),
//! one connection after the other, and stops when the port is detached.

use super::*;
use std::os::unix::net::UnixStream;

/// The library's daemon around a port's device, and the handle that stops it.
type Daemon = VhostUserDaemon<Net>;
type Shutdown = vhost_user_backend::ShutdownHandle;

/// The port's driver: one front end after the other, until the port is detached.
pub(super) struct Session {
    pub(super) path: String,
    pub(super) pairs: usize,
    /// None: client mode.
    pub(super) listener: Option<(Listener, SocketName)>,
    pub(super) sink: Arc<RxSink>,
}

pub(super) const TOKEN_STOP: u64 = 0;

pub(super) const TOKEN_OTHER: u64 = 1;

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

/// How long a port in client mode waits before it connects, at its start and after each
/// connection: a QEMU that listens (`server=on`) and has just lost its previous back end
/// (valed restarted under it, or this port's last connection ended) must have handled that
/// loss before the new connection is in its queue. If it takes the new connection first, it
/// starts the device on it and then stops it as it handles the old one's end (its stop waits
/// for an idle moment of its main loop), and the guest stays without a link: seen with QEMU
/// 7.2 under libvirt when valed was restarted and connected again within 25 ms
/// (tests/libvirt.rs). A second is far more than QEMU's main loop takes and little beside a
/// restart.
pub(super) const CONNECT_SETTLE_MS: i32 = 1000;

/// Longest a reply to the front end may wait for room in its socket.
pub(super) const FRONT_WRITE_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a detach waits for the library's threads to end.
pub(super) const STOP_LIMIT_MS: i32 = 3000;

/// Whether `fd` is ready for `events` (`POLLIN`, `POLLOUT`) within `ms` (0: now).
pub(super) fn poll_one(fd: RawFd, events: i16, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd of ours.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & events != 0 }
}

/// Interrupts the guest on the queue of `st`. The front end owns that descriptor's flags and
/// counter, so the write goes through [`peer_irq`], which cuts it short if the front end made
/// it sleep: `Blocked`, and the connection is to end.
pub(super) fn signal_guest(st: &VringState<Mem>) -> Result<(), peer_irq::Blocked> {
    match st.get_call() {
        Some(call) => peer_irq::interrupt(call.as_raw_fd()),
        None => Ok(()),
    }
}

/// Waits on `ep` for `ms` (-1: for ever): true when the port is stopping.
pub(super) fn wait_stop(ep: &OwnedFd, ms: i32, state: &HostState) -> bool {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
    let n = epoll::wait(ep, &mut events, ms).len();
    state.stopping.load(Relaxed) || events[..n].iter().any(|e| e.u64 == TOKEN_STOP)
}

/// What became of one connection.
enum Next {
    /// The front end went away: serve the next one.
    Gone,
    /// It could not be served: try the next one afresh.
    Again,
    /// The port is detached, or its driver cannot go on.
    Stop,
}

impl Session {
    /// One connection after the other, each with a device of its own, until the port is
    /// detached.
    pub(super) fn run(mut self, ep: OwnedFd, steps: Arc<Mutex<Steps>>, state: Arc<HostState>) {
        let name = lock(&steps).port_name().to_string();
        while !state.stopping.load(Relaxed) {
            let Some((net, daemon)) = device(&steps, &state, self.pairs, &name) else {
                return;
            };
            // A front end: accept one, or connect to it.
            if self.listener.is_none() && wait_stop(&ep, CONNECT_SETTLE_MS, &state) {
                return;
            }
            let Some(front) = self.front_end(&ep, &state, &name) else {
                return;
            };
            match self.serve(net, daemon, front, &steps, &state, &name) {
                Next::Gone => {}
                Next::Again => continue,
                Next::Stop => return,
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

    /// The next front end: accepted (server mode) or connected to (client mode); None once the
    /// port is stopping.
    fn front_end(&mut self, ep: &OwnedFd, state: &HostState, name: &str) -> Option<UnixStream> {
        loop {
            if state.stopping.load(Relaxed) {
                return None;
            }
            match &mut self.listener {
                Some((l, _)) => {
                    if wait_stop(ep, -1, state) {
                        return None;
                    }
                    match l.accept() {
                        Ok(Some(s)) => return Some(s),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(port = %name, "vhost-user: accept: {e}");
                            if wait_stop(ep, 100, state) {
                                return None;
                            }
                        }
                    }
                }
                None => match UnixStream::connect(&self.path) {
                    Ok(s) => return Some(s),
                    Err(_) => {
                        // The front end is not listening yet: try again soon.
                        if wait_stop(ep, 200, state) {
                            return None;
                        }
                    }
                },
            }
        }
    }

    /// Serves front end `front` with `net` and `daemon` until it goes away or the port stops.
    fn serve(
        &mut self,
        net: Net,
        mut daemon: Daemon,
        front: UnixStream,
        steps: &Arc<Mutex<Steps>>,
        state: &Arc<HostState>,
        name: &str,
    ) -> Next {
        let _ = front.set_nonblocking(false);
        // A front end that stops reading valed's replies holds a write at most this long,
        // then loses its connection: no thread of valed waits on its socket for ever.
        let _ = front.set_write_timeout(Some(FRONT_WRITE_LIMIT));
        *lock(&net.0.front) = front.try_clone().ok();
        {
            // Frames delivered while nobody was there are stale: dropped, not handed over.
            let mut s = lock(steps);
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
            relay::Relay::start(front, back, name, answers)
        });
        let relay = match relay {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(port = %name, "vhost-user: cannot serve the front end: {e}");
                *lock(&self.sink.net) = None;
                lock(steps).want_irq(false);
                return Next::Again;
            }
        };
        tracing::info!(port = %name, path = %self.path, "vhost-user front end connected");
        state.set_up(name, true, &"");
        let Some(shutdown) = daemon.shutdown_handle() else {
            relay.join();
            return Next::Again;
        };
        wait_end(net, daemon, shutdown, relay, &self.sink, state, name)
    }
}

/// A device for the next front end: the port's `Net` and the library's daemon around it, the
/// daemon's workers watching the port's lines; None (logged) when one cannot be made.
fn device(
    steps: &Arc<Mutex<Steps>>,
    state: &Arc<HostState>,
    pairs: usize,
    name: &str,
) -> Option<(Net, Daemon)> {
    let net = match Net::new(steps.clone(), state.clone(), pairs) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(port = %name, "vhost-user: cannot set up the device: {e}");
            return None;
        }
    };
    let mem = net.0.mem.clone();
    let daemon = match VhostUserDaemon::new("vale-vhost-user".into(), net.clone(), mem) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(port = %name, "vhost-user: cannot start: {e}");
            return None;
        }
    };
    // The library runs one worker per queue pair. Pair 0's also sleeps on the port's rx
    // interrupt line and on the timer of deferred interrupts toward the guest; each on the
    // timer of its own deferred interrupts toward other ports.
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
            return None;
        }
    }
    *lock(&net.0.handlers) = handlers.iter().map(Arc::downgrade).collect();
    Some((net, daemon))
}

/// Waits for the connection that `daemon` serves (through `relay`) to end, or for the port
/// to stop, then lets the daemon, its threads and the guest's memory go.
fn wait_end(
    net: Net,
    mut daemon: Daemon,
    shutdown: Shutdown,
    relay: relay::Relay,
    sink: &RxSink,
    state: &HostState,
    name: &str,
) -> Next {
    let fail = |what: &dyn std::fmt::Display| {
        tracing::error!(port = %name, "vhost-user: {what}");
        shutdown.shutdown();
        Next::Stop
    };
    let done = match eventfd::new() {
        Ok(fd) => Arc::new(fd),
        Err(e) => {
            let next = fail(&e);
            relay.join();
            return next;
        }
    };
    let done2 = done.clone();
    let net2 = net.clone();
    let waiter = std::thread::Builder::new()
        .name("vale-vhost-wait".into())
        .spawn(move || {
            let r = daemon.wait();
            // Dropping the daemon ends and joins the library's worker thread: the queues and
            // the guest's memory are let go now.
            drop(daemon);
            net2.close_forgotten();
            eventfd::signal(&*done2);
            r
        });
    let waiter = match waiter {
        Ok(w) => w,
        Err(e) => {
            let next = fail(&e);
            relay.join();
            return next;
        }
    };
    let wait_ep = match epoll::new() {
        Ok(w) => w,
        Err(e) => {
            let next = fail(&e);
            relay.join();
            let _ = waiter.join();
            return next;
        }
    };
    let _ = epoll::add(&wait_ep, state.stop.as_raw_fd(), TOKEN_STOP);
    let _ = epoll::add(&wait_ep, done.as_raw_fd(), TOKEN_OTHER);
    // No timeout: both ends of this wait are descriptors in `wait_ep`, and a port whose front
    // end idles must cost no wake-up (64 idle ports woke 64 times a second here: 0.10% of a
    // core).
    let stopping = loop {
        if wait_stop(&wait_ep, -1, state) {
            break true;
        }
        if eventfd::drain(&*done) != 0 {
            break false;
        }
    };
    *lock(&sink.net) = None;
    if stopping {
        shutdown.shutdown();
        // The library's worker ends at its next wake-up, unless the front end holds it in a
        // blocking read or write of a descriptor it shares (their flags are the front end's
        // to change). Then its threads are left behind, so that detaching never waits on a
        // guest.
        if !poll_one(done.as_raw_fd(), libc::POLLIN, STOP_LIMIT_MS) {
            tracing::error!(port = %name, "vhost-user: the front end holds the port's worker thread (a blocking eventfd of its own); leaving it behind");
            relay.join();
            return Next::Stop;
        }
    }
    relay.join();
    match waiter.join() {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(e)) => tracing::info!(port = %name, "vhost-user connection: {e}"),
    }
    drop(net);
    if stopping {
        Next::Stop
    } else {
        Next::Gone
    }
}

//! Host ports: valed itself is the client of the port, moving frames between the switch and a
//! device of the host — a TAP device (the host stack, a container) or a network interface.
//!
//! Each host port has one thread. It reads frames from the device straight into the port's tx
//! ring and forwards them itself (no worker and no kick in between), and it writes what the
//! switch delivered to the port's rx ring out to the device. With nothing to do it sleeps in
//! `epoll_wait` on the device and on the rx ring's interrupt line, exactly as a sleeping
//! client would (VALE section 4.1: the host stack as one more port of the switch).
//!
//! The port's work is two steps ([`Steps`]: ingress, egress) and a driver that calls them. A
//! kind whose library owns its event loop (vhost-user) brings its own driver and calls the
//! same steps from its threads.
//!
//! What a kind implements and registers with (its [`Kind`] entry, [`Device`], [`Polled`],
//! [`Egress`], [`Driver`], [`DirectSink`]) is all in one file, `kind.rs`, whose doc walks
//! through adding one; this module holds the registry ([`KINDS`]) and the code that drives
//! the kinds.

mod guard;
mod memif;
mod nic;
mod peer_irq;
mod socket;
mod tap;
mod tunnel;
mod vhost_user;
mod virtq;

pub use crate::kind::{
    flag, required, Arg, Delivered, DevError, Device, DirectSink, Driver, Egress, Error, Flag,
    HostState, Kind, KindArgs, OutFrame, OutFrames, Polled, Shape, HOST_PARAMS,
};

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, Ordering::*};
use std::sync::Arc;
use std::time::Instant;

use vale_abi::netmap::{NS_MOREFRAG, NS_OFFLOAD};
use vale_abi::pipe;
use vale_abi::region::MAX_FRAGS;

use crate::epoll;
use crate::forward::{recycle, Pipeline};
use crate::offload::{Caps, Offload};
use crate::port::{add, Port};
use crate::region::Region;
use crate::switch::Switch;

/// Every kind valed can attach: a new kind is one module and one entry here.
pub const KINDS: &[Kind] = &[
    tap::KIND,
    nic::KIND,
    vhost_user::KIND,
    memif::KIND,
    tunnel::VXLAN,
    tunnel::GENEVE,
];

/// Removes the socket of every port that listens at a path it was given (vhost-user in
/// server mode), each only while it is still the socket valed bound, as detach does, and
/// refuses such attaches from then on. valed calls it as it exits on SIGTERM or SIGINT, which
/// drops no port.
pub fn remove_port_sockets() {
    socket::remove_all();
}

/// How a device is opened from a kind's name and arguments ([`open_device`], [`restore_device`]).
pub(crate) type OpenDevice = fn(&str, &KindArgs) -> Result<Box<dyn Device>, Error>;

/// The kind named `kind`; an unknown one is refused with the list of what is known.
pub fn kind(kind: &str) -> Result<&'static Kind, Error> {
    KINDS.iter().find(|k| k.name == kind).ok_or_else(|| {
        let known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        Error::Invalid(format!(
            "no port kind '{kind}' (known: {})",
            known.join(", ")
        ))
    })
}

/// Checks `args` against `k`'s description: refuses an argument it does not take (`saved`
/// too: those of a saved configuration), naming those it does, and names a required one
/// that is missing.
fn check_args(k: &Kind, args: &KindArgs, saved: bool) -> Result<(), Error> {
    let takes = |a: &str| k.arg(a).is_some() || (saved && k.saved_args.contains(&a));
    if let Some(bad) = args.keys().find(|a| !takes(a)) {
        let known: Vec<&str> = k.args.iter().map(|a| a.key).collect();
        return Err(Error::Invalid(format!(
            "port kind '{}' takes no argument '{bad}' (it takes: {})",
            k.name,
            known.join(", ")
        )));
    }
    match k
        .args
        .iter()
        .find(|a| a.required && !args.contains_key(a.key))
    {
        Some(a) => required(args, k.name, a.key).map(drop),
        None => Ok(()),
    }
}

/// Opens the device of kind `kind` that `args` describe; unknown kinds and arguments are
/// refused with the list of what is known.
pub(crate) fn open_device(kind: &str, args: &KindArgs) -> Result<Box<dyn Device>, Error> {
    let k = self::kind(kind)?;
    check_args(k, args, false)?;
    (k.open)(args)
}

/// Opens again, at valed's start, the device of a port saved as `args` ([`Kind::restore`]).
pub(crate) fn restore_device(kind: &str, args: &KindArgs) -> Result<Box<dyn Device>, Error> {
    let k = self::kind(kind)?;
    check_args(k, args, true)?;
    (k.restore)(args)
}

/// Whether network interface `name` exists in valed's network namespace.
pub(crate) fn interface_exists(name: &str) -> bool {
    vale_nic::index_of(name).is_ok()
}

/// The control plane's view of the port of `dev`.
pub(crate) fn state_of(dev: &dyn Device) -> io::Result<Arc<HostState>> {
    let (kind, device, mode) = dev.describe();
    HostState::new(kind, device, mode)
}

/// The generic driver of a polled device (a [`Device::driver`]).
pub fn polled(dev: Box<dyn Polled>) -> Box<dyn Driver> {
    Box::new(Generic(dev))
}

/// The port's tx ring seen from its (in-valed) client: where the device's frames go.
pub struct TxSide<'r> {
    region: &'r Region,
    head: u32,
    room: u32,
    /// Frames the device offered that the switch refuses: runts and frames too long (counted as bad input).
    pub refused: u64,
}

impl<'r> TxSide<'r> {
    fn new(region: &'r Region, hwcur: u32) -> TxSide<'r> {
        let n = region.layout().params.slots;
        let head = region.atok(0).head.load(Relaxed);
        TxSide {
            region,
            head,
            room: (hwcur + n - 1 - head) & (n - 1),
            refused: 0,
        }
    }

    pub fn buf_size(&self) -> usize {
        self.region.layout().params.buf_size as usize
    }

    /// Free slots.
    pub fn room(&self) -> u32 {
        self.room
    }

    /// Buffer of the `k`-th free slot (`k < room()`); `buf_size()` bytes.
    pub fn buf(&self, k: u32) -> *mut u8 {
        let n = self.region.layout().params.slots;
        // SAFETY: valed's own region; slot buffer indices were set at creation and no client
        // can change them (host port regions are never handed out).
        let idx = unsafe { (*self.region.slot(0, (self.head + k) & (n - 1))).buf_idx };
        self.region.buf(idx)
    }

    /// Slots a frame of `len` bytes takes.
    pub fn slots_for(&self, len: usize) -> u32 {
        len.div_ceil(self.buf_size()).max(1) as u32
    }

    /// Makes the `len` bytes written into the free buffers a frame.
    pub fn commit(&mut self, len: usize, off: Option<Offload>) {
        let bsize = self.buf_size();
        let need = self.slots_for(len);
        let n = self.region.layout().params.slots;
        for k in 0..need {
            let s = self.region.slot(0, (self.head + k) & (n - 1));
            let chunk = (len - k as usize * bsize).min(bsize);
            let mut flags = if k + 1 < need { NS_MOREFRAG } else { 0 };
            // SAFETY: valed's own region, slot inside the ring.
            unsafe {
                (*s).len = chunk as u16;
                if k == 0 {
                    if let Some(o) = off {
                        flags |= NS_OFFLOAD;
                        (*s).ptr = o.to_word();
                    }
                }
                (*s).flags = flags;
            }
        }
        self.head = (self.head + need) & (n - 1);
        self.room -= need;
    }

    /// Copies `frame` in as one frame; false when it does not fit now.
    pub fn push(&mut self, frame: &[u8]) -> bool {
        let need = self.slots_for(frame.len());
        if need > self.room {
            return false;
        }
        let bsize = self.buf_size();
        for (k, chunk) in frame.chunks(bsize).enumerate() {
            // SAFETY: k < need <= room; each buffer holds bsize bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), self.buf(k as u32), chunk.len())
            };
        }
        self.commit(frame.len(), None);
        true
    }

    fn publish(&self) {
        self.region.atok(0).head.store(self.head, Release);
    }
}

/// What one egress step did.
#[derive(Default)]
pub struct EgressDone {
    /// Frames taken off the ring (sent or dropped).
    pub moved: usize,
    /// The device had no room for a frame: it waits in the ring.
    pub blocked: bool,
    /// The device went down on the way (`pause`: frames after it were dropped unsent).
    pub down: Option<(io::Error, bool)>,
}

/// The two steps of a host port, for whichever thread drives it: the generic driver below,
/// or a kind whose library owns its event loop (see [`Device::driver`]).
pub struct Steps {
    sw: Arc<Switch>,
    port: Arc<Port>,
    pipe: Pipeline,
    /// The allocation of the list of a frame's pieces (see [`crate::forward::recycle`]).
    pieces: Vec<&'static [u8]>,
    /// How long a driver that can keeps looking at a dry device before it sleeps (valed's
    /// `--busy-poll-us`).
    pub busy_poll: std::time::Duration,
    epoch: Instant,
}

impl Steps {
    fn new(sw: Arc<Switch>, port: Arc<Port>, epoch: Instant) -> Steps {
        Steps {
            sw,
            port,
            epoch,
            pipe: Pipeline::new(epoch),
            pieces: Vec::with_capacity(MAX_FRAGS as usize),
            busy_poll: std::time::Duration::ZERO,
        }
    }

    pub fn port_name(&self) -> &str {
        self.port.name()
    }

    fn att(&self) -> &crate::port::Attachment {
        self.port
            .attachment
            .as_ref()
            .expect("host ports are attached")
    }

    /// Counts frames a device offered that are malformed or hostile.
    pub fn count_bad_input(&self, n: u64) {
        add(&self.port.stats().bad_input, n);
    }

    /// Ingress: `fill` moves frames from the device into the port's tx ring, then this thread
    /// forwards them. Returns how many moved, or the device's going down.
    pub fn ingress(
        &mut self,
        fill: impl FnOnce(&mut TxSide) -> Result<usize, DevError>,
    ) -> Result<usize, (io::Error, bool)> {
        let att = self.att();
        let hwcur = att.tx[0].hwcur.load(Relaxed);
        let mut side = TxSide::new(&att.region, hwcur);
        let r = fill(&mut side);
        let refused = side.refused;
        side.publish();
        if refused != 0 {
            add(&self.port.stats().bad_input, refused);
        }
        let moved = match r {
            Ok(n) => Ok(n),
            Err(DevError::Frame(e)) => {
                tracing::debug!(port = %self.port.name(), "frame from device dropped: {e}");
                add(&self.port.stats().tx_drops, 1);
                Ok(1)
            }
            Err(DevError::Down { err, pause }) => Err((err, pause)),
        };
        while self.pipe.forward(&self.sw, &self.port, 0) != 0 {}
        moved
    }

    /// Ingress without the tx ring, for a device whose frames can stay where it keeps them
    /// until the switch has copied them (a guest's transmit buffers): `gather` adds up to
    /// `limit` frames to the batch ([`Pipeline::add_piece`], [`Pipeline::end_frame`]), then
    /// this thread forwards them; only then may the device reuse their memory. What `gather`
    /// returned.
    /// `ring`: which of the device's queues the frames come from (the switch keeps frames of
    /// one source ring in order, in one destination ring or queue).
    pub fn ingress_direct<R>(
        &mut self,
        ring: u32,
        gather: impl FnOnce(&mut Pipeline, usize) -> R,
    ) -> R {
        let limit = self.sw.batch.load(Relaxed) as usize;
        self.pipe.start_batch();
        let r = gather(&mut self.pipe, limit);
        self.pipe.forward_batch(&self.sw, &self.port, ring);
        r
    }

    /// Steps of the same port with a pipeline of their own, for another thread of a device
    /// with several queues: for [`Steps::ingress_direct`] (the port's rx ring stays this
    /// one's).
    pub fn fork(&self) -> Steps {
        let mut s = Steps::new(self.sw.clone(), self.port.clone(), self.epoch);
        s.busy_poll = self.busy_poll;
        s
    }

    /// Egress: up to `burst` frames the switch delivered to the port, out through `dev`.
    /// `paused`: the device is away, frames are dropped unsent (senders see rx_drops grow,
    /// not a stall). Generic over the device, so that a kind that calls it with its own type
    /// (vhost-user) gets its `send` inlined per frame; `dyn Egress` works too.
    pub fn egress<E: Egress + ?Sized>(
        &mut self,
        dev: &mut E,
        burst: usize,
        paused: bool,
    ) -> EgressDone {
        let port = self.port.clone();
        let att = port.attachment.as_ref().expect("host ports are attached");
        let reg = &att.region;
        let l = reg.layout();
        let ring = l.params.tx_rings;
        let n = l.params.slots;
        let mask = n - 1;
        let atok = reg.atok(ring);
        let mut head = atok.head.load(Relaxed);
        let tail = reg.ktoa(ring).hwtail.load(Acquire);
        let mut pieces: Vec<&[u8]> = std::mem::take(&mut self.pieces);
        let (mut sent, mut dropped) = (0usize, 0u64);
        let mut done = EgressDone::default();
        let mut paused = paused;
        while head != tail && sent + (dropped as usize) < burst {
            // SAFETY: valed's own region; the deliverer filled these slots and published
            // them with release before `tail`, which we loaded with acquire.
            let first = unsafe { *reg.slot(ring, head) };
            let mut s = (head + 1) & mask;
            let off = if first.flags & NS_OFFLOAD != 0 {
                Offload::from_word(first.ptr)
            } else {
                Offload::default()
            };
            // SAFETY: buffer of our own region, len clamped to its size.
            let piece = unsafe {
                std::slice::from_raw_parts(
                    reg.buf(first.buf_idx),
                    (first.len as u32).min(l.params.buf_size) as usize,
                )
            };
            let one = first.flags & NS_MOREFRAG == 0 || s == tail;
            if !one {
                // A frame of several slots: up to the first without MOREFRAG (the switch
                // publishes whole frames only).
                pieces.clear();
                pieces.push(piece);
                loop {
                    // SAFETY: as above.
                    let slot = unsafe { *reg.slot(ring, s) };
                    let len = (slot.len as u32).min(l.params.buf_size) as usize;
                    // SAFETY: as above.
                    pieces.push(unsafe { std::slice::from_raw_parts(reg.buf(slot.buf_idx), len) });
                    s = (s + 1) & mask;
                    if slot.flags & NS_MOREFRAG == 0 || s == tail {
                        break;
                    }
                }
            }
            let result = if paused {
                Err(DevError::Frame(io::Error::from_raw_os_error(libc::ENODEV)))
            } else if one {
                // The common case, a frame in one slot: no list of pieces.
                dev.send_one(piece, off)
            } else {
                dev.send(&pieces, off)
            };
            match result {
                Ok(true) => sent += 1,
                Ok(false) => {
                    done.blocked = true;
                    break;
                }
                Err(DevError::Frame(e)) => {
                    tracing::debug!(port = %port.name(), "frame to device dropped: {e}");
                    dropped += 1;
                }
                Err(DevError::Down { err, pause }) => {
                    // The frame is lost with the device; the ring keeps draining into drops.
                    dropped += 1;
                    paused |= pause;
                    if done.down.is_none() {
                        done.down = Some((err, pause));
                    }
                }
            }
            head = s;
        }
        if sent != 0 {
            match dev.flush() {
                Ok(()) => {}
                Err(DevError::Frame(e)) => {
                    tracing::debug!(port = %port.name(), "device flush: {e}")
                }
                Err(DevError::Down { err, pause }) => {
                    if done.down.is_none() {
                        done.down = Some((err, pause));
                    }
                }
            }
        }
        add(&port.stats().rx_drops, dropped);
        if head != atok.head.load(Relaxed) {
            atok.head.store(head, Release);
            atok.cur.store(head, Relaxed);
        }
        self.pieces = recycle(pieces);
        done.moved = sent + dropped as usize;
        done
    }

    /// Frames wait in the port's rx ring.
    pub fn rx_pending(&self) -> bool {
        let reg = &self.att().region;
        let ring = reg.layout().params.tx_rings;
        reg.atok(ring).head.load(Relaxed) != reg.ktoa(ring).hwtail.load(Acquire)
    }

    /// Asks the switch for an interrupt on the rx ring's line (true) when it delivers, or for
    /// none (false, while this thread is busy anyway).
    pub fn want_irq(&self, on: bool) {
        let reg = &self.att().region;
        let rx_ring = reg.layout().params.tx_rings;
        reg.atok(rx_ring).appl_need_kick.store(on as u32, Relaxed);
        if on {
            // Published before the caller looks at the ring once more (see `run`).
            fence(SeqCst);
        }
    }

    /// The read side of the rx ring's interrupt line: readable when the switch delivered.
    pub fn irq_fd(&self) -> RawFd {
        self.att().rx[0].irq.rd.as_raw_fd()
    }

    /// Empties the interrupt line once woken by it.
    pub fn drain_irq(&self) {
        pipe::drain(&self.att().rx[0].irq.rd);
    }

    /// Sends the interrupts this thread deferred (moderation) that are due; the time to the
    /// next one, if any.
    pub fn fire_due(&mut self) -> Option<u64> {
        self.pipe.notifier.fire_due()
    }

    /// Changes the offload work frames to the port may carry as they are (a guest acked its
    /// features): the switch's threads see it from their next batch on.
    pub fn set_caps(&self, caps: Caps) {
        self.att().caps.store(caps.0, Relaxed);
    }

    /// What the port keeps across owners (its knobs, among others).
    pub fn shared(&self) -> Arc<crate::port::PortShared> {
        self.port.shared.clone()
    }

    /// The port's interrupt moderation interval.
    pub fn moderation_ns(&self) -> u64 {
        self.port.shared.moderation_ns.load(Relaxed)
    }
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

/// Starts the driver of host port `port` (whose attachment holds `state`), which owns `dev`
/// from now on.
pub(crate) fn start(
    sw: Arc<Switch>,
    port: Arc<Port>,
    dev: Box<dyn Device>,
    state: Arc<HostState>,
    epoch: Instant,
    busy_poll: std::time::Duration,
) -> io::Result<()> {
    let mut steps = Steps::new(sw, port, epoch);
    steps.busy_poll = busy_poll;
    let t = dev.driver().start(steps, state.clone())?;
    *state.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    Ok(())
}

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
fn sleep_ms(now: bool, blocked: bool, due: Option<u64>) -> i32 {
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

#[cfg(test)]
mod tests;

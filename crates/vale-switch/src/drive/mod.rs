//! Driving a host port's device: the part of the seam between the core and the kinds of port
//! that moves frames (`kind.rs` says how a kind registers, `sink.rs` what the pipeline
//! delivers to).
//!
//! Each host port has one driver. It reads frames from the device straight into the port's
//! tx ring and forwards them itself (no worker and no kick in between), and it writes what the
//! switch delivered to the port's rx ring out to the device. With nothing to do it sleeps in
//! `epoll_wait` on the device and on the rx ring's interrupt line, exactly as a sleeping
//! client would (VALE section 4.1: the host stack as one more port of the switch).
//!
//! The port's work is two steps ([`Steps`]: ingress, egress) and a driver that calls them:
//! the generic one (`polled.rs`, one thread per [`Polled`] device), or one a kind whose
//! library owns its event loop (vhost-user) brings ([`Driver`]). A kind sees the port's tx
//! ring as a [`TxSide`] and a batch of frames left in its client's memory as a [`Gather`]:
//! what it may do, and nothing else of the pipeline.

mod polled;

pub use polled::polled;
pub(crate) use polled::sleep_ms;

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, Ordering::*};
use std::sync::Arc;
use std::time::Instant;

use vale_abi::netmap::{NS_MOREFRAG, NS_OFFLOAD};
use vale_abi::pipe;
use vale_abi::region::MAX_FRAGS;

use crate::forward::{recycle, Pipeline};
use crate::offload::{Caps, Offload};
use crate::port::{add, Port};
use crate::region::Region;
use crate::sink::{DevError, Egress, HostState};
use crate::switch::Switch;

// What a kind implements to be driven.

/// A kind whose library owns its event loop: it takes the port's steps and its state, and
/// returns the thread that drives them, which ends once `state.stop` is signalled.
pub trait Driver: Send {
    fn start(
        self: Box<Self>,
        steps: Steps,
        state: Arc<HostState>,
    ) -> io::Result<std::thread::JoinHandle<()>>;
}

/// A device the generic driver runs, one thread per port: it waits on the device's
/// descriptors, reads frames from it into the port's tx ring, and writes what the switch
/// delivered to its way out ([`Egress`]).
pub trait Polled: Egress + Send {
    /// Descriptors that become readable when the device has frames for the switch.
    fn poll_fds(&self) -> Vec<RawFd>;
    /// Moves frames from the device into `ring`, at most until it is full; returns how many.
    fn ingress(&mut self, ring: &mut TxSide) -> Result<usize, DevError>;
    /// The device's own view of its state, looked at about once a second.
    fn is_up(&self) -> bool;
}

// The steps.

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

/// The two steps of a host port, for whichever thread drives it: the generic driver
/// (`polled.rs`), or a kind whose library owns its event loop (see
/// [`Device::driver`](crate::kind::Device::driver)).
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
    /// `limit` frames to the batch ([`Gather::add_piece`], [`Gather::end_frame`]), then
    /// this thread forwards them; only then may the device reuse their memory. What `gather`
    /// returned.
    /// `ring`: which of the device's queues the frames come from (the switch keeps frames of
    /// one source ring in order, in one destination ring or queue).
    pub fn ingress_direct<R>(
        &mut self,
        ring: u32,
        gather: impl FnOnce(&mut Gather, usize) -> R,
    ) -> R {
        let limit = self.sw.batch.load(Relaxed) as usize;
        self.pipe.start_batch();
        let r = gather(&mut Gather::new(&mut self.pipe), limit);
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

/// A batch of frames that stay where their source keeps them (a guest's transmit buffers, a
/// memif client's regions) until the switch has copied them: what a kind may do to the batch
/// its [`Steps::ingress_direct`] gathers, and nothing else of the pipeline.
pub struct Gather<'p> {
    pipe: &'p mut Pipeline,
}

impl<'p> Gather<'p> {
    pub(crate) fn new(pipe: &'p mut Pipeline) -> Gather<'p> {
        Gather { pipe }
    }

    /// Frames in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.pipe.batch_len()
    }

    /// No frame in the batch yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `len` bytes at `ptr` to the frame being gathered.
    ///
    /// # Safety
    /// The bytes stay mapped until the batch is forwarded (`ingress_direct` returns); their
    /// writer may change them meanwhile (they are read exactly, once per use, never trusted).
    #[inline]
    pub unsafe fn add_piece(&mut self, ptr: *const u8, len: u32) {
        // SAFETY: the caller keeps the bytes mapped until the batch is forwarded.
        unsafe { self.pipe.add_piece(ptr, len) }
    }

    /// Adds a frame of one piece, `len` bytes at `ptr`, with its checked offload request: what
    /// [`Gather::add_piece`] and [`Gather::end_frame`] do, in one step. False, and the frame
    /// not taken, when it cannot cross the switch (as for `end_frame`).
    ///
    /// # Safety
    /// As for [`Gather::add_piece`]; and no piece may have been added since the last frame
    /// ended.
    #[inline]
    pub unsafe fn push_frame(
        &mut self,
        ptr: *const u8,
        len: u32,
        offload: Option<Offload>,
    ) -> bool {
        // SAFETY: as the caller promises.
        unsafe { self.pipe.push_frame(ptr, len, offload) }
    }

    /// Ends the frame whose pieces were added since the last one ended, with its checked
    /// offload request. False, and the frame forgotten, when it cannot cross the switch: no
    /// whole Ethernet header in its first piece, too many pieces, too long; the caller counts
    /// it.
    #[inline]
    pub fn end_frame(&mut self, offload: Option<Offload>) -> bool {
        self.pipe.end_frame(offload)
    }
}

/// Starts `driver`, the driver of host port `port` (whose attachment holds `state`), which
/// owns the port's device from now on.
pub(crate) fn start(
    sw: Arc<Switch>,
    port: Arc<Port>,
    driver: Box<dyn Driver>,
    state: Arc<HostState>,
    epoch: Instant,
    busy_poll: std::time::Duration,
) -> io::Result<()> {
    let mut steps = Steps::new(sw, port, epoch);
    steps.busy_poll = busy_poll;
    let t = driver.start(steps, state.clone())?;
    *state.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    Ok(())
}

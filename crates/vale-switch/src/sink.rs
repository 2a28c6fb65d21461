//! What the pipeline delivers to: the leaf of the seam between the core and the kinds of port
//! (`kind.rs` says how a kind registers, `drive/` how its device is driven).
//!
//! The forwarding core hands a host port's frames to a kind in one of two ways, both
//! described here, and knows the port's state only as a [`HostState`]:
//!
//! - through the port's rx ring and the kind's [`Egress`] (`send` one frame, `flush` a burst),
//!   which the port's driver calls (`drive::Steps::egress`);
//! - straight from the forwarding thread, through a [`DirectSink`] (TAP, vhost-user, memif):
//!   the frames of each batch for the port, once per destination per batch ([`OutFrames`],
//!   reporting [`Delivered`]).
//!
//! Either way a device's failure is a [`DevError`]: one frame refused (a counted drop) or the
//! device down. This file imports nothing of the core but the offload word frames carry, so
//! the pipeline (`forward/`) and the ports (`port.rs`) depend on it and on nothing of a kind.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vale_abi::eventfd;

use crate::offload::Offload;

// The way out through the port's rx ring.

/// Where the egress step writes the frames the switch delivered to a port.
pub trait Egress {
    /// Writes one frame: Ok(false) when there is no room now (the frame stays for later).
    fn send(&mut self, pieces: &[&[u8]], off: Offload) -> Result<bool, DevError>;
    /// [`Egress::send`] of a frame in one piece, the common case: a device may take it
    /// without a list.
    #[inline]
    fn send_one(&mut self, piece: &[u8], off: Offload) -> Result<bool, DevError> {
        self.send(&[piece], off)
    }
    /// Ends a burst of `send`s (before the ring's slots go back to the switch).
    fn flush(&mut self) -> Result<(), DevError>;
}

/// Why a device operation failed, as the port's thread handles it.
pub enum DevError {
    /// This frame was refused (counted as a drop); the device still works.
    Frame(io::Error),
    /// The device is down or gone. `pause`: stop using it until it says it is up again
    /// (its descriptors may stay ready while it is away).
    Down { err: io::Error, pause: bool },
}
// The direct sink.

/// One frame on its way out: `iov[0]` is the sink's to fill (its own header, if any), the rest
/// are the frame's pieces in the sender's memory.
pub struct OutFrame<'a> {
    pub iov: &'a mut [libc::iovec],
    pub offload: Offload,
    /// Bytes of the frame (the pieces together).
    pub len: u32,
}

/// The frames of one batch for one destination, in batch order.
pub trait OutFrames {
    fn next_frame(&mut self) -> Option<OutFrame<'_>>;
    /// The frame last taken was not sent: it goes back, ahead of the rest (see
    /// [`Delivered::declined`]).
    fn put_back(&mut self);
    /// Whether the pieces of the frame last taken stay where they are until `send_batch`
    /// returns, so that a sink may send it later in the batch (frames in the senders' buffers
    /// do); if not (a segment the switch cut for this destination), they may be gone once the
    /// next frame is taken. No, unless the batch says so.
    fn lasting(&self) -> bool {
        false
    }
    /// Whether the batch's frames lie in memory their writer may change meanwhile (a guest's
    /// buffers): a sink that parses a frame (to finish its offload work) must parse a copy.
    /// Yes, unless the batch says otherwise.
    fn shared(&self) -> bool {
        true
    }
}

/// What became of the frames of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delivered {
    pub frames: u64,
    pub bytes: u64,
    pub dropped: u64,
    /// Drops that were the device's client's fault (a guest's broken buffers).
    pub bad_input: u64,
    /// The sink stopped early (no room now): the frames it did not take, and one it put back,
    /// go into the port's rx ring, from where the kind's own egress step sends them later.
    pub declined: bool,
}

impl Delivered {
    /// Counts what a sink's device did with the frame of `len` bytes last taken from
    /// `frames`: took it (`Ok(true)`); had no room (`Ok(false)`: the frame goes back and the
    /// sink stops, declining the rest); or could not send it (`Err`: dropped). Whether the sink
    /// goes on with the next frame.
    #[inline]
    pub fn count<E>(
        &mut self,
        frames: &mut dyn OutFrames,
        len: u64,
        sent: &Result<bool, E>,
    ) -> bool {
        match sent {
            Ok(true) => {
                self.frames += 1;
                self.bytes += len;
            }
            Ok(false) => {
                frames.put_back();
                self.declined = true;
                return false;
            }
            Err(_) => self.dropped += 1,
        }
        true
    }
}

/// A kind whose device the switch's threads write to directly, instead of through the port's
/// rx ring and thread: one copy and one wake-up less per burst. It must take concurrent calls.
/// The frames it is given carry only offload work its port's capabilities take (the pipeline
/// does the rest first). While frames wait in the port's rx ring it is first asked to take
/// them ([`DirectSink::drain`]), and not given the batch unless it took them all, so that
/// frames keep their order.
pub trait DirectSink: Send + Sync {
    /// Sends the frames of one batch for this port: once per destination per batch. `flow`
    /// is the same for every batch from one source ring: a kind with several queues keeps
    /// such frames on one queue, so that they stay in order.
    fn send_batch(&self, frames: &mut dyn OutFrames, flow: u32) -> Delivered;

    /// Moves what waits in the port's rx ring into the device now, if that can be done
    /// without waiting on anyone (the port's own thread would do it later), so that the
    /// batch at hand may go direct. The default does nothing.
    fn drain(&self) {}
}

// What the control plane sees.

/// Longest [`HostState::stop`] waits for a port's thread (more than a vhost-user port waits
/// for its library's threads, 3 s).
pub const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What the control plane sees of a port whose client is valed itself (any kind but native),
/// and the handle that stops its thread.
pub struct HostState {
    /// The kind's name (`tap`, `nic`, ...).
    pub kind: &'static str,
    /// The device's name.
    pub device: String,
    /// How a NIC is reached (`xdp`, `xdp-generic`, `packet`); empty for TAP.
    pub mode: String,
    /// The device works: false after it went down or away (logged once per change).
    pub up: AtomicBool,
    /// What the device negotiated, if the kind says (empty: nothing to show).
    pub negotiated: Mutex<String>,
    /// Set, then `stop` written, to end the port's thread.
    pub(crate) stopping: AtomicBool,
    pub(crate) stop: OwnedFd,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

impl HostState {
    pub fn new(kind: &'static str, device: String, mode: String) -> io::Result<Arc<HostState>> {
        Ok(Arc::new(HostState {
            kind,
            device,
            mode,
            up: AtomicBool::new(true),
            negotiated: Mutex::new(String::new()),
            stopping: AtomicBool::new(false),
            stop: eventfd::new()?,
            thread: Mutex::new(None),
        }))
    }

    /// Stops the port's thread and waits for it (the device is closed when it returns), at
    /// most [`STOP_WAIT`]: a thread that does not end by then (none should: no thread of
    /// valed waits on a peer's descriptor) is left to end on its own, logged, rather than
    /// hold the detach for ever.
    pub fn stop(&self) {
        self.stopping.store(true, Relaxed);
        eventfd::signal(&self.stop);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(t) = t else { return };
        let deadline = std::time::Instant::now() + STOP_WAIT;
        while !t.is_finished() {
            if std::time::Instant::now() >= deadline {
                tracing::error!(device = %self.device, "the port's thread did not end within {STOP_WAIT:?}: left behind");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = t.join();
    }

    pub(crate) fn set_up(&self, port: &str, up: bool, why: &dyn std::fmt::Display) {
        if self.up.swap(up, Relaxed) != up {
            if up {
                tracing::info!(port, device = %self.device, "device is up again");
            } else {
                tracing::warn!(port, device = %self.device, "device down: {why}");
            }
        }
    }
}

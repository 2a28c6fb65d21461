//! The seam between the forwarding core and the kinds of port.
//!
//! The core (the pipeline, ports, the engine) knows a port's kind only through what is here:
//! a [`DirectSink`], the way out of a kind that takes frames from any forwarding thread (called
//! once per destination per batch), and a [`HostState`], what the control plane sees of a port
//! whose client is valed itself. The kinds themselves (TAP, NIC, ...) live in [`crate::host`]
//! and register there; nothing here names one.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vale_abi::eventfd;

use crate::offload::Offload;

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

    /// Stops the port's thread and waits for it (the device is closed when it returns).
    pub fn stop(&self) {
        self.stopping.store(true, Relaxed);
        eventfd::signal(&self.stop);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
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

/// Why a device operation failed, as the port's thread handles it.
pub enum DevError {
    /// This frame was refused (counted as a drop); the device still works.
    Frame(io::Error),
    /// The device is down or gone. `pause`: stop using it until it says it is up again
    /// (its descriptors may stay ready while it is away).
    Down { err: io::Error, pause: bool },
}

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

/// A kind whose device the switch's threads write to directly, instead of through the port's
/// rx ring and thread: one copy and one wake-up less per burst. It must take concurrent calls.
/// The frames it is given carry only offload work its port's capabilities take (the pipeline
/// does the rest first). While frames wait in the port's rx ring it is not called, so that
/// they keep their order.
pub trait DirectSink: Send + Sync {
    /// Sends the frames of one batch for this port: once per destination per batch. `flow`
    /// is the same for every batch from one source ring: a kind with several queues keeps
    /// such frames on one queue, so that they stay in order.
    fn send_batch(&self, frames: &mut dyn OutFrames, flow: u32) -> Delivered;
}

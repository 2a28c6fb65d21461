//! `vale-ctl capture`: the control connection's side of a capture (see
//! `vale_switch::capture`). A capture belongs to the connection that started it and stops
//! when that connection closes, however the reader ended.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};

use vale_abi::control::Reply;
use vale_switch::CaptureRing;
use vale_switch::PortShared;
use vale_switch::{Caller, Engine, Error};

/// A capture a connection holds: weakly, so that a port that goes away takes its captures
/// with it.
pub struct Held {
    port: Weak<PortShared>,
    ring: Weak<CaptureRing>,
}

impl Held {
    /// Removes the capture from its port, if both are still there.
    pub fn stop(self) {
        if let (Some(p), Some(r)) = (self.port.upgrade(), self.ring.upgrade()) {
            p.captures.remove(&r);
            tracing::info!(port = %p.name, drops = r.drops(), "capture stopped");
        }
    }
}

/// What a capture request asks for.
pub struct Want {
    pub dirs: u32,
    pub snaplen: u32,
    pub bytes: u64,
    pub filter: Vec<vale_abi::capture::BpfInsn>,
}

/// Starts a capture; the reply, the memfd to send with it, and what the connection keeps.
pub fn start(
    engine: &Engine,
    caller: &Caller,
    port: &str,
    w: Want,
) -> Result<(Reply, OwnedFd, Held), Error> {
    let (shared, ring) = engine.capture(port, w.dirs, w.snaplen, w.bytes, w.filter, caller)?;
    let fd = match ring.memfd().try_clone() {
        Ok(fd) => fd,
        Err(e) => {
            shared.captures.remove(&ring);
            return Err(Error::io(format!("cannot send the capture buffer: {e}")));
        }
    };
    let reply = Reply::Capture {
        port: port.to_string(),
        size: ring.size() as u64,
    };
    let held = Held {
        port: Arc::downgrade(&shared),
        ring: Arc::downgrade(&ring),
    };
    Ok((reply, fd, held))
}

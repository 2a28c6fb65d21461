//! Frames toward the client: its S2C rings, written by whichever thread delivers.
//!
//! The switch's forwarding threads write each batch for the port straight into the client's
//! buffers ([`Sink`], a [`DirectSink`]: one copy, from the sender's buffer), and the port's own
//! thread writes what waited in the port's rx ring (the egress step, through [`Out`]). Both go
//! through [`Shared`]: the client's regions and its S2C rings, each ring behind a lock taken
//! once per batch. A frame's ring is chosen by its MAC addresses ([`ring_of`]), the same
//! whichever way it goes, so that a flow keeps one ring and its order.
//!
//! A forwarding thread that finds an S2C ring broken drops its frames and leaves the ending
//! of the connection to the port's thread ([`Sink::broken`], which it wakes).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::Error;
use super::ring::{Put, Regions, Ring};
use super::MAX_PAIRS;
use crate::host::{peer_irq, DevError, Egress};
use crate::offload::Offload;
use crate::sink::{Delivered, DirectSink, OutFrames};
use vale_abi::eventfd;

/// What the threads that write to the client share: its memory (unmapped when the last
/// holder lets go) and its S2C rings.
pub struct Shared {
    pub regions: Regions,
    pub s2c: Vec<Mutex<Ring>>,
}

// SAFETY: the regions are only read through `Regions::piece` after setup; the rings are
// behind their locks.
unsafe impl Sync for Shared {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The S2C ring of a frame whose first piece is `first`: by its MAC addresses.
pub fn ring_of(first: &[u8], rings: usize) -> usize {
    if rings <= 1 {
        return 0;
    }
    let h = first
        .iter()
        .take(12)
        .fold(0u32, |h, &b| h.wrapping_mul(31).wrapping_add(b as u32));
    (h.wrapping_mul(0x9e37_79b9) >> 16) as usize % rings
}

/// The rings a batch took, each locked once, published and unlocked at the end.
struct Held<'a> {
    shared: &'a Shared,
    rings: [Option<MutexGuard<'a, Ring>>; MAX_PAIRS],
}

impl<'a> Held<'a> {
    fn new(shared: &'a Shared) -> Held<'a> {
        Held {
            shared,
            rings: Default::default(),
        }
    }

    fn ring(&mut self, q: usize) -> &mut Ring {
        let shared = self.shared;
        self.rings[q].get_or_insert_with(|| lock(&shared.s2c[q]))
    }

    /// Hands what was written to the client; the rings (a bit each) whose client wants an
    /// interrupt.
    fn publish(&mut self) -> u32 {
        let mut want = 0;
        for (q, r) in self.rings.iter_mut().enumerate() {
            if let Some(r) = r {
                if r.publish() {
                    want |= 1 << q;
                }
            }
        }
        self.rings = Default::default();
        want
    }
}

/// The port's direct sink: the connection of the moment, if any.
pub struct Sink {
    pub cur: Mutex<Option<Arc<Shared>>>,
    /// A forwarding thread found an S2C ring broken: why (the port's thread ends the
    /// connection).
    broken: Mutex<Option<Error>>,
    pub broken_flag: AtomicBool,
    /// S2C rings (a bit each) whose client wants an interrupt that the port's thread is to
    /// send: the switch's threads never write a client's eventfd (a client may make it
    /// blocking), they leave it to the port's thread.
    pub kicks: AtomicU32,
    /// Wakes the port's thread for these.
    pub wake: OwnedFd,
}

impl Sink {
    pub fn new() -> io::Result<Sink> {
        Ok(Sink {
            cur: Mutex::new(None),
            broken: Mutex::new(None),
            broken_flag: AtomicBool::new(false),
            kicks: AtomicU32::new(0),
            wake: eventfd::new()?,
        })
    }

    pub fn set(&self, shared: Option<Arc<Shared>>) {
        *lock(&self.cur) = shared;
        self.broken_flag.store(false, Relaxed);
        lock(&self.broken).take();
    }

    /// Why a forwarding thread found the client's rings broken, once.
    pub fn broken(&self) -> Option<Error> {
        if !self.broken_flag.swap(false, Relaxed) {
            return None;
        }
        lock(&self.broken).take()
    }

    fn report(&self, why: Error) {
        lock(&self.broken).get_or_insert(why);
        self.broken_flag.store(true, Relaxed);
        eventfd::signal(&self.wake);
    }
}

impl DirectSink for Sink {
    fn send_batch(&self, frames: &mut dyn OutFrames, _flow: u32) -> Delivered {
        let mut d = Delivered::default();
        let shared = lock(&self.cur).clone();
        let Some(shared) = shared else {
            // No client: dropped (counted by the switch).
            while frames.next_frame().is_some() {
                d.dropped += 1;
            }
            return d;
        };
        let mut held = Held::new(&shared);
        let mut broken = None;
        while let Some(f) = frames.next_frame() {
            // iov[0] is the sink's own header: memif has none.
            f.iov[0].iov_len = 0;
            let len = f.len as u64;
            // SAFETY: the switch's pieces of this frame, valid until the next frame is taken
            // (see `OutFrames`).
            let piece = |v: &libc::iovec| unsafe {
                std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
            };
            if broken.is_some() || f.iov.len() < 2 {
                d.dropped += 1;
                continue;
            }
            let q = ring_of(piece(&f.iov[1]), shared.s2c.len());
            let put = held
                .ring(q)
                .put(&shared.regions, len, f.iov[1..].iter().map(piece));
            if !d.count(frames, len, &put) {
                break;
            }
            if let Err(Put::Broken(e)) = put {
                // Counted once, as the connection ends (see `Sink::broken`).
                broken = Some(e.in_ring("S2C", q));
            }
        }
        let want = held.publish();
        if want != 0 && self.kicks.fetch_or(want, Relaxed) & want != want {
            eventfd::signal(&self.wake);
        }
        if let Some(why) = broken {
            self.report(why);
        }
        d
    }
}

/// The S2C rings, as the egress step's device (frames that waited in the port's rx ring).
pub struct Out<'a> {
    held: Option<Held<'a>>,
    pub broken: Option<Error>,
}

impl<'a> Out<'a> {
    pub fn new(shared: Option<&'a Shared>) -> Out<'a> {
        Out {
            held: shared.map(Held::new),
            broken: None,
        }
    }
}

impl Egress for Out<'_> {
    fn send(&mut self, pieces: &[&[u8]], _off: Offload) -> Result<bool, DevError> {
        let Some(held) = self.held.as_mut() else {
            return Err(DevError::Frame(io::Error::from_raw_os_error(libc::ENODEV)));
        };
        let shared = held.shared;
        let q = ring_of(pieces.first().copied().unwrap_or(&[]), shared.s2c.len());
        let len = pieces.iter().map(|p| p.len() as u64).sum();
        match held
            .ring(q)
            .put(&shared.regions, len, pieces.iter().copied())
        {
            Ok(r) => Ok(r),
            Err(Put::TooLong) => Err(DevError::Frame(io::Error::from_raw_os_error(
                libc::EMSGSIZE,
            ))),
            Err(Put::Broken(e)) => {
                self.broken.get_or_insert(e.in_ring("S2C", q));
                Err(DevError::Down {
                    err: io::Error::from_raw_os_error(libc::EPROTO),
                    pause: true,
                })
            }
        }
    }

    fn flush(&mut self) -> Result<(), DevError> {
        if let Some(h) = self.held.as_mut() {
            // The port's own thread: it interrupts the client itself.
            let want = h.publish();
            if let Err(e) = kick(h.shared, want) {
                self.broken.get_or_insert(e.into());
            }
        }
        Ok(())
    }
}

/// Interrupts the client on the S2C rings in `want` (a bit each): the port's thread only, and
/// with no ring's lock held (the switch's threads take those). `Blocked`: the client made the
/// write sleep ([`peer_irq`]), and the connection is to end.
pub fn kick(shared: &Shared, want: u32) -> Result<(), peer_irq::Blocked> {
    let mut bits = want;
    while bits != 0 {
        let q = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        if let Some(r) = shared.s2c.get(q) {
            // The descriptor lives as long as `shared`: the ring's is never replaced.
            let fd = lock(r).irq_fd();
            peer_irq::interrupt(fd)?;
        }
    }
    Ok(())
}

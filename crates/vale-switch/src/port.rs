//! A port: what stays across owners ([`PortShared`]: name, counters, knobs) and what one owner
//! brings ([`Attachment`]: the region, notification lines and per-ring state).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

use vale_abi::control::PortCounters;
use vale_abi::region::Layout;

use crate::region::Region;
use vale_abi::{eventfd, pipe};

pub use crate::index::PortIndex;

/// Counters, updated once per batch (never per packet) by whichever worker forwards.
#[derive(Default)]
pub struct PortStats {
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub rx_drops: AtomicU64,
    pub tx_drops: AtomicU64,
    pub bad_input: AtomicU64,
    pub learn_refused: AtomicU64,
}

impl PortStats {
    pub fn snapshot(&self) -> PortCounters {
        PortCounters {
            tx_packets: self.tx_packets.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            rx_drops: self.rx_drops.load(Relaxed),
            tx_drops: self.tx_drops.load(Relaxed),
            bad_input: self.bad_input.load(Relaxed),
            learn_refused: self.learn_refused.load(Relaxed),
        }
    }
}

#[inline]
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    if n != 0 {
        counter.fetch_add(n, Relaxed);
    }
}

/// What a port keeps whoever holds it.
pub struct PortShared {
    /// Full name, `valeX:Y`.
    pub name: String,
    pub persistent: AtomicBool,
    pub stats: PortStats,
    /// Interrupt moderation toward the client, nanoseconds (0: immediate).
    pub moderation_ns: AtomicU64,
    /// The user the port belongs to (see [`crate::access`]).
    pub owner_uid: u32,
    /// Most source addresses a learning lookup keeps for this port (`learn-limit`).
    pub learn_limit: AtomicU32,
    /// Captures of the port's frames (`vale-ctl capture`), kept across owners.
    pub captures: crate::capture::Captures,
}

impl PortShared {
    pub fn new(name: String, persistent: bool, owner_uid: u32) -> PortShared {
        PortShared {
            name,
            owner_uid,
            persistent: AtomicBool::new(persistent),
            stats: PortStats::default(),
            moderation_ns: AtomicU64::new(0),
            learn_limit: AtomicU32::new(crate::lookup::LearningBridge::DEFAULT_LEARN_LIMIT),
            captures: Default::default(),
        }
    }
}

/// Interrupt line toward the client for one ring, with its moderation state.
pub struct Irq {
    /// valed's end of the line: a file of its own that no client holds, so that writing it
    /// never blocks (see [`vale_abi::pipe`]).
    pub wr: OwnedFd,
    /// The client's end, sent at open. Kept open here too, so the line always has a reader
    /// (a write never meets EPIPE) and a host port's thread can wait on it.
    pub rd: OwnedFd,
    /// When the last interrupt was raised (engine clock, ns).
    pub last_ns: AtomicU64,
    /// An interrupt is deferred by moderation and queued on some worker.
    pub pending: AtomicBool,
}

/// valed's state of one tx ring. Only the worker serving the ring touches `hwcur`.
pub struct TxRing {
    pub kick: OwnedFd,
    pub irq: Irq,
    pub hwcur: AtomicU32,
    /// The client's `head` as last read, valid or not. Work is a change of `head`, so a bad
    /// value or a half-published chain is looked at (and counted) once, not spun on.
    pub seen_head: AtomicU32,
    /// Inside a refused chain whose last slot is not yet published: its remaining slots are
    /// skipped, never forwarded as a frame of their own.
    pub dropping_chain: AtomicBool,
}

/// valed's state of one rx ring. Workers deliver into it under `lock`, once per batch.
pub struct RxRing {
    /// Holds `hwtail`: the next slot valed fills.
    pub lock: Mutex<u32>,
    /// Sent to the client for symmetry; valed never needs a kick on an rx ring.
    pub kick: OwnedFd,
    pub irq: Irq,
}

/// One owner's region and ring state.
pub struct Attachment {
    pub region: Region,
    pub tx: Box<[TxRing]>,
    pub rx: Box<[RxRing]>,
    pub owner_pid: u32,
    /// The offload work ([`crate::offload::Caps`]) frames toward this port may carry as they
    /// are; the rest the switch does in software first. A kind may change it at run time.
    pub caps: AtomicU8,
    /// Set for a port whose client is valed itself (TAP, NIC).
    pub host: Option<std::sync::Arc<crate::sink::HostState>>,
    /// Frames for the port go straight to this device, not into the rx ring.
    pub direct: Option<std::sync::Arc<dyn crate::sink::DirectSink>>,
    /// First bad input of this owner is logged; the rest are only counted.
    pub bad_logged: AtomicBool,
    /// The port has left its switch: a worker handed one of its rings by another no longer
    /// takes it (see `worker.rs`).
    pub released: AtomicBool,
}

impl Attachment {
    pub fn new(name: &str, layout: Layout, owner_pid: u32) -> std::io::Result<Attachment> {
        let region = Region::create(name, layout)?;
        let irq = || -> std::io::Result<Irq> {
            let (rd, wr) = pipe::new()?;
            Ok(Irq {
                wr,
                rd,
                last_ns: AtomicU64::new(0),
                pending: AtomicBool::new(false),
            })
        };
        let tx = (0..layout.params.tx_rings)
            .map(|_| {
                Ok(TxRing {
                    kick: eventfd::new()?,
                    irq: irq()?,
                    hwcur: AtomicU32::new(0),
                    seen_head: AtomicU32::new(0),
                    dropping_chain: AtomicBool::new(false),
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let rx = (0..layout.params.rx_rings)
            .map(|_| {
                Ok(RxRing {
                    lock: Mutex::new(0),
                    kick: eventfd::new()?,
                    irq: irq()?,
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Attachment {
            region,
            tx: tx.into(),
            rx: rx.into(),
            owner_pid,
            caps: AtomicU8::new(0),
            host: None,
            direct: None,
            bad_logged: AtomicBool::new(false),
            released: AtomicBool::new(false),
        })
    }

    /// The descriptors a client receives: memfd, then per ring (tx, then rx) kick and the
    /// read end of the interrupt line.
    pub fn client_fds(&self) -> Vec<RawFd> {
        debug_assert_eq!(
            self.tx.len() + self.rx.len(),
            self.region.layout().num_rings() as usize
        );
        let mut fds = vec![self.region.memfd().as_raw_fd()];
        for t in self.tx.iter() {
            fds.extend([t.kick.as_raw_fd(), t.irq.rd.as_raw_fd()]);
        }
        for r in self.rx.iter() {
            fds.extend([r.kick.as_raw_fd(), r.irq.rd.as_raw_fd()]);
        }
        fds
    }
}

/// Descriptors valed holds for a port of `rings` rings: the memfd, and per ring the kick
/// eventfd and both ends of the interrupt pipe.
pub fn descriptors_for(rings: u32) -> usize {
    1 + 3 * rings as usize
}

/// A port in a switch's table. A new `Port` replaces the old one whenever the owner changes;
/// `shared` carries over.
pub struct Port {
    pub shared: std::sync::Arc<PortShared>,
    pub index: PortIndex,
    /// None for a persistent port nobody holds: frames for it are dropped and counted.
    pub attachment: Option<Attachment>,
}

impl Port {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn stats(&self) -> &PortStats {
        &self.shared.stats
    }

    /// Whether rx ring `r` exists; a port nobody holds takes (and drops, counted) any.
    pub fn has_rx_ring(&self, r: u16) -> bool {
        self.attachment
            .as_ref()
            .is_none_or(|a| (r as usize) < a.rx.len())
    }

    /// Logs the first bad value an owner writes; later ones are only counted.
    pub fn note_bad_input(&self, what: std::fmt::Arguments) {
        if let Some(a) = &self.attachment {
            if !a.bad_logged.swap(true, Relaxed) {
                tracing::warn!(port = %self.name(), pid = a.owner_pid, "bad input from client: {what}; counting further ones silently");
            }
        }
    }
}

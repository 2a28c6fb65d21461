//! A port as its client sees it: the mapped region, its rings, and the sync calls.
//!
//! `options.rs` opens a port; `wait.rs` waits for its rings (sleeping or busy); `ring.rs` is
//! a ring's view; this file the port itself, its rings' places in the region and the syncs.

use std::cell::Cell;
use std::io::{self, Read};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use vale_abi::control::{self, default_run_dir, PortCounters, Reply, Request};
use vale_abi::csb::{CsbAtok, CsbKtoa};
use vale_abi::error::{ErrorKind, Refused};
use vale_abi::netmap::{NetmapIf, NetmapRing, NetmapSlot, RING_SLOTS_OFS};
use vale_abi::region::{Layout, PortParams, RegionHeader, VALE_ABI_VERSION};
use vale_abi::spin::Spinner;
use vale_abi::{eventfd, pipe};

use crate::connect;

mod options;
mod ring;
mod wait;

pub use options::OpenOptions;
pub use ring::Ring;
use wait::*;
pub use wait::{Events, RingSet, Wait, Waiter};

/// An open port. Dropping it closes the port (valed frees it, unless it is persistent).
pub struct Port {
    name: String,
    /// [`forks`] when the port was opened: if it has changed, a process forked since, and
    /// the control connection may be shared with another process (see `Drop`).
    forks_at_open: u64,
    base: NonNull<u8>,
    layout: Layout,
    /// The connection that owns the port: valed frees the port when it closes.
    ctl: UnixStream,
    memfd: OwnedFd,
    /// Per region ring (tx, then rx): client-to-valed kick (eventfd), valed-to-client
    /// interrupt (read end of a pipe).
    kick: Vec<OwnedFd>,
    irq: Vec<OwnedFd>,
    /// Interrupts valed raised that `poll` consumed.
    interrupts: AtomicU64,
    /// Busy waits that slept because the CPU was crowded (see [`Port::crowded_waits`]).
    crowded: AtomicU64,
    /// The control connection was seen closed: valed is gone, and the port with it.
    gone: AtomicBool,
    /// When a sync last looked at the control connection (coarse clock, ns).
    looked_ns: AtomicU64,
    /// How [`Port::poll`] waits: 0 sleeps at once ([`Wait::Sleep`]), `u64::MAX` never
    /// sleeps ([`Wait::Busy`]), anything else spins that many ns first ([`Wait::BusyFor`]).
    spin_ns: AtomicU64,
    /// The descriptor of [`Port::fd`], made on first use.
    waiter: Mutex<Option<Arc<Waiter>>>,
    /// [`Waiter`]s made for this port so far. From the second on, the port is *shared*:
    /// several waiters may sleep on one ring at once (netmap's two descriptors on one port,
    /// one thread each), so `appl_need_kick` counts the waiters asking (a sync no longer
    /// clears it: only the waiter that asked withdraws its request), and a sync of a ring
    /// that another thread is syncing is skipped, as netmap skips a busy ring.
    waiters: AtomicU32,
    /// Per region ring: a sync is under way (taken only once the port is shared).
    busy: Box<[AtomicBool]>,
}

/// Forks seen by this process (and its ancestors since libvale was loaded): counted by the
/// fork handlers that [`forks`] installs on first use.
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_fork() {
    FORKS.fetch_add(1, SeqCst);
}

/// The number of forks so far, with the handlers that count them installed.
fn forks() -> u64 {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers plain functions that only bump an atomic (async-signal-safe),
        // in the parent and in the child of every later fork.
        unsafe { libc::pthread_atfork(None, Some(count_fork), Some(count_fork)) };
    });
    FORKS.load(SeqCst)
}

/// The error of every call on a port whose valed has gone away.
fn gone_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "valed went away (its control connection closed); the port is gone",
    )
}

// SAFETY: the mapping is shared memory; rings are used one thread per ring, as documented.
unsafe impl Send for Port {}
unsafe impl Sync for Port {}

impl Port {
    /// Opens `name` with default options.
    pub fn open(name: &str) -> io::Result<Port> {
        OpenOptions::new().open(name)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Interrupts from valed that [`Port::poll`] has consumed so far (each one raised counts
    /// once; with interrupt moderation, several deliveries share one; a client that leaves
    /// thousands unread loses the surplus, which changes nothing: it has a wake-up pending).
    pub fn interrupts(&self) -> u64 {
        self.interrupts.load(Relaxed)
    }

    /// Busy waits ([`Wait::Busy`], [`Wait::BusyFor`]) on this port that slept instead of
    /// spinning because the waiting thread's CPU was crowded: other tasks kept it when the
    /// wait yielded it (see [`crate::Spinner`]). 0 on a CPU of the waiter's own.
    pub fn crowded_waits(&self) -> u64 {
        self.crowded.load(Relaxed)
    }

    /// Chooses how [`Port::poll`] waits from now on (the default is [`Wait::Sleep`]).
    ///
    /// Busy waiting changes nothing in the protocol: only the client's own flag,
    /// `appl_need_kick`, which a busy wait never sets, so valed never raises the interrupt
    /// line for it (no system call on valed's side either). What tells valed to look at
    /// the client's rings is unchanged: [`Port::txsync`] still kicks valed when, asleep, it
    /// asked for it, so a busy client works against a valed that sleeps (it saves only its
    /// own wake-ups) as against one that busy-polls (`valed --busy-poll-us`, whose rings
    /// stay awake and need no kick: then neither side notifies the other, and the client
    /// makes no system call per packet).
    pub fn set_wait(&self, wait: Wait) {
        let ns = match wait {
            Wait::Sleep => 0,
            Wait::Busy => u64::MAX,
            // A spin of 584 years or more is a spin without end in all but name.
            Wait::BusyFor(d) => u64::try_from(d.as_nanos())
                .unwrap_or(u64::MAX)
                .clamp(1, u64::MAX - 1),
        };
        self.spin_ns.store(ns, Relaxed);
    }

    /// How [`Port::poll`] waits (see [`Port::set_wait`]).
    pub fn wait_mode(&self) -> Wait {
        match self.spin_ns.load(Relaxed) {
            0 => Wait::Sleep,
            u64::MAX => Wait::Busy,
            ns => Wait::BusyFor(Duration::from_nanos(ns)),
        }
    }

    /// This port's counters as valed keeps them (one control round trip; not for a hot loop).
    pub fn counters(&self) -> io::Result<PortCounters> {
        match control::exchange(&self.ctl, &Request::List)? {
            Some((Reply::List { switches }, _)) => switches
                .iter()
                .flat_map(|s| s.ports.iter())
                .find(|p| p.name == self.name)
                .map(|p| p.counters)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("port '{}' is gone", self.name),
                    )
                }),
            Some((Reply::Error { kind, message }, _)) => Err(Refused { kind, message }.into_io()),
            _ => Err(io::Error::other("unexpected reply from valed")),
        }
    }

    pub fn params(&self) -> &PortParams {
        &self.layout.params
    }

    /// The region's layout, as this client computed it (and checked valed's header against).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The region's memfd, for a second mapping of the same memory (netmap's `mmap` of the
    /// netmap descriptor), and its size.
    pub fn memfd(&self) -> (RawFd, usize) {
        (self.memfd.as_raw_fd(), self.layout.region_size as usize)
    }

    /// The region header valed wrote (magic, ABI version, offsets).
    pub fn region(&self) -> &RegionHeader {
        // SAFETY: offset 0 of our mapping, checked size.
        unsafe { &*(self.base.as_ptr() as *const RegionHeader) }
    }

    /// The netmap interface descriptor, for netmap-style code.
    pub fn nifp(&self) -> *mut NetmapIf {
        // SAFETY: inside the mapping.
        unsafe { self.base.as_ptr().add(self.layout.nifp_ofs as usize) as *mut NetmapIf }
    }

    /// A view of region ring `i`, borrowing the port.
    fn ring(&self, i: u32) -> Ring<'_> {
        // Our own layout, not the (writable) ring_ofs[] in the mapping.
        // SAFETY: both offsets lie inside the mapping.
        let (ring, bufs) = unsafe {
            (
                self.base.as_ptr().add(self.layout.ring_ofs(i) as usize),
                self.base.as_ptr().add(self.layout.bufs_ofs as usize),
            )
        };
        Ring {
            ptr: NonNull::new(ring as *mut NetmapRing).expect("mapped"),
            bufs: NonNull::new(bufs).expect("mapped"),
            num_bufs: self.layout.num_bufs,
            num_slots: self.layout.params.slots,
            buf_size: self.layout.params.buf_size,
            _port: std::marker::PhantomData,
        }
    }

    fn atok(&self, i: u32) -> &CsbAtok {
        // SAFETY: inside the mapping, 64-byte aligned.
        unsafe {
            &*(self.base.as_ptr().add(self.layout.csb_atok_ofs(i) as usize) as *const CsbAtok)
        }
    }

    fn ktoa(&self, i: u32) -> &CsbKtoa {
        // SAFETY: as above.
        unsafe {
            &*(self.base.as_ptr().add(self.layout.csb_ktoa_ofs(i) as usize) as *const CsbKtoa)
        }
    }

    fn tx_index(&self, ring: u32) -> io::Result<u32> {
        if ring < self.layout.params.tx_rings {
            Ok(ring)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no tx ring {ring}"),
            ))
        }
    }

    fn rx_index(&self, ring: u32) -> io::Result<u32> {
        if ring < self.layout.params.rx_rings {
            Ok(self.layout.params.tx_rings + ring)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no rx ring {ring}"),
            ))
        }
    }

    /// A view of tx ring `ring`, which borrows the port.
    pub fn tx_ring(&self, ring: u32) -> Ring<'_> {
        self.ring(self.tx_index(ring).expect("tx ring index in range"))
    }

    /// A view of rx ring `ring`, which borrows the port.
    pub fn rx_ring(&self, ring: u32) -> Ring<'_> {
        self.ring(self.rx_index(ring).expect("rx ring index in range"))
    }

    /// Publishes `head`/`cur` of region ring `i` and refreshes its `tail`.
    fn sync(&self, i: u32, may_kick: bool) -> io::Result<()> {
        let ring = self.ring(i);
        if self.gone.load(Relaxed) {
            return Err(gone_error());
        }
        if !self.shared() {
            return self.sync_ring(i, &ring, ring.head(), ring.cur(), may_kick);
        }
        // Shared: one sync of a ring at a time (two would publish heads out of order); a
        // sync that finds the ring busy is skipped, as netmap's `nm_kr_tryget` does.
        let busy = &self.busy[i as usize];
        if busy.swap(true, Acquire) {
            return Ok(());
        }
        // Read the ring again under the flag: the other sync may have moved it.
        let r = self.sync_ring(i, &ring, ring.head(), ring.cur(), may_kick);
        busy.store(false, Release);
        r
    }

    /// The body of [`Port::sync`], `head` and `cur` checked.
    fn sync_ring(
        &self,
        i: u32,
        ring: &Ring,
        head: u32,
        cur: u32,
        may_kick: bool,
    ) -> io::Result<()> {
        let n = ring.num_slots();
        if head >= n || cur >= n {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring {i}: head {head} / cur {cur} out of range (slots {n})"),
            ));
        }
        let atok = self.atok(i);
        let ktoa = self.ktoa(i);
        // A sync means the client is awake: stop asking for interrupts on this ring (a wait
        // armed with `Waiter::arm` is over once the client looks at the ring again). Not on
        // a shared port: there the sync may be another thread's, and each waiter withdraws
        // its own request.
        if !self.shared() && atok.appl_need_kick.load(Relaxed) != 0 {
            atok.appl_need_kick.store(0, Relaxed);
        }
        atok.cur.store(cur, Relaxed);
        // Only this client writes head: what it holds is what valed was last told.
        let moved = atok.head.load(Relaxed) != head;
        // Release: the slots filled before head are visible to valed before head is.
        atok.head.store(head, Release);
        // A head that did not move gives valed nothing to do: no kick (a sync of an idle
        // ring must cost no system call, as netmap's CSB mode).
        if may_kick && moved {
            // Store head, full fence, then load kern_need_kick: valed stores the flag, fences,
            // then re-reads head, so either we see its flag and kick, or it sees our head.
            fence(SeqCst);
            if ktoa.kern_need_kick.load(Relaxed) != 0 {
                eventfd::signal(&self.kick[i as usize]);
            }
        }
        // Acquire: what valed wrote in the slots before hwtail is visible to us.
        let tail = ktoa.hwtail.load(Acquire);
        if tail == ring.tail() {
            // Nothing new: valed may be gone. Look now and then only, so a busy ring costs
            // no system call and an idle one about one a millisecond.
            self.check_alive()?;
        }
        ring.set_tail(tail);
        Ok(())
    }

    /// Sends what the client queued on tx ring `ring` (slots from the last `head` to the
    /// new one) and reclaims the slots valed is done with. Fails with
    /// [`io::ErrorKind::ConnectionReset`] once valed has gone away (noticed within about a
    /// millisecond of syncs that find nothing new).
    pub fn txsync(&self, ring: u32) -> io::Result<()> {
        self.sync(self.tx_index(ring)?, true)
    }

    /// Returns the slots before `head` of rx ring `ring` to valed and picks up new frames.
    /// Fails as [`Port::txsync`] once valed has gone away.
    pub fn rxsync(&self, ring: u32) -> io::Result<()> {
        // valed never waits on an rx ring: it reads head when it delivers.
        self.sync(self.rx_index(ring)?, false)
    }
}

/// Longest a close waits for valed to confirm the port is free.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl Drop for Port {
    fn drop(&mut self) {
        // Closing is synchronous: say we are done, then wait until valed, having freed the
        // port, closes its end. The name can be opened again as soon as this returns.
        //
        // Unless a fork came since the open: the control connection may then be another
        // process's too (a child holding the inherited port, or the parent of a child that
        // closes its copies), and a shutdown would end the port for both. Only this
        // process's descriptors close; valed frees the port when the last copy of the
        // connection closes, as the kernel ends a netmap port with its last descriptor.
        if forks() == self.forks_at_open
            && self.ctl.shutdown(std::net::Shutdown::Write).is_ok()
            && self.ctl.set_read_timeout(Some(CLOSE_WAIT)).is_ok()
        {
            let mut sink = [0u8; 256];
            while matches!((&self.ctl).read(&mut sink), Ok(n) if n > 0) {}
        }
        // SAFETY: unmaps exactly what `open` mapped.
        unsafe {
            libc::munmap(
                self.base.as_ptr() as *mut libc::c_void,
                self.layout.region_size as usize,
            )
        };
    }
}

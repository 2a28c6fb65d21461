//! Guest memory that shrinks under valed.
//!
//! A vhost-user front end shares the guest's memory as files (memfd, hugetlbfs) that valed
//! maps. The front end keeps them and may shrink one at any time (`ftruncate`); valed's next
//! access to a page past the new end would then raise SIGBUS and end valed, every switch
//! with it. Sealing cannot be required (hugetlbfs files and DPDK's memory are not sealed), so
//! valed catches it: the ranges where guest memory is mapped are registered here, and a
//! SIGBUS handler that finds the faulting address in one maps zero pages over that whole
//! range (the access is then retried and reads zeros: the guest only hurts itself) and flags
//! it. The port's worker sees the flag and ends the connection with one log line. A SIGBUS
//! anywhere else (or of another cause, such as a hardware memory error) is not valed's to
//! mend: the default action is restored and the signal comes again.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Once;

/// Ranges registered at once, in all of valed (a connection has its current memory table
/// registered, and the older ones a pass still held when they were replaced, until they are
/// unmapped: usually one or two tables of at most 32 regions each). A range must be
/// unregistered before it is unmapped: a stale range would cover whatever is mapped there
/// next.
const SLOTS: usize = 2048;

struct Slot {
    claimed: AtomicBool,
    start: AtomicUsize,
    /// 0: no range (set last when a range is registered, first when it goes).
    end: AtomicUsize,
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
};
static RANGES: [Slot; SLOTS] = [FREE; SLOTS];
/// How many times the handler mended a range: a cheap test of whether to look.
static HITS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

/// The ranges of one mapping of a guest's memory, guarded while this lives.
#[derive(Default)]
pub struct Guarded {
    slots: Vec<usize>,
}

impl Guarded {
    /// Guards `ranges` (address, length) of valed's address space. Ranges beyond the
    /// registry's room go unguarded (logged).
    pub fn new(ranges: impl Iterator<Item = (usize, usize)>) -> Guarded {
        INSTALL.call_once(install);
        let mut slots = Vec::new();
        for (start, len) in ranges {
            if len == 0 {
                continue;
            }
            let Some(i) = (0..SLOTS).find(|&i| {
                RANGES[i]
                    .claimed
                    .compare_exchange(false, true, Acquire, Relaxed)
                    .is_ok()
            }) else {
                tracing::warn!("guest memory guard full: a range of {len} bytes is unguarded");
                continue;
            };
            let s = &RANGES[i];
            s.hit.store(false, Relaxed);
            s.start.store(start, Relaxed);
            s.end.store(start + len, Release);
            slots.push(i);
        }
        Guarded { slots }
    }

    /// Whether the handler found one of these ranges shrunk.
    pub fn hit(&self) -> bool {
        self.slots.iter().any(|&i| RANGES[i].hit.load(Acquire))
    }
}

/// How many ranges the handler has mended so far, in all of valed: when this has not changed,
/// no [`Guarded::hit`] has either.
pub fn hits() -> u64 {
    HITS.load(Acquire)
}

/// Whether a registered range holds `addr`.
#[cfg(test)]
pub fn covers(addr: usize) -> bool {
    RANGES.iter().any(|s| {
        let end = s.end.load(Acquire);
        end != 0 && (s.start.load(Relaxed)..end).contains(&addr)
    })
}

impl Drop for Guarded {
    fn drop(&mut self) {
        for &i in &self.slots {
            let s = &RANGES[i];
            s.end.store(0, Release);
            s.start.store(0, Relaxed);
            s.claimed.store(false, Release);
        }
    }
}

fn install() {
    // SAFETY: a plain sigaction with a handler that only does async-signal-safe work.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigbus as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
            tracing::error!(
                "cannot catch SIGBUS: a front end that shrinks its guest memory can end valed"
            );
        }
    }
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this SIGBUS.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR {
        for s in &RANGES {
            let end = s.end.load(Acquire);
            let start = s.start.load(Relaxed);
            if end == 0 || !(start..end).contains(&addr) {
                continue;
            }
            // SAFETY: the range is a mapping of guest memory that valed made (page-aligned,
            // as mmap returns it); zero pages replace it, private to valed.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    end - start,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                s.hit.store(true, Release);
                HITS.fetch_add(1, Release);
                return;
            }
        }
    }
    // Not guest memory: what SIGBUS would have done without us.
    // SAFETY: async-signal-safe; the faulting access is retried and raises it again.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}

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
//!
//! The registry is a fixed table (the handler can take no lock and allocate nothing), so its
//! room is bounded, and shared by every peer: a mapping is guarded whole or not made. A
//! memory table or a memif connection whose ranges do not all fit is refused with an error
//! that says why, and each user (the peer's uid, from the socket) may hold at most
//! [`USER_RANGES`] of the [`SLOTS`], so that one user's connections cannot use up the others'.
//! (Before, ranges past the room went unguarded with a warning, and a client that then shrank
//! one of its files ended valed: 33 memif clients of 64 regions each.)

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Once;

/// Ranges registered at once, in all of valed (a connection has its current memory table
/// registered, and the older ones a pass still held when they were replaced, until they are
/// unmapped: usually one or two tables of at most 32 regions each; a memif client at most 64
/// regions). A range must be unregistered before it is unmapped: a stale range would cover
/// whatever is mapped there next. (32 bytes each: the table is 512 KiB of zeroed memory,
/// touched only as far as it is used.)
pub const SLOTS: usize = 16384;

/// Ranges the peers of one user (uid) may have guarded at once: 32 memif clients of 64
/// regions, or a few hundred virtual machines' memory tables.
pub const USER_RANGES: usize = 2048;

/// Why ranges could not be guarded: the mapping is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuardError {
    // (Short: a memif DISCONNECT carries 96 bytes of reason.)
    #[error(
        "guest memory guard: uid {uid} has {held} of its {USER_RANGES} ranges; {more} more refused"
    )]
    User { uid: u32, held: usize, more: usize },
    #[error("guest memory guard: all {SLOTS} ranges are in use; {more} more refused")]
    Full { more: usize },
}

/// Ranges held by each user's peers (claims and releases only: never the handler).
static USERS: std::sync::Mutex<Vec<(u32, usize)>> = std::sync::Mutex::new(Vec::new());

fn users() -> std::sync::MutexGuard<'static, Vec<(u32, usize)>> {
    USERS.lock().unwrap_or_else(|e| e.into_inner())
}

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
    /// The user whose room the ranges take.
    uid: u32,
}

impl Guarded {
    /// Guards `ranges` (address, length) of valed's address space, in the room of user
    /// `uid` (the peer that shares the memory): all of them, or none and why.
    pub fn new(
        uid: u32,
        ranges: impl Iterator<Item = (usize, usize)>,
    ) -> Result<Guarded, GuardError> {
        INSTALL.call_once(install);
        let ranges: Vec<(usize, usize)> = ranges.filter(|&(_, len)| len != 0).collect();
        let more = ranges.len();
        let mut users = users();
        let held = users.iter().find(|u| u.0 == uid).map_or(0, |u| u.1);
        if held + more > USER_RANGES {
            return Err(GuardError::User { uid, held, more });
        }
        let mut g = Guarded {
            slots: Vec::with_capacity(more),
            uid,
        };
        let mut from = 0;
        for (start, len) in ranges {
            let Some(i) = (from..SLOTS).find(|&i| {
                RANGES[i]
                    .claimed
                    .compare_exchange(false, true, Acquire, Relaxed)
                    .is_ok()
            }) else {
                // Nothing of the user's count was taken yet: only the slots go back.
                g.slots.drain(..).for_each(release);
                return Err(GuardError::Full { more });
            };
            from = i + 1;
            let s = &RANGES[i];
            s.hit.store(false, Relaxed);
            s.start.store(start, Relaxed);
            s.end.store(start + len, Release);
            g.slots.push(i);
        }
        match users.iter_mut().find(|u| u.0 == uid) {
            Some(u) => u.1 += more,
            None => users.push((uid, more)),
        }
        Ok(g)
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
        if self.slots.is_empty() {
            return;
        }
        let mut users = users();
        self.slots.iter().copied().for_each(release);
        if let Some(u) = users.iter_mut().find(|u| u.0 == self.uid) {
            u.1 = u.1.saturating_sub(self.slots.len());
        }
        users.retain(|u| u.1 != 0);
    }
}

/// Gives slot `i` back: its range goes first, as the handler reads it.
fn release(i: usize) {
    let s = &RANGES[i];
    s.end.store(0, Release);
    s.start.store(0, Relaxed);
    s.claimed.store(false, Release);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` ranges of a page each from `base` (never mapped: the registry only records them).
    fn ranges(n: usize, base: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..n).map(move |i| (base + i * 4096, 4096))
    }

    #[test]
    fn a_users_room_is_bounded_whole_and_given_back() {
        // Users no other test uses.
        let (uid, other) = (4_000_000_001, 4_000_000_002);
        let a = Guarded::new(uid, ranges(USER_RANGES - 1, 0x1000_0000_0000)).unwrap();
        assert!(covers(0x1000_0000_0000) && covers(0x1000_0000_0000 + 4096 * 100));
        // Two more do not fit: none is registered.
        let e = Guarded::new(uid, ranges(2, 0x2000_0000_0000)).err();
        assert_eq!(
            e,
            Some(GuardError::User {
                uid,
                held: USER_RANGES - 1,
                more: 2
            })
        );
        assert!(!covers(0x2000_0000_0000));
        let b = Guarded::new(uid, ranges(1, 0x2000_0000_0000)).unwrap();
        // Another user's room is its own.
        let c = Guarded::new(other, ranges(10, 0x3000_0000_0000)).unwrap();
        drop(a);
        assert!(!covers(0x1000_0000_0000));
        let d = Guarded::new(uid, ranges(USER_RANGES - 1, 0x4000_0000_0000)).unwrap();
        assert!(covers(0x4000_0000_0000) && covers(0x2000_0000_0000));
        drop((b, c, d));
        assert!(!users().iter().any(|u| u.0 == uid || u.0 == other));
    }
}

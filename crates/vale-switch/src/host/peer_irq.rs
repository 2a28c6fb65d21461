//! Interrupting a peer through an eventfd the peer shares: a write that cannot hold valed.
//!
//! A memif client's S2C interrupt eventfd and a vhost-user front end's call eventfds are the
//! peer's: valed holds the same open file, whose `O_NONBLOCK` flag the peer may clear at any
//! moment, and whose counter the peer may fill (`0xffff_ffff_ffff_fffe`). A write of 1 then
//! sleeps until someone reads the counter, which the peer need never do. No check before the
//! write closes that window (the peer changes the flag or the counter between the two), and an
//! eventfd's write honours neither `RWF_NOWAIT` nor a descriptor of valed's own (an anonymous
//! inode cannot be opened again). So the write is made as it is, and a watchdog ends it:
//!
//! - a thread that interrupts a peer marks itself busy around the write (two relaxed stores:
//!   the only cost on the path, where the checks it replaces cost one or two system calls);
//! - one watchdog thread looks at the marks every [`LOOK`]; a thread it finds busy with the same
//!   write at two looks in a row has slept in it, and gets [`signal`] (a handler that does
//!   nothing, installed without `SA_RESTART`), again at every look until it leaves: the write
//!   fails with `EINTR`;
//! - [`interrupt`] then answers [`Blocked`], and the caller ends the peer's connection.
//!
//! A write sleeps only on a full counter of a blocking file, which no peer that reads its
//! interrupts ever has: `EINTR` means the peer made it so. The signal may land just after the
//! write returned (the peer read its counter at that moment): the thread's next system call
//! then fails with `EINTR` once, which every wait of valed's threads takes as a spurious
//! wake-up. A thread stuck in such a write is freed within `2 × LOOK`.

use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

/// How often the watchdog looks at the threads that interrupt peers.
pub const LOOK: Duration = Duration::from_millis(50);

/// The write slept on a full counter that the peer made blocking, and was cut short.
#[derive(Debug, PartialEq, Eq)]
pub struct Blocked;

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(
            "the peer's interrupt eventfd held valed's write (its counter full and O_NONBLOCK \
             cleared)",
        )
    }
}

impl std::error::Error for Blocked {}

/// One thread that interrupts peers, as the watchdog sees it.
struct Mark {
    thread: libc::pthread_t,
    /// 0: not in a write; else the number of the write it is in.
    busy: AtomicU64,
    /// `busy` at the watchdog's last look.
    seen: AtomicU64,
}

/// The threads that have interrupted a peer and not yet ended. A thread takes its mark out
/// before it ends, under this lock, and the watchdog signals only under it: a signalled
/// thread is alive.
static MARKS: Mutex<Vec<Arc<Mark>>> = Mutex::new(Vec::new());
static START: Once = Once::new();

/// This thread's mark, registered at its first write and taken out when the thread ends.
struct Mine {
    mark: Arc<Mark>,
    count: Cell<u64>,
}

impl Mine {
    fn new() -> Mine {
        START.call_once(start);
        let mark = Arc::new(Mark {
            // SAFETY: plain call, this thread's id.
            thread: unsafe { libc::pthread_self() },
            busy: AtomicU64::new(0),
            seen: AtomicU64::new(0),
        });
        lock().push(mark.clone());
        Mine {
            mark,
            count: Cell::new(0),
        }
    }
}

impl Drop for Mine {
    fn drop(&mut self) {
        lock().retain(|m| !Arc::ptr_eq(m, &self.mark));
    }
}

thread_local! {
    static MINE: Mine = Mine::new();
}

fn lock() -> std::sync::MutexGuard<'static, Vec<Arc<Mark>>> {
    MARKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The signal that cuts a write short.
pub fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

/// Adds one to the counter of `fd`, a peer's eventfd. A full counter of a non-blocking file
/// (an interrupt is pending anyway) and a closed or odd descriptor are the peer's loss and
/// answer `Ok`; only a write the peer made sleep answers [`Blocked`].
pub fn interrupt(fd: RawFd) -> Result<(), Blocked> {
    let one: u64 = 1;
    let write = || {
        // SAFETY: writes 8 bytes from a live u64 to a descriptor the caller holds.
        unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) }
    };
    let n = MINE
        .try_with(|me| {
            let k = me.count.get().wrapping_add(1).max(1);
            me.count.set(k);
            me.mark.busy.store(k, Relaxed);
            let n = write();
            me.mark.busy.store(0, Relaxed);
            n
        })
        // A thread that is ending has no watchdog: it only ever ends a connection, whose
        // interrupts are not worth the risk.
        .unwrap_or(0);
    if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
        return Err(Blocked);
    }
    Ok(())
}

extern "C" fn on_signal(_: libc::c_int) {}

fn start() {
    // SAFETY: a plain sigaction with a handler that does nothing; no SA_RESTART, so that a
    // sleeping write returns EINTR.
    let installed = unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = 0;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(signal(), &act, std::ptr::null_mut()) == 0
    };
    if !installed {
        tracing::error!("cannot install the watchdog's signal: a peer can hold a thread of valed");
        return;
    }
    let r = std::thread::Builder::new()
        .name("vale-irq-watch".into())
        .spawn(watch);
    if let Err(e) = r {
        tracing::error!("cannot start the watchdog of peers' interrupts: {e}");
    }
}

fn watch() {
    loop {
        std::thread::sleep(LOOK);
        for m in lock().iter() {
            let busy = m.busy.load(Relaxed);
            if busy != 0 && m.seen.swap(busy, Relaxed) == busy {
                // SAFETY: the thread is alive (its mark is in the list, under the lock).
                unsafe { libc::pthread_kill(m.thread, signal()) };
            } else if busy == 0 {
                m.seen.store(0, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Instant;

    fn eventfd(flags: libc::c_int) -> OwnedFd {
        // SAFETY: a fresh eventfd of ours.
        let fd = unsafe { libc::eventfd(0, flags) };
        assert!(fd >= 0);
        // SAFETY: fd is fresh and owned here.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// Fills the counter of a fresh eventfd: a write of 1 more would sleep.
    fn fill(fd: &OwnedFd) {
        let v: u64 = 0xffff_ffff_ffff_fffe;
        // SAFETY: 8 bytes from a live u64.
        let n = unsafe { libc::write(fd.as_raw_fd(), &v as *const u64 as *const _, 8) };
        assert_eq!(n, 8);
    }

    #[test]
    fn a_write_the_peer_made_blocking_is_cut_short() {
        let fd = eventfd(0);
        fill(&fd);
        let t = Instant::now();
        assert_eq!(interrupt(fd.as_raw_fd()), Err(Blocked));
        let took = t.elapsed();
        assert!(took >= LOOK && took < 10 * LOOK, "{took:?}");
        // The thread goes on: a full counter of a non-blocking file is no error.
        let nb = eventfd(libc::EFD_NONBLOCK);
        fill(&nb);
        assert_eq!(interrupt(nb.as_raw_fd()), Ok(()));
    }

    #[test]
    fn a_peer_that_reads_its_counter_is_interrupted_at_once() {
        let fd = eventfd(0);
        for _ in 0..1000 {
            assert_eq!(interrupt(fd.as_raw_fd()), Ok(()));
        }
        assert_eq!(vale_abi::eventfd::drain(&fd), 1000);
    }
}

//! The kick line of every ring is an eventfd: signalling one is writing 1, consuming its signals
//! is reading the counter. valed also uses eventfds of its own (worker wake-ups) with the same
//! helpers.
//!
//! A kick eventfd is shared with the client by SCM_RIGHTS, so both hold one open file
//! description and its O_NONBLOCK flag is the client's to clear: valed never reads or writes
//! one (it watches it edge-triggered, see the worker).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A non-blocking, close-on-exec eventfd.
pub fn new() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked before it is owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to the counter, waking whoever polls it. A full counter (never in practice) still
/// leaves the fd readable, so the wake-up is not lost. Only for an eventfd whose file nobody
/// else can make blocking.
#[inline]
pub fn signal(fd: &impl AsRawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

/// Resets the counter; returns how many signals it held (0 if none). Only for an eventfd whose
/// file nobody else can make blocking.
#[inline]
pub fn drain(fd: &impl AsRawFd) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    let n = unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    if n == 8 {
        v
    } else {
        0
    }
}

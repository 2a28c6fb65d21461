//! The interrupt line of every ring (valed to client) is a pipe: valed keeps the write end,
//! the client receives only the read end. Raising an interrupt is writing one byte; consuming
//! interrupts is reading whatever bytes are there.
//!
//! Why not an eventfd, as in netmap's CSB mode: an eventfd passed by SCM_RIGHTS is one open
//! file description in both processes, so the client could clear its O_NONBLOCK and fill its
//! counter, and valed's next write would block for good. A pipe's write end is a file of its
//! own that no client ever holds: valed's writes never block, and a full pipe only means a
//! wake-up is already pending.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Bytes a line holds before further interrupts are dropped as redundant: one page, so a
/// client that never reads pins little of valed's memory.
const LINE_BYTES: libc::c_int = 4096;

/// A new line: (read end, write end), both non-blocking and close-on-exec.
pub fn new() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: plain syscall with a live array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors we own.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Best effort: the default capacity works as well, it only costs more when unread.
    // SAFETY: plain fcntl on our own descriptor.
    unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETPIPE_SZ, LINE_BYTES) };
    Ok((rd, wr))
}

/// Raises the line: writes one byte to the write end (which must be non-blocking). A full
/// pipe is not an error: the reader has a wake-up pending already.
#[inline]
pub fn signal(wr: &impl AsRawFd) {
    let one = 1u8;
    // SAFETY: writes 1 byte from a live u8.
    unsafe { libc::write(wr.as_raw_fd(), &one as *const u8 as *const libc::c_void, 1) };
}

/// Empties the line from its read end (one read, never a second that could wait); returns
/// how many interrupts it held (0 if none). Call it when poll says the end is readable, or
/// with the end non-blocking. Bytes beyond one line's worth stay and wake the next poll.
#[inline]
pub fn drain(rd: &impl AsRawFd) -> u64 {
    let mut buf = [0u8; LINE_BYTES as usize];
    // SAFETY: reads into a live local buffer of the length passed.
    let n = unsafe {
        libc::read(
            rd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    n.max(0) as u64
}

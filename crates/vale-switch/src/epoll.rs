//! The epoll calls of valed's threads (workers, host ports, the control socket): each waits on
//! its descriptors with a token per descriptor.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub fn new() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall, checked before the descriptor is owned.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watches `fd` for readability; events on it carry `token`.
pub fn add(ep: &OwnedFd, fd: RawFd, token: u64) -> io::Result<()> {
    watch(ep, fd, libc::EPOLL_CTL_ADD, token, libc::EPOLLIN as u32)
}

/// Watches `fd` edge-triggered: an event when it becomes readable or is written again (an
/// eventfd wakes its watchers on every write), never merely because it stays readable. If
/// `fd` is readable already, the first event comes at once.
pub fn add_edge(ep: &OwnedFd, fd: RawFd, token: u64) -> io::Result<()> {
    watch(
        ep,
        fd,
        libc::EPOLL_CTL_ADD,
        token,
        (libc::EPOLLIN | libc::EPOLLET) as u32,
    )
}

/// `epoll_ctl` operation `op` (add or modify) on `fd` for `events`, carrying `token`.
pub fn watch(ep: &OwnedFd, fd: RawFd, op: i32, token: u64, events: u32) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: plain syscall with a live event struct.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Stops watching `fd`, which must still be open.
pub fn del(ep: &OwnedFd, fd: RawFd) {
    // SAFETY: plain syscall; a descriptor not watched only gets an error back.
    unsafe {
        libc::epoll_ctl(
            ep.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        )
    };
}

/// Waits up to `timeout_ms` (-1: forever) and returns the events that came.
pub fn wait<'a>(
    ep: &OwnedFd,
    events: &'a mut [libc::epoll_event],
    timeout_ms: i32,
) -> &'a [libc::epoll_event] {
    // SAFETY: the buffer outlives the call and its length is passed.
    let n = unsafe {
        libc::epoll_wait(
            ep.as_raw_fd(),
            events.as_mut_ptr(),
            events.len() as i32,
            timeout_ms,
        )
    };
    &events[..n.max(0) as usize]
}

/// Waits up to `timeout`, to the nanosecond (`epoll_pwait2`; [`wait`] rounds up to a
/// millisecond), and returns the events that came; where the kernel lacks `epoll_pwait2`,
/// waits 1 ms.
pub fn wait_for<'a>(
    ep: &OwnedFd,
    events: &'a mut [libc::epoll_event],
    timeout: std::time::Duration,
) -> &'a [libc::epoll_event] {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the buffer outlives the call and its length is passed; a live timespec; no
    // signal mask.
    let n = unsafe {
        libc::epoll_pwait2(
            ep.as_raw_fd(),
            events.as_mut_ptr(),
            events.len() as i32,
            &ts,
            std::ptr::null(),
        )
    };
    if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        return wait(ep, events, 1);
    }
    &events[..n.max(0) as usize]
}

/// A non-blocking, close-on-exec timerfd on the monotonic clock, for a thread to wait on
/// beside its other descriptors.
pub fn new_timer() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall, checked before the descriptor is owned.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `timer` fire once, `ns` nanoseconds from now (at least 1).
pub fn arm_timer(timer: &OwnedFd, ns: u64) {
    set_timer(timer, ns.max(1), 0);
}

/// Makes `timer` fire every `ns` nanoseconds (at least 1), the first time `ns` from now.
pub fn arm_periodic(timer: &OwnedFd, ns: u64) {
    set_timer(timer, ns.max(1), ns.max(1));
}

/// Stops `timer` from firing.
pub fn disarm_timer(timer: &OwnedFd) {
    set_timer(timer, 0, 0);
}

/// `timerfd_settime`: the first expiry `ns` from now (0: none), then every `period` (0: none).
fn set_timer(timer: &OwnedFd, ns: u64, period: u64) {
    let ts = |ns: u64| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: ts(period),
        it_value: ts(ns),
    };
    // SAFETY: plain syscall with a live struct.
    unsafe { libc::timerfd_settime(timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
}

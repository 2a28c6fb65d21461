//! A clock in nanoseconds: one read of `clock_gettime` (through the vDSO, no system call, for
//! the realtime and monotonic clocks), for everyone who times something.

/// Clock `clock` (`libc::CLOCK_MONOTONIC`, `CLOCK_REALTIME`, ...) in nanoseconds.
#[inline]
pub fn ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain call with a live timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

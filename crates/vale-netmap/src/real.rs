//! The C library's own functions, behind the ones this library puts in front of them.
//!
//! Found once each with `dlsym(RTLD_NEXT)`: the next definition after ours in the lookup
//! order, which is libc's whether this library is preloaded or linked.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use libc::{c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, nfds_t, off_t, pollfd};
use libc::{sigset_t, timespec, timeval};

/// Resolves `name` once; aborts if the C library lacks it (nothing sensible could follow).
fn lookup(slot: &AtomicUsize, name: &'static [u8]) -> usize {
    let p = slot.load(Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: name is NUL-terminated; RTLD_NEXT is a valid pseudo-handle.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if p == 0 {
        eprintln!(
            "vale-netmap: the C library has no {}",
            String::from_utf8_lossy(&name[..name.len() - 1])
        );
        std::process::abort();
    }
    slot.store(p, Relaxed);
    p
}

macro_rules! real {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {$(
        pub fn $name() -> unsafe extern "C" fn($($arg),*) -> $ret {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let p = lookup(&SLOT, concat!(stringify!($name), "\0").as_bytes());
            // SAFETY: the C library's function of this name has this signature.
            unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
        }
    )*};
}

real! {
    open: fn(*const libc::c_char, c_int, c_uint) -> c_int;
    open64: fn(*const libc::c_char, c_int, c_uint) -> c_int;
    openat: fn(c_int, *const libc::c_char, c_int, c_uint) -> c_int;
    openat64: fn(c_int, *const libc::c_char, c_int, c_uint) -> c_int;
    close: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    close_range: fn(c_uint, c_uint, c_int) -> c_int;
    closefrom: fn(c_int) -> ();
    ioctl: fn(c_int, c_ulong, *mut c_void) -> c_int;
    mmap: fn(*mut c_void, usize, c_int, c_int, c_int, off_t) -> *mut c_void;
    poll: fn(*mut pollfd, nfds_t, c_int) -> c_int;
    ppoll: fn(*mut pollfd, nfds_t, *const timespec, *const sigset_t) -> c_int;
    select: fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int;
    pselect: fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *const timespec, *const sigset_t) -> c_int;
    epoll_create1: fn(c_int) -> c_int;
    epoll_ctl: fn(c_int, c_int, c_int, *mut epoll_event) -> c_int;
    epoll_wait: fn(c_int, *mut epoll_event, c_int, c_int) -> c_int;
    epoll_pwait: fn(c_int, *mut epoll_event, c_int, c_int, *const sigset_t) -> c_int;
}

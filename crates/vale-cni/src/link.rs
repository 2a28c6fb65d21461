//! The container's side: entering its network namespace, moving the TAP device into it,
//! naming, sizing and raising it, and giving it its addresses and routes.
//!
//! The rtnetlink requests are vale-netlink's, shared with valed's EVPN ports: they need no
//! async runtime. A netlink socket talks to the namespace its thread was in when it was made,
//! so the work inside a container's namespace runs on a thread of its own that enters it
//! ([`in_netns`]) and ends right after.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

pub use vale_netlink::{mac_text, Socket};

/// Runs `f` on a thread that first enters the network namespace `ns` (an open nsfs file);
/// what it returns, or why the namespace could not be entered.
pub fn in_netns<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only (CLONE_NEWNET), with a descriptor we hold open.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the thread in the namespace panicked")))
    })
}

/// The index of interface `name` in the calling thread's namespace, if it exists.
pub fn index_of(name: &str) -> Option<i32> {
    vale_netlink::index_of(name).ok()
}

/// A netlink socket of the calling thread's namespace, with a two-second receive timeout (a
/// request the kernel never answers fails rather than hangs).
pub fn socket() -> io::Result<Socket> {
    Socket::open(0, Duration::from_secs(2))
}

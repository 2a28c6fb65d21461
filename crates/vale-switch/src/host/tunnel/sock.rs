//! The underlay: one kernel UDP socket per tunnel port, bound to its local address and port,
//! set never to fragment (a frame too big for the path is refused with EMSGSIZE, and counted),
//! with the UDP checksum on (the kernel, or the device's offload, computes it): the kernel takes
//! `UDP_SEGMENT`, which the direct path sends runs of frames with, only with checksums on.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::super::Error;

/// Socket buffers asked for: a few thousand frames of headroom while the port's thread is away.
const SOCK_BUF: libc::c_int = 4 << 20;
/// The receive buffer: 16 MiB, about 100 ms of 1514-byte frames at 60 kpps (a datagram takes
/// its frame and about 1 KiB of the kernel's bookkeeping), for a port thread that a crowded CPU
/// keeps waiting: with 4 MiB, a paced 63 kpps stream of 1514-byte frames lost 0.4-0.6% of its
/// frames there on a loaded 2-vCPU machine, where 60-byte frames lost none.
const RCV_BUF: libc::c_int = 16 << 20;

/// `addr` as a socket address the kernel takes, and its length.
pub fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The IP address of a socket address the kernel filled in (the port is not looked at).
pub fn ip_of(ss: &libc::sockaddr_storage) -> Option<IpAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // An IPv4 peer of a dual-stack socket never appears: the socket is IPv6-only.
            Some(IpAddr::V6(ip))
        }
        _ => None,
    }
}

fn setopt(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> io::Result<()> {
    // SAFETY: a c_int option value, its size given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &val as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The UDP socket of tunnel port `kind` on `local` (non-blocking).
pub fn open(kind: &str, local: SocketAddr) -> Result<OwnedFd, Error> {
    let family = if local.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(Error::of_io(
            format!("{kind}: cannot open a UDP socket: {e}"),
            &e,
        ));
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let opt = |level, name, val, what: &str| {
        setopt(&fd, level, name, val).map_err(|e| {
            Error::of_io(
                format!("{kind}: cannot set {what} on the UDP socket: {e}"),
                &e,
            )
        })
    };
    if local.is_ipv4() {
        opt(
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            "IP_MTU_DISCOVER",
        )?;
    } else {
        opt(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1, "IPV6_V6ONLY")?;
        opt(
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            "IPV6_MTU_DISCOVER",
        )?;
        opt(libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1, "IPV6_DONTFRAG")?;
    }
    // Beyond the system's maximum when valed may (it runs as root); else what it allows.
    for (force, plain, size) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, RCV_BUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, SOCK_BUF),
    ] {
        if setopt(&fd, libc::SOL_SOCKET, force, size).is_err() {
            let _ = setopt(&fd, libc::SOL_SOCKET, plain, size);
        }
    }
    let (ss, len) = sockaddr(local);
    // SAFETY: a socket address of `len` bytes.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    } != 0
    {
        let e = io::Error::last_os_error();
        let msg = if e.raw_os_error() == Some(libc::EADDRINUSE) {
            return Err(Error::Busy(format!(
                "{kind}: UDP {local} is taken (by another tunnel port or program): use another \
                 local address or dstport"
            )));
        } else {
            format!("{kind}: cannot bind the UDP socket to {local}: {e}")
        };
        return Err(Error::of_io(msg, &e));
    }
    Ok(fd)
}

//! What we learn about an interface: index, MTU, flags, rx queue count.
//!
//! Everything goes through ioctls on a socket where possible, because sockets belong to the
//! calling thread's network namespace while `/sys/class/net` shows the namespace sysfs was
//! mounted in (they differ for a thread that entered another namespace with setns).

use crate::sys;
use std::ffi::{c_void, CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

fn ctl_socket() -> io::Result<OwnedFd> {
    sys::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)
        .or_else(|_| sys::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0))
}

fn ifreq(name: &str) -> io::Result<sys::IfReq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{name}' is not a valid interface name"),
        ));
    }
    let mut req = sys::IfReq {
        name: [0; libc::IFNAMSIZ],
        data: sys::IfrData { int: 0 },
    };
    for (d, s) in req.name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

fn ioctl(req_code: libc::c_ulong, req: &mut sys::IfReq) -> io::Result<()> {
    let s = ctl_socket()?;
    // SAFETY: `req` is a valid `struct ifreq` for these SIOC* requests; any pointer in it was set
    // by the caller to memory that outlives the call.
    sys::cvt(unsafe { libc::ioctl(s.as_raw_fd(), req_code as _, req as *mut sys::IfReq) }).map(drop)
}

/// The index of `name`, or NotFound.
pub fn index_of(name: &str) -> io::Result<u32> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name contains NUL"))?;
    // SAFETY: `c` is a NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENODEV) | Some(libc::ENXIO) | None | Some(0) => io::Error::new(
                io::ErrorKind::NotFound,
                format!("interface '{name}' does not exist"),
            ),
            _ => io::Error::new(e.kind(), format!("interface '{name}': lookup failed: {e}")),
        });
    }
    Ok(idx)
}

/// The current name of interface `ifindex`, or None when no interface has that index any more.
pub fn name_of(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IFNAMSIZ];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname writes at most.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success if_indextoname wrote a NUL-terminated name into `buf`.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

pub fn mtu(name: &str) -> io::Result<u32> {
    let mut req = ifreq(name)?;
    ioctl(sys::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU fills the `int` member.
    Ok(unsafe { req.data.int }.max(0) as u32)
}

pub fn flags(name: &str) -> io::Result<u32> {
    let mut req = ifreq(name)?;
    ioctl(sys::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: SIOCGIFFLAGS fills the `short` member.
    Ok(unsafe { req.data.short } as u16 as u32)
}

/// How many rx queues the interface has: `/sys/class/net/IF/queues/rx-*` when that directory
/// belongs to this very interface (same ifindex), else the driver's channel counts, else 1.
pub fn rx_queues(name: &str, ifindex: u32) -> u32 {
    let base = format!("/sys/class/net/{name}");
    let same = std::fs::read_to_string(format!("{base}/ifindex"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        == Some(ifindex);
    if same {
        if let Ok(dir) = std::fs::read_dir(format!("{base}/queues")) {
            let n = dir
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32;
            if n > 0 {
                return n;
            }
        }
    }
    let mut ch = sys::EthtoolChannels {
        cmd: sys::ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    if let Ok(mut req) = ifreq(name) {
        req.data.ptr = &mut ch as *mut sys::EthtoolChannels as *mut c_void;
        if ioctl(sys::SIOCETHTOOL, &mut req).is_ok() {
            let n = ch.rx_count + ch.combined_count;
            if n > 0 {
                return n;
            }
        }
    }
    1
}

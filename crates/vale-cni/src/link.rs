//! The container's side: entering its network namespace, moving the TAP device into it,
//! naming, sizing and raising it, and giving it its addresses and routes.
//!
//! Netlink is spoken by hand over an `AF_NETLINK` socket, as valed's EVPN ports do: the few
//! requests below need no async runtime and no crate of their own. A netlink socket talks to
//! the namespace its thread was in when it was made, so the work inside a container's
//! namespace runs on a thread of its own that enters it ([`in_netns`]) and ends right after.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
    let c = CString::new(name).ok()?;
    // SAFETY: a valid C string; if_nametoindex only reads it.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i as i32)
}

/// What [`Socket::link`] reports of an interface.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LinkInfo {
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A NETLINK_ROUTE socket of the calling thread's namespace.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    /// Blocking, with a two-second receive timeout (a request the kernel never answers fails
    /// rather than hangs).
    pub fn open() -> io::Result<Socket> {
        // SAFETY: plain socket call.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: an option of its size on our socket.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Ok(Socket { fd, seq: 0 })
    }

    fn send(&mut self, m: Msg) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let msg = m.finish(self.seq);
        // SAFETY: sends `msg.len()` bytes of `msg` to the kernel.
        let r = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self.seq)
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: receives at most `buf.len()` bytes into `buf`.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Sends `m` and collects the replies to it, calling `f(type, body)` for each, until its
    /// acknowledgement (an error, or the end of a dump). Bounded: at most 4096 datagrams, each
    /// waited for at most the socket's timeout.
    fn exchange(&mut self, m: Msg, mut f: impl FnMut(u16, &[u8])) -> io::Result<()> {
        let seq = self.send(m)?;
        let mut buf = vec![0u8; 32768];
        for _ in 0..4096 {
            let n = self.recv(&mut buf)?;
            let mut done = None;
            for_each_msg(&buf[..n], |ty, s, body| {
                if s != seq || done.is_some() {
                    return;
                }
                match ty {
                    t if t == libc::NLMSG_ERROR as u16 => done = Some(error_of(body)),
                    t if t == libc::NLMSG_DONE as u16 => done = Some(0),
                    t => f(t, body),
                }
            });
            match done {
                Some(0) => return Ok(()),
                Some(e) => return Err(io::Error::from_raw_os_error(-e)),
                None => {}
            }
        }
        Err(io::Error::from(io::ErrorKind::TimedOut))
    }

    /// Sends `m` (which asks for an acknowledgement) and waits for it.
    fn request(&mut self, m: Msg) -> io::Result<()> {
        self.exchange(m, |_, _| {})
    }

    /// Moves interface `index` into the network namespace `ns`.
    pub fn move_to(&mut self, index: i32, ns: &File) -> io::Result<()> {
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK);
        m.put(&ifinfomsg(index, 0, 0));
        m.attr(libc::IFLA_NET_NS_FD, &(ns.as_raw_fd() as u32).to_ne_bytes());
        self.request(m)
    }

    /// Renames interface `index` to `name` and sets its MTU (if given); it must be down.
    pub fn rename(&mut self, index: i32, name: &str, mtu: Option<u32>) -> io::Result<()> {
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK);
        m.put(&ifinfomsg(index, 0, 0));
        m.attr(libc::IFLA_IFNAME, &cstr(name));
        if let Some(mtu) = mtu {
            m.attr(libc::IFLA_MTU, &mtu.to_ne_bytes());
        }
        self.request(m)
    }

    /// Brings interface `index` up.
    pub fn up(&mut self, index: i32) -> io::Result<()> {
        let up = libc::IFF_UP as u32;
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK);
        m.put(&ifinfomsg(index, up, up));
        self.request(m)
    }

    /// The MAC address and MTU of interface `index`.
    pub fn link(&mut self, index: i32) -> io::Result<LinkInfo> {
        let mut m = Msg::new(libc::RTM_GETLINK, ACK);
        m.put(&ifinfomsg(index, 0, 0));
        let mut info = LinkInfo::default();
        self.exchange(m, |ty, body| {
            if ty != libc::RTM_NEWLINK || body.len() < 16 {
                return;
            }
            for_each_attr(&body[16..], |t, d| match (t, d.len()) {
                (libc::IFLA_ADDRESS, 6) => {
                    info.mac = Some([d[0], d[1], d[2], d[3], d[4], d[5]]);
                }
                (libc::IFLA_MTU, 4) => info.mtu = Some(u32_at(d, 0)),
                _ => {}
            });
        })?;
        Ok(info)
    }

    /// Gives interface `index` the address `ip/prefix`.
    pub fn add_addr(&mut self, index: i32, ip: IpAddr, prefix: u8) -> io::Result<()> {
        let mut m = Msg::new(libc::RTM_NEWADDR, ACK | CREATE | EXCL);
        let mut ifa = [0u8; 8];
        ifa[0] = family(ip);
        ifa[1] = prefix;
        ifa[4..8].copy_from_slice(&index.to_ne_bytes());
        m.put(&ifa);
        let bytes = octets(ip);
        if ip.is_ipv4() {
            m.attr(libc::IFA_LOCAL, &bytes);
        }
        m.attr(libc::IFA_ADDRESS, &bytes);
        self.request(m)
    }

    /// The addresses of interface `index`, each with its prefix length.
    pub fn addrs(&mut self, index: i32) -> io::Result<Vec<(IpAddr, u8)>> {
        let mut m = Msg::new(libc::RTM_GETADDR, DUMP);
        m.put(&[0u8; 8]);
        let mut out = Vec::new();
        self.exchange(m, |ty, body| {
            if ty != libc::RTM_NEWADDR || body.len() < 8 || u32_at(body, 4) as i32 != index {
                return;
            }
            let prefix = body[1];
            let mut addr = None;
            let mut local = None;
            for_each_attr(&body[8..], |t, d| match t {
                libc::IFA_ADDRESS => addr = ip_of(d),
                libc::IFA_LOCAL => local = ip_of(d),
                _ => {}
            });
            if let Some(ip) = local.or(addr) {
                out.push((ip, prefix));
            }
        })?;
        Ok(out)
    }

    /// Adds a route to `dst/prefix` through interface `index`, by way of `gw` if given (else
    /// the destination is on the link).
    pub fn add_route(
        &mut self,
        index: i32,
        dst: IpAddr,
        prefix: u8,
        gw: Option<IpAddr>,
    ) -> io::Result<()> {
        let mut m = Msg::new(libc::RTM_NEWROUTE, ACK | CREATE | EXCL);
        let scope = match gw {
            Some(_) => libc::RT_SCOPE_UNIVERSE,
            None => libc::RT_SCOPE_LINK,
        };
        m.put(&[
            family(dst),
            prefix,
            0,
            0,
            libc::RT_TABLE_MAIN,
            libc::RTPROT_BOOT,
            scope,
            libc::RTN_UNICAST,
            0,
            0,
            0,
            0,
        ]);
        if prefix > 0 {
            m.attr(libc::RTA_DST, &octets(dst));
        }
        if let Some(gw) = gw {
            m.attr(libc::RTA_GATEWAY, &octets(gw));
        }
        m.attr(libc::RTA_OIF, &(index as u32).to_ne_bytes());
        self.request(m)
    }
}

const ACK: u16 = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
const CREATE: u16 = libc::NLM_F_CREATE as u16;
const EXCL: u16 = libc::NLM_F_EXCL as u16;
const DUMP: u16 = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;

fn family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn ip_of(d: &[u8]) -> Option<IpAddr> {
    match d.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(d).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(d).ok()?)),
        _ => None,
    }
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A netlink message being built: header, fixed part, attributes.
struct Msg(Vec<u8>);

impl Msg {
    fn new(ty: u16, flags: u16) -> Msg {
        let mut b = vec![0u8; 16];
        b[4..6].copy_from_slice(&ty.to_ne_bytes());
        b[6..8].copy_from_slice(&flags.to_ne_bytes());
        Msg(b)
    }

    fn put(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        self.0
            .extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.put(data);
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.0
    }
}

fn ifinfomsg(index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = libc::AF_UNSPEC as u8;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Calls `f(type, seq, body)` for each whole message of `buf`; a malformed length ends it.
fn for_each_msg(buf: &[u8], mut f: impl FnMut(u16, u32, &[u8])) {
    let mut at = 0;
    while at + 16 <= buf.len() {
        let len = u32_at(buf, at) as usize;
        if len < 16 || at + len > buf.len() {
            return;
        }
        f(
            u16_at(buf, at + 4),
            u32_at(buf, at + 8),
            &buf[at + 16..at + len],
        );
        at += (len + 3) & !3;
    }
}

/// Calls `f(type, data)` for each attribute of `buf`.
fn for_each_attr(buf: &[u8], mut f: impl FnMut(u16, &[u8])) {
    let mut at = 0;
    while at + 4 <= buf.len() {
        let len = u16_at(buf, at) as usize;
        if len < 4 || at + len > buf.len() {
            return;
        }
        f(u16_at(buf, at + 2) & 0x3fff, &buf[at + 4..at + len]);
        at += (len + 3) & !3;
    }
}

/// The (negative) errno of an NLMSG_ERROR body; 0 is an acknowledgement.
fn error_of(body: &[u8]) -> i32 {
    if body.len() < 4 {
        return -libc::EPROTO;
    }
    u32_at(body, 0) as i32
}

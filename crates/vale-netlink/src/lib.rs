//! rtnetlink requests over a blocking socket: what valed's EVPN ports (the placeholder
//! devices and FDB entries FRR's zebra reads and writes) and the CNI plugin (a container's
//! link, addresses and routes) say to the kernel, in one place.
//!
//! - [`Socket`]: a `NETLINK_ROUTE` socket of the calling thread's network namespace, bound to
//!   the multicast groups asked for, with a receive timeout. Every wait is bounded: a request
//!   ([`Socket::exchange`], [`Socket::request`]) reads at most [`MAX_DATAGRAMS`] datagrams,
//!   each waited for at most the socket's timeout, so a kernel that never answers (or answers
//!   something else forever) makes it fail with `ETIMEDOUT`/`EAGAIN` rather than hang. A
//!   socket made [`Socket::nonblocking`] never waits (a port's thread polls it between bursts).
//! - [`Msg`]: a message being built (header, fixed part, attributes, nests), and the fixed
//!   parts [`ifinfomsg`], [`ndmsg`], [`ifaddrmsg`], [`rtmsg`].
//! - Reading: [`for_each_msg`] and [`for_each_attr`] walk a datagram and stop at the first
//!   malformed length (a hostile or truncated answer ends the walk, never a panic);
//!   [`error_of`] is the errno of an `NLMSG_ERROR`, kept as the kernel gave it (an
//!   `io::Error` of that errno).
//! - Typed requests the callers share: links moved, renamed, raised, read, deleted;
//!   addresses added and dumped; routes added.
//!
//! It is written by hand over `libc`: the `rtnetlink` family of crates needs an async
//! runtime, which valed's port threads and the CNI plugin do not have, and the few messages
//! here are plain byte layouts. Nothing here is on a data path: it is control path only.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The most datagrams one request reads before it gives up.
pub const MAX_DATAGRAMS: usize = 4096;
/// The buffer one request reads datagrams into.
const REPLY_BUF: usize = 32768;

/// Flags of a request that asks for an acknowledgement.
pub const ACK: u16 = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
/// Flags of a dump.
pub const DUMP: u16 = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
pub const CREATE: u16 = libc::NLM_F_CREATE as u16;
pub const EXCL: u16 = libc::NLM_F_EXCL as u16;
pub const REPLACE: u16 = libc::NLM_F_REPLACE as u16;

/// A netlink message being built: header, fixed part, attributes.
pub struct Msg(Vec<u8>);

impl Msg {
    /// A message of type `ty` with header flags `flags` (its length and sequence number are
    /// set when it is sent).
    pub fn new(ty: u16, flags: u16) -> Msg {
        let mut b = vec![0u8; 16];
        b[4..6].copy_from_slice(&ty.to_ne_bytes());
        b[6..8].copy_from_slice(&flags.to_ne_bytes());
        Msg(b)
    }

    fn align(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    /// Appends `bytes` (a fixed part), padded to 4 bytes.
    pub fn put(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        self.align();
    }

    /// Appends attribute `ty` holding `data`.
    pub fn attr(&mut self, ty: u16, data: &[u8]) {
        self.0
            .extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.put(data);
    }

    /// Appends attribute `ty` holding `s` and its terminating NUL (an interface name).
    pub fn attr_str(&mut self, ty: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.attr(ty, &v);
    }

    /// Opens a nested attribute; [`Msg::end`] closes it.
    pub fn nest(&mut self, ty: u16) -> usize {
        let at = self.0.len();
        self.attr(ty, &[]);
        at
    }

    /// Closes the nested attribute [`Msg::nest`] opened at `at`.
    pub fn end(&mut self, at: usize) {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// The message's bytes, numbered `seq`.
    pub fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.0
    }
}

/// `struct ifinfomsg`: a link.
pub fn ifinfomsg(family: u8, index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = family;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// `struct ndmsg`: a neighbour (an FDB entry for `AF_BRIDGE`).
pub fn ndmsg(family: u8, ifindex: i32, state: u16, flags: u8) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0] = family;
    b[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    b[8..10].copy_from_slice(&state.to_ne_bytes());
    b[10] = flags;
    b
}

/// `struct ifaddrmsg`: an address.
pub fn ifaddrmsg(family: u8, prefix: u8, index: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = family;
    b[1] = prefix;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b
}

/// `struct rtmsg`: a route of the main table.
pub fn rtmsg(family: u8, dst_len: u8, protocol: u8, scope: u8, kind: u8) -> [u8; 12] {
    [
        family,
        dst_len,
        0,
        0,
        libc::RT_TABLE_MAIN,
        protocol,
        scope,
        kind,
        0,
        0,
        0,
        0,
    ]
}

pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Calls `f(type, seq, body)` for each whole message of `buf`; a malformed length ends it.
pub fn for_each_msg(buf: &[u8], mut f: impl FnMut(u16, u32, &[u8])) {
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

/// Calls `f(type, data)` for each attribute of `buf` (the type without its nested and
/// byte-order flags); a malformed length ends it.
pub fn for_each_attr(buf: &[u8], mut f: impl FnMut(u16, &[u8])) {
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
pub fn error_of(body: &[u8]) -> i32 {
    if body.len() < 4 {
        return -libc::EPROTO;
    }
    u32_at(body, 0) as i32
}

/// The address family of `ip`.
pub fn family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// The bytes of `ip` as an attribute holds them.
pub fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The address an attribute of 4 or 16 bytes holds.
pub fn ip_of(d: &[u8]) -> Option<IpAddr> {
    match d.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(d).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(d).ok()?)),
        _ => None,
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// The index of interface `name` in the calling thread's namespace.
pub fn index_of(name: &str) -> io::Result<i32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i as i32),
    }
}

/// What [`Socket::link`] reports of an interface.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LinkInfo {
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
}

/// A NETLINK_ROUTE socket of the calling thread's namespace.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    /// Bound to multicast `groups` (a bit per group, 0 for none); blocking, each receive
    /// waiting at most `timeout`.
    pub fn open(groups: u32, timeout: Duration) -> io::Result<Socket> {
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
        // SAFETY: all-zero is a valid sockaddr_nl; the family and groups are then set.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = groups;
        // SAFETY: a sockaddr_nl of its size.
        if unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
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

    /// Asks for a receive buffer of `bytes`, best effort: beyond `rmem_max` only with
    /// CAP_NET_ADMIN (FORCE); else as much as `rmem_max` allows.
    pub fn receive_buffer(&self, bytes: usize) {
        let big = bytes.min(libc::c_int::MAX as usize) as libc::c_int;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            // SAFETY: an option of its size on our socket.
            if unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &big as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as u32,
                )
            } == 0
            {
                break;
            }
        }
    }

    /// Makes every receive return at once (`WouldBlock` when nothing waits).
    pub fn nonblocking(&self) -> io::Result<()> {
        // SAFETY: fcntl on our own descriptor.
        let r = unsafe {
            let fl = libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(self.fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `m` under the next sequence number, which it returns. Never waits.
    pub fn send(&mut self, m: Msg) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let msg = m.finish(self.seq);
        // SAFETY: sends `msg.len()` bytes of `msg` to the kernel (the unbound destination).
        let r = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self.seq)
    }

    /// One datagram into `buf` (waiting up to the timeout if `wait` and the socket blocks).
    pub fn recv(&self, buf: &mut [u8], wait: bool) -> io::Result<usize> {
        let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
        loop {
            // SAFETY: receives at most `buf.len()` bytes into `buf`.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    flags,
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
    /// acknowledgement (an error, or the end of a dump); replies to other requests are
    /// skipped. Bounded: at most [`MAX_DATAGRAMS`] datagrams, each waited for at most the
    /// socket's timeout; past them `ETIMEDOUT`.
    pub fn exchange(&mut self, m: Msg, mut f: impl FnMut(u16, &[u8])) -> io::Result<()> {
        let seq = self.send(m)?;
        let mut buf = vec![0u8; REPLY_BUF];
        for _ in 0..MAX_DATAGRAMS {
            let n = self.recv(&mut buf, true)?;
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
    pub fn request(&mut self, m: Msg) -> io::Result<()> {
        self.exchange(m, |_, _| {})
    }

    /// Moves interface `index` into the network namespace `ns`.
    pub fn move_to(&mut self, index: i32, ns: &File) -> io::Result<()> {
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK);
        m.put(&ifinfomsg(libc::AF_UNSPEC as u8, index, 0, 0));
        m.attr(libc::IFLA_NET_NS_FD, &(ns.as_raw_fd() as u32).to_ne_bytes());
        self.request(m)
    }

    /// Renames interface `index` to `name` and sets its MTU (if given); it must be down.
    pub fn rename(&mut self, index: i32, name: &str, mtu: Option<u32>) -> io::Result<()> {
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK);
        m.put(&ifinfomsg(libc::AF_UNSPEC as u8, index, 0, 0));
        m.attr_str(libc::IFLA_IFNAME, name);
        if let Some(mtu) = mtu {
            m.attr(libc::IFLA_MTU, &mtu.to_ne_bytes());
        }
        self.request(m)
    }

    /// Brings interface `index` up.
    pub fn up(&mut self, index: i32) -> io::Result<()> {
        let up = libc::IFF_UP as u32;
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK);
        m.put(&ifinfomsg(libc::AF_UNSPEC as u8, index, up, up));
        self.request(m)
    }

    /// Deletes interface `name`.
    pub fn delete_link(&mut self, name: &str) -> io::Result<()> {
        let mut m = Msg::new(libc::RTM_DELLINK, ACK);
        m.put(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(libc::IFLA_IFNAME, name);
        self.request(m)
    }

    /// The MAC address and MTU of interface `index`.
    pub fn link(&mut self, index: i32) -> io::Result<LinkInfo> {
        let mut m = Msg::new(libc::RTM_GETLINK, ACK);
        m.put(&ifinfomsg(libc::AF_UNSPEC as u8, index, 0, 0));
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
        m.put(&ifaddrmsg(family(ip), prefix, index));
        let bytes = ip_bytes(ip);
        if ip.is_ipv4() {
            m.attr(libc::IFA_LOCAL, &bytes);
        }
        m.attr(libc::IFA_ADDRESS, &bytes);
        self.request(m)
    }

    /// The addresses of interface `index`, each with its prefix length.
    pub fn addrs(&mut self, index: i32) -> io::Result<Vec<(IpAddr, u8)>> {
        let mut m = Msg::new(libc::RTM_GETADDR, DUMP);
        m.put(&ifaddrmsg(libc::AF_UNSPEC as u8, 0, 0));
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
        m.put(&rtmsg(
            family(dst),
            prefix,
            libc::RTPROT_BOOT,
            scope,
            libc::RTN_UNICAST,
        ));
        if prefix > 0 {
            m.attr(libc::RTA_DST, &ip_bytes(dst));
        }
        if let Some(gw) = gw {
            m.attr(libc::RTA_GATEWAY, &ip_bytes(gw));
        }
        m.attr(libc::RTA_OIF, &(index as u32).to_ne_bytes());
        self.request(m)
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn messages_and_attributes_walk_and_stop_at_bad_lengths() {
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK);
        m.put(&ifinfomsg(libc::AF_UNSPEC as u8, 3, 0, 0));
        m.attr_str(libc::IFLA_IFNAME, "eth0");
        let nest = m.nest(libc::IFLA_LINKINFO);
        m.attr(libc::IFLA_INFO_KIND, b"vxlan");
        m.end(nest);
        m.attr(libc::IFLA_MTU, &1400u32.to_ne_bytes());
        let mut buf = m.finish(9);
        assert_eq!(buf.len() % 4, 0);
        // A second message whose length runs past the end is ignored, as is a short tail.
        buf.extend([200, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
        let mut msgs = Vec::new();
        for_each_msg(&buf, |ty, seq, body| {
            let mut attrs = Vec::new();
            for_each_attr(&body[16..], |t, d| attrs.push((t, d.to_vec())));
            msgs.push((ty, seq, u32_at(body, 4), attrs));
        });
        assert_eq!(msgs.len(), 1);
        let (ty, seq, index, attrs) = &msgs[0];
        assert_eq!((*ty, *seq, *index), (libc::RTM_NEWLINK, 9, 3));
        assert_eq!(
            attrs.iter().map(|(t, d)| (*t, d.len())).collect::<Vec<_>>(),
            vec![
                (libc::IFLA_IFNAME, 5),
                (libc::IFLA_LINKINFO, 12),
                (libc::IFLA_MTU, 4)
            ]
        );
        // An attribute claiming more than is there ends the walk.
        let mut n = 0;
        for_each_attr(&[8, 0, 1, 0, 0, 0, 0, 0, 40, 0, 2, 0, 0], |_, _| n += 1);
        assert_eq!(n, 1);
        // A zero length never loops.
        for_each_msg(&[0u8; 64], |_, _, _| panic!("no message"));
        for_each_attr(&[0u8; 64], |_, _| panic!("no attribute"));
    }

    #[test]
    fn errors_keep_their_errno() {
        assert_eq!(error_of(&(-libc::EEXIST).to_ne_bytes()), -libc::EEXIST);
        assert_eq!(error_of(&[0, 0, 0, 0]), 0);
        assert_eq!(error_of(&[1]), -libc::EPROTO);
        assert_eq!(mac_text(&[2, 0, 0xab, 0, 0, 9]), "02:00:ab:00:00:09");
        assert_eq!(ip_of(&[192, 0, 2, 1]), Some("192.0.2.1".parse().unwrap()));
        assert_eq!(ip_of(&[1, 2, 3]), None);
        // The kernel's own refusal: no interface of that index.
        let mut s = Socket::open(0, Duration::from_secs(2)).unwrap();
        let e = s.link(i32::MAX).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
        assert_eq!(
            index_of("vale-no-such").unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
    }

    #[test]
    fn a_request_the_kernel_never_answers_fails_within_the_timeout() {
        let mut s = Socket::open(0, Duration::from_millis(200)).unwrap();
        // NLMSG_NOOP is acknowledged only when asked to be.
        s.request(Msg::new(libc::NLMSG_NOOP as u16, ACK)).unwrap();
        let t = Instant::now();
        let e = s
            .request(Msg::new(
                libc::NLMSG_NOOP as u16,
                libc::NLM_F_REQUEST as u16,
            ))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        // A non-blocking socket never waits.
        s.nonblocking().unwrap();
        let mut buf = [0u8; 64];
        let e = s.recv(&mut buf, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}

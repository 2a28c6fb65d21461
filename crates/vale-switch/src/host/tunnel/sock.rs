//! The underlay: one kernel UDP socket per tunnel port, bound to its local address and port,
//! set never to fragment (a frame too big for the path is refused with EMSGSIZE, and counted),
//! with the UDP checksum on, over IPv4 too (as Linux's vxlan device sends today; the kernel
//! refuses `UDP_SEGMENT` on a socket without it, and leaves it to the device where it can),
//! and a receive buffer of 16 MiB.
//!
//! # Several VNIs on one address and port
//!
//! Every VTEP sends all its VNIs to one UDP port (4789), so ports of several VNIs must share
//! `local`:`dstport`. Each port keeps a socket of its own (its thread reads it alone: nothing
//! is handed between threads), bound with `SO_REUSEPORT`, so that the sockets of one address
//! and port form one kernel reuseport group; a classic BPF program attached to the group
//! (`SO_ATTACH_REUSEPORT_CBPF`) picks, for each packet, the socket of the packet's VNI.
//! What the kernel does (`net/core/sock_reuseport.c`, `net/ipv4/udp.c`), and what this module
//! builds on:
//!
//! - The group is an array of sockets in the order they were bound (`__reuseport_add_sock`
//!   appends). A socket that leaves (closed: `udp_lib_unhash` → `reuseport_detach_sock`) is
//!   replaced by the last one (`socks[i] = socks[num_socks - 1]`), as [`Vec::swap_remove`].
//! - The program runs on each packet with the data pointer advanced past the UDP header
//!   (`run_bpf_filter`, `hdr_len` = `sizeof(struct udphdr)`): offset 0 is the UDP payload, so
//!   the VNI is the 24 bits at bytes 4 to 6, for VXLAN and Geneve alike. It returns an index
//!   into the array; an index past its end falls back to the hash selection. A packet shorter
//!   than the load aborts the program, which returns 0.
//! - One program per group: attaching one through any member replaces the group's.
//!
//! So valed keeps a registry ([`GROUPS`], one lock taken when a port opens or closes, never per
//! packet) of its groups keyed by address and port, each the VNIs of its sockets in the
//! kernel's order, and attaches a new program ([`program`]: a binary search over the VNIs) on
//! every change. A VNI no port has is steered to index 0, whose port counts it as `wrong-vni`;
//! so is a packet too short to hold a VNI (as `bad-header`). While a port closes, the kernel
//! moves the group's last socket to its place before the new program is attached: that port
//! loses what arrives in those microseconds (counted as `wrong-vni` where it lands).
//!
//! Refused as busy: a second port of one VNI on one address and port; a vxlan and a geneve
//! port on one address and port; a port on the wildcard address beside one on a specific
//! address of the same port (a packet would reach one group only); more than [`MAX_VNIS`]
//! ports; an address and port held by a socket without `SO_REUSEPORT` (another program,
//! Linux's vxlan device, or the placeholder vxlan device of an EVPN port, which listens on the
//! wildcard address at its port's `dstport + 1`). The kernel lets any socket of the same user
//! with `SO_REUSEPORT` join a group: a second valed (or another program of root's) on the same
//! address and port in the same network namespace would upset the order, and is not supported.

use std::collections::BTreeMap;
use std::io;
use std::mem::{size_of, ManuallyDrop};
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

use super::super::Error;
use super::wire::Proto;

/// Socket buffers asked for: a few thousand frames of headroom while the port's thread is away.
const SOCK_BUF: libc::c_int = 4 << 20;
/// Most ports (VNIs) on one address and port: their program is at most about 1,300
/// instructions, within the kernel's limits (4,096 instructions, and `net.core.optmem_max`,
/// 20 KiB before Linux 6.9, for the program translated to eBPF).
pub const MAX_VNIS: usize = 512;
/// `SO_ATTACH_REUSEPORT_CBPF` (asm-generic/socket.h; libc lacks it).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
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

/// The ports of one address and port: their protocol, and their VNIs and sockets in the order
/// of the kernel's reuseport group.
struct Group {
    proto: Proto,
    members: Vec<(u32, RawFd)>,
}

impl Group {
    fn vnis(&self) -> Vec<u32> {
        self.members.iter().map(|(v, _)| *v).collect()
    }

    /// Why a `proto` port of `vni` cannot join (a message for [`Error::Busy`]).
    fn refuses(&self, proto: Proto, vni: u32, local: SocketAddr) -> Option<String> {
        let kind = proto.name();
        if self.proto != proto {
            Some(format!(
                "{kind}: UDP {local} carries {} ports, and one address and port carries one \
                 protocol: use another local address or dstport",
                self.proto.name()
            ))
        } else if self.members.iter().any(|(v, _)| *v == vni) {
            Some(format!(
                "{kind}: VNI {vni} has a port on UDP {local} already: use another local \
                 address or dstport"
            ))
        } else if self.members.len() >= MAX_VNIS {
            Some(format!(
                "{kind}: UDP {local} carries {MAX_VNIS} VNIs, the most one address and port \
                 take: use another local address or dstport"
            ))
        } else {
            None
        }
    }

    /// The socket of `vni` has left the kernel's group: the last one took its place.
    fn leave(&mut self, vni: u32) {
        if let Some(i) = self.members.iter().position(|(v, _)| *v == vni) {
            self.members.swap_remove(i);
        }
    }

    /// Attaches the group's program through one of its sockets.
    fn attach(&self) -> io::Result<()> {
        let Some((_, fd)) = self.members.first() else {
            return Ok(());
        };
        let mut prog = program(&self.vnis());
        let fprog = libc::sock_fprog {
            len: prog.len() as libc::c_ushort,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: a sock_fprog naming `prog`, alive for the call (the kernel copies it); `fd`
        // is a socket of the group, open while it is in the registry (its `Sock` leaves the
        // registry, under the lock, before anything else can close it).
        let r = unsafe {
            libc::setsockopt(
                *fd,
                libc::SOL_SOCKET,
                SO_ATTACH_REUSEPORT_CBPF,
                &fprog as *const libc::sock_fprog as *const libc::c_void,
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// valed's reuseport groups, by address and port (see the module's docs).
static GROUPS: Mutex<BTreeMap<SocketAddr, Group>> = Mutex::new(BTreeMap::new());

fn groups() -> MutexGuard<'static, BTreeMap<SocketAddr, Group>> {
    GROUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Leaves of the search: up to this many VNIs compared in a row.
const LEAF: usize = 8;

fn insn(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The classic BPF program that steers a packet of VNI `vnis[i]` to socket `i` of the group:
/// the VNI loaded from bytes 4 to 6 of the UDP payload, then a binary search over the sorted
/// VNIs (a `jge` and a `ja` per branch, since `jt`/`jf` reach 255 instructions only) down to
/// leaves of up to [`LEAF`] `jeq`s. Any other VNI returns 0.
pub fn program(vnis: &[u32]) -> Vec<libc::sock_filter> {
    let mut sorted: Vec<(u32, u32)> = vnis.iter().zip(0u32..).map(|(v, i)| (*v, i)).collect();
    sorted.sort_unstable();
    let mut p = vec![
        // A = the 32 bits at bytes 4..8 (network order), the VNI and a reserved byte.
        insn(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 4),
        insn(libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K, 0, 0, 8),
    ];
    search(&sorted, &mut p);
    p
}

fn search(e: &[(u32, u32)], p: &mut Vec<libc::sock_filter>) {
    let ret = |k| insn(libc::BPF_RET | libc::BPF_K, 0, 0, k);
    if e.len() <= LEAF {
        for &(vni, i) in e {
            p.push(insn(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, vni));
            p.push(ret(i));
        }
        p.push(ret(0));
        return;
    }
    let (lo, hi) = e.split_at(e.len() / 2);
    // A >= the first VNI of the upper half: on to the `ja` over the lower half; else past it.
    p.push(insn(
        libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
        0,
        1,
        hi[0].0,
    ));
    let ja = p.len();
    p.push(insn(libc::BPF_JMP | libc::BPF_JA, 0, 0, 0));
    search(lo, p);
    p[ja].k = (p.len() - ja - 1) as u32;
    search(hi, p);
}

/// A tunnel port's socket: one of its address and port's reuseport group, which it leaves
/// when dropped.
pub struct Sock {
    fd: ManuallyDrop<OwnedFd>,
    local: SocketAddr,
    vni: u32,
}

impl Deref for Sock {
    type Target = OwnedFd;

    fn deref(&self) -> &OwnedFd {
        &self.fd
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        let mut groups = groups();
        // SAFETY: the descriptor is dropped here once and never used after. Closing it under
        // the registry's lock takes the socket out of the kernel's group (the last socket
        // moving to its place) before the registry is changed to match.
        unsafe { ManuallyDrop::drop(&mut self.fd) };
        let Some(g) = groups.get_mut(&self.local) else {
            return;
        };
        g.leave(self.vni);
        if g.members.is_empty() {
            groups.remove(&self.local);
        } else if let Err(e) = g.attach() {
            // Unlikely (the program is smaller than the one attached before); packets of
            // the moved socket's VNI would land elsewhere, counted as wrong-vni.
            tracing::error!(
                %self.local,
                "cannot attach the VNI program of the tunnel ports on UDP {}: {e}",
                self.local
            );
        }
    }
}

/// The UDP socket (non-blocking) of a tunnel port `proto` of VNI `vni` on `local`, in the
/// reuseport group of the tunnel ports of `local`.
pub fn open(proto: Proto, vni: u32, local: SocketAddr) -> Result<Sock, Error> {
    let kind = proto.name();
    let mut groups = groups();
    if let Some(m) = groups
        .get(&local)
        .and_then(|g| g.refuses(proto, vni, local))
    {
        return Err(Error::busy(m));
    }
    // A wildcard address and a specific one of the same port would make two groups, the
    // specific one taking every packet for its address.
    if let Some(other) = groups.keys().find(|a| {
        a.port() == local.port()
            && a.is_ipv4() == local.is_ipv4()
            && a.ip() != local.ip()
            && (a.ip().is_unspecified() || local.ip().is_unspecified())
    }) {
        return Err(Error::busy(format!(
            "{kind}: UDP {local} overlaps the tunnel ports on UDP {other}: use another local \
             address or dstport"
        )));
    }
    let fd = socket(kind, local)?;
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
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            return Err(Error::busy(format!(
                "{kind}: UDP {local} is taken by a socket that does not share it (another \
                 program, a Linux vxlan device, or the placeholder vxlan device of an EVPN \
                 port, which takes the port's dstport + 1): use another local address or \
                 dstport"
            )));
        }
        return Err(Error::of_io(
            format!("{kind}: cannot bind the UDP socket to {local}: {e}"),
            e,
        ));
    }
    let g = groups.entry(local).or_insert(Group {
        proto,
        members: Vec::new(),
    });
    g.members.push((vni, fd.as_raw_fd()));
    if let Err(e) = g.attach() {
        g.members.pop();
        if g.members.is_empty() {
            groups.remove(&local);
        }
        // Dropping `fd` takes the socket, the group's last, out of the group: the order of
        // the others is unchanged, and so is their program.
        return Err(Error::of_io(
            format!(
                "{kind}: cannot attach the VNI program to the UDP sockets on {local} \
                 (net.core.optmem_max too small?): {e}"
            ),
            e,
        ));
    }
    Ok(Sock {
        fd: ManuallyDrop::new(fd),
        local,
        vni,
    })
}

/// A UDP socket for `local` (non-blocking, unbound), its options set.
fn socket(kind: &str, local: SocketAddr) -> Result<OwnedFd, Error> {
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
            e,
        ));
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let opt = |level, name, val, what: &str| {
        setopt(&fd, level, name, val).map_err(|e| {
            Error::of_io(
                format!("{kind}: cannot set {what} on the UDP socket: {e}"),
                e,
            )
        })
    };
    opt(libc::SOL_SOCKET, libc::SO_REUSEPORT, 1, "SO_REUSEPORT")?;
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
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    /// Runs the classic BPF `prog` (the instructions [`program`] emits) on UDP payload `p`,
    /// as the kernel does: a load past the end returns 0.
    fn run(prog: &[libc::sock_filter], p: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = prog[pc];
            let code = i.code as u32;
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let k = i.k as usize;
                    match p.get(k..k + 4) {
                        Some(b) => a = u32::from_be_bytes(b.try_into().unwrap()),
                        None => return 0,
                    }
                }
                c if c == libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K => a >>= i.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += i.k as usize,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += if a == i.k { i.jt } else { i.jf } as usize
                }
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => {
                    pc += if a >= i.k { i.jt } else { i.jf } as usize
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                c => panic!("unexpected instruction {c:#x}"),
            }
        }
    }

    fn packet(proto: Proto, vni: u32) -> Vec<u8> {
        let mut p = proto.header(vni).to_vec();
        p.extend_from_slice(&[0xee; 60]);
        p
    }

    #[test]
    fn the_program_steers_each_vni_to_its_index_and_the_rest_to_0() {
        // Spread and clustered VNIs, in no order, up to the most a group takes.
        let mut x = 0x2545_f491u32;
        let mut vnis: Vec<u32> = Vec::new();
        while vnis.len() < MAX_VNIS {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = if vnis.len().is_multiple_of(3) {
                x & 0xff_ffff
            } else {
                1000 + x % 2000
            };
            if !vnis.contains(&v) {
                vnis.push(v);
            }
        }
        vnis[7] = 0;
        vnis[8] = 0xff_ffff;
        for n in [1, 2, 3, 8, 9, 17, 100, 300, MAX_VNIS] {
            let prog = program(&vnis[..n]);
            assert!(prog.len() <= 1300, "{n} VNIs: {} instructions", prog.len());
            for (i, v) in vnis[..n].iter().enumerate() {
                for proto in [Proto::Vxlan, Proto::Geneve] {
                    assert_eq!(run(&prog, &packet(proto, *v)), i as u32, "{n} VNIs: {v}");
                }
            }
            for stranger in [1, 999, 3001, 0xfe_dcba] {
                if !vnis[..n].contains(&stranger) {
                    assert_eq!(run(&prog, &packet(Proto::Vxlan, stranger)), 0);
                }
            }
            assert_eq!(run(&prog, &[8, 0, 0, 0, 0, 0, 42]), 0, "too short");
        }
    }

    #[test]
    fn leaving_moves_the_last_to_the_gap_as_the_kernel_does() {
        let mut g = Group {
            proto: Proto::Vxlan,
            members: [42, 43, 44, 45].iter().map(|v| (*v, 0)).collect(),
        };
        g.leave(43);
        assert_eq!(g.vnis(), [42, 45, 44]);
        g.leave(44);
        assert_eq!(g.vnis(), [42, 45]);
        g.members.push((43, 0));
        g.leave(42);
        assert_eq!(g.vnis(), [43, 45]);
        g.leave(7);
        assert_eq!(g.vnis(), [43, 45]);
    }

    /// A loopback port free now.
    fn free_port() -> u16 {
        UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// The VNI of the packet `s` receives within a second, if any.
    fn got(s: &Sock) -> Option<u32> {
        let mut b = [0u8; 128];
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            // SAFETY: a buffer of its length.
            let n = unsafe {
                libc::recv(
                    s.as_raw_fd(),
                    b.as_mut_ptr() as *mut libc::c_void,
                    b.len(),
                    0,
                )
            };
            if n >= 8 {
                return Some(u32::from_be_bytes([0, b[4], b[5], b[6]]));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Each socket of the group receives the packets of its VNI, before and after one leaves
    /// (the kernel's order mirrored), and a stranger VNI reaches one of them.
    #[test]
    fn the_kernel_steers_by_vni_as_the_group_changes() {
        let local: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let send = |vni| {
            tx.send_to(&packet(Proto::Vxlan, vni), local).unwrap();
        };
        let mut socks: Vec<Option<Sock>> = [10, 11, 12, 13]
            .iter()
            .map(|v| Some(open(Proto::Vxlan, *v, local).unwrap()))
            .collect();
        let check = |socks: &[Option<Sock>]| {
            for (i, s) in socks.iter().enumerate() {
                if let Some(s) = s {
                    let vni = 10 + i as u32;
                    for _ in 0..3 {
                        send(vni);
                        assert_eq!(got(s), Some(vni), "VNI {vni}");
                    }
                }
            }
        };
        check(&socks);
        // VNI 10 is first: the last (13) takes its place.
        socks[0] = None;
        check(&socks);
        send(99);
        let stranger = socks
            .iter()
            .flatten()
            .filter(|s| got(s) == Some(99))
            .count();
        assert_eq!(stranger, 1, "a stranger VNI lands on one socket");
        socks[2] = None;
        socks[0] = Some(open(Proto::Vxlan, 10, local).unwrap());
        check(&socks);
        // Refusals.
        let busy = |r: Result<Sock, Error>, what: &str| match r {
            Err(Error {
                kind: crate::ErrorKind::Busy,
                message: m,
                ..
            }) => assert!(m.contains(what), "{m}"),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("not refused: {what}"),
        };
        busy(open(Proto::Vxlan, 11, local), "VNI 11 has a port");
        busy(open(Proto::Geneve, 12, local), "carries vxlan ports");
        let any = SocketAddr::new("0.0.0.0".parse().unwrap(), local.port());
        busy(open(Proto::Vxlan, 12, any), "overlaps");
        // A socket that does not share its port.
        let other = UdpSocket::bind("127.0.0.1:0").unwrap();
        busy(
            open(Proto::Vxlan, 5, other.local_addr().unwrap()),
            "is taken by a socket that does not share it",
        );
        drop(socks);
        assert!(
            groups().get(&local).is_none(),
            "the group goes with its last port"
        );
        // The kernel takes the program of the most VNIs a group has.
        let fd = socket("vxlan", local).unwrap();
        let (ss, len) = sockaddr(local);
        // SAFETY: a socket address of `len` bytes.
        let r = unsafe { libc::bind(fd.as_raw_fd(), &ss as *const _ as *const _, len) };
        assert_eq!(r, 0, "bind: {}", io::Error::last_os_error());
        let big = Group {
            proto: Proto::Vxlan,
            members: (0..MAX_VNIS as u32)
                .map(|v| (v * 7, fd.as_raw_fd()))
                .collect(),
        };
        big.attach().expect("the largest program attached");
    }
}

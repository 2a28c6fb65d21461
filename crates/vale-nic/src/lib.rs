//! Frames to and from a Linux network interface, for valed's NIC ports.
//!
//! [`Nic::open`] binds an interface through AF_XDP (native driver mode or generic mode) or,
//! where XDP cannot bind, an AF_PACKET socket with TPACKET rings. The caller polls
//! [`Nic::poll_fds`] for readability, takes frames with [`Nic::recv`] and queues frames with
//! [`Nic::send`], then [`Nic::flush`]es once per batch. Dropping the `Nic` gives the interface
//! back to the kernel.
//!
//! # When the interface goes away
//!
//! [`recv`](Nic::recv), [`send`](Nic::send), [`flush`](Nic::flush) and [`check`](Nic::check)
//! fail with [`io::ErrorKind::NetworkDown`] when the interface is down or no longer exists
//! ([`is_port_down`] tests for it); the message says which. Once the interface is gone every
//! call fails that way and the `Nic` should be dropped; a down interface may come back.
//! AF_XDP sockets do not report a vanished device through poll, so a caller that only polls
//! must also call `recv` or `check` on a timer: an empty `recv` checks the interface at most
//! every 100 ms (one syscall), and `check` does it at once.
//!
//! # Port behaviour
//!
//! Every mode puts the interface into promiscuous mode through a packet-socket membership,
//! which the kernel undoes when the `Nic` (or the process) goes away; the interface's
//! configuration (up/down, addresses, MTU) is never changed.
//!
//! - AF_XDP (`xdp`, `xdp-generic`): a tiny XDP program redirects every rx queue to its own
//!   AF_XDP socket (copy mode, own UMEM of 2048- or 4096-byte chunks); frames the sockets
//!   do not take go on to the kernel stack. The program is attached through a bpf link, so it
//!   leaves the interface when the `Nic` is dropped or the process dies. Frames are sent
//!   through the socket of queue 0. MTUs beyond one 4096-byte chunk are refused.
//! - AF_PACKET (`packet`): TPACKET_V2 rx and tx rings, qdisc bypass on tx, frames the host
//!   itself sends out are ignored, VLAN tags the kernel moved out of band are put back.
//!
//! # Limits
//!
//! Frames larger than the port's buffers (GSO/GRO aggregates from a peer stack with
//! offloads on) do not arrive: AF_PACKET counts them in [`NicStats::rx_bad`], AF_XDP drops
//! them in the kernel ([`NicStats::kernel_drops`]). No multi-buffer XDP and no zero-copy.

use std::cell::Cell;
use std::fmt;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::time::{Duration, Instant};

mod bpf;
mod ifinfo;
mod packet;
mod sys;
mod xdp;

pub use ifinfo::index_of;

/// How a NIC port reaches its interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// AF_XDP with the driver's own XDP support.
    Xdp,
    /// AF_XDP with the kernel's generic (SKB) XDP.
    XdpGeneric,
    /// AF_PACKET with TPACKET rings.
    Packet,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Xdp => "xdp",
            Mode::XdpGeneric => "xdp-generic",
            Mode::Packet => "packet",
        }
    }

    pub fn parse(s: &str) -> Result<Mode, UnknownMode> {
        match s {
            "xdp" => Ok(Mode::Xdp),
            "xdp-generic" => Ok(Mode::XdpGeneric),
            "packet" => Ok(Mode::Packet),
            _ => Err(UnknownMode(s.to_string())),
        }
    }
}

/// A mode name that is none of [`Mode`]'s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode '{0}' (known: xdp, xdp-generic, packet)")]
pub struct UnknownMode(pub String);

impl std::str::FromStr for Mode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Mode, UnknownMode> {
        Mode::parse(s)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counters of a [`Nic`]. The kernel-side drop counts are read when [`Nic::stats`] is called.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames `send` refused as too long (or too short) for the port.
    pub tx_refused: u64,
    /// Received descriptors that pointed outside their buffer (AF_XDP), or frames cut short
    /// because they did not fit a ring slot (AF_PACKET); none reached the caller.
    pub rx_bad: u64,
    /// Frames the kernel dropped on the way to us (ring full, no free buffer, bad descriptor).
    pub kernel_drops: u64,
}

enum Io {
    Xdp(xdp::XdpPort),
    Packet(packet::PacketPort),
}

/// An interface bound for frame I/O.
pub struct Nic {
    name: String,
    ifindex: u32,
    mode: Mode,
    mtu: u32,
    max_frame: usize,
    io: Io,
    gone: bool,
    last_check: Instant,
    stats: NicStats,
    packet_drops: Cell<u64>,
    /// Holds the promiscuous membership (AF_XDP modes; AF_PACKET uses its own socket).
    _promisc: Option<OwnedFd>,
}

/// How often an empty `recv` asks the kernel whether the interface is still there.
const CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// True for the error [`Nic`] returns when its interface is down or gone.
pub fn is_port_down(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NetworkDown
}

/// Adds the interface and the failed step to an error, keeping its kind.
fn context(name: &str, what: impl fmt::Display, e: io::Error) -> io::Error {
    // By kind: inner steps have already wrapped the OS error with their own context.
    let hint = match e.kind() {
        io::ErrorKind::PermissionDenied => {
            " (needs CAP_NET_ADMIN, CAP_NET_RAW and, for XDP, CAP_BPF or CAP_SYS_ADMIN)"
        }
        io::ErrorKind::ResourceBusy | io::ErrorKind::AlreadyExists => {
            " (another XDP program is attached to the interface)"
        }
        _ => "",
    };
    io::Error::new(e.kind(), format!("interface '{name}': {what}: {e}{hint}"))
}

impl Nic {
    /// Binds interface `ifname`. `mode` None tries native XDP, then generic XDP, then
    /// AF_PACKET, and logs why each one that failed did.
    ///
    /// Errors: NotFound when the interface does not exist, PermissionDenied without the
    /// capabilities, otherwise the kind of the step that failed; the message names the
    /// interface and the step.
    pub fn open(ifname: &str, mode: Option<Mode>) -> io::Result<Nic> {
        let ifindex = ifinfo::index_of(ifname)?;
        let mtu = ifinfo::mtu(ifname).map_err(|e| context(ifname, "reading the MTU", e))?;
        match ifinfo::flags(ifname) {
            Ok(fl) if fl & libc::IFF_UP as u32 == 0 => tracing::warn!(
                "interface '{ifname}' is down; frames will flow once it is brought up"
            ),
            Ok(fl) if fl & libc::IFF_RUNNING as u32 == 0 => {
                tracing::warn!("interface '{ifname}' is up but has no carrier")
            }
            _ => {}
        }
        let modes: &[Mode] = match &mode {
            Some(m) => std::slice::from_ref(m),
            None => &[Mode::Xdp, Mode::XdpGeneric, Mode::Packet],
        };
        let mut failures = Vec::new();
        for &m in modes {
            match Nic::open_mode(ifname, ifindex, mtu, m) {
                Ok(nic) => {
                    tracing::info!(
                        "interface '{ifname}' (ifindex {ifindex}, mtu {mtu}) bound in {m} mode, {} queue(s)",
                        nic.queues()
                    );
                    return Ok(nic);
                }
                Err(e) => {
                    if mode.is_none() {
                        tracing::warn!("{m} mode unavailable: {e}");
                    }
                    failures.push(e);
                }
            }
        }
        let last = failures.pop().expect("at least one mode was tried");
        if failures.is_empty() {
            return Err(last);
        }
        let mut msg = String::new();
        for e in &failures {
            msg.push_str(&format!("{e}; "));
        }
        Err(io::Error::new(last.kind(), format!("{msg}{last}")))
    }

    fn open_mode(name: &str, ifindex: u32, mtu: u32, mode: Mode) -> io::Result<Nic> {
        let (io, promisc) = match mode {
            Mode::Xdp | Mode::XdpGeneric => {
                let queues = ifinfo::rx_queues(name, ifindex);
                let port = xdp::XdpPort::open(ifindex, queues, mtu, mode == Mode::Xdp)
                    .map_err(|e| context(name, mode, e))?;
                (Io::Xdp(port), Nic::promisc_socket(name, ifindex))
            }
            Mode::Packet => {
                let port =
                    packet::PacketPort::open(ifindex, mtu).map_err(|e| context(name, mode, e))?;
                (Io::Packet(port), None)
            }
        };
        let max_frame = match &io {
            Io::Xdp(x) => x.max_frame(),
            Io::Packet(p) => p.max_frame(),
        };
        Ok(Nic {
            name: name.to_string(),
            ifindex,
            mode,
            mtu,
            max_frame,
            io,
            gone: false,
            last_check: Instant::now(),
            stats: NicStats::default(),
            packet_drops: Cell::new(0),
            _promisc: promisc,
        })
    }

    /// A packet socket that receives nothing and only holds the interface in promiscuous mode.
    fn promisc_socket(name: &str, ifindex: u32) -> Option<OwnedFd> {
        let r = sys::socket(libc::AF_PACKET, libc::SOCK_RAW, 0).and_then(|fd| {
            use std::os::fd::AsRawFd;
            packet::promisc(fd.as_raw_fd(), ifindex).map(|()| fd)
        });
        match r {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!("interface '{name}': promiscuous mode refused ({e}); only frames for its own address will arrive");
                None
            }
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The interface name given to `open`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The MTU when the port was opened.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The longest frame (Ethernet header included) that `send` accepts.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// How many rx queues are bound (one AF_XDP socket each; 1 for AF_PACKET).
    pub fn queues(&self) -> usize {
        match &self.io {
            Io::Xdp(x) => x.queues(),
            Io::Packet(_) => 1,
        }
    }

    /// Whether the interface exists, is administratively up and has carrier. One ioctl: not
    /// for the per-frame path.
    pub fn is_up(&self) -> bool {
        let Some(name) = ifinfo::name_of(self.ifindex) else {
            return false;
        };
        let want = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        ifinfo::flags(&name).is_ok_and(|f| f & want == want)
    }

    /// Our counters plus the kernel's drop counts (a few syscalls).
    pub fn stats(&self) -> NicStats {
        let mut s = self.stats;
        s.kernel_drops = match &self.io {
            Io::Xdp(x) => {
                s.rx_bad += x.bad_descs;
                let k = x.kernel_stats();
                k.rx_dropped
                    + k.rx_invalid_descs
                    + k.tx_invalid_descs
                    + k.rx_ring_full
                    + k.rx_fill_ring_empty_descs
            }
            Io::Packet(p) => {
                s.rx_bad += p.truncated;
                self.packet_drops
                    .set(self.packet_drops.get() + p.take_kernel_drops());
                self.packet_drops.get()
            }
        };
        s
    }

    /// Descriptors that become readable when frames arrive (or the interface goes away).
    pub fn poll_fds(&self) -> Vec<RawFd> {
        match &self.io {
            Io::Xdp(x) => x.poll_fds(),
            Io::Packet(p) => vec![p.fd()],
        }
    }

    fn down_error(&self, gone: bool) -> io::Error {
        let what = if gone { "is gone" } else { "is down" };
        io::Error::new(
            io::ErrorKind::NetworkDown,
            format!(
                "interface '{}' (ifindex {}) {what}",
                self.name, self.ifindex
            ),
        )
    }

    /// Turns a kernel error into NetworkDown when it means the interface is down or gone.
    fn io_error(&mut self, what: &str, e: io::Error) -> io::Error {
        match e.raw_os_error() {
            Some(libc::ENXIO) | Some(libc::ENODEV) | Some(libc::ENETDOWN) => {
                if ifinfo::name_of(self.ifindex).is_none() {
                    self.gone = true;
                }
                self.down_error(self.gone)
            }
            _ => io::Error::new(e.kind(), format!("interface '{}': {what}: {e}", self.name)),
        }
    }

    /// Asks the kernel now whether the interface is still usable; NetworkDown when it is
    /// down or gone.
    pub fn check(&mut self) -> io::Result<()> {
        if self.gone {
            return Err(self.down_error(true));
        }
        self.last_check = Instant::now();
        let r = match &mut self.io {
            Io::Xdp(x) => x.check(),
            Io::Packet(p) => p.check(),
        };
        if let Err(e) = r {
            // A packet socket keeps the ENETDOWN of an earlier down until read: if the
            // interface is up again by now, that error is history.
            let stale = e.raw_os_error() == Some(libc::ENETDOWN)
                && ifinfo::name_of(self.ifindex)
                    .and_then(|n| ifinfo::flags(&n).ok())
                    .is_some_and(|f| f & libc::IFF_UP as u32 != 0);
            if !stale {
                return Err(self.io_error("checking the socket", e));
            }
        }
        // A packet socket's pending error is reported once; the index lookup is what lasts.
        if ifinfo::name_of(self.ifindex).is_none() {
            self.gone = true;
            return Err(self.down_error(true));
        }
        Ok(())
    }

    /// Calls `f` with each received frame, at most `budget` of them; returns how many.
    ///
    /// The slice is only valid during the call (it points into the receive ring). Frames come
    /// straight from the wire and are not validated beyond fitting their buffer.
    pub fn recv(&mut self, budget: usize, mut f: impl FnMut(&[u8])) -> io::Result<usize> {
        if self.gone {
            return Err(self.down_error(true));
        }
        let mut bytes = 0u64;
        let mut count = |frame: &[u8]| {
            bytes += frame.len() as u64;
            f(frame)
        };
        let r = match &mut self.io {
            Io::Xdp(x) => x.recv(budget, &mut count),
            Io::Packet(p) => p.recv(budget, &mut count),
        };
        let n = r.map_err(|e| self.io_error("receiving", e))?;
        self.stats.rx_frames += n as u64;
        self.stats.rx_bytes += bytes;
        if n == 0 && self.last_check.elapsed() >= CHECK_INTERVAL {
            self.check()?;
        }
        Ok(n)
    }

    /// Queues one frame given as consecutive pieces; false when the device has no room now.
    ///
    /// A frame longer than [`max_frame`](Nic::max_frame) or shorter than an Ethernet header
    /// is refused with InvalidInput (the caller counts a drop).
    pub fn send(&mut self, pieces: &[&[u8]]) -> io::Result<bool> {
        if self.gone {
            return Err(self.down_error(true));
        }
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        if len > self.max_frame || len < 14 {
            self.stats.tx_refused += 1;
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "interface '{}': a {len}-byte frame does not fit (14 to {} bytes)",
                    self.name, self.max_frame
                ),
            ));
        }
        let r = match &mut self.io {
            Io::Xdp(x) => x.send(pieces, len),
            Io::Packet(p) => p.send(pieces, len),
        };
        let queued = r.map_err(|e| self.io_error("sending", e))?;
        if queued {
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        Ok(queued)
    }

    /// Hands queued frames to the kernel and reclaims finished ones.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.gone {
            return Err(self.down_error(true));
        }
        let r = match &mut self.io {
            Io::Xdp(x) => x.flush(),
            Io::Packet(p) => p.flush(),
        };
        r.map_err(|e| self.io_error("flushing", e))
    }
}

impl fmt::Debug for Nic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nic")
            .field("name", &self.name)
            .field("ifindex", &self.ifindex)
            .field("mode", &self.mode)
            .field("queues", &self.queues())
            .finish()
    }
}

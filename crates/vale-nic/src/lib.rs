//! Frames to and from a Linux network interface, for valed's NIC ports.
//!
//! [`Nic::open`] binds an interface through AF_XDP (native driver mode or generic mode) or,
//! where XDP cannot bind, an AF_PACKET socket with TPACKET rings. The caller polls
//! [`Nic::poll_fds`] for readability, takes frames with [`Nic::recv`] and queues frames with
//! [`Nic::send`], then [`Nic::flush`]es once per batch. Dropping the `Nic` gives the interface
//! back to the kernel.

use std::fmt;
use std::io;
use std::os::fd::RawFd;

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

    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "xdp" => Ok(Mode::Xdp),
            "xdp-generic" => Ok(Mode::XdpGeneric),
            "packet" => Ok(Mode::Packet),
            _ => Err(format!(
                "unknown mode '{s}' (known: xdp, xdp-generic, packet)"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An interface bound for frame I/O.
pub struct Nic {
    _todo: (),
}

impl Nic {
    /// Binds interface `ifname`. `mode` None tries native XDP, then generic XDP, then
    /// AF_PACKET, and logs why each one that failed did.
    pub fn open(ifname: &str, mode: Option<Mode>) -> io::Result<Nic> {
        let _ = (ifname, mode);
        Err(io::Error::other("not yet"))
    }

    pub fn mode(&self) -> Mode {
        Mode::Packet
    }

    /// Descriptors that become readable when frames arrive (or the interface goes away).
    pub fn poll_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// Calls `f` with each received frame, at most `budget` of them; returns how many.
    pub fn recv(&mut self, budget: usize, f: impl FnMut(&[u8])) -> io::Result<usize> {
        let _ = (budget, f);
        Ok(0)
    }

    /// Queues one frame given as consecutive pieces; false when the device has no room now.
    pub fn send(&mut self, pieces: &[&[u8]]) -> io::Result<bool> {
        let _ = pieces;
        Ok(false)
    }

    /// Hands queued frames to the kernel and reclaims finished ones.
    pub fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

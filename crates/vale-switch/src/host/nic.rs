//! NIC ports: a network interface (or a veth) as a port of the switch, through `vale-nic`
//! (AF_XDP, or AF_PACKET where XDP cannot bind).

use std::io;
use std::os::fd::RawFd;

use super::{polled, DevError, Device, Driver, Egress, Polled, TxSide};
use crate::offload::{Caps, Offload};

/// Largest frame taken from an interface (a jumbo frame; AF_XDP frames are smaller still).
const MAX_NIC_FRAME: usize = 9216;
/// Frames taken per round.
const INGRESS_BURST: usize = 256;

pub struct NicDevice {
    nic: vale_nic::Nic,
    name: String,
}

impl NicDevice {
    pub fn open(iface: &str, mode: Option<vale_nic::Mode>) -> Result<NicDevice, super::Error> {
        let nic =
            vale_nic::Nic::open(iface, mode).map_err(|e| super::Error::of_io(e.to_string(), e))?;
        Ok(NicDevice {
            nic,
            name: iface.to_string(),
        })
    }
}

/// The interface went down or away: stop using it until it is up again. Every other error
/// concerns one frame.
fn classify(e: io::Error) -> DevError {
    if vale_nic::is_port_down(&e) {
        DevError::Down {
            err: e,
            pause: true,
        }
    } else {
        DevError::Frame(e)
    }
}

impl Device for NicDevice {
    fn describe(&self) -> (&'static str, String, String) {
        ("nic", self.name.clone(), self.nic.mode().to_string())
    }

    fn caps(&self) -> Caps {
        Caps::NONE
    }

    fn driver(self: Box<Self>) -> Box<dyn Driver> {
        polled(self)
    }
}

impl Polled for NicDevice {
    fn poll_fds(&self) -> Vec<RawFd> {
        self.nic.poll_fds()
    }
    fn ingress(&mut self, ring: &mut TxSide) -> Result<usize, DevError> {
        let budget = (ring.room() / ring.slots_for(MAX_NIC_FRAME)) as usize;
        let budget = budget.min(INGRESS_BURST);
        if budget == 0 {
            return Ok(0);
        }
        self.nic
            .recv(budget, |frame| {
                if frame.len() < 14 || !ring.push(frame) {
                    ring.refused += 1;
                }
            })
            .map_err(classify)
    }
    fn is_up(&self) -> bool {
        self.nic.is_up()
    }
}

impl Egress for NicDevice {
    fn send(&mut self, pieces: &[&[u8]], _off: Offload) -> Result<bool, DevError> {
        // Frames toward a NIC never carry offload work: the switch finished it.
        self.nic.send(pieces).map_err(classify)
    }

    fn flush(&mut self) -> Result<(), DevError> {
        self.nic.flush().map_err(classify)
    }
}

/// `nic`: `iface` (the interface), `mode` (`xdp`, `xdp-generic` or `packet`; absent: the best
/// that binds).
pub const KIND: super::Kind = super::Kind {
    name: "nic",
    flag: super::Flag {
        long: "iface",
        value: Some("iface"),
        help: "A network interface, bound through AF_XDP or AF_PACKET",
    },
    about: "--iface NAME binds network interface NAME (a NIC, a veth): AF_XDP in the driver's \
XDP mode (xdp) or the kernel's generic mode (xdp-generic), or AF_PACKET (packet). Without --mode \
valed tries them in that order and keeps the first that binds; 'vale-ctl list' shows which. \
While attached, the interface's received frames go to the switch instead of the kernel.",
    args: &[
        super::Arg::new("iface", "NAME", "The network interface's name").required(),
        super::Arg::new(
            "mode",
            "MODE",
            "How to bind the interface (default: the first of these that works)",
        )
        .shape(super::Shape::Choice(&["xdp", "xdp-generic", "packet"])),
    ],
    open: |args| {
        let iface = super::required(args, "nic", "iface")?;
        let mode = args
            .get("mode")
            .map(|m| vale_nic::Mode::parse(m))
            .transpose()
            .map_err(|e| super::Error::invalid(e.to_string()))?;
        Ok(Box::new(NicDevice::open(iface, mode)?))
    },
    saved_args: &["bound"],
    saved: |attached, device, mode| {
        let mut args = attached.unwrap_or_else(|| [("iface".into(), device.into())].into());
        args.remove("bound");
        // Attached without a mode: the mode it was bound in is tried first at the next start.
        if !args.contains_key("mode") && !mode.is_empty() {
            args.insert("bound".into(), mode.into());
        }
        args
    },
    restore: |args| {
        let mut a = args.clone();
        let bound = a.remove("bound");
        let iface = a.get("iface").cloned().unwrap_or_default();
        // Right after the old valed let go of the interface, its driver may still be tearing
        // down the old AF_XDP socket: the mode it was bound in (if saved without one) is tried
        // for half a second while the interface exists, then the mode asked for or the best
        // that binds, with as many tries.
        if let (Some(m), None) = (bound, a.get("mode")) {
            let mut pinned = a.clone();
            pinned.insert("mode".into(), m);
            if let Ok(dev) = retried(&iface, || (KIND.open)(&pinned)) {
                return Ok(dev);
            }
        }
        retried(&iface, || (KIND.open)(&a))
    },
};

/// `open`, tried up to ten times 50 ms apart while interface `iface` exists.
fn retried(
    iface: &str,
    open: impl Fn() -> Result<Box<dyn Device>, super::Error>,
) -> Result<Box<dyn Device>, super::Error> {
    let mut r = open();
    for _ in 0..9 {
        if r.is_ok() || !super::interface_exists(iface) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        r = open();
    }
    r
}

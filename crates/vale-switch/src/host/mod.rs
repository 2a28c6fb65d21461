//! The kinds of host port (valed itself is the client of the port, moving frames between the
//! switch and a device of the host: a TAP device, a network interface, a guest's vhost-user
//! queues, a memif peer, a VXLAN or Geneve tunnel) and their registry, [`KINDS`].
//!
//! What a kind implements and registers with is the seam: `kind.rs` (its [`Kind`] entry and
//! its [`Device`]; its doc walks through adding one), `sink.rs` (what the pipeline delivers
//! to) and `drive/` (how its device is driven). This module is the registry only: it finds a
//! kind by name, checks a request's arguments against the kind's description and opens the
//! device; the seam's names are re-exported here for the kinds' modules.

mod guard;
mod memif;
mod nic;
mod peer_irq;
mod socket;
mod tap;
mod tunnel;
mod vhost_user;
mod virtq;

pub use crate::drive::{polled, Driver, Gather, Polled, Steps, TxSide};
pub use crate::kind::{
    flag, required, Arg, Device, Error, Flag, Kind, KindArgs, Shape, HOST_PARAMS,
};
pub use crate::sink::{Delivered, DevError, DirectSink, Egress, HostState, OutFrame, OutFrames};

/// Every kind valed can attach: a new kind is one module and one entry here.
pub const KINDS: &[Kind] = &[
    tap::KIND,
    nic::KIND,
    vhost_user::KIND,
    memif::KIND,
    tunnel::VXLAN,
    tunnel::GENEVE,
];

/// Removes the socket of every port that listens at a path it was given (vhost-user in
/// server mode), each only while it is still the socket valed bound, as detach does, and
/// refuses such attaches from then on. valed calls it as it exits on SIGTERM or SIGINT, which
/// drops no port.
pub fn remove_port_sockets() {
    socket::remove_all();
}

/// How a device is opened from a kind's name and arguments ([`open_device`], [`restore_device`]).
pub(crate) type OpenDevice = fn(&str, &KindArgs) -> Result<Box<dyn Device>, Error>;

/// The kind named `kind`; an unknown one is refused with the list of what is known.
pub fn kind(kind: &str) -> Result<&'static Kind, Error> {
    KINDS.iter().find(|k| k.name == kind).ok_or_else(|| {
        let known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        Error::invalid(format!(
            "no port kind '{kind}' (known: {})",
            known.join(", ")
        ))
    })
}

/// Checks `args` against `k`'s description: refuses an argument it does not take (`saved`
/// too: those of a saved configuration), naming those it does, and names a required one
/// that is missing.
fn check_args(k: &Kind, args: &KindArgs, saved: bool) -> Result<(), Error> {
    let takes = |a: &str| k.arg(a).is_some() || (saved && k.saved_args.contains(&a));
    if let Some(bad) = args.keys().find(|a| !takes(a)) {
        let known: Vec<&str> = k.args.iter().map(|a| a.key).collect();
        return Err(Error::invalid(format!(
            "port kind '{}' takes no argument '{bad}' (it takes: {})",
            k.name,
            known.join(", ")
        )));
    }
    match k
        .args
        .iter()
        .find(|a| a.required && !args.contains_key(a.key))
    {
        Some(a) => required(args, k.name, a.key).map(drop),
        None => Ok(()),
    }
}

/// Opens the device of kind `kind` that `args` describe; unknown kinds and arguments are
/// refused with the list of what is known.
pub(crate) fn open_device(kind: &str, args: &KindArgs) -> Result<Box<dyn Device>, Error> {
    let k = self::kind(kind)?;
    check_args(k, args, false)?;
    (k.open)(args)
}

/// Opens again, at valed's start, the device of a port saved as `args` ([`Kind::restore`]).
pub(crate) fn restore_device(kind: &str, args: &KindArgs) -> Result<Box<dyn Device>, Error> {
    let k = self::kind(kind)?;
    check_args(k, args, true)?;
    (k.restore)(args)
}

/// Whether network interface `name` exists in valed's network namespace.
pub(crate) fn interface_exists(name: &str) -> bool {
    vale_nic::index_of(name).is_ok()
}

#[cfg(test)]
pub(crate) mod tests;

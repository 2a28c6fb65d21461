//! Everything a port kind registers with: the entry point of the seam between the core and
//! the kinds of port.
//!
//! A port kind (TAP, NIC, vhost-user...) is a device of the host whose client is valed itself.
//! The core (the pipeline, ports, the engine, valed's configuration) knows a kind only through
//! the seam, three files that name none: this one (how a kind registers, and its device),
//! `sink.rs` (what the pipeline delivers to) and `drive/` (how a device is driven). The seam
//! is a layer: the core imports `sink.rs` and nothing of a kind; `drive/` imports the core and
//! `sink.rs`; this file imports those two; the kinds import the seam. Adding a kind takes its
//! own module under `host/` and one line in the registry (`KINDS`, in `host/mod.rs`):
//!
//! 1. **The registration entry**, a [`Kind`]: the name the control protocol and
//!    `vale-ctl attach PORT KIND KEY=VALUE...` use, the description of the arguments it takes
//!    ([`Arg`]: key, value, help, [`Shape`]; a request carries them as [`KindArgs`], which
//!    [`required`] and [`flag`] read), vale-ctl's flag for the kind ([`Flag`]: `--tap NAME`)
//!    and its help paragraph, `open` (a device from those arguments), and how a port of the
//!    kind is saved in valed's configuration and opened again at its next start
//!    (`saved_args`, `saved`, `restore`: retries and namespaces live there). Failures are an
//!    [`Error`], whose variant becomes the errno a client sees. The engine checks the
//!    arguments against the description (an unknown one is refused with the list of known
//!    ones, a missing required one named) before calling `open`; vale-ctl makes its `attach`
//!    flags, their help and its usage errors from the same descriptions, so a new kind needs
//!    no change there.
//! 2. **The device**, a [`Device`]: what attaching needs (`describe` for the control plane's
//!    [`HostState`], `caps`: the offloads frames to it may carry as they are, `params`: its
//!    rings' geometry, [`HOST_PARAMS`] unless it says otherwise, `direct`: an optional
//!    [`DirectSink`]) and its driver (`driver`, which takes the device).
//! 3. **The driver** (`drive/`). Most kinds let the core drive them: the device is also
//!    [`Polled`](crate::drive::Polled) (descriptors to wait on, an `ingress` that fills the port's tx ring through a
//!    [`TxSide`](crate::drive::TxSide), `is_up`) and an [`Egress`](crate::sink::Egress) (`send` one frame the switch
//!    delivered, `flush` a burst), and `driver` returns [`polled`](crate::drive::polled)`(self)`: one thread per
//!    port sleeps in `epoll_wait` on those descriptors and on the port's rx interrupt line and
//!    calls the two steps. A kind whose library owns its event loop (vhost-user) brings its
//!    own [`Driver`], which gets the port's [`Steps`](crate::drive::Steps) and calls the same steps from its own
//!    threads; a kind whose frames may stay in its client's memory until the switch copied
//!    them (vhost-user, memif) adds them to the batch through a
//!    [`Gather`](crate::drive::Gather), which lets it do nothing else to the pipeline. Either
//!    way a device's failure is a [`DevError`](crate::sink::DevError): one frame refused (a
//!    counted drop) or the device down (the port shows down and drops what is sent to it
//!    until the device is up again).
//! 4. **Optionally, a direct sink** (`sink.rs`, [`DirectSink`]): a kind that takes concurrent
//!    writes (TAP, vhost-user, memif) gets the frames of each batch for its port straight from
//!    the forwarding thread, once per destination per batch
//!    ([`OutFrames`](crate::sink::OutFrames), reporting [`Delivered`](crate::sink::Delivered)),
//!    instead of through the port's rx ring and its own thread.
//!
//! The core then attaches the device as an ordinary port whose region is never handed out,
//! shows its [`HostState`] in `vale-ctl list`, and stops its thread ([`HostState::stop`]) on
//! detach. `host/tap.rs` is the smallest kind to read; `host/tests.rs` drives a fake device
//! through this seam with no root.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use vale_abi::region::PortParams;

use crate::drive::Driver;
use crate::offload::Caps;
use crate::sink::{DirectSink, HostState};

// The registration entry.

/// The arguments of an attach request: what the control protocol carries besides the kind.
pub type KindArgs = BTreeMap<String, String>;

/// A kind of port whose client is valed itself: its name in the control protocol, how to open
/// its device from the request's arguments, and how it is saved in valed's configuration and
/// opened again at the next start. Everything kind-specific is here: valed's configuration and
/// the engine name no kind.
pub struct Kind {
    pub name: &'static str,
    /// vale-ctl's flag for the kind (`--tap NAME`).
    pub flag: Flag,
    /// The kind's paragraph in `vale-ctl attach --help` (and its man page): what the flag
    /// does, and its options.
    pub about: &'static str,
    /// The arguments it takes: valed refuses any other, vale-ctl offers each as an option.
    pub args: &'static [Arg],
    pub open: fn(&KindArgs) -> Result<Box<dyn Device>, Error>,
    /// Arguments only a saved configuration carries ([`Kind::saved`] writes them,
    /// [`Kind::restore`] reads them): where a device was found, how it was bound.
    pub saved_args: &'static [&'static str],
    /// The port's saved form, from the arguments it was attached with (when valed recorded
    /// them) and what its device is now (`list`'s device and mode).
    pub saved: fn(attached: Option<KindArgs>, device: &str, mode: &str) -> KindArgs,
    /// Opens the device again from its saved form at valed's start, with the kind's own
    /// retries and namespace handling.
    pub restore: fn(&KindArgs) -> Result<Box<dyn Device>, Error>,
}

/// vale-ctl's flag for a kind: `--tap NAME` picks kind `tap` and carries its argument `name`;
/// a bare one (`--vxlan`) only picks the kind, whose arguments are options of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag {
    /// The long flag, without its dashes.
    pub long: &'static str,
    /// The key of the argument ([`Kind::args`]) the flag's value is, if it takes a value.
    pub value: Option<&'static str>,
    /// One line for the flag in `vale-ctl attach --help`.
    pub help: &'static str,
}

/// One argument a kind takes: its key in the control protocol, and how vale-ctl offers it (an
/// option `--KEY VALUE`, or `--FLAG` where [`Arg::flag`] says).
///
/// Kinds may share an option (vxlan and geneve both take `--vni`): vale-ctl shows it once, so
/// an option shared by two kinds must be the same [`Arg`] in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    /// The key, as the control protocol and the configuration file carry it.
    pub key: &'static str,
    /// vale-ctl's long flag for it, when it is not the key.
    pub flag: Option<&'static str>,
    /// What the value is called in help texts (`NAME`, `PATH`); unused for a [`Shape::Switch`].
    pub value_name: &'static str,
    /// One line for vale-ctl's help: what the argument is, its default.
    pub help: &'static str,
    pub shape: Shape,
    /// The kind cannot do without it.
    pub required: bool,
}

/// What values an argument takes: vale-ctl checks the shape before it asks valed (the kind's
/// `open` checks the value itself again, since a request may come from elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Any text.
    Text,
    /// `yes` or `no` ([`flag`] reads it): vale-ctl's flag takes no value and sends `yes`.
    Switch,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// A whole number from the first to the second, both included.
    Range(u64, u64),
    /// A file system path, which vale-ctl sends absolute: valed resolves no relative path (its
    /// directory is not the caller's).
    Path,
    /// Values joined with commas: vale-ctl's option may be repeated, and joins them.
    List,
}

impl Arg {
    /// Argument `key`, an optional text named `value_name` in help texts.
    pub const fn new(key: &'static str, value_name: &'static str, help: &'static str) -> Arg {
        Arg {
            key,
            flag: None,
            value_name,
            help,
            shape: Shape::Text,
            required: false,
        }
    }

    /// A yes/no argument `key`: absent is no.
    pub const fn switch(key: &'static str, help: &'static str) -> Arg {
        Arg::new(key, "yes|no", help).shape(Shape::Switch)
    }

    /// The same, with values of shape `shape`.
    pub const fn shape(self, shape: Shape) -> Arg {
        Arg { shape, ..self }
    }

    /// The same, required.
    pub const fn required(self) -> Arg {
        Arg {
            required: true,
            ..self
        }
    }

    /// The same, offered by vale-ctl as `--FLAG`.
    pub const fn flag(self, flag: &'static str) -> Arg {
        Arg {
            flag: Some(flag),
            ..self
        }
    }

    /// vale-ctl's long flag for it (without the dashes).
    pub fn long(&self) -> &'static str {
        self.flag.unwrap_or(self.key)
    }
}

impl Kind {
    /// The description of argument `key`, if the kind takes it.
    pub fn arg(&self, key: &str) -> Option<&'static Arg> {
        self.args.iter().find(|a| a.key == key)
    }
}

/// Why a host port's device could not be attached: the switch's one error (see
/// [`crate::Error`]), whose kind is the errno a client sees.
pub use crate::Error;

/// Argument `name` of an attach request, which the kind requires.
pub fn required<'a>(args: &'a KindArgs, kind: &str, name: &str) -> Result<&'a str, Error> {
    args.get(name)
        .map(String::as_str)
        .ok_or_else(|| Error::invalid(format!("port kind '{kind}' needs argument '{name}'")))
}

/// A yes/no argument: absent is no.
pub fn flag(args: &KindArgs, name: &str) -> Result<bool, Error> {
    match args.get(name).map(String::as_str) {
        None | Some("no") | Some("false") | Some("0") => Ok(false),
        Some("yes") | Some("true") | Some("1") => Ok(true),
        Some(v) => Err(Error::invalid(format!(
            "argument '{name}' must be yes or no, not '{v}'"
        ))),
    }
}

// The device and its driver.

/// The device side of a host port: what attaching it asks of it, and its driver.
pub trait Device: Send {
    /// `kind`, name and mode for [`HostState`].
    fn describe(&self) -> (&'static str, String, String);
    /// The offload work (TSO, partial checksums) frames to the port may carry as they are, at
    /// attach time (see [`Steps::set_caps`](crate::drive::Steps::set_caps)).
    fn caps(&self) -> Caps;
    /// The geometry of the port's rings.
    fn params(&self) -> PortParams {
        HOST_PARAMS
    }
    /// Where switch threads may write frames for this port straight away, if anywhere.
    fn direct(&self) -> Option<Arc<dyn DirectSink>> {
        None
    }
    /// The port's driver, which takes the device: [`polled`](crate::drive::polled) for a
    /// device the generic driver runs; a kind whose library runs its own threads brings its
    /// own.
    fn driver(self: Box<Self>) -> Box<dyn Driver>;
}

/// The ring geometry of host ports unless their kind says otherwise ([`Device::params`]):
/// deep enough for a burst of 64 KiB TSO segments.
pub const HOST_PARAMS: PortParams = PortParams {
    tx_rings: 1,
    rx_rings: 1,
    slots: 2048,
    buf_size: vale_abi::region::DEFAULT_BUF_SIZE,
};

/// The control plane's view of the port of `dev`.
pub(crate) fn state_of(dev: &dyn Device) -> io::Result<Arc<HostState>> {
    let (kind, device, mode) = dev.describe();
    HostState::new(kind, device, mode)
}

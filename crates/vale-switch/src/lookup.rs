//! Stage 2 of the pipeline: lookup modules (mSwitch's modular lookup).
//!
//! A module sees a whole batch at once and fills in each frame's destination. The engine
//! calls nothing else to decide where a frame goes, so a new module (an L3 router, a flow
//! table, a module loaded at run time) plugs in here and nowhere else.
//!
//! A module comes in one of two forms: a Rust type implementing [`Lookup`], registered by name
//! in [`MODULES`], or a shared object built against `vale_lookup.h` and loaded at run time
//! ([`shared`]). Both see a batch as the same `repr(C)` array of [`FrameMeta`]; what the
//! engine keeps of a frame for itself (its offload word, its true length) is not in it.
//!
//! # A module's own control
//!
//! Besides forwarding, a module may take commands of its own ([`Lookup::control`]): an
//! operation name and a text body in, a text out, which the engine, valed and the control
//! protocol carry without reading them (netmap's `config` hook of `struct netmap_bdg_ops`).
//! The `flow` module's rule changes and dumps go this way, as a shared object's commands do.
//! A module says which of its operations anyone may call ([`Lookup::open_op`]); the others
//! are an administrator's. What a module wants kept across a restart (the flow rules) it gives
//! as lines ([`Lookup::save`]), which valed's configuration keeps and hands back at the next
//! start ([`Lookup::restore`]).

use crate::index::PortIndex;

pub mod flow;
mod learning;
pub mod shared;
pub mod vlan;

pub use learning::LearningBridge;
pub(crate) use learning::TableArgs;

/// Where a frame goes: a port index, or one of the two specials.
pub type Dest = u16;
/// Every port of the switch but the source (broadcast, multicast, unknown unicast); with a
/// VLAN set on the frame, every other port of that VLAN.
pub const DEST_FLOOD: Dest = u16::MAX;
/// Nowhere: counted as a `tx_drop` of the source.
pub const DEST_DROP: Dest = u16::MAX - 1;
/// A frame's `ring` when the module leaves the choice to the switch.
pub const RING_ANY: u16 = u16::MAX;

/// What a lookup module sees of one frame, and where it writes its decision: the element of
/// the batch array, laid out as `struct vale_frame` of `vale_lookup.h`.
///
/// `data` points at the first `first_len` bytes of the frame (at least a 14-byte Ethernet
/// header; the engine drops shorter frames before stage 2). The bytes live in the source
/// client's memory and may change under us: read each once. The engine reads back only `dst`
/// and `vlan`: whatever else a module writes here changes nothing of what is delivered.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FrameMeta {
    pub data: *const u8,
    pub first_len: u32,
    /// Whole frame length, all slots of a chain together.
    pub len: u32,
    /// Flags of the frame's first slot (`NS_NO_LEARN` matters to the bridge).
    pub flags: u16,
    /// Output: a port index, [`DEST_FLOOD`] or [`DEST_DROP`] (the engine's default).
    pub dst: Dest,
    /// Output: the destination's rx ring, or [`RING_ANY`] (the engine's default: the ring the
    /// source ring maps to). A ring the destination does not have is a counted drop (the
    /// source's tx drop); flooded frames ignore it.
    pub ring: u16,
    /// Output (Rust modules whose [`Lookup::vlans`] is true): the frame's VLAN, with
    /// [`VLAN_TAGGED`] if it arrived with an 802.1Q tag; 0: the frame is in no VLAN. Shared
    /// objects leave it 0 (the loader clears it).
    pub vlan: u16,
}

const _: () = assert!(std::mem::size_of::<FrameMeta>() == 24);

/// In [`FrameMeta::vlan`]: the frame carries its 802.1Q tag (bytes 12..16).
pub const VLAN_TAGGED: u16 = 0x8000;
/// The VLAN identifier bits of [`FrameMeta::vlan`].
pub const VLAN_VID: u16 = 0x0fff;

impl FrameMeta {
    /// A frame as stage 1 hands it to the module: no decision yet.
    #[inline(always)]
    pub fn new(data: *const u8, first_len: u32, len: u32, flags: u16) -> FrameMeta {
        FrameMeta {
            data,
            first_len,
            len,
            flags,
            dst: DEST_DROP,
            ring: RING_ANY,
            vlan: 0,
        }
    }

    #[inline(always)]
    pub fn dst_mac(&self) -> u64 {
        // SAFETY: the engine guarantees at least 14 readable bytes at `data`.
        unsafe { mac_at(self.data) }
    }

    #[inline(always)]
    pub fn src_mac(&self) -> u64 {
        // SAFETY: as above.
        unsafe { mac_at(self.data.add(6)) }
    }

    /// Bytes `at..at + 2` of the first slot, big-endian, if it holds them.
    #[inline(always)]
    pub fn be16(&self, at: u32) -> Option<u16> {
        // SAFETY: inside the first `first_len` readable bytes.
        (at + 2 <= self.first_len).then(|| unsafe {
            u16::from_be_bytes(std::ptr::read_unaligned(
                self.data.add(at as usize) as *const [u8; 2]
            ))
        })
    }
}

/// Reads a MAC address as a u64 in wire order (first octet in the low byte).
///
/// # Safety
/// `p` must point at 6 readable bytes.
#[inline(always)]
unsafe fn mac_at(p: *const u8) -> u64 {
    let lo = std::ptr::read_unaligned(p as *const u32) as u64;
    let hi = std::ptr::read_unaligned(p.add(4) as *const u16) as u64;
    lo | hi << 32
}

/// The first octet's low bit: broadcast and multicast addresses.
#[inline(always)]
pub fn is_group(mac: u64) -> bool {
    mac & 1 != 0
}

/// The port a batch comes from, as a lookup module sees it.
#[derive(Clone, Copy, Debug)]
pub struct SourcePort {
    pub index: PortIndex,
    /// The source's tx ring the batch was gathered from.
    pub ring: u16,
    /// Most source addresses the port may hold in a learning table (its `learn-limit` knob).
    pub learn_limit: u32,
}

/// How a port takes the frames of one VLAN (see [`Lookup::egress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tagging {
    /// Not a member: the port gets none of the VLAN's frames.
    Skip,
    /// Without the 802.1Q tag (an access port).
    Untagged,
    /// With the tag (a trunk port).
    Tagged,
}

/// A module's configuration, as given: `key=value` pairs in order, repeats allowed.
pub type Args = [(String, String)];

/// Largest text a module's command may answer ([`Lookup::control`]): a larger answer is an
/// error, not a reply. Room for the rules a large `add` of the flow module lists, with the
/// reply's JSON escaping still under the protocol's largest message.
pub const MAX_CONTROL_OUTPUT: usize = vale_abi::control::MAX_MESSAGE / 4;

/// Why a lookup module could not be made, or refused a command: the words name the thing and
/// what is wrong; the variant is the kind of failure valed's reply carries (see
/// [`crate::Error`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An unknown module, argument or operation body; a bad value, rule or name.
    #[error("{0}")]
    Invalid(String),
    /// The module has no such command (or no commands at all).
    #[error("lookup module '{module}' has no command '{op}'{hint}")]
    Unsupported {
        module: String,
        op: String,
        /// What it does have, if anything (`" (known: add, del, dump)"`).
        hint: String,
    },
    /// No such rule (or other thing a command names).
    #[error("{0}")]
    NotFound(String),
    /// A limit of the module's (most rules, largest answer) would be passed.
    #[error("{0}")]
    Limit(String),
    /// A shared object that could not be loaded, or whose call failed.
    #[error("{0}")]
    Module(String),
}

impl Error {
    /// The same failure, its words preceded by `context` (`"bad rule at line 3: "`).
    pub fn context(self, context: impl std::fmt::Display) -> Error {
        match self {
            Error::Invalid(m) => Error::Invalid(format!("{context}{m}")),
            Error::NotFound(m) => Error::NotFound(format!("{context}{m}")),
            Error::Limit(m) => Error::Limit(format!("{context}{m}")),
            Error::Module(m) => Error::Module(format!("{context}{m}")),
            e @ Error::Unsupported { .. } => Error::Invalid(format!("{context}{e}")),
        }
    }

    /// Operation `op` that module `module` does not have; `known` lists those it has.
    pub fn unsupported(module: &str, op: &str, known: &[&str]) -> Error {
        Error::Unsupported {
            module: module.to_string(),
            op: op.to_string(),
            hint: if known.is_empty() {
                ": it takes no commands".to_string()
            } else {
                format!(" (known: {})", known.join(", "))
            },
        }
    }
}

/// A bad value, rule or name, in words.
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::Invalid(message.into())
}

/// A bad port or switch name is an invalid argument.
impl From<vale_abi::name::NameError> for Error {
    fn from(e: vale_abi::name::NameError) -> Error {
        Error::Invalid(e.to_string())
    }
}

impl From<Error> for crate::Error {
    fn from(e: Error) -> crate::Error {
        let kind = match &e {
            Error::Invalid(_) => crate::error::ErrorKind::InvalidArgument,
            Error::Unsupported { .. } => crate::error::ErrorKind::Unsupported,
            Error::NotFound(_) => crate::error::ErrorKind::NotFound,
            Error::Limit(_) => crate::error::ErrorKind::LimitReached,
            Error::Module(_) => crate::error::ErrorKind::Io,
        };
        crate::Error::new(kind, e.to_string())
    }
}

/// An argument of an installed module as the switch keeps it: shown by `vale-ctl lookup`,
/// and saved in valed's configuration unless `saved` is false: an argument that only seeded
/// the module's state (the flow module's `rules`, which [`Lookup::save`] keeps instead), whose
/// value the module may have replaced by a summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptArg {
    pub key: String,
    pub value: String,
    pub saved: bool,
}

/// What a module's command sees besides its operation and body: where it runs.
#[derive(Clone, Copy, Debug)]
pub struct ControlCtx<'a> {
    /// The switch the module is installed on (`valeX`): a command naming a port of another
    /// switch may be refused.
    pub switch: &'a str,
}

/// A lookup module. Every method may be called from any thread, concurrently: `lookup` by
/// each forwarding worker, the others by the control plane.
pub trait Lookup: Send + Sync {
    /// The module's name, as `vale-ctl lookup` shows it.
    fn name(&self) -> &str;
    /// Fills `dst` (and, for a module that does VLANs, `vlan`) of every frame of one batch
    /// from port `src`. `now_s` is a coarse clock in seconds, read once per batch. Returns how
    /// many source addresses it refused to learn (counted against the source port).
    fn lookup(&self, src: SourcePort, frames: &mut [FrameMeta], now_s: u32) -> u64;
    /// Port `port`, named `name` (`valeX:Y`), is on the switch: it was attached, or it was
    /// there when the module was installed. May come again for a port already known.
    fn port_added(&self, _port: PortIndex, _name: &str) {}
    /// A port left the switch: forget what points at it.
    fn port_removed(&self, _port: PortIndex) {}
    /// Addresses learnt on `port`, for modules that learn.
    fn learnt(&self, _port: PortIndex) -> Option<u32> {
        None
    }
    /// The module's own counters, by name, for `vale-ctl lookup`.
    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Whether the module puts frames into VLANs (writes [`FrameMeta::vlan`]). Asked once
    /// per batch; when false, the engine ignores `vlan`.
    fn vlans(&self) -> bool {
        false
    }
    /// How `port` takes the frames of VLAN `vid` (modules whose [`Lookup::vlans`] is true).
    fn egress(&self, _port: PortIndex, _vid: u16) -> Tagging {
        Tagging::Untagged
    }
    /// The module's own command `op` with `body` (text in, text out: valed carries both
    /// without reading them). Called from the control plane only, one call at a time per
    /// switch, never on the forwarding path. The default: the module takes no commands.
    fn control(&self, _ctx: ControlCtx, op: &str, _body: &str) -> Result<String, Error> {
        Err(Error::unsupported(self.name(), op, &[]))
    }
    /// Whether anyone may call command `op` (reading, as `flow`'s `dump`): false, the
    /// default, makes it an administrator's.
    fn open_op(&self, _op: &str) -> bool {
        false
    }
    /// The module is about to be installed on switch `ctx.switch`: it may refuse it (a rule
    /// naming a port of another switch), and say how its arguments `args` are shown and
    /// saved (see [`KeptArg`]; the default keeps them as given).
    fn installing(&self, _ctx: ControlCtx, _args: &mut [KeptArg]) -> Result<(), Error> {
        Ok(())
    }
    /// What the module wants kept across a restart beyond its arguments, as lines (the flow
    /// rules, in the order they were added). The default: nothing.
    fn save(&self) -> Vec<String> {
        Vec::new()
    }
    /// Takes back lines of [`Lookup::save`] after the module was made again from its
    /// arguments (valed's start). All or none: a failure changes nothing, so the caller may
    /// retry line by line. The default takes no lines.
    fn restore(&self, _ctx: ControlCtx, lines: &[String]) -> Result<(), Error> {
        match lines.is_empty() {
            true => Ok(()),
            false => Err(Error::unsupported(self.name(), "restore", &[])),
        }
    }
}

/// Makes a built-in module from its configuration.
type Make = fn(&Args) -> Result<Box<dyn Lookup>, Error>;

/// The modules valed knows by name, with what they take; the first is the default.
pub const MODULES: &[(&str, Make)] = &[
    ("learning", LearningBridge::make),
    ("hub", Hub::make),
    ("vlan", vlan::Vlan::make),
    ("flow", flow::Flow::make),
];

/// Makes a lookup module: a built-in one by name, or, for a `spec` holding a `/`, the shared
/// object at that path (absolute: valed resolves no path against its own directory).
pub fn make(spec: &str, args: &Args) -> Result<Box<dyn Lookup>, Error> {
    if spec.contains('/') {
        return shared::SharedModule::load(std::path::Path::new(spec), args)
            .map(|m| Box::new(m) as Box<dyn Lookup>);
    }
    match MODULES.iter().find(|(n, _)| *n == spec) {
        Some((_, make)) => make(args),
        None => Err(invalid(format!(
            "no lookup module '{spec}' (known: {}; or the path of a shared object)",
            MODULES.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Refuses any argument whose key is not in `known`.
pub fn check_keys(module: &str, args: &Args, known: &[&str]) -> Result<(), Error> {
    for (k, _) in args {
        if !known.contains(&k.as_str()) {
            return Err(invalid(if known.is_empty() {
                format!("module '{module}' takes no arguments (got '{k}')")
            } else {
                format!(
                    "module '{module}' takes no argument '{k}' (known: {})",
                    known.join(", ")
                )
            }));
        }
    }
    Ok(())
}

/// The last value of argument `key` as a number in `range`, else `default`.
pub fn number_arg(
    args: &Args,
    key: &str,
    range: std::ops::RangeInclusive<u64>,
    default: u64,
) -> Result<u64, Error> {
    let Some((_, v)) = args.iter().rev().find(|(k, _)| k == key) else {
        return Ok(default);
    };
    v.parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            invalid(format!(
                "{key} must be a number from {} to {}, not '{v}'",
                range.start(),
                range.end()
            ))
        })
}

/// Sends every frame everywhere: a repeater. Useful to test flooding and as the smallest
/// example of a module.
pub struct Hub;

impl Hub {
    fn make(args: &Args) -> Result<Box<dyn Lookup>, Error> {
        check_keys("hub", args, &[])?;
        Ok(Box::new(Hub))
    }
}

impl Lookup for Hub {
    fn name(&self) -> &str {
        "hub"
    }
    fn lookup(&self, _src: SourcePort, frames: &mut [FrameMeta], _now_s: u32) -> u64 {
        for f in frames {
            f.dst = DEST_FLOOD;
        }
        0
    }
}

//! Tunnel ports: a switch spanning hosts over an IP network, one VXLAN (RFC 7348) or Geneve
//! (RFC 8926) segment per port.
//!
//! A tunnel port is a host port whose device is one kernel UDP socket bound to the port's
//! `local` address and `dstport` ([`sock`]; the ports of several VNIs on one address and port
//! have a socket each, which the kernel picks by VNI). The far ends (VTEPs) are the `remote` list:
//!
//! - Egress (switch → wire): the inner destination MAC is looked up in the port's own table
//!   (inner MAC → remote); a known one goes to its remote, anything else (unknown, broadcast,
//!   multicast) to every remote (head-end replication). The 8-byte header is the same for every
//!   frame of the port, so a frame is sent from where it lies: one message of iovecs (header,
//!   the frame's pieces) per remote, a batch in one `sendmmsg`; nothing is allocated or copied
//!   per frame. The switch's forwarding threads do it themselves ([`path::direct`]: the port is
//!   a direct sink, runs of frames share `UDP_SEGMENT` messages); the port's own thread sends
//!   only what they leave in its ring ([`TunnelDevice::send`], one lock per burst).
//! - Ingress (wire → switch, [`TunnelDevice::ingress`]): one `recvmmsg` receives a batch straight
//!   into the free slots of the port's tx ring (the header into scratch space beside it); each
//!   packet's header, VNI and sender are checked ([`wire`]), its inner source MAC is learnt for
//!   its remote, and it is committed to the ring.
//!
//! The table is the learning bridge's ([`LearningBridge`]), with remotes in place of ports: 300 s
//! aging as Linux's vxlan, and a per-remote limit (`learn-limit`), so a remote sending from
//! random inner MACs churns its own entries only and the others' stay known.
//!
//! Remotes not in the list: a packet from one is dropped (`unknown-vtep`), unless the port
//! learns remotes (`learn-remotes=yes` or a count): then a VTEP whose packet passes every check
//! becomes a learnt remote (flooded to, and its inner MACs learnt for it) until it has sent
//! nothing for longer than the table's age, so that all its MACs have aged. At most
//! `learn-remotes` of them at once (and [`MAX_REMOTES`] in all, in slots made when the port
//! opens): a flood of spoofed senders beyond that is counted (`remotes-full`), never grown.
//!
//! Offloads: the port takes partial checksums and TCP/UDP segments of up to 64 KiB as they
//! are ([`OFFLOADS`]): it finishes them itself into encapsulated segments sent with
//! `UDP_SEGMENT`, a few system calls per 64 KiB ([`gso`]); such frames take the ring path.
//! Frames bigger than the underlay's path MTU are refused by the kernel (the socket never
//! fragments) and counted as too big.
//!
//! Counters (per port and per remote) are shown as the port's `negotiated` line in
//! `vale-ctl list`, refreshed about once a second.

mod evpn;
mod gso;
mod merge;
mod path;
mod sock;
pub mod wire;

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use vale_abi::region::PortParams;

use super::{
    polled, DevError, Device, DirectSink, Driver, Egress, HostState, KindArgs, Polled, Steps,
    TxSide,
};
use crate::lookup::LearningBridge;
use crate::offload::{Caps, Offload};
use path::direct::{lock, Shared};
use wire::{Proto, HDR_LEN, MAX_UDP_PAYLOAD, MIN_INNER};

/// Most remotes of one port.
pub const MAX_REMOTES: usize = 256;
/// Entries of a port's table (all remotes together).
const TABLE_ENTRIES: usize = 16_384;
/// MACs one remote may hold in the table unless `learn-limit` says.
const DEFAULT_LEARN_LIMIT: u32 = 1024;

/// The offload work a tunnel port takes as it is: it segments and checksums in user space and
/// sends the segments with `UDP_SEGMENT`.
const OFFLOADS: Caps = Caps(Caps::CSUM.0 | Caps::TSO4.0 | Caps::TSO6.0 | Caps::ECN.0 | Caps::USO.0);

/// The ring geometry of a tunnel port: one slot per frame, jumbo frames included.
const TUNNEL_PARAMS: PortParams = PortParams {
    tx_rings: 1,
    rx_rings: 1,
    slots: 512,
    buf_size: 9472,
};

/// The arguments of a tunnel port.
#[derive(Clone, Debug)]
pub struct Config {
    pub proto: Proto,
    pub vni: u32,
    pub local: SocketAddr,
    pub remotes: Vec<SocketAddr>,
    pub learn_limit: u32,
    /// Most remotes learnt from valid packets of VTEPs not in `remotes` (0: such packets are
    /// dropped).
    pub learn_remotes: usize,
    /// Remote tables from BGP EVPN through FRR ([`evpn`]); `remote` is optional then.
    pub evpn: bool,
}

/// The arguments of both tunnel kinds ([`Config::parse`] reads them).
const ARGS: &[super::Arg] = &[
    super::Arg::new(
        "vni",
        "N",
        "The segment's id, 0-16777215, the same at every end",
    )
    .shape(super::Shape::Range(0, (1 << 24) - 1))
    .required(),
    super::Arg::new(
        "local",
        "ADDR",
        "This host's address in the underlay (IPv4 or IPv6)",
    )
    .required(),
    super::Arg::new(
        "remote",
        "ADDR",
        "A far end's address (repeatable, or comma-separated; needed unless --learn-remotes)",
    )
    .shape(super::Shape::List),
    super::Arg::new(
        "dstport",
        "PORT",
        "UDP port at both ends (default 4789 vxlan, 6081 geneve)",
    )
    .shape(super::Shape::Range(1, 65535)),
    super::Arg::new(
        "learn-limit",
        "N",
        "Most MACs learnt from one remote (default 1024)",
    )
    .shape(super::Shape::Range(1, TABLE_ENTRIES as u64)),
    super::Arg::new(
        "learn-remotes",
        "no|yes|N",
        "Learn VTEPs not in --remote from their packets (yes: up to 256; N: up to N)",
    ),
    super::Arg::new(
        "evpn",
        "",
        "Remote tables from BGP EVPN through FRR (vxlan only; --remote optional then)",
    )
    .shape(super::Shape::Switch),
];

impl Config {
    /// From an attach request's arguments.
    pub fn parse(proto: Proto, args: &KindArgs) -> Result<Config, super::Error> {
        let kind = proto.name();
        let bad = |m: String| super::Error::invalid(format!("{kind}: {m}"));
        let vni = super::required(args, kind, "vni")?;
        let vni = vni
            .parse::<u32>()
            .ok()
            .filter(|v| *v < 1 << 24)
            .ok_or_else(|| bad(format!("vni '{vni}' is not a number from 0 to 16777215")))?;
        let ip = |s: &str, what: &str| {
            s.trim()
                .parse::<IpAddr>()
                .map_err(|_| bad(format!("{what} '{s}' is not an IPv4 or IPv6 address")))
        };
        let local = ip(super::required(args, kind, "local")?, "local")?;
        let port = match args.get("dstport") {
            None => proto.default_port(),
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad(format!("dstport '{p}' is not a port from 1 to 65535")))?,
        };
        let learn_limit = match args.get("learn-limit") {
            None => DEFAULT_LEARN_LIMIT,
            Some(l) => l
                .parse::<u32>()
                .ok()
                .filter(|l| (1..=TABLE_ENTRIES as u32).contains(l))
                .ok_or_else(|| {
                    bad(format!(
                        "learn-limit '{l}' is not a number from 1 to {TABLE_ENTRIES}"
                    ))
                })?,
        };
        let learn_remotes = match args.get("learn-remotes").map(|s| s.as_str()) {
            None | Some("no") => 0,
            Some("yes") => MAX_REMOTES,
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= MAX_REMOTES)
                .ok_or_else(|| {
                    bad(format!(
                        "learn-remotes '{n}' is not yes, no or a number from 0 to {MAX_REMOTES}"
                    ))
                })?,
        };
        if learn_remotes > 0 && (local.is_unspecified() || local.is_multicast()) {
            // Any address of the host would be the port's own: a spoofed packet from one
            // would make the port send floods to itself.
            return Err(bad(format!(
                "learn-remotes needs a unicast local address, not {local}"
            )));
        }
        let evpn = super::flag(args, "evpn")?;
        if evpn && proto != Proto::Vxlan {
            return Err(bad("evpn=yes is for vxlan ports only".into()));
        }
        if evpn && learn_remotes > 0 {
            // EVPN's routes name the VTEPs: none is learnt from the data plane.
            return Err(bad(
                "evpn=yes takes its remotes from routes, not learn-remotes".into(),
            ));
        }
        // With learnt remotes or EVPN the list may be empty: every VTEP is learnt or routed.
        let open = learn_remotes > 0 || evpn;
        let listed = match args.get("remote") {
            None if open => "",
            _ => super::required(args, kind, "remote")?,
        };
        let mut remotes = Vec::new();
        for r in listed.split(',').filter(|r| !r.trim().is_empty() || !open) {
            let r = ip(r, "remote")?;
            if r.is_ipv4() != local.is_ipv4() {
                return Err(bad(format!(
                    "remote {r} and local {local} are not of the same IP version"
                )));
            }
            if r.is_unspecified() || r.is_multicast() {
                return Err(bad(format!("remote {r} is not a unicast address")));
            }
            if r == local {
                return Err(bad(format!("remote {r} is the local address")));
            }
            let r = SocketAddr::new(r, port);
            if !remotes.contains(&r) {
                remotes.push(r);
            }
        }
        if remotes.len() > MAX_REMOTES {
            return Err(bad(format!(
                "{} remotes, more than the {MAX_REMOTES} a port takes",
                remotes.len()
            )));
        }
        Ok(Config {
            proto,
            vni,
            local: SocketAddr::new(local, port),
            remotes,
            learn_limit,
            learn_remotes,
            evpn,
        })
    }
}

/// The kind of tunnel protocol `proto`.
const fn kind(
    proto: Proto,
    name: &'static str,
    flag: super::Flag,
    about: &'static str,
) -> super::Kind {
    let open = match proto {
        Proto::Vxlan => open_vxlan as fn(&KindArgs) -> _,
        Proto::Geneve => open_geneve,
    };
    super::Kind {
        name,
        flag,
        about,
        args: ARGS,
        open,
        saved_args: &[],
        // A tunnel port is opened again from what it was attached with.
        saved: |attached, _device, _mode| attached.unwrap_or_default(),
        restore: open,
    }
}

fn open_vxlan(args: &KindArgs) -> Result<Box<dyn Device>, super::Error> {
    Ok(Box::new(TunnelDevice::open(Config::parse(
        Proto::Vxlan,
        args,
    )?)?))
}

fn open_geneve(args: &KindArgs) -> Result<Box<dyn Device>, super::Error> {
    Ok(Box::new(TunnelDevice::open(Config::parse(
        Proto::Geneve,
        args,
    )?)?))
}

/// `vxlan`: `vni`, `local` (address), `remote` (addresses, comma-separated), `dstport`
/// (4789), `learn-limit` (MACs per remote, 1024), `learn-remotes` (no, yes or a count: VTEPs
/// not in `remote` learnt from their packets; `remote` may be left out then).
pub const VXLAN: super::Kind = kind(
    Proto::Vxlan,
    "vxlan",
    super::Flag {
        long: "vxlan",
        value: None,
        help: "A VXLAN segment to other hosts (with --vni, --local, --remote)",
    },
    "--vxlan joins the switch to a VXLAN segment (RFC 7348) over an IP network: valed binds \
a UDP socket at --local, an address of this host, and --dstport (default 4789), and sends the \
port's frames to the VTEPs at the --remote addresses (the option repeated or comma-separated, \
up to 256): a destination MAC learnt from a remote to that remote, anything else to each of \
them. --vni is the segment's id, the same at every end (ports of other VNIs may share --local \
and --dstport). The port keeps at most --learn-limit \
MACs (default 1024) learnt from one remote. With --learn-remotes (yes, or a count) a VTEP not \
in --remote that sends a valid packet becomes a remote until its MACs have aged (--remote may \
be left out then). TCP segments of up to 64 KiB from TAP and vhost-user ports are segmented \
by the port and sent with UDP_SEGMENT; a frame too long for the underlay's path with its \
encapsulation (50 bytes over IPv4) is dropped and counted as too big.",
);
/// `geneve`: as `vxlan`, `dstport` 6081.
pub const GENEVE: super::Kind = kind(
    Proto::Geneve,
    "geneve",
    super::Flag {
        long: "geneve",
        value: None,
        help: "A Geneve segment to other hosts (with --vni, --local, --remote)",
    },
    "--geneve is --vxlan with Geneve encapsulation (RFC 8926), at --dstport 6081 by default.",
);

/// A tunnel port's device: its socket, remotes, table and batches, shared between the port's
/// thread (ingress, and the ring path out) and the switch's forwarding threads (the direct
/// path out, [`path::direct`]).
pub struct TunnelDevice {
    cfg: Config,
    shared: Arc<Shared>,
    /// Frames the ring path took since its last flush, queued under one lock at the flush.
    stash: Stash,
    /// The EVPN side (`evpn=yes`).
    evpn: Option<evpn::Evpn>,
    /// The table's clock, as this thread last read it.
    now_s: u32,
    /// The path holds received datagrams the ring had no room for ([`path::Path::holds`]).
    holding: bool,
    /// Where the counters are shown (set when the driver starts).
    state: Option<Arc<HostState>>,
}

/// The frames of one burst of the ring path (their pieces, as addresses and lengths: they
/// stay in the port's rx ring until the flush), and what was refused before the lock was
/// taken.
#[derive(Default)]
struct Stash {
    pieces: Vec<(usize, usize)>,
    /// Per frame: where its pieces start in `pieces`, how many, and its offload work.
    frames: Vec<(u32, u32, Offload)>,
    bad_header: u64,
    too_big: u64,
}

/// Frames of one egress burst of the port's thread (the generic driver's).
const STASH_FRAMES: usize = 256;

impl TunnelDevice {
    pub fn open(cfg: Config) -> Result<TunnelDevice, super::Error> {
        let sock = sock::open(cfg.proto, cfg.vni, cfg.local)?;
        let table = LearningBridge::new(TABLE_ENTRIES);
        let mut path = path::Path::new(&cfg);
        if std::env::var_os("VALE_TUNNEL_NO_GRO").is_none() {
            path.enable_gro(&sock);
        }
        let evpn = match cfg.evpn {
            true => Some(evpn::Evpn::open(&cfg, cfg.remotes.len())?),
            false => None,
        };
        Ok(TunnelDevice {
            cfg,
            shared: Arc::new(Shared::new(sock, table, path)),
            stash: Stash {
                pieces: Vec::with_capacity(STASH_FRAMES * 8),
                frames: Vec::with_capacity(STASH_FRAMES),
                ..Stash::default()
            },
            evpn,
            now_s: 0,
            holding: false,
            state: None,
        })
    }

    /// The counters, as `list` shows them.
    fn shown(&self) -> String {
        let path = lock(&self.shared.path);
        let c = &path.counters;
        let mut s = format!(
            "{} vni {}: bad-header {} wrong-vni {} critical {} unknown-vtep {} remotes-full {} \
             too-big {} not-learnt {} learnt {} bad-offload {} tso-frames {} gso-sends {} \
             gso-segments {} gso-off {} gro-buffers {} gro-segments {} tso-merged {} \
             merged-segments {}",
            self.cfg.proto.name(),
            self.cfg.vni,
            c.bad_header,
            c.wrong_vni,
            c.critical,
            c.unknown_vtep,
            c.remotes_full,
            c.too_big,
            c.not_learnt,
            self.shared.table.len(self.shared.now_s()),
            c.bad_offload,
            c.tso_frames,
            c.gso_sends,
            c.gso_segments,
            c.gso_off,
            c.gro_buffers,
            c.gro_segments,
            c.merged,
            c.merged_segments,
        );
        // An EVPN port's routed VTEPs are shown with its EVPN state below.
        let listed = match self.evpn {
            Some(_) => self.cfg.remotes.len(),
            None => usize::MAX,
        };
        for r in path.remotes().take(listed) {
            let rc = &r.counters;
            s.push_str(&format!(
                "; {}remote {}: tx {} frames {} bytes, rx {} frames {} bytes, drops {}",
                if r.learnt { "learnt " } else { "" },
                r.ip,
                rc.tx_frames,
                rc.tx_bytes,
                rc.rx_frames,
                rc.rx_bytes,
                rc.drops
            ));
        }
        if let Some(e) = &self.evpn {
            s.push_str(&e.shown(&path));
        }
        s
    }
}

impl Device for TunnelDevice {
    fn describe(&self) -> (&'static str, String, String) {
        (
            self.cfg.proto.name(),
            self.cfg.local.to_string(),
            format!("vni {}", self.cfg.vni),
        )
    }

    fn caps(&self) -> Caps {
        OFFLOADS
    }

    fn params(&self) -> PortParams {
        TUNNEL_PARAMS
    }

    /// The switch's threads send straight to the socket, except to an EVPN port (whose
    /// local MACs its thread notes on the way out).
    fn direct(&self) -> Option<Arc<dyn DirectSink>> {
        match self.evpn {
            None => Some(self.shared.clone()),
            Some(_) => None,
        }
    }

    fn driver(self: Box<Self>) -> Box<dyn Driver> {
        Box::new(TunnelDriver(self))
    }
}

/// The generic driver, once the device knows where to show its counters.
struct TunnelDriver(Box<TunnelDevice>);

impl Driver for TunnelDriver {
    fn start(
        self: Box<Self>,
        steps: Steps,
        state: Arc<HostState>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let mut dev = self.0;
        dev.state = Some(state.clone());
        *state.negotiated.lock().unwrap_or_else(|e| e.into_inner()) = dev.shown();
        polled(dev).start(steps, state)
    }
}

impl Polled for TunnelDevice {
    fn poll_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![self.shared.sock.as_raw_fd()];
        fds.extend(self.evpn.as_ref().map(|e| e.fd()));
        fds
    }

    fn ingress(&mut self, ring: &mut TxSide) -> Result<usize, DevError> {
        let sh = &*self.shared;
        self.now_s = sh.now_s();
        if self.evpn.is_none() && !self.holding && !path::direct::readable(&sh.sock) {
            // Woken for the ring or the clock, with nothing received waiting: the path stays
            // free for the forwarding threads, which would leave their batches in the ring
            // while it is held.
            return Ok(0);
        }
        let mut path = lock(&sh.path);
        path.now_s = self.now_s;
        path.counters.bad_header += std::mem::take(&mut self.stash.bad_header);
        path.counters.too_big += std::mem::take(&mut self.stash.too_big);
        if let Some(e) = &mut self.evpn {
            e.poll(&mut path, &sh.table, self.now_s);
        }
        let r = path.receive(&sh.sock, &sh.table, ring);
        // Datagrams already taken from the socket (a merged buffer split only in part, for
        // want of room) are taken further at the next call, socket empty or not.
        self.holding = path.holds();
        r.map_err(DevError::Frame)
    }

    /// Called about once a second: ages the table and shows the counters.
    fn is_up(&self) -> bool {
        self.shared.table.tick(self.shared.now_s());
        if let Some(st) = &self.state {
            *st.negotiated.lock().unwrap_or_else(|e| e.into_inner()) = self.shown();
        }
        true
    }
}

impl Egress for TunnelDevice {
    /// Takes a frame of the ring path: it is queued, with the rest of the burst, under one
    /// lock at the flush (its pieces stay in the ring until then).
    fn send(&mut self, pieces: &[&[u8]], off: Offload) -> Result<bool, DevError> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        let st = &mut self.stash;
        if len < MIN_INNER {
            st.bad_header += 1;
            return Err(DevError::Frame(std::io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        // A frame with offload work is cut into segments that fit (`queue` checks them).
        if !off.needs_work() && len + HDR_LEN > MAX_UDP_PAYLOAD {
            st.too_big += 1;
            return Err(DevError::Frame(std::io::Error::from_raw_os_error(
                libc::EMSGSIZE,
            )));
        }
        if let Some(e) = &mut self.evpn {
            e.sent_from(evpn::src_mac(pieces), self.now_s);
        }
        st.frames
            .push((st.pieces.len() as u32, pieces.len() as u32, off));
        st.pieces
            .extend(pieces.iter().map(|p| (p.as_ptr() as usize, p.len())));
        Ok(true)
    }

    fn flush(&mut self) -> Result<(), DevError> {
        let sh = &*self.shared;
        let mut path = lock(&sh.path);
        let st = &mut self.stash;
        path.counters.bad_header += std::mem::take(&mut st.bad_header);
        path.counters.too_big += std::mem::take(&mut st.too_big);
        let mut pieces: [&[u8]; path::IOV_PER] = [&[]; path::IOV_PER];
        for &(first, count, off) in &st.frames {
            let count = (count as usize).min(path::IOV_PER);
            for (k, &(p, l)) in st.pieces[first as usize..][..count].iter().enumerate() {
                // SAFETY: the pieces of a frame the egress step handed to `send`, which stay
                // in the port's rx ring until this flush returns.
                pieces[k] = unsafe { std::slice::from_raw_parts(p as *const u8, l) };
            }
            // Refused frames (too many pieces) are counted by `queue`. The port's ring is
            // valed's own memory: nobody writes the frame meanwhile.
            let _ = path.queue(&sh.sock, &sh.table, &pieces[..count], off, false);
        }
        st.frames.clear();
        st.pieces.clear();
        path.flush(&sh.sock);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(kv: &[(&str, &str)]) -> KindArgs {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn arguments_and_their_defaults() {
        let c = Config::parse(
            Proto::Vxlan,
            &args(&[
                ("vni", "42"),
                ("local", "10.0.0.1"),
                ("remote", "10.0.0.2, 10.0.0.3,10.0.0.2"),
            ]),
        )
        .unwrap();
        assert_eq!(c.local, "10.0.0.1:4789".parse().unwrap());
        assert_eq!(c.remotes.len(), 2, "duplicates go");
        assert_eq!(c.remotes[1], "10.0.0.3:4789".parse().unwrap());
        assert_eq!(c.learn_limit, DEFAULT_LEARN_LIMIT);
        let c = Config::parse(
            Proto::Geneve,
            &args(&[
                ("vni", "0"),
                ("local", "fd00::1"),
                ("remote", "fd00::2"),
                ("dstport", "7000"),
            ]),
        )
        .unwrap();
        assert_eq!(c.remotes[0], "[fd00::2]:7000".parse().unwrap());
        assert_eq!(
            Config::parse(
                Proto::Geneve,
                &args(&[("vni", "1"), ("local", "fd00::1"), ("remote", "fd00::2")])
            )
            .unwrap()
            .local
            .port(),
            6081
        );
        let many: Vec<String> = (0..=MAX_REMOTES)
            .map(|i| format!("10.1.{}.{}", i / 250, i % 250 + 1))
            .collect();
        let e = Config::parse(
            Proto::Vxlan,
            &args(&[
                ("vni", "1"),
                ("local", "10.0.0.1"),
                ("remote", &many.join(",")),
            ]),
        );
        assert!(
            matches!(e, Err(crate::host::Error { kind: crate::ErrorKind::InvalidArgument, message: m, .. }) if m.contains("257 remotes"))
        );
        let learning = |v: &str, remote: Option<&str>| {
            let mut a = vec![("vni", "1"), ("local", "10.0.0.1"), ("learn-remotes", v)];
            a.extend(remote.map(|r| ("remote", r)));
            Config::parse(Proto::Vxlan, &args(&a))
        };
        let c = learning("yes", None).unwrap();
        assert_eq!((c.learn_remotes, c.remotes.len()), (MAX_REMOTES, 0));
        let c = learning("7", Some("10.0.0.2")).unwrap();
        assert_eq!((c.learn_remotes, c.remotes.len()), (7, 1));
        assert!(
            learning("no", None).is_err(),
            "a list is needed without learning"
        );
        assert!(learning("257", None).is_err());
        let any = Config::parse(
            Proto::Vxlan,
            &args(&[("vni", "1"), ("local", "0.0.0.0"), ("learn-remotes", "yes")]),
        );
        assert!(
            matches!(any, Err(crate::host::Error { kind: crate::ErrorKind::InvalidArgument, message: m, .. }) if m.contains("unicast local"))
        );
        assert_eq!(learning("no", Some("10.0.0.2")).unwrap().learn_remotes, 0);
    }

    #[test]
    fn evpn_needs_no_remote_and_is_for_vxlan_only() {
        let a = args(&[("vni", "42"), ("local", "10.0.0.1"), ("evpn", "yes")]);
        let c = Config::parse(Proto::Vxlan, &a).unwrap();
        assert!(c.evpn && c.remotes.is_empty());
        let e = Config::parse(Proto::Geneve, &a);
        assert!(
            matches!(e, Err(crate::host::Error { kind: crate::ErrorKind::InvalidArgument, message: m, .. }) if m.contains("vxlan ports only"))
        );
        let e = Config::parse(Proto::Vxlan, &args(&[("vni", "42"), ("local", "10.0.0.1")]));
        assert!(
            matches!(e, Err(crate::host::Error { kind: crate::ErrorKind::InvalidArgument, message: m, .. }) if m.contains("remote"))
        );
        let e = Config::parse(
            Proto::Vxlan,
            &args(&[("vni", "42"), ("local", "10.0.0.1"), ("evpn", "maybe")]),
        );
        assert!(
            matches!(e, Err(crate::host::Error { kind: crate::ErrorKind::InvalidArgument, message: m, .. }) if m.contains("evpn"))
        );
        let e = Config::parse(
            Proto::Vxlan,
            &args(&[
                ("vni", "42"),
                ("local", "10.0.0.1"),
                ("evpn", "yes"),
                ("learn-remotes", "yes"),
            ]),
        );
        assert!(
            matches!(e, Err(crate::host::Error { kind: crate::ErrorKind::InvalidArgument, message: m, .. }) if m.contains("from routes"))
        );
    }
}

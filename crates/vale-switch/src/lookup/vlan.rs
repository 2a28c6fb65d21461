//! `vlan`: an 802.1Q learning bridge.
//!
//! Each port is an *access* port of one VLAN (its frames travel untagged: a tag is added when
//! one of them leaves through a trunk, removed when a tagged frame leaves through an access
//! port) or a *trunk* port carrying the tagged frames of a list of VLANs. Every VLAN has a
//! learning table of its own (the learning bridge of [`LearningBridge`]), and a frame is
//! flooded to the other members of its VLAN only: no frame ever crosses from one VLAN into
//! another.
//!
//! Ingress: an access port takes untagged frames and frames tagged with its own VLAN; a frame
//! tagged with another VLAN is dropped and counted (`foreign_tag`). A trunk port takes frames
//! tagged with one of its VLANs; others are dropped and counted (`not_allowed`), as are its
//! untagged frames (`untagged_on_trunk`). A port the configuration does not name is an access
//! port of the `default` VLAN (1 unless configured; `default=none`: such ports get and send
//! nothing, counted as `no_vlan`).
//!
//! The module only decides; adding and removing tags per destination is the engine's (see
//! [`crate::lookup::Tagging`] and the pipeline's stage 2).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use vale_abi::netmap::NS_NO_LEARN;

use super::{
    check_keys, invalid, is_group, Args, Error, FrameMeta, LearningBridge, Lookup, SourcePort,
    TableArgs, Tagging, DEST_DROP, DEST_FLOOD, VLAN_TAGGED, VLAN_VID,
};
use crate::index::{PortIndex, MAX_PORTS};
use crate::wire;

/// The 802.1Q tag's EtherType.
pub const TPID: u16 = wire::ETH_P_8021Q;
/// Most VLANs one configuration names (each has a learning table).
pub const MAX_VLANS: usize = 256;
const DEFAULT_TABLE: usize = 1024;

/// A port's place in the VLANs.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mode {
    Access(u16),
    /// The allowed VLANs, a bit per VID.
    Trunk(Box<[u64; 64]>),
}

impl Mode {
    fn egress(&self, vid: u16) -> Tagging {
        match self {
            Mode::Access(v) if *v == vid => Tagging::Untagged,
            Mode::Trunk(set) if has(set, vid) => Tagging::Tagged,
            _ => Tagging::Skip,
        }
    }
}

fn has(set: &[u64; 64], vid: u16) -> bool {
    set[vid as usize / 64] & 1 << (vid % 64) != 0
}

/// Where a port's mode is kept: `port_mode` holds 0 for a port not on the switch, 1 for an
/// unnamed port (the default), `2 + k` for the port of `named[k]`.
const GONE: u32 = 0;
const DEFAULT: u32 = 1;

pub struct Vlan {
    /// Ports the configuration names, by name, in the order given.
    named: Vec<(String, Mode)>,
    /// The mode of ports the configuration does not name.
    default: Option<Mode>,
    port_mode: Box<[AtomicU32]>,
    /// The learning table of each VLAN, and which table is a VID's (index + 1; 0: none).
    tables: Vec<LearningBridge>,
    table_of: Box<[u16; 4096]>,
    /// Frames refused at ingress, by reason.
    foreign_tag: AtomicU64,
    not_allowed: AtomicU64,
    untagged_on_trunk: AtomicU64,
    no_vlan: AtomicU64,
}

/// A VID of a configuration: 1 to 4094 (0 and 4095 are reserved by 802.1Q).
fn vid(s: &str) -> Result<u16, Error> {
    s.trim()
        .parse::<u16>()
        .ok()
        .filter(|v| (1..=4094).contains(v))
        .ok_or_else(|| invalid(format!("a VLAN is a number from 1 to 4094, not '{s}'")))
}

/// `10,20,30-39`.
fn vid_set(s: &str) -> Result<Box<[u64; 64]>, Error> {
    let mut set = Box::new([0u64; 64]);
    for part in s.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (vid(a)?, vid(b)?),
            None => (vid(part)?, vid(part)?),
        };
        if lo > hi {
            return Err(invalid(format!("empty VLAN range '{part}'")));
        }
        for v in lo..=hi {
            set[v as usize / 64] |= 1 << (v % 64);
        }
    }
    Ok(set)
}

/// `PORT=VALUE`, PORT a full port name.
fn port_value<'a>(key: &str, arg: &'a str) -> Result<(&'a str, &'a str), Error> {
    let (port, value) = arg
        .split_once('=')
        .ok_or_else(|| invalid(format!("{key} takes PORT=VLANS (valeX:Y=10), not '{arg}'")))?;
    vale_abi::name::parse_port(port)?;
    Ok((port, value))
}

impl Vlan {
    /// Arguments: `access=valeX:Y=VID` and `trunk=valeX:Y=VID,VID-VID` (each repeatable, a
    /// port named once), `default=VID|none`, `entries=N` (each VLAN's table, default 1024),
    /// `age=S`.
    pub fn make(args: &Args) -> Result<Box<dyn Lookup>, Error> {
        Ok(Box::new(Vlan::new(args)?))
    }

    pub fn new(args: &Args) -> Result<Vlan, Error> {
        check_keys(
            "vlan",
            args,
            &["access", "trunk", "default", "entries", "age"],
        )?;
        let mut named: Vec<(String, Mode)> = Vec::new();
        let mut default = Some(Mode::Access(1));
        for (k, v) in args {
            let mode = match k.as_str() {
                "access" => {
                    let (port, value) = port_value(k, v)?;
                    (port, Mode::Access(vid(value)?))
                }
                "trunk" => {
                    let (port, value) = port_value(k, v)?;
                    (port, Mode::Trunk(vid_set(value)?))
                }
                "default" => {
                    default = if v == "none" {
                        None
                    } else {
                        Some(Mode::Access(vid(v)?))
                    };
                    continue;
                }
                _ => continue,
            };
            if named.iter().any(|(n, _)| n == mode.0) {
                return Err(invalid(format!("port '{}' is configured twice", mode.0)));
            }
            named.push((mode.0.to_string(), mode.1));
        }
        let table_args = TableArgs::of(args, DEFAULT_TABLE)?;
        // A table for each VLAN some port is in.
        let mut table_of = Box::new([0u16; 4096]);
        let mut tables = Vec::new();
        for mode in named.iter().map(|(_, m)| m).chain(default.iter()) {
            for v in 1..4095u16 {
                let member = match mode {
                    Mode::Access(a) => *a == v,
                    Mode::Trunk(set) => has(set, v),
                };
                if member && table_of[v as usize] == 0 {
                    if tables.len() == MAX_VLANS {
                        return Err(invalid(format!(
                            "the configuration names more than {MAX_VLANS} VLANs"
                        )));
                    }
                    tables.push(table_args.table());
                    table_of[v as usize] = tables.len() as u16;
                }
            }
        }
        Ok(Vlan {
            named,
            default,
            port_mode: (0..MAX_PORTS).map(|_| AtomicU32::new(GONE)).collect(),
            tables,
            table_of,
            foreign_tag: AtomicU64::new(0),
            not_allowed: AtomicU64::new(0),
            untagged_on_trunk: AtomicU64::new(0),
            no_vlan: AtomicU64::new(0),
        })
    }

    fn mode(&self, port: PortIndex) -> Option<&Mode> {
        match self.port_mode.get(port as usize)?.load(Relaxed) {
            GONE => None,
            DEFAULT => self.default.as_ref(),
            k => self.named.get(k as usize - 2).map(|(_, m)| m),
        }
    }

    /// The VLAN of a tagged frame (`tci`: its tag's control field, if the first slot holds
    /// it) from a port in `mode`, with [`VLAN_TAGGED`]; `None` (counted) if the port may not
    /// send it.
    #[cold]
    fn classify_tagged(&self, mode: &Mode, tci: Option<u16>) -> Option<u16> {
        let Some(tci) = tci else {
            // A tag cut short by the end of the first slot.
            add(&self.foreign_tag);
            return None;
        };
        let t = tci & VLAN_VID;
        match mode {
            Mode::Access(v) if t == *v => Some(t | VLAN_TAGGED),
            Mode::Access(_) => {
                add(&self.foreign_tag);
                None
            }
            Mode::Trunk(set) if has(set, t) => Some(t | VLAN_TAGGED),
            Mode::Trunk(_) => {
                add(&self.not_allowed);
                None
            }
        }
    }

    /// The learning table of VLAN `vid`, which some port is in.
    #[inline(always)]
    fn table(&self, vid: u16) -> &LearningBridge {
        &self.tables[self.table_of[(vid & VLAN_VID) as usize] as usize - 1]
    }
}

fn add(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

impl Lookup for Vlan {
    fn name(&self) -> &str {
        "vlan"
    }

    fn lookup(&self, src: SourcePort, frames: &mut [FrameMeta], now_s: u32) -> u64 {
        for t in &self.tables {
            t.tick(now_s);
        }
        let Some(mode) = self.mode(src.index) else {
            self.no_vlan.fetch_add(frames.len() as u64, Relaxed);
            for f in frames.iter_mut() {
                f.dst = DEST_DROP;
            }
            return 0;
        };
        // An access port's untagged frames, the common case, all go to one table.
        let untagged = match mode {
            Mode::Access(v) => Some((*v, self.table(*v))),
            Mode::Trunk(_) => None,
        };
        let mut refused = 0;
        // Back-to-back frames from one host in one VLAN learn once.
        let mut last_learnt = (u64::MAX, 0);
        for f in frames.iter_mut() {
            // The engine guarantees 14 bytes: the EtherType is there.
            let (vlan, table) = match (f.be16(12), untagged) {
                (Some(TPID), _) => match self.classify_tagged(mode, f.be16(14)) {
                    Some(vlan) => (vlan, self.table(vlan)),
                    None => {
                        f.dst = DEST_DROP;
                        continue;
                    }
                },
                (_, Some(u)) => u,
                (_, None) => {
                    add(&self.untagged_on_trunk);
                    f.dst = DEST_DROP;
                    continue;
                }
            };
            let vid = vlan & VLAN_VID;
            let s = f.src_mac();
            if (s, vid) != last_learnt && !is_group(s) && f.flags & NS_NO_LEARN == 0 {
                if !table.learn(s, src.index, src.learn_limit, now_s) {
                    refused += 1;
                }
                last_learnt = (s, vid);
            }
            let d = f.dst_mac();
            f.dst = if is_group(d) {
                DEST_FLOOD
            } else {
                table.find(d, now_s).unwrap_or(DEST_FLOOD)
            };
            f.vlan = vlan;
        }
        refused
    }

    fn vlans(&self) -> bool {
        true
    }

    fn egress(&self, port: PortIndex, vid: u16) -> Tagging {
        self.mode(port).map_or(Tagging::Skip, |m| m.egress(vid))
    }

    fn port_added(&self, port: PortIndex, name: &str) {
        let Some(slot) = self.port_mode.get(port as usize) else {
            return;
        };
        let k = self
            .named
            .iter()
            .position(|(n, _)| n == name)
            .map_or(DEFAULT, |k| k as u32 + 2);
        slot.store(k, Relaxed);
    }

    fn port_removed(&self, port: PortIndex) {
        if let Some(slot) = self.port_mode.get(port as usize) {
            slot.store(GONE, Relaxed);
        }
        for t in &self.tables {
            t.port_removed(port);
        }
    }

    fn learnt(&self, port: PortIndex) -> Option<u32> {
        Some(self.tables.iter().filter_map(|t| t.learnt(port)).sum())
    }

    fn counters(&self) -> Vec<(String, u64)> {
        vec![
            ("vlans".into(), self.tables.len() as u64),
            ("foreign_tag".into(), self.foreign_tag.load(Relaxed)),
            ("not_allowed".into(), self.not_allowed.load(Relaxed)),
            (
                "untagged_on_trunk".into(),
                self.untagged_on_trunk.load(Relaxed),
            ),
            ("no_vlan".into(), self.no_vlan.load(Relaxed)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Ports: a (0) and b (1) access 10, c (2) access 20, up (3) trunk 10,20, d (4) unnamed.
    fn bridge() -> Vlan {
        let v = Vlan::new(&args(&[
            ("access", "vale0:a=10"),
            ("access", "vale0:b=10"),
            ("access", "vale0:c=20"),
            ("trunk", "vale0:up=10,20"),
        ]))
        .unwrap();
        for (i, n) in ["a", "b", "c", "up", "d"].iter().enumerate() {
            v.port_added(i as PortIndex, &format!("vale0:{n}"));
        }
        v
    }

    fn eth(dst: u8, src: u8) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, dst, 2, 0, 0, 0, 0, src, 0x08, 0x00];
        f.resize(60, 0);
        f
    }

    fn tagged(dst: u8, src: u8, vid: u16) -> Vec<u8> {
        let mut f = eth(dst, src);
        f.splice(12..12, [0x81, 0x00, (vid >> 8) as u8, vid as u8]);
        f
    }

    fn bcast(src: u8) -> Vec<u8> {
        let mut f = eth(0, src);
        f[..6].copy_from_slice(&[0xff; 6]);
        f
    }

    /// (dst, vlan) of one frame from `port`.
    fn decide(v: &Vlan, port: PortIndex, bytes: &[u8]) -> (u16, u16) {
        let mut f = [FrameMeta::new(
            bytes.as_ptr(),
            bytes.len() as u32,
            bytes.len() as u32,
            0,
        )];
        let src = SourcePort {
            index: port,
            ring: 0,
            learn_limit: 1024,
        };
        v.lookup(src, &mut f, 5);
        (f[0].dst, f[0].vlan)
    }

    fn counter(v: &Vlan, name: &str) -> u64 {
        v.counters().into_iter().find(|(n, _)| n == name).unwrap().1
    }

    #[test]
    fn access_frames_are_classified_learnt_and_kept_in_their_vlan() {
        let v = bridge();
        // a's broadcast floods inside VLAN 10, untagged on arrival.
        assert_eq!(decide(&v, 0, &bcast(0xa)), (DEST_FLOOD, 10));
        // b answers a: a was learnt on port 0 in VLAN 10.
        assert_eq!(decide(&v, 1, &eth(0xa, 0xb)), (0, 10));
        // c (VLAN 20) sends to a's address: a is unknown in VLAN 20, so it floods there.
        assert_eq!(decide(&v, 2, &eth(0xa, 0xc)), (DEST_FLOOD, 20));
        // Through the trunk, tagged 20, to c: learnt in VLAN 20.
        assert_eq!(decide(&v, 3, &tagged(0xc, 0xe, 20)), (2, 20 | VLAN_TAGGED));
        // Tagged 10 to a: learnt in VLAN 10 only.
        assert_eq!(decide(&v, 3, &tagged(0xa, 0xe, 10)), (0, 10 | VLAN_TAGGED));
        // An unnamed port is in VLAN 1, where nobody is known.
        assert_eq!(decide(&v, 4, &eth(0xa, 0xd)), (DEST_FLOOD, 1));
        assert_eq!(v.learnt(0), Some(1));
        assert_eq!(v.learnt(3), Some(1 + 1), "e learnt in VLANs 10 and 20");
    }

    #[test]
    fn foreign_and_untagged_frames_are_dropped_and_counted() {
        let v = bridge();
        // An access port of VLAN 10 may send a frame tagged 10, not 20.
        assert_eq!(
            decide(&v, 0, &tagged(0xb, 0xa, 10)),
            (DEST_FLOOD, 10 | VLAN_TAGGED)
        );
        assert_eq!(decide(&v, 0, &tagged(0xb, 0xa, 20)).0, DEST_DROP);
        assert_eq!(counter(&v, "foreign_tag"), 1);
        // The trunk: VLAN 30 is not allowed, untagged frames are not taken.
        assert_eq!(decide(&v, 3, &tagged(0xb, 0xe, 30)).0, DEST_DROP);
        assert_eq!(counter(&v, "not_allowed"), 1);
        assert_eq!(decide(&v, 3, &eth(0xb, 0xe)).0, DEST_DROP);
        assert_eq!(counter(&v, "untagged_on_trunk"), 1);
        // A tag cut short by the end of the slot.
        let mut short = tagged(0xb, 0xa, 10);
        short.truncate(15);
        assert_eq!(decide(&v, 0, &short).0, DEST_DROP);
        // A port that left sends nothing.
        v.port_removed(1);
        assert_eq!(decide(&v, 1, &eth(0xa, 0xb)).0, DEST_DROP);
        assert_eq!(counter(&v, "no_vlan"), 1);
    }

    #[test]
    fn egress_says_who_takes_a_vlan_and_how() {
        let v = bridge();
        assert_eq!(v.egress(0, 10), Tagging::Untagged);
        assert_eq!(v.egress(0, 20), Tagging::Skip);
        assert_eq!(v.egress(2, 20), Tagging::Untagged);
        assert_eq!(v.egress(3, 10), Tagging::Tagged);
        assert_eq!(v.egress(3, 30), Tagging::Skip);
        assert_eq!(v.egress(4, 1), Tagging::Untagged);
        assert_eq!(v.egress(9, 1), Tagging::Skip, "not on the switch");
        assert_eq!(10 | VLAN_TAGGED & VLAN_VID, 10);
    }

    #[test]
    fn bad_configurations_are_refused_by_name() {
        for (a, why) in [
            (("access", "vale0:a=0"), "from 1 to 4094"),
            (("access", "vale0:a=4095"), "from 1 to 4094"),
            (("access", "vale0:a"), "PORT=VLANS"),
            (("access", "a=10"), "vale"),
            (("trunk", "vale0:u=20-10"), "empty VLAN range"),
            (("trunk", "vale0:u=x"), "not 'x'"),
            (("default", "-1"), "from 1 to 4094"),
            (("colour", "red"), "no argument 'colour'"),
        ] {
            let e = Vlan::new(&args(&[a])).err().expect("refused");
            assert!(e.to_string().contains(why), "{a:?}: {e}");
        }
        let e = Vlan::new(&args(&[("access", "vale0:a=1"), ("trunk", "vale0:a=2")]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("configured twice"), "{e}");
        let e = Vlan::new(&args(&[("trunk", "vale0:u=1-4094")]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("more than 256 VLANs"), "{e}");
        // default=none: unnamed ports are in no VLAN.
        let v = Vlan::new(&args(&[("default", "none")])).unwrap();
        v.port_added(0, "vale0:x");
        assert_eq!(decide(&v, 0, &bcast(1)).0, DEST_DROP);
        assert_eq!(v.egress(0, 1), Tagging::Skip);
    }
}

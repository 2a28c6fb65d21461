//! `flow`: an ordered match/action table, the OpenFlow-like dataplane of VALE section 3.3.3.
//!
//! A rule matches on the in-port, the Ethernet addresses and type, the VLAN, IPv4 and IPv6
//! addresses (with prefixes), the IP protocol and the TCP/UDP ports, and says what to do with
//! the frames it matches: `output:PORT`, `drop`, `flood` or `normal` (the learning bridge).
//! Among the rules a frame matches, the highest priority wins; among equal priorities, the
//! first added. A frame matching no rule gets the table's default (`normal` unless set).
//! The grammar is in [`parse_rule`] and docs/modules.md.
//!
//! # The classifier
//!
//! Tuple space search: the rules are grouped by mask (which bits of which fields they look
//! at), one hash table per distinct mask maps a masked frame key to the best rule of that
//! mask. A frame is looked up in each table in turn, tables in order of the highest priority
//! they hold, and the search stops as soon as the best rule found outranks every rule of
//! the tables left. So the cost grows with the number of distinct masks, not with the number
//! of rules: a thousand host routes are one table. In front of it, two caches of decisions:
//! back-to-back frames of one flow reuse the previous frame's decision (one key compare), and
//! a per-worker-thread exact-match cache keyed by the frame's key (restricted to the bits
//! some rule looks at) remembers recent decisions when the table has more than a few masks.
//! Behind them, with many masks, prefix tracking ([`prefix`]) skips the tables whose address
//! prefixes a frame cannot match.
//!
//! # Changes under traffic
//!
//! The classifier is immutable: a change builds a new one from the rule list (under a mutex
//! that only the control plane takes) and publishes it with an atomic pointer swap; each
//! batch loads the classifier once, without a lock, and uses that one for all its frames.
//! Each cache entry carries the generation of the classifier that made it, so a new
//! classifier never sees an old decision. A rule's hit counter is shared by every classifier
//! the rule is in, so it survives rebuilds.
//!
//! Ports are named by name in rules (`output:vale0:b`, `in_port=vale0:a`); a rule may name a
//! port that is not on the switch yet. Which index a name has is kept in atomics beside the
//! classifier and updated as ports come and go, so no rebuild is needed then; a frame sent to
//! a named port that is not there is dropped and counted (`no_port`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use vale_abi::control::{FlowRule, FlowTable};
use vale_abi::netmap::NS_NO_LEARN;

use super::{
    check_keys, is_group, Args, FrameMeta, LearningBridge, Lookup, SourcePort, TableArgs,
    DEST_DROP, DEST_FLOOD,
};
use crate::port::PortIndex;
use crate::switch::MAX_PORTS;

mod prefix;
use prefix::{Field, Trie, TRACKED};

/// Most rules one table holds.
pub const MAX_RULES: usize = 200_000;
/// Priority of a rule that names none.
pub const DEFAULT_PRIORITY: u16 = 32768;
/// IPv6 extension headers walked at most to find the upper-layer protocol.
pub const MAX_EXT_HEADERS: usize = 8;
/// Entries of each worker thread's exact-match cache (64 bytes each).
const CACHE_ENTRIES: usize = 2048;
/// Classifiers with at most this many masks are searched directly, without the cache.
const CACHE_ABOVE_MASKS: usize = 2;
/// Classifiers with more masks than this track address prefixes ([`prefix`]): below it, a
/// walk of the tries costs about what probing every table does.
const TRACK_ABOVE_MASKS: usize = 16;

// ---------------------------------------------------------------------------------------
// The key: what a frame is matched on, in seven words.
// ---------------------------------------------------------------------------------------

const WORDS: usize = 7;

/// Word 0: in-port id (bits 0-15), EtherType (16-31), VLAN (32-47: `0x1000 | VID` when
/// tagged, else 0), IP protocol (48-55), presence flags (56-63). Words 1 and 2: source and
/// destination MAC (bits 0-47, first octet lowest) and TCP/UDP source and destination port
/// (48-63). Words 3-4 and 5-6: source and destination address (IPv4 in the low 32 bits of
/// words 3 and 5; IPv6 high half first), numerically.
#[derive(Clone, Copy, Default, Debug)]
struct Key([u64; WORDS]);

/// Word by word, without a branch or a call (a derived compare calls `memcmp`).
impl PartialEq for Key {
    #[inline(always)]
    fn eq(&self, o: &Key) -> bool {
        let mut d = 0;
        for i in 0..WORDS {
            d |= self.0[i] ^ o.0[i];
        }
        d == 0
    }
}

impl Eq for Key {}

const IN_PORT: (usize, u32, u64) = (0, 0, 0xffff);
const DL_TYPE: (usize, u32, u64) = (0, 16, 0xffff);
const VLAN: (usize, u32, u64) = (0, 32, 0xffff);
const NW_PROTO: (usize, u32, u64) = (0, 48, 0xff);
/// The IPv4 or IPv6 header was there (addresses and protocol are in the key).
const F_L3: u64 = 1 << 56;
/// The TCP/UDP ports are in the key (not a later fragment, header within the first slot).
const F_PORTS: u64 = 1 << 57;
const MAC: u64 = 0xffff_ffff_ffff;
const VLAN_PRESENT: u64 = 0x1000;

impl Key {
    #[inline(always)]
    fn and(&self, m: &Key) -> Key {
        let mut k = *self;
        for i in 0..WORDS {
            k.0[i] &= m.0[i];
        }
        k
    }

    /// Four independent 64×64→128-bit multiplies, each folded (high half XOR low half),
    /// XORed together: every input bit reaches every output bit, and the multiplies run in
    /// parallel where a chain of them would wait on each other (the chain cost ~12 ns of
    /// the ~15 ns a table probe took).
    #[inline(always)]
    fn hash64(&self) -> u64 {
        #[inline(always)]
        fn fold(a: u64, b: u64) -> u64 {
            let p = a as u128 * b as u128;
            (p >> 64) as u64 ^ p as u64
        }
        let w = &self.0;
        fold(w[0] ^ 0xa076_1d64_78bd_642f, w[1] ^ 0xe703_7ed1_a0b4_28db)
            ^ fold(w[2] ^ 0x8ebc_6af0_9c88_c6e3, w[3] ^ 0x5899_65cc_7537_4cc3)
            ^ fold(w[4] ^ 0x1d8e_4e27_c47d_124f, w[5] ^ 0x9e37_79b9_7f4a_7c15)
            ^ fold(w[6] ^ 0xbf58_476d_1ce4_e5b9, 0x94d0_49bb_1331_11eb)
    }

    fn set(&mut self, (w, shift, bits): (usize, u32, u64), v: u64) {
        self.0[w] = self.0[w] & !(bits << shift) | (v & bits) << shift;
    }

    fn get(&self, (w, shift, bits): (usize, u32, u64)) -> u64 {
        self.0[w] >> shift & bits
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash64());
    }
}

/// Passes [`Key::hash64`] through: the key hashes itself once.
#[derive(Default)]
struct Pass(u64);

impl Hasher for Pass {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("keys hash as one u64")
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type Map = HashMap<Key, u32, BuildHasherDefault<Pass>>;

/// Byte `at` of the first slot, if it holds it.
#[inline(always)]
fn byte(f: &FrameMeta, at: usize) -> Option<u8> {
    // SAFETY: inside the first `first_len` readable bytes.
    (at < f.first_len as usize).then(|| unsafe { *f.data.add(at) })
}

#[inline(always)]
fn be16(f: &FrameMeta, at: usize) -> Option<u16> {
    f.be16(at as u32)
}

#[inline(always)]
fn be32(f: &FrameMeta, at: usize) -> Option<u32> {
    // SAFETY: inside the first `first_len` readable bytes.
    (at + 4 <= f.first_len as usize).then(|| unsafe {
        u32::from_be_bytes(std::ptr::read_unaligned(f.data.add(at) as *const [u8; 4]))
    })
}

#[inline(always)]
fn be64(f: &FrameMeta, at: usize) -> Option<u64> {
    // SAFETY: inside the first `first_len` readable bytes.
    (at + 8 <= f.first_len as usize).then(|| unsafe {
        u64::from_be_bytes(std::ptr::read_unaligned(f.data.add(at) as *const [u8; 8]))
    })
}

/// The key of frame `f` from the port whose in-port id is `in_id`. Reads nothing past the
/// first slot's `first_len` bytes; whatever is cut short or malformed is left out of the key
/// (its presence flag stays clear), so rules on it do not match.
#[inline(always)]
fn extract(f: &FrameMeta, in_id: u16) -> Key {
    let mut k = Key::default();
    k.0[1] = f.src_mac();
    k.0[2] = f.dst_mac();
    // The engine guarantees 14 bytes: the EtherType is there.
    let mut et = be16(f, 12).unwrap_or(0);
    let mut l3 = 14;
    let mut vlan = 0u64;
    if et == 0x8100 || et == 0x88a8 {
        match (be16(f, 14), be16(f, 16)) {
            (Some(tci), Some(inner)) => {
                vlan = VLAN_PRESENT | (tci & 0xfff) as u64;
                et = inner;
                l3 = 18;
            }
            // A tag cut short: the frame's type is unknown.
            _ => et = 0,
        }
    }
    let mut w0 = in_id as u64 | (et as u64) << 16 | vlan << 32;
    match et {
        0x0800 => w0 |= ipv4(f, l3, &mut k),
        0x86dd => w0 |= ipv6(f, l3, &mut k),
        _ => {}
    }
    k.0[0] = w0;
    k
}

/// Fills the IPv4 fields; returns the protocol and flags for word 0.
#[inline(always)]
fn ipv4(f: &FrameMeta, l3: usize, k: &mut Key) -> u64 {
    let (Some(b0), Some(src), Some(dst), Some(proto), Some(frag)) = (
        byte(f, l3),
        be32(f, l3 + 12),
        be32(f, l3 + 16),
        byte(f, l3 + 9),
        be16(f, l3 + 6),
    ) else {
        return 0;
    };
    let ihl = (b0 & 0xf) as usize * 4;
    if b0 >> 4 != 4 || ihl < 20 {
        return 0;
    }
    k.0[3] = src as u64;
    k.0[5] = dst as u64;
    let mut w = (proto as u64) << 48 | F_L3;
    // Later fragments carry no ports.
    if frag & 0x1fff == 0 {
        w |= ports(f, l3 + ihl, proto, k);
    }
    w
}

/// Fills the IPv6 fields, walking at most [`MAX_EXT_HEADERS`] extension headers; returns the
/// protocol (the upper layer's, or the header where the walk stopped) and flags.
#[inline(always)]
fn ipv6(f: &FrameMeta, l3: usize, k: &mut Key) -> u64 {
    let (Some(b0), Some(nh), Some(s0), Some(s1), Some(d0), Some(d1)) = (
        byte(f, l3),
        byte(f, l3 + 6),
        be64(f, l3 + 8),
        be64(f, l3 + 16),
        be64(f, l3 + 24),
        be64(f, l3 + 32),
    ) else {
        return 0;
    };
    if b0 >> 4 != 6 {
        return 0;
    }
    k.0[3] = s0;
    k.0[4] = s1;
    k.0[5] = d0;
    k.0[6] = d1;
    let mut nh = nh;
    let mut off = l3 + 40;
    for _ in 0..MAX_EXT_HEADERS {
        let len = match nh {
            // Hop-by-hop, routing, destination options: (length + 1) x 8 bytes.
            0 | 43 | 60 => match byte(f, off + 1) {
                Some(l) => (l as usize + 1) * 8,
                None => return (nh as u64) << 48 | F_L3,
            },
            // Fragment: 8 bytes; a later fragment carries no ports.
            44 => match (byte(f, off), be16(f, off + 2)) {
                (Some(next), Some(fo)) if fo & 0xfff8 != 0 => return (next as u64) << 48 | F_L3,
                (Some(_), Some(_)) => 8,
                _ => return (nh as u64) << 48 | F_L3,
            },
            // Authentication header: (length + 2) x 4 bytes.
            51 => match byte(f, off + 1) {
                Some(l) => (l as usize + 2) * 4,
                None => return (nh as u64) << 48 | F_L3,
            },
            _ => return (nh as u64) << 48 | F_L3 | ports(f, off, nh, k),
        };
        match byte(f, off) {
            Some(next) => nh = next,
            None => return (nh as u64) << 48 | F_L3,
        }
        off += len;
    }
    (nh as u64) << 48 | F_L3
}

/// Fills the TCP/UDP ports if the header is in the first slot; returns [`F_PORTS`] then.
#[inline(always)]
fn ports(f: &FrameMeta, l4: usize, proto: u8, k: &mut Key) -> u64 {
    if proto != 6 && proto != 17 {
        return 0;
    }
    match be32(f, l4) {
        Some(p) => {
            k.0[1] |= ((p >> 16) as u64) << 48;
            k.0[2] |= ((p & 0xffff) as u64) << 48;
            F_PORTS
        }
        None => 0,
    }
}

// ---------------------------------------------------------------------------------------
// Rules: their grammar and their canonical text.
// ---------------------------------------------------------------------------------------

/// What a rule does with the frames it matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// To one port, named `valeX:Y`.
    Output(String),
    Drop,
    Flood,
    /// The learning bridge decides.
    Normal,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Action::Output(p) => write!(f, "output:{p}"),
            Action::Drop => f.write_str("drop"),
            Action::Flood => f.write_str("flood"),
            Action::Normal => f.write_str("normal"),
        }
    }
}

/// `output:PORT`, `drop`, `flood`, `normal`.
pub fn parse_action(s: &str) -> Result<Action, String> {
    match s {
        "drop" => Ok(Action::Drop),
        "flood" => Ok(Action::Flood),
        "normal" => Ok(Action::Normal),
        "" => Err("no action after 'actions=' (one of output:PORT, drop, flood, normal)".into()),
        _ => match s.strip_prefix("output:") {
            Some(p) => {
                vale_abi::name::parse_port(p).map_err(|e| format!("output: {e}"))?;
                Ok(Action::Output(p.to_string()))
            }
            None if s.contains(',') => Err(format!(
                "'{s}': a rule has exactly one action (output:PORT, drop, flood or normal)"
            )),
            None => Err(format!(
                "unknown action '{s}' (known: output:PORT, drop, flood, normal)"
            )),
        },
    }
}

/// What a rule matches: the key's value and mask, and the in-port by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    value: Key,
    mask: Key,
    in_port: Option<String>,
}

/// One rule as parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub priority: u16,
    pub matches: Match,
    pub action: Action,
}

fn number(s: &str, max: u64) -> Result<u64, String> {
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse::<u64>(),
    }
    .map_err(|_| format!("'{s}' is not a number"))?;
    if n > max {
        return Err(format!("{n} is out of range (at most {max})"));
    }
    Ok(n)
}

/// `N` or `N/MASK` (both numbers up to `max`).
fn masked_number(s: &str, max: u64) -> Result<(u64, u64), String> {
    match s.split_once('/') {
        Some((v, m)) => {
            let m = number(m, max)?;
            Ok((number(v, max)? & m, m))
        }
        None => Ok((number(s, max)?, max)),
    }
}

/// A MAC address in key order (first octet lowest).
fn mac(s: &str) -> Result<u64, String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("'{s}' is not a MAC address (xx:xx:xx:xx:xx:xx)"));
    }
    let mut v = 0u64;
    for (i, p) in parts.iter().enumerate() {
        let b = (p.len() == 2)
            .then(|| u8::from_str_radix(p, 16).ok())
            .flatten()
            .ok_or_else(|| format!("'{s}' is not a MAC address (xx:xx:xx:xx:xx:xx)"))?;
        v |= (b as u64) << (8 * i);
    }
    Ok(v)
}

fn fmt_mac(v: u64) -> String {
    let b = v.to_le_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5]
    )
}

/// `ADDR[/LEN]` of IPv4 (`v6` false) or IPv6 into 128-bit value and mask; host bits beyond
/// the prefix are cleared.
fn prefix(s: &str, v6: bool) -> Result<(u128, u128), String> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let (addr, bits) = if v6 {
        let a: Ipv6Addr = a
            .parse()
            .map_err(|_| format!("'{a}' is not an IPv6 address"))?;
        (u128::from(a), 128)
    } else {
        let a: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("'{a}' is not an IPv4 address"))?;
        (u32::from(a) as u128, 32)
    };
    let len = match len {
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| *l <= bits)
            .ok_or_else(|| format!("'/{l}' is not a prefix length (0 to {bits})"))?,
        None => bits,
    };
    let mask = if len == 0 {
        0
    } else {
        (u128::MAX << (128 - len)) >> (128 - bits)
    };
    Ok((addr & mask, mask))
}

/// Words `w`, `w + 1` of the key from a 128-bit value (IPv4: low 32 bits in word `w`).
fn put128(k: &mut Key, w: usize, v: u128, v6: bool) {
    if v6 {
        k.0[w] = (v >> 64) as u64;
        k.0[w + 1] = v as u64;
    } else {
        k.0[w] = v as u64;
    }
}

fn get128(k: &Key, w: usize, v6: bool) -> u128 {
    if v6 {
        (k.0[w] as u128) << 64 | k.0[w + 1] as u128
    } else {
        k.0[w] as u128
    }
}

/// The field names of the grammar, with the shorthands.
const FIELDS: &str = "in_port, dl_src, dl_dst, dl_type, dl_vlan, nw_src, nw_dst, ipv6_src, \
ipv6_dst, nw_proto, tp_src, tp_dst; shorthands ip, ipv6, arp, icmp, icmp6, tcp, udp, tcp6, udp6";

/// Sets `field` to `v`, unless it holds another value already (`ip,tcp` is fine, `tcp,udp`
/// is not).
fn agree<T: PartialEq + std::fmt::Display>(
    field: &mut Option<T>,
    v: T,
    name: &str,
) -> Result<(), String> {
    match field {
        Some(old) if *old != v => Err(format!("{name} is given twice ({old} and {v})")),
        _ => {
            *field = Some(v);
            Ok(())
        }
    }
}

/// Parses a match: comma- or space-separated `FIELD=VALUE` and shorthands, with `prio=N`
/// (`priority=N`) among them if `prio` is given somewhere to put it.
fn parse_match(text: &str, mut prio: Option<&mut Option<u16>>) -> Result<Match, String> {
    let mut m = Match::default();
    let mut seen: Vec<&str> = Vec::new();
    let once = |name: &'static str, seen: &mut Vec<&str>| {
        if seen.contains(&name) {
            Err(format!("{name} is given twice"))
        } else {
            seen.push(name);
            Ok(())
        }
    };
    let (mut dl_type, mut proto): (Option<u16>, Option<u8>) = (None, None);
    for tok in text.split([',', ' ', '\t']).filter(|t| !t.is_empty()) {
        let (name, value) = match tok.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (tok, None),
        };
        let shorthand = match name {
            "ip" => Some((0x0800, None)),
            "ipv6" => Some((0x86dd, None)),
            "arp" => Some((0x0806, None)),
            "icmp" => Some((0x0800, Some(1))),
            "tcp" => Some((0x0800, Some(6))),
            "udp" => Some((0x0800, Some(17))),
            "icmp6" => Some((0x86dd, Some(58))),
            "tcp6" => Some((0x86dd, Some(6))),
            "udp6" => Some((0x86dd, Some(17))),
            _ => None,
        };
        if let Some((t, p)) = shorthand {
            if value.is_some() {
                return Err(format!("'{tok}': {name} takes no value"));
            }
            agree(&mut dl_type, t, "dl_type").map_err(|e| format!("'{tok}': {e}"))?;
            if let Some(p) = p {
                agree(&mut proto, p, "nw_proto").map_err(|e| format!("'{tok}': {e}"))?;
            }
            continue;
        }
        let Some(v) = value else {
            return Err(format!("unknown field '{tok}' (known: {FIELDS})"));
        };
        let err = |e: String| format!("'{tok}': {e}");
        match name {
            "prio" | "priority" => {
                let Some(p) = prio.as_deref_mut() else {
                    return Err(format!("'{tok}': no priority here"));
                };
                once("priority", &mut seen).map_err(err)?;
                *p = Some(number(v, u16::MAX as u64).map_err(err)? as u16);
            }
            "in_port" => {
                once("in_port", &mut seen).map_err(err)?;
                vale_abi::name::parse_port(v).map_err(err)?;
                m.in_port = Some(v.to_string());
                m.mask.set(IN_PORT, 0xffff);
            }
            "dl_src" | "dl_dst" => {
                once(
                    if name == "dl_src" { "dl_src" } else { "dl_dst" },
                    &mut seen,
                )
                .map_err(err)?;
                let (val, msk) = match v.split_once('/') {
                    Some((a, b)) => (mac(a).map_err(err)?, mac(b).map_err(err)?),
                    None => (mac(v).map_err(err)?, MAC),
                };
                let w = if name == "dl_src" { 1 } else { 2 };
                m.value.0[w] |= val & msk;
                m.mask.0[w] |= msk;
            }
            "dl_type" => {
                let t = number(v, 0xffff).map_err(err)? as u16;
                agree(&mut dl_type, t, "dl_type").map_err(err)?;
            }
            "dl_vlan" => {
                once("dl_vlan", &mut seen).map_err(err)?;
                if v == "none" {
                    m.mask.set(VLAN, VLAN_PRESENT);
                } else {
                    let vid = number(v, 4095).map_err(err)?;
                    m.value.set(VLAN, VLAN_PRESENT | vid);
                    m.mask.set(VLAN, VLAN_PRESENT | 0xfff);
                }
            }
            "nw_src" | "nw_dst" | "ipv6_src" | "ipv6_dst" => {
                let field = match name {
                    "nw_src" => "nw_src",
                    "nw_dst" => "nw_dst",
                    "ipv6_src" => "ipv6_src",
                    _ => "ipv6_dst",
                };
                once(field, &mut seen).map_err(err)?;
                let v6 = name.starts_with("ipv6");
                let (val, msk) = prefix(v, v6).map_err(err)?;
                let w = if name.ends_with("src") { 3 } else { 5 };
                put128(&mut m.value, w, val, v6);
                put128(&mut m.mask, w, msk, v6);
                m.value.0[0] |= F_L3;
                m.mask.0[0] |= F_L3;
            }
            "nw_proto" => {
                let p = number(v, 255).map_err(err)? as u8;
                agree(&mut proto, p, "nw_proto").map_err(err)?;
            }
            "tp_src" | "tp_dst" => {
                once(
                    if name == "tp_src" { "tp_src" } else { "tp_dst" },
                    &mut seen,
                )
                .map_err(err)?;
                let (val, msk) = masked_number(v, 0xffff).map_err(err)?;
                let w = if name == "tp_src" { 1 } else { 2 };
                m.value.0[w] |= val << 48;
                m.mask.0[w] |= msk << 48;
                m.value.0[0] |= F_PORTS;
                m.mask.0[0] |= F_PORTS;
            }
            _ => return Err(format!("unknown field '{name}' (known: {FIELDS})")),
        }
    }
    // Prerequisites, as in OpenFlow: a field means something only under its protocol.
    let ip4 = dl_type == Some(0x0800);
    let ip6 = dl_type == Some(0x86dd);
    if seen.iter().any(|f| *f == "nw_src" || *f == "nw_dst") && !ip4 {
        return Err("nw_src and nw_dst need ip (dl_type=0x0800)".into());
    }
    if seen.iter().any(|f| *f == "ipv6_src" || *f == "ipv6_dst") && !ip6 {
        return Err("ipv6_src and ipv6_dst need ipv6 (dl_type=0x86dd)".into());
    }
    if proto.is_some() && !ip4 && !ip6 {
        return Err("nw_proto needs ip or ipv6 (dl_type=0x0800 or 0x86dd)".into());
    }
    if seen.iter().any(|f| *f == "tp_src" || *f == "tp_dst") && !matches!(proto, Some(6 | 17)) {
        return Err("tp_src and tp_dst need tcp or udp (nw_proto=6 or 17)".into());
    }
    if let Some(t) = dl_type {
        m.value.set(DL_TYPE, t as u64);
        m.mask.set(DL_TYPE, 0xffff);
    }
    if let Some(p) = proto {
        m.value.set(NW_PROTO, p as u64);
        m.mask.set(NW_PROTO, 0xff);
        m.value.0[0] |= F_L3;
        m.mask.0[0] |= F_L3;
    }
    Ok(m)
}

/// Parses one rule: `[prio=N] [MATCH] actions=ACTION`, where MATCH is comma- or
/// space-separated fields (see docs/modules.md) and ACTION one of `output:PORT`, `drop`,
/// `flood`, `normal`. `prio` may stand anywhere before `actions=`; the default is 32768.
pub fn parse_rule(text: &str) -> Result<Rule, String> {
    let text = text.trim();
    let Some(at) = text.find("actions=") else {
        return Err("no 'actions=' (a rule is '[prio=N] MATCH actions=ACTION')".into());
    };
    let (head, action) = (&text[..at], text[at + "actions=".len()..].trim());
    if !head.is_empty() && !head.ends_with([' ', ',', '\t']) {
        return Err(format!("'{}' runs into 'actions='", head.trim()));
    }
    let mut prio = None;
    let matches = parse_match(head, Some(&mut prio))?;
    Ok(Rule {
        priority: prio.unwrap_or(DEFAULT_PRIORITY),
        matches,
        action: parse_action(action)?,
    })
}

/// The canonical text of a match: what `dump` shows; [`parse_match`] reads it back.
pub fn render_match(m: &Match) -> String {
    let (v, k) = (&m.value, &m.mask);
    let mut out: Vec<String> = Vec::new();
    let dl_type = (k.get(DL_TYPE) != 0).then(|| v.get(DL_TYPE));
    let proto = (k.get(NW_PROTO) != 0).then(|| v.get(NW_PROTO));
    let mut proto_done = true;
    match (dl_type, proto) {
        (Some(0x0800), Some(1)) => out.push("icmp".into()),
        (Some(0x0800), Some(6)) => out.push("tcp".into()),
        (Some(0x0800), Some(17)) => out.push("udp".into()),
        (Some(0x86dd), Some(58)) => out.push("icmp6".into()),
        (Some(0x86dd), Some(6)) => out.push("tcp6".into()),
        (Some(0x86dd), Some(17)) => out.push("udp6".into()),
        (Some(t), _) => {
            out.push(match t {
                0x0800 => "ip".into(),
                0x86dd => "ipv6".into(),
                0x0806 => "arp".into(),
                t => format!("dl_type=0x{t:04x}"),
            });
            proto_done = false;
        }
        (None, _) => proto_done = false,
    }
    if let (Some(p), false) = (proto, proto_done) {
        out.push(format!("nw_proto={p}"));
    }
    if let Some(p) = &m.in_port {
        out.push(format!("in_port={p}"));
    }
    for (name, w) in [("dl_src", 1), ("dl_dst", 2)] {
        let msk = k.0[w] & MAC;
        if msk == MAC {
            out.push(format!("{name}={}", fmt_mac(v.0[w] & MAC)));
        } else if msk != 0 {
            out.push(format!("{name}={}/{}", fmt_mac(v.0[w] & MAC), fmt_mac(msk)));
        }
    }
    match k.get(VLAN) {
        0 => {}
        VLAN_PRESENT => out.push("dl_vlan=none".into()),
        _ => out.push(format!("dl_vlan={}", v.get(VLAN) & 0xfff)),
    }
    let v6 = dl_type == Some(0x86dd);
    // A /0 prefix only asks for the IP header to be there.
    let l3_only = k.0[0] & F_L3 != 0 && proto.is_none() && (3..WORDS).all(|w| k.0[w] == 0);
    for (name, w) in [("src", 3), ("dst", 5)] {
        let msk = get128(k, w, v6);
        if msk == 0 && !(l3_only && name == "src") {
            continue;
        }
        let val = get128(v, w, v6);
        if v6 {
            out.push(format!(
                "ipv6_{name}={}/{}",
                Ipv6Addr::from(val),
                msk.count_ones()
            ));
        } else {
            out.push(format!(
                "nw_{name}={}/{}",
                Ipv4Addr::from(val as u32),
                msk.count_ones()
            ));
        }
    }
    let ports_only = k.0[0] & F_PORTS != 0 && k.0[1] >> 48 == 0 && k.0[2] >> 48 == 0;
    for (name, w) in [("tp_src", 1), ("tp_dst", 2)] {
        let msk = k.0[w] >> 48;
        if ports_only && name == "tp_src" {
            out.push("tp_src=0/0x0000".into());
        } else if msk == 0xffff {
            out.push(format!("{name}={}", v.0[w] >> 48));
        } else if msk != 0 {
            out.push(format!("{name}={}/0x{msk:04x}", v.0[w] >> 48));
        }
    }
    out.join(",")
}

// ---------------------------------------------------------------------------------------
// The classifier.
// ---------------------------------------------------------------------------------------

/// No port: an index no port has.
const NO_PORT: u16 = u16::MAX;
/// A decision of no rule (the default applies), as a rule index.
const MISS: u32 = 0xff_ffff;

#[derive(Clone, Copy)]
enum Out {
    /// To the port of name id.
    Port(u16),
    Drop,
    Flood,
    Normal,
}

struct Subtable {
    mask: Key,
    /// Rank of the best rule in it.
    max_rank: u64,
    map: Map,
    /// The distinct word-0 values (type, protocol, VLAN, in-port) of its rules when there
    /// are at most [`HEADS`] of them (else `heads_known` is 0): a frame whose word 0 is none
    /// of them skips the table without hashing (a `tcp` table for a UDP frame).
    heads: [u64; HEADS],
    heads_known: u8,
}

const HEADS: usize = 4;

impl Subtable {
    /// The best rule of this table for `k`.
    #[inline(always)]
    fn probe(&self, k: &Key) -> Option<u32> {
        let m = k.and(&self.mask);
        let n = self.heads_known as usize;
        if n != 0 && !self.heads[..n].contains(&m.0[0]) {
            return None;
        }
        self.map.get(&m).copied()
    }

    /// Fills `heads` once the map is complete.
    fn note_heads(&mut self) {
        let mut heads = Vec::with_capacity(HEADS + 1);
        for k in self.map.keys() {
            if !heads.contains(&k.0[0]) {
                heads.push(k.0[0]);
                if heads.len() > HEADS {
                    return;
                }
            }
        }
        self.heads[..heads.len()].copy_from_slice(&heads);
        self.heads_known = heads.len() as u8;
    }
}

/// Prefix tracking ([`prefix`]), on classifiers with many masks.
struct Tracking {
    /// The address fields some table has a prefix length on, each with its trie.
    tries: Vec<(Field, Trie)>,
    /// By table: what its rules need of the frame's address fields, as (trie, length)
    /// pairs; [`NO_TRIE`] where a table has no length on a field.
    need: Vec<[(u8, u8); 2]>,
    /// The trie the tables are indexed by.
    index: usize,
    /// Tables by their length on the index trie (0: none), each list in search order.
    by_length: Vec<Vec<u32>>,
}

/// A need that every frame meets: `lengths[NO_TRIE]` has bit 0 set.
const NO_TRIE: (u8, u8) = (TRACKED as u8, 1);

impl Tracking {
    /// Tracking for `subtables` (already in search order), or `None` if no table has a
    /// prefix length on any address field.
    fn new(subtables: &[Subtable], rules: &[Entry]) -> Option<Tracking> {
        let fields: Vec<Field> = Field::ALL
            .into_iter()
            .filter(|f| subtables.iter().any(|st| f.length(&st.mask.0).is_some()))
            .collect();
        if fields.is_empty() {
            return None;
        }
        let tries = fields
            .iter()
            .map(|&f| {
                let prefixes = rules
                    .iter()
                    .filter_map(|e| {
                        let m = &e.rule.matches;
                        f.length(&m.mask.0).map(|l| (f.of(&m.value.0), l))
                    })
                    .collect();
                (f, Trie::new(prefixes))
            })
            .collect::<Vec<_>>();
        let need: Vec<[(u8, u8); 2]> = subtables
            .iter()
            .map(|st| {
                let mut need = [NO_TRIE; 2];
                let lengths = fields
                    .iter()
                    .enumerate()
                    .filter_map(|(t, f)| f.length(&st.mask.0).map(|l| (t as u8, l)));
                // A mask has a length on at most one source and one destination field.
                for (slot, n) in need.iter_mut().zip(lengths) {
                    *slot = n;
                }
                need
            })
            .collect();
        // Index by the trie whose lengths split the tables into the most lists.
        let index = (0..fields.len())
            .max_by_key(|&t| {
                let mut seen = [false; 129];
                for n in need.iter().flatten().filter(|n| n.0 as usize == t) {
                    seen[n.1 as usize] = true;
                }
                seen.iter().filter(|&&x| x).count()
            })
            .unwrap_or(0);
        let mut by_length = vec![Vec::new(); 129];
        for (s, n) in need.iter().enumerate() {
            let l = n.iter().find(|n| n.0 as usize == index).map_or(0, |n| n.1);
            by_length[l as usize].push(s as u32);
        }
        Some(Tracking {
            tries,
            need,
            index,
            by_length,
        })
    }
}

struct Compiled {
    rank: u64,
    out: Out,
    hits: Arc<AtomicU64>,
}

/// The immutable table the workers search.
struct Classifier {
    /// Unique among all classifiers of the process: tags cache entries.
    gen: u64,
    subtables: Vec<Subtable>,
    tracking: Option<Tracking>,
    rules: Vec<Compiled>,
    /// Every bit some rule looks at: the cache's key is the frame's key masked by it.
    union: Key,
    default: Out,
    default_text: String,
    /// Port names the rules (and the default) use, by name id.
    names: Vec<String>,
    /// By name id: the port's index, or [`NO_PORT`].
    out_port: Box<[AtomicU16]>,
    /// By port index: the port's name id + 1, or 0 if no rule names it.
    in_id: Box<[AtomicU16]>,
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A rule of the table, as the control plane keeps it.
struct Entry {
    id: u64,
    /// Order of addition: ties of priority go to the first added.
    seq: u64,
    rule: Rule,
    hits: Arc<AtomicU64>,
}

impl Entry {
    /// Higher wins; unique.
    fn rank(&self) -> u64 {
        (self.rule.priority as u64) << 40 | ((1 << 40) - 1 - (self.seq & ((1 << 40) - 1)))
    }
}

impl Classifier {
    fn build(rules: &[Entry], default_text: &Action, ports: &HashMap<String, PortIndex>) -> Self {
        let mut names: Vec<String> = Vec::new();
        let mut name_id = |n: &str| -> u16 {
            match names.iter().position(|x| x == n) {
                Some(i) => i as u16,
                None => {
                    names.push(n.to_string());
                    (names.len() - 1) as u16
                }
            }
        };
        let out_of = |a: &Action, name_id: &mut dyn FnMut(&str) -> u16| match a {
            Action::Output(p) => Out::Port(name_id(p)),
            Action::Drop => Out::Drop,
            Action::Flood => Out::Flood,
            Action::Normal => Out::Normal,
        };
        let default = out_of(default_text, &mut name_id);
        let mut by_mask: HashMap<Key, usize, BuildHasherDefault<Pass>> = HashMap::default();
        let mut subtables: Vec<Subtable> = Vec::new();
        let mut compiled = Vec::with_capacity(rules.len());
        let mut union = Key::default();
        for (i, e) in rules.iter().enumerate() {
            let m = &e.rule.matches;
            let mut value = m.value;
            if let Some(p) = &m.in_port {
                value.set(IN_PORT, name_id(p) as u64 + 1);
            }
            let rank = e.rank();
            compiled.push(Compiled {
                rank,
                out: out_of(&e.rule.action, &mut name_id),
                hits: e.hits.clone(),
            });
            for w in 0..WORDS {
                union.0[w] |= m.mask.0[w];
            }
            let s = *by_mask.entry(m.mask).or_insert_with(|| {
                subtables.push(Subtable {
                    mask: m.mask,
                    max_rank: 0,
                    map: Map::default(),
                    heads: [0; HEADS],
                    heads_known: 0,
                });
                subtables.len() - 1
            });
            let st = &mut subtables[s];
            st.max_rank = st.max_rank.max(rank);
            let slot = st.map.entry(value.and(&m.mask)).or_insert(i as u32);
            if compiled[*slot as usize].rank < rank {
                *slot = i as u32;
            }
        }
        subtables.sort_by_key(|s| std::cmp::Reverse(s.max_rank));
        for st in subtables.iter_mut() {
            st.note_heads();
        }
        let tracking = if subtables.len() > TRACK_ABOVE_MASKS {
            Tracking::new(&subtables, rules)
        } else {
            None
        };
        let c = Classifier {
            gen: GENERATION.fetch_add(1, Relaxed),
            subtables,
            tracking,
            rules: compiled,
            union,
            default,
            default_text: default_text.to_string(),
            out_port: (0..names.len()).map(|_| AtomicU16::new(NO_PORT)).collect(),
            in_id: (0..MAX_PORTS).map(|_| AtomicU16::new(0)).collect(),
            names,
        };
        for (name, &index) in ports {
            c.port_added(index, name);
        }
        c
    }

    fn port_added(&self, index: PortIndex, name: &str) {
        let (Some(id), Some(slot)) = (
            self.names.iter().position(|n| n == name),
            self.in_id.get(index as usize),
        ) else {
            return;
        };
        slot.store(id as u16 + 1, Relaxed);
        self.out_port[id].store(index, Relaxed);
    }

    fn port_removed(&self, index: PortIndex) {
        if let Some(slot) = self.in_id.get(index as usize) {
            slot.store(0, Relaxed);
        }
        for p in self.out_port.iter() {
            if p.load(Relaxed) == index {
                p.store(NO_PORT, Relaxed);
            }
        }
    }

    /// The best rule for `k` (already masked by `union`), or [`MISS`]: tuple space search.
    #[inline]
    fn search(&self, k: &Key) -> u32 {
        if let Some(t) = &self.tracking {
            return self.search_tracked(k, t);
        }
        let (mut best, mut best_rank) = (MISS, 0u64);
        for st in &self.subtables {
            if st.max_rank <= best_rank {
                // Sorted: no table left holds a better rule.
                break;
            }
            if let Some(r) = st.probe(k) {
                let rank = self.rules[r as usize].rank;
                if rank > best_rank {
                    (best, best_rank) = (r, rank);
                }
            }
        }
        best
    }

    /// [`Self::search`] over only the tables whose address prefix lengths `k` matches.
    fn search_tracked(&self, k: &Key, t: &Tracking) -> u32 {
        let mut lengths = [0u128; TRACKED + 1];
        lengths[TRACKED] = 1;
        for (i, (field, trie)) in t.tries.iter().enumerate() {
            lengths[i] = trie.lengths(field.of(&k.0));
        }
        let (mut best, mut best_rank) = (MISS, 0u64);
        let mut visit = |list: &[u32]| {
            for &s in list {
                let st = &self.subtables[s as usize];
                if st.max_rank <= best_rank {
                    // Each list is in search order: nothing better further on in it.
                    break;
                }
                let [(a, la), (b, lb)] = t.need[s as usize];
                if lengths[a as usize] >> (la - 1) & lengths[b as usize] >> (lb - 1) & 1 == 0 {
                    continue;
                }
                if let Some(r) = st.probe(k) {
                    let rank = self.rules[r as usize].rank;
                    if rank > best_rank {
                        (best, best_rank) = (r, rank);
                    }
                }
            }
        };
        visit(&t.by_length[0]);
        let mut matched = lengths[t.index];
        while matched != 0 {
            visit(&t.by_length[matched.trailing_zeros() as usize + 1]);
            matched &= matched - 1;
        }
        best
    }
}

/// One entry of a worker thread's exact-match cache: a key and the decision of the
/// classifier of generation `tag >> 24` for it (rule index in the low 24 bits).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Cached {
    key: Key,
    tag: u64,
}

thread_local! {
    /// Each forwarding thread's own cache: no sharing, no atomics. Entries of another
    /// classifier (another generation) are never taken.
    static CACHE: std::cell::RefCell<Box<[Cached]>> = std::cell::RefCell::new(
        vec![Cached { key: Key::default(), tag: 0 }; CACHE_ENTRIES].into_boxed_slice()
    );
}

// ---------------------------------------------------------------------------------------
// The module.
// ---------------------------------------------------------------------------------------

/// What the control plane keeps: the rules in order of addition, the ports on the switch.
struct Table {
    rules: Vec<Entry>,
    next_id: u64,
    next_seq: u64,
    default: Action,
    ports: HashMap<String, PortIndex>,
}

pub struct Flow {
    current: ArcSwap<Classifier>,
    table: Mutex<Table>,
    bridge: LearningBridge,
    missed: AtomicU64,
    no_port: AtomicU64,
    rebuilds: AtomicU64,
}

/// A line of rules text: its number and text, skipping blanks and `#` comments.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Parses every rule of `text` (one a line); the first bad one fails them all, named by its
/// line and text.
pub fn parse_rules(text: &str) -> Result<Vec<Rule>, String> {
    let mut out = Vec::new();
    for (n, line) in lines(text) {
        if out.len() >= MAX_RULES {
            return Err(format!("more than {MAX_RULES} rules (line {n})"));
        }
        let rule = parse_rule(line).map_err(|e| format!("bad rule at line {n}, '{line}': {e}"))?;
        out.push(rule);
    }
    Ok(out)
}

impl Flow {
    /// Arguments: `rules=TEXT` (one rule a line), `default=normal|drop|flood|output:PORT`,
    /// `entries=N` and `age=S` (the learning table of `normal`, as `learning`'s).
    pub fn make(args: &Args) -> Result<Box<dyn Lookup>, String> {
        Ok(Box::new(Flow::new(args)?))
    }

    pub fn new(args: &Args) -> Result<Flow, String> {
        check_keys("flow", args, &["rules", "default", "entries", "age"])?;
        let default = match args.iter().rev().find(|(k, _)| k == "default") {
            Some((_, v)) => parse_action(v).map_err(|e| format!("default: {e}"))?,
            None => Action::Normal,
        };
        let bridge = TableArgs::of(args, LearningBridge::DEFAULT_ENTRIES)?.table();
        let mut rules = Vec::new();
        for (_, text) in args.iter().filter(|(k, _)| k == "rules") {
            rules.extend(parse_rules(text)?);
            if rules.len() > MAX_RULES {
                return Err(format!("more than {MAX_RULES} rules"));
            }
        }
        let mut table = Table {
            rules: Vec::new(),
            next_id: 1,
            next_seq: 0,
            default,
            ports: HashMap::new(),
        };
        table.push(rules);
        let c = Classifier::build(&table.rules, &table.default, &table.ports);
        Ok(Flow {
            current: ArcSwap::from_pointee(c),
            table: Mutex::new(table),
            bridge,
            missed: AtomicU64::new(0),
            no_port: AtomicU64::new(0),
            rebuilds: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Builds the classifier of `t` and makes it the one the workers use. Called with the
    /// table's lock held, so ports cannot change meanwhile.
    fn publish(&self, t: &Table) {
        self.current
            .store(Arc::new(Classifier::build(&t.rules, &t.default, &t.ports)));
        self.rebuilds.fetch_add(1, Relaxed);
    }

    /// Every port name the rules and the default use.
    pub fn port_names(&self) -> Vec<String> {
        self.current.load().names.clone()
    }

    /// Adds the rules of `text` (one a line): all, or none with an error naming the first
    /// bad one. `check` sees every port name they use first and may refuse them. Returns
    /// them with their ids.
    pub fn add(
        &self,
        text: &str,
        check: impl FnOnce(&[String]) -> Result<(), String>,
    ) -> Result<Vec<FlowRule>, String> {
        let rules = parse_rules(text)?;
        if rules.is_empty() {
            return Err("no rule given".into());
        }
        let mut names: Vec<String> = Vec::new();
        for r in &rules {
            let out = match &r.action {
                Action::Output(p) => Some(p),
                _ => None,
            };
            for n in r.matches.in_port.iter().chain(out) {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
        check(&names)?;
        let mut t = self.lock();
        if t.rules.len() + rules.len() > MAX_RULES {
            return Err(format!(
                "the table holds {} rules; {} more would pass the limit of {MAX_RULES}",
                t.rules.len(),
                rules.len()
            ));
        }
        let first = t.rules.len();
        t.push(rules);
        self.publish(&t);
        Ok(t.rules[first..].iter().map(view).collect())
    }

    /// Deletes by `selector`: a rule id (`7`, `id=7`), or a match (with `prio=N` or not)
    /// naming every rule whose match is exactly that (and priority that). At least one rule
    /// must go.
    pub fn del(&self, selector: &str) -> Result<Vec<FlowRule>, String> {
        let s = selector.trim();
        let by_id = s.strip_prefix("id=").unwrap_or(s);
        let mut t = self.lock();
        let gone: Vec<usize> = if !by_id.is_empty() && by_id.bytes().all(|b| b.is_ascii_digit()) {
            let id: u64 = by_id
                .parse()
                .map_err(|_| format!("'{s}' is not a rule id"))?;
            let i = t
                .rules
                .iter()
                .position(|e| e.id == id)
                .ok_or_else(|| format!("no rule with id {id}"))?;
            vec![i]
        } else {
            if s.contains("actions=") {
                return Err(format!(
                    "'{s}': del takes a rule id or a match, without actions"
                ));
            }
            let mut prio = None;
            let m = parse_match(s, Some(&mut prio)).map_err(|e| format!("'{s}': {e}"))?;
            let v: Vec<usize> = t
                .rules
                .iter()
                .enumerate()
                .filter(|(_, e)| e.rule.matches == m && prio.is_none_or(|p| e.rule.priority == p))
                .map(|(i, _)| i)
                .collect();
            if v.is_empty() {
                return Err(format!("no rule has exactly the match '{s}'"));
            }
            v
        };
        let mut out = Vec::new();
        for &i in gone.iter().rev() {
            out.push(view(&t.rules.remove(i)));
        }
        out.reverse();
        self.publish(&t);
        Ok(out)
    }

    /// Every rule, in the order they are tried, with hit counters.
    pub fn dump(&self, switch: &str) -> FlowTable {
        let t = self.lock();
        let mut order: Vec<&Entry> = t.rules.iter().collect();
        order.sort_by_key(|e| std::cmp::Reverse(e.rank()));
        FlowTable {
            rules: order.into_iter().map(view).collect(),
            ..self.summary(switch)
        }
    }

    /// A page of [`Flow::dump`]: at most `max` rules (at least one), in the order they are
    /// tried, starting after the rule at position `after` (0: from the first). `next` is the
    /// position of the page's last rule when more follow. Each page costs one pass over the
    /// table under its lock (no sort of the whole table), so a dump page by page never holds
    /// the control plane for long, nor more than a page in memory.
    pub fn dump_page(&self, switch: &str, after: u64, max: usize) -> FlowTable {
        let t = self.lock();
        let mut page: Vec<&Entry> = t
            .rules
            .iter()
            .filter(|e| after == 0 || e.rank() < after)
            .collect();
        let max = max.max(1);
        let more = page.len() > max;
        if more {
            page.select_nth_unstable_by_key(max - 1, |e| std::cmp::Reverse(e.rank()));
            page.truncate(max);
        }
        page.sort_by_key(|e| std::cmp::Reverse(e.rank()));
        FlowTable {
            next: page.last().filter(|_| more).map(|e| e.rank()),
            rules: page.into_iter().map(view).collect(),
            ..self.summary(switch)
        }
    }

    /// The table's default and misses, without its rules.
    pub fn summary(&self, switch: &str) -> FlowTable {
        FlowTable {
            switch: switch.to_string(),
            default: self.current.load().default_text.clone(),
            missed: self.missed.load(Relaxed),
            rules: Vec::new(),
            next: None,
        }
    }

    /// How many rules the table holds.
    pub fn len(&self) -> usize {
        self.current.load().rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
impl Flow {
    fn add_text(&self, text: &str) -> Result<Vec<FlowRule>, String> {
        self.add(text, |_| Ok(()))
    }
}

impl Table {
    fn push(&mut self, rules: Vec<Rule>) {
        for rule in rules {
            self.rules.push(Entry {
                id: self.next_id,
                seq: self.next_seq,
                rule,
                hits: Arc::new(AtomicU64::new(0)),
            });
            self.next_id += 1;
            self.next_seq += 1;
        }
    }
}

fn view(e: &Entry) -> FlowRule {
    FlowRule {
        id: e.id,
        priority: e.rule.priority,
        matches: render_match(&e.rule.matches),
        actions: e.rule.action.to_string(),
        hits: e.hits.load(Relaxed),
    }
}

impl Lookup for Flow {
    fn name(&self) -> &str {
        "flow"
    }

    fn lookup(&self, src: SourcePort, frames: &mut [FrameMeta], now_s: u32) -> u64 {
        let c = self.current.load();
        self.bridge.tick(now_s);
        let in_id = c
            .in_id
            .get(src.index as usize)
            .map_or(0, |x| x.load(Relaxed));
        let cached = c.subtables.len() > CACHE_ABOVE_MASKS;
        let (mut refused, mut missed, mut no_port) = (0u64, 0u64, 0u64);
        let mut last_learnt = u64::MAX;
        // The previous frame's key and decision, and how many frames in a row it decided.
        let (mut prev, mut prev_rule, mut run) = (Key([u64::MAX; WORDS]), MISS, 0u64);
        let count = |rule: u32, n: u64, missed: &mut u64| {
            if n == 0 {
                return;
            }
            match c.rules.get(rule as usize) {
                Some(r) => {
                    r.hits.fetch_add(n, Relaxed);
                }
                None => *missed += n,
            }
        };
        CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            for f in frames.iter_mut() {
                let k = extract(f, in_id).and(&c.union);
                let rule = if k == prev {
                    run += 1;
                    prev_rule
                } else {
                    count(prev_rule, run, &mut missed);
                    let rule = if cached {
                        let h = k.hash64();
                        let e = &mut cache[(h as usize) & (CACHE_ENTRIES - 1)];
                        if e.tag >> 24 == c.gen && e.key == k {
                            (e.tag & 0xff_ffff) as u32
                        } else {
                            let r = c.search(&k);
                            *e = Cached {
                                key: k,
                                tag: c.gen << 24 | r as u64,
                            };
                            r
                        }
                    } else {
                        c.search(&k)
                    };
                    (prev, prev_rule, run) = (k, rule, 1);
                    rule
                };
                let out = c.rules.get(rule as usize).map_or(c.default, |r| r.out);
                f.dst = match out {
                    Out::Port(id) => match c.out_port[id as usize].load(Relaxed) {
                        NO_PORT => {
                            no_port += 1;
                            DEST_DROP
                        }
                        p => p,
                    },
                    Out::Drop => DEST_DROP,
                    Out::Flood => DEST_FLOOD,
                    Out::Normal => {
                        let s = f.src_mac();
                        if s != last_learnt && !is_group(s) && f.flags & NS_NO_LEARN == 0 {
                            if !self.bridge.learn(s, src.index, src.learn_limit, now_s) {
                                refused += 1;
                            }
                            last_learnt = s;
                        }
                        let d = f.dst_mac();
                        if is_group(d) {
                            DEST_FLOOD
                        } else {
                            self.bridge.find(d, now_s).unwrap_or(DEST_FLOOD)
                        }
                    }
                };
            }
        });
        count(prev_rule, run, &mut missed);
        if missed != 0 {
            self.missed.fetch_add(missed, Relaxed);
        }
        if no_port != 0 {
            self.no_port.fetch_add(no_port, Relaxed);
        }
        refused
    }

    fn port_added(&self, port: PortIndex, name: &str) {
        let mut t = self.lock();
        t.ports.retain(|_, i| *i != port);
        t.ports.insert(name.to_string(), port);
        self.current.load().port_added(port, name);
    }

    fn port_removed(&self, port: PortIndex) {
        let mut t = self.lock();
        t.ports.retain(|_, i| *i != port);
        self.current.load().port_removed(port);
        self.bridge.port_removed(port);
    }

    fn learnt(&self, port: PortIndex) -> Option<u32> {
        self.bridge.learnt(port)
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let c = self.current.load();
        vec![
            ("rules".into(), c.rules.len() as u64),
            ("masks".into(), c.subtables.len() as u64),
            ("missed".into(), self.missed.load(Relaxed)),
            ("no_port".into(), self.no_port.load(Relaxed)),
            ("rebuilds".into(), self.rebuilds.load(Relaxed)),
            (
                "tracked_fields".into(),
                c.tracking.as_ref().map_or(0, |t| t.tries.len() as u64),
            ),
        ]
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u8 = 0xa;
    const B: u8 = 0xb;

    fn args(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A flow table with `rules`, ports vale0:p0..p3 at indices 0..3.
    fn table(rules: &str) -> Flow {
        let f = Flow::new(&args(&[("rules", rules)])).unwrap();
        for i in 0..4u16 {
            f.port_added(i, &format!("vale0:p{i}"));
        }
        f
    }

    fn eth(dst: u8, src: u8, ty: u16) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, dst, 2, 0, 0, 0, 0, src];
        f.extend_from_slice(&ty.to_be_bytes());
        f
    }

    /// Ethernet + IPv4 (`proto`) + 4 bytes of ports, padded to 60.
    fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut f = eth(B, A, 0x0800);
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, proto, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.resize(60, 0);
        f
    }

    /// Ethernet + IPv6 with extension headers `ext` (next header, bytes) then `proto` ports.
    fn v6(src: Ipv6Addr, dst: Ipv6Addr, ext: &[(u8, Vec<u8>)], proto: u8, dport: u16) -> Vec<u8> {
        let mut f = eth(B, A, 0x86dd);
        let first = ext.first().map_or(proto, |e| e.0);
        f.extend_from_slice(&[0x60, 0, 0, 0, 0, 0, first, 64]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        for (i, (_, body)) in ext.iter().enumerate() {
            let next = ext.get(i + 1).map_or(proto, |e| e.0);
            let mut b = body.clone();
            b[0] = next;
            f.extend_from_slice(&b);
        }
        f.extend_from_slice(&1000u16.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.resize(f.len().max(60), 0);
        f
    }

    fn tag(f: &[u8], vid: u16) -> Vec<u8> {
        let mut f = f.to_vec();
        f.splice(12..12, [0x81, 0x00, (vid >> 8) as u8, vid as u8]);
        f
    }

    fn port(index: PortIndex) -> SourcePort {
        SourcePort {
            index,
            ring: 0,
            learn_limit: LearningBridge::DEFAULT_LEARN_LIMIT,
        }
    }

    /// Where `frame` from port `from` goes, its first slot cut at `first_len`.
    fn decide_cut(t: &Flow, from: PortIndex, frame: &[u8], first_len: usize) -> u16 {
        let mut m = [FrameMeta::new(
            frame.as_ptr(),
            first_len as u32,
            frame.len() as u32,
            0,
        )];
        t.lookup(port(from), &mut m, 1);
        m[0].dst
    }

    fn decide(t: &Flow, from: PortIndex, frame: &[u8]) -> u16 {
        decide_cut(t, from, frame, frame.len())
    }

    fn hits(t: &Flow) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = t
            .dump("vale0")
            .rules
            .iter()
            .map(|r| (r.id, r.hits))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_grammar_reads_good_rules() {
        let r = parse_rule("prio=10 ip,nw_dst=10.1.2.3/8,tcp,tp_dst=22 actions=drop").unwrap();
        assert_eq!(r.priority, 10);
        assert_eq!(r.action, Action::Drop);
        assert_eq!(render_match(&r.matches), "tcp,nw_dst=10.0.0.0/8,tp_dst=22");
        let cases = [
            ("actions=normal", "", DEFAULT_PRIORITY, "normal"),
            ("priority=0,actions=flood", "", 0, "flood"),
            (
                "in_port=vale0:a dl_src=02:00:00:00:00:0a actions=output:vale0:b",
                "in_port=vale0:a,dl_src=02:00:00:00:00:0a",
                DEFAULT_PRIORITY,
                "output:vale0:b",
            ),
            (
                "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00,actions=drop",
                "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "dl_type=0x88b5 actions=drop",
                "dl_type=0x88b5",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "dl_vlan=10 actions=drop",
                "dl_vlan=10",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "dl_vlan=none actions=drop",
                "dl_vlan=none",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "ip,nw_proto=47 actions=drop",
                "ip,nw_proto=47",
                DEFAULT_PRIORITY,
                "drop",
            ),
            ("arp actions=flood", "arp", DEFAULT_PRIORITY, "flood"),
            (
                "udp6,ipv6_src=2001:db8::1/32,tp_src=53 actions=drop",
                "udp6,ipv6_src=2001:db8::/32,tp_src=53",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "ipv6,ipv6_dst=fe80::1 actions=drop",
                "ipv6,ipv6_dst=fe80::1/128",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "udp,tp_dst=0x1000/0xf000 actions=drop",
                "udp,tp_dst=4096/0xf000",
                DEFAULT_PRIORITY,
                "drop",
            ),
            ("icmp6 actions=drop", "icmp6", DEFAULT_PRIORITY, "drop"),
            (
                "ip,nw_src=0.0.0.0/0 actions=drop",
                "ip,nw_src=0.0.0.0/0",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "ipv6,ipv6_dst=::/0 actions=drop",
                "ipv6,ipv6_src=::/0",
                DEFAULT_PRIORITY,
                "drop",
            ),
            (
                "udp,tp_dst=0/0 actions=drop",
                "udp,tp_src=0/0x0000",
                DEFAULT_PRIORITY,
                "drop",
            ),
        ];
        for (text, m, prio, action) in cases {
            let r = parse_rule(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(render_match(&r.matches), m, "{text}");
            assert_eq!(
                (r.priority, r.action.to_string().as_str()),
                (prio, action),
                "{text}"
            );
            // The canonical text reads back to the same rule.
            let again = parse_rule(&format!("prio={prio} {m} actions={action}")).unwrap();
            assert_eq!(again, r, "{text}");
        }
    }

    #[test]
    fn the_grammar_refuses_bad_rules_saying_why() {
        let cases = [
            ("tcp,tp_dst=22", "no 'actions='"),
            ("tcp,tp_dst=22 actions=", "no action"),
            ("tcp actions=output", "unknown action"),
            ("tcp actions=drop,flood", "exactly one action"),
            ("tcp actions=output:b", "bad name"),
            ("tcp,tp_dst=70000 actions=drop", "out of range"),
            ("tp_dst=22 actions=drop", "need tcp or udp"),
            ("ip,tp_dst=22 actions=drop", "need tcp or udp"),
            ("nw_dst=10.0.0.1 actions=drop", "need ip"),
            ("ipv6,nw_dst=10.0.0.1 actions=drop", "need ip"),
            ("ip,ipv6_dst=::1 actions=drop", "need ipv6"),
            ("nw_proto=6 actions=drop", "needs ip or ipv6"),
            ("ip,nw_dst=10.0.0.300 actions=drop", "not an IPv4 address"),
            ("ip,nw_dst=10.0.0.0/33 actions=drop", "not a prefix length"),
            ("ipv6,ipv6_dst=::1/129 actions=drop", "not a prefix length"),
            ("dl_src=02:00:00:00:00 actions=drop", "not a MAC address"),
            ("dl_vlan=4096 actions=drop", "out of range"),
            ("prio=65536 actions=drop", "out of range"),
            ("prio=1,prio=2 actions=drop", "given twice"),
            ("tcp,udp actions=drop", "nw_proto is given twice (6 and 17)"),
            ("ipv6,tcp actions=drop", "dl_type is given twice"),
            ("dl_type=0x0806,ip actions=drop", "dl_type is given twice"),
            ("nw_dts=1.2.3.4 actions=drop", "unknown field 'nw_dts'"),
            ("bogus actions=drop", "unknown field 'bogus'"),
            ("ip,nw_dst=10.0.0.1actions=drop", "runs into"),
            ("in_port=a actions=drop", "bad name"),
        ];
        for (text, why) in cases {
            match parse_rule(text) {
                Ok(r) => panic!("{text} was taken: {r:?}"),
                Err(e) => assert!(e.contains(why), "{text}: '{e}' does not say '{why}'"),
            }
        }
        let e =
            parse_rules("# comment\n\nactions=drop\n  tcp,tp_dst=x actions=drop\n").unwrap_err();
        assert!(
            e.contains("line 4") && e.contains("'tcp,tp_dst=x actions=drop'"),
            "{e}"
        );
    }

    #[test]
    fn each_field_matches_frame_by_frame() {
        let t = table(
            "prio=100 in_port=vale0:p1 actions=output:vale0:p3\n\
             prio=90 dl_src=02:00:00:00:00:0c actions=output:vale0:p2\n\
             prio=80 dl_dst=02:00:00:00:00:0c actions=output:vale0:p2\n\
             prio=70 dl_vlan=7 actions=output:vale0:p1\n\
             prio=60 dl_type=0x88b5 actions=flood\n\
             prio=50 udp,nw_src=192.168.1.0/24,tp_src=53 actions=output:vale0:p1\n\
             prio=40 tcp,nw_dst=10.0.0.0/8,tp_dst=22 actions=drop\n\
             prio=35 ip,nw_proto=47 actions=output:vale0:p3\n\
             prio=30 tcp6,ipv6_dst=2001:db8::/32,tp_dst=80 actions=output:vale0:p2\n\
             prio=20 ipv6,ipv6_src=fe80::/10 actions=output:vale0:p3\n\
             prio=10 ip actions=output:vale0:p2\n",
        );
        let ssh = v4([1, 1, 1, 1], [10, 9, 8, 7], 6, 4000, 22);
        assert_eq!(decide(&t, 0, &ssh), DEST_DROP, "tcp to 10/8 port 22");
        assert_eq!(decide(&t, 1, &ssh), 3, "in_port wins");
        assert_eq!(
            decide(&t, 0, &v4([1, 1, 1, 1], [11, 9, 8, 7], 6, 4000, 22)),
            2,
            "not 10/8"
        );
        assert_eq!(
            decide(&t, 0, &v4([1, 1, 1, 1], [10, 9, 8, 7], 6, 4000, 23)),
            2,
            "port 23"
        );
        assert_eq!(
            decide(&t, 0, &v4([1, 1, 1, 1], [10, 9, 8, 7], 17, 4000, 22)),
            2,
            "udp"
        );
        assert_eq!(
            decide(&t, 0, &v4([192, 168, 1, 9], [1, 2, 3, 4], 17, 53, 9)),
            1,
            "dns"
        );
        assert_eq!(
            decide(&t, 0, &v4([192, 168, 2, 9], [1, 2, 3, 4], 17, 53, 9)),
            2,
            "/24"
        );
        assert_eq!(
            decide(&t, 0, &v4([1, 1, 1, 1], [2, 2, 2, 2], 47, 0, 0)),
            3,
            "gre"
        );
        let mut c_src = ssh.clone();
        c_src[11] = 0xc;
        assert_eq!(decide(&t, 0, &c_src), 2, "dl_src");
        let mut c_dst = v4([1, 1, 1, 1], [1, 1, 1, 1], 6, 1, 1);
        c_dst[5] = 0xc;
        assert_eq!(decide(&t, 0, &c_dst), 2, "dl_dst");
        assert_eq!(decide(&t, 0, &tag(&ssh, 7)), 1, "vlan 7");
        assert_eq!(
            decide(&t, 0, &tag(&ssh, 8)),
            DEST_DROP,
            "vlan 8: the ip rules apply"
        );
        let mut other = eth(B, A, 0x88b5);
        other.resize(60, 0);
        assert_eq!(decide(&t, 0, &other), DEST_FLOOD, "dl_type");
        let web: Ipv6Addr = "2001:db8::80".parse().unwrap();
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        let g: Ipv6Addr = "2002::1".parse().unwrap();
        assert_eq!(
            decide(&t, 0, &v6(g, web, &[], 6, 80)),
            2,
            "tcp6 to 2001:db8::/32"
        );
        assert_eq!(decide(&t, 0, &v6(ll, web, &[], 6, 81)), 3, "fe80::/10");
        assert_eq!(
            decide(&t, 0, &v6(g, g, &[], 6, 80)),
            DEST_FLOOD,
            "no rule: normal floods"
        );
        assert_eq!(t.dump("vale0").missed, 1);
    }

    #[test]
    fn priorities_ties_and_the_default() {
        let t = table(
            "prio=5 udp actions=output:vale0:p1\n\
             prio=5 ip actions=output:vale0:p2\n\
             prio=9 udp,tp_dst=9 actions=output:vale0:p3\n",
        );
        let u9 = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 9);
        let u8 = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 8);
        assert_eq!(decide(&t, 0, &u9), 3, "higher priority");
        assert_eq!(decide(&t, 0, &u8), 1, "tie: the first added");
        let dump = t.dump("vale0");
        let order: Vec<u64> = dump.rules.iter().map(|r| r.id).collect();
        assert_eq!(order, vec![3, 1, 2], "the order they are tried");
        assert_eq!(dump.default, "normal");
        // The default: normal learns, then finds; drop, flood, output.
        let mut arp = eth(0xff, A, 0x0806);
        arp[..6].copy_from_slice(&[0xff; 6]);
        arp.resize(60, 0);
        assert_eq!(decide(&t, 2, &arp), DEST_FLOOD, "normal floods broadcast");
        let mut back = eth(A, B, 0x0806);
        back.resize(60, 0);
        assert_eq!(decide(&t, 1, &back), 2, "normal: A was learnt on port 2");
        for (d, want) in [
            ("drop", DEST_DROP),
            ("flood", DEST_FLOOD),
            ("output:vale0:p3", 3),
        ] {
            let t = Flow::new(&args(&[("default", d)])).unwrap();
            t.port_added(3, "vale0:p3");
            assert_eq!(decide(&t, 0, &back), want, "default {d}");
            assert_eq!(t.dump("x").default, d);
        }
        assert!(Flow::new(&args(&[("default", "nowhere")])).is_err());
        assert!(Flow::new(&args(&[("rulez", "")])).is_err());
    }

    #[test]
    fn hit_counters_count_and_survive_changes() {
        let t = table("prio=1 udp actions=output:vale0:p1\nprio=2 tcp actions=output:vale0:p2\n");
        let u = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 9);
        let p = v4([1, 1, 1, 1], [2, 2, 2, 2], 6, 1, 9);
        let batch: Vec<&Vec<u8>> = vec![&u, &u, &p, &u, &p, &p, &p];
        let mut m: Vec<FrameMeta> = batch
            .iter()
            .map(|f| FrameMeta::new(f.as_ptr(), 60, 60, 0))
            .collect();
        t.lookup(port(0), &mut m, 1);
        let dsts: Vec<u16> = m.iter().map(|f| f.dst).collect();
        assert_eq!(dsts, vec![1, 1, 2, 1, 2, 2, 2]);
        assert_eq!(hits(&t), vec![(1, 3), (2, 4)]);
        // A change rebuilds the classifier; the rules that stay keep their counts.
        let added = t.add_text("prio=3 udp,tp_dst=10 actions=drop").unwrap();
        assert_eq!(added[0].id, 3);
        assert_eq!(hits(&t), vec![(1, 3), (2, 4), (3, 0)]);
        t.del("2").unwrap();
        assert_eq!(hits(&t), vec![(1, 3), (3, 0)]);
        assert_eq!(
            decide(&t, 0, &p),
            DEST_FLOOD,
            "tcp: no rule now, normal floods"
        );
        assert_eq!(decide(&t, 0, &u), 1);
        assert_eq!(hits(&t), vec![(1, 4), (3, 0)]);
    }

    #[test]
    fn add_and_del_are_all_or_nothing() {
        let t = table("prio=1 udp actions=drop\nprio=1 tcp,tp_dst=22 actions=drop\n");
        let e = t
            .add_text("prio=2 udp actions=flood\nprio=2 udp,tp_dst=x actions=flood")
            .unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        assert_eq!(t.dump("vale0").rules.len(), 2, "nothing added");
        assert!(t.del("99").unwrap_err().contains("no rule with id 99"));
        assert!(t.del("tcp").unwrap_err().contains("no rule has exactly"));
        assert!(t.del("tcp,tp_dst=22 actions=drop").is_err());
        assert!(t.del("prio=2 tcp,tp_dst=22").is_err(), "another priority");
        let gone = t.del("tcp,tp_dst=22").unwrap();
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].matches, "tcp,tp_dst=22");
        t.add_text("prio=7 udp actions=flood").unwrap();
        let gone = t.del("udp").unwrap();
        assert_eq!(gone.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 3]);
        assert!(t.dump("vale0").rules.is_empty());
        assert_eq!(
            t.add_text("id=5").unwrap_err(),
            "bad rule at line 1, 'id=5': no 'actions=' (a rule is '[prio=N] MATCH actions=ACTION')"
        );
        assert!(t
            .add_text("\n# nothing\n")
            .unwrap_err()
            .contains("no rule given"));
    }

    #[test]
    fn ports_come_and_go_by_name() {
        let t = Flow::new(&args(&[(
            "rules",
            "in_port=vale0:late actions=output:vale0:b\nactions=output:vale0:late",
        )]))
        .unwrap();
        let f = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 9);
        t.port_added(0, "vale0:a");
        assert_eq!(decide(&t, 0, &f), DEST_DROP, "vale0:late is not there");
        assert_eq!(t.counters()[3], ("no_port".to_string(), 1));
        t.port_added(5, "vale0:late");
        assert_eq!(decide(&t, 0, &f), 5);
        assert_eq!(decide(&t, 5, &f), DEST_DROP, "from late: b is not there");
        t.port_added(1, "vale0:b");
        assert_eq!(decide(&t, 5, &f), 1);
        // Names survive a rebuild.
        t.add_text("prio=1 arp actions=drop").unwrap();
        assert_eq!(decide(&t, 5, &f), 1);
        assert_eq!(decide(&t, 0, &f), 5);
        t.port_removed(5);
        assert_eq!(decide(&t, 0, &f), DEST_DROP);
        assert_eq!(decide(&t, 5, &f), DEST_DROP, "index 5 is nobody now");
        assert_eq!(t.port_names(), vec!["vale0:late", "vale0:b"]);
    }

    #[test]
    fn malformed_frames_never_match_what_they_lack() {
        let t = table(
            "prio=9 udp,tp_dst=0 actions=output:vale0:p1\n\
             prio=8 ip,nw_src=0.0.0.0/0 actions=output:vale0:p2\n\
             prio=7 ipv6,ipv6_src=::/0 actions=output:vale0:p3\n\
             prio=1 actions=drop\n",
        );
        let f = v4([1, 1, 1, 1], [2, 2, 2, 2], 17, 0, 0);
        assert_eq!(decide(&t, 0, &f), 1, "whole: port 0 matches");
        // Cut at every length: never a read past first_len (checked under Miri/ASan by the
        // slice bounds), never a match on a field not there.
        for cut in 14..=f.len() {
            let d = decide_cut(&t, 0, &f, cut);
            let want = if cut >= 14 + 20 + 4 {
                1
            } else if cut >= 14 + 20 {
                2
            } else {
                DEST_DROP
            };
            assert_eq!(d, want, "cut at {cut}");
        }
        // A later fragment has no ports; the first has.
        let mut later = f.clone();
        later[14 + 6] = 0x00;
        later[14 + 7] = 0x10;
        assert_eq!(decide(&t, 0, &later), 2);
        let mut first = f.clone();
        first[14 + 6] = 0x20; // more fragments, offset 0
        assert_eq!(decide(&t, 0, &first), 1);
        // Bad IHL, bad version: not IP as far as the rules go.
        let mut bad = f.clone();
        bad[14] = 0x44;
        assert_eq!(decide(&t, 0, &bad), DEST_DROP);
        bad[14] = 0x65;
        assert_eq!(decide(&t, 0, &bad), DEST_DROP);
        // An IHL longer than the frame: addresses known, ports not.
        let mut long = f.clone();
        long[14] = 0x4f;
        assert_eq!(decide(&t, 0, &long), 2);
        // A tag cut short.
        let tagged = tag(&f, 3);
        assert_eq!(decide_cut(&t, 0, &tagged, 15), DEST_DROP);
        assert_eq!(decide_cut(&t, 0, &tagged, 17), DEST_DROP);
    }

    #[test]
    fn ipv6_extension_headers_are_walked_within_bounds() {
        let t = table(
            "prio=9 udp6,tp_dst=53 actions=output:vale0:p1\n\
             prio=8 ipv6,nw_proto=44 actions=output:vale0:p2\n\
             prio=7 ipv6,nw_proto=60 actions=output:vale0:p3\n\
             prio=6 ipv6,nw_proto=17 actions=flood\n\
             prio=1 actions=drop\n",
        );
        let (s, d): (Ipv6Addr, Ipv6Addr) = (
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        );
        let hop = (0u8, vec![0u8; 8]);
        let dst_opt = (60u8, vec![0u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let frag0 = (44u8, vec![0u8, 0, 0, 1, 0, 0, 0, 1]);
        let frag_later = (44u8, vec![0u8, 0, 0, 0x08, 0, 0, 0, 1]);
        let ah = (51u8, vec![0u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decide(&t, 0, &v6(s, d, &[], 17, 53)), 1);
        assert_eq!(
            decide(
                &t,
                0,
                &v6(s, d, &[hop.clone(), dst_opt.clone(), ah], 17, 53)
            ),
            1
        );
        assert_eq!(
            decide(&t, 0, &v6(s, d, &[frag0], 17, 53)),
            1,
            "first fragment"
        );
        assert_eq!(
            decide(&t, 0, &v6(s, d, &[frag_later], 17, 53)),
            DEST_FLOOD,
            "later: udp, no ports"
        );
        // More extension headers than are walked: the protocol is where the walk stopped.
        let many: Vec<(u8, Vec<u8>)> = (0..MAX_EXT_HEADERS + 1).map(|_| dst_opt.clone()).collect();
        let f = v6(s, d, &many, 17, 53);
        assert_eq!(decide(&t, 0, &f), 3);
        // Cut anywhere: no panic, no read past the cut.
        let f = v6(s, d, &[hop, dst_opt], 17, 53);
        for cut in 14..=f.len() {
            decide_cut(&t, 0, &f, cut);
        }
        assert_eq!(
            decide_cut(&t, 0, &f, 14 + 40 + 8 + 1),
            2 + 1,
            "cut in the options: stopped there"
        );
    }

    #[test]
    fn the_cache_follows_rule_changes() {
        // Enough masks for the cache to be used.
        let mut rules = String::new();
        for len in 8..=32 {
            rules += &format!(
                "prio={len} ip,nw_dst=10.0.0.0/{len} actions=output:vale0:p{}\n",
                len % 3 + 1
            );
        }
        let t = table(&rules);
        assert!(t.current.load().subtables.len() > CACHE_ABOVE_MASKS);
        let f = v4([1, 1, 1, 1], [10, 0, 0, 0], 17, 1, 9);
        assert_eq!(decide(&t, 0, &f), (32 % 3 + 1) as u16);
        assert_eq!(decide(&t, 0, &f), (32 % 3 + 1) as u16, "from the cache");
        t.del("prio=32 ip,nw_dst=10.0.0.0/32").unwrap();
        assert_eq!(
            decide(&t, 0, &f),
            (31 % 3 + 1) as u16,
            "a stale entry is not taken"
        );
        // Mixed keys in one batch, many times over: the same as the search's answer.
        let frames: Vec<Vec<u8>> = (0..64u8)
            .map(|i| v4([1, 1, 1, 1], [10, 0, i % 4, i], 17, 1, 9))
            .collect();
        for _ in 0..3 {
            let mut m: Vec<FrameMeta> = frames
                .iter()
                .map(|f| FrameMeta::new(f.as_ptr(), 60, 60, 0))
                .collect();
            t.lookup(port(0), &mut m, 1);
            for (f, m) in frames.iter().zip(&m) {
                let a = u32::from_be_bytes(f[30..34].try_into().unwrap());
                let len = (a ^ 0x0a00_0000).leading_zeros().min(31);
                assert_eq!(m.dst, (len % 3 + 1) as u16, "{a:x}");
            }
        }
    }

    /// With many masks (prefix tracking on), every frame gets the rule a linear scan of the
    /// rules picks: random prefixes of a few addresses on v4 and v6 sources and
    /// destinations, random protocols and ports, frames near and far from the prefixes.
    #[test]
    fn prefix_tracking_decides_as_a_linear_scan() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let v4s = [
            [10, 1, 2, 3],
            [10, 1, 200, 4],
            [192, 168, 9, 9],
            [245, 0, 0, 1],
        ];
        let v6s: [Ipv6Addr; 3] = [
            "2001:db8::1".parse().unwrap(),
            "2001:db8:0:ff::2".parse().unwrap(),
            "fe80::9".parse().unwrap(),
        ];
        let mut text = String::new();
        for _ in 0..400 {
            let prio = 1 + rnd(5);
            let mut m = vec![];
            let v6 = rnd(3) == 0;
            m.push(if rnd(2) == 0 { "udp" } else { "tcp" }.to_string());
            if v6 {
                m[0] += "6";
            }
            for field in ["src", "dst"] {
                if rnd(4) != 0 {
                    m.push(if v6 {
                        let a = v6s[rnd(3) as usize];
                        format!("ipv6_{field}={a}/{}", 1 + rnd(128))
                    } else {
                        let a = Ipv4Addr::from(v4s[rnd(4) as usize]);
                        format!("nw_{field}={a}/{}", 1 + rnd(32))
                    });
                }
            }
            if rnd(3) == 0 {
                m.push(format!("tp_dst={}", rnd(3)));
            }
            text += &format!("prio={prio} {} actions=drop\n", m.join(","));
        }
        let t = table(&text);
        let c = t.counters();
        assert!(c
            .iter()
            .any(|(k, v)| k == "masks" && *v > TRACK_ABOVE_MASKS as u64));
        assert!(
            c.iter().any(|(k, v)| k == "tracked_fields" && *v == 4),
            "{c:?}"
        );
        let rules = parse_rules(&text).unwrap();
        let ids: Vec<u64> = hits(&t).iter().map(|h| h.0).collect();
        for _ in 0..4000 {
            // An address of the pool with its last bits (0 to all) random.
            let near = |a: u128, bits: u32, rnd: &mut dyn FnMut(u64) -> u64| {
                let keep = rnd(bits as u64 + 1) as u32;
                let low = if keep == bits {
                    0
                } else {
                    !0u128 >> (128 - bits + keep)
                };
                a ^ (rnd(u64::MAX) as u128 * 0x9e37_79b9_7f4a_7c15) & low
            };
            let (proto, dport) = (if rnd(2) == 0 { 17 } else { 6 }, rnd(4) as u16);
            let f = if rnd(3) == 0 {
                let s = near(u128::from(v6s[rnd(3) as usize]), 128, &mut rnd);
                let d = near(u128::from(v6s[rnd(3) as usize]), 128, &mut rnd);
                v6(s.into(), d.into(), &[], proto, dport)
            } else {
                let s = near(
                    u32::from(Ipv4Addr::from(v4s[rnd(4) as usize])) as u128,
                    32,
                    &mut rnd,
                );
                let d = near(
                    u32::from(Ipv4Addr::from(v4s[rnd(4) as usize])) as u128,
                    32,
                    &mut rnd,
                );
                v4(
                    (s as u32).to_be_bytes(),
                    (d as u32).to_be_bytes(),
                    proto,
                    7,
                    dport,
                )
            };
            let k = extract(
                &FrameMeta::new(f.as_ptr(), f.len() as u32, f.len() as u32, 0),
                0,
            );
            let want = rules
                .iter()
                .enumerate()
                .filter(|(_, r)| k.and(&r.matches.mask) == r.matches.value.and(&r.matches.mask))
                .max_by_key(|(i, r)| (r.priority, std::cmp::Reverse(*i)))
                .map(|(i, _)| ids[i]);
            let before = hits(&t);
            decide(&t, 0, &f);
            let got: Vec<u64> = hits(&t)
                .iter()
                .zip(&before)
                .filter(|(a, b)| a.1 != b.1)
                .map(|(a, _)| a.0)
                .collect();
            assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{f:02x?}");
        }
    }

    #[test]
    fn the_table_is_bounded() {
        let t = Flow::new(&[]).unwrap();
        let many = "udp actions=drop\n".repeat(MAX_RULES);
        t.add_text(&many).unwrap();
        let e = t.add_text("tcp actions=drop").unwrap_err();
        assert!(e.contains("limit of 200000"), "{e}");
        assert_eq!(t.counters()[1], ("masks".to_string(), 1));
        assert!(parse_rules(&"udp actions=drop\n".repeat(MAX_RULES + 1)).is_err());
    }

    #[test]
    fn a_dump_page_by_page_is_the_dump() {
        let t = Flow::new(&[]).unwrap();
        let text: String = (0..1000)
            .map(|i| format!("prio={} udp,tp_dst={i} actions=drop\n", i % 7))
            .collect();
        t.add_text(&text).unwrap();
        let whole = t.dump("vale0").rules;
        for max in [1, 7, 999, 1000, 5000] {
            let (mut pages, mut after) = (Vec::new(), 0);
            loop {
                let p = t.dump_page("vale0", after, max);
                assert!(p.rules.len() <= max);
                pages.extend(p.rules);
                match p.next {
                    Some(n) => after = n,
                    None => break,
                }
            }
            assert_eq!(pages, whole, "pages of {max}");
        }
    }
}

/// Rule sets of the benchmarks (`bench/modules.py` writes the same): `n` rules in four
/// shapes over addresses the benchmark stream never uses, then the stream's own rule
/// (udp 10.0.0.1:1234 -> 10.0.0.2:4321) to `to`, below them all so that a frame of the
/// stream visits every mask. `masks`: the tuple space explosion: one rule for each pair of
/// source and destination prefix lengths (1024 masks), on prefixes the stream's addresses
/// do not begin with. `masks-adversarial`: the same 1024 masks on prefixes of the stream's
/// own addresses, each rule missing the stream only by its UDP destination port, so that
/// prefix tracking passes every table a frame's addresses reach.
pub fn bench_rules(shape: &str, n: usize, to: &str) -> String {
    let mut s = String::new();
    let ip = |i: usize| format!("{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255);
    match shape {
        "masks" | "masks-adversarial" => {
            let (src, dst, tail) = match shape {
                "masks" => ("245.255.255.254", "245.255.255.253", ""),
                _ => ("10.0.0.1", "10.0.0.2", ",tp_dst=9"),
            };
            for a in 1..=32 {
                for b in 1..=32 {
                    s += &format!(
                        "prio=100 udp,nw_src={src}/{a},nw_dst={dst}/{b}{tail} actions=drop\n"
                    );
                }
            }
        }
        _ => {
            for i in 0..n.saturating_sub(1) {
                s += &match i % 4 {
                    0 => format!(
                        "prio=100 udp,nw_dst=11.{},tp_dst={} actions=drop\n",
                        ip(i),
                        1000 + i % 1000
                    ),
                    1 => format!("prio=90 tcp,nw_src=12.{},tp_dst=80 actions=drop\n", ip(i)),
                    2 => format!(
                        "prio=80 ip,nw_dst=13.{}/24 actions=drop\n",
                        ip(i & !255 | (i >> 2 & 255))
                    ),
                    _ => format!(
                        "prio=70 udp,nw_src=14.{},tp_src={} actions=drop\n",
                        ip(i),
                        1 + i % 60000
                    ),
                };
            }
        }
    }
    s + &format!("prio=50 udp,nw_dst=10.0.0.2,tp_dst=4321 actions=output:{to}\n")
}

#[cfg(test)]
mod cost {
    //! The cost of the module call itself, in ns a frame: `cargo test --release -p
    //! vale-switch --lib lookup_cost -- --ignored --nocapture` (bench/modules.py runs it).

    use super::*;
    use crate::lookup::make;
    use std::time::Instant;

    /// The benchmark stream's frame from `src` (10.0.0.1 unless varied), as vale-pktgen sends.
    fn frame(src: u32) -> Vec<u8> {
        let mut f = vec![0xffu8; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 0xa, 0x08, 0x00]);
        f.extend_from_slice(&[0x45, 0, 0, 46, 0, 0, 0, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&src.to_be_bytes());
        f.extend_from_slice(&[10, 0, 0, 2]);
        f.extend_from_slice(&1234u16.to_be_bytes());
        f.extend_from_slice(&4321u16.to_be_bytes());
        f.resize(60, 0);
        f
    }

    fn measure(m: &dyn Lookup, frames: &[Vec<u8>]) -> f64 {
        const BATCH: usize = 512;
        let mut metas: Vec<FrameMeta> = frames
            .iter()
            .map(|f| FrameMeta::new(f.as_ptr(), 60, 60, 0))
            .collect();
        let src = SourcePort {
            index: 0,
            ring: 0,
            learn_limit: LearningBridge::DEFAULT_LEARN_LIMIT,
        };
        let (mut done, mut at) = (0u64, 0usize);
        let start = Instant::now();
        let cpu = thread_cpu_ns();
        while start.elapsed().as_secs_f64() < 0.3 || done < 4096 {
            let end = (at + BATCH).min(metas.len());
            m.lookup(src, &mut metas[at..end], 1);
            done += (end - at) as u64;
            at = if end == metas.len() { 0 } else { end };
        }
        (thread_cpu_ns() - cpu) as f64 / done as f64
    }

    /// This thread's CPU time: what other processes on the machine take is not counted.
    fn thread_cpu_ns() -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec for the call to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    }

    #[test]
    #[ignore = "a measurement: run by bench/modules.py"]
    fn lookup_cost() {
        let one: Vec<Vec<u8>> = vec![frame(0x0a00_0001); 512];
        // 65536 sources from 10.0.0.1 on (as vale-pktgen --flows 65536 --vary src-addr):
        // every frame a new flow for the caches.
        let many: Vec<Vec<u8>> = (0..65536u32).map(|i| frame(0x0a00_0001 + i)).collect();
        let cases: Vec<(String, Vec<(String, String)>)> = vec![
            ("learning".into(), vec![]),
            ("hub".into(), vec![]),
            ("vlan".into(), vec![]),
            (
                "flow-10".into(),
                vec![("rules".into(), bench_rules("flow", 10, "vale0:b"))],
            ),
            (
                "flow-1000".into(),
                vec![("rules".into(), bench_rules("flow", 1000, "vale0:b"))],
            ),
            (
                "flow-100000".into(),
                vec![("rules".into(), bench_rules("flow", 100_000, "vale0:b"))],
            ),
            (
                "flow-masks".into(),
                vec![("rules".into(), bench_rules("masks", 0, "vale0:b"))],
            ),
            (
                "flow-masks-adversarial".into(),
                vec![(
                    "rules".into(),
                    bench_rules("masks-adversarial", 0, "vale0:b"),
                )],
            ),
        ];
        // LOOKUP_COST_ONLY=flow-1000: that case alone (to profile it).
        let only = std::env::var("LOOKUP_COST_ONLY").ok();
        for (name, args) in cases {
            if only.as_ref().is_some_and(|o| *o != name) {
                continue;
            }
            let spec = name.split('-').next().unwrap();
            let m = make(spec, &args).unwrap();
            m.port_added(0, "vale0:a");
            m.port_added(1, "vale0:b");
            let masks = m
                .counters()
                .iter()
                .find(|c| c.0 == "masks")
                .map_or(0, |c| c.1);
            for (traffic, frames) in [("one-flow", &one), ("65536-flows", &many)] {
                let ns = measure(&*m, frames);
                println!(
                    "LOOKUP_COST {{\"module\":\"{name}\",\"traffic\":\"{traffic}\",\"masks\":{masks},\"ns_per_frame\":{ns:.2}}}"
                );
            }
        }
    }
}

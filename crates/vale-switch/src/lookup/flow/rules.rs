//! Rules: their grammar (`FIELD=VALUE,... actions=ACTION`) and their canonical text.

use super::*;

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
pub fn parse_action(s: &str) -> Result<Action, Error> {
    match s {
        "drop" => Ok(Action::Drop),
        "flood" => Ok(Action::Flood),
        "normal" => Ok(Action::Normal),
        "" => Err(invalid(
            "no action after 'actions=' (one of output:PORT, drop, flood, normal)",
        )),
        _ => match s.strip_prefix("output:") {
            Some(p) => {
                vale_abi::name::parse_port(p).map_err(|e| invalid(format!("output: {e}")))?;
                Ok(Action::Output(p.to_string()))
            }
            None if s.contains(',') => Err(invalid(format!(
                "'{s}': a rule has exactly one action (output:PORT, drop, flood or normal)"
            ))),
            None => Err(invalid(format!(
                "unknown action '{s}' (known: output:PORT, drop, flood, normal)"
            ))),
        },
    }
}

/// What a rule matches: the key's value and mask, and the in-port by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    pub(super) value: Key,
    pub(super) mask: Key,
    pub(super) in_port: Option<String>,
}

/// One rule as parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub priority: u16,
    pub matches: Match,
    pub action: Action,
}

pub(super) fn number(s: &str, max: u64) -> Result<u64, Error> {
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse::<u64>(),
    }
    .map_err(|_| invalid(format!("'{s}' is not a number")))?;
    if n > max {
        return Err(invalid(format!("{n} is out of range (at most {max})")));
    }
    Ok(n)
}

/// `N` or `N/MASK` (both numbers up to `max`).
pub(super) fn masked_number(s: &str, max: u64) -> Result<(u64, u64), Error> {
    match s.split_once('/') {
        Some((v, m)) => {
            let m = number(m, max)?;
            Ok((number(v, max)? & m, m))
        }
        None => Ok((number(s, max)?, max)),
    }
}

/// A MAC address in key order (first octet lowest).
pub(super) fn mac(s: &str) -> Result<u64, Error> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(invalid(format!(
            "'{s}' is not a MAC address (xx:xx:xx:xx:xx:xx)"
        )));
    }
    let mut v = 0u64;
    for (i, p) in parts.iter().enumerate() {
        let b = (p.len() == 2)
            .then(|| u8::from_str_radix(p, 16).ok())
            .flatten()
            .ok_or_else(|| invalid(format!("'{s}' is not a MAC address (xx:xx:xx:xx:xx:xx)")))?;
        v |= (b as u64) << (8 * i);
    }
    Ok(v)
}

pub(super) fn fmt_mac(v: u64) -> String {
    let b = v.to_le_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5]
    )
}

/// `ADDR[/LEN]` of IPv4 (`v6` false) or IPv6 into 128-bit value and mask; host bits beyond
/// the prefix are cleared.
pub(super) fn prefix(s: &str, v6: bool) -> Result<(u128, u128), Error> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let (addr, bits) = if v6 {
        let a: Ipv6Addr = a
            .parse()
            .map_err(|_| invalid(format!("'{a}' is not an IPv6 address")))?;
        (u128::from(a), 128)
    } else {
        let a: Ipv4Addr = a
            .parse()
            .map_err(|_| invalid(format!("'{a}' is not an IPv4 address")))?;
        (u32::from(a) as u128, 32)
    };
    let len = match len {
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| *l <= bits)
            .ok_or_else(|| invalid(format!("'/{l}' is not a prefix length (0 to {bits})")))?,
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
pub(super) fn put128(k: &mut Key, w: usize, v: u128, v6: bool) {
    if v6 {
        k.0[w] = (v >> 64) as u64;
        k.0[w + 1] = v as u64;
    } else {
        k.0[w] = v as u64;
    }
}

pub(super) fn get128(k: &Key, w: usize, v6: bool) -> u128 {
    if v6 {
        (k.0[w] as u128) << 64 | k.0[w + 1] as u128
    } else {
        k.0[w] as u128
    }
}

/// The field names of the grammar, with the shorthands.
pub(super) const FIELDS: &str =
    "in_port, dl_src, dl_dst, dl_type, dl_vlan, nw_src, nw_dst, ipv6_src, \
ipv6_dst, nw_proto, tp_src, tp_dst; shorthands ip, ipv6, arp, icmp, icmp6, tcp, udp, tcp6, udp6";

/// Sets `field` to `v`, unless it holds another value already (`ip,tcp` is fine, `tcp,udp`
/// is not).
pub(super) fn agree<T: PartialEq + std::fmt::Display>(
    field: &mut Option<T>,
    v: T,
    name: &str,
) -> Result<(), Error> {
    match field {
        Some(old) if *old != v => Err(invalid(format!("{name} is given twice ({old} and {v})"))),
        _ => {
            *field = Some(v);
            Ok(())
        }
    }
}

/// The shorthands of a match, as OpenFlow's tools write them: an EtherType and maybe an IP
/// protocol. [`parse_match`] reads them, [`render_match`] writes the first that fits.
pub(super) const SHORTHANDS: &[(&str, u16, Option<u8>)] = &[
    ("icmp", ETH_P_IPV4, Some(IPPROTO_ICMP)),
    ("tcp", ETH_P_IPV4, Some(IPPROTO_TCP)),
    ("udp", ETH_P_IPV4, Some(IPPROTO_UDP)),
    ("icmp6", ETH_P_IPV6, Some(IPPROTO_ICMPV6)),
    ("tcp6", ETH_P_IPV6, Some(IPPROTO_TCP)),
    ("udp6", ETH_P_IPV6, Some(IPPROTO_UDP)),
    ("ip", ETH_P_IPV4, None),
    ("ipv6", ETH_P_IPV6, None),
    ("arp", ETH_P_ARP, None),
];

/// Parses a match: comma- or space-separated `FIELD=VALUE` and shorthands, with `prio=N`
/// (`priority=N`) among them if `prio` is given somewhere to put it.
pub(super) fn parse_match(text: &str, mut prio: Option<&mut Option<u16>>) -> Result<Match, Error> {
    let mut m = Match::default();
    let mut seen: Vec<&str> = Vec::new();
    let once = |name: &'static str, seen: &mut Vec<&str>| {
        if seen.contains(&name) {
            Err(invalid(format!("{name} is given twice")))
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
        let shorthand = SHORTHANDS
            .iter()
            .find(|s| s.0 == name)
            .map(|&(_, t, p)| (t, p));
        if let Some((t, p)) = shorthand {
            if value.is_some() {
                return Err(invalid(format!("'{tok}': {name} takes no value")));
            }
            agree(&mut dl_type, t, "dl_type").map_err(|e| e.context(format!("'{tok}': ")))?;
            if let Some(p) = p {
                agree(&mut proto, p, "nw_proto").map_err(|e| e.context(format!("'{tok}': ")))?;
            }
            continue;
        }
        let Some(v) = value else {
            return Err(invalid(format!("unknown field '{tok}' (known: {FIELDS})")));
        };
        let err = |e: Error| e.context(format!("'{tok}': "));
        match name {
            "prio" | "priority" => {
                let Some(p) = prio.as_deref_mut() else {
                    return Err(invalid(format!("'{tok}': no priority here")));
                };
                once("priority", &mut seen).map_err(err)?;
                *p = Some(number(v, u16::MAX as u64).map_err(err)? as u16);
            }
            "in_port" => {
                once("in_port", &mut seen).map_err(err)?;
                vale_abi::name::parse_port(v).map_err(|e| err(e.into()))?;
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
            _ => return Err(invalid(format!("unknown field '{name}' (known: {FIELDS})"))),
        }
    }
    // Prerequisites, as in OpenFlow: a field means something only under its protocol.
    let ip4 = dl_type == Some(ETH_P_IPV4);
    let ip6 = dl_type == Some(ETH_P_IPV6);
    if seen.iter().any(|f| *f == "nw_src" || *f == "nw_dst") && !ip4 {
        return Err(invalid("nw_src and nw_dst need ip (dl_type=0x0800)"));
    }
    if seen.iter().any(|f| *f == "ipv6_src" || *f == "ipv6_dst") && !ip6 {
        return Err(invalid("ipv6_src and ipv6_dst need ipv6 (dl_type=0x86dd)"));
    }
    if proto.is_some() && !ip4 && !ip6 {
        return Err(invalid(
            "nw_proto needs ip or ipv6 (dl_type=0x0800 or 0x86dd)",
        ));
    }
    if seen.iter().any(|f| *f == "tp_src" || *f == "tp_dst")
        && !matches!(proto, Some(IPPROTO_TCP | IPPROTO_UDP))
    {
        return Err(invalid(
            "tp_src and tp_dst need tcp or udp (nw_proto=6 or 17)",
        ));
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
pub fn parse_rule(text: &str) -> Result<Rule, Error> {
    let text = text.trim();
    let Some(at) = text.find("actions=") else {
        return Err(invalid(
            "no 'actions=' (a rule is '[prio=N] MATCH actions=ACTION')",
        ));
    };
    let (head, action) = (&text[..at], text[at + "actions=".len()..].trim());
    if !head.is_empty() && !head.ends_with([' ', ',', '\t']) {
        return Err(invalid(format!("'{}' runs into 'actions='", head.trim())));
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
    let with_proto = SHORTHANDS
        .iter()
        .find(|s| s.2.is_some() && Some(s.1 as u64) == dl_type && s.2.map(u64::from) == proto);
    match (dl_type, with_proto) {
        (Some(_), Some(s)) => out.push(s.0.into()),
        (Some(t), None) => {
            let plain = SHORTHANDS.iter().find(|s| s.2.is_none() && s.1 as u64 == t);
            out.push(plain.map_or_else(|| format!("dl_type=0x{t:04x}"), |s| s.0.into()));
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
    let v6 = dl_type == Some(ETH_P_IPV6 as u64);
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

//! The frames vale-pktgen sends: Ethernet + IPv4 + UDP, with a payload that carries a magic,
//! a sequence number and a send time (ping/pong use the last two).

/// Offsets inside a frame.
pub const ETH_HLEN: usize = 14;
const IP_OFS: usize = ETH_HLEN;
pub const UDP_OFS: usize = IP_OFS + 20;
pub const PAYLOAD_OFS: usize = UDP_OFS + 8;
/// "vp", then a u32 sequence number, then a u64 send time (ns): all inside a 60-byte frame.
pub const MAGIC: [u8; 2] = *b"vp";
pub const SEQ_OFS: usize = PAYLOAD_OFS + 2;
pub const TS_OFS: usize = SEQ_OFS + 4;

/// A MAC address `--src-mac`/`--dst-mac` refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    /// Not six parts separated by `:`.
    #[error("bad MAC address '{0}': want six hex octets like 02:00:00:00:00:01")]
    Parts(String),
    /// A part that is not a hex octet.
    #[error("bad MAC address '{0}'")]
    Octet(String),
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], MacError> {
    let parts: Vec<&str> = s.split(':').collect();
    let mut mac = [0u8; 6];
    if parts.len() != 6 {
        return Err(MacError::Parts(s.to_string()));
    }
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|_| MacError::Octet(s.to_string()))?;
    }
    Ok(mac)
}

/// A locally administered unicast MAC derived from a port name, stable across runs.
pub fn mac_for(name: &str) -> [u8; 6] {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let b = h.to_le_bytes();
    [0x02, b[0], b[1], b[2], b[3], b[4]]
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// What tells the flows of `--flows` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Vary {
    /// The UDP source port: 1024 + flow
    Sport,
    /// The IPv4 source address: 10.0.0.1 + flow
    Saddr,
}

/// Makes the frame at the start of `buf` (one [`build`] made) one of flow `flow`.
#[inline]
pub fn set_flow(buf: &mut [u8], flow: u16, vary: Vary) {
    match vary {
        // The UDP checksum is 0 (none): nothing else changes.
        Vary::Sport => buf[UDP_OFS..UDP_OFS + 2].copy_from_slice(&(1024 + flow).to_be_bytes()),
        Vary::Saddr => {
            let src = u32::from_be_bytes([10, 0, 0, 1]) + flow as u32;
            let ip = &mut buf[IP_OFS..UDP_OFS];
            ip[12..16].copy_from_slice(&src.to_be_bytes());
            ip[10..12].fill(0);
            let c = checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
    }
}

/// A whole frame of `len` bytes (at least 60).
pub fn build(len: usize, src: [u8; 6], dst: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (len - IP_OFS).min(0xffff) as u16;
    let ip = &mut f[IP_OFS..UDP_OFS];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[8] = 64; // ttl
    ip[9] = 17; // udp
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let c = checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp = &mut f[UDP_OFS..PAYLOAD_OFS];
    udp[0..2].copy_from_slice(&1234u16.to_be_bytes());
    udp[2..4].copy_from_slice(&4321u16.to_be_bytes());
    udp[4..6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    f[PAYLOAD_OFS..SEQ_OFS].copy_from_slice(&MAGIC);
    for (i, b) in f[TS_OFS + 8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_differ_by_port_or_by_address_with_a_good_checksum() {
        let base = build(60, [2, 0, 0, 0, 0, 1], [0xff; 6]);
        let mut f = base.clone();
        set_flow(&mut f, 7, Vary::Sport);
        assert_eq!(&f[UDP_OFS..UDP_OFS + 2], &1031u16.to_be_bytes());
        assert_eq!(f[..UDP_OFS], base[..UDP_OFS]);
        let mut f = base.clone();
        set_flow(&mut f, 300, Vary::Saddr);
        assert_eq!(&f[IP_OFS + 12..IP_OFS + 16], &[10, 0, 1, 45]);
        assert_eq!(
            checksum(&f[IP_OFS..UDP_OFS]),
            0,
            "the header sums to all ones"
        );
        assert_eq!(f[UDP_OFS..], base[UDP_OFS..]);
    }

    #[test]
    fn frame_is_well_formed() {
        let f = build(60, mac_for("vale0:a"), [0xff; 6]);
        assert_eq!(f.len(), 60);
        assert_eq!(checksum(&f[IP_OFS..UDP_OFS]), 0, "ip checksum verifies");
        assert_eq!(parse_mac("02:00:00:00:00:0a").unwrap(), [2, 0, 0, 0, 0, 10]);
        assert!(parse_mac("02:00").is_err());
        assert_eq!(mac_for("x")[0], 2);
    }
}

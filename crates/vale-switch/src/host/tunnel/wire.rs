//! The tunnel headers on the wire: VXLAN (RFC 7348) and Geneve (RFC 8926), both 8 bytes
//! after the outer UDP header, then (Geneve only) options, then the inner Ethernet frame.
//!
//! Everything received is untrusted (anyone who can reach the UDP port writes it): a header
//! that does not add up is a [`Bad`] reason, counted by the port, never a panic.

/// Bytes of the fixed header of both protocols.
pub const HDR_LEN: usize = 8;
/// Largest UDP payload of one IPv4 datagram; also the limit over IPv6, so that a port
/// behaves the same whichever underlay it has.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Shortest inner frame: an Ethernet header.
pub const MIN_INNER: usize = 14;
/// Geneve's protocol type for an Ethernet frame (Transparent Ethernet Bridging).
const ETH_BRIDGING: u16 = 0x6558;
/// VXLAN's I flag: the VNI is valid.
const VXLAN_I: u8 = 0x08;
/// Geneve's C flag: critical options present.
const GENEVE_C: u8 = 0x40;

/// Which tunnel header a port speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Vxlan,
    Geneve,
}

/// Why a received packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bad {
    /// Shorter than the header, flags or version or protocol wrong, options overrunning the
    /// packet, or an inner frame shorter than an Ethernet header.
    Header,
    /// Another VNI than the port's.
    Vni,
    /// Geneve with the critical flag: options this port does not understand must not be
    /// ignored (RFC 8926 section 3.4).
    Critical,
}

impl Proto {
    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Vxlan => "vxlan",
            Proto::Geneve => "geneve",
        }
    }

    /// The IANA port (Linux's vxlan device defaults to 8472, the port of its first version).
    pub fn default_port(self) -> u16 {
        match self {
            Proto::Vxlan => 4789,
            Proto::Geneve => 6081,
        }
    }

    /// The header this port puts before every frame it sends (the same for all: Geneve is
    /// sent without options).
    pub fn header(self, vni: u32) -> [u8; HDR_LEN] {
        let v = vni.to_be_bytes();
        match self {
            Proto::Vxlan => [VXLAN_I, 0, 0, 0, v[1], v[2], v[3], 0],
            Proto::Geneve => {
                let p = ETH_BRIDGING.to_be_bytes();
                [0, 0, p[0], p[1], v[1], v[2], v[3], 0]
            }
        }
    }

    /// Checks the header `hdr` of a received UDP payload of `total` bytes (header included)
    /// for VNI `vni`. Returns the bytes of options that follow the header, before the inner
    /// frame (always 0 for VXLAN).
    pub fn decap(self, hdr: &[u8], total: usize, vni: u32) -> Result<usize, Bad> {
        if hdr.len() < HDR_LEN || total < HDR_LEN {
            return Err(Bad::Header);
        }
        let got_vni = u32::from_be_bytes([0, hdr[4], hdr[5], hdr[6]]);
        let opts = match self {
            Proto::Vxlan => {
                // Strict as Linux: the I flag alone, reserved fields zero.
                if hdr[0] != VXLAN_I || hdr[1..4] != [0, 0, 0] || hdr[7] != 0 {
                    return Err(Bad::Header);
                }
                0
            }
            Proto::Geneve => {
                if hdr[0] >> 6 != 0 || u16::from_be_bytes([hdr[2], hdr[3]]) != ETH_BRIDGING {
                    return Err(Bad::Header);
                }
                if hdr[1] & GENEVE_C != 0 {
                    return Err(Bad::Critical);
                }
                (hdr[0] & 0x3f) as usize * 4
            }
        };
        if total < HDR_LEN + opts + MIN_INNER {
            return Err(Bad::Header);
        }
        if got_vni != vni {
            return Err(Bad::Vni);
        }
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geneve(opt_words: u8, flags: u8, proto: u16, vni: u32) -> [u8; 8] {
        let v = vni.to_be_bytes();
        let p = proto.to_be_bytes();
        [opt_words, flags, p[0], p[1], v[1], v[2], v[3], 0]
    }

    #[test]
    fn headers_round_trip() {
        for p in [Proto::Vxlan, Proto::Geneve] {
            let h = p.header(0xabcdef);
            assert_eq!(p.decap(&h, 8 + 60, 0xabcdef), Ok(0), "{p:?}");
            assert_eq!(p.decap(&h, 8 + 14, 0xabcdef), Ok(0), "{p:?} shortest");
        }
        assert_eq!(Proto::Vxlan.header(42), [8, 0, 0, 0, 0, 0, 42, 0]);
        assert_eq!(Proto::Geneve.header(42), [0, 0, 0x65, 0x58, 0, 0, 42, 0]);
    }

    #[test]
    fn hostile_vxlan_is_refused() {
        let p = Proto::Vxlan;
        let good = p.header(5);
        // Truncated: fewer bytes than the header.
        assert_eq!(p.decap(&good[..7], 7, 5), Err(Bad::Header));
        assert_eq!(p.decap(&good, 7, 5), Err(Bad::Header));
        // Inner frames of 0 and 13 bytes.
        assert_eq!(p.decap(&good, 8, 5), Err(Bad::Header));
        assert_eq!(p.decap(&good, 8 + 13, 5), Err(Bad::Header));
        // Wrong flags: no I flag, extra flags, reserved bytes set.
        for (i, v) in [(0, 0u8), (0, 0x88), (1, 1), (3, 1), (7, 1)] {
            let mut h = good;
            h[i] = v;
            assert_eq!(p.decap(&h, 100, 5), Err(Bad::Header), "byte {i} = {v:#x}");
        }
        assert_eq!(p.decap(&good, 100, 6), Err(Bad::Vni));
        assert_eq!(p.decap(&p.header(5 | 1 << 20), 100, 5), Err(Bad::Vni));
    }

    #[test]
    fn hostile_geneve_is_refused_and_options_skipped() {
        let p = Proto::Geneve;
        // Options are skipped: 3 words.
        assert_eq!(p.decap(&geneve(3, 0, 0x6558, 7), 8 + 12 + 14, 7), Ok(12));
        // The O flag (control packet) alone is no reason to drop.
        assert_eq!(p.decap(&geneve(0, 0x80, 0x6558, 7), 8 + 60, 7), Ok(0));
        // Options overrunning the packet: 63 words (252 bytes) in a packet of 100.
        assert_eq!(p.decap(&geneve(63, 0, 0x6558, 7), 100, 7), Err(Bad::Header));
        // Options leaving less than an Ethernet header.
        assert_eq!(
            p.decap(&geneve(1, 0, 0x6558, 7), 8 + 4 + 13, 7),
            Err(Bad::Header)
        );
        // The critical flag.
        assert_eq!(
            p.decap(&geneve(1, 0x40, 0x6558, 7), 200, 7),
            Err(Bad::Critical)
        );
        // Version 1, another protocol, another VNI, truncated.
        assert_eq!(
            p.decap(&geneve(0x40, 0, 0x6558, 7), 200, 7),
            Err(Bad::Header)
        );
        assert_eq!(p.decap(&geneve(0, 0, 0x0800, 7), 200, 7), Err(Bad::Header));
        assert_eq!(p.decap(&geneve(0, 0, 0x6558, 8), 200, 7), Err(Bad::Vni));
        assert_eq!(
            p.decap(&geneve(0, 0, 0x6558, 7)[..4], 4, 7),
            Err(Bad::Header)
        );
    }
}

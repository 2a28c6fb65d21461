//! The wire formats the engine reads: Ethernet and 802.1Q, the EtherTypes and IP protocol
//! numbers that offloads, lookup modules and the pipeline share, written once here.
//!
//! Only constants and byte readers: each user keeps its own typed view where it reads a frame
//! on its hot path ([`crate::lookup::FrameMeta`] for stage 2, the offload resolver's header
//! walk), and takes the numbers from here.

/// An Ethernet header: destination, source, EtherType.
pub const ETH_HLEN: usize = 14;
/// An 802.1Q tag: TPID and TCI.
pub const VLAN_HLEN: usize = 4;

pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86dd;
/// An 802.1Q tag (the TPID of a customer VLAN tag).
pub const ETH_P_8021Q: u16 = 0x8100;
/// An 802.1ad service tag (QinQ's outer tag).
pub const ETH_P_8021AD: u16 = 0x88a8;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// The 802.1Q tag of VLAN `vid`, priority 0, as it goes on the wire.
pub const fn vlan_tag(vid: u16) -> [u8; VLAN_HLEN] {
    let tpid = ETH_P_8021Q.to_be_bytes();
    [tpid[0], tpid[1], (vid >> 8) as u8 & 0x0f, vid as u8]
}

/// The big-endian 16-bit field at `at` (the caller has checked that `b` holds it).
#[inline(always)]
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_is_tpid_then_vid() {
        assert_eq!(vlan_tag(0x123), [0x81, 0x00, 0x01, 0x23]);
        assert_eq!(vlan_tag(4095), [0x81, 0x00, 0x0f, 0xff]);
        assert_eq!(be16(&[0x86, 0xdd], 0), ETH_P_IPV6);
    }
}

//! Checksum and segmentation offload: the virtio-net header of TAP (and later vhost-user)
//! ports, carried through the switch in a slot's `ptr`, and done in software for ports that
//! cannot take it.
//!
//! A frame read from a TAP device with `IFF_VNET_HDR` may be a TCP segment of up to 64 KiB
//! (TSO/GSO) or have its L4 checksum left for later (`NEEDS_CSUM`). Between two ports that
//! accept offloads it crosses the switch as it is, with its header in [`Offload`]. Toward any
//! other port the switch finishes the work first ([`resolve`]): it splits the segment into
//! frames of at most `gso_size` payload bytes and computes the checksums.

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the L4 checksum at `csum_start + csum_offset` holds only the
/// pseudo-header sum; the rest is to be added from `csum_start` to the end.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was already verified.
pub const F_DATA_VALID: u8 = 2;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
/// UDP fragmentation offload (legacy UFO): not produced by vale's TAP ports.
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
/// UDP segmentation (USO): one UDP datagram per `gso_size` payload bytes.
pub const GSO_UDP_L4: u8 = 5;
pub const GSO_ECN: u8 = 0x80;

/// Length of `struct virtio_net_hdr`, as TAP ports use it.
pub const VNET_HDR_LEN: usize = 10;

/// The fields of a virtio-net header that matter past the device (`hdr_len` is recomputed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    pub flags: u8,
    pub gso_type: u8,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl Offload {
    /// Packs into a slot's 64-bit `ptr`.
    pub fn to_word(self) -> u64 {
        self.flags as u64
            | (self.gso_type as u64) << 8
            | (self.gso_size as u64) << 16
            | (self.csum_start as u64) << 32
            | (self.csum_offset as u64) << 48
    }

    pub fn from_word(w: u64) -> Offload {
        Offload {
            flags: w as u8,
            gso_type: (w >> 8) as u8,
            gso_size: (w >> 16) as u16,
            csum_start: (w >> 32) as u16,
            csum_offset: (w >> 48) as u16,
        }
    }

    /// Whether a port without offloads needs work done on the frame first.
    pub fn needs_work(self) -> bool {
        self.flags & F_NEEDS_CSUM != 0 || self.gso_type & !GSO_ECN != GSO_NONE
    }

    /// Parses a little-endian `struct virtio_net_hdr`.
    pub fn from_virtio(h: &[u8; VNET_HDR_LEN]) -> Offload {
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        Offload {
            flags: h[0],
            gso_type: h[1],
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
    }

    /// A little-endian `struct virtio_net_hdr`. `hdr_len` (a hint for the receiver's linear
    /// part) is the end of the checksum field, or 0.
    pub fn to_virtio(self) -> [u8; VNET_HDR_LEN] {
        let hdr_len = if self.flags & F_NEEDS_CSUM != 0 {
            self.csum_start.saturating_add(self.csum_offset).saturating_add(2)
        } else {
            0
        };
        let mut h = [0u8; VNET_HDR_LEN];
        h[0] = self.flags;
        h[1] = self.gso_type;
        h[2..4].copy_from_slice(&hdr_len.to_le_bytes());
        h[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        h[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        h[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_and_virtio_round_trip() {
        let o = Offload {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV6 | GSO_ECN,
            gso_size: 1440,
            csum_start: 54,
            csum_offset: 16,
        };
        assert_eq!(Offload::from_word(o.to_word()), o);
        assert_eq!(Offload::from_virtio(&o.to_virtio()), o);
        assert!(o.needs_work());
        assert!(!Offload::default().needs_work());
        assert!(!Offload {
            flags: F_DATA_VALID,
            ..Default::default()
        }
        .needs_work());
    }
}

//! netmap's ring layout, field for field (`net/netmap.h`, API 14).
//!
//! The layout is an interface fact: a netmap program finds rings, slots and buffers in a vale
//! region exactly as it does in a netmap one.

/// netmap API version reported in `netmap_if.ni_version`.
pub const NETMAP_API: u32 = 14;
/// netmap's cache alignment for ring headers and slot arrays.
pub const NM_CACHE_ALIGN: usize = 128;
/// `IFNAMSIZ`: size of `netmap_if.ni_name`.
pub const IFNAMSIZ: usize = 16;

/// The slot's buffer index was changed by the owner (zero-copy swap).
pub const NS_BUF_CHANGED: u16 = 0x0001;
/// Ask for a notification when this slot is done (accepted, ignored by vale).
pub const NS_REPORT: u16 = 0x0002;
/// netmap's host-stack forwarding flag (accepted, ignored by vale).
pub const NS_FORWARD: u16 = 0x0004;
/// Do not learn the source address of this frame (honoured by the learning bridge).
pub const NS_NO_LEARN: u16 = 0x0008;
/// `ptr` holds the payload address (not supported by vale: counted as bad input).
pub const NS_INDIRECT: u16 = 0x0010;
/// More slots of the same frame follow.
pub const NS_MOREFRAG: u16 = 0x0020;
/// vale: the first slot's `ptr` carries checksum and segmentation offload information (a
/// virtio-net header). Only on the rings of valed's own host ports (TAP); ignored when a
/// client sets it.
pub const NS_OFFLOAD: u16 = 0x0080;

/// Ring direction values of `netmap_ring.dir`.
pub const NR_TX: u16 = 0;
pub const NR_RX: u16 = 1;

/// `struct netmap_slot`: 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NetmapSlot {
    pub buf_idx: u32,
    pub len: u16,
    pub flags: u16,
    pub ptr: u64,
}

/// `struct timeval` as netmap embeds it on x86-64 Linux.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Timeval {
    pub tv_sec: i64,
    pub tv_usec: i64,
}

/// `struct netmap_ring` header: 256 bytes, then `slot[num_slots]`.
#[repr(C, align(128))]
pub struct NetmapRing {
    /// Offset from this ring to buffer 0 (may be negative in netmap; never in vale).
    pub buf_ofs: i64,
    pub num_slots: u32,
    pub nr_buf_size: u32,
    pub ringid: u16,
    pub dir: u16,
    pub head: u32,
    pub cur: u32,
    pub tail: u32,
    pub flags: u32,
    pub ts: Timeval,
    pub offset_mask: u64,
    pub buf_align: u64,
    pub sem: Sem,
    // slot[] follows at offset 256.
}

/// netmap's opaque `sem[128]`, cache aligned.
#[repr(C, align(128))]
pub struct Sem(pub [u8; 128]);

/// Offset of `slot[0]` from the start of a ring.
pub const RING_SLOTS_OFS: usize = 256;

/// `struct netmap_if` header: 56 bytes, then `ring_ofs[tx + host_tx + rx + host_rx]`.
#[repr(C)]
pub struct NetmapIf {
    pub ni_name: [u8; IFNAMSIZ],
    pub ni_version: u32,
    pub ni_flags: u32,
    pub ni_tx_rings: u32,
    pub ni_rx_rings: u32,
    pub ni_bufs_head: u32,
    pub ni_host_tx_rings: u32,
    pub ni_host_rx_rings: u32,
    pub ni_spare1: [u32; 3],
    // ring_ofs: [i64; ...] follows at offset 56.
}

/// Offset of `ring_ofs[0]` from the start of a `netmap_if`.
pub const NIFP_RING_OFS: usize = 56;

/// netmap's `nm_ring_next`.
#[inline(always)]
pub fn ring_next(i: u32, num_slots: u32) -> u32 {
    if i + 1 == num_slots {
        0
    } else {
        i + 1
    }
}

/// Slots between `from` and `to` going forward on a ring of `n` slots.
#[inline(always)]
pub fn ring_distance(from: u32, to: u32, n: u32) -> u32 {
    if to >= from {
        to - from
    } else {
        to + n - from
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_netmap() {
        assert_eq!(size_of::<NetmapSlot>(), 16);
        assert_eq!(offset_of!(NetmapSlot, len), 4);
        assert_eq!(offset_of!(NetmapSlot, flags), 6);
        assert_eq!(offset_of!(NetmapSlot, ptr), 8);
        assert_eq!(size_of::<NetmapRing>(), RING_SLOTS_OFS);
        assert_eq!(offset_of!(NetmapRing, num_slots), 8);
        assert_eq!(offset_of!(NetmapRing, nr_buf_size), 12);
        assert_eq!(offset_of!(NetmapRing, ringid), 16);
        assert_eq!(offset_of!(NetmapRing, dir), 18);
        assert_eq!(offset_of!(NetmapRing, head), 20);
        assert_eq!(offset_of!(NetmapRing, cur), 24);
        assert_eq!(offset_of!(NetmapRing, tail), 28);
        assert_eq!(offset_of!(NetmapRing, flags), 32);
        assert_eq!(offset_of!(NetmapRing, ts), 40);
        assert_eq!(offset_of!(NetmapRing, offset_mask), 56);
        assert_eq!(offset_of!(NetmapRing, buf_align), 64);
        assert_eq!(offset_of!(NetmapRing, sem), 128);
        assert_eq!(size_of::<NetmapIf>(), NIFP_RING_OFS);
        assert_eq!(offset_of!(NetmapIf, ni_version), 16);
        assert_eq!(offset_of!(NetmapIf, ni_tx_rings), 24);
        assert_eq!(offset_of!(NetmapIf, ni_rx_rings), 28);
        assert_eq!(offset_of!(NetmapIf, ni_host_tx_rings), 36);
        assert_eq!(offset_of!(NetmapIf, ni_host_rx_rings), 40);
    }

    #[test]
    fn ring_arithmetic() {
        assert_eq!(ring_next(3, 4), 0);
        assert_eq!(ring_next(2, 4), 3);
        assert_eq!(ring_distance(3, 1, 4), 2);
        assert_eq!(ring_distance(1, 3, 4), 2);
        assert_eq!(ring_distance(2, 2, 4), 0);
    }
}

//! The layout of one port's shared memory region.
//!
//! ```text
//! 0             RegionHeader (256 bytes): magic, ABI version, geometry, offsets
//! nifp_ofs      struct netmap_if, ring_ofs[] relative to it (tx rings, then rx rings)
//! rings_ofs     tx ring 0 .. tx ring T-1, rx ring 0 .. rx ring R-1, each ring_size bytes
//! csb_ofs       per ring (same order): CsbAtok (64 bytes) then CsbKtoa (64 bytes)
//! bufs_ofs      buffer 0 .. num_bufs-1, buf_size bytes each (0 and 1 reserved, as in netmap)
//! ```
//!
//! Both sides compute the layout from [`PortParams`] with [`Layout::new`]; the client checks
//! the header valed wrote against its own computation, so neither side trusts the other's
//! offsets.

use serde::{Deserialize, Serialize};

use crate::csb::CSB_RING_SIZE;
use crate::netmap::{NetmapSlot, NIFP_RING_OFS, RING_SLOTS_OFS};

/// Brings the cache line at `p` toward this CPU: a hint, for a slot or buffer of a region
/// about to be read (valed's gather, a client's busy wait).
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// "VALE" in memory order.
pub const VALE_MAGIC: u32 = u32::from_le_bytes(*b"VALE");
/// Bumped on any incompatible change of the region or the control protocol.
pub const VALE_ABI_VERSION: u32 = 2;
/// Size of [`RegionHeader`].
pub const REGION_HEADER_SIZE: usize = 256;
/// Buffers 0 and 1 are reserved, as netmap reserves them; slots start at this index.
pub const FIRST_SLOT_BUF: u32 = 2;

pub const MAX_RINGS: u32 = 16;
pub const MIN_SLOTS: u32 = 64;
pub const MAX_SLOTS: u32 = 4096;
pub const MIN_BUF_SIZE: u32 = 128;
pub const MAX_BUF_SIZE: u32 = 16384;
/// Buffer sizes are multiples of this, so the switch may copy whole 64-byte chunks.
pub const BUF_SIZE_ALIGN: u32 = 64;
/// Largest region valed will create for one port.
pub const MAX_REGION_SIZE: u64 = 1 << 30;
/// Largest frame (all slots of a `NS_MOREFRAG` chain together) the switch forwards.
pub const MAX_FRAME_LEN: u32 = 65536;
/// Most slots one `NS_MOREFRAG` chain may span.
pub const MAX_FRAGS: u32 = 512;

const PAGE: u64 = 4096;

/// Why port parameters or a region header are refused: the words name the field and its
/// allowed range, or what in the header is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// Tx or rx rings (`what`) out of 1 to [`MAX_RINGS`].
    #[error("{what} must be 1 to {MAX_RINGS}, not {n}")]
    Rings { what: &'static str, n: u32 },
    /// Slots per ring not a power of two from [`MIN_SLOTS`] to [`MAX_SLOTS`].
    #[error("slots per ring must be a power of two from {MIN_SLOTS} to {MAX_SLOTS}, not {0}")]
    Slots(u32),
    /// A buffer size not a multiple of [`BUF_SIZE_ALIGN`] from [`MIN_BUF_SIZE`] to
    /// [`MAX_BUF_SIZE`].
    #[error("buffer size must be a multiple of {BUF_SIZE_ALIGN} from {MIN_BUF_SIZE} to {MAX_BUF_SIZE}, not {0}")]
    BufSize(u32),
    /// The region these parameters make would be larger than [`MAX_REGION_SIZE`].
    #[error("port memory would be {0} bytes, more than the limit of {MAX_REGION_SIZE}")]
    TooLarge(u64),
    /// The header does not start with [`VALE_MAGIC`].
    #[error("bad region magic {0:#x}")]
    Magic(u32),
    /// The header is of another ABI version than [`VALE_ABI_VERSION`].
    #[error("valed speaks vale ABI version {0}, this client speaks {VALE_ABI_VERSION}")]
    Version(u32),
    /// The header's geometry is not the one the client computed.
    #[error("region header does not match the requested port geometry")]
    Geometry,
}

/// What a client chooses when it opens a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortParams {
    pub tx_rings: u32,
    pub rx_rings: u32,
    /// Slots per ring, a power of two.
    pub slots: u32,
    /// Bytes per buffer, a multiple of 64.
    pub buf_size: u32,
}

/// Default buffer size (see [`PortParams::default`]).
pub const DEFAULT_BUF_SIZE: u32 = 2112;

impl Default for PortParams {
    fn default() -> Self {
        PortParams {
            tx_rings: 1,
            rx_rings: 1,
            slots: 1024,
            // 2048 + 64: consecutive buffers start in different L1 cache sets. With 2048, every
            // other buffer maps to the same few sets, and copying short frames between two
            // ports' buffers misses more (measured: 60-byte frames 5% faster at 2112).
            buf_size: DEFAULT_BUF_SIZE,
        }
    }
}

impl PortParams {
    /// Checks every field; the message names the field and its allowed range.
    pub fn validate(&self) -> Result<(), RegionError> {
        for (what, n) in [("tx rings", self.tx_rings), ("rx rings", self.rx_rings)] {
            if !(1..=MAX_RINGS).contains(&n) {
                return Err(RegionError::Rings { what, n });
            }
        }
        if !(MIN_SLOTS..=MAX_SLOTS).contains(&self.slots) || !self.slots.is_power_of_two() {
            return Err(RegionError::Slots(self.slots));
        }
        if !(MIN_BUF_SIZE..=MAX_BUF_SIZE).contains(&self.buf_size)
            || !self.buf_size.is_multiple_of(BUF_SIZE_ALIGN)
        {
            return Err(RegionError::BufSize(self.buf_size));
        }
        let size = Layout::compute(self).region_size;
        if size > MAX_REGION_SIZE {
            return Err(RegionError::TooLarge(size));
        }
        Ok(())
    }
}

/// Offsets of everything in a region, derived from [`PortParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub params: PortParams,
    pub nifp_ofs: u64,
    pub rings_ofs: u64,
    pub ring_size: u64,
    pub csb_ofs: u64,
    pub bufs_ofs: u64,
    pub num_bufs: u32,
    pub region_size: u64,
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Layout {
    /// The layout for valid parameters (see [`PortParams::validate`]).
    pub fn new(params: &PortParams) -> Result<Layout, RegionError> {
        params.validate()?;
        Ok(Self::compute(params))
    }

    fn compute(p: &PortParams) -> Layout {
        let rings = (p.tx_rings + p.rx_rings) as u64;
        let nifp_ofs = REGION_HEADER_SIZE as u64;
        let nifp_size = NIFP_RING_OFS as u64 + 8 * rings;
        let rings_ofs = align_up(nifp_ofs + nifp_size, 256);
        let ring_size = align_up(
            RING_SLOTS_OFS as u64 + p.slots as u64 * std::mem::size_of::<NetmapSlot>() as u64,
            256,
        );
        let csb_ofs = align_up(rings_ofs + rings * ring_size, PAGE);
        let bufs_ofs = align_up(csb_ofs + rings * CSB_RING_SIZE as u64, PAGE);
        let num_bufs = FIRST_SLOT_BUF as u64 + rings * p.slots as u64;
        let region_size = align_up(bufs_ofs + num_bufs * p.buf_size as u64, PAGE);
        Layout {
            params: *p,
            nifp_ofs,
            rings_ofs,
            ring_size,
            csb_ofs,
            bufs_ofs,
            num_bufs: num_bufs.min(u32::MAX as u64) as u32,
            region_size,
        }
    }

    pub fn num_rings(&self) -> u32 {
        self.params.tx_rings + self.params.rx_rings
    }

    /// Ring `i` in region order: tx rings first, then rx rings.
    pub fn ring_ofs(&self, i: u32) -> u64 {
        self.rings_ofs + i as u64 * self.ring_size
    }

    pub fn csb_atok_ofs(&self, i: u32) -> u64 {
        self.csb_ofs + i as u64 * CSB_RING_SIZE as u64
    }

    pub fn csb_ktoa_ofs(&self, i: u32) -> u64 {
        self.csb_atok_ofs(i) + 64
    }

    /// The header valed writes at offset 0.
    pub fn header(&self, name: &str) -> RegionHeader {
        let mut n = [0u8; 64];
        let len = name.len().min(63);
        n[..len].copy_from_slice(&name.as_bytes()[..len]);
        RegionHeader {
            magic: VALE_MAGIC,
            abi_version: VALE_ABI_VERSION,
            header_size: REGION_HEADER_SIZE as u32,
            flags: 0,
            region_size: self.region_size,
            nifp_ofs: self.nifp_ofs,
            rings_ofs: self.rings_ofs,
            csb_ofs: self.csb_ofs,
            bufs_ofs: self.bufs_ofs,
            tx_rings: self.params.tx_rings,
            rx_rings: self.params.rx_rings,
            num_slots: self.params.slots,
            buf_size: self.params.buf_size,
            num_bufs: self.num_bufs,
            ring_size: self.ring_size as u32,
            name: n,
            pad: [0; 112],
        }
    }

    /// Checks a header read from a mapped region against this layout.
    pub fn check_header(&self, h: &RegionHeader) -> Result<(), RegionError> {
        if h.magic != VALE_MAGIC {
            return Err(RegionError::Magic(h.magic));
        }
        if h.abi_version != VALE_ABI_VERSION {
            return Err(RegionError::Version(h.abi_version));
        }
        let expect = self.header("");
        let same = h.header_size == expect.header_size
            && h.region_size == expect.region_size
            && h.nifp_ofs == expect.nifp_ofs
            && h.rings_ofs == expect.rings_ofs
            && h.csb_ofs == expect.csb_ofs
            && h.bufs_ofs == expect.bufs_ofs
            && h.tx_rings == expect.tx_rings
            && h.rx_rings == expect.rx_rings
            && h.num_slots == expect.num_slots
            && h.buf_size == expect.buf_size
            && h.num_bufs == expect.num_bufs
            && h.ring_size == expect.ring_size;
        if same {
            Ok(())
        } else {
            Err(RegionError::Geometry)
        }
    }
}

/// `struct vale_region`: the first 256 bytes of every port region.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RegionHeader {
    pub magic: u32,
    pub abi_version: u32,
    pub header_size: u32,
    pub flags: u32,
    pub region_size: u64,
    pub nifp_ofs: u64,
    pub rings_ofs: u64,
    pub csb_ofs: u64,
    pub bufs_ofs: u64,
    pub tx_rings: u32,
    pub rx_rings: u32,
    pub num_slots: u32,
    pub buf_size: u32,
    pub num_bufs: u32,
    pub ring_size: u32,
    /// The port's full name `valeX:Y`, NUL-terminated.
    pub name: [u8; 64],
    pub pad: [u8; 112],
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn header_layout() {
        assert_eq!(size_of::<RegionHeader>(), REGION_HEADER_SIZE);
        assert_eq!(offset_of!(RegionHeader, region_size), 16);
        assert_eq!(offset_of!(RegionHeader, nifp_ofs), 24);
        assert_eq!(offset_of!(RegionHeader, rings_ofs), 32);
        assert_eq!(offset_of!(RegionHeader, csb_ofs), 40);
        assert_eq!(offset_of!(RegionHeader, bufs_ofs), 48);
        assert_eq!(offset_of!(RegionHeader, tx_rings), 56);
        assert_eq!(offset_of!(RegionHeader, num_bufs), 72);
        assert_eq!(offset_of!(RegionHeader, ring_size), 76);
        assert_eq!(offset_of!(RegionHeader, name), 80);
    }

    #[test]
    fn default_layout_is_sane() {
        let l = Layout::new(&PortParams::default()).unwrap();
        assert_eq!(l.ring_size, 256 + 1024 * 16);
        assert!(l.csb_ofs >= l.ring_ofs(2));
        assert_eq!(l.bufs_ofs % 4096, 0);
        assert_eq!(l.num_bufs, 2 + 2 * 1024);
        let end = l.bufs_ofs + l.num_bufs as u64 * DEFAULT_BUF_SIZE as u64;
        assert!(l.region_size >= end && l.region_size < end + 4096);
    }

    #[test]
    fn rejects_bad_params() {
        let ok = PortParams::default();
        for bad in [
            PortParams { tx_rings: 0, ..ok },
            PortParams { rx_rings: 17, ..ok },
            PortParams { slots: 1000, ..ok },
            PortParams { slots: 32, ..ok },
            PortParams {
                buf_size: 100,
                ..ok
            },
            PortParams {
                buf_size: 32768,
                ..ok
            },
            PortParams {
                tx_rings: 16,
                rx_rings: 16,
                slots: 4096,
                buf_size: 16384,
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let words = |p: PortParams| p.validate().unwrap_err().to_string();
        assert_eq!(
            words(PortParams { rx_rings: 17, ..ok }),
            "rx rings must be 1 to 16, not 17"
        );
        assert_eq!(
            words(PortParams { slots: 1000, ..ok }),
            "slots per ring must be a power of two from 64 to 4096, not 1000"
        );
        assert_eq!(
            words(PortParams {
                buf_size: 100,
                ..ok
            }),
            "buffer size must be a multiple of 64 from 128 to 16384, not 100"
        );
    }

    #[test]
    fn header_checks_name_what_is_wrong() {
        let l = Layout::new(&PortParams::default()).unwrap();
        let mut h = l.header("vale0:a");
        assert_eq!(l.check_header(&h), Ok(()));
        h.abi_version = 1;
        assert_eq!(
            l.check_header(&h).unwrap_err().to_string(),
            format!("valed speaks vale ABI version 1, this client speaks {VALE_ABI_VERSION}")
        );
        h.magic = 0;
        assert_eq!(
            l.check_header(&h).unwrap_err().to_string(),
            "bad region magic 0x0"
        );
        let mut h = l.header("vale0:a");
        h.num_bufs += 1;
        assert_eq!(l.check_header(&h), Err(RegionError::Geometry));
    }
}

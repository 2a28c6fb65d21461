//! valed's side of a port's shared memory region.
//!
//! The region is a sealed memfd: the client can write anything into it but cannot shrink it,
//! so valed never faults on a page the client took away. Everything valed reads from it is
//! treated as hostile by the pipeline; this module only hands out addresses.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;

use vale_abi::csb::{CsbAtok, CsbKtoa};
use vale_abi::netmap::{
    NetmapIf, NetmapRing, NetmapSlot, NETMAP_API, NIFP_RING_OFS, NR_RX, NR_TX, RING_SLOTS_OFS,
};
use vale_abi::region::{Layout, RegionHeader, FIRST_SLOT_BUF};

pub struct Region {
    base: NonNull<u8>,
    layout: Layout,
    memfd: OwnedFd,
}

// SAFETY: the region is plain shared memory; all concurrent access goes through atomics or
// volatile reads/writes of values that are validated before use.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

/// A memfd named `name` of `size` zeroed bytes, sealed against shrinking and growing (so that
/// the client it is shared with cannot cut it under valed's mapping), mapped shared.
pub fn sealed_shared_memory(name: &str, size: usize) -> io::Result<(OwnedFd, NonNull<u8>)> {
    let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: plain syscalls; each result is checked.
    unsafe {
        let fd = libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let memfd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd, size as libc::off_t) < 0 {
            return Err(io::Error::last_os_error());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        if libc::fcntl(fd, libc::F_ADD_SEALS, seals) < 0 {
            return Err(io::Error::last_os_error());
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok((memfd, NonNull::new_unchecked(p as *mut u8)))
    }
}

impl Region {
    /// Creates, seals, maps and initialises the region of port `name`.
    pub fn create(name: &str, layout: Layout) -> io::Result<Region> {
        let (memfd, base) =
            sealed_shared_memory(&format!("vale:{name}"), layout.region_size as usize)?;
        let region = Region {
            base,
            layout,
            memfd,
        };
        region.init(name);
        Ok(region)
    }

    /// Writes the header, the `netmap_if`, every ring header and slot, and the CSB.
    fn init(&self, name: &str) {
        let l = &self.layout;
        let p = &l.params;
        // SAFETY: every offset below comes from the layout and lies inside the mapping; the
        // memory is freshly zeroed and not yet shared with anyone.
        unsafe {
            std::ptr::write(self.at::<RegionHeader>(0), l.header(name));
            let nifp = self.at::<NetmapIf>(l.nifp_ofs);
            let short = name.as_bytes();
            let n = short.len().min(15);
            (&mut (*nifp).ni_name)[..n].copy_from_slice(&short[..n]);
            (*nifp).ni_version = NETMAP_API;
            (*nifp).ni_tx_rings = p.tx_rings;
            (*nifp).ni_rx_rings = p.rx_rings;
            let ring_ofs = self.at::<i64>(l.nifp_ofs + NIFP_RING_OFS as u64);
            for i in 0..l.num_rings() {
                let is_tx = i < p.tx_rings;
                let ring_off = l.ring_ofs(i);
                *ring_ofs.add(i as usize) = (ring_off - l.nifp_ofs) as i64;
                let ring = self.at::<NetmapRing>(ring_off);
                (*ring).buf_ofs = (l.bufs_ofs - ring_off) as i64;
                (*ring).num_slots = p.slots;
                (*ring).nr_buf_size = p.buf_size;
                (*ring).ringid = if is_tx { i } else { i - p.tx_rings } as u16;
                (*ring).dir = if is_tx { NR_TX } else { NR_RX };
                // tx: every slot but one is the client's; rx: none is yet.
                let tail = if is_tx { p.slots - 1 } else { 0 };
                (*ring).tail = tail;
                let slots = self.at::<NetmapSlot>(ring_off + RING_SLOTS_OFS as u64);
                for s in 0..p.slots {
                    (*slots.add(s as usize)).buf_idx = FIRST_SLOT_BUF + i * p.slots + s;
                    (*slots.add(s as usize)).len = if is_tx { 0 } else { p.buf_size as u16 };
                }
                let ktoa = self.ktoa(i);
                ktoa.hwtail.store(tail, Relaxed);
                // valed starts asleep on every tx ring: the first packet must kick it.
                ktoa.kern_need_kick.store(is_tx as u32, Relaxed);
            }
        }
    }

    #[inline(always)]
    fn at<T>(&self, ofs: u64) -> *mut T {
        debug_assert!(ofs as usize + std::mem::size_of::<T>() <= self.layout.region_size as usize);
        // SAFETY: callers pass offsets computed from the layout, inside the mapping.
        unsafe { self.base.as_ptr().add(ofs as usize) as *mut T }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn memfd(&self) -> &OwnedFd {
        &self.memfd
    }

    /// Slot `s` (already reduced modulo the ring size) of region ring `ring`.
    #[inline(always)]
    pub fn slot(&self, ring: u32, s: u32) -> *mut NetmapSlot {
        self.at(self.layout.ring_ofs(ring) + RING_SLOTS_OFS as u64 + 16 * s as u64)
    }

    /// Buffer `idx`, which the caller has checked against `num_bufs`.
    #[inline(always)]
    pub fn buf(&self, idx: u32) -> *mut u8 {
        self.at(self.layout.bufs_ofs + idx as u64 * self.layout.params.buf_size as u64)
    }

    #[inline(always)]
    pub fn atok(&self, ring: u32) -> &CsbAtok {
        // SAFETY: in the mapping, aligned to 64; only atomics are read through the reference.
        unsafe { &*self.at::<CsbAtok>(self.layout.csb_atok_ofs(ring)) }
    }

    #[inline(always)]
    pub fn ktoa(&self, ring: u32) -> &CsbKtoa {
        // SAFETY: as for atok.
        unsafe { &*self.at::<CsbKtoa>(self.layout.csb_ktoa_ofs(ring)) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `create`.
        unsafe {
            libc::munmap(
                self.base.as_ptr() as *mut libc::c_void,
                self.layout.region_size as usize,
            )
        };
    }
}

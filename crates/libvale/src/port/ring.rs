//! A ring of a port as the client sees it: netmap's ring, its slots and buffers, with the
//! geometry valed and the client computed (never the header, which the client may overwrite).

use super::*;

/// A netmap ring of an open port, with netmap's helpers. Valid while its [`Port`] is.
#[derive(Clone, Copy)]
pub struct Ring {
    pub(super) ptr: NonNull<NetmapRing>,
    pub(super) bufs: NonNull<u8>,
    pub(super) num_bufs: u32,
    // Geometry from the layout both sides computed, not from the ring header, which the
    // client may overwrite: the bounds checks below must hold whatever the header says.
    pub(super) num_slots: u32,
    pub(super) buf_size: u32,
}

impl Ring {
    #[inline(always)]
    fn hdr(&self) -> *mut NetmapRing {
        self.ptr.as_ptr()
    }
    #[inline(always)]
    pub fn num_slots(&self) -> u32 {
        self.num_slots
    }
    #[inline(always)]
    pub fn buf_size(&self) -> u32 {
        self.buf_size
    }
    #[inline(always)]
    pub fn head(&self) -> u32 {
        // SAFETY (all accessors): the ring header lies in the port's mapping; the client is
        // its only writer.
        unsafe { (*self.hdr()).head }
    }
    #[inline(always)]
    pub fn cur(&self) -> u32 {
        unsafe { (*self.hdr()).cur }
    }
    #[inline(always)]
    pub fn tail(&self) -> u32 {
        unsafe { (*self.hdr()).tail }
    }
    #[inline(always)]
    pub fn set_head(&self, v: u32) {
        unsafe { (*self.hdr()).head = v }
    }
    #[inline(always)]
    pub fn set_cur(&self, v: u32) {
        unsafe { (*self.hdr()).cur = v }
    }
    #[inline(always)]
    pub(super) fn set_tail(&self, v: u32) {
        unsafe { (*self.hdr()).tail = v }
    }
    /// netmap's `nm_ring_next`.
    #[inline(always)]
    pub fn next(&self, i: u32) -> u32 {
        vale_abi::netmap::ring_next(i, self.num_slots())
    }
    /// netmap's `nm_ring_space`: slots from `cur` to `tail`.
    #[inline(always)]
    pub fn space(&self) -> u32 {
        vale_abi::netmap::ring_distance(self.cur(), self.tail(), self.num_slots())
    }
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.cur() == self.tail()
    }
    /// Moves `head` and `cur` forward by `n` slots.
    #[inline(always)]
    pub fn advance(&self, n: u32) {
        let v = (self.cur() + n) % self.num_slots();
        self.set_cur(v);
        self.set_head(v);
    }
    /// Slot `i` (`i` < `num_slots`).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub fn slot(&self, i: u32) -> &mut NetmapSlot {
        assert!(i < self.num_slots(), "slot index out of range");
        // SAFETY: in range; slots of a ring are the client's between head and tail.
        unsafe {
            &mut *((self.hdr() as *mut u8).add(RING_SLOTS_OFS + 16 * i as usize) as *mut NetmapSlot)
        }
    }
    /// Buffer `idx`, as netmap's `NETMAP_BUF(ring, idx)`.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub fn buf(&self, idx: u32) -> &mut [u8] {
        assert!(idx < self.num_bufs, "buffer index out of range");
        let size = self.buf_size() as usize;
        // SAFETY: index checked against the pool of this port's own mapping.
        unsafe { std::slice::from_raw_parts_mut(self.bufs.as_ptr().add(idx as usize * size), size) }
    }
}

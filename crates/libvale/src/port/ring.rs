//! A ring of a port as the client sees it: netmap's ring, its slots and buffers, with the
//! geometry valed and the client computed (never the header, which the client may overwrite).

use super::*;

/// A netmap ring of an open port, with netmap's helpers: a view that borrows its [`Port`], so
/// it cannot outlive the mapping, and gives `&mut` to a slot or a buffer only through
/// `&mut self` (it is neither `Copy` nor `Clone`), so one view never hands out two `&mut` to
/// one slot.
///
/// What a view cannot stop: two views of the same ring (each [`Port::tx_ring`] call makes
/// one) or two rings whose slots name the same buffer of the port's pool (`NS_BUF_CHANGED`)
/// reach the same memory. Keep one view of a ring at a time, and hand a buffer from one ring
/// to another by its index, not while holding a slice of it.
pub struct Ring<'p> {
    pub(super) ptr: NonNull<NetmapRing>,
    pub(super) bufs: NonNull<u8>,
    pub(super) num_bufs: u32,
    // Geometry from the layout both sides computed, not from the ring header, which the
    // client may overwrite: the bounds checks below must hold whatever the header says.
    pub(super) num_slots: u32,
    pub(super) buf_size: u32,
    pub(super) _port: std::marker::PhantomData<&'p Port>,
}

impl Ring<'_> {
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
        // SAFETY (all accessors): the ring header lies in the port's mapping, which outlives
        // the view; the client is its only writer.
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
    pub fn set_head(&mut self, v: u32) {
        unsafe { (*self.hdr()).head = v }
    }
    #[inline(always)]
    pub fn set_cur(&mut self, v: u32) {
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
    pub fn advance(&mut self, n: u32) {
        let v = (self.cur() + n) % self.num_slots();
        self.set_cur(v);
        self.set_head(v);
    }
    #[inline(always)]
    fn slot_ptr(&self, i: u32) -> *mut NetmapSlot {
        assert!(i < self.num_slots(), "slot index out of range");
        // SAFETY: in range of this ring's slots, in the mapping.
        unsafe { (self.hdr() as *mut u8).add(RING_SLOTS_OFS + 16 * i as usize) as *mut NetmapSlot }
    }
    #[inline(always)]
    fn buf_ptr(&self, idx: u32) -> *mut u8 {
        assert!(idx < self.num_bufs, "buffer index out of range");
        // SAFETY: index checked against the pool of this port's own mapping.
        unsafe {
            self.bufs
                .as_ptr()
                .add(idx as usize * self.buf_size as usize)
        }
    }
    /// Brings the buffer of the slot at `tail` toward this CPU: on an rx ring, where valed
    /// writes the next frame (into the buffer the slot names already). A busy wait calls this
    /// between its looks at `hwtail`, so that once it moves the frame is read while the
    /// slot's line comes, not after it (busy ping-pong 2.9 -> 2.6 us where a cache line takes
    /// 0.26 us between two CPUs; docs/benchmarks.md). Does nothing on a tail out of range.
    #[inline(always)]
    pub(super) fn prefetch_next(&self) {
        let tail = self.tail();
        if tail >= self.num_slots() {
            return;
        }
        // SAFETY: a slot of this ring (checked above); read once, volatile (valed writes it).
        let idx = unsafe { std::ptr::read_volatile(&(*self.slot_ptr(tail)).buf_idx) };
        if idx < self.num_bufs {
            vale_abi::region::prefetch(self.buf_ptr(idx));
        }
    }
    /// Slot `i` (`i` < `num_slots`).
    #[inline(always)]
    pub fn slot(&self, i: u32) -> &NetmapSlot {
        // SAFETY: a slot of this ring; slots between head and tail are the client's.
        unsafe { &*self.slot_ptr(i) }
    }
    /// Slot `i`, to change.
    #[inline(always)]
    pub fn slot_mut(&mut self, i: u32) -> &mut NetmapSlot {
        // SAFETY: as `slot`, borrowed through `&mut self`.
        unsafe { &mut *self.slot_ptr(i) }
    }
    /// Buffer `idx`, as netmap's `NETMAP_BUF(ring, idx)`.
    #[inline(always)]
    pub fn buf(&self, idx: u32) -> &[u8] {
        // SAFETY: a buffer of the port's pool, `buf_size` bytes.
        unsafe { std::slice::from_raw_parts(self.buf_ptr(idx), self.buf_size as usize) }
    }
    /// Buffer `idx`, to write.
    #[inline(always)]
    pub fn buf_mut(&mut self, idx: u32) -> &mut [u8] {
        // SAFETY: as `buf`, borrowed through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.buf_ptr(idx), self.buf_size as usize) }
    }
    /// Slot `i` and the buffer it names, both to change: how a frame is written (the slot
    /// lies in the ring, the buffer in the pool: they never overlap).
    #[inline(always)]
    pub fn slot_and_buf(&mut self, i: u32) -> (&mut NetmapSlot, &mut [u8]) {
        let slot = self.slot_ptr(i);
        // SAFETY: a slot of this ring; its buffer index is read once and checked.
        let buf = self.buf_ptr(unsafe { (*slot).buf_idx });
        // SAFETY: disjoint memory, both borrowed through `&mut self`.
        unsafe {
            (
                &mut *slot,
                std::slice::from_raw_parts_mut(buf, self.buf_size as usize),
            )
        }
    }
}

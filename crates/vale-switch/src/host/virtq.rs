//! The data path of a split virtqueue (virtio 1.x, section 2.7), hand-written: the per-frame
//! and per-descriptor work of vhost-user ports. The queue's setup (addresses, size, enables,
//! event index, notification suppression toward the guest) stays with virtio-queue's `Queue`;
//! a [`Virtq`] takes its position for one pass and gives it back with [`Virtq::finish`].
//!
//! Why by hand: with virtio-queue and vm-memory every descriptor read, avail entry and used
//! element is a call through vm-memory's generic slice iterator, and the used index is stored
//! after each element. At 60-byte frames those took 38% of the port's worker (perf, AMD EPYC):
//! here the three rings are looked up in the memory table once per pass and then read and
//! written in place, and the used index is published once per burst.
//!
//! Each field is read or written whole, with one load or store of its own width (the rings
//! are checked to be aligned as virtio requires): a volatile access to a byte array compiles
//! to a load per byte, which cost a descriptor some 40 instructions. The avail index is read
//! once per burst (again only when the chains it showed are taken), as DPDK's vhost library
//! does, and [`Virtq::pop_one`] takes the common chain of one descriptor without a list.
//!
//! Everything here is read from memory the guest writes at will: indices are reduced to the
//! queue size, a chain is cut at the queue size (a loop), a descriptor index outside the
//! table or an indirect descriptor (not negotiated) is an error, and every buffer address is
//! checked against the memory table before it is touched.

use std::marker::PhantomData;
use std::sync::atomic::{fence, Ordering};

use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// One descriptor of a chain.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    pub addr: GuestAddress,
    pub len: u32,
    /// The device writes this buffer (an rx buffer).
    pub write: bool,
}

/// What was wrong with the queue or a chain.
#[derive(Debug)]
pub enum VirtqError {
    /// The avail index ran more than a queue ahead of the device.
    AvailJump,
    /// The chain loops, is longer than the queue, or names a descriptor outside the table.
    Cut,
    /// An indirect descriptor (not negotiated).
    Indirect,
}

impl std::fmt::Display for VirtqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VirtqError::AvailJump => write!(f, "avail index more than a queue ahead"),
            VirtqError::Cut => write!(
                f,
                "descriptor chain loops, is too long or points outside its table"
            ),
            VirtqError::Indirect => write!(f, "indirect descriptor (not negotiated)"),
        }
    }
}

/// What [`Virtq::pop`] found.
pub enum Popped {
    /// No chain available.
    Empty,
    /// Chain `head`, its descriptors appended to the caller's list.
    Chain(u16),
    /// Chain `head` is broken: it is to be returned used, empty.
    Bad(u16, VirtqError),
    /// The avail ring cannot be read: nothing taken.
    Stuck(VirtqError),
}

/// What [`Virtq::pop_one`] found.
pub enum One {
    /// No chain available.
    Empty,
    /// Chain `head` is this one descriptor.
    Desc(u16, Desc),
    /// A chain of another shape, a broken one, or an avail ring that cannot be read: nothing
    /// taken, for [`Virtq::pop`] to deal with.
    Other,
}

/// A queue's rings in valed's mapping of guest memory, for one pass under the queue's lock.
pub struct Virtq<'m> {
    desc: *const u8,
    avail: *const u8,
    used: *mut u8,
    size: u16,
    next_avail: u16,
    /// The avail index as last read: the chains before it are read without reading the
    /// index again (one read of it per burst, not per chain).
    avail_seen: u16,
    next_used: u16,
    /// The used index when the guest was last told (or at the start of the pass).
    told_used: u16,
    event_idx: bool,
    /// The region of guest memory [`Virtq::range`] last found a buffer in: its guest start
    /// and end, and where its start is in valed. Looked at first: a guest's buffers are
    /// mostly in one region.
    near: (u64, u64, *mut u8),
    /// The queue's cursors (avail, used) and the used index, when they disagreed at
    /// [`Virtq::new`] and the queue was taken up at the used index.
    took_up: Option<(u16, u16, u16)>,
    _mem: PhantomData<&'m GuestMemoryMmap>,
}

impl<'m> Virtq<'m> {
    /// The rings of `q`, if the queue is ready and each ring lies within one region of `mem`,
    /// aligned as virtio requires (descriptors 16 bytes, avail ring 2, used ring 4): then
    /// every field is read and written whole, with one load or store of its own width.
    pub fn new(q: &Queue, mem: &'m GuestMemoryMmap) -> Option<Virtq<'m>> {
        let size = q.size();
        if !q.ready() || size == 0 {
            return None;
        }
        let n = size as usize;
        let desc = guest_range(mem, GuestAddress(q.desc_table()), 16 * n)?;
        let avail = guest_range(mem, GuestAddress(q.avail_ring()), 6 + 2 * n)?;
        let used = guest_range(mem, GuestAddress(q.used_ring()), 6 + 8 * n)?;
        if desc as usize & 15 != 0 || avail as usize & 1 != 0 || used as usize & 3 != 0 {
            return None;
        }
        // Where the device stands is where the used ring says: valed returns every chain it
        // takes within the pass, so between passes its two cursors and the used index agree.
        // A queue that disagrees was set up by a front end that kept its ring from an earlier
        // back end (valed killed and started again: DPDK's virtio_user sends base 0 whatever
        // its ring holds) and is taken up at the used index, as DPDK's vhost library and
        // QEMU's crash recovery do: chains the old back end took and never returned are lost.
        // SAFETY: the used ring's index field, inside the ring checked above (2-aligned).
        let at = u16::from_le(unsafe { std::ptr::read_volatile(used.add(2) as *const u16) });
        let took_up = (q.next_avail() != at || q.next_used() != at)
            .then(|| (q.next_avail(), q.next_used(), at));
        Some(Virtq {
            desc,
            avail,
            used,
            size,
            next_avail: at,
            avail_seen: at,
            next_used: at,
            told_used: at,
            took_up,
            event_idx: q.event_idx_enabled(),
            // Matches no address (start above end).
            near: (1, 0, std::ptr::null_mut()),
            _mem: PhantomData,
        })
    }

    /// [`guest_range`], the region last found looked at first. `mem` is the table the queue
    /// was opened with ([`Virtq::new`]).
    #[inline(always)]
    pub fn range(
        &mut self,
        mem: &'m GuestMemoryMmap,
        addr: GuestAddress,
        len: usize,
    ) -> Option<*mut u8> {
        let a = addr.raw_value();
        let (start, end, host) = self.near;
        if a >= start && a.checked_add(len as u64).is_some_and(|e| e <= end) {
            // SAFETY: `a - start` is inside the region found before in `mem` (which the pass
            // holds), and so are the `len` bytes from there.
            return Some(unsafe { host.add((a - start) as usize) });
        }
        let region = mem.find_region(addr)?;
        let start = region.start_addr().raw_value();
        let host = region.get_host_address(MemoryRegionAddress(0)).ok()?;
        self.near = (start, start.saturating_add(region.len()), host);
        let end = (a - start).checked_add(len as u64)?;
        if end > region.len() {
            return None;
        }
        // SAFETY: inside the region, as just checked.
        Some(unsafe { host.add((a - start) as usize) })
    }

    /// The queue's cursors (avail, used) and the used index it was taken up at, if they
    /// disagreed when this pass began (see [`Virtq::new`]).
    pub fn took_up(&self) -> Option<(u16, u16, u16)> {
        self.took_up
    }

    /// The index of the next chain to take.
    pub fn next_avail(&self) -> u16 {
        self.next_avail
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// The ring position of index `i`: masked with `size - 1`, not divided (a split queue's
    /// size is a power of two, which virtio-queue enforces; with any other size the masked
    /// position is still below `size`, so still inside the rings).
    #[inline(always)]
    fn position(&self, i: u16) -> usize {
        (i & (self.size - 1)) as usize
    }

    /// Gives the queue its new position.
    pub fn finish(self, q: &mut Queue) {
        q.set_next_avail(self.next_avail);
        q.set_next_used(self.next_used);
    }

    #[inline(always)]
    fn avail_u16(&self, at: usize) -> u16 {
        // SAFETY: `at + 2 <= 6 + 2 * size`, inside the avail ring checked in `new`, and `at`
        // is even (the ring is 2-aligned); the guest may write it at any time, hence volatile.
        u16::from_le(unsafe { std::ptr::read_volatile(self.avail.add(at) as *const u16) })
    }

    /// Puts the chains taken since `next_avail` was `to` back: the next pop takes them again,
    /// the avail index read anew (so that it is checked against this position).
    #[inline]
    pub fn rewind(&mut self, to: u16) {
        self.next_avail = to;
        self.avail_seen = to;
    }

    /// Takes the next available chain when it is one descriptor: the common case, without a
    /// list. Anything else is left where it is ([`One::Other`]).
    #[inline(always)]
    pub fn pop_one(&mut self) -> One {
        if self.next_avail == self.avail_seen {
            let avail_idx = self.avail_u16(2);
            let ahead = avail_idx.wrapping_sub(self.next_avail);
            if ahead == 0 {
                return One::Empty;
            }
            if ahead > self.size {
                return One::Other;
            }
            self.avail_seen = avail_idx;
            // The ring entries and the descriptors are read after the index.
            fence(Ordering::Acquire);
        }
        let head = self.avail_u16(4 + 2 * self.position(self.next_avail));
        if head >= self.size {
            return One::Other;
        }
        // SAFETY: descriptor `head < size` of the table checked in `new`, 16-aligned; each
        // half read once, volatile, as in `pop`.
        let (addr, rest) = unsafe {
            let d = self.desc.add(16 * head as usize) as *const u64;
            (
                u64::from_le(std::ptr::read_volatile(d)),
                u64::from_le(std::ptr::read_volatile(d.add(1))),
            )
        };
        let flags = (rest >> 32) as u16;
        if flags & (DESC_F_NEXT | DESC_F_INDIRECT) != 0 {
            return One::Other;
        }
        self.next_avail = self.next_avail.wrapping_add(1);
        One::Desc(
            head,
            Desc {
                addr: GuestAddress(addr),
                len: rest as u32,
                write: flags & DESC_F_WRITE != 0,
            },
        )
    }

    /// Takes the next available chain, appending its descriptors to `descs`.
    #[inline]
    pub fn pop(&mut self, descs: &mut Vec<Desc>) -> Popped {
        if self.next_avail == self.avail_seen {
            // What the guest made available since the index was last read.
            let avail_idx = self.avail_u16(2);
            let ahead = avail_idx.wrapping_sub(self.next_avail);
            if ahead == 0 {
                return Popped::Empty;
            }
            if ahead > self.size {
                return Popped::Stuck(VirtqError::AvailJump);
            }
            self.avail_seen = avail_idx;
            // The ring entries and the descriptors are read after the index.
            fence(Ordering::Acquire);
        }
        let head = self.avail_u16(4 + 2 * self.position(self.next_avail));
        self.next_avail = self.next_avail.wrapping_add(1);
        let mut i = head;
        let mut count = 0u16;
        loop {
            if i >= self.size || count == self.size {
                return Popped::Bad(head, VirtqError::Cut);
            }
            // SAFETY: descriptor `i < size` of the table checked in `new`, 16-aligned; each
            // half read once, volatile, as above.
            let (addr, rest) = unsafe {
                let d = self.desc.add(16 * i as usize) as *const u64;
                (
                    u64::from_le(std::ptr::read_volatile(d)),
                    u64::from_le(std::ptr::read_volatile(d.add(1))),
                )
            };
            // len: bits 0..32, flags 32..48, next 48..64.
            let flags = (rest >> 32) as u16;
            if flags & DESC_F_INDIRECT != 0 {
                return Popped::Bad(head, VirtqError::Indirect);
            }
            descs.push(Desc {
                addr: GuestAddress(addr),
                len: rest as u32,
                write: flags & DESC_F_WRITE != 0,
            });
            count += 1;
            if flags & DESC_F_NEXT == 0 {
                return Popped::Chain(head);
            }
            i = (rest >> 48) as u16;
        }
    }

    /// Returns chain `head` with `len` bytes written into it (published by
    /// [`Virtq::publish_used`]).
    #[inline]
    pub fn push_used(&mut self, head: u16, len: u32) {
        let at = 4 + 8 * self.position(self.next_used);
        // SAFETY: element `position(next_used)` (< size) of the used ring checked in `new`,
        // 4-aligned: two 4-byte stores.
        unsafe {
            let e = self.used.add(at) as *mut u32;
            std::ptr::write_volatile(e, (head as u32).to_le());
            std::ptr::write_volatile(e.add(1), len.to_le());
        }
        self.next_used = self.next_used.wrapping_add(1);
    }

    /// Makes the used elements pushed so far visible to the guest.
    pub fn publish_used(&mut self) {
        // The elements before the index.
        fence(Ordering::Release);
        // SAFETY: the used ring's index field, checked in `new` (2-aligned).
        unsafe { std::ptr::write_volatile(self.used.add(2) as *mut u16, self.next_used.to_le()) };
    }

    /// Whether the guest wants an interrupt for what was published since it was last told
    /// (the used event with EVENT_IDX, else the avail ring's NO_INTERRUPT flag).
    pub fn needs_interrupt(&mut self) -> bool {
        let (old, new) = (self.told_used, self.next_used);
        if old == new {
            return false;
        }
        self.told_used = new;
        // The used index is stored before the guest's wish is read (it stores its wish, then
        // reads the index).
        fence(Ordering::SeqCst);
        if self.event_idx {
            let used_event = self.avail_u16(4 + 2 * self.size as usize);
            new.wrapping_sub(used_event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            self.avail_u16(0) & AVAIL_F_NO_INTERRUPT == 0
        }
    }
}

/// Where `len` bytes of guest memory at `addr` are in valed, when they lie in one region of
/// the guest's memory table (the mapping lives as long as `mem`): one binary search and a
/// bounds check, where vm-memory's `read_slice`/`write_slice` build an iterator of slices
/// over regions on every call (43% of the port's worker at 60-byte frames).
#[inline]
pub fn guest_range(mem: &GuestMemoryMmap, addr: GuestAddress, len: usize) -> Option<*mut u8> {
    let region = mem.find_region(addr)?;
    let off = addr.raw_value() - region.start_addr().raw_value();
    let end = off.checked_add(len as u64)?;
    if end > region.len() {
        return None;
    }
    region.get_host_address(MemoryRegionAddress(off)).ok()
}

/// Where the first of `len` bytes of guest memory at `addr` are in valed, and how many of
/// them lie there contiguously (up to the end of the region that holds `addr`); None when
/// `addr` is not in guest memory.
#[inline]
pub fn guest_piece(
    mem: &GuestMemoryMmap,
    addr: GuestAddress,
    len: usize,
) -> Option<(*const u8, usize)> {
    let region = mem.find_region(addr)?;
    let off = addr.raw_value() - region.start_addr().raw_value();
    let n = (region.len() - off).min(len as u64) as usize;
    let p = region.get_host_address(MemoryRegionAddress(off)).ok()?;
    Some((p as *const u8, n))
}

/// Copies guest memory at `addr` into `dst`; false when it is not all in guest memory. A range
/// across regions goes through vm-memory.
pub fn read_guest(mem: &GuestMemoryMmap, dst: &mut [u8], addr: GuestAddress) -> bool {
    match guest_range(mem, addr, dst.len()) {
        // SAFETY: `dst.len()` bytes inside one mapped region of the guest's memory, which
        // `mem` keeps mapped; the guest may write them meanwhile (it only hurts itself).
        Some(p) => unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) },
        None => return mem.read_slice(dst, addr).is_ok(),
    }
    true
}

/// Copies `src` into guest memory at `addr`; false when it is not all in guest memory.
pub fn write_guest(mem: &GuestMemoryMmap, src: &[u8], addr: GuestAddress) -> bool {
    match guest_range(mem, addr, src.len()) {
        // SAFETY: as in `read_guest`; valed's own buffer is not in guest memory.
        Some(p) => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) },
        None => return mem.write_slice(src, addr).is_ok(),
    }
    true
}

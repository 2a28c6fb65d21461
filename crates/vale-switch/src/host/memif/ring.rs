//! The client's shared memory: its regions (mapped by valed) and the rings in them, each way.
//!
//! Everything here lives in memory the client owns and may change at any moment, so each
//! value is read once and checked before use: a ring's index against the ring's size (a head
//! more than a ring ahead of valed's cursor ends the connection), a descriptor's region number
//! against the regions the client added, its offset and length against that region's size.
//! A bad descriptor on a C2S ring costs its frame (a counted drop, the port's bad_input); on
//! an S2C ring, where valed cannot skip the client's buffer, the connection.
//!
//! Who writes what (DPDK's `rte_eth_memif.c`, client role, copy mode): the client made every
//! ring and buffer. On a **C2S** ring the client fills descriptors and moves `head`; valed
//! reads from its cursor up to `head`, then gives the slots back by moving `tail` (and
//! owns `flags`, the ring's receiver's). On an **S2C** ring the client gives buffers by
//! setting each descriptor's length to the buffer's size and moving `head`; valed writes
//! frames into those buffers, sets each descriptor's length (and `NEXT` for a frame that
//! goes on), and moves `tail`; the client owns `flags`. The ring's eventfd is the receiver's
//! interrupt: the sender writes it after publishing unless the receiver set `MASK_INT`.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering::*};

use super::super::guard::Guarded;
use super::error::Error;
use super::wire::{self, Desc, DESC_FLAG_NEXT, RING_FLAG_MASK_INT};
use crate::drive::Gather;
use vale_abi::region::{MAX_FRAGS, MAX_FRAME_LEN};

/// One mapping of a region file, unmapped when dropped.
pub struct Mapping {
    base: *mut u8,
    size: u64,
}

impl Mapping {
    /// Takes over the mapping of `size` bytes at `base`.
    ///
    /// # Safety
    /// `base` is a mapping of `size` bytes that valed made (`mmap`) and that nothing else
    /// unmaps: this unmaps it when dropped.
    pub unsafe fn new(base: *mut u8, size: u64) -> Mapping {
        Mapping { base, size }
    }

    /// The range it covers in valed's address space (address, length), for the guard.
    pub fn range(&self) -> (usize, usize) {
        (self.base as usize, self.size as usize)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `size` bytes at `base`, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size as usize) };
    }
}

/// The regions of a connection; their guard goes before their mappings (field order: see
/// [`super::super::guard`], a range must be unregistered before it is unmapped).
#[derive(Default)]
pub struct Regions {
    pub guard: Guarded,
    pub maps: Vec<Mapping>,
}

// SAFETY: the mappings are plain shared memory, reached only through the checked accessors.
unsafe impl Send for Regions {}

impl Regions {
    /// Where `len` bytes at `offset` of region `region` are, if they lie inside it.
    #[inline]
    pub fn piece(&self, region: u16, offset: u32, len: u32) -> Option<*mut u8> {
        let m = self.maps.get(region as usize)?;
        if offset as u64 + len as u64 > m.size {
            return None;
        }
        // SAFETY: inside the mapping (checked just above).
        Some(unsafe { m.base.add(offset as usize) })
    }
}

/// One ring of the client's, where valed found it at CONNECT.
pub struct Ring {
    base: *mut u8,
    mask: u16,
    /// Descriptors (`1 << log2`).
    pub size: u32,
    /// The ring's interrupt eventfd, the client's.
    pub irq: OwnedFd,
    /// valed's cursor: the next slot to read (C2S) or to fill (S2C).
    cursor: u16,
    /// C2S: where the last pass stopped (the cursor once its batch is forwarded).
    next: u16,
    /// S2C: the client's buffers of the frame being written (kept: no allocation once grown).
    bufs: Vec<(*mut u8, u32)>,
}

// SAFETY: the ring is shared memory reached through volatile and atomic accesses only.
unsafe impl Send for Ring {}

/// Why a frame from a C2S ring was dropped.
#[derive(Debug)]
pub enum Bad {
    /// A descriptor outside the client's regions.
    Desc(Desc),
    /// A chain running past the client's head.
    Cut,
    /// A frame the switch does not take (no Ethernet header, too long, too many pieces).
    Frame(u64),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Bad::Desc(d) => write!(
                f,
                "descriptor of region {} offset {} length {} is outside the client's regions",
                { d.region },
                { d.offset },
                { d.length }
            ),
            Bad::Cut => write!(f, "a frame's chain goes on past the ring's head"),
            Bad::Frame(len) => write!(
                f,
                "a frame of {len} bytes (at least 14, at most {MAX_FRAME_LEN}, in at most {MAX_FRAGS} descriptors)"
            ),
        }
    }
}

/// What a C2S pass did.
#[derive(Default)]
pub struct Gathered {
    pub frames: usize,
    pub bad: u64,
    pub why: Option<Bad>,
}

impl Ring {
    /// The ring at `base`, with `1 << log2` descriptors.
    ///
    /// # Safety
    /// `base` is 16-byte aligned and the ring's bytes (`wire::ring::bytes(log2)`) from it lie
    /// inside a mapping that outlives the ring (the session checks both against the client's
    /// regions, which the connection holds as long as its rings).
    pub unsafe fn new(base: *mut u8, log2: u8, irq: OwnedFd) -> Ring {
        Ring {
            base,
            mask: ((1u32 << log2) - 1) as u16,
            size: 1 << log2,
            irq,
            cursor: 0,
            next: 0,
            bufs: Vec::new(),
        }
    }

    fn word(&self, at: usize) -> &AtomicU16 {
        // SAFETY: inside the ring's first two cache lines, 2-byte aligned (the ring is 16-byte
        // aligned); atomics are how both sides touch these words.
        unsafe { &*(self.base.add(at) as *const AtomicU16) }
    }

    pub fn cookie(&self) -> u32 {
        // SAFETY: the ring's first word; read once.
        unsafe { std::ptr::read_volatile(self.base.add(wire::ring::COOKIE) as *const u32) }
    }

    /// Starts the ring afresh at CONNECT (as both DPDK roles do): indices 0.
    pub fn reset(&mut self) {
        self.word(wire::ring::HEAD).store(0, Relaxed);
        self.word(wire::ring::TAIL).store(0, Relaxed);
        self.cursor = 0;
        self.next = 0;
    }

    /// As a receiver, asks the client for interrupts (false: valed polls).
    pub fn want_irq(&self, on: bool) {
        let w = self.word(wire::ring::FLAGS);
        w.store(if on { 0 } else { RING_FLAG_MASK_INT }, Relaxed);
    }

    /// The client, this ring's receiver, wants an interrupt.
    pub fn client_wants_irq(&self) -> bool {
        self.word(wire::ring::FLAGS).load(Relaxed) & RING_FLAG_MASK_INT == 0
    }

    /// The client's interrupt eventfd of this ring (written by [`super::sink::kick`] through
    /// `host::peer_irq`, never while the ring's lock is held).
    pub fn irq_fd(&self) -> RawFd {
        self.irq.as_raw_fd()
    }

    #[inline]
    fn desc(&self, slot: u16) -> Desc {
        // SAFETY: slot masked into the ring, whose descriptors lie inside the region (checked
        // at CONNECT); one volatile read of the 16 bytes.
        unsafe {
            std::ptr::read_volatile(
                (self.base.add(wire::ring::DESC) as *const Desc).add((slot & self.mask) as usize),
            )
        }
    }

    #[inline]
    fn set_desc(&self, slot: u16, length: u32, flags: u16) {
        // SAFETY: as in `desc`; only the length and flags words are written.
        unsafe {
            let d = (self.base.add(wire::ring::DESC) as *mut Desc).add((slot & self.mask) as usize);
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*d).length), length);
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*d).flags), flags);
        }
    }

    /// Slots between valed's cursor and the client's head, or why the head is impossible.
    fn ahead(&self) -> Result<u32, Error> {
        let head = self.word(wire::ring::HEAD).load(Acquire);
        let n = head.wrapping_sub(self.cursor) as u32;
        if n > self.size {
            return Err(Error::Head {
                head,
                ahead: n,
                cursor: self.cursor,
                size: self.size,
            });
        }
        Ok(n)
    }

    /// C2S: adds up to `limit` frames the client published to `batch`, where they lie. The
    /// slots are the client's again only at [`Ring::release`], once the batch is forwarded.
    pub fn gather(
        &mut self,
        regions: &Regions,
        batch: &mut Gather,
        limit: usize,
        pieces: &mut Vec<(*const u8, u32)>,
    ) -> Result<Gathered, Error> {
        let n = self.ahead()?;
        let end = self.cursor.wrapping_add(n as u16);
        let mut g = Gathered::default();
        let mut cur = self.cursor;
        while cur != end && batch.len() < limit {
            let d = self.desc(cur);
            cur = cur.wrapping_add(1);
            if d.flags & DESC_FLAG_NEXT == 0 {
                // The common frame of one descriptor.
                let ok = match regions.piece(d.region, d.offset, d.length) {
                    // SAFETY: inside a mapped region, which stays mapped until the batch is
                    // forwarded (the caller holds `regions`).
                    Some(p) => unsafe { batch.push_frame(p, d.length, None) },
                    None => {
                        g.bad += 1;
                        g.why.get_or_insert(Bad::Desc(d));
                        continue;
                    }
                };
                if ok {
                    g.frames += 1;
                } else {
                    g.bad += 1;
                    g.why.get_or_insert(Bad::Frame(d.length as u64));
                }
                continue;
            }
            // A chain: checked whole before any piece goes to the batch.
            pieces.clear();
            let mut d = d;
            let mut bad: Option<Bad> = None;
            let mut len = 0u64;
            loop {
                match regions.piece(d.region, d.offset, d.length) {
                    Some(p) if pieces.len() < MAX_FRAGS as usize => {
                        pieces.push((p, d.length));
                        len += d.length as u64;
                    }
                    Some(_) => {
                        bad.get_or_insert(Bad::Frame(len));
                    }
                    None => {
                        bad.get_or_insert(Bad::Desc(d));
                    }
                }
                if d.flags & DESC_FLAG_NEXT == 0 {
                    break;
                }
                if cur == end {
                    bad.get_or_insert(Bad::Cut);
                    break;
                }
                d = self.desc(cur);
                cur = cur.wrapping_add(1);
            }
            if bad.is_none() {
                for &(p, l) in pieces.iter() {
                    // SAFETY: as above.
                    unsafe { batch.add_piece(p, l) };
                }
                if batch.end_frame(None) {
                    g.frames += 1;
                    continue;
                }
                bad = Some(Bad::Frame(len));
            }
            g.bad += 1;
            if g.why.is_none() {
                g.why = bad;
            }
        }
        self.next = cur;
        Ok(g)
    }

    /// C2S: gives the slots of the last [`Ring::gather`] back to the client.
    pub fn release(&mut self) {
        if self.next != self.cursor {
            self.cursor = self.next;
            self.word(wire::ring::TAIL).store(self.cursor, Release);
        }
    }

    /// C2S: the client published frames valed has not taken.
    pub fn pending(&self) -> bool {
        self.word(wire::ring::HEAD).load(Acquire) != self.cursor
    }

    /// S2C: writes the frame of `len` bytes in `pieces` into the client's buffers from
    /// valed's cursor on; false when the client gave too few buffers for it now. Published at
    /// [`Ring::publish`].
    pub fn put<'p>(
        &mut self,
        regions: &Regions,
        len: u64,
        pieces: impl Iterator<Item = &'p [u8]>,
    ) -> Result<bool, Put> {
        let free = self.ahead().map_err(Put::Broken)?;
        // The client's buffers for it, checked before any byte is written.
        let mut bufs = std::mem::take(&mut self.bufs);
        bufs.clear();
        let r = self.fill(regions, len, pieces, free, &mut bufs);
        self.bufs = bufs;
        r
    }

    fn fill<'p>(
        &mut self,
        regions: &Regions,
        need: u64,
        pieces: impl Iterator<Item = &'p [u8]>,
        free: u32,
        bufs: &mut Vec<(*mut u8, u32)>,
    ) -> Result<bool, Put> {
        let mut room = 0u64;
        while room < need {
            if bufs.len() as u32 == free {
                return if free == self.size {
                    Err(Put::TooLong)
                } else {
                    Ok(false)
                };
            }
            let d = self.desc(self.cursor.wrapping_add(bufs.len() as u16));
            let Some(p) = regions
                .piece(d.region, d.offset, d.length)
                .filter(|_| d.length != 0)
            else {
                return Err(Put::Broken(Error::Desc(Bad::Desc(d))));
            };
            let take = (d.length as u64).min(need - room) as u32;
            bufs.push((p, take));
            room += take as u64;
        }
        if bufs.is_empty() {
            return Err(Put::TooLong);
        }
        // Copy the pieces into the buffers (no more than `need` bytes in all).
        let (mut b, mut at) = (0usize, 0u32);
        for piece in pieces {
            let mut src = piece;
            while !src.is_empty() && b < bufs.len() {
                let (dst, cap) = bufs[b];
                let n = ((cap - at) as usize).min(src.len());
                // SAFETY: inside the client's buffer (checked above: `cap` bytes at `dst`);
                // the source is the switch's.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(at as usize), n) };
                src = &src[n..];
                at += n as u32;
                if at == cap {
                    b += 1;
                    at = 0;
                }
            }
        }
        let last = bufs.len() - 1;
        for (k, &(_, len)) in bufs.iter().enumerate() {
            let flags = if k < last { DESC_FLAG_NEXT } else { 0 };
            self.set_desc(self.cursor.wrapping_add(k as u16), len, flags);
        }
        self.cursor = self.cursor.wrapping_add(bufs.len() as u16);
        Ok(true)
    }

    /// S2C: hands the frames put since the last call to the client, and interrupts it unless
    /// it polls.
    ///
    /// Returns whether the client wants an interrupt for them, which the caller sends (the
    /// port's own thread only, see `sink.rs`).
    #[must_use]
    pub fn publish(&mut self) -> bool {
        self.word(wire::ring::TAIL).store(self.cursor, Release);
        self.client_wants_irq()
    }
}

/// Why a frame could not go into an S2C ring.
pub enum Put {
    /// Longer than all the client's buffers together: dropped.
    TooLong,
    /// The client broke the ring: the connection ends.
    Broken(Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::Pipeline;
    use std::os::fd::FromRawFd;

    const LOG2: u8 = 4;
    const SIZE: u64 = 64 * 1024;

    /// An anonymous mapping as region 0, a ring of 16 at its start, buffers of 2 KiB after.
    fn setup() -> (Regions, Ring) {
        // SAFETY: a fresh anonymous mapping, owned by the Mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let regions = Regions {
            guard: Guarded::default(),
            // SAFETY: the fresh mapping above, owned by the Mapping from here.
            maps: vec![unsafe { Mapping::new(p.cast(), SIZE) }],
        };
        // SAFETY: a fresh eventfd of ours.
        let irq = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK)) };
        // SAFETY: the start of the test's mapping (page-aligned), which `regions` keeps.
        let ring = unsafe { Ring::new(p.cast(), LOG2, irq) };
        (regions, ring)
    }

    fn set(ring: &Ring, slot: u16, flags: u16, region: u16, offset: u32, length: u32) {
        // SAFETY: inside the test's ring.
        unsafe {
            std::ptr::write_volatile(
                (ring.base.add(wire::ring::DESC) as *mut Desc).add((slot & ring.mask) as usize),
                Desc {
                    flags,
                    region,
                    length,
                    offset,
                    metadata: 0,
                },
            )
        };
    }

    #[test]
    fn c2s_descriptors_outside_the_regions_cost_their_frame_only() {
        let (regions, mut ring) = setup();
        let buf = 4096u32;
        set(&ring, 0, 0, 0, buf, 60); // good
        set(&ring, 1, 0, 1, buf, 60); // region 1 does not exist
        set(&ring, 2, 0, 0, SIZE as u32 - 10, 60); // past the region's end
        set(&ring, 3, 0, 0, u32::MAX, 60); // offset overflow
        set(&ring, 4, DESC_FLAG_NEXT, 0, buf, 30); // a good chain of two
        set(&ring, 5, 0, 0, buf + 2048, 30);
        set(&ring, 6, 0, 0, buf, 10); // a runt
        set(&ring, 7, DESC_FLAG_NEXT, 0, buf, 60); // a chain cut at the head
        ring.word(wire::ring::HEAD).store(8, Release);
        let mut pipe = Pipeline::new(std::time::Instant::now());
        pipe.start_batch();
        let mut batch = Gather::new(&mut pipe);
        let mut pieces = Vec::new();
        let g = ring
            .gather(&regions, &mut batch, 256, &mut pieces)
            .ok()
            .unwrap();
        assert_eq!((g.frames, g.bad), (2, 5));
        assert_eq!(batch.len(), 2);
        ring.release();
        assert_eq!(ring.word(wire::ring::TAIL).load(Relaxed), 8);
    }

    #[test]
    fn a_head_more_than_a_ring_ahead_breaks_the_ring() {
        let (regions, mut ring) = setup();
        ring.word(wire::ring::HEAD).store(17, Release);
        let mut pipe = Pipeline::new(std::time::Instant::now());
        let mut batch = Gather::new(&mut pipe);
        let mut pieces = Vec::new();
        let e = ring
            .gather(&regions, &mut batch, 256, &mut pieces)
            .err()
            .unwrap();
        let e = e.to_string();
        assert!(e.contains("ring head 17 is 17 slots past"), "{e}");
        assert!(matches!(
            ring.put(&regions, 60, [&[0u8; 60][..]].into_iter()),
            Err(Put::Broken(_))
        ));
    }

    #[test]
    fn s2c_frames_fill_the_clients_buffers_and_bad_ones_break_the_ring() {
        let (regions, mut ring) = setup();
        let frame = [7u8; 100];
        // No buffers given yet: no room.
        assert!(matches!(
            ring.put(&regions, 100, [&frame[..]].into_iter()),
            Ok(false)
        ));
        // Buffers of 64 bytes: the frame takes two, chained.
        for s in 0..16 {
            set(&ring, s, 0, 0, 4096 + 64 * s as u32, 64);
        }
        ring.word(wire::ring::HEAD).store(16, Release);
        assert!(matches!(
            ring.put(&regions, 100, [&frame[..40], &frame[40..]].into_iter()),
            Ok(true)
        ));
        assert!(ring.publish(), "the client asked for interrupts (flags 0)");
        assert_eq!(ring.word(wire::ring::TAIL).load(Relaxed), 2);
        let d0 = ring.desc(0);
        let d1 = ring.desc(1);
        assert_eq!(({ d0.flags }, { d0.length }), (DESC_FLAG_NEXT, 64));
        assert_eq!(({ d1.flags }, { d1.length }), (0, 36));
        // SAFETY: inside the test's region.
        let copied = unsafe { std::slice::from_raw_parts(regions.maps[0].base.add(4096), 100) };
        assert_eq!(copied, &frame[..]);
        // Longer than every buffer together: too long, dropped.
        let big = [0u8; 16 * 64 + 1];
        ring.word(wire::ring::HEAD).store(18, Release);
        assert!(matches!(
            ring.put(&regions, big.len() as u64, [&big[..]].into_iter()),
            Err(Put::TooLong)
        ));
        // A buffer outside the region.
        set(&ring, 2, 0, 0, SIZE as u32 - 8, 64);
        assert!(matches!(
            ring.put(&regions, 100, [&frame[..]].into_iter()),
            Err(Put::Broken(e)) if e.to_string().contains("outside the client's regions")
        ));
    }
}

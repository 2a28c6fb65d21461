//! The guest's transmit queues: chains read from guest memory, checked, and handed to the
//! pipeline (one copy, into the destinations).

use super::*;

/// Why a chain was refused.
pub(super) enum Bad {
    None,
    Queue(VirtqError),
    /// The queue's rings are not inside guest memory.
    Rings,
    Memory,
    Direction,
    Runt(usize),
    TooLong,
    /// A frame without segmentation longer than the MTU allows: (its length, the MTU).
    OverMtu(usize, usize),
    /// More pieces than a frame may have.
    Scattered,
    TooSmall(usize),
    Offload(Offload),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::None => write!(f, "no error"),
            Bad::Queue(e) => write!(f, "{e}"),
            Bad::Rings => write!(f, "queue rings outside guest memory"),
            Bad::Memory => write!(f, "descriptor outside guest memory"),
            Bad::Direction => write!(f, "descriptor of the wrong direction in a chain"),
            Bad::Runt(n) => write!(f, "frame of {n} bytes"),
            Bad::TooLong => write!(f, "frame longer than {MAX_GUEST_FRAME} bytes"),
            Bad::OverMtu(n, mtu) => write!(f, "frame of {n} bytes over the MTU of {mtu}"),
            Bad::Scattered => write!(f, "frame in more than {MAX_FRAGS} pieces"),
            Bad::TooSmall(n) => write!(f, "receive buffers too small for a frame of {n} bytes"),
            Bad::Offload(o) => write!(
                f,
                "offload request not negotiated or outside the frame (flags {:#x}, gso type {:#x}, \
                 gso size {}, csum start {}, csum offset {})",
                o.flags, o.gso_type, o.gso_size, o.csum_start, o.csum_offset
            ),
        }
    }
}

/// The lists of the guest transmit path, kept between batches.
#[derive(Default)]
pub(super) struct TxScratch {
    /// The descriptors of the chain being read.
    pub(super) descs: Vec<Desc>,
    /// Where the frame being read lies in valed's mapping of guest memory.
    pub(super) pieces: Vec<(*const u8, u32)>,
    /// Copies of Ethernet headers the guest split over descriptors, one per frame of the
    /// batch (the lookup reads a frame's first piece, which must hold the whole header).
    pub(super) heads: Vec<[u8; HEAD_COPY]>,
}

/// Bytes copied from the start of a frame whose Ethernet header is split.
pub(super) const HEAD_COPY: usize = 64;

impl TxScratch {
    /// Adds the frame of the one-descriptor tx chain `d` to `batch`: in the common case
    /// (header and frame in one region of guest memory) with one translation, handed over
    /// whole; else as [`TxScratch::add_frame`] does.
    #[inline]
    pub(super) fn add_one<'m>(
        &mut self,
        d: Desc,
        vq: &mut Virtq<'m>,
        mem: &'m GuestMemoryMmap,
        acked: &Acked,
        batch: &mut Gather,
    ) -> Result<(), Bad> {
        let one = match d {
            d if !d.write && (HDR_LEN..=HDR_LEN + MAX_GUEST_FRAME).contains(&(d.len as usize)) => {
                vq.range(mem, d.addr, d.len as usize)
            }
            _ => None,
        };
        let Some(p) = one else {
            self.descs.clear();
            self.descs.push(d);
            return self.add_frame(mem, acked, batch);
        };
        let len = d.len as usize - HDR_LEN;
        if len < 14 {
            return Err(Bad::Runt(len));
        }
        // SAFETY: the descriptor's bytes lie in one mapped region (`Virtq::range`), which `mem`
        // keeps mapped until the batch is forwarded; its first two are the header's flags
        // and gso type, each read once.
        let (flags, gso_type) = unsafe {
            (
                std::ptr::read_volatile(p),
                std::ptr::read_volatile(p.add(1)),
            )
        };
        if flags & offload::F_NEEDS_CSUM != 0 || gso_type != offload::GSO_NONE {
            return Self::add_one_offload(p, len, acked, batch);
        }
        // The common case: no checksum asked for, no segmentation (what `Acked::offload`
        // would find the same).
        if len > acked.max_frame {
            return Err(Bad::OverMtu(len, acked.max_frame - MTU_OVERHEAD));
        }
        // SAFETY: as above; the `len` bytes after the header are in the same region.
        if !unsafe { batch.push_frame(p.add(HDR_LEN), len as u32, None) } {
            return Err(Bad::Scattered);
        }
        Ok(())
    }

    /// [`TxScratch::add_one`] of a frame whose header asks for offload work: the header read
    /// whole and checked. `p`: the header, in one mapped region with the `len` bytes of the
    /// frame after it.
    #[inline(never)]
    fn add_one_offload(
        p: *mut u8,
        len: usize,
        acked: &Acked,
        batch: &mut Gather,
    ) -> Result<(), Bad> {
        let mut hdr = [0u8; HDR_LEN];
        // SAFETY: see `add_one`: the header lies in one mapped region of guest memory.
        unsafe { std::ptr::copy_nonoverlapping(p, hdr.as_mut_ptr(), HDR_LEN) };
        let off = acked.offload(&hdr, len)?;
        if len > acked.max_frame && off.is_none_or(|o| o.gso_type == offload::GSO_NONE) {
            return Err(Bad::OverMtu(len, acked.max_frame - MTU_OVERHEAD));
        }
        // SAFETY: as above; the `len` bytes after the header are in the same region.
        if !unsafe { batch.push_frame(p.add(HDR_LEN), len as u32, off) } {
            return Err(Bad::Scattered);
        }
        Ok(())
    }

    /// Adds the frame of the tx chain in `descs` to `batch` where it lies in guest memory;
    /// its virtio-net header (which may be split over any descriptors) is read aside and
    /// checked. Every address is checked against the memory table.
    pub(super) fn add_frame(
        &mut self,
        mem: &GuestMemoryMmap,
        acked: &Acked,
        batch: &mut Gather,
    ) -> Result<(), Bad> {
        let mut hdr = [0u8; HDR_LEN];
        self.pieces.clear();
        let len = self.gather(mem, &mut hdr)?;
        if len < 14 {
            return Err(Bad::Runt(len));
        }
        let off = acked.offload(&hdr, len)?;
        if len > acked.max_frame && off.is_none_or(|o| o.gso_type == offload::GSO_NONE) {
            return Err(Bad::OverMtu(len, acked.max_frame - MTU_OVERHEAD));
        }
        let mut skip = 0usize;
        if (self.pieces[0].1 as usize) < 14 {
            // The Ethernet header is split: its first bytes are copied aside, one piece.
            let k = self.heads.len();
            self.heads.push([0; HEAD_COPY]);
            let head = &mut self.heads[k];
            let want = len.min(HEAD_COPY);
            for &(p, n) in &self.pieces {
                let c = (n as usize).min(want - skip);
                // SAFETY: `n` bytes at `p` are in one mapped region of guest memory (checked
                // by `guest_piece`); `head` is ours.
                unsafe { std::ptr::copy_nonoverlapping(p, head[skip..].as_mut_ptr(), c) };
                skip += c;
                if skip == want {
                    break;
                }
            }
            // SAFETY: `heads` is only cleared at the start of the next batch, and within one
            // it stays within the capacity reserved for it (one entry per chain, at most
            // BURST), so it is never moved while the pipeline holds this pointer.
            unsafe { batch.add_piece(head.as_ptr(), want as u32) };
        }
        for &(p, n) in &self.pieces {
            let n = n as usize;
            let cut = skip.min(n);
            skip -= cut;
            if cut < n {
                // SAFETY: inside one mapped region (see `guest_piece`); the caller keeps the
                // memory table (`mem`) alive until the batch is forwarded.
                unsafe { batch.add_piece(p.add(cut), (n - cut) as u32) };
            }
        }
        if !batch.end_frame(off) {
            return Err(Bad::Scattered);
        }
        Ok(())
    }

    /// The frame of the chain in `descs`, of any shape: its virtio-net header (which may be
    /// split over any descriptors) read into `hdr`, its pieces where they lie in guest memory
    /// (a descriptor may span regions of the memory table: one piece per region). Its length
    /// without the header.
    pub(super) fn gather(
        &mut self,
        mem: &GuestMemoryMmap,
        hdr: &mut [u8; HDR_LEN],
    ) -> Result<usize, Bad> {
        let mut got = 0usize;
        let mut len = 0usize;
        for d in &self.descs {
            if d.write {
                return Err(Bad::Direction);
            }
            let mut dlen = d.len as usize;
            let mut addr = d.addr;
            let s = (HDR_LEN - got).min(dlen);
            if s != 0 && !read_guest(mem, &mut hdr[got..got + s], addr) {
                return Err(Bad::Memory);
            }
            got += s;
            dlen -= s;
            addr = addr.checked_add(s as u64).ok_or(Bad::Memory)?;
            if dlen > MAX_GUEST_FRAME - len {
                return Err(Bad::TooLong);
            }
            len += dlen;
            while dlen != 0 {
                let (p, n) = guest_piece(mem, addr, dlen).ok_or(Bad::Memory)?;
                if self.pieces.len() == MAX_FRAGS as usize {
                    return Err(Bad::Scattered);
                }
                self.pieces.push((p, n as u32));
                addr = addr.checked_add(n as u64).ok_or(Bad::Memory)?;
                dlen -= n;
            }
        }
        if got < HDR_LEN {
            return Err(Bad::Runt(len));
        }
        Ok(len)
    }
}

impl Net {
    /// Guest transmit on pair `p`: a batch of the transmit queue's chains, forwarded from
    /// where they lie in guest memory (the switch's one copy reads them there), then returned
    /// used. The chains taken, and whether the avail ring could not be read.
    pub(super) fn guest_tx(
        &self,
        p: usize,
        steps: &mut Steps,
        vring: &Vring,
        mem: &GuestMemoryMmap,
        acked: &Acked,
    ) -> (usize, bool) {
        let mut st = vring.get_mut();
        if !st.is_enabled() || !st.get_queue().ready() {
            return (0, false);
        }
        let Some(mut vq) = Virtq::new(st.get_queue(), mem) else {
            self.bad(steps, 1, &Bad::Rings);
            return (0, true);
        };
        self.note_took_up(txq(p), &vq);
        let scratch = &self.0.pairs[p].scratch;
        let mut tx = std::mem::take(&mut lock(scratch).tx);
        let (mut used, mut bad, mut why, mut stuck) = (0usize, 0u64, Bad::None, false);
        steps.ingress_direct(p as u32, |batch, limit| {
            let limit = limit.min(BURST);
            tx.heads.clear();
            // Never reallocated within the batch: the pipeline holds pointers into it.
            tx.heads.reserve(BURST);
            while batch.len() < limit && used < BURST {
                let head = match vq.pop_one() {
                    One::Empty => break,
                    One::Desc(head, d) => {
                        if let Err(b) = tx.add_one(d, &mut vq, mem, acked, batch) {
                            bad += 1;
                            why = b;
                        }
                        head
                    }
                    One::Other => {
                        tx.descs.clear();
                        match vq.pop(&mut tx.descs) {
                            Popped::Empty => break,
                            Popped::Stuck(e) => {
                                bad += 1;
                                why = Bad::Queue(e);
                                stuck = true;
                                break;
                            }
                            Popped::Bad(head, e) => {
                                bad += 1;
                                why = Bad::Queue(e);
                                head
                            }
                            Popped::Chain(head) => {
                                if let Err(b) = tx.add_frame(mem, acked, batch) {
                                    bad += 1;
                                    why = b;
                                }
                                head
                            }
                        }
                    }
                };
                // Published only after the batch is forwarded: until then the guest must not
                // reuse the buffers.
                vq.push_used(head, 0);
                used += 1;
            }
        });
        lock(scratch).tx = tx;
        self.bad(steps, bad, &why);
        if used != 0 {
            vq.publish_used();
            if vq.needs_interrupt() {
                self.interrupt(&st, txq(p));
            }
        }
        vq.finish(st.get_queue_mut());
        (used, stuck)
    }
}

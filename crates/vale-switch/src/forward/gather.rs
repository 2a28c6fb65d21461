//! Stage 1, gather (VALE section 3.3): read each slot of a batch once, check it, collect
//! the frame's fragments and prefetch the payload; and the entry points that start a batch
//! (a ring of a native port, or frames a host kind puts in one by one).

use super::*;
use crate::port::{Attachment, TxRing};

impl Pipeline {
    /// Forwards one batch from tx ring `ring` of `src`. Returns the number of slots consumed;
    /// 0 when the client's `head` showed nothing new to take.
    pub fn forward(&mut self, sw: &Switch, src: &Arc<Port>, ring: u32) -> u32 {
        let Some(att) = &src.attachment else { return 0 };
        let Some(txr) = att.tx.get(ring as usize) else {
            return 0;
        };
        let Some((head, hwcur)) = new_head(src, att, txr, ring) else {
            return 0;
        };
        // Stage 1: gather.
        let batch = sw.batch.load(Relaxed) as usize;
        let (cur, sent_bytes) = self.gather_ring(src, att, txr, ring, head, hwcur, batch);
        if cur == hwcur {
            return 0;
        }
        self.shared_source = false;
        self.lookup_and_deliver(sw, src, ring, sent_bytes);
        self.give_back(src, att, txr, ring, cur);
        let mask = att.region.layout().params.slots - 1;
        (cur.wrapping_sub(hwcur)) & mask
    }

    /// Stage 1 on tx ring `ring` of `src`: the frames from `hwcur` to the client's `head`,
    /// at most `batch`, into the batch (bad ones counted against the sender). Where it
    /// stopped, and the bytes of the frames taken.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn gather_ring(
        &mut self,
        src: &Port,
        att: &Attachment,
        txr: &TxRing,
        ring: u32,
        head: u32,
        hwcur: u32,
        batch: usize,
    ) -> (u32, u64) {
        let reg = &att.region;
        let l = reg.layout();
        let mask = l.params.slots - 1;
        let buf_size = l.params.buf_size;
        let num_bufs = l.num_bufs;
        self.frames.clear();
        self.held.clear();
        self.frags.clear();
        let mut sent_bytes = 0u64;
        let mut bad = 0u64;
        let mut cur = hwcur;
        let mut dropping = txr.dropping_chain.load(Relaxed);
        while cur != head && self.frames.len() < batch {
            if dropping {
                // SAFETY: as below.
                let flags = unsafe { ptr::read_volatile(&(*reg.slot(ring, cur)).flags) };
                cur = (cur + 1) & mask;
                dropping = flags & NS_MOREFRAG != 0;
                continue;
            }
            // The common case first: a frame in one slot, with no flag that needs a look.
            // SAFETY: `cur` < n; read once, volatile (the client may be writing it). The
            // general path below reads the slot again and checks everything it reads.
            let slot: NetmapSlot = unsafe { ptr::read_volatile(reg.slot(ring, cur)) };
            let len = slot.len as u32;
            if slot.flags & (NS_MOREFRAG | NS_INDIRECT | NS_OFFLOAD) == 0
                && (FIRST_SLOT_BUF..num_bufs).contains(&slot.buf_idx)
                && (ETH_HLEN..=buf_size).contains(&len)
            {
                cur = (cur + 1) & mask;
                let ptr = reg.buf(slot.buf_idx);
                prefetch(ptr);
                self.held.push(Held {
                    first: self.frags.len() as u32,
                    count: 1,
                    len,
                    offload: 0,
                });
                self.frags.push(Frag { ptr, len });
                self.frames.push(FrameMeta::new(ptr, len, len, slot.flags));
                sent_bytes += len as u64;
                continue;
            }
            match self.gather_chain(att, ring, &mut cur, head) {
                Chain::Taken(total) => sent_bytes += total as u64,
                Chain::Later => break,
                Chain::Bad { complete } => {
                    bad += 1;
                    dropping = !complete;
                }
            }
        }
        txr.dropping_chain.store(dropping, Relaxed);
        if bad != 0 {
            add(&src.stats().bad_input, bad);
            src.note_bad_input(format_args!("{bad} bad slot chain(s) on tx ring {ring}"));
        }
        (cur, sent_bytes)
    }

    /// The frame whose chain of slots starts at `*cur`, of any shape (several slots, an
    /// offload request), every slot checked; `*cur` moves past what was read, or stays where
    /// it was when the chain's end is not published yet.
    #[inline(never)]
    fn gather_chain(&mut self, att: &Attachment, ring: u32, cur: &mut u32, head: u32) -> Chain {
        let reg = &att.region;
        let l = reg.layout();
        let n = l.params.slots;
        let mask = n - 1;
        let buf_size = l.params.buf_size;
        let num_bufs = l.num_bufs;
        let chain_start = *cur;
        let frag_start = self.frags.len();
        let mut total = 0u32;
        let mut count = 0u32;
        let mut ok = true;
        let mut first_flags = 0u16;
        let mut offload = 0u64;
        let complete = loop {
            // SAFETY: `cur` < n, so the slot is inside the region; read once, volatile,
            // because the client may be writing it.
            let slot: NetmapSlot = unsafe { ptr::read_volatile(reg.slot(ring, *cur)) };
            *cur = (*cur + 1) & mask;
            if count == 0 {
                first_flags = slot.flags;
                // Only valed's own ports (a device's header, checked as it was read)
                // bring offload work; a native client's NS_OFFLOAD is ignored.
                if slot.flags & NS_OFFLOAD != 0 && att.host.is_some() {
                    offload = slot.ptr;
                }
            }
            count += 1;
            let len = slot.len as u32;
            if slot.buf_idx < FIRST_SLOT_BUF
                || slot.buf_idx >= num_bufs
                || len > buf_size
                || slot.flags & NS_INDIRECT != 0
                || count > MAX_FRAGS
                || total + len > MAX_FRAME_LEN
            {
                ok = false;
            } else if ok {
                total += len;
                self.frags.push(Frag {
                    ptr: reg.buf(slot.buf_idx),
                    len,
                });
            }
            if slot.flags & NS_MOREFRAG == 0 {
                break true;
            }
            if *cur == head {
                break false;
            }
        };
        if !complete && ok && count < n - 1 {
            // The rest of the chain is not published yet: take it next time.
            *cur = chain_start;
            self.frags.truncate(frag_start);
            return Chain::Later;
        }
        if !ok || !complete || self.frags[frag_start].len < ETH_HLEN {
            // A bad slot, a chain that can never complete, or no Ethernet header in the
            // first slot: the frame is dropped and counted against its sender. If the
            // chain's end is still to come, its remaining slots are skipped when they are.
            self.frags.truncate(frag_start);
            return Chain::Bad { complete };
        }
        let first = self.frags[frag_start];
        prefetch(first.ptr);
        self.frames
            .push(FrameMeta::new(first.ptr, first.len, total, first_flags));
        self.held.push(Held {
            first: frag_start as u32,
            count,
            len: total,
            offload,
        });
        Chain::Taken(total)
    }

    /// Gives the slots consumed up to `cur` back to the client of tx ring `ring`, and
    /// interrupts it if it asked.
    #[inline(always)]
    fn give_back(&mut self, src: &Arc<Port>, att: &Attachment, txr: &TxRing, ring: u32, cur: u32) {
        let reg = &att.region;
        let mask = reg.layout().params.slots - 1;
        let ktoa = reg.ktoa(ring);
        // Every slot but one between hwcur and the new hwtail is the client's again.
        txr.hwcur.store(cur, Relaxed);
        ktoa.hwcur.store(cur, Relaxed);
        ktoa.hwtail.store((cur + mask) & mask, Release);
        // Store hwtail, full fence, then load appl_need_kick: the client stores the flag,
        // fences, then re-reads hwtail, so one of us sees the other (no lost wake-up).
        fence(SeqCst);
        if reg.atok(ring).appl_need_kick.load(Relaxed) != 0 {
            self.notifier.raise(src, IrqLine::Tx(ring));
        }
    }

    /// Stages 2 and 3 for the frames gathered; `sent_bytes`: their bytes.
    pub(super) fn lookup_and_deliver(
        &mut self,
        sw: &Switch,
        src: &Arc<Port>,
        ring: u32,
        sent_bytes: u64,
    ) {
        if self.frames.is_empty() {
            return;
        }
        // Stage 2: lookup, once for the batch.
        let now_s = (self.notifier.now_ns() / 1_000_000_000) as u32;
        let from = SourcePort {
            index: src.index,
            ring: ring as u16,
            learn_limit: src.shared.learn_limit.load(Relaxed),
        };
        // One module for the whole batch, held until it is delivered (a swap waits).
        let module = sw.lookup();
        let sent = (self.frames.len() as u64, sent_bytes);
        if src.shared.captures.on() {
            self.capture_tx(src);
        }
        let refused = module.lookup(from, &mut self.frames, now_s);
        add(&src.stats().learn_refused, refused);
        if module.vlans() {
            let lost = self.scope(&***module, &sw.ports(), src.index);
            add(&src.stats().tx_drops, lost);
        }
        // Stage 3: deliver.
        self.deliver_batch(sw, src, ring, sent);
        drop(module);
    }

    /// Starts a batch of frames that stay where their source keeps them (a guest's transmit
    /// buffers) instead of a tx ring: [`Pipeline::add_piece`] and [`Pipeline::end_frame`] for
    /// each frame, then [`Pipeline::forward_batch`]. The switch's one copy reads them there.
    pub fn start_batch(&mut self) {
        self.frames.clear();
        self.held.clear();
        self.frags.clear();
    }

    /// Frames in the batch.
    pub fn batch_len(&self) -> usize {
        self.frames.len()
    }

    /// Appends `len` bytes at `ptr` to the frame being gathered.
    ///
    /// # Safety
    /// The bytes stay mapped until [`Pipeline::forward_batch`] returns; their writer may change
    /// them meanwhile (they are read exactly, once per use, never trusted).
    pub unsafe fn add_piece(&mut self, ptr: *const u8, len: u32) {
        if len != 0 {
            self.frags.push(Frag { ptr, len });
        }
    }

    /// Adds a frame of one piece, `len` bytes at `ptr`, with its checked offload request: what
    /// [`Pipeline::add_piece`] and [`Pipeline::end_frame`] do, in one step. False, and the
    /// frame not taken, when it cannot cross the switch (as for `end_frame`).
    ///
    /// # Safety
    /// As for [`Pipeline::add_piece`]; and no piece may have been added since the last frame
    /// ended.
    #[inline]
    pub unsafe fn push_frame(
        &mut self,
        ptr: *const u8,
        len: u32,
        offload: Option<Offload>,
    ) -> bool {
        debug_assert_eq!(
            self.held.last().map_or(0, |h| (h.first + h.count) as usize),
            self.frags.len()
        );
        if !(ETH_HLEN..=MAX_FRAME_LEN).contains(&len) || self.frames.len() >= MAX_BATCH as usize {
            return false;
        }
        prefetch(ptr);
        self.held.push(Held {
            first: self.frags.len() as u32,
            count: 1,
            len,
            offload: offload.map_or(0, Offload::to_word),
        });
        self.frags.push(Frag { ptr, len });
        self.frames.push(FrameMeta::new(ptr, len, len, 0));
        true
    }

    /// Ends the frame whose pieces were added since the last one ended, with its checked
    /// offload request. False, and the frame forgotten, when it cannot cross the switch: no
    /// whole Ethernet header in its first piece, more than `MAX_FRAGS` pieces, longer than
    /// `MAX_FRAME_LEN`; the caller counts it.
    pub fn end_frame(&mut self, offload: Option<Offload>) -> bool {
        let start = self.held.last().map_or(0, |h| (h.first + h.count) as usize);
        let pieces = &self.frags[start..];
        let len: u64 = pieces.iter().map(|g| g.len as u64).sum();
        let ok = !pieces.is_empty()
            && pieces[0].len >= ETH_HLEN
            && pieces.len() <= MAX_FRAGS as usize
            && len <= MAX_FRAME_LEN as u64
            && self.frames.len() < MAX_BATCH as usize;
        if !ok {
            self.frags.truncate(start);
            return false;
        }
        let first = pieces[0];
        prefetch(first.ptr);
        self.frames
            .push(FrameMeta::new(first.ptr, first.len, len as u32, 0));
        self.held.push(Held {
            first: start as u32,
            count: (self.frags.len() - start) as u32,
            len: len as u32,
            offload: offload.map_or(0, Offload::to_word),
        });
        true
    }

    /// Forwards the batch gathered since [`Pipeline::start_batch`] as frames of `src`'s tx
    /// ring `ring` (which picks the destinations' rx ring, as for ring sources).
    pub fn forward_batch(&mut self, sw: &Switch, src: &Arc<Port>, ring: u32) {
        self.shared_source = true;
        let bytes = self.held.iter().map(|h| h.len as u64).sum();
        self.lookup_and_deliver(sw, src, ring, bytes);
        self.start_batch();
    }
}

/// What became of a chain of slots ([`Pipeline::gather_chain`]).
enum Chain {
    /// A frame of these bytes, in the batch.
    Taken(u32),
    /// Its end is not published yet: the batch ends before it.
    Later,
    /// Dropped; `complete`: its end was seen (else its slots still to come are skipped).
    Bad { complete: bool },
}

/// The client's head of tx ring `ring` of `src` and the ring's `hwcur`, when the client
/// published something new there; else None (a head out of the ring is counted as bad input
/// once, and with nothing new the next frame's slot and buffer are prefetched).
#[inline(always)]
fn new_head(src: &Port, att: &Attachment, txr: &TxRing, ring: u32) -> Option<(u32, u32)> {
    let reg = &att.region;
    let l = reg.layout();
    let n = l.params.slots;
    // The client's head, read once. Acquire pairs with the client's release store, so the
    // slots before it are complete when we read them.
    let head = reg.atok(ring).head.load(Acquire);
    let seen = txr.seen_head.swap(head, Relaxed);
    if head >= n {
        if head != seen {
            add(&src.stats().bad_input, 1);
            src.note_bad_input(format_args!("tx ring {ring} head {head} >= {n} slots"));
        }
        return None;
    }
    let hwcur = txr.hwcur.load(Relaxed);
    if head == hwcur {
        // Nothing new. The next frame's slot and buffer are brought toward this CPU now (the
        // buffer a client fills is the one its slot names already): when the head moves, the
        // slot and the frame are then read while the head's line comes, not one after the
        // other (busy ping-pong 3.1 -> 2.9 us where a cache line takes 0.26 us between the
        // two CPUs; docs/benchmarks.md).
        // SAFETY: `hwcur` < n; read once, volatile (the client may be writing it).
        let slot = unsafe { ptr::read_volatile(reg.slot(ring, hwcur)) };
        if (FIRST_SLOT_BUF..l.num_bufs).contains(&slot.buf_idx) {
            prefetch(reg.buf(slot.buf_idx));
        }
        return None;
    }
    Some((head, hwcur))
}

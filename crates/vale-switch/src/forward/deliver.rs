//! Stage 3, deliver: the frames of each destination linked into a list (mSwitch), then each
//! destination served in one critical section, copying into that port's own buffers.

use super::*;

impl Pipeline {
    /// Stage 3. `sent`: frames and bytes the source sent in this batch (as gathered, before
    /// stage 2 made entries of them).
    pub(super) fn deliver_batch(
        &mut self,
        sw: &Switch,
        src: &Arc<Port>,
        ring: u32,
        sent: (u64, u64),
    ) {
        let table = sw.ports();
        let mut tx_drops = 0u64;
        let mut flood_head = NIL;
        let mut flood_tail = NIL;
        let mut flooded = 0u64;
        // A link for each frame of the batch (`next` has one for the largest), indexed
        // without a look at `next`'s length in the loop.
        let next = &mut self.next[..self.frames.len()];
        for (k, f) in self.frames.iter().enumerate() {
            next[k] = NIL;
            let i = k as u16;
            let d = f.dst;
            if d == DEST_FLOOD {
                if flood_head == NIL {
                    flood_head = i;
                } else {
                    next[flood_tail as usize] = i;
                }
                flood_tail = i;
                flooded += 1;
                continue;
            }
            let valid = d != DEST_DROP
                && d != src.index
                && match table.get(d as usize) {
                    Some(Some(p)) => f.ring == RING_ANY || p.has_rx_ring(f.ring),
                    _ => false,
                };
            if !valid {
                tx_drops += 1;
                continue;
            }
            if f.ring != RING_ANY {
                // Few lists a batch (a module that picks rings picks few): a linear search.
                match self.chosen.iter_mut().find(|c| (c.0, c.1) == (d, f.ring)) {
                    Some(c) => {
                        next[c.3 as usize] = i;
                        c.3 = i;
                    }
                    None => self.chosen.push((d, f.ring, i, i)),
                }
                continue;
            }
            let d = d as usize;
            if self.dst_head[d] == NIL {
                self.dst_head[d] = i;
                self.active.push(d as u16);
            } else {
                next[self.dst_tail[d] as usize] = i;
            }
            self.dst_tail[d] = i;
        }
        if flood_head != NIL && !table.iter().flatten().any(|p| p.index != src.index) {
            // The sender is alone on the switch: flooded frames have nowhere to go.
            tx_drops += flooded;
        }
        // Counted before delivery, so that no one who sees these frames arrive reads a
        // sender's counters without them.
        let stats = src.stats();
        add(&stats.tx_packets, sent.0);
        add(&stats.tx_bytes, sent.1);
        add(&stats.tx_drops, tx_drops);
        if flood_head != NIL {
            for p in table.iter().flatten() {
                if p.index != src.index {
                    let own = self.dst_head[p.index as usize];
                    self.deliver(src, p, (ring, RING_ANY), own, flood_head);
                }
            }
        } else {
            for k in 0..self.active.len() {
                let d = self.active[k] as usize;
                if let Some(Some(p)) = table.get(d) {
                    self.deliver(src, p, (ring, RING_ANY), self.dst_head[d], NIL);
                }
            }
        }
        for k in 0..self.chosen.len() {
            let (d, r, head, _) = self.chosen[k];
            if let Some(Some(p)) = table.get(d as usize) {
                self.deliver(src, p, (ring, r), head, NIL);
            }
        }
        self.chosen.clear();
        for &d in &self.active {
            self.dst_head[d as usize] = NIL;
        }
        self.active.clear();
    }

    /// Delivers the frames of list `a` merged with list `b` (in batch order) to `dst`, in one
    /// critical section on the destination ring: `rx_ring`, or with [`RING_ANY`] the one
    /// `src_ring` maps to.
    pub(super) fn deliver(
        &mut self,
        src: &Port,
        dst: &Arc<Port>,
        (src_ring, rx_ring): (u32, u16),
        mut a: u16,
        mut b: u16,
    ) {
        if a == NIL {
            // One list (a batch that is all flooded): as `a`, walked without a merge.
            (a, b) = (b, NIL);
        }
        let Some(att) = &dst.attachment else {
            add(&dst.stats().rx_drops, count_lists(&self.next, a, b));
            return;
        };
        if dst.shared.captures.on() {
            self.capture_rx(dst, a, b);
        }
        let caps = Caps(att.caps.load(Relaxed));
        let r = match rx_ring {
            RING_ANY => src_ring,
            // Checked against the port in stage 3; a port attached again since may have fewer.
            r => r as u32,
        } % att.rx.len() as u32;
        // Segments of a frame the resolver cut for a direct sink that then declined them, from
        // this one on: they go into the ring first.
        let mut seg_next = self.seg_spans.len();
        if let Some(sink) = &att.direct {
            let flow = (src.index as u32) << 16 | src_ring;
            match self.try_direct(src, dst, &**sink, (caps, flow, r), (&mut a, &mut b)) {
                Some(next) => seg_next = next,
                None => return,
            }
        }
        self.deliver_ring(src, dst, caps, r, seg_next, (a, b));
    }

    /// The frames of lists `a` and `b` to `dst`'s direct sink, if no frame waits in its rx
    /// ring `r` (the sink is asked to take those first). None when the sink took everything;
    /// else where the segments it declined start (the lists keep the frames it declined).
    #[inline(always)]
    fn try_direct(
        &mut self,
        src: &Port,
        dst: &Arc<Port>,
        sink: &dyn DirectSink,
        (caps, flow, r): (Caps, u32, u32),
        (a, b): (&mut u16, &mut u16),
    ) -> Option<usize> {
        let att = dst.attachment.as_ref()?;
        let ring = att.region.layout().params.tx_rings + r;
        let waiting = || {
            att.region.atok(ring).head.load(Acquire) != att.region.ktoa(ring).hwtail.load(Acquire)
        };
        // Frames in the ring go first: the sink is asked to take them now, and the batch goes
        // direct if it took them all.
        let mut w = waiting();
        if w {
            sink.drain();
            w = waiting();
        }
        if w {
            return Some(self.seg_spans.len());
        }
        self.seg_spans.clear();
        let seg_next = self.deliver_direct(src, dst, sink, caps, flow, (a, b));
        if *a == NIL && *b == NIL && seg_next == self.seg_spans.len() {
            return None;
        }
        Some(seg_next)
    }

    /// The segments from `seg_next` on and the frames of lists `a` and `b` into `dst`'s rx
    /// ring `r`, in one critical section on it; what could not go in is dropped and counted.
    #[inline(always)]
    fn deliver_ring(
        &mut self,
        src: &Port,
        dst: &Arc<Port>,
        caps: Caps,
        r: u32,
        seg_next: usize,
        lists: (u16, u16),
    ) {
        let stats = dst.stats();
        let Some(att) = &dst.attachment else { return };
        let rxr = &att.rx[r as usize];
        let reg = &att.region;
        let l = reg.layout();
        let ring = l.params.tx_rings + r;
        let n = l.params.slots;
        let mask = n - 1;
        let atok = reg.atok(ring);
        let ktoa = reg.ktoa(ring);

        let mut t = Tally::default();
        let mut hwtail = rxr.lock.lock().unwrap_or_else(|e| e.into_inner());
        // The client's head, read once: slots from hwtail up to head-1 are ours to fill.
        let head = atok.head.load(Acquire);
        let free = if head < n {
            head.wrapping_sub(*hwtail).wrapping_sub(1) & mask
        } else {
            t.bad += 1;
            0
        };
        let mut out = DstRing {
            reg,
            ring,
            mask,
            bsize: l.params.buf_size,
            num_bufs: l.num_bufs,
            tail: *hwtail,
            free,
            caps,
        };
        let src_bad = self.put_all(&mut out, &mut t, seg_next, lists);
        let tail = out.tail;
        // Counted before the client can see the frames (the tail store below).
        add(&stats.rx_packets, t.delivered);
        add(&stats.rx_bytes, t.bytes);
        if t.delivered != 0 {
            *hwtail = tail;
            // Release: the slots and payloads written above are visible before the new tail.
            ktoa.hwtail.store(tail, Release);
        }
        if head < n {
            ktoa.hwcur.store(head, Relaxed);
        }
        drop(hwtail);
        add(&stats.rx_drops, t.dropped);
        if t.bad != 0 {
            add(&stats.bad_input, t.bad);
            dst.note_bad_input(format_args!("rx ring {r}: bad head or buffer index"));
        }
        note_offload_errors(src, src_bad);
        if t.delivered != 0 {
            // Same store / fence / load order as for tx completions above.
            fence(SeqCst);
            if atok.appl_need_kick.load(Relaxed) != 0 {
                self.notifier.raise(dst, IrqLine::Rx(r));
            }
        }
    }

    /// Puts the segments from `seg_next` on, then the frames of lists `a` and `b`, into
    /// `out`, counting in `t`; the frames whose headers contradict their offload request (the
    /// sender's fault, dropped).
    #[inline(always)]
    fn put_all(
        &mut self,
        out: &mut DstRing,
        t: &mut Tally,
        seg_next: usize,
        (mut a, mut b): (u16, u16),
    ) -> u64 {
        let mut src_bad = 0u64;
        for &(s, l) in &self.seg_spans[seg_next..] {
            let frag = [Frag {
                ptr: self.seg_store[s as usize..].as_ptr(),
                len: l,
            }];
            t.count(out.put(&frag, l, 0, false, &mut self.dst_bufs), l);
        }
        self.seg_spans.clear();
        while a != NIL || b != NIL {
            if out.free == 0 {
                // The ring is full: the rest of the list is dropped, without a look at each.
                t.dropped += count_lists(&self.next, a, b);
                break;
            }
            let i = take_next(&self.next, &mut a, &mut b) as usize;
            let f = self.held[i];
            let (fs, fc) = (f.first, f.count);
            let frags = &self.frags[fs as usize..(fs + fc) as usize];
            let off = Offload::from_word(f.offload);
            if f.offload != 0 && !off.fits(out.caps) {
                // Slow path: a TSO segment or a partial checksum toward a port that cannot
                // take it.
                let dst_bufs = &mut self.dst_bufs;
                let copy = self.shared_source;
                let r = resolve_frags(
                    &mut self.resolver,
                    &mut self.pieces,
                    frags,
                    off,
                    copy,
                    |seg| {
                        let frag = [Frag {
                            ptr: seg.as_ptr(),
                            len: seg.len() as u32,
                        }];
                        t.count(
                            out.put(&frag, seg.len() as u32, 0, false, dst_bufs),
                            seg.len() as u32,
                        );
                    },
                );
                if r.is_err() {
                    // Headers that contradict the offload request: the sender's fault.
                    src_bad += 1;
                    t.dropped += 1;
                }
                continue;
            }
            let rounded = !self.shared_source;
            t.count(
                out.put(frags, f.len, f.offload, rounded, &mut self.dst_bufs),
                f.len,
            );
        }
        src_bad
    }
}

/// A destination rx ring being filled, inside its critical section.
pub(super) struct DstRing<'a> {
    reg: &'a crate::region::Region,
    ring: u32,
    mask: u32,
    bsize: u32,
    num_bufs: u32,
    tail: u32,
    free: u32,
    /// The offload work the port takes as it is.
    caps: Caps,
}

pub(super) enum Put {
    Done,
    /// No room: dropped.
    Full,
    /// The destination's client wrote a bad buffer index: dropped.
    Bad,
}

impl DstRing<'_> {
    /// Copies one frame into the next free slots. `rounded`: the fragments may be read up to
    /// their length rounded up to 64 bytes (true of ring buffers, not of scratch space).
    #[inline(always)]
    fn put(
        &mut self,
        frags: &[Frag],
        len: u32,
        offload: u64,
        rounded: bool,
        dst_bufs: &mut Vec<*mut u8>,
    ) -> Put {
        if len <= self.bsize {
            return self.put_one(frags, len, offload, rounded);
        }
        let need = len.div_ceil(self.bsize);
        if need > self.free {
            return Put::Full;
        }
        // The destination's buffer indices are its client's to change: check each.
        dst_bufs.clear();
        for k in 0..need {
            // SAFETY: index reduced modulo the ring size.
            let idx = unsafe {
                ptr::read_volatile(
                    &(*self.reg.slot(self.ring, (self.tail + k) & self.mask)).buf_idx,
                )
            };
            if !(FIRST_SLOT_BUF..self.num_bufs).contains(&idx) {
                return Put::Bad;
            }
            dst_bufs.push(self.reg.buf(idx));
        }
        // SAFETY: source fragments were checked against the source's buffer size and pool
        // (or are scratch space of their exact length, `rounded` false); destination buffers
        // against the destination's; lengths fit as computed.
        unsafe { copy_frame(frags, dst_bufs, self.bsize as usize, rounded) };
        for k in 0..need {
            let chunk = (len - k * self.bsize).min(self.bsize);
            let mut flags = if k + 1 < need { NS_MOREFRAG } else { 0 };
            let s = self.reg.slot(self.ring, (self.tail + k) & self.mask);
            if k == 0 && offload != 0 && !self.caps.is_empty() {
                flags |= NS_OFFLOAD;
                // SAFETY: slot inside the region.
                unsafe { ptr::write_volatile(&mut (*s).ptr, offload) };
            }
            // SAFETY: slot inside the region.
            unsafe {
                ptr::write_volatile(&mut (*s).len, chunk as u16);
                ptr::write_volatile(&mut (*s).flags, flags);
            }
        }
        self.tail = (self.tail + need) & self.mask;
        self.free -= need;
        Put::Done
    }

    /// [`DstRing::put`] of a frame that fits one slot, the common case: no division, no list
    /// of buffers, one slot written.
    #[inline(always)]
    fn put_one(&mut self, frags: &[Frag], len: u32, offload: u64, rounded: bool) -> Put {
        if self.free == 0 {
            return Put::Full;
        }
        let s = self.reg.slot(self.ring, self.tail);
        // SAFETY: `tail` is below the ring size; the index is the client's to change: checked.
        let idx = unsafe { ptr::read_volatile(&(*s).buf_idx) };
        if !(FIRST_SLOT_BUF..self.num_bufs).contains(&idx) {
            return Put::Bad;
        }
        // SAFETY: as in `put`; one destination buffer holds `len` bytes.
        unsafe { copy_frame(frags, &[self.reg.buf(idx)], self.bsize as usize, rounded) };
        let mut flags = 0;
        if offload != 0 && !self.caps.is_empty() {
            flags = NS_OFFLOAD;
            // SAFETY: slot inside the region.
            unsafe { ptr::write_volatile(&mut (*s).ptr, offload) };
        }
        // SAFETY: slot inside the region.
        unsafe {
            ptr::write_volatile(&mut (*s).len, len as u16);
            ptr::write_volatile(&mut (*s).flags, flags);
        }
        self.tail = (self.tail + 1) & self.mask;
        self.free -= 1;
        Put::Done
    }
}

/// What a delivery into a ring made of its frames.
#[derive(Default)]
pub(super) struct Tally {
    delivered: u64,
    bytes: u64,
    dropped: u64,
    /// Dropped because the destination's client wrote a bad buffer index.
    bad: u64,
}

impl Tally {
    #[inline(always)]
    fn count(&mut self, put: Put, len: u32) {
        match put {
            Put::Done => {
                self.delivered += 1;
                self.bytes += len as u64;
            }
            Put::Full => self.dropped += 1,
            Put::Bad => {
                self.bad += 1;
                self.dropped += 1;
            }
        }
    }
}

/// Counts and logs (once per owner) frames of `src` whose headers contradict their offload
/// request: the sender's fault.
pub(super) fn note_offload_errors(src: &Port, n: u64) {
    if n != 0 {
        add(&src.stats().bad_input, n);
        src.note_bad_input(format_args!(
            "{n} frame(s) with inconsistent offload headers"
        ));
    }
}

/// Finishes the offload work of a frame of `frags` in software; `emit` is given each
/// resulting frame. `pieces` is scratch space (see [`recycle`]). `copy`: the frame's writer
/// may change it meanwhile, so it is parsed from a copy.
pub(super) fn resolve_frags(
    resolver: &mut Resolver,
    pieces: &mut Vec<&'static [u8]>,
    frags: &[Frag],
    off: Offload,
    copy: bool,
    emit: impl FnMut(&[u8]),
) -> Result<(), crate::offload::OffloadError> {
    let mut list: Vec<&[u8]> = std::mem::take(pieces);
    list.extend(
        frags
            .iter()
            // SAFETY: checked against the source's pool and buffer size in stage 1.
            .map(|g| unsafe { std::slice::from_raw_parts(g.ptr, g.len as usize) }),
    );
    let r = resolver.resolve(&list, off, copy, emit);
    *pieces = recycle(list);
    r.map(|_| ())
}

/// Copies a frame's fragments into consecutive destination buffers of `bsize` bytes.
///
/// # Safety
/// With `rounded`, each fragment must be readable for its length rounded up to 64 bytes
/// (buffers are multiples of 64); and `dst` must hold enough buffers of `bsize` bytes for the frame.
#[inline(always)]
pub(super) unsafe fn copy_frame(frags: &[Frag], dst: &[*mut u8], bsize: usize, rounded: bool) {
    if let ([f], [d], true) = (frags, dst, rounded) {
        // The common case: one slot in, one slot out. Copy whole 64-byte chunks; both
        // buffers are at least that long.
        if f.len <= 64 {
            // A constant length: a few vector moves inline instead of a call.
            ptr::copy_nonoverlapping(f.ptr, *d, 64);
        } else {
            ptr::copy_nonoverlapping(f.ptr, *d, (f.len as usize + 63) & !63);
        }
        return;
    }
    if let ([f], [_, ..]) = (frags, dst) {
        if f.len as usize <= bsize {
            // One piece into one buffer, not to be read past its length (a guest's frame):
            // short ones without a call.
            crate::copy::copy_bytes(dst[0], f.ptr, f.len as usize);
            return;
        }
    }
    let mut di = 0;
    let mut doff = 0;
    for f in frags {
        let mut sp = f.ptr;
        let mut rem = f.len as usize;
        while rem > 0 {
            let c = rem.min(bsize - doff);
            ptr::copy_nonoverlapping(sp, dst[di].add(doff), c);
            sp = sp.add(c);
            rem -= c;
            doff += c;
            if doff == bsize {
                di += 1;
                doff = 0;
            }
        }
    }
}

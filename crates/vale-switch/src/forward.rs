//! The forwarding pipeline of VALE section 3.3, with mSwitch's per-destination lists.
//!
//! One call of [`Pipeline::forward`] takes a batch from one source tx ring and runs:
//! 1. **gather**: read each slot once, check it, collect the frame's fragments, prefetch the
//!    payload;
//! 2. **lookup**: one call of the switch's lookup module for the whole batch;
//! 3. **deliver**: link the frames of each destination into a list, then serve every
//!    destination in one critical section, copying into that port's own buffers.
//!
//! Unicast costs the same whatever the number of ports: only destinations that have frames are
//! visited, unless the batch holds a flooded frame, which visits every port once per batch.
//! A full destination ring drops and counts; nothing here ever waits on a client.

use std::ptr;
use std::sync::atomic::{fence, Ordering::*};
use std::sync::Arc;
use std::time::Instant;

use vale_abi::netmap::{NetmapSlot, NS_INDIRECT, NS_MOREFRAG, NS_OFFLOAD};
use vale_abi::region::{FIRST_SLOT_BUF, MAX_FRAGS, MAX_FRAME_LEN};

use crate::capture;
use crate::kind::{DirectSink, OutFrame, OutFrames};
use crate::lookup::{
    Egress, FrameMeta, Lookup, SourcePort, DEST_DROP, DEST_FLOOD, RING_ANY, VLAN_TAGGED, VLAN_VID,
};
use crate::offload::{Caps, Offload, Resolver};
use crate::port::{add, Irq, Port};
use crate::switch::{PortTable, Switch, MAX_BATCH, MAX_PORTS};
use vale_abi::capture::{DIR_RX, DIR_TX};
use vale_abi::pipe;

const ETH_HLEN: u32 = 14;
const NIL: u16 = u16::MAX;

/// One fragment of a frame in the source port's memory.
#[derive(Clone, Copy)]
struct Frag {
    ptr: *const u8,
    len: u32,
}

/// Which interrupt line of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrqLine {
    Tx(u32),
    Rx(u32),
}

impl IrqLine {
    fn of(self, port: &Port) -> Option<&Irq> {
        let a = port.attachment.as_ref()?;
        match self {
            IrqLine::Tx(r) => a.tx.get(r as usize).map(|t| &t.irq),
            IrqLine::Rx(r) => a.rx.get(r as usize).map(|t| &t.irq),
        }
    }
}

/// Raises interrupts toward clients, applying each port's moderation interval (the CSB
/// paper, section 3.1): within an interval of the last interrupt, the next one is deferred to
/// the end of the interval and raised once, however many deliveries asked for it meanwhile.
pub struct Notifier {
    epoch: Instant,
    pending: Vec<(u64, Arc<Port>, IrqLine)>,
}

impl Notifier {
    pub fn new(epoch: Instant) -> Notifier {
        Notifier {
            epoch,
            pending: Vec::new(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn raise(&mut self, port: &Arc<Port>, line: IrqLine) {
        let Some(irq) = line.of(port) else { return };
        let m = port.shared.moderation_ns.load(Relaxed);
        if m == 0 {
            pipe::signal(&irq.wr);
            return;
        }
        let now = self.now_ns();
        let last = irq.last_ns.load(Relaxed);
        if now.saturating_sub(last) >= m {
            irq.last_ns.store(now, Relaxed);
            pipe::signal(&irq.wr);
        } else if !irq.pending.swap(true, AcqRel) {
            self.pending.push((last + m, port.clone(), line));
        }
    }

    /// Raises the deferred interrupts that are due; returns ns until the next one, if any.
    pub fn fire_due(&mut self) -> Option<u64> {
        if self.pending.is_empty() {
            return None;
        }
        let now = self.now_ns();
        let mut next = u64::MAX;
        self.pending.retain(|(due, port, line)| {
            if *due > now {
                next = next.min(*due - now);
                return true;
            }
            if let Some(irq) = line.of(port) {
                irq.pending.store(false, Release);
                irq.last_ns.store(now, Relaxed);
                pipe::signal(&irq.wr);
            }
            false
        });
        (next != u64::MAX).then_some(next)
    }

    /// Forgets deferred interrupts of a port that is going away.
    pub fn forget(&mut self, port: &Arc<Port>) {
        self.pending.retain(|(_, p, _)| !Arc::ptr_eq(p, port));
    }
}

/// What the engine keeps of a frame beside the lookup module's view of it ([`FrameMeta`]):
/// its fragments, its true length and its offload word, which no module sees or changes.
#[derive(Clone, Copy)]
struct Held {
    /// The frame's first fragment in `frags`, and how many it has.
    first: u32,
    count: u32,
    len: u32,
    /// The frame's offload word ([`Offload`]), 0 for none.
    offload: u64,
}

/// The 802.1Q tag of each VID (priority 0), for frames that gain one on their way out.
static TAGS: [[u8; 4]; 4096] = {
    let mut t = [[0u8; 4]; 4096];
    let mut v = 0;
    while v < 4096 {
        t[v] = [0x81, 0x00, (v >> 8) as u8, v as u8];
        v += 1;
    }
    t
};

/// A worker's scratch space for one batch; allocated once, reused for every batch.
pub struct Pipeline {
    /// The lookup module's view of each frame, and the engine's own ([`Held`]).
    frames: Vec<FrameMeta>,
    held: Vec<Held>,
    /// Stage 2's rewritten batch for modules that do VLANs (see [`Pipeline::scope`]).
    scoped: (Vec<FrameMeta>, Vec<Held>),
    /// The ports of one VLAN but the source, and how each takes it: asked of the module once
    /// per VLAN per batch.
    members: Vec<(u16, Egress)>,
    frags: Vec<Frag>,
    /// Next frame in the same destination list (mSwitch), or NIL.
    next: Vec<u16>,
    dst_head: Vec<u16>,
    dst_tail: Vec<u16>,
    /// Destinations whose list is not empty.
    active: Vec<u16>,
    /// Lists of frames to an rx ring the module chose: (port, ring, head, tail).
    chosen: Vec<(u16, u16, u16, u16)>,
    dst_bufs: Vec<*mut u8>,
    /// A frame's pieces for a direct write, behind one header.
    iov: Vec<libc::iovec>,
    /// Does offload work in software for ports that cannot take it.
    resolver: Resolver,
    /// The allocation of the list of a frame's pieces the resolver reads (see [`recycle`]).
    pieces: Vec<&'static [u8]>,
    /// Frames the resolver made for a direct sink: their bytes, and (start, length) of each.
    seg_store: Vec<u8>,
    seg_spans: Vec<(u32, u32)>,
    /// The batch's frames are in memory their writer shares and may change (a guest's, not a
    /// ring buffer): read to their exact length, and copied aside before offload work parses
    /// them.
    shared_source: bool,
    pub notifier: Notifier,
}

// SAFETY: the raw pointers are only meaningful during one `forward` call on one thread.
unsafe impl Send for Pipeline {}

impl Pipeline {
    pub fn new(epoch: Instant) -> Pipeline {
        let b = MAX_BATCH as usize;
        Pipeline {
            frames: Vec::with_capacity(b),
            held: Vec::with_capacity(b),
            scoped: (Vec::new(), Vec::new()),
            members: Vec::with_capacity(MAX_PORTS),
            frags: Vec::with_capacity(4 * b),
            next: vec![NIL; b],
            dst_head: vec![NIL; MAX_PORTS],
            dst_tail: vec![NIL; MAX_PORTS],
            active: Vec::with_capacity(MAX_PORTS),
            chosen: Vec::with_capacity(b),
            dst_bufs: Vec::with_capacity(MAX_FRAGS as usize),
            iov: Vec::with_capacity(1 + MAX_FRAGS as usize),
            resolver: Resolver::new(),
            pieces: Vec::with_capacity(MAX_FRAGS as usize),
            seg_store: Vec::new(),
            seg_spans: Vec::new(),
            shared_source: false,
            notifier: Notifier::new(epoch),
        }
    }

    /// Forwards one batch from tx ring `ring` of `src`. Returns the number of slots consumed;
    /// 0 when the client's `head` showed nothing new to take.
    pub fn forward(&mut self, sw: &Switch, src: &Arc<Port>, ring: u32) -> u32 {
        let Some(att) = &src.attachment else { return 0 };
        let Some(txr) = att.tx.get(ring as usize) else {
            return 0;
        };
        let reg = &att.region;
        let l = reg.layout();
        let n = l.params.slots;
        let mask = n - 1;
        let buf_size = l.params.buf_size;
        let num_bufs = l.num_bufs;
        let atok = reg.atok(ring);
        let ktoa = reg.ktoa(ring);

        // The client's head, read once. Acquire pairs with the client's release store, so the
        // slots before it are complete when we read them.
        let head = atok.head.load(Acquire);
        let seen = txr.seen_head.swap(head, Relaxed);
        if head >= n {
            if head != seen {
                add(&src.stats().bad_input, 1);
                src.note_bad_input(format_args!("tx ring {ring} head {head} >= {n} slots"));
            }
            return 0;
        }
        let hwcur = txr.hwcur.load(Relaxed);
        if head == hwcur {
            return 0;
        }

        // Stage 1: gather.
        let batch = sw.batch.load(Relaxed) as usize;
        self.frames.clear();
        self.held.clear();
        let mut sent_bytes = 0u64;
        self.frags.clear();
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
            let chain_start = cur;
            let frag_start = self.frags.len();
            let mut total = 0u32;
            let mut count = 0u32;
            let mut ok = true;
            let mut first_flags = 0u16;
            let mut offload = 0u64;
            let complete = loop {
                // SAFETY: `cur` < n, so the slot is inside the region; read once, volatile,
                // because the client may be writing it.
                let slot: NetmapSlot = unsafe { ptr::read_volatile(reg.slot(ring, cur)) };
                cur = (cur + 1) & mask;
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
                if cur == head {
                    break false;
                }
            };
            if !complete && ok && count < n - 1 {
                // The rest of the chain is not published yet: take it next time.
                cur = chain_start;
                self.frags.truncate(frag_start);
                break;
            }
            if !ok || !complete || self.frags[frag_start].len < ETH_HLEN {
                // A bad slot, a chain that can never complete, or no Ethernet header in the
                // first slot: the frame is dropped and counted against its sender. If the
                // chain's end is still to come, its remaining slots are skipped when they are.
                bad += 1;
                self.frags.truncate(frag_start);
                dropping = !complete;
                continue;
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
            sent_bytes += total as u64;
        }
        txr.dropping_chain.store(dropping, Relaxed);
        if bad != 0 {
            add(&src.stats().bad_input, bad);
            src.note_bad_input(format_args!("{bad} bad slot chain(s) on tx ring {ring}"));
        }
        if cur == hwcur {
            return 0;
        }

        self.shared_source = false;
        self.lookup_and_deliver(sw, src, ring, sent_bytes);

        // Give the consumed slots back: every slot but one between hwcur and the new hwtail
        // is the client's again.
        txr.hwcur.store(cur, Relaxed);
        ktoa.hwcur.store(cur, Relaxed);
        ktoa.hwtail.store((cur + n - 1) & mask, Release);
        // Store hwtail, full fence, then load appl_need_kick: the client stores the flag,
        // fences, then re-reads hwtail, so one of us sees the other (no lost wake-up).
        fence(SeqCst);
        if atok.appl_need_kick.load(Relaxed) != 0 {
            self.notifier.raise(src, IrqLine::Tx(ring));
        }
        (cur.wrapping_sub(hwcur)) & mask
    }

    /// Stages 2 and 3 for the frames gathered; `sent_bytes`: their bytes.
    fn lookup_and_deliver(&mut self, sw: &Switch, src: &Arc<Port>, ring: u32, sent_bytes: u64) {
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

    /// Stage 2, for a module that puts frames into VLANs: rewrites the batch into one entry
    /// per frame and destination port, in the form that port takes the frame's VLAN. A
    /// flooded frame becomes an entry for each other member of its VLAN (none for the rest),
    /// a frame for a port outside its VLAN a drop. A frame that gains a tag is the sender's
    /// bytes with the tag spliced in as a fragment of its own, one that loses it the sender's
    /// bytes around it: delivery, which copies each frame into its destination's buffers
    /// anyway, does the edit as it copies, with no copy, allocation or knowledge of VLANs of
    /// its own. Entries stay in batch order, so each destination gets its frames in order.
    /// Returns the frames lost because the rewritten batch would not fit its indices.
    fn scope(&mut self, module: &dyn Lookup, table: &PortTable, src: u16) -> u64 {
        let n = self.frames.len();
        let mut members = std::mem::take(&mut self.members);
        // The VLAN `members` lists (a batch from an access port is all one VLAN).
        let mut members_of = u16::MAX;
        let refresh = |members: &mut Vec<(u16, Egress)>, vid: u16| {
            members.clear();
            for p in table.iter().flatten() {
                if p.index != src {
                    match module.egress(p.index, vid) {
                        Egress::Skip => {}
                        e => members.push((p.index, e)),
                    }
                }
            }
        };
        // In place, as long as each frame is one entry, as it is (unicast inside an access
        // VLAN, a flood to one other member): the common case costs no copy.
        let mut i = 0;
        while i < n {
            let f = self.frames[i];
            let vid = f.vlan & VLAN_VID;
            let tagged = f.vlan & VLAN_TAGGED != 0;
            let as_is = |e: Egress| {
                !matches!(
                    (e, tagged),
                    (Egress::Tagged, false) | (Egress::Untagged, true)
                )
            };
            let dst = if f.vlan == 0 || f.dst == DEST_DROP {
                f.dst
            } else if f.dst != DEST_FLOOD {
                match module.egress(f.dst, vid) {
                    Egress::Skip => DEST_DROP,
                    e if as_is(e) => f.dst,
                    _ => break,
                }
            } else {
                if members_of != vid {
                    refresh(&mut members, vid);
                    members_of = vid;
                }
                match members[..] {
                    [] => DEST_DROP,
                    [(p, e)] if as_is(e) => p,
                    _ => break,
                }
            };
            self.frames[i].dst = dst;
            i += 1;
        }
        if i == n {
            self.members = members;
            return 0;
        }
        // From frame i on, into a new batch: the frames before it as they are now.
        let mut out = std::mem::take(&mut self.scoped);
        out.0.clear();
        out.1.clear();
        out.0.extend_from_slice(&self.frames[..i]);
        out.1.extend_from_slice(&self.held[..i]);
        let mut lost = 0u64;
        for i in i..n {
            let f = self.frames[i];
            let vid = f.vlan & VLAN_VID;
            if f.vlan == 0 || f.dst == DEST_DROP {
                self.entry(&mut out, &mut lost, i, f.dst, Egress::Skip);
            } else if f.dst != DEST_FLOOD {
                match module.egress(f.dst, vid) {
                    Egress::Skip => self.entry(&mut out, &mut lost, i, DEST_DROP, Egress::Skip),
                    e => self.entry(&mut out, &mut lost, i, f.dst, e),
                }
            } else {
                if members_of != vid {
                    refresh(&mut members, vid);
                    members_of = vid;
                }
                if members.is_empty() {
                    // No other member: nowhere to go.
                    self.entry(&mut out, &mut lost, i, DEST_DROP, Egress::Skip);
                }
                for &(p, e) in &members {
                    self.entry(&mut out, &mut lost, i, p, e);
                }
            }
        }
        std::mem::swap(&mut self.frames, &mut out.0);
        std::mem::swap(&mut self.held, &mut out.1);
        self.scoped = out;
        self.members = members;
        if self.next.len() < self.frames.len() {
            self.next.resize(self.frames.len(), NIL);
        }
        lost
    }

    /// Appends to `out` the entry of frame `i` for `dst`, which takes its VLAN `e`; counts it
    /// in `lost` if the batch's indices are all used (they are u16, NIL excluded).
    #[inline(always)]
    fn entry(
        &mut self,
        out: &mut (Vec<FrameMeta>, Vec<Held>),
        lost: &mut u64,
        i: usize,
        dst: u16,
        e: Egress,
    ) {
        if out.0.len() == NIL as usize {
            *lost += 1;
            return;
        }
        let f = self.frames[i];
        let tagged = f.vlan & VLAN_TAGGED != 0;
        let h = match (e, tagged) {
            (Egress::Tagged, false) | (Egress::Untagged, true) => {
                self.edit(i, e, tagged, f.vlan & VLAN_VID)
            }
            // As it is: the common case, kept short.
            _ => self.held[i],
        };
        out.0.push(FrameMeta { dst, ..f });
        out.1.push(h);
    }

    /// Frame `i` as a port that takes its VLAN `e` gets it: its length and offload word, and
    /// its fragments, new ones (appended to `frags`) if the tag goes in or out. `Skip`: as
    /// it is.
    fn edit(&mut self, i: usize, e: Egress, tagged: bool, vid: u16) -> Held {
        let mut h = self.held[i];
        let (fs, fc) = (h.first, h.count);
        let first = self.frags[fs as usize];
        let start = self.frags.len() as u32;
        // The tag sits after the two addresses.
        let at = |off: usize, len: u32| Frag {
            // SAFETY: within the first fragment (at least 14 bytes; 18 when tagged).
            ptr: unsafe { first.ptr.add(off) },
            len,
        };
        let shift: i32 = match (e, tagged) {
            (Egress::Tagged, false) => {
                self.frags.push(at(0, 12));
                self.frags.push(Frag {
                    ptr: TAGS[vid as usize].as_ptr(),
                    len: 4,
                });
                self.frags.push(at(12, first.len - 12));
                4
            }
            (Egress::Untagged, true) => {
                self.frags.push(at(0, 12));
                if first.len > 16 {
                    self.frags.push(at(16, first.len - 16));
                }
                -4
            }
            _ => return h,
        };
        for k in fs + 1..fs + fc {
            let g = self.frags[k as usize];
            self.frags.push(g);
        }
        h.len = h.len.wrapping_add_signed(shift);
        if h.offload != 0 {
            // The checksum's start moves with the bytes after the tag.
            let mut o = Offload::from_word(h.offload);
            o.csum_start = o.csum_start.saturating_add_signed(shift as i16);
            h.offload = o.to_word();
        }
        h.first = start;
        h.count = self.frags.len() as u32 - start;
        h
    }

    /// Stage 3. `sent`: frames and bytes the source sent in this batch (as gathered, before
    /// stage 2 made entries of them).
    fn deliver_batch(&mut self, sw: &Switch, src: &Arc<Port>, ring: u32, sent: (u64, u64)) {
        let table = sw.ports();
        let mut tx_drops = 0u64;
        let mut flood_head = NIL;
        let mut flood_tail = NIL;
        let mut flooded = 0u64;
        for (i, f) in self.frames.iter().enumerate() {
            let i = i as u16;
            self.next[i as usize] = NIL;
            let d = f.dst;
            if d == DEST_FLOOD {
                if flood_head == NIL {
                    flood_head = i;
                } else {
                    self.next[flood_tail as usize] = i;
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
                        self.next[c.3 as usize] = i;
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
                self.next[self.dst_tail[d] as usize] = i;
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
    fn deliver(
        &mut self,
        src: &Port,
        dst: &Arc<Port>,
        (src_ring, rx_ring): (u32, u16),
        mut a: u16,
        mut b: u16,
    ) {
        let stats = dst.stats();
        let Some(att) = &dst.attachment else {
            add(&stats.rx_drops, count_lists(&self.next, a, b));
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
            let ring = att.region.layout().params.tx_rings + r;
            let waiting = att.region.atok(ring).head.load(Acquire)
                != att.region.ktoa(ring).hwtail.load(Acquire);
            if !waiting {
                self.seg_spans.clear();
                let flow = (src.index as u32) << 16 | src_ring;
                seg_next = self.deliver_direct(src, dst, &**sink, caps, flow, (&mut a, &mut b));
                if a == NIL && b == NIL && seg_next == self.seg_spans.len() {
                    return;
                }
            }
        }
        let rxr = &att.rx[r as usize];
        let reg = &att.region;
        let l = reg.layout();
        let ring = l.params.tx_rings + r;
        let n = l.params.slots;
        let mask = n - 1;
        let bsize = l.params.buf_size;
        let num_bufs = l.num_bufs;
        let atok = reg.atok(ring);
        let ktoa = reg.ktoa(ring);

        let mut t = Tally::default();
        let mut src_bad = 0u64;
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
            bsize,
            num_bufs,
            tail: *hwtail,
            free,
            caps,
        };
        for &(s, l) in &self.seg_spans[seg_next..] {
            let frag = [Frag {
                ptr: self.seg_store[s as usize..].as_ptr(),
                len: l,
            }];
            t.count(out.put(&frag, l, 0, false, &mut self.dst_bufs), l);
        }
        self.seg_spans.clear();
        while a != NIL || b != NIL {
            let i = take_next(&self.next, &mut a, &mut b) as usize;
            let f = self.held[i];
            let (fs, fc) = (f.first, f.count);
            let frags = &self.frags[fs as usize..(fs + fc) as usize];
            let off = Offload::from_word(f.offload);
            if f.offload != 0 && !off.fits(caps) {
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
}

impl Pipeline {
    /// Copies the batch's frames, as the source sent them, to the source's tx captures.
    #[cold]
    fn capture_tx(&self, src: &Port) {
        let ts = capture::now_ns();
        src.shared.captures.each(DIR_TX, |c| {
            let mut w = c.batch(DIR_TX, ts, self.held.len());
            for h in &self.held {
                let frags = &self.frags[h.first as usize..(h.first + h.count) as usize];
                // SAFETY: the batch's fragments stay readable until the batch is done.
                unsafe { w.frame(h.len, frags.iter().map(|f| (f.ptr, f.len as usize))) };
            }
        });
    }

    /// Copies the frames of lists `a` and `b` (in batch order), as the switch hands them to
    /// `dst`, to the destination's rx captures.
    #[cold]
    fn capture_rx(&self, dst: &Port, a: u16, b: u16) {
        let ts = capture::now_ns();
        let frames = count_lists(&self.next, a, b) as usize;
        dst.shared.captures.each(DIR_RX, |c| {
            let mut w = c.batch(DIR_RX, ts, frames);
            let (mut a, mut b) = (a, b);
            while a != NIL || b != NIL {
                let h = &self.held[take_next(&self.next, &mut a, &mut b) as usize];
                let frags = &self.frags[h.first as usize..(h.first + h.count) as usize];
                // SAFETY: as in capture_tx.
                unsafe { w.frame(h.len, frags.iter().map(|f| (f.ptr, f.len as usize))) };
            }
        });
    }

    /// Hands the frames of lists `a` and `b` to a kind that takes them from any thread, in one
    /// call for the batch; frames with work beyond `caps` are finished first. What the sink
    /// declined is left in `a`, `b` and the segments from `seg_next` on, for the ring.
    fn deliver_direct(
        &mut self,
        src: &Port,
        dst: &Port,
        sink: &dyn DirectSink,
        caps: Caps,
        flow: u32,
        lists: (&mut u16, &mut u16),
    ) -> usize {
        let mut out = DirectBatch {
            pipe: self,
            a: *lists.0,
            b: *lists.1,
            before: (NIL, NIL),
            caps,
            seg_next: 0,
            last_was_seg: false,
            src_bad: 0,
            resolve_drops: 0,
        };
        let d = sink.send_batch(&mut out, flow);
        let (a, b, seg_next) = (out.a, out.b, out.seg_next);
        let (src_bad, resolve_drops) = (out.src_bad, out.resolve_drops);
        let stats = dst.stats();
        add(&stats.rx_packets, d.frames);
        add(&stats.rx_bytes, d.bytes);
        add(&stats.rx_drops, d.dropped + resolve_drops);
        add(&stats.bad_input, d.bad_input);
        note_offload_errors(src, src_bad);
        if d.declined {
            (*lists.0, *lists.1) = (a, b);
            seg_next
        } else {
            // Whatever the sink did not ask for is gone with the batch.
            let segs = (self.seg_spans.len() - seg_next.min(self.seg_spans.len())) as u64;
            add(&stats.rx_drops, segs + count_lists(&self.next, a, b));
            (*lists.0, *lists.1) = (NIL, NIL);
            self.seg_spans.len()
        }
    }
}

/// The frames of one destination's lists, as a [`DirectSink`] takes them.
struct DirectBatch<'p> {
    pipe: &'p mut Pipeline,
    a: u16,
    b: u16,
    /// The lists before the last frame was taken (for `put_back`).
    before: (u16, u16),
    caps: Caps,
    /// Next of the segments the resolver left in `pipe.seg_store`.
    seg_next: usize,
    last_was_seg: bool,
    src_bad: u64,
    resolve_drops: u64,
}

impl DirectBatch<'_> {
    /// Finishes frame `i`'s offload work in software, into `seg_store`.
    fn resolve(&mut self, i: usize) {
        let p = &mut *self.pipe;
        let (fs, fc) = (p.held[i].first, p.held[i].count);
        p.seg_store.clear();
        p.seg_spans.clear();
        let (store, spans) = (&mut p.seg_store, &mut p.seg_spans);
        let r = resolve_frags(
            &mut p.resolver,
            &mut p.pieces,
            &p.frags[fs as usize..(fs + fc) as usize],
            Offload::from_word(p.held[i].offload),
            p.shared_source,
            |seg| {
                spans.push((store.len() as u32, seg.len() as u32));
                store.extend_from_slice(seg);
            },
        );
        self.seg_next = 0;
        if r.is_err() {
            // Headers that contradict the offload request: the sender's fault.
            p.seg_spans.clear();
            self.src_bad += 1;
            self.resolve_drops += 1;
        }
    }
}

impl OutFrames for DirectBatch<'_> {
    fn next_frame(&mut self) -> Option<OutFrame<'_>> {
        loop {
            if self.seg_next < self.pipe.seg_spans.len() {
                let p = &mut *self.pipe;
                let (s, l) = p.seg_spans[self.seg_next];
                self.seg_next += 1;
                self.last_was_seg = true;
                p.iov.clear();
                p.iov.push(libc::iovec {
                    iov_base: ptr::null_mut(),
                    iov_len: 0,
                });
                p.iov.push(libc::iovec {
                    iov_base: p.seg_store[s as usize..].as_mut_ptr().cast(),
                    iov_len: l as usize,
                });
                return Some(OutFrame {
                    iov: &mut p.iov,
                    offload: Offload::default(),
                    len: l,
                });
            }
            if self.a == NIL && self.b == NIL {
                return None;
            }
            self.before = (self.a, self.b);
            let i = take_next(&self.pipe.next, &mut self.a, &mut self.b) as usize;
            let w = self.pipe.held[i].offload;
            if w != 0 && !Offload::from_word(w).fits(self.caps) {
                self.resolve(i);
                continue;
            }
            self.last_was_seg = false;
            let p = &mut *self.pipe;
            let f = p.held[i];
            let (fs, fc) = (f.first, f.count);
            p.iov.clear();
            // The sink's header goes first.
            p.iov.push(libc::iovec {
                iov_base: ptr::null_mut(),
                iov_len: 0,
            });
            for g in &p.frags[fs as usize..(fs + fc) as usize] {
                p.iov.push(libc::iovec {
                    iov_base: g.ptr as *mut libc::c_void,
                    iov_len: g.len as usize,
                });
            }
            return Some(OutFrame {
                iov: &mut p.iov,
                offload: Offload::from_word(f.offload),
                len: f.len,
            });
        }
    }

    fn put_back(&mut self) {
        if self.last_was_seg {
            self.seg_next -= 1;
        } else {
            (self.a, self.b) = self.before;
        }
    }
}

/// Empties a list of borrowed slices and keeps its allocation for the next list, whatever the
/// lifetime of its slices: the per-frame lists of pieces cost no allocation once grown.
/// (Collecting an emptied `Vec` through a map to an item of the same layout reuses its buffer;
/// a unit test holds that.)
pub(crate) fn recycle(mut list: Vec<&[u8]>) -> Vec<&'static [u8]> {
    list.clear();
    list.into_iter()
        .map(|_| -> &'static [u8] { unreachable!("the list is empty") })
        .collect()
}

/// A destination rx ring being filled, inside its critical section.
struct DstRing<'a> {
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

enum Put {
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

/// Counts and logs (once per owner) frames of `src` whose headers contradict their offload
/// request: the sender's fault.
fn note_offload_errors(src: &Port, n: u64) {
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
fn resolve_frags(
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

/// What a delivery into a ring made of its frames.
#[derive(Default)]
struct Tally {
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

/// How many frames lists `a` and `b` hold.
fn count_lists(next: &[u16], mut a: u16, mut b: u16) -> u64 {
    let mut n = 0;
    while a != NIL || b != NIL {
        take_next(next, &mut a, &mut b);
        n += 1;
    }
    n
}

/// Pops the lower-numbered head of two frame lists (they never share a frame).
#[inline(always)]
fn take_next(next: &[u16], a: &mut u16, b: &mut u16) -> u16 {
    let from_a = *b == NIL || (*a != NIL && *a < *b);
    let list = if from_a { a } else { b };
    let i = *list;
    *list = next[i as usize];
    i
}

/// Copies a frame's fragments into consecutive destination buffers of `bsize` bytes.
///
/// # Safety
/// With `rounded`, each fragment must be readable for its length rounded up to 64 bytes
/// (buffers are multiples of 64); and `dst` must hold enough buffers of `bsize` bytes for the frame.
#[inline(always)]
unsafe fn copy_frame(frags: &[Frag], dst: &[*mut u8], bsize: usize, rounded: bool) {
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

#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::recycle;

    #[test]
    fn recycle_keeps_the_allocation() {
        let mut spare: Vec<&'static [u8]> = Vec::with_capacity(512);
        let buf = spare.as_ptr();
        let data = [1u8, 2, 3];
        let mut list: Vec<&[u8]> = std::mem::take(&mut spare);
        list.extend([&data[..1], &data[1..]]);
        spare = recycle(list);
        assert!(spare.is_empty());
        assert_eq!((spare.as_ptr(), spare.capacity()), (buf, 512));
    }
}

//! The guest's receive queues: frames written by the switch straight into the guest's buffers,
//! or held in the port's rx ring while the guest has none.

use super::*;
use vale_abi::spin::Spinner;

/// The rx queue as the way out of the egress step and of the direct sink, for one pass.
pub(super) struct GuestRx<'a, 'm> {
    pub(super) vq: Virtq<'m>,
    pub(super) mem: &'m GuestMemoryMmap,
    /// A frame may span several chains (their count is in its header's `num_buffers`).
    pub(super) mrg_rxbuf: bool,
    /// Longer frames without segmentation are not the guest's to take (see [`Acked`]).
    pub(super) max_frame: usize,
    pub(super) scratch: &'a mut Scratch,
    pub(super) used: usize,
    pub(super) bad: u64,
    pub(super) why: Bad,
}

impl GuestRx<'_, '_> {
    /// A frame of one piece: what [`Egress::send`] does, without a list of pieces (the
    /// forwarding thread's direct delivery and the rx ring's egress call this for frames in
    /// one piece, nearly all of them).
    #[inline(always)]
    pub(super) fn put_one(&mut self, piece: &[u8], off: Offload) -> Result<bool, DevError> {
        if piece.len() > self.max_frame && off.gso_type == offload::GSO_NONE {
            return Err(over_mtu());
        }
        let total = HDR_LEN + piece.len();
        match self.send_in_one(off, total, |dst| {
            // SAFETY: `send_in_one` gives `dst` with room for `piece` (`total - HDR_LEN`
            // bytes) in one mapped region of guest memory; `piece` is not in guest memory
            // the guest can write at `dst` (its rx buffer).
            unsafe { copy_bytes(dst, piece.as_ptr(), piece.len()) }
        }) {
            Some(sent) => Ok(sent),
            None => self.send_chains(&[piece], off, total),
        }
    }

    /// The common case, header and frame (`total` bytes) into the next chain when it is one
    /// writable descriptor that holds them, in one region of guest memory: one translation and
    /// no lists; `copy` writes the frame's `total - HDR_LEN` bytes at the pointer it is given.
    /// Some(false) when the guest has no buffers now; None (nothing taken) when the chain is
    /// of another shape, or broken, for the general path to deal with.
    #[inline(always)]
    fn send_in_one(
        &mut self,
        off: Offload,
        total: usize,
        copy: impl FnOnce(*mut u8),
    ) -> Option<bool> {
        let vq = &mut self.vq;
        let start = vq.next_avail();
        let (head, d) = match vq.pop_one() {
            One::Empty => return Some(false),
            One::Desc(head, d) => (head, d),
            One::Other => return None,
        };
        let dst = match d {
            d if d.write && d.len as usize >= total => vq.range(self.mem, d.addr, total),
            _ => None,
        };
        let Some(dst) = dst else {
            vq.rewind(start);
            return None;
        };
        if off == Offload::default() {
            // A frame without offload work, nearly all: a constant header, in two stores.
            // SAFETY: `total` bytes at `dst` lie in one mapped region of guest memory (checked
            // by `Virtq::range`), which `self.mem` keeps mapped: the header, then the frame.
            unsafe {
                std::ptr::write_unaligned(dst as *mut u64, 0);
                std::ptr::write_unaligned(dst.add(8) as *mut u32, (1u32 << 16).to_le());
            }
        } else {
            let hdr = rx_header(off, 1);
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(hdr.as_ptr(), dst, HDR_LEN) };
        }
        // SAFETY: as above, `HDR_LEN <= total`.
        copy(unsafe { dst.add(HDR_LEN) });
        vq.push_used(head, total as u32);
        self.used += 1;
        Some(true)
    }

    /// Any frame into any chains (the general path of [`Egress::send`]).
    #[inline(never)]
    fn send_chains(
        &mut self,
        pieces: &[&[u8]],
        off: Offload,
        total: usize,
    ) -> Result<bool, DevError> {
        let flen = total - HDR_LEN;
        let vq = &mut self.vq;
        let start = vq.next_avail();
        let s = &mut *self.scratch;
        s.chains.clear();
        s.descs.clear();
        // Gather chains until the frame fits: one without merged buffers, as many as needed
        // (never more than the queue holds) with them.
        let mut room = 0usize;
        let mut fail = None;
        while room < total {
            if s.chains.len() >= vq.size() as usize {
                fail = Some(Bad::TooSmall(flen));
                break;
            }
            let first = s.descs.len();
            let head = match vq.pop(&mut s.descs) {
                Popped::Empty => {
                    // Too few buffers now: the frame waits, and the chains stay the guest's.
                    vq.rewind(start);
                    return Ok(false);
                }
                Popped::Stuck(e) => {
                    vq.rewind(start);
                    self.bad += 1;
                    self.why = Bad::Queue(e);
                    return Ok(false);
                }
                Popped::Bad(head, e) => {
                    s.descs.truncate(first);
                    s.chains.push((head, 0));
                    fail = Some(Bad::Queue(e));
                    break;
                }
                Popped::Chain(head) => head,
            };
            s.chains.push((head, s.descs.len() - first));
            if s.descs[first..].iter().any(|d| !d.write) {
                fail = Some(Bad::Direction);
                break;
            }
            room += s.descs[first..]
                .iter()
                .map(|d| d.len as usize)
                .sum::<usize>();
            if !self.mrg_rxbuf && room < total {
                fail = Some(Bad::TooSmall(flen));
                break;
            }
        }
        let r = match fail {
            Some(b) => Err(b),
            None => copy_to_guest(
                self.mem,
                &s.descs,
                &rx_header(off, s.chains.len() as u16),
                pieces,
            ),
        };
        // Every chain taken goes back used: with the bytes written into it, or empty.
        let mut left = if r.is_ok() { total } else { 0 };
        let mut d = 0;
        for &(head, n) in &s.chains {
            let room: usize = s.descs[d..d + n].iter().map(|x| x.len as usize).sum();
            d += n;
            let written = room.min(left);
            left -= written;
            vq.push_used(head, written as u32);
            self.used += 1;
        }
        match r {
            Ok(()) => Ok(true),
            Err(b) => {
                self.bad += 1;
                self.why = b;
                Err(DevError::Frame(io::Error::from_raw_os_error(
                    libc::EMSGSIZE,
                )))
            }
        }
    }
}

/// A frame over the guest's MTU: a drop of the port's, the guest did nothing wrong.
fn over_mtu() -> DevError {
    DevError::Frame(io::Error::from_raw_os_error(libc::EMSGSIZE))
}

impl Egress for GuestRx<'_, '_> {
    #[inline]
    fn send(&mut self, pieces: &[&[u8]], off: Offload) -> Result<bool, DevError> {
        if let [piece] = pieces {
            return self.put_one(piece, off);
        }
        let flen: usize = pieces.iter().map(|p| p.len()).sum();
        if flen > self.max_frame && off.gso_type == offload::GSO_NONE {
            return Err(over_mtu());
        }
        let total = HDR_LEN + flen;
        let copied = self.send_in_one(off, total, |mut at| {
            for p in pieces {
                // SAFETY: `send_in_one` gives room for the pieces together (`total -
                // HDR_LEN` bytes) in one mapped region of guest memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(p.as_ptr(), at, p.len());
                    at = at.add(p.len());
                }
            }
        });
        match copied {
            Some(sent) => Ok(sent),
            None => self.send_chains(pieces, off, total),
        }
    }

    #[inline(always)]
    fn send_one(&mut self, piece: &[u8], off: Offload) -> Result<bool, DevError> {
        self.put_one(piece, off)
    }

    fn flush(&mut self) -> Result<(), DevError> {
        // The caller interrupts the guest (it holds the queue's call eventfd).
        if self.used != 0 {
            self.vq.publish_used();
        }
        self.used = 0;
        Ok(())
    }
}

/// The virtio-net header of a frame toward the guest: its offload fields and the number of
/// chains it spans.
pub(super) fn rx_header(off: Offload, num_buffers: u16) -> [u8; HDR_LEN] {
    let mut hdr = [0u8; HDR_LEN];
    hdr[..offload::VNET_HDR_LEN].copy_from_slice(&off.to_virtio());
    hdr[offload::VNET_HDR_LEN..].copy_from_slice(&num_buffers.to_le_bytes());
    hdr
}

/// Writes header and frame, in order, into the writable descriptors `descs` (which hold at
/// least that many bytes).
pub(super) fn copy_to_guest(
    mem: &GuestMemoryMmap,
    descs: &[Desc],
    hdr: &[u8],
    pieces: &[&[u8]],
) -> Result<(), Bad> {
    let mut srcs = std::iter::once(hdr).chain(pieces.iter().copied());
    let mut src: &[u8] = srcs.next().unwrap_or(&[]);
    for d in descs {
        let (mut addr, mut room) = (d.addr, d.len as usize);
        while room != 0 {
            while src.is_empty() {
                match srcs.next() {
                    Some(p) => src = p,
                    None => return Ok(()),
                }
            }
            let n = room.min(src.len());
            if !write_guest(mem, &src[..n], addr) {
                return Err(Bad::Memory);
            }
            addr = addr.checked_add(n as u64).ok_or(Bad::Memory)?;
            src = &src[n..];
            room -= n;
        }
    }
    // The caller gathered room for the whole frame.
    Ok(())
}

impl Net {
    /// The pair whose receive queue takes frames of `flow` (see [`pair_of`]).
    pub(super) fn rx_pair(&self, flow: u32) -> usize {
        pair_of(flow, self.0.enabled.load(Relaxed))
    }

    /// A forwarding thread's batch for the guest, straight into its rx buffers (of the queue
    /// of `flow`). Declines the rest when the guest has no buffers there now: those frames
    /// wait in the port's rx ring, and pair 0's worker sends them once the guest adds buffers
    /// (it kicks).
    pub(super) fn deliver(&self, frames: &mut dyn OutFrames, flow: u32) -> Delivered {
        let mut d = Delivered::default();
        if self.shrank() {
            while frames.next_frame().is_some() {
                d.dropped += 1;
            }
            return d;
        }
        let p = self.rx_pair(flow);
        let Some([vring, _]) = self.0.pairs[p].queues.get() else {
            // No queues yet: the ring keeps the frames for the guest.
            d.declined = true;
            return d;
        };
        let ready = {
            let st = vring.get_ref();
            st.is_enabled() && st.get_queue().ready()
        };
        if !ready {
            if p != 0 && self.0.enabled.fetch_and(!(1 << p), Relaxed) & 1 << p != 0 {
                // The guest gave this pair up (fewer CPUs, `ethtool -L`): flows go to the
                // pairs it still uses from the next batch on.
                self.describe();
            }
            d.declined = true;
            return d;
        }
        let mem = self.0.mem.memory();
        let acked = self.acked_now();
        let pass = self.rx_pass(p, &mut vring.get_mut(), &mem, &acked, |out| {
            let mut pieces: Vec<&[u8]> = std::mem::take(&mut out.scratch.pieces);
            while let Some(f) = frames.next_frame() {
                let len = f.len as u64;
                let sent = match f.iov[1..] {
                    // The common case, a frame in one piece, without a list.
                    [v] => {
                        // SAFETY: the pipeline's iovecs point at live frame pieces of their
                        // length.
                        let piece = unsafe {
                            std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                        };
                        out.put_one(piece, f.offload)
                    }
                    _ => {
                        pieces.clear();
                        // SAFETY: as above.
                        pieces.extend(f.iov[1..].iter().map(|v| unsafe {
                            std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                        }));
                        out.send(&pieces, f.offload)
                    }
                };
                if !d.count(frames, len, &sent) {
                    break;
                }
            }
            out.scratch.pieces = crate::forward::recycle(pieces);
        });
        match pass {
            Some(((), bad, why)) => {
                d.bad_input = bad;
                if bad != 0 {
                    self.report(&why);
                }
            }
            None => {
                self.report(&Bad::Rings);
                d.declined = true;
            }
        }
        // A fault in the guest's memory during the pass was mended with zeros.
        self.shrank();
        d
    }

    /// One pass over the receive queue of pair `p` (locked in `st`): `f` sends through a
    /// [`GuestRx`]; then the used chains are published and the guest interrupted if it asks
    /// to be, and the queue gets its new position. What `f` returned, and the bad chains met
    /// with the last reason; None when the queue's rings are not in guest memory.
    pub(super) fn rx_pass<R>(
        &self,
        p: usize,
        st: &mut std::sync::MutexGuard<'_, VringState<Mem>>,
        mem: &GuestMemoryMmap,
        acked: &Acked,
        f: impl FnOnce(&mut GuestRx) -> R,
    ) -> Option<(R, u64, Bad)> {
        let vq = Virtq::new(st.get_queue(), mem)?;
        self.note_took_up(rxq(p), &vq);
        let mut scratch = lock(&self.0.pairs[p].scratch);
        let mut out = GuestRx {
            vq,
            mem,
            mrg_rxbuf: acked.mrg_rxbuf,
            max_frame: acked.max_frame,
            scratch: &mut scratch,
            used: 0,
            bad: 0,
            why: Bad::None,
        };
        let r = f(&mut out);
        // Chains returned for dropped frames are published too.
        let _ = out.flush();
        let mut vq = out.vq;
        if vq.needs_interrupt() {
            self.interrupt(st, rxq(p));
        }
        vq.finish(st.get_queue_mut());
        Some((r, out.bad, out.why))
    }

    /// Pair `p`'s worker: its transmit queue (and for pair 0 the port's rx ring toward the
    /// guest's receive queue 0) until nothing moves; then the guest's notifications are asked
    /// for again: on the transmit queue always, on receive queue 0 only while frames wait
    /// for buffers.
    pub(super) fn pump(&self, p: usize, [rx, tx]: &[Vring; 2]) {
        if self.shrank() {
            return;
        }
        let pair = &self.0.pairs[p];
        let mut steps = lock(&pair.steps);
        let mem = self.0.mem.memory();
        let busy_poll = steps.busy_poll;
        let rx = (p == 0).then_some(rx);
        self.note_enabled(p, tx);
        // Kick moderation (see [`Pace`]): the interval (none without event indices), and the
        // chains taken so far.
        let nap_ns = match self.acked_now().event_idx {
            true => self.0.shared.moderation_ns.load(Relaxed).min(NAP_MAX_NS),
            false => 0,
        };
        let mut took = 0usize;
        let mut napping;
        loop {
            notify(tx, false);
            if let Some(rx) = rx {
                notify(rx, false);
            }
            let mut rx_blocked = false;
            let mut tx_stuck;
            // With busy-polling, a dry guest is looked at again until the interval passes
            // since the last frame, before its notifications are turned on and the thread
            // sleeps (a kick and a wake-up less per burst, for a core kept busy).
            // On a crowded CPU the spin gives way as valed's workers do ([`Spinner`]): it
            // yields between looks, and sleeps on the notifications while others keep the CPU.
            let mut dry_since: Option<std::time::Instant> = None;
            let mut spinner = SPINNER.get();
            loop {
                // What the guest acked and the MTU its front end set, read at each pass: a
                // NET_SET_MTU that comes while this worker is busy holds from its next pass,
                // and is answered once this pump is over (`Net::set_mtu`).
                let acked = self.acked_now();
                let moved_in;
                (moved_in, tx_stuck) = self.guest_tx(p, &mut steps, tx, &mem, &acked);
                took += moved_in;
                let mut moved_out = 0;
                if let Some(rx) = rx {
                    (moved_out, rx_blocked) = self.guest_rx(&mut steps, rx, &mem, &acked);
                }
                if moved_in + moved_out != 0 {
                    dry_since = None;
                    spinner.worked();
                    continue;
                }
                let since = *dry_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= busy_poll || !spinner.pause() {
                    break;
                }
            }
            SPINNER.set(spinner);
            // After a burst, with moderation, the guest is asked to kick only after the
            // chains of an interval, and the backstop comes back if it sends fewer (see
            // [`Pace`]).
            let streaming = nap_ns != 0 && took >= NAP_MIN && !tx_stuck;
            let kick_at = match streaming {
                true => {
                    let size = tx.get_ref().get_queue().size();
                    pair.pace.chains(took, self.now_ns(), nap_ns, size)
                }
                false => None,
            };
            napping = kick_at.is_some();
            // A chain the guest made available meanwhile is served now, not left for a
            // notification that will not come. An avail index that cannot be right waits
            // for the guest's next kick (looking again at once would spin for as long as
            // the guest leaves it so); memory the front end shrank ends the connection.
            let more_tx = match kick_at {
                Some(k) => kick_after(tx, &mem, k),
                None => notify(tx, true) && !tx_stuck,
            };
            let more_rx = rx_blocked && rx.is_some_and(|rx| notify(rx, true));
            if self.shrank() || (!more_tx && !more_rx) {
                break;
            }
        }
        // The pair's timer: the deadline of deferred interrupts toward other ports if there
        // is one; else, with moderation, kick moderation's backstop (see [`Pace`]). Without
        // moderation nothing here reads the clock.
        if let Some(ns) = steps.fire_due() {
            // At least 1 µs: a moderation deadline due now is served by the next event anyway.
            epoll::arm_timer(&pair.timer, ns.max(1000));
            pair.pace.timer_taken();
        } else {
            match pair.pace.backstop(napping, took, nap_ns) {
                Backstop::Keep => {}
                Backstop::Every(ns) => epoll::arm_periodic(&pair.timer, ns),
                Backstop::Stop => epoll::disarm_timer(&pair.timer),
            }
        }
        if nap_ns != 0 {
            pair.pace.slept.store(self.now_ns(), Relaxed);
        }
    }

    /// What waits in the port's rx ring, into receive queue 0 from a forwarding thread
    /// that is about to deliver (see [`DirectSink::drain`]), when pair 0's worker is not
    /// at it itself: its steps are only tried, never waited for (the worker may be
    /// delivering to the caller's port, with the caller's steps wanted).
    pub(super) fn drain(&self) {
        if self.shrank() {
            return;
        }
        let Some([rx, _]) = self.0.pairs[0].queues.get() else {
            return;
        };
        let Ok(mut steps) = self.0.pairs[0].steps.try_lock() else {
            return;
        };
        let mem = self.0.mem.memory();
        let acked = self.acked_now();
        // As pair 0's worker does: while frames wait for buffers, the guest's notifications
        // are asked for from the position reached (the guest kicks only past it), and
        // buffers it added meanwhile are served at once; a few rounds at most.
        for _ in 0..4 {
            let (_, blocked) = self.guest_rx(&mut steps, rx, &mem, &acked);
            if !blocked || !notify(rx, true) {
                break;
            }
        }
    }

    /// Guest receive: what the switch delivered to the port's rx ring, into receive queue 0.
    /// Frames moved, and whether frames wait for the guest's buffers.
    pub(super) fn guest_rx(
        &self,
        steps: &mut Steps,
        vring: &Vring,
        mem: &GuestMemoryMmap,
        acked: &Acked,
    ) -> (usize, bool) {
        let mut st = vring.get_mut();
        if !st.is_enabled() || !st.get_queue().ready() {
            return (0, false);
        }
        let pass = self.rx_pass(0, &mut st, mem, acked, |out| {
            steps.egress(out, BURST, false)
        });
        let Some((done, bad, why)) = pass else {
            self.bad(steps, 1, &Bad::Rings);
            return (0, false);
        };
        self.bad(steps, bad, &why);
        if done.blocked {
            // The guest has no buffers: its next kick on the rx queue brings us back.
            return (0, true);
        }
        (done.moved, false)
    }
}

/// Kick moderation, the guest's side of the port's `moderation` knob (the CSB paper's
/// interrupt moderation, turned toward valed). A guest that sends in small bursts kicks once
/// a burst, and each kick wakes the pair's worker, which costs more than the burst's frames
/// (docs/benchmarks.md, "Kick moderation": on the 2-vCPU AMD EPYC VM, 8-9 µs of the woken
/// thread's CPU for an eventfd kick, 22 µs for a timer, 7 µs to arm one). With the event
/// index (EVENT_IDX) and `moderation` M set, after a wake-up whose passes took [`NAP_MIN`]
/// chains or more, the worker asks for the guest's next kick only once it has posted as many
/// chains as came in M at the rate just seen (the used ring's avail event set that far
/// ahead; at most [`NAP_MOST`]): about one wake-up every M while the stream lasts. A stream
/// faster than [`NAP_FAST_PPS`] is not moderated: its wake-ups take as many on their own. A
/// stream that stops short of the kick leaves a few chains waiting: a periodic timer of
/// [`BACKSTOP`] intervals, armed once when the moderation begins, takes them. The first wake-up
/// that takes between 1 and [`NAP_MIN`] - 1 chains, or a round of the backstop that follows no
/// kick since the last and takes fewer than [`NAP_MIN`] (the stream over, or a request and its
/// answer), asks for the next kick at once and stops the timer (as do [`CALM`] wake-ups in a
/// row of a stream too fast to moderate); a wake-up that takes nothing (another event of the
/// same epoll round took it all) and a round that follows kicks (the stream goes on) change
/// nothing: the timer is armed and stopped once a stream, not at every turn of a wake-up (7 µs
/// each here). So an idle guest costs nothing and a ping-pong no time. Without event indices a
/// guest can only be told to kick or not, and the timer alone, dearer than the kicks it saves,
/// would have to bring the worker back: no moderation. A receive queue waiting for buffers
/// keeps its kick.
#[derive(Default)]
pub(super) struct Pace {
    /// When the worker last went to sleep (nanoseconds since the connection's epoch).
    slept: AtomicU64,
    /// The pair's timer is the backstop's.
    armed: AtomicBool,
    /// The backstop fired since the worker last looked (set by the timer's event).
    fired: AtomicBool,
    /// A moderated kick woke the worker since the backstop's last round.
    kicked: AtomicBool,
    /// Wake-ups in a row that took chains without moderation (a fast stream).
    calm: std::sync::atomic::AtomicU32,
}

/// What the pair's timer does after a wake-up (see [`Pace::backstop`]).
#[derive(Debug, PartialEq)]
pub(super) enum Backstop {
    /// As it is.
    Keep,
    /// Armed, periodic, every so many nanoseconds.
    Every(u64),
    /// Disarmed.
    Stop,
}

impl Pace {
    /// The chains the guest may post before its next kick: an interval of `nap_ns` at the
    /// rate of the `took` chains that came since the worker last slept. None (no
    /// moderation) at rates above [`NAP_FAST_PPS`], whatever the interval.
    /// `size`: the transmit queue's.
    fn chains(&self, took: usize, now: u64, nap_ns: u64, size: u16) -> Option<u16> {
        let since = now.saturating_sub(self.slept.load(Relaxed)).max(1) as u128;
        if took as u128 * 1_000_000_000 > NAP_FAST_PPS as u128 * since {
            return None;
        }
        let k = took as u128 * nap_ns as u128 / since;
        let most = (size / 4).clamp(1, NAP_MOST);
        Some((k.min(most as u128) as u16).max(1))
    }

    /// The pair's timer went off (its event, before the worker's pass).
    pub(super) fn timer_fired(&self) {
        self.fired.store(true, Relaxed);
    }

    /// Deferred interrupts toward other ports took the pair's timer: the backstop is no
    /// longer armed (the next moderated wake-up arms it again).
    fn timer_taken(&self) {
        self.armed.store(false, Relaxed);
    }

    /// The timer as kick moderation's backstop, after a wake-up that `took` chains and asked
    /// for a moderated kick (`napping`) or not; `nap_ns`: the interval, 0 without moderation.
    fn backstop(&self, napping: bool, took: usize, nap_ns: u64) -> Backstop {
        let fired = self.fired.swap(false, Relaxed);
        if nap_ns == 0 {
            return match self.armed.swap(false, Relaxed) {
                true => Backstop::Stop,
                false => Backstop::Keep,
            };
        }
        let calm = match (napping, took) {
            (true, _) => 0,
            (false, 0) => self.calm.load(Relaxed),
            (false, _) => self.calm.load(Relaxed).saturating_add(1),
        };
        self.calm.store(calm, Relaxed);
        let kicked = match fired {
            true => self.kicked.swap(false, Relaxed),
            false => {
                if napping {
                    self.kicked.store(true, Relaxed);
                }
                false
            }
        };
        if !self.armed.load(Relaxed) {
            if !napping {
                return Backstop::Keep;
            }
            self.armed.store(true, Relaxed);
            return Backstop::Every(BACKSTOP * nap_ns);
        }
        let over = match fired {
            // A round that follows no kick: the stream stopped short, or slowed below NAP_MIN.
            true => !kicked && took < NAP_MIN,
            false => (1..NAP_MIN).contains(&took),
        };
        if over || calm >= CALM {
            self.armed.store(false, Relaxed);
            return Backstop::Stop;
        }
        Backstop::Keep
    }
}

/// Chains a wake-up takes before kick moderation starts.
pub(super) const NAP_MIN: usize = 8;
/// The most chains a kick waits for (and a quarter of the queue at most): a burst that a
/// receiving guest's queue of 256 buffers (QEMU's default) takes whole. At 64 (the first
/// version), 1 Mpps and up went unmoderated at 100 µs; at 256, 0.74-0.75x the cycles a frame
/// at 1 Mpps and 0.56-0.68x at 2 Mpps, and nothing more lost, with a receiver that sleeps on
/// its interrupts; 1% lost at 2 Mpps with a busy-polling one that shares a CPU with the
/// sender (none at 64); docs/benchmarks.md "VM path: a receiver on interrupts".
pub(super) const NAP_MOST: u16 = 256;
/// Chains a second above which a stream is not moderated: twice [`NAP_MOST`] in 100 µs. A
/// wake-up takes as many as the cap on its own there, and the bigger bursts cost the
/// receivers (without a limit, 2 Mpps on two vCPUs in the first version: 1.07-1.35x the
/// cycles a frame, 0.25-2.5% lost). A rate, not chains an interval: with chains an interval
/// (the first versions), a longer interval turned moderation off at lower rates (200 µs: at
/// 4 Mpps, 241 cycles a frame against 207 at 100 µs).
pub(super) const NAP_FAST_PPS: u64 = 2 * NAP_MOST as u64 * 10_000;
/// The backstop's period, in moderation intervals: the longest the last chains of a stream
/// that stopped short of the kick wait for the worker.
pub(super) const BACKSTOP: u64 = 8;
/// Wake-ups in a row without moderation (a stream too fast for it) after which the backstop
/// stops: a rate near the limit goes in and out of moderation without arming and stopping
/// the timer each time (7 µs an arming on the 2-vCPU VM).
pub(super) const CALM: u32 = 16;
/// The longest moderation interval for kicks, whatever `moderation` says of interrupts: the
/// last chains of a stream that stops short wait up to 8 of them (1.6 ms). At 200 µs, 0.5 and
/// 1 Mpps from a sender of 20-µs bursts cost valed 0.60-0.66x its cycles a frame at 100 µs on
/// the 2-vCPU VM (docs/benchmarks.md "VM path: a receiver on interrupts").
pub(super) const NAP_MAX_NS: u64 = 200_000;

thread_local! {
    /// The busy poll's state on each queue pair's thread (the library runs one per pair).
    /// Such threads share CPUs as a matter of course, so the spin yields now and then.
    static SPINNER: std::cell::Cell<Spinner> =
        const { std::cell::Cell::new(Spinner::yielding_every(vale_abi::spin::YIELD_EVERY_NS)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kick comes after an interval's chains at the rate seen, within the caps; a rate
    /// faster than NAP_FAST_PPS (twice the cap in 100 µs) is not moderated, whatever the
    /// interval.
    #[test]
    fn pace_asks_for_an_interval_of_chains() {
        let p = Pace::default();
        p.slept.store(1_000_000, Relaxed);
        // 40 chains in 100 µs, an interval of 100 µs: 40.
        assert_eq!(p.chains(40, 1_100_000, 100_000, 1024), Some(40));
        // 400 in 100 µs: the cap.
        assert_eq!(p.chains(400, 1_100_000, 100_000, 1024), Some(NAP_MOST));
        // A smaller queue: a quarter of it.
        assert_eq!(p.chains(100, 1_100_000, 100_000, 256), Some(64));
        assert_eq!(p.chains(100, 1_100_000, 100_000, 2), Some(1));
        // A slow stream: at least one.
        assert_eq!(p.chains(8, 10_000_000, 100_000, 1024), Some(1));
        // More than twice the cap in 100 µs: too fast to gain, whatever the interval.
        let fast = 2 * NAP_MOST as usize + 1;
        assert_eq!(p.chains(fast, 1_100_000, 100_000, 1024), None);
        assert_eq!(p.chains(fast, 1_100_000, 200_000, 1024), None);
        // 400 in 100 µs (4 Mpps) with an interval of 200 µs: moderated, at the cap.
        assert_eq!(p.chains(400, 1_100_000, 200_000, 1024), Some(NAP_MOST));
        // A clock that went nowhere.
        assert_eq!(p.chains(8, 0, 100_000, 1024), None);
    }

    /// The backstop is armed once a stream and stopped once: not by a wake-up that took
    /// nothing, nor by a round of its own that follows kicks; it stops at a wake-up that took
    /// a few chains, at a round that follows no kick, after CALM unmoderated wake-ups, and
    /// when moderation is turned off.
    #[test]
    fn backstop_is_armed_and_stopped_once_a_stream() {
        const M: u64 = 100_000;
        let p = Pace::default();
        let every = Backstop::Every(BACKSTOP * M);
        // Unmoderated wake-ups arm nothing.
        assert_eq!(p.backstop(false, 3, M), Backstop::Keep);
        // The stream: armed at the first moderated wake-up, then left as it is.
        assert_eq!(p.backstop(true, 40, M), every);
        assert_eq!(p.backstop(true, 40, M), Backstop::Keep);
        // Another event of the same round finds nothing.
        assert_eq!(p.backstop(false, 0, M), Backstop::Keep);
        // A round of the backstop after kicks, taking a few: the stream goes on.
        p.timer_fired();
        assert_eq!(p.backstop(false, 3, M), Backstop::Keep);
        // A round that follows no kick and takes a few: the stream is over.
        p.timer_fired();
        assert_eq!(p.backstop(false, 3, M), Backstop::Stop);
        // Armed again by the next stream; a wake-up that takes a few stops it.
        assert_eq!(p.backstop(true, 40, M), every);
        assert_eq!(p.backstop(false, 5, M), Backstop::Stop);
        // A round after the kick finds nothing; the next follows no kick but takes many: the
        // stream goes on, moderated.
        assert_eq!(p.backstop(true, 40, M), every);
        p.timer_fired();
        assert_eq!(p.backstop(false, 0, M), Backstop::Keep);
        p.timer_fired();
        assert_eq!(p.backstop(true, 30, M), Backstop::Keep);
        // A stream too fast to moderate: stopped after CALM wake-ups that took chains
        // unmoderated, those that took nothing not counted.
        for _ in 0..CALM - 1 {
            assert_eq!(p.backstop(false, 500, M), Backstop::Keep);
            assert_eq!(p.backstop(false, 0, M), Backstop::Keep);
        }
        assert_eq!(p.backstop(false, 500, M), Backstop::Stop);
        // Moderation turned off: stopped at the next wake-up, whatever it took.
        assert_eq!(p.backstop(true, 40, M), every);
        assert_eq!(p.backstop(true, 40, 0), Backstop::Stop);
        assert_eq!(p.backstop(true, 40, 0), Backstop::Keep);
    }
}

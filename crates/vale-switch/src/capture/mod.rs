//! Capture of a port's frames (`vale-ctl capture`): valed copies them into a bounded ring
//! that the reader maps ([`vale_abi::capture`]).
//!
//! The forwarding core looks at [`Captures::on`], one relaxed load, once per batch of a
//! source and once per destination of a batch; only when it is set does it take the list of
//! captures and copy. A full ring costs the frame's copy and a counted capture drop, never the
//! port's frame and never a wait: the reader's `tail` is read once per batch, never trusted.
//!
//! A capture's filter runs on the workers every port shares, so its work is bounded per user,
//! not per capture: the uid that started a capture draws the instructions its filter runs from
//! that user's [`FilterBudget`], a token bucket that fills at one instruction every
//! [`FILTER_NS_PER_INSN`] ns up to [`FILTER_BUDGET_BURST`], shared by all of that user's
//! captures on every worker. A batch takes from it what its frames could cost at most (frames
//! times the filter's length, classic BPF only jumping forward so that a run costs at most its
//! length, plus the copy the filter reads, one instruction per 64 bytes), once, and gives back
//! what it did not use; the copy and each instruction the interpreter runs are counted against
//! that allowance. A frame met when the allowance is spent is not captured and counts as a
//! budget drop (`over_budget`, apart from the ring's `drops`): the capture loses frames, never
//! the traffic. All of one user's filters together run one instruction per
//! [`FILTER_NS_PER_INSN`] ns on average, and at most [`FILTER_BUDGET_BURST`] at once, whatever
//! the number of its captures, ports and workers.
//!
//! A capture's buffer is charged to the uid that started it, with its ports' memory, against
//! `--max-port-memory-per-user` (the engine checks it before making the buffer); it is given
//! back when the capture leaves its port.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use vale_abi::capture::{
    record_size, CaptureHeader, RecordHeader, CAPTURE_MAGIC, CAPTURE_RECORDS_OFFSET,
    CAPTURE_VERSION, DIR_RX, DIR_TX, MAX_CAPTURE_BYTES, MAX_SNAPLEN,
};

mod filter;
pub use filter::{Filter, MAX_FILTER_INSNS};

/// Why a capture cannot start: the words name the value and its limit, the variant is the
/// kind valed's reply carries ([`crate::Error`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Directions other than [`DIR_TX`] and [`DIR_RX`], or none.
    #[error("bad capture direction {0}")]
    Direction(u32),
    /// A snap length out of 1 to [`MAX_SNAPLEN`].
    #[error("snap length must be from 1 to {MAX_SNAPLEN}, not {0}")]
    Snaplen(u32),
    /// A buffer larger than [`MAX_CAPTURE_BYTES`].
    #[error("capture buffer must be at most {} MiB", MAX_CAPTURE_BYTES >> 20)]
    Buffer,
    /// A filter of no instructions or more than [`MAX_FILTER_INSNS`].
    #[error("a capture filter has 1 to {MAX_FILTER_INSNS} instructions, not {0}")]
    FilterLength(usize),
    /// A filter instruction the checks refuse (see [`Filter`]).
    #[error("bad capture filter: instruction {pc}: code {code:#06x} k {k} not accepted")]
    FilterInsn { pc: usize, code: u16, k: u32 },
    /// A filter that does not end with a return (`pc`: its last instruction).
    #[error("bad capture filter: instruction {pc}: the program must end with a return")]
    FilterEnd { pc: usize },
    /// The port has [`MAX_CAPTURES_PER_PORT`] captures already.
    #[error("the port has {MAX_CAPTURES_PER_PORT} captures running, the most it may have")]
    TooMany,
    /// The buffer's memory could not be made (a system call failed).
    #[error("cannot make a capture buffer: {0}")]
    Memory(io::Error),
}

/// A bad direction, snap length, size or filter is an invalid argument; a port's captures
/// at their most a limit (ENOSPC in C); a buffer that could not be made an I/O error.
impl From<Error> for crate::Error {
    fn from(e: Error) -> crate::Error {
        let message = e.to_string();
        match e {
            Error::TooMany => crate::Error::limit(message),
            Error::Memory(_) => crate::Error::io(message),
            Error::Direction(_)
            | Error::Snaplen(_)
            | Error::Buffer
            | Error::FilterLength(_)
            | Error::FilterInsn { .. }
            | Error::FilterEnd { .. } => crate::Error::invalid(message),
        }
    }
}

/// One capture: its memfd, valed's mapping of it, and the producer's lock (several workers
/// may deliver to the same port at once).
pub struct CaptureRing {
    memfd: OwnedFd,
    base: NonNull<u8>,
    size: usize,
    records: u64,
    rec_size: usize,
    snaplen: u32,
    dirs: u32,
    /// The uid that started the capture: its buffer counts in that user's port memory.
    owner_uid: u32,
    producer: Mutex<()>,
    /// Frames the filter does not accept are not captured (nor counted); it runs on the
    /// owner's budget.
    filter: Option<(Filter, Arc<FilterBudget>)>,
    /// Ring-full drops, counted here and published to the header.
    drops: AtomicU64,
    /// Frames not captured because the owner's filter budget was spent (published too).
    over_budget: AtomicU64,
}

// SAFETY: the mapping is shared memory written only under `producer` (records, head, drops)
// or through atomics; the reader's writes are only ever read through atomics and checked.
unsafe impl Send for CaptureRing {}
unsafe impl Sync for CaptureRing {}

/// The shape of a capture buffer: `records` records of `rec_size` bytes, `size` bytes in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub records: usize,
    pub rec_size: usize,
    pub size: usize,
}

impl Geometry {
    /// The buffer of about `bytes` bytes of records of `snaplen` bytes, capturing `dirs`, or
    /// why it cannot be made.
    pub fn new(dirs: u32, snaplen: u32, bytes: u64) -> Result<Geometry, Error> {
        if dirs & (DIR_TX | DIR_RX) == 0 || dirs & !(DIR_TX | DIR_RX) != 0 {
            return Err(Error::Direction(dirs));
        }
        if snaplen == 0 || snaplen > MAX_SNAPLEN {
            return Err(Error::Snaplen(snaplen));
        }
        if bytes > MAX_CAPTURE_BYTES {
            return Err(Error::Buffer);
        }
        let rec_size = record_size(snaplen);
        let records = (bytes as usize / rec_size).max(16);
        let size = CAPTURE_RECORDS_OFFSET + records * rec_size;
        Ok(Geometry {
            records,
            rec_size,
            size,
        })
    }
}

impl CaptureRing {
    /// A ring of about `bytes` bytes of records of `snaplen` bytes (see [`Geometry::new`]),
    /// capturing `dirs`, started by `owner_uid`; its filter, if any, runs on the budget given
    /// with it.
    pub fn new(
        name: &str,
        owner_uid: u32,
        dirs: u32,
        snaplen: u32,
        bytes: u64,
        filter: Option<(Filter, Arc<FilterBudget>)>,
    ) -> Result<CaptureRing, Error> {
        let Geometry {
            records,
            rec_size,
            size,
        } = Geometry::new(dirs, snaplen, bytes)?;
        Self::map(name, size)
            .map(|(memfd, base)| {
                let r = CaptureRing {
                    memfd,
                    base,
                    size,
                    records: records as u64,
                    rec_size,
                    snaplen,
                    dirs,
                    owner_uid,
                    producer: Mutex::new(()),
                    filter,
                    drops: AtomicU64::new(0),
                    over_budget: AtomicU64::new(0),
                };
                // SAFETY: the header lies in page 0 of a fresh, zeroed mapping nobody else has.
                unsafe {
                    let h = r.header() as *const CaptureHeader as *mut CaptureHeader;
                    (*h).magic = CAPTURE_MAGIC;
                    (*h).version = CAPTURE_VERSION;
                    (*h).rec_size = rec_size as u32;
                    (*h).records = records as u32;
                    (*h).snaplen = snaplen;
                    (*h).dirs = dirs;
                }
                r
            })
            .map_err(Error::Memory)
    }

    fn map(name: &str, size: usize) -> io::Result<(OwnedFd, NonNull<u8>)> {
        crate::region::sealed_shared_memory(&format!("vale-capture:{name}"), size)
    }

    fn header(&self) -> &CaptureHeader {
        // SAFETY: page 0 of the live mapping; its shared fields are atomics.
        unsafe { &*(self.base.as_ptr() as *const CaptureHeader) }
    }

    pub fn memfd(&self) -> &OwnedFd {
        &self.memfd
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// The uid that started the capture (whose port memory its buffer counts in).
    pub fn owner_uid(&self) -> u32 {
        self.owner_uid
    }

    /// Ring-full drops.
    pub fn drops(&self) -> u64 {
        self.drops.load(Relaxed)
    }

    /// Frames not captured because the owner's filter budget was spent.
    pub fn over_budget(&self) -> u64 {
        self.over_budget.load(Relaxed)
    }

    /// Tells the reader nothing more will come.
    pub fn end(&self) {
        self.header().ended.store(1, Release);
    }

    /// Starts writing the `frames` frames of one batch in direction `dir`, at `ts_ns`
    /// (CLOCK_REALTIME, also the clock of the filter budget).
    pub fn batch(&self, dir: u32, ts_ns: u64, frames: usize) -> Writer<'_> {
        let guard = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.header();
        let head = h.head.load(Relaxed);
        // The reader's tail, read once: anything but 0..=records behind head reads as full.
        let used = head.wrapping_sub(h.tail.load(Acquire));
        let room = self.records.saturating_sub(used);
        // The most the batch's filter runs can cost (frames a full ring drops cost nothing:
        // rejected frames take no room, so any other may be copied and run), if the owner's
        // budget holds that much.
        let fuel = match &self.filter {
            Some((f, budget)) if room != 0 => {
                let one = copy_cost(self.snaplen as usize) + f.len() as u64;
                budget.take(ts_ns, frames as u64 * one)
            }
            _ => 0,
        };
        Writer {
            ring: self,
            _guard: guard,
            head,
            room,
            dropped: 0,
            fuel,
            over_budget: 0,
            dir,
            ts_ns,
        }
    }
}

impl Drop for CaptureRing {
    fn drop(&mut self) {
        self.end();
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.size);
        }
    }
}

/// Writes the records of one batch; publishes them when dropped.
pub struct Writer<'a> {
    ring: &'a CaptureRing,
    _guard: MutexGuard<'a, ()>,
    head: u64,
    room: u64,
    dropped: u64,
    /// Filter instructions the batch may still run, taken from the owner's budget; what is
    /// left goes back when the batch is done.
    fuel: u64,
    over_budget: u64,
    dir: u32,
    ts_ns: u64,
}

impl Writer<'_> {
    /// Copies one frame of `len` bytes, given as its pieces, up to the snap length.
    ///
    /// # Safety
    /// Each piece is readable for its length (its writer may change it meanwhile: the copy
    /// is only bytes for the reader).
    pub unsafe fn frame(&mut self, len: u32, pieces: impl Iterator<Item = (*const u8, usize)>) {
        if self.room == 0 {
            self.dropped += 1;
            return;
        }
        let r = self.ring;
        let mut left = (len.min(r.snaplen)) as usize;
        if r.filter.is_some() {
            // The copy the filter reads is its work too: charged first, and a frame the
            // allowance cannot pay for is not even copied.
            let copy = copy_cost(left);
            if self.fuel < copy {
                self.over_budget += 1;
                return;
            }
            self.fuel -= copy;
        }
        let idx = (self.head % r.records) as usize;
        let rec = r
            .base
            .as_ptr()
            .add(CAPTURE_RECORDS_OFFSET + idx * r.rec_size);
        let mut data = rec.add(vale_abi::capture::RECORD_HEADER);
        let cap_len = left as u32;
        for (p, n) in pieces {
            if left == 0 {
                break;
            }
            let n = n.min(left);
            ptr::copy_nonoverlapping(p, data, n);
            data = data.add(n);
            left -= n;
        }
        let cap_len = cap_len - left as u32;
        if let Some((f, _)) = &r.filter {
            // The filter sees the copy: the frame's first snaplen bytes.
            let copy = std::slice::from_raw_parts(
                rec.add(vale_abi::capture::RECORD_HEADER),
                cap_len as usize,
            );
            match f.run(copy, len, &mut self.fuel) {
                Some(true) => {}
                Some(false) => return,
                None => {
                    self.over_budget += 1;
                    return;
                }
            }
        }
        let hdr = RecordHeader {
            ts_ns: self.ts_ns,
            orig_len: len,
            cap_len,
            dir: self.dir,
            _pad: 0,
        };
        ptr::write_unaligned(rec as *mut RecordHeader, hdr);
        self.head += 1;
        self.room -= 1;
    }
}

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        let r = self.ring;
        let h = r.header();
        // Release: the records written are visible before the head that covers them.
        h.head.store(self.head, Release);
        if self.dropped != 0 {
            let d = r.drops.fetch_add(self.dropped, Relaxed) + self.dropped;
            h.drops.store(d, Relaxed);
        }
        if let Some((_, budget)) = &r.filter {
            budget.give_back(self.fuel);
            if self.over_budget != 0 {
                let d = r.over_budget.fetch_add(self.over_budget, Relaxed) + self.over_budget;
                h.over_budget.store(d, Relaxed);
            }
        }
    }
}

/// What copying `bytes` of a frame for its filter costs, in filter instructions: one per 64
/// bytes begun (a frame's copy is read by the filter, and made even when it rejects it).
pub fn copy_cost(bytes: usize) -> u64 {
    bytes.div_ceil(64) as u64
}

/// Filter instructions a user's captures may run: one every this many ns (about 15.6
/// million a second, all workers together), a small share of one CPU whatever the filters.
pub const FILTER_NS_PER_INSN: u64 = 64;

/// Most filter instructions a user's budget holds (what it may run at once after a quiet
/// spell): 16 runs of the longest filter, about 100 µs of a worker's time.
pub const FILTER_BUDGET_BURST: u64 = 16 * MAX_FILTER_INSNS as u64;

/// The filter budget of one user: a token bucket of instructions, shared by that user's
/// captures on every worker; taken once per captured batch, under a lock of its own.
pub struct FilterBudget {
    uid: u32,
    /// Credit in ns of filling ([`FILTER_NS_PER_INSN`] ns an instruction), and when it was
    /// last filled (CLOCK_REALTIME ns, the captures' clock).
    bucket: Mutex<(u64, u64)>,
}

impl FilterBudget {
    /// A full budget for `uid` at `now_ns`.
    pub fn new(uid: u32, now_ns: u64) -> FilterBudget {
        FilterBudget {
            uid,
            bucket: Mutex::new((FILTER_BUDGET_BURST * FILTER_NS_PER_INSN, now_ns)),
        }
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Takes up to `want` instructions at `now_ns`; returns how many it got.
    pub fn take(&self, now_ns: u64, want: u64) -> u64 {
        let full = FILTER_BUDGET_BURST * FILTER_NS_PER_INSN;
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        // A clock that steps back fills nothing; one that leaps forward fills it up, no more.
        let (credit, at) = *b;
        let credit = credit.saturating_add(now_ns.saturating_sub(at)).min(full);
        let got = want.min(credit / FILTER_NS_PER_INSN);
        *b = (credit - got * FILTER_NS_PER_INSN, now_ns.max(at));
        got
    }

    /// Gives back `n` instructions taken and not run.
    pub fn give_back(&self, n: u64) {
        if n == 0 {
            return;
        }
        let full = FILTER_BUDGET_BURST * FILTER_NS_PER_INSN;
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        b.0 =
            b.0.saturating_add(n.saturating_mul(FILTER_NS_PER_INSN))
                .min(full);
    }
}

/// Every user's filter budget: one per uid while that user has a capture with a filter.
#[derive(Default)]
pub struct FilterBudgets(Mutex<HashMap<u32, Weak<FilterBudget>>>);

impl FilterBudgets {
    /// The budget of `uid`, made (full) if it has none.
    pub fn of(&self, uid: u32) -> Arc<FilterBudget> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, b| b.strong_count() > 0);
        if let Some(b) = m.get(&uid).and_then(Weak::upgrade) {
            return b;
        }
        let b = Arc::new(FilterBudget::new(uid, now_ns()));
        m.insert(uid, Arc::downgrade(&b));
        b
    }
}

/// The captures of a port.
#[derive(Default)]
pub struct Captures {
    active: AtomicBool,
    list: RwLock<Vec<Arc<CaptureRing>>>,
}

/// Most captures of one port at once.
pub const MAX_CAPTURES_PER_PORT: usize = 8;

impl Captures {
    /// Whether any capture is running: the one load the forwarding core does per batch.
    #[inline]
    pub fn on(&self) -> bool {
        self.active.load(Relaxed)
    }

    pub fn add(&self, c: Arc<CaptureRing>) -> Result<(), Error> {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        if l.len() >= MAX_CAPTURES_PER_PORT {
            return Err(Error::TooMany);
        }
        l.push(c);
        self.active.store(true, Relaxed);
        Ok(())
    }

    pub fn remove(&self, c: &Arc<CaptureRing>) {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        l.retain(|x| !Arc::ptr_eq(x, c));
        self.active.store(!l.is_empty(), Relaxed);
    }

    /// The port went away: every capture ends.
    pub fn end_all(&self) {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        for c in l.drain(..) {
            c.end();
        }
        self.active.store(false, Relaxed);
    }

    /// Calls `f` with each capture of direction `dir`.
    pub fn each(&self, dir: u32, mut f: impl FnMut(&CaptureRing)) {
        let l = self.list.read().unwrap_or_else(|e| e.into_inner());
        for c in l.iter().filter(|c| c.dirs & dir != 0) {
            f(c);
        }
    }
}

/// Now, CLOCK_REALTIME in nanoseconds (once per captured batch).
pub fn now_ns() -> u64 {
    vale_abi::clock::ns(libc::CLOCK_REALTIME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vale_abi::capture::BpfInsn;

    fn i(code: u16, jt: u8, jf: u8, k: u32) -> BpfInsn {
        BpfInsn { code, jt, jf, k }
    }

    #[test]
    fn ether_type_filter_and_hostile_programs() {
        // tcpdump -d arp: ldh [12]; jeq #0x806 jt 2 jf 3; ret #262144; ret #0
        let arp = Filter::new(vec![
            i(0x28, 0, 0, 12),
            i(0x15, 0, 1, 0x806),
            i(0x06, 0, 0, 262144),
            i(0x06, 0, 0, 0),
        ])
        .unwrap();
        let mut f = [0u8; 60];
        f[12] = 0x08;
        f[13] = 0x06;
        assert!(arp.matches(&f, 60));
        f[13] = 0x00;
        assert!(!arp.matches(&f, 60));
        assert!(!arp.matches(&f[..13], 60), "a load past the end rejects");
        // Jumps out of the program, a missing return, division by 0, bad memory.
        assert!(Filter::new(vec![i(0x05, 0, 0, 5), i(0x06, 0, 0, 0)]).is_err());
        assert!(Filter::new(vec![i(0x15, 3, 0, 0), i(0x06, 0, 0, 0)]).is_err());
        assert!(Filter::new(vec![i(0x28, 0, 0, 12)]).is_err());
        assert!(Filter::new(vec![i(0x34, 0, 0, 0), i(0x06, 0, 0, 0)]).is_err());
        assert!(Filter::new(vec![i(0x02, 0, 0, 16), i(0x06, 0, 0, 0)]).is_err());
        assert!(Filter::new(vec![i(0xff, 0, 0, 0), i(0x06, 0, 0, 0)]).is_err());
        assert!(Filter::new(vec![]).is_err());
        // Division by an X of 0 at run time rejects the frame.
        let div = Filter::new(vec![i(0x3c, 0, 0, 0), i(0x16, 0, 0, 0)]).unwrap();
        assert!(!div.matches(&f, 60));
    }

    /// A port's captures at their most refuse one more as a limit (ENOSPC in C), a bad
    /// geometry or filter as an invalid argument.
    #[test]
    fn a_capture_past_the_most_of_a_port_is_a_limit() {
        let captures = Captures::default();
        let ring = || Arc::new(CaptureRing::new("test:most", 0, DIR_TX, 64, 0, None).unwrap());
        for _ in 0..MAX_CAPTURES_PER_PORT {
            captures.add(ring()).unwrap();
        }
        let e = crate::Error::from(captures.add(ring()).unwrap_err());
        assert_eq!(e.kind, crate::ErrorKind::LimitReached, "{e}");
        assert_eq!(e.kind.errno(), libc::ENOSPC);
        assert_eq!(
            e.message,
            "the port has 8 captures running, the most it may have"
        );
        captures.end_all();
        let e = crate::Error::from(Geometry::new(DIR_TX, 0, 1 << 20).unwrap_err());
        assert_eq!(e.kind, crate::ErrorKind::InvalidArgument, "{e}");
        assert_eq!(e.message, "snap length must be from 1 to 65535, not 0");
        let e = crate::Error::from(Filter::new(vec![i(0x28, 0, 0, 12)]).err().unwrap());
        assert_eq!(e.kind, crate::ErrorKind::InvalidArgument, "{e}");
        assert_eq!(
            e.message,
            "bad capture filter: instruction 0: the program must end with a return"
        );
    }

    /// `n` instructions: `ld #k` n - 1 times, then `ret #k`, all of them run.
    fn straight(n: usize, accept: bool) -> Filter {
        let mut v = vec![i(0x00, 0, 0, 7); n - 1];
        v.push(i(0x06, 0, 0, accept as u32));
        Filter::new(v).unwrap()
    }

    #[test]
    fn the_interpreter_counts_each_instruction_it_runs() {
        let f = [0u8; 60];
        let p = straight(1900, false);
        let mut fuel = 1900;
        assert_eq!(p.run(&f, 60, &mut fuel), Some(false));
        assert_eq!(fuel, 0, "every instruction was counted");
        let mut fuel = 1899;
        assert_eq!(p.run(&f, 60, &mut fuel), None, "one short: stopped");
        assert_eq!(fuel, 0);
        // A jump skips what it jumps over: ldh [12]; jeq #0x806 jt 0 jf 1; ret #1; ret #0.
        let arp = Filter::new(vec![
            i(0x28, 0, 0, 12),
            i(0x15, 0, 1, 0x806),
            i(0x06, 0, 0, 1),
            i(0x06, 0, 0, 0),
        ])
        .unwrap();
        let mut fuel = 10;
        assert_eq!(arp.run(&f, 60, &mut fuel), Some(false));
        assert_eq!(fuel, 7);
    }

    #[test]
    fn a_budget_fills_with_time_up_to_its_burst() {
        let b = FilterBudget::new(7, 1_000);
        assert_eq!(b.take(1_000, u64::MAX), FILTER_BUDGET_BURST, "starts full");
        assert_eq!(b.take(1_000, 10), 0, "then empty");
        // 64 ns later, one instruction more; a clock that steps back gives nothing.
        assert_eq!(b.take(1_000 + 10 * FILTER_NS_PER_INSN, 100), 10);
        assert_eq!(b.take(500, 100), 0);
        b.give_back(5);
        assert_eq!(b.take(1_000 + 10 * FILTER_NS_PER_INSN, 100), 5);
        // A long quiet spell fills it to the burst, no more.
        assert_eq!(b.take(u64::MAX / 2, u64::MAX), FILTER_BUDGET_BURST);
        let all = FilterBudgets::default();
        let (a, a2, c) = (all.of(1), all.of(1), all.of(2));
        assert!(Arc::ptr_eq(&a, &a2), "one budget per uid");
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!((a.uid(), c.uid()), (1, 2));
    }

    /// A capture whose filter runs out of budget drops and counts the frames it could not
    /// filter, apart from ring-full drops, and runs no more instructions than the budget held.
    #[test]
    fn a_capture_over_its_owners_budget_counts_budget_drops() {
        let budget = Arc::new(FilterBudget::new(1000, 0));
        let len = 1900;
        let ring = |accept| {
            CaptureRing::new(
                "test:x",
                1000,
                DIR_TX,
                64,
                1 << 20,
                Some((straight(len, accept), budget.clone())),
            )
            .unwrap()
        };
        let (keep, reject) = (ring(true), ring(false));
        let frame = [0u8; 60];
        let frames = 64usize;
        // Each frame costs its copy (60 bytes: 1) and the run.
        let runs = FILTER_BUDGET_BURST as usize / (len + 1);
        for r in [&keep, &reject] {
            let mut w = r.batch(DIR_TX, 0, frames);
            for _ in 0..frames {
                // SAFETY: the frame is a live local array.
                unsafe { w.frame(60, std::iter::once((frame.as_ptr(), frame.len()))) };
            }
        }
        // Both share the budget: the first batch got all the runs it held, the second none.
        let h = keep.header();
        assert_eq!(h.head.load(Relaxed) as usize, runs);
        assert_eq!(keep.over_budget() as usize, frames - runs);
        assert_eq!(h.over_budget.load(Relaxed), keep.over_budget(), "published");
        assert_eq!((keep.drops(), reject.drops()), (0, 0), "no ring-full drops");
        assert_eq!(reject.over_budget() as usize, frames);
        assert_eq!(reject.header().head.load(Relaxed), 0);
        // What was taken and not run went back: less than one run's worth.
        assert!(budget.take(0, u64::MAX) < len as u64 + 1);
        // With time the budget is back, and so are captured frames.
        let later = FILTER_BUDGET_BURST * FILTER_NS_PER_INSN;
        let mut w = keep.batch(DIR_TX, later, 1);
        // SAFETY: as above.
        unsafe { w.frame(60, std::iter::once((frame.as_ptr(), frame.len()))) };
        drop(w);
        assert_eq!(h.head.load(Relaxed) as usize, runs + 1);
    }
}

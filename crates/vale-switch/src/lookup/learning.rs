//! The learning bridge of the VALE paper (section 3.3): the default module, and the learning
//! table that the vlan and flow modules keep one of per VLAN or behind `normal`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use super::{
    check_keys, is_group, number_arg, Args, Error, FrameMeta, Lookup, SourcePort, DEST_FLOOD,
};
use crate::index::{PortIndex, MAX_PORTS};

/// Entries of one bucket: a MAC is found in, and learnt into, its home bucket only. Eight
/// 8-byte keys are one cache line.
const BUCKET: usize = 8;
const MAC_MASK: u64 = 0xffff_ffff_ffff;

#[repr(C, align(64))]
struct Bucket([AtomicU64; BUCKET]);

/// The port of a non-empty key.
#[inline(always)]
fn owner(key: u64) -> usize {
    ((key >> 48) - 1) as usize
}

/// The learning bridge of the VALE paper: source MACs are learnt into a bounded hash table,
/// entries age out, group and unknown destinations are flooded.
///
/// The table is lock-free: each entry is one atomic word holding the MAC and the port, plus an
/// atomic last-seen time, so any number of workers learn and look up at once. Entries are
/// written only when something changed (new port, or last-seen more than a second old), so a
/// steady stream costs reads only.
///
/// Port security: each port holds at most its `learn-limit` entries, and one port's learning
/// never takes a live entry of another port. A new address goes into an empty or aged entry
/// of its bucket, or, failing that (or with the port at its limit), replaces the port's own
/// oldest entry there; otherwise it is not learnt (and counted). So a port that sends from
/// random addresses churns its own entries only, and the stations of other ports stay known:
/// their unicast is never flooded to it. Entry counts change only with a successful
/// compare-and-swap of a key, so they stay exact under concurrent workers; aged entries are
/// swept once a second so that they stop counting.
pub struct LearningBridge {
    /// `mac | (port + 1) << 48`; 0 is empty.
    buckets: Box<[Bucket]>,
    seen: Box<[AtomicU32]>,
    /// Bucket count - 1.
    mask: usize,
    /// Entries each port holds, by port index.
    held: Box<[AtomicU32]>,
    /// When aged entries were last swept.
    swept_s: AtomicU32,
    /// Entries older than this many seconds are ignored and may be replaced.
    pub max_age_s: AtomicU32,
}

/// A module's learning-table arguments (`entries=N`, `age=S`), as every module that learns
/// takes them.
#[derive(Clone, Copy)]
pub(crate) struct TableArgs {
    entries: usize,
    age_s: u32,
}

impl TableArgs {
    /// From `args`; `entries` when they do not say.
    pub(crate) fn of(args: &Args, entries: usize) -> Result<TableArgs, Error> {
        Ok(TableArgs {
            entries: number_arg(args, "entries", 64..=1 << 20, entries as u64)? as usize,
            age_s: number_arg(
                args,
                "age",
                1..=86_400,
                LearningBridge::DEFAULT_AGE_S as u64,
            )? as u32,
        })
    }

    /// A learning table of this size and age.
    pub(crate) fn table(self) -> LearningBridge {
        let b = LearningBridge::new(self.entries);
        b.max_age_s.store(self.age_s, Relaxed);
        b
    }
}

impl LearningBridge {
    pub const DEFAULT_ENTRIES: usize = 8192;
    pub const DEFAULT_AGE_S: u32 = 300;
    /// Default `learn-limit` of a port: an eighth of the default table, so that no single
    /// port fills it.
    pub const DEFAULT_LEARN_LIMIT: u32 = 1024;

    /// `entries`: table size (64 to 1048576, default 8192); `age`: seconds an entry lives
    /// unrefreshed (1 to 86400, default 300).
    pub(super) fn make(args: &Args) -> Result<Box<dyn Lookup>, Error> {
        check_keys("learning", args, &["entries", "age"])?;
        Ok(Box::new(
            TableArgs::of(args, Self::DEFAULT_ENTRIES)?.table(),
        ))
    }

    pub fn new(entries: usize) -> LearningBridge {
        let n = entries.next_power_of_two().max(BUCKET) / BUCKET;
        LearningBridge {
            buckets: (0..n)
                .map(|_| Bucket(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            seen: (0..n * BUCKET).map(|_| AtomicU32::new(0)).collect(),
            mask: n - 1,
            held: (0..MAX_PORTS).map(|_| AtomicU32::new(0)).collect(),
            swept_s: AtomicU32::new(0),
            max_age_s: AtomicU32::new(Self::DEFAULT_AGE_S),
        }
    }

    #[inline(always)]
    fn home(&self, mac: u64) -> usize {
        // Fibonacci hashing: the top bits of the product are well mixed.
        (mac.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & self.mask
    }

    #[inline(always)]
    fn fresh(&self, i: usize, now_s: u32) -> bool {
        now_s.wrapping_sub(self.seen[i].load(Relaxed)) < self.max_age_s.load(Relaxed)
    }

    /// The port `mac` was last seen on, if the entry has not aged out.
    #[inline]
    pub fn find(&self, mac: u64, now_s: u32) -> Option<PortIndex> {
        let b = self.home(mac);
        let keys = &self.buckets[b].0;
        // A plain counted loop: measured faster here than an iterator over the bucket.
        let mut k = 0;
        while k < BUCKET {
            let key = keys[k].load(Relaxed);
            if key != 0 && key & MAC_MASK == mac {
                return self
                    .fresh(b * BUCKET + k, now_s)
                    .then(|| owner(key) as PortIndex);
            }
            k += 1;
        }
        None
    }

    /// Swaps entry `k` of bucket `b` from `old` to `new` and moves the counts with it. False
    /// if another worker changed the entry first (nothing is done then).
    #[inline]
    fn swap_entry(&self, b: usize, k: usize, old: u64, new: u64) -> bool {
        if self.buckets[b].0[k]
            .compare_exchange(old, new, Relaxed, Relaxed)
            .is_err()
        {
            return false;
        }
        if old != 0 {
            self.held[owner(old)].fetch_sub(1, Relaxed);
        }
        if new != 0 {
            self.held[owner(new)].fetch_add(1, Relaxed);
        }
        true
    }

    /// Records that `mac` was seen on `port`, which may hold at most `limit` entries. False
    /// if it was not learnt: the port is at its limit with none of its own entries in the
    /// MAC's bucket, or the bucket holds only other ports' live entries.
    #[inline]
    pub fn learn(&self, mac: u64, port: PortIndex, limit: u32, now_s: u32) -> bool {
        if port as usize >= self.held.len() {
            return false;
        }
        let want = mac | (port as u64 + 1) << 48;
        let b = self.home(mac);
        let keys = &self.buckets[b].0;
        // The common case first: the MAC is known. Only its own entry is looked at.
        for (k, e) in keys.iter().enumerate() {
            let key = e.load(Relaxed);
            if key & MAC_MASK != mac || key == 0 {
                continue;
            }
            let i = b * BUCKET + k;
            if key == want {
                if self.seen[i].load(Relaxed) != now_s {
                    self.seen[i].store(now_s, Relaxed);
                }
                return true;
            }
            return self.moved(b, k, key, want, limit, now_s);
        }
        self.learn_new(b, want, limit, now_s)
    }

    /// `want`'s MAC, in entry `k` of bucket `b` (holding `key`), moved to `want`'s port.
    #[cold]
    #[inline(never)]
    fn moved(&self, b: usize, k: usize, key: u64, want: u64, limit: u32, now_s: u32) -> bool {
        self.seen[b * BUCKET + k].store(now_s, Relaxed);
        // At its limit, the port may not take the entry, but the old one is wrong now: forget
        // it, so the MAC floods until learnt again.
        if self.held[owner(want)].load(Relaxed) >= limit {
            self.swap_entry(b, k, key, 0);
            return false;
        }
        self.swap_entry(b, k, key, want);
        true
    }

    /// Learns `want`, whose MAC bucket `b` does not hold: out of the hot path, which refreshes
    /// known addresses.
    #[cold]
    #[inline(never)]
    fn learn_new(&self, b: usize, want: u64, limit: u32, now_s: u32) -> bool {
        let keys = &self.buckets[b].0;
        let port = owner(want);
        // A new address. Candidates: an empty entry, an aged one (anyone's), the port's own
        // oldest.
        let (mut empty, mut stale, mut own) = (None, None, None);
        let mut own_age = 0;
        let max_age = self.max_age_s.load(Relaxed);
        for (k, e) in keys.iter().enumerate() {
            let key = e.load(Relaxed);
            if key == 0 {
                empty = empty.or(Some(k));
                continue;
            }
            let age = now_s.wrapping_sub(self.seen[b * BUCKET + k].load(Relaxed));
            if age >= max_age {
                stale = stale.or(Some((k, key)));
            }
            if owner(key) == port && (own.is_none() || age > own_age) {
                own = Some((k, key));
                own_age = age;
            }
        }
        // Under its limit, a port takes room nobody uses; at it, only its own entries.
        let victim = if self.held[port].load(Relaxed) < limit {
            empty.map(|k| (k, 0)).or(stale).or(own)
        } else {
            own
        };
        let Some((k, old)) = victim else {
            return false;
        };
        // Last-seen first: a concurrent sweep must not take the new entry for an aged one.
        self.seen[b * BUCKET + k].store(now_s, Relaxed);
        // Lost to another worker: this frame is not learnt, the next one from `mac` will be.
        self.swap_entry(b, k, old, want);
        true
    }

    /// Forgets `mac` (a control plane withdrew it). False if the table did not hold it.
    pub fn forget(&self, mac: u64) -> bool {
        let b = self.home(mac);
        for (k, e) in self.buckets[b].0.iter().enumerate() {
            let key = e.load(Relaxed);
            if key != 0 && key & MAC_MASK == mac {
                return self.swap_entry(b, k, key, 0);
            }
        }
        false
    }

    /// Once a second, whichever batch comes first sweeps aged entries.
    #[inline(always)]
    pub fn tick(&self, now_s: u32) {
        if self.swept_s.load(Relaxed) != now_s && self.swept_s.swap(now_s, Relaxed) != now_s {
            self.sweep(now_s);
        }
    }

    /// Empties aged entries, so that they stop counting against their port's limit. A race
    /// with a worker refreshing the entry may empty a live one: the next frame from that MAC
    /// learns it again.
    #[cold]
    fn sweep(&self, now_s: u32) {
        for (b, bucket) in self.buckets.iter().enumerate() {
            for (k, e) in bucket.0.iter().enumerate() {
                let key = e.load(Relaxed);
                if key != 0 && !self.fresh(b * BUCKET + k, now_s) {
                    self.swap_entry(b, k, key, 0);
                }
            }
        }
    }

    /// Number of live entries (for tests and `vale-ctl`).
    pub fn len(&self, now_s: u32) -> usize {
        self.buckets
            .iter()
            .flat_map(|b| b.0.iter())
            .enumerate()
            .filter(|(i, e)| e.load(Relaxed) != 0 && self.fresh(*i, now_s))
            .count()
    }

    pub fn is_empty(&self, now_s: u32) -> bool {
        self.len(now_s) == 0
    }
}

impl Lookup for LearningBridge {
    fn name(&self) -> &str {
        "learning"
    }

    fn lookup(&self, src: SourcePort, frames: &mut [FrameMeta], now_s: u32) -> u64 {
        self.tick(now_s);
        let mut refused = 0;
        let mut last_learnt = u64::MAX;
        // Back-to-back frames to one host are looked up once (a miss walks a whole bucket):
        // the last unicast destination and where it went, forgotten when a frame of the
        // batch teaches where that address is.
        let (mut last_dst, mut last_port) = (u64::MAX, DEST_FLOOD);
        for f in frames.iter_mut() {
            let s = f.src_mac();
            // Back-to-back frames from one host learn once.
            if s != last_learnt && !is_group(s) && f.flags & vale_abi::netmap::NS_NO_LEARN == 0 {
                if !self.learn(s, src.index, src.learn_limit, now_s) {
                    refused += 1;
                }
                last_learnt = s;
                if s == last_dst {
                    last_dst = u64::MAX;
                }
            }
            let d = f.dst_mac();
            f.dst = if is_group(d) {
                DEST_FLOOD
            } else if d == last_dst {
                last_port
            } else {
                last_dst = d;
                last_port = self.find(d, now_s).unwrap_or(DEST_FLOOD);
                last_port
            };
        }
        refused
    }

    fn port_removed(&self, port: PortIndex) {
        let tag = (port as u64 + 1) << 48;
        for (b, bucket) in self.buckets.iter().enumerate() {
            for (k, e) in bucket.0.iter().enumerate() {
                let key = e.load(Relaxed);
                if key != 0 && key & !MAC_MASK == tag {
                    self.swap_entry(b, k, key, 0);
                }
            }
        }
    }

    fn learnt(&self, port: PortIndex) -> Option<u32> {
        self.held.get(port as usize).map(|h| h.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::Dest;

    fn frame(buf: &[u8; 14]) -> FrameMeta {
        FrameMeta::new(buf.as_ptr(), 14, 14, 0)
    }

    fn eth(dst: u8, src: u8) -> [u8; 14] {
        [2, 0, 0, 0, 0, dst, 2, 0, 0, 0, 0, src, 0x88, 0xb5]
    }

    fn port(index: PortIndex) -> SourcePort {
        SourcePort {
            index,
            ring: 0,
            learn_limit: LearningBridge::DEFAULT_LEARN_LIMIT,
        }
    }

    const LIMIT: u32 = LearningBridge::DEFAULT_LEARN_LIMIT;

    #[test]
    fn learns_floods_and_ages() {
        let b = LearningBridge::new(64);
        let ab = eth(0xb, 0xa);
        let ba = eth(0xa, 0xb);
        let mut f = [frame(&ab)];
        b.lookup(port(1), &mut f, 10);
        assert_eq!(f[0].dst, DEST_FLOOD, "unknown unicast floods");
        let mut f = [frame(&ba)];
        b.lookup(port(2), &mut f, 10);
        assert_eq!(f[0].dst, 1, "a was learnt on port 1");
        let mut f = [frame(&ab)];
        b.lookup(port(1), &mut f, 11);
        assert_eq!(f[0].dst, 2);
        let mut bc = eth(0xff, 0xa);
        bc[..6].copy_from_slice(&[0xff; 6]);
        let mut f = [frame(&bc)];
        b.lookup(port(1), &mut f, 11);
        assert_eq!(f[0].dst, DEST_FLOOD);
        assert_eq!(
            b.find(0x0b00_0000_0002, 11 + LearningBridge::DEFAULT_AGE_S),
            None
        );
        b.port_removed(2);
        assert_eq!(b.find(0x0b00_0000_0002, 11), None);
    }

    #[test]
    fn a_batch_to_one_host_is_looked_up_once_and_follows_what_it_teaches() {
        let b = LearningBridge::new(64);
        // Port 1 sends to b (unknown) twice, then a frame from b itself, then to b again:
        // the last goes back where b now is (port 1, which the engine drops), not flooded.
        let ab = eth(0xb, 0xa);
        let from_b = eth(0xc, 0xb);
        let mut f = [frame(&ab), frame(&ab), frame(&from_b), frame(&ab)];
        b.lookup(port(1), &mut f, 10);
        let dsts: Vec<Dest> = f.iter().map(|x| x.dst).collect();
        assert_eq!(dsts, [DEST_FLOOD, DEST_FLOOD, DEST_FLOOD, 1]);
        // b moves to port 2; port 1's next batch to b follows it on every frame.
        let mut f = [frame(&from_b)];
        b.lookup(port(2), &mut f, 11);
        let mut f = [frame(&ab), frame(&ab), frame(&ab)];
        b.lookup(port(1), &mut f, 11);
        assert!(f.iter().all(|x| x.dst == 2));
    }

    /// xorshift64*: deterministic random addresses.
    struct Rng(u64);

    impl Rng {
        fn mac(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            // Unicast, locally administered.
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) & MAC_MASK & !1) | 2
        }
    }

    /// Entries in use, and the sum of every port's count: equal whatever happened.
    fn occupancy(b: &LearningBridge) -> (usize, u32) {
        let used = b
            .buckets
            .iter()
            .flat_map(|x| x.0.iter())
            .filter(|e| e.load(Relaxed) != 0)
            .count();
        let held = (0..MAX_PORTS as PortIndex)
            .map(|p| b.learnt(p).unwrap())
            .sum();
        (used, held)
    }

    #[test]
    fn table_is_bounded() {
        let b = LearningBridge::new(64);
        for i in 0..10_000u64 {
            b.learn(0x0200_0000_0000 | i << 8, (i % 7) as u16, LIMIT, i as u32);
        }
        assert!(b.len(10_000) <= 64);
        let (used, held) = occupancy(&b);
        assert_eq!(used as u32, held, "counts follow the entries");
        // A port alone always learns its newest address (replacing its own oldest).
        let b = LearningBridge::new(64);
        for i in 0..10_000u64 {
            let mac = 0x0200_0000_0000 | i << 8;
            assert!(b.learn(mac, 3, LIMIT, 7));
            assert_eq!(b.find(mac, 7), Some(3));
        }
        assert_eq!(b.learnt(3), Some(64));
    }

    #[test]
    fn a_port_at_its_limit_learns_nothing_more() {
        let b = LearningBridge::new(8192);
        let mut rng = Rng(0x1234_5678);
        let mut refused = 0;
        for _ in 0..100_000 {
            if !b.learn(rng.mac(), 1, 16, 5) {
                refused += 1;
            }
            assert!(b.learnt(1).unwrap() <= 16);
        }
        assert_eq!(b.learnt(1), Some(16));
        assert!(refused > 90_000, "refused {refused}");
        // Its known addresses are still refreshed, and another port is not limited by it.
        let mut rng2 = Rng(0x9abc);
        for _ in 0..100 {
            assert!(b.learn(rng2.mac(), 2, LIMIT, 5));
        }
        assert_eq!(b.learnt(2), Some(100));
        // A limit of 0: nothing is learnt.
        assert!(!b.learn(rng.mac(), 3, 0, 5));
        assert_eq!(b.learnt(3), Some(0));
    }

    /// However hard a port churns, even in a nearly full table, the live entries of the
    /// other ports stay: it takes only empty entries, then replaces its own.
    #[test]
    fn churn_never_evicts_other_ports_live_entries() {
        let b = LearningBridge::new(64);
        let mut rng = Rng(42);
        while b.learnt(2).unwrap() < 56 {
            b.learn(rng.mac(), 2, LIMIT, 100);
        }
        let quiet: Vec<u64> = b
            .buckets
            .iter()
            .flat_map(|x| x.0.iter())
            .map(|e| e.load(Relaxed))
            .filter(|&k| k != 0)
            .map(|k| k & MAC_MASK)
            .collect();
        assert_eq!(quiet.len(), 56);
        for t in 100..400 {
            for _ in 0..1000 {
                b.learn(rng.mac(), 1, LIMIT, t);
            }
            assert!(b.learnt(1).unwrap() <= 8);
        }
        for &mac in &quiet {
            assert_eq!(b.find(mac, 399), Some(2), "{mac:x} was evicted");
        }
        let (used, held) = occupancy(&b);
        assert_eq!(used as u32, held);
        // Once port 2's entries have aged, the churning port may take them.
        let t = 100 + LearningBridge::DEFAULT_AGE_S;
        for _ in 0..10_000 {
            b.learn(rng.mac(), 1, LIMIT, t);
        }
        assert!(b.learnt(1).unwrap() > 32, "{:?}", b.learnt(1));
        assert_eq!(occupancy(&b).0 as u32, occupancy(&b).1);
    }

    #[test]
    fn aged_entries_are_swept_and_stop_counting() {
        let b = LearningBridge::new(8192);
        let mut rng = Rng(7);
        for _ in 0..16 {
            assert!(b.learn(rng.mac(), 4, 16, 10));
        }
        assert!(!b.learn(rng.mac(), 4, 16, 10), "at the limit");
        // A batch a second later sweeps; nothing has aged yet.
        let ab = eth(0xb, 0xa);
        b.lookup(port(1), &mut [frame(&ab)], 11);
        assert_eq!(b.learnt(4), Some(16));
        let later = 10 + LearningBridge::DEFAULT_AGE_S;
        assert_eq!(b.lookup(port(1), &mut [frame(&ab)], later), 0);
        assert_eq!(b.learnt(4), Some(0), "aged entries still count");
        assert_eq!(b.learnt(1), Some(1));
        assert!(b.learn(rng.mac(), 4, 16, later));
    }

    #[test]
    fn station_moves_and_refusals_are_counted() {
        let b = LearningBridge::new(64);
        let a = 0x0a00_0000_0002;
        assert!(b.learn(a, 1, LIMIT, 3));
        assert!(b.learn(a, 2, LIMIT, 3));
        assert_eq!(b.find(a, 3), Some(2));
        assert_eq!((b.learnt(1), b.learnt(2)), (Some(0), Some(1)));
        // Onto a port at its limit: the stale location is forgotten, nothing learnt.
        assert!(!b.learn(a, 3, 0, 3));
        assert_eq!(b.find(a, 3), None);
        assert_eq!(b.learnt(2), Some(0));
        // The lookup says how many sources it refused.
        let src = SourcePort {
            index: 5,
            ring: 0,
            learn_limit: 1,
        };
        let (f1, f2, f3) = (eth(0xb, 0x1), eth(0xb, 0x2), eth(0xb, 0x3));
        let mut frames = [frame(&f1), frame(&f1), frame(&f2), frame(&f3)];
        assert_eq!(b.lookup(src, &mut frames, 3), 2);
        assert_eq!(b.learnt(5), Some(1));
        b.port_removed(5);
        assert_eq!(b.learnt(5), Some(0));
        assert_eq!(occupancy(&b), (0, 0));
    }
}

//! Stage 2 of the pipeline: lookup modules (mSwitch's modular lookup).
//!
//! A module sees a whole batch at once and fills in each frame's destination. The engine
//! calls nothing else to decide where a frame goes, so a new module (an L3 router, a static
//! table, a module loaded at run time) plugs in here and nowhere else.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::port::PortIndex;

/// Where a frame goes: a port index, or one of the two specials.
pub type Dest = u16;
/// Every port of the switch but the source (broadcast, multicast, unknown unicast).
pub const DEST_FLOOD: Dest = u16::MAX;
/// Nowhere: counted as a `tx_drop` of the source.
pub const DEST_DROP: Dest = u16::MAX - 1;

/// What a lookup module sees of one frame. `data` points at the first `first_len` bytes of the
/// frame (at least a 14-byte Ethernet header; the engine drops shorter frames before stage 2).
/// The bytes live in the source client's memory and may change under us: read each once.
#[derive(Clone, Copy, Debug)]
pub struct FrameMeta {
    pub data: *const u8,
    pub first_len: u32,
    /// Whole frame length, all slots of a chain together.
    pub len: u32,
    /// Flags of the frame's first slot (`NS_NO_LEARN` matters to the bridge).
    pub flags: u16,
    /// Output of the lookup.
    pub dst: Dest,
    /// The frame's offload word ([`crate::offload::Offload`]), 0 for none. The engine's, not
    /// the lookup's.
    pub offload: u64,
}

impl FrameMeta {
    #[inline(always)]
    pub fn dst_mac(&self) -> u64 {
        // SAFETY: the engine guarantees at least 14 readable bytes at `data`.
        unsafe { mac_at(self.data) }
    }

    #[inline(always)]
    pub fn src_mac(&self) -> u64 {
        // SAFETY: as above.
        unsafe { mac_at(self.data.add(6)) }
    }
}

/// Reads a MAC address as a u64 in wire order (first octet in the low byte).
///
/// # Safety
/// `p` must point at 6 readable bytes.
#[inline(always)]
unsafe fn mac_at(p: *const u8) -> u64 {
    let lo = std::ptr::read_unaligned(p as *const u32) as u64;
    let hi = std::ptr::read_unaligned(p.add(4) as *const u16) as u64;
    lo | hi << 32
}

/// The first octet's low bit: broadcast and multicast addresses.
#[inline(always)]
pub fn is_group(mac: u64) -> bool {
    mac & 1 != 0
}

pub trait Lookup: Send + Sync {
    /// The name `vale-ctl set valeX lookup NAME` selects it by.
    fn name(&self) -> &'static str;
    /// Fills `dst` of every frame of one batch from source port `src`. `now_s` is a coarse
    /// clock in seconds, read once per batch.
    fn lookup(&self, src: PortIndex, frames: &mut [FrameMeta], now_s: u32);
    /// A port left the switch: forget what points at it.
    fn forget_port(&self, _port: PortIndex) {}
}

/// The modules valed knows by name; the first is the default.
pub const MODULES: &[&str] = &["learning", "hub"];

/// Makes a lookup module by name.
pub fn by_name(name: &str) -> Result<Box<dyn Lookup>, String> {
    match name {
        "learning" => Ok(Box::new(LearningBridge::new(
            LearningBridge::DEFAULT_ENTRIES,
        ))),
        "hub" => Ok(Box::new(Hub)),
        _ => Err(format!(
            "no lookup module '{name}' (known: {})",
            MODULES.join(", ")
        )),
    }
}

/// Sends every frame everywhere: a repeater. Useful to test flooding and as the smallest
/// example of a module.
pub struct Hub;

impl Lookup for Hub {
    fn name(&self) -> &'static str {
        "hub"
    }
    fn lookup(&self, _src: PortIndex, frames: &mut [FrameMeta], _now_s: u32) {
        for f in frames {
            f.dst = DEST_FLOOD;
        }
    }
}

/// The learning bridge of the VALE paper: source MACs are learnt into a bounded hash table,
/// entries age out, group and unknown destinations are flooded.
///
/// The table is lock-free: each entry is one atomic word holding the MAC and the port, plus an
/// atomic last-seen time, so any number of workers learn and look up at once. Entries are
/// written only when something changed (new port, or last-seen more than a second old), so a
/// steady stream costs reads only.
pub struct LearningBridge {
    /// `mac | (port + 1) << 48`; 0 is empty.
    keys: Box<[AtomicU64]>,
    seen: Box<[AtomicU32]>,
    mask: usize,
    /// Entries older than this many seconds are ignored and may be replaced.
    pub max_age_s: AtomicU32,
}

/// Slots probed from a MAC's home slot.
const PROBE: usize = 4;

impl LearningBridge {
    pub const DEFAULT_ENTRIES: usize = 8192;
    pub const DEFAULT_AGE_S: u32 = 300;

    pub fn new(entries: usize) -> LearningBridge {
        let n = entries.next_power_of_two().max(PROBE);
        LearningBridge {
            keys: (0..n).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..n).map(|_| AtomicU32::new(0)).collect(),
            mask: n - 1,
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
        let h = self.home(mac);
        for k in 0..PROBE {
            let i = (h + k) & self.mask;
            let key = self.keys[i].load(Relaxed);
            if key != 0 && key & 0xffff_ffff_ffff == mac {
                return self.fresh(i, now_s).then(|| ((key >> 48) - 1) as PortIndex);
            }
        }
        None
    }

    /// Records that `mac` was seen on `port`.
    #[inline]
    pub fn learn(&self, mac: u64, port: PortIndex, now_s: u32) {
        let want = mac | (port as u64 + 1) << 48;
        let h = self.home(mac);
        // Replace, in order of preference, the MAC's own entry, an empty one, the oldest one.
        let mut victim = h;
        let mut victim_age = 0;
        for k in 0..PROBE {
            let i = (h + k) & self.mask;
            let key = self.keys[i].load(Relaxed);
            if key != 0 && key & 0xffff_ffff_ffff == mac {
                if key != want {
                    self.keys[i].store(want, Relaxed);
                }
                if self.seen[i].load(Relaxed) != now_s {
                    self.seen[i].store(now_s, Relaxed);
                }
                return;
            }
            let age = if key == 0 {
                u32::MAX
            } else {
                now_s.wrapping_sub(self.seen[i].load(Relaxed))
            };
            if k == 0 || age > victim_age {
                victim = i;
                victim_age = age;
            }
        }
        self.seen[victim].store(now_s, Relaxed);
        self.keys[victim].store(want, Relaxed);
    }

    /// Number of live entries (for tests and `vale-ctl`).
    pub fn len(&self, now_s: u32) -> usize {
        (0..=self.mask)
            .filter(|&i| self.keys[i].load(Relaxed) != 0 && self.fresh(i, now_s))
            .count()
    }

    pub fn is_empty(&self, now_s: u32) -> bool {
        self.len(now_s) == 0
    }
}

impl Lookup for LearningBridge {
    fn name(&self) -> &'static str {
        "learning"
    }

    fn lookup(&self, src: PortIndex, frames: &mut [FrameMeta], now_s: u32) {
        let mut last_learnt = u64::MAX;
        for f in frames.iter_mut() {
            let s = f.src_mac();
            // Back-to-back frames from one host learn once.
            if s != last_learnt && !is_group(s) && f.flags & vale_abi::netmap::NS_NO_LEARN == 0 {
                self.learn(s, src, now_s);
                last_learnt = s;
            }
            let d = f.dst_mac();
            f.dst = if is_group(d) {
                DEST_FLOOD
            } else {
                self.find(d, now_s).unwrap_or(DEST_FLOOD)
            };
        }
    }

    fn forget_port(&self, port: PortIndex) {
        let tag = (port as u64 + 1) << 48;
        for k in self.keys.iter() {
            let key = k.load(Relaxed);
            if key & !0xffff_ffff_ffff == tag {
                let _ = k.compare_exchange(key, 0, Relaxed, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(buf: &[u8; 14]) -> FrameMeta {
        FrameMeta {
            data: buf.as_ptr(),
            first_len: 14,
            len: 14,
            offload: 0,
            flags: 0,
            dst: DEST_DROP,
        }
    }

    fn eth(dst: u8, src: u8) -> [u8; 14] {
        [2, 0, 0, 0, 0, dst, 2, 0, 0, 0, 0, src, 0x88, 0xb5]
    }

    #[test]
    fn learns_floods_and_ages() {
        let b = LearningBridge::new(64);
        let ab = eth(0xb, 0xa);
        let ba = eth(0xa, 0xb);
        let mut f = [frame(&ab)];
        b.lookup(1, &mut f, 10);
        assert_eq!(f[0].dst, DEST_FLOOD, "unknown unicast floods");
        let mut f = [frame(&ba)];
        b.lookup(2, &mut f, 10);
        assert_eq!(f[0].dst, 1, "a was learnt on port 1");
        let mut f = [frame(&ab)];
        b.lookup(1, &mut f, 11);
        assert_eq!(f[0].dst, 2);
        let mut bc = eth(0xff, 0xa);
        bc[..6].copy_from_slice(&[0xff; 6]);
        let mut f = [frame(&bc)];
        b.lookup(1, &mut f, 11);
        assert_eq!(f[0].dst, DEST_FLOOD);
        assert_eq!(
            b.find(0x0b00_0000_0002, 11 + LearningBridge::DEFAULT_AGE_S),
            None
        );
        b.forget_port(2);
        assert_eq!(b.find(0x0b00_0000_0002, 11), None);
    }

    #[test]
    fn table_is_bounded() {
        let b = LearningBridge::new(64);
        for i in 0..10_000u64 {
            b.learn(0x0200_0000_0000 | i << 8, (i % 7) as u16, i as u32);
        }
        assert!(b.len(10_000) <= 64);
        // The newest address is always findable.
        let last = 0x0200_0000_0000 | 9_999 << 8;
        assert_eq!(b.find(last, 10_000), Some((9_999 % 7) as u16));
    }
}

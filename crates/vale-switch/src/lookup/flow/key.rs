//! The key: what a frame is matched on, in seven words, and how it is read from a frame.

use super::*;

pub(super) const WORDS: usize = 7;

/// Word 0: in-port id (bits 0-15), EtherType (16-31), VLAN (32-47: `0x1000 | VID` when
/// tagged, else 0), IP protocol (48-55), presence flags (56-63). Words 1 and 2: source and
/// destination MAC (bits 0-47, first octet lowest) and TCP/UDP source and destination port
/// (48-63). Words 3-4 and 5-6: source and destination address (IPv4 in the low 32 bits of
/// words 3 and 5; IPv6 high half first), numerically.
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct Key(pub(super) [u64; WORDS]);

/// Word by word, without a branch or a call (a derived compare calls `memcmp`).
impl PartialEq for Key {
    #[inline(always)]
    fn eq(&self, o: &Key) -> bool {
        let mut d = 0;
        for i in 0..WORDS {
            d |= self.0[i] ^ o.0[i];
        }
        d == 0
    }
}

impl Eq for Key {}

pub(super) const IN_PORT: (usize, u32, u64) = (0, 0, 0xffff);
pub(super) const DL_TYPE: (usize, u32, u64) = (0, 16, 0xffff);
pub(super) const VLAN: (usize, u32, u64) = (0, 32, 0xffff);
pub(super) const NW_PROTO: (usize, u32, u64) = (0, 48, 0xff);
/// The IPv4 or IPv6 header was there (addresses and protocol are in the key).
pub(super) const F_L3: u64 = 1 << 56;
/// The TCP/UDP ports are in the key (not a later fragment, header within the first slot).
pub(super) const F_PORTS: u64 = 1 << 57;
pub(super) const MAC: u64 = 0xffff_ffff_ffff;
pub(super) const VLAN_PRESENT: u64 = 0x1000;

impl Key {
    #[inline(always)]
    pub(super) fn and(&self, m: &Key) -> Key {
        let mut k = *self;
        for i in 0..WORDS {
            k.0[i] &= m.0[i];
        }
        k
    }

    /// Four independent 64×64→128-bit multiplies, each folded (high half XOR low half),
    /// XORed together: every input bit reaches every output bit, and the multiplies run in
    /// parallel where a chain of them would wait on each other (the chain cost ~12 ns of
    /// the ~15 ns a table probe took).
    #[inline(always)]
    pub(super) fn hash64(&self) -> u64 {
        #[inline(always)]
        fn fold(a: u64, b: u64) -> u64 {
            let p = a as u128 * b as u128;
            (p >> 64) as u64 ^ p as u64
        }
        let w = &self.0;
        fold(w[0] ^ 0xa076_1d64_78bd_642f, w[1] ^ 0xe703_7ed1_a0b4_28db)
            ^ fold(w[2] ^ 0x8ebc_6af0_9c88_c6e3, w[3] ^ 0x5899_65cc_7537_4cc3)
            ^ fold(w[4] ^ 0x1d8e_4e27_c47d_124f, w[5] ^ 0x9e37_79b9_7f4a_7c15)
            ^ fold(w[6] ^ 0xbf58_476d_1ce4_e5b9, 0x94d0_49bb_1331_11eb)
    }

    pub(super) fn set(&mut self, (w, shift, bits): (usize, u32, u64), v: u64) {
        self.0[w] = self.0[w] & !(bits << shift) | (v & bits) << shift;
    }

    pub(super) fn get(&self, (w, shift, bits): (usize, u32, u64)) -> u64 {
        self.0[w] >> shift & bits
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash64());
    }
}

/// Passes [`Key::hash64`] through: the key hashes itself once.
#[derive(Default)]
pub(super) struct Pass(u64);

impl Hasher for Pass {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("keys hash as one u64")
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub(super) type Map = HashMap<Key, u32, BuildHasherDefault<Pass>>;

/// Byte `at` of the first slot, if it holds it.
#[inline(always)]
pub(super) fn byte(f: &FrameMeta, at: usize) -> Option<u8> {
    // SAFETY: inside the first `first_len` readable bytes.
    (at < f.first_len as usize).then(|| unsafe { *f.data.add(at) })
}

#[inline(always)]
pub(super) fn be16(f: &FrameMeta, at: usize) -> Option<u16> {
    f.be16(at as u32)
}

#[inline(always)]
pub(super) fn be32(f: &FrameMeta, at: usize) -> Option<u32> {
    // SAFETY: inside the first `first_len` readable bytes.
    (at + 4 <= f.first_len as usize).then(|| unsafe {
        u32::from_be_bytes(std::ptr::read_unaligned(f.data.add(at) as *const [u8; 4]))
    })
}

#[inline(always)]
pub(super) fn be64(f: &FrameMeta, at: usize) -> Option<u64> {
    // SAFETY: inside the first `first_len` readable bytes.
    (at + 8 <= f.first_len as usize).then(|| unsafe {
        u64::from_be_bytes(std::ptr::read_unaligned(f.data.add(at) as *const [u8; 8]))
    })
}

/// The key of frame `f` from the port whose in-port id is `in_id`. Reads nothing past the
/// first slot's `first_len` bytes; whatever is cut short or malformed is left out of the key
/// (its presence flag stays clear), so rules on it do not match.
#[inline(always)]
pub(super) fn extract(f: &FrameMeta, in_id: u16) -> Key {
    let mut k = Key::default();
    k.0[1] = f.src_mac();
    k.0[2] = f.dst_mac();
    // The engine guarantees 14 bytes: the EtherType is there.
    let mut et = be16(f, 12).unwrap_or(0);
    let mut l3 = 14;
    let mut vlan = 0u64;
    if et == ETH_P_8021Q || et == ETH_P_8021AD {
        match (be16(f, 14), be16(f, 16)) {
            (Some(tci), Some(inner)) => {
                vlan = VLAN_PRESENT | (tci & 0xfff) as u64;
                et = inner;
                l3 = 18;
            }
            // A tag cut short: the frame's type is unknown.
            _ => et = 0,
        }
    }
    let mut w0 = in_id as u64 | (et as u64) << 16 | vlan << 32;
    match et {
        ETH_P_IPV4 => w0 |= ipv4(f, l3, &mut k),
        ETH_P_IPV6 => w0 |= ipv6(f, l3, &mut k),
        _ => {}
    }
    k.0[0] = w0;
    k
}

/// Fills the IPv4 fields; returns the protocol and flags for word 0.
#[inline(always)]
pub(super) fn ipv4(f: &FrameMeta, l3: usize, k: &mut Key) -> u64 {
    let (Some(b0), Some(src), Some(dst), Some(proto), Some(frag)) = (
        byte(f, l3),
        be32(f, l3 + 12),
        be32(f, l3 + 16),
        byte(f, l3 + 9),
        be16(f, l3 + 6),
    ) else {
        return 0;
    };
    let ihl = (b0 & 0xf) as usize * 4;
    if b0 >> 4 != 4 || ihl < 20 {
        return 0;
    }
    k.0[3] = src as u64;
    k.0[5] = dst as u64;
    let mut w = (proto as u64) << 48 | F_L3;
    // Later fragments carry no ports.
    if frag & 0x1fff == 0 {
        w |= ports(f, l3 + ihl, proto, k);
    }
    w
}

/// Fills the IPv6 fields, walking at most [`MAX_EXT_HEADERS`] extension headers; returns the
/// protocol (the upper layer's, or the header where the walk stopped) and flags.
#[inline(always)]
pub(super) fn ipv6(f: &FrameMeta, l3: usize, k: &mut Key) -> u64 {
    let (Some(b0), Some(nh), Some(s0), Some(s1), Some(d0), Some(d1)) = (
        byte(f, l3),
        byte(f, l3 + 6),
        be64(f, l3 + 8),
        be64(f, l3 + 16),
        be64(f, l3 + 24),
        be64(f, l3 + 32),
    ) else {
        return 0;
    };
    if b0 >> 4 != 6 {
        return 0;
    }
    k.0[3] = s0;
    k.0[4] = s1;
    k.0[5] = d0;
    k.0[6] = d1;
    let mut nh = nh;
    let mut off = l3 + 40;
    for _ in 0..MAX_EXT_HEADERS {
        let len = match nh {
            // Hop-by-hop, routing, destination options: (length + 1) x 8 bytes.
            0 | 43 | 60 => match byte(f, off + 1) {
                Some(l) => (l as usize + 1) * 8,
                None => return (nh as u64) << 48 | F_L3,
            },
            // Fragment: 8 bytes; a later fragment carries no ports.
            44 => match (byte(f, off), be16(f, off + 2)) {
                (Some(next), Some(fo)) if fo & 0xfff8 != 0 => return (next as u64) << 48 | F_L3,
                (Some(_), Some(_)) => 8,
                _ => return (nh as u64) << 48 | F_L3,
            },
            // Authentication header: (length + 2) x 4 bytes.
            51 => match byte(f, off + 1) {
                Some(l) => (l as usize + 2) * 4,
                None => return (nh as u64) << 48 | F_L3,
            },
            _ => return (nh as u64) << 48 | F_L3 | ports(f, off, nh, k),
        };
        match byte(f, off) {
            Some(next) => nh = next,
            None => return (nh as u64) << 48 | F_L3,
        }
        off += len;
    }
    (nh as u64) << 48 | F_L3
}

/// Fills the TCP/UDP ports if the header is in the first slot; returns [`F_PORTS`] then.
#[inline(always)]
pub(super) fn ports(f: &FrameMeta, l4: usize, proto: u8, k: &mut Key) -> u64 {
    if proto != 6 && proto != 17 {
        return 0;
    }
    match be32(f, l4) {
        Some(p) => {
            k.0[1] |= ((p >> 16) as u64) << 48;
            k.0[2] |= ((p & 0xffff) as u64) << 48;
            F_PORTS
        }
        None => 0,
    }
}

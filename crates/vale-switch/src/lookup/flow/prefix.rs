//! Prefix tracking: the defence of the flow classifier against many masks.
//!
//! Tuple space search costs one hash probe per distinct mask, and a rule set can be built to
//! have a thousand masks (every pair of source and destination prefix lengths: the "tuple
//! space explosion" of Open vSwitch). Most of those masks cannot match a given frame: a
//! table of rules on `nw_src=X/24` can only match if the frame's source begins with some
//! rule's `/24` prefix. So, for each address field, a path-compressed binary trie of every
//! prefix the rules use tells in one walk which prefix lengths the frame's address matches
//! (a bit per length), and the classifier probes only the tables whose lengths are among
//! them. The tables are indexed by their length on one field (the one that splits them
//! best), so a frame visits only the tables of the lengths it matches there, not all of
//! them. What is left is the part no such filter can remove: a frame that matches every
//! length of every field still probes every table (see docs/modules.md).

/// The address fields tracked, as the classifier's key holds them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Field {
    V4Src,
    V4Dst,
    V6Src,
    V6Dst,
}

pub const TRACKED: usize = 4;

impl Field {
    pub const ALL: [Field; TRACKED] = [Field::V4Src, Field::V4Dst, Field::V6Src, Field::V6Dst];

    /// The field's value (or mask) in `key` as a 128-bit number, most significant bit first:
    /// IPv4 in the low 32 bits of word 3 (source) or 5 (destination), IPv6 in words 3-4 or 5-6.
    #[inline(always)]
    pub fn of(self, key: &[u64; 7]) -> u128 {
        match self {
            Field::V4Src => ((key[3] & 0xffff_ffff) as u128) << 96,
            Field::V4Dst => ((key[5] & 0xffff_ffff) as u128) << 96,
            Field::V6Src => (key[3] as u128) << 64 | key[4] as u128,
            Field::V6Dst => (key[5] as u128) << 64 | key[6] as u128,
        }
    }

    /// The prefix length a mask has on this field, or `None` if it looks at the field's
    /// words in another way (or not at all).
    pub fn length(self, mask: &[u64; 7]) -> Option<u8> {
        let (hi, lo) = match self {
            Field::V4Src | Field::V6Src => (mask[3], mask[4]),
            Field::V4Dst | Field::V6Dst => (mask[5], mask[6]),
        };
        let v4 = matches!(self, Field::V4Src | Field::V4Dst);
        let bits: u128 = if v4 {
            if lo != 0 || hi >> 32 != 0 {
                return None;
            }
            (hi as u128) << 96
        } else {
            (hi as u128) << 64 | lo as u128
        };
        let len = bits.leading_ones();
        // A prefix: ones, then zeros only; an all-zero mask does not look at the field.
        (len > 0 && bits.checked_shl(len).unwrap_or(0) == 0).then_some(len as u8)
    }
}

/// The mask of the first `len` bits.
#[inline(always)]
fn first(len: u8) -> u128 {
    match len {
        0 => 0,
        l => !0u128 << (128 - l as u32),
    }
}

const NONE: u32 = u32::MAX;

/// A node: every prefix below it shares its first `len` bits, `bits`.
#[derive(Clone, Copy)]
struct Node {
    bits: u128,
    len: u8,
    /// Some rule's prefix is exactly this one.
    end: bool,
    child: [u32; 2],
}

/// The prefixes of one field, path-compressed: at most two nodes per distinct prefix.
#[derive(Default)]
pub struct Trie {
    nodes: Vec<Node>,
}

impl Trie {
    /// A trie of `prefixes` (value, length ≥ 1); values need not be masked.
    pub fn new(mut prefixes: Vec<(u128, u8)>) -> Trie {
        for p in prefixes.iter_mut() {
            p.0 &= first(p.1);
        }
        prefixes.sort_unstable();
        prefixes.dedup();
        let mut t = Trie { nodes: Vec::new() };
        if !prefixes.is_empty() {
            t.build(&prefixes);
        }
        t
    }

    /// Builds the subtree of `set` (sorted, non-empty, sharing the bits above its common
    /// prefix) and returns its root. Recursion depth is at most 129.
    fn build(&mut self, set: &[(u128, u8)]) -> u32 {
        let (lo, hi) = (set[0].0, set[set.len() - 1].0);
        let shortest = set.iter().map(|p| p.1).min().unwrap_or(0);
        // Sorted: the first and last values differ first where any two do.
        let len = ((lo ^ hi).leading_zeros() as u8).min(shortest);
        let at = self.nodes.len() as u32;
        self.nodes.push(Node {
            bits: lo & first(len),
            len,
            end: set.iter().any(|p| p.1 == len),
            child: [NONE; 2],
        });
        // The rest is longer than `len`: its bit `len` picks the side. Sorted, so the zeros
        // come first.
        let rest: Vec<(u128, u8)> = set.iter().copied().filter(|p| p.1 > len).collect();
        let split = rest.partition_point(|p| p.0 >> (127 - len as u32) & 1 == 0);
        for (side, part) in [(0, &rest[..split]), (1, &rest[split..])] {
            if !part.is_empty() {
                let c = self.build(part);
                self.nodes[at as usize].child[side] = c;
            }
        }
        at
    }

    /// The lengths of the prefixes `addr` begins with: bit `L - 1` for length `L`.
    #[inline]
    pub fn lengths(&self, addr: u128) -> u128 {
        let mut out = 0u128;
        let mut n = if self.nodes.is_empty() { NONE } else { 0 };
        while n != NONE {
            let node = &self.nodes[n as usize];
            if (addr ^ node.bits) & first(node.len) != 0 {
                break;
            }
            if node.end {
                out |= 1 << (node.len - 1);
            }
            if node.len == 128 {
                break;
            }
            n = node.child[(addr >> (127 - node.len as u32) & 1) as usize];
        }
        out
    }

    #[cfg(test)]
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> u128 {
        (u32::from_be_bytes(a) as u128) << 96
    }

    /// Every length the trie reports is a prefix of the address, and none is missed.
    #[test]
    fn lengths_are_exactly_the_matching_prefixes() {
        let prefixes = vec![
            (v4([10, 0, 0, 0]), 8),
            (v4([10, 1, 0, 0]), 16),
            (v4([10, 1, 2, 0]), 24),
            (v4([10, 1, 2, 3]), 32),
            (v4([10, 200, 0, 0]), 16),
            (v4([192, 168, 0, 0]), 16),
            (v4([128, 0, 0, 0]), 1),
            (v4([10, 1, 2, 99]), 32),
        ];
        let t = Trie::new(prefixes.clone());
        assert!(t.nodes() <= 2 * prefixes.len());
        let addrs = [
            [10, 1, 2, 3],
            [10, 1, 2, 4],
            [10, 1, 9, 9],
            [10, 200, 1, 1],
            [11, 0, 0, 0],
            [192, 168, 7, 7],
            [200, 0, 0, 1],
            [0, 0, 0, 0],
        ];
        for a in addrs {
            let want = prefixes
                .iter()
                .filter(|(p, l)| (v4(a) ^ p) & first(*l) == 0)
                .fold(0u128, |m, (_, l)| m | 1 << (l - 1));
            assert_eq!(t.lengths(v4(a)), want, "{a:?}");
        }
        assert_eq!(Trie::new(vec![]).lengths(v4([1, 2, 3, 4])), 0);
    }

    #[test]
    fn lengths_of_masks() {
        let mut m = [0u64; 7];
        m[3] = 0xffff_ff00;
        assert_eq!(Field::V4Src.length(&m), Some(24));
        assert_eq!(Field::V6Src.length(&m), None);
        assert_eq!(Field::V4Dst.length(&m), None);
        m[3] = 0xff00_ff00;
        assert_eq!(Field::V4Src.length(&m), None);
        m[5] = !0;
        m[6] = 0xffff_0000_0000_0000;
        assert_eq!(Field::V6Dst.length(&m), Some(80));
        m[6] = !0;
        assert_eq!(Field::V6Dst.length(&m), Some(128));
    }

    /// A v6 /128 and nested prefixes down a long chain.
    #[test]
    fn full_length_and_chains() {
        let a: u128 = 0x2001_0db8_0000_0000_0000_0000_0000_0001;
        let t = Trie::new((1..=128).map(|l| (a, l)).collect());
        assert_eq!(t.lengths(a), !0u128);
        assert_eq!(t.lengths(a ^ 1), !0u128 >> 1);
        assert_eq!(t.lengths(a ^ 1 << 127), 0);
    }
}

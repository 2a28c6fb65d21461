//! Merging received inner TCP segments into one TSO frame (receive offload in user space).
//!
//! A buffer the kernel received merged (`UDP_GRO`) holds datagrams of one UDP flow, and a
//! VTEP hashes the outer source port from the inner flow: mostly the consecutive segments of
//! one TCP connection. Those that follow each other exactly are handed to the switch as one
//! frame of up to 64 KiB with an [`Offload`] saying "TCP segments of `mss` bytes, checksum
//! pending", which a TAP or vhost-user port takes as it is (one write instead of forty) and
//! the switch segments again for ports that do not.
//!
//! Segments join only as Linux's TCP GRO lets them: Ethernet and IP headers the same (IPv4
//! without options or fragments, IPv6 without extension headers), the same ports, ack, window,
//! flags (ACK, and PSH on the last only) and options, the sequence numbers consecutive, all of
//! one size but the last. Each segment's TCP checksum (and IPv4 header checksum) is verified
//! before it joins: the merged frame's checksum is computed afresh further on, so a damaged
//! segment must not be laundered; one that fails is handed over alone, as it came.

use crate::offload::{add, sum, Offload, F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6};
use crate::wire::{be16, ETH_P_IPV4, ETH_P_IPV6, IPPROTO_TCP};

/// Most segments in one merged frame.
pub const MAX_MERGED: usize = 64;
/// Largest merged frame: an IP packet of 65535 bytes behind an Ethernet header.
pub const MAX_MERGED_LEN: usize = 14 + 65535;

const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;

/// A TCP segment that may be merged: where its headers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    pub v4: bool,
    /// Start of the TCP header, and of the payload.
    pub l4: usize,
    pub hdr_len: usize,
    pub seq: u32,
    pub payload: usize,
    pub psh: bool,
}

/// The frame being merged: its headers are those of its first segment.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub remote: usize,
    pub seg: Seg,
    /// Bytes of the frame so far, segments in it, and the sequence number the next must have.
    pub len: usize,
    pub count: usize,
    pub next_seq: u32,
    /// The last segment was shorter or had PSH: nothing more joins.
    pub closed: bool,
    /// The last segment had PSH.
    pub psh: bool,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The sum of the TCP pseudo-header of a packet whose IP header starts at 14, for `tcp_len`
/// bytes of TCP.
fn pseudo(f: &[u8], v4: bool, tcp_len: usize) -> u16 {
    let addrs = if v4 { &f[26..34] } else { &f[22..54] };
    let s = add(sum(addrs), IPPROTO_TCP as u16);
    if v4 {
        add(s, tcp_len as u16)
    } else {
        add(add(s, (tcp_len >> 16) as u16), tcp_len as u16)
    }
}

/// `f` (an inner Ethernet frame) as a segment that may be merged, its checksums verified; None
/// for anything else.
pub fn segment(f: &[u8]) -> Option<Seg> {
    if f.len() < 14 + 40 {
        return None;
    }
    let (v4, l4) = match be16(f, 12) {
        ETH_P_IPV4 => {
            // No options, not a fragment, TCP, the length the frame's (no padding), header sum.
            if f[14] != 0x45
                || be16(f, 20) & 0x3fff != 0
                || f[23] != IPPROTO_TCP
                || be16(f, 16) as usize != f.len() - 14
                || sum(&f[14..34]) != 0xffff
            {
                return None;
            }
            (true, 34)
        }
        ETH_P_IPV6 => {
            if f[14] >> 4 != 6 || f[20] != IPPROTO_TCP || be16(f, 18) as usize != f.len() - 54 {
                return None;
            }
            (false, 54)
        }
        _ => return None,
    };
    if f.len() < l4 + 20 {
        return None;
    }
    let doff = (f[l4 + 12] >> 4) as usize * 4;
    let flags = f[l4 + 13];
    // ACK alone, or with PSH: no SYN, FIN, RST, URG, ECE, CWR.
    if doff < 20 || flags & !TCP_PSH != TCP_ACK || f.len() <= l4 + doff {
        return None;
    }
    let tcp_len = f.len() - l4;
    if add(pseudo(f, v4, tcp_len), sum(&f[l4..])) != 0xffff {
        return None;
    }
    Some(Seg {
        v4,
        l4,
        hdr_len: l4 + doff,
        seq: be32(f, l4 + 4),
        payload: f.len() - l4 - doff,
        psh: flags & TCP_PSH != 0,
    })
}

impl Held {
    pub fn new(remote: usize, seg: Seg) -> Held {
        Held {
            remote,
            seg,
            len: seg.hdr_len + seg.payload,
            count: 1,
            next_seq: seg.seq.wrapping_add(seg.payload as u32),
            closed: seg.psh,
            psh: seg.psh,
        }
    }

    /// Whether segment `s` (frame `f`, from `remote`) continues the held frame, whose headers
    /// are `hdr` (its first `seg.hdr_len` bytes).
    pub fn joins(&self, hdr: &[u8], remote: usize, f: &[u8], s: &Seg) -> bool {
        let h = &self.seg;
        let l4 = h.l4;
        !self.closed
            && remote == self.remote
            && self.count < MAX_MERGED
            && s.v4 == h.v4
            && s.hdr_len == h.hdr_len
            && s.seq == self.next_seq
            && s.payload <= h.payload
            && self.len + s.payload <= MAX_MERGED_LEN
            // Ethernet; IPv4 TOS, DF, TTL, protocol, addresses (not length, id, checksum);
            // IPv6 version, class, flow label, next header, hop limit, addresses.
            && hdr[..14] == f[..14]
            && if h.v4 {
                hdr[15] == f[15] && hdr[20..24] == f[20..24] && hdr[26..34] == f[26..34]
            } else {
                hdr[14..18] == f[14..18] && hdr[20..54] == f[20..54]
            }
            // Ports, ack, data offset, window, options the same (seq and flags checked above,
            // the checksum verified).
            && hdr[l4..l4 + 4] == f[l4..l4 + 4]
            && hdr[l4 + 8..l4 + 13] == f[l4 + 8..l4 + 13]
            && hdr[l4 + 14..l4 + 16] == f[l4 + 14..l4 + 16]
            && hdr[l4 + 20..h.hdr_len] == f[l4 + 20..h.hdr_len]
    }

    /// Counts segment `s` in (its payload appended by the caller).
    pub fn add(&mut self, s: &Seg) {
        self.len += s.payload;
        self.count += 1;
        self.next_seq = self.next_seq.wrapping_add(s.payload as u32);
        self.closed = s.psh || s.payload < self.seg.payload;
        self.psh = s.psh;
    }

    /// Finishes the headers `hdr` (the first `seg.hdr_len` bytes of the frame) of a frame of
    /// several segments: lengths, IPv4 header checksum, PSH from the last segment, and the TCP
    /// checksum field holding the pseudo-header's sum, left to finish. Its offload.
    pub fn finish(&self, hdr: &mut [u8]) -> Offload {
        let l4 = self.seg.l4;
        let tcp_len = self.len - l4;
        if self.seg.v4 {
            hdr[16..18].copy_from_slice(&((self.len - 14) as u16).to_be_bytes());
            hdr[24..26].copy_from_slice(&[0, 0]);
            let c = !sum(&hdr[14..34]);
            hdr[24..26].copy_from_slice(&c.to_be_bytes());
        } else {
            hdr[18..20].copy_from_slice(&((self.len - 54) as u16).to_be_bytes());
        }
        if self.psh {
            hdr[l4 + 13] |= TCP_PSH;
        }
        let p = pseudo(hdr, self.seg.v4, tcp_len);
        hdr[l4 + 16..l4 + 18].copy_from_slice(&p.to_be_bytes());
        Offload {
            flags: F_NEEDS_CSUM,
            gso_type: if self.seg.v4 { GSO_TCPV4 } else { GSO_TCPV6 },
            gso_size: self.seg.payload as u16,
            csum_start: l4 as u16,
            csum_offset: 16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::{Resolver, GSO_NONE};

    /// A TCP/IPv4 (or IPv6) segment of `payload` bytes at `seq`, checksums right.
    fn tcp(v4: bool, seq: u32, payload: usize, flags: u8) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        let l4 = if v4 { 34 } else { 54 };
        if v4 {
            f.extend([
                8, 0, 0x45, 0, 0, 0, 0, 7, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            ]);
            let tot = (20 + 32 + payload) as u16;
            f[16..18].copy_from_slice(&tot.to_be_bytes());
            let c = !sum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
        } else {
            f.extend([0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, 6, 64]);
            f[18..20].copy_from_slice(&((32 + payload) as u16).to_be_bytes());
            f.extend([0xfd; 16]);
            f.extend([0xfe; 16]);
        }
        f.extend(1234u16.to_be_bytes());
        f.extend(5201u16.to_be_bytes());
        f.extend(seq.to_be_bytes());
        f.extend(99u32.to_be_bytes());
        f.extend([0x80, flags, 1, 0, 0, 0, 0, 0]);
        f.extend([1, 1, 8, 10, 0, 0, 0, 5, 0, 0, 0, 6]);
        f.extend((0..payload).map(|i| (seq as usize + i) as u8));
        let c = !add(pseudo(&f, v4, f.len() - l4), sum(&f[l4..]));
        f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        f
    }

    /// Merges `frames` as the port does: the merged frames and their offloads.
    fn merge(frames: &[Vec<u8>]) -> Vec<(Vec<u8>, Option<Offload>)> {
        let mut out = Vec::new();
        let mut held: Option<(Held, Vec<u8>)> = None;
        let flush = |h: Option<(Held, Vec<u8>)>, out: &mut Vec<_>| {
            if let Some((h, mut b)) = h {
                let off = (h.count > 1).then(|| h.finish(&mut b));
                out.push((b, off));
            }
        };
        for f in frames {
            let s = segment(f);
            if let (Some(s), Some((h, b))) = (s, held.as_mut()) {
                if h.joins(&b[..h.seg.hdr_len], 0, f, &s) {
                    b.extend_from_slice(&f[s.hdr_len..]);
                    h.add(&s);
                    continue;
                }
            }
            flush(held.take(), &mut out);
            match s {
                Some(s) => held = Some((Held::new(0, s), f.clone())),
                None => out.push((f.clone(), None)),
            }
        }
        flush(held.take(), &mut out);
        out
    }

    /// What the switch's segmenter makes of `frame` with `off` (the frames a port without
    /// offloads would get).
    fn resegment(frame: &[u8], off: Option<Offload>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        Resolver::new()
            .resolve(&[frame], off.unwrap_or_default(), false, |f| {
                out.push(f.to_vec())
            })
            .unwrap();
        out
    }

    #[test]
    fn consecutive_segments_merge_and_segment_back_to_the_same_bytes() {
        for v4 in [true, false] {
            let mut segs: Vec<Vec<u8>> = (0..10)
                .map(|i| tcp(v4, 1000 + i * 1400, 1400, 0x10))
                .collect();
            segs.push(tcp(v4, 1000 + 10 * 1400, 300, 0x18));
            let m = merge(&segs);
            assert_eq!(m.len(), 1, "v4 {v4}");
            let (frame, off) = &m[0];
            let off = off.unwrap();
            assert_eq!(off.gso_size, 1400);
            assert_eq!(off.gso_type, if v4 { GSO_TCPV4 } else { GSO_TCPV6 });
            assert_eq!(frame.len(), segs[0].len() + 9 * 1400 + 300);
            let back = resegment(frame, Some(off));
            assert_eq!(back.len(), segs.len());
            for (i, (b, s)) in back.iter().zip(&segs).enumerate() {
                // The IPv4 id grows by one per segment when segmented again: all else the same.
                let mut s = s.clone();
                if v4 {
                    s[18..20].copy_from_slice(&(7 + i as u16).to_be_bytes());
                    s[24..26].copy_from_slice(&[0, 0]);
                    let c = !sum(&s[14..34]);
                    s[24..26].copy_from_slice(&c.to_be_bytes());
                }
                assert_eq!(b, &s, "v4 {v4} segment {i}");
            }
        }
    }

    #[test]
    fn what_does_not_follow_is_not_merged() {
        let a = tcp(true, 0, 1400, 0x10);
        // A gap, a repeat, another flag, a larger one after a smaller, PSH closing.
        for (next, why) in [
            (tcp(true, 1401, 1400, 0x10), "gap"),
            (tcp(true, 0, 1400, 0x10), "repeat"),
            (tcp(true, 1400, 1400, 0x11), "FIN"),
            (tcp(true, 1400, 1500, 0x10), "larger"),
        ] {
            let m = merge(&[a.clone(), next]);
            assert_eq!(m.len(), 2, "{why}");
            assert!(m.iter().all(|(_, o)| o.is_none()), "{why}");
        }
        assert_eq!(
            merge(&[tcp(true, 0, 1400, 0x18), tcp(true, 1400, 1400, 0x10)]).len(),
            2
        );
        assert_eq!(
            merge(&[
                tcp(true, 0, 700, 0x10),
                tcp(true, 700, 700, 0x10),
                tcp(true, 1400, 700, 0x10)
            ])
            .len(),
            1
        );
        // Another window, ack or option value.
        for at in [34 + 14, 34 + 8, 34 + 27] {
            let mut b = tcp(true, 1400, 1400, 0x10);
            b[at] ^= 1;
            // Checksum fixed up so that only the field differs.
            b[34 + 16..34 + 18].copy_from_slice(&[0, 0]);
            let c = !add(pseudo(&b, true, b.len() - 34), sum(&b[34..]));
            b[34 + 16..34 + 18].copy_from_slice(&c.to_be_bytes());
            assert!(segment(&b).is_some());
            assert_eq!(merge(&[a.clone(), b]).len(), 2, "byte {at}");
        }
    }

    #[test]
    fn damaged_or_odd_segments_are_passed_alone() {
        let good = tcp(true, 0, 100, 0x10);
        assert!(segment(&good).is_some());
        // A payload byte flipped: the TCP checksum fails.
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 0x40;
        assert_eq!(segment(&bad), None);
        // The IPv4 header checksum wrong, options, a fragment, padding, not TCP, no payload.
        for (at, v) in [(24, 0u8), (14, 0x46), (20, 0x20), (23, 17)] {
            let mut f = good.clone();
            f[at] ^= v.max(1);
            assert_eq!(segment(&f), None, "byte {at}");
        }
        let mut padded = good.clone();
        padded.push(0);
        assert_eq!(segment(&padded), None);
        assert_eq!(segment(&tcp(true, 0, 0, 0x10)), None, "a pure ACK");
        assert_eq!(segment(&tcp(false, 0, 0, 0x10)), None);
        // Truncated everywhere: never a panic.
        for n in 0..good.len() {
            assert_eq!(segment(&good[..n]), None, "{n} bytes");
        }
        // Other frames.
        assert_eq!(segment(&[0xff; 60]), None);
        let m = merge(&[bad.clone(), good.clone(), bad]);
        assert_eq!(m.len(), 3);
        assert!(m.iter().all(|(_, o)| o.is_none()));
        let _ = GSO_NONE;
    }

    #[test]
    fn merged_frames_stay_within_64_kib_and_64_segments() {
        let segs: Vec<Vec<u8>> = (0..60).map(|i| tcp(true, i * 1448, 1448, 0x10)).collect();
        let m = merge(&segs);
        assert!(m.len() >= 2);
        assert!(m.iter().all(|(f, _)| f.len() <= MAX_MERGED_LEN));
        let small: Vec<Vec<u8>> = (0..100).map(|i| tcp(true, i * 10, 10, 0x10)).collect();
        let m = merge(&small);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0.len(), small[0].len() + 63 * 10);
    }
}

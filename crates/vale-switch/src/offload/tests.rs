//! Tests of the offload module. Frames are built here the way a TAP device hands them over,
//! and every emitted frame is checked by a verifier written independently of the code under
//! test: its own header parsing and a plain byte-pair ones'-complement sum.

use super::*;

const ACK: u8 = 0x10;
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const CWR: u8 = 0x80;
/// Start values that wrap during a 64 KiB segment, so wrapping is exercised.
const SEQ0: u32 = 0xffff_f000;
const ID0: u16 = 0xfff0;
/// TCP header with 12 bytes of options (NOP, NOP, timestamp), as Linux sends.
const TCP_HDR: usize = 32;

// ---------------------------------------------------------------------------------------
// Builder

#[derive(Clone, Copy)]
struct Spec {
    vlan: bool,
    v6: bool,
    /// IPv6 only: a hop-by-hop and a destination-options header before L4.
    ext: bool,
    udp: bool,
    payload: usize,
    /// TCP flags of the large segment.
    flags: u8,
}

impl Spec {
    fn tcp4(payload: usize) -> Spec {
        Spec {
            vlan: false,
            v6: false,
            ext: false,
            udp: false,
            payload,
            flags: ACK | PSH | FIN | CWR,
        }
    }
    fn tcp6(payload: usize) -> Spec {
        Spec {
            v6: true,
            ..Spec::tcp4(payload)
        }
    }
    fn udp4(payload: usize) -> Spec {
        Spec {
            udp: true,
            ..Spec::tcp4(payload)
        }
    }
    fn udp6(payload: usize) -> Spec {
        Spec {
            udp: true,
            ..Spec::tcp6(payload)
        }
    }
    fn vlan(self) -> Spec {
        Spec { vlan: true, ..self }
    }
    fn ext(self) -> Spec {
        Spec { ext: true, ..self }
    }
    fn l4_hdr(&self) -> usize {
        if self.udp {
            8
        } else {
            TCP_HDR
        }
    }
    fn ext_len(&self) -> usize {
        if self.ext {
            24
        } else {
            0
        }
    }
    /// The largest payload whose IP packet still fits its 16-bit length field.
    fn max(self) -> Spec {
        let ip_hdr = if self.v6 { 0 } else { 20 };
        Spec {
            payload: 65535 - ip_hdr - self.ext_len() - self.l4_hdr(),
            ..self
        }
    }
}

fn payload_byte(i: usize) -> u8 {
    (i * 7 + (i >> 8)) as u8
}

/// A frame as a TAP device gives it with TSO/USO: IP lengths covering everything, IPv4
/// header checksum valid, L4 checksum field holding only the pseudo-header sum; and its
/// virtio-net header asking for segmentation at `gso_size`.
fn build(s: Spec, gso_size: u16) -> (Vec<u8>, Offload) {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    if s.vlan {
        f.extend([0x81, 0x00, 0x00, 0x64]);
    }
    f.extend(if s.v6 { [0x86, 0xdd] } else { [0x08, 0x00] });
    let l3 = f.len();
    let proto: u8 = if s.udp { 17 } else { 6 };
    let l4_len = s.l4_hdr() + s.payload;
    if s.v6 {
        let pl = (s.ext_len() + l4_len) as u16;
        let next = if s.ext { 0 } else { proto };
        f.extend([0x60, 0, 0, 0, (pl >> 8) as u8, pl as u8, next, 64]);
        f.extend([0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend([0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        if s.ext {
            // Hop-by-hop (8 bytes, PadN) then destination options (16 bytes, PadN).
            f.extend([60, 0, 1, 4, 0, 0, 0, 0]);
            f.extend([proto, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
    } else {
        let tot = (20 + l4_len) as u16;
        f.extend([0x45, 0, (tot >> 8) as u8, tot as u8]);
        f.extend([(ID0 >> 8) as u8, ID0 as u8, 0x40, 0, 64, proto, 0, 0]);
        f.extend([10, 0, 0, 1, 10, 0, 0, 2]);
        let c = !fold16(ones(&f[l3..l3 + 20], 0));
        f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    }
    let l4 = f.len();
    if s.udp {
        f.extend([
            0x30,
            0x39,
            0x00,
            0x35,
            (l4_len >> 8) as u8,
            l4_len as u8,
            0,
            0,
        ]);
    } else {
        f.extend([0x30, 0x39, 0x00, 0x50]);
        f.extend(SEQ0.to_be_bytes());
        f.extend([
            1,
            2,
            3,
            4,
            (TCP_HDR as u8 / 4) << 4,
            s.flags,
            0xff,
            0xff,
            0,
            0,
            0,
            0,
        ]);
        f.extend([1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9]);
    }
    f.extend((0..s.payload).map(payload_byte));
    // CHECKSUM_PARTIAL: the field holds the folded pseudo-header sum, not complemented.
    let field = l4 + if s.udp { 6 } else { 16 };
    let p = fold16(pseudo(&f, l3, s.v6, proto, l4_len));
    f[field..field + 2].copy_from_slice(&p.to_be_bytes());
    let gso_type = match (s.udp, s.v6) {
        (true, _) => GSO_UDP_L4,
        (false, false) => GSO_TCPV4,
        (false, true) => GSO_TCPV6,
    };
    let off = Offload {
        flags: F_NEEDS_CSUM,
        gso_type,
        gso_size,
        csum_start: l4 as u16,
        csum_offset: (field - l4) as u16,
    };
    (f, off)
}

// ---------------------------------------------------------------------------------------
// Independent verifier

/// Sum of big-endian 16-bit words (odd byte padded), unfolded, added to `acc`.
fn ones(data: &[u8], mut acc: u32) -> u32 {
    for pair in data.chunks(2) {
        let hi = pair[0] as u32;
        let lo = pair.get(1).copied().unwrap_or(0) as u32;
        acc += (hi << 8) | lo;
    }
    acc
}

fn fold16(mut x: u32) -> u16 {
    while x > 0xffff {
        x = (x & 0xffff) + (x >> 16);
    }
    x as u16
}

fn be16(f: &[u8], at: usize) -> usize {
    u16::from_be_bytes([f[at], f[at + 1]]) as usize
}

fn pseudo(f: &[u8], l3: usize, v6: bool, proto: u8, l4_len: usize) -> u32 {
    let addrs = if v6 {
        &f[l3 + 8..l3 + 40]
    } else {
        &f[l3 + 12..l3 + 20]
    };
    ones(addrs, proto as u32 + l4_len as u32)
}

/// What the verifier learns of a frame.
#[derive(Debug)]
struct Parsed {
    l3: usize,
    l4: usize,
    v6: bool,
    udp: bool,
    ip_id: usize,
    seq: u32,
    flags: u8,
    /// Start of the payload (end of the L4 header).
    data: usize,
}

/// Parses Ethernet (one optional VLAN tag), IPv4/IPv6 (extension headers walked) and TCP/UDP,
/// panicking on anything it does not understand.
fn parse(f: &[u8]) -> Parsed {
    let mut l3 = 14;
    let mut ethertype = be16(f, 12);
    if ethertype == 0x8100 {
        (l3, ethertype) = (18, be16(f, 16));
    }
    let v6 = ethertype == 0x86dd;
    let (l4, proto, ip_id) = if v6 {
        let (mut next, mut at) = (f[l3 + 6], l3 + 40);
        while matches!(next, 0 | 43 | 60 | 51) {
            let len = if next == 51 {
                (f[at + 1] as usize + 2) * 4
            } else {
                (f[at + 1] as usize + 1) * 8
            };
            (next, at) = (f[at], at + len);
        }
        (at, next, 0)
    } else {
        assert_eq!(ethertype, 0x0800);
        ((l3 + (f[l3] as usize & 15) * 4), f[l3 + 9], be16(f, l3 + 4))
    };
    let udp = proto == 17;
    assert!(udp || proto == 6, "L4 protocol {proto}");
    let data = if udp {
        l4 + 8
    } else {
        l4 + (f[l4 + 12] >> 4) as usize * 4
    };
    let seq = u32::from_be_bytes([f[l4 + 4], f[l4 + 5], f[l4 + 6], f[l4 + 7]]);
    Parsed {
        l3,
        l4,
        v6,
        udp,
        ip_id,
        seq,
        flags: if udp { 0 } else { f[l4 + 13] },
        data,
    }
}

/// Parses `f` and checks that it is a well-formed frame: IP lengths, IPv4 header checksum,
/// UDP length, and the L4 checksum over pseudo-header and segment.
fn verify(f: &[u8]) -> Parsed {
    let p = parse(f);
    if p.v6 {
        assert_eq!(
            be16(f, p.l3 + 4),
            f.len() - p.l3 - 40,
            "IPv6 payload length"
        );
    } else {
        assert_eq!(f[p.l3] >> 4, 4);
        assert_eq!(be16(f, p.l3 + 2), f.len() - p.l3, "IPv4 total length");
        assert_eq!(
            fold16(ones(&f[p.l3..p.l4], 0)),
            0xffff,
            "IPv4 header checksum"
        );
    }
    let l4_len = f.len() - p.l4;
    if p.udp {
        assert_eq!(be16(f, p.l4 + 4), l4_len, "UDP length");
        assert_ne!(be16(f, p.l4 + 6), 0, "UDP checksum 0 means none");
    }
    let proto = if p.udp { 17 } else { 6 };
    let sum = ones(&f[p.l4..], pseudo(f, p.l3, p.v6, proto, l4_len));
    assert_eq!(fold16(sum), 0xffff, "L4 checksum");
    p
}

/// Resolves `pieces` with `r`, checks that `count` agrees, that nothing was emitted on error
/// and that parsing from a copy gives the same, and returns the emitted frames.
fn run(r: &mut Resolver, pieces: &[&[u8]], off: Offload) -> Result<Vec<Vec<u8>>, OffloadError> {
    let mut frames = Vec::new();
    let got = r.resolve(pieces, off, false, |f| frames.push(f.to_vec()));
    let mut copied = Vec::new();
    let again = r.resolve(pieces, off, true, |f| copied.push(f.to_vec()));
    assert_eq!(got, again, "a copy resolves differently");
    assert_eq!(frames, copied, "a copy resolves differently");
    assert_eq!(
        Resolver::count(pieces, off),
        got,
        "count disagrees with resolve"
    );
    match got {
        Ok(n) => assert_eq!(n, frames.len()),
        Err(_) => assert!(frames.is_empty()),
    }
    got.map(|_| frames)
}

/// Checks that `frames` are `orig` split at `gso` payload bytes: each one well-formed, the
/// headers that must not change unchanged, sequence numbers contiguous, IPv4 ids counting
/// up, TCP flags split as Linux does, payloads concatenating to the original.
fn check_segments(orig: &[u8], gso: usize, frames: &[Vec<u8>]) {
    let o = parse(orig);
    let payload = &orig[o.data..];
    assert_eq!(frames.len(), payload.len().div_ceil(gso).max(1));
    let mut at = 0;
    for (i, f) in frames.iter().enumerate() {
        let p = verify(f);
        assert_eq!((p.l3, p.l4, p.data), (o.l3, o.l4, o.data));
        let last = i + 1 == frames.len();
        let data = &f[p.data..];
        assert!(data.len() == gso || (last && data.len() <= gso));
        assert_eq!(
            data,
            &payload[at..at + data.len()],
            "payload of segment {i}"
        );
        // Ethernet and addresses untouched, as are IPv6 extension headers and ports.
        assert_eq!(f[..o.l3], orig[..o.l3]);
        if o.v6 {
            assert_eq!(f[o.l3 + 6..o.l4 + 4], orig[o.l3 + 6..o.l4 + 4]);
        } else {
            assert_eq!(p.ip_id, (o.ip_id + i) & 0xffff, "IPv4 id");
            assert_eq!(f[o.l3 + 12..o.l4 + 4], orig[o.l3 + 12..o.l4 + 4]);
        }
        if !o.udp {
            assert_eq!(p.seq, o.seq.wrapping_add(at as u32), "sequence number");
            let mut flags = o.flags;
            if i > 0 {
                flags &= !CWR;
            }
            if !last {
                flags &= !(FIN | PSH);
            }
            assert_eq!(p.flags, flags, "TCP flags of segment {i}");
            // Ack, window, options unchanged.
            assert_eq!(f[o.l4 + 8..o.l4 + 13], orig[o.l4 + 8..o.l4 + 13]);
            assert_eq!(f[o.l4 + 14..o.l4 + 16], orig[o.l4 + 14..o.l4 + 16]);
            assert_eq!(f[o.l4 + 18..o.data], orig[o.l4 + 18..o.data]);
        }
        at += data.len();
    }
    assert_eq!(at, payload.len());
}

/// Builds, resolves as one piece and checks a segmentation case.
fn segment_case(s: Spec, gso: u16) -> Vec<Vec<u8>> {
    let (f, off) = build(s, gso);
    let frames = run(&mut Resolver::new(), &[&f], off).unwrap();
    check_segments(&f, gso as usize, &frames);
    frames
}

// ---------------------------------------------------------------------------------------
// Cases

#[test]
fn word_and_virtio_round_trip() {
    let o = Offload {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV6 | GSO_ECN,
        gso_size: 1440,
        csum_start: 54,
        csum_offset: 16,
    };
    assert_eq!(Offload::from_word(o.to_word()), o);
    assert_eq!(Offload::from_virtio(&o.to_virtio()), o);
    assert!(o.needs_work());
    assert!(!Offload::default().needs_work());
    assert!(!Offload {
        flags: F_DATA_VALID,
        ..Default::default()
    }
    .needs_work());
}

#[test]
fn offload_sum_matches_plain_byte_pair_sum() {
    // The word-at-a-time sum against the verifier's, at every length and alignment, below
    // and above the length from which it is summed with AVX2 where the CPU has it.
    let data: Vec<u8> = (0..1100).map(|i| payload_byte(i * 13 + 5)).collect();
    for start in 0..9 {
        for end in start..data.len() {
            assert_eq!(sum(&data[start..end]), fold16(ones(&data[start..end], 0)));
        }
    }
    // All ones at the longest frame: the sums that could overflow.
    let full = vec![0xffu8; 65535];
    assert_eq!(sum(&full), fold16(ones(&full, 0)));
}

#[test]
fn offload_tcp4_64k_mss_1448() {
    let frames = segment_case(Spec::tcp4(0).max(), 1448);
    assert_eq!(frames.len(), 46);
}

#[test]
fn offload_tcp4_ecn_and_vlan_odd_sizes() {
    let s = Spec::tcp4(0).vlan().max();
    let (mut f, mut off) = build(s, 1000);
    off.gso_type |= GSO_ECN;
    let frames = run(&mut Resolver::new(), &[&f], off).unwrap();
    check_segments(&f, 1000, &frames);
    // gso_size 1: one byte per frame (kept under the segment limit).
    segment_case(Spec::tcp4(700).vlan(), 1);
    // An odd payload length and an odd segment size.
    segment_case(Spec::tcp4(3001), 1447);
    // Without NEEDS_CSUM, whatever the checksum field holds, it is computed from scratch.
    off.flags = 0;
    let field = (off.csum_start + off.csum_offset) as usize;
    f[field..field + 2].copy_from_slice(&[0xde, 0xad]);
    let frames = run(&mut Resolver::new(), &[&f], off).unwrap();
    check_segments(&f, 1000, &frames);
}

#[test]
fn offload_tcp6_64k_mss_1448() {
    let frames = segment_case(Spec::tcp6(0).max(), 1448);
    assert_eq!(frames.len(), 46);
    segment_case(Spec::tcp6(0).vlan().max(), 1000);
}

#[test]
fn offload_tcp6_extension_headers() {
    // L4 is found past hop-by-hop and destination options, where csum_start says.
    segment_case(Spec::tcp6(0).ext().max(), 1448);
    segment_case(Spec::tcp6(5000).ext().vlan(), 999);
}

#[test]
fn offload_udp_l4_v4_and_v6() {
    segment_case(Spec::udp4(60000), 1400);
    segment_case(Spec::udp4(0).vlan().max(), 1472);
    segment_case(Spec::udp6(0).max(), 1452);
    segment_case(Spec::udp6(9999).ext().vlan(), 1000);
}

#[test]
fn offload_gso_frame_of_one_segment() {
    // Already small enough: one frame, its checksum completed.
    assert_eq!(segment_case(Spec::tcp4(1448), 1448).len(), 1);
    assert_eq!(segment_case(Spec::tcp6(100).ext(), 1448).len(), 1);
    assert_eq!(segment_case(Spec::udp4(10), 1448).len(), 1);
    // No payload at all (a bare ACK marked GSO): one frame, flags kept.
    let frames = segment_case(Spec::tcp4(0), 1448);
    assert_eq!(parse(&frames[0]).flags, ACK | PSH | FIN | CWR);
}

#[test]
fn offload_pieces_split_inside_headers() {
    // A frame spanning ring slots, cut inside the Ethernet, VLAN, IP and TCP headers and in
    // the payload, gives exactly the output of the same frame in one piece.
    let mut r = Resolver::new();
    for s in [
        Spec::tcp4(20000).vlan(),
        Spec::tcp6(20000).ext(),
        Spec::udp4(20000),
    ] {
        let (f, off) = build(s, 1448);
        let whole = run(&mut r, &[&f], off).unwrap();
        for cuts in [
            &[1, 13, 15, 17, 20, 33, 47, 54, 55, 1000, f.len() - 1][..],
            &[6],
            &[60, 61, 62, 63],
            &[f.len() / 2],
            &[0, 0, 40, f.len()],
        ] {
            let mut pieces = Vec::new();
            let mut from = 0;
            for &c in cuts {
                pieces.push(&f[from..c]);
                from = c;
            }
            pieces.push(&f[from..]);
            assert_eq!(run(&mut r, &pieces, off).unwrap(), whole, "cuts {cuts:?}");
        }
    }
}

#[test]
fn offload_needs_csum_only_tcp_and_udp() {
    let mut r = Resolver::new();
    for s in [
        Spec::tcp4(1400),
        Spec::tcp6(1001).ext().vlan(),
        Spec::udp4(1471),
        Spec::udp6(0).vlan(),
    ] {
        let (f, mut off) = build(s, 0);
        off.gso_type = GSO_NONE;
        let frames = run(&mut r, &[&f[..7], &f[7..]], off).unwrap();
        assert_eq!(frames.len(), 1);
        verify(&frames[0]);
        // Only the checksum field changed.
        let field = (off.csum_start + off.csum_offset) as usize;
        assert_eq!(frames[0][..field], f[..field]);
        assert_eq!(frames[0][field + 2..], f[field + 2..]);
    }
}

#[test]
fn offload_needs_csum_udp_zero_becomes_ffff() {
    // Choose the last payload word so that the checksum comes out as 0, which UDP would read
    // as "no checksum": it must be sent as 0xffff.
    let (mut f, mut off) = build(Spec::udp4(64), 0);
    off.gso_type = GSO_NONE;
    let l4 = off.csum_start as usize;
    let field = l4 + 6;
    let n = f.len();
    let partial = [f[field], f[field + 1]];
    f[field..field + 2].fill(0);
    f[n - 2..].fill(0);
    let rest = fold16(ones(&f[l4..], pseudo(&f, 14, false, 17, n - l4)));
    f[n - 2..].copy_from_slice(&(!rest).to_be_bytes());
    f[field..field + 2].copy_from_slice(&partial);
    let frames = run(&mut Resolver::new(), &[&f], off).unwrap();
    assert_eq!(be16(&frames[0], field), 0xffff);
    verify(&frames[0]);
}

#[test]
fn offload_no_work_frame_is_emitted_unchanged() {
    let (f, _) = build(Spec::tcp4(100), 0);
    let frames = run(
        &mut Resolver::new(),
        &[&f[..3], &f[3..]],
        Offload::default(),
    )
    .unwrap();
    assert_eq!(frames, [f]);
}

#[test]
fn offload_refused_inputs() {
    use OffloadError::*;
    let mut r = Resolver::new();
    let (t4, o4) = build(Spec::tcp4(5000), 1448);
    let (t6, o6) = build(Spec::tcp6(5000), 1448);
    let (u4, ou) = build(Spec::udp4(5000), 1448);
    let l3 = 14;
    let l4 = o4.csum_start as usize;
    let with = |f: &[u8], at: usize, bytes: &[u8]| {
        let mut f = f.to_vec();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        f
    };
    let csum_only = Offload {
        gso_type: GSO_NONE,
        gso_size: 0,
        ..o4
    };
    let big = vec![0u8; MAX_FRAME + 1];
    let cases: Vec<(&str, Vec<u8>, Offload, OffloadError)> = vec![
        (
            "UFO",
            u4.clone(),
            Offload {
                gso_type: GSO_UDP,
                ..ou
            },
            Unsupported(GSO_UDP),
        ),
        (
            "gso_type 2",
            t4.clone(),
            Offload { gso_type: 2, ..o4 },
            Unsupported(2),
        ),
        (
            "ECN alone",
            t4.clone(),
            Offload {
                gso_type: GSO_ECN,
                ..o4
            },
            Unsupported(GSO_ECN),
        ),
        (
            "ECN on UDP",
            u4.clone(),
            Offload {
                gso_type: GSO_UDP_L4 | GSO_ECN,
                ..ou
            },
            Unsupported(0x85),
        ),
        (
            "gso_size 0",
            t4.clone(),
            Offload { gso_size: 0, ..o4 },
            BadGsoSize,
        ),
        (
            "csum_start past end",
            t4.clone(),
            Offload {
                csum_start: 9000,
                ..csum_only
            },
            BadChecksumOffset,
        ),
        (
            "csum field past end",
            t4.clone(),
            Offload {
                csum_offset: 5100,
                ..csum_only
            },
            BadChecksumOffset,
        ),
        (
            "csum_start not L4",
            t4.clone(),
            Offload {
                csum_start: 30,
                ..o4
            },
            BadChecksumOffset,
        ),
        (
            "csum_offset not TCP's",
            t4.clone(),
            Offload {
                csum_offset: 6,
                ..o4
            },
            BadChecksumOffset,
        ),
        (
            "TCPV4 on IPv6",
            t6.clone(),
            Offload {
                gso_type: GSO_TCPV4,
                ..o6
            },
            BadHeader,
        ),
        (
            "TCPV6 on IPv4",
            t4.clone(),
            Offload {
                gso_type: GSO_TCPV6,
                ..o4
            },
            BadHeader,
        ),
        ("ARP", with(&t4, 12, &[0x08, 0x06]), o4, BadHeader),
        (
            "two VLAN tags",
            with(&t4, 12, &[0x81, 0, 0, 1, 0x81, 0]),
            o4,
            BadHeader,
        ),
        (
            "IP version 6 in IPv4",
            with(&t4, l3, &[0x65]),
            o4,
            BadHeader,
        ),
        ("IHL 4", with(&t4, l3, &[0x44]), o4, BadHeader),
        (
            "IPv4 length past end",
            with(&t4, l3 + 2, &[0xff, 0xff]),
            o4,
            Truncated,
        ),
        (
            "IPv4 length short",
            with(&t4, l3 + 2, &[0x01, 0x00]),
            o4,
            BadHeader,
        ),
        (
            "IPv4 fragment",
            with(&t4, l3 + 6, &[0x20, 0]),
            o4,
            BadHeader,
        ),
        (
            "UDP protocol under TCPV4",
            with(&t4, l3 + 9, &[17]),
            o4,
            BadHeader,
        ),
        ("IPv6 jumbogram", with(&t6, l3 + 4, &[0, 0]), o6, BadHeader),
        ("TCP doff 4", with(&t4, l4 + 12, &[0x40]), o4, BadHeader),
        ("TCP header past end", t4[..l4 + 10].to_vec(), o4, Truncated),
        ("Ethernet only", t4[..14].to_vec(), o4, Truncated),
        ("trailing bytes", [&t4[..], &[0; 4]].concat(), o4, BadHeader),
        ("empty", Vec::new(), o4, Truncated),
        ("too long", big, csum_only, TooLong),
        (
            "1 byte segments of 64 KiB",
            build(Spec::tcp4(0).max(), 1).0,
            Offload { gso_size: 1, ..o4 },
            TooManySegments,
        ),
    ];
    for (what, f, off, want) in cases {
        assert_eq!(
            run(&mut r, &[&f], off).map(|v| v.len()),
            Err(want),
            "{what}"
        );
        assert!(!want.to_string().is_empty());
    }
}

/// xorshift64*: deterministic, no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

#[test]
fn offload_hostile_inputs_never_panic() {
    // Valid frames, then mutated headers, lengths and virtio-net headers, cut into random
    // pieces. Each must either be refused (with count agreeing) or come out well-formed.
    let specs = [
        Spec::tcp4(3000),
        Spec::tcp4(100).vlan(),
        Spec::tcp6(2000).ext(),
        Spec::tcp6(0).vlan(),
        Spec::udp4(2500).vlan(),
        Spec::udp6(1500).ext(),
    ];
    // Each frame asking for segmentation, for its checksum only, and for nothing.
    let mut bases = Vec::new();
    for s in specs {
        let (f, off) = build(s, 700);
        let csum = Offload {
            gso_type: GSO_NONE,
            ..off
        };
        bases.extend([(f.clone(), off), (f.clone(), csum), (f, Offload::default())]);
    }
    let big = build(Spec::tcp6(0).ext().max(), 1448);
    let mut r = Resolver::new();
    let mut rng = Rng(0x5eed_0ff1_0ad0_0001);
    // How often each outcome was seen: refused, segmented, checksummed, passed unchanged.
    let mut seen = [0usize; 4];
    for iter in 0..20000 {
        let (base, base_off) = if iter % 500 == 0 {
            &big
        } else {
            &bases[rng.below(bases.len())]
        };
        let (mut f, mut off) = (base.clone(), *base_off);
        if rng.one_in(2) {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(f.len().min(120));
                f[at] = rng.next() as u8;
            }
        }
        if rng.one_in(4) {
            f.truncate(rng.below(f.len() + 1));
        }
        if rng.one_in(8) {
            f.extend((0..1 + rng.below(100)).map(|_| rng.next() as u8));
        }
        if rng.one_in(2) {
            let v = rng.next();
            match rng.below(6) {
                0 => off.flags = v as u8,
                1 => off.gso_type = [0, 1, 3, 4, 5, 0x81, 0x84, 0x85, v as u8][rng.below(9)],
                2 => off.gso_size = [0, 1, 2, 700, 1448, v as u16][rng.below(6)],
                3 => {
                    off.csum_start = if rng.one_in(2) {
                        v as u16
                    } else {
                        v as u16 % 100
                    }
                }
                4 => {
                    off.csum_offset = if rng.one_in(2) {
                        v as u16
                    } else {
                        v as u16 % 20
                    }
                }
                _ => off = Offload::from_word(v),
            }
        }
        let mut cuts: Vec<usize> = (0..rng.below(4)).map(|_| rng.below(f.len() + 1)).collect();
        cuts.sort();
        let mut pieces = Vec::new();
        let mut from = 0;
        for c in cuts {
            pieces.push(&f[from..c]);
            from = c;
        }
        pieces.push(&f[from..]);

        let Ok(frames) = run(&mut r, &pieces, off) else {
            seen[0] += 1;
            continue;
        };
        if off.gso_type & !GSO_ECN != GSO_NONE {
            seen[1] += 1;
            // Segmented: every frame well-formed, payloads the input's.
            let data = parse(&f).data;
            let mut at = data;
            for out in &frames {
                let p = verify(out);
                assert!(out.len() - p.data <= off.gso_size as usize);
                assert_eq!(out[p.data..], f[at..at + out.len() - p.data]);
                at += out.len() - p.data;
            }
            assert_eq!(at, f.len());
        } else if off.flags & F_NEEDS_CSUM != 0 {
            seen[2] += 1;
            // Checksum only: the field now holds the complement of the sum from csum_start,
            // taken with the field's old value in it (0 sent as 0xffff).
            let [out] = &frames[..] else { panic!() };
            let (start, field) = (
                off.csum_start as usize,
                off.csum_start as usize + off.csum_offset as usize,
            );
            assert_eq!(out.len(), f.len());
            assert_eq!(out[..field], f[..field]);
            assert_eq!(out[field + 2..], f[field + 2..]);
            let want = match !fold16(ones(&f[start..], 0)) {
                0 => 0xffff,
                c => c as usize,
            };
            assert_eq!(be16(out, field), want);
        } else {
            seen[3] += 1;
            assert_eq!(frames, [f]);
        }
    }
    // Every outcome must stay common, or the test proves little.
    eprintln!("refused, segmented, checksummed, unchanged: {seen:?}");
    assert!(seen.iter().all(|&n| n > 500), "{seen:?}");
}

/// Rough cost, not a test: `cargo test --release -p vale-switch offload_timing -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn offload_timing() {
    let mut r = Resolver::new();
    for (what, s, gso) in [
        ("TCPv4 64 KiB / 1448", Spec::tcp4(0).max(), 1448),
        ("TCPv6 64 KiB / 1448", Spec::tcp6(0).max(), 1448),
        ("UDPv4 64 KiB / 1472", Spec::udp4(0).max(), 1472),
    ] {
        let (f, off) = build(s, gso);
        let n = 2000;
        let t = std::time::Instant::now();
        let mut bytes = 0;
        for _ in 0..n {
            r.resolve(&[&f], off, false, |o| bytes += o.len()).unwrap();
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!(
            "{what}: {ns:.0} ns per frame, {:.2} GB/s out",
            bytes as f64 / n as f64 / ns
        );
    }
    let (f, mut off) = build(Spec::tcp4(1448), 0);
    off.gso_type = GSO_NONE;
    let n = 200_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        r.resolve(&[&f], off, false, |o| assert_eq!(o.len(), f.len()))
            .unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("NEEDS_CSUM 1514-byte frame: {ns:.0} ns");
}

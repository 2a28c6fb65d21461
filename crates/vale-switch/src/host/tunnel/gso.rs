//! UDP segmentation offload (`UDP_SEGMENT`) and UDP receive offload (`UDP_GRO`) of a tunnel
//! port's socket: the limits the kernel puts on them, the control messages that carry the
//! segment size, and the split of a merged buffer back into packets.
//!
//! Egress: a TCP segment of up to 64 KiB that a TAP or vhost-user port left to offload is
//! segmented in user space ([`crate::offload::Resolver`], the switch's own segmenter) straight
//! into a contiguous scratch buffer as `[tunnel header + inner segment] × N`, all of one size but the
//! last, and handed to the kernel as one datagram with a `UDP_SEGMENT` control message
//! (`gso_size` = one encapsulated segment): one trip through the UDP and IP send path for the
//! lot, the kernel (or the NIC) cutting it into N datagrams at the end. The kernel refuses such
//! a send (`udp_send_skb` in `net/ipv4/udp.c`) with EINVAL when it holds more than
//! `UDP_MAX_SEGMENTS` segments (`1 << 6` in `include/linux/udp.h` for years, raised to 128 by
//! recent kernels: the lower bound is used), when one segment does not fit the path MTU, or when the socket sends
//! no UDP checksum (`SO_NO_CHECK`); with EIO on an IPsec route and, in older kernels (recent
//! ones checksum in software then), when the route's device cannot finish checksums.
//! A datagram is at most [`MAX_UDP_PAYLOAD`] bytes in all, so a 64 KiB segment whose
//! encapsulated pieces add up to more goes in two sends ([`joins`] decides where one ends).
//!
//! Ingress: with `UDP_GRO` on, the kernel may hand over, in one buffer, several datagrams of
//! one flow of the same size (the last one shorter), saying their size in a control message;
//! [`pieces`] splits the buffer back, and each piece is checked exactly as a datagram received
//! alone. What the kernel says is checked too: a size of 0 or one larger than the buffer
//! means one datagram.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd};

use super::wire::MAX_UDP_PAYLOAD;

/// Most segments of one `UDP_SEGMENT` send (`UDP_MAX_SEGMENTS` of older kernels).
pub const MAX_GSO_SEGMENTS: usize = 64;

/// Whether an encapsulated segment of `n` bytes may join a send that holds `count` segments
/// of `seg` bytes each (`bytes` in all): every segment of one send has the size of the first
/// but the last, which may be shorter (and then ends the send), at most
/// [`MAX_GSO_SEGMENTS`] of them and [`MAX_UDP_PAYLOAD`] bytes together.
pub fn joins(seg: usize, count: usize, bytes: usize, n: usize) -> bool {
    count > 0
        && count < MAX_GSO_SEGMENTS
        && n > 0
        && n <= seg
        && bytes == seg * count
        && bytes + n <= MAX_UDP_PAYLOAD
}

/// The pieces (offset, length) of a buffer of `total` bytes that the kernel merged from
/// datagrams of `seg` bytes: each `seg` long but the last, which holds the rest. `seg` 0, or
/// not shorter than the buffer: the buffer is one datagram.
pub fn pieces(total: usize, seg: usize) -> impl Iterator<Item = (usize, usize)> {
    let seg = if seg == 0 || seg >= total {
        total.max(1)
    } else {
        seg
    };
    (0..total.max(1))
        .step_by(seg)
        .map(move |at| (at, seg.min(total - at)))
}

/// A control message of one `u16` or `int` (`UDP_SEGMENT` sent, `UDP_GRO` received), laid out
/// as `CMSG_SPACE(4)` bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Cmsg {
    hdr: libc::cmsghdr,
    data: [u8; 8],
}

const _: () = assert!(size_of::<Cmsg>() == size_of::<libc::cmsghdr>() + 8);

impl Cmsg {
    pub fn zeroed() -> Cmsg {
        // SAFETY: all-zero is a valid cmsghdr and byte array.
        unsafe { std::mem::zeroed() }
    }

    /// Bytes of the message, for `msg_controllen`.
    pub const SPACE: usize = size_of::<Cmsg>();

    /// `UDP_SEGMENT` with segments of `size` bytes.
    pub fn segment(size: u16) -> Cmsg {
        let mut c = Cmsg::zeroed();
        c.hdr.cmsg_level = libc::SOL_UDP;
        c.hdr.cmsg_type = libc::UDP_SEGMENT;
        // The kernel wants exactly CMSG_LEN(sizeof(__u16)).
        c.hdr.cmsg_len = (size_of::<libc::cmsghdr>() + 2) as _;
        c.data[..2].copy_from_slice(&size.to_ne_bytes());
        c
    }

    /// The segment size of a `UDP_GRO` message the kernel wrote in `controllen` bytes, if it
    /// wrote one.
    // `cmsg_len` is a `size_t` with glibc, a `socklen_t` with musl.
    #[allow(clippy::unnecessary_cast)]
    pub fn gro_size(&self, controllen: usize) -> Option<usize> {
        let want = size_of::<libc::cmsghdr>() + 4;
        (controllen >= want
            && self.hdr.cmsg_level == libc::SOL_UDP
            && self.hdr.cmsg_type == libc::UDP_GRO
            && self.hdr.cmsg_len as usize >= want)
            .then(|| {
                i32::from_ne_bytes([self.data[0], self.data[1], self.data[2], self.data[3]])
                    as usize
            })
    }
}

/// Turns on `UDP_GRO` on `sock`; false when the kernel does not have it.
pub fn enable_gro(sock: &OwnedFd) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: a c_int option value, its size given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            &on as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// Whether the kernel's refusal of a `UDP_SEGMENT` send may be for good, not for this send's
/// size: EIO (an IPsec route, or a device that cannot finish checksums), or EINVAL (the
/// socket, or a segment too big for the path: the port tells these apart by sending the
/// segments one by one).
pub fn refuses_gso(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits the sizes `segs` into sends as the port does.
    fn sends(segs: &[usize]) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        for &n in segs {
            let join = out.last().is_some_and(|s: &Vec<usize>| {
                let last_short = s.len() > 1 && s[s.len() - 1] < s[0];
                !last_short && joins(s[0], s.len(), s.iter().sum(), n)
            });
            if join {
                out.last_mut().unwrap().push(n);
            } else {
                out.push(vec![n]);
            }
        }
        out
    }

    #[test]
    fn sends_keep_the_kernels_limits() {
        // 47 segments of 1472 bytes and a last of 500: 68 KiB, two sends.
        let mut segs = vec![1472; 47];
        segs.push(500);
        let s = sends(&segs);
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|s| s.iter().sum::<usize>() <= MAX_UDP_PAYLOAD));
        assert_eq!(s[0].len(), MAX_UDP_PAYLOAD / 1472);
        assert_eq!(s.iter().map(|s| s.len()).sum::<usize>(), 48);
        // Tiny segments: at most 64 per send.
        let s = sends(&[30; 200]);
        assert_eq!(
            s.iter().map(|s| s.len()).collect::<Vec<_>>(),
            [64, 64, 64, 8]
        );
        // A larger one after smaller ones starts a send; a shorter one ends it.
        assert_eq!(
            sends(&[100, 100, 200, 200, 50, 200]),
            [vec![100, 100], vec![200, 200, 50], vec![200]]
        );
        // Nothing empty joins, nothing joins an empty send, no segment beyond a datagram.
        assert!(!joins(100, 1, 100, 0));
        assert!(!joins(100, 0, 0, 100));
        assert!(!joins(MAX_UDP_PAYLOAD, 1, MAX_UDP_PAYLOAD, 1));
        // A send whose bytes do not add up (a shorter one already in it) takes no more.
        assert!(!joins(100, 2, 150, 50));
    }

    #[test]
    fn merged_buffers_split_into_their_datagrams() {
        let p = |t, s| pieces(t, s).collect::<Vec<_>>();
        assert_eq!(p(300, 100), [(0, 100), (100, 100), (200, 100)]);
        // A size that does not divide the buffer: the last piece holds the rest.
        assert_eq!(p(250, 100), [(0, 100), (100, 100), (200, 50)]);
        // A last piece shorter than any header is still a piece: it is checked and dropped.
        assert_eq!(p(203, 100).last(), Some(&(200, 3)));
        // Size 0, or no smaller than the buffer: one datagram.
        assert_eq!(p(250, 0), [(0, 250)]);
        assert_eq!(p(250, 250), [(0, 250)]);
        assert_eq!(p(250, 65535), [(0, 250)]);
        // An empty buffer is one empty datagram (a bad header), not none and no loop.
        assert_eq!(p(0, 0), [(0, 0)]);
        assert_eq!(p(0, 7), [(0, 0)]);
        // Size 1 over 64 KiB: bounded by the buffer.
        assert_eq!(pieces(65535, 1).count(), 65535);
    }

    #[test]
    fn control_messages_are_laid_out_as_the_kernel_reads_them() {
        let c = Cmsg::segment(1472);
        assert_eq!(c.hdr.cmsg_level, libc::SOL_UDP);
        assert_eq!(c.hdr.cmsg_type, libc::UDP_SEGMENT);
        // SAFETY: pure arithmetic.
        assert_eq!(c.hdr.cmsg_len as u32, unsafe { libc::CMSG_LEN(2) });
        // SAFETY: pure arithmetic.
        assert!(Cmsg::SPACE >= unsafe { libc::CMSG_SPACE(4) } as usize);
        assert_eq!(u16::from_ne_bytes([c.data[0], c.data[1]]), 1472);
        let mut g = Cmsg::zeroed();
        assert_eq!(g.gro_size(Cmsg::SPACE), None, "nothing written");
        g.hdr.cmsg_level = libc::SOL_UDP;
        g.hdr.cmsg_type = libc::UDP_GRO;
        g.hdr.cmsg_len = (size_of::<libc::cmsghdr>() + 4) as _;
        g.data[..4].copy_from_slice(&1400i32.to_ne_bytes());
        assert_eq!(g.gro_size(Cmsg::SPACE), Some(1400));
        assert_eq!(g.gro_size(0), None, "the kernel wrote no message");
        g.hdr.cmsg_type = libc::UDP_SEGMENT;
        assert_eq!(g.gro_size(Cmsg::SPACE), None, "another message");
    }
}

//! AF_PACKET with TPACKET_V2 rx and tx rings in one mapping (rx ring first).

use crate::sys::{self, Mmap, Tpacket2Hdr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

const RX_FRAMES: u32 = 1024;
const TX_FRAMES: u32 = 1024;
/// Where the kernel puts frame data in a TX ring slot (no PACKET_TX_HAS_OFF).
const TX_DATA: usize = sys::TPACKET2_HDR_ALIGNED;
/// Offset of `sll_pkttype` in the `sockaddr_ll` that follows the V2 header.
const PKTTYPE_AT: usize = sys::TPACKET2_HDR_ALIGNED + 10;

pub struct PacketPort {
    fd: OwnedFd,
    ring: Mmap,
    frame_size: usize,
    rx_head: u32,
    tx_head: u32,
    tx_pending: bool,
    /// For the rare received frame whose VLAN tag cannot be put back in place.
    scratch: Vec<u8>,
    pub truncated: u64,
    pub tx_wrong_format: u64,
}

fn step(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

pub fn promisc(fd: RawFd, ifindex: u32) -> io::Result<()> {
    let mreq = sys::PacketMreq {
        mr_ifindex: ifindex as i32,
        mr_type: sys::PACKET_MR_PROMISC,
        mr_alen: 0,
        mr_address: [0; 8],
    };
    sys::setsockopt(fd, sys::SOL_PACKET, sys::PACKET_ADD_MEMBERSHIP, &mreq)
}

impl PacketPort {
    pub fn open(ifindex: u32, mtu: u32) -> io::Result<PacketPort> {
        // Room for the V2 header, sockaddr_ll and alignment in front of a full frame (with a
        // VLAN tag); power of two so frames pack blocks exactly.
        let frame_size = (mtu as usize + 14 + 4 + 128).next_power_of_two().max(2048);
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let block_size = frame_size.max(page);
        // Protocol 0 until bound: the socket sees nothing before its rings exist.
        let fd =
            sys::socket(libc::AF_PACKET, libc::SOCK_RAW, 0).map_err(step("AF_PACKET socket"))?;
        let raw = fd.as_raw_fd();
        sys::setsockopt(raw, sys::SOL_PACKET, sys::PACKET_VERSION, &sys::TPACKET_V2)
            .map_err(step("PACKET_VERSION"))?;
        // Skip malformed tx frames instead of stalling the whole tx ring on them.
        sys::setsockopt(raw, sys::SOL_PACKET, sys::PACKET_LOSS, &1i32)
            .map_err(step("PACKET_LOSS"))?;
        sys::setsockopt(raw, sys::SOL_PACKET, sys::PACKET_QDISC_BYPASS, &1i32)
            .map_err(step("PACKET_QDISC_BYPASS"))?;
        // Frames the host itself sends out of the interface are not ours to switch. Older
        // kernels lack the option; the sll_pkttype check in recv covers them.
        if let Err(e) = sys::setsockopt(raw, sys::SOL_PACKET, sys::PACKET_IGNORE_OUTGOING, &1i32) {
            tracing::debug!("PACKET_IGNORE_OUTGOING unavailable: {e}");
        }
        for (opt, frames, what) in [
            (sys::PACKET_RX_RING, RX_FRAMES, "PACKET_RX_RING"),
            (sys::PACKET_TX_RING, TX_FRAMES, "PACKET_TX_RING"),
        ] {
            let req = sys::TpacketReq {
                tp_block_size: block_size as u32,
                tp_block_nr: (frames as usize * frame_size / block_size) as u32,
                tp_frame_size: frame_size as u32,
                tp_frame_nr: frames,
            };
            sys::setsockopt(raw, sys::SOL_PACKET, opt, &req).map_err(step(what))?;
        }
        let len = (RX_FRAMES + TX_FRAMES) as usize * frame_size;
        let ring = Mmap::shared(&fd, len, 0).map_err(step("mapping the packet rings"))?;
        if let Err(e) = promisc(raw, ifindex) {
            tracing::warn!("ifindex {ifindex}: promiscuous mode refused ({e}); only frames for its own address will arrive");
        }
        // SAFETY: an all-zero sockaddr_ll is valid; we then set the fields bind needs.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        sys::cvt(unsafe {
            libc::bind(
                raw,
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })
        .map_err(step("binding the AF_PACKET socket"))?;
        Ok(PacketPort {
            fd,
            ring,
            frame_size,
            rx_head: 0,
            tx_head: 0,
            tx_pending: false,
            scratch: vec![0; frame_size + 4],
            truncated: 0,
            tx_wrong_format: 0,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn max_frame(&self) -> usize {
        self.frame_size - TX_DATA
    }

    fn slot(&self, i: usize) -> *mut u8 {
        debug_assert!(i < (RX_FRAMES + TX_FRAMES) as usize);
        // SAFETY: slot i < RX_FRAMES + TX_FRAMES lies inside the ring mapping.
        unsafe { self.ring.as_ptr().add(i * self.frame_size) }
    }

    fn load_status(slot: *mut u8) -> u32 {
        // SAFETY: `slot` starts a live, 16-byte aligned ring slot whose first field is the u32
        // tp_status shared with the kernel. Acquire: the kernel wrote the slot before its status.
        unsafe { AtomicU32::from_ptr(slot as *mut u32) }.load(Ordering::Acquire)
    }

    fn store_status(slot: *mut u8, v: u32) {
        // SAFETY: as in `load_status`. Release: our accesses to the slot come before the
        // kernel may take it.
        unsafe { AtomicU32::from_ptr(slot as *mut u32) }.store(v, Ordering::Release)
    }

    pub fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut delivered = 0;
        for _ in 0..budget {
            let slot = self.slot(self.rx_head as usize);
            let st = Self::load_status(slot);
            if st & sys::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the slot is ours (TP_STATUS_USER) and starts with a tpacket2_hdr;
            // PKTTYPE_AT lies inside the slot header area.
            let (h, pkttype) = unsafe {
                (
                    (slot as *const Tpacket2Hdr).read_volatile(),
                    slot.add(PKTTYPE_AT).read_volatile(),
                )
            };
            let mac = h.tp_mac as usize;
            let snap = h.tp_snaplen as usize;
            let fits = mac >= sys::TPACKET2_HDRLEN && mac + snap <= self.frame_size && snap >= 14;
            if pkttype == sys::PACKET_OUTGOING {
                // Sent by this host: not something the wire gave us.
            } else if !fits || snap < h.tp_len as usize {
                self.truncated += 1;
            } else if st & sys::TP_STATUS_VLAN_VALID != 0 {
                // The kernel took the 802.1Q tag out of the data; a switch must see it.
                let tpid = if st & sys::TP_STATUS_VLAN_TPID_VALID != 0 && h.tp_vlan_tpid != 0 {
                    h.tp_vlan_tpid
                } else {
                    0x8100
                };
                let mut tag = [0u8; 4];
                tag[..2].copy_from_slice(&tpid.to_be_bytes());
                tag[2..].copy_from_slice(&h.tp_vlan_tci.to_be_bytes());
                if mac >= sys::TPACKET2_HDRLEN + 4 {
                    // SAFETY: [mac-4, mac+snap) lies inside our slot past its header (checked),
                    // and the slot is ours until we hand it back below.
                    let frame = unsafe {
                        let p = slot.add(mac - 4);
                        std::ptr::copy(slot.add(mac), p, 12);
                        std::ptr::copy_nonoverlapping(tag.as_ptr(), p.add(12), 4);
                        std::slice::from_raw_parts(p, snap + 4)
                    };
                    f(frame);
                } else {
                    // SAFETY: [mac, mac+snap) lies inside our slot (checked above).
                    let data = unsafe { std::slice::from_raw_parts(slot.add(mac), snap) };
                    let out = &mut self.scratch[..snap + 4];
                    out[..12].copy_from_slice(&data[..12]);
                    out[12..16].copy_from_slice(&tag);
                    out[16..].copy_from_slice(&data[12..]);
                    f(out);
                }
                delivered += 1;
            } else {
                // SAFETY: [mac, mac+snap) lies inside our slot (checked above).
                f(unsafe { std::slice::from_raw_parts(slot.add(mac), snap) });
                delivered += 1;
            }
            Self::store_status(slot, sys::TP_STATUS_KERNEL);
            self.rx_head = (self.rx_head + 1) % RX_FRAMES;
        }
        Ok(delivered)
    }

    pub fn send(&mut self, pieces: &[&[u8]], len: usize) -> io::Result<bool> {
        let slot = self.slot((RX_FRAMES + self.tx_head) as usize);
        let st = Self::load_status(slot);
        if st == sys::TP_STATUS_WRONG_FORMAT {
            // Only without PACKET_LOSS; count it and reuse the slot.
            self.tx_wrong_format += 1;
        } else if st != sys::TP_STATUS_AVAILABLE {
            return Ok(false);
        }
        let mut at = TX_DATA;
        for p in pieces {
            // SAFETY: the caller checked len <= max_frame(), so [TX_DATA, TX_DATA+len) fits in
            // the slot, which is ours while its status is AVAILABLE.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), slot.add(at), p.len()) };
            at += p.len();
        }
        // SAFETY: tp_len is the second u32 of the slot's tpacket2_hdr.
        unsafe { (slot as *mut u32).add(1).write_volatile(len as u32) };
        Self::store_status(slot, sys::TP_STATUS_SEND_REQUEST);
        self.tx_head = (self.tx_head + 1) % TX_FRAMES;
        self.tx_pending = true;
        Ok(true)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if !self.tx_pending {
            return Ok(());
        }
        // SAFETY: a zero-length non-blocking send; the kernel takes frames from the tx ring.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // Frames stay queued in the ring and go out with the next flush.
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) | Some(libc::EINTR) => Ok(()),
                _ => Err(e),
            };
        }
        self.tx_pending = false;
        Ok(())
    }

    /// The socket's pending error: the kernel sets ENETDOWN when the interface goes down or
    /// away.
    pub fn check(&mut self) -> io::Result<()> {
        let mut err: i32 = 0;
        sys::getsockopt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut err,
        )?;
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
        Ok(())
    }

    /// Kernel drop count since the last call (reading resets the kernel's counters).
    pub fn take_kernel_drops(&self) -> u64 {
        let mut st = sys::TpacketStats::default();
        match sys::getsockopt(
            self.fd.as_raw_fd(),
            sys::SOL_PACKET,
            sys::PACKET_STATISTICS,
            &mut st,
        ) {
            Ok(_) => st.tp_drops as u64,
            Err(_) => 0,
        }
    }
}

//! AF_XDP: one socket per rx queue, each with its own UMEM and four rings.
//!
//! UMEM layout per socket: the first `RX_FRAMES` chunks circulate between the fill ring, the
//! kernel and the rx ring; the socket of queue 0 also owns `TX_FRAMES` more chunks for sending,
//! kept on a free list and returned through the completion ring. Everything runs in copy mode.

use crate::bpf;
use crate::sys::{self, Mmap, XdpDesc};
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

const RX_FRAMES: u32 = 2048;
const TX_FRAMES: u32 = 2048;
/// Ring sizes equal the frame counts, so the fill and completion rings can never overflow.
const FILL_SIZE: u32 = RX_FRAMES;
const RX_SIZE: u32 = RX_FRAMES;
const TX_SIZE: u32 = TX_FRAMES;
const COMP_SIZE: u32 = TX_FRAMES;

/// A single-producer/single-consumer ring shared with the kernel.
struct Ring<T> {
    _map: Mmap,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
    size: u32,
    /// Our copy of the index we own (producer or consumer) and of the other side's.
    cached_prod: u32,
    cached_cons: u32,
    _t: PhantomData<T>,
}

// SAFETY: the ring is only touched through `&mut self`; the raw pointers point into `_map`,
// which moves with the ring.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    fn map(fd: &OwnedFd, off: &sys::XdpRingOffset, size: u32, pgoff: i64) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Mmap::shared(fd, len, pgoff)?;
        let base = map.as_ptr();
        // The kernel says where the indices live; keep them inside the mapping, 4-byte aligned.
        for o in [off.producer, off.consumer, off.flags] {
            if o as usize + 4 > len || !o.is_multiple_of(4) {
                return Err(io::Error::other("kernel ring offsets out of range"));
            }
        }
        if !(off.desc as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(io::Error::other("kernel ring descriptor offset misaligned"));
        }
        // SAFETY: all offsets were checked to lie inside the mapping just made.
        unsafe {
            Ok(Ring {
                producer: base.add(off.producer as usize) as *const AtomicU32,
                consumer: base.add(off.consumer as usize) as *const AtomicU32,
                flags: base.add(off.flags as usize) as *const AtomicU32,
                descs: base.add(off.desc as usize) as *mut T,
                mask: size - 1,
                size,
                cached_prod: 0,
                cached_cons: 0,
                _map: map,
                _t: PhantomData,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into our live mapping, 4-byte aligned (checked in `map`).
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `producer`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & sys::XDP_RING_NEED_WAKEUP != 0
    }

    // -- we produce (fill, tx) --

    /// Free slots, refreshing the kernel's consumer index only when needed.
    fn free(&mut self, want: u32) -> u32 {
        let free = self
            .size
            .wrapping_sub(self.cached_prod.wrapping_sub(self.cached_cons));
        if free >= want {
            return free;
        }
        // Acquire: the kernel has finished with the slots it consumed.
        self.cached_cons = self.consumer().load(Ordering::Acquire);
        let used = self.cached_prod.wrapping_sub(self.cached_cons);
        self.size.saturating_sub(used)
    }

    fn push(&mut self, v: T) {
        let i = (self.cached_prod & self.mask) as usize;
        // SAFETY: `i` < size, inside the descriptor array of the mapping.
        unsafe { self.descs.add(i).write_volatile(v) };
        self.cached_prod = self.cached_prod.wrapping_add(1);
    }

    /// Publishes pushed entries. Release: the descriptors are written before the index moves.
    fn submit(&mut self) {
        self.producer().store(self.cached_prod, Ordering::Release);
    }

    /// Entries produced but not yet consumed by the kernel.
    fn outstanding(&self) -> u32 {
        let cons = self.consumer().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(cons).min(self.size)
    }

    // -- the kernel produces (rx, completion) --

    /// Entries ready to read, at most `max`.
    fn ready(&mut self, max: u32) -> u32 {
        let mut n = self.cached_prod.wrapping_sub(self.cached_cons);
        if n == 0 {
            // Acquire: descriptor contents are visible once we see the index.
            self.cached_prod = self.producer().load(Ordering::Acquire);
            n = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        // A producer index that ran more than a ring ahead is nonsense; never read past `size`.
        n.min(self.size).min(max)
    }

    fn pop(&mut self) -> T {
        let i = (self.cached_cons & self.mask) as usize;
        // SAFETY: `i` < size, inside the descriptor array of the mapping.
        let v = unsafe { self.descs.add(i).read_volatile() };
        self.cached_cons = self.cached_cons.wrapping_add(1);
        v
    }

    /// Gives read slots back. Release: we are done reading them before the kernel reuses them.
    fn release(&mut self) {
        self.consumer().store(self.cached_cons, Ordering::Release);
    }
}

struct Xsk {
    fd: OwnedFd,
    fill: Ring<u64>,
    comp: Option<Ring<u64>>,
    rx: Ring<XdpDesc>,
    tx: Option<Ring<XdpDesc>>,
    /// Chunks for sending that neither the tx ring nor the kernel holds.
    tx_free: Vec<u64>,
    // Declared last: dropped after the rings and the socket.
    umem: Mmap,
}

/// Field order is drop order: sockets (with their rings and UMEM) close first, then the link
/// (which detaches the program), the program and the map.
pub struct XdpPort {
    socks: Vec<Xsk>,
    chunk: u32,
    /// Frames posted to the tx ring but not yet handed to the kernel.
    tx_pending: bool,
    next_rx: usize,
    pub bad_descs: u64,
    // Closing the link detaches the program; the map goes after the sockets that sit in it.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
}

/// The step that failed, for error messages.
fn step(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl XdpPort {
    pub fn open(ifindex: u32, queues: u32, mtu: u32, native: bool) -> io::Result<XdpPort> {
        // A received frame must fit behind the kernel's headroom: 2048-byte chunks hold
        // standard frames (with a VLAN tag), larger MTUs get 4096.
        let need = mtu as usize + 14 + 8;
        let chunk = if need <= 2048 - sys::XDP_PACKET_HEADROOM {
            2048
        } else if need <= 4096 - sys::XDP_PACKET_HEADROOM {
            4096
        } else {
            // Bigger frames would need multi-buffer AF_XDP; the kernel would drop them.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("MTU {mtu} is too large for AF_XDP with 4096-byte chunks"),
            ));
        };
        let queues = queues.max(1);
        let map = bpf::create_xskmap(queues).map_err(step("creating the XSKMAP"))?;
        let prog = bpf::load_program(&map).map_err(step("loading the XDP program"))?;
        let link = bpf::attach(&prog, ifindex, native).map_err(step(if native {
            "attaching the XDP program in native mode"
        } else {
            "attaching the XDP program in generic mode"
        }))?;
        let mut socks = Vec::with_capacity(queues as usize);
        for q in 0..queues {
            let s = Xsk::open(ifindex, q, chunk, q == 0)
                .map_err(|e| io::Error::new(e.kind(), format!("rx queue {q}: {e}")))?;
            bpf::xskmap_set(&map, q, s.fd.as_raw_fd()).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("rx queue {q}: adding the socket to the XSKMAP: {e}"),
                )
            })?;
            socks.push(s);
        }
        Ok(XdpPort {
            socks,
            chunk,
            tx_pending: false,
            next_rx: 0,
            bad_descs: 0,
            _link: link,
            _prog: prog,
            _map: map,
        })
    }

    pub fn queues(&self) -> usize {
        self.socks.len()
    }

    pub fn max_frame(&self) -> usize {
        self.chunk as usize
    }

    pub fn poll_fds(&self) -> Vec<RawFd> {
        self.socks.iter().map(|s| s.fd.as_raw_fd()).collect()
    }

    pub fn recv(&mut self, budget: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let n = self.socks.len();
        let mut got = 0;
        // Round-robin over queues so a busy queue cannot starve the others.
        for i in 0..n {
            if got >= budget {
                break;
            }
            let q = (self.next_rx + i) % n;
            got += self.socks[q].recv(budget - got, self.chunk, &mut self.bad_descs, f)?;
        }
        self.next_rx = (self.next_rx + 1) % n;
        Ok(got)
    }

    pub fn send(&mut self, pieces: &[&[u8]], len: usize) -> io::Result<bool> {
        let sent = self.socks[0].send(pieces, len, self.chunk)?;
        self.tx_pending |= sent;
        Ok(sent)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        let s = &mut self.socks[0];
        if self.tx_pending {
            self.tx_pending = false;
            s.kick(self.chunk)?;
        }
        s.reap_with(self.chunk);
        Ok(())
    }

    /// One syscall that fails when the socket lost its device (ENXIO) or the device is down
    /// (ENETDOWN); otherwise harmless (and it wakes the driver's rx if it asked for that).
    pub fn check(&mut self) -> io::Result<()> {
        for s in &self.socks {
            s.wake_rx()?;
        }
        Ok(())
    }

    pub fn kernel_stats(&self) -> sys::XdpStatistics {
        let mut total = sys::XdpStatistics::default();
        for s in &self.socks {
            let mut st = sys::XdpStatistics::default();
            if sys::getsockopt(s.fd.as_raw_fd(), sys::SOL_XDP, sys::XDP_STATISTICS, &mut st).is_ok()
            {
                total.rx_dropped += st.rx_dropped;
                total.rx_invalid_descs += st.rx_invalid_descs;
                total.tx_invalid_descs += st.tx_invalid_descs;
                total.rx_ring_full += st.rx_ring_full;
                total.rx_fill_ring_empty_descs += st.rx_fill_ring_empty_descs;
                total.tx_ring_empty_descs += st.tx_ring_empty_descs;
            }
        }
        total
    }
}

impl Xsk {
    fn open(ifindex: u32, queue: u32, chunk: u32, with_tx: bool) -> io::Result<Xsk> {
        let fd = sys::socket(libc::AF_XDP, libc::SOCK_RAW, 0).map_err(step("AF_XDP socket"))?;
        let raw = fd.as_raw_fd();
        let frames = RX_FRAMES + if with_tx { TX_FRAMES } else { 0 };
        let umem = Mmap::anonymous(frames as usize * chunk as usize).map_err(step("UMEM mmap"))?;
        let reg = sys::XdpUmemReg {
            addr: umem.as_ptr() as u64,
            len: umem.len() as u64,
            chunk_size: chunk,
            ..Default::default()
        };
        sys::setsockopt(raw, sys::SOL_XDP, sys::XDP_UMEM_REG, &reg)
            .map_err(step("XDP_UMEM_REG"))?;
        sys::setsockopt(raw, sys::SOL_XDP, sys::XDP_UMEM_FILL_RING, &FILL_SIZE)
            .map_err(step("XDP_UMEM_FILL_RING"))?;
        sys::setsockopt(raw, sys::SOL_XDP, sys::XDP_RX_RING, &RX_SIZE)
            .map_err(step("XDP_RX_RING"))?;
        // The completion ring is required by the kernel even for a socket that never sends.
        let comp_size = if with_tx { COMP_SIZE } else { 64 };
        sys::setsockopt(raw, sys::SOL_XDP, sys::XDP_UMEM_COMPLETION_RING, &comp_size)
            .map_err(step("XDP_UMEM_COMPLETION_RING"))?;
        if with_tx {
            sys::setsockopt(raw, sys::SOL_XDP, sys::XDP_TX_RING, &TX_SIZE)
                .map_err(step("XDP_TX_RING"))?;
        }
        let mut off = sys::XdpMmapOffsets::default();
        let got = sys::getsockopt(raw, sys::SOL_XDP, sys::XDP_MMAP_OFFSETS, &mut off)
            .map_err(step("XDP_MMAP_OFFSETS"))?;
        if got != std::mem::size_of::<sys::XdpMmapOffsets>() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "XDP_MMAP_OFFSETS: kernel too old (no ring flags)",
            ));
        }
        let fill = Ring::map(&fd, &off.fr, FILL_SIZE, sys::XDP_UMEM_PGOFF_FILL_RING)
            .map_err(step("mapping the fill ring"))?;
        let comp: Ring<u64> =
            Ring::map(&fd, &off.cr, comp_size, sys::XDP_UMEM_PGOFF_COMPLETION_RING)
                .map_err(step("mapping the completion ring"))?;
        let rx = Ring::map(&fd, &off.rx, RX_SIZE, sys::XDP_PGOFF_RX_RING)
            .map_err(step("mapping the rx ring"))?;
        let tx = if with_tx {
            Some(
                Ring::map(&fd, &off.tx, TX_SIZE, sys::XDP_PGOFF_TX_RING)
                    .map_err(step("mapping the tx ring"))?,
            )
        } else {
            None
        };
        let sa = sys::SockaddrXdp {
            family: libc::AF_XDP as u16,
            flags: sys::XDP_COPY | sys::XDP_USE_NEED_WAKEUP,
            ifindex,
            queue_id: queue,
            shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a valid sockaddr_xdp of the size passed.
        sys::cvt(unsafe {
            libc::bind(
                raw,
                &sa as *const sys::SockaddrXdp as *const libc::sockaddr,
                std::mem::size_of::<sys::SockaddrXdp>() as libc::socklen_t,
            )
        })
        .map_err(step("binding the AF_XDP socket"))?;
        let mut tx_free = Vec::new();
        if with_tx {
            tx_free.reserve_exact(TX_FRAMES as usize);
            tx_free.extend((RX_FRAMES..RX_FRAMES + TX_FRAMES).map(|i| i as u64 * chunk as u64));
        }
        let mut s = Xsk {
            fd,
            fill,
            comp: Some(comp),
            rx,
            tx,
            tx_free,
            umem,
        };
        // Hand every rx chunk to the kernel.
        for i in 0..RX_FRAMES {
            s.fill.push(i as u64 * chunk as u64);
        }
        s.fill.submit();
        Ok(s)
    }

    fn recv(
        &mut self,
        budget: usize,
        chunk: u32,
        bad: &mut u64,
        f: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let n = self.rx.ready(budget.min(u32::MAX as usize) as u32);
        if n == 0 {
            return Ok(0);
        }
        let rx_bytes = RX_FRAMES as u64 * chunk as u64;
        // The fill ring always has room for what we took out of the rx ring: both are
        // RX_FRAMES long and only RX_FRAMES chunks circulate.
        let room = self.fill.free(n);
        let mut refilled = 0;
        for _ in 0..n {
            let d = self.rx.pop();
            let end = d.addr.checked_add(d.len as u64);
            let base = d.addr & !(chunk as u64 - 1);
            // A descriptor must lie inside one rx chunk; anything else is not ours to read.
            match end {
                Some(end) if d.addr < rx_bytes && end <= base + chunk as u64 && d.len > 0 => {
                    // SAFETY: [addr, end) lies inside the UMEM mapping (checked above) and the
                    // kernel has handed this chunk to us until we put it on the fill ring.
                    let frame = unsafe {
                        std::slice::from_raw_parts(
                            self.umem.as_ptr().add(d.addr as usize),
                            d.len as usize,
                        )
                    };
                    f(frame);
                }
                _ => *bad += 1,
            }
            if base < rx_bytes && refilled < room {
                self.fill.push(base);
                refilled += 1;
            }
        }
        self.rx.release();
        self.fill.submit();
        if self.fill.needs_wakeup() {
            self.wake_rx()?;
        }
        Ok(n as usize)
    }

    fn wake_rx(&self) -> io::Result<()> {
        // SAFETY: a zero-length, non-blocking recvfrom with null buffers, as AF_XDP expects.
        let r = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::EBUSY) => {}
                _ => return Err(e),
            }
        }
        Ok(())
    }

    fn send(&mut self, pieces: &[&[u8]], len: usize, chunk: u32) -> io::Result<bool> {
        if self.tx.as_mut().is_none_or(|tx| tx.free(1) == 0) {
            return Ok(false);
        }
        if self.tx_free.is_empty() {
            self.reap_with(chunk);
        }
        let Some(addr) = self.tx_free.pop() else {
            return Ok(false);
        };
        let tx = self.tx.as_mut().expect("checked above");
        let mut at = addr as usize;
        for p in pieces {
            // SAFETY: `addr` is the start of a tx chunk we own (from our free list, so inside the
            // UMEM) and the caller checked that `len` (the sum of the pieces) fits in a chunk.
            unsafe {
                std::ptr::copy_nonoverlapping(p.as_ptr(), self.umem.as_ptr().add(at), p.len())
            };
            at += p.len();
        }
        tx.push(XdpDesc {
            addr,
            len: len as u32,
            options: 0,
        });
        Ok(true)
    }

    /// Publishes the tx ring and makes the kernel send. In copy mode the kernel transmits only
    /// inside sendto, at most a small batch per call (it answers EAGAIN while more remain), so
    /// loop a bounded number of times; frames left over go out with the next flush.
    fn kick(&mut self, chunk: u32) -> io::Result<()> {
        let Some(tx) = self.tx.as_mut() else {
            return Ok(());
        };
        tx.submit();
        let limit = TX_SIZE / 16;
        for _ in 0..limit {
            let tx = self.tx.as_ref().expect("checked above");
            if tx.outstanding() == 0 {
                break;
            }
            // SAFETY: zero-length non-blocking sendto with null buffers, as AF_XDP expects.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            // Keep the completion ring drained so the kernel can keep going.
            self.reap_with(chunk);
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                    // Out of skbs or the driver queue is busy: try again next flush.
                    Some(libc::ENOBUFS) | Some(libc::EBUSY) => break,
                    _ => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Moves finished tx chunks from the completion ring back to the free list.
    fn reap_with(&mut self, chunk: u32) {
        let Some(comp) = self.comp.as_mut() else {
            return;
        };
        let tx_start = RX_FRAMES as u64 * chunk as u64;
        let tx_end = self.umem.len() as u64;
        let n = comp.ready(u32::MAX);
        for _ in 0..n {
            let a = comp.pop();
            // Only chunk starts we could have posted go back, and the free list never grows
            // past its preallocated capacity, so this never allocates.
            let ours = a >= tx_start && a < tx_end && a.is_multiple_of(chunk as u64);
            if ours && self.tx_free.len() < TX_FRAMES as usize {
                self.tx_free.push(a);
            }
        }
        if n > 0 {
            comp.release();
        }
    }
}

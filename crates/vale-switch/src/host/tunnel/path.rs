//! The data path of a tunnel port: batches of messages for `sendmmsg` and `recvmmsg`, made
//! once when the port is opened and reused for every burst (no allocation, one system call
//! per batch each way).
//!
//! A frame with offload work (a partial checksum, a TCP or UDP segment of up to 64 KiB from a
//! TAP or vhost-user port) is finished by the switch's own [`Resolver`] into a scratch arena
//! beside the batch, as `[tunnel header + inner frame] × N`: each inner frame written straight
//! behind room for its header ([`Encap`]), its payload read from the ring slots where the
//! frame lies (one copy in user space). It goes into the same batch as
//! one message per remote with a `UDP_SEGMENT` control message ([`gso`]): the order of the
//! frames of a burst is kept, and a 64 KiB segment crosses the kernel's UDP send path once or
//! twice, not forty times. Frames without offload work are sent from where they lie in the
//! ring, as before.

pub mod direct;

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use super::super::TxSide;
use super::gso::{self, Cmsg, MAX_GSO_SEGMENTS};
use super::merge::{self, Held, MAX_MERGED_LEN};
use super::wire::{Bad, Proto, HDR_LEN, MAX_UDP_PAYLOAD, MIN_INNER};
use super::{sock, Config, MAX_REMOTES};
use crate::lookup::{is_group, LearningBridge};
use crate::offload::{FrameSink, Offload, Resolver, GSO_ECN, GSO_NONE};

/// Messages of one `sendmmsg` (a flooded frame takes one per remote).
const TX_BATCH: usize = 256;
/// iovecs of one message: the header and up to 32 pieces of a frame.
pub const IOV_PER: usize = 33;
/// Packets of one `recvmmsg`.
const RX_BATCH: usize = 64;
/// Packets received per round before egress gets its turn.
const INGRESS_BURST: usize = 256;

/// Bytes of the scratch arena where frames with offload work are finished and encapsulated:
/// room for several 64 KiB segments per batch.
const ARENA: usize = 8 << 16;

/// Buffers of one `recvmmsg` with `UDP_GRO` on, and the bytes of each (a whole UDP payload):
/// as many as without it, 4 MiB of address space of which only what arrives is ever touched
/// (a buffer holding one small datagram costs a page).
const GRO_BATCH: usize = RX_BATCH;
const GRO_BUF: usize = 1 << 16;

const _: () = assert!(MAX_REMOTES <= TX_BATCH, "a flooded frame fits one batch");
const _: () = assert!(
    GRO_BATCH <= RX_BATCH,
    "the senders' addresses are rx_from's"
);
const _: () = assert!(
    GRO_BUF > MAX_UDP_PAYLOAD + 20,
    "a merged buffer is never truncated"
);
const _: () = assert!(ARENA >= 2 * MAX_UDP_PAYLOAD);

/// What a port dropped, by reason (shown by `list`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Received: truncated, flags, version or protocol wrong, options overrunning the packet,
    /// inner frame shorter than an Ethernet header.
    pub bad_header: u64,
    /// Received for another VNI.
    pub wrong_vni: u64,
    /// Received Geneve packets with the critical flag.
    pub critical: u64,
    /// Received from an address not in the remote list (and not learnt: `learn-remotes` off).
    pub unknown_vtep: u64,
    /// Received valid packets from a new VTEP while the port held as many learnt remotes as
    /// `learn-remotes` allows (or [`MAX_REMOTES`] in all).
    pub remotes_full: u64,
    /// Sent frames the underlay refused as too big (or beyond a UDP datagram), and received
    /// packets larger than a slot.
    pub too_big: u64,
    /// Inner source MACs not learnt (their remote at its `learn-limit`, or the table's bucket
    /// full of other remotes' live entries); the frames themselves are forwarded.
    pub not_learnt: u64,
    /// Frames to send whose offload work could not be done (headers that do not add up):
    /// dropped.
    pub bad_offload: u64,
    /// Segments of up to 64 KiB (TSO, USO) the switch handed over whole, segmented here.
    pub tso_frames: u64,
    /// `UDP_SEGMENT` sends the kernel took, and the datagrams they carried.
    pub gso_sends: u64,
    pub gso_segments: u64,
    /// 1 once the kernel refused `UDP_SEGMENT` for good (EIO, or EINVAL for segments it took
    /// one by one): the port sends every segment as a datagram of its own since.
    pub gso_off: u64,
    /// Received buffers holding several datagrams (`UDP_GRO`), and the datagrams in them.
    pub gro_buffers: u64,
    pub gro_segments: u64,
    /// Frames handed to the switch as TSO frames merged from received TCP segments, and the
    /// segments in them.
    pub merged: u64,
    pub merged_segments: u64,
}

/// The traffic of one remote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteCounters {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames to it the underlay refused, and packets from it that were dropped.
    pub drops: u64,
}

/// One remote VTEP: configured, or learnt from a valid packet (`learn-remotes`).
pub struct Remote {
    pub ip: IpAddr,
    pub counters: RemoteCounters,
    /// Learnt, not configured: forgotten once all its MACs have aged.
    pub learnt: bool,
    /// A slot in use (a learnt remote's slot is reused once it is forgotten).
    pub live: bool,
    /// Unknown and group destinations go to it (configured and learnt remotes; an EVPN
    /// port's VTEPs only once a type-3 route names them).
    pub flood: bool,
    /// When a valid packet last came from it (seconds since the port was opened).
    last_rx: u32,
}

/// The port's batches and counters. The messages point into the boxed arrays beside them,
/// which never move once made.
///
/// Remotes live in [`MAX_REMOTES`] slots made when the port opens: the configured ones first,
/// learnt ones in free slots after them. The learning table names a remote by its slot, so a
/// learnt remote's slot is reused only when none of the table's entries for it can be found
/// any more: the remote sent nothing for longer than the table's age (every entry it taught
/// is at least that old), plus a second for the sweep that empties them.
pub struct Path {
    pub counters: Counters,
    /// Seconds since the port was opened, for the table (set once per round).
    pub now_s: u32,
    proto: Proto,
    vni: u32,
    port: u16,
    /// The port's own address: never a remote (what is sent there would come back in).
    local: IpAddr,
    learn_limit: u32,
    /// Whether inner source MACs are learnt (off when a control plane sets the table).
    pub learn: bool,
    /// Most learnt remotes at once (0: packets from unknown VTEPs are dropped).
    learn_remotes: usize,
    learnt: usize,
    /// Slots in use or used before: the rest are empty.
    slots: usize,
    /// Remotes in use that floods go to (the copies of a flooded frame).
    flooding: usize,
    /// When learnt remotes were last looked at for expiry.
    expired_s: u32,
    remotes: Box<[Remote]>,
    addrs: Box<[libc::sockaddr_storage]>,
    addr_lens: Box<[libc::socklen_t]>,
    hdr: Box<[u8; HDR_LEN]>,
    tx_msgs: Box<[libc::mmsghdr]>,
    tx_iov: Box<[libc::iovec]>,
    tx_remote: Box<[u16]>,
    tx_len: Box<[u32]>,
    tx_msg_count: usize,
    tx_sets: usize,
    /// Per message: the datagrams it carries, and its `UDP_SEGMENT` size (0: none).
    tx_segs: Box<[u16]>,
    tx_gso: Box<[u16]>,
    /// Per set: its `UDP_SEGMENT` control message.
    tx_cmsg: Box<[Cmsg]>,
    /// The switch's segmenter (taken out while it writes into the path's arena).
    resolver: Option<Box<Resolver>>,
    /// Where frames with offload work are finished, encapsulated; `arena_used` bytes queued.
    arena: Box<[u8]>,
    arena_used: usize,
    /// The send being filled in the arena.
    chunk: Option<Chunk>,
    /// Whether the kernel takes `UDP_SEGMENT` (until it refuses it for good).
    gso: bool,
    /// A refused `UDP_SEGMENT` send resent one datagram per message.
    fb_msgs: Box<[libc::mmsghdr]>,
    fb_iov: Box<[libc::iovec]>,
    /// Receiving with `UDP_GRO` on ([`Path::enable_gro`]).
    gro: Option<Box<Gro>>,
    /// The frame being merged from received TCP segments, in the ring's first free slots.
    held: Option<Held>,
    rx_msgs: Box<[libc::mmsghdr]>,
    rx_iov: Box<[libc::iovec]>,
    rx_hdr: Box<[[u8; HDR_LEN]]>,
    rx_from: Box<[libc::sockaddr_storage]>,
}

/// Receiving with `UDP_GRO` on: scratch buffers of up to 64 KiB, the batch last received and
/// how far its buffers have been taken into the ring.
struct Gro {
    buf: Box<[u8]>,
    msgs: Box<[libc::mmsghdr]>,
    iov: Box<[libc::iovec]>,
    cmsg: Box<[Cmsg]>,
    /// Buffers received, the one being taken, and the offset in it of its next datagram.
    got: usize,
    next: usize,
    at: usize,
}

impl Gro {
    fn new() -> Box<Gro> {
        let mut g = Box::new(Gro {
            buf: vec![0; GRO_BATCH * GRO_BUF].into(),
            msgs: (0..GRO_BATCH).map(|_| empty_msg()).collect(),
            iov: vec![iov(std::ptr::null(), 0); GRO_BATCH].into(),
            cmsg: vec![Cmsg::zeroed(); GRO_BATCH].into(),
            got: 0,
            next: 0,
            at: 0,
        });
        for k in 0..GRO_BATCH {
            g.iov[k] = iov(g.buf[k * GRO_BUF..].as_ptr(), GRO_BUF);
        }
        g
    }
}

/// A `UDP_SEGMENT` send being filled: `count` encapsulated segments of `seg` bytes from
/// `start` in the arena, `bytes` in all (the last may be shorter, and then ends it).
#[derive(Clone, Copy, Debug)]
struct Chunk {
    start: usize,
    seg: usize,
    count: usize,
    bytes: usize,
}

/// Where the segmenter writes the frames of one frame with offload work: each into the arena
/// behind room for its tunnel header, joining the send being filled or starting one (the
/// batch sent first when the arena or the batch is full).
struct Encap<'a> {
    path: &'a mut Path,
    sock: &'a OwnedFd,
    /// The frame's destinations, and the messages they take.
    known: Option<usize>,
    count: usize,
    /// Where the frame being written starts (its tunnel header), and whether it is refused
    /// (beyond a UDP datagram: written, then forgotten).
    at: usize,
    refused: bool,
}

impl FrameSink for Encap<'_> {
    fn frame_buf(&mut self, n: usize) -> &mut [u8] {
        let p = &mut *self.path;
        let total = HDR_LEN + n;
        self.refused = total > MAX_UDP_PAYLOAD;
        if self.refused {
            p.close_chunk(self.known);
            if p.arena_used + total > ARENA {
                p.flush(self.sock);
            }
            self.at = p.arena_used;
            return &mut p.arena[self.at + HDR_LEN..self.at + total];
        }
        if let Some(c) = p.chunk {
            if !(p.gso && gso::joins(c.seg, c.count, c.bytes, total)) {
                p.close_chunk(self.known);
            }
        }
        if p.chunk.is_none() {
            if p.arena_used + MAX_UDP_PAYLOAD > ARENA
                || p.tx_sets == TX_BATCH
                || p.tx_msg_count + self.count > TX_BATCH
            {
                p.flush(self.sock);
            }
            p.chunk = Some(Chunk {
                start: p.arena_used,
                seg: total,
                count: 0,
                bytes: 0,
            });
        }
        self.at = p.arena_used;
        &mut p.arena[self.at + HDR_LEN..self.at + total]
    }

    fn done(&mut self, n: usize) {
        let p = &mut *self.path;
        if self.refused {
            p.counters.too_big += 1;
            return;
        }
        let total = HDR_LEN + n;
        let at = self.at;
        p.arena[at..at + HDR_LEN].copy_from_slice(&p.hdr[..]);
        p.arena_used = at + total;
        let c = p.chunk.as_mut().expect("frame_buf started a send");
        c.count += 1;
        c.bytes += total;
        if total < c.seg {
            // A shorter one ends it.
            p.close_chunk(self.known);
        }
    }
}

// SAFETY: the raw pointers in the messages point into this struct's own boxed arrays (or, only
// between `queue` and `flush` of one burst, into the port's ring); the struct moves to the
// port's thread as a whole and is used there alone.
unsafe impl Send for Path {}

fn empty_msg() -> libc::mmsghdr {
    // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
    unsafe { std::mem::zeroed() }
}

/// One `recvmmsg` of `msgs` without waiting, again after a signal: how many arrived, 0 when
/// nothing was there (the one path of both receive loops).
fn recv_batch(sock: &OwnedFd, msgs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    loop {
        // SAFETY: each of `msgs` is a complete message whose name, iovecs and control buffer
        // (the callers set them) point at memory of the lengths given, live for the call.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                msgs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}
/// What one [`send_step`] did with the messages it was given.
enum Sent {
    /// The first so many went out.
    Out(usize),
    /// The socket's buffer is full: none went out, nor will the rest of the batch now.
    Full,
    /// The kernel refused the first with this error (too big for the path, a `UDP_SEGMENT`
    /// it cannot do, ...); the ones after it may go.
    Refused(io::Error),
}

/// One `sendmmsg` of `msgs` without waiting, again after a signal (the one system call of
/// every send loop: the ring path's, its one-datagram-a-segment fallback, the direct path's).
/// Each caller loops over its batch with it, counting as its messages need.
fn send_step(sock: &OwnedFd, msgs: &mut [libc::mmsghdr]) -> Sent {
    loop {
        // SAFETY: each of `msgs` is a complete message whose address, iovecs and control
        // message (the callers set them) point at memory of the lengths given, live for the
        // call.
        let r = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                msgs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            return Sent::Out(r as usize);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Sent::Full,
            _ => return Sent::Refused(e),
        }
    }
}

fn iov(p: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: p as *mut libc::c_void,
        iov_len: len,
    }
}

/// Writes `bytes` at offset `at` of the frame being written into `ring`'s free slots (a
/// frame spans slots of `buf_size` bytes each). The caller made sure they are free:
/// `ring.slots_for(at + bytes.len()) <= ring.room()`.
fn write_at(ring: &TxSide, mut at: usize, mut bytes: &[u8]) {
    let bsize = ring.buf_size();
    debug_assert!(ring.slots_for(at + bytes.len()) <= ring.room());
    while !bytes.is_empty() {
        let (slot, off) = (at / bsize, at % bsize);
        let n = (bsize - off).min(bytes.len());
        // SAFETY: slot `slot` is free (see above), its buffer `bsize` bytes, `off + n <= bsize`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ring.buf(slot as u32).add(off), n) };
        (at, bytes) = (at + n, &bytes[n..]);
    }
}

/// A MAC address as the learning table keys it (first octet in the low byte).
fn mac(b: &[u8; 6]) -> u64 {
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], 0, 0])
}

/// The destination MAC of a frame in `pieces` (at least 6 bytes together).
fn dst_mac(pieces: &[&[u8]]) -> u64 {
    let mut m = [0u8; 6];
    let mut n = 0;
    for p in pieces {
        let take = p.len().min(6 - n);
        m[n..n + take].copy_from_slice(&p[..take]);
        n += take;
        if n == 6 {
            break;
        }
    }
    mac(&m)
}

fn errno(e: libc::c_int) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl Path {
    pub fn new(cfg: &Config) -> Path {
        let unspecified = if cfg.local.is_ipv4() {
            IpAddr::from([0u8; 4])
        } else {
            IpAddr::from([0u8; 16])
        };
        let (mut addrs, mut lens) = (Vec::new(), Vec::new());
        let mut remotes = Vec::new();
        for i in 0..MAX_REMOTES {
            let r = cfg.remotes.get(i);
            let (a, l) = sock::sockaddr(std::net::SocketAddr::new(
                r.map_or(unspecified, |r| r.ip()),
                cfg.local.port(),
            ));
            addrs.push(a);
            lens.push(l);
            remotes.push(Remote {
                ip: r.map_or(unspecified, |r| r.ip()),
                counters: RemoteCounters::default(),
                learnt: false,
                live: r.is_some(),
                flood: r.is_some(),
                last_rx: 0,
            });
        }
        let mut p = Path {
            counters: Counters::default(),
            now_s: 0,
            proto: cfg.proto,
            vni: cfg.vni,
            port: cfg.local.port(),
            local: cfg.local.ip(),
            learn_limit: cfg.learn_limit,
            learn_remotes: cfg.learn_remotes,
            learnt: 0,
            slots: cfg.remotes.len(),
            learn: !cfg.evpn,
            flooding: cfg.remotes.len(),
            expired_s: 0,
            remotes: remotes.into(),
            addrs: addrs.into(),
            addr_lens: lens.into(),
            hdr: Box::new(cfg.proto.header(cfg.vni)),
            tx_msgs: (0..TX_BATCH).map(|_| empty_msg()).collect(),
            tx_iov: vec![iov(std::ptr::null(), 0); TX_BATCH * IOV_PER].into(),
            tx_remote: vec![0; TX_BATCH].into(),
            tx_len: vec![0; TX_BATCH].into(),
            tx_msg_count: 0,
            tx_sets: 0,
            tx_segs: vec![0; TX_BATCH].into(),
            tx_gso: vec![0; TX_BATCH].into(),
            tx_cmsg: vec![Cmsg::zeroed(); TX_BATCH].into(),
            resolver: Some(Box::new(Resolver::new())),
            arena: vec![0; ARENA].into(),
            arena_used: 0,
            chunk: None,
            gso: true,
            fb_msgs: (0..MAX_GSO_SEGMENTS).map(|_| empty_msg()).collect(),
            fb_iov: vec![iov(std::ptr::null(), 0); MAX_GSO_SEGMENTS].into(),
            gro: None,
            held: None,
            rx_msgs: (0..RX_BATCH).map(|_| empty_msg()).collect(),
            rx_iov: vec![iov(std::ptr::null(), 0); 2 * RX_BATCH].into(),
            rx_hdr: vec![[0; HDR_LEN]; RX_BATCH].into(),
            // SAFETY: all-zero is a valid sockaddr_storage.
            rx_from: (0..RX_BATCH)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
        };
        // The header iovecs never change.
        for k in 0..RX_BATCH {
            p.rx_iov[2 * k] = iov(p.rx_hdr[k].as_ptr(), HDR_LEN);
        }
        p
    }

    /// Turns on `UDP_GRO` on the port's socket, if the kernel has it: datagrams of one flow
    /// may then be received merged, and are split again here.
    pub fn enable_gro(&mut self, sock: &OwnedFd) {
        if gso::enable_gro(sock) {
            self.gro = Some(Gro::new());
        }
    }

    /// The remotes in use, configured ones first.
    pub fn remotes(&self) -> impl Iterator<Item = &Remote> {
        self.remotes[..self.slots].iter().filter(|r| r.live)
    }

    /// Adds `ip` as a learnt remote, if the port may learn one more. Its slot.
    fn learn_remote(&mut self, ip: IpAddr) -> Option<usize> {
        if self.learnt >= self.learn_remotes || ip == self.local {
            return None;
        }
        let slot = self.remotes[..self.slots]
            .iter()
            .position(|r| !r.live)
            .or((self.slots < MAX_REMOTES).then_some(self.slots))?;
        let (a, l) = sock::sockaddr(std::net::SocketAddr::new(ip, self.port));
        self.addrs[slot] = a;
        self.addr_lens[slot] = l;
        self.remotes[slot] = Remote {
            ip,
            counters: RemoteCounters::default(),
            learnt: true,
            live: true,
            flood: true,
            last_rx: self.now_s,
        };
        self.slots = self.slots.max(slot + 1);
        self.learnt += 1;
        self.flooding += 1;
        Some(slot)
    }

    /// Forgets the learnt remotes none of whose table entries can be found any more (see
    /// [`Path`]); looks once a second.
    fn expire(&mut self, max_age_s: u32) {
        if self.expired_s == self.now_s || self.learnt == 0 {
            return;
        }
        self.expired_s = self.now_s;
        let now = self.now_s;
        for r in self.remotes[..self.slots].iter_mut() {
            if r.live && r.learnt && now.wrapping_sub(r.last_rx) > max_age_s.saturating_add(1) {
                r.live = false;
                self.learnt -= 1;
                if std::mem::take(&mut r.flood) {
                    self.flooding -= 1;
                }
            }
        }
    }

    /// Sets slot `slot` to remote `to` (a control plane's VTEP: not flooded to until
    /// [`Path::set_flood`] says; its counters start again), or empties it (`None`). Between
    /// bursts only: no frame may be queued.
    pub fn set_remote(&mut self, slot: usize, to: Option<SocketAddr>) {
        self.set_flood(slot as u16, false);
        let old = &mut self.remotes[slot];
        if old.live && old.learnt {
            self.learnt -= 1;
        }
        let addr = to.unwrap_or(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0));
        (self.addrs[slot], self.addr_lens[slot]) = sock::sockaddr(addr);
        self.remotes[slot] = Remote {
            ip: addr.ip(),
            counters: RemoteCounters::default(),
            learnt: false,
            live: to.is_some(),
            flood: false,
            last_rx: self.now_s,
        };
        if to.is_some() {
            self.slots = self.slots.max(slot + 1);
        }
    }

    /// Adds slot `slot`'s remote to those floods go to, or takes it out.
    pub fn set_flood(&mut self, slot: u16, on: bool) {
        let r = &mut self.remotes[slot as usize];
        if r.live && r.flood != on {
            r.flood = on;
            if on {
                self.flooding += 1;
            } else {
                self.flooding -= 1;
            }
        }
    }

    /// The counters of slot `slot`'s remote.
    pub fn slot_counters(&self, slot: usize) -> Option<&RemoteCounters> {
        self.remotes.get(slot).map(|r| &r.counters)
    }

    /// Queues the frame in `pieces` for its remote (a learnt destination) or every remote;
    /// sends the batch first if it is full. The pieces must stay where they are until
    /// [`Path::flush`]. A frame with offload work (`off`) is finished into the arena first,
    /// parsed from a copy when `copy` (its writer may change it meanwhile).
    pub fn queue(
        &mut self,
        sock: &OwnedFd,
        table: &LearningBridge,
        pieces: &[&[u8]],
        off: Offload,
        copy: bool,
    ) -> io::Result<()> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        if len < MIN_INNER {
            self.counters.bad_header += 1;
            return Err(errno(libc::EINVAL));
        }
        if off.needs_work() {
            return self.queue_offload(sock, table, pieces, off, copy);
        }
        if len + HDR_LEN > MAX_UDP_PAYLOAD || pieces.len() >= IOV_PER {
            self.counters.too_big += 1;
            return Err(errno(libc::EMSGSIZE));
        }
        let (known, count) = self.dests(table, pieces);
        if self.tx_sets == TX_BATCH || self.tx_msg_count + count > TX_BATCH {
            self.flush(sock);
        }
        let set = self.tx_sets;
        let base = set * IOV_PER;
        self.tx_iov[base] = iov(self.hdr.as_ptr(), HDR_LEN);
        for (i, p) in pieces.iter().enumerate() {
            self.tx_iov[base + 1 + i] = iov(p.as_ptr(), p.len());
        }
        self.add_msgs(set, 1 + pieces.len(), known, len as u32, 1, 0);
        self.tx_sets += 1;
        Ok(())
    }

    /// Where the frame in `pieces` goes: its learnt remote, if any (else every remote
    /// flooded to), and how many messages that takes at most.
    fn dests(&self, table: &LearningBridge, pieces: &[&[u8]]) -> (Option<usize>, usize) {
        let dst = dst_mac(pieces);
        let known = if is_group(dst) {
            None
        } else {
            table
                .find(dst, self.now_s)
                .filter(|r| self.remotes.get(*r as usize).is_some_and(|r| r.live))
        };
        let count = if known.is_some() { 1 } else { self.flooding };
        (known.map(|r| r as usize), count)
    }

    /// Adds one message per destination (`known`, or every remote flooded to) of set `set`'s
    /// `iovlen` iovecs: `len` bytes of inner frames in `segs` datagrams, of `gso` bytes each
    /// when sent with `UDP_SEGMENT` (0: one datagram).
    fn add_msgs(
        &mut self,
        set: usize,
        iovlen: usize,
        known: Option<usize>,
        len: u32,
        segs: u16,
        gso: u16,
    ) {
        let iov_ptr = self.tx_iov[set * IOV_PER..].as_mut_ptr();
        let (control, controllen) = match gso {
            0 => (std::ptr::null_mut(), 0),
            _ => (
                &mut self.tx_cmsg[set] as *mut Cmsg as *mut libc::c_void,
                Cmsg::SPACE,
            ),
        };
        let (first, end) = known.map_or((0, self.slots), |r| (r, r + 1));
        for r in first..end {
            if !self.remotes[r].live || (known.is_none() && !self.remotes[r].flood) {
                continue;
            }
            let k = self.tx_msg_count;
            let m = &mut self.tx_msgs[k];
            m.msg_hdr.msg_name = &mut self.addrs[r] as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = self.addr_lens[r];
            m.msg_hdr.msg_iov = iov_ptr;
            m.msg_hdr.msg_iovlen = iovlen;
            m.msg_hdr.msg_control = control;
            m.msg_hdr.msg_controllen = controllen;
            m.msg_hdr.msg_flags = 0;
            self.tx_remote[k] = r as u16;
            self.tx_len[k] = len;
            self.tx_segs[k] = segs;
            self.tx_gso[k] = gso;
            self.tx_msg_count += 1;
        }
    }

    /// Finishes the offload work of the frame in `pieces` with the switch's segmenter, each
    /// resulting frame written straight into the arena behind its tunnel header ([`Encap`]).
    fn queue_offload(
        &mut self,
        sock: &OwnedFd,
        table: &LearningBridge,
        pieces: &[&[u8]],
        off: Offload,
        copy: bool,
    ) -> io::Result<()> {
        let (known, count) = self.dests(table, pieces);
        let mut resolver = self
            .resolver
            .take()
            .expect("the resolver is put back after every frame");
        let mut encap = Encap {
            path: self,
            sock,
            known,
            count,
            at: 0,
            refused: false,
        };
        let r = resolver.resolve_to(pieces, off, copy, &mut encap);
        self.resolver = Some(resolver);
        self.close_chunk(known);
        match r {
            Ok(_) => {
                if off.gso_type & !GSO_ECN != GSO_NONE {
                    self.counters.tso_frames += 1;
                }
                Ok(())
            }
            Err(e) => {
                self.counters.bad_offload += 1;
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("offload work refused: {e}"),
                ))
            }
        }
    }

    /// Queues the send being filled, one message per destination.
    fn close_chunk(&mut self, known: Option<usize>) {
        let Some(c) = self.chunk.take() else {
            return;
        };
        let set = self.tx_sets;
        self.tx_iov[set * IOV_PER] = iov(self.arena[c.start..].as_ptr(), c.bytes);
        let gso = if c.count > 1 {
            self.tx_cmsg[set] = Cmsg::segment(c.seg as u16);
            c.seg as u16
        } else {
            0
        };
        let inner = (c.bytes - c.count * HDR_LEN) as u32;
        self.add_msgs(set, 1, known, inner, c.count as u16, gso);
        self.tx_sets += 1;
    }

    /// Sends the queued messages: one `sendmmsg`, more only when the kernel refuses one (too
    /// big for the path: counted, skipped; a `UDP_SEGMENT` send it cannot do: resent one
    /// datagram per segment) or stops early.
    pub fn flush(&mut self, sock: &OwnedFd) {
        let n = self.tx_msg_count;
        let mut i = 0;
        let mut calls = 0;
        while i < n && calls < 2 * TX_BATCH {
            calls += 1;
            match send_step(sock, &mut self.tx_msgs[i..n]) {
                Sent::Out(r) => {
                    for k in i..i + r {
                        let segs = self.tx_segs[k] as u64;
                        let c = &mut self.remotes[self.tx_remote[k] as usize].counters;
                        c.tx_frames += segs;
                        c.tx_bytes += self.tx_len[k] as u64;
                        if self.tx_gso[k] != 0 {
                            self.counters.gso_sends += 1;
                            self.counters.gso_segments += segs;
                        }
                    }
                    i += r;
                }
                Sent::Full => {
                    // The rest of the batch is lost, counted.
                    for k in i..n {
                        self.remotes[self.tx_remote[k] as usize].counters.drops +=
                            self.tx_segs[k] as u64;
                    }
                    break;
                }
                Sent::Refused(err) if self.tx_gso[i] != 0 && gso::refuses_gso(&err) => {
                    self.resend_segments(sock, i, &err);
                    i += 1;
                }
                Sent::Refused(err) => {
                    let segs = self.tx_segs[i] as u64;
                    if err.raw_os_error() == Some(libc::EMSGSIZE) {
                        self.counters.too_big += segs;
                    }
                    self.remotes[self.tx_remote[i] as usize].counters.drops += segs;
                    i += 1;
                }
            }
        }
        self.tx_msg_count = 0;
        self.tx_sets = 0;
        self.arena_used = 0;
    }

    /// Sends the segments of `UDP_SEGMENT` message `i`, which the kernel refused with `err`,
    /// one datagram each. Unless some were too big for the path (the reason for an EINVAL
    /// then), the kernel cannot segment here: the port stops asking (counted once).
    fn resend_segments(&mut self, sock: &OwnedFd, i: usize, err: &io::Error) {
        let m = &self.tx_msgs[i].msg_hdr;
        // SAFETY: a message queued by `close_chunk` has one iovec, into the arena.
        let (base, bytes) = unsafe { ((*m.msg_iov).iov_base as *const u8, (*m.msg_iov).iov_len) };
        let (name, namelen) = (m.msg_name, m.msg_namelen);
        let mut n = 0;
        for (at, len) in gso::pieces(bytes, self.tx_gso[i] as usize).take(MAX_GSO_SEGMENTS) {
            // SAFETY: `at + len <= bytes`, inside the message's arena bytes.
            self.fb_iov[n] = iov(unsafe { base.add(at) }, len);
            let f = &mut self.fb_msgs[n];
            f.msg_hdr.msg_name = name;
            f.msg_hdr.msg_namelen = namelen;
            f.msg_hdr.msg_iov = &mut self.fb_iov[n];
            f.msg_hdr.msg_iovlen = 1;
            n += 1;
        }
        let remote = self.tx_remote[i] as usize;
        let (mut j, mut calls, mut too_big) = (0, 0, false);
        while j < n && calls < 2 * MAX_GSO_SEGMENTS {
            calls += 1;
            let c = &mut self.remotes[remote].counters;
            match send_step(sock, &mut self.fb_msgs[j..n]) {
                Sent::Out(r) => {
                    for k in j..j + r {
                        c.tx_frames += 1;
                        c.tx_bytes += (self.fb_iov[k].iov_len - HDR_LEN) as u64;
                    }
                    j += r;
                }
                Sent::Full => {
                    c.drops += (n - j) as u64;
                    break;
                }
                Sent::Refused(e) => {
                    if e.raw_os_error() == Some(libc::EMSGSIZE) {
                        too_big = true;
                        self.counters.too_big += 1;
                    }
                    c.drops += 1;
                    j += 1;
                }
            }
        }
        if !too_big && self.gso {
            self.gso = false;
            self.counters.gso_off = 1;
            tracing::warn!(
                "tunnel port: the kernel refused a UDP_SEGMENT send ({err}): segments of \
                 64 KiB frames are sent one datagram each from now on"
            );
        }
    }

    /// The remote `ip` is, if it is one in use.
    fn remote_of(&self, ip: IpAddr) -> Option<usize> {
        self.remotes[..self.slots]
            .iter()
            .position(|r| r.live && r.ip == ip)
    }

    /// Learns the inner source MAC of the frame of `len` bytes from `remote` written into the
    /// ring's first free slot, and commits it.
    fn take(&mut self, table: &LearningBridge, ring: &mut TxSide, remote: usize, len: usize) {
        self.take_as(table, ring, remote, len, None, 1);
    }

    /// [`Path::take`] of a frame that carries `off` and counts as `frames` received.
    fn take_as(
        &mut self,
        table: &LearningBridge,
        ring: &mut TxSide,
        remote: usize,
        len: usize,
        off: Option<Offload>,
        frames: u64,
    ) {
        let mut smac = [0u8; 6];
        // SAFETY: `len >= MIN_INNER` bytes written in the slot (a packet's check saw to it).
        unsafe { std::ptr::copy_nonoverlapping(ring.buf(0).add(6), smac.as_mut_ptr(), 6) };
        let smac = mac(&smac);
        if self.learn
            && !is_group(smac)
            && !table.learn(smac, remote as u16, self.learn_limit, self.now_s)
        {
            self.counters.not_learnt += 1;
        }
        ring.commit(len, off);
        let r = &mut self.remotes[remote];
        r.last_rx = self.now_s;
        let c = &mut r.counters;
        c.rx_frames += frames;
        c.rx_bytes += len as u64;
    }

    /// Receives packets straight into the free slots of `ring`, checks them, learns their
    /// inner source MACs and commits their inner frames. How many were committed. With
    /// `UDP_GRO` on, through [`Path::receive_merged`].
    /// Whether received datagrams wait here for room in the ring (merged buffers not yet
    /// split, or a merged TSO frame being built): the socket may be empty while they do.
    pub fn holds(&self) -> bool {
        self.held.is_some() || self.gro.as_ref().is_some_and(|g| g.next < g.got)
    }

    pub fn receive(
        &mut self,
        sock: &OwnedFd,
        table: &LearningBridge,
        ring: &mut TxSide,
    ) -> io::Result<usize> {
        self.expire(table.max_age_s.load(std::sync::atomic::Ordering::Relaxed));
        if self.gro.is_some() {
            return self.receive_merged(sock, table, ring);
        }
        let bsize = ring.buf_size();
        let mut moved = 0;
        while moved < INGRESS_BURST {
            // One slot per packet: a slot holds the largest packet received whole.
            let want = (ring.room() as usize).min(RX_BATCH);
            if want == 0 {
                break;
            }
            for k in 0..want {
                self.rx_iov[2 * k + 1] = iov(ring.buf(k as u32), bsize);
                let m = &mut self.rx_msgs[k];
                m.msg_hdr.msg_name = &mut self.rx_from[k] as *mut _ as *mut libc::c_void;
                m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                m.msg_hdr.msg_iov = self.rx_iov[2 * k..].as_mut_ptr();
                m.msg_hdr.msg_iovlen = 2;
                m.msg_hdr.msg_control = std::ptr::null_mut();
                m.msg_hdr.msg_controllen = 0;
                m.msg_hdr.msg_flags = 0;
            }
            // Each of the `want` messages has an address buffer of its length and two iovecs:
            // its header scratch and a free slot's buffer of `bsize` bytes.
            let got = recv_batch(sock, &mut self.rx_msgs[..want])?;
            let mut committed = 0;
            for k in 0..got {
                match self.check(k) {
                    Ok((remote, opts)) => {
                        let total = self.rx_msgs[k].msg_len as usize;
                        let len = total - HDR_LEN - opts;
                        // The packet lies in the slot `k - committed` after the ring's head:
                        // its inner frame moves to the head's own slot when packets before it
                        // were dropped or options precede it.
                        let src = ring.buf((k - committed) as u32);
                        let dst = ring.buf(0);
                        if opts != 0 || src != dst {
                            // SAFETY: both inside the ring's free buffers of `bsize` bytes;
                            // `opts + len <= bsize` (the packet was not truncated).
                            unsafe { std::ptr::copy(src.add(opts), dst, len) };
                        }
                        self.take(table, ring, remote, len);
                        committed += 1;
                    }
                    Err(()) => ring.refused += 1,
                }
            }
            moved += committed;
            if got < want {
                break;
            }
        }
        Ok(moved)
    }

    /// Receives with `UDP_GRO` on: a batch of buffers of up to 64 KiB into the scratch
    /// space, each holding one datagram or several of one flow merged by the kernel; each
    /// datagram is checked as one received alone and its inner frame copied into a slot of
    /// `ring`. Buffers the ring has no room for yet wait for the next round.
    fn receive_merged(
        &mut self,
        sock: &OwnedFd,
        table: &LearningBridge,
        ring: &mut TxSide,
    ) -> io::Result<usize> {
        let bsize = ring.buf_size();
        let mut moved = 0;
        let mut g = self.gro.take().expect("receive_merged with GRO on");
        let r = loop {
            if moved >= INGRESS_BURST || ring.room() == 0 {
                break Ok(());
            }
            if g.next == g.got {
                for k in 0..GRO_BATCH {
                    let m = &mut g.msgs[k];
                    m.msg_hdr.msg_name = &mut self.rx_from[k] as *mut _ as *mut libc::c_void;
                    m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                    m.msg_hdr.msg_iov = &mut g.iov[k];
                    m.msg_hdr.msg_iovlen = 1;
                    m.msg_hdr.msg_control = &mut g.cmsg[k] as *mut Cmsg as *mut libc::c_void;
                    m.msg_hdr.msg_controllen = Cmsg::SPACE;
                    m.msg_hdr.msg_flags = 0;
                }
                // Each of the GRO_BATCH messages has an address buffer, a control buffer of the
                // length given, and one iovec onto its GRO_BUF bytes of scratch.
                let r = match recv_batch(sock, &mut g.msgs[..GRO_BATCH]) {
                    Ok(r) => r,
                    Err(e) => break Err(e),
                };
                (g.got, g.next, g.at) = (r, 0, 0);
                if r == 0 {
                    break Ok(());
                }
            }
            // Buffer `next`, from offset `at`.
            let k = g.next;
            let m = &g.msgs[k].msg_hdr;
            let total = g.msgs[k].msg_len as usize;
            let truncated = m.msg_flags & libc::MSG_TRUNC != 0;
            let seg = g.cmsg[k].gro_size(m.msg_controllen).unwrap_or(0);
            let ip = sock::ip_of(&self.rx_from[k]);
            let buf = &g.buf[k * GRO_BUF..(k + 1) * GRO_BUF];
            let from = g.at;
            if from == 0 && seg != 0 && seg < total {
                self.counters.gro_buffers += 1;
            }
            let mut done = true;
            for (at, len) in gso::pieces(total, seg).skip_while(|(at, _)| *at < from) {
                if self.held.is_none() && ring.room() == 0 {
                    (g.at, done) = (at, false);
                    break;
                }
                let piece = &buf[at..at + len];
                let hdr = &piece[..len.min(HDR_LEN)];
                // A datagram of a merged buffer is counted once: where it is dropped or taken.
                let merged = (seg != 0 && seg < total) as u64;
                let Ok((remote, opts)) = self.check_packet(ip, hdr, len, truncated) else {
                    self.counters.gro_segments += merged;
                    ring.refused += 1;
                    continue;
                };
                let inner = &piece[HDR_LEN + opts..];
                if inner.len() > bsize {
                    self.counters.gro_segments += merged;
                    self.counters.too_big += 1;
                    self.remotes[remote].counters.drops += 1;
                    ring.refused += 1;
                    continue;
                }
                let s = merge::segment(inner);
                if let (Some(h), Some(s)) = (&mut self.held, &s) {
                    // SAFETY: the held frame's headers lie in the first free slot.
                    let hdr = unsafe { std::slice::from_raw_parts(ring.buf(0), h.seg.hdr_len) };
                    if h.joins(hdr, remote, inner, s)
                        && ring.slots_for(h.len + s.payload) <= ring.room()
                    {
                        write_at(ring, h.len, &inner[s.hdr_len..]);
                        h.add(s);
                        self.counters.gro_segments += merged;
                        continue;
                    }
                }
                self.emit_held(table, ring);
                if ring.room() == 0 {
                    (g.at, done) = (at, false);
                    break;
                }
                self.counters.gro_segments += merged;
                if let Some(s) = s.filter(|_| ring.slots_for(MAX_MERGED_LEN) <= ring.room()) {
                    write_at(ring, 0, inner);
                    self.held = Some(Held::new(remote, s));
                    moved += 1;
                    continue;
                }
                // SAFETY: a free slot's buffer holds `bsize >= inner.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(inner.as_ptr(), ring.buf(0), inner.len()) };
                self.take(table, ring, remote, inner.len());
                moved += 1;
            }
            // Merged frames end with their buffer.
            self.emit_held(table, ring);
            if done {
                (g.next, g.at) = (k + 1, 0);
                if g.next == g.got && g.got < GRO_BATCH {
                    // The socket is drained.
                    g.got = 0;
                    g.next = 0;
                    break Ok(());
                }
            }
        };
        self.emit_held(table, ring);
        self.gro = Some(g);
        r.map(|()| moved)
    }

    /// Commits the frame merged so far, if any: a TSO frame when it holds several segments.
    fn emit_held(&mut self, table: &LearningBridge, ring: &mut TxSide) {
        let Some(h) = self.held.take() else {
            return;
        };
        let off = (h.count > 1).then(|| {
            // SAFETY: the held frame's headers lie in the first free slot, ours until commit.
            let hdr = unsafe { std::slice::from_raw_parts_mut(ring.buf(0), h.seg.hdr_len) };
            self.counters.merged += 1;
            self.counters.merged_segments += h.count as u64;
            h.finish(hdr)
        });
        self.take_as(table, ring, h.remote, h.len, off, h.count as u64);
    }

    /// Checks received packet `k`: its remote and the bytes of options before its inner frame,
    /// or a counted drop. A valid packet from an unknown VTEP makes it a learnt remote when
    /// the port learns remotes and has room for one more.
    fn check(&mut self, k: usize) -> Result<(usize, usize), ()> {
        let m = &self.rx_msgs[k];
        let total = m.msg_len as usize;
        let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        let ip = sock::ip_of(&self.rx_from[k]);
        let hdr = self.rx_hdr[k];
        self.check_packet(ip, &hdr[..total.min(HDR_LEN)], total, truncated)
    }

    /// Checks a packet of `total` bytes from `ip` whose first bytes (up to [`HDR_LEN`]) are
    /// `hdr`, received whole or `truncated`: as [`Path::check`].
    fn check_packet(
        &mut self,
        ip: Option<IpAddr>,
        hdr: &[u8],
        total: usize,
        truncated: bool,
    ) -> Result<(usize, usize), ()> {
        let Some(remote) = ip.and_then(|ip| self.remote_of(ip)) else {
            if self.learn_remotes == 0 || truncated {
                self.counters.unknown_vtep += 1;
                return Err(());
            }
            // Only a packet that would be taken teaches a remote.
            let Ok(opts) = self.proto.decap(hdr, total, self.vni) else {
                self.counters.unknown_vtep += 1;
                return Err(());
            };
            let local = self.local;
            let Some(ip) =
                ip.filter(|ip| !ip.is_unspecified() && !ip.is_multicast() && *ip != local)
            else {
                self.counters.unknown_vtep += 1;
                return Err(());
            };
            return match self.learn_remote(ip) {
                Some(remote) => Ok((remote, opts)),
                None => {
                    self.counters.remotes_full += 1;
                    Err(())
                }
            };
        };
        let r = if truncated {
            self.counters.too_big += 1;
            Err(())
        } else {
            self.proto.decap(hdr, total, self.vni).map_err(|b| match b {
                Bad::Header => self.counters.bad_header += 1,
                Bad::Vni => self.counters.wrong_vni += 1,
                Bad::Critical => self.counters.critical += 1,
            })
        };
        match r {
            Ok(opts) => Ok((remote, opts)),
            Err(()) => {
                self.remotes[remote].counters.drops += 1;
                Err(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(learn_remotes: usize) -> Config {
        Config {
            proto: Proto::Vxlan,
            vni: 1,
            local: "10.0.0.1:4789".parse().unwrap(),
            remotes: vec!["10.0.0.2:4789".parse().unwrap()],
            learn_limit: 16,
            learn_remotes,
            evpn: false,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn learnt_remotes_are_bounded_and_forgotten_once_their_macs_aged() {
        let mut p = Path::new(&config(2));
        assert_eq!(p.remote_of(ip("10.0.0.2")), Some(0));
        assert_eq!(p.learn_remote(ip("10.0.0.3")), Some(1));
        p.now_s = 10;
        assert_eq!(p.learn_remote(ip("10.0.0.4")), Some(2));
        assert_eq!(p.learn_remote(ip("10.0.0.5")), None, "at the bound");
        assert_eq!(
            Path::new(&config(9)).learn_remote(ip("10.0.0.1")),
            None,
            "itself"
        );
        assert_eq!(p.remotes().count(), 3);
        assert_eq!(p.flooding, 3);
        // .3 was last heard at 0, .4 at 10: with an age of 300 s, .3 goes after 301 s.
        p.now_s = 301;
        p.expire(300);
        assert_eq!(p.remotes().count(), 3, "not before the age and the sweep");
        p.now_s = 302;
        p.expire(300);
        assert_eq!(p.remote_of(ip("10.0.0.3")), None);
        assert_eq!(p.remote_of(ip("10.0.0.2")), Some(0), "configured ones stay");
        assert_eq!(p.flooding, 2);
        // Its slot is taken by the next one.
        assert_eq!(p.learn_remote(ip("10.0.0.5")), Some(1));
        assert_eq!(p.remote_of(ip("10.0.0.5")), Some(1));
        assert!(p.remotes().all(|r| r.counters == RemoteCounters::default()));
        // Without learn-remotes nothing is learnt.
        assert_eq!(Path::new(&config(0)).learn_remote(ip("10.0.0.3")), None);
    }

    /// A control plane's VTEP (EVPN) is a remote packets are taken from, flooded to only once
    /// a route says so, and gone when emptied; configured remotes stay flooded to.
    #[test]
    fn routed_remotes_are_flooded_to_only_when_set_so() {
        let mut p = Path::new(&Config {
            evpn: true,
            ..config(0)
        });
        assert!(!p.learn, "an EVPN port learns no MAC from the data plane");
        let vtep: SocketAddr = "10.0.0.7:4789".parse().unwrap();
        p.set_remote(5, Some(vtep));
        assert_eq!(p.remote_of(ip("10.0.0.7")), Some(5));
        assert_eq!(p.flooding, 1, "the configured remote only");
        p.set_flood(5, true);
        p.set_flood(5, true);
        assert_eq!(p.flooding, 2);
        p.set_remote(5, None);
        assert_eq!(p.remote_of(ip("10.0.0.7")), None);
        assert_eq!(p.flooding, 1);
        p.set_flood(5, true);
        assert_eq!(p.flooding, 1, "an empty slot is never flooded to");
        assert_eq!(p.remotes().count(), 1);
    }

    /// A TCP/IPv4 segment of `payload` bytes left to offload: segments of 1000 bytes.
    pub(super) fn tso_frame(payload: usize) -> (Vec<u8>, Offload) {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0];
        let tot = (40 + payload) as u16;
        f.extend([
            0x45,
            0,
            (tot >> 8) as u8,
            tot as u8,
            0,
            1,
            0x40,
            0,
            64,
            6,
            0,
            0,
        ]);
        f.extend([
            10, 0, 0, 1, 10, 0, 0, 2, 0x04, 0xd2, 0x14, 0x51, 0, 0, 0, 1, 0, 0, 0, 1,
        ]);
        f.extend([0x50, 0x18, 1, 0, 0, 0, 0, 0]);
        f.extend((0..payload).map(|i| i as u8));
        let off = Offload {
            flags: crate::offload::F_NEEDS_CSUM,
            gso_type: crate::offload::GSO_TCPV4,
            gso_size: 1000,
            csum_start: 34,
            csum_offset: 16,
        };
        (f, off)
    }

    /// A 10,000-byte TCP segment goes out as one `UDP_SEGMENT` send of ten datagrams, each a
    /// VXLAN header and a frame of the segment; a kernel refusing `UDP_SEGMENT` (here: a
    /// socket without UDP checksums, EINVAL) gets the same ten datagrams one by one, and the
    /// port stops asking, counted once.
    #[test]
    fn tso_frames_go_as_udp_segment_sends_or_one_datagram_each() {
        use std::os::fd::AsRawFd;
        let rx = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let port = rx.local_addr().unwrap().port();
        let cfg = Config {
            local: SocketAddr::new(ip("127.0.0.1"), port),
            remotes: vec![SocketAddr::new(ip("127.0.0.2"), port)],
            ..config(0)
        };
        let table = LearningBridge::new(64);
        let (frame, off) = tso_frame(10_000);
        let mut expect = Vec::new();
        Resolver::new()
            .resolve(&[&frame], off, false, |f| {
                let mut d = cfg.proto.header(cfg.vni).to_vec();
                d.extend_from_slice(f);
                expect.push(d);
            })
            .unwrap();
        assert_eq!(expect.len(), 10);
        for refused in [false, true] {
            let sock = sock::open(cfg.proto, cfg.vni, cfg.local).unwrap();
            if refused {
                let one: libc::c_int = 1;
                // SAFETY: a c_int option value, its size given.
                let r = unsafe {
                    libc::setsockopt(
                        sock.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_NO_CHECK,
                        &one as *const libc::c_int as *const libc::c_void,
                        4,
                    )
                };
                assert_eq!(r, 0);
            }
            let mut p = Path::new(&cfg);
            // Split in two pieces, as a frame spanning ring slots.
            let (a, b) = frame.split_at(3000);
            for _ in 0..2 {
                p.queue(&sock, &table, &[a, b], off, false).unwrap();
                p.flush(&sock);
            }
            let c = p.counters;
            assert_eq!(c.tso_frames, 2);
            assert_eq!(p.remotes[0].counters.tx_frames, 20, "refused {refused}");
            assert_eq!(p.remotes[0].counters.drops, 0);
            if refused {
                assert_eq!((c.gso_off, c.gso_sends), (1, 0), "counted once");
                assert!(!p.gso);
            } else {
                assert_eq!((c.gso_off, c.gso_sends, c.gso_segments), (0, 2, 20));
            }
            let mut buf = [0u8; 2048];
            for i in 0..20 {
                let n = rx.recv(&mut buf).expect("a datagram");
                assert_eq!(
                    &buf[..n],
                    &expect[i % 10][..],
                    "refused {refused}, datagram {i}"
                );
            }
        }
        // A frame whose offload headers do not add up is refused, counted.
        let mut p = Path::new(&cfg);
        let sock = sock::open(cfg.proto, cfg.vni, SocketAddr::new(ip("127.0.0.3"), port)).unwrap();
        let (mut bad, off) = tso_frame(5000);
        bad[16] = 0xff;
        assert!(p.queue(&sock, &table, &[&bad], off, false).is_err());
        assert_eq!(p.counters.bad_offload, 1);
        // A segment beyond a UDP datagram (65,549 bytes and the header) is counted too big and
        // not sent; the next frame goes as before.
        let (big, mut off) = tso_frame(65_495);
        off.gso_size = 65_495;
        p.queue(&sock, &table, &[&big[..9472], &big[9472..]], off, false)
            .unwrap();
        let (f, off) = tso_frame(10_000);
        p.queue(&sock, &table, &[&f], off, false).unwrap();
        p.flush(&sock);
        assert_eq!((p.counters.too_big, p.counters.tso_frames), (1, 2));
        assert_eq!(p.remotes[0].counters.tx_frames, 10);
    }

    /// What sending a 64 KiB TCP segment through the ring path costs in user space: 2,000 of
    /// them, each in ring slots of 9,472 bytes, segmented at 1,398 bytes (for a profiler:
    /// `valgrind --tool=callgrind` on this test's binary with `--ignored tso_send_cost`).
    #[test]
    #[ignore]
    fn tso_send_cost() {
        let rx = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        let port = rx.local_addr().unwrap().port();
        let cfg = Config {
            local: SocketAddr::new(ip("127.0.0.1"), port),
            remotes: vec![SocketAddr::new(ip("127.0.0.2"), port)],
            ..config(0)
        };
        let table = LearningBridge::new(64);
        let (frame, mut off) = tso_frame(65_000);
        off.gso_size = 1398;
        let pieces: Vec<&[u8]> = frame.chunks(9472).collect();
        let sock = sock::open(cfg.proto, cfg.vni, cfg.local).unwrap();
        let mut p = Path::new(&cfg);
        let t = std::time::Instant::now();
        for _ in 0..2000 {
            p.queue(&sock, &table, &pieces, off, false).unwrap();
            p.flush(&sock);
        }
        eprintln!(
            "{:.1} us a 64 KiB segment; {} datagrams",
            t.elapsed().as_secs_f64() * 1e6 / 2000.0,
            p.counters.gso_segments
        );
        assert_eq!(p.counters.tso_frames, 2000);
    }

    #[test]
    fn the_destination_mac_is_read_across_pieces() {
        let f = [2u8, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 0x88, 0xb5];
        let whole = dst_mac(&[&f]);
        assert_eq!(whole, mac(&[2, 0, 0, 0, 0, 0xb]));
        assert_eq!(dst_mac(&[&f[..1], &f[1..4], &f[4..]]), whole);
        assert!(!is_group(whole));
        assert!(is_group(dst_mac(&[&[0xffu8; 14]])));
        assert!(is_group(dst_mac(&[&[0x01, 0, 0x5e, 0, 0, 1]])));
    }
}

//! The direct path of a tunnel port: the switch's forwarding threads encapsulate and send the
//! frames of a batch themselves ([`Shared`] is the port's [`DirectSink`]), one `sendmmsg` per
//! batch, instead of copying them into the port's rx ring and waking the port's thread to send
//! them from there.
//!
//! - **One lock per batch.** The remotes, their counters and the learning table's view of them
//!   are the port's [`Path`], which its own thread (ingress, the ring path) also uses: a batch
//!   takes its mutex once, trying a few hundred times (a holder on the other CPU is about to
//!   let go). When the port's thread holds it longer (it is receiving), the sink declines the
//!   batch, whose frames go into the port's rx ring and out through the ring path
//!   ([`Path::queue`]) a moment later, in order: a forwarding thread never sleeps on the port's
//!   thread. That thread takes the lock to receive only when a datagram waits ([`readable`]),
//!   so that its wake-ups for the clock or the ring leave the forwarding threads alone.
//! - **Nothing allocated or copied per frame.** A frame is sent from where it lies in the
//!   sender's buffer: its message's iovecs are the header and the frame's pieces, in arrays made
//!   when the port opens. Only a frame whose pieces do not outlast the next frame (a segment
//!   the switch cut for this port) is copied, into a staging area of the batch.
//! - **Runs of frames in one datagram call.** Consecutive frames of one length to one remote
//!   (a stream of small frames) go in one message with `UDP_SEGMENT`: the kernel builds one
//!   socket buffer of up to [`MAX_GSO_SEGMENTS`] datagrams and runs its UDP, IP, routing and
//!   queueing code once for them, then cuts it into the same datagrams the frames would have
//!   been one by one (in the device when it can, else just before it). What the wire carries
//!   is the same packets. It needs the UDP checksum on (the kernel refuses `UDP_SEGMENT`
//!   without it); where a kernel refuses it anyway, the port sends one datagram per frame from
//!   then on (the first refused message's frames are counted as drops).
//! - **Offload work done here too.** A frame with offload work (a TCP segment of up to 64 KiB
//!   from a TAP port, a frame whose checksum is left to do: a tunnel port takes offloads as
//!   they are, see [`crate::offload`]) is finished through the port's [`Path`], as the ring
//!   path does it: the switch's segmenter writes each segment behind its tunnel header into
//!   the path's arena, and the segments of a run of such frames go out as `UDP_SEGMENT` sends
//!   in one `sendmmsg`, after the frames before the run and before those after it. A frame
//!   that could change meanwhile (a guest's) is parsed from a copy.
//!   The ring path's copy of each segment into the port's ring and the wake-up of its thread
//!   are gone: `bench/tunnel_tcp.py --no-peers` (2 vCPUs, builds alternated three times, six
//!   direction-medians each) 10.01 -> 10.64 Gbit/s median, CPU per GB unchanged (1.30).
//! - **What it leaves to the ring path.** A frame with offload work in more pieces than a
//!   message holds, and the batches of an EVPN port (whose local MACs are noted on the way
//!   out): they go through the port's thread.

use super::super::gso::{refuses_gso, Cmsg, MAX_GSO_SEGMENTS};
use super::super::sock::Sock;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Instant;

use super::super::wire::{HDR_LEN, MAX_UDP_PAYLOAD, MIN_INNER};
use super::{iov, mac, send_step, Path, Sent, IOV_PER};
use crate::lookup::{is_group, LearningBridge};
use crate::sink::{Delivered, DirectSink, OutFrames};

/// Messages of one direct `sendmmsg`.
const MSGS: usize = 256;
/// iovecs of the messages of one batch.
const IOVS: usize = 4096;
/// iovecs of one message (the kernel's `UIO_MAXIOV`).
const MAX_IOV_PER_MSG: usize = 1024;
/// Times a batch tries the port's lock before it leaves its frames to the ring.
const TRY_SPINS: usize = 256;
/// Bytes of the staging area for frames whose pieces do not last.
const STAGE: usize = 64 * 1024;

/// What a tunnel port's socket, table and [`Path`] are to the threads that share them: the
/// port's own (ingress and the ring path) and the forwarding threads (the direct path).
pub struct Shared {
    pub sock: Sock,
    pub table: LearningBridge,
    pub path: Mutex<Path>,
    batch: Mutex<Batch>,
    epoch: Instant,
    /// Runs of frames go in `UDP_SEGMENT` messages.
    gso: AtomicBool,
}

/// Locks `m`; a thread that panicked holding it left counters at worst.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(sock: Sock, table: LearningBridge, path: Path) -> Shared {
        let gso = checksums_on(&sock);
        let hdr = *path.hdr;
        Shared {
            sock,
            table,
            path: Mutex::new(path),
            batch: Mutex::new(Batch::new(hdr)),
            epoch: Instant::now(),
            gso: AtomicBool::new(gso),
        }
    }

    /// Seconds since the port was opened, the table's clock.
    pub fn now_s(&self) -> u32 {
        self.epoch.elapsed().as_secs() as u32
    }

    /// Whether runs of frames go in `UDP_SEGMENT` messages.
    pub fn gso(&self) -> bool {
        self.gso.load(Relaxed)
    }
}

/// Takes `m` if it is free, or becomes free within a few hundred spins (its holder runs on
/// another CPU and is about to let go); else none.
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    for _ in 0..TRY_SPINS {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
    None
}

/// Whether a datagram waits on `sock` (one system call, no data moved).
pub fn readable(sock: &OwnedFd) -> bool {
    // SAFETY: a zero-length peek into no buffer.
    let r = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_TRUNC,
        )
    };
    r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
}

/// Whether the socket sends UDP checksums (`UDP_SEGMENT` needs them).
fn checksums_on(sock: &OwnedFd) -> bool {
    let mut v: libc::c_int = 0;
    let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a c_int option value and its size.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut l,
        )
    };
    r == 0 && v == 0
}

impl DirectSink for Shared {
    fn send_batch(&self, frames: &mut dyn OutFrames, _flow: u32) -> Delivered {
        let mut d = Delivered::default();
        let Some(mut path) = try_lock(&self.path) else {
            // The port's thread is receiving: the batch goes through the ring.
            d.declined = true;
            return d;
        };
        let mut b = lock(&self.batch);
        path.now_s = self.now_s();
        b.gso = self.gso();
        let copy = frames.shared();
        // Frames with offload work are finished into the path's own messages (the batch's
        // hold the others); whichever holds the latest frames goes out before the other
        // takes more, so the wire keeps the batch's order.
        let mut in_path = false;
        while let Some(f) = frames.next_frame() {
            let len = f.len as usize;
            let pieces = &f.iov[1..];
            if f.offload.needs_work() {
                if pieces.len() >= IOV_PER {
                    // The ring path takes it (and those after it, in order).
                    frames.put_back();
                    d.declined = true;
                    break;
                }
                // After the frames before it (the first of a run sends them). Its segments
                // are written into the path's arena, so its pieces need not last beyond this
                // frame.
                if !in_path {
                    b.flush(&self.sock, &mut path);
                }
                let mut slices: [&[u8]; IOV_PER] = [&[]; IOV_PER];
                for (s, v) in slices.iter_mut().zip(pieces) {
                    // SAFETY: each iovec names a live piece of the frame, which stays put
                    // until the next frame is taken.
                    *s = unsafe { slice_of(v) };
                }
                // A refused frame (bad offload fields, too big) is counted by `queue`.
                match path.queue(
                    &self.sock,
                    &self.table,
                    &slices[..pieces.len()],
                    f.offload,
                    copy,
                ) {
                    Ok(()) => {
                        in_path = true;
                        d.frames += 1;
                        d.bytes += len as u64;
                    }
                    Err(_) => d.dropped += 1,
                }
                continue;
            }
            if std::mem::take(&mut in_path) {
                path.flush(&self.sock);
            }
            if len < MIN_INNER {
                path.counters.bad_header += 1;
                d.dropped += 1;
                continue;
            }
            if len + HDR_LEN > MAX_UDP_PAYLOAD || pieces.len() >= IOV_PER {
                path.counters.too_big += 1;
                d.dropped += 1;
                continue;
            }
            let dst = dst_of(pieces);
            let known = path.known(&self.table, dst);
            b.add(&self.sock, &mut path, pieces, len, known);
            let lasting = frames.lasting();
            if !lasting {
                b.stage_last(&self.sock, &mut path, len);
            }
            d.frames += 1;
            d.bytes += len as u64;
        }
        if in_path {
            path.flush(&self.sock);
        }
        b.flush(&self.sock, &mut path);
        if !b.gso {
            self.gso.store(false, Relaxed);
        }
        d
    }
}

/// The destination MAC of a frame in `pieces` (at least 6 bytes together).
fn dst_of(pieces: &[libc::iovec]) -> u64 {
    let mut m = [0u8; 6];
    let mut n = 0;
    for v in pieces {
        // SAFETY: each iovec names a live piece of the frame of its length.
        let p = unsafe { slice_of(v) };
        let take = p.len().min(6 - n);
        m[n..n + take].copy_from_slice(&p[..take]);
        n += take;
        if n == 6 {
            break;
        }
    }
    mac(&m)
}

/// The bytes an iovec names.
///
/// # Safety
/// `v` must name `iov_len` readable bytes that stay put while the slice is used.
unsafe fn slice_of<'a>(v: &libc::iovec) -> &'a [u8] {
    if v.iov_len == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) }
}

/// The messages of one direct batch, made once and reused.
struct Batch {
    msgs: Box<[libc::mmsghdr]>,
    iov: Box<[libc::iovec]>,
    cmsg: Box<[Cmsg]>,
    /// Per message: its remote's slot, its frames and their bytes, the size of each of its
    /// datagrams (header and frame), and whether it is a flooded frame's copy (never extended).
    remote: Box<[u16]>,
    frames: Box<[u16]>,
    bytes: Box<[u32]>,
    seg: Box<[u32]>,
    flood: Box<[bool]>,
    n_msgs: usize,
    /// The last messages that share one span of iovecs (a frame's copies, one per remote).
    group: usize,
    n_iov: usize,
    stage: Box<[u8]>,
    staged: usize,
    hdr: Box<[u8; HDR_LEN]>,
    /// Runs of frames to one remote share a message (`UDP_SEGMENT`).
    gso: bool,
}

// SAFETY: the raw pointers in the messages point into this struct's boxed arrays, the shared
// Path (locked while they are used) or a batch's frames, and only between `add` and `flush` of
// one batch, under the lock of the `Shared` that holds it.
unsafe impl Send for Batch {}

impl Batch {
    fn new(hdr: [u8; HDR_LEN]) -> Batch {
        // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
        let empty = || unsafe { std::mem::zeroed::<libc::mmsghdr>() };
        Batch {
            msgs: (0..MSGS).map(|_| empty()).collect(),
            iov: vec![iov(std::ptr::null(), 0); IOVS].into(),
            cmsg: vec![Cmsg::zeroed(); MSGS].into(),
            remote: vec![0; MSGS].into(),
            frames: vec![0; MSGS].into(),
            bytes: vec![0; MSGS].into(),
            seg: vec![0; MSGS].into(),
            flood: vec![false; MSGS].into(),
            n_msgs: 0,
            group: 0,
            n_iov: 0,
            stage: vec![0; STAGE].into(),
            staged: 0,
            hdr: Box::new(hdr),
            gso: true,
        }
    }

    /// Adds a frame (its `pieces`, `len` bytes) for remote `known`, or for every remote floods
    /// go to; sends what is queued first when there is no room.
    fn add(
        &mut self,
        sock: &OwnedFd,
        path: &mut Path,
        pieces: &[libc::iovec],
        len: usize,
        known: Option<usize>,
    ) {
        let seg = (HDR_LEN + len) as u32;
        let span = 1 + pieces.len();
        // Onto the last group of messages (one frame's copies, sharing its iovecs): a run of
        // frames of one size to the same remotes.
        let k = self.n_msgs.wrapping_sub(1);
        let same_remotes = self.group > 0
            && match known {
                Some(r) => !self.flood[k] && self.remote[k] as usize == r,
                None => self.flood[k],
            };
        if self.gso
            && same_remotes
            && self.seg[k] == seg
            && (self.frames[k] as usize) < MAX_GSO_SEGMENTS
            && (self.frames[k] as usize + 1) * seg as usize <= MAX_UDP_PAYLOAD
            && self.msgs[k].msg_hdr.msg_iovlen + span <= MAX_IOV_PER_MSG
            && self.n_iov + span <= IOVS
        {
            self.put_iov(pieces);
            for k in self.n_msgs - self.group..self.n_msgs {
                self.msgs[k].msg_hdr.msg_iovlen += span;
                self.frames[k] += 1;
                self.bytes[k] += len as u32;
            }
            return;
        }
        let count = if known.is_some() { 1 } else { path.flooding };
        if self.n_msgs + count > MSGS || self.n_iov + span > IOVS {
            self.flush(sock, path);
        }
        let base = self.n_iov;
        let first_msg = self.n_msgs;
        self.put_iov(pieces);
        let (first, end) = known.map_or((0, path.slots), |r| (r, r + 1));
        for r in first..end {
            let rem = &path.remotes[r];
            if !rem.live || (known.is_none() && !rem.flood) {
                continue;
            }
            let k = self.n_msgs;
            let m = &mut self.msgs[k].msg_hdr;
            m.msg_name = &mut path.addrs[r] as *mut _ as *mut libc::c_void;
            m.msg_namelen = path.addr_lens[r];
            m.msg_iov = self.iov[base..].as_mut_ptr();
            m.msg_iovlen = span;
            m.msg_control = std::ptr::null_mut();
            m.msg_controllen = 0;
            m.msg_flags = 0;
            self.remote[k] = r as u16;
            self.frames[k] = 1;
            self.bytes[k] = len as u32;
            self.seg[k] = seg;
            self.flood[k] = known.is_none();
            self.n_msgs += 1;
        }
        self.group = self.n_msgs - first_msg;
    }

    /// Appends the header and `pieces` to the iovecs.
    fn put_iov(&mut self, pieces: &[libc::iovec]) {
        self.iov[self.n_iov] = iov(self.hdr.as_ptr(), HDR_LEN);
        self.iov[self.n_iov + 1..self.n_iov + 1 + pieces.len()].copy_from_slice(pieces);
        self.n_iov += 1 + pieces.len();
    }

    /// The frame just added (`len` bytes, its pieces the last iovecs) does not outlast the
    /// next frame: copies it into the staging area and points its iovecs there.
    fn stage_last(&mut self, sock: &OwnedFd, path: &mut Path, len: usize) {
        if self.n_msgs == 0 {
            return; // sent already, or to nobody
        }
        if self.staged + len > STAGE {
            // Send what is queued, this frame included, while its pieces are still there.
            self.flush(sock, path);
            return;
        }
        // The frame's pieces are the iovecs after the last header.
        let hdr = self.hdr.as_ptr();
        let start = (0..self.n_iov)
            .rev()
            .find(|&i| self.iov[i].iov_base as *const u8 == hdr)
            .map_or(self.n_iov, |i| i + 1);
        let dst = self.staged;
        let mut at = dst;
        for v in &self.iov[start..self.n_iov] {
            // SAFETY: the frame's pieces are live until the next frame is taken.
            let s = unsafe { slice_of(v) };
            self.stage[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        self.staged = at;
        // One piece now: the rest of the frame's iovecs are emptied.
        let stage = self.stage[dst..].as_ptr();
        self.iov[start] = iov(stage, at - dst);
        for v in &mut self.iov[start + 1..self.n_iov] {
            *v = iov(std::ptr::null(), 0);
        }
    }

    /// Sends the queued messages: one `sendmmsg`, more only when the kernel refuses one (too
    /// big for the path, or `UDP_SEGMENT` refused: counted, skipped) or stops early.
    fn flush(&mut self, sock: &OwnedFd, path: &mut Path) {
        let n = self.n_msgs;
        for k in 0..n {
            let m = &mut self.msgs[k].msg_hdr;
            if self.frames[k] > 1 {
                let c = &mut self.cmsg[k];
                *c = Cmsg::segment(self.seg[k] as u16);
                m.msg_control = c as *mut Cmsg as *mut libc::c_void;
                m.msg_controllen = Cmsg::SPACE as _;
            }
        }
        let mut i = 0;
        let mut calls = 0;
        while i < n && calls < 2 * MSGS {
            calls += 1;
            match send_step(sock, &mut self.msgs[i..n]) {
                Sent::Out(r) => {
                    for k in i..i + r {
                        let c = &mut path.remotes[self.remote[k] as usize].counters;
                        c.tx_frames += self.frames[k] as u64;
                        c.tx_bytes += self.bytes[k] as u64;
                    }
                    i += r;
                }
                Sent::Full => {
                    // The rest of the batch is lost, counted.
                    for k in i..n {
                        path.remotes[self.remote[k] as usize].counters.drops +=
                            self.frames[k] as u64;
                    }
                    break;
                }
                Sent::Refused(err) => {
                    if err.raw_os_error() == Some(libc::EMSGSIZE) {
                        path.counters.too_big += self.frames[i] as u64;
                    } else if self.frames[i] > 1 && refuses_gso(&err) {
                        // This kernel or socket takes no UDP_SEGMENT: one datagram a frame
                        // from now on (this message's frames are lost: their iovecs are the
                        // senders' pieces, not one buffer to cut again).
                        tracing::warn!(
                            "tunnel: UDP_SEGMENT refused ({err}), sending datagrams one by one"
                        );
                        self.gso = false;
                    }
                    path.remotes[self.remote[i] as usize].counters.drops += self.frames[i] as u64;
                    i += 1;
                }
            }
        }
        self.n_msgs = 0;
        self.group = 0;
        self.n_iov = 0;
        self.staged = 0;
    }
}

impl Path {
    /// The remote a frame to inner MAC `dst` goes to alone: a unicast MAC learnt (or set) for
    /// a remote in use; else the frame is flooded.
    pub fn known(&self, table: &LearningBridge, dst: u64) -> Option<usize> {
        if is_group(dst) {
            return None;
        }
        table
            .find(dst, self.now_s)
            .map(|r| r as usize)
            .filter(|r| self.remotes.get(*r).is_some_and(|r| r.live))
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::Duration;

    use super::super::super::{Config, TunnelDevice};
    use super::*;
    use crate::host::tunnel::wire::Proto;
    use crate::offload::Offload;
    use crate::sink::{Egress, OutFrame};

    /// A batch as the pipeline hands it over: frames in pieces; a frame that does not last
    /// lies in scratch space the next frame overwrites (as the resolver's segments do).
    struct Frames {
        frames: Vec<(Vec<Vec<u8>>, Offload, bool)>,
        next: usize,
        iov: Vec<libc::iovec>,
        scratch: Vec<u8>,
        last_lasting: bool,
    }

    impl Frames {
        fn new(frames: Vec<(Vec<Vec<u8>>, Offload, bool)>) -> Frames {
            Frames {
                frames,
                next: 0,
                iov: Vec::new(),
                scratch: vec![0; 4096],
                last_lasting: true,
            }
        }
    }

    impl OutFrames for Frames {
        fn next_frame(&mut self) -> Option<OutFrame<'_>> {
            let (pieces, off, lasting) = self.frames.get(self.next)?;
            self.next += 1;
            self.scratch.fill(0xee);
            self.iov.clear();
            self.iov.push(iov(std::ptr::null(), 0));
            let len: usize = pieces.iter().map(|p| p.len()).sum();
            if *lasting {
                for p in pieces {
                    self.iov.push(iov(p.as_ptr(), p.len()));
                }
            } else {
                self.scratch[..len].copy_from_slice(&pieces.concat());
                self.iov.push(iov(self.scratch.as_ptr(), len));
            }
            self.last_lasting = *lasting;
            Some(OutFrame {
                iov: &mut self.iov,
                offload: *off,
                len: len as u32,
            })
        }
        fn put_back(&mut self) {
            self.next -= 1;
        }
        fn lasting(&self) -> bool {
            self.last_lasting
        }
    }

    fn frame(dst: [u8; 6], len: usize, tag: u8) -> Vec<u8> {
        let mut f = vec![tag; len];
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f
    }

    /// A receiver on 127.0.0.2 and a tunnel port on 127.0.0.1 toward it (and `more` remotes
    /// before it), on a free port.
    fn pair(more: &[&str]) -> (UdpSocket, TunnelDevice) {
        let rx = UdpSocket::bind("127.0.0.2:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let port = rx.local_addr().unwrap().port();
        let mut remotes: Vec<std::net::SocketAddr> = more
            .iter()
            .map(|ip| format!("{ip}:{port}").parse().unwrap())
            .collect();
        remotes.push(format!("127.0.0.2:{port}").parse().unwrap());
        let dev = TunnelDevice::open(Config {
            proto: Proto::Vxlan,
            vni: 42,
            local: format!("127.0.0.1:{port}").parse().unwrap(),
            remotes,
            learn_limit: 16,
            learn_remotes: 0,
            evpn: false,
        })
        .unwrap();
        (rx, dev)
    }

    fn received(rx: &UdpSocket) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 70_000];
        while let Ok(n) = rx.recv(&mut buf) {
            out.push(buf[..n].to_vec());
            if out.len() > 1000 {
                break;
            }
        }
        out
    }

    /// The frames of the tests: runs of one size (to a learnt MAC and flooded), a frame in
    /// pieces, one that does not last, sizes changing.
    fn batch() -> Vec<(Vec<Vec<u8>>, Offload, bool)> {
        let known = [2, 0, 0, 0, 0, 9];
        let bcast = [0xff; 6];
        let mut v = Vec::new();
        for i in 0..70 {
            v.push((vec![frame(known, 60, i)], Offload::default(), true));
        }
        for i in 0..3 {
            v.push((vec![frame(bcast, 60, 100 + i)], Offload::default(), true));
        }
        let f = frame(known, 300, 7);
        v.push((
            vec![f[..5].to_vec(), f[5..100].to_vec(), f[100..].to_vec()],
            Offload::default(),
            true,
        ));
        v.push((vec![frame(known, 300, 8)], Offload::default(), false));
        v.push((vec![frame(known, 300, 9)], Offload::default(), false));
        v.push((vec![frame(known, 1514, 10)], Offload::default(), true));
        v.push((vec![frame(bcast, 60, 11)], Offload::default(), true));
        v
    }

    fn expected(frames: &[(Vec<Vec<u8>>, Offload, bool)]) -> Vec<Vec<u8>> {
        let hdr = Proto::Vxlan.header(42);
        frames
            .iter()
            .map(|(p, _, _)| [&hdr[..], &p.concat()].concat())
            .collect()
    }

    /// Sent by a forwarding thread or by the port's own thread, the datagrams on the wire are
    /// the same, in the same order, and counted alike.
    #[test]
    fn the_direct_and_the_ring_path_send_the_same_datagrams() {
        let frames = batch();
        let want = expected(&frames);
        let (rx, dev) = pair(&[]);
        let sh = dev.shared.clone();
        assert!(sh.gso(), "the socket sends checksums, so UDP_SEGMENT");
        assert!(!readable(&sh.sock), "nothing came in");
        sh.table.learn(mac(&[2, 0, 0, 0, 0, 9]), 0, 16, sh.now_s());
        let mut out = Frames::new(frames.clone());
        let d = sh.send_batch(&mut out, 0);
        assert_eq!(
            (d.frames, d.dropped, d.declined),
            (want.len() as u64, 0, false)
        );
        assert_eq!(received(&rx), want, "direct path");
        let mut dev = dev;
        for (pieces, off, _) in &frames {
            let p: Vec<&[u8]> = pieces.iter().map(|p| &p[..]).collect();
            assert!(matches!(dev.send(&p, *off), Ok(true)));
        }
        assert!(dev.flush().is_ok());
        assert_eq!(received(&rx), want, "ring path");
        let to = format!("127.0.0.1:{}", rx.local_addr().unwrap().port());
        rx.send_to(&want[0], to).unwrap();
        let t = std::time::Instant::now();
        while !readable(&sh.sock) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(readable(&sh.sock), "a datagram waits");
        let path = lock(&sh.path);
        let c = &path.remotes[0].counters;
        assert_eq!((c.tx_frames, c.drops), (2 * want.len() as u64, 0));
        let bytes: u64 = frames.iter().map(|(p, _, _)| p.concat().len() as u64).sum();
        assert_eq!(c.tx_bytes, 2 * bytes);
    }

    /// While the port's thread holds the path (it is receiving), a batch is declined whole:
    /// its frames go to the ring, none is lost or taken.
    #[test]
    fn a_batch_is_declined_while_the_ports_thread_holds_the_path() {
        let (rx, dev) = pair(&[]);
        let sh = dev.shared.clone();
        let mut out = Frames::new(batch());
        let held = lock(&sh.path);
        let d = sh.send_batch(&mut out, 0);
        drop(held);
        assert!(d.declined);
        assert_eq!((d.frames, d.dropped, out.next), (0, 0, 0));
        assert!(received(&rx).is_empty());
    }

    /// The datagrams the ring path sends for `frames` (the port's own thread, as before the
    /// direct path took frames with offload work).
    fn ring_path(
        dev: &mut TunnelDevice,
        frames: &[(Vec<Vec<u8>>, Offload, bool)],
        rx: &UdpSocket,
    ) -> Vec<Vec<u8>> {
        for (pieces, off, _) in frames {
            let p: Vec<&[u8]> = pieces.iter().map(|p| &p[..]).collect();
            assert!(matches!(dev.send(&p, *off), Ok(true)));
        }
        assert!(dev.flush().is_ok());
        received(rx)
    }

    /// A TCP segment of 10,000 bytes and a frame whose checksum is left to do, among frames
    /// without offload work: the direct path finishes them where they are and sends every
    /// frame in batch order, the same datagrams as the ring path, counted alike.
    #[test]
    fn frames_with_offload_work_are_finished_and_sent_in_order() {
        let (rx, mut dev) = pair(&[]);
        let sh = dev.shared.clone();
        sh.table.learn(mac(&[2, 0, 0, 0, 0, 9]), 0, 16, sh.now_s());
        let mut frames = batch();
        let (tso, off) = super::super::tests::tso_frame(10_000);
        frames.insert(5, (vec![tso[..54].to_vec(), tso[54..].to_vec()], off, true));
        let (mut csum, mut off) = super::super::tests::tso_frame(500);
        csum[..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        off.gso_type = crate::offload::GSO_NONE;
        off.gso_size = 0;
        frames.push((vec![csum], off, true));
        let mut out = Frames::new(frames.clone());
        let d = sh.send_batch(&mut out, 0);
        assert_eq!(
            (d.frames, d.dropped, d.declined),
            (frames.len() as u64, 0, false)
        );
        let direct = received(&rx);
        // 10 datagrams for the TCP segment, one for each other frame.
        assert_eq!(direct.len(), frames.len() + 9);
        assert_eq!(
            direct[..5],
            expected(&frames[..5])[..],
            "the frames before it go first"
        );
        assert_eq!(
            direct,
            ring_path(&mut dev, &frames, &rx),
            "as the ring path sends them"
        );
        let path = lock(&sh.path);
        assert_eq!(path.counters.tso_frames, 2, "one each way");
        assert_eq!(path.counters.bad_offload, 0);
        let c = &path.remotes[0].counters;
        assert_eq!((c.tx_frames, c.drops), (2 * direct.len() as u64, 0));
    }

    /// A frame with offload work in more pieces than a message holds goes back to the ring
    /// with those after it; those before it are sent. One whose offload fields do not fit the
    /// frame is a counted drop, and the frames after it go on.
    #[test]
    fn offload_frames_the_direct_path_cannot_take_are_declined_or_dropped() {
        let (rx, dev) = pair(&[]);
        let sh = dev.shared.clone();
        let (tso, off) = super::super::tests::tso_frame(3_000);
        let mut frames = batch();
        let pieces: Vec<Vec<u8>> = tso
            .chunks(tso.len() / IOV_PER + 1)
            .map(|c| c.to_vec())
            .collect();
        assert!(pieces.len() >= IOV_PER - 1);
        let mut many = pieces.clone();
        many.push(Vec::new());
        while many.len() < IOV_PER {
            many.push(Vec::new());
        }
        frames.insert(5, (many, off, true));
        let mut out = Frames::new(frames.clone());
        let d = sh.send_batch(&mut out, 0);
        assert!(d.declined);
        assert_eq!((d.frames, out.next), (5, 5));
        assert_eq!(received(&rx), expected(&frames[..5]));

        let bad = Offload {
            csum_start: 5000,
            ..off
        };
        let mut frames = batch();
        frames.insert(5, (vec![tso.clone()], bad, true));
        let mut out = Frames::new(frames.clone());
        let d = sh.send_batch(&mut out, 0);
        assert_eq!(
            (d.frames, d.dropped, d.declined),
            (frames.len() as u64 - 1, 1, false)
        );
        let mut good = frames.clone();
        good.remove(5);
        assert_eq!(received(&rx), expected(&good));
        assert_eq!(lock(&sh.path).counters.bad_offload, 1);
    }

    /// Runts and frames beyond a UDP datagram are counted drops; a remote whose sends the
    /// kernel refuses (here the broadcast address, without SO_BROADCAST) costs that remote
    /// only: its frames are counted as its drops, the next remote gets every frame.
    #[test]
    fn refused_frames_and_remotes_are_counted_drops() {
        let (rx, dev) = pair(&["255.255.255.255"]);
        let sh = dev.shared.clone();
        let bcast = [0xff; 6];
        let mut frames = vec![(vec![vec![0xffu8; 13]], Offload::default(), true)];
        frames.push((vec![frame(bcast, 65_500, 1)], Offload::default(), true));
        let good: Vec<_> = (0..5)
            .map(|i| (vec![frame(bcast, 60, i)], Offload::default(), true))
            .collect();
        frames.extend(good.iter().cloned());
        let mut out = Frames::new(frames);
        let d = sh.send_batch(&mut out, 0);
        assert_eq!((d.frames, d.dropped), (5, 2));
        assert_eq!(received(&rx), expected(&good));
        let path = lock(&sh.path);
        assert_eq!((path.counters.bad_header, path.counters.too_big), (1, 1));
        let (refused, ok) = (&path.remotes[0].counters, &path.remotes[1].counters);
        assert_eq!((refused.tx_frames, refused.drops), (0, 5));
        assert_eq!((ok.tx_frames, ok.drops), (5, 0));
        assert!(sh.gso(), "a refused remote does not turn UDP_SEGMENT off");
    }
}

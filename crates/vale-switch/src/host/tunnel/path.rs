//! The data path of a tunnel port: batches of messages for `sendmmsg` and `recvmmsg`, made
//! once when the port is opened and reused for every burst (no allocation, one system call
//! per batch each way).

pub mod direct;

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use super::super::TxSide;
use super::wire::{Bad, Proto, HDR_LEN, MAX_UDP_PAYLOAD, MIN_INNER};
use super::{sock, Config, MAX_REMOTES};
use crate::lookup::{is_group, LearningBridge};

/// Messages of one `sendmmsg` (a flooded frame takes one per remote).
const TX_BATCH: usize = 256;
/// iovecs of one message: the header and up to 32 pieces of a frame.
pub const IOV_PER: usize = 33;
/// Packets of one `recvmmsg`.
const RX_BATCH: usize = 64;
/// Packets received per round before egress gets its turn.
const INGRESS_BURST: usize = 256;

const _: () = assert!(MAX_REMOTES <= TX_BATCH, "a flooded frame fits one batch");

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
    rx_msgs: Box<[libc::mmsghdr]>,
    rx_iov: Box<[libc::iovec]>,
    rx_hdr: Box<[[u8; HDR_LEN]]>,
    rx_from: Box<[libc::sockaddr_storage]>,
}

// SAFETY: the raw pointers in the messages point into this struct's own boxed arrays (or, only
// between `queue` and `flush` of one burst, into the port's ring); the struct moves to the
// port's thread as a whole and is used there alone.
unsafe impl Send for Path {}

fn empty_msg() -> libc::mmsghdr {
    // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
    unsafe { std::mem::zeroed() }
}

fn iov(p: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: p as *mut libc::c_void,
        iov_len: len,
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
    /// [`Path::flush`].
    pub fn queue(
        &mut self,
        sock: &OwnedFd,
        table: &LearningBridge,
        pieces: &[&[u8]],
    ) -> io::Result<()> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        if len < MIN_INNER {
            self.counters.bad_header += 1;
            return Err(errno(libc::EINVAL));
        }
        if len + HDR_LEN > MAX_UDP_PAYLOAD || pieces.len() >= IOV_PER {
            self.counters.too_big += 1;
            return Err(errno(libc::EMSGSIZE));
        }
        let dst = dst_mac(pieces);
        let known = if is_group(dst) {
            None
        } else {
            table
                .find(dst, self.now_s)
                .filter(|r| self.remotes.get(*r as usize).is_some_and(|r| r.live))
        };
        let count = if known.is_some() { 1 } else { self.flooding };
        if self.tx_sets == TX_BATCH || self.tx_msg_count + count > TX_BATCH {
            self.flush(sock);
        }
        let base = self.tx_sets * IOV_PER;
        self.tx_iov[base] = iov(self.hdr.as_ptr(), HDR_LEN);
        for (i, p) in pieces.iter().enumerate() {
            self.tx_iov[base + 1 + i] = iov(p.as_ptr(), p.len());
        }
        let iov_ptr = self.tx_iov[base..].as_mut_ptr();
        let (first, end) = known.map_or((0, self.slots), |r| (r as usize, r as usize + 1));
        for r in first..end {
            if !self.remotes[r].live || (known.is_none() && !self.remotes[r].flood) {
                continue;
            }
            let m = &mut self.tx_msgs[self.tx_msg_count];
            m.msg_hdr.msg_name = &mut self.addrs[r] as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = self.addr_lens[r];
            m.msg_hdr.msg_iov = iov_ptr;
            m.msg_hdr.msg_iovlen = 1 + pieces.len();
            m.msg_hdr.msg_control = std::ptr::null_mut();
            m.msg_hdr.msg_controllen = 0;
            m.msg_hdr.msg_flags = 0;
            self.tx_remote[self.tx_msg_count] = r as u16;
            self.tx_len[self.tx_msg_count] = len as u32;
            self.tx_msg_count += 1;
        }
        self.tx_sets += 1;
        Ok(())
    }

    /// Sends the queued messages: one `sendmmsg`, more only when the kernel refuses one (too
    /// big for the path: counted, skipped) or stops early.
    pub fn flush(&mut self, sock: &OwnedFd) {
        let n = self.tx_msg_count;
        let mut i = 0;
        let mut calls = 0;
        while i < n && calls < 2 * TX_BATCH {
            calls += 1;
            // SAFETY: messages i..n are complete; each points at a live address, its iovecs,
            // and the header or frame pieces that stay put until this returns.
            let r = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    self.tx_msgs[i..].as_mut_ptr(),
                    (n - i) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                for k in i..i + r as usize {
                    let c = &mut self.remotes[self.tx_remote[k] as usize].counters;
                    c.tx_frames += 1;
                    c.tx_bytes += self.tx_len[k] as u64;
                }
                i += r as usize;
                continue;
            }
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            match e {
                libc::EINTR => continue,
                libc::EAGAIN | libc::ENOBUFS => {
                    // The socket's buffer is full: the rest of the batch is lost, counted.
                    for k in i..n {
                        self.remotes[self.tx_remote[k] as usize].counters.drops += 1;
                    }
                    break;
                }
                _ => {
                    if e == libc::EMSGSIZE {
                        self.counters.too_big += 1;
                    }
                    self.remotes[self.tx_remote[i] as usize].counters.drops += 1;
                    i += 1;
                }
            }
        }
        self.tx_msg_count = 0;
        self.tx_sets = 0;
    }

    /// The remote `ip` is, if it is one in use.
    fn remote_of(&self, ip: IpAddr) -> Option<usize> {
        self.remotes[..self.slots]
            .iter()
            .position(|r| r.live && r.ip == ip)
    }

    /// Receives packets straight into the free slots of `ring`, checks them, learns their
    /// inner source MACs and commits their inner frames. How many were committed.
    pub fn receive(
        &mut self,
        sock: &OwnedFd,
        table: &LearningBridge,
        ring: &mut TxSide,
    ) -> io::Result<usize> {
        self.expire(table.max_age_s.load(std::sync::atomic::Ordering::Relaxed));
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
            // SAFETY: `want` complete messages, each with an address buffer of its length and
            // two iovecs: its header scratch and a free slot's buffer of `bsize` bytes.
            let r = unsafe {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    self.rx_msgs.as_mut_ptr(),
                    want as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let got = r as usize;
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
                        // SAFETY: `len >= MIN_INNER` bytes written at `dst`.
                        let smac = unsafe { &*(dst.add(6) as *const [u8; 6]) };
                        let smac = mac(smac);
                        if self.learn
                            && !is_group(smac)
                            && !table.learn(smac, remote as u16, self.learn_limit, self.now_s)
                        {
                            self.counters.not_learnt += 1;
                        }
                        ring.commit(len, None);
                        committed += 1;
                        let r = &mut self.remotes[remote];
                        r.last_rx = self.now_s;
                        let c = &mut r.counters;
                        c.rx_frames += 1;
                        c.rx_bytes += len as u64;
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

    /// Checks received packet `k`: its remote and the bytes of options before its inner frame,
    /// or a counted drop. A valid packet from an unknown VTEP makes it a learnt remote when
    /// the port learns remotes and has room for one more.
    fn check(&mut self, k: usize) -> Result<(usize, usize), ()> {
        let m = &self.rx_msgs[k];
        let total = m.msg_len as usize;
        let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        let ip = sock::ip_of(&self.rx_from[k]);
        let Some(remote) = ip.and_then(|ip| self.remote_of(ip)) else {
            if self.learn_remotes == 0 || truncated {
                self.counters.unknown_vtep += 1;
                return Err(());
            }
            // Only a packet that would be taken teaches a remote.
            let hdr = &self.rx_hdr[k][..total.min(HDR_LEN)];
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
            self.proto
                .decap(&self.rx_hdr[k][..total.min(HDR_LEN)], total, self.vni)
                .map_err(|b| match b {
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

//! BGP EVPN for vxlan ports (`evpn=yes`): FRR's zebra sets the port's tables through
//! placeholder kernel devices, the way SONiC and OVN plug non-kernel data planes into FRR.
//!
//! zebra learns VNIs, local MACs and remote routes only from kernel objects over netlink. So
//! per EVPN port valed keeps, in its own network namespace, a placeholder Linux bridge
//! `vale-br<VNI>` holding a vxlan device `vale-vx<VNI>` (the port's VNI and local address,
//! `nolearning`) and one end `vale-lm<VNI>` of a veth pair (the other end `vale-lp<VNI>` stays
//! outside the bridge). zebra sees a VNI on a bridge and:
//!
//! - installs the routes of other VTEPs on the vxlan device as FDB entries, a type-2 route as
//!   `MAC dst VTEP self extern_learn`, a type-3 route (the VTEP wants flooded frames) as
//!   `00:00:00:00:00:00 dst VTEP self permanent`. valed reads them ([`Evpn::poll`]): a dump at
//!   the start, then the neighbour multicast group (`RTNLGRP_NEIGH`). A type-2 entry becomes a
//!   never-aged entry MAC → VTEP of the port's table, a type-3 entry puts the VTEP in the flood
//!   list; a deletion removes them. Data-plane learning is off on such a port.
//! - advertises the MACs on the bridge's ports as type-2 routes: valed writes the inner source
//!   MAC of each frame the port sends (the stations behind this VTEP) as a static FDB entry of
//!   `vale-lm<VNI>`, and deletes it once unseen for 300 s (the aging of Linux's vxlan).
//!
//! The placeholders never carry traffic: the vxlan device listens on `dstport + 1` (so it
//! never collides with the port's own socket on `dstport`, and remote VTEPs, which send to
//! `dstport`, never reach it), IPv6 is off on all four devices and none has an address, so the
//! kernel originates nothing that the bridge could flood to it, and nothing writes to the veth.
//!
//! Everything runs on the port's thread, between bursts: the data path records local MACs in
//! a bounded map (no system call, no allocation once full), and at most every millisecond the
//! thread drains the netlink socket and applies what changed to the table (lock-free) and the
//! remote slots ([`Path::set_remote`]); once a second it writes new local MACs, at most
//! [`WRITES_PER_S`]. Every table is bounded: remote MACs beyond [`MAX_MACS`], VTEPs beyond the
//! port's slots, local MACs beyond [`MAX_LOCAL`] are refused and counted. A lost notification
//! (the socket's buffer overran) makes the thread dump the FDB again.
//!
//! Netlink is spoken through vale-netlink (rtnetlink requests over a blocking socket, shared
//! with the CNI plugin; the few messages below): the `rtnetlink` family of crates needs an
//! async runtime, which valed's port threads do not have.
//!
//! The device names depend on the VNI only: zebra maps one VNI to one vxlan device per
//! namespace, so a second EVPN port for a VNI is refused. Devices are removed when the port
//! is detached and when valed exits; the leftovers of a valed that crashed are replaced at the
//! next attach.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use vale_netlink::{
    error_of, for_each_attr, for_each_msg, ifinfomsg, index_of, ip_of, ndmsg, u32_at, Msg, Socket,
    ACK, CREATE, DUMP, EXCL, REPLACE,
};

use super::path::Path;
use super::{Config, MAX_REMOTES};
use crate::lookup::LearningBridge;

/// Remote MACs (type-2 routes) one port takes.
pub const MAX_MACS: usize = 8192;
/// Local MACs one port advertises.
pub const MAX_LOCAL: usize = 4096;
/// Seconds a local MAC stays advertised unseen.
const LOCAL_AGE_S: u32 = 300;
/// FDB writes (local MACs added or removed) per second.
const WRITES_PER_S: usize = 512;
/// Netlink datagrams read per poll (the rest wait for the next).
const READS_PER_POLL: usize = 64;
/// The least time between two dumps of the FDB.
const DUMP_EVERY: Duration = Duration::from_secs(1);
/// The longest a dump may hold the port's thread (an FDB of 100,000 entries takes tens of
/// milliseconds; past the limit the rest of it is lost and counted).
const DUMP_LIMIT: Duration = Duration::from_secs(2);
/// How often the port's thread looks at the netlink socket.
const POLL_EVERY: Duration = Duration::from_millis(1);
/// The longest a netlink request waits for each answer.
const NL_TIMEOUT: Duration = Duration::from_secs(1);
/// The receive buffer of the netlink sockets: a burst of notifications (zebra installing a
/// large table) fits; past it the socket overruns and the FDB is dumped again.
const NL_BUFFER: usize = 4 << 20;

// Netlink constants libc lacks.
const IFLA_VXLAN_ID: u16 = 1;
const IFLA_VXLAN_LOCAL: u16 = 4;
const IFLA_VXLAN_LEARNING: u16 = 7;
const IFLA_VXLAN_PORT: u16 = 15;
const IFLA_VXLAN_LOCAL6: u16 = 17;
const VETH_INFO_PEER: u16 = 1;
const IFLA_BRPORT_LEARNING: u16 = 8;

/// What the EVPN side of a port counted (shown by `list`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Remote entries refused: MACs beyond [`MAX_MACS`] or their table bucket full, VTEPs
    /// beyond the port's slots.
    pub refused: u64,
    /// Local MACs not advertised (more than [`MAX_LOCAL`]).
    pub local_refused: u64,
    /// Netlink errors: refused writes, notifications lost (the FDB is dumped again).
    pub nl_errors: u64,
}

/// One VTEP a route names: a remote slot of the port.
#[derive(Clone, Copy)]
struct Vtep {
    ip: IpAddr,
    /// MACs behind it.
    macs: u32,
    /// In the flood list (a type-3 route).
    flood: bool,
}

/// A local MAC: when last seen, whether the FDB has it.
#[derive(Clone, Copy)]
struct Local {
    seen_s: u32,
    written: bool,
}

/// A hasher for MAC keys (already well spread; SipHash would cost more than the lookup).
#[derive(Default)]
struct MacHasher(u64);

impl Hasher for MacHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) ^ *b as u64 ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

type MacMap<V> = HashMap<u64, V, BuildHasherDefault<MacHasher>>;

/// The placeholder devices of one VNI.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Names {
    pub bridge: String,
    pub vxlan: String,
    pub port: String,
    pub peer: String,
}

impl Names {
    pub fn of(vni: u32) -> Names {
        // "vale-vx16777215" is 15 bytes: within IFNAMSIZ with its NUL.
        Names {
            bridge: format!("vale-br{vni}"),
            vxlan: format!("vale-vx{vni}"),
            port: format!("vale-lm{vni}"),
            peer: format!("vale-lp{vni}"),
        }
    }

    /// The devices to delete (the veth's peer goes with it).
    fn all(&self) -> [&str; 3] {
        [&self.vxlan, &self.port, &self.bridge]
    }
}

/// The placeholders of live EVPN ports of this valed, deleted at its exit.
static LIVE: Mutex<Vec<Names>> = Mutex::new(Vec::new());

extern "C" fn remove_at_exit() {
    let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
    if let Ok(mut s) = open_socket(0) {
        for n in &live {
            remove(&mut s, n);
        }
    }
}

/// A MAC address as the learning table keys it (first octet in the low byte).
fn key(b: &[u8; 6]) -> u64 {
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], 0, 0])
}

fn octets(k: u64) -> [u8; 6] {
    let b = k.to_le_bytes();
    [b[0], b[1], b[2], b[3], b[4], b[5]]
}

/// The source MAC of a frame in `pieces` (at least 12 bytes together).
pub fn src_mac(pieces: &[&[u8]]) -> u64 {
    let mut m = [0u8; 12];
    let mut n = 0;
    for p in pieces {
        let take = p.len().min(12 - n);
        m[n..n + take].copy_from_slice(&p[..take]);
        n += take;
        if n == 12 {
            break;
        }
    }
    key(&[m[6], m[7], m[8], m[9], m[10], m[11]])
}

/// `02:00:00:00:00:01`.
pub fn mac_text(k: u64) -> String {
    vale_netlink::mac_text(&octets(k))
}

/// The EVPN side of a port: its placeholders, netlink sockets and tables.
pub struct Evpn {
    names: Names,
    vx_index: i32,
    port_index: i32,
    /// Subscribed to neighbour notifications.
    events: Socket,
    /// Requests: dumps, FDB writes.
    req: Socket,
    /// The first slot routes may use (static remotes hold those before it).
    base: usize,
    /// Where remote VTEPs listen.
    dstport: u16,
    vteps: Vec<Option<Vtep>>,
    /// Remote MAC → slot.
    macs: MacMap<u16>,
    local: MacMap<Local>,
    /// The last source seen, and when: a burst from one station costs one map lookup a second.
    last_src: (u64, u32),
    pub counters: Counters,
    need_dump: bool,
    /// When the FDB was last dumped (at most once a second: a flood of notifications that
    /// overruns the socket again and again costs one dump a second).
    dumped: Option<Instant>,
    polled: Instant,
    slow_s: u32,
    buf: Box<[u8]>,
}

impl Evpn {
    /// Makes the placeholders of `cfg`'s VNI (replacing a crashed valed's leftovers), whose
    /// routes use the remote slots from `base` on.
    pub fn open(cfg: &Config, base: usize) -> Result<Evpn, super::super::Error> {
        let names = Names::of(cfg.vni);
        {
            // Reserved now, under one lock with the check: a concurrent attach of the VNI is
            // refused; the reservation goes if this one fails.
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            if live.contains(&names) {
                return Err(super::super::Error::busy(format!(
                    "vxlan: vni {} has an evpn port already (one per VNI: FRR maps a VNI to one \
                     vxlan device)",
                    cfg.vni
                )));
            }
            live.push(names.clone());
        }
        let (req, events, vx_index, port_index) = match Self::make(&names, cfg) {
            Ok(made) => made,
            Err(e) => {
                LIVE.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|n| *n != names);
                return Err(e);
            }
        };
        static AT_EXIT: Once = Once::new();
        // SAFETY: registers a plain extern "C" function with no arguments.
        AT_EXIT.call_once(|| unsafe {
            libc::atexit(remove_at_exit);
        });
        Ok(Evpn {
            names,
            vx_index,
            port_index,
            events,
            req,
            base,
            dstport: cfg.local.port(),
            vteps: vec![None; MAX_REMOTES - base],
            macs: MacMap::default(),
            local: {
                let mut m = MacMap::default();
                m.reserve(MAX_LOCAL);
                m
            },
            last_src: (0, 0),
            counters: Counters::default(),
            need_dump: true,
            dumped: None,
            polled: Instant::now() - POLL_EVERY,
            slow_s: 0,
            buf: vec![0u8; 1 << 16].into(),
        })
    }

    /// The sockets and the placeholders of `names`: (requests, notifications, the vxlan
    /// placeholder's index, the veth end's).
    fn make(
        names: &Names,
        cfg: &Config,
    ) -> Result<(Socket, Socket, i32, i32), super::super::Error> {
        let fail = |what: &str, e: io::Error| {
            super::super::Error::of_io(format!("vxlan evpn: {what}: {e}"), e)
        };
        let mut req = open_socket(0).map_err(|e| fail("netlink socket", e))?;
        // Subscribed before the devices exist: nothing zebra writes can be missed.
        let events = open_socket(1 << (libc::RTNLGRP_NEIGH - 1))
            .map_err(|e| fail("netlink socket for neighbour notifications", e))?;
        events
            .nonblocking()
            .map_err(|e| fail("netlink socket", e))?;
        remove(&mut req, names);
        match create(&mut req, names, cfg) {
            Ok((vx, port)) => Ok((req, events, vx, port)),
            Err(e) => {
                remove(&mut req, names);
                Err(fail(&format!("placeholder devices {}", names.bridge), e))
            }
        }
    }

    /// The data path's hook: `src`, the inner source MAC of a frame the port sends, is a
    /// station behind this VTEP. No system call; no allocation (the map is reserved whole).
    #[inline]
    pub fn sent_from(&mut self, src: u64, now_s: u32) {
        if (src, now_s) == self.last_src {
            return;
        }
        self.last_src = (src, now_s);
        if src & 1 != 0 || src == 0 {
            return; // group or null source: not a station
        }
        let full = self.local.len() >= MAX_LOCAL;
        match self.local.get_mut(&src) {
            Some(l) => l.seen_s = now_s,
            None if full => self.counters.local_refused += 1,
            None => {
                self.local.insert(
                    src,
                    Local {
                        seen_s: now_s,
                        written: false,
                    },
                );
            }
        }
    }

    /// The control plane's turn, between bursts: applies what zebra changed (at most every
    /// [`POLL_EVERY`]), and once a second writes and ages local MACs.
    pub fn poll(&mut self, path: &mut Path, table: &LearningBridge, now_s: u32) {
        if self.polled.elapsed() < POLL_EVERY {
            return;
        }
        self.polled = Instant::now();
        if self.need_dump && self.dumped.is_none_or(|t| t.elapsed() >= DUMP_EVERY) {
            self.need_dump = false;
            self.dumped = Some(Instant::now());
            self.dump(path, table, now_s);
        }
        for _ in 0..READS_PER_POLL {
            match self.events.recv(&mut self.buf, false) {
                Ok(n) => {
                    let buf = std::mem::take(&mut self.buf);
                    for_each_msg(&buf[..n], |ty, _seq, body| {
                        self.apply(ty, body, path, table, now_s)
                    });
                    self.buf = buf;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Notifications were lost: read the whole FDB again.
                    self.counters.nl_errors += 1;
                    self.need_dump = true;
                    break;
                }
                Err(_) => {
                    self.counters.nl_errors += 1;
                    break;
                }
            }
        }
        if now_s != self.slow_s {
            self.slow_s = now_s;
            self.locals(now_s);
        }
    }

    /// Reads the vxlan placeholder's FDB whole.
    fn dump(&mut self, path: &mut Path, table: &LearningBridge, now_s: u32) {
        let mut m = Msg::new(libc::RTM_GETNEIGH, DUMP);
        m.put(&ndmsg(libc::AF_BRIDGE as u8, self.vx_index, 0, 0));
        let Ok(seq) = self.req.send(m) else {
            self.counters.nl_errors += 1;
            return;
        };
        let mut buf = std::mem::take(&mut self.buf);
        // Bounded: a dump ends with NLMSG_DONE; a silent kernel times the socket out, and
        // the whole dump may take the port's thread for at most DUMP_LIMIT.
        let until = Instant::now() + DUMP_LIMIT;
        let mut finished = false;
        while !finished && Instant::now() < until {
            let n = match self.req.recv(&mut buf, true) {
                Ok(n) => n,
                Err(_) => {
                    self.counters.nl_errors += 1;
                    break;
                }
            };
            for_each_msg(&buf[..n], |ty, s, body| {
                if ty == libc::NLMSG_DONE as u16 && s == seq {
                    finished = true;
                } else if ty == libc::NLMSG_ERROR as u16 {
                    if s == seq {
                        finished = true;
                    }
                    if error_of(body) != 0 {
                        self.counters.nl_errors += 1;
                    }
                } else if s == seq {
                    self.apply(ty, body, path, table, now_s);
                }
            });
        }
        if !finished {
            self.counters.nl_errors += 1;
        }
        self.buf = buf;
    }

    /// One neighbour message (new or deleted FDB entry) of the vxlan placeholder.
    fn apply(&mut self, ty: u16, body: &[u8], path: &mut Path, table: &LearningBridge, now_s: u32) {
        let Some(n) = Neigh::parse(ty, body) else {
            return;
        };
        if n.ifindex != self.vx_index {
            return;
        }
        let (Some(mac), Some(dst)) = (n.mac, n.dst) else {
            return;
        };
        let mac = key(&mac);
        if mac == 0 {
            // Type 3: the flood list.
            if n.del {
                if let Some(slot) = self.find(dst) {
                    self.vtep(slot).flood = false;
                    path.set_flood(slot as u16, false);
                    self.release(slot, path);
                }
            } else if let Some(slot) = self.slot(dst, path) {
                if !self.vtep(slot).flood {
                    self.vtep(slot).flood = true;
                    path.set_flood(slot as u16, true);
                }
            }
            return;
        }
        if n.del {
            if self
                .find(dst)
                .is_some_and(|s| self.macs.get(&mac) == Some(&(s as u16)))
            {
                self.forget(mac, table, path);
            }
            return;
        }
        if self
            .macs
            .get(&mac)
            .is_some_and(|s| self.vteps[*s as usize - self.base].map(|v| v.ip) == Some(dst))
        {
            return; // known as it is
        }
        self.forget(mac, table, path);
        if self.macs.len() >= MAX_MACS {
            self.counters.refused += 1;
            return;
        }
        let Some(slot) = self.slot(dst, path) else {
            return;
        };
        if table.learn(mac, slot as u16, u32::MAX, now_s) {
            self.macs.insert(mac, slot as u16);
            self.vtep(slot).macs += 1;
        } else {
            self.counters.refused += 1;
            self.release(slot, path);
        }
    }

    /// Forgets remote MAC `mac`, if known.
    fn forget(&mut self, mac: u64, table: &LearningBridge, path: &mut Path) {
        if let Some(slot) = self.macs.remove(&mac) {
            table.forget(mac);
            let slot = slot as usize;
            self.vtep(slot).macs -= 1;
            self.release(slot, path);
        }
    }

    fn vtep(&mut self, slot: usize) -> &mut Vtep {
        self.vteps[slot - self.base].as_mut().expect("a used slot")
    }

    /// The slot of VTEP `ip`, if it has one.
    fn find(&self, ip: IpAddr) -> Option<usize> {
        self.vteps
            .iter()
            .position(|v| v.is_some_and(|v| v.ip == ip))
            .map(|i| i + self.base)
    }

    /// The slot of VTEP `ip`, taken now if it has none; None (counted) when all are used.
    fn slot(&mut self, ip: IpAddr, path: &mut Path) -> Option<usize> {
        if let Some(s) = self.find(ip) {
            return Some(s);
        }
        let Some(free) = self.vteps.iter().position(|v| v.is_none()) else {
            self.counters.refused += 1;
            return None;
        };
        self.vteps[free] = Some(Vtep {
            ip,
            macs: 0,
            flood: false,
        });
        let slot = free + self.base;
        path.set_remote(slot, Some(SocketAddr::new(ip, self.dstport)));
        Some(slot)
    }

    /// Frees slot `slot` once no route names it.
    fn release(&mut self, slot: usize, path: &mut Path) {
        let v = self.vtep(slot);
        if v.macs == 0 && !v.flood {
            self.vteps[slot - self.base] = None;
            path.set_remote(slot, None);
        }
    }

    /// Once a second: writes new local MACs to the placeholder bridge's FDB and deletes those
    /// unseen for [`LOCAL_AGE_S`], at most [`WRITES_PER_S`] of both.
    fn locals(&mut self, now_s: u32) {
        let mut budget = WRITES_PER_S;
        let mut gone = Vec::new();
        for (mac, l) in self.local.iter_mut() {
            if budget == 0 {
                break;
            }
            let aged = now_s.wrapping_sub(l.seen_s) >= LOCAL_AGE_S;
            if aged || !l.written {
                let ty = if aged {
                    libc::RTM_DELNEIGH
                } else {
                    libc::RTM_NEWNEIGH
                };
                if l.written || !aged {
                    budget -= 1;
                    let mut m = Msg::new(ty, libc::NLM_F_REQUEST as u16 | CREATE | REPLACE);
                    m.put(&ndmsg(
                        libc::AF_BRIDGE as u8,
                        self.port_index,
                        libc::NUD_NOARP,
                        libc::NTF_MASTER,
                    ));
                    m.attr(libc::NDA_LLADDR, &octets(*mac));
                    if self.req.send(m).is_err() {
                        self.counters.nl_errors += 1;
                    }
                }
                if aged {
                    gone.push(*mac);
                } else {
                    l.written = true;
                }
            }
        }
        for m in gone {
            self.local.remove(&m);
        }
        // Refusals of those writes (no acknowledgement is asked for: only errors come back).
        for _ in 0..READS_PER_POLL {
            let mut buf = std::mem::take(&mut self.buf);
            let r = self.req.recv(&mut buf, false);
            if let Ok(n) = r {
                for_each_msg(&buf[..n], |ty, _, body| {
                    if ty == libc::NLMSG_ERROR as u16 && error_of(body) != 0 {
                        self.counters.nl_errors += 1;
                    }
                });
            }
            self.buf = buf;
            if r.is_err() {
                break;
            }
        }
    }

    /// The netlink socket zebra's changes arrive on (the port's thread wakes on it).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.events.as_raw_fd()
    }

    /// `list`'s view: counters, the VTEPs with their traffic (`counters`, by slot), and the
    /// first entries of the table.
    pub fn shown(&self, path: &Path) -> String {
        let floods: Vec<String> = self
            .vteps
            .iter()
            .flatten()
            .filter(|v| v.flood)
            .map(|v| v.ip.to_string())
            .collect();
        let mut s = format!(
            "; evpn {}: macs {} flood [{}] local {} refused {} local-refused {} nl-errors {}",
            self.names.vxlan,
            self.macs.len(),
            floods.join(" "),
            self.local.len(),
            self.counters.refused,
            self.counters.local_refused,
            self.counters.nl_errors,
        );
        for (i, v) in self.vteps.iter().enumerate() {
            if let (Some(v), Some(c)) = (v, path.slot_counters(i + self.base)) {
                s.push_str(&format!(
                    "; vtep {}{}: macs {}, tx {} frames {} bytes, rx {} frames {} bytes, drops {}",
                    v.ip,
                    if v.flood { " flood" } else { "" },
                    v.macs,
                    c.tx_frames,
                    c.tx_bytes,
                    c.rx_frames,
                    c.rx_bytes,
                    c.drops
                ));
            }
        }
        for (mac, slot) in self.macs.iter().take(16) {
            if let Some(v) = self.vteps[*slot as usize - self.base] {
                s.push_str(&format!("; evpn-mac {} -> {}", mac_text(*mac), v.ip));
            }
        }
        s
    }
}

impl Drop for Evpn {
    fn drop(&mut self) {
        remove(&mut self.req, &self.names);
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|n| *n != self.names);
    }
}

/// A netlink socket of valed's namespace bound to multicast `groups`, with a one-second
/// receive timeout and a large receive buffer.
fn open_socket(groups: u32) -> io::Result<Socket> {
    let s = Socket::open(groups, NL_TIMEOUT)?;
    s.receive_buffer(NL_BUFFER);
    Ok(s)
}

/// Deletes the placeholders `n` (those that exist).
fn remove(s: &mut Socket, n: &Names) {
    for name in n.all() {
        let _ = s.delete_link(name);
    }
}

/// Turns IPv6 off on `name`, so that the kernel sends nothing from it.
fn no_ipv6(name: &str) {
    // Without IPv6 in the kernel the file is missing: nothing to turn off.
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
}

/// Makes the bridge, the veth pair and the vxlan device of `n`, up. Their indexes (vxlan, the
/// veth end in the bridge).
fn create(s: &mut Socket, n: &Names, cfg: &Config) -> io::Result<(i32, i32)> {
    let link = |name: &str, kind: &str| {
        let mut m = Msg::new(libc::RTM_NEWLINK, ACK | CREATE | EXCL);
        m.put(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(libc::IFLA_IFNAME, name);
        let info = m.nest(libc::IFLA_LINKINFO);
        m.attr(libc::IFLA_INFO_KIND, kind.as_bytes());
        (m, info)
    };
    let (mut m, info) = link(&n.bridge, "bridge");
    m.end(info);
    s.request(m)?;
    no_ipv6(&n.bridge);
    let br = index_of(&n.bridge)?;

    let (mut m, info) = link(&n.port, "veth");
    let data = m.nest(libc::IFLA_INFO_DATA);
    let peer = m.nest(VETH_INFO_PEER);
    m.put(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
    m.attr_str(libc::IFLA_IFNAME, &n.peer);
    m.end(peer);
    m.end(data);
    m.end(info);
    m.attr(libc::IFLA_MASTER, &(br as u32).to_ne_bytes());
    s.request(m)?;
    no_ipv6(&n.port);
    no_ipv6(&n.peer);

    let (mut m, info) = link(&n.vxlan, "vxlan");
    let data = m.nest(libc::IFLA_INFO_DATA);
    m.attr(IFLA_VXLAN_ID, &cfg.vni.to_ne_bytes());
    match cfg.local.ip() {
        IpAddr::V4(a) => m.attr(IFLA_VXLAN_LOCAL, &a.octets()),
        IpAddr::V6(a) => m.attr(IFLA_VXLAN_LOCAL6, &a.octets()),
    }
    m.attr(
        IFLA_VXLAN_PORT,
        &placeholder_port(cfg.local.port()).to_be_bytes(),
    );
    m.attr(IFLA_VXLAN_LEARNING, &[0]);
    m.end(data);
    m.end(info);
    m.attr(libc::IFLA_MASTER, &(br as u32).to_ne_bytes());
    s.request(m)?;
    no_ipv6(&n.vxlan);
    let vx = index_of(&n.vxlan)?;
    let port = index_of(&n.port)?;

    // No learning on the bridge port either (as FRR's recipe has it).
    let mut m = Msg::new(libc::RTM_SETLINK, ACK);
    m.put(&ifinfomsg(libc::AF_BRIDGE as u8, vx, 0, 0));
    let p = m.nest(libc::IFLA_PROTINFO | libc::NLA_F_NESTED as u16);
    m.attr(IFLA_BRPORT_LEARNING, &[0]);
    m.end(p);
    s.request(m)?;

    for name in [&n.peer, &n.port, &n.vxlan, &n.bridge] {
        s.up(index_of(name)?)?;
    }
    Ok((vx, port))
}

/// The UDP port of the vxlan placeholder: next to the port's own, never the same.
pub fn placeholder_port(dstport: u16) -> u16 {
    if dstport == u16::MAX {
        dstport - 1
    } else {
        dstport + 1
    }
}

/// An AF_BRIDGE neighbour (FDB) message.
#[derive(Debug, PartialEq)]
struct Neigh {
    del: bool,
    ifindex: i32,
    mac: Option<[u8; 6]>,
    dst: Option<IpAddr>,
}

impl Neigh {
    fn parse(ty: u16, body: &[u8]) -> Option<Neigh> {
        let del = match ty {
            libc::RTM_NEWNEIGH => false,
            libc::RTM_DELNEIGH => true,
            _ => return None,
        };
        if body.len() < 12 || body[0] != libc::AF_BRIDGE as u8 {
            return None;
        }
        let mut n = Neigh {
            del,
            ifindex: u32_at(body, 4) as i32,
            mac: None,
            dst: None,
        };
        for_each_attr(&body[12..], |t, d| match (t, d.len()) {
            (libc::NDA_LLADDR, 6) => n.mac = Some([d[0], d[1], d[2], d[3], d[4], d[5]]),
            (libc::NDA_DST, _) => n.dst = ip_of(d).or(n.dst),
            _ => {}
        });
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_ifnamsiz_and_ports_differ() {
        let n = Names::of((1 << 24) - 1);
        for name in [&n.bridge, &n.vxlan, &n.port, &n.peer] {
            assert!(name.len() <= 15, "{name}");
        }
        assert_eq!(placeholder_port(4789), 4790);
        assert_eq!(placeholder_port(65535), 65534);
    }

    #[test]
    fn a_withdrawn_mac_is_forgotten() {
        let t = LearningBridge::new(64);
        let m = key(&[2, 0, 0, 0, 0, 9]);
        assert!(t.learn(m, 3, u32::MAX, 0));
        assert_eq!(t.find(m, 0), Some(3));
        assert!(t.forget(m));
        assert_eq!(t.find(m, 0), None);
        assert!(!t.forget(m));
        assert_eq!(t.len(0), 0);
    }

    #[test]
    fn neighbour_messages_parse() {
        let mut m = Msg::new(libc::RTM_NEWNEIGH, 0);
        m.put(&ndmsg(
            libc::AF_BRIDGE as u8,
            7,
            libc::NUD_NOARP,
            libc::NTF_SELF,
        ));
        m.attr(libc::NDA_LLADDR, &[2, 0, 0, 0, 0, 9]);
        m.attr(libc::NDA_DST, &[192, 0, 2, 2]);
        let mut m2 = Msg::new(libc::RTM_DELNEIGH, 0);
        m2.put(&ndmsg(libc::AF_BRIDGE as u8, 7, 0, 0));
        m2.attr(libc::NDA_LLADDR, &[0; 6]);
        m2.attr(
            libc::NDA_DST,
            &[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        );
        let mut buf = m.finish(1);
        buf.extend(m2.finish(2));
        // A truncated tail is ignored.
        buf.extend([40, 0, 0, 0, 28, 0]);
        let mut got = Vec::new();
        for_each_msg(&buf, |ty, _, body| got.push(Neigh::parse(ty, body)));
        assert_eq!(
            got,
            vec![
                Some(Neigh {
                    del: false,
                    ifindex: 7,
                    mac: Some([2, 0, 0, 0, 0, 9]),
                    dst: Some("192.0.2.2".parse().unwrap()),
                }),
                Some(Neigh {
                    del: true,
                    ifindex: 7,
                    mac: Some([0; 6]),
                    dst: Some("fd00::2".parse().unwrap()),
                }),
            ]
        );
        assert_eq!(mac_text(key(&[2, 0, 0, 0, 0, 9])), "02:00:00:00:00:09");
    }
}

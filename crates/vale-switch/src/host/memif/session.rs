//! A memif client's control connection: the handshake, from valed's side (the server's).
//!
//! valed listens at the port's `SOCK_SEQPACKET` socket; on a connection it says HELLO (the
//! version, 2.0, and how many regions, rings and descriptors it takes). The client answers
//! INIT (version, interface id, mode), then one ADD_REGION per shared-memory region (its file
//! descriptor attached), one ADD_RING per ring each way (its interrupt eventfd attached), and
//! CONNECT; valed answers each with ACK and the last with CONNECTED. Either side may say
//! DISCONNECT (with a reason) at any time; valed does before it closes a connection it ends.
//!
//! Everything the client says is checked as it comes, and the first thing wrong ends the
//! connection with a DISCONNECT that names it: a message that is not 128 bytes, an unknown
//! or out-of-turn type, another version or id, a mode other than Ethernet, a region out of
//! turn or larger than its file (or than [`MAX_REGION_BYTES`]), a ring whose index, region,
//! offset or size is out of range, a ring or region without its descriptor, a descriptor that
//! is not an eventfd, rings that do not start at 0 or do not follow each other, a ring
//! without memif's cookie. A message comes with at most one descriptor; extra ones are
//! closed. A client that does not finish the handshake within [`HANDSHAKE_TIME`] is let go.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::super::guard::Guarded;
use super::error::Error;
use super::ring::{Mapping, Regions, Ring};
use super::wire::{self, msg, Msg, MSG_LEN};
use super::MAX_PAIRS;

/// Regions a client may add (DPDK's zero-copy mode adds one per memory segment).
pub const MAX_REGIONS: usize = 64;
/// Largest region valed maps.
pub const MAX_REGION_BYTES: u64 = 16 << 30;
/// Largest ring: `1 << 14` descriptors, as DPDK.
pub const MAX_LOG2_RING: u8 = 14;
/// Time from the connection to CONNECT.
pub const HANDSHAKE_TIME: Duration = Duration::from_secs(5);
/// Messages handled per call of [`Conn::serve`] before the data path gets its turn.
const MESSAGES_PER_TURN: usize = 32;

/// A ring as ADD_RING described it.
struct Announced {
    region: u16,
    offset: u32,
    log2: u8,
    irq: OwnedFd,
}

/// Where the handshake is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// HELLO said, INIT awaited.
    Init,
    /// Regions and rings, then CONNECT.
    Setup,
    Connected,
}

/// The client's memory and rings, once connected.
pub struct Live {
    pub regions: Regions,
    pub c2s: Vec<Ring>,
    pub s2c: Vec<Ring>,
    /// The client's name and its interface's, as it said (for `vale-ctl list`).
    pub client: String,
    pub if_name: String,
}

/// What came of serving the connection.
pub enum Served {
    /// Nothing to report (yet).
    Pending,
    /// CONNECT: the client's memory is mapped and its rings checked.
    Connected(Live),
    /// The connection ended: the client said so or hung up (`None`), or it broke the protocol
    /// (the reason, said to it in a DISCONNECT).
    Closed(Option<Error>),
}

/// One control connection.
pub struct Conn {
    pub sock: OwnedFd,
    phase: Phase,
    since: Instant,
    id: u32,
    /// The port's name, said in CONNECTED.
    port: String,
    client: String,
    regions: Vec<(OwnedFd, u64)>,
    c2s: Vec<Option<Announced>>,
    s2c: Vec<Option<Announced>>,
}

impl Conn {
    /// Takes accepted connection `sock` for interface `id` and says HELLO.
    pub fn start(sock: OwnedFd, id: u32, port: &str) -> Result<Conn, Error> {
        let c = Conn {
            sock,
            phase: Phase::Init,
            since: Instant::now(),
            id,
            port: port.to_string(),
            client: String::new(),
            regions: Vec::new(),
            c2s: (0..MAX_PAIRS).map(|_| None).collect(),
            s2c: (0..MAX_PAIRS).map(|_| None).collect(),
        };
        c.send(&Msg::with(wire::Hello {
            name: wire::name_field("vale"),
            min_version: wire::VERSION,
            max_version: wire::VERSION,
            max_region: (MAX_REGIONS - 1) as u16,
            max_c2s_ring: (MAX_PAIRS - 1) as u16,
            max_s2c_ring: (MAX_PAIRS - 1) as u16,
            max_log2_ring_size: MAX_LOG2_RING,
        }))?;
        Ok(c)
    }

    /// The handshake took too long.
    pub fn overdue(&self) -> bool {
        self.phase != Phase::Connected && self.since.elapsed() > HANDSHAKE_TIME
    }

    fn send(&self, m: &Msg) -> Result<(), Error> {
        let b = m.as_bytes();
        // SAFETY: sends MSG_LEN bytes of a live buffer; never blocks (the client reads its
        // replies, one per message it sent, or is let go).
        let n = unsafe {
            libc::send(
                self.sock.as_raw_fd(),
                b.as_ptr().cast(),
                MSG_LEN,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n != MSG_LEN as isize {
            return Err(Error::last_os("cannot send to the client"));
        }
        Ok(())
    }

    /// Says DISCONNECT with `why` (best effort: the connection is closed next).
    pub fn say_disconnect(&self, why: &str) {
        let mut d = wire::Disconnect {
            code: 0,
            string: [0; 96],
        };
        let n = why.len().min(95);
        d.string[..n].copy_from_slice(&why.as_bytes()[..n]);
        let _ = self.send(&Msg::with(d));
    }

    /// Handles what the client sent (a few messages at most, then the data path's turn).
    pub fn serve(&mut self) -> Served {
        for _ in 0..MESSAGES_PER_TURN {
            let (m, fd) = match self.recv() {
                Ok(Some(r)) => r,
                Ok(None) => return Served::Pending,
                Err(Gone) => return Served::Closed(None),
            };
            let m = match m {
                Ok(m) => m,
                Err(why) => return self.refuse(why),
            };
            match self.handle(&m, fd) {
                Ok(None) => {}
                Ok(Some(live)) => return Served::Connected(live),
                Err(Refused::Said) => return Served::Closed(None),
                Err(Refused::Why(why)) => return self.refuse(why),
            }
        }
        Served::Pending
    }

    /// The client broke the protocol: the port's thread says why and closes.
    fn refuse(&self, why: Error) -> Served {
        Served::Closed(Some(why))
    }

    /// One message and the descriptor that came with it; None when there is none now; Err
    /// when the client hung up.
    #[allow(clippy::type_complexity)]
    fn recv(&self) -> Result<Option<(Result<Msg, Error>, Option<OwnedFd>)>, Gone> {
        // MSG_TRUNC: the length of a longer message is its own, not the buffer's.
        let mut buf = [0u8; MSG_LEN];
        // Room for a few descriptors: all are taken (and closed unless used).
        let mut ctl = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: msghdr is plain data; zeroed is a valid value.
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        mh.msg_control = ctl.as_mut_ptr().cast();
        mh.msg_controllen = std::mem::size_of_val(&ctl);
        // SAFETY: every pointer in `mh` is live for the call.
        let n = unsafe {
            libc::recvmsg(
                self.sock.as_raw_fd(),
                &mut mh,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC | libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(Gone),
            };
        }
        let fds = take_fds(&mh);
        if n == 0 {
            return Err(Gone);
        }
        let mut fds = fds.into_iter();
        let fd = fds.next();
        if fds.next().is_some() {
            return Ok(Some((
                Err(Error::Protocol(
                    "a message came with more than one descriptor".into(),
                )),
                None,
            )));
        }
        if n as usize != MSG_LEN {
            return Ok(Some((
                Err(Error::Protocol(format!(
                    "a message of {n} bytes (memif's are {MSG_LEN})"
                ))),
                None,
            )));
        }
        Ok(Some((Ok(Msg::from_bytes(&buf)), fd)))
    }

    fn ack(&self) -> Result<(), Refused> {
        self.send(&Msg::empty(msg::ACK)).map_err(Refused::Why)
    }

    /// One message of the client's, in the phase the connection is in.
    fn handle(&mut self, m: &Msg, fd: Option<OwnedFd>) -> Result<Option<Live>, Refused> {
        let kind = m.kind;
        match (self.phase, kind) {
            (_, msg::DISCONNECT) => {
                let d: wire::Disconnect = m.body();
                tracing::info!(port = %self.port, "memif client disconnects: {}", wire::field_text(&d.string));
                Err(Refused::Said)
            }
            (Phase::Init, msg::INIT) => self.init(m.body()).map(|()| None),
            (Phase::Setup, msg::ADD_REGION) => self.add_region(m.body(), fd).map(|()| None),
            (Phase::Setup, msg::ADD_RING) => self.add_ring(m.body(), fd).map(|()| None),
            (Phase::Setup, msg::CONNECT) => self.connect(m.body()).map(Some),
            (phase, kind) => why(format!(
                "unexpected message type {kind} {}",
                match phase {
                    Phase::Init => "before INIT",
                    Phase::Setup => "during setup",
                    Phase::Connected => "once connected",
                }
            )),
        }
    }

    /// INIT: the version, the interface id and the mode.
    fn init(&mut self, i: wire::Init) -> Result<(), Refused> {
        if { i.version } != wire::VERSION {
            return why(format!(
                "memif version {}.{} (valed speaks {}.{})",
                { i.version } >> 8,
                { i.version } & 0xff,
                wire::VERSION >> 8,
                wire::VERSION & 0xff
            ));
        }
        if { i.id } != self.id {
            return why(format!(
                "ID not found: {} (this port is id {})",
                { i.id },
                self.id
            ));
        }
        if i.mode != wire::MODE_ETHERNET {
            return why(format!(
                "only ethernet mode supported (not mode {})",
                i.mode
            ));
        }
        self.client = wire::field_text(&i.name);
        self.phase = Phase::Setup;
        self.ack()?;
        Ok(())
    }

    /// ADD_REGION: a file of the client's memory, checked against its size.
    fn add_region(&mut self, r: wire::AddRegion, fd: Option<OwnedFd>) -> Result<(), Refused> {
        let Some(fd) = fd else {
            return why("missing region fd".into());
        };
        let (index, size) = (r.index as usize, r.size);
        if index != self.regions.len() || index >= MAX_REGIONS {
            return why(format!(
                "invalid region index {index} (next is {}, at most {})",
                self.regions.len(),
                MAX_REGIONS - 1
            ));
        }
        if size == 0 || size > MAX_REGION_BYTES {
            return why(format!(
                "region {index} of {size} bytes (1 to {MAX_REGION_BYTES})"
            ));
        }
        let file = file_size(fd.as_raw_fd()).map_err(|source| {
            Refused::Why(Error::Io {
                what: format!("region {index}"),
                source,
            })
        })?;
        if file < size {
            return why(format!(
                "region {index} of {size} bytes in a file of {file}"
            ));
        }
        self.regions.push((fd, size));
        self.ack()?;
        Ok(())
    }

    /// ADD_RING: a ring in a region, and its interrupt eventfd.
    fn add_ring(&mut self, r: wire::AddRing, fd: Option<OwnedFd>) -> Result<(), Refused> {
        let Some(fd) = fd else {
            return why("missing interrupt fd".into());
        };
        let c2s = { r.flags } & wire::ADD_RING_FLAG_C2S != 0;
        let (index, region, offset, log2) =
            (r.index as usize, r.region, r.offset, r.log2_ring_size);
        let dir = if c2s { "C2S" } else { "S2C" };
        let list = if c2s { &mut self.c2s } else { &mut self.s2c };
        if index >= MAX_PAIRS || list[index].is_some() {
            return why(format!(
                "invalid ring index {dir} {index} (0 to {}, each once)",
                MAX_PAIRS - 1
            ));
        }
        if !(1..=MAX_LOG2_RING).contains(&log2) {
            return why(format!(
                "ring {dir} {index} of 2^{log2} descriptors (2^1 to 2^{MAX_LOG2_RING})"
            ));
        }
        let Some(&(_, rsize)) = self.regions.get(region as usize) else {
            return why(format!(
                "ring {dir} {index} in region {region}, which was not added"
            ));
        };
        if offset % 16 != 0 || offset as u64 + wire::ring::bytes(log2) > rsize {
            return why(format!(
                "ring {dir} {index} at offset {offset} of region {region} ({rsize} bytes; 16-byte aligned, {} bytes long)",
                wire::ring::bytes(log2)
            ));
        }
        if !is_eventfd(fd.as_raw_fd()) {
            return why(format!(
                "ring {dir} {index}: its interrupt fd is not an eventfd"
            ));
        }
        if !c2s {
            // valed writes it: never blocking (the client's own reads are its affair).
            set_nonblocking(fd.as_raw_fd());
        }
        list[index] = Some(Announced {
            region,
            offset,
            log2,
            irq: fd,
        });
        self.ack()?;
        Ok(())
    }

    /// CONNECT: the regions mapped and the rings found in them, then CONNECTED.
    fn connect(&mut self, c: wire::Connect) -> Result<Live, Refused> {
        let live = self
            .map(wire::field_text(&c.if_name))
            .map_err(Refused::Why)?;
        self.send(&Msg::with(wire::Connect {
            if_name: wire::name_field(&self.port),
        }))
        .map_err(Refused::Why)?;
        self.phase = Phase::Connected;
        Ok(live)
    }

    /// Maps the regions and finds the rings in them.
    fn map(&mut self, if_name: String) -> Result<Live, Error> {
        let mut maps = Vec::with_capacity(self.regions.len());
        for (i, (fd, size)) in self.regions.iter().enumerate() {
            // SAFETY: a new shared mapping of the client's file, `size` bytes (no larger than
            // the file now; if it shrinks later, the guard below catches the fault).
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    *size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::last_os(format!(
                    "cannot map region {i} ({size} bytes)"
                )));
            }
            // SAFETY: the mapping just made, unmapped by the Mapping alone.
            maps.push(unsafe { Mapping::new(p.cast(), *size) });
        }
        // Every region guarded, in the room of the client's user, or the connection refused.
        let uid = super::super::socket::peer_uid(self.sock.as_raw_fd());
        let guard = Guarded::new(uid, maps.iter().map(Mapping::range))?;
        let regions = Regions { guard, maps };
        let rings = |list: &mut Vec<Option<Announced>>, dir: &str| -> Result<Vec<Ring>, Error> {
            let n = list.iter().take_while(|r| r.is_some()).count();
            if n == 0 || list[n..].iter().any(Option::is_some) {
                return Err(Error::Protocol(format!(
                    "{dir} rings must be numbered from 0 without gaps (ring 0 missing or a gap after {n})"
                )));
            }
            let mut out = Vec::with_capacity(n);
            for (i, a) in list.iter_mut().take(n).enumerate() {
                let a = a.take().expect("counted");
                let base = regions
                    .piece(a.region, a.offset, wire::ring::bytes(a.log2) as u32)
                    .ok_or_else(|| {
                        Error::Protocol(format!("{dir} ring {i} is outside its region"))
                    })?;
                // SAFETY: the ring's bytes lie inside region `a.region` (`piece` checked),
                // aligned (checked at ADD_RING), and `regions` goes with the rings.
                let mut r = unsafe { Ring::new(base, a.log2, a.irq) };
                if r.cookie() != wire::COOKIE {
                    return Err(Error::Protocol(format!(
                        "wrong ring: {dir} ring {i} has no memif cookie"
                    )));
                }
                r.reset();
                out.push(r);
            }
            Ok(out)
        };
        let c2s = rings(&mut self.c2s, "C2S")?;
        let s2c = rings(&mut self.s2c, "S2C")?;
        Ok(Live {
            regions,
            c2s,
            s2c,
            client: std::mem::take(&mut self.client),
            if_name,
        })
    }
}

/// The client hung up.
struct Gone;

enum Refused {
    /// The client said DISCONNECT.
    Said,
    Why(Error),
}

/// The client broke the protocol as `s` says.
fn why<T>(s: String) -> Result<T, Refused> {
    Err(Refused::Why(Error::Protocol(s)))
}

/// The descriptors that came with a message, each owned (closed unless kept).
fn take_fds(mh: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // SAFETY: walks the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let n = ((*c).cmsg_len as usize - (data as usize - c as usize)) / 4;
                for k in 0..n {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(k))));
                }
            }
            c = libc::CMSG_NXTHDR(mh, c);
        }
    }
    fds
}

fn file_size(fd: RawFd) -> io::Result<u64> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and buffer.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::other(
            "not a memory file (memfd or regular file)",
        ));
    }
    Ok(st.st_size as u64)
}

fn is_eventfd(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: plain fcntl on a descriptor we hold.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

//! The emulated control device: what `open("/dev/netmap")` returns, and the requests a netmap
//! program makes on it (register a port, sync its rings, map its memory).
//!
//! A netmap descriptor is an epoll instance of our own, so the program can poll, select and
//! epoll it as it would netmap's; once bound, it watches the [`Waiter`] of the rings it was
//! bound to. Every descriptor bound to the same port in this process shares one libvale
//! [`Port`] (netmap's `valeX:Y-N` opens, one per thread): a vale port has one owner, a
//! process, and its memory is mapped once per `mmap` call from the port's memfd.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use vale::{OpenOptions, Port, PortParams, RingSet, Waiter};
use vale_abi::netmap::NIFP_RING_OFS;
use vale_abi::region::{Layout, MAX_RINGS, MAX_SLOTS, MIN_SLOTS};

use crate::abi::*;
use crate::real;

/// A port bound to a netmap descriptor.
pub struct Bound {
    pub port: Arc<Port>,
    pub waiter: Waiter,
    /// The descriptor's own memory identifier: netmap's libraries share one mapping between
    /// descriptors of equal identifiers, and each descriptor's mapping holds its own
    /// `netmap_if`, so no two descriptors may share one.
    pub mem_id: u16,
    /// This descriptor's `netmap_if`, as netmap gives each registration its own: the
    /// port's, with `ring_ofs` 0 for every ring the descriptor is not bound to (netmap's
    /// libnetmap finds a descriptor's rings that way). It lives in a private page mapped
    /// right after the region ([`NIFP_PAGE`]); its ring offsets point back into the region.
    pub nifp: Vec<u8>,
}

/// The page after the region, in each mapping of a netmap descriptor, that holds the
/// descriptor's own `netmap_if` (at `nr_offset` = the region's size).
pub const NIFP_PAGE: usize = 4096;

impl Bound {
    /// `nr_offset`: where this descriptor's `netmap_if` is in its mapping.
    pub fn nifp_offset(&self) -> u64 {
        self.port.memfd().1 as u64
    }

    /// `nr_memsize`: the region and the page of the descriptor's `netmap_if`.
    pub fn memsize(&self) -> u64 {
        (self.port.memfd().1 + NIFP_PAGE) as u64
    }
}

/// The `netmap_if` of a descriptor bound to the rings of `set`, to be placed at offset
/// `region_size` of its mapping.
fn own_nifp(port: &Port, set: &RingSet) -> Vec<u8> {
    let l = port.layout();
    let (tx, rx) = (l.params.tx_rings, l.params.rx_rings);
    let mut v = vec![0u8; NIFP_RING_OFS + 8 * (tx + rx) as usize];
    // The header as valed wrote it: name, version, flags, ring counts (host rings 0).
    // SAFETY: the port's netmap_if header lies in its mapping.
    let hdr = unsafe { std::slice::from_raw_parts(port.nifp() as *const u8, NIFP_RING_OFS) };
    v[..NIFP_RING_OFS].copy_from_slice(hdr);
    let here = l.region_size as i64;
    let bound = set.tx.clone().chain(set.rx.start + tx..set.rx.end + tx);
    for k in bound {
        let ofs = l.ring_ofs(k) as i64 - here;
        let at = NIFP_RING_OFS + 8 * k as usize;
        v[at..at + 8].copy_from_slice(&ofs.to_ne_bytes());
    }
    v
}

/// One open netmap descriptor.
pub struct NmFile {
    /// The descriptor the program holds (an epoll instance).
    pub fd: RawFd,
    /// Set once, by the register request.
    bound: OnceLock<Arc<Bound>>,
    /// Held while registering, so that two racing requests bind once.
    registering: Mutex<()>,
}

impl NmFile {
    pub fn bound(&self) -> Option<&Arc<Bound>> {
        self.bound.get()
    }
}

/// Open netmap descriptors, indexed by descriptor; `OPEN` counts them so that a process
/// without any pays one atomic load per intercepted call.
static FILES: Mutex<Vec<Option<Arc<NmFile>>>> = Mutex::new(Vec::new());
pub static OPEN: AtomicUsize = AtomicUsize::new(0);

/// Ports open in this process, by name.
static PORTS: Mutex<Vec<(String, Weak<Port>)>> = Mutex::new(Vec::new());
static NEXT_MEM_ID: AtomicUsize = AtomicUsize::new(2); // netmap's 1 is its global pool

/// The netmap descriptor `fd`, if it is one.
pub fn file(fd: RawFd) -> Option<Arc<NmFile>> {
    if OPEN.load(Relaxed) == 0 || fd < 0 {
        return None;
    }
    let files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    files.get(fd as usize).cloned().flatten()
}

/// `open("/dev/netmap")`: a new, unbound netmap descriptor.
pub fn open(cloexec: bool) -> RawFd {
    // SAFETY: plain syscall through libc's own symbol.
    let fd = unsafe { (real::epoll_create1())(if cloexec { libc::EPOLL_CLOEXEC } else { 0 }) };
    if fd < 0 {
        return fd;
    }
    let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    if files.len() <= fd as usize {
        files.resize(fd as usize + 1, None);
    }
    files[fd as usize] = Some(Arc::new(NmFile {
        fd,
        bound: OnceLock::new(),
        registering: Mutex::new(()),
    }));
    OPEN.fetch_add(1, Relaxed);
    fd
}

/// `close()` of a netmap descriptor: forget it (the port goes with its last descriptor).
pub fn forget(fd: RawFd) {
    let gone = {
        let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
        files.get_mut(fd as usize).and_then(Option::take)
    };
    if gone.is_some() {
        OPEN.fetch_sub(1, Relaxed);
    }
    // Dropped here, out of the lock: closing the port closes descriptors, through `close`.
    drop(gone);
}

/// A failed request: the errno to return. The message has gone to stderr.
pub struct Errno(pub i32);

/// Prints why a request fails and gives its errno.
pub fn fail(errno: i32, msg: impl std::fmt::Display) -> Errno {
    eprintln!("vale-netmap: {msg}");
    Errno(errno)
}

/// A netmap feature vale does not have: one clear message naming it.
pub fn refuse(feature: &str, why: &str) -> Errno {
    fail(
        libc::EOPNOTSUPP,
        format_args!("{feature} is not available on vale: {why}"),
    )
}

fn io_errno(e: &io::Error) -> Errno {
    let errno = e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::ConnectionReset => libc::ECONNRESET,
        io::ErrorKind::InvalidInput => libc::EINVAL,
        io::ErrorKind::NotFound => libc::ENOENT,
        _ => libc::EIO,
    });
    fail(errno, e)
}

/// What a register request asks for, from either request format.
pub struct Want {
    pub name: String,
    pub mode: u32,
    pub ringid: u16,
    pub flags: u64,
    pub tx_rings: u16,
    pub rx_rings: u16,
    pub tx_slots: u32,
    pub rx_slots: u32,
    pub extra_bufs: u32,
}

/// The geometry of a port opened for `w`: netmap adjusts what it cannot give, so do we.
fn params_for(w: &Want) -> PortParams {
    let rings = |n: u16| (n as u32).clamp(1, MAX_RINGS);
    let slots = w.tx_slots.max(w.rx_slots);
    let d = PortParams::default();
    PortParams {
        tx_rings: if w.tx_rings == 0 {
            d.tx_rings
        } else {
            rings(w.tx_rings)
        },
        rx_rings: if w.rx_rings == 0 {
            d.rx_rings
        } else {
            rings(w.rx_rings)
        },
        slots: if slots == 0 {
            d.slots
        } else {
            slots.next_power_of_two().clamp(MIN_SLOTS, MAX_SLOTS)
        },
        buf_size: d.buf_size,
    }
}

/// Checks what vale cannot do, by name.
fn check_features(w: &Want) -> Result<(), Errno> {
    if !w.name.starts_with("vale") {
        return Err(refuse(
            &format!("port '{}' (a NIC or other netmap port)", w.name),
            "only switch ports valeX:Y are served; attach the interface to a switch with \
             `vale-ctl attach valeX:Y --iface NAME` and open a port of that switch",
        ));
    }
    match w.mode {
        REG_DEFAULT | REG_ALL_NIC | REG_ONE_NIC => {}
        REG_SW | REG_NIC_SW | REG_ONE_SW => {
            return Err(refuse(
                "host rings (NR_REG_SW, NR_REG_NIC_SW, '^', '*')",
                "a vale port has no host stack behind it; attach a TAP port for the host",
            ))
        }
        REG_PIPE_MASTER | REG_PIPE_SLAVE => {
            return Err(refuse(
                "netmap pipes ('{N', '}N')",
                "two ports of a switch connect processes instead",
            ))
        }
        REG_NULL => return Err(refuse("NR_REG_NULL", "every vale port has rings")),
        m => {
            return Err(fail(
                libc::EINVAL,
                format_args!("unknown register mode {m}"),
            ))
        }
    }
    if w.flags & (NR_MONITOR_TX | NR_MONITOR_RX | NR_ZCOPY_MON) != 0 {
        return Err(refuse(
            "monitor ports (NR_MONITOR_TX/RX, '/t', '/r', '/z')",
            "capture a port with `vale-ctl capture`",
        ));
    }
    if w.extra_bufs > 0 {
        return Err(refuse(
            "extra buffers",
            "every buffer of a vale port belongs to one slot",
        ));
    }
    Ok(())
}

/// The port named `w.name`, opened by this process already or now.
fn port_for(w: &Want) -> Result<Arc<Port>, Errno> {
    let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    ports.retain(|(_, p)| p.strong_count() > 0);
    if let Some(p) = ports
        .iter()
        .find(|(n, _)| *n == w.name)
        .and_then(|(_, p)| p.upgrade())
    {
        return Ok(p);
    }
    let mut opts = OpenOptions::new();
    opts.params = params_for(w);
    let port = Arc::new(opts.open(&w.name).map_err(|e| io_errno(&e))?);
    ports.push((w.name.clone(), Arc::downgrade(&port)));
    Ok(port)
}

/// The rings a request binds, as netmap picks them.
fn rings_for(port: &Port, w: &Want) -> Result<RingSet, Errno> {
    let p = port.params();
    let mut set = if w.mode == REG_ONE_NIC {
        let r = w.ringid as u32;
        if r >= p.tx_rings.max(p.rx_rings) {
            return Err(fail(
                libc::EINVAL,
                format_args!(
                    "{}: no ring {r} (the port has {} tx and {} rx rings)",
                    w.name, p.tx_rings, p.rx_rings
                ),
            ));
        }
        RingSet {
            tx: if r < p.tx_rings { r..r + 1 } else { 0..0 },
            rx: if r < p.rx_rings { r..r + 1 } else { 0..0 },
        }
    } else {
        port.all_rings()
    };
    if w.flags & NR_RX_RINGS_ONLY != 0 {
        set.tx = 0..0;
    }
    if w.flags & NR_TX_RINGS_ONLY != 0 {
        set.rx = 0..0;
    }
    Ok(set)
}

/// Binds `file` to the port and rings `w` asks for.
pub fn register(file: &NmFile, w: &Want) -> Result<Arc<Bound>, Errno> {
    let _one = file.registering.lock().unwrap_or_else(|e| e.into_inner());
    if file.bound.get().is_some() {
        return Err(fail(
            libc::EBUSY,
            format_args!("{}: this descriptor is bound to a port already", w.name),
        ));
    }
    check_features(w)?;
    let port = port_for(w)?;
    let set = rings_for(&port, w)?;
    let mem_id = (NEXT_MEM_ID.fetch_add(1, Relaxed) % 0xfffe + 1) as u16;
    let nifp = own_nifp(&port, &set);
    let waiter = Waiter::new(&port, set).map_err(|e| io_errno(&e))?;
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: both descriptors are live; ev outlives the call.
    if unsafe { (real::epoll_ctl())(file.fd, libc::EPOLL_CTL_ADD, waiter.fd(), &mut ev) } < 0 {
        return Err(io_errno(&io::Error::last_os_error()));
    }
    let b = Arc::new(Bound {
        port,
        waiter,
        mem_id,
        nifp,
    });
    let _ = file.bound.set(b.clone());
    Ok(b)
}

/// The geometry a port would have if `w` opened it now (netmap's PORT_INFO_GET): the port's
/// own if this process has it open; and the size a descriptor maps.
pub fn info(w: &Want) -> (PortParams, u64) {
    let ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let params = ports
        .iter()
        .filter(|(n, _)| *n == w.name)
        .find_map(|(_, p)| p.upgrade().map(|p| *p.params()))
        .unwrap_or_else(|| params_for(w));
    let size = Layout::new(&params).map_or(0, |l| l.region_size + NIFP_PAGE as u64);
    (params, size)
}

/// NIOCTXSYNC / NIOCRXSYNC: syncs the bound tx (rx) rings.
pub fn sync(file: &NmFile, tx: bool) -> Result<(), Errno> {
    let Some(b) = file.bound() else {
        return Err(fail(
            libc::ENXIO,
            "sync on a netmap descriptor bound to no port",
        ));
    };
    let set = b.waiter.rings();
    let r = if tx {
        set.tx.clone().try_for_each(|r| b.port.txsync(r))
    } else {
        set.rx.clone().try_for_each(|r| b.port.rxsync(r))
    };
    r.map_err(|e| io_errno(&e))
}

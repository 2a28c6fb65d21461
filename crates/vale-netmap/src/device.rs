//! The emulated control device: what `open("/dev/netmap")` returns, and the requests a netmap
//! program makes on it (register a port, sync its rings, map its memory).
//!
//! A netmap descriptor is an epoll instance of our own, so the program can poll, select and
//! epoll it as it would netmap's; once bound, it watches the [`Waiter`] of the rings it was
//! bound to. Every descriptor bound to the same port in this process shares one libvale
//! [`Port`] (netmap's `valeX:Y-N` opens, one per thread): a vale port has one owner, a
//! process, and its memory is mapped once per `mmap` call from the port's memfd.
//!
//! Descriptors are followed as the kernel follows netmap's:
//! - A port lives while any descriptor of any process refers to it. After a fork, both
//!   processes hold the port's control connection, and libvale's close of a port then
//!   closes only the process's own copies (no shutdown): a child that closes its inherited
//!   descriptors, execs or exits leaves the parent its port, and the other way round.
//! - A number closed behind the emulation's back (`close_range`, `dup2` over it, the raw
//!   system call) is no longer netmap's. `close`, `dup2`, `dup3`, `close_range` and
//!   `closefrom` forget the numbers they close; and each descriptor's epoll instance holds
//!   a tag of its own (an eventfd that is never ready), so that [`file_checked`] can tell
//!   with one system call (`EPOLL_CTL_MOD` of the tag succeeds only on that instance) that
//!   the number still refers to the same open file before poll, select, epoll, mmap or a
//!   control request treats it as netmap's. The sync requests, the hot path, look the number
//!   up without a system call.
//! - fork() is safe in threaded programs: fork handlers take the emulation's locks before
//!   the fork and release them after it in both processes, so the child never inherits a
//!   lock that a thread of the parent held.

use std::any::Any;
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};

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
    /// The tag in `fd`'s epoll instance: an eventfd of ours, registered with no events, so
    /// never reported ([`NmFile::same_file`]).
    tag: Option<OwnedFd>,
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

/// The netmap descriptor `fd`, if the table says it is one: no system call, for the sync
/// requests (see [`file_checked`] for the rest).
pub fn file(fd: RawFd) -> Option<Arc<NmFile>> {
    if OPEN.load(Relaxed) == 0 || fd < 0 {
        return None;
    }
    let files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    files.get(fd as usize).cloned().flatten()
}

/// The netmap descriptor `fd`, if it is one and the number still refers to the file the
/// program opened: a number closed behind the emulation's back, perhaps reused, is
/// forgotten here and is the C library's again.
pub fn file_checked(fd: RawFd) -> Option<Arc<NmFile>> {
    let f = file(fd)?;
    if f.same_file(fd) {
        return Some(f);
    }
    drop(f);
    forget_stale(fd);
    None
}

impl NmFile {
    /// Does number `fd` still refer to this descriptor's open file? Only its epoll instance
    /// holds the tag: one `EPOLL_CTL_MOD` of the tag (which changes nothing) says so.
    fn same_file(&self, fd: RawFd) -> bool {
        let Some(tag) = &self.tag else {
            return true; // no tag could be made: the table is all there is
        };
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: plain syscall; ev outlives it.
        unsafe { (real::epoll_ctl())(fd, libc::EPOLL_CTL_MOD, tag.as_raw_fd(), &mut ev) == 0 }
    }
}

/// `open("/dev/netmap")`: a new, unbound netmap descriptor.
pub fn open(cloexec: bool) -> RawFd {
    install_fork_handlers();
    // SAFETY: plain syscall through libc's own symbol.
    let fd = unsafe { (real::epoll_create1())(if cloexec { libc::EPOLL_CLOEXEC } else { 0 }) };
    if fd < 0 {
        return fd;
    }
    // SAFETY: plain syscalls on descriptors we make; the tag is ours from here on.
    let tag = unsafe {
        let t = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
        let mut ev = libc::epoll_event {
            events: 0,
            u64: u64::MAX,
        };
        if t >= 0 && (real::epoll_ctl())(fd, libc::EPOLL_CTL_ADD, t, &mut ev) == 0 {
            Some(OwnedFd::from_raw_fd(t))
        } else {
            if t >= 0 {
                libc::close(t);
            }
            None
        }
    };
    let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    if files.len() <= fd as usize {
        files.resize(fd as usize + 1, None);
    }
    let old = files[fd as usize].replace(Arc::new(NmFile {
        fd,
        tag,
        bound: OnceLock::new(),
        registering: Mutex::new(()),
    }));
    if old.is_none() {
        OPEN.fetch_add(1, Relaxed);
    }
    drop(files);
    if let Some(old) = old {
        release(old, false); // a stale entry the number had (its file closed behind our back)
    }
    fd
}

/// `close()` of a netmap descriptor (about to be closed): forget it (the port goes with its
/// last descriptor).
pub fn forget(fd: RawFd) {
    if let Some(gone) = take(fd) {
        release(gone, true);
    }
}

/// Forgets `fd`, whose number no longer refers to the descriptor's file.
fn forget_stale(fd: RawFd) {
    if let Some(gone) = take(fd) {
        release(gone, false);
    }
    crate::wait::forget_watches(fd);
}

/// Drops a descriptor taken out of the table (out of the lock: closing the port closes
/// descriptors, through `close`). Its tag is closed only if `fd` is still the descriptor's
/// (`fd_open`: the number is still open, about to be closed) and so the tag's number still
/// its tag: a program closing every descriptor may have closed the tag first, and the
/// number may since be another file's.
fn release(gone: Arc<NmFile>, fd_open: bool) {
    match Arc::try_unwrap(gone) {
        Ok(mut f) => {
            if let Some(tag) = f.tag.take() {
                if fd_open && f.same_file(f.fd) {
                    drop(tag);
                } else {
                    let _ = tag.into_raw_fd(); // not ours to close any more
                }
            }
        }
        Err(shared) => drop(shared), // in use by another thread: it goes with its last use
    }
}

/// Every netmap descriptor in `lo..=hi` (about to be closed by `close_range`,
/// `closefrom`): forgotten.
pub fn forget_range(lo: u32, hi: u32) {
    if OPEN.load(Relaxed) == 0 {
        return;
    }
    let numbers: Vec<RawFd> = {
        let files = FILES.lock().unwrap_or_else(|e| e.into_inner());
        files
            .iter()
            .enumerate()
            .filter(|(n, f)| f.is_some() && (lo as usize..=hi as usize).contains(n))
            .map(|(n, _)| n as RawFd)
            .collect()
    };
    for fd in numbers {
        forget(fd);
        crate::wait::forget_watches(fd);
    }
}

/// Takes `fd` out of the table.
fn take(fd: RawFd) -> Option<Arc<NmFile>> {
    if fd < 0 {
        return None;
    }
    let gone = {
        let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
        files.get_mut(fd as usize).and_then(Option::take)
    };
    if gone.is_some() {
        OPEN.fetch_sub(1, Relaxed);
    }
    gone
}

/// Serializes the opening of ports (so that two threads registering one name open it once),
/// without a lock the fork handlers take: opening may fork (libvale starting valed), and a
/// handler waiting for a lock its own thread holds would never return. It guards no data,
/// so the child of a fork simply finds it free.
static OPENING: AtomicBool = AtomicBool::new(false);

struct Opening;

impl Opening {
    fn lock() -> Opening {
        while OPENING.swap(true, Acquire) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        Opening
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        OPENING.store(false, Release);
    }
}

thread_local! {
    /// The emulation's locks, held by the forking thread from the prepare handler to the
    /// parent's and the child's.
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn before_fork() {
    // Always in this order (no path of the emulation takes them in another): the epoll
    // watches, the descriptors, the ports. None is held across anything that forks.
    let held: Vec<Box<dyn Any>> = vec![
        crate::wait::hold_watches(),
        Box::new(FILES.lock().unwrap_or_else(|e| e.into_inner())),
        Box::new(PORTS.lock().unwrap_or_else(|e| e.into_inner())),
    ];
    HELD.with(|h| *h.borrow_mut() = held);
}

extern "C" fn after_fork_parent() {
    HELD.with(|h| h.borrow_mut().clear());
}

extern "C" fn after_fork_child() {
    // Locks taken before the fork are released; a port being opened by another thread of
    // the parent is the parent's.
    HELD.with(|h| h.borrow_mut().clear());
    OPENING.store(false, Release);
}

fn install_fork_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers functions that only take and release the emulation's locks.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            )
        };
    });
}

/// A failed request: the errno to return. The message has gone to stderr.
pub struct Errno(pub i32);

/// Prints why a request fails and gives its errno. One write(2) to descriptor 2, not Rust's
/// stderr, whose lock another thread may hold across a fork.
pub fn fail(errno: i32, msg: impl std::fmt::Display) -> Errno {
    let line = format!("vale-netmap: {msg}\n");
    // SAFETY: writes our own buffer.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    Errno(errno)
}

/// A netmap feature vale does not have: one clear message naming it.
pub fn refuse(feature: &str, why: &str) -> Errno {
    fail(
        libc::EOPNOTSUPP,
        format_args!("{feature} is not available on vale: {why}"),
    )
}

/// A failure's errno as netmap gives it ([`vale_abi::error::Api::errno_of`], shared with
/// libvale's C API): valed's refusals by [`vale_abi::error::ErrorKind::netmap_errno`] (EPERM,
/// EBUSY, ENXIO, EINVAL, ...), a system call's own errno, else by the error's kind.
fn io_errno(e: &io::Error) -> Errno {
    fail(vale_abi::error::Api::Netmap.errno_of(e), e)
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
    let _one = Opening::lock();
    let known = |name: &str| {
        let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
        ports.retain(|(_, p)| p.strong_count() > 0);
        ports
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, p)| p.upgrade())
    };
    if let Some(p) = known(&w.name) {
        return Ok(p);
    }
    let mut opts = OpenOptions::new();
    opts.params = params_for(w);
    // PORTS is not held here: opening may fork (starting valed), and the fork handlers take it.
    let port = Arc::new(opts.open(&w.name).map_err(|e| io_errno(&e))?);
    let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
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

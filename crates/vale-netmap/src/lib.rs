//! netmap programs on vale, unmodified.
//!
//! This library stands in for netmap's kernel module: preloaded (`LD_PRELOAD`) into a netmap
//! program, or linked into one rebuilt against vale's netmap headers, it serves
//! `open("/dev/netmap")`, the control requests (`NIOCCTRL` register, port info and header
//! length; the legacy `NIOCREGIF` and `NIOCGINFO`), `NIOCTXSYNC`/`NIOCRXSYNC`, `mmap` of the
//! port's memory, and `poll`/`ppoll`/`select`/`pselect`/`epoll` on the netmap descriptor,
//! all on top of libvale. Every other descriptor goes straight to the C library.
//!
//! What vale does not have is refused with one message naming it (see `device.rs`): host
//! rings, netmap pipes, monitor ports, extra buffers, request options (external memory,
//! buffer offsets, CSB, kernel sync loops), the switch management requests, and names other
//! than `valeX:Y` (NICs join a switch with `vale-ctl attach`).
//!
//! The emulation follows descriptors as the kernel does (fork, a child closing what it
//! inherited, exec, numbers closed behind its back: see `device.rs`), is safe to fork in
//! threaded programs, and answers wild pointers in requests with EFAULT (`user.rs`).

mod abi;
mod device;
mod real;
mod user;
mod wait;

use std::ffi::CStr;
use std::time::Instant;

use libc::{c_char, c_int, c_uint, c_ulong, c_void, epoll_event, nfds_t, off_t, pollfd};

use abi::*;
use device::{Errno, NmFile, Want};

const DEVICE: &CStr = c"/dev/netmap";

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

/// A new netmap descriptor if `path` is netmap's device, else None (the C library opens it).
fn open_device(path: *const c_char, flags: c_int) -> Option<c_int> {
    // SAFETY: path is a C string from the program (or null).
    let device = !path.is_null() && unsafe { CStr::from_ptr(path) } == DEVICE;
    device.then(|| device::open(flags & libc::O_CLOEXEC != 0))
}

/// `open(2)`, `open64`, `openat`: `/dev/netmap` gives a netmap descriptor.
///
/// # Safety
/// As open(2). `mode` is read only when `flags` ask to create, as the C library does.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    if let Some(fd) = open_device(path, flags) {
        return fd;
    }
    (real::open())(path, flags, mode)
}

/// # Safety
/// As open(2).
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    if let Some(fd) = open_device(path, flags) {
        return fd;
    }
    (real::open64())(path, flags, mode)
}

/// The fortified open of `-D_FORTIFY_SOURCE` builds.
///
/// # Safety
/// As open(2).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    open(path, flags, 0)
}

/// # Safety
/// As open(2).
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    open64(path, flags, 0)
}

/// # Safety
/// As openat(2).
#[no_mangle]
pub unsafe extern "C" fn openat(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    if let Some(fd) = open_device(path, flags) {
        return fd;
    }
    (real::openat())(dir, path, flags, mode)
}

/// # Safety
/// As openat(2).
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    if let Some(fd) = open_device(path, flags) {
        return fd;
    }
    (real::openat64())(dir, path, flags, mode)
}

/// `close(2)`: a netmap descriptor gives its port back (with the last one bound to it).
///
/// # Safety
/// As close(2).
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if device::OPEN.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        device::forget(fd);
        wait::forget_watches(fd);
    }
    (real::close())(fd)
}

/// `dup2(2)`: a netmap descriptor that `new` replaces is closed, so forgotten.
///
/// # Safety
/// As dup2(2).
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new && device::OPEN.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        device::forget(new);
        wait::forget_watches(new);
    }
    (real::dup2())(old, new)
}

/// `dup3(2)`: as [`dup2`].
///
/// # Safety
/// As dup3(2).
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new && device::OPEN.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        device::forget(new);
        wait::forget_watches(new);
    }
    (real::dup3())(old, new, flags)
}

/// `close_range(2)`: the netmap descriptors in the range are forgotten (unless it only marks
/// them close-on-exec).
///
/// # Safety
/// As close_range(2).
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && first <= last {
        device::forget_range(first, last);
    }
    (real::close_range())(first, last, flags)
}

/// `closefrom(3)`: the netmap descriptors from `low` on are forgotten.
///
/// # Safety
/// As closefrom(3).
#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    device::forget_range(low.max(0) as c_uint, c_uint::MAX);
    (real::closefrom())(low)
}

/// `ioctl(2)`: the netmap requests on a netmap descriptor.
///
/// # Safety
/// As ioctl(2): `arg` points at the structure the request names.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let file = match request {
        // The hot path: the table alone, no system call.
        NIOCTXSYNC | NIOCRXSYNC => device::file(fd),
        NIOCCTRL | NIOCREGIF | NIOCGINFO => device::file_checked(fd),
        _ => None,
    };
    let Some(file) = file else {
        return (real::ioctl())(fd, request, arg);
    };
    let arg = arg as u64;
    let r = match request {
        NIOCCTRL => control(&file, arg),
        NIOCREGIF => legacy_register(&file, arg),
        NIOCGINFO => legacy_info(arg),
        NIOCTXSYNC => device::sync(&file, true),
        NIOCRXSYNC => device::sync(&file, false),
        _ => return (real::ioctl())(fd, request, arg as *mut c_void),
    };
    match r {
        Ok(()) => 0,
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}

fn no_arg(what: &str) -> Errno {
    device::fail(libc::EFAULT, format_args!("{what} without its argument"))
}

/// NIOCCTRL: one of the control requests, as the header says. The header, its option and
/// its body are copied in and out as netmap copies them (EFAULT for memory that is not the
/// program's).
unsafe fn control(file: &NmFile, addr: u64) -> Result<(), Errno> {
    if addr == 0 {
        return Err(no_arg("NIOCCTRL"));
    }
    let mut hdr: NmreqHeader = user::read("NIOCCTRL: the request header", addr)?;
    if hdr.nr_version != NETMAP_API {
        let v = hdr.nr_version;
        hdr.nr_version = NETMAP_API;
        // SAFETY: the answer goes where the program's request asked for it.
        unsafe { user::write("NIOCCTRL: the request header", addr, &hdr) }?;
        return Err(device::fail(
            libc::EINVAL,
            format_args!("netmap API version {v} requested; vale speaks version {NETMAP_API}"),
        ));
    }
    if hdr.nr_options != 0 {
        let what = "NIOCCTRL: the request's option (nr_options)";
        let mut opt: NmreqOption = user::read(what, hdr.nr_options)?;
        opt.nro_status = libc::EOPNOTSUPP as u32;
        // SAFETY: the answer goes where the program's request asked for it.
        unsafe { user::write(what, hdr.nr_options, &opt) }?;
        let what = match opt.nro_reqtype {
            1 => "the external memory option (NETMAP_REQ_OPT_EXTMEM)",
            2 | 4 => "kernel sync loops (NETMAP_REQ_OPT_SYNC_KLOOP_*)",
            3 => "the CSB option (NETMAP_REQ_OPT_CSB)",
            5 => "buffer offsets (NETMAP_REQ_OPT_OFFSETS)",
            _ => "request options",
        };
        return Err(device::refuse(
            what,
            "a vale port's memory, layout and CSB are valed's own",
        ));
    }
    let name = name_of(&hdr.nr_name);
    let body = hdr.nr_body;
    // A request's body, read, and checked to be writable before anything is done.
    unsafe fn body_of<T>(what: &str, body: u64) -> Result<T, Errno> {
        if body == 0 {
            return Err(no_arg(what));
        }
        let v: T = user::read(what, body)?;
        // SAFETY: the answer goes where the program's request asked for it.
        unsafe { user::write(what, body, &v) }?;
        Ok(v)
    }
    match hdr.nr_reqtype {
        REQ_REGISTER => {
            let what = "NETMAP_REQ_REGISTER";
            let mut reg: NmreqRegister = body_of(what, body)?;
            let want = Want {
                name,
                mode: reg.nr_mode,
                ringid: reg.nr_ringid,
                flags: reg.nr_flags,
                tx_rings: reg.nr_tx_rings,
                rx_rings: reg.nr_rx_rings,
                tx_slots: reg.nr_tx_slots,
                rx_slots: reg.nr_rx_slots,
                extra_bufs: reg.nr_extra_bufs,
            };
            let b = device::register(file, &want)?;
            let p = b.port.params();
            reg.nr_offset = b.nifp_offset();
            reg.nr_memsize = b.memsize();
            reg.nr_tx_slots = p.slots;
            reg.nr_rx_slots = p.slots;
            reg.nr_tx_rings = p.tx_rings as u16;
            reg.nr_rx_rings = p.rx_rings as u16;
            reg.nr_host_tx_rings = 0;
            reg.nr_host_rx_rings = 0;
            reg.nr_mem_id = b.mem_id;
            reg.nr_extra_bufs = 0;
            // SAFETY: the answer goes where the program's request asked for it.
            unsafe { user::write(what, body, &reg) }
        }
        REQ_PORT_INFO_GET => {
            let what = "NETMAP_REQ_PORT_INFO_GET";
            let mut info: NmreqPortInfoGet = body_of(what, body)?;
            let want = want_default(name);
            let (p, size) = device::info(&want);
            info.nr_memsize = size;
            info.nr_tx_slots = p.slots;
            info.nr_rx_slots = p.slots;
            info.nr_tx_rings = p.tx_rings as u16;
            info.nr_rx_rings = p.rx_rings as u16;
            info.nr_host_tx_rings = 0;
            info.nr_host_rx_rings = 0;
            info.nr_mem_id = 0;
            // SAFETY: the answer goes where the program's request asked for it.
            unsafe { user::write(what, body, &info) }
        }
        REQ_PORT_HDR_GET => {
            let what = "NETMAP_REQ_PORT_HDR_GET";
            let mut h: NmreqPortHdr = body_of(what, body)?;
            h.nr_hdr_len = 0;
            // SAFETY: the answer goes where the program's request asked for it.
            unsafe { user::write(what, body, &h) }
        }
        REQ_PORT_HDR_SET => {
            let h: NmreqPortHdr = body_of("NETMAP_REQ_PORT_HDR_SET", body)?;
            if h.nr_hdr_len == 0 {
                Ok(())
            } else {
                Err(device::refuse(
                    "virtio-net headers on a port (NETMAP_REQ_PORT_HDR_SET)",
                    "frames on vale ports carry none",
                ))
            }
        }
        3..=5 | 8..=11 => Err(device::refuse(
            "switch management requests (NETMAP_REQ_VALE_*)",
            "manage switches with vale-ctl (attach, detach, list, create, destroy)",
        )),
        12 => Err(device::refuse(
            "memory pool information (NETMAP_REQ_POOLS_INFO_GET)",
            "a vale port's memory is its own region, not a shared pool",
        )),
        13 | 14 => Err(device::refuse(
            "kernel sync loops (NETMAP_REQ_SYNC_KLOOP_*)",
            "valed's workers move the frames",
        )),
        15 => Err(device::refuse(
            "NETMAP_REQ_CSB_ENABLE",
            "vale ports always exchange ring state through valed's own CSB",
        )),
        t => Err(device::fail(
            libc::EINVAL,
            format_args!("unknown netmap request type {t}"),
        )),
    }
}

fn want_default(name: String) -> Want {
    Want {
        name,
        mode: REG_ALL_NIC,
        ringid: 0,
        flags: 0,
        tx_rings: 0,
        rx_rings: 0,
        tx_slots: 0,
        rx_slots: 0,
        extra_bufs: 0,
    }
}

/// The legacy request's ring selection in the newer terms: (mode, ring, flags).
fn legacy_mode(req: &Nmreq) -> (u32, u16) {
    let mode = req.nr_flags & NR_REG_MASK;
    if mode != REG_DEFAULT {
        return (mode, req.nr_ringid & NETMAP_RING_MASK);
    }
    if req.nr_ringid & NETMAP_SW_RING != 0 {
        (REG_SW, 0)
    } else if req.nr_ringid & NETMAP_HW_RING != 0 {
        (REG_ONE_NIC, req.nr_ringid & NETMAP_RING_MASK)
    } else {
        (REG_ALL_NIC, 0)
    }
}

/// NIOCREGIF: the legacy register request (what nm_open() sends).
unsafe fn legacy_register(file: &NmFile, addr: u64) -> Result<(), Errno> {
    if addr == 0 {
        return Err(no_arg("NIOCREGIF"));
    }
    let what = "NIOCREGIF: the request";
    let mut req: Nmreq = user::read(what, addr)?;
    // SAFETY: the answer goes where the program's request asked for it.
    unsafe { user::write(what, addr, &req) }?;
    if req.nr_version != NETMAP_API as u32 {
        let v = req.nr_version;
        req.nr_version = NETMAP_API as u32;
        // SAFETY: the answer goes where the program's request asked for it.
        unsafe { user::write(what, addr, &req) }?;
        return Err(device::fail(
            libc::EINVAL,
            format_args!("netmap API version {v} requested; vale speaks version {NETMAP_API}"),
        ));
    }
    if req.nr_cmd != 0 {
        return Err(device::refuse(
            &format!(
                "the switch command {} of NIOCREGIF (NETMAP_BDG_*)",
                req.nr_cmd
            ),
            "manage switches with vale-ctl",
        ));
    }
    let (mode, ringid) = legacy_mode(&req);
    let want = Want {
        name: name_of(&req.nr_name),
        mode,
        ringid,
        flags: (req.nr_flags & !NR_REG_MASK) as u64,
        tx_rings: req.nr_tx_rings,
        rx_rings: req.nr_rx_rings,
        tx_slots: req.nr_tx_slots,
        rx_slots: req.nr_rx_slots,
        extra_bufs: req.nr_arg3,
    };
    let b = device::register(file, &want)?;
    let p = b.port.params();
    req.nr_offset = b.nifp_offset() as u32;
    req.nr_memsize = b.memsize() as u32;
    req.nr_tx_slots = p.slots;
    req.nr_rx_slots = p.slots;
    req.nr_tx_rings = p.tx_rings as u16;
    req.nr_rx_rings = p.rx_rings as u16;
    req.nr_arg2 = b.mem_id;
    req.nr_arg3 = 0;
    // SAFETY: the answer goes where the program's request asked for it.
    unsafe { user::write(what, addr, &req) }
}

/// NIOCGINFO: the legacy port information request.
unsafe fn legacy_info(addr: u64) -> Result<(), Errno> {
    if addr == 0 {
        return Err(no_arg("NIOCGINFO"));
    }
    let what = "NIOCGINFO: the request";
    let mut req: Nmreq = user::read(what, addr)?;
    let (p, size) = device::info(&want_default(name_of(&req.nr_name)));
    req.nr_version = NETMAP_API as u32;
    req.nr_offset = 0;
    req.nr_memsize = size as u32;
    req.nr_tx_slots = p.slots;
    req.nr_rx_slots = p.slots;
    req.nr_tx_rings = p.tx_rings as u16;
    req.nr_rx_rings = p.rx_rings as u16;
    req.nr_arg2 = 0;
    // SAFETY: the answer goes where the program's request asked for it.
    unsafe { user::write(what, addr, &req) }
}

/// `mmap(2)` of a netmap descriptor maps its port's memory (the region's memfd) and, in the
/// page right after it, the descriptor's own `netmap_if` (a private copy: see
/// [`device::Bound::nifp`]).
///
/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let Some(file) = device::file_checked(fd) else {
        return (real::mmap())(addr, len, prot, flags, fd, off);
    };
    let fail = |e: Errno| {
        set_errno(e.0);
        libc::MAP_FAILED
    };
    let Some(b) = file.bound() else {
        return fail(device::fail(
            libc::ENXIO,
            "mmap of a netmap descriptor bound to no port",
        ));
    };
    let (memfd, size) = b.port.memfd();
    if off < 0 || off as u64 + len as u64 > b.memsize() || (len > size && off != 0) {
        return fail(device::fail(
            libc::EINVAL,
            format_args!(
                "mmap of {len} bytes at {off}: a netmap descriptor of this port maps {} bytes from 0",
                b.memsize()
            ),
        ));
    }
    if len <= size {
        return (real::mmap())(addr, len, prot, flags, memfd, off);
    }
    // The region, then the page of the descriptor's netmap_if, in one range: reserve it,
    // then map both into it.
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let base = (real::mmap())(
        addr,
        len,
        libc::PROT_NONE,
        anon | (flags & libc::MAP_FIXED),
        -1,
        0,
    );
    if base == libc::MAP_FAILED {
        return base;
    }
    let fixed = libc::MAP_FIXED | (flags & !(libc::MAP_PRIVATE | libc::MAP_SHARED));
    let region = (real::mmap())(base, size, prot, fixed | libc::MAP_SHARED, memfd, 0);
    let page = base.cast::<u8>().add(size).cast::<c_void>();
    let nifp = (real::mmap())(
        page,
        len - size,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_FIXED | anon,
        -1,
        0,
    );
    if region == libc::MAP_FAILED || nifp == libc::MAP_FAILED {
        let e = *libc::__errno_location();
        libc::munmap(base, len);
        set_errno(e);
        return libc::MAP_FAILED;
    }
    std::ptr::copy_nonoverlapping(b.nifp.as_ptr(), page.cast::<u8>(), b.nifp.len());
    if prot & libc::PROT_WRITE == 0 {
        libc::mprotect(page, len - size, prot);
    }
    base
}

/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    mmap(addr, len, prot, flags, fd, off)
}

/// `poll(2)`.
///
/// # Safety
/// As poll(2).
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    if device::OPEN.load(std::sync::atomic::Ordering::Relaxed) == 0 || fds.is_null() {
        return (real::poll())(fds, nfds, timeout);
    }
    let all = std::slice::from_raw_parts_mut(fds, nfds as usize);
    let nm = wait::netmap_entries(all);
    if nm.is_empty() {
        return (real::poll())(fds, nfds, timeout);
    }
    let sleep = |f: &mut [pollfd], d: Option<Instant>| {
        (real::poll())(f.as_mut_ptr(), f.len() as nfds_t, wait::ms_left(d))
    };
    wait::poll_with(all, &nm, wait::deadline_ms(timeout), &sleep)
}

/// The fortified poll of `-D_FORTIFY_SOURCE` builds.
///
/// # Safety
/// As poll(2).
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: c_int,
    _len: usize,
) -> c_int {
    poll(fds, nfds, timeout)
}

/// `ppoll(2)`.
///
/// # Safety
/// As ppoll(2).
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    nfds: nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if device::OPEN.load(std::sync::atomic::Ordering::Relaxed) == 0 || fds.is_null() {
        return (real::ppoll())(fds, nfds, ts, mask);
    }
    let all = std::slice::from_raw_parts_mut(fds, nfds as usize);
    let nm = wait::netmap_entries(all);
    if nm.is_empty() {
        return (real::ppoll())(fds, nfds, ts, mask);
    }
    let sleep = |f: &mut [pollfd], d: Option<Instant>| {
        let left = wait::ts_left(d);
        let tp = left.as_ref().map_or(std::ptr::null(), |t| t as *const _);
        (real::ppoll())(f.as_mut_ptr(), f.len() as nfds_t, tp, mask)
    };
    wait::poll_with(all, &nm, wait::deadline_ts(ts), &sleep)
}

/// `select(2)`.
///
/// # Safety
/// As select(2).
#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    if device::OPEN.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        let deadline = tv.as_ref().map(|t| {
            Instant::now()
                + std::time::Duration::from_micros(
                    t.tv_sec.max(0) as u64 * 1_000_000 + t.tv_usec.max(0) as u64,
                )
        });
        let sleep = |f: &mut [pollfd], d: Option<Instant>| {
            (real::poll())(f.as_mut_ptr(), f.len() as nfds_t, wait::ms_left(d))
        };
        if let Some(r) = wait::select_with(nfds, rd, wr, ex, deadline, &sleep) {
            return r;
        }
    }
    (real::select())(nfds, rd, wr, ex, tv)
}

/// `pselect(2)`.
///
/// # Safety
/// As pselect(2).
#[no_mangle]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if device::OPEN.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        let sleep = |f: &mut [pollfd], d: Option<Instant>| {
            let left = wait::ts_left(d);
            let tp = left.as_ref().map_or(std::ptr::null(), |t| t as *const _);
            (real::ppoll())(f.as_mut_ptr(), f.len() as nfds_t, tp, mask)
        };
        if let Some(r) = wait::select_with(nfds, rd, wr, ex, wait::deadline_ts(ts), &sleep) {
            return r;
        }
    }
    (real::pselect())(nfds, rd, wr, ex, ts, mask)
}

/// `epoll_ctl(2)`: a netmap descriptor is watched for the program.
///
/// # Safety
/// As epoll_ctl(2).
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    if device::file_checked(fd).is_some() {
        return wait::epoll_ctl_netmap(epfd, op, fd, ev);
    }
    (real::epoll_ctl())(epfd, op, fd, ev)
}

/// `epoll_wait(2)`.
///
/// # Safety
/// As epoll_wait(2).
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    let sleep = |o: *mut epoll_event, n: c_int, d: Option<Instant>| {
        (real::epoll_wait())(epfd, o, n, wait::ms_left(d))
    };
    if let Some(r) = wait::epoll_wait_with(epfd, out, max, wait::deadline_ms(timeout), &sleep) {
        return r;
    }
    (real::epoll_wait())(epfd, out, max, timeout)
}

/// `epoll_pwait(2)`.
///
/// # Safety
/// As epoll_pwait(2).
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    let sleep = |o: *mut epoll_event, n: c_int, d: Option<Instant>| {
        (real::epoll_pwait())(epfd, o, n, wait::ms_left(d), mask)
    };
    if let Some(r) = wait::epoll_wait_with(epfd, out, max, wait::deadline_ms(timeout), &sleep) {
        return r;
    }
    (real::epoll_pwait())(epfd, out, max, timeout, mask)
}

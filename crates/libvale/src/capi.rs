//! The C ABI declared in `include/vale.h`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::time::Duration;

use vale_abi::netmap::NetmapIf;
use vale_abi::region::{PortParams, RegionHeader};

use crate::port::{Events, OpenOptions, Port, RingSet, Wait};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(msg: impl std::fmt::Display, errno: c_int) {
    let text = CString::new(msg.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = errno };
}

/// A failure's errno as the C API gives it ([`vale_abi::error::Api::errno_of`], shared with
/// the netmap emulation).
fn fail_io(e: &std::io::Error) {
    fail(e, vale_abi::error::Api::C.errno_of(e));
}

/// `struct vale_open_opts`.
#[repr(C)]
pub struct ValeOpenOpts {
    pub tx_rings: u32,
    pub rx_rings: u32,
    pub slots: u32,
    pub buf_size: u32,
    pub run_dir: *const c_char,
    pub no_autostart: c_int,
}

pub const VALE_POLLIN: c_int = 1;
pub const VALE_POLLOUT: c_int = 2;

/// # Safety
/// `o` must point at a writable `struct vale_open_opts`.
#[no_mangle]
pub unsafe extern "C" fn vale_open_opts_init(o: *mut ValeOpenOpts) {
    if o.is_null() {
        return;
    }
    let d = PortParams::default();
    let defaults = OpenOptions::default();
    o.write(ValeOpenOpts {
        tx_rings: d.tx_rings,
        rx_rings: d.rx_rings,
        slots: d.slots,
        buf_size: d.buf_size,
        run_dir: std::ptr::null(),
        no_autostart: (!defaults.autostart) as c_int,
    });
}

/// # Safety
/// `name` must be a NUL-terminated string; `opts` NULL or a valid `struct vale_open_opts`
/// whose `run_dir` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn vale_open(name: *const c_char, opts: *const ValeOpenOpts) -> *mut Port {
    if name.is_null() {
        fail("vale_open: name is NULL", libc::EINVAL);
        return std::ptr::null_mut();
    }
    let Ok(name) = CStr::from_ptr(name).to_str() else {
        fail("vale_open: name is not UTF-8", libc::EINVAL);
        return std::ptr::null_mut();
    };
    let mut o = OpenOptions::default();
    if let Some(c) = opts.as_ref() {
        o.params = PortParams {
            tx_rings: c.tx_rings,
            rx_rings: c.rx_rings,
            slots: c.slots,
            buf_size: c.buf_size,
        };
        if !c.run_dir.is_null() {
            match CStr::from_ptr(c.run_dir).to_str() {
                Ok(d) => {
                    o.run_dir(d);
                }
                Err(_) => {
                    fail("vale_open: run_dir is not UTF-8", libc::EINVAL);
                    return std::ptr::null_mut();
                }
            }
        }
        o.autostart = c.no_autostart == 0;
    }
    match o.open(name) {
        Ok(p) => Box::into_raw(Box::new(p)),
        Err(e) => {
            fail_io(&e);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// `p` must come from `vale_open` and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vale_close(p: *mut Port) {
    if !p.is_null() {
        drop(Box::from_raw(p));
    }
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_nifp(p: *const Port) -> *mut NetmapIf {
    p.as_ref().map_or(std::ptr::null_mut(), |p| p.nifp())
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_region(p: *const Port) -> *const RegionHeader {
    p.as_ref()
        .map_or(std::ptr::null(), |p| p.region() as *const _)
}

unsafe fn with_port(p: *mut Port, f: impl FnOnce(&Port) -> std::io::Result<c_int>) -> c_int {
    let Some(port) = p.as_ref() else {
        fail("port is NULL", libc::EINVAL);
        return -1;
    };
    match f(port) {
        Ok(v) => v,
        Err(e) => {
            fail_io(&e);
            -1
        }
    }
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_txsync(p: *mut Port, ring: u32) -> c_int {
    with_port(p, |p| p.txsync(ring).map(|_| 0))
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_rxsync(p: *mut Port, ring: u32) -> c_int {
    with_port(p, |p| p.rxsync(ring).map(|_| 0))
}

fn events_of(mask: c_int) -> Events {
    Events {
        readable: mask & VALE_POLLIN != 0,
        writable: mask & VALE_POLLOUT != 0,
    }
}

fn mask_of(got: Events) -> c_int {
    (if got.readable { VALE_POLLIN } else { 0 }) | (if got.writable { VALE_POLLOUT } else { 0 })
}

fn timeout_of(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_poll(p: *mut Port, events: c_int, timeout_ms: c_int) -> c_int {
    with_port(p, |p| {
        Ok(mask_of(p.poll(events_of(events), timeout_of(timeout_ms))?))
    })
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_poll_ring(
    p: *mut Port,
    ring: u32,
    events: c_int,
    timeout_ms: c_int,
) -> c_int {
    with_port(p, |p| {
        let want = events_of(events);
        let set = RingSet {
            tx: if want.writable { ring..ring + 1 } else { 0..0 },
            rx: if want.readable { ring..ring + 1 } else { 0..0 },
        };
        Ok(mask_of(p.poll_rings(&set, want, timeout_of(timeout_ms))?))
    })
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_fd(p: *mut Port) -> c_int {
    with_port(p, |p| p.fd())
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_arm(p: *mut Port, events: c_int) -> c_int {
    with_port(p, |p| Ok(mask_of(p.arm(events_of(events))?)))
}

/// # Safety
/// `p` must come from `vale_open`.
#[no_mangle]
pub unsafe extern "C" fn vale_set_busy_wait(p: *mut Port, spin_us: i64) -> c_int {
    with_port(p, |p| {
        p.set_wait(match spin_us {
            0 => Wait::Sleep,
            us if us < 0 => Wait::Busy,
            us => Wait::BusyFor(Duration::from_micros(us as u64)),
        });
        Ok(0)
    })
}

/// The message of this thread's last failed call ("" if none).
#[no_mangle]
pub extern "C" fn vale_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

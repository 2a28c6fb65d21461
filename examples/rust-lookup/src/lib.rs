//! `mini_learning`: a vale lookup module written in Rust, built as a shared object.
//!
//! A small learning bridge: a direct-mapped table of source addresses (one atomic word an
//! entry: MAC and port), group and unknown destinations flooded. It shows the whole of
//! `vale_lookup.h` from Rust: the `repr(C)` types, the entry symbol, configuration
//! (`--arg entries=N`), ports leaving, counters. It depends on nothing of vale.
//!
//! ```text
//! cargo build --release -p vale-example-lookup
//! vale-ctl lookup vale0 ./target/release/libvale_example_lookup.so --arg entries=4096
//! ```

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// `VALE_LOOKUP_ABI_VERSION` of the header this module follows.
const ABI_VERSION: u32 = 2;
const DST_FLOOD: u16 = 0xffff;
const MAC: u64 = 0xffff_ffff_ffff;

/// `struct vale_frame`.
#[repr(C)]
pub struct Frame {
    data: *const u8,
    first_len: u32,
    len: u32,
    flags: u16,
    dst: u16,
    ring: u16,
    reserved: u16,
}

/// `struct vale_batch`.
#[repr(C)]
pub struct Batch {
    frames: *mut Frame,
    count: u32,
    src_port: u16,
    src_ring: u16,
    now_s: u32,
    learn_limit: u32,
}

/// `struct vale_arg`.
#[repr(C)]
pub struct Arg {
    key: *const c_char,
    value: *const c_char,
}

/// `struct vale_counter`.
#[repr(C)]
pub struct Counter {
    name: [c_char; 32],
    value: u64,
}

/// `struct vale_lookup_module`.
#[repr(C)]
pub struct Module {
    abi_version: u32,
    reserved: u32,
    name: *const c_char,
    create: unsafe extern "C" fn(*const Arg, u32, *mut c_char, usize) -> *mut c_void,
    destroy: unsafe extern "C" fn(*mut c_void),
    lookup: unsafe extern "C" fn(*mut c_void, *mut Batch) -> u64,
    port_added: Option<unsafe extern "C" fn(*mut c_void, u16, *const c_char)>,
    port_removed: Option<unsafe extern "C" fn(*mut c_void, u16)>,
    counters: Option<unsafe extern "C" fn(*mut c_void, *mut Counter, u32) -> u32>,
}

// SAFETY: immutable, and its pointers are to statics and functions.
unsafe impl Sync for Module {}

struct Table {
    /// `mac | (port + 1) << 48`; 0 is empty. A power of two long.
    entries: Box<[AtomicU64]>,
    /// 64 - log2(entries).
    shift: u32,
    floods: AtomicU64,
}

impl Table {
    fn slot(&self, mac: u64) -> &AtomicU64 {
        // Fibonacci hashing: the top bits of the product depend on every bit of the MAC.
        &self.entries[(mac.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize]
    }
}

fn mac_at(p: *const u8) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: the switch guarantees 14 readable bytes at a frame's data.
    unsafe { std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), 6) };
    u64::from_le_bytes(b)
}

/// Writes `msg` into the switch's error buffer, NUL-terminated.
fn fail(err: *mut c_char, len: usize, msg: &str) -> *mut c_void {
    let n = msg.len().min(len.saturating_sub(1));
    // SAFETY: the buffer holds `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr() as *const c_char, err, n);
        *err.add(n) = 0;
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn create(args: *const Arg, n: u32, err: *mut c_char, len: usize) -> *mut c_void {
    let mut entries = 4096usize;
    for i in 0..n as usize {
        let a = &*args.add(i);
        let (k, v) = (CStr::from_ptr(a.key), CStr::from_ptr(a.value));
        match (
            k.to_str(),
            v.to_str().ok().and_then(|v| v.parse::<usize>().ok()),
        ) {
            (Ok("entries"), Some(e)) if (16..=1 << 20).contains(&e) => {
                entries = e.next_power_of_two()
            }
            (Ok("entries"), _) => return fail(err, len, "entries must be 16 to 1048576"),
            _ => return fail(err, len, "unknown argument (known: entries)"),
        }
    }
    let t = Table {
        entries: (0..entries).map(|_| AtomicU64::new(0)).collect(),
        shift: 64 - entries.trailing_zeros(),
        floods: AtomicU64::new(0),
    };
    Box::into_raw(Box::new(t)) as *mut c_void
}

unsafe extern "C" fn destroy(state: *mut c_void) {
    drop(Box::from_raw(state as *mut Table));
}

unsafe extern "C" fn lookup(state: *mut c_void, b: *mut Batch) -> u64 {
    let t = &*(state as *const Table);
    let b = &*b;
    let frames = std::slice::from_raw_parts_mut(b.frames, b.count as usize);
    let mut floods = 0;
    for f in frames {
        let src = mac_at(f.data.add(6));
        if src & 1 == 0 {
            let want = src | (b.src_port as u64 + 1) << 48;
            let e = t.slot(src);
            if e.load(Relaxed) != want {
                e.store(want, Relaxed);
            }
        }
        let dst = mac_at(f.data);
        let key = if dst & 1 == 0 {
            t.slot(dst).load(Relaxed)
        } else {
            0
        };
        f.dst = if key != 0 && key & MAC == dst {
            ((key >> 48) - 1) as u16
        } else {
            floods += 1;
            DST_FLOOD
        };
    }
    t.floods.fetch_add(floods, Relaxed);
    0
}

unsafe extern "C" fn port_removed(state: *mut c_void, port: u16) {
    let t = &*(state as *const Table);
    for e in t.entries.iter() {
        let k = e.load(Relaxed);
        if k != 0 && k >> 48 == port as u64 + 1 {
            let _ = e.compare_exchange(k, 0, Relaxed, Relaxed);
        }
    }
}

unsafe extern "C" fn counters(state: *mut c_void, out: *mut Counter, max: u32) -> u32 {
    let t = &*(state as *const Table);
    let learnt = t.entries.iter().filter(|e| e.load(Relaxed) != 0).count() as u64;
    let all = [("learnt", learnt), ("floods", t.floods.load(Relaxed))];
    let n = all.len().min(max as usize);
    for (i, (name, value)) in all[..n].iter().enumerate() {
        let c = &mut *out.add(i);
        c.name = [0; 32];
        for (d, s) in c.name.iter_mut().zip(name.bytes()) {
            *d = s as c_char;
        }
        c.value = *value;
    }
    n as u32
}

static MODULE: Module = Module {
    abi_version: ABI_VERSION,
    reserved: 0,
    name: c"mini_learning".as_ptr(),
    create,
    destroy,
    lookup,
    port_added: None,
    port_removed: Some(port_removed),
    counters: Some(counters),
};

/// The symbol valed looks for.
#[no_mangle]
pub extern "C" fn vale_lookup_module() -> *const Module {
    &MODULE
}

//! Lookup modules in shared objects, loaded at run time: the Rust side of `vale_lookup.h`
//! (in this crate's `include/`; `docs/modules.md` explains it).
//!
//! A [`SharedModule`] owns the loaded library, the module's table of functions and its
//! instance. The switch holds it behind the same `Arc` that every worker takes for the whole
//! of a batch, so the library is closed (after `destroy`) only once the last batch that could
//! call into it has finished (see [`crate::switch::Switch::set_lookup`]).

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use libloading::Library;

use super::{Args, FrameMeta, Lookup, SourcePort, DEST_DROP, DEST_FLOOD, RING_ANY};
use crate::index::{PortIndex, MAX_PORTS};

/// `VALE_LOOKUP_ABI_VERSION`: the version of `vale_lookup.h` this valed speaks.
pub const ABI_VERSION: u32 = 2;
/// The oldest version it still loads. Version 1 differs only in `ring`, which it ignores:
/// its modules' rings are set back to [`RING_ANY`] after each call.
pub const OLDEST_ABI_VERSION: u32 = 1;
/// The symbol valed looks for.
pub const ENTRY: &str = "vale_lookup_module";
/// Most counters a module may export.
const MAX_COUNTERS: usize = 64;

/// `struct vale_batch`.
#[repr(C)]
pub struct CBatch {
    pub frames: *mut FrameMeta,
    pub count: u32,
    pub src_port: u16,
    pub src_ring: u16,
    pub now_s: u32,
    pub learn_limit: u32,
}

/// `struct vale_arg`.
#[repr(C)]
pub struct CArg {
    pub key: *const c_char,
    pub value: *const c_char,
}

/// `struct vale_counter`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CCounter {
    pub name: [c_char; 32],
    pub value: u64,
}

/// `struct vale_lookup_module`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CModule {
    pub abi_version: u32,
    pub reserved: u32,
    pub name: *const c_char,
    pub create: Option<
        unsafe extern "C" fn(
            args: *const CArg,
            nargs: u32,
            err: *mut c_char,
            errlen: usize,
        ) -> *mut c_void,
    >,
    pub destroy: Option<unsafe extern "C" fn(state: *mut c_void)>,
    pub lookup: Option<unsafe extern "C" fn(state: *mut c_void, batch: *mut CBatch) -> u64>,
    pub port_added:
        Option<unsafe extern "C" fn(state: *mut c_void, port: u16, name: *const c_char)>,
    pub port_removed: Option<unsafe extern "C" fn(state: *mut c_void, port: u16)>,
    pub counters:
        Option<unsafe extern "C" fn(state: *mut c_void, out: *mut CCounter, max: u32) -> u32>,
}

/// A module loaded from a shared object, with one instance made from its arguments.
pub struct SharedModule {
    name: String,
    ops: CModule,
    lookup: unsafe extern "C" fn(*mut c_void, *mut CBatch) -> u64,
    state: *mut c_void,
    /// Ports on the switch now: a result naming any other is a counted drop.
    present: Box<[AtomicBool]>,
    bad_dst: AtomicU64,
    /// Version 1: the rings it writes are not results.
    rings_ignored: bool,
    /// Declared last: closed after `Drop::drop` has destroyed the instance.
    _lib: Library,
}

// SAFETY: the module's contract (vale_lookup.h) makes its instance usable from any thread,
// concurrently; valed's own fields are atomics or immutable.
unsafe impl Send for SharedModule {}
unsafe impl Sync for SharedModule {}

impl SharedModule {
    /// Loads the module at `path` and makes an instance from `args`. Every refusal says
    /// what is wrong; nothing of a refused module stays loaded.
    pub fn load(path: &Path, args: &Args) -> Result<SharedModule, String> {
        let shown = path.display();
        if !path.is_absolute() {
            return Err(format!(
                "lookup module '{shown}': give the shared object's absolute path"
            ));
        }
        // SAFETY: loading runs the object's initialisers: only administrators may name one
        // (the engine checks), and the object is trusted to be what it says it is.
        let lib = unsafe { Library::new(path) }
            .map_err(|e| format!("cannot load lookup module '{shown}': {e}"))?;
        // SAFETY: the symbol's type is the one vale_lookup.h declares.
        let ops = unsafe {
            let entry = lib
                .get::<unsafe extern "C" fn() -> *const CModule>(ENTRY.as_bytes())
                .map_err(|_| {
                    format!("'{shown}' is not a vale lookup module: it has no symbol '{ENTRY}'")
                })?;
            let p = entry();
            if p.is_null() {
                return Err(format!("lookup module '{shown}': {ENTRY}() returned NULL"));
            }
            // Only the version is read before it is known to match: a module of another
            // version may have another layout after it.
            let version = std::ptr::read(p as *const u32);
            if !(OLDEST_ABI_VERSION..=ABI_VERSION).contains(&version) {
                return Err(format!(
                    "lookup module '{shown}' is built for lookup ABI version {version}; \
                     this valed speaks versions {OLDEST_ABI_VERSION} to {ABI_VERSION}"
                ));
            }
            std::ptr::read(p)
        };
        let (Some(create), Some(lookup), Some(_)) = (ops.create, ops.lookup, ops.destroy) else {
            return Err(format!(
                "lookup module '{shown}' lacks a required function (create, destroy, lookup)"
            ));
        };
        let name = if ops.name.is_null() {
            return Err(format!("lookup module '{shown}' has no name"));
        } else {
            // SAFETY: a NUL-terminated string, says the contract; bounded below.
            let n = unsafe { CStr::from_ptr(ops.name) }.to_string_lossy();
            n.chars().take(64).collect::<String>()
        };
        let owned = args
            .iter()
            .map(|(k, v)| {
                Ok((
                    CString::new(k.as_str()).map_err(|_| "an argument holds a NUL byte")?,
                    CString::new(v.as_str()).map_err(|_| "an argument holds a NUL byte")?,
                ))
            })
            .collect::<Result<Vec<_>, &str>>()
            .map_err(|e| format!("lookup module '{shown}': {e}"))?;
        let cargs: Vec<CArg> = owned
            .iter()
            .map(|(k, v)| CArg {
                key: k.as_ptr(),
                value: v.as_ptr(),
            })
            .collect();
        let mut err = [0 as c_char; 256];
        // SAFETY: arguments and the error buffer live across the call.
        let state = unsafe {
            create(
                cargs.as_ptr(),
                cargs.len() as u32,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if state.is_null() {
            *err.last_mut().expect("not empty") = 0;
            // SAFETY: NUL-terminated (forced above).
            let why = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
            let why = if why.is_empty() {
                "no reason given".into()
            } else {
                why
            };
            return Err(format!(
                "lookup module '{name}' ({shown}) refused its configuration: {why}"
            ));
        }
        Ok(SharedModule {
            name,
            ops,
            lookup,
            state,
            present: (0..MAX_PORTS).map(|_| AtomicBool::new(false)).collect(),
            bad_dst: AtomicU64::new(0),
            rings_ignored: ops.abi_version == 1,
            _lib: lib,
        })
    }
}

impl Drop for SharedModule {
    fn drop(&mut self) {
        if let Some(destroy) = self.ops.destroy {
            // SAFETY: the instance is no longer reachable by any worker (we are its last owner).
            unsafe { destroy(self.state) };
        }
    }
}

impl Lookup for SharedModule {
    fn name(&self) -> &str {
        &self.name
    }

    fn lookup(&self, src: SourcePort, frames: &mut [FrameMeta], now_s: u32) -> u64 {
        let mut b = CBatch {
            frames: frames.as_mut_ptr(),
            count: frames.len() as u32,
            src_port: src.index,
            src_ring: src.ring,
            now_s,
            learn_limit: src.learn_limit,
        };
        // SAFETY: the batch points at `frames`, valid for the call.
        let refused = unsafe { (self.lookup)(self.state, &mut b) };
        // The module's results are not trusted: any port that is not on the switch is a
        // drop, counted here and (as every drop) against the source.
        let mut bad = 0;
        for f in frames.iter_mut() {
            f.vlan = 0;
            if self.rings_ignored {
                f.ring = RING_ANY;
            }
            let d = f.dst;
            if d != DEST_FLOOD
                && d != DEST_DROP
                && !self
                    .present
                    .get(d as usize)
                    .is_some_and(|p| p.load(Relaxed))
            {
                f.dst = DEST_DROP;
                bad += 1;
            }
        }
        if bad != 0 {
            self.bad_dst.fetch_add(bad, Relaxed);
        }
        refused
    }

    fn port_added(&self, port: PortIndex, name: &str) {
        if let Some(p) = self.present.get(port as usize) {
            p.store(true, Relaxed);
        }
        if let (Some(f), Ok(n)) = (self.ops.port_added, CString::new(name)) {
            // SAFETY: the name lives across the call.
            unsafe { f(self.state, port, n.as_ptr()) };
        }
    }

    fn port_removed(&self, port: PortIndex) {
        if let Some(p) = self.present.get(port as usize) {
            p.store(false, Relaxed);
        }
        if let Some(f) = self.ops.port_removed {
            // SAFETY: per the contract.
            unsafe { f(self.state, port) };
        }
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let mut out = vec![("bad_dst".to_string(), self.bad_dst.load(Relaxed))];
        if let Some(f) = self.ops.counters {
            let mut buf = [CCounter {
                name: [0; 32],
                value: 0,
            }; MAX_COUNTERS];
            // SAFETY: room for MAX_COUNTERS; what comes back is bounded and NUL-forced.
            let n = unsafe { f(self.state, buf.as_mut_ptr(), MAX_COUNTERS as u32) } as usize;
            for c in &mut buf[..n.min(MAX_COUNTERS)] {
                c.name[31] = 0;
                // SAFETY: NUL-terminated (forced above).
                let name = unsafe { CStr::from_ptr(c.name.as_ptr()) }.to_string_lossy();
                out.push((name.into_owned(), c.value));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layout the header's static checks (vale-tests, modules.rs) hold the C side to.
    #[test]
    fn layout_is_the_headers() {
        assert_eq!(size_of::<FrameMeta>(), 24);
        assert_eq!(offset_of!(FrameMeta, dst), 18);
        assert_eq!(offset_of!(FrameMeta, ring), 20);
        assert_eq!(size_of::<CBatch>(), 24);
        assert_eq!(offset_of!(CBatch, src_port), 12);
        assert_eq!(offset_of!(CBatch, now_s), 16);
        assert_eq!(size_of::<CArg>(), 16);
        assert_eq!(size_of::<CCounter>(), 40);
        assert_eq!(offset_of!(CModule, name), 8);
        assert_eq!(offset_of!(CModule, counters), 56);
        assert_eq!(size_of::<CModule>(), 64);
        assert_eq!(
            vale_abi::netmap::NS_NO_LEARN,
            0x0008,
            "VALE_NS_NO_LEARN in vale_lookup.h"
        );
    }
}

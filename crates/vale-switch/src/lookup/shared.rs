//! Lookup modules in shared objects, loaded at run time: the Rust side of `vale_lookup.h`
//! (in this crate's `include/`; `docs/modules.md` explains it).
//!
//! A [`SharedModule`] owns the loaded library, the module's table of functions and its
//! instance. The switch holds it behind the same `Arc` that every worker takes for the whole
//! of a batch, so the library is closed (after `destroy`) only once the last batch that could
//! call into it has finished (see [`crate::switch::Switch::set_lookup`]).
//!
//! Version 3 of the header adds the module's own commands (`control`, `open_ops`) after the
//! version 2 table; they are read only from a module that says version 3. What a module
//! answers is not trusted: its length is checked against the room it had before any byte is
//! read, and it must be UTF-8; the refusal names the module and the command.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use libloading::Library;

use super::{
    Args, ControlCtx, Error, FrameMeta, Lookup, SourcePort, DEST_DROP, DEST_FLOOD, RING_ANY,
};
use crate::index::{PortIndex, MAX_PORTS};

/// `VALE_LOOKUP_ABI_VERSION`: the version of `vale_lookup.h` this valed speaks.
pub const ABI_VERSION: u32 = 3;
/// The oldest version it still loads. Version 1 differs only in `ring`, which it ignores:
/// its modules' rings are set back to [`RING_ANY`] after each call. Versions 1 and 2 end
/// before `control`: their modules take no commands.
pub const OLDEST_ABI_VERSION: u32 = 1;
/// `VALE_CONTROL_OUT_CAP`: the room a module's command has for its answer (`out_cap`).
pub const CONTROL_OUT_CAP: usize = 1 << 20;
/// The reserved commands through which valed asks a module for the lines it wants kept in
/// valed's configuration, and hands them back at the next start.
pub const OP_SAVE: &str = "vale.save";
pub const OP_RESTORE: &str = "vale.restore";
/// Most names a module's `open_ops` list is read for.
const MAX_OPEN_OPS: usize = 64;
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

/// The fields version 3 adds after [`CModule`]'s: `struct vale_lookup_module` of version 3
/// is the two together.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CModuleV3 {
    pub base: CModule,
    pub control: Option<ControlFn>,
    pub open_ops: *const *const c_char,
}

/// `control` of `vale_lookup.h`.
pub type ControlFn = unsafe extern "C" fn(
    state: *mut c_void,
    op: *const c_char,
    body: *const c_char,
    body_len: usize,
    out: *mut c_char,
    out_cap: usize,
    out_len: *mut usize,
) -> i32;

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
    /// Version 3: its commands, and those open to anyone.
    control: Option<ControlFn>,
    open_ops: Vec<String>,
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
    pub fn load(path: &Path, args: &Args) -> Result<SharedModule, Error> {
        let shown = path.display();
        if !path.is_absolute() {
            return Err(Error::Invalid(format!(
                "lookup module '{shown}': give the shared object's absolute path"
            )));
        }
        // SAFETY: loading runs the object's initialisers: only administrators may name one
        // (the engine checks), and the object is trusted to be what it says it is.
        let lib = unsafe { Library::new(path) }
            .map_err(|e| Error::Module(format!("cannot load lookup module '{shown}': {e}")))?;
        // SAFETY: the symbol's type is the one vale_lookup.h declares.
        let (ops, v3) = unsafe {
            let entry = lib
                .get::<unsafe extern "C" fn() -> *const CModule>(ENTRY.as_bytes())
                .map_err(|_| {
                    Error::Invalid(format!(
                        "'{shown}' is not a vale lookup module: it has no symbol '{ENTRY}'"
                    ))
                })?;
            let p = entry();
            if p.is_null() {
                return Err(Error::Module(format!(
                    "lookup module '{shown}': {ENTRY}() returned NULL"
                )));
            }
            // Only the version is read before it is known to match: a module of another
            // version may have another layout after it (an older one is shorter).
            let version = std::ptr::read(p as *const u32);
            if !(OLDEST_ABI_VERSION..=ABI_VERSION).contains(&version) {
                return Err(Error::Invalid(format!(
                    "lookup module '{shown}' is built for lookup ABI version {version}; \
                     this valed speaks versions {OLDEST_ABI_VERSION} to {ABI_VERSION}"
                )));
            }
            let v3 = (version >= 3).then(|| std::ptr::read(p as *const CModuleV3));
            (std::ptr::read(p), v3)
        };
        let (Some(create), Some(lookup), Some(_)) = (ops.create, ops.lookup, ops.destroy) else {
            return Err(Error::Invalid(format!(
                "lookup module '{shown}' lacks a required function (create, destroy, lookup)"
            )));
        };
        let name = if ops.name.is_null() {
            return Err(Error::Invalid(format!(
                "lookup module '{shown}' has no name"
            )));
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
            .map_err(|e| Error::Invalid(format!("lookup module '{shown}': {e}")))?;
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
            return Err(Error::Invalid(format!(
                "lookup module '{name}' ({shown}) refused its configuration: {why}"
            )));
        }
        let open_ops = v3.map_or_else(Vec::new, |m| {
            let mut v = Vec::new();
            let mut at = m.open_ops;
            while !at.is_null() && v.len() < MAX_OPEN_OPS {
                // SAFETY: a NULL-terminated array of NUL-terminated strings, says the
                // contract; at most MAX_OPEN_OPS of them are read.
                let p = unsafe { *at };
                if p.is_null() {
                    break;
                }
                // SAFETY: as above.
                v.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
                // SAFETY: the array goes on until its NULL, not reached yet.
                at = unsafe { at.add(1) };
            }
            v
        });
        Ok(SharedModule {
            name,
            ops,
            lookup,
            state,
            present: (0..MAX_PORTS).map(|_| AtomicBool::new(false)).collect(),
            bad_dst: AtomicU64::new(0),
            rings_ignored: ops.abi_version == 1,
            control: v3.and_then(|m| m.control),
            open_ops,
            _lib: lib,
        })
    }

    /// Calls the module's `control` with `op` and `body`: its answer, checked (no more than
    /// it had room for, UTF-8), or its refusal, of the kind its errno says.
    fn call(&self, op: &str, body: &str) -> Result<String, Error> {
        let Some(control) = self.control else {
            return Err(super::Error::unsupported(&self.name, op, &[]));
        };
        let name = &self.name;
        let cop = CString::new(op)
            .map_err(|_| Error::Invalid(format!("command '{op}' holds a NUL byte")))?;
        // The body as given, with a NUL after it for modules that read it as a C string.
        let mut cbody = Vec::with_capacity(body.len() + 1);
        cbody.extend_from_slice(body.as_bytes());
        cbody.push(0);
        let mut out = vec![0u8; CONTROL_OUT_CAP];
        let mut out_len = 0usize;
        // SAFETY: op, body and out live across the call; out has out_cap writable bytes.
        let rc = unsafe {
            control(
                self.state,
                cop.as_ptr(),
                cbody.as_ptr() as *const c_char,
                body.len(),
                out.as_mut_ptr() as *mut c_char,
                CONTROL_OUT_CAP,
                &mut out_len,
            )
        };
        // What the module wrote is not trusted: a length past the room it had is an error
        // (nothing beyond out is read), and so is text that is not UTF-8.
        if out_len > CONTROL_OUT_CAP {
            return Err(Error::Module(format!(
                "lookup module '{name}' answered '{op}' with out_len {out_len}, more than the \
                 {CONTROL_OUT_CAP} bytes of room it had"
            )));
        }
        let text = &out[..out_len];
        if rc != 0 {
            let why = String::from_utf8_lossy(text);
            let why = why.trim_end_matches('\0');
            let why = if why.is_empty() {
                std::io::Error::from_raw_os_error(rc).to_string()
            } else {
                why.to_string()
            };
            let message = format!("lookup module '{name}' refused '{op}': {why}");
            return Err(match rc {
                libc::EOPNOTSUPP | libc::ENOSYS => super::Error::unsupported(name, op, &[]),
                libc::EINVAL => Error::Invalid(message),
                libc::ENOENT => Error::NotFound(message),
                libc::ENOSPC | libc::ERANGE => Error::Limit(format!(
                    "{message} (its answer may be at most {CONTROL_OUT_CAP} bytes)"
                )),
                _ => Error::Module(message),
            });
        }
        std::str::from_utf8(text).map(str::to_string).map_err(|e| {
            Error::Module(format!(
                "lookup module '{name}' answered '{op}' with text that is not UTF-8 ({e})"
            ))
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

    fn control(&self, _ctx: ControlCtx, op: &str, body: &str) -> Result<String, Error> {
        if op == OP_SAVE || op == OP_RESTORE {
            return Err(Error::Invalid(format!(
                "'{op}' is reserved to valed's configuration (vale-ctl save)"
            )));
        }
        self.call(op, body)
    }

    fn open_op(&self, op: &str) -> bool {
        self.open_ops.iter().any(|o| o == op)
    }

    fn save(&self) -> Vec<String> {
        if self.control.is_none() {
            return Vec::new();
        }
        match self.call(OP_SAVE, "") {
            Ok(text) => text.lines().map(str::to_string).collect(),
            Err(Error::Unsupported { .. }) => Vec::new(),
            Err(e) => {
                tracing::warn!(module = self.name, "its state is not saved: {e}");
                Vec::new()
            }
        }
    }

    fn restore(&self, _ctx: ControlCtx, lines: &[String]) -> Result<(), Error> {
        if lines.is_empty() {
            return Ok(());
        }
        self.call(OP_RESTORE, &lines.join("\n")).map(|_| ())
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
        assert_eq!(offset_of!(CModuleV3, control), 64);
        assert_eq!(offset_of!(CModuleV3, open_ops), 72);
        assert_eq!(size_of::<CModuleV3>(), 80);
        assert_eq!(
            vale_abi::netmap::NS_NO_LEARN,
            0x0008,
            "VALE_NS_NO_LEARN in vale_lookup.h"
        );
    }
}

//! The program's request structures, copied in and out as netmap's kernel module copies
//! them (`copyin`/`copyout`): a pointer that does not lead to readable (or, for the answer,
//! writable) memory fails the request with EFAULT instead of crashing the program.
//!
//! The copy is one `process_vm_readv`/`process_vm_writev` on our own process, which the
//! kernel checks page by page; where that call is refused (seccomp, EPERM), a pipe does the
//! same check (`write(2)` from, or `read(2)` into, the program's memory fails with EFAULT).
//! Control requests only: they are rare, the sync requests carry no argument.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::device::{fail, Errno};

/// `process_vm_*` was refused once: use the pipe from then on.
static NO_VM_CALLS: AtomicBool = AtomicBool::new(false);

fn efault(what: &str, addr: u64, len: usize) -> Errno {
    fail(
        libc::EFAULT,
        format_args!("{what}: {len} bytes at {addr:#x} are not the program's to use"),
    )
}

/// Copies `len` bytes: from the program's `addr` into `ours` (`into_ours`), or from `ours`
/// to `addr`. False if the program's memory is not all there (or not writable).
fn copy(addr: u64, ours: *mut u8, len: usize, into_ours: bool) -> bool {
    if !NO_VM_CALLS.load(Relaxed) {
        let local = libc::iovec {
            iov_base: ours.cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `ours` is our buffer of `len` bytes; the kernel checks `remote`.
        let n = unsafe {
            let pid = libc::getpid();
            if into_ours {
                libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
            } else {
                libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
            }
        };
        if n >= 0 {
            return n as usize == len;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EFAULT) => return false,
            _ => NO_VM_CALLS.store(true, Relaxed),
        }
    }
    copy_by_pipe(addr, ours, len, into_ours)
}

/// [`copy`] through a pipe of our own (the requests are far smaller than a pipe holds).
fn copy_by_pipe(addr: u64, ours: *mut u8, len: usize, into_ours: bool) -> bool {
    let mut p = [0; 2];
    // SAFETY: plain syscalls on a pipe we make and close here; `ours` holds `len` bytes and
    // the kernel checks `addr`.
    unsafe {
        if libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) < 0 {
            return false;
        }
        let (src, dst) = if into_ours {
            (addr as *const libc::c_void, ours.cast::<libc::c_void>())
        } else {
            (ours as *const libc::c_void, addr as *mut libc::c_void)
        };
        let ok = libc::write(p[1], src, len) == len as isize
            && libc::read(p[0], dst, len) == len as isize;
        libc::close(p[0]);
        libc::close(p[1]);
        ok
    }
}

/// Reads a `T` (a plain `repr(C)` request structure) at the program's `addr`.
///
/// # Safety
/// `T` is plain data: any bytes are a valid `T`.
pub unsafe fn read<T>(what: &str, addr: u64) -> Result<T, Errno> {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    let len = std::mem::size_of::<T>();
    if addr == 0 || !copy(addr, v.as_mut_ptr().cast(), len, true) {
        return Err(efault(what, addr, len));
    }
    // SAFETY: every byte was copied in, and any bytes are a valid `T` (the caller's promise).
    Ok(v.assume_init())
}

/// Writes `v` to the program's `addr`.
///
/// # Safety
/// `addr` is where the program asked for the answer (a pointer of its request): the kernel
/// checks only that the bytes there are mapped and writable, not whose they are, so an
/// address of this library's own memory would be overwritten.
pub unsafe fn write<T>(what: &str, addr: u64, v: &T) -> Result<(), Errno> {
    let len = std::mem::size_of::<T>();
    if addr == 0 || !copy(addr, (v as *const T).cast_mut().cast(), len, false) {
        return Err(efault(what, addr, len));
    }
    Ok(())
}

//! valed's run directory: checked to be one no other user can change the names of, a lock that
//! keeps it to one valed, and the control socket, created with its mode without following any
//! name.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use vale_abi::control::SOCKET_NAME;
use vale_abi::rundir::RunDir;

/// Name of the lock file: held while valed runs.
pub const LOCK_NAME: &str = "valed.lock";

/// The run directory of this valed, locked for the life of the value.
pub struct Claimed {
    dir: RunDir,
    _lock: File,
}

/// Opens (creating it if missing) and checks run directory `path`, then takes its lock: one
/// valed per run directory.
pub fn claim(path: &Path) -> anyhow::Result<Claimed> {
    let dir = RunDir::open(path)?;
    let lock = dir.open_file(LOCK_NAME, libc::O_RDWR, 0o644)?;
    // SAFETY: plain syscall on an open file.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("another valed is running for {}", path.display());
    }
    Ok(Claimed { dir, _lock: lock })
}

impl Claimed {
    /// Where the control socket lives.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(SOCKET_NAME)
    }

    /// Replaces a stale socket with a new one of permissions `mode`.
    ///
    /// The mode is given by the umask at bind time, not by a chmod of the name afterwards
    /// (which would follow whatever the name is by then). The umask is process-wide: it is
    /// safe here because valed's other threads (the signal waiter, the forwarding workers)
    /// create no files by name, and memfds ignore it.
    pub fn bind_socket(&self, mode: u32) -> anyhow::Result<UnixListener> {
        self.dir.remove(SOCKET_NAME)?;
        let path = self.socket_path();
        // SAFETY: umask only sets the process's file creation mask.
        let old = unsafe { libc::umask(!mode & 0o777) };
        let bound = UnixListener::bind(&path);
        // SAFETY: as above, putting the previous mask back.
        unsafe { libc::umask(old) };
        bound.with_context(|| format!("cannot bind {}", path.display()))
    }
}

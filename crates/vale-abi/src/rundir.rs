//! The run directory: where valed keeps its control socket and lock, and where an autostarted
//! valed logs. valed may run as root, so the directory must be one that no other user can
//! change the names of: otherwise a name planted there (a symbolic link to a file elsewhere)
//! would have root create or change a file of the planter's choice.
//!
//! A run directory is trusted when it belongs to the user opening it (or to root), and no other
//! user may write it: neither group nor others have write permission, unless the directory is
//! sticky (then others may add names but never rename or remove ours). Files in it are created
//! relative to the opened directory, never following a symbolic link, and checked to be
//! regular files of our own.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Mode of a run directory vale creates.
pub const RUN_DIR_MODE: u32 = 0o755;

/// An opened, trusted run directory.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    fd: OwnedFd,
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("run directory {} has a NUL byte in its name", p.display()),
        )
    })
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: fstat on a descriptor we own, into a zeroed struct of the right type.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

fn euid() -> u32 {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() }
}

impl RunDir {
    /// Opens run directory `path`, creating it (and its parents) with mode [`RUN_DIR_MODE`]
    /// when missing, and checks that it can be trusted. The error names the directory and
    /// what is wrong with it.
    pub fn open(path: &Path) -> io::Result<RunDir> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(RUN_DIR_MODE)
            .create(path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot create run directory {}: {e}", path.display()),
                )
            })?;
        let c = c_path(path)?;
        // SAFETY: plain syscall with a valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot open run directory {}: {e}", path.display()),
            ));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(&fd)?;
        if let Some(why) = distrust(st.st_uid, st.st_mode, euid()) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("refusing run directory {}: {why}", path.display()),
            ));
        }
        Ok(RunDir {
            path: path.to_path_buf(),
            fd,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Opens or creates file `name` of the directory with `flags` (access mode and such as
    /// `O_APPEND`) and permissions `mode` if created. A symbolic link is not followed, and
    /// the file must be a regular file of our own: a name planted by someone else (in a sticky
    /// directory) is refused, not used.
    pub fn open_file(&self, name: &str, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let c = CString::new(name).expect("file names of the run directory have no NUL");
        // SAFETY: openat on our directory descriptor with a valid C string. O_NONBLOCK: a
        // planted FIFO must not hang us before the checks below refuse it.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags
                    | libc::O_CREAT
                    | libc::O_NOFOLLOW
                    | libc::O_CLOEXEC
                    | libc::O_NONBLOCK
                    | libc::O_NOCTTY,
                mode as libc::c_uint,
            )
        };
        let path = self.join(name);
        if fd < 0 {
            let e = io::Error::last_os_error();
            let what = if e.raw_os_error() == Some(libc::ELOOP) {
                "it is a symbolic link, which vale does not follow".to_string()
            } else {
                e.to_string()
            };
            return Err(io::Error::new(
                e.kind(),
                format!("cannot open {}: {what}", path.display()),
            ));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(&fd)?;
        let me = euid();
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("refusing {}: not a regular file", path.display()),
            ));
        }
        if st.st_uid != me {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "refusing {}: it belongs to uid {}, not to uid {me}",
                    path.display(),
                    st.st_uid
                ),
            ));
        }
        // Back to blocking I/O for the caller (a log, a lock): it is a regular file.
        // SAFETY: fcntl on the descriptor we own.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
        Ok(File::from(fd))
    }

    /// Removes `name` from the directory (not following it); absent is fine.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let c = CString::new(name).expect("file names of the run directory have no NUL");
        // SAFETY: unlinkat on our directory descriptor with a valid C string.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::NotFound {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot remove {}: {e}", self.join(name).display()),
                ));
            }
        }
        Ok(())
    }
}

/// Why a directory of owner `uid` and `mode` is no run directory for user `me`, if it is not.
pub fn distrust(uid: u32, mode: u32, me: u32) -> Option<String> {
    if mode & libc::S_IFMT != libc::S_IFDIR {
        return Some("not a directory".into());
    }
    // Its owner may change it at will; root may anyway.
    if uid != me && uid != 0 {
        return Some(format!(
            "it belongs to uid {uid}, who could replace the files vale keeps there; \
             use a directory of uid {me}'s own or root's"
        ));
    }
    let perm = mode & 0o7777;
    if perm & 0o022 != 0 && perm & libc::S_ISVTX == 0 {
        let who = match perm & 0o022 {
            0o002 => "all users",
            0o020 => "its group",
            _ => "its group and all users",
        };
        return Some(format!(
            "it is writable by {who} (mode {perm:04o}) and not sticky, so another user could \
             replace the files vale keeps there; remove that write permission (chmod go-w) \
             or make it sticky (chmod +t)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: u32 = libc::S_IFDIR;

    #[test]
    fn who_may_write_a_run_directory() {
        // Ours or root's, written by its owner alone: trusted.
        assert_eq!(distrust(1000, DIR | 0o755, 1000), None);
        assert_eq!(distrust(0, DIR | 0o700, 1000), None);
        // Writable by others but sticky (as /tmp): others cannot rename or remove our names.
        assert_eq!(distrust(1000, DIR | 0o1777, 1000), None);
        assert_eq!(distrust(0, DIR | 0o1777, 1000), None);
        // Writable by others and not sticky.
        let why = distrust(1000, DIR | 0o777, 1000).unwrap();
        assert!(why.contains("all users") && why.contains("0777"), "{why}");
        let why = distrust(1000, DIR | 0o775, 1000).unwrap();
        assert!(why.contains("its group") && why.contains("0775"), "{why}");
        // Someone else's.
        let why = distrust(1001, DIR | 0o755, 1000).unwrap();
        assert!(why.contains("uid 1001"), "{why}");
        let why = distrust(1000, DIR | 0o1777, 0).unwrap();
        assert!(why.contains("uid 1000"), "{why}");
        // Not a directory.
        assert!(distrust(1000, libc::S_IFREG | 0o644, 1000).is_some());
    }
}

//! The Unix socket a port listens at (vhost-user in server mode): made at attach, removed at
//! detach, and nothing else touched.
//!
//! A name valed is told to listen at may hold anything: a disk image, a directory, another
//! program's socket. [`listen`] binds only a free name, or one that holds a *stale* stream
//! socket: a socket nobody listens at any more (a connection to it is refused), which is
//! what a valed that was killed leaves behind. Anything else is refused with its errno
//! (`EEXIST`: not a socket; `EADDRINUSE`: a socket someone listens at; `EPROTOTYPE`: a socket
//! of another type) and left as it is. To tell a stale socket from a live one valed connects
//! to it (without waiting) and closes at once: a program listening there sees one connection
//! that ends before it says anything.
//!
//! The [`SocketName`] that [`listen`] returns removes the name when dropped, only if it is
//! still the socket valed bound (the same device and inode): a name that someone has removed
//! and made again meanwhile (a new socket, a file) is theirs.
//!
//! A valed that stops on a signal exits without dropping its ports, so every name bound is
//! also kept in a process-wide list, and [`remove_all`] (valed's exit path) removes each by the
//! same rule. From then on [`listen`] refuses (`ESHUTDOWN`), so that an attach racing the exit
//! leaves no name behind either.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The uid of the process at the other end of connected Unix socket `fd` (`SO_PEERCRED`),
/// `u32::MAX` if the kernel does not say.
pub fn peer_uid(fd: std::os::fd::RawFd) -> u32 {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a live ucred whose size is passed.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r == 0 {
        cred.uid
    } else {
        u32::MAX
    }
}

/// A name bound, with the identity of the socket then.
#[derive(Debug)]
struct Bound {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Bound {
    /// Removes the name if it still is the socket bound: the one check of detach and exit.
    fn remove_if_ours(&self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && m.dev() == self.dev && m.ino() == self.ino);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Every name bound and not yet removed, by the id of its [`SocketName`]; `closed` once
/// [`remove_all`] ran.
struct Names {
    next: u64,
    bound: Vec<(u64, Bound)>,
    closed: bool,
}

static NAMES: Mutex<Names> = Mutex::new(Names {
    next: 0,
    bound: Vec::new(),
    closed: false,
});

/// The list, even if a thread panicked holding it (it is only ever left whole).
fn names() -> MutexGuard<'static, Names> {
    NAMES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The name a listening socket was bound at; removed when dropped (or by [`remove_all`]) if
/// it still names that socket.
#[derive(Debug)]
pub struct SocketName {
    id: u64,
}

impl Drop for SocketName {
    fn drop(&mut self) {
        // Under the lock, so that a name is removed once, by this or by remove_all.
        let mut names = names();
        if let Some(i) = names.bound.iter().position(|(id, _)| *id == self.id) {
            names.bound.swap_remove(i).1.remove_if_ours();
        }
    }
}

/// Removes the name of every listening socket bound and not yet dropped, each only while it
/// is still the socket bound, and refuses any [`listen`] from now on: for a valed that exits
/// without dropping its ports (on SIGTERM or SIGINT).
pub fn remove_all() {
    let mut names = names();
    names.closed = true;
    for (_, b) in names.bound.drain(..) {
        b.remove_if_ours();
    }
}

/// Records the name just bound at `path`; refused (and the name removed) once valed stops.
fn register(path: &Path) -> io::Result<SocketName> {
    let m = std::fs::symlink_metadata(path)?;
    let b = Bound {
        path: path.to_path_buf(),
        dev: m.dev(),
        ino: m.ino(),
    };
    let mut names = names();
    if names.closed {
        b.remove_if_ours();
        return Err(io::Error::from_raw_os_error(libc::ESHUTDOWN));
    }
    let id = names.next;
    names.next += 1;
    names.bound.push((id, b));
    Ok(SocketName { id })
}

/// Listens at `path`: a free name, or one that holds a stale stream socket (removed first).
/// Anything else at `path` is refused and left as it is; the message names the path, what is
/// there and the errno.
pub fn listen(path: &Path) -> Result<(UnixListener, SocketName), super::Error> {
    let (fd, name) = listen_as(path, libc::SOCK_STREAM)?;
    Ok((UnixListener::from(fd), name))
}

/// The same for a socket of type `ty` (`SOCK_SEQPACKET` for memif), as a non-blocking
/// descriptor; a stale socket is one of that type nobody listens at.
pub fn listen_as(path: &Path, ty: i32) -> Result<(OwnedFd, SocketName), super::Error> {
    let shown = path.display();
    let fail = |e: io::Error, why: &str| {
        super::Error::of_io(format!("cannot listen at '{shown}': {e}{why}"), e)
    };
    // A stale socket is removed once; a name that comes back busy then is refused.
    for _ in 0..2 {
        match bind(path, ty) {
            Ok(l) => {
                let name = register(path).map_err(|e| {
                    let why = if e.raw_os_error() == Some(libc::ESHUTDOWN) {
                        " (valed is stopping)"
                    } else {
                        ""
                    };
                    fail(e, why)
                })?;
                return Ok((l, name));
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {}
            Err(e) => return Err(fail(e, "")),
        }
        let m = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            // Gone in between: try again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(fail(e, "")),
        };
        let t = m.file_type();
        if !t.is_socket() {
            let what = if t.is_file() {
                "a regular file"
            } else if t.is_dir() {
                "a directory"
            } else if t.is_symlink() {
                "a symbolic link"
            } else {
                "a special file"
            };
            return Err(fail(
                io::Error::from_raw_os_error(libc::EEXIST),
                &format!(" ({what} is there; valed replaces only a stale socket)"),
            ));
        }
        match probe(path, ty) {
            Probe::Stale => {
                // Removed only if it is still the socket looked at.
                let same = std::fs::symlink_metadata(path)
                    .is_ok_and(|n| n.dev() == m.dev() && n.ino() == m.ino());
                if same {
                    std::fs::remove_file(path).map_err(|e| {
                        fail(e, " (a stale socket is there, which valed cannot remove)")
                    })?;
                }
            }
            Probe::Gone => {}
            Probe::Listening => {
                return Err(fail(
                    io::Error::from_raw_os_error(libc::EADDRINUSE),
                    " (a program listens at that socket)",
                ))
            }
            Probe::Other(e) => {
                return Err(fail(
                    e,
                    " (a socket of another kind is there, or one valed cannot tell is stale)",
                ));
            }
        }
    }
    Err(fail(
        io::Error::from_raw_os_error(libc::EADDRINUSE),
        " (a socket came back there as valed replaced a stale one)",
    ))
}

enum Probe {
    /// Nobody listens there.
    Stale,
    /// The name went away.
    Gone,
    /// Someone listens there (or its queue of connections is full).
    Listening,
    /// Another kind of socket, or no way to tell.
    Other(io::Error),
}

/// A non-blocking Unix socket of type `ty` and the address `path`.
fn socket_for(path: &Path, ty: i32) -> io::Result<(OwnedFd, libc::sockaddr_un)> {
    // SAFETY: socket has no memory preconditions; the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor of ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok((fd, addr))
}

/// A socket of type `ty` bound at `path` and listening.
fn bind(path: &Path, ty: i32) -> io::Result<OwnedFd> {
    let (fd, addr) = socket_for(path, ty)?;
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a live sockaddr_un of the size given.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain syscall on our descriptor.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Whether someone listens at the socket `path` of type `ty`: a connection that does not
/// wait.
fn probe(path: &Path, ty: i32) -> Probe {
    let (fd, addr) = match socket_for(path, ty) {
        Ok(s) => s,
        Err(e) => return Probe::Other(e),
    };
    // SAFETY: `addr` is a live sockaddr_un of the size given.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Probe::Listening;
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => Probe::Stale,
        Some(libc::ENOENT) => Probe::Gone,
        Some(libc::EAGAIN | libc::EINPROGRESS) => Probe::Listening,
        _ => Probe::Other(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vale-socket-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn only_a_free_name_or_a_stale_socket_is_taken() {
        let d = dir("take");
        // A regular file: refused, untouched.
        let file = d.join("disk.img");
        std::fs::write(&file, b"precious").unwrap();
        let e = listen(&file).unwrap_err();
        assert!(
            matches!(
                e,
                crate::host::Error {
                    kind: crate::ErrorKind::Busy,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("File exists") && e.contains("a regular file"),
            "{e}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");
        // A directory, a symbolic link (to the file, and dangling).
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        let e = listen(&sub).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        assert!(sub.is_dir());
        let link = d.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = listen(&link).unwrap_err().to_string();
        assert!(e.contains("a symbolic link"), "{e}");
        let dangling = d.join("dangling");
        std::os::unix::fs::symlink(d.join("nothing"), &dangling).unwrap();
        assert!(listen(&dangling).is_err());
        assert!(std::fs::symlink_metadata(&dangling).unwrap().is_symlink());
        assert!(!d.join("nothing").exists());
        // A socket someone listens at: refused, still theirs.
        let busy = d.join("busy.sock");
        let theirs = UnixListener::bind(&busy).unwrap();
        let e = listen(&busy).unwrap_err();
        assert!(
            matches!(
                e,
                crate::host::Error {
                    kind: crate::ErrorKind::Busy,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("Address already in use") && e.contains("listens"),
            "{e}"
        );
        std::os::unix::net::UnixStream::connect(&busy).expect("their socket works");
        drop(theirs.accept().unwrap());
        // A datagram socket: not of this kind.
        let dgram = d.join("dgram.sock");
        let _dg = std::os::unix::net::UnixDatagram::bind(&dgram).unwrap();
        let e = listen(&dgram).unwrap_err().to_string();
        assert!(e.contains("stale"), "{e}");
        assert!(dgram.exists());
        // A stale socket: taken, and removed when the name is dropped.
        let stale = d.join("stale.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let (l, name) = listen(&stale).expect("a stale socket is replaced");
        std::os::unix::net::UnixStream::connect(&stale).expect("ours now");
        drop((l, name));
        assert!(!stale.exists());
        // A name made again by someone else after the bind is theirs: not removed.
        let again = d.join("again.sock");
        let (l, name) = listen(&again).unwrap();
        std::fs::remove_file(&again).unwrap();
        std::fs::write(&again, b"theirs").unwrap();
        drop((l, name));
        assert_eq!(std::fs::read(&again).unwrap(), b"theirs");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

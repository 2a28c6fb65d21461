//! Between a front end and the library, valed passes every message through, but for these:
//!
//! - QEMU (7.2) sends SET_VRING_ENABLE before SET_FEATURES has acked
//!   VHOST_USER_F_PROTOCOL_FEATURES (at every device reset), and counts on it afterwards; the
//!   library refuses it and would end the connection. Such a message is held, the latest per
//!   ring, and passed on right after a SET_FEATURES that acks protocol features (without them
//!   the rings are enabled by SET_FEATURES itself, and the held ones are dropped).
//! - GET_QUEUE_NUM is answered here with the queue *pairs* offered (what QEMU and DPDK
//!   compare their `queues` with; the library would answer the number of virtqueues).
//! - GET_MAX_MEM_SLOTS is answered here with [`MAX_MEM_SLOTS`] (the library would allow 509
//!   regions, each a descriptor and a mapping held by valed), and a front end that adds more
//!   regions than that is disconnected.
//! - NET_SET_MTU (which the library does not know) is taken here.
//! - A memory region added again, or removed again, is answered here (QEMU 7.2 sends its
//!   regions once per queue pair; the library would end the connection).

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use vale_abi::control;

const SET_FEATURES: u32 = 2;
const SET_MEM_TABLE: u32 = 5;
const GET_QUEUE_NUM: u32 = 17;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_ENABLE: u32 = 18;
/// SET_VRING_KICK without a descriptor (the back end would poll).
const NO_FD: u64 = 0x100;
const NET_SET_MTU: u32 = 20;
const GET_MAX_MEM_SLOTS: u32 = 36;
const ADD_MEM_REG: u32 = 37;
const REM_MEM_REG: u32 = 38;
const VERSION: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;
const PROTOCOL_FEATURES: u64 = 1 << 30;
/// Largest message body taken (the protocol's own bound is far lower for what we accept).
const MAX_BODY: usize = 64 << 10;
/// Early ring enables kept (one per ring index).
const MAX_EARLY: usize = 64;
/// Most descriptors one message may carry (the protocol's bound).
const MAX_FDS: usize = 8;
/// Most guest memory regions a front end may have mapped at once.
pub const MAX_MEM_SLOTS: usize = 32;

/// What the relay answers or changes itself.
pub struct Answers {
    /// Queue pairs offered.
    pub pairs: u64,
    /// Takes the MTU of NET_SET_MTU: false when it is out of range.
    pub set_mtu: Box<dyn Fn(u64) -> bool + Send>,
    /// Takes the front end's kick eventfd of a queue; gives what the library gets instead.
    pub kick: Box<dyn Fn(u8, OwnedFd) -> io::Result<OwnedFd> + Send>,
}

/// The two threads of one connection; joined by [`Relay::join`].
pub struct Relay {
    threads: [JoinHandle<()>; 2],
}

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

impl Relay {
    pub fn start(
        front: UnixStream,
        back: UnixStream,
        port: &str,
        answers: Answers,
    ) -> io::Result<Relay> {
        let (f2, b2) = (front.try_clone()?, back.try_clone()?);
        // Both directions write to the front end: one whole message at a time.
        let writing = Arc::new(Mutex::new(()));
        let writing2 = writing.clone();
        let port = port.to_string();
        let down = std::thread::Builder::new()
            .name("vale-vhost-relay".into())
            .spawn(move || {
                if let Err(e) = to_backend(&front, &back, &answers, &writing) {
                    if e.kind() == io::ErrorKind::InvalidData {
                        tracing::warn!(%port, "vhost-user front end: {e}; connection closed");
                    }
                }
                let _ = front.shutdown(Shutdown::Both);
                let _ = back.shutdown(Shutdown::Both);
            })?;
        let up = std::thread::Builder::new()
            .name("vale-vhost-relay".into())
            .spawn(move || {
                let _ = to_front(&b2, &f2, &writing2);
                let _ = f2.shutdown(Shutdown::Both);
                let _ = b2.shutdown(Shutdown::Both);
            })?;
        Ok(Relay {
            threads: [down, up],
        })
    }

    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Receives into `buf` (all of it), with the descriptors that come along: at most
/// `MAX_FDS` in all, however the front end spreads them over its bytes.
fn recv_exact(s: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match control::recv_with_fds(s.as_raw_fd(), &mut buf[got..], fds)? {
            0 => return Ok(false),
            n => got += n,
        }
        if fds.len() > MAX_FDS {
            return Err(bad(format!(
                "front end message with more than {MAX_FDS} descriptors"
            )));
        }
    }
    Ok(true)
}

/// Sends `buf` with `fds` attached to its first byte.
fn send_all(s: &UnixStream, buf: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let sent = if raw.is_empty() {
        0
    } else {
        control::send_with_fds(s.as_raw_fd(), buf, &raw, false)?
    };
    let mut w = s;
    w.write_all(&buf[sent..])
}

/// The library's replies, to the front end whole (the other direction may write an
/// answer of its own between two of them).
fn to_front(back: &UnixStream, front: &UnixStream, writing: &Mutex<()>) -> io::Result<()> {
    let mut buf = vec![0u8; 12 + MAX_BODY];
    let mut b = back;
    loop {
        b.read_exact(&mut buf[..12])?;
        let size = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
        if size > MAX_BODY {
            return Err(bad(format!("backend message of {size} bytes")));
        }
        b.read_exact(&mut buf[12..12 + size])?;
        let _w = writing.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = front;
        f.write_all(&buf[..12 + size])?;
    }
}

/// Answers request `req` with `value`.
fn reply(front: &UnixStream, writing: &Mutex<()>, req: u32, value: u64) -> io::Result<()> {
    let mut m = [0u8; 20];
    m[..4].copy_from_slice(&req.to_le_bytes());
    m[4..8].copy_from_slice(&(VERSION | REPLY).to_le_bytes());
    m[8..12].copy_from_slice(&8u32.to_le_bytes());
    m[12..].copy_from_slice(&value.to_le_bytes());
    let _w = writing.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = front;
    f.write_all(&m)
}

fn to_backend(
    front: &UnixStream,
    back: &UnixStream,
    answers: &Answers,
    writing: &Mutex<()>,
) -> io::Result<()> {
    let mut protocol = false;
    let mut early: Vec<[u8; 20]> = Vec::new();
    // The guest memory regions the front end has given: (guest address, size).
    let mut regions: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut buf = vec![0u8; 12 + MAX_BODY];
    let mut fds = Vec::with_capacity(MAX_FDS);
    loop {
        fds.clear();
        if !recv_exact(front, &mut buf[..12], &mut fds)? {
            return Ok(());
        }
        let word = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let long = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let (req, flags, size) = (word(&buf, 0), word(&buf, 4), word(&buf, 8) as usize);
        if size > MAX_BODY {
            return Err(bad(format!("front end message {req} of {size} bytes")));
        }
        if size != 0 && !recv_exact(front, &mut buf[12..12 + size], &mut fds)? {
            return Ok(());
        }
        let body = &buf[12..12 + size];
        match req {
            SET_FEATURES if size == 8 => {
                protocol = long(body, 0) & PROTOCOL_FEATURES != 0;
                send_all(back, &buf[..12 + size], &fds)?;
                if protocol {
                    // Now the library takes them: the enables QEMU sent too early.
                    for m in early.drain(..) {
                        send_all(back, &m, &[])?;
                    }
                }
                early.clear();
                continue;
            }
            // Before protocol features are acked SET_VRING_ENABLE has no meaning yet (the
            // library would end the connection); QEMU counts on it once they are.
            SET_VRING_ENABLE if !protocol && flags & NEED_REPLY == 0 && size == 8 => {
                let index = &buf[12..16];
                early.retain(|m| &m[12..16] != index);
                if early.len() < MAX_EARLY {
                    early.push(buf[..20].try_into().unwrap());
                }
                continue;
            }
            GET_QUEUE_NUM => {
                reply(front, writing, req, answers.pairs)?;
                continue;
            }
            SET_VRING_KICK if size == 8 && fds.len() == 1 && long(body, 0) & NO_FD == 0 => {
                let fd = fds.pop().expect("one descriptor");
                let own = (answers.kick)(long(body, 0) as u8, fd)?;
                send_all(back, &buf[..12 + size], &[own])?;
                continue;
            }
            GET_MAX_MEM_SLOTS => {
                reply(front, writing, req, MAX_MEM_SLOTS as u64)?;
                continue;
            }
            NET_SET_MTU => {
                let ok = size == 8 && (answers.set_mtu)(long(body, 0));
                if flags & NEED_REPLY != 0 {
                    reply(front, writing, req, u64::from(!ok))?;
                }
                continue;
            }
            // The memory table as the library will have it: (address, size) of each
            // region. A table message carries at most MAX_FDS regions.
            SET_MEM_TABLE if size >= 8 => {
                let n = (word(body, 0) as usize).min((size - 8) / 32);
                regions = (0..n)
                    .map(|k| (long(body, 8 + 32 * k), long(body, 16 + 32 * k)))
                    .collect();
            }
            // QEMU (7.2) sends its regions once per queue pair: a region the table has
            // already is taken (and its descriptor closed), one it no longer has is gone
            // (the library would end the connection on either).
            ADD_MEM_REG | REM_MEM_REG if size >= 24 => {
                let region = (long(body, 8), long(body, 16));
                let changed = if req == ADD_MEM_REG {
                    regions.insert(region)
                } else {
                    regions.remove(&region)
                };
                if !changed {
                    if flags & NEED_REPLY != 0 {
                        reply(front, writing, req, 0)?;
                    }
                    continue;
                }
                if regions.len() > MAX_MEM_SLOTS {
                    return Err(bad(format!(
                        "front end adds more than {MAX_MEM_SLOTS} memory regions"
                    )));
                }
            }
            _ => {}
        }
        send_all(back, &buf[..12 + size], &fds)?;
    }
}

/// A private directory (mode 0700, made by `mkdtemp`) for the library's listener: only
/// valed's user can reach it. Removed when dropped.
pub struct PrivateDir(std::path::PathBuf);

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A connected pair: the front end's side goes to the relay, the other to the library
/// through a listener of its own in a private directory; drop the directory once the
/// library has accepted.
pub fn backend_pair() -> io::Result<(vhost::vhost_user::Listener, UnixStream, PrivateDir)> {
    use std::os::unix::ffi::OsStringExt;
    let mut tmpl = std::env::temp_dir()
        .join("vale-vhost-XXXXXX")
        .into_os_string()
        .into_vec();
    tmpl.push(0);
    // SAFETY: a NUL-terminated template that mkdtemp fills in place.
    if unsafe { libc::mkdtemp(tmpl.as_mut_ptr().cast()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    tmpl.pop();
    let dir = PrivateDir(std::ffi::OsString::from_vec(tmpl).into());
    let path = dir.0.join("backend.sock");
    let l = std::os::unix::net::UnixListener::bind(&path)?;
    let c = UnixStream::connect(&path)?;
    Ok((vhost::vhost_user::Listener::from(l), c, dir))
}

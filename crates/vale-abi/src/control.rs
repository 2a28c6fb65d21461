//! valed's control protocol.
//!
//! One Unix stream socket, `<run dir>/valed.sock`. Each message is a little-endian `u32`
//! length followed by that many bytes of JSON; file descriptors travel with SCM_RIGHTS attached
//! to the first byte of the message they belong to. A connection that opened a port owns it:
//! when the connection closes (the client exits or is killed), valed frees the port.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use crate::error::ErrorKind;
use crate::region::PortParams;

/// Name of the control socket inside the run directory.
pub const SOCKET_NAME: &str = "valed.sock";
/// Run directory when neither `--run-dir` nor `VALE_RUN_DIR` says otherwise.
pub const DEFAULT_RUN_DIR: &str = "/run/vale";
/// Largest control message either way: an administrator's request carrying a flow table's
/// rules, or a reply (a `List` of many ports, the rules a flow `add` added). A client accepts
/// replies up to this size.
pub const MAX_MESSAGE: usize = 64 << 20;
/// Largest request valed accepts from a user that is not an administrator: requests are
/// names and a few numbers, so valed never holds more than this for such a connection's
/// unfinished request.
pub const MAX_REQUEST: usize = 64 << 10;
/// Largest request valed accepts from an administrator: a flow table's rules travel as text
/// (`vale-ctl lookup valeX flow --rules FILE`, `vale-ctl flow valeX add`), and only
/// administrators may send them.
pub const MAX_ADMIN_REQUEST: usize = MAX_MESSAGE;
/// Most rules one page of the `flow` module's `dump` command carries: a larger table is
/// dumped page by page (`after=N`), so that no reply of a dump is larger than about this many
/// rules (about 200 bytes each).
pub const FLOW_DUMP_PAGE: usize = 1024;
/// Most descriptors one message carries (`SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 128;

/// The run directory from `VALE_RUN_DIR`, or the default.
pub fn default_run_dir() -> PathBuf {
    std::env::var_os("VALE_RUN_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Make this connection the owner of `port` (created with its switch if absent). The reply
    /// is [`Reply::Opened`] with the region memfd, then per ring (tx rings, then rx rings) its
    /// kick eventfd (client to valed) and the read end of its interrupt pipe (valed to client).
    Open {
        port: String,
        params: PortParams,
        abi_version: u32,
    },
    /// Every switch and port with counters.
    List,
    /// Every forwarding worker with its counters. The reply is [`Reply::Workers`].
    Workers,
    /// Create a persistent port: it stays, with its counters, when no client holds it.
    Create { port: String },
    /// Remove a port (persistent or not; an owned port is taken from its owner) or a switch
    /// with all its ports.
    Destroy { name: String },
    /// Attach a device of port kind `kind` (`tap`, `nic`), described by `args`, as port `port`
    /// (made with its switch if absent): valed itself moves its frames. The port stays until
    /// `Detach` or `Destroy`.
    Attach {
        port: String,
        kind: String,
        #[serde(default)]
        args: BTreeMap<String, String>,
    },
    /// Give a TAP or NIC port's device back (a persistent port stays, empty).
    Detach { port: String },
    /// The lookup module of switch `switch`: its name, configuration and counters. The
    /// reply is [`Reply::Lookup`].
    Lookup { switch: String },
    /// Make `module` the lookup module of switch `switch`, configured by `args`: a built-in
    /// module's name (`learning`, `hub`, `vlan`) or the absolute path of a shared object
    /// (`vale_lookup.h`). A module that cannot be loaded or configured leaves the switch's
    /// module as it was. The reply is [`Reply::Lookup`] for the new module.
    SetLookup {
        switch: String,
        module: String,
        #[serde(default)]
        args: Vec<ModuleArg>,
    },
    /// Command `command` of the lookup module of switch `switch`, with `body`: text the
    /// module alone reads and answers (the `flow` module's `add`, `del` and `dump`; see
    /// docs/modules.md). An administrator's, unless the module opens the command to anyone
    /// (`flow`'s `dump`). The reply is [`Reply::LookupControl`]; a module without that command refuses
    /// it as [`ErrorKind::Unsupported`].
    LookupControl {
        switch: String,
        command: String,
        #[serde(default)]
        body: String,
    },
    /// Capture the frames of `port` in directions `dirs` (`capture::DIR_TX` | `DIR_RX`), at
    /// most `snaplen` bytes of each, into a buffer of about `bytes` bytes. The reply is
    /// [`Reply::Capture`] with the capture's memfd ([`crate::capture`]). The capture runs
    /// until this connection closes or the port goes away. The port's owner's or an
    /// administrator's. `filter`, if not empty, is a classic BPF program (libpcap's
    /// compilation of a tcpdump expression) that valed checks and runs on each frame's
    /// captured bytes: only frames it accepts are captured.
    Capture {
        port: String,
        dirs: u32,
        snaplen: u32,
        bytes: u64,
        #[serde(default)]
        filter: Vec<crate::capture::BpfInsn>,
    },
    /// Set a knob of a switch (`batch`, `lookup`) or of a port (`moderation`, `learn-limit`).
    /// `lookup NAME` is [`Request::SetLookup`] with no arguments.
    Set {
        target: String,
        knob: String,
        value: String,
    },
    /// Write the running configuration (switches, persistent and device ports, lookup modules
    /// with their rules, knobs) to valed's configuration file (`valed --config FILE`),
    /// atomically. An administrator's. The reply is [`Reply::Saved`].
    Save,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Ok,
    /// A refusal: its kind (absent from an older valed: [`ErrorKind::Io`]) and what is wrong.
    Error {
        #[serde(default)]
        kind: ErrorKind,
        message: String,
    },
    Opened {
        port: String,
        fds: u32,
    },
    List {
        switches: Vec<SwitchInfo>,
    },
    Lookup {
        lookup: LookupInfo,
    },
    /// What a [`Request::LookupControl`] command of lookup module `module` answered.
    LookupControl {
        module: String,
        output: String,
    },
    Workers {
        workers: Vec<WorkerInfo>,
    },
    /// [`Request::Save`] wrote `path`: `switches` switches with `ports` ports.
    Saved {
        path: String,
        switches: u32,
        ports: u32,
    },
    /// A capture started: its memfd of `size` bytes rides with the reply.
    Capture {
        port: String,
        size: u64,
    },
}

/// A forwarding thread of valed and what it did since valed started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// 0, 1, ... as `valed --workers` made them.
    pub id: u32,
    /// The thread's id (`vale-worker-ID` in `ps -L`), 0 until it has started.
    pub tid: u32,
    /// Time the thread spent on a CPU, nanoseconds (the kernel's account: polling and
    /// forwarding, not sleeping).
    pub busy_ns: u64,
    /// Batches it forwarded (passes over a ring that took at least one frame).
    pub batches: u64,
    /// Slots those batches took from their rings (a frame of several slots counts each).
    pub slots: u64,
    /// Source rings it serves now.
    pub rings: u32,
}

/// Rules of a switch's `flow` module (a page of them, or those a command added or deleted):
/// the JSON the module's commands answer ([`Reply::LookupControl`]'s `output`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FlowTable {
    pub switch: String,
    /// What a frame matching no rule gets: `normal`, `drop`, `flood` or `output:PORT`.
    pub default: String,
    /// Frames that matched no rule.
    pub missed: u64,
    /// Highest priority first; among equal priorities, first added first.
    pub rules: Vec<FlowRule>,
    /// A page of a `dump` with more rules after it: the `after=N` that asks for the next page
    /// (an opaque position). Absent on the last page and in other replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// One rule of a flow table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRule {
    /// Given when the rule was added, never reused by the module.
    pub id: u64,
    pub priority: u16,
    /// The match, in the canonical form of the grammar (empty: every frame).
    #[serde(rename = "match")]
    pub matches: String,
    /// `output:PORT`, `drop`, `flood` or `normal`.
    pub actions: String,
    /// Frames the rule decided.
    pub hits: u64,
}

/// One configuration argument of a lookup module, `key=value`. Order matters and keys may
/// repeat (`access` of the `vlan` module, once per port).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleArg {
    pub key: String,
    pub value: String,
}

/// A switch's lookup module, as `vale-ctl lookup valeX` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LookupInfo {
    pub switch: String,
    /// The module's name (a shared object's own).
    pub module: String,
    /// `built-in`, or the path of the shared object it was loaded from.
    pub source: String,
    /// The configuration it was made from.
    pub args: Vec<ModuleArg>,
    /// The module's own counters.
    pub counters: Vec<ModuleCounter>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleCounter {
    pub name: String,
    pub value: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SwitchInfo {
    pub name: String,
    pub lookup: String,
    pub batch: u32,
    pub ports: Vec<PortInfo>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PortInfo {
    /// `valeX:Y`.
    pub name: String,
    /// `native` (a libvale client), `tap`, `nic` or `vhost-user` (valed moves the frames of a
    /// device).
    pub kind: String,
    /// TAP and NIC ports: the device; vhost-user ports: the socket.
    #[serde(default)]
    pub device: Option<String>,
    /// NIC ports: `xdp`, `xdp-generic` or `packet`; vhost-user ports: `server` or `client`.
    #[serde(default)]
    pub mode: Option<String>,
    /// `up`; `down` (a TAP or NIC port whose device is down or gone, a vhost-user port with no
    /// front end); `free` (a persistent
    /// port nobody holds).
    #[serde(default)]
    pub state: String,
    pub persistent: bool,
    /// Pid of the process holding the port, if any.
    pub owner_pid: Option<u32>,
    /// The user the port belongs to: the uid that opened, created or attached it. Only this
    /// uid or an administrator may destroy, detach or tune the port, or reopen it once free.
    #[serde(default)]
    pub owner_uid: u32,
    pub tx_rings: u32,
    pub rx_rings: u32,
    pub slots: u32,
    pub buf_size: u32,
    /// Interrupt moderation interval toward the client, microseconds (0: immediate).
    pub moderation_us: u32,
    /// Most source addresses the learning bridge keeps for this port.
    #[serde(default)]
    pub learn_limit: u32,
    /// Source addresses the switch's lookup holds for this port now (0 for modules that do
    /// not learn).
    #[serde(default)]
    pub learnt: u32,
    /// What the port's device negotiated, when its kind says (vhost-user: the virtio features
    /// the guest acked and the offloads frames to it may carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negotiated: Option<String>,
    pub counters: PortCounters,
}

/// Counters from the port's side, as on a network interface: `tx` is what the client sent into
/// the switch, `rx` what the switch delivered to the client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Frames for this port dropped because its receive ring was full or nobody held it.
    pub rx_drops: u64,
    /// Frames from this port that had nowhere to go: the lookup said drop, or pointed back at
    /// this port or at a port that left, or the frame was flooded with no other port there.
    pub tx_drops: u64,
    /// Values the client wrote that valed refused: ring indices, buffer indices, lengths,
    /// flags. Each refused frame is dropped.
    pub bad_input: u64,
    /// Source addresses of frames from this port that the learning bridge did not learn: the
    /// port held its `learn-limit` of addresses, or the table had no room but other ports'
    /// live entries. The frames themselves are forwarded.
    #[serde(default)]
    pub learn_refused: u64,
}

/// One message as it goes on the wire: its length, then its JSON.
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "control message too large",
        ));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// A message's body, from JSON.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad control message: {e}"),
        )
    })
}

/// Sends one message with optional descriptors.
pub fn send<T: Serialize>(sock: &UnixStream, msg: &T, fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "control message too large",
        ));
    }
    let frame = encode(msg)?;
    // The descriptors ride on the first sendmsg; whatever it did not take follows plainly.
    let sent = if fds.is_empty() {
        0
    } else {
        send_with_fds(sock.as_raw_fd(), &frame, fds, false)?
    };
    let mut w: &UnixStream = sock;
    w.write_all(&frame[sent..])
}

/// Sends request `req` and receives valed's reply (`None`: valed closed without one). valed
/// may refuse a connection at once, writing why and hanging up before the request is sent:
/// that reply is still returned rather than the failed send.
pub fn exchange(sock: &UnixStream, req: &Request) -> io::Result<Option<(Reply, Vec<OwnedFd>)>> {
    if let Err(e) = send(sock, req, &[]) {
        return match recv::<Reply>(sock) {
            Ok(Some(reply)) => Ok(Some(reply)),
            _ => Err(e),
        };
    }
    recv::<Reply>(sock)
}

/// One `sendmsg` of `data` with `fds` attached (`MSG_NOSIGNAL`, and `MSG_DONTWAIT` if
/// `nonblocking`); how many bytes went. The descriptors go with the first byte.
pub fn send_with_fds(
    fd: RawFd,
    data: &[u8],
    fds: &[RawFd],
    nonblocking: bool,
) -> io::Result<usize> {
    let flags = libc::MSG_NOSIGNAL | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; every pointer in it points into live buffers above.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space;
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if !cmsg.is_null() {
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg) as *mut RawFd,
                fds.len(),
            );
        }
        loop {
            let n = libc::sendmsg(fd, &msg, flags);
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Receives one message and the descriptors that came with it. `Ok(None)` on a clean end of
/// stream before a message started.
pub fn recv<T: DeserializeOwned>(sock: &UnixStream) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut len = [0u8; 4];
    let mut fds = Vec::new();
    let mut got = 0;
    while got < 4 {
        let n = recv_with_fds(sock.as_raw_fd(), &mut len[got..], &mut fds)?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message too large",
        ));
    }
    let mut body = vec![0u8; len];
    let mut r: &UnixStream = sock;
    r.read_exact(&mut body)?;
    Ok(Some((decode(&body)?, fds)))
}

/// One `recvmsg` into `buf`; descriptors that came with it are appended to `fds`.
pub fn recv_with_fds(fd: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * 4) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: as in send_with_fds; received descriptors are taken into OwnedFd at once so none
    // leaks, even when the message turns out to be bad.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space;
        let n = loop {
            let n = libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let count = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "too many descriptors",
            ));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        send(&a, &Request::List, &[f.as_raw_fd(), f.as_raw_fd()]).unwrap();
        send(
            &a,
            &Reply::Error {
                kind: ErrorKind::Busy,
                message: "x".into(),
            },
            &[],
        )
        .unwrap();
        let (r, fds): (Request, _) = recv(&b).unwrap().unwrap();
        assert!(matches!(r, Request::List));
        assert_eq!(fds.len(), 2);
        let (r, fds): (Reply, _) = recv(&b).unwrap().unwrap();
        assert!(matches!(
            r,
            Reply::Error {
                kind: ErrorKind::Busy,
                ..
            }
        ));
        assert!(fds.is_empty());
        // A reply of an older valed, without a kind.
        let old: Reply = serde_json::from_str(r#"{"reply":"error","message":"m"}"#).unwrap();
        assert!(matches!(
            old,
            Reply::Error {
                kind: ErrorKind::Io,
                ..
            }
        ));
        drop(a);
        assert!(recv::<Reply>(&b).unwrap().is_none());
    }
}

//! TAP ports: the host stack (or a container's, once the device is moved to its namespace)
//! as a port of the switch.
//!
//! The device is opened with `IFF_VNET_HDR` and TSO/checksum offloads, so the kernel hands
//! over TCP segments of up to 64 KiB with a virtio-net header and takes them back the same
//! way: between two TAP ports large segments cross the switch whole, in one read and one write
//! each. Every frame costs one system call each way; a TAP device has no batched interface.
//!
//! The port's thread reads; the switch's threads write each frame for the port straight from
//! the sender's buffers ([`TapSink`]), so a frame is copied twice between two TAP devices:
//! into the switch, and out of it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use vale_abi::region::{PortParams, MAX_FRAGS, MAX_FRAME_LEN};

use super::{polled, DevError, Device, DirectSink, Driver, Egress, Polled, TxSide};
use crate::offload::{Caps, Offload, VNET_HDR_LEN};
use crate::sink::{Delivered, OutFrames};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
const TUN_F_TSO_ECN: libc::c_ulong = 0x08;

/// Frames read per round: the rest waits for the next one, so egress gets its turn.
const INGRESS_BURST: usize = 64;

/// The ring geometry of a TAP port: 64 slots of 16 KiB. A 64 KiB segment takes 4 slots (5
/// iovecs per system call, not 33 with the default 2112-byte buffers), and the port's thread,
/// which reads a burst into the tx ring and at once writes it out to the destination TAP,
/// cycles through 1 MiB of buffers instead of 4.3 MiB: what the kernel copied in is still in
/// the cache when it copies it out, and the next reads land on lines that are. Measured
/// against 2048 × 2112 B (TCP, one stream, TAP to TAP): about a quarter less CPU per byte in
/// valed; 256 × 16 KiB gained half of that, 64 × 8 KiB and 64 × 4 KiB less. The rx ring is
/// used only by frames a direct write could not take (a TAP's never declines).
pub const TAP_PARAMS: PortParams = PortParams {
    tx_rings: 1,
    rx_rings: 1,
    slots: 64,
    buf_size: 16384,
};

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

pub struct Tap {
    /// The device's descriptor and state, shared with the switch's threads that write to it.
    sink: Arc<TapSink>,
    name: String,
    /// One iovec per slot a frame can take, plus the header's.
    iov: Vec<libc::iovec>,
}

// SAFETY: the iovecs are scratch space rebuilt before every use; nothing points across calls.
unsafe impl Send for Tap {}

fn ioctl(
    fd: RawFd,
    req: libc::c_ulong,
    arg: libc::c_ulong,
    what: &str,
) -> Result<(), super::Error> {
    // SAFETY: each request passes an integer or a pointer to a live, properly sized struct.
    if unsafe { libc::ioctl(fd, req, arg) } < 0 {
        let e = io::Error::last_os_error();
        return Err(super::Error::of_io(format!("{what}: {e}"), e));
    }
    Ok(())
}

/// `tap`: `name` (the device), `persist` (yes: the device stays after valed lets go).
pub const KIND: super::Kind = super::Kind {
    name: "tap",
    flag: super::Flag {
        long: "tap",
        value: Some("name"),
        help: "A TAP device, created or adopted",
    },
    about: "--tap NAME creates TAP device NAME, or adopts it if a persistent TAP of that name \
exists and nobody has it open. The TAP carries TSO segments and partial checksums as they are \
to other TAP ports; toward other ports valed segments and checksums in software. Move the TAP \
into a container's network namespace with 'ip link set NAME netns NS'; it stays on the switch. \
With --persist the TAP device outlives valed and the port.",
    args: &[
        super::Arg::new("name", "NAME", "The TAP device's name").required(),
        super::Arg::switch("persist", "Keep the TAP device after valed lets it go"),
    ],
    open: |args| {
        let name = super::required(args, "tap", "name")?;
        Ok(Box::new(Tap::open(name, super::flag(args, "persist")?)?))
    },
    saved_args: &["netns"],
    saved: |attached, device, _mode| {
        let mut args = attached.unwrap_or_else(|| [("name".into(), device.into())].into());
        args.remove("netns");
        // A TAP moved into a container's namespace: found there again at the next start.
        if let Some(ns) = netns_of(device) {
            args.insert("netns".into(), ns);
        }
        args
    },
    restore: |args| {
        let mut a = args.clone();
        match a.remove("netns") {
            None => (KIND.open)(&a),
            Some(ns) => in_netns(&ns, move || (KIND.open)(&a)),
        }
    },
};

/// Runs `f` in network namespace `ns` (a name under /run/netns, or a path), on a thread of its
/// own that ends right after, so that no other work runs there.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T, super::Error> + Send + 'static,
) -> Result<T, super::Error> {
    let path = if ns.contains('/') {
        std::path::PathBuf::from(ns)
    } else {
        std::path::Path::new("/run/netns").join(ns)
    };
    let nsfd = std::fs::File::open(&path).map_err(|e| {
        super::Error::of_io(format!("network namespace {}: {e}", path.display()), e)
    })?;
    std::thread::spawn(move || {
        // SAFETY: setns on this thread only (CLONE_NEWNET), with a descriptor we own.
        if unsafe { libc::setns(nsfd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(super::Error::io(format!(
                "cannot enter network namespace: {}",
                io::Error::last_os_error()
            )));
        }
        f()
    })
    .join()
    .map_err(|_| super::Error::io("the thread in the network namespace failed"))?
}

/// The network namespace (a name under /run/netns) interface `dev` lives in, if it is not in
/// valed's own.
fn netns_of(dev: &str) -> Option<String> {
    if dev.is_empty() || super::interface_exists(dev) {
        return None;
    }
    let entries = std::fs::read_dir("/run/netns").ok()?;
    for e in entries.flatten().take(4096) {
        let name = e.file_name().to_string_lossy().into_owned();
        let d = dev.to_string();
        if in_netns(&name, move || Ok(super::interface_exists(&d))) == Ok(true) {
            return Some(name);
        }
    }
    None
}

impl Tap {
    /// Creates TAP device `name`, or adopts it if a persistent one exists and is free.
    pub fn open(name: &str, persist: bool) -> Result<Tap, super::Error> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', '\0']) {
            return Err(super::Error::invalid(format!(
                "bad TAP name '{name}': 1 to {} characters, no '/' or spaces",
                libc::IFNAMSIZ - 1
            )));
        }
        let path = CString::new("/dev/net/tun").expect("no NUL");
        // SAFETY: plain syscall with a valid C string.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(super::Error::of_io(
                format!("cannot open /dev/net/tun: {e}"),
                e,
            ));
        }
        // SAFETY: fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        let raw = fd.as_raw_fd();
        ioctl(
            raw,
            TUNSETIFF,
            &mut req as *mut IfReq as libc::c_ulong,
            &format!("cannot create or adopt TAP device '{name}' (is it in use, or not a TAP?)"),
        )?;
        let hdr_len: libc::c_int = VNET_HDR_LEN as libc::c_int;
        ioctl(
            raw,
            TUNSETVNETHDRSZ,
            &hdr_len as *const libc::c_int as libc::c_ulong,
            "cannot set the virtio-net header size",
        )?;
        ioctl(
            raw,
            TUNSETOFFLOAD,
            TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN,
            "cannot enable TAP offloads",
        )?;
        ioctl(
            raw,
            TUNSETPERSIST,
            persist as libc::c_ulong,
            "cannot set TAP persistence",
        )?;
        let len = req
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(req.name.len());
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        Ok(Tap {
            sink: Arc::new(TapSink {
                fd,
                up: AtomicBool::new(true),
            }),
            name,
            iov: Vec::with_capacity(1 + MAX_FRAGS as usize),
        })
    }
}

fn classify(up: &AtomicBool, e: io::Error) -> DevError {
    match e.raw_os_error() {
        // Read or write on a TAP whose device was deleted.
        Some(libc::EBADFD) | Some(libc::ENODEV) | Some(libc::ENXIO) => {
            up.store(false, Relaxed);
            DevError::Down {
                err: io::Error::new(e.kind(), format!("TAP device went away ({e})")),
                pause: true,
            }
        }
        // Write to a TAP that is down.
        Some(libc::EIO) => {
            up.store(false, Relaxed);
            DevError::Down {
                err: e,
                pause: false,
            }
        }
        _ => DevError::Frame(e),
    }
}

/// Writes frames to a TAP device from any thread.
pub struct TapSink {
    fd: OwnedFd,
    /// No read or write has failed since the last that worked (a downed TAP answers writes
    /// with EIO; a deleted one answers everything with EBADFD).
    up: AtomicBool,
}

impl DirectSink for TapSink {
    fn send_batch(&self, frames: &mut dyn OutFrames, _flow: u32) -> Delivered {
        let mut d = Delivered::default();
        while let Some(f) = frames.next_frame() {
            match self.send(f.iov, f.offload) {
                Ok(()) => {
                    d.frames += 1;
                    d.bytes += f.len as u64;
                }
                Err(_) => d.dropped += 1,
            }
        }
        d
    }
}

impl TapSink {
    /// Writes one frame, with its virtio-net header, in one `writev`.
    fn send(&self, iov: &mut [libc::iovec], off: Offload) -> Result<(), DevError> {
        let hdr = off.to_virtio();
        iov[0] = libc::iovec {
            iov_base: hdr.as_ptr() as *mut libc::c_void,
            iov_len: VNET_HDR_LEN,
        };
        loop {
            // SAFETY: every iovec points at a live buffer of its length; writev only reads.
            let n = unsafe {
                libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int)
            };
            if n >= 0 {
                if !self.up.load(Relaxed) {
                    self.up.store(true, Relaxed);
                }
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(classify(&self.up, e));
            }
        }
    }
}

impl Device for Tap {
    fn describe(&self) -> (&'static str, String, String) {
        ("tap", self.name.clone(), String::new())
    }

    fn caps(&self) -> Caps {
        Caps(Caps::CSUM.0 | Caps::TSO4.0 | Caps::TSO6.0 | Caps::ECN.0)
    }

    fn params(&self) -> PortParams {
        TAP_PARAMS
    }

    fn direct(&self) -> Option<Arc<dyn DirectSink>> {
        Some(self.sink.clone())
    }
    fn driver(self: Box<Self>) -> Box<dyn Driver> {
        polled(self)
    }
}

impl Polled for Tap {
    fn poll_fds(&self) -> Vec<RawFd> {
        vec![self.sink.fd.as_raw_fd()]
    }
    fn ingress(&mut self, ring: &mut TxSide) -> Result<usize, DevError> {
        let bsize = ring.buf_size();
        // Read only when the largest frame fits: a TAP read cannot be taken back.
        let max_slots = ring.slots_for(MAX_FRAME_LEN as usize);
        let mut hdr = [0u8; VNET_HDR_LEN];
        let mut moved = 0;
        while moved < INGRESS_BURST && ring.room() >= max_slots {
            self.iov.clear();
            self.iov.push(libc::iovec {
                iov_base: hdr.as_mut_ptr() as *mut libc::c_void,
                iov_len: VNET_HDR_LEN,
            });
            for k in 0..max_slots {
                self.iov.push(libc::iovec {
                    iov_base: ring.buf(k) as *mut libc::c_void,
                    iov_len: bsize,
                });
            }
            // SAFETY: every iovec points at a live buffer of its length.
            let n = unsafe {
                libc::readv(
                    self.sink.fd.as_raw_fd(),
                    self.iov.as_ptr(),
                    self.iov.len() as libc::c_int,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    break;
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(classify(&self.sink.up, e));
            }
            let n = n as usize;
            if n < VNET_HDR_LEN + 14 || n - VNET_HDR_LEN > MAX_FRAME_LEN as usize {
                ring.refused += 1;
                continue;
            }
            let off = Offload::from_virtio(&hdr);
            let off = off.needs_work().then_some(off);
            ring.commit(n - VNET_HDR_LEN, off);
            moved += 1;
        }
        Ok(moved)
    }
    fn is_up(&self) -> bool {
        self.sink.up.load(Relaxed)
    }
}

impl Egress for Tap {
    fn send(&mut self, pieces: &[&[u8]], off: Offload) -> Result<bool, DevError> {
        // Only reached if a frame came through the rx ring; the switch writes through
        // `direct`.
        self.iov.clear();
        self.iov.push(libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        });
        for p in pieces {
            self.iov.push(libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            });
        }
        self.sink.send(&mut self.iov, off).map(|()| true)
    }

    fn flush(&mut self) -> Result<(), DevError> {
        Ok(())
    }
}

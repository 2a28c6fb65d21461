//! Test scaffolding: a private network namespace holding a veth pair, a raw AF_PACKET socket
//! for the peer end, frame builders and a log catcher.
//!
//! Needs root and `ip` (iproute2). Nothing outside the namespaces made here is touched.

#![allow(dead_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ethertype of our test frames (IEEE local experimental), so stray IPv6 chatter is ignored.
pub const TEST_ETHERTYPE: u16 = 0x88b5;

static SEQ: AtomicU32 = AtomicU32::new(0);

pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2 must be installed)");
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace with a veth pair `a`/`b` (both up), deleted on drop even when the
/// test panics.
pub struct Netns {
    pub name: String,
    pub a: String,
    pub b: String,
}

impl Netns {
    pub fn new() -> Netns {
        Netns::with_queues(1)
    }

    /// Both veth ends get `queues` rx and tx queues.
    pub fn with_queues(queues: u32) -> Netns {
        init_logs();
        let q = queues.to_string();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("valenic-{pid}-{n}");
        let a = format!("vn{pid}a{n}");
        let b = format!("vn{pid}b{n}");
        let a = a[a.len().saturating_sub(15)..].to_string();
        let b = b[b.len().saturating_sub(15)..].to_string();
        ip(&["netns", "add", &name]);
        let ns = Netns { name, a, b };
        ip(&[
            "-n",
            &ns.name,
            "link",
            "add",
            &ns.a,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            &ns.b,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ]);
        ip(&["-n", &ns.name, "link", "set", &ns.a, "up"]);
        ip(&["-n", &ns.name, "link", "set", &ns.b, "up"]);
        ns
    }

    /// Runs `f` on a fresh thread that has entered this namespace (setns affects only the
    /// calling thread's network namespace). Panics in `f` propagate.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        let h = std::thread::spawn(move || {
            let file = File::open(&path).expect("opening the netns");
            // SAFETY: plain syscall on a namespace file we hold open.
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
            f()
        });
        match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    }

    pub fn link_show(&self, dev: &str) -> String {
        ip(&["-n", &self.name, "link", "show", "dev", dev])
    }

    pub fn delete_link(&self, dev: &str) {
        ip(&["-n", &self.name, "link", "del", dev]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace takes the veth pair with it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Sets GRO on `dev` through the ethtool ioctl (no ethtool binary needed). Native XDP on a
/// veth receives through NAPI, which the peer's GRO setting switches on for non-XDP peers.
pub fn set_gro(dev: &str, on: bool) -> io::Result<()> {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        data: *mut libc::c_void,
        _pad: [u8; 16],
    }
    const ETHTOOL_SGRO: u32 = 0x2c;
    let mut v = EthtoolValue {
        cmd: ETHTOOL_SGRO,
        data: on as u32,
    };
    let mut req = IfReq {
        name: [0; 16],
        data: &mut v as *mut EthtoolValue as *mut libc::c_void,
        _pad: [0; 16],
    };
    req.name[..dev.len()].copy_from_slice(dev.as_bytes());
    // SAFETY: plain syscalls; `req` and `v` outlive the ioctl.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let s = OwnedFd::from_raw_fd(s);
        if libc::ioctl(s.as_raw_fd(), 0x8946, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Empties the calling thread's capability sets (capabilities are per thread).
pub fn drop_all_capabilities() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let hdr = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: capset with a valid header and the two data words version 3 expects.
    let r = unsafe { libc::syscall(libc::SYS_capset, &hdr, data.as_ptr()) };
    assert_eq!(r, 0, "capset: {}", io::Error::last_os_error());
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; plain syscall on the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let r = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(r, 0, "sched_setaffinity: {}", io::Error::last_os_error());
    }
}

pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A raw packet socket on the peer end, for injecting and capturing frames.
pub struct Raw {
    fd: OwnedFd,
}

impl Raw {
    pub fn open(dev: &str) -> Raw {
        Raw::open_with(dev, false)
    }

    /// With `bypass`, frames skip the qdisc and leave on tx queue `cpu % queues` of the
    /// sending CPU, which on veth is also the peer's rx queue.
    pub fn open_with(dev: &str, bypass: bool) -> Raw {
        let ifindex = {
            let c = std::ffi::CString::new(dev).unwrap();
            // SAFETY: NUL-terminated name.
            unsafe { libc::if_nametoindex(c.as_ptr()) }
        };
        assert!(ifindex != 0, "no interface {dev}");
        // SAFETY: plain syscalls on a socket we own; structs outlive the calls.
        unsafe {
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            );
            assert!(fd >= 0, "packet socket: {}", io::Error::last_os_error());
            let fd = OwnedFd::from_raw_fd(fd);
            let one: i32 = 1;
            libc::setsockopt(
                fd.as_raw_fd(),
                263, // SOL_PACKET
                23,  // PACKET_IGNORE_OUTGOING
                &one as *const i32 as *const libc::c_void,
                4,
            );
            if bypass {
                let r = libc::setsockopt(
                    fd.as_raw_fd(),
                    263, // SOL_PACKET
                    20,  // PACKET_QDISC_BYPASS
                    &one as *const i32 as *const libc::c_void,
                    4,
                );
                assert_eq!(r, 0, "PACKET_QDISC_BYPASS: {}", io::Error::last_os_error());
            }
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 20_000,
            };
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
            sll.sll_ifindex = ifindex as i32;
            let r = libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(r, 0, "bind: {}", io::Error::last_os_error());
            Raw { fd }
        }
    }

    pub fn send(&self, frame: &[u8]) {
        // SAFETY: `frame` is a live buffer of the given length.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            r,
            frame.len() as isize,
            "peer send: {}",
            io::Error::last_os_error()
        );
    }

    /// Next test frame (our ethertype, at offset 12 or behind a VLAN tag), or None after
    /// `timeout`.
    pub fn recv_test_frame(&self, timeout: Duration) -> Option<Vec<u8>> {
        let end = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        while Instant::now() < end {
            // SAFETY: `buf` is writable for its length.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC,
                )
            };
            if r < 0 {
                continue;
            }
            let f = &buf[..(r as usize).min(buf.len())];
            if is_test_frame(f) {
                return Some(f.to_vec());
            }
        }
        None
    }
}

pub fn is_test_frame(f: &[u8]) -> bool {
    f.len() >= 14 && u16::from_be_bytes([f[12], f[13]]) == TEST_ETHERTYPE
}

/// A test frame: broadcast destination, fixed source, our ethertype, then `seq` and a pattern
/// derived from it, `len` bytes in all.
pub fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[0x02, 0x00, 0x5e, 0x10, 0x00, 0x01]);
    f.extend_from_slice(&TEST_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    let mut i = 0u32;
    while f.len() < len {
        f.push((seq.wrapping_mul(31).wrapping_add(i) & 0xff) as u8);
        i += 1;
    }
    f.truncate(len);
    f
}

pub fn seq_of(f: &[u8]) -> u32 {
    u32::from_be_bytes([f[14], f[15], f[16], f[17]])
}

/// Length of test frame `i`: spread over 60..=1514.
pub fn len_of(i: u32) -> usize {
    60 + (i as usize * 97) % 1455
}

/// Every tracing event of the process, with the thread that emitted it.
static LOGS: Mutex<Vec<(std::thread::ThreadId, String)>> = Mutex::new(Vec::new());

/// Installs the process-wide log catcher once, before any test touches vale-nic (a scoped
/// subscriber would race with other test threads over tracing's per-callsite cache).
pub fn init_logs() {
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    struct Catch;
    struct Msg<'a>(&'a mut String);
    impl Visit for Msg<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0.push_str(&format!("{value:?}"));
            }
        }
    }
    impl Subscriber for Catch {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            let mut s = format!("{} ", e.metadata().level());
            e.record(&mut Msg(&mut s));
            eprintln!("{s}");
            LOGS.lock().unwrap().push((std::thread::current().id(), s));
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(Catch).expect("no other subscriber");
    });
}

/// Collects tracing messages emitted while `f` runs on this thread.
pub fn capture_logs<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    init_logs();
    let me = std::thread::current().id();
    let start = LOGS.lock().unwrap().len();
    let r = f();
    let logs = LOGS.lock().unwrap()[start..]
        .iter()
        .filter(|(t, _)| *t == me)
        .map(|(_, s)| s.clone())
        .collect();
    (r, logs)
}

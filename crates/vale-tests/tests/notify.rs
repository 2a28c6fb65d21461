//! The notification lines and the control connection as clients see them: a client that turns
//! its lines against valed, clients whose valed dies, and a rate-limited sender.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vale_abi::control::{self, Reply, Request, SOCKET_NAME};
use vale_abi::csb::{CsbAtok, CsbKtoa};
use vale_abi::netmap::{NetmapSlot, RING_SLOTS_OFS};
use vale_abi::region::{Layout, PortParams, VALE_ABI_VERSION};
use vale_tests::*;

/// The hostile port's own address: every frame it sends is from and to it, so the bridge
/// drops it (it never reaches a or b).
const MAC_X: [u8; 6] = [2, 0, 0, 0, 0, 0xe];
const MAC_D: [u8; 6] = [2, 0, 0, 0, 0, 0xd];

/// Sets its flag when dropped (also when a test panics), so helper threads stop.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Release);
    }
}

// ---- 1. a client that turns its notification lines against valed ---------------------------

/// A client written by hand against the control protocol, holding every descriptor valed
/// sent, with no library in between.
struct Hostile {
    ctl: UnixStream,
    base: *mut u8,
    layout: Layout,
    /// Per ring, in region order: (kick, interrupt), as received.
    lines: Vec<(OwnedFd, OwnedFd)>,
    _memfd: OwnedFd,
}

// SAFETY: the mapping is shared memory, used with atomics or volatile writes only.
unsafe impl Send for Hostile {}
unsafe impl Sync for Hostile {}

fn clear_nonblock(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we hold.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert!(fl >= 0, "F_GETFL: {}", std::io::Error::last_os_error());
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK), 0);
    }
}

fn write_u64(fd: RawFd, v: u64) -> isize {
    // SAFETY: writes 8 bytes from a live u64.
    unsafe { libc::write(fd, &v as *const u64 as *const libc::c_void, 8) }
}

impl Hostile {
    fn open(v: &Valed, name: &str) -> Hostile {
        let ctl = UnixStream::connect(v.run_dir().join(SOCKET_NAME)).expect("connect");
        let params = PortParams::default();
        let req = Request::Open {
            port: name.to_string(),
            params,
            abi_version: VALE_ABI_VERSION,
        };
        control::send(&ctl, &req, &[]).expect("send open");
        let (reply, fds) = control::recv::<Reply>(&ctl)
            .expect("recv")
            .expect("a reply");
        assert!(matches!(reply, Reply::Opened { .. }), "{reply:?}");
        let layout = Layout::new(&params).expect("layout");
        assert_eq!(fds.len(), 1 + 2 * layout.num_rings() as usize);
        let mut fds = fds.into_iter();
        let memfd = fds.next().expect("memfd");
        let mut lines = Vec::new();
        while let (Some(k), Some(i)) = (fds.next(), fds.next()) {
            lines.push((k, i));
        }
        // SAFETY: maps the memfd valed sent, with the size both sides compute.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.region_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        Hostile {
            ctl,
            base: base as *mut u8,
            layout,
            lines,
            _memfd: memfd,
        }
    }

    fn atok(&self, i: u32) -> &CsbAtok {
        // SAFETY: inside the mapping, 64-byte aligned.
        unsafe { &*(self.base.add(self.layout.csb_atok_ofs(i) as usize) as *const CsbAtok) }
    }

    fn ktoa(&self, i: u32) -> &CsbKtoa {
        // SAFETY: as above.
        unsafe { &*(self.base.add(self.layout.csb_ktoa_ofs(i) as usize) as *const CsbKtoa) }
    }

    /// Every slot of tx ring 0 holds a 60-byte frame from x to x.
    fn prepare_tx(&self) {
        // SAFETY: both offsets lie inside the mapping.
        let (ring, bufs) = unsafe {
            (
                self.base.add(self.layout.ring_ofs(0) as usize),
                self.base.add(self.layout.bufs_ofs as usize),
            )
        };
        let frame = test_frame(60, MAC_X, MAC_X, 0);
        for s in 0..self.layout.params.slots {
            // SAFETY: slots and buffers of our own mapping, before valed is told of them.
            unsafe {
                let slot = &mut *(ring.add(RING_SLOTS_OFS + 16 * s as usize) as *mut NetmapSlot);
                assert!(slot.buf_idx < self.layout.num_bufs);
                let b = bufs.add(slot.buf_idx as usize * self.layout.params.buf_size as usize);
                std::ptr::copy_nonoverlapping(frame.as_ptr(), b, frame.len());
                slot.len = 60;
                slot.flags = 0;
            }
        }
    }

    /// The attack on the lines: fill every interrupt line as far as it takes writes (an
    /// eventfd to one below its limit, so valed's next signal would overflow it), then make
    /// every received descriptor blocking, and ask for every interrupt valed can raise.
    fn arm(&self) {
        for (_, irq) in &self.lines {
            let fd = irq.as_raw_fd();
            let mut junk = [0u8; 4096];
            // SAFETY: reads into a live buffer (non-blocking still).
            unsafe { libc::read(fd, junk.as_mut_ptr() as *mut libc::c_void, junk.len()) };
            write_u64(fd, 0xffff_ffff_ffff_fffe);
        }
        clear_nonblock(self._memfd.as_raw_fd());
        for (kick, irq) in &self.lines {
            clear_nonblock(kick.as_raw_fd());
            clear_nonblock(irq.as_raw_fd());
        }
        for i in 0..self.layout.num_rings() {
            self.atok(i).appl_need_kick.store(1, Release);
        }
    }

    /// Hands valed every slot of tx ring 0 the client owns, and kicks.
    fn push(&self) {
        let tail = self.ktoa(0).hwtail.load(Acquire) % self.layout.params.slots;
        self.atok(0).cur.store(tail, Relaxed);
        self.atok(0).head.store(tail, Release);
        self.atok(0).appl_need_kick.store(1, Release);
        write_u64(self.lines[0].0.as_raw_fd(), 1);
    }

    /// Closes the port as libvale does (half-close, wait for valed to close its end);
    /// how long valed took.
    fn close(self) -> Duration {
        use std::io::Read;
        let t0 = Instant::now();
        self.ctl
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        self.ctl
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut sink = [0u8; 256];
        while matches!((&self.ctl).read(&mut sink), Ok(n) if n > 0) {}
        let took = t0.elapsed();
        // SAFETY: unmaps what `open` mapped.
        unsafe {
            libc::munmap(
                self.base as *mut libc::c_void,
                self.layout.region_size as usize,
            )
        };
        took
    }
}

const STREAM: u64 = 20_000;
const STREAM_US: u64 = 2_000_000;
const WINDOW: u64 = 256;
/// Longest a checked stream may go without progress.
const STALL: Duration = Duration::from_secs(3);

#[test]
fn blocking_lines_of_a_client_do_not_stop_valed() {
    let _g = serial();
    let mut v = Valed::start();
    let (a, b) = v.open_learnt_pair();
    let fds_before = v.fd_count();

    let x = Arc::new(Hostile::open(&v, "vale0:x"));
    x.prepare_tx();
    x.arm();

    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_exit = SetOnDrop(stop.clone());
    // Steals valed's kicks: a blocking read that competes with valed's for every kick of x.
    let stealer = std::thread::spawn({
        let (x, stop) = (x.clone(), stop.clone());
        move || {
            let fd = x.lines[0].0.as_raw_fd();
            let mut stolen = 0u64;
            while !stop.load(Acquire) {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a live u64 (blocking: that is the attack).
                let n = unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
                if n == 8 {
                    stolen += v;
                }
            }
            stolen
        }
    });
    // Keeps valed forwarding x's tx ring, so it raises x's interrupts again and again.
    let pusher = std::thread::spawn({
        let (x, stop) = (x.clone(), stop.clone());
        move || {
            let mut rounds = 0u64;
            while !stop.load(Acquire) {
                x.push();
                rounds += 1;
                std::thread::sleep(Duration::from_micros(100));
            }
            rounds
        }
    });

    // The checked stream a -> b, beside the attack.
    let t0 = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let receiver = std::thread::spawn({
        let (b, received) = (b.clone(), received.clone());
        move || {
            let mut next = 0u64;
            let mut progress = Instant::now();
            while next < STREAM {
                let frames = recv_frames(&b);
                if frames.is_empty() {
                    assert!(
                        progress.elapsed() < STALL,
                        "b: the stream stalled at frame {next} of {STREAM}"
                    );
                    b.poll(READABLE, Some(Duration::from_millis(50)))
                        .expect("poll b");
                    continue;
                }
                for f in frames {
                    if f[6..12] != MAC_A {
                        continue;
                    }
                    let seq = u64::from_le_bytes(f[14..22].try_into().unwrap());
                    assert_eq!(seq, next, "b: frame {next} lost or out of order");
                    assert!(
                        f == test_frame(60 + (seq % 300) as usize, MAC_A, MAC_B, seq),
                        "b: frame {seq} is not what a sent"
                    );
                    next += 1;
                    progress = Instant::now();
                }
                received.store(next, Release);
            }
        }
    });
    let sender = std::thread::spawn({
        let (a, received) = (a.clone(), received.clone());
        move || {
            let mut seq = 0u64;
            let (mut seen, mut progress) = (0u64, Instant::now());
            while seq < STREAM {
                let got = received.load(Acquire);
                if got != seen {
                    (seen, progress) = (got, Instant::now());
                }
                assert!(
                    progress.elapsed() < STALL,
                    "a: b received nothing for {STALL:?} (sent {seq})"
                );
                let due = (t0.elapsed().as_micros() as u64 * STREAM / STREAM_US).min(STREAM);
                let room = received.load(Acquire) + WINDOW - seq;
                let n = (due - seq.min(due)).min(room).min(32);
                if n == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                for _ in 0..n {
                    let f = test_frame(60 + (seq % 300) as usize, MAC_A, MAC_B, seq);
                    let deadline = Instant::now() + STALL;
                    while !send_frame(&a, &f) {
                        assert!(Instant::now() < deadline, "a: tx ring full for {STALL:?}");
                        a.poll(WRITABLE, Some(Duration::from_millis(50)))
                            .expect("poll a");
                    }
                    if seq.is_multiple_of(50) {
                        // Now and then a frame for x: valed delivers to x's rx ring too and
                        // raises its interrupt.
                        let noise = test_frame(60, MAC_D, MAC_X, seq);
                        let _ = send_frame(&a, &noise);
                    }
                    seq += 1;
                }
                a.txsync(0).expect("txsync a");
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    join_by("a's sender", sender, deadline);
    join_by("b's receiver", receiver, deadline);
    let stream_time = t0.elapsed();

    // A new pair on another switch, opened after the attack, still works.
    let c = v.open("vale1:c");
    let d = v.open("vale1:d");
    send_and_expect(
        &c,
        &d,
        &test_frame(100, MAC_C, BROADCAST, 1),
        "vale1: c to d",
    );

    stop.store(true, Release);
    let rounds = join_by("x's pusher", pusher, deadline);
    // Wake the stealer until it sees the stop (valed may take some of these kicks itself).
    let stealer_done = Instant::now() + Duration::from_secs(5);
    while !stealer.is_finished() {
        assert!(
            Instant::now() < stealer_done,
            "cannot wake x's kick stealer"
        );
        write_u64(x.lines[0].0.as_raw_fd(), 1);
        std::thread::sleep(Duration::from_millis(1));
    }
    let stolen = stealer.join().expect("stealer");
    eprintln!(
        "{STREAM} frames a->b in {stream_time:?} beside x: {rounds} pushes, {stolen} kicks stolen"
    );
    assert!(v.alive(), "valed died: {}", v.log());
    let cb = v.counters("vale0:b");
    assert_eq!(cb.rx_drops, 0, "b lost frames: {cb:?}");
    assert!(
        v.counters("vale0:x").tx_packets > 0,
        "valed never forwarded x's frames, so never raised its interrupts"
    );

    drop((c, d));
    let x = Arc::try_unwrap(x).ok().expect("x has no other user");
    let took = x.close();
    assert!(took < Duration::from_secs(1), "closing x took {took:?}");
    assert!(
        wait_until(Duration::from_secs(2), || v.fd_count() <= fds_before),
        "valed holds {} descriptors, {fds_before} before x",
        v.fd_count()
    );
    // And the stream still flows (once b has read the frames for x flooded before the
    // bridge learnt x).
    while !recv_frames(&b).is_empty() {}
    send_and_expect(
        &a,
        &b,
        &test_frame(70, MAC_A, MAC_B, 7),
        "a to b after x left",
    );
}

// ---- 2. valed dies under its clients --------------------------------------------------------

/// How long a client may take to notice that valed is gone.
const NOTICE: Duration = Duration::from_secs(3);

#[test]
fn pktgen_says_valed_went_away() {
    let _g = serial();
    let v = Valed::start();
    let rx = v.spawn_client(
        v.pktgen(&["-i", "vale0:b", "-f", "rx", "-q"]),
        "vale-pktgen rx",
        "vale0:b",
    );
    let tx = v.spawn_client(
        v.pktgen(&["-i", "vale0:a", "-f", "tx", "-q"]),
        "vale-pktgen tx",
        "vale0:a",
    );
    // A rate-limited sender too: it waits mostly in sleeps, not in poll.
    let slow = v.spawn_client(
        v.pktgen(&["-i", "vale0:c", "-f", "tx", "-q", "-R", "1000"]),
        "vale-pktgen tx -R 1000",
        "vale0:c",
    );
    std::thread::sleep(Duration::from_millis(300));
    v.signal(libc::SIGKILL);
    for (kid, what) in [(tx, "tx"), (rx, "rx"), (slow, "tx -R 1000")] {
        let out = kid.finish(NOTICE);
        assert_exit(&out, &format!("vale-pktgen {what}"), 1, "valed went away");
    }
}

#[test]
fn libvale_clients_notice_valed_death() {
    let _g = serial();
    let v = Valed::start();
    let sleeper = Arc::new(v.open("vale0:p"));
    let spinner = Arc::new(v.open("vale0:q"));
    // Alone on its switch: its floods wake nobody.
    let sender = Arc::new(v.open("vale1:s"));
    let polling = std::thread::spawn({
        let p = sleeper.clone();
        move || {
            let r = p.poll(READABLE, None);
            (r, Instant::now())
        }
    });
    let spinning = std::thread::spawn({
        let q = spinner.clone();
        move || loop {
            if let Err(e) = q.rxsync(0) {
                return (e, Instant::now());
            }
            std::hint::spin_loop();
        }
    });
    // A sender that fills its ring and keeps syncing.
    let sending = std::thread::spawn({
        let s = sender.clone();
        move || loop {
            send_frame(&s, &test_frame(60, MAC_C, BROADCAST, 0));
            if let Err(e) = s.txsync(0) {
                return (e, Instant::now());
            }
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !polling.is_finished(),
        "poll(None) returned with nothing to read"
    );
    let killed = Instant::now();
    v.signal(libc::SIGKILL);
    let deadline = killed + NOTICE;
    let (r, at) = join_by("the client in poll(None)", polling, deadline);
    let e = r.expect_err("poll after valed died");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(e.to_string().contains("valed went away"), "{e}");
    eprintln!("poll noticed in {:?}", at - killed);
    let (e, at) = join_by("the client spinning on rxsync", spinning, deadline);
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    eprintln!("rxsync noticed in {:?}", at - killed);
    let (e, at) = join_by("the client sending", sending, deadline);
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    eprintln!("txsync noticed in {:?}", at - killed);
    // Every later call fails the same way; closing is still prompt.
    assert!(sleeper.txsync(0).is_err() && sleeper.rxsync(0).is_err());
    let t = Instant::now();
    drop((sleeper, spinner, sender));
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "close took {:?}",
        t.elapsed()
    );
}

/// `struct vale_open_opts` of vale.h.
#[repr(C)]
struct ValeOpenOpts {
    tx_rings: u32,
    rx_rings: u32,
    slots: u32,
    buf_size: u32,
    run_dir: *const std::ffi::c_char,
    no_autostart: libc::c_int,
}

// The C interface of libvale, as vale.h declares it (linked in with the libvale crate).
unsafe extern "C" {
    fn vale_open_opts_init(o: *mut ValeOpenOpts);
    fn vale_open(name: *const std::ffi::c_char, o: *const ValeOpenOpts) -> *mut libc::c_void;
    fn vale_poll(p: *mut libc::c_void, events: libc::c_int, timeout_ms: libc::c_int)
        -> libc::c_int;
    fn vale_rxsync(p: *mut libc::c_void, ring: u32) -> libc::c_int;
    fn vale_close(p: *mut libc::c_void);
    fn vale_last_error() -> *const std::ffi::c_char;
}

#[test]
fn c_client_in_vale_poll_notices_valed_death() {
    let _g = serial();
    let v = Valed::start();
    let dir = std::ffi::CString::new(v.run_dir().to_str().expect("utf-8")).unwrap();
    let name = std::ffi::CString::new("vale0:c").unwrap();
    // SAFETY: the calls as vale.h documents them, with live, NUL-terminated strings.
    let p = unsafe {
        let mut o = std::mem::MaybeUninit::<ValeOpenOpts>::uninit();
        vale_open_opts_init(o.as_mut_ptr());
        let mut o = o.assume_init();
        o.run_dir = dir.as_ptr();
        o.no_autostart = 1;
        vale_open(name.as_ptr(), &o)
    };
    assert!(!p.is_null(), "vale_open failed");
    let p = p as usize;
    let waiter = std::thread::spawn(move || {
        // SAFETY: an open port, used by this thread alone until it is closed below.
        unsafe {
            let r = vale_poll(p as *mut libc::c_void, 1, -1);
            let errno = *libc::__errno_location();
            let msg = std::ffi::CStr::from_ptr(vale_last_error())
                .to_string_lossy()
                .into_owned();
            let again = vale_rxsync(p as *mut libc::c_void, 0);
            (r, errno, msg, again)
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !waiter.is_finished(),
        "vale_poll(-1) returned with nothing to read"
    );
    v.signal(libc::SIGKILL);
    let (r, errno, msg, again) = join_by("vale_poll(-1)", waiter, Instant::now() + NOTICE);
    assert_eq!(r, -1);
    assert_eq!(errno, libc::ECONNRESET, "{msg}");
    assert!(msg.contains("valed went away"), "{msg}");
    assert_eq!(again, -1, "vale_rxsync after valed went away");
    // SAFETY: the port from vale_open, no longer used by anyone.
    unsafe { vale_close(p as *mut libc::c_void) };
}

// ---- 3. a rate-limited sender ---------------------------------------------------------------

#[test]
fn rate_limited_tx_keeps_its_rate() {
    let _g = serial();
    let v = Valed::start();
    let rx = v.spawn_client(
        v.pktgen(&["-i", "vale0:b", "-f", "rx", "-q"]),
        "vale-pktgen rx",
        "vale0:b",
    );
    const RATE: u64 = 200_000;
    const SECS: u64 = 3;
    let rate = RATE.to_string();
    let secs = SECS.to_string();
    // A small ring fills at the first hiccup of valed: the sender must keep syncing then.
    let tx = Kid::spawn(
        v.pktgen(&[
            "-i", "vale0:a", "-f", "tx", "-R", &rate, "-T", &secs, "--slots", "64", "--json",
        ]),
        "vale-pktgen tx -R",
    )
    .finish(Duration::from_secs(SECS + 10));
    let t = report(&tx, "vale-pktgen tx -R");
    let sent = t["packets"].as_u64().expect("packets");
    let want = RATE * SECS;
    assert!(
        sent >= want / 2 && sent <= want + want / 20,
        "sent {sent} frames in {SECS} s at -R {RATE}: {t}"
    );
    // What left a reached b's ring or is counted as dropped there.
    assert!(
        wait_until(T, || {
            let c = v.counters("vale0:b");
            c.rx_packets + c.rx_drops >= sent
        }),
        "b: {:?} of {sent}",
        v.counters("vale0:b")
    );
    let cb = v.counters("vale0:b");
    assert!(
        cb.rx_packets >= want / 2,
        "b received {} of the {want} frames -R {RATE} asks for in {SECS} s: {cb:?}",
        cb.rx_packets
    );
    rx.signal(libc::SIGTERM);
    rx.finish(T);
}

/// Write system calls this thread has made (`/proc/thread-self/io`, `syscw`).
fn thread_writes() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").expect("read /proc/thread-self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("syscw: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("syscw in /proc/thread-self/io")
}

/// A txsync whose head did not move kicks no one, even while valed sleeps and asks for kicks;
/// one that queued a frame kicks once, and the frame goes.
#[test]
fn txsync_kicks_only_when_head_moved() {
    let v = Valed::start();
    let (a, b) = v.open_ab();
    // valed sleeps on a's idle tx ring, its kick flag raised.
    std::thread::sleep(Duration::from_millis(50));
    let before = thread_writes();
    for _ in 0..10_000 {
        a.txsync(0).expect("txsync");
    }
    let idle = thread_writes() - before;
    assert!(idle <= 2, "{idle} writes for 10000 syncs of an idle ring");
    let f = test_frame(60, MAC_X, MAC_D, 1);
    let before = thread_writes();
    send_all(&a, std::slice::from_ref(&f));
    assert!(thread_writes() - before >= 1, "no kick for a queued frame");
    assert_eq!(wait_frames(&b, Duration::from_secs(5)), vec![f]);
}

/// Slots queued (head moved) but not synced go out when the client waits for frames only,
/// as netmap's poll pushes out tx rings: a ping that queues and then polls for the reply.
#[test]
fn poll_for_frames_pushes_out_queued_slots() {
    let v = Valed::start();
    let (a, b) = v.open_ab();
    let f = test_frame(60, MAC_X, MAC_D, 2);
    queue_chain(&mut a.tx_ring(0), std::iter::once(&f[..]), true);
    // Waiting for a reply that cannot come: only the push matters here.
    a.poll(vale::Events::READABLE, Some(Duration::from_millis(50)))
        .expect("poll");
    assert_eq!(wait_frames(&b, Duration::from_secs(5)), vec![f]);
}

// ---- 5. the pollable descriptor of a port (vale_fd, vale_arm) --------------------------------

/// poll(2) on one descriptor for readability; true if it is readable within `ms`.
fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLIN != 0 }
}

#[test]
fn a_ports_descriptor_sleeps_in_poll_and_epoll_until_a_frame_comes() {
    let v = Valed::start();
    let (a, b) = v.open_ab();
    let fd = b.fd().expect("descriptor");
    assert_eq!(b.fd().expect("descriptor"), fd, "one descriptor per port");
    // The same descriptor in an epoll instance of the program's own.
    // SAFETY: plain syscalls on descriptors we own.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 7,
    };
    assert_eq!(
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) },
        0
    );
    for k in 0..3u64 {
        // Armed with nothing there: the descriptor stays quiet.
        assert_eq!(
            b.arm(vale::Events::READABLE).expect("arm"),
            vale::Events::default()
        );
        assert!(!readable(fd, 100), "round {k}: readable with nothing sent");
        assert!(send_frame(&a, &test_frame(60, MAC_A, BROADCAST, k)));
        a.txsync(0).expect("txsync");
        // It wakes up, in poll and in epoll alike; arm then reports the frame (no sleep).
        assert!(readable(fd, 2000), "round {k}: not readable after a frame");
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: the array outlives the call.
        let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 2, 2000) };
        assert_eq!(
            (n, { out[0].u64 }),
            (1, 7),
            "round {k}: epoll did not report it"
        );
        assert_eq!(
            b.arm(vale::Events::READABLE).expect("arm"),
            vale::Events::READABLE
        );
        assert_eq!(recv_frames(&b).len(), 1, "round {k}");
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(ep) };
    // valed going away makes the descriptor readable, and arm fails with the port gone.
    assert_eq!(
        b.arm(vale::Events::READABLE).expect("arm"),
        vale::Events::default()
    );
    drop(v);
    assert!(readable(fd, 5000), "not readable after valed went away");
    let e = b.arm(vale::Events::READABLE).expect_err("valed is gone");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
}

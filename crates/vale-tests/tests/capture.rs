//! `vale-ctl capture` read by the real tools: tcpdump and tshark read captures of vale-pktgen
//! traffic on native ports and of pings through a port of each host kind (a TAP port, a NIC
//! port, a guest's vhost-user port); a reader that stops costs capture drops, never a frame of
//! the port; a capture of a port that goes away ends cleanly; only the port's owner or an
//! administrator may capture; capture filters run on their owner's budget, never another
//! stream's frames; capture buffers count in their user's port memory. Needs tcpdump and tshark (the README's test command installs
//! them); the TAP, NIC and rights tests need root, the vhost-user test QEMU and a guest kernel
//! too. Without them, tests say so and pass.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vale_tests::guest::{skip_reason, Guest, GuestConfig};
use vale_tests::netns::{NicNet, TapNet};
use vale_tests::*;

/// tshark's `frame.packet_flags_direction` of pcapng's epb_flags.
const INBOUND: &str = "0x00000001";
const OUTBOUND: &str = "0x00000002";

fn tools() -> bool {
    let ok = which("tcpdump").is_some() && which("tshark").is_some();
    if !ok {
        eprintln!("skipped: needs tcpdump and tshark");
    }
    ok
}

fn root() -> bool {
    // SAFETY: plain syscall.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root");
    }
    root
}

/// `vale-ctl capture ARGS...` of valed `v`, started.
fn capture(v: &Valed, args: &[&str]) -> Kid {
    let mut all = vec!["capture"];
    all.extend_from_slice(args);
    Kid::spawn(
        tool("vale-ctl", v.run_dir(), &all),
        &format!("vale-ctl {all:?}"),
    )
}

/// Waits until valed has started `n` captures (its log says so).
fn captures_started(v: &Valed, n: usize) {
    assert!(
        wait_until(T, || v.log().matches("capture started").count() >= n),
        "valed never started {n} captures:\n{}",
        v.log()
    );
}

fn tcpdump(file: &Path, filter: &str) -> Vec<String> {
    let mut c = Command::new("tcpdump");
    c.args(["-n", "-r"]).arg(file);
    if !filter.is_empty() {
        c.arg(filter);
    }
    let out = stdout_of(&run_bounded(&mut c, T), "tcpdump");
    out.lines().map(str::to_string).collect()
}

/// `tshark -r FILE [-Y FILTER] -T fields -e F...`: one row of fields per frame.
fn tshark(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(file);
    if !filter.is_empty() {
        c.args(["-Y", filter]);
    }
    c.args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = stdout_of(&run_bounded(&mut c, T), "tshark");
    out.lines()
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect()
}

/// The frames captured and dropped, from vale-ctl capture's last line on stderr.
fn captured(out: &Output) -> (u64, u64) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "vale-ctl capture failed: {err}");
    let line = err
        .lines()
        .find(|l| l.contains("frames captured"))
        .unwrap_or_else(|| panic!("no summary: {err}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let num = |w: &str| -> u64 {
        let i = words.iter().position(|x| *x == w).expect(w);
        words[i - 1].parse().expect("a number")
    };
    (num("frames"), num("dropped"))
}

#[test]
fn pktgen_traffic_is_read_by_tcpdump_and_tshark() {
    if !tools() {
        return;
    }
    let _s = serial();
    let v = Valed::start();
    let dir = TempDir::new("capture");
    let (fa, fb) = (dir.0.join("a.pcapng"), dir.0.join("b.pcap"));
    v.ctl_ok(&["create", "vale0:a"]);
    let rx = v.spawn_client(
        v.pktgen(&[
            "-i", "vale0:b", "-f", "rx", "-T", "60", "-n", "1000", "--json",
        ]),
        "vale-pktgen rx",
        "vale0:b",
    );
    let n = "1000";
    let ca = capture(
        &v,
        &[
            "vale0:a",
            "-c",
            n,
            "-w",
            fa.to_str().unwrap(),
            "--duration",
            "60",
        ],
    );
    let cb = capture(
        &v,
        &[
            "vale0:b",
            "--dir",
            "rx",
            "-c",
            n,
            "--format",
            "pcap",
            "-w",
            "-",
            "--duration",
            "60",
        ],
    );
    captures_started(&v, 2);
    let tx = v.pktgen(&[
        "-i", "vale0:a", "-f", "tx", "-l", "60", "-n", n, "-R", "20000", "--json",
    ]);
    let t = report(
        &Kid::spawn(tx, "vale-pktgen tx").finish(T),
        "vale-pktgen tx",
    );
    assert_eq!(t["packets"], 1000, "{t}");
    report(&rx.finish(T), "vale-pktgen rx");
    let a = ca.finish(T);
    assert_eq!(captured(&a), (1000, 0));
    let b = cb.finish(T);
    assert_eq!(captured(&b), (1000, 0));
    std::fs::write(&fb, &b.stdout).unwrap();

    // tcpdump sees the UDP frames of pktgen, all of them, on both sides.
    for f in [&fa, &fb] {
        let lines = tcpdump(f, "udp");
        assert_eq!(
            lines.len(),
            1000,
            "{}: {:?}",
            f.display(),
            &lines[..3.min(lines.len())]
        );
        assert!(lines[0].contains("UDP"), "{}", lines[0]);
        assert!(
            lines.iter().all(|l| l.contains("length 18")),
            "{}",
            lines[0]
        );
    }
    // tshark: the interface is named after the port, every frame is 60 bytes and outbound
    // (a sent them into the switch: tx), in pcapng; pcap has no direction.
    let rows = tshark(
        &fa,
        "",
        &[
            "frame.interface_name",
            "frame.len",
            "frame.packet_flags_direction",
        ],
    );
    assert_eq!(rows.len(), 1000);
    for r in &rows {
        assert_eq!(r, &["vale0:a", "60", OUTBOUND], "{:?}", &rows[..3]);
    }
    let rows = tshark(&fb, "udp", &["frame.len", "ip.src", "ip.dst"]);
    assert_eq!(rows.len(), 1000);
    assert_eq!(rows[0], ["60", "10.0.0.1", "10.0.0.2"], "{:?}", rows[0]);
}

/// The receiver of a checked stream: `count` frames at vale0:b, reported as JSON.
fn checked_receiver(v: &Valed, count: u64) -> Kid {
    v.spawn_client(
        v.pktgen(&[
            "-i",
            "vale0:b",
            "-f",
            "rx",
            "-T",
            "60",
            "-n",
            &count.to_string(),
            "--json",
        ]),
        "vale-pktgen rx",
        "vale0:b",
    )
}

/// The checked stream itself: `count` 60-byte frames from vale0:a at 20 kpps, a rate any
/// receiver keeps up with on a busy machine too.
fn send_checked(v: &Valed, count: u64) {
    let tx = v.pktgen(&[
        "-i",
        "vale0:a",
        "-f",
        "tx",
        "-n",
        &count.to_string(),
        "-R",
        "20000",
        "--json",
    ]);
    report(
        &Kid::spawn(tx, "vale-pktgen tx").finish(T * 2),
        "vale-pktgen tx",
    );
}

#[test]
fn a_stopped_reader_costs_capture_drops_never_frames() {
    let _s = serial();
    let v = Valed::start();
    // Both persistent, so their counters stay listed after the clients exit.
    v.ctl_ok(&["create", "vale0:a"]);
    v.ctl_ok(&["create", "vale0:b"]);
    // A rate any receiver keeps up with, on a busy machine too: a frame lost at b would be
    // the receiver's, not the capture's.
    let count = 20_000u64;
    let rx = checked_receiver(&v, count);
    // Its stdout is a pipe nobody reads until the end: the capture stops reading once the
    // pipe is full, with 1 MiB of buffer in valed.
    let cap = capture(&v, &["vale0:b", "-B", "1", "-w", "-"]);
    captures_started(&v, 1);
    send_checked(&v, count);
    let r = report(&rx.finish(T), "vale-pktgen rx");
    assert_eq!(r["packets"], count, "every frame reaches b: {r}");
    let c = v.counters("vale0:b");
    assert_eq!((c.rx_packets, c.rx_drops), (count, 0), "{c:?}");
    cap.signal(libc::SIGINT);
    let out = cap.finish(T);
    let (got, dropped) = captured(&out);
    eprintln!("stopped reader: {got} captured, {dropped} capture drops");
    assert!(dropped > 0, "a stopped reader shows capture drops");
    assert_eq!(got + dropped, count, "every frame is captured or counted");
}

#[test]
fn a_capture_of_a_port_that_goes_away_ends_cleanly() {
    if !tools() {
        return;
    }
    let _s = serial();
    let v = Valed::start();
    let dir = TempDir::new("capture");
    let f = dir.0.join("gone.pcapng");
    let rx = v.spawn_client(
        v.pktgen(&["-i", "vale0:b", "-f", "rx", "-T", "60"]),
        "vale-pktgen rx",
        "vale0:b",
    );
    let cap = capture(&v, &["vale0:b", "-w", f.to_str().unwrap()]);
    captures_started(&v, 1);
    // The client goes: its port with it, and the capture ends by itself.
    rx.signal(libc::SIGKILL);
    let out = cap.finish(T);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the port went away"), "{err}");
    assert_eq!(captured(&out), (0, 0));
    assert!(tcpdump(&f, "").is_empty());
    assert!(v.port("vale0:b").is_none());
    // A capture of a port that is not there is refused.
    v.ctl_fails(
        &["capture", "vale0:b", "-c", "1"],
        1,
        "no such switch 'vale0'",
    );
}

#[test]
fn only_the_owner_or_an_administrator_captures_a_port() {
    if !root() {
        return;
    }
    let _s = serial();
    let v = Valed::start_with(&["--socket-mode", "666"]);
    v.ctl_ok(&["create", "vale0:r"]);
    let out = run_bounded(
        &mut v.tool_as(65534, 1024, "vale-ctl", &["capture", "vale0:r", "-c", "1"]),
        T,
    );
    assert_exit(
        &out,
        "capture as nobody",
        1,
        "cannot capture port 'vale0:r'",
    );
}

/// Checks capture `f` of `port`, taken while the host behind the port pinged `to` from `from`
/// three times: tcpdump reads the three echo requests and the three replies, and tshark each
/// of them whole (98 bytes), the requests outbound (the host sent them into the switch
/// through the port: tx), the replies inbound (rx), on an interface named after the port. ARP
/// went both ways too.
fn three_pings_captured(f: &Path, port: &str, from: &str, to: &str) {
    let lines = tcpdump(f, "icmp");
    assert_eq!(lines.len(), 6, "{lines:#?}");
    let requests = lines
        .iter()
        .filter(|l| l.contains(&format!("{from} > {to}: ICMP echo request")));
    assert_eq!(requests.count(), 3, "{lines:#?}");
    let replies = lines
        .iter()
        .filter(|l| l.contains(&format!("{to} > {from}: ICMP echo reply")));
    assert_eq!(replies.count(), 3, "{lines:#?}");
    let rows = tshark(
        f,
        "icmp",
        &[
            "icmp.type",
            "frame.len",
            "frame.packet_flags_direction",
            "frame.interface_name",
        ],
    );
    assert_eq!(rows.len(), 6, "{rows:?}");
    for r in &rows {
        let want = if r[0] == "8" { OUTBOUND } else { INBOUND };
        assert_eq!(&r[1..], ["98", want, port], "{rows:?}");
    }
    assert!(tcpdump(f, "arp").len() >= 2, "{:#?}", tcpdump(f, ""));
}

#[test]
fn a_ping_through_tap_ports_is_read_by_tcpdump_and_tshark() {
    if !tools() || !root() {
        return;
    }
    let net = TapNet::new(&["a", "b"]);
    let dir = TempDir::new("capture");
    let f = dir.0.join("ping.pcapng");
    let cap = capture(
        &net.v,
        &["vale0:a", "-w", f.to_str().unwrap(), "--duration", "60"],
    );
    captures_started(&net.v, 1);
    net.ns(0).ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    cap.signal(libc::SIGTERM);
    captured(&cap.finish(T));
    three_pings_captured(&f, "vale0:a", "10.77.0.1", "10.77.0.2");
}

/// A NIC port (a veth whose peer is in a namespace of its own), in each mode (AF_XDP native
/// and generic, AF_PACKET), captured both ways while that namespace pings one behind a TAP
/// port.
#[test]
fn a_nic_port_is_captured() {
    if !tools() || !root() {
        return;
    }
    for mode in ["xdp", "xdp-generic", "packet"] {
        let n = NicNet::new(Some(mode), &["t"]);
        let v = &n.net.v;
        let p = v.port("vale0:eth").expect("listed");
        assert_eq!(
            (p.kind.as_str(), p.mode.as_deref(), p.state.as_str()),
            ("nic", Some(mode), "up")
        );
        let dir = TempDir::new("capture");
        let f = dir.0.join("nic.pcapng");
        let cap = capture(
            v,
            &["vale0:eth", "-w", f.to_str().unwrap(), "--duration", "60"],
        );
        captures_started(v, 1);
        n.far.ok("ping -c 3 -i 0.2 -W 2 10.77.0.1");
        cap.signal(libc::SIGTERM);
        captured(&cap.finish(T));
        three_pings_captured(&f, "vale0:eth", "10.77.0.10", "10.77.0.1");
    }
}

/// A vhost-user port of a Linux guest under QEMU (valed reads and writes the guest's memory),
/// captured both ways while the guest pings a namespace behind a TAP port.
#[test]
fn a_vhost_user_port_is_captured() {
    if !tools() {
        return;
    }
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let t0 = Instant::now();
    let net = TapNet::new(&["c"]);
    let v = &net.v;
    let sock = v.run_dir().join("vm.sock");
    v.ctl_ok(&["attach", "vale0:g", "--vhost-user", sock.to_str().unwrap()]);
    let mut g = Guest::boot(&GuestConfig::vhost_user(
        "g",
        &sock,
        false,
        "10.77.0.20/24",
        "02:00:00:00:77:20",
    ));
    let boot = t0.elapsed();
    assert_eq!(v.port("vale0:g").unwrap().state, "up", "{}", v.log());
    let dir = TempDir::new("capture");
    let f = dir.0.join("vhost-user.pcapng");
    let cap = capture(
        v,
        &["vale0:g", "-w", f.to_str().unwrap(), "--duration", "60"],
    );
    captures_started(v, 1);
    let out = g.run("ping -c 3 -i 0.2 -W 5 10.77.0.1", Duration::from_secs(20));
    assert!(
        out.output.contains("3 packets received"),
        "guest -> container: {}\nvaled's log:\n{}",
        out.output,
        v.log()
    );
    cap.signal(libc::SIGTERM);
    captured(&cap.finish(T));
    three_pings_captured(&f, "vale0:g", "10.77.0.20", "10.77.0.1");
    drop(g);
    eprintln!(
        "guest ready after {boot:.1?}; test took {:.1?}",
        t0.elapsed()
    );
}

/// A capture reader that writes nonsense into the capture buffer (its `tail`, the records)
/// and sends a hostile filter costs valed nothing: frames still flow, valed lives, the bad
/// filter is refused.
#[test]
fn a_hostile_capture_reader_cannot_hurt_valed() {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use vale_abi::capture::{BpfInsn, DIR_RX, DIR_TX};
    use vale_abi::control::{self, Reply, Request};

    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_ab();
    let sock = UnixStream::connect(v.run_dir().join("valed.sock")).unwrap();
    let req = |filter: Vec<BpfInsn>| Request::Capture {
        port: "vale0:b".into(),
        dirs: DIR_RX | DIR_TX,
        snaplen: 128,
        bytes: 1 << 20,
        filter,
    };
    // A jump out of the program: refused.
    let jump_out = vec![
        BpfInsn {
            code: 0x05,
            jt: 0,
            jf: 0,
            k: 100,
        },
        BpfInsn {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 1,
        },
    ];
    match control::exchange(&sock, &req(jump_out)).unwrap() {
        Some((Reply::Error { message, .. }, _)) => {
            assert!(message.contains("bad capture filter"), "{message}")
        }
        other => panic!("a bad filter was taken: {other:?}"),
    }
    let (size, fd) = match control::exchange(&sock, &req(Vec::new())).unwrap() {
        Some((Reply::Capture { size, .. }, mut fds)) => (size as usize, fds.remove(0)),
        other => panic!("no capture: {other:?}"),
    };
    // SAFETY: maps the memfd valed sent, of the size it said; written as a hostile reader would.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        // It cannot shrink the buffer under valed: the memfd is sealed.
        assert!(libc::ftruncate(fd.as_raw_fd(), 4096) < 0);
        p as *mut u8
    };
    for (i, tail) in [u64::MAX, 1 << 40, 0x8000_0000_0000_0000, 12345]
        .into_iter()
        .enumerate()
    {
        // SAFETY: inside the mapping: the header's tail (offset 128), its ring geometry
        // (valed keeps its own), and the records.
        unsafe {
            std::ptr::write_volatile(base.add(128) as *mut u64, tail);
            std::ptr::write_volatile(base.add(8) as *mut u32, u32::MAX);
            std::ptr::write_bytes(base.add(4096), 0xff, size - 4096);
        }
        let frame = test_frame(60, [2, 0, 0, 0, 0, 1], [0xff; 6], i as u64);
        assert!(send_frame(&a, &frame));
        a.txsync(0).expect("txsync");
        let n = i as u64 + 1;
        assert!(
            wait_until(T, || v.counters("vale0:b").rx_packets >= n),
            "the frame reaches b whatever the reader wrote: a {:?} b {:?}\n{}",
            v.counters("vale0:a"),
            v.counters("vale0:b"),
            v.log()
        );
        assert_eq!(recv_n(&b, 1).len(), 1);
    }
    assert!(v.port("vale0:b").is_some(), "valed answers");
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(base as *mut libc::c_void, size) };
}

/// valed's budget of capture filter instructions per user (`vale_switch::capture`): one
/// instruction every this many ns, and at most this many held.
const FILTER_NS_PER_INSN: u64 = 64;
const FILTER_BUDGET_BURST: u64 = 16 * 4096;

/// A capture request sent by the test itself, with a raw filter; the reply's memfd mapped.
struct RawCapture {
    base: *mut u8,
    size: usize,
}

impl RawCapture {
    fn start(sock: &std::os::unix::net::UnixStream, req: &vale_abi::control::Request) -> Self {
        use std::os::fd::AsRawFd;
        use vale_abi::control::{self, Reply};
        let (size, fd) = match control::exchange(sock, req).unwrap() {
            Some((Reply::Capture { size, .. }, mut fds)) => (size as usize, fds.remove(0)),
            other => panic!("no capture: {other:?}"),
        };
        // SAFETY: maps the memfd valed sent, of the size it said; read only through atomics.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        RawCapture {
            base: base as *mut u8,
            size,
        }
    }

    fn header(&self) -> &vale_abi::capture::CaptureHeader {
        // SAFETY: page 0 of the live mapping; its shared fields are atomics.
        unsafe { &*(self.base as *const vale_abi::capture::CaptureHeader) }
    }
}

impl Drop for RawCapture {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `start`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size) };
    }
}

/// A user's capture filters cost only that user: 8 captures of a port, each with a filter of
/// 1,900 instructions that all run and reject every frame, while the port sends as fast as
/// the test can. Their filters run no more instructions than the user's budget held over the
/// test (the frames they could not filter are counted as budget drops, apart from ring-full
/// drops), and another port's stream through the same worker gets every frame.
#[test]
fn capture_filters_run_on_their_owners_budget_never_the_traffic() {
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use vale_abi::capture::{BpfInsn, DIR_TX};
    use vale_abi::control::Request;

    let _s = serial();
    let v = Valed::start();
    v.ctl_ok(&["create", "vale0:a"]);
    v.ctl_ok(&["create", "vale0:b"]);
    let x = v.open("vale1:x");
    let len = 1900usize;
    let mut filter = vec![
        BpfInsn {
            code: 0x00, // ld #7
            jt: 0,
            jf: 0,
            k: 7,
        };
        len - 1
    ];
    filter.push(BpfInsn {
        code: 0x06, // ret #0
        jt: 0,
        jf: 0,
        k: 0,
    });
    let req = Request::Capture {
        port: "vale1:x".into(),
        dirs: DIR_TX,
        snaplen: 64,
        bytes: 1 << 20,
        filter,
    };
    let t0 = Instant::now();
    let sock = UnixStream::connect(v.run_dir().join("valed.sock")).unwrap();
    let caps: Vec<RawCapture> = (0..8).map(|_| RawCapture::start(&sock, &req)).collect();

    let count = 20_000u64;
    let rx = checked_receiver(&v, count);
    let stop = AtomicBool::new(false);
    let sent = std::thread::scope(|s| {
        let attack = s.spawn(|| {
            let frame = test_frame(60, [2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, 8], 0);
            let mut sent = 0u64;
            let end = Instant::now() + T;
            while !stop.load(Relaxed) && Instant::now() < end {
                for _ in 0..64 {
                    if !send_frame(&x, &frame) {
                        break;
                    }
                    sent += 1;
                }
                x.txsync(0).expect("txsync");
                std::thread::sleep(Duration::from_millis(1));
            }
            wait_tx_drained(&x, 0);
            sent
        });
        send_checked(&v, count);
        stop.store(true, Relaxed);
        attack.join().expect("the attacking thread")
    });
    let r = report(&rx.finish(T), "vale-pktgen rx");
    assert!(
        wait_until(T, || v.counters("vale1:x").tx_packets >= sent),
        "valed took every frame of x: {:?}",
        v.counters("vale1:x")
    );
    let elapsed = t0.elapsed();
    assert_eq!(
        r["packets"], count,
        "every frame of the other stream arrives: {r}"
    );
    let c = v.counters("vale0:b");
    assert_eq!((c.rx_packets, c.rx_drops), (count, 0), "{c:?}");

    // Each frame x sent met each capture: captured (none: the filter rejects all), dropped
    // with the ring full (none: nothing fills it), over budget, or filtered by a full run.
    let (mut runs, mut over) = (0u64, 0u64);
    for c in &caps {
        let h = c.header();
        let (got, full, ob) = (
            h.head.load(Relaxed),
            h.drops.load(Relaxed),
            h.over_budget.load(Relaxed),
        );
        assert_eq!((got, full), (0, 0), "nothing captured, no ring-full drops");
        assert!(ob <= sent, "{ob} budget drops of {sent} frames");
        over += ob;
        runs += sent - ob;
    }
    let budget = FILTER_BUDGET_BURST + elapsed.as_nanos() as u64 / FILTER_NS_PER_INSN;
    eprintln!(
        "x sent {sent} frames in {elapsed:.1?}: {runs} filter runs of {len} instructions, \
         {over} budget drops; the budget held at most {budget} instructions"
    );
    assert!(
        over > 0,
        "frames past the budget are counted as budget drops"
    );
    // Each run also paid for the frame's copy: one instruction per 64 bytes.
    let spent = runs * (len as u64 + 1);
    assert!(
        spent <= budget,
        "the filters ran {spent} instructions, more than the {budget} of the budget"
    );
    drop(sock);
    assert!(v.port("vale1:x").is_some(), "valed answers");
}

/// A capture's buffer counts in its user's port memory: a user with a small
/// `--max-port-memory-per-user` is refused a capture that would take it past the limit, with
/// the limit named; the memory comes back when the capture ends.
#[test]
fn capture_buffers_count_in_the_users_port_memory() {
    if !root() {
        return;
    }
    let _s = serial();
    let v = Valed::start_with(&["--socket-mode", "666", "--max-port-memory-per-user", "24"]);
    let nobody = |args: &[&str]| v.tool_as(65534, 1024, "vale-ctl", args);
    let out = run_bounded(&mut nobody(&["create", "vale0:n"]), T);
    assert_exit(&out, "create as nobody", 0, "");
    let limit = "port memory limit reached";
    let refused = |what: &str, args: &[&str]| {
        let out = run_bounded(&mut nobody(args), T);
        assert_exit(&out, what, 1, limit);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("the 24 MiB") && err.contains("--max-port-memory-per-user"),
            "{what}: {err}"
        );
    };
    let one = ["capture", "vale0:n", "-B", "16", "-w", "/dev/null"];
    let run_one = [&one[..], &["--duration", "1"]].concat();
    refused(
        "a 32 MiB capture",
        &["capture", "vale0:n", "-B", "32", "-w", "/dev/null"],
    );
    let first = Kid::spawn(nobody(&one), "nobody's first capture");
    captures_started(&v, 1);
    refused("a second capture of 16 MiB", &run_one);
    // An administrator is not bound by it.
    let out = run_bounded(&mut tool("vale-ctl", v.run_dir(), &run_one), T);
    assert_exit(&out, "root's capture", 0, "frames captured");
    // The first ends: its memory is the user's again.
    first.signal(libc::SIGINT);
    captured(&first.finish(T));
    let out = run_bounded(&mut nobody(&run_one), T);
    assert_exit(&out, "a capture once the first ended", 0, "frames captured");
}

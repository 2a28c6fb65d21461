//! vhost-user front ends against a real valed, without a virtual machine: what a hostile
//! front end can write on the socket. (Guests under QEMU are in guest.rs; front ends driven
//! by hand through guest memory are in the switch's own tests.)

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vale_abi::control::send_with_fds;
use vale_tests::*;

/// A vhost-user message header: request, flags (version 1), body size.
fn header(req: u32, size: u32) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[..4].copy_from_slice(&req.to_le_bytes());
    h[4..8].copy_from_slice(&1u32.to_le_bytes());
    h[8..].copy_from_slice(&size.to_le_bytes());
    h
}

/// Messages that bring more descriptors than the protocol allows, spread over their bytes so
/// that no single receive looks too big: the connection ends, every descriptor is closed,
/// valed holds no more descriptors than before (20 connections: none is kept per connection),
/// and the next front end is served.
#[test]
fn descriptors_spread_over_a_message_end_the_connection() {
    let v = Valed::start();
    let sock = v.run_dir().join("vm.sock");
    v.ctl_ok(&["attach", "vale0:vm", "--vhost-user", sock.to_str().unwrap()]);
    // What valed holds while its port waits for a front end (it prepares the next
    // connection's device as soon as the last one ends).
    get_features(&sock);
    let base = steady_fd_count(&v);
    let efd = vale_abi::eventfd::new().expect("eventfd");
    let four = [efd.as_raw_fd(); 4];
    for round in 0..20 {
        let mut s = UnixStream::connect(&sock).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // SET_VRING_KICK with an 8-byte body: 4 descriptors on the header, 4 on each body
        // byte until valed ends the connection.
        let _ = send_with_fds(s.as_raw_fd(), &header(12, 8), &four, false);
        for _ in 0..8 {
            if send_with_fds(s.as_raw_fd(), &[0u8], &four, false).is_err() {
                break;
            }
        }
        let mut b = [0u8; 1];
        let r = s.read(&mut b);
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "round {round}: the connection is still open ({r:?})"
        );
    }
    let after = steady_fd_count(&v);
    assert!(
        after <= base,
        "valed holds {after} descriptors, {base} before"
    );
    assert!(v.log().contains("more than 8 descriptors"), "{}", v.log());

    // The next front end is answered.
    get_features(&sock);
}

/// A front end that asks and asks (GET_FEATURES, 200,000 times) and never reads a reply:
/// valed's replies fill its socket, and the write that finds no room gives up after 1 s and
/// ends the connection; meanwhile `vale-ctl list` answers within a second, the next front end
/// is served, and the port detaches within a second.
#[test]
fn a_front_end_that_never_reads_holds_no_thread() {
    let v = Valed::start();
    let sock = v.run_dir().join("vm.sock");
    v.ctl_ok(&["attach", "vale0:vm", "--vhost-user", sock.to_str().unwrap()]);
    let mut s = UnixStream::connect(&sock).expect("connect");
    s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut asked = 0;
    while asked < 200_000 && s.write_all(&header(1, 0)).is_ok() {
        asked += 1;
    }
    let t = std::time::Instant::now();
    v.ctl_ok(&["list"]);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "list took {:?}",
        t.elapsed()
    );
    // The connection ends: reading shows its end after the replies that fit.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let ended = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
        }
    };
    assert!(
        ended,
        "valed kept the connection of a front end that never reads"
    );
    drop(s);
    get_features(&sock);
    let t = std::time::Instant::now();
    v.ctl_ok(&["detach", "vale0:vm"]);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "detach took {:?}",
        t.elapsed()
    );
}

/// A front end that asks for the features valed offers, and leaves.
fn get_features(sock: &std::path::Path) {
    let mut s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&header(1, 0)).unwrap();
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply).expect("a reply to GET_FEATURES");
    let features = u64::from_le_bytes(reply[12..].try_into().unwrap());
    assert_ne!(features & 1 << 32, 0, "VERSION_1 offered");
}

/// valed's descriptor count once it has not changed for 200 ms.
fn steady_fd_count(v: &Valed) -> usize {
    let mut last = v.fd_count();
    let steady = wait_until(T, || {
        std::thread::sleep(Duration::from_millis(200));
        let now = v.fd_count();
        std::mem::replace(&mut last, now) == now
    });
    assert!(steady, "valed's descriptors keep changing");
    last
}

/// `vale-ctl attach --vhost-user PATH` takes only a free name or a stale socket: a regular
/// file (a disk image, say), a directory, a symbolic link or a socket another program
/// listens at are refused by name and left as they are; `--client` makes and removes
/// nothing; detach removes the name only while it is still the socket valed made.
#[test]
fn attach_replaces_nothing_but_a_stale_socket() {
    let v = Valed::start();
    let dir = TempDir::new("vhost-user-names");
    let at = |name: &str| dir.0.join(name);
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();

    let img = at("disk.img");
    std::fs::write(&img, b"precious").unwrap();
    v.ctl_fails(
        &["attach", "vale0:vm", "--vhost-user", &s(&img)],
        1,
        "File exists",
    );
    assert_eq!(std::fs::read(&img).unwrap(), b"precious");
    let out = v.ctl(&["attach", "vale0:vm", "--vhost-user", &s(&img)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&s(&img)) && err.contains("a regular file"),
        "{err}"
    );
    assert!(v.port("vale0:vm").is_none_or(|p| p.kind != "vhost-user"));

    let sub = at("sub");
    std::fs::create_dir(&sub).unwrap();
    v.ctl_fails(
        &["attach", "vale0:vm", "--vhost-user", &s(&sub)],
        1,
        "a directory",
    );
    assert!(sub.is_dir());
    let link = at("link");
    std::os::unix::fs::symlink(&img, &link).unwrap();
    v.ctl_fails(
        &["attach", "vale0:vm", "--vhost-user", &s(&link)],
        1,
        "a symbolic link",
    );
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(std::fs::read(&img).unwrap(), b"precious");

    // A socket another program listens at: refused, and still theirs.
    let busy = at("busy.sock");
    let theirs = std::os::unix::net::UnixListener::bind(&busy).unwrap();
    v.ctl_fails(
        &["attach", "vale0:vm", "--vhost-user", &s(&busy)],
        1,
        "Address already in use",
    );
    UnixStream::connect(&busy).expect("their socket still answers");
    drop(theirs);

    // A stale socket (what a killed valed leaves): taken over, served, removed at detach.
    let stale = at("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    v.ctl_ok(&["attach", "vale0:vm", "--vhost-user", &s(&stale)]);
    get_features(&stale);
    v.ctl_ok(&["detach", "vale0:vm"]);
    assert!(
        wait_until(T, || !stale.exists()),
        "the socket valed made is left at detach"
    );

    // A name someone made again after the attach is theirs: left at detach.
    let again = at("again.sock");
    v.ctl_ok(&["attach", "vale0:vm", "--vhost-user", &s(&again)]);
    get_features(&again);
    std::fs::remove_file(&again).unwrap();
    std::fs::write(&again, b"theirs").unwrap();
    v.ctl_ok(&["detach", "vale0:vm"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::read(&again).unwrap(), b"theirs");

    // Client mode connects, and never makes or removes a name.
    v.ctl_ok(&["attach", "vale0:vm", "--vhost-user", &s(&img), "--client"]);
    let nothing = at("nothing.sock");
    v.ctl_ok(&[
        "attach",
        "vale0:vm2",
        "--vhost-user",
        &s(&nothing),
        "--client",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    v.ctl_ok(&["detach", "vale0:vm"]);
    v.ctl_ok(&["detach", "vale0:vm2"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::read(&img).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&nothing).is_err());
}

/// A valed stopped by SIGTERM or SIGINT removes the socket of each vhost-user port that
/// listens (as detach does), and only while it is still valed's socket: a name replaced by a
/// file meanwhile is left as it is; a `--client` port's path, which valed never made, too.
#[test]
fn a_stopped_valed_removes_its_vhost_user_sockets() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut v = Valed::start();
        let dir = TempDir::new("vhost-user-exit");
        let at = |name: &str| dir.0.join(name);
        let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
        let ours = at("vm.sock");
        let replaced = at("replaced.sock");
        let theirs = at("theirs.sock");
        v.ctl_ok(&["attach", "vale0:vm", "--vhost-user", &s(&ours)]);
        v.ctl_ok(&["attach", "vale0:vm2", "--vhost-user", &s(&replaced)]);
        let _listening = std::os::unix::net::UnixListener::bind(&theirs).unwrap();
        v.ctl_ok(&[
            "attach",
            "vale0:vm3",
            "--vhost-user",
            &s(&theirs),
            "--client",
        ]);
        get_features(&ours);
        get_features(&replaced);
        std::fs::remove_file(&replaced).unwrap();
        std::fs::write(&replaced, b"theirs").unwrap();

        v.signal(sig);
        assert!(
            wait_until(T, || !v.alive()),
            "valed still running after signal {sig}: {}",
            v.log()
        );
        assert!(
            !ours.exists(),
            "valed left its vhost-user socket {} behind after signal {sig}",
            ours.display()
        );
        assert_eq!(std::fs::read(&replaced).unwrap(), b"theirs");
        assert!(
            std::fs::symlink_metadata(&theirs).is_ok(),
            "a --client port's path was removed"
        );
        assert!(!v.run_dir().join(vale_abi::control::SOCKET_NAME).exists());
    }
}

/// The VM path's bench parties, vale's own vhost-user front ends (`vhost-paced`), through
/// valed: a paced sender with event indices into vale1:vm1 and a sink (`--role sink`, a
/// receiver that sleeps on its interrupts) on vale1:vm2. The sink takes what valed delivered
/// and answers each line on its input with the count; the counters add up to what the sender
/// posted; with vm1's `moderation` set the sender kicks far fewer times than it sends bursts
/// (bursts of 8, so that every wake-up of valed takes enough to moderate). Both stamp
/// (`--stamp`): the sink counts the delay of every frame it took, once.
#[test]
fn a_paced_sender_reaches_a_sink_through_two_ports() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let v = Valed::start();
    let dir = TempDir::new("vhost-paced");
    let sock = |n: &str| dir.0.join(n).to_str().unwrap().to_string();
    let (s1, s2) = (sock("vm1.sock"), sock("vm2.sock"));
    v.ctl_ok(&["attach", "vale1:vm1", "--vhost-user", &s1]);
    v.ctl_ok(&["attach", "vale1:vm2", "--vhost-user", &s2]);
    v.ctl_ok(&["set", "vale1:vm1", "moderation", "100"]);
    let mut sink = Command::new(bin("vhost-paced"))
        .args(["--socket", &s2, "--role", "sink", "--event-idx", "--stamp"])
        .args(["--mac", "02:00:00:00:0e:02", "--seconds", "60"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run vhost-paced --role sink");
    let mut input = sink.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(sink.stdout.take().unwrap()).lines();
    let mut line = || -> serde_json::Value {
        let l = lines.next().expect("a line from the sink").expect("read");
        serde_json::from_str(&l).expect("JSON")
    };
    assert_eq!(line()["ready"], true);
    assert!(wait_until(T, || v
        .port("vale1:vm2")
        .is_some_and(|p| p.state == "up")));

    // 400,000 frames a second for 0.5 s: 25,000 bursts of 8, one every 20 µs.
    let out = Command::new(bin("vhost-paced"))
        .args(["--socket", &s1, "--rate", "400000", "--seconds", "0.5"])
        .args(["--dst", "02:00:00:00:0e:02", "--event-idx", "--stamp"])
        .output()
        .expect("run vhost-paced");
    let sent = report(&out, "vhost-paced");
    let posted = num(&sent, "posted");
    assert!(posted >= 100_000, "{sent}");
    // Moderated (about 40 chains a kick; 5,000 kicks here) against one kick a burst that
    // finds valed asleep (13,700 of 25,000 at 200,000 a second without moderation).
    assert!(num(&sent, "kicks") < 12_000, "{sent}");
    // Every frame valed took is in the sink or counted dropped at vm2 (a sink kept off its
    // CPU for milliseconds by a loaded machine), and the sink took what vm2 delivered.
    let (mut took, mut delays, mut stamped) = (0, Vec::new(), 0);
    let settled = wait_until(T, || {
        input.write_all(b"\n").unwrap();
        let answer = line();
        took = answer["rx"].as_u64().unwrap();
        // Each answer counts the delays of the frames taken since the one before.
        let d = answer["delay_us"].clone();
        stamped += d["samples"].as_u64().expect("delays counted");
        if stamped != 0 && delays.is_empty() {
            delays = ["median", "p99", "max"]
                .map(|k| d[k].as_f64().unwrap())
                .to_vec();
        }
        let c = v.counters("vale1:vm2");
        took == c.rx_packets && c.rx_packets + c.rx_drops == posted
    });
    let (c1, c2) = (v.counters("vale1:vm1"), v.counters("vale1:vm2"));
    assert!(
        settled,
        "posted {posted}, the sink took {took}; vm2: {c2:?}"
    );
    assert_eq!(c1.tx_packets, posted);
    assert_eq!((c1.bad_input, c2.bad_input), (0, 0));
    assert_eq!(stamped, took, "each frame's delay counted once");
    // Median and 99th percentile are their 100-ns steps' middles, the maximum exact.
    assert!(
        delays[0] > 0.0 && delays[0] <= delays[1] && delays[1] <= delays[2] + 0.05,
        "delays (median, p99, max) {delays:?}"
    );
    drop(input);
    let status = sink.wait().expect("the sink ends");
    assert!(
        status.success(),
        "the sink ends when its input closes: {status}"
    );
}

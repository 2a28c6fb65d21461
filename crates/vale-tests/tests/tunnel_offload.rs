//! TCP across tunnel ports with offloads: a container behind a TAP port sends TCP segments of
//! up to 64 KiB, which the tunnel port takes whole and sends as `UDP_SEGMENT` messages
//! (counted as `tso-frames`, `gso-sends`, `gso-segments` on the port's line). The far end is
//! another vale switch or Linux's vxlan device; what arrives is checked byte for byte.
//!
//! Needs root, iproute2, iperf3, ethtool and python3 (the README's test command installs them).

use std::process::Stdio;
use std::time::Duration;

use vale_tests::netns::{iperf3_json, unique, Netns};
use vale_tests::tunnel::*;
use vale_tests::*;

/// Bytes of the checked transfer.
const CHECKED: usize = 16 << 20;

/// Two containers: C1 behind TAP port vale0:c1, C2 behind vale1:c2 (`far` None), both switches
/// in one valed joined by vxlan ports over 127.0.0.1 and 127.0.0.2; or C2 behind a Linux vxlan
/// device on a bridge in namespace H2 over a veth underlay (`far` Some). The containers' MTU
/// is 1450, as docs/spanning-hosts.md says.
struct Across {
    c1: Netns,
    c2: Netns,
    _h2: Option<Netns>,
    v: Valed,
    _home: Netns,
}

impl Across {
    fn new(linux: bool) -> Across {
        let home = Netns::new("o");
        let v = Valed::start_in(&home, &[]);
        let c1 = Netns::new("p");
        let c2 = Netns::new("q");
        let tap = |port: &str, ns: &Netns, addr: &str| {
            let t = unique("vtap");
            v.ctl_ok(&["attach", port, "--tap", &t]);
            ns.adopt(Some(&home), &t, &[addr]);
            ns.ok(&format!("ip link set {t} mtu 1450"));
        };
        tap("vale0:c1", &c1, "10.77.0.1/24");
        let h2 = if linux {
            let h2 = Netns::new("r");
            linux_vtep(&home, &h2, &c2, "192.168.77.1", "192.168.77.2", 24);
            c2.ok("ip link set ce mtu 1450");
            v.ctl_ok(&[
                "attach",
                "vale0:t",
                "vxlan",
                "vni=42",
                "local=192.168.77.1",
                "remote=192.168.77.2",
            ]);
            Some(h2)
        } else {
            tap("vale1:c2", &c2, "10.77.0.2/24");
            for (port, local, remote) in [
                ("vale0:t", "127.0.0.1", "127.0.0.2"),
                ("vale1:t", "127.0.0.2", "127.0.0.1"),
            ] {
                v.ctl_ok(&[
                    "attach",
                    port,
                    "vxlan",
                    "vni=42",
                    &format!("local={local}"),
                    &format!("remote={remote}"),
                ]);
            }
            None
        };
        c1.ok("ping -c 2 -i 0.2 -W 2 10.77.0.2");
        Across {
            c1,
            c2,
            _h2: h2,
            v,
            _home: home,
        }
    }
}

/// iperf3 for 2 s from `client` to `addr` (a server in `server`): the bytes received.
fn iperf3(client: &Netns, server: &Netns, addr: &str) -> u64 {
    let j = iperf3_json(client, server, addr, "");
    j["end"]["sum_received"]["bytes"].as_u64().expect("bytes")
}

/// Python making the [`CHECKED`] bytes sent: `d`.
const DATA: &str = "import random; d = random.Random(7).randbytes(16 << 20)";

/// Sends [`CHECKED`] bytes over TCP from `client` to `addr` (a server in `server`); the server
/// must receive exactly them.
fn checked_transfer(client: &Netns, server: &Netns, addr: &str) {
    let srv = [
        "import socket, hashlib",
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)",
        "s.bind(('0.0.0.0', 5301)); s.listen(1); s.settimeout(30)",
        "c, _ = s.accept(); c.settimeout(30); h = hashlib.sha256(); n = 0",
        "while True:",
        "    b = c.recv(1 << 20)",
        "    if not b: break",
        "    h.update(b); n += len(b)",
        "print(n, h.hexdigest())",
    ]
    .join("\n");
    let mut srv = server
        .cmd(&format!("python3 -c \"{srv}\""))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 server");
    let cli = [
        "import socket, time",
        DATA,
        "for _ in range(50):",
        "    try:",
        &format!("        s = socket.create_connection(('{addr}', 5301), timeout=30); break"),
        "    except OSError: time.sleep(0.1)",
        "s.sendall(d); s.close()",
    ]
    .join("\n");
    client
        .run(&format!("python3 -c \"{cli}\""), Duration::from_secs(40))
        .status
        .success()
        .then_some(())
        .expect("the checked transfer's sender");
    let want = std::process::Command::new("python3")
        .args([
            "-c",
            &format!("import hashlib\n{DATA}\nprint(len(d), hashlib.sha256(d).hexdigest())"),
        ])
        .output()
        .expect("python3");
    let want = String::from_utf8_lossy(&want.stdout).trim().to_string();
    let ok = wait_until_every(Duration::from_secs(30), Duration::from_millis(100), || {
        matches!(srv.try_wait(), Ok(Some(_)))
    });
    if !ok {
        let _ = srv.kill();
    }
    let got = srv.wait_with_output().expect("python3 server");
    let got = String::from_utf8_lossy(&got.stdout).trim().to_string();
    assert_eq!(got, want, "{addr}: bytes and SHA-256 received");
    assert!(want.starts_with(&CHECKED.to_string()));
}

/// TCP both ways between the containers, the data checked, and the tunnel port(s) showing
/// that 64 KiB segments crossed as `UDP_SEGMENT` sends.
fn tcp_across(linux: bool) {
    let x = Across::new(linux);
    for (client, server, addr) in [(&x.c1, &x.c2, "10.77.0.2"), (&x.c2, &x.c1, "10.77.0.1")] {
        let bytes = iperf3(client, server, addr);
        assert!(bytes > 1_000_000, "iperf3 to {addr}: {bytes} bytes");
        checked_transfer(client, server, addr);
    }
    let ports: &[&str] = if linux {
        &["vale0:t"]
    } else {
        &["vale0:t", "vale1:t"]
    };
    for p in ports {
        let l = line(&x.v, p);
        eprintln!("{p}: {l}");
        assert!(field(&l, "tso-frames") > 0, "{p}: {l}");
        assert!(field(&l, "gso-sends") > 0, "{p}: {l}");
        assert!(
            field(&l, "gso-segments") >= 2 * field(&l, "gso-sends"),
            "{p}: {l}"
        );
        assert_eq!(
            field(&l, "too-big") + field(&l, "bad-header") + field(&l, "bad-offload"),
            0,
            "{p}: {l}"
        );
        assert_eq!(field(&l, "gso-off"), 0, "{p}: {l}");
        if !linux {
            // What one port sent with UDP_SEGMENT the other received merged, and handed to
            // its TAP port as TSO frames.
            assert!(field(&l, "gro-buffers") > 0, "{p}: {l}");
            assert!(field(&l, "tso-merged") > 0, "{p}: {l}");
        }
    }
}

#[test]
fn tcp_crosses_a_vale_tunnel_as_udp_segment_sends() {
    tcp_across(false);
}

#[test]
fn tcp_crosses_to_linux_vxlan_as_udp_segment_sends() {
    tcp_across(true);
}

/// Sends `buf` from `sock` to `to` as one `UDP_SEGMENT` send of segments of `seg` bytes.
fn send_segmented(sock: &std::net::UdpSocket, to: &str, buf: &[u8], seg: u16) {
    use std::os::fd::AsRawFd;
    let to: std::net::SocketAddrV4 = to.parse().unwrap();
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: to.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(to.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // A cmsghdr and room for the u16, 8-byte aligned.
    let mut control = [0u64; 4];
    // SAFETY: all-zero is a valid msghdr; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &sin as *const _ as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    // SAFETY: pure arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
    // SAFETY: the control buffer holds CMSG_SPACE(2) bytes, aligned for a cmsghdr.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(2) as _;
        std::ptr::copy_nonoverlapping(seg.to_ne_bytes().as_ptr(), libc::CMSG_DATA(c), 2);
    }
    // SAFETY: a complete msghdr.
    let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    assert_eq!(r, buf.len() as isize, "{}", std::io::Error::last_os_error());
}

/// Buffers the kernel merged (`UDP_GRO`) are split by their segment size and each datagram in
/// them is checked as one received alone: one of another VNI and a last piece too short for a
/// header are counted drops, the others arrive whole and in order, a last one shorter than
/// the segment size included.
#[test]
fn merged_datagrams_are_split_and_each_checked() {
    let (home, v) = vxlan_on_lo("g", 42, &["remote=127.0.0.2"]);
    let b = v.open("vale0:b");
    let frames: Vec<Vec<u8>> = (0..6)
        .map(|s| test_frame(100, MAC_A, BROADCAST, s))
        .collect();
    let pkt = |vni: u32, f: &[u8]| {
        let mut p = vxlan_packet(vni, MAC_A, BROADCAST, 0)[..8].to_vec();
        p.extend_from_slice(f);
        p
    };
    // Segments of 108 bytes: good, another VNI, good, and 5 bytes.
    let mut one = [pkt(42, &frames[0]), pkt(7, &frames[1]), pkt(42, &frames[2])].concat();
    one.extend_from_slice(&pkt(42, &frames[3])[..5]);
    // Good, good, and a last one of 68 bytes: 284 is no multiple of 108.
    let mut two = [pkt(42, &frames[4]), pkt(42, &frames[5])].concat();
    let short = test_frame(60, MAC_A, BROADCAST, 9);
    two.extend_from_slice(&pkt(42, &short));
    in_netns(&home.name, move || {
        let s = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        send_segmented(&s, "127.0.0.1:4789", &one, 108);
        send_segmented(&s, "127.0.0.1:4789", &two, 108);
    });
    let want = vec![
        frames[0].clone(),
        frames[2].clone(),
        frames[4].clone(),
        frames[5].clone(),
        short,
    ];
    assert_eq!(recv_n(&b, 5), want);
    let l = wait_line(&v, "vale0:t", "drops counted", |l| {
        field(l, "wrong-vni") == 1 && field(l, "bad-header") == 1
    });
    eprintln!("{l}");
    // Over lo the kernel hands each send over whole: two merged buffers of 7 datagrams.
    assert_eq!(
        (field(&l, "gro-buffers"), field(&l, "gro-segments")),
        (2, 7),
        "{l}"
    );
    assert_eq!(field(remote_of(&l, "127.0.0.2"), "rx"), 5, "{l}");
}

/// Datagrams the port took from its socket but had no room for in its ring wait in the port
/// and go on at its next turn, though nothing more arrives: 20 merged buffers of 64
/// datagrams (1,280 frames, more than the port's ring takes in one turn) queued while valed
/// is stopped all enter the switch with no further traffic. (They used to stay in the port
/// until the next datagram came: frames of one paced run were counted in the next.)
#[test]
fn datagrams_taken_beyond_the_rings_room_go_on_without_more_traffic() {
    let (home, v) = vxlan_on_lo("h", 42, &["remote=127.0.0.2"]);
    let seg: Vec<u8> = {
        let mut p = vxlan_packet(42, MAC_A, BROADCAST, 0)[..8].to_vec();
        p.extend_from_slice(&test_frame(60, MAC_A, BROADCAST, 1));
        p
    };
    let (sends, per_send) = (20, 64);
    let buf = seg.repeat(per_send);
    v.signal(libc::SIGSTOP);
    in_netns(&home.name, move || {
        let s = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        for _ in 0..sends {
            send_segmented(&s, "127.0.0.1:4789", &buf, seg.len() as u16);
        }
    });
    v.signal(libc::SIGCONT);
    let want = (sends * per_send) as u64;
    let arrived = wait_until(Duration::from_secs(10), || {
        v.counters("vale0:t").tx_packets >= want
    });
    let c = v.counters("vale0:t");
    assert!(
        arrived && c.tx_packets == want,
        "{} of {want} frames entered the switch: {c:?}",
        c.tx_packets
    );
}

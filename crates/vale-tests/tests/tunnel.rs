//! Tunnel ports (VXLAN, Geneve): interop with Linux's vxlan device, two switches joined by
//! tunnel ports carrying a checked stream, and a hostile underlay. valed runs in a network
//! namespace of its own; every address and device is the test's.
//!
//! Needs root, iproute2 and ping (the README's test command installs them).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use vale_tests::netns::{iperf3_json, Netns, TapNet};
use vale_tests::tunnel::*;
use vale_tests::*;

/// An IP counter of namespace `ns`: IPv4's from /proc/net/snmp (`Ip:` lines), IPv6's
/// (`Ip6...`) from /proc/net/snmp6.
fn ip_stat(ns: &Netns, name: &str) -> u64 {
    if name.starts_with("Ip6") {
        let snmp = ns.ok("cat /proc/net/snmp6");
        let l = snmp
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .expect("Ip6 counter");
        return l.split_whitespace().nth(1).unwrap().parse().unwrap();
    }
    let snmp = ns.ok("cat /proc/net/snmp");
    let mut lines = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|n| n == name)
        .expect("Ip counter");
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// valed (in `net.home`) with a vxlan port toward a Linux vxlan device on a bridge in
/// namespace H2, behind which namespace C2 (10.77.0.2) sits; C1 (10.77.0.1) is behind a TAP
/// port of the same switch. The underlay is a veth, 192.168.77.1 (valed) to .2 (H2), or
/// fd78::1 to fd78::2 (`v6`), MTU 1500.
struct Interop {
    net: TapNet,
    h2: Netns,
    c2: Netns,
}

impl Interop {
    fn new(v6: bool) -> Interop {
        let (local, remote, plen) = if v6 {
            ("fd78::1", "fd78::2", 64)
        } else {
            ("192.168.77.1", "192.168.77.2", 24)
        };
        let net = TapNet::new(&["c1"]);
        let h2 = Netns::new("x");
        let c2 = Netns::new("y");
        linux_vtep(&net.home, &h2, &c2, local, remote, plen);
        net.v.ctl_ok(&[
            "attach",
            "vale0:vx",
            "vxlan",
            "vni=42",
            &format!("local={local}"),
            &format!("remote={remote}"),
        ]);
        Interop { net, h2, c2 }
    }
}

/// A vxlan port and Linux's vxlan device carry pings both ways, small and large; a frame too
/// big for the underlay is counted as such and not fragmented. Over an IPv4 or IPv6 (`v6`)
/// underlay.
fn interop(v6: bool) {
    let x = Interop::new(v6);
    let (local, remote, reasm) = if v6 {
        ("[fd78::1]:4789", "fd78::2", "Ip6ReasmReqds")
    } else {
        ("192.168.77.1:4789", "192.168.77.2", "ReasmReqds")
    };
    // The largest ping that fits: 1500 - 50 (IPv4) or 70 (IPv6) - 28.
    let big = if v6 { 1400 } else { 1420 };
    let c1 = x.net.ns(0);
    let p = x.net.v.port("vale0:vx").expect("listed");
    assert_eq!(
        (p.kind.as_str(), p.device.as_deref(), p.mode.as_deref()),
        ("vxlan", Some(local), Some("vni 42"))
    );
    c1.ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    x.c2.ok("ping -c 3 -i 0.2 -W 2 10.77.0.1");
    c1.ok(&format!("ping -c 3 -i 0.2 -W 2 -M do -s {big} 10.77.0.2"));
    x.c2.ok(&format!("ping -c 3 -i 0.2 -W 2 -M do -s {big} 10.77.0.1"));
    let l = wait_line(&x.net.v, "vale0:vx", "traffic counted", |l| {
        field(remote_of(l, remote), "rx") >= 12
    });
    assert_eq!(field(&l, "too-big"), 0, "{l}");
    assert_eq!(
        field(&l, "bad-header") + field(&l, "unknown-vtep"),
        0,
        "{l}"
    );
    // 1500 bytes of IP, 1514 of frame: 1564 or 1584 on the underlay of MTU 1500.
    let before = ip_stat(&x.h2, reasm);
    let out = c1.run("ping -c 2 -i 0.2 -W 1 -M do -s 1472 10.77.0.2", T);
    assert!(!out.status.success(), "no reply to a frame too big");
    wait_line(&x.net.v, "vale0:vx", "too big counted", |l| {
        field(l, "too-big") == 2
    });
    assert_eq!(ip_stat(&x.h2, reasm), before, "no fragment reached H2");
    // The path still works.
    c1.ok("ping -c 2 -i 0.2 -W 2 10.77.0.2");
}

#[test]
fn vxlan_interoperates_with_the_linux_vxlan_device() {
    interop(false);
}

/// TCP from a container behind a TAP port (TSO segments and partial checksums, finished in
/// software by the switch on the way into the tunnel) to one behind Linux's vxlan device, and
/// back, with the MTU set inside as docs/spanning-hosts.md says (1450).
#[test]
fn tcp_from_a_tap_port_crosses_the_tunnel_both_ways() {
    let x = Interop::new(false);
    let c1 = x.net.ns(0);
    c1.ok(&format!("ip link set {} mtu 1450", x.net.hosts[0].1));
    x.c2.ok("ip link set ce mtu 1450");
    c1.ok("ping -c 2 -i 0.2 -W 2 10.77.0.2");
    for (client, server, addr) in [(c1, &x.c2, "10.77.0.2"), (&x.c2, c1, "10.77.0.1")] {
        let j = iperf3_json(client, server, addr, "");
        let bytes = j["end"]["sum_received"]["bytes"].as_u64().expect("bytes");
        assert!(bytes > 1_000_000, "iperf3 to {addr}: {bytes} bytes");
    }
    let l = line(&x.net.v, "vale0:vx");
    assert_eq!(field(&l, "too-big") + field(&l, "bad-header"), 0, "{l}");
}

#[test]
fn vxlan_interoperates_with_the_linux_vxlan_device_over_ipv6() {
    interop(true);
}

/// valed in `home` with native ports vale0:a and vale1:b, and tunnel ports vale0:t and vale1:t
/// of kind `kind` between 127.0.0.1 and 127.0.0.2 (`extra`: more arguments of vale0:t, its
/// `remote` included).
fn two_switches(kind: &str, extra: &[&str]) -> (Netns, Valed) {
    let home = Netns::new("t");
    let v = Valed::start_in(&home, &[]);
    for (port, local, remote) in [
        ("vale0:t", "127.0.0.1", "127.0.0.2"),
        ("vale1:t", "127.0.0.2", "127.0.0.1"),
    ] {
        let mut args = vec![
            "attach".to_string(),
            port.into(),
            kind.into(),
            "vni=5".into(),
            format!("local={local}"),
        ];
        let extra = if port == "vale0:t" { extra } else { &[] };
        if !extra.iter().any(|a| a.starts_with("remote=")) {
            args.push(format!("remote={remote}"));
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        v.ctl_ok(&args);
    }
    (home, v)
}

/// `n` frames from `tx` to `rx` (MAC `src` to `dst`), `window` at a time, each received whole
/// and in order.
fn checked_stream(tx: &vale::Port, rx: &vale::Port, src: [u8; 6], dst: [u8; 6], n: u64) {
    let window = 32;
    let mut seq = 0;
    while seq < n {
        let frames: Vec<Vec<u8>> = (seq..(seq + window).min(n))
            .map(|s| test_frame(60 + (s % 1400) as usize, src, dst, s))
            .collect();
        send_all(tx, &frames);
        let got = recv_n(rx, frames.len());
        assert_eq!(got, frames, "frames {seq}..");
        seq += frames.len() as u64;
    }
}

fn stream_between_two_switches(kind: &str) {
    let (_home, v) = two_switches(kind, &[]);
    let a = v.open("vale0:a");
    let b = v.options().slots(1024).open("vale1:b").expect("open b");
    send_and_expect(&a, &b, &test_frame(60, MAC_A, BROADCAST, 0), "a's hello");
    send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, 0), "b's reply");
    checked_stream(&a, &b, MAC_A, MAC_B, 3000);
    checked_stream(&b, &a, MAC_B, MAC_A, 1000);
    let l = wait_line(&v, "vale0:t", "stream counted", |l| {
        field(remote_of(l, "127.0.0.2"), "tx") >= 3001
    });
    assert_eq!(field(remote_of(&l, "127.0.0.2"), "drops"), 0, "{l}");
    assert!(l.starts_with(&format!("{kind} vni 5")), "{l}");
    // Both MACs known: unicast, learnt on both ends.
    assert!(field(&l, "learnt") >= 1, "{l}");
}

#[test]
fn vxlan_ports_join_two_switches_losing_nothing() {
    stream_between_two_switches("vxlan");
}

#[test]
fn geneve_ports_join_two_switches_losing_nothing() {
    stream_between_two_switches("geneve");
}

/// The arguments are checked, and a second port on the same local address and port is
/// refused as busy, saying what to change.
#[test]
fn tunnel_arguments_are_checked_and_a_taken_port_is_busy() {
    let (_home, v) = two_switches("vxlan", &[]);
    v.ctl_fails(
        &[
            "attach",
            "vale2:t",
            "vxlan",
            "vni=5",
            "local=127.0.0.1",
            "remote=127.0.0.9",
        ],
        1,
        "use another local address or dstport",
    );
    for (args, msg) in [
        (
            &["vni=16777216", "local=127.0.0.1", "remote=127.0.0.9"][..],
            "vni",
        ),
        (
            &["vni=1", "local=nowhere", "remote=127.0.0.9"],
            "not an IPv4 or IPv6",
        ),
        (
            &["vni=1", "local=127.0.0.1", "remote=::1"],
            "same IP version",
        ),
        (&["vni=1", "local=127.0.0.1"], "needs argument 'remote'"),
        (
            &["vni=1", "local=127.0.0.1", "remote=127.0.0.9,127.0.0.1"],
            "is the local address",
        ),
        (
            &["vni=1", "local=127.0.0.1", "remote=224.0.0.1"],
            "not a unicast address",
        ),
        (
            &[
                "vni=1",
                "local=127.0.0.1",
                "remote=127.0.0.9",
                "learn-limit=0",
            ],
            "learn-limit",
        ),
        (
            &["vni=1", "local=127.0.0.1", "remote=127.0.0.9", "dstport=0"],
            "dstport",
        ),
    ] {
        let mut a = vec!["attach", "vale2:t", "geneve"];
        a.extend_from_slice(args);
        v.ctl_fails(&a, 1, msg);
    }
    // Another dstport on the same address is fine.
    v.ctl_ok(&[
        "attach",
        "vale2:t",
        "vxlan",
        "vni=5",
        "local=127.0.0.1",
        "remote=127.0.0.9",
        "dstport=4790",
    ]);
}

/// Garbage and floods on the underlay are counted drops; a checked stream beside them loses
/// nothing; a remote sending from random inner MACs fills its own share of the table only.
#[test]
fn a_hostile_underlay_is_counted_and_harms_nobody() {
    let (home, v) = two_switches("vxlan", &["remote=127.0.0.2,127.0.0.4", "learn-limit=64"]);
    let a = v.options().slots(1024).open("vale0:a").expect("open a");
    let b = v.open("vale1:b");
    let sink = v.open("vale0:sink");
    const MAC_S: [u8; 6] = [2, 0, 0, 0, 0, 0x5];
    const MAC_Q: [u8; 6] = [2, 0, 0, 0, 0, 0x9];
    // vale0 learns the sink: what the hostile remotes send goes there, not to a.
    send_and_expect(
        &sink,
        &a,
        &test_frame(60, MAC_S, BROADCAST, 0),
        "sink's hello",
    );
    assert_eq!(recv_n(&b, 1), vec![test_frame(60, MAC_S, BROADCAST, 0)]);
    send_and_expect(&a, &b, &test_frame(60, MAC_A, BROADCAST, 0), "a's hello");
    send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, 0), "b's reply");
    let before = line(&v, "vale0:t");
    let hostile = std::thread::spawn({
        let ns = home.name.clone();
        move || {
            in_netns(&ns, || {
                let to = "127.0.0.1:4789";
                let known = UdpSocket::bind("127.0.0.2:0").unwrap();
                let other = UdpSocket::bind("127.0.0.4:0").unwrap();
                let stranger = UdpSocket::bind("127.0.0.3:0").unwrap();
                let good = vxlan_packet(5, [2, 0, 0, 0, 1, 1], MAC_S, 60);
                let mut wrong_flags = good.clone();
                wrong_flags[0] = 0x88;
                let bad: Vec<Vec<u8>> = vec![
                    good[..5].to_vec(),
                    wrong_flags,
                    vxlan_packet(5, MAC_Q, MAC_S, 0),
                    vxlan_packet(5, MAC_Q, MAC_S, 13),
                    vxlan_packet(6, MAC_Q, MAC_S, 60),
                    vxlan_packet(5, MAC_Q, MAC_S, 65_000),
                ];
                for p in &bad {
                    known.send_to(p, to).unwrap();
                }
                stranger.send_to(&good, to).unwrap();
                // A flood of random inner source MACs from one remote, paced so that the
                // socket keeps up.
                let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
                for i in 0..3000u32 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let m = x.to_le_bytes();
                    let src = [m[0] & 0xfe | 2, m[1], m[2], m[3], m[4], m[5]];
                    known.send_to(&vxlan_packet(5, src, MAC_S, 60), to).unwrap();
                    if i % 64 == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
                // Another remote's MAC is still learnt.
                other
                    .send_to(&vxlan_packet(5, MAC_Q, MAC_S, 60), to)
                    .unwrap();
            })
        }
    });
    let started = Instant::now();
    checked_stream(&b, &a, MAC_B, MAC_A, 2000);
    hostile.join().expect("hostile sender");
    let l = wait_line(&v, "vale0:t", "hostile packets counted", |l| {
        // A new MAC of a remote at its limit is learnt only in place of one of its own in the
        // same bucket (about one in thirty here): most are refused.
        field(l, "not-learnt") >= 2000 && field(remote_of(l, "127.0.0.4"), "rx") == 1
    });
    assert_eq!(
        field(&l, "bad-header"),
        field(&before, "bad-header") + 4,
        "{l}"
    );
    assert_eq!(field(&l, "wrong-vni"), 1, "{l}");
    assert_eq!(field(&l, "too-big"), 1, "{l}");
    assert_eq!(field(&l, "unknown-vtep"), 1, "{l}");
    assert!(field(&l, "learnt") <= 64 + 2, "the limit holds: {l}");
    // MAC_Q is known at 127.0.0.4: a frame to it goes there only.
    let tx2 = field(remote_of(&l, "127.0.0.2"), "tx");
    let tx4 = field(remote_of(&l, "127.0.0.4"), "tx");
    send_all(&a, &[test_frame(60, MAC_A, MAC_Q, 1)]);
    let l = wait_line(&v, "vale0:t", "unicast to the learnt remote", |l| {
        field(remote_of(l, "127.0.0.4"), "tx") == tx4 + 1
    });
    assert_eq!(
        field(remote_of(&l, "127.0.0.2"), "tx"),
        tx2,
        "not flooded: {l}"
    );
    // The stream kept going beside it; valed lives.
    checked_stream(&b, &a, MAC_B, MAC_A, 200);
    assert!(started.elapsed() < Duration::from_secs(60));
    drop(sink);
}

/// A Geneve header of VNI `vni` saying `opt_words` words of options and `flags`, then
/// `opt_bytes` bytes of options (zeros), then `inner`.
fn geneve_packet(vni: u32, opt_words: u8, flags: u8, opt_bytes: usize, inner: &[u8]) -> Vec<u8> {
    let v = vni.to_be_bytes();
    let mut p = vec![opt_words, flags, 0x65, 0x58, v[1], v[2], v[3], 0];
    p.extend(std::iter::repeat_n(0u8, opt_bytes));
    p.extend_from_slice(inner);
    p
}

/// Geneve: options are skipped (the inner frame arrives whole), the critical flag and options
/// overrunning the packet are counted drops, and packets after a drop in the same batch arrive
/// whole and in order.
#[test]
fn geneve_options_are_skipped_and_critical_ones_dropped() {
    let (home, v) = two_switches("geneve", &[]);
    let a = v.open("vale0:a");
    let b = v.open("vale1:b");
    send_and_expect(&a, &b, &test_frame(60, MAC_A, BROADCAST, 0), "a's hello");
    let frames: Vec<Vec<u8>> = (1..=4)
        .map(|s| test_frame(100 + s, MAC_B, MAC_A, s as u64))
        .collect();
    let packets = vec![
        geneve_packet(5, 1, 0x40, 4, &frames[0]),
        geneve_packet(5, 2, 0, 8, &frames[0]),
        // 252 bytes of options said, 60 there.
        geneve_packet(5, 63, 0, 0, &frames[1][..60]),
        geneve_packet(5, 0, 0, 0, &frames[1]),
        // Options leaving 13 bytes of inner frame.
        geneve_packet(5, 63, 0, 252 - 100 + 13, &frames[2][..100]),
        geneve_packet(9, 0, 0, 0, &frames[2]),
        geneve_packet(5, 0x41, 0, 4, &frames[2]),
        geneve_packet(5, 0, 0x80, 0, &frames[3]),
    ];
    in_netns(&home.name, move || {
        let s = UdpSocket::bind("127.0.0.2:0").unwrap();
        for p in &packets {
            s.send_to(p, "127.0.0.1:6081").unwrap();
        }
    });
    // The first frame (options skipped), the second, the fourth (the O flag is no reason to
    // drop); the third's packets were all refused.
    let want = vec![frames[0].clone(), frames[1].clone(), frames[3].clone()];
    assert_eq!(recv_n(&a, 3), want);
    let l = wait_line(&v, "vale0:t", "drops counted", |l| {
        field(l, "critical") == 1 && field(l, "bad-header") == 3
    });
    assert_eq!(field(&l, "wrong-vni"), 1, "{l}");
    assert_eq!(field(remote_of(&l, "127.0.0.2"), "drops"), 5, "{l}");
}

/// A saved configuration brings tunnel ports back with their arguments: the stream flows
/// again after a restart.
#[test]
fn tunnel_ports_come_back_after_a_restart() {
    let home = Netns::new("r");
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    let cfg_s = cfg.to_str().unwrap();
    let mut v = Valed::start_in(&home, &["--config", cfg_s]);
    for (port, kind, local, remote) in [
        ("vale0:t", "vxlan", "127.0.0.1", "127.0.0.2"),
        ("vale1:t", "vxlan", "127.0.0.2", "127.0.0.1"),
        ("vale0:g", "geneve", "127.0.0.1", "127.0.0.3"),
    ] {
        v.ctl_ok(&[
            "attach",
            port,
            kind,
            "vni=77",
            &format!("local={local}"),
            &format!("remote={remote}"),
            "learn-limit=100",
        ]);
    }
    v.ctl_ok(&["save"]);
    v.restart_in(&home, &["--config", cfg_s]);
    for (port, kind, device) in [
        ("vale0:t", "vxlan", "127.0.0.1:4789"),
        ("vale1:t", "vxlan", "127.0.0.2:4789"),
        ("vale0:g", "geneve", "127.0.0.1:6081"),
    ] {
        let p = v
            .port(port)
            .unwrap_or_else(|| panic!("{port} back: {}", v.log()));
        assert_eq!(
            (p.kind.as_str(), p.device.as_deref(), p.mode.as_deref()),
            (kind, Some(device), Some("vni 77"))
        );
    }
    let a = v.open("vale0:a");
    let b = v.open("vale1:b");
    send_and_expect(&a, &b, &test_frame(60, MAC_A, BROADCAST, 0), "a's hello");
    send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, 0), "b's reply");
    checked_stream(&a, &b, MAC_A, MAC_B, 500);
}

/// vale-ctl's `--vxlan` and `--geneve` flags (made from the kinds' descriptions) attach the
/// ports the generic form does: frames cross, every `--remote` is one, `--dstport` is used.
#[test]
fn the_vxlan_and_geneve_flags_attach_tunnel_ports() {
    let home = Netns::new("f");
    let v = Valed::start_in(&home, &[]);
    let vxlan = |port: &str, local: &str, remotes: &[&str]| {
        let mut a = vec!["attach", port, "--vxlan", "--vni", "5", "--local", local];
        for r in remotes {
            a.extend(["--remote", r]);
        }
        v.ctl_ok(&a);
    };
    vxlan("vale0:t", "127.0.0.1", &["127.0.0.2", "127.0.0.3"]);
    vxlan("vale1:t", "127.0.0.2", &["127.0.0.1"]);
    let a = v.open("vale0:a");
    let b = v.open("vale1:b");
    send_and_expect(&a, &b, &test_frame(60, MAC_A, BROADCAST, 0), "a's hello");
    send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, 0), "b's reply");
    let l = wait_line(&v, "vale0:t", "the hello counted", |l| {
        field(remote_of(l, "127.0.0.2"), "tx") >= 1
    });
    assert!(l.starts_with("vxlan vni 5"), "{l}");
    // The broadcast went to the second remote too.
    assert!(field(remote_of(&l, "127.0.0.3"), "tx") >= 1, "{l}");
    v.ctl_ok(&[
        "attach",
        "vale2:g",
        "--geneve",
        "--vni",
        "7",
        "--local",
        "127.0.0.1",
        "--remote",
        "127.0.0.2",
        "--dstport",
        "6090",
    ]);
    let g = v.port("vale2:g").expect("listed");
    assert_eq!(g.kind, "geneve");
    assert_eq!(g.device.as_deref(), Some("127.0.0.1:6090"));
    // Usage errors, before valed is asked.
    v.ctl_fails(
        &[
            "attach",
            "vale2:h",
            "--vxlan",
            "--vni",
            "5",
            "--remote",
            "127.0.0.2",
        ],
        2,
        "--vxlan (vxlan) needs --local <ADDR>",
    );
    v.ctl_fails(
        &[
            "attach",
            "vale2:h",
            "--geneve",
            "--vni",
            "5",
            "--local",
            "127.0.0.1",
            "--remote",
            "127.0.0.2",
            "--mode",
            "xdp",
        ],
        2,
        "--mode belongs to --iface (nic), not --geneve",
    );
    assert!(v.port("vale2:h").is_none());
}

//! Tunnel ports that learn their remotes (`learn-remotes`): a VTEP not in the `remote` list
//! whose packet passes every check becomes a remote of the port, bounded in number; a flood of
//! spoofed senders costs a counter. Against spoofed senders on loopback and against Linux's
//! vxlan device (which sends from hashed UDP source ports) with no `remote` given at all.
//!
//! Needs root, iproute2, ping and ethtool.

use std::net::UdpSocket;
use std::time::Duration;

use vale_tests::netns::{Netns, TapNet};
use vale_tests::tunnel::*;
use vale_tests::*;

/// The inner source MAC spoofed VTEP `i` sends from.
fn mac_of(i: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0x77, i]
}

/// 100 spoofed VTEPs (127.0.0.10 to .109, each from its own inner MAC) send a valid packet
/// each, a stranger sends garbage and a packet comes from the port's own address: 4 are learnt
/// (`learn-remotes=4`), 96 counted as `remotes-full`, the others as `unknown-vtep`. A learnt MAC is sent to its remote alone; a
/// broadcast reaches every remote, configured and learnt; two switches still talk.
#[test]
fn learnt_remotes_are_bounded_and_their_macs_point_at_them() {
    let (home, v) = vxlan_on_lo("l", 5, &["remote=127.0.0.2", "learn-remotes=4"]);
    v.ctl_ok(&[
        "attach",
        "vale1:t",
        "vxlan",
        "vni=5",
        "local=127.0.0.2",
        "remote=127.0.0.1",
    ]);
    let a = v.options().slots(1024).open("vale0:a").expect("open a");
    let b = v.open("vale1:b");
    send_and_expect(&a, &b, &test_frame(60, MAC_A, BROADCAST, 0), "a's hello");
    send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, 0), "b's reply");
    in_netns(&home.name, || {
        let to = "127.0.0.1:4789";
        // Garbage from a stranger teaches nothing.
        let stranger = UdpSocket::bind("127.0.0.200:0").unwrap();
        let mut bad = vxlan_packet(5, mac_of(200), MAC_A, 60);
        bad[0] = 0x88;
        stranger.send_to(&bad, to).unwrap();
        stranger
            .send_to(&vxlan_packet(6, mac_of(200), MAC_A, 60), to)
            .unwrap();
        // Nor does a packet from the port's own address: floods sent there would come back.
        let itself = UdpSocket::bind("127.0.0.1:0").unwrap();
        itself
            .send_to(&vxlan_packet(5, mac_of(201), MAC_A, 60), to)
            .unwrap();
        for i in 10..110u8 {
            let s = UdpSocket::bind(format!("127.0.0.{i}:0")).unwrap();
            s.send_to(&vxlan_packet(5, mac_of(i), MAC_A, 60), to)
                .unwrap();
            if i == 13 {
                // The first four are learnt in order.
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    });
    let got = recv_n(&a, 4);
    let want: Vec<Vec<u8>> = (10..14u8)
        .map(|i| test_frame(60, mac_of(i), MAC_A, 7))
        .collect();
    assert_eq!(got, want, "the frames of the four learnt remotes");
    let l = wait_line(&v, "vale0:t", "spoofed senders counted", |l| {
        field(l, "remotes-full") == 96 && field(l, "unknown-vtep") == 3
    });
    assert_eq!(l.matches("learnt remote ").count(), 4, "{l}");
    for i in 10..14 {
        assert!(l.contains(&format!("learnt remote 127.0.0.{i}: ")), "{l}");
    }
    assert!(!l.contains("127.0.0.14:"), "{l}");
    let tx = |l: &str, i: u8| field(remote_of(l, &format!("127.0.0.{i}")), "tx");
    let before = |i: u8| tx(&l, i);
    let others = [2, 10, 12, 13];
    let (was11, was): (u64, Vec<u64>) = (before(11), others.iter().map(|i| before(*i)).collect());
    // The MAC behind 127.0.0.11 goes there alone.
    send_all(&a, &[test_frame(60, MAC_A, mac_of(11), 1)]);
    let l2 = wait_line(&v, "vale0:t", "unicast to a learnt remote", |l| {
        tx(l, 11) == was11 + 1
    });
    for (i, n) in others.iter().zip(&was) {
        assert_eq!(tx(&l2, *i), *n, "not flooded to 127.0.0.{i}: {l2}");
    }
    // A broadcast reaches all five.
    send_all(&a, &[test_frame(60, MAC_A, BROADCAST, 2)]);
    assert_eq!(
        recv_n(&b, 1),
        vec![test_frame(60, MAC_A, BROADCAST, 2)],
        "b's copy"
    );
    wait_line(&v, "vale0:t", "broadcast to every remote", |l| {
        tx(l, 11) == was11 + 2 && others.iter().zip(&was).all(|(i, n)| tx(l, *i) == n + 1)
    });
    // The switches still talk, unicast.
    send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, 3), "b again");
    send_and_expect(&a, &b, &test_frame(60, MAC_A, MAC_B, 3), "a again");
}

/// The argument is checked.
#[test]
fn learn_remotes_is_checked() {
    let home = Netns::new("m");
    let v = Valed::start_in(&home, &[]);
    for bad in ["learn-remotes=257", "learn-remotes=maybe"] {
        v.ctl_fails(
            &[
                "attach",
                "vale0:t",
                "vxlan",
                "vni=5",
                "local=127.0.0.1",
                bad,
            ],
            1,
            "learn-remotes",
        );
    }
    // Without learning, the list is required.
    v.ctl_fails(
        &["attach", "vale0:t", "vxlan", "vni=5", "local=127.0.0.1"],
        1,
        "needs argument 'remote'",
    );
    v.ctl_ok(&[
        "attach",
        "vale0:t",
        "geneve",
        "vni=5",
        "local=127.0.0.1",
        "learn-remotes=yes",
    ]);
}

/// valed with a vxlan port that has no remote at all, only `learn-remotes=yes`, and a Linux
/// vxlan device on a bridge in H2 that knows valed's address: C2 pings C1 first (its ARP
/// request teaches valed the Linux VTEP, which sends from hashed UDP source ports), then C1
/// pings C2, small and large.
#[test]
fn a_linux_vtep_is_learnt_as_a_remote() {
    let net = TapNet::new(&["c1"]);
    let h2 = Netns::new("q");
    let c2 = Netns::new("r");
    linux_vtep(&net.home, &h2, &c2, "192.168.79.1", "192.168.79.2", 24);
    net.v.ctl_ok(&[
        "attach",
        "vale0:vx",
        "vxlan",
        "vni=42",
        "local=192.168.79.1",
        "learn-remotes=yes",
    ]);
    let c1 = net.ns(0);
    c2.ok("ping -c 3 -i 0.2 -W 2 10.77.0.1");
    let l = wait_line(&net.v, "vale0:vx", "the Linux VTEP learnt", |l| {
        l.contains("learnt remote 192.168.79.2: ")
    });
    assert_eq!(field(&l, "unknown-vtep") + field(&l, "remotes-full"), 0);
    c1.ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    c1.ok("ping -c 3 -i 0.2 -W 2 -M do -s 1400 10.77.0.2");
    c2.ok("ping -c 3 -i 0.2 -W 2 -M do -s 1400 10.77.0.1");
    let l = line(&net.v, "vale0:vx");
    assert!(field(remote_of(&l, "192.168.79.2"), "rx") >= 12, "{l}");
    assert_eq!(field(&l, "bad-header") + field(&l, "too-big"), 0, "{l}");
}

/// Linux and OVS send from a UDP source port hashed from the inner flow: a remote is known by
/// its address alone, whatever port a packet comes from (and, learnt or configured, it is sent
/// to at `dstport`).
#[test]
fn packets_from_any_source_port_are_taken() {
    let (home, v) = vxlan_on_lo("s", 5, &["remote=127.0.0.2"]);
    let a = v.options().slots(1024).open("vale0:a").expect("open a");
    // a is known to vale0 before the packets come.
    send_all(&a, &[test_frame(60, MAC_A, BROADCAST, 0)]);
    let ports = in_netns(&home.name, || {
        let mut ports = std::collections::BTreeSet::new();
        for k in 0..64u8 {
            // Each from a port of its own, as many flows would come.
            let s = UdpSocket::bind("127.0.0.2:0").unwrap();
            ports.insert(s.local_addr().unwrap().port());
            s.send_to(&vxlan_packet(5, mac_of(k), MAC_A, 60), "127.0.0.1:4789")
                .unwrap();
        }
        ports.len()
    });
    assert!(ports > 1, "the packets came from {ports} source ports");
    let got = recv_n(&a, 64);
    let want: Vec<Vec<u8>> = (0..64u8)
        .map(|k| test_frame(60, mac_of(k), MAC_A, 7))
        .collect();
    assert_eq!(got, want);
    let l = wait_line(&v, "vale0:t", "all taken", |l| {
        field(remote_of(l, "127.0.0.2"), "rx") == 64
    });
    assert_eq!(field(&l, "unknown-vtep"), 0, "{l}");
}

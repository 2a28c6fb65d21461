//! Tunnel ports beyond one VNI and one peer: ports of several VNIs on one local address and
//! port against a Linux host carrying the same VNIs on vxlan devices at 4789 (as every VTEP
//! sends all its VNIs to one port), and three hosts, one vale and two Linux, where a broadcast
//! reaches both and a learnt unicast stream one. valed runs in a network namespace of its own;
//! every address and device is the test's.
//!
//! Needs root, iproute2, ping and ethtool.

use std::net::UdpSocket;

use vale_tests::netns::{unique, Netns};
use vale_tests::tunnel::*;
use vale_tests::*;

/// Turns IPv6 off in `ns`, on the devices there and those to come, so that it sends nothing
/// the test does not ask for (no MLD, router or neighbour solicitations).
fn quiet(ns: &Netns) {
    ns.ok("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1");
}

/// A namespace behind a new TAP port `port` of valed `v` (in `home`), with address `addr`
/// (CIDR), [`quiet`]. Returns it and the TAP's name.
fn tap_host(home: &Netns, v: &Valed, port: &str, addr: &str) -> (Netns, String) {
    let tap = unique("vtap");
    v.ctl_ok(&["attach", port, "--tap", &tap]);
    let ns = Netns::new("c");
    quiet(&ns);
    ns.adopt(Some(home), &tap, &[addr]);
    quiet(&ns);
    (ns, tap)
}

/// Attaches `port`, a vxlan port of VNI `vni` on `local` (port 4789) toward `remotes`.
fn attach_vxlan(v: &Valed, port: &str, vni: u32, local: &str, remotes: &str) {
    v.ctl_ok(&[
        "attach",
        port,
        "vxlan",
        &format!("vni={vni}"),
        &format!("local={local}"),
        &format!("remote={remotes}"),
    ]);
}

/// Whether the bridge `br` of namespace `h` has learnt MAC `mac`.
fn fdb_has(h: &Netns, br: &str, mac: &str) -> bool {
    h.ok(&format!("bridge fdb show br {br}"))
        .lines()
        .any(|l| l.starts_with(mac))
}

const LOCAL: &str = "192.168.77.1";
const H2: &str = "192.168.77.2";

/// A Linux host (H2) with vxlan devices of VNIs 42 and 43 at 4789, each on its own bridge with
/// a container behind it (10.77.0.2, 10.78.0.2); valed with vxlan ports of VNIs 42 and 43 on
/// one local address and port 4789, on two switches, each with a TAP port into a container
/// (10.77.0.1, 10.78.0.1), and a third port (VNI 44, no peer) attached last. Each pair pings
/// and nothing crosses between the VNIs; a packet of a VNI no port has is one counted drop;
/// with the VNI 42 port detached (the kernel moves the last socket, VNI 44's, to its place)
/// the VNI 43 pair still pings, and with it attached again both do. A second port of a VNI
/// and a geneve port on the same address and port are refused as busy.
#[test]
fn vnis_42_and_43_share_port_4789_with_a_linux_host() {
    let home = Netns::new("v");
    let v = Valed::start_in(&home, &[]);
    let h2 = Netns::new("x");
    let (c42, c43) = (Netns::new("y"), Netns::new("z"));
    // Linux's side quiet too: a packet of VNI 43 before valed's port of VNI 43 is attached is
    // a VNI no port has, counted as wrong-vni by VNI 42's.
    for ns in [&h2, &c42, &c43] {
        quiet(ns);
    }
    underlay(&home, None, LOCAL, &h2, H2, 24);
    linux_segment(&h2, 42, "42", LOCAL, H2, &c42, "10.77.0.2/24");
    linux_segment(&h2, 43, "43", LOCAL, H2, &c43, "10.78.0.2/24");
    let (a42, tap42) = tap_host(&home, &v, "vale0:c", "10.77.0.1/24");
    let (a43, tap43) = tap_host(&home, &v, "vale1:c", "10.78.0.1/24");
    attach_vxlan(&v, "vale0:vx", 42, LOCAL, H2);
    attach_vxlan(&v, "vale1:vx", 43, LOCAL, H2);
    attach_vxlan(&v, "vale2:vx", 44, LOCAL, H2);
    let ping42 = || a42.ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    let ping43 = || a43.ok("ping -c 3 -i 0.2 -W 2 10.78.0.2");
    ping42();
    ping43();
    c42.ok("ping -c 2 -i 0.2 -W 2 10.77.0.1");
    c43.ok("ping -c 2 -i 0.2 -W 2 10.78.0.1");

    // Nothing crossed: each port took its own VNI only, and each Linux bridge learnt the MAC
    // of its own VNI's container only.
    for port in ["vale0:vx", "vale1:vx"] {
        let l = wait_line(&v, port, "pings counted", |l| {
            field(remote_of(l, H2), "rx") >= 5
        });
        assert_eq!(field(&l, "wrong-vni") + field(&l, "bad-header"), 0, "{l}");
    }
    let l = line(&v, "vale2:vx");
    assert_eq!(field(remote_of(&l, H2), "rx"), 0, "{l}");
    assert_eq!(field(&l, "wrong-vni"), 0, "{l}");
    let (mac42, mac43) = (a42.mac(&tap42), a43.mac(&tap43));
    assert!(fdb_has(&h2, "br42", &mac42) && fdb_has(&h2, "br43", &mac43));
    assert!(!fdb_has(&h2, "br42", &mac43) && !fdb_has(&h2, "br43", &mac42));

    // A VNI no port has: one counted drop (on the group's first socket, VNI 42's).
    in_netns(&h2.name, || {
        let s = UdpSocket::bind(format!("{H2}:0")).unwrap();
        let p = vxlan_packet(99, [2, 0, 0, 0, 0, 0x99], BROADCAST, 60);
        s.send_to(&p, format!("{LOCAL}:4789")).unwrap();
    });
    wait_line(&v, "vale0:vx", "a stranger VNI counted", |l| {
        field(l, "wrong-vni") == 1
    });
    for port in ["vale1:vx", "vale2:vx"] {
        assert_eq!(field(&line(&v, port), "wrong-vni"), 0);
    }

    // Refused: a second port of a VNI, a geneve port on the vxlan ports' address and port.
    v.ctl_fails(
        &[
            "attach",
            "vale3:vx",
            "vxlan",
            "vni=43",
            &format!("local={LOCAL}"),
            &format!("remote={H2}"),
        ],
        1,
        "VNI 43 has a port on UDP 192.168.77.1:4789 already",
    );
    v.ctl_fails(
        &[
            "attach",
            "vale3:gn",
            "geneve",
            "vni=45",
            &format!("local={LOCAL}"),
            &format!("remote={H2}"),
            "dstport=4789",
        ],
        1,
        "carries vxlan ports",
    );

    // VNI 42's socket was the group's first: VNI 44's takes its place, VNI 43's stays.
    v.ctl_ok(&["detach", "vale0:vx"]);
    ping43();
    assert!(!a42.run("ping -c 1 -W 1 10.77.0.2", T).status.success());
    attach_vxlan(&v, "vale0:vx", 42, LOCAL, H2);
    ping42();
    ping43();
    let l = wait_line(&v, "vale1:vx", "pings counted", |l| {
        field(remote_of(l, H2), "rx") >= 11
    });
    assert_eq!(field(&l, "bad-header"), 0, "{l}");
}

/// Three hosts on one underlay bridge: valed (192.168.79.1) with a vxlan port toward two
/// Linux hosts (.2 and .3), each with a vxlan device on a bridge and a container behind it
/// (10.77.0.2, 10.77.0.3); the container behind valed's TAP port is 10.77.0.1. A broadcast
/// ping reaches both Linux containers; once the MACs are learnt, 200 pings to host B's
/// container are sent to B alone: C's counter on valed's port and C's vxlan device stay still.
#[test]
fn three_hosts_a_broadcast_reaches_both_and_learnt_unicast_one() {
    let (local, b, c) = ("192.168.79.1", "192.168.79.2", "192.168.79.3");
    let home = Netns::new("v");
    let v = Valed::start_in(&home, &[]);
    home.ok(&format!(
        "ip link add ub type bridge && ip addr add {local}/24 dev ub && ip link set ub up"
    ));
    let (hb, hc) = (Netns::new("b"), Netns::new("c"));
    let (cb, cc) = (Netns::new("y"), Netns::new("z"));
    for (h, ip, ns, addr) in [(&hb, b, &cb, "10.77.0.2/24"), (&hc, c, &cc, "10.77.0.3/24")] {
        underlay(&home, Some("ub"), local, h, ip, 24);
        linux_segment(h, 42, "", local, ip, ns, addr);
        ns.ok("sysctl -qw net.ipv4.icmp_echo_ignore_broadcasts=0");
    }
    let (c1, _) = tap_host(&home, &v, "vale0:c", "10.77.0.1/24");
    attach_vxlan(&v, "vale0:vx", 42, local, &format!("{b},{c}"));

    // A broadcast reaches both.
    let echoes = |ns: &Netns| {
        let snmp = ns.ok("cat /proc/net/snmp");
        let mut lines = snmp.lines().filter(|l| l.starts_with("Icmp:"));
        let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
        let i = names
            .split_whitespace()
            .position(|n| n == "InEchos")
            .unwrap();
        values
            .split_whitespace()
            .nth(i)
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    c1.ok("ping -b -c 2 -i 0.3 -W 2 10.77.0.255");
    assert_eq!(
        (echoes(&cb), echoes(&cc)),
        (2, 2),
        "broadcast pings received"
    );

    // Learnt both ways, then a stream to B's container.
    c1.ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    let l0 = wait_line(&v, "vale0:vx", "warm-up counted", |l| {
        field(remote_of(l, b), "tx") >= 5
    });
    let (b0, c0) = (
        field(remote_of(&l0, b), "tx"),
        field(remote_of(&l0, c), "tx"),
    );
    let vx_c0 = hc.counter("vx", "rx_packets");
    c1.ok("ping -c 200 -i 0.01 -W 2 10.77.0.2");
    let l = wait_line(&v, "vale0:vx", "stream counted", |l| {
        field(remote_of(l, b), "tx") >= b0 + 200
    });
    assert_eq!(field(remote_of(&l, c), "tx"), c0, "sent to C: {l}");
    assert_eq!(hc.counter("vx", "rx_packets"), vx_c0, "C's vxlan device");
    assert!(field(&l, "learnt") >= 1, "{l}");
}

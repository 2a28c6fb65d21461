//! Host ports with the real Linux stack: TAP devices and network interfaces (veth) on a switch,
//! each end in a network namespace the test makes. valed itself runs in a namespace of its
//! own, so every device it creates or binds lives there, away from the host's interfaces.
//!
//! Needs root, iproute2, iperf3 and ethtool (the README's test command installs them).

use std::time::Duration;

use vale_tests::netns::{iperf3_json, unique, Netns, NicNet, TapNet};
use vale_tests::*;

/// `iperf3` from host `a` to host `b` (`extra`: more client options); returns the receiver's
/// bits per second.
fn iperf3(net: &TapNet, a: usize, b: usize, extra: &str) -> f64 {
    iperf3_between(net.ns(a), net.ns(b), &format!("10.77.0.{}", b + 1), extra)
}

/// `iperf3` from namespace `client` to a server it starts in `server` at `addr`.
fn iperf3_between(client: &Netns, server: &Netns, addr: &str, extra: &str) -> f64 {
    let j = iperf3_json(client, server, addr, extra);
    let end = &j["end"];
    end["sum_received"]["bits_per_second"]
        .as_f64()
        .or_else(|| end["sum"]["bits_per_second"].as_f64())
        .expect("bits_per_second")
}

/// A counter of namespace `ns`'s UDP statistics (`/proc/net/snmp`).
fn udp_stat(ns: &Netns, name: &str) -> u64 {
    let snmp = ns.ok("cat /proc/net/snmp");
    let mut rows = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (rows.next().expect("Udp:"), rows.next().expect("Udp:"));
    let i = names
        .split_whitespace()
        .position(|n| n == name)
        .expect("UDP counter");
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// UDP at 200 Mbit/s from host a to host b through the switch (`reverse`: b to a). Datagrams
/// the Linux stacks drop (a busy machine: a full socket buffer, a full TAP queue) are theirs;
/// valed must lose none: each lost datagram is one of the kernel's drops.
fn udp_nothing_lost_by_valed(net: &TapNet, reverse: bool) {
    let (snd, rcv) = if reverse {
        (&net.hosts[1], &net.hosts[0])
    } else {
        (&net.hosts[0], &net.hosts[1])
    };
    // Drops on the way, in the order a datagram meets them.
    let kernel_drops = || {
        udp_stat(&snd.0, "SndbufErrors")
            + snd.0.counter(&snd.1, "tx_dropped")
            + rcv.0.counter(&rcv.1, "rx_dropped")
            + udp_stat(&rcv.0, "InErrors")
    };
    let valed_drops = || {
        let (a, b) = (net.v.counters("vale0:a"), net.v.counters("vale0:b"));
        a.tx_drops + a.rx_drops + b.tx_drops + b.rx_drops
    };
    let (k0, v0) = (kernel_drops(), valed_drops());
    // The client in a sends, or with -R receives from the server in b.
    let extra = if reverse {
        "-u -b 200M -R"
    } else {
        "-u -b 200M"
    };
    let j = iperf3_json(net.ns(0), net.ns(1), "10.77.0.2", extra);
    let sum = &j["end"]["sum"];
    let (lost, packets) = (
        sum["lost_packets"].as_u64().expect("lost_packets"),
        sum["packets"].as_u64().expect("packets"),
    );
    let (k, v) = (kernel_drops() - k0, valed_drops() - v0);
    eprintln!("UDP {extra}: {lost} of {packets} lost, the kernel dropped {k}, valed {v}");
    assert_eq!(v, 0, "UDP {extra}: valed dropped {v} frames");
    assert!(
        lost <= k,
        "UDP {extra}: {lost} of {packets} datagrams lost, the kernel dropped only {k}"
    );
    assert!(packets > 1000, "UDP {extra}: only {packets} datagrams");
}

#[test]
fn tap_ports_carry_arp_ping_v4_v6_and_jumbo_frames() {
    let net = TapNet::new(&["a", "b"]);
    let a = net.ns(0);
    a.ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    a.ok("ping -6 -c 3 -i 0.2 -W 2 fd77::2");
    // The neighbour entries came from ARP through the switch.
    assert!(a.ok("ip neigh show 10.77.0.2").contains("lladdr"));
    // A 9000-byte MTU on both sides: one 9000-byte IP packet, not fragmented.
    for (ns, tap) in &net.hosts {
        ns.ok(&format!("ip link set {tap} mtu 9000"));
    }
    a.ok("ping -c 3 -i 0.2 -W 2 -M do -s 8972 10.77.0.2");
    let b = net.v.counters("vale0:b");
    assert!(b.rx_bytes >= 3 * 9014, "jumbo frames reached b: {b:?}");
    assert_eq!(b.bad_input, 0);
}

#[test]
fn tap_ports_carry_tcp_with_tso_and_udp_both_ways() {
    let _g = serial();
    let net = TapNet::new(&["a", "b"]);
    net.ns(0).ok("ping -c 1 -W 2 10.77.0.2");
    for (ns, tap) in &net.hosts {
        let k = ns.ok(&format!("ethtool -k {tap}"));
        assert!(
            k.contains("tcp-segmentation-offload: on"),
            "TSO is off on {tap}: {k}"
        );
    }
    let before = net.v.counters("vale0:b");
    let fwd = iperf3(&net, 0, 1, "");
    let after = net.v.counters("vale0:b");
    let rev = iperf3(&net, 0, 1, "-R");
    eprintln!(
        "TCP a->b {:.2} Gbit/s, b->a {:.2} Gbit/s",
        fwd / 1e9,
        rev / 1e9
    );
    assert!(fwd > 1e8 && rev > 1e8, "TCP too slow: {fwd} {rev}");
    // TSO segments crossed whole: the frames b received average far above one MTU.
    let frames = after.rx_packets - before.rx_packets;
    let bytes = after.rx_bytes - before.rx_bytes;
    assert!(
        frames > 0 && bytes / frames > 4000,
        "b got {frames} frames, {bytes} bytes: no large segments crossed"
    );
    for (port, c) in [("a", net.v.counters("vale0:a")), ("b", after)] {
        assert_eq!(c.bad_input, 0, "{port}: {c:?}");
    }
    udp_nothing_lost_by_valed(&net, false);
    udp_nothing_lost_by_valed(&net, true);
}

#[test]
fn learning_keeps_unicast_off_a_third_port() {
    let net = TapNet::new(&["a", "b", "c"]);
    let a = net.ns(0);
    a.ok("ping -c 2 -i 0.2 -W 2 10.77.0.2");
    let c0 = net.v.counters("vale0:c");
    a.ok("ping -f -c 1000 -W 2 10.77.0.2");
    let c1 = net.v.counters("vale0:c");
    let b = net.v.counters("vale0:b");
    assert!(b.rx_packets >= 1000, "b got the pings: {b:?}");
    // 2000 unicast frames went a<->b. c may see a few multicast frames of the namespaces'
    // own (IPv6 neighbour discovery), never the unicast.
    assert!(
        c1.rx_packets - c0.rx_packets <= 20,
        "c received {} frames of an a<->b exchange",
        c1.rx_packets - c0.rx_packets
    );
    // c is still reachable: it was never cut off, only spared.
    net.ns(2).ok("ping -c 1 -W 2 10.77.0.1");
}

#[test]
fn a_deleted_tap_shows_down_and_the_switch_keeps_forwarding() {
    let net = TapNet::new(&["a", "b", "c"]);
    net.ns(0).ok("ping -c 1 -W 2 10.77.0.3");
    let (ns_c, tap_c) = &net.hosts[2];
    // Traffic toward c while its device goes away.
    let flood = Kid::spawn(net.ns(0).cmd("ping -q -i 0.002 -w 3 10.77.0.3"), "ping");
    std::thread::sleep(Duration::from_millis(300));
    ns_c.ok(&format!("ip link del {tap_c}"));
    assert!(
        wait_until(T, || net
            .v
            .port("vale0:c")
            .is_some_and(|p| p.state == "down")),
        "vale0:c not shown down: {:?}",
        net.v.port("vale0:c")
    );
    flood.finish(Duration::from_secs(30));
    // The rest of the switch still forwards, and valed said what happened.
    net.ns(0).ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    let log = net.v.log();
    assert!(log.contains("device down"), "valed log: {log}");
    let listed = net.v.ctl_ok(&["list", "vale0:c"]);
    assert!(listed.contains("down"), "{listed}");
    net.v.ctl_ok(&["detach", "vale0:c"]);
    assert!(net.v.port("vale0:c").is_none());
}

#[test]
fn a_downed_tap_is_shown_down_then_up_again() {
    let net = TapNet::new(&["a", "b"]);
    net.ns(0).ok("ping -c 1 -W 2 10.77.0.2");
    let (ns_b, tap_b) = &net.hosts[1];
    ns_b.ok(&format!("ip link set {tap_b} down"));
    // Frames toward b now fail at the device: counted, and b shown down.
    let _ = net.ns(0).run("ping -c 5 -i 0.1 -W 1 10.77.0.2", T);
    assert!(
        wait_until(T, || net
            .v
            .port("vale0:b")
            .is_some_and(|p| p.state == "down")),
        "vale0:b not shown down: {:?}",
        net.v.port("vale0:b")
    );
    assert!(net.v.counters("vale0:b").rx_drops > 0);
    ns_b.ok(&format!("ip link set {tap_b} up"));
    net.ns(0).ok("ping -c 2 -i 0.2 -W 2 10.77.0.2");
    assert!(wait_until(T, || net
        .v
        .port("vale0:b")
        .is_some_and(|p| p.state == "up")));
}

#[test]
fn attach_refusals_and_detach() {
    let home = Netns::new("r");
    let v = Valed::start_in(&home, &[]);
    let tap = unique("vtap");
    v.ctl_ok(&["attach", "vale0:t", "--tap", &tap]);
    assert!(home.ok("ip -o link show").contains(&tap));
    let p = v.port("vale0:t").expect("listed");
    assert_eq!((p.kind.as_str(), p.state.as_str()), ("tap", "up"));
    assert_eq!(p.device.as_deref(), Some(tap.as_str()));
    // The port is taken: a second attach and a client open are refused, clearly.
    v.ctl_fails(
        &["attach", "vale0:t", "--tap", "other0"],
        1,
        "is a tap port of device",
    );
    v.ctl_fails(
        &["attach", "vale0:u", "--tap", "bad/name"],
        1,
        "bad TAP name",
    );
    v.ctl_fails(
        &["attach", "vale0:n", "--iface", "nosuchif0"],
        1,
        "nosuchif0",
    );
    v.ctl_fails(&["attach", "vale0:n", "--tap", "x", "--iface", "y"], 2, "");
    v.ctl_fails(&["attach", "vale0:n", "--persist", "--iface", "y"], 2, "");
    let out = v
        .pktgen(&["-i", "vale0:t", "-f", "rx", "-T", "1"])
        .output()
        .expect("pktgen");
    assert_exit(&out, "pktgen on a tap port", 1, "tap port");
    v.ctl_fails(&["detach", "vale0:zz"], 1, "no such port");
    // Detach gives the device back: a TAP without --persist is gone.
    v.ctl_ok(&["detach", "vale0:t"]);
    assert!(v.port("vale0:t").is_none());
    assert!(wait_until(T, || !home.ok("ip -o link show").contains(&tap)));
    // --persist keeps the device after detach; attaching again adopts it.
    v.ctl_ok(&["attach", "vale0:t", "--tap", &tap, "--persist"]);
    v.ctl_ok(&["detach", "vale0:t"]);
    assert!(home.ok("ip -o link show").contains(&tap));
    // Adopted without --persist, it is an ordinary TAP again: it goes with the port.
    v.ctl_ok(&["attach", "vale0:t", "--tap", &tap]);
    v.ctl_ok(&["destroy", "vale0:t"]);
    assert!(wait_until(T, || !home.ok("ip -o link show").contains(&tap)));
}

/// `vale-ctl attach PORT KIND KEY=VALUE...`: any kind by name with the arguments the control
/// protocol carries; unknown kinds and arguments are refused, naming what valed knows.
#[test]
fn the_generic_attach_names_a_kind_and_its_arguments() {
    let home = Netns::new("g");
    let v = Valed::start_in(&home, &[]);
    let tap = unique("vtapg");
    v.ctl_ok(&[
        "attach",
        "vale0:g",
        "tap",
        &format!("name={tap}"),
        "persist=yes",
    ]);
    let p = v.port("vale0:g").expect("listed");
    assert_eq!(
        (p.kind.as_str(), p.device.as_deref()),
        ("tap", Some(tap.as_str()))
    );
    v.ctl_ok(&["detach", "vale0:g"]);
    assert!(
        home.ok("ip -o link show").contains(&tap),
        "persist=yes kept it"
    );
    v.ctl_fails(
        &["attach", "vale0:h", "bogus", "a=b"],
        1,
        "no port kind 'bogus' (known: tap, nic, vhost-user, memif, vxlan, geneve)",
    );
    v.ctl_fails(
        &["attach", "vale0:h", "tap", "nome=x"],
        1,
        "takes no argument 'nome' (it takes: name, persist)",
    );
    v.ctl_fails(&["attach", "vale0:h", "tap", "name"], 2, "KEY=VALUE");
    v.ctl_fails(&["attach", "vale0:h", "tap", "name=x", "--tap", "y"], 2, "");
    // A kind's saved-only arguments are not for attach.
    v.ctl_fails(
        &["attach", "vale0:h", "tap", "name=x", "netns=web"],
        1,
        "netns",
    );
    home.ok(&format!("ip link del {tap}"));
}

fn nic_port_joins_tap_and_native_ports(mode: &str) {
    let _g = serial();
    let n = NicNet::new(Some(mode), &["t"]);
    let v = &n.net.v;
    let p = v.port("vale0:eth").expect("listed");
    assert_eq!((p.kind.as_str(), p.state.as_str()), ("nic", "up"));
    assert_eq!(p.mode.as_deref(), Some(mode));
    // The namespace behind the veth talks to the one behind the TAP: ARP, ping, and TCP both
    // ways. Toward the NIC, valed cuts the TAP's TSO segments into MTU-sized frames.
    let t = n.net.ns(0);
    n.far.ok("ping -c 3 -i 0.2 -W 2 10.77.0.1");
    let to_tap = iperf3_between(&n.far, t, "10.77.0.1", "");
    let to_nic = iperf3_between(t, &n.far, "10.77.0.10", "");
    eprintln!(
        "{mode}: TCP veth->tap {:.2} Gbit/s, tap->veth {:.2} Gbit/s",
        to_tap / 1e9,
        to_nic / 1e9
    );
    assert!(to_tap > 1e7 && to_nic > 1e7, "TCP too slow");
    assert_eq!(v.counters("vale0:t").bad_input, 0);

    // A native port sends to the far namespace's MAC: the frames reach its interface.
    let dev = n.far.ok("ls /sys/class/net | grep vpeer");
    let dev = dev.trim();
    let before = n.far.counter(dev, "rx_packets");
    let out = v
        .pktgen(&[
            "-i", "vale0:p", "-f", "tx", "-l", "60", "-n", "1000", "-R", "20000",
        ])
        .args(["-D", &n.far_mac(), "-q", "--json"])
        .output()
        .expect("pktgen tx");
    report(&out, "pktgen tx");
    assert!(
        wait_until(T, || n.far.counter(dev, "rx_packets") - before >= 1000),
        "far got {} of 1000 frames",
        n.far.counter(dev, "rx_packets") - before
    );
    // And the far namespace reaches a native port: its ARP broadcasts for an unknown address
    // are flooded there.
    let rx = v.spawn_client(
        v.pktgen(&["-i", "vale0:q", "-f", "rx", "-T", "5", "-q", "--json"]),
        "pktgen rx",
        "vale0:q",
    );
    let _ = n.far.run("ping -c 3 -i 0.3 -W 1 10.77.0.99", T);
    let got = report(&rx.finish(T), "pktgen rx");
    assert!(
        got["packets"].as_u64().unwrap_or(0) >= 3,
        "pktgen rx: {got}"
    );
}

#[test]
fn nic_port_xdp_generic() {
    nic_port_joins_tap_and_native_ports("xdp-generic");
}

#[test]
fn nic_port_xdp_native() {
    nic_port_joins_tap_and_native_ports("xdp");
}

#[test]
fn nic_port_af_packet() {
    nic_port_joins_tap_and_native_ports("packet");
}

#[test]
fn a_nic_going_down_and_away_shows_down_and_the_switch_keeps_forwarding() {
    let n = NicNet::new(None, &["a", "b"]);
    let v = &n.net.v;
    let home = &n.net.home;
    n.far.ok("ping -c 1 -W 2 10.77.0.1");
    let flood = Kid::spawn(n.far.cmd("ping -q -i 0.002 -w 4 10.77.0.1"), "ping");
    std::thread::sleep(Duration::from_millis(300));
    home.ok(&format!("ip link set {} down", n.nic));
    let shown =
        |state: &str| wait_until(T, || v.port("vale0:eth").is_some_and(|p| p.state == state));
    assert!(shown("down"), "not down: {:?}", v.port("vale0:eth"));
    home.ok(&format!("ip link set {} up", n.nic));
    assert!(shown("up"), "not up again: {:?}", v.port("vale0:eth"));
    n.far.ok("ping -c 2 -i 0.2 -W 2 10.77.0.1");
    home.ok(&format!("ip link del {}", n.nic));
    assert!(
        shown("down"),
        "not down after delete: {:?}",
        v.port("vale0:eth")
    );
    flood.finish(Duration::from_secs(30));
    n.net.ns(0).ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");
    assert!(v.log().contains("device down"), "{}", v.log());
    v.ctl_ok(&["detach", "vale0:eth"]);
}

/// What the kernel says of frames written on TAP `dev` in `ns` toward valed: how many it handed
/// to valed (the TAP's tx_packets, counted as valed reads them) and how many it dropped before
/// valed saw them (tx_dropped: the TAP's queue of txqueuelen frames was full).
fn tap_kernel_counts(ns: &Netns, dev: &str) -> (u64, u64) {
    (ns.counter(dev, "tx_packets"), ns.counter(dev, "tx_dropped"))
}

#[test]
fn garbage_from_a_container_is_counted_not_fatal() {
    let net = TapNet::new(&["a", "b", "c"]);
    net.ns(0).ok("ping -c 1 -W 2 10.77.0.2");
    let tap_a = &net.hosts[0].1;
    // Namespace a sends nothing of its own from now on (no IPv6, no ARP), so every frame the
    // kernel counts on its TAP is one of the frames below. Its qdisc refuses to the sender what
    // it cannot queue (fq_codel, a common default, may drop a frame it already accepted), so a
    // frame the program wrote reached the TAP's queue.
    net.ns(0).ok(&format!(
        "sysctl -qw net.ipv6.conf.{tap_a}.disable_ipv6=1 && ip link set {tap_a} arp off && \
         tc qdisc replace dev {tap_a} root pfifo_fast"
    ));
    // A program in namespace a writes whatever it likes on its interface: 3000 frames of random
    // length (1..1600 bytes; the kernel pads or refuses some) and random bytes, MACs included.
    let script = format!(
        "import os, socket, random, sys\n\
         random.seed(int(sys.argv[1]))\n\
         s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
         s.bind(('{tap_a}', 0))\n\
         sent = 0\n\
         for i in range(3000):\n\
         \x20   n = random.choice([1, 6, 13, 14, 15, 42, 60, 61, 1000, 1514, 1600])\n\
         \x20   try:\n\
         \x20       s.send(os.urandom(n)); sent += 1\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         print(sent)\n"
    );
    let garbage = |seed: u32| -> u64 {
        let out = net.ns(0).run(
            &format!("python3 -c \"{}\" {seed}", script.replace('"', "\\\"")),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let (k_read0, k_drop0) = tap_kernel_counts(net.ns(0), tap_a);
    let v0 = net.v.counters("vale0:a");
    // Once with valed running; once with valed stopped, as a busy machine may leave it
    // unscheduled: the TAP's queue fills and the kernel drops the rest (its tx_dropped).
    let mut sent = garbage(7);
    {
        let pid = net.v.pid() as i32;
        // SAFETY: plain syscalls on valed's pid; the guard resumes valed even if the send fails.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        struct Resume(i32);
        impl Drop for Resume {
            fn drop(&mut self) {
                unsafe { libc::kill(self.0, libc::SIGCONT) };
            }
        }
        let _resume = Resume(pid);
        sent += garbage(8);
    }
    assert!(sent > 2000, "only {sent} garbage frames went out");
    // Nothing lost by valed: each frame the kernel handed over is forwarded or counted as bad
    // input, once valed has caught up with what was still in flight.
    let (mut k_read, mut v) = (0, v0);
    let caught_up = wait_until(T, || {
        v = net.v.counters("vale0:a");
        k_read = tap_kernel_counts(net.ns(0), tap_a).0 - k_read0;
        (v.tx_packets - v0.tx_packets) + (v.bad_input - v0.bad_input) == k_read
    });
    let k_drop = tap_kernel_counts(net.ns(0), tap_a).1 - k_drop0;
    assert!(
        caught_up,
        "the kernel handed {k_read} frames to valed; valed counts {v:?} (before: {v0:?})"
    );
    // And every frame written is one the kernel handed to valed or dropped itself.
    assert_eq!(
        k_read + k_drop,
        sent,
        "{sent} frames written: the kernel handed {k_read} to valed and dropped {k_drop}"
    );
    // The stopped round overflowed the TAP's queue: the kernel's drops were really counted.
    assert!(k_drop > 0, "no kernel drops while valed was stopped");
    // valed is alive and the switch still forwards.
    net.ns(1).ok("ping -c 3 -i 0.2 -W 2 10.77.0.3");
    assert!(!net.v.log().contains("panicked"), "{}", net.v.log());
}

/// A container writes TCP segments of up to 64 KiB with a virtio-net header of its choosing
/// (a packet socket with `PACKET_VNET_HDR`): valid ones, and ones whose header contradicts the
/// frame (wrong protocol, IP length or header length, checksum offsets past the end, segment
/// sizes of 1 byte to 64 KiB, unknown GSO types, truncated headers). Whatever the kernel hands
/// to valed crosses a TAP port's 16 KiB buffers to two other TAP ports (which take TSO) and a
/// native port (which does not: valed cuts and sums in software, or refuses): each frame read
/// is forwarded or counted, valed stays up and the switch still forwards.
#[test]
fn hostile_gso_frames_from_a_container_are_forwarded_or_counted() {
    let net = TapNet::new(&["a", "b", "c"]);
    net.ns(0).ok("ping -c 1 -W 2 10.77.0.2");
    let native = net.v.open("vale0:n");
    let tap_a = &net.hosts[0].1;
    net.ns(0).ok(&format!(
        "sysctl -qw net.ipv6.conf.{tap_a}.disable_ipv6=1 && ip link set {tap_a} arp off && \
         tc qdisc replace dev {tap_a} root pfifo_fast"
    ));
    let script = format!(
        "import os, socket, struct, random, sys\n\
         random.seed(int(sys.argv[1]))\n\
         s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
         s.setsockopt(263, 15, 1)\n\
         s.bind(('{tap_a}', 0))\n\
         sent = 0\n\
         for i in range(40):\n\
         \x20   gso, n, proto, ihl = random.choice([536, 1448, 9000]), random.randint(1, 45) * 1448, 6, 5\n\
         \x20   tot, doff, gt, cs, co, flags, hl, cut = 40 + n, 0x50, 1, 34, 16, 1, 54, 0\n\
         \x20   bad = random.randint(0, 13)\n\
         \x20   if bad == 1: gso = random.choice([1, 7, 65535])\n\
         \x20   if bad == 2: proto = 17\n\
         \x20   if bad == 3: ihl = 15\n\
         \x20   if bad == 4: tot = random.choice([0, 40, 65535])\n\
         \x20   if bad == 5: doff = random.choice([0x00, 0x10, 0xf0])\n\
         \x20   if bad == 6: gt = random.choice([3, 4, 5, 0x81, 0x41, 0])\n\
         \x20   if bad == 7: cs = random.choice([0, 60000, 65535])\n\
         \x20   if bad == 8: co = random.choice([0, 6, 65535])\n\
         \x20   if bad == 9: flags = random.choice([0, 2, 0xff])\n\
         \x20   if bad == 10: hl = random.choice([0, 14, 65535])\n\
         \x20   if bad == 11: cut = random.choice([14, 30, 50, 60])\n\
         \x20   ip = struct.pack('!BBHHHBBH4s4s', 0x40 | ihl, 0, tot & 0xffff, i, 0, 64, proto, 0,\n\
         \x20                    bytes([10, 77, 0, 1]), bytes([10, 77, 0, 9]))\n\
         \x20   tcp = struct.pack('!HHIIBBHHH', 5001, 5002, i, 0, doff, 0x18, 512, 0, 0)\n\
         \x20   eth = b'\\xff' * 6 + bytes([2, 0, 0, 0, 0, 0xaa]) + b'\\x08\\x00'\n\
         \x20   frame = eth + ip + tcp + os.urandom(n)\n\
         \x20   if cut: frame = frame[:cut]\n\
         \x20   hdr = struct.pack('<BBHHHH', flags, gt, hl, gso, cs, co)\n\
         \x20   try:\n\
         \x20       s.send(hdr + frame); sent += 1\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         print(sent)\n"
    );
    let (k_read0, _) = tap_kernel_counts(net.ns(0), tap_a);
    let v0 = net.v.counters("vale0:a");
    let (mut sent, mut at_native) = (0u64, 0usize);
    for seed in 0..25 {
        let out = net.ns(0).run(
            &format!("python3 -c \"{}\" {seed}", script.replace('"', "\\\"")),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        sent += String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap_or(0);
        // The native port's ring holds 1024 slots: empty it between rounds.
        at_native += wait_frames(&native, Duration::from_millis(200)).len();
    }
    assert!(sent > 100, "the kernel took only {sent} of the frames");
    // Each frame the kernel handed over is forwarded (tx_packets) or refused (bad_input,
    // tx_drops); a forwarded frame that the resolver refuses toward the native port is also
    // counted as bad input, so the sum may exceed what was read, never fall short of it.
    let (mut k_read, mut v) = (0, v0);
    let caught_up = wait_until(T, || {
        at_native += recv_frames(&native).len();
        v = net.v.counters("vale0:a");
        k_read = tap_kernel_counts(net.ns(0), tap_a).0 - k_read0;
        let counted = (v.tx_packets - v0.tx_packets)
            + (v.bad_input - v0.bad_input)
            + (v.tx_drops - v0.tx_drops);
        v.tx_packets - v0.tx_packets <= k_read && counted >= k_read
    });
    assert!(
        caught_up,
        "the kernel handed {k_read} frames to valed ({sent} written); valed counts {v:?} \
         (before: {v0:?})"
    );
    eprintln!(
        "{sent} written, {k_read} read by valed: {} forwarded, {} bad input; {at_native} \
         frames at the native port",
        v.tx_packets - v0.tx_packets,
        v.bad_input - v0.bad_input
    );
    assert!(at_native > 0, "no frame reached the native port");
    net.ns(1).ok("ping -c 3 -i 0.2 -W 2 10.77.0.3");
    assert!(!net.v.log().contains("panicked"), "{}", net.v.log());
}

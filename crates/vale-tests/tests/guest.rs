//! Linux guests under QEMU on a switch.
//!
//! - On valed's own vhost-user ports (both socket roles): valed reads and writes guest memory,
//!   with no TAP and no QEMU in the data path; offloads, a guest without them, a QEMU replaced,
//!   valed restarted, and a guest beside a container behind a TAP port.
//! - On QEMU's own TAP devices bound as NIC ports (the way before vhost-user): guest -> QEMU ->
//!   TAP -> NIC port -> switch -> NIC port -> TAP -> QEMU -> guest. (A TAP port of valed's own
//!   cannot serve there: valed and QEMU would both hold the device end of one TAP.)
//!
//! Needs root, iproute2, QEMU, a kernel and busybox (the README's test command installs them);
//! skipped, saying why, where they are missing outside CI.

use std::time::{Duration, Instant};

use vale_tests::guest::{skip_reason, Guest, GuestConfig};
use vale_tests::netns::{unique, Netns};
use vale_tests::*;

const IPS: [&str; 2] = ["10.78.0.1", "10.78.0.2"];
const MACS: [&str; 2] = ["02:00:00:00:78:01", "02:00:00:00:78:02"];

/// (frames into the switch from the port, frames out of it to the port), of vale0:g1 and
/// vale0:g2, and (rx, tx) of each TAP as the host kernel counts them.
fn counts(v: &Valed, home: &Netns, taps: &[String]) -> [(u64, u64); 4] {
    let c1 = v.counters("vale0:g1");
    let c2 = v.counters("vale0:g2");
    let tap = |t: &str| (home.counter(t, "rx_packets"), home.counter(t, "tx_packets"));
    [
        (c1.tx_packets, c1.rx_packets),
        (c2.tx_packets, c2.rx_packets),
        tap(&taps[0]),
        tap(&taps[1]),
    ]
}

#[test]
fn two_guests_ping_and_talk_tcp_through_the_switch() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let t0 = Instant::now();
    let home = Netns::new("g");
    // No IPv6 on the host ends (the guests boot without it): only the test's frames cross.
    home.ok("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1");
    let v = Valed::start_in(&home, &[]);
    let taps = [unique("vgt"), unique("vgt")];
    let mut guests: Vec<Guest> = (0..2)
        .map(|i| {
            let mut c = GuestConfig::tap(
                &format!("g{}", i + 1),
                &taps[i],
                &format!("{}/24", IPS[i]),
                MACS[i],
            );
            c.netns = Some(home.name.clone());
            Guest::start(&c)
        })
        .collect();
    // QEMU creates its TAP at once; the guests take seconds to boot, time enough to bring the
    // host ends up and bind them.
    for (i, t) in taps.iter().enumerate() {
        assert!(
            wait_until_every(T, Duration::from_millis(50), || home
                .run(&format!("test -e /sys/class/net/{t}"), T)
                .status
                .success()),
            "QEMU did not create {t}"
        );
        home.ok(&format!("ip link set {t} up"));
        v.ctl_ok(&[
            "attach",
            &format!("vale0:g{}", i + 1),
            "--iface",
            t,
            "--mode",
            "packet",
        ]);
    }
    let boots: Vec<Duration> = guests.iter_mut().map(|g| g.wait_ready()).collect();
    eprintln!("guests ready after {boots:.1?}");

    let limit = Duration::from_secs(20);
    // The harness hands back what a command printed and its exit status.
    let a = guests[0].run("echo $((6 * 7)); exit 3", limit);
    assert_eq!((a.status, a.output.as_str()), (3, "42\n"));

    // Ping both ways; the first round also resolves the addresses.
    let before = counts(&v, &home, &taps);
    for (a, b) in [(0, 1), (1, 0)] {
        let out = guests[a].ok(&format!("ping -c 5 -i 0.2 -W 5 {}", IPS[b]), limit);
        assert!(
            out.contains("5 packets received"),
            "{} -> {}: {out}",
            guests[a].name,
            guests[b].name
        );
    }
    // Every frame one guest sent reached the other, and each side counts it alike: the TAP's
    // rx (from the guest) is the port's tx (into the switch), which is the other port's rx,
    // which is the other TAP's tx (to its guest).
    let mut last = [(0, 0); 4];
    let adds_up = wait_until(T, || {
        let now = counts(&v, &home, &taps);
        let d: Vec<(u64, u64)> = (0..4)
            .map(|i| (now[i].0 - before[i].0, now[i].1 - before[i].1))
            .collect();
        last = now;
        d[0].0 >= 10
            && d[1].0 >= 10
            && d[0].0 == d[1].1
            && d[1].0 == d[0].1
            && d[2].0 == d[0].0
            && d[3].0 == d[1].0
            && d[2].1 == d[0].1
            && d[3].1 == d[1].1
    });
    assert!(
        adds_up,
        "counters do not add up: before {before:?}, after {last:?} \
         ((g1 in, out), (g2 in, out), (tap1 rx, tx), (tap2 rx, tx))"
    );
    for p in ["vale0:g1", "vale0:g2"] {
        let c = v.counters(p);
        assert_eq!((c.rx_drops, c.tx_drops, c.bad_input), (0, 0, 0), "{p}");
    }

    // A short TCP run, where the guests have iperf3: 16 MiB through the switch, in frames of
    // one MTU (the guests have no offloads).
    if guests[1].run("command -v iperf3", limit).status == 0 {
        guests[1].ok("iperf3 -s -1 -D", limit);
        let before = v.counters("vale0:g2");
        let out = guests[0].ok(&iperf3_16m(IPS[1]), limit);
        eprintln!("iperf3 g1 -> g2:\n{out}");
        assert!(out.contains("receiver"), "iperf3: {out}");
        let after = v.counters("vale0:g2");
        let (frames, bytes) = (
            after.rx_packets - before.rx_packets,
            after.rx_bytes - before.rx_bytes,
        );
        eprintln!("vale0:g2 took {frames} frames, {bytes} bytes");
        // iperf3 ends on its control connection, maybe before the last data has landed.
        assert!(
            bytes >= 12 << 20,
            "only {bytes} bytes reached g2 through the switch"
        );
        assert!(bytes / frames <= 1514, "{bytes} bytes in {frames} frames");
        let c = v.counters("vale0:g1");
        assert_eq!((c.rx_drops, c.tx_drops, c.bad_input), (0, 0, 0), "vale0:g1");
    }
    eprintln!("test took {:.1?}", t0.elapsed());
}

/// (frames into the switch from the port, frames out of it to the port) of vale0:g1 and
/// vale0:g2.
fn port_counts(v: &Valed) -> [(u64, u64); 2] {
    let (c1, c2) = (v.counters("vale0:g1"), v.counters("vale0:g2"));
    [
        (c1.tx_packets, c1.rx_packets),
        (c2.tx_packets, c2.rx_packets),
    ]
}

/// Five pings each way between the two guests of ports vale0:g1 and vale0:g2; what one guest
/// sent into the switch is what the other took.
fn ping_both_ways(v: &Valed, guests: &mut [Guest]) {
    let limit = Duration::from_secs(20);
    let before = port_counts(v);
    for (a, b) in [(0, 1), (1, 0)] {
        let out = guests[a].run(&format!("ping -c 5 -i 0.2 -W 5 {}", IPS[b]), limit);
        assert!(
            out.output.contains("5 packets received"),
            "{} -> {}: {}\ncounters: {:?}\nvaled's log:\n{}",
            guests[a].name,
            guests[b].name,
            out.output,
            port_counts(v),
            v.log()
        );
    }
    let mut last = before;
    let adds_up = wait_until(T, || {
        let now = port_counts(v);
        let d: Vec<(u64, u64)> = (0..2)
            .map(|i| (now[i].0 - before[i].0, now[i].1 - before[i].1))
            .collect();
        last = now;
        d[0].0 >= 10 && d[1].0 >= 10 && d[0].0 == d[1].1 && d[1].0 == d[0].1
    });
    assert!(
        adds_up,
        "counters do not add up: before {before:?}, after {last:?} \
         ((g1 in, out), (g2 in, out))"
    );
    for p in ["vale0:g1", "vale0:g2"] {
        let c = v.counters(p);
        assert_eq!((c.tx_drops, c.bad_input), (0, 0), "{p}");
    }
}

/// A shell command that sends 16 MiB of TCP to the iperf3 server at `addr`, trying again
/// while the server is not up yet (at most 20 times).
fn iperf3_16m(addr: &str) -> String {
    format!(
        "i=0; until iperf3 -c {addr} -n 16M -f m; do i=$((i+1)); [ $i -ge 20 ] && exit 1; sleep 0.1; done"
    )
}

/// What one TCP run between two guests' ports moved: frames and bytes the sender's port took
/// from it, and those the receiver's port gave it.
#[derive(Debug)]
struct TcpRun {
    tx_frames: u64,
    tx_bytes: u64,
    rx_frames: u64,
    rx_bytes: u64,
}

/// 16 MiB of TCP (iperf3) from guest `a` to guest `b` (ports vale0:g1, vale0:g2 by index),
/// where the guests have iperf3.
fn tcp_between(v: &Valed, guests: &mut [Guest], a: usize, b: usize) -> Option<TcpRun> {
    let limit = Duration::from_secs(20);
    if guests[b].run("command -v iperf3", limit).status != 0 {
        eprintln!("no iperf3 in the guests: TCP not tried");
        return None;
    }
    guests[b].ok("iperf3 -s -1 -D", limit);
    let port = |i: usize| format!("vale0:g{}", i + 1);
    let (tx0, rx0) = (v.counters(&port(a)), v.counters(&port(b)));
    let out = guests[a].ok(&iperf3_16m(IPS[b]), Duration::from_secs(120));
    eprintln!("iperf3 {} -> {}:\n{out}", guests[a].name, guests[b].name);
    assert!(out.contains("receiver"), "iperf3: {out}");
    let (tx1, rx1) = (v.counters(&port(a)), v.counters(&port(b)));
    let t = TcpRun {
        tx_frames: tx1.tx_packets - tx0.tx_packets,
        tx_bytes: tx1.tx_bytes - tx0.tx_bytes,
        rx_frames: rx1.rx_packets - rx0.rx_packets,
        rx_bytes: rx1.rx_bytes - rx0.rx_bytes,
    };
    eprintln!("{t:?}");
    // iperf3 ends on its control connection, maybe before the last data has landed.
    assert!(
        t.rx_bytes >= 12 << 20,
        "only {} bytes reached {} through the switch",
        t.rx_bytes,
        guests[b].name
    );
    Some(t)
}

/// Two guests whose virtio-net devices are valed's own vhost-user ports, one where valed
/// listens and one where valed connects: every frame between them is read from one guest's
/// memory and written into the other's by valed, with no TAP and no QEMU in the data path.
/// Then the first guest goes away (its port stays, down), a new one on the same socket is
/// served, and the ports are detached (valed's socket goes).
#[test]
fn two_guests_ping_through_vhost_user_ports() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let t0 = Instant::now();
    let v = Valed::start();
    let socks: Vec<std::path::PathBuf> = (1..=2)
        .map(|i| v.run_dir().join(format!("vm{i}.sock")))
        .collect();
    let cfg = |i: usize| {
        let mut c = GuestConfig::vhost_user(
            &format!("g{}", i + 1),
            &socks[i],
            i == 1,
            &format!("{}/24", IPS[i]),
            MACS[i],
        );
        if i == 1 {
            // Two queue pairs (one per guest CPU) and an MTU set by the host.
            c.netdev += ",queues=2";
            c.device = ",mq=on,host_mtu=9000".to_string();
            c.smp = 2;
        }
        c
    };
    // g1: valed listens. g2: QEMU listens, valed connects (once QEMU is there).
    v.ctl_ok(&[
        "attach",
        "vale0:g1",
        "--vhost-user",
        socks[0].to_str().unwrap(),
    ]);
    assert!(
        socks[0].exists(),
        "valed does not listen at {}",
        socks[0].display()
    );
    let p = v.port("vale0:g1").unwrap();
    assert_eq!(
        (p.kind.as_str(), p.mode.as_deref(), p.state.as_str()),
        ("vhost-user", Some("server"), "down"),
        "no front end yet"
    );
    let mut guests: Vec<Guest> = (0..2).map(|i| Guest::start(&cfg(i))).collect();
    v.ctl_ok(&[
        "attach",
        "vale0:g2",
        "--vhost-user",
        socks[1].to_str().unwrap(),
        "--client",
        "--queues",
        "2",
    ]);
    assert_eq!(v.port("vale0:g2").unwrap().mode.as_deref(), Some("client"));
    let boots: Vec<Duration> = guests.iter_mut().map(|g| g.wait_ready()).collect();
    eprintln!("guests ready after {boots:.1?}");
    for p in ["vale0:g1", "vale0:g2"] {
        assert_eq!(
            v.port(p).unwrap().state,
            "up",
            "{p} after its guest came; valed's log:\n{}",
            v.log()
        );
    }

    ping_both_ways(&v, &mut guests);
    for p in ["vale0:g1", "vale0:g2"] {
        assert_eq!(v.counters(p).rx_drops, 0, "{p}");
        let n = v.port(p).unwrap().negotiated.unwrap_or_default();
        assert!(
            n.contains("guest_tso4") && n.contains("mrg_rxbuf") && n.contains("event_idx"),
            "{p}: {n}"
        );
        assert!(
            n.ends_with("offloads to the guest csum,tso4,tso6,ecn"),
            "{p}: {n}"
        );
    }
    // g2 took both queue pairs and the MTU QEMU set through valed.
    let n = v.port("vale0:g2").unwrap().negotiated.unwrap_or_default();
    assert!(
        n.contains(",mq,mtu;") && n.contains("queue pairs 2 in use of 2; mtu 9000"),
        "{n}"
    );
    let n = v.port("vale0:g1").unwrap().negotiated.unwrap_or_default();
    assert!(n.contains("queue pairs 1 in use of 4;"), "{n}");
    let g2 = &mut guests[1];
    assert_eq!(g2.ok("cat /sys/class/net/eth0/mtu", T).trim(), "9000");
    assert_eq!(
        g2.ok("ls /sys/class/net/eth0/queues", T)
            .split_whitespace()
            .count(),
        4,
        "rx-0, rx-1, tx-0, tx-1"
    );

    // TCP with the guests' offloads on: TSO segments larger than the MTU cross the switch
    // whole, from one guest's memory into the other's.
    if let Some(t) = tcp_between(&v, &mut guests, 0, 1) {
        assert!(
            t.rx_bytes / t.rx_frames > 1514,
            "{t:?}: no TSO segment crossed whole"
        );
        for p in ["vale0:g1", "vale0:g2"] {
            let c = v.counters(p);
            assert_eq!((c.rx_drops, c.tx_drops, c.bad_input), (0, 0, 0), "{p}");
        }
    }

    // The first guest goes away: its port stays, down; the other one is untouched. A new
    // guest on the same socket is served.
    drop(guests.remove(0));
    assert!(
        wait_until(T, || v.port("vale0:g1").is_some_and(|p| p.state == "down")),
        "vale0:g1 is not down after its guest went away"
    );
    assert_eq!(v.port("vale0:g2").unwrap().state, "up");
    // This one takes no offloads: the switch cuts the other guest's TSO segments and
    // finishes their checksums in software on the way.
    let mut again = Guest::start(&GuestConfig {
        offloads: false,
        ..cfg(0)
    });
    again.wait_ready();
    guests.insert(0, again);
    assert_eq!(v.port("vale0:g1").unwrap().state, "up");
    let n = v.port("vale0:g1").unwrap().negotiated.unwrap_or_default();
    assert!(n.ends_with("offloads to the guest none"), "{n}");
    ping_both_ways(&v, &mut guests);
    if let Some(t) = tcp_between(&v, &mut guests, 1, 0) {
        assert!(
            t.tx_bytes / t.tx_frames > 1514 && t.rx_bytes / t.rx_frames <= 1514,
            "{t:?}: g2 should send TSO segments and g1 take frames of one MTU"
        );
        for p in ["vale0:g1", "vale0:g2"] {
            let c = v.counters(p);
            assert_eq!((c.tx_drops, c.bad_input), (0, 0), "{p}");
        }
    }

    for (i, s) in socks.iter().enumerate() {
        v.ctl_ok(&["detach", &format!("vale0:g{}", i + 1)]);
        if i == 0 {
            assert!(!s.exists(), "{} is left after detach", s.display());
        }
    }
    assert!(v.list().is_empty());
    drop(guests);
    eprintln!("test took {:.1?}", t0.elapsed());
}

/// valed killed (no clean-up of its own) and started again on the same run directory: the
/// ports are attached again, QEMU reconnects to the socket valed listens at, valed connects to
/// the QEMU that listens, and the guests pass traffic again without a reboot.
#[test]
fn guests_pass_traffic_again_after_valed_restarts() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let t0 = Instant::now();
    let mut v = Valed::start();
    let socks: Vec<std::path::PathBuf> = (1..=2)
        .map(|i| v.run_dir().join(format!("vm{i}.sock")))
        .collect();
    let attach = |v: &Valed| {
        v.ctl_ok(&[
            "attach",
            "vale0:g1",
            "--vhost-user",
            socks[0].to_str().unwrap(),
        ]);
        v.ctl_ok(&[
            "attach",
            "vale0:g2",
            "--vhost-user",
            socks[1].to_str().unwrap(),
            "--client",
        ]);
    };
    let both_up = |v: &Valed| {
        wait_until(Duration::from_secs(30), || {
            ["vale0:g1", "vale0:g2"]
                .iter()
                .all(|p| v.port(p).is_some_and(|p| p.state == "up"))
        })
    };
    let mut guests: Vec<Guest> = (0..2)
        .map(|i| {
            Guest::start(&GuestConfig::vhost_user(
                &format!("g{}", i + 1),
                &socks[i],
                i == 1,
                &format!("{}/24", IPS[i]),
                MACS[i],
            ))
        })
        .collect();
    attach(&v);
    for g in guests.iter_mut() {
        g.wait_ready();
    }
    assert!(both_up(&v), "ports not up: {:?}\n{}", v.list(), v.log());
    ping_both_ways(&v, &mut guests);

    v.restart_after_kill();
    assert!(v.list().is_empty(), "a new valed has no ports yet");
    attach(&v);
    assert!(
        both_up(&v),
        "the guests did not come back: {:?}\nvaled's log:\n{}",
        v.list(),
        v.log()
    );
    ping_both_ways(&v, &mut guests);
    drop(guests);
    eprintln!("test took {:.1?}", t0.elapsed());
}

/// A guest on a vhost-user port and a container (a network namespace) behind a TAP port of
/// the same switch: TCP both ways, offloads on at both ends. TSO segments cross between the
/// two kinds whole (the TAP takes the guest's, the guest takes the TAP's), nothing is bad.
#[test]
fn a_guest_and_a_container_talk_tcp_both_ways() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if which("iperf3").is_none() {
        eprintln!("skipped: no iperf3");
        return;
    }
    let t0 = Instant::now();
    let home = Netns::new("h");
    let v = Valed::start_in(&home, &[]);
    let tap = unique("vtap");
    v.ctl_ok(&["attach", "vale0:c", "--tap", &tap]);
    // The guest's port before the container's device goes up: what the container's stack
    // multicasts at once (IPv6 MLD, router solicitations) has somewhere to go, and is not a
    // drop of a port alone on its switch.
    let sock = v.run_dir().join("vm.sock");
    v.ctl_ok(&["attach", "vale0:g1", "--vhost-user", sock.to_str().unwrap()]);
    let ns = Netns::new("c");
    ns.adopt(Some(&home), &tap, &[&format!("{}/24", IPS[1])]);
    let mut g = Guest::boot(&GuestConfig::vhost_user(
        "g1",
        &sock,
        false,
        &format!("{}/24", IPS[0]),
        MACS[0],
    ));
    let limit = Duration::from_secs(20);
    let out = g.run(&format!("ping -c 3 -i 0.2 -W 5 {}", IPS[1]), limit);
    assert!(
        out.output.contains("3 packets received"),
        "guest -> container: {}\nvaled's log:\n{}",
        out.output,
        v.log()
    );

    // Guest -> container.
    ns.ok("iperf3 -s -1 -D");
    let c0 = v.counters("vale0:c");
    let out = g.ok(&iperf3_16m(IPS[1]), Duration::from_secs(120));
    assert!(out.contains("receiver"), "iperf3 guest -> container: {out}");
    let c1 = v.counters("vale0:c");
    let (frames, bytes) = (c1.rx_packets - c0.rx_packets, c1.rx_bytes - c0.rx_bytes);
    eprintln!("guest -> container: vale0:c took {frames} frames, {bytes} bytes");
    assert!(
        bytes >= 12 << 20,
        "only {bytes} bytes reached the container"
    );
    assert!(
        bytes / frames > 1514,
        "{bytes} bytes in {frames} frames: no TSO crossed"
    );

    // Container -> guest.
    g.ok("iperf3 -s -1 -D", limit);
    let g1 = v.counters("vale0:g1");
    let out = ns.run(&iperf3_16m(IPS[0]), Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("receiver"),
        "iperf3 container -> guest: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g2 = v.counters("vale0:g1");
    let (frames, bytes) = (g2.rx_packets - g1.rx_packets, g2.rx_bytes - g1.rx_bytes);
    eprintln!("container -> guest: vale0:g1 took {frames} frames, {bytes} bytes");
    assert!(bytes >= 12 << 20, "only {bytes} bytes reached the guest");
    assert!(
        bytes / frames > 1514,
        "{bytes} bytes in {frames} frames: no TSO crossed"
    );
    for p in ["vale0:c", "vale0:g1"] {
        let c = v.counters(p);
        assert_eq!((c.tx_drops, c.bad_input), (0, 0), "{p}: {c:?}");
    }
    drop(g);
    eprintln!("test took {:.1?}", t0.elapsed());
}

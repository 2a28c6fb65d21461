//! vale-nic against the real kernel: a veth pair in a private network namespace per test.
//! Needs root and iproute2 (`ip`).

mod common;

use common::*;
use std::io;
use std::time::{Duration, Instant};
use vale_nic::{is_port_down, Mode, Nic};

const FRAMES: u32 = 1000;
const BATCH: u32 = 10;
const WAIT: Duration = Duration::from_secs(3);

/// Queues `f` as two pieces (header and rest), flushing while the ring is full.
fn send_frame(nic: &mut Nic, f: &[u8]) {
    let deadline = Instant::now() + WAIT;
    loop {
        match nic.send(&[&f[..20], &f[20..]]) {
            Ok(true) => return,
            Ok(false) => {
                assert!(Instant::now() < deadline, "tx ring stayed full");
                nic.flush().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// Receives test frames from `nic` until `want` have arrived or WAIT passes.
fn recv_frames(nic: &mut Nic, want: usize, out: &mut Vec<Vec<u8>>) {
    let deadline = Instant::now() + WAIT;
    let start = out.len();
    while out.len() - start < want && Instant::now() < deadline {
        let n = nic
            .recv(64, |f| {
                if is_test_frame(f) || (f.len() >= 18 && f[12..14] == [0x81, 0x00]) {
                    out.push(f.to_vec())
                }
            })
            .unwrap();
        if n == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// 1000 frames of varied length each way between a Nic on `a` and a raw socket on `b`,
/// in small batches, all checked byte for byte and in order.
fn both_ways(mode: Mode, peer_gro: bool) {
    let ns = Netns::new();
    let (a, b) = (ns.a.clone(), ns.b.clone());
    ns.run(move || {
        if peer_gro {
            set_gro(&b, true).unwrap();
        }
        let mut nic = Nic::open(&a, Some(mode)).unwrap();
        assert_eq!(nic.mode(), mode);
        let peer = Raw::open(&b);

        for start in (0..FRAMES).step_by(BATCH as usize) {
            for i in start..start + BATCH {
                send_frame(&mut nic, &frame(i, len_of(i)));
            }
            nic.flush().unwrap();
            for i in start..start + BATCH {
                let got = peer
                    .recv_test_frame(WAIT)
                    .unwrap_or_else(|| panic!("{mode}: frame {i} never reached the peer"));
                assert_eq!(got, frame(i, len_of(i)), "{mode}: frame {i} differs");
            }
        }
        // Everything sent has completed; a final flush reaps it.
        nic.flush().unwrap();

        let mut got = Vec::new();
        for start in (0..FRAMES).step_by(BATCH as usize) {
            for i in start..start + BATCH {
                peer.send(&frame(i, len_of(i)));
            }
            recv_frames(&mut nic, BATCH as usize, &mut got);
            assert_eq!(got.len(), (start + BATCH) as usize, "{mode}: frames lost");
        }
        for (i, f) in got.iter().enumerate() {
            assert_eq!(
                f,
                &frame(i as u32, len_of(i as u32)),
                "{mode}: frame {i} differs"
            );
        }
        let st = nic.stats();
        assert_eq!(st.tx_frames, FRAMES as u64);
        assert!(st.rx_frames >= FRAMES as u64);
        assert_eq!(st.rx_bad, 0);
    });
}

#[test]
fn xdp_generic_both_ways() {
    both_ways(Mode::XdpGeneric, false);
}

#[test]
fn xdp_native_both_ways() {
    both_ways(Mode::Xdp, false);
}

/// The configuration usually advised for native XDP on veth.
#[test]
fn xdp_native_both_ways_peer_gro() {
    both_ways(Mode::Xdp, true);
}

/// One AF_XDP socket per rx queue: frames arriving on every queue are received.
#[test]
fn xdp_multiqueue() {
    for mode in [Mode::Xdp, Mode::XdpGeneric] {
        let ns = Netns::with_queues(2);
        let (a, b) = (ns.a.clone(), ns.b.clone());
        ns.run(move || {
            let mut nic = Nic::open(&a, Some(mode)).unwrap();
            assert_eq!(nic.queues(), 2, "{mode}");
            assert_eq!(nic.poll_fds().len(), 2);
            let peer = Raw::open_with(&b, true);
            let per_cpu = 50;
            let ncpu = cpus().min(2);
            for cpu in 0..ncpu {
                pin_to_cpu(cpu);
                for i in 0..per_cpu {
                    let seq = (cpu * per_cpu + i) as u32;
                    peer.send(&frame(seq, len_of(seq)));
                }
            }
            let want = ncpu * per_cpu;
            let mut got = Vec::new();
            recv_frames(&mut nic, want, &mut got);
            assert_eq!(got.len(), want, "{mode}");
            got.sort_by_key(|f| seq_of(f));
            for (i, f) in got.iter().enumerate() {
                assert_eq!(f, &frame(i as u32, len_of(i as u32)));
            }
        });
    }
}

/// Down is reported as NetworkDown and is not final: frames flow again once it is up.
#[test]
fn interface_down_then_up() {
    for mode in [Mode::XdpGeneric, Mode::Xdp, Mode::Packet] {
        let ns = Netns::new();
        let (a, b, name) = (ns.a.clone(), ns.b.clone(), ns.name.clone());
        ns.run(move || {
            let mut nic = Nic::open(&a, Some(mode)).unwrap();
            let peer = Raw::open(&b);
            ip(&["-n", &name, "link", "set", &a, "down"]);
            assert!(!nic.is_up());
            let e = nic
                .send(&[&frame(1, 60)])
                .and_then(|_| nic.flush())
                .and_then(|_| nic.check())
                .unwrap_err();
            assert!(is_port_down(&e), "{mode}: {e:?}");
            assert!(e.to_string().contains("is down"), "{mode}: {e}");
            ip(&["-n", &name, "link", "set", &a, "up"]);
            // Carrier comes back asynchronously.
            let deadline = Instant::now() + WAIT;
            while !nic.is_up() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(nic.is_up(), "{mode}");
            nic.check().unwrap();
            // Whatever was left queued while down may or may not go out; new frames do.
            send_frame(&mut nic, &frame(2, 200));
            nic.flush().unwrap();
            loop {
                let f = peer.recv_test_frame(WAIT).expect("no frame after up");
                if seq_of(&f) == 2 {
                    assert_eq!(f, frame(2, 200));
                    break;
                }
            }
            peer.send(&frame(3, 300));
            let mut got = Vec::new();
            recv_frames(&mut nic, 1, &mut got);
            assert_eq!(got, vec![frame(3, 300)], "{mode}");
        });
    }
}

#[test]
fn packet_both_ways() {
    both_ways(Mode::Packet, false);
}

fn one_way(tx: &mut Nic, rx: &mut Nic) {
    let mut got = Vec::new();
    for start in (0..FRAMES).step_by(BATCH as usize) {
        for i in start..start + BATCH {
            send_frame(tx, &frame(i, len_of(i)));
        }
        tx.flush().unwrap();
        recv_frames(rx, BATCH as usize, &mut got);
        let (t, r) = (tx.mode(), rx.mode());
        assert_eq!(
            got.len(),
            (start + BATCH) as usize,
            "{t} -> {r}: frames lost"
        );
    }
    for (i, f) in got.iter().enumerate() {
        assert_eq!(f, &frame(i as u32, len_of(i as u32)));
    }
}

/// Two Nics, one per veth end, in different modes, talking to each other.
#[test]
fn nic_to_nic() {
    for (ma, mb) in [
        (Mode::XdpGeneric, Mode::Packet),
        (Mode::Xdp, Mode::XdpGeneric),
    ] {
        let ns = Netns::new();
        let (a, b) = (ns.a.clone(), ns.b.clone());
        ns.run(move || {
            let mut na = Nic::open(&a, Some(ma)).unwrap();
            let mut nb = Nic::open(&b, Some(mb)).unwrap();
            one_way(&mut na, &mut nb);
            one_way(&mut nb, &mut na);
        });
    }
}

/// 512 frames queued and handed over with a single flush (the kernel takes AF_XDP copy-mode
/// frames in small batches per sendto, so flush has to keep going).
#[test]
fn burst_one_flush() {
    for mode in [Mode::XdpGeneric, Mode::Xdp, Mode::Packet] {
        let ns = Netns::new();
        let (a, b) = (ns.a.clone(), ns.b.clone());
        ns.run(move || {
            let mut tx = Nic::open(&a, Some(mode)).unwrap();
            let mut rx = Nic::open(&b, Some(Mode::Packet)).unwrap();
            let n = 512u32;
            for i in 0..n {
                assert!(
                    tx.send(&[&frame(i, len_of(i))]).unwrap(),
                    "{mode}: ring full at {i}"
                );
            }
            tx.flush().unwrap();
            let mut got = Vec::new();
            recv_frames(&mut rx, n as usize, &mut got);
            assert_eq!(got.len(), n as usize, "{mode}");
            for (i, f) in got.iter().enumerate() {
                assert_eq!(f, &frame(i as u32, len_of(i as u32)));
            }
        });
    }
}

#[test]
fn open_missing_interface() {
    let ns = Netns::new();
    ns.run(|| {
        for mode in [
            None,
            Some(Mode::Xdp),
            Some(Mode::XdpGeneric),
            Some(Mode::Packet),
        ] {
            let e = Nic::open("nosuchif", mode).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            assert_eq!(e.to_string(), "interface 'nosuchif' does not exist");
        }
    });
}

/// Without capabilities every mode is refused with PermissionDenied, and the message says
/// what failed.
#[test]
fn open_without_privileges() {
    let ns = Netns::new();
    let a = ns.a.clone();
    ns.run(move || {
        drop_all_capabilities();
        let (r, logs) = capture_logs(|| Nic::open(&a, None));
        let e = r.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("interface '{a}'")), "{msg}");
        assert!(msg.contains("needs CAP_NET_ADMIN"), "{msg}");
        // One warning per mode refused (a "no carrier" warning may come first, as the veth
        // pair's carrier settles).
        let warned = logs
            .iter()
            .filter(|l| l.starts_with("WARN") && l.contains("mode unavailable"))
            .count();
        assert_eq!(warned, 3, "{logs:?}");
    });
}

#[test]
fn auto_mode_says_which() {
    let ns = Netns::new();
    let a = ns.a.clone();
    ns.run(move || {
        let (nic, logs) = capture_logs(|| Nic::open(&a, None));
        let nic = nic.unwrap();
        let said = format!("bound in {} mode", nic.mode());
        assert!(
            logs.iter()
                .any(|l| l.starts_with("INFO") && l.contains(&said)),
            "no '{said}' in {logs:?}"
        );
        // veth supports native XDP.
        assert_eq!(nic.mode(), Mode::Xdp);
        assert!(nic.is_up());
        assert!(nic.queues() >= 1);
    });
}

#[test]
fn oversized_frame_refused() {
    for mode in [Mode::XdpGeneric, Mode::Packet] {
        let ns = Netns::new();
        let a = ns.a.clone();
        ns.run(move || {
            let mut nic = Nic::open(&a, Some(mode)).unwrap();
            let big = vec![0u8; nic.max_frame() + 1];
            let e = nic.send(&[&big]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{mode}");
            let e = nic.send(&[&big[..10]]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{mode}");
            assert_eq!(nic.stats().tx_refused, 2);
            // The largest allowed frame is accepted.
            assert!(nic.send(&[&big[..nic.max_frame()]]).unwrap());
            nic.flush().unwrap();
        });
    }
}

/// An 802.1Q-tagged frame reaches the caller with its tag in place (AF_PACKET gets it out of
/// band from the kernel and has to put it back).
#[test]
fn vlan_tag_kept() {
    for mode in [Mode::Packet, Mode::XdpGeneric, Mode::Xdp] {
        let ns = Netns::new();
        let (a, b) = (ns.a.clone(), ns.b.clone());
        ns.run(move || {
            let mut nic = Nic::open(&a, Some(mode)).unwrap();
            let peer = Raw::open(&b);
            let plain = frame(7, 100);
            let mut tagged = plain[..12].to_vec();
            tagged.extend_from_slice(&[0x81, 0x00, 0x20, 0x64]);
            tagged.extend_from_slice(&plain[12..]);
            peer.send(&tagged);
            let mut got = Vec::new();
            recv_frames(&mut nic, 1, &mut got);
            assert_eq!(got, vec![tagged], "{mode}");
        });
    }
}

/// The interface disappears under a bound Nic: recv, send and flush report NetworkDown.
#[test]
fn interface_deleted() {
    for mode in [Mode::XdpGeneric, Mode::Xdp, Mode::Packet] {
        let ns = Netns::new();
        let (a, name) = (ns.a.clone(), ns.name.clone());
        ns.run(move || {
            let mut nic = Nic::open(&a, Some(mode)).unwrap();
            assert!(nic.recv(64, |_| {}).is_ok());
            ip(&["-n", &name, "link", "del", &a]);
            assert!(!nic.is_up());
            let deadline = Instant::now() + WAIT;
            let e = loop {
                match nic.recv(64, |_| {}) {
                    Err(e) => break e,
                    Ok(_) => {
                        assert!(Instant::now() < deadline, "{mode}: recv never failed");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            };
            assert!(is_port_down(&e), "{mode}: {e:?}");
            assert!(e.to_string().contains("is gone"), "{mode}: {e}");
            let e = nic.flush().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NetworkDown);
            let e = nic.send(&[&frame(1, 60)]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NetworkDown);
            drop(nic);
        });
    }
}

/// Also without waiting for recv: a flush after the interface vanished fails at once.
#[test]
fn interface_deleted_flush() {
    for mode in [Mode::XdpGeneric, Mode::Packet] {
        let ns = Netns::new();
        let (a, name) = (ns.a.clone(), ns.name.clone());
        ns.run(move || {
            let mut nic = Nic::open(&a, Some(mode)).unwrap();
            ip(&["-n", &name, "link", "del", &a]);
            let r = nic
                .send(&[&frame(1, 60)])
                .and_then(|_| nic.flush())
                .and_then(|_| nic.check());
            let e = r.unwrap_err();
            assert!(is_port_down(&e), "{mode}: {e:?}");
        });
    }
}

/// An interface that already has an XDP program: XDP is refused with a clear reason and the
/// automatic choice falls back to AF_PACKET.
#[test]
fn xdp_busy_falls_back() {
    let ns = Netns::new();
    let a = ns.a.clone();
    ns.run(move || {
        let _first = Nic::open(&a, Some(Mode::Xdp)).unwrap();
        for mode in [Mode::Xdp, Mode::XdpGeneric] {
            let e = Nic::open(&a, Some(mode)).unwrap_err();
            assert!(
                e.to_string().contains("another XDP program is attached"),
                "{mode}: {e}"
            );
        }
        let second = Nic::open(&a, None).unwrap();
        assert_eq!(second.mode(), Mode::Packet);
    });
}

/// MTUs AF_XDP cannot take in one chunk fall back to AF_PACKET.
#[test]
fn jumbo_mtu_uses_packet() {
    let ns = Netns::new();
    let (a, b, name) = (ns.a.clone(), ns.b.clone(), ns.name.clone());
    ns.run(move || {
        ip(&["-n", &name, "link", "set", &a, "mtu", "9000"]);
        ip(&["-n", &name, "link", "set", &b, "mtu", "9000"]);
        let e = Nic::open(&a, Some(Mode::XdpGeneric)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        let mut nic = Nic::open(&a, None).unwrap();
        assert_eq!(nic.mode(), Mode::Packet);
        assert!(nic.max_frame() >= 9014);
        let peer = Raw::open(&b);
        let big = frame(5, 9014);
        peer.send(&big);
        let mut got = Vec::new();
        recv_frames(&mut nic, 1, &mut got);
        assert_eq!(got, vec![big.clone()]);
        send_frame(&mut nic, &big);
        nic.flush().unwrap();
        assert_eq!(peer.recv_test_frame(WAIT), Some(big));
    });
}

/// Dropping the Nic takes the XDP program off the interface (the bpf link closes).
#[test]
fn drop_detaches_xdp() {
    for mode in [Mode::Xdp, Mode::XdpGeneric] {
        let ns = Netns::new();
        let a = ns.a.clone();
        let nic = ns.run(move || Nic::open(&a, Some(mode)).unwrap());
        let shown = ns.link_show(&ns.a);
        assert!(shown.contains("xdp"), "{mode}: no program shown: {shown}");
        let detail = ip(&["-n", &ns.name, "-d", "link", "show", "dev", &ns.a]);
        assert!(detail.contains("promiscuity 1"), "{mode}: {detail}");
        drop(nic);
        // The kernel lets go of the link when its last reference goes, which the socket's
        // release may do a moment after the close (deferred work): wait for it, boundedly.
        let deadline = Instant::now() + WAIT;
        let mut shown = ns.link_show(&ns.a);
        while shown.contains("xdp") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            shown = ns.link_show(&ns.a);
        }
        assert!(!shown.contains("xdp"), "{mode}: program left: {shown}");
        let detail = ip(&["-n", &ns.name, "-d", "link", "show", "dev", &ns.a]);
        assert!(detail.contains("promiscuity 0"), "{mode}: {detail}");
    }
}

//! End-to-end control plane: switches and ports on demand, persistent ports, knobs, vale-ctl's
//! output and exit statuses, the raw control protocol, valed autostart, interrupt moderation.
//!
//! The tests of this file run one at a time (see [`serial`]): some count wake-ups, and the
//! machine may have few CPUs.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vale::{Port, PortCounters, PortParams};
use vale_abi::control::{self, Reply, Request, SwitchInfo};
use vale_tests::*;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `vale-ctl --run-dir DIR ARGS`, for a directory no harness valed serves.
fn ctl_in(dir: &Path, args: &[&str]) -> Output {
    tool("vale-ctl", dir, args)
        .env_remove("VALE_RUN_DIR")
        .output()
        .expect("run vale-ctl")
}

/// Whether `name`, a persistent port, is left without an owner within 2 s.
fn unowned_soon(v: &Valed, name: &str) -> bool {
    wait_until(Duration::from_secs(2), || {
        v.port(name).is_some_and(|p| p.owner_pid.is_none())
    })
}

// ---------------------------------------------------------------------------------------------
// Switches and ports on demand

#[test]
fn switch_and_port_come_with_the_first_open_and_go_with_the_last_close() {
    let _s = serial();
    let v = Valed::start();
    assert!(v.list().is_empty());
    let x = v.open("vale3:x");
    let list = v.list();
    assert_eq!(list.len(), 1, "{list:?}");
    let sw = &list[0];
    assert_eq!(
        (sw.name.as_str(), sw.lookup.as_str(), sw.batch),
        ("vale3", "learning", 512)
    );
    assert_eq!(sw.ports.len(), 1);
    let p = &sw.ports[0];
    assert_eq!(p.name, "vale3:x");
    assert_eq!(p.kind, "native");
    assert_eq!(p.owner_pid, Some(std::process::id()));
    assert!(!p.persistent);
    assert_eq!(
        (p.tx_rings, p.rx_rings, p.slots, p.buf_size, p.moderation_us),
        (1, 1, 1024, 2112, 0)
    );
    assert_eq!(p.counters, PortCounters::default());
    // The region header names the port.
    let name = x.region().name;
    let end = name.iter().position(|&c| c == 0).unwrap();
    assert_eq!(&name[..end], b"vale3:x");
    assert_eq!(x.name(), "vale3:x");

    // A second port, then the first goes: the switch stays for the second.
    let y = v.open("vale3:y");
    let z = v.open("vale4:z");
    assert_eq!(v.list().len(), 2);
    drop(x);
    assert!(
        wait_until(Duration::from_secs(2), || v.port("vale3:x").is_none()),
        "vale3:x still listed after close"
    );
    let names: Vec<String> = v.list().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["vale3", "vale4"]);
    drop(y);
    drop(z);
    assert!(
        wait_until(Duration::from_secs(2), || v.list().is_empty()),
        "switches left after their last port closed: {:?}",
        v.list()
    );
    assert_eq!(v.ctl_ok(&["list"]), "");
    assert_eq!(v.ctl_ok(&["list", "--json"]).trim(), "[]");
}

#[test]
fn a_port_in_use_cannot_be_opened_twice() {
    let _s = serial();
    let v = Valed::start();
    let a = v.open("vale0:a");
    let e = v
        .options()
        .open("vale0:a")
        .err()
        .expect("second open succeeded");
    assert_eq!(
        e.to_string(),
        format!("port 'vale0:a' is in use by pid {}", std::process::id())
    );
    // Another process gets the same answer.
    let out = Kid::spawn(
        v.pktgen(&["-i", "vale0:a", "-f", "rx", "-n", "1"]),
        "vale-pktgen",
    )
    .finish(T);
    let in_use = format!("port 'vale0:a' is in use by pid {}", std::process::id());
    assert_exit(&out, "vale-pktgen", 1, &in_use);
    // The failed opens left the port to its owner, whose traffic still flows.
    let p = v.port("vale0:a").unwrap();
    assert_eq!(p.owner_pid, Some(std::process::id()));
    let b = v.open("vale0:b");
    let f = test_frame(60, MAC_B, MAC_A, 1);
    send_all(&b, std::slice::from_ref(&f));
    assert_eq!(recv_n(&a, 1), vec![f]);
    // Once closed, it can be opened again.
    drop(a);
    assert!(wait_until(Duration::from_secs(2), || v
        .port("vale0:a")
        .is_none()));
    let _a = v.open("vale0:a");
}

#[test]
fn bad_names_are_refused_by_libvale_and_vale_ctl() {
    let _s = serial();
    let v = Valed::start();
    let seventy = format!("vale{}:{}", "s".repeat(32), "p".repeat(33));
    assert_eq!(seventy.len(), 70);
    // Each part within 32 characters, the whole over 63.
    let sixty_nine = format!("vale{}:{}", "s".repeat(32), "p".repeat(32));
    assert_eq!(sixty_nine.len(), 69);
    let bad = [
        "vale0",
        "foo:a",
        "vale0:a b",
        "vale0:",
        "vale:a",
        "vale0:a:b",
        "",
        seventy.as_str(),
        sixty_nine.as_str(),
    ];
    for name in bad {
        let e = v
            .options()
            .open(name)
            .err()
            .unwrap_or_else(|| panic!("libvale opened {name:?}"));
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{name:?}: {e}");
        assert!(e.to_string().contains("bad name"), "{name:?}: {e}");
        // vale-ctl refuses them as usage errors, without asking valed.
        v.ctl_fails(&["create", name], 2, "bad name");
        if name != "vale0" {
            // (vale0 is a good switch name: set and destroy take switches too.)
            v.ctl_fails(&["set", name, "moderation", "5"], 2, "bad name");
        }
    }
    for name in ["foo:a", "vale0:a b", "vale0:", "foo", "vale", "vale0:a:b"] {
        v.ctl_fails(&["destroy", name], 2, "bad name");
        v.ctl_fails(&["list", name], 2, "bad name");
    }
    assert!(v.list().is_empty(), "a bad name created something");

    // The longest valid name, 63 characters, works and fits the region header.
    let longest = format!("vale{}:{}", "s".repeat(26), "p".repeat(32));
    assert_eq!(longest.len(), 63);
    let p = v.open(&longest);
    let name = p.region().name;
    assert_eq!(&name[..63], longest.as_bytes());
    assert_eq!(name[63], 0);
    assert_eq!(v.list()[0].ports[0].name, longest);
    v.ctl_ok(&["set", &longest, "moderation", "5"]);
}

// ---------------------------------------------------------------------------------------------
// Persistent ports

#[test]
fn persistent_port_keeps_its_counters_across_owners() {
    let _s = serial();
    let v = Valed::start();
    assert_eq!(v.ctl_ok(&["create", "vale0:p"]), "");
    let p = v.port("vale0:p").expect("created port is listed");
    assert!(p.persistent);
    assert_eq!(p.owner_pid, None);
    assert_eq!((p.tx_rings, p.rx_rings, p.slots, p.buf_size), (0, 0, 0, 0));
    let human = v.ctl_ok(&["list"]);
    let row = human.lines().find(|l| l.contains("vale0:p")).unwrap();
    assert!(row.contains(" yes "), "{row}");

    // Nobody holds p: flooded frames for it are dropped and counted.
    let a = v.open("vale0:a");
    let bcast: Vec<Vec<u8>> = (0..5)
        .map(|s| test_frame(60, MAC_A, BROADCAST, s))
        .collect();
    send_all(&a, &bcast);
    let pc = v.counters("vale0:p");
    assert_eq!((pc.rx_drops, pc.rx_packets), (5, 0), "{pc:?}");
    assert_eq!(v.counters("vale0:a").tx_packets, 5);

    // A client takes it, receives, sends, leaves.
    let c = v.open("vale0:p");
    let info = v.port("vale0:p").unwrap();
    assert_eq!(info.owner_pid, Some(std::process::id()));
    assert!(info.persistent);
    assert_eq!(info.slots, 1024);
    send_all(&a, &bcast[..3]);
    assert_eq!(recv_n(&c, 3), bcast[..3].to_vec());
    let reply = test_frame(100, MAC_C, MAC_A, 9);
    send_all(&c, std::slice::from_ref(&reply));
    assert_eq!(recv_n(&a, 1), vec![reply]);
    drop(c);
    assert!(
        unowned_soon(&v, "vale0:p"),
        "vale0:p still owned after its client closed it"
    );
    let p = v.port("vale0:p").unwrap();
    assert!(p.persistent);
    assert_eq!((p.tx_rings, p.slots), (0, 0));
    let want = PortCounters {
        tx_packets: 1,
        tx_bytes: 100,
        rx_packets: 3,
        rx_bytes: 180,
        rx_drops: 5,
        tx_drops: 0,
        bad_input: 0,
        learn_refused: 0,
    };
    assert_eq!(p.counters, want);
    // Frames for it count as drops again, including unicast to the address it had.
    send_all(&a, &bcast[..2]);
    send_all(&a, &[test_frame(60, MAC_A, MAC_C, 10)]);
    assert_eq!(v.counters("vale0:p").rx_drops, 8);

    // A second client opens it with another geometry, and sees the kept counters.
    let c2 = v.options().slots(64).buf_size(512).open("vale0:p").unwrap();
    assert_eq!(c2.counters().unwrap().rx_drops, 8);
    assert_eq!(v.port("vale0:p").unwrap().slots, 64);
    drop(c2);
    assert!(unowned_soon(&v, "vale0:p"));

    // Destroy it; errors name what is missing.
    assert_eq!(v.ctl_ok(&["destroy", "vale0:p"]), "");
    assert!(v.port("vale0:p").is_none());
    assert_eq!(v.list()[0].ports.len(), 1, "vale0 keeps a");
    v.ctl_fails(&["destroy", "vale0:p"], 1, "no such port 'vale0:p'");
    v.ctl_fails(
        &["destroy", "vale0:nosuch"],
        1,
        "no such port 'vale0:nosuch'",
    );
    v.ctl_fails(&["destroy", "vale9"], 1, "no such switch 'vale9'");
    v.ctl_fails(&["rm", "vale9:x"], 1, "no such switch 'vale9'");

    // Creating a port that a client holds makes it persistent: it outlives the client.
    v.ctl_ok(&["create", "vale0:a"]);
    assert!(v.port("vale0:a").unwrap().persistent);
    drop(a);
    assert!(unowned_soon(&v, "vale0:a"));
    assert_eq!(v.port("vale0:a").unwrap().counters.tx_packets, 11);
    // Creating it again is harmless.
    v.ctl_ok(&["create", "vale0:a"]);
    assert_eq!(v.list()[0].ports.len(), 1);
    v.ctl_ok(&["destroy", "vale0:a"]);
    assert!(v.list().is_empty(), "the switch went with its last port");
}

#[test]
fn destroying_a_switch_takes_every_port_with_it() {
    let _s = serial();
    let v = Valed::start();
    v.ctl_ok(&["create", "vale5:p"]);
    v.ctl_ok(&["create", "vale5:q"]);
    let r = v.open("vale5:r");
    let other = v.open("vale6:x");
    assert_eq!(
        v.list()
            .iter()
            .find(|s| s.name == "vale5")
            .unwrap()
            .ports
            .len(),
        3
    );
    assert_eq!(v.ctl_ok(&["destroy", "vale5"]), "");
    let names: Vec<String> = v.list().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["vale6"]);
    v.ctl_fails(&["destroy", "vale5"], 1, "no such switch 'vale5'");

    // r keeps its mapping but valed no longer forwards from it.
    let s = v.open("vale5:s");
    let f = test_frame(60, MAC_A, BROADCAST, 1);
    assert!(send_frame(&r, &f));
    r.txsync(0).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    r.txsync(0).unwrap();
    assert_eq!(
        r.tx_ring(0).space(),
        r.tx_ring(0).num_slots() - 2,
        "valed took r's frame"
    );
    assert!(recv_frames(&s).is_empty());
    // Its name is free again, on the new vale5.
    let r2 = v.open("vale5:r");
    send_all(&r2, std::slice::from_ref(&f));
    assert_eq!(recv_n(&s, 1), vec![f]);
    // The old handle's close does not disturb the new port.
    drop(r);
    std::thread::sleep(Duration::from_millis(100));
    let p = v
        .port("vale5:r")
        .expect("the new vale5:r survives the old handle's close");
    assert_eq!(p.owner_pid, Some(std::process::id()));
    assert_eq!(p.counters.tx_packets, 1);
    drop((r2, s, other));
    assert!(wait_until(Duration::from_secs(2), || v.list().is_empty()));
}

// ---------------------------------------------------------------------------------------------
// Knobs

/// `learn-limit`: listed with the port's learnt addresses, set, checked, and applied: a port
/// that sends from many addresses holds no more than its limit and counts the rest.
#[test]
fn learn_limit_knob_is_set_listed_and_applied() {
    let _s = serial();
    let v = Valed::start();
    let a = v.open("vale0:a");
    let _b = v.open("vale0:b");
    let p = v.port("vale0:a").unwrap();
    assert_eq!((p.learn_limit, p.learnt), (1024, 0));
    assert_eq!(v.ctl_ok(&["set", "vale0:a", "learn-limit", "4"]), "");
    assert_eq!(v.port("vale0:a").unwrap().learn_limit, 4);
    let frames: Vec<Vec<u8>> = (0..10u8)
        .map(|i| test_frame(60, [2, 0, 0, 0, 1, i], BROADCAST, i as u64))
        .collect();
    send_all(&a, &frames);
    let p = v.port("vale0:a").unwrap();
    assert_eq!(p.learnt, 4, "{p:?}");
    assert_eq!(p.counters.learn_refused, 6, "{p:?}");
    assert_eq!(
        p.counters.tx_packets, 10,
        "refused sources are still forwarded"
    );
    let human = v.ctl_ok(&["list", "vale0:a"]);
    assert!(
        human.contains("LEARNT") && human.contains("NOLEARN") && human.contains(" 4/4 "),
        "{human}"
    );
    // Raised: the next addresses are learnt.
    v.ctl_ok(&["set", "vale0:a", "learn-limit", "1048576"]);
    send_all(&a, &frames);
    assert_eq!(v.port("vale0:a").unwrap().learnt, 10);

    let range = "learn-limit must be a number from 0 to 1048576";
    for value in ["1048577", "-1", "x", ""] {
        v.ctl_fails(
            &["set", "vale0:a", "learn-limit", value],
            1,
            &format!("{range}, not '{value}'"),
        );
    }
    v.ctl_fails(
        &["set", "vale0", "learn-limit", "5"],
        1,
        "no switch knob 'learn-limit'",
    );
    assert_eq!(v.port("vale0:a").unwrap().learn_limit, 1_048_576);
}

#[test]
fn moderation_knob_is_set_listed_and_checked() {
    let _s = serial();
    let v = Valed::start();
    let _a = v.open("vale0:a");
    assert_eq!(v.ctl_ok(&["set", "vale0:a", "moderation", "50"]), "");
    assert_eq!(v.port("vale0:a").unwrap().moderation_us, 50);
    let human = v.ctl_ok(&["list", "vale0:a"]);
    assert!(human.contains("MOD(us)"), "{human}");
    assert_eq!(
        v.ctl_ok(&["--json", "set", "vale0:a", "moderation", "0"]),
        "{\"ok\":true}\n"
    );
    assert_eq!(v.port("vale0:a").unwrap().moderation_us, 0);
    v.ctl_ok(&["set", "vale0:a", "moderation", "1000000"]);
    assert_eq!(v.port("vale0:a").unwrap().moderation_us, 1_000_000);

    let range = "moderation must be a number from 0 to 1000000";
    let not_abc = format!("{range}, not 'abc'");
    for (target, knob, value, message) in [
        ("vale0:a", "moderation", "abc", not_abc.as_str()),
        ("vale0:a", "moderation", "1000001", range),
        ("vale0:a", "moderation", "-5", range),
        ("vale0:a", "moderation", "", range),
        (
            "vale0:a",
            "speed",
            "5",
            "no port knob 'speed' (known: moderation, learn-limit)",
        ),
        (
            "vale0",
            "moderation",
            "5",
            "no switch knob 'moderation' (known: batch, lookup)",
        ),
        ("vale0:zz", "moderation", "5", "no such port 'vale0:zz'"),
        ("vale9:a", "moderation", "5", "no such switch 'vale9'"),
    ] {
        v.ctl_fails(&["set", target, knob, value], 1, message);
    }
    v.ctl_fails(&["set", "vale0:a", "moderation"], 2, "");
    assert_eq!(
        v.port("vale0:a").unwrap().moderation_us,
        1_000_000,
        "a refusal changed it"
    );

    // A persistent port keeps its knob across owners.
    v.ctl_ok(&["create", "vale0:p"]);
    v.ctl_ok(&["set", "vale0:p", "moderation", "70"]);
    let p = v.open("vale0:p");
    assert_eq!(v.port("vale0:p").unwrap().moderation_us, 70);
    drop(p);
    assert!(unowned_soon(&v, "vale0:p"));
    assert_eq!(v.port("vale0:p").unwrap().moderation_us, 70);
}

// ---------------------------------------------------------------------------------------------
// vale-ctl output and exit statuses

#[test]
fn vale_ctl_without_valed_exits_3() {
    let _s = serial();
    let dir = TempDir::new("novaled");
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["ls", "vale0"],
        &["create", "vale0:a"],
        &["destroy", "vale0"],
        &["set", "vale0", "batch", "4"],
    ] {
        let out = ctl_in(&dir.0, args);
        let what = format!("vale-ctl {args:?}");
        assert_exit(&out, &what, 3, "no valed running for");
        assert_exit(&out, &what, 3, &dir.0.display().to_string());
        assert!(out.stdout.is_empty());
    }
    // A socket left behind by a dead valed: nobody listens on it.
    drop(UnixListener::bind(dir.0.join("valed.sock")).unwrap());
    assert!(dir.0.join("valed.sock").exists());
    assert_exit(&ctl_in(&dir.0, &["list"]), "vale-ctl list", 3, "");
    // A directory that does not exist.
    let out = ctl_in(&dir.0.join("nowhere"), &["list"]);
    assert_exit(&out, "vale-ctl list", 3, "");
    // Usage errors are 2 whether or not valed runs.
    let out = ctl_in(&dir.0, &["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn vale_ctl_list_in_text_and_json() {
    let _s = serial();
    let v = Valed::start();
    let _a = v.open("vale0:a");
    let _b = v.options().rings(2, 3).slots(256).open("vale0:b").unwrap();
    v.ctl_ok(&["create", "vale1:p"]);

    let human = v.ctl_ok(&["list"]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(
        lines[0], "vale0  lookup learning  batch 512  ports 2",
        "{human}"
    );
    for col in [
        "NAME", "KIND", "UID", "PID", "PERSIST", "RINGS", "SLOTS", "BUF", "MOD(us)", "TX-PKTS",
        "TX-BYTES", "RX-PKTS", "RX-BYTES", "RX-DROP", "TX-DROP", "BAD",
    ] {
        assert!(lines[1].contains(col), "header lacks {col}: {human}");
    }
    let pid = std::process::id().to_string();
    let b_row = lines.iter().find(|l| l.contains("vale0:b")).expect(&human);
    assert!(
        b_row.contains(" 2/3 ") && b_row.contains(" 256 ") && b_row.contains(&pid),
        "{b_row}"
    );
    assert!(human.contains("vale0:a"), "{human}");
    assert!(
        human.contains("vale1  lookup learning  batch 512  ports 1"),
        "{human}"
    );
    let p_row = lines.iter().find(|l| l.contains("vale1:p")).expect(&human);
    assert!(p_row.contains(" yes "), "{p_row}");
    assert_eq!(v.ctl_ok(&["ls"]), human, "the alias differs");

    // One switch, one port.
    let one = v.ctl_ok(&["list", "vale0:a"]);
    assert!(one.contains("vale0:a") && !one.contains("vale0:b") && !one.contains("vale1"));
    assert!(
        one.starts_with("vale0  lookup learning  batch 512  ports 2\n"),
        "{one}"
    );
    let sw = v.ctl_ok(&["list", "vale1"]);
    assert!(sw.contains("vale1:p") && !sw.contains("vale0"), "{sw}");
    v.ctl_fails(&["list", "vale7"], 1, "no such switch 'vale7'");
    v.ctl_fails(&["list", "vale0:zz"], 1, "no such port 'vale0:zz'");

    // --json on every read command is JSON, before or after the command name.
    let parse = |args: &[&str]| -> Vec<SwitchInfo> {
        let out = v.ctl_ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    };
    let all = parse(&["list", "--json"]);
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].ports.len(), 2);
    assert_eq!(parse(&["--json", "ls"]).len(), 2);
    let one = parse(&["list", "vale0:b", "--json"]);
    assert_eq!((one.len(), one[0].ports.len()), (1, 1));
    assert_eq!(one[0].ports[0].rx_rings, 3);
    let sw = parse(&["list", "vale1", "--json"]);
    assert_eq!(
        (sw[0].name.as_str(), sw[0].ports[0].name.as_str()),
        ("vale1", "vale1:p")
    );
    // The raw JSON has the documented field names.
    let raw: serde_json::Value =
        serde_json::from_str(&v.ctl_ok(&["list", "vale0:a", "--json"])).unwrap();
    let port = &raw[0]["ports"][0];
    for field in [
        "name",
        "kind",
        "persistent",
        "owner_pid",
        "tx_rings",
        "rx_rings",
        "slots",
        "buf_size",
        "moderation_us",
        "counters",
    ] {
        assert!(port.get(field).is_some(), "no {field} in {port}");
    }
    for field in [
        "tx_packets",
        "tx_bytes",
        "rx_packets",
        "rx_bytes",
        "rx_drops",
        "tx_drops",
        "bad_input",
    ] {
        assert!(
            port["counters"][field].is_u64(),
            "no counter {field} in {port}"
        );
    }
    assert_eq!(raw[0]["lookup"], "learning");
    // Commands that change things print {"ok":true} with --json.
    for args in [
        &["--json", "create", "vale2:q"][..],
        &["--json", "set", "vale2", "batch", "64"],
        &["--json", "set", "vale2", "lookup", "hub"],
        &["--json", "destroy", "vale2"],
    ] {
        let out = v.ctl_ok(args);
        let j: serde_json::Value = serde_json::from_str(&out).expect(&out);
        assert_eq!(j, serde_json::json!({"ok": true}), "{args:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The raw control protocol

fn connect(v: &Valed) -> UnixStream {
    let s = UnixStream::connect(v.run_dir().join("valed.sock")).expect("connect");
    s.set_read_timeout(Some(T)).unwrap();
    s.set_write_timeout(Some(T)).unwrap();
    s
}

fn ask(s: &UnixStream, req: &Request) -> (Reply, usize) {
    control::send(s, req, &[]).expect("send");
    let (r, fds) = control::recv::<Reply>(s)
        .expect("recv")
        .expect("valed closed the connection");
    (r, fds.len())
}

fn error_of(r: Reply) -> String {
    match r {
        Reply::Error { message, .. } => message,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Writes raw bytes, then expects an error reply (saying `why`) or a closed connection; never
/// a hang.
fn garbage_is_refused(v: &Valed, bytes: &[u8], why: &str) {
    let mut s = connect(v);
    s.write_all(bytes).unwrap();
    match control::recv::<Reply>(&s) {
        Ok(Some((Reply::Error { message, .. }, _))) => {
            assert!(message.contains(why), "{message:?} lacks {why:?}");
            // Then the connection ends.
            assert!(matches!(control::recv::<Reply>(&s), Ok(None) | Err(_)));
        }
        Ok(None) => {}
        Err(e) => assert_ne!(
            e.kind(),
            std::io::ErrorKind::WouldBlock,
            "valed neither answered nor closed"
        ),
        Ok(Some((other, _))) => panic!("garbage got {other:?}"),
    }
}

#[test]
fn abi_mismatch_and_garbage_are_refused_and_valed_keeps_serving() {
    let _s = serial();
    let mut v = Valed::start();
    let s = connect(&v);
    let (r, fds) = ask(
        &s,
        &Request::Open {
            port: "vale0:a".into(),
            params: Default::default(),
            abi_version: 99,
        },
    );
    assert_eq!(fds, 0);
    let m = error_of(r);
    let ours = vale_abi::region::VALE_ABI_VERSION.to_string();
    assert!(m.contains("99") && m.contains(&ours), "{m}");
    assert!(m.contains("version"), "{m}");
    assert!(v.list().is_empty(), "the refused open created something");
    // The same connection goes on working.
    let (r, _) = ask(&s, &Request::List);
    assert!(matches!(r, Reply::List { switches } if switches.is_empty()));

    // valed checks what libvale would have checked.
    let bad_params = PortParams {
        slots: 1000,
        ..Default::default()
    };
    let open = |port: &str, params: PortParams| Request::Open {
        port: port.into(),
        params,
        abi_version: vale_abi::region::VALE_ABI_VERSION,
    };
    let m = error_of(ask(&s, &open("vale0:a", bad_params)).0);
    assert!(m.contains("slots"), "{m}");
    for name in ["vale0", "foo:a", "vale0:a b"] {
        let m = error_of(ask(&s, &open(name, Default::default())).0);
        assert!(m.contains("bad name"), "{name}: {m}");
        let m = error_of(ask(&s, &Request::Create { port: name.into() }).0);
        assert!(m.contains("bad name"), "{name}: {m}");
    }
    let m = error_of(ask(&s, &Request::Destroy { name: "foo".into() }).0);
    assert!(m.contains("bad name"), "{m}");
    let set = Request::Set {
        target: "foo".into(),
        knob: "batch".into(),
        value: "1".into(),
    };
    assert!(error_of(ask(&s, &set).0).contains("bad name"));
    assert!(v.list().is_empty());

    // A good open gets 1 + 2 x rings descriptors, and the port lives as long as the connection.
    let params = PortParams {
        tx_rings: 2,
        rx_rings: 3,
        ..Default::default()
    };
    let (r, fds) = ask(&s, &open("vale0:raw", params));
    assert!(
        matches!(r, Reply::Opened { ref port, fds: 11 } if port == "vale0:raw"),
        "{r:?}"
    );
    assert_eq!(fds, 11);
    assert_eq!(
        v.port("vale0:raw").unwrap().owner_pid,
        Some(std::process::id())
    );
    // One connection may own several ports; they all go with it.
    let (r, fds) = ask(&s, &open("vale1:raw2", Default::default()));
    assert!(matches!(r, Reply::Opened { .. }), "{r:?}");
    assert_eq!(fds, 5);
    assert_eq!(v.list().len(), 2);
    drop(s);
    assert!(wait_until(Duration::from_secs(2), || v.list().is_empty()));

    // Garbage: a body that is not JSON, JSON that is no request, lengths too large.
    let mut msg = 5u32.to_le_bytes().to_vec();
    msg.extend_from_slice(b"hello");
    garbage_is_refused(&v, &msg, "bad control message");
    for body in [&br#"{"op":"frobnicate"}"#[..], b"{}", b"null", b""] {
        let mut msg = (body.len() as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(body);
        garbage_is_refused(&v, &msg, "bad control message");
    }
    garbage_is_refused(&v, &0xffff_ffffu32.to_le_bytes(), "too large");
    // The test runs as an administrator, whose limit is the larger one (flow tables).
    let over = vale_abi::control::MAX_ADMIN_REQUEST as u32 + 1;
    garbage_is_refused(&v, &over.to_le_bytes(), "too large");
    // A message cut short, then a half-closed connection.
    let mut cut = connect(&v);
    cut.write_all(&100u32.to_le_bytes()).unwrap();
    cut.write_all(b"{\"op\":").unwrap();
    cut.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(matches!(control::recv::<Reply>(&cut), Ok(None)));
    // A client stuck halfway through a message does not stop the others.
    let mut stuck = connect(&v);
    stuck.write_all(&50u32.to_le_bytes()).unwrap();
    // Descriptors sent along with requests are not kept by valed.
    let s = connect(&v);
    assert!(matches!(ask(&s, &Request::List).0, Reply::List { .. }));
    let fds_before = v.fd_count();
    let null = std::fs::File::open("/dev/null").unwrap();
    for _ in 0..20 {
        use std::os::fd::AsRawFd;
        let fd = null.as_raw_fd();
        control::send(&s, &Request::List, &[fd, fd, fd]).unwrap();
        assert!(matches!(
            control::recv::<Reply>(&s),
            Ok(Some((Reply::List { .. }, _)))
        ));
    }
    assert_eq!(
        v.fd_count(),
        fds_before,
        "valed kept descriptors sent to it"
    );

    assert!(v.alive(), "valed died: {}", v.log());
    assert!(v.list().is_empty());
    let (a, b) = v.open_ab();
    let f = test_frame(60, MAC_A, MAC_B, 0);
    send_all(&a, std::slice::from_ref(&f));
    assert_eq!(recv_n(&b, 1), vec![f]);
    drop(stuck);
}

// ---------------------------------------------------------------------------------------------
// Autostart

/// Pids of the valeds serving `dir` (by their command line), zombies excluded.
fn valeds_for(dir: &Path) -> Vec<u32> {
    use std::os::unix::ffi::OsStrExt;
    let want = dir.as_os_str().as_bytes();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_valed = args
            .first()
            .is_some_and(|a| Path::new(std::ffi::OsStr::from_bytes(a)).ends_with("valed"));
        if is_valed
            && args
                .windows(2)
                .any(|w| w[0] == b"--run-dir" && w[1] == want)
        {
            pids.push(pid);
        }
    }
    pids
}

/// Kills (SIGTERM, then SIGKILL) the valeds a client started for a run directory, on drop.
struct Autostarted(PathBuf);

impl Autostarted {
    fn stop(&self, sig: libc::c_int) -> bool {
        for pid in valeds_for(&self.0) {
            // SAFETY: plain kill(2) of the valed serving our own temporary run directory.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
        wait_until(Duration::from_secs(5), || valeds_for(&self.0).is_empty())
    }
}

impl Drop for Autostarted {
    fn drop(&mut self) {
        if !self.stop(libc::SIGTERM) {
            self.stop(libc::SIGKILL);
        }
    }
}

/// `vale-pktgen --run-dir DIR ARGS`, free to start a valed, not yet started.
fn pktgen_in(dir: &Path, args: &[&str]) -> Command {
    let mut c = tool("vale-pktgen", dir, args);
    c.env_remove("VALE_NO_AUTOSTART")
        .env_remove("VALE_RUN_DIR")
        .env("VALE_VALED", bin("valed"));
    c
}

/// Runs [`pktgen_in`] to completion (within [`T`]) and returns its JSON report.
fn pktgen_report_in(dir: &Path, args: &[&str]) -> serde_json::Value {
    report(
        &Kid::spawn(pktgen_in(dir, args), "vale-pktgen").finish(T),
        "vale-pktgen",
    )
}

#[test]
fn a_client_starts_valed_when_none_runs() {
    let _s = serial();
    let tmp = TempDir::new("autostart");
    // A run directory that does not exist yet.
    let dir = tmp.0.join("run");
    let guard = Autostarted(dir.clone());
    let r = pktgen_report_in(&dir, &["-i", "vale0:a", "-f", "tx", "-n", "10", "--json"]);
    assert_eq!(r["packets"], 10);
    assert!(dir.join("valed.sock").exists());
    assert!(dir.join("valed.log").exists());
    let pids = valeds_for(&dir);
    assert_eq!(pids.len(), 1, "valeds for {}: {pids:?}", dir.display());
    // It runs detached, in a session of its own.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pids[0])).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    assert_eq!(
        f[3],
        pids[0].to_string(),
        "valed is not a session leader: {stat}"
    );
    // vale-ctl finds it; the client's port went with the client.
    assert!(wait_until(Duration::from_secs(2), || {
        let o = ctl_in(&dir, &["list", "--json"]);
        o.status.success() && text(&o.stdout).trim() == "[]"
    }));
    // A second client uses the running valed, starting no other.
    pktgen_report_in(&dir, &["-i", "vale0:b", "-f", "tx", "-n", "5", "--json"]);
    assert_eq!(valeds_for(&dir), pids);
    // SIGTERM: valed removes its socket and exits.
    assert!(guard.stop(libc::SIGTERM), "valed did not exit on SIGTERM");
    assert!(!dir.join("valed.sock").exists(), "valed left its socket");
    let o = ctl_in(&dir, &["list"]);
    assert_eq!(o.status.code(), Some(3));
}

#[test]
fn clients_racing_to_autostart_share_one_valed() {
    let _s = serial();
    let tmp = TempDir::new("autorace");
    let dir = tmp.0.join("run");
    let _guard = Autostarted(dir.clone());
    let kids: Vec<Kid> = ["a", "b", "c", "d"]
        .iter()
        .map(|p| {
            let port = format!("vale0:{p}");
            Kid::spawn(
                pktgen_in(&dir, &["-i", &port, "-f", "rx", "-T", "1", "--json"]),
                "vale-pktgen",
            )
        })
        .collect();
    for k in kids {
        let out = k.finish(T);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert_eq!(
        valeds_for(&dir).len(),
        1,
        "{}",
        std::fs::read_to_string(dir.join("valed.log")).unwrap_or_default()
    );
}

#[test]
fn without_autostart_a_client_fails_naming_the_socket() {
    let _s = serial();
    let tmp = TempDir::new("noauto");
    let guard = Autostarted(tmp.0.clone());
    let mut c = pktgen_in(&tmp.0, &["-i", "vale0:a", "-f", "tx", "-n", "10"]);
    c.env("VALE_NO_AUTOSTART", "1");
    let out = Kid::spawn(c, "vale-pktgen").finish(T);
    let sock = tmp.0.join("valed.sock").display().to_string();
    assert_exit(&out, "vale-pktgen", 1, &sock);
    assert!(valeds_for(&tmp.0).is_empty(), "a valed started anyway");
    assert!(!tmp.0.join("valed.sock").exists());

    // libvale with autostart off says the same.
    let e = vale::OpenOptions::new()
        .run_dir(&tmp.0)
        .autostart(false)
        .open("vale0:a")
        .err()
        .expect("opened without valed");
    assert!(e.to_string().contains(&sock), "{e}");

    // A valed program that cannot be started: the client says which.
    let mut c = pktgen_in(&tmp.0, &["-i", "vale0:a", "-f", "tx", "-n", "10"]);
    c.env("VALE_VALED", "/nonexistent/valed");
    let out = Kid::spawn(c, "vale-pktgen").finish(T);
    assert_exit(&out, "vale-pktgen", 1, "/nonexistent/valed");
    drop(guard);
}

// ---------------------------------------------------------------------------------------------
// Interrupt moderation

/// a sends `n` frames one at a time, `gap` apart, while b sleeps in poll between them.
/// Returns the interrupts b consumed and how long the exchange took.
fn paced(a: &Port, b: &Port, n: u64, gap: Duration) -> (u64, u32, Duration) {
    let before = b.interrupts();
    let start = Instant::now();
    let polls = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let mut got = 0u64;
            let mut polls = 0u32;
            let deadline = Instant::now() + T;
            while got < n {
                assert!(Instant::now() < deadline, "b got {got} of {n}");
                for f in recv_frames(b) {
                    assert!(f == test_frame(60, MAC_A, MAC_B, got), "frame {got}");
                    got += 1;
                }
                if got < n {
                    // Long timeout: a lost interrupt would show as a 2 s stall.
                    b.poll(READABLE, Some(Duration::from_secs(2))).unwrap();
                    polls += 1;
                }
            }
            polls
        });
        for seq in 0..n {
            assert!(send_frame(a, &test_frame(60, MAC_A, MAC_B, seq)));
            a.txsync(0).unwrap();
            std::thread::sleep(gap);
        }
        rx.join().expect("receiver")
    });
    (b.interrupts() - before, polls, start.elapsed())
}

#[test]
fn interrupt_moderation_merges_wake_ups() {
    let _s = serial();
    let v = Valed::start();
    let (a, b) = v.open_ab();
    // Let the bridge learn b (its frame goes to a).
    send_all(&b, &[test_frame(60, MAC_B, MAC_A, 0)]);
    recv_n(&a, 1);
    let gap = Duration::from_micros(200);

    // Without moderation a wake-up comes per frame that finds the receiver asleep: a busy
    // machine that runs the receiver late still merges some, but never down to what 20 ms of
    // moderation makes of 40 ms of frames (at most 3-4).
    let (irqs, polls, took) = paced(&a, &b, 200, gap);
    assert!(
        (40..=200).contains(&irqs),
        "moderation 0: {irqs} interrupts for 200 frames ({polls} polls)"
    );
    assert!(took < Duration::from_millis(1500), "took {took:?}");

    v.ctl_ok(&["set", "vale0:b", "moderation", "20000"]);
    // Start the interval afresh: nothing arrived for more than 20 ms.
    std::thread::sleep(Duration::from_millis(30));
    let (irqs, polls, took) = paced(&a, &b, 200, gap);
    assert!(
        irqs < 15,
        "moderation 20 ms: {irqs} interrupts for 200 frames ({polls} polls, {took:?})"
    );
    assert!(irqs >= 1);
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?}: an interrupt was late or lost"
    );
    let bc = v.counters("vale0:b");
    assert_eq!((bc.rx_packets, bc.rx_drops), (400, 0), "{bc:?}");

    // Back to 0: wake-ups are immediate again.
    v.ctl_ok(&["set", "vale0:b", "moderation", "0"]);
    let (irqs, _, _) = paced(&a, &b, 200, gap);
    assert!(irqs >= 40, "moderation 0 again: {irqs} interrupts");

    // With 300 ms, an interrupt soon after another is deferred to the end of the interval,
    // not dropped.
    v.ctl_ok(&["set", "vale0:b", "moderation", "300000"]);
    std::thread::sleep(Duration::from_millis(310));
    let wake = |seq: u64| -> Duration {
        let f = test_frame(60, MAC_A, MAC_B, seq);
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                assert!(send_frame(&a, &f));
                a.txsync(0).unwrap();
            });
            b.poll(READABLE, Some(Duration::from_secs(3))).unwrap();
        });
        let took = t.elapsed();
        assert_eq!(recv_frames(&b), vec![f], "frame {seq}");
        took
    };
    let first = wake(1000);
    assert!(
        first < Duration::from_millis(200),
        "first interrupt took {first:?}"
    );
    let second = wake(1001);
    assert!(
        second > Duration::from_millis(150) && second < Duration::from_secs(2),
        "the second interrupt came after {second:?}, not at the end of the 300 ms interval"
    );
}

#[test]
fn a_killed_client_loses_its_port() {
    let _s = serial();
    let v = Valed::start();
    let _a = v.open("vale0:a");
    let kid = v.spawn_client(
        v.pktgen(&["-i", "vale0:b", "-f", "rx", "-T", "60"]),
        "vale-pktgen rx",
        "vale0:b",
    );
    kid.signal(libc::SIGKILL);
    let out = kid.finish(T);
    assert!(!out.status.success());
    assert!(
        wait_until(Duration::from_secs(2), || v.port("vale0:b").is_none()),
        "vale0:b outlived its killed client"
    );
    // Its name is free.
    let _b = v.open("vale0:b");
}

#[test]
fn a_switch_holds_at_most_2048_ports() {
    let _s = serial();
    let v = Valed::start();
    let s = connect(&v);
    for i in 0..2048 {
        let (r, _) = ask(
            &s,
            &Request::Create {
                port: format!("vale0:p{i}"),
            },
        );
        assert!(matches!(r, Reply::Ok), "port {i}: {r:?}");
    }
    let m = error_of(
        ask(
            &s,
            &Request::Create {
                port: "vale0:extra".into(),
            },
        )
        .0,
    );
    assert_eq!(m, "switch 'vale0' is full (2048 ports)");
    let e = v
        .options()
        .open("vale0:extra")
        .err()
        .expect("opened a 2049th port");
    assert_eq!(e.to_string(), "switch 'vale0' is full (2048 ports)");
    assert_eq!(v.list()[0].ports.len(), 2048);
    // A freed index is reused.
    v.ctl_ok(&["destroy", "vale0:p7"]);
    let _x = v.open("vale0:extra");
    assert_eq!(v.list()[0].ports.len(), 2048);
    // Other switches are not concerned.
    let _y = v.open("vale1:y");
    v.ctl_ok(&["destroy", "vale0"]);
    assert_eq!(v.list().len(), 1);
}

#[test]
fn valed_socket_mode_and_one_valed_per_run_directory() {
    use std::os::unix::fs::PermissionsExt;
    let _s = serial();
    let v = Valed::start_with(&["--socket-mode", "600"]);
    let mode = std::fs::metadata(v.run_dir().join("valed.sock"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The mode is the one asked for, whatever the umask valed was started with.
    let tmp = TempDir::new("mode666");
    let mut c = tool("valed", &tmp.0, &["--socket-mode", "666"]);
    // SAFETY: umask is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::umask(0o077);
            Ok(())
        });
    }
    let open = Kid::spawn(c, "valed --socket-mode 666");
    let sock = tmp.0.join("valed.sock");
    assert!(wait_until(T, || UnixStream::connect(&sock).is_ok()));
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666);
    open.signal(libc::SIGTERM);
    assert!(open.finish(T).status.success());
    let _a = v.open("vale0:a");
    // A second valed for the same directory refuses to run, and leaves the first alone.
    let out = valed_refusing(v.run_dir(), &[]);
    assert_exit(&out, "second valed", 1, "another valed is running");
    assert_eq!(
        v.port("vale0:a").unwrap().owner_pid,
        Some(std::process::id())
    );
    // Bad options are refused.
    let tmp = TempDir::new("badmode");
    let out = valed_refusing(&tmp.0, &["--socket-mode", "999"]);
    assert_exit(&out, "valed --socket-mode 999", 1, "bad --socket-mode");
    for bad in [
        &["--workers", "0"][..],
        &["--batch", "0"],
        &["--batch", "4096"],
    ] {
        let out = valed_refusing(&tmp.0, bad);
        assert_exit(&out, &format!("valed {bad:?}"), 2, "");
    }
    assert!(!tmp.0.join("valed.sock").exists());
}

#[test]
fn autostart_replaces_a_stale_socket() {
    let _s = serial();
    let tmp = TempDir::new("stale");
    let guard = Autostarted(tmp.0.clone());
    // What a valed killed with SIGKILL leaves behind: a socket nobody listens on.
    drop(UnixListener::bind(tmp.0.join("valed.sock")).unwrap());
    assert_eq!(ctl_in(&tmp.0, &["list"]).status.code(), Some(3));
    pktgen_report_in(&tmp.0, &["-i", "vale0:a", "-f", "tx", "-n", "3", "--json"]);
    assert_eq!(valeds_for(&tmp.0).len(), 1);
    let o = ctl_in(&tmp.0, &["list", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    drop(guard);
    assert!(valeds_for(&tmp.0).is_empty());
}

/// A valed for `dir` that must refuse to start, saying `message`; it leaves no socket there.
fn valed_refuses_dir(dir: &Path, message: &str) {
    let out = valed_refusing(dir, &[]);
    assert_exit(&out, "valed", 1, message);
    assert_exit(&out, "valed", 1, &dir.display().to_string());
    assert!(!dir.join("valed.sock").exists());
}

#[test]
fn a_planted_lock_link_is_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let _s = serial();
    let tmp = TempDir::new("lockln");
    let run = tmp.0.join("run");
    std::fs::create_dir(&run).unwrap();
    // valed runs as root: a link planted as its lock file would have it create any file.
    let target = tmp.0.join("elsewhere");
    std::os::unix::fs::symlink(&target, run.join("valed.lock")).unwrap();
    valed_refuses_dir(&run, "valed.lock: it is a symbolic link");
    assert!(
        std::fs::symlink_metadata(&target).is_err(),
        "valed created the link's target"
    );
    // A sticky directory others may write (as /tmp): a lock file someone else put there is
    // refused, not used.
    std::fs::remove_file(run.join("valed.lock")).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let lock = run.join("valed.lock");
    std::fs::write(&lock, "").unwrap();
    std::os::unix::fs::chown(&lock, Some(65534), None).unwrap();
    // SAFETY: plain geteuid.
    let me = unsafe { libc::geteuid() };
    valed_refuses_dir(
        &run,
        &format!("valed.lock: it belongs to uid 65534, not to uid {me}"),
    );
    // Once it is gone, valed runs there.
    std::fs::remove_file(&lock).unwrap();
    let v = Kid::spawn(tool("valed", &run, &[]), "valed");
    assert!(
        wait_until(T, || UnixStream::connect(run.join("valed.sock")).is_ok()),
        "valed did not start in a sticky run directory"
    );
    v.signal(libc::SIGTERM);
    assert!(v.finish(T).status.success());
}

#[test]
fn a_run_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let _s = serial();
    let tmp = TempDir::new("opendir");
    let dir = &tmp.0;
    let chmod = |m: u32| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m)).unwrap();
    chmod(0o777);
    valed_refuses_dir(
        dir,
        "writable by its group and all users (mode 0777) and not sticky",
    );
    assert!(!dir.join("valed.lock").exists());
    chmod(0o775);
    valed_refuses_dir(dir, "writable by its group (mode 0775) and not sticky");
    chmod(0o757);
    valed_refuses_dir(dir, "writable by all users (mode 0757) and not sticky");
    // Someone else's directory.
    chmod(0o755);
    std::os::unix::fs::chown(dir, Some(65534), None).unwrap();
    valed_refuses_dir(dir, "it belongs to uid 65534");
    std::os::unix::fs::chown(dir, Some(0), None).unwrap();
    // A client's autostart refuses it too, saying why, and starts no valed.
    let _guard = Autostarted(dir.clone());
    chmod(0o777);
    let out = Kid::spawn(
        pktgen_in(dir, &["-i", "vale0:a", "-f", "tx", "-n", "1"]),
        "vale-pktgen",
    )
    .finish(T);
    assert_exit(&out, "vale-pktgen", 1, "not sticky");
    assert_exit(&out, "vale-pktgen", 1, &dir.display().to_string());
    assert!(valeds_for(dir).is_empty(), "a valed started anyway");
    assert!(!dir.join("valed.log").exists());
    // A directory valed makes is its own, not writable by others.
    let made = dir.join("made");
    chmod(0o755);
    let v = Kid::spawn(tool("valed", &made, &[]), "valed");
    assert!(wait_until(T, || UnixStream::connect(
        made.join("valed.sock")
    )
    .is_ok()));
    let mode = std::fs::metadata(&made).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755);
    v.signal(libc::SIGTERM);
    assert!(v.finish(T).status.success());
}

#[test]
fn autostart_does_not_follow_a_planted_log_link() {
    let _s = serial();
    let tmp = TempDir::new("logln");
    let run = tmp.0.join("run");
    std::fs::create_dir(&run).unwrap();
    let _guard = Autostarted(run.clone());
    let target = tmp.0.join("elsewhere");
    std::os::unix::fs::symlink(&target, run.join("valed.log")).unwrap();
    let out = Kid::spawn(
        pktgen_in(&run, &["-i", "vale0:a", "-f", "tx", "-n", "1"]),
        "vale-pktgen",
    )
    .finish(T);
    assert_exit(&out, "vale-pktgen", 1, "valed.log: it is a symbolic link");
    assert!(
        std::fs::symlink_metadata(&target).is_err(),
        "the autostart created the link's target"
    );
    assert!(valeds_for(&run).is_empty(), "a valed started anyway");
}

//! Who may do what, and what one user can make valed hold: an unprivileged user (nobody)
//! against a valed whose socket lets everyone in. These tests need root (to run clients as
//! another user); without it they say so and pass.

use std::process::Output;
use std::time::{Duration, Instant};

use vale_abi::region::{Layout, PortParams};
use vale_tests::*;

/// The unprivileged user of these tests (and its group): nobody, nogroup.
const NOBODY: u32 = 65534;

fn root() -> bool {
    // SAFETY: plain syscall.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root to run clients as another user");
    }
    root
}

/// Runs `vale-ctl ARGS` as nobody.
fn ctl_as_nobody(v: &Valed, args: &[&str]) -> Output {
    run_bounded(&mut v.tool_as(NOBODY, 1024, "vale-ctl", args), T)
}

/// Runs control-flood as nobody and returns its report.
fn flood_as_nobody(v: &Valed, nofile: u64, args: &[&str], limit: Duration) -> serde_json::Value {
    let sock = v.run_dir().join("valed.sock");
    let mut all = vec![sock.to_str().expect("utf-8 path")];
    all.extend_from_slice(args);
    let out = run_bounded(&mut v.tool_as(NOBODY, nofile, "control-flood", &all), limit);
    report(&out, "control-flood")
}

fn refused(out: &Output, what: &str, message: &str) {
    assert_exit(out, what, 1, message);
}

#[test]
fn only_owners_and_administrators_change_a_port() {
    if !root() {
        return;
    }
    // One at a time: the floods load every CPU, and the others time root's answers.
    let _s = serial();
    let v = Valed::start_with(&["--socket-mode", "666"]);
    v.ctl_ok(&["create", "vale0:r"]);
    assert_eq!(v.port("vale0:r").expect("created").owner_uid, 0);

    // Another user's port: not to be destroyed, tuned, reopened or made persistent.
    let belongs = "belongs to uid 0";
    for args in [
        &["destroy", "vale0:r"][..],
        &["set", "vale0:r", "moderation", "10"],
        &["create", "vale0:r"],
    ] {
        refused(&ctl_as_nobody(&v, args), &format!("{args:?}"), belongs);
    }
    let opened = flood_as_nobody(&v, 1024, &["open", "vale0:r"], T);
    assert_eq!(opened["opened"], 0, "{opened}");
    assert!(
        opened["errors"][0].as_str().unwrap().contains(belongs),
        "{opened}"
    );
    // A switch holding root's port is not nobody's to remove.
    refused(
        &ctl_as_nobody(&v, &["destroy", "vale0"]),
        "destroy vale0",
        belongs,
    );

    // Host devices, lookup modules and switch knobs need an administrator.
    let admin = "needs an administrator";
    for args in [
        &["set", "vale0", "lookup", "hub"][..],
        &["lookup", "vale0", "vlan", "--access", "r=10"],
        &["set", "vale0", "batch", "8"],
        &["attach", "vale1:t", "--tap", "valeacc0"],
        &["attach", "vale1:n", "--iface", "lo"],
        &["flow", "vale0", "add", "actions=drop"],
        &["flow", "vale0", "del", "1"],
    ] {
        refused(&ctl_as_nobody(&v, args), &format!("{args:?}"), admin);
    }
    assert!(
        !std::path::Path::new("/sys/class/net/valeacc0").exists(),
        "a refused attach made a TAP"
    );
    assert!(v.port("vale1:t").is_none() && v.port("vale1:n").is_none());
    assert_eq!(v.list()[0].lookup, "learning");
    // A flow table's rules are anyone's to read, as the module is; not to change.
    v.ctl_ok(&["lookup", "vale0", "flow"]);
    v.ctl_ok(&["flow", "vale0", "add", "arp actions=flood"]);
    let out = ctl_as_nobody(&v, &["flow", "vale0", "dump"]);
    assert_exit(&out, "flow dump", 0, "");
    assert!(String::from_utf8_lossy(&out.stdout).contains("arp actions=flood"));
    refused(
        &ctl_as_nobody(&v, &["flow", "vale0", "del", "arp"]),
        "flow del",
        admin,
    );
    assert!(v
        .ctl_ok(&["flow", "vale0", "dump"])
        .contains("arp actions=flood"));
    v.ctl_ok(&["lookup", "vale0", "learning"]);
    assert_eq!(v.port("vale0:r").expect("still there").moderation_us, 0);

    // What is nobody's own is nobody's to change; root may change it too.
    for args in [
        &["create", "vale0:n"][..],
        &["set", "vale0:n", "moderation", "10"],
        &["create", "vale2:m"],
        &["destroy", "vale2"],
    ] {
        let out = ctl_as_nobody(&v, args);
        assert_exit(&out, &format!("{args:?}"), 0, "");
    }
    let n = v.port("vale0:n").expect("nobody's port");
    assert_eq!((n.owner_uid, n.moderation_us), (NOBODY, 10));
    assert!(v.port("vale2:m").is_none());
    v.ctl_ok(&["set", "vale0:n", "moderation", "0"]);
    v.ctl_ok(&["destroy", "vale0:n"]);
    v.ctl_ok(&["destroy", "vale0"]);
    assert!(v.list().is_empty());
}

#[test]
fn an_administrators_group_has_the_rights_of_root() {
    if !root() {
        return;
    }
    // One at a time: the floods load every CPU, and the others time root's answers.
    let _s = serial();
    let v = Valed::start_with(&["--socket-mode", "666", "--admin-group", "nogroup"]);
    v.ctl_ok(&["create", "vale0:r"]);
    for args in [
        &["set", "vale0", "lookup", "hub"][..],
        &["set", "vale0:r", "moderation", "5"],
        &["destroy", "vale0:r"],
    ] {
        let out = ctl_as_nobody(&v, args);
        assert_exit(&out, &format!("{args:?}"), 0, "");
    }
    assert!(v.list().is_empty());
    let out = valed_refusing(
        &TempDir::new("badgroup").0,
        &["--admin-group", "no-such-group"],
    );
    assert_exit(
        &out,
        "valed --admin-group no-such-group",
        1,
        "no such group",
    );
}

#[test]
fn a_user_has_bounded_connections_and_ports() {
    if !root() {
        return;
    }
    // One at a time: the floods load every CPU, and the others time root's answers.
    let _s = serial();
    let v = Valed::start_with(&[
        "--socket-mode",
        "666",
        "--max-conns-per-user",
        "4",
        "--max-ports-per-user",
        "3",
    ]);
    let r = flood_as_nobody(&v, 1024, &["conns", "10", "300"], T);
    assert_eq!(r["connected"], 10, "{r}");
    assert_eq!(r["refused"], 6, "{r}");

    let names: Vec<String> = (1..=5).map(|i| format!("vale0:u{i}")).collect();
    let mut args = vec!["open"];
    args.extend(names.iter().map(String::as_str));
    let r = flood_as_nobody(&v, 1024, &args, T);
    assert_eq!(r["opened"], 3, "{r}");
    let e = r["errors"][0].as_str().unwrap();
    assert!(
        e.contains("already has 3 ports") && e.contains("--max-ports-per-user"),
        "{e}"
    );
    // The ports went with the connection; root is not bound by the limits.
    assert!(wait_until(T, || v.list().is_empty()));
    let _held: Vec<_> = (0..6).map(|i| v.open(&format!("vale0:r{i}"))).collect();
}

#[test]
fn a_user_has_bounded_port_descriptors() {
    if !root() {
        return;
    }
    // A port of one tx and one rx ring holds 7 descriptors of valed: room for two, not three.
    let v = Valed::start_with(&["--socket-mode", "666", "--max-port-fds-per-user", "20"]);
    let r = flood_as_nobody(&v, 1024, &["open", "vale0:a", "vale0:b", "vale0:c"], T);
    assert_eq!(r["opened"], 2, "{r}");
    let e = r["errors"][0].as_str().unwrap();
    assert!(
        e.contains("21 descriptors") && e.contains("--max-port-fds-per-user"),
        "{e}"
    );
}

#[test]
fn a_user_has_bounded_port_memory() {
    if !root() {
        return;
    }
    // One at a time: the floods load every CPU, and the others time root's answers.
    let _s = serial();
    let size = Layout::new(&PortParams::default()).unwrap().region_size;
    // Room for two default ports, not three.
    let mib = ((size * 5 / 2) >> 20).to_string();
    let v = Valed::start_with(&["--socket-mode", "666", "--max-port-memory-per-user", &mib]);
    let r = flood_as_nobody(&v, 1024, &["open", "vale0:a", "vale0:b", "vale0:c"], T);
    assert_eq!(r["opened"], 2, "{r}");
    let e = r["errors"][0].as_str().unwrap();
    assert!(
        e.contains("port memory") && e.contains("--max-port-memory-per-user"),
        "{e}"
    );
}

/// Root's `vale-ctl list` answers, in how long.
fn timed_list(v: &Valed) -> Duration {
    let t = Instant::now();
    v.ctl_ok(&["list"]);
    t.elapsed()
}

#[test]
fn twenty_thousand_idle_connections_of_one_user_leave_valed_serving() {
    if !root() {
        return;
    }
    // One at a time: the floods load every CPU, and the others time root's answers.
    let _s = serial();
    let mut v = Valed::start_with(&["--socket-mode", "666"]);
    let (_a, _b) = v.open_ab();
    let fds_before = v.fd_count();
    let rss_before = v.rss_kib();
    let sock = v.run_dir().join("valed.sock");
    // Two processes of 10,000 connections each: a process may not hold 20,000 descriptors
    // everywhere (the hard limit is often 20,000 or less, and even root may not raise it).
    let floods: Vec<Kid> = (0..2)
        .map(|_| {
            Kid::spawn(
                v.tool_as(
                    NOBODY,
                    10_100,
                    "control-flood",
                    &[sock.to_str().unwrap(), "conns", "10000", "4000"],
                ),
                "control-flood",
            )
        })
        .collect();
    // Root is served all along, promptly; valed holds what the caps allow and no more.
    let mut slowest = Duration::ZERO;
    let mut most_fds = 0;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        slowest = slowest.max(timed_list(&v));
        most_fds = most_fds.max(v.fd_count());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut made, mut refused) = (0, 0);
    for flood in floods {
        let r = report(&flood.finish(Duration::from_secs(60)), "control-flood");
        assert_eq!(
            r["connected"].as_u64().unwrap() + r["failed"].as_u64().unwrap(),
            10_000,
            "{r}"
        );
        made += r["connected"].as_u64().unwrap();
        refused += r["refused"].as_u64().unwrap();
    }
    assert!(v.alive(), "valed died: {}", v.log());
    // Connections the listen queue could not take failed; of the others valed kept 64.
    eprintln!(
        "{made} connections made, {refused} refused; root's slowest list {slowest:?}; \
         valed's descriptors {fds_before} before, {most_fds} at most"
    );
    assert!(
        made >= 19_000 && refused == made - 64,
        "{made} made, {refused} refused"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "root's list took {slowest:?}"
    );
    // The 64 connections nobody may keep, root's list, and a few on their way to a refusal.
    assert!(
        most_fds <= fds_before + 64 + 6,
        "valed held {most_fds} descriptors (before: {fds_before})"
    );
    let rss = v.rss_kib();
    eprintln!("valed's RSS {rss_before} KiB before, {rss} KiB after");
    assert!(
        rss < rss_before + 16 * 1024,
        "valed grew from {rss_before} to {rss} KiB"
    );
    // Afterwards nobody is served again.
    let out = ctl_as_nobody(&v, &["list"]);
    assert_exit(&out, "list as nobody", 0, "");
}

#[test]
fn announced_giant_requests_cost_valed_nothing() {
    if !root() {
        return;
    }
    // One at a time: the floods load every CPU, and the others time root's answers.
    let _s = serial();
    let v = Valed::start_with(&["--socket-mode", "666"]);
    let rss_before = v.rss_kib();
    // 16 MiB announced on each of 60 connections: each refused at once, nothing held.
    let r = flood_as_nobody(&v, 1024, &["announce", "60", "16777216", "500"], T);
    assert_eq!(r["refused"], 60, "{r}");
    // Requests just under the limit, never sent: held, but not allocated ahead.
    let r = flood_as_nobody(&v, 1024, &["announce", "60", "65536", "500"], T);
    assert_eq!(r["refused"], 0, "{r}");
    let rss = v.rss_kib();
    assert!(
        rss < rss_before + 8 * 1024,
        "valed grew from {rss_before} to {rss} KiB"
    );
    timed_list(&v);
}

#[test]
fn root_gets_through_when_valed_is_out_of_descriptors() {
    if !root() {
        return;
    }
    // One at a time: the floods load every CPU, and the others time root's answers.
    let _s = serial();
    let mut v = Valed::start_with_nofile(
        &[
            "--socket-mode",
            "666",
            "--max-conns",
            "100000",
            "--max-conns-per-user",
            "100000",
        ],
        256,
    );
    let sock = v.run_dir().join("valed.sock");
    let flood = Kid::spawn(
        v.tool_as(
            NOBODY,
            4096,
            "control-flood",
            &[sock.to_str().unwrap(), "conns", "1100", "3000"],
        ),
        "control-flood",
    );
    std::thread::sleep(Duration::from_millis(1000));
    let slowest = (0..5).map(|_| timed_list(&v)).max().unwrap();
    assert!(
        slowest < Duration::from_secs(1),
        "root's list took {slowest:?}"
    );
    let out = flood.finish(Duration::from_secs(30));
    let r = report(&out, "control-flood");
    assert!(r["refused"].as_u64().unwrap() > 0, "{r}");
    assert!(v.alive(), "valed died: {}", v.log());
    // Once the flood has gone, valed accepts everyone again.
    assert!(wait_until(T, || {
        ctl_as_nobody(&v, &["list"]).status.success()
    }));
    // What is left of valed's descriptors goes to connections, not to users' ports; root's
    // ports still open.
    let r = flood_as_nobody(&v, 1024, &["open", "vale0:n"], T);
    assert_eq!(r["opened"], 0, "{r}");
    assert!(
        r["errors"][0]
            .as_str()
            .unwrap()
            .contains("short of descriptors"),
        "{r}"
    );
    let _p = v.open("vale0:a");
}

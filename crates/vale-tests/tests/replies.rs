//! What an unprivileged user's unread replies can make valed hold: a user (nobody) who asks
//! for a large flow table on every connection it may have and never reads. valed's memory
//! stays within the per-user bound of docs/abi.md, and root's answers do not wait for the
//! user's replies to be built. These tests need root (to run clients as another user);
//! without it they say so and pass.

use std::time::{Duration, Instant};

use vale_tests::*;

/// The unprivileged user of these tests (and its group): nobody, nogroup.
const NOBODY: u32 = 65534;
/// What valed lets one user's connections leave unread (`USER_REPLY_BYTES`, docs/abi.md).
const USER_REPLY_BYTES: u64 = 4 << 20;
/// A legal table (the limit is 200000): one dump of it whole is about 20 MB of JSON.
const RULES: usize = 100_000;
/// Rules of many fields, about 450 bytes of JSON each: a page of them (1024) is more than
/// the kernel's socket buffer takes, so that most of it stays in valed while unread.
const WIDE_RULES: usize = 10_000;

fn root() -> bool {
    // SAFETY: plain syscall.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root to run clients as another user");
    }
    root
}

/// Rule `i` of [`RULES`].
fn rule(i: usize) -> String {
    format!(
        "prio=100 udp,nw_src=10.{}.{}.{},tp_dst={} actions=drop",
        i >> 16,
        (i >> 8) & 255,
        i & 255,
        i % 60000 + 1
    )
}

/// Rule `i` of [`WIDE_RULES`].
fn wide_rule(i: usize) -> String {
    let long = "p".repeat(31);
    format!(
        "prio=100 in_port=vale0:{long}a,dl_src=02:11:22:33:44:55/ff:ff:ff:ff:ff:00,\
         dl_dst=02:66:77:88:99:aa/ff:ff:ff:ff:ff:00,udp6,\
         ipv6_src=2001:db8:1111:2222:3333:4444:{:04x}:{:04x},\
         ipv6_dst=2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff,tp_src=12345/0xfff0,\
         tp_dst=54321/0xfff0 actions=output:vale0:{long}b",
        0x1000 + (i >> 12),
        0x1000 + (i & 0xfff)
    )
}

/// A valed whose socket lets everyone in, with switch vale0's flow table of `n` rules.
fn valed_with_a_table(n: usize, rule: fn(usize) -> String) -> Valed {
    let v = Valed::start_with(&["--socket-mode", "666"]);
    v.ctl_ok(&["create", "vale0:a"]);
    let rules: String = (0..n).map(|i| rule(i) + "\n").collect();
    let file = v.run_dir().join("rules.txt");
    std::fs::write(&file, rules).expect("write rules");
    v.ctl_ok(&["lookup", "vale0", "flow", "--rules", file.to_str().unwrap()]);
    v
}

/// `control-flood SOCKET ask N HOLD_MS JSON` as nobody, started.
fn ask_as_nobody(v: &Valed, n: u32, hold_ms: u32, json: &str) -> Kid {
    let sock = v.run_dir().join("valed.sock");
    let (n, hold) = (n.to_string(), hold_ms.to_string());
    let args = [sock.to_str().unwrap(), "ask", &n, &hold, json];
    Kid::spawn(
        v.tool_as(NOBODY, 1024, "control-flood", &args),
        "control-flood",
    )
}

/// Starts a flood of `conns` connections of nobody asking for the first page of vale0's
/// flow table and reading nothing for 5 s. Meanwhile, for 3 s, times root's `vale-ctl list`
/// and samples valed's memory; requires it to stay within what one user may leave unread
/// (and what an allocator keeps of the pages built and freed meanwhile), and root to be
/// answered within 1 s. Returns the flood's report.
fn flood_beside_root(v: &Valed, conns: u32) -> serde_json::Value {
    // Root's answers are warm (the first list allocates what every list reuses).
    v.ctl_ok(&["list"]);
    let before = v.rss_kib();
    let flood = ask_as_nobody(
        v,
        conns,
        5000,
        r#"{"op":"lookup_control","switch":"vale0","command":"dump","body":"after=0"}"#,
    );
    let (mut peak, mut slowest, mut lists) = (before, Duration::ZERO, 0);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let t = Instant::now();
        v.ctl_ok(&["list"]);
        slowest = slowest.max(t.elapsed());
        lists += 1;
        peak = peak.max(v.rss_kib());
        std::thread::sleep(Duration::from_millis(50));
    }
    peak = peak.max(v.rss_kib());
    let grew = (peak - before) << 10;
    eprintln!(
        "valed {before} KiB before, {peak} KiB at most beside the flood (+{grew} bytes); \
         root's slowest of {lists} lists {slowest:?}"
    );
    let slack = 12 << 20;
    assert!(
        grew <= USER_REPLY_BYTES + slack,
        "valed grew by {grew} bytes while one user left its replies unread, more than the \
         {USER_REPLY_BYTES} bytes a user may leave unread (+{slack} of slack)"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "root's list took {slowest:?} beside the flood"
    );
    let r = report(&flood.finish(T), "control-flood");
    assert_eq!(r["connected"], conns, "{r}");
    let (answered, errors) = (
        r["answered"].as_u64().unwrap(),
        r["errors"].as_u64().unwrap(),
    );
    assert_eq!(answered + errors, conns as u64, "{r}");
    r
}

#[test]
fn a_user_who_never_reads_holds_bounded_replies_and_root_is_answered_at_once() {
    if !root() {
        return;
    }
    // One at a time: the flood loads the CPUs, and root's answers are timed.
    let _s = serial();
    // Every connection a user may have (--max-conns-per-user, 64) asks for a table whose
    // dump whole is about 20 MB.
    let v = valed_with_a_table(RULES, rule);
    flood_beside_root(&v, 64);
}

#[test]
fn past_its_bound_a_user_s_requests_get_an_error_until_it_reads() {
    if !root() {
        return;
    }
    let _s = serial();
    let v = valed_with_a_table(WIDE_RULES, wide_rule);
    let r = flood_beside_root(&v, 64);
    // Some pages were built, then the user's unread replies reached the bound.
    assert!(r["answered"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["errors"].as_u64().unwrap() > 0,
        "every page was built: {r}"
    );
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("uid 65534") && e.contains(&format!("({USER_REPLY_BYTES})")),
        "{e}"
    );
    // Once read, the user is answered again.
    let out = run_bounded(
        &mut v.tool_as(
            NOBODY,
            1024,
            "vale-ctl",
            &["--json", "flow", "vale0", "dump"],
        ),
        T,
    );
    let t: vale_abi::control::FlowTable =
        serde_json::from_str(&stdout_of(&out, "vale-ctl flow dump")).expect("JSON");
    assert_eq!(t.rules.len(), WIDE_RULES);
}

#[test]
fn a_large_flow_table_is_dumped_page_by_page() {
    if !root() {
        return;
    }
    let _s = serial();
    let v = valed_with_a_table(RULES, rule);
    // A dump that names no position is the first page, which says where the next starts.
    let r = report(
        &ask_as_nobody(
            &v,
            1,
            0,
            r#"{"op":"lookup_control","switch":"vale0","command":"dump"}"#,
        )
        .finish(T),
        "control-flood",
    );
    let first: vale_abi::control::FlowTable =
        serde_json::from_str(r["reply"]["output"].as_str().expect("an answer")).expect("JSON");
    assert_eq!(first.rules.len(), vale_abi::control::FLOW_DUMP_PAGE, "{r}");
    assert!(first.next.is_some(), "{r}");
    // vale-ctl asks page by page: every rule, once, in the order they are tried.
    let out = run_bounded(
        &mut v.tool_as(
            NOBODY,
            1024,
            "vale-ctl",
            &["--json", "flow", "vale0", "dump"],
        ),
        Duration::from_secs(60),
    );
    let t: vale_abi::control::FlowTable =
        serde_json::from_str(&stdout_of(&out, "vale-ctl flow dump")).expect("JSON");
    let ids: Vec<u64> = t.rules.iter().map(|r| r.id).collect();
    assert!(t.next.is_none());
    assert_eq!(ids, (1..=RULES as u64).collect::<Vec<_>>());
}

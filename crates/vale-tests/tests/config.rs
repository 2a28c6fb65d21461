//! The configuration file (`valed --config FILE`, `vale-ctl save`): what is saved comes back
//! after a restart, TAP ports in network namespaces forward again with no action, what cannot
//! be applied is reported and the rest applied, and bad files are refused.
//!
//! The namespace tests need root and iproute2, as host.rs does.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use vale_tests::netns::{unique, Netns};
use vale_tests::*;

fn json(v: &Valed, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&v.ctl_ok(&all)).expect("JSON")
}

/// `vale-ctl --json list NAME`, less what a restart changes by nature: the pid holding a
/// device port is valed's own.
fn list(v: &Valed, name: &str) -> serde_json::Value {
    let mut l = json(v, &["list", name]);
    for p in l[0]["ports"].as_array_mut().expect("ports") {
        if p["kind"] != "native" {
            p["owner_pid"] = serde_json::Value::Null;
        }
    }
    l
}

fn write_config(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write config");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn save_then_restart_gives_back_switches_ports_knobs_modules_and_rules() {
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    let cfg_s = cfg.to_str().unwrap();
    let mut v = Valed::start_with(&["--config", cfg_s]);
    v.ctl_ok(&["create", "vale0:a"]);
    v.ctl_ok(&["create", "vale0:b"]);
    v.ctl_ok(&["set", "vale0", "batch", "64"]);
    v.ctl_ok(&["set", "vale0:a", "moderation", "20"]);
    v.ctl_ok(&["set", "vale0:b", "learn-limit", "7"]);
    v.ctl_ok(&["lookup", "vale0", "flow", "--arg", "default=drop"]);
    v.ctl_ok(&[
        "flow",
        "vale0",
        "add",
        "prio=10 tcp,tp_dst=22 actions=drop",
        "actions=normal",
        "prio=10 udp actions=output:vale0:b",
    ]);
    v.ctl_ok(&["create", "vale1:x"]);
    v.ctl_ok(&["create", "vale1:y"]);
    v.ctl_ok(&[
        "lookup",
        "vale1",
        "vlan",
        "--access",
        "vale1:x=10",
        "--trunk",
        "vale1:y=10,20",
    ]);
    v.ctl_ok(&["create", "vale2:p"]);
    v.ctl_ok(&["lookup", "vale2", "learning", "--arg", "entries=64"]);
    // A vhost-user port with no front end yet: its socket is served again after the restart.
    let sock = cfg_dir.0.join("vm.sock");
    v.ctl_ok(&[
        "attach",
        "vale3:vm",
        "--vhost-user",
        sock.to_str().unwrap(),
        "--queues",
        "2",
    ]);
    // A port a client holds is the client's: it is not saved.
    let _held = v.open("vale1:held");

    let out = v.ctl_ok(&["save"]);
    assert!(out.contains("saved 4 switches, 6 ports"), "{out}");
    let mode = std::fs::metadata(&cfg).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "saved file mode");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(!text.contains("held"), "a held port was saved:\n{text}");
    // The flow rules are the module's saved state, in the order they were added.
    assert!(
        text.contains(
            "state = [\"prio=10 tcp,tp_dst=22 actions=drop\", \"prio=32768 actions=normal\", \
             \"prio=10 udp actions=output:vale0:b\"]"
        ),
        "{text}"
    );
    assert!(!text.contains("rules"), "{text}");

    let state = |v: &Valed| {
        (
            list(v, "vale0"),
            list(v, "vale2"),
            list(v, "vale3"),
            json(v, &["lookup", "vale0"]),
            json(v, &["lookup", "vale1"]),
            json(v, &["lookup", "vale2"]),
            json(v, &["flow", "vale0", "dump"]),
        )
    };
    let before = state(&v);
    drop(_held);
    v.restart_with(&["--config", cfg_s]);
    let after = state(&v);
    assert_eq!(before, after, "state after the restart:\n{text}");
    let vale1 = json(&v, &["list", "vale1"]);
    let names: Vec<&str> = vale1[0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vale1:x", "vale1:y"]);
    assert!(v.log().contains("not_applied=0") || v.log().contains("not_applied\u{1b}"));

    // Saving again gives the same file: the round trip is stable.
    v.ctl_ok(&["save"]);
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), text);
}

#[test]
fn save_needs_a_config_file() {
    let v = Valed::start();
    v.ctl_fails(&["save"], 1, "start it with --config FILE");
}

#[test]
fn a_missing_interface_or_module_is_reported_and_the_rest_applied() {
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    write_config(
        &cfg,
        r#"
[[switch]]
name = "vale0"
batch = 32

[[switch.port]]
name = "eth"
attach = { kind = "nic", iface = "nosuchnic0" }

[[switch.port]]
name = "a"
persistent = true
moderation_us = 5

[[switch.port]]
name = "b"
persistent = true
learn_limit = 99999999

[[switch]]
name = "vale1"
lookup = { module = "/nonexistent/libnothing.so" }

[[switch.port]]
name = "x"
persistent = true

[[switch]]
name = "vale2"
lookup = { module = "flow", rules = ["actions=normal", "prio=5 bogus=1 actions=drop"] }

[[switch.port]]
name = "p"
persistent = true
"#,
        0o644,
    );
    let v = Valed::start_with(&["--config", cfg.to_str().unwrap()]);
    let log = v.log();
    for expected in [
        "port 'vale0:eth'",
        "nosuchnic0",
        "port 'vale0:b' learn-limit",
        "switch 'vale1' lookup /nonexistent/libnothing.so",
        "switch 'vale2' flow state 'prio=5 bogus=1 actions=drop'",
    ] {
        assert!(log.contains(expected), "no report of {expected}:\n{log}");
    }
    assert!(v.port("vale0:eth").is_none());
    let a = v.port("vale0:a").expect("vale0:a applied");
    assert!(a.persistent);
    assert_eq!(a.moderation_us, 5);
    assert!(v.port("vale0:b").unwrap().persistent);
    assert_eq!(list(&v, "vale0")[0]["batch"], 32);
    assert_eq!(json(&v, &["lookup", "vale1"])["module"], "learning");
    let flows = json(&v, &["flow", "vale2", "dump"]);
    assert_eq!(flows["rules"].as_array().unwrap().len(), 1, "{flows}");
}

#[test]
fn bad_config_files_are_refused_with_a_clear_error() {
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    let cfg_s = cfg.to_str().unwrap();
    let refuse = |what: &str, message: &str| {
        let dir = TempDir::new("refuse");
        let out = valed_refusing(&dir.0, &["--config", cfg_s]);
        assert_exit(&out, what, 1, message);
        // --check-config says the same and starts nothing.
        let out = valed_refusing(&dir.0, &["--config", cfg_s, "--check-config"]);
        assert_exit(&out, what, 1, message);
    };
    write_config(
        &cfg,
        "[[switch]]\nname = \"vale0\"\nbatch = \"many\"\n",
        0o644,
    );
    refuse("a wrong type", "line 3:");
    write_config(&cfg, "\n\n[[switch]\nname = \"vale0\"\n", 0o644);
    refuse("a syntax error", "line 3:");
    write_config(&cfg, "[[switch]]\nname = \"vale0\"\nbatchh = 4\n", 0o644);
    refuse("an unknown field", "unknown field `batchh`");
    write_config(&cfg, "[[switch]]\nname = \"vale0\"\n", 0o666);
    refuse("a world-writable file", "is writable by others");
    write_config(&cfg, &"#".repeat(17 << 20), 0o644);
    refuse("an oversized file", "more than the 16777216 bytes");
    std::fs::remove_file(&cfg).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", &cfg).unwrap();
    refuse("a symbolic link", "is a symbolic link");
    std::fs::remove_file(&cfg).unwrap();
    write_config(&cfg, "\u{0}\u{1}\u{ff}garbage", 0o644);
    refuse("binary garbage", "configuration");

    // A good file passes the check; a missing one is an empty configuration.
    write_config(&cfg, "[[switch]]\nname = \"vale0\"\n", 0o644);
    let out = valed_refusing(&cfg_dir.0, &["--config", cfg_s, "--check-config"]);
    assert_exit(&out, "a good file", 0, "");
    std::fs::remove_file(&cfg).unwrap();
    let out = valed_refusing(&cfg_dir.0, &["--config", cfg_s, "--check-config"]);
    assert_exit(&out, "a missing file", 0, "");
}

/// Whether one ping from `ns` to `addr` is answered within 200 ms.
fn ping_once(ns: &Netns, addr: &str) -> bool {
    ns.run(&format!("ping -c 1 -W 0.2 {addr}"), Duration::from_secs(5))
        .status
        .success()
}

#[test]
fn tap_ports_in_namespaces_ping_again_after_a_restart_with_no_action() {
    let home = Netns::new("h");
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    let cfg_s = cfg.to_str().unwrap();
    let mut v = Valed::start_in(&home, &["--config", cfg_s]);
    let mut hosts = Vec::new();
    for (i, p) in ["a", "b"].iter().enumerate() {
        let tap = unique("vcfg");
        v.ctl_ok(&["attach", &format!("vale0:{p}"), "--tap", &tap, "--persist"]);
        let ns = Netns::new(p);
        ns.adopt(Some(&home), &tap, &[&format!("10.78.0.{}/24", i + 1)]);
        hosts.push((ns, tap));
    }
    v.ctl_ok(&["set", "vale0:a", "moderation", "10"]);
    assert!(
        wait_until(Duration::from_secs(10), || ping_once(
            &hosts[0].0,
            "10.78.0.2"
        )),
        "no ping before the restart: {}",
        v.log()
    );
    v.ctl_ok(&["save"]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.contains(&format!("netns = \"{}\"", hosts[0].0.name)),
        "the TAP's namespace is not saved:\n{text}"
    );

    let started = Instant::now();
    v.restart_in(&home, &["--config", cfg_s]);
    let ready = started.elapsed();
    let back = wait_until_every(Duration::from_secs(10), Duration::from_millis(1), || {
        ping_once(&hosts[0].0, "10.78.0.2")
    });
    let forwarding = started.elapsed();
    assert!(back, "no ping after the restart: {}", v.log());
    eprintln!(
        "restart: valed answering {} ms, pings through the switch again {} ms after SIGTERM",
        ready.as_millis(),
        forwarding.as_millis()
    );
    // Target: forwarding back within 1 s; a loaded test machine gets some slack.
    assert!(
        forwarding < Duration::from_secs(3),
        "forwarding back only after {forwarding:?}"
    );
    let a = v.port("vale0:a").expect("vale0:a back");
    assert_eq!(a.kind, "tap");
    assert_eq!(a.state, "up");
    assert_eq!(a.moderation_us, 10);
    assert!(ping_once(&hosts[1].0, "10.78.0.1"), "b to a");
}

#[test]
fn a_nic_port_is_bound_again_after_a_restart() {
    let _g = serial();
    let home = Netns::new("h");
    let far = Netns::new("far");
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    let cfg_s = cfg.to_str().unwrap();
    let mut v = Valed::start_in(&home, &["--config", cfg_s]);
    let tap = unique("vcfg");
    v.ctl_ok(&["attach", "vale0:t", "--tap", &tap, "--persist"]);
    let near = Netns::new("t");
    near.adopt(Some(&home), &tap, &["10.78.1.1/24"]);
    let nic = unique("vnic");
    let peer = unique("vpeer");
    home.ok(&format!(
        "ip link add {nic} type veth peer name {peer} netns {}",
        far.name
    ));
    home.ok(&format!("ip link set {nic} up"));
    far.adopt(None, &peer, &["10.78.1.10/24"]);
    far.ok(&format!("ethtool -K {peer} tso off gso off tx off"));
    v.ctl_ok(&["attach", "vale0:eth", "--iface", &nic]);
    let mode = v.port("vale0:eth").unwrap().mode.unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(10), || ping_once(&far, "10.78.1.1")),
        "no ping before the restart: {}",
        v.log()
    );
    v.ctl_ok(&["save"]);

    let started = Instant::now();
    v.restart_in(&home, &["--config", cfg_s]);
    let back = wait_until_every(Duration::from_secs(10), Duration::from_millis(1), || {
        ping_once(&far, "10.78.1.1")
    });
    assert!(back, "no ping after the restart: {}", v.log());
    eprintln!(
        "restart with a NIC port: pings through the switch again {} ms after SIGTERM",
        started.elapsed().as_millis()
    );
    let p = v.port("vale0:eth").expect("vale0:eth back");
    assert_eq!((p.kind.as_str(), p.state.as_str()), ("nic", "up"));
    // With no --mode, the mode it was bound in is tried first (for a moment: the driver may
    // still be tearing down the old valed's AF_XDP socket).
    assert_eq!(
        p.mode.as_deref(),
        Some(mode.as_str()),
        "bound again in the same mode"
    );
    eprintln!(
        "NIC mode before the restart {mode}, after {}",
        p.mode.unwrap_or_default()
    );
}

/// Largest configuration valed reads (`MAX_CONFIG`), and so the largest `save` writes.
const MAX_CONFIG: u64 = 16 << 20;

/// Flow rule `i` as saved: every rule the same length, less one byte if `short`.
fn wide_rule(i: usize, short: bool) -> String {
    let port = if short {
        1000 + i % 9000
    } else {
        10000 + i % 55000
    };
    format!(
        "prio=100 dl_src=02:00:00:00:00:01,dl_dst=02:00:00:00:00:02,udp,nw_src=10.{}.{}.{},\
         nw_dst=10.200.200.200,tp_src=12345,tp_dst={port} actions=drop",
        100 + i / (156 * 156),
        100 + (i / 156) % 156,
        100 + i % 156
    )
}

/// Makes `rules` the flow table of vale0 (through a rules file).
fn load_rules(v: &Valed, rules: impl Iterator<Item = String>) {
    let text: String = rules.map(|r| r + "\n").collect();
    let file = v.run_dir().join("rules.txt");
    std::fs::write(&file, text).expect("write rules");
    v.ctl_ok(&["lookup", "vale0", "flow", "--rules", file.to_str().unwrap()]);
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).expect("saved file").len()
}

#[test]
fn what_save_writes_valed_reads_up_to_the_byte() {
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    let cfg_s = cfg.to_str().unwrap();
    let mut v = Valed::start_with(&["--config", cfg_s]);
    v.ctl_ok(&["create", "vale0:p"]);
    // What one rule costs in the file, and what the rest does.
    let n0 = 1000;
    load_rules(&v, (0..n0).map(|i| wide_rule(i, false)));
    v.ctl_ok(&["save"]);
    let s0 = size(&cfg);
    v.ctl_ok(&["flow", "vale0", "add", &wide_rule(n0, false)]);
    v.ctl_ok(&["save"]);
    let per_rule = size(&cfg) - s0;
    let rest = s0 - n0 as u64 * per_rule;
    // A table whose file is MAX_CONFIG bytes exactly: `short` rules a byte shorter.
    let n = (MAX_CONFIG - rest).div_ceil(per_rule) as usize;
    let short = (rest + n as u64 * per_rule - MAX_CONFIG) as usize;
    load_rules(&v, (0..n).map(|i| wide_rule(i, i < short)));
    v.ctl_ok(&["save"]);
    assert_eq!(
        size(&cfg),
        MAX_CONFIG,
        "{n} rules of {per_rule} bytes, {short} short"
    );
    let out = valed_refusing(&cfg_dir.0, &["--config", cfg_s, "--check-config"]);
    assert_exit(&out, "a file at the limit", 0, "");

    // One byte more is refused by save, with the old file left whole and nothing beside it.
    let saved = std::fs::read(&cfg).unwrap();
    v.ctl_ok(&["flow", "vale0", "del", "1"]);
    let longer = wide_rule(0, false).replace("prio=100 ", "prio=1000 ");
    v.ctl_ok(&["flow", "vale0", "add", &longer]);
    v.ctl_fails(
        &["save"],
        1,
        &format!(
            "would be {} bytes, more than the {MAX_CONFIG} bytes valed reads at start \
             (switch 'vale0' has {n} lines of flow state): not saved",
            MAX_CONFIG + 1
        ),
    );
    assert!(
        std::fs::read(&cfg).unwrap() == saved,
        "the saved file changed"
    );
    let left: Vec<_> = std::fs::read_dir(&cfg_dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|f| f != "valed.toml")
        .collect();
    assert!(left.is_empty(), "beside the saved file: {left:?}");

    // And what was saved comes back.
    v.restart_with(&["--config", cfg_s]);
    let l = json(&v, &["lookup", "vale0"]);
    let rules = l["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "rules")
        .map(|c| c["value"].clone());
    assert_eq!(rules, Some(serde_json::json!(n)), "{l}");
}

#[test]
fn valed_removes_the_temporaries_of_saves_that_did_not_finish() {
    let cfg_dir = TempDir::new("cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    // A valed killed while saving leaves `.valed.toml.tmpPID`; its pid may since be free, or
    // be another program's.
    let dead = cfg_dir.0.join(".valed.toml.tmp4194305");
    let reused = cfg_dir
        .0
        .join(format!(".valed.toml.tmp{}", std::process::id()));
    let others = [".valed.toml.tmpx", ".other.toml.tmp1", "valed.toml.tmp1"];
    for f in [&dead, &reused] {
        write_config(f, "[[switch]]\nname = \"vale0\"\n", 0o644);
    }
    for f in others {
        write_config(&cfg_dir.0.join(f), "", 0o644);
    }
    let v = Valed::start_with(&["--config", cfg.to_str().unwrap()]);
    assert!(!dead.exists() && !reused.exists(), "{}", v.log());
    for f in others {
        assert!(
            cfg_dir.0.join(f).exists(),
            "{f} is not a temporary of valed.toml"
        );
    }
}

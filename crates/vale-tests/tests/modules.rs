//! Lookup modules end to end: the vlan module's isolation and tagging, modules built outside
//! vale (examples/, in C and in Rust) loaded into a running valed, swaps under a counted
//! stream, results naming no port, and modules that fail to load; a module's own commands
//! (the one `lookup_control` request), from the flow module and from shared objects of every
//! ABI version.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use std::os::unix::net::UnixStream;

use vale_abi::control::{self, ErrorKind, FlowTable, LookupInfo, Reply, Request};
use vale_tests::*;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds C source `src` (a path, or text when `text`) into shared object `out` against
/// vale_lookup.h, every warning an error.
fn build_c(src: &Path, out: &Path) {
    let mut cmd = Command::new("cc");
    cmd.args([
        "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O2",
    ])
    .arg("-I")
    .arg(root().join("crates/vale-switch/include"))
    .arg(src)
    .arg("-o")
    .arg(out);
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (a C compiler is required): {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The C example, built into `dir`.
fn c_example(dir: &Path) -> PathBuf {
    let out = dir.join("libstatic_port.so");
    build_c(&root().join("examples/c-lookup/static_port.c"), &out);
    out
}

/// C text `code` built into `dir/name`.
fn c_module(dir: &Path, name: &str, code: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, code).expect("write C source");
    let out = dir.join(name);
    build_c(&src, &out);
    out
}

/// The Rust example, built by the workspace's build beside the binaries.
fn rust_example() -> PathBuf {
    let p = bin("valed").with_file_name("libvale_example_lookup.so");
    assert!(
        p.is_file(),
        "{} missing: build the workspace first",
        p.display()
    );
    p
}

fn lookup_info(v: &Valed, sw: &str) -> LookupInfo {
    serde_json::from_str(&v.ctl_ok(&["lookup", sw, "--json"])).expect("lookup --json parses")
}

fn counter(l: &LookupInfo, name: &str) -> u64 {
    l.counters
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no counter {name} in {l:?}"))
        .value
}

/// `frame` with an 802.1Q tag of `vid` after its addresses.
fn tag(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    f.splice(12..12, [0x81, 0x00, (vid >> 8) as u8, vid as u8]);
    f
}

const MAC_D: [u8; 6] = [2, 0, 0, 0, 0, 0xd];
const MAC_E: [u8; 6] = [2, 0, 0, 0, 0, 0xe];

/// Sends `frame` from `from` and returns what each of `ports` got. `send_all` returns once
/// the switch has taken the frame back from the sender's ring, which it does only after
/// delivering it everywhere: whatever a port gets, it has by then.
fn deliver(from: &vale::Port, frame: &[u8], ports: &[&vale::Port]) -> Vec<Vec<Vec<u8>>> {
    send_all(from, &[frame.to_vec()]);
    ports.iter().map(|p| recv_frames(p)).collect()
}

#[test]
fn vlans_are_isolated_and_tags_follow_the_ports() {
    let v = Valed::start();
    let a = v.open("vale0:a");
    let b = v.open("vale0:b");
    let c = v.open("vale0:c");
    let d = v.open("vale0:d");
    let up = v.open("vale0:up");
    let x = v.open("vale0:x");
    let out = v.ctl_ok(&[
        "lookup",
        "vale0",
        "vlan",
        "--access",
        "a=10",
        "--access",
        "vale0:b=10",
        "--access",
        "c=20",
        "--access",
        "d=20",
        "--trunk",
        "up=10,20",
    ]);
    assert!(out.starts_with("vale0  lookup vlan  (built-in)\n"), "{out}");
    assert!(out.contains("  arg trunk=vale0:up=10,20\n"), "{out}");
    let all = [&a, &b, &c, &d, &up, &x];
    let none: Vec<Vec<u8>> = Vec::new();

    // a's broadcast: b untagged, the trunk tagged 10, nobody of VLAN 20 or VLAN 1.
    let f = test_frame(60, MAC_A, BROADCAST, 1);
    let got = deliver(&a, &f, &all);
    assert_eq!(got[0], none, "back to the sender");
    assert_eq!(got[1], vec![f.clone()], "b");
    assert_eq!(got[4], vec![tag(&f, 10)], "the trunk, tagged");
    for (i, g) in got.iter().enumerate().skip(2) {
        if i != 4 {
            assert_eq!(g, &none, "port {i} is not in VLAN 10");
        }
    }
    // c's broadcast stays in VLAN 20.
    let f = test_frame(60, MAC_C, BROADCAST, 2);
    let got = deliver(&c, &f, &all);
    assert_eq!(
        got,
        vec![
            none.clone(),
            none.clone(),
            none.clone(),
            vec![f.clone()],
            vec![tag(&f, 20)],
            none.clone()
        ]
    );
    // From the trunk, tagged 20: the tag comes off for c and d; VLAN 10 sees nothing.
    let f = test_frame(60, MAC_E, BROADCAST, 3);
    let got = deliver(&up, &tag(&f, 20), &all);
    assert_eq!(
        got,
        vec![
            none.clone(),
            none.clone(),
            vec![f.clone()],
            vec![f.clone()],
            none.clone(),
            none.clone()
        ]
    );
    // Tagged 10 to a, which VLAN 10 learnt: a only, untagged; and back from a to e, which
    // the trunk's frames taught VLAN 10: the trunk only, tagged. Frames of one slot and
    // chains of several (the tag moves bytes across slot boundaries).
    for len in [60, 1514, 2110, 4000, 9000] {
        let f = test_frame(len, MAC_E, MAC_A, 4);
        let got = deliver(&up, &tag(&f, 10), &all);
        assert_eq!(got[0], vec![f.clone()], "a, len {len}");
        assert!(got[1..].iter().all(|g| g.is_empty()), "only a, len {len}");
        let f = test_frame(len, MAC_A, MAC_E, 4);
        let got = deliver(&a, &f, &all);
        assert_eq!(got[4], vec![tag(&f, 10)], "the trunk, len {len}");
        assert_eq!(
            got.iter().map(Vec::len).sum::<usize>(),
            1,
            "only the trunk, len {len}"
        );
    }
    // a to c's address: c is known in VLAN 20 only, so in VLAN 10 the frame floods.
    let f = test_frame(60, MAC_A, MAC_C, 5);
    let got = deliver(&a, &f, &all);
    assert_eq!(
        got,
        vec![
            none.clone(),
            vec![f.clone()],
            none.clone(),
            none.clone(),
            vec![tag(&f, 10)],
            none.clone()
        ]
    );
    // One batch mixing frames that stay one entry (unicast to b, which VLAN 10 learnt from
    // its answer below) with one that becomes several (a broadcast, to b and, tagged, to the
    // trunk): every port gets its frames in order.
    send_all(&b, &[test_frame(60, MAC_B, MAC_A, 50)]);
    assert_eq!(recv_frames(&a).len(), 1);
    let batch: Vec<Vec<u8>> = vec![
        test_frame(60, MAC_A, MAC_B, 51),
        test_frame(60, MAC_A, BROADCAST, 52),
        test_frame(100, MAC_A, MAC_B, 53),
        test_frame(60, MAC_A, BROADCAST, 54),
    ];
    send_all(&a, &batch);
    assert_eq!(recv_frames(&b), batch, "b, in order");
    assert_eq!(
        recv_frames(&up),
        vec![tag(&batch[1], 10), tag(&batch[3], 10)]
    );
    assert!([&c, &d, &x].iter().all(|p| recv_frames(p).is_empty()));
    // x (not named: VLAN 1) is alone in its VLAN.
    let got = deliver(&x, &test_frame(60, MAC_D, BROADCAST, 6), &all);
    assert!(got.iter().all(|g| g.is_empty()), "{got:?}");
    // Refused at ingress, and counted: a tag of another VLAN on an access port, an untagged
    // frame and a VLAN not allowed on the trunk.
    let got = deliver(&a, &tag(&test_frame(60, MAC_A, BROADCAST, 7), 20), &all);
    assert!(got.iter().all(|g| g.is_empty()), "{got:?}");
    let got = deliver(&up, &test_frame(60, MAC_E, BROADCAST, 8), &all);
    assert!(got.iter().all(|g| g.is_empty()), "{got:?}");
    let got = deliver(&up, &tag(&test_frame(60, MAC_E, BROADCAST, 9), 30), &all);
    assert!(got.iter().all(|g| g.is_empty()), "{got:?}");
    let l = lookup_info(&v, "vale0");
    assert_eq!(l.module, "vlan");
    assert_eq!(counter(&l, "foreign_tag"), 1);
    assert_eq!(counter(&l, "untagged_on_trunk"), 1);
    assert_eq!(counter(&l, "not_allowed"), 1);
    assert_eq!(counter(&l, "vlans"), 3);
    // The senders' counters: every frame sent counted once, the refused ones as drops.
    let ca = v.counters("vale0:a");
    assert_eq!((ca.tx_packets, ca.tx_drops), (12, 1), "{ca:?}");
    let cu = v.counters("vale0:up");
    assert_eq!((cu.tx_packets, cu.tx_drops), (8, 2), "{cu:?}");
    assert_eq!(
        v.counters("vale0:x").tx_drops,
        1,
        "flooded with nobody in VLAN 1"
    );
    // Nothing arrived late anywhere.
    for p in all {
        assert!(recv_frames(p).is_empty(), "{}", p.name());
    }
    assert_eq!(v.counters("vale0:x").rx_packets, 0);
}

/// vale_lookup.h compiles cleanly as C and C++, and its types have the layout of the Rust
/// side's (`FrameMeta`, `CBatch`, `CModule`, ...).
#[test]
fn the_header_matches_the_engine() {
    let dir = TempDir::new("modules");
    let check = r#"
#include <stddef.h>
#include "vale_lookup.h"
#define CHECK(c) _Static_assert(c, #c)
CHECK(sizeof(struct vale_frame) == 24);
CHECK(offsetof(struct vale_frame, first_len) == 8);
CHECK(offsetof(struct vale_frame, len) == 12);
CHECK(offsetof(struct vale_frame, flags) == 16);
CHECK(offsetof(struct vale_frame, dst) == 18);
CHECK(offsetof(struct vale_frame, ring) == 20);
CHECK(sizeof(struct vale_batch) == 24);
CHECK(offsetof(struct vale_batch, src_port) == 12);
CHECK(offsetof(struct vale_batch, now_s) == 16);
CHECK(sizeof(struct vale_arg) == 16);
CHECK(sizeof(struct vale_counter) == 40);
CHECK(offsetof(struct vale_lookup_module, name) == 8);
CHECK(offsetof(struct vale_lookup_module, counters) == 56);
CHECK(offsetof(struct vale_lookup_module, control) == 64);
CHECK(offsetof(struct vale_lookup_module, open_ops) == 72);
CHECK(sizeof(struct vale_lookup_module) == 80);
CHECK(VALE_LOOKUP_ABI_VERSION == 3);
CHECK(VALE_CONTROL_OUT_CAP == 1048576);
CHECK(VALE_DST_FLOOD == 0xffff && VALE_DST_DROP == 0xfffe && VALE_MAX_PORTS == 2048);
CHECK(VALE_NS_NO_LEARN == 0x0008);
const struct vale_lookup_module *vale_lookup_module(void) { return 0; }
"#;
    c_module(&dir.0, "libcheck.so", check);
    let src = dir.0.join("check.cc");
    std::fs::write(&src, check.replace("_Static_assert", "static_assert")).unwrap();
    let mut cxx = Command::new("c++");
    cxx.args([
        "-std=c++11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fsyntax-only",
        "-I",
    ])
    .arg(root().join("crates/vale-switch/include"))
    .arg(&src);
    let o = cxx.output().expect("c++");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn modules_built_outside_vale_are_loaded_and_forward() {
    let v = Valed::start();
    let dir = TempDir::new("modules");
    let (a, b, c) = v.open_abc();
    // The C example: everything to c; c's own frames flood.
    let so = c_example(&dir.0);
    let so_s = so.to_str().unwrap();
    let out = v.ctl_ok(&["lookup", "vale0", so_s, "--arg", "to=vale0:c"]);
    assert!(
        out.starts_with(&format!("vale0  lookup static_port  ({so_s})\n")),
        "{out}"
    );
    let f = test_frame(60, MAC_A, MAC_B, 1);
    let got = deliver(&a, &f, &[&b, &c]);
    assert_eq!(got, vec![vec![], vec![f]]);
    let got = deliver(&c, &test_frame(60, MAC_C, MAC_A, 2), &[&a, &b]);
    assert!(got.iter().all(|g| g.len() == 1), "{got:?}");
    let l = lookup_info(&v, "vale0");
    assert_eq!((counter(&l, "sent"), counter(&l, "flooded")), (1, 1));
    assert_eq!(counter(&l, "bad_dst"), 0);
    assert_eq!(l.args[0].key, "to");

    // The Rust example: a learning bridge. A relative path is taken from vale-ctl's
    // directory.
    let so = rust_example();
    let out = Command::new(bin("vale-ctl"))
        .current_dir(so.parent().unwrap())
        .args(["--run-dir", v.run_dir().to_str().unwrap()])
        .args([
            "lookup",
            "vale0",
            "./libvale_example_lookup.so",
            "--arg",
            "entries=64",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lookup_info(&v, "vale0").module, "mini_learning");
    let f = test_frame(60, MAC_A, BROADCAST, 3);
    assert_eq!(deliver(&a, &f, &[&b, &c]), vec![vec![f.clone()], vec![f]]);
    // b answers a: a is known, c gets nothing.
    let f = test_frame(60, MAC_B, MAC_A, 4);
    assert_eq!(deliver(&b, &f, &[&a, &c]), vec![vec![f], vec![]]);
    let l = lookup_info(&v, "vale0");
    assert_eq!(counter(&l, "learnt"), 2, "{l:?}");
    assert_eq!(counter(&l, "floods"), 1, "{l:?}");
    // Back to the default.
    v.ctl_ok(&["lookup", "vale0", "learning"]);
    let l = lookup_info(&v, "vale0");
    assert_eq!(
        (l.module.as_str(), l.source.as_str()),
        ("learning", "built-in")
    );
}

#[test]
fn results_naming_no_port_are_counted_drops() {
    let v = Valed::start();
    let dir = TempDir::new("modules");
    let (a, b) = v.open_ab();
    let so = c_example(&dir.0);
    // Port 1 is b; port 7 is free; 4000 is beyond any switch.
    for (index, bad) in [("7", 10), ("4000", 10)] {
        v.ctl_ok(&[
            "lookup",
            "vale0",
            so.to_str().unwrap(),
            "--arg",
            &format!("index={index}"),
        ]);
        let before = v.counters("vale0:a").tx_drops;
        let frames: Vec<Vec<u8>> = (0..10).map(|i| test_frame(60, MAC_A, MAC_B, i)).collect();
        send_all(&a, &frames);
        assert!(recv_frames(&b).is_empty(), "index {index}");
        assert_eq!(v.counters("vale0:a").tx_drops - before, 10, "index {index}");
        assert_eq!(
            counter(&lookup_info(&v, "vale0"), "bad_dst"),
            bad,
            "index {index}"
        );
    }
    v.ctl_ok(&["lookup", "vale0", so.to_str().unwrap(), "--arg", "index=1"]);
    let f = test_frame(60, MAC_A, MAC_B, 99);
    assert_eq!(deliver(&a, &f, &[&b]), vec![vec![f]]);
    assert_eq!(v.counters("vale0:b").rx_drops, 0);
}

/// A version 1 module: every frame to port index 1, ring 1 (which version 1 ignored).
const V1_RING_MODULE: &str = r#"
#include "vale_lookup.h"
static void *create(const struct vale_arg *a, uint32_t n, char *err, size_t len) {
    (void)a; (void)n; (void)err; (void)len;
    static int state;
    return &state;
}
static void destroy(void *s) { (void)s; }
static uint64_t lookup(void *s, struct vale_batch *b) {
    (void)s;
    for (uint32_t i = 0; i < b->count; i++) { b->frames[i].dst = 1; b->frames[i].ring = 1; }
    return 0;
}
static const struct vale_lookup_module m = {
    .abi_version = 1, .name = "v1_ring", .create = create, .destroy = destroy, .lookup = lookup,
};
const struct vale_lookup_module *vale_lookup_module(void) { return &m; }
"#;

#[test]
fn a_module_picks_the_receiving_ring() {
    let v = Valed::start();
    let dir = TempDir::new("modules");
    let a = v.open("vale0:a");
    let b = v
        .options()
        .rings(1, 2)
        .open("vale0:b")
        .expect("open vale0:b with 2 rx rings");
    let so = c_example(&dir.0);
    let frames: Vec<Vec<u8>> = (0..10).map(|i| test_frame(60, MAC_A, MAC_B, i)).collect();
    // send_all returns once valed took every frame: each is delivered or dropped by then.
    for (ring, want, drops) in [("1", [0, 10], 0), ("0", [10, 0], 0), ("2", [0, 0], 10)] {
        v.ctl_ok(&[
            "lookup",
            "vale0",
            so.to_str().unwrap(),
            "--arg",
            "to=vale0:b",
            "--arg",
            &format!("ring={ring}"),
        ]);
        let before = v.counters("vale0:a").tx_drops;
        send_all(&a, &frames);
        let got = [recv_ring(&b, 0).len(), recv_ring(&b, 1).len()];
        assert_eq!(got, want, "ring={ring}");
        // A ring b does not have: counted drops of the sender.
        assert_eq!(
            v.counters("vale0:a").tx_drops - before,
            drops,
            "ring={ring}"
        );
    }
    assert_eq!(v.counters("vale0:b").rx_drops, 0);
    // A version 1 module's ring is not a result: the frames go where the switch puts them.
    let old = c_module(&dir.0, "libv1ring.so", V1_RING_MODULE);
    v.ctl_ok(&["lookup", "vale0", old.to_str().unwrap()]);
    send_all(&a, &frames);
    assert_eq!([recv_ring(&b, 0).len(), recv_ring(&b, 1).len()], [10, 0]);
}

/// A module of ABI version 99, one whose create() refuses, one missing a required function.
const BAD_MODULE: &str = r#"
#include "vale_lookup.h"
static void *create(const struct vale_arg *a, uint32_t n, char *err, size_t len) {
    (void)a; (void)n;
    if (len > 6) { err[0] = 'n'; err[1] = 'o'; err[2] = ' '; err[3] = 'w'; err[4] = 'a'; err[5] = 'y'; err[6] = 0; }
    return 0;
}
static void destroy(void *s) { (void)s; }
uint64_t lookup(void *s, struct vale_batch *b);
uint64_t lookup(void *s, struct vale_batch *b) { (void)s; (void)b; return 0; }
static const struct vale_lookup_module m = {
    .abi_version = @VERSION@, .name = "bad", .create = create, .destroy = destroy,
    .lookup = @LOOKUP@,
};
const struct vale_lookup_module *vale_lookup_module(void) { return &m; }
"#;

#[test]
fn modules_that_fail_to_load_leave_the_old_one() {
    let v = Valed::start();
    let dir = TempDir::new("modules");
    let (a, b, c) = v.open_abc();
    let good = [
        "lookup", "vale0", "vlan", "--access", "a=10", "--access", "b=10", "--access", "c=20",
    ];
    v.ctl_ok(&good);
    let before = lookup_info(&v, "vale0");
    let variant = |name: &str, version: &str, lookup: &str| {
        c_module(
            &dir.0,
            name,
            &BAD_MODULE
                .replace("@VERSION@", version)
                .replace("@LOOKUP@", lookup),
        )
    };
    let wrong_version = variant("libv99.so", "99", "lookup");
    let refuses = variant("librefuses.so", "VALE_LOOKUP_ABI_VERSION", "lookup");
    let no_lookup = variant("libnolookup.so", "VALE_LOOKUP_ABI_VERSION", "0");
    let no_symbol = c_module(&dir.0, "libnosymbol.so", "int vale_something_else = 1;\n");
    let not_elf = dir.0.join("libtext.so");
    std::fs::write(&not_elf, "not a shared object\n").unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![path(&wrong_version)],
            "is built for lookup ABI version 99; this valed speaks versions 1 to 3",
        ),
        (vec![path(&no_symbol)], "has no symbol 'vale_lookup_module'"),
        (vec![path(&refuses)], "refused its configuration: no way"),
        (vec![path(&no_lookup)], "lacks a required function"),
        (vec![path(&not_elf)], "cannot load lookup module"),
        (
            vec![path(&dir.0.join("nosuch.so"))],
            "cannot load lookup module",
        ),
        (
            vec![
                path(&c_example(&dir.0)),
                "--arg".into(),
                "colour=red".into(),
            ],
            "unknown argument 'colour'",
        ),
        (
            vec!["nosuch".into()],
            "no lookup module 'nosuch' (known: learning, hub, vlan",
        ),
        (
            vec!["vlan".into(), "--access".into(), "a=5000".into()],
            "from 1 to 4094",
        ),
        (
            vec!["hub".into(), "--arg".into(), "x=1".into()],
            "module 'hub' takes no arguments",
        ),
    ];
    for (args, message) in &cases {
        let mut all = vec!["lookup", "vale0"];
        all.extend(args.iter().map(String::as_str));
        v.ctl_fails(&all, 1, message);
        let now = lookup_info(&v, "vale0");
        assert_eq!(
            (&now.module, &now.args),
            (&before.module, &before.args),
            "{args:?} changed the module"
        );
    }
    // Usage errors vale-ctl sees itself.
    v.ctl_fails(
        &["lookup", "vale0", "hub", "--access", "a=1"],
        2,
        "configure the vlan module only",
    );
    v.ctl_fails(
        &["lookup", "vale0", "vlan", "--access", "vale1:a=1"],
        2,
        "is not on switch 'vale0'",
    );
    v.ctl_fails(&["lookup", "vale9"], 1, "no such switch 'vale9'");
    // And the old module still works: a's broadcast reaches b, not c.
    let f = test_frame(60, MAC_A, BROADCAST, 1);
    assert_eq!(deliver(&a, &f, &[&b, &c]), vec![vec![f], vec![]]);
}

#[test]
fn a_swap_under_a_counted_stream_loses_and_duplicates_nothing() {
    let _s = serial();
    let v = Valed::start_with(&["--workers", "2"]);
    let dir = TempDir::new("modules");
    let so_c = c_example(&dir.0);
    let so_rust = rust_example();
    v.ctl_ok(&["create", "vale0:a"]);
    let modules: Vec<Vec<String>> = vec![
        vec!["hub".into()],
        vec![
            so_c.to_str().unwrap().into(),
            "--arg".into(),
            "to=vale0:b".into(),
        ],
        vec!["vlan".into()],
        vec![so_rust.to_str().unwrap().into()],
        vec!["learning".into()],
    ];
    let commands: Vec<Vec<&str>> = modules
        .iter()
        .map(|m| {
            ["lookup", "vale0"]
                .into_iter()
                .chain(m.iter().map(String::as_str))
                .collect()
        })
        .collect();
    // Broadcast, so that every module sends each frame to b, and only to b.
    let swaps = stream_while(&v, &commands);
    assert!(swaps >= 5, "only {swaps} swaps during the stream");
}

/// An Ethernet + IPv4 + UDP frame of 60 bytes from MAC_D to broadcast, `seq` in its payload.
fn udp_frame(src: [u8; 4], dst: [u8; 4], dport: u16, seq: u8) -> Vec<u8> {
    let mut f = test_frame(60, MAC_D, BROADCAST, seq as u64);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip.copy_from_slice(&[
        0x45, 0, 0, 46, 0, 0, 0, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    f[34..36].copy_from_slice(&1000u16.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[42] = seq;
    f
}

fn flows(v: &Valed, sw: &str) -> vale_abi::control::FlowTable {
    serde_json::from_str(&v.ctl_ok(&["flow", sw, "dump", "--json"])).expect("dump --json parses")
}

fn hits(t: &vale_abi::control::FlowTable, id: u64) -> u64 {
    t.rules
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no rule {id} in {t:?}"))
        .hits
}

#[test]
fn flow_rules_from_a_file_send_each_frame_where_they_say() {
    let v = Valed::start();
    let dir = TempDir::new("flow");
    let a = v.open("vale0:a");
    let b = v.open("vale0:b");
    let c = v.open("vale0:c");
    let rules = dir.0.join("rules.txt");
    std::fs::write(
        &rules,
        "# the table of this test\n\
         prio=100 in_port=vale0:c actions=drop\n\
         prio=50 ip,nw_dst=10.0.0.2,udp,tp_dst=4321 actions=output:vale0:b\n\
         \n\
         prio=40 udp,nw_dst=10.0.0.0/8 actions=output:vale0:c\n\
         prio=30 udp actions=flood\n\
         prio=35 udp,tp_dst=7 actions=output:vale0:later\n\
         prio=10 dl_type=0x88b5 actions=drop\n",
    )
    .unwrap();
    let out = v.ctl_ok(&[
        "lookup",
        "vale0",
        "flow",
        "--rules",
        rules.to_str().unwrap(),
    ]);
    assert!(out.starts_with("vale0  lookup flow  (built-in)\n"), "{out}");
    assert!(out.contains("  arg rules=(6 rules at load"), "{out}");
    let all = [&a, &b, &c];
    let none: Vec<Vec<u8>> = Vec::new();
    let to_b = udp_frame([10, 0, 0, 1], [10, 0, 0, 2], 4321, 1);
    assert_eq!(
        deliver(&a, &to_b, &all),
        vec![none.clone(), vec![to_b.clone()], none.clone()]
    );
    let to_c = udp_frame([10, 0, 0, 1], [10, 9, 9, 9], 4321, 2);
    assert_eq!(
        deliver(&a, &to_c, &all),
        vec![none.clone(), none.clone(), vec![to_c.clone()]]
    );
    let flood = udp_frame([10, 0, 0, 1], [192, 168, 0, 1], 53, 3);
    assert_eq!(
        deliver(&a, &flood, &all),
        vec![none.clone(), vec![flood.clone()], vec![flood.clone()]]
    );
    // From c, everything is dropped.
    assert_eq!(
        deliver(&c, &to_b, &all),
        vec![none.clone(), none.clone(), none.clone()]
    );
    // Neither IP nor the dropped type: no rule, the bridge floods.
    let other = test_frame(60, MAC_D, BROADCAST, 4);
    let mut other2 = other.clone();
    other2[12..14].copy_from_slice(&0x88b6u16.to_be_bytes());
    assert_eq!(
        deliver(&a, &other, &all),
        vec![none.clone(), none.clone(), none.clone()]
    );
    assert_eq!(
        deliver(&a, &other2, &all),
        vec![none.clone(), vec![other2.clone()], vec![other2.clone()]]
    );
    // A port the rules name before it exists: counted drops, then delivery once it comes.
    let seven = udp_frame([1, 1, 1, 1], [2, 2, 2, 2], 7, 5);
    assert_eq!(
        deliver(&a, &seven, &all),
        vec![none.clone(), none.clone(), none.clone()]
    );
    assert_eq!(counter(&lookup_info(&v, "vale0"), "no_port"), 1);
    let later = v.open("vale0:later");
    assert_eq!(
        deliver(&a, &seven, &[&later, &b]),
        vec![vec![seven.clone()], none.clone()]
    );

    let t = flows(&v, "vale0");
    assert_eq!(t.default, "normal");
    assert_eq!(t.missed, 1, "{t:?}");
    let got: Vec<(u64, u64)> = t.rules.iter().map(|r| (r.id, r.hits)).collect();
    assert_eq!(got, vec![(1, 1), (2, 1), (3, 1), (5, 2), (4, 1), (6, 1)]);
    assert_eq!(t.rules[1].matches, "udp,nw_dst=10.0.0.2/32,tp_dst=4321");

    // A bad rule anywhere refuses the file, naming the line; the table stays.
    let bad = dir.0.join("bad.txt");
    std::fs::write(
        &bad,
        "udp actions=drop\n\nudp,nw_dst=10.0.0.0/40 actions=drop\n",
    )
    .unwrap();
    v.ctl_fails(
        &["flow", "vale0", "add", "--rules", bad.to_str().unwrap()],
        1,
        "bad.txt: bad rule at line 3, 'udp,nw_dst=10.0.0.0/40 actions=drop': 'nw_dst=10.0.0.0/40': '/40' is not a prefix length (0 to 32)",
    );
    v.ctl_fails(
        &["lookup", "vale0", "flow", "--rules", bad.to_str().unwrap()],
        1,
        "bad.txt: bad rule at line 3",
    );
    v.ctl_fails(
        &["flow", "vale0", "add", "udp actions=output:vale1:x"],
        1,
        "port 'vale1:x' is not on switch 'vale0'",
    );
    v.ctl_fails(
        &[
            "lookup",
            "vale0",
            "flow",
            "--arg",
            "rules=actions=output:vale1:x",
        ],
        1,
        "port 'vale1:x' is not on switch 'vale0'",
    );
    assert_eq!(flows(&v, "vale0").rules.len(), 6);
    assert_eq!(lookup_info(&v, "vale0").module, "flow");
    // Changes take effect at once; counters of the rules that stay go on.
    v.ctl_ok(&[
        "flow",
        "vale0",
        "add",
        "prio=60 udp,tp_dst=4321 actions=output:vale0:c",
    ]);
    assert_eq!(
        deliver(&a, &to_b, &all),
        vec![none.clone(), none.clone(), vec![to_b.clone()]]
    );
    let out = v.ctl_ok(&["flow", "vale0", "del", "prio=60 udp,tp_dst=4321"]);
    assert!(out.contains("deleted 1\n  id=7"), "{out}");
    assert_eq!(
        deliver(&a, &to_b, &all),
        vec![none.clone(), vec![to_b.clone()], none.clone()]
    );
    assert_eq!(hits(&flows(&v, "vale0"), 2), 2);
    v.ctl_ok(&["flow", "vale0", "del", "2"]);
    v.ctl_fails(&["flow", "vale0", "del", "2"], 1, "no rule with id 2");
    assert_eq!(
        deliver(&a, &to_b, &all),
        vec![none.clone(), none.clone(), vec![to_b.clone()]]
    );
    // Not a flow switch: said so.
    v.ctl_ok(&["lookup", "vale0", "learning"]);
    v.ctl_fails(
        &["flow", "vale0", "dump"],
        1,
        "lookup module 'learning' has no command 'dump': it takes no commands; the flow \
         commands need the flow module",
    );
    v.ctl_fails(&["flow", "vale9", "dump"], 1, "no such switch 'vale9'");
}

#[test]
fn flow_changes_under_a_counted_stream_lose_and_duplicate_nothing() {
    let _s = serial();
    let v = Valed::start_with(&["--workers", "2"]);
    v.ctl_ok(&["create", "vale0:a"]);
    v.ctl_ok(&["create", "vale0:b"]);
    v.ctl_ok(&[
        "lookup",
        "vale0",
        "flow",
        "--arg",
        "rules=prio=1 actions=output:vale0:b",
    ]);
    // Every rule that comes and goes sends the stream (udp 10.0.0.1 -> 10.0.0.2, port 4321)
    // to b, or does not match it: whatever table a batch meets, each frame goes to b once.
    let steps: [&[&str]; 6] = [
        &["add", "prio=10 udp,tp_dst=4321 actions=output:vale0:b"],
        &["add", "prio=20 tcp actions=drop"],
        &["add", "prio=30 ip,nw_dst=10.0.0.0/8 actions=output:vale0:b"],
        &["del", "prio=10 udp,tp_dst=4321"],
        &["del", "tcp"],
        &["del", "ip,nw_dst=10.0.0.0/8"],
    ];
    let commands: Vec<Vec<&str>> = steps
        .iter()
        .map(|c| {
            ["flow", "vale0"]
                .into_iter()
                .chain(c.iter().copied())
                .collect()
        })
        .collect();
    let changes = stream_while(&v, &commands);
    assert!(changes >= 6, "only {changes} changes during the stream");
    // No frame missed every rule (rule 1 matches them all), and rule 1 counted no more than
    // were sent (the rules deleted took their hits along, so exact sums cannot be checked).
    let t = flows(&v, "vale0");
    assert_eq!(t.missed, 0);
    assert!(hits(&t, 1) <= STREAM);
}

/// `vale-pktgen --flows N` spreads its frames over N UDP flows (source ports 1024 on), one
/// frame each in turn: a flow table on the source port splits the stream exactly.
#[test]
fn pktgen_flows_split_by_a_flow_table() {
    let _s = serial();
    let v = Valed::start();
    for p in ["vale0:a", "vale0:b", "vale0:c"] {
        v.ctl_ok(&["create", p]);
    }
    v.ctl_ok(&["lookup", "vale0", "flow", "--arg", "default=drop"]);
    v.ctl_ok(&[
        "flow",
        "vale0",
        "add",
        "udp,tp_src=1024 actions=output:vale0:b",
    ]);
    v.ctl_ok(&[
        "flow",
        "vale0",
        "add",
        "udp,tp_src=1025 actions=output:vale0:c",
    ]);
    let rx: Vec<_> = ["vale0:b", "vale0:c"]
        .iter()
        .map(|p| {
            v.spawn_client(
                v.pktgen(&["-i", p, "-f", "rx", "-T", "60"]),
                "vale-pktgen rx",
                p,
            )
        })
        .collect();
    let tx = v.pktgen(&[
        "-i", "vale0:a", "-f", "tx", "-n", "3000", "--flows", "3", "-q",
    ]);
    let out = Kid::spawn(tx, "vale-pktgen tx").finish(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Flows 1024 and 1025 each take a third; 1026 matches no rule (default: drop).
    assert!(
        wait_until(T, || {
            let (b, c) = (v.counters("vale0:b"), v.counters("vale0:c"));
            b.rx_packets + b.rx_drops == 1000 && c.rx_packets + c.rx_drops == 1000
        }),
        "b {:?} c {:?}",
        v.counters("vale0:b"),
        v.counters("vale0:c")
    );
    let a = v.counters("vale0:a");
    assert_eq!((a.tx_packets, a.tx_drops), (3000, 1000), "{a:?}");
    drop(rx);
}

/// Frames in [`stream_while`]'s stream.
const STREAM: u64 = 300_000;

/// A counted stream of [`STREAM`] frames from `vale0:a` to a receiver on `vale0:b` (which it
/// opens), while another thread runs `commands` through vale-ctl in turn, over and over, until
/// the stream is sent; then checks that every frame left a and reached b (delivered or
/// dropped for want of room) exactly once. How many commands ran.
fn stream_while(v: &Valed, commands: &[Vec<&str>]) -> u32 {
    let rx = v.spawn_client(
        v.pktgen(&["-i", "vale0:b", "-f", "rx", "-T", "120", "--slots", "4096"]),
        "vale-pktgen rx",
        "vale0:b",
    );
    let n = STREAM.to_string();
    let ran = AtomicU32::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut k = 0;
            while !done.load(Ordering::Relaxed) {
                v.ctl_ok(&commands[k % commands.len()]);
                ran.fetch_add(1, Ordering::Relaxed);
                k += 1;
            }
        });
        let tx = v.pktgen(&["-i", "vale0:a", "-f", "tx", "-n", &n, "-R", "100000", "-q"]);
        let out = Kid::spawn(tx, "vale-pktgen tx").finish(Duration::from_secs(60));
        done.store(true, Ordering::Relaxed);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    assert!(
        wait_until(T, || {
            let b = v.counters("vale0:b");
            b.rx_packets + b.rx_drops >= STREAM
        }),
        "{:?}",
        v.counters("vale0:b")
    );
    let (a, b) = (v.counters("vale0:a"), v.counters("vale0:b"));
    assert_eq!(a.tx_packets, STREAM, "{a:?}");
    assert_eq!(a.tx_drops, 0, "frames lost by the lookup: {a:?}");
    assert_eq!(
        b.rx_packets + b.rx_drops,
        STREAM,
        "lost or duplicated: {b:?}"
    );
    drop(rx);
    ran.load(Ordering::Relaxed)
}

const NOBODY: u32 = 65534;

/// Command `op` with `body` of switch `sw`'s lookup module, sent by this process (root, an
/// administrator) as one request: the module's name and answer, or the refusal's kind and
/// words.
fn command(
    v: &Valed,
    sw: &str,
    op: &str,
    body: &str,
) -> Result<(String, String), (ErrorKind, String)> {
    let sock = UnixStream::connect(v.run_dir().join(control::SOCKET_NAME)).expect("connect");
    let req = Request::LookupControl {
        switch: sw.into(),
        command: op.into(),
        body: body.into(),
    };
    match control::exchange(&sock, &req).expect("exchange") {
        Some((Reply::LookupControl { module, output }, _)) => Ok((module, output)),
        Some((Reply::Error { kind, message }, _)) => Err((kind, message)),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// The same command sent by user nobody (not an administrator; valed's socket must let it
/// in): control-flood's report of the one reply.
fn command_as_nobody(v: &Valed, sw: &str, op: &str, body: &str) -> serde_json::Value {
    let sock = v.run_dir().join(control::SOCKET_NAME);
    let json =
        serde_json::json!({"op": "lookup_control", "switch": sw, "command": op, "body": body})
            .to_string();
    let args = [sock.to_str().unwrap(), "ask", "1", "0", &json];
    report(
        &run_bounded(&mut v.tool_as(NOBODY, 1024, "control-flood", &args), T),
        "control-flood",
    )
}

fn am_root() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// The flow module's commands through the one generic request: add, del and dump answer a
/// `FlowTable`; each refusal has its kind; a module without commands refuses them as
/// unsupported; reading is anyone's, changing is an administrator's.
#[test]
fn flow_commands_go_through_the_one_lookup_request() {
    let v = Valed::start_with(&["--socket-mode", "666"]);
    v.ctl_ok(&["create", "vale0:a"]);
    // The learning bridge takes no commands.
    let (kind, message) = command(&v, "vale0", "dump", "").unwrap_err();
    assert_eq!(kind, ErrorKind::Unsupported, "{message}");
    assert!(
        message.contains("lookup module 'learning' has no command 'dump'"),
        "{message}"
    );
    let (kind, _) = command(&v, "vale9", "dump", "").unwrap_err();
    assert_eq!(kind, ErrorKind::NotFound);

    v.ctl_ok(&["lookup", "vale0", "flow"]);
    let (module, out) = command(
        &v,
        "vale0",
        "add",
        "prio=5 udp actions=drop\narp actions=flood",
    )
    .unwrap();
    assert_eq!(module, "flow");
    let added: FlowTable = serde_json::from_str(&out).expect("a FlowTable");
    assert_eq!(added.rules.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2]);
    let (kind, message) = command(&v, "vale0", "add", "udp,bogus=1 actions=drop").unwrap_err();
    assert_eq!(kind, ErrorKind::InvalidArgument, "{message}");
    assert!(message.contains("bad rule at line 1"), "{message}");
    let (kind, message) = command(&v, "vale0", "add", "actions=output:vale1:x").unwrap_err();
    assert_eq!(kind, ErrorKind::InvalidArgument);
    assert!(message.contains("is not on switch 'vale0'"), "{message}");
    let (kind, message) = command(&v, "vale0", "frobnicate", "").unwrap_err();
    assert_eq!(kind, ErrorKind::Unsupported);
    assert_eq!(
        message,
        "lookup module 'flow' has no command 'frobnicate' (known: add, del, dump)"
    );
    let (kind, _) = command(&v, "vale0", "del", "99").unwrap_err();
    assert_eq!(kind, ErrorKind::NotFound);
    let (_, out) = command(&v, "vale0", "dump", "").unwrap();
    let t: FlowTable = serde_json::from_str(&out).unwrap();
    assert_eq!(t.rules.len(), 2);

    if !am_root() {
        eprintln!("skipped the part as another user: needs root");
        return;
    }
    let r = command_as_nobody(&v, "vale0", "add", "actions=drop");
    assert_eq!(r["errors"], 1, "{r}");
    assert_eq!(r["kind"], "permission_denied", "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("needs an administrator"),
        "{r}"
    );
    let r = command_as_nobody(&v, "vale0", "dump", "");
    assert_eq!(r["answered"], 1, "{r}");
    let t: FlowTable = serde_json::from_str(r["reply"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(t.rules.len(), 2, "nobody's add changed nothing");
}

/// A version 3 module with commands: `echo` (open to anyone) answers its body, `fail`
/// refuses with its reason, and three hostile answers (a length past its room, bytes that
/// are not UTF-8, an answer too large) are refused clearly.
const V3_CONTROL_MODULE: &str = r#"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "vale_lookup.h"
static void *create(const struct vale_arg *a, uint32_t n, char *err, size_t len) {
    (void)a; (void)n; (void)err; (void)len;
    static int state;
    return &state;
}
static void destroy(void *s) { (void)s; }
static uint64_t lookup(void *s, struct vale_batch *b) {
    (void)s;
    for (uint32_t i = 0; i < b->count; i++) b->frames[i].dst = VALE_DST_FLOOD;
    return 0;
}
static char restored[256];
static size_t restored_len;
static int control(void *s, const char *op, const char *body, size_t body_len, char *out,
                   size_t cap, size_t *out_len) {
    (void)s;
    if (strcmp(op, "echo") == 0) {
        if (body_len + 5 > cap) return ERANGE;
        memcpy(out, "echo ", 5);
        memcpy(out + 5, body, body_len);
        *out_len = body_len + 5;
        return 0;
    }
    if (strcmp(op, "fail") == 0) {
        const char *why = "no fail today";
        memcpy(out, why, strlen(why));
        *out_len = strlen(why);
        return EINVAL;
    }
    if (strcmp(op, "overlong") == 0) { out[0] = 'x'; *out_len = cap + 4096; return 0; }
    if (strcmp(op, "latin1") == 0) { out[0] = (char)0xe9; *out_len = 1; return 0; }
    if (strcmp(op, "huge") == 0) return ERANGE;
    /* What valed keeps in its configuration, and what it gave back at its start. */
    if (strcmp(op, VALE_OP_SAVE) == 0) {
        const char *lines = "line one\nline two";
        memcpy(out, lines, strlen(lines));
        *out_len = strlen(lines);
        return 0;
    }
    if (strcmp(op, VALE_OP_RESTORE) == 0) {
        if (body_len >= sizeof restored) return ERANGE;
        memcpy(restored, body, body_len);
        restored_len = body_len;
        return 0;
    }
    if (strcmp(op, "sleep") == 0) {
        /* A command that takes its body's number of seconds (at most 30). */
        char n[8] = {0};
        memcpy(n, body, body_len < sizeof n - 1 ? body_len : sizeof n - 1);
        int secs = atoi(n);
        sleep(secs > 30 ? 30 : (unsigned)secs);
        return 0;
    }
    if (strcmp(op, "restored") == 0) {
        memcpy(out, restored, restored_len);
        *out_len = restored_len;
        return 0;
    }
    return EOPNOTSUPP;
}
static const char *const open_ops[] = {"echo", "sleep", NULL};
static const struct vale_lookup_module m = {
    .abi_version = VALE_LOOKUP_ABI_VERSION, .name = "v3", .create = create,
    .destroy = destroy, .lookup = lookup, .control = control, .open_ops = open_ops,
};
const struct vale_lookup_module *vale_lookup_module(void) { return &m; }
"#;

#[test]
fn a_v3_module_answers_its_commands_and_hostile_answers_are_refused() {
    let dir = TempDir::new("modules");
    let cfg = dir.0.join("valed.toml");
    let args = ["--socket-mode", "666", "--config", cfg.to_str().unwrap()];
    let mut v = Valed::start_with(&args);
    v.ctl_ok(&["create", "vale0:a"]);
    let so = c_module(&dir.0, "libv3.so", V3_CONTROL_MODULE);
    v.ctl_ok(&["lookup", "vale0", so.to_str().unwrap()]);
    assert_eq!(
        command(&v, "vale0", "echo", "hello\nworld"),
        Ok(("v3".to_string(), "echo hello\nworld".to_string()))
    );
    let cases = [
        (
            "fail",
            ErrorKind::InvalidArgument,
            "lookup module 'v3' refused 'fail': no fail today",
        ),
        (
            "overlong",
            ErrorKind::Io,
            "out_len 1052672, more than the 1048576 bytes of room",
        ),
        ("latin1", ErrorKind::Io, "with text that is not UTF-8"),
        (
            "huge",
            ErrorKind::LimitReached,
            "its answer may be at most 1048576 bytes",
        ),
        (
            "nosuch",
            ErrorKind::Unsupported,
            "lookup module 'v3' has no command 'nosuch'",
        ),
        (
            "vale.save",
            ErrorKind::InvalidArgument,
            "'vale.save' is reserved",
        ),
    ];
    for (op, kind, words) in cases {
        let (k, message) = command(&v, "vale0", op, "").unwrap_err();
        assert_eq!(k, kind, "{op}: {message}");
        assert!(message.contains(words), "{op}: {message}");
    }
    // vale-ctl's generic command prints the answer as it is; `-` reads the body from stdin.
    assert_eq!(
        v.ctl_ok(&["module", "vale0", "echo", "hi there"]),
        "echo hi there\n"
    );
    let mut ctl = tool("vale-ctl", v.run_dir(), &["module", "vale0", "echo", "-"]);
    let mut kid = ctl
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("vale-ctl");
    use std::io::Write as _;
    kid.stdin
        .take()
        .unwrap()
        .write_all(b"from\nstdin\n")
        .unwrap();
    let out = kid.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo from\nstdin\n");
    let j: serde_json::Value =
        serde_json::from_str(&v.ctl_ok(&["--json", "module", "vale0", "echo", "x"])).unwrap();
    assert_eq!(j, serde_json::json!({"module": "v3", "output": "echo x"}));
    v.ctl_fails(
        &["module", "vale0", "fail"],
        1,
        "refused 'fail': no fail today",
    );
    // valed lives, and the module still forwards.
    let (a, b) = v.open_ab();
    let f = test_frame(60, MAC_A, MAC_B, 1);
    assert_eq!(deliver(&a, &f, &[&b]), vec![vec![f]]);
    if !am_root() {
        eprintln!("skipped the part as another user: needs root");
        return;
    }
    // `echo` is open to anyone, `fail` is an administrator's.
    let r = command_as_nobody(&v, "vale0", "echo", "hi");
    assert_eq!(r["reply"]["output"], "echo hi", "{r}");
    let r = command_as_nobody(&v, "vale0", "fail", "");
    assert_eq!(r["kind"], "permission_denied", "{r}");
    // What the module saves (vale.save) is kept in valed's configuration and handed back
    // (vale.restore) at the next start.
    assert_eq!(command(&v, "vale0", "restored", "").unwrap().1, "");
    v.ctl_ok(&["save"]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.contains(r#"state = ["line one", "line two"]"#),
        "{text}"
    );
    drop((a, b));
    v.restart_with(&args);
    assert_eq!(
        command(&v, "vale0", "restored", "").unwrap().1,
        "line one\nline two"
    );
}

/// Modules of versions 1 and 2 (whose struct ends before `control`) still load, forward, and
/// take no commands.
#[test]
fn older_modules_load_and_take_no_commands() {
    let v = Valed::start();
    let dir = TempDir::new("modules");
    let (a, b) = v.open_ab();
    for version in ["1", "2"] {
        // Every frame to port index 1 (b), on the ring the switch chooses.
        let code = V1_RING_MODULE
            .replace(" b->frames[i].ring = 1;", "")
            .replace(".abi_version = 1", &format!(".abi_version = {version}"));
        let so = c_module(&dir.0, &format!("libv{version}.so"), &code);
        v.ctl_ok(&["lookup", "vale0", so.to_str().unwrap()]);
        let (kind, message) = command(&v, "vale0", "dump", "").unwrap_err();
        assert_eq!(kind, ErrorKind::Unsupported, "version {version}: {message}");
        assert!(
            message.contains("lookup module 'v1_ring' has no command 'dump': it takes no commands"),
            "{message}"
        );
        let f = test_frame(60, MAC_A, MAC_B, 1);
        assert_eq!(deliver(&a, &f, &[&b]), vec![vec![f]], "version {version}");
    }
}

/// A module command that takes 8 s (`sleep`, open to anyone) holds nothing but its own
/// switch's commands: meanwhile `vale-ctl list`, a create on another switch and a command of
/// another switch's module answer within a second; the slow command's caller, and that of the
/// same switch's next command (which waits for it), get an error after the bound (5 s); once
/// the command ends the switch takes commands again.
#[test]
fn a_slow_module_command_holds_only_its_own_switch() {
    let dir = TempDir::new("modules-slow");
    let v = Valed::start();
    let so = c_module(&dir.0, "libv3.so", V3_CONTROL_MODULE);
    for sw in ["vale0", "vale1"] {
        v.ctl_ok(&["create", &format!("{sw}:a")]);
        v.ctl_ok(&["lookup", sw, so.to_str().unwrap()]);
    }
    let t0 = std::time::Instant::now();
    let run = |args: &[&str]| {
        let mut cmd = tool("vale-ctl", v.run_dir(), args);
        std::thread::spawn(move || cmd.output().map(|o| (o, t0.elapsed())))
    };
    let slow = run(&["module", "vale0", "sleep", "8"]);
    std::thread::sleep(Duration::from_millis(500));
    let next = run(&["module", "vale0", "echo", "x"]);
    let quick = |what: &str, f: &dyn Fn()| {
        let t = std::time::Instant::now();
        f();
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{what} took {:?}",
            t.elapsed()
        );
    };
    quick("list", &|| {
        v.ctl_ok(&["list"]);
    });
    quick("create on another switch", &|| {
        v.ctl_ok(&["create", "vale2:x"]);
    });
    quick("another switch's command", &|| {
        assert_eq!(command(&v, "vale1", "echo", "x").unwrap().1, "echo x");
    });
    for (h, op, from) in [(slow, "sleep", 0), (next, "echo", 500)] {
        let (out, took) = h.join().unwrap().expect("vale-ctl");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{out:?}");
        assert!(
            err.contains(&format!("did not answer '{op}' within 5s")),
            "{err}"
        );
        let waited = took - Duration::from_millis(from);
        assert!(
            waited >= Duration::from_millis(4500) && waited < Duration::from_secs(7),
            "the caller of '{op}' waited {waited:?}"
        );
    }
    assert!(
        wait_until(Duration::from_secs(10), || command(
            &v, "vale0", "echo", "y"
        )
        .is_ok()),
        "vale0 takes no command after the slow one ended"
    );
}

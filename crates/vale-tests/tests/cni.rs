//! vale-cni, the CNI plugin, run as runtimes run it: by `cnitool` for namespaces the test
//! makes, by podman (CNI backend, runc, a container from a local root filesystem), and by hand
//! with bad configurations and environments. The configuration list is the one of
//! docs/containers.md, with the test's own run directory and IPAM data directory.
//!
//! valed and the runtime run in a network namespace of the test's own (valed creates the TAP
//! devices there, the plugin moves them into the containers' namespaces), so nothing touches
//! the host's interfaces. Each test checks that nothing is left behind: no port, no device, no
//! namespace, no container or process, no address reservation. They need root, and skip with
//! a message where a tool is missing (scripts/test.sh installs them all).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use vale_tests::netns::{unique, Netns};
use vale_tests::{bin, run_bounded, stdout_of, wait_until, which, TempDir, Valed, T};

/// Where the reference plugins (`host-local`) are.
const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

fn is_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The configuration list of docs/containers.md: its first `json` block.
fn doc_conflist() -> Value {
    let page = std::fs::read_to_string(repo().join("docs/containers.md")).expect("docs page");
    let start = page
        .find("```json\n")
        .expect("a json block in docs/containers.md")
        + 8;
    let len = page[start..].find("```").expect("the block's end");
    serde_json::from_str(&page[start..start + len]).expect("the doc's conflist parses")
}

/// The doc's configuration list for the valed of `run_dir`, its addresses kept in `data_dir`.
fn conflist(run_dir: &Path, data_dir: &Path) -> Value {
    let mut c = doc_conflist();
    let p = &mut c["plugins"][0];
    assert_eq!(p["type"], "vale-cni");
    p["runDir"] = Value::from(run_dir.to_str().unwrap());
    p["ipam"]["dataDir"] = Value::from(data_dir.to_str().unwrap());
    c
}

/// The subnet of the doc's configuration (`10.89.0.0/24`): its first three octets.
fn subnet_prefix() -> String {
    let c = doc_conflist();
    let s = c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
        .as_str()
        .unwrap()
        .to_string();
    s.rsplit_once('.').unwrap().0.to_string()
}

/// `cnitool`: the one scripts/test.sh builds into the target directory, else one on PATH.
fn cnitool() -> Option<PathBuf> {
    let built = bin("vale-cni")
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("cnitool/cnitool"));
    built.filter(|p| p.is_file()).or_else(|| which("cnitool"))
}

/// A static busybox for a container's root filesystem: the one scripts/test.sh unpacks for
/// the guest tests.
fn busybox() -> Option<PathBuf> {
    let p = bin("vale-cni")
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("guest/root/bin/busybox"))?;
    p.is_file().then_some(p)
}

/// Why the test cannot run here, if it cannot.
fn missing(tools: &[(&str, bool)]) -> Option<String> {
    if !is_root() {
        return Some("needs root (network namespaces, TAP devices)".into());
    }
    if !Path::new(REFERENCE_PLUGINS).join("host-local").is_file() {
        return Some(format!(
            "needs the reference plugins in {REFERENCE_PLUGINS} (containernetworking-plugins)"
        ));
    }
    let gone: Vec<&str> = tools
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| *n)
        .collect();
    (!gone.is_empty()).then(|| format!("needs {} (scripts/test.sh installs them)", gone.join(", ")))
}

/// The world of one test: a namespace with a valed, a directory holding the configuration
/// list, the plugin (beside the reference plugins in CNI_PATH) and the IPAM plugin's data.
struct World {
    dir: TempDir,
    v: Valed,
    home: Netns,
}

impl World {
    fn new(tag: &str) -> World {
        let home = Netns::new(tag);
        let v = Valed::start_in(&home, &[]);
        let dir = TempDir::new(tag);
        for d in ["conf", "bin", "ipam"] {
            std::fs::create_dir(dir.0.join(d)).unwrap();
        }
        std::fs::copy(bin("vale-cni"), dir.0.join("bin/vale-cni")).unwrap();
        let list = conflist(v.run_dir(), &dir.0.join("ipam"));
        std::fs::write(dir.0.join("conf/vale.conflist"), list.to_string()).unwrap();
        World { dir, v, home }
    }

    fn cni_path(&self) -> String {
        format!("{}:{REFERENCE_PLUGINS}", self.dir.0.join("bin").display())
    }

    fn net(&self) -> String {
        doc_conflist()["name"].as_str().unwrap().to_string()
    }

    /// `cnitool OP NET /var/run/netns/NS`, run in the valed's namespace.
    fn cnitool(&self, tool: &Path, op: &str, ns: &str) -> Output {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.home.name])
            .arg(tool)
            .args([op, &self.net(), &format!("/var/run/netns/{ns}")])
            .env("NETCONFPATH", self.dir.0.join("conf"))
            .env("CNI_PATH", self.cni_path());
        run_bounded(&mut c, T * 3)
    }

    /// The ports of the test's valed.
    fn ports(&self) -> Vec<vale_abi::control::PortInfo> {
        self.v.list().into_iter().flat_map(|s| s.ports).collect()
    }

    /// Addresses host-local still holds: its data directory's files but its lock and its
    /// last-reserved marks.
    fn reserved(&self) -> Vec<String> {
        let d = self.dir.0.join("ipam").join(self.net());
        let Ok(entries) = std::fs::read_dir(&d) else {
            return vec![];
        };
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
            .collect()
    }

    /// Nothing is left: no port on the switch, no device but `lo` in valed's namespace, no
    /// reserved address.
    fn assert_clean(&self, what: &str) {
        let clean = wait_until(T, || self.ports().is_empty());
        assert!(clean, "{what}: ports left: {:?}", self.ports());
        let links = self.home.ok("ls /sys/class/net");
        assert_eq!(
            links.split_whitespace().collect::<Vec<_>>(),
            ["lo"],
            "{what}"
        );
        assert!(
            self.reserved().is_empty(),
            "{what}: reserved {:?}",
            self.reserved()
        );
    }
}

/// The result of an ADD, which must have succeeded: the interface's MAC and the address.
fn added(out: &Output, what: &str, ns: &str) -> (String, String) {
    let r: Value = serde_json::from_str(&stdout_of(out, what)).expect("result JSON");
    assert_eq!(r["cniVersion"], "1.0.0", "{r}");
    let i = &r["interfaces"][0];
    assert_eq!(i["name"], "eth0", "{r}");
    assert_eq!(i["sandbox"], format!("/var/run/netns/{ns}"), "{r}");
    let addr = r["ips"][0]["address"].as_str().expect("an address");
    assert_eq!(r["ips"][0]["interface"], 0, "{r}");
    let ip = addr.split('/').next().unwrap().to_string();
    (i["mac"].as_str().unwrap().to_string(), ip)
}

#[test]
fn cnitool_add_check_del_and_ping() {
    let tool = cnitool();
    if let Some(why) = missing(&[
        ("cnitool", tool.is_some()),
        ("ping", which("ping").is_some()),
    ]) {
        eprintln!("cnitool_add_check_del_and_ping skipped: {why}");
        return;
    }
    let tool = tool.unwrap();
    let w = World::new("cnh");
    let c1 = Netns::new("c1");
    let c2 = Netns::new("c2");
    let (mac1, ip1) = added(&w.cnitool(&tool, "add", &c1.name), "add c1", &c1.name);
    let (_, ip2) = added(&w.cnitool(&tool, "add", &c2.name), "add c2", &c2.name);
    assert!(ip1.starts_with(&subnet_prefix()), "{ip1}");
    // The interface is as the result says, with the doc's MTU, and each port a TAP port with
    // the doc's knob.
    assert_eq!(c1.mac("eth0"), mac1);
    assert_eq!(c1.ok("cat /sys/class/net/eth0/mtu").trim(), "1500");
    let ports = w.ports();
    assert_eq!(ports.len(), 2, "{ports:?}");
    for p in &ports {
        assert_eq!((p.kind.as_str(), p.learn_limit), ("tap", 64), "{p:?}");
    }
    stdout_of(&w.cnitool(&tool, "check", &c1.name), "check c1");
    let ping = c1.run(&format!("ping -c 3 -i 0.2 -W 5 {ip2}"), T * 2);
    stdout_of(&ping, "ping c1 -> c2");
    // DEL: port, device and address gone; CHECK now fails; DEL again is no error.
    stdout_of(&w.cnitool(&tool, "del", &c1.name), "del c1");
    assert!(wait_until(T, || w.ports().len() == 1), "{:?}", w.ports());
    assert_eq!(
        c1.ok("ls /sys/class/net")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["lo"]
    );
    let check = w.cnitool(&tool, "check", &c1.name);
    assert!(!check.status.success(), "CHECK after DEL succeeded");
    stdout_of(&w.cnitool(&tool, "del", &c1.name), "del c1 again");
    // DEL after the container's namespace went away.
    let name2 = c2.name.clone();
    drop(c2);
    stdout_of(
        &w.cnitool(&tool, "del", &name2),
        "del c2 without its namespace",
    );
    w.assert_clean("after DEL");
    // libcni's cache of the results (cnitool has no directory of its own for it).
    let cached = cache_entries(&[&format!("/{}\"", c1.name), &format!("/{name2}\"")]);
    assert!(cached.is_empty(), "results cached after DEL: {cached:?}");
}

/// The files of libcni's result cache that mention one of `needles`.
fn cache_entries(needles: &[&str]) -> Vec<PathBuf> {
    let Ok(d) = std::fs::read_dir("/var/lib/cni/results") else {
        return vec![];
    };
    d.flatten()
        .map(|e| e.path())
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            needles.iter().any(|n| text.contains(n))
        })
        .collect()
}

/// podman's command line with the test's storage, state and configuration, run in valed's
/// namespace (`nsenter` enters the network namespace alone: runc needs the host's /sys for its
/// cgroups, which `ip netns exec` would hide).
fn podman(w: &World, args: &[&str]) -> Command {
    let d = &w.dir.0;
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{}", w.home.name))
        .arg("podman")
        .arg("--root")
        .arg(d.join("root"))
        .arg("--runroot")
        .arg(d.join("runroot"))
        .arg("--tmpdir")
        .arg(d.join("tmp"))
        .args(["--storage-driver", "vfs", "--runtime", "runc"])
        // runc's state too (its default is /run/runc).
        .arg(format!("--runtime-flag=root={}", d.join("runc").display()))
        .args(args)
        .env("CONTAINERS_CONF", d.join("containers.conf"))
        .stdin(Stdio::null());
    c
}

fn podman_ok(w: &World, args: &[&str]) -> String {
    let what = format!("podman {args:?}");
    stdout_of(&run_bounded(&mut podman(w, args), T * 6), &what)
}

/// Processes whose command line mentions `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
        }
    }
    found
}

/// podman's namespaces (`netns-UUID` under /run/netns).
fn podman_netns() -> BTreeSet<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("netns-") || n.starts_with("cni-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn podman_containers_ping_through_vale() {
    let tools = [
        ("podman", which("podman").is_some()),
        ("runc", which("runc").is_some()),
        ("nsenter", which("nsenter").is_some()),
        ("a static busybox (target/guest)", busybox().is_some()),
    ];
    if let Some(why) = missing(&tools) {
        eprintln!("podman_containers_ping_through_vale skipped: {why}");
        return;
    }
    let before = podman_netns();
    let w = World::new("pdh");
    let d = &w.dir.0;
    for sub in ["root", "runroot", "tmp", "rootfs/bin"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::copy(busybox().unwrap(), d.join("rootfs/bin/busybox")).unwrap();
    // The CNI backend for this podman alone (CONTAINERS_CONF), with the test's plugins and
    // configuration list.
    let conf = format!(
        "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{}\", \"{REFERENCE_PLUGINS}\"]\n\
         network_config_dir = \"{}\"\n[engine]\ncgroup_manager = \"cgroupfs\"\n\
         events_logger = \"none\"\n",
        d.join("bin").display(),
        d.join("conf").display()
    );
    std::fs::write(d.join("containers.conf"), conf).unwrap();
    let rootfs = d.join("rootfs");
    let rootfs = rootfs.to_str().unwrap();
    let net = w.net();
    let name = unique("vta");
    // A sleep of a length of its own, to find a leftover by.
    let nap = format!("{}", 100_000 + std::process::id() % 100_000);
    let common = [
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        &net,
        "--rootfs",
        rootfs,
    ];
    let mut run_a = vec!["run", "-d", "--name", &name];
    run_a.extend(common);
    run_a.extend(["/bin/busybox", "sleep", &nap]);
    let id_a = podman_ok(&w, &run_a).trim().to_string();
    let finish = || {
        let _ = run_bounded(&mut podman(&w, &["rm", "-f", "-t", "0", &name]), T * 6);
    };
    let ip = podman_ok(
        &w,
        &[
            "inspect",
            "-f",
            &format!("{{{{.NetworkSettings.Networks.{net}.IPAddress}}}}"),
            &name,
        ],
    );
    let ip = ip.trim().to_string();
    if !ip.starts_with(&subnet_prefix()) {
        finish();
        panic!("container a has address {ip:?}");
    }
    let mut run_b = vec!["run", "--rm", "--cap-add", "NET_RAW"];
    run_b.extend(common);
    let ping = format!("ping -c 3 -i 0.2 -W 5 {ip}");
    run_b.extend(["/bin/busybox", "sh", "-c", &ping]);
    let out = run_bounded(&mut podman(&w, &run_b), T * 6);
    let ports_while_running = w.ports().len();
    finish();
    stdout_of(&out, "container b pings a");
    assert!(ports_while_running >= 1, "no port while a ran");
    // Nothing left: containers, ports, devices, reservations, namespaces, processes, mounts.
    assert_eq!(podman_ok(&w, &["ps", "-a", "-q"]).trim(), "");
    w.assert_clean("after the containers");
    let leaked: Vec<String> = podman_netns().difference(&before).cloned().collect();
    assert!(leaked.is_empty(), "namespaces left: {leaked:?}");
    let dir = d.to_string_lossy().into_owned();
    assert!(
        wait_until(T, || processes_with(&dir).is_empty()),
        "processes left: {:?}",
        processes_with(&dir)
    );
    assert!(
        wait_until(T, || processes_with(&format!("sleep {nap}")).is_empty()),
        "the container's sleep is left: {:?}",
        processes_with(&format!("sleep {nap}"))
    );
    let cached = cache_entries(&[&format!("\"{id_a}\"")]);
    assert!(
        cached.is_empty(),
        "results cached after the containers: {cached:?}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&dir), "mounts left under {dir}");
}

/// Runs the plugin as a runtime would: `env` (CNI_*), `stdin`; its exit status and output.
fn plugin(env: &[(&str, &str)], stdin: &str) -> (bool, Value) {
    plugin_in(None, env, stdin)
}

/// [`plugin`] in network namespace `ns`, if given.
fn plugin_in(ns: Option<&Netns>, env: &[(&str, &str)], stdin: &str) -> (bool, Value) {
    let mut c = match ns {
        None => Command::new(bin("vale-cni")),
        Some(ns) => {
            let mut c = Command::new(which("ip").expect("ip"));
            c.args(["netns", "exec", &ns.name]).arg(bin("vale-cni"));
            c
        }
    };
    c.env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("run vale-cni");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let deadline = std::time::Instant::now() + T;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "vale-cni hangs");
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("output {text:?}: {e}"))
    };
    (status.success(), v)
}

/// The plugin's error for `env` and `stdin`: it must fail with code `code` and a message
/// holding `named`, written in `version`.
fn refused(env: &[(&str, &str)], stdin: &str, code: u64, named: &str, version: &str) {
    let (ok, v) = plugin(env, stdin);
    assert!(!ok, "{env:?} {stdin}: succeeded: {v}");
    assert_eq!(v["code"], code, "{env:?} {stdin}: {v}");
    assert_eq!(v["cniVersion"], version, "{v}");
    let msg = v["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains(named),
        "{env:?} {stdin}: {msg:?} lacks {named:?}"
    );
}

#[test]
fn bad_configurations_get_the_specs_codes() {
    let dir = TempDir::new("cnibad");
    let run_dir = dir.0.join("run");
    let net = conflist(&run_dir, &dir.0.join("ipam"));
    // A plugin's configuration as a runtime hands it over: the list's version and name added.
    let mut conf = net["plugins"][0].clone();
    conf["cniVersion"] = net["cniVersion"].clone();
    conf["name"] = net["name"].clone();
    let with = |key: &str, v: Value| {
        let mut c = conf.clone();
        c[key] = v;
        c.to_string()
    };
    let good = conf.to_string();
    let add = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c0ffee"),
        ("CNI_NETNS", "/var/run/netns/vale-no-such-namespace"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", REFERENCE_PLUGINS),
    ];
    // VERSION: what it speaks.
    let (ok, v) = plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
    assert!(ok, "{v}");
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(
        v["supportedVersions"],
        serde_json::json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
    // Configurations.
    refused(&add, "{", 6, "not JSON", "1.0.0");
    refused(
        &add,
        &with("cniVersion", "9.0.0".into()),
        1,
        "9.0.0",
        "1.0.0",
    );
    refused(&add, &with("mtu", 40.into()), 7, "'mtu' 40", "1.0.0");
    refused(&add, &with("mtu", "1500".into()), 7, "'mtu'", "1.0.0");
    refused(&add, &with("switch", "br0".into()), 7, "'switch'", "1.0.0");
    refused(&add, &with("switch", Value::Null), 7, "'switch'", "1.0.0");
    refused(&add, &with("vlan", 10.into()), 2, "'vlan': 10", "1.0.0");
    refused(
        &add,
        &with("knobs", serde_json::json!({"speed": 1})),
        7,
        "'speed'",
        "1.0.0",
    );
    let unknown_ipam = with("ipam", serde_json::json!({"type": "no-such-ipam"}));
    refused(&add, &unknown_ipam, 7, "'no-such-ipam'", "1.0.0");
    // An error is written in the configuration's version.
    let old = with("cniVersion", "0.4.0".into());
    refused(
        &add,
        &with("mtu", 0.into()).replace("1.0.0", "0.4.0"),
        7,
        "'mtu' 0",
        "0.4.0",
    );
    // The environment.
    let mut no_id = add;
    no_id[1] = ("CNI_CONTAINERID", "");
    refused(&no_id, &good, 4, "CNI_CONTAINERID", "1.0.0");
    let mut frob = add;
    frob[0] = ("CNI_COMMAND", "FROB");
    refused(&frob, &good, 4, "FROB", "1.0.0");
    refused(&add[1..], &good, 4, "CNI_COMMAND", "1.0.0");
    let mut long = add;
    long[3] = ("CNI_IFNAME", "much-too-long-name");
    refused(&long, &old, 4, "CNI_IFNAME", "0.4.0");
    // A namespace that is not there.
    refused(
        &add,
        &with("ipam", Value::Null),
        5,
        "vale-no-such-namespace",
        "1.0.0",
    );
    // CHECK without the previous result; DEL with no valed (nothing to undo): success.
    let mut check = add;
    check[0] = ("CNI_COMMAND", "CHECK");
    refused(&check, &good, 7, "prevResult", "1.0.0");
    let no_ipam = with("ipam", Value::Null);
    let mut del = add;
    del[0] = ("CNI_COMMAND", "DEL");
    del[2] = ("CNI_NETNS", "");
    let (ok, v) = plugin(&del, &no_ipam);
    assert!(ok && v.is_null(), "DEL with nothing to undo: {v}");
    // GC and STATUS are spec 1.1's; STATUS with no valed: not available.
    let status = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", REFERENCE_PLUGINS)];
    refused(&status, &no_ipam, 1, "1.1.0", "1.0.0");
    let v11 = no_ipam.replace("1.0.0", "1.1.0");
    refused(&status, &v11, 50, "no valed", "1.1.0");
    let gc = [("CNI_COMMAND", "GC"), ("CNI_PATH", REFERENCE_PLUGINS)];
    refused(&gc, &no_ipam, 1, "1.1.0", "1.0.0");
    let (ok, v) = plugin(&gc, &v11);
    assert!(ok && v.is_null(), "GC with no valed: {v}");
    // ADD with no valed: try again later.
    if is_root() {
        let ns = Netns::new("cb");
        let path = format!("/var/run/netns/{}", ns.name);
        let mut here = add;
        here[2] = ("CNI_NETNS", &path);
        refused(&here, &no_ipam, 11, "no valed", "1.0.0");
    }
}

#[test]
fn gc_detaches_the_ports_of_attachments_no_longer_valid() {
    if let Some(why) = missing(&[]) {
        eprintln!("gc_detaches_the_ports_of_attachments_no_longer_valid skipped: {why}");
        return;
    }
    let w = World::new("gch");
    let list: Value =
        serde_json::from_slice(&std::fs::read(w.dir.0.join("conf/vale.conflist")).unwrap())
            .unwrap();
    let mut conf = list["plugins"][0].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    conf["name"] = list["name"].clone();
    let cni_path = w.cni_path();
    let a = Netns::new("ga");
    let b = Netns::new("gb");
    let path = |ns: &Netns| format!("/var/run/netns/{}", ns.name);
    let (pa, pb) = (path(&a), path(&b));
    let env = |cmd: &'static str, id: &'static str, netns: &str| {
        vec![
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", id),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", cni_path.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect::<Vec<(&str, String)>>()
    };
    let run = |e: Vec<(&str, String)>, stdin: &str| {
        let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
        plugin_in(Some(&w.home), &e, stdin)
    };
    for (id, p) in [("gc-a", &pa), ("gc-b", &pb)] {
        let (ok, v) = run(env("ADD", id, p), &conf.to_string());
        assert!(ok, "ADD {id}: {v}");
    }
    assert_eq!(w.ports().len(), 2);
    // GC with only gc-a valid: gc-b's port and TAP go, gc-a's stay. (The IPAM plugin may
    // predate GC: its refusal of the version is no error.)
    let mut gc = conf.clone();
    gc["cniVersion"] = "1.1.0".into();
    gc["cni.dev/valid-attachments"] =
        serde_json::json!([{"containerID": "gc-a", "ifname": "eth0"}]);
    let (ok, v) = run(env("GC", "", ""), &gc.to_string());
    assert!(ok, "GC: {v}");
    assert!(wait_until(T, || w.ports().len() == 1), "{:?}", w.ports());
    assert!(wait_until(T, || b.ok("ls /sys/class/net").trim() == "lo"));
    assert!(a.ok("ls /sys/class/net").contains("eth0"));
    // STATUS: valed answers.
    let (ok, v) = run(env("STATUS", "", ""), &gc.to_string());
    assert!(ok, "STATUS: {v}");
    // DEL of both, gc-b's port already collected.
    for (id, p) in [("gc-a", &pa), ("gc-b", &pb)] {
        let (ok, v) = run(env("DEL", id, p), &conf.to_string());
        assert!(ok, "DEL {id}: {v}");
    }
    w.assert_clean("after GC and DEL");
}

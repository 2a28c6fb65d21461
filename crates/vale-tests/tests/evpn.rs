//! BGP EVPN: vale + FRR ↔ Linux + FRR. valed runs in namespace `net.home` with a TAP port
//! into C1 and a vxlan port with `evpn=yes` (no remote list); H2 is a Linux host with a
//! bridge, a vxlan device (`nolearning`) and a veth into C2. Each host runs FRR's zebra and
//! bgpd (iBGP, `advertise-all-vni`): FRR on vale's side reads vale's placeholder devices.
//!
//! Needs root, iproute2, ping and FRR (`frr`, which scripts/test.sh installs): without FRR the
//! test says so and passes.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use vale_tests::netns::{sh_ok, Netns, TapNet};
use vale_tests::tunnel::field;
use vale_tests::*;

/// How long BGP may take to converge and to carry a change (it takes seconds).
const CONVERGE: Duration = Duration::from_secs(60);

fn have_frr() -> bool {
    ["zebra", "bgpd"]
        .iter()
        .all(|d| Path::new("/usr/lib/frr").join(d).exists())
        && Path::new("/usr/bin/vtysh").exists()
}

/// zebra and bgpd of namespace `ns` (iBGP in AS 65000 with `peer`, EVPN for every VNI),
/// stopped when dropped.
struct Frr {
    ns: String,
    dir: TempDir,
}

impl Frr {
    fn start(ns: &Netns, me: &str, peer: &str) -> Frr {
        let dir = TempDir::new("frr");
        let d = dir.0.display().to_string();
        let run = format!("/var/run/frr/{}", ns.name);
        std::fs::write(
            dir.0.join("zebra.conf"),
            format!("hostname {}\nlog file {d}/zebra.log\n", ns.name),
        )
        .unwrap();
        std::fs::write(
            dir.0.join("bgpd.conf"),
            format!(
                "hostname {}\nlog file {d}/bgpd.log\n\
                 router bgp 65000\n bgp router-id {me}\n no bgp default ipv4-unicast\n \
                 no bgp ebgp-requires-policy\n neighbor {peer} remote-as 65000\n \
                 neighbor {peer} timers connect 1\n \
                 address-family l2vpn evpn\n  neighbor {peer} activate\n  advertise-all-vni\n \
                 exit-address-family\n",
                ns.name
            ),
        )
        .unwrap();
        let frr = Frr {
            ns: ns.name.clone(),
            dir,
        };
        sh_ok(Command::new("sh").args([
            "-c",
            &format!("mkdir -p {run} && chown frr:frr {run} && chown -R frr:frr {d}"),
        ]));
        for daemon in ["zebra", "bgpd"] {
            ns.ok(&format!(
                "/usr/lib/frr/{daemon} -N {} -d -f {d}/{daemon}.conf -i {d}/{daemon}.pid",
                ns.name
            ));
        }
        frr
    }

    /// `vtysh -c cmd` in this FRR.
    fn show(&self, cmd: &str) -> String {
        let out = run_bounded(Command::new("vtysh").args(["-N", &self.ns, "-c", cmd]), T);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        for daemon in ["bgpd", "zebra"] {
            let pid = std::fs::read_to_string(self.dir.0.join(format!("{daemon}.pid")));
            if let Ok(pid) = pid.unwrap_or_default().trim().parse::<i32>() {
                // SAFETY: plain kill(2) of a daemon this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(format!("/var/run/frr/{}", self.ns));
    }
}

/// The tunnel port's counters line (refreshed by valed about once a second).
fn line(v: &Valed) -> String {
    v.port("vale0:ev")
        .and_then(|p| p.negotiated)
        .unwrap_or_else(|| panic!("vale0:ev shows no counters"))
}

/// Waits (up to [`CONVERGE`]) until `cond` holds; panics with `what` and the last `show`.
fn wait(what: &str, mut show: impl FnMut() -> String, cond: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    let ok = wait_until_every(CONVERGE, Duration::from_millis(250), || {
        last = show();
        cond(&last)
    });
    assert!(ok, "{what}: {last}");
    last
}

/// The container behind vale pings the one behind Linux across the EVPN tunnel; each side's
/// FRR learns the other's MACs; vale's table holds the Linux MAC from EVPN, never from the
/// data plane; a withdrawn route goes; the placeholders carry nothing and go with valed.
#[test]
fn evpn_with_frr() {
    if !have_frr() {
        eprintln!("evpn_with_frr: skipped: FRR is not installed (apt-get install frr)");
        return;
    }
    let (local, remote) = ("192.168.77.1", "192.168.77.2");
    let net = TapNet::new(&["c1"]);
    let h2 = Netns::new("x");
    let c2 = Netns::new("y");
    let u = vale_tests::netns::unique("vu");
    net.home
        .ok(&format!("ip link add {u} type veth peer name under"));
    net.home.ok(&format!("ip link set under netns {}", h2.name));
    net.home.adopt(None, &u, &[&format!("{local}/24")]);
    h2.adopt(None, "under", &[&format!("{remote}/24")]);
    h2.ok("ethtool -K under tx off");
    h2.ok(&format!(
        "sysctl -qw net.bridge.bridge-nf-call-iptables=0 \
         && ip link add vx type vxlan id 42 dstport 4789 local {remote} nolearning \
         && ip link add br0 type bridge && ip link set vx master br0 \
         && bridge link set dev vx learning off && ip link set vx up \
         && ip link add vc type veth peer name ce \
         && ip link set vc master br0 && ip link set vc up && ip link set br0 up",
    ));
    c2.adopt(Some(&h2), "ce", &["10.77.0.2/24"]);
    // A crashed valed's leftovers: replaced by the attach.
    net.home.ok(
        "ip link add vale-br42 type bridge && ip link add vale-lm42 type veth peer name vale-lp42",
    );
    net.v.ctl_ok(&[
        "attach",
        "vale0:ev",
        "vxlan",
        "vni=42",
        &format!("local={local}"),
        "evpn=yes",
    ]);
    // Routes are read from the start: FRR may come up after the port.
    let frr2 = Frr::start(&h2, remote, local);
    let frr1 = Frr::start(&net.home, local, remote);
    let c1 = net.ns(0);
    let c1_mac = c1.mac(&net.hosts[0].1);
    let c2_mac = c2.mac("ce");

    // Until BGP is up the port knows no VTEP: pings are lost. Then they cross.
    let ok = wait_until_every(CONVERGE, Duration::from_millis(100), || {
        c1.run("ping -c 1 -W 1 10.77.0.2", T).status.success()
    });
    assert!(
        ok,
        "C1 never reached C2: {}\n{}\n{}",
        line(&net.v),
        frr1.show("show bgp l2vpn evpn summary"),
        frr1.show("show evpn mac vni 42")
    );
    c1.ok("ping -c 3 -i 0.2 -W 2 10.77.0.2");

    // vale's table: the Linux MAC, from EVPN (type 2), H2 in the flood list (type 3).
    let l = wait(
        "vale learns C2's MAC from EVPN",
        || line(&net.v),
        |l| l.contains(&format!("evpn-mac {c2_mac} -> {remote}")),
    );
    assert!(l.contains(&format!("flood [{remote}]")), "{l}");
    // FRR on the Linux host: vale's MAC (C1's) as a remote type-2 route from vale's VTEP.
    wait(
        "FRR on H2 shows C1's MAC behind vale",
        || frr2.show("show evpn mac vni 42"),
        |s| {
            s.lines()
                .any(|l| l.starts_with(&c1_mac) && l.contains("remote") && l.contains(local))
        },
    );

    // The route is withdrawn (C2 goes): vale forgets the MAC.
    h2.ok("ip link del vc");
    let l = wait(
        "vale forgets the withdrawn MAC",
        || line(&net.v),
        |l| !l.contains(&c2_mac) && field(l, "macs") == 0,
    );
    assert_eq!(field(&l, "learnt"), 0, "{l}");
    // Data-plane learning is off: frames from H2's bridge (a MAC no route names) cross, and
    // the table stays empty.
    h2.ok("ip addr add 10.77.0.9/24 dev br0");
    h2.ok("ping -c 3 -i 0.2 -W 2 10.77.0.1");
    let l = line(&net.v);
    assert_eq!(field(&l, "learnt"), 0, "learnt from the data plane: {l}");
    assert_eq!(field(&l, "refused"), 0, "{l}");

    // A route comes back under traffic (C1 pinging all along): C2 returns with its MAC, zebra
    // advertises it again, vale's port takes it between bursts and the pings cross again.
    let mut pinger = c1
        .cmd("exec ping -i 0.1 -w 90 10.77.0.2 > /dev/null")
        .spawn()
        .expect("ping");
    h2.ok(&format!(
        "ip link add vc type veth peer name ce address {c2_mac} && ip link set vc master br0 \
         && ip link set vc up && ip link set ce netns {}",
        c2.name
    ));
    c2.ok("ip addr add 10.77.0.2/24 dev ce && ip link set ce up");
    wait(
        "vale takes C2's MAC again",
        || line(&net.v),
        |l| l.contains(&format!("evpn-mac {c2_mac} -> {remote}")),
    );
    let ok = wait_until_every(CONVERGE, Duration::from_millis(100), || {
        c1.run("ping -c 1 -W 1 10.77.0.2", T).status.success()
    });
    let _ = pinger.kill();
    let _ = pinger.wait();
    assert!(ok, "C1 does not reach C2 again: {}", line(&net.v));

    // The placeholder vxlan device never carried a frame.
    assert_eq!(
        net.home.counter("vale-vx42", "tx_packets"),
        0,
        "the placeholder sent"
    );
    // A second EVPN port for the VNI is refused; detaching removes the placeholders and a
    // new attach makes them again; valed's exit removes them.
    let out = net.v.ctl(&[
        "attach",
        "vale0:ev2",
        "vxlan",
        "vni=42",
        &format!("local={local}"),
        "dstport=5000",
        "evpn=yes",
    ]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("vni 42"),
        "{out:?}"
    );
    let exists = |d: &str| {
        net.home
            .run(&format!("ip link show {d}"), T)
            .status
            .success()
    };
    net.v.ctl_ok(&["detach", "vale0:ev"]);
    for d in ["vale-br42", "vale-vx42", "vale-lm42", "vale-lp42"] {
        assert!(!exists(d), "{d} left after detach");
    }
    net.v.ctl_ok(&[
        "attach",
        "vale0:ev",
        "vxlan",
        "vni=42",
        &format!("local={local}"),
        "evpn=yes",
    ]);
    assert!(exists("vale-vx42"));
    net.v.signal(libc::SIGTERM);
    assert!(
        wait_until_every(T, Duration::from_millis(100), || !exists("vale-vx42")
            && !exists("vale-br42")
            && !exists("vale-lm42")),
        "placeholders left after valed's exit"
    );
    drop(frr1);
    drop(frr2);
}

/// A placeholder FDB filled with 100,000 entries behind 300 VTEPs (as a hostile or broken
/// control plane would write them): the port keeps at most its bounds (8192 MACs, 256 VTEPs),
/// counts what it refused, and valed goes on serving: two TAP ports ping each other meanwhile
/// without a loss. Needs no FRR: the test writes the
/// entries zebra would.
#[test]
fn evpn_fdb_flood_is_bounded() {
    let net = TapNet::new(&["c1", "c2"]);
    net.home
        .ok("ip link add vu type veth peer name vu2 && ip addr add 192.168.78.1/24 dev vu && ip link set vu up && ip link set vu2 up");
    net.v.ctl_ok(&[
        "attach",
        "vale0:ev",
        "vxlan",
        "vni=7",
        "local=192.168.78.1",
        "evpn=yes",
    ]);
    let dir = TempDir::new("fdb");
    let mut batch = String::new();
    for i in 0..100_000u32 {
        let vtep = i % 300;
        batch.push_str(&format!(
            "fdb add 02:00:{:02x}:{:02x}:{:02x}:01 dev vale-vx7 dst 10.9.{}.{} self\n",
            i >> 16,
            (i >> 8) & 0xff,
            i & 0xff,
            vtep / 200,
            vtep % 200 + 1
        ));
    }
    let file = dir.0.join("batch");
    std::fs::write(&file, batch).unwrap();
    // The flood is written while two other ports of the switch talk: they lose nothing.
    let mut writer = net
        .home
        .cmd(&format!("bridge -batch {}", file.display()))
        .spawn()
        .expect("bridge -batch");
    let out = net.ns(0).ok("ping -c 20 -i 0.05 -W 2 10.77.0.2");
    assert!(out.contains(" 0% packet loss"), "{out}");
    assert!(writer.wait().expect("bridge -batch").success());
    let l = wait(
        "the port takes the FDB up to its bounds",
        || line(&net.v),
        |l| field(l, "macs") == 8192 && field(l, "refused") > 0,
    );
    eprintln!("{}", &l[..l.find("; vtep").unwrap_or(l.len())]);
    let vteps = l.matches("; vtep ").count();
    assert!(vteps <= 256, "{vteps} VTEPs: {l}");
    // Still serving: the control socket answers and the TAP port works.
    assert!(net.v.port("vale0:c1").is_some());
    // Entries deleted go (the placeholder goes with the port at detach).
    net.home
        .ok("bridge fdb del 02:00:00:00:00:01 dev vale-vx7 dst 10.9.0.1 self");
    net.v.ctl_ok(&["detach", "vale0:ev"]);
    assert!(!net.home.run("ip link show vale-vx7", T).status.success());
}

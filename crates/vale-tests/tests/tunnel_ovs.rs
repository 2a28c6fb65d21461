//! Tunnel ports against Open vSwitch's userspace datapath, over VXLAN and over Geneve (the
//! kernel here has no Geneve device: OVS is the Geneve peer).
//!
//! valed runs in namespace H1 with a TAP port for container C1 (10.77.0.1) and a tunnel port;
//! OVS runs in namespace H2 as docs/spanning-hosts.md describes: `ovsdb-server` and
//! `ovs-vswitchd` of the test's own (their database, sockets, pid and log files in a temporary
//! directory), no kernel module (`datapath_type=netdev`), `br-phy` holding the underlay veth with
//! H2's underlay address on the bridge itself, `br-int` holding the tunnel port and the veth of
//! container C2 (10.77.0.2). Both daemons run inside H2 and die with it, failed test or not.
//!
//! Needs root, iproute2, ping, ethtool and Open vSwitch (`openvswitch-switch`, which
//! scripts/test.sh installs); skipped with a message without `ovs-vswitchd`.

use std::path::Path;

use vale_tests::netns::{unique, Netns, TapNet};
use vale_tests::*;

const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// Why the OVS tests cannot run here, if they cannot.
fn missing() -> Option<String> {
    for t in [
        "ovs-vswitchd",
        "ovsdb-server",
        "ovsdb-tool",
        "ovs-vsctl",
        "ethtool",
    ] {
        if which(t).is_none() {
            return Some(format!("needs {t} (Debian: openvswitch-switch, ethtool)"));
        }
    }
    if !Path::new(SCHEMA).is_file() {
        return Some(format!("needs the OVS schema {SCHEMA}"));
    }
    None
}

/// An OVS of the test's own: its files in `dir`.
struct Ovs {
    dir: TempDir,
}

impl Ovs {
    /// `ovs-vsctl ARGS` against this OVS's database (waiting for ovs-vswitchd to apply it).
    fn vsctl(&self, ns: &Netns, args: &str) -> String {
        ns.ok(&format!(
            "{} ovs-vsctl --timeout=20 --db=unix:{}/db.sock {args}",
            self.env(),
            self.dir.0.display()
        ))
    }

    /// `ovs-appctl -t ovs-vswitchd ARGS`, for what the test reports when it fails.
    fn appctl(&self, ns: &Netns, args: &str) -> String {
        let out = ns.run(
            &format!(
                "{} ovs-appctl --timeout=5 -t {}/vswitchd.ctl {args} 2>&1",
                self.env(),
                self.dir.0.display()
            ),
            T,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every default directory of OVS's tools in the test's own.
    fn env(&self) -> String {
        let d = self.dir.0.display();
        format!("OVS_RUNDIR={d} OVS_LOGDIR={d} OVS_DBDIR={d} OVS_SYSCONFDIR={d}")
    }

    /// Starts ovsdb-server and ovs-vswitchd in `ns`.
    fn start(ns: &Netns) -> Ovs {
        let ovs = Ovs {
            dir: TempDir::new("ovs"),
        };
        let d = ovs.dir.0.display().to_string();
        let env = ovs.env();
        ns.ok(&format!("ovsdb-tool create {d}/conf.db {SCHEMA}"));
        ns.ok(&format!(
            "{env} ovsdb-server {d}/conf.db --remote=punix:{d}/db.sock --pidfile={d}/ovsdb.pid \
             --unixctl={d}/ovsdb.ctl --log-file={d}/ovsdb.log --detach"
        ));
        ovs.vsctl(ns, "--no-wait init");
        // It logs that the kernel module is missing: the netdev datapath needs none.
        ns.ok(&format!(
            "{env} ovs-vswitchd unix:{d}/db.sock --pidfile={d}/vswitchd.pid \
             --unixctl={d}/vswitchd.ctl --log-file={d}/vswitchd.log --detach"
        ));
        ovs
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("vswitchd.log")).unwrap_or_default()
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        // Both daemons are in the namespace, which kills them when it goes; this stops them
        // first, by their pid files, so that nothing of theirs outlives the temporary directory.
        for p in ["vswitchd.pid", "ovsdb.pid"] {
            if let Some(pid) = std::fs::read_to_string(self.dir.0.join(p))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                // SAFETY: plain syscall, on a daemon this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// valed's host H1 (a tunnel port of `kind` toward OVS, C1 behind a TAP port) and OVS's host
/// H2 (C2 behind br-int), joined by a veth underlay 192.168.78.1 (H1) to .2 (H2), MTU 1500.
/// Fields drop in order: OVS first, then the namespaces.
struct OvsNet {
    ovs: Ovs,
    c2: Netns,
    h2: Netns,
    net: TapNet,
}

impl OvsNet {
    fn new(kind: &str) -> OvsNet {
        let net = TapNet::new(&["c1"]);
        let h2 = Netns::new("o");
        let c2 = Netns::new("p");
        let u = unique("vu");
        net.home
            .ok(&format!("ip link add {u} type veth peer name under"));
        net.home.ok(&format!("ip link set under netns {}", h2.name));
        net.home.adopt(None, &u, &["192.168.78.1/24"]);
        // OVS reads its netdev ports with AF_PACKET and drops frames whose checksums were
        // left to the device: every veth whose frames reach OVS computes its own.
        net.home.ok(&format!("ethtool -K {u} tx off"));
        h2.ok("ip link set under up");
        h2.ok("ip link add vc type veth peer name ce && ip link set vc up");
        c2.adopt(Some(&h2), "ce", &["10.77.0.2/24"]);
        c2.ok("ethtool -K ce tx off");
        let ovs = Ovs::start(&h2);
        let mac = h2.mac("under");
        ovs.vsctl(
            &h2,
            &format!(
                "add-br br-phy -- set bridge br-phy datapath_type=netdev \
                 other_config:hwaddr=\\\"{mac}\\\" -- add-port br-phy under"
            ),
        );
        h2.ok("ip addr add 192.168.78.2/24 dev br-phy && ip link set br-phy up");
        let port = if kind == "vxlan" { 4789 } else { 6081 };
        ovs.vsctl(
            &h2,
            &format!(
                "add-br br-int -- set bridge br-int datapath_type=netdev \
                 -- add-port br-int tun -- set interface tun type={kind} \
                 options:remote_ip=192.168.78.1 options:key=42 options:dst_port={port} \
                 -- add-port br-int vc"
            ),
        );
        h2.ok("ip link set br-int up");
        net.v.ctl_ok(&[
            "attach",
            "vale0:tun",
            kind,
            "vni=42",
            "local=192.168.78.1",
            "remote=192.168.78.2",
        ]);
        OvsNet { ovs, c2, h2, net }
    }

    /// What OVS and valed say, for a failure's message.
    fn explain(&self) -> String {
        format!(
            "valed's tunnel port: {:?}\nOVS tnl/neigh: {}\novs/route: {}\nflows: {}\n\
             coverage: {}\nvswitchd.log:\n{}",
            self.net.v.port("vale0:tun").and_then(|p| p.negotiated),
            self.ovs.appctl(&self.h2, "tnl/neigh/show"),
            self.ovs.appctl(&self.h2, "ovs/route/show"),
            self.ovs.appctl(&self.h2, "dpctl/dump-flows"),
            self.ovs.appctl(&self.h2, "coverage/show"),
            self.ovs.log()
        )
    }
}

/// Pings both ways across the tunnel, 56 and 1400 bytes of payload, every echo answered.
fn pings_cross(kind: &str) {
    if let Some(why) = missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let x = OvsNet::new(kind);
    let c1 = x.net.ns(0);
    // OVS resolves valed's underlay MAC (ARP on br-phy) on its first packet, which it drops:
    // the first echoes may be lost; bounded.
    let up = (0..20).any(|_| {
        c1.run("ping -c 1 -W 1 10.77.0.2", T).status.success()
            || x.c2.run("ping -c 1 -W 1 10.77.0.1", T).status.success()
    });
    assert!(up, "{kind}: no ping crossed OVS: {}", x.explain());
    for size in [56, 1400] {
        for (from, to) in [(c1, "10.77.0.2"), (&x.c2, "10.77.0.1")] {
            let out = from.run(&format!("ping -c 3 -i 0.2 -W 2 -M do -s {size} {to}"), T);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains(" 0% packet loss"),
                "{kind}: ping -s {size} {to}: {text}\n{}",
                x.explain()
            );
        }
    }
    let l = x
        .net
        .v
        .port("vale0:tun")
        .and_then(|p| p.negotiated)
        .expect("counters");
    for bad in [
        "bad-header",
        "wrong-vni",
        "critical",
        "unknown-vtep",
        "too-big",
    ] {
        assert!(l.contains(&format!(" {bad} 0 ")), "{kind}: {bad}: {l}");
    }
}

#[test]
fn vxlan_interoperates_with_open_vswitch() {
    pings_cross("vxlan");
}

#[test]
fn geneve_interoperates_with_open_vswitch() {
    pings_cross("geneve");
}

//! Guests that libvirt runs, on vale's vhost-user ports: the domain of docs/libvirt.md, read
//! from the page itself so that the documented XML is the tested one, defined in a libvirtd of
//! the test's own (`vale_tests::libvirt`), in both socket roles (valed listening, QEMU
//! connecting; QEMU listening with `mode='server'`, valed connecting with `--client`). The
//! guest pings a namespace behind a TAP port of the same switch and is pinged from it, comes
//! up with the MTU and queue pairs the domain asks for, passes traffic again after valed is
//! stopped and started (its ports restored from its configuration: QEMU connects again as
//! `<reconnect>` says, or valed connects to QEMU), is destroyed (the port stays, down) and
//! started again on the same socket, and passes traffic again.
//!
//! Needs root, iproute2, QEMU, a kernel and busybox (as tests/guest.rs) and libvirt
//! (libvirt-daemon-system, libvirt-clients); skipped, saying why, where they are missing
//! outside CI.

use std::path::Path;
use std::time::{Duration, Instant};

use vale_tests::guest::{self, Guest, GuestConfig};
use vale_tests::libvirt::{self, Libvirtd};
use vale_tests::netns::{unique, Netns};
use vale_tests::*;

/// The guest's address and MAC, as the page's domain has them.
const GUEST_IP: &str = "10.79.0.1";
const GUEST_MAC: &str = "02:00:00:00:79:01";
/// The namespace behind the TAP port.
const PEER_IP: &str = "10.79.0.2";
/// The domain's name on the page.
const NAME: &str = "vm1";

/// The page's `xml` blocks: the complete domain (QEMU connecting to valed's socket), and the
/// interface with QEMU listening.
fn page_xml() -> (String, String) {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/libvirt.md");
    let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        match (&mut block, line.trim_start()) {
            (None, "```xml") => block = Some(String::new()),
            (Some(_), "```") => blocks.extend(block.take()),
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    assert_eq!(
        blocks.len(),
        2,
        "docs/libvirt.md should have two xml blocks: the domain, the interface with mode='server'"
    );
    let server = blocks.pop().unwrap();
    (blocks.pop().unwrap(), server)
}

/// `xml` with the page's `from` made `to`; the page must have it.
fn put(xml: &str, from: &str, to: &Path) -> String {
    assert!(
        xml.contains(from),
        "docs/libvirt.md's domain no longer has {from:?}"
    );
    xml.replace(from, to.to_str().expect("path"))
}

/// The page's domain for guest `g` on vhost-user socket `sock`, with QEMU listening there
/// (`server`) or connecting: its own interface element for the role, and the test's paths
/// for the page's.
fn domain(server: bool, g: &Guest, sock: &Path) -> String {
    let (mut xml, server_iface) = page_xml();
    if server {
        let start = xml
            .find("    <interface type='vhostuser'>")
            .expect("the domain's interface");
        let end = xml[start..].find("</interface>\n").expect("its end") + start;
        xml.replace_range(start..end + "</interface>\n".len(), &server_iface);
    }
    // The page's kernel command line is the one the harness gives its guests.
    let cfg = GuestConfig::vhost_user(NAME, sock, server, &format!("{GUEST_IP}/24"), GUEST_MAC);
    let cmdline = format!("<cmdline>{}</cmdline>", guest::cmdline(&cfg));
    assert!(
        xml.contains(&cmdline),
        "docs/libvirt.md's domain should have {cmdline}"
    );
    let kit = guest::kit().expect("guest kit");
    let xml = put(&xml, "/var/lib/vale/guest/vmlinuz", &kit.kernel);
    let xml = put(&xml, "/var/lib/vale/guest/initramfs.cpio", &kit.initramfs);
    let xml = put(&xml, "/var/lib/vale/guest/console.log", &g.console_path());
    let xml = put(&xml, "/var/lib/vale/guest/cmd.sock", &g.command_socket());
    let xml = put(&xml, "/usr/bin/qemu-system-x86_64", &kit.qemu);
    put(&xml, "/run/vale/vm1.sock", sock)
}

/// The guest pings the namespace and is pinged back (`round`, `v`: for the messages); the
/// guest's ping is tried again for up to `settle` (links coming back after valed restarted;
/// zero: once).
fn ping_both_ways(g: &mut Guest, ns: &Netns, v: &Valed, round: &str, settle: Duration) {
    let limit = Duration::from_secs(20);
    let deadline = Instant::now() + settle;
    loop {
        let out = g.run(&format!("ping -c 3 -i 0.2 -W 5 {PEER_IP}"), limit);
        if out.output.contains("3 packets received") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{round}: guest -> namespace: {}\nvaled's log:\n{}",
            out.output,
            v.log()
        );
    }
    let out = ns.run(&format!("ping -c 3 -i 0.2 -W 5 {GUEST_IP}"), limit);
    assert!(
        out.status.success(),
        "{round}: namespace -> guest: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A switch with the namespace behind a TAP port and the guest's vhost-user port (`--client`
/// when QEMU listens), saved in valed's configuration; libvirt starts the domain, the guest
/// pings the namespace and back, shows the domain's MTU; valed is stopped and started again
/// and the guest pings again; the guest is destroyed and started again on the same socket.
fn boots_pings_and_boots_again(server: bool) {
    if let Some(why) = guest::skip_reason().or_else(libvirt::skip_reason) {
        eprintln!("skipped: {why}");
        return;
    }
    let t0 = Instant::now();
    let home = Netns::new("h");
    let cfg_dir = TempDir::new("libvirt-cfg");
    let cfg = cfg_dir.0.join("valed.toml");
    let config = ["--config", cfg.to_str().expect("path")];
    let mut v = Valed::start_in(&home, &config);
    let tap = unique("vtap");
    v.ctl_ok(&["attach", "vale0:c", "--tap", &tap]);
    // QEMU's socket, when it listens, is in a directory of the test's; valed's in its run
    // directory.
    let socks = TempDir::new("libvirt-sock");
    let sock = if server {
        socks.0.join("vm1.sock")
    } else {
        v.run_dir().join("vm1.sock")
    };
    let port = "vale0:vm1";
    let mut attach = vec!["attach", port, "--vhost-user", sock.to_str().unwrap()];
    if server {
        attach.push("--client");
    }
    v.ctl_ok(&attach);
    v.ctl_ok(&["save"]);
    let ns = Netns::new("c");
    let peer = format!("{PEER_IP}/24");
    ns.adopt(Some(&home), &tap, &[&peer]);

    let lv = Libvirtd::start();
    let mut g = Guest::external(NAME);
    // A failed boot shows QEMU's log as libvirt keeps it.
    std::os::unix::fs::symlink(lv.qemu_log(NAME), g.dir().join("qemu.err")).expect("symlink");
    lv.define(&domain(server, &g, &sock));
    let limit = Duration::from_secs(20);
    let mut boots = Vec::new();
    for round in 0..2 {
        g.booting();
        lv.virsh_ok(&["start", NAME]);
        boots.push(g.wait_ready());

        ping_both_ways(&mut g, &ns, &v, &format!("round {round}"), Duration::ZERO);
        // The domain's MTU and queues reached valed and the guest.
        let p = v.port(port).expect("the guest's port");
        let negotiated = p.negotiated.unwrap_or_default();
        assert_eq!(p.state, "up", "round {round}: {port} is {}", p.state);
        assert!(
            negotiated.contains("mq,mtu;") && negotiated.contains("; mtu 9000;"),
            "round {round}: {port} negotiated {negotiated:?}"
        );
        assert_eq!(g.ok("cat /sys/class/net/eth0/mtu", limit).trim(), "9000");

        if round == 0 {
            // valed stopped and started under the running guest: its ports come back from
            // the configuration (the TAP device anew, in valed's namespace), the guest's
            // socket is served again and QEMU connects again (`<reconnect>`), or valed
            // connects to QEMU's socket.
            v.restart_in(&home, &config);
            assert!(
                wait_until(Duration::from_secs(30), || v
                    .port(port)
                    .is_some_and(|p| p.state == "up")),
                "{port} is not up again after valed restarted: {:?}\nvaled's log:\n{}",
                v.port(port),
                v.log()
            );
            ns.adopt(Some(&home), &tap, &[&peer]);
            ping_both_ways(
                &mut g,
                &ns,
                &v,
                "after valed restarted",
                Duration::from_secs(30),
            );
        }

        lv.virsh_ok(&["destroy", NAME]);
        // The port stays, without its front end, for the next QEMU on the socket.
        assert!(
            wait_until(T, || v.port(port).is_some_and(|p| p.state == "down")),
            "round {round}: {port} is not down after the guest was destroyed: {:?}",
            v.port(port)
        );
    }
    lv.virsh_ok(&["undefine", NAME]);
    eprintln!(
        "guest ready after {boots:.1?} (first start, start after destroy); test took {:.1?}",
        t0.elapsed()
    );
}

/// valed listens at the socket (`vale-ctl attach ... --vhost-user PATH`), QEMU connects
/// (`mode='client'`, the page's domain as it stands).
#[test]
fn a_libvirt_guest_on_valeds_socket_passes_traffic_after_destroy_and_start() {
    boots_pings_and_boots_again(false);
}

/// QEMU listens (`mode='server'`), valed connects (`vale-ctl attach ... --client`), and
/// connects again to the QEMU started after the destroy.
#[test]
fn a_libvirt_guest_listening_for_valed_passes_traffic_after_destroy_and_start() {
    boots_pings_and_boots_again(true);
}

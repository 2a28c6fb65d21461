//! Network namespaces for tests with the real Linux stack: each test makes its own, with names
//! that carry the test process's pid, and deletes them when it ends, failed or not. Nothing
//! touches the host's own interfaces. [`TapNet`] and [`NicNet`] build a switch with TAP and NIC
//! ports on them.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::{run_bounded, stdout_of, tool, Valed, T};

/// A network namespace of the test's own, deleted (with its interfaces) when dropped.
pub struct Netns {
    pub name: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name unique to this test process: `<tag><pid mod 100000><n>`, at most 15 characters, so
/// it also serves as an interface name.
pub fn unique(tag: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("{tag}{}{n}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "name {name} too long for an interface");
    name
}

/// Runs a command, requires success, returns its stdout.
pub fn sh_ok(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    stdout_of(&run_bounded(cmd, T * 3), &what)
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        assert!(
            unsafe { libc::geteuid() } == 0,
            "host port tests need root (network namespaces, TAP devices)"
        );
        let name = unique(&format!("vt{tag}"));
        sh_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        ns.ok("ip link set lo up");
        ns
    }

    /// `ip netns exec NS sh -c CMD`, not yet started.
    pub fn cmd(&self, cmd: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, "sh", "-c", cmd]);
        c
    }

    /// Runs a shell command in the namespace, bounded by `limit`.
    pub fn run(&self, cmd: &str, limit: Duration) -> Output {
        run_bounded(&mut self.cmd(cmd), limit)
    }

    /// Runs a shell command in the namespace; it must succeed. Returns its stdout.
    pub fn ok(&self, cmd: &str) -> String {
        sh_ok(&mut self.cmd(cmd))
    }

    /// An interface counter from sysfs.
    pub fn counter(&self, dev: &str, name: &str) -> u64 {
        self.ok(&format!("cat /sys/class/net/{dev}/statistics/{name}"))
            .trim()
            .parse()
            .expect("counter")
    }

    /// Takes interface `dev` from namespace `from` (None: it is here already), gives it the
    /// addresses `addrs` (CIDR; IPv6 without duplicate address detection) and brings it up.
    pub fn adopt(&self, from: Option<&Netns>, dev: &str, addrs: &[&str]) {
        if let Some(ns) = from {
            ns.ok(&format!("ip link set {dev} netns {}", self.name));
        }
        for a in addrs {
            let nodad = if a.contains(':') { " nodad" } else { "" };
            self.ok(&format!("ip addr add {a} dev {dev}{nodad}"));
        }
        self.ok(&format!("ip link set {dev} up"));
    }

    /// The MAC address of `dev`.
    pub fn mac(&self, dev: &str) -> String {
        self.ok(&format!("cat /sys/class/net/{dev}/address"))
            .trim()
            .to_string()
    }
}

/// `iperf3` for 2 s from namespace `client` to a server it starts in `server` at `addr`
/// (`extra`: more client options); its JSON report.
pub fn iperf3_json(client: &Netns, server: &Netns, addr: &str, extra: &str) -> serde_json::Value {
    server.ok("iperf3 -s -1 -D -p 5201");
    std::thread::sleep(Duration::from_millis(300));
    let out = client.run(
        &format!("iperf3 -c {addr} -p 5201 -t 2 -J {extra}"),
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "iperf3 to {addr} {extra} failed: {text}"
    );
    serde_json::from_str(&text).expect("iperf3 JSON")
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill what still runs in it (iperf3 servers), then delete it with its interfaces.
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: plain syscall.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            });
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A valed in namespace `home`, with TAP ports `vale0:<p>` for each of `names`, each TAP moved
/// into a namespace of its own with address 10.77.0.<i+1>/24 and fd77::<i+1>/64.
pub struct TapNet {
    pub hosts: Vec<(Netns, String)>,
    pub v: Valed,
    pub home: Netns,
}

impl TapNet {
    pub fn new(ports: &[&str]) -> TapNet {
        let home = Netns::new("h");
        let v = Valed::start_in(&home, &[]);
        let mut hosts = Vec::new();
        for (i, p) in ports.iter().enumerate() {
            let tap = unique("vtap");
            v.ctl_ok(&["attach", &format!("vale0:{p}"), "--tap", &tap]);
            let ns = Netns::new(p);
            ns.adopt(
                Some(&home),
                &tap,
                &[
                    &format!("10.77.0.{}/24", i + 1),
                    &format!("fd77::{}/64", i + 1),
                ],
            );
            hosts.push((ns, tap));
        }
        TapNet { hosts, v, home }
    }

    pub fn ns(&self, i: usize) -> &Netns {
        &self.hosts[i].0
    }
}

/// A switch with a veth attached as NIC port `vale0:eth` (its peer in namespace `far`, address
/// 10.77.0.10/24) and TAP ports for `taps`, as in [`TapNet`].
pub struct NicNet {
    pub far: Netns,
    pub nic: String,
    pub net: TapNet,
}

impl NicNet {
    pub fn new(mode: Option<&str>, taps: &[&str]) -> NicNet {
        let net = TapNet::new(taps);
        let far = Netns::new("far");
        let nic = unique("vnic");
        let peer = unique("vpeer");
        net.home.ok(&format!(
            "ip link add {nic} type veth peer name {peer} netns {}",
            far.name
        ));
        net.home.ok(&format!("ip link set {nic} up"));
        far.adopt(None, &peer, &["10.77.0.10/24"]);
        // A veth hands over whole TSO segments with checksums left to do; AF_XDP and TPACKET
        // rings take finished frames of one MTU, as from a real NIC.
        far.ok(&format!("ethtool -K {peer} tso off gso off tx off"));
        let mut args = vec!["attach", "vale0:eth", "--iface", nic.as_str()];
        if let Some(m) = mode {
            args.extend(["--mode", m]);
        }
        net.v.ctl_ok(&args);
        NicNet { far, nic, net }
    }

    pub fn far_mac(&self) -> String {
        let dev = self.far.ok("ls /sys/class/net | grep vpeer");
        self.far.mac(dev.trim())
    }
}

impl Valed {
    /// Starts valed inside network namespace `ns`: the interfaces it binds and the TAP devices
    /// it creates live there.
    pub fn start_in(ns: &Netns, args: &[&str]) -> Valed {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns.name]);
        let dir = crate::TempDir::new("valed");
        let valed = tool("valed", &dir.0, args);
        c.arg(valed.get_program()).args(valed.get_args());
        Valed::spawn_in(dir, c)
    }

    /// [`Valed::restart_with`] for a valed of namespace `ns`.
    pub fn restart_in(&mut self, ns: &Netns, args: &[&str]) {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns.name]);
        let valed = tool("valed", &self.dir.0, args);
        c.arg(valed.get_program()).args(valed.get_args());
        self.restart_cmd(c);
    }
}

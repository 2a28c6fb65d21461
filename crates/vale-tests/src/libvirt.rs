//! A libvirtd of the test's own, for guests defined in libvirt domain XML.
//!
//! libvirtd runs as root with the system's paths (`/etc/libvirt`, `/run/libvirt`,
//! `/var/lib/libvirt`, `/var/log/libvirt`, `/var/cache/libvirt`), so the test gives it a world
//! of its own rather than the host's: `unshare` starts it, with virtlogd, in a new mount
//! namespace where directories of a [`TempDir`] are bound over those paths, and in a new PID
//! namespace whose first process dies with `unshare`, which dies with the test process. When
//! [`Libvirtd`] is dropped, or the test process dies however it ends, the kernel ends
//! libvirtd, virtlogd and every QEMU they started; nothing of the host's libvirt (a running
//! system daemon, its configuration, its domains) is read or touched, and several tests may
//! each run their own at once.
//!
//! Its `qemu.conf` runs QEMU as root (the guest's kernel and sockets stay where the test put
//! them, and are neither relabelled nor chowned) without cgroups, security drivers or a mount
//! namespace of QEMU's own, so that a killed libvirtd leaves nothing behind on the host.
//! `virsh` reaches the daemon from outside the namespaces through its socket, under the
//! temporary directory (`qemu+unix:///system?socket=...`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{run_bounded, stdout_of, which, TempDir, T};

/// What this libvirtd's QEMU driver is told: see the module's documentation.
const QEMU_CONF: &str = r#"user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
"#;

/// The host directories each libvirtd gets its own of: (name under the temporary
/// directory, path in its mount namespace).
const DIRS: &[(&str, &str)] = &[
    ("etc", "/etc/libvirt"),
    ("run", "/run"),
    ("lib", "/var/lib/libvirt"),
    ("log", "/var/log/libvirt"),
    ("cache", "/var/cache/libvirt"),
];

/// Why libvirt tests cannot run here, if they cannot: not root, or libvirtd, virtlogd,
/// virsh or unshare missing (outside CI; under CI, as root, a missing one fails the test:
/// `scripts/test.sh` installs libvirt there).
pub fn skip_reason() -> Option<String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Some("libvirt tests need root (libvirtd, namespaces)".into());
    }
    let missing: Vec<&str> = ["libvirtd", "virtlogd", "virsh", "unshare"]
        .into_iter()
        .filter(|t| which(t).is_none() && !Path::new("/usr/sbin").join(t).is_file())
        .collect();
    if missing.is_empty() {
        return None;
    }
    let why = format!(
        "{} not installed (scripts/test.sh installs libvirt-daemon-system and libvirt-clients)",
        missing.join(", ")
    );
    if std::env::var_os("CI").is_some() {
        panic!("libvirt tests cannot run under CI: {why}");
    }
    Some(why)
}

/// A libvirtd (and virtlogd) of the test's own; ended, with every QEMU it started, when
/// dropped.
pub struct Libvirtd {
    dir: TempDir,
    /// `unshare`, whose child (the PID namespace's first process) dies with it.
    child: Child,
}

impl Libvirtd {
    /// Starts libvirtd and waits until `virsh` reaches it.
    pub fn start() -> Libvirtd {
        let dir = TempDir::new("libvirtd");
        for (name, _) in DIRS {
            std::fs::create_dir(dir.0.join(name)).expect("libvirtd directory");
        }
        std::fs::write(dir.0.join("etc/qemu.conf"), QEMU_CONF).expect("qemu.conf");
        std::fs::write(dir.0.join("etc/libvirtd.conf"), "").expect("libvirtd.conf");
        let mut script = String::from("set -e\n");
        for (name, at) in DIRS {
            script += &format!("mount --bind '{}/{name}' {at}\n", dir.0.display());
        }
        // The shell stays the namespace's first process: when it dies, so does everything
        // in the namespace.
        script +=
            "virtlogd &\nlibvirtd -f /etc/libvirt/libvirtd.conf -p /run/libvirtd.pid &\nwait\n";
        let log = std::fs::File::create(dir.0.join("libvirtd.log")).expect("libvirtd.log");
        let mut c = Command::new("unshare");
        c.args(["--mount", "--pid", "--fork", "--kill-child", "--mount-proc"])
            .args(["sh", "-c", &script])
            // The daemons are in /usr/sbin, which a root PATH may lack.
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        // SAFETY: one async-signal-safe syscall between fork and exec: unshare (and through
        // its --kill-child the namespace) goes when the test process does.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = c.spawn().expect("start unshare for libvirtd");
        let mut d = Libvirtd { dir, child };
        let deadline = Instant::now() + T * 3;
        loop {
            let out = run_bounded(&mut d.virsh_cmd(&["version"]), T);
            if out.status.success() {
                break;
            }
            if let Ok(Some(st)) = d.child.try_wait() {
                panic!("libvirtd exited ({st}):\n{}", d.log());
            }
            assert!(
                Instant::now() < deadline,
                "libvirtd does not answer after {:?}: {}\n{}",
                T * 3,
                String::from_utf8_lossy(&out.stderr),
                d.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        d
    }

    /// The URI `virsh -c` reaches this libvirtd at.
    pub fn uri(&self) -> String {
        format!(
            "qemu+unix:///system?socket={}",
            self.dir.0.join("run/libvirt/libvirt-sock").display()
        )
    }

    fn virsh_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("virsh");
        c.args(["-q", "-c", &self.uri()]).args(args);
        c
    }

    /// Runs `virsh ARGS` against this libvirtd, bounded by three times [`T`].
    pub fn virsh(&self, args: &[&str]) -> Output {
        run_bounded(&mut self.virsh_cmd(args), T * 3)
    }

    /// Runs `virsh ARGS`, which must succeed; returns its output.
    pub fn virsh_ok(&self, args: &[&str]) -> String {
        let what = format!("virsh {}", args.join(" "));
        let out = self.virsh(args);
        if !out.status.success() {
            panic!(
                "{what} failed: {}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        stdout_of(&out, &what)
    }

    /// Defines a persistent domain from `xml`.
    pub fn define(&self, xml: &str) {
        let file = self.dir.0.join("domain.xml");
        std::fs::write(&file, xml).expect("domain.xml");
        self.virsh_ok(&["define", file.to_str().expect("path")]);
    }

    /// Where libvirt keeps QEMU's log (its command line and errors) of domain `name`.
    pub fn qemu_log(&self, name: &str) -> PathBuf {
        self.dir.0.join(format!("log/qemu/{name}.log"))
    }

    /// The daemons' own output.
    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.0.join("libvirtd.log")).unwrap_or_default();
        format!("--- libvirtd ---\n{log}")
    }

    /// The host pids of every process under `unshare` (the daemons and their QEMUs).
    fn descendants(&self) -> Vec<u32> {
        let mut parents = std::collections::HashMap::<u32, u32>::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
            if let Some(ppid) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok())
            {
                parents.insert(pid, ppid);
            }
        }
        let root = self.child.id();
        parents
            .keys()
            .copied()
            .filter(|&p| {
                let mut at = p;
                for _ in 0..64 {
                    match parents.get(&at) {
                        Some(&pp) if pp == root => return true,
                        Some(&pp) if pp > 1 => at = pp,
                        _ => return false,
                    }
                }
                false
            })
            .collect()
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        let pids = self.descendants();
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The kernel kills the namespace's processes once its first one is gone: wait until
        // they are, so that the next test (or the check after a run) sees none of them.
        let gone = crate::wait_until(T, || {
            pids.iter()
                .all(|p| !Path::new(&format!("/proc/{p}")).exists())
        });
        if !gone && !std::thread::panicking() {
            panic!("libvirtd's processes {pids:?} outlive it");
        }
    }
}

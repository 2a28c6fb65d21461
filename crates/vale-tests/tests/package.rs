//! valed as a service and vale as a Debian package: the readiness notification a
//! `Type=notify` unit waits for, the unit itself (`systemd-analyze verify`), and the package
//! that scripts/package-deb.sh makes from the tested build, installed with dpkg into a root
//! directory of its own (never over the host's files) and run from its installed paths.

use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vale_abi::control::{SwitchInfo, SOCKET_NAME};
use vale_tests::*;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cmd`, bounded by `limit`, and returns its stdout; fails the test if it fails.
fn ok(cmd: &mut Command, limit: Duration) -> String {
    let what = format!("{cmd:?}");
    let out = run_bounded(cmd, limit);
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts `valed` (a path) for the run directory `dir` with `NOTIFY_SOCKET=notify`, and
/// requires a READY=1 datagram on `sock` that comes only once the control socket takes
/// connections. Returns valed, still running.
fn ready_once_listening(valed: &Path, dir: &Path, notify: &str, sock: &UnixDatagram) -> Kid {
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut cmd = Command::new(valed);
    cmd.arg("--run-dir").arg(dir).env("NOTIFY_SOCKET", notify);
    let kid = Kid::spawn(cmd, "valed");
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no readiness notification from valed: {e}"));
    // The moment the notification is read, a client must get through.
    let connected = UnixStream::connect(dir.join(SOCKET_NAME));
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        msg.lines().any(|l| l == "READY=1"),
        "the notification lacks READY=1: {msg:?}"
    );
    assert!(
        msg.lines().any(|l| l == format!("MAINPID={}", kid.pid())),
        "the notification names another pid: {msg:?}"
    );
    if let Err(e) = connected {
        kid.signal(libc::SIGTERM);
        panic!("READY=1 came before the control socket listens: {e}");
    }
    // One notification only.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    assert!(sock.recv(&mut buf).is_err(), "a second notification came");
    kid
}

#[test]
fn readiness_is_notified_once_the_control_socket_listens() {
    let tmp = TempDir::new("notify");
    let run = tmp.0.join("run");
    let path = tmp.0.join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
    let kid = ready_once_listening(&bin("valed"), &run, path.to_str().unwrap(), &sock);
    kid.signal(libc::SIGTERM);
    // Told to exit, it says so before it goes.
    sock.set_read_timeout(Some(T)).expect("timeout");
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no STOPPING=1 from valed after SIGTERM: {e}"));
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg:?}");
    let out = kid.finish(T);
    assert!(
        out.status.success(),
        "valed after SIGTERM: {:?}",
        out.status
    );
}

#[test]
fn readiness_goes_to_an_abstract_notify_socket() {
    use std::os::linux::net::SocketAddrExt;
    let tmp = TempDir::new("notify-abstract");
    let name = format!("vale-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).expect("address");
    let sock = UnixDatagram::bind_addr(&addr).expect("bind the abstract notify socket");
    let kid = ready_once_listening(&bin("valed"), &tmp.0, &format!("@{name}"), &sock);
    kid.signal(libc::SIGTERM);
}

#[test]
fn without_notify_socket_valed_starts_as_ever() {
    let tmp = TempDir::new("no-notify");
    let mut cmd = Command::new(bin("valed"));
    cmd.arg("--run-dir").arg(&tmp.0).env_remove("NOTIFY_SOCKET");
    let kid = Kid::spawn(cmd, "valed");
    assert!(
        wait_until(T, || UnixStream::connect(tmp.0.join(SOCKET_NAME)).is_ok()),
        "valed without NOTIFY_SOCKET never listened"
    );
    kid.signal(libc::SIGTERM);
    let out = kid.finish(T);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "valed after SIGTERM: {:?}: {err}",
        out.status
    );
    assert!(!err.contains("service manager"), "{err}");
}

/// `systemd-analyze verify` of `unit`, with the binaries its ExecStart names found under
/// `root` (`--root`); None when systemd-analyze is not installed. The host's targets
/// (sysinit.target, network.target...) are copied under `root` for the time of the check:
/// the unit's dependencies must resolve there.
fn verify_unit(root_dir: &Path, unit: &Path) -> Option<std::process::Output> {
    let analyze = which("systemd-analyze")?;
    let units = root_dir.join("usr/lib/systemd/system");
    let mut copied = Vec::new();
    for host in ["/usr/lib/systemd/system", "/lib/systemd/system"] {
        let Ok(entries) = std::fs::read_dir(host) else {
            continue;
        };
        for e in entries.flatten() {
            let to = units.join(e.file_name());
            if e.file_name().to_string_lossy().ends_with(".target") && !to.exists() {
                // Copies, not links: systemd-analyze resolves links inside the root.
                if std::fs::copy(e.path(), &to).is_ok() {
                    copied.push(to);
                }
            }
        }
    }
    let out = run_bounded(
        Command::new(analyze)
            .arg("verify")
            .arg(format!("--root={}", root_dir.display()))
            .arg("--man=no")
            .arg(unit),
        Duration::from_secs(60),
    );
    for f in copied {
        let _ = std::fs::remove_file(f);
    }
    Some(out)
}

/// The multiarch directory name of libraries (x86_64-linux-gnu).
fn multiarch() -> String {
    ok(Command::new("cc").arg("-print-multiarch"), T)
        .trim()
        .to_string()
}

/// A root directory with an empty dpkg database, for `dpkg --root`.
fn dpkg_root(dir: &Path) {
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    std::fs::write(dir.join("var/lib/dpkg/status"), "").expect("status");
}

/// `dpkg --root=DIR ARGS`: into DIR only, with the package's scripts run outside a chroot
/// (DIR has no shell); they see DPKG_ROOT and leave the host's systemd alone.
fn dpkg(dir: &Path, args: &[&str]) -> String {
    ok(
        Command::new("dpkg")
            .arg(format!("--root={}", dir.display()))
            .args([
                "--log=/dev/null",
                "--force-script-chrootless",
                "--force-depends",
            ])
            // Whatever the host's dpkg.cfg.d leaves out (man pages, in slim images).
            .arg("--path-include=/*")
            .args(args),
        Duration::from_secs(120),
    )
}

#[test]
fn debian_package_installs_and_runs_from_its_paths() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the package test needs root (dpkg installs into a directory of its own)"
    );
    let started = Instant::now();
    let tmp = TempDir::new("deb");
    let built = bin("valed").parent().expect("target dir").to_path_buf();

    // The package, from the binaries these tests run (nothing is rebuilt).
    let stdout = ok(
        Command::new(root().join("scripts/package-deb.sh"))
            .arg("--from")
            .arg(&built)
            .arg("-o")
            .arg(&tmp.0),
        Duration::from_secs(300),
    );
    let deb = PathBuf::from(stdout.lines().last().expect("package path").trim());
    assert!(deb.is_file(), "no package at {}", deb.display());
    let info = ok(Command::new("dpkg-deb").arg("--info").arg(&deb), T);
    for f in [
        "Package: vale",
        "Depends: libc6 (>= 2.",
        "conffiles",
        "postinst",
    ] {
        assert!(info.contains(f), "dpkg-deb --info lacks {f:?}:\n{info}");
    }
    let ma = multiarch();
    let listing = ok(Command::new("dpkg-deb").arg("--contents").arg(&deb), T);
    for f in [
        "./usr/bin/valed".to_string(),
        "./usr/bin/vale-ctl".into(),
        "./usr/bin/vale-pktgen".into(),
        "./usr/lib/cni/vale-cni".into(),
        format!("./usr/lib/{ma}/libvale.so"),
        format!("./usr/lib/{ma}/libvale.a"),
        format!("./usr/lib/{ma}/pkgconfig/libvale.pc"),
        "./usr/include/vale.h".into(),
        "./usr/include/vale_lookup.h".into(),
        "./usr/lib/systemd/system/valed.service".into(),
        "./etc/default/valed".into(),
        "./etc/vale/valed.toml".into(),
        "./usr/share/man/man8/valed.8.gz".into(),
        "./usr/share/man/man1/vale-ctl.1.gz".into(),
        "./usr/share/man/man1/vale-ctl-list.1.gz".into(),
        "./usr/share/man/man1/vale-pktgen.1.gz".into(),
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(&f)),
            "the package lacks {f}:\n{listing}"
        );
    }
    assert!(
        listing.lines().all(|l| l.contains(" root/root ")),
        "files not owned by root:\n{listing}"
    );

    // Installed with dpkg -i into a root directory of its own.
    let dest = tmp.0.join("root");
    dpkg_root(&dest);
    dpkg(&dest, &["-i", deb.to_str().unwrap()]);
    let status = ok(
        Command::new("dpkg-query")
            .arg(format!("--root={}", dest.display()))
            .args(["-W", "-f=${Status}", "vale"]),
        T,
    );
    assert_eq!(status, "install ok installed");
    let usr_bin = dest.join("usr/bin");
    let libdir = dest.join("usr/lib").join(&ma);

    // The man pages are the tools' --help, rendered.
    let page = dest.join("usr/share/man/man8/valed.8.gz");
    if let Some(man) = which("man") {
        let text = ok(
            Command::new(man)
                .arg("-l")
                .arg(&page)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "100"),
            T,
        );
        // The footer names the source, "vale VERSION", and a date: the .TH line is whole.
        let footer = format!("vale {}", env!("CARGO_PKG_VERSION"));
        for s in [
            "--busy-poll-us",
            "--admin-group",
            "VALE_RUN_DIR",
            "SYNOPSIS",
            &footer,
        ] {
            assert!(text.contains(s), "valed(8) lacks {s}:\n{text}");
        }
    }

    // The default configuration, as installed, is one valed reads.
    let conf = dest.join("etc/vale/valed.toml");
    let check = ok(
        Command::new(usr_bin.join("valed"))
            .arg("--config")
            .arg(&conf)
            .arg("--check-config"),
        T,
    );
    assert!(check.contains("valid"), "valed --check-config: {check}");

    // The unit, as installed, passes systemd-analyze (ExecStart is found under the root).
    let unit = dest.join("usr/lib/systemd/system/valed.service");
    match verify_unit(&dest, &unit) {
        Some(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && !err.contains("valed.service"),
                "systemd-analyze verify valed.service ({}):\n{err}",
                out.status
            );
        }
        None => eprintln!("systemd-analyze is not installed: the unit is not verified"),
    }

    // A switch from the installed paths: valed (ready when it says so), vale-ctl, vale-pktgen.
    let run = tmp.0.join("run");
    let notify = tmp.0.join("notify.sock");
    let sock = UnixDatagram::bind(&notify).expect("bind the notify socket");
    let valed = ready_once_listening(
        &usr_bin.join("valed"),
        &run,
        notify.to_str().unwrap(),
        &sock,
    );
    let ctl = |args: &[&str]| {
        ok(
            Command::new(usr_bin.join("vale-ctl"))
                .arg("--run-dir")
                .arg(&run)
                .args(args),
            T,
        )
    };
    let ports = || -> Vec<String> {
        serde_json::from_str::<Vec<SwitchInfo>>(&ctl(&["--json", "list"]))
            .expect("list --json parses")
            .into_iter()
            .flat_map(|s| s.ports)
            .map(|p| p.name)
            .collect()
    };
    ctl(&["create", "vale0:p"]);
    assert_eq!(ports(), ["vale0:p"]);
    let pktgen = |args: &[&str]| {
        let mut c = Command::new(usr_bin.join("vale-pktgen"));
        c.arg("--run-dir")
            .arg(&run)
            .args(args)
            .env("VALE_NO_AUTOSTART", "1");
        c
    };
    let rx = Kid::spawn(
        pktgen(&[
            "-i", "vale0:b", "-f", "rx", "-n", "1000", "-T", "20", "--json", "-q",
        ]),
        "installed vale-pktgen rx",
    );
    assert!(
        wait_until(T, || ports().iter().any(|p| p == "vale0:b")),
        "the receiver's port never appeared: {:?}",
        ports()
    );
    let tx = run_bounded(
        &mut pktgen(&[
            "-i", "vale0:a", "-f", "tx", "-n", "1000", "-l", "60", "--json", "-q",
        ]),
        T * 2,
    );
    report(&tx, "installed vale-pktgen tx");
    let rx = report(&rx.finish(T * 3), "installed vale-pktgen rx");
    assert_eq!(rx["packets"], 1000, "the receiver's report: {rx}");

    // A C program built against the installed header and library through pkg-config.
    let pc = ok(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "libvale"])
            .env("PKG_CONFIG_SYSROOT_DIR", &dest)
            .env("PKG_CONFIG_LIBDIR", libdir.join("pkgconfig")),
        T,
    );
    assert!(
        pc.contains(&format!("-I{}/usr/include", dest.display())) && pc.contains("-lvale"),
        "pkg-config libvale: {pc}"
    );
    let exe = tmp.0.join("installed_hello");
    ok(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(root().join("tests/c/installed_hello.c"))
            .arg("-o")
            .arg(&exe)
            .args(pc.split_whitespace()),
        Duration::from_secs(60),
    );
    let hello = run_bounded(
        Command::new(&exe)
            .arg("valec")
            .env("VALE_RUN_DIR", &run)
            .env("VALE_NO_AUTOSTART", "1")
            .env("LD_LIBRARY_PATH", &libdir)
            .env("LD_DEBUG", "libs"),
        T,
    );
    let (out, err) = (
        String::from_utf8_lossy(&hello.stdout),
        String::from_utf8_lossy(&hello.stderr),
    );
    assert!(
        hello.status.success() && out.contains("frame ok"),
        "the C program failed ({}):\n{out}\n{err}",
        hello.status
    );
    // The loader took the installed libvale.so.
    let installed_so = format!("{}/libvale.so", libdir.display());
    assert!(
        err.lines()
            .any(|l| l.contains("calling init:") && l.contains(&installed_so)),
        "{installed_so} was not the libvale loaded:\n{err}"
    );
    // A netmap program built against the installed netmap headers, libnetmap and device
    // library, through pkg-config vale-netmap.
    let pc = ok(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "vale-netmap"])
            .env("PKG_CONFIG_SYSROOT_DIR", &dest)
            .env("PKG_CONFIG_LIBDIR", libdir.join("pkgconfig")),
        T,
    );
    let netmap = |name: &str| {
        let exe = tmp.0.join(name);
        ok(
            Command::new("cc")
                .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
                .arg(root().join("tests/c/netmap"))
                .arg(root().join(format!("tests/c/netmap/{name}.c")))
                .arg("-o")
                .arg(&exe)
                .args(pc.split_whitespace())
                .arg("-lpthread"),
            Duration::from_secs(60),
        );
        let mut c = Command::new(exe);
        c.env("VALE_RUN_DIR", &run)
            .env("VALE_NO_AUTOSTART", "1")
            .env("LD_LIBRARY_PATH", &libdir);
        c
    };
    let mut recv = netmap("nm_recv");
    let mut send = netmap("nm_send");
    let rx = Kid::spawn(
        recv.args(["vale0:nr", "1000", "60", "1", "800"]),
        "installed nm_recv",
    );
    assert!(
        wait_until(T, || ports().iter().any(|p| p == "vale0:nr")),
        "the netmap receiver's port never appeared: {:?}",
        ports()
    );
    let sent = run_bounded(send.args(["vale0:ns", "1000", "60"]), T * 2);
    assert!(sent.status.success(), "installed nm_send: {sent:?}");
    let got = rx.finish(T * 3);
    assert!(
        String::from_utf8_lossy(&got.stdout).contains("received 1000 bad 0"),
        "installed nm_recv: {got:?}"
    );

    valed.signal(libc::SIGTERM);
    let out = valed.finish(T);
    assert!(
        out.status.success(),
        "installed valed after SIGTERM: {:?}",
        out.status
    );

    // Purged, it leaves nothing behind, its configuration file included.
    dpkg(&dest, &["--purge", "vale"]);
    for f in [
        "usr/bin/valed",
        "usr/lib/cni/vale-cni",
        "etc/default/valed",
        "etc/vale/valed.toml",
        "usr/include/vale.h",
    ] {
        assert!(
            !dest.join(f).exists(),
            "{f} is still there after dpkg --purge"
        );
    }
    eprintln!(
        "package built, installed, run and purged in {:?}",
        started.elapsed()
    );
}

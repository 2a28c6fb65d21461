//! The kind of a refusal reaches C as its errno: valed's error reply carries a kind, and one
//! table (`vale_abi::error::ErrorKind`) turns it into the errno of libvale's C API and, where
//! netmap has its own choice, of the netmap emulation. Needs root (a user without rights).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use vale_tests::*;

const NOBODY: u32 = 65534;

fn root_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn is_root() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// tests/c/vale_errno.c linked with libvale.a, and tests/c/netmap/nm_errno.c with a copy of
/// the preload library beside it, in `dir` (0755: any user may run them).
fn build(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let target = bin("valed").parent().expect("target dir").to_path_buf();
    let vale_exe = dir.join("vale_errno");
    compile(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(root_dir().join("crates/libvale/include"))
            .arg(root_dir().join("tests/c/vale_errno.c"))
            .arg(target.join("libvale.a"))
            .args(["-lpthread", "-ldl", "-lm", "-o"])
            .arg(&vale_exe),
    );
    let nm_exe = dir.join("nm_errno");
    compile(
        Command::new("cc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(root_dir().join("crates/libvale/include/vale-netmap"))
            .arg("-I")
            .arg(root_dir().join("tests/c/netmap"))
            .arg(root_dir().join("tests/c/netmap/nm_errno.c"))
            .arg("-o")
            .arg(&nm_exe),
    );
    let lib = dir.join("libvale_netmap.so");
    std::fs::copy(target.join("libvale_netmap.so"), &lib).expect("copy the preload library");
    (vale_exe, nm_exe, lib)
}

/// `exe PORT` as user `uid`, a client of `v`, its stdin a pipe that holds an opened port.
fn spawn(v: &Valed, exe: &Path, preload: Option<&Path>, uid: u32, port: &str) -> Child {
    let mut c = Command::new(exe);
    c.arg(port)
        .env("VALE_RUN_DIR", v.run_dir())
        .env("VALE_NO_AUTOSTART", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(lib) = preload {
        c.env("LD_PRELOAD", lib);
    }
    if uid != 0 {
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(move || {
                if libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setgid(uid) == 0
                    && libc::setuid(uid) == 0
                {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    c.spawn().expect("spawn")
}

/// The errno the program reports, and what it said beside it.
fn errno_of(kid: &mut Child) -> (i32, String) {
    let mut out = BufReader::new(kid.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read");
    let n = line
        .strip_prefix("errno ")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no errno line: {line:?}"));
    let mut why = String::new();
    let _ = out.read_line(&mut why);
    (n, why.trim().to_string())
}

/// Runs `exe PORT` as `uid` to its answer; the port it opened (if any) is let go at once.
fn refusal(v: &Valed, exe: &Path, preload: Option<&Path>, uid: u32, port: &str) -> (i32, String) {
    let mut kid = spawn(v, exe, preload, uid, port);
    let r = errno_of(&mut kid);
    drop(kid.stdin.take());
    let _ = kid.wait();
    r
}

#[test]
fn each_kind_of_refusal_is_its_errno_in_c_and_in_netmap() {
    if !is_root() {
        eprintln!("skipped: needs root (a user without rights)");
        return;
    }
    let dir = TempDir::new("errno");
    let (vale_exe, nm_exe, lib) = build(&dir.0);
    let v = Valed::start_with(&["--socket-mode", "666", "--max-ports-per-user", "1"]);
    v.ctl_ok(&["create", "vale0:root"]);

    // A bad name: EINVAL, from the library's own check and from valed's.
    for name in ["vale0", "vale0:a b"] {
        let (e, why) = refusal(&v, &vale_exe, None, 0, name);
        assert_eq!(e, libc::EINVAL, "vale_open({name:?}): {why}");
    }
    // A port of another user: EACCES in C, EPERM in netmap, as netmap gives.
    let (e, why) = refusal(&v, &vale_exe, None, NOBODY, "vale0:root");
    assert_eq!(e, libc::EACCES, "{why}");
    assert!(why.contains("belongs to uid 0"), "{why}");
    let (e, _) = refusal(&v, &nm_exe, Some(&lib), NOBODY, "vale0:root");
    assert_eq!(e, libc::EPERM, "netmap, a port of another user");

    // A port in use: EBUSY both ways.
    let mut holder = spawn(&v, &vale_exe, None, 0, "vale0:held");
    assert_eq!(errno_of(&mut holder).0, 0, "the holder opens its port");
    let (e, why) = refusal(&v, &vale_exe, None, 0, "vale0:held");
    assert_eq!(e, libc::EBUSY, "{why}");
    let (e, _) = refusal(&v, &nm_exe, Some(&lib), 0, "vale0:held");
    assert_eq!(e, libc::EBUSY, "netmap, a port in use");
    drop(holder.stdin.take());
    let _ = holder.wait();

    // A limit: ENOSPC in C, ENOMEM in netmap (nobody may hold one port).
    let mut one = spawn(&v, &vale_exe, None, NOBODY, "vale0:n1");
    assert_eq!(errno_of(&mut one).0, 0, "nobody's first port");
    let (e, why) = refusal(&v, &vale_exe, None, NOBODY, "vale0:n2");
    assert_eq!(e, libc::ENOSPC, "{why}");
    assert!(why.contains("--max-ports-per-user"), "{why}");
    let (e, _) = refusal(&v, &nm_exe, Some(&lib), NOBODY, "vale0:n2");
    assert_eq!(e, libc::ENOMEM, "netmap, past a limit");
    drop(one.stdin.take());
    let _ = one.wait();
}

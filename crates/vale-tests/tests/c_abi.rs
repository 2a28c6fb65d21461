//! The C interface as a C (or C++) program sees it: vale.h compiles cleanly, and
//! tests/c/vale_abi_check.c, linked against libvale.so or libvale.a, talks to a real valed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vale_tests::*;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where cargo put libvale.so, libvale.a and the binaries.
fn target_dir() -> PathBuf {
    bin("valed").parent().expect("target dir").to_path_buf()
}

fn include_dir() -> PathBuf {
    root().join("crates/libvale/include")
}

/// Runs a compiler, failing the test with its output if it fails (or is missing).
fn compile(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (a C compiler is required): {e}"));
    assert!(
        out.status.success(),
        "compilation failed: {cmd:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `cmd` to completion, killing it after `limit`.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // Read both pipes in threads so a chatty child never blocks on a full pipe.
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t_out.join().expect("stdout reader"),
        stderr: t_err.join().expect("stderr reader"),
    }
}

/// Runs the compiled checker against a fresh valed and requires it to pass.
fn run_checker(exe: &Path, v: &Valed) {
    let out = run_bounded(
        Command::new(exe)
            .arg("valec")
            .env("VALE_RUN_DIR", v.run_dir())
            .env("VALE_NO_AUTOSTART", "1"),
        Duration::from_secs(20),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\nvaled log:\n{}",
        exe.display(),
        out.status,
        v.log()
    );
    assert!(
        stdout.lines().any(|l| l.contains("frames ok")),
        "no 'frames ok' line from {}:\n{stdout}",
        exe.display()
    );
}

#[test]
fn c_program_against_shared_library() {
    let tmp = TempDir::new("cabi-so");
    let exe = tmp.0.join("vale_abi_check");
    let lib = target_dir();
    assert!(
        lib.join("libvale.so").is_file(),
        "{} missing: build the workspace first",
        lib.join("libvale.so").display()
    );
    compile(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg("-I")
            .arg(include_dir())
            .arg(root().join("tests/c/vale_abi_check.c"))
            .arg("-o")
            .arg(&exe)
            .arg(format!("-L{}", lib.display()))
            .arg("-lvale")
            .arg(format!("-Wl,-rpath,{}", lib.display())),
    );
    let bytes = std::fs::read(&exe).expect("read executable");
    assert!(
        bytes.windows(10).any(|w| w == b"libvale.so"),
        "the executable does not name libvale.so: not dynamically linked?"
    );
    let v = Valed::start();
    run_checker(&exe, &v);
    // Its ports are gone with it.
    let deadline = Instant::now() + Duration::from_secs(2);
    while v.port("valec:a").is_some() || v.port("valec:b").is_some() {
        assert!(Instant::now() < deadline, "the checker's ports outlived it");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn c_program_against_static_library() {
    let tmp = TempDir::new("cabi-a");
    let exe = tmp.0.join("vale_abi_check_static");
    let lib = target_dir();
    let archive = lib.join("libvale.a");
    assert!(
        archive.is_file(),
        "{} missing: build the workspace first",
        archive.display()
    );
    compile(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg("-I")
            .arg(include_dir())
            .arg(root().join("tests/c/vale_abi_check.c"))
            .arg("-o")
            .arg(&exe)
            .arg(&archive)
            .args(["-lpthread", "-ldl", "-lm"]),
    );
    let bytes = std::fs::read(&exe).expect("read executable");
    assert!(
        !bytes.windows(10).any(|w| w == b"libvale.so"),
        "the statically linked executable still needs libvale.so"
    );
    let v = Valed::start();
    run_checker(&exe, &v);
}

/// A translation unit that includes vale.h and checks a few facts again, the C++ way.
const CXX_PROGRAM: &str = r#"
#include <vale.h>
#include <cstddef>

static_assert(sizeof(struct netmap_slot) == 16, "slot");
static_assert(offsetof(struct netmap_ring, slot) == 256, "ring header");
static_assert(alignof(struct netmap_ring) == 128, "ring alignment");
static_assert(sizeof(struct netmap_if) == 56, "netmap_if");
static_assert(sizeof(struct nm_csb_atok) == 64 && sizeof(struct nm_csb_ktoa) == 64, "csb");
static_assert(sizeof(struct vale_region) == 256, "region header");
static_assert(NS_MOREFRAG == 0x20 && NS_INDIRECT == 0x10, "flags");
static_assert(VALE_POLLIN == 1 && VALE_POLLOUT == 2, "poll bits");

int main()
{
    struct vale_open_opts o;
    vale_open_opts_init(&o);
    struct vale_port *p = vale_open("vale0:cxx", &o);
    if (p) {
        (void)vale_nifp(p);
        (void)vale_region(p);
        (void)vale_txsync(p, 0);
        (void)vale_rxsync(p, 0);
        (void)vale_poll(p, VALE_POLLIN | VALE_POLLOUT, 0);
        vale_close(p);
    }
    return vale_last_error() == nullptr;
}
"#;

#[test]
fn header_compiles_as_cxx_with_static_asserts() {
    let tmp = TempDir::new("cabi-cxx");
    let src = tmp.0.join("vale_cxx.cpp");
    std::fs::write(&src, CXX_PROGRAM).expect("write C++ source");
    compile(
        Command::new("c++")
            .args([
                "-std=c++11",
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-x",
                "c++",
            ])
            .arg("-I")
            .arg(include_dir())
            .arg(&src),
    );
    // A failing static assertion must actually fail the build (the checks are live).
    let bad = tmp.0.join("vale_cxx_bad.cpp");
    std::fs::write(
        &bad,
        "#include <vale.h>\nstatic_assert(sizeof(struct netmap_slot) == 17, \"must fail\");\n",
    )
    .expect("write C++ source");
    let out = Command::new("c++")
        .args(["-std=c++11", "-fsyntax-only", "-x", "c++"])
        .arg("-I")
        .arg(include_dir())
        .arg(&bad)
        .output()
        .expect("run c++");
    assert!(
        !out.status.success(),
        "a false static_assert compiled: the header's checks would not catch anything"
    );
    // And the header alone is clean C11 with -pedantic too.
    let c_src = tmp.0.join("vale_c.c");
    std::fs::write(&c_src, "#include <vale.h>\nint main(void) { return 0; }\n").expect("write");
    compile(
        Command::new("cc")
            .args([
                "-std=c11",
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
            ])
            .arg("-I")
            .arg(include_dir())
            .arg(&c_src),
    );
}

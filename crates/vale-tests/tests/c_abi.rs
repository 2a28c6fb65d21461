//! The C interface as a C (or C++) program sees it: vale.h compiles cleanly, and
//! tests/c/vale_abi_check.c, linked against libvale.so or libvale.a, talks to a real valed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vale_tests::*;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where cargo put libvale.so, libvale.a and the binaries.
fn target_dir() -> PathBuf {
    bin("valed").parent().expect("target dir").to_path_buf()
}

/// `name`, built into the target directory (which must hold it).
fn built(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.is_file(),
        "{} missing: build the workspace first",
        p.display()
    );
    p
}

/// `compiler ARGS -I <the directory of vale.h>`, not yet run.
fn compiler(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(name);
    c.args(args)
        .arg("-I")
        .arg(root().join("crates/libvale/include"));
    c
}

/// `cc` building tests/c/vale_abi_check.c into `exe` with every warning an error; the caller
/// adds the library to link.
fn build_checker(exe: &Path) -> Command {
    let mut c = compiler("cc", &["-std=c11", "-Wall", "-Wextra", "-Werror"]);
    c.arg(root().join("tests/c/vale_abi_check.c"))
        .arg("-o")
        .arg(exe);
    c
}

/// Builds the checker into `exe` against the workspace's libvale.so (found at run time by
/// its rpath).
fn compile_against_shared_library(exe: &Path) {
    built("libvale.so");
    let lib = target_dir();
    compile(
        build_checker(exe)
            .arg(format!("-L{}", lib.display()))
            .arg("-lvale")
            .arg(format!("-Wl,-rpath,{}", lib.display())),
    );
}

/// Whether the executable `exe` names libvale.so (is linked against it dynamically).
fn names_libvale_so(exe: &Path) -> bool {
    let bytes = std::fs::read(exe).expect("read executable");
    bytes.windows(10).any(|w| w == b"libvale.so")
}

/// Runs the compiled checker against a fresh valed and requires it to pass.
fn run_checker(exe: &Path, v: &Valed) {
    run_checker_with(exe, v, &[]);
}

/// As [`run_checker`], with the checker's options `opts` (`-b`: busy-waiting ports).
fn run_checker_with(exe: &Path, v: &Valed, opts: &[&str]) {
    let out = run_bounded(
        Command::new(exe)
            .args(opts)
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
    compile_against_shared_library(&exe);
    assert!(
        names_libvale_so(&exe),
        "the executable does not name libvale.so: not dynamically linked?"
    );
    let v = Valed::start();
    run_checker(&exe, &v);
    // Its ports are gone with it.
    assert!(
        wait_until_every(Duration::from_secs(2), Duration::from_millis(10), || {
            v.port("valec:a").is_none() && v.port("valec:b").is_none()
        }),
        "the checker's ports outlived it"
    );
}

#[test]
fn c_program_against_static_library() {
    let tmp = TempDir::new("cabi-a");
    let exe = tmp.0.join("vale_abi_check_static");
    let archive = built("libvale.a");
    compile(
        build_checker(&exe)
            .arg(&archive)
            .args(["-lpthread", "-ldl", "-lm"]),
    );
    assert!(
        !names_libvale_so(&exe),
        "the statically linked executable still needs libvale.so"
    );
    let v = Valed::start();
    run_checker(&exe, &v);
}

/// The same frames with both ports busy-waiting (`vale_set_busy_wait(p, -1)`), through a
/// valed that sleeps (the clients' kicks wake it) and one that busy-polls (no kick needed).
#[test]
fn c_program_busy_waiting() {
    let tmp = TempDir::new("cabi-busy");
    let exe = tmp.0.join("vale_abi_check_busy");
    compile_against_shared_library(&exe);
    for valed_args in [&[][..], &["--busy-poll-us", "50"][..]] {
        let v = Valed::start_with(valed_args);
        run_checker_with(&exe, &v, &["-b"]);
    }
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
        (void)vale_set_busy_wait(p, -1);
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
        compiler(
            "c++",
            &[
                "-std=c++11",
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-x",
                "c++",
            ],
        )
        .arg(&src),
    );
    // A failing static assertion must actually fail the build (the checks are live).
    let bad = tmp.0.join("vale_cxx_bad.cpp");
    std::fs::write(
        &bad,
        "#include <vale.h>\nstatic_assert(sizeof(struct netmap_slot) == 17, \"must fail\");\n",
    )
    .expect("write C++ source");
    let out = compiler("c++", &["-std=c++11", "-fsyntax-only", "-x", "c++"])
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
        compiler(
            "cc",
            &[
                "-std=c11",
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
            ],
        )
        .arg(&c_src),
    );
}

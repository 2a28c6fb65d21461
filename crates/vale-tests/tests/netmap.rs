//! netmap programs on vale: programs written against netmap's standard API (tests/c/netmap),
//! each built twice from the same source with vale's netmap headers: once linked with
//! libvale_netmap.so (a netmap program recompiled for vale), once without it and run under
//! `LD_PRELOAD` (a netmap program as it was built, unmodified). Frames are checked byte by
//! byte by the receivers and the counts must add up with valed's counters.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use vale_tests::{bin, compile, run_bounded, stdout_of, ticks_per_second, Kid, TempDir, Valed};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The preload library, as cargo built it.
fn library() -> PathBuf {
    let p = bin("valed").with_file_name("libvale_netmap.so");
    assert!(
        p.is_file(),
        "{} missing: build the workspace first",
        p.display()
    );
    p
}

/// How a program reaches libvale-netmap.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    /// Built against vale's headers and linked with the library.
    Linked,
    /// Built without it, the library preloaded: as an existing netmap binary runs.
    Preloaded,
}

const WAYS: [Way; 2] = [Way::Linked, Way::Preloaded];
const PROGRAMS: [&str; 7] = [
    "nm_send",
    "nm_recv",
    "nm_forward",
    "nm_forkstress",
    "nm_stale",
    "nm_wild",
    "nm_link",
];

/// The directory of the programs, built once per test run: vale's libnetmap.a from its C
/// source, then every program in both ways, with every warning an error.
fn programs() -> &'static Path {
    static DIR: OnceLock<TempDir> = OnceLock::new();
    &DIR.get_or_init(|| {
        let dir = TempDir::new("netmap-programs");
        let include = root().join("crates/libvale/include/vale-netmap");
        let src = root().join("tests/c/netmap");
        let cc = |args: &[&str]| {
            let mut c = Command::new("cc");
            c.args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
                .arg(&include)
                .arg("-I")
                .arg(&src)
                .args(args)
                .current_dir(&dir.0);
            c
        };
        compile(cc(&["-c"]).arg(root().join("crates/vale-netmap/c/nmport.c")));
        compile(
            Command::new("ar")
                .args(["rcs", "libnetmap.a", "nmport.o"])
                .current_dir(&dir.0),
        );
        let lib = library();
        let libdir = lib.parent().expect("target dir").to_path_buf();
        for p in PROGRAMS {
            let c_file = src.join(format!("{p}.c"));
            compile(cc(&["-o", &format!("{p}.pre")]).arg(&c_file).args([
                "-L.",
                "-lnetmap",
                "-lpthread",
            ]));
            compile(
                cc(&["-o", &format!("{p}.link")])
                    .arg(&c_file)
                    .args(["-L.", "-lnetmap", "-L"])
                    .arg(&libdir)
                    .arg("-lvale_netmap")
                    .arg(format!("-Wl,-rpath,{}", libdir.display()))
                    .arg("-lpthread"),
            );
        }
        dir
    })
    .0
}

/// `program ARGS` the given way, a client of `v`.
fn program(v: &Valed, way: Way, name: &str, args: &[&str]) -> Command {
    let ext = if way == Way::Linked { "link" } else { "pre" };
    let mut c = Command::new(programs().join(format!("{name}.{ext}")));
    c.args(args)
        .env("VALE_RUN_DIR", v.run_dir())
        .env("VALE_NO_AUTOSTART", "1");
    if way == Way::Preloaded {
        c.env("LD_PRELOAD", library());
    }
    c
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The numbers after `word` in a program's output line that starts with it.
fn numbers(out: &Output, word: &str) -> Vec<u64> {
    let s = text(out);
    let line = s.lines().find(|l| l.starts_with(word)).unwrap_or_else(|| {
        panic!(
            "no '{word}' line in {s:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().expect("number"))
        .collect()
}

/// Starts the receiver and waits until it is ready (its port open).
fn receiver(v: &Valed, way: Way, port: &str, count: u64, len: u32, threads: u32) -> Kid {
    let args = [
        port,
        &count.to_string(),
        &len.to_string(),
        &threads.to_string(),
        "800",
    ];
    let kid = Kid::spawn(program(v, way, "nm_recv", &args), "nm_recv");
    assert!(
        vale_tests::wait_until(Duration::from_secs(10), || v
            .port(port)
            .is_some_and(|p| p.owner_pid == Some(kid.pid()))),
        "nm_recv never opened {port}: {}",
        v.log()
    );
    kid
}

fn send(v: &Valed, way: Way, port: &str, count: u64, len: u32) -> Output {
    let out = run_bounded(
        &mut program(
            v,
            way,
            "nm_send",
            &[port, &count.to_string(), &len.to_string()],
        ),
        Duration::from_secs(40),
    );
    stdout_of(&out, "nm_send");
    assert_eq!(numbers(&out, "sent"), [count]);
    out
}

/// The receiver's result: (received, bad, per ring).
fn received(kid: Kid) -> (u64, u64, Vec<u64>) {
    let out = kid.finish(Duration::from_secs(40));
    let n = numbers(&out, "received");
    assert!(
        out.status.success() && n[1] == 0,
        "nm_recv saw bad frames or failed: {}{}",
        text(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    (n[0], n[1], n[2..].to_vec())
}

/// Every frame `sent` reached the port's rx ring or was counted as an rx drop there, and the
/// receiver read every frame delivered.
fn counts_add_up(v: &Valed, port: &str, sent: u64, got: u64) {
    let c = v.counters(port);
    assert_eq!(
        c.rx_packets + c.rx_drops,
        sent,
        "{port}: delivered {} + dropped {} != sent {sent}",
        c.rx_packets,
        c.rx_drops
    );
    assert_eq!(
        got, c.rx_packets,
        "{port}: read {got} of {} delivered",
        c.rx_packets
    );
    assert!(
        got > sent / 2,
        "{port}: only {got} of {sent} frames arrived"
    );
}

#[test]
fn a_sender_and_a_receiver_on_nmport_pass_every_byte() {
    let v = Valed::start();
    let mut k = 0;
    for way in WAYS {
        for len in [60u32, 1514] {
            k += 1;
            let (s, r) = (format!("vale{k}:s"), format!("vale{k}:r"));
            // Persistent: the counters stay for the check after the programs exit.
            v.ctl_ok(&["create", &s]);
            v.ctl_ok(&["create", &r]);
            let rx = receiver(&v, way, &r, 4000, len, 1);
            send(&v, way, &s, 4000, len);
            let (got, _, _) = received(rx);
            counts_add_up(&v, &r, 4000, got);
            assert_eq!(v.counters(&s).tx_packets, 4000, "{way:?} {len}");
        }
    }
}

#[test]
fn a_receiver_with_one_thread_per_ring() {
    let v = Valed::start();
    for (k, way) in WAYS.into_iter().enumerate() {
        let (s, r) = (format!("vale{k}:s"), format!("vale{k}:r"));
        v.ctl_ok(&["create", &r]);
        let rx = receiver(&v, way, &r, 8000, 60, 4);
        // Frame k leaves on tx ring k % 4 and reaches rx ring k % 4.
        send(&v, way, &format!("{s}@conf:rings=4"), 8000, 60);
        let (got, _, rings) = received(rx);
        counts_add_up(&v, &r, 8000, got);
        assert_eq!(rings.len(), 4);
        assert!(
            rings.iter().all(|&n| n > 0 && n <= 2000),
            "{way:?}: frames per ring {rings:?}"
        );
        let p = v.port(&r).expect("listed");
        assert_eq!(p.counters.rx_packets, got, "{way:?}");
    }
}

/// CPU ticks (user + system) a process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// write(2) calls a process has made (`syscw` of /proc/PID/io).
fn writes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("io");
    io.lines()
        .find_map(|l| l.strip_prefix("syscw:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("syscw")
}

#[test]
fn a_forwarder_sleeping_in_poll_forwards_and_idles() {
    let v = Valed::start();
    let hz = ticks_per_second();
    let cases = [
        (Way::Preloaded, "poll"),
        (Way::Linked, "poll"),
        (Way::Preloaded, "select"),
        (Way::Linked, "epoll"),
    ];
    for (k, (way, how)) in cases.into_iter().enumerate() {
        let (a, b) = (10 + 2 * k, 11 + 2 * k);
        let (fa, fb) = (format!("vale{a}:f"), format!("vale{b}:f"));
        let (s, r) = (format!("vale{a}:s"), format!("vale{b}:r"));
        for p in [&fa, &fb, &r] {
            v.ctl_ok(&["create", p]);
        }
        let fwd = Kid::spawn(
            program(&v, way, "nm_forward", &[&fa, &fb, "60", how]),
            "nm_forward",
        );
        assert!(
            vale_tests::wait_until(Duration::from_secs(10), || v
                .port(&fb)
                .is_some_and(|p| p.owner_pid == Some(fwd.pid()))),
            "nm_forward never opened its ports"
        );
        let rx = receiver(&v, Way::Linked, &r, 5000, 1514, 1);
        // Idle: asleep in its wait, no CPU, and no kick (no write at all).
        let (t0, w0) = (cpu_ticks(fwd.pid()), writes(fwd.pid()));
        std::thread::sleep(Duration::from_secs(2));
        let (t1, w1) = (cpu_ticks(fwd.pid()), writes(fwd.pid()));
        assert!(
            (t1 - t0) * 100 <= 2 * hz,
            "{way:?} {how}: an idle forwarder used {} ticks in 2 s (over 1% of a core)",
            t1 - t0
        );
        assert_eq!(w1, w0, "{way:?} {how}: an idle forwarder wrote (kicked)");
        // Paced (a burst of 64 a millisecond, well within the forwarder's ring): what is
        // checked is that it wakes and forwards, not how fast it is on a loaded machine.
        let out = run_bounded(
            program(&v, Way::Linked, "nm_send", &[&s, "5000", "1514"])
                .env("NM_SEND_PAUSE_US", "1000"),
            Duration::from_secs(40),
        );
        assert_eq!(numbers(&out, "sent"), [5000], "{}", text(&out));
        let (got, _, _) = received(rx);
        fwd.signal(libc::SIGTERM);
        let out = fwd.finish(Duration::from_secs(10));
        let n = numbers(&out, "forwarded");
        // Into the forwarder: delivered + dropped = sent; it forwarded what it read.
        counts_add_up(&v, &fa, 5000, n[0]);
        assert_eq!(v.counters(&fb).tx_packets, n[0], "{way:?} {how}");
        // Out of it: the receiver read what reached it.
        counts_add_up(&v, &r, n[0], got);
    }
}

#[test]
fn what_vale_lacks_is_refused_by_name() {
    let v = Valed::start();
    let cases = [
        ("vale0:p{1", "netmap pipes"),
        ("vale0:p}1", "netmap pipes"),
        ("vale0:h^", "host rings"),
        ("vale0:h*", "host rings"),
        ("netmap:eth0", "only switch ports valeX:Y are served"),
        ("vale0:m/r", "monitor ports"),
        ("vale0:m/t", "monitor ports"),
        ("vale0:x@extmem:file=/dev/null", "external memory"),
        ("vale0:x@offset:initial=64", "buffer offsets"),
        ("vale0:x@conf:host-rings=1", "host rings"),
        ("vale0:x-7", "no ring 7"),
    ];
    for way in WAYS {
        for (name, words) in cases {
            let out = run_bounded(
                &mut program(&v, way, "nm_recv", &[name, "1", "60", "1", "100"]),
                Duration::from_secs(20),
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{way:?} {name}: {err}");
            assert!(err.contains(words), "{way:?} {name}: {err}");
        }
    }
    assert!(
        v.list().iter().all(|s| s.ports.is_empty()),
        "a refused open left a port"
    );
}

/// vale.h and the netmap headers together, in either order, and netmap's own guard names.
#[test]
fn vale_h_compiles_with_the_netmap_headers() {
    let dir = TempDir::new("netmap-headers");
    let include = root().join("crates/libvale/include");
    for (k, order) in [
        "#define NETMAP_WITH_LIBS\n#include <net/netmap_user.h>\n#include <libnetmap.h>\n#include <vale.h>\n",
        "#include <net/netmap.h>\n#include <vale.h>\n",
        "#include <vale.h>\n#define NETMAP_WITH_LIBS\n#include <net/netmap_user.h>\n#include <libnetmap.h>\n",
    ]
    .iter()
    .enumerate()
    {
        let src = dir.0.join(format!("h{k}.c"));
        let body = "int main(void) { struct netmap_ring *r = 0; return r ? nm_ring_empty(r) + (int)nm_ring_space(r) : 0; }\n";
        std::fs::write(&src, format!("{order}{body}")).unwrap();
        compile(
            Command::new("cc")
                .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
                .arg(&include)
                .arg("-I")
                .arg(include.join("vale-netmap"))
                .arg(&src),
        );
    }
}

/// A netmap port lives while any descriptor of any process refers to it: a helper forked
/// after the open that closes every inherited descriptor (one by one or with close_range),
/// execs or exits leaves the parent its port, and a child keeps the port its parent closed.
#[test]
fn a_port_lives_while_any_process_holds_its_descriptor() {
    let v = Valed::start();
    let mut k = 0;
    for way in WAYS {
        for how in ["close", "close_range", "exec", "exit", "handover"] {
            k += 1;
            let (s, r) = (format!("vale{k}:s"), format!("vale{k}:r"));
            v.ctl_ok(&["create", &s]);
            v.ctl_ok(&["create", &r]);
            let rx = receiver(&v, way, &r, 1000, 60, 1);
            let out = run_bounded(
                &mut program(&v, way, "nm_send", &[&s, "1000", "60", "64", how]),
                Duration::from_secs(40),
            );
            assert!(
                out.status.success() && numbers(&out, "sent") == [1000],
                "{way:?} {how}: {}{}",
                text(&out),
                String::from_utf8_lossy(&out.stderr)
            );
            let (got, _, _) = received(rx);
            counts_add_up(&v, &r, 1000, got);
            assert_eq!(v.counters(&s).tx_packets, 1000, "{way:?} {how}");
        }
    }
}

/// fork() in a threaded netmap program while another thread is inside the emulation (here:
/// opening and closing netmap descriptors without pause): every child can close its
/// inherited netmap descriptor and exit (no lock of the emulation's is held across fork).
#[test]
fn fork_while_another_thread_closes_leaves_no_child_hung() {
    let v = Valed::start();
    for way in WAYS {
        let out = run_bounded(
            &mut program(&v, way, "nm_forkstress", &["1000"]),
            Duration::from_secs(120),
        );
        assert!(
            out.status.success() && numbers(&out, "hung")[0] == 0,
            "{way:?}: {}{}",
            text(&out),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A netmap descriptor's number closed behind the emulation's back (close_range, dup2 of a
/// pipe over it, the raw system call) is no longer netmap's: the pipe that gets the number
/// polls readable at once and cannot be mapped, as any pipe.
#[test]
fn a_number_closed_behind_the_emulations_back_is_not_netmaps() {
    let v = Valed::start();
    for way in WAYS {
        for how in ["close_range", "dup2", "syscall"] {
            let out = run_bounded(
                &mut program(&v, way, "nm_stale", &["vale0:x", how]),
                Duration::from_secs(20),
            );
            assert!(
                out.status.success(),
                "{way:?} {how}: {}{}",
                text(&out),
                String::from_utf8_lossy(&out.stderr)
            );
            let n = numbers(&out, "poll");
            assert!(n[2] < 500, "{way:?} {how}: poll waited {} ms", n[2]);
        }
    }
}

/// Wild pointers in netmap requests fail with EFAULT, as netmap's copyin does, instead of
/// crashing the program.
#[test]
fn wild_pointers_in_requests_give_efault() {
    let v = Valed::start();
    for way in WAYS {
        let out = run_bounded(
            &mut program(&v, way, "nm_wild", &["vale0:w"]),
            Duration::from_secs(20),
        );
        assert!(
            out.status.success() && text(&out).contains("all EFAULT"),
            "{way:?}: {:?} {}{}",
            out.status,
            text(&out),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        v.list().iter().all(|s| s.ports.is_empty()),
        "a request that failed left a port"
    );
}

/// One port on two descriptors in one process, as netmap allows: one thread receives on
/// the first, another transmits on the second (a link emulator's way), each waiting on its
/// own descriptor (in poll(), or in epoll_wait() on an epoll instance of its own); every
/// frame received goes back out, and no wait misses its wake-up (a wait for room that
/// lasts its whole second, or for frames that were there all along, is one that did).
#[test]
fn one_port_on_two_descriptors_forwards_every_frame() {
    let v = Valed::start();
    const N: u64 = 20_000;
    let mut k = 0;
    for way in WAYS {
        for how in ["poll", "epoll"] {
            k += 1;
            let (s, p) = (format!("vale{k}:s"), format!("vale{k}:p"));
            v.ctl_ok(&["create", &s]);
            v.ctl_ok(&["create", &p]);
            let link = Kid::spawn(
                program(&v, way, "nm_link", &[&p, "60", "800", how]),
                "nm_link",
            );
            assert!(
                vale_tests::wait_until(Duration::from_secs(10), || v
                    .port(&p)
                    .is_some_and(|i| i.owner_pid == Some(link.pid()))),
                "nm_link never opened {p}"
            );
            // Paced (8 frames between syncs): the link copies every frame twice.
            let sent = run_bounded(
                &mut program(&v, Way::Linked, "nm_send", &[&s, &N.to_string(), "60", "8"]),
                Duration::from_secs(40),
            );
            assert_eq!(numbers(&sent, "sent"), [N], "{way:?} {how}");
            let out = link.finish(Duration::from_secs(90));
            assert!(
                out.status.success(),
                "{way:?} {how}: {}{}",
                text(&out),
                String::from_utf8_lossy(&out.stderr)
            );
            let n = numbers(&out, "received");
            let (got, forwarded) = (n[0], n[1]);
            let c = v.counters(&p);
            assert_eq!(c.rx_packets + c.rx_drops, N, "{way:?} {how}");
            assert!(
                got > 0 && got == c.rx_packets,
                "{way:?} {how}: read {got} of {}",
                c.rx_packets
            );
            assert_eq!(
                forwarded, got,
                "{way:?} {how}: forwarded {forwarded} of {got}"
            );
            assert_eq!(
                c.tx_packets, got,
                "{way:?} {how}: the port sent {} of {got}",
                c.tx_packets
            );
            let back = v.counters(&s);
            assert_eq!(back.rx_packets + back.rx_drops, got, "{way:?} {how}");
        }
    }
}

/// What the emulation's two descriptors on one port rest on, in libvale: two waiters on one
/// port. One asks for an interrupt when its tx ring has room; the other, looking at its
/// rings (which syncs the tx ring, as netmap's poll does), must neither withdraw that
/// request nor take the interrupt it brings.
#[test]
fn two_waiters_on_one_port_keep_each_others_wake_ups() {
    let v = Valed::start();
    let port = v.open("vale0:a");
    let all = port.all_rings();
    let tx_side = vale::Waiter::new(&port, all.clone()).unwrap();
    let rx_side = vale::Waiter::new(&port, all).unwrap();
    // Fill tx ring 0 without a sync: no room until valed takes the frames.
    let mut ring = port.tx_ring(0);
    let frame = vale_tests::test_frame(60, [2, 0, 0, 0, 0, 1], [0xff; 6], 0);
    while ring.space() > 0 {
        let cur = ring.cur();
        let (slot, buf) = ring.slot_and_buf(cur);
        buf[..60].copy_from_slice(&frame);
        slot.len = 60;
        ring.advance(1);
    }
    let none = vale::Events::default();
    assert_eq!(tx_side.ask(&port, vale::Events::WRITABLE).unwrap(), none);
    assert_eq!(rx_side.ask(&port, vale::Events::READABLE).unwrap(), none);
    // The other side's look syncs the tx ring: valed takes the frames and must interrupt
    // the tx side.
    rx_side.ready(&port, vale::Events::READABLE).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // The rx side looks again (as after any wake-up): the tx side's interrupt is not its.
    assert_eq!(rx_side.ask(&port, vale::Events::READABLE).unwrap(), none);
    rx_side.ready(&port, vale::Events::READABLE).unwrap();
    let mut lines = Vec::new();
    tx_side.lines(&port, vale::Events::WRITABLE, &mut lines);
    // SAFETY: poll(2) on our own array.
    let r = unsafe { libc::poll(lines.as_mut_ptr(), lines.len() as libc::nfds_t, 2000) };
    assert!(r > 0, "the tx side was never woken (poll gave {r})");
    tx_side.woken(&port, &lines).unwrap();
    assert!(
        tx_side
            .ready(&port, vale::Events::WRITABLE)
            .unwrap()
            .writable,
        "woken, but no room"
    );
}

//! Two Linux guests under QEMU (TCG) and TCP between them, for `bench/guests.py`: boots the
//! pair on the path asked for, waits until both serve commands, runs iperf3 (one stream, g1
//! sends, g2 receives) the number of times asked and prints one JSON object on stdout.
//!
//! ```text
//! guest-pair --path vale --vhost-user SOCK1,SOCK2 [--run-dir DIR --ports P1,P2] [--valed-pid PID]
//! guest-pair --path bridge --netns NS --taps TAP1,TAP2 --bridge BR
//!   common: [--runs N] [--seconds S] [--omit S] [--cpus A,B] [--no-offloads]
//! ```
//!
//! - `vale`: each guest's virtio-net device is a vhost-user device on the socket given (valed
//!   listens there; QEMU connects with `reconnect=1`). With `--run-dir` (valed's) and `--ports`,
//!   the ports' counters (`vale-ctl list --json`, vale-ctl beside this binary) are read before
//!   and after each iperf3 run: the frames and bytes the receiving port handed its guest.
//! - `bridge`: each guest's device is a TAP device QEMU creates in namespace `NS`
//!   (`-netdev tap,...,vhost=off`); once it is there it is made a port of bridge `BR` (which
//!   must exist in `NS`) and brought up. The receiving TAP's counters are read like the ports'.
//!
//! Both paths: the device's checksum and segmentation offloads on (QEMU's defaults; off with
//! `--no-offloads`: then every TCP segment is a frame of at most 1514 bytes), MTU 1500,
//! guests of one vCPU and 256 MiB. `--cpus A,B` pins g1's QEMU to CPU A and g2's to B.
//! Each run is `iperf3 -c G2 -t S -O OMIT -J` in g1 (the first OMIT seconds, slow start and
//! TCG's first translations, are left out of the figures), bounded by S + 60 s. QEMU is killed
//! when this program ends, however it ends.
//!
//! Output: `{"path", "boot_s": [g1, g2], "runs": [{"bits_per_second" (receiver's),
//! "sender_bits_per_second", "retransmits", "seconds", "rx_frames", "rx_bytes" (at the
//! receiving port or TAP), "port_drops" (vale: both ports' rx_drops, tx_drops and bad_input),
//! "qemu_cpu_s": [g1, g2], "valed_cpu_s", "machine_busy_s" (every
//! CPU's time outside idle, whoever used it)}]}`; CPU times are over the iperf3 command.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vale_abi::control::SwitchInfo;
use vale_tests::guest::{kit, Guest, GuestConfig};
use vale_tests::ticks_per_second;

const IPS: [&str; 2] = ["10.79.0.1", "10.79.0.2"];
const MACS: [&str; 2] = ["02:00:00:00:79:01", "02:00:00:00:79:02"];
const SHORT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Args {
    path: String,
    vhost_user: Vec<String>,
    run_dir: Option<PathBuf>,
    ports: Vec<String>,
    valed_pid: Option<u32>,
    netns: Option<String>,
    taps: Vec<String>,
    bridge: Option<String>,
    runs: u32,
    seconds: u32,
    omit: u32,
    cpus: Vec<usize>,
    /// The devices' checksum and segmentation offloads off.
    no_offloads: bool,
}

fn usage(why: &str) -> ! {
    eprintln!(
        "guest-pair: {why}\nusage: guest-pair --path vale --vhost-user SOCK1,SOCK2 [--run-dir DIR \
         --ports P1,P2] [--valed-pid PID]\n       guest-pair --path bridge --netns NS --taps \
         TAP1,TAP2 --bridge BR\n  common: [--runs N] [--seconds S] [--omit S] [--cpus A,B] \
         [--no-offloads]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        runs: 1,
        seconds: 5,
        omit: 1,
        ..Args::default()
    };
    let mut it = std::env::args().skip(1);
    let pair = |v: String, what: &str| -> Vec<String> {
        let l: Vec<String> = v.split(',').map(str::to_string).collect();
        if l.len() != 2 || l.iter().any(String::is_empty) {
            usage(&format!("{what} takes two values, A,B"));
        }
        l
    };
    let num = |v: String, what: &str| -> u32 {
        v.parse()
            .unwrap_or_else(|_| usage(&format!("{what}: not a number: {v}")))
    };
    while let Some(k) = it.next() {
        let mut v = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{k} needs a value")))
        };
        match k.as_str() {
            "--path" => a.path = v(),
            "--vhost-user" => a.vhost_user = pair(v(), &k),
            "--run-dir" => a.run_dir = Some(PathBuf::from(v())),
            "--ports" => a.ports = pair(v(), &k),
            "--valed-pid" => a.valed_pid = Some(num(v(), &k)),
            "--netns" => a.netns = Some(v()),
            "--taps" => a.taps = pair(v(), &k),
            "--bridge" => a.bridge = Some(v()),
            "--runs" => a.runs = num(v(), &k),
            "--seconds" => a.seconds = num(v(), &k),
            "--omit" => a.omit = num(v(), &k),
            "--cpus" => {
                a.cpus = pair(v(), &k)
                    .into_iter()
                    .map(|c| num(c, "--cpus") as usize)
                    .collect()
            }
            "--no-offloads" => a.no_offloads = true,
            "-h" | "--help" => usage("help"),
            _ => usage(&format!("unknown option {k}")),
        }
    }
    match a.path.as_str() {
        "vale" if a.vhost_user.len() == 2 => {}
        "vale" => usage("--path vale needs --vhost-user SOCK1,SOCK2"),
        "bridge" if a.taps.len() == 2 && a.netns.is_some() && a.bridge.is_some() => {}
        "bridge" => usage("--path bridge needs --netns, --taps and --bridge"),
        _ => usage("--path is vale or bridge"),
    }
    if a.run_dir.is_some() != (a.ports.len() == 2) {
        usage("--run-dir and --ports go together");
    }
    if a.runs == 0 || a.seconds == 0 {
        usage("--runs and --seconds must be at least 1");
    }
    a
}

fn config(a: &Args, i: usize) -> GuestConfig {
    let (name, ip) = (format!("g{}", i + 1), format!("{}/24", IPS[i]));
    let mut c = if a.path == "vale" {
        let sock = std::path::Path::new(&a.vhost_user[i]);
        GuestConfig::vhost_user(&name, sock, false, &ip, MACS[i])
    } else {
        let mut c = GuestConfig::tap(&name, &a.taps[i], &ip, MACS[i]);
        c.netns = a.netns.clone();
        c
    };
    c.offloads = !a.no_offloads;
    c.cpus = a.cpus.get(i).map(|&c| vec![c]).unwrap_or_default();
    c
}

/// Runs a command, which must succeed; returns its stdout.
fn sh(c: &mut Command) -> String {
    let what = format!("{c:?}");
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip_netns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

/// Frames and bytes handed to the receiving guest so far: its vale port's rx counters, or its
/// TAP's tx counters (what the kernel queued for QEMU to read); and for vale the frames the
/// two ports lost (rx_drops, tx_drops and bad_input of both).
fn rx_counts(a: &Args) -> Option<(u64, u64, Option<u64>)> {
    if a.path == "vale" {
        let dir = a.run_dir.as_ref()?;
        let ctl = std::env::current_exe()
            .expect("own path")
            .with_file_name("vale-ctl");
        let out = sh(Command::new(ctl)
            .arg("--run-dir")
            .arg(dir)
            .args(["list", "--json"]));
        let list: Vec<SwitchInfo> = serde_json::from_str(&out).expect("vale-ctl list --json");
        let ports: Vec<_> = list.into_iter().flat_map(|s| s.ports).collect();
        let port = |name: &str| {
            ports
                .iter()
                .find(|p| p.name == name)
                .unwrap_or_else(|| panic!("port {name} is not listed"))
                .counters
        };
        let rx = port(&a.ports[1]);
        let lost = a
            .ports
            .iter()
            .map(|p| {
                let c = port(p);
                c.rx_drops + c.tx_drops + c.bad_input
            })
            .sum();
        Some((rx.rx_packets, rx.rx_bytes, Some(lost)))
    } else {
        let ns = a.netns.as_ref()?;
        let stat = |f: &str| -> u64 {
            let path = format!("/sys/class/net/{}/statistics/{f}", a.taps[1]);
            sh(&mut ip_netns(ns, &["cat", &path]))
                .trim()
                .parse()
                .expect("a counter")
        };
        Some((stat("tx_packets"), stat("tx_bytes"), None))
    }
}

/// CPU seconds (user + system, all threads) of a process so far.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(at) = stat.rfind(')') else {
        return 0.0;
    };
    let f: Vec<u64> = stat[at + 2..]
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0)) as f64 / ticks_per_second() as f64
}

/// CPU seconds the whole machine (every CPU) spent outside idle so far, from /proc/stat.
fn machine_busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal ...: all but idle and iowait (guest
    // time is in user already).
    let busy: u64 = f.iter().take(8).sum::<u64>() - f.get(3).unwrap_or(&0) - f.get(4).unwrap_or(&0);
    busy as f64 / ticks_per_second() as f64
}

fn main() {
    let a = parse_args();
    if let Err(e) = kit() {
        eprintln!("guest-pair: {e} (scripts/test.sh unpacks a kernel and busybox)");
        std::process::exit(1);
    }
    let t0 = Instant::now();
    let mut guests: Vec<Guest> = (0..2).map(|i| Guest::start(&config(&a, i))).collect();
    if a.path == "bridge" {
        // QEMU creates its TAP at once; the guests take seconds to boot, time enough to make
        // each TAP a port of the bridge and bring it up.
        let ns = a.netns.as_deref().expect("netns");
        for t in &a.taps {
            let deadline = Instant::now() + SHORT;
            while !ip_netns(ns, &["test", "-e", &format!("/sys/class/net/{t}")])
                .status()
                .is_ok_and(|s| s.success())
            {
                assert!(Instant::now() < deadline, "QEMU did not create {t}");
                std::thread::sleep(Duration::from_millis(50));
            }
            let br = a.bridge.as_deref().expect("bridge");
            sh(&mut ip_netns(ns, &["ip", "link", "set", t, "master", br]));
            sh(&mut ip_netns(ns, &["ip", "link", "set", t, "up"]));
        }
    }
    let boot: Vec<f64> = guests
        .iter_mut()
        .map(|g| g.wait_ready().as_secs_f64())
        .collect();
    eprintln!(
        "guest-pair: {} guests ready after {:.1} s, {:.1} s ({:.1} s in all)",
        a.path,
        boot[0],
        boot[1],
        t0.elapsed().as_secs_f64()
    );
    if guests[1].run("command -v iperf3", SHORT).status != 0 {
        eprintln!("guest-pair: no iperf3 in the guests (install iperf3 on the host)");
        std::process::exit(1);
    }
    // Until the path carries frames (the first ones also resolve the addresses).
    guests[0].ok(
        &format!(
            "i=0; until ping -c 1 -W 1 {} >/dev/null; do i=$((i+1)); [ $i -ge 30 ] && exit 1; done",
            IPS[1]
        ),
        Duration::from_secs(60),
    );
    guests[1].ok("iperf3 -s -D", SHORT);
    let pids: Vec<u32> = guests.iter().map(Guest::pid).collect();
    let mut runs = Vec::new();
    for r in 0..a.runs {
        let c0 = rx_counts(&a);
        let q0: Vec<f64> = pids.iter().map(|&p| cpu_s(p)).collect();
        let v0 = a.valed_pid.map(cpu_s);
        let m0 = machine_busy_s();
        // The server may not listen yet when the first run starts: a few tries.
        let out = guests[0].ok(
            &format!(
                "i=0; until iperf3 -c {} -t {} -O {} -J >/tmp/j; do i=$((i+1)); \
                 [ $i -ge 20 ] && {{ cat /tmp/j; exit 1; }}; sleep 0.2; done; cat /tmp/j",
                IPS[1], a.seconds, a.omit
            ),
            Duration::from_secs((a.seconds + a.omit) as u64 * 20 + 60),
        );
        let q1: Vec<f64> = pids.iter().map(|&p| cpu_s(p)).collect();
        let v1 = a.valed_pid.map(cpu_s);
        let m1 = machine_busy_s();
        let c1 = rx_counts(&a);
        let j: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("iperf3 -J gave no JSON ({e}): {out}"));
        let end = &j["end"];
        let bps = end["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or_else(|| panic!("no sum_received in iperf3's JSON: {out}"));
        let (frames, bytes, lost) = match (c0, c1) {
            (Some(c0), Some(c1)) => (
                Some(c1.0 - c0.0),
                Some(c1.1 - c0.1),
                c0.2.zip(c1.2).map(|(a, b)| b - a),
            ),
            _ => (None, None, None),
        };
        let run = json!({
            "bits_per_second": bps,
            "sender_bits_per_second": end["sum_sent"]["bits_per_second"],
            "retransmits": end["sum_sent"]["retransmits"],
            "seconds": end["sum_received"]["seconds"],
            "rx_frames": frames,
            "rx_bytes": bytes,
            "port_drops": lost,
            "qemu_cpu_s": q0.iter().zip(&q1).map(|(a, b)| b - a).collect::<Vec<f64>>(),
            "valed_cpu_s": v0.zip(v1).map(|(a, b)| b - a),
            "machine_busy_s": m1 - m0,
        });
        eprintln!(
            "guest-pair: {} run {}: {:.3} Gbit/s{}",
            a.path,
            r + 1,
            bps / 1e9,
            match (frames, bytes) {
                (Some(f), Some(b)) if f > 0 => format!(", {} B per frame at g2", b / f),
                _ => String::new(),
            }
        );
        runs.push(run);
    }
    let report = json!({
        "path": a.path,
        "boot_s": boot,
        "cpus": a.cpus,
        "runs": runs,
    });
    println!("{report}");
    drop(guests);
}

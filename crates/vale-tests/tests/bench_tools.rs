//! The benchmarks' own programs report what they measured, and refuse what they cannot
//! measure (bench/README.md reads their JSON).

use std::process::Command;
use vale_tests::bin;

/// Whether there are two CPUs (0 and 1) to measure between.
fn two_cpus() -> bool {
    std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2
}

fn report(args: &[&str]) -> serde_json::Value {
    let out = Command::new(bin("bare-copy"))
        .args(args)
        .output()
        .expect("run bare-copy");
    assert!(
        out.status.success(),
        "bare-copy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

#[test]
fn bare_copy_reports_a_rate_and_a_round_trip() {
    if !two_cpus() {
        eprintln!("one CPU: nothing to measure between two");
        return;
    }
    let rate = report(&["--seconds", "0.3", "--warmup", "0.05", "--cpus", "0,1"]);
    assert!(rate["pps"].as_f64().unwrap() > 0.0, "{rate}");
    assert_eq!(rate["len"], 60);

    let rtt = report(&[
        "--rtt",
        "--seconds",
        "0.3",
        "--warmup",
        "0.05",
        "--cpus",
        "0,1",
    ]);
    let (median, min) = (
        rtt["rtt_ns"].as_f64().unwrap(),
        rtt["rtt_ns_min"].as_f64().unwrap(),
    );
    assert!(0.0 < min && min <= median, "{rtt}");
    assert!(rtt["round_trips"].as_u64().unwrap() >= 1000, "{rtt}");
    assert_eq!(rtt["cpus"], serde_json::json!([0, 1]));
}

#[test]
fn bare_copy_refuses_a_round_trip_on_one_cpu() {
    let out = Command::new(bin("bare-copy"))
        .args(["--rtt", "--cpus", "0,0"])
        .output()
        .expect("run bare-copy");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rtt needs two different CPUs"), "{err}");
    assert!(out.stdout.is_empty());
}

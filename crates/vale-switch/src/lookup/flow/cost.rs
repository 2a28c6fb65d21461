//! The cost of the module call itself, in ns a frame: `cargo test --release -p
//! vale-switch --lib lookup_cost -- --ignored --nocapture` (bench/modules.py runs it).

use super::*;
use crate::lookup::make;
use std::time::Instant;

/// The benchmark stream's frame from `src` (10.0.0.1 unless varied), as vale-pktgen sends.
fn frame(src: u32) -> Vec<u8> {
    let mut f = vec![0xffu8; 6];
    f.extend_from_slice(&[2, 0, 0, 0, 0, 0xa, 0x08, 0x00]);
    f.extend_from_slice(&[0x45, 0, 0, 46, 0, 0, 0, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&src.to_be_bytes());
    f.extend_from_slice(&[10, 0, 0, 2]);
    f.extend_from_slice(&1234u16.to_be_bytes());
    f.extend_from_slice(&4321u16.to_be_bytes());
    f.resize(60, 0);
    f
}

fn measure(m: &dyn Lookup, frames: &[Vec<u8>]) -> f64 {
    const BATCH: usize = 512;
    let mut metas: Vec<FrameMeta> = frames
        .iter()
        .map(|f| FrameMeta::new(f.as_ptr(), 60, 60, 0))
        .collect();
    let src = SourcePort {
        index: 0,
        ring: 0,
        learn_limit: LearningBridge::DEFAULT_LEARN_LIMIT,
    };
    let (mut done, mut at) = (0u64, 0usize);
    let start = Instant::now();
    let cpu = thread_cpu_ns();
    while start.elapsed().as_secs_f64() < 0.3 || done < 4096 {
        let end = (at + BATCH).min(metas.len());
        m.lookup(src, &mut metas[at..end], 1);
        done += (end - at) as u64;
        at = if end == metas.len() { 0 } else { end };
    }
    (thread_cpu_ns() - cpu) as f64 / done as f64
}

/// This thread's CPU time: what other processes on the machine take is not counted.
fn thread_cpu_ns() -> u64 {
    vale_abi::clock::ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

#[test]
#[ignore = "a measurement: run by bench/modules.py"]
fn lookup_cost() {
    let one: Vec<Vec<u8>> = vec![frame(0x0a00_0001); 512];
    // 65536 sources from 10.0.0.1 on (as vale-pktgen --flows 65536 --vary src-addr):
    // every frame a new flow for the caches.
    let many: Vec<Vec<u8>> = (0..65536u32).map(|i| frame(0x0a00_0001 + i)).collect();
    let cases: Vec<(String, Vec<(String, String)>)> = vec![
        ("learning".into(), vec![]),
        ("hub".into(), vec![]),
        ("vlan".into(), vec![]),
        (
            "flow-10".into(),
            vec![("rules".into(), bench_rules("flow", 10, "vale0:b"))],
        ),
        (
            "flow-1000".into(),
            vec![("rules".into(), bench_rules("flow", 1000, "vale0:b"))],
        ),
        (
            "flow-100000".into(),
            vec![("rules".into(), bench_rules("flow", 100_000, "vale0:b"))],
        ),
        (
            "flow-masks".into(),
            vec![("rules".into(), bench_rules("masks", 0, "vale0:b"))],
        ),
        (
            "flow-masks-adversarial".into(),
            vec![(
                "rules".into(),
                bench_rules("masks-adversarial", 0, "vale0:b"),
            )],
        ),
    ];
    // LOOKUP_COST_ONLY=flow-1000: that case alone (to profile it).
    let only = std::env::var("LOOKUP_COST_ONLY").ok();
    for (name, args) in cases {
        if only.as_ref().is_some_and(|o| *o != name) {
            continue;
        }
        let spec = name.split('-').next().unwrap();
        let m = make(spec, &args).unwrap();
        m.port_added(0, "vale0:a");
        m.port_added(1, "vale0:b");
        let masks = m
            .counters()
            .iter()
            .find(|c| c.0 == "masks")
            .map_or(0, |c| c.1);
        for (traffic, frames) in [("one-flow", &one), ("65536-flows", &many)] {
            let ns = measure(&*m, frames);
            println!(
                "LOOKUP_COST {{\"module\":\"{name}\",\"traffic\":\"{traffic}\",\"masks\":{masks},\"ns_per_frame\":{ns:.2}}}"
            );
        }
    }
}

/// Rule sets of the benchmarks (`bench/modules.py` writes the same): `n` rules in four
/// shapes over addresses the benchmark stream never uses, then the stream's own rule
/// (udp 10.0.0.1:1234 -> 10.0.0.2:4321) to `to`, below them all so that a frame of the
/// stream visits every mask. `masks`: the tuple space explosion: one rule for each pair of
/// source and destination prefix lengths (1024 masks), on prefixes the stream's addresses
/// do not begin with. `masks-adversarial`: the same 1024 masks on prefixes of the stream's
/// own addresses, each rule missing the stream only by its UDP destination port, so that
/// prefix tracking passes every table a frame's addresses reach.
pub fn bench_rules(shape: &str, n: usize, to: &str) -> String {
    let mut s = String::new();
    let ip = |i: usize| format!("{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255);
    match shape {
        "masks" | "masks-adversarial" => {
            let (src, dst, tail) = match shape {
                "masks" => ("245.255.255.254", "245.255.255.253", ""),
                _ => ("10.0.0.1", "10.0.0.2", ",tp_dst=9"),
            };
            for a in 1..=32 {
                for b in 1..=32 {
                    s += &format!(
                        "prio=100 udp,nw_src={src}/{a},nw_dst={dst}/{b}{tail} actions=drop\n"
                    );
                }
            }
        }
        _ => {
            for i in 0..n.saturating_sub(1) {
                s += &match i % 4 {
                    0 => format!(
                        "prio=100 udp,nw_dst=11.{},tp_dst={} actions=drop\n",
                        ip(i),
                        1000 + i % 1000
                    ),
                    1 => format!("prio=90 tcp,nw_src=12.{},tp_dst=80 actions=drop\n", ip(i)),
                    2 => format!(
                        "prio=80 ip,nw_dst=13.{}/24 actions=drop\n",
                        ip(i & !255 | (i >> 2 & 255))
                    ),
                    _ => format!(
                        "prio=70 udp,nw_src=14.{},tp_src={} actions=drop\n",
                        ip(i),
                        1 + i % 60000
                    ),
                };
            }
        }
    }
    s + &format!("prio=50 udp,nw_dst=10.0.0.2,tp_dst=4321 actions=output:{to}\n")
}

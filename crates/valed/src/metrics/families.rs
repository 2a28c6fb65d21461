//! The metric families: what one scrape encodes, from one snapshot of the engine's counters
//! (`list`, `lookup`, `workers`) and of valed's own process.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use vale_abi::control::{LookupInfo, PortCounters, PortInfo, SwitchInfo, WorkerInfo};
use vale_switch::Engine;

/// The collector of every family, for the registry.
pub(super) fn collector(engine: Arc<Engine>) -> Box<dyn Collector> {
    Box::new(Vale { engine })
}

/// Encodes, at each scrape, what valed's counters hold then.
struct Vale {
    engine: Arc<Engine>,
}

impl fmt::Debug for Vale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("vale metrics")
    }
}

type Labels<'a> = Vec<(&'a str, &'a str)>;

/// One metric family: its samples, written under one descriptor.
fn family<'a, M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels<'a>, M)>,
) -> fmt::Result {
    let mut samples = samples.into_iter().peekable();
    let Some((_, first)) = samples.peek() else {
        return Ok(());
    };
    let kind: MetricType = first.metric_type();
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            // A family of one sample with no labels: `name value`, not `name{} value`.
            return value.encode(m);
        }
        value.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A label value and the counter that goes with it.
type Counter = fn(&PortCounters) -> u64;

/// A counter of every port, one sample per port and value of label `key` (none if empty).
fn per_port(
    enc: &mut DescriptorEncoder,
    ports: &[(&str, &PortInfo)],
    name: &str,
    help: &str,
    key: &'static str,
    values: &[(&'static str, Counter)],
) -> fmt::Result {
    family(
        enc,
        name,
        help,
        ports.iter().flat_map(|(sw, p)| {
            values.iter().map(move |(value, get)| {
                let mut labels = port_labels(sw, p);
                if !key.is_empty() {
                    labels.push((key, value));
                }
                counter(labels, get(&p.counters))
            })
        }),
    )
}

fn port_labels<'a>(sw: &'a str, p: &'a PortInfo) -> Labels<'a> {
    vec![
        ("switch", sw),
        ("port", p.name.as_str()),
        ("kind", p.kind.as_str()),
    ]
}

fn counter<'a>(labels: Labels<'a>, v: u64) -> (Labels<'a>, ConstCounter<u64>) {
    (labels, ConstCounter::new(v))
}

fn gauge<'a>(labels: Labels<'a>, v: i64) -> (Labels<'a>, ConstGauge<i64>) {
    (labels, ConstGauge::new(v))
}

impl Collector for Vale {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let switches = self.engine.list();
        let lookups: Vec<_> = switches
            .iter()
            .filter_map(|s| self.engine.lookup_info(&s.name).ok())
            .collect();
        encode_ports(&mut enc, &switches)?;
        encode_switches(&mut enc, &switches, &lookups)?;
        encode_workers(&mut enc, &self.engine.workers())?;
        encode_process(&mut enc)
    }
}

/// The families of every port: (switch, port, kind) and its counters.
fn encode_ports(enc: &mut DescriptorEncoder, switches: &[SwitchInfo]) -> fmt::Result {
    // Per port: (switch, port, kind) and its counters.
    let ports: Vec<_> = switches
        .iter()
        .flat_map(|s| s.ports.iter().map(move |p| (s.name.as_str(), p)))
        .collect();
    per_port(
        enc,
        &ports,
        "vale_port_packets",
        "Frames through the port, seen from the port: tx is what its client sent into \
         the switch, rx what the switch delivered to it",
        "direction",
        &[("rx", |c| c.rx_packets), ("tx", |c| c.tx_packets)],
    )?;
    per_port(
        enc,
        &ports,
        "vale_port_bytes",
        "Bytes of those frames",
        "direction",
        &[("rx", |c| c.rx_bytes), ("tx", |c| c.tx_bytes)],
    )?;
    per_port(
        enc,
        &ports,
        "vale_port_drops",
        "Frames dropped, by cause: rx_full, frames for the port dropped because its \
         receive ring was full, nobody held it, or its device refused them or was down; \
         no_destination, frames from the port that had nowhere to go",
        "cause",
        &[
            ("rx_full", |c| c.rx_drops),
            ("no_destination", |c| c.tx_drops),
        ],
    )?;
    per_port(
        enc,
        &ports,
        "vale_port_bad_input",
        "Values the port's client wrote that valed refused (ring indices, buffer \
         indices, lengths, flags); each refused frame is dropped",
        "",
        &[("", |c| c.bad_input)],
    )?;
    per_port(
        enc,
        &ports,
        "vale_port_learn_refused",
        "Source addresses of the port's frames the learning bridge did not learn \
         (learn-limit reached, or a full table); the frames are still forwarded",
        "",
        &[("", |c| c.learn_refused)],
    )?;
    family(
        enc,
        "vale_port_up",
        "1 if the port is up, 0 if it is down (a device down or gone) or free (a persistent port nobody holds)",
        ports.iter().map(|(sw, p)| {
            gauge(port_labels(sw, p), i64::from(p.state == "up"))
        }),
    )?;
    family(
        enc,
        "vale_port_learnt_addresses",
        "Source MAC addresses the switch's lookup holds for the port now",
        ports
            .iter()
            .map(|(sw, p)| gauge(port_labels(sw, p), i64::from(p.learnt))),
    )?;

    Ok(())
}

/// The families of every switch and its lookup module.
fn encode_switches(
    enc: &mut DescriptorEncoder,
    switches: &[SwitchInfo],
    lookups: &[LookupInfo],
) -> fmt::Result {
    // Per switch.
    family(
        enc,
        "vale_switch_ports",
        "Ports of the switch",
        switches
            .iter()
            .map(|s| gauge(vec![("switch", s.name.as_str())], s.ports.len() as i64)),
    )?;
    family(
        enc,
        "vale_lookup_counter",
        "The lookup module's own counters, by name, as vale-ctl lookup shows them (some count events, some are sizes: all are given as gauges)",
        lookups.iter().flat_map(|l| {
            l.counters.iter().map(move |c| {
                gauge(
                    vec![
                        ("switch", l.switch.as_str()),
                        ("module", l.module.as_str()),
                        ("counter", c.name.as_str()),
                    ],
                    c.value.min(i64::MAX as u64) as i64,
                )
            })
        }),
    )?;

    Ok(())
}

/// The families of every forwarding worker.
fn encode_workers(enc: &mut DescriptorEncoder, workers: &[WorkerInfo]) -> fmt::Result {
    // Per worker.
    let ids: Vec<String> = workers.iter().map(|w| w.id.to_string()).collect();
    let wl = |i: usize| vec![("worker", ids[i].as_str())];
    family(
        enc,
        "vale_worker_busy_seconds",
        "CPU time of the forwarding thread: polling and forwarding, not sleeping",
        workers
            .iter()
            .enumerate()
            .map(|(i, w)| (wl(i), ConstCounter::new(w.busy_ns as f64 / 1e9))),
    )?;
    family(
        enc,
        "vale_worker_batches",
        "Batches forwarded: passes over a ring that took at least one frame",
        workers
            .iter()
            .enumerate()
            .map(|(i, w)| counter(wl(i), w.batches)),
    )?;
    family(
        enc,
        "vale_worker_slots",
        "Slots those batches took from their rings (a frame of several slots counts each)",
        workers
            .iter()
            .enumerate()
            .map(|(i, w)| counter(wl(i), w.slots)),
    )?;
    family(
        enc,
        "vale_worker_rings",
        "Source rings the worker serves",
        workers
            .iter()
            .enumerate()
            .map(|(i, w)| gauge(wl(i), i64::from(w.rings))),
    )?;

    Ok(())
}

/// valed itself, under the names every Prometheus client library uses.
fn encode_process(enc: &mut DescriptorEncoder) -> fmt::Result {
    // valed itself, under the names every Prometheus client library uses.
    let me = process();
    family(
        enc,
        "process_resident_memory_bytes",
        "Resident memory of valed, bytes (port memory a client touched counts here too)",
        [gauge(vec![], me.rss_bytes as i64)],
    )?;
    family(
        enc,
        "process_virtual_memory_bytes",
        "Virtual memory of valed, bytes",
        [gauge(vec![], me.vm_bytes as i64)],
    )?;
    family(
        enc,
        "process_open_fds",
        "Descriptors valed has open",
        [gauge(vec![], me.open_fds as i64)],
    )?;
    family(
        enc,
        "process_max_fds",
        "Most descriptors valed may open",
        [gauge(vec![], me.max_fds as i64)],
    )?;
    family(
        enc,
        "process_cpu_seconds",
        "CPU time of valed, all threads, seconds",
        [(vec![], ConstCounter::new(me.cpu_seconds))],
    )?;
    Ok(())
}

/// What the kernel says of valed itself.
#[derive(Default)]
struct Process {
    rss_bytes: u64,
    vm_bytes: u64,
    open_fds: u64,
    max_fds: u64,
    cpu_seconds: f64,
}

fn process() -> Process {
    let mut me = Process::default();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        let mut f = statm
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        me.vm_bytes = f.next().unwrap_or(0) * page;
        me.rss_bytes = f.next().unwrap_or(0) * page;
    }
    // The directory itself holds one while it is read.
    me.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(0);
    // SAFETY: getrlimit with a live struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            me.max_fds = lim.rlim_cur;
        }
    }
    // SAFETY: getrusage with a live struct.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) == 0 {
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            me.cpu_seconds = secs(ru.ru_utime) + secs(ru.ru_stime);
        }
    }
    me
}

//! The port-kind seam in process, with a fake device (no root, no real device): frames enter
//! through a kind's ingress step, cross the pipeline, and leave through a direct sink (once per
//! destination per batch) or through the port's rx ring and the kind's egress step.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vale_abi::eventfd;

use super::{DevError, Device, TxSide};
use crate::access::Caller;
use crate::engine::{Engine, EngineConfig};
use crate::kind::{Delivered, DirectSink, OutFrames};
use crate::offload::Offload;

/// What a fake device was given, and what it holds for the switch.
#[derive(Default)]
struct Wire {
    to_switch: Mutex<VecDeque<Vec<u8>>>,
    from_switch: Mutex<Vec<Vec<u8>>>,
}

struct FakeDevice {
    name: String,
    wire: Arc<Wire>,
    /// Readable when frames wait in `to_switch`.
    ready: Arc<OwnedFd>,
    sink: Option<Arc<FakeSink>>,
}

impl Device for FakeDevice {
    fn describe(&self) -> (&'static str, String, String) {
        ("fake", self.name.clone(), String::new())
    }
    fn offloads(&self) -> bool {
        false
    }
    fn poll_fds(&self) -> Vec<RawFd> {
        vec![self.ready.as_raw_fd()]
    }
    fn ingress(&mut self, ring: &mut TxSide) -> Result<usize, DevError> {
        eventfd::drain(&*self.ready);
        let mut q = self.wire.to_switch.lock().unwrap();
        let mut n = 0;
        while let Some(f) = q.front() {
            if !ring.push(f) {
                // No room now: the rest waits, and the device says so again.
                eventfd::signal(&*self.ready);
                break;
            }
            q.pop_front();
            n += 1;
        }
        Ok(n)
    }
    fn send(&mut self, pieces: &[&[u8]], _off: Offload) -> Result<bool, DevError> {
        self.wire.from_switch.lock().unwrap().push(pieces.concat());
        Ok(true)
    }
    fn flush(&mut self) -> Result<(), DevError> {
        Ok(())
    }
    fn is_up(&self) -> bool {
        true
    }
    fn direct(&self) -> Option<Arc<dyn DirectSink>> {
        self.sink.clone().map(|s| s as Arc<dyn DirectSink>)
    }
}

#[derive(Default)]
struct FakeSink {
    frames: Mutex<Vec<Vec<u8>>>,
    calls: AtomicU64,
}

impl DirectSink for FakeSink {
    fn send_batch(&self, frames: &mut dyn OutFrames) -> Delivered {
        self.calls.fetch_add(1, Relaxed);
        let mut d = Delivered::default();
        let mut got = self.frames.lock().unwrap();
        while let Some(f) = frames.next_frame() {
            assert_eq!(f.iov[0].iov_len, 0, "the header slot is the sink's");
            let mut bytes = Vec::new();
            for v in &f.iov[1..] {
                // SAFETY: the pipeline's iovecs point at live frame pieces of their length.
                bytes.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                });
            }
            assert_eq!(bytes.len(), f.len as usize);
            got.push(bytes);
            d.frames += 1;
            d.bytes += f.len as u64;
        }
        d
    }
}

fn frame(src: u8, dst: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, src]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14..18].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in f[18..].iter_mut().enumerate() {
        *b = (i as u32).wrapping_add(seq) as u8;
    }
    f
}

fn fake(
    name: &str,
    with_sink: bool,
) -> (FakeDevice, Arc<Wire>, Arc<OwnedFd>, Option<Arc<FakeSink>>) {
    let wire = Arc::new(Wire::default());
    let ready = Arc::new(eventfd::new().unwrap());
    let sink = with_sink.then(|| Arc::new(FakeSink::default()));
    let dev = FakeDevice {
        name: name.into(),
        wire: wire.clone(),
        ready: ready.clone(),
        sink: sink.clone(),
    };
    (dev, wire, ready, sink)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "{what} did not happen in time");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn frames_cross_the_seam_both_ways() {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let admin = Caller::valed();
    let (dev_a, wire_a, ready_a, _) = fake("a", false);
    let (dev_b, wire_b, ready_b, sink_b) = fake("b", true);
    let sink_b = sink_b.unwrap();
    engine
        .attach_device("vale0:a", Box::new(dev_a), &admin)
        .unwrap();
    engine
        .attach_device("vale0:b", Box::new(dev_b), &admin)
        .unwrap();

    // a -> b: broadcast frames through b's direct sink, in batches.
    let to_b: Vec<Vec<u8>> = (0..300)
        .map(|i| frame(0xa, [0xff; 6], i, 60 + i as usize))
        .collect();
    wire_a
        .to_switch
        .lock()
        .unwrap()
        .extend(to_b.iter().cloned());
    eventfd::signal(&*ready_a);
    wait_for("300 frames at b's sink", || {
        sink_b.frames.lock().unwrap().len() == 300
    });
    assert_eq!(
        *sink_b.frames.lock().unwrap(),
        to_b,
        "frames changed or reordered"
    );
    let calls = sink_b.calls.load(Relaxed);
    assert!((1..=300).contains(&calls), "{calls} calls for 300 frames");

    // b -> a, unicast now that a is learnt: through a's rx ring and a's egress step.
    let to_a: Vec<Vec<u8>> = (0..200)
        .map(|i| frame(0xb, [2, 0, 0, 0, 0, 0xa], i, 1514))
        .collect();
    wire_b
        .to_switch
        .lock()
        .unwrap()
        .extend(to_a.iter().cloned());
    eventfd::signal(&*ready_b);
    wait_for("200 frames on a's wire", || {
        wire_a.from_switch.lock().unwrap().len() == 200
    });
    assert_eq!(*wire_a.from_switch.lock().unwrap(), to_a);

    let list = engine.list();
    let port = |n: &str| list[0].ports.iter().find(|p| p.name == n).unwrap().clone();
    let (a, b) = (port("vale0:a"), port("vale0:b"));
    assert_eq!((a.kind.as_str(), a.device.as_deref()), ("fake", Some("a")));
    assert_eq!((a.counters.tx_packets, a.counters.rx_packets), (300, 200));
    assert_eq!((b.counters.tx_packets, b.counters.rx_packets), (200, 300));
    assert_eq!(a.counters.rx_drops + b.counters.rx_drops, 0);

    engine.detach("vale0:a", &admin).unwrap();
    engine.detach("vale0:b", &admin).unwrap();
    assert!(engine.list().is_empty());
}

#[test]
fn unknown_kinds_and_arguments_are_refused_by_name() {
    let args = |kv: &[(&str, &str)]| -> super::KindArgs {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let err = |r: Result<Box<dyn Device>, String>| r.err().expect("refused");
    let e = err(super::open_device("vxlan", &args(&[])));
    assert!(
        e.contains("no port kind 'vxlan'") && e.contains("tap, nic"),
        "{e}"
    );
    let e = err(super::open_device("tap", &args(&[("iface", "x")])));
    assert!(
        e.contains("no argument 'iface'") && e.contains("name, persist"),
        "{e}"
    );
    let e = err(super::open_device("nic", &args(&[])));
    assert!(e.contains("needs argument 'iface'"), "{e}");
    let e = err(super::open_device(
        "tap",
        &args(&[("name", "t0"), ("persist", "maybe")]),
    ));
    assert!(e.contains("yes or no"), "{e}");
}

//! The port-kind seam in process, with a fake device (no root, no real device): frames enter
//! through a kind's ingress step, cross the pipeline, and leave through a direct sink (once per
//! destination per batch) or through the port's rx ring and the kind's egress step.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vale_abi::eventfd;

use vale_abi::region::PortParams;

use super::{polled, DevError, Device, Driver, Egress, Polled, TxSide};
use crate::access::Caller;
use crate::engine::{Engine, EngineConfig};
use crate::offload::{Caps, Offload};
use crate::sink::{Delivered, DirectSink, OutFrames};

/// What a fake device was given, and what it holds for the switch.
#[derive(Default)]
pub(crate) struct Wire {
    pub(crate) to_switch: Mutex<VecDeque<Vec<u8>>>,
    pub(crate) from_switch: Mutex<Vec<Vec<u8>>>,
}

impl Wire {
    /// The device has `frames` for the switch, and says so on its `ready` line.
    pub(crate) fn offer(&self, frames: &[Vec<u8>], ready: &OwnedFd) {
        self.to_switch
            .lock()
            .unwrap()
            .extend(frames.iter().cloned());
        eventfd::signal(ready);
    }
}

pub(crate) struct FakeDevice {
    pub(crate) name: String,
    pub(crate) wire: Arc<Wire>,
    /// Readable when frames wait in `to_switch`.
    pub(crate) ready: Arc<OwnedFd>,
    pub(crate) sink: Option<Arc<FakeSink>>,
    /// The port's ring geometry.
    pub(crate) params: PortParams,
}

impl Device for FakeDevice {
    fn describe(&self) -> (&'static str, String, String) {
        ("fake", self.name.clone(), String::new())
    }
    fn caps(&self) -> Caps {
        Caps::NONE
    }
    fn params(&self) -> PortParams {
        self.params
    }
    fn direct(&self) -> Option<Arc<dyn DirectSink>> {
        self.sink.clone().map(|s| s as Arc<dyn DirectSink>)
    }
    fn driver(self: Box<Self>) -> Box<dyn Driver> {
        polled(self)
    }
}

impl Polled for FakeDevice {
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
    fn is_up(&self) -> bool {
        true
    }
}

impl Egress for FakeDevice {
    fn send(&mut self, pieces: &[&[u8]], _off: Offload) -> Result<bool, DevError> {
        self.wire.from_switch.lock().unwrap().push(pieces.concat());
        Ok(true)
    }
    fn flush(&mut self) -> Result<(), DevError> {
        Ok(())
    }
}

#[derive(Default)]
pub(crate) struct FakeSink {
    pub(crate) frames: Mutex<Vec<Vec<u8>>>,
    pub(crate) calls: AtomicU64,
    /// Takes at most this many frames a call (0: all), then declines the rest.
    pub(crate) limit: usize,
    /// Where taken frames go, if not into `frames`: the device's own wire, to see one order.
    pub(crate) wire: Option<Arc<Wire>>,
}

impl DirectSink for FakeSink {
    fn send_batch(&self, frames: &mut dyn OutFrames, _flow: u32) -> Delivered {
        self.calls.fetch_add(1, Relaxed);
        let mut d = Delivered::default();
        let mut got = match &self.wire {
            Some(w) => w.from_switch.lock().unwrap(),
            None => self.frames.lock().unwrap(),
        };
        while let Some(f) = frames.next_frame() {
            if self.limit != 0 && d.frames as usize == self.limit {
                frames.put_back();
                d.declined = true;
                break;
            }
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

pub(crate) fn frame(src: u8, dst: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
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

pub(crate) fn fake(
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
        params: super::HOST_PARAMS,
    };
    (dev, wire, ready, sink)
}

/// What `engine.list()` says of port `name` of the first switch.
pub(crate) fn port_info(engine: &Engine, name: &str) -> vale_abi::control::PortInfo {
    engine.list()[0]
        .ports
        .iter()
        .find(|p| p.name == name)
        .unwrap()
        .clone()
}

pub(crate) fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    wait_showing(what, cond, String::new);
}

/// As `wait_for`, saying what `show` finds when the time is up.
pub(crate) fn wait_showing(what: &str, mut cond: impl FnMut() -> bool, show: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen in time{}",
            show()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
pub(crate) fn frames_cross_the_seam_both_ways() {
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
    wire_a.offer(&to_b, &ready_a);
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
    wire_b.offer(&to_a, &ready_b);
    wait_for("200 frames on a's wire", || {
        wire_a.from_switch.lock().unwrap().len() == 200
    });
    assert_eq!(*wire_a.from_switch.lock().unwrap(), to_a);

    let port = |n: &str| port_info(&engine, n);
    // A direct sink's deliveries are counted once its call returns, after the frames left.
    wait_for("b's rx counter", || {
        port("vale0:b").counters.rx_packets == 300
    });
    let (a, b) = (port("vale0:a"), port("vale0:b"));
    assert_eq!((a.kind.as_str(), a.device.as_deref()), ("fake", Some("a")));
    assert_eq!((a.counters.tx_packets, a.counters.rx_packets), (300, 200));
    assert_eq!((b.counters.tx_packets, b.counters.rx_packets), (200, 300));
    assert_eq!(a.counters.rx_drops + b.counters.rx_drops, 0);

    engine.detach("vale0:a", &admin).unwrap();
    engine.detach("vale0:b", &admin).unwrap();
    assert!(engine.list().is_empty());
}

/// A kind's ring geometry is its port's (a TAP's: 64 slots of 16 KiB), and frames of every
/// length up to 64 KiB cross unchanged between ports of either geometry, both ways, while
/// frames keep coming in small bursts from another thread: no wake-up is lost.
#[test]
pub(crate) fn a_kinds_ring_geometry_is_its_ports_and_long_frames_cross_it_whole() {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let admin = Caller::valed();
    let (mut dev_a, wire_a, ready_a, _) = fake("a", false);
    dev_a.params = super::tap::TAP_PARAMS;
    let (dev_b, wire_b, ready_b, sink_b) = fake("b", true);
    let sink_b = sink_b.unwrap();
    engine
        .attach_device("vale0:a", Box::new(dev_a), &admin)
        .unwrap();
    engine
        .attach_device("vale0:b", Box::new(dev_b), &admin)
        .unwrap();
    let (a, b) = (port_info(&engine, "vale0:a"), port_info(&engine, "vale0:b"));
    assert_eq!((a.slots, a.buf_size), (64, 16384));
    assert_eq!((b.slots, b.buf_size), (2048, 2112));

    let lens = [60, 1514, 2112, 16383, 16384, 16385, 40000, 65535, 65536];
    let frames = |src: u8, dst: [u8; 6], n: u32| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| frame(src, dst, i, lens[i as usize % lens.len()]))
            .collect()
    };
    // a -> b, broadcast: 300 frames in bursts of 1 to 7 with pauses of 0 to 300 µs, from
    // another thread, so bursts land while a's thread reads, forwards or goes to sleep. Each
    // burst fits a's 63 free slots (7 frames of at most 4 slots).
    let to_b = frames(0xa, [0xff; 6], 300);
    let offer = {
        let (to_b, wire_a, ready_a) = (to_b.clone(), wire_a.clone(), ready_a.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            let mut k = 1u32;
            while i < to_b.len() {
                let n = (k as usize % 7 + 1).min(to_b.len() - i);
                // Each burst waits until the one before has been read (a's ring is shallow).
                while !wire_a.to_switch.lock().unwrap().is_empty() {
                    std::thread::yield_now();
                }
                wire_a.offer(&to_b[i..i + n], &ready_a);
                i += n;
                k = k.wrapping_mul(1103515245).wrapping_add(12345);
                std::thread::sleep(Duration::from_micros((k >> 8) as u64 % 300));
            }
        })
    };
    wait_for("300 frames at b's sink", || {
        sink_b.frames.lock().unwrap().len() == 300
    });
    offer.join().unwrap();
    assert!(*sink_b.frames.lock().unwrap() == to_b, "frames changed");

    // b -> a, unicast: through a's rx ring of 64 slots (at most 15 frames of 64 KiB) and a's
    // egress step, a few frames at a time.
    let to_a = frames(0xb, [2, 0, 0, 0, 0, 0xa], 90);
    for (k, burst) in to_a.chunks(6).enumerate() {
        wire_b.offer(burst, &ready_b);
        wait_for("a burst on a's wire", || {
            wire_a.from_switch.lock().unwrap().len() == (k + 1) * 6
        });
    }
    assert!(
        *wire_a.from_switch.lock().unwrap() == to_a,
        "frames changed"
    );
    let (a, b) = (port_info(&engine, "vale0:a"), port_info(&engine, "vale0:b"));
    assert_eq!((a.counters.tx_packets, a.counters.rx_packets), (300, 90));
    assert_eq!(b.counters.tx_packets, 90);
    assert_eq!(a.counters.rx_drops + b.counters.rx_drops, 0);
    assert_eq!(a.counters.bad_input + b.counters.bad_input, 0);
    engine.detach("vale0:a", &admin).unwrap();
    engine.detach("vale0:b", &admin).unwrap();
}

/// A direct sink that takes only part of each batch: the rest goes through the port's rx ring
/// and the kind's egress step, and while frames wait there the sink is not called, so every
/// frame arrives once and in order.
#[test]
pub(crate) fn a_direct_sink_that_declines_keeps_the_order() {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let admin = Caller::valed();
    let (dev_a, wire_a, ready_a, _) = fake("a", false);
    let (mut dev_b, wire_b, _, _) = fake("b", false);
    let sink = Arc::new(FakeSink {
        limit: 3,
        wire: Some(wire_b.clone()),
        ..Default::default()
    });
    dev_b.sink = Some(sink.clone());
    engine
        .attach_device("vale0:a", Box::new(dev_a), &admin)
        .unwrap();
    engine
        .attach_device("vale0:b", Box::new(dev_b), &admin)
        .unwrap();
    let sent: Vec<Vec<u8>> = (0..2000)
        .map(|i| frame(0xa, [0xff; 6], i, 60 + (i % 200) as usize))
        .collect();
    for chunk in sent.chunks(100) {
        wire_a.offer(chunk, &ready_a);
    }
    wait_for("2000 frames at b", || {
        wire_b.from_switch.lock().unwrap().len() >= 2000
    });
    assert!(
        *wire_b.from_switch.lock().unwrap() == sent,
        "frames lost, doubled or reordered"
    );
    assert!(sink.calls.load(Relaxed) > 0);
    let b = || port_info(&engine, "vale0:b").counters;
    wait_for("b's counters", || b().rx_packets == 2000);
    assert_eq!(b().rx_drops, 0);
    engine.detach("vale0:a", &admin).unwrap();
    engine.detach("vale0:b", &admin).unwrap();
}

#[test]
pub(crate) fn unknown_kinds_and_arguments_are_refused_by_name() {
    let args = |kv: &[(&str, &str)]| -> super::KindArgs {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let err = |r: Result<Box<dyn Device>, super::Error>| {
        let e = r.err().expect("refused");
        assert!(
            matches!(
                e,
                super::Error {
                    kind: crate::ErrorKind::InvalidArgument,
                    ..
                }
            ),
            "{e:?}"
        );
        e.to_string()
    };
    let e = err(super::open_device("bogus", &args(&[])));
    assert!(
        e.contains("no port kind 'bogus'") && e.contains("tap, nic"),
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

/// A vhost-user front end of our own: a guest whose memory and rings a test writes by hand,
/// connected to port `vale0:vm` of `engine`, beside a fake device `vale0:peer`.
#[test]
pub(crate) fn every_kind_is_described() {
    use super::{Shape, KINDS};
    use std::collections::HashMap;

    let mut kind_flags = HashMap::new();
    for k in KINDS {
        assert!(!k.name.is_empty());
        assert!(
            !k.flag.help.is_empty(),
            "{}: no help for --{}",
            k.name,
            k.flag.long
        );
        assert!(!k.about.is_empty(), "{}: no help paragraph", k.name);
        assert!(
            k.about.contains(&format!("--{}", k.flag.long)),
            "{}: the paragraph does not say what --{} does",
            k.name,
            k.flag.long
        );
        let other = kind_flags.insert(k.flag.long, k.name);
        assert_eq!(other, None, "--{} picks two kinds", k.flag.long);
        assert_eq!(
            KINDS.iter().filter(|o| o.name == k.name).count(),
            1,
            "kind {} registered twice",
            k.name
        );
        if let Some(key) = k.flag.value {
            let a = k.arg(key).unwrap_or_else(|| {
                panic!("{}: --{} carries no argument '{key}'", k.name, k.flag.long)
            });
            assert!(
                a.shape != Shape::Switch && a.shape != Shape::List,
                "{}: --{} carries a {:?}",
                k.name,
                k.flag.long,
                a.shape
            );
        }
        for (i, a) in k.args.iter().enumerate() {
            assert!(!a.help.is_empty(), "{}: no help for '{}'", k.name, a.key);
            assert!(
                a.shape == Shape::Switch || !a.value_name.is_empty(),
                "{}: '{}' has no value name",
                k.name,
                a.key
            );
            assert!(
                !k.saved_args.contains(&a.key),
                "{}: '{}' is also a saved argument",
                k.name,
                a.key
            );
            for b in &k.args[i + 1..] {
                assert_ne!(a.key, b.key, "{}: argument '{}' twice", k.name, a.key);
                assert_ne!(
                    a.long(),
                    b.long(),
                    "{}: two arguments are --{}",
                    k.name,
                    a.long()
                );
            }
            match a.shape {
                Shape::Choice(words) => {
                    assert!(!words.is_empty(), "{}: '{}' has no choice", k.name, a.key)
                }
                Shape::Range(lo, hi) => {
                    assert!(lo <= hi, "{}: '{}' has an empty range", k.name, a.key)
                }
                _ => {}
            }
        }
    }
    // An option (a kind's argument not carried by its flag) means one thing in every kind.
    let mut options: HashMap<&str, (&str, &super::Arg)> = HashMap::new();
    for k in KINDS {
        for a in k.args.iter().filter(|a| Some(a.key) != k.flag.value) {
            if let Some(kind) = kind_flags.get(a.long()) {
                panic!(
                    "{}: option --{} is the flag of kind {kind}",
                    k.name,
                    a.long()
                );
            }
            if let Some((other, b)) = options.insert(a.long(), (k.name, a)) {
                assert_eq!(
                    a,
                    b,
                    "--{} means one thing in {} and another in {other}",
                    a.long(),
                    k.name
                );
            }
        }
    }
}

/// valed checks a request's arguments against the kind's description: an unknown one is
/// refused naming those it takes, a missing required one is named.
#[test]
pub(crate) fn arguments_are_checked_against_the_description() {
    let tap = super::kind("tap").unwrap();
    let args = |a: &[(&str, &str)]| -> super::KindArgs {
        a.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        super::check_args(tap, &args(&[("nome", "t")]), false),
        Err(super::Error::invalid(
            "port kind 'tap' takes no argument 'nome' (it takes: name, persist)"
        ))
    );
    assert_eq!(
        super::check_args(tap, &args(&[("persist", "yes")]), false),
        Err(super::Error::invalid(
            "port kind 'tap' needs argument 'name'"
        ))
    );
    assert_eq!(
        super::check_args(tap, &args(&[("name", "t")]), false),
        Ok(())
    );
    // A saved configuration's own arguments only where one is read.
    let saved = args(&[("name", "t"), ("netns", "ns1")]);
    assert!(super::check_args(tap, &saved, false).is_err());
    assert_eq!(super::check_args(tap, &saved, true), Ok(()));
    let vxlan = super::kind("vxlan").unwrap();
    assert_eq!(
        super::check_args(vxlan, &args(&[("vni", "1"), ("remote", "10.0.0.2")]), false),
        Err(super::Error::invalid(
            "port kind 'vxlan' needs argument 'local'"
        ))
    );
}

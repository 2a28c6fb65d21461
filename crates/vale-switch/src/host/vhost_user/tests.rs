//! vhost-user ports in process, with no guest and no root: a front end of the test's own
//! (`HandGuest`) writes a guest's memory and rings by hand and talks vhost-user to valed's
//! back end, beside a fake device of the seam's tests (`host/tests.rs`) as the peer port.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::access::Caller;
use crate::engine::{Engine, EngineConfig};
use crate::host::tests::*;
struct HandGuest {
    base: *mut u8,
    _memfd: OwnedFd,
    fe: Option<vhost::vhost_user::Frontend>,
    kicks: Vec<vmm_sys_util::eventfd::EventFd>,
    calls: Vec<vmm_sys_util::eventfd::EventFd>,
    dir: std::path::PathBuf,
    sock: std::path::PathBuf,
}

const HG_MEM: usize = 1 << 20;
const HG_QSZ: u16 = 64;
const RXQ: u64 = 0;
const TXQ: u64 = 1;
// Guest physical layout: per queue q, descriptors at 0x1000 + q * 0x4000, avail 0x800 after
// them, used 0x1000 after them; buffers from 0x20000.
fn hg_desc(q: u64) -> u64 {
    0x1000 + q * 0x4000
}
fn hg_avail(q: u64) -> u64 {
    hg_desc(q) + 0x800
}
fn hg_used(q: u64) -> u64 {
    hg_desc(q) + 0x1000
}

impl HandGuest {
    /// Attaches `vale0:vm` and connects to it, acking the offered features but `refuse`, and
    /// every protocol feature offered; sets up `pairs` queue pairs (at most 2 in this layout).
    fn connect_pairs(engine: &Engine, tag: &str, refuse: u64, pairs: usize) -> HandGuest {
        // SAFETY: plain syscalls on a descriptor we own; the mapping lives as long as `self`.
        let (memfd, base) = unsafe {
            let fd = libc::memfd_create(c"guest".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, HG_MEM as i64), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                HG_MEM,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            (OwnedFd::from_raw_fd(fd), p as *mut u8)
        };
        let dir =
            std::env::temp_dir().join(format!("vale-vhost-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("vm.sock");
        let args: crate::host::KindArgs = [("path".to_string(), sock.display().to_string())].into();
        engine
            .attach_host("vale0:vm", "vhost-user", &args, &Caller::valed())
            .unwrap();
        assert!(sock.exists());

        let queues = 2 * pairs;
        let (fe, kicks, calls) = handshake(&sock, &memfd, base, queues, refuse);
        HandGuest {
            base,
            _memfd: memfd,
            fe: Some(fe),
            kicks,
            calls,
            dir,
            sock,
        }
    }

    fn put(&self, gpa: u64, bytes: &[u8]) {
        assert!(gpa as usize + bytes.len() <= HG_MEM);
        // SAFETY: inside our mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(gpa as usize), bytes.len())
        };
    }

    fn get(&self, gpa: u64, len: usize) -> Vec<u8> {
        assert!(gpa as usize + len <= HG_MEM);
        // SAFETY: inside our mapping; the backend writes it concurrently, we only look.
        unsafe { std::slice::from_raw_parts(self.base.add(gpa as usize), len).to_vec() }
    }

    fn u16_at(&self, gpa: u64) -> u16 {
        u16::from_le_bytes(self.get(gpa, 2).try_into().unwrap())
    }

    /// Descriptor `i` of queue `q`: addr, len, flags (1 NEXT, 2 WRITE), next.
    fn set_desc(&self, q: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.put(hg_desc(q) + 16 * i as u64, &d);
    }

    /// Makes chain `head` available in slot `slot` of queue `q`'s avail ring.
    fn offer(&self, q: u64, slot: u16, head: u16) {
        self.put(
            hg_avail(q) + 4 + 2 * (slot % HG_QSZ) as u64,
            &head.to_le_bytes(),
        );
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.put(hg_avail(q) + 2, &(slot + 1).to_le_bytes());
    }

    /// Sends a memory table of the first `size` bytes of the guest's memory.
    fn set_mem(&mut self, size: usize) {
        use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
        self.fe
            .as_mut()
            .unwrap()
            .set_mem_table(&[VhostUserMemoryRegionInfo {
                guest_phys_addr: 0,
                memory_size: size as u64,
                userspace_addr: self.base as u64,
                mmap_offset: 0,
                mmap_handle: self._memfd.as_raw_fd(),
            }])
            .unwrap();
    }

    /// The guest's chains `frames` on transmit queue `q`, one descriptor each from slot
    /// `first` on (buffers from 0x60000, 16 KiB apart), kicked.
    fn transmit(&self, q: u64, first: u16, frames: &[Vec<u8>]) {
        for (k, f) in frames.iter().enumerate() {
            let mut m = plain_hdr(0);
            m.extend_from_slice(f);
            let i = first + k as u16;
            let at = 0x60000 + 0x4000 * i as u64;
            self.put(at, &m);
            self.set_desc(q, i, at, m.len() as u32, 0, 0);
            self.offer(q, i, i);
        }
        self.kick(q);
    }

    fn kick(&self, q: u64) {
        self.kicks[q as usize].write(1).unwrap();
    }

    /// Used element `i` of queue `q`: (id, len).
    fn used_elem(&self, q: u64, i: u16) -> (u32, u32) {
        let e = self.get(hg_used(q) + 4 + 8 * i as u64, 8);
        (
            u32::from_le_bytes(e[..4].try_into().unwrap()),
            u32::from_le_bytes(e[4..].try_into().unwrap()),
        )
    }

    /// The front end goes away: the port stays, down; detaching removes the socket.
    /// The front end goes (as when valed died under it) and a new connection sets the same
    /// memory and rings up again, at base 0, as DPDK's virtio_user does after valed restarts.
    fn reconnect(&mut self, engine: &Engine, refuse: u64) {
        self.fe = None;
        wait_for("the port down", || vm_port(engine).state == "down");
        let (fe, kicks, calls) = handshake(&self.sock, &self._memfd, self.base, 2, refuse);
        (self.fe, self.kicks, self.calls) = (Some(fe), kicks, calls);
        wait_for("the port up again", || vm_port(engine).state == "up");
    }

    fn close(mut self, engine: &Engine) {
        self.fe = None;
        wait_for("the port down", || vm_port(engine).state == "down");
        engine.detach("vale0:vm", &Caller::valed()).unwrap();
        assert!(!self.sock.exists());
    }
}

impl Drop for HandGuest {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        // SAFETY: our mapping; the port's memory table is the backend's own mapping.
        unsafe { libc::munmap(self.base.cast(), HG_MEM) };
    }
}

/// A front end's handshake on `sock` with the guest memory `memfd` (mapped at `base`): the
/// offered features but `refuse`, every protocol feature offered, `queues` queues at base 0.
fn handshake(
    sock: &std::path::Path,
    memfd: &OwnedFd,
    base: *mut u8,
    queues: usize,
    refuse: u64,
) -> (
    vhost::vhost_user::Frontend,
    Vec<vmm_sys_util::eventfd::EventFd>,
    Vec<vmm_sys_util::eventfd::EventFd>,
) {
    use vhost::vhost_user::message::VhostUserProtocolFeatures;
    use vhost::vhost_user::{Frontend, VhostUserFrontend};
    use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
    use vmm_sys_util::eventfd::EventFd;
    let mut fe = Frontend::connect(sock, queues as u64).unwrap();
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    assert_eq!(features & (1 << 32), 1 << 32, "VERSION_1 offered");
    fe.set_features(features & !refuse).unwrap();
    let offered = fe.get_protocol_features().unwrap();
    let want = VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::MTU
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
    assert_eq!(offered, want, "protocol features offered");
    fe.set_protocol_features(offered).unwrap();
    fe.set_mem_table(&[VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: HG_MEM as u64,
        userspace_addr: base as u64,
        mmap_offset: 0,
        mmap_handle: memfd.as_raw_fd(),
    }])
    .unwrap();
    let kicks: Vec<EventFd> = (0..queues)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let calls: Vec<EventFd> = (0..queues)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    for q in 0..queues {
        fe.set_vring_num(q, HG_QSZ).unwrap();
        fe.set_vring_addr(
            q,
            &VringConfigData {
                queue_max_size: HG_QSZ,
                queue_size: HG_QSZ,
                flags: 0,
                desc_table_addr: base as u64 + hg_desc(q as u64),
                used_ring_addr: base as u64 + hg_used(q as u64),
                avail_ring_addr: base as u64 + hg_avail(q as u64),
                log_addr: None,
            },
        )
        .unwrap();
        fe.set_vring_base(q, 0).unwrap();
        fe.set_vring_call(q, &calls[q]).unwrap();
        fe.set_vring_kick(q, &kicks[q]).unwrap();
        fe.set_vring_enable(q, true).unwrap();
    }
    (fe, kicks, calls)
}

fn vm_port(engine: &Engine) -> vale_abi::control::PortInfo {
    port_info(engine, "vale0:vm")
}

/// A switch with a fake device on `vale0:peer` and a hand-driven guest on `vale0:vm` that
/// acked the offered features but `refuse`: the engine, the guest, the peer's wire and the
/// peer's ready line.
fn guest_and_peer(tag: &str, refuse: u64) -> (Arc<Engine>, HandGuest, Arc<Wire>, Arc<OwnedFd>) {
    guest_with_pairs_and_peer(tag, refuse, 1)
}

/// As `guest_and_peer`, the guest setting up `pairs` queue pairs.
fn guest_with_pairs_and_peer(
    tag: &str,
    refuse: u64,
    pairs: usize,
) -> (Arc<Engine>, HandGuest, Arc<Wire>, Arc<OwnedFd>) {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let (dev, wire, ready, _) = fake("peer", false);
    engine
        .attach_device("vale0:peer", Box::new(dev), &Caller::valed())
        .unwrap();
    let g = HandGuest::connect_pairs(&engine, tag, refuse, pairs);
    (engine, g, wire, ready)
}

/// The virtio-net header of a frame with no offload work, in `num_buffers` chains.
fn plain_hdr(num_buffers: u16) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[10..].copy_from_slice(&num_buffers.to_le_bytes());
    h
}

const F_MRG_RXBUF: u64 = 1 << 15;
const F_EVENT_IDX: u64 = 1 << 29;

/// A hostile vhost-user front end of our own. Chains outside guest memory, looping, runts,
/// offload requests outside the frame or not negotiated, and rx buffers too small are counted
/// drops; good frames around them cross the switch both ways; valed never crashes.
#[test]
fn vhost_user_guest_input_is_checked() {
    // Without merged rx buffers a frame must fit one chain; no TSO of IPv6 asked for.
    let (engine, g, wire, ready) = guest_and_peer("checked", F_MRG_RXBUF | F_EVENT_IDX | 1 << 12);

    // Guest tx: eleven chains, eight of them hostile.
    let good = frame(0x7, [0xff; 6], 1, 60);
    let mut hdr_and_frame = plain_hdr(0);
    hdr_and_frame.extend_from_slice(&good);
    g.put(0x20000, &hdr_and_frame);
    // Offload headers (csum_start + csum_offset beyond the frame; TSO with gso_size 0; legacy
    // UFO; TSO of IPv6, not negotiated), each before the same frame.
    let offload_hdr = |flags: u8, gso: u8, gso_size: u16, start: u16, offset: u16| {
        let mut h = plain_hdr(0);
        h[0] = flags;
        h[1] = gso;
        h[4..6].copy_from_slice(&gso_size.to_le_bytes());
        h[6..8].copy_from_slice(&start.to_le_bytes());
        h[8..10].copy_from_slice(&offset.to_le_bytes());
        h.extend_from_slice(&good);
        h
    };
    let bad_offloads = [
        offload_hdr(1, 0, 0, 50, 9),
        offload_hdr(1, 1, 0, 34, 16),
        offload_hdr(1, 3, 1400, 34, 6),
        offload_hdr(1, 4, 1400, 54, 16),
    ];
    for (k, h) in bad_offloads.iter().enumerate() {
        g.put(0x21000 + 0x100 * k as u64, h);
        g.set_desc(
            TXQ,
            7 + k as u16,
            0x21000 + 0x100 * k as u64,
            h.len() as u32,
            0,
            0,
        );
    }
    // 0: outside guest memory.
    g.set_desc(TXQ, 0, 0xffff_0000, 100, 0, 0);
    // 1 -> 2 -> 1: a loop.
    g.set_desc(TXQ, 1, 0x20000, 12, 1, 2);
    g.set_desc(TXQ, 2, 0x20000 + 12, 10, 1, 1);
    // 3: header and 10 bytes: a runt.
    g.set_desc(TXQ, 3, 0x20000, 22, 0, 0);
    // 4 -> 5: header split across descriptors, then the frame: good.
    g.set_desc(TXQ, 4, 0x20000, 5, 1, 5);
    g.set_desc(TXQ, 5, 0x20000 + 5, 7 + 60, 0, 0);
    // 6: a frame written by the device (wrong direction).
    g.set_desc(TXQ, 6, 0x20000, 72, 2, 0);
    // 11 -> 12 -> 13: the Ethernet header split over three descriptors: good.
    g.set_desc(TXQ, 11, 0x20000, 12 + 3, 1, 12);
    g.set_desc(TXQ, 12, 0x20000 + 15, 5, 1, 13);
    g.set_desc(TXQ, 13, 0x20000 + 20, 52, 0, 0);
    let heads = [0u16, 1, 3, 4, 6, 7, 8, 9, 10, 11];
    for (slot, head) in heads.into_iter().enumerate() {
        g.offer(TXQ, slot as u16, head);
    }
    g.kick(TXQ);
    wait_for("the good frames at the peer", || {
        wire.from_switch.lock().unwrap().len() == 2
    });
    assert_eq!(wire.from_switch.lock().unwrap()[..], [good.clone(), good]);
    wait_for("every tx chain back in the used ring", || {
        g.u16_at(hg_used(TXQ) + 2) == heads.len() as u16
    });
    // A chain goes back used before it is counted.
    wait_for("two frames and eight bad chains counted", || {
        let c = vm_port(&engine).counters;
        (c.tx_packets, c.bad_input) == (2, 8)
    });
    assert_eq!(vm_port(&engine).state, "up");

    // Guest rx: a buffer too small, then a good one; the peer sends two frames.
    g.set_desc(RXQ, 0, 0x30000, 20, 2, 0);
    g.set_desc(RXQ, 1, 0x31000, 2048, 2, 0);
    g.offer(RXQ, 0, 0);
    g.offer(RXQ, 1, 1);
    g.kick(RXQ);
    let to_vm: Vec<Vec<u8>> = (0..2)
        .map(|i| frame(0x8, [2, 0, 0, 0, 0, 0x7], 10 + i, 100))
        .collect();
    wire.offer(&to_vm, &ready);
    wait_for("both rx chains used", || g.u16_at(hg_used(RXQ) + 2) == 2);
    // Used element 1: the good buffer, header (num_buffers = 1) and the second frame.
    assert_eq!(g.used_elem(RXQ, 1), (1, 12 + 100));
    let mut want = plain_hdr(1);
    want.extend_from_slice(&to_vm[1]);
    assert_eq!(g.get(0x31000, 112), want);
    assert!(g.calls[0].read().is_ok(), "the guest got an interrupt");
    // The switch wrote straight into the guest's buffers: one frame taken, one dropped
    // (counted once the switch's call returns, after the guest could see them).
    wait_for("one frame taken, one dropped", || {
        let c = vm_port(&engine).counters;
        (c.rx_packets, c.rx_drops, c.bad_input) == (1, 1, 9)
    });

    // The tx avail index jumps past the queue's size: counted, nothing taken; once it is
    // sane again the next chain goes through.
    let next = heads.len() as u16;
    g.put(hg_avail(TXQ) + 2, &(next + 1000).to_le_bytes());
    g.kick(TXQ);
    wait_for("the jump counted", || {
        vm_port(&engine).counters.bad_input > 9
    });
    assert_eq!(g.u16_at(hg_used(TXQ) + 2), next, "nothing taken");
    g.offer(TXQ, next, 4);
    g.kick(TXQ);
    wait_for("the next good frame at the peer", || {
        wire.from_switch.lock().unwrap().len() == 3
    });
    assert_eq!(vm_port(&engine).state, "up");

    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// Merged rx buffers: a frame spans as many of the guest's chains as it needs, the header
/// says how many, each used element says what was written into it; a frame waits (it is not
/// dropped) while the guest has too few buffers, and goes once it adds more.
#[test]
fn vhost_user_frames_span_merged_rx_buffers() {
    let (engine, g, wire, ready) = guest_and_peer("mrg", 0);

    // Three chains of 64 bytes: a frame of 12 + 200 bytes needs four.
    for i in 0..4u16 {
        g.set_desc(RXQ, i, 0x30000 + 0x100 * i as u64, 64, 2, 0);
    }
    for i in 0..3u16 {
        g.offer(RXQ, i, i);
    }
    g.kick(RXQ);
    let f = frame(0x8, [2, 0, 0, 0, 0, 0x7], 1, 200);
    wire.offer(std::slice::from_ref(&f), &ready);
    wait_for("the frame in vale0:vm's rx ring", || {
        vm_port(&engine).counters.rx_packets == 1
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        g.u16_at(hg_used(RXQ) + 2),
        0,
        "no chain used for a frame that does not fit"
    );

    g.offer(RXQ, 3, 3);
    g.kick(RXQ);
    wait_for("four rx chains used", || g.u16_at(hg_used(RXQ) + 2) == 4);
    let lens: Vec<(u32, u32)> = (0..4).map(|i| g.used_elem(RXQ, i)).collect();
    assert_eq!(lens, [(0, 64), (1, 64), (2, 64), (3, 20)]);
    let mut got = Vec::new();
    for i in 0..4u64 {
        got.extend(g.get(0x30000 + 0x100 * i, 64));
    }
    let mut want = plain_hdr(4);
    want.extend_from_slice(&f);
    assert_eq!(&got[..want.len()], &want[..]);
    let c = vm_port(&engine).counters;
    assert_eq!((c.rx_packets, c.rx_drops, c.bad_input), (1, 0, 0), "{c:?}");

    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// A front end that makes its eventfds blocking (their flags are its own: valed shares the
/// files) and reads every kick back at once cannot hold valed's threads (one that also fills
/// an interrupt eventfd's counter loses its connection: see
/// `a_call_eventfd_made_blocking_ends_the_connection_not_a_thread`): frames still cross both ways, and the port goes down and detaches at
/// once when the front end leaves.
#[test]
fn vhost_user_guest_blocking_its_eventfds_holds_nothing() {
    let (engine, g, wire, ready) = guest_and_peer("block", 0);
    for fd in g.calls.iter().chain(&g.kicks).map(|e| e.as_raw_fd()) {
        // SAFETY: fcntl on our own descriptor.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK), 0);
        }
    }
    // Each kick is taken back before valed could read it (a blocking read would wait).
    let kick = |q: u64| {
        g.kick(q);
        g.kicks[q as usize].read().unwrap();
    };
    for i in 0..4u16 {
        g.set_desc(RXQ, i, 0x30000 + 0x1000 * i as u64, 2048, 2, 0);
        g.offer(RXQ, i, i);
    }
    kick(RXQ);
    let to_vm: Vec<Vec<u8>> = (0..4).map(|i| frame(0x8, [0xff; 6], i, 100)).collect();
    wire.offer(&to_vm, &ready);
    wait_for("four frames in the guest", || {
        g.u16_at(hg_used(RXQ) + 2) == 4
    });
    // A storm of kicks taken back at once, on both queues, from another thread, while the
    // peer sends: whatever valed does then, it must not wait on these descriptors.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kicks: Vec<RawFd> = g.kicks.iter().map(|k| k.as_raw_fd()).collect();
    let storm = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let one = 1u64.to_ne_bytes();
            let mut got = [0u8; 8];
            while !stop.load(Relaxed) {
                for &fd in &kicks {
                    // SAFETY: plain syscalls on the test's own eventfds, 8-byte buffers.
                    unsafe {
                        libc::write(fd, one.as_ptr().cast(), 8);
                        libc::read(fd, got.as_mut_ptr().cast(), 8);
                    }
                }
            }
        })
    };
    for i in 0..20 {
        wire.offer(&[frame(0x8, [0xff; 6], 100 + i, 100)], &ready);
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Relaxed);
    storm.join().unwrap();
    g.transmit(TXQ, 0, &[frame(0x7, [0xff; 6], 1, 60)]);
    wait_for("the guest's frame at the peer", || {
        wire.from_switch.lock().unwrap().len() == 1
    });
    // The switch still writes into the guest: the storm's frames waited for buffers (the
    // guest had none left), and go once it adds some.
    assert_eq!(g.u16_at(hg_used(RXQ) + 2), 4);
    for i in 4..8u16 {
        g.set_desc(RXQ, i, 0x30000 + 0x1000 * i as u64, 2048, 2, 0);
        g.offer(RXQ, i, i);
    }
    g.kick(RXQ);
    wait_for("frames in the guest after the storm", || {
        g.u16_at(hg_used(RXQ) + 2) == 8
    });
    let t = Instant::now();
    g.close(&engine);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "leaving and detaching took {:?}",
        t.elapsed()
    );
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// The front end replaces its memory table under traffic, with one that leaves out where some
/// chains point: those are counted as bad input, the rest cross intact, every chain comes back
/// used, valed never touches memory outside the table of the moment.
#[test]
fn vhost_user_memory_table_changes_under_traffic() {
    let (engine, mut g, wire, _ready) = guest_and_peer("memtable", 0);
    // Chain 0 lies low (inside a half table), chain 1 high (only inside the whole one).
    let f = frame(0x7, [0xff; 6], 1, 60);
    let mut hf = plain_hdr(0);
    hf.extend_from_slice(&f);
    let (low, high) = (0x20000u64, (HG_MEM as u64 / 2) + 0x1000);
    g.put(low, &hf);
    g.put(high, &hf);
    g.set_desc(TXQ, 0, low, hf.len() as u32, 0, 0);
    g.set_desc(TXQ, 1, high, hf.len() as u32, 0, 0);
    let rounds = 200u16;
    for r in 0..rounds {
        // The new table races valed's thread still at the round before (the queue holds 64).
        g.set_mem(if r % 2 == 0 { HG_MEM / 2 } else { HG_MEM });
        if r >= 2 {
            wait_for("the round before last", || {
                g.u16_at(hg_used(TXQ) + 2) >= 2 * (r - 1)
            });
        }
        g.offer(TXQ, 2 * r, 0);
        g.offer(TXQ, 2 * r + 1, 1);
        g.kick(TXQ);
    }
    wait_for("every chain back in the used ring", || {
        g.u16_at(hg_used(TXQ) + 2) == 2 * rounds
    });
    // A chain goes back used before its frame is forwarded and counted.
    wait_for("every chain counted", || {
        let c = vm_port(&engine).counters;
        c.tx_packets + c.bad_input == 2 * rounds as u64
    });
    let c = vm_port(&engine).counters;
    assert!(
        c.tx_packets >= rounds as u64,
        "{c:?}: the low chain always crosses"
    );
    wait_for("the peer got them all", || {
        wire.from_switch.lock().unwrap().len() as u64 == c.tx_packets
    });
    assert!(wire.from_switch.lock().unwrap().iter().all(|x| *x == f));
    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// The port's moderation knob applies to a guest's interrupts as to any client's: with 20 ms,
/// frames that follow an interrupt within the interval are in the guest at once, and their
/// interrupt comes at the interval's end, not lost and not at once.
#[test]
fn vhost_user_guest_interrupts_are_moderated() {
    // No event index: this guest wants every interrupt (its avail ring's flags are 0).
    let (engine, g, wire, ready) = guest_and_peer("moderation", F_EVENT_IDX);
    for i in 0..40u16 {
        g.set_desc(RXQ, i, 0x30000 + 0x800 * i as u64, 2048, 2, 0);
        g.offer(RXQ, i, i);
    }
    g.kick(RXQ);
    engine
        .set("vale0:vm", "moderation", "20000", &Caller::valed())
        .unwrap();
    let call = &g.calls[0];
    let _ = call.read();
    wire.offer(&[frame(0x8, [0xff; 6], 0, 60)], &ready);
    wait_for("the first interrupt", || call.read().is_ok());
    let t = Instant::now();
    let rest: Vec<Vec<u8>> = (1..40).map(|i| frame(0x8, [0xff; 6], i, 60)).collect();
    wire.offer(&rest, &ready);
    wait_for("every frame in the guest", || {
        g.u16_at(hg_used(RXQ) + 2) == 40
    });
    wait_for("the deferred interrupt", || call.read().is_ok());
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(10),
        "the interrupt came {waited:?} after the one before: not deferred"
    );
    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// Kick moderation (see `vhost_user::rx::Pace`): a guest with event indices sends bursts of 8
/// frames every 50 µs (200 of them once valed has returned its first chains: a worker kept
/// off its CPU for the first milliseconds by a loaded machine sees a stream all the same) and
/// kicks only when its avail index passes valed's avail event, as a driver does. With the
/// port's moderation set, valed asks for a kick only after several bursts (its avail event
/// several chains ahead, up to 15 here; never without), every frame delivered in order; once
/// the stream stops, the last frames are taken by the backstop and the next kick is asked
/// for at once again (an idle guest wakes nobody, a lone frame waits for nothing).
#[test]
fn vhost_user_guest_kicks_are_moderated() {
    const BURSTS: u16 = 200;
    const BURST: u16 = 8;
    const AT: u64 = 0x60000;
    let (engine, g, wire, _ready) = guest_and_peer("kicks", 0);
    // No interrupts wanted: only kicks are looked at here.
    for q in [RXQ, TXQ] {
        g.put(
            hg_avail(q) + 4 + 2 * HG_QSZ as u64,
            &0x8000u16.to_le_bytes(),
        );
    }
    wait_for("the port up", || vm_port(&engine).state == "up");
    engine
        .set("vale0:vm", "moderation", "100", &Caller::valed())
        .unwrap();
    // Whether valed asks for a kick now that the avail index went from `old` to `new` (the
    // virtio spec's vring_need_event on the used ring's avail event).
    let avail_event = || g.u16_at(hg_used(TXQ) + 4 + 8 * HG_QSZ as u64);
    let asks = |old: u16, new: u16| {
        new.wrapping_sub(avail_event()).wrapping_sub(1) < new.wrapping_sub(old)
    };
    let frames: Vec<Vec<u8>> = (0..HG_QSZ)
        .map(|i| frame(0x7, [0xff; 6], i.into(), 60))
        .collect();
    for i in 0..HG_QSZ {
        let mut m = plain_hdr(0);
        m.extend_from_slice(&frames[i as usize]);
        g.put(AT + 0x100 * i as u64, &m);
        g.set_desc(TXQ, i, AT + 0x100 * i as u64, m.len() as u32, 0, 0);
    }
    // `ahead`: the farthest valed's avail event was past what it had taken (0 without
    // moderation: a kick for the next chain).
    let (mut next, mut kicks, mut ahead) = (0u16, 0u32, 0u16);
    let start = Instant::now();
    let (mut bursts, mut counted) = (0u64, 0u16);
    while counted < BURSTS {
        let due = start + Duration::from_micros(50 * bursts);
        // Room for the burst (valed returned the chains posted a queue ago), and its time.
        while next.wrapping_sub(g.u16_at(hg_used(TXQ) + 2)) > HG_QSZ - BURST || Instant::now() < due
        {
            assert!(start.elapsed() < Duration::from_secs(10), "no room");
            std::hint::spin_loop();
        }
        let old = next;
        // (An avail event behind the used index is an old one: valed is at work.)
        let past = avail_event().wrapping_sub(g.u16_at(hg_used(TXQ) + 2)) as i16;
        ahead = ahead.max(past.clamp(0, HG_QSZ as i16) as u16);
        for _ in 0..BURST {
            g.offer(TXQ, next, next % HG_QSZ);
            next = next.wrapping_add(1);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if asks(old, next) {
            g.kick(TXQ);
            kicks += 1;
        }
        bursts += 1;
        if g.u16_at(hg_used(TXQ) + 2) != 0 {
            counted += 1;
        }
    }
    let took = start.elapsed();
    let sent = BURST as usize * bursts as usize;
    wait_for("every frame at the peer", || {
        wire.from_switch.lock().unwrap().len() == sent
    });
    let got = wire.from_switch.lock().unwrap().clone();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, x)| *x == frames[i % HG_QSZ as usize]),
        "frames out of order"
    );
    // Without moderation the avail event is never ahead of what valed took; with it, as
    // far as the chains of an interval at the rate seen (15 here; less on a crowded CPU,
    // where the guest's bursts come late).
    assert!(
        ahead >= 2,
        "valed's avail event never more than {ahead} chains ahead ({kicks} kicks for {bursts} \
         bursts in {took:?}): no kick moderation"
    );
    // The stream over, the backstop took the rest and the next kick is asked for at once.
    wait_for("kicks asked for again", || avail_event() == next);
    // A lone frame now kicks, and crosses.
    let old = next;
    g.offer(TXQ, next, next % HG_QSZ);
    next = next.wrapping_add(1);
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    assert!(
        asks(old, next),
        "a lone frame after the stream is not asked a kick for"
    );
    g.kick(TXQ);
    wait_for("the lone frame at the peer", || {
        wire.from_switch.lock().unwrap().len() == sent + 1
    });
    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// A guest that polls its queues gets no interrupt: valed writes a queue's call eventfd only
/// when the guest asks for one (the avail ring's NO_INTERRUPT flag clear; with the event
/// index, the used index passing the guest's used event), as DPDK's virtio PMD, which polls,
/// relies on. Frames cross both ways without one; asked again, the guest is interrupted.
#[test]
fn vhost_user_a_polling_guest_is_not_interrupted() {
    for (tag, refuse) in [("poll-flags", F_EVENT_IDX), ("poll-event", 0)] {
        let (engine, g, wire, ready) = guest_and_peer(tag, refuse);
        let event_idx = refuse == 0;
        // The used event sits after the avail ring's entries.
        let used_event = |q: u64| hg_avail(q) + 4 + 2 * HG_QSZ as u64;
        for q in [RXQ, TXQ] {
            if event_idx {
                // Half the index space away: the used index does not pass it in this test.
                g.put(used_event(q), &0x8000u16.to_le_bytes());
            } else {
                g.put(hg_avail(q), &1u16.to_le_bytes());
            }
        }
        for i in 0..40u16 {
            g.set_desc(RXQ, i, 0x30000 + 0x800 * i as u64, 2048, 2, 0);
            g.offer(RXQ, i, i);
        }
        g.kick(RXQ);
        wait_for("the port up", || vm_port(&engine).state == "up");
        for c in &g.calls {
            let _ = c.read();
        }

        let to_guest: Vec<Vec<u8>> = (0..20).map(|i| frame(0x8, [0xff; 6], i, 60)).collect();
        wire.offer(&to_guest, &ready);
        wait_for("frames in the guest", || g.u16_at(hg_used(RXQ) + 2) == 20);
        let from_guest: Vec<Vec<u8>> = (0..8).map(|i| frame(0x7, [0xff; 6], i, 60)).collect();
        g.transmit(TXQ, 0, &from_guest);
        wait_for("the guest's frames sent", || {
            g.u16_at(hg_used(TXQ) + 2) == 8 && wire.from_switch.lock().unwrap().len() == 8
        });
        for (q, c) in g.calls.iter().enumerate() {
            assert!(
                c.read().is_err(),
                "{tag}: queue {q} interrupted, though the guest asked for no interrupt"
            );
        }

        // Asked again (the flag clear; the used event at the used index), the next frame
        // toward the guest interrupts it.
        if event_idx {
            g.put(used_event(RXQ), &20u16.to_le_bytes());
        } else {
            g.put(hg_avail(RXQ), &0u16.to_le_bytes());
        }
        wire.offer(&[frame(0x8, [0xff; 6], 20, 60)], &ready);
        wait_for("the interrupt asked for", || g.calls[0].read().is_ok());
        g.close(&engine);
        engine.detach("vale0:peer", &Caller::valed()).unwrap();
    }
}

/// Several queue pairs: the front end learns from valed how many pairs it offers (pairs, not
/// queues) and how many memory regions it takes; pair 1's transmit queue is served (by its
/// own worker); a flow toward the guest stays on one receive queue, in order; `vale-ctl list`
/// shows the pairs in use.
#[test]
fn vhost_user_queue_pairs() {
    use vhost::vhost_user::VhostUserFrontend;
    let (engine, mut g, wire, ready) = guest_with_pairs_and_peer("mq", 0, 2);
    let fe = g.fe.as_mut().unwrap();
    assert_eq!(fe.get_queue_num().unwrap(), super::DEFAULT_PAIRS as u64);
    assert_eq!(fe.get_max_mem_slots().unwrap(), 32);

    // Pair 1 (queue 3) sends five frames.
    let sent: Vec<Vec<u8>> = (0..5).map(|i| frame(0x7, [0xff; 6], i, 60)).collect();
    g.transmit(3, 0, &sent);
    wait_for("pair 1's frames at the peer", || {
        wire.from_switch.lock().unwrap().len() == 5
    });
    assert_eq!(*wire.from_switch.lock().unwrap(), sent);

    // Receive buffers on both pairs; pair 0's worker wakes on them.
    for q in [0u64, 2] {
        for i in 0..8u16 {
            g.set_desc(q, i, 0x40000 + q * 0x8000 + 0x800 * i as u64, 0x800, 2, 0);
            g.offer(q, i, i);
        }
        g.kick(q);
    }
    wait_for("both pairs in use", || {
        vm_port(&engine)
            .negotiated
            .is_some_and(|n| n.contains("queue pairs 2 in use of 4"))
    });

    // One flow of six frames from the peer: all on one receive queue, in order.
    let to_vm: Vec<Vec<u8>> = (0..6)
        .map(|i| frame(0x8, [2, 0, 0, 0, 0, 0x7], 20 + i, 100))
        .collect();
    wire.offer(&to_vm, &ready);
    let used = |q: u64| g.u16_at(hg_used(q) + 2);
    wait_for("six frames in the guest", || used(0) + used(2) == 6);
    let q = if used(0) == 6 { 0 } else { 2 };
    assert_eq!(used(q), 6, "one flow, one queue");
    for i in 0..6u16 {
        let (id, len) = g.used_elem(q, i);
        assert_eq!((id, len), (i as u32, 12 + 100));
        let got = g.get(0x40000 + q * 0x8000 + 0x800 * i as u64 + 12, 100);
        assert_eq!(got, to_vm[i as usize], "frame {i} in order");
    }
    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// A front end that adds memory regions beyond the number valed told it is disconnected: the
/// port goes down, with one log line (valed holds a descriptor and a mapping per region).
#[test]
fn vhost_user_memory_regions_are_capped() {
    use vhost::vhost_user::VhostUserFrontend;
    use vhost::VhostUserMemoryRegionInfo;
    let (engine, mut g, _wire, _ready) = guest_and_peer("slots", 0);
    wait_for("the port up", || vm_port(&engine).state == "up");
    let fe = g.fe.as_mut().unwrap();
    let slots = fe.get_max_mem_slots().unwrap();
    // Up to the limit, each a page of the guest's memory at its own address (the first
    // table holds one region already): served.
    let region = |k: u64| VhostUserMemoryRegionInfo {
        guest_phys_addr: 0x1_0000_0000 + k * 0x1000,
        memory_size: 0x1000,
        userspace_addr: g.base as u64 + k * 0x1000,
        mmap_offset: k * 0x1000,
        mmap_handle: g._memfd.as_raw_fd(),
    };
    for k in 0..slots - 1 {
        fe.add_mem_region(&region(k)).unwrap();
    }
    assert_eq!(fe.get_queue_num().unwrap(), 4, "still served");
    assert_eq!(vm_port(&engine).state, "up");
    // One more: the connection ends.
    let _ = fe.add_mem_region(&region(slots));
    wait_for("the port down", || vm_port(&engine).state == "down");
    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// A front end that shrinks the guest's memory file under valed (valed's next access there
/// would raise SIGBUS): valed goes on, the connection ends with the port down and counted,
/// and the switch keeps serving its other ports.
#[test]
fn vhost_user_guest_memory_shrunk_under_valed() {
    let (engine, g, wire, ready) = guest_and_peer("shrink", 0);
    g.transmit(TXQ, 0, &[frame(0x7, [0xff; 6], 1, 60)]);
    wait_for("the frame at the peer", || {
        wire.from_switch.lock().unwrap().len() == 1
    });
    let bad_before = vm_port(&engine).counters.bad_input;

    // The whole file goes; from now on neither valed nor this test may touch the guest's
    // pages (the test's own mapping would fault too).
    // SAFETY: our own descriptor.
    assert_eq!(unsafe { libc::ftruncate(g._memfd.as_raw_fd(), 0) }, 0);
    g.kick(TXQ);
    g.kick(RXQ);
    // A frame toward the guest: the switch's thread writes into its memory.
    wire.offer(&[frame(0x8, [2, 0, 0, 0, 0, 0x7], 2, 100)], &ready);
    wait_for("the port down", || vm_port(&engine).state == "down");
    assert!(vm_port(&engine).counters.bad_input > bad_before);

    // The switch goes on: a second fake port takes the peer's frames.
    let (dev2, wire2, _ready2, _) = fake("peer2", false);
    engine
        .attach_device("vale0:peer2", Box::new(dev2), &Caller::valed())
        .unwrap();
    wire.offer(&[frame(0x8, [0xff; 6], 3, 100)], &ready);
    wait_for("the peer's broadcast at peer2", || {
        !wire2.from_switch.lock().unwrap().is_empty()
    });
    g.close(&engine);
    for p in ["vale0:peer", "vale0:peer2"] {
        engine.detach(p, &Caller::valed()).unwrap();
    }
}

/// A memory file of `len` bytes, filled with `byte`, and a vm-memory region mapping it.
fn memfd_region(len: usize, byte: u8) -> (std::fs::File, vm_memory::GuestRegionMmap) {
    use std::io::Write;
    // SAFETY: a NUL-terminated name; the descriptor is owned at once.
    let fd = unsafe { libc::memfd_create(c"vale-test-table".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor of ours.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(&vec![byte; len]).unwrap();
    let fo = vm_memory::FileOffset::new(f.try_clone().unwrap(), 0);
    let map = vm_memory::MmapRegion::from_file(fo, len).unwrap();
    let r = vm_memory::GuestRegionMmap::new(map, vm_memory::GuestAddress(0)).unwrap();
    (f, r)
}

/// Whether `addr` lies in a mapping of this process.
fn mapped(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore writes one byte for one page; it fails with ENOMEM where nothing is mapped.
    unsafe { libc::mincore(addr as *mut libc::c_void, 1, &mut v) == 0 }
}

/// A guest memory table that the front end replaced while a worker was in the middle of a
/// pass over it stays guarded while mapped, and mapped while guarded: its range is never left
/// registered after it is unmapped, where a SIGBUS in whatever mapping comes there next (a
/// shrunk memory file of another front end) would make the guard map zero pages over it,
/// over another port's memory.
#[test]
fn an_old_memory_table_is_guarded_only_while_mapped() {
    use vm_memory::{
        GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap, GuestMemoryRegion,
        MemoryRegionAddress,
    };
    const LEN: usize = 4 << 20;
    let (_fa, ra) = memfd_region(LEN, 0xa);
    let a = ra.get_host_address(MemoryRegionAddress(0)).unwrap() as usize;
    let table_a = GuestMemoryMmap::from_regions(vec![ra]).unwrap();
    let mem = GuestMemoryAtomic::new(table_a);
    let tables = super::Tables::default();
    tables.track(&mem, 0).unwrap();
    assert!(super::guard::covers(a) && mapped(a));

    // A worker's pass holds table A while the library takes table B (SET_MEM_TABLE).
    let pass = mem.memory();
    let (_fb, rb) = memfd_region(LEN, 0xb);
    mem.lock()
        .unwrap()
        .replace(GuestMemoryMmap::from_regions(vec![rb]).unwrap());
    tables.track(&mem, 0).unwrap();
    drop(pass);
    // The pass is over: A is held by the list alone. Guarded and mapped, or neither.
    assert_eq!(
        super::guard::covers(a),
        mapped(a),
        "table A guarded {}, mapped {}",
        super::guard::covers(a),
        mapped(a)
    );

    if !mapped(a) {
        // What the stale guard does: two mappings where A was, one that will fault (a
        // memory file shrunk to nothing) and, above it, another port's memory.
        let (fx, _) = memfd_region(LEN / 2, 0);
        let (fy, _) = memfd_region(LEN / 2, 0);
        let at = |addr: usize, f: &std::fs::File| {
            // SAFETY: a shared mapping of our own file at addresses nothing holds (NOREPLACE).
            unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    LEN / 2,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                    f.as_raw_fd(),
                    0,
                )
            }
        };
        let x = at(a, &fx);
        let y = at(a + LEN / 2, &fy);
        if x as usize == a && y as usize == a + LEN / 2 {
            // SAFETY: y maps LEN / 2 bytes of our own file.
            unsafe { std::ptr::write_volatile(y as *mut u8, 0x77) };
            fx.set_len(0).unwrap();
            // SAFETY: past the end of its file: SIGBUS, which the guard catches.
            let _ = unsafe { std::ptr::read_volatile(x as *const u8) };
            // SAFETY: still our mapping of y, unless the guard mapped zeros over it.
            let seen = unsafe { std::ptr::read_volatile(y as *const u8) };
            // SAFETY: our own mappings.
            unsafe {
                libc::munmap(x, LEN / 2);
                libc::munmap(y, LEN / 2);
            }
            assert_eq!(
                seen, 0x77,
                "the guard of an unmapped table zeroed another mapping"
            );
        }
    }

    // Once the library lets B go too, and the next table comes, A goes: unguarded, unmapped.
    let (_fc, rc) = memfd_region(4096, 0xc);
    mem.lock()
        .unwrap()
        .replace(GuestMemoryMmap::from_regions(vec![rc]).unwrap());
    tables.track(&mem, 0).unwrap();
    assert_eq!(tables.len(), 1);
    assert!(!super::guard::covers(a));
}

/// Frames toward a guest with several queue pairs: each flow (source port and ring) to one
/// pair, only pairs the guest enabled, flows spread over them.
#[test]
fn flows_spread_over_the_enabled_pairs() {
    use super::pair_of;
    assert_eq!(pair_of(12345, 0), 0);
    assert_eq!(pair_of(12345, 0b1), 0);
    for enabled in [0b11u32, 0b1010, 0b1111, 0xffff] {
        let mut seen = 0u32;
        for port in 0..64u32 {
            for ring in 0..4u32 {
                let flow = port << 16 | ring;
                let p = pair_of(flow, enabled);
                assert_ne!(enabled & 1 << p, 0, "pair {p} not enabled in {enabled:#b}");
                assert_eq!(p, pair_of(flow, enabled), "one flow, one pair");
                seen |= 1 << p;
            }
        }
        assert_eq!(seen, enabled, "every enabled pair takes flows");
    }
}

/// NET_SET_MTU, sent as the front end sends it (the `vhost` crate's front end has no call for
/// it), asking for a reply; the answer's value (0: taken).
fn net_set_mtu(g: &HandGuest, mtu: u64) -> u64 {
    use std::io::{Read, Write};
    let fd = g.fe.as_ref().unwrap().as_raw_fd();
    // SAFETY: a borrowed view of the front end's socket, used while the front end is idle.
    let mut s =
        std::mem::ManuallyDrop::new(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) });
    let mut m = Vec::new();
    for w in [20u32, 0x1 | 0x8, 8] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(&mtu.to_le_bytes());
    s.write_all(&m).unwrap();
    let mut r = [0u8; 20];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[..4], 20u32.to_le_bytes(), "a reply to NET_SET_MTU");
    u64::from_le_bytes(r[12..].try_into().unwrap())
}

/// Once the guest acked VIRTIO_NET_F_MTU, the MTU its front end set holds both ways (the
/// virtio spec's rule for frames without segmentation, an Ethernet header and a VLAN tag
/// allowed): a longer frame from the guest is bad input, a longer one toward it a drop of
/// the port's; frames around them cross. Without the feature nothing is cut.
#[test]
fn vhost_user_the_mtu_holds_both_ways() {
    const F_MTU: u64 = 1 << 3;
    let (engine, g, wire, ready) = guest_and_peer("mtu", 0);
    assert_eq!(net_set_mtu(&g, 40), 1, "an MTU below 68 is refused");
    assert_eq!(net_set_mtu(&g, 1500), 0);
    wait_for("the MTU shown", || {
        vm_port(&engine)
            .negotiated
            .is_some_and(|n| n.contains("mtu 1500"))
    });

    let sizes = [1514usize, 1518, 1519, 9000, 60];
    let sent: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| frame(0x7, [0xff; 6], i as u32, n))
        .collect();
    // The worker's pass that the connection's last messages started may still run: the
    // answer above waited for it (without that wait, about one run in 50 of the whole suite
    // on two vCPUs saw all five frames cross, read against the MTU of before).
    g.transmit(TXQ, 0, &sent);
    wait_showing(
        "the frames within the MTU at the peer",
        || wire.from_switch.lock().unwrap().len() == 3,
        || {
            let lens: Vec<usize> = wire
                .from_switch
                .lock()
                .unwrap()
                .iter()
                .map(|f| f.len())
                .collect();
            let port = vm_port(&engine);
            let c = port.counters;
            format!(
                ": the peer has frames of {lens:?}; tx_packets {}, bad_input {}, used index {}; \
                 negotiated {:?}",
                c.tx_packets,
                c.bad_input,
                g.u16_at(hg_used(TXQ) + 2),
                port.negotiated
            )
        },
    );
    wait_for("two frames over the MTU counted", || {
        let c = vm_port(&engine).counters;
        (c.tx_packets, c.bad_input) == (3, 2)
    });
    let got = wire.from_switch.lock().unwrap().clone();
    assert_eq!(got, [sent[0].clone(), sent[1].clone(), sent[4].clone()]);
    assert_eq!(vm_port(&engine).state, "up");

    for i in 0..4u16 {
        g.set_desc(RXQ, i, 0x30000 + 0x800 * i as u64, 0x800, 2, 0);
        g.offer(RXQ, i, i);
    }
    g.kick(RXQ);
    let to_vm: Vec<Vec<u8>> = [1518usize, 1519, 100]
        .iter()
        .enumerate()
        .map(|(i, &n)| frame(0x8, [2, 0, 0, 0, 0, 0x7], 10 + i as u32, n))
        .collect();
    wire.offer(&to_vm, &ready);
    wait_for("one frame dropped, two taken", || {
        let c = vm_port(&engine).counters;
        (c.rx_packets, c.rx_drops) == (2, 1)
    });
    assert_eq!(g.u16_at(hg_used(RXQ) + 2), 2, "two rx chains used");
    assert_eq!(g.used_elem(RXQ, 0), (0, 12 + 1518));
    assert_eq!(g.used_elem(RXQ, 1), (1, 12 + 100));
    assert_eq!(g.get(0x30000 + 0x800 + 12, 100), to_vm[2]);
    assert_eq!(
        vm_port(&engine).counters.bad_input,
        2,
        "not the guest's fault"
    );
    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();

    // A guest that did not ack the feature: the front end's MTU is shown, nothing is cut.
    let (engine, g, wire, _ready) = guest_and_peer("no-mtu", F_MTU);
    assert_eq!(net_set_mtu(&g, 1500), 0);
    let long = frame(0x7, [0xff; 6], 1, 4000);
    g.transmit(TXQ, 0, std::slice::from_ref(&long));
    wait_for("the long frame at the peer", || {
        wire.from_switch.lock().unwrap().len() == 1
    });
    assert_eq!(wire.from_switch.lock().unwrap()[0], long);
    assert_eq!(vm_port(&engine).counters.bad_input, 0);
    g.close(&engine);
    engine.detach("vale0:peer", &Caller::valed()).unwrap();
}

/// Every registered kind's description is complete, and vale-ctl can make its flags from it
/// with no clash: names and flags unique, every argument helped, an option two kinds share
/// the same argument in both, no kind's flag taken by an option.
/// A front end that keeps its rings across a new connection (valed killed and started again
/// under DPDK's virtio_user, which then sends base 0): the queues are taken up where the used
/// ring stands, so nothing is sent twice and the used index goes on from there.
#[test]
fn a_front_end_that_kept_its_rings_is_taken_up_where_they_stand() {
    let refuse = F_MRG_RXBUF | F_EVENT_IDX | 1 << 12;
    let (engine, mut g, wire, _ready) = guest_and_peer("takeup", refuse);
    let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(0x7, [0xff; 6], i, 60)).collect();
    g.transmit(TXQ, 0, &frames);
    wait_for("three frames at the peer", || {
        wire.from_switch.lock().unwrap().len() == 3
    });
    wait_for("three chains used", || g.u16_at(hg_used(TXQ) + 2) == 3);
    g.reconnect(&engine, refuse);
    let next = frame(0x7, [0xff; 6], 3, 60);
    g.transmit(TXQ, 3, std::slice::from_ref(&next));
    wait_for("the fourth chain used", || g.u16_at(hg_used(TXQ) + 2) == 4);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let got = wire.from_switch.lock().unwrap().clone();
    assert_eq!(got.len(), 4, "frames sent again after the new connection");
    assert_eq!(got[3], next);
    assert_eq!(g.used_elem(TXQ, 3).0, 3);
    assert_eq!(vm_port(&engine).counters.bad_input, 0);
    g.close(&engine);
}

/// A front end that fills a call eventfd's counter and makes it blocking: the interrupt that
/// would sleep is cut short and the connection ends; the port detaches at once.
#[test]
fn a_call_eventfd_made_blocking_ends_the_connection_not_a_thread() {
    let (engine, g, wire, ready) = guest_and_peer("blockcall", F_MRG_RXBUF | F_EVENT_IDX | 1 << 12);
    let call = g.calls[RXQ as usize].as_raw_fd();
    let full: u64 = 0xffff_ffff_ffff_fffe;
    // SAFETY: fcntl and an 8-byte write on the test's own eventfd, whose counter is 0.
    unsafe {
        assert_eq!(libc::fcntl(call, libc::F_SETFL, 0), 0);
        assert_eq!(libc::write(call, (&raw const full).cast(), 8), 8);
    }
    g.set_desc(RXQ, 0, 0x30000, 2048, 2, 0);
    g.offer(RXQ, 0, 0);
    g.kick(RXQ);
    wire.offer(&[frame(0x8, [2, 0, 0, 0, 0, 0x7], 1, 100)], &ready);
    wait_for("the frame in the guest's buffer", || {
        g.u16_at(hg_used(RXQ) + 2) == 1
    });
    wait_for("the connection ended", || vm_port(&engine).state == "down");
    let t = std::time::Instant::now();
    engine.detach("vale0:vm", &Caller::valed()).unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
}

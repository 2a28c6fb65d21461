//! Busy-waiting clients (`vale::Wait::Busy`, `vale-pktgen --busy`): ping-pong through a valed
//! that busy-polls and through one that sleeps, clients whose valed is killed, and what a busy
//! wait asks of valed (no interrupt). Most checks are of correctness (frames delivered, exit
//! status, flags), never of a latency: busy clients on a small machine share its CPUs. Three
//! are of a count in a time, with margins of ten times and more: busy parties that share one
//! CPU, alone or beside a task that never gives way, and valed's polling vhost-user workers
//! beside the front ends they serve, must take turns at once or sleep, not hold the CPU for a
//! time slice a turn (see `vale_abi::spin`).

use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vale::Wait;
use vale_tests::*;

/// Round trips per ping-pong run. Two busy clients and valed on two CPUs take turns on them
/// at the scheduler's pace (milliseconds a round trip at worst), so keep it small.
const ROUND_TRIPS: u64 = 300;

/// How long a busy client may take to notice that valed is gone: it looks about once a
/// millisecond, but shares the CPUs with other spinners.
const NOTICE: Duration = Duration::from_secs(5);

/// pong (busy or not, as `pong_args` says) on vale0:b, announced, then `ROUND_TRIPS` pings
/// from vale0:a to it with `ping_args`; checks that every ping was answered and counted.
fn ping_pong(v: &Valed, ping_args: &[&str], pong_args: &[&str]) {
    ping_pong_within(v, ROUND_TRIPS, None, ping_args, pong_args);
}

/// As [`ping_pong`], `n` round trips, all of them within `limit` if given (ping stops there,
/// and the test fails with the count it reached); ping's report.
fn ping_pong_within(
    v: &Valed,
    n: u64,
    limit: Option<Duration>,
    ping_args: &[&str],
    pong_args: &[&str],
) -> serde_json::Value {
    let mut args = vec![
        "-i",
        "vale0:b",
        "-f",
        "pong",
        "-T",
        "120",
        "--json",
        "-q",
        "--announce",
        "-S",
        "02:00:00:00:00:0b",
    ];
    args.extend_from_slice(pong_args);
    let pong = v.spawn_client(v.pktgen(&args), "vale-pktgen pong", "vale0:b");
    // The announcement is in: pings go to b alone (unicast), nothing floods back to a.
    assert!(
        wait_until(T, || v.counters("vale0:b").tx_packets >= 1),
        "pong never announced itself"
    );
    let count = n.to_string();
    let seconds = limit.map(|l| l.as_secs_f64().to_string());
    let mut args = vec![
        "-i",
        "vale0:a",
        "-f",
        "ping",
        "-n",
        &count,
        "-D",
        "02:00:00:00:00:0b",
        "--json",
        "-q",
    ];
    if let Some(s) = &seconds {
        args.extend_from_slice(&["-T", s]);
    }
    args.extend_from_slice(ping_args);
    let ping = Kid::spawn(v.pktgen(&args), "vale-pktgen ping").finish(Duration::from_secs(120));
    let r = report(&ping, "vale-pktgen ping");
    assert_eq!(
        num(&r, "packets"),
        n,
        "round trips within {limit:?} (ping {ping_args:?}, pong {pong_args:?}): {r}"
    );
    assert_eq!(
        num(&r, "drops"),
        0,
        "every ping answered within a second: {r}"
    );
    assert_eq!(num(&r["rtt"], "samples"), n, "{r}");
    // (a's port went away with ping.) b's announcement plus one echo per ping.
    let bc = v.counters("vale0:b");
    assert_eq!(
        (bc.rx_packets, bc.tx_packets, bc.rx_drops),
        (n, n + 1, 0),
        "{bc:?}"
    );
    pong.signal(libc::SIGTERM);
    let p = report(&pong.finish(T), "vale-pktgen pong");
    assert_eq!(num(&p, "packets"), n, "{p}");
    r
}

/// Nobody sleeps: valed busy-polls, both clients busy-wait.
#[test]
fn busy_ping_pong_through_busy_polling_valed() {
    let _s = serial();
    let v = Valed::start_with(&["--busy-poll-us", "50"]);
    ping_pong(&v, &["--busy"], &["--busy"]);
}

/// Busy clients against a valed that sleeps: their kicks still wake it.
#[test]
fn busy_ping_pong_through_sleeping_valed() {
    let _s = serial();
    let v = Valed::start();
    ping_pong(&v, &["--busy"], &["--busy"]);
}

/// One busy client, one that sleeps, and one that spins a little then sleeps
/// (`--busy=US`), through a sleeping valed.
#[test]
fn mixed_waits_ping_pong() {
    let _s = serial();
    let v = Valed::start();
    ping_pong(&v, &["--busy"], &[]);
    let v = Valed::start_with(&["--busy-poll-us", "50"]);
    ping_pong(&v, &["--busy=20"], &["--busy"]);
}

/// Pins the calling thread to one CPU of those it may use, and so everything it starts from
/// then on (processes and threads inherit the mask); the old mask comes back on drop.
struct OneCpu {
    was: libc::cpu_set_t,
}

impl OneCpu {
    fn pin() -> OneCpu {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: an all-zero cpu_set_t is a valid (empty) set; the calls fill or read live
        // sets of the size given, for the calling thread (pid 0).
        unsafe {
            let mut was: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, size, &mut was),
                0,
                "sched_getaffinity"
            );
            let cpu = (0..libc::CPU_SETSIZE as usize)
                .rev()
                .find(|&c| libc::CPU_ISSET(c, &was))
                .expect("a CPU to run on");
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            assert_eq!(
                libc::sched_setaffinity(0, size, &one),
                0,
                "pin to cpu {cpu}"
            );
            OneCpu { was }
        }
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        // SAFETY: restores the set read in `pin`, for the calling thread.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.was) };
    }
}

/// A thread that spins without ever giving way (a compiler's worth of CPU demand), on the
/// CPUs its creator may use, for at most a minute; stopped on drop.
struct Hog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Hog {
    fn start() -> Hog {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let end = Instant::now() + Duration::from_secs(60);
                while !stop.load(Relaxed) && Instant::now() < end {
                    for _ in 0..1000 {
                        std::hint::spin_loop();
                    }
                }
            }
        });
        Hog {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Round trips of the one-CPU ping-pongs below, and the time they get: 10–20 µs each when
/// the parties take turns at once or sleep (2000 took 0.05–0.5 s, with or without the hog,
/// on a loaded 2-vCPU machine), milliseconds each when every turn waits for a spinner's time
/// slice to end (before busy waits gave way: 712 round trips in 5 s, 7 ms each on average,
/// median 1.4 ms; 272 in 5 s with the parties pinned by taskset).
const ONE_CPU_ROUND_TRIPS: u64 = 4000;
const ONE_CPU_LIMIT: Duration = Duration::from_secs(5);

/// valed busy-polling, ping and pong busy-waiting, all three on one CPU: each spinner yields
/// the CPU between looks once it sees the others, so the round trips come at the pace of the
/// work, not of the scheduler's time slices.
#[test]
fn busy_parties_sharing_one_cpu_take_turns() {
    let _s = serial();
    let _cpu = OneCpu::pin();
    let v = Valed::start_with(&["--busy-poll-us", "1000"]);
    let r = ping_pong_within(
        &v,
        ONE_CPU_ROUND_TRIPS,
        Some(ONE_CPU_LIMIT),
        &["--busy"],
        &["--busy"],
    );
    eprintln!("three busy parties on one CPU: {r}");
}

/// As above with a task on the CPU that never gives way: a yield hands the CPU to it for a
/// whole time slice, so the busy parties must sleep instead (and count it).
#[test]
fn busy_parties_beside_a_cpu_hog_sleep_instead() {
    let _s = serial();
    let _cpu = OneCpu::pin();
    let v = Valed::start_with(&["--busy-poll-us", "1000"]);
    let _hog = Hog::start();
    let r = ping_pong_within(
        &v,
        ONE_CPU_ROUND_TRIPS,
        Some(ONE_CPU_LIMIT),
        &["--busy"],
        &["--busy"],
    );
    eprintln!("three busy parties and a hog on one CPU: {r}");
    assert!(
        num(&r, "crowded_waits") > 0,
        "ping never slept beside the hog: {r}"
    );
}

/// Round trips through two vhost-user ports of a polling valed with everything on one CPU, in
/// [`VM_ONE_CPU_SECONDS`]: 66,800-139,500 in 20 runs here (2-vCPU AMD EPYC) now that the
/// ports' pair workers yield now and then while they spin; before, 2 runs of 6 held at a time
/// slice a round trip (1,047 and 1,866 in 2 s; 73,700-134,700 in the others).
const VM_ONE_CPU_ROUND_TRIPS: u64 = 6_000;
const VM_ONE_CPU_SECONDS: &str = "2";

/// valed polling (`--busy-poll-us`) two vhost-user ports, whose front ends (vhost-paced ping
/// and pong) sleep on their interrupts, all on one CPU: each port's pair worker is a thread
/// that spins, and a front end woken on that CPU need not preempt it (Linux's EEVDF); the
/// workers' spins yield the CPU every few microseconds (`Spinner::yielding_every`), so the
/// front ends run at once instead of after a spinner's time slice.
#[test]
fn polling_vhost_user_workers_sharing_one_cpu_take_turns() {
    use std::process::{Command, Stdio};
    let _s = serial();
    let _cpu = OneCpu::pin();
    let v = Valed::start_with(&["--busy-poll-us", "1000"]);
    let dir = TempDir::new("vhost-one-cpu");
    let sock = |n: &str| dir.0.join(n).to_str().unwrap().to_string();
    let (s1, s2) = (sock("vm1.sock"), sock("vm2.sock"));
    v.ctl_ok(&["attach", "vale1:vm1", "--vhost-user", &s1]);
    v.ctl_ok(&["attach", "vale1:vm2", "--vhost-user", &s2]);
    let mut pong = Command::new(bin("vhost-paced"))
        .args([
            "--socket",
            &s2,
            "--role",
            "pong",
            "--mac",
            "02:00:00:00:0e:02",
        ])
        .args(["--seconds", "60"])
        .stdout(Stdio::null())
        .spawn()
        .expect("run vhost-paced --role pong");
    assert!(wait_until(T, || v
        .port("vale1:vm2")
        .is_some_and(|p| p.state == "up")));
    let out = Command::new(bin("vhost-paced"))
        .args([
            "--socket",
            &s1,
            "--role",
            "ping",
            "--dst",
            "02:00:00:00:0e:02",
        ])
        .args([
            "--mac",
            "02:00:00:00:0e:01",
            "--seconds",
            VM_ONE_CPU_SECONDS,
        ])
        .output()
        .expect("run vhost-paced --role ping");
    let _ = pong.kill();
    let _ = pong.wait();
    let r = report(&out, "vhost-paced ping");
    eprintln!("vhost-user ping-pong, valed polling, one CPU: {r}");
    assert!(
        num(&r, "samples") >= VM_ONE_CPU_ROUND_TRIPS,
        "fewer than {VM_ONE_CPU_ROUND_TRIPS} round trips in {VM_ONE_CPU_SECONDS} s: {r}"
    );
}

/// Busy ping and pong in full swing when valed is killed: both end with a clear error, in
/// bounded time, instead of spinning for ever.
#[test]
fn busy_clients_end_when_valed_is_killed() {
    let _s = serial();
    for valed_args in [&["--busy-poll-us", "50"][..], &[][..]] {
        let v = Valed::start_with(valed_args);
        let pong = v.spawn_client(
            v.pktgen(&[
                "-i",
                "vale0:b",
                "-f",
                "pong",
                "--busy",
                "-q",
                "--announce",
                "-S",
                "02:00:00:00:00:0b",
            ]),
            "vale-pktgen pong --busy",
            "vale0:b",
        );
        let ping = v.spawn_client(
            v.pktgen(&[
                "-i",
                "vale0:a",
                "-f",
                "ping",
                "--busy",
                "-q",
                "-D",
                "02:00:00:00:00:0b",
            ]),
            "vale-pktgen ping --busy",
            "vale0:a",
        );
        assert!(
            wait_until(T, || v.counters("vale0:b").rx_packets >= 20),
            "no round trips before the kill: {:?}",
            v.counters("vale0:b")
        );
        v.signal(libc::SIGKILL);
        let killed = Instant::now();
        let outs: Vec<(Output, &str)> = [(ping, "ping"), (pong, "pong")]
            .into_iter()
            .map(|(kid, what)| (kid.finish(NOTICE), what))
            .collect();
        for (out, what) in &outs {
            assert_exit(
                out,
                &format!("vale-pktgen {what} --busy (valed {valed_args:?})"),
                1,
                "valed went away",
            );
        }
        eprintln!(
            "valed {valed_args:?}: both busy clients ended {:?} after the kill",
            killed.elapsed()
        );
    }
}

/// `appl_need_kick` in the client's half of the CSB of region ring `k`.
fn appl_need_kick(port: &vale::Port, k: u32) -> &AtomicU32 {
    let h = port.region();
    // SAFETY: the CSB lies inside the port's mapping, at the offset valed wrote and libvale
    // checked; appl_need_kick is the 4-byte aligned field at offset 8 of each ring's pair.
    unsafe {
        &*((h as *const vale_abi::region::RegionHeader as *const u8)
            .add(h.csb_ofs as usize + 128 * k as usize + 8) as *const AtomicU32)
    }
}

/// A busy wait never asks valed for an interrupt (its `appl_need_kick` stays 0), ends at its
/// timeout, and returns as soon as a frame is there; a wait that spins a while then sleeps
/// does ask, once it sleeps. Region ring 1 is the rx ring.
#[test]
fn busy_wait_asks_for_no_interrupt_and_keeps_its_timeout() {
    let _s = serial();
    let v = Valed::start();
    let a = v.open("vale0:a");
    let b = Arc::new(v.open("vale0:b"));
    assert_eq!(b.wait_mode(), Wait::Sleep);
    b.set_wait(Wait::Busy);
    assert_eq!(b.wait_mode(), Wait::Busy);

    for (mode, expect_flag) in [
        (Wait::Busy, false),
        (Wait::BusyFor(Duration::from_millis(1)), true),
    ] {
        b.set_wait(mode);
        let crowded = b.crowded_waits();
        let waiter = std::thread::spawn({
            let b = b.clone();
            move || {
                let t = Instant::now();
                (
                    b.poll(READABLE, Some(Duration::from_millis(300))),
                    t.elapsed(),
                )
            }
        });
        let mut flag_seen = false;
        while !waiter.is_finished() {
            flag_seen |= appl_need_kick(&b, 1).load(SeqCst) != 0;
            std::thread::sleep(Duration::from_micros(200));
        }
        let (got, waited) = waiter.join().expect("waiter");
        assert_eq!(
            got.expect("poll"),
            vale::Events::default(),
            "{mode:?}: nothing was sent"
        );
        assert!(
            waited >= Duration::from_millis(300),
            "{mode:?}: returned after {waited:?}, before its timeout"
        );
        // A busy wait on a CPU that others keep sleeps instead, asking for interrupts.
        if b.crowded_waits() == crowded {
            assert_eq!(flag_seen, expect_flag, "{mode:?}: appl_need_kick seen set");
        }
        assert_eq!(
            appl_need_kick(&b, 1).load(SeqCst),
            0,
            "{mode:?}: flag left set"
        );
    }

    // A frame sent while b spins ends the spin (no interrupt needed).
    b.set_wait(Wait::Busy);
    for seq in 0..50 {
        let waiter = std::thread::spawn({
            let b = b.clone();
            move || b.poll(READABLE, Some(T))
        });
        let f = test_frame(60, MAC_A, BROADCAST, seq);
        send_all(&a, std::slice::from_ref(&f));
        let got = join_by("a busy poll with a frame sent", waiter, Instant::now() + T);
        assert_eq!(got.expect("poll"), READABLE, "frame {seq}");
        assert_eq!(recv_frames(&b), vec![f], "frame {seq}");
    }
    if b.crowded_waits() == 0 {
        assert_eq!(b.interrupts(), 0, "a busy client consumed interrupts");
    }
}

/// A library client in a busy `poll` with no timeout when valed dies: the poll fails with
/// ConnectionReset (it looks at the control connection now and then while it spins).
#[test]
fn busy_poll_without_timeout_ends_when_valed_dies() {
    let _s = serial();
    let v = Valed::start_with(&["--busy-poll-us", "50"]);
    let b = Arc::new(v.open("vale0:b"));
    b.set_wait(Wait::Busy);
    let waiter = std::thread::spawn({
        let b = b.clone();
        move || b.poll(READABLE, None)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !waiter.is_finished(),
        "poll(None) returned with nothing to read"
    );
    v.signal(libc::SIGKILL);
    let e = join_by(
        "a busy poll(None) after valed died",
        waiter,
        Instant::now() + NOTICE,
    )
    .expect_err("poll after valed died");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(e.to_string().contains("valed went away"), "{e}");
}

//! Test harness: starts a real valed in a run directory of its own and drives it with the
//! real tools (vale-ctl, vale-pktgen) and with in-process libvale clients.
//!
//! The binaries are the ones cargo built beside the test executable, so run
//! `cargo build --release --workspace` before `cargo test --release --workspace` (the README's
//! test command does both).

use std::borrow::BorrowMut;
use std::collections::HashSet;
use std::io::Read;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vale_abi::control::{PortCounters, PortInfo, SwitchInfo, SOCKET_NAME};

pub mod dpdk;
pub mod guest;
pub mod libvirt;
pub mod netns;
pub mod tunnel;

/// Bound of every wait that should take milliseconds.
pub const T: Duration = Duration::from_secs(10);

/// What [`vale::Port::poll`] waits for when a client expects frames.
pub const READABLE: vale::Events = vale::Events::READABLE;

/// What [`vale::Port::poll`] waits for when a client waits for room on its tx rings.
pub const WRITABLE: vale::Events = vale::Events::WRITABLE;

/// Serialises the tests of one test executable that take it (each executable has a lock of
/// its own): tests that take timings or rates, count wake-ups or descriptors, or load every
/// CPU. A failed test does not block the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits up to `limit` for `cond`, looking every 2 ms. Whether it came true in time.
pub fn wait_until(limit: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_until_every(limit, Duration::from_millis(2), cond)
}

/// As [`wait_until`], sleeping `step` between looks.
pub fn wait_until_every(limit: Duration, step: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(step);
    }
}

/// Joins `h`; the test fails if it has not finished by `deadline`.
pub fn join_by<R>(what: &str, h: JoinHandle<R>, deadline: Instant) -> R {
    join_or_explain(what, h, deadline, String::new)
}

/// As [`join_by`], and on failure prints `explain()` (the state of the rings, say) first.
pub fn join_or_explain<R>(
    what: &str,
    h: JoinHandle<R>,
    deadline: Instant,
    explain: impl Fn() -> String,
) -> R {
    while !h.is_finished() {
        if Instant::now() >= deadline {
            eprintln!("{}", explain());
            panic!("{what} did not finish in time (hang?)");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    match h.join() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{what} failed; state:\n{}", explain());
            std::panic::resume_unwind(e)
        }
    }
}

/// Path of a workspace binary built in the same profile as the running test.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace, same profile)",
        p.display()
    );
    p
}

/// `NAME --run-dir DIR ARGS...` for the workspace binary `name`, not yet started.
pub fn tool(name: &str, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin(name));
    c.arg("--run-dir").arg(dir).args(args);
    c
}

/// A child process, killed (and reaped) if the test ends before it does.
pub struct Kid {
    child: Child,
    what: String,
}

impl Kid {
    /// Starts `cmd` with no input and its output piped; `what` names it in failures.
    pub fn spawn(mut cmd: impl BorrowMut<Command>, what: &str) -> Kid {
        let cmd = cmd
            .borrow_mut()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A binary just copied may be "busy" for a moment: a process forked elsewhere while the
        // copy was open for writing holds it until that process execs.
        let mut tries = 0;
        let child = loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                r => break r.unwrap_or_else(|e| panic!("start {what}: {e}")),
            }
        };
        Kid {
            child,
            what: what.to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the child.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: plain kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    /// Waits up to `timeout` for the child to exit and collects its output (read while it
    /// runs, so a chatty child never blocks on a full pipe). Fails the test, killing the
    /// child, if it is still running by then.
    pub fn finish(mut self, timeout: Duration) -> Output {
        fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                r.read_to_end(&mut v).expect("read the child's output");
                v
            })
        }
        fn collect(h: Option<JoinHandle<Vec<u8>>>) -> Vec<u8> {
            h.map(|h| h.join().expect("output reader"))
                .unwrap_or_default()
        }
        let stdout = self.child.stdout.take().map(drain);
        let stderr = self.child.stderr.take().map(drain);
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait().expect("try_wait") {
                Some(s) => break s,
                None if Instant::now() >= deadline => {
                    panic!("{} still running after {timeout:?}", self.what)
                }
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        Output {
            status,
            stdout: collect(stdout),
            stderr: collect(stderr),
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a compiler (or another build step), failing the test with its output if it fails
/// (or is missing).
pub fn compile(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (a C compiler is required): {e}"));
    assert!(
        out.status.success(),
        "compilation failed: {cmd:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `cmd` to completion, killing it (and failing the test) after `limit`.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    Kid::spawn(cmd, &what).finish(limit)
}

/// Requires `out`, of the program `what`, to show exit status `code` and `message` on
/// stderr.
pub fn assert_exit(out: &Output, what: &str, code: i32, message: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{what}: {err}");
    assert!(
        err.contains(message),
        "{what}: stderr {err:?} lacks {message:?}"
    );
}

/// The standard output of the program `what`, which must have succeeded (else the test
/// fails with both outputs).
pub fn stdout_of(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The final JSON report of a vale-pktgen that must have succeeded.
pub fn report(out: &Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{what} failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: final report is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Stops vale-pktgen `k` with SIGINT; its JSON report.
pub fn stop_pktgen(k: Kid, what: &str) -> serde_json::Value {
    k.signal(libc::SIGINT);
    report(&k.finish(T), what)
}

/// An integer field of a vale-pktgen report.
pub fn num(r: &serde_json::Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("report field {field} missing or not an integer: {r}"))
}

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "vale-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        // Whatever the umask: valed refuses a run directory that others may write.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a valed for `dir` that is expected to exit at once (refusing to start), bounded by
/// [`T`].
pub fn valed_refusing(dir: &Path, args: &[&str]) -> Output {
    run_bounded(&mut tool("valed", dir, args), T)
}

/// The file `name` in a directory of `PATH`, if any.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A valed of the test's own, killed when dropped.
pub struct Valed {
    pub dir: TempDir,
    child: Child,
}

impl Valed {
    pub fn start() -> Valed {
        Self::start_with(&[])
    }

    /// Starts valed with extra arguments and waits until its socket answers.
    pub fn start_with(args: &[&str]) -> Valed {
        let dir = TempDir::new("valed");
        let cmd = tool("valed", &dir.0, args);
        Valed::spawn_in(dir, cmd)
    }

    /// As [`Valed::start_with`], with a descriptor limit (soft and hard) of `nofile`.
    pub fn start_with_nofile(args: &[&str], nofile: u64) -> Valed {
        use std::os::unix::process::CommandExt;
        let dir = TempDir::new("valed");
        let mut cmd = tool("valed", &dir.0, args);
        // SAFETY: one async-signal-safe syscall between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        Valed::spawn_in(dir, cmd)
    }

    /// Starts `cmd`, a valed serving `dir`, logging to `dir/valed.log`.
    fn spawn_in(dir: TempDir, cmd: Command) -> Valed {
        let child = Valed::spawn_logged(&dir.0, cmd, false);
        let v = Valed { dir, child };
        v.wait_ready();
        v
    }

    /// Starts `cmd` with its output in `dir/valed.log`, a new log or (`append`) the old one.
    fn spawn_logged(dir: &Path, mut cmd: Command, append: bool) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(dir.join("valed.log"))
            .expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start valed")
    }

    fn wait_ready(&self) {
        let sock = self.dir.0.join(SOCKET_NAME);
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&sock).is_err() {
            assert!(
                Instant::now() < deadline,
                "valed did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills valed with SIGKILL (nothing of its own is cleaned up) and starts a new one, with
    /// no extra arguments, serving the same run directory; its log goes on in the same file.
    pub fn restart_after_kill(&mut self) {
        self.restart_after_kill_with(&[]);
    }

    /// As [`Valed::restart_after_kill`], the new valed started with `args`.
    pub fn restart_after_kill_with(&mut self, args: &[&str]) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
        self.child = Valed::spawn_logged(&self.dir.0, tool("valed", &self.dir.0, args), true);
        self.wait_ready();
    }

    /// Stops valed with SIGTERM (it removes its socket and exits, as systemd stops it) and
    /// starts a new one with `args` serving the same run directory; its log goes on in the
    /// same file.
    pub fn restart_with(&mut self, args: &[&str]) {
        let cmd = tool("valed", &self.dir.0, args);
        self.restart_cmd(cmd);
    }

    fn restart_cmd(&mut self, cmd: Command) {
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
        self.child = Valed::spawn_logged(&self.dir.0, cmd, true);
        self.wait_ready();
    }

    pub fn run_dir(&self) -> &Path {
        &self.dir.0
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to valed.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: plain kill(2) of our own child.
        let r = unsafe { libc::kill(self.pid() as libc::pid_t, sig) };
        assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Whether valed is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("valed.log")).unwrap_or_default()
    }

    /// Options to open a port of this valed from the test process (never autostarts).
    pub fn options(&self) -> vale::OpenOptions {
        let mut o = vale::OpenOptions::new();
        o.run_dir(&self.dir.0).autostart(false);
        o
    }

    pub fn open(&self, name: &str) -> vale::Port {
        self.options()
            .open(name)
            .unwrap_or_else(|e| panic!("open {name}: {e}"))
    }

    /// Opens vale0:a and vale0:b, in that order.
    pub fn open_ab(&self) -> (vale::Port, vale::Port) {
        (self.open("vale0:a"), self.open("vale0:b"))
    }

    /// Opens vale0:a, vale0:b and vale0:c, in that order.
    pub fn open_abc(&self) -> (vale::Port, vale::Port, vale::Port) {
        (
            self.open("vale0:a"),
            self.open("vale0:b"),
            self.open("vale0:c"),
        )
    }

    /// vale0:a and vale0:b (with a deep rx ring, so that it keeps up with a stream without a
    /// drop), each learnt by the switch: a broadcast from a, then a unicast from b to a.
    pub fn open_learnt_pair(&self) -> (std::sync::Arc<vale::Port>, std::sync::Arc<vale::Port>) {
        let a = std::sync::Arc::new(self.open("vale0:a"));
        let b = std::sync::Arc::new(self.options().slots(4096).open("vale0:b").expect("open b"));
        send_and_expect(
            &a,
            &b,
            &test_frame(60, MAC_A, BROADCAST, u64::MAX),
            "a's hello",
        );
        send_and_expect(&b, &a, &test_frame(60, MAC_B, MAC_A, u64::MAX), "b's hello");
        (a, b)
    }

    /// `NAME --run-dir DIR ARGS...` run as user `uid` (group `uid` too, no others) with a
    /// descriptor limit of `nofile`. The binary is copied into the run directory first, so that
    /// the user can run it wherever the workspace lies. Needs root; the run directory must let
    /// the user in (it does: 0755) and the socket must (start valed with `--socket-mode 666`).
    pub fn tool_as(&self, uid: u32, nofile: u64, name: &str, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let dir = self.dir.0.join("bin");
        let copy = dir.join(name);
        if !copy.exists() {
            std::fs::create_dir_all(&dir).expect("bin dir");
            // A hard link where it can be (nothing is written, so nothing can be busy), a copy
            // across file systems.
            if std::fs::hard_link(bin(name), &copy).is_err() {
                std::fs::copy(bin(name), &copy).expect("copy binary");
            }
        }
        let mut c = Command::new(copy);
        if name != "control-flood" {
            c.arg("--run-dir").arg(&self.dir.0);
        }
        c.args(args);
        // SAFETY: only async-signal-safe syscalls between fork and exec. The limit is raised
        // while still root, then the ids dropped.
        unsafe {
            c.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                let ok = libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0
                    && libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setgid(uid) == 0
                    && libc::setuid(uid) == 0;
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        c
    }

    /// `vale-ctl --run-dir DIR ARGS...`
    pub fn ctl(&self, args: &[&str]) -> Output {
        tool("vale-ctl", &self.dir.0, args)
            .output()
            .expect("run vale-ctl")
    }

    /// Runs vale-ctl, requires success, and returns what it printed.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "vale-ctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs vale-ctl and expects exit status `code` with `message` on stderr and nothing on
    /// stdout.
    pub fn ctl_fails(&self, args: &[&str], code: i32, message: &str) {
        let out = self.ctl(args);
        let what = format!("vale-ctl {args:?}");
        assert_exit(&out, &what, code, message);
        assert!(
            out.stdout.is_empty(),
            "{what} printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// `vale-pktgen --run-dir DIR ARGS...`, not yet started.
    pub fn pktgen(&self, args: &[&str]) -> Command {
        let mut c = tool("vale-pktgen", &self.dir.0, args);
        c.env("VALE_NO_AUTOSTART", "1");
        c
    }

    /// Starts `cmd`, a client of this valed, and waits up to [`T`] until it owns `port`.
    pub fn spawn_client(&self, cmd: Command, what: &str, port: &str) -> Kid {
        let kid = Kid::spawn(cmd, what);
        let pid = kid.pid();
        assert!(
            wait_until(T, || self.port(port).and_then(|p| p.owner_pid) == Some(pid)),
            "{what} (pid {pid}) never showed up as owner of {port}: {:?}\n{}",
            self.port(port),
            self.log()
        );
        kid
    }

    /// Every switch, through `vale-ctl list --json`.
    pub fn list(&self) -> Vec<SwitchInfo> {
        serde_json::from_str::<Vec<SwitchInfo>>(&self.ctl_ok(&["list", "--json"]))
            .expect("list --json parses")
    }

    /// One port's entry, if it exists.
    pub fn port(&self, name: &str) -> Option<PortInfo> {
        self.list()
            .into_iter()
            .flat_map(|s| s.ports)
            .find(|p| p.name == name)
    }

    /// The counters of a port that must be listed.
    pub fn counters(&self, name: &str) -> PortCounters {
        self.port(name)
            .unwrap_or_else(|| panic!("port {name} is not listed"))
            .counters
    }

    /// Open descriptors of valed.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("proc fd")
            .count()
    }

    /// valed's resident set size, KiB.
    pub fn rss_kib(&self) -> u64 {
        proc_status_field(self.pid(), "VmRSS:")
    }

    /// valed's CPU time (user + system), in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("proc stat");
        // Fields after the ")" of the command name: utime is the 12th, stime the 13th.
        let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }
}

pub fn proc_status_field(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Drop for Valed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Clock ticks per second, for [`Valed::cpu_ticks`].
pub fn ticks_per_second() -> u64 {
    // SAFETY: plain sysconf call.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as u64 }
}

/// An Ethernet frame of `len` bytes from `src` to `dst` whose payload encodes `seq`, so a
/// receiver can check every byte.
pub fn test_frame(len: usize, src: [u8; 6], dst: [u8; 6], seq: u64) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..22].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in f[22..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    f
}

/// Writes `chunks`, one a slot, into the slots of `ring` (a tx ring) from its `cur` on, each
/// but the last marked NS_MOREFRAG (the last too unless `last_ends`), without publishing
/// them. Returns the slot after the last written.
pub fn write_chain<'a>(
    ring: &mut vale::Ring,
    chunks: impl ExactSizeIterator<Item = &'a [u8]>,
    last_ends: bool,
) -> u32 {
    let n = chunks.len();
    let mut cur = ring.cur();
    for (i, c) in chunks.enumerate() {
        let (slot, buf) = ring.slot_and_buf(cur);
        buf[..c.len()].copy_from_slice(c);
        slot.len = c.len() as u16;
        slot.flags = if i + 1 == n && last_ends {
            0
        } else {
            vale::NS_MOREFRAG
        };
        cur = ring.next(cur);
    }
    cur
}

/// [`write_chain`], then publishes the slots (moves `head` and `cur` past them).
pub fn queue_chain<'a>(
    ring: &mut vale::Ring,
    chunks: impl ExactSizeIterator<Item = &'a [u8]>,
    last_ends: bool,
) {
    let cur = write_chain(ring, chunks, last_ends);
    ring.set_cur(cur);
    ring.set_head(cur);
}

/// Queues `frame` on tx ring `r` (chained over slots if needed). False if the ring lacks
/// room.
pub fn send_frame_on(port: &vale::Port, r: u32, frame: &[u8]) -> bool {
    let mut ring = port.tx_ring(r);
    let chunks = frame.chunks(ring.buf_size() as usize);
    if ring.space() < chunks.len() as u32 {
        return false;
    }
    queue_chain(&mut ring, chunks, true);
    true
}

/// Queues `frame` on tx ring 0 (chained over slots if needed). False if the ring lacks room.
pub fn send_frame(port: &vale::Port, frame: &[u8]) -> bool {
    send_frame_on(port, 0, frame)
}

/// Queues `frame` on tx ring 0, waiting (until `deadline`) for room.
fn send_before(port: &vale::Port, frame: &[u8], deadline: Instant) {
    while !send_frame(port, frame) {
        assert!(Instant::now() < deadline, "tx ring stayed full");
        port.poll(WRITABLE, Some(Duration::from_millis(50)))
            .expect("poll");
    }
}

/// Queues `frame` on tx ring 0, waiting (up to [`T`]) for room.
pub fn send_waiting(port: &vale::Port, frame: &[u8]) {
    send_before(port, frame, Instant::now() + T);
}

/// Waits (until `deadline`) until valed has taken every slot queued on tx ring `r`.
fn tx_drained_before(port: &vale::Port, r: u32, deadline: Instant) {
    let ring = port.tx_ring(r);
    loop {
        port.txsync(r).expect("txsync");
        if ring.space() == ring.num_slots() - 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "valed did not take the slots of tx ring {r} of {}",
            port.name()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Waits (up to [`T`]) until valed has taken every slot queued on tx ring `r` (so every
/// frame in it has been delivered or dropped).
pub fn wait_tx_drained(port: &vale::Port, r: u32) {
    tx_drained_before(port, r, Instant::now() + T);
}

/// Sends each frame from tx ring 0 (flow-controlled on the sender's ring) and waits until
/// valed took them all, within [`T`] in all.
pub fn send_all(port: &vale::Port, frames: &[Vec<u8>]) {
    let deadline = Instant::now() + T;
    for f in frames {
        send_before(port, f, deadline);
    }
    port.txsync(0).expect("txsync");
    tx_drained_before(port, 0, deadline);
}

/// Takes every complete frame waiting on rx ring `r`, reassembling chains.
pub fn recv_ring(port: &vale::Port, r: u32) -> Vec<Vec<u8>> {
    port.rxsync(r).expect("rxsync");
    let mut ring = port.rx_ring(r);
    let mut out = Vec::new();
    let mut cur = ring.cur();
    let mut release = cur;
    let mut frame = Vec::new();
    while cur != ring.tail() {
        let slot = ring.slot(cur);
        frame.extend_from_slice(&ring.buf(slot.buf_idx)[..slot.len as usize]);
        cur = ring.next(cur);
        if slot.flags & vale::NS_MOREFRAG == 0 {
            out.push(std::mem::take(&mut frame));
            release = cur;
        }
    }
    ring.set_cur(release);
    ring.set_head(release);
    port.rxsync(r).expect("rxsync");
    out
}

/// Takes every complete frame waiting on rx ring 0, reassembling chains.
pub fn recv_frames(port: &vale::Port) -> Vec<Vec<u8>> {
    recv_ring(port, 0)
}

/// Waits up to `timeout` for frames on rx ring 0.
pub fn wait_frames(port: &vale::Port, timeout: Duration) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = recv_frames(port);
        if !got.is_empty() || Instant::now() >= deadline {
            return got;
        }
        port.poll(
            READABLE,
            Some(deadline.saturating_duration_since(Instant::now())),
        )
        .expect("poll");
    }
}

/// Exactly `n` frames from rx ring 0 within [`T`].
pub fn recv_n(port: &vale::Port, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + T;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{}: got {} of {n} frames",
            port.name(),
            out.len()
        );
        out.extend(wait_frames(port, left));
    }
    assert_eq!(out.len(), n, "{}: more frames than expected", port.name());
    out
}

/// Sends `frame` from `tx` (whose ring must have room) and expects it, alone, at `rx`
/// within 5 s; `what` names the frame in a failure.
pub fn send_and_expect(tx: &vale::Port, rx: &vale::Port, frame: &[u8], what: &str) {
    assert!(send_frame(tx, frame), "{what}: no room on the tx ring");
    tx.txsync(0).unwrap();
    assert_eq!(
        wait_frames(rx, Duration::from_secs(5)),
        vec![frame.to_vec()],
        "{what}"
    );
}

/// Frames `0..n` of `60 + seq % 200` bytes from MAC_A to MAC_B, one at a time: each must
/// reach `rx`, alone, within 5 s.
pub fn one_at_a_time(tx: &vale::Port, rx: &vale::Port, n: u64) {
    for seq in 0..n {
        let f = test_frame(60 + (seq % 200) as usize, MAC_A, MAC_B, seq);
        send_and_expect(tx, rx, &f, &format!("frame {seq}"));
    }
}

pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
pub const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
pub const MAC_C: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
pub const BROADCAST: [u8; 6] = [0xff; 6];

// ---- finding a port's kick eventfd
//
// libvale keeps the kick eventfds private (a well-behaved client only kicks through txsync,
// which publishes the ring header's head). A client that wants valed to look at a CSB it
// wrote by hand has to find the descriptor: the eventfds valed waits on (its epoll sets, in
// /proc/<valed>/fdinfo) are the same files as some of ours, which eventfd-id identifies.

/// The eventfd-id of the eventfd whose fdinfo file is `fdinfo`.
pub fn eventfd_id(fdinfo: &str) -> Option<u64> {
    let s = std::fs::read_to_string(fdinfo).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("eventfd-id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// eventfd ids valed's workers wait on.
pub fn valed_watched_eventfds(pid: u32) -> HashSet<u64> {
    let mut ids = HashSet::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return ids;
    };
    for e in dir.flatten() {
        let is_epoll = std::fs::read_link(e.path())
            .map(|l| l.to_string_lossy().contains("eventpoll"))
            .unwrap_or(false);
        if !is_epoll {
            continue;
        }
        let fd = e.file_name().to_string_lossy().to_string();
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
        for l in info.lines() {
            let mut w = l.split_whitespace();
            if w.next() == Some("tfd:") {
                if let Some(tfd) = w.next() {
                    if let Some(id) = eventfd_id(&format!("/proc/{pid}/fdinfo/{tfd}")) {
                        ids.insert(id);
                    }
                }
            }
        }
    }
    ids
}

/// Our descriptors that are kick eventfds of valed `v` (the tx rings of our ports there).
pub fn our_kick_fds(v: &Valed) -> HashSet<RawFd> {
    let watched = valed_watched_eventfds(v.pid());
    let mut fds = HashSet::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
    {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        if let Some(id) = eventfd_id(&format!("/proc/self/fdinfo/{fd}")) {
            if watched.contains(&id) {
                fds.insert(fd);
            }
        }
    }
    fds
}

/// Opens `name` on `v` and finds the kick eventfd of its tx ring 0 (the port must have one
/// tx ring).
pub fn open_with_kick(v: &Valed, opts: &vale::OpenOptions, name: &str) -> (vale::Port, RawFd) {
    let before = our_kick_fds(v);
    let p = opts
        .open(name)
        .unwrap_or_else(|e| panic!("open {name}: {e}"));
    assert_eq!(p.params().tx_rings, 1);
    let mut found = HashSet::new();
    // valed's worker registers the ring shortly after the open reply.
    let ok = wait_until_every(Duration::from_secs(2), Duration::from_millis(5), || {
        found = our_kick_fds(v).difference(&before).copied().collect();
        found.len() == 1
    });
    assert!(
        ok,
        "cannot find the kick eventfd of {name} (candidates {found:?}); \
         needs /proc fdinfo with eventfd-id"
    );
    (p, found.into_iter().next().expect("one"))
}

/// Writes 1 into kick eventfd `fd`, as a client kicks valed.
pub fn kick(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we hold open.
    let n = unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
    assert_eq!(n, 8, "kick: {}", std::io::Error::last_os_error());
}

/// The JSON line of the round-trip benchmarks' ping ends (`udp-pingpong`, `vhost-paced --role
/// ping`): sample count, min, median, 99th percentile and max in microseconds, and the
/// requests `lost`. Sorts `rtts_us`, which must not be empty.
pub fn rtt_report(rtts_us: &mut [f64], lost: u64) -> String {
    rtts_us.sort_by(f64::total_cmp);
    let at = |q: f64| rtts_us[((rtts_us.len() - 1) as f64 * q).round() as usize];
    format!(
        "{{\"samples\": {}, \"min_us\": {:.3}, \"median_us\": {:.3}, \"p99_us\": {:.3}, \"max_us\": {:.3}, \"lost\": {lost}}}",
        rtts_us.len(),
        at(0.0),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

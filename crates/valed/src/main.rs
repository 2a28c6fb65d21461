//! valed: the vale daemon.

mod capture;
mod config;
mod control;
mod metrics;
mod notify;
mod peer;
mod persist;
mod rundir;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use vale_abi::control::default_run_dir;
use vale_switch::{Engine, EngineConfig, UserLimits};

/// The vale daemon: owns every switch and port and forwards between them.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "The vale daemon: owns every switch and port and forwards between them",
    long_about = "valed runs vale, a virtual local Ethernet in user space. It owns every switch \
and port, runs the forwarding workers and serves a control socket, <run dir>/valed.sock.\n\n\
Switches (valeX) and ports (valeX:Y) appear when a client opens them through libvale (for \
example vale-pktgen -i vale0:a) and go away when their last client leaves, unless vale-ctl \
created them persistent. One valed serves one run directory; run several with different \
run directories to keep them apart.\n\n\
A client finding no valed for its run directory starts one itself (see VALE_NO_AUTOSTART in \
libvale), so starting valed by hand is needed only to choose its options.\n\n\
Who may do what: the socket's mode decides who may connect. A port belongs to the uid that \
opened, created or attached it; only that uid or an administrator (root, valed's own user, or \
a member of --admin-group) may destroy, detach or tune it, or reopen it once free. Host devices, lookup \
modules and switch knobs need an administrator. Other users are held to the --max-* limits \
below; administrators always get through.",
    after_help = "ENVIRONMENT:\n  VALE_RUN_DIR   run directory when --run-dir is not given (default /run/vale)\n  \
VALE_LOG       log filter (tracing syntax, e.g. debug or vale_switch=debug); default info\n\n\
FILES:\n  <run dir>/valed.sock   control socket (mode from --socket-mode)\n  \
<run dir>/valed.lock   held while valed runs: one valed per run directory\n  \
The run directory must be one no other user can change names in: valed refuses one\n  \
that belongs to another user (root's is fine), or that its group or everyone may\n  \
write unless it is sticky (as /tmp is). A missing one is created with mode 0755.\n  \
valed.lock is never followed through a symbolic link.\n  \
--config FILE   TOML, applied at start, written by 'vale-ctl save': a [[switch]] table per\n  \
switch (name, batch, [switch.lookup] with module, args = [\"key=value\", ...] and the\n  \
module's saved state = [\"LINE\", ...], for flow its rules; an older file's rules = [...]\n  \
is read as state) and a [[switch.port]] table per port that survives a restart (name,\n  \
persistent, owner_uid, moderation_us, learn_limit, and attach = { kind = \"tap\", name = ...,\n  \
persist = \"yes\", netns = NS } or { kind = \"nic\", iface = ..., mode|bound = ... } or\n  \
{ kind = \"vhost-user\", path = ..., client = \"yes\", queues = N }). A TAP is adopted by\n  \
name (in namespace NS, under /run/netns, if given), a NIC bound again. An item that cannot\n  \
be applied (a missing interface, a module that fails to load, a bad value) is logged with\n  \
its name and why, and the rest applied. The file is refused, and valed exits, if it does not\n  \
parse (the line is named), is over 16 MiB or a symbolic link, or if anyone but root or\n  \
valed's user owns it or others may write it: it may name shared objects valed loads.\n  \
'vale-ctl save' writes no file over 16 MiB (it says so and the old file stays). At start\n  \
valed removes the .FILE.tmpPID files that a valed killed while saving left beside it.\n\n\
EXAMPLES:\n  valed --run-dir /tmp/v &\n  valed --workers 2 --busy-poll-us 50\n  \
valed --metrics 127.0.0.1:9781   Prometheus scrapes http://127.0.0.1:9781/metrics\n  \
valed --config /etc/vale/valed.toml   then 'vale-ctl save' keeps what runs for the next start\n\n\
SIGNALS:\n  SIGTERM, SIGINT   remove the control socket and each socket a port listens at\n                    \
(vhost-user, only while it is still valed's socket) and exit; clients see\n                    \
their ports' connection close"
)]
struct Args {
    /// Directory of the control socket and lock file [env: VALE_RUN_DIR] [default: /run/vale]
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Forwarding threads; source rings are dealt to them in turn as ports open, and a worker
    /// with two or more busy rings (1024 slots or more in 100 ms) hands one to a worker with none
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Keep a ring (or a vhost-user guest's queues) that ran dry polled this many
    /// microseconds before sleeping (0: sleep at once)
    #[arg(long, default_value_t = 0, value_name = "US")]
    busy_poll_us: u64,
    /// Without --busy-poll-us: keep a ring that ran dry polled up to this many microseconds
    /// when its last gap between frames was shorter than that (an exchange in progress), so
    /// neither its client's kick nor valed's wake-up is needed for the next frame; a ring whose
    /// last gap was longer sleeps at once, so idle ports cost nothing (0: always sleep at once)
    #[arg(long, default_value_t = vale_switch::DEFAULT_SPIN.as_micros() as u64, value_name = "US",
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    spin_us: u64,
    /// Batch size of new switches: frames gathered from a ring per pass (1-2048)
    #[arg(long, default_value_t = vale_switch::DEFAULT_BATCH,
          value_parser = clap::value_parser!(u32).range(1..=2048))]
    batch: u32,
    /// Permissions of the control socket, octal: who may connect at all
    #[arg(long, default_value = "660", value_name = "MODE")]
    socket_mode: String,
    /// Members of GROUP (a name or a gid) are administrators, as root is: they may attach host
    /// devices, change lookup modules and switch knobs, and act on any user's ports
    #[arg(long, value_name = "GROUP")]
    admin_group: Option<String>,
    /// Control connections one user (not an administrator) may hold at once
    #[arg(long, default_value_t = 64, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_conns_per_user: u32,
    /// Control connections of all users that are not administrators together
    #[arg(long, default_value_t = 1024, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_conns: u32,
    /// Ports (held, or persistent and free) one user (not an administrator) may have
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_ports_per_user: u32,
    /// Port memory one user (not an administrator) may hold, MiB: its held ports' regions and
    /// the buffers of the captures it started
    #[arg(long, default_value_t = 4096, value_name = "MIB")]
    max_port_memory_per_user: u64,
    /// Descriptors of valed that one user's (not an administrator's) ports may hold: 1 per
    /// port and 3 per ring
    #[arg(long, default_value_t = 4096, value_name = "N")]
    max_port_fds_per_user: u32,
    /// Serve every port's, lookup module's and worker's counters, and valed's own memory and
    /// descriptors, in the Prometheus text format at http://ADDR:PORT/metrics (off unless
    /// given; anyone who can reach ADDR may read them, so prefer a loopback address)
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// Configuration file: applied at start, before the control socket listens, and written
    /// by 'vale-ctl save'. TOML: switches with their batch, lookup module (arguments and saved
    /// state, such as flow rules) and ports (persistent ones, TAP/NIC/vhost-user attachments, knobs); see FILES.
    /// A missing file is an empty configuration; a file that does not parse, is larger than
    /// 16 MiB, or that others than root or valed's user may write is refused and valed exits
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Check the configuration file (--config) and exit: 0 if it parses and valed would read
    /// it, 1 with the reason otherwise. Nothing is applied
    #[arg(long, requires = "config")]
    check_config: bool,
}

fn main() {
    vale_man::write_if_asked("8", <Args as clap::CommandFactory>::command);
    if let Err(e) = run() {
        // The sockets ports listen at, each only while it is still valed's.
        vale_switch::host::remove_port_sockets();
        eprintln!("valed: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VALE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    end_on_panic();
    let mode = u32::from_str_radix(&args.socket_mode, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .with_context(|| {
            format!(
                "bad --socket-mode '{}': give octal permissions like 660",
                args.socket_mode
            )
        })?;
    let admin_gid = args
        .admin_group
        .as_deref()
        .map(|g| peer::group_id(g).with_context(|| format!("no such group '{g}' (--admin-group)")))
        .transpose()?;
    let config = match &args.config {
        Some(path) => {
            let cfg = config::load(path, admin_gid).map_err(anyhow::Error::msg)?;
            if cfg.is_none() {
                tracing::info!(path = %path.display(), "no configuration file yet: starting empty");
            }
            cfg
        }
        None => None,
    };
    if args.check_config {
        println!(
            "{}: {}",
            args.config.as_deref().expect("required").display(),
            if config.is_some() {
                "valid"
            } else {
                "absent (an empty configuration)"
            }
        );
        return Ok(());
    }
    if let Some(path) = &args.config {
        config::remove_stale_temporaries(path);
    }
    persist::set_file(args.config.clone());
    let nofile = raise_descriptor_limit();
    let run_dir = args.run_dir.clone().unwrap_or_else(default_run_dir);
    // One valed per run directory: the lock is held for the life of the process.
    let run = rundir::claim(&run_dir)?;

    let sock_path = run.socket_path();
    // Before any thread starts, so that every thread inherits the blocked mask.
    block_signals_and_clean_up_on_exit(sock_path.clone());
    // Workers before the socket: once it exists, clients are served at once.
    let engine = Engine::new(EngineConfig {
        workers: args.workers as usize,
        busy_poll: Duration::from_micros(args.busy_poll_us),
        spin: Duration::from_micros(args.spin_us),
        batch: args.batch,
        user_limits: UserLimits {
            ports: args.max_ports_per_user as usize,
            port_memory: args.max_port_memory_per_user << 20,
            descriptors: args.max_port_fds_per_user as usize,
        },
        // What is left once every connection allowed and valed's own needs are served.
        descriptor_budget: nofile.saturating_sub(args.max_conns as usize + DESCRIPTOR_RESERVE),
    })
    .context("cannot start workers")?;
    if let Some(addr) = args.metrics {
        metrics::start(addr, engine.clone())?;
    }

    // The configuration before the socket: a client that connects sees it applied.
    if let Some(cfg) = &config {
        let started = std::time::Instant::now();
        let problems = config::apply(&engine, cfg, persist::attachments());
        tracing::info!(
            path = %args.config.as_deref().expect("given").display(),
            switches = cfg.switches.len(),
            not_applied = problems.len(),
            ms = started.elapsed().as_millis() as u64,
            "configuration applied"
        );
    }
    let listener = run.bind_socket(mode)?;

    tracing::info!(run_dir = %run_dir.display(), workers = args.workers, batch = args.batch,
        busy_poll_us = args.busy_poll_us, spin_us = args.spin_us, pid = std::process::id(), "valed ready");
    // The socket listens: a service manager waiting for us (Type=notify) may go on.
    notify::ready();
    let policy = control::Policy {
        admin_gid,
        conns_per_user: args.max_conns_per_user as usize,
        conns_total: args.max_conns as usize,
    };
    control::serve(listener, engine, policy).context("control socket")?;
    drop(run);
    Ok(())
}

/// Descriptors valed keeps for itself (workers, host devices, administrators' connections)
/// out of what users' ports may take.
const DESCRIPTOR_RESERVE: usize = 256;

/// Descriptors are valed's scarcest resource (every ring of every port has three): take all
/// the hard limit allows. Returns the limit now in force.
fn raise_descriptor_limit() -> usize {
    // SAFETY: getrlimit/setrlimit with a live struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
        lim.rlim_cur.min(usize::MAX as u64) as usize
    }
}

/// Makes any panic, on any of valed's threads, end valed (abort) once it is logged. A panic is
/// a bug of valed's, and a thread that died of one would leave what it served stopped and
/// silent (a forwarding worker's rings, a request's connection waiting for ever); a valed
/// that ends is seen and started again (systemd's `Restart=`), and its clients and peers come
/// back within seconds (tests/crash.rs).
fn end_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        tracing::error!(thread, "valed panicked, and ends: {info}");
        default(info);
        std::process::abort();
    }));
}

/// SIGTERM and SIGINT are taken by a thread that removes the sockets valed made and exits:
/// those its ports listen at (only while each is still valed's socket, as at detach), then
/// the control socket (the run directory's lock, held until the exit, keeps any other valed
/// from binding there). The lock file stays: removing it would let two valeds lock different
/// files of the same name. No port is dropped on the way out: their clients see the
/// connection close as the process ends.
fn block_signals_and_clean_up_on_exit(sock_path: PathBuf) {
    // SAFETY: signal-mask manipulation with locally owned sets, before other threads exist,
    // so every thread inherits the mask and only the waiter below receives these signals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
            vale_switch::host::remove_port_sockets();
            let _ = std::fs::remove_file(&sock_path);
            notify::stopping();
            tracing::info!(signal = sig, "valed exiting");
            std::process::exit(0);
        });
    }
}

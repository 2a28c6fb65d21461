//! valed: the vale daemon.

mod control;
mod rundir;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use vale_abi::control::default_run_dir;
use vale_switch::{Engine, EngineConfig};

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
libvale), so starting valed by hand is needed only to choose its options.",
    after_help = "ENVIRONMENT:\n  VALE_RUN_DIR   run directory when --run-dir is not given (default /run/vale)\n  \
VALE_LOG       log filter (tracing syntax, e.g. debug or vale_switch=debug); default info\n\n\
FILES:\n  <run dir>/valed.sock   control socket (mode from --socket-mode)\n  \
<run dir>/valed.lock   held while valed runs: one valed per run directory\n\n\
EXAMPLES:\n  valed --run-dir /tmp/v &\n  valed --workers 2 --busy-poll-us 50\n\n\
SIGNALS:\n  SIGTERM, SIGINT   remove the socket and exit; clients see their ports' connection close"
)]
struct Args {
    /// Directory of the control socket and lock file [env: VALE_RUN_DIR] [default: /run/vale]
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Forwarding threads; source rings are shared among them round-robin
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Keep a ring that ran dry polled this many microseconds before sleeping (0: sleep at once)
    #[arg(long, default_value_t = 0, value_name = "US")]
    busy_poll_us: u64,
    /// Batch size of new switches: frames gathered from a ring per pass (1-2048)
    #[arg(long, default_value_t = vale_switch::switch::DEFAULT_BATCH,
          value_parser = clap::value_parser!(u32).range(1..=2048))]
    batch: u32,
    /// Permissions of the control socket, octal: who may connect, open ports and change them
    #[arg(long, default_value = "660", value_name = "MODE")]
    socket_mode: String,
}

fn main() {
    if let Err(e) = run() {
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
    let mode = u32::from_str_radix(&args.socket_mode, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .with_context(|| {
            format!(
                "bad --socket-mode '{}': give octal permissions like 660",
                args.socket_mode
            )
        })?;
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
        batch: args.batch,
    })
    .context("cannot start workers")?;

    let listener = run.bind_socket(mode)?;

    tracing::info!(run_dir = %run_dir.display(), workers = args.workers, batch = args.batch,
        busy_poll_us = args.busy_poll_us, pid = std::process::id(), "valed ready");
    control::serve(listener, engine);
    drop(run);
    Ok(())
}

/// SIGTERM and SIGINT are taken by a thread that removes the socket and exits.
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
            let _ = std::fs::remove_file(&sock_path);
            tracing::info!(signal = sig, "valed exiting");
            std::process::exit(0);
        });
    }
}

//! Reaching valed, starting it when the run directory has none.

use std::io;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vale_abi::control::SOCKET_NAME;
use vale_abi::rundir::RunDir;

/// Where a valed started by a client logs, in the run directory.
const LOG_NAME: &str = "valed.log";

/// How long a client waits for a valed it started to listen.
const START_WAIT: Duration = Duration::from_secs(5);

/// Connects to valed of `run_dir`; if none answers and `autostart` holds, starts one.
pub fn connect(run_dir: &Path, autostart: bool) -> io::Result<UnixStream> {
    let sock = run_dir.join(SOCKET_NAME);
    match UnixStream::connect(&sock) {
        Ok(s) => return Ok(s),
        Err(e)
            if !autostart
                || !matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
        {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot reach valed at {}: {e}", sock.display()),
            ))
        }
        Err(_) => {}
    }
    start_valed(run_dir)?;
    let deadline = Instant::now() + START_WAIT;
    loop {
        match UnixStream::connect(&sock) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "started valed but it did not answer at {} (see {}): {e}",
                        sock.display(),
                        run_dir.join(LOG_NAME).display()
                    ),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `VALE_VALED`, else `valed` beside the running program, else `valed` on the PATH.
fn valed_program() -> PathBuf {
    if let Some(p) = std::env::var_os("VALE_VALED").filter(|v| !v.is_empty()) {
        return p.into();
    }
    if let Some(beside) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("valed")))
        .filter(|p| p.is_file())
    {
        return beside;
    }
    PathBuf::from("valed")
}

/// Starts a detached valed (its own session, logging to `<run dir>/valed.log`). Two clients
/// racing here are harmless: valed's lock lets one run, the other exits. A run directory that
/// others could change is refused, as valed refuses it, and the log is opened without
/// following a planted link.
fn start_valed(run_dir: &Path) -> io::Result<()> {
    let dir = RunDir::open(run_dir)?;
    let log = dir.open_file(LOG_NAME, libc::O_WRONLY | libc::O_APPEND, 0o644)?;
    let prog = valed_program();
    let mut cmd = Command::new(&prog);
    cmd.arg("--run-dir")
        .arg(run_dir)
        // A netmap program run under the preload library must not pass it on to valed.
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches valed from our session and terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start {}: {e}", prog.display())))?;
    // valed outlives us; reap it in the background so it never lingers as a zombie of ours.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(())
}

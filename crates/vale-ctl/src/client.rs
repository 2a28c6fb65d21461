//! The conversation with valed: connecting, one request and its reply, a lookup module's
//! commands (the flow module's, whose answers are flow tables, dumped page by page), and how a
//! failure becomes an exit status.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use anyhow::{anyhow, Context};
use vale_abi::control::{self, default_run_dir, FlowTable, Reply, Request, SOCKET_NAME};

use crate::cli::Cli;

/// Why vale-ctl failed.
pub(crate) enum Failure {
    /// No valed answers at the socket.
    NoDaemon(PathBuf, io::Error),
    /// A refusal, from valed or from the client-side checks of its answer.
    Refused(String),
    /// Anything else: the conversation with valed broke.
    Other(anyhow::Error),
    /// A usage error clap could not see.
    Usage(String),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

/// Connects to the valed of the run directory `--run-dir` (or the environment) names.
pub(crate) fn connect(cli: &Cli) -> Result<UnixStream, Failure> {
    let run_dir = cli.run_dir.clone().unwrap_or_else(default_run_dir);
    UnixStream::connect(run_dir.join(SOCKET_NAME)).map_err(|e| Failure::NoDaemon(run_dir, e))
}

/// Sends one request and returns valed's reply; `Reply::Error` becomes a refusal.
pub(crate) fn ask(sock: &UnixStream, req: &Request) -> Result<Reply, Failure> {
    match control::exchange(sock, req).context("cannot exchange a request with valed")? {
        Some((Reply::Error { message, .. }, _)) => Err(Failure::Refused(message)),
        Some((reply, _fds)) => Ok(reply),
        None => Err(anyhow!("valed closed the connection without replying").into()),
    }
}

/// Sends command `op` with `body` to the lookup module of `switch` (one `LookupControl`
/// request); the module's name and its answer.
pub(crate) fn module_command(
    sock: &UnixStream,
    switch: &str,
    op: &str,
    body: String,
) -> Result<(String, String), Failure> {
    let req = Request::LookupControl {
        switch: switch.to_string(),
        command: op.to_string(),
        body,
    };
    match ask(sock, &req)? {
        Reply::LookupControl { module, output } => Ok((module, output)),
        other => Err(unexpected(&other)),
    }
}

/// The flow module's command `op`: its answer, a flow table. A switch whose module has no
/// such command is told how to choose the flow module.
pub(crate) fn flow_command(
    sock: &UnixStream,
    switch: &str,
    op: &str,
    body: String,
) -> Result<FlowTable, Failure> {
    let (module, output) = match module_command(sock, switch, op, body) {
        Err(Failure::Refused(m)) if m.contains(&format!("has no command '{op}'")) => {
            return Err(Failure::Refused(format!(
                "{m}; the flow commands need the flow module: choose it with 'vale-ctl \
                 lookup {switch} flow'"
            )))
        }
        r => r?,
    };
    serde_json::from_str(&output).map_err(|e| {
        anyhow!("the answer of lookup module '{module}' to '{op}' is not a flow table: {e}").into()
    })
}

/// Asks for a flow table page by page (the flow module answers at most `FLOW_DUMP_PAGE`
/// rules a `dump`) and returns it whole.
pub(crate) fn dump_flows(sock: &UnixStream, switch: &str) -> Result<FlowTable, Failure> {
    let mut all = flow_command(sock, switch, "dump", String::new())?;
    while let Some(after) = all.next {
        let page = flow_command(sock, switch, "dump", format!("after={after}"))?;
        all.rules.extend(page.rules);
        all.next = page.next;
    }
    Ok(all)
}

pub(crate) fn unexpected(reply: &Reply) -> Failure {
    anyhow!("unexpected reply from valed: {reply:?}").into()
}

/// Finishes a command whose success is `Reply::Ok`: quiet, or `{"ok":true}` with `--json`.
pub(crate) fn done(cli: &Cli, reply: Reply) -> Result<(), Failure> {
    match reply {
        Reply::Ok if cli.json => output("{\"ok\":true}\n"),
        Reply::Ok => Ok(()),
        other => Err(unexpected(&other)),
    }
}

/// Writes to stdout; a reader that went away (`vale-ctl list | head`) is not an error.
pub(crate) fn output(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(anyhow!("cannot write output: {e}").into())
        }
        _ => Ok(()),
    }
}

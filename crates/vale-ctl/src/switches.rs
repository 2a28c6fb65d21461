//! Switches and ports as a whole: `list`, `create`, `destroy`, `save` and `set` (knobs).

use std::os::unix::net::UnixStream;

use anyhow::Context;
use vale_abi::control::{Reply, Request, SwitchInfo};

use crate::cli::Cli;
use crate::client::{ask, done, output, unexpected, Failure};
use crate::render::{render, select};

/// `vale-ctl list [NAME]`: every switch, one switch or one port, as a table or JSON.
pub(crate) fn list(cli: &Cli, sock: &UnixStream, name: Option<&str>) -> Result<(), Failure> {
    let switches = match ask(sock, &Request::List)? {
        Reply::List { switches } => switches,
        other => return Err(unexpected(&other)),
    };
    let views = select(switches, name)?;
    if cli.json {
        let list: Vec<&SwitchInfo> = views.iter().map(|v| &v.info).collect();
        let text = serde_json::to_string_pretty(&list).context("cannot format JSON")?;
        output(&format!("{text}\n"))
    } else {
        output(&render(&views))
    }
}

/// `vale-ctl create PORT`.
pub(crate) fn create(cli: &Cli, sock: &UnixStream, port: &str) -> Result<(), Failure> {
    let req = Request::Create {
        port: port.to_string(),
    };
    done(cli, ask(sock, &req)?)
}

/// `vale-ctl destroy NAME`: a port or a whole switch.
pub(crate) fn destroy(cli: &Cli, sock: &UnixStream, name: &str) -> Result<(), Failure> {
    let req = Request::Destroy {
        name: name.to_string(),
    };
    done(cli, ask(sock, &req)?)
}

/// `vale-ctl save`: the running configuration to valed's configuration file.
pub(crate) fn save(cli: &Cli, sock: &UnixStream) -> Result<(), Failure> {
    match ask(sock, &Request::Save)? {
        Reply::Saved {
            path,
            switches,
            ports,
        } => {
            if cli.json {
                let v = serde_json::json!({"path": path, "switches": switches, "ports": ports});
                output(&format!("{v}\n"))
            } else {
                output(&format!(
                    "saved {switches} switches, {ports} ports to {path}\n"
                ))
            }
        }
        other => Err(unexpected(&other)),
    }
}

/// `vale-ctl set TARGET KNOB VALUE`: a knob of a switch or a port.
pub(crate) fn set(
    cli: &Cli,
    sock: &UnixStream,
    target: &str,
    knob: &str,
    value: &str,
) -> Result<(), Failure> {
    let req = Request::Set {
        target: target.to_string(),
        knob: knob.to_string(),
        value: value.to_string(),
    };
    done(cli, ask(sock, &req)?)
}

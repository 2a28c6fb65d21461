//! vale-ctl: the vale control tool.
//!
//! Speaks valed's control protocol ([`vale_abi::control`]) over `<run dir>/valed.sock`: one
//! request, one reply, per invocation. It never starts valed.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use vale_abi::control::{
    self, default_run_dir, FlowTable, LookupInfo, ModuleArg, PortInfo, Reply, Request, SwitchInfo,
    SOCKET_NAME,
};
use vale_abi::name::{parse_port, parse_switch};

mod capture;
mod cli;
mod client;
mod render;
mod top;

use cli::*;
use client::*;
use render::*;

/// Exit status when valed refused a request or the conversation failed.
const EXIT_FAILED: u8 = 1;
/// Exit status of a usage error.
const EXIT_USAGE: u8 = 2;
/// Exit status when no valed answers for the run directory.
const EXIT_NO_DAEMON: u8 = 3;

fn main() -> ExitCode {
    vale_man::write_if_asked("1", <Cli as clap::CommandFactory>::command);
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NoDaemon(dir, e)) => {
            eprintln!("vale-ctl: no valed running for {} ({e})", dir.display());
            ExitCode::from(EXIT_NO_DAEMON)
        }
        Err(Failure::Refused(message)) => {
            eprintln!("vale-ctl: {message}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(Failure::Other(e)) => {
            eprintln!("vale-ctl: {e:#}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(Failure::Usage(message)) => {
            eprintln!("vale-ctl: {message}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    let run_dir = cli.run_dir.clone().unwrap_or_else(default_run_dir);
    // Usage errors clap cannot see come before any word with valed.
    let lookup_req = match &cli.command {
        Command::Lookup {
            switch,
            module,
            args,
            access,
            trunk,
            default,
            rules,
        } => {
            if rules.is_some() && module.as_deref() != Some("flow") {
                return Err(Failure::Usage(
                    "--rules configures the flow module only".into(),
                ));
            }
            let mut req = lookup_request(
                switch,
                module.as_deref(),
                args,
                access,
                trunk,
                default.as_deref(),
            )?;
            if let (Some(path), Request::SetLookup { args, .. }) = (rules, &mut req) {
                args.push(ModuleArg {
                    key: "rules".into(),
                    value: read_rules(path)?,
                });
            }
            Some(req)
        }
        _ => None,
    };
    // The body of a flow or module command, read before any word with valed too.
    let body = match &cli.command {
        Command::Flow {
            op: FlowOp::Add { rule, rules },
            ..
        } => {
            let mut text = rule.join("\n");
            if let Some(path) = rules {
                if !text.is_empty() {
                    text.push('\n');
                }
                text += &read_rules(path)?;
            }
            text
        }
        Command::Flow {
            op: FlowOp::Del { selector },
            ..
        } => selector.clone(),
        Command::Module { body: Some(b), .. } if b == "-" => read_stdin()?,
        Command::Module { body: Some(b), .. } => b.clone(),
        _ => String::new(),
    };
    let sock = connect(&run_dir)?;
    match &cli.command {
        Command::Capture {
            port,
            file,
            dir,
            count,
            duration,
            snaplen,
            buffer,
            format,
            quiet,
            expression,
        } => capture::run(
            &sock,
            &capture::CaptureArgs {
                port,
                file: file.as_ref(),
                dir: *dir,
                count: *count,
                duration: *duration,
                snaplen: *snaplen,
                buffer_mib: *buffer,
                format: *format,
                quiet: *quiet,
                filter: (!expression.is_empty())
                    .then(|| expression.join(" "))
                    .as_deref(),
            },
        ),
        Command::Top {
            name,
            interval,
            once,
            count,
        } => top::run(
            &sock,
            &top::TopArgs {
                name: name.as_deref(),
                interval: *interval,
                count: if *once { Some(1) } else { *count },
                json: cli.json,
            },
        ),
        Command::List { name } => {
            let switches = match ask(&sock, &Request::List)? {
                Reply::List { switches } => switches,
                other => return Err(unexpected(&other)),
            };
            let views = select(switches, name.as_deref())?;
            if cli.json {
                let list: Vec<&SwitchInfo> = views.iter().map(|v| &v.info).collect();
                let text = serde_json::to_string_pretty(&list).context("cannot format JSON")?;
                output(&format!("{text}\n"))
            } else {
                output(&render(&views))
            }
        }
        Command::Create { port } => done(cli, ask(&sock, &Request::Create { port: port.clone() })?),
        Command::Attach {
            port,
            tap,
            persist,
            iface,
            mode,
            vhost_user,
            client,
            queues,
            kind,
            kind_args,
        } => {
            let mut args = BTreeMap::new();
            let kind = match (tap, iface) {
                _ if kind.is_some() => {
                    args.extend(kind_args.iter().cloned());
                    kind.as_deref().expect("checked")
                }
                _ if vhost_user.is_some() => {
                    // valed resolves no path against our directory: send it absolute.
                    let path = vhost_user.as_deref().expect("checked");
                    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
                    args.insert("path".to_string(), path.to_string_lossy().into_owned());
                    if *client {
                        args.insert("client".to_string(), "yes".to_string());
                    }
                    if let Some(q) = queues {
                        args.insert("queues".to_string(), q.to_string());
                    }
                    "vhost-user"
                }
                (Some(name), _) => {
                    args.insert("name".to_string(), name.clone());
                    if *persist {
                        args.insert("persist".to_string(), "yes".to_string());
                    }
                    "tap"
                }
                (None, Some(iface)) => {
                    args.insert("iface".to_string(), iface.clone());
                    if let Some(m) = mode {
                        args.insert("mode".to_string(), m.clone());
                    }
                    "nic"
                }
                (None, None) => unreachable!("clap requires --tap, --iface or --vhost-user"),
            };
            let req = Request::Attach {
                port: port.clone(),
                kind: kind.to_string(),
                args,
            };
            done(cli, ask(&sock, &req)?)
        }
        Command::Detach { port } => done(cli, ask(&sock, &Request::Detach { port: port.clone() })?),
        Command::Destroy { name } => {
            done(cli, ask(&sock, &Request::Destroy { name: name.clone() })?)
        }
        Command::Lookup { rules, .. } => {
            let req = lookup_req.expect("made above");
            match ask(&sock, &req).map_err(|e| in_file(e, rules.as_ref()))? {
                Reply::Lookup { lookup } if cli.json => {
                    let text =
                        serde_json::to_string_pretty(&lookup).context("cannot format JSON")?;
                    output(&format!("{text}\n"))
                }
                Reply::Lookup { lookup } => output(&render_lookup(&lookup)),
                other => Err(unexpected(&other)),
            }
        }
        Command::Flow { switch, op } => {
            // A bad rule's line is the file's line when the rules came from a file alone.
            let file = match op {
                FlowOp::Add {
                    rule,
                    rules: Some(p),
                } if rule.is_empty() => Some(p),
                _ => None,
            };
            let flows = match op {
                FlowOp::Add { .. } => flow_command(&sock, switch, "add", body),
                FlowOp::Del { .. } => flow_command(&sock, switch, "del", body),
                FlowOp::Dump => dump_flows(&sock, switch),
            }
            .map_err(|e| in_file(e, file))?;
            if cli.json {
                let text = serde_json::to_string_pretty(&flows).context("cannot format JSON")?;
                output(&format!("{text}\n"))
            } else {
                output(&render_flows(&flows, op))
            }
        }
        Command::Module { switch, op, .. } => {
            let (module, text) = module_command(&sock, switch, op, body)?;
            if cli.json {
                let v = serde_json::json!({"module": module, "output": text});
                output(&format!("{v}\n"))
            } else if text.is_empty() || text.ends_with('\n') {
                output(&text)
            } else {
                output(&format!("{text}\n"))
            }
        }
        Command::Save => match ask(&sock, &Request::Save)? {
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
        },
        Command::Set {
            target,
            knob,
            value,
        } => {
            let req = Request::Set {
                target: target.clone(),
                knob: knob.clone(),
                value: value.clone(),
            };
            done(cli, ask(&sock, &req)?)
        }
    }
}

/// The text of rules file `path`: vale-ctl reads it (valed opens no path a client names).
/// The body of `vale-ctl module ... -`: standard input, at most what valed takes in a
/// request.
fn read_stdin() -> Result<String, Failure> {
    let limit = control::MAX_ADMIN_REQUEST as u64;
    let mut text = String::new();
    io::stdin()
        .lock()
        .take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| Failure::Refused(format!("cannot read the body from standard input: {e}")))?;
    if text.len() as u64 > limit {
        return Err(Failure::Refused(format!(
            "the body on standard input is more than the {limit} bytes valed takes"
        )));
    }
    Ok(text)
}

fn read_rules(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path)
        .map_err(|e| Failure::Refused(format!("cannot read rules file {}: {e}", path.display())))
}

/// A refusal naming a rule's line, said to be a line of `file`.
fn in_file(e: Failure, file: Option<&PathBuf>) -> Failure {
    match (e, file) {
        (Failure::Refused(m), Some(f)) if m.starts_with("bad rule at line") => {
            Failure::Refused(format!("{}: {m}", f.display()))
        }
        (e, _) => e,
    }
}

/// The request of `vale-ctl lookup`: show (no module) or set.
fn lookup_request(
    switch: &str,
    module: Option<&str>,
    args: &[(String, String)],
    access: &[String],
    trunk: &[String],
    default: Option<&str>,
) -> Result<Request, Failure> {
    Ok(match module {
        None => Request::Lookup {
            switch: switch.to_string(),
        },
        Some(module) => {
            let vlan_flags = !access.is_empty() || !trunk.is_empty() || default.is_some();
            if vlan_flags && module != "vlan" {
                return Err(Failure::Usage(
                    "--access, --trunk and --default configure the vlan module only".into(),
                ));
            }
            let mut all = vlan_args(switch, access, trunk, default).map_err(Failure::Usage)?;
            all.extend(args.iter().map(|(key, value)| ModuleArg {
                key: key.clone(),
                value: value.clone(),
            }));
            // valed resolves no path against our directory: send it absolute.
            let module = if module.contains('/') {
                let p = Path::new(module);
                std::path::absolute(p)
                    .unwrap_or_else(|_| p.to_path_buf())
                    .to_string_lossy()
                    .into_owned()
            } else {
                module.to_string()
            };
            Request::SetLookup {
                switch: switch.to_string(),
                module,
                args: all,
            }
        }
    })
}

//! A switch's lookup module: `lookup` (show it, or choose one with its arguments), `module`
//! (one of the module's own commands, its answer as it is) and `flow` (the flow module's
//! commands, their answers as tables). Each makes its request, reading any rules file or
//! body, before it connects: a usage error or an unreadable file never reaches valed.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use vale_abi::control::{ModuleArg, Reply, Request, MAX_ADMIN_REQUEST};

use crate::cli::{vlan_args, Cli, FlowOp, LookupCmd};
use crate::client::{
    ask, connect, dump_flows, flow_command, module_command, output, unexpected, Failure,
};
use crate::render::{render_flows, render_lookup};

/// `vale-ctl lookup SWITCH [MODULE [--arg K=V]... [--access/--trunk/--default] [--rules FILE]]`.
pub(crate) fn lookup(cli: &Cli, c: &LookupCmd) -> Result<(), Failure> {
    if c.rules.is_some() && c.module.as_deref() != Some("flow") {
        return Err(Failure::Usage(
            "--rules configures the flow module only".into(),
        ));
    }
    let mut req = lookup_request(c)?;
    if let (Some(path), Request::SetLookup { args, .. }) = (&c.rules, &mut req) {
        args.push(ModuleArg {
            key: "rules".into(),
            value: read_rules(path)?,
        });
    }
    let sock = connect(cli)?;
    match ask(&sock, &req).map_err(|e| in_file(e, c.rules.as_ref()))? {
        Reply::Lookup { lookup } if cli.json => {
            let text = serde_json::to_string_pretty(&lookup).context("cannot format JSON")?;
            output(&format!("{text}\n"))
        }
        Reply::Lookup { lookup } => output(&render_lookup(&lookup)),
        other => Err(unexpected(&other)),
    }
}

/// `vale-ctl flow SWITCH add|del|dump ...`: the flow module's commands, sent as `vale-ctl
/// module` sends them, their answers (flow tables) rendered.
pub(crate) fn flow(cli: &Cli, switch: &str, op: &FlowOp) -> Result<(), Failure> {
    let (command, body) = match op {
        FlowOp::Add { rule, rules } => {
            let mut text = rule.join("\n");
            if let Some(path) = rules {
                if !text.is_empty() {
                    text.push('\n');
                }
                text += &read_rules(path)?;
            }
            ("add", text)
        }
        FlowOp::Del { selector } => ("del", selector.clone()),
        FlowOp::Dump => ("dump", String::new()),
    };
    // A bad rule's line is the file's line when the rules came from a file alone.
    let file = match op {
        FlowOp::Add {
            rule,
            rules: Some(p),
        } if rule.is_empty() => Some(p),
        _ => None,
    };
    let sock = connect(cli)?;
    let flows = match op {
        FlowOp::Dump => dump_flows(&sock, switch)?,
        _ => flow_command(&sock, switch, command, body).map_err(|e| in_file(e, file))?,
    };
    if cli.json {
        let text = serde_json::to_string_pretty(&flows).context("cannot format JSON")?;
        output(&format!("{text}\n"))
    } else {
        output(&render_flows(&flows, op))
    }
}

/// `vale-ctl module SWITCH OP [BODY|-]`: a command of the switch's lookup module, its answer
/// printed as it is.
pub(crate) fn module(cli: &Cli, switch: &str, op: &str, body: Option<&str>) -> Result<(), Failure> {
    let body = match body {
        Some("-") => read_stdin()?,
        Some(b) => b.to_string(),
        None => String::new(),
    };
    let sock = connect(cli)?;
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

/// The body of `vale-ctl module ... -`: standard input, at most what valed takes in an
/// administrator's request.
fn read_stdin() -> Result<String, Failure> {
    let limit = MAX_ADMIN_REQUEST as u64;
    let mut text = String::new();
    std::io::stdin()
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

/// The text of rules file `path`: vale-ctl reads it (valed opens no path a client names).
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
fn lookup_request(c: &LookupCmd) -> Result<Request, Failure> {
    let switch = &c.switch;
    Ok(match c.module.as_deref() {
        None => Request::Lookup {
            switch: switch.to_string(),
        },
        Some(module) => {
            let vlan_flags = !c.access.is_empty() || !c.trunk.is_empty() || c.default.is_some();
            if vlan_flags && module != "vlan" {
                return Err(Failure::Usage(
                    "--access, --trunk and --default configure the vlan module only".into(),
                ));
            }
            let mut all = vlan_args(switch, &c.access, &c.trunk, c.default.as_deref())
                .map_err(|e| Failure::Usage(e.to_string()))?;
            all.extend(c.args.iter().map(|(key, value)| ModuleArg {
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Command;

    /// `lookup vale0 MODULE --access A...`.
    fn cmd(module: &str, access: &[&str]) -> LookupCmd {
        LookupCmd {
            switch: "vale0".into(),
            module: Some(module.into()),
            args: vec![],
            access: access.iter().map(|a| a.to_string()).collect(),
            trunk: vec![],
            default: None,
            rules: None,
        }
    }

    #[test]
    fn lookup_requests() {
        let cli = Cli::try_parse_from([
            "vale-ctl",
            "lookup",
            "vale0",
            "vlan",
            "--access",
            "a=10",
            "--trunk",
            "vale0:up=10,20",
            "--default",
            "none",
            "--arg",
            "entries=64",
        ])
        .unwrap();
        let Command::Lookup(c) = cli.command else {
            panic!("not lookup")
        };
        let req = lookup_request(&c);
        let Ok(Request::SetLookup { module, args, .. }) = req else {
            panic!("not set")
        };
        assert_eq!(module, "vlan");
        let kv: Vec<String> = args
            .iter()
            .map(|a| format!("{}={}", a.key, a.value))
            .collect();
        assert_eq!(
            kv,
            [
                "access=vale0:a=10",
                "trunk=vale0:up=10,20",
                "default=none",
                "entries=64"
            ]
        );
        // A path goes absolute; --arg needs a module; vlan flags need vlan.
        let Ok(Request::SetLookup { module, .. }) = lookup_request(&cmd("./m.so", &[])) else {
            panic!("not set")
        };
        assert!(
            module.starts_with('/') && module.ends_with("/m.so"),
            "{module}"
        );
        assert!(Cli::try_parse_from(["vale-ctl", "lookup", "vale0", "--arg", "a=b"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "lookup", "vale0", "--rules", "r"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0", "add"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0", "add", "--rules", "r"]).is_ok());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0", "del"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0:a", "dump"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "lookup", "vale0", "x", "--arg", "ab"]).is_err());
        assert!(matches!(
            lookup_request(&cmd("hub", &["a=1"])),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            lookup_request(&cmd("vlan", &["vale1:a=1"])),
            Err(Failure::Usage(_))
        ));
    }
}

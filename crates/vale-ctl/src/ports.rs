//! Host ports: `attach` (a TAP device, a network interface, a vhost-user socket, or any kind
//! by name with its arguments) and `detach`.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;

use vale_abi::control::Request;

use crate::cli::{AttachCmd, Cli};
use crate::client::{ask, done, Failure};

/// `vale-ctl attach PORT ...`: the short flags (`--tap`, `--iface`, `--vhost-user`) become the
/// generic form, a kind and its `KEY=VALUE` arguments, which is what valed takes.
pub(crate) fn attach(cli: &Cli, sock: &UnixStream, c: &AttachCmd) -> Result<(), Failure> {
    let mut args = BTreeMap::new();
    let kind = match (&c.tap, &c.iface) {
        _ if c.kind.is_some() => {
            args.extend(c.kind_args.iter().cloned());
            c.kind.as_deref().expect("checked")
        }
        _ if c.vhost_user.is_some() => {
            // valed resolves no path against our directory: send it absolute.
            let path = c.vhost_user.as_deref().expect("checked");
            let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            args.insert("path".to_string(), path.to_string_lossy().into_owned());
            if c.client {
                args.insert("client".to_string(), "yes".to_string());
            }
            if let Some(q) = c.queues {
                args.insert("queues".to_string(), q.to_string());
            }
            "vhost-user"
        }
        (Some(name), _) => {
            args.insert("name".to_string(), name.clone());
            if c.persist {
                args.insert("persist".to_string(), "yes".to_string());
            }
            "tap"
        }
        (None, Some(iface)) => {
            args.insert("iface".to_string(), iface.clone());
            if let Some(m) = &c.mode {
                args.insert("mode".to_string(), m.clone());
            }
            "nic"
        }
        (None, None) => unreachable!("clap requires --tap, --iface or --vhost-user"),
    };
    let req = Request::Attach {
        port: c.port.clone(),
        kind: kind.to_string(),
        args,
    };
    done(cli, ask(sock, &req)?)
}

/// `vale-ctl detach PORT`.
pub(crate) fn detach(cli: &Cli, sock: &UnixStream, port: &str) -> Result<(), Failure> {
    let req = Request::Detach {
        port: port.to_string(),
    };
    done(cli, ask(sock, &req)?)
}

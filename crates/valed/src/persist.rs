//! What the control socket needs of the configuration file: where `vale-ctl save` writes, and
//! the attachments as they were asked for. Kept apart from `control.rs` so that the protocol
//! has one line per request there.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use vale_abi::control::Reply;
use vale_switch::{Caller, Engine, Error, ErrorKind};

use crate::config::{self, Attachments};
use crate::control::refused;

static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
static ATTACHMENTS: OnceLock<Attachments> = OnceLock::new();

/// The attachments recorded so far.
pub fn attachments() -> &'static Attachments {
    ATTACHMENTS.get_or_init(Attachments::default)
}

/// Sets the file `vale-ctl save` writes (`valed --config`); once, at start.
pub fn set_file(path: Option<PathBuf>) {
    let _ = FILE.set(path);
}

/// An attach request succeeded: remember its arguments for the next save.
pub fn attached(port: &str, kind: &str, args: &BTreeMap<String, String>) {
    attachments().record(port, kind, args);
}

/// `Request::Save` from `caller`.
pub fn save_request(engine: &Engine, caller: &Caller) -> Reply {
    if let Err(e) = caller.must_be_admin("saving the configuration") {
        return refused(e);
    }
    let Some(path) = FILE.get().cloned().flatten() else {
        return refused(Error::new(
            ErrorKind::Unsupported,
            "valed has no configuration file to save to: start it with --config FILE",
        ));
    };
    let cfg = config::snapshot(engine, attachments());
    let switches = cfg.switches.len() as u32;
    let ports = cfg.switches.iter().map(|s| s.ports.len() as u32).sum();
    match config::save(&path, &cfg) {
        Ok(()) => {
            tracing::info!(path = %path.display(), switches, ports, "configuration saved");
            Reply::Saved {
                path: path.display().to_string(),
                switches,
                ports,
            }
        }
        Err(e) => refused(e),
    }
}

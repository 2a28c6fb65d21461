//! valed's configuration file (`valed --config FILE`): the switches, persistent ports, device
//! attachments (TAP, NIC, vhost-user), lookup modules with their arguments and saved state
//! (the flow module's rules, say: whatever the module's `save` gives, as lines), and
//! the switch and port knobs that valed applies at start, and that `vale-ctl save` writes from
//! the running state.
//!
//! The format is TOML (the `toml` crate, serde's own, kept by the toml-rs project): a person
//! edits it as easily as an INI file, comments stay legal, arrays of tables fit a list of
//! switches each with a list of ports, and its parse errors carry a line and a column.
//!
//! Persisting is explicit (`vale-ctl save`), not done as each change is made: what a restart
//! brings back is what an administrator chose to keep, as with a router's "copy running-config
//! startup-config". An experiment (a port attached for a minute, a module tried) cannot
//! overwrite a file that someone edited by hand, and valed never writes a file behind the
//! administrator's back.
//!
//! The file is untrusted input: at most [`MAX_CONFIG`] bytes, read through no symbolic link,
//! refused if anyone but root or valed's own user owns it or if it is writable by others
//! (group-writable only when the group is root's or the administrators'): it may name shared
//! objects that valed loads. A file that does not parse (or names an unknown field) is refused
//! as a whole with its line; an item that cannot be applied (a missing interface, a module that
//! fails to load, a bad knob) is reported with its name and why, and the rest is applied.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vale_abi::control::ModuleArg;
use vale_switch::{Caller, Engine, Error};

/// Why a configuration file was refused as a whole: the words name the file and what is
/// wrong; the variant is the kind of failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// It could not be opened or read.
    #[error("{0}")]
    Io(String),
    /// Someone other than root or an administrator could have written it, or it is a link
    /// or not a regular file: valed does not trust it.
    #[error("{0}")]
    Untrusted(String),
    /// It is larger than [`MAX_CONFIG`].
    #[error("{0}")]
    TooLarge(String),
    /// It does not parse: the words name the line.
    #[error("{0}")]
    Syntax(String),
    /// A path that names no file; a configuration that cannot be written as TOML.
    #[error("{0}")]
    Invalid(String),
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        match e {
            ConfigError::Io(m) => Error::io(m),
            ConfigError::Untrusted(m) => Error::denied(m),
            ConfigError::TooLarge(m) => Error::limit(m),
            ConfigError::Syntax(m) | ConfigError::Invalid(m) => Error::invalid(m),
        }
    }
}

/// Largest configuration file valed reads, and so the largest `vale-ctl save` writes: room
/// for a large flow table (about 108000 rules that match two MAC addresses, two IPv4
/// addresses and two ports, 155 bytes each in the file; a full table of 200000 rules does not
/// fit, and `save` says so).
pub const MAX_CONFIG: u64 = 16 << 20;

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The switches, each with its ports.
    #[serde(default, rename = "switch", skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<SwitchConf>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConf {
    /// `valeX`.
    pub name: String,
    /// Frames gathered from a ring per pass; absent: valed's `--batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// The lookup module; absent: the learning bridge with its defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<LookupConf>,
    /// The ports that survive a restart: persistent ones and device attachments.
    #[serde(default, rename = "port", skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortConf>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LookupConf {
    /// A built-in module (`learning`, `hub`, `vlan`, `flow`) or a shared object's absolute path.
    pub module: String,
    /// `key=value`, in order, as `vale-ctl lookup valeX MODULE --arg key=value` gives them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// What the module keeps across a restart, as lines its `save` gave and its `restore`
    /// takes back (the `flow` module: its rules, in the grammar of `vale-ctl flow valeX add`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state: Vec<String>,
    /// The name a file of an older valed gave the flow module's rules: [`parse`] moves them
    /// into `state`; never written.
    #[serde(default, skip_serializing)]
    pub rules: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConf {
    /// `Y` of `valeX:Y`.
    pub name: String,
    /// Made by `vale-ctl create`: it stays when no client holds it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub persistent: bool,
    /// The uid the port belongs to; absent: valed's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<u32>,
    /// Interrupt moderation toward the client, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moderation_us: Option<u32>,
    /// Most source addresses the learning bridge keeps for the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learn_limit: Option<u32>,
    /// A device valed moves the frames of: `kind` (one of `vale_switch::host::KINDS`) and that
    /// kind's saved form (`Kind::saved`): its arguments as `vale-ctl attach` sends them, and
    /// those only a saved configuration carries (`Kind::saved_args`, such as where a device
    /// was found), which the kind reads back when it opens the device again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<BTreeMap<String, String>>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The attachments as they were asked for, by port: what `vale-ctl list` shows of a device
/// does not say all of its arguments.
#[derive(Default)]
pub struct Attachments(Mutex<HashMap<String, Attached>>);

/// A port kind and its arguments.
type Attached = (String, BTreeMap<String, String>);

impl Attachments {
    pub fn record(&self, port: &str, kind: &str, args: &BTreeMap<String, String>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(port.to_string(), (kind.to_string(), args.clone()));
    }

    /// Forgets the ports not in `live` (detached or destroyed since), so the record stays as
    /// small as the switches.
    fn keep_only(&self, live: &std::collections::HashSet<String>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|port, _| live.contains(port));
    }

    fn get(&self, port: &str) -> Option<Attached> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(port).cloned()
    }
}

/// Reads and parses `path`; `Ok(None)` if it does not exist (nothing saved yet).
pub fn load(path: &Path, admin_gid: Option<u32>) -> Result<Option<Config>, ConfigError> {
    let shown = path.display();
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ConfigError::Untrusted(format!(
                "configuration {shown} is a symbolic link: name the file itself"
            )))
        }
        Err(e) => {
            return Err(ConfigError::Io(format!(
                "cannot open configuration {shown}: {e}"
            )))
        }
    };
    let meta = file
        .metadata()
        .map_err(|e| ConfigError::Io(format!("cannot read configuration {shown}: {e}")))?;
    if !meta.is_file() {
        return Err(ConfigError::Untrusted(format!(
            "configuration {shown} is not a regular file"
        )));
    }
    check_trusted(path, &meta, admin_gid)?;
    if meta.len() > MAX_CONFIG {
        return Err(ConfigError::TooLarge(format!(
            "configuration {shown} is {} bytes, more than the {MAX_CONFIG} bytes valed reads",
            meta.len()
        )));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG + 1)
        .read_to_string(&mut text)
        .map_err(|e| ConfigError::Io(format!("cannot read configuration {shown}: {e}")))?;
    if text.len() as u64 > MAX_CONFIG {
        return Err(ConfigError::TooLarge(format!(
            "configuration {shown} is more than the {MAX_CONFIG} bytes valed reads"
        )));
    }
    parse(&text)
        .map(Some)
        .map_err(|e| ConfigError::Syntax(format!("configuration {shown}: {e}")))
}

/// Parses the text of a configuration; the error names the line and column.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let mut cfg = toml::from_str::<Config>(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!("line {line}: ")
            })
            .unwrap_or_default();
        ConfigError::Syntax(format!("{at}{}", e.message()))
    })?;
    // An older file's `rules` are the state its module saved, before any `state` lines.
    for l in cfg.switches.iter_mut().filter_map(|s| s.lookup.as_mut()) {
        if !l.rules.is_empty() {
            let mut state = std::mem::take(&mut l.rules);
            state.append(&mut l.state);
            l.state = state;
        }
    }
    Ok(cfg)
}

/// Refuses a file that someone other than root or an administrator could have written: it
/// may name shared objects valed loads.
fn check_trusted(
    path: &Path,
    meta: &std::fs::Metadata,
    admin_gid: Option<u32>,
) -> Result<(), ConfigError> {
    let shown = path.display();
    // SAFETY: plain syscall without arguments.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Err(ConfigError::Untrusted(format!(
            "configuration {shown} belongs to uid {}: only root or valed's own user may own it \
             (it may name shared objects valed loads)",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode();
    let group_ok = meta.gid() == 0 || Some(meta.gid()) == admin_gid;
    if mode & 0o002 != 0 || (mode & 0o020 != 0 && !group_ok) {
        return Err(ConfigError::Untrusted(format!(
            "configuration {shown} is writable by others (mode {:o}): valed refuses it, as it \
             may name shared objects valed loads; chmod go-w {shown}",
            mode & 0o7777
        )));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::metadata(dir) {
            let m = d.permissions().mode();
            if m & 0o002 != 0 && m & 0o1000 == 0 {
                return Err(ConfigError::Untrusted(format!(
                    "configuration {shown} is in {}, a directory everyone may write: anyone \
                     could replace the file",
                    dir.display()
                )));
            }
        }
    }
    Ok(())
}

/// Applies `cfg` to a fresh engine. Each item that cannot be applied is reported (logged) by
/// name with why, and the rest goes on; returns those reports.
pub fn apply(engine: &Arc<Engine>, cfg: &Config, attachments: &Attachments) -> Vec<String> {
    let mut problems = Vec::new();
    let mut report = |item: String, why: String| {
        let line = format!("{item}: {why}");
        tracing::warn!("configuration not applied: {line}");
        problems.push(line);
    };
    let me = Caller::valed();
    for sw in &cfg.switches {
        if let Err(e) = vale_abi::name::parse_switch(&sw.name) {
            report(format!("switch '{}'", sw.name), e.to_string());
            continue;
        }
        // Ports first: a switch exists while it has ports.
        for p in &sw.ports {
            let name = format!("{}:{}", sw.name, p.name);
            let caller = Caller {
                uid: p.owner_uid.unwrap_or(me.uid),
                ..me
            };
            if let Some(att) = &p.attach {
                if let Err(why) = attach(engine, &name, att, &caller, attachments) {
                    report(format!("port '{name}'"), why.to_string());
                    if !p.persistent {
                        continue;
                    }
                }
            }
            if p.persistent {
                if let Err(why) = engine.create(&name, &caller) {
                    report(format!("port '{name}'"), why.to_string());
                    continue;
                }
            }
            if p.attach.is_none() && !p.persistent {
                report(
                    format!("port '{name}'"),
                    "neither persistent nor attached: nothing to make".into(),
                );
                continue;
            }
            let knobs = [
                ("moderation", p.moderation_us),
                ("learn-limit", p.learn_limit),
            ];
            for (knob, v) in knobs {
                if let Some(v) = v {
                    if let Err(why) = engine.set(&name, knob, &v.to_string(), &me) {
                        report(format!("port '{name}' {knob}"), why.to_string());
                    }
                }
            }
        }
        let have = engine.list().iter().any(|s| s.name == sw.name);
        if !have {
            if sw.batch.is_some() || sw.lookup.is_some() {
                report(
                    format!("switch '{}'", sw.name),
                    "none of its ports could be made, so its batch and lookup module wait \
                     for it to exist (set them again then)"
                        .into(),
                );
            }
            continue;
        }
        if let Some(b) = sw.batch {
            if let Err(why) = engine.set(&sw.name, "batch", &b.to_string(), &me) {
                report(format!("switch '{}' batch", sw.name), why.to_string());
            }
        }
        if let Some(l) = &sw.lookup {
            let mut args = Vec::new();
            let mut bad = None;
            for a in &l.args {
                match a.split_once('=') {
                    Some((k, v)) if !k.is_empty() => args.push(ModuleArg {
                        key: k.to_string(),
                        value: v.to_string(),
                    }),
                    _ => bad = Some(a.clone()),
                }
            }
            if let Some(a) = bad {
                report(
                    format!("switch '{}' lookup {}", sw.name, l.module),
                    format!("argument '{a}' is not key=value"),
                );
                continue;
            }
            if let Err(why) = engine.set_lookup(&sw.name, &l.module, &args, &me) {
                report(
                    format!("switch '{}' lookup {}", sw.name, l.module),
                    why.to_string(),
                );
                continue;
            }
            // The module's saved state (the flow module's rules), all at once (one rebuild of
            // a flow table); if that fails, a line at a time, so that the bad lines are
            // reported and the others stay.
            let state = &l.state;
            if !state.is_empty() && engine.lookup_restore(&sw.name, state, &me).is_err() {
                for line in state {
                    if let Err(why) =
                        engine.lookup_restore(&sw.name, std::slice::from_ref(line), &me)
                    {
                        report(
                            format!("switch '{}' {} state '{line}'", sw.name, l.module),
                            why.to_string(),
                        );
                    }
                }
            }
        }
    }
    problems
}

/// Attaches again the device port `name` saved as `att` (its kind, and its kind's saved
/// arguments: the kind opens it, with its own retries and namespaces).
fn attach(
    engine: &Arc<Engine>,
    name: &str,
    att: &BTreeMap<String, String>,
    caller: &Caller,
    attachments: &Attachments,
) -> Result<(), Error> {
    let mut args = att.clone();
    let kind = args.remove("kind").ok_or_else(|| {
        let known: Vec<&str> = vale_switch::host::KINDS.iter().map(|k| k.name).collect();
        Error::invalid(format!("attach has no 'kind' ({})", known.join(", ")))
    })?;
    engine.restore_host(name, &kind, &args, caller)?;
    attachments.record(name, &kind, &args);
    Ok(())
}

/// The running state as a configuration: every switch with its batch and lookup module (its
/// arguments and its saved state), and its persistent and device ports with their
/// knobs. Ports a client opened and holds are the client's: they are not saved.
pub fn snapshot(engine: &Engine, attachments: &Attachments) -> Config {
    let mut cfg = Config::default();
    let switches = engine.list();
    let live = switches
        .iter()
        .flat_map(|s| s.ports.iter())
        .filter(|p| p.kind != "native")
        .map(|p| p.name.clone())
        .collect();
    attachments.keep_only(&live);
    for sw in switches {
        let mut conf = SwitchConf {
            name: sw.name.clone(),
            batch: Some(sw.batch),
            ..Default::default()
        };
        if let Ok(saved) = engine.lookup_saved(&sw.name) {
            let args: Vec<String> = saved.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let default = saved.spec == vale_switch::lookup::MODULES[0].0
                && args.is_empty()
                && saved.state.is_empty();
            if !default {
                conf.lookup = Some(LookupConf {
                    module: saved.spec,
                    args,
                    state: saved.state,
                    rules: Vec::new(),
                });
            }
        }
        for p in &sw.ports {
            // A port of a host kind is saved in its kind's own form; a native port only if
            // it is persistent.
            let kind = vale_switch::host::kind(&p.kind).ok();
            if !p.persistent && kind.is_none() {
                continue;
            }
            let short = p.name.split_once(':').map(|x| x.1).unwrap_or(&p.name);
            let attach = kind.map(|k| {
                let recorded = attachments
                    .get(&p.name)
                    .filter(|(kind, _)| *kind == p.kind)
                    .map(|(_, args)| args);
                let device = p.device.as_deref().unwrap_or_default();
                let mut args = (k.saved)(recorded, device, p.mode.as_deref().unwrap_or_default());
                args.insert("kind".into(), p.kind.clone());
                args
            });
            conf.ports.push(PortConf {
                name: short.to_string(),
                persistent: p.persistent,
                owner_uid: Some(p.owner_uid),
                moderation_us: Some(p.moderation_us),
                learn_limit: Some(p.learn_limit),
                attach,
            });
        }
        cfg.switches.push(conf);
    }
    cfg
}

/// The text of `cfg` as a file, with a header saying what it is.
pub fn render(cfg: &Config) -> Result<String, ConfigError> {
    let body = toml::to_string(cfg)
        .map_err(|e| ConfigError::Invalid(format!("cannot write the configuration: {e}")))?;
    Ok(format!(
        "# vale configuration, read by valed --config at start; see valed(8).\n\
         # Written by 'vale-ctl save'; you may edit it (then: systemctl restart valed).\n\n{body}"
    ))
}

/// Writes `cfg` to `path` atomically: a new file beside it (mode 0644, valed's own), synced,
/// renamed over the old one, and the directory synced. A configuration larger than
/// [`MAX_CONFIG`], which valed would refuse at its next start, is not written: the old file
/// stays as it was.
pub fn save(path: &Path, cfg: &Config) -> Result<(), Error> {
    let text = render(cfg)?;
    let shown = path.display();
    if text.len() as u64 > MAX_CONFIG {
        let rules = cfg
            .switches
            .iter()
            .filter_map(|s| {
                s.lookup
                    .as_ref()
                    .map(|l| (l.state.len(), &s.name, &l.module))
            })
            .max()
            .filter(|(n, _, _)| *n > 0)
            .map(|(n, sw, m)| format!(" (switch '{sw}' has {n} lines of {m} state)"))
            .unwrap_or_default();
        return Err(Error::limit(format!(
            "the configuration would be {} bytes, more than the {MAX_CONFIG} bytes valed reads \
             at start{rules}: not saved, {shown} is as it was",
            text.len()
        )));
    }
    let (dir, prefix) = temporaries(path)?;
    let tmp = dir.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("cannot write configuration {shown}: {e}"))
    })
}

/// Where [`save`] writes before renaming: the directory of `path`, and the name of its
/// temporary files less the saving valed's pid (`.NAME.tmp`).
fn temporaries(path: &Path) -> Result<(PathBuf, String), ConfigError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        ConfigError::Invalid(format!(
            "configuration path {} names no file",
            path.display()
        ))
    })?;
    Ok((dir, format!(".{}.tmp", file_name.to_string_lossy())))
}

/// Removes the temporary files of [`save`] that a valed killed while saving left beside
/// `path` (`.NAME.tmpPID`): those of every pid that is not a live valed's. Returns how many
/// went.
pub fn remove_stale_temporaries(path: &Path) -> usize {
    let Ok((dir, prefix)) = temporaries(path) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix.as_str()))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || is_valed(pid) {
            continue;
        }
        match std::fs::remove_file(e.path()) {
            Ok(()) => {
                tracing::info!(file = %e.path().display(), "removed the temporary file of a \
                    save that did not finish");
                removed += 1;
            }
            Err(err) => tracing::warn!(file = %e.path().display(),
                "cannot remove the temporary file of a save that did not finish: {err}"),
        }
    }
    removed
}

/// Whether `pid` is a live valed (which may be saving to its temporary file now).
fn is_valed(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "valed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors_name_lines() {
        let text = "[[switch]]\nname = \"vale0\"\nbatch = 64\n[switch.lookup]\nmodule = \"flow\"\n\
                    args = [\"default=drop\"]\nstate = [\"prio=10 actions=normal\"]\n\
                    [[switch.port]]\nname = \"a\"\npersistent = true\nattach = { kind = \"tap\", name = \"t0\" }\n";
        let cfg = parse(text).unwrap();
        assert_eq!(cfg.switches[0].ports[0].name, "a");
        assert_eq!(parse(&render(&cfg).unwrap()).unwrap(), cfg);
        // An older file's flow rules are the module's saved state, written back as such.
        let old = parse(&text.replace("state = ", "rules = ")).unwrap();
        assert_eq!(old, cfg);
        assert!(!render(&old).unwrap().contains("rules"));
        let e = parse("[[switch]]\nname = \"vale0\"\nbatch = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("line 3:"), "{e}");
        let e = parse("[[switch]]\nname = \"vale0\"\nbogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("line 3:") && e.contains("bogus"), "{e}");
        let e = parse("[[switch]\n").unwrap_err().to_string();
        assert!(e.starts_with("line 1:"), "{e}");
    }
}

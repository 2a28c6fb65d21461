//! What the runtime hands the plugin: the network configuration on standard input and the
//! `CNI_*` variables of the environment, checked as the spec asks (each refusal with its code
//! and a message naming the field and what it may be).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use vale_abi::control::DEFAULT_RUN_DIR;

use crate::error::{
    CniError, Result, DECODE_FAILURE, INCOMPATIBLE_VERSION, INVALID_CONFIG, INVALID_ENV,
    UNSUPPORTED_FIELD,
};

/// The CNI versions this plugin speaks, oldest first. A result is written in the version of
/// the configuration.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Least and greatest MTU of a TAP device (the kernel's limits for tun: 68 and 65535 less the
/// Ethernet header).
pub const MTU_MIN: u32 = 68;
pub const MTU_MAX: u32 = 65521;

/// Port knobs the configuration may set (`vale-ctl set PORT KNOB VALUE`).
pub const KNOBS: &[&str] = &["moderation", "learn-limit"];

/// The plugin's network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    /// The switch the containers' ports join, `valeX`.
    pub switch: String,
    /// valed's run directory (its control socket is `valed.sock` in it).
    pub run_dir: PathBuf,
    /// The MTU of the container's interface; the kernel's default (1500) if absent.
    pub mtu: Option<u32>,
    /// Port knobs set on the port after it is made, in order of their names.
    pub knobs: BTreeMap<String, String>,
    /// The IPAM plugin's name (`ipam.type`), if addresses are asked for.
    pub ipam: Option<String>,
    /// The `dns` of the configuration, returned in the result when IPAM gives none.
    pub dns: Option<Value>,
    /// The result of the previous plugin or of ADD (CHECK, DEL).
    pub prev_result: Option<Value>,
    /// GC: the attachments still in use (`cni.dev/valid-attachments`), container id and
    /// interface name each.
    pub valid_attachments: Vec<(String, String)>,
}

/// The string field `key` of `o`, if present; another type is refused, naming the field.
fn text(o: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(format!("'{key}' is {other}: a string"))),
    }
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(INVALID_CONFIG, msg)
}

/// The version errors are written in when the configuration names none this plugin speaks.
pub const FALLBACK_VERSION: &str = "1.0.0";

/// The version a configuration asks for, as far as it can be read: the one errors are written
/// in ([`FALLBACK_VERSION`] when the configuration says none or is not JSON).
pub fn version_of(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| FALLBACK_VERSION.to_string())
}

/// Whether `version` (one of [`SUPPORTED_VERSIONS`]) is at least `least`.
pub fn at_least(version: &str, least: &str) -> bool {
    let key = |v: &str| SUPPORTED_VERSIONS.iter().position(|s| *s == v);
    key(version) >= key(least)
}

/// Reads the network configuration: not JSON is a decode failure (6), a version this plugin
/// does not speak is 1, a field it knows but does not do is 2, anything else wrong is 7.
pub fn parse(stdin: &[u8]) -> Result<NetConf> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            DECODE_FAILURE,
            format!("the network configuration is not JSON: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(CniError::new(
            DECODE_FAILURE,
            "the network configuration is not a JSON object",
        ));
    }
    let o = value.as_object().expect("checked above");
    let cni_version = text(o, "cniVersion")?.unwrap_or_default();
    if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
        return Err(CniError::new(
            INCOMPATIBLE_VERSION,
            format!(
                "incompatible CNI version '{cni_version}': vale-cni speaks {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    let name = text(o, "name")?.unwrap_or_default();
    if name.is_empty() {
        return Err(invalid("the network configuration has no 'name'"));
    }
    if text(o, "type")?.is_none_or(|t| t.is_empty()) {
        return Err(invalid("the network configuration has no 'type'"));
    }
    if let Some(v) = o.get("vlan") {
        return Err(CniError::new(
            UNSUPPORTED_FIELD,
            format!(
                "unsupported field 'vlan': {v}: vale-cni puts no port in a VLAN; configure the \
                 switch's vlan lookup module instead (docs/modules.md)"
            ),
        ));
    }
    let switch = text(o, "switch")?.ok_or_else(|| {
        invalid("the network configuration has no 'switch' (a vale switch, valeX)")
    })?;
    vale_abi::name::parse_switch(&switch).map_err(|e| invalid(format!("'switch': {e}")))?;
    let run_dir = PathBuf::from(text(o, "runDir")?.unwrap_or_else(|| DEFAULT_RUN_DIR.into()));
    if !run_dir.is_absolute() {
        return Err(invalid(format!(
            "'runDir' {} is not an absolute path",
            run_dir.display()
        )));
    }
    let mtu = match o.get("mtu") {
        None | Some(Value::Null) => None,
        Some(m)
            if m.as_u64()
                .is_some_and(|m| (MTU_MIN as u64..=MTU_MAX as u64).contains(&m)) =>
        {
            m.as_u64().map(|m| m as u32)
        }
        Some(m) => {
            return Err(invalid(format!(
                "'mtu' {m} is out of range: a TAP device's MTU is {MTU_MIN} to {MTU_MAX}"
            )))
        }
    };
    let mut knobs = BTreeMap::new();
    let no_knobs = Map::new();
    let given = match o.get("knobs") {
        None | Some(Value::Null) => &no_knobs,
        Some(Value::Object(k)) => k,
        Some(other) => return Err(invalid(format!("'knobs' is {other}: an object"))),
    };
    for (k, v) in given {
        if !KNOBS.contains(&k.as_str()) {
            return Err(invalid(format!(
                "unknown port knob '{k}' in 'knobs' (known: {})",
                KNOBS.join(", ")
            )));
        }
        let v = match v {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => {
                return Err(invalid(format!(
                    "port knob '{k}' is {other}: a number or a string"
                )))
            }
        };
        knobs.insert(k.clone(), v);
    }
    let ipam = match o.get("ipam") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) if o.is_empty() => None,
        Some(Value::Object(o)) => {
            let t = o.get("type").and_then(Value::as_str).unwrap_or_default();
            if t.is_empty() || t.contains('/') || t.starts_with('.') {
                return Err(invalid(format!(
                    "'ipam.type' {:?} is not the name of an IPAM plugin",
                    o.get("type").cloned().unwrap_or(Value::Null)
                )));
            }
            Some(t.to_string())
        }
        Some(other) => return Err(invalid(format!("'ipam' is {other}: an object"))),
    };
    let mut valid_attachments = Vec::new();
    match o.get("cni.dev/valid-attachments") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for a in list {
                let id = a.get("containerID").and_then(Value::as_str);
                let ifname = a.get("ifname").and_then(Value::as_str);
                let (Some(id), Some(ifname)) = (id, ifname) else {
                    return Err(invalid(format!(
                        "'cni.dev/valid-attachments' holds {a}: an object with 'containerID' and \
                         'ifname'"
                    )));
                };
                valid_attachments.push((id.to_string(), ifname.to_string()));
            }
        }
        Some(other) => {
            return Err(invalid(format!(
                "'cni.dev/valid-attachments' is {other}: a list"
            )))
        }
    }
    Ok(NetConf {
        valid_attachments,
        cni_version,
        name,
        switch,
        run_dir,
        mtu,
        knobs,
        ipam,
        dns: o.get("dns").cloned(),
        prev_result: o.get("prevResult").cloned(),
    })
}

/// The CNI command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    /// Spec 1.1: remove what belongs to no valid attachment.
    Gc,
    /// Spec 1.1: whether ADD would work now.
    Status,
}

/// The variables of the environment a command needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    /// The namespace's path; empty only for DEL (the runtime may have lost it).
    pub netns: String,
    pub ifname: String,
    /// `CNI_PATH`: where delegated plugins (IPAM) are looked for.
    pub path: String,
}

fn bad_env(msg: impl Into<String>) -> CniError {
    CniError::new(INVALID_ENV, msg)
}

/// Reads the environment through `get` (`std::env::var` in the plugin).
pub fn env(get: impl Fn(&str) -> Option<String>) -> Result<Env> {
    let command = match get("CNI_COMMAND").as_deref() {
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
        Some("VERSION") => Command::Version,
        Some("GC") => Command::Gc,
        Some("STATUS") => Command::Status,
        Some(other) => {
            return Err(bad_env(format!(
            "unknown CNI_COMMAND '{other}' (vale-cni does ADD, DEL, CHECK, VERSION, GC and STATUS)"
        )))
        }
        None => return Err(bad_env("CNI_COMMAND is not set")),
    };
    let mut e = Env {
        command,
        container_id: String::new(),
        netns: String::new(),
        ifname: String::new(),
        path: String::new(),
    };
    e.path = get("CNI_PATH").unwrap_or_default();
    if matches!(command, Command::Version | Command::Gc | Command::Status) {
        return Ok(e);
    }
    let need = |name: &str| {
        get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad_env(format!("{name} is not set")))
    };
    e.container_id = need("CNI_CONTAINERID")?;
    check_container_id(&e.container_id)?;
    e.ifname = need("CNI_IFNAME")?;
    check_ifname(&e.ifname)?;
    e.netns = match command {
        Command::Del => get("CNI_NETNS").unwrap_or_default(),
        _ => need("CNI_NETNS")?,
    };
    if !e.netns.is_empty() && !Path::new(&e.netns).is_absolute() {
        return Err(bad_env(format!(
            "CNI_NETNS '{}' is not an absolute path",
            e.netns
        )));
    }
    Ok(e)
}

/// The spec's container id: a letter or digit, then letters, digits, `_`, `.` and `-`.
fn check_container_id(id: &str) -> Result<()> {
    let ok = id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok {
        return Err(bad_env(format!(
            "CNI_CONTAINERID '{id}': a letter or digit, then letters, digits, '_', '.' and '-'"
        )));
    }
    Ok(())
}

/// The spec's interface name: at most 15 characters, not `.` or `..`, no `/`, `:` or space.
fn check_ifname(name: &str) -> Result<()> {
    let ok = name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace());
    if !ok {
        return Err(bad_env(format!(
            "CNI_IFNAME '{name}': 1 to {} characters, not '.' or '..', no '/', ':' or spaces",
            libc::IFNAMSIZ - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

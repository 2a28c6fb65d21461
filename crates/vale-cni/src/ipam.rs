//! Delegation to the IPAM plugin, as the spec has it: the plugin named by `ipam.type` is
//! looked for in the directories of `CNI_PATH` and run with the same environment (but
//! `CNI_COMMAND`) and the same configuration on its standard input; its result or its error
//! is ours.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::error::{self, CniError, Result};

/// The executable `name` in the first directory of `cni_path` that has it.
pub fn find(name: &str, cni_path: &str) -> Result<PathBuf> {
    let found = cni_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        });
    found.ok_or_else(|| {
        CniError::new(
            error::INVALID_CONFIG,
            format!("IPAM plugin '{name}' (ipam.type) is not in CNI_PATH '{cni_path}'"),
        )
    })
}

/// Whether IPAM plugin `name` speaks CNI version `version` (its answer to VERSION).
pub fn speaks(name: &str, version: &str, cni_path: &str) -> Result<bool> {
    let ask = serde_json::json!({ "cniVersion": version }).to_string();
    let answer = delegate_as(name, "VERSION", ask.as_bytes(), cni_path)?;
    Ok(answer
        .as_ref()
        .and_then(|v| v["supportedVersions"].as_array())
        .is_some_and(|l| l.iter().any(|v| v == version)))
}

/// Runs IPAM plugin `name` for `command` with `stdin`; what it printed on success (a result
/// for ADD, nothing for DEL and CHECK).
pub fn delegate(name: &str, command: &str, stdin: &[u8], cni_path: &str) -> Result<Option<Value>> {
    let printed = delegate_as(name, command, stdin, cni_path)?;
    if command == "ADD" && printed.is_none() {
        return Err(CniError::new(
            error::DECODE_FAILURE,
            format!("IPAM plugin '{name}' printed no result"),
        ));
    }
    Ok(printed.filter(|_| command == "ADD"))
}

/// Runs IPAM plugin `name` for `command` with `stdin`; the JSON object it printed on success,
/// if any.
fn delegate_as(name: &str, command: &str, stdin: &[u8], cni_path: &str) -> Result<Option<Value>> {
    let exe = find(name, cni_path)?;
    let mut child = Command::new(&exe)
        .env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| error::io(format!("cannot run IPAM plugin {}", exe.display()), e))?;
    // The configuration is small: the plugin reads it whole before it writes.
    let wrote = child.stdin.take().expect("piped").write_all(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| error::io(format!("IPAM plugin {}", exe.display()), e))?;
    let printed: Option<Value> = serde_json::from_slice(&out.stdout).ok();
    if !out.status.success() {
        // Its own error, passed on as it is; else what can be said of its failure.
        if let Some(v) = &printed {
            if let (Some(code), Some(msg)) = (v["code"].as_u64(), v["msg"].as_str()) {
                let details = v["details"].as_str().unwrap_or_default();
                return Err(CniError::new(code as u32, msg).with_details(details));
            }
        }
        return Err(CniError::new(
            error::IO_FAILURE,
            format!(
                "IPAM plugin '{name}' {command} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    wrote.map_err(|e| error::io(format!("cannot give IPAM plugin '{name}' its input"), e))?;
    Ok(printed.filter(Value::is_object))
}

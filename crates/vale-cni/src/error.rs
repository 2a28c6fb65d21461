//! The CNI error result: `{"cniVersion", "code", "msg", "details"}` on standard output and a
//! non-zero exit status, with the spec's well-known codes (1 to 11) and the plugin's own (100
//! and up).

use serde_json::{json, Value};

/// The configuration's `cniVersion` is not one this plugin speaks.
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// A field of the configuration that the plugin knows but does not support (the message names
/// the key and the value).
pub const UNSUPPORTED_FIELD: u32 = 2;
/// A variable of the environment (`CNI_COMMAND`, `CNI_CONTAINERID`, ...) is missing or bad.
pub const INVALID_ENV: u32 = 4;
/// An I/O failure: a namespace that cannot be entered, a netlink request the kernel refused.
pub const IO_FAILURE: u32 = 5;
/// The configuration on standard input is not JSON.
pub const DECODE_FAILURE: u32 = 6;
/// The configuration is JSON but not a valid network configuration for this plugin.
pub const INVALID_CONFIG: u32 = 7;
/// Transient: valed does not answer (not started yet, restarting).
pub const TRY_AGAIN_LATER: u32 = 11;
/// STATUS (spec 1.1): the plugin cannot serve ADD now (no valed answers).
pub const NOT_AVAILABLE: u32 = 50;
/// CHECK: the container's network is not what the previous result says.
pub const NOT_AS_EXPECTED: u32 = 100;
/// ADD: the container already has an interface of that name, or the switch a port of the
/// container's name (an earlier ADD that was never deleted).
pub const ALREADY_EXISTS: u32 = 101;

/// A CNI error: its code, its message, and details (what the plugin saw).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The error as the spec writes it, in CNI version `version`.
    pub fn to_json(&self, version: &str) -> Value {
        let mut v = json!({ "cniVersion": version, "code": self.code, "msg": self.msg });
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }
}

pub type Result<T> = std::result::Result<T, CniError>;

/// An I/O error while doing `what`.
pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> CniError {
    CniError::new(IO_FAILURE, format!("{what}: {e}"))
}

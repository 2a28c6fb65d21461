//! The switch's side: valed's control protocol (`vale_abi::control`), as `vale-ctl attach
//! SWITCH:PORT --tap NAME`, `detach`, `set` and `list` speak it.
//!
//! A container's port and TAP device are named after the container and its interface alone
//! ([`port_of`]), so DEL finds them again with nothing stored between the calls.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use vale_abi::control::{self, ErrorKind, PortInfo, Reply, Request, SOCKET_NAME};

use crate::error::{self, CniError, Result};

/// How long one exchange with valed may take before the plugin gives up (and asks the
/// runtime to try again).
const TIMEOUT: Duration = Duration::from_secs(10);

/// The TAP device's name (also the port's name on the switch) of interface `ifname` of
/// container `container_id`: `vc` and 13 hex digits of an FNV-1a hash of both, 15 characters
/// (the kernel's limit).
pub fn port_of(container_id: &str, ifname: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id
        .bytes()
        .chain(std::iter::once(0))
        .chain(ifname.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("vc{:013x}", h >> 12)
}

/// Whether `port` (the part after `valeX:`) is a name [`port_of`] makes.
pub fn is_container_port(port: &str) -> bool {
    port.len() == 15
        && port.starts_with("vc")
        && port[2..]
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// valed refused a request.
#[derive(Debug)]
pub struct Refused {
    pub kind: ErrorKind,
    pub message: String,
}

/// A connection to valed.
pub struct Valed(UnixStream);

impl Valed {
    /// Connects to the valed of `run_dir`; `None` if none runs there (no socket, or nobody
    /// listening on it).
    pub fn connect(run_dir: &Path) -> Result<Option<Valed>> {
        let path = run_dir.join(SOCKET_NAME);
        match UnixStream::connect(&path) {
            Ok(s) => {
                let set = s
                    .set_read_timeout(Some(TIMEOUT))
                    .and_then(|()| s.set_write_timeout(Some(TIMEOUT)));
                set.map_err(|e| error::io(format!("valed at {}", path.display()), e))?;
                Ok(Some(Valed(s)))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(error::io(
                format!("cannot reach valed at {}", path.display()),
                e,
            )),
        }
    }

    /// Connects to the valed of `run_dir`, which must run: else "try again later" (11).
    pub fn must_connect(run_dir: &Path) -> Result<Valed> {
        Valed::connect(run_dir)?.ok_or_else(|| {
            CniError::new(
                error::TRY_AGAIN_LATER,
                format!(
                    "no valed answers at {}: start valed (or fix 'runDir')",
                    run_dir.join(SOCKET_NAME).display()
                ),
            )
        })
    }

    /// One request; valed's refusal is `Ok(Err(..))`, a broken conversation an I/O failure
    /// (a timeout: try again later).
    fn ask(&self, req: &Request) -> Result<std::result::Result<Reply, Refused>> {
        match control::exchange(&self.0, req) {
            Ok(Some((Reply::Error { kind, message }, _))) => Ok(Err(Refused { kind, message })),
            Ok(Some((reply, _))) => Ok(Ok(reply)),
            Ok(None) => Err(CniError::new(
                error::IO_FAILURE,
                "valed closed the connection without replying",
            )),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(CniError::new(
                    error::TRY_AGAIN_LATER,
                    format!("valed did not answer within {TIMEOUT:?}"),
                ))
            }
            Err(e) => Err(error::io("cannot exchange a request with valed", e)),
        }
    }

    /// Like [`Valed::ask`], for requests whose success is `Ok`.
    fn ask_ok(&self, req: &Request) -> Result<std::result::Result<(), Refused>> {
        match self.ask(req)? {
            Ok(Reply::Ok) => Ok(Ok(())),
            Ok(other) => Err(CniError::new(
                error::IO_FAILURE,
                format!("unexpected reply from valed: {other:?}"),
            )),
            Err(r) => Ok(Err(r)),
        }
    }

    /// `vale-ctl attach PORT --tap TAP`: valed creates TAP device `tap` in its namespace.
    pub fn attach_tap(&self, port: &str, tap: &str) -> Result<()> {
        let req = Request::Attach {
            port: port.to_string(),
            kind: "tap".into(),
            args: [("name".to_string(), tap.to_string())].into(),
        };
        self.ask_ok(&req)?.map_err(|r| {
            let code = match r.kind {
                ErrorKind::Busy => error::ALREADY_EXISTS,
                ErrorKind::InvalidArgument | ErrorKind::NotFound => error::INVALID_CONFIG,
                ErrorKind::LimitReached => error::TRY_AGAIN_LATER,
                _ => error::IO_FAILURE,
            };
            CniError::new(code, format!("valed refused port {port}: {}", r.message))
        })
    }

    /// `vale-ctl detach PORT`; a port that is not there is no error.
    pub fn detach(&self, port: &str) -> Result<()> {
        let req = Request::Detach {
            port: port.to_string(),
        };
        match self.ask_ok(&req)? {
            Ok(()) => Ok(()),
            Err(r) if matches!(r.kind, ErrorKind::NotFound | ErrorKind::Gone) => Ok(()),
            Err(r) => Err(CniError::new(
                error::IO_FAILURE,
                format!("valed refused to detach port {port}: {}", r.message),
            )),
        }
    }

    /// `vale-ctl set PORT KNOB VALUE`.
    pub fn set(&self, port: &str, knob: &str, value: &str) -> Result<()> {
        let req = Request::Set {
            target: port.to_string(),
            knob: knob.to_string(),
            value: value.to_string(),
        };
        self.ask_ok(&req)?.map_err(|r| {
            CniError::new(
                error::INVALID_CONFIG,
                format!("port knob '{knob}' = '{value}': {}", r.message),
            )
        })
    }

    /// Port `name`, if the switch has it.
    pub fn port(&self, name: &str) -> Result<Option<PortInfo>> {
        Ok(self.ports()?.into_iter().find(|p| p.name == name))
    }

    /// Every port of every switch.
    pub fn ports(&self) -> Result<Vec<PortInfo>> {
        match self.ask(&Request::List)? {
            Ok(Reply::List { switches }) => {
                Ok(switches.into_iter().flat_map(|s| s.ports).collect())
            }
            Ok(other) => Err(CniError::new(
                error::IO_FAILURE,
                format!("unexpected reply from valed: {other:?}"),
            )),
            Err(r) => Err(CniError::new(
                error::IO_FAILURE,
                format!("valed refused to list its ports: {}", r.message),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_names_are_deterministic_distinct_and_fit_an_interface_name() {
        let a = port_of("0123456789abcdef", "eth0");
        assert_eq!(a, port_of("0123456789abcdef", "eth0"));
        assert_ne!(a, port_of("0123456789abcdef", "eth1"));
        assert_ne!(a, port_of("0123456789abcdee", "eth0"));
        // No ambiguity between the id's end and the name's start.
        assert_ne!(port_of("ab", "c"), port_of("a", "bc"));
        assert_eq!(a.len(), 15);
        assert!(is_container_port(&a));
        for other in ["vc123", "vcXXXXXXXXXXXXX", "eth0", "ab0123456789abc"] {
            assert!(!is_container_port(other), "{other}");
        }
        vale_abi::name::parse_port(&format!("vale0:{a}")).unwrap();
    }
}

//! What kind of failure a control reply reports, and the one table that turns a kind into the
//! errno a C programmer or a netmap program expects.
//!
//! valed's error reply carries a [`ErrorKind`] beside its message (the message says what is
//! wrong and names the thing and the limit; the kind says what to do about it). libvale's C
//! API sets `errno` from [`ErrorKind::errno`]; the netmap emulation from
//! [`ErrorKind::netmap_errno`], which follows netmap's own choices where netmap has one.

use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

/// The kind of a refused request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No such switch, port or rule.
    NotFound,
    /// The port (or device, or name) is in use.
    Busy,
    /// The caller may not do this: not the owner, not an administrator.
    PermissionDenied,
    /// A per-user or per-switch limit would be passed.
    LimitReached,
    /// A bad name, value, rule or request.
    InvalidArgument,
    /// Not something vale does.
    Unsupported,
    /// The thing went away meanwhile.
    Gone,
    /// valed could not do it (a system call failed); also what a reply without a kind means.
    #[default]
    Io,
}

impl ErrorKind {
    /// Every kind, in the order of the table.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::NotFound,
        ErrorKind::Busy,
        ErrorKind::PermissionDenied,
        ErrorKind::LimitReached,
        ErrorKind::InvalidArgument,
        ErrorKind::Unsupported,
        ErrorKind::Gone,
        ErrorKind::Io,
    ];

    /// The errno of libvale's C API.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::Busy => libc::EBUSY,
            ErrorKind::PermissionDenied => libc::EACCES,
            ErrorKind::LimitReached => libc::ENOSPC,
            ErrorKind::InvalidArgument => libc::EINVAL,
            ErrorKind::Unsupported => libc::EOPNOTSUPP,
            ErrorKind::Gone => libc::ENODEV,
            ErrorKind::Io => libc::EIO,
        }
    }

    /// The errno a netmap program gets, as netmap's kernel module would give it: ENXIO for a
    /// port that is not there, EPERM for one it may not open, ENOMEM when out of room.
    pub fn netmap_errno(self) -> i32 {
        match self {
            ErrorKind::NotFound | ErrorKind::Gone => libc::ENXIO,
            ErrorKind::PermissionDenied => libc::EPERM,
            ErrorKind::LimitReached => libc::ENOMEM,
            k => k.errno(),
        }
    }

    /// The nearest [`io::ErrorKind`], for Rust callers that match on it.
    pub fn io_kind(self) -> io::ErrorKind {
        match self {
            ErrorKind::NotFound => io::ErrorKind::NotFound,
            ErrorKind::Busy => io::ErrorKind::ResourceBusy,
            ErrorKind::PermissionDenied => io::ErrorKind::PermissionDenied,
            ErrorKind::LimitReached => io::ErrorKind::QuotaExceeded,
            ErrorKind::InvalidArgument => io::ErrorKind::InvalidInput,
            ErrorKind::Unsupported => io::ErrorKind::Unsupported,
            ErrorKind::Gone => io::ErrorKind::NotConnected,
            ErrorKind::Io => io::ErrorKind::Other,
        }
    }
}

/// valed's refusal as a client sees it: the kind and valed's message. Carried inside an
/// [`io::Error`] by libvale ([`Refused::into_io`]), so that a caller that only has the
/// `io::Error` still finds the kind ([`Refused::kind_of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

impl Refused {
    pub fn into_io(self) -> io::Error {
        io::Error::new(self.kind.io_kind(), self)
    }

    /// The kind of a refusal carried by `e`, if it is one.
    pub fn kind_of(e: &io::Error) -> Option<ErrorKind> {
        e.get_ref()?.downcast_ref::<Refused>().map(|r| r.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_errno_and_survives_an_io_error() {
        let mut seen = std::collections::HashSet::new();
        for k in ErrorKind::ALL {
            assert!(seen.insert(k.errno()), "{k:?} shares its errno");
            let e = Refused {
                kind: k,
                message: "m".into(),
            }
            .into_io();
            assert_eq!(Refused::kind_of(&e), Some(k));
            assert_eq!(e.to_string(), "m");
        }
        assert_eq!(ErrorKind::default(), ErrorKind::Io);
        assert_eq!(Refused::kind_of(&io::Error::other("x")), None);
    }
}

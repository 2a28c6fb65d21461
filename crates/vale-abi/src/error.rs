//! What kind of failure a control reply reports, and the one table that turns a kind into the
//! errno a C programmer or a netmap program expects.
//!
//! valed's error reply carries a [`ErrorKind`] beside its message (the message says what is
//! wrong and names the thing and the limit; the kind says what to do about it). libvale's C
//! API sets `errno` from [`ErrorKind::errno`]; the netmap emulation from
//! [`ErrorKind::netmap_errno`], which follows netmap's own choices where netmap has one. Both
//! turn any failure (a refusal or a system call's) into their errno with [`Api::errno_of`].

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

    /// The kind of a system call's failure `e`, the other way round through the same table:
    /// a refusal it carries by its kind, else by its errno, else (an error made in words) by
    /// its [`io::ErrorKind`]; I/O for the rest.
    pub fn of_io(e: &io::Error) -> ErrorKind {
        if let Some(kind) = Refused::kind_of(e) {
            return kind;
        }
        match (e.raw_os_error(), e.kind()) {
            (Some(libc::EEXIST | libc::EADDRINUSE | libc::EBUSY), _) => ErrorKind::Busy,
            (Some(libc::ENOENT | libc::ENODEV | libc::ENXIO), _) => ErrorKind::NotFound,
            (Some(libc::EACCES | libc::EPERM), _) => ErrorKind::PermissionDenied,
            (Some(libc::EINVAL | libc::ENAMETOOLONG), _) => ErrorKind::InvalidArgument,
            (Some(libc::EMFILE | libc::ENFILE | libc::ENOSPC), _) => ErrorKind::LimitReached,
            (Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT), _) => {
                ErrorKind::Unsupported
            }
            (None, io::ErrorKind::NotFound) => ErrorKind::NotFound,
            (None, io::ErrorKind::PermissionDenied) => ErrorKind::PermissionDenied,
            (None, io::ErrorKind::InvalidInput) => ErrorKind::InvalidArgument,
            (None, io::ErrorKind::Unsupported) => ErrorKind::Unsupported,
            _ => ErrorKind::Io,
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

/// Whose errnos a failure is told in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// libvale's C API: [`ErrorKind::errno`].
    C,
    /// The netmap emulation: [`ErrorKind::netmap_errno`].
    Netmap,
}

impl Api {
    /// The errno of a refusal of kind `kind`.
    pub fn errno(self, kind: ErrorKind) -> i32 {
        match self {
            Api::C => kind.errno(),
            Api::Netmap => kind.netmap_errno(),
        }
    }

    /// The errno of failure `e`: valed's refusal by its kind ([`Api::errno`]), a system
    /// call's own errno, else by the error's kind: ECONNRESET when valed went away (vale.h),
    /// EINVAL for a bad argument, in netmap ENOENT for a thing that is not there (no valed to
    /// reach, as netmap's missing device file), EIO for the rest.
    pub fn errno_of(self, e: &io::Error) -> i32 {
        match Refused::kind_of(e) {
            Some(kind) => self.errno(kind),
            None => e.raw_os_error().unwrap_or(match (self, e.kind()) {
                (_, io::ErrorKind::ConnectionReset) => libc::ECONNRESET,
                (_, io::ErrorKind::InvalidInput) => libc::EINVAL,
                (Api::Netmap, io::ErrorKind::NotFound) => libc::ENOENT,
                _ => libc::EIO,
            }),
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

    #[test]
    fn a_system_calls_failure_has_the_kind_its_errno_says() {
        let os = |n| ErrorKind::of_io(&io::Error::from_raw_os_error(n));
        for k in ErrorKind::ALL {
            // A system call's ENODEV is a device that is not there; only valed says "gone".
            if k != ErrorKind::Gone {
                assert_eq!(os(k.errno()), k, "{k:?}");
            }
            let refused = Refused {
                kind: k,
                message: "m".into(),
            };
            assert_eq!(ErrorKind::of_io(&refused.into_io()), k);
        }
        assert_eq!(os(libc::ENODEV), ErrorKind::NotFound);
        assert_eq!(os(libc::EADDRINUSE), ErrorKind::Busy);
        assert_eq!(os(libc::EMFILE), ErrorKind::LimitReached);
        assert_eq!(os(libc::EFAULT), ErrorKind::Io);
        let words = io::Error::new(io::ErrorKind::InvalidInput, "m");
        assert_eq!(ErrorKind::of_io(&words), ErrorKind::InvalidArgument);
    }

    #[test]
    fn a_failure_is_the_same_errno_in_c_and_in_netmap_but_where_netmap_differs() {
        let refused = |kind| {
            Refused {
                kind,
                message: "m".into(),
            }
            .into_io()
        };
        for k in ErrorKind::ALL {
            assert_eq!(Api::C.errno_of(&refused(k)), k.errno(), "{k:?}");
            assert_eq!(Api::Netmap.errno_of(&refused(k)), k.netmap_errno(), "{k:?}");
        }
        let limit = refused(ErrorKind::LimitReached);
        assert_eq!(
            (Api::C.errno_of(&limit), Api::Netmap.errno_of(&limit)),
            (libc::ENOSPC, libc::ENOMEM)
        );
        let os = io::Error::from_raw_os_error(libc::EMFILE);
        let words = |kind| io::Error::new(kind, "m");
        for (e, c, netmap) in [
            (os, libc::EMFILE, libc::EMFILE),
            (
                words(io::ErrorKind::ConnectionReset),
                libc::ECONNRESET,
                libc::ECONNRESET,
            ),
            (
                words(io::ErrorKind::InvalidInput),
                libc::EINVAL,
                libc::EINVAL,
            ),
            (words(io::ErrorKind::NotFound), libc::EIO, libc::ENOENT),
            (io::Error::other("m"), libc::EIO, libc::EIO),
        ] {
            assert_eq!(
                (Api::C.errno_of(&e), Api::Netmap.errno_of(&e)),
                (c, netmap),
                "{e:?}"
            );
        }
    }
}

//! The switch's error: what went wrong, in words that name the thing and the limit, its kind
//! ([`ErrorKind`]), which valed's reply carries to libvale's C API and the netmap emulation
//! as an errno, and the failure behind it, if any.
//!
//! One error policy for the engine and the port kinds (a kind's `open` fails with this same
//! [`Error`], re-exported as `host::Error`): every refusal is made with its kind where it is
//! made ([`Error::busy`], [`Error::limit`]...); a system call's failure with
//! [`Error::of_io`], whose kind the errno table of `vale_abi::error` gives back and which
//! keeps the `io::Error` as its source. A bare message has no kind of its own: there is no
//! conversion from a `String`. (Lookup modules have their own enum, `lookup::Error`, which
//! says its kind.)

use std::io;
use std::sync::Arc;

pub use vale_abi::error::ErrorKind;

/// A refused engine operation or attach.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    /// Whole, for the client: it names the thing, and says the failure behind it.
    pub message: String,
    /// The failure behind it, for Rust callers that look (`std::error::Error::source`).
    #[source]
    pub source: Option<Arc<io::Error>>,
}

/// Errors are equal when they say the same: the kind and the words.
impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for Error {}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::NotFound, message)
    }
    pub fn busy(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Busy, message)
    }
    pub fn denied(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::PermissionDenied, message)
    }
    pub fn limit(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::LimitReached, message)
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unsupported, message)
    }
    pub fn gone(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Gone, message)
    }
    pub fn io(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Io, message)
    }

    /// `message`, of the kind that `e`, the system call's failure behind it, says
    /// ([`ErrorKind::of_io`]: by its errno, else by its kind), with `e` as its source.
    pub fn of_io(message: impl Into<String>, e: io::Error) -> Error {
        Error {
            kind: ErrorKind::of_io(&e),
            message: message.into(),
            source: Some(Arc::new(e)),
        }
    }
}

/// A bad name is an invalid argument.
impl From<vale_abi::name::NameError> for Error {
    fn from(e: vale_abi::name::NameError) -> Error {
        Error::invalid(e.to_string())
    }
}

/// Port parameters out of their ranges are an invalid argument.
impl From<vale_abi::region::RegionError> for Error {
    fn from(e: vale_abi::region::RegionError) -> Error {
        Error::invalid(e.to_string())
    }
}

/// For code that only reports (valed's log of a configuration it could not apply): the words.
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.message
    }
}

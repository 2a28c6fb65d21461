//! The engine's error: what went wrong, in words that name the thing and the limit, and its
//! kind ([`ErrorKind`]), which valed's reply carries to libvale's C API and the netmap
//! emulation as an errno.

use thiserror::Error;

pub use vale_abi::error::ErrorKind;

/// A refused engine operation.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
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
    pub fn io(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Io, message)
    }
}

/// The checks that still report in words only (a knob's value, a name) refuse what they were
/// given: an invalid argument. (Lookup modules say their kind: `lookup::Error`.)
impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::invalid(message)
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

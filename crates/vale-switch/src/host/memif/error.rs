//! Why valed ends a memif connection: what the client broke, or what failed under it. The
//! port's thread logs it, counts it as bad input, shows the port down and says it to the client
//! in a DISCONNECT (whose 96 bytes hold the start of these words).

use std::io;
use std::time::Duration;

use super::super::guard::GuardError;
use super::super::peer_irq::Blocked;
use super::ring::Bad;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A message or a setup that breaks the protocol; the words say what.
    #[error("{0}")]
    Protocol(String),
    /// A ring whose head the client put more than a ring ahead of valed's cursor.
    #[error(
        "ring head {head} is {ahead} slots past valed's cursor {cursor} (the ring has {size})"
    )]
    Head {
        head: u16,
        ahead: u32,
        cursor: u16,
        size: u32,
    },
    /// A descriptor of a ring that valed fills, outside the client's regions.
    #[error("{0}")]
    Desc(Bad),
    /// Ring `index` of direction `dir` (C2S, S2C) broke as `source` says.
    #[error("{dir} ring {index}: {source}")]
    Ring {
        dir: &'static str,
        index: usize,
        source: Box<Error>,
    },
    /// The client's regions do not fit in the memory guard.
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// The client made a region's file shorter under valed.
    #[error("the client shrank a region under valed")]
    Shrunk,
    /// The handshake was not over in time.
    #[error("handshake not finished in {0:?}")]
    Late(Duration),
    /// The client made an interrupt eventfd blocking and let its counter fill.
    #[error(transparent)]
    Blocked(#[from] Blocked),
    /// A system call on the connection or the client's memory failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Ring `index` of direction `dir` broke as `self` says.
    pub fn in_ring(self, dir: &'static str, index: usize) -> Error {
        Error::Ring {
            dir,
            index,
            source: Box::new(self),
        }
    }

    /// `what` failed as the last system call says.
    pub fn last_os(what: impl Into<String>) -> Error {
        Error::Io {
            what: what.into(),
            source: io::Error::last_os_error(),
        }
    }
}

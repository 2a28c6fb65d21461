//! The vale forwarding engine.
//!
//! What valed uses is re-exported here: the [`Engine`] (every switch and worker; what the
//! control plane calls) with its [`EngineConfig`], [`OpenedPort`] and [`DEFAULT_BATCH`];
//! [`Caller`] and [`UserLimits`] (who asks, and what a user may hold); [`Error`] and
//! [`ErrorKind`]; a [`Port`] and its [`PortShared`] knobs; a capture's [`CaptureRing`].
//! Three modules are public: [`host`] and [`lookup`], the two seams a port kind and a lookup
//! module are written against, and [`epoll`], the thin epoll wrapper valed's control thread
//! shares. The rest is private:
//!
//! - `access`: who may do what (callers, owners, administrators) and per-user limits.
//! - `region`: valed's side of a port's shared memory (create, seal, map, initialise).
//! - `port`: a port, its rings, eventfds, counters and knobs.
//! - [`lookup`]: the lookup-module interface of stage 2 and the built-in modules.
//! - `wire`: EtherTypes, header lengths and IP protocol numbers, written once.
//! - `index`: a port's index and the switch's size (the leaf everyone imports).
//! - `offload`: virtio-net checksum/segmentation offload, carried or done in software.
//! - `forward`: the three-stage batched pipeline (VALE section 3.3, mSwitch lists).
//! - `capture`: copies of a port's frames into a ring a capturing client reads.
//! - `kind`: everything a port kind implements and registers with, the seam between the core
//!   and the kinds (no kind named there); re-exported by [`host`].
//! - [`host`]: the kinds whose client is valed itself (TAP, NIC, vhost-user), registered by
//!   name in [`host::KINDS`], and the threads that drive them.
//! - `worker`: forwarding threads that sleep on kick eventfds when there is no work.
//! - `switch`: a switch's port table and knobs.
//! - `engine`: every switch and worker; what the control plane calls.

mod access;
mod capture;
mod copy;
mod drive;
mod engine;
pub mod epoll;
mod error;
mod forward;
pub mod host;
mod index;
mod kind;
pub mod lookup;
mod offload;
mod port;
mod region;
mod sink;
mod switch;
mod wire;
mod worker;

pub use access::{Caller, UserLimits};
pub use capture::CaptureRing;
pub use engine::{Engine, EngineConfig, OpenedPort, SavedLookup};
pub use error::{Error, ErrorKind};
pub use port::{Port, PortShared};
pub use switch::DEFAULT_BATCH;
pub use worker::DEFAULT_SPIN;

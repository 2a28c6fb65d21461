//! The vale forwarding engine.
//!
//! - [`access`]: who may do what (callers, owners, administrators) and per-user limits.
//! - [`region`]: valed's side of a port's shared memory (create, seal, map, initialise).
//! - [`port`]: a port, its rings, eventfds, counters and knobs.
//! - [`lookup`]: the lookup-module interface of stage 2 and the learning bridge.
//! - [`wire`]: EtherTypes, header lengths and IP protocol numbers, written once.
//! - [`index`]: a port's index and the switch's size (the leaf everyone imports).
//! - [`offload`]: virtio-net checksum/segmentation offload, carried or done in software.
//! - [`forward`]: the three-stage batched pipeline (VALE section 3.3, mSwitch lists).
//! - [`kind`]: the seam between the core and the kinds of port (no kind named there).
//! - [`host`]: the kinds whose client is valed itself (TAP, NIC), registered by name.
//! - [`worker`]: forwarding threads that sleep on kick eventfds when there is no work.
//! - [`switch`]: a switch's port table and knobs.
//! - [`engine`]: every switch and worker; what the control plane calls.

pub mod access;
pub mod capture;
pub mod engine;
pub mod epoll;
pub mod error;
pub mod forward;
pub mod host;
pub mod index;
pub mod kind;
pub mod lookup;
pub mod offload;
pub mod port;
pub mod region;
pub mod switch;
pub mod wire;
pub mod worker;

pub use access::{Caller, UserLimits};
pub use engine::{Engine, EngineConfig, OpenedPort, SavedLookup};
pub use error::{Error, ErrorKind};

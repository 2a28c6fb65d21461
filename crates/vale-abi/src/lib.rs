//! The interface facts shared by valed and its clients.
//!
//! - [`netmap`]: the binary layout of netmap's `netmap_if`, `netmap_ring`, `netmap_slot`.
//! - [`csb`]: the per-ring Communication Status Block (netmap's `nm_csb_atok`/`nm_csb_ktoa`).
//! - [`eventfd`]: the kick lines (client to valed).
//! - [`pipe`]: the interrupt lines (valed to client).
//! - [`region`]: how one port's shared memory region is laid out, with magic and ABI version.
//! - [`name`]: the `valeX:Y` naming rules.
//! - [`control`]: the messages spoken on valed's control socket.
//! - [`rundir`]: the run directory, opened only when no other user can change its names.
//! - [`clock`]: a clock in nanoseconds.
//! - [`spin`]: busy waiting that gives way on a crowded CPU (clients and valed alike).
//!
//! `docs/abi.md` is the prose version of this crate; keep them in step.

pub mod capture;
pub mod clock;
pub mod control;
pub mod csb;
pub mod error;
pub mod eventfd;
pub mod name;
pub mod netmap;
pub mod pipe;
pub mod region;
pub mod rundir;
pub mod spin;

//! libvale: the client side of a vale port.
//!
//! ```no_run
//! let port = vale::Port::open("vale0:a")?;
//! let mut ring = port.tx_ring(0); // a view that borrows the port
//! while ring.space() > 0 {
//!     let cur = ring.cur();
//!     let (slot, buf) = ring.slot_and_buf(cur); // `&mut` only through `&mut ring`
//!     buf[..6].fill(0xff);
//!     slot.len = 60;
//!     ring.advance(1);
//! }
//! port.txsync(0)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! A port is a shared memory region laid out exactly as netmap's (`netmap_if`, `netmap_ring`,
//! `netmap_slot`) plus one CSB per ring. `txsync`/`rxsync` are in-process calls: they publish
//! the ring's `head`/`cur` in the CSB and pick up valed's `hwtail`, and make a system call only
//! when valed asked to be kicked. Use one thread per ring.
//!
//! [`Port::poll`] sleeps by default; [`Port::set_wait`] with [`Wait::Busy`] makes it spin on
//! the CSB instead, for the lowest latency (a core per waiting client; on a crowded CPU the
//! spin yields, or sleeps, as its [`Spinner`] says):
//!
//! ```no_run
//! let port = vale::Port::open("vale0:a")?;
//! port.set_wait(vale::Wait::Busy);
//! port.poll(vale::Events::READABLE, Some(std::time::Duration::from_millis(100)))?;
//! # Ok::<(), std::io::Error>(())
//! ```

mod capi;
mod connect;
mod port;

pub use port::{Events, OpenOptions, Port, Ring, RingSet, Wait, Waiter};
pub use vale_abi::control::PortCounters;
pub use vale_abi::netmap::{NetmapSlot, NS_BUF_CHANGED, NS_MOREFRAG, NS_NO_LEARN};
pub use vale_abi::region::{PortParams, DEFAULT_BUF_SIZE};
pub use vale_abi::spin::Spinner;

//! The forwarding pipeline of VALE section 3.3, with mSwitch's per-destination lists.
//!
//! One call of [`Pipeline::forward`] takes a batch from one source tx ring and runs:
//! 1. **gather**: read each slot once, check it, collect the frame's fragments, prefetch the
//!    payload;
//! 2. **lookup**: one call of the switch's lookup module for the whole batch;
//! 3. **deliver**: link the frames of each destination into a list, then serve every
//!    destination in one critical section, copying into that port's own buffers.
//!
//! Unicast costs the same whatever the number of ports: only destinations that have frames are
//! visited, unless the batch holds a flooded frame, which visits every port once per batch.
//! A full destination ring drops and counts; nothing here ever waits on a client.
//!
//! # Files
//!
//! Each stage is a child module with its own `impl Pipeline` block: `gather.rs` (stage 1 and
//! the entry points), `scope.rs` (stage 2, VLAN scoping included), `deliver.rs` (stage 3 into
//! rings), `direct.rs` (stage 3 into kinds that take frames from any thread), `captures.rs`
//! (copies for `vale-ctl capture`), `notify.rs` (interrupts and their moderation). This file
//! holds the scratch space they share.

use std::ptr;
use std::sync::atomic::{fence, Ordering::*};
use std::sync::Arc;
use std::time::Instant;

use vale_abi::netmap::{NetmapSlot, NS_INDIRECT, NS_MOREFRAG, NS_OFFLOAD};
use vale_abi::region::{prefetch, FIRST_SLOT_BUF, MAX_FRAGS, MAX_FRAME_LEN};

use crate::capture;
use crate::lookup::{
    FrameMeta, Lookup, SourcePort, Tagging, DEST_DROP, DEST_FLOOD, RING_ANY, VLAN_TAGGED, VLAN_VID,
};
use crate::offload::{Caps, Offload, Resolver};
use crate::port::{add, Irq, Port};
use crate::sink::{DirectSink, OutFrame, OutFrames};
use crate::switch::{PortTable, Switch, MAX_BATCH, MAX_PORTS};
use crate::wire;
use vale_abi::capture::{DIR_RX, DIR_TX};
use vale_abi::pipe;

mod captures;
mod deliver;
mod direct;
mod gather;
mod notify;
mod scope;

use deliver::*;
pub use notify::{IrqLine, Notifier};

const ETH_HLEN: u32 = wire::ETH_HLEN as u32;
const NIL: u16 = u16::MAX;

/// One fragment of a frame in the source port's memory.
#[derive(Clone, Copy)]
struct Frag {
    ptr: *const u8,
    len: u32,
}

/// What the engine keeps of a frame beside the lookup module's view of it ([`FrameMeta`]):
/// its fragments, its true length and its offload word, which no module sees or changes.
#[derive(Clone, Copy)]
struct Held {
    /// The frame's first fragment in `frags`, and how many it has.
    first: u32,
    count: u32,
    len: u32,
    /// The frame's offload word ([`Offload`]), 0 for none.
    offload: u64,
}

/// A worker's scratch space for one batch; allocated once, reused for every batch.
pub struct Pipeline {
    /// The lookup module's view of each frame, and the engine's own ([`Held`]).
    frames: Vec<FrameMeta>,
    held: Vec<Held>,
    /// Stage 2's rewritten batch for modules that do VLANs (see [`Pipeline::scope`]).
    scoped: (Vec<FrameMeta>, Vec<Held>),
    /// The ports of one VLAN but the source, and how each takes it: asked of the module once
    /// per VLAN per batch.
    members: Vec<(u16, Tagging)>,
    frags: Vec<Frag>,
    /// Next frame in the same destination list (mSwitch), or NIL.
    next: Vec<u16>,
    dst_head: Vec<u16>,
    dst_tail: Vec<u16>,
    /// Destinations whose list is not empty.
    active: Vec<u16>,
    /// Lists of frames to an rx ring the module chose: (port, ring, head, tail).
    chosen: Vec<(u16, u16, u16, u16)>,
    dst_bufs: Vec<*mut u8>,
    /// A frame's pieces for a direct write, behind one header.
    iov: Vec<libc::iovec>,
    /// Does offload work in software for ports that cannot take it.
    resolver: Resolver,
    /// The allocation of the list of a frame's pieces the resolver reads (see [`recycle`]).
    pieces: Vec<&'static [u8]>,
    /// Frames the resolver made for a direct sink: their bytes, and (start, length) of each.
    seg_store: Vec<u8>,
    seg_spans: Vec<(u32, u32)>,
    /// The batch's frames are in memory their writer shares and may change (a guest's, not a
    /// ring buffer): read to their exact length, and copied aside before offload work parses
    /// them.
    shared_source: bool,
    pub notifier: Notifier,
}

// SAFETY: the raw pointers are only meaningful during one `forward` call on one thread.
unsafe impl Send for Pipeline {}

impl Pipeline {
    pub fn new(epoch: Instant) -> Pipeline {
        let b = MAX_BATCH as usize;
        Pipeline {
            frames: Vec::with_capacity(b),
            held: Vec::with_capacity(b),
            scoped: (Vec::new(), Vec::new()),
            members: Vec::with_capacity(MAX_PORTS),
            frags: Vec::with_capacity(4 * b),
            next: vec![NIL; b],
            dst_head: vec![NIL; MAX_PORTS],
            dst_tail: vec![NIL; MAX_PORTS],
            active: Vec::with_capacity(MAX_PORTS),
            chosen: Vec::with_capacity(b),
            dst_bufs: Vec::with_capacity(MAX_FRAGS as usize),
            iov: Vec::with_capacity(1 + MAX_FRAGS as usize),
            resolver: Resolver::new(),
            pieces: Vec::with_capacity(MAX_FRAGS as usize),
            seg_store: Vec::new(),
            seg_spans: Vec::new(),
            shared_source: false,
            notifier: Notifier::new(epoch),
        }
    }
}

/// Empties a list of borrowed slices and keeps its allocation for the next list, whatever the
/// lifetime of its slices: the per-frame lists of pieces cost no allocation once grown.
/// (Collecting an emptied `Vec` through a map to an item of the same layout reuses its buffer;
/// a unit test holds that.)
pub(crate) fn recycle(mut list: Vec<&[u8]>) -> Vec<&'static [u8]> {
    list.clear();
    list.into_iter()
        .map(|_| -> &'static [u8] { unreachable!("the list is empty") })
        .collect()
}

/// How many frames lists `a` and `b` hold (each walked on its own: they share no frame).
fn count_lists(next: &[u16], a: u16, b: u16) -> u64 {
    let mut n = 0;
    for mut i in [a, b] {
        while i != NIL {
            i = next[i as usize];
            n += 1;
        }
    }
    n
}

/// Pops the lower-numbered head of two frame lists (they never share a frame). One list
/// alone, the common case, is best given as `a` (see [`Pipeline::deliver`]): a plain walk.
#[inline(always)]
fn take_next(next: &[u16], a: &mut u16, b: &mut u16) -> u16 {
    if *b == NIL {
        let i = *a;
        *a = next[i as usize];
        return i;
    }
    let from_a = *a != NIL && *a < *b;
    let list = if from_a { a } else { b };
    let i = *list;
    *list = next[i as usize];
    i
}

#[cfg(test)]
mod tests {
    use super::recycle;

    #[test]
    fn recycle_keeps_the_allocation() {
        let mut spare: Vec<&'static [u8]> = Vec::with_capacity(512);
        let buf = spare.as_ptr();
        let data = [1u8, 2, 3];
        let mut list: Vec<&[u8]> = std::mem::take(&mut spare);
        list.extend([&data[..1], &data[1..]]);
        spare = recycle(list);
        assert!(spare.is_empty());
        assert_eq!((spare.as_ptr(), spare.capacity()), (buf, 512));
    }
}

//! The capture ring: copies of a port's frames that valed makes for `vale-ctl capture`.
//!
//! A capture is a sealed memfd (it cannot shrink or grow) that valed maps and hands to the
//! one control connection that asked for it. Page 0 is a header; the records follow, each
//! `rec_size` bytes: a [`RecordHeader`], then at most `snaplen` bytes of the frame. valed is
//! the only producer: it writes records at `head % records` and then publishes `head`
//! (release); the reader consumes up to `head` and publishes `tail`. When the ring is full,
//! valed counts the frame in `drops` and goes on: a slow or stopped reader never slows the
//! switch down nor costs the port a frame. valed reads `tail` once per batch and never trusts
//! it: a `tail` that does not lie within `records` behind `head` reads as a full ring.
//! Frames that valed's budget for the capture owner's filters left unfiltered are counted apart,
//! in `over_budget` (a field older valeds leave at 0).

use std::sync::atomic::{AtomicU32, AtomicU64};

/// "VCAP".
pub const CAPTURE_MAGIC: u32 = 0x5041_4356;
pub const CAPTURE_VERSION: u32 = 1;
/// Offset of the first record.
pub const CAPTURE_RECORDS_OFFSET: usize = 4096;
/// Bytes of a record before its frame.
pub const RECORD_HEADER: usize = 24;
/// A frame the port sent into the switch (pcapng: outbound from the port).
pub const DIR_TX: u32 = 1;
/// A frame the switch delivered to the port (pcapng: inbound to the port).
pub const DIR_RX: u32 = 2;
/// Largest snap length.
pub const MAX_SNAPLEN: u32 = 65535;
/// Largest capture buffer.
pub const MAX_CAPTURE_BYTES: u64 = 256 << 20;

/// Page 0 of a capture memfd.
#[repr(C)]
pub struct CaptureHeader {
    pub magic: u32,
    pub version: u32,
    /// Bytes of each record (header and frame), a multiple of 8.
    pub rec_size: u32,
    /// Records in the ring.
    pub records: u32,
    pub snaplen: u32,
    /// [`DIR_TX`] | [`DIR_RX`]: what is captured.
    pub dirs: u32,
    _pad0: [u8; 40],
    /// Records written (valed; release after the records).
    pub head: AtomicU64,
    _pad1: [u8; 56],
    /// Records consumed (the reader).
    pub tail: AtomicU64,
    _pad2: [u8; 56],
    /// Frames not captured because the ring was full.
    pub drops: AtomicU64,
    /// 1 once valed has ended the capture: the port went away (nothing more will come).
    pub ended: AtomicU32,
    _pad3: u32,
    /// Frames not captured because the filter budget of the capture's owner was spent (see
    /// valed's `vale_switch::capture`): the filter did not run on them.
    pub over_budget: AtomicU64,
}

/// The start of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordHeader {
    /// CLOCK_REALTIME, nanoseconds.
    pub ts_ns: u64,
    /// The frame's length on the wire.
    pub orig_len: u32,
    /// Bytes of it that follow (at most `snaplen`).
    pub cap_len: u32,
    /// [`DIR_TX`] or [`DIR_RX`].
    pub dir: u32,
    pub _pad: u32,
}

/// Record size for `snaplen`.
pub fn record_size(snaplen: u32) -> usize {
    (RECORD_HEADER + snaplen as usize).next_multiple_of(8)
}

const _: () = assert!(std::mem::size_of::<RecordHeader>() == RECORD_HEADER);
const _: () = assert!(std::mem::offset_of!(CaptureHeader, head) == 64);
const _: () = assert!(std::mem::offset_of!(CaptureHeader, tail) == 128);
const _: () = assert!(std::mem::offset_of!(CaptureHeader, drops) == 192);
const _: () = assert!(std::mem::offset_of!(CaptureHeader, over_budget) == 208);

/// One classic BPF instruction (`struct bpf_insn`), of a capture filter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BpfInsn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

//! The memif protocol's layouts: control messages (one 128-byte message per `SOCK_SEQPACKET`
//! packet) and, in the client's shared memory, rings and their descriptors. Each is a plain
//! `repr(C, packed)` view of the bytes with its size asserted at compile time, as DPDK's
//! `drivers/net/memif/memif.h` and libmemif's `memif.h` lay them out (memif version 2.0).
//!
//! Nothing read through these views is trusted: a message is copied out of the receive buffer
//! whole and checked field by field by the session; the ring's indices and descriptors live in
//! the client's memory and are read once (volatile) and checked by `ring.rs` before any use.

use std::mem::size_of;

/// `MEMIF_COOKIE`: the first word of every ring.
pub const COOKIE: u32 = 0x3E31F20;
/// `MEMIF_VERSION`: major 2, minor 0 (what DPDK 22.11 and VPP speak; the client's INIT must
/// carry exactly this).
pub const VERSION: u16 = 2 << 8;
/// Bytes of a name field (`MEMIF_NAME_SZ`).
pub const NAME_LEN: usize = 32;
/// Bytes of every control message (`memif_msg_t`, aligned to 128).
pub const MSG_LEN: usize = 128;

/// `memif_msg_type_t`.
pub mod msg {
    pub const ACK: u16 = 1;
    pub const HELLO: u16 = 2;
    pub const INIT: u16 = 3;
    pub const ADD_REGION: u16 = 4;
    pub const ADD_RING: u16 = 5;
    pub const CONNECT: u16 = 6;
    pub const CONNECTED: u16 = 7;
    pub const DISCONNECT: u16 = 8;
}

/// `MEMIF_INTERFACE_MODE_ETHERNET`, the only mode served.
pub const MODE_ETHERNET: u8 = 0;
/// `MEMIF_MSG_ADD_RING_FLAG_C2S` (DPDK's older name: `_S2M`): the ring carries frames from the
/// client to the server.
pub const ADD_RING_FLAG_C2S: u16 = 1;
/// `MEMIF_RING_FLAG_MASK_INT`, set in a ring's `flags` by its receiver: "I poll, do not
/// write my interrupt eventfd".
pub const RING_FLAG_MASK_INT: u16 = 1;
/// `MEMIF_DESC_FLAG_NEXT`: the frame goes on in the next descriptor.
pub const DESC_FLAG_NEXT: u16 = 1;

/// `memif_msg_hello_t`: the server's first word.
#[repr(C, packed)]
#[derive(Clone, Copy, Default)]
pub struct Hello {
    pub name: [u8; NAME_LEN],
    pub min_version: u16,
    pub max_version: u16,
    /// Highest region index taken.
    pub max_region: u16,
    /// Highest ring index taken, each way.
    pub max_c2s_ring: u16,
    pub max_s2c_ring: u16,
    pub max_log2_ring_size: u8,
}

/// `memif_msg_init_t`: the client names the interface (`id`) it wants.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct Init {
    pub version: u16,
    pub id: u32,
    pub mode: u8,
    pub secret: [u8; 24],
    pub name: [u8; NAME_LEN],
}

/// `memif_msg_add_region_t`; the region's file descriptor comes with it (SCM_RIGHTS).
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct AddRegion {
    pub index: u16,
    pub size: u64,
}

/// `memif_msg_add_ring_t`; the ring's interrupt eventfd comes with it (SCM_RIGHTS).
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct AddRing {
    pub flags: u16,
    pub index: u16,
    pub region: u16,
    pub offset: u32,
    pub log2_ring_size: u8,
    pub private_hdr_size: u16,
}

/// `memif_msg_connect_t` and `memif_msg_connected_t`.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct Connect {
    pub if_name: [u8; NAME_LEN],
}

/// `memif_msg_disconnect_t`.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct Disconnect {
    pub code: u32,
    pub string: [u8; 96],
}

/// `memif_msg_t`: a type and the body (a union in C) right after it.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct Msg {
    pub kind: u16,
    pub body: [u8; MSG_LEN - 2],
}

const _: () = assert!(size_of::<Hello>() == 43);
const _: () = assert!(size_of::<Init>() == 63);
const _: () = assert!(size_of::<AddRegion>() == 10);
const _: () = assert!(size_of::<AddRing>() == 13);
const _: () = assert!(size_of::<Connect>() == 32);
const _: () = assert!(size_of::<Disconnect>() == 100);
const _: () = assert!(size_of::<Msg>() == MSG_LEN);

/// A plain-bytes body of a message: any bit pattern is a value.
///
/// # Safety
/// Only for `repr(C, packed)` structs of integers and byte arrays.
pub unsafe trait Body: Copy {
    const KIND: u16;
}
// SAFETY: each is repr(C, packed) of integers and byte arrays.
unsafe impl Body for Hello {
    const KIND: u16 = msg::HELLO;
}
// SAFETY: as above.
unsafe impl Body for Init {
    const KIND: u16 = msg::INIT;
}
// SAFETY: as above.
unsafe impl Body for AddRegion {
    const KIND: u16 = msg::ADD_REGION;
}
// SAFETY: as above.
unsafe impl Body for AddRing {
    const KIND: u16 = msg::ADD_RING;
}
// SAFETY: as above.
unsafe impl Body for Connect {
    const KIND: u16 = msg::CONNECTED;
}
// SAFETY: as above.
unsafe impl Body for Disconnect {
    const KIND: u16 = msg::DISCONNECT;
}

impl Msg {
    /// A message of type `kind` with an all-zero body (an ACK, say).
    pub fn empty(kind: u16) -> Msg {
        Msg {
            kind,
            body: [0; MSG_LEN - 2],
        }
    }

    /// A message carrying `body`.
    pub fn with<B: Body>(body: B) -> Msg {
        let mut m = Msg::empty(B::KIND);
        // SAFETY: B is plain bytes (see `Body`) and shorter than the body (asserted above for
        // each implementor: all are under 126 bytes).
        unsafe {
            std::ptr::copy_nonoverlapping(
                &body as *const B as *const u8,
                m.body.as_mut_ptr(),
                size_of::<B>(),
            )
        };
        m
    }

    /// The body read as `B` (whatever the type field says: the caller looked).
    pub fn body<B: Body>(&self) -> B {
        // SAFETY: B is plain bytes (see `Body`), shorter than the body; unaligned read.
        unsafe { std::ptr::read_unaligned(self.body.as_ptr() as *const B) }
    }

    pub fn as_bytes(&self) -> &[u8; MSG_LEN] {
        // SAFETY: Msg is exactly MSG_LEN plain bytes.
        unsafe { &*(self as *const Msg as *const [u8; MSG_LEN]) }
    }

    pub fn from_bytes(b: &[u8; MSG_LEN]) -> Msg {
        // SAFETY: any MSG_LEN bytes are a Msg.
        unsafe { std::ptr::read_unaligned(b.as_ptr() as *const Msg) }
    }
}

/// `name` as a NUL-padded name field (cut to fit, the last byte kept NUL).
pub fn name_field(name: &str) -> [u8; NAME_LEN] {
    let mut f = [0u8; NAME_LEN];
    let n = name.len().min(NAME_LEN - 1);
    f[..n].copy_from_slice(&name.as_bytes()[..n]);
    f
}

/// A name field as text: up to its first NUL, non-printable bytes replaced (it is the
/// client's, shown in `vale-ctl list` and logs).
pub fn field_text(f: &[u8]) -> String {
    let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    f[..end]
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

/// `memif_desc_t`: one buffer of a ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Desc {
    pub flags: u16,
    pub region: u16,
    pub length: u32,
    pub offset: u32,
    pub metadata: u32,
}
const _: () = assert!(size_of::<Desc>() == 16);

/// `memif_ring_t`, by offsets from its start: the cookie and the flags, the head (its
/// producer's: the client on C2S rings; on S2C rings the client too, which gives buffers), in
/// the first cache line; the tail (the consumer's: valed on C2S rings; on S2C rings valed,
/// which fills them) in the second; the descriptors from the third on (64-byte cache lines, as
/// DPDK builds it on x86 and arm64).
pub mod ring {
    pub const COOKIE: usize = 0;
    pub const FLAGS: usize = 4;
    pub const HEAD: usize = 6;
    pub const TAIL: usize = 64;
    pub const DESC: usize = 128;
    /// Bytes of a ring of `1 << log2` descriptors.
    pub fn bytes(log2: u8) -> u64 {
        DESC as u64 + (16u64 << log2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_sit_right_after_the_type() {
        let m = Msg::with(AddRing {
            flags: ADD_RING_FLAG_C2S,
            index: 3,
            region: 1,
            offset: 0x1020_3040,
            log2_ring_size: 10,
            private_hdr_size: 0,
        });
        let b = m.as_bytes();
        assert_eq!(&b[..2], &msg::ADD_RING.to_le_bytes());
        assert_eq!(&b[2..4], &1u16.to_le_bytes());
        assert_eq!(&b[4..6], &3u16.to_le_bytes());
        assert_eq!(&b[8..12], &0x1020_3040u32.to_le_bytes());
        assert_eq!(b[12], 10);
        let back: AddRing = Msg::from_bytes(b).body();
        assert_eq!({ back.offset }, 0x1020_3040);
        assert_eq!(ring::bytes(10), 128 + 16 * 1024);
    }

    #[test]
    fn names_are_cut_and_shown_safely() {
        assert_eq!(field_text(&name_field("vale0:cnf")), "vale0:cnf");
        assert_eq!(name_field(&"x".repeat(40))[NAME_LEN - 1], 0);
        assert_eq!(field_text(b"a\x01b\0zz"), "a?b");
    }
}

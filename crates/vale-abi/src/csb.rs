//! The per-ring Communication Status Block, netmap's "CSB mode" layout.
//!
//! One pair per ring: [`CsbAtok`] is written by the application (the client) and read by valed,
//! [`CsbKtoa`] is written by valed and read by the client. Each is padded to its own 64-byte
//! cache line so the two writers never share a line.

use std::sync::atomic::AtomicU32;

/// `struct nm_csb_atok`: application to kernel (client to valed).
#[repr(C, align(64))]
pub struct CsbAtok {
    /// The client's `ring->head`.
    pub head: AtomicU32,
    /// The client's `ring->cur`.
    pub cur: AtomicU32,
    /// Set by the client before it sleeps: valed must raise the ring's interrupt eventfd after
    /// it moves `hwtail`.
    pub appl_need_kick: AtomicU32,
    /// The flags of the client's last sync (informational).
    pub sync_flags: AtomicU32,
    pub pad: [u32; 12],
}

/// `struct nm_csb_ktoa`: kernel to application (valed to client).
#[repr(C, align(64))]
pub struct CsbKtoa {
    /// The first slot valed has not yet processed (netmap's `hwcur`).
    pub hwcur: AtomicU32,
    /// netmap's `hwtail`: the client's `ring->tail`.
    pub hwtail: AtomicU32,
    /// Set by valed while it sleeps on this ring: the client must write the ring's kick eventfd
    /// after it publishes a new `head`.
    pub kern_need_kick: AtomicU32,
    pub pad: [u32; 13],
}

/// Bytes of CSB per ring: one `atok` then one `ktoa`.
pub const CSB_RING_SIZE: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_netmap() {
        assert_eq!(size_of::<CsbAtok>(), 64);
        assert_eq!(size_of::<CsbKtoa>(), 64);
        assert_eq!(offset_of!(CsbAtok, appl_need_kick), 8);
        assert_eq!(offset_of!(CsbAtok, sync_flags), 12);
        assert_eq!(offset_of!(CsbKtoa, kern_need_kick), 8);
    }
}

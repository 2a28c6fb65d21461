//! What a front end and valed negotiate: the virtio-net features offered and acked, the MTU,
//! and the description of them `vale-ctl list` shows.

use super::*;

/// The virtio-net features offered (besides VERSION_1 and vhost-user's protocol features).
pub(super) const NET_FEATURES: &[u32] = &[
    VIRTIO_NET_F_CSUM,
    VIRTIO_NET_F_GUEST_CSUM,
    VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_ECN,
    VIRTIO_NET_F_HOST_TSO4,
    VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_HOST_ECN,
    VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_NET_F_MQ,
    VIRTIO_NET_F_MTU,
    VIRTIO_NET_F_STATUS,
];

/// The name of a feature of [`NET_FEATURES`], as the virtio spec writes it.
pub(super) fn feature_name(bit: u32) -> &'static str {
    match bit {
        VIRTIO_NET_F_CSUM => "csum",
        VIRTIO_NET_F_GUEST_CSUM => "guest_csum",
        VIRTIO_NET_F_GUEST_TSO4 => "guest_tso4",
        VIRTIO_NET_F_GUEST_TSO6 => "guest_tso6",
        VIRTIO_NET_F_GUEST_ECN => "guest_ecn",
        VIRTIO_NET_F_HOST_TSO4 => "host_tso4",
        VIRTIO_NET_F_HOST_TSO6 => "host_tso6",
        VIRTIO_NET_F_HOST_ECN => "host_ecn",
        VIRTIO_NET_F_MRG_RXBUF => "mrg_rxbuf",
        VIRTIO_RING_F_EVENT_IDX => "event_idx",
        VIRTIO_NET_F_MQ => "mq",
        VIRTIO_NET_F_MTU => "mtu",
        VIRTIO_NET_F_STATUS => "status",
        _ => "?",
    }
}

pub(super) fn has(features: u64, bit: u32) -> bool {
    features & (1u64 << bit) != 0
}

/// What the guest acked, as the data path needs it.
#[derive(Clone, Copy, Default)]
pub(super) struct Acked {
    /// The guest may send partial checksums, and TSO segments of these kinds.
    pub(super) tx_csum: bool,
    pub(super) tx_tso4: bool,
    pub(super) tx_tso6: bool,
    pub(super) tx_ecn: bool,
    /// A frame toward the guest may span several rx chains.
    pub(super) mrg_rxbuf: bool,
    /// Notifications are suppressed by event indices (the device may ask for a kick only
    /// after several chains: see [`super::rx`]'s kick moderation).
    pub(super) event_idx: bool,
    /// Longest frame without segmentation either way: the MTU the front end set plus an
    /// Ethernet header and a VLAN tag, once the guest acked VIRTIO_NET_F_MTU (the virtio
    /// spec: the driver sends nothing longer, the device delivers nothing longer).
    pub(super) max_frame: usize,
}

impl Acked {
    /// `f`: the features acked; `mtu`: what the front end set (0: none).
    pub(super) fn of(f: u64, mtu: u32) -> Acked {
        let tx_csum = has(f, VIRTIO_NET_F_CSUM);
        Acked {
            tx_csum,
            tx_tso4: tx_csum && has(f, VIRTIO_NET_F_HOST_TSO4),
            tx_tso6: tx_csum && has(f, VIRTIO_NET_F_HOST_TSO6),
            tx_ecn: tx_csum && has(f, VIRTIO_NET_F_HOST_ECN),
            mrg_rxbuf: has(f, VIRTIO_NET_F_MRG_RXBUF),
            event_idx: has(f, VIRTIO_RING_F_EVENT_IDX),
            max_frame: match mtu {
                m if m != 0 && has(f, VIRTIO_NET_F_MTU) => m as usize + MTU_OVERHEAD,
                _ => MAX_GUEST_FRAME,
            },
        }
    }

    /// The port's capabilities toward the guest.
    pub(super) fn caps(f: u64) -> Caps {
        let csum = has(f, VIRTIO_NET_F_GUEST_CSUM);
        Caps::NONE
            .with(Caps::CSUM, csum)
            .with(Caps::TSO4, csum && has(f, VIRTIO_NET_F_GUEST_TSO4))
            .with(Caps::TSO6, csum && has(f, VIRTIO_NET_F_GUEST_TSO6))
            .with(Caps::ECN, csum && has(f, VIRTIO_NET_F_GUEST_ECN))
    }

    /// The offload request of a guest's tx header, checked against what the guest negotiated
    /// and against the frame's length (`flen`): None for a finished frame.
    pub(super) fn offload(&self, hdr: &[u8; HDR_LEN], flen: usize) -> Result<Option<Offload>, Bad> {
        if hdr[0] & offload::F_NEEDS_CSUM == 0 && hdr[1] == offload::GSO_NONE {
            // The common case: no checksum asked for, no segmentation (what follows would
            // find the same).
            return Ok(None);
        }
        let mut h = [0u8; offload::VNET_HDR_LEN];
        h.copy_from_slice(&hdr[..offload::VNET_HDR_LEN]);
        let mut off = Offload::from_virtio(&h);
        // DATA_VALID and unknown bits mean nothing from a driver.
        off.flags &= offload::F_NEEDS_CSUM;
        let ecn = off.gso_type & offload::GSO_ECN != 0;
        let allowed = match off.gso_type & !offload::GSO_ECN {
            offload::GSO_NONE => !ecn,
            offload::GSO_TCPV4 => self.tx_tso4 && (!ecn || self.tx_ecn),
            offload::GSO_TCPV6 => self.tx_tso6 && (!ecn || self.tx_ecn),
            _ => false,
        };
        let csum = off.flags & offload::F_NEEDS_CSUM != 0;
        let segment = off.gso_type != offload::GSO_NONE;
        if !allowed || (csum && !self.tx_csum) || (segment && (!csum || off.gso_size == 0)) {
            return Err(Bad::Offload(off));
        }
        if csum && off.csum_start as usize + off.csum_offset as usize + 2 > flen {
            return Err(Bad::Offload(off));
        }
        Ok(off.needs_work().then_some(off))
    }
}

/// What a frame may hold beyond its MTU: an Ethernet header and a VLAN tag.
pub(super) const MTU_OVERHEAD: usize = 18;

/// Largest MTU a front end may set: the largest frame less [`MTU_OVERHEAD`].
pub(super) const MAX_MTU: u64 = (MAX_FRAME_LEN as usize - MTU_OVERHEAD) as u64;

impl Net {
    /// The MTU the front end gives the guest (NET_SET_MTU): false when out of range. It holds
    /// for every chain the guest makes available after the answer: each pair's worker reads
    /// the MTU at each pass, and a pass begun before the change (which may still take chains
    /// posted after it) is waited for (its steps held for the pass). A front end that keeps
    /// its worker busy-polling without end keeps its own answer waiting, nobody else's.
    pub(super) fn set_mtu(&self, mtu: u64) -> bool {
        if !(68..=MAX_MTU).contains(&mtu) {
            return false;
        }
        self.0.mtu.store(mtu as u32, Relaxed);
        for pair in &self.0.pairs {
            drop(lock(&pair.steps));
        }
        self.describe();
        true
    }

    /// What the guest negotiated, with the MTU the front end set.
    pub(super) fn acked_now(&self) -> Acked {
        Acked::of(self.0.features.load(Relaxed), self.0.mtu.load(Relaxed))
    }

    pub(super) fn acked(&self, features: u64) {
        self.0.features.store(features, Relaxed);
        let caps = Acked::caps(features);
        for pair in &self.0.pairs {
            lock(&pair.steps).set_caps(caps);
        }
        self.describe();
    }

    /// What `vale-ctl list` shows of the connection: features, queue pairs, MTU, offloads.
    pub(super) fn describe(&self) {
        // Held while the state is read, not only while it is written: each caller changes its
        // part before it describes, so the last to write has read every change (two threads
        // describing at once could otherwise leave the older reading shown for good).
        let mut shown = lock(&self.0.state.negotiated);
        let features = self.0.features.load(Relaxed);
        let names: Vec<&str> = NET_FEATURES
            .iter()
            .filter(|&&bit| has(features, bit))
            .map(|&bit| feature_name(bit))
            .collect();
        let offloads = match Acked::caps(features).names() {
            n if n.is_empty() => "none".to_string(),
            n => n.join(","),
        };
        let mtu = match self.0.mtu.load(Relaxed) {
            0 => String::new(),
            m => format!("; mtu {m}"),
        };
        *shown = format!(
            "features {}; queue pairs {} in use of {}{mtu}; offloads to the guest {offloads}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(",")
            },
            self.0.enabled.load(Relaxed).count_ones(),
            self.0.pairs.len(),
        );
    }
}

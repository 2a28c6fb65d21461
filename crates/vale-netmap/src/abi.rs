//! netmap's control requests (API 14), field for field: what a netmap program passes to the
//! control device's ioctls. Interface facts, as in `net/netmap.h`.

pub const NETMAP_API: u16 = 14;
pub const REQ_IFNAMSIZ: usize = 64;
pub const IFNAMSIZ: usize = 16;

/// `_IOWR('i', 151, struct nmreq_header)`
pub const NIOCCTRL: u64 = 0xc058_6997;
/// `_IO('i', 148)`
pub const NIOCTXSYNC: u64 = 0x6994;
/// `_IO('i', 149)`
pub const NIOCRXSYNC: u64 = 0x6995;
/// `_IOWR('i', 146, struct nmreq)`
pub const NIOCREGIF: u64 = 0xc03c_6992;
/// `_IOWR('i', 145, struct nmreq)`
pub const NIOCGINFO: u64 = 0xc03c_6991;

// nmreq_header.nr_reqtype
pub const REQ_REGISTER: u16 = 1;
pub const REQ_PORT_INFO_GET: u16 = 2;
pub const REQ_PORT_HDR_SET: u16 = 6;
pub const REQ_PORT_HDR_GET: u16 = 7;

// nmreq_register.nr_mode
pub const REG_DEFAULT: u32 = 0;
pub const REG_ALL_NIC: u32 = 1;
pub const REG_SW: u32 = 2;
pub const REG_NIC_SW: u32 = 3;
pub const REG_ONE_NIC: u32 = 4;
pub const REG_PIPE_MASTER: u32 = 5;
pub const REG_PIPE_SLAVE: u32 = 6;
pub const REG_NULL: u32 = 7;
pub const REG_ONE_SW: u32 = 8;

// nmreq_register.nr_flags
pub const NR_MONITOR_TX: u64 = 0x100;
pub const NR_MONITOR_RX: u64 = 0x200;
pub const NR_ZCOPY_MON: u64 = 0x400;
pub const NR_RX_RINGS_ONLY: u64 = 0x2000;
pub const NR_TX_RINGS_ONLY: u64 = 0x4000;

// legacy nmreq.nr_ringid
pub const NETMAP_HW_RING: u16 = 0x4000;
pub const NETMAP_SW_RING: u16 = 0x2000;
pub const NETMAP_RING_MASK: u16 = 0x0fff;
pub const NR_REG_MASK: u32 = 0xf;

/// `struct nmreq_option`
#[repr(C)]
pub struct NmreqOption {
    pub nro_next: u64,
    pub nro_reqtype: u32,
    pub nro_status: u32,
    pub nro_size: u64,
}

/// `struct nmreq_header`
#[repr(C)]
pub struct NmreqHeader {
    pub nr_version: u16,
    pub nr_reqtype: u16,
    pub nr_reserved: u32,
    pub nr_name: [u8; REQ_IFNAMSIZ],
    pub nr_options: u64,
    pub nr_body: u64,
}

/// `struct nmreq_register`
#[repr(C)]
pub struct NmreqRegister {
    pub nr_offset: u64,
    pub nr_memsize: u64,
    pub nr_tx_slots: u32,
    pub nr_rx_slots: u32,
    pub nr_tx_rings: u16,
    pub nr_rx_rings: u16,
    pub nr_host_tx_rings: u16,
    pub nr_host_rx_rings: u16,
    pub nr_mem_id: u16,
    pub nr_ringid: u16,
    pub nr_mode: u32,
    pub nr_extra_bufs: u32,
    pub nr_flags: u64,
}

/// `struct nmreq_port_info_get`
#[repr(C)]
pub struct NmreqPortInfoGet {
    pub nr_memsize: u64,
    pub nr_tx_slots: u32,
    pub nr_rx_slots: u32,
    pub nr_tx_rings: u16,
    pub nr_rx_rings: u16,
    pub nr_host_tx_rings: u16,
    pub nr_host_rx_rings: u16,
    pub nr_mem_id: u16,
    pub pad: [u16; 3],
}

/// `struct nmreq_port_hdr`
#[repr(C)]
pub struct NmreqPortHdr {
    pub nr_hdr_len: u32,
    pub nr_pad: u32,
}

/// The legacy `struct nmreq` of `NIOCREGIF` and `NIOCGINFO`.
#[repr(C)]
pub struct Nmreq {
    pub nr_name: [u8; IFNAMSIZ],
    pub nr_version: u32,
    pub nr_offset: u32,
    pub nr_memsize: u32,
    pub nr_tx_slots: u32,
    pub nr_rx_slots: u32,
    pub nr_tx_rings: u16,
    pub nr_rx_rings: u16,
    pub nr_ringid: u16,
    pub nr_cmd: u16,
    pub nr_arg1: u16,
    pub nr_arg2: u16,
    pub nr_arg3: u32,
    pub nr_flags: u32,
    pub spare2: [u32; 1],
}

/// The name in a fixed-size, NUL-padded field (up to the first NUL).
pub fn name_of(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The sizes and offsets netmap's header gives (checked against it when written).
    #[test]
    fn layout_matches_netmap() {
        assert_eq!(size_of::<NmreqHeader>(), 88);
        assert_eq!(offset_of!(NmreqHeader, nr_options), 72);
        assert_eq!(offset_of!(NmreqHeader, nr_body), 80);
        assert_eq!(size_of::<NmreqRegister>(), 56);
        assert_eq!(offset_of!(NmreqRegister, nr_mem_id), 32);
        assert_eq!(offset_of!(NmreqRegister, nr_mode), 36);
        assert_eq!(offset_of!(NmreqRegister, nr_flags), 48);
        assert_eq!(size_of::<NmreqPortInfoGet>(), 32);
        assert_eq!(size_of::<NmreqOption>(), 24);
        assert_eq!(size_of::<Nmreq>(), 60);
        assert_eq!(offset_of!(Nmreq, nr_ringid), 40);
        assert_eq!(offset_of!(Nmreq, nr_arg2), 46);
        assert_eq!(offset_of!(Nmreq, nr_flags), 52);
        // _IOWR('i', nr, size) = 3 << 30 | size << 16 | 'i' << 8 | nr
        let iowr = |nr: u64, size: usize| 3 << 30 | (size as u64) << 16 | 0x69 << 8 | nr;
        assert_eq!(NIOCCTRL, iowr(151, size_of::<NmreqHeader>()));
        assert_eq!(NIOCREGIF, iowr(146, size_of::<Nmreq>()));
        assert_eq!(NIOCGINFO, iowr(145, size_of::<Nmreq>()));
    }
}

//! Kernel ABI pieces that `libc` does not carry (or carries behind version-dependent paths),
//! written from the uapi headers (`linux/bpf.h`, `linux/if_xdp.h`, `linux/if_packet.h`,
//! `linux/ethtool.h`), plus small owners for file descriptors and mappings.

use std::ffi::{c_int, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

// --- bpf(2) ---------------------------------------------------------------------------------

pub const BPF_MAP_CREATE: c_int = 0;
pub const BPF_MAP_UPDATE_ELEM: c_int = 2;
pub const BPF_PROG_LOAD: c_int = 5;
pub const BPF_LINK_CREATE: c_int = 28;

pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
pub const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type` value of `BPF_XDP`.
pub const BPF_XDP: u32 = 37;

pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

pub const XDP_PASS: i32 = 2;
pub const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `src_reg` of a 64-bit immediate load that names a map by file descriptor.
pub const BPF_PSEUDO_MAP_FD: u8 = 1;

/// One eBPF instruction (`struct bpf_insn`): `regs` holds dst in the low nibble, src in the high.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BpfInsn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl BpfInsn {
    pub const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
        BpfInsn {
            code,
            regs: (dst & 0xf) | ((src & 0xf) << 4),
            off,
            imm,
        }
    }
}

/// The `BPF_MAP_CREATE` member of `union bpf_attr`, up to `map_name`.
#[repr(C)]
#[derive(Default)]
pub struct MapCreateAttr {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub inner_map_fd: u32,
    pub numa_node: u32,
    pub map_name: [u8; 16],
}

/// The `BPF_MAP_*_ELEM` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
pub struct MapElemAttr {
    pub map_fd: u32,
    pub _pad: u32,
    pub key: u64,
    pub value: u64,
    pub flags: u64,
}

/// The `BPF_PROG_LOAD` member of `union bpf_attr`, up to `expected_attach_type`.
#[repr(C)]
#[derive(Default)]
pub struct ProgLoadAttr {
    pub prog_type: u32,
    pub insn_cnt: u32,
    pub insns: u64,
    pub license: u64,
    pub log_level: u32,
    pub log_size: u32,
    pub log_buf: u64,
    pub kern_version: u32,
    pub prog_flags: u32,
    pub prog_name: [u8; 16],
    pub prog_ifindex: u32,
    pub expected_attach_type: u32,
}

/// The `BPF_LINK_CREATE` member of `union bpf_attr`, up to `flags`.
#[repr(C)]
#[derive(Default)]
pub struct LinkCreateAttr {
    pub prog_fd: u32,
    pub target_ifindex: u32,
    pub attach_type: u32,
    pub flags: u32,
}

/// Runs one bpf(2) command; `attr` is one member of `union bpf_attr` (the kernel zero-fills the
/// rest because we pass our own size).
pub fn bpf<T>(cmd: c_int, attr: &mut T) -> io::Result<c_int> {
    // SAFETY: `attr` is a live, properly sized `repr(C)` member of `union bpf_attr`; any pointers
    // inside it were set by the caller to buffers that outlive this call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut c_void,
            std::mem::size_of::<T>() as u32,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as c_int)
    }
}

// --- AF_XDP (linux/if_xdp.h) ----------------------------------------------------------------

pub const SOL_XDP: c_int = 283;
pub const XDP_MMAP_OFFSETS: c_int = 1;
pub const XDP_RX_RING: c_int = 2;
pub const XDP_TX_RING: c_int = 3;
pub const XDP_UMEM_REG: c_int = 4;
pub const XDP_UMEM_FILL_RING: c_int = 5;
pub const XDP_UMEM_COMPLETION_RING: c_int = 6;
pub const XDP_STATISTICS: c_int = 7;

pub const XDP_COPY: u16 = 1 << 1;
pub const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
pub const XDP_RING_NEED_WAKEUP: u32 = 1 << 0;

pub const XDP_PGOFF_RX_RING: i64 = 0;
pub const XDP_PGOFF_TX_RING: i64 = 0x8000_0000;
pub const XDP_UMEM_PGOFF_FILL_RING: i64 = 0x1_0000_0000;
pub const XDP_UMEM_PGOFF_COMPLETION_RING: i64 = 0x1_8000_0000;

/// Headroom the kernel leaves in front of a received frame in each UMEM chunk.
pub const XDP_PACKET_HEADROOM: usize = 256;

#[repr(C)]
pub struct SockaddrXdp {
    pub family: u16,
    pub flags: u16,
    pub ifindex: u32,
    pub queue_id: u32,
    pub shared_umem_fd: u32,
}

/// `struct xdp_umem_reg` with `flags` and `tx_metadata_len` (both zero here).
#[repr(C)]
#[derive(Default)]
pub struct XdpUmemReg {
    pub addr: u64,
    pub len: u64,
    pub chunk_size: u32,
    pub headroom: u32,
    pub flags: u32,
    pub tx_metadata_len: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct XdpRingOffset {
    pub producer: u64,
    pub consumer: u64,
    pub desc: u64,
    pub flags: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct XdpMmapOffsets {
    pub rx: XdpRingOffset,
    pub tx: XdpRingOffset,
    pub fr: XdpRingOffset,
    pub cr: XdpRingOffset,
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct XdpDesc {
    pub addr: u64,
    pub len: u32,
    pub options: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct XdpStatistics {
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

// --- AF_PACKET (linux/if_packet.h) ----------------------------------------------------------

pub const SOL_PACKET: c_int = 263;
pub const PACKET_ADD_MEMBERSHIP: c_int = 1;
pub const PACKET_RX_RING: c_int = 5;
pub const PACKET_STATISTICS: c_int = 6;
pub const PACKET_VERSION: c_int = 10;
pub const PACKET_TX_RING: c_int = 13;
pub const PACKET_LOSS: c_int = 14;
pub const PACKET_QDISC_BYPASS: c_int = 20;
pub const PACKET_IGNORE_OUTGOING: c_int = 23;
pub const PACKET_MR_PROMISC: u16 = 1;
pub const PACKET_OUTGOING: u8 = 4;
pub const TPACKET_V2: c_int = 1;

pub const TP_STATUS_KERNEL: u32 = 0;
pub const TP_STATUS_USER: u32 = 1 << 0;
pub const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
pub const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
pub const TP_STATUS_AVAILABLE: u32 = 0;
pub const TP_STATUS_SEND_REQUEST: u32 = 1 << 0;
pub const TP_STATUS_WRONG_FORMAT: u32 = 1 << 2;

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct Tpacket2Hdr {
    pub tp_status: u32,
    pub tp_len: u32,
    pub tp_snaplen: u32,
    pub tp_mac: u16,
    pub tp_net: u16,
    pub tp_sec: u32,
    pub tp_nsec: u32,
    pub tp_vlan_tci: u16,
    pub tp_vlan_tpid: u16,
    pub tp_padding: [u8; 4],
}

/// `TPACKET_ALIGN(sizeof(struct tpacket2_hdr))`: where the `sockaddr_ll` of a V2 frame starts and,
/// on the TX ring, where frame data starts.
pub const TPACKET2_HDR_ALIGNED: usize = 32;
/// `TPACKET2_HDRLEN`: header plus `sockaddr_ll`.
pub const TPACKET2_HDRLEN: usize = TPACKET2_HDR_ALIGNED + std::mem::size_of::<libc::sockaddr_ll>();

#[repr(C)]
#[derive(Default)]
pub struct TpacketReq {
    pub tp_block_size: u32,
    pub tp_block_nr: u32,
    pub tp_frame_size: u32,
    pub tp_frame_nr: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct TpacketStats {
    pub tp_packets: u32,
    pub tp_drops: u32,
}

#[repr(C)]
pub struct PacketMreq {
    pub mr_ifindex: c_int,
    pub mr_type: u16,
    pub mr_alen: u16,
    pub mr_address: [u8; 8],
}

// --- interface ioctls -----------------------------------------------------------------------

pub const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
pub const SIOCGIFMTU: libc::c_ulong = 0x8921;
pub const SIOCETHTOOL: libc::c_ulong = 0x8946;
pub const ETHTOOL_GCHANNELS: u32 = 0x3c;

#[repr(C)]
#[derive(Clone, Copy)]
pub union IfrData {
    pub int: c_int,
    pub short: libc::c_short,
    pub ptr: *mut c_void,
    _size: [u8; 24],
}

/// `struct ifreq`.
#[repr(C)]
pub struct IfReq {
    pub name: [libc::c_char; libc::IFNAMSIZ],
    pub data: IfrData,
}

#[repr(C)]
#[derive(Default)]
pub struct EthtoolChannels {
    pub cmd: u32,
    pub max_rx: u32,
    pub max_tx: u32,
    pub max_other: u32,
    pub max_combined: u32,
    pub rx_count: u32,
    pub tx_count: u32,
    pub other_count: u32,
    pub combined_count: u32,
}

// --- small helpers --------------------------------------------------------------------------

/// Turns a -1 return into the thread's errno.
pub fn cvt(r: c_int) -> io::Result<c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn socket(domain: c_int, ty: c_int, proto: c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success we own the new descriptor.
    let fd = cvt(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) })?;
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn setsockopt<T>(fd: RawFd, level: c_int, name: c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` points to a live `T` of the size we pass.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            val as *const T as *const c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// getsockopt(2) into a `T`; returns the length the kernel wrote.
pub fn getsockopt<T>(fd: RawFd, level: c_int, name: c_int, val: &mut T) -> io::Result<usize> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `val` points to a live, writable `T` of `len` bytes.
    cvt(unsafe { libc::getsockopt(fd, level, name, val as *mut T as *mut c_void, &mut len) })?;
    Ok(len as usize)
}

/// A memory mapping, unmapped on drop.
pub struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access is synchronised by `&mut`
// on the owners (the rings and UMEM use atomics for what the kernel shares).
unsafe impl Send for Mmap {}

impl Mmap {
    /// Anonymous private memory (UMEM), populated up front so the hot path takes no faults.
    pub fn anonymous(len: usize) -> io::Result<Mmap> {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        Mmap::from_result(p, len)
    }

    /// A shared mapping of a socket's ring at `offset`.
    pub fn shared(fd: &OwnedFd, len: usize, offset: i64) -> io::Result<Mmap> {
        // SAFETY: maps kernel ring memory of the socket; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        Mmap::from_result(p, len)
    }

    fn from_result(p: *mut c_void, len: usize) -> io::Result<Mmap> {
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap {
            ptr: NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap returned 0"))?,
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: we own this mapping and nothing borrowed from it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut c_void, self.len) };
    }
}

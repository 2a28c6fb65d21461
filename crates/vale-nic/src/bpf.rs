//! The XSKMAP, the XDP program that redirects into it, and the link that attaches it.

use crate::sys::{self, BpfInsn};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: `fd` was just returned by bpf(2) and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn name16(s: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    for (d, b) in n.iter_mut().zip(s.bytes().take(15)) {
        *d = b;
    }
    n
}

/// An XSKMAP with one slot per rx queue.
pub fn create_xskmap(entries: u32) -> io::Result<OwnedFd> {
    let mut attr = sys::MapCreateAttr {
        map_type: sys::BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: entries,
        map_name: name16("vale_xsks"),
        ..Default::default()
    };
    sys::bpf(sys::BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Puts socket `xsk_fd` into slot `queue` of `map`.
pub fn xskmap_set(map: &OwnedFd, queue: u32, xsk_fd: i32) -> io::Result<()> {
    let key = queue;
    let value = xsk_fd as u32;
    let mut attr = sys::MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        flags: 0, // BPF_ANY
        ..Default::default()
    };
    sys::bpf(sys::BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// `return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);`
fn program(map_fd: i32) -> [BpfInsn; 6] {
    const LDX_MEM_W: u8 = 0x01 | 0x60; // BPF_LDX | BPF_MEM | BPF_W
    const LD_IMM_DW: u8 = 0x18; // BPF_LD | BPF_IMM | BPF_DW
    const MOV64_K: u8 = 0x07 | 0xb0; // BPF_ALU64 | BPF_MOV | BPF_K
    const CALL: u8 = 0x05 | 0x80; // BPF_JMP | BPF_CALL
    const EXIT: u8 = 0x05 | 0x90; // BPF_JMP | BPF_EXIT
                                  // offsetof(struct xdp_md, rx_queue_index)
    const RX_QUEUE_INDEX: i16 = 16;
    [
        // r2 = ctx->rx_queue_index (r1 holds ctx on entry)
        BpfInsn::new(LDX_MEM_W, 2, 1, RX_QUEUE_INDEX, 0),
        // r1 = &xsks (two-slot immediate; the verifier swaps the fd for the map)
        BpfInsn::new(LD_IMM_DW, 1, sys::BPF_PSEUDO_MAP_FD, 0, map_fd),
        BpfInsn::new(0, 0, 0, 0, 0),
        // r3 = XDP_PASS: the action when the slot is empty
        BpfInsn::new(MOV64_K, 3, 0, 0, sys::XDP_PASS),
        BpfInsn::new(CALL, 0, 0, 0, sys::BPF_FUNC_REDIRECT_MAP),
        BpfInsn::new(EXIT, 0, 0, 0, 0),
    ]
}

/// Loads the redirect program for `map`. On failure the verifier's log is part of the error.
pub fn load_program(map: &OwnedFd) -> io::Result<OwnedFd> {
    let insns = program(map.as_raw_fd());
    let license = c"BSD";
    let mut attr = sys::ProgLoadAttr {
        prog_type: sys::BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name16("vale_xsk_redir"),
        expected_attach_type: sys::BPF_XDP,
        ..Default::default()
    };
    match sys::bpf(sys::BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(owned(fd)),
        Err(e) => {
            // Load again with the verifier log on, only to explain the failure.
            let mut log = vec![0u8; 16 * 1024];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            if let Ok(fd) = sys::bpf(sys::BPF_PROG_LOAD, &mut attr) {
                return Ok(owned(fd));
            }
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let text = text.trim();
            if text.is_empty() {
                Err(e)
            } else {
                Err(io::Error::new(e.kind(), format!("{e}; verifier: {text}")))
            }
        }
    }
}

/// Attaches `prog` to `ifindex` through a bpf link: the program leaves the interface when the
/// returned descriptor is closed, including when the process dies.
pub fn attach(prog: &OwnedFd, ifindex: u32, native: bool) -> io::Result<OwnedFd> {
    let mut attr = sys::LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: sys::BPF_XDP,
        flags: if native {
            sys::XDP_FLAGS_DRV_MODE
        } else {
            sys::XDP_FLAGS_SKB_MODE
        },
    };
    sys::bpf(sys::BPF_LINK_CREATE, &mut attr).map(owned)
}

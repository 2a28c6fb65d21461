//! Short copies without a call.

/// Copies `n` bytes from `src` to `dst` (which do not overlap): frames into and out of guest memory, whose
/// writer may change them meanwhile (so nothing may be read past the `n` bytes).
/// Up to 64 bytes (a short frame, the common case at high rates) without a call, in two
/// overlapping unaligned moves of 16 or 32 bytes, as DPDK's `rte_memcpy` does; longer ones
/// through `copy_nonoverlapping`.
///
/// # Safety
/// As for `copy_nonoverlapping`: `n` bytes readable at `src`, writable at `dst`.
#[inline(always)]
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, n: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY (each arm): every move lies within the first `n` bytes of both ranges.
    unsafe {
        match n {
            33..=64 => {
                let (a, b) = (
                    rd(src as *const [u8; 32]),
                    rd(src.add(n - 32) as *const [u8; 32]),
                );
                wr(dst as *mut [u8; 32], a);
                wr(dst.add(n - 32) as *mut [u8; 32], b);
            }
            16..=32 => {
                let (a, b) = (
                    rd(src as *const [u8; 16]),
                    rd(src.add(n - 16) as *const [u8; 16]),
                );
                wr(dst as *mut [u8; 16], a);
                wr(dst.add(n - 16) as *mut [u8; 16], b);
            }
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_bytes;

    #[test]
    fn copy_bytes_copies_exactly_n_bytes() {
        let src: Vec<u8> = (0..200u8).collect();
        for n in 0..=130 {
            let mut dst = vec![0xeeu8; 200];
            // SAFETY: both buffers hold 200 >= n bytes, distinct allocations.
            unsafe { copy_bytes(dst.as_mut_ptr(), src.as_ptr(), n) };
            assert_eq!(&dst[..n], &src[..n], "n = {n}");
            assert!(
                dst[n..].iter().all(|&b| b == 0xee),
                "n = {n}: wrote past the end"
            );
        }
    }
}

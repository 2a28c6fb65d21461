//! Capture filters: classic BPF programs, checked once and run on a budget of instructions.

/// Most instructions of a capture filter (the kernel's and libpcap's `BPF_MAXINSNS`).
pub const MAX_FILTER_INSNS: usize = 4096;

/// A capture filter: a classic BPF program (what libpcap's `pcap_compile` makes of a tcpdump
/// expression), checked once when the capture starts so that running it is safe whatever the
/// caller sent: only known instructions, jumps forward and inside the program (so it ends),
/// scratch memory indices below 16, no division by a constant 0, a return at the end. Loads
/// outside the frame, and division by an X of 0, reject the frame, as in the kernel.
pub struct Filter {
    insns: Vec<vale_abi::capture::BpfInsn>,
}

pub(super) const LD: u16 = 0x00;

pub(super) const LDX: u16 = 0x01;

pub(super) const ST: u16 = 0x02;

pub(super) const STX: u16 = 0x03;

pub(super) const ALU: u16 = 0x04;

pub(super) const JMP: u16 = 0x05;

pub(super) const RET: u16 = 0x06;

impl Filter {
    pub fn new(insns: Vec<vale_abi::capture::BpfInsn>) -> Result<Filter, super::Error> {
        let n = insns.len();
        if n == 0 || n > MAX_FILTER_INSNS {
            return Err(super::Error::FilterLength(n));
        }
        for (pc, i) in insns.iter().enumerate() {
            let c = i.code;
            let mode = c & 0xe0;
            let size = c & 0x18;
            let ok = match c & 0x07 {
                LD => {
                    matches!(mode, 0x00 | 0x20 | 0x40 | 0x60 | 0x80)
                        && (mode != 0x60 || i.k < 16)
                        && (!matches!(mode, 0x20 | 0x40) || size != 0x18)
                        && (matches!(mode, 0x20 | 0x40) || size == 0x00)
                }
                LDX => match mode {
                    0x00 | 0x80 => size == 0,
                    0x60 => size == 0 && i.k < 16,
                    0xa0 => size == 0x10,
                    _ => false,
                },
                ST | STX => c & !0x07 == 0 && i.k < 16,
                ALU => {
                    let op = c & 0xf0;
                    op <= 0xa0
                        && c & !0xf8 == ALU
                        && !(matches!(op, 0x30 | 0x90) && c & 0x08 == 0 && i.k == 0)
                }
                JMP => {
                    let op = c & 0xf0;
                    if c & !0xf8 != JMP || op > 0x40 {
                        false
                    } else if op == 0x00 {
                        (i.k as usize) < n - pc - 1
                    } else {
                        (i.jt as usize) < n - pc - 1 && (i.jf as usize) < n - pc - 1
                    }
                }
                RET => matches!(c & !0x07, 0x00 | 0x08 | 0x10),
                _ => matches!(c, 0x07 | 0x87),
            };
            if !ok {
                return Err(super::Error::FilterInsn {
                    pc,
                    code: c,
                    k: i.k,
                });
            }
        }
        if insns[n - 1].code & 0x07 != RET {
            return Err(super::Error::FilterEnd { pc: n - 1 });
        }
        Ok(Filter { insns })
    }

    /// Instructions in the program: the most one run costs, since jumps only go forward.
    pub fn len(&self) -> usize {
        self.insns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }

    /// Whether the program accepts the frame whose first bytes are `p` (`wirelen` bytes in
    /// all), with no bound on its work but its length.
    pub fn matches(&self, p: &[u8], wirelen: u32) -> bool {
        let mut fuel = u64::MAX;
        self.run(p, wirelen, &mut fuel) == Some(true)
    }

    /// As [`Filter::matches`], running at most `fuel` instructions, each taken from it:
    /// `None` if it ran out before the program returned.
    pub fn run(&self, p: &[u8], wirelen: u32, fuel: &mut u64) -> Option<bool> {
        let load = |k: u32, size: u16| -> Option<u32> {
            let k = k as usize;
            match size {
                0x00 => p
                    .get(k..k.checked_add(4)?)
                    .map(|b| u32::from_be_bytes(b.try_into().unwrap())),
                0x08 => p
                    .get(k..k.checked_add(2)?)
                    .map(|b| u16::from_be_bytes(b.try_into().unwrap()) as u32),
                _ => p.get(k).map(|b| *b as u32),
            }
        };
        let (mut a, mut x) = (0u32, 0u32);
        let mut mem = [0u32; 16];
        let mut pc = 0usize;
        loop {
            if *fuel == 0 {
                return None;
            }
            *fuel -= 1;
            // Checked in `new`: every jump lands inside the program, which ends with a return.
            let i = self.insns[pc];
            pc += 1;
            let c = i.code;
            match c & 0x07 {
                LD => {
                    a = match c & 0xe0 {
                        0x00 => i.k,
                        0x20 => match load(i.k, c & 0x18) {
                            Some(v) => v,
                            None => return Some(false),
                        },
                        0x40 => match x.checked_add(i.k).and_then(|k| load(k, c & 0x18)) {
                            Some(v) => v,
                            None => return Some(false),
                        },
                        0x60 => mem[i.k as usize & 15],
                        _ => wirelen,
                    }
                }
                LDX => {
                    x = match c & 0xe0 {
                        0x00 => i.k,
                        0x60 => mem[i.k as usize & 15],
                        0x80 => wirelen,
                        _ => match load(i.k, 0x10) {
                            Some(v) => 4 * (v & 0xf),
                            None => return Some(false),
                        },
                    }
                }
                ST => mem[i.k as usize & 15] = a,
                STX => mem[i.k as usize & 15] = x,
                ALU => {
                    let v = if c & 0x08 != 0 { x } else { i.k };
                    a = match c & 0xf0 {
                        0x00 => a.wrapping_add(v),
                        0x10 => a.wrapping_sub(v),
                        0x20 => a.wrapping_mul(v),
                        0x30 => match a.checked_div(v) {
                            Some(r) => r,
                            None => return Some(false),
                        },
                        0x40 => a | v,
                        0x50 => a & v,
                        0x60 => a.checked_shl(v).unwrap_or(0),
                        0x70 => a.checked_shr(v).unwrap_or(0),
                        0x80 => a.wrapping_neg(),
                        0x90 => match a.checked_rem(v) {
                            Some(r) => r,
                            None => return Some(false),
                        },
                        _ => a ^ v,
                    }
                }
                JMP => {
                    let v = if c & 0x08 != 0 { x } else { i.k };
                    let t = match c & 0xf0 {
                        0x00 => {
                            pc += i.k as usize;
                            continue;
                        }
                        0x10 => a == v,
                        0x20 => a > v,
                        0x30 => a >= v,
                        _ => a & v != 0,
                    };
                    pc += if t { i.jt } else { i.jf } as usize;
                }
                RET => {
                    return Some(
                        match c & 0x18 {
                            0x00 => i.k,
                            0x08 => x,
                            _ => a,
                        } != 0,
                    )
                }
                _ => {
                    if c & 0x80 != 0 {
                        a = x;
                    } else {
                        x = a;
                    }
                }
            }
        }
    }
}

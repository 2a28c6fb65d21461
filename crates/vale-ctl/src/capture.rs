//! `vale-ctl capture`: reads the capture ring valed fills ([`vale_abi::capture`]) and writes
//! pcapng or classic pcap.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use vale_abi::capture::{
    record_size, BpfInsn, CaptureHeader, RecordHeader, CAPTURE_MAGIC, CAPTURE_RECORDS_OFFSET,
    CAPTURE_VERSION, DIR_RX, DIR_TX, RECORD_HEADER,
};
use vale_abi::control::{self, Reply, Request};

use crate::cli::CaptureCmd;
use crate::client::Failure;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Pcapng,
    Pcap,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dir {
    Rx,
    Tx,
    Both,
}

pub struct CaptureArgs<'a> {
    pub port: &'a str,
    pub file: Option<&'a PathBuf>,
    pub dir: Dir,
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    pub snaplen: u32,
    pub buffer_mib: u32,
    pub format: Format,
    pub quiet: bool,
    /// A tcpdump expression.
    pub filter: Option<&'a str>,
}

/// valed's capture memfd, mapped.
struct Mapping {
    base: *mut u8,
    size: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size) };
    }
}

fn map(fd: &OwnedFd, size: u64) -> anyhow::Result<Mapping> {
    // SAFETY: fstat into a local; mmap of a descriptor valed sent, whose size is checked.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) < 0 {
            return Err(io::Error::last_os_error()).context("cannot look at the capture buffer");
        }
        if (st.st_size as u64) < size || (size as usize) < CAPTURE_RECORDS_OFFSET {
            return Err(anyhow!("the capture buffer is smaller than valed said"));
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error()).context("cannot map the capture buffer");
        }
        Ok(Mapping {
            base: p as *mut u8,
            size: size as usize,
        })
    }
}

/// Where the frames go, in which format.
struct Out {
    w: BufWriter<Box<dyn Write>>,
    format: Format,
}

impl Out {
    fn header(&mut self, port: &str, snaplen: u32) -> io::Result<()> {
        match self.format {
            Format::Pcap => {
                let mut h = Vec::with_capacity(24);
                h.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes()); // nanosecond pcap
                h.extend_from_slice(&2u16.to_le_bytes());
                h.extend_from_slice(&4u16.to_le_bytes());
                h.extend_from_slice(&0i32.to_le_bytes());
                h.extend_from_slice(&0u32.to_le_bytes());
                h.extend_from_slice(&snaplen.to_le_bytes());
                h.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
                self.w.write_all(&h)
            }
            Format::Pcapng => {
                // Section header block.
                let mut shb = Vec::new();
                shb.extend_from_slice(&0x1A2B_3C4Du32.to_le_bytes());
                shb.extend_from_slice(&1u16.to_le_bytes());
                shb.extend_from_slice(&0u16.to_le_bytes());
                shb.extend_from_slice(&(-1i64).to_le_bytes());
                option(&mut shb, 4, b"vale-ctl capture"); // shb_userappl
                option_end(&mut shb);
                self.block(0x0A0D_0D0A, &shb)?;
                // Interface description block: the port.
                let mut idb = Vec::new();
                idb.extend_from_slice(&1u16.to_le_bytes()); // LINKTYPE_ETHERNET
                idb.extend_from_slice(&0u16.to_le_bytes());
                idb.extend_from_slice(&snaplen.to_le_bytes());
                option(&mut idb, 2, port.as_bytes()); // if_name
                option(&mut idb, 3, b"vale switch port"); // if_description
                option(&mut idb, 9, &[9]); // if_tsresol: nanoseconds
                option_end(&mut idb);
                self.block(1, &idb)
            }
        }
    }

    fn block(&mut self, kind: u32, body: &[u8]) -> io::Result<()> {
        let len = (12 + body.len()) as u32;
        self.w.write_all(&kind.to_le_bytes())?;
        self.w.write_all(&len.to_le_bytes())?;
        self.w.write_all(body)?;
        self.w.write_all(&len.to_le_bytes())
    }

    fn frame(&mut self, h: &RecordHeader, data: &[u8]) -> io::Result<()> {
        match self.format {
            Format::Pcap => {
                let mut r = [0u8; 16];
                r[0..4].copy_from_slice(&((h.ts_ns / 1_000_000_000) as u32).to_le_bytes());
                r[4..8].copy_from_slice(&((h.ts_ns % 1_000_000_000) as u32).to_le_bytes());
                r[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
                r[12..16].copy_from_slice(&h.orig_len.to_le_bytes());
                self.w.write_all(&r)?;
                self.w.write_all(data)
            }
            Format::Pcapng => {
                // Enhanced packet block, with epb_flags: inbound (the switch delivered it to
                // the port: rx) or outbound (the port sent it into the switch: tx).
                let pad = data.len().next_multiple_of(4) - data.len();
                let len = (28 + data.len() + pad + 16) as u32;
                let mut b = [0u8; 28];
                b[0..4].copy_from_slice(&6u32.to_le_bytes());
                b[4..8].copy_from_slice(&len.to_le_bytes());
                // Interface 0, then the timestamp's high and low words.
                b[12..16].copy_from_slice(&((h.ts_ns >> 32) as u32).to_le_bytes());
                b[16..20].copy_from_slice(&(h.ts_ns as u32).to_le_bytes());
                b[20..24].copy_from_slice(&(data.len() as u32).to_le_bytes());
                b[24..28].copy_from_slice(&h.orig_len.to_le_bytes());
                self.w.write_all(&b)?;
                self.w.write_all(data)?;
                self.w.write_all(&[0u8; 3][..pad])?;
                let flags: u32 = if h.dir == DIR_RX { 1 } else { 2 };
                let mut o = [0u8; 16];
                o[0..2].copy_from_slice(&2u16.to_le_bytes()); // epb_flags
                o[2..4].copy_from_slice(&4u16.to_le_bytes());
                o[4..8].copy_from_slice(&flags.to_le_bytes());
                // opt_endofopt, then the block's length again.
                o[12..16].copy_from_slice(&len.to_le_bytes());
                self.w.write_all(&o)
            }
        }
    }

    /// pcapng: an interface statistics block with the frames captured and the capture
    /// drops.
    fn stats(&mut self, ts_ns: u64, received: u64, dropped: u64) -> io::Result<()> {
        if self.format != Format::Pcapng {
            return Ok(());
        }
        let mut isb = Vec::new();
        isb.extend_from_slice(&0u32.to_le_bytes());
        isb.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
        isb.extend_from_slice(&(ts_ns as u32).to_le_bytes());
        option(&mut isb, 4, &(received + dropped).to_le_bytes()); // isb_ifrecv
        option(&mut isb, 5, &dropped.to_le_bytes()); // isb_ifdrop
        option_end(&mut isb);
        self.block(5, &isb)
    }
}

fn option(b: &mut Vec<u8>, code: u16, value: &[u8]) {
    b.extend_from_slice(&code.to_le_bytes());
    b.extend_from_slice(&(value.len() as u16).to_le_bytes());
    b.extend_from_slice(value);
    b.resize(b.len().next_multiple_of(4), 0);
}

fn option_end(b: &mut Vec<u8>) {
    b.extend_from_slice(&[0u8; 4]);
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A write that failed because the reader of a pipe went away ends the capture quietly.
fn broken(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// `vale-ctl capture PORT ...` as the command line gave it.
pub(crate) fn command(sock: &UnixStream, c: &CaptureCmd) -> Result<(), Failure> {
    run(
        sock,
        &CaptureArgs {
            port: &c.port,
            file: c.file.as_ref(),
            dir: c.dir,
            count: c.count,
            duration: c.duration,
            snaplen: c.snaplen,
            buffer_mib: c.buffer,
            format: c.format,
            quiet: c.quiet,
            filter: (!c.expression.is_empty())
                .then(|| c.expression.join(" "))
                .as_deref(),
        },
    )
}

pub fn run(sock: &UnixStream, a: &CaptureArgs) -> Result<(), Failure> {
    let dirs = match a.dir {
        Dir::Rx => DIR_RX,
        Dir::Tx => DIR_TX,
        Dir::Both => DIR_RX | DIR_TX,
    };
    let req = Request::Capture {
        port: a.port.to_string(),
        dirs,
        snaplen: a.snaplen,
        bytes: a.buffer_mib as u64 * 1024 * 1024,
        filter: match a.filter {
            Some(expr) => compile(expr, a.snaplen)?,
            None => Vec::new(),
        },
    };
    let (size, fd) = match control::exchange(sock, &req)
        .context("cannot exchange a request with valed")?
    {
        Some((Reply::Capture { size, .. }, mut fds)) if fds.len() == 1 => (size, fds.remove(0)),
        Some((Reply::Error { message, .. }, _)) => return Err(Failure::Refused(message)),
        Some((other, _)) => return Err(anyhow!("unexpected reply from valed: {other:?}").into()),
        None => return Err(anyhow!("valed closed the connection without replying").into()),
    };
    let m = map(&fd, size)?;
    drop(fd);
    // SAFETY: page 0 of the mapping, checked to be there; the shared fields are atomics.
    let h = unsafe { &*(m.base as *const CaptureHeader) };
    let (records, rec_size, snaplen) = (h.records as u64, h.rec_size as usize, h.snaplen);
    if h.magic != CAPTURE_MAGIC
        || h.version != CAPTURE_VERSION
        || records == 0
        || rec_size != record_size(snaplen)
        || CAPTURE_RECORDS_OFFSET as u64 + records * rec_size as u64 > size
    {
        return Err(anyhow!("the capture buffer valed sent is not one this vale-ctl reads").into());
    }
    let sink: Box<dyn Write> = match a.file {
        None => Box::new(io::stdout()),
        Some(p) if p.as_os_str() == "-" => Box::new(io::stdout()),
        Some(p) => {
            Box::new(File::create(p).with_context(|| format!("cannot create {}", p.display()))?)
        }
    };
    let mut out = Out {
        w: BufWriter::with_capacity(1 << 20, sink),
        format: a.format,
    };
    let sig = crate::top::signals().context("cannot watch signals")?;
    let deadline = a.duration.map(|d| Instant::now() + d);
    let mut got = 0u64;
    let mut tail = h.tail.load(Relaxed);
    let mut ended_by_port = false;
    let mut stop_at: Option<u64> = None;
    let result = (|| -> io::Result<()> {
        out.header(a.port, snaplen)?;
        out.w.flush()?;
        loop {
            let head = h.head.load(Acquire);
            if head.wrapping_sub(tail) > records {
                return Err(io::Error::other(
                    "the capture buffer's indices are inconsistent",
                ));
            }
            while tail != head && a.count.is_none_or(|c| got < c) {
                let off = CAPTURE_RECORDS_OFFSET + (tail % records) as usize * rec_size;
                // SAFETY: the record lies inside the mapping (checked above); its header is
                // read unaligned and its lengths clamped to the record.
                let (rh, data) = unsafe {
                    let rec = m.base.add(off);
                    let rh: RecordHeader = std::ptr::read_unaligned(rec as *const RecordHeader);
                    let n = (rh.cap_len as usize).min(rec_size - RECORD_HEADER);
                    (rh, std::slice::from_raw_parts(rec.add(RECORD_HEADER), n))
                };
                out.frame(&rh, data)?;
                tail += 1;
                got += 1;
            }
            // Release: valed may reuse the records only once they are written out.
            h.tail.store(tail, Release);
            if a.count.is_some_and(|c| got >= c) || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            // After a signal, what valed had written by then is taken, and no more.
            if stop_at.is_some_and(|s| tail.wrapping_sub(s) as i64 >= 0) {
                return Ok(());
            }
            if tail != head {
                continue;
            }
            if h.ended.load(Acquire) != 0 && h.head.load(Acquire) == tail {
                ended_by_port = true;
                return Ok(());
            }
            out.w.flush()?;
            // Nothing to read: wait a little, or for valed to go or a signal to come.
            let mut fds = [
                libc::pollfd {
                    fd: sock.as_raw_fd(),
                    events: libc::POLLIN | libc::POLLRDHUP,
                    revents: 0,
                },
                libc::pollfd {
                    fd: sig.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll on two live descriptors.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, 2) };
            if fds[1].revents != 0 {
                // A signal: what valed wrote up to now is taken, then the capture ends.
                stop_at.get_or_insert(h.head.load(Acquire));
                continue;
            }
            if fds[0].revents != 0 {
                // valed closed the connection: nothing more comes. Take what is left.
                if h.head.load(Acquire) == tail {
                    ended_by_port = true;
                    return Ok(());
                }
            }
        }
    })();
    let (ring_full, over_budget) = (h.drops.load(Relaxed), h.over_budget.load(Relaxed));
    let drops = ring_full + over_budget;
    let end = result
        .and_then(|()| out.stats(now_ns(), got, drops))
        .and_then(|()| out.w.flush());
    match end {
        Err(e) if broken(&e) => {}
        Err(e) => return Err(anyhow::Error::new(e).context("capture failed").into()),
        Ok(()) => {}
    }
    if !a.quiet {
        let budget = if over_budget != 0 {
            format!(" ({ring_full} with the buffer full, {over_budget} over valed's filter budget)")
        } else {
            String::new()
        };
        eprintln!(
            "vale-ctl: {got} frames captured on {}, {drops} dropped by the capture{budget}{}",
            a.port,
            if ended_by_port {
                " (the port went away)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// Compiles tcpdump expression `expr` for Ethernet frames of `snaplen` bytes into classic
/// BPF with libpcap's `pcap_compile`, libpcap being loaded only now (`libpcap.so.0.8`, the
/// name Debian and Ubuntu ship, or `libpcap.so.1`, `libpcap.so`): vale-ctl needs it only to
/// filter.
pub fn compile(expr: &str, snaplen: u32) -> Result<Vec<BpfInsn>, Failure> {
    #[repr(C)]
    struct BpfProgram {
        len: libc::c_uint,
        insns: *const BpfInsn,
    }
    type OpenDead = unsafe extern "C" fn(libc::c_int, libc::c_int) -> *mut libc::c_void;
    type Compile = unsafe extern "C" fn(
        *mut libc::c_void,
        *mut BpfProgram,
        *const libc::c_char,
        libc::c_int,
        u32,
    ) -> libc::c_int;
    type GetErr = unsafe extern "C" fn(*mut libc::c_void) -> *const libc::c_char;
    type FreeCode = unsafe extern "C" fn(*mut BpfProgram);
    type Close = unsafe extern "C" fn(*mut libc::c_void);
    const DLT_EN10MB: libc::c_int = 1;
    const PCAP_NETMASK_UNKNOWN: u32 = 0xffff_ffff;

    let cexpr = std::ffi::CString::new(expr)
        .map_err(|_| Failure::Usage("the filter expression holds a NUL byte".into()))?;
    // SAFETY: loading libpcap runs its initialisers, which do nothing of ours; each symbol is
    // used with the signature libpcap's pcap.h gives it.
    unsafe {
        let lib = ["libpcap.so.0.8", "libpcap.so.1", "libpcap.so"]
            .iter()
            .find_map(|n| libloading::Library::new(n).ok())
            .ok_or_else(|| {
                Failure::Refused(
                    "a capture filter needs libpcap (libpcap0.8 on Debian and Ubuntu), which \
                     is not installed"
                        .into(),
                )
            })?;
        let sym = |e: libloading::Error| Failure::Other(anyhow!("libpcap: {e}"));
        let open_dead: libloading::Symbol<OpenDead> = lib.get(b"pcap_open_dead\0").map_err(sym)?;
        let compile: libloading::Symbol<Compile> = lib.get(b"pcap_compile\0").map_err(sym)?;
        let geterr: libloading::Symbol<GetErr> = lib.get(b"pcap_geterr\0").map_err(sym)?;
        let freecode: libloading::Symbol<FreeCode> = lib.get(b"pcap_freecode\0").map_err(sym)?;
        let close: libloading::Symbol<Close> = lib.get(b"pcap_close\0").map_err(sym)?;
        let p = open_dead(DLT_EN10MB, snaplen as libc::c_int);
        if p.is_null() {
            return Err(anyhow!("libpcap: pcap_open_dead failed").into());
        }
        let mut prog = BpfProgram {
            len: 0,
            insns: std::ptr::null(),
        };
        let r = compile(p, &mut prog, cexpr.as_ptr(), 1, PCAP_NETMASK_UNKNOWN);
        let out = if r != 0 {
            let e = std::ffi::CStr::from_ptr(geterr(p))
                .to_string_lossy()
                .into_owned();
            Err(Failure::Usage(format!(
                "bad filter expression '{expr}': {e}"
            )))
        } else {
            let v = std::slice::from_raw_parts(prog.insns, prog.len as usize).to_vec();
            freecode(&mut prog);
            Ok(v)
        };
        close(p);
        out
    }
}

//! How a port is opened: its geometry, the run directory, whether valed is started.

use super::*;

/// How to open a port: geometry, run directory, whether to start valed.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub params: PortParams,
    /// `None`: `VALE_RUN_DIR`, else `/run/vale`.
    pub run_dir: Option<PathBuf>,
    /// Start valed when none runs for the run directory (default: yes, unless the
    /// environment has `VALE_NO_AUTOSTART=1`).
    pub autostart: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            params: PortParams::default(),
            run_dir: None,
            autostart: std::env::var_os("VALE_NO_AUTOSTART")
                .is_none_or(|v| v.is_empty() || v == "0"),
        }
    }
}

impl OpenOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn rings(&mut self, tx: u32, rx: u32) -> &mut Self {
        self.params.tx_rings = tx;
        self.params.rx_rings = rx;
        self
    }
    pub fn slots(&mut self, n: u32) -> &mut Self {
        self.params.slots = n;
        self
    }
    pub fn buf_size(&mut self, n: u32) -> &mut Self {
        self.params.buf_size = n;
        self
    }
    pub fn run_dir(&mut self, d: impl Into<PathBuf>) -> &mut Self {
        self.run_dir = Some(d.into());
        self
    }
    pub fn autostart(&mut self, on: bool) -> &mut Self {
        self.autostart = on;
        self
    }

    /// Opens (and so creates, if need be) port `name` = `valeX:Y`.
    pub fn open(&self, name: &str) -> io::Result<Port> {
        let invalid = |message: String| {
            Refused {
                kind: ErrorKind::InvalidArgument,
                message,
            }
            .into_io()
        };
        vale_abi::name::parse_port(name).map_err(|e| invalid(e.to_string()))?;
        let layout = Layout::new(&self.params).map_err(|e| invalid(e.to_string()))?;
        let run_dir = self.run_dir.clone().unwrap_or_else(default_run_dir);
        let ctl = connect::connect(&run_dir, self.autostart)?;
        let req = Request::Open {
            port: name.to_string(),
            params: self.params,
            abi_version: VALE_ABI_VERSION,
        };
        let (reply, fds) = control::exchange(&ctl, &req)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "valed closed the connection")
        })?;
        match reply {
            Reply::Opened { .. } => {}
            Reply::Error { kind, message } => return Err(Refused { kind, message }.into_io()),
            other => {
                return Err(io::Error::other(format!(
                    "unexpected reply from valed: {other:?}"
                )))
            }
        }
        let rings = layout.num_rings() as usize;
        if fds.len() != 1 + 2 * rings {
            return Err(io::Error::other(format!(
                "valed sent {} descriptors, expected {}",
                fds.len(),
                1 + 2 * rings
            )));
        }
        let mut fds = fds.into_iter();
        let memfd = fds.next().expect("counted");
        let (mut kick, mut irq) = (Vec::with_capacity(rings), Vec::with_capacity(rings));
        for _ in 0..rings {
            kick.push(fds.next().expect("counted"));
            irq.push(fds.next().expect("counted"));
        }
        // SAFETY: maps the memfd valed sent, with the size both sides computed.
        let base = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                layout.region_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            NonNull::new_unchecked(p as *mut u8)
        };
        let port = Port {
            name: name.to_string(),
            forks_at_open: forks(),
            base,
            layout,
            ctl,
            memfd,
            kick,
            irq,
            interrupts: AtomicU64::new(0),
            crowded: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            looked_ns: AtomicU64::new(coarse_ns()),
            spin_ns: AtomicU64::new(0),
            waiter: Mutex::new(None),
            waiters: AtomicU32::new(0),
            busy: (0..rings).map(|_| AtomicBool::new(false)).collect(),
        };
        layout
            .check_header(port.region())
            .map_err(io::Error::other)?;
        // Start from valed's view of every ring.
        for i in 0..layout.num_rings() {
            let r = port.ring(i);
            let ktoa = port.ktoa(i);
            // SAFETY: ring header inside our mapping; only this thread uses it yet.
            unsafe {
                let cur = ktoa.hwcur.load(Acquire);
                (*r.ptr.as_ptr()).head = cur;
                (*r.ptr.as_ptr()).cur = cur;
                (*r.ptr.as_ptr()).tail = ktoa.hwtail.load(Acquire);
            }
        }
        Ok(port)
    }
}

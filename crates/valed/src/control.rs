//! The control socket: one thread per connection. A connection that opened ports owns them;
//! when it ends, however the client ended, its ports are freed.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use vale_abi::control::{self, HostDevice, Reply, Request};
use vale_abi::region::VALE_ABI_VERSION;
use vale_switch::host::{HostSpec, NicMode};
use vale_switch::port::Port;
use vale_switch::Engine;

pub fn serve(listener: UnixListener, engine: Arc<Engine>) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let engine = engine.clone();
                let spawned = std::thread::Builder::new()
                    .name("vale-control".into())
                    .stack_size(256 << 10)
                    .spawn(move || Connection::new(stream, engine).run());
                if let Err(e) = spawned {
                    tracing::error!("cannot serve a control connection: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

struct Connection {
    stream: UnixStream,
    engine: Arc<Engine>,
    pid: u32,
    owned: Vec<Arc<Port>>,
}

/// The peer's pid from SO_PEERCRED (0 if unknown).
fn peer_pid(s: &UnixStream) -> u32 {
    // SAFETY: getsockopt into a correctly sized ucred.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let r = libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        );
        if r == 0 {
            cred.pid as u32
        } else {
            0
        }
    }
}

impl Connection {
    fn new(stream: UnixStream, engine: Arc<Engine>) -> Connection {
        let pid = peer_pid(&stream);
        Connection {
            stream,
            engine,
            pid,
            owned: Vec::new(),
        }
    }

    fn run(mut self) {
        loop {
            let req = match control::recv::<Request>(&self.stream) {
                Ok(Some((req, _fds))) => req,
                Ok(None) => break,
                Err(e) => {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        let _ = self.reply(
                            &Reply::Error {
                                message: e.to_string(),
                            },
                            &[],
                        );
                    }
                    break;
                }
            };
            if self.handle(req).is_err() {
                break;
            }
        }
        for p in self.owned.drain(..) {
            self.engine.close(&p);
        }
    }

    fn reply(&self, r: &Reply, fds: &[i32]) -> std::io::Result<()> {
        control::send(&self.stream, r, fds)
    }

    fn handle(&mut self, req: Request) -> std::io::Result<()> {
        let done = |r: Result<(), String>| match r {
            Ok(()) => Reply::Ok,
            Err(message) => Reply::Error { message },
        };
        match req {
            Request::Open {
                port,
                params,
                abi_version,
            } => {
                if abi_version != VALE_ABI_VERSION {
                    let message = format!(
                        "client speaks vale ABI version {abi_version}, valed speaks {VALE_ABI_VERSION}"
                    );
                    return self.reply(&Reply::Error { message }, &[]);
                }
                match self.engine.open(&port, &params, self.pid) {
                    Ok(opened) => {
                        let fds = opened.fds();
                        let r = self.reply(
                            &Reply::Opened {
                                port,
                                fds: fds.len() as u32,
                            },
                            &fds,
                        );
                        self.owned.push(opened.port);
                        r
                    }
                    Err(message) => self.reply(&Reply::Error { message }, &[]),
                }
            }
            Request::List => self.reply(
                &Reply::List {
                    switches: self.engine.list(),
                },
                &[],
            ),
            Request::Create { port } => self.reply(&done(self.engine.create(&port)), &[]),
            Request::Attach { port, device } => {
                let r = host_spec(device).and_then(|spec| self.engine.attach_host(&port, &spec));
                self.reply(&done(r), &[])
            }
            Request::Detach { port } => self.reply(&done(self.engine.detach(&port)), &[]),
            Request::Destroy { name } => self.reply(&done(self.engine.destroy(&name)), &[]),
            Request::Set {
                target,
                knob,
                value,
            } => self.reply(&done(self.engine.set(&target, &knob, &value)), &[]),
        }
    }
}

/// The engine's form of a device request.
fn host_spec(d: HostDevice) -> Result<HostSpec, String> {
    Ok(match d {
        HostDevice::Tap { name, persist } => HostSpec::Tap { name, persist },
        HostDevice::Nic { iface, mode } => HostSpec::Nic {
            iface,
            mode: mode.as_deref().map(NicMode::parse).transpose()?,
        },
    })
}

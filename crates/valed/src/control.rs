//! The control socket, served by one thread over epoll with bounded resources.
//!
//! No thread per connection and no blocking call on a client's socket: a connection is a
//! small state machine. valed reads at most one request of at most `MAX_REQUEST` bytes
//! (`MAX_ADMIN_REQUEST` for an administrator) at a time, answers it, and reads the next only
//! once the answer has gone, so a connection holds at most one unfinished request and one
//! unsent reply. A user that is not an administrator has
//! a bounded number of connections; root and the administrators always get through, even when
//! valed is out of descriptors (one is kept spare to accept them).
//!
//! Replies are bounded per user as well: while the replies that one user's connections have
//! not read add up to [`USER_REPLY_BYTES`] or more, that user's next requests are answered
//! with an error instead of a reply, so a user who asks on every connection and never reads
//! holds at most that much and one more reply. No reply is large or slow to build for a
//! user: a lookup module's commands answer at most `vale_switch::lookup::MAX_CONTROL_OUTPUT`
//! bytes, and a reading command open to anyone answers a page (the flow module dumps a page
//! of [`vale_abi::control::FLOW_DUMP_PAGE`] rules at a time, each page taken in one pass over
//! the table, never the whole table at once).
//!
//! A connection that opened ports owns them: when it ends, however the client ended, its ports
//! are freed.
//!
//! A request that may wait on something other than valed's own tables (a device's thread to
//! end at detach, a device to open, a lookup module's code) runs on a thread of its own
//! ([`run_slow`]), and its connection leaves the epoll set until the answer comes back through
//! a channel and an eventfd: the thread that serves the socket never waits for a device or a
//! module, so `vale-ctl list` answers whatever a port's peer or a module does. Each
//! connection has at most one request in flight, so those threads are bounded as the
//! connections are. A user who is not an administrator has one such request running at a
//! time (the others wait, in the order they came), so that each of its replies is counted
//! in the user's unread bytes before its next request is looked at, as for the others.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{mpsc, Arc};

use vale_abi::control::{self, Reply, Request, MAX_ADMIN_REQUEST, MAX_REQUEST};
use vale_abi::region::VALE_ABI_VERSION;
use vale_switch::Port;
use vale_switch::{epoll, Caller, Engine, Error, ErrorKind};

use crate::peer;

/// Who may connect how often.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Members of this group are administrators, as root is.
    pub admin_gid: Option<u32>,
    /// Connections one user that is not an administrator may hold at once.
    pub conns_per_user: usize,
    /// Connections of all users that are not administrators together.
    pub conns_total: usize,
}

/// Bytes of replies that the connections of one user who is not an administrator may leave
/// unread before valed answers that user's further requests with an error (the reply that
/// crosses the line is still sent whole).
pub const USER_REPLY_BYTES: usize = 4 << 20;

const LISTENER: u64 = u64::MAX;
/// The eventfd that says a slow request's answer is in [`Server::answers`].
const ANSWERS: u64 = u64::MAX - 1;

/// A slow request's answer, for connection `token` if it is still the one numbered `serial`,
/// of `caller`.
struct Answer {
    token: usize,
    serial: u64,
    caller: Caller,
    reply: Reply,
}

/// Serves `listener` for ever.
pub fn serve(listener: UnixListener, engine: Arc<Engine>, policy: Policy) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let ep = epoll::new()?;
    epoll::add(&ep, listener.as_raw_fd(), LISTENER)?;
    let answered = Arc::new(vale_abi::eventfd::new()?);
    epoll::add(&ep, answered.as_raw_fd(), ANSWERS)?;
    let (answer, answers) = mpsc::channel();
    let mut server = Server {
        answer,
        answers,
        answered,
        serials: 0,
        running: HashMap::new(),
        ep,
        listener,
        engine,
        policy,
        conns: Vec::new(),
        free: Vec::new(),
        per_user: HashMap::new(),
        unsent: HashMap::new(),
        capped: 0,
        spare: File::open("/dev/null").ok(),
        listening: true,
    };
    server.run()
}

struct Server {
    ep: OwnedFd,
    /// Where the threads of slow requests send their answers, and the eventfd they signal.
    answer: mpsc::Sender<Answer>,
    answers: mpsc::Receiver<Answer>,
    answered: Arc<OwnedFd>,
    /// The number of the last connection accepted (a token is reused, a serial never).
    serials: u64,
    /// Users who are not administrators with a slow request running, and the connections
    /// (token, serial) whose slow request waits for it.
    running: HashMap<u32, std::collections::VecDeque<(usize, u64)>>,
    listener: UnixListener,
    engine: Arc<Engine>,
    policy: Policy,
    /// Indexed by epoll token.
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Connections of each user that is not an administrator.
    per_user: HashMap<u32, usize>,
    /// Bytes of the replies those connections hold unsent, by user ([`USER_REPLY_BYTES`]).
    unsent: HashMap<u32, usize>,
    /// Their sum.
    capped: usize,
    /// Kept open so that one more connection can be accepted when valed has no descriptor
    /// left: an administrator's is then served, anyone else's refused with a message.
    spare: Option<File>,
    /// False while valed has no descriptor to accept with: the listener is then not watched
    /// (it would be readable for ever) until a connection closes.
    listening: bool,
}

struct Conn {
    stream: UnixStream,
    caller: Caller,
    serial: u64,
    /// A slow request of this connection runs or waits to: the connection is out of the
    /// epoll set.
    waiting: bool,
    /// The slow request read, not yet handed to a thread.
    slow: Option<Request>,
    /// The request being read: its 4-byte length, then its body.
    input: Vec<u8>,
    output: Option<Outgoing>,
    /// Close once `output` has gone.
    closing: bool,
    owned: Vec<Arc<Port>>,
    /// Captures this connection started: removed from their port when it closes.
    captures: Vec<crate::capture::Held>,
    /// Events asked of epoll now.
    interest: i32,
}

/// A reply on its way out.
struct Outgoing {
    bytes: Vec<u8>,
    sent: usize,
    /// Whose descriptors ride on the first byte (they live as long as the port).
    fds_of: Option<Arc<Port>>,
    /// Or this one descriptor (a capture's memfd).
    fd: Option<OwnedFd>,
}

const READ: i32 = libc::EPOLLIN | libc::EPOLLRDHUP;
const WRITE: i32 = libc::EPOLLOUT;

impl Server {
    fn run(&mut self) -> ! {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            let n = epoll::wait(&self.ep, &mut events, -1).len();
            for ev in events.iter().take(n) {
                let token = ev.u64;
                if token == LISTENER {
                    self.accept_some();
                } else if token == ANSWERS {
                    self.take_answers();
                } else {
                    self.service(token as usize);
                }
            }
        }
    }

    /// Accepts what is queued, up to a bound: a flood of connections must not keep the
    /// connections already accepted from being served (epoll reports the rest again).
    fn accept_some(&mut self) {
        for _ in 0..64 {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    // Out of descriptors: the spare one takes this connection, which is
                    // served if it is an administrator's and refused otherwise.
                    let Some(spare) = self.spare.take() else {
                        tracing::warn!("out of descriptors: new connections wait");
                        self.listen(false);
                        return;
                    };
                    drop(spare);
                    // accept reports EMFILE before it looks at the queue: an empty queue shows
                    // only now.
                    let accepted = match self.listener.accept() {
                        Ok((stream, _)) => {
                            self.admit(stream);
                            true
                        }
                        Err(_) => false,
                    };
                    self.spare = File::open("/dev/null").ok();
                    if !accepted || self.spare.is_none() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn admit(&mut self, stream: UnixStream) {
        let caller = peer::identify(&stream, self.policy.admin_gid);
        if !caller.admin {
            let mine = self.per_user.get(&caller.uid).copied().unwrap_or(0);
            let refusal = if mine >= self.policy.conns_per_user {
                Some(format!(
                    "uid {} already has {mine} connections to valed, the most a user may have \
                     (valed --max-conns-per-user)",
                    caller.uid
                ))
            } else if self.capped >= self.policy.conns_total {
                Some(format!(
                    "valed has {} connections of users, the most it takes (valed --max-conns)",
                    self.capped
                ))
            } else if self.spare.is_none() {
                Some("valed is out of descriptors".to_string())
            } else {
                None
            };
            if let Some(message) = refusal {
                refuse(&stream, message);
                return;
            }
        }
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::warn!("cannot serve a control connection: {e}");
            return;
        }
        let token = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = epoll::watch(
            &self.ep,
            stream.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            token as u64,
            READ as u32,
        ) {
            tracing::warn!("cannot serve a control connection: {e}");
            self.free.push(token);
            return;
        }
        if !caller.admin {
            *self.per_user.entry(caller.uid).or_default() += 1;
            self.capped += 1;
        }
        self.serials += 1;
        self.conns[token] = Some(Conn {
            stream,
            caller,
            serial: self.serials,
            waiting: false,
            slow: None,
            input: Vec::new(),
            output: None,
            closing: false,
            owned: Vec::new(),
            captures: Vec::new(),
            interest: READ,
        });
    }

    /// Something happened on connection `token`: send what is pending, then read and answer
    /// requests while replies go out at once.
    fn service(&mut self, token: usize) {
        let Some(Some(conn)) = self.conns.get_mut(token) else {
            return;
        };
        let (uid, capped, held) = (conn.caller.uid, !conn.caller.admin, conn.held());
        let others = capped.then(|| self.unsent.get(&uid).copied().unwrap_or(0) - held);
        let r = conn.pump(&self.engine, others);
        if let Some(others) = others {
            match others + conn.held() {
                0 => self.unsent.remove(&uid),
                n => self.unsent.insert(uid, n),
            };
        }
        let done = match r {
            Ok(()) => conn.closing && conn.output.is_none(),
            Err(_) => true,
        };
        if done {
            self.close(token);
            return;
        }
        if conn.waiting {
            // Out of the epoll set until the answer comes ([`Server::take_answers`]).
            let _ = epoll::watch(&self.ep, conn.stream.as_raw_fd(), libc::EPOLL_CTL_DEL, 0, 0);
            conn.interest = 0;
            if conn.slow.is_some() {
                self.start_slow(token);
            }
            return;
        }
        let want = if conn.output.is_some() { WRITE } else { READ };
        if want != conn.interest {
            conn.interest = want;
            let _ = epoll::watch(
                &self.ep,
                conn.stream.as_raw_fd(),
                libc::EPOLL_CTL_MOD,
                token as u64,
                want as u32,
            );
        }
    }

    fn close(&mut self, token: usize) {
        let Some(conn) = self.conns[token].take() else {
            return;
        };
        self.free.push(token);
        if !conn.caller.admin {
            if let Some(n) = self.per_user.get_mut(&conn.caller.uid) {
                *n -= 1;
                if *n == 0 {
                    self.per_user.remove(&conn.caller.uid);
                }
            }
            self.capped -= 1;
            if let Some(n) = self.unsent.get_mut(&conn.caller.uid) {
                *n -= conn.held();
                if *n == 0 {
                    self.unsent.remove(&conn.caller.uid);
                }
            }
        }
        // Closing the socket takes it out of the epoll set.
        drop(conn.stream);
        for p in conn.owned {
            self.engine.close(&p);
        }
        for c in conn.captures {
            c.stop();
        }
        if self.spare.is_none() {
            self.spare = File::open("/dev/null").ok();
        }
        if !self.listening && self.spare.is_some() {
            self.listen(true);
        }
    }

    /// Runs the slow request connection `token` read, or (a user who is not an administrator,
    /// with one running) queues it behind that one.
    fn start_slow(&mut self, token: usize) {
        let Some(Some(conn)) = self.conns.get_mut(token) else {
            return;
        };
        let caller = conn.caller;
        if !caller.admin {
            if let Some(queue) = self.running.get_mut(&caller.uid) {
                queue.push_back((token, conn.serial));
                return;
            }
            self.running.insert(caller.uid, Default::default());
        }
        let Some(req) = conn.slow.take() else { return };
        let to = (self.answer.clone(), self.answered.clone());
        run_slow(self.engine.clone(), to, (token, conn.serial, caller), req);
    }

    /// Hands the answers of slow requests to their connections, if they are still there, and
    /// serves those connections again; starts the next slow request of each user answered.
    fn take_answers(&mut self) {
        vale_abi::eventfd::drain(&*self.answered);
        while let Ok(a) = self.answers.try_recv() {
            let Some(Some(conn)) = self.conns.get_mut(a.token) else {
                self.next_slow(a.caller);
                continue;
            };
            if conn.serial != a.serial || !conn.waiting {
                self.next_slow(a.caller);
                continue;
            }
            conn.waiting = false;
            let out = Outgoing::new(&a.reply, None);
            if !conn.caller.admin {
                // Counted in the user's unsent replies (before the user's next slow request
                // is looked at), as `service` expects.
                *self.unsent.entry(conn.caller.uid).or_default() += out.bytes.len();
            }
            conn.output = Some(out);
            conn.interest = WRITE;
            let fd = conn.stream.as_raw_fd();
            let r = epoll::watch(
                &self.ep,
                fd,
                libc::EPOLL_CTL_ADD,
                a.token as u64,
                WRITE as u32,
            );
            self.next_slow(a.caller);
            if r.is_err() {
                self.close(a.token);
                continue;
            }
            self.service(a.token);
        }
    }

    /// A slow request of `caller` ended: for a user who is not an administrator, runs the next
    /// that waits (refused at once if the user's unread replies reached the bound meanwhile).
    fn next_slow(&mut self, caller: Caller) {
        if caller.admin {
            return;
        }
        let uid = caller.uid;
        loop {
            let Some(queue) = self.running.get_mut(&uid) else {
                return;
            };
            let Some((token, serial)) = queue.pop_front() else {
                self.running.remove(&uid);
                return;
            };
            let unsent = self.unsent.get(&uid).copied().unwrap_or(0);
            let Some(Some(conn)) = self.conns.get_mut(token) else {
                continue;
            };
            if conn.serial != serial {
                continue;
            }
            let Some(req) = conn.slow.take() else {
                continue;
            };
            let to = (self.answer.clone(), self.answered.clone());
            let who = (token, serial, conn.caller);
            if unsent >= USER_REPLY_BYTES {
                let reply = refused(Error::limit(unread(uid, unsent)));
                answer(&to, who, reply);
                return;
            }
            run_slow(self.engine.clone(), to, who, req);
            return;
        }
    }

    /// Watches the listener, or stops watching it.
    fn listen(&mut self, on: bool) {
        self.listening = on;
        let events = if on { libc::EPOLLIN as u32 } else { 0 };
        let fd = self.listener.as_raw_fd();
        let _ = epoll::watch(&self.ep, fd, libc::EPOLL_CTL_MOD, LISTENER, events);
    }
}

impl Conn {
    /// Bytes of the reply this connection holds unsent.
    fn held(&self) -> usize {
        self.output.as_ref().map_or(0, |o| o.bytes.len())
    }

    /// Sends what is pending, then reads and answers requests while replies go out at once:
    /// at most a few per wake-up, so one busy client cannot starve the others (what is left
    /// stays readable and epoll reports it again). `others`: for a user who is not an
    /// administrator, the bytes of replies the user's other connections hold unsent; at
    /// [`USER_REPLY_BYTES`] a request gets an error instead of its reply.
    fn pump(&mut self, engine: &Engine, others: Option<usize>) -> io::Result<()> {
        self.flush()?;
        for _ in 0..16 {
            if self.output.is_some() || self.closing || self.waiting {
                break;
            }
            let Some(body) = self.read_request()? else {
                break;
            };
            let mut fd = None;
            let uid = self.caller.uid;
            let refusal = others
                .filter(|&n| n >= USER_REPLY_BYTES)
                .map(|n| unread(uid, n));
            let (reply, fds_of) = match control::decode::<Request>(&body) {
                Ok(_) if refusal.is_some() => {
                    (refused(Error::limit(refusal.unwrap_or_default())), None)
                }
                Ok(Request::Capture {
                    port,
                    dirs,
                    snaplen,
                    bytes,
                    filter,
                }) => {
                    let want = crate::capture::Want {
                        dirs,
                        snaplen,
                        bytes,
                        filter,
                    };
                    let r = crate::capture::start(engine, &self.caller, &port, want);
                    match r {
                        Ok((reply, memfd, held)) => {
                            fd = Some(memfd);
                            self.captures.push(held);
                            (reply, None)
                        }
                        Err(e) => (refused(e), None),
                    }
                }
                Ok(req) if is_slow(&req) => {
                    // Run by the server ([`Server::start_slow`]).
                    self.slow = Some(req);
                    self.waiting = true;
                    break;
                }
                Ok(req) => handle(engine, &self.caller, req),
                Err(e) => {
                    self.closing = true;
                    (refused(Error::invalid(e.to_string())), None)
                }
            };
            if let Some(p) = &fds_of {
                self.owned.push(p.clone());
            }
            let mut out = Outgoing::new(&reply, fds_of);
            out.fd = fd;
            self.output = Some(out);
            self.flush()?;
        }
        Ok(())
    }

    /// Reads toward the next request; its body once whole. Never buffers more than one
    /// request, and refuses one longer than `MAX_REQUEST` before holding it.
    fn read_request(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut chunk = [0u8; 4096];
        loop {
            let need = if self.input.len() < 4 {
                4 - self.input.len()
            } else {
                let len = u32::from_le_bytes(self.input[..4].try_into().expect("4 bytes")) as usize;
                // A lookup module's state (the rules of a flow table) is large, and only
                // administrators send it.
                let limit = if self.caller.admin {
                    MAX_ADMIN_REQUEST
                } else {
                    MAX_REQUEST
                };
                if len > limit {
                    self.closing = true;
                    self.output = Some(Outgoing::new(
                        &refused(Error::limit(format!(
                            "control request too large: {len} bytes, the limit is {limit}"
                        ))),
                        None,
                    ));
                    return Ok(None);
                }
                if self.input.len() == 4 + len {
                    let body = self.input.split_off(4);
                    self.input.clear();
                    return Ok(Some(body));
                }
                4 + len - self.input.len()
            };
            // Descriptors a client sends along are never wanted: they are closed at once.
            let mut fds = Vec::new();
            let want = need.min(chunk.len());
            match control::recv_with_fds(self.stream.as_raw_fd(), &mut chunk[..want], &mut fds) {
                Ok(0) => {
                    self.closing = true;
                    return Ok(None);
                }
                Ok(n) => self.input.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends what it can of the pending reply without blocking.
    fn flush(&mut self) -> io::Result<()> {
        let Some(out) = &mut self.output else {
            return Ok(());
        };
        while out.sent < out.bytes.len() {
            let fds = match (&out.fds_of, &out.fd, out.sent) {
                (Some(p), _, 0) => p.attachment.as_ref().map(|a| a.client_fds()),
                (None, Some(fd), 0) => Some(vec![fd.as_raw_fd()]),
                _ => None,
            };
            let r = control::send_with_fds(
                self.stream.as_raw_fd(),
                &out.bytes[out.sent..],
                fds.as_deref().unwrap_or(&[]),
                true,
            );
            match r {
                Ok(n) => out.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        self.output = None;
        Ok(())
    }
}

impl Outgoing {
    fn new(reply: &Reply, fds_of: Option<Arc<Port>>) -> Outgoing {
        let bytes = control::encode(reply).unwrap_or_else(|e| {
            control::encode(&refused(Error::io(format!("cannot send the reply: {e}"))))
                .expect("a short error encodes")
        });
        Outgoing {
            bytes,
            sent: 0,
            fds_of,
            fd: None,
        }
    }
}

/// Tells a refused client why, if its socket takes the message at once, and hangs up.
fn refuse(stream: &UnixStream, message: String) {
    tracing::debug!("refusing a connection: {message}");
    if let Ok(bytes) = control::encode(&refused(Error::limit(message))) {
        let _ = control::send_with_fds(stream.as_raw_fd(), &bytes, &[], true);
    }
}

/// valed's reply to a refused request: the error's kind and its words.
pub(crate) fn refused(e: Error) -> Reply {
    Reply::Error {
        kind: e.kind,
        message: e.message,
    }
}

/// Whether `req` may wait on something other than valed's own tables: a device's thread (a
/// detach, a destroy), a device being opened (an attach), a lookup module's code.
fn is_slow(req: &Request) -> bool {
    matches!(
        req,
        Request::Attach { .. }
            | Request::Detach { .. }
            | Request::Destroy { .. }
            | Request::SetLookup { .. }
            | Request::LookupControl { .. }
            | Request::Save
    )
}

/// Where the answers of slow requests go: the channel, and the eventfd that says so.
type AnswerTo = (mpsc::Sender<Answer>, Arc<OwnedFd>);

/// Runs slow request `req` of connection `token` (numbered `serial`) of `caller` on a thread;
/// its answer goes to `to`, for [`Server::take_answers`]. (No slow request hands descriptors
/// back.)
fn run_slow(engine: Arc<Engine>, to: AnswerTo, who: (usize, u64, Caller), req: Request) {
    let back = to.clone();
    let spawned = std::thread::Builder::new()
        .name("vale-request".into())
        .spawn(move || {
            let (reply, _) = handle(&engine, &who.2, req);
            answer(&to, who, reply);
        });
    if let Err(e) = spawned {
        let reply = refused(Error::io(format!("cannot serve the request: {e}")));
        answer(&back, who, reply);
    }
}

/// Sends `reply` to connection `token` (numbered `serial`) of `caller` through `to`.
fn answer(to: &AnswerTo, (token, serial, caller): (usize, u64, Caller), reply: Reply) {
    let _ = to.0.send(Answer {
        token,
        serial,
        caller,
        reply,
    });
    vale_abi::eventfd::signal(&*to.1);
}

/// The refusal of a request of user `uid`, whose replies left unread add up to `n` bytes.
fn unread(uid: u32, n: usize) -> String {
    format!(
        "uid {uid} has {n} bytes of replies from valed unread on its other connections, the \
         most valed keeps for a user ({USER_REPLY_BYTES}): read them before asking more"
    )
}

/// Carries out one request for `caller`; the reply, and the port whose descriptors go with it.
fn handle(engine: &Engine, caller: &Caller, req: Request) -> (Reply, Option<Arc<Port>>) {
    let done = |r: Result<(), Error>| match r {
        Ok(()) => Reply::Ok,
        Err(e) => refused(e),
    };
    let reply = match req {
        Request::Open {
            port,
            params,
            abi_version,
        } => {
            if abi_version != VALE_ABI_VERSION {
                let message = format!(
                    "client speaks vale ABI version {abi_version}, valed speaks {VALE_ABI_VERSION}"
                );
                return (refused(Error::new(ErrorKind::Unsupported, message)), None);
            }
            return match engine.open(&port, &params, caller) {
                Ok(opened) => {
                    let fds = opened.fds().len() as u32;
                    (Reply::Opened { port, fds }, Some(opened.port))
                }
                Err(e) => (refused(e), None),
            };
        }
        Request::List => Reply::List {
            switches: engine.list(),
        },
        Request::Workers => Reply::Workers {
            workers: engine.workers(),
        },
        Request::Create { port } => done(engine.create(&port, caller)),
        Request::Attach { port, kind, args } => {
            let r = engine.attach_host(&port, &kind, &args, caller);
            if r.is_ok() {
                crate::persist::attached(&port, &kind, &args);
            }
            done(r)
        }
        Request::Detach { port } => done(engine.detach(&port, caller)),
        Request::Destroy { name } => done(engine.destroy(&name, caller)),
        Request::Set {
            target,
            knob,
            value,
        } => done(engine.set(&target, &knob, &value, caller)),
        Request::Lookup { switch } => match engine.lookup_info(&switch) {
            Ok(lookup) => Reply::Lookup { lookup },
            Err(e) => refused(e),
        },
        Request::SetLookup {
            switch,
            module,
            args,
        } => match engine.set_lookup(&switch, &module, &args, caller) {
            Ok(lookup) => Reply::Lookup { lookup },
            Err(e) => refused(e),
        },
        Request::LookupControl {
            switch,
            command,
            body,
        } => match engine.lookup_control(&switch, &command, &body, caller) {
            Ok((module, output)) => Reply::LookupControl { module, output },
            Err(e) => refused(e),
        },
        Request::Save => crate::persist::save_request(engine, caller),
        Request::Capture { .. } => refused(Error::new(
            ErrorKind::Unsupported,
            "capture is served by the connection",
        )),
    };
    (reply, None)
}

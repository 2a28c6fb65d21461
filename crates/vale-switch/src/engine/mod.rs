//! Every switch and worker of one valed, and the operations the control plane calls.
//!
//! Control operations are serialised by one lock; forwarding never takes it.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::atomic::{
    AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vale_abi::control::{LookupInfo, ModuleArg, ModuleCounter, PortInfo, SwitchInfo, WorkerInfo};
use vale_abi::name::{parse_port, parse_switch};
use vale_abi::region::{Layout, PortParams};

use crate::access::{Caller, Usage, UserLimits};
use crate::capture::CaptureRing;
use crate::drive;
use crate::error::Error;
use crate::host;
use crate::kind::{self, Device, KindArgs};
use crate::lookup;
use crate::port::{descriptors_for, Attachment, Port, PortIndex, PortShared};
use crate::switch::{Installed, Switch, DEFAULT_BATCH, MAX_PORTS};
use crate::worker::{Cmd, Worker, WorkerStats};

mod modules;
pub use modules::SavedLookup;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub workers: usize,
    pub busy_poll: Duration,
    /// The forwarding threads' adaptive spin (see `worker.rs`); unused with `busy_poll`.
    pub spin: Duration,
    /// Batch size of new switches.
    pub batch: u32,
    /// What one user that is not an administrator may hold.
    pub user_limits: UserLimits,
    /// Descriptors all ports together may hold before users that are not administrators are
    /// refused more: what valed may spend on ports and still serve its connections.
    pub descriptor_budget: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: 1,
            busy_poll: Duration::ZERO,
            spin: crate::DEFAULT_SPIN,
            batch: DEFAULT_BATCH,
            user_limits: UserLimits::default(),
            descriptor_budget: usize::MAX,
        }
    }
}

pub struct Engine {
    cfg: EngineConfig,
    /// The clock of moderation and learning timestamps, shared by every pipeline.
    epoch: Instant,
    switches: Mutex<Switches>,
    workers: Vec<Arc<Worker>>,
    next_worker: AtomicUsize,
    /// Each user's budget of capture filter instructions.
    filter_budgets: crate::capture::FilterBudgets,
}

type Switches = BTreeMap<String, Arc<Switch>>;

/// A switch goes with its last port.
/// Largest capture buffer of a user that is not an administrator.
pub const USER_CAPTURE_BYTES: u64 = 64 << 20;

/// Switch `name` (`valeX`), which must exist.
fn existing_switch<'a>(sws: &'a Switches, name: &str) -> Result<&'a Arc<Switch>, Error> {
    parse_switch(name)?;
    sws.get(name)
        .ok_or_else(|| Error::not_found(format!("no such switch '{name}'")))
}

/// Port `name` (`valeX:Y`), which must exist, and its switch.
fn existing_port<'a>(sws: &'a Switches, name: &str) -> Result<(&'a Arc<Switch>, Arc<Port>), Error> {
    let (sw_name, _) = parse_port(name)?;
    let sw = existing_switch(sws, sw_name)?;
    let p = sw
        .find(name)
        .ok_or_else(|| Error::not_found(format!("no such port '{name}'")))?;
    Ok((sw, p))
}

fn forget_if_empty(sws: &mut Switches, sw: &Switch) {
    if sw.port_count() == 0 {
        sws.remove(&sw.name);
    }
}

/// A port handed to a client, and the descriptors to send it.
pub struct OpenedPort {
    pub port: Arc<Port>,
}

impl OpenedPort {
    /// memfd, then per ring (tx, then rx) kick and interrupt eventfds; valid while `port` is.
    pub fn fds(&self) -> Vec<RawFd> {
        self.port
            .attachment
            .as_ref()
            .map(|a| a.client_fds())
            .unwrap_or_default()
    }
}

/// Largest `learn-limit` of a port (a table holds fewer entries anyway).
const MAX_LEARN_LIMIT: u64 = 1 << 20;

/// Longest a control operation waits for workers to let go of a port.
const DETACH_WAIT: Duration = Duration::from_secs(5);

impl Engine {
    pub fn new(cfg: EngineConfig) -> std::io::Result<Arc<Engine>> {
        let epoch = Instant::now();
        let peers = Arc::new(std::sync::OnceLock::new());
        let workers = (0..cfg.workers.max(1))
            .map(|i| Worker::spawn(i, cfg.busy_poll, cfg.spin, epoch, peers.clone()))
            .collect::<std::io::Result<Vec<_>>>()?;
        let _ = peers.set(workers.clone());
        Ok(Arc::new(Engine {
            cfg,
            epoch,
            switches: Mutex::new(BTreeMap::new()),
            workers,
            next_worker: AtomicUsize::new(0),
            filter_budgets: Default::default(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Switches> {
        self.switches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Switch `name`, created if absent.
    fn switch_entry(&self, sws: &mut Switches, name: &str) -> Arc<Switch> {
        sws.entry(name.to_string())
            .or_insert_with(|| Arc::new(Switch::new(name, self.cfg.batch)))
            .clone()
    }

    /// Runs `f` on the switch of port `name`, made if absent, under the engine lock; a switch
    /// that `f` leaves empty goes. `f` also sees every switch, to count what a user holds.
    fn with_switch<T>(
        &self,
        name: &str,
        f: impl FnOnce(&Switches, &Arc<Switch>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let (sw_name, _) = parse_port(name)?;
        let mut sws = self.lock();
        let sw = self.switch_entry(&mut sws, sw_name);
        let result = f(&sws, &sw);
        forget_if_empty(&mut sws, &sw);
        result
    }

    /// Fails if `caller` may not take port `name` of `sw` with `layout`: the caller's limits,
    /// or valed's budget of descriptors, would be passed.
    fn may_take(
        &self,
        sws: &Switches,
        sw: &Switch,
        name: &str,
        caller: &Caller,
        layout: &Layout,
    ) -> Result<(), Error> {
        let (mut now, all) = usage(sws, caller.uid);
        let more = Usage {
            ports: 1,
            port_memory: layout.region_size,
            descriptors: descriptors_for(layout.num_rings()),
        };
        if !caller.admin && all.descriptors + more.descriptors > self.cfg.descriptor_budget {
            return Err(Error::limit(format!(
                "valed is short of descriptors: its ports hold {} of the {} it may give them \
                 (raise valed's descriptor limit, or lower its --max-conns)",
                all.descriptors, self.cfg.descriptor_budget
            )));
        }
        if let Some(p) = sw.find(name) {
            // Taking a port of one's own (`place` sees to that) does not count it twice.
            if p.shared.owner_uid == caller.uid {
                now.ports = now.ports.saturating_sub(1);
            }
        }
        self.cfg.user_limits.check(caller, now, more)
    }

    /// Attaches a client to `name`, creating the switch and port if needed.
    pub fn open(
        &self,
        name: &str,
        params: &PortParams,
        caller: &Caller,
    ) -> Result<OpenedPort, Error> {
        let layout = Layout::new(params)?;
        self.with_switch(name, |sws, sw| {
            self.may_take(sws, sw, name, caller, &layout)?;
            self.attach(sw, name, layout, caller)
        })
    }

    fn attach(
        &self,
        sw: &Arc<Switch>,
        name: &str,
        layout: Layout,
        caller: &Caller,
    ) -> Result<OpenedPort, Error> {
        let (index, shared) = place(sw, name, caller)?;
        let owner = caller.pid;
        let att = Attachment::new(name, layout, owner)
            .map_err(|e| Error::of_io(format!("cannot create memory for port '{name}': {e}"), e))?;
        let port = Arc::new(Port {
            shared,
            index,
            attachment: Some(att),
        });
        sw.install(port.clone());
        for ring in 0..layout.params.tx_rings {
            let w = self.next_worker.fetch_add(1, Relaxed) % self.workers.len();
            self.workers[w].send(Cmd::Add {
                sw: sw.clone(),
                port: port.clone(),
                ring,
            });
        }
        tracing::info!(port = name, pid = owner, ?layout.params, "port attached");
        Ok(OpenedPort { port })
    }

    /// Attaches a device of port kind `kind` (see [`host::KINDS`]) that `args` describe as
    /// port `name`; valed moves its frames.
    pub fn attach_host(
        &self,
        name: &str,
        kind: &str,
        args: &KindArgs,
        caller: &Caller,
    ) -> Result<(), Error> {
        self.attach_with(name, kind, args, caller, host::open_device)
    }

    /// Attaches again, at valed's start, a device port saved as `kind` and `args` (its
    /// [`kind::Kind::saved`] form; the kind's own retries and namespaces apply).
    pub fn restore_host(
        &self,
        name: &str,
        kind: &str,
        args: &KindArgs,
        caller: &Caller,
    ) -> Result<(), Error> {
        self.attach_with(name, kind, args, caller, host::restore_device)
    }

    fn attach_with(
        &self,
        name: &str,
        kind: &str,
        args: &KindArgs,
        caller: &Caller,
        open: host::OpenDevice,
    ) -> Result<(), Error> {
        caller.must_be_admin("attaching a host device")?;
        self.with_switch(name, |_, sw| {
            // Before the device is opened: a refused attach must not create one (a TAP, say).
            place(sw, name, caller)?;
            let dev = open(kind, args)?;
            self.attach_device_to(sw, name, dev, caller)?;
            tracing::info!(port = name, kind, ?args, "host port attached");
            Ok(())
        })
    }

    /// Attaches an open device as port `name`: what [`Engine::attach_host`] does once the
    /// kind's registry has opened it, for a device made elsewhere (embedding, tests).
    pub fn attach_device(
        &self,
        name: &str,
        dev: Box<dyn Device>,
        caller: &Caller,
    ) -> Result<(), Error> {
        caller.must_be_admin("attaching a host device")?;
        self.with_switch(name, |_, sw| self.attach_device_to(sw, name, dev, caller))
    }

    fn attach_device_to(
        &self,
        sw: &Arc<Switch>,
        name: &str,
        dev: Box<dyn Device>,
        caller: &Caller,
    ) -> Result<(), Error> {
        // The ring geometry is the kind's (a TAP's frames are up to 64 KiB long).
        let layout = Layout::new(&dev.params())?;
        let (index, shared) = place(sw, name, caller)?;
        let mut att = Attachment::new(name, layout, std::process::id())
            .map_err(|e| Error::of_io(format!("cannot create memory for port '{name}': {e}"), e))?;
        att.caps = dev.caps().0.into();
        att.direct = dev.direct();
        let state = kind::state_of(&*dev)
            .map_err(|e| Error::of_io(format!("cannot set up port '{name}': {e}"), e))?;
        att.host = Some(state.clone());
        let port = Arc::new(Port {
            shared,
            index,
            attachment: Some(att),
        });
        sw.install(port.clone());
        if let Err(e) = drive::start(
            sw.clone(),
            port.clone(),
            dev.driver(),
            state,
            self.epoch,
            self.cfg.busy_poll,
        ) {
            sw.replace(&port, None);
            return Err(Error::of_io(format!("cannot start port '{name}': {e}"), e));
        }
        Ok(())
    }

    /// Gives the device of host port `name` back; a persistent port stays, empty.
    pub fn detach(&self, name: &str, caller: &Caller) -> Result<(), Error> {
        let port = {
            let sws = self.lock();
            let (_, p) = existing_port(&sws, name)?;
            caller.must_own(&p.shared, "detach")?;
            if p.attachment
                .as_ref()
                .and_then(|a| a.host.as_ref())
                .is_none()
            {
                return Err(Error::invalid(format!(
                    "port '{name}' has no device to detach (only ports made by 'vale-ctl \
                     attach' have one)"
                )));
            }
            p
        };
        // Detaching is what a client's going away is for a native port.
        self.close(&port);
        Ok(())
    }

    /// The owner of `port` went away: free it (a persistent port stays, empty).
    pub fn close(&self, port: &Arc<Port>) {
        {
            let mut sws = self.lock();
            let (sw_name, _) = parse_port(port.name()).expect("ports have valid names");
            if let Some(sw) = sws.get(sw_name).cloned() {
                let keep = port.shared.persistent.load(Relaxed).then(|| {
                    Arc::new(Port {
                        shared: port.shared.clone(),
                        index: port.index,
                        attachment: None,
                    })
                });
                sw.replace(port, keep);
                forget_if_empty(&mut sws, &sw);
            }
        }
        self.release(port);
        tracing::info!(port = port.name(), "port detached");
    }

    /// Makes every worker drop its references to `port`, so its memory goes now.
    fn release(&self, port: &Arc<Port>) {
        let Some(att) = &port.attachment else { return };
        // Before the removals: a ring one worker hands another from now on is not taken.
        att.released.store(true, SeqCst);
        if let Some(h) = &att.host {
            // The port's own thread goes first; the device closes with it.
            h.stop();
        }
        let (tx, rx) = mpsc::channel();
        for w in &self.workers {
            w.send(Cmd::Remove {
                port: port.clone(),
                done: tx.clone(),
            });
        }
        for _ in &self.workers {
            if rx.recv_timeout(DETACH_WAIT).is_err() {
                tracing::error!(port = port.name(), "a worker did not release the port");
                break;
            }
        }
    }

    /// Creates persistent port `name`, or makes an existing port persistent.
    pub fn create(&self, name: &str, caller: &Caller) -> Result<(), Error> {
        self.with_switch(name, |sws, sw| {
            if let Some(p) = sw.find(name) {
                caller.must_own(&p.shared, "make persistent")?;
                p.shared.persistent.store(true, Relaxed);
                return Ok(());
            }
            let more = Usage {
                ports: 1,
                ..Usage::default()
            };
            self.cfg
                .user_limits
                .check(caller, usage(sws, caller.uid).0, more)?;
            let Some(index) = sw.free_index() else {
                return Err(Error::limit(format!(
                    "switch '{}' is full ({MAX_PORTS} ports)",
                    sw.name
                )));
            };
            sw.install(Arc::new(Port {
                shared: Arc::new(PortShared::new(name.to_string(), true, caller.uid)),
                index,
                attachment: None,
            }));
            Ok(())
        })
    }

    /// Removes a port (taking it from its owner, if any) or a whole switch.
    pub fn destroy(&self, name: &str, caller: &Caller) -> Result<(), Error> {
        let mut gone = Vec::new();
        {
            let mut sws = self.lock();
            if name.contains(':') {
                let (sw, p) = existing_port(&sws, name)?;
                let sw = sw.clone();
                caller.must_own(&p.shared, "destroy")?;
                p.shared.persistent.store(false, Relaxed);
                sw.replace(&p, None);
                gone.push(p);
                forget_if_empty(&mut sws, &sw);
            } else {
                let sw = existing_switch(&sws, name)?.clone();
                // A user may remove a switch whose every port is theirs.
                if !caller.admin {
                    for p in sw.ports().iter().flatten() {
                        caller.must_own(&p.shared, "destroy")?;
                    }
                }
                sws.remove(name);
                for p in sw.ports().iter().flatten() {
                    p.shared.persistent.store(false, Relaxed);
                    sw.replace(p, None);
                    gone.push(p.clone());
                }
            }
        }
        for p in &gone {
            self.release(p);
            tracing::info!(port = p.name(), "port destroyed");
        }
        Ok(())
    }

    /// Starts a capture of port `name`'s frames in directions `dirs` ([`vale_abi::capture`]).
    /// Reading a port's traffic is the port owner's right, as tuning it is: the owner or an
    /// administrator. A user that is not an administrator gets at most
    /// [`USER_CAPTURE_BYTES`] of buffer, and the buffer counts in its port memory. The
    /// filter runs on the caller's budget ([`crate::capture::FilterBudget`]). The caller
    /// removes the capture from the port when it is done with it; it ends by itself when the
    /// port goes away.
    pub fn capture(
        &self,
        name: &str,
        dirs: u32,
        snaplen: u32,
        bytes: u64,
        filter: Vec<vale_abi::capture::BpfInsn>,
        caller: &Caller,
    ) -> Result<(Arc<PortShared>, Arc<CaptureRing>), Error> {
        let sws = self.lock();
        let (_, p) = existing_port(&sws, name)?;
        caller.must_own(&p.shared, "capture")?;
        if !caller.admin && bytes > USER_CAPTURE_BYTES {
            return Err(Error::limit(format!(
                "a capture buffer of a user that is not an administrator is at most {} MiB",
                USER_CAPTURE_BYTES >> 20
            )));
        }
        let size = crate::capture::Geometry::new(dirs, snaplen, bytes)?.size as u64;
        let (now, _) = usage(&sws, caller.uid);
        self.cfg
            .user_limits
            .check_memory(caller, now.port_memory, size, "a capture buffer")?;
        let filter = if filter.is_empty() {
            None
        } else {
            let f = crate::capture::Filter::new(filter)?;
            Some((f, self.filter_budgets.of(caller.uid)))
        };
        let ring = Arc::new(CaptureRing::new(
            name, caller.uid, dirs, snaplen, bytes, filter,
        )?);
        p.shared.captures.add(ring.clone())?;
        tracing::info!(
            port = name,
            uid = caller.uid,
            bytes = size,
            "capture started"
        );
        Ok((p.shared.clone(), ring))
    }

    /// Sets a knob: `batch` or `lookup` on a switch, `moderation` (µs) or `learn-limit` on a
    /// port.
    pub fn set(&self, target: &str, knob: &str, value: &str, caller: &Caller) -> Result<(), Error> {
        let sws = self.lock();
        let sw_name = if target.contains(':') {
            parse_port(target)?.0
        } else {
            target
        };
        let sw = existing_switch(&sws, sw_name)?;
        let number = |max: u64| -> Result<u64, Error> {
            value
                .parse::<u64>()
                .ok()
                .filter(|v| *v <= max)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{knob} must be a number from 0 to {max}, not '{value}'"
                    ))
                })
        };
        if target.contains(':') {
            let p = sw
                .find(target)
                .ok_or_else(|| Error::not_found(format!("no such port '{target}'")))?;
            caller.must_own(&p.shared, "tune")?;
            match knob {
                "moderation" => {
                    let us = number(1_000_000)?;
                    p.shared.moderation_ns.store(us * 1000, Relaxed);
                    Ok(())
                }
                "learn-limit" => {
                    // The limit protects the other ports' share of the table: not the port
                    // owner's to raise.
                    caller.must_be_admin(&format!("setting 'learn-limit' of port '{target}'"))?;
                    let n = number(MAX_LEARN_LIMIT)?;
                    p.shared.learn_limit.store(n as u32, Relaxed);
                    Ok(())
                }
                _ => Err(Error::invalid(format!(
                    "no port knob '{knob}' (known: moderation, learn-limit)"
                ))),
            }
        } else {
            caller.must_be_admin(&format!("setting '{knob}' of switch '{sw_name}'"))?;
            match knob {
                "batch" => Ok(sw.set_batch(number(u32::MAX as u64)? as u32)?),
                "lookup" => {
                    sw.set_lookup(Installed::make(sw_name, value, Vec::new())?);
                    Ok(())
                }
                _ => Err(Error::invalid(format!(
                    "no switch knob '{knob}' (known: batch, lookup)"
                ))),
            }
        }
    }

    /// Every worker and its counters, read without stopping it.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.workers
            .iter()
            .enumerate()
            .map(|(id, w)| {
                let tid = w.stats.tid.load(Relaxed);
                WorkerInfo {
                    id: id as u32,
                    tid,
                    busy_ns: WorkerStats::cpu_ns(tid),
                    batches: w.stats.batches.load(Relaxed),
                    slots: w.stats.slots.load(Relaxed),
                    rings: w.stats.rings.load(Relaxed),
                }
            })
            .collect()
    }

    /// Every switch with its ports and their counters (copied out under the control lock,
    /// which forwarding never takes).
    pub fn list(&self) -> Vec<SwitchInfo> {
        let sws = self.lock();
        sws.values()
            .map(|sw| SwitchInfo {
                name: sw.name.clone(),
                lookup: sw.lookup().name().to_string(),
                batch: sw.batch.load(Relaxed),
                ports: sw
                    .ports()
                    .iter()
                    .flatten()
                    .map(|p| port_info(p, &***sw.lookup()))
                    .collect(),
            })
            .collect()
    }
}

/// Where port `name` goes in `sw`: the index and kept state of an unowned port of that name
/// that `caller` may take, or a free index and fresh state belonging to the caller.
fn place(sw: &Switch, name: &str, caller: &Caller) -> Result<(PortIndex, Arc<PortShared>), Error> {
    match sw.find(name) {
        Some(p) => match &p.attachment {
            Some(a) => Err(Error::busy(in_use(name, a))),
            None => {
                caller.must_own(&p.shared, "open")?;
                Ok((p.index, p.shared.clone()))
            }
        },
        None => {
            let i = sw.free_index().ok_or_else(|| {
                Error::limit(format!("switch '{}' is full ({MAX_PORTS} ports)", sw.name))
            })?;
            Ok((
                i,
                Arc::new(PortShared::new(name.to_string(), false, caller.uid)),
            ))
        }
    }
}

/// What user `uid` holds (its ports, the memory and descriptors of those that are held), and
/// what all ports together hold.
fn usage(sws: &Switches, uid: u32) -> (Usage, Usage) {
    let (mut mine, mut all) = (Usage::default(), Usage::default());
    for sw in sws.values() {
        for p in sw.ports().iter().flatten() {
            let port = match &p.attachment {
                Some(a) => {
                    let layout = a.region.layout();
                    Usage {
                        ports: 1,
                        port_memory: layout.region_size,
                        descriptors: descriptors_for(layout.num_rings()),
                    }
                }
                None => Usage {
                    ports: 1,
                    ..Usage::default()
                },
            };
            all.add(port);
            if p.shared.owner_uid == uid {
                mine.add(port);
            }
            // Capture buffers count in the port memory of whoever started them.
            let dirs = vale_abi::capture::DIR_TX | vale_abi::capture::DIR_RX;
            p.shared.captures.each(dirs, |c| {
                let buffer = Usage {
                    port_memory: c.size() as u64,
                    ..Usage::default()
                };
                all.add(buffer);
                if c.owner_uid() == uid {
                    mine.add(buffer);
                }
            });
        }
    }
    (mine, all)
}

/// Why a port cannot be opened or attached: it already has an owner.
fn in_use(name: &str, a: &Attachment) -> String {
    match &a.host {
        Some(h) => format!("port '{name}' is a {} port of device {}", h.kind, h.device),
        None => format!("port '{name}' is in use by pid {}", a.owner_pid),
    }
}

fn port_info(p: &Port, lookup: &dyn lookup::Lookup) -> PortInfo {
    let params = p.attachment.as_ref().map(|a| a.region.layout().params);
    let host = p.attachment.as_ref().and_then(|a| a.host.as_ref());
    let state = match (&p.attachment, host) {
        (None, _) => "free",
        (Some(_), Some(h)) if !h.up.load(Relaxed) => "down",
        _ => "up",
    };
    PortInfo {
        name: p.name().to_string(),
        kind: host.map_or("native", |h| h.kind).into(),
        device: host.map(|h| h.device.clone()),
        mode: host.map(|h| h.mode.clone()).filter(|m| !m.is_empty()),
        state: state.into(),
        persistent: p.shared.persistent.load(Relaxed),
        owner_pid: p.attachment.as_ref().map(|a| a.owner_pid),
        owner_uid: p.shared.owner_uid,
        tx_rings: params.map_or(0, |x| x.tx_rings),
        rx_rings: params.map_or(0, |x| x.rx_rings),
        slots: params.map_or(0, |x| x.slots),
        buf_size: params.map_or(0, |x| x.buf_size),
        moderation_us: (p.shared.moderation_ns.load(Relaxed) / 1000) as u32,
        learn_limit: p.shared.learn_limit.load(Relaxed),
        learnt: lookup.learnt(p.index).unwrap_or(0),
        negotiated: host
            .map(|h| {
                h.negotiated
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            })
            .filter(|n| !n.is_empty()),
        counters: p.shared.stats.snapshot(),
    }
}

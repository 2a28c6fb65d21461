//! A switch: its port table, its lookup module and its knobs.
//!
//! The table is copy-on-write behind an `ArcSwap`: the forwarding workers load a snapshot once
//! per batch without taking a lock, and the control plane (serialised by the engine) publishes a
//! new table when a port comes or goes. A port's memory lives as long as any snapshot or worker
//! still holds it, so a departing port can never be written after it is unmapped.

use std::ops::Deref;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};

use crate::error::Error;
use crate::lookup::{self, ControlCtx, KeptArg, Lookup};
use crate::port::{Port, PortIndex};

pub use crate::index::MAX_PORTS;
/// Default and largest batch (frames per stage-1 gather).
pub const DEFAULT_BATCH: u32 = 512;
pub const MAX_BATCH: u32 = 2048;

pub type PortTable = Vec<Option<Arc<Port>>>;

/// A switch's lookup module and what it was made from.
pub struct Installed {
    pub module: Box<dyn Lookup>,
    /// The built-in module's name, or the shared object's path.
    pub spec: String,
    /// Its arguments as shown and saved ([`Lookup::installing`] may have summarised some).
    pub args: Vec<KeptArg>,
}

impl Installed {
    /// Makes module `spec` from `args` for switch `switch`; nothing is installed yet. The
    /// module may refuse the switch ([`Lookup::installing`]).
    pub fn make(
        switch: &str,
        spec: &str,
        args: Vec<(String, String)>,
    ) -> Result<Installed, lookup::Error> {
        let module = lookup::make(spec, &args)?;
        let mut args: Vec<KeptArg> = args
            .into_iter()
            .map(|(key, value)| KeptArg {
                key,
                value,
                saved: true,
            })
            .collect();
        module.installing(ControlCtx { switch }, &mut args)?;
        Ok(Installed {
            module,
            spec: spec.to_string(),
            args,
        })
    }
}

impl Deref for Installed {
    type Target = dyn Lookup;
    fn deref(&self) -> &(dyn Lookup + 'static) {
        &*self.module
    }
}

/// Longest a module swap waits for the batches still using the old module.
const SWAP_WAIT: Duration = Duration::from_secs(2);

pub struct Switch {
    pub name: String,
    ports: ArcSwap<PortTable>,
    lookup: ArcSwap<Installed>,
    pub batch: AtomicU32,
    /// Held while the lookup module runs a command (one at a time), and how many commands
    /// run or wait for it (see `Engine::lookup_control`).
    pub(crate) commands: std::sync::Mutex<()>,
    pub(crate) commands_queued: std::sync::atomic::AtomicUsize,
}

impl Switch {
    pub fn new(name: &str, batch: u32) -> Switch {
        Switch {
            name: name.to_string(),
            ports: ArcSwap::from_pointee(Vec::new()),
            lookup: ArcSwap::from_pointee(
                Installed::make(name, lookup::MODULES[0].0, Vec::new()).expect("default module"),
            ),
            batch: AtomicU32::new(batch.clamp(1, MAX_BATCH)),
            commands: std::sync::Mutex::new(()),
            commands_queued: Default::default(),
        }
    }

    /// The current table, for one batch.
    #[inline]
    pub fn ports(&self) -> Guard<Arc<PortTable>> {
        self.ports.load()
    }

    /// The lookup module, for one batch: a worker holds it until the batch is delivered.
    #[inline]
    pub fn lookup(&self) -> Guard<Arc<Installed>> {
        self.lookup.load()
    }

    /// Makes `new` the switch's module. Control plane only (serialised by the engine, so no
    /// port comes or goes meanwhile).
    ///
    /// The new module is told every port first. Each batch loads the module once and uses
    /// that one for the whole batch, so a batch is looked up and delivered by the old module
    /// or by the new, never by both: the swap loses and duplicates no frame. The old module
    /// is freed here, once no batch holds it any more (the swap turns every worker's
    /// outstanding load into a counted reference, so the count says when): a shared object's
    /// library is closed on the control thread, after its last call has returned.
    pub fn set_lookup(&self, new: Installed) {
        for p in self.ports().iter().flatten() {
            new.port_added(p.index, p.name());
        }
        let old = self.lookup.swap(Arc::new(new));
        let deadline = Instant::now() + SWAP_WAIT;
        while Arc::strong_count(&old) > 1 {
            if Instant::now() >= deadline {
                // The last batch using it frees it: still safe, only not here.
                tracing::warn!(switch = self.name, "old lookup module still in use");
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn set_batch(&self, batch: u32) -> Result<(), Error> {
        if !(1..=MAX_BATCH).contains(&batch) {
            return Err(Error::invalid(format!(
                "batch must be 1 to {MAX_BATCH}, not {batch}"
            )));
        }
        self.batch.store(batch, Relaxed);
        Ok(())
    }

    pub fn find(&self, port_name: &str) -> Option<Arc<Port>> {
        self.ports()
            .iter()
            .flatten()
            .find(|p| p.name() == port_name)
            .cloned()
    }

    pub fn port_count(&self) -> usize {
        self.ports().iter().flatten().count()
    }

    /// Lowest free index, if the switch is not full.
    pub fn free_index(&self) -> Option<PortIndex> {
        let t = self.ports();
        let i = t.iter().position(|p| p.is_none()).unwrap_or(t.len());
        (i < MAX_PORTS).then_some(i as PortIndex)
    }

    /// Puts `port` at its index. Control plane only (callers are serialised by the engine).
    pub fn install(&self, port: Arc<Port>) {
        let mut t: PortTable = (**self.ports()).clone();
        let i = port.index as usize;
        if t.len() <= i {
            t.resize(i + 1, None);
        }
        let (index, name) = (port.index, port.name().to_string());
        t[i] = Some(port);
        self.ports.store(Arc::new(t));
        self.lookup().port_added(index, &name);
    }

    /// Replaces `old` by `new` (or removes it) if `old` is still the port at its index, and
    /// tells the lookup module when the index is vacated. Control plane only.
    pub fn replace(&self, old: &Arc<Port>, new: Option<Arc<Port>>) -> bool {
        let mut t: PortTable = (**self.ports()).clone();
        let i = old.index as usize;
        match t.get(i) {
            Some(Some(p)) if Arc::ptr_eq(p, old) => {
                let vacated = new.is_none();
                t[i] = new;
                while matches!(t.last(), Some(None)) {
                    t.pop();
                }
                self.ports.store(Arc::new(t));
                if vacated {
                    self.lookup().port_removed(old.index);
                    // The port is gone: its captures end (a reader sees it and finishes).
                    old.shared.captures.end_all();
                }
                true
            }
            _ => false,
        }
    }
}

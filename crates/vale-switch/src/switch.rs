//! A switch: its port table, its lookup module and its knobs.
//!
//! The table is copy-on-write behind an `ArcSwap`: the forwarding workers load a snapshot once
//! per batch without taking a lock, and the control plane (serialised by the engine) publishes a
//! new table when a port comes or goes. A port's memory lives as long as any snapshot or worker
//! still holds it, so a departing port can never be written after it is unmapped.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use crate::lookup::{self, Lookup};
use crate::port::{Port, PortIndex};

/// Most ports one switch holds.
pub const MAX_PORTS: usize = 2048;
/// Default and largest batch (frames per stage-1 gather).
pub const DEFAULT_BATCH: u32 = 512;
pub const MAX_BATCH: u32 = 2048;

pub type PortTable = Vec<Option<Arc<Port>>>;

pub struct Switch {
    pub name: String,
    ports: ArcSwap<PortTable>,
    lookup: ArcSwap<Box<dyn Lookup>>,
    pub batch: AtomicU32,
}

impl Switch {
    pub fn new(name: &str, batch: u32) -> Switch {
        Switch {
            name: name.to_string(),
            ports: ArcSwap::from_pointee(Vec::new()),
            lookup: ArcSwap::from_pointee(
                lookup::by_name(lookup::MODULES[0]).expect("default module"),
            ),
            batch: AtomicU32::new(batch.clamp(1, MAX_BATCH)),
        }
    }

    /// The current table, for one batch.
    #[inline]
    pub fn ports(&self) -> Guard<Arc<PortTable>> {
        self.ports.load()
    }

    #[inline]
    pub fn lookup(&self) -> Guard<Arc<Box<dyn Lookup>>> {
        self.lookup.load()
    }

    pub fn set_lookup(&self, module: Box<dyn Lookup>) {
        self.lookup.store(Arc::new(module));
    }

    pub fn set_batch(&self, batch: u32) -> Result<(), String> {
        if !(1..=MAX_BATCH).contains(&batch) {
            return Err(format!("batch must be 1 to {MAX_BATCH}, not {batch}"));
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
        t[i] = Some(port);
        self.ports.store(Arc::new(t));
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
                    self.lookup().forget_port(old.index);
                }
                true
            }
            _ => false,
        }
    }
}

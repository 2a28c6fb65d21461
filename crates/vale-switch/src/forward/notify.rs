//! Interrupts toward clients, raised once per destination per batch and moderated per
//! port (the CSB paper, section 3.1): a due interrupt waits in the [`Notifier`] until its
//! interval ends.

use super::*;

/// Which interrupt line of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrqLine {
    Tx(u32),
    Rx(u32),
}

impl IrqLine {
    pub(super) fn of(self, port: &Port) -> Option<&Irq> {
        let a = port.attachment.as_ref()?;
        match self {
            IrqLine::Tx(r) => a.tx.get(r as usize).map(|t| &t.irq),
            IrqLine::Rx(r) => a.rx.get(r as usize).map(|t| &t.irq),
        }
    }
}

/// Raises interrupts toward clients, applying each port's moderation interval (the CSB
/// paper, section 3.1): within an interval of the last interrupt, the next one is deferred to
/// the end of the interval and raised once, however many deliveries asked for it meanwhile.
pub struct Notifier {
    epoch: Instant,
    pending: Vec<(u64, Arc<Port>, IrqLine)>,
}

impl Notifier {
    pub fn new(epoch: Instant) -> Notifier {
        Notifier {
            epoch,
            pending: Vec::new(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(super) fn raise(&mut self, port: &Arc<Port>, line: IrqLine) {
        let Some(irq) = line.of(port) else { return };
        let m = port.shared.moderation_ns.load(Relaxed);
        if m == 0 {
            pipe::signal(&irq.wr);
            return;
        }
        let now = self.now_ns();
        let last = irq.last_ns.load(Relaxed);
        if now.saturating_sub(last) >= m {
            irq.last_ns.store(now, Relaxed);
            pipe::signal(&irq.wr);
        } else if !irq.pending.swap(true, AcqRel) {
            self.pending.push((last + m, port.clone(), line));
        }
    }

    /// Raises the deferred interrupts that are due; returns ns until the next one, if any.
    pub fn fire_due(&mut self) -> Option<u64> {
        if self.pending.is_empty() {
            return None;
        }
        let now = self.now_ns();
        let mut next = u64::MAX;
        self.pending.retain(|(due, port, line)| {
            if *due > now {
                next = next.min(*due - now);
                return true;
            }
            if let Some(irq) = line.of(port) {
                irq.pending.store(false, Release);
                irq.last_ns.store(now, Relaxed);
                pipe::signal(&irq.wr);
            }
            false
        });
        (next != u64::MAX).then_some(next)
    }

    /// Forgets deferred interrupts of a port that is going away.
    pub fn forget(&mut self, port: &Arc<Port>) {
        self.pending.retain(|(_, p, _)| !Arc::ptr_eq(p, port));
    }
}

//! Copies to captures (`vale-ctl capture`): a source's batch as gathered, a destination's
//! lists as delivered. Only called when a capture is on (one relaxed load per batch).

use super::*;

impl Pipeline {
    /// Copies the batch's frames, as the source sent them, to the source's tx captures.
    #[cold]
    pub(super) fn capture_tx(&self, src: &Port) {
        let ts = capture::now_ns();
        src.shared.captures.each(DIR_TX, |c| {
            let mut w = c.batch(DIR_TX, ts, self.held.len());
            for h in &self.held {
                let frags = &self.frags[h.first as usize..(h.first + h.count) as usize];
                // SAFETY: the batch's fragments stay readable until the batch is done.
                unsafe { w.frame(h.len, frags.iter().map(|f| (f.ptr, f.len as usize))) };
            }
        });
    }

    /// Copies the frames of lists `a` and `b` (in batch order), as the switch hands them to
    /// `dst`, to the destination's rx captures.
    #[cold]
    pub(super) fn capture_rx(&self, dst: &Port, a: u16, b: u16) {
        let ts = capture::now_ns();
        let frames = count_lists(&self.next, a, b) as usize;
        dst.shared.captures.each(DIR_RX, |c| {
            let mut w = c.batch(DIR_RX, ts, frames);
            let (mut a, mut b) = (a, b);
            while a != NIL || b != NIL {
                let h = &self.held[take_next(&self.next, &mut a, &mut b) as usize];
                let frags = &self.frags[h.first as usize..(h.first + h.count) as usize];
                // SAFETY: as in capture_tx.
                unsafe { w.frame(h.len, frags.iter().map(|f| (f.ptr, f.len as usize))) };
            }
        });
    }
}

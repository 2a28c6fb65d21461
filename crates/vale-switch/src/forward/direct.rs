//! Destinations that take frames from any forwarding thread (a [`DirectSink`]: TAP,
//! vhost-user): the batch's list handed over in one call, offload work done first where the
//! sink lacks the capability.

use super::*;

impl Pipeline {
    /// Hands the frames of lists `a` and `b` to a kind that takes them from any thread, in one
    /// call for the batch; frames with work beyond `caps` are finished first. What the sink
    /// declined is left in `a`, `b` and the segments from `seg_next` on, for the ring.
    pub(super) fn deliver_direct(
        &mut self,
        src: &Port,
        dst: &Port,
        sink: &dyn DirectSink,
        caps: Caps,
        flow: u32,
        lists: (&mut u16, &mut u16),
    ) -> usize {
        let mut out = DirectBatch {
            pipe: self,
            a: *lists.0,
            b: *lists.1,
            before: (NIL, NIL),
            caps,
            seg_next: 0,
            last_was_seg: false,
            src_bad: 0,
            resolve_drops: 0,
        };
        let d = sink.send_batch(&mut out, flow);
        let (a, b, seg_next) = (out.a, out.b, out.seg_next);
        let (src_bad, resolve_drops) = (out.src_bad, out.resolve_drops);
        let stats = dst.stats();
        add(&stats.rx_packets, d.frames);
        add(&stats.rx_bytes, d.bytes);
        add(&stats.rx_drops, d.dropped + resolve_drops);
        add(&stats.bad_input, d.bad_input);
        note_offload_errors(src, src_bad);
        if d.declined {
            (*lists.0, *lists.1) = (a, b);
            seg_next
        } else {
            // Whatever the sink did not ask for is gone with the batch.
            let segs = (self.seg_spans.len() - seg_next.min(self.seg_spans.len())) as u64;
            add(&stats.rx_drops, segs + count_lists(&self.next, a, b));
            (*lists.0, *lists.1) = (NIL, NIL);
            self.seg_spans.len()
        }
    }
}

/// The frames of one destination's lists, as a [`DirectSink`] takes them.
pub(super) struct DirectBatch<'p> {
    pipe: &'p mut Pipeline,
    a: u16,
    b: u16,
    /// The lists before the last frame was taken (for `put_back`).
    before: (u16, u16),
    caps: Caps,
    /// Next of the segments the resolver left in `pipe.seg_store`.
    seg_next: usize,
    last_was_seg: bool,
    src_bad: u64,
    resolve_drops: u64,
}

impl DirectBatch<'_> {
    /// Finishes frame `i`'s offload work in software, into `seg_store`.
    #[cold]
    #[inline(never)]
    fn resolve(&mut self, i: usize) {
        let p = &mut *self.pipe;
        let (fs, fc) = (p.held[i].first, p.held[i].count);
        p.seg_store.clear();
        p.seg_spans.clear();
        let (store, spans) = (&mut p.seg_store, &mut p.seg_spans);
        let r = resolve_frags(
            &mut p.resolver,
            &mut p.pieces,
            &p.frags[fs as usize..(fs + fc) as usize],
            Offload::from_word(p.held[i].offload),
            p.shared_source,
            |seg| {
                spans.push((store.len() as u32, seg.len() as u32));
                store.extend_from_slice(seg);
            },
        );
        self.seg_next = 0;
        if r.is_err() {
            // Headers that contradict the offload request: the sender's fault.
            p.seg_spans.clear();
            self.src_bad += 1;
            self.resolve_drops += 1;
        }
    }
}

impl DirectBatch<'_> {
    /// The next of the segments the resolver left in `seg_store` (there is one).
    #[cold]
    #[inline(never)]
    fn next_segment(&mut self) -> OutFrame<'_> {
        let p = &mut *self.pipe;
        let (s, l) = p.seg_spans[self.seg_next];
        self.seg_next += 1;
        self.last_was_seg = true;
        p.iov.clear();
        p.iov.push(libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        });
        p.iov.push(libc::iovec {
            iov_base: p.seg_store[s as usize..].as_mut_ptr().cast(),
            iov_len: l as usize,
        });
        OutFrame {
            iov: &mut p.iov,
            offload: Offload::default(),
            len: l,
        }
    }
}

impl<'p> DirectBatch<'p> {
    /// Any next frame: what the common case in `next_frame` does not take.
    #[inline(never)]
    fn next_any(&mut self) -> Option<OutFrame<'_>> {
        let i = loop {
            if self.seg_next < self.pipe.seg_spans.len() {
                return Some(self.next_segment());
            }
            if self.a == NIL && self.b == NIL {
                return None;
            }
            self.before = (self.a, self.b);
            let i = take_next(&self.pipe.next, &mut self.a, &mut self.b) as usize;
            let w = self.pipe.held[i].offload;
            if w != 0 && !Offload::from_word(w).fits(self.caps) {
                self.resolve(i);
                continue;
            }
            break i;
        };
        self.last_was_seg = false;
        let p = &mut *self.pipe;
        let f = p.held[i];
        let (fs, fc) = (f.first as usize, f.count as usize);
        // The sink's header goes first.
        let hdr = libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        };
        p.iov.clear();
        if let [g] = p.frags[fs..fs + fc] {
            // The common case, a frame in one piece: one step, no loop.
            p.iov.extend_from_slice(&[
                hdr,
                libc::iovec {
                    iov_base: g.ptr as *mut libc::c_void,
                    iov_len: g.len as usize,
                },
            ]);
        } else {
            p.iov.push(hdr);
            for g in &p.frags[fs..fs + fc] {
                p.iov.push(libc::iovec {
                    iov_base: g.ptr as *mut libc::c_void,
                    iov_len: g.len as usize,
                });
            }
        }
        Some(OutFrame {
            iov: &mut p.iov,
            offload: Offload::from_word(f.offload),
            len: f.len,
        })
    }
}

impl OutFrames for DirectBatch<'_> {
    fn next_frame(&mut self) -> Option<OutFrame<'_>> {
        // The common case, in few registers: one list left (a lone list is `a`, see
        // `Pipeline::deliver`), no segments waiting, a frame in one piece without offload
        // work. Anything else goes the general way.
        if self.b == NIL && self.a != NIL && self.seg_next >= self.pipe.seg_spans.len() {
            let p = &*self.pipe;
            let i = self.a as usize;
            let one = match (p.held.get(i), p.next.get(i)) {
                (Some(&f), Some(&next)) if f.count == 1 && f.offload == 0 => {
                    p.frags.get(f.first as usize).map(|&g| (g, f.len, next))
                }
                _ => None,
            };
            if let Some((g, len, next)) = one {
                self.before = (self.a, self.b);
                self.a = next;
                self.last_was_seg = false;
                let p = &mut *self.pipe;
                // The sink's header goes first.
                let iov = [
                    libc::iovec {
                        iov_base: ptr::null_mut(),
                        iov_len: 0,
                    },
                    libc::iovec {
                        iov_base: g.ptr as *mut libc::c_void,
                        iov_len: g.len as usize,
                    },
                ];
                // Written over the last frame's two where it had two (two stores; `Vec`'s
                // append is a call).
                match p.iov.len() {
                    2 => p.iov.copy_from_slice(&iov),
                    _ => {
                        p.iov.clear();
                        p.iov.extend_from_slice(&iov);
                    }
                }
                return Some(OutFrame {
                    iov: &mut p.iov,
                    offload: Offload::default(),
                    len,
                });
            }
        }
        self.next_any()
    }

    /// A frame lies in its sender's buffer for the whole batch; a segment in `seg_store`,
    /// which the next frame that needs work overwrites.
    fn lasting(&self) -> bool {
        !self.last_was_seg
    }

    /// As the batch's source is: a guest's buffers are; a ring's frames, parsed in place by
    /// the switch too, are not.
    fn shared(&self) -> bool {
        self.pipe.shared_source
    }

    fn put_back(&mut self) {
        if self.last_was_seg {
            self.seg_next -= 1;
        } else {
            (self.a, self.b) = self.before;
        }
    }
}

//! Stage 2, lookup: one call of the lookup module for the whole batch, and for modules that
//! do VLANs the batch rewritten per VLAN (who gets a frame, tagged or not).

use super::*;

/// The 802.1Q tag of each VID (priority 0), for frames that gain one on their way out.
pub(super) static TAGS: [[u8; 4]; 4096] = {
    let mut t = [[0u8; 4]; 4096];
    let mut v = 0;
    while v < 4096 {
        t[v] = wire::vlan_tag(v as u16);
        v += 1;
    }
    t
};

impl Pipeline {
    /// Stage 2, for a module that puts frames into VLANs: rewrites the batch into one entry
    /// per frame and destination port, in the form that port takes the frame's VLAN. A
    /// flooded frame becomes an entry for each other member of its VLAN (none for the rest),
    /// a frame for a port outside its VLAN a drop. A frame that gains a tag is the sender's
    /// bytes with the tag spliced in as a fragment of its own, one that loses it the sender's
    /// bytes around it: delivery, which copies each frame into its destination's buffers
    /// anyway, does the edit as it copies, with no copy, allocation or knowledge of VLANs of
    /// its own. Entries stay in batch order, so each destination gets its frames in order.
    /// Returns the frames lost because the rewritten batch would not fit its indices.
    pub(super) fn scope(&mut self, module: &dyn Lookup, table: &PortTable, src: u16) -> u64 {
        let n = self.frames.len();
        let mut members = std::mem::take(&mut self.members);
        // The VLAN `members` lists (a batch from an access port is all one VLAN).
        let mut members_of = u16::MAX;
        let refresh = |members: &mut Vec<(u16, Tagging)>, vid: u16| {
            members.clear();
            for p in table.iter().flatten() {
                if p.index != src {
                    match module.egress(p.index, vid) {
                        Tagging::Skip => {}
                        e => members.push((p.index, e)),
                    }
                }
            }
        };
        // In place, as long as each frame is one entry, as it is (unicast inside an access
        // VLAN, a flood to one other member): the common case costs no copy.
        let mut i = 0;
        while i < n {
            let f = self.frames[i];
            let vid = f.vlan & VLAN_VID;
            let tagged = f.vlan & VLAN_TAGGED != 0;
            let as_is = |e: Tagging| {
                !matches!(
                    (e, tagged),
                    (Tagging::Tagged, false) | (Tagging::Untagged, true)
                )
            };
            let dst = if f.vlan == 0 || f.dst == DEST_DROP {
                f.dst
            } else if f.dst != DEST_FLOOD {
                match module.egress(f.dst, vid) {
                    Tagging::Skip => DEST_DROP,
                    e if as_is(e) => f.dst,
                    _ => break,
                }
            } else {
                if members_of != vid {
                    refresh(&mut members, vid);
                    members_of = vid;
                }
                match members[..] {
                    [] => DEST_DROP,
                    [(p, e)] if as_is(e) => p,
                    _ => break,
                }
            };
            self.frames[i].dst = dst;
            i += 1;
        }
        if i == n {
            self.members = members;
            return 0;
        }
        // From frame i on, into a new batch: the frames before it as they are now.
        let mut out = std::mem::take(&mut self.scoped);
        out.0.clear();
        out.1.clear();
        out.0.extend_from_slice(&self.frames[..i]);
        out.1.extend_from_slice(&self.held[..i]);
        let mut lost = 0u64;
        for i in i..n {
            let f = self.frames[i];
            let vid = f.vlan & VLAN_VID;
            if f.vlan == 0 || f.dst == DEST_DROP {
                self.entry(&mut out, &mut lost, i, f.dst, Tagging::Skip);
            } else if f.dst != DEST_FLOOD {
                match module.egress(f.dst, vid) {
                    Tagging::Skip => self.entry(&mut out, &mut lost, i, DEST_DROP, Tagging::Skip),
                    e => self.entry(&mut out, &mut lost, i, f.dst, e),
                }
            } else {
                if members_of != vid {
                    refresh(&mut members, vid);
                    members_of = vid;
                }
                if members.is_empty() {
                    // No other member: nowhere to go.
                    self.entry(&mut out, &mut lost, i, DEST_DROP, Tagging::Skip);
                }
                for &(p, e) in &members {
                    self.entry(&mut out, &mut lost, i, p, e);
                }
            }
        }
        std::mem::swap(&mut self.frames, &mut out.0);
        std::mem::swap(&mut self.held, &mut out.1);
        self.scoped = out;
        self.members = members;
        if self.next.len() < self.frames.len() {
            self.next.resize(self.frames.len(), NIL);
        }
        lost
    }

    /// Appends to `out` the entry of frame `i` for `dst`, which takes its VLAN `e`; counts it
    /// in `lost` if the batch's indices are all used (they are u16, NIL excluded).
    #[inline(always)]
    pub(super) fn entry(
        &mut self,
        out: &mut (Vec<FrameMeta>, Vec<Held>),
        lost: &mut u64,
        i: usize,
        dst: u16,
        e: Tagging,
    ) {
        if out.0.len() == NIL as usize {
            *lost += 1;
            return;
        }
        let f = self.frames[i];
        let tagged = f.vlan & VLAN_TAGGED != 0;
        let h = match (e, tagged) {
            (Tagging::Tagged, false) | (Tagging::Untagged, true) => {
                self.edit(i, e, tagged, f.vlan & VLAN_VID)
            }
            // As it is: the common case, kept short.
            _ => self.held[i],
        };
        out.0.push(FrameMeta { dst, ..f });
        out.1.push(h);
    }

    /// Frame `i` as a port that takes its VLAN `e` gets it: its length and offload word, and
    /// its fragments, new ones (appended to `frags`) if the tag goes in or out. `Skip`: as
    /// it is.
    pub(super) fn edit(&mut self, i: usize, e: Tagging, tagged: bool, vid: u16) -> Held {
        let mut h = self.held[i];
        let (fs, fc) = (h.first, h.count);
        let first = self.frags[fs as usize];
        let start = self.frags.len() as u32;
        // The tag sits after the two addresses.
        let at = |off: usize, len: u32| Frag {
            // SAFETY: within the first fragment (at least 14 bytes; 18 when tagged).
            ptr: unsafe { first.ptr.add(off) },
            len,
        };
        let shift: i32 = match (e, tagged) {
            (Tagging::Tagged, false) => {
                self.frags.push(at(0, 12));
                self.frags.push(Frag {
                    ptr: TAGS[vid as usize].as_ptr(),
                    len: 4,
                });
                self.frags.push(at(12, first.len - 12));
                4
            }
            (Tagging::Untagged, true) => {
                self.frags.push(at(0, 12));
                if first.len > 16 {
                    self.frags.push(at(16, first.len - 16));
                }
                -4
            }
            _ => return h,
        };
        for k in fs + 1..fs + fc {
            let g = self.frags[k as usize];
            self.frags.push(g);
        }
        h.len = h.len.wrapping_add_signed(shift);
        if h.offload != 0 {
            // The checksum's start moves with the bytes after the tag.
            let mut o = Offload::from_word(h.offload);
            o.csum_start = o.csum_start.saturating_add_signed(shift as i16);
            h.offload = o.to_word();
        }
        h.first = start;
        h.count = self.frags.len() as u32 - start;
        h
    }
}

//! The classifier: tuple space search over one hash table per mask, prefix tracking and
//! the decision caches in front of it (see the module's notes).

use super::*;

/// No port: an index no port has.
pub(super) const NO_PORT: u16 = u16::MAX;
/// A decision of no rule (the default applies), as a rule index.
pub(super) const MISS: u32 = 0xff_ffff;

#[derive(Clone, Copy)]
pub(super) enum Out {
    /// To the port of name id.
    Port(u16),
    Drop,
    Flood,
    Normal,
}

pub(super) struct Subtable {
    pub(super) mask: Key,
    /// Rank of the best rule in it.
    pub(super) max_rank: u64,
    pub(super) map: Map,
    /// The distinct word-0 values (type, protocol, VLAN, in-port) of its rules when there
    /// are at most [`HEADS`] of them (else `heads_known` is 0): a frame whose word 0 is none
    /// of them skips the table without hashing (a `tcp` table for a UDP frame).
    pub(super) heads: [u64; HEADS],
    pub(super) heads_known: u8,
}

pub(super) const HEADS: usize = 4;

impl Subtable {
    /// The best rule of this table for `k`.
    #[inline(always)]
    pub(super) fn probe(&self, k: &Key) -> Option<u32> {
        let m = k.and(&self.mask);
        let n = self.heads_known as usize;
        if n != 0 && !self.heads[..n].contains(&m.0[0]) {
            return None;
        }
        self.map.get(&m).copied()
    }

    /// Fills `heads` once the map is complete.
    pub(super) fn note_heads(&mut self) {
        let mut heads = Vec::with_capacity(HEADS + 1);
        for k in self.map.keys() {
            if !heads.contains(&k.0[0]) {
                heads.push(k.0[0]);
                if heads.len() > HEADS {
                    return;
                }
            }
        }
        self.heads[..heads.len()].copy_from_slice(&heads);
        self.heads_known = heads.len() as u8;
    }
}

/// Prefix tracking ([`prefix`]), on classifiers with many masks.
pub(super) struct Tracking {
    /// The address fields some table has a prefix length on, each with its trie.
    pub(super) tries: Vec<(Field, Trie)>,
    /// By table: what its rules need of the frame's address fields, as (trie, length)
    /// pairs; [`NO_TRIE`] where a table has no length on a field.
    pub(super) need: Vec<[(u8, u8); 2]>,
    /// The trie the tables are indexed by.
    pub(super) index: usize,
    /// Tables by their length on the index trie (0: none), each list in search order.
    pub(super) by_length: Vec<Vec<u32>>,
}

/// A need that every frame meets: `lengths[NO_TRIE]` has bit 0 set.
pub(super) const NO_TRIE: (u8, u8) = (TRACKED as u8, 1);

impl Tracking {
    /// Tracking for `subtables` (already in search order), or `None` if no table has a
    /// prefix length on any address field.
    pub(super) fn new(subtables: &[Subtable], rules: &[Entry]) -> Option<Tracking> {
        let fields: Vec<Field> = Field::ALL
            .into_iter()
            .filter(|f| subtables.iter().any(|st| f.length(&st.mask.0).is_some()))
            .collect();
        if fields.is_empty() {
            return None;
        }
        let tries = fields
            .iter()
            .map(|&f| {
                let prefixes = rules
                    .iter()
                    .filter_map(|e| {
                        let m = &e.rule.matches;
                        f.length(&m.mask.0).map(|l| (f.of(&m.value.0), l))
                    })
                    .collect();
                (f, Trie::new(prefixes))
            })
            .collect::<Vec<_>>();
        let need: Vec<[(u8, u8); 2]> = subtables
            .iter()
            .map(|st| {
                let mut need = [NO_TRIE; 2];
                let lengths = fields
                    .iter()
                    .enumerate()
                    .filter_map(|(t, f)| f.length(&st.mask.0).map(|l| (t as u8, l)));
                // A mask has a length on at most one source and one destination field.
                for (slot, n) in need.iter_mut().zip(lengths) {
                    *slot = n;
                }
                need
            })
            .collect();
        // Index by the trie whose lengths split the tables into the most lists.
        let index = (0..fields.len())
            .max_by_key(|&t| {
                let mut seen = [false; 129];
                for n in need.iter().flatten().filter(|n| n.0 as usize == t) {
                    seen[n.1 as usize] = true;
                }
                seen.iter().filter(|&&x| x).count()
            })
            .unwrap_or(0);
        let mut by_length = vec![Vec::new(); 129];
        for (s, n) in need.iter().enumerate() {
            let l = n.iter().find(|n| n.0 as usize == index).map_or(0, |n| n.1);
            by_length[l as usize].push(s as u32);
        }
        Some(Tracking {
            tries,
            need,
            index,
            by_length,
        })
    }
}

pub(super) struct Compiled {
    pub(super) rank: u64,
    pub(super) out: Out,
    pub(super) hits: Arc<AtomicU64>,
}

/// The immutable table the workers search.
pub(super) struct Classifier {
    /// Unique among all classifiers of the process: tags cache entries.
    pub(super) gen: u64,
    pub(super) subtables: Vec<Subtable>,
    pub(super) tracking: Option<Tracking>,
    pub(super) rules: Vec<Compiled>,
    /// Every bit some rule looks at: the cache's key is the frame's key masked by it.
    pub(super) union: Key,
    pub(super) default: Out,
    pub(super) default_text: String,
    /// Port names the rules (and the default) use, by name id.
    pub(super) names: Vec<String>,
    /// By name id: the port's index, or [`NO_PORT`].
    pub(super) out_port: Box<[AtomicU16]>,
    /// By port index: the port's name id + 1, or 0 if no rule names it.
    pub(super) in_id: Box<[AtomicU16]>,
}

pub(super) static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A rule of the table, as the control plane keeps it.
pub(super) struct Entry {
    pub(super) id: u64,
    /// Order of addition: ties of priority go to the first added.
    pub(super) seq: u64,
    pub(super) rule: Rule,
    pub(super) hits: Arc<AtomicU64>,
}

impl Entry {
    /// Higher wins; unique.
    pub(super) fn rank(&self) -> u64 {
        (self.rule.priority as u64) << 40 | ((1 << 40) - 1 - (self.seq & ((1 << 40) - 1)))
    }
}

impl Classifier {
    pub(super) fn build(
        rules: &[Entry],
        default_text: &Action,
        ports: &HashMap<String, PortIndex>,
    ) -> Self {
        let mut names: Vec<String> = Vec::new();
        let mut name_id = |n: &str| -> u16 {
            match names.iter().position(|x| x == n) {
                Some(i) => i as u16,
                None => {
                    names.push(n.to_string());
                    (names.len() - 1) as u16
                }
            }
        };
        let out_of = |a: &Action, name_id: &mut dyn FnMut(&str) -> u16| match a {
            Action::Output(p) => Out::Port(name_id(p)),
            Action::Drop => Out::Drop,
            Action::Flood => Out::Flood,
            Action::Normal => Out::Normal,
        };
        let default = out_of(default_text, &mut name_id);
        let mut by_mask: HashMap<Key, usize, BuildHasherDefault<Pass>> = HashMap::default();
        let mut subtables: Vec<Subtable> = Vec::new();
        let mut compiled = Vec::with_capacity(rules.len());
        let mut union = Key::default();
        for (i, e) in rules.iter().enumerate() {
            let m = &e.rule.matches;
            let mut value = m.value;
            if let Some(p) = &m.in_port {
                value.set(IN_PORT, name_id(p) as u64 + 1);
            }
            let rank = e.rank();
            compiled.push(Compiled {
                rank,
                out: out_of(&e.rule.action, &mut name_id),
                hits: e.hits.clone(),
            });
            for w in 0..WORDS {
                union.0[w] |= m.mask.0[w];
            }
            let s = *by_mask.entry(m.mask).or_insert_with(|| {
                subtables.push(Subtable {
                    mask: m.mask,
                    max_rank: 0,
                    map: Map::default(),
                    heads: [0; HEADS],
                    heads_known: 0,
                });
                subtables.len() - 1
            });
            let st = &mut subtables[s];
            st.max_rank = st.max_rank.max(rank);
            let slot = st.map.entry(value.and(&m.mask)).or_insert(i as u32);
            if compiled[*slot as usize].rank < rank {
                *slot = i as u32;
            }
        }
        subtables.sort_by_key(|s| std::cmp::Reverse(s.max_rank));
        for st in subtables.iter_mut() {
            st.note_heads();
        }
        let tracking = if subtables.len() > TRACK_ABOVE_MASKS {
            Tracking::new(&subtables, rules)
        } else {
            None
        };
        let c = Classifier {
            gen: GENERATION.fetch_add(1, Relaxed),
            subtables,
            tracking,
            rules: compiled,
            union,
            default,
            default_text: default_text.to_string(),
            out_port: (0..names.len()).map(|_| AtomicU16::new(NO_PORT)).collect(),
            in_id: (0..MAX_PORTS).map(|_| AtomicU16::new(0)).collect(),
            names,
        };
        for (name, &index) in ports {
            c.port_added(index, name);
        }
        c
    }

    pub(super) fn port_added(&self, index: PortIndex, name: &str) {
        let (Some(id), Some(slot)) = (
            self.names.iter().position(|n| n == name),
            self.in_id.get(index as usize),
        ) else {
            return;
        };
        slot.store(id as u16 + 1, Relaxed);
        self.out_port[id].store(index, Relaxed);
    }

    pub(super) fn port_removed(&self, index: PortIndex) {
        if let Some(slot) = self.in_id.get(index as usize) {
            slot.store(0, Relaxed);
        }
        for p in self.out_port.iter() {
            if p.load(Relaxed) == index {
                p.store(NO_PORT, Relaxed);
            }
        }
    }

    /// The best rule for `k` (already masked by `union`), or [`MISS`]: tuple space search.
    #[inline]
    pub(super) fn search(&self, k: &Key) -> u32 {
        if let Some(t) = &self.tracking {
            return self.search_tracked(k, t);
        }
        let (mut best, mut best_rank) = (MISS, 0u64);
        for st in &self.subtables {
            if st.max_rank <= best_rank {
                // Sorted: no table left holds a better rule.
                break;
            }
            if let Some(r) = st.probe(k) {
                let rank = self.rules[r as usize].rank;
                if rank > best_rank {
                    (best, best_rank) = (r, rank);
                }
            }
        }
        best
    }

    /// [`Self::search`] over only the tables whose address prefix lengths `k` matches.
    pub(super) fn search_tracked(&self, k: &Key, t: &Tracking) -> u32 {
        let mut lengths = [0u128; TRACKED + 1];
        lengths[TRACKED] = 1;
        for (i, (field, trie)) in t.tries.iter().enumerate() {
            lengths[i] = trie.lengths(field.of(&k.0));
        }
        let (mut best, mut best_rank) = (MISS, 0u64);
        let mut visit = |list: &[u32]| {
            for &s in list {
                let st = &self.subtables[s as usize];
                if st.max_rank <= best_rank {
                    // Each list is in search order: nothing better further on in it.
                    break;
                }
                let [(a, la), (b, lb)] = t.need[s as usize];
                if lengths[a as usize] >> (la - 1) & lengths[b as usize] >> (lb - 1) & 1 == 0 {
                    continue;
                }
                if let Some(r) = st.probe(k) {
                    let rank = self.rules[r as usize].rank;
                    if rank > best_rank {
                        (best, best_rank) = (r, rank);
                    }
                }
            }
        };
        visit(&t.by_length[0]);
        let mut matched = lengths[t.index];
        while matched != 0 {
            visit(&t.by_length[matched.trailing_zeros() as usize + 1]);
            matched &= matched - 1;
        }
        best
    }
}

/// One entry of a worker thread's exact-match cache: a key and the decision of the
/// classifier of generation `tag >> 24` for it (rule index in the low 24 bits).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Cached {
    pub(super) key: Key,
    pub(super) tag: u64,
}

thread_local! {
    /// Each forwarding thread's own cache: no sharing, no atomics. Entries of another
    /// classifier (another generation) are never taken.
    pub(super) static CACHE: std::cell::RefCell<Box<[Cached]>> = std::cell::RefCell::new(
        vec![Cached { key: Key::default(), tag: 0 }; CACHE_ENTRIES].into_boxed_slice()
    );
}

//! `flow`: an ordered match/action table, the OpenFlow-like dataplane of VALE section 3.3.3.
//!
//! A rule matches on the in-port, the Ethernet addresses and type, the VLAN, IPv4 and IPv6
//! addresses (with prefixes), the IP protocol and the TCP/UDP ports, and says what to do with
//! the frames it matches: `output:PORT`, `drop`, `flood` or `normal` (the learning bridge).
//! Among the rules a frame matches, the highest priority wins; among equal priorities, the
//! first added. A frame matching no rule gets the table's default (`normal` unless set).
//! The grammar is in [`parse_rule`] and docs/modules.md.
//!
//! # The classifier
//!
//! Tuple space search: the rules are grouped by mask (which bits of which fields they look
//! at), one hash table per distinct mask maps a masked frame key to the best rule of that
//! mask. A frame is looked up in each table in turn, tables in order of the highest priority
//! they hold, and the search stops as soon as the best rule found outranks every rule of
//! the tables left. So the cost grows with the number of distinct masks, not with the number
//! of rules: a thousand host routes are one table. In front of it, two caches of decisions:
//! back-to-back frames of one flow reuse the previous frame's decision (one key compare), and
//! a per-worker-thread exact-match cache keyed by the frame's key (restricted to the bits
//! some rule looks at) remembers recent decisions when the table has more than a few masks.
//! Behind them, with many masks, prefix tracking ([`prefix`]) skips the tables whose address
//! prefixes a frame cannot match.
//!
//! # Changes under traffic
//!
//! The classifier is immutable: a change builds a new one from the rule list (under a mutex
//! that only the control plane takes) and publishes it with an atomic pointer swap; each
//! batch loads the classifier once, without a lock, and uses that one for all its frames.
//! Each cache entry carries the generation of the classifier that made it, so a new
//! classifier never sees an old decision. A rule's hit counter is shared by every classifier
//! the rule is in, so it survives rebuilds.
//!
//! Ports are named by name in rules (`output:vale0:b`, `in_port=vale0:a`); a rule may name a
//! port that is not on the switch yet. Which index a name has is kept in atomics beside the
//! classifier and updated as ports come and go, so no rebuild is needed then; a frame sent to
//! a named port that is not there is dropped and counted (`no_port`).
//!
//! # Files
//!
//! `key.rs` reads a frame into its key; `rules.rs` is the grammar of a rule and its canonical
//! text; `classifier.rs` the tuple space search and its caches; `prefix.rs` prefix tracking;
//! this file the module itself (the rule list, changes, the [`Lookup`] calls, its commands).
//! `cost.rs` measures the module call (`bench/modules.py`).
//!
//! # Commands
//!
//! The table changes through the module's own commands ([`Lookup::control`]), which valed
//! carries without reading them: `add` (rules, one a line: all or none), `del` (a rule id or
//! a match), both an administrator's, and `dump` (`after=N`: a page of at most
//! [`FLOW_DUMP_PAGE`] rules after position N, 0 or nothing for the first), open to anyone.
//! Each answers with the JSON of a [`FlowTable`] (the rules added, deleted or dumped), which
//! `vale-ctl flow` renders. The rules are what the module saves in valed's configuration,
//! one a line in the order they were added, and takes back at the next start.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use vale_abi::control::{FlowRule, FlowTable, FLOW_DUMP_PAGE};
use vale_abi::netmap::NS_NO_LEARN;

use super::{
    check_keys, invalid, is_group, Args, ControlCtx, Error, FrameMeta, KeptArg, LearningBridge,
    Lookup, SourcePort, TableArgs, DEST_DROP, DEST_FLOOD,
};
use crate::index::{PortIndex, MAX_PORTS};
use crate::wire::{
    ETH_P_8021AD, ETH_P_8021Q, ETH_P_ARP, ETH_P_IPV4, ETH_P_IPV6, IPPROTO_ICMP, IPPROTO_ICMPV6,
    IPPROTO_TCP, IPPROTO_UDP,
};

mod prefix;
use prefix::{Field, Trie, TRACKED};

/// Most rules one table holds.
pub const MAX_RULES: usize = 200_000;
/// Priority of a rule that names none.
pub const DEFAULT_PRIORITY: u16 = 32768;
/// IPv6 extension headers walked at most to find the upper-layer protocol.
pub const MAX_EXT_HEADERS: usize = 8;
/// Entries of each worker thread's exact-match cache (64 bytes each).
const CACHE_ENTRIES: usize = 2048;
/// Classifiers with at most this many masks are searched directly, without the cache.
const CACHE_ABOVE_MASKS: usize = 2;
/// Classifiers with more masks than this track address prefixes ([`prefix`]): below it, a
/// walk of the tries costs about what probing every table does.
const TRACK_ABOVE_MASKS: usize = 16;

mod classifier;
#[cfg(test)]
mod cost;
mod key;
mod rules;
#[cfg(test)]
mod tests;

// The children share the key's layout and the classifier's types through here.
use classifier::*;
use key::*;
use rules::parse_match;
pub use rules::{parse_action, parse_rule, render_match, Action, Match, Rule};

/// What the control plane keeps: the rules in order of addition, the ports on the switch.
struct Table {
    rules: Vec<Entry>,
    next_id: u64,
    next_seq: u64,
    default: Action,
    ports: HashMap<String, PortIndex>,
}

pub struct Flow {
    current: ArcSwap<Classifier>,
    table: Mutex<Table>,
    bridge: LearningBridge,
    missed: AtomicU64,
    no_port: AtomicU64,
    rebuilds: AtomicU64,
}

/// A line of rules text: its number and text, skipping blanks and `#` comments.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Parses every rule of `text` (one a line); the first bad one fails them all, named by its
/// line and text.
pub fn parse_rules(text: &str) -> Result<Vec<Rule>, Error> {
    let mut out = Vec::new();
    for (n, line) in lines(text) {
        if out.len() >= MAX_RULES {
            return Err(Error::Limit(format!(
                "more than {MAX_RULES} rules (line {n})"
            )));
        }
        let rule =
            parse_rule(line).map_err(|e| e.context(format!("bad rule at line {n}, '{line}': ")))?;
        out.push(rule);
    }
    Ok(out)
}

impl Flow {
    /// Arguments: `rules=TEXT` (one rule a line), `default=normal|drop|flood|output:PORT`,
    /// `entries=N` and `age=S` (the learning table of `normal`, as `learning`'s).
    pub fn make(args: &Args) -> Result<Box<dyn Lookup>, Error> {
        Ok(Box::new(Flow::new(args)?))
    }

    pub fn new(args: &Args) -> Result<Flow, Error> {
        check_keys("flow", args, &["rules", "default", "entries", "age"])?;
        let default = match args.iter().rev().find(|(k, _)| k == "default") {
            Some((_, v)) => parse_action(v).map_err(|e| e.context("default: "))?,
            None => Action::Normal,
        };
        let bridge = TableArgs::of(args, LearningBridge::DEFAULT_ENTRIES)?.table();
        let mut rules = Vec::new();
        for (_, text) in args.iter().filter(|(k, _)| k == "rules") {
            rules.extend(parse_rules(text)?);
            if rules.len() > MAX_RULES {
                return Err(Error::Limit(format!("more than {MAX_RULES} rules")));
            }
        }
        let mut table = Table {
            rules: Vec::new(),
            next_id: 1,
            next_seq: 0,
            default,
            ports: HashMap::new(),
        };
        table.push(rules);
        let c = Classifier::build(&table.rules, &table.default, &table.ports);
        Ok(Flow {
            current: ArcSwap::from_pointee(c),
            table: Mutex::new(table),
            bridge,
            missed: AtomicU64::new(0),
            no_port: AtomicU64::new(0),
            rebuilds: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Builds the classifier of `t` and makes it the one the workers use. Called with the
    /// table's lock held, so ports cannot change meanwhile.
    fn publish(&self, t: &Table) {
        self.current
            .store(Arc::new(Classifier::build(&t.rules, &t.default, &t.ports)));
        self.rebuilds.fetch_add(1, Relaxed);
    }

    /// Every port name the rules and the default use.
    pub fn port_names(&self) -> Vec<String> {
        self.current.load().names.clone()
    }

    /// Adds the rules of `text` (one a line): all, or none with an error naming the first
    /// bad one. `check` sees every port name they use first and may refuse them. Returns
    /// them with their ids.
    pub fn add(
        &self,
        text: &str,
        check: impl FnOnce(&[String]) -> Result<(), Error>,
    ) -> Result<Vec<FlowRule>, Error> {
        let rules = parse_rules(text)?;
        if rules.is_empty() {
            return Err(invalid("no rule given"));
        }
        let mut names: Vec<String> = Vec::new();
        for r in &rules {
            let out = match &r.action {
                Action::Output(p) => Some(p),
                _ => None,
            };
            for n in r.matches.in_port.iter().chain(out) {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
        check(&names)?;
        let mut t = self.lock();
        if t.rules.len() + rules.len() > MAX_RULES {
            return Err(Error::Limit(format!(
                "the table holds {} rules; {} more would pass the limit of {MAX_RULES}",
                t.rules.len(),
                rules.len()
            )));
        }
        let first = t.rules.len();
        t.push(rules);
        self.publish(&t);
        Ok(t.rules[first..].iter().map(view).collect())
    }

    /// Deletes by `selector`: a rule id (`7`, `id=7`), or a match (with `prio=N` or not)
    /// naming every rule whose match is exactly that (and priority that). At least one rule
    /// must go.
    pub fn del(&self, selector: &str) -> Result<Vec<FlowRule>, Error> {
        let s = selector.trim();
        let by_id = s.strip_prefix("id=").unwrap_or(s);
        let mut t = self.lock();
        let gone: Vec<usize> = if !by_id.is_empty() && by_id.bytes().all(|b| b.is_ascii_digit()) {
            let id: u64 = by_id
                .parse()
                .map_err(|_| invalid(format!("'{s}' is not a rule id")))?;
            let i = t
                .rules
                .iter()
                .position(|e| e.id == id)
                .ok_or_else(|| Error::NotFound(format!("no rule with id {id}")))?;
            vec![i]
        } else {
            if s.contains("actions=") {
                return Err(invalid(format!(
                    "'{s}': del takes a rule id or a match, without actions"
                )));
            }
            let mut prio = None;
            let m = parse_match(s, Some(&mut prio)).map_err(|e| e.context(format!("'{s}': ")))?;
            let v: Vec<usize> = t
                .rules
                .iter()
                .enumerate()
                .filter(|(_, e)| e.rule.matches == m && prio.is_none_or(|p| e.rule.priority == p))
                .map(|(i, _)| i)
                .collect();
            if v.is_empty() {
                return Err(Error::NotFound(format!(
                    "no rule has exactly the match '{s}'"
                )));
            }
            v
        };
        let mut out = Vec::new();
        for &i in gone.iter().rev() {
            out.push(view(&t.rules.remove(i)));
        }
        out.reverse();
        self.publish(&t);
        Ok(out)
    }

    /// Every rule, in the order they are tried, with hit counters.
    pub fn dump(&self, switch: &str) -> FlowTable {
        let t = self.lock();
        let mut order: Vec<&Entry> = t.rules.iter().collect();
        order.sort_by_key(|e| std::cmp::Reverse(e.rank()));
        FlowTable {
            rules: order.into_iter().map(view).collect(),
            ..self.summary(switch)
        }
    }

    /// A page of [`Flow::dump`]: at most `max` rules (at least one), in the order they are
    /// tried, starting after the rule at position `after` (0: from the first). `next` is the
    /// position of the page's last rule when more follow. Each page costs one pass over the
    /// table under its lock (no sort of the whole table), so a dump page by page never holds
    /// the control plane for long, nor more than a page in memory.
    pub fn dump_page(&self, switch: &str, after: u64, max: usize) -> FlowTable {
        let t = self.lock();
        let mut page: Vec<&Entry> = t
            .rules
            .iter()
            .filter(|e| after == 0 || e.rank() < after)
            .collect();
        let max = max.max(1);
        let more = page.len() > max;
        if more {
            page.select_nth_unstable_by_key(max - 1, |e| std::cmp::Reverse(e.rank()));
            page.truncate(max);
        }
        page.sort_by_key(|e| std::cmp::Reverse(e.rank()));
        FlowTable {
            next: page.last().filter(|_| more).map(|e| e.rank()),
            rules: page.into_iter().map(view).collect(),
            ..self.summary(switch)
        }
    }

    /// The table's default and misses, without its rules.
    pub fn summary(&self, switch: &str) -> FlowTable {
        FlowTable {
            switch: switch.to_string(),
            default: self.current.load().default_text.clone(),
            missed: self.missed.load(Relaxed),
            rules: Vec::new(),
            next: None,
        }
    }

    /// How many rules the table holds.
    pub fn len(&self) -> usize {
        self.current.load().rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every rule as the line that adds it again, in the order they were added: so that added
    /// again they get the same order among equal priorities (and, with no deletions, the same
    /// ids).
    pub fn rule_lines(&self) -> Vec<String> {
        self.lock()
            .rules
            .iter()
            .map(|e| {
                let v = view(e);
                let m = if v.matches.is_empty() {
                    String::new()
                } else {
                    format!("{} ", v.matches)
                };
                format!("prio={} {m}actions={}", v.priority, v.actions)
            })
            .collect()
    }
}

/// The module's commands ([`Lookup::control`]).
const OPS: &[&str] = &["add", "del", "dump"];

/// Refuses a rule set naming a port of another switch: it could never match or be sent to.
fn on_switch(switch: &str, names: &[String]) -> Result<(), Error> {
    for n in names {
        if vale_abi::name::parse_port(n)?.0 != switch {
            return Err(invalid(format!("port '{n}' is not on switch '{switch}'")));
        }
    }
    Ok(())
}

/// The position a `dump` body asks for: nothing (or `after=0`) for the first page, else
/// `after=N`, N the `next` of the page before.
fn dump_after(body: &str) -> Result<u64, Error> {
    let b = body.trim();
    if b.is_empty() {
        return Ok(0);
    }
    b.strip_prefix("after=")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            invalid(format!(
                "flow dump takes 'after=N' (N: the 'next' of the page before), not '{b}'"
            ))
        })
}

#[cfg(test)]
impl Flow {
    fn add_text(&self, text: &str) -> Result<Vec<FlowRule>, Error> {
        self.add(text, |_| Ok(()))
    }
}

impl Table {
    fn push(&mut self, rules: Vec<Rule>) {
        for rule in rules {
            self.rules.push(Entry {
                id: self.next_id,
                seq: self.next_seq,
                rule,
                hits: Arc::new(AtomicU64::new(0)),
            });
            self.next_id += 1;
            self.next_seq += 1;
        }
    }
}

fn view(e: &Entry) -> FlowRule {
    FlowRule {
        id: e.id,
        priority: e.rule.priority,
        matches: render_match(&e.rule.matches),
        actions: e.rule.action.to_string(),
        hits: e.hits.load(Relaxed),
    }
}

impl Lookup for Flow {
    fn name(&self) -> &str {
        "flow"
    }

    fn lookup(&self, src: SourcePort, frames: &mut [FrameMeta], now_s: u32) -> u64 {
        let c = self.current.load();
        self.bridge.tick(now_s);
        let in_id = c
            .in_id
            .get(src.index as usize)
            .map_or(0, |x| x.load(Relaxed));
        let cached = c.subtables.len() > CACHE_ABOVE_MASKS;
        let (mut refused, mut missed, mut no_port) = (0u64, 0u64, 0u64);
        let mut last_learnt = u64::MAX;
        // The previous frame's key and decision, and how many frames in a row it decided.
        let (mut prev, mut prev_rule, mut run) = (Key([u64::MAX; WORDS]), MISS, 0u64);
        let count = |rule: u32, n: u64, missed: &mut u64| {
            if n == 0 {
                return;
            }
            match c.rules.get(rule as usize) {
                Some(r) => {
                    r.hits.fetch_add(n, Relaxed);
                }
                None => *missed += n,
            }
        };
        CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            for f in frames.iter_mut() {
                let k = extract(f, in_id).and(&c.union);
                let rule = if k == prev {
                    run += 1;
                    prev_rule
                } else {
                    count(prev_rule, run, &mut missed);
                    let rule = if cached {
                        let h = k.hash64();
                        let e = &mut cache[(h as usize) & (CACHE_ENTRIES - 1)];
                        if e.tag >> 24 == c.gen && e.key == k {
                            (e.tag & 0xff_ffff) as u32
                        } else {
                            let r = c.search(&k);
                            *e = Cached {
                                key: k,
                                tag: c.gen << 24 | r as u64,
                            };
                            r
                        }
                    } else {
                        c.search(&k)
                    };
                    (prev, prev_rule, run) = (k, rule, 1);
                    rule
                };
                let out = c.rules.get(rule as usize).map_or(c.default, |r| r.out);
                f.dst = match out {
                    Out::Port(id) => match c.out_port[id as usize].load(Relaxed) {
                        NO_PORT => {
                            no_port += 1;
                            DEST_DROP
                        }
                        p => p,
                    },
                    Out::Drop => DEST_DROP,
                    Out::Flood => DEST_FLOOD,
                    Out::Normal => {
                        let s = f.src_mac();
                        if s != last_learnt && !is_group(s) && f.flags & NS_NO_LEARN == 0 {
                            if !self.bridge.learn(s, src.index, src.learn_limit, now_s) {
                                refused += 1;
                            }
                            last_learnt = s;
                        }
                        let d = f.dst_mac();
                        if is_group(d) {
                            DEST_FLOOD
                        } else {
                            self.bridge.find(d, now_s).unwrap_or(DEST_FLOOD)
                        }
                    }
                };
            }
        });
        count(prev_rule, run, &mut missed);
        if missed != 0 {
            self.missed.fetch_add(missed, Relaxed);
        }
        if no_port != 0 {
            self.no_port.fetch_add(no_port, Relaxed);
        }
        refused
    }

    fn port_added(&self, port: PortIndex, name: &str) {
        let mut t = self.lock();
        t.ports.retain(|_, i| *i != port);
        t.ports.insert(name.to_string(), port);
        self.current.load().port_added(port, name);
    }

    fn port_removed(&self, port: PortIndex) {
        let mut t = self.lock();
        t.ports.retain(|_, i| *i != port);
        self.current.load().port_removed(port);
        self.bridge.port_removed(port);
    }

    fn learnt(&self, port: PortIndex) -> Option<u32> {
        self.bridge.learnt(port)
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let c = self.current.load();
        vec![
            ("rules".into(), c.rules.len() as u64),
            ("masks".into(), c.subtables.len() as u64),
            ("missed".into(), self.missed.load(Relaxed)),
            ("no_port".into(), self.no_port.load(Relaxed)),
            ("rebuilds".into(), self.rebuilds.load(Relaxed)),
            (
                "tracked_fields".into(),
                c.tracking.as_ref().map_or(0, |t| t.tries.len() as u64),
            ),
        ]
    }

    fn control(&self, ctx: ControlCtx, op: &str, body: &str) -> Result<String, Error> {
        let table = match op {
            "add" => {
                let rules = self.add(body, |names| on_switch(ctx.switch, names))?;
                tracing::info!(switch = ctx.switch, rules = rules.len(), "flow rules added");
                FlowTable {
                    rules,
                    ..self.summary(ctx.switch)
                }
            }
            "del" => {
                let rules = self.del(body)?;
                tracing::info!(
                    switch = ctx.switch,
                    rules = rules.len(),
                    "flow rules deleted"
                );
                FlowTable {
                    rules,
                    ..self.summary(ctx.switch)
                }
            }
            "dump" => self.dump_page(ctx.switch, dump_after(body)?, FLOW_DUMP_PAGE),
            _ => return Err(Error::unsupported(self.name(), op, OPS)),
        };
        serde_json::to_string(&table)
            .map_err(|e| Error::Module(format!("cannot write the flow table as JSON: {e}")))
    }

    fn open_op(&self, op: &str) -> bool {
        // Reading the table is anyone's, as `vale-ctl lookup` is; changing it is not.
        op == "dump"
    }

    fn installing(&self, ctx: ControlCtx, args: &mut [KeptArg]) -> Result<(), Error> {
        on_switch(ctx.switch, &self.port_names())?;
        // The rules live in the table now (`vale-ctl flow dump`), and are saved as the
        // module's state: keep a line, not the text.
        let n = self.len();
        for a in args.iter_mut().filter(|a| a.key == "rules") {
            a.value = format!("({n} rules at load; see vale-ctl flow dump)");
            a.saved = false;
        }
        Ok(())
    }

    fn save(&self) -> Vec<String> {
        self.rule_lines()
    }

    fn restore(&self, ctx: ControlCtx, lines: &[String]) -> Result<(), Error> {
        if lines.is_empty() {
            return Ok(());
        }
        self.add(&lines.join("\n"), |names| on_switch(ctx.switch, names))
            .map(|_| ())
    }
}

//! The engine's calls on a switch's lookup module: installing one, what it shows, and the
//! flow module's rule changes and dumps.

use super::*;

impl Engine {
    /// Makes `module` (a built-in name, or a shared object's absolute path) with `args` the
    /// lookup module of switch `switch`. An administrator's: a shared object runs in valed.
    /// A module that cannot be made leaves the old one in place.
    pub fn set_lookup(
        &self,
        switch: &str,
        module: &str,
        args: &[ModuleArg],
        caller: &Caller,
    ) -> Result<LookupInfo, Error> {
        let sws = self.lock();
        let sw = existing_switch(&sws, switch)?;
        caller.must_be_admin(&format!("setting 'lookup' of switch '{switch}'"))?;
        let args = args
            .iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect();
        let mut new = Installed::make(module, args)?;
        if let Some(flow) = as_flow(&new) {
            on_switch(switch, &flow.port_names())?;
            // The rules live in the table now (`vale-ctl flow dump`): keep a line, not the text.
            let n = flow.len();
            for (_, v) in new.args.iter_mut().filter(|(k, _)| k == "rules") {
                *v = format!("({n} rules at load; see vale-ctl flow dump)");
            }
        }
        tracing::info!(switch, module, args = ?new.args, "lookup module set");
        sw.set_lookup(new);
        Ok(lookup_info(sw))
    }

    /// Adds the rules of `text` (one a line) to the flow table of switch `switch`: all or
    /// none. An administrator's, as choosing the module is.
    pub fn flow_add(&self, switch: &str, text: &str, caller: &Caller) -> Result<FlowTable, Error> {
        let sws = self.lock();
        let sw = existing_switch(&sws, switch)?;
        caller.must_be_admin(&format!("changing the flow rules of switch '{switch}'"))?;
        let m = sw.lookup();
        let flow = as_flow(&m).ok_or_else(|| not_flow(switch, &m))?;
        let rules = flow.add(text, |names| on_switch(switch, names))?;
        tracing::info!(switch, rules = rules.len(), "flow rules added");
        Ok(flow_table(switch, flow, rules))
    }

    /// Deletes the rules `selector` names (an id, or a match) from switch `switch`'s table.
    pub fn flow_del(
        &self,
        switch: &str,
        selector: &str,
        caller: &Caller,
    ) -> Result<FlowTable, Error> {
        let sws = self.lock();
        let sw = existing_switch(&sws, switch)?;
        caller.must_be_admin(&format!("changing the flow rules of switch '{switch}'"))?;
        let m = sw.lookup();
        let flow = as_flow(&m).ok_or_else(|| not_flow(switch, &m))?;
        let rules = flow.del(selector)?;
        tracing::info!(switch, rules = rules.len(), "flow rules deleted");
        Ok(flow_table(switch, flow, rules))
    }

    /// Every rule of switch `switch`'s flow table, with hit counters. Open to anyone, as
    /// `lookup_info` is.
    pub fn flow_dump(&self, switch: &str) -> Result<FlowTable, Error> {
        let sws = self.lock();
        let sw = existing_switch(&sws, switch)?;
        let m = sw.lookup();
        let flow = as_flow(&m).ok_or_else(|| not_flow(switch, &m))?;
        Ok(flow.dump(switch))
    }

    /// A page of switch `switch`'s flow table ([`lookup::flow::Flow::dump_page`]): what a
    /// client's dump asks for, so that no reply and no pass under the lock is larger than a
    /// page. Open to anyone, as `flow_dump` is.
    pub fn flow_dump_page(&self, switch: &str, after: u64, max: usize) -> Result<FlowTable, Error> {
        let sws = self.lock();
        let sw = existing_switch(&sws, switch)?;
        let m = sw.lookup();
        let flow = as_flow(&m).ok_or_else(|| not_flow(switch, &m))?;
        Ok(flow.dump_page(switch, after, max))
    }

    /// The lookup module of switch `switch`.
    pub fn lookup_info(&self, switch: &str) -> Result<LookupInfo, Error> {
        let sws = self.lock();
        Ok(lookup_info(existing_switch(&sws, switch)?))
    }
}

/// The module as the `flow` module, if it is one.
pub(super) fn as_flow(m: &Installed) -> Option<&lookup::flow::Flow> {
    m.as_any()?.downcast_ref::<lookup::flow::Flow>()
}

pub(super) fn not_flow(switch: &str, m: &Installed) -> String {
    format!(
        "switch '{switch}' does not use the flow module (it uses '{}'): choose it first with \
         'vale-ctl lookup {switch} flow'",
        m.name()
    )
}

/// Refuses a rule set naming a port of another switch: it could never match or be sent to.
pub(super) fn on_switch(switch: &str, names: &[String]) -> Result<(), String> {
    for n in names {
        if parse_port(n).map_err(|e| e.to_string())?.0 != switch {
            return Err(format!("port '{n}' is not on switch '{switch}'"));
        }
    }
    Ok(())
}

/// `rules` of switch `switch`'s flow table, with the table's default and misses.
pub(super) fn flow_table(
    switch: &str,
    flow: &lookup::flow::Flow,
    rules: Vec<FlowRule>,
) -> FlowTable {
    FlowTable {
        rules,
        ..flow.summary(switch)
    }
}

pub(super) fn lookup_info(sw: &Switch) -> LookupInfo {
    let m = sw.lookup();
    let builtin = lookup::MODULES.iter().any(|(n, _)| *n == m.spec);
    LookupInfo {
        switch: sw.name.clone(),
        module: m.name().to_string(),
        source: if builtin {
            "built-in".into()
        } else {
            m.spec.clone()
        },
        args: m
            .args
            .iter()
            .map(|(k, v)| ModuleArg {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        counters: m
            .counters()
            .into_iter()
            .map(|(name, value)| ModuleCounter { name, value })
            .collect(),
    }
}

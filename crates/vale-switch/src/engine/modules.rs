//! The engine's calls on a switch's lookup module: installing one, what it shows, its own
//! commands, and what valed's configuration keeps of it. Nothing here knows any module: a
//! module's commands and state are text the module alone reads.

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
        let new = Installed::make(switch, module, args)?;
        tracing::info!(switch, module, args = ?new.args, "lookup module set");
        sw.set_lookup(new);
        Ok(lookup_info(sw))
    }

    /// The lookup module's own command `op` with `body` on switch `switch` (see
    /// [`lookup::Lookup::control`]): its answer, and the module's name. An administrator's,
    /// unless the module opens `op` to anyone ([`lookup::Lookup::open_op`]). An answer
    /// longer than [`lookup::MAX_CONTROL_OUTPUT`] is an error.
    pub fn lookup_control(
        &self,
        switch: &str,
        op: &str,
        body: &str,
        caller: &Caller,
    ) -> Result<(String, String), Error> {
        let sws = self.lock();
        let sw = existing_switch(&sws, switch)?;
        let m = sw.lookup();
        if !m.open_op(op) {
            caller.must_be_admin(&format!(
                "command '{op}' of lookup module '{}' of switch '{switch}'",
                m.name()
            ))?;
        }
        let output = m.control(lookup::ControlCtx { switch }, op, body)?;
        if output.len() > lookup::MAX_CONTROL_OUTPUT {
            return Err(Error::limit(format!(
                "lookup module '{}' answered '{op}' with {} bytes, more than the {} a reply \
                 carries",
                m.name(),
                output.len(),
                lookup::MAX_CONTROL_OUTPUT
            )));
        }
        Ok((m.name().to_string(), output))
    }

    /// What valed's configuration keeps of switch `switch`'s lookup module: its spec (a
    /// built-in name or a shared object's path), the arguments it saves
    /// ([`lookup::KeptArg::saved`]) and its state ([`lookup::Lookup::save`]).
    pub fn lookup_saved(&self, switch: &str) -> Result<SavedLookup, Error> {
        let sws = self.lock();
        let m = existing_switch(&sws, switch)?.lookup();
        Ok(SavedLookup {
            spec: m.spec.clone(),
            args: m
                .args
                .iter()
                .filter(|a| a.saved)
                .map(|a| (a.key.clone(), a.value.clone()))
                .collect(),
            state: m.save(),
        })
    }

    /// Hands the module of switch `switch` the `lines` its [`lookup::Lookup::save`] gave at
    /// the last save (valed's start): all or none. An administrator's.
    pub fn lookup_restore(
        &self,
        switch: &str,
        lines: &[String],
        caller: &Caller,
    ) -> Result<(), Error> {
        let sws = self.lock();
        let sw = existing_switch(&sws, switch)?;
        caller.must_be_admin(&format!("restoring the lookup module of switch '{switch}'"))?;
        Ok(sw.lookup().restore(lookup::ControlCtx { switch }, lines)?)
    }

    /// The lookup module of switch `switch`.
    pub fn lookup_info(&self, switch: &str) -> Result<LookupInfo, Error> {
        let sws = self.lock();
        Ok(lookup_info(existing_switch(&sws, switch)?))
    }
}

/// A lookup module as valed's configuration keeps it ([`Engine::lookup_saved`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedLookup {
    pub spec: String,
    pub args: Vec<(String, String)>,
    pub state: Vec<String>,
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
            .map(|a| ModuleArg {
                key: a.key.clone(),
                value: a.value.clone(),
            })
            .collect(),
        counters: m
            .counters()
            .into_iter()
            .map(|(name, value)| ModuleCounter { name, value })
            .collect(),
    }
}

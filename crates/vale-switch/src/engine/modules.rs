//! The engine's calls on a switch's lookup module: installing one, what it shows, its own
//! commands, and what valed's configuration keeps of it. Nothing here knows any module: a
//! module's commands and state are text the module alone reads.

use super::*;

/// Longest a caller waits for a lookup module's command ([`Engine::lookup_control`]).
pub const MODULE_COMMAND_LIMIT: Duration = Duration::from_secs(5);
/// Most commands that wait for (or run in) one switch's module at once.
pub const MODULE_COMMANDS_QUEUED: usize = 64;

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
    ///
    /// The module's code runs on a thread of its own, without the engine's lock: a command
    /// that takes long holds no other request. A switch's module runs one command at a time
    /// (in the order they come), the caller waits at most [`MODULE_COMMAND_LIMIT`] for its
    /// answer, waiting for earlier commands included (then an error, busy; the command still
    /// runs), and at most [`MODULE_COMMANDS_QUEUED`] commands wait for one switch (more are
    /// refused at once): what a slow module holds is its own switch's commands and a bounded
    /// number of threads.
    pub fn lookup_control(
        &self,
        switch: &str,
        op: &str,
        body: &str,
        caller: &Caller,
    ) -> Result<(String, String), Error> {
        let (sw, m) = {
            let sws = self.lock();
            let sw = existing_switch(&sws, switch)?.clone();
            let m = arc_swap::Guard::into_inner(sw.lookup());
            (sw, m)
        };
        let name = m.name().to_string();
        if !m.open_op(op) {
            caller.must_be_admin(&format!(
                "command '{op}' of lookup module '{name}' of switch '{switch}'"
            ))?;
        }
        if sw.commands_queued.fetch_add(1, Relaxed) >= MODULE_COMMANDS_QUEUED {
            sw.commands_queued.fetch_sub(1, Relaxed);
            return Err(Error::busy(format!(
                "{MODULE_COMMANDS_QUEUED} commands wait for lookup module '{name}' of switch \
                 '{switch}', which has not answered an earlier one: try again later"
            )));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let (op_s, body_s, sw_t) = (op.to_string(), body.to_string(), sw.clone());
        let spawned = std::thread::Builder::new()
            .name("vale-module-cmd".into())
            .spawn(move || {
                let one = sw_t.commands.lock().unwrap_or_else(|e| e.into_inner());
                let r = m.control(lookup::ControlCtx { switch: &sw_t.name }, &op_s, &body_s);
                drop(one);
                sw_t.commands_queued.fetch_sub(1, Relaxed);
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            sw.commands_queued.fetch_sub(1, Relaxed);
            return Err(Error::io(format!("cannot run the module's command: {e}")));
        }
        let output = match rx.recv_timeout(MODULE_COMMAND_LIMIT) {
            Ok(r) => r?,
            Err(_) => {
                tracing::warn!(
                    switch,
                    module = name,
                    op,
                    "a lookup module's command did not answer in time"
                );
                return Err(Error::busy(format!(
                    "lookup module '{name}' did not answer '{op}' within \
                     {MODULE_COMMAND_LIMIT:?} (the command goes on; switch '{switch}' takes \
                     no other command until it ends)"
                )));
            }
        };
        if output.len() > lookup::MAX_CONTROL_OUTPUT {
            return Err(Error::limit(format!(
                "lookup module '{name}' answered '{op}' with {} bytes, more than the {} a reply \
                 carries",
                output.len(),
                lookup::MAX_CONTROL_OUTPUT
            )));
        }
        Ok((name, output))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::{ControlCtx, FrameMeta, KeptArg, Lookup, SourcePort};
    use crate::ErrorKind;

    /// A module with two commands: `small` (open to anyone) and `big`, whose answer is one
    /// byte past what a reply may carry.
    struct Chatty;

    impl Lookup for Chatty {
        fn name(&self) -> &str {
            "chatty"
        }
        fn lookup(&self, _src: SourcePort, _frames: &mut [FrameMeta], _now_s: u32) -> u64 {
            0
        }
        fn control(&self, ctx: ControlCtx, op: &str, body: &str) -> Result<String, lookup::Error> {
            match op {
                "small" => Ok(format!("{} {body}", ctx.switch)),
                "big" => Ok("x".repeat(lookup::MAX_CONTROL_OUTPUT + 1)),
                _ => Err(lookup::Error::unsupported(
                    self.name(),
                    op,
                    &["small", "big"],
                )),
            }
        }
        fn open_op(&self, op: &str) -> bool {
            op == "small"
        }
    }

    #[test]
    fn commands_are_checked_for_rights_and_answer_size() {
        let engine = Engine::new(EngineConfig::default()).unwrap();
        let admin = Caller::valed();
        let user = Caller {
            uid: 4242,
            pid: 1,
            admin: false,
        };
        engine.create("vale0:a", &admin).unwrap();
        existing_switch(&engine.lock(), "vale0")
            .unwrap()
            .set_lookup(Installed {
                module: Box::new(Chatty),
                spec: "chatty".into(),
                args: vec![KeptArg {
                    key: "k".into(),
                    value: "v".into(),
                    saved: true,
                }],
            });
        let run = |op: &str, who: &Caller| engine.lookup_control("vale0", op, "hi", who);
        assert_eq!(
            run("small", &user),
            Ok(("chatty".to_string(), "vale0 hi".to_string()))
        );
        assert_eq!(
            run("big", &user).unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        let e = run("big", &admin).unwrap_err();
        assert_eq!(e.kind, ErrorKind::LimitReached);
        assert!(
            e.message.contains("more than the 16777216 a reply carries"),
            "{e}"
        );
        assert_eq!(
            run("other", &admin).unwrap_err().kind,
            ErrorKind::Unsupported
        );
        let e = engine
            .lookup_control("vale9", "small", "", &admin)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        // Nothing to save but its argument; restoring needs an administrator.
        let saved = engine.lookup_saved("vale0").unwrap();
        assert_eq!(saved.args, [("k".to_string(), "v".to_string())]);
        assert!(saved.state.is_empty());
        let e = engine
            .lookup_restore("vale0", &["x".into()], &user)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        let e = engine
            .lookup_restore("vale0", &["x".into()], &admin)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
    }
}

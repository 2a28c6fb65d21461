//! Who may do what: the caller of a control operation, the owner of a port, and the bounds on
//! what one user makes valed hold.
//!
//! A port belongs to the uid that opened, created or attached it. Destroying, detaching or
//! tuning it, or reopening it once free, needs that uid or an administrator. Host devices
//! (TAP, NIC), lookup modules and switch-wide knobs need an administrator. Administrators are
//! root, the user valed runs as and, if valed was started with one, the members of an
//! administrators' group; they are not bound by the per-user limits, so they always get
//! through.

use crate::error::Error;
use crate::port::PortShared;

/// The identity of a control connection's peer (from `SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub pid: u32,
    /// Root, or a member of the administrators' group.
    pub admin: bool,
}

impl Caller {
    /// valed itself, for what it does on its own behalf.
    pub fn valed() -> Caller {
        Caller {
            // SAFETY: plain syscall without arguments.
            uid: unsafe { libc::geteuid() },
            pid: std::process::id(),
            admin: true,
        }
    }

    /// Fails unless the caller is an administrator; `what` names the operation.
    pub fn must_be_admin(&self, what: &str) -> Result<(), Error> {
        if self.admin {
            Ok(())
        } else {
            Err(Error::denied(format!(
                "{what} needs an administrator (root, valed's own user or the administrators' group); uid {} is not one",
                self.uid
            )))
        }
    }

    /// Fails unless the caller owns `port` or is an administrator.
    pub fn must_own(&self, port: &PortShared, what: &str) -> Result<(), Error> {
        let owner = port.owner_uid;
        if self.admin || owner == self.uid {
            Ok(())
        } else {
            Err(Error::denied(format!(
                "cannot {what} port '{}': it belongs to uid {owner}, not to uid {}",
                port.name, self.uid
            )))
        }
    }
}

/// Bounds on what one user that is not an administrator makes valed hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserLimits {
    /// Ports (held, or persistent and free) belonging to the user.
    pub ports: usize,
    /// Bytes of port memory (the regions of the user's held ports and the buffers of the
    /// captures it started) together.
    pub port_memory: u64,
    /// Descriptors valed holds for the user's held ports together (see
    /// [`crate::port::descriptors_for`]).
    pub descriptors: usize,
}

impl Default for UserLimits {
    fn default() -> Self {
        UserLimits {
            ports: 256,
            port_memory: 4 << 30,
            descriptors: 4096,
        }
    }
}

/// What one user holds now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub ports: usize,
    pub port_memory: u64,
    pub descriptors: usize,
}

impl Usage {
    pub fn add(&mut self, more: Usage) {
        self.ports += more.ports;
        self.port_memory += more.port_memory;
        self.descriptors += more.descriptors;
    }
}

impl UserLimits {
    /// Fails if `caller` (not an administrator) would go past a limit by taking one more port
    /// bringing `more` (memory and descriptors; none for a persistent port nobody holds).
    pub fn check(&self, caller: &Caller, now: Usage, more: Usage) -> Result<(), Error> {
        let memory = more.port_memory;
        if caller.admin {
            return Ok(());
        }
        if now.ports >= self.ports {
            return Err(Error::limit(format!(
                "uid {} already has {} ports, the most a user may have (valed --max-ports-per-user)",
                caller.uid, now.ports
            )));
        }
        self.check_memory(caller, now.port_memory, memory, "a port")?;
        if now.descriptors + more.descriptors > self.descriptors {
            return Err(Error::limit(format!(
                "uid {} would have ports holding {} descriptors of valed, more than the {} a \
                 user may have (valed --max-port-fds-per-user; fewer rings per port take fewer)",
                caller.uid,
                now.descriptors + more.descriptors,
                self.descriptors
            )));
        }
        Ok(())
    }

    /// Fails if `caller` (not an administrator), holding `now` bytes of port memory, would go
    /// past its limit by taking `more` bytes for `what` (a port, a capture buffer).
    pub fn check_memory(
        &self,
        caller: &Caller,
        now: u64,
        more: u64,
        what: &str,
    ) -> Result<(), Error> {
        if caller.admin || now.saturating_add(more) <= self.port_memory {
            return Ok(());
        }
        Err(Error::limit(format!(
            "port memory limit reached: uid {} holds {} MiB of port memory (ports and capture \
             buffers) and {what} of {} MiB would take it past the {} MiB a user may have \
             (valed --max-port-memory-per-user)",
            caller.uid,
            now >> 20,
            more.div_ceil(1 << 20),
            self.port_memory >> 20
        )))
    }
}

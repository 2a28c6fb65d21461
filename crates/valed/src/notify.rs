//! Readiness notification to a service manager: systemd's `sd_notify` protocol, written
//! here rather than taken from libsystemd. A manager that wants to know when valed is
//! ready (a unit of `Type=notify`) names a Unix datagram socket in `NOTIFY_SOCKET`, a path
//! or, starting with `@`, an abstract name; valed sends it one datagram, `READY=1`, once its
//! control socket listens, so that units ordered after valed find clients served at once,
//! and `STOPPING=1` when a signal tells it to exit. Without `NOTIFY_SOCKET` nothing is sent.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Tells the service manager, if there is one, that valed is ready. A failure is logged,
/// not fatal: valed serves its clients all the same.
pub fn ready() {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let state = format!(
        "READY=1\nMAINPID={}\nSTATUS=control socket listening\n",
        std::process::id()
    );
    if let Err(e) = send(&socket, state.as_bytes()) {
        tracing::warn!(notify_socket = %socket.to_string_lossy(), error = %e,
            "cannot tell the service manager that valed is ready");
    }
}

/// Tells the service manager, if there is one, that valed is going away.
pub fn stopping() {
    if let Some(socket) = std::env::var_os("NOTIFY_SOCKET") {
        if let Err(e) = send(&socket, b"STOPPING=1\nSTATUS=exiting\n") {
            tracing::warn!(notify_socket = %socket.to_string_lossy(), error = %e,
                "cannot tell the service manager that valed is stopping");
        }
    }
}

/// Sends `state` to the datagram socket `socket` names (`/path` or `@abstract`).
fn send(socket: &OsStr, state: &[u8]) -> std::io::Result<()> {
    let bytes = socket.as_bytes();
    let addr = match bytes.first() {
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..])?,
        Some(b'/') => SocketAddr::from_pathname(socket)?,
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither a path nor an abstract name (@...)",
            ))
        }
    };
    let sock = UnixDatagram::unbound()?;
    let sent = sock.send_to_addr(state, &addr)?;
    if sent != state.len() {
        return Err(std::io::Error::other("short datagram"));
    }
    Ok(())
}

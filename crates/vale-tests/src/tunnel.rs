//! Helpers of the tunnel port tests (tunnel, tunnel_learn, evpn): a tunnel port's counters
//! as `vale-ctl list` shows them, and packets and threads on the underlay.

use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::{test_frame, wait_until_every, Valed, T};

/// Counter `name` of a tunnel port's `negotiated` line (`... name N ...`).
pub fn field(line: &str, name: &str) -> u64 {
    let at = format!(" {line}")
        .find(&format!(" {name} "))
        .unwrap_or_else(|| panic!("no '{name}' in {line:?}"));
    line[at + name.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("'{name}' is no number in {line:?}"))
}

/// The part of the line about remote `ip`.
pub fn remote_of<'a>(line: &'a str, ip: &str) -> &'a str {
    let tag = format!("remote {ip}: ");
    let at = line
        .find(&tag)
        .unwrap_or_else(|| panic!("no {tag:?} in {line:?}"));
    let rest = &line[at + tag.len()..];
    &rest[..rest.find(';').unwrap_or(rest.len())]
}

/// The tunnel port's counters line (refreshed by valed about once a second).
pub fn line(v: &Valed, port: &str) -> String {
    v.port(port)
        .and_then(|p| p.negotiated)
        .unwrap_or_else(|| panic!("{port} shows no counters"))
}

/// Waits (up to [`T`]) until `cond` holds of `port`'s counters line; returns it.
pub fn wait_line(v: &Valed, port: &str, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    let ok = wait_until_every(T, Duration::from_millis(200), || {
        last = line(v, port);
        cond(&last)
    });
    assert!(ok, "{port}: {what}: {last}");
    last
}

/// Runs `f` on a thread in network namespace `ns`.
pub fn in_netns<R: Send + 'static>(ns: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let nsf = std::fs::File::open(&path).expect("netns");
        // SAFETY: setns of this thread only, with a descriptor we own.
        assert_eq!(
            unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) },
            0,
            "setns"
        );
        f()
    })
    .join()
    .expect("thread in the namespace")
}

/// An inner frame to MAC `dst` from MAC `src`, of `len` bytes, behind a VXLAN header of VNI
/// `vni`.
pub fn vxlan_packet(vni: u32, src: [u8; 6], dst: [u8; 6], len: usize) -> Vec<u8> {
    let v = vni.to_be_bytes();
    let mut p = vec![8, 0, 0, 0, v[1], v[2], v[3], 0];
    p.extend(test_frame(len.max(22), src, dst, 7).into_iter().take(len));
    p
}

//! Helpers of the tunnel port tests (tunnel, tunnel_learn, tunnel_offload, tunnel_vnis, evpn): a
//! tunnel port's counters as `vale-ctl list` shows them, valed with a vxlan port on loopback, and
//! packets and threads on the underlay.

use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::netns::{unique, Netns};
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

/// valed in a network namespace of its own (`tag`) with vxlan port vale0:t of VNI `vni` at
/// 127.0.0.1 and the arguments `more` (`remote=...`, `learn-remotes=...`).
pub fn vxlan_on_lo(tag: &str, vni: u32, more: &[&str]) -> (Netns, Valed) {
    let home = Netns::new(tag);
    let v = Valed::start_in(&home, &[]);
    let vni = format!("vni={vni}");
    let mut args = vec!["attach", "vale0:t", "vxlan", &vni, "local=127.0.0.1"];
    args.extend_from_slice(more);
    v.ctl_ok(&args);
    (home, v)
}

/// An inner frame to MAC `dst` from MAC `src`, of `len` bytes, behind a VXLAN header of VNI
/// `vni`.
pub fn vxlan_packet(vni: u32, src: [u8; 6], dst: [u8; 6], len: usize) -> Vec<u8> {
    let v = vni.to_be_bytes();
    let mut p = vec![8, 0, 0, 0, v[1], v[2], v[3], 0];
    p.extend(test_frame(len.max(22), src, dst, 7).into_iter().take(len));
    p
}

/// A Linux VTEP in namespace `h2`, joined to `home` (valed's namespace) by a veth underlay:
/// `local` on valed's side, `remote` on H2's (prefix length `plen`), MTU 1500; in H2 a vxlan
/// device of VNI 42 at port 4789 toward `local`, on a bridge with a veth into namespace `c2`,
/// which gets 10.77.0.2/24.
pub fn linux_vtep(home: &Netns, h2: &Netns, c2: &Netns, local: &str, remote: &str, plen: u8) {
    underlay(home, None, local, h2, remote, plen);
    linux_segment(h2, 42, "", local, remote, c2, "10.77.0.2/24");
}

/// A veth underlay (MTU 1500) from `home` (valed's namespace) to namespace `h`, whose end,
/// `under`, gets `remote`/`plen`. `home`'s end gets `local`/`plen`, or with `bridge` joins that
/// bridge of `home` (which holds `local`), so that several hosts share one underlay.
pub fn underlay(
    home: &Netns,
    bridge: Option<&str>,
    local: &str,
    h: &Netns,
    remote: &str,
    plen: u8,
) {
    let u = unique("vu");
    home.ok(&format!("ip link add {u} type veth peer name under"));
    home.ok(&format!("ip link set under netns {}", h.name));
    match bridge {
        Some(br) => {
            home.ok(&format!("ip link set {u} master {br}"));
            home.adopt(None, &u, &[]);
        }
        None => home.adopt(None, &u, &[&format!("{local}/{plen}")]),
    }
    h.adopt(None, "under", &[&format!("{remote}/{plen}")]);
    // On a veth, checksums left for the device to finish stay unfinished, the inner TCP
    // checksum of a VXLAN packet too: a NIC would compute it.
    h.ok("ethtool -K under tx off");
}

/// A segment of the Linux VTEP in namespace `h`: a vxlan device `vx<tag>` of VNI `vni` at port
/// 4789 from `remote` toward `local`, on a bridge `br<tag>` (`br0` for no tag) with a veth `vc<tag>` whose other
/// end, `ce`, goes into namespace `c` with address `addr` (CIDR).
pub fn linux_segment(
    h: &Netns,
    vni: u32,
    tag: &str,
    local: &str,
    remote: &str,
    c: &Netns,
    addr: &str,
) {
    let br = format!("br{}", if tag.is_empty() { "0" } else { tag });
    h.ok(&format!(
        "ip link add vx{tag} type vxlan id {vni} dstport 4789 local {remote} remote {local} \
         && ip link add {br} type bridge && ip link set vx{tag} master {br} \
         && ip link set vx{tag} up && ip link add vc{tag} type veth peer name ce{tag} \
         && ip link set vc{tag} master {br} && ip link set vc{tag} up \
         && ip link set {br} up && ip link set ce{tag} netns {}",
        c.name
    ));
    if !tag.is_empty() {
        c.ok(&format!("ip link set ce{tag} name ce"));
    }
    c.adopt(None, "ce", &[addr]);
}

//! vale-cni: a CNI plugin (spec 1.0: ADD, DEL, CHECK, VERSION; 1.1's GC and STATUS) that
//! puts a container on a vale switch.
//!
//! ADD asks valed for a TAP port on the configured switch (as `vale-ctl attach SWITCH:PORT
//! --tap NAME` does), moves the TAP device into the container's network namespace under the
//! name the runtime asked for (`CNI_IFNAME`), sets its MTU and brings it up, sets the port's
//! knobs, then asks the IPAM plugin of the configuration (`ipam.type`, found in `CNI_PATH`)
//! for addresses and gives them, with the IPAM plugin's routes, to the interface. The result
//! names the interface, its MAC and namespace, and the addresses. A failure part way undoes
//! what was done (the port, the IPAM reservation) before the error is returned.
//!
//! The port and the device are named after the container id and the interface name alone
//! (`valed::port_of`): DEL finds them again without state of its own. DEL detaches the port
//! (valed closes the TAP, and the kernel removes the device wherever it is) and releases the
//! IPAM reservation; a port, a namespace or a valed that is already gone is no error, so DEL
//! may be repeated. CHECK compares the container's interface (present, its MAC, MTU and
//! addresses) and the switch's port with the previous result, and asks the IPAM plugin to
//! check its own. GC (spec 1.1) detaches the switch's container ports that no valid
//! attachment names; STATUS says whether valed answers.
//!
//! valed creates the TAP device in its own network namespace, from which the plugin moves it:
//! valed and the runtime that runs the plugin must share one (the host's, usually).
//!
//! Errors are written as the spec says, on standard output with a non-zero exit status:
//! `{"cniVersion", "code", "msg", "details"}` with the spec's codes (see `error`). The
//! configuration's fields are described in docs/containers.md.

mod config;
mod error;
mod ipam;
mod link;
mod valed;

use std::fs::File;
use std::io::{Read, Write};
use std::net::IpAddr;

use serde_json::{json, Value};

use config::{Command, Env, NetConf};
use error::{CniError, Result};
use valed::Valed;

/// Largest configuration read from standard input.
const MAX_STDIN: u64 = 16 << 20;

const ABOUT: &str =
    "vale-cni: a CNI plugin (spec 1.0, and 1.1's GC and STATUS) that gives a container a \
TAP port of a vale switch. The container runtime runs it with CNI_COMMAND (ADD, DEL, CHECK, \
VERSION, GC, STATUS), \
CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME and CNI_PATH set and the network configuration on \
standard input; see docs/containers.md.";

fn main() {
    if std::env::args().nth(1).is_some() {
        // Any argument: a person asking what this is.
        println!(
            "{ABOUT}\nSupported CNI versions: {}",
            config::SUPPORTED_VERSIONS.join(", ")
        );
        return;
    }
    let mut stdin = Vec::new();
    let read = std::io::stdin().take(MAX_STDIN).read_to_end(&mut stdin);
    let version = config::version_of(&stdin);
    let outcome = match read {
        Ok(_) => run(&stdin),
        Err(e) => Err(error::io(
            "cannot read the configuration on standard input",
            e,
        )),
    };
    let mut out = std::io::stdout().lock();
    let code = match outcome {
        Ok(Some(v)) => {
            let _ = writeln!(out, "{v}");
            0
        }
        Ok(None) => 0,
        Err(e) => {
            let _ = writeln!(out, "{}", e.to_json(&version));
            eprintln!("vale-cni: {} (code {})", e.msg, e.code);
            1
        }
    };
    let _ = out.flush();
    std::process::exit(code);
}

/// The command of the environment, with the configuration `stdin`: what to print.
fn run(stdin: &[u8]) -> Result<Option<Value>> {
    let env = config::env(|k| std::env::var(k).ok())?;
    if env.command == Command::Version {
        return Ok(Some(json!({
            "cniVersion": config::version_of(stdin),
            "supportedVersions": config::SUPPORTED_VERSIONS,
        })));
    }
    let conf = config::parse(stdin)?;
    match env.command {
        Command::Add => add(&conf, &env, stdin).map(Some),
        Command::Del => del(&conf, &env, stdin).map(|()| None),
        Command::Check => check(&conf, &env, stdin).map(|()| None),
        Command::Gc => gc(&conf, &env, stdin).map(|()| None),
        Command::Status => status(&conf, &env, stdin).map(|()| None),
        Command::Version => unreachable!("answered above"),
    }
}

/// The container's network namespace.
fn open_netns(path: &str) -> Result<File> {
    File::open(path).map_err(|e| error::io(format!("cannot open network namespace {path}"), e))
}

fn in_netns<T: Send>(ns: &File, path: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    link::in_netns(ns, f)
        .map_err(|e| error::io(format!("cannot enter network namespace {path}"), e))?
}

/// SWITCH:PORT and the TAP device's name for the container and interface of `env`.
fn names(conf: &NetConf, env: &Env) -> (String, String) {
    let tap = valed::port_of(&env.container_id, &env.ifname);
    (format!("{}:{tap}", conf.switch), tap)
}

fn add(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<Value> {
    // Everything that can be refused without touching anything first.
    if let Some(t) = &conf.ipam {
        ipam::find(t, &env.path)?;
    }
    let ns = open_netns(&env.netns)?;
    let taken = in_netns(
        &ns,
        &env.netns,
        || Ok(link::index_of(&env.ifname).is_some()),
    )?;
    if taken {
        return Err(CniError::new(
            error::ALREADY_EXISTS,
            format!(
                "interface {} already exists in network namespace {}",
                env.ifname, env.netns
            ),
        ));
    }
    let v = Valed::must_connect(&conf.run_dir)?;
    let (port, tap) = names(conf, env);
    v.attach_tap(&port, &tap)?;
    let mut ipam_asked = false;
    let done = plug(conf, env, stdin, &v, &ns, &port, &tap, &mut ipam_asked);
    if done.is_err() {
        // Undo, best effort: the error to report is the first one.
        if let (true, Some(t)) = (ipam_asked, &conf.ipam) {
            let _ = ipam::delegate(t, "DEL", stdin, &env.path);
        }
        let _ = v.detach(&port);
    }
    done
}

/// ADD once the port exists: the device into the container, the knobs, the addresses.
#[allow(clippy::too_many_arguments)]
fn plug(
    conf: &NetConf,
    env: &Env,
    stdin: &[u8],
    v: &Valed,
    ns: &File,
    port: &str,
    tap: &str,
    ipam_asked: &mut bool,
) -> Result<Value> {
    let index = link::index_of(tap).ok_or_else(|| {
        CniError::new(
            error::IO_FAILURE,
            format!(
                "TAP device {tap} that valed made for {port} is not in this network namespace: \
                 valed and the container runtime must share one"
            ),
        )
    })?;
    link::socket()
        .and_then(|mut s| s.move_to(index, ns))
        .map_err(|e| error::io(format!("cannot move {tap} into {}", env.netns), e))?;
    let mac = in_netns(ns, &env.netns, || {
        let set = |s: &mut link::Socket| {
            let i = link::index_of(tap)
                .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENODEV))?;
            s.rename(i, &env.ifname, conf.mtu)?;
            s.up(i)?;
            s.link(i)
        };
        let info = link::socket().and_then(|mut s| set(&mut s)).map_err(|e| {
            error::io(
                format!(
                    "cannot make {tap} interface {} (mtu {:?})",
                    env.ifname, conf.mtu
                ),
                e,
            )
        })?;
        Ok(info.mac.map(|m| link::mac_text(&m)).unwrap_or_default())
    })?;
    for (knob, value) in &conf.knobs {
        v.set(port, knob, value)?;
    }
    let mut result = json!({
        "cniVersion": conf.cni_version,
        "interfaces": [{ "name": env.ifname, "mac": mac, "sandbox": env.netns }],
        "ips": [],
        "routes": [],
        "dns": conf.dns.clone().unwrap_or_else(|| json!({})),
    });
    let Some(t) = &conf.ipam else {
        return Ok(result);
    };
    *ipam_asked = true;
    let got = ipam::delegate(t, "ADD", stdin, &env.path)?.expect("ADD prints a result");
    let (ips, routes) = addressing(&got)?;
    in_netns(ns, &env.netns, || {
        let mut s = link::socket().map_err(|e| error::io("netlink", e))?;
        let i = link::index_of(&env.ifname)
            .ok_or_else(|| CniError::new(error::IO_FAILURE, format!("{} went away", env.ifname)))?;
        for ip in &ips {
            s.add_addr(i, ip.addr, ip.prefix).map_err(|e| {
                error::io(
                    format!("cannot add {}/{} to {}", ip.addr, ip.prefix, env.ifname),
                    e,
                )
            })?;
        }
        for r in &routes {
            let gw = r.gw.or_else(|| {
                ips.iter()
                    .filter_map(|ip| ip.gateway)
                    .find(|g| g.is_ipv4() == r.dst.is_ipv4())
            });
            s.add_route(i, r.dst, r.prefix, gw).map_err(|e| {
                error::io(
                    format!("cannot add route {}/{} via {gw:?}", r.dst, r.prefix),
                    e,
                )
            })?;
        }
        Ok(())
    })?;
    let old = !config::at_least(&conf.cni_version, "1.0.0");
    result["ips"] = ips
        .iter()
        .map(|ip| {
            let mut o = json!({ "address": format!("{}/{}", ip.addr, ip.prefix), "interface": 0 });
            if let Some(g) = ip.gateway {
                o["gateway"] = json!(g.to_string());
            }
            if old {
                o["version"] = json!(if ip.addr.is_ipv4() { "4" } else { "6" });
            }
            o
        })
        .collect();
    result["routes"] = got.get("routes").cloned().unwrap_or_else(|| json!([]));
    if let Some(dns) = got
        .get("dns")
        .filter(|d| d.as_object().is_some_and(|o| !o.is_empty()))
    {
        result["dns"] = dns.clone();
    }
    Ok(result)
}

/// An address of the IPAM plugin's result.
#[derive(Debug, PartialEq)]
struct Ip {
    addr: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
}

/// A route of the IPAM plugin's result.
#[derive(Debug, PartialEq)]
struct Route {
    dst: IpAddr,
    prefix: u8,
    gw: Option<IpAddr>,
}

/// `ADDR/PREFIX`.
fn cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (a, p) = s.split_once('/')?;
    let addr: IpAddr = a.parse().ok()?;
    let prefix: u8 = p.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((addr, prefix))
}

/// The addresses and routes of an IPAM result (any version: `version` fields are ignored).
fn addressing(r: &Value) -> Result<(Vec<Ip>, Vec<Route>)> {
    let bad = |what: String| {
        CniError::new(
            error::DECODE_FAILURE,
            format!("the IPAM plugin's result: {what}"),
        )
    };
    let mut ips = Vec::new();
    for ip in r["ips"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let text = ip["address"].as_str().unwrap_or_default();
        let (addr, prefix) = cidr(text).ok_or_else(|| bad(format!("bad address {ip}")))?;
        let gateway = match ip.get("gateway").and_then(Value::as_str) {
            None => None,
            Some(g) => Some(g.parse().map_err(|_| bad(format!("bad gateway {ip}")))?),
        };
        ips.push(Ip {
            addr,
            prefix,
            gateway,
        });
    }
    let mut routes = Vec::new();
    for r in r["routes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let text = r["dst"].as_str().unwrap_or_default();
        let (dst, prefix) = cidr(text).ok_or_else(|| bad(format!("bad route {r}")))?;
        let gw = match r.get("gw").and_then(Value::as_str) {
            None => None,
            Some(g) => Some(
                g.parse()
                    .map_err(|_| bad(format!("bad route gateway {r}")))?,
            ),
        };
        routes.push(Route { dst, prefix, gw });
    }
    Ok((ips, routes))
}

fn del(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    let (port, _) = names(conf, env);
    // No valed: no port (valed's ports end with it, and their TAP devices with them).
    if let Some(v) = Valed::connect(&conf.run_dir)? {
        v.detach(&port)?;
    }
    if let Some(t) = &conf.ipam {
        ipam::delegate(t, "DEL", stdin, &env.path)?;
    }
    Ok(())
}

/// GC and STATUS are spec 1.1's.
fn needs_1_1(conf: &NetConf, command: &str) -> Result<()> {
    if config::at_least(&conf.cni_version, "1.1.0") {
        return Ok(());
    }
    Err(CniError::new(
        error::INCOMPATIBLE_VERSION,
        format!("{command} needs cniVersion 1.1.0, not {}", conf.cni_version),
    ))
}

/// Delegates `command` to the IPAM plugin, if there is one and it speaks the configuration's
/// version (one older than spec 1.1 has no GC or STATUS to do).
fn delegate_1_1(conf: &NetConf, env: &Env, command: &str, stdin: &[u8]) -> Result<()> {
    let Some(t) = &conf.ipam else {
        return Ok(());
    };
    if ipam::speaks(t, &conf.cni_version, &env.path)? {
        ipam::delegate(t, command, stdin, &env.path)?;
    }
    Ok(())
}

/// GC: detaches the container ports of the switch (the names [`valed::port_of`] makes) that
/// no valid attachment names, then lets the IPAM plugin collect its own.
fn gc(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    needs_1_1(conf, "GC")?;
    if let Some(v) = Valed::connect(&conf.run_dir)? {
        let valid: Vec<String> = conf
            .valid_attachments
            .iter()
            .map(|(id, ifname)| format!("{}:{}", conf.switch, valed::port_of(id, ifname)))
            .collect();
        for p in v.ports()? {
            let Some((sw, name)) = p.name.split_once(':') else {
                continue;
            };
            let ours = sw == conf.switch && p.kind == "tap" && valed::is_container_port(name);
            if ours && !valid.contains(&p.name) {
                v.detach(&p.name)?;
            }
        }
    }
    delegate_1_1(conf, env, "GC", stdin)
}

/// STATUS: ADD works if valed answers (and the IPAM plugin says it works).
fn status(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    needs_1_1(conf, "STATUS")?;
    if Valed::connect(&conf.run_dir)?.is_none() {
        return Err(CniError::new(
            error::NOT_AVAILABLE,
            format!(
                "no valed answers at {}",
                conf.run_dir.join(vale_abi::control::SOCKET_NAME).display()
            ),
        ));
    }
    delegate_1_1(conf, env, "STATUS", stdin)
}

fn not_as_expected(msg: String) -> CniError {
    CniError::new(error::NOT_AS_EXPECTED, msg)
}

fn check(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    if !config::at_least(&conf.cni_version, "0.4.0") {
        return Err(CniError::new(
            error::INCOMPATIBLE_VERSION,
            format!(
                "CHECK needs cniVersion 0.4.0 or later, not {}",
                conf.cni_version
            ),
        ));
    }
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            error::INVALID_CONFIG,
            "CHECK needs the previous result ('prevResult')",
        )
    })?;
    if let Some(t) = &conf.ipam {
        ipam::delegate(t, "CHECK", stdin, &env.path)?;
    }
    let (port, tap) = names(conf, env);
    let v = Valed::must_connect(&conf.run_dir)?;
    match v.port(&port)? {
        Some(p) if p.kind == "tap" => {}
        Some(p) => {
            return Err(not_as_expected(format!(
                "port {port} is a {} port, not tap",
                p.kind
            )))
        }
        None => {
            return Err(not_as_expected(format!(
                "switch {} has no port {port} (TAP {tap})",
                conf.switch
            )))
        }
    }
    let ifaces = prev["interfaces"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let Some(at) = ifaces
        .iter()
        .position(|i| i["name"] == env.ifname.as_str() && i["sandbox"] == env.netns.as_str())
    else {
        return Err(not_as_expected(format!(
            "prevResult names no interface {} in {}",
            env.ifname, env.netns
        )));
    };
    let mac = ifaces[at]["mac"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let (ips, _) = addressing(prev)?;
    let mine: Vec<&Ip> = prev["ips"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .zip(&ips)
        .filter(|(j, _)| j["interface"].as_u64() == Some(at as u64))
        .map(|(_, ip)| ip)
        .collect();
    let ns = open_netns(&env.netns)?;
    in_netns(&ns, &env.netns, || {
        let i = link::index_of(&env.ifname).ok_or_else(|| {
            not_as_expected(format!("no interface {} in {}", env.ifname, env.netns))
        })?;
        let mut s = link::socket().map_err(|e| error::io("netlink", e))?;
        let info = s
            .link(i)
            .map_err(|e| error::io(format!("interface {}", env.ifname), e))?;
        let have = info.mac.map(|m| link::mac_text(&m)).unwrap_or_default();
        if have != mac {
            return Err(not_as_expected(format!(
                "interface {} has MAC {have}, the result says {mac}",
                env.ifname
            )));
        }
        if let (Some(want), Some(got)) = (conf.mtu, info.mtu) {
            if want != got {
                return Err(not_as_expected(format!(
                    "interface {} has MTU {got}, the configuration says {want}",
                    env.ifname
                )));
            }
        }
        let addrs = s
            .addrs(i)
            .map_err(|e| error::io(format!("addresses of {}", env.ifname), e))?;
        for ip in mine {
            if !addrs.contains(&(ip.addr, ip.prefix)) {
                return Err(not_as_expected(format!(
                    "interface {} lacks {}/{} (it has {addrs:?})",
                    env.ifname, ip.addr, ip.prefix
                )));
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests;

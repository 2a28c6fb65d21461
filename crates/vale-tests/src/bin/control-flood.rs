//! A hostile control client for the tests: floods valed's control socket the way an
//! unprivileged user could, then holds what it got and reports what happened as JSON.
//!
//! ```text
//! control-flood SOCKET conns N [HOLD_MS]         N idle connections
//! control-flood SOCKET announce N LEN [HOLD_MS]  N connections, each announcing a LEN-byte
//!                                                request and sending none of it
//! control-flood SOCKET open NAME...              one connection opening each port in turn
//! control-flood SOCKET ask N HOLD_MS JSON         N connections, each sending request JSON
//!                                                and reading nothing for HOLD_MS
//! ```
//!
//! `conns` and `announce` print `{"connected": .., "refused": .., "failed": ..}`: refused
//! connections are those valed closed (or answered with an error) by the end of the hold.
//! `open` prints `{"opened": .., "errors": [messages]}`. `ask` reads, after the hold, the one
//! reply of each connection and prints `{"connected": .., "answered": .., "errors": ..,
//! "error": first message, "kind": its kind, "bytes": bytes of the replies that were not
//! errors, "reply": the first of them}`.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vale_abi::control::{self, Reply, Request};
use vale_abi::region::{PortParams, VALE_ABI_VERSION};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!(
            "usage: control-flood SOCKET conns N [HOLD_MS] | announce N LEN [HOLD_MS] | \
             open NAME... | ask N HOLD_MS JSON"
        );
        std::process::exit(2)
    };
    if args.len() < 3 {
        usage();
    }
    let sock = &args[0];
    let num = |i: usize| -> u64 {
        args.get(i)
            .map(|s| s.parse().unwrap_or_else(|_| usage()))
            .unwrap_or(0)
    };
    raise_descriptor_limit();
    match args[1].as_str() {
        "conns" => flood(sock, num(2), None, num(3)),
        "announce" => flood(sock, num(2), Some(num(3) as u32), num(4)),
        "open" => open(sock, &args[2..]),
        "ask" => ask(sock, num(2), num(3), args.get(4).unwrap_or_else(|| usage())),
        _ => usage(),
    }
}

fn flood(sock: &str, n: u64, announce: Option<u32>, hold_ms: u64) {
    let mut held = Vec::new();
    let mut failed = 0u64;
    for _ in 0..n {
        // A full listen queue is waited out a little, never for long.
        let mut tries = 0;
        let made = loop {
            match connect_nonblocking(sock) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => break other,
            }
        };
        match made {
            Ok(mut s) => {
                if let Some(len) = announce {
                    let _ = s.write_all(&len.to_le_bytes());
                }
                held.push(s);
            }
            Err(_) => failed += 1,
        }
    }
    std::thread::sleep(Duration::from_millis(hold_ms));
    // A connection valed closed or answered is readable now; one it holds is not.
    let refused = held.iter().filter(|s| readable(s)).count();
    println!(
        "{{\"connected\": {}, \"refused\": {refused}, \"failed\": {failed}}}",
        held.len()
    );
}

fn ask(sock: &str, n: u64, hold_ms: u64, json: &str) {
    let mut frame = (json.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(json.as_bytes());
    let mut held = Vec::new();
    for _ in 0..n {
        let Ok(mut s) = UnixStream::connect(sock) else {
            break;
        };
        if s.write_all(&frame).is_ok() {
            held.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(hold_ms));
    let (mut answered, mut errors, mut bytes) = (0, 0, 0);
    let (mut first, mut kind, mut reply) = (String::new(), None, None);
    for s in &held {
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        match control::recv::<serde_json::Value>(s) {
            Ok(Some((v, _))) if v["reply"] == "error" => {
                errors += 1;
                if first.is_empty() {
                    first = v["message"].as_str().unwrap_or_default().to_string();
                    kind = Some(v["kind"].clone());
                }
            }
            Ok(Some((v, _))) => {
                answered += 1;
                bytes += v.to_string().len();
                reply.get_or_insert(v);
            }
            _ => {}
        }
    }
    println!(
        "{}",
        serde_json::json!({"connected": held.len(), "answered": answered, "errors": errors,
                           "error": first, "kind": kind, "bytes": bytes, "reply": reply})
    );
}

/// Connects without waiting: a full listen queue is a failure, not a wait.
fn connect_nonblocking(path: &str) -> std::io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscalls on a fresh socket we own; the address is built in place.
    unsafe {
        let fd = libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = UnixStream::from_raw_fd(fd);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, b) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
            *d = *b as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        s.set_nonblocking(false)?;
        Ok(s)
    }
}

fn readable(s: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one live pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

fn open(sock: &str, names: &[String]) {
    let s = UnixStream::connect(sock).unwrap_or_else(|e| {
        eprintln!("control-flood: cannot connect to {sock}: {e}");
        std::process::exit(1)
    });
    let mut opened = 0;
    let mut errors = Vec::new();
    // The descriptors of opened ports are kept: closing them would not free the ports (the
    // connection holds them) but keeping them is what a real client does.
    let mut kept = Vec::new();
    for name in names {
        let req = Request::Open {
            port: name.clone(),
            params: PortParams::default(),
            abi_version: VALE_ABI_VERSION,
        };
        control::send(&s, &req, &[]).expect("send");
        match control::recv::<Reply>(&s) {
            Ok(Some((Reply::Opened { .. }, fds))) => {
                opened += 1;
                kept.extend(fds);
            }
            Ok(Some((Reply::Error { message, .. }, _))) => errors.push(message),
            other => {
                errors.push(format!("{other:?}"));
                break;
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({"opened": opened, "errors": errors})
    );
}

fn raise_descriptor_limit() {
    // SAFETY: getrlimit/setrlimit with a live struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

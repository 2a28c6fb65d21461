//! The identity of a control connection's peer, from the kernel (`SO_PEERCRED`,
//! `SO_PEERGROUPS`), never from what the peer says.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use vale_switch::Caller;

/// `SO_PEERGROUPS` (Linux 4.13): the peer's supplementary groups at `connect` time.
const SO_PEERGROUPS: libc::c_int = 59;
/// Most supplementary groups looked at (Linux allows 65536).
const MAX_GROUPS: usize = 65536;

/// Who is at the other end of `s`. Root, valed's own user and members of the administrators'
/// group are administrators. A peer whose credentials cannot be read is nobody in
/// particular: an unknown uid with no rights beyond any user's.
pub fn identify(s: &UnixStream, admin_gid: Option<u32>) -> Caller {
    // SAFETY: getsockopt into a correctly sized ucred.
    let cred = unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let r = libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        );
        (r == 0).then_some(cred)
    };
    let Some(cred) = cred else {
        return Caller {
            uid: u32::MAX,
            pid: 0,
            admin: false,
        };
    };
    // SAFETY: plain syscall without arguments.
    let me = unsafe { libc::geteuid() };
    let admin = cred.uid == 0
        || cred.uid == me
        || admin_gid.is_some_and(|g| cred.gid == g || peer_groups(s).contains(&g));
    Caller {
        uid: cred.uid,
        pid: cred.pid as u32,
        admin,
    }
}

/// The peer's supplementary groups (empty if they cannot be read).
fn peer_groups(s: &UnixStream) -> Vec<u32> {
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = std::mem::size_of_val(groups.as_slice()) as libc::socklen_t;
        // SAFETY: getsockopt into a buffer of `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        let n = len as usize / 4;
        if r == 0 {
            groups.truncate(n);
            return groups;
        }
        // ERANGE: `len` says how much is needed.
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE)
            || n <= groups.len()
            || n > MAX_GROUPS
        {
            return Vec::new();
        }
        groups.resize(n, 0);
    }
}

/// The gid of group `name` (or a number given as is).
pub fn group_id(name: &str) -> Option<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Some(gid);
    }
    let cname = std::ffi::CString::new(name).ok()?;
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r with live buffers of the sizes passed.
    let r = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    (r == 0 && !out.is_null()).then_some(grp.gr_gid)
}

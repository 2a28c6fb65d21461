//! poll, select and epoll on netmap descriptors, with netmap's meaning: a wait syncs the
//! descriptor's rings (tx rings always, so queued frames go out; rx rings when the program
//! waits for input) and reports readable when a bound rx ring holds frames, writable when a
//! bound tx ring has room. It sleeps only after asking valed for an interrupt on those rings,
//! on the descriptor itself (an epoll instance watching their interrupt lines), next to the
//! program's other descriptors. Descriptors that are not netmap's pass through untouched.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use libc::{c_int, c_short, epoll_event, pollfd};
use vale::Events;

use crate::device::{self, NmFile};

/// What a wait asks of a netmap descriptor, from poll(2) bits.
fn want_of(events: c_short) -> Events {
    Events {
        readable: events & (libc::POLLIN | libc::POLLRDNORM) != 0,
        writable: events & (libc::POLLOUT | libc::POLLWRNORM) != 0,
    }
}

/// What holds for one netmap descriptor, as poll(2) bits for the events asked in `events`
/// (`arm`, after a look that found nothing: ask valed for an interrupt before a sleep).
fn look(file: &NmFile, events: c_short, arm: bool) -> c_short {
    let Some(b) = file.bound() else {
        return libc::POLLERR;
    };
    let want = want_of(events);
    let got = if arm {
        b.waiter.ask(&b.port, want)
    } else {
        b.waiter.ready(&b.port, want)
    };
    match got {
        Ok(got) => {
            (if got.readable {
                events & (libc::POLLIN | libc::POLLRDNORM)
            } else {
                0
            }) | (if got.writable {
                events & (libc::POLLOUT | libc::POLLWRNORM)
            } else {
                0
            })
        }
        // valed went away: the port is gone, as a hung-up device.
        Err(_) => libc::POLLERR | libc::POLLHUP,
    }
}

/// Milliseconds left until `deadline` for poll(2) (-1: none; rounded up).
pub fn ms_left(deadline: Option<Instant>) -> c_int {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            left.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int
        }
    }
}

fn expired(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// poll(2) over `fds`, some of them netmap descriptors (`nm`: their index and file).
/// `sleep` is the real wait (poll or ppoll) on a copy of the array until a deadline.
///
/// In the sleep, a netmap descriptor is replaced by what it stands for, its port's control
/// connection and the interrupt lines of the rings asked for (appended to the copy): the
/// same sleep as libvale's own `vale_poll`, with no epoll in between.
pub fn poll_with(
    fds: &mut [pollfd],
    nm: &[(usize, Arc<NmFile>)],
    deadline: Option<Instant>,
    sleep: &dyn Fn(&mut [pollfd], Option<Instant>) -> c_int,
) -> c_int {
    let mut copy = Vec::with_capacity(fds.len() + 4 * nm.len());
    let mut spans = Vec::with_capacity(nm.len());
    loop {
        // Look first; only if nothing holds, arm and look once more.
        let mut ready = 0;
        for arm in [false, true] {
            for (i, f) in nm {
                fds[*i].revents = look(f, fds[*i].events, arm);
                ready += (fds[*i].revents != 0) as c_int;
            }
            if ready > 0 {
                break;
            }
        }
        // The other descriptors: a look if a netmap one is ready, else the sleep.
        copy.clear();
        copy.extend_from_slice(fds);
        spans.clear();
        for (i, f) in nm {
            copy[*i].fd = -1;
            copy[*i].revents = 0;
            let start = copy.len();
            if ready == 0 {
                if let Some(b) = f.bound() {
                    b.waiter.lines(&b.port, want_of(fds[*i].events), &mut copy);
                }
            }
            spans.push(start..copy.len());
        }
        let r = sleep(
            &mut copy,
            if ready > 0 {
                Some(Instant::now())
            } else {
                deadline
            },
        );
        if r < 0 {
            return r;
        }
        let mut others = 0;
        for (i, (f, c)) in fds.iter_mut().zip(&copy).enumerate() {
            if !nm.iter().any(|(j, _)| *j == i) {
                f.revents = c.revents;
                others += (c.revents != 0) as c_int;
            }
        }
        if ready > 0 {
            return ready + others;
        }
        for ((i, f), span) in nm.iter().zip(&spans) {
            let lines = &copy[span.clone()];
            if let Some(b) = f.bound() {
                if b.waiter.woken(&b.port, lines).is_err() {
                    fds[*i].revents = libc::POLLERR | libc::POLLHUP;
                    ready += 1;
                }
            }
        }
        if ready > 0 {
            return ready + others;
        }
        // Whatever woke the sleep, look again; an interrupt with nothing behind it (a frame
        // taken by a sync meanwhile) sleeps again, until the deadline.
        for (i, f) in nm {
            fds[*i].revents = look(f, fds[*i].events, false);
            ready += (fds[*i].revents != 0) as c_int;
        }
        if ready + others > 0 || r == 0 || expired(deadline) {
            return ready + others;
        }
    }
}

/// The netmap descriptors among `fds`.
pub fn netmap_entries(fds: &[pollfd]) -> Vec<(usize, Arc<NmFile>)> {
    if device::OPEN.load(Relaxed) == 0 {
        return Vec::new();
    }
    fds.iter()
        .enumerate()
        .filter_map(|(i, p)| device::file_checked(p.fd).map(|f| (i, f)))
        .collect()
}

/// select(2) over descriptor sets holding a netmap descriptor: done as a poll.
///
/// # Safety
/// The sets are null or valid `fd_set`s covering `nfds` descriptors.
pub unsafe fn select_with(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
    deadline: Option<Instant>,
    sleep: &dyn Fn(&mut [pollfd], Option<Instant>) -> c_int,
) -> Option<c_int> {
    let isset = |set: *mut libc::fd_set, fd: c_int| !set.is_null() && libc::FD_ISSET(fd, set);
    let mut fds = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let events = (if isset(rd, fd) { libc::POLLIN } else { 0 })
            | (if isset(wr, fd) { libc::POLLOUT } else { 0 })
            | (if isset(ex, fd) { libc::POLLPRI } else { 0 });
        if events != 0 {
            fds.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let nm = netmap_entries(&fds);
    if nm.is_empty() {
        return None; // the caller's real select does it all
    }
    let r = poll_with(&mut fds, &nm, deadline, sleep);
    if r < 0 {
        return Some(r);
    }
    for set in [rd, wr, ex] {
        if !set.is_null() {
            libc::FD_ZERO(set);
        }
    }
    let mut n = 0;
    for p in &fds {
        if p.revents & libc::POLLNVAL != 0 {
            *libc::__errno_location() = libc::EBADF;
            return Some(-1);
        }
        // A descriptor goes into a set it was asked in, for the bits that set reports.
        let hit = |set: *mut libc::fd_set, asked: c_short, bits: c_short| {
            if !set.is_null() && p.events & asked != 0 && p.revents & bits != 0 {
                libc::FD_SET(p.fd, set);
                1
            } else {
                0
            }
        };
        n += hit(
            rd,
            libc::POLLIN,
            libc::POLLIN | libc::POLLHUP | libc::POLLERR,
        );
        n += hit(wr, libc::POLLOUT, libc::POLLOUT | libc::POLLERR);
        n += hit(ex, libc::POLLPRI, libc::POLLPRI);
    }
    Some(n)
}

/// A netmap descriptor in an epoll instance of the program's: the events and data the
/// program registered. The instance itself holds the descriptor with [`marker`] as data.
struct Watch {
    epfd: c_int,
    fd: c_int,
    events: u32,
    data: u64,
}

static WATCHES: Mutex<Vec<Watch>> = Mutex::new(Vec::new());
static WATCHED: AtomicUsize = AtomicUsize::new(0);

/// The data under which an epoll instance holds netmap descriptor `fd`.
fn marker(fd: c_int) -> u64 {
    0x7661_6c65_0000_0000 | fd as u32 as u64 // "vale"
}

/// epoll_ctl(2) for a netmap descriptor: recorded, and registered under its marker.
///
/// # Safety
/// `ev` is null or points at an epoll_event.
pub unsafe fn epoll_ctl_netmap(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let mut mine = epoll_event {
        events: libc::EPOLLIN as u32,
        u64: marker(fd),
    };
    let r = (crate::real::epoll_ctl())(epfd, op, fd, &mut mine);
    if r < 0 {
        return r;
    }
    let mut w = WATCHES.lock().unwrap_or_else(|e| e.into_inner());
    w.retain(|x| !(x.epfd == epfd && x.fd == fd));
    if op != libc::EPOLL_CTL_DEL && !ev.is_null() {
        let e = ev.read_unaligned();
        w.push(Watch {
            epfd,
            fd,
            events: e.events,
            data: e.u64,
        });
    }
    WATCHED.store(w.len(), Relaxed);
    r
}

/// The watches' lock, held (for the fork handlers).
pub fn hold_watches() -> Box<dyn std::any::Any> {
    Box::new(WATCHES.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Forgets the watches of a descriptor being closed (netmap descriptor or epoll instance).
pub fn forget_watches(fd: c_int) {
    if WATCHED.load(Relaxed) == 0 {
        return;
    }
    let mut w = WATCHES.lock().unwrap_or_else(|e| e.into_inner());
    w.retain(|x| x.epfd != fd && x.fd != fd);
    WATCHED.store(w.len(), Relaxed);
}

/// epoll_wait(2) on an instance that holds netmap descriptors (`None`: it holds none, the
/// caller's real epoll_wait does it all). `sleep` is the real wait until a deadline.
///
/// # Safety
/// `out` points at `max` writable epoll_events.
pub unsafe fn epoll_wait_with(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    deadline: Option<Instant>,
    sleep: &dyn Fn(*mut epoll_event, c_int, Option<Instant>) -> c_int,
) -> Option<c_int> {
    if WATCHED.load(Relaxed) == 0 || max <= 0 {
        return None;
    }
    let mine: Vec<(c_int, u32, u64)> = {
        let w = WATCHES.lock().unwrap_or_else(|e| e.into_inner());
        w.iter()
            .filter(|x| x.epfd == epfd)
            .map(|x| (x.fd, x.events, x.data))
            .collect()
    };
    let watched: Vec<(Arc<NmFile>, u32, u64)> = mine
        .into_iter()
        .filter_map(|(fd, events, data)| device::file_checked(fd).map(|f| (f, events, data)))
        .collect();
    if watched.is_empty() {
        return None;
    }
    let max = max as usize;
    let out = std::slice::from_raw_parts_mut(out, max);
    let as_poll = |events: u32| (events & 0xffff) as c_short;
    loop {
        let mut n = 0;
        for arm in [false, true] {
            for (f, events, data) in &watched {
                if n == max {
                    break;
                }
                let got = look(f, as_poll(*events), arm);
                if got != 0 {
                    out[n] = epoll_event {
                        events: got as u16 as u32,
                        u64: *data,
                    };
                    n += 1;
                }
            }
            if n > 0 {
                break;
            }
        }
        if n == max {
            return Some(n as c_int); // full: the other descriptors wait for the next call
        }
        let when = if n > 0 {
            Some(Instant::now())
        } else {
            deadline
        };
        let r = sleep(out[n..].as_mut_ptr(), (max - n) as c_int, when);
        if r < 0 {
            return Some(r);
        }
        // Replace the markers with what the netmap descriptor says, or drop them.
        let mut m = n;
        for k in n..n + r as usize {
            let ev = out[k];
            let data = ev.u64;
            let hit = watched
                .iter()
                .find(|(f, _, _)| marker(f.fd) == data)
                .map(|(f, events, d)| (look(f, as_poll(*events), false), *d));
            out[m] = match hit {
                None => ev,
                Some((0, _)) => continue,
                Some((got, d)) if n == 0 => epoll_event {
                    events: got as u16 as u32,
                    u64: d,
                },
                Some(_) => continue, // already reported above
            };
            m += 1;
        }
        if m > 0 || expired(deadline) || r == 0 {
            return Some(m as c_int);
        }
    }
}

/// A deadline `ms` milliseconds from now (< 0: none).
pub fn deadline_ms(ms: c_int) -> Option<Instant> {
    (ms >= 0).then(|| Instant::now() + std::time::Duration::from_millis(ms as u64))
}

/// A deadline from a timespec (null: none).
///
/// # Safety
/// `ts` is null or valid.
pub unsafe fn deadline_ts(ts: *const libc::timespec) -> Option<Instant> {
    ts.as_ref().map(|t| {
        Instant::now()
            + std::time::Duration::new(
                t.tv_sec.max(0) as u64,
                t.tv_nsec.clamp(0, 999_999_999) as u32,
            )
    })
}

/// The same deadline as a timespec for ppoll/pselect (None: wait without limit).
pub fn ts_left(deadline: Option<Instant>) -> Option<libc::timespec> {
    deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        }
    })
}

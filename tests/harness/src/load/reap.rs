//! A child process's own CPU time: the harness waits for each driver process itself with
//! `wait4`, once a pidfd says it has ended, so every stage's CPU time is its own
//! (`getrusage(RUSAGE_CHILDREN)` would mix in every earlier child, and sampling `/proc` misses
//! a process's last moments). The child is spawned with std, which never reaps on its own.
//! (Its `ru_maxrss` is not its own: see `sample` in the module above.)
#![allow(unsafe_code)] // pidfd_open and wait4: no safe wrapper in std, tokio or rustix 1.1

use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

/// How a process ended, and what it used.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ended {
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// User plus system CPU time.
    pub cpu: Duration,
    /// Peak resident set size, bytes.
    pub max_rss: u64,
}

/// Waits, without blocking a thread, for child `pid` (a process this one spawned and nobody
/// has reaped) to end, then reaps it.
pub async fn wait(pid: u32) -> std::io::Result<Ended> {
    let raw = i32::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: the descriptor was just returned to us and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: the OwnedFd stays open, and is the same descriptor, for the AsyncFd's life.
    let readable = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // A pidfd becomes readable when its process ends.
    let _ = readable.readable().await?;
    let mut status = 0i32;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes into the two locals, which outlive the call.
    let reaped = unsafe { libc::wait4(raw, &mut status, 0, &mut usage) };
    if reaped != raw {
        return Err(std::io::Error::last_os_error());
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ok(Ended {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        max_rss: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
    })
}

/// Raises this process's open-file limit to its hard limit: a thousand jobs hold three
/// descriptors each (two pipes and a pidfd) besides the machines' and engines' own.
pub fn raise_fd_limit() {
    // SAFETY: an all-zero rlimit is a valid value for getrlimit to fill.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit and setrlimit read and write the one local, which outlives them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

//! Engine connections kept between a lease's Docker requests. A job's stage sends its requests
//! one after another (create, start, inspect, remove), and each one opened a new stream to the
//! engine: an SSH channel (a round trip to the machine, and a connection sshd makes to the
//! engine's socket) or a TLS handshake. An HTTP/1.1 connection whose answer has been read to
//! its end can carry the next request, so the host keeps it for the same lease's next one.
//!
//! - Per lease, never shared: a connection carries one lease holder's requests only, and it
//!   closes when its lease ends, as every channel of the lease does ([`crate::channels`]).
//! - A few per lease ([`IDLE_PER_LEASE`]), and not for long ([`IDLE_FOR`]): an idle
//!   connection holds a channel on the machine and a connection on its engine.
//! - Only a connection whose answer was read to its end is kept (a body cut or dropped before
//!   its end closes its connection). An upgraded connection (attach, exec) belongs to its
//!   stream and is never kept.
//!
//! Owns: the idle connections, by lease. Must not know: routes, sessions or lease states.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// The request body an engine connection carries: any caller's body, boxed.
pub(crate) type EngineBody = http_body_util::combinators::UnsyncBoxBody<
    bytes::Bytes,
    Box<dyn std::error::Error + Send + Sync>,
>;

/// The sending half of an HTTP/1.1 connection to an engine.
pub(crate) type EngineSender = hyper::client::conn::http1::SendRequest<EngineBody>;

/// How long an idle connection waits for its lease's next request. The stages of a job follow
/// one another within a second or two; dockerd closes no idle connection of its own (its API
/// server sets no idle timeout), so a kept one is not closed under a request.
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(10);

/// The idle connections kept per lease: a stage sends one request at a time, and a few stages
/// may overlap (a detached run and its log follower).
pub(crate) const IDLE_PER_LEASE: usize = 4;

/// One idle connection.
struct Idle {
    sender: EngineSender,
    since: Instant,
}

impl Idle {
    /// Whether it can carry another request: fresh and open. (Kept the moment its answer was
    /// read, it may take a moment more to turn idle: the taker waits for that.)
    fn usable(&self, now: Instant) -> bool {
        now.duration_since(self.since) < IDLE_FOR && !self.sender.is_closed()
    }
}

/// The idle engine connections of one pool's leases.
#[derive(Default)]
pub(crate) struct IdleEngines {
    by_lease: Mutex<HashMap<u64, Vec<Idle>>>,
}

impl std::fmt::Debug for IdleEngines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleEngines")
            .field("idle", &self.count())
            .finish()
    }
}

impl IdleEngines {
    /// The most recently kept connection of `lease` that is fresh and open; stale and closed
    /// ones met on the way are dropped (which closes them).
    pub(crate) fn take(&self, lease: u64) -> Option<EngineSender> {
        let now = Instant::now();
        let mut by_lease = self.by_lease.lock();
        let idle = by_lease.get_mut(&lease)?;
        let mut found = None;
        while let Some(next) = idle.pop() {
            if next.usable(now) {
                found = Some(next.sender);
                break;
            }
        }
        if idle.is_empty() {
            by_lease.remove(&lease);
        }
        found
    }

    /// Keeps `sender` for `lease`'s next request, unless the lease has ended (`ended` is its
    /// channels' token: checked under the lock that [`IdleEngines::forget`] takes after the
    /// token is cancelled, so a connection kept as the lease ends is never left behind) or
    /// the lease already has [`IDLE_PER_LEASE`] idle connections.
    pub(crate) fn keep(&self, lease: u64, sender: EngineSender, ended: &CancellationToken) {
        let now = Instant::now();
        let mut by_lease = self.by_lease.lock();
        if ended.is_cancelled() {
            return;
        }
        let idle = by_lease.entry(lease).or_default();
        idle.retain(|i| i.usable(now));
        if idle.len() < IDLE_PER_LEASE {
            idle.push(Idle { sender, since: now });
        }
    }

    /// Closes `lease`'s idle connections: the lease ended (its token is already cancelled).
    pub(crate) fn forget(&self, lease: u64) {
        self.by_lease.lock().remove(&lease);
    }

    /// Closes every idle connection that has waited [`IDLE_FOR`] or whose engine closed it.
    pub(crate) fn prune(&self) {
        let now = Instant::now();
        self.by_lease.lock().retain(|_, idle| {
            idle.retain(|i| i.usable(now));
            !idle.is_empty()
        });
    }

    /// The idle connections kept now, over every lease.
    pub(crate) fn count(&self) -> usize {
        self.by_lease.lock().values().map(Vec::len).sum()
    }
}

//! The driver's seams: the clock, the readiness check and the lease journal it is handed.

use std::time::Duration;

use async_trait::async_trait;

use crate::Millis;
use crate::core::{JournalError, Lease};
use flotilla_provider::Provider;

/// The source of time, so tests and the simulator can use virtual time.
pub trait Clock: Send + Sync {
    /// Now, in milliseconds since the Unix epoch.
    fn now(&self) -> Millis;
}

/// Wall-clock time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as Millis)
    }
}

/// Why an instance is not ready: a short, fixed cause (a metric label, e.g. `ssh-auth`) and
/// the whole story for the log and the instances API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NotReady {
    /// A fixed label, one of a small set the readiness layer documents.
    pub cause: &'static str,
    /// What happened.
    pub message: String,
}

impl NotReady {
    /// A failure with its cause label.
    pub fn new(cause: &'static str, message: impl Into<String>) -> Self {
        NotReady {
            cause,
            message: message.into(),
        }
    }
}

/// Decides whether a running instance can take jobs (e.g. Docker answers on it), and keeps
/// checking idle ready ones.
#[async_trait]
pub trait Readiness: Send + Sync {
    /// `Ok` when ready; `Err` says why not (counted toward `failure_threshold`).
    async fn check(&self, provider: &dyn Provider, instance: &str) -> Result<(), NotReady>;

    /// A cheap liveness probe of a ready instance that has no lease (e.g. Docker's `/_ping`
    /// over the session kept from `check`). Only called when `ping_interval` is set.
    async fn ping(&self, _provider: &dyn Provider, _instance: &str) -> Result<(), NotReady> {
        Ok(())
    }

    /// How often idle ready instances are pinged; `None`: never.
    fn ping_interval(&self) -> Option<Duration> {
        None
    }

    /// The pool forgot the instance (it is gone): drop whatever is kept for it.
    fn forget(&self, _instance: &str) {}
}

/// The default readiness: an instance the cloud reports running is ready.
#[derive(Debug, Default, Clone, Copy)]
pub struct AlwaysReady;

#[async_trait]
impl Readiness for AlwaysReady {
    async fn check(&self, _provider: &dyn Provider, _instance: &str) -> Result<(), NotReady> {
        Ok(())
    }
}

/// Where a pool's leases are written so they survive a restart. Every write must be durable
/// when it returns: the API answers only after it.
pub trait LeaseJournal: Send + Sync {
    /// Stores a lease as it is now, with its instance's new use count when it was acquired.
    fn save(&self, lease: &Lease, uses: Option<(&str, u32)>) -> Result<(), JournalError>;
    /// Forgets a lease (released or unreserved).
    fn remove(&self, id: u64) -> Result<(), JournalError>;
    /// Forgets an instance that is gone (its use count).
    fn forget_instance(&self, instance: &str) -> Result<(), JournalError>;
    /// A lease ended (released, or unreserved without a job), as it was before it ended: for
    /// the lease history `tune` reads. Best effort; nothing waits for it.
    fn finished(&self, _lease: &Lease, _released_at: Millis) {}
}

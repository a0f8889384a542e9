//! How a pool reports what it did, without knowing who listens. The binary's metrics implement
//! [`PoolObserver`]; the scaler has no metrics library of its own.

use std::time::Duration;

use flotilla_provider::Function;

use crate::core::{Counters, PoolSnapshot};

/// Receives a pool's measurements. Calls are made from the driver, outside the state lock
/// where the data allows it, so an implementation may take its own locks.
pub trait PoolObserver: Send + Sync {
    /// One provider call finished.
    fn provider_call(&self, function: Function, ok: bool, took: Duration);
    /// An acquire was bound after waiting `took`.
    fn lease_wait(&self, took: Duration);
    /// A readiness check or ping finished: `Err` carries the failure's cause label.
    fn probe(&self, _probe: Probe, _outcome: Result<(), &'static str>, _took: Duration) {}
    /// A lease change was committed to the journal (`ok`) or failed to be, after `took`;
    /// the change is acknowledged only after it.
    fn journal_commit(&self, _ok: bool, _took: Duration) {}
    /// The pool's state after a reconcile, the counters so far, and the readiness and
    /// lifetime latencies (milliseconds) recorded since the last call.
    fn publish(
        &self,
        snap: &PoolSnapshot,
        counters: &Counters,
        ready_ms: &[u64],
        lifetimes_ms: &[u64],
    );
}

/// Which probe of an instance ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The readiness check of a running instance.
    Readiness,
    /// The liveness ping of an idle ready instance.
    Ping,
}

impl Probe {
    /// Metric label and log word.
    pub fn name(self) -> &'static str {
        match self {
            Probe::Readiness => "readiness",
            Probe::Ping => "ping",
        }
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

//! How a pool reports what it did, without knowing who listens. The binary's metrics implement
//! [`PoolObserver`]; the scaler never names Prometheus.

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

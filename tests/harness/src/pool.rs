//! The real scaler around a provider, for tests of plugins under it: a call-counting wrapper
//! and a pool with one all-day policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use flotilla_provider::{CallError, Provider};

/// Counts `update`, `increase` and `decrease` calls and passes everything through.
pub struct Counting<P> {
    pub inner: P,
    pub updates: AtomicU32,
    pub increases: AtomicU32,
    pub decreases: AtomicU32,
}

impl<P> Counting<P> {
    pub fn new(inner: P) -> Self {
        Counting {
            inner,
            updates: AtomicU32::new(0),
            increases: AtomicU32::new(0),
            decreases: AtomicU32::new(0),
        }
    }
}

#[async_trait::async_trait]
impl<P: Provider> Provider for Counting<P> {
    async fn init(&self, s: &str) -> Result<flotilla_provider::ProviderInfo, CallError> {
        self.inner.init(s).await
    }
    async fn update(&self) -> Result<flotilla_provider::Listing, CallError> {
        self.updates.fetch_add(1, Relaxed);
        self.inner.update().await
    }
    async fn increase(&self, n: u32) -> Result<u32, CallError> {
        self.increases.fetch_add(1, Relaxed);
        self.inner.increase(n).await
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, CallError> {
        self.decreases.fetch_add(1, Relaxed);
        self.inner.decrease(ids).await
    }
    async fn connect_info(&self, id: &str) -> Result<flotilla_provider::Connection, CallError> {
        self.inner.connect_info(id).await
    }
    async fn heartbeat(&self, id: &str) -> Result<(), CallError> {
        self.inner.heartbeat(id).await
    }
    async fn shutdown(&self) -> Result<(), CallError> {
        self.inner.shutdown().await
    }
    fn health(&self) -> flotilla_provider::ProviderHealth {
        self.inner.health()
    }
}

/// The real scaler driving pool `name`'s `provider` (initialised, with `info`), its instances ready at
/// once, under one all-day policy keeping `idle_count` slots for `idle_time_ms`.
pub fn spawn_pool<P: Provider + 'static>(
    name: &str,
    provider: Arc<P>,
    info: &flotilla_provider::ProviderInfo,
    config: flotilla_scaler::ScalerConfig,
    idle_count: u32,
    idle_time_ms: u64,
) -> Arc<flotilla_scaler::PoolHandle> {
    use flotilla_scaler::{AlwaysReady, Clock, Policy, PoolCore, PoolHandle, SystemClock};
    let clock = Arc::new(SystemClock);
    let policy = Policy::new(
        vec!["* * * * *".into()],
        "UTC",
        idle_count,
        idle_time_ms,
        0.0,
        0,
        false,
    )
    .expect("policy");
    let mut core = PoolCore::new(config, vec![policy], clock.now());
    core.set_provider_info(info);
    PoolHandle::spawn(
        name.into(),
        core,
        provider,
        clock,
        Arc::new(AlwaysReady),
        None,
    )
}

/// Waits (polling every 100 ms, at most 10 s) until `done` holds; fails the test with the
/// pool's state if it never does.
pub async fn wait_until(pool: &flotilla_scaler::PoolHandle, done: impl FnMut() -> bool) {
    crate::poll::until_true(
        "the pool's condition",
        std::time::Duration::from_secs(10),
        done,
        || format!("{:?}", pool.snapshot()),
    )
    .await
}

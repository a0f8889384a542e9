//! The async driver of one pool: runs the state machine's actions against a provider, event
//! by event. A change in demand wakes it at once; `update_interval` is only a safety net.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::Instrument;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::core::{Action, Binding, JournalError, LeaseError, LeaseState, PoolCore, PoolSnapshot};
use super::{Millis, Policy};
use flotilla_provider::{
    CallError, Connection, Function, Listing, Provider, ProviderHealth, ProviderInfo,
};

use crate::observer::{PoolObserver, Probe};
use crate::waiters::{Grant, Waiters};

mod leases;
mod seams;

pub use leases::AcquireError;
pub use seams::{AlwaysReady, Clock, LeaseJournal, NotReady, Readiness, SystemClock};

/// A pool's provider as readiness and the lease API see it: `connect-info` calls are counted
/// by the pool's observer; everything else passes through.
struct Counted<'a> {
    inner: &'a dyn Provider,
    observer: Option<&'a dyn PoolObserver>,
}

#[async_trait]
impl Provider for Counted<'_> {
    async fn init(&self, settings: &str) -> Result<ProviderInfo, CallError> {
        self.inner.init(settings).await
    }
    async fn update(&self) -> Result<Listing, CallError> {
        self.inner.update().await
    }
    async fn increase(&self, delta: u32) -> Result<u32, CallError> {
        self.inner.increase(delta).await
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, CallError> {
        self.inner.decrease(ids).await
    }
    async fn connect_info(&self, id: &str) -> Result<Connection, CallError> {
        let start = Instant::now();
        let r = self.inner.connect_info(id).await;
        if let Some(m) = self.observer {
            m.provider_call(Function::ConnectInfo, r.is_ok(), start.elapsed());
        }
        r
    }
    async fn heartbeat(&self, id: &str) -> Result<(), CallError> {
        self.inner.heartbeat(id).await
    }
    async fn shutdown(&self) -> Result<(), CallError> {
        self.inner.shutdown().await
    }
    fn health(&self) -> ProviderHealth {
        self.inner.health()
    }
    fn close(&self) {
        self.inner.close();
    }
}

/// A running pool: its state machine, provider and driver task.
pub struct PoolHandle {
    /// The pool's name.
    pub name: String,
    core: Mutex<PoolCore>,
    provider: Arc<dyn Provider>,
    clock: Arc<dyn Clock>,
    readiness: Arc<dyn Readiness>,
    observer: Option<Arc<dyn PoolObserver>>,
    journal: Option<Arc<dyn LeaseJournal>>,
    /// Acquires waiting for a slot, served in order by `grant`.
    waiters: Mutex<Waiters>,
    wake: Notify,
    changed: Notify,
    stop: Notify,
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PoolHandle {
    /// Starts the driver for a pool whose provider is already initialised.
    pub fn spawn(
        name: String,
        core: PoolCore,
        provider: Arc<dyn Provider>,
        clock: Arc<dyn Clock>,
        readiness: Arc<dyn Readiness>,
        observer: Option<Arc<dyn PoolObserver>>,
    ) -> Arc<PoolHandle> {
        PoolHandle::spawn_journaled(name, core, provider, clock, readiness, observer, None)
    }

    /// Like [`PoolHandle::spawn`], writing every lease change to `journal` before it is
    /// acknowledged.
    pub fn spawn_journaled(
        name: String,
        core: PoolCore,
        provider: Arc<dyn Provider>,
        clock: Arc<dyn Clock>,
        readiness: Arc<dyn Readiness>,
        observer: Option<Arc<dyn PoolObserver>>,
        journal: Option<Arc<dyn LeaseJournal>>,
    ) -> Arc<PoolHandle> {
        let mut core = core;
        let ping_ms = readiness.ping_interval().map(|d| d.as_millis() as Millis);
        core.set_ping_interval(ping_ms);
        let handle = Arc::new(PoolHandle {
            name,
            core: Mutex::new(core),
            provider,
            clock,
            readiness,
            observer,
            journal,
            waiters: Mutex::new(Waiters::default()),
            wake: Notify::new(),
            changed: Notify::new(),
            stop: Notify::new(),
        });
        let driver = handle.clone();
        // The driver and its actions log inside the caller's span (the pool and its plugin).
        tokio::spawn(async move { driver.run().await }.in_current_span());
        handle
    }

    fn core(&self) -> MutexGuard<'_, PoolCore> {
        // parking_lot does not poison: every mutation is a single method call on PoolCore,
        // so a panic elsewhere leaves it consistent.
        self.core.lock()
    }

    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        // Every change to the queue is one call on it.
        self.waiters.lock()
    }

    /// Something changed: free slots go to the waiting acquires, the driver plans again, and
    /// `changed()` resolves.
    fn kick(&self) {
        self.grant();
        self.wake.notify_one();
        self.changed.notify_waiters();
    }

    async fn run(self: Arc<Self>) {
        loop {
            let now = self.clock.now();
            let (actions, wake_at) = {
                let mut core = self.core();
                let actions = core.plan(now);
                (actions, core.next_wakeup(now))
            };
            // Planning may have expired leases, freeing slots or failing queued acquires.
            self.grant();
            for action in actions {
                let me = self.clone();
                tokio::spawn(async move { me.execute(action).await }.in_current_span());
            }
            self.publish();
            let sleep = Duration::from_millis(wake_at.saturating_sub(now).max(1));
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
                _ = self.stop.notified() => return,
            }
        }
    }

    /// The provider, with its `connect-info` calls counted by the observer (readiness and
    /// the lease API call it outside the driver's own actions).
    fn counted(&self) -> Counted<'_> {
        Counted {
            inner: self.provider.as_ref(),
            observer: self.observer.as_deref(),
        }
    }

    /// How to reach `instance`, from the plugin (counted like every provider call).
    pub async fn connect_info(&self, instance: &str) -> Result<Connection, CallError> {
        self.counted().connect_info(instance).await
    }

    async fn timed<T, E: std::fmt::Display>(
        &self,
        function: Function,
        fut: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let start = Instant::now();
        let r = fut.await;
        if let Some(m) = &self.observer {
            m.provider_call(function, r.is_ok(), start.elapsed());
        }
        if let Err(e) = &r {
            tracing::warn!(pool = %self.name, function = %function, "provider call failed: {e}");
        }
        r
    }

    async fn execute(&self, action: Action) {
        match action {
            Action::Update => {
                let r = self.timed(Function::Update, self.provider.update()).await;
                let mut core = self.core();
                let before = core.max_instances();
                core.on_update(self.clock.now(), r);
                if core.max_instances() != before {
                    tracing::info!(pool = %self.name, before, now = core.max_instances(), "the group's maximum changed");
                }
            }
            Action::Increase(n) => {
                let r = self
                    .timed(Function::Increase, self.provider.increase(n))
                    .await;
                if let Ok(granted) = &r {
                    tracing::info!(pool = %self.name, asked = n, granted, "scaled up");
                }
                self.core().on_increase(self.clock.now(), n, r);
            }
            Action::Decrease(ids) => {
                let r = self
                    .timed(Function::Decrease, self.provider.decrease(&ids))
                    .await;
                if let Ok(accepted) = &r {
                    tracing::info!(pool = %self.name, ?accepted, "removing instances");
                }
                self.core().on_decrease(self.clock.now(), &ids, r);
            }
            Action::Heartbeat(id) => {
                let r = self
                    .timed(Function::Heartbeat, self.provider.heartbeat(&id))
                    .await;
                self.core().on_heartbeat(self.clock.now(), &id, r);
            }
            Action::CheckReady(id) => {
                let start = Instant::now();
                let r = self.readiness.check(&self.counted(), &id).await;
                self.probed(Probe::Readiness, &id, &r, start.elapsed());
                self.core()
                    .on_ready(self.clock.now(), &id, r.map_err(|e| e.message));
            }
            Action::Ping(id) => {
                let start = Instant::now();
                let r = self.readiness.ping(&self.counted(), &id).await;
                self.probed(Probe::Ping, &id, &r, start.elapsed());
                self.core()
                    .on_ping(self.clock.now(), &id, r.map_err(|e| e.message));
            }
        }
        self.kick();
    }

    fn probed(&self, probe: Probe, id: &str, r: &Result<(), NotReady>, took: Duration) {
        if let Err(e) = r {
            let pool = &self.name;
            tracing::warn!(pool, instance = id, cause = e.cause, "{probe} failed: {e}");
        }
        if let Some(m) = &self.observer {
            m.probe(probe, r.as_ref().map_err(|e| e.cause).copied(), took);
        }
    }

    fn publish(&self) {
        let mut core = self.core();
        // Always drain the buffers, so they cannot grow without an observer.
        let ready = std::mem::take(&mut core.counters.ready_latencies);
        let lifetimes = std::mem::take(&mut core.counters.lifetimes);
        let forgotten = std::mem::take(&mut core.counters.forgotten);
        if !forgotten.is_empty() {
            drop(core);
            for id in &forgotten {
                self.readiness.forget(id);
                if let Some(j) = &self.journal
                    && let Err(e) = j.forget_instance(id)
                {
                    tracing::warn!(pool = %self.name, instance = %id, "lease journal: {e}");
                }
            }
            core = self.core();
        }
        if let Some(m) = &self.observer {
            let mut snap = core.snapshot(self.clock.now());
            let counters = core.counters.clone();
            drop(core);
            self.count_waiting(&mut snap);
            m.publish(&snap, &counters, &ready, &lifetimes);
        }
    }

    /// Runs `f` on the state machine (read-mostly queries).
    pub fn with_core<T>(&self, f: impl FnOnce(&PoolCore) -> T) -> T {
        f(&self.core())
    }

    /// Status for `/v1/pools`.
    pub fn snapshot(&self) -> PoolSnapshot {
        let mut snap = self.core().snapshot(self.clock.now());
        self.count_waiting(&mut snap);
        snap
    }

    /// Adds the acquire queue, which the driver holds and the core does not, to a snapshot.
    fn count_waiting(&self, snap: &mut PoolSnapshot) {
        snap.acquires_waiting = u32::try_from(self.waiting()).unwrap_or(u32::MAX);
    }

    /// Resolves at the pool's next change (a lease or instance event, an action's end).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The provider, e.g. for connection details of a lease's instance.
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.provider
    }

    /// Hot-reloads the policies.
    pub fn set_policies(&self, policies: Vec<Policy>) {
        self.core().set_policies(policies);
        self.kick();
    }

    /// Refuses new reservations, waits up to `grace` for leases to end, then (optionally)
    /// deletes the pool's instances and stops the driver.
    pub async fn shutdown(&self, grace: Duration, delete_instances: bool) {
        self.core().begin_shutdown();
        self.kick();
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            // Register for the wake-up before looking, so a release in between is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.core().busy_leases() == 0 {
                break;
            }
            // Running out of time is fine: the loop condition sees the deadline.
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
        let busy = self.core().busy_leases();
        if busy > 0 {
            tracing::warn!(pool = %self.name, busy, "grace period over with leases still held");
        }
        // A plugin call still running (an update up to its deadline) must not hold up the
        // deletions and the plugin's shutdown.
        self.provider.close();
        if delete_instances {
            let ids = self.core().instance_ids();
            if !ids.is_empty() {
                match self.provider.decrease(&ids).await {
                    Ok(accepted) => {
                        tracing::info!(pool = %self.name, count = accepted.len(), "deleted instances")
                    }
                    Err(e) => {
                        tracing::warn!(pool = %self.name, "deleting instances on shutdown failed: {e}")
                    }
                }
            }
        }
        if let Err(e) = self.provider.shutdown().await {
            tracing::warn!(pool = %self.name, "provider shutdown failed: {e}");
        }
        self.stop.notify_one();
    }
}

//! The async driver of one pool: runs the state machine's actions against a provider, event
//! by event. A change in demand wakes it at once; `update_interval` is only a safety net.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::Instrument;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::core::{
    Action, Binding, JournalError, Lease, LeaseError, LeaseState, PoolCore, PoolSnapshot,
};
use super::{Millis, Policy};
use flotilla_provider::{
    CallError, Connection, Function, Listing, Provider, ProviderHealth, ProviderInfo,
};

use crate::observer::{PoolObserver, Probe};
use crate::waiters::{Grant, Waiters};

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

/// What the journal must hold for a lease change before the change is made and acknowledged.
enum Write<'a> {
    /// The lease as it will be, with its instance's new use count when it is being bound.
    Save(&'a Lease, Option<(&'a str, u32)>),
    /// The lease is gone.
    Remove(u64),
}

/// Why `acquire` gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// The lease itself was refused.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// No ready instance within the timeout; the lease stays reserved.
    #[error("no instance became ready within {0:?}; the lease is still reserved")]
    Timeout(Duration),
}

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

    /// Binds waiting acquires to free slots, oldest first, until the slots or the waiters run
    /// out. Each step is O(log n) in the number waiting; a change wakes only those it serves.
    /// Lock order: the core, then the queue.
    fn grant(&self) {
        let mut core = self.core();
        let mut waiters = self.waiters();
        let now = self.clock.now();
        while let Some((ticket, waiter)) = waiters.front() {
            if waiter.gone() {
                waiters.take(ticket);
                continue;
            }
            let lease = waiter.lease;
            let grant: Grant = match self.bind(&mut core, now, lease) {
                Ok(None) => break,
                Ok(Some(binding)) => Ok(binding),
                Err(e) => Err(e),
            };
            let answered = waiters.take(ticket).map(|w| w.answer(grant));
            if let Some(Err(Ok(_))) = answered {
                // The caller left between the check and the answer: its lease waits again.
                self.unbind(&mut core, now, lease);
            }
        }
        // A lease that expired while queued (its holder stopped renewing) is answered now, not
        // when it reaches the front or its timeout. Expiries are rare, so a sweep is cheap.
        let expired = core.counters.leases_expired;
        if expired != waiters.expired_seen {
            waiters.expired_seen = expired;
            for (ticket, lease) in waiters.tickets() {
                if let Err(e) = core.acquirable(lease)
                    && let Some(w) = waiters.take(ticket)
                {
                    // A caller that left needs no answer.
                    let _ = w.answer(Err(e));
                }
            }
        }
    }

    /// Binds one reserved lease, durably; `Ok(None)`: no free slot.
    fn bind(
        &self,
        core: &mut PoolCore,
        now: Millis,
        id: u64,
    ) -> Result<Option<Binding>, LeaseError> {
        let Some(planned) = core.plan_acquire(now, id)? else {
            return Ok(None);
        };
        let uses = Some((planned.binding.instance.as_str(), planned.uses));
        self.durably(Write::Save(&planned.lease, uses), || {
            core.commit_acquire(&planned);
        })?;
        Ok(Some(planned.binding))
    }

    /// "Durable before acknowledged", in one place: the core has checked the change and said
    /// what the journal must hold for it (`write`); the write is made durable, and only then
    /// is the change made in memory (`commit`). A write that fails changes nothing and
    /// refuses the change as [`LeaseError::NotDurable`]. Called with the core's lock held, so
    /// nothing comes between the check and the change.
    fn durably<T>(&self, write: Write<'_>, commit: impl FnOnce() -> T) -> Result<T, LeaseError> {
        if let Some(journal) = &self.journal {
            self.committed(|| match write {
                Write::Save(lease, uses) => journal.save(lease, uses),
                Write::Remove(id) => journal.remove(id),
            })
            .map_err(LeaseError::NotDurable)?;
        }
        Ok(commit())
    }

    /// Undoes a binding nobody received: the lease is reserved again, in memory and journal.
    fn unbind(&self, core: &mut PoolCore, now: Millis, id: u64) {
        core.unacquire(now, id);
        if let Err(e) = self.journal_save(core.lease(id).cloned(), None) {
            tracing::warn!(pool = %self.name, lease = id, "lease journal: {e}");
        }
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

    /// Promises a slot; wakes the driver so capacity follows demand at once.
    pub fn reserve(&self) -> Result<u64, LeaseError> {
        self.reserve_labelled(std::collections::BTreeMap::new())
    }

    /// Writes a lease to the journal; `Err` when that failed.
    fn journal_save(
        &self,
        lease: Option<Lease>,
        uses: Option<(&str, u32)>,
    ) -> Result<(), JournalError> {
        match (&self.journal, lease) {
            (Some(j), Some(lease)) => self.committed(|| j.save(&lease, uses)),
            _ => Ok(()),
        }
    }

    /// Runs one journal commit, timed for the observer.
    fn committed<T>(
        &self,
        commit: impl FnOnce() -> Result<T, JournalError>,
    ) -> Result<T, JournalError> {
        let start = Instant::now();
        let r = commit();
        if let Some(m) = &self.observer {
            m.journal_commit(r.is_ok(), start.elapsed());
        }
        r
    }

    /// Promises a slot tagged with `labels` (each pair held by one live lease at most).
    pub fn reserve_labelled(
        &self,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<u64, LeaseError> {
        self.reserve_within(labels, None)
    }

    /// Promises a slot tagged with `labels` that fails `deadline_after` from now whatever its
    /// state (the holder's own bound), unless released first.
    pub fn reserve_within(
        &self,
        labels: std::collections::BTreeMap<String, String>,
        deadline_after: Option<Duration>,
    ) -> Result<u64, LeaseError> {
        self.reserve_for(labels, deadline_after, None)
    }

    /// [`PoolHandle::reserve_within`] for `tenant`: the lease takes only an instance no other
    /// tenant used, and binds it to `tenant` for good.
    pub fn reserve_for(
        &self,
        labels: std::collections::BTreeMap<String, String>,
        deadline_after: Option<Duration>,
        tenant: Option<String>,
    ) -> Result<u64, LeaseError> {
        let mut core = self.core();
        let after = deadline_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let lease = core.plan_reserve(self.clock.now(), labels, after, tenant)?;
        let id = self.durably(Write::Save(&lease, None), || {
            core.commit_reserve(lease.clone())
        })?;
        drop(core);
        self.kick();
        Ok(id)
    }

    /// Frees a slot whose instance the lease holder found broken: the instance is failed and
    /// replaced.
    pub fn release_broken(&self, id: u64, cause: &str) -> Result<(), LeaseError> {
        let mut core = self.core();
        core.check_release(id)?;
        let lease = core.lease(id).cloned();
        let now = self.clock.now();
        let r = self.durably(Write::Remove(id), || core.release_broken(now, id, cause))?;
        drop(core);
        self.ended(&r, lease, now);
        self.kick();
        r
    }

    /// Records a lease that ended in the history.
    fn ended(&self, result: &Result<(), LeaseError>, lease: Option<Lease>, now: Millis) {
        if let (Ok(()), Some(journal), Some(lease)) = (result, &self.journal, lease) {
            journal.finished(&lease, now);
        }
    }

    /// Binds a reserved lease to a ready instance, waiting up to `instance_acquire_timeout`
    /// behind the acquires that came first. Dropping the future gives up the place in the
    /// queue; a slot handed over at that moment goes back to the pool.
    pub async fn acquire(&self, id: u64) -> Result<Binding, AcquireError> {
        let timeout = Duration::from_millis(self.core().config().instance_acquire_timeout_ms);
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let (ticket, rx) = {
            // A lease that can never be bound is refused at once, not after the queue.
            let core = self.core();
            core.acquirable(id)?;
            self.waiters().push(id)
        };
        let mut place = Place {
            handle: self,
            ticket,
            lease: id,
            rx,
            settled: false,
        };
        self.grant();
        let grant = match tokio::time::timeout_at(deadline, &mut place.rx).await {
            Ok(Ok(grant)) => grant,
            // The queue never drops a waiter whose caller is still here.
            Ok(Err(_)) => Err(LeaseError::UnknownLease(id)),
            Err(_) => match place.leave() {
                Some(grant) => grant,
                None => {
                    place.settled = true;
                    return Err(AcquireError::Timeout(timeout));
                }
            },
        };
        place.settled = true;
        let binding = grant?;
        if let Some(m) = &self.observer {
            m.lease_wait(start.elapsed());
        }
        self.kick();
        Ok(binding)
    }

    /// How many acquires wait for a slot.
    pub fn waiting(&self) -> usize {
        self.waiters().len()
    }

    /// Frees a slot.
    pub fn release(&self, id: u64) -> Result<(), LeaseError> {
        let mut core = self.core();
        core.check_release(id)?;
        let lease = core.lease(id).cloned();
        let now = self.clock.now();
        let r = self.durably(Write::Remove(id), || core.release(now, id))?;
        drop(core);
        self.ended(&r, lease, now);
        self.kick();
        r
    }

    /// Drops a reservation.
    pub fn unreserve(&self, id: u64) -> Result<(), LeaseError> {
        let mut core = self.core();
        core.check_unreserve(id)?;
        let lease = core.lease(id).cloned();
        let r = self.durably(Write::Remove(id), || core.unreserve(id))?;
        drop(core);
        if r.is_ok() {
            // An acquire still queued for it learns at once that the lease is gone.
            for waiter in self.waiters().take_lease(id) {
                let _ = waiter.answer(Err(LeaseError::UnknownLease(id)));
            }
        }
        self.ended(&r, lease, self.clock.now());
        self.kick();
        r
    }

    /// Hands reservation `id` to `to`, this pool's fallback: `to` takes it whole (same id,
    /// labels, tenant and deadlines) and writes it to its journal before this pool forgets
    /// it, so a crash in between leaves it in both (this pool's copy wins; see
    /// [`PoolHandle::drop_handed_twice`]), never in neither. An acquire waiting for it here
    /// is answered `UnknownLease`, and its caller looks again. Locks this pool, then `to`.
    pub fn hand_over(&self, id: u64, to: &PoolHandle) -> Result<(), LeaseError> {
        let mut core = self.core();
        let mut lease = core
            .lease(id)
            .cloned()
            .ok_or(LeaseError::UnknownLease(id))?;
        lease.handed_from = Some(self.name.clone());
        core.check_unreserve(id)?;
        {
            // Not durable there, so not moved.
            let mut theirs = to.core();
            theirs.check_take_over(&lease)?;
            to.durably(Write::Save(&lease, None), || {
                theirs.take_over(lease.clone())
            })??;
        }
        let moved = self.durably(Write::Remove(id), || core.unreserve(id));
        if let Err(e) = moved.and_then(|r| r) {
            // This pool could not forget it: it stays here, and `to` gives its copy up.
            let mut theirs = to.core();
            let _ = to.durably(Write::Remove(id), || theirs.unreserve(id));
            return Err(e);
        }
        drop(core);
        to.kick();
        for waiter in self.waiters().take_lease(id) {
            let _ = waiter.answer(Err(LeaseError::UnknownLease(id)));
        }
        self.kick();
        Ok(())
    }

    /// Why the pool cannot grow now, while it counts as unable to (see
    /// [`PoolCore::cannot_grow`]).
    pub fn cannot_grow(&self) -> Option<String> {
        let now = self.clock.now();
        self.core().cannot_grow(now).map(str::to_string)
    }

    /// While the pool cannot grow, hands each reservation it will not serve to `to`, its
    /// fallback (see [`PoolHandle::hand_over`]); the ids handed, and the refusal that
    /// stopped the handing when one did (the fallback is full, say).
    pub fn fall_back(&self, to: &PoolHandle) -> (Vec<u64>, Option<LeaseError>) {
        if self.cannot_grow().is_none() {
            return (Vec::new(), None);
        }
        let mut handed = Vec::new();
        for id in self.with_core(PoolCore::unserved) {
            match self.hand_over(id, to) {
                Ok(()) => handed.push(id),
                // Acquired meanwhile: nothing to hand.
                Err(LeaseError::Acquired(_) | LeaseError::UnknownLease(_)) => {}
                Err(e) => return (handed, Some(e)),
            }
        }
        (handed, None)
    }

    /// Unreserves the reservations this pool holds that `from` handed over and still holds
    /// itself (a crash came between the two journal writes of [`PoolHandle::hand_over`]).
    pub fn drop_handed_twice(&self, from: &PoolHandle) -> Vec<u64> {
        // One pool's lock at a time: `hand_over` takes `from`'s before this one's.
        let handed: Vec<u64> = self.with_core(|c| {
            c.leases()
                .filter(|l| {
                    l.state == LeaseState::Reserved
                        && l.handed_from.as_deref() == Some(from.name.as_str())
                })
                .map(|l| l.id)
                .collect()
        });
        handed
            .into_iter()
            .filter(|&id| from.with_core(|f| f.lease(id).is_some()))
            .filter(|&id| self.unreserve(id).is_ok())
            .collect()
    }

    /// Renews a lease's TTL; when it now expires.
    pub fn renew(&self, id: u64) -> Result<Option<Millis>, LeaseError> {
        let mut core = self.core();
        match core.lease(id).map(|l| l.state.clone()) {
            None => return Err(LeaseError::UnknownLease(id)),
            Some(LeaseState::Failed { cause }) => return Err(LeaseError::Failed { id, cause }),
            Some(_) => {}
        }
        Ok(core.renew(self.clock.now(), id))
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

/// An acquire's place in the queue; leaving it unanswered (a dropped future) hands back any
/// slot granted meanwhile.
struct Place<'a> {
    handle: &'a PoolHandle,
    ticket: u64,
    lease: u64,
    rx: tokio::sync::oneshot::Receiver<Grant>,
    /// The answer was taken (or the timeout reported): nothing to undo.
    settled: bool,
}

impl Place<'_> {
    /// Leaves the queue; the answer when one was already given.
    fn leave(&mut self) -> Option<Grant> {
        let _core = self.handle.core();
        if self.handle.waiters().take(self.ticket).is_some() {
            return None;
        }
        // Answered under the queue's lock, so the answer is already in the channel.
        self.rx.try_recv().ok()
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let handle = self.handle;
        let mut core = handle.core();
        if handle.waiters().take(self.ticket).is_some() {
            return;
        }
        if let Ok(Ok(_)) = self.rx.try_recv() {
            handle.unbind(&mut core, handle.clock.now(), self.lease);
            drop(core);
            handle.kick();
        }
    }
}

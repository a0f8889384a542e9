//! The async driver's acquire queue: a freed slot goes to the oldest waiting acquire (not to
//! a newcomer, not to everyone at once), a caller that leaves gives its place and any slot
//! handed to it back, and a timeout leaves the lease reserved.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::sync::Arc;
use std::time::Duration;

use flotilla_provider::Provider;
use flotilla_provider::fixed::Fixed;
use flotilla_scaler::driver::AcquireError;
use flotilla_scaler::{
    AlwaysReady, Clock, LeaseState, Policy, PoolCore, PoolHandle, ScalerConfig, SystemClock,
};

/// A pool of one machine with one slot, its acquires waiting at most `timeout_ms`; returned
/// once the slot is ready.
async fn one_slot(timeout_ms: u64) -> Arc<PoolHandle> {
    one_slot_with(timeout_ms, None).await
}

/// The same, with a lease TTL.
async fn one_slot_with(timeout_ms: u64, lease_ttl_ms: Option<u64>) -> Arc<PoolHandle> {
    let pool = spawn("p", timeout_ms, lease_ttl_ms, Vec::new()).await;
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let changed = pool.changed();
            if pool.snapshot().slots.idle == 1 {
                return;
            }
            changed.await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the machine never became ready: {:?}", pool.snapshot()));
    pool
}

/// A pool named `name` of one machine with one slot, its journal having held `restored`;
/// not waited for.
async fn spawn(
    name: &str,
    timeout_ms: u64,
    lease_ttl_ms: Option<u64>,
    restored: Vec<flotilla_scaler::Lease>,
) -> Arc<PoolHandle> {
    let cfg = ScalerConfig {
        lease_ttl_ms,
        capacity_per_instance: 1,
        // Reservations may exceed the one slot; the cloud grants no second machine.
        max_instances: 8,
        instance_acquire_timeout_ms: timeout_ms,
        ..ScalerConfig::default()
    };
    let policy = Policy::new(vec!["* * * * *".into()], "UTC", 0, 3_600_000, 0.0, 0, false)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let clock = Arc::new(SystemClock);
    let mut core = PoolCore::new(cfg, vec![policy], clock.now());
    core.restore(clock.now(), restored, Default::default());
    let provider = Fixed::running(1);
    core.set_provider_info(&provider.init("").await.unwrap());
    PoolHandle::spawn(
        name.into(),
        core,
        Arc::new(provider),
        clock,
        Arc::new(AlwaysReady),
        None,
    )
}

/// Waits until `n` acquires are queued.
async fn until_waiting(pool: &PoolHandle, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while pool.waiting() != n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} waiting, not {n}", pool.waiting()));
}

fn state(pool: &PoolHandle, lease: u64) -> Option<LeaseState> {
    pool.with_core(|core| core.lease(lease).map(|l| l.state.clone()))
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_oldest_waiter_not_to_a_newcomer() {
    let pool = one_slot(60_000).await;
    let holder = pool.reserve().unwrap();
    pool.acquire(holder).await.unwrap();
    let first = pool.reserve().unwrap();
    let second = pool.reserve().unwrap();
    let p = pool.clone();
    let first_wait = tokio::spawn(async move { p.acquire(first).await });
    until_waiting(&pool, 1).await;
    let p = pool.clone();
    let second_wait = tokio::spawn(async move { p.acquire(second).await });
    until_waiting(&pool, 2).await;

    // The release and a newcomer's acquire happen before any waiter runs again: the slot
    // must already belong to the oldest waiter.
    pool.release(holder).unwrap();
    let newcomer = pool.reserve().unwrap();
    let early = tokio::time::timeout(Duration::from_millis(200), pool.acquire(newcomer)).await;
    assert!(early.is_err(), "a newcomer took the freed slot: {early:?}");
    let bound = first_wait.await.unwrap().unwrap();
    assert_eq!(bound.instance, "m-0");
    assert!(matches!(state(&pool, second), Some(LeaseState::Reserved)));
    assert_eq!(pool.waiting(), 1, "the second waiter is still queued");

    // Next in line is the second waiter; the newcomer left the queue when its future was
    // dropped.
    pool.release(first).unwrap();
    second_wait.await.unwrap().unwrap();
    assert_eq!(pool.waiting(), 0);
    assert!(matches!(state(&pool, newcomer), Some(LeaseState::Reserved)));
}

#[tokio::test]
async fn a_caller_that_leaves_gives_back_the_slot_handed_to_it() {
    let pool = one_slot(60_000).await;
    let holder = pool.reserve().unwrap();
    pool.acquire(holder).await.unwrap();
    let leaver = pool.reserve().unwrap();
    // Boxed, so `drop` below drops the future itself.
    let mut wait = Box::pin(pool.acquire(leaver));
    // Queued, not answered.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut wait)
            .await
            .is_err()
    );
    assert_eq!(pool.waiting(), 1);
    // The slot is handed over while the caller is not looking, then the caller leaves.
    pool.release(holder).unwrap();
    assert!(matches!(
        state(&pool, leaver),
        Some(LeaseState::Acquired { .. })
    ));
    drop(wait);
    assert!(
        matches!(state(&pool, leaver), Some(LeaseState::Reserved)),
        "a binding nobody received must go back: {:?}",
        state(&pool, leaver)
    );
    assert_eq!(pool.snapshot().slots.acquired, 0);
    // The slot is free for whoever asks next, the leaver included.
    pool.acquire(leaver).await.unwrap();
}

#[tokio::test]
async fn a_timed_out_acquire_leaves_the_queue_and_its_lease_reserved() {
    let pool = one_slot(300).await;
    let holder = pool.reserve().unwrap();
    pool.acquire(holder).await.unwrap();
    let late = pool.reserve().unwrap();
    match pool.acquire(late).await {
        Err(AcquireError::Timeout(t)) => assert_eq!(t, Duration::from_millis(300)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(pool.waiting(), 0);
    assert!(matches!(state(&pool, late), Some(LeaseState::Reserved)));
    // An unknown lease is refused at once, not after the timeout.
    match pool.acquire(999_999).await {
        Err(AcquireError::Lease(e)) => assert!(e.to_string().contains("999999"), "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_queued_acquire_learns_at_once_that_its_lease_was_dropped() {
    let pool = one_slot(60_000).await;
    let holder = pool.reserve().unwrap();
    pool.acquire(holder).await.unwrap();
    // Behind another waiter, so only the lease's own index can reach it.
    let first = pool.reserve().unwrap();
    let dropped = pool.reserve().unwrap();
    let p = pool.clone();
    let _first_wait = tokio::spawn(async move { p.acquire(first).await });
    until_waiting(&pool, 1).await;
    let p = pool.clone();
    let dropped_wait = tokio::spawn(async move { p.acquire(dropped).await });
    until_waiting(&pool, 2).await;
    pool.unreserve(dropped).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), dropped_wait)
        .await
        .unwrap_or_else(|_| panic!("the acquire waited on after its lease was dropped"))
        .unwrap();
    assert!(
        matches!(
            answer,
            Err(AcquireError::Lease(
                flotilla_scaler::LeaseError::UnknownLease(_)
            ))
        ),
        "{answer:?}"
    );
    assert_eq!(pool.waiting(), 1);
}

#[tokio::test]
async fn a_queued_acquire_learns_soon_that_its_lease_expired() {
    let pool = one_slot_with(60_000, Some(700)).await;
    let holder = pool.reserve().unwrap();
    pool.acquire(holder).await.unwrap();
    let waiter = pool.reserve().unwrap();
    let p = pool.clone();
    let wait = tokio::spawn(async move { p.acquire(waiter).await });
    until_waiting(&pool, 1).await;
    // Nobody renews: the leases expire (700 ms TTL), and the queued acquire is answered with
    // the failure long before its 60 s timeout.
    let answer = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("the acquire waited on after its lease expired"))
        .unwrap();
    assert!(
        matches!(
            answer,
            Err(AcquireError::Lease(
                flotilla_scaler::LeaseError::Failed { .. }
            ))
        ),
        "{answer:?}"
    );
    assert_eq!(pool.waiting(), 0);
}

/// A reservation handed to the fallback keeps its id, labels and tenant; the acquire queued
/// for it in the first pool learns at once that it is gone there, and the fallback binds it.
#[tokio::test]
async fn a_handed_over_reservation_is_bound_in_the_fallback_under_its_id() {
    let first = one_slot(60_000).await;
    let fallback = one_slot(60_000).await;
    let holder = first.reserve().unwrap();
    first.acquire(holder).await.unwrap();
    let labels = std::collections::BTreeMap::from([("job".to_string(), "7".to_string())]);
    let waiting = first
        .reserve_for(labels.clone(), None, Some("project-1".into()))
        .unwrap();
    let p = first.clone();
    let queued = tokio::spawn(async move { p.acquire(waiting).await });
    until_waiting(&first, 1).await;

    first.hand_over(waiting, &fallback).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .unwrap_or_else(|_| panic!("the queued acquire waited on"))
        .unwrap();
    assert!(
        matches!(
            answer,
            Err(AcquireError::Lease(
                flotilla_scaler::LeaseError::UnknownLease(_)
            ))
        ),
        "{answer:?}"
    );
    assert_eq!(state(&first, waiting), None);
    let moved = fallback.with_core(|c| c.lease(waiting).cloned()).unwrap();
    assert_eq!(moved.labels, labels);
    assert_eq!(moved.tenant.as_deref(), Some("project-1"));
    assert_eq!(moved.handed_from.as_deref(), Some("p"));
    let bound = tokio::time::timeout(Duration::from_secs(5), fallback.acquire(waiting))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(bound.slot, 0);
    // An acquired lease is never handed over.
    assert!(first.hand_over(holder, &fallback).is_err());
    assert!(matches!(
        state(&first, holder),
        Some(LeaseState::Acquired { .. })
    ));
}

/// A crash between the fallback's journal write and the first pool's leaves the reservation
/// in both after the restart: the fallback drops its copy, and the first pool keeps its own.
#[tokio::test]
async fn a_reservation_found_in_both_pools_after_a_restart_stays_in_the_first() {
    let lease = |handed_from: Option<&str>| flotilla_scaler::Lease {
        id: 7,
        state: LeaseState::Reserved,
        reserved_at: 1,
        acquired_at: None,
        labels: Default::default(),
        expires_at: None,
        deadline_at: None,
        tenant: None,
        handed_from: handed_from.map(str::to_string),
    };
    let first = spawn("spot", 60_000, None, vec![lease(None)]).await;
    let fallback = spawn("on-demand", 60_000, None, vec![lease(Some("spot"))]).await;
    assert_eq!(fallback.drop_handed_twice(&first), vec![7]);
    assert_eq!(state(&first, 7), Some(LeaseState::Reserved));
    assert_eq!(state(&fallback, 7), None);
    // Once settled, nothing more is dropped.
    assert!(fallback.drop_handed_twice(&first).is_empty());
}

/// A journal that writes leases but cannot remove them (a full disk, say).
struct Unforgetting;

impl flotilla_scaler::LeaseJournal for Unforgetting {
    fn save(
        &self,
        _: &flotilla_scaler::Lease,
        _: Option<(&str, u32)>,
    ) -> Result<(), flotilla_scaler::JournalError> {
        Ok(())
    }
    fn remove(&self, _: u64) -> Result<(), flotilla_scaler::JournalError> {
        Err(flotilla_scaler::JournalError::new(std::io::Error::other(
            "no space left on device",
        )))
    }
    fn forget_instance(&self, _: &str) -> Result<(), flotilla_scaler::JournalError> {
        Ok(())
    }
}

/// A hand-over the first pool cannot make durable (its journal cannot forget the lease) is
/// undone: the reservation stays in the first pool, the fallback gives its copy up, and the
/// acquire waiting for it keeps waiting.
#[tokio::test]
async fn a_hand_over_the_first_pool_cannot_write_is_undone() {
    let cfg = ScalerConfig {
        capacity_per_instance: 1,
        max_instances: 8,
        instance_acquire_timeout_ms: 60_000,
        ..ScalerConfig::default()
    };
    let clock = Arc::new(SystemClock);
    let mut core = PoolCore::new(cfg, Vec::new(), clock.now());
    let provider = Fixed::running(0);
    core.set_provider_info(&provider.init("").await.unwrap());
    let first = PoolHandle::spawn_journaled(
        "spot".into(),
        core,
        Arc::new(provider),
        clock,
        Arc::new(AlwaysReady),
        None,
        Some(Arc::new(Unforgetting)),
    );
    let fallback = spawn("on-demand", 60_000, None, Vec::new()).await;
    let waiting = first.reserve().unwrap();
    let p = first.clone();
    let queued = tokio::spawn(async move { p.acquire(waiting).await });
    until_waiting(&first, 1).await;

    let refused = first.hand_over(waiting, &fallback).unwrap_err();
    assert!(
        matches!(refused, flotilla_scaler::LeaseError::NotDurable(_)),
        "{refused:?}"
    );
    assert_eq!(state(&first, waiting), Some(LeaseState::Reserved));
    assert_eq!(state(&fallback, waiting), None);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!queued.is_finished(), "the queued acquire was answered");
    assert_eq!(first.waiting(), 1);
    queued.abort();
}

/// A journal whose writes fail while it is broken ("no space left on device"), and which
/// holds what was written otherwise.
#[derive(Default)]
struct Breakable {
    broken: std::sync::atomic::AtomicBool,
    held: parking_lot::Mutex<std::collections::BTreeMap<u64, LeaseState>>,
}

impl Breakable {
    fn set_broken(&self, broken: bool) {
        self.broken
            .store(broken, std::sync::atomic::Ordering::SeqCst);
    }

    fn write(
        &self,
        f: impl FnOnce(&mut std::collections::BTreeMap<u64, LeaseState>),
    ) -> Result<(), flotilla_scaler::JournalError> {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(flotilla_scaler::JournalError::new(std::io::Error::other(
                "no space left on device",
            )));
        }
        f(&mut self.held.lock());
        Ok(())
    }

    fn held(&self, id: u64) -> Option<LeaseState> {
        self.held.lock().get(&id).cloned()
    }
}

impl flotilla_scaler::LeaseJournal for Breakable {
    fn save(
        &self,
        lease: &flotilla_scaler::Lease,
        _: Option<(&str, u32)>,
    ) -> Result<(), flotilla_scaler::JournalError> {
        self.write(|held| {
            held.insert(lease.id, lease.state.clone());
        })
    }
    fn remove(&self, id: u64) -> Result<(), flotilla_scaler::JournalError> {
        self.write(|held| {
            held.remove(&id);
        })
    }
    fn forget_instance(&self, _: &str) -> Result<(), flotilla_scaler::JournalError> {
        Ok(())
    }
}

/// Durable before acknowledged: while the journal cannot write, no lease change is
/// acknowledged and none is made. A reservation is refused and leaves no lease; an acquire is
/// refused and leaves its lease reserved and the slot free; a release and an unreserve are
/// refused and leave their leases as they were. Once the journal writes again, each goes
/// through, and the journal holds what memory holds.
#[tokio::test]
async fn while_the_journal_cannot_write_no_lease_change_is_acknowledged_or_made() {
    let cfg = ScalerConfig {
        capacity_per_instance: 1,
        max_instances: 8,
        instance_acquire_timeout_ms: 10_000,
        ..ScalerConfig::default()
    };
    let policy = Policy::new(vec!["* * * * *".into()], "UTC", 1, 3_600_000, 0.0, 0, false)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let clock = Arc::new(SystemClock);
    let mut core = PoolCore::new(cfg, vec![policy], clock.now());
    let provider = Fixed::running(1);
    core.set_provider_info(&provider.init("").await.unwrap());
    let journal = Arc::new(Breakable::default());
    let pool = PoolHandle::spawn_journaled(
        "p".into(),
        core,
        Arc::new(provider),
        clock,
        Arc::new(AlwaysReady),
        None,
        Some(journal.clone()),
    );
    let not_durable =
        |e: &flotilla_scaler::LeaseError| matches!(e, flotilla_scaler::LeaseError::NotDurable(_));
    let leases = |pool: &PoolHandle| pool.with_core(|c| c.leases().count());

    journal.set_broken(true);
    let refused = pool.reserve().unwrap_err();
    assert!(not_durable(&refused), "{refused:?}");
    assert_eq!(leases(&pool), 0, "a refused reservation left a lease");
    journal.set_broken(false);
    let id = pool.reserve().unwrap();
    assert_eq!(journal.held(id), Some(LeaseState::Reserved));

    journal.set_broken(true);
    match pool.acquire(id).await {
        Err(AcquireError::Lease(e)) if not_durable(&e) => {}
        other => panic!("an acquire the journal could not hold: {other:?}"),
    }
    assert_eq!(state(&pool, id), Some(LeaseState::Reserved));
    let slots = pool.snapshot().slots;
    assert_eq!(
        (slots.acquired, slots.reserved),
        (0, 1),
        "the refused acquire kept the slot: {slots:?}"
    );
    journal.set_broken(false);
    let bound = pool.acquire(id).await.unwrap();
    let acquired = Some(LeaseState::Acquired {
        instance: bound.instance.clone(),
        slot: bound.slot,
    });
    assert_eq!(state(&pool, id), acquired);
    assert_eq!(journal.held(id), acquired);

    journal.set_broken(true);
    assert!(not_durable(&pool.release(id).unwrap_err()));
    assert_eq!(
        state(&pool, id),
        acquired,
        "a refused release freed the lease"
    );
    journal.set_broken(false);
    pool.release(id).unwrap();
    assert_eq!((state(&pool, id), journal.held(id)), (None, None));

    let second = pool.reserve().unwrap();
    journal.set_broken(true);
    assert!(not_durable(&pool.unreserve(second).unwrap_err()));
    assert_eq!(state(&pool, second), Some(LeaseState::Reserved));
    journal.set_broken(false);
    pool.unreserve(second).unwrap();
    assert_eq!((state(&pool, second), journal.held(second)), (None, None));

    // A holder that found its instance broken: refused, the lease and the instance stay.
    let third = pool.reserve().unwrap();
    let bound = pool.acquire(third).await.unwrap();
    journal.set_broken(true);
    assert!(not_durable(
        &pool.release_broken(third, "docker is gone").unwrap_err()
    ));
    let instance = |pool: &PoolHandle| {
        pool.with_core(|c| {
            let of = c.instances().into_iter().find(|i| i.id == bound.instance);
            of.map(|i| i.state)
        })
    };
    assert_eq!(
        instance(&pool),
        Some(flotilla_scaler::InstState::Ready),
        "a refused release failed the instance"
    );
    assert_eq!(
        state(&pool, third),
        Some(LeaseState::Acquired {
            instance: bound.instance.clone(),
            slot: bound.slot,
        })
    );
    journal.set_broken(false);
    pool.release_broken(third, "docker is gone").unwrap();
    assert_eq!((state(&pool, third), journal.held(third)), (None, None));
    assert_ne!(
        instance(&pool),
        Some(flotilla_scaler::InstState::Ready),
        "the instance reported broken still takes jobs"
    );
}

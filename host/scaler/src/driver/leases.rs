//! The lease operations of a pool, and the one seam that makes each change durable before it
//! is acknowledged (`durably`): reserve, acquire (the queue of waiting acquires and its
//! grants), release, unreserve, hand-over and renew.

use super::*;
use crate::core::{Change, Committed, Write};

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

impl PoolHandle {
    /// Binds waiting acquires to free slots, oldest first, until the slots or the waiters run
    /// out. Each step is O(log n) in the number waiting; a change wakes only those it serves.
    /// Lock order: the core, then the queue.
    pub(super) fn grant(&self) {
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
    pub(super) fn bind(
        &self,
        core: &mut PoolCore,
        now: Millis,
        id: u64,
    ) -> Result<Option<Binding>, LeaseError> {
        let Some(change) = core.plan_acquire(now, id)? else {
            return Ok(None);
        };
        Ok(self.durably(core, change)?.binding)
    }

    /// "Durable before acknowledged", in one place, for every lease change: the core has
    /// checked the change and said what the journal must hold for it ([`Change::write`]);
    /// the write is made durable, and only then does the core make the change
    /// ([`PoolCore::commit`]). A write that fails changes nothing and refuses the change as
    /// [`LeaseError::NotDurable`]. Called with the core's lock held since the change was
    /// planned, so nothing comes between the check and the change.
    pub(super) fn durably(
        &self,
        core: &mut PoolCore,
        change: Change,
    ) -> Result<Committed, LeaseError> {
        if let Some(journal) = &self.journal {
            self.committed(|| match change.write() {
                Write::Save(lease, uses) => journal.save(lease, uses),
                Write::Remove(id) => journal.remove(id),
            })
            .map_err(LeaseError::NotDurable)?;
        }
        Ok(core.commit(change))
    }

    /// Undoes a binding nobody received: the lease is reserved again, in journal and memory.
    /// When the journal cannot take that, the lease stays bound in both: its holder finds it
    /// acquired when it asks again, or releases it.
    pub(super) fn unbind(&self, core: &mut PoolCore, now: Millis, id: u64) {
        let Some(change) = core.plan_unacquire(now, id) else {
            return;
        };
        if let Err(e) = self.durably(core, change) {
            tracing::warn!(pool = %self.name, lease = id, "lease journal: {e}; the lease stays acquired");
        }
    }

    /// Promises a slot; wakes the driver so capacity follows demand at once.
    pub fn reserve(&self) -> Result<u64, LeaseError> {
        self.reserve_labelled(std::collections::BTreeMap::new())
    }

    /// Runs one journal commit, timed for the observer.
    pub(super) fn committed<T>(
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
        let change = core.plan_reserve(self.clock.now(), labels, after, tenant)?;
        let id = self.durably(&mut core, change)?.id;
        drop(core);
        self.kick();
        Ok(id)
    }

    /// Frees a slot whose instance the lease holder found broken: the instance is failed and
    /// replaced.
    pub fn release_broken(&self, id: u64, cause: &str) -> Result<(), LeaseError> {
        self.end(|core, now| core.plan_release(now, id, Some(cause)))
    }

    /// Ends a lease (release, unreserve) as `plan` checks it, durably; then records it in the
    /// history and wakes the driver.
    fn end(
        &self,
        plan: impl FnOnce(&PoolCore, Millis) -> Result<Change, LeaseError>,
    ) -> Result<(), LeaseError> {
        let mut core = self.core();
        let now = self.clock.now();
        let change = plan(&core, now)?;
        let done = self.durably(&mut core, change)?;
        drop(core);
        if let (Some(journal), Some(lease)) = (&self.journal, &done.ended) {
            journal.finished(lease, now);
        }
        self.kick();
        Ok(())
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
        self.end(|core, now| core.plan_release(now, id, None))
    }

    /// Drops a reservation.
    pub fn unreserve(&self, id: u64) -> Result<(), LeaseError> {
        self.end(|core, _| core.plan_unreserve(id))?;
        // An acquire still queued for it learns at once that the lease is gone.
        for waiter in self.waiters().take_lease(id) {
            let _ = waiter.answer(Err(LeaseError::UnknownLease(id)));
        }
        Ok(())
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
        let forget = core.plan_unreserve(id)?;
        {
            // Not durable there, so not moved.
            let mut theirs = to.core();
            let take = theirs.plan_take_over(lease)?;
            to.durably(&mut theirs, take)?;
        }
        if let Err(e) = self.durably(&mut core, forget) {
            // This pool could not forget it: it stays here, and `to` gives its copy up.
            let mut theirs = to.core();
            if let Ok(give_up) = theirs.plan_unreserve(id) {
                let _ = to.durably(&mut theirs, give_up);
            }
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
    pub(super) fn leave(&mut self) -> Option<Grant> {
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

//! A pool that cannot grow hands its waiting reservations to its fallback pool: the core says
//! when it cannot grow (a quota or capacity refusal, or an instance the cloud failed or took
//! back soon after it came) and which reservations no instance it has or expects will serve;
//! the fallback takes them whole, id included.

use super::{InstState, Lease, LeaseError, LeaseState, PoolCore};
use crate::Millis;

impl PoolCore {
    /// Why the pool cannot grow at `now`, while it counts as unable to (for
    /// `fallback_hold_ms` after it last could not, unless an increase was granted in full
    /// since).
    pub fn cannot_grow(&self, now: Millis) -> Option<&str> {
        self.growth_refused
            .as_ref()
            .filter(|(at, _)| now < at.saturating_add(self.cfg.fallback_hold_ms))
            .map(|(_, why)| why.as_str())
    }

    /// The pool could not grow at `now`, for the reason given.
    pub(super) fn growth_refused(&mut self, now: Millis, why: String) {
        self.growth_refused = Some((now, why));
    }

    /// The cloud granted an increase in full: the pool can grow.
    pub(super) fn growth_granted(&mut self) {
        self.growth_refused = None;
    }

    /// Whether losing instance `key` (failed or taken back by the cloud, not by us) says that
    /// the pool cannot grow: it went within `fallback_failing_within_ms` of being first seen.
    pub(super) fn lost_young(&mut self, now: Millis, key: u64, what: &str) {
        let Some(inst) = self.insts.get(&key) else {
            return;
        };
        let age = now.saturating_sub(inst.seen_at);
        let ours = inst.delete_requested_at.is_some()
            || matches!(inst.state, InstState::Failed | InstState::Deleting);
        if !ours && age < self.cfg.fallback_failing_within_ms {
            let why = format!("instance {} {what} {} s after it came", inst.id, age / 1000);
            self.growth_refused(now, why);
        }
    }

    /// The reservations no slot the pool has or expects will serve, newest first: those past
    /// the free slots of its ready instances and the slots of the instances coming up.
    pub fn unserved(&self) -> Vec<u64> {
        let coming = self.index.count(InstState::Creating)
            + self.index.count(InstState::Running)
            + self.pending.len() as u32;
        let supply = self
            .free_ready_slots()
            .saturating_add(coming.saturating_mul(self.capacity()));
        let mut waiting: Vec<&Lease> = self
            .leases
            .values()
            .filter(|l| l.state == LeaseState::Reserved)
            .collect();
        waiting.sort_by_key(|l| std::cmp::Reverse((l.reserved_at, l.id)));
        let extra = waiting.len().saturating_sub(supply as usize);
        waiting.into_iter().take(extra).map(|l| l.id).collect()
    }

    /// Takes a reservation handed over by the pool it is the fallback of, by the rules of
    /// [`PoolCore::plan_take_over`].
    pub fn take_over(&mut self, lease: Lease) -> Result<(), LeaseError> {
        let change = self.plan_take_over(lease)?;
        self.commit(change);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use flotilla_provider::{CallError, Function, Instance, InstanceState, ProviderError};

    use super::super::{Action, PoolCore};
    use crate::ScalerConfig;

    fn listing(instances: &[(&str, InstanceState)]) -> flotilla_provider::Listing {
        instances
            .iter()
            .map(|(id, state)| Instance {
                id: (*id).into(),
                state: state.clone(),
            })
            .collect::<Vec<_>>()
            .into()
    }

    fn refused(why: &str) -> CallError {
        CallError::Provider {
            function: Function::Increase,
            error: ProviderError::QuotaExceeded(why.into()),
        }
    }

    fn started() -> PoolCore {
        let mut c = PoolCore::new(ScalerConfig::default(), Vec::new(), 0);
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(0, Ok(Vec::new().into()));
        c
    }

    /// A capacity refusal makes the pool unable to grow for `fallback_hold`, or until an
    /// increase is granted in full; a transient failure or a partial grant does not.
    #[test]
    fn a_quota_or_stockout_refusal_holds_until_the_hold_ends_or_a_full_grant() {
        let hold = ScalerConfig::default().fallback_hold_ms;
        let mut c = started();
        c.on_increase(10, 1, Err(refused("ZONE_RESOURCE_POOL_EXHAUSTED")));
        assert_eq!(c.cannot_grow(11), Some("ZONE_RESOURCE_POOL_EXHAUSTED"));
        assert_eq!(
            c.cannot_grow(10 + hold - 1),
            Some("ZONE_RESOURCE_POOL_EXHAUSTED")
        );
        assert_eq!(c.cannot_grow(10 + hold), None);

        c.on_increase(20, 2, Err(refused("SkuNotAvailable")));
        c.on_increase(30, 2, Ok(1));
        assert!(
            c.cannot_grow(31).is_some(),
            "a partial grant is not capacity back"
        );
        c.on_increase(40, 2, Ok(2));
        assert_eq!(c.cannot_grow(41), None);

        let transient = CallError::Provider {
            function: Function::Increase,
            error: ProviderError::Transient("reset".into()),
        };
        c.on_increase(50, 1, Err(transient));
        assert_eq!(c.cannot_grow(51), None);
    }

    /// An instance the cloud fails or takes back soon after it came (a reclaimed spot VM)
    /// makes the pool unable to grow; one that goes late, or that the pool removed itself,
    /// does not.
    #[test]
    fn instances_lost_young_mean_the_pool_cannot_grow() {
        let within = ScalerConfig::default().fallback_failing_within_ms;
        let mut c = started();
        c.on_update(1_000, Ok(listing(&[("young", InstanceState::Running)])));
        let failed = InstanceState::Failed("Azure reclaimed this Spot VM".into());
        c.on_update(61_000, Ok(listing(&[("young", failed.clone())])));
        let why = c.cannot_grow(61_001).expect("cannot grow");
        assert!(why.contains("young") && why.contains("reclaimed"), "{why}");
        assert!(why.contains("60 s"), "{why}");

        let mut c = started();
        c.on_update(1_000, Ok(listing(&[("old", InstanceState::Running)])));
        c.on_update(1_000 + within, Ok(listing(&[("old", failed)])));
        assert_eq!(c.cannot_grow(2_000 + within), None);

        let mut c = started();
        c.on_update(1_000, Ok(listing(&[("gone", InstanceState::Running)])));
        c.on_update(30_000, Ok(Vec::new().into()));
        assert!(
            c.cannot_grow(30_001)
                .expect("vanished")
                .contains("vanished")
        );
    }

    /// The reservations handed over are those past what the pool has or expects, newest
    /// first; the fallback takes them with their id, and refuses a label already held.
    #[test]
    fn unserved_reservations_are_the_newest_past_the_supply() {
        let mut c = started();
        c.on_update(1, Ok(listing(&[("coming", InstanceState::Creating)])));
        let ids: Vec<u64> = (0..3)
            .map(|t| c.reserve(10 + t).expect("reserve"))
            .collect();
        // One instance coming up, one slot each: the two newest wait for nothing.
        assert_eq!(c.unserved(), vec![ids[2], ids[1]]);

        let mut fallback = started();
        let lease = c.lease(ids[2]).cloned().expect("lease");
        fallback.take_over(lease.clone()).expect("taken");
        assert_eq!(fallback.lease(ids[2]).map(|l| l.reserved_at), Some(12));
        assert_eq!(fallback.check_invariants(), Ok(()));
        fallback
            .take_over(lease)
            .expect("taken twice changes nothing");
        assert_eq!(fallback.check_invariants(), Ok(()));
        let mut labelled = c.lease(ids[1]).cloned().expect("lease");
        labelled.labels.insert("job".into(), "7".into());
        fallback.take_over(labelled.clone()).expect("taken");
        labelled.id += 100;
        let held = fallback.take_over(labelled).expect_err("a held label");
        assert!(matches!(held, super::LeaseError::LabelInUse { lease, .. } if lease == ids[1]));
    }
}

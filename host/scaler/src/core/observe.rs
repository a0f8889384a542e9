//! Learning what the provider and the readiness checks answered: `update()` (adopting, failing
//! and forgetting instances), `increase`, `decrease`, readiness, heartbeats, provider errors
//! and backoff, and the start of shutdown. It owns how answers change the pool; it must not
//! decide what to ask next (that is `plan`).

use std::collections::HashSet;

use super::{Backoff, Inst, InstState, Phase, PoolCore, PoolHealth};
use crate::Millis;
use flotilla_provider::{CallError, Function, Instance, InstanceState, Listing, ProviderError};

impl PoolCore {
    fn backoff_of(&mut self, function: Function) -> &mut Backoff {
        match function {
            Function::Increase => &mut self.increase_backoff,
            Function::Decrease => &mut self.decrease_backoff,
            _ => &mut self.update_backoff,
        }
    }

    /// A failed call backs off only its own kind: a refused `increase` must not stop `update`
    /// or scale-down. Refusals an operator must fix (credentials, permissions, settings) are
    /// retried every `paused_retry_interval`, so a fix heals the pool without a restart.
    fn provider_failed(&mut self, now: Millis, e: &CallError) {
        self.last_error = Some(e.to_string());
        let every = self.cfg.paused_retry_interval_ms;
        let function = e.function();
        let needs_operator = matches!(
            e.provider_error(),
            Some(ProviderError::InvalidConfig(_)) | Some(ProviderError::Unauthorized(_))
        );
        let retry_after = match e.provider_error() {
            Some(ProviderError::Throttled { retry_after, .. }) => retry_after.as_millis() as Millis,
            _ => 0,
        };
        let backoff = self.backoff_of(function);
        if needs_operator {
            backoff.pause(now, every, e.to_string());
        } else {
            backoff.fail(now, retry_after);
        }
        // A throttle is the cloud's word on the whole account, not on one call kind: the
        // contract says no call to this pool's plugin before `retry-after-seconds`.
        if retry_after > 0 {
            let until = now.saturating_add(retry_after);
            for b in [
                &mut self.update_backoff,
                &mut self.increase_backoff,
                &mut self.decrease_backoff,
            ] {
                b.hold(until);
            }
        }
        self.health = PoolHealth::Degraded(if needs_operator {
            format!(
                "{function} paused until an operator fixes it (retried every {} s): {e}",
                every / 1000
            )
        } else {
            e.to_string()
        });
    }

    fn provider_ok(&mut self, function: Function) {
        self.backoff_of(function).ok();
        if matches!(self.health, PoolHealth::Stopped(_)) || !self.phase.adopted() {
            return;
        }
        let paused = [
            &self.update_backoff,
            &self.increase_backoff,
            &self.decrease_backoff,
        ]
        .into_iter()
        .find_map(|b| b.paused.clone());
        self.health = match paused {
            None => PoolHealth::Ready,
            Some(p) => PoolHealth::Degraded(format!(
                "paused until an operator fixes it (next try at {} ms): {}",
                p.retry_at, p.reason
            )),
        };
    }

    /// Calls of each kind waiting for an operator's fix, for `/v1/pools`.
    pub fn paused(&self) -> std::collections::BTreeMap<&'static str, super::Pause> {
        [
            ("update", &self.update_backoff),
            ("increase", &self.increase_backoff),
            ("decrease", &self.decrease_backoff),
        ]
        .into_iter()
        .filter_map(|(name, b)| b.paused.clone().map(|p| (name, p)))
        .collect()
    }

    /// Learns the result of `update()`: the group's maximum when the plugin reported one
    /// (first, so the listing is judged against it), then the instances.
    pub fn on_update(&mut self, now: Millis, result: Result<Listing, CallError>) {
        match result {
            Ok(listing) => {
                if let Some(max) = listing.group_max {
                    self.set_group_max(now, max.limit());
                }
                self.on_listed(now, &listing.instances);
            }
            Err(e) => {
                self.update = self.update.finished();
                self.last_update = Some(now);
                self.provider_failed(now, &e);
            }
        }
    }

    /// Learns a successful `update()`'s listing, borrowed (the simulator lists its cloud
    /// without copying it).
    pub fn on_listed<'a>(&mut self, now: Millis, list: impl IntoIterator<Item = &'a Instance>) {
        self.update = self.update.finished();
        self.last_update = Some(now);
        self.updates_seen += 1;
        // Only one update is in flight at a time: this listing is of the latest planned.
        if self
            .increase_unsure
            .is_some_and(|at| self.updates_planned > at)
        {
            self.increase_unsure = None;
        }
        let listing = self.updates_seen;
        for reported in list {
            if let Some(key) = self.known_or_adopted(now, reported) {
                if let Some(inst) = self.insts.get_mut(&key) {
                    inst.listed_in = listing;
                }
                self.apply_reported(now, key, &reported.state);
            }
        }
        let vanished: Vec<u64> = self
            .insts
            .iter()
            .filter(|(_, i)| i.listed_in != listing)
            .map(|(&k, _)| k)
            .collect();
        for key in vanished {
            let cause = self.gone_cause(key, "the instance vanished");
            self.mark_gone(now, key, &cause, true);
        }
        // A requested instance shows up in `update` within seconds on every cloud. One that
        // two successful updates since its request (and 30 s) did not show is a phantom: the
        // group's maximum or desired count changed under us. It no longer blocks scale-up.
        for (_, seen) in self.pending.iter_mut() {
            *seen += 1;
        }
        self.pending
            .retain(|&(at, seen)| seen < 3 || now.saturating_sub(at) < 30_000);
        // Nor can more come than the group's maximum leaves room for, whatever was granted.
        let room = self.max_instances().saturating_sub(self.insts.len() as u32);
        self.pending.truncate(room as usize);
        if !self.phase.adopted() {
            self.rebind_restored(now);
            self.adopted = Some((self.insts.len() as u32, now));
        }
        self.phase = self.phase.after_update();
        self.provider_ok(Function::Update);
    }

    /// The key of a reported instance, adopting it when it is new and alive (one of ours
    /// coming up, or one that already existed).
    fn known_or_adopted(&mut self, now: Millis, reported: &Instance) -> Option<u64> {
        if let Some(&key) = self.by_id.get(&reported.id) {
            return Some(key);
        }
        if matches!(
            reported.state,
            InstanceState::Deleted | InstanceState::Deleting
        ) {
            return None;
        }
        self.pending.pop_front();
        let key = self.next_key;
        self.next_key += 1;
        let mut inst = Inst::new(reported.id.clone(), now, self.capacity());
        inst.uses = self.restored_uses.remove(&reported.id).unwrap_or(0);
        inst.tenant = self.restored_tenants.remove(&reported.id);
        self.add_inst(key, inst);
        Some(key)
    }

    /// Applies what the cloud says about one known instance.
    fn apply_reported(&mut self, now: Millis, key: u64, state: &InstanceState) {
        match state {
            InstanceState::Creating => {}
            InstanceState::Running => {
                // Most listings change nothing; only a change goes through the indexes.
                let creating = self
                    .insts
                    .get(&key)
                    .is_some_and(|i| i.state == InstState::Creating);
                if creating {
                    self.with_inst(key, |i| i.state = InstState::Running);
                }
            }
            InstanceState::Deleting => {
                let cause = self.gone_cause(key, "the cloud is deleting it");
                self.mark_gone(now, key, &cause, false);
            }
            InstanceState::Deleted => {
                let cause = self.gone_cause(key, "the cloud deleted it");
                self.mark_gone(now, key, &cause, true);
            }
            InstanceState::Failed(reason) => {
                self.lost_young(now, key, &format!("failed ({reason})"));
                let cause = format!("instance failed: {reason}");
                self.fail_instance(key, &cause);
            }
        }
    }

    /// What a lease on instance `key` is told when the cloud removes it: `what`, and when the
    /// pool never asked for it, what removes instances unasked.
    fn gone_cause(&self, key: u64, what: &str) -> String {
        let asked = self
            .insts
            .get(&key)
            .is_some_and(|i| i.delete_requested_at.is_some());
        if asked {
            what.to_string()
        } else {
            format!("{what}, unasked (a spot reclaim, a health replacement or an operator)")
        }
    }

    pub(super) fn fail_instance(&mut self, key: u64, cause: &str) {
        self.fail_leases(key, cause);
        self.with_inst(key, |i| {
            if i.state != InstState::Deleting {
                i.state = InstState::Failed;
                i.failure = Some(cause.to_string());
            }
        });
    }

    fn mark_gone(&mut self, now: Millis, key: u64, cause: &str, forget: bool) {
        self.lost_young(now, key, &format!("went ({cause})"));
        self.fail_leases(key, cause);
        if forget {
            if let Some(inst) = self.forget_inst(key) {
                self.counters
                    .lifetimes
                    .push(now.saturating_sub(inst.seen_at));
            }
        } else {
            self.with_inst(key, |i| i.state = InstState::Deleting);
        }
    }

    /// Learns the result of `increase(asked)`.
    pub fn on_increase(&mut self, now: Millis, asked: u32, result: Result<u32, CallError>) {
        self.increase_in_flight = false;
        match result {
            Ok(n) => {
                let n = n.min(asked);
                self.pending
                    .extend(std::iter::repeat_n((now, 0), n as usize));
                self.counters.scale_up += u64::from(n);
                self.update = self.update.want();
                if n == 0 {
                    // Nothing granted (group max, quota): asking again at once would only
                    // spend the cloud's API quota. Back off like an error, without one.
                    self.increase_backoff.fail(now, 0);
                } else {
                    self.provider_ok(Function::Increase);
                    if n == asked {
                        self.growth_granted();
                    }
                    if n < asked {
                        // Part granted: the rest is unlikely to come a moment later.
                        self.increase_backoff.until = self.increase_backoff.until.max(now + 5_000);
                    }
                }
            }
            Err(e) => {
                if outcome_unknown(&e) {
                    self.increase_unsure = Some(self.updates_planned);
                    self.update = self.update.want();
                }
                if let Some(ProviderError::QuotaExceeded(why)) = e.provider_error() {
                    self.growth_refused(now, why.clone());
                }
                self.provider_failed(now, &e);
            }
        }
    }

    /// Learns the result of `decrease(asked)`. Accepted ids are being deleted; ids not
    /// accepted (all of them when the call failed) keep their deletion request and are asked
    /// for again once `deletion_retry_interval` has passed since it.
    pub fn on_decrease(
        &mut self,
        now: Millis,
        asked: &[String],
        result: Result<Vec<String>, CallError>,
    ) {
        let accepted = match result {
            Ok(accepted) => accepted,
            Err(e) => {
                self.provider_failed(now, &e);
                self.keep_for_retry(now, asked.iter());
                return;
            }
        };
        for id in &accepted {
            if let Some(&key) = self.by_id.get(id) {
                self.with_inst(key, |i| i.state = InstState::Deleting);
            }
        }
        let accepted: HashSet<&String> = accepted.iter().collect();
        self.keep_for_retry(now, asked.iter().filter(|id| !accepted.contains(id)));
        self.update = self.update.want();
        self.provider_ok(Function::Decrease);
    }

    /// Makes sure refused deletions of instances on their way out carry the time they were
    /// requested, so `plan` asks again after the retry interval (it normally stamped them when
    /// it asked; a caller that asked on its own may not have).
    fn keep_for_retry<'a>(&mut self, now: Millis, ids: impl Iterator<Item = &'a String>) {
        for id in ids {
            if let Some(&key) = self.by_id.get(id) {
                self.with_inst(key, |i| {
                    if matches!(i.state, InstState::Deleting | InstState::Failed) {
                        i.delete_requested_at.get_or_insert(now);
                    }
                });
            }
        }
    }

    /// Learns the result of a readiness check.
    pub fn on_ready(&mut self, now: Millis, id: &str, result: Result<(), String>) {
        let Some(&key) = self.by_id.get(id) else {
            return;
        };
        let threshold = self.cfg.failure_threshold.max(1);
        let grace = self.cfg.instance_ready_grace_ms;
        let mut failed = None;
        let mut became_ready = None;
        self.with_inst(key, |i| {
            i.readiness_in_flight = false;
            if i.state != InstState::Running {
                return;
            }
            match &result {
                Ok(()) => {
                    i.state = InstState::Ready;
                    // A ping failure sends a ready instance back here; its first readiness
                    // is the one that counts for the creation-to-ready latency.
                    if i.ready_at.is_none() {
                        became_ready = Some(now.saturating_sub(i.seen_at));
                    }
                    i.ready_at = Some(now);
                    i.idle_since = Some(now);
                    i.last_ping = now;
                    i.failures = 0;
                    i.failed_checks = 0;
                }
                Err(reason) => {
                    i.last_error = Some(reason.clone());
                    i.failed_checks += 1;
                    i.next_check = now + readiness_backoff(i.failed_checks);
                    // A machine that was never ready may still be booting: within the grace
                    // its failures are retried but not counted.
                    let booting = i.ready_at.is_none() && now < i.seen_at.saturating_add(grace);
                    if booting {
                        return;
                    }
                    i.failures += 1;
                    if i.failures >= threshold {
                        failed = Some(format!("readiness failed {} times: {reason}", i.failures));
                    }
                }
            }
        });
        if let Some(latency) = became_ready {
            self.counters.ready_latencies.push(latency);
        }
        if let Some(cause) = failed {
            self.fail_instance(key, &cause);
        }
    }

    /// Learns the result of a ping of an idle ready instance. A failed ping takes the
    /// instance out of service at once (back to `running`, so readiness checks it again and
    /// a broken machine is replaced after `failure_threshold` failures); one that took a lease
    /// meanwhile keeps it, and the failure still counts.
    pub fn on_ping(&mut self, now: Millis, id: &str, result: Result<(), String>) {
        let Some(&key) = self.by_id.get(id) else {
            return;
        };
        let threshold = self.cfg.failure_threshold.max(1);
        let mut failed = None;
        self.with_inst(key, |i| {
            i.readiness_in_flight = false;
            i.last_ping = now;
            let Err(reason) = &result else {
                i.failures = 0;
                return;
            };
            i.last_error = Some(format!("ping: {reason}"));
            i.failures += 1;
            if i.failures >= threshold {
                failed = Some(format!("ping failed {} times: {reason}", i.failures));
            } else if i.state == InstState::Ready && i.used == 0 {
                i.state = InstState::Running;
                i.idle_since = None;
            }
        });
        if let Some(cause) = failed {
            self.fail_instance(key, &cause);
        }
    }

    /// Learns the result of `heartbeat(id)`: `not-found` means gone; other errors count
    /// toward `failure_threshold`.
    pub fn on_heartbeat(&mut self, now: Millis, id: &str, result: Result<(), CallError>) {
        let Some(&key) = self.by_id.get(id) else {
            return;
        };
        let threshold = self.cfg.failure_threshold.max(1);
        let mut failed = None;
        let gone = matches!(
            result.as_ref().err().and_then(CallError::provider_error),
            Some(ProviderError::NotFound(_))
        );
        self.with_inst(key, |i| {
            i.heartbeat_in_flight = false;
            i.last_heartbeat = now;
            match &result {
                Ok(()) => i.failures = 0,
                Err(_) if gone => {}
                Err(e) => {
                    i.failures += 1;
                    if i.failures >= threshold {
                        failed = Some(format!("heartbeat failed {} times: {e}", i.failures));
                    }
                }
            }
        });
        if gone {
            self.fail_instance(key, "heartbeat: the cloud no longer knows the instance");
        } else if let Some(cause) = failed {
            self.fail_instance(key, &cause);
        }
    }

    /// Stops handing out leases and drains the pool (deleting empty instances when `delete`).
    pub fn begin_shutdown(&mut self) {
        self.phase = Phase::ShuttingDown {
            adopted: self.phase.adopted(),
        };
        let leased: Vec<u64> = self
            .insts
            .iter()
            .filter(|(_, i)| i.used > 0)
            .map(|(&k, _)| k)
            .collect();
        for key in leased {
            self.with_inst(key, |i| {
                if i.state == InstState::Ready {
                    i.state = InstState::Draining;
                }
            });
        }
    }
}

/// Wait before the next readiness check after `failed` failed ones in a row: 0.5 s, doubling,
/// at most 15 s.
fn readiness_backoff(failed: u32) -> Millis {
    (500u64 << failed.saturating_sub(1).min(5)).min(15_000)
}

/// Whether a failed call may still have taken effect in the cloud: its answer was lost or
/// unreadable (`transient`, `other`), or the plugin died or ran out of time mid-call. A
/// refusal the cloud stated (quota, throttle, permission, settings) took no effect.
fn outcome_unknown(e: &CallError) -> bool {
    match e {
        CallError::Timeout { .. } | CallError::Trap { .. } | CallError::Host { .. } => true,
        CallError::Provider { error, .. } => {
            matches!(error, ProviderError::Transient(_) | ProviderError::Other(_))
        }
        CallError::ContractViolation { .. }
        | CallError::CircuitOpen { .. }
        | CallError::NotInitialized { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Action, PoolCore};
    use crate::ScalerConfig;
    use flotilla_provider::{CallError, Function, Instance, InstanceState, ProviderError};

    /// A pool with one ready, idle instance `i-1` that the fallback policy wants gone.
    fn pool_with_one_idle_instance() -> PoolCore {
        let mut c = PoolCore::new(ScalerConfig::default(), Vec::new(), 0);
        assert_eq!(c.plan(0), [Action::Update]);
        let running = Instance {
            id: "i-1".into(),
            state: InstanceState::Running,
        };
        c.on_update(0, Ok(vec![running].into()));
        assert_eq!(c.plan(0), [Action::CheckReady("i-1".into())]);
        c.on_ready(0, "i-1", Ok(()));
        c
    }

    /// The group's maximum arrives with the listing that carried it and is applied with it; a
    /// listing without one leaves the last report standing.
    #[test]
    fn a_listing_carries_the_group_maximum() {
        let mut c = pool_with_one_idle_instance();
        let unlimited = c.max_instances();
        let listed = |max| flotilla_provider::Listing {
            instances: vec![Instance {
                id: "i-1".into(),
                state: InstanceState::Running,
            }],
            group_max: max,
        };
        c.on_update(1, Ok(listed(Some(flotilla_provider::GroupMax::AtMost(2)))));
        assert_eq!(c.max_instances(), 2.min(unlimited));
        c.on_update(2, Ok(listed(None)));
        assert_eq!(
            c.max_instances(),
            2.min(unlimited),
            "no report: the last one stands"
        );
        c.on_update(3, Ok(listed(Some(flotilla_provider::GroupMax::Unlimited))));
        assert_eq!(c.max_instances(), unlimited);
    }

    fn increase_of(actions: &[Action]) -> Option<u32> {
        actions.iter().find_map(|a| match a {
            Action::Increase(n) => Some(*n),
            _ => None,
        })
    }

    fn creating(ids: &[&str]) -> flotilla_provider::Listing {
        ids.iter()
            .map(|id| Instance {
                id: (*id).into(),
                state: InstanceState::Creating,
            })
            .collect::<Vec<_>>()
            .into()
    }

    /// A scale-up whose answer was lost may have taken effect: the pool lists the group (with
    /// an update planned after the failure, not one already in flight) before it asks again,
    /// and then asks only for what the listing lacks. A stated refusal needs no listing.
    #[test]
    fn an_increase_of_unknown_outcome_is_not_repeated_before_a_new_listing() {
        let mut c = PoolCore::new(ScalerConfig::default(), Vec::new(), 0);
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(0, Ok(Vec::new().into()));
        c.reserve(1).expect("reserve");
        c.reserve(1).expect("reserve");
        assert_eq!(increase_of(&c.plan(1)), Some(2));
        // An update goes out while the increase is in flight; then the increase's answer is
        // lost, though the cloud applied it.
        c.on_update(2, Ok(Vec::new().into()));
        let lost = CallError::Provider {
            function: Function::Increase,
            error: ProviderError::Transient("connection reset".into()),
        };
        c.on_increase(2, 2, Err(lost));
        for t in [10_000, 60_000] {
            let actions = c.plan(t);
            assert_eq!(
                increase_of(&actions),
                None,
                "asked again before a listing: {actions:?}"
            );
            if actions.contains(&Action::Update) {
                // The listing shows what the lost write created.
                c.on_update(t, Ok(creating(&["a", "b"])));
            }
        }
        assert_eq!(increase_of(&c.plan(120_000)), None, "both are coming");
        assert_eq!(c.check_invariants(), Ok(()));

        // A refusal the cloud stated took no effect: asked again after the backoff alone.
        let mut c = PoolCore::new(ScalerConfig::default(), Vec::new(), 0);
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(0, Ok(Vec::new().into()));
        c.reserve(1).expect("reserve");
        assert_eq!(increase_of(&c.plan(1)), Some(1));
        let quota = CallError::Provider {
            function: Function::Increase,
            error: ProviderError::QuotaExceeded("CPUS".into()),
        };
        c.on_increase(2, 1, Err(quota));
        assert_eq!(c.increase_unsure, None);
    }

    #[test]
    fn a_decrease_that_accepts_nothing_is_retried_after_the_interval() {
        let mut c = pool_with_one_idle_instance();
        let ask = vec!["i-1".to_string()];
        assert_eq!(c.plan(1), [Action::Decrease(ask.clone())]);
        c.on_decrease(1, &ask, Ok(Vec::new()));
        let retry = c.config().deletion_retry_interval_ms;
        assert!(!c.plan(2).contains(&Action::Decrease(ask.clone())));
        assert!(!c.plan(retry).contains(&Action::Decrease(ask.clone())));
        assert!(c.plan(1 + retry).contains(&Action::Decrease(ask)));
        assert_eq!(c.check_invariants(), Ok(()));
    }

    #[test]
    fn a_decrease_that_fails_is_retried_after_the_interval() {
        let mut c = pool_with_one_idle_instance();
        let ask = vec!["i-1".to_string()];
        assert_eq!(c.plan(1), [Action::Decrease(ask.clone())]);
        let error = CallError::Provider {
            function: Function::Decrease,
            error: ProviderError::Transient("503".into()),
        };
        c.on_decrease(1, &ask, Err(error));
        let retry = c.config().deletion_retry_interval_ms;
        assert!(!c.plan(retry).contains(&Action::Decrease(ask.clone())));
        assert!(c.plan(1 + retry).contains(&Action::Decrease(ask)));
    }

    /// A pool that keeps one idle instance, `i-1`, ready, and pings idle ones every second.
    fn pinged_pool() -> PoolCore {
        let keep_one =
            crate::Policy::new(vec!["* * * * *".into()], "UTC", 1, 60_000, 0.0, 0, false)
                .expect("a valid policy");
        let mut c = PoolCore::new(ScalerConfig::default(), vec![keep_one], 0);
        c.set_ping_interval(Some(1_000));
        assert_eq!(c.plan(0), [Action::Update]);
        let running = Instance {
            id: "i-1".into(),
            state: InstanceState::Running,
        };
        c.on_update(0, Ok(vec![running].into()));
        assert_eq!(c.plan(0), [Action::CheckReady("i-1".into())]);
        c.on_ready(0, "i-1", Ok(()));
        c
    }

    #[test]
    fn an_idle_instance_is_pinged_when_due_and_one_failed_ping_takes_it_out_of_service() {
        let mut c = pinged_pool();
        assert!(!c.plan(999).contains(&Action::Ping("i-1".into())));
        assert_eq!(c.next_wakeup(999), 1_000);
        assert_eq!(c.plan(1_000), [Action::Ping("i-1".into())]);
        // In flight: not sent twice.
        assert!(!c.plan(1_500).contains(&Action::Ping("i-1".into())));
        c.on_ping(1_500, "i-1", Ok(()));
        assert!(c.plan(2_499).is_empty());
        assert_eq!(c.plan(2_500), [Action::Ping("i-1".into())]);
        c.on_ping(2_600, "i-1", Err("Docker Engine /_ping failed".into()));
        let lease = c.reserve(2_600).expect("a reservation");
        assert_eq!(
            c.acquire(2_600, lease),
            Ok(None),
            "a failed ping must stop new leases"
        );
        // It is checked again; the reservation asks for another instance meanwhile.
        assert_eq!(
            c.plan(2_600),
            [Action::CheckReady("i-1".into()), Action::Increase(1)]
        );
        let view = c.instances();
        assert_eq!(
            view[0].last_error.as_deref(),
            Some("ping: Docker Engine /_ping failed")
        );
        assert_eq!(c.check_invariants(), Ok(()));
    }

    #[test]
    fn a_machine_that_keeps_failing_pings_and_checks_is_failed_and_replaced() {
        let mut c = pinged_pool();
        assert_eq!(c.plan(1_000), [Action::Ping("i-1".into())]);
        c.on_ping(1_000, "i-1", Err("connection reset".into()));
        // Checked again at once, then after a 0.5 s backoff.
        assert_eq!(c.plan(1_001), [Action::CheckReady("i-1".into())]);
        c.on_ready(1_001, "i-1", Err("connect: refused".into()));
        assert!(c.plan(1_500).is_empty());
        assert_eq!(c.next_wakeup(1_500), 1_501);
        assert_eq!(c.plan(1_501), [Action::CheckReady("i-1".into())]);
        c.on_ready(1_501, "i-1", Err("connect: refused".into()));
        let view = c.instances();
        assert_eq!(view[0].state, crate::core::InstState::Failed);
        assert!(
            c.plan(1_502)
                .contains(&Action::Decrease(vec!["i-1".into()]))
        );
    }

    #[test]
    fn a_booting_machine_is_retried_with_backoff_and_not_failed_within_the_grace() {
        let mut c = PoolCore::new(ScalerConfig::default(), Vec::new(), 0);
        assert_eq!(c.plan(0), [Action::Update]);
        let running = Instance {
            id: "i-1".into(),
            state: InstanceState::Running,
        };
        c.on_update(0, Ok(vec![running].into()));
        let grace = c.config().instance_ready_grace_ms;
        let mut t = 0;
        let mut checks = 0;
        while t < grace {
            if c.plan(t).contains(&Action::CheckReady("i-1".into())) {
                c.on_ready(t, "i-1", Err("connection refused".into()));
                checks += 1;
            }
            t = c.next_wakeup(t).min(grace);
        }
        assert_eq!(
            c.count_in(crate::core::InstState::Running),
            1,
            "failed while booting"
        );
        // 0.5 + 1 + 2 + 4 + 8 s, then every 15 s for the rest of five minutes.
        assert!((20..=25).contains(&checks), "{checks} checks in the grace");
        for _ in 0..3 {
            t = c.next_wakeup(t);
            assert!(c.plan(t).contains(&Action::CheckReady("i-1".into())));
            c.on_ready(t, "i-1", Err("connection refused".into()));
        }
        assert_eq!(c.count_in(crate::core::InstState::Failed), 1);
    }

    #[test]
    fn a_forgotten_instance_is_reported_once() {
        let mut c = pinged_pool();
        c.on_update(5, Ok(flotilla_provider::Listing::default()));
        assert_eq!(c.counters.forgotten, ["i-1"]);
    }
}

//! Planning: what the pool wants done now (update, readiness checks, heartbeats, increase,
//! decrease) and when it must look again. It owns the decisions and the throttle; it must not
//! learn results (that is `observe`) nor touch leases.

use super::{Action, InstState, PENDING_EXPIRY_MS, Phase, PoolCore, PoolHealth, UpdateCall};
use crate::Millis;

impl PoolCore {
    fn refill(&mut self, now: Millis) {
        if self.cfg.throttle_limit <= 0.0 {
            self.tokens = f64::INFINITY;
            return;
        }
        let dt = now.saturating_sub(self.tokens_at) as f64 / 1000.0;
        self.tokens = (self.tokens + dt * self.cfg.throttle_limit)
            .min(f64::from(self.cfg.throttle_burst.max(1)));
        self.tokens_at = now;
    }

    /// Instances that count toward capacity: requested, coming up, or ready.
    fn live(&self) -> u32 {
        let n = |s| self.index.count(s);
        n(InstState::Creating)
            + n(InstState::Running)
            + n(InstState::Ready)
            + self.pending.len() as u32
    }

    /// Instances the active policy wants at `now`.
    pub fn desired(&self, now: Millis) -> u32 {
        if self.phase.shutting_down() {
            return 0;
        }
        let in_use = self.reserved + self.acquired;
        let want_slots = in_use.saturating_add(self.policy(now).idle_target(in_use));
        // Slots on draining instances that are still busy do not help new jobs.
        let wanted = want_slots.div_ceil(self.capacity());
        // Tenants' leases that no free slot may take need instances of their own, whatever
        // the free slots bound to other tenants say.
        let unplaced = self.unplaced_tenant_slots();
        let wanted = if unplaced > 0 {
            wanted.max(self.live() + unplaced.div_ceil(self.capacity()))
        } else {
            wanted
        };
        wanted.min(self.max_instances())
    }

    /// The earliest time something time-based may change (idle expiry, backoff, update).
    pub fn next_wakeup(&self, now: Millis) -> Millis {
        let mut next = Millis::MAX;
        // The periodic update, once it may be sent: an update in flight wakes the pool by
        // finishing, a stopped pool sends none, and a backoff postpones it.
        if !self.update.in_flight() && !matches!(self.health, PoolHealth::Stopped(_)) {
            let due = self.last_update.map_or(now, |t| t + self.update_every());
            next = due.max(self.update_backoff.until);
        }
        for until in [
            self.update_backoff.until,
            self.increase_backoff.until,
            self.decrease_backoff.until,
        ] {
            if until > now {
                next = next.min(until);
            }
        }
        // Only future deadlines count: an idle instance kept for idle_count, or a deletion
        // already retried, or an update that cannot be sent yet, must not make the driver spin.
        let idle_time = self.policy(now).idle_time_ms;
        let retry = self.cfg.deletion_retry_interval_ms;
        // The earliest `idle_since + idle_time > now`, i.e. `idle_since >= now + 1 - idle_time`.
        let idle_from = (now + 1).saturating_sub(idle_time);
        if let Some(&(s, _)) = self.index.idle.range((idle_from, 0)..).next() {
            next = next.min(s + idle_time);
        }
        let retry_from = (now + 1).saturating_sub(retry);
        if let Some(&(t, _)) = self.index.delete_requested.range((retry_from, 0)..).next() {
            next = next.min(t + retry);
        }
        if let Some(deadline) = self.next_lease_deadline() {
            next = next.min(deadline);
        }
        let retry = self
            .index
            .in_state(InstState::Running)
            .filter_map(|k| self.insts.get(&k))
            .filter(|i| !i.readiness_in_flight && i.next_check > now)
            .map(|i| i.next_check)
            .min();
        if let Some(retry) = retry {
            next = next.min(retry);
        }
        if let Some(every) = self.ping_every {
            let due = self
                .index
                .in_state(InstState::Ready)
                .filter_map(|k| self.insts.get(&k))
                .filter(|i| i.used == 0 && !i.readiness_in_flight)
                .map(|i| i.last_ping + every)
                .min();
            if let Some(due) = due {
                next = next.min(due);
            }
        }
        if self.cfg.throttle_limit > 0.0 && self.tokens < 1.0 {
            let wait = ((1.0 - self.tokens) / self.cfg.throttle_limit * 1000.0).ceil() as Millis;
            next = next.min(now + wait.max(1));
        }
        // Policies change on minute boundaries.
        next.min((now / 60_000 + 1) * 60_000).max(now + 1)
    }

    /// Decides what to do now. Marks the work in flight, so calling it again is safe.
    pub fn plan(&mut self, now: Millis) -> Vec<Action> {
        let mut actions = Vec::new();
        if matches!(self.health, PoolHealth::Stopped(_)) {
            return actions;
        }
        // Phantoms are dropped by updates (`on_update`); this bounds them when none succeeds.
        self.pending
            .retain(|(t, _)| now.saturating_sub(*t) < PENDING_EXPIRY_MS);
        if self.next_lease_deadline().is_some_and(|d| now >= d) {
            self.expire_leases(now);
        }
        self.plan_update(now, &mut actions);
        if self.phase != Phase::Running {
            // Adopt before deciding: the first update says what already exists. While shutting
            // down, only observe: the driver decides about deleting instances.
            return actions;
        }
        self.plan_probes(now, &mut actions);
        let desired = self.desired(now);
        let live = self.live();
        self.plan_increase(now, desired, live, &mut actions);
        let mut remove = self.doomed(now);
        // Only real instances make a surplus: a real instance is never deleted to make room
        // for one that was requested but may never come.
        let real = live.saturating_sub(self.pending.len() as u32);
        if desired < real {
            remove.extend(self.scale_down_candidates(now, (real - desired) as usize));
        }
        if !self.decrease_backoff.ready(now) {
            // Deletions wait while decrease is refused; they are asked for again after.
            remove.clear();
        }
        let ids = self.request_deletion(now, remove);
        if !ids.is_empty() {
            actions.push(Action::Decrease(ids));
        }
        actions
    }

    /// How long after the last update the next is due: `update_interval_when_expecting` while
    /// instances are expected (requested and not yet seen, or seen and not yet running),
    /// `update_interval` otherwise.
    fn update_every(&self) -> Millis {
        let expecting =
            !self.pending.is_empty() || self.index.in_state(InstState::Creating).next().is_some();
        if expecting {
            self.cfg
                .update_interval_ms
                .min(self.cfg.update_interval_when_expecting_ms)
        } else {
            self.cfg.update_interval_ms
        }
    }

    /// The periodic update, or one wanted sooner, unless one is in flight or we back off.
    fn plan_update(&mut self, now: Millis, actions: &mut Vec<Action>) {
        let due = self
            .last_update
            .is_none_or(|t| now >= t + self.update_every());
        if !self.update.in_flight()
            && self.update_backoff.ready(now)
            && (due || self.update.wanted())
        {
            self.update = UpdateCall::InFlight;
            self.updates_planned += 1;
            actions.push(Action::Update);
        }
    }

    /// Readiness checks of running instances and heartbeats of serving ones, one at a time each.
    fn plan_probes(&mut self, now: Millis, actions: &mut Vec<Action>) {
        for key in self.index.in_state(InstState::Running) {
            if let Some(inst) = self.insts.get_mut(&key)
                && !inst.readiness_in_flight
                && now >= inst.next_check
            {
                inst.readiness_in_flight = true;
                actions.push(Action::CheckReady(inst.id.clone()));
            }
        }
        if let Some(every) = self.ping_every {
            for key in self.index.in_state(InstState::Ready) {
                if let Some(inst) = self.insts.get_mut(&key)
                    && inst.used == 0
                    && !inst.readiness_in_flight
                    && now >= inst.last_ping + every
                {
                    inst.readiness_in_flight = true;
                    actions.push(Action::Ping(inst.id.clone()));
                }
            }
        }
        if !self.heartbeats {
            return;
        }
        let heartbeat_every = self.cfg.update_interval_ms;
        let serving = self.index.in_state(InstState::Ready);
        for key in serving.chain(self.index.in_state(InstState::Draining)) {
            if let Some(inst) = self.insts.get_mut(&key)
                && !inst.heartbeat_in_flight
                && now >= inst.last_heartbeat + heartbeat_every
            {
                inst.heartbeat_in_flight = true;
                actions.push(Action::Heartbeat(inst.id.clone()));
            }
        }
    }

    /// Asks for the missing instances, within the maximum and the throttle.
    fn plan_increase(&mut self, now: Millis, desired: u32, live: u32, actions: &mut Vec<Action>) {
        self.refill(now);
        // Every instance the cloud still has counts toward the maximum, including failed and
        // deleting ones, so a replacement never overshoots `max_instances`.
        let headroom = self
            .max_instances()
            .saturating_sub(self.insts.len() as u32 + self.pending.len() as u32);
        if desired <= live
            || headroom == 0
            || self.increase_in_flight
            || self.increase_unsure.is_some()
            || !self.increase_backoff.ready(now)
        {
            return;
        }
        let want = (desired - live).min(headroom);
        let allowed = if self.tokens.is_infinite() {
            want
        } else {
            want.min(self.tokens.floor() as u32)
        };
        if allowed > 0 {
            self.increase_in_flight = true;
            if self.tokens.is_finite() {
                self.tokens -= f64::from(allowed);
            }
            actions.push(Action::Increase(allowed));
        }
    }

    /// Broken, drained-and-empty, and deleting instances whose deletion is (again) due.
    fn doomed(&self, now: Millis) -> Vec<u64> {
        let retry = self.cfg.deletion_retry_interval_ms;
        let states = [InstState::Failed, InstState::Draining, InstState::Deleting];
        let keys = states.into_iter().flat_map(|s| self.index.in_state(s));
        keys.filter(|k| {
            self.insts.get(k).is_some_and(|inst| {
                if inst.delete_requested_at.is_some_and(|t| now < t + retry) {
                    return false;
                }
                match inst.state {
                    InstState::Failed => true,
                    InstState::Draining => inst.used == 0,
                    InstState::Deleting => inst.delete_requested_at.is_some(),
                    _ => false,
                }
            })
        })
        .collect()
    }

    /// Scale down: unused ready instances idle past idle_time, longest idle first, at most
    /// `surplus` of them so the idle target stays covered.
    fn scale_down_candidates(&self, now: Millis, surplus: usize) -> Vec<u64> {
        let idle_time = self.policy(now).idle_time_ms;
        // The index is ordered by (idle_since, key): longest idle first.
        self.index
            .idle
            .iter()
            .take_while(|(s, _)| now >= s + idle_time)
            .filter(|(_, k)| {
                self.insts
                    .get(k)
                    .is_some_and(|i| i.state == InstState::Ready && i.used == 0)
            })
            .map(|&(_, k)| k)
            .take(surplus)
            .collect()
    }

    /// Marks instances as being deleted (a failed one keeps its state) and returns their ids.
    fn request_deletion(&mut self, now: Millis, keys: Vec<u64>) -> Vec<String> {
        let mut ids = Vec::new();
        for key in keys {
            let scaled_down = self
                .insts
                .get(&key)
                .is_some_and(|i| i.state == InstState::Ready);
            self.with_inst(key, |inst| {
                if inst.state != InstState::Failed {
                    inst.state = InstState::Deleting;
                }
                inst.delete_requested_at = Some(now);
                ids.push(inst.id.clone());
            });
            if scaled_down {
                self.counters.scale_down += 1;
            }
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Action, PoolCore};
    use crate::ScalerConfig;
    use flotilla_provider::{CallError, ProviderError};

    fn core() -> PoolCore {
        let cfg = ScalerConfig {
            update_interval_ms: 30_000,
            ..ScalerConfig::default()
        };
        PoolCore::new(cfg, Vec::new(), 0)
    }

    fn throttled() -> CallError {
        CallError::Provider {
            function: flotilla_provider::Function::Update,
            error: ProviderError::Throttled {
                retry_after: std::time::Duration::from_secs(60),
                message: "slow".into(),
            },
        }
    }

    #[test]
    fn an_update_in_flight_does_not_make_the_pool_poll_every_millisecond() {
        let mut c = core();
        assert_eq!(c.plan(0), [Action::Update]);
        // The update is overdue at 40 s but in flight: its answer wakes the pool, not a timer.
        assert_eq!(c.next_wakeup(40_000), 60_000, "the next minute boundary");
    }

    #[test]
    fn an_overdue_update_during_backoff_waits_for_the_end_of_the_backoff() {
        let mut c = core();
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(1_000, Err(throttled()));
        assert_eq!(c.update_backoff.until, 61_000, "retry-after is honoured");
        // Due at 31 s, but no update may be sent before 61 s.
        assert_eq!(c.next_wakeup(40_000), 60_000, "the next minute boundary");
        assert_eq!(c.next_wakeup(60_500), 61_000, "the end of the backoff");
    }

    #[test]
    fn a_throttled_update_holds_scale_up_and_scale_down_too() {
        let mut c = core();
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(1_000, Err(throttled()));
        for (kind, b) in [
            ("increase", &c.increase_backoff),
            ("decrease", &c.decrease_backoff),
        ] {
            assert!(!b.ready(60_999), "{kind} waits out retry-after");
            assert!(b.ready(61_000), "{kind} may go after it");
        }
    }

    /// taskscaler's `update_interval_when_expecting`: a machine asked for is looked for every
    /// 2 s until the cloud reports it, then the pool falls back to `update_interval`.
    #[test]
    fn while_instances_are_expected_update_polls_every_two_seconds() {
        let mut c = core();
        assert_eq!(c.plan(0), [Action::Update]);
        c.on_update(100, Ok(flotilla_provider::Listing::default()));
        assert_eq!(
            c.next_wakeup(200),
            30_100,
            "nothing expected: update_interval"
        );
        c.on_increase(1_000, 1, Ok(1));
        let _ = c.plan(1_000); // the update the increase wants
        c.on_update(1_500, Ok(flotilla_provider::Listing::default()));
        assert_eq!(c.next_wakeup(1_600), 3_500, "expected: every 2 s");
        assert_eq!(c.plan(3_500), [Action::Update]);
        c.on_update(3_600, Ok(flotilla_provider::Listing::default()));
        assert_eq!(c.next_wakeup(3_700), 5_600);
    }

    #[test]
    fn a_stopped_pool_wakes_only_on_minute_boundaries() {
        let mut c = core();
        c.stop("bad credentials".into());
        assert_eq!(c.next_wakeup(90_000), 120_000);
    }
}

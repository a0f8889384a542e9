//! The scaler on virtual time: property tests under random traces, delays and failures, and
//! scenario tests (convergence, idle expiry, partial success, throttling, DST, leases).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use flotilla_provider::{CallError, Function, Instance, InstanceState, ProviderError};
use flotilla_scaler::sim::{Job, SimCloud, SimOptions, SimPool, simulate, simulate_with_fallback};
use flotilla_scaler::{
    Action, InstState, LeaseError, LeaseState, Policy, PoolCore, PoolHealth, ScalerConfig,
};
use proptest::prelude::*;

const MIN: u64 = 60_000;

fn policy(idle_count: u32, idle_time_ms: u64) -> Policy {
    Policy::new(
        vec!["* * * * *".into()],
        "UTC",
        idle_count,
        idle_time_ms,
        0.0,
        0,
        false,
    )
    .unwrap_or_else(|e| panic!("{e:?}"))
}

fn cfg(capacity: u32, max_instances: u32, max_use: u32) -> ScalerConfig {
    ScalerConfig {
        capacity_per_instance: capacity,
        max_use_count: max_use,
        max_instances,
        update_interval_ms: 30_000,
        instance_acquire_timeout_ms: 10 * MIN,
        ..ScalerConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_random_traces(
        capacity in 1u32..5,
        max_instances in 1u32..8,
        max_use in prop_oneof![Just(0u32), 1u32..6],
        idle_count in 0u32..6,
        idle_time_s in 0u64..600,
        delay in (0u64..120_000, 0u64..120_000),
        failure_rate in prop_oneof![Just(0.0f64), 0.0f64..0.4],
        crash_rate in prop_oneof![Just(0.0f64), 0.0f64..0.3],
        cloud_max in prop_oneof![Just(0u32), 0u32..3],
        seed in any::<u64>(),
        jobs in prop::collection::vec((0u64..3_600_000, 1_000u64..1_800_000), 0..120),
    ) {
        let idle_count = idle_count.min(capacity * max_instances);
        let cfg = cfg(capacity, max_instances, max_use);
        let cloud = SimCloud {
            provisioning_delay_ms: (delay.0.min(delay.1), delay.0.max(delay.1)),
            failure_rate,
            instance_failure_rate: crash_rate,
            max_size: cloud_max,
            seed,
            ..SimCloud::default()
        };
        let jobs: Vec<Job> = jobs.into_iter().map(|(at, d)| Job { submit_at: at, duration: d, tag: None }).collect();
        let opts = SimOptions { check_invariants: true, ..SimOptions::default() };
        let (report, _) = simulate(&cfg, &[policy(idle_count, idle_time_s * 1000)], &cloud, &jobs, &opts);
        prop_assert!(report.invariant_violations.is_empty(), "{:?}", &report.invariant_violations[..report.invariant_violations.len().min(3)]);
        prop_assert!(report.peak_instances <= max_instances, "peak {} > max {max_instances}", report.peak_instances);
        // No lease is lost: every job ran, gave up waiting, or failed with its instance.
        prop_assert_eq!(report.completed + report.timed_out + report.failed, report.jobs);
        // Every kind of non-progress backs off: a cloud that grants nothing, refuses or
        // throttles never makes the pool hammer it.
        prop_assert!(report.max_calls_per_minute <= 120, "{} provider calls in one minute", report.max_calls_per_minute);
    }
}

/// Drives a core by hand against a tiny in-memory cloud.
struct Harness {
    core: PoolCore,
    now: u64,
    cloud: Vec<(String, InstanceState)>,
    next: u32,
    granted_cap: Option<u32>,
    /// The plugin reports increases as granted, but the cloud creates nothing (a lowered
    /// MaxSize or desired count): phantoms.
    phantoms: bool,
    heartbeat_error: Option<CallError>,
    calls: Vec<Action>,
}

impl Harness {
    fn new(cfg: ScalerConfig, policies: Vec<Policy>) -> Harness {
        Harness {
            core: PoolCore::new(cfg, policies, 0),
            now: 0,
            cloud: Vec::new(),
            next: 0,
            granted_cap: None,
            phantoms: false,
            heartbeat_error: None,
            calls: Vec::new(),
        }
    }

    /// Runs plan/execute rounds at the current time until quiet; new instances run at once.
    fn step(&mut self) {
        for _ in 0..20 {
            let actions = self.core.plan(self.now);
            if actions.is_empty() {
                break;
            }
            for a in actions {
                self.calls.push(a.clone());
                match a {
                    Action::Update => {
                        let list = self
                            .cloud
                            .iter()
                            .map(|(id, s)| Instance {
                                id: id.clone(),
                                state: s.clone(),
                            })
                            .collect::<Vec<_>>();
                        self.core.on_update(self.now, Ok(list.into()));
                    }
                    Action::Increase(n) => {
                        let granted = self.granted_cap.map_or(n, |c| c.min(n));
                        let created = if self.phantoms { 0 } else { granted };
                        for _ in 0..created {
                            self.next += 1;
                            self.cloud
                                .push((format!("i-{}", self.next), InstanceState::Running));
                        }
                        self.core.on_increase(self.now, n, Ok(granted));
                    }
                    Action::Decrease(ids) => {
                        self.cloud.retain(|(id, _)| !ids.contains(id));
                        self.core.on_decrease(self.now, &ids, Ok(ids.clone()));
                    }
                    Action::CheckReady(id) => self.core.on_ready(self.now, &id, Ok(())),
                    Action::Ping(id) => self.core.on_ping(self.now, &id, Ok(())),
                    Action::Heartbeat(id) => {
                        let r = match self.heartbeat_error.clone() {
                            Some(e) => Err(e),
                            None => Ok(()),
                        };
                        self.core.on_heartbeat(self.now, &id, r);
                    }
                }
            }
            assert_eq!(self.core.check_invariants(), Ok(()));
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        self.step();
    }

    fn ready(&self) -> u32 {
        self.core.snapshot(self.now).instances["ready"]
    }
}

#[test]
fn idle_capacity_converges_within_the_update_interval() {
    let mut h = Harness::new(cfg(2, 10, 0), vec![policy(5, 10 * MIN)]);
    h.step();
    h.advance(30_000);
    let snap = h.core.snapshot(h.now);
    assert_eq!(snap.desired, 3, "5 idle slots at 2 per instance");
    assert_eq!(h.ready(), 3);
    assert!(snap.slots.idle >= 5, "{snap:?}");
}

#[test]
fn demand_triggers_increase_at_once() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(0, MIN)]);
    h.step();
    h.calls.clear();
    let lease = h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}"));
    let actions = h.core.plan(h.now);
    assert_eq!(
        actions,
        [Action::Increase(1)],
        "a reservation asks for capacity without waiting for a tick"
    );
    h.core.on_increase(h.now, 1, Ok(1));
    h.cloud.push(("i-x".into(), InstanceState::Running));
    h.step();
    let b = h
        .core
        .acquire(h.now, lease)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.map(|b| b.instance).as_deref(), Some("i-x"));
}

#[test]
fn idle_instances_are_removed_after_idle_time_unless_needed() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(1, 5 * MIN)]);
    h.step();
    let leases: Vec<u64> = (0..3)
        .map(|_| h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    h.step();
    for l in &leases {
        assert!(h.core.acquire(h.now, *l).ok().flatten().is_some());
    }
    h.step();
    for l in leases {
        h.core.release(h.now, l).unwrap_or_else(|e| panic!("{e}"));
    }
    h.advance(4 * MIN);
    assert_eq!(h.ready(), 4, "not idle long enough yet");
    h.advance(2 * MIN);
    assert_eq!(h.ready(), 1, "idle_count keeps one");
}

#[test]
fn max_use_count_drains_and_replaces() {
    let mut h = Harness::new(cfg(2, 1, 2), vec![policy(1, MIN)]);
    h.step();
    let a = h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}"));
    let b = h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}"));
    h.step();
    assert!(h.core.acquire(h.now, a).ok().flatten().is_some());
    assert!(h.core.acquire(h.now, b).ok().flatten().is_some());
    assert_eq!(
        h.core.snapshot(h.now).instances["draining"],
        1,
        "two uses reached"
    );
    h.core.release(h.now, a).unwrap_or_else(|e| panic!("{e}"));
    h.core.release(h.now, b).unwrap_or_else(|e| panic!("{e}"));
    h.step();
    h.advance(30_000);
    assert_eq!(h.ready(), 1, "replaced by a fresh instance");
    assert_eq!(h.cloud.len(), 1);
}

#[test]
fn partial_success_is_accounted() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(6, MIN)]);
    h.granted_cap = Some(2);
    h.step();
    let increases: Vec<u32> = h
        .calls
        .iter()
        .filter_map(|a| {
            if let Action::Increase(n) = a {
                Some(*n)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(increases.first(), Some(&6));
    // It got 2; the next increase asks for the remaining 4 only, never re-requesting the 2.
    h.advance(10_000);
    let increases: Vec<u32> = h
        .calls
        .iter()
        .filter_map(|a| {
            if let Action::Increase(n) = a {
                Some(*n)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(increases.get(1), Some(&4), "{increases:?}");
    assert!(h.cloud.len() <= 6);
}

#[test]
fn throttling_backs_off_for_retry_after() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(2, MIN)]);
    h.step();
    let err = CallError::Provider {
        function: Function::Update,
        error: ProviderError::Throttled {
            retry_after: std::time::Duration::from_secs(120),
            message: "slow".into(),
        },
    };
    h.now += 31_000;
    assert_eq!(h.core.plan(h.now), [Action::Update]);
    h.core.on_update(h.now, Err(err));
    assert!(matches!(h.core.health(), PoolHealth::Degraded(_)));
    for t in [1_000, 60_000, 119_000] {
        assert!(
            !h.core.plan(h.now + t).contains(&Action::Update),
            "no call {t} ms into a 120 s retry-after"
        );
    }
    assert!(h.core.plan(h.now + 121_000).contains(&Action::Update));
}

#[test]
fn unauthorized_pauses_the_call_and_a_fixed_credential_heals_the_pool_without_a_restart() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(2, MIN)]);
    let err = CallError::Provider {
        function: Function::Update,
        error: ProviderError::Unauthorized("DescribeAutoScalingGroups".into()),
    };
    assert_eq!(h.core.plan(0), [Action::Update]);
    h.core.on_update(0, Err(err));
    assert!(matches!(h.core.health(), PoolHealth::Degraded(r) if r.contains("paused")));
    let paused = h.core.paused();
    assert_eq!(paused["update"].retry_at, 60_000, "{paused:?}");
    for t in [1, 30_000, 59_999] {
        assert!(h.core.plan(t).is_empty(), "no call {t} ms into the pause");
    }
    // The operator fixed the policy: the next try succeeds and the pool is ready again.
    assert_eq!(h.core.plan(60_000), [Action::Update]);
    h.core
        .on_update(60_000, Ok(flotilla_provider::Listing::default()));
    assert_eq!(h.core.health(), &PoolHealth::Ready);
    assert!(h.core.paused().is_empty());
}

#[test]
fn a_refused_scale_up_stops_only_scale_up() {
    let config = flotilla_scaler::ScalerConfig {
        paused_retry_interval_ms: 5 * MIN,
        ..cfg(1, 10, 0)
    };
    let mut h = Harness::new(config, vec![policy(2, MIN)]);
    assert_eq!(h.core.plan(0), [Action::Update]);
    h.core
        .on_update(0, Ok(flotilla_provider::Listing::default()));
    let denied = CallError::Provider {
        function: Function::Increase,
        error: ProviderError::Unauthorized("SetDesiredCapacity".into()),
    };
    let t = 1;
    assert!(
        h.core
            .plan(t)
            .iter()
            .any(|a| matches!(a, Action::Increase(_)))
    );
    h.core.on_increase(t, 2, Err(denied));
    // update keeps going on its schedule; increase waits for the retry.
    let actions = h.core.plan(MIN);
    assert!(actions.contains(&Action::Update), "{actions:?}");
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Increase(_))),
        "{actions:?}"
    );
    h.core
        .on_update(MIN, Ok(flotilla_provider::Listing::default()));
    assert!(h.core.paused().contains_key("increase"));
    assert!(
        !h.core
            .plan(5 * MIN)
            .iter()
            .any(|a| matches!(a, Action::Increase(_)))
    );
    assert!(
        h.core
            .plan(5 * MIN + 1)
            .iter()
            .any(|a| matches!(a, Action::Increase(_)))
    );
}

#[test]
fn a_group_that_grants_nothing_is_asked_less_and_less_often() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(2, MIN)]);
    let mut asks = Vec::new();
    let mut t = 0;
    while t < 10 * MIN {
        for action in h.core.plan(t) {
            match action {
                Action::Increase(n) => {
                    asks.push(t);
                    h.core.on_increase(t, n, Ok(0));
                }
                Action::Update => h
                    .core
                    .on_update(t, Ok(flotilla_provider::Listing::default())),
                _ => {}
            }
        }
        t = h.core.next_wakeup(t);
    }
    assert!(asks.len() >= 3, "{asks:?}");
    assert!(
        asks.len() <= 12,
        "asked {} times in 10 minutes: {asks:?}",
        asks.len()
    );
    let gaps: Vec<u64> = asks.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.windows(2).take(4).all(|g| g[1] >= g[0]),
        "the waits grow: {gaps:?}"
    );
}

#[test]
fn adopted_instances_are_kept_and_vanished_ones_fail_their_leases() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(0, 10 * MIN)]);
    h.cloud = vec![
        ("old-1".into(), InstanceState::Running),
        ("old-2".into(), InstanceState::Failed("disk".into())),
    ];
    h.step();
    assert_eq!(h.ready(), 1, "the healthy one is adopted");
    assert!(
        !h.cloud.iter().any(|(id, _)| id == "old-2"),
        "the broken one is deleted"
    );
    let l = h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}"));
    assert!(h.core.acquire(h.now, l).ok().flatten().is_some());
    h.cloud.clear(); // spot reclaim
    h.advance(31_000);
    match h.core.lease(l).map(|l| &l.state) {
        Some(LeaseState::Failed { cause }) => assert!(cause.contains("vanished"), "{cause}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.core
            .acquire(h.now, l)
            .err()
            .map(|e| matches!(e, LeaseError::Failed { .. })),
        Some(true)
    );
    h.core.release(h.now, l).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        h.core.release(h.now, l),
        Err(LeaseError::UnknownLease(l)),
        "double release"
    );
}

#[test]
fn lease_misuse_gets_specific_errors_and_changes_nothing() {
    let mut h = Harness::new(cfg(1, 1, 0), vec![policy(0, MIN)]);
    h.step();
    assert_eq!(h.core.release(h.now, 42), Err(LeaseError::UnknownLease(42)));
    assert_eq!(h.core.unreserve(42), Err(LeaseError::UnknownLease(42)));
    let l = h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.core.reserve(h.now), Err(LeaseError::AtCapacity(1)));
    assert_eq!(h.core.release(h.now, l), Err(LeaseError::NotAcquired(l)));
    h.step();
    assert!(h.core.acquire(h.now, l).ok().flatten().is_some());
    assert_eq!(
        h.core.acquire(h.now, l),
        Err(LeaseError::AlreadyAcquired(l))
    );
    assert_eq!(h.core.unreserve(l), Err(LeaseError::Acquired(l)));
    assert_eq!(h.core.check_invariants(), Ok(()));
}

#[test]
fn schedules_follow_the_timezone_across_dst() {
    // Working hours in Berlin want 4 idle slots; nights want none. On 2026-03-29 the clocks
    // jump from 02:00 to 03:00 local; 08:30 local is 06:30 UTC that day and 07:30 UTC before.
    let night = policy(0, MIN);
    let work = Policy::new(
        vec!["* 8-17 * * *".into()],
        "Europe/Berlin",
        4,
        MIN,
        0.0,
        0,
        false,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let utc = |d: u32, h: u32, m: u32| -> u64 {
        chrono::NaiveDate::from_ymd_opt(2026, 3, d)
            .and_then(|x| x.and_hms_opt(h, m, 0))
            .map(|t| t.and_utc().timestamp_millis() as u64)
            .unwrap_or_default()
    };
    let core = PoolCore::new(cfg(1, 10, 0), vec![night, work], 0);
    assert_eq!(core.desired(utc(28, 7, 30)), 4, "08:30 CET");
    assert_eq!(core.desired(utc(28, 6, 30)), 0, "07:30 CET");
    assert_eq!(
        core.desired(utc(29, 6, 30)),
        4,
        "08:30 CEST, after the change"
    );
    assert_eq!(core.desired(utc(29, 5, 30)), 0, "07:30 CEST");
    assert_eq!(core.desired(utc(29, 15, 59)), 4, "17:59 CEST");
    assert_eq!(core.desired(utc(29, 16, 0)), 0, "18:00 CEST");
}

#[test]
fn instance_states_are_tracked() {
    let mut h = Harness::new(cfg(1, 3, 0), vec![policy(2, MIN)]);
    h.step();
    let snap = h.core.snapshot(h.now);
    assert_eq!(snap.instances[InstState::Ready.name()], 2);
    assert_eq!(snap.instances[InstState::Creating.name()], 0);
}

#[test]
fn preemptive_mode_reserves_only_idle_ready_slots() {
    let p = Policy::new(vec!["* * * * *".into()], "UTC", 1, MIN, 0.0, 0, true)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let mut h = Harness::new(cfg(1, 5, 0), vec![p]);
    assert_eq!(
        h.core.reserve(0),
        Err(LeaseError::NoIdleSlot),
        "nothing ready yet"
    );
    h.step();
    let first = h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        h.core.reserve(h.now),
        Err(LeaseError::NoIdleSlot),
        "the one idle slot is promised"
    );
    h.step();
    assert!(h.core.acquire(h.now, first).ok().flatten().is_some());
    h.step();
    assert!(
        h.core.reserve(h.now).is_ok(),
        "the idle target was restored, so another reservation fits"
    );
}

#[test]
fn scale_throttle_limits_instance_creation() {
    let mut c = cfg(1, 50, 0);
    c.throttle_limit = 1.0; // one instance per second
    c.throttle_burst = 3;
    let mut h = Harness::new(c, vec![policy(20, MIN)]);
    h.step();
    let asked = |h: &Harness| -> u32 {
        h.calls
            .iter()
            .map(|a| if let Action::Increase(n) = a { *n } else { 0 })
            .sum()
    };
    assert_eq!(asked(&h), 3, "the burst");
    h.advance(1_000);
    assert_eq!(asked(&h), 4, "one more token after a second");
    h.advance(10_000);
    assert_eq!(asked(&h), 7, "a quiet spell refills at most the burst");
    for _ in 0..5 {
        h.advance(1_000);
    }
    assert_eq!(asked(&h), 12, "then one per second");
    assert!(h.cloud.len() <= 20);
}

#[test]
fn simulation_compares_capacity_per_instance() {
    // Forty 10-minute jobs arriving together: 1 slot per machine needs 40 machines,
    // 4 slots per machine needs 10.
    let jobs: Vec<Job> = (0..40)
        .map(|i| Job {
            submit_at: i * 100,
            duration: 10 * MIN,
            tag: None,
        })
        .collect();
    let cloud = SimCloud {
        provisioning_delay_ms: (30_000, 30_000),
        ..SimCloud::default()
    };
    let opts = SimOptions {
        check_invariants: true,
        ..SimOptions::default()
    };
    let (one, _) = simulate(&cfg(1, 100, 0), &[policy(0, MIN)], &cloud, &jobs, &opts);
    let (four, _) = simulate(&cfg(4, 100, 0), &[policy(0, MIN)], &cloud, &jobs, &opts);
    assert_eq!((one.completed, four.completed), (40, 40));
    assert_eq!((one.peak_instances, four.peak_instances), (40, 10));
    assert!(
        four.instance_seconds < one.instance_seconds / 3.0,
        "{} vs {}",
        four.instance_seconds,
        one.instance_seconds
    );
    assert!(
        one.wait_p50_s >= 30.0 && one.wait_p50_s < 35.0,
        "waits for provisioning: {}",
        one.wait_p50_s
    );
    assert!(one.invariant_violations.is_empty() && four.invariant_violations.is_empty());
}

/// From running to the first lease, on virtual time: one job on an empty pool, machines that
/// boot in 25 to 89 s, `update_interval` 1 min. While an instance is expected the pool polls
/// every `update_interval_when_expecting` (2 s), so a machine is leased within about 2 s of the
/// cloud reporting it running, whatever its boot time. With that poll as slow as
/// `update_interval` (taskscaler without its key, and Flotilla before it), the machine waits
/// for whatever is left of the minute. The figures are printed (`--nocapture`) and in
/// `docs/scaling-out.md`.
#[test]
fn a_machine_is_leased_within_seconds_of_running() {
    let lag = |boot: u64, expecting: u64| {
        let config = ScalerConfig {
            update_interval_ms: MIN,
            update_interval_when_expecting_ms: expecting,
            ..cfg(1, 10, 0)
        };
        let cloud = SimCloud {
            provisioning_delay_ms: (boot, boot),
            ..SimCloud::default()
        };
        let jobs = [Job {
            submit_at: 5_000,
            duration: MIN,
            tag: None,
        }];
        let opts = SimOptions {
            check_invariants: true,
            ..SimOptions::default()
        };
        let (r, _) = simulate(&config, &[policy(0, MIN)], &cloud, &jobs, &opts);
        assert_eq!(r.completed, 1, "{r:?}");
        assert!(r.invariant_violations.is_empty(), "{r:?}");
        // The wait runs from the job's submit; the increase call takes the cloud's latency,
        // then the machine boots.
        r.wait_max_s - (cloud.api_latency_ms + boot) as f64 / 1000.0
    };
    let boots = [25_000, 40_000, 47_000, 53_000, 71_000, 89_000];
    let fast: Vec<f64> = boots.iter().map(|b| lag(*b, 2_000)).collect();
    let slow: Vec<f64> = boots.iter().map(|b| lag(*b, MIN)).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!("running to first lease, polling every 2 s while expecting: {fast:.1?} s");
    println!("running to first lease, polling only every minute: {slow:.1?} s");
    for (boot, lag) in boots.iter().zip(&fast) {
        assert!(
            *lag <= 2.5,
            "boot {boot} ms: leased {lag:.1} s after running"
        );
    }
    assert!(
        mean(&slow) > 10.0 * mean(&fast),
        "{slow:?} against {fast:?}"
    );
}

/// A spot pool out of capacity for ten minutes of a steady trace, with an on-demand fallback
/// behind it. Without the fallback, the jobs of the stockout give up. With it, every job runs:
/// the fallback serves the stockout's jobs, and once it is over (and `fallback_hold` has
/// passed), the jobs go back to spot.
#[test]
fn a_stockout_window_is_served_by_the_fallback_and_demand_returns_after_it() {
    // A job a minute for an hour, 5 minutes each, and a burst of 10 at minute 22; the
    // stockout is minutes 20 to 30.
    let jobs: Vec<Job> = (0..60)
        .map(|i| i * MIN)
        .chain((0..10).map(|i| 22 * MIN + i * 1_000))
        .map(|submit_at| Job {
            submit_at,
            duration: 5 * MIN,
            tag: None,
        })
        .collect();
    let spot = SimCloud {
        provisioning_delay_ms: (30_000, 60_000),
        stockouts: vec![(20 * MIN, 30 * MIN)],
        ..SimCloud::default()
    };
    let on_demand = SimCloud {
        provisioning_delay_ms: (30_000, 60_000),
        seed: 2,
        ..SimCloud::default()
    };
    let mut knobs = cfg(1, 20, 0);
    knobs.instance_acquire_timeout_ms = 5 * MIN;
    let policies = [policy(0, 2 * MIN)];
    let opts = SimOptions {
        check_invariants: true,
        ..SimOptions::default()
    };
    let (alone, _) = simulate(&knobs, &policies, &spot, &jobs, &opts);
    assert!(
        alone.timed_out >= 3 && alone.wait_p95_s >= 120.0,
        "the stockout cost nothing: {alone:?}"
    );

    let pool = |cloud| SimPool {
        cfg: &knobs,
        policies: &policies,
        cloud,
    };
    let (paired, _) = simulate_with_fallback(pool(&spot), pool(&on_demand), &jobs, &opts);
    assert_eq!(paired.completed, 70, "{paired:?}");
    assert_eq!(paired.timed_out, 0, "{paired:?}");
    assert!(paired.invariant_violations.is_empty(), "{paired:?}");
    // The stockout's ten jobs, and those of the hold after it (5 minutes), at most.
    assert!((5..=16).contains(&paired.served_by_fallback), "{paired:?}");
    assert!(
        paired.handed_over >= paired.served_by_fallback,
        "{paired:?}"
    );
}

#[test]
fn failing_heartbeats_replace_an_instance_after_the_threshold() {
    let mut c = cfg(1, 5, 0);
    c.failure_threshold = 3;
    let mut h = Harness::new(c, vec![policy(1, 10 * MIN)]);
    h.core.set_provider_info(&flotilla_provider::ProviderInfo {
        id: "t".into(),
        version: "0".into(),
        max_size: 0,
        heartbeat: true,
        expiring_connect_info: false,
    });
    h.step();
    let first = h.cloud[0].0.clone();
    let l = h.core.reserve(h.now).unwrap_or_else(|e| panic!("{e}"));
    assert!(h.core.acquire(h.now, l).ok().flatten().is_some());
    h.heartbeat_error = Some(CallError::Provider {
        function: Function::Heartbeat,
        error: ProviderError::Transient("timeout".into()),
    });
    h.advance(30_000);
    h.advance(30_000);
    assert!(
        matches!(
            h.core.lease(l).map(|l| &l.state),
            Some(LeaseState::Acquired { .. })
        ),
        "2 failures < threshold"
    );
    h.advance(30_000);
    match h.core.lease(l).map(|l| &l.state) {
        Some(LeaseState::Failed { cause }) => {
            assert!(cause.contains("heartbeat failed 3 times"), "{cause}")
        }
        other => panic!("{other:?}"),
    }
    h.heartbeat_error = None;
    h.advance(30_000);
    assert!(
        !h.cloud.iter().any(|(id, _)| *id == first),
        "the failed instance was deleted"
    );
    assert!(h.ready() >= 1, "and replaced");
}

#[test]
fn a_phantom_never_costs_a_real_instance_and_is_dropped_after_two_updates() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(2, MIN)]);
    h.step();
    assert_eq!(h.ready(), 2, "two idle instances");
    // Two jobs come; the plugin says it asked for two more, but the cloud creates nothing.
    h.phantoms = true;
    let a = h.core.reserve(h.now).expect("reserve");
    let b = h.core.reserve(h.now).expect("reserve");
    h.step();
    assert_eq!(h.core.snapshot(h.now).pending, 2);
    // The jobs go away before binding: the two real idle instances are what the policy wants,
    // so neither may be deleted to make room for the phantoms.
    h.core.unreserve(a).expect("unreserve");
    h.core.unreserve(b).expect("unreserve");
    for _ in 0..4 {
        h.now += 15_000;
        h.step();
    }
    assert!(
        !h.calls.iter().any(|c| matches!(c, Action::Decrease(_))),
        "{:?}",
        h.calls
    );
    assert_eq!(h.ready(), 2);
    // Two update intervals later the phantoms are dropped.
    assert_eq!(h.core.snapshot(h.now).pending, 0);
}

/// The group's maximum as `update` reports it (contract 0.1.2): a lowered limit drops awaited
/// instances at the next update and stops scale-up calls; a raised one is used at once, even
/// though scale-up had backed off for minutes while the group granted nothing.
#[test]
fn a_reported_group_maximum_is_followed_at_the_next_update() {
    let mut h = Harness::new(cfg(1, 10, 0), vec![policy(2, MIN)]);
    h.step();
    assert_eq!(h.ready(), 2);
    // MaxSize lowered to the two that exist, after the plugin granted two phantoms.
    h.phantoms = true;
    let _a = h.core.reserve(h.now).expect("reserve");
    let _b = h.core.reserve(h.now).expect("reserve");
    h.step();
    assert_eq!(h.core.snapshot(h.now).pending, 2);
    h.core.set_group_max(h.now, Some(2));
    h.now += 30_000;
    h.step(); // one update
    let snap = h.core.snapshot(h.now);
    assert_eq!(
        snap.pending, 0,
        "dropped at the first update, not the third"
    );
    assert_eq!(snap.max_instances, 2);
    // At the group's maximum the pool does not ask at all, however long the jobs wait.
    h.granted_cap = Some(0);
    h.phantoms = false;
    let asked = h.calls.len();
    for _ in 0..40 {
        h.now += 30_000;
        h.step();
    }
    assert!(
        !h.calls[asked..]
            .iter()
            .any(|c| matches!(c, Action::Increase(_))),
        "{:?}",
        &h.calls[asked..]
    );
    // Room for one more that the group will not grant: scale-up backs off for minutes...
    h.core.set_group_max(h.now, Some(3));
    for _ in 0..12 {
        h.now += 30_000;
        h.step();
    }
    let before = h.calls.len();
    h.now += 1;
    h.step();
    assert!(
        !h.calls[before..]
            .iter()
            .any(|c| matches!(c, Action::Increase(_))),
        "backing off: {:?}",
        &h.calls[before..]
    );
    // ...but a raised maximum is tried at once.
    h.granted_cap = None;
    h.core.set_group_max(h.now, Some(6));
    h.now += 1;
    h.step();
    assert!(
        h.calls[before..]
            .iter()
            .any(|c| matches!(c, Action::Increase(_))),
        "{:?}",
        &h.calls[before..]
    );
    assert_eq!(h.ready(), 4, "two busy and two idle");
}

//! The policy search: candidates over idle counts, idle times and scale factors for a
//! business-hours period and the rest of the week; screened in parallel with the screening
//! model (sweeping idle counts upward and stopping where more idle capacity cannot shorten
//! waits); the frontier and the recommendation verified on the real scaler (the simulator);
//! the recommendation and the current policy replayed on held-out days; and the sensitivity
//! (the next-cheaper policy, and +50% load).
//!
//! It owns the search; it must not know about files or how results are printed.

use serde::Serialize;

use flotilla_scaler::sim::{
    Job as SimJob, SimCloud, SimOptions, SimPool, SimReport, simulate, simulate_with_fallback,
};
use flotilla_scaler::{Policy, ScalerConfig};

use crate::history::Job;
use crate::screen::Schedule;

mod refine;
mod screening;
mod verdict;

/// A minute, in milliseconds.
const MIN: u64 = 60_000;

/// What to tune for.
#[derive(Debug, Clone)]
pub struct Goal {
    /// Wait p95 to meet (s).
    pub wait_p95_s: f64,
    /// Price of an instance-hour, to print money beside instance-hours.
    pub cost_per_hour: Option<f64>,
}

/// The pool as configured, and the search's inputs.
#[derive(Debug, Clone)]
pub struct Input {
    /// The pool's scaler settings (capacity, maximum, timeouts).
    pub scaler: ScalerConfig,
    /// The pool's current policies, as `[[pool.policy]]` knobs.
    pub current: Vec<PolicySpec>,
    /// The simulated cloud (provisioning delay, seed).
    pub cloud: SimCloud,
    /// The timezone business hours are read in.
    pub timezone: chrono_tz::Tz,
    /// Held out: the jobs from this time on are kept for evaluation (ms).
    pub holdout_from_ms: i64,
    /// Worker threads.
    pub threads: usize,
    /// Capacities per instance the operator allows (empty: the configured one only).
    pub capacities: Vec<u32>,
    /// The pool's fallback pool (`fallback = "..."`), as configured: every candidate is
    /// simulated with it behind, taking the waiting jobs while the pool cannot grow (during
    /// `cloud.stockouts`, or after instances fail young).
    pub fallback: Option<FallbackPool>,
}

/// A fallback pool as configured: its knobs and policies (tune leaves them as they are).
#[derive(Debug, Clone)]
pub struct FallbackPool {
    /// Its scaler settings.
    pub scaler: ScalerConfig,
    /// Its policies.
    pub policies: Vec<flotilla_scaler::Policy>,
}

/// One `[[pool.policy]]` block.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicySpec {
    /// Cron periods.
    pub periods: Vec<String>,
    /// Timezone name.
    pub timezone: String,
    /// Idle slots.
    pub idle_count: u32,
    /// Idle time (ms).
    pub idle_time_ms: u64,
    /// Scale factor.
    pub scale_factor: f64,
    /// Cap on the scale factor's extra slots (0: none).
    pub scale_factor_limit: u32,
    /// Reserve only when an idle ready slot exists.
    pub preemptive_mode: bool,
}

impl PolicySpec {
    /// The knobs of a configured policy.
    pub fn of(p: &Policy) -> PolicySpec {
        PolicySpec {
            periods: p.periods.clone(),
            timezone: p.timezone.name().to_string(),
            idle_count: p.idle_count,
            idle_time_ms: p.idle_time_ms,
            scale_factor: p.scale_factor,
            scale_factor_limit: p.scale_factor_limit,
            preemptive_mode: p.preemptive_mode,
        }
    }

    fn policy(&self) -> Result<Policy, String> {
        Policy::new(
            self.periods.clone(),
            &self.timezone,
            self.idle_count,
            self.idle_time_ms,
            self.scale_factor,
            self.scale_factor_limit,
            self.preemptive_mode,
        )
        .map_err(|problems| {
            problems
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
}

/// A candidate: its policy blocks and capacity.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    /// The blocks, in order (a later matching block wins).
    pub policies: Vec<PolicySpec>,
    /// Slots per instance.
    pub capacity: u32,
    /// A short label (`day 8/30m, night 1/30m, x0.2`).
    pub label: String,
}

/// Figures from the real scaler.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Verified {
    /// Instance-hours.
    pub instance_hours: f64,
    /// Money, with a price.
    pub cost: Option<f64>,
    /// Wait p50 (s).
    pub wait_p50_s: f64,
    /// Wait p95 (s).
    pub wait_p95_s: f64,
    /// Wait max (s).
    pub wait_max_s: f64,
    /// Jobs that gave up waiting.
    pub timed_out: u64,
    /// Jobs.
    pub jobs: u64,
    /// Peak instances.
    pub peak_instances: u32,
}

impl Verified {
    fn of(r: &SimReport, price: Option<f64>) -> Verified {
        let hours = r.instance_seconds / 3600.0;
        Verified {
            instance_hours: hours,
            cost: price.map(|p| hours * p),
            wait_p50_s: r.wait_p50_s,
            wait_p95_s: r.wait_p95_s,
            wait_max_s: r.wait_max_s,
            timed_out: r.timed_out,
            jobs: r.jobs,
            peak_instances: r.peak_instances,
        }
    }

    /// Whether it meets the goal: no job gives up, and p95 within it. A goal of 0 s is never
    /// met: every real job waits for its reservation and acquisition, which the simulation
    /// counts as no time at all.
    pub fn meets(&self, goal: &Goal) -> bool {
        self.timed_out == 0 && goal.wait_p95_s > 0.0 && self.wait_p95_s <= goal.wait_p95_s
    }
}

/// A point of the frontier.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The candidate.
    pub candidate: Candidate,
    /// Its figures on the fitted part, from the real scaler.
    pub fit: Verified,
}

/// What the search found.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The goal.
    pub goal_wait_p95_s: f64,
    /// Jobs fitted on, and held out.
    pub fit_jobs: usize,
    /// Held-out jobs.
    pub holdout_jobs: usize,
    /// Where the fitted part starts (RFC 3339), as `simulate --start` takes it.
    pub fit_start: String,
    /// Where the held-out part starts (RFC 3339).
    pub holdout_start: String,
    /// The business hours found (local), e.g. `8-17` (`[8, 18)`).
    pub business_hours: Option<(u32, u32)>,
    /// Candidates screened, and skipped as dominated.
    pub screened: usize,
    /// Skipped by pruning.
    pub pruned: usize,
    /// The current policy: fitted and held-out figures.
    pub current: Point,
    /// Current on the held-out part.
    pub current_holdout: Option<Verified>,
    /// The recommendation, when the goal is reachable.
    pub recommended: Option<Point>,
    /// The recommendation on the held-out part.
    pub recommended_holdout: Option<Verified>,
    /// The next-cheaper verified policy (it misses the goal): what saving more would cost.
    pub next_cheaper: Option<Point>,
    /// The recommendation under +50% load.
    pub plus_half_load: Option<Verified>,
    /// The cost/waiting frontier, cheapest first, verified on the real scaler.
    pub frontier: Vec<Point>,
    /// The rest of the screening frontier, not verified: the screening model's estimates.
    pub estimates: Vec<Estimate>,
    /// When the goal is out of reach: the best p95 any verified policy reached without
    /// timeouts, and why.
    pub unreachable: Option<String>,
    /// When the recommendation misses the goal on the held-out part: by how much. The fitted
    /// history then did not represent the held-out days.
    pub holdout_miss: Option<String>,
    /// Which part +50% load was applied to ("held-out" or "fitted").
    pub plus_half_on: &'static str,
    /// Where the time went.
    pub timings: Timings,
}

/// A frontier point only the screening model has figures for (not the real scaler).
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    /// The candidate's label.
    pub label: String,
    /// Estimated instance-hours.
    pub instance_hours: f64,
    /// Estimated wait p50 (s).
    pub wait_p50_s: f64,
    /// Estimated wait p95 (s).
    pub wait_p95_s: f64,
    /// Estimated wait max (s).
    pub wait_max_s: f64,
}

/// Seconds spent per stage.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timings {
    /// Screening every candidate.
    pub screen_s: f64,
    /// The real scaler on the fitted part.
    pub verify_s: f64,
    /// Held-out and +50% load runs.
    pub holdout_s: f64,
}

/// Real-scaler runs on the fitted part are budgeted in jobs simulated: this many, divided by
/// the fitted jobs, is how many frontier points are verified (at least 2, at most 12).
const VERIFY_BUDGET_JOBS: usize = 8_000_000;

/// Why the search could not run.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// Not enough history on one side of the split.
    #[error("{0}")]
    Split(String),
    /// A candidate's policy did not build (a bug, reported rather than hidden).
    #[error("policy: {0}")]
    Policy(String),
}

/// The trace start: midnight UTC of the first job's day.
fn day_start(ms: i64) -> i64 {
    ms.div_euclid(86_400_000) * 86_400_000
}

/// Jobs relative to `start`, as the simulator takes them (ms, whole).
pub fn sim_jobs(jobs: &[Job], start: i64) -> Vec<SimJob> {
    jobs.iter()
        .map(|j| SimJob {
            submit_at: (j.submit_ms - start).max(0) as u64,
            duration: j.duration_ms.max(1),
            tag: None,
        })
        .collect()
}

/// The real scaler on `jobs` (absolute), starting at `start`.
fn verify(
    input: &Input,
    goal: &Goal,
    candidate: &Candidate,
    jobs: &[SimJob],
    start: i64,
) -> Result<Verified, SearchError> {
    let policies = candidate
        .policies
        .iter()
        .map(PolicySpec::policy)
        .collect::<Result<Vec<_>, _>>()
        .map_err(SearchError::Policy)?;
    let scaler = ScalerConfig {
        capacity_per_instance: candidate.capacity,
        ..input.scaler.clone()
    };
    let opts = SimOptions {
        check_invariants: false,
        samples: 0,
        start_at: start as u64,
    };
    let pool = SimPool {
        cfg: &scaler,
        policies: &policies,
        cloud: &input.cloud,
    };
    let (report, _) = match &input.fallback {
        None => simulate(&scaler, &policies, &input.cloud, jobs, &opts),
        Some(fallback) => {
            // The fallback's own cloud has capacity: the stockouts are the pool's.
            let behind = SimCloud {
                stockouts: Vec::new(),
                seed: input.cloud.seed.wrapping_add(1),
                ..input.cloud.clone()
            };
            let fallback = SimPool {
                cfg: &fallback.scaler,
                policies: &fallback.policies,
                cloud: &behind,
            };
            simulate_with_fallback(pool, fallback, jobs, &opts)
        }
    };
    Ok(Verified::of(&report, goal.cost_per_hour))
}

/// Runs `f` over `items` on `threads` threads, keeping the order.
fn parallel<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads.max(1).min(items.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    let slots = parking_lot::Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    if let Some(slot) = slots.lock().get_mut(i) {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    out.into_iter().flatten().collect()
}

/// Pareto frontier by (cost, p95): each point cheaper than the next and with a longer wait.
fn pareto<T: Clone>(mut points: Vec<(f64, f64, T)>) -> Vec<(f64, f64, T)> {
    points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut out: Vec<(f64, f64, T)> = Vec::new();
    for p in points {
        if out.last().is_none_or(|l| p.1 < l.1) {
            out.push(p);
        }
    }
    out
}

/// The jobs with half again as many: every other job repeated 90 s later (same duration).
pub fn plus_half(jobs: &[SimJob]) -> Vec<SimJob> {
    let mut out: Vec<SimJob> = jobs.to_vec();
    out.extend(jobs.iter().step_by(2).map(|j| SimJob {
        submit_at: j.submit_at + 90_000,
        duration: j.duration,
        tag: None,
    }));
    out.sort_by_key(|j| j.submit_at);
    out
}

/// The history as the search uses it: the fitted part and the held-out part, the fitted
/// part's start (midnight UTC of its first day), its weekday business hours, the period of
/// each minute, and the fitted jobs for the screening and for the simulator.
struct Trace<'a> {
    fit: &'a [Job],
    held: &'a [Job],
    start: i64,
    hours: Option<(u32, u32)>,
    tz_name: String,
    sched: Schedule,
    pairs: Vec<(i64, u64)>,
    sim_fit: Vec<SimJob>,
}

impl<'a> Trace<'a> {
    /// Splits `jobs` (ordered by submission) at the held-out boundary.
    fn split(input: &Input, jobs: &'a [Job]) -> Result<Trace<'a>, SearchError> {
        let split = jobs.partition_point(|j| j.submit_ms < input.holdout_from_ms);
        let (fit, held) = jobs.split_at(split);
        let (Some(first), Some(last)) = (fit.first(), fit.last()) else {
            return Err(SearchError::Split(
                "no jobs before the held-out part: hold out less (--holdout)".into(),
            ));
        };
        let start = day_start(first.submit_ms);
        let hours = screening::business_hours(fit, input.timezone);
        let end = jobs.last().map_or(last.submit_ms, |j| j.submit_ms);
        Ok(Trace {
            fit,
            held,
            start,
            hours,
            tz_name: input.timezone.name().to_string(),
            sched: screening::schedule(start, end, hours, input.timezone),
            pairs: fit.iter().map(|j| (j.submit_ms, j.duration_ms)).collect(),
            sim_fit: sim_jobs(fit, start),
        })
    }
}

/// Searches for the cheapest policy that meets the goal: families, screened
/// ([`screening`]); the screening frontier, verified and refined on the real scaler
/// ([`refine`]); the verified frontier and the recommendation, and the replays it was not
/// fitted to ([`verdict`]).
pub fn search(input: &Input, goal: &Goal, jobs: &[Job]) -> Result<Outcome, SearchError> {
    let started = std::time::Instant::now();
    let trace = Trace::split(input, jobs)?;
    let screening = screening::screen(input, goal, &trace);
    // The screening frontier among candidates without timeouts.
    let front = pareto(
        screening
            .all
            .iter()
            .filter(|s| s.figures.timed_out == 0)
            .map(|s| (s.figures.instance_hours, s.figures.wait_p95_s, s.clone()))
            .collect(),
    );
    let current = Candidate {
        policies: input.current.clone(),
        capacity: input.scaler.capacity_per_instance,
        label: "current".into(),
    };
    let screen_s = started.elapsed().as_secs_f64();
    let verify_started = std::time::Instant::now();
    let (points, current_point) = refine::verify_frontier(input, goal, &trace, &front, &current)?;
    let verdict = verdict::Verdict::of(goal, &points, &current_point, &screening.all);
    let verify_s = verify_started.elapsed().as_secs_f64();
    let later_started = std::time::Instant::now();
    let later = verdict::later(input, goal, &trace, &current, verdict.recommended.as_ref())?;
    let timings = Timings {
        screen_s,
        verify_s,
        holdout_s: later_started.elapsed().as_secs_f64(),
    };
    let estimates = verdict::estimates(&front, &verdict.frontier);
    let screened = screening.all.len();
    Ok(outcome(
        goal,
        &trace,
        (screened, screening.pruned),
        current_point,
        verdict,
        later,
        estimates,
        timings,
    ))
}

/// The search's answer, put together.
#[allow(clippy::too_many_arguments)] // the phases' results, each once
fn outcome(
    goal: &Goal,
    trace: &Trace<'_>,
    (screened, pruned): (usize, usize),
    current: Point,
    verdict: verdict::Verdict,
    later: verdict::Later,
    estimates: Vec<Estimate>,
    timings: Timings,
) -> Outcome {
    let rfc = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default()
    };
    Outcome {
        goal_wait_p95_s: goal.wait_p95_s,
        fit_jobs: trace.fit.len(),
        holdout_jobs: trace.held.len(),
        fit_start: rfc(trace.start),
        holdout_start: later.held_start.map(rfc).unwrap_or_default(),
        business_hours: trace.hours,
        screened,
        pruned,
        current,
        current_holdout: later.current_holdout,
        recommended: verdict.recommended,
        recommended_holdout: later.recommended_holdout,
        next_cheaper: verdict.next_cheaper,
        plus_half_load: later.plus_half_load,
        frontier: verdict.frontier,
        estimates,
        unreachable: verdict.unreachable,
        holdout_miss: later.holdout_miss,
        plus_half_on: if later.held_start.is_some() {
            "held-out"
        } else {
            "fitted"
        },
        timings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MONDAY: i64 = 1_793_577_600_000; // 2026-11-02T00:00:00Z
    const HOUR: i64 = 3_600_000;

    /// Three weeks; on weekdays, five 10-minute jobs arrive together at 09:10, 11:10, 13:10 and
    /// 15:10 UTC; nothing else.
    fn bursts() -> Vec<Job> {
        let mut jobs = Vec::new();
        for day in 0..21i64 {
            if day % 7 >= 5 {
                continue;
            }
            for hour in [9i64, 11, 13, 15] {
                let at = MONDAY + day * 24 * HOUR + hour * HOUR + 10 * 60_000;
                jobs.extend((0..5).map(|_| Job {
                    submit_ms: at,
                    duration_ms: 600_000,
                    waited_ms: None,
                }));
            }
        }
        jobs
    }

    fn input() -> Input {
        Input {
            scaler: ScalerConfig {
                capacity_per_instance: 1,
                max_instances: 50,
                instance_acquire_timeout_ms: 30 * MIN,
                update_interval_ms: 10_000,
                ..ScalerConfig::default()
            },
            current: vec![PolicySpec {
                periods: vec!["* * * * *".into()],
                timezone: "UTC".into(),
                idle_count: 10,
                idle_time_ms: 30 * MIN,
                scale_factor: 0.0,
                scale_factor_limit: 0,
                preemptive_mode: false,
            }],
            cloud: SimCloud {
                provisioning_delay_ms: (60_000, 60_000),
                ..SimCloud::default()
            },
            timezone: chrono_tz::UTC,
            holdout_from_ms: MONDAY + 14 * 24 * HOUR,
            threads: 2,
            capacities: Vec::new(),
            fallback: None,
        }
    }

    /// By hand: a burst of five finds only the idle slots kept for it, and no slot frees
    /// before a new instance is up (the jobs run 10 minutes); each slot short of five leaves a
    /// job (20% of jobs per missing slot) waiting a whole provisioning delay (60 s and up to one
    /// 10 s update), past a 30 s p95. So weekdays 9-16 need exactly 5 idle slots, and nothing
    /// is worth keeping otherwise. A burst also starts 5 more instances (5 in use plus 5 idle
    /// wanted), which no idle time bridges to the next burst two hours later, so the shortest
    /// idle time costs least; a scale factor adds nothing (5 idle slots already cover 5).
    #[test]
    fn the_hand_computed_optimum_is_found() {
        let goal = Goal {
            wait_p95_s: 30.0,
            cost_per_hour: None,
        };
        let outcome = search(&input(), &goal, &bursts()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outcome.business_hours, Some((9, 16)));
        let r = outcome
            .recommended
            .as_ref()
            .unwrap_or_else(|| panic!("no recommendation: {outcome:?}"));
        let knobs: Vec<(Vec<String>, u32, u64, f64)> = r
            .candidate
            .policies
            .iter()
            .map(|p| {
                (
                    p.periods.clone(),
                    p.idle_count,
                    p.idle_time_ms,
                    p.scale_factor,
                )
            })
            .collect();
        assert_eq!(
            knobs,
            vec![
                (vec!["* * * * *".to_string()], 0, 10 * MIN, 0.0),
                (vec!["* 9-15 * * MON-FRI".to_string()], 5, 10 * MIN, 0.0),
            ],
            "{:#?}",
            outcome.recommended
        );
        assert!(
            r.fit.wait_p95_s <= 30.0 && r.fit.timed_out == 0,
            "{:?}",
            r.fit
        );
        // The next cheaper policy (4 idle slots) misses the goal by a provisioning delay.
        let next = outcome.next_cheaper.as_ref().map(|p| p.fit.wait_p95_s);
        assert!(next.is_some_and(|p95| p95 >= 60.0), "{next:?}");
        // The current flat policy of 10 idle slots costs more for the same waits.
        assert!(outcome.current.fit.instance_hours > r.fit.instance_hours * 2.0);
        // Held out: the third week, reported on its own.
        assert_eq!(outcome.fit_jobs, 200);
        assert_eq!(outcome.holdout_jobs, 100);
        let held = outcome
            .recommended_holdout
            .unwrap_or_else(|| panic!("no held-out figures"));
        assert_eq!(held.jobs, 100);
        assert!(held.wait_p95_s <= 30.0, "{held:?}");
    }

    /// A pool whose cloud is out of capacity for the whole first week: alone, the bursts beyond
    /// its idle slots wait until they give up; with its fallback behind it, as tune simulates a
    /// pool that names one, they run there.
    #[test]
    fn a_candidate_is_judged_with_the_pools_fallback_behind_it() {
        let goal = Goal {
            wait_p95_s: 30.0,
            cost_per_hour: None,
        };
        let candidate = Candidate {
            policies: input().current,
            capacity: 1,
            label: "current".into(),
        };
        let week: Vec<Job> = bursts()
            .into_iter()
            .filter(|j| j.submit_ms < MONDAY + 7 * 24 * HOUR)
            .collect();
        let jobs = sim_jobs(&week, MONDAY);
        let mut out_of_capacity = input();
        out_of_capacity.cloud.stockouts = vec![(0, 8 * 24 * HOUR as u64)];
        let alone = verify(&out_of_capacity, &goal, &candidate, &jobs, MONDAY)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut paired = out_of_capacity.clone();
        paired.fallback = Some(FallbackPool {
            scaler: paired.scaler.clone(),
            policies: Vec::new(),
        });
        let behind =
            verify(&paired, &goal, &candidate, &jobs, MONDAY).unwrap_or_else(|e| panic!("{e}"));
        assert!(alone.timed_out > 0, "{alone:?}");
        assert_eq!(behind.timed_out, 0, "{behind:?}");
        assert_eq!(behind.jobs, 100);
    }

    #[test]
    fn a_goal_of_zero_is_out_of_reach_and_the_closest_one_is_named() {
        let goal = Goal {
            wait_p95_s: 0.0,
            cost_per_hour: None,
        };
        let outcome = search(&input(), &goal, &bursts()).unwrap_or_else(|e| panic!("{e}"));
        assert!(outcome.recommended.is_none());
        let why = outcome.unreachable.unwrap_or_default();
        assert!(
            why.contains("closest achievable goal is --wait-p95 1s"),
            "{why}"
        );
    }
}

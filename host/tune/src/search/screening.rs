//! The first phases of the search: the candidate families (off-hours idle count, idle time,
//! scale factor, capacity), each swept upward in its business-hours idle count with the
//! screening model, stopping where more idle capacity cannot shorten waits.

use chrono::{Datelike, TimeZone, Timelike};

use super::{Candidate, Goal, Input, MIN, PolicySpec, Trace, parallel};
use crate::history::Job;
use crate::screen::{self, Figures, Knobs, Schedule};

/// Every screened candidate, and how many the sweeps skipped as dominated.
pub(super) struct Screening {
    pub(super) all: Vec<Screened>,
    pub(super) pruned: usize,
}

/// Screens every family of candidates, in parallel.
pub(super) fn screen(input: &Input, goal: &Goal, trace: &Trace<'_>) -> Screening {
    let families = families(input);
    let peak = peak_concurrency(trace.fit);
    let day_counts = counts(
        peak.min(input.scaler.max_instances.saturating_mul(64))
            .max(1),
    );
    let swept = parallel(&families, input.threads, |family| {
        sweep(input, goal, trace, &day_counts, family)
    });
    let pruned = swept.iter().map(|(_, p)| p).sum();
    Screening {
        all: swept.into_iter().flat_map(|(s, _)| s).collect(),
        pruned,
    }
}

/// The families: off-hours idle count, idle time, scale factor, and capacity.
fn families(input: &Input) -> Vec<Family> {
    let capacities = if input.capacities.is_empty() {
        vec![input.scaler.capacity_per_instance]
    } else {
        input.capacities.clone()
    };
    let mut families = Vec::new();
    for &capacity in &capacities {
        let max_slots = input.scaler.max_instances.saturating_mul(capacity);
        let night_counts: Vec<u32> = [0u32, 1, 2, 4]
            .into_iter()
            .filter(|&n| n <= max_slots)
            .collect();
        for &idle_time_ms in &[10 * MIN, 30 * MIN, 60 * MIN] {
            for &scale_factor in &[0.0, 0.2] {
                for &n in &night_counts {
                    families.push(Family {
                        night: Knobs {
                            idle_count: n,
                            idle_time_ms,
                            scale_factor,
                        },
                        capacity,
                    });
                }
            }
        }
    }
    families
}

/// One family swept upward in its business-hours idle count: its screened candidates, and how
/// many larger counts were skipped.
fn sweep(
    input: &Input,
    goal: &Goal,
    trace: &Trace<'_>,
    day_counts: &[u32],
    family: &Family,
) -> (Vec<Screened>, usize) {
    let pool = screen::Pool {
        capacity: family.capacity,
        max_instances: input.scaler.max_instances,
        acquire_timeout_ms: input.scaler.instance_acquire_timeout_ms,
        update_interval_ms: input.scaler.update_interval_ms,
        delay_ms: input.cloud.provisioning_delay_ms,
    };
    let max_slots = input.scaler.max_instances.saturating_mul(family.capacity);
    let mut out = Vec::new();
    let mut zero_run = 0;
    let usable: Vec<u32> = day_counts
        .iter()
        .copied()
        .filter(|&d| d <= max_slots && (trace.hours.is_some() || d == family.night.idle_count))
        .collect();
    let mut skipped = 0;
    for (i, &d) in usable.iter().enumerate() {
        let day = Knobs {
            idle_count: d,
            ..family.night
        };
        let figures = screen::run(&pool, &trace.sched, &[family.night, day], &trace.pairs);
        // Far enough below the goal (a quarter of it, or no wait at all), more idle
        // capacity can only cost more: it cannot be the recommendation.
        let at_floor = figures.timed_out == 0
            && (figures.wait_p95_s == 0.0 || figures.wait_p95_s <= goal.wait_p95_s * 0.25);
        out.push(Screened {
            candidate: candidate(
                trace.hours,
                &trace.tz_name,
                family.night,
                day,
                family.capacity,
            ),
            figures,
        });
        // Pruning: once there, every larger count is dominated for the goal.
        zero_run = if at_floor { zero_run + 1 } else { 0 };
        if zero_run >= 2 {
            skipped = usable.len() - i - 1;
            break;
        }
    }
    (out, skipped)
}

/// Weekday business hours from the history: the local hours whose mean weekday arrivals are at
/// least a quarter of the busiest hour's, as one span `[from, to)`.
pub(super) fn business_hours(jobs: &[Job], tz: chrono_tz::Tz) -> Option<(u32, u32)> {
    let mut per_hour = [0u64; 24];
    for j in jobs {
        let Some(t) = tz.timestamp_millis_opt(j.submit_ms).single() else {
            continue;
        };
        if t.weekday().num_days_from_monday() < 5
            && let Some(n) = per_hour.get_mut(t.hour() as usize)
        {
            *n += 1;
        }
    }
    let peak = per_hour.iter().copied().max()?;
    if peak == 0 {
        return None;
    }
    let busy: Vec<u32> = (0..24u32)
        .filter(|&h| per_hour.get(h as usize).is_some_and(|&n| n * 4 >= peak))
        .collect();
    let (from, to) = (*busy.first()?, *busy.last()? + 1);
    // A fleet busy around the clock has no business hours to tell apart.
    (to - from < 20).then_some((from, to))
}

/// The period of each minute from `start` to `end`: 1 in business hours, 0 otherwise.
pub(super) fn schedule(
    start: i64,
    end: i64,
    hours: Option<(u32, u32)>,
    tz: chrono_tz::Tz,
) -> Schedule {
    let n = ((end - start).div_euclid(60_000) + 2).max(1) as usize;
    let minutes = (0..n)
        .map(|m| {
            let t = start + m as i64 * 60_000;
            match (hours, tz.timestamp_millis_opt(t).single()) {
                (Some((from, to)), Some(local)) => {
                    let weekday = local.weekday().num_days_from_monday() < 5;
                    u8::from(weekday && (from..to).contains(&local.hour()))
                }
                _ => 0,
            }
        })
        .collect();
    Schedule {
        start_ms: start,
        minutes,
    }
}

/// Idle counts to try: 0, 1, 2, 3, 4, then about +40% per step, up to `max`.
fn counts(max: u32) -> Vec<u32> {
    let mut out = vec![0u32];
    let mut v = 1u32;
    while v <= max {
        out.push(v);
        v = if v < 4 { v + 1 } else { (v * 7).div_ceil(5) };
    }
    if out.last().is_some_and(|&l| l < max) {
        out.push(max);
    }
    out
}

/// Most jobs running at once if every job started on arrival.
fn peak_concurrency(jobs: &[Job]) -> u32 {
    let mut ends: std::collections::BinaryHeap<std::cmp::Reverse<i64>> =
        std::collections::BinaryHeap::new();
    let mut peak = 0usize;
    for j in jobs {
        while ends.peek().is_some_and(|e| e.0 <= j.submit_ms) {
            ends.pop();
        }
        ends.push(std::cmp::Reverse(j.submit_ms + j.duration_ms as i64));
        peak = peak.max(ends.len());
    }
    peak as u32
}

fn fmt_minutes(ms: u64) -> String {
    if ms.is_multiple_of(60 * MIN) {
        format!("{}h", ms / (60 * MIN))
    } else {
        format!("{}m", ms / MIN)
    }
}

/// Builds a candidate from its knobs.
fn candidate(
    hours: Option<(u32, u32)>,
    tz: &str,
    night: Knobs,
    day: Knobs,
    capacity: u32,
) -> Candidate {
    let spec = |periods: Vec<String>, k: Knobs| PolicySpec {
        periods,
        timezone: tz.to_string(),
        idle_count: k.idle_count,
        idle_time_ms: k.idle_time_ms,
        scale_factor: k.scale_factor,
        scale_factor_limit: 0,
        preemptive_mode: false,
    };
    let mut policies = vec![spec(vec!["* * * * *".into()], night)];
    let mut label = format!(
        "idle {}/{}",
        night.idle_count,
        fmt_minutes(night.idle_time_ms)
    );
    // The same knobs in and out of business hours are one policy.
    let hours = hours.filter(|_| day != night);
    if let Some((from, to)) = hours {
        policies.push(spec(vec![format!("* {from}-{} * * MON-FRI", to - 1)], day));
        label = format!(
            "weekdays {from}-{to}h: {}/{}; else {}/{}",
            day.idle_count,
            fmt_minutes(day.idle_time_ms),
            night.idle_count,
            fmt_minutes(night.idle_time_ms)
        );
    }
    if night.scale_factor > 0.0 {
        label.push_str(&format!(", +{:.0}%", night.scale_factor * 100.0));
    }
    if capacity > 1 {
        label.push_str(&format!(", {capacity}/instance"));
    }
    Candidate {
        policies,
        capacity,
        label,
    }
}

/// One screened candidate.
#[derive(Debug, Clone)]
pub(super) struct Screened {
    pub(super) candidate: Candidate,
    pub(super) figures: Figures,
}

/// A family of candidates sharing all knobs but the business-hours idle count, swept upward.
#[derive(Debug, Clone, Copy)]
struct Family {
    /// Off-hours knobs; the business period shares their idle time and scale factor.
    night: Knobs,
    capacity: u32,
}

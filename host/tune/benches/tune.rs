//! `tune`'s cost, against the real scaler's as the baseline, on the synthetic month of
//! `synth` (weekday cycle, merge hours, long-tailed durations):
//!
//! - `simulate`: one real-scaler run over the fitted part (the baseline);
//! - `screen`: one candidate through the screening model over the same jobs;
//! - `search`: the whole search (every candidate screened, the frontier verified, held-out and
//!   +50% load runs) on 2 threads.
//!
//! The ratios search/simulate and screen/simulate are the figures: how many real runs a whole
//! search costs, and how much cheaper a screened candidate is than a real one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // bench code: a failed assumption is a failed run

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_scaler::ScalerConfig;
use flotilla_scaler::sim::{SimCloud, SimOptions, simulate};
use flotilla_tune::screen::{self, Knobs, Schedule};
use flotilla_tune::search::{Goal, Input, PolicySpec, search, sim_jobs};
use flotilla_tune::synth::{Model, generate};

fn bench(c: &mut Criterion) {
    let model = Model {
        days: 28,
        jobs_per_weekday: 10_000.0,
        ..Model::default()
    };
    let jobs = generate(&model);
    let scaler = ScalerConfig {
        capacity_per_instance: 1,
        max_instances: 2_000,
        instance_acquire_timeout_ms: 30 * 60_000,
        update_interval_ms: 30_000,
        ..ScalerConfig::default()
    };
    let current = PolicySpec {
        periods: vec!["* * * * *".into()],
        timezone: "UTC".into(),
        idle_count: 20,
        idle_time_ms: 30 * 60_000,
        scale_factor: 0.0,
        scale_factor_limit: 0,
        preemptive_mode: false,
    };
    let input = Input {
        scaler: scaler.clone(),
        current: vec![current],
        cloud: SimCloud::default(),
        timezone: chrono_tz::UTC,
        holdout_from_ms: model.start_ms + 21 * 86_400_000,
        threads: 2,
        capacities: Vec::new(),
        fallback: None,
    };
    let goal = Goal {
        wait_p95_s: 60.0,
        cost_per_hour: None,
    };
    let fit: Vec<_> = jobs
        .iter()
        .copied()
        .filter(|j| j.submit_ms < input.holdout_from_ms)
        .collect();
    let start = model.start_ms;
    let sim_fit = sim_jobs(&fit, start);
    let policy = flotilla_scaler::Policy::new(
        vec!["* * * * *".into()],
        "UTC",
        20,
        30 * 60_000,
        0.0,
        0,
        false,
    )
    .unwrap();
    let opts = SimOptions {
        start_at: start as u64,
        ..SimOptions::default()
    };
    let pairs: Vec<(i64, u64)> = fit.iter().map(|j| (j.submit_ms, j.duration_ms)).collect();
    let pool = screen::Pool {
        capacity: 1,
        max_instances: 2_000,
        acquire_timeout_ms: 30 * 60_000,
        update_interval_ms: 30_000,
        delay_ms: (30_000, 90_000),
    };
    let schedule = Schedule {
        start_ms: start,
        minutes: vec![0; 40 * 1440],
    };
    let knobs = [Knobs {
        idle_count: 20,
        idle_time_ms: 30 * 60_000,
        scale_factor: 0.0,
    }];
    let mut g = c.benchmark_group(format!("tune/{}_jobs", jobs.len()));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    // Interleaved rounds, so a noisy machine affects all three alike.
    for round in 0..2 {
        g.bench_function(format!("simulate_r{round}"), |b| {
            b.iter(|| {
                simulate(
                    &scaler,
                    std::slice::from_ref(&policy),
                    &SimCloud::default(),
                    &sim_fit,
                    &opts,
                )
            })
        });
        g.bench_function(format!("screen_r{round}"), |b| {
            b.iter(|| screen::run(&pool, &schedule, &knobs, &pairs))
        });
        g.bench_function(format!("search_r{round}"), |b| {
            b.iter(|| search(&input, &goal, &jobs).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

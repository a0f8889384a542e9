//! Times `sim::simulate` on a large synthetic trace: by default one million jobs arriving
//! over three days (Poisson arrivals with a day/night rhythm, runs of a few minutes) on a
//! pool of 4-slot instances with an idle policy, as `flotilla simulate` would run it.
//!
//! `cargo run --release -p flotilla-scaler --example sim_million -- [JOBS] [SEED] [MAX_USE_COUNT]`
//! (set `SIM_REPORT=1` to print the whole report, e.g. to compare runs)

use std::time::Instant;

use flotilla_scaler::sim::{Job, SimCloud, SimOptions, simulate};
use flotilla_scaler::{Policy, ScalerConfig};

const DAY_MS: f64 = 86_400_000.0;

/// splitmix64, so the trace is the same on every run.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with the given mean.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// `n` jobs over about three days: the arrival rate swings between 0.4x and 1.6x of the mean
/// over each day; durations are 30 s plus an exponential with a 4-minute mean.
fn trace(n: usize, seed: u64) -> Vec<Job> {
    let mut rng = Rng(seed);
    let span_ms = 3.0 * DAY_MS;
    let mean_gap = span_ms / n as f64;
    let mut t = 0f64;
    let mut jobs = Vec::with_capacity(n);
    for _ in 0..n {
        let phase = (t % DAY_MS) / DAY_MS * std::f64::consts::TAU;
        let rate = 1.0 + 0.6 * phase.sin();
        t += rng.exp(mean_gap / rate);
        jobs.push(Job {
            submit_at: t as u64,
            duration: 30_000 + rng.exp(240_000.0) as u64,
            tag: None,
        });
    }
    jobs
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let max_use_count: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let jobs = trace(n, seed);
    let cfg = ScalerConfig {
        capacity_per_instance: 4,
        max_instances: 400,
        throttle_limit: 2.0,
        throttle_burst: 20,
        instance_acquire_timeout_ms: 30 * 60_000,
        update_interval_ms: 60_000,
        max_use_count,
        ..ScalerConfig::default()
    };
    let policy = match Policy::new(
        vec!["* * * * *".into()],
        "UTC",
        8,
        10 * 60_000,
        0.1,
        40,
        false,
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bad policy: {e:?}");
            std::process::exit(2);
        }
    };
    let cloud = SimCloud {
        provisioning_delay_ms: (30_000, 90_000),
        failure_rate: 0.01,
        instance_failure_rate: 0.001,
        seed,
        ..SimCloud::default()
    };
    let opts = SimOptions {
        check_invariants: false,
        samples: 1000,
        start_at: 1_767_225_600_000,
    };
    let start = Instant::now();
    let (report, samples) = simulate(&cfg, &[policy], &cloud, &jobs, &opts);
    let took = start.elapsed();
    println!(
        "{n} jobs: {:.2} s wall; completed {} timed out {} failed {}; peak {} instances; \
         {:.1} instance-hours; wait p50 {:.1} s p95 {:.1} s max {:.1} s; utilisation {:.1}%; \
         {} scale operations; {:.1} h simulated; {} samples",
        took.as_secs_f64(),
        report.completed,
        report.timed_out,
        report.failed,
        report.peak_instances,
        report.instance_seconds / 3600.0,
        report.wait_p50_s,
        report.wait_p95_s,
        report.wait_max_s,
        report.slot_utilisation * 100.0,
        report.scale_operations,
        report.span_s / 3600.0,
        samples.len(),
    );
    if std::env::var_os("SIM_REPORT").is_some() {
        println!("{report:?}");
    }
}

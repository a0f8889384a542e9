//! A synthetic history from a documented model, for examples, tests and benchmarks. It owns the
//! model; it must not know about policies.
//!
//! The model (every number below is a parameter of [`Model`], these are the defaults):
//!
//! - **Pipelines, not jobs, arrive**, as a Poisson process whose rate follows the clock. Each
//!   pipeline has 1-12 jobs (uniform), which become ready within 0-20 s of each other (a
//!   stage fanning out).
//! - **Daily cycle** (local time): nights (20:00-07:00) at 4% of the peak rate; a ramp from
//!   07:00 to 09:00; working hours at 100% with a lunch dip to 60% (12:00-13:00); a ramp down
//!   from 17:00 to 20:00.
//! - **Weekly cycle**: Saturday at 12% and Sunday at 8% of a weekday.
//! - **Merge hours**: on weekdays, 10:30-11:00 and 15:30-16:00 run at 3x (teams merging
//!   before stand-ups and before the end of the day).
//! - **Durations**: log-normal with a median of 4 min and sigma 0.9, plus 2% of jobs from a
//!   long tail (log-normal, median 40 min); capped at 3 h.
//!
//! The generator is deterministic for a seed (splitmix64 draws). The rate is scaled so the
//! expected total is `jobs_per_weekday` on a weekday.

use flotilla_scaler::sim::Rng;

use crate::history::Job;

/// The model's parameters.
#[derive(Debug, Clone)]
pub struct Model {
    /// Days to generate.
    pub days: u32,
    /// Expected jobs on a weekday.
    pub jobs_per_weekday: f64,
    /// First day, 00:00 local time, ms since the epoch (local = UTC + `utc_offset_h`).
    pub start_ms: i64,
    /// The fleet's local time, hours from UTC.
    pub utc_offset_h: i32,
    /// Seed.
    pub seed: u64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            days: 30,
            jobs_per_weekday: 1_000.0,
            // 2026-11-02, a Monday.
            start_ms: 1_793_577_600_000,
            utc_offset_h: 0,
            seed: 1,
        }
    }
}

/// The relative rate at local minute-of-day `m` on weekday `d` (0 = Monday).
pub fn shape(d: u32, m: u32) -> f64 {
    let h = f64::from(m) / 60.0;
    let day = match h {
        h if h < 7.0 => 0.04,
        h if h < 9.0 => 0.04 + 0.96 * (h - 7.0) / 2.0,
        h if (12.0..13.0).contains(&h) => 0.6,
        h if h < 17.0 => 1.0,
        h if h < 20.0 => 1.0 - 0.96 * (h - 17.0) / 3.0,
        _ => 0.04,
    };
    let merge = d < 5 && ((10.5..11.0).contains(&h) || (15.5..16.0).contains(&h));
    let week = match d {
        5 => 0.12,
        6 => 0.08,
        _ => 1.0,
    };
    day * week * if merge { 3.0 } else { 1.0 }
}

/// Mean jobs per pipeline (uniform 1-12).
const JOBS_PER_PIPELINE: f64 = 6.5;

/// Generates the history, ordered by submit time.
pub fn generate(model: &Model) -> Vec<Job> {
    let mut rng = Rng(model.seed);
    // Pipelines per minute at shape 1.0, so a weekday has `jobs_per_weekday` jobs.
    let weekday: f64 = (0..1440).map(|m| shape(0, m)).sum();
    let peak_per_min = model.jobs_per_weekday / JOBS_PER_PIPELINE / weekday;
    let mut jobs = Vec::new();
    for day in 0..model.days {
        let weekday = day % 7;
        for minute in 0..1440u32 {
            let rate = peak_per_min * shape(weekday, minute);
            let minute_ms = model.start_ms + (i64::from(day) * 1440 + i64::from(minute)) * 60_000
                - i64::from(model.utc_offset_h) * 3_600_000;
            // Poisson arrivals within the minute.
            let mut t = -rng.unit_open().ln() / rate;
            while t < 1.0 {
                let at = minute_ms + (t * 60_000.0) as i64;
                let n = 1 + rng.next_u64() % 12;
                for _ in 0..n {
                    let offset = (rng.unit_open() * 20_000.0) as i64;
                    let (median_s, sigma) = if rng.unit_open() < 0.02 {
                        (2_400.0, 0.6)
                    } else {
                        (240.0, 0.9)
                    };
                    let duration_s = (median_s * (sigma * rng.normal()).exp()).min(10_800.0);
                    jobs.push(Job {
                        submit_ms: at + offset,
                        duration_ms: (duration_s * 1000.0) as u64,
                        waited_ms: None,
                    });
                }
                t += -rng.unit_open().ln() / rate;
            }
        }
    }
    jobs.sort();
    jobs
}

/// The history as CSV with absolute times (`submit_at,duration_s`).
pub fn to_csv(jobs: &[Job]) -> String {
    let mut out = String::from("submit_at,duration_s\n");
    for job in jobs {
        let at = chrono::DateTime::from_timestamp_millis(job.submit_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default();
        out.push_str(&format!("{at},{:.1}\n", job.duration_ms as f64 / 1000.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weekday_has_about_the_jobs_asked_for_and_a_weekend_far_fewer() {
        let model = Model {
            days: 14,
            jobs_per_weekday: 2_000.0,
            ..Model::default()
        };
        let jobs = generate(&model);
        let day = |d: i64| {
            let from = model.start_ms + d * 86_400_000;
            jobs.iter()
                .filter(|j| j.submit_ms >= from && j.submit_ms < from + 86_400_000)
                .count() as f64
        };
        let weekdays: f64 = [0, 1, 2, 3, 4, 7, 8, 9, 10, 11]
            .iter()
            .map(|&d| day(d))
            .sum();
        let mean = weekdays / 10.0;
        assert!((mean - 2_000.0).abs() < 200.0, "weekday mean {mean}");
        assert!(day(6) < mean * 0.15, "sunday {}", day(6));
        // Same seed, same history.
        assert_eq!(generate(&model), jobs);
    }
}

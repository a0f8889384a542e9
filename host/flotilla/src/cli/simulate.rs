//! `flotilla simulate -c CONFIG... --trace FILE [--json] [--svg FILE]`.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context;

use super::print_json;
use crate::simulate;

/// A range of seconds, `MIN..MAX`, e.g. `30..90`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SecondsRange {
    /// Lower bound, seconds.
    pub min: f64,
    /// Upper bound, seconds.
    pub max: f64,
}

impl FromStr for SecondsRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let seconds = |t: &str| {
            t.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
        };
        match s.split_once("..").map(|(a, b)| (seconds(a), seconds(b))) {
            Some((Some(min), Some(max))) if min <= max => Ok(SecondsRange { min, max }),
            _ => Err(format!("{s:?}: expected MIN..MAX seconds, e.g. 30..90")),
        }
    }
}

fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?}: must be a number between 0 and 1")),
    }
}

/// Replay a job trace through the real scaler on virtual time.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration files to compare (every pool of each is simulated).
    #[arg(short, long, required = true)]
    pub config: Vec<PathBuf>,
    /// CSV trace: submit_at_s,duration_s[,tag].
    #[arg(long)]
    pub trace: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw instances, busy slots and queued jobs over time.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Provisioning delay range in seconds, e.g. 30..90.
    #[arg(long, default_value = "30..90")]
    pub provisioning_delay: SecondsRange,
    /// Probability that a provider call fails.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub failure_rate: f64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// When the trace's time 0 is (RFC 3339), so cron periods see those days and hours
    /// (default 2026-01-01T00:00:00Z, a Thursday).
    #[arg(long, value_parser = start_time)]
    pub start: Option<u64>,
    /// A span of the trace, FROM..TO seconds, in which the clouds of pools that name a
    /// `fallback` are out of capacity (a spot stockout); repeatable. Such a pool is shown
    /// alone and with its fallback.
    #[arg(long)]
    pub stockout: Vec<SecondsRange>,
}

fn start_time(s: &str) -> Result<u64, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .and_then(|t| u64::try_from(t.timestamp_millis()).ok())
        .ok_or(format!(
            "{s:?}: expected an RFC 3339 time, e.g. 2026-11-02T00:00:00Z"
        ))
}

impl Args {
    /// Runs every configuration over the trace and prints the comparison.
    pub fn run(self) -> anyhow::Result<()> {
        let jobs = flotilla_tune::trace::read_trace(&self.trace)?;
        let delay = self.provisioning_delay;
        let cloud = flotilla_scaler::sim::SimCloud {
            provisioning_delay_ms: ((delay.min * 1000.0) as u64, (delay.max * 1000.0) as u64),
            failure_rate: self.failure_rate,
            seed: self.seed,
            ..Default::default()
        };
        let samples = if self.svg.is_some() { 1000 } else { 0 };
        let stockouts: Vec<(u64, u64)> = self
            .stockout
            .iter()
            .map(|r| ((r.min * 1000.0) as u64, (r.max * 1000.0) as u64))
            .collect();
        let runs = simulate::run_all(&self.config, &jobs, &cloud, &stockouts, samples, self.start)
            .map_err(anyhow::Error::msg)?;
        if let Some(path) = &self.svg {
            flotilla_tune::timeline::svg(&runs, path)
                .map_err(anyhow::Error::msg)
                .with_context(|| path.display().to_string())?;
        }
        if self.json {
            print_json(&runs)
        } else {
            print!("{}", flotilla_tune::timeline::table(&runs));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seconds_range_parses_min_and_max() {
        assert_eq!(
            "30..90".parse::<SecondsRange>(),
            Ok(SecondsRange {
                min: 30.0,
                max: 90.0
            })
        );
    }

    #[test]
    fn a_reversed_or_negative_range_is_refused() {
        for bad in ["90..30", "-1..5", "x..5", "30", "nan..1"] {
            assert!(bad.parse::<SecondsRange>().is_err(), "{bad}");
        }
    }
}

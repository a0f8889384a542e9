//! `flotilla tune -c pool.toml --history jobs.json --wait-p95 60s [--cost-per-hour 0.096]`:
//! the cheapest policy that meets a waiting-time goal on the fleet's own history, with the
//! frontier, held-out figures and sensitivity; and `flotilla history` to generate and check
//! histories.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use super::print_json;
use super::simulate::SecondsRange;
use crate::config;
use flotilla_tune::history::{self, Filter, History};
use flotilla_tune::search::{self, Goal, Input, PolicySpec};
use flotilla_tune::{render, synth};

/// Recommend the cheapest policy that meets a waiting-time goal, from a fleet's job history.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The configuration holding the pool.
    #[arg(short, long)]
    pub config: PathBuf,
    /// The pool to tune (needed when the file has several).
    #[arg(long)]
    pub pool: Option<String>,
    /// Job history: GitLab jobs API JSON (pages may be concatenated), CSV, or Flotilla's lease
    /// history (`<state_dir>/history.jsonl`).
    #[arg(long)]
    pub history: PathBuf,
    /// The goal: 95% of jobs wait at most this long for a slot (e.g. 60s, 2m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub wait_p95: Duration,
    /// Price of one instance-hour, to print money beside instance-hours.
    #[arg(long)]
    pub cost_per_hour: Option<f64>,
    /// Keep the last part of the history out of the fit and report on it separately
    /// (default: the last 7 days, or the last quarter of a history shorter than 3 weeks;
    /// 0s: none).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub holdout: Option<Duration>,
    /// Only jobs with this tag (GitLab `tag_list`, CSV `tags`).
    #[arg(long)]
    pub tag: Option<String>,
    /// Only jobs of this runner (GitLab runner id or description).
    #[arg(long)]
    pub runner: Option<String>,
    /// Capacities per instance the search may choose from, e.g. 1,2,4 (default: the pool's).
    #[arg(long, value_delimiter = ',')]
    pub capacity: Vec<u32>,
    /// Provisioning delay range in seconds, e.g. 30..90.
    #[arg(long, default_value = "30..90")]
    pub provisioning_delay: SecondsRange,
    /// Random seed of the simulated cloud.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Timezone of business hours and of the recommended periods (default: the pool's
    /// first policy's).
    #[arg(long)]
    pub timezone: Option<String>,
    /// Draw the cost/waiting frontier.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the fitted part as a `simulate` trace, to reproduce the figures.
    #[arg(long)]
    pub export_trace: Option<PathBuf>,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit non-zero when the recommendation misses the goal on the held-out days (for a
    /// pipeline that applies what `tune` recommends).
    #[arg(long)]
    pub strict: bool,
    /// The longest history read, in days from its first submit to its last job's end; a
    /// longer one is refused (the replay keeps a sample per minute of the span).
    #[arg(long, default_value_t = history::MAX_SPAN_DAYS, value_parser = clap::value_parser!(u32).range(1..=36_600))]
    pub max_history_days: u32,
    /// A span, FROM..TO seconds from the start of each simulated stretch, in which the pool's
    /// cloud is out of capacity (a spot stockout); repeatable. A pool with a `fallback` hands
    /// its waiting jobs to it meanwhile, as `flotilla run` does.
    #[arg(long)]
    pub stockout: Vec<SecondsRange>,
}

const DAY_MS: i64 = 86_400_000;

impl Args {
    /// The search's input: the pool as configured, its fallback, and the flags.
    fn input(
        &self,
        pool: &config::Pool,
        cfg: &config::Config,
        holdout_from_ms: i64,
    ) -> anyhow::Result<Input> {
        let tz_name = self
            .timezone
            .clone()
            .or_else(|| pool.policies.first().map(|p| p.timezone.name().to_string()))
            .unwrap_or_else(|| "UTC".into());
        let timezone: chrono_tz::Tz = tz_name
            .parse()
            .map_err(|_| anyhow::anyhow!("--timezone {tz_name:?} is not an IANA timezone"))?;
        if let Some(c) = self.capacity.iter().find(|&&c| c == 0) {
            bail!("--capacity {c}: a capacity must be at least 1");
        }
        let ms = |s: f64| (s * 1000.0) as u64;
        let delay = self.provisioning_delay;
        Ok(Input {
            scaler: pool.scaler.clone(),
            current: pool.policies.iter().map(PolicySpec::of).collect(),
            cloud: flotilla_scaler::sim::SimCloud {
                provisioning_delay_ms: (ms(delay.min), ms(delay.max)),
                seed: self.seed,
                stockouts: self
                    .stockout
                    .iter()
                    .map(|r| (ms(r.min), ms(r.max)))
                    .collect(),
                ..Default::default()
            },
            timezone,
            holdout_from_ms,
            threads: self
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            capacities: self.capacity.clone(),
            fallback: pool
                .fallback
                .as_ref()
                .and_then(|name| cfg.pools.iter().find(|p| &p.name == name))
                .map(|f| search::FallbackPool {
                    scaler: f.scaler.clone(),
                    policies: f.policies.clone(),
                }),
        })
    }

    /// The pool `--pool` names, or the config's only one.
    fn pick_pool<'c>(&self, cfg: &'c config::Config) -> anyhow::Result<&'c config::Pool> {
        Ok(match (&self.pool, cfg.pools.as_slice()) {
            (Some(name), pools) => pools.iter().find(|p| p.name == *name).with_context(|| {
                let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
                format!(
                    "no pool {name:?} in {} (it has: {})",
                    self.config.display(),
                    names.join(", ")
                )
            })?,
            (None, [only]) => only,
            (None, pools) => {
                let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
                bail!(
                    "{} has {} pools; name one with --pool ({})",
                    self.config.display(),
                    pools.len(),
                    names.join(", ")
                )
            }
        })
    }

    /// The outcome where it was asked for: the trace, the SVG, and JSON or the text report.
    fn write_out(&self, outcome: &search::Outcome, history: &History) -> anyhow::Result<()> {
        if let Some(path) = &self.export_trace {
            let start = chrono::DateTime::parse_from_rfc3339(&outcome.fit_start)
                .map(|t| t.timestamp_millis())
                .unwrap_or(0);
            let fit = history.jobs.get(..outcome.fit_jobs).unwrap_or_default();
            write_trace(path, &search::sim_jobs(fit, start))?;
        }
        if let Some(path) = &self.svg {
            render::svg(outcome, path)
                .map_err(anyhow::Error::msg)
                .with_context(|| path.display().to_string())?;
        }
        if self.json {
            // The blocks to paste travel with the figures.
            let mut value = serde_json::to_value(outcome)?;
            if let (Some(map), Some(r)) = (value.as_object_mut(), &outcome.recommended) {
                map.insert(
                    "recommended_toml".into(),
                    render::policy_blocks(&r.candidate.policies).into(),
                );
            }
            print_json(&value)?;
        } else {
            print!("{}", render::text(outcome));
            if let Some(path) = &self.export_trace {
                println!(
                    "\nReproduce the fitted figures: flotilla simulate -c CONFIG --trace {} --start {} --provisioning-delay {}..{} --seed {}",
                    path.display(),
                    outcome.fit_start,
                    self.provisioning_delay.min,
                    self.provisioning_delay.max,
                    self.seed
                );
            }
        }
        Ok(())
    }

    /// Reads the pool and the history, searches, prints.
    pub fn run(self) -> anyhow::Result<()> {
        let cfg = config::load_with(&self.config, false).map_err(|e| anyhow::anyhow!("{e}"))?;
        let pool = self.pick_pool(&cfg)?;
        let filter = Filter {
            tag: self.tag.clone(),
            runner: self.runner.clone(),
            pool: Some(pool.name.clone()),
            max_span_days: Some(self.max_history_days),
        };
        let history = history::read(&self.history, &filter)?;
        summarize(&history, &self.history);
        let (Some(first), Some(last)) = (history.jobs.first(), history.jobs.last()) else {
            bail!("{}: no jobs to tune on", self.history.display());
        };
        let span = last.submit_ms - first.submit_ms;
        let holdout_ms = match self.holdout {
            Some(d) => d.as_millis() as i64,
            None if span >= 21 * DAY_MS => 7 * DAY_MS,
            None => span / 4,
        };
        if holdout_ms >= span && holdout_ms > 0 {
            bail!(
                "--holdout {} is the whole history ({:.1} days); hold out less",
                humantime::format_duration(Duration::from_millis(holdout_ms as u64)),
                span as f64 / DAY_MS as f64
            );
        }
        let input = self.input(pool, &cfg, last.submit_ms - holdout_ms + 1)?;
        let goal = Goal {
            wait_p95_s: self.wait_p95.as_secs_f64(),
            cost_per_hour: self.cost_per_hour,
        };
        let outcome = search::search(&input, &goal, &history.jobs)?;
        self.write_out(&outcome, &history)?;
        if let Some(miss) = &outcome.holdout_miss {
            if self.strict {
                eprintln!("error: --strict: {miss}");
            } else {
                eprintln!("warning: {miss}");
            }
        }
        match (&outcome.unreachable, &outcome.holdout_miss) {
            (Some(why), _) => Err(super::Reported(why.clone()).into()),
            (None, Some(miss)) if self.strict => {
                Err(super::Reported(format!("--strict: {miss}")).into())
            }
            _ => Ok(()),
        }
    }
}

/// Says on standard error what was read and what was set aside.
fn summarize(history: &History, path: &std::path::Path) {
    eprintln!(
        "{}: {} jobs ({})",
        path.display(),
        history.jobs.len(),
        history.format
    );
    for (why, n) in &history.set_aside {
        eprintln!("  set aside: {n} {why}");
    }
}

/// Writes jobs as a `simulate` trace (whole milliseconds, so it reads back exactly).
fn write_trace(path: &std::path::Path, jobs: &[flotilla_scaler::sim::Job]) -> anyhow::Result<()> {
    let mut out = String::from("submit_at_s,duration_s\n");
    for j in jobs {
        out.push_str(&format!(
            "{}.{:03},{}.{:03}\n",
            j.submit_at / 1000,
            j.submit_at % 1000,
            j.duration / 1000,
            j.duration % 1000
        ));
    }
    std::fs::write(path, out).with_context(|| path.display().to_string())
}

/// Job histories: generate a synthetic month, or check a file.
#[derive(Debug, clap::Subcommand)]
pub enum HistoryCommand {
    /// Write a synthetic history from the documented model (daily and weekly cycle, merge
    /// hours, long-tailed durations) as CSV with absolute times.
    Synth(SynthArgs),
    /// Read a history and say what it holds, or every record it refuses.
    Check(CheckArgs),
}

/// `flotilla history synth`.
#[derive(Debug, clap::Args)]
pub struct SynthArgs {
    /// Where to write the CSV.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Days to generate (starting Monday 2026-11-02).
    #[arg(long, default_value_t = 30)]
    pub days: u32,
    /// Expected jobs on a weekday.
    #[arg(long, default_value_t = 1000.0)]
    pub jobs_per_weekday: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// `flotilla history check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The history file.
    pub file: PathBuf,
    /// Only jobs with this tag.
    #[arg(long)]
    pub tag: Option<String>,
    /// Only jobs of this runner.
    #[arg(long)]
    pub runner: Option<String>,
    /// The longest history read, in days (as `tune --max-history-days`).
    #[arg(long, default_value_t = history::MAX_SPAN_DAYS, value_parser = clap::value_parser!(u32).range(1..=36_600))]
    pub max_history_days: u32,
}

impl HistoryCommand {
    /// Runs the subcommand.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            HistoryCommand::Synth(a) => {
                if !(a.jobs_per_weekday.is_finite() && a.jobs_per_weekday > 0.0) || a.days == 0 {
                    bail!("--days and --jobs-per-weekday must be positive");
                }
                let jobs = synth::generate(&synth::Model {
                    days: a.days,
                    jobs_per_weekday: a.jobs_per_weekday,
                    seed: a.seed,
                    ..synth::Model::default()
                });
                std::fs::write(&a.output, synth::to_csv(&jobs))
                    .with_context(|| a.output.display().to_string())?;
                println!("wrote {} jobs to {}", jobs.len(), a.output.display());
                Ok(())
            }
            HistoryCommand::Check(a) => {
                let filter = Filter {
                    tag: a.tag,
                    runner: a.runner,
                    pool: None,
                    max_span_days: Some(a.max_history_days),
                };
                let history = history::read(&a.file, &filter)?;
                let (Some(first), Some(last)) = (history.jobs.first(), history.jobs.last()) else {
                    bail!("{}: no jobs", a.file.display());
                };
                let rfc = |ms: i64| {
                    chrono::DateTime::from_timestamp_millis(ms)
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                        .unwrap_or_default()
                };
                println!(
                    "{}: {} jobs ({}), {} to {}",
                    a.file.display(),
                    history.jobs.len(),
                    history.format,
                    rfc(first.submit_ms),
                    rfc(last.submit_ms)
                );
                for (why, n) in &history.set_aside {
                    println!("set aside: {n} {why}");
                }
                Ok(())
            }
        }
    }
}

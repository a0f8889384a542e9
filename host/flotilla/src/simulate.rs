//! `flotilla simulate`: the real scaler on virtual time against a simulated cloud, fed by a
//! CSV job trace, with several configurations compared side by side.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config;
use flotilla_scaler::sim::{
    Job, Sample, SimCloud, SimOptions, SimPool, SimReport, simulate, simulate_with_fallback,
};

/// Why a trace could not be read; row numbers count the header as row 1.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Bad rows, each reported.
    #[error("{path}: {}", .rows.join("; "))]
    Rows {
        /// The file.
        path: String,
        /// One message per bad row.
        rows: Vec<String>,
    },
}

/// Reads `submit_at_s,duration_s[,tag]` rows (header required), reporting every bad row.
pub fn read_trace(path: &Path) -> Result<Vec<Job>, TraceError> {
    let display = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: display.clone(),
        source,
    })?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(std::io::BufReader::new(file));
    let mut bad = Vec::new();
    match reader.headers() {
        Ok(h) => {
            let names: Vec<&str> = h.iter().collect();
            if names.first() != Some(&"submit_at_s") || names.get(1) != Some(&"duration_s") {
                bad.push(format!(
                    "row 1: header must start with submit_at_s,duration_s (got {})",
                    names.join(",")
                ));
            }
        }
        Err(e) => bad.push(format!("row 1: {e}")),
    }
    let mut jobs = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let row = i + 2;
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                bad.push(format!("row {row}: {e}"));
                continue;
            }
        };
        let num = |n: usize, name: &str| -> Result<f64, String> {
            let v = record
                .get(n)
                .ok_or_else(|| format!("row {row}: missing {name}"))?;
            let x: f64 = v
                .parse()
                .map_err(|_| format!("row {row}: {name} {v:?} is not a number"))?;
            if !x.is_finite() || x < 0.0 {
                return Err(format!("row {row}: {name} must be >= 0 (got {v})"));
            }
            Ok(x)
        };
        match (num(0, "submit_at_s"), num(1, "duration_s")) {
            (Ok(at), Ok(d)) => jobs.push(Job {
                submit_at: (at * 1000.0).round() as u64,
                duration: ((d * 1000.0).round() as u64).max(1),
                tag: record.get(2).filter(|t| !t.is_empty()).map(str::to_string),
            }),
            (a, b) => bad.extend([a.err(), b.err()].into_iter().flatten()),
        }
        if bad.len() > 50 {
            bad.push("(more bad rows not shown)".to_string());
            break;
        }
    }
    if !bad.is_empty() {
        return Err(TraceError::Rows {
            path: display,
            rows: bad,
        });
    }
    jobs.sort_by_key(|j| j.submit_at);
    Ok(jobs)
}

/// Where a trace's time 0 is unless `--start` says: 2026-01-01T00:00:00Z.
pub const DEFAULT_START_MS: u64 = 1_767_225_600_000;

/// One configuration's result.
#[derive(Debug, Serialize)]
pub struct Run {
    /// `file:pool`.
    pub name: String,
    /// What happened.
    pub report: SimReport,
    /// Timeline for plots.
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

/// Simulates every pool of every config file on the trace. The clouds of pools that name a
/// `fallback` are out of capacity during `stockouts` (ms from the trace start); each such
/// pool is simulated alone, and then with its fallback (`file:pool+fallback`), which takes
/// its waiting jobs while it cannot grow.
pub fn run_all(
    configs: &[PathBuf],
    jobs: &[Job],
    cloud: &SimCloud,
    stockouts: &[(u64, u64)],
    samples: usize,
    start_at: Option<u64>,
) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    let opts = SimOptions {
        check_invariants: false,
        samples,
        start_at: start_at.unwrap_or(DEFAULT_START_MS),
    };
    for path in configs {
        let cfg = config::load_with(path, false).map_err(|e| e.to_string())?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        for pool in &cfg.pools {
            let fallback = pool
                .fallback
                .as_ref()
                .and_then(|name| cfg.pools.iter().find(|p| &p.name == name));
            let own = SimCloud {
                stockouts: if fallback.is_some() {
                    stockouts.to_vec()
                } else {
                    Vec::new()
                },
                ..cloud.clone()
            };
            let (report, samples) = simulate(&pool.scaler, &pool.policies, &own, jobs, &opts);
            runs.push(Run {
                name: format!("{stem}:{}", pool.name),
                report,
                samples,
            });
            if let Some(fallback) = fallback {
                let behind = SimCloud {
                    seed: cloud.seed.wrapping_add(1),
                    ..cloud.clone()
                };
                let (report, samples) = simulate_with_fallback(
                    SimPool {
                        cfg: &pool.scaler,
                        policies: &pool.policies,
                        cloud: &own,
                    },
                    SimPool {
                        cfg: &fallback.scaler,
                        policies: &fallback.policies,
                        cloud: &behind,
                    },
                    jobs,
                    &opts,
                );
                runs.push(Run {
                    name: format!("{stem}:{}+{}", pool.name, fallback.name),
                    report,
                    samples,
                });
            }
        }
    }
    Ok(runs)
}

type Column = Box<dyn Fn(&SimReport) -> String>;
type Series = (&'static str, plotters::style::RGBColor, fn(&Sample) -> u32);

/// A side-by-side table.
pub fn table(runs: &[Run]) -> String {
    let mut out = String::new();
    let w = runs
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(10)
        .max(14);
    out.push_str(&format!("{:<w$}", "metric"));
    for r in runs {
        out.push_str(&format!("  {:>w$}", r.name));
    }
    out.push('\n');
    let rows: Vec<(&str, Column)> = vec![
        ("jobs", Box::new(|r| r.jobs.to_string())),
        ("completed", Box::new(|r| r.completed.to_string())),
        ("timed out", Box::new(|r| r.timed_out.to_string())),
        (
            "instance-hours",
            Box::new(|r| format!("{:.1}", r.instance_seconds / 3600.0)),
        ),
        ("peak instances", Box::new(|r| r.peak_instances.to_string())),
        ("wait p50 (s)", Box::new(|r| format!("{:.1}", r.wait_p50_s))),
        ("wait p95 (s)", Box::new(|r| format!("{:.1}", r.wait_p95_s))),
        ("wait max (s)", Box::new(|r| format!("{:.1}", r.wait_max_s))),
        (
            "slot utilisation",
            Box::new(|r| format!("{:.0}%", r.slot_utilisation * 100.0)),
        ),
        (
            "scale operations",
            Box::new(|r| r.scale_operations.to_string()),
        ),
        ("handed over", Box::new(|r| r.handed_over.to_string())),
        (
            "served by fallback",
            Box::new(|r| r.served_by_fallback.to_string()),
        ),
    ];
    for (label, f) in rows {
        out.push_str(&format!("{label:<w$}"));
        for r in runs {
            out.push_str(&format!("  {:>w$}", f(&r.report)));
        }
        out.push('\n');
    }
    out
}

/// Draws instances, busy slots and queued jobs over time, one panel per run.
pub fn svg(runs: &[Run], path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let height = 260 * runs.len().max(1) as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((runs.len().max(1), 1));
    for (run, area) in runs.iter().zip(panels.iter()) {
        let t_max = run.samples.last().map_or(1.0, |s| s.t_s / 3600.0).max(0.01);
        let y_max = run
            .samples
            .iter()
            .map(|s| s.instances.max(s.busy_slots).max(s.queued))
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(&run.name, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..t_max, 0f64..y_max)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("hours")
            .draw()
            .map_err(|e| e.to_string())?;
        let series: [Series; 3] = [
            ("instances", BLUE, |s| s.instances),
            ("busy slots", GREEN, |s| s.busy_slots),
            ("queued jobs", RED, |s| s.queued),
        ];
        for (label, color, f) in series {
            chart
                .draw_series(LineSeries::new(
                    run.samples
                        .iter()
                        .map(|s| (s.t_s / 3600.0, f64::from(f(s)))),
                    color,
                ))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

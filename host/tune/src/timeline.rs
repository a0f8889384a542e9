//! The simulator's runs side by side: a table of their figures, and their timelines (instances,
//! busy slots, queued jobs) as an SVG, one panel per run.

use std::path::Path;

use flotilla_scaler::sim::{Sample, SimReport};
use serde::Serialize;

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

//! What `tune` prints: the recommended `[[pool.policy]]` blocks ready to paste, the figures
//! beside the current policy's (fitted and held out), the frontier as a table and an SVG, and
//! the sensitivity. It owns the wording and layout; it must not search.

use std::fmt::Write as _;
use std::path::Path;

use crate::search::{Outcome, Point, PolicySpec, Verified};

fn duration(ms: u64) -> String {
    match ms {
        ms if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        ms if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        ms => format!("{}s", ms.div_ceil(1000)),
    }
}

/// The blocks as TOML, ready to paste under the pool.
pub fn policy_blocks(policies: &[PolicySpec]) -> String {
    let mut out = String::new();
    for p in policies {
        let periods: Vec<String> = p.periods.iter().map(|c| format!("{c:?}")).collect();
        let _ = writeln!(out, "[[pool.policy]]");
        let _ = writeln!(out, "periods = [{}]", periods.join(", "));
        let _ = writeln!(out, "timezone = {:?}", p.timezone);
        let _ = writeln!(out, "idle_count = {}", p.idle_count);
        let _ = writeln!(out, "idle_time = {:?}", duration(p.idle_time_ms));
        if p.scale_factor > 0.0 {
            let _ = writeln!(out, "scale_factor = {}", p.scale_factor);
        }
        if p.scale_factor_limit > 0 {
            let _ = writeln!(out, "scale_factor_limit = {}", p.scale_factor_limit);
        }
        if p.preemptive_mode {
            let _ = writeln!(out, "preemptive_mode = true");
        }
        out.push('\n');
    }
    out
}

fn money(v: &Verified) -> String {
    v.cost.map_or(String::new(), |c| format!(" ({c:.2})"))
}

/// Width of the label column.
const LABEL: usize = 44;

fn row(label: &str, v: &Verified) -> String {
    format!(
        "{label:<LABEL$} {:>10.1}{:<11} {:>7.1} {:>7.1} {:>7.1} {:>9}\n",
        v.instance_hours,
        money(v),
        v.wait_p50_s,
        v.wait_p95_s,
        v.wait_max_s,
        v.timed_out
    )
}

fn header() -> String {
    format!(
        "{:<LABEL$} {:>10}{:<11} {:>7} {:>7} {:>7} {:>9}\n",
        "", "inst-hours", "", "p50 s", "p95 s", "max s", "timed out"
    )
}

/// The whole report as text.
pub fn text(o: &Outcome) -> String {
    let mut out = String::new();
    summary(&mut out, o);
    verified(&mut out, o);
    frontier(&mut out, o);
    let t = &o.timings;
    let _ = writeln!(
        out,
        "\nTook {:.1} s screening, {:.1} s verifying, {:.1} s on held-out and load.",
        t.screen_s, t.verify_s, t.holdout_s
    );
    out
}

/// What was fitted and searched, and the recommendation (or why there is none).
fn summary(out: &mut String, o: &Outcome) {
    let _ = writeln!(
        out,
        "Fitted on {} jobs from {}; held out {} jobs from {}.",
        o.fit_jobs,
        o.fit_start,
        o.holdout_jobs,
        if o.holdout_start.is_empty() {
            "-"
        } else {
            &o.holdout_start
        }
    );
    match o.business_hours {
        Some((from, to)) => {
            let _ = writeln!(out, "Busy hours found: weekdays {from}:00-{to}:00.");
        }
        None => {
            let _ = writeln!(
                out,
                "No business hours stand out: one policy for all hours."
            );
        }
    }
    let _ = writeln!(
        out,
        "Screened {} candidates ({} more skipped as dominated); verified {} on the real scaler.\n",
        o.screened,
        o.pruned,
        o.frontier.len() + 1
    );
    match &o.recommended {
        Some(r) => {
            let _ = writeln!(
                out,
                "Recommended ({}), the cheapest that meets wait p95 <= {}s with no job giving up:\n",
                r.candidate.label, o.goal_wait_p95_s
            );
            out.push_str(&policy_blocks(&r.candidate.policies));
            if r.candidate.capacity != o.current.candidate.capacity {
                let _ = writeln!(
                    out,
                    "and set capacity_per_instance = {}\n",
                    r.candidate.capacity
                );
            }
        }
        None => {
            let _ = writeln!(
                out,
                "No recommendation: {}\n",
                o.unreachable
                    .as_deref()
                    .unwrap_or("the goal is out of reach")
            );
        }
    }
}

/// The current policy and the recommendation on the real scaler: fitted, held out, and its
/// sensitivity.
fn verified(out: &mut String, o: &Outcome) {
    out.push_str("Fitted part (the real scaler on the simulator):\n");
    out.push_str(&header());
    out.push_str(&row("current", &o.current.fit));
    if let Some(r) = &o.recommended {
        out.push_str(&row("recommended", &r.fit));
    }
    if let Some(held) = &o.current_holdout {
        out.push_str("\nHeld-out part (not fitted on):\n");
        out.push_str(&header());
        out.push_str(&row("current", held));
        if let Some(r) = &o.recommended_holdout {
            out.push_str(&row("recommended", r));
        }
        if let Some(miss) = &o.holdout_miss {
            let _ = writeln!(out, "\nWARNING: {miss}.");
        }
    }
    if o.recommended.is_some() {
        out.push_str("\nSensitivity:\n");
        out.push_str(&header());
        match &o.next_cheaper {
            Some(n) => {
                out.push_str(&row("next cheaper", &n.fit));
                let _ = writeln!(out, "  ({})", n.candidate.label);
            }
            None => out
                .push_str("next cheaper: none, the recommendation is the cheapest policy tried\n"),
        }
        if let Some(p) = &o.plus_half_load {
            out.push_str(&row("recommended, +50% load", p));
            let _ = writeln!(out, "  (+50% load on the {} part)", o.plus_half_on);
        }
    }
}

/// The frontier, verified points and the screening model's estimates, cheapest first.
fn frontier(out: &mut String, o: &Outcome) {
    out.push_str(
        "\nFrontier on the fitted part, cheapest first (* meets the goal; ~ the screening model's\nestimate, not verified on the real scaler):\n",
    );
    out.push_str(&header());
    let mut rows: Vec<(f64, String)> = Vec::new();
    for p in &o.frontier {
        let mark = if p.fit.timed_out == 0
            && o.goal_wait_p95_s > 0.0
            && p.fit.wait_p95_s <= o.goal_wait_p95_s
        {
            "*"
        } else {
            " "
        };
        let label = format!("{mark} {}", p.candidate.label);
        rows.push((p.fit.instance_hours, row(&label, &p.fit)));
    }
    // At most 24 estimates, evenly spread, so the table stays readable.
    let step = o.estimates.len().div_ceil(24).max(1);
    for e in o.estimates.iter().step_by(step) {
        let v = Verified {
            instance_hours: e.instance_hours,
            cost: None,
            wait_p50_s: e.wait_p50_s,
            wait_p95_s: e.wait_p95_s,
            wait_max_s: e.wait_max_s,
            timed_out: 0,
            jobs: 0,
            peak_instances: 0,
        };
        rows.push((e.instance_hours, row(&format!("~ {}", e.label), &v)));
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (_, r) in rows {
        out.push_str(&r);
    }
}

/// The frontier as an SVG: p95 wait against instance-hours, the current policy and the
/// recommendation marked, the goal as a line.
pub fn svg(o: &Outcome, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let all: Vec<&Point> = o.frontier.iter().chain([&o.current]).collect();
    let x_max = all.iter().map(|p| p.fit.instance_hours).fold(1.0, f64::max) * 1.1;
    let y_max = all
        .iter()
        .map(|p| p.fit.wait_p95_s)
        .fold(o.goal_wait_p95_s, f64::max)
        .max(1.0)
        * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("cost / waiting frontier", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("instance-hours")
        .y_desc("wait p95 (s)")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            o.frontier
                .iter()
                .map(|p| (p.fit.instance_hours, p.fit.wait_p95_s)),
            BLUE,
        ))
        .map_err(|e| e.to_string())?
        .label("frontier")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(
            o.frontier
                .iter()
                .map(|p| Circle::new((p.fit.instance_hours, p.fit.wait_p95_s), 3, BLUE.filled())),
        )
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, o.goal_wait_p95_s), (x_max, o.goal_wait_p95_s)],
            RED.mix(0.6),
        ))
        .map_err(|e| e.to_string())?
        .label("goal")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    let cur = (o.current.fit.instance_hours, o.current.fit.wait_p95_s);
    chart
        .draw_series([Cross::new(cur, 7, BLACK.stroke_width(2))])
        .map_err(|e| e.to_string())?
        .label("current")
        .legend(|(x, y)| Cross::new((x + 10, y), 5, BLACK));
    if let Some(r) = &o.recommended {
        let at = (r.fit.instance_hours, r.fit.wait_p95_s);
        chart
            .draw_series([Circle::new(at, 7, GREEN.filled())])
            .map_err(|e| e.to_string())?
            .label("recommended")
            .legend(|(x, y)| Circle::new((x + 10, y), 5, GREEN.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

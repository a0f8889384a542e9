//! A load run's figures: percentiles of the drivers' timings, the server's per-route
//! latencies (from its own histogram, interpolated within buckets as Prometheus's
//! `histogram_quantile` does), and the two sides' resource use; printed as a Markdown table.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// p50, p95, p99 and the largest of a set of durations.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    pub p50: Duration,
    pub p95: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    /// The nearest-rank percentiles of `values` (all zero when there are none).
    pub fn of(values: &[Duration]) -> Summary {
        let mut v = values.to_vec();
        v.sort();
        let rank = |q: f64| -> Duration {
            if v.is_empty() {
                return Duration::ZERO;
            }
            let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        Summary {
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            max: v.last().copied().unwrap_or_default(),
        }
    }

    fn cells(&self) -> String {
        format!(
            "{} | {} | {}",
            secs(self.p50),
            secs(self.p95),
            secs(self.p99)
        )
    }
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 0.1 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The cumulative bucket counts of one histogram series, by upper bound.
pub type Buckets = Vec<(f64, f64)>;

/// The `flotilla_http_request_duration_seconds` buckets in a `/metrics` text, by
/// `METHOD route`.
pub fn route_buckets(metrics: &str) -> BTreeMap<String, Buckets> {
    buckets(
        metrics,
        "flotilla_http_request_duration_seconds",
        &["method", "route"],
    )
}

/// The buckets of histogram `metric` in a `/metrics` text, by the values of `keys` joined
/// with spaces (series that differ only in other labels are summed).
pub fn buckets(metrics: &str, metric: &str, keys: &[&str]) -> BTreeMap<String, Buckets> {
    let prefix = format!("{metric}_bucket{{");
    let mut out: BTreeMap<String, BTreeMap<u64, (f64, f64)>> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split("\",")
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        let Some(le) = label("le") else {
            continue;
        };
        let key: Option<Vec<String>> = keys.iter().map(|k| label(k)).collect();
        let Some(key) = key else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        let count: f64 = value.trim().parse().unwrap_or(0.0);
        let entry = out
            .entry(key.join(" "))
            .or_default()
            .entry(le.to_bits())
            .or_insert((le, 0.0));
        entry.1 += count;
    }
    out.into_iter()
        .map(|(k, by)| {
            let mut v: Buckets = by.into_values().collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            (k, v)
        })
        .collect()
}

/// `after - before`, bucket by bucket (the requests made between two scrapes).
pub fn delta(after: &Buckets, before: Option<&Buckets>) -> Buckets {
    after
        .iter()
        .map(|(le, n)| {
            let was = before
                .and_then(|b| b.iter().find(|(l, _)| l == le))
                .map_or(0.0, |(_, n)| *n);
            (*le, n - was)
        })
        .collect()
}

/// The `q` quantile of cumulative `buckets`, interpolated linearly within its bucket; a
/// quantile in the `+Inf` bucket is the last finite bound.
pub fn quantile(q: f64, buckets: &Buckets) -> Duration {
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total <= 0.0 {
        return Duration::ZERO;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if *count >= rank {
            if le.is_infinite() {
                return Duration::from_secs_f64(lower);
            }
            let within = if count - below > 0.0 {
                (rank - below) / (count - below)
            } else {
                1.0
            };
            return Duration::from_secs_f64(lower + (le - lower) * within);
        }
        (lower, below) = (*le, *count);
    }
    Duration::from_secs_f64(lower)
}

/// Flotilla's side of a run.
#[derive(Debug, Clone, Default)]
pub struct HostFigures {
    pub cpu: Duration,
    pub peak_rss: u64,
    pub max_threads: u64,
    pub max_fds: u64,
    pub max_sockets: u64,
    pub max_in_flight: u64,
    pub max_streams: u64,
    /// Connections the API listener accepted during the run.
    pub connections: u64,
}

/// The runner manager's side: the driver processes.
#[derive(Debug, Clone, Default)]
pub struct DriverFigures {
    pub processes: u64,
    pub max_live: u64,
    /// The largest sum of the live drivers' proportional set sizes.
    pub max_summed_rss: u64,
    pub cpu: Duration,
    pub max_rss: u64,
    pub max_threads: u64,
    /// The largest peak RSS of each stage (`config`, `prepare`, `build_script`, ...).
    pub peak_by_stage: std::collections::BTreeMap<String, u64>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub title: String,
    pub jobs: usize,
    pub wall: Duration,
    pub errors: Vec<String>,
    pub prepare: Summary,
    pub to_first_byte: Summary,
    pub overhead: Summary,
    pub routes: Vec<(String, u64, Summary)>,
    /// Journal commits by outcome: count and percentiles.
    pub journal: Vec<(String, u64, Summary)>,
    /// The plugin's calls during the run, by function: count and percentiles.
    pub plugin_calls: Vec<(String, u64, Summary)>,
    /// The machines' CPU: every sshd with its sessions and their commands.
    pub machines_cpu: Duration,
    /// The harness's own CPU (the fake engines run in it), its drivers' apart.
    pub harness_cpu: Duration,
    pub host: HostFigures,
    pub drivers: DriverFigures,
    /// Stage runs the fake engine played (`None` on a real engine).
    pub engine_stage_runs: Option<u64>,
    /// Docker requests the fake engines answered during the run (`None` on a real engine).
    pub engine_requests: Option<u64>,
    /// Connections the fake engines accepted during the run (`None` on a real engine): the
    /// host's new streams to the engines (SSH channels).
    pub engine_connections: Option<u64>,
}

impl Report {
    /// The report as Markdown: one table of timings, one of resources.
    pub fn markdown(&self) -> String {
        let n = self.jobs.max(1) as f64;
        let mut s = String::new();
        let _ = writeln!(s, "### {}\n", self.title);
        let _ = writeln!(
            s,
            "{} jobs in {:.1} s, {} error(s).\n",
            self.jobs,
            self.wall.as_secs_f64(),
            self.errors.len()
        );
        let _ = writeln!(s, "| timing | p50 | p95 | p99 |\n|---|---|---|---|");
        let _ = writeln!(s, "| `prepare` | {} |", self.prepare.cells());
        let _ = writeln!(
            s,
            "| `prepare` start to the first byte of `build_script` | {} |",
            self.to_first_byte.cells()
        );
        let _ = writeln!(
            s,
            "| per-job overhead (end to end minus script time) | {} |",
            self.overhead.cells()
        );
        for (route, count, summary) in &self.routes {
            let _ = writeln!(s, "| server: `{route}` ({count}) | {} |", summary.cells());
        }
        for (outcome, count, summary) in &self.journal {
            let _ = writeln!(
                s,
                "| journal commit, {outcome} ({count}) | {} |",
                summary.cells()
            );
        }
        if self.plugin_calls.is_empty() {
            let _ = writeln!(s, "| plugin calls during the run | none |");
        }
        for (function, count, summary) in &self.plugin_calls {
            let _ = writeln!(
                s,
                "| plugin call `{function}` ({count}) | {} |",
                summary.cells()
            );
        }
        let h = &self.host;
        let d = &self.drivers;
        let _ = writeln!(s, "\n| resource | figure |\n|---|---|");
        let _ = writeln!(
            s,
            "| Flotilla CPU per job | {:.1} ms |",
            h.cpu.as_secs_f64() * 1000.0 / n
        );
        let _ = writeln!(s, "| Flotilla peak RSS | {} |", mib(h.peak_rss));
        let _ = writeln!(
            s,
            "| the machines' sshd CPU per job; the harness's (fake engines) | {:.1} ms; {:.1} ms |",
            self.machines_cpu.as_secs_f64() * 1000.0 / n,
            self.harness_cpu.as_secs_f64() * 1000.0 / n
        );
        let _ = writeln!(
            s,
            "| Flotilla threads, open fds, sockets (max) | {}, {}, {} |",
            h.max_threads, h.max_fds, h.max_sockets
        );
        let _ = writeln!(
            s,
            "| API requests in flight, Docker streams open (max) | {}, {} |",
            h.max_in_flight, h.max_streams
        );
        let requests: u64 = self.routes.iter().map(|(_, count, _)| count).sum();
        let _ = writeln!(
            s,
            "| API requests per job; connections accepted per job | {:.1}; {:.1} |",
            requests as f64 / n,
            h.connections as f64 / n
        );
        if let (Some(requests), Some(connections)) = (self.engine_requests, self.engine_connections)
        {
            let _ = writeln!(
                s,
                "| Docker requests per job; engine connections per job (the fake engines) | {:.1}; {:.1} |",
                requests as f64 / n,
                connections as f64 / n
            );
        }
        let _ = writeln!(
            s,
            "| driver processes (all), live at once (max) | {}, {} |",
            d.processes, d.max_live
        );
        let _ = writeln!(
            s,
            "| drivers' summed PSS (max; the binary's pages shared) | {} |",
            mib(d.max_summed_rss)
        );
        let _ = writeln!(
            s,
            "| driver CPU per job | {:.1} ms |",
            d.cpu.as_secs_f64() * 1000.0 / n
        );
        let _ = writeln!(
            s,
            "| one driver's peak RSS (max), threads (max) | {}, {} |",
            mib(d.max_rss),
            d.max_threads
        );
        let stages: Vec<String> = d
            .peak_by_stage
            .iter()
            .map(|(stage, rss)| format!("{stage} {}", mib(*rss)))
            .collect();
        let _ = writeln!(
            s,
            "| a driver's peak RSS by stage | {} |",
            stages.join(", ")
        );
        for e in self.errors.iter().take(5) {
            let _ = writeln!(s, "\nerror: {e}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(&v);
        assert_eq!(
            (s.p50, s.p95, s.p99, s.max),
            (
                Duration::from_millis(50),
                Duration::from_millis(95),
                Duration::from_millis(99),
                Duration::from_millis(100)
            )
        );
        assert_eq!(Summary::of(&[]), Summary::default());
    }

    #[test]
    fn a_histogram_quantile_interpolates_within_its_bucket_as_prometheus_does() {
        let text = "flotilla_http_request_duration_seconds_bucket{method=\"POST\",route=\"/a\",le=\"0.1\"} 50\n\
                    flotilla_http_request_duration_seconds_bucket{method=\"POST\",route=\"/a\",le=\"0.2\"} 100\n\
                    flotilla_http_request_duration_seconds_bucket{method=\"POST\",route=\"/a\",le=\"+Inf\"} 100\n";
        let b = route_buckets(text);
        let a = &b["POST /a"];
        assert_eq!(quantile(0.5, a), Duration::from_secs_f64(0.1));
        let q = quantile(0.75, a).as_secs_f64();
        assert!((q - 0.15).abs() < 1e-9, "{q}");
        let before = vec![(0.1, 50.0), (0.2, 50.0), (f64::INFINITY, 50.0)];
        let d = delta(a, Some(&before));
        assert_eq!(d.last().map(|x| x.1), Some(50.0));
        assert!((quantile(0.5, &d).as_secs_f64() - 0.15).abs() < 1e-9);
    }
}

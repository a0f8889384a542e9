//! Runner managers as processes of their own: the deployment the load harness models has about
//! 100 jobs per GitLab runner manager, with more managers for more jobs, so a run of more than
//! 100 jobs splits them among [`super::Options::managers`] processes of the harness's own
//! program, each running its share of the jobs as [`Shared::job`] does and reporting back as
//! one JSON line.
//!
//! It matters for the figures, not only for the likeness: every stage process is spawned by
//! `vfork` and `exec`, and both copy and then close the spawner's whole descriptor table. A
//! spawner holding a thousand jobs' pipes and pidfds (and the fake engines' connections) spent
//! more CPU in each child before its `exec` than the driver spent starting up, and it was
//! counted as the driver's: in a 1,000-job burst, 10.4% of the machine's samples (`perf
//! record -a`), and 1.5% with ten managers of 100 jobs.
//!
//! The program must answer `--manager SPEC` by calling [`manager`]: the `load` bench does.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::job::{JobResult, Shared};
use super::report::DriverFigures;
use super::{DRIVERS_PER_TICK, Driver, Engine, Options, Peaks, sample};

/// What the managers measured, summed over them.
#[derive(Default)]
pub(super) struct Managed {
    pub(super) results: Vec<JobResult>,
    pub(super) drivers: DriverFigures,
    pub(super) peaks: Peaks,
    /// The managers' own CPU (their drivers' apart).
    pub(super) own_cpu: Duration,
    pub(super) errors: Vec<String>,
}

/// Runs `jobs` (id and start offset) in `o.managers` processes of this program, job `i` in
/// manager `i % managers`, all timed from `epoch`.
pub(super) async fn run_all(
    o: &Options,
    shared: &Shared,
    jobs: &[(u64, Duration)],
    epoch: SystemTime,
) -> Managed {
    let mut managed = Managed::default();
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            managed
                .errors
                .push(format!("finding the harness's program: {e}"));
            return managed;
        }
    };
    let count = o.managers.max(1);
    // Each manager's output is read as it comes, so none waits on a full pipe for another.
    let mut running = tokio::task::JoinSet::new();
    for m in 0..count {
        let share: Vec<Value> = jobs
            .iter()
            .skip(m)
            .step_by(count)
            .map(|(id, at)| json!([id, at.as_secs_f64()]))
            .collect();
        let spec = json!({
            "flotilla": o.flotilla,
            "driver": match &o.driver {
                Driver::Lean => "lean".to_string(),
                Driver::Full => "full".to_string(),
                Driver::At(path) => path.display().to_string(),
            },
            "script_time": o.script_time.as_secs_f64(),
            "dir": shared.dir,
            "jobs_dir": shared.jobs_dir,
            "api": shared.api,
            "token_file": shared.token_file,
            "helper": shared.helper,
            "per_tick": DRIVERS_PER_TICK.div_ceil(count),
            "epoch": epoch.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64(),
            "jobs": share,
        });
        let file = shared.dir.join(format!("manager-{m}.json"));
        if let Err(e) = std::fs::write(&file, spec.to_string()) {
            managed
                .errors
                .push(format!("writing manager {m}'s spec: {e}"));
            continue;
        }
        let child = tokio::process::Command::new(&program)
            .arg("--manager")
            .arg(&file)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        match child {
            Ok(child) => {
                running.spawn(async move { (m, child.wait_with_output().await) });
            }
            Err(e) => managed.errors.push(format!("starting manager {m}: {e}")),
        }
    }
    while let Some(joined) = running.join_next().await {
        let Ok((m, waited)) = joined else {
            managed.errors.push("a manager's waiter panicked".into());
            continue;
        };
        match waited {
            Ok(out) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout);
                match serde_json::from_str::<Value>(text.trim()) {
                    Ok(report) => merge(&mut managed, &report),
                    Err(e) => managed
                        .errors
                        .push(format!("manager {m}'s report: {e}: {text}")),
                }
            }
            Ok(out) => managed.errors.push(format!(
                "manager {m} ended {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => managed.errors.push(format!("waiting for manager {m}: {e}")),
        }
    }
    managed
}

fn secs(v: &Value) -> Option<Duration> {
    v.as_f64()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Adds one manager's report: its jobs, and its drivers' figures (the live drivers and their
/// summed PSS as the sum of the managers' peaks, which a burst reaches together).
fn merge(into: &mut Managed, report: &Value) {
    for job in report["jobs"].as_array().into_iter().flatten() {
        into.results.push(JobResult {
            prepare: secs(&job["prepare"]).unwrap_or_default(),
            to_first_byte: secs(&job["to_first_byte"]),
            end_to_end: secs(&job["end_to_end"]).unwrap_or_default(),
            errors: job["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str().map(str::to_string))
                .collect(),
        });
    }
    into.drivers.processes += count(report, "processes");
    into.drivers.cpu += secs(&report["cpu"]).unwrap_or_default();
    into.own_cpu += secs(&report["own_cpu"]).unwrap_or_default();
    let p = &mut into.peaks;
    p.live += count(report, "live");
    p.summed += count(report, "summed");
    p.threads = p.threads.max(count(report, "threads"));
    for (stage, peak) in report["by_stage"].as_object().into_iter().flatten() {
        let at = p.by_stage.entry(stage.clone()).or_default();
        *at = (*at).max(peak.as_u64().unwrap_or(0));
    }
}

/// A manager process: runs the jobs of the spec in file `spec`, samples its own drivers, and
/// returns its report as one line of JSON for the harness.
pub async fn manager(spec: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(spec).map_err(|e| format!("{}: {e}", spec.display()))?;
    let spec: Value = serde_json::from_str(&text).map_err(|e| format!("the spec: {e}"))?;
    let field = |key: &str| -> Result<&str, String> {
        spec[key]
            .as_str()
            .ok_or_else(|| format!("the spec has no {key}"))
    };
    let flotilla = PathBuf::from(field("flotilla")?);
    let mut options = Options::new(&flotilla, 1, Engine::Fake);
    options.driver = match field("driver")? {
        "lean" => Driver::Lean,
        "full" => Driver::Full,
        path => Driver::At(path.into()),
    };
    options.script_time = secs(&spec["script_time"]).unwrap_or(options.script_time);
    let shared = Arc::new(Shared {
        options,
        dir: field("dir")?.into(),
        jobs_dir: field("jobs_dir")?.into(),
        api: field("api")?.to_string(),
        metrics: String::new(),
        token_file: field("token_file")?.into(),
        helper: field("helper")?.to_string(),
        live: Mutex::new(HashMap::new()),
        drivers: Mutex::new(DriverFigures::default()),
    });
    let epoch = UNIX_EPOCH + secs(&spec["epoch"]).unwrap_or_default();
    let now = (Instant::now(), SystemTime::now());
    let began = match epoch.duration_since(now.1) {
        Ok(ahead) => now.0 + ahead,
        Err(behind) => now.0.checked_sub(behind.duration()).unwrap_or(now.0),
    };
    let per_tick = usize::try_from(count(&spec, "per_tick")).unwrap_or(DRIVERS_PER_TICK);
    let own = || {
        sample::read(std::process::id())
            .map(|r| r.cpu)
            .unwrap_or_default()
    };
    let own_before = own();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn(super::sample(shared.clone(), None, per_tick, stop.clone()));
    let mut jobs = tokio::task::JoinSet::new();
    for job in spec["jobs"].as_array().into_iter().flatten() {
        let (Some(id), Some(at)) = (job[0].as_u64(), secs(&job[1])) else {
            return Err(format!("a job of the spec: {job}"));
        };
        tokio::time::sleep_until((began + at).into()).await;
        let shared = shared.clone();
        jobs.spawn(async move { shared.job(id).await });
    }
    let mut results = Vec::new();
    while let Some(done) = jobs.join_next().await {
        if let Ok(result) = done {
            results.push(result);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peaks = sampler.await.unwrap_or_default();
    let drivers = shared
        .drivers
        .lock()
        .map_err(|_| "the drivers' figures".to_string())?
        .clone();
    let own_cpu = own().saturating_sub(own_before);
    Ok(encode(&results, &drivers, &peaks, own_cpu).to_string())
}

/// A manager's report, as [`merge`] reads it.
fn encode(
    results: &[JobResult],
    drivers: &DriverFigures,
    peaks: &Peaks,
    own_cpu: Duration,
) -> Value {
    json!({
        "jobs": results.iter().map(|r| json!({
            "prepare": r.prepare.as_secs_f64(),
            "to_first_byte": r.to_first_byte.map(|d| d.as_secs_f64()),
            "end_to_end": r.end_to_end.as_secs_f64(),
            "errors": r.errors,
        })).collect::<Vec<_>>(),
        "processes": drivers.processes,
        "cpu": drivers.cpu.as_secs_f64(),
        "own_cpu": own_cpu.as_secs_f64(),
        "live": peaks.live,
        "summed": peaks.summed,
        "threads": peaks.threads,
        "by_stage": peaks.by_stage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(prepare_ms: u64, first_byte_ms: Option<u64>, errors: &[&str]) -> JobResult {
        JobResult {
            prepare: Duration::from_millis(prepare_ms),
            to_first_byte: first_byte_ms.map(Duration::from_millis),
            end_to_end: Duration::from_millis(prepare_ms * 3),
            errors: errors.iter().map(|e| e.to_string()).collect(),
        }
    }

    /// Two managers' reports, as they print them, add up to what one harness would have
    /// counted: every job with its timings and errors, the drivers' processes and CPU, the
    /// live drivers and their PSS summed, the largest peak of each stage.
    #[test]
    fn managers_reports_add_up() {
        let mut peaks = Peaks {
            live: 100,
            summed: 70 << 20,
            threads: 1,
            ..Peaks::default()
        };
        peaks.by_stage.insert("prepare".into(), 6 << 20);
        let drivers = DriverFigures {
            processes: 700,
            cpu: Duration::from_millis(1700),
            ..DriverFigures::default()
        };
        let first = encode(
            &[
                job(100, Some(250), &[]),
                job(120, None, &["job 7 prepare: exit Some(2)"]),
            ],
            &drivers,
            &peaks,
            Duration::from_millis(300),
        );
        peaks.by_stage.insert("prepare".into(), 7 << 20);
        peaks.by_stage.insert("cleanup".into(), 5 << 20);
        let second = encode(
            &[job(90, Some(200), &[])],
            &drivers,
            &peaks,
            Duration::from_millis(200),
        );
        let mut managed = Managed::default();
        for report in [first, second] {
            // Through the text the manager prints.
            let line: Value = serde_json::from_str(&report.to_string()).expect("a JSON line");
            merge(&mut managed, &line);
        }
        let firsts: Vec<Option<Duration>> =
            managed.results.iter().map(|r| r.to_first_byte).collect();
        assert_eq!(
            firsts,
            [
                Some(Duration::from_millis(250)),
                None,
                Some(Duration::from_millis(200))
            ]
        );
        assert_eq!(managed.results[1].errors, ["job 7 prepare: exit Some(2)"]);
        assert_eq!(managed.results[2].prepare, Duration::from_millis(90));
        assert_eq!(managed.results[2].end_to_end, Duration::from_millis(270));
        assert_eq!(managed.drivers.processes, 1400);
        assert_eq!(managed.drivers.cpu, Duration::from_millis(3400));
        assert_eq!(managed.own_cpu, Duration::from_millis(500));
        assert_eq!((managed.peaks.live, managed.peaks.summed), (200, 140 << 20));
        assert_eq!(managed.peaks.by_stage["prepare"], 7 << 20);
        assert_eq!(managed.peaks.by_stage["cleanup"], 5 << 20);
    }
}

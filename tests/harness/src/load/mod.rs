//! The load harness: N synthetic GitLab jobs, each run as GitLab Runner's Custom executor runs
//! one, through the real `flotilla` binary, against a real `flotilla run` serving loopback
//! sshd machines (the static wasm plugin), with a real `dockerd` or the [`FakeEngine`] behind
//! the machines' forwarded socket.
//!
//! A job is one process per stage, in the runner's order and with its environment (the
//! runner's exit-code variables, `JOB_RESPONSE_FILE`, the job's variables as `CUSTOM_ENV_*`):
//! `config`, `prepare`, `run` for `prepare_script`, `get_sources`, `build_script` and
//! `cleanup_file_variables`, then `cleanup`, which runs even after a failed stage, as the
//! runner's does. Each stage process is reaped by the harness itself, so its CPU time and peak
//! RSS are its own ([`reap`]).
//!
//! The [`Report`] has the drivers' timings (`prepare`, `prepare` to the first byte of
//! `build_script`'s output, the overhead of a job beyond its script), the server's own
//! per-route latencies from its histogram, and both sides' resources. An error is any stage
//! that did not end 0, anything left on the engine or in the pool afterwards, and any engine
//! request the fake did not know.

mod fleet;
mod job;
mod manager;
pub mod reap;
pub mod report;
pub mod sample;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet::{Host, Running, config, gauge, get};
use flotilla_peers::sshd::Sshd;
use job::{JobResult, Shared};
pub use manager::manager;
pub use report::Report;
use report::{DriverFigures, HostFigures, Summary};

const TOKEN: &str = "load-harness-token-0123456789abcdef";
const IMAGE: &str = "flotilla-load/busybox:1";
const HELPER: &str = "flotilla-load/helper:1";
/// A runner manager's jobs, as the deployment the issue describes runs them (about 100 each).
const JOBS_PER_MANAGER: usize = 100;
/// The live drivers the sampler reads at each tick, over all managers.
const DRIVERS_PER_TICK: usize = 100;

/// The engine behind the machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// A real `dockerd` (root); jobs make real containers.
    Dockerd,
    /// [`FakeEngine`]: only the endpoints the driver uses, at a map lookup each.
    Fake,
}

/// The pool's plugin, and so where its machines come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    /// The static wasm plugin: the machines are listed in its settings.
    Static,
    /// The GCP wasm plugin against the Compute stand-in (`flotilla_peers::gcp_cloud`), whose
    /// managed instance group creates instances at the machines' loopback addresses; each
    /// `instances.get` (the plugin's `connect-info`) answers after this latency.
    Gcp(Duration),
}

/// When the jobs come.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// All at once.
    Burst,
    /// A Poisson process of this many jobs a second (seeded: runs repeat).
    Poisson(f64),
}

/// The runner manager's driver, started once per stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    /// `flotilla-gitlab STAGE`, the lean binary beside `flotilla`.
    Lean,
    /// `flotilla gitlab STAGE`, the full binary.
    Full,
    /// A lean driver built elsewhere (the static musl release binary, as shipped).
    At(PathBuf),
}

/// One run's shape.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `flotilla` binary.
    pub flotilla: PathBuf,
    /// What the runner manager runs for each stage.
    pub driver: Driver,
    pub jobs: usize,
    pub arrivals: Arrivals,
    pub engine: Engine,
    pub plugin: Plugin,
    pub machines: usize,
    /// Jobs per machine.
    pub capacity: u32,
    /// How long each job's `build_script` runs.
    pub script_time: Duration,
    /// Runner managers: processes of this program that spawn the stage processes, each for
    /// its share of the jobs ([`manager`]). 1 runs every job in the harness itself.
    pub managers: usize,
}

impl Options {
    /// `jobs` jobs on `engine`, all at once, on enough machines of up to 20 jobs each.
    pub fn new(flotilla: &Path, jobs: usize, engine: Engine) -> Options {
        let machines = jobs.div_ceil(20).clamp(1, 50);
        Options {
            flotilla: flotilla.to_path_buf(),
            driver: Driver::Lean,
            jobs,
            arrivals: Arrivals::Burst,
            engine,
            plugin: Plugin::Static,
            machines,
            capacity: u32::try_from(jobs.div_ceil(machines))
                .unwrap_or(u32::MAX)
                .max(1),
            script_time: Duration::from_secs(5),
            managers: jobs.div_ceil(JOBS_PER_MANAGER).max(1),
        }
    }

    /// A one-line name of the run, for its report.
    pub fn title(&self) -> String {
        let arrivals = match self.arrivals {
            Arrivals::Burst => "all at once".to_string(),
            Arrivals::Poisson(rate) => format!("Poisson, {rate} jobs/s"),
        };
        let engine = match self.engine {
            Engine::Dockerd => "a real dockerd",
            Engine::Fake => "the fake engine",
        };
        let plugin = match self.plugin {
            Plugin::Static => "static plugin".to_string(),
            Plugin::Gcp(latency) => {
                format!("GCP plugin ({} ms instances.get)", latency.as_millis())
            }
        };
        let driver = match &self.driver {
            Driver::Lean => String::new(),
            Driver::Full => ", `flotilla gitlab` as the driver".to_string(),
            Driver::At(path) => format!(", the driver {}", path.display()),
        };
        let managers = match self.managers {
            0 | 1 => String::new(),
            m => format!(", {m} runner managers"),
        };
        format!(
            "{} jobs, {arrivals}, {engine}, {plugin}, {} machines × {} jobs, {} s script{driver}{managers}",
            self.jobs,
            self.machines,
            self.capacity,
            self.script_time.as_secs_f64()
        )
    }

    /// The program and first arguments of a stage process.
    pub fn driver_command(&self) -> (PathBuf, &'static [&'static str]) {
        match &self.driver {
            Driver::Lean => (
                self.flotilla
                    .with_file_name(format!("flotilla-gitlab{}", std::env::consts::EXE_SUFFIX)),
                &[],
            ),
            Driver::Full => (self.flotilla.clone(), &["gitlab"]),
            Driver::At(path) => (path.clone(), &[]),
        }
    }
}

/// The start offsets of `n` jobs.
fn arrivals(n: usize, how: Arrivals) -> Vec<Duration> {
    match how {
        Arrivals::Burst => vec![Duration::ZERO; n],
        Arrivals::Poisson(rate) => {
            // xorshift64*, seeded: the same schedule every run.
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let mut at = 0.0;
            (0..n)
                .map(|_| {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    let u =
                        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
                    at += -(1.0 - u).ln() / rate.max(1e-9);
                    Duration::from_secs_f64(at)
                })
                .collect()
        }
    }
}

/// The highest readings of the run, both sides.
#[derive(Default)]
struct Peaks {
    host: HostFigures,
    live: u64,
    summed: u64,
    threads: u64,
    /// The largest `VmHWM` read of a driver, by stage.
    by_stage: BTreeMap<String, u64>,
}

/// Samples Flotilla (`host`, when given) every 250 ms (its descriptors every second) and up to
/// `per_tick` live drivers with it (taken in turn), the server's gauges every second, and the
/// drivers' summed PSS when there are more of them alive than at its last sum (at most every
/// two seconds), until `stop` is set.
///
/// The sampler runs on the cores it measures: reading every one of a thousand live drivers'
/// `/proc` status four times a second cost about 1 ms of CPU a job, as much as the host's
/// kept engine connections saved. A driver lives long enough to be read at some point (a
/// stage runs from milliseconds to the script's length), so its peak is still seen. The PSS
/// sum walks every live driver's page tables (`smaps_rollup`): 3% of a 1,000-job burst's
/// samples once a second, 1.5% once every two; the drivers of a burst stay at their high for
/// seconds, and a driver's PSS is about the same in every stage.
///
/// A driver's peak RSS is its `VmHWM` as last read while it lived: `wait4`'s `ru_maxrss`
/// cannot be used, as Linux records the spawner's own peak into it when a `vfork`ed child
/// execs (`exec_mmap`), and this harness is far larger than a driver.
async fn sample(
    shared: Arc<Shared>,
    host: Option<u32>,
    per_tick: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Peaks {
    let mut peaks = Peaks::default();
    let mut tick = 0u64;
    // The live drivers at the last PSS sum.
    let mut summed_at = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        // Flotilla's descriptors once a second: each is a `readlink`, and it holds thousands.
        let h = &mut peaks.host;
        if let Some(r) = host
            .filter(|_| tick.is_multiple_of(4))
            .and_then(sample::read)
        {
            h.peak_rss = h.peak_rss.max(r.peak_rss);
            h.max_threads = h.max_threads.max(r.threads);
            h.max_fds = h.max_fds.max(r.fds);
            h.max_sockets = h.max_sockets.max(r.sockets);
        } else if let Some((peak, threads)) = host.and_then(sample::peak) {
            h.peak_rss = h.peak_rss.max(peak);
            h.max_threads = h.max_threads.max(threads);
        }
        let live: Vec<(u32, String)> = shared
            .live
            .lock()
            .expect("live")
            .iter()
            .map(|(p, s)| (*p, s.clone()))
            .collect();
        peaks.live = peaks.live.max(live.len() as u64);
        let turn = usize::try_from(tick).unwrap_or_default() * per_tick;
        let start = turn.checked_rem(live.len()).unwrap_or_default();
        let taken = live
            .iter()
            .cycle()
            .skip(start)
            .take(live.len().min(per_tick));
        for (p, stage) in taken {
            if let Some((peak, threads)) = sample::peak(*p) {
                peaks.threads = peaks.threads.max(threads);
                let at = peaks.by_stage.entry(stage.clone()).or_default();
                *at = (*at).max(peak);
            }
        }
        if tick.is_multiple_of(4) && host.is_some() {
            let (_, metrics) = get(&shared.metrics, "/metrics").await;
            let h = &mut peaks.host;
            h.max_in_flight = h
                .max_in_flight
                .max(gauge(&metrics, "flotilla_http_requests_in_flight"));
            h.max_streams = h
                .max_streams
                .max(gauge(&metrics, "flotilla_docker_streams_open"));
        }
        // At most every two seconds, and only at a new high of live drivers.
        if tick.is_multiple_of(8) && live.len() > summed_at {
            summed_at = live.len();
            let summed: u64 = live.iter().filter_map(|(p, _)| sample::pss(*p)).sum();
            peaks.summed = peaks.summed.max(summed);
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    peaks
}

/// The series of `after` that `keep` names, less what `before` counted: count and percentiles.
fn between(
    before: BTreeMap<String, report::Buckets>,
    after: BTreeMap<String, report::Buckets>,
    keep: impl Fn(&str) -> bool,
) -> Vec<(String, u64, Summary)> {
    after
        .into_iter()
        .filter(|(key, _)| keep(key))
        .map(|(key, buckets)| {
            let d = report::delta(&buckets, before.get(&key));
            let count = d.last().map_or(0.0, |b| b.1) as u64;
            let s = Summary {
                p50: report::quantile(0.5, &d),
                p95: report::quantile(0.95, &d),
                p99: report::quantile(0.99, &d),
                max: Duration::ZERO,
            };
            (key, count, s)
        })
        .filter(|(_, count, _)| *count > 0)
        .collect()
}

/// A started fleet: the engines, the machines and `flotilla run`, for [`run`] or for a test
/// that drives a job stage by stage.
pub struct Fleet {
    host: Host,
    shared: Arc<Shared>,
    engine: Running,
    sshds: Vec<Sshd>,
    _cloud: Option<flotilla_peers::gcp_cloud::GcpCloud>,
    _jobs: Option<tempfile::TempDir>,
    _dir: tempfile::TempDir,
}

/// A directory on tmpfs (`/dev/shm`) for the jobs' own files, the runner manager's temporary
/// files: each job's response file and its stage scripts, written and removed by the
/// thousand. On a journal-less ext4, as this machine's `/` is, every new file scans the
/// recently deleted inodes for one to reuse (`recently_deleted` in `find_inode_bit`): in a
/// 1,000-job burst, 4.6% of the machine's samples went to creating the jobs' files, 9.8% when
/// ten runner managers created them. `None` (the fleet's own directory, beside the driver's
/// state) where there is no `/dev/shm`.
fn jobs_dir() -> Option<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("flotilla-load-jobs")
        .tempdir_in("/dev/shm")
        .ok()
}

impl Fleet {
    /// Starts what `o` describes and waits until every machine is ready.
    pub async fn start(o: &Options) -> Fleet {
        reap::raise_fd_limit();
        let dir = tempfile::tempdir().expect("dir");
        let key = dir.path().join("id_ed25519");
        let made = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen");
        assert!(made.success(), "ssh-keygen failed");
        let public = std::fs::read_to_string(key.with_extension("pub")).expect("public key");
        let engine = Running::start(o.engine, o.script_time, o.machines);
        let cloud = match o.plugin {
            Plugin::Static => None,
            Plugin::Gcp(latency) => Some(fleet::gcp_cloud(latency).await),
        };
        let sshds = fleet::machines(o, public.trim(), &engine);
        let jobs = jobs_dir();
        let token_file = dir.path().join("token");
        crate::write_secret(&token_file, TOKEN);
        let text = config(o, &key, &engine.socket(), &sshds, cloud.as_ref());
        let host = Host::start(o, dir.path(), &text).await;
        let shared = Arc::new(Shared {
            options: o.clone(),
            dir: dir.path().to_path_buf(),
            jobs_dir: jobs
                .as_ref()
                .map_or_else(|| dir.path().to_path_buf(), |j| j.path().to_path_buf()),
            api: host.api.clone(),
            metrics: host.metrics.clone(),
            token_file,
            helper: HELPER.to_string(),
            live: Mutex::new(HashMap::new()),
            drivers: Mutex::new(DriverFigures::default()),
        });
        Fleet {
            host,
            shared,
            engine,
            sshds,
            _cloud: cloud,
            _jobs: jobs,
            _dir: dir,
        }
    }

    /// The fake engines, one per machine (none on a real dockerd).
    pub fn engines(&self) -> &[flotilla_peers::fake_engine::FakeEngine] {
        match &self.engine {
            Running::Fake(all, _) => all,
            Running::Real(_) => &[],
        }
    }

    /// Stage `args` of job `id` (`["prepare"]`, `["run", script, "build_script"]`...) as the
    /// runner starts it, output piped; the caller waits for it or kills it.
    pub fn spawn_stage(&self, id: u64, args: &[&str]) -> std::process::Child {
        let (dir, env) = self.shared.setup(id);
        self.shared
            .command(&dir, &env, args)
            .spawn()
            .expect("the driver")
    }

    /// The host's log so far.
    pub fn log(&self) -> String {
        self.host.daemon.own_log()
    }

    /// `method path` on the host's API with its token (`body`: JSON, or empty): the status
    /// and the answer's body.
    pub async fn api(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        fleet::call(&self.host.api, method, path, body).await
    }

    /// Releases job `id`'s lease through the API, behind its driver's back.
    pub async fn release_lease_of(&self, id: u64) {
        let (code, found) = self
            .api(
                "GET",
                &format!("/v1/pools/ci/leases?label=gitlab-job={id}"),
                "",
            )
            .await;
        assert_eq!(code, 200, "{found}");
        let found: serde_json::Value = serde_json::from_str(&found).expect("lease list");
        let lease = found["leases"][0]["id"].as_u64().expect("the job's lease");
        let (code, body) = self
            .api(
                "POST",
                &format!("/v1/pools/ci/leases/{lease}/release"),
                "{}",
            )
            .await;
        assert_eq!(code, 200, "{body}");
    }

    /// How many requests of `method` to `route` (a route pattern, such as
    /// `/v1/pools/{pool}/leases`) the host has answered, from its own metrics.
    pub async fn answered(&self, method: &str, route: &str) -> u64 {
        let (_, metrics) = get(&self.host.metrics, "/metrics").await;
        report::route_buckets(&metrics)
            .get(&format!("{method} {route}"))
            .and_then(|b| b.last())
            .map_or(0, |(_, n)| *n as u64)
    }
}

/// Runs the load `o` describes and measures it.
pub async fn run(o: &Options) -> Report {
    let fleet = Fleet::start(o).await;
    let (host, shared, engine) = (&fleet.host, fleet.shared.clone(), &fleet.engine);
    let pid = host.daemon.id();
    let (_, before) = get(&host.metrics, "/metrics").await;
    let cpu_before = sample::read(pid).map(|r| r.cpu).unwrap_or_default();
    let machines_cpu = || -> Duration {
        fleet
            .sshds
            .iter()
            .filter_map(Sshd::pid)
            .map(sample::tree_cpu)
            .sum()
    };
    let own_cpu = || {
        sample::read(std::process::id())
            .map(|r| r.cpu)
            .unwrap_or_default()
    };
    let (machines_before, own_before) = (machines_cpu(), own_cpu());
    let requests_before = engine.requests();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn(sample(
        shared.clone(),
        Some(pid),
        DRIVERS_PER_TICK,
        stop.clone(),
    ));

    let schedule: Vec<(u64, Duration)> = arrivals(o.jobs, o.arrivals)
        .into_iter()
        .enumerate()
        .map(|(i, at)| (1_000_000 + i as u64, at))
        .collect();
    let (began, managed) = if o.managers > 1 {
        // The managers start their clocks together, a moment from now.
        let lead = Duration::from_millis(500);
        let epoch = std::time::SystemTime::now() + lead;
        let began = Instant::now() + lead;
        (began, manager::run_all(o, &shared, &schedule, epoch).await)
    } else {
        let began = Instant::now();
        let mut jobs = tokio::task::JoinSet::new();
        for (id, at) in schedule {
            tokio::time::sleep_until((began + at).into()).await;
            let shared = shared.clone();
            jobs.spawn(async move { shared.job(id).await });
        }
        let mut managed = manager::Managed::default();
        while let Some(done) = jobs.join_next().await {
            if let Ok(result) = done {
                managed.results.push(result);
            }
        }
        (began, managed)
    };
    let wall = began.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut peaks = sampler.await.unwrap_or_default();
    let results = managed.results;
    peaks.live += managed.peaks.live;
    peaks.summed += managed.peaks.summed;
    peaks.threads = peaks.threads.max(managed.peaks.threads);
    for (stage, peak) in managed.peaks.by_stage {
        let at = peaks.by_stage.entry(stage).or_default();
        *at = (*at).max(peak);
    }
    let cpu_after = sample::read(pid).map(|r| r.cpu).unwrap_or_default();
    let (machines_after, own_after) = (machines_cpu(), own_cpu());
    let requests = engine
        .requests()
        .zip(requests_before)
        .map(|(after, before)| {
            (
                after.0.saturating_sub(before.0),
                after.1.saturating_sub(before.1),
            )
        });
    let (_, after) = get(&host.metrics, "/metrics").await;

    let mut errors = managed.errors;
    errors.extend(results.iter().flat_map(|r| r.errors.clone()));
    if results.len() != o.jobs {
        errors.push(format!("{} of {} job tasks ended", results.len(), o.jobs));
    }
    let (_, leases) = get(&host.api, "/v1/pools/ci/leases").await;
    if !leases.contains("\"leases\":[]") {
        errors.push(format!("leases left in the pool: {leases}"));
    }
    engine.settle().await;
    errors.extend(engine.leftovers());
    let routes = between(
        report::route_buckets(&before),
        report::route_buckets(&after),
        |route| route.contains("/leases"),
    );
    let metric = "flotilla_provider_operation_duration_seconds";
    let plugin_calls = between(
        report::buckets(&before, metric, &["function"]),
        report::buckets(&after, metric, &["function"]),
        |_| true,
    );
    let metric = "flotilla_journal_commit_duration_seconds";
    let journal = between(
        report::buckets(&before, metric, &["outcome"]),
        report::buckets(&after, metric, &["outcome"]),
        |_| true,
    );
    let mut drivers = shared.drivers.lock().expect("drivers").clone();
    drivers.processes += managed.drivers.processes;
    drivers.cpu += managed.drivers.cpu;
    drivers.max_live = peaks.live;
    drivers.max_summed_rss = peaks.summed;
    drivers.max_threads = peaks.threads;
    drivers.max_rss = peaks.by_stage.values().copied().max().unwrap_or(0);
    drivers.peak_by_stage = peaks.by_stage;
    let mut host_figures = peaks.host;
    host_figures.cpu = cpu_after.saturating_sub(cpu_before);
    let accepted = r#"flotilla_connections_accepted_total{listener="api"}"#;
    // Less this run's two scrapes of the metrics listener (a listener of its own).
    host_figures.connections = gauge(&after, accepted).saturating_sub(gauge(&before, accepted));
    let ok: Vec<&JobResult> = results.iter().filter(|r| r.errors.is_empty()).collect();
    let of = |f: &dyn Fn(&JobResult) -> Option<Duration>| -> Summary {
        Summary::of(&ok.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
    };
    Report {
        title: o.title(),
        jobs: o.jobs,
        wall,
        errors,
        prepare: of(&|r| Some(r.prepare)),
        to_first_byte: of(&|r| r.to_first_byte),
        overhead: of(&|r| Some(r.end_to_end.saturating_sub(o.script_time))),
        routes,
        journal,
        plugin_calls,
        machines_cpu: machines_after.saturating_sub(machines_before),
        harness_cpu: own_after.saturating_sub(own_before) + managed.own_cpu,
        host: host_figures,
        drivers,
        engine_stage_runs: engine.stage_runs(),
        engine_requests: requests.map(|(r, _)| r),
        engine_connections: requests.map(|(_, c)| c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_arrivals_repeat_and_keep_their_rate() {
        let a = arrivals(2000, Arrivals::Poisson(10.0));
        assert_eq!(a, arrivals(2000, Arrivals::Poisson(10.0)));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        let span = a.last().expect("some").as_secs_f64();
        assert!(
            (180.0..220.0).contains(&span),
            "2000 jobs at 10/s took {span} s"
        );
        assert_eq!(arrivals(3, Arrivals::Burst), vec![Duration::ZERO; 3]);
    }
}

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

pub mod reap;
pub mod report;
pub mod sample;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use flotilla_peers::dockerd::{Dockerd, busybox_rootfs_tar};
use flotilla_peers::fake_engine::FakeEngine;
use flotilla_peers::process::Daemon;
use flotilla_peers::sshd::Sshd;
use flotilla_peers::{helper_image, poll};
pub use report::Report;
use report::{DriverFigures, HostFigures, Summary};

const TOKEN: &str = "load-harness-token-0123456789abcdef";
const IMAGE: &str = "flotilla-load/busybox:1";
const HELPER: &str = "flotilla-load/helper:1";

/// The engine behind the machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// A real `dockerd` (root); jobs make real containers.
    Dockerd,
    /// [`FakeEngine`]: only the endpoints the driver uses, at a map lookup each.
    Fake,
}

/// When the jobs come.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// All at once.
    Burst,
    /// A Poisson process of this many jobs a second (seeded: runs repeat).
    Poisson(f64),
}

/// One run's shape.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `flotilla` binary.
    pub flotilla: PathBuf,
    pub jobs: usize,
    pub arrivals: Arrivals,
    pub engine: Engine,
    pub machines: usize,
    /// Jobs per machine.
    pub capacity: u32,
    /// How long each job's `build_script` runs.
    pub script_time: Duration,
}

impl Options {
    /// `jobs` jobs on `engine`, all at once, on enough machines of up to 20 jobs each.
    pub fn new(flotilla: &Path, jobs: usize, engine: Engine) -> Options {
        let machines = jobs.div_ceil(20).clamp(1, 50);
        Options {
            flotilla: flotilla.to_path_buf(),
            jobs,
            arrivals: Arrivals::Burst,
            engine,
            machines,
            capacity: u32::try_from(jobs.div_ceil(machines))
                .unwrap_or(u32::MAX)
                .max(1),
            script_time: Duration::from_secs(5),
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
        format!(
            "{} jobs, {arrivals}, {engine}, {} machines × {} jobs, {} s script",
            self.jobs,
            self.machines,
            self.capacity,
            self.script_time.as_secs_f64()
        )
    }
}

/// The engine a run holds while it runs: one real engine every machine shares, or a fake
/// one per machine, each seen at the same path by its machine's sessions.
enum Running {
    Real(Dockerd),
    Fake(Vec<FakeEngine>, tempfile::TempDir),
}

impl Running {
    fn start(engine: Engine, script_time: Duration, machines: usize) -> Running {
        match engine {
            Engine::Fake => Running::Fake(
                (0..machines)
                    .map(|_| FakeEngine::start(script_time))
                    .collect(),
                tempfile::tempdir().expect("dir"),
            ),
            Engine::Dockerd => {
                let docker = Dockerd::start();
                let dir = tempfile::tempdir().expect("dir");
                let helper = helper_image::rootfs_tar(&helper_image::binary(), None);
                for (tar, image) in [(busybox_rootfs_tar(), IMAGE), (helper, HELPER)] {
                    let file = dir.path().join("rootfs.tar");
                    std::fs::write(&file, tar).expect("rootfs");
                    let out = Command::new("docker")
                        .arg("-H")
                        .arg(format!("unix://{}", docker.socket().display()))
                        .arg("--config")
                        .arg(dir.path())
                        .arg("import")
                        .arg(&file)
                        .arg(image)
                        .output()
                        .expect("the docker CLI");
                    assert!(out.status.success(), "docker import: {out:?}");
                }
                Running::Real(docker)
            }
        }
    }

    fn stage_runs(&self) -> Option<u64> {
        match self {
            Running::Fake(all, _) => Some(all.iter().map(|f| f.with(|s| s.stage_runs)).sum()),
            Running::Real(_) => None,
        }
    }

    fn socket(&self) -> PathBuf {
        match self {
            Running::Real(d) => d.socket(),
            Running::Fake(_, shared) => shared.path().join("docker.sock"),
        }
    }

    /// Waits up to 5 s for the engines' connections to close (a channel's close is sent a
    /// moment after its stream is dropped).
    async fn settle(&self) {
        if let Running::Fake(all, _) = self {
            for _ in 0..50 {
                if all.iter().all(|f| f.with(|s| s.open_connections) == 0) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// What the jobs left behind on the engine, and the requests it could not answer.
    fn leftovers(&self) -> Vec<String> {
        match self {
            Running::Fake(all, _) => all
                .iter()
                .flat_map(|f| {
                    f.with(|s| {
                        let mut left: Vec<String> = s
                            .containers
                            .keys()
                            .chain(s.networks.keys())
                            .map(|n| format!("left on the engine: {n}"))
                            .collect();
                        left.extend(s.unknown.iter().map(|r| format!("the fake engine had no answer for {r}")));
                        if s.open_connections > 0 {
                            let mut by: BTreeMap<String, u64> = BTreeMap::new();
                            for line in s.last_request.values() {
                                // The route, without the object's name.
                                let route: Vec<&str> = line.split('/').take(4).collect();
                                *by.entry(route.join("/")).or_default() += 1;
                            }
                            left.push(format!(
                                "{} connection(s) to an engine left open, by their last request: {by:?}",
                                s.open_connections
                            ));
                        }
                        left
                    })
                })
                .collect(),
            Running::Real(d) => {
                let out = Command::new("docker")
                    .arg("-H")
                    .arg(format!("unix://{}", d.socket().display()))
                    .args(["ps", "-aq", "--filter", "label=io.flotilla.gitlab.job"])
                    .output()
                    .expect("the docker CLI");
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|id| format!("left on the engine: container {id}"))
                    .collect()
            }
        }
    }
}

/// The pool's configuration: the machines, the connector, every slot kept idle and ready.
fn config(o: &Options, key: &Path, socket: &Path, sshds: &[Sshd]) -> String {
    let hosts: Vec<String> = sshds
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                "{{ id = \"m{i}\", address = \"127.0.0.1\", port = {}, username = \"root\" }}",
                m.port
            )
        })
        .collect();
    format!(
        r#"[server]
listen = "127.0.0.1:0"
metrics_listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "5s"

[[pool]]
name = "ci"
plugin = "{plugin}"
capacity_per_instance = {capacity}
max_instances = {n}
instance_acquire_timeout = "600s"

[pool.plugin_config]
hosts = [{hosts}]

[pool.connector]
username = "root"
allowed_ranges = ["127.0.0.0/8"]
ssh_key = {{ file = "{key}" }}
docker_socket = "{socket}"

[[pool.policy]]
idle_count = {slots}
idle_time = "1h"
"#,
        plugin = flotilla_test_artifacts::STATIC_PLUGIN,
        capacity = o.capacity,
        n = sshds.len(),
        slots = sshds.len() as u64 * u64::from(o.capacity),
        hosts = hosts.join(", "),
        key = key.display(),
        socket = socket.display(),
    )
}

/// A started `flotilla run`, its API and metrics addresses.
struct Host {
    daemon: Daemon,
    api: String,
    metrics: String,
}

impl Host {
    async fn start(o: &Options, dir: &Path, text: &str) -> Host {
        let file = dir.join("flotilla.toml");
        std::fs::write(&file, text).expect("config");
        let mut command = Command::new(&o.flotilla);
        command
            .args(["run", "-c"])
            .arg(&file)
            .env("FLOTILLA_LOG", "info")
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("XDG_DATA_HOME", dir.join("data"));
        let mut daemon = Daemon::spawn(command, &dir.join("flotilla.log"));
        let limit = Duration::from_secs(120);
        let api = daemon
            .logged("flotilla is listening", "listen", limit)
            .await;
        let metrics = daemon
            .logged("serving /metrics", "metrics_listen", limit)
            .await;
        let host = Host {
            daemon,
            api,
            metrics,
        };
        let want = o.machines;
        poll::until("every machine to be ready", limit, || async {
            let (_, body) = get(&host.api, "/v1/pools/ci/instances").await;
            let ready = body.matches("\"state\":\"ready\"").count();
            if ready == want {
                Ok(())
            } else {
                Err(format!(
                    "{ready} of {want} ready\n{}",
                    host.daemon.own_log()
                ))
            }
        })
        .await;
        host
    }
}

/// `GET path` on `addr` with the API token, HTTP/1.0 (a body without chunks): status and body.
pub async fn get(addr: &str, path: &str) -> (u16, String) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The value of an unlabelled gauge in a `/metrics` text.
fn gauge(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// What every job's stages share.
struct Shared {
    options: Options,
    dir: PathBuf,
    api: String,
    metrics: String,
    token_file: PathBuf,
    helper: String,
    /// Driver processes alive now, and their stage.
    live: Mutex<HashMap<u32, String>>,
    drivers: Mutex<DriverFigures>,
}

/// One stage process's outcome.
struct Stage {
    code: Option<i32>,
    first_byte: Option<Instant>,
    output: String,
}

/// One job's timings, or what failed.
struct JobResult {
    prepare: Duration,
    to_first_byte: Option<Duration>,
    end_to_end: Duration,
    errors: Vec<String>,
}

/// The job's variables as the runner passes them (`CUSTOM_ENV_` + each), a typical set.
fn job_variables(id: u64) -> Vec<(String, String)> {
    let project = 1000 + id % 7;
    let plain = [
        ("CI", "true".to_string()),
        ("GITLAB_CI", "true".to_string()),
        ("CI_JOB_ID", id.to_string()),
        ("CI_JOB_NAME", "build".to_string()),
        ("CI_JOB_STAGE", "test".to_string()),
        ("CI_JOB_IMAGE", IMAGE.to_string()),
        (
            "CI_JOB_URL",
            format!("https://gitlab.example.com/g/p/-/jobs/{id}"),
        ),
        ("CI_PROJECT_ID", project.to_string()),
        ("CI_PROJECT_PATH", format!("group/project-{project}")),
        ("CI_PROJECT_NAME", format!("project-{project}")),
        ("CI_PROJECT_DIR", format!("/builds/group/project-{project}")),
        ("CI_BUILDS_DIR", "/builds".to_string()),
        ("CI_PIPELINE_ID", (id / 3).to_string()),
        ("CI_PIPELINE_SOURCE", "push".to_string()),
        ("CI_COMMIT_SHA", format!("{:040x}", id)),
        ("CI_COMMIT_REF_NAME", "main".to_string()),
        ("CI_COMMIT_BRANCH", "main".to_string()),
        ("CI_DEFAULT_BRANCH", "main".to_string()),
        ("CI_SERVER_URL", "https://gitlab.example.com".to_string()),
        ("CI_SERVER_HOST", "gitlab.example.com".to_string()),
        ("CI_RUNNER_ID", "42".to_string()),
        ("CI_RUNNER_SHORT_TOKEN", "abcdefgh".to_string()),
        ("CI_RUNNER_VERSION", "17.5.0".to_string()),
        ("CI_CONCURRENT_ID", (id % 100).to_string()),
        ("CI_CONCURRENT_PROJECT_ID", "0".to_string()),
        ("GIT_STRATEGY", "none".to_string()),
        ("FF_USE_FASTZIP", "true".to_string()),
    ];
    plain
        .into_iter()
        .map(|(k, v)| (format!("CUSTOM_ENV_{k}"), v))
        .collect()
}

/// The runner's stage scripts: each prints a line; `build_script` then runs for the script time.
fn script(stage: &str, script_time: Duration) -> String {
    match stage {
        "build_script" => format!(
            "#!/usr/bin/env sh\nset -e\necho 'first byte'\nsleep {}\n",
            script_time.as_secs_f64()
        ),
        _ => format!("#!/usr/bin/env sh\nset -e\necho '{stage} done'\n"),
    }
}

impl Shared {
    /// Runs one stage process of `job` to its end.
    async fn stage(&self, job: &Path, env: &[(String, String)], args: &[&str]) -> Stage {
        let mut command = Command::new(&self.options.flotilla);
        command
            .args([
                "gitlab",
                "--url",
                &format!("http://{}", self.api),
                "--pool",
                "ci",
                "--token-file",
            ])
            .arg(&self.token_file)
            .args(["--acquire-timeout", "600s", "--state-dir"])
            .arg(self.dir.join("driver-state"))
            .args([
                "--helper-image",
                &self.helper,
                "--pull-policy",
                "if-not-present",
            ])
            .args(args)
            .current_dir(job)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                return Stage {
                    code: None,
                    first_byte: None,
                    output: format!("spawning the driver: {e}"),
                };
            }
        };
        let pid = child.id();
        let stage = if args.first() == Some(&"run") {
            args.get(2)
        } else {
            args.first()
        };
        let stage = stage.unwrap_or(&"?").to_string();
        self.live.lock().expect("live").insert(pid, stage);
        let stdout = child
            .stdout
            .take()
            .and_then(|s| tokio::process::ChildStdout::from_std(s).ok());
        let stderr = child
            .stderr
            .take()
            .and_then(|s| tokio::process::ChildStderr::from_std(s).ok());
        let read_out = async {
            let mut first = None;
            let mut all = Vec::new();
            if let Some(mut out) = stdout {
                let mut buf = [0u8; 4096];
                while let Ok(n) = out.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    first.get_or_insert_with(Instant::now);
                    all.extend_from_slice(buf.get(..n).unwrap_or_default());
                }
            }
            (first, all)
        };
        let read_err = async {
            let mut all = Vec::new();
            if let Some(mut err) = stderr {
                let _ = err.read_to_end(&mut all).await;
            }
            all
        };
        let ((first_byte, out), err) = tokio::join!(read_out, read_err);
        let ended = reap::wait(pid).await;
        self.live.lock().expect("live").remove(&pid);
        // The std handle must not be dropped unreaped into a later wait of its own: it has no
        // such wait, and the pid was reaped above.
        drop(child);
        let ended = ended.unwrap_or_default();
        {
            let mut d = self.drivers.lock().expect("drivers");
            d.processes += 1;
            d.cpu += ended.cpu;
        }
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        );
        Stage {
            code: ended.code,
            first_byte,
            output,
        }
    }

    /// One job, as the runner runs it.
    async fn job(&self, id: u64) -> JobResult {
        let dir = self.dir.join(format!("job-{id}"));
        std::fs::create_dir_all(&dir).expect("job dir");
        let response = dir.join("response.json");
        std::fs::write(
            &response,
            format!(
                r#"{{"id": {id}, "token": "glcbt-load", "job_info": {{"project_id": {}, "name": "build"}}, "git_info": {{"ref": "main", "protected": false}}}}"#,
                1000 + id % 7
            ),
        )
        .expect("response file");
        let mut env = vec![
            ("BUILD_FAILURE_EXIT_CODE".to_string(), "1".to_string()),
            ("SYSTEM_FAILURE_EXIT_CODE".to_string(), "2".to_string()),
            (
                "BUILD_EXIT_CODE_FILE".to_string(),
                dir.join("build_exit_code").display().to_string(),
            ),
            (
                "JOB_RESPONSE_FILE".to_string(),
                response.display().to_string(),
            ),
            ("TMPDIR".to_string(), dir.display().to_string()),
        ];
        env.extend(job_variables(id));
        let mut errors = Vec::new();
        let mut check = |name: &str, stage: &Stage| -> bool {
            if stage.code == Some(0) {
                return true;
            }
            let tail: String = stage
                .output
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            errors.push(format!("job {id} {name}: exit {:?}: {tail}", stage.code));
            false
        };
        let start = Instant::now();
        let mut prepare = Duration::ZERO;
        let mut to_first_byte = None;
        let config = self.stage(&dir, &env, &["config"]).await;
        if check("config", &config) {
            let began = Instant::now();
            let prepared = self.stage(&dir, &env, &["prepare"]).await;
            prepare = began.elapsed();
            if check("prepare", &prepared) {
                for name in [
                    "prepare_script",
                    "get_sources",
                    "build_script",
                    "cleanup_file_variables",
                ] {
                    let path = dir.join(format!("script-{name}"));
                    std::fs::write(&path, script(name, self.options.script_time)).expect("script");
                    let path = path.display().to_string();
                    let ran = self.stage(&dir, &env, &["run", &path, name]).await;
                    if name == "build_script" {
                        to_first_byte = ran.first_byte.map(|t| t.duration_since(began));
                    }
                    if !check(name, &ran) {
                        break;
                    }
                }
            }
        }
        let cleaned = self.stage(&dir, &env, &["cleanup"]).await;
        check("cleanup", &cleaned);
        let _ = std::fs::remove_dir_all(&dir);
        JobResult {
            prepare,
            to_first_byte,
            end_to_end: start.elapsed(),
            errors,
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
    by_stage: std::collections::BTreeMap<String, u64>,
}

/// Samples Flotilla and every live driver every 250 ms, and the drivers' summed PSS and the
/// server's gauges every second, until `stop` is set.
///
/// A driver's peak RSS is its `VmHWM` as last read while it lived: `wait4`'s `ru_maxrss`
/// cannot be used, as Linux records the spawner's own peak into it when a `vfork`ed child
/// execs (`exec_mmap`), and this harness is far larger than a driver.
async fn sample(shared: Arc<Shared>, pid: u32, stop: Arc<std::sync::atomic::AtomicBool>) -> Peaks {
    let mut peaks = Peaks::default();
    let mut tick = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if let Some(r) = sample::read(pid) {
            let h = &mut peaks.host;
            h.peak_rss = h.peak_rss.max(r.peak_rss);
            h.max_threads = h.max_threads.max(r.threads);
            h.max_fds = h.max_fds.max(r.fds);
            h.max_sockets = h.max_sockets.max(r.sockets);
        }
        let live: Vec<(u32, String)> = shared
            .live
            .lock()
            .expect("live")
            .iter()
            .map(|(p, s)| (*p, s.clone()))
            .collect();
        peaks.live = peaks.live.max(live.len() as u64);
        for (p, stage) in &live {
            if let Some((peak, threads)) = sample::peak(*p) {
                peaks.threads = peaks.threads.max(threads);
                let at = peaks.by_stage.entry(stage.clone()).or_default();
                *at = (*at).max(peak);
            }
        }
        if tick % 4 == 0 {
            let (_, metrics) = get(&shared.metrics, "/metrics").await;
            let h = &mut peaks.host;
            h.max_in_flight = h
                .max_in_flight
                .max(gauge(&metrics, "flotilla_http_requests_in_flight"));
            h.max_streams = h
                .max_streams
                .max(gauge(&metrics, "flotilla_docker_streams_open"));
            let summed: u64 = live.iter().filter_map(|(p, _)| sample::pss(*p)).sum();
            peaks.summed = peaks.summed.max(summed);
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    peaks
}

/// Runs the load `o` describes and measures it.
pub async fn run(o: &Options) -> Report {
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
    let sshds: Vec<Sshd> = match &engine {
        Running::Real(_) => (0..o.machines)
            .map(|_| Sshd::start(public.trim()))
            .collect(),
        Running::Fake(all, _) => all
            .iter()
            .map(|f| Sshd::start_with_engine(public.trim(), &f.socket(), &engine.socket()))
            .collect(),
    };
    let token_file = dir.path().join("token");
    crate::write_secret(&token_file, TOKEN);
    let host = Host::start(o, dir.path(), &config(o, &key, &engine.socket(), &sshds)).await;
    let shared = Arc::new(Shared {
        options: o.clone(),
        dir: dir.path().to_path_buf(),
        api: host.api.clone(),
        metrics: host.metrics.clone(),
        token_file,
        helper: HELPER.to_string(),
        live: Mutex::new(HashMap::new()),
        drivers: Mutex::new(DriverFigures::default()),
    });
    let pid = host.daemon.id();
    let (_, before) = get(&host.metrics, "/metrics").await;
    let cpu_before = sample::read(pid).map(|r| r.cpu).unwrap_or_default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn(sample(shared.clone(), pid, stop.clone()));

    let began = Instant::now();
    let mut jobs = tokio::task::JoinSet::new();
    for (i, at) in arrivals(o.jobs, o.arrivals).into_iter().enumerate() {
        tokio::time::sleep_until((began + at).into()).await;
        let shared = shared.clone();
        jobs.spawn(async move { shared.job(1_000_000 + i as u64).await });
    }
    let mut results = Vec::new();
    while let Some(done) = jobs.join_next().await {
        if let Ok(result) = done {
            results.push(result);
        }
    }
    let wall = began.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peaks = sampler.await.unwrap_or_default();
    let cpu_after = sample::read(pid).map(|r| r.cpu).unwrap_or_default();
    let (_, after) = get(&host.metrics, "/metrics").await;

    let mut errors: Vec<String> = results.iter().flat_map(|r| r.errors.clone()).collect();
    if results.len() != o.jobs {
        errors.push(format!("{} of {} job tasks ended", results.len(), o.jobs));
    }
    let (_, leases) = get(&host.api, "/v1/pools/ci/leases").await;
    if !leases.contains("\"leases\":[]") {
        errors.push(format!("leases left in the pool: {leases}"));
    }
    engine.settle().await;
    errors.extend(engine.leftovers());
    let before = report::route_buckets(&before);
    let routes = report::route_buckets(&after)
        .into_iter()
        .filter(|(route, _)| route.contains("/leases"))
        .map(|(route, buckets)| {
            let d = report::delta(&buckets, before.get(&route));
            let count = d.last().map_or(0.0, |b| b.1) as u64;
            let s = Summary {
                p50: report::quantile(0.5, &d),
                p95: report::quantile(0.95, &d),
                p99: report::quantile(0.99, &d),
                max: Duration::ZERO,
            };
            (route, count, s)
        })
        .filter(|(_, count, _)| *count > 0)
        .collect();
    let mut drivers = shared.drivers.lock().expect("drivers").clone();
    drivers.max_live = peaks.live;
    drivers.max_summed_rss = peaks.summed;
    drivers.max_threads = peaks.threads;
    drivers.max_rss = peaks.by_stage.values().copied().max().unwrap_or(0);
    drivers.peak_by_stage = peaks.by_stage;
    let mut host_figures = peaks.host;
    host_figures.cpu = cpu_after.saturating_sub(cpu_before);
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
        host: host_figures,
        drivers,
        engine_stage_runs: engine.stage_runs(),
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

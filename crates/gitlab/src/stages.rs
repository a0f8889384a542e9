//! The four stages. Each finds the job's lease by its label and the job's objects on the
//! instance by their names and labels, so nothing is kept between stages; each can run again
//! after a failure, and `cleanup` works from any point `prepare` reached.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, ListContainersOptions, RemoveContainerOptions,
    RemoveVolumeOptions, UploadToContainerOptions,
};
use futures_util::StreamExt;

use crate::api::{ApiClient, ApiError, LeaseInfo};
use crate::job::{DriverSettings, Job, PullPolicy, Service};

/// How a stage ended, for the process's exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Success,
    /// The job failed with this exit code (`BUILD_FAILURE_EXIT_CODE`).
    BuildFailure(i64),
    /// The infrastructure failed (`SYSTEM_FAILURE_EXIT_CODE`); the message says why.
    SystemFailure(String),
}

impl Outcome {
    /// The exit code for the runner, writing `BUILD_EXIT_CODE_FILE` for a job failure.
    pub fn exit_code(&self, job: Option<&Job>) -> i32 {
        let (build, system) = job.map_or((1, 2), |j| (j.build_failure, j.system_failure));
        match self {
            Outcome::Success => 0,
            Outcome::BuildFailure(code) => {
                if let Some(file) = job.and_then(|j| j.build_exit_code_file.as_ref()) {
                    // The runner then reports the job's own code (allow_failure:exit_codes).
                    if let Err(e) = std::fs::write(file, format!("{code}\n")) {
                        eprintln!("flotilla: cannot write {}: {e}", file.display());
                    }
                }
                build
            }
            Outcome::SystemFailure(_) => system,
        }
    }
}

/// The label on every object the driver creates, with the job id.
pub const JOB_LABEL: &str = "io.flotilla.gitlab.job";

fn system(what: impl std::fmt::Display) -> Outcome {
    Outcome::SystemFailure(what.to_string())
}

/// Prints one line to the job log (the runner shows prepare and run output to the user).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (the runner went away) leaves nothing useful to do with the error.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `config`: what the runner must know before `prepare`.
pub fn config(settings: &DriverSettings, pool: &str) -> serde_json::Value {
    serde_json::json!({
        "builds_dir": settings.builds_dir,
        "cache_dir": settings.cache_dir,
        "builds_dir_is_shared": false,
        "hostname": format!("flotilla-{pool}"),
        "driver": { "name": "flotilla", "version": env!("CARGO_PKG_VERSION") },
    })
}

/// The job's lease, if it has one.
async fn lease(api: &ApiClient, job: &Job) -> Result<Option<LeaseInfo>, ApiError> {
    let (key, value) = job.label();
    api.lease_by_label(&key, &value).await
}

/// Whether `e` says flotilla is restarting (a rolling update, a crash) rather than refusing:
/// the API cannot be reached, the pool is still starting, or the process is draining. The
/// lease journal survives a restart, so waiting for the new process loses nothing.
fn restarting(e: &ApiError) -> bool {
    match e {
        ApiError::Unreachable { .. } => true,
        ApiError::Refused { code, .. } => code == "pool_starting" || code == "shutting_down",
    }
}

/// Calls `f` until it succeeds or fails for a reason other than a restart, waiting out a
/// restart until `start + acquire_timeout`; tells the job log once that it is waiting.
async fn through_restarts<T, F, Fut>(
    api: &ApiClient,
    settings: &DriverSettings,
    start: Instant,
    mut f: F,
) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let mut told = false;
    loop {
        match f().await {
            Err(e) if restarting(&e) && start.elapsed() < settings.acquire_timeout => {
                if !told {
                    say(&format!(
                        "Flotilla is not serving pool {} right now ({e}); waiting for it...",
                        api.pool()
                    ));
                    told = true;
                }
                tokio::time::sleep(RESTART_POLL).await;
            }
            other => return other,
        }
    }
}

/// How often the driver asks again while flotilla restarts.
const RESTART_POLL: Duration = Duration::from_millis(500);

/// Reserves (or finds again) and acquires the job's lease; the lease and its instance.
async fn acquire(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
) -> Result<(u64, String), Outcome> {
    let start = Instant::now();
    let found = through_restarts(api, settings, start, || lease(api, job))
        .await
        .map_err(system)?;
    let lease = match found {
        Some(l) if l.state == "acquired" => {
            let instance = l.instance.unwrap_or_default();
            say(&format!(
                "Using instance {instance} (lease {}, already acquired)",
                l.id
            ));
            return Ok((l.id, instance));
        }
        Some(l) if l.state == "failed" => {
            // The instance went away before the job started; start over on another one.
            api.release(l.id, None).await.map_err(system)?;
            None
        }
        other => other,
    };
    let lease = match lease {
        Some(l) => l,
        None => reserve(api, job, settings, start).await?,
    };
    say(&format!(
        "Waiting for an instance of pool {} (lease {})...",
        api.pool(),
        lease.id
    ));
    // The host gives up after the pool's instance_acquire_timeout (the lease stays reserved);
    // the driver keeps asking until its own --acquire-timeout.
    let instance = loop {
        // The long poll's limit is what is left of the driver's own timeout, counted again
        // after any wait for a restarting flotilla.
        let asked = through_restarts(api, settings, start, || {
            let left = settings.acquire_timeout.saturating_sub(start.elapsed());
            api.acquire(lease.id, left + Duration::from_secs(5))
        });
        match asked.await {
            Ok(instance) => break instance,
            Err(ApiError::Refused { code, .. })
                if code == "acquire_timeout" && start.elapsed() < settings.acquire_timeout =>
            {
                say(&format!(
                    "Still waiting for an instance ({:.0} s)...",
                    start.elapsed().as_secs_f64()
                ));
            }
            Err(e) => return Err(system(e)),
        }
    };
    say(&format!(
        "Running on instance {instance} (waited {:.1} s)",
        start.elapsed().as_secs_f64()
    ));
    Ok((lease.id, instance))
}

/// Reserves a slot for the job; while every slot is promised, waits (up to the acquire timeout)
/// for one to free up, as GitLab Runner's autoscaler does.
async fn reserve(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    start: Instant,
) -> Result<LeaseInfo, Outcome> {
    let (key, value) = job.label();
    let labels = BTreeMap::from([(key, value)]);
    let mut told = false;
    loop {
        match through_restarts(api, settings, start, || api.reserve(&labels)).await {
            Ok(lease) => return Ok(lease),
            // The job already has a lease: an earlier try reached the host but its answer was
            // lost in a restart. That lease is the job's.
            Err(ApiError::Refused { code, .. }) if code == "label_in_use" => {
                match through_restarts(api, settings, start, || lease(api, job)).await {
                    Ok(Some(l)) => return Ok(l),
                    Ok(None) => continue, // released meanwhile: reserve again
                    Err(e) => return Err(system(e)),
                }
            }
            Err(ApiError::Refused { code, message, .. })
                if code == "at_capacity" || code == "no_idle_slot" =>
            {
                if start.elapsed() >= settings.acquire_timeout {
                    return Err(system(format!(
                        "no free slot in pool {} within {:?}: {message}",
                        api.pool(),
                        settings.acquire_timeout
                    )));
                }
                if !told {
                    say(&format!(
                        "Pool {} is full ({message}); waiting for a free slot...",
                        api.pool()
                    ));
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(system(e)),
        }
    }
}

/// The engine's credentials for `image`'s registry from `DOCKER_AUTH_CONFIG`, if any.
fn credentials(
    job: &Job,
    image: &str,
) -> Result<Option<bollard::auth::DockerCredentials>, Outcome> {
    let Some(text) = &job.auth_config else {
        return Ok(None);
    };
    let config: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| system(format!("DOCKER_AUTH_CONFIG is not JSON: {e}")))?;
    let first = image.split('/').next().unwrap_or_default();
    let registry = if image.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost")
    {
        first.to_string()
    } else {
        "docker.io".to_string()
    };
    let auths = config.get("auths").and_then(|a| a.as_object());
    let entry = auths.and_then(|a| {
        a.iter().find_map(|(key, value)| {
            let host = key
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .split('/')
                .next()
                .unwrap_or_default();
            let docker_hub = registry == "docker.io"
                && (host == "index.docker.io" || host == "registry-1.docker.io");
            (host == registry || docker_hub).then_some(value)
        })
    });
    let Some(entry) = entry.and_then(|e| e.get("auth")).and_then(|a| a.as_str()) else {
        return Ok(None);
    };
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry)
        .map_err(|_| {
            system(format!(
                "DOCKER_AUTH_CONFIG: the auth of {registry} is not base64"
            ))
        })?;
    let decoded = String::from_utf8_lossy(&decoded).into_owned();
    let (user, password) = decoded.split_once(':').ok_or_else(|| {
        system(format!(
            "DOCKER_AUTH_CONFIG: the auth of {registry} is not user:password"
        ))
    })?;
    Ok(Some(bollard::auth::DockerCredentials {
        username: Some(user.to_string()),
        password: Some(password.to_string()),
        serveraddress: Some(registry),
        ..Default::default()
    }))
}

/// Pulls `image` as the policy says; the time spent pulling.
async fn pull(
    docker: &Docker,
    job: &Job,
    image: &str,
    policy: PullPolicy,
) -> Result<Duration, Outcome> {
    let present = docker.inspect_image(image).await.is_ok();
    match (policy, present) {
        (PullPolicy::Never, true) | (PullPolicy::IfNotPresent, true) => return Ok(Duration::ZERO),
        (PullPolicy::Never, false) => {
            return Err(system(format!(
                "image {image} is not on the instance and the pull policy is never"
            )));
        }
        _ => {}
    }
    say(&format!("Pulling image {image}..."));
    let start = Instant::now();
    let (repo, tag) = match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo.to_string(), tag.to_string()),
        _ => (image.to_string(), "latest".to_string()),
    };
    let options = CreateImageOptions {
        from_image: Some(repo),
        tag: Some(tag),
        ..Default::default()
    };
    let mut progress = docker.create_image(Some(options), None, credentials(job, image)?);
    while let Some(item) = progress.next().await {
        let info = item.map_err(|e| system(format!("pulling image {image}: {e}")))?;
        if let Some(error) = info.error_detail.and_then(|d| d.message) {
            return Err(system(format!("pulling image {image}: {error}")));
        }
    }
    say(&format!(
        "Pulled image {image} in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    Ok(start.elapsed())
}

fn labels(job: &Job, pool: &str) -> HashMap<String, String> {
    HashMap::from([
        (JOB_LABEL.to_string(), job.id.clone()),
        ("io.flotilla.pool".to_string(), pool.to_string()),
    ])
}

/// A Docker error that is not "already exists" / "not found" (the idempotent cases).
fn status(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Removes containers left by jobs whose lease is gone (a driver that crashed before cleanup).
async fn remove_leftovers(api: &ApiClient, docker: &Docker) {
    let options = ListContainersOptions {
        all: true,
        filters: Some(HashMap::from([(
            "label".to_string(),
            vec![JOB_LABEL.to_string()],
        )])),
        ..Default::default()
    };
    let Ok(containers) = docker.list_containers(Some(options)).await else {
        return;
    };
    let mut jobs: Vec<String> = containers
        .iter()
        .filter_map(|c| c.labels.as_ref()?.get(JOB_LABEL).cloned())
        .collect();
    jobs.sort();
    jobs.dedup();
    for id in jobs {
        if matches!(api.lease_by_label("gitlab-job", &id).await, Ok(None)) {
            let stale = Job {
                id: id.clone(),
                image: None,
                services: Vec::new(),
                auth_config: None,
                build_failure: 1,
                system_failure: 2,
                build_exit_code_file: None,
            };
            tracing::info!(job = %id, "removing what a crashed driver left behind");
            // Best effort: leftovers must never fail the current job.
            let _ = remove_job_objects(docker, &stale).await;
        }
    }
}

/// `prepare`: lease, images, network, volume, services and the job container.
pub async fn prepare(api: &ApiClient, job: &Job, settings: &DriverSettings) -> Outcome {
    match prepare_inner(api, job, settings).await {
        Ok(()) => Outcome::Success,
        Err(outcome) => outcome,
    }
}

async fn prepare_inner(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
) -> Result<(), Outcome> {
    let image = job
        .image
        .clone()
        .or_else(|| settings.default_image.clone())
        .ok_or_else(|| system("the job names no image and the driver has no --default-image"))?;
    let began = Instant::now();
    let (lease, _instance) = acquire(api, job, settings).await?;
    let docker = crate::docker::for_lease(api, lease, 120).map_err(system)?;
    remove_leftovers(api, &docker).await;
    // A retried prepare starts from a clean slate.
    remove_job_objects(&docker, job).await.map_err(system)?;
    let mut pulling = pull(&docker, job, &image, settings.pull_policy).await?;
    for service in &job.services {
        pulling += pull(&docker, job, &service.name, settings.pull_policy).await?;
    }
    let labels = labels(job, api.pool());
    docker
        .create_network(NetworkCreateRequest {
            name: job.network(),
            driver: Some("bridge".into()),
            labels: Some(labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(|e| system(format!("creating the job's network: {e}")))?;
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(job.volume()),
            labels: Some(labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(|e| system(format!("creating the job's volume: {e}")))?;
    for (i, service) in job.services.iter().enumerate() {
        start_service(&docker, job, i, service, &labels).await?;
    }
    let body = ContainerCreateBody {
        image: Some(image.clone()),
        // PID 1 waits for the stages' execs and exits on TERM.
        entrypoint: Some(vec!["/bin/sh".into()]),
        cmd: Some(vec![
            "-c".into(),
            "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done".into(),
        ]),
        working_dir: Some(settings.builds_dir.clone()),
        labels: Some(labels.clone()),
        host_config: Some(HostConfig {
            binds: Some(vec![
                format!("{}:{}", job.volume(), settings.builds_dir),
                format!("flotilla-cache:{}", settings.cache_dir),
            ]),
            network_mode: Some(job.network()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptions {
        name: Some(job.container()),
        ..Default::default()
    };
    docker
        .create_container(Some(options), body)
        .await
        .map_err(|e| system(format!("creating the job container from {image}: {e}")))?;
    let start = Instant::now();
    docker
        .start_container(
            &job.container(),
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| system(format!("starting the job container: {e}")))?;
    say(&format!(
        "Job container {} started from {image} in {:.2} s",
        job.container(),
        start.elapsed().as_secs_f64()
    ));
    let report = serde_json::json!({ "job_started": {
        "prepare_seconds": began.elapsed().as_secs_f64(),
        "pull_seconds": pulling.as_secs_f64(),
    }});
    api.report(lease, report).await;
    Ok(())
}

async fn start_service(
    docker: &Docker,
    job: &Job,
    i: usize,
    service: &Service,
    labels: &HashMap<String, String>,
) -> Result<(), Outcome> {
    let aliases = service.aliases();
    let body = ContainerCreateBody {
        image: Some(service.name.clone()),
        entrypoint: service.entrypoint.clone(),
        cmd: service.command.clone(),
        labels: Some(labels.clone()),
        host_config: Some(HostConfig {
            network_mode: Some(job.network()),
            ..Default::default()
        }),
        networking_config: Some(NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                job.network(),
                EndpointSettings {
                    aliases: Some(aliases.clone()),
                    ..Default::default()
                },
            )])),
        }),
        ..Default::default()
    };
    let name = job.service_container(i);
    let options = CreateContainerOptions {
        name: Some(name.clone()),
        ..Default::default()
    };
    docker
        .create_container(Some(options), body)
        .await
        .map_err(|e| system(format!("creating service {}: {e}", service.name)))?;
    docker
        .start_container(
            &name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| system(format!("starting service {}: {e}", service.name)))?;
    say(&format!(
        "Service {} started as {}",
        service.name,
        aliases.join(", ")
    ));
    Ok(())
}

/// The script is written here in the job container, one file per stage.
const SCRIPT_DIR: &str = "/tmp";

/// `run <script> <stage>`: the stage's script in the job container, its output streamed.
/// `cancel` resolving (SIGTERM) stops the script.
pub async fn run(
    api: &ApiClient,
    job: &Job,
    script: &std::path::Path,
    stage: &str,
    cancel: impl std::future::Future<Output = ()>,
) -> Outcome {
    let (outcome, lease) = match run_inner(api, job, script, stage, cancel).await {
        Ok(done) => done,
        Err(outcome) => (outcome, None),
    };
    // The user's script decides the job; the runner's own stages only support it.
    let main = stage == "build_script" || stage.starts_with("step_");
    if let (true, Some(lease)) = (main, lease) {
        let name = match &outcome {
            Outcome::Success => "success",
            Outcome::BuildFailure(_) => "build-failure",
            Outcome::SystemFailure(why) if why.ends_with("was cancelled") => "cancelled",
            Outcome::SystemFailure(_) => "system-failure",
        };
        api.report(
            lease,
            serde_json::json!({ "job_finished": { "outcome": name } }),
        )
        .await;
    }
    outcome
}

async fn run_inner(
    api: &ApiClient,
    job: &Job,
    script: &std::path::Path,
    stage: &str,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<(Outcome, Option<u64>), Outcome> {
    let text = std::fs::read(script).map_err(|e| {
        system(format!(
            "reading the {stage} script {}: {e}",
            script.display()
        ))
    })?;
    let lease = match lease(api, job).await.map_err(system)? {
        Some(l) if l.state == "acquired" => l.id,
        Some(l) if l.state == "failed" => {
            return Err(system(format!(
                "the job's instance failed: {}",
                l.cause.unwrap_or_default()
            )));
        }
        _ => return Err(system("the job has no acquired lease; did prepare run?")),
    };
    let docker = crate::docker::for_lease(api, lease, 3600).map_err(system)?;
    let safe: String = stage
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    let file = format!("flotilla-{safe}.sh");
    docker
        .upload_to_container(
            &job.container(),
            Some(UploadToContainerOptions {
                path: SCRIPT_DIR.into(),
                ..Default::default()
            }),
            bollard::body_full(crate::tar::one_file(&file, 0o700, &text).into()),
        )
        .await
        .map_err(|e| {
            system(format!(
                "copying the {stage} script into the job container: {e}"
            ))
        })?;
    let path = format!("{SCRIPT_DIR}/{file}");
    let pid_file = format!("{SCRIPT_DIR}/flotilla-{safe}.pid");
    // The runner's scripts are written for bash when it is there; `sh` otherwise. The pid is
    // kept so that a cancellation can stop the script's process group.
    let command = format!(
        "echo $$ > {pid_file}; if command -v bash >/dev/null 2>&1; then exec bash {path}; else exec sh {path}; fi"
    );
    let exec = docker
        .create_exec(
            &job.container(),
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(vec!["sh".to_string(), "-c".to_string(), command]),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| system(format!("starting the {stage} script: {e}")))?;
    let started = docker
        .start_exec(&exec.id, Some(StartExecOptions::default()))
        .await
        .map_err(|e| system(format!("starting the {stage} script: {e}")))?;
    let StartExecResults::Attached { mut output, .. } = started else {
        return Err(system("the script's exec was detached"));
    };
    tokio::pin!(cancel);
    let mut cancelled = false;
    loop {
        tokio::select! {
            item = output.next() => match item {
                None => break,
                Some(Ok(chunk)) => {
                    let (bytes, err) = match chunk {
                        bollard::container::LogOutput::StdErr { message } => (message, true),
                        bollard::container::LogOutput::StdOut { message }
                        | bollard::container::LogOutput::Console { message }
                        | bollard::container::LogOutput::StdIn { message } => (message, false),
                    };
                    // The runner reads both streams into the job log; a closed pipe ends it.
                    let _ = if err {
                        std::io::stderr().lock().write_all(&bytes)
                    } else {
                        let mut out = std::io::stdout().lock();
                        out.write_all(&bytes).and_then(|()| out.flush())
                    };
                }
                Some(Err(e)) => {
                    return Err(system(format!(
                        "the connection to the job container broke during {stage}: {e}"
                    )));
                }
            },
            () = &mut cancel, if !cancelled => {
                cancelled = true;
                say(&format!("flotilla: {stage} cancelled; stopping the script"));
                stop_script(&docker, job, &pid_file).await;
            }
        }
    }
    if cancelled {
        return Ok((
            Outcome::SystemFailure(format!("{stage} was cancelled")),
            Some(lease),
        ));
    }
    let inspect = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| system(format!("reading the {stage} script's exit code: {e}")))?;
    match inspect.exit_code {
        Some(0) => Ok((Outcome::Success, Some(lease))),
        Some(code) => Ok((Outcome::BuildFailure(code), Some(lease))),
        None => Err(system(format!("the {stage} script has no exit code"))),
    }
}

/// Sends TERM to the script's process group, then KILL after a grace of a few seconds.
async fn stop_script(docker: &Docker, job: &Job, pid_file: &str) {
    let kill = |signal: &str| {
        format!(
            "pid=$(cat {pid_file} 2>/dev/null) && kill -{signal} -- -$pid $pid 2>/dev/null; pkill -{signal} -P $pid 2>/dev/null; true"
        )
    };
    for (signal, wait) in [("TERM", Duration::from_secs(5)), ("KILL", Duration::ZERO)] {
        let created = docker
            .create_exec(
                &job.container(),
                CreateExecOptions {
                    cmd: Some(vec!["sh".to_string(), "-c".to_string(), kill(signal)]),
                    ..Default::default()
                },
            )
            .await;
        if let Ok(exec) = created {
            // Best effort: the script may be gone already.
            let _ = docker
                .start_exec(
                    &exec.id,
                    Some(StartExecOptions {
                        detach: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
        tokio::time::sleep(wait).await;
    }
}

/// Removes the job's containers (with their anonymous volumes), network and builds volume.
/// What is already gone counts as removed.
async fn remove_job_objects(docker: &Docker, job: &Job) -> Result<(), String> {
    let options = ListContainersOptions {
        all: true,
        filters: Some(HashMap::from([(
            "label".to_string(),
            vec![format!("{JOB_LABEL}={}", job.id)],
        )])),
        ..Default::default()
    };
    let containers = docker
        .list_containers(Some(options))
        .await
        .map_err(|e| format!("listing the job's containers: {e}"))?;
    for c in containers {
        let Some(id) = c.id else { continue };
        let removed = docker
            .remove_container(
                &id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await;
        if let Err(e) = removed
            && status(&e) != Some(404)
        {
            return Err(format!("removing container {id}: {e}"));
        }
    }
    if let Err(e) = docker.remove_network(&job.network()).await
        && status(&e) != Some(404)
    {
        return Err(format!("removing the job's network: {e}"));
    }
    if let Err(e) = docker
        .remove_volume(&job.volume(), Some(RemoveVolumeOptions { force: true }))
        .await
        && status(&e) != Some(404)
    {
        return Err(format!("removing the job's volume: {e}"));
    }
    Ok(())
}

/// `cleanup`: removes the job's objects and gives the lease back; idempotent, and it works
/// after a `prepare` that stopped anywhere. A lease whose instance's Docker no longer answers
/// is released as broken, so the instance is replaced.
pub async fn cleanup(api: &ApiClient, job: &Job) -> Outcome {
    let found = match lease(api, job).await {
        Ok(found) => found,
        Err(e) => return system(e),
    };
    let Some(lease) = found else {
        return Outcome::Success;
    };
    let result = match lease.state.as_str() {
        "reserved" => api.unreserve(lease.id).await,
        "acquired" => {
            let broken = match crate::docker::for_lease(api, lease.id, 60) {
                Err(e) => Some(e),
                Ok(docker) => match docker.ping().await {
                    Err(e) => Some(format!(
                        "Docker Engine does not answer after job {}: {e}",
                        job.id
                    )),
                    Ok(_) => remove_job_objects(&docker, job).await.err(),
                },
            };
            if let Some(why) = &broken {
                eprintln!("flotilla: {why}; the instance is reported broken and will be replaced");
            }
            api.release(lease.id, broken.as_deref()).await
        }
        _ => api.release(lease.id, None).await,
    };
    match result {
        Ok(()) => Outcome::Success,
        // Another cleanup got there first.
        Err(ApiError::Refused { code, .. }) if code == "unknown_lease" => Outcome::Success,
        Err(e) => system(e),
    }
}

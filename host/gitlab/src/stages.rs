//! The four stages. Each finds the job's lease by its label and the job's objects on the
//! instance by their names and labels, so nothing is kept between stages; each can run again
//! after a failure, and `cleanup` works from any point `prepare` reached. Every stage rides
//! through a restart of the host: a step cut by it is waited out (up to the restart window)
//! and taken again, from a clean slate for `prepare` and `cleanup`, from the byte printed so
//! far for a running script.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flotilla_api::{JobFinished, JobOutcome, JobStarted, ReportRequest};

use crate::api::{ApiClient, ApiError, LeaseState};
use crate::containers::{self, StepError};
use crate::job::{DriverSettings, Job, Mode};
use crate::lease::{self, Patience};
use crate::outcome::{Outcome, say, system};
use crate::script::{Ended, StageRun};

/// `config`: what the runner must know before `prepare`. Instance mode needs the job (its
/// builds directory on the machine is its own).
pub fn config(settings: &DriverSettings, pool: &str, job: Option<&Job>) -> serde_json::Value {
    if let (Mode::Instance(instance), Some(job)) = (&settings.mode, job) {
        return crate::instance::config(instance, job, pool);
    }
    serde_json::json!({
        "builds_dir": settings.builds_dir,
        "cache_dir": settings.cache_dir,
        "builds_dir_is_shared": false,
        "hostname": format!("flotilla-{pool}"),
        "driver": { "name": "flotilla", "version": env!("CARGO_PKG_VERSION") },
    })
}

/// How many times in a row a step may be cut by the host before the stage gives up.
const MAX_CUTS: u32 = 50;

/// Runs `attempt` until it succeeds or fails for a reason other than the host: each time
/// the host cut it, waits for the host to serve the job's lease again (the restart window,
/// or the acquire timeout while the pool starts), then tries again.
async fn riding_restarts<T, F, Fut>(
    api: &ApiClient,
    job: &Job,
    patience: Patience,
    mut attempt: F,
) -> Result<T, Outcome>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StepError>>,
{
    let mut cuts = 0;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(StepError::Failed(why)) => return Err(system(why)),
            Err(StepError::HostDown(why)) => {
                cuts += 1;
                if cuts > MAX_CUTS {
                    return Err(system(format!("{why} ({cuts} times in a row)")));
                }
                say(&format!("flotilla: {why}; waiting for the host..."));
                lease::acquired(api, job, patience).await?;
            }
        }
    }
}

/// `prepare`: lease, images, network, volumes, services and the job container.
pub async fn prepare(api: &ApiClient, job: &Job, settings: &DriverSettings) -> Outcome {
    if let Mode::Instance(instance) = &settings.mode {
        return crate::instance::prepare(api, job, settings, instance).await;
    }
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
    let (lease, _instance) = lease::acquire(api, job, settings).await?;
    let docker = crate::docker::for_lease(api, lease, 120).map_err(system)?;
    let patience = Patience::new(settings);
    let pulling = riding_restarts(api, job, patience, || async {
        containers::remove_leftovers(api, &docker, job).await;
        containers::bound_caches(&docker, settings.cache, &job.cache_volume()).await;
        // A retried prepare starts from a clean slate.
        containers::remove_job_objects(&docker, job).await?;
        containers::create_job(&docker, api, job, &image, settings).await
    })
    .await?;
    let started = JobStarted {
        prepare_seconds: began.elapsed().as_secs_f64(),
        pull_seconds: pulling.as_secs_f64(),
    };
    api.report(
        lease,
        ReportRequest {
            job_started: Some(started),
            job_finished: None,
        },
    )
    .await;
    Ok(())
}

/// `run <script> <stage>`: the stage's script in the job container, its output streamed.
/// `cancel` resolving (SIGTERM) stops the script.
pub async fn run(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    script: &std::path::Path,
    stage: &str,
    cancel: impl std::future::Future<Output = ()>,
) -> Outcome {
    let (outcome, lease) = match run_inner(api, job, settings, script, stage, cancel).await {
        Ok(done) => done,
        Err(outcome) => (outcome, None),
    };
    // The user's script decides the job; the runner's own stages only support it.
    let main = stage == "build_script" || stage.starts_with("step_");
    if let (true, Some(lease)) = (main, lease) {
        let outcome = match &outcome {
            Outcome::Success => JobOutcome::Success,
            Outcome::BuildFailure(_) => JobOutcome::BuildFailure,
            Outcome::SystemFailure(why) if why.ends_with("was cancelled") => JobOutcome::Cancelled,
            Outcome::SystemFailure(_) => JobOutcome::SystemFailure,
        };
        api.report(
            lease,
            ReportRequest {
                job_started: None,
                job_finished: Some(JobFinished { outcome }),
            },
        )
        .await;
    }
    outcome
}

/// A name for this invocation's runs of a stage: a stage the runner retries runs anew.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}{nanos:x}", std::process::id())
}

async fn run_inner(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
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
    if let Mode::Instance(instance) = &settings.mode {
        return crate::instance::run(api, job, settings, instance, &text, stage, cancel).await;
    }
    let patience = Patience::new(settings);
    let lease = lease::acquired(api, job, patience).await?;
    let docker = crate::docker::for_lease(api, lease, 3600).map_err(system)?;
    let run = StageRun::new(job.container(), stage, &run_id());
    riding_restarts(api, job, patience, || run.upload(&docker, &text)).await?;
    // Bytes of the log printed so far: a follow after a cut starts there.
    let printed = AtomicU64::new(0);
    let follow = riding_restarts(api, job, patience, || async {
        let mut cuts_without_progress = 0;
        loop {
            let before = printed.load(Ordering::Relaxed);
            match run.follow(&docker, &printed).await? {
                Ended::Exited(code) => return Ok(code),
                Ended::Cut if printed.load(Ordering::Relaxed) == before => {
                    cuts_without_progress += 1;
                    if cuts_without_progress >= 3 {
                        // Likely the host: let the caller wait for it.
                        return Err(StepError::HostDown(format!(
                            "the connection to the job container broke during {stage}"
                        )));
                    }
                }
                Ended::Cut => cuts_without_progress = 0,
            }
        }
    });
    tokio::pin!(cancel);
    let code = tokio::select! {
        code = follow => code?,
        () = &mut cancel => {
            say(&format!("flotilla: {stage} cancelled; stopping the script"));
            run.stop(&docker).await;
            return Ok((Outcome::SystemFailure(format!("{stage} was cancelled")), Some(lease)));
        }
    };
    match code {
        0 => Ok((Outcome::Success, Some(lease))),
        code => Ok((Outcome::BuildFailure(code), Some(lease))),
    }
}

/// How long cleanup waits before its second sweep, so an object whose creation was still in
/// flight when a killed `prepare` died has landed and is removed too.
const SETTLE: Duration = Duration::from_millis(1500);

/// `cleanup`: removes the job's objects and gives the lease back; idempotent, and it works
/// after a `prepare` that stopped anywhere. A lease whose instance's Docker no longer answers
/// is released as broken, so the instance is replaced. Waits for a restarting host like
/// `prepare` does.
pub async fn cleanup(api: &ApiClient, job: &Job, settings: &DriverSettings) -> Outcome {
    if let Mode::Instance(instance) = &settings.mode {
        return crate::instance::cleanup(api, job, settings, instance).await;
    }
    let patience = Patience::new(settings);
    let found = match lease::find(api, job, patience).await {
        Ok(found) => found,
        Err(e) => return system(e),
    };
    let Some(lease) = found else {
        return Outcome::Success;
    };
    let id = lease.id;
    let result = match lease.state {
        LeaseState::Reserved => lease::through_restarts(api, patience, || api.unreserve(id)).await,
        LeaseState::Acquired { .. } => {
            let broken = remove_on_instance(api, job, id, patience).await.err();
            if let Some(why) = &broken {
                eprintln!("flotilla: {why}; the instance is reported broken and will be replaced");
            }
            lease::through_restarts(api, patience, || api.release(id, broken.as_deref())).await
        }
        // Its instance is gone or failed: what the job left there is removed by the next
        // job on that machine, if it comes back.
        LeaseState::Failed { .. } => {
            lease::through_restarts(api, patience, || api.release(id, None)).await
        }
    };
    match result {
        Ok(()) => Outcome::Success,
        // Another cleanup got there first.
        Err(ApiError::Refused {
            code: crate::api::ErrorCode::UnknownLease,
            ..
        }) => Outcome::Success,
        Err(e) => system(e),
    }
}

/// Removes the job's objects from its instance, twice (see [`SETTLE`]); why the instance
/// is broken, if its engine does not answer.
async fn remove_on_instance(
    api: &ApiClient,
    job: &Job,
    lease: u64,
    patience: Patience,
) -> Result<(), String> {
    let docker = crate::docker::for_lease(api, lease, 60)?;
    let swept = riding_restarts(api, job, patience, || async {
        docker.ping().await.map_err(containers::step(format!(
            "Docker Engine does not answer after job {}",
            job.id
        )))?;
        containers::remove_job_objects(&docker, job).await?;
        tokio::time::sleep(SETTLE).await;
        containers::remove_job_objects(&docker, job).await
    })
    .await;
    swept.map_err(|outcome| match outcome {
        Outcome::SystemFailure(why) => why,
        other => format!("{other:?}"),
    })
}

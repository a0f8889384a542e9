//! The four stages, written once for both modes: each picks the job's [`Place`] at its top
//! (a container on the instance, or the machine itself) and does the rest the same way. Each
//! finds the job's lease by its label and the job's objects by their names, so nothing is
//! kept between stages; each can run again after a failure, and `cleanup` works from any
//! point `prepare` reached. Every step rides through a restart of the host ([`ride`]): a step
//! the host cut is waited out (up to the restart window) and taken again, from a clean slate
//! for `prepare` and `cleanup`, from the byte printed so far for a running script. A cleanup
//! that cannot reach the host at all is queued on the manager ([`crate::pending`]) and
//! finished by the next driver call that can.

use std::cell::Cell;
use std::future::Future;
use std::time::{Duration, Instant};

use flotilla_api::{JobFinished, JobOutcome, JobStarted, ReportRequest};

use crate::api::{ApiClient, ApiError, ErrorCode, LeaseState};
use crate::docker::DockerPlace;
use crate::instance::InstancePlace;
use crate::job::{DriverSettings, Job, Mode};
use crate::lease::{self, Patience};
use crate::outcome::{Outcome, say, system};
use crate::pending;
use crate::place::{Ended, GRACE, Place, StageRun, StepError};

/// `config`: what the runner must know before `prepare`. Instance mode needs the job (its
/// builds directory on the machine is its own).
pub fn config(settings: &DriverSettings, pool: &str, job: Option<&Job>) -> serde_json::Value {
    let (builds_dir, cache_dir, shell) = match (&settings.mode, job) {
        (Mode::Instance(instance), Some(job)) => (
            instance.builds_dir(&job.id),
            instance.cache_dir(&job.project, job.protected),
            Some(instance.shell.name()),
        ),
        (Mode::Instance(instance), None) => (
            instance.builds_dir("JOB"),
            instance.cache_dir("PROJECT", false),
            None,
        ),
        (Mode::Docker(docker), _) => (docker.builds_dir.clone(), docker.cache_dir.clone(), None),
    };
    let mut answer = serde_json::json!({
        "builds_dir": builds_dir,
        "cache_dir": cache_dir,
        "builds_dir_is_shared": false,
        "hostname": format!("flotilla-{pool}"),
        "driver": { "name": "flotilla", "version": env!("CARGO_PKG_VERSION") },
    });
    if let (Some(shell), Some(map)) = (shell, answer.as_object_mut()) {
        map.insert("shell".into(), shell.into());
    }
    answer
}

/// How many times in a row a step may be cut by the host before the stage gives up.
const MAX_CUTS: u32 = 50;

/// Runs `attempt` until it succeeds or fails for a reason other than the host: each time
/// the host cut it, waits for the host to serve the job's lease again (the restart window,
/// or the acquire timeout while the pool starts), then tries again. The one place where a
/// step rides through a restart of the host.
pub(crate) async fn ride<T, F, Fut>(
    api: &ApiClient,
    job: &Job,
    patience: Patience,
    mut attempt: F,
) -> Result<T, StepError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StepError>>,
{
    let mut cuts = 0;
    loop {
        match attempt().await {
            Err(StepError::HostDown(why)) => {
                cuts += 1;
                // Still the host's, never the instance's: a caller must not report the
                // machine broken because flotilla could not be reached or was overloaded.
                if cuts > MAX_CUTS {
                    return Err(StepError::HostDown(format!(
                        "{why} ({cuts} times in a row)"
                    )));
                }
                say(&format!("flotilla: {why}; waiting for the host..."));
                if cuts > 1 {
                    // A host that answers at once but cannot serve (past its connection bound,
                    // say) is not asked again at once by a thousand drivers.
                    tokio::time::sleep(backoff(cuts)).await;
                }
                lease::acquired(api, job, patience).await?;
            }
            done => return done,
        }
    }
}

/// The wait before the `cuts`th try in a row: 100 ms doubling to 5 s, each spread over half
/// to all of it, so drivers cut together do not come back together.
pub(crate) fn backoff(cuts: u32) -> Duration {
    let full = Duration::from_millis(100)
        .saturating_mul(1 << cuts.saturating_sub(2).min(6))
        .min(Duration::from_secs(5));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let spread = f64::from(nanos % 1000) / 2000.0;
    full.mul_f64(0.5 + spread)
}

/// Follows `run` until its script ends: a follow the stream cut is taken again from the byte
/// printed so far, once the host serves the job's lease (which it does at once unless it is
/// restarting).
async fn follow_to_end<P: Place>(
    place: &P,
    api: &ApiClient,
    job: &Job,
    patience: Patience,
    run: &StageRun<'_>,
    printed: &Cell<u64>,
) -> Result<Ended, StepError> {
    let mut cuts = 0u32;
    loop {
        let before = printed.get();
        let ended = ride(api, job, patience, || place.follow(run, printed)).await?;
        let Ended::Cut(why) = ended else {
            return Ok(ended);
        };
        // Only cuts in a row without progress count.
        cuts = if printed.get() > before { 1 } else { cuts + 1 };
        if cuts > MAX_CUTS {
            return Err(StepError::Failed(format!(
                "the connection broke during {} {cuts} times in a row: {why}",
                run.stage
            )));
        }
        if cuts == 1 {
            say(&format!(
                "flotilla: the connection broke during {} ({why}); following again...",
                run.stage
            ));
        } else {
            // A stream that breaks at once again: give the host a moment.
            tokio::time::sleep(Duration::from_millis(100 * u64::from(cuts.min(20)))).await;
        }
        lease::acquired(api, job, patience).await?;
    }
}

/// `prepare`: the lease, then the job's place on its instance.
pub async fn prepare(api: &ApiClient, job: &Job, settings: &DriverSettings) -> Outcome {
    let prepared = pending::finishing(api, settings, async {
        match &settings.mode {
            Mode::Docker(own) => prepare_on::<DockerPlace>(api, job, settings, own).await,
            Mode::Instance(own) => prepare_on::<InstancePlace>(api, job, settings, own).await,
        }
    });
    match prepared.await {
        Ok(()) => Outcome::Success,
        Err(outcome) => outcome,
    }
}

async fn prepare_on<P: Place>(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    own: &P::Settings,
) -> Result<(), Outcome> {
    P::check(job, own).map_err(system)?;
    let began = Instant::now();
    let (lease, acquired) = lease::acquire(api, job, settings).await?;
    let place = P::open(api, job, settings, own, lease).map_err(system)?;
    let patience = Patience::new(settings);
    let pulling = ride(api, job, patience, || place.prepare(&acquired))
        .await
        .map_err(system)?;
    job.mark_prepared(lease, &api.scope());
    let started = JobStarted {
        prepare_seconds: began.elapsed().as_secs_f64(),
        pull_seconds: pulling.as_secs_f64(),
    };
    report(api, lease, Some(started), None).await;
    Ok(())
}

async fn report(
    api: &ApiClient,
    lease: u64,
    job_started: Option<JobStarted>,
    job_finished: Option<JobFinished>,
) {
    api.report(
        lease,
        ReportRequest {
            job_started,
            job_finished,
        },
    )
    .await;
}

/// `run <script> <stage>`: the stage's script in its place, its output streamed. `cancel`
/// resolving (SIGTERM) stops every process of the stage before this returns.
pub async fn run(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    script: &std::path::Path,
    stage: &str,
    cancel: impl Future<Output = ()>,
) -> Outcome {
    let ran = pending::finishing(api, settings, async {
        let text = std::fs::read(script).map_err(|e| {
            system(format!(
                "reading the {stage} script {}: {e}",
                script.display()
            ))
        })?;
        let run = StageRun::new(stage, &text);
        match &settings.mode {
            Mode::Docker(own) => run_on::<DockerPlace>(api, job, settings, own, &run, cancel).await,
            Mode::Instance(own) => {
                run_on::<InstancePlace>(api, job, settings, own, &run, cancel).await
            }
        }
    });
    let (outcome, lease) = match ran.await {
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
        report(api, lease, None, Some(JobFinished { outcome })).await;
    }
    outcome
}

async fn run_on<P: Place>(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    own: &P::Settings,
    run: &StageRun<'_>,
    cancel: impl Future<Output = ()>,
) -> Result<(Outcome, Option<u64>), Outcome> {
    let patience = Patience::new(settings);
    // The lease `prepare` noted saves asking the host for it; a stage that fails on it asks
    // after all, so a lease that failed or ended meanwhile is named as the cause.
    let noted = job.prepared_lease(&api.scope());
    let lease = match noted {
        Some(id) => id,
        None => lease::acquired(api, job, patience).await.map_err(system)?,
    };
    let place = P::open(api, job, settings, own, lease).map_err(system)?;
    // Bytes of the log printed so far: a follow after a cut starts there.
    let printed = Cell::new(0);
    let follow = async {
        let ended = follow_to_end(&place, api, job, patience, run, &printed).await;
        // A host that did not come back was waited for already: that is the cause.
        let host_down = matches!(ended, Err(StepError::HostDown(_)));
        if noted.is_some() && !host_down && !matches!(ended, Ok(Ended::Exited(_))) {
            lease::acquired(api, job, patience).await?;
        }
        ended
    };
    tokio::pin!(cancel);
    let ended = tokio::select! {
        ended = follow => ended.map_err(system)?,
        () = &mut cancel => {
            say(&format!("flotilla: {} cancelled; stopping the script", run.stage));
            // The output written while the script stops still reaches the job log.
            let draining = tokio::time::timeout(
                GRACE + Duration::from_secs(5),
                follow_to_end(&place, api, job, Patience::none(), run, &printed),
            );
            let _ = tokio::join!(place.stop(run), draining);
            let why = format!("{} was cancelled", run.stage);
            return Ok((Outcome::SystemFailure(why), Some(lease)));
        }
    };
    let outcome = match ended {
        Ended::Exited(0) => Outcome::Success,
        Ended::Exited(code) => Outcome::BuildFailure(code),
        Ended::Lost => {
            return Err(system(format!(
                "the {} script's processes were killed before it could report its exit status",
                run.stage
            )));
        }
        Ended::NotStarted(words) => {
            return Err(system(format!(
                "placing the {} script failed (did prepare run?): {words}",
                run.stage
            )));
        }
        Ended::Cut(why) => return Err(system(why)),
    };
    Ok((outcome, Some(lease)))
}

/// `cleanup`: removes the job's objects and gives the lease back; idempotent, and it works
/// after a `prepare` that stopped anywhere. A lease whose instance no longer answers is
/// released as broken, so the instance is replaced. A cleanup that cannot reach the host
/// within the restart window is queued on the manager, and the next driver call that
/// reaches the host finishes it.
pub async fn cleanup(api: &ApiClient, job: &Job, settings: &DriverSettings) -> Outcome {
    let cleaned = pending::finishing(api, settings, async {
        let patience = Patience::new(settings);
        cleanup_job(api, job, settings, patience).await
    });
    match cleaned.await {
        Ok(()) => Outcome::Success,
        Err(why) => match pending::queue(api, settings, job) {
            Ok(note) => system(format!(
                "{why}; the cleanup is queued ({}): the next driver call that reaches flotilla finishes it",
                note.display()
            )),
            Err(e) => system(format!("{why}; queuing the cleanup failed too: {e}")),
        },
    }
}

/// Removes the job from its instance and gives its lease back, with `patience` for a
/// restarting host; why not, if it could not.
pub(crate) async fn cleanup_job(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    patience: Patience,
) -> Result<(), String> {
    let found = lease::find(api, job, patience)
        .await
        .map_err(|e| e.to_string())?;
    let Some(lease) = found else {
        return Ok(());
    };
    let id = lease.id;
    let given_back = match lease.state {
        LeaseState::Reserved => lease::through_restarts(api, patience, || api.unreserve(id)).await,
        LeaseState::Acquired { .. } => {
            let broken = match &settings.mode {
                Mode::Docker(own) => {
                    sweep_on::<DockerPlace>(api, job, settings, own, id, patience).await?
                }
                Mode::Instance(own) => {
                    sweep_on::<InstancePlace>(api, job, settings, own, id, patience).await?
                }
            };
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
    match given_back {
        // Another cleanup got there first.
        Ok(())
        | Err(ApiError::Refused {
            code: ErrorCode::UnknownLease,
            ..
        }) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Sweeps the job from the instance of lease `id`: `Ok(None)` when it is clean,
/// `Ok(Some(why))` when the instance is broken; `Err` when the host never came back.
async fn sweep_on<P: Place>(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    own: &P::Settings,
    id: u64,
    patience: Patience,
) -> Result<Option<String>, String> {
    let place = match P::open(api, job, settings, own, id) {
        Ok(place) => place,
        Err(why) => return Ok(Some(why)),
    };
    match ride(api, job, patience, || place.sweep()).await {
        Ok(()) => Ok(None),
        Err(StepError::Failed(why)) => Ok(Some(why)),
        Err(StepError::HostDown(why)) => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_after_a_cut_grows_to_a_cap_and_is_spread() {
        for cuts in 2..40 {
            let full =
                Duration::from_millis(100 * (1 << (cuts - 2).min(6))).min(Duration::from_secs(5));
            let w = backoff(cuts);
            assert!(w >= full / 2 && w <= full, "cut {cuts}: {w:?} of {full:?}");
        }
        assert!(backoff(30) >= Duration::from_millis(2500));
    }
}

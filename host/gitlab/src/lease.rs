//! The job's lease through the lease API: found by the job's label in every stage, reserved
//! and acquired by `prepare`, given back by `cleanup`, and every call patient with a host
//! that restarts: while the host does not answer at all, a call waits at most the restart
//! window; while it answers that the pool is starting (or draining), up to the acquire
//! timeout. Past either, the job fails as a system failure, which the runner may retry.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::api::{Acquired, ApiClient, ApiError, LeaseInfo, LeaseState};
use crate::job::{DriverSettings, Job};
use crate::outcome::{Outcome, say, system};
use crate::place::StepError;

/// How often the driver asks again while flotilla restarts or the pool is full.
const POLL: Duration = Duration::from_millis(500);

/// How patient one stage is with the host.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    /// When the stage began: the acquire timeout counts from here.
    pub(crate) start: Instant,
    /// Waiting for a pool that is starting or draining, at most until `start` + this.
    pub(crate) acquire_timeout: Duration,
    /// Waiting for a host that does not answer, at most this long in a row.
    pub(crate) restart_window: Duration,
}

impl Patience {
    /// A stage's patience from now, with the driver's settings.
    pub(crate) fn new(settings: &DriverSettings) -> Patience {
        Patience {
            start: Instant::now(),
            acquire_timeout: settings.acquire_timeout,
            restart_window: settings.restart_window,
        }
    }

    /// No patience at all: one try, whatever the host says (finishing another job's queued
    /// cleanup must never hold up this one).
    pub(crate) fn none() -> Patience {
        Patience {
            start: Instant::now(),
            acquire_timeout: Duration::ZERO,
            restart_window: Duration::ZERO,
        }
    }
}

/// Whether the host answered that the pool is not serving now but will (a start, a drain).
fn starting(e: &ApiError) -> bool {
    matches!(e, ApiError::Refused { code, .. } if code.restarting())
}

/// Calls `f` until it succeeds or fails for a reason other than a restart; says once in the
/// job log that it is waiting.
pub(crate) async fn through_restarts<T, F, Fut>(
    api: &ApiClient,
    patience: Patience,
    mut f: F,
) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let mut told = false;
    let mut down_since: Option<Instant> = None;
    loop {
        let result = f().await;
        let wait = match &result {
            Err(ApiError::Unreachable { .. }) => {
                let since = *down_since.get_or_insert_with(Instant::now);
                since.elapsed() < patience.restart_window
            }
            Err(e) if starting(e) => {
                down_since = None;
                patience.start.elapsed() < patience.acquire_timeout
            }
            _ => false,
        };
        match result {
            Err(e) if wait => {
                if !told {
                    say(&format!(
                        "Flotilla is not serving pool {} right now ({e}); waiting for it...",
                        api.pool()
                    ));
                    told = true;
                }
                tokio::time::sleep(POLL).await;
            }
            Err(ApiError::Unreachable { url, why }) if down_since.is_some() => {
                return Err(ApiError::Unreachable {
                    url,
                    why: format!(
                        "{why} (no answer for the whole restart window, {:?})",
                        patience.restart_window
                    ),
                });
            }
            other => return other,
        }
    }
}

/// The job's lease, if it has one, waiting out a restart.
pub(crate) async fn find(
    api: &ApiClient,
    job: &Job,
    patience: Patience,
) -> Result<Option<LeaseInfo>, ApiError> {
    let (key, value) = job.label();
    through_restarts(api, patience, || api.lease_by_label(&key, &value)).await
}

/// The job's acquired lease, for `run` and `cleanup`: waits out a restart, and says why
/// there is none. [`StepError::HostDown`]: the host did not come back within the restart
/// window; [`StepError::Failed`]: the lease failed or is not acquired.
pub(crate) async fn acquired(
    api: &ApiClient,
    job: &Job,
    patience: Patience,
) -> Result<u64, StepError> {
    let found = find(api, job, patience).await.map_err(|e| match e {
        ApiError::Unreachable { .. } => StepError::HostDown(e.to_string()),
        e => StepError::Failed(e.to_string()),
    })?;
    match found {
        Some(LeaseInfo {
            id,
            state: LeaseState::Acquired { .. },
        }) => Ok(id),
        Some(LeaseInfo {
            state: LeaseState::Failed { cause },
            ..
        }) => Err(StepError::Failed(format!(
            "the job's instance failed: {cause}"
        ))),
        _ => Err(StepError::Failed(
            "the job has no acquired lease; did prepare run?".into(),
        )),
    }
}

/// Reserves (or finds again) and acquires the job's lease; the lease and its instance (with
/// its operating system when the host said).
pub(crate) async fn acquire(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
) -> Result<(u64, Acquired), Outcome> {
    let patience = Patience::new(settings);
    let lease = match reserve(api, job, settings, patience).await? {
        Held::Reserved(lease) => lease,
        Held::Acquired { id, instance, slot } => {
            say(&format!(
                "Using instance {instance} (lease {id}, already acquired)"
            ));
            return Ok((
                id,
                Acquired {
                    instance,
                    slot,
                    os: None,
                },
            ));
        }
    };
    say(&format!(
        "Waiting for an instance of pool {} (lease {})...",
        api.pool(),
        lease.id
    ));
    let instance = wait_for_instance(api, job, lease.id, patience).await?;
    say(&format!(
        "Running on instance {} (waited {:.1} s)",
        instance.instance,
        patience.start.elapsed().as_secs_f64()
    ));
    Ok((lease.id, instance))
}

/// The lease's instance, asked for again and again until the driver's own
/// `--acquire-timeout`: the host gives up after the pool's instance_acquire_timeout (the lease
/// stays reserved).
async fn wait_for_instance(
    api: &ApiClient,
    job: &Job,
    id: u64,
    patience: Patience,
) -> Result<Acquired, Outcome> {
    loop {
        // The long poll's limit is what is left of the driver's own timeout, counted again
        // after any wait for a restarting flotilla.
        let asked = through_restarts(api, patience, || {
            let left = patience
                .acquire_timeout
                .saturating_sub(patience.start.elapsed());
            api.acquire(id, left + Duration::from_secs(5))
        });
        match asked.await {
            Ok(instance) => return Ok(instance),
            // An earlier try was granted but its answer was lost in a restart.
            Err(ApiError::Refused {
                code: crate::api::ErrorCode::AlreadyAcquired,
                ..
            }) => match find(api, job, patience).await.map_err(system)? {
                Some(LeaseInfo {
                    state: LeaseState::Acquired { instance, slot },
                    ..
                }) => {
                    return Ok(Acquired {
                        instance,
                        slot,
                        os: None,
                    });
                }
                other => {
                    return Err(system(format!(
                        "lease {id} was acquired, then lost: {other:?}"
                    )));
                }
            },
            Err(ApiError::Refused { code, .. })
                if code == crate::api::ErrorCode::AcquireTimeout
                    && patience.start.elapsed() < patience.acquire_timeout =>
            {
                say(&format!(
                    "Still waiting for an instance ({:.0} s)...",
                    patience.start.elapsed().as_secs_f64()
                ));
            }
            Err(e) => return Err(system(e)),
        }
    }
}

/// The job's lease as [`reserve`] finds it.
enum Held {
    /// Reserved, by this call or an earlier one whose answer was lost.
    Reserved(LeaseInfo),
    /// Acquired already: a `prepare` run again.
    Acquired {
        id: u64,
        instance: String,
        slot: u32,
    },
}

/// Reserves a slot for the job; while every slot is promised, waits (up to the acquire
/// timeout) for one to free up, as GitLab Runner's autoscaler does. A first `prepare`
/// reserves at once; a lease the job holds already (a `prepare` run again, or a reservation
/// whose answer a restart lost) is refused as `label_in_use` and found then: one that is
/// reserved or acquired is the job's, a failed one (its instance went away before the job
/// started) is given back and the job starts over on another instance.
async fn reserve(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    patience: Patience,
) -> Result<Held, Outcome> {
    let (key, value) = job.label();
    let labels = BTreeMap::from([(key, value)]);
    // The job's own timeout and a grace: the host fails the lease past it even if no
    // cleanup ever comes (the runner kills the job at its timeout, then runs cleanup).
    let deadline = job.timeout.map(|t| t + settings.deadline_grace);
    let tenant = match &settings.mode {
        crate::Mode::Instance(own) => own.tenant(&job.project, job.protected),
        // Containers, networks and cache volumes keep jobs apart on a shared machine.
        crate::Mode::Docker(_) => None,
    };
    let mut told = false;
    loop {
        match through_restarts(api, patience, || {
            api.reserve_for(&labels, deadline, tenant.as_deref())
        })
        .await
        {
            Ok(lease) => return Ok(Held::Reserved(lease)),
            Err(ApiError::Refused {
                code: crate::api::ErrorCode::LabelInUse,
                ..
            }) => match find(api, job, patience).await.map_err(system)? {
                Some(LeaseInfo {
                    id,
                    state: LeaseState::Acquired { instance, slot },
                }) => return Ok(Held::Acquired { id, instance, slot }),
                Some(LeaseInfo {
                    id,
                    state: LeaseState::Failed { .. },
                }) => {
                    through_restarts(api, patience, || api.release(id, None))
                        .await
                        .map_err(system)?;
                }
                Some(lease) => return Ok(Held::Reserved(lease)),
                None => {} // released meanwhile: reserve again
            },
            Err(ApiError::Refused { code, message, .. }) if code.pool_full() => {
                if patience.start.elapsed() >= patience.acquire_timeout {
                    return Err(system(format!(
                        "no free slot in pool {} within {:?}: {message}",
                        api.pool(),
                        patience.acquire_timeout
                    )));
                }
                if !told {
                    say(&format!(
                        "Pool {} is full ({message}); waiting for a free slot...",
                        api.pool()
                    ));
                    told = true;
                }
                tokio::time::sleep(POLL).await;
            }
            Err(e) => return Err(system(e)),
        }
    }
}

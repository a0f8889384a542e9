//! What a job leaves on its instance, removed: the job's containers (job, helper, services),
//! network and per-job volume, found by label and by name; what lost or failed jobs left; and
//! the bounds on the volumes jobs share (project caches and builds volumes), by count and age.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerSummary, Volume};
use bollard::query_parameters::{
    ListContainersOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};

use crate::api::{ApiClient, ApiError, ErrorCode, LeaseState};
use crate::docker::client::step;
use crate::docker::objects::{CACHE_LABEL, JOB_LABEL};
use crate::job::{CacheBounds, Job};
use crate::place::StepError;

/// An engine answer's status, for the idempotent cases ("not found", "already exists").
fn status(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

pub(crate) fn label_filter(value: String) -> Option<HashMap<String, Vec<String>>> {
    Some(HashMap::from([("label".to_string(), vec![value])]))
}

/// The job's containers, listed by its label: one request, which `cleanup` also uses to see
/// that the engine answers.
pub(crate) async fn job_containers(
    docker: &Docker,
    job: &Job,
) -> Result<Vec<ContainerSummary>, bollard::errors::Error> {
    let options = ListContainersOptions {
        all: true,
        filters: label_filter(format!("{JOB_LABEL}={}", job.id)),
        ..Default::default()
    };
    docker.list_containers(Some(options)).await
}

/// Removes the job's containers (with their anonymous volumes), network and builds volume,
/// found by label and by name (an object whose creation was still in flight when its creator
/// died carries both). What is already gone counts as removed.
pub(crate) async fn remove_job_objects(docker: &Docker, job: &Job) -> Result<(), StepError> {
    let listed = job_containers(docker, job)
        .await
        .map_err(step("listing the job's containers"))?;
    remove_listed(docker, job, listed).await
}

/// [`remove_job_objects`] with the job's containers already listed: each listed one by id,
/// then each of the job's container names the listing did not show (a creation that was
/// still landing), its network and its builds volume.
pub(crate) async fn remove_listed(
    docker: &Docker,
    job: &Job,
    listed: Vec<ContainerSummary>,
) -> Result<(), StepError> {
    let shown: Vec<String> = listed
        .iter()
        .flat_map(|c| c.names.iter().flatten())
        .map(|n| n.trim_start_matches('/').to_string())
        .collect();
    let mut names: Vec<String> = listed.into_iter().filter_map(|c| c.id).collect();
    names.extend(
        [job.container(), job.helper_container()]
            .into_iter()
            .chain((0..job.services.len()).map(|i| job.service_container(i)))
            .filter(|name| !shown.contains(name)),
    );
    for name in names {
        let removed = docker
            .remove_container(
                &name,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await;
        match removed {
            Err(e) if status(&e) != Some(404) => {
                return Err(step(format!("removing container {name}"))(e));
            }
            _ => {}
        }
    }
    if let Err(e) = docker.remove_network(&job.network()).await
        && status(&e) != Some(404)
    {
        return Err(step("removing the job's network")(e));
    }
    if let Err(e) = docker
        .remove_volume(&job.volume(), Some(RemoveVolumeOptions { force: true }))
        .await
        && status(&e) != Some(404)
    {
        return Err(step("removing the job's volume")(e));
    }
    Ok(())
}

/// What an instance holds of the driver's jobs, from one listing each of its containers,
/// networks and volumes: the ids of the jobs with objects there, and the volumes jobs share.
#[derive(Debug, Default)]
pub(crate) struct Inventory {
    /// The job ids on the instance's containers, networks and volumes.
    pub jobs: Vec<String>,
    /// The volumes jobs share (project caches and builds volumes).
    pub shared: Vec<Volume>,
    /// Every listing answered: a job missing from [`Self::jobs`] has nothing there.
    pub complete: bool,
}

impl Inventory {
    /// Whether the instance may hold something of `job`: it was listed, or a listing failed.
    pub fn may_hold(&self, job: &Job) -> bool {
        !self.complete || self.jobs.contains(&job.id)
    }
}

/// Lists the instance's objects of the driver's jobs (see [`Inventory`]). Best effort: a
/// listing that fails leaves its part out and the inventory incomplete.
pub(crate) async fn inventory(docker: &Docker) -> Inventory {
    let mut found = Inventory {
        complete: true,
        ..Default::default()
    };
    let containers = ListContainersOptions {
        all: true,
        filters: label_filter(JOB_LABEL.to_string()),
        ..Default::default()
    };
    let networks = ListNetworksOptions {
        filters: label_filter(JOB_LABEL.to_string()),
    };
    // One after another, on the one kept connection to the host: three quick listings, where
    // at once each took a connection of its own (on the host, and through the instance's
    // SSH). One unfiltered volume listing serves both labels: a filter list's labels must all
    // match.
    let containers = docker.list_containers(Some(containers)).await;
    let networks = docker.list_networks(Some(networks)).await;
    let volumes = docker.list_volumes(None::<ListVolumesOptions>).await;
    match containers {
        Ok(list) => found
            .jobs
            .extend(list.into_iter().filter_map(|c| c.labels?.remove(JOB_LABEL))),
        Err(_) => found.complete = false,
    }
    match networks {
        Ok(list) => found
            .jobs
            .extend(list.into_iter().filter_map(|n| n.labels?.remove(JOB_LABEL))),
        Err(_) => found.complete = false,
    }
    match volumes {
        Ok(answer) => {
            for mut volume in answer.volumes.unwrap_or_default() {
                if let Some(id) = volume.labels.remove(JOB_LABEL) {
                    found.jobs.push(id);
                } else if volume.labels.contains_key(CACHE_LABEL) {
                    found.shared.push(volume);
                }
            }
        }
        Err(_) => found.complete = false,
    }
    found.jobs.sort();
    found.jobs.dedup();
    found
}

/// Removes what jobs left that have no live lease any more: no lease at all (a driver that
/// died before cleanup), or a failed one (its instance was lost to the host, and its cleanup
/// could not reach it). Best effort: leftovers never fail the current job.
pub(crate) async fn remove_leftovers(
    api: &ApiClient,
    docker: &Docker,
    current: &Job,
    jobs: &[String],
) {
    let others: Vec<&str> = jobs
        .iter()
        .map(String::as_str)
        .filter(|id| *id != current.id)
        .collect();
    if others.is_empty() {
        return;
    }
    // One request for all of them; one each from a host too old to take several.
    let leases = match api.leases_by_labels("gitlab-job", &others).await {
        Ok(found) => Some(found),
        Err(ApiError::Refused {
            code: ErrorCode::BadRequest,
            ..
        }) => None,
        Err(_) => return,
    };
    for id in others {
        let lease = match &leases {
            Some(found) => Ok(found.get(id).cloned()),
            None => api.lease_by_label("gitlab-job", id).await,
        };
        let (lost, failed) = match lease {
            Ok(None) => (true, None),
            Ok(Some(lease)) => match lease.state {
                LeaseState::Failed { .. } => (true, Some(lease.id)),
                _ => (false, None),
            },
            Err(_) => (false, None),
        };
        if lost {
            tracing::info!(job = %id, "removing what a lost job left behind");
            let removed = remove_job_objects(docker, &Job::stale(id)).await;
            // A failed lease whose job is gone from its machine serves nobody: its driver
            // never came back (a deadline failed it), or comes back to find it released.
            if let (Ok(()), Some(lease)) = (removed, failed) {
                let _ = api.release(lease, None).await;
            }
        }
    }
}

/// Removes the volumes jobs share (project caches and builds volumes) past their age, then
/// the oldest beyond the count, skipping the current job's and any in use (the engine refuses
/// to remove those). Best effort.
pub(crate) async fn bound_caches(
    docker: &Docker,
    bounds: CacheBounds,
    keep: &[String],
    shared: Vec<Volume>,
) {
    let now = chrono::Utc::now();
    let mut volumes: Vec<(chrono::DateTime<chrono::Utc>, String)> = shared
        .into_iter()
        .filter(|v| !keep.contains(&v.name))
        .map(|v| {
            let created = v
                .created_at
                .as_deref()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map_or(now, |t| t.with_timezone(&chrono::Utc));
            (created, v.name)
        })
        .collect();
    volumes.sort();
    let max_age = chrono::Duration::from_std(bounds.max_age).unwrap_or(chrono::Duration::MAX);
    let beyond = volumes
        .len()
        .saturating_sub(bounds.max_volumes.saturating_sub(1));
    for (i, (created, name)) in volumes.iter().enumerate() {
        if (now - *created > max_age || i < beyond)
            && docker
                .remove_volume(name, None::<RemoveVolumeOptions>)
                .await
                .is_ok()
        {
            tracing::info!(volume = %name, "removed a project cache volume past its bound");
        }
    }
}

//! What a job leaves on its instance, removed: the job's containers (job, helper, services),
//! network and per-job volume, found by label and by name; what lost or failed jobs left; and
//! the bounds on the volumes jobs share (project caches and builds volumes), by count and age.

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::{
    ListContainersOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};

use crate::api::{ApiClient, LeaseState};
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

/// Removes the job's containers (with their anonymous volumes), network and builds volume,
/// found by label and by name (an object whose creation was still in flight when its creator
/// died carries both). What is already gone counts as removed.
pub(crate) async fn remove_job_objects(docker: &Docker, job: &Job) -> Result<(), StepError> {
    let options = ListContainersOptions {
        all: true,
        filters: label_filter(format!("{JOB_LABEL}={}", job.id)),
        ..Default::default()
    };
    let listed = docker
        .list_containers(Some(options))
        .await
        .map_err(step("listing the job's containers"))?;
    let mut names: Vec<String> = listed.into_iter().filter_map(|c| c.id).collect();
    names.push(job.container());
    names.push(job.helper_container());
    names.extend((0..job.services.len()).map(|i| job.service_container(i)));
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

/// The job ids whose objects (containers, networks, volumes) are on the instance.
async fn jobs_on_instance(docker: &Docker) -> Vec<String> {
    let mut ids = Vec::new();
    let containers = ListContainersOptions {
        all: true,
        filters: label_filter(JOB_LABEL.to_string()),
        ..Default::default()
    };
    if let Ok(list) = docker.list_containers(Some(containers)).await {
        ids.extend(list.into_iter().filter_map(|c| c.labels?.remove(JOB_LABEL)));
    }
    let networks = ListNetworksOptions {
        filters: label_filter(JOB_LABEL.to_string()),
    };
    if let Ok(list) = docker.list_networks(Some(networks)).await {
        ids.extend(list.into_iter().filter_map(|n| n.labels?.remove(JOB_LABEL)));
    }
    let volumes = ListVolumesOptions {
        filters: label_filter(JOB_LABEL.to_string()),
    };
    if let Ok(answer) = docker.list_volumes(Some(volumes)).await {
        ids.extend(
            answer
                .volumes
                .unwrap_or_default()
                .into_iter()
                .filter_map(|mut v| v.labels.remove(JOB_LABEL)),
        );
    }
    ids.sort();
    ids.dedup();
    ids
}

/// Removes what jobs left that have no live lease any more: no lease at all (a driver that
/// died before cleanup), or a failed one (its instance was lost to the host, and its cleanup
/// could not reach it). Best effort: leftovers never fail the current job.
pub(crate) async fn remove_leftovers(api: &ApiClient, docker: &Docker, current: &Job) {
    for id in jobs_on_instance(docker).await {
        if id == current.id {
            continue;
        }
        let (lost, failed) = match api.lease_by_label("gitlab-job", &id).await {
            Ok(None) => (true, None),
            Ok(Some(lease)) => match lease.state {
                LeaseState::Failed { .. } => (true, Some(lease.id)),
                _ => (false, None),
            },
            Err(_) => (false, None),
        };
        if lost {
            tracing::info!(job = %id, "removing what a lost job left behind");
            let removed = remove_job_objects(docker, &Job::stale(&id)).await;
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
pub(crate) async fn bound_caches(docker: &Docker, bounds: CacheBounds, keep: &[String]) {
    let options = ListVolumesOptions {
        filters: label_filter(CACHE_LABEL.to_string()),
    };
    let Ok(answer) = docker.list_volumes(Some(options)).await else {
        return;
    };
    let now = chrono::Utc::now();
    let mut volumes: Vec<(chrono::DateTime<chrono::Utc>, String)> = answer
        .volumes
        .unwrap_or_default()
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

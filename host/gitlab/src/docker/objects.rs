//! The job's objects on its instance, through the lease's Docker handle: images pulled as
//! the policy says (with the job's own registry credentials), the job's network, builds
//! volume, project cache volume, service containers and job container, all labelled with
//! the job id; their removal, including what lost or failed jobs left; and the bounds on
//! project caches.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, ListContainersOptions, ListNetworksOptions,
    ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions,
};
use futures_util::StreamExt;

use crate::api::{ApiClient, LeaseState};
use crate::docker::DockerSettings;
use crate::image::Reference;
use crate::job::{CacheBounds, Job, JobLimits, PullPolicy, Service};
use crate::outcome::say;
use crate::place::StepError;

/// The label on every object the driver creates for a job, with the job id.
pub const JOB_LABEL: &str = "io.flotilla.gitlab.job";
/// The label on project cache volumes, with the project id.
pub const CACHE_LABEL: &str = "io.flotilla.gitlab.cache";

/// Classifies a Docker call's error with what was being done.
pub(crate) fn step(
    what: impl std::fmt::Display,
) -> impl FnOnce(bollard::errors::Error) -> StepError {
    move |e| {
        let message = format!("{what}: {e}");
        if host_down(&e) {
            StepError::HostDown(message)
        } else {
            StepError::Failed(message)
        }
    }
}

/// Whether a Docker call failed because the host (not the engine) did not answer: no
/// connection, a connection cut, or the host saying the pool is starting or draining.
pub(crate) fn host_down(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError {
            status_code,
            message,
        } => {
            *status_code == 503
                && flotilla_api::ErrorCode::ALL
                    .iter()
                    .filter(|c| c.restarting())
                    .any(|c| message.contains(c.name()))
        }
        E::IOError { .. } | E::HyperResponseError { .. } | E::RequestTimeoutError => true,
        _ => false,
    }
}

/// An engine answer's status, for the idempotent cases ("not found", "already exists").
fn status(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The engine's credentials for `image`'s registry from `DOCKER_AUTH_CONFIG`, if any.
fn credentials(
    job: &Job,
    image: &Reference,
) -> Result<Option<bollard::auth::DockerCredentials>, StepError> {
    let Some(text) = &job.auth_config else {
        return Ok(None);
    };
    let failed = |why: String| StepError::Failed(format!("DOCKER_AUTH_CONFIG: {why}"));
    let config: serde_json::Value =
        serde_json::from_str(text).map_err(|e| failed(format!("not JSON: {e}")))?;
    let registry = image.registry();
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
        .map_err(|_| failed(format!("the auth of {registry} is not base64")))?;
    let decoded = String::from_utf8_lossy(&decoded).into_owned();
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| failed(format!("the auth of {registry} is not user:password")))?;
    Ok(Some(bollard::auth::DockerCredentials {
        username: Some(user.to_string()),
        password: Some(password.to_string()),
        serveraddress: Some(registry),
        ..Default::default()
    }))
}

/// Pulls `image` as the policy says; the time spent pulling.
pub(crate) async fn pull(
    docker: &Docker,
    job: &Job,
    image: &str,
    policy: PullPolicy,
) -> Result<Duration, StepError> {
    let present = match policy {
        PullPolicy::Always => false,
        _ => docker.inspect_image(image).await.is_ok(),
    };
    match (policy, present) {
        (PullPolicy::IfNotPresent | PullPolicy::Never, true) => return Ok(Duration::ZERO),
        (PullPolicy::Never, false) => {
            return Err(StepError::Failed(format!(
                "image {image} is not on the instance and the pull policy is never"
            )));
        }
        _ => {}
    }
    say(&format!("Pulling image {image}..."));
    let start = Instant::now();
    let reference = Reference::parse(image);
    let options = CreateImageOptions {
        from_image: Some(reference.repository.clone()),
        tag: Some(reference.pull_tag()),
        ..Default::default()
    };
    let auth = credentials(job, &reference)?;
    let mut progress = docker.create_image(Some(options), None, auth);
    while let Some(item) = progress.next().await {
        let info = item.map_err(step(format!("pulling image {image}")))?;
        if let Some(error) = info.error_detail.and_then(|d| d.message) {
            return Err(StepError::Failed(format!("pulling image {image}: {error}")));
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

/// The limits of a container.
fn limited(limits: JobLimits, config: HostConfig) -> HostConfig {
    HostConfig {
        memory: limits.memory_bytes,
        nano_cpus: limits.nano_cpus,
        pids_limit: limits.pids,
        ..config
    }
}

/// Creates the job's network, builds volume, cache volume, services and job container, and
/// starts them; the time spent pulling.
pub(crate) async fn create_job(
    docker: &Docker,
    api: &ApiClient,
    job: &Job,
    image: &str,
    settings: &DockerSettings,
) -> Result<Duration, StepError> {
    let mut pulling = pull(docker, job, image, settings.pull_policy).await?;
    for service in &job.services {
        pulling += pull(docker, job, &service.name, settings.pull_policy).await?;
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
        .map_err(step("creating the job's network"))?;
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(job.volume()),
            labels: Some(labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(step("creating the job's volume"))?;
    let cache = cache_volume(docker, job).await?;
    for (i, service) in job.services.iter().enumerate() {
        start_service(docker, job, i, service, &labels, settings.limits).await?;
    }
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        // PID 1 waits for the stages' execs and exits on TERM.
        entrypoint: Some(vec!["/bin/sh".into()]),
        cmd: Some(vec![
            "-c".into(),
            "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done".into(),
        ]),
        working_dir: Some(settings.builds_dir.clone()),
        labels: Some(labels.clone()),
        host_config: Some(limited(
            settings.limits,
            HostConfig {
                binds: Some(vec![
                    format!("{}:{}", job.volume(), settings.builds_dir),
                    format!("{cache}:{}", settings.cache_dir),
                ]),
                network_mode: Some(job.network()),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    let options = CreateContainerOptions {
        name: Some(job.container()),
        ..Default::default()
    };
    docker
        .create_container(Some(options), body)
        .await
        .map_err(step(format!("creating the job container from {image}")))?;
    let start = Instant::now();
    docker
        .start_container(
            &job.container(),
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(step("starting the job container"))?;
    say(&format!(
        "Job container {} started from {image} in {:.2} s",
        job.container(),
        start.elapsed().as_secs_f64()
    ));
    Ok(pulling)
}

/// The project's cache volume (created if missing); protected refs have their own, and no
/// other project's job ever mounts it.
async fn cache_volume(docker: &Docker, job: &Job) -> Result<String, StepError> {
    let name = job.cache_volume();
    let labels = HashMap::from([
        (CACHE_LABEL.to_string(), job.project.clone()),
        (
            format!("{CACHE_LABEL}.protected"),
            job.protected.to_string(),
        ),
    ]);
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(name.clone()),
            labels: Some(labels),
            ..Default::default()
        })
        .await
        .map_err(step("creating the project's cache volume"))?;
    Ok(name)
}

async fn start_service(
    docker: &Docker,
    job: &Job,
    i: usize,
    service: &Service,
    labels: &HashMap<String, String>,
    limits: JobLimits,
) -> Result<(), StepError> {
    let aliases = service.aliases();
    let env: Vec<String> = service
        .variables
        .0
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let body = ContainerCreateBody {
        image: Some(service.name.clone()),
        entrypoint: service.entrypoint.clone(),
        cmd: service.command.clone(),
        env: (!env.is_empty()).then_some(env),
        labels: Some(labels.clone()),
        host_config: Some(limited(
            limits,
            HostConfig {
                network_mode: Some(job.network()),
                ..Default::default()
            },
        )),
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
        .map_err(step(format!("creating service {}", service.name)))?;
    docker
        .start_container(
            &name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(step(format!("starting service {}", service.name)))?;
    say(&format!(
        "Service {} started as {}",
        service.name,
        aliases.join(", ")
    ));
    Ok(())
}

fn label_filter(value: String) -> Option<HashMap<String, Vec<String>>> {
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

/// Removes project cache volumes past their age, then the oldest beyond the count, skipping
/// the current job's and any in use (the engine refuses to remove those). Best effort.
pub(crate) async fn bound_caches(docker: &Docker, bounds: CacheBounds, keep: &str) {
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
        .filter(|v| v.name != keep)
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

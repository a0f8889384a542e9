//! The job's objects on its instance, through the lease's Docker handle: the job's network,
//! the builds volume of its project and slot, its project's cache volume, its service
//! containers, its job container and its helper container, all labelled with the job id
//! (the shared volumes with their project), and given what the operator's container options
//! say ([`ContainerOptions`], as the docker executor applies its own).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, DeviceMapping, EndpointSettings, HostConfig, NetworkCreateRequest,
    NetworkingConfig, VolumeCreateRequest,
};
use bollard::query_parameters::{CreateContainerOptions, StartContainerOptions};

use crate::docker::client::step;
use crate::docker::images::{self, Auth};
use crate::docker::{DockerSettings, helper};
use crate::job::{Job, JobLimits, PullPolicy, Service};
use crate::outcome::say;
use crate::place::StepError;
use crate::variables;

/// The label on every object the driver creates for a job, with the job id.
pub const JOB_LABEL: &str = "io.flotilla.gitlab.job";
/// The label on the volumes jobs of one project share on an instance (its cache volumes and
/// its builds volumes), with the project id.
pub const CACHE_LABEL: &str = "io.flotilla.gitlab.cache";

/// The docker executor's options that real pipelines rely on, given to the job's, helper and
/// service containers (`executors/docker/docker.go` `createHostConfig` and
/// `createHostConfigForService` in GitLab Runner).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerOptions {
    /// Run privileged (`docker:dind` as a service needs it). The pool must allow it too:
    /// the host refuses a privileged container for a pool without `allow_privileged`.
    pub privileged: bool,
    /// Extra volumes: `/path` (a volume of its own per container), or
    /// `source:/path[:ro|rw]` (a host path or a named volume).
    pub volumes: Vec<String>,
    /// `/dev/shm`'s size in bytes.
    pub shm_size: Option<i64>,
    /// Host devices: `/dev/x[:/dev/y[:rwm]]`.
    pub devices: Vec<String>,
    /// Extra `/etc/hosts` lines as `host:ip`.
    pub extra_hosts: Vec<String>,
    /// DNS servers.
    pub dns: Vec<String>,
}

/// What one of the job's containers is made of.
struct Spec<'a> {
    name: String,
    image: &'a str,
    env: Vec<String>,
    /// Replaces the image's entrypoint, when given.
    entrypoint: Option<Vec<String>>,
    /// Replaces the image's command, when given.
    cmd: Option<Vec<String>>,
    /// The working directory (the builds directory; services keep their image's).
    working_dir: Option<String>,
    binds: Vec<String>,
    aliases: Vec<String>,
}

fn labels(job: &Job, pool: &str) -> HashMap<String, String> {
    HashMap::from([
        (JOB_LABEL.to_string(), job.id.clone()),
        ("io.flotilla.pool".to_string(), pool.to_string()),
    ])
}

/// The host settings every container of the job gets: its network, binds, limits and the
/// operator's options.
fn host_config(
    job: &Job,
    limits: JobLimits,
    options: &ContainerOptions,
    binds: Vec<String>,
) -> HostConfig {
    let devices = options
        .devices
        .iter()
        .map(|d| {
            let mut parts = d.splitn(3, ':');
            let host = parts.next().unwrap_or_default().to_string();
            let inside = parts.next().map_or_else(|| host.clone(), str::to_string);
            let permissions = parts.next().unwrap_or("rwm").to_string();
            DeviceMapping {
                path_on_host: Some(host),
                path_in_container: Some(inside),
                cgroup_permissions: Some(permissions),
            }
        })
        .collect::<Vec<_>>();
    let nonempty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    HostConfig {
        binds: Some(binds),
        network_mode: Some(job.network()),
        memory: limits.memory_bytes,
        nano_cpus: limits.nano_cpus,
        pids_limit: limits.pids,
        privileged: options.privileged.then_some(true),
        shm_size: options.shm_size,
        devices: (!devices.is_empty()).then_some(devices),
        extra_hosts: nonempty(&options.extra_hosts),
        dns: nonempty(&options.dns),
        ..Default::default()
    }
}

/// PID 1 of the job's and helper containers: it waits for the stages' execs and exits on TERM.
fn idle() -> (Option<Vec<String>>, Option<Vec<String>>) {
    (
        Some(vec!["/bin/sh".into()]),
        Some(vec![
            "-c".into(),
            "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done".into(),
        ]),
    )
}

/// Creates and starts one container of the job.
async fn start(
    docker: &Docker,
    job: &Job,
    own: &DockerSettings,
    labels: &HashMap<String, String>,
    spec: Spec<'_>,
) -> Result<(), StepError> {
    let body = ContainerCreateBody {
        image: Some(spec.image.to_string()),
        entrypoint: spec.entrypoint,
        cmd: spec.cmd,
        env: (!spec.env.is_empty()).then_some(spec.env),
        working_dir: spec.working_dir,
        labels: Some(labels.clone()),
        host_config: Some(host_config(job, own.limits, &own.options, spec.binds)),
        networking_config: (!spec.aliases.is_empty()).then(|| NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                job.network(),
                EndpointSettings {
                    aliases: Some(spec.aliases.clone()),
                    ..Default::default()
                },
            )])),
        }),
        ..Default::default()
    };
    let options = CreateContainerOptions {
        name: Some(spec.name.clone()),
        ..Default::default()
    };
    docker
        .create_container(Some(options), body)
        .await
        .map_err(step(format!(
            "creating container {} from {}",
            spec.name, spec.image
        )))?;
    docker
        .start_container(&spec.name, None::<StartContainerOptions>)
        .await
        .map_err(step(format!("starting container {}", spec.name)))?;
    Ok(())
}

/// Pulls what the job needs: its image and services with the job's credentials as the
/// policy says, the helper image with the operator's when it is missing; the time spent (the
/// sum, as each pull's own time). Which are missing is asked one image after another, each a
/// quick inspect on the one kept connection to the host (at once, each took a connection of
/// its own, on the host and through the instance's SSH too); the pulls, which may take
/// minutes, run at once.
async fn pull_all(
    docker: &Docker,
    job: &Job,
    image: &str,
    helper_image: Option<&str>,
    own: &DockerSettings,
) -> Result<Duration, StepError> {
    let job_auth = job.auth_config.as_deref().map(|text| Auth {
        text,
        source: "DOCKER_AUTH_CONFIG",
    });
    let operator = own.helper_registry_auth.as_deref().map(|text| Auth {
        text,
        source: "--helper-registry-auth",
    });
    let mut pulls: Vec<Pending<'_, Duration>> = Vec::new();
    for name in std::iter::once(image).chain(job.services.iter().map(|s| s.name.as_str())) {
        if images::must_pull(docker, name, own.pull_policy).await? {
            pulls.push(Box::pin(images::pull(docker, job_auth, name)));
        }
    }
    if let Some(helper_image) = helper_image {
        let helper = move |e| match e {
            StepError::Failed(why) => StepError::Failed(format!(
                "the helper image {helper_image} (checkout, cache and artifacts run there; --helper-image names another): {why}"
            )),
            down => down,
        };
        let missing = images::must_pull(docker, helper_image, PullPolicy::IfNotPresent)
            .await
            .map_err(helper)?;
        if missing {
            pulls.push(Box::pin(async move {
                images::pull(docker, operator, helper_image)
                    .await
                    .map_err(helper)
            }));
        }
    }
    let pulled = futures_util::future::try_join_all(pulls).await?;
    Ok(pulled.into_iter().sum())
}

/// What failed when the job's network could not be made. An engine's address pools run out
/// when an instance holds more job networks than they have subnets (Docker's defaults have 31):
/// the error then says what to change.
fn network_failure(e: &bollard::errors::Error) -> &'static str {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. }
            if message.contains("non-overlapping") && message.contains("address pool") =>
        {
            "creating the job's network (the engine's address pools are used up: each job on \
             an instance takes one network and one subnet; give dockerd larger \
             `default-address-pools`, or run fewer jobs per instance)"
        }
        _ => "creating the job's network",
    }
}

/// One of the steps `prepare` takes at once.
type Pending<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, StepError>> + 'a>>;

/// Creates the job's network, volumes, services, job container and helper container, and
/// starts them, each step's independent parts at once; the time spent pulling.
pub(crate) async fn create_job(
    docker: &Docker,
    pool: &str,
    job: &Job,
    image: &str,
    own: &DockerSettings,
    slot: u32,
) -> Result<Duration, StepError> {
    let helper_image = helper::image(docker, own, job).await?;
    let pulling = pull_all(docker, job, image, helper_image.as_deref(), own).await?;
    let labels = labels(job, pool);
    let mut binds = network_and_volumes(docker, job, own, slot, &labels).await?;
    binds.extend(own.options.volumes.iter().cloned());
    let env = variables::environment(&job.variables);
    let began = Instant::now();
    let idle_in = |name: String, image| {
        let (entrypoint, cmd) = idle();
        Spec {
            name,
            image,
            env: env.clone(),
            entrypoint,
            cmd,
            working_dir: Some(own.builds_dir.clone()),
            binds: binds.clone(),
            aliases: Vec::new(),
        }
    };
    let mut steps: Vec<Pending<'_, ()>> = job
        .services
        .iter()
        .enumerate()
        .map(|(i, service)| -> Pending<'_, ()> {
            Box::pin(start_service(docker, job, own, &labels, i, service, &binds))
        })
        .collect();
    steps.push(Box::pin(start(
        docker,
        job,
        own,
        &labels,
        idle_in(job.container(), image),
    )));
    if let Some(helper_image) = helper_image.as_deref() {
        let spec = idle_in(job.helper_container(), helper_image);
        steps.push(Box::pin(async {
            start(docker, job, own, &labels, spec).await?;
            helper::install(docker, job, helper_image, &[]).await
        }));
    }
    futures_util::future::try_join_all(steps).await?;
    say(&format!(
        "Job container {} started from {image}{}, in {:.2} s",
        job.container(),
        helper_image
            .as_deref()
            .map(|h| format!(", with the helper {h}"))
            .unwrap_or_default(),
        began.elapsed().as_secs_f64()
    ));
    Ok(pulling)
}

/// The job's network and its project's builds and cache volumes, the network beside the
/// volumes; the volumes' binds.
async fn network_and_volumes(
    docker: &Docker,
    job: &Job,
    own: &DockerSettings,
    slot: u32,
    labels: &HashMap<String, String>,
) -> Result<Vec<String>, StepError> {
    let network = async {
        docker
            .create_network(NetworkCreateRequest {
                name: job.network(),
                driver: Some("bridge".into()),
                labels: Some(labels.clone()),
                ..Default::default()
            })
            .await
            .map_err(|e| step(network_failure(&e))(e))
    };
    let (builds, cache) = (job.builds_volume(slot), job.cache_volume());
    // The network (the slow one: the engine writes its firewall rules) beside the two volumes,
    // which are quick and go one after the other on one connection to the host.
    let volumes = async {
        let builds = shared_volume(docker, job, &builds, "builds").await;
        (builds, shared_volume(docker, job, &cache, "cache").await)
    };
    let (network, (builds, cache)) = tokio::join!(network, volumes);
    network?;
    Ok(vec![
        format!("{}:{}", builds?, own.builds_dir),
        format!("{}:{}", cache?, own.cache_dir),
    ])
}

/// A volume the jobs of the project share on the instance (its `kind`, builds or cache),
/// created if missing; protected refs have their own, and no other project's job ever mounts
/// one.
async fn shared_volume(
    docker: &Docker,
    job: &Job,
    name: &str,
    kind: &str,
) -> Result<String, StepError> {
    let labels = HashMap::from([
        (CACHE_LABEL.to_string(), job.project.clone()),
        (
            format!("{CACHE_LABEL}.protected"),
            job.protected.to_string(),
        ),
        (format!("{CACHE_LABEL}.kind"), kind.to_string()),
    ]);
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        })
        .await
        .map_err(step(format!("creating the project's {kind} volume")))?;
    Ok(name.to_string())
}

async fn start_service(
    docker: &Docker,
    job: &Job,
    own: &DockerSettings,
    labels: &HashMap<String, String>,
    i: usize,
    service: &Service,
    binds: &[String],
) -> Result<(), StepError> {
    let aliases = service.aliases();
    let spec = Spec {
        name: job.service_container(i),
        image: &service.name,
        env: variables::for_service(&job.variables, &service.variables.0),
        entrypoint: service.entrypoint.clone(),
        cmd: service.command.clone(),
        working_dir: None,
        binds: binds.to_vec(),
        aliases: aliases.clone(),
    };
    start(docker, job, own, labels, spec).await?;
    say(&format!(
        "Service {} started as {}",
        service.name,
        aliases.join(", ")
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::network_failure;

    fn engine(message: &str) -> bollard::errors::Error {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            message: message.into(),
        }
    }

    #[test]
    fn used_up_address_pools_are_named_with_the_fix() {
        // dockerd 26's words (libnetwork's ipamutils), as a job met them.
        let used_up = engine(
            "could not find an available, non-overlapping IPv4 address pool among the \
             defaults to assign to the network",
        );
        assert!(network_failure(&used_up).contains("default-address-pools"));
        let other = engine("network with name flotilla-job-1 already exists");
        assert_eq!(network_failure(&other), "creating the job's network");
    }
}

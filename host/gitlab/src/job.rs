//! What the runner hands each stage: the job's identity (its id, project and whether its ref
//! is protected, all from the runner-written `JOB_RESPONSE_FILE`, never from variables a job
//! can set), its image and services (`CUSTOM_ENV_*`), and the exit-code contract; plus the
//! driver's own settings. Read from an environment map so tests can play the runner exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::setting::SettingError;
use crate::variables::Variable;

/// Why the job's environment cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// Something the runner must provide is missing or malformed.
    #[error("{0}")]
    Invalid(String),
}

/// When to pull the job's images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull every time: the registry checks the job's credentials for every job, so a private
    /// image one project pulled can never run for another that has no access (GitLab
    /// Runner's default for the same reason).
    Always,
    /// Pull only when the instance does not have the image. Faster, but any job on the
    /// instance can then run a private image another job pulled, without credentials.
    IfNotPresent,
    /// Never pull; the image must be on the instance.
    Never,
}

impl PullPolicy {
    /// Every policy's name, as [`PullPolicy::name`] spells it.
    pub const NAMES: &'static [&'static str] = &["always", "if-not-present", "never"];

    /// Parses `always`, `if-not-present` or `never`.
    pub fn parse(text: &str) -> Result<PullPolicy, SettingError> {
        match text.trim() {
            "always" => Ok(PullPolicy::Always),
            "if-not-present" => Ok(PullPolicy::IfNotPresent),
            "never" => Ok(PullPolicy::Never),
            other => Err(SettingError::new(
                "pull policy",
                other,
                "expected always, if-not-present or never",
            )),
        }
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PullPolicy::Always => "always",
            PullPolicy::IfNotPresent => "if-not-present",
            PullPolicy::Never => "never",
        }
    }
}

/// Resource limits of each job container and each service container (Docker's `--memory`,
/// `--cpus` and `--pids-limit`). `None`: the engine's default (no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobLimits {
    /// Memory in bytes.
    pub memory_bytes: Option<i64>,
    /// CPUs in billionths of a CPU (`--cpus 1.5` is 1_500_000_000).
    pub nano_cpus: Option<i64>,
    /// Processes and threads.
    pub pids: Option<i64>,
}

/// How much the driver keeps of project caches on each instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheBounds {
    /// A cache volume older than this is removed (when no job uses it) and starts afresh.
    pub max_age: Duration,
    /// Cache volumes kept on one instance (one per project and protection); past it, the
    /// oldest unused ones are removed first. Counting stands in for size, which the engine
    /// computes only by walking every volume.
    pub max_volumes: usize,
}

/// The driver's own settings (flags of `flotilla gitlab`, or `FLOTILLA_*` variables).
#[derive(Debug, Clone)]
pub struct DriverSettings {
    /// How long `prepare` waits for an instance (and any stage for a pool that is starting).
    pub acquire_timeout: Duration,
    /// How long any stage waits for a host that does not answer at all (a restart, an
    /// upgrade) before it fails the job as a system failure.
    pub restart_window: Duration,
    /// Take the job's identity from `CUSTOM_ENV_CI_JOB_ID` and friends when the runner writes
    /// no `JOB_RESPONSE_FILE`. Unsafe: a job can set those variables and name another job.
    pub job_identity_from_variables: bool,
    /// The driver's own directory on the manager, where a cleanup that could not reach the
    /// host waits for the next driver call that can (`None`: nowhere to keep it).
    pub state_dir: Option<PathBuf>,
    /// Added to the job's own timeout (from the runner) for its lease's deadline: past it the
    /// host fails the lease even if no driver ever comes back.
    pub deadline_grace: Duration,
    /// Where jobs run: in containers (the default), or on the machine itself.
    pub mode: Mode,
}

/// Where the driver runs jobs.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Each job in a container on the leased instance, through its Docker handle.
    Docker(Box<crate::docker::DockerSettings>),
    /// Each job directly on the leased machine, over the host's SSH session to it.
    Instance(crate::instance::settings::InstanceSettings),
}

/// `variables` of a service: a map (`CI_JOB_SERVICES` of runner 19.0+) or a list of
/// `{key, value}` (the job response file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceVariables(pub BTreeMap<String, String>);

impl<'de> Deserialize<'de> for ServiceVariables {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Map(BTreeMap<String, String>),
            List(Vec<Variable>),
            Null(()),
        }
        Ok(ServiceVariables(match Raw::deserialize(d)? {
            Raw::Map(map) => map,
            Raw::List(list) => list.into_iter().map(|v| (v.key, v.value)).collect(),
            Raw::Null(()) => BTreeMap::new(),
        }))
    }
}

/// One service container of the job (`CUSTOM_ENV_CI_JOB_SERVICES`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Service {
    /// The image.
    pub name: String,
    /// The host name the job reaches it by.
    #[serde(default)]
    pub alias: Option<String>,
    /// Overrides the image's entrypoint.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Overrides the image's command.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// The service's own variables (`services: [{name, variables: {...}}]`).
    #[serde(default)]
    pub variables: ServiceVariables,
}

impl Service {
    /// The aliases Docker gives it on the job's network: the explicit alias, or the image
    /// name without tag and with `/` as `__` and `-` (as GitLab's docker executor does).
    pub fn aliases(&self) -> Vec<String> {
        if let Some(alias) = self.alias.as_deref().filter(|a| !a.is_empty()) {
            return alias
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect();
        }
        let base = crate::image::Reference::parse(&self.name).repository;
        let mut out = vec![base.replace('/', "__")];
        let dashed = base.replace('/', "-");
        if !out.contains(&dashed) {
            out.push(dashed);
        }
        out
    }
}

/// One job, as the runner describes it to every stage.
#[derive(Debug, Clone)]
pub struct Job {
    /// GitLab's job id.
    pub id: String,
    /// The job's project id, which keys its cache.
    pub project: String,
    /// Whether the job's ref is protected: its cache is kept apart from unprotected refs',
    /// so a merge request cannot poison what a protected branch restores.
    pub protected: bool,
    /// The job's image (`CUSTOM_ENV_CI_JOB_IMAGE`).
    pub image: Option<String>,
    /// Its services.
    pub services: Vec<Service>,
    /// `docker login` credentials (`CUSTOM_ENV_DOCKER_AUTH_CONFIG`), as JSON.
    pub auth_config: Option<String>,
    /// Exit code for a job failure.
    pub build_failure: i32,
    /// Exit code for an infrastructure failure.
    pub system_failure: i32,
    /// Where to write the job's real exit code.
    pub build_exit_code_file: Option<PathBuf>,
    /// The job's own timeout, as GitLab sent it to the runner (`runner_info.timeout`).
    pub timeout: Option<Duration>,
    /// The job's CI variables, as GitLab sent them to the runner (the response file's).
    pub variables: Vec<Variable>,
    /// The runner's version (`CI_RUNNER_VERSION`), which names the default helper image.
    pub runner_version: Option<String>,
    /// The runner's short token (`CI_RUNNER_SHORT_TOKEN`), which names the job's builds
    /// volume, so runners sharing a fleet never share a checkout.
    pub runner_short_token: Option<String>,
    /// The runner's own directory for this job, the one `JOB_RESPONSE_FILE` is in: the
    /// Custom executor makes it before `config` and removes it after `cleanup`, and runs
    /// every stage there (`executors/custom/custom.go`). The driver leaves notes for the
    /// job's later stages in it.
    pub scratch: Option<PathBuf>,
}

/// The largest services list taken from the environment.
pub(crate) const MAX_SERVICES: usize = 16;

/// The parts of GitLab Runner's job response file (`JOB_RESPONSE_FILE`, runner 14.1+) the
/// driver trusts: the runner writes it from what GitLab sent, so no job variable can change it.
#[derive(Debug, Deserialize)]
struct ResponseFile {
    id: u64,
    #[serde(default)]
    job_info: Option<JobInfo>,
    #[serde(default)]
    git_info: Option<GitInfo>,
    #[serde(default)]
    variables: Vec<Variable>,
    #[serde(default)]
    services: Vec<ResponseService>,
    #[serde(default)]
    runner_info: Option<RunnerInfo>,
}

/// `runner_info` of the job response (`common/spec/spec.go` `RunnerInfo` in GitLab Runner).
#[derive(Debug, Deserialize)]
struct RunnerInfo {
    /// The job's timeout in seconds.
    #[serde(default)]
    timeout: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct JobInfo {
    #[serde(default)]
    project_id: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct GitInfo {
    /// `null` or absent before GitLab 18.3 / runner 18.4.
    #[serde(default)]
    protected: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ResponseService {
    #[serde(default)]
    name: String,
    #[serde(default)]
    variables: ServiceVariables,
}

/// The job's identity: id, project, protected ref; and the services' variables the response
/// file lists.
struct Identity {
    id: String,
    project: String,
    protected: bool,
    service_variables: Vec<(String, ServiceVariables)>,
    timeout: Option<Duration>,
    variables: Vec<Variable>,
}

impl Job {
    /// Reads the job from the runner's environment. Without `JOB_RESPONSE_FILE` the job is
    /// refused unless `identity_from_variables` (see [`DriverSettings`]).
    pub fn from_env(
        env: &BTreeMap<String, String>,
        identity_from_variables: bool,
    ) -> Result<Job, JobError> {
        let code = |name: &str, default: i32| -> Result<i32, JobError> {
            match env.get(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| JobError::Invalid(format!("{name}={v:?} is not an exit code"))),
            }
        };
        let build_failure = code("BUILD_FAILURE_EXIT_CODE", 1)?;
        let system_failure = code("SYSTEM_FAILURE_EXIT_CODE", 2)?;
        let identity = Job::identity(env, identity_from_variables)?;
        let mut services = match env.get("CUSTOM_ENV_CI_JOB_SERVICES").map(|s| s.trim()) {
            None | Some("") | Some("null") => Vec::new(),
            Some(text) => serde_json::from_str::<Vec<Service>>(text).map_err(|e| {
                JobError::Invalid(format!(
                    "CUSTOM_ENV_CI_JOB_SERVICES is not a services list: {e}"
                ))
            })?,
        };
        if identity.variables.len() > crate::variables::MAX_VARIABLES {
            return Err(JobError::Invalid(format!(
                "the job carries {} variables; at most {}",
                identity.variables.len(),
                crate::variables::MAX_VARIABLES
            )));
        }
        if services.len() > MAX_SERVICES {
            return Err(JobError::Invalid(format!(
                "the job asks for {} services; at most {MAX_SERVICES}",
                services.len()
            )));
        }
        // Runners before 19.0 leave `variables` out of CI_JOB_SERVICES; the response file
        // lists them for every service, in the same order.
        for (service, (name, variables)) in services.iter_mut().zip(identity.service_variables) {
            if service.variables.0.is_empty() && service.name == name {
                service.variables = variables;
            }
        }
        let nonempty = |name: &str| env.get(name).filter(|v| !v.trim().is_empty()).cloned();
        Ok(Job {
            id: identity.id,
            project: identity.project,
            protected: identity.protected,
            image: nonempty("CUSTOM_ENV_CI_JOB_IMAGE"),
            services,
            auth_config: nonempty("CUSTOM_ENV_DOCKER_AUTH_CONFIG"),
            build_failure,
            system_failure,
            build_exit_code_file: env.get("BUILD_EXIT_CODE_FILE").map(PathBuf::from),
            timeout: identity.timeout,
            variables: identity.variables,
            runner_version: nonempty("CUSTOM_ENV_CI_RUNNER_VERSION"),
            runner_short_token: nonempty("CUSTOM_ENV_CI_RUNNER_SHORT_TOKEN"),
            scratch: env
                .get("JOB_RESPONSE_FILE")
                .and_then(|f| std::path::Path::new(f).parent())
                .filter(|d| !d.as_os_str().is_empty())
                .map(PathBuf::from),
        })
    }

    fn identity(
        env: &BTreeMap<String, String>,
        from_variables: bool,
    ) -> Result<Identity, JobError> {
        if let Some(path) = env.get("JOB_RESPONSE_FILE") {
            return Job::identity_from_file(path);
        }
        if !from_variables {
            return Err(JobError::Invalid(
                "JOB_RESPONSE_FILE is not set: the job's identity must come from GitLab Runner (14.1 or later) itself, not from job variables a job can set; run this from the Custom executor, or pass --unsafe-job-identity-from-variables on a runner that only ever runs trusted jobs".into(),
            ));
        }
        let number = |name: &str| match env.get(name) {
            Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && v.len() <= 20 => {
                Ok(v.clone())
            }
            Some(v) => Err(JobError::Invalid(format!("{name}={v:?} is not a number"))),
            None => Err(JobError::Invalid(format!(
                "neither JOB_RESPONSE_FILE nor {name} is set"
            ))),
        };
        Ok(Identity {
            id: number("CUSTOM_ENV_CI_JOB_ID")?,
            project: number("CUSTOM_ENV_CI_PROJECT_ID")?,
            protected: env
                .get("CUSTOM_ENV_CI_COMMIT_REF_PROTECTED")
                .is_some_and(|v| v == "true"),
            service_variables: Vec::new(),
            timeout: None,
            variables: Vec::new(),
        })
    }

    fn identity_from_file(path: &str) -> Result<Identity, JobError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| JobError::Invalid(format!("JOB_RESPONSE_FILE {path}: {e}")))?;
        let file: ResponseFile = serde_json::from_str(&text).map_err(|e| {
            JobError::Invalid(format!(
                "JOB_RESPONSE_FILE {path}: not a job response (a numeric .id is required): {e}"
            ))
        })?;
        let project = file
            .job_info
            .and_then(|i| i.project_id)
            .ok_or_else(|| {
                JobError::Invalid(format!(
                    "JOB_RESPONSE_FILE {path}: no .job_info.project_id; the job's cache cannot be kept apart from other projects'"
                ))
            })?;
        // GitLab 18.3+ sends git_info.protected; before, the first (predefined) value of
        // CI_COMMIT_REF_PROTECTED, as GitLab Runner itself falls back to it.
        let protected = file.git_info.and_then(|g| g.protected).unwrap_or_else(|| {
            file.variables
                .iter()
                .find(|v| v.key == "CI_COMMIT_REF_PROTECTED")
                .is_some_and(|v| v.value == "true")
        });
        Ok(Identity {
            id: file.id.to_string(),
            project: project.to_string(),
            protected,
            service_variables: file
                .services
                .into_iter()
                .map(|s| (s.name, s.variables))
                .collect(),
            timeout: file
                .runner_info
                .and_then(|r| r.timeout)
                .filter(|t| *t > 0)
                .map(Duration::from_secs),
            variables: file.variables,
        })
    }

    /// The lease label that ties the lease to the job.
    pub fn label(&self) -> (String, String) {
        ("gitlab-job".to_string(), self.id.clone())
    }

    /// Names of the job's objects on the instance.
    pub fn container(&self) -> String {
        Job::container_of(&self.id)
    }

    /// The job container's name for job `id`.
    pub fn container_of(id: &str) -> String {
        format!("flotilla-job-{id}")
    }

    /// The job's network.
    pub fn network(&self) -> String {
        format!("flotilla-job-{}", self.id)
    }

    /// The job's builds volume.
    pub fn volume(&self) -> String {
        format!("flotilla-job-{}-builds", self.id)
    }

    /// The job's helper container: git and the runner's helper binary, for the runner's own
    /// stages.
    pub fn helper_container(&self) -> String {
        format!("flotilla-job-{}-helper", self.id)
    }

    /// The builds volume of the job's project and concurrency slot on the instance, kept
    /// across jobs as the docker executor keeps `runner-<short token>-project-<id>-concurrent-<n>`,
    /// so `GIT_STRATEGY=fetch` finds the worktree. A slot serves one job at a time, so two jobs
    /// never share a checkout; projects, runners and protected refs never share a volume.
    pub fn builds_volume(&self, slot: u32) -> String {
        let token = name_part(
            self.runner_short_token.as_deref().unwrap_or(""),
            16,
            "flotilla",
        );
        let kind = if self.protected { "-protected" } else { "" };
        format!(
            "runner-{token}-project-{}-concurrent-{slot}{kind}",
            self.project
        )
    }

    /// The `i`th service's container.
    pub fn service_container(&self, i: usize) -> String {
        format!("flotilla-job-{}-service-{i}", self.id)
    }

    /// The project's cache volume on the instance; protected refs get their own.
    pub fn cache_volume(&self) -> String {
        let kind = if self.protected { "-protected" } else { "" };
        format!("flotilla-cache-project-{}{kind}", self.project)
    }

    /// A job with no more than an id, for removing what a lost job left.
    pub(crate) fn stale(id: &str) -> Job {
        Job {
            id: id.to_string(),
            project: String::new(),
            protected: false,
            image: None,
            services: Vec::new(),
            auth_config: None,
            build_failure: 1,
            system_failure: 2,
            build_exit_code_file: None,
            timeout: None,
            variables: Vec::new(),
            runner_version: None,
            runner_short_token: None,
            scratch: None,
        }
    }

    /// Notes that this job's `prepare` finished: everything it made on the instance exists,
    /// on lease `lease` of the API and pool `scope` names. The later stages run on that lease
    /// without asking the host for it again.
    pub(crate) fn mark_prepared(&self, lease: u64, scope: &str) {
        if let Some(dir) = &self.scratch {
            // Best effort: without the note, cleanup only takes longer and each stage asks
            // the host for the job's lease.
            let _ = std::fs::write(dir.join(PREPARED), format!("{scope} {lease}\n"));
        }
    }

    /// The lease this job's finished `prepare` noted, if it ran against the API and pool
    /// `scope` names (a note of another host or pool, of an older driver, or unreadable:
    /// `None`, and the stage asks the host).
    pub(crate) fn prepared_lease(&self, scope: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.scratch.as_ref()?.join(PREPARED)).ok()?;
        let (noted, lease) = text.strip_suffix('\n')?.split_once(' ')?;
        if noted != scope || lease.is_empty() || !lease.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        lease.parse().ok()
    }

    /// Whether this job's `prepare` finished (so none of its creations can still be in
    /// flight when `cleanup` sweeps).
    pub(crate) fn was_prepared(&self) -> bool {
        self.scratch
            .as_ref()
            .is_some_and(|dir| dir.join(PREPARED).is_file())
    }
}

/// The note a finished `prepare` leaves in the job's [`Job::scratch`] directory.
const PREPARED: &str = "flotilla-prepared";

/// `text` as part of a Docker object's or a directory's name: ASCII letters, digits, `-` and
/// `_` only, at most `max` of them, and `fallback` when nothing is left.
pub(crate) fn name_part(text: &str, max: usize, fallback: &str) -> String {
    let kept: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(max)
        .collect();
    if kept.is_empty() {
        fallback.to_string()
    } else {
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn response(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("response.json");
        std::fs::write(&file, text).expect("write");
        let path = file.to_str().expect("utf-8").to_string();
        (dir, path)
    }

    #[test]
    fn the_job_id_and_project_come_from_the_runners_response_file_not_from_job_variables() {
        let (_dir, path) = response(
            r#"{"id": 4242, "token": "glcbt-secret", "job_info": {"project_id": 42, "name": "x"},
                "git_info": {"ref": "main", "protected": true}}"#,
        );
        let job = Job::from_env(
            &env(&[
                ("JOB_RESPONSE_FILE", &path),
                ("CUSTOM_ENV_CI_JOB_ID", "1"),
                ("CUSTOM_ENV_CI_PROJECT_ID", "666"),
                ("CUSTOM_ENV_CI_COMMIT_REF_PROTECTED", "false"),
            ]),
            true,
        )
        .expect("a job");
        assert_eq!((job.id.as_str(), job.project.as_str()), ("4242", "42"));
        assert!(job.protected);
        assert_eq!(job.cache_volume(), "flotilla-cache-project-42-protected");
    }

    #[test]
    fn a_finished_prepare_is_noted_beside_the_response_file_for_the_later_stages() {
        let (dir, path) = response(r#"{"id": 7, "job_info": {"project_id": 1}}"#);
        let read = || Job::from_env(&env(&[("JOB_RESPONSE_FILE", &path)]), false).expect("job");
        let job = read();
        assert_eq!(job.scratch.as_deref(), Some(dir.path()));
        assert!(!job.was_prepared());
        assert_eq!(job.prepared_lease("cleanup-0123"), None);
        job.mark_prepared(42, "cleanup-0123");
        // Another stage's process reads the same job again.
        assert!(read().was_prepared());
        assert_eq!(read().prepared_lease("cleanup-0123"), Some(42));
        // Another host or pool's lease is not this one's.
        assert_eq!(read().prepared_lease("cleanup-4567"), None);
        // An older driver's note says only that prepare finished; a garbled one is not read.
        for text in [
            "",
            "cleanup-0123 42",
            "cleanup-0123 -42\n",
            "cleanup-0123 4x2\n",
        ] {
            std::fs::write(dir.path().join(PREPARED), text).expect("note");
            assert!(read().was_prepared());
            assert_eq!(read().prepared_lease("cleanup-0123"), None, "{text:?}");
        }
        let loose = Job::from_env(
            &env(&[
                ("CUSTOM_ENV_CI_JOB_ID", "8"),
                ("CUSTOM_ENV_CI_PROJECT_ID", "1"),
            ]),
            true,
        )
        .expect("job");
        loose.mark_prepared(42, "cleanup-0123");
        assert!(loose.scratch.is_none() && !loose.was_prepared());
        assert_eq!(loose.prepared_lease("cleanup-0123"), None);
    }

    #[test]
    fn without_the_response_file_a_job_is_refused_unless_the_operator_opted_in() {
        let vars = env(&[
            ("CUSTOM_ENV_CI_JOB_ID", "7"),
            ("CUSTOM_ENV_CI_PROJECT_ID", "3"),
        ]);
        let refused = Job::from_env(&vars, false).expect_err("refused");
        assert!(
            refused.to_string().contains("JOB_RESPONSE_FILE"),
            "{refused}"
        );
        let job = Job::from_env(&vars, true).expect("opted in");
        assert_eq!((job.id.as_str(), job.project.as_str()), ("7", "3"));
        assert!(Job::from_env(&env(&[("CUSTOM_ENV_CI_JOB_ID", "1; rm -rf /")]), true).is_err());
    }

    #[test]
    fn protection_falls_back_to_the_first_predefined_variable_and_projects_get_their_own_cache() {
        let (_dir, path) = response(
            r#"{"id": 9, "job_info": {"project_id": 5}, "git_info": {"protected": null},
                "variables": [{"key": "CI_COMMIT_REF_PROTECTED", "value": "true"},
                              {"key": "CI_COMMIT_REF_PROTECTED", "value": "false"}]}"#,
        );
        let job = Job::from_env(&env(&[("JOB_RESPONSE_FILE", &path)]), false).expect("job");
        assert!(job.protected);
        let (_dir2, other) = response(r#"{"id": 10, "job_info": {"project_id": 6}}"#);
        let other = Job::from_env(&env(&[("JOB_RESPONSE_FILE", &other)]), false).expect("job");
        assert!(!other.protected);
        assert_ne!(job.cache_volume(), other.cache_volume());
        let (_dir3, none) = response(r#"{"id": 11}"#);
        let refused = Job::from_env(&env(&[("JOB_RESPONSE_FILE", &none)]), false);
        assert!(refused.is_err(), "no project id, no shared cache");
    }

    #[test]
    fn service_variables_come_as_a_map_or_from_the_response_file() {
        let (_dir, path) = response(
            r#"{"id": 1, "job_info": {"project_id": 2},
                "services": [{"name": "db:1", "variables": [{"key": "POSTGRES_DB", "value": "app", "public": true}]}]}"#,
        );
        let job = Job::from_env(
            &env(&[
                ("JOB_RESPONSE_FILE", &path),
                (
                    "CUSTOM_ENV_CI_JOB_SERVICES",
                    r#"[{"name":"db:1","alias":"","entrypoint":null,"command":null},
                        {"name":"cache:2","alias":"c","variables":{"MODE":"fast"}}]"#,
                ),
            ]),
            false,
        )
        .expect("job");
        assert_eq!(
            job.services[0]
                .variables
                .0
                .get("POSTGRES_DB")
                .map(String::as_str),
            Some("app")
        );
        assert_eq!(
            job.services[1].variables.0.get("MODE").map(String::as_str),
            Some("fast")
        );
    }

    #[test]
    fn service_aliases_follow_gitlab() {
        let s = |name: &str, alias: Option<&str>| Service {
            name: name.into(),
            alias: alias.map(str::to_string),
            entrypoint: None,
            command: None,
            variables: ServiceVariables::default(),
        };
        assert_eq!(s("postgres:16", None).aliases(), ["postgres"]);
        assert_eq!(
            s("registry.example.com:5000/team/db:1", None).aliases(),
            [
                "registry.example.com:5000__team__db",
                "registry.example.com:5000-team-db"
            ]
        );
        assert_eq!(
            s(
                "postgres@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                None
            )
            .aliases(),
            ["postgres"]
        );
        assert_eq!(s("x", Some("db cache")).aliases(), ["db", "cache"]);
        assert_eq!(s("x", Some("db,cache")).aliases(), ["db", "cache"]);
    }

    #[test]
    fn exit_codes_and_services_are_read_and_checked() {
        let base = [
            ("CUSTOM_ENV_CI_JOB_ID", "7"),
            ("CUSTOM_ENV_CI_PROJECT_ID", "1"),
        ];
        let mut vars = env(&base);
        vars.extend(env(&[
            ("BUILD_FAILURE_EXIT_CODE", "11"),
            ("SYSTEM_FAILURE_EXIT_CODE", "12"),
            (
                "CUSTOM_ENV_CI_JOB_SERVICES",
                r#"[{"name":"redis:7","alias":"cache"}]"#,
            ),
        ]));
        let job = Job::from_env(&vars, true).expect("a job");
        assert_eq!((job.build_failure, job.system_failure), (11, 12));
        assert_eq!(job.services[0].aliases(), ["cache"]);
        let mut bad = env(&base);
        bad.insert("BUILD_FAILURE_EXIT_CODE".into(), "x".into());
        assert!(Job::from_env(&bad, true).is_err());
    }
}

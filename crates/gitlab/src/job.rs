//! What the runner hands each stage: the job's id (from the trusted `JOB_RESPONSE_FILE`), its
//! image and services (`CUSTOM_ENV_*`), and the exit-code contract; plus the driver's own
//! settings. Read from an environment map so tests can play the runner exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

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
    /// Pull every time (the registry decides what is current).
    Always,
    /// Pull only when the instance does not have the image.
    IfNotPresent,
    /// Never pull; the image must be on the instance.
    Never,
}

impl PullPolicy {
    /// Parses `always`, `if-not-present` or `never`.
    pub fn parse(text: &str) -> Result<PullPolicy, String> {
        match text.trim() {
            "always" => Ok(PullPolicy::Always),
            "if-not-present" => Ok(PullPolicy::IfNotPresent),
            "never" => Ok(PullPolicy::Never),
            other => Err(format!(
                "pull policy {other:?}: expected always, if-not-present or never"
            )),
        }
    }
}

/// The driver's own settings (flags of `flotilla gitlab`, or `FLOTILLA_*` variables).
#[derive(Debug, Clone)]
pub struct DriverSettings {
    /// Where the job's files live inside its container (the runner's `builds_dir`).
    pub builds_dir: String,
    /// Where the runner keeps its cache inside the container (`cache_dir`).
    pub cache_dir: String,
    /// The image when the job names none.
    pub default_image: Option<String>,
    /// When to pull.
    pub pull_policy: PullPolicy,
    /// How long `prepare` waits for an instance.
    pub acquire_timeout: Duration,
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
}

impl Service {
    /// The aliases Docker gives it on the job's network: the explicit alias, or the image
    /// name without tag and with `/` as `__` and `-` (as GitLab's docker executor does).
    pub fn aliases(&self) -> Vec<String> {
        if let Some(alias) = self.alias.as_deref().filter(|a| !a.is_empty()) {
            return alias.split_whitespace().map(str::to_string).collect();
        }
        let without_tag = match self.name.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => self.name.as_str(),
        };
        let base = without_tag.split('@').next().unwrap_or(without_tag);
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
}

/// The largest services list taken from the environment.
const MAX_SERVICES: usize = 16;

impl Job {
    /// Reads the job from the runner's environment.
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<Job, JobError> {
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
        let id = Job::job_id(env)?;
        let services = match env.get("CUSTOM_ENV_CI_JOB_SERVICES").map(|s| s.trim()) {
            None | Some("") | Some("null") => Vec::new(),
            Some(text) => serde_json::from_str::<Vec<Service>>(text).map_err(|e| {
                JobError::Invalid(format!(
                    "CUSTOM_ENV_CI_JOB_SERVICES is not a services list: {e}"
                ))
            })?,
        };
        if services.len() > MAX_SERVICES {
            return Err(JobError::Invalid(format!(
                "the job asks for {} services; at most {MAX_SERVICES}",
                services.len()
            )));
        }
        let nonempty = |name: &str| env.get(name).filter(|v| !v.trim().is_empty()).cloned();
        Ok(Job {
            id,
            image: nonempty("CUSTOM_ENV_CI_JOB_IMAGE"),
            services,
            auth_config: nonempty("CUSTOM_ENV_DOCKER_AUTH_CONFIG"),
            build_failure,
            system_failure,
            build_exit_code_file: env.get("BUILD_EXIT_CODE_FILE").map(PathBuf::from),
        })
    }

    /// The job id: `.id` of `JOB_RESPONSE_FILE` (written by the runner, so trusted), or
    /// `CUSTOM_ENV_CI_JOB_ID` for runners that do not write that file.
    fn job_id(env: &BTreeMap<String, String>) -> Result<String, JobError> {
        if let Some(path) = env.get("JOB_RESPONSE_FILE") {
            let text = std::fs::read_to_string(path)
                .map_err(|e| JobError::Invalid(format!("JOB_RESPONSE_FILE {path}: {e}")))?;
            let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                JobError::Invalid(format!("JOB_RESPONSE_FILE {path}: not JSON: {e}"))
            })?;
            return match value.get("id") {
                Some(serde_json::Value::Number(n)) if n.is_u64() => Ok(n.to_string()),
                _ => Err(JobError::Invalid(format!(
                    "JOB_RESPONSE_FILE {path}: no numeric job id in .id"
                ))),
            };
        }
        match env.get("CUSTOM_ENV_CI_JOB_ID") {
            Some(id) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && id.len() <= 20 => {
                Ok(id.clone())
            }
            Some(id) => Err(JobError::Invalid(format!(
                "CUSTOM_ENV_CI_JOB_ID={id:?} is not a job id"
            ))),
            None => Err(JobError::Invalid(
                "neither JOB_RESPONSE_FILE nor CUSTOM_ENV_CI_JOB_ID is set: run this from GitLab Runner's Custom executor".into(),
            )),
        }
    }

    /// The lease label that ties the lease to the job.
    pub fn label(&self) -> (String, String) {
        ("gitlab-job".to_string(), self.id.clone())
    }

    /// Names of the job's objects on the instance.
    pub fn container(&self) -> String {
        format!("flotilla-job-{}", self.id)
    }

    /// The job's network.
    pub fn network(&self) -> String {
        format!("flotilla-job-{}", self.id)
    }

    /// The job's builds volume.
    pub fn volume(&self) -> String {
        format!("flotilla-job-{}-builds", self.id)
    }

    /// The `i`th service's container.
    pub fn service_container(&self, i: usize) -> String {
        format!("flotilla-job-{}-service-{i}", self.id)
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

    #[test]
    fn the_job_id_comes_from_the_runners_response_file_not_from_job_variables() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("response.json");
        std::fs::write(&file, r#"{"id": 4242, "token": "glcbt-secret"}"#).expect("write");
        let job = Job::from_env(&env(&[
            ("JOB_RESPONSE_FILE", file.to_str().expect("utf-8")),
            ("CUSTOM_ENV_CI_JOB_ID", "1"),
        ]))
        .expect("a job");
        assert_eq!(job.id, "4242");
        let bad = Job::from_env(&env(&[("CUSTOM_ENV_CI_JOB_ID", "1; rm -rf /")]));
        assert!(bad.is_err());
    }

    #[test]
    fn service_aliases_follow_gitlab() {
        let s = |name: &str, alias: Option<&str>| Service {
            name: name.into(),
            alias: alias.map(str::to_string),
            entrypoint: None,
            command: None,
        };
        assert_eq!(s("postgres:16", None).aliases(), ["postgres"]);
        assert_eq!(
            s("registry.example.com:5000/team/db:1", None).aliases(),
            [
                "registry.example.com:5000__team__db",
                "registry.example.com:5000-team-db"
            ]
        );
        assert_eq!(s("x", Some("db cache")).aliases(), ["db", "cache"]);
    }

    #[test]
    fn exit_codes_and_services_are_read_and_checked() {
        let job = Job::from_env(&env(&[
            ("CUSTOM_ENV_CI_JOB_ID", "7"),
            ("BUILD_FAILURE_EXIT_CODE", "11"),
            ("SYSTEM_FAILURE_EXIT_CODE", "12"),
            (
                "CUSTOM_ENV_CI_JOB_SERVICES",
                r#"[{"name":"redis:7","alias":"cache"}]"#,
            ),
        ]))
        .expect("a job");
        assert_eq!((job.build_failure, job.system_failure), (11, 12));
        assert_eq!(job.services[0].aliases(), ["cache"]);
        let bad = Job::from_env(&env(&[
            ("CUSTOM_ENV_CI_JOB_ID", "7"),
            ("BUILD_FAILURE_EXIT_CODE", "x"),
        ]));
        assert!(bad.is_err());
    }
}

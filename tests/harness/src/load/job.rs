//! One synthetic job, stage by stage, as GitLab Runner's Custom executor runs it: one
//! `flotilla-gitlab` (or `flotilla gitlab`) process per stage, with the runner's environment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::report::DriverFigures;
use super::{IMAGE, Options, reap};

/// What every job's stages share.
pub(super) struct Shared {
    pub(super) options: Options,
    pub(super) dir: PathBuf,
    /// Where the jobs' own directories go (the runner's response file and stage scripts).
    pub(super) jobs_dir: PathBuf,
    pub(super) api: String,
    pub(super) metrics: String,
    pub(super) token_file: PathBuf,
    pub(super) helper: String,
    /// Driver processes alive now, and their stage.
    pub(super) live: Mutex<HashMap<u32, String>>,
    pub(super) drivers: Mutex<DriverFigures>,
}

/// One stage process's outcome.
struct Stage {
    code: Option<i32>,
    first_byte: Option<Instant>,
    output: String,
}

/// One job's timings, or what failed.
pub(super) struct JobResult {
    pub(super) prepare: Duration,
    pub(super) to_first_byte: Option<Duration>,
    pub(super) end_to_end: Duration,
    pub(super) errors: Vec<String>,
}

/// The job's variables as the runner passes them (`CUSTOM_ENV_` + each), a typical set.
fn job_variables(id: u64) -> Vec<(String, String)> {
    let project = 1000 + id % 7;
    let plain = [
        ("CI", "true".to_string()),
        ("GITLAB_CI", "true".to_string()),
        ("CI_JOB_ID", id.to_string()),
        ("CI_JOB_NAME", "build".to_string()),
        ("CI_JOB_STAGE", "test".to_string()),
        ("CI_JOB_IMAGE", IMAGE.to_string()),
        (
            "CI_JOB_URL",
            format!("https://gitlab.example.com/g/p/-/jobs/{id}"),
        ),
        ("CI_PROJECT_ID", project.to_string()),
        ("CI_PROJECT_PATH", format!("group/project-{project}")),
        ("CI_PROJECT_NAME", format!("project-{project}")),
        ("CI_PROJECT_DIR", format!("/builds/group/project-{project}")),
        ("CI_BUILDS_DIR", "/builds".to_string()),
        ("CI_PIPELINE_ID", (id / 3).to_string()),
        ("CI_PIPELINE_SOURCE", "push".to_string()),
        ("CI_COMMIT_SHA", format!("{:040x}", id)),
        ("CI_COMMIT_REF_NAME", "main".to_string()),
        ("CI_COMMIT_BRANCH", "main".to_string()),
        ("CI_DEFAULT_BRANCH", "main".to_string()),
        ("CI_SERVER_URL", "https://gitlab.example.com".to_string()),
        ("CI_SERVER_HOST", "gitlab.example.com".to_string()),
        ("CI_RUNNER_ID", "42".to_string()),
        ("CI_RUNNER_SHORT_TOKEN", "abcdefgh".to_string()),
        ("CI_RUNNER_VERSION", "17.5.0".to_string()),
        ("CI_CONCURRENT_ID", (id % 100).to_string()),
        ("CI_CONCURRENT_PROJECT_ID", "0".to_string()),
        ("GIT_STRATEGY", "none".to_string()),
        ("FF_USE_FASTZIP", "true".to_string()),
    ];
    plain
        .into_iter()
        .map(|(k, v)| (format!("CUSTOM_ENV_{k}"), v))
        .collect()
}

/// The runner's stage scripts: each prints a line; `build_script` then runs for the script time.
fn script(stage: &str, script_time: Duration) -> String {
    match stage {
        "build_script" => format!(
            "#!/usr/bin/env sh\nset -e\necho 'first byte'\nsleep {}\n",
            script_time.as_secs_f64()
        ),
        _ => format!("#!/usr/bin/env sh\nset -e\necho '{stage} done'\n"),
    }
}

impl Shared {
    /// Runs one stage process of `job` to its end.
    /// The process of one stage of a job (in `job`, its directory, with `env`), not started.
    pub(super) fn command(&self, job: &Path, env: &[(String, String)], args: &[&str]) -> Command {
        let (program, first) = self.options.driver_command();
        let mut command = Command::new(program);
        command
            .args(first)
            .args([
                "--url",
                &format!("http://{}", self.api),
                "--pool",
                "ci",
                "--token-file",
            ])
            .arg(&self.token_file)
            .args(["--acquire-timeout", "600s", "--state-dir"])
            .arg(self.dir.join("driver-state"))
            .args([
                "--helper-image",
                &self.helper,
                "--pull-policy",
                "if-not-present",
            ])
            .args(args)
            .current_dir(job)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    async fn stage(&self, job: &Path, env: &[(String, String)], args: &[&str]) -> Stage {
        let mut command = self.command(job, env, args);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                return Stage {
                    code: None,
                    first_byte: None,
                    output: format!("spawning the driver: {e}"),
                };
            }
        };
        let pid = child.id();
        let stage = if args.first() == Some(&"run") {
            args.get(2)
        } else {
            args.first()
        };
        let stage = stage.unwrap_or(&"?").to_string();
        self.live.lock().expect("live").insert(pid, stage);
        let stdout = child
            .stdout
            .take()
            .and_then(|s| tokio::process::ChildStdout::from_std(s).ok());
        let stderr = child
            .stderr
            .take()
            .and_then(|s| tokio::process::ChildStderr::from_std(s).ok());
        let read_out = async {
            let mut first = None;
            let mut all = Vec::new();
            if let Some(mut out) = stdout {
                let mut buf = [0u8; 4096];
                while let Ok(n) = out.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    first.get_or_insert_with(Instant::now);
                    all.extend_from_slice(buf.get(..n).unwrap_or_default());
                }
            }
            (first, all)
        };
        let read_err = async {
            let mut all = Vec::new();
            if let Some(mut err) = stderr {
                let _ = err.read_to_end(&mut all).await;
            }
            all
        };
        let ((first_byte, out), err) = tokio::join!(read_out, read_err);
        let ended = reap::wait(pid).await;
        self.live.lock().expect("live").remove(&pid);
        // The std handle must not be dropped unreaped into a later wait of its own: it has no
        // such wait, and the pid was reaped above.
        drop(child);
        let ended = ended.unwrap_or_default();
        {
            let mut d = self.drivers.lock().expect("drivers");
            d.processes += 1;
            d.cpu += ended.cpu;
        }
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        );
        Stage {
            code: ended.code,
            first_byte,
            output,
        }
    }

    /// One job, as the runner runs it.
    /// Job `id`'s directory (the runner's temporary one, with its response file) and the
    /// environment the runner gives each of its stages.
    pub(super) fn setup(&self, id: u64) -> (PathBuf, Vec<(String, String)>) {
        let dir = self.jobs_dir.join(format!("job-{id}"));
        std::fs::create_dir_all(&dir).expect("job dir");
        let response = dir.join("response.json");
        std::fs::write(
            &response,
            format!(
                r#"{{"id": {id}, "token": "glcbt-load", "job_info": {{"project_id": {}, "name": "build"}}, "git_info": {{"ref": "main", "protected": false}}}}"#,
                1000 + id % 7
            ),
        )
        .expect("response file");
        let mut env = vec![
            ("BUILD_FAILURE_EXIT_CODE".to_string(), "1".to_string()),
            ("SYSTEM_FAILURE_EXIT_CODE".to_string(), "2".to_string()),
            (
                "BUILD_EXIT_CODE_FILE".to_string(),
                dir.join("build_exit_code").display().to_string(),
            ),
            (
                "JOB_RESPONSE_FILE".to_string(),
                response.display().to_string(),
            ),
            ("TMPDIR".to_string(), dir.display().to_string()),
        ];
        env.extend(job_variables(id));
        (dir, env)
    }

    pub(super) async fn job(&self, id: u64) -> JobResult {
        let (dir, env) = self.setup(id);
        let mut errors = Vec::new();
        let mut check = |name: &str, stage: &Stage| -> bool {
            if stage.code == Some(0) {
                return true;
            }
            let tail: String = stage
                .output
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            errors.push(format!("job {id} {name}: exit {:?}: {tail}", stage.code));
            false
        };
        let start = Instant::now();
        let mut prepare = Duration::ZERO;
        let mut to_first_byte = None;
        let config = self.stage(&dir, &env, &["config"]).await;
        if check("config", &config) {
            let began = Instant::now();
            let prepared = self.stage(&dir, &env, &["prepare"]).await;
            prepare = began.elapsed();
            if check("prepare", &prepared) {
                for name in [
                    "prepare_script",
                    "get_sources",
                    "build_script",
                    "cleanup_file_variables",
                ] {
                    let path = dir.join(format!("script-{name}"));
                    std::fs::write(&path, script(name, self.options.script_time)).expect("script");
                    let path = path.display().to_string();
                    let ran = self.stage(&dir, &env, &["run", &path, name]).await;
                    if name == "build_script" {
                        to_first_byte = ran.first_byte.map(|t| t.duration_since(began));
                    }
                    if !check(name, &ran) {
                        break;
                    }
                }
            }
        }
        let cleaned = self.stage(&dir, &env, &["cleanup"]).await;
        check("cleanup", &cleaned);
        let _ = std::fs::remove_dir_all(&dir);
        JobResult {
            prepare,
            to_first_byte,
            end_to_end: start.elapsed(),
            errors,
        }
    }
}

//! GitLab pipelines as GitLab Runner runs them through the Custom executor, for the driver's
//! helper-container tests: each stage's script as the runner writes it
//! (`flotilla_peers::runner_scripts`), the job response file and `CUSTOM_ENV_*` as the runner
//! passes them, the stages in the runner's order (the failure path after a failed build), and
//! the stand-in GitLab (git over HTTP, the jobs artifacts API) on the peers' address, which
//! job containers reach.
#![allow(dead_code)] // each test file uses a different part

use flotilla_peers::gitlab::{GitLab, Options, WorkTree};
use flotilla_peers::runner_scripts::{self, JobSpec};

use super::fleet::{Fleet, RunnerJob, StageResult};

/// The test project in the stand-in GitLab.
pub const PROJECT: &str = "group/app";
/// Its id.
pub const PROJECT_ID: u64 = 4242;

/// The stand-in GitLab with the test project: `first` (an older commit, `version.txt` says
/// `one`) and `tip` (the branch `main`, `two`).
pub struct Project {
    pub gitlab: GitLab,
    pub first: String,
    pub tip: String,
    pub pipeline: u64,
}

impl Project {
    /// Publishes the project on a stand-in GitLab at `ip`.
    pub async fn start(ip: std::net::IpAddr) -> Project {
        let gitlab = GitLab::start(
            ip,
            Options {
                object_storage: true,
                ..Options::default()
            },
        )
        .await;
        let work = WorkTree::new();
        work.write("version.txt", b"one\n");
        work.write(".gitignore", b"vendor/\n");
        let first = work.commit("first");
        work.write("version.txt", b"two\n");
        let tip = work.commit("second");
        gitlab.publish(PROJECT, &work);
        let pipeline = gitlab.pipeline(PROJECT, &first);
        Project {
            gitlab,
            first,
            tip,
            pipeline,
        }
    }

    /// A new job of the project at `sha`, with GitLab's and the runner's defaults.
    pub fn job(&self, sha: &str) -> JobSpec {
        let token = self.gitlab.job(PROJECT);
        let mut spec = JobSpec::new(
            &self.gitlab.url,
            PROJECT_ID,
            PROJECT,
            token.id,
            &token.token,
            sha,
            "main",
        );
        spec.pipeline_id = Some(self.pipeline);
        spec
    }
}

/// The runner's side of one job on `fleet`: its response file (id, token, project,
/// protection, timeout and variables, as GitLab sent them), its image and the runner's own
/// variables.
pub fn runner_job(fleet: &Fleet, spec: &JobSpec, image: &str) -> RunnerJob {
    let mut job = RunnerJob::of_project(fleet, spec.job_id, spec.project_id, spec.protected);
    let variables: Vec<serde_json::Value> = spec
        .variables
        .iter()
        .map(|v| {
            serde_json::json!({
                "key": v.key, "value": v.value, "public": v.public,
                "masked": v.masked, "file": v.file,
            })
        })
        .collect();
    let response = serde_json::json!({
        "id": spec.job_id,
        "token": spec.token,
        "job_info": {"project_id": spec.project_id, "name": spec.job_name},
        "git_info": {"ref": spec.ref_name, "sha": spec.sha, "protected": spec.protected},
        "runner_info": {"timeout": 3600},
        "variables": variables,
    });
    std::fs::write(job.dir.path().join("response.json"), response.to_string())
        .expect("response file");
    for (key, value) in [
        ("CUSTOM_ENV_CI_JOB_IMAGE", image.to_string()),
        (
            "CUSTOM_ENV_CI_RUNNER_SHORT_TOKEN",
            runner_scripts::short_token(&spec.runner_token),
        ),
        (
            "CUSTOM_ENV_CI_RUNNER_VERSION",
            runner_scripts::RUNNER_VERSION.to_string(),
        ),
    ] {
        job.env.insert(key.to_string(), value);
    }
    job
}

/// What a job's stages did, in order.
#[derive(Debug)]
pub struct Ran {
    pub stages: Vec<(String, StageResult)>,
}

impl Ran {
    /// The job log: every stage's output, as the runner shows it.
    pub fn log(&self) -> String {
        self.stages
            .iter()
            .map(|(stage, r)| format!("--- {stage} (exit {})\n{}{}", r.code, r.stdout, r.stderr))
            .collect()
    }

    /// Whether a stage printed `line` as a whole line. The runner's scripts echo each command
    /// before running it, so a word of the script is in the log whether or not it ran; only the
    /// command's own output stands on a line of its own.
    pub fn printed(&self, line: &str) -> bool {
        self.stages.iter().any(|(_, r)| {
            r.stdout
                .lines()
                .chain(r.stderr.lines())
                .any(|l| l.trim_end_matches('\r') == line)
        })
    }

    /// How `stage` ended.
    pub fn code(&self, stage: &str) -> Option<i32> {
        self.stages
            .iter()
            .find(|(s, _)| s == stage)
            .map(|(_, r)| r.code)
    }

    /// Whether every stage the runner ran passed.
    pub fn passed(&self) -> bool {
        self.stages.iter().all(|(_, r)| r.code == 0)
    }
}

/// Runs one stage's script as the runner does (its name as `run_exec` gets it: the runner's
/// `step_script` is `build_script` for the Custom executor).
pub fn stage(job: &RunnerJob, stage: &str, text: &str) -> StageResult {
    let name = if stage == "step_script" {
        "build_script"
    } else {
        stage
    };
    let path = job.script_file(name, text);
    job.stage(&["run", &path, name])
}

/// Runs the job as GitLab Runner's Custom executor does: `prepare`, the stages of a passing
/// job until the build fails, then those of a failing one, then `cleanup`.
pub fn run(job: &RunnerJob, spec: &JobSpec) -> Ran {
    let mut stages = vec![("prepare".to_string(), job.stage(&["prepare"]))];
    if stages.iter().all(|(_, r)| r.code == 0) {
        let mut failed = false;
        for name in runner_scripts::stages(spec, true) {
            let text = runner_scripts::script(spec, name);
            let result = stage(job, name, &text);
            let broke = result.code != 0;
            stages.push((name.to_string(), result));
            if broke && name == "build_script" {
                failed = true;
                break;
            }
            if broke && !matches!(name, "after_script" | "archive_cache") {
                break;
            }
        }
        if failed {
            let rest = runner_scripts::stages(spec, false);
            let after = rest.iter().skip_while(|s| **s != "build_script").skip(1);
            for name in after {
                let text = match *name {
                    "after_script" => runner_scripts::after_script(spec, false),
                    other => runner_scripts::script(spec, other),
                };
                stages.push((name.to_string(), stage(job, name, &text)));
            }
        }
    }
    stages.push(("cleanup".to_string(), job.stage(&["cleanup"])));
    Ran { stages }
}

/// The lines of a job log that say the runner's own work was skipped or could not run.
pub fn skipped(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("Missing ") || l.contains("not found"))
        .collect()
}

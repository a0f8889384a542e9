//! The seam between the stage skeleton (`stages`) and where a job runs: a container on the
//! leased instance (`docker`) or the machine itself (`instance`). A place sets the job up,
//! runs one stage's script detached and follows it, stops a cancelled stage's processes, and
//! sweeps the job away. The skeleton does the rest once for both: the lease, the report, the
//! routing of stages and riding through restarts of the host.
//!
//! Must not know: the lease API beyond the handle a place is opened with, exit codes, or
//! restart riding (a step reports [`StepError::HostDown`]; the skeleton waits and retries).

use std::cell::Cell;
use std::time::Duration;

use crate::api::{Acquired, ApiClient};
use crate::job::{DriverSettings, Job};

/// How long a cancelled stage's processes have after `TERM` before they are killed: a script
/// may trap `TERM` to clean up. Well within the runner's `graceful_kill_timeout` (30 s in the
/// snippet; the runner's default is 10 min).
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// Why a step on the instance failed: the host (or its handle) did not answer, which a
/// restart explains and a retry may cure; or the engine, the machine or the job's input
/// refused, which is the job's end.
#[derive(Debug)]
pub(crate) enum StepError {
    /// The host did not answer or said it is restarting.
    HostDown(String),
    /// The engine, the machine or the job's input refused.
    Failed(String),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::HostDown(why) | StepError::Failed(why) => f.write_str(why),
        }
    }
}

/// Where a stage runs among the job's places: the runner's own stages (checkout, cache,
/// artifacts) in the helper, the user's scripts in the job's image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// The job's own image (`build_script`, `step_*`, `after_script`).
    Job,
    /// The helper: git and the runner's helper binary (`get_sources`, `restore_cache`, ...).
    Helper,
}

impl Context {
    /// The runner's predefined stages, which run in the helper: `getPredefinedEnv` in GitLab
    /// Runner's `common/build.go` (and the docker executor's routing on that flag in
    /// `executors/docker/docker_command.go` `commandExecutor.Run`). The Custom executor passes
    /// only the stage's name to `run_exec`, not the flag, so the driver sorts by name; every
    /// other stage (`build_script`, the renamed `step_script`; `step_*`; `after_script`) is
    /// the user's and runs in the job's image.
    pub const PREDEFINED: [&'static str; 10] = [
        "prepare_script",
        "get_sources",
        "clear_worktree",
        "restore_cache",
        "download_artifacts",
        "archive_cache",
        "archive_cache_on_failure",
        "upload_artifacts_on_success",
        "upload_artifacts_on_failure",
        "cleanup_file_variables",
    ];

    /// The place of the stage named `stage`.
    pub fn of(stage: &str) -> Context {
        if Context::PREDEFINED.contains(&stage) {
            Context::Helper
        } else {
            Context::Job
        }
    }
}

/// One run of one stage: its name, its context and its script.
#[derive(Debug)]
pub(crate) struct StageRun<'a> {
    /// The runner's name of the stage.
    pub(crate) stage: &'a str,
    /// This run's name: the stage and a value unique to this invocation.
    pub(crate) name: String,
    /// Where it runs.
    pub(crate) context: Context,
    /// The script the runner wrote.
    pub(crate) script: &'a [u8],
}

impl<'a> StageRun<'a> {
    /// A new run of `stage` with `script`.
    pub(crate) fn new(stage: &'a str, script: &'a [u8]) -> StageRun<'a> {
        StageRun {
            stage,
            name: crate::detached::run_name(stage),
            context: Context::of(stage),
            script,
        }
    }
}

/// How one follow of a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The script exited with this code.
    Exited(i64),
    /// The script's processes are gone without a status: they were killed.
    Lost,
    /// The follower's stream broke before the script ended; why. Follow again.
    Cut(String),
    /// The script could not be put in place or started; the command's own words.
    NotStarted(String),
}

/// Where a job's stages run. Each step is idempotent, so the skeleton takes it again after
/// the host cut it.
pub(crate) trait Place: Sized {
    /// The mode's own settings.
    type Settings;

    /// What can be refused before any lease is taken (a job with no image).
    fn check(job: &Job, own: &Self::Settings) -> Result<(), String>;

    /// The place of `job` on the instance of `lease`.
    fn open(
        api: &ApiClient,
        job: &Job,
        settings: &DriverSettings,
        own: &Self::Settings,
        lease: u64,
    ) -> Result<Self, String>;

    /// Sets the job up on its instance from a clean slate; the time spent pulling.
    async fn prepare(&self, acquired: &Acquired) -> Result<Duration, StepError>;

    /// Starts `run` unless it has started, then prints its output from byte `printed` on
    /// (counting what it prints) until the script ends or the stream is cut.
    async fn follow(&self, run: &StageRun<'_>, printed: &Cell<u64>) -> Result<Ended, StepError>;

    /// Ends every process of `run`: `TERM`, up to [`GRACE`] for them to end, then `KILL`.
    async fn stop(&self, run: &StageRun<'_>);

    /// Removes everything of the job from its instance (what other jobs share stays).
    /// [`StepError::Failed`] means the instance is broken: it is released as such.
    async fn sweep(&self) -> Result<(), StepError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runners_own_stages_run_in_the_helper_and_the_users_in_the_job() {
        for stage in Context::PREDEFINED {
            assert_eq!(Context::of(stage), Context::Helper, "{stage}");
        }
        for stage in [
            "build_script",
            "step_script",
            "step_release",
            "after_script",
            "prepare_executor",
            "",
        ] {
            assert_eq!(Context::of(stage), Context::Job, "{stage}");
        }
    }
}

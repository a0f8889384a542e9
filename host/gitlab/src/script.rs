//! One stage's script in the job container, run so that it never depends on the host's
//! connection: the first follower exec starts the script in the background (its output to a
//! log file in the container, its exit status to a file when it ends), and follows the log from
//! the byte the driver has printed so far. A host restart only breaks the follower: the driver waits for the host and
//! follows again from the same byte, so output is neither lost nor repeated, and the exit
//! status is read from the file.
//!
//! Each run of a stage gets its own directory (`/tmp/flotilla-<stage>-<run>`), created with
//! `mkdir`, which only one start can win: a start retried after a lost answer never runs the
//! script twice. Standard output and standard error share the log, in the order written
//! (GitLab Runner merges them into the job log anyway).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::UploadToContainerOptions;
use futures_util::StreamExt;

use crate::containers::{StepError, step};

/// Where scripts and run directories live in the job container.
const SCRIPT_DIR: &str = "/tmp";

/// The line the follower ends with on its stderr: the script's exit status.
const STATUS_MARK: &str = "FLOTILLA_STATUS=";

/// The follower's own failure: the script never started (no log within its wait).
const NO_START_MARK: &str = "FLOTILLA_NO_START";

/// How a followed script ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this status.
    Exited(i64),
    /// The follower's stream was cut before the script ended (the host restarted, or the
    /// connection broke): follow again from the bytes printed.
    Cut,
}

/// One run of one stage's script in one job container.
pub(crate) struct StageRun {
    container: String,
    /// The run's directory.
    dir: String,
    /// The uploaded script.
    script: String,
    file: String,
}

impl StageRun {
    /// A run of `stage` in `container`; `run` tells this invocation's runs apart (a stage the
    /// runner retries, like `get_sources`, runs again under a new one).
    pub(crate) fn new(container: String, stage: &str, run: &str) -> StageRun {
        let safe: String = stage
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .take(64)
            .collect();
        let file = format!("flotilla-{safe}-{run}.sh");
        StageRun {
            container,
            dir: format!("{SCRIPT_DIR}/flotilla-{safe}-{run}"),
            script: format!("{SCRIPT_DIR}/{file}"),
            file,
        }
    }

    /// Uploads the script (the first [`StageRun::follow`] starts it).
    pub(crate) async fn upload(&self, docker: &Docker, text: &[u8]) -> Result<(), StepError> {
        docker
            .upload_to_container(
                &self.container,
                Some(UploadToContainerOptions {
                    path: SCRIPT_DIR.into(),
                    ..Default::default()
                }),
                bollard::body_full(crate::tar::one_file(&self.file, 0o700, text).into()),
            )
            .await
            .map_err(step("copying the script into the job container"))?;
        Ok(())
    }

    /// Starts the script in the background unless this run already did, then prints its log
    /// from byte `printed` on (counting what it prints) until the script's status appears or
    /// the stream is cut. The script is not tied to this exec: its output goes to the log and
    /// no signal reaches it when the exec's connection dies.
    pub(crate) async fn follow(
        &self,
        docker: &Docker,
        printed: &AtomicU64,
    ) -> Result<Ended, StepError> {
        let dir = &self.dir;
        let from = printed.load(Ordering::Relaxed);
        let script = &self.script;
        // `mkdir` is the start's lock: only the first start of this run gets past it. The
        // runner's scripts are written for bash when it is there; `sh` otherwise. The pid is
        // kept so a cancellation can stop the script's processes.
        // Then the log is polled: every 10 ms for the first 100 ms (short scripts end there),
        // every 50 ms while output flows and for the first 2 s, every 250 ms after a second
        // without any (one `wc` a poll). A `sleep` without fractions (a busybox built without
        // them) falls back to whole seconds rather than spinning.
        let command = format!(
            "if mkdir {dir} 2>/dev/null; then \
               ( sh -c 'echo $$ > {dir}/pid; if command -v bash >/dev/null 2>&1; then exec bash {script}; else exec sh {script}; fi' \
                   > {dir}/log 2>&1 < /dev/null; \
                 echo $? > {dir}/status.tmp; mv {dir}/status.tmp {dir}/status ) > /dev/null 2>&1 < /dev/null & \
             fi; \
             N={from}; i=0; q=0; \
             nap() {{ sleep $1 2>/dev/null || sleep 1; }}; \
             while [ ! -e {dir}/log ]; do i=$((i+1)); if [ $i -gt 3000 ]; then echo {NO_START_MARK} >&2; exit 3; fi; nap 0.01; done; i=0; \
             while :; do \
               if [ -e {dir}/status ]; then d=1; else d=0; fi; \
               s=$(($(wc -c < {dir}/log))); \
               if [ $s -gt $N ]; then tail -c +$((N+1)) {dir}/log | head -c $((s-N)); N=$s; q=0; else q=$((q+1)); fi; \
               if [ $d = 1 ]; then echo >&2; echo {STATUS_MARK}$(cat {dir}/status) >&2; exit 0; fi; \
               i=$((i+1)); if [ $i -lt 10 ]; then nap 0.01; elif [ $q -lt 20 ] || [ $i -lt 50 ]; then nap 0.05; else nap 0.25; fi; \
             done"
        );
        let exec = docker
            .create_exec(
                &self.container,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(vec!["sh".to_string(), "-c".to_string(), command]),
                    ..Default::default()
                },
            )
            .await
            .map_err(step("following the script's output"))?;
        let started = docker
            .start_exec(&exec.id, Some(StartExecOptions::default()))
            .await
            .map_err(step("following the script's output"))?;
        let StartExecResults::Attached { mut output, .. } = started else {
            return Err(StepError::Failed("the follower's exec was detached".into()));
        };
        let mut diagnostics = Vec::new();
        while let Some(item) = output.next().await {
            let Ok(chunk) = item else {
                return Ok(Ended::Cut);
            };
            match chunk {
                bollard::container::LogOutput::StdErr { message } => {
                    diagnostics.extend_from_slice(&message);
                }
                bollard::container::LogOutput::StdOut { message }
                | bollard::container::LogOutput::Console { message }
                | bollard::container::LogOutput::StdIn { message } => {
                    let mut out = std::io::stdout().lock();
                    // The runner reads stdout into the job log; a closed pipe ends it.
                    let _ = out.write_all(&message).and_then(|()| out.flush());
                    printed.fetch_add(message.len() as u64, Ordering::Relaxed);
                }
            }
        }
        let diagnostics = String::from_utf8_lossy(&diagnostics);
        if let Some(status) = diagnostics
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix(STATUS_MARK))
        {
            return status.trim().parse().map(Ended::Exited).map_err(|_| {
                StepError::Failed(format!("the script's status {status:?} is not a number"))
            });
        }
        if diagnostics.contains(NO_START_MARK) {
            return Err(StepError::Failed(
                "the script did not start in the job container (does the image have sh?)".into(),
            ));
        }
        Ok(Ended::Cut)
    }

    /// Sends TERM to the script's processes, then KILL after a grace of a few seconds.
    pub(crate) async fn stop(&self, docker: &Docker) {
        let pid_file = format!("{}/pid", self.dir);
        let kill = |signal: &str| {
            format!(
                "pid=$(cat {pid_file} 2>/dev/null) && kill -{signal} -- -$pid $pid 2>/dev/null; pkill -{signal} -P $pid 2>/dev/null; true"
            )
        };
        for (signal, wait) in [("TERM", Duration::from_secs(5)), ("KILL", Duration::ZERO)] {
            // Best effort: the script may be gone already.
            let _ = self.exec_detached(docker, kill(signal)).await;
            tokio::time::sleep(wait).await;
        }
    }

    async fn exec_detached(&self, docker: &Docker, command: String) -> Result<(), StepError> {
        let exec = docker
            .create_exec(
                &self.container,
                CreateExecOptions {
                    cmd: Some(vec!["sh".to_string(), "-c".to_string(), command]),
                    ..Default::default()
                },
            )
            .await
            .map_err(step("starting the script"))?;
        docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(step("starting the script"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_of_a_stage_has_its_own_directory_and_odd_names_stay_inert() {
        let a = StageRun::new("c".into(), "step_script", "1a");
        let b = StageRun::new("c".into(), "step_script", "2b");
        assert_ne!(a.dir, b.dir);
        let odd = StageRun::new("c".into(), "x; rm -rf / $(id)", "1");
        assert!(
            odd.dir
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"/_-".contains(&c)),
            "{}",
            odd.dir
        );
    }
}

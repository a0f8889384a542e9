//! Instance mode: each job runs directly on its leased machine, over the host's SSH session
//! to it (the lease's exec endpoint), as GitLab's `instance` executor runs jobs on macOS,
//! Windows and one-VM-per-job Linux. The job gets a directory of its own on the machine
//! (`<machine dir>/<job id>`); its scripts run there with the shell the runner wrote them
//! for; cancellation and cleanup stop every process of the job and remove the directory. On
//! Unix a stage's script runs detached and its log is followed ([`crate::detached`]), so it
//! rides through a restart of the host; on Windows its output comes straight over the channel.

pub mod commands;
pub mod settings;

use std::cell::Cell;
use std::time::Duration;

use crate::api::{Acquired, ApiClient, ApiError, ErrorCode, ExecEnd};
use crate::detached::{Output, QUOTED, Status};
use crate::job::{DriverSettings, Job};
use crate::place::{Ended, GRACE, Place, StageRun, StepError};
use settings::{InstanceSettings, Signal};

/// What one of the driver's own commands left.
struct Ran {
    end: ExecEnd,
    output: Vec<u8>,
}

impl Ran {
    fn ok(&self) -> bool {
        self.end
            == ExecEnd::Exited {
                status: Some(0),
                signal: None,
            }
    }

    fn why(&self, what: &str) -> String {
        let out = String::from_utf8_lossy(&self.output);
        let tail: String = out.trim().chars().take(QUOTED).collect();
        match &self.end {
            ExecEnd::Exited {
                status: Some(code), ..
            } => format!("{what} on the machine exited {code}: {tail}"),
            ExecEnd::Exited {
                signal: Some(sig), ..
            } => format!("{what} on the machine was killed by SIG{sig}: {tail}"),
            ExecEnd::Exited { .. } => format!("{what} on the machine ended without a status"),
            ExecEnd::Broken(why) => format!("{what}: {why}"),
        }
    }
}

/// A refusal of the exec endpoint as a step's error: the host down or restarting (ride it
/// out), or a refusal that ends the job (the machine is gone).
fn step_error(e: ApiError, during: &str) -> StepError {
    match &e {
        ApiError::Unreachable { .. } => StepError::HostDown(e.to_string()),
        ApiError::Refused { code, .. } if code.restarting() => StepError::HostDown(e.to_string()),
        ApiError::Refused {
            code: ErrorCode::InstanceUnreachable,
            message,
            ..
        } => StepError::Failed(format!(
            "the machine went away during {during}: {message}; the instance is replaced at cleanup"
        )),
        ApiError::Refused { .. } => StepError::Failed(e.to_string()),
    }
}

/// The job on its machine.
pub(crate) struct InstancePlace {
    api: ApiClient,
    job: Job,
    own: InstanceSettings,
    lease: u64,
}

impl Place for InstancePlace {
    type Settings = InstanceSettings;

    fn check(_job: &Job, _own: &InstanceSettings) -> Result<(), String> {
        Ok(())
    }

    fn open(
        api: &ApiClient,
        job: &Job,
        _settings: &DriverSettings,
        own: &InstanceSettings,
        lease: u64,
    ) -> Result<InstancePlace, String> {
        Ok(InstancePlace {
            api: api.clone(),
            job: job.clone(),
            own: own.clone(),
            lease,
        })
    }

    /// A check that the machine runs the system the runner writes scripts for, and the
    /// job's directory from a clean slate (the pool's ready command has run; Docker plays no
    /// part).
    async fn prepare(&self, acquired: &Acquired) -> Result<Duration, StepError> {
        if let Some(os) = acquired.os.as_deref()
            && !self.own.os.matches(os)
        {
            return Err(StepError::Failed(format!(
                "instance {} runs {os}, but the driver writes jobs for {} (--os {}); give this pool its own runner",
                acquired.instance,
                self.own.os.name(),
                self.own.os.name()
            )));
        }
        let made = self
            .ran(&self.own.prepare_command(
                &self.job.id,
                &self.own.cache_dir(&self.job.project, self.job.protected),
            ))
            .await?;
        if !made.ok() {
            return Err(StepError::Failed(made.why("making the job's directory")));
        }
        crate::outcome::say(&format!(
            "Job directory {} on instance {}",
            self.own.job_dir(&self.job.id),
            acquired.instance
        ));
        crate::outcome::say(
            &match self.own.tenant(&self.job.project, self.job.protected) {
                Some(tenant) => format!(
                    "flotilla: instance {} serves {tenant} only. Unless its pool sets max_use_count = 1, later jobs of {tenant} run there as the same user: what this job leaves on the machine (files, processes) can read their scripts and secrets",
                    acquired.instance
                ),
                None => format!(
                    "flotilla: UNSAFE (--unsafe-share-machines-across-projects): instance {} runs jobs of any project as the same user; unless its pool sets max_use_count = 1, what this job leaves there can read later jobs' scripts and secrets, and what earlier jobs left can read this one's",
                    acquired.instance
                ),
            },
        );
        Ok(Duration::ZERO)
    }

    async fn follow(&self, run: &StageRun<'_>, printed: &Cell<u64>) -> Result<Ended, StepError> {
        if !self.own.detached() {
            return self.attached(run).await;
        }
        let command = self.own.start_command(
            &self.job.id,
            &run.name,
            run.context,
            printed.get(),
            run.script.len(),
        );
        let mut out = Output::new(&run.name);
        let base = printed.get();
        let ended = self
            .api
            .exec(self.lease, &command, run.script, |kind, data| {
                out.take(kind, data);
                printed.set(base + out.shown);
            })
            .await;
        let ended = match ended {
            Ok(ended) => ended,
            // The host went away mid-follow (a restart): follow again once it is back.
            Err(e) => match step_error(e, run.stage) {
                StepError::HostDown(why) => return Ok(Ended::Cut(why)),
                failed => return Err(failed),
            },
        };
        Ok(match (ended, out.status()) {
            (ExecEnd::Exited { .. }, _) if !out.started => Ended::NotStarted(out.setup_output()),
            (ExecEnd::Exited { .. }, Some(Status::Exited(code))) => Ended::Exited(code),
            (ExecEnd::Exited { .. }, Some(Status::Lost)) => Ended::Lost,
            (ExecEnd::Exited { .. }, None) => {
                Ended::Cut("the follower ended without the script's status".into())
            }
            // The machine's side broke (its session or the machine): follow again, which
            // fails at once if the machine is gone.
            (ExecEnd::Broken(why), _) => Ended::Cut(why),
        })
    }

    /// `TERM` to every process of the job, up to the grace period for them to end, then
    /// `KILL` to what is left.
    /// `TERM` to every process of the job, up to [`GRACE`] for them to end, then `KILL` until
    /// none is left (a killed process takes a moment to go, and one may have forked meanwhile),
    /// so nothing of the stage runs when the driver exits.
    async fn stop(&self, _run: &StageRun<'_>) {
        let tenths = u32::try_from(GRACE.as_millis() / 100).unwrap_or(100);
        for (what, command) in [
            (
                "stopping the script",
                self.own.stop_command(&self.job.id, Signal::Term),
            ),
            (
                "waiting for the script to stop",
                self.own.wait_command(&self.job.id, tenths),
            ),
        ] {
            if let Err(e) = self.ran(&command).await {
                eprintln!("flotilla: {what}: {e}");
            }
        }
        for _ in 0..KILL_ROUNDS {
            if let Err(e) = self
                .ran(&self.own.stop_command(&self.job.id, Signal::Kill))
                .await
            {
                eprintln!("flotilla: killing the script: {e}");
                return;
            }
            match self.ran(&self.own.wait_command(&self.job.id, 10)).await {
                Ok(gone) if gone.ok() => return,
                Ok(_) => {}
                Err(e) => {
                    eprintln!("flotilla: waiting for the script to end: {e}");
                    return;
                }
            }
        }
        eprintln!(
            "flotilla: some processes of the job still ran after {KILL_ROUNDS} rounds of KILL; cleanup will try again"
        );
    }

    /// Stops every process of the job and removes its directory; what cannot be removed is
    /// said, not failed on.
    async fn sweep(&self) -> Result<(), StepError> {
        let done = self.ran(&self.own.cleanup_command(&self.job.id)).await?;
        if !done.ok() {
            return Err(StepError::Failed(done.why("cleaning up the job")));
        }
        let said = String::from_utf8_lossy(&done.output);
        if !said.trim().is_empty() {
            eprintln!("{}", said.trim());
        }
        Ok(())
    }
}

/// How many times a cancel sends `KILL` and waits a second for the job's processes to go.
const KILL_ROUNDS: u32 = 5;

impl InstancePlace {
    /// Runs one of the driver's own commands, its output collected (capped).
    async fn ran(&self, command: &str) -> Result<Ran, StepError> {
        let mut output = Vec::new();
        let end = self
            .api
            .exec(self.lease, command, &[], |_, data| {
                let room = (4 * QUOTED).saturating_sub(output.len());
                output.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
            })
            .await
            .map_err(|e| step_error(e, "the driver's own command"))?;
        Ok(Ran { end, output })
    }

    /// A stage whose output comes straight over its channel (Windows): one command, no
    /// riding through a restart of the host.
    async fn attached(&self, run: &StageRun<'_>) -> Result<Ended, StepError> {
        let command = self
            .own
            .run_command(&self.job.id, &run.name, run.script.len());
        let mut out = Output::new(&run.name).attached();
        let ended = self
            .api
            .exec(self.lease, &command, run.script, |kind, data| {
                out.take(kind, data)
            })
            .await;
        let stage = run.stage;
        match ended {
            Ok(ExecEnd::Exited { .. }) if !out.started => Ok(Ended::NotStarted(out.setup_output())),
            Ok(ExecEnd::Exited {
                status: Some(code), ..
            }) => Ok(Ended::Exited(self.own.exit_code(code))),
            // As a shell reports a child a signal ended: 128 + its number.
            Ok(ExecEnd::Exited {
                signal: Some(sig), ..
            }) => Ok(Ended::Exited(128 + signal_number(&sig))),
            Ok(ExecEnd::Exited { .. }) => Err(StepError::Failed(format!(
                "the {stage} script ended without an exit status"
            ))),
            Ok(ExecEnd::Broken(why)) => Err(StepError::Failed(format!(
                "the machine went away during {stage}: {why}; the instance is replaced at cleanup"
            ))),
            Err(e) => Err(StepError::Failed(format!(
                "the connection to flotilla broke during {stage}: {e}"
            ))),
        }
    }
}

/// The number of a signal by its SSH name (RFC 4254 §6.10), as Linux numbers them.
pub(crate) fn signal_number(name: &str) -> i64 {
    match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ILL" => 4,
        "ABRT" => 6,
        "FPE" => 8,
        "KILL" => 9,
        "USR1" => 10,
        "SEGV" => 11,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_numbered_as_linux_numbers_them_and_unknown_ones_are_zero() {
        assert_eq!(signal_number("TERM"), 15);
        assert_eq!(signal_number("KILL"), 9);
        assert_eq!(signal_number("FOO@example.com"), 0);
    }

    #[test]
    fn a_machine_that_went_away_ends_the_job_and_a_restarting_host_is_ridden_out() {
        let refused = |code| ApiError::Refused {
            what: "POST exec".into(),
            code,
            message: "m".into(),
        };
        assert!(matches!(
            step_error(refused(ErrorCode::InstanceUnreachable), "x"),
            StepError::Failed(_)
        ));
        assert!(matches!(
            step_error(refused(ErrorCode::PoolStarting), "x"),
            StepError::HostDown(_)
        ));
        let down = ApiError::Unreachable {
            url: "http://x".into(),
            why: "refused".into(),
        };
        assert!(matches!(step_error(down, "x"), StepError::HostDown(_)));
    }
}

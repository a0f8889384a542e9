//! Instance mode: each job runs directly on its leased machine, over the host's SSH session
//! to it (the lease's exec endpoint), as GitLab's `instance` executor runs jobs on macOS,
//! Windows and one-VM-per-job Linux. The job gets a directory of its own on the machine
//! (`<machine dir>/<job id>`); its scripts run there with the shell the runner wrote them
//! for; cancellation and cleanup stop every process of the job and remove the directory.
//! Like Docker mode, nothing is kept between stages: the lease is found by the job's label,
//! the directory by the job's id; and on Unix a stage's script runs detached, its log
//! followed from the byte printed, so it rides through a restart of the host.

use std::io::Write;
use std::time::Duration;

use crate::api::{ApiClient, ApiError, ExecEnd, FrameKind, LeaseState};
use crate::job::{DriverSettings, Job};
use crate::lease::{self, Patience};
use crate::machine::{InstanceSettings, Signal};
use crate::outcome::{Outcome, say, system};

/// How long a cancelled script has after `TERM` before its processes are killed.
const GRACE: Duration = Duration::from_secs(10);

/// Output of the driver's own commands quoted in a failure.
const QUOTED: usize = 2000;

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

/// Runs one of the driver's own commands, its output collected (capped).
async fn ran(api: &ApiClient, lease: u64, command: &str, stdin: &[u8]) -> Result<Ran, ApiError> {
    let mut output = Vec::new();
    let end = api
        .exec(lease, command, stdin, |_, data| {
            let room = (4 * QUOTED).saturating_sub(output.len());
            output.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
        })
        .await?;
    Ok(Ran { end, output })
}

/// `config` in instance mode: the job's own builds directory on the machine, the machine's
/// cache, and the shell the runner must write scripts for.
pub fn config(instance: &InstanceSettings, job: &Job, pool: &str) -> serde_json::Value {
    serde_json::json!({
        "builds_dir": instance.builds_dir(&job.id),
        "cache_dir": instance.cache_dir(),
        "builds_dir_is_shared": false,
        "hostname": format!("flotilla-{pool}"),
        "shell": instance.shell.name(),
        "driver": { "name": "flotilla", "version": env!("CARGO_PKG_VERSION") },
    })
}

/// `prepare`: the lease (the pool's ready command has run; Docker plays no part), a check
/// that the machine runs the system the runner writes scripts for, and the job's directory.
pub async fn prepare(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    instance: &InstanceSettings,
) -> Outcome {
    match prepare_inner(api, job, settings, instance).await {
        Ok(()) => Outcome::Success,
        Err(outcome) => outcome,
    }
}

async fn prepare_inner(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    instance: &InstanceSettings,
) -> Result<(), Outcome> {
    let began = std::time::Instant::now();
    let (lease, acquired) = lease::acquire(api, job, settings).await?;
    if let Some(os) = acquired.os.as_deref()
        && !instance.os.matches(os)
    {
        return Err(system(format!(
            "instance {} runs {os}, but the driver writes jobs for {} (--os {}); give this pool its own runner",
            acquired.instance,
            instance.os.name(),
            instance.os.name()
        )));
    }
    // Idempotent (a clean slate each time), so it is simply taken again after a restart.
    let command = instance.prepare_command(&job.id);
    let patience = Patience::new(settings);
    let made = lease::through_restarts(api, patience, || ran(api, lease, &command, &[]))
        .await
        .map_err(system)?;
    if !made.ok() {
        return Err(system(made.why("making the job's directory")));
    }
    say(&format!(
        "Job directory {} on instance {}",
        instance.job_dir(&job.id),
        acquired.instance
    ));
    let started = flotilla_api::JobStarted {
        prepare_seconds: began.elapsed().as_secs_f64(),
        pull_seconds: 0.0,
    };
    api.report(
        lease,
        flotilla_api::ReportRequest {
            job_started: Some(started),
            job_finished: None,
        },
    )
    .await;
    Ok(())
}

/// A name for this run of a stage: the stage (in safe characters) and a value unique to this
/// invocation, so a stage the runner retries runs anew.
fn run_name(stage: &str) -> String {
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
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{safe}-{:x}{nanos:x}", std::process::id())
}

/// `run`: uploads the stage's script into the job's directory and runs it with the runner's
/// shell, output streamed as it comes. `cancel` resolving stops the script's processes:
/// `TERM`, then `KILL` after the grace period.
pub async fn run(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    instance: &InstanceSettings,
    text: &[u8],
    stage: &str,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<(Outcome, Option<u64>), Outcome> {
    let patience = Patience::new(settings);
    let lease = lease::acquired(api, job, patience).await?;
    let name = run_name(stage);
    if !instance.detached() {
        return attached(api, lease, job, instance, text, stage, &name, cancel).await;
    }
    tokio::pin!(cancel);
    // Bytes of the log printed so far: a follow after a cut starts there.
    let mut printed = 0u64;
    let mut cuts = 0u32;
    loop {
        let command = instance.start_command(&job.id, &name, printed, text.len());
        let mut output = Started::new(InstanceSettings::start_marker(&name));
        let ended = {
            let running = api.exec(lease, &command, text, |kind, data| output.take(kind, data));
            tokio::pin!(running);
            tokio::select! {
                ended = &mut running => ended,
                () = &mut cancel => {
                    say(&format!("flotilla: {stage} cancelled; stopping the script"));
                    stop(api, lease, job, instance, running).await;
                    return Ok((Outcome::SystemFailure(format!("{stage} was cancelled")), Some(lease)));
                }
            }
        };
        printed += output.shown;
        if output.shown > 0 {
            // Progress: only cuts in a row count.
            cuts = 0;
        }
        let status = output.status();
        let why = match ended {
            Ok(ExecEnd::Exited { .. }) if !output.started => {
                return Err(system(format!(
                    "placing the {stage} script on the machine failed (did prepare run there?): {}",
                    output.setup_output()
                )));
            }
            Ok(ExecEnd::Exited { .. }) => match status {
                Some(Status::Exited(0)) => return Ok((Outcome::Success, Some(lease))),
                Some(Status::Exited(code)) => {
                    return Ok((Outcome::BuildFailure(code), Some(lease)));
                }
                Some(Status::Lost) => {
                    return Err(system(format!(
                        "the {stage} script's processes were killed before it could report its exit status"
                    )));
                }
                None => {
                    return Err(system(format!(
                        "following the {stage} script ended without its exit status"
                    )));
                }
            },
            // The machine's side broke (its session or the machine): follow again, which
            // fails at once if the machine is gone.
            Ok(ExecEnd::Broken(why)) => why,
            Err(ApiError::Refused {
                code: crate::api::ErrorCode::InstanceUnreachable,
                message,
                ..
            }) => {
                return Err(system(format!(
                    "the machine went away during {stage}: {message}; the instance is replaced at cleanup"
                )));
            }
            Err(e @ ApiError::Refused { .. }) if !restarting(&e) => return Err(system(e)),
            // The host went away (a restart) or is coming back: wait for it, follow again.
            Err(e) => e.to_string(),
        };
        cuts += 1;
        if cuts > MAX_CUTS {
            return Err(system(format!(
                "the connection to the machine broke during {stage} {cuts} times in a row: {why}"
            )));
        }
        say(&format!(
            "flotilla: the connection to the machine broke during {stage} ({why}); following again..."
        ));
        tokio::select! {
            found = lease::acquired(api, job, patience) => { found?; }
            () = &mut cancel => {
                say(&format!("flotilla: {stage} cancelled; stopping the script"));
                // No stream to drain: the connection is down.
                let none = std::future::ready(Ok(ExecEnd::Broken(String::new())));
                stop(api, lease, job, instance, none).await;
                return Ok((Outcome::SystemFailure(format!("{stage} was cancelled")), Some(lease)));
            }
        }
    }
}

/// How many times in a row a followed stage may be cut before it fails.
const MAX_CUTS: u32 = 50;

fn restarting(e: &ApiError) -> bool {
    matches!(e, ApiError::Refused { code, .. } if code.restarting())
}

/// A stage whose output comes straight over its channel (Windows): one command, no riding
/// through a restart of the host.
#[allow(clippy::too_many_arguments)]
async fn attached(
    api: &ApiClient,
    lease: u64,
    job: &Job,
    instance: &InstanceSettings,
    text: &[u8],
    stage: &str,
    name: &str,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<(Outcome, Option<u64>), Outcome> {
    let command = instance.run_command(&job.id, name, text.len());
    let mut output = Started::new(InstanceSettings::start_marker(name)).attached();
    let ended = {
        let running = api.exec(lease, &command, text, |kind, data| output.take(kind, data));
        tokio::pin!(running);
        tokio::pin!(cancel);
        tokio::select! {
            ended = &mut running => ended,
            () = &mut cancel => {
                say(&format!("flotilla: {stage} cancelled; stopping the script"));
                stop(api, lease, job, instance, running).await;
                return Ok((Outcome::SystemFailure(format!("{stage} was cancelled")), Some(lease)));
            }
        }
    };
    let started = output.started;
    let setup = output.setup_output();
    let outcome = match ended {
        Ok(ExecEnd::Exited { .. }) if !started => system(format!(
            "placing the {stage} script on the machine failed (did prepare run there?): {setup}"
        )),
        Ok(ExecEnd::Exited {
            status: Some(0), ..
        }) => Outcome::Success,
        Ok(ExecEnd::Exited {
            status: Some(code), ..
        }) => Outcome::BuildFailure(instance.exit_code(code)),
        // As a shell reports a child a signal ended: 128 + its number.
        Ok(ExecEnd::Exited {
            signal: Some(sig), ..
        }) => Outcome::BuildFailure(128 + signal_number(&sig)),
        Ok(ExecEnd::Exited { .. }) => {
            system(format!("the {stage} script ended without an exit status"))
        }
        Ok(ExecEnd::Broken(why)) => system(format!(
            "the machine went away during {stage}: {why}; the instance is replaced at cleanup"
        )),
        Err(e) => system(format!(
            "the connection to flotilla broke during {stage}: {e}"
        )),
    };
    Ok((outcome, Some(lease)))
}

/// The output of a stage's command: nothing is shown before the start marker (that is the
/// command's own setup, kept for a failure message); after it, standard output and error go
/// to the job log as they come.
struct Started {
    marker: Vec<u8>,
    /// Bytes of standard output matched against the marker so far.
    seen: Vec<u8>,
    started: bool,
    /// The setup's output (capped).
    before: Vec<u8>,
    /// Bytes of standard output shown after the marker.
    shown: u64,
    /// A followed stage's standard error after the marker: only the status line (capped).
    after: Vec<u8>,
    /// Whether standard error after the marker is the follower's (the status line) rather
    /// than the script's.
    follower: bool,
}

impl Started {
    fn new(marker: String) -> Started {
        Started {
            marker: marker.into_bytes(),
            seen: Vec::new(),
            started: false,
            before: Vec::new(),
            shown: 0,
            after: Vec::new(),
            follower: true,
        }
    }

    /// A stage whose standard error after the marker is the script's own (Windows).
    fn attached(mut self) -> Started {
        self.follower = false;
        self
    }

    fn take(&mut self, kind: FrameKind, data: &[u8]) {
        if self.started {
            if kind == FrameKind::Stderr && self.follower {
                // Only the last bytes matter: the status line ends the follower's stderr.
                self.after.extend_from_slice(data);
                let excess = self.after.len().saturating_sub(STATUS_TAIL);
                self.after.drain(..excess);
                return;
            }
            if kind == FrameKind::Stdout {
                self.shown += data.len() as u64;
            }
            show(kind, data);
            return;
        }
        if kind == FrameKind::Stderr {
            keep_capped(&mut self.before, data);
            return;
        }
        // The marker may follow whatever the login user's shell printed first (a chatty
        // .bashrc): it is looked for anywhere.
        self.seen.extend_from_slice(data);
        if let Some(at) = find(&self.seen, &self.marker) {
            self.started = true;
            let rest = self.seen.split_off(at + self.marker.len());
            self.seen.truncate(at);
            let noise = std::mem::take(&mut self.seen);
            keep_capped(&mut self.before, &noise);
            self.shown += rest.len() as u64;
            show(kind, &rest);
            return;
        }
        // Keep only what could still be the marker's start; the rest is noise.
        let keep = self.marker.len().saturating_sub(1);
        if self.seen.len() > keep {
            let noise: Vec<u8> = self.seen.drain(..self.seen.len() - keep).collect();
            keep_capped(&mut self.before, &noise);
        }
    }

    /// What the command printed before its marker (a setup failure's words).
    fn setup_output(&self) -> String {
        let mut all = self.before.clone();
        all.extend_from_slice(&self.seen);
        String::from_utf8_lossy(&all).trim().to_string()
    }

    /// How the script ended, from a follower's last status line.
    fn status(&self) -> Option<Status> {
        let text = String::from_utf8_lossy(&self.after);
        let line = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("flotilla-status "))?;
        match line.trim() {
            "lost" => Some(Status::Lost),
            code => code.parse().ok().map(Status::Exited),
        }
    }
}

/// What a follower's status line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// The script exited with this code.
    Exited(i64),
    /// The script's processes are gone and it left no status (they were killed).
    Lost,
}

/// The bytes of a follower's standard error kept for its status line.
const STATUS_TAIL: usize = 256;

fn keep_capped(buf: &mut Vec<u8>, data: &[u8]) {
    let room = QUOTED.saturating_sub(buf.len());
    buf.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Shows a stage's output in the job log (a closed stdout or stderr, the runner gone,
/// leaves nothing useful to do).
fn show(kind: FrameKind, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    if kind == FrameKind::Stderr {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(data);
        let _ = err.flush();
    } else {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data);
        let _ = out.flush();
    }
}

/// Stops a cancelled script: `TERM` to every process of the job, up to the grace period for
/// them to end (a script may trap `TERM` to clean up), then `KILL` to what is left. The
/// stage's stream is drained meanwhile, so its output still reaches the job log and the host
/// is never held up by an unread channel.
async fn stop(
    api: &ApiClient,
    lease: u64,
    job: &Job,
    instance: &InstanceSettings,
    running: impl std::future::Future<Output = Result<ExecEnd, ApiError>>,
) {
    let stopping = async {
        if let Err(e) = ran(
            api,
            lease,
            &instance.stop_command(&job.id, Signal::Term),
            &[],
        )
        .await
        {
            eprintln!("flotilla: stopping the script: {e}");
        }
        let tenths = u32::try_from(GRACE.as_millis() / 100).unwrap_or(100);
        if let Err(e) = ran(api, lease, &instance.wait_command(&job.id, tenths), &[]).await {
            eprintln!("flotilla: waiting for the script to stop: {e}");
        }
        if let Err(e) = ran(
            api,
            lease,
            &instance.stop_command(&job.id, Signal::Kill),
            &[],
        )
        .await
        {
            eprintln!("flotilla: killing the script: {e}");
        }
    };
    let draining = async {
        let _ = tokio::time::timeout(GRACE + Duration::from_secs(5), running).await;
    };
    tokio::join!(stopping, draining);
}

/// The number of a signal by its SSH name (RFC 4254 §6.10), as Linux numbers them.
fn signal_number(name: &str) -> i64 {
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

/// `cleanup`: stops every process of the job, removes its directory and gives the lease
/// back; a machine that no longer answers is released as broken, so it is replaced.
pub async fn cleanup(
    api: &ApiClient,
    job: &Job,
    settings: &DriverSettings,
    instance: &InstanceSettings,
) -> Outcome {
    let patience = Patience::new(settings);
    let found = match lease::find(api, job, patience).await {
        Ok(found) => found,
        Err(e) => return system(e),
    };
    let Some(lease) = found else {
        return Outcome::Success;
    };
    let id = lease.id;
    let result = match lease.state {
        LeaseState::Reserved => lease::through_restarts(api, patience, || api.unreserve(id)).await,
        LeaseState::Acquired { .. } => {
            let command = instance.cleanup_command(&job.id);
            let swept =
                lease::through_restarts(api, patience, || ran(api, id, &command, &[])).await;
            let broken = match swept {
                Ok(done) if done.ok() => {
                    // What could not be removed is said, not failed on.
                    let said = String::from_utf8_lossy(&done.output);
                    if !said.trim().is_empty() {
                        eprintln!("{}", said.trim());
                    }
                    None
                }
                Ok(done) => Some(done.why("cleaning up the job")),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = &broken {
                eprintln!("flotilla: {why}; the instance is reported broken and will be replaced");
            }
            lease::through_restarts(api, patience, || api.release(id, broken.as_deref())).await
        }
        LeaseState::Failed { .. } => {
            lease::through_restarts(api, patience, || api.release(id, None)).await
        }
    };
    match result {
        Ok(()) => Outcome::Success,
        Err(ApiError::Refused {
            code: crate::api::ErrorCode::UnknownLease,
            ..
        }) => Outcome::Success,
        Err(e) => system(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_marker_is_found_across_pieces_and_a_setup_failure_kept() {
        let marker = "flotilla-start run-1\n";
        for cut in 1..marker.len() {
            let mut out = Started::new(marker.to_string());
            out.take(FrameKind::Stdout, &marker.as_bytes()[..cut]);
            assert!(!out.started);
            out.take(FrameKind::Stdout, &marker.as_bytes()[cut..]);
            assert!(out.started, "cut at {cut}");
            assert!(out.before.is_empty());
        }
        let mut failed = Started::new(marker.to_string());
        failed.take(FrameKind::Stderr, b"cd: no such directory\n");
        failed.take(FrameKind::Stdout, b"flotilla-sta");
        failed.take(FrameKind::Stdout, b"XX");
        assert!(!failed.started);
        assert_eq!(
            failed.setup_output(),
            "cd: no such directory\nflotilla-staXX"
        );
        // A chatty login shell before the marker, in the same piece as the marker.
        let mut chatty = Started::new(marker.to_string());
        chatty.take(
            FrameKind::Stdout,
            b"Welcome to the machine!\nflotilla-start run-1\nout",
        );
        assert!(chatty.started);
        assert_eq!(chatty.shown, 3);
        // The follower's stderr: only its last status line counts, whatever came before.
        chatty.take(FrameKind::Stderr, &[b'x'; 1000]);
        chatty.take(FrameKind::Stderr, b"\nflotilla-status 7\n");
        assert_eq!(chatty.status(), Some(Status::Exited(7)));
        chatty.take(FrameKind::Stderr, b"flotilla-status lost\n");
        assert_eq!(chatty.status(), Some(Status::Lost));
    }

    #[test]
    fn a_run_name_is_safe_in_a_path_and_unique_per_invocation() {
        let a = run_name("step_script/../x y");
        assert!(a.starts_with("step_script----x-y-"), "{a}");
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        );
        assert_eq!(signal_number("TERM"), 15);
        assert_eq!(signal_number("FOO@example.com"), 0);
    }
}

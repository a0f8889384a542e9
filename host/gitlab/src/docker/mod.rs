//! Docker mode: each job in containers on its leased instance, reached only through the
//! host's Docker handle of the lease. `prepare` creates the job's network, volumes, services
//! and container ([`objects`]); each stage's script runs detached in the container, its log
//! followed ([`crate::detached`]); a cancel ends every process in the stage's container but
//! its init; `cleanup` removes the job's objects.

pub mod client;
pub mod helper;
pub(crate) mod images;
pub(crate) mod objects;
pub(crate) mod sweep;

pub use objects::{CACHE_LABEL, ContainerOptions, JOB_LABEL};

use std::cell::Cell;
use std::time::Duration;

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::UploadToContainerOptions;
use futures_util::StreamExt;

use crate::api::{Acquired, ApiClient, FrameKind};
use crate::detached::{Output, RunFiles, Status};
use crate::job::{CacheBounds, DriverSettings, Job, JobLimits, PullPolicy};
use crate::place::{Context, Ended, GRACE, Place, StageRun, StepError};
use client::step;

/// Docker mode's settings.
#[derive(Debug, Clone)]
pub struct DockerSettings {
    /// Where the job's files live inside its container (the runner's `builds_dir`).
    pub builds_dir: String,
    /// Where the runner keeps its cache inside the container (`cache_dir`).
    pub cache_dir: String,
    /// The image when the job names none.
    pub default_image: Option<String>,
    /// When to pull.
    pub pull_policy: PullPolicy,
    /// Limits of the job's containers.
    pub limits: JobLimits,
    /// Bounds of the volumes a project's jobs share on each instance (caches, checkouts).
    pub cache: CacheBounds,
    /// The helper image (`--helper-image`); `None`: GitLab's official one for the runner's
    /// version and the machine's architecture; [`helper::NONE`]: no helper.
    pub helper_image: Option<String>,
    /// The operator's registry credentials for the helper image, as Docker's `config.json`.
    pub helper_registry_auth: Option<String>,
    /// The docker executor's options, given to every container of the job.
    pub options: ContainerOptions,
    /// The images jobs may run (globs; empty: any).
    pub allowed_images: Vec<String>,
    /// The images jobs may start as services (globs; empty: any).
    pub allowed_services: Vec<String>,
}

/// Where the scripts go in a container: `/tmp`, which every image the runner supports has.
const SCRIPT_DIR: &str = "/tmp";

/// How long cleanup waits for the engine to answer its first request (the listing of the
/// job's containers) before it reports the instance broken.
const PING: Duration = Duration::from_secs(60);

/// How long cleanup waits before its second sweep, so an object whose creation was still in
/// flight when a killed `prepare` died has landed and is removed too. A job whose `prepare`
/// finished (`Job::was_prepared`) has no such object, and no second sweep.
const SETTLE: Duration = Duration::from_millis(1500);

/// The job's containers on its instance.
pub(crate) struct DockerPlace {
    api: ApiClient,
    job: Job,
    own: DockerSettings,
    docker: Docker,
    /// Whether this invocation's script is in its container already.
    uploaded: Cell<bool>,
}

impl Place for DockerPlace {
    type Settings = DockerSettings;

    fn check(job: &Job, own: &DockerSettings) -> Result<(), String> {
        let image = job
            .image
            .as_deref()
            .or(own.default_image.as_deref())
            .ok_or("the job names no image and the driver has no --default-image")?;
        images::check_allowed(image, &own.allowed_images, "image")?;
        for service in &job.services {
            images::check_allowed(&service.name, &own.allowed_services, "service")?;
        }
        Ok(())
    }

    fn open(
        api: &ApiClient,
        job: &Job,
        _settings: &DriverSettings,
        own: &DockerSettings,
        lease: u64,
    ) -> Result<DockerPlace, String> {
        // Long enough for a pull or a slow stage's exec to answer.
        let docker = client::for_lease(api, lease, 3600)?;
        Ok(DockerPlace {
            api: api.clone(),
            job: job.clone(),
            own: own.clone(),
            docker,
            uploaded: Cell::new(false),
        })
    }

    async fn prepare(&self, acquired: &Acquired) -> Result<Duration, StepError> {
        let image = self
            .job
            .image
            .as_deref()
            .or(self.own.default_image.as_deref())
            .unwrap_or_default();
        let inventory = sweep::inventory(&self.docker).await;
        sweep::remove_leftovers(&self.api, &self.docker, &self.job, &inventory.jobs).await;
        let keep = [
            self.job.cache_volume(),
            self.job.builds_volume(acquired.slot),
        ];
        let held = inventory.may_hold(&self.job);
        sweep::bound_caches(&self.docker, self.own.cache, &keep, inventory.shared).await;
        if held {
            // A retried prepare starts from a clean slate; a first one finds nothing to remove.
            sweep::remove_job_objects(&self.docker, &self.job).await?;
        }
        objects::create_job(
            &self.docker,
            self.api.pool(),
            &self.job,
            image,
            &self.own,
            acquired.slot,
        )
        .await
    }

    async fn follow(&self, run: &StageRun<'_>, printed: &Cell<u64>) -> Result<Ended, StepError> {
        let container = self.container(run.context);
        let files = RunFiles::new(SCRIPT_DIR, &format!("flotilla-{}", run.name));
        if !self.uploaded.get() {
            if self.effective(run.context) == Context::Helper {
                // An older runner calls itself by its absolute path: link it too.
                let paths = helper::runner_paths(run.script).map_err(StepError::Failed)?;
                if !paths.is_empty() {
                    let image = "of this job";
                    helper::install(&self.docker, &self.job, image, &paths).await?;
                }
            }
            self.upload(&container, &files, run.script).await?;
            self.uploaded.set(true);
        }
        let place = "[ -f \"$P.sh\" ] || { echo 'flotilla: the script is not in the container' >&2; rmdir \"$P.d\"; exit 1; }";
        let command = files.start(
            place,
            ":",
            launch(self.effective(run.context)),
            printed.get(),
        );
        let exec = self
            .docker
            .create_exec(
                &container,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(vec!["sh".to_string(), "-c".to_string(), command]),
                    ..Default::default()
                },
            )
            .await
            .map_err(step("following the script's output"))?;
        let started = self
            .docker
            .start_exec(&exec.id, Some(StartExecOptions::default()))
            .await
            .map_err(step("following the script's output"))?;
        let StartExecResults::Attached { mut output, .. } = started else {
            return Err(StepError::Failed("the follower's exec was detached".into()));
        };
        let mut out = Output::new(files.name());
        let base = printed.get();
        while let Some(item) = output.next().await {
            let chunk = match item {
                Ok(chunk) => chunk,
                Err(e) => return Ok(Ended::Cut(e.to_string())),
            };
            match chunk {
                bollard::container::LogOutput::StdErr { message } => {
                    out.take(FrameKind::Stderr, &message);
                }
                bollard::container::LogOutput::StdOut { message }
                | bollard::container::LogOutput::Console { message }
                | bollard::container::LogOutput::StdIn { message } => {
                    out.take(FrameKind::Stdout, &message);
                }
            }
            printed.set(base + out.shown);
        }
        Ok(stream_end(&out))
    }

    async fn stop(&self, run: &StageRun<'_>) {
        let container = self.container(run.context);
        if let Err(e) = self.stop_all(&container).await {
            eprintln!("flotilla: stopping the {} script: {e}", run.stage);
        }
    }

    async fn sweep(&self) -> Result<(), StepError> {
        let what = format!("Docker Engine does not answer after job {}", self.job.id);
        // A hung engine is a broken instance, well within the runner's cleanup timeout: the
        // listing of the job's containers is the ping.
        let listed = match tokio::time::timeout(
            PING,
            sweep::job_containers(&self.docker, &self.job),
        )
        .await
        {
            Ok(answer) => answer.map_err(step("listing the job's containers"))?,
            Err(_) => return Err(StepError::Failed(format!("{what} within {PING:?}"))),
        };
        sweep::remove_listed(&self.docker, &self.job, listed).await?;
        if self.job.was_prepared() {
            // Its prepare finished: nothing it made can still be landing.
            return Ok(());
        }
        tokio::time::sleep(SETTLE).await;
        sweep::remove_job_objects(&self.docker, &self.job).await
    }
}

/// How a follow ended whose stream closed without an error. A failed start says why before
/// the start marker; a stream that closed before saying a word was cut (the host died with
/// the exec's upgraded connection, which then reads as a clean end), so it is followed again.
fn stream_end(out: &Output) -> Ended {
    match out.status() {
        Some(Status::Exited(code)) => Ended::Exited(code),
        Some(Status::Lost) => Ended::Lost,
        None if out.started => Ended::Cut("the follower ended without the script's status".into()),
        None => match out.setup_output() {
            words if words.is_empty() => {
                Ended::Cut("the follower ended before the script's start marker".into())
            }
            words => Ended::NotStarted(words),
        },
    }
}

/// The command that runs the uploaded script `"$P.sh"`: the runner's scripts are written for
/// bash when the image has it, `sh` otherwise (as the docker executor's detection script
/// chooses, `BashDetectShellScript`).
///
/// In the helper, files are made with `umask 0000`, as the official image's
/// `gitlab-runner-build` wrapper does, so a job image whose user is not root can still
/// change what the checkout and cache stages wrote as root.
fn launch(context: Context) -> &'static str {
    match context {
        Context::Job => {
            "{ if command -v bash >/dev/null 2>&1; then bash \"$P.sh\"; else sh \"$P.sh\"; fi; }"
        }
        Context::Helper => {
            "{ umask 0000; if command -v bash >/dev/null 2>&1; then bash \"$P.sh\"; else sh \"$P.sh\"; fi; }"
        }
    }
}

/// Ends every process in a container but its init (the container lives on for the next
/// stage): `TERM`, up to [`GRACE`] for them to end, then `KILL`. `kill -1` reaches every
/// process the caller may signal except itself and the namespace's init, whatever its
/// session or process group, so neither `setsid` nor a double fork escapes; it runs as root,
/// so neither does `sudo`. A process forked while `KILL` went round is killed on the next
/// round, until none is left. Zombies waiting for their parent do not count as running.
fn stop_command(tenths: u128) -> String {
    format!(
        "left() {{ n=0; for d in /proc/[0-9]*; do p=${{d#/proc/}}; [ \"$p\" = 1 ] || [ \"$p\" = $$ ] && continue; t=; read -r t 2>/dev/null < \"$d/stat\" || continue; case \"${{t##*) }}\" in Z*|X*) ;; *) n=$((n + 1));; esac; done; [ $n != 0 ]; }}\n\
         nap() {{ sleep 0.1 2>/dev/null || sleep 1; }}\n\
         kill -TERM -1 2>/dev/null\n\
         i=0; while [ $i -lt {tenths} ] && left; do nap; i=$((i + 1)); done\n\
         i=0; while [ $i -lt 50 ]; do kill -KILL -1 2>/dev/null; left || break; nap; i=$((i + 1)); done\n\
         true\n"
    )
}

impl DockerPlace {
    /// The container a stage of `context` runs in.
    fn container(&self, context: Context) -> String {
        match self.effective(context) {
            Context::Helper => self.job.helper_container(),
            Context::Job => self.job.container(),
        }
    }

    /// Where a stage of `context` really runs: in the job's container when the operator
    /// turned the helper off.
    fn effective(&self, context: Context) -> Context {
        if helper::disabled(&self.own) {
            Context::Job
        } else {
            context
        }
    }

    /// Copies the script into the container (the first follow starts it).
    async fn upload(
        &self,
        container: &str,
        files: &RunFiles,
        text: &[u8],
    ) -> Result<(), StepError> {
        let script = files.script();
        let name = script.rsplit('/').next().unwrap_or(&script);
        self.docker
            .upload_to_container(
                container,
                Some(UploadToContainerOptions {
                    path: SCRIPT_DIR.into(),
                    ..Default::default()
                }),
                bollard::body_full(crate::tar::one_file(name, 0o700, text).into()),
            )
            .await
            .map_err(step("copying the script into the job container"))?;
        Ok(())
    }

    /// Runs [`stop_command`] in `container` as root, and waits for it to end.
    async fn stop_all(&self, container: &str) -> Result<(), StepError> {
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some("0".into()),
                    cmd: Some(vec![
                        "sh".to_string(),
                        "-c".to_string(),
                        stop_command(GRACE.as_millis() / 100),
                    ]),
                    ..Default::default()
                },
            )
            .await
            .map_err(step("stopping the script"))?;
        let started = self
            .docker
            .start_exec(&exec.id, Some(StartExecOptions::default()))
            .await
            .map_err(step("stopping the script"))?;
        if let StartExecResults::Attached { mut output, .. } = started {
            while output.next().await.is_some() {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower stream that the host's death closed before its first byte is followed
    /// again, not reported as a script that could not be placed (the chaos test met this:
    /// `placing the build_script script failed (did prepare run?): ` with no words).
    #[test]
    fn a_stream_closed_before_a_word_is_a_cut_and_a_setup_failure_is_not() {
        let name = "flotilla-build_script";
        let silent = Output::new(name);
        assert!(matches!(stream_end(&silent), Ended::Cut(_)));
        let mut failed = Output::new(name);
        failed.take(
            FrameKind::Stderr,
            b"flotilla: the script is not in the container\n",
        );
        assert_eq!(
            stream_end(&failed),
            Ended::NotStarted("flotilla: the script is not in the container".into())
        );
        let mut started = Output::new(name);
        started.take(
            FrameKind::Stdout,
            crate::detached::start_marker(name).as_bytes(),
        );
        assert!(matches!(stream_end(&started), Ended::Cut(_)));
        started.take(
            FrameKind::Stderr,
            crate::detached::status_line("3").as_bytes(),
        );
        assert_eq!(stream_end(&started), Ended::Exited(3));
    }

    /// [`stop_command`] against real processes in a PID namespace of their own (as a
    /// container has), so `kill -1` reaches nothing outside: a background process, one that
    /// left the session (`setsid`) and one that ignores `TERM` are all gone after it, and
    /// the namespace's init is still there. Needs root (unshare); skipped otherwise.
    #[test]
    fn a_stop_ends_every_process_of_the_container_but_its_init() {
        let probe = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .output();
        if !probe.is_ok_and(|o| o.status.success()) {
            eprintln!("skipped: this user cannot make a PID namespace");
            return;
        }
        let inside = format!(
            "sleep 300 & setsid sleep 301 & (trap '' TERM; sleep 302; :) & sleep 0.3\n\
             sh -c {stop}\n\
             n=0; for d in /proc/[0-9]*; do p=${{d#/proc/}}; [ \"$p\" = $$ ] && continue; \
             read -r t < \"$d/stat\" 2>/dev/null || continue; case \"${{t##*) }}\" in Z*) ;; *) n=$((n + 1)); echo \"left: $t\";; esac; done\n\
             echo \"init=$$ left=$n\"\n",
            stop = crate::detached::sh_quote(&stop_command(5)),
        );
        let start = std::time::Instant::now();
        let out = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &inside])
            .output()
            .expect("unshare");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("init=1 left=0"), "{text}{out:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}

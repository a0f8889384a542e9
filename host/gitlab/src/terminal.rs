//! `flotilla gitlab terminal JOB_ID`: an operator's interactive shell in a running job's
//! container (Docker mode), through the job's lease and the host's Docker handle, with the
//! API token. The host logs who opened it, for which job, and when it ended; it ends when the
//! lease does (the host cuts the lease's streams).
//!
//! GitLab's own web terminal needs the runner's session server and an executor that supports
//! it (Docker, Kubernetes, Shell); the Custom executor has none, so this is the way in.

use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::api::{ApiClient, LeaseState};
use crate::job::Job;

/// The header the host logs a session's operator by.
const WHO_HEADER: &str = "x-flotilla-terminal";

/// Without a command: bash where the image has it, else sh.
pub const DEFAULT_SHELL: &[&str] = &[
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi",
];

/// What the operator's side is: a terminal (raw, with its size) or plain pipes.
#[derive(Debug, Clone, Copy)]
pub struct TerminalSide {
    /// Whether stdin is a terminal: the exec gets a TTY.
    pub tty: bool,
    /// The terminal's size (rows, columns), when known.
    pub size: Option<(u16, u16)>,
}

/// Opens `command` in the container of job `job_id` and copies `input` to it and its output
/// to `output` until it ends; its exit code. `who` is logged by the host.
pub async fn open(
    api: &ApiClient,
    job_id: &str,
    command: &[String],
    who: &str,
    side: TerminalSide,
    mut input: impl AsyncRead + Unpin + Send + 'static,
    mut output: impl AsyncWrite + Unpin,
) -> Result<i64, String> {
    let found = api
        .lease_by_label("gitlab-job", job_id)
        .await
        .map_err(|e| e.to_string())?;
    let lease = match found {
        Some(l) if matches!(l.state, LeaseState::Acquired { .. }) => l.id,
        Some(l) => {
            return Err(format!(
                "job {job_id} has no running instance in pool {} (its lease is {:?})",
                api.pool(),
                l.state
            ));
        }
        None => {
            return Err(format!(
                "job {job_id} has no lease in pool {}: it is not running here (or its cleanup ran)",
                api.pool()
            ));
        }
    };
    let who = who
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(64)
        .collect();
    // A session lasts as long as the operator stays (the lease bounds it).
    let docker =
        crate::docker::client::for_lease_with(api, lease, 86_400, Some((WHO_HEADER, who)))?;
    let container = Job::container_of(job_id);
    let exec = docker
        .create_exec(
            &container,
            CreateExecOptions::<String> {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(side.tty),
                cmd: Some(command.to_vec()),
                env: side.tty.then(|| vec!["TERM=xterm-256color".to_string()]),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| match e {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            } => format!(
                "job {job_id} has no container {container} on its instance: the terminal serves \
                 Docker mode, and an instance-mode job runs on the machine itself"
            ),
            e => format!("opening a shell in {container}: {e}"),
        })?;
    let started = docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                detach: false,
                tty: side.tty,
                ..Default::default()
            }),
        )
        .await
        .map_err(|e| format!("starting the shell: {e}"))?;
    let StartExecResults::Attached {
        output: mut from,
        input: mut to,
    } = started
    else {
        return Err("the engine did not attach the shell".into());
    };
    if let (true, Some((height, width))) = (side.tty, side.size) {
        // Best effort: a wrong size only wraps lines.
        let _ = docker
            .resize_exec(&exec.id, ResizeExecOptions { height, width })
            .await;
    }
    // Keystrokes go in as they come; the end of input closes the shell's stdin.
    let typing = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            match input.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to
                        .write_all(buf.get(..n).unwrap_or_default())
                        .await
                        .is_err()
                    {
                        break;
                    }
                    let _ = to.flush().await;
                }
            }
        }
        let _ = to.shutdown().await;
    });
    while let Some(chunk) = from.next().await {
        match chunk {
            Ok(log) => {
                output
                    .write_all(&log.into_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                output.flush().await.map_err(|e| e.to_string())?;
            }
            Err(e) => {
                typing.abort();
                return Err(format!("the session ended: {e}"));
            }
        }
    }
    typing.abort();
    let ended = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| format!("the session ended (the lease may have ended): {e}"))?;
    ended
        .exit_code
        .ok_or_else(|| "the session ended without an exit code (the lease may have ended)".into())
}

//! `flotilla gitlab terminal JOB_ID`: an operator's interactive shell in a running job's
//! container (Docker mode), through the job's lease and the host's Docker handle, or in the
//! job's directory on its machine (instance mode, [`open_on_machine`]), through the lease's
//! terminal route over the host's SSH session; with the API token. The host logs who opened it, for which job, and when it ended; it ends when the
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
pub(crate) const WHO_HEADER: &str = "x-flotilla-terminal";

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
    input: impl AsyncRead + Unpin + Send + 'static,
    output: impl AsyncWrite + Unpin,
) -> Result<i64, String> {
    let lease = running_lease(api, job_id).await?;
    let who = printable(who);
    // A session lasts as long as the operator stays (the lease bounds it).
    let docker =
        crate::docker::client::for_lease_with(api, lease, 86_400, Some((WHO_HEADER, who)))?;
    let (exec, from, to) = start_shell(&docker, job_id, command, side).await?;
    pump(from, to, input, output).await?;
    let ended = docker
        .inspect_exec(&exec)
        .await
        .map_err(|e| format!("the session ended (the lease may have ended): {e}"))?;
    ended
        .exit_code
        .ok_or_else(|| "the session ended without an exit code (the lease may have ended)".into())
}

/// Runs `command` (a line for the machine's login shell,
/// [`InstanceSettings::terminal_command`](crate::InstanceSettings::terminal_command)) on the
/// machine of instance-mode job `job_id`, with a pseudo-terminal when the operator has a
/// terminal, and copies `input` to it and its output to `output` until it ends; its exit code
/// (128 and the signal's number when a signal ended it). `who` is logged by the host.
pub async fn open_on_machine(
    api: &ApiClient,
    job_id: &str,
    command: String,
    who: &str,
    side: TerminalSide,
    input: impl AsyncRead + Unpin + Send + 'static,
    mut output: impl AsyncWrite + Unpin,
) -> Result<i64, String> {
    use flotilla_api::exec::TerminalRequest;
    let lease = running_lease(api, job_id).await?;
    let (rows, cols) = match (side.tty, side.size) {
        (true, Some(size)) => (Some(size.0), Some(size.1)),
        (true, None) => (Some(24), Some(80)),
        (false, _) => (None, None),
    };
    let asked = TerminalRequest {
        command,
        rows,
        cols,
    };
    let stream = api
        .terminal(lease, &asked, &printable(who))
        .await
        .map_err(|e| e.to_string())?;
    let (mut from, to) = tokio::io::split(stream);
    let typing = tokio::spawn(type_into(input, to));
    let ended = follow(&mut from, &mut output).await;
    typing.abort();
    ended
}

/// Writes the session's output frames to `output` until its last frame: the command's exit
/// code (128 and the signal's number when a signal ended it), or why the session broke.
async fn follow(
    from: &mut (impl AsyncRead + Unpin),
    output: &mut (impl AsyncWrite + Unpin),
) -> Result<i64, String> {
    use flotilla_api::exec::{Decoder, ExitFrame, FrameKind};
    let mut frames = Decoder::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if let Some((kind, payload)) = frames.next_frame().map_err(|e| e.to_string())? {
            match kind {
                FrameKind::Stdout | FrameKind::Stderr => {
                    output
                        .write_all(&payload)
                        .await
                        .map_err(|e| e.to_string())?;
                    output.flush().await.map_err(|e| e.to_string())?;
                }
                FrameKind::Exit => {
                    let end: ExitFrame = serde_json::from_slice(&payload)
                        .map_err(|e| format!("the session's end: {e}"))?;
                    break Ok(match (end.status, end.signal) {
                        (Some(status), _) => i64::from(status),
                        (None, Some(signal)) => 128 + crate::instance::signal_number(&signal),
                        (None, None) => 1,
                    });
                }
                FrameKind::Broken => {
                    break Err(format!(
                        "the session ended: {}",
                        String::from_utf8_lossy(&payload)
                    ));
                }
            }
            continue;
        }
        match from.read(&mut buf).await {
            Ok(n @ 1..) => frames.push(buf.get(..n).unwrap_or_default()),
            Ok(0) => {
                break Err(
                    "the session was cut before the command ended (flotilla went away?)".into(),
                );
            }
            Err(e) => break Err(format!("the session was cut: {e}")),
        }
    }
}

/// Copies the operator's keystrokes to the session as they are typed; the end of their input
/// closes the session's side, which ends the command's input.
async fn type_into(
    mut input: impl AsyncRead + Unpin + Send + 'static,
    mut to: impl AsyncWrite + Unpin + Send + 'static,
) {
    let mut buf = vec![0u8; 4096];
    while let Ok(n @ 1..) = input.read(&mut buf).await {
        if to
            .write_all(buf.get(..n).unwrap_or_default())
            .await
            .is_err()
        {
            return;
        }
        let _ = to.flush().await;
    }
    let _ = to.shutdown().await;
}

/// Printable ASCII, at most 64 characters: what the host logs an operator by.
fn printable(who: &str) -> String {
    who.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(64)
        .collect()
}

/// The job's acquired lease, or why there is none.
async fn running_lease(api: &ApiClient, job_id: &str) -> Result<u64, String> {
    let found = api
        .lease_by_label("gitlab-job", job_id)
        .await
        .map_err(|e| e.to_string())?;
    match found {
        Some(l) if matches!(l.state, LeaseState::Acquired { .. }) => Ok(l.id),
        Some(l) => Err(format!(
            "job {job_id} has no running instance in pool {} (its lease is {:?})",
            api.pool(),
            l.state
        )),
        None => Err(format!(
            "job {job_id} has no lease in pool {}: it is not running here (or its cleanup ran)",
            api.pool()
        )),
    }
}

/// What the shell prints.
type Printed = std::pin::Pin<
    Box<
        dyn futures_util::Stream<
                Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
            > + Send,
    >,
>;

/// Where keystrokes go.
type Keys = std::pin::Pin<Box<dyn AsyncWrite + Send>>;

/// Starts `command` in the job's container, attached (with a TTY of the operator's size when
/// the operator has a terminal); the exec's id and its streams.
async fn start_shell(
    docker: &bollard::Docker,
    job_id: &str,
    command: &[String],
    side: TerminalSide,
) -> Result<(String, Printed, Keys), String> {
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
                "job {job_id} has no container {container} on its instance: an instance-mode \
                 job runs on the machine itself (give `--mode instance`)"
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
    let StartExecResults::Attached { output, input } = started else {
        return Err("the engine did not attach the shell".into());
    };
    if let (true, Some((height, width))) = (side.tty, side.size) {
        // Best effort: a wrong size only wraps lines.
        let _ = docker
            .resize_exec(&exec.id, ResizeExecOptions { height, width })
            .await;
    }
    Ok((exec.id, output, input))
}

/// Copies keystrokes from `input` to the shell as they come (the end of input closes its
/// stdin), and what it prints to `output`, until it ends.
async fn pump(
    mut from: Printed,
    to: Keys,
    input: impl AsyncRead + Unpin + Send + 'static,
    mut output: impl AsyncWrite + Unpin,
) -> Result<(), String> {
    let typing = tokio::spawn(type_into(input, to));
    let printed = async {
        while let Some(chunk) = from.next().await {
            let log = chunk.map_err(|e| format!("the session ended: {e}"))?;
            output
                .write_all(&log.into_bytes())
                .await
                .map_err(|e| e.to_string())?;
            output.flush().await.map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let result = printed.await;
    typing.abort();
    result
}

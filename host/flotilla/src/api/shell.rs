//! The lease routes that run commands on a leased machine over the host's SSH session: `exec`
//! (a stage's script, its output streamed back) and `terminal` (an operator's interactive
//! shell, over an upgraded connection), and the log of operators' terminal sessions, which the
//! Docker route opens too.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_api::exec::{ExitFrame, FrameKind, TERMINAL_UPGRADE, TerminalRequest, encode};
use flotilla_connector::{Connector, ExecEvent, ExecInput, Pty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    ApiError, Caller, ErrorCode, LeasePath, Shared, acquired_instance, holder, parse_body,
};
use crate::pools::RunningPool;

/// The pool's connector, or why the host reaches no machine of it.
fn shell_connector<'a>(running: &'a RunningPool, name: &str) -> Result<&'a Connector, ApiError> {
    running.connector.as_deref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NoShell,
            format!("pool {name} has no [pool.connector]; the host reaches no machine of it"),
        )
    })
}

/// A place under `server.max_streams` for an upgraded stream (a Docker attach or exec, an
/// operator's terminal), which outlives its connection's slot; `None` for a request the
/// server's own connection bounds do not track. Refused when every place is taken.
pub(super) fn stream_permit(
    extensions: &axum::http::Extensions,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ApiError> {
    match extensions.get::<crate::serve::Connection>() {
        Some(c) => c.stream().map(Some).ok_or_else(|| {
            ApiError::new(
                ErrorCode::TooManyRequests,
                "as many streams are open as the server lets open (server.max_streams); retry in a second",
            )
        }),
        None => Ok(None),
    }
}

/// One event of a command as a frame of [`flotilla_api::exec`].
fn frame_of(event: ExecEvent) -> Vec<u8> {
    match event {
        ExecEvent::Stdout(data) => encode(FrameKind::Stdout, &data),
        ExecEvent::Stderr(data) => encode(FrameKind::Stderr, &data),
        ExecEvent::Exited { status, signal } => {
            let end = serde_json::to_vec(&ExitFrame { status, signal }).unwrap_or_default();
            encode(FrameKind::Exit, &end)
        }
        ExecEvent::Broken(why) => encode(FrameKind::Broken, why.as_bytes()),
    }
}

/// An exec request's body limit: the largest stdin in base64, and room for the command.
pub(super) const EXEC_BODY_LIMIT: usize = flotilla_api::exec::MAX_STDIN / 3 * 4 + (1 << 20);

/// Runs one command on the machine of an acquired lease over the host's SSH session, and
/// streams its output and end as frames ([`flotilla_api::exec`]). Neither the command nor its
/// input is logged: the input is a job's script, which carries the job's variables.
pub(super) async fn exec(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    use base64::Engine as _;
    use flotilla_api::exec::ExecRequest;

    let (name, running) = holder(&state, &name, id)?;
    let p = &running.handle;
    let instance = acquired_instance(p, id)?;
    let connector = shell_connector(&running, &name)?;
    let request: ExecRequest = parse_body(&body)?;
    if request.command.trim().is_empty() {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "request body: `command` is empty",
        ));
    }
    let stdin = base64::engine::general_purpose::STANDARD
        .decode(request.stdin_base64.as_bytes())
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("`stdin_base64`: {e}")))?;
    let events = connector
        .exec(
            p.provider().as_ref(),
            &instance,
            id,
            &request.command,
            stdin,
        )
        .await
        .map_err(ApiError::from)?;
    tracing::debug!(pool = %name, lease = id, %instance, "exec on the lease's machine");
    let frames = futures_util::stream::unfold(events, |mut events| async move {
        let frame = axum::body::Bytes::from(frame_of(events.recv().await?));
        Some((Ok::<_, std::convert::Infallible>(frame), events))
    });
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            flotilla_api::exec::CONTENT_TYPE,
        )],
        axum::body::Body::from_stream(frames),
    )
        .into_response())
}

/// Opens an operator's interactive command on the machine of an acquired lease (an
/// instance-mode job's): `101 Switching Protocols`, then keystrokes in as raw bytes and the
/// command's frames out ([`flotilla_api::exec`]), until the command ends, the operator leaves
/// (the command is sent `TERM`), or the lease ends (`KILL`). Logged as a terminal session:
/// who, the job's labels, and how long it lasted. Its stream counts under `max_streams`.
pub(super) async fn terminal(
    State(state): State<Shared>,
    LeasePath { pool: name, id }: LeasePath,
    mut request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (name, running) = holder(&state, &name, id)?;
    let p = &running.handle;
    let instance = acquired_instance(p, id)?;
    let connector = shell_connector(&running, &name)?;
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok());
    if !upgrade.is_some_and(|u| u.eq_ignore_ascii_case(TERMINAL_UPGRADE)) {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "a terminal upgrades its connection: send `Connection: Upgrade` and `Upgrade: {TERMINAL_UPGRADE}`"
            ),
        ));
    }
    let asked: TerminalRequest = axum::extract::Query::try_from_uri(request.uri())
        .map(|q| q.0)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("query: {e}")))?;
    if asked.command.trim().is_empty() {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "query: `command` is empty",
        ));
    }
    let pty = match (asked.rows, asked.cols) {
        (Some(rows @ 1..), Some(cols @ 1..)) => Some(Pty { rows, cols }),
        (None, None) => None,
        _ => {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                "query: give both `rows` and `cols` (each above 0) for a terminal, or neither",
            ));
        }
    };
    let permit = stream_permit(request.extensions())?;
    let (keys, typed) = tokio::sync::mpsc::channel(16);
    let mut events = connector
        .exec_with(
            p.provider().as_ref(),
            &instance,
            id,
            &asked.command,
            ExecInput::Stream(typed),
            pty,
        )
        .await
        .map_err(ApiError::from)?;
    let labels = p.with_core(|c| c.lease(id).map(|l| l.labels.clone()));
    let held = UpgradedStream {
        _permit: permit,
        _session: Some(TerminalSession::open(
            request.headers().get(TERMINAL_HEADER),
            request.extensions().get::<Caller>().unwrap_or(&Caller::Api),
            &name,
            id,
            &instance,
            labels.unwrap_or_default(),
        )),
        _open: state.metrics.docker_stream_opened(),
    };
    let upgraded = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let _held = held;
        let Ok(upgraded) = upgraded.await else {
            return;
        };
        let (mut from_operator, mut to_operator) = tokio::io::split(TokioIo::new(upgraded));
        // The operator's side closing ends the command's input (`keys` dropped).
        let typing = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n @ 1..) = from_operator.read(&mut buf).await {
                let typed = buf.get(..n).unwrap_or_default().to_vec();
                if keys.send(typed).await.is_err() {
                    break;
                }
            }
        });
        // An operator gone mid-write drops `events`: the command is stopped.
        while let Some(event) = events.recv().await {
            if to_operator.write_all(&frame_of(event)).await.is_err() {
                break;
            }
            let _ = to_operator.flush().await;
        }
        let _ = to_operator.shutdown().await;
        typing.abort();
    });
    Ok((
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "upgrade"),
            (header::UPGRADE, TERMINAL_UPGRADE),
        ],
    )
        .into_response())
}

/// The header an operator's terminal (`flotilla gitlab terminal`) sends with its Docker
/// requests: who opens the session.
pub(super) const TERMINAL_HEADER: &str = "x-flotilla-terminal";

/// What an upgraded Docker stream holds for its life: its place under `max_streams`, and an
/// operator's terminal session, if it is one.
pub(super) struct UpgradedStream {
    pub(super) _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    pub(super) _session: Option<TerminalSession>,
    pub(super) _open: crate::metrics::InFlight,
}

/// An operator's interactive session in a job's container or on its machine: logged when it opens, and when
/// its stream ends (the operator left, or the lease ended and cut it).
pub(super) struct TerminalSession {
    who: String,
    token: &'static str,
    pool: String,
    lease: u64,
    instance: String,
    labels: String,
    opened: std::time::Instant,
}

/// Who a session is logged as, and with which kind of token: an operator's token names them,
/// whatever the client says; with the API token, the name the client gives (`--who`), or
/// `(unnamed)`.
fn session_who(caller: &Caller, said: &str) -> (String, &'static str) {
    match caller {
        Caller::Operator(name) => (name.clone(), "operator"),
        Caller::Api if said.trim().is_empty() => ("(unnamed)".to_string(), "api"),
        Caller::Api => (said.to_string(), "api"),
    }
}

impl TerminalSession {
    pub(super) fn open(
        said: Option<&axum::http::HeaderValue>,
        caller: &Caller,
        pool: &str,
        lease: u64,
        instance: &str,
        labels: std::collections::BTreeMap<String, String>,
    ) -> TerminalSession {
        // Said by the client: printable ASCII, at most 64 characters.
        let said: String = said
            .and_then(|who| who.to_str().ok())
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_graphic() || *c == ' ')
            .take(64)
            .collect();
        let (who, token) = session_who(caller, &said);
        let labels = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        tracing::info!(who = %who, token, said = %said, pool = %pool, lease, instance = %instance, labels = %labels, "terminal session opened");
        TerminalSession {
            who,
            token,
            pool: pool.to_string(),
            lease,
            instance: instance.to_string(),
            labels,
            opened: std::time::Instant::now(),
        }
    }
}

impl Drop for TerminalSession {
    fn drop(&mut self) {
        tracing::info!(who = %self.who, token = self.token, pool = %self.pool, lease = self.lease, instance = %self.instance, labels = %self.labels, seconds = self.opened.elapsed().as_secs(), "terminal session closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operator's token names the session, whatever the client says; with the API token
    /// the client's word is all there is, and the log says which it was.
    #[test]
    fn a_session_is_named_by_the_operators_token_not_by_the_client() {
        let alice = Caller::Operator("alice".into());
        assert_eq!(session_who(&alice, "mallory"), ("alice".into(), "operator"));
        assert_eq!(session_who(&alice, ""), ("alice".into(), "operator"));
        assert_eq!(session_who(&Caller::Api, "bob"), ("bob".into(), "api"));
        assert_eq!(session_who(&Caller::Api, "  "), ("(unnamed)".into(), "api"));
    }
}

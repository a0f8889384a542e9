//! bollard, with the host's Docker handle of a lease as its transport: every request goes to
//! `<api>/v1/pools/<pool>/leases/<id>/docker/...` (over TLS for an `https://` API) with the API token, and the host
//! forwards it to the instance's engine (upgrades included, for exec and attach). Connections
//! to the API are kept alive between a stage's requests for a moment ([`crate::kept`]).

use bollard::{API_DEFAULT_VERSION, BollardRequest, Docker};

use crate::api::ApiClient;
use http_body_util::BodyExt;

use crate::kept::SendError;
use crate::place::StepError;

/// The Host header bollard's absolute URIs carry; replaced by the API's.
const BASE: &str = "http://flotilla.invalid";

/// A Docker client for the instance of `lease`.
pub fn for_lease(api: &ApiClient, lease: u64, timeout_secs: u64) -> Result<Docker, String> {
    for_lease_with(api, lease, timeout_secs, None)
}

/// [`for_lease`], every request carrying the header `extra` (name, value).
pub fn for_lease_with(
    api: &ApiClient,
    lease: u64,
    timeout_secs: u64,
    extra: Option<(&'static str, String)>,
) -> Result<Docker, String> {
    let authority = api.authority().to_string();
    let api = api.clone();
    let prefix = api.docker_path(lease);
    let token = api.token().map(|t| format!("Bearer {t}"));
    // The client's own kept connection: the stage's lease lookup left it open.
    let kept = api.kept();
    let transport = move |request: BollardRequest| {
        let authority = authority.clone();
        let api = api.clone();
        let prefix = prefix.clone();
        let token = token.clone();
        let extra = extra.clone();
        let kept = kept.clone();
        async move {
            let (mut parts, body) = request.into_parts();
            let path = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string();
            parts.uri = format!("{prefix}{path}")
                .parse()
                .map_err(|e: http::uri::InvalidUri| std::io::Error::other(e.to_string()))?;
            let host = http::HeaderValue::from_str(&authority)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            parts.headers.insert(http::header::HOST, host);
            if let Some(token) = &token {
                let value = http::HeaderValue::from_str(token)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                parts.headers.insert(http::header::AUTHORIZATION, value);
            }
            if let Some((name, value)) = &extra {
                let value = http::HeaderValue::from_str(value)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                parts.headers.insert(*name, value);
            }
            let request = http::Request::from_parts(parts, body.boxed_unsync());
            let response = kept
                .send(request, api.connect())
                .await
                .map_err(|e| match e {
                    SendError::Connect(e) => bollard::errors::Error::from(e),
                    SendError::Http(e) => e.into(),
                })?;
            Ok::<_, bollard::errors::Error>(response)
        }
    };
    Docker::connect_with_custom_transport(
        transport,
        Some(BASE.to_string()),
        timeout_secs,
        API_DEFAULT_VERSION,
    )
    .map_err(|e| e.to_string())
}

/// Classifies a Docker call's error with what was being done.
pub(crate) fn step(
    what: impl std::fmt::Display,
) -> impl FnOnce(bollard::errors::Error) -> StepError {
    move |e| {
        let message = format!("{what}: {e}");
        if host_down(&e) {
            StepError::HostDown(message)
        } else {
            StepError::Failed(message)
        }
    }
}

/// Whether a Docker call failed because the host (not the engine) did not answer: no
/// connection, a connection cut, or the host saying the pool is starting or draining.
pub(crate) fn host_down(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError {
            status_code,
            message,
        } => {
            *status_code == 503
                && flotilla_api::ErrorCode::ALL
                    .iter()
                    .filter(|c| c.restarting())
                    .any(|c| message.contains(c.name()))
        }
        E::IOError { .. } | E::HyperResponseError { .. } | E::RequestTimeoutError => true,
        _ => false,
    }
}

//! The lease API of a running `flotilla run`, as the driver uses it: HTTP/1.1 on the host's
//! listener, plain on loopback or over TLS ([`crate::transport`]), with the API's bearer token.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::kept::Kept;

/// The most labels one lease list asks after (the host takes at most 100).
pub(crate) const LABELS_PER_LIST: usize = 50;

pub use flotilla_api::exec::FrameKind;
pub use flotilla_api::{ErrorCode, LeaseState};

/// How a command run on a leased machine ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEnd {
    /// It ended: its exit status, or the signal that ended it.
    Exited {
        /// The exit status.
        status: Option<u32>,
        /// The signal's name without `SIG`.
        signal: Option<String>,
    },
    /// Its channel to the machine broke first; why.
    Broken(String),
}

/// What an acquire answers: the instance, and its operating system when the plugin said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The instance.
    pub instance: String,
    /// The lease's slot on the instance (one job at a time).
    pub slot: u32,
    /// `connection.os` of the acquire answer (`linux`, `darwin`, `windows`, ...).
    pub os: Option<String>,
}

/// Why a call to the host failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The host could not be reached or answered garbage.
    #[error("flotilla at {url}: {why}")]
    Unreachable {
        /// The API's base URL.
        url: String,
        /// What failed.
        why: String,
    },
    /// The host refused the request with a stable code.
    #[error("flotilla refused {what}: {code}: {message}")]
    Refused {
        /// The request.
        what: String,
        /// The API's error code (`unknown_lease`, `acquire_timeout`, ...).
        code: ErrorCode,
        /// Its message.
        message: String,
    },
}

/// A lease as the driver needs it: its id and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Its id.
    pub id: u64,
    /// Reserved, acquired (with the instance) or failed (with the cause).
    pub state: LeaseState,
}

/// A request body on a connection to the API: the driver's own JSON, or a Docker request's
/// body, boxed, so that both kinds of request can share a kept connection.
pub(crate) type ApiBody =
    http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A client of one pool of a running host. Clones share its kept connection.
#[derive(Clone)]
pub struct ApiClient {
    authority: String,
    base: String,
    tls: Option<crate::transport::Tls>,
    token: Option<String>,
    pool: String,
    timeout: Duration,
    /// The connection kept between requests: a stage's lease lookup and its Docker requests
    /// go on one connection ([`crate::kept`]).
    kept: Kept<ApiBody>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("base", &self.base)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// A client of `pool` at `url` (`http://host:port` on loopback, or `https://`),
    /// authenticating with `token`, with the default transport options.
    pub fn new(
        url: &str,
        token: Option<String>,
        pool: &str,
    ) -> Result<ApiClient, crate::setting::SettingError> {
        Self::with_transport(url, token, pool, &crate::TransportOptions::default())
    }

    /// [`Self::new`] with the operator's CA file and `--insecure-http`.
    pub fn with_transport(
        url: &str,
        token: Option<String>,
        pool: &str,
        options: &crate::TransportOptions,
    ) -> Result<ApiClient, crate::setting::SettingError> {
        use crate::setting::SettingError;
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| SettingError::new("--url", url, e.to_string()))?;
        let tls = crate::transport::for_url(url, &uri, token.is_some(), options)?;
        let authority = uri
            .authority()
            .map(|a| a.to_string())
            .ok_or_else(|| SettingError::new("--url", url, "no host"))?;
        if authority.contains('@') {
            return Err(SettingError::new(
                "--url",
                url,
                "a user or password in the URL is not used: the token comes from --token-file",
            ));
        }
        let has_port = uri.port_u16().is_some();
        let (scheme, default_port) = if tls.is_some() {
            ("https", 443)
        } else {
            ("http", 80)
        };
        let authority = if has_port {
            authority
        } else {
            format!("{authority}:{default_port}")
        };
        Ok(ApiClient {
            base: format!("{scheme}://{authority}"),
            authority,
            tls,
            token,
            pool: pool.to_string(),
            timeout: Duration::from_secs(30),
            kept: Kept::default(),
        })
    }

    /// The connection kept between this client's requests, shared by its clones and by the
    /// Docker clients made from it.
    pub(crate) fn kept(&self) -> Kept<ApiBody> {
        self.kept.clone()
    }

    /// A connection to the API, over TLS when the URL is `https://`.
    pub(crate) async fn connect(&self) -> std::io::Result<crate::transport::ApiStream> {
        crate::transport::connect(&self.authority, self.tls.as_ref()).await
    }

    /// The pool's name.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// The API's base URL (`http://host:port` or `https://host:port`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A short name for this API and pool: an FNV-1a hash of both, in hex. Notes the driver
    /// leaves for later calls carry it, so a note of another host or pool is never taken for
    /// this one's.
    pub fn scope(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.base.bytes().chain([b'\n']).chain(self.pool.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
    }

    /// `host:port` of the API.
    pub(crate) fn authority(&self) -> &str {
        &self.authority
    }

    /// The bearer token, if any.
    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    fn unreachable(&self, why: impl std::fmt::Display) -> ApiError {
        ApiError::Unreachable {
            url: self.base.clone(),
            why: why.to_string(),
        }
    }

    /// Sends one request; the answer's status and its body, still arriving.
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(http::StatusCode, hyper::body::Incoming), ApiError> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = &self.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let request = request
            .body(
                Full::new(body)
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .map_err(|e| self.unreachable(e))?;
        let response = self
            .kept
            .send(request, self.connect())
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok((response.status(), response.into_body()))
    }

    /// The API's error in a refusal's body (or the status and the body's start).
    fn refusal(what: String, status: http::StatusCode, bytes: &[u8]) -> ApiError {
        let (code, message) = match serde_json::from_slice::<flotilla_api::ErrorBody>(bytes) {
            Ok(body) => (body.error.code, body.error.message),
            Err(_) => (
                ErrorCode::Unknown,
                format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(bytes)
                        .chars()
                        .take(200)
                        .collect::<String>()
                ),
            ),
        };
        ApiError::Refused {
            what,
            code,
            message,
        }
    }

    /// Sends one request; the JSON answer of a 2xx, or the API's error.
    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Value>,
        limit: Duration,
    ) -> Result<Value, ApiError> {
        let what = format!("{method} {path}");
        let exchange = async {
            let (status, body) = self.send(method, path, body).await?;
            let bytes = body
                .collect()
                .await
                .map_err(|e| self.unreachable(e))?
                .to_bytes();
            Ok::<_, ApiError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| self.unreachable(format!("{what}: no answer within {limit:?}")))??;
        if status.is_success() {
            return Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null));
        }
        Err(Self::refusal(what, status, &bytes))
    }

    /// Runs `command` on the machine of `lease` through the host, `stdin` fed and closed;
    /// hands each piece of output to `sink` as it comes, and says how the command ended.
    /// The host must answer within the client's timeout; the command itself has no limit.
    pub async fn exec(
        &self,
        lease: u64,
        command: &str,
        stdin: &[u8],
        mut sink: impl FnMut(FrameKind, &[u8]),
    ) -> Result<ExecEnd, ApiError> {
        use base64::Engine as _;
        let path = format!("{}/{lease}/exec", self.leases_path());
        let what = format!("POST {path}");
        let request = flotilla_api::exec::ExecRequest {
            command: command.to_string(),
            stdin_base64: base64::engine::general_purpose::STANDARD.encode(stdin),
        };
        let body = serde_json::to_value(&request).map_err(|e| self.unreachable(e))?;
        let (status, mut body) = tokio::time::timeout(
            self.timeout,
            self.send(http::Method::POST, &path, Some(body)),
        )
        .await
        .map_err(|_| self.unreachable(format!("{what}: no answer within {:?}", self.timeout)))??;
        if !status.is_success() {
            let bytes = body
                .collect()
                .await
                .map_err(|e| self.unreachable(e))?
                .to_bytes();
            return Err(Self::refusal(what, status, &bytes));
        }
        let mut frames = flotilla_api::exec::Decoder::default();
        while let Some(piece) = body.frame().await {
            let piece = piece.map_err(|e| self.unreachable(format!("{what}: {e}")))?;
            let Ok(data) = piece.into_data() else {
                continue;
            };
            frames.push(&data);
            while let Some((kind, payload)) =
                frames.next_frame().map_err(|e| self.unreachable(e))?
            {
                match kind {
                    FrameKind::Stdout | FrameKind::Stderr => sink(kind, &payload),
                    FrameKind::Exit => {
                        let end: flotilla_api::exec::ExitFrame = serde_json::from_slice(&payload)
                            .map_err(|e| {
                            self.unreachable(format!("{what}: exit frame: {e}"))
                        })?;
                        return Ok(ExecEnd::Exited {
                            status: end.status,
                            signal: end.signal,
                        });
                    }
                    FrameKind::Broken => {
                        return Ok(ExecEnd::Broken(
                            String::from_utf8_lossy(&payload).into_owned(),
                        ));
                    }
                }
            }
        }
        Err(self.unreachable(format!(
            "{what}: the answer ended before the command did (flotilla went away?)"
        )))
    }

    /// Opens an operator's terminal on the machine of `lease` (an instance-mode job's): the
    /// upgraded connection, which takes keystrokes as raw bytes and gives the command's
    /// frames ([`flotilla_api::exec`]). `who` is logged by the host.
    pub async fn terminal(
        &self,
        lease: u64,
        asked: &flotilla_api::exec::TerminalRequest,
        who: &str,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, ApiError> {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("command", &asked.command);
        if let (Some(rows), Some(cols)) = (asked.rows, asked.cols) {
            query.append_pair("rows", &rows.to_string());
            query.append_pair("cols", &cols.to_string());
        }
        let path = format!("{}/{lease}/terminal?{}", self.leases_path(), query.finish());
        let what = format!("GET {}/{lease}/terminal", self.leases_path());
        let mut request = http::Request::builder()
            .method(http::Method::GET)
            .uri(path)
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONNECTION, "upgrade")
            .header(http::header::UPGRADE, flotilla_api::exec::TERMINAL_UPGRADE)
            .header(crate::terminal::WHO_HEADER, who);
        if let Some(token) = &self.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| self.unreachable(e))?;
        let opened = async {
            let stream = self.connect().await.map_err(|e| self.unreachable(e))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| self.unreachable(e))?;
            tokio::spawn(async move {
                // Lives on as the upgraded stream; an error reaches us through send_request.
                let _ = connection.with_upgrades().await;
            });
            sender
                .send_request(request)
                .await
                .map_err(|e| self.unreachable(e))
        };
        let response = tokio::time::timeout(self.timeout, opened)
            .await
            .map_err(|_| {
                self.unreachable(format!("{what}: no answer within {:?}", self.timeout))
            })??;
        let status = response.status();
        if status != http::StatusCode::SWITCHING_PROTOCOLS {
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| self.unreachable(e))?
                .to_bytes();
            return Err(Self::refusal(what, status, &bytes));
        }
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|e| self.unreachable(format!("{what}: {e}")))?;
        Ok(TokioIo::new(upgraded))
    }

    fn leases_path(&self) -> String {
        format!("/v1/pools/{}/leases", self.pool)
    }

    fn lease(view: flotilla_api::LeaseView) -> LeaseInfo {
        LeaseInfo {
            id: view.id,
            state: view.state,
        }
    }

    /// An answer read as the wire type the server writes it with.
    fn answer<T: serde::de::DeserializeOwned>(
        &self,
        value: Value,
        what: &str,
    ) -> Result<T, ApiError> {
        serde_json::from_value(value)
            .map_err(|e| self.unreachable(format!("unexpected {what} answer: {e}")))
    }

    /// The live lease carrying `key=value`, if any.
    pub async fn lease_by_label(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Option<LeaseInfo>, ApiError> {
        let path = format!("{}?label={key}={value}", self.leases_path());
        let answer = self
            .call(http::Method::GET, &path, None, self.timeout)
            .await?;
        let list: flotilla_api::LeaseList = self.answer(answer, "lease list")?;
        Ok(list.leases.into_iter().next().map(Self::lease))
    }

    /// The live leases carrying `key=value` for each of `values`, by value, in one request
    /// for up to [`LABELS_PER_LIST`] values. A host older than the repeated `label` parameter
    /// refuses it (`bad_request`); the caller then asks one by one.
    pub async fn leases_by_labels(
        &self,
        key: &str,
        values: &[&str],
    ) -> Result<BTreeMap<String, LeaseInfo>, ApiError> {
        let mut found = BTreeMap::new();
        for chunk in values.chunks(LABELS_PER_LIST) {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            for value in chunk {
                query.append_pair("label", &format!("{key}={value}"));
            }
            let path = format!("{}?{}", self.leases_path(), query.finish());
            let answer = self
                .call(http::Method::GET, &path, None, self.timeout)
                .await?;
            let list: flotilla_api::LeaseList = self.answer(answer, "lease list")?;
            for view in list.leases {
                // Only what was asked: an older host that ignored the parameters lists all.
                let asked = view
                    .labels
                    .get(key)
                    .filter(|v| chunk.contains(&v.as_str()))
                    .cloned();
                if let Some(value) = asked {
                    found.insert(value, Self::lease(view));
                }
            }
        }
        Ok(found)
    }

    /// Reserves a slot tagged with `labels`, failing by itself `deadline` after the
    /// reservation unless released first.
    pub async fn reserve(
        &self,
        labels: &BTreeMap<String, String>,
        deadline: Option<Duration>,
    ) -> Result<LeaseInfo, ApiError> {
        self.reserve_for(labels, deadline, None).await
    }

    /// [`Self::reserve`] for `tenant`: the host gives the lease only an instance no other
    /// tenant used.
    pub async fn reserve_for(
        &self,
        labels: &BTreeMap<String, String>,
        deadline: Option<Duration>,
        tenant: Option<&str>,
    ) -> Result<LeaseInfo, ApiError> {
        let answer = self
            .call(
                http::Method::POST,
                &self.leases_path(),
                wire(&flotilla_api::ReserveRequest {
                    labels: labels.clone(),
                    deadline_seconds: deadline.map(|d| {
                        d.as_secs()
                            .clamp(1, flotilla_api::ReserveRequest::MAX_DEADLINE_SECONDS)
                    }),
                    tenant: tenant.map(str::to_string),
                }),
                self.timeout,
            )
            .await?;
        let reserved: flotilla_api::LeaseAnswer = self.answer(answer, "reservation")?;
        Ok(Self::lease(reserved.lease))
    }

    /// The pool's job slots at most: `max_instances × capacity_per_instance`, as the host
    /// knows them now (a group's own maximum may lower `max_instances`).
    pub async fn pool_slots(&self) -> Result<u32, ApiError> {
        let answer = self
            .call(http::Method::GET, "/v1/pools", None, Duration::from_secs(5))
            .await?;
        let mut answer: flotilla_api::status::PoolsAnswer = self.answer(answer, "pools")?;
        let running = answer
            .pools
            .remove(&self.pool)
            .and_then(|p| p.status.scaler);
        match running {
            Some(scaler) => Ok(scaler.max_slots()),
            None => Err(self.unreachable(format!(
                "pool {} is not running there (or this flotilla is too old to say its capacity)",
                self.pool
            ))),
        }
    }

    /// Binds the lease to a ready instance, waiting up to `limit`; the instance.
    pub async fn acquire(&self, id: u64, limit: Duration) -> Result<Acquired, ApiError> {
        let path = format!("{}/{id}/acquire", self.leases_path());
        let answer = self.call(http::Method::POST, &path, None, limit).await?;
        let answer: flotilla_api::AcquireAnswer = self.answer(answer, "acquire")?;
        let os = answer
            .connection
            .as_ref()
            .and_then(|c| c.get("os"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Acquired {
            instance: answer.instance,
            slot: answer.slot,
            os,
        })
    }

    /// Releases the lease; with `broken`, the instance is failed and replaced.
    pub async fn release(&self, id: u64, broken: Option<&str>) -> Result<(), ApiError> {
        let path = format!("{}/{id}/release", self.leases_path());
        let body = broken.and_then(|cause| {
            wire(&flotilla_api::ReleaseRequest {
                instance_broken: Some(cause.to_string()),
            })
        });
        self.call(http::Method::POST, &path, body, self.timeout)
            .await
            .map(|_| ())
    }

    /// Drops a reservation that was never acquired.
    pub async fn unreserve(&self, id: u64) -> Result<(), ApiError> {
        let path = format!("{}/{id}", self.leases_path());
        self.call(http::Method::DELETE, &path, None, self.timeout)
            .await
            .map(|_| ())
    }

    /// Reports on the job for the host's metrics (best effort: a failure is only logged).
    pub async fn report(&self, id: u64, body: flotilla_api::ReportRequest) {
        let path = format!("{}/{id}/report", self.leases_path());
        if let Err(e) = self
            .call(http::Method::POST, &path, wire(&body), self.timeout)
            .await
        {
            tracing::warn!("cannot report to flotilla: {e}");
        }
    }

    /// The path under which the host serves the lease's Docker Engine API.
    pub fn docker_path(&self, lease: u64) -> String {
        format!("{}/{lease}/docker", self.leases_path())
    }
}

/// A request body as JSON: the API's own types, which always serialize.
fn wire<T: serde::Serialize>(body: &T) -> Option<Value> {
    serde_json::to_value(body).ok()
}

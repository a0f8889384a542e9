//! The outbound HTTP policy: the single place where a plugin's requests leave the sandbox.
//!
//! The runtime links its own `wasi:http/outgoing-handler.handle` (`outgoing.rs`), and it
//! starts every guest request through [`EgressHooks::start`]. wasmtime-wasi-http's own path,
//! [`EgressHooks::send_request`], refuses every request. Guests have no sockets and no name
//! lookups: the host resolves each name itself and checks every address.
//!
//! A request is denied with `HTTP-request-denied` when it breaks the pool's allow-list
//! (scheme, host and port), the cap per export call, the pool's request budget (per minute and
//! in flight) or the address check; when the credential it names is unknown, is not bound to
//! the host, or comes with a method other than GET, HEAD, POST, PUT, PATCH or DELETE; or when
//! the credential cannot be applied. Each denial is counted and logged with the pool, the
//! plugin, the method, the target (without its query) and the reason. When the identity
//! provider refuses a credential, the plugin gets a 401 answer instead, and the request never
//! leaves.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::uri::Scheme;
use http_body_util::{BodyExt, Full};
use ipnet::IpNet;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use flotilla_credentials::{
    AWS_REGION_HEADER, AWS_SERVICE_HEADER, CREDENTIAL_HEADER, Credential, CredentialError,
    RefusalSign, SigningHints,
};
use flotilla_net::{AllowList, blocked_reason};

mod budget;
mod client;
mod outgoing;
mod scrub;

pub use budget::Budget;
pub(crate) use budget::CallScope;
pub use client::ConnectionPool;
use client::{Timeouts, TlsCell, collect_limited, send_pinned, tls_config};
pub(crate) use outgoing::add_to_linker;

/// Egress settings of one pool.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    /// Where the plugin may send requests.
    pub allow: AllowList,
    /// Address ranges that are normally refused (loopback, private, link-local...) but that
    /// this pool explicitly allows, e.g. `127.0.0.0/8` for a local emulator.
    pub allowed_ip_ranges: Vec<IpNet>,
    /// Fixed name resolution (like curl's `--resolve`), checked like any other answer.
    pub resolve_overrides: BTreeMap<String, Vec<IpAddr>>,
    /// Upper bound for the connect timeout a plugin may ask for.
    pub max_connect_timeout: Duration,
    /// Upper bound for the time to the first response byte.
    pub max_first_byte_timeout: Duration,
    /// Upper bound for the time between response body chunks.
    pub max_between_bytes_timeout: Duration,
    /// Response body bytes a plugin may read per request.
    pub max_response_bytes: u64,
    /// Request body bytes buffered for signing.
    pub max_signed_body_bytes: usize,
    /// Outgoing requests per export call.
    pub max_requests_per_call: u32,
    /// Named credentials the plugin may ask the host to apply.
    pub credentials: Vec<Credential>,
    /// Extra CA certificates (DER) trusted for HTTPS, on top of the Web PKI roots; for
    /// private endpoints and emulators.
    pub extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// A settings check (`config check`, and `run` before it starts): every request is
    /// expected to be refused, so refusals are logged at debug, not as warnings.
    pub quiet_denials: bool,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy {
            allow: AllowList::default(),
            allowed_ip_ranges: Vec::new(),
            resolve_overrides: BTreeMap::new(),
            max_connect_timeout: Duration::from_secs(10),
            max_first_byte_timeout: Duration::from_secs(30),
            max_between_bytes_timeout: Duration::from_secs(30),
            max_response_bytes: 16 << 20,
            max_signed_body_bytes: 8 << 20,
            max_requests_per_call: 100,
            credentials: Vec::new(),
            extra_roots: Vec::new(),
            quiet_denials: false,
        }
    }
}

fn clamp(asked: Option<Duration>, max: Duration) -> Duration {
    asked.map_or(max, |a| a.min(max))
}

impl EgressPolicy {
    /// Whether a resolved address may be contacted; `Err` says why not.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), BlockedAddress> {
        match blocked_reason(ip) {
            Some(class) if !self.allowed_ip_ranges.iter().any(|r| r.contains(&ip)) => {
                Err(BlockedAddress { ip, class })
            }
            _ => Ok(()),
        }
    }

    fn credential(&self, name: &str) -> Option<&Credential> {
        self.credentials.iter().find(|c| c.name == name)
    }

    async fn resolve(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<Vec<SocketAddr>, String> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        if let Some(ips) = self.resolve_overrides.get(host) {
            return Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        }
        match tokio::time::timeout(timeout, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(addrs)) => Ok(addrs.collect()),
            Ok(Err(e)) => Err(format!("cannot resolve {host}: {e}")),
            Err(_) => Err(format!("resolving {host} timed out")),
        }
    }
}

/// A resolved address in a class the pool does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resolves to {ip}, a {class} address the pool does not allow")]
pub struct BlockedAddress {
    /// The address.
    pub ip: IpAddr,
    /// Its class (loopback, private, link-local...).
    pub class: &'static str,
}

/// Counts of what the policy did, for metrics.
#[derive(Debug, Default)]
pub struct EgressStats {
    /// Requests let through.
    pub allowed: AtomicU64,
    /// Requests denied.
    pub denied: AtomicU64,
    /// Requests sent once more after the cloud refused the cached token they carried.
    pub remints: AtomicU64,
    /// The last denial: `METHOD target: reason`, for tools that explain a failed call.
    pub last_denial: parking_lot::Mutex<Option<String>>,
}

/// What all instances of one pool's plugin share: the policy, counters and connections.
#[derive(Debug, Clone, Default)]
pub(crate) struct EgressShared {
    pub policy: Arc<EgressPolicy>,
    pub stats: Arc<EgressStats>,
    pub connections: Arc<ConnectionPool>,
    pub tls: Arc<TlsCell>,
    pub budget: Arc<Budget>,
}

/// The wasi-http hooks of one plugin instance.
pub(crate) struct EgressHooks {
    pub policy: Arc<EgressPolicy>,
    pub stats: Arc<EgressStats>,
    pub origin: crate::output::Origin,
    /// Requests made in the current export call (reset before each call).
    pub requests_this_call: u32,
    /// Keep-alive connections shared by the pool's instances.
    pub connections: Arc<ConnectionPool>,
    /// The pool's TLS client configuration.
    pub tls: Arc<TlsCell>,
    /// The pool's request budget.
    pub budget: Arc<Budget>,
    /// The requests of the current export call.
    pub scope: CallScope,
}

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;
type SendFuture =
    Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>;

/// Logs and counts a denial; the guest sees `HTTP-request-denied`.
fn deny(
    origin: &crate::output::Origin,
    stats: &EgressStats,
    request: &http::Request<WasiBody>,
    reason: &str,
    quiet: bool,
) -> HttpError {
    stats.denied.fetch_add(1, Ordering::Relaxed);
    *stats.last_denial.lock() = Some(format!(
        "{} {}: {reason}",
        request.method(),
        redact_query(request.uri())
    ));
    if quiet {
        tracing::debug!(target: "flotilla::egress", pool = %origin.pool, plugin = %origin.plugin, method = %request.method(), target_uri = %redact_query(request.uri()), reason = %reason, "denied plugin request (settings check)");
    } else {
        tracing::warn!(
            target: "flotilla::egress",
            pool = %origin.pool,
            plugin = %origin.plugin,
            method = %request.method(),
            target_uri = %redact_query(request.uri()),
            reason = %reason,
            "denied plugin request"
        );
    }
    HttpError::HttpRequestDenied
}

fn header_text(
    request: &mut http::Request<WasiBody>,
    name: &str,
) -> Result<Option<String>, String> {
    match request.headers_mut().remove(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim().to_string()))
            .map_err(|_| format!("{name} header is not valid text")),
    }
}

impl WasiHttpHooks for EgressHooks {
    fn default_scheme(&mut self) -> Option<Scheme> {
        None
    }

    /// Only wasmtime-wasi-http's own `outgoing-handler.handle` calls this, and the runtime
    /// links its own `handle` in that one's place (`outgoing.rs`). Refusing here makes a
    /// linker where that did not take fail every request, loudly, instead of quietly spawning
    /// two tasks a request.
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _: Option<RequestOptions>,
        _: IoFuture,
    ) -> SendFuture {
        let e = deny(
            &self.origin,
            &self.stats,
            &request,
            "sent through wasmtime-wasi-http's handler, not the host's",
            self.policy.quiet_denials,
        );
        Box::new(async move { Err(e) })
    }
}

impl EgressHooks {
    /// Starts one request of the guest's through the policy: the checks that need no I/O now,
    /// then resolution, the address check, signing and the send in the returned future, under
    /// the call's scope.
    pub(crate) fn start(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> outgoing::Sending {
        let admitted = self
            .admit(&mut request)
            .and_then(|checked| Ok((checked, self.budget.admit()?)));
        let ((credential, hints), permit) = match admitted {
            Ok(admitted) => admitted,
            Err(reason) => {
                let e = deny(
                    &self.origin,
                    &self.stats,
                    &request,
                    &reason,
                    self.policy.quiet_denials,
                );
                return Box::pin(async move { Err(e) });
            }
        };
        let scoped = self.scope.admit(permit);
        let asked = options.unwrap_or_default();
        let policy = self.policy.clone();
        let timeouts = Timeouts {
            connect: clamp(asked.connect_timeout, policy.max_connect_timeout),
            first_byte: clamp(asked.first_byte_timeout, policy.max_first_byte_timeout),
            between_bytes: clamp(
                asked.between_bytes_timeout,
                policy.max_between_bytes_timeout,
            ),
        };
        let forward = Forward {
            policy,
            origin: self.origin.clone(),
            stats: self.stats.clone(),
            connections: self.connections.clone(),
            tls: self.tls.clone(),
            timeouts,
        };
        Box::pin(scoped.send(forward.send(request, credential, hints)))
    }
}

/// The methods cloud APIs are called with. A credential is never applied to another: TRACE
/// reflects the request whole, CONNECT tunnels past the host's view, and no cloud API needs
/// OPTIONS or an extension method.
const CREDENTIAL_METHODS: [http::Method; 6] = [
    http::Method::GET,
    http::Method::HEAD,
    http::Method::POST,
    http::Method::PUT,
    http::Method::PATCH,
    http::Method::DELETE,
];

impl EgressHooks {
    /// The checks that need no I/O: the per-call cap, the allow-list, and the credential the
    /// request names (which must exist and be bound to the target). Removes the host-only
    /// headers. `Err` is the denial reason.
    fn admit(
        &mut self,
        request: &mut http::Request<WasiBody>,
    ) -> Result<(Option<Credential>, SigningHints), String> {
        self.requests_this_call = self.requests_this_call.saturating_add(1);
        if self.requests_this_call > self.policy.max_requests_per_call {
            return Err(format!(
                "more than {} requests in one call",
                self.policy.max_requests_per_call
            ));
        }
        self.policy
            .allow
            .check(request.uri())
            .map_err(|e| e.to_string())?;
        let credential = match header_text(request, CREDENTIAL_HEADER)? {
            None => None,
            Some(name) => {
                let c = self
                    .policy
                    .credential(&name)
                    .ok_or_else(|| format!("unknown credential {name:?}"))?;
                c.hosts
                    .check(request.uri())
                    .map_err(|_| format!("credential {name:?} is not bound to this host"))?;
                if !CREDENTIAL_METHODS.contains(request.method()) {
                    return Err(format!(
                        "credential {name:?} is applied only to {}, not to {}",
                        CREDENTIAL_METHODS
                            .iter()
                            .map(http::Method::as_str)
                            .collect::<Vec<_>>()
                            .join(", "),
                        request.method()
                    ));
                }
                Some(c.clone())
            }
        };
        let hints = SigningHints {
            service: header_text(request, AWS_SERVICE_HEADER)?,
            region: header_text(request, AWS_REGION_HEADER)?,
        };
        Ok((credential, hints))
    }
}

/// What one admitted request needs after the hook returns: resolution, the address check,
/// signing, and the send.
struct Forward {
    policy: Arc<EgressPolicy>,
    origin: crate::output::Origin,
    stats: Arc<EgressStats>,
    connections: Arc<ConnectionPool>,
    tls: Arc<TlsCell>,
    timeouts: Timeouts,
}

impl Forward {
    async fn send(
        self,
        mut request: http::Request<WasiBody>,
        credential: Option<Credential>,
        hints: SigningHints,
    ) -> Result<http::Response<WasiBody>, HttpError> {
        let host = request
            .uri()
            .host()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        let https = request.uri().scheme() == Some(&Scheme::HTTPS);
        let port = request
            .uri()
            .port_u16()
            .unwrap_or(if https { 443 } else { 80 });
        let addrs = match self.resolve_checked(&host, port).await {
            Ok(addrs) => addrs,
            Err(Refused::Http(e)) => return Err(e),
            Err(Refused::Address(reason)) => {
                return Err(deny(
                    &self.origin,
                    &self.stats,
                    &request,
                    &reason,
                    self.policy.quiet_denials,
                ));
            }
        };
        let Some(credential) = credential else {
            return self.dispatch(request, &host, &addrs, https).await;
        };
        let bytes = collect_limited(request.body_mut(), self.policy.max_signed_body_bytes).await?;
        let head = (
            request.method().clone(),
            request.uri().clone(),
            request.headers().clone(),
        );
        if let Some(refused) = self
            .authorise(&mut request, &credential, &bytes, &hints, &host)
            .await?
        {
            return Ok(refused);
        }
        let sent = request.headers().get(http::header::AUTHORIZATION).cloned();
        let response = self.dispatch(request, &host, &addrs, https).await?;
        let (response, refused) = refused_by_cloud(&credential, response, &self.policy).await?;
        // The cloud refused the cached token before its expiry: mint anew and send once more.
        // A second refusal goes to the plugin as it came (the pool's call is `unauthorized`).
        if !refused || !sent.is_some_and(|s| credential.forget(&s)) {
            return Ok(response);
        }
        tracing::info!(target: "flotilla::egress", pool = %self.origin.pool, host = %host, credential = %credential.name, status = response.status().as_u16(), "the cloud refused the cached token; minted anew and sent once more");
        let (method, uri, headers) = head;
        let mut again = http::Request::new(whole(bytes.clone()));
        *again.method_mut() = method;
        *again.uri_mut() = uri;
        *again.headers_mut() = headers;
        if let Some(refused) = self
            .authorise(&mut again, &credential, &bytes, &hints, &host)
            .await?
        {
            return Ok(refused);
        }
        self.stats.remints.fetch_add(1, Ordering::Relaxed);
        self.dispatch(again, &host, &addrs, https).await
    }

    /// Applies `credential` to `request` over its buffered `bytes`. `Ok(Some(answer))` when
    /// the identity provider refused the credential: the plugin gets a 401, as from the
    /// cloud, so it reports `unauthorized` and the scaler pauses the call until the operator
    /// fixes it; the request never leaves.
    async fn authorise(
        &self,
        request: &mut http::Request<WasiBody>,
        credential: &Credential,
        bytes: &bytes::Bytes,
        hints: &SigningHints,
        host: &str,
    ) -> Result<Option<http::Response<WasiBody>>, HttpError> {
        match credential.apply(request, bytes, hints).await {
            Ok(()) => {}
            Err(e @ CredentialError::Refused { .. }) => {
                tracing::warn!(target: "flotilla::egress", pool = %self.origin.pool, host = %host, "{e}; the plugin gets 401");
                return Ok(Some(refused_response(&e)));
            }
            Err(e) => {
                return Err(deny(
                    &self.origin,
                    &self.stats,
                    request,
                    &e.to_string(),
                    self.policy.quiet_denials,
                ));
            }
        }
        *request.body_mut() = whole(bytes.clone());
        Ok(None)
    }

    /// Sends a request as it is, and masks any secret of it that the answer reflects.
    async fn dispatch(
        &self,
        request: http::Request<WasiBody>,
        host: &str,
        addrs: &[SocketAddr],
        https: bool,
    ) -> Result<http::Response<WasiBody>, HttpError> {
        let secrets = scrub::Secrets::of_request(&request);
        self.stats.allowed.fetch_add(1, Ordering::Relaxed);
        let response = send_pinned(
            request,
            host,
            addrs,
            self.timeouts,
            self.policy.max_response_bytes,
            &self.connections,
            https
                .then(|| tls_config(&self.policy, &self.tls))
                .transpose()?,
        )
        .await?;
        let Some(secrets) = secrets else {
            return Ok(response);
        };
        let (mut parts, body) = response.into_parts();
        let masked = secrets.mask_headers(&mut parts.headers);
        if masked > 0 {
            tracing::warn!(target: "flotilla::egress", pool = %self.origin.pool, host = %host, masked, "the response reflected a credential's secret in its headers; masked before the plugin saw it");
        }
        Ok(http::Response::from_parts(parts, secrets.body(body)))
    }

    /// Resolves the name (by the host, never the guest) and checks every answer, so a name
    /// cannot smuggle in a forbidden address; the connection goes to these addresses only.
    async fn resolve_checked(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refused> {
        let addrs = match self.policy.resolve(host, port, self.timeouts.connect).await {
            Ok(a) if !a.is_empty() => a,
            Ok(_) => {
                return Err(Refused::Http(HttpError::DnsError {
                    rcode: Some("no addresses".into()),
                    info_code: None,
                }));
            }
            Err(e) => {
                tracing::info!(target: "flotilla::egress", pool = %self.origin.pool, "{e}");
                return Err(Refused::Http(HttpError::DnsError {
                    rcode: Some("lookup failed".into()),
                    info_code: None,
                }));
            }
        };
        for addr in &addrs {
            if let Err(reason) = self.policy.check_ip(addr.ip()) {
                return Err(Refused::Address(format!("{host} {reason}")));
            }
        }
        Ok(addrs)
    }
}

/// The answer to a request whose credential its identity provider refused: 401 with the
/// refusal as text (it carries no secret), and `WWW-Authenticate` naming the host as its source.
fn refused_response(e: &CredentialError) -> http::Response<WasiBody> {
    let body = whole(format!("flotilla: {e}\n"));
    let mut response = http::Response::new(body);
    *response.status_mut() = http::StatusCode::UNAUTHORIZED;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Flotilla error=\"credential_refused\""),
    );
    response
}

/// Whether the cloud's answer refused the cached token or keys its request carried (see
/// [`flotilla_credentials::RefusalSign`]). An answer judged by its body comes back with the
/// body read (it is an error answer, capped like any other).
async fn refused_by_cloud(
    credential: &Credential,
    response: http::Response<WasiBody>,
    policy: &EgressPolicy,
) -> Result<(http::Response<WasiBody>, bool), HttpError> {
    match credential.refusal_sign(response.status().as_u16()) {
        RefusalSign::None => Ok((response, false)),
        RefusalSign::Status => Ok((response, true)),
        RefusalSign::Body(codes) => {
            let (parts, mut body) = response.into_parts();
            let limit = usize::try_from(policy.max_response_bytes).unwrap_or(usize::MAX);
            let bytes = collect_limited(&mut body, limit).await?;
            let text = String::from_utf8_lossy(&bytes);
            let refused = codes.iter().any(|code| {
                text.contains(&format!("<Code>{code}</Code>"))
                    || text.contains(&format!("\"{code}\""))
                    || text.contains(&format!("#{code}\""))
            });
            let body = whole(bytes);
            Ok((http::Response::from_parts(parts, body), refused))
        }
    }
}

/// A body that is all there: `bytes`.
fn whole(bytes: impl Into<bytes::Bytes>) -> WasiBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Why a name did not yield addresses to connect to.
enum Refused {
    /// Resolution failed (the guest sees a DNS error).
    Http(HttpError),
    /// An answer is in a class the pool does not allow (the guest sees a denial).
    Address(String),
}

/// The URI without its query, which may carry tokens.
fn redact_query(uri: &http::Uri) -> String {
    let mut s = String::new();
    if let Some(scheme) = uri.scheme_str() {
        s.push_str(scheme);
        s.push_str("://");
    }
    if let Some(a) = uri.authority() {
        s.push_str(a.host());
        if let Some(p) = a.port_u16() {
            s.push_str(&format!(":{p}"));
        }
    }
    s.push_str(uri.path());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_credentials::{AwsChainHandle, CredentialKind};

    fn answer(status: u16, body: &'static str) -> http::Response<WasiBody> {
        let mut r = http::Response::new(whole(body));
        *r.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
        r
    }

    /// AWS's expired-session answers (XML for the Query APIs, JSON for the others) are
    /// refusals of the cached keys; any other error is passed on, its body intact.
    #[tokio::test]
    async fn an_aws_expired_token_answer_is_told_from_other_errors_by_its_code() {
        let aws = Credential {
            name: "aws".into(),
            kind: CredentialKind::Aws(AwsChainHandle::default()),
            hosts: AllowList::default(),
        };
        let policy = EgressPolicy::default();
        let xml = "<ErrorResponse><Error><Type>Sender</Type><Code>ExpiredToken</Code><Message>The security token included in the request is expired</Message></Error></ErrorResponse>";
        let json =
            r#"{"__type":"com.amazon.coral.service#ExpiredTokenException","message":"expired"}"#;
        let other = "<ErrorResponse><Error><Code>ValidationError</Code><Message>ExpiredTokens are fine</Message></Error></ErrorResponse>";
        for (status, body, refused) in [
            (400, xml, true),
            (403, json, true),
            (400, other, false),
            (200, xml, false),
        ] {
            let (response, judged) = refused_by_cloud(&aws, answer(status, body), &policy)
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(judged, refused, "{status} {body}");
            let kept = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            assert_eq!(kept, body.as_bytes(), "the plugin still reads the answer");
        }
    }
}

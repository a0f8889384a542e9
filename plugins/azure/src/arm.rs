//! Azure Resource Manager over wasi:http: one request, its classified error, `nextLink`
//! pagination and long-running-operation polling. Every request names the pool credential;
//! the host adds `Authorization: Bearer`, so this code never sees a token.
//!
//! Must not know: scale sets, instances or the contract; `lib.rs` and `vmss.rs` do.

use std::time::{Duration, Instant};

use flotilla_guest_http::{Method, Request};
use serde_json::Value;

use crate::flotilla::provider::types::{Error, Throttle};

/// Longest message built from a cloud answer, in characters.
const MAX_MESSAGE: usize = 300;
/// Longest wait between two polls of an operation, whatever its `Retry-After` says.
const MAX_POLL_DELAY: Duration = Duration::from_secs(2);
/// Shortest wait between two polls (an operation that says `Retry-After: 0`).
const MIN_POLL_DELAY: Duration = Duration::from_millis(50);
/// Wait between two polls of an operation that sends no `Retry-After`.
const DEFAULT_POLL_DELAY: Duration = Duration::from_secs(1);
/// Longest `Retry-After` of a 429 passed on to the host.
const MAX_RETRY_AFTER: u32 = 3600;
/// Most pages one list may have; a loop of `nextLink`s fails instead of running forever.
const MAX_PAGES: usize = 1000;

/// Where requests go, and as whom.
#[derive(Debug, Clone)]
pub struct Arm {
    /// `https://management.azure.com`, without a trailing slash.
    pub endpoint: String,
    /// The pool credential the host authorises requests with.
    pub credential: String,
}

/// One answer: status, the headers this code reads, and the body.
pub struct Reply {
    pub status: u16,
    retry_after: Option<u32>,
    async_operation: Option<String>,
    location: Option<String>,
    pub body: String,
}

impl Reply {
    fn json(&self, action: &str) -> Result<Value, Error> {
        serde_json::from_str(&self.body)
            .map_err(|e| Error::Other(cap(format!("{action}: unparseable answer: {e}"))))
    }
}

/// How a long-running operation ended within the wait budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded.
    Done,
    /// It is still running in the cloud; `update` will show where it got to.
    Running,
}

/// `text` cut to [`MAX_MESSAGE`] characters.
pub fn cap(text: String) -> String {
    if text.chars().count() <= MAX_MESSAGE {
        return text;
    }
    let mut out: String = text.chars().take(MAX_MESSAGE).collect();
    out.push('…');
    out
}

/// Percent-encodes one query value (RFC 3986 unreserved characters stay).
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Scheme, host (lowercased) and port (the scheme's default when absent) of `url`, and what
/// follows the authority; `None` when it is not an `http(s)` URL with a plain host.
fn origin(url: &str) -> Option<((String, String, u16), &str)> {
    let (scheme, after) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    if authority.contains('@') || authority.is_empty() {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal's colons are inside its brackets.
        Some((host, port)) if !port.contains(']') => (host, port.parse::<u16>().ok()?),
        _ => (authority, default),
    };
    Some(((scheme, host.to_ascii_lowercase(), port), rest))
}

/// `text` with every byte a URI may not hold raw percent-encoded (spaces, quotes, `<>\^`{|}`,
/// controls, non-ASCII); what is already encoded, and the URI's own delimiters, stay.
fn encode_raw(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        let allowed = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b':'
                    | b'/'
                    | b'?'
                    | b'#'
                    | b'['
                    | b']'
                    | b'@'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b'%'
            );
        if allowed {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An ARM error (`{"error": {"code", "message"}}`), classified by status and code.
/// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/common-deployment-errors>
/// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/request-limits-and-throttling>
pub fn classify(action: &str, status: u16, retry_after: Option<u32>, body: &str) -> Error {
    let parsed: Value = serde_json::from_str(body).unwrap_or_default();
    let error = parsed.get("error").unwrap_or(&parsed);
    let code = error.get("code").and_then(Value::as_str).unwrap_or("");
    let message = match error.get("message").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        None => body.chars().take(MAX_MESSAGE).collect(),
    };
    classify_code(action, status, retry_after, code, &message)
}

fn classify_code(
    action: &str,
    status: u16,
    retry_after: Option<u32>,
    code: &str,
    message: &str,
) -> Error {
    let what = cap(format!("{action}: {code} (HTTP {status}): {message}"));
    // Compute answers a throttled request with 429 and the code OperationNotAllowed: the
    // status decides before the code does.
    if status == 429 {
        return Error::Throttled(Throttle {
            retry_after_seconds: retry_after.unwrap_or(0).min(MAX_RETRY_AFTER),
            message: what,
        });
    }
    match code {
        "AuthorizationFailed"
        | "LinkedAuthorizationFailed"
        | "InvalidAuthenticationToken"
        | "InvalidAuthenticationTokenTenant"
        | "AuthenticationFailed" => Error::Unauthorized(what),
        // The host refreshes tokens well before they expire; one that expired on the way is
        // replaced by the next request's.
        "ExpiredAuthenticationToken" => Error::Transient(what),
        // Compute also says OperationNotAllowed for a state conflict ("... is not allowed since
        // the Virtual Machine Scale Set is being deleted"); only its quota message is a quota.
        // <https://learn.microsoft.com/en-us/troubleshoot/azure/virtual-machines/windows/error-messages>
        "OperationNotAllowed" if !mentions_quota(message) => Error::Transient(what),
        "QuotaExceeded"
        | "OperationNotAllowed"
        | "AllocationFailed"
        | "ZonalAllocationFailed"
        | "OverconstrainedAllocationRequest"
        | "SkuNotAvailable" => Error::QuotaExceeded(what),
        "ResourceNotFound" | "NotFound" | "ResourceGroupNotFound" | "ParentResourceNotFound" => {
            Error::NotFound(what)
        }
        _ if status == 404 => Error::NotFound(what),
        _ if status >= 500 => Error::Transient(what),
        _ if status == 401 || status == 403 => Error::Unauthorized(what),
        _ => Error::Other(what),
    }
}

/// Whether an `OperationNotAllowed` message is about quota ("Operation could not be completed
/// as it results in exceeding approved standardDSv3Family Cores quota").
fn mentions_quota(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("quota") || lower.contains("exceeding approved")
}

/// ARM's remaining-request counts (`x-ms-ratelimit-remaining-resource:
/// Microsoft.Compute/HighCostGet3Min;107,Microsoft.Compute/HighCostGet30Min;1007`, and
/// `x-ms-ratelimit-remaining-subscription-reads: 11999`): the windows close to empty.
/// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/request-limits-and-throttling>
/// <https://learn.microsoft.com/en-us/troubleshoot/azure/virtual-machines/windows/troubleshooting-throttling-errors>
fn low_windows(resource: Option<&str>, reads: Option<&str>, writes: Option<&str>) -> Vec<String> {
    let mut low = Vec::new();
    for entry in resource.unwrap_or_default().split(',') {
        if let Some((policy, left)) = entry.trim().rsplit_once(';')
            && let Ok(left) = left.trim().parse::<u32>()
            && left < LOW_REMAINING
        {
            low.push(format!("{policy}: {left} left"));
        }
    }
    for (name, value) in [
        ("subscription reads", reads),
        ("subscription writes", writes),
    ] {
        if let Some(left) = value.and_then(|v| v.trim().parse::<u32>().ok())
            && left < LOW_REMAINING
        {
            low.push(format!("{name}: {left} left"));
        }
    }
    low
}

/// Fewer remaining requests than this in a throttling window is reported.
const LOW_REMAINING: u32 = 10;

impl Arm {
    /// `endpoint` + `path` + `?api-version=…` + the query pairs (values encoded here).
    pub fn url(&self, path: &str, api_version: &str, query: &[(&str, &str)]) -> String {
        let mut url = format!("{}{path}?api-version={api_version}", self.endpoint);
        for (k, v) in query {
            url.push('&');
            url.push_str(k);
            url.push('=');
            url.push_str(&encode(v));
        }
        url
    }

    /// A URL the cloud handed back (`nextLink`, `Azure-AsyncOperation`, `Location`), to follow:
    /// only on the configured endpoint (scheme, host and port compared as parsed, the scheme's
    /// default port implied), so the credential never travels elsewhere; spelled as the
    /// endpoint is (ARM writes `https://management.azure.com:443/...`: azure-sdk-for-go
    /// #21296, azure-sdk-for-java #36506), and with the characters a URI may not hold raw
    /// (the filtered VM list has returned spaces and quotes: azure-rest-api-specs #25640)
    /// percent-encoded.
    fn own(&self, action: &str, url: &str) -> Result<String, Error> {
        let outside = || {
            Error::Other(cap(format!(
                "{action}: the answer points at {url}, outside {}",
                self.endpoint
            )))
        };
        let (theirs, rest) = origin(url).ok_or_else(outside)?;
        let (ours, _) = origin(&self.endpoint).ok_or_else(outside)?;
        if theirs != ours || !(rest.is_empty() || rest.starts_with('/') || rest.starts_with('?')) {
            return Err(outside());
        }
        Ok(format!("{}{}", self.endpoint, encode_raw(rest)))
    }

    /// GETs one resource: its JSON.
    pub fn get(&self, action: &str, url: &str) -> Result<Value, Error> {
        let reply = self.send(action, Method::Get, url, None)?;
        if reply.status != 200 {
            return Err(classify(
                action,
                reply.status,
                reply.retry_after,
                &reply.body,
            ));
        }
        reply.json(action)
    }

    /// GETs a list, following every `nextLink`: all the `value` entries, or an error (never a
    /// partial list).
    pub fn list(&self, action: &str, url: &str) -> Result<Vec<Value>, Error> {
        let mut out = Vec::new();
        let mut next = Some(url.to_string());
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(Error::Other(format!(
                    "{action}: more than {MAX_PAGES} pages"
                )));
            }
            // A link the cloud wrote that the client still cannot send is the cloud's fault,
            // not the operator's: never `invalid-config`, which would pause the pool.
            let mut page = match self.get(action, &url) {
                Err(Error::InvalidConfig(why)) if pages > 1 => return Err(Error::Other(why)),
                other => other?,
            };
            if let Some(Value::Array(items)) = page.get_mut("value").map(Value::take) {
                out.extend(items);
            }
            if let Some(link) = page.get("nextLink").and_then(Value::as_str)
                && !link.is_empty()
            {
                next = Some(self.own(action, link)?);
            }
        }
        Ok(out)
    }

    /// Starts a change (PATCH, POST) and follows it for at most `budget`.
    pub fn change(
        &self,
        action: &str,
        method: Method,
        url: &str,
        body: &Value,
        budget: Duration,
    ) -> Result<Outcome, Error> {
        let reply = self.send(action, method, url, Some(body))?;
        if !matches!(reply.status, 200 | 201 | 202 | 204) {
            return Err(classify(
                action,
                reply.status,
                reply.retry_after,
                &reply.body,
            ));
        }
        // ARM accepted the change. A poll that loses its answer (a reset, a 5xx) says nothing
        // of the change: it runs on, and `update` shows where it got to.
        match self.follow(action, &reply, budget) {
            Err(Error::Transient(e)) => {
                crate::flotilla::provider::log::emit(
                    crate::flotilla::provider::log::Level::Warn,
                    &format!("{action}: accepted; its operation could not be read: {e}"),
                );
                Ok(Outcome::Running)
            }
            other => other,
        }
    }

    /// Follows a long-running operation: `Azure-AsyncOperation` first (its status body),
    /// else `Location` (202 while running), else the first answer was final.
    /// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/async-operations>
    fn follow(&self, action: &str, first: &Reply, budget: Duration) -> Result<Outcome, Error> {
        let start = Instant::now();
        let (url, by_status_body) = match (&first.async_operation, &first.location) {
            (Some(url), _) => (url.clone(), true),
            (None, Some(url)) if first.status == 202 => (url.clone(), false),
            _ => return Ok(Outcome::Done),
        };
        let url = self.own(action, &url)?;
        let mut retry_after = first.retry_after;
        loop {
            let delay = retry_after.map_or(DEFAULT_POLL_DELAY, |s| {
                Duration::from_secs(u64::from(s)).clamp(MIN_POLL_DELAY, MAX_POLL_DELAY)
            });
            if start.elapsed() + delay > budget {
                return Ok(Outcome::Running);
            }
            flotilla_guest_http::sleep(delay);
            let reply = self.send(action, Method::Get, &url, None)?;
            retry_after = reply.retry_after;
            if by_status_body {
                if reply.status != 200 {
                    return Err(classify(
                        action,
                        reply.status,
                        reply.retry_after,
                        &reply.body,
                    ));
                }
                if let Some(done) = operation_status(action, &reply.json(action)?)? {
                    return Ok(done);
                }
            } else {
                match reply.status {
                    202 => {}
                    200 | 201 | 204 => return Ok(Outcome::Done),
                    s => return Err(classify(action, s, reply.retry_after, &reply.body)),
                }
            }
        }
    }

    /// Sends one request; transport failures are transient.
    pub fn send(
        &self,
        action: &str,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Reply, Error> {
        let body = body.map(Value::to_string);
        let json = [
            ("accept", "application/json"),
            ("flotilla-credential", self.credential.as_str()),
            ("content-type", "application/json"),
        ];
        let request = Request {
            method,
            url,
            // The content type only with a body.
            headers: if body.is_some() { &json } else { &json[..2] },
            body: body.as_deref().map(str::as_bytes),
        };
        let response = match flotilla_guest_http::send(&request) {
            Ok(response) => response,
            Err(flotilla_guest_http::Error::Invalid(e)) => {
                return Err(Error::InvalidConfig(cap(format!("{action}: {e}"))));
            }
            Err(e) => return Err(Error::Transient(cap(format!("{action}: {e}")))),
        };
        let header = |name: &str| response.header(name).map(str::to_string);
        let retry_after = header("retry-after").and_then(|v| v.trim().parse::<u32>().ok());
        let low = low_windows(
            response.header("x-ms-ratelimit-remaining-resource"),
            response.header("x-ms-ratelimit-remaining-subscription-reads"),
            response.header("x-ms-ratelimit-remaining-subscription-writes"),
        );
        if !low.is_empty() {
            crate::flotilla::provider::log::emit(
                crate::flotilla::provider::log::Level::Warn,
                &cap(format!(
                    "{action}: ARM throttling windows nearly spent ({}); calls will be refused with 429 soon",
                    low.join(", ")
                )),
            );
        }
        let async_operation = header("azure-asyncoperation");
        let location = header("location");
        let (status, body) = response
            .into_text()
            .map_err(|e| Error::Transient(cap(format!("{action}: {e}"))))?;
        Ok(Reply {
            status,
            retry_after,
            async_operation,
            location,
            body,
        })
    }
}

/// An operation status body: `Some` when it ended, an error when it failed.
/// <https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/async-operations#azure-asyncoperation-request-and-response>
fn operation_status(action: &str, body: &Value) -> Result<Option<Outcome>, Error> {
    match body.get("status").and_then(Value::as_str) {
        Some("Succeeded") => Ok(Some(Outcome::Done)),
        Some(state @ ("Failed" | "Canceled")) => {
            let error = body.get("error");
            let field = |k: &str| {
                error
                    .and_then(|e| e.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or("")
            };
            let code = if field("code").is_empty() {
                state
            } else {
                field("code")
            };
            let message = format!("operation {state}: {}", field("message"));
            // The operation's own status is 200; its error code decides the class.
            Err(classify_code(action, 200, None, code, &message))
        }
        _ => Ok(None),
    }
}

//! The Compute Engine REST API over wasi:http: one JSON call, error classification, and
//! following a long-running operation. Requests name the pool credential; the host mints the
//! OAuth token and adds `Authorization: Bearer`, so this code never sees it.

use flotilla_guest_http::{Method, Request};
use serde_json::Value;

use crate::flotilla::provider::types::{Error, Throttle};

/// How much of a cloud message goes into an error.
const MESSAGE_CAP: usize = 300;

/// Where to send calls, and as whom.
#[derive(Debug, Clone)]
pub struct Api {
    /// `https://compute.googleapis.com/compute/v1/projects/PROJECT`, no trailing slash.
    pub project_url: String,
    pub credential: String,
}

/// The value at `pointer` (`/a/b`), or null: reading a field never panics.
pub fn field<'a>(value: &'a Value, pointer: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    value.pointer(pointer).unwrap_or(&NULL)
}

/// Text shortened to [`MESSAGE_CAP`] characters.
pub fn capped(text: &str) -> String {
    let mut out: String = text.chars().take(MESSAGE_CAP).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Seconds to wait after a rate-quota refusal that names no `Retry-After`.
const RATE_QUOTA_WAIT: u32 = 60;

/// Classifies an error answer of a Google API.
///
/// The body is the documented error shape:
/// `{"error": {"code", "message", "status", "errors": [{"reason", "domain", "message"}],
/// "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason", "metadata"}]}}`
/// (<https://cloud.google.com/compute/docs/api/how-tos/api-requests-responses#handling_api_errors>,
/// <https://cloud.google.com/apis/design/errors#http_mapping>).
pub fn classify(action: &str, status: u16, retry_after: Option<u32>, body: &str) -> Error {
    let parsed: Value = serde_json::from_str(body).unwrap_or_default();
    let error = field(&parsed, "/error");
    let message = field(error, "/message")
        .as_str()
        .map_or_else(|| capped(body), capped);
    let reasons: Vec<&str> = field(error, "/errors")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| field(e, "/reason").as_str())
        .collect();
    let grpc = field(error, "/status").as_str().unwrap_or_default();
    let has = |r: &str| reasons.contains(&r);
    let what = format!("{action}: HTTP {status} {grpc}: {message}");
    // Compute's rate quotas answer 403 `rateLimitExceeded` without `Retry-After`; Google says
    // to "wait a minute then try your request again" (the quota refills on the minute).
    // <https://cloud.google.com/compute/docs/api-rate-limits>
    if status == 429 || has("rateLimitExceeded") || has("userRateLimitExceeded") {
        return Error::Throttled(Throttle {
            retry_after_seconds: retry_after.unwrap_or(RATE_QUOTA_WAIT),
            message: what,
        });
    }
    if has("quotaExceeded") || has("QUOTA_EXCEEDED") {
        return Error::QuotaExceeded(what);
    }
    if status == 401 || status == 403 || grpc == "PERMISSION_DENIED" || grpc == "UNAUTHENTICATED" {
        let permission = denied_permission(error).unwrap_or_default();
        return Error::Unauthorized(if permission.is_empty() {
            what
        } else {
            format!("{action}: permission {permission} denied: {message}")
        });
    }
    match status {
        404 => Error::NotFound(what),
        400 | 412 => Error::InvalidConfig(what),
        409 => Error::Transient(what),
        s if s >= 500 => Error::Transient(what),
        _ => Error::Other(what),
    }
}

/// The IAM permission a 403 names: the `ErrorInfo` detail's `metadata.permission`, else the
/// quoted name in "Required 'compute.x.y' permission for ...".
fn denied_permission(error: &Value) -> Option<String> {
    let from_details = field(error, "/details")
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|d| field(d, "/metadata/permission").as_str())
        .map(str::to_string);
    from_details.or_else(|| {
        let message = field(error, "/message").as_str()?;
        let rest = message.split("Required '").nth(1)?;
        let name = rest.split('\'').next()?;
        Some(capped(name))
    })
}

/// Classifies a finished operation's `error` (`errors[].code`, e.g. `QUOTA_EXCEEDED`).
/// <https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations#Operation>
fn operation_error(action: &str, op: &Value) -> Option<Error> {
    let errors = field(op, "/error/errors").as_array()?;
    let first = errors.first()?;
    let code = field(first, "/code").as_str().unwrap_or_default();
    let message = capped(field(first, "/message").as_str().unwrap_or_default());
    let what = format!("{action}: operation failed: {code}: {message}");
    Some(match code {
        "QUOTA_EXCEEDED"
        | "ZONE_RESOURCE_POOL_EXHAUSTED"
        | "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" => Error::QuotaExceeded(what),
        // Too many operations on one resource in a short time: wait for the rate's window.
        // (kubernetes-sigs/gcp-compute-persistent-disk-csi-driver#1847)
        "RATE_LIMIT_EXCEEDED" | "RESOURCE_OPERATION_RATE_EXCEEDED" => Error::Throttled(Throttle {
            retry_after_seconds: RATE_QUOTA_WAIT,
            message: what,
        }),
        "PERMISSIONS_ERROR" | "FORBIDDEN" => Error::Unauthorized(what),
        "RESOURCE_NOT_FOUND" => Error::NotFound(what),
        _ if field(op, "/httpErrorStatusCode")
            .as_u64()
            .is_some_and(|s| s >= 500) =>
        {
            Error::Transient(what)
        }
        _ => Error::Other(what),
    })
}

impl Api {
    /// One call: `method` on `path` (relative to the project), with an optional JSON body.
    pub fn call(
        &self,
        action: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Error> {
        self.call_as(action, method, path, body)
    }

    /// Like [`Api::call`], the answer read into `T` (fields it does not name are skipped).
    pub fn call_as<T: serde::de::DeserializeOwned>(
        &self,
        action: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, Error> {
        let url = format!("{}/{path}", self.project_url);
        let body = body.map(Value::to_string);
        let json = [
            ("flotilla-credential", self.credential.as_str()),
            ("accept", "application/json"),
            ("content-type", "application/json"),
        ];
        let (status, retry_after, text) = send(
            action,
            &Request {
                method,
                url: &url,
                // The content type only with a body.
                headers: if body.is_some() { &json } else { &json[..2] },
                body: body.as_deref().map(str::as_bytes),
            },
        )?;
        if !(200..300).contains(&status) {
            return Err(classify(action, status, retry_after, &text));
        }
        let text = if text.trim().is_empty() {
            "null"
        } else {
            text.as_str()
        };
        serde_json::from_str(text)
            .map_err(|e| Error::Other(format!("{action}: unparseable answer: {e}")))
    }

    /// Follows the operation `op` (as returned by the call that started it) until it is
    /// `DONE` or `budget` has passed, polling `operations_path/NAME`. `Ok(true)` when it
    /// finished without error, `Ok(false)` when it is still running at the end of the budget:
    /// Compute has accepted it and the next `update` shows its effect.
    /// <https://cloud.google.com/compute/docs/api/how-tos/api-requests-responses#handling_api_responses>
    pub fn follow(
        &self,
        action: &str,
        operations_path: &str,
        op: Value,
        budget: std::time::Duration,
    ) -> Result<bool, Error> {
        let started = std::time::Instant::now();
        let mut op = op;
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            if let Some(e) = operation_error(action, &op) {
                return Err(e);
            }
            if field(&op, "/status").as_str() == Some("DONE") {
                return Ok(true);
            }
            if started.elapsed() + pause > budget {
                return Ok(false);
            }
            let Some(name) = field(&op, "/name").as_str().filter(|n| valid_name(n)) else {
                return Err(Error::Other(format!(
                    "{action}: the operation has no usable name"
                )));
            };
            flotilla_guest_http::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_secs(2));
            op = self.call(
                action,
                Method::Get,
                &format!("{operations_path}/{name}"),
                None,
            )?;
        }
    }
}

/// A Compute resource name as the API allows it in a path segment.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Sends one request: its status, `Retry-After` in seconds, and body text. A request that
/// cannot be described is the settings' fault; one that did not complete is transient.
fn send(action: &str, request: &Request<'_>) -> Result<(u16, Option<u32>, String), Error> {
    match flotilla_guest_http::send(request) {
        Ok(response) => {
            let retry_after = response
                .header("retry-after")
                .and_then(|v| v.trim().parse::<u32>().ok());
            let (status, text) = response
                .into_text()
                .map_err(|e| Error::Transient(format!("{action}: {e}")))?;
            Ok((status, retry_after, text))
        }
        Err(flotilla_guest_http::Error::Invalid(e)) => {
            Err(Error::InvalidConfig(format!("{action}: {e}")))
        }
        Err(e) => Err(Error::Transient(format!("{action}: {e}"))),
    }
}

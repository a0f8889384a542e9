//! The GitLab API side of the artifact commands: job credentials (`common/network.go`
//! `JobCredentials`: `--id`, `--token`, `--url` and the TLS files, each defaulting to its
//! `CI_*` variable), the API base (`network/client.go` `newClient`: `fixCIURL(url) +
//! "/api/v4/"`), the `JOB-TOKEN` and `X-Request-Id` headers (`network/gitlab.go`
//! `JobTokenHeader`, `addCorrelationID`), the user agent (`common/version.go` `UserAgent`),
//! the rate-limit retries every API request goes through (`network/retry_requester.go`: up to
//! 5 attempts on 408, 429, 500, 502, 503, 504 and ≥ 512, waiting `RateLimit-ResetTime`,
//! `Retry-After` or an exponential backoff from 100 ms), and the error texts
//! (`getMessageFromJSONResponse`, `getMessageFromJSONOrXMLResponse`).
//!
//! The job token is never printed: where the runner logs `token=<first 9 characters>`
//! (`helpers.ShortenToken`), this prints `token=[MASKED]`.
//!
//! Owns: talking to GitLab. Must not know: archives.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use url::Url;

use crate::ctx::{Ctx, Env};
use crate::flags::{Flag, Kind, Parsed, env_flag};
use crate::http::{Client, HttpError, Request, Response, clean_url};
use crate::log::Level;
use crate::tls::TlsFiles;

/// The `JobCredentials` flags.
pub const CREDENTIAL_FLAGS: &[Flag] = &[
    env_flag("id", Kind::Integer, "CI_JOB_ID"),
    env_flag("token", Kind::Text, "CI_JOB_TOKEN"),
    env_flag("url", Kind::Text, "CI_SERVER_URL"),
    env_flag("tls-ca-file", Kind::Text, "CI_SERVER_TLS_CA_FILE"),
    env_flag("tls-cert-file", Kind::Text, "CI_SERVER_TLS_CERT_FILE"),
    env_flag("tls-key-file", Kind::Text, "CI_SERVER_TLS_KEY_FILE"),
];

/// The version this stand-in reports (`VERSION` of the runner source it follows).
pub const VERSION: &str = "19.4.0";
/// The runner source revision it follows.
pub const REVISION: &str = "d79f3e7b";

/// What the log shows for the job token.
pub const MASKED: &str = "[MASKED]";

/// `common.JobCredentials`.
#[derive(Debug, Clone)]
pub struct JobCredentials {
    pub id: i64,
    pub token: String,
    pub url: String,
    tls_ca_file: String,
    tls_cert_file: String,
    tls_key_file: String,
}

impl JobCredentials {
    pub fn from_flags(parsed: &Parsed) -> JobCredentials {
        JobCredentials {
            id: parsed.integer("id").unwrap_or(0),
            token: parsed.text("token"),
            url: parsed.text("url"),
            tls_ca_file: parsed.text("tls-ca-file"),
            tls_cert_file: parsed.text("tls-cert-file"),
            tls_key_file: parsed.text("tls-key-file"),
        }
    }

    /// `{fixCIURL(url)}/api/v4/{path}`.
    pub fn api_url(&self, path: &str) -> Result<Url, String> {
        let trimmed = self.url.trim_end_matches('/');
        let base = trimmed.strip_suffix("/ci").unwrap_or(trimmed);
        let url =
            Url::parse(&format!("{base}/api/v4/{path}")).map_err(|e| format!("parse URL: {e}"))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err("only http or https scheme supported".into());
        }
        Ok(url)
    }

    /// The fields the runner's log lines carry.
    pub fn fields(&self, correlation_id: &str) -> Vec<(&'static str, String)> {
        vec![
            ("id", self.id.to_string()),
            ("token", MASKED.into()),
            ("correlation_id", correlation_id.into()),
        ]
    }

    /// A client with GitLab's TLS files: the explicit ones, else `<host>.crt`,
    /// `<host>.auth.crt` and `<host>.auth.key` in the certificate directory
    /// (`/etc/gitlab-runner/certs` for root, `~/.gitlab-runner/certs` otherwise).
    pub fn client(&self, env: &Env, timeout: Option<Duration>, header_timeout: Duration) -> Client {
        let host = Url::parse(&self.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_default();
        let certs = certificate_directory(env);
        let pick = |given: &str, name: String| -> Option<PathBuf> {
            if !given.is_empty() {
                return Some(PathBuf::from(given));
            }
            let path = certs.as_ref()?.join(name);
            path.exists().then_some(path)
        };
        let mut tls = TlsFiles::system(env);
        tls.extra_ca = pick(&self.tls_ca_file, format!("{host}.crt"));
        let cert = pick(&self.tls_cert_file, format!("{host}.auth.crt"));
        let key = pick(&self.tls_key_file, format!("{host}.auth.key"));
        tls.client = cert.zip(key);
        Client {
            timeout,
            header_timeout,
            dial_timeout: Duration::from_secs(30),
            tls,
            user_agent: user_agent(),
        }
    }
}

fn certificate_directory(env: &Env) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if root {
        return Some(PathBuf::from("/etc/gitlab-runner/certs"));
    }
    env.get("HOME")
        .map(|home| PathBuf::from(home).join(".gitlab-runner/certs"))
}

/// Go's `GOARCH` name for this machine.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `AppVersionInfo.UserAgent`.
pub fn user_agent() -> String {
    format!(
        "gitlab-runner {VERSION} (HEAD; rust stand-in; {}/{})",
        std::env::consts::OS,
        go_arch()
    )
}

/// `NewCorrelationID`: a random UUID without dashes.
pub fn correlation_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    let _filled = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `retryRequester.Do`: the request, retried on rate limits and server errors.
pub fn send_api(
    ctx: &mut Ctx,
    client: &Client,
    request: Request<'_>,
) -> Result<Response, HttpError> {
    let mut backoff = Duration::from_millis(100);
    let mut attempts = 0;
    loop {
        let response = client.send(request.clone()).map_err(|e| {
            HttpError(format!(
                "execute raw request: execute request: couldn't execute {} against {}: {e}",
                request.method,
                clean_url(&request.url)
            ))
        })?;
        attempts += 1;
        let status = response.status;
        let retriable = matches!(status, 408 | 429 | 500 | 502 | 503 | 504) || status >= 512;
        if !retriable || attempts >= 5 {
            return Ok(response);
        }
        let wait = wait_time(&response).unwrap_or_else(|| {
            let jittered = jitter(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(60));
            jittered
        });
        let fields = [
            ("context", "ratelimit-requester-gitlab-request".to_string()),
            ("url", clean_url(&request.url)),
            ("method", request.method.to_string()),
            ("duration", crate::flags::go_duration(wait)),
        ];
        ctx.log
            .line(Level::Info, "Waiting before making the next call", &fields);
        std::thread::sleep(wait);
    }
}

fn wait_time(response: &Response) -> Option<Duration> {
    if let Some(reset) = response
        .header("RateLimit-ResetTime")
        .and_then(crate::timefmt::parse_http_date)
        && let Ok(left) = reset.duration_since(SystemTime::now())
        && !left.is_zero()
    {
        return Some(left);
    }
    let seconds: u64 = response.header("Retry-After")?.trim().parse().ok()?;
    (seconds > 0).then(|| Duration::from_secs(seconds))
}

/// jpillora/backoff with jitter: a random duration between the minimum and `upper`.
fn jitter(upper: Duration) -> Duration {
    use ring::rand::SecureRandom;
    let mut byte = [0u8; 1];
    let _filled = ring::rand::SystemRandom::new().fill(&mut byte);
    let min = Duration::from_millis(100);
    min + upper
        .saturating_sub(min)
        .mul_f64(f64::from(byte.first().copied().unwrap_or(0)) / 255.0)
}

/// `http.StatusText`.
pub fn status_text(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Request Entity Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

fn mime(response: &Response) -> String {
    let value = response.header("Content-Type").unwrap_or("");
    value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// `ResponseError.Error` for a JSON `{"message": …}` body.
fn json_message(method: &str, response: &mut Response) -> Option<String> {
    let body = response.read_body(1 << 20);
    let value: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let message = match value.get("message") {
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(serde_json::Value::Object(map)) => map
            .iter()
            .map(|(key, list)| {
                let items: Vec<String> = list
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                format!("{key}: {}", items.join("; "))
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    };
    let code = format!("{} {}", response.status, status_text(response.status));
    let head = format!("{method} {}: {code}", clean_url(&response.url));
    Some(if message == code || message.is_empty() {
        head
    } else {
        format!("{head} ({message})")
    })
}

/// `getMessageFromJSONResponse`.
pub fn message_from_json(method: &str, response: &mut Response) -> String {
    if (200..300).contains(&response.status) || mime(response) != "application/json" {
        return response.status_text();
    }
    json_message(method, response).unwrap_or_else(|| response.status_text())
}

/// `getMessageFromJSONOrXMLResponse`.
pub fn message_from_json_or_xml(method: &str, response: &mut Response) -> String {
    if (200..300).contains(&response.status) {
        return response.status_text();
    }
    match mime(response).as_str() {
        "application/json" => {
            json_message(method, response).unwrap_or_else(|| response.status_text())
        }
        "application/xml" | "text/xml" => {
            let body = String::from_utf8_lossy(&response.read_body(1 << 20)).into_owned();
            let code = format!("{} {}", response.status, status_text(response.status));
            match crate::cache_common::xml_element(&body, "Code") {
                Some(error) if !error.is_empty() => {
                    let text =
                        crate::cache_common::xml_element(&body, "Message").unwrap_or_default();
                    format!("{code} ({error}: {text})")
                }
                _ => code,
            }
        }
        _ => response.status_text(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(url: &str) -> JobCredentials {
        let env = Env::from_pairs(&[
            ("CI_SERVER_URL", url),
            ("CI_JOB_ID", "7"),
            ("CI_JOB_TOKEN", "t"),
        ]);
        let parsed = crate::flags::parse(CREDENTIAL_FLAGS, &[], &env).expect("flags");
        JobCredentials::from_flags(&parsed)
    }

    #[test]
    fn the_api_base_drops_a_trailing_slash_and_ci_suffix() {
        let creds = credentials("https://gitlab.example/ci/");
        assert_eq!(creds.id, 7);
        let url = creds.api_url("jobs/7/artifacts").expect("valid");
        assert_eq!(
            url.as_str(),
            "https://gitlab.example/api/v4/jobs/7/artifacts"
        );
        assert!(credentials("ftp://x").api_url("jobs").is_err());
    }

    #[test]
    fn the_token_field_is_masked() {
        let fields = credentials("https://g").fields("abc");
        assert!(fields.contains(&("token", MASKED.to_string())));
        assert!(!fields.iter().any(|(_, v)| v == "t"));
    }
}

//! What the two cache commands share: the retry loop (`commands/helpers/retry_helper.go`
//! `doRetry`, `retryOnServerError` with the storage XML error body), the cache HTTP client
//! (`cache_client.go` `NewCacheClient`: `--timeout` minutes, else 10; 30 s to dial and for
//! response headers), the env file (`cache_env.go` `loadEnvFile`), the `metadata.json`
//! written beside the archive (`cache_metadata.go`), and the transfer tuning checks
//! (`cache_defaults.go` `validateCacheTransferTuning`).
//!
//! Owns: those helpers. Must not know: which command calls them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::ctx::{Ctx, path_error};
use crate::flags::{Flag, Kind, Parsed, env_flag, flag};
use crate::http::{Client, Response};
use crate::tls::TlsFiles;

/// `common.DefaultCacheRequestTimeout` (minutes).
const DEFAULT_CACHE_REQUEST_TIMEOUT: u64 = 10;
const DEFAULT_TRANSFER_BUFFER_SIZE: i64 = 4 * 1024 * 1024;
const DEFAULT_CHUNK_SIZE: i64 = 16 * 1024 * 1024;

/// Flags both cache commands have: `retryHelper`, `meter.TransferMeterCommand`, the transfer
/// tuning and the env file.
pub const SHARED_FLAGS: &[Flag] = &[
    flag("retry", Kind::Integer),
    flag("retry-time", Kind::Duration),
    env_flag(
        "transfer-meter-frequency",
        Kind::Duration,
        "TRANSFER_METER_FREQUENCY",
    ),
    env_flag(
        "transfer-buffer-size",
        Kind::Integer,
        "CACHE_TRANSFER_BUFFER_SIZE",
    ),
    env_flag("chunk-size", Kind::Integer, "CACHE_CHUNK_SIZE"),
    env_flag("concurrency", Kind::Integer, "CACHE_CONCURRENCY"),
    flag("env-file", Kind::Text),
    flag("file", Kind::Text),
    flag("url", Kind::Text),
    flag("gocloud-url", Kind::Text),
    flag("timeout", Kind::Integer),
];

/// A failed attempt: its message and whether `doRetry` tries again (`retryableError`).
#[derive(Debug, Clone)]
pub struct Failure {
    pub message: String,
    pub retryable: bool,
}

impl Failure {
    pub fn fatal(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            retryable: false,
        }
    }

    pub fn retryable(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            retryable: true,
        }
    }
}

/// `retryHelper` (`Retry: 2, RetryTime: time.Second` unless given).
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    pub retries: i64,
    pub pause: Duration,
}

impl Retry {
    pub fn from_flags(parsed: &Parsed) -> Retry {
        Retry {
            retries: parsed.integer("retry").unwrap_or(2),
            pause: parsed
                .duration("retry-time")
                .unwrap_or(Duration::from_secs(1)),
        }
    }

    /// `doRetry`: runs `attempt(0)`, and again while the failure is retryable, up to
    /// `retries` more times, sleeping and warning `Retrying...` before each.
    pub fn run(
        self,
        ctx: &mut Ctx,
        mut attempt: impl FnMut(&mut Ctx, i64) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let mut result = attempt(ctx, 0);
        for retry in 1..=self.retries {
            match &result {
                Err(failure) if failure.retryable => {
                    std::thread::sleep(self.pause);
                    ctx.log.line(
                        crate::log::Level::Warn,
                        "Retrying...",
                        &[("error", failure.message.clone())],
                    );
                }
                _ => return result,
            }
            result = attempt(ctx, retry);
        }
        result
    }
}

/// `validateCacheTransferTuning` after the zero-means-default normalisation.
pub fn check_tuning(parsed: &Parsed) -> Result<(), String> {
    let buffer = parsed
        .integer("transfer-buffer-size")
        .filter(|n| *n != 0)
        .unwrap_or(DEFAULT_TRANSFER_BUFFER_SIZE);
    let chunk = parsed
        .integer("chunk-size")
        .filter(|n| *n != 0)
        .unwrap_or(DEFAULT_CHUNK_SIZE);
    let concurrency = parsed.integer("concurrency").unwrap_or(16);
    if buffer <= 0 {
        return Err(format!(
            "invalid cache transfer buffer size {buffer} (CACHE_TRANSFER_BUFFER_SIZE / --transfer-buffer-size): must be positive; use 0 for default {DEFAULT_TRANSFER_BUFFER_SIZE} bytes"
        ));
    }
    if chunk < 0 {
        return Err(format!(
            "invalid cache chunk size {chunk} (CACHE_CHUNK_SIZE / --chunk-size): must be non-negative; use 0 for default {DEFAULT_CHUNK_SIZE} bytes"
        ));
    }
    if concurrency < 0 {
        return Err(format!(
            "invalid cache concurrency {concurrency} (CACHE_CONCURRENCY / --concurrency): must be non-negative"
        ));
    }
    Ok(())
}

/// `NewCacheClient(timeout)`.
pub fn cache_client(ctx: &Ctx, timeout_minutes: i64) -> Client {
    let minutes = u64::try_from(timeout_minutes)
        .ok()
        .filter(|m| *m > 0)
        .unwrap_or(DEFAULT_CACHE_REQUEST_TIMEOUT);
    Client {
        timeout: Some(Duration::from_secs(minutes * 60)),
        header_timeout: Duration::from_secs(30),
        dial_timeout: Duration::from_secs(30),
        tls: TlsFiles::system(&ctx.env),
        user_agent: "Go-http-client/1.1".into(),
    }
}

/// `retryOnServerError`: 2xx passes; otherwise `received: <status>` plus the storage
/// service's XML `<Error><Code>…</Code><Message>…</Message></Error>` when present; 5xx is
/// retryable.
pub fn retry_on_server_error(response: &mut Response) -> Result<(), Failure> {
    if response.status / 100 == 2 {
        return Ok(());
    }
    let body = String::from_utf8_lossy(&response.read_body(1 << 20)).into_owned();
    let mut message = format!("received: {}", response.status_text());
    let code = xml_element(&body, "Code").unwrap_or_default();
    let text = xml_element(&body, "Message").unwrap_or_default();
    if body.contains("<Error") && (!code.is_empty() || !text.is_empty()) {
        let mut detail = String::new();
        if !code.is_empty() {
            detail = format!("code: {code}");
        }
        if !text.is_empty() {
            detail.push_str(&format!(", message: {text}"));
        }
        message = format!("{message}. Request failed with {detail}");
    }
    Err(Failure {
        message,
        retryable: response.status / 100 == 5,
    })
}

/// The text of the first `<name>…</name>`, entities decoded.
pub fn xml_element(body: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let end = body.get(start..)?.find(&format!("</{name}>"))? + start;
    let raw = body.get(start..end)?;
    Some(
        raw.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

/// `loadEnvFile`: merges the godotenv file into the environment.
pub fn load_env_file(ctx: &mut Ctx, file: &str) -> Result<(), String> {
    if file.is_empty() {
        return Ok(());
    }
    let text = std::fs::read_to_string(ctx.resolve(file))
        .map_err(|e| format!("failed to read env file: {}", path_error("open", file, &e)))?;
    let pairs =
        crate::expand::parse_dotenv(&text).map_err(|e| format!("failed to read env file: {e}"))?;
    for (key, value) in pairs {
        ctx.env.set(&key, &value);
    }
    Ok(())
}

/// `writeCacheMetadataFile`: `metadata.json` (mode 0640) beside the archive, keys
/// lower-cased, empty keys dropped.
pub fn write_metadata_file(
    archive: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<(), String> {
    let normalized: BTreeMap<String, String> = metadata
        .iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_lowercase(), v.clone()))
        .collect();
    let json =
        serde_json::to_string(&normalized).map_err(|e| format!("writing metadata file: {e}"))?;
    let file = archive
        .parent()
        .unwrap_or(Path::new("."))
        .join("metadata.json");
    std::fs::write(&file, json)
        .map_err(|e| format!("writing metadata file: {}", crate::ctx::go_error(&e)))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640))
        .map_err(|e| format!("writing metadata file: {}", crate::ctx::go_error(&e)))
}

/// `headersToCacheMetadata`: `X-<vendor>-Meta-<key>` response headers.
pub fn headers_to_metadata(headers: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let parts: Vec<&str> = name.split('-').collect();
        if let (Some(x), Some(meta), Some(rest)) = (parts.first(), parts.get(2), parts.get(3..))
            && x.eq_ignore_ascii_case("x")
            && meta.eq_ignore_ascii_case("meta")
            && !rest.is_empty()
        {
            out.entry(rest.join("-").to_lowercase())
                .or_insert_with(|| value.clone());
        }
    }
    out
}

/// `filepath.Base`.
pub fn base_name(path: &str) -> String {
    let cleaned = crate::lexical::clean(path);
    cleaned.rsplit('/').next().unwrap_or(&cleaned).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_headers_of_any_vendor_are_collected() {
        let headers = vec![
            ("X-Amz-Meta-Cachekey".to_string(), "k1".to_string()),
            ("x-goog-meta-some-thing".to_string(), "v".to_string()),
            ("X-Amz-Request-Id".to_string(), "nope".to_string()),
        ];
        let metadata = headers_to_metadata(&headers);
        assert_eq!(metadata.get("cachekey").map(String::as_str), Some("k1"));
        assert_eq!(metadata.get("some-thing").map(String::as_str), Some("v"));
        assert_eq!(metadata.len(), 2);
    }

    #[test]
    fn the_storage_error_body_is_quoted_in_the_failure() {
        let body = "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Denied &amp; logged</Message></Error>";
        assert_eq!(xml_element(body, "Code").as_deref(), Some("AccessDenied"));
        assert_eq!(
            xml_element(body, "Message").as_deref(),
            Some("Denied & logged")
        );
    }
}

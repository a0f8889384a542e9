//! The one GoCloud backend the runner uses with env-file credentials here: Azure Blob
//! (`cache/azure/adapter.go` `GetGoCloudURL`: `azblob://<container>/<object>` plus
//! `AZURE_STORAGE_ACCOUNT`, `AZURE_STORAGE_DOMAIN` and `AZURE_STORAGE_SAS_TOKEN` in the env
//! file). The service URL is built as `gocloud.dev/blob/azureblob` v0.46.0
//! `NewDefaultServiceURLOptions` / `withOverrides` / `NewServiceURL` build it:
//! `<protocol>://<account>.<domain>` (domain `blob.core.windows.net`, protocol `https` by
//! default, from `AZURE_STORAGE_DOMAIN` / `AZURE_STORAGE_PROTOCOL`), or
//! `<protocol>://<domain>/<account>` for a local emulator such as Azurite (a domain starting
//! with `localhost` or `127.0.0.1`, or `AZURE_STORAGE_IS_LOCAL_EMULATOR=true`), or
//! `<protocol>://<domain>` for a CDN (`AZURE_STORAGE_IS_CDN`); the `domain`, `protocol`,
//! `cdn`, `localemu` and `storage_account` query parameters of the bucket URL override
//! them. Those variables may come from the env file or the job's environment, so an
//! emulator needs no extra, test-only variable. Blob names are escaped as `escapeKey` does.
//!
//! Requests: Put Blob (one `BlockBlob` PUT; the SDK's `UploadStream` would use blocks above
//! its chunk size), Get Blob Properties (HEAD) for `Attributes`, Get Blob (GET).
//!
//! Limits: only SAS-token credentials (what the runner sends); `AZURE_STORAGE_KEY`,
//! connection strings and Azure AD are refused. No SDK retries.
//!
//! Owns: addressing and the three blob requests. Must not know: caches or archives.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use url::Url;

use crate::ctx::Env;
use crate::http::{Body, Client, Request, Response, clean_url};

const API_VERSION: &str = "2021-08-06";

/// One blob, addressed.
#[derive(Debug, Clone)]
pub struct Blob {
    /// The blob URL with the SAS token as its query.
    pub url: Url,
    /// `objectName` as the runner logs it.
    pub object: String,
    /// The bucket URL as the runner logs it (`CleanURL`).
    pub source: String,
}

/// A blob's properties (GoCloud `Attributes`).
#[derive(Debug, Clone, Default)]
pub struct Attributes {
    pub modified: Option<SystemTime>,
    pub etag: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

fn truthy(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("") => Ok(false),
        Some(v) => crate::flags::parse_bool(v)
            .map_err(|_| format!("strconv.ParseBool: parsing {v:?}: invalid syntax")),
    }
}

struct Options {
    account: String,
    domain: String,
    protocol: String,
    cdn: bool,
    emulator: bool,
}

/// `NewDefaultServiceURLOptions` with the bucket URL's overrides.
fn options(env: &Env, bucket: &Url) -> Result<Options, String> {
    let mut account = env.get("AZURE_STORAGE_ACCOUNT").unwrap_or("").to_string();
    let mut protocol = env.get("AZURE_STORAGE_PROTOCOL").unwrap_or("").to_string();
    let connection = env
        .get("AZURE_STORAGE_CONNECTION_STRING")
        .filter(|c| !c.is_empty())
        .or_else(|| env.get("AZURE_STORAGEBLOB_CONNECTIONSTRING"))
        .unwrap_or("");
    for part in connection.split(';') {
        match part.split_once('=') {
            Some(("AccountName", value)) if account.is_empty() => account = value.into(),
            Some(("DefaultEndpointsProtocol", value)) if protocol.is_empty() => {
                protocol = value.into()
            }
            _ => {}
        }
    }
    let cdn_env = env
        .get("AZURE_STORAGE_IS_CDN")
        .and_then(|v| crate::flags::parse_bool(v).ok());
    let emu_env = env
        .get("AZURE_STORAGE_IS_LOCAL_EMULATOR")
        .and_then(|v| crate::flags::parse_bool(v).ok());
    let mut options = Options {
        account,
        domain: env.get("AZURE_STORAGE_DOMAIN").unwrap_or("").to_string(),
        protocol,
        cdn: cdn_env.unwrap_or(false),
        emulator: emu_env.unwrap_or(false),
    };
    for (key, value) in bucket.query_pairs() {
        match key.as_ref() {
            "domain" => options.domain = value.into_owned(),
            "protocol" => options.protocol = value.into_owned(),
            "cdn" => options.cdn = truthy(Some(&value))?,
            "localemu" => options.emulator = truthy(Some(&value))?,
            "storage_account" => options.account = value.into_owned(),
            other => return Err(format!("unknown query parameter {other:?}")),
        }
    }
    Ok(options)
}

/// `NewServiceURL` without the SAS token.
fn service_url(options: &Options) -> Result<String, String> {
    if options.account.is_empty() {
        return Err("azureblob: Options.AccountName is required".into());
    }
    let domain = if options.domain.is_empty() {
        "blob.core.windows.net"
    } else {
        &options.domain
    };
    let protocol = match options.protocol.as_str() {
        "" => "https",
        p @ ("http" | "https") => p,
        other => return Err(format!("invalid protocol {other:?}")),
    };
    let account = &options.account;
    Ok(
        if domain.starts_with("127.0.0.1") || domain.starts_with("localhost") || options.emulator {
            format!("{protocol}://{domain}/{account}")
        } else if options.cdn {
            format!("{protocol}://{domain}")
        } else {
            format!("{protocol}://{account}.{domain}")
        },
    )
}

/// `escapeKey`: characters Azure mishandles become `__0x<hex>__`.
fn escape_key(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    let mut out = String::new();
    for (at, &c) in chars.iter().enumerate() {
        let trailing_slash = at + 1 == chars.len() && c == '/';
        let dot_dot_slash = at > 1
            && c == '/'
            && chars.get(at - 1) == Some(&'.')
            && chars.get(at - 2) == Some(&'.');
        if c == '\\'
            || (c as u32) < 32
            || matches!(c, '"' | '#' | '%' | '?' | '\u{7f}')
            || trailing_slash
            || dot_dot_slash
        {
            out.push_str(&format!("__0x{:x}__", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `url.PathEscape`-style escaping that keeps `/` (each element escaped).
fn path_escape(text: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        let keep = b.is_ascii_alphanumeric()
            || b"-._~!$&'()*+,;=:@".contains(&b)
            || (keep_slash && b == b'/');
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Addresses the object of `gocloud_url` with the credentials in `env`.
pub fn locate(gocloud_url: &str, env: &Env) -> Result<Blob, String> {
    let bucket = Url::parse(gocloud_url).map_err(|e| format!("parse {gocloud_url:?}: {e}"))?;
    if bucket.scheme() != "azblob" {
        return Err(format!(
            "open blob.Bucket: scheme {:?} is not supported by this gitlab-runner-helper stand-in (azblob only)",
            bucket.scheme()
        ));
    }
    let object = bucket.path().trim_start_matches('/').to_string();
    if object.is_empty() {
        return Err("no object name provided".into());
    }
    let object = percent_decode(&object);
    let container = bucket.host_str().unwrap_or("").to_string();
    let service = service_url(&options(env, &bucket)?)?;
    let sas = env
        .get("AZURE_STORAGE_SAS_TOKEN")
        .unwrap_or("")
        .trim_start_matches('?')
        .to_string();
    if sas.is_empty() {
        return Err("azureblob: this gitlab-runner-helper stand-in needs AZURE_STORAGE_SAS_TOKEN (shared keys, connection strings and Azure AD credentials are not supported)".into());
    }
    let raw = format!(
        "{service}/{}/{}?{sas}",
        path_escape(&container, false),
        path_escape(&escape_key(&object), true)
    );
    let url = Url::parse(&raw).map_err(|e| format!("azureblob: blob URL: {e}"))?;
    Ok(Blob {
        url,
        object,
        source: clean_url(&bucket),
    })
}

fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| text.to_string())
}

fn failure(method: &str, blob: &Blob, response: &mut Response) -> String {
    let code = response.header("x-ms-error-code").unwrap_or("").to_string();
    let body = String::from_utf8_lossy(&response.read_body(64 * 1024)).into_owned();
    let code = if code.is_empty() {
        crate::cache_common::xml_element(&body, "Code").unwrap_or_default()
    } else {
        code
    };
    format!(
        "{method} {}: RESPONSE {}, ERROR CODE: {code}",
        clean_url(&blob.url),
        response.status_text()
    )
}

/// Put Blob: the file as a block blob, with GoCloud's detected content type and the
/// metadata as `x-ms-meta-*` (keys and values escaped as `NewTypedWriter` does).
pub fn put(
    client: &Client,
    blob: &Blob,
    file: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<(), String> {
    let mut request = Request::new("PUT", blob.url.clone())
        .header("x-ms-version", API_VERSION)
        .header("x-ms-blob-type", "BlockBlob")
        .header("x-ms-blob-content-type", &content_type(file))
        .body(Body::File(file));
    for (key, value) in metadata {
        request = request.header(
            &format!("x-ms-meta-{}", escape_metadata_key(key)),
            &path_escape(value, false),
        );
    }
    let mut response = client.send(request).map_err(|e| e.to_string())?;
    if response.status / 100 == 2 {
        return Ok(());
    }
    Err(failure("PUT", blob, &mut response))
}

/// `http.DetectContentType` for what the helper uploads: zip archives, else octet-stream.
fn content_type(file: &Path) -> String {
    let mut head = [0u8; 4];
    let is_zip = std::fs::File::open(file)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok()
        && head == [b'P', b'K', 3, 4];
    if is_zip {
        "application/zip".into()
    } else {
        "application/octet-stream".into()
    }
}

fn escape_metadata_key(key: &str) -> String {
    let mut out = String::new();
    for (at, c) in key.chars().enumerate() {
        if (at == 0 && c.is_ascii_digit()) || !(c.is_ascii_alphanumeric() || c == '_') {
            out.push_str(&format!("__0x{:x}__", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `escape.HexUnescape`.
fn unescape_hex(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("__0x") {
        out.push_str(rest.get(..at).unwrap_or(""));
        let after = rest.get(at + 4..).unwrap_or("");
        let decoded = after.find("__").and_then(|end| {
            let c = char::from_u32(u32::from_str_radix(after.get(..end)?, 16).ok()?)?;
            Some((c, end))
        });
        match decoded {
            Some((c, end)) => {
                out.push(c);
                rest = after.get(end + 2..).unwrap_or("");
            }
            None => {
                out.push_str("__0x");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Get Blob Properties; `None` when the blob does not exist (`gcerrors.NotFound`).
pub fn head(client: &Client, blob: &Blob) -> Result<Option<Attributes>, String> {
    let request = Request::new("HEAD", blob.url.clone()).header("x-ms-version", API_VERSION);
    let mut response = client.send(request).map_err(|e| e.to_string())?;
    match response.status {
        404 => Ok(None),
        200..=299 => Ok(Some(attributes(&response))),
        _ => Err(failure("HEAD", blob, &mut response)),
    }
}

fn attributes(response: &Response) -> Attributes {
    let metadata = response
        .headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name
                .to_ascii_lowercase()
                .strip_prefix("x-ms-meta-")?
                .to_string();
            Some((unescape_hex(&key), percent_decode(value)))
        })
        .collect();
    Attributes {
        modified: response
            .header("Last-Modified")
            .and_then(crate::timefmt::parse_http_date),
        etag: response.header("ETag").map(str::to_string),
        metadata,
    }
}

/// Get Blob: the response to stream from.
pub fn get(client: &Client, blob: &Blob) -> Result<Response, String> {
    let request = Request::new("GET", blob.url.clone()).header("x-ms-version", API_VERSION);
    let mut response = client.send(request).map_err(|e| e.to_string())?;
    if response.status / 100 == 2 {
        return Ok(response);
    }
    Err(failure("GET", blob, &mut response))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs)
    }

    #[test]
    fn the_public_cloud_url_puts_the_account_in_the_host() {
        let blob = locate(
            "azblob://cache/runner/abc/project/1/key",
            &env(&[
                ("AZURE_STORAGE_ACCOUNT", "acct"),
                ("AZURE_STORAGE_SAS_TOKEN", "sv=1&sig=x"),
            ]),
        )
        .expect("addressable");
        assert_eq!(
            blob.url.as_str(),
            "https://acct.blob.core.windows.net/cache/runner/abc/project/1/key?sv=1&sig=x"
        );
        assert_eq!(blob.object, "runner/abc/project/1/key");
    }

    #[test]
    fn an_emulator_domain_puts_the_account_in_the_path() {
        let vars = [
            ("AZURE_STORAGE_ACCOUNT", "devstoreaccount1"),
            ("AZURE_STORAGE_DOMAIN", "azurite:10000"),
            ("AZURE_STORAGE_IS_LOCAL_EMULATOR", "true"),
            ("AZURE_STORAGE_PROTOCOL", "http"),
            ("AZURE_STORAGE_SAS_TOKEN", "?sig=x"),
        ];
        let blob = locate("azblob://c/k", &env(&vars)).expect("addressable");
        assert_eq!(
            blob.url.as_str(),
            "http://azurite:10000/devstoreaccount1/c/k?sig=x"
        );
        let loopback = [
            ("AZURE_STORAGE_ACCOUNT", "a"),
            ("AZURE_STORAGE_DOMAIN", "127.0.0.1:10000"),
            ("AZURE_STORAGE_SAS_TOKEN", "s=1"),
        ];
        let blob = locate("azblob://c/k", &env(&loopback)).expect("addressable");
        assert_eq!(blob.url.as_str(), "https://127.0.0.1:10000/a/c/k?s=1");
    }

    #[test]
    fn awkward_key_characters_are_hex_escaped() {
        assert_eq!(escape_key("a/../b?c"), "a/..__0x2f__b__0x3f__c");
        assert_eq!(escape_key("dir/"), "dir__0x2f__");
        assert_eq!(unescape_hex("a__0x2f__b"), "a/b");
        assert_eq!(escape_metadata_key("cache-key"), "cache__0x2d__key");
    }

    #[test]
    fn credentials_other_than_a_sas_token_are_refused() {
        let err =
            locate("azblob://c/k", &env(&[("AZURE_STORAGE_ACCOUNT", "a")])).expect_err("no SAS");
        assert!(err.contains("AZURE_STORAGE_SAS_TOKEN"), "{err}");
        let err = locate("s3://bucket/k", &env(&[])).expect_err("not azure");
        assert!(err.contains("azblob only"), "{err}");
    }
}

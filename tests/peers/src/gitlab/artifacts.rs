//! The jobs artifacts API as GitLab Runner's helper calls it (`network/gitlab.go`
//! `UploadRawArtifacts`, `DownloadArtifacts`) and GitLab answers it (`lib/api/ci/runner.rb`
//! `POST /jobs/:id/artifacts`, `GET /jobs/:id/artifacts`), plus the "object storage" a
//! `direct_download` is redirected to: a signed, short-lived URL that needs no `JOB-TOKEN`.
//!
//! Owns: the artifacts endpoints. Must not know: git.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request};

use super::{Answer, State, StoredArtifact, api_error, bytes, text};

/// The path prefix standing for the object store's host.
pub const OBJECT_STORAGE: &str = "/object-storage/artifacts/";

/// How long a signed download URL lives.
const SIGNED_URL_LIFE: u64 = 60;

/// `/api/v4/jobs/<id>/artifacts` → `<id>`.
fn job_id(path: &str) -> Option<u64> {
    path.strip_prefix("/api/v4/jobs/")?
        .strip_suffix("/artifacts")?
        .parse()
        .ok()
}

fn query_value(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.replace("%20", " ").replace('+', " "))
}

/// The job token of a request: the `JOB-TOKEN` header, else the `token` parameter (the
/// endpoints' `optional :token` param).
fn job_token<B>(req: &Request<B>) -> Option<String> {
    let header = req.headers().get("job-token").and_then(|v| v.to_str().ok());
    header
        .map(String::from)
        .or_else(|| query_value(req.uri().query().unwrap_or(""), "token"))
}

pub async fn api(state: &Arc<Mutex<State>>, req: Request<Incoming>) -> Answer {
    let Some(id) = job_id(req.uri().path()) else {
        return api_error(404, "404 Not Found");
    };
    match *req.method() {
        Method::POST => upload(state, id, req).await,
        Method::GET => download(state, id, &req),
        _ => api_error(405, "405 Method Not Allowed"),
    }
}

/// `POST /jobs/:id/artifacts`: `authenticate_job!` (403 unless the token is this running
/// job's), then `Ci::JobArtifacts::CreateService` (413 "file size has reached maximum size
/// limit" above the limit; `app/services/ci/job_artifacts/create_service.rb`), then 201 with
/// the body `"201"` (`status :created; body "201"`). The runner's uploader does not retry a
/// 403 (`determineUploadState` → `UploadForbidden`).
async fn upload(state: &Arc<Mutex<State>>, id: u64, req: Request<Incoming>) -> Answer {
    let token = job_token(&req);
    let (limit, allowed) = {
        let s = state.lock().unwrap();
        let job = s.jobs.get(&id);
        let allowed = job.is_some_and(|j| j.running && Some(&j.token) == token.as_ref());
        (s.options.max_artifact_size, allowed)
    };
    if !allowed {
        return api_error(403, "403 Forbidden");
    }
    let query = req.uri().query().unwrap_or("").to_string();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let cap = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_add(1 << 20);
    let Ok(collected) = Limited::new(req.into_body(), cap).collect().await else {
        return api_error(413, "file size has reached maximum size limit");
    };
    let body = collected.to_bytes();
    let Some((filename, file)) = file_part(&content_type, &body) else {
        return api_error(400, "400 Bad request - file is missing");
    };
    if file.len() as u64 > limit {
        return api_error(413, "file size has reached maximum size limit");
    }
    let stored = StoredArtifact {
        bytes: file.to_vec(),
        filename,
        artifact_format: query_value(&query, "artifact_format").unwrap_or_else(|| "zip".into()),
        artifact_type: query_value(&query, "artifact_type").unwrap_or_else(|| "archive".into()),
        expire_in: query_value(&query, "expire_in"),
    };
    state.lock().unwrap().artifacts.insert(id, stored);
    text(201, "application/json", "\"201\"")
}

/// The `file` field of a `multipart/form-data` body: its filename and bytes.
fn file_part<'a>(content_type: &str, body: &'a [u8]) -> Option<(String, &'a [u8])> {
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()?
        .trim_matches('"');
    let delimiter = format!("--{boundary}");
    let mut at = find(body, delimiter.as_bytes(), 0)?;
    loop {
        let start = at + delimiter.len();
        let headers_end = find(body, b"\r\n\r\n", start)?;
        let headers = String::from_utf8_lossy(&body[start..headers_end]).to_ascii_lowercase();
        let content = headers_end + 4;
        let next = find(body, format!("\r\n{delimiter}").as_bytes(), content)?;
        if headers.contains("name=\"file\"") {
            let raw = String::from_utf8_lossy(&body[start..headers_end]).into_owned();
            let filename = raw
                .split("filename=\"")
                .nth(1)
                .and_then(|f| f.split('"').next())
                .unwrap_or("")
                .to_string();
            return Some((filename, &body[content..next]));
        }
        at = next + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// `GET /jobs/:id/artifacts`: `authenticate_job_via_dependent_job!` (401 without a running
/// job's token, 403 for an unknown job or one the token's project may not read), then
/// `present_carrierwave_file!` (404 without a file; with object storage and
/// `direct_download=true` a 302 to a signed URL, else the file itself;
/// `lib/api/helpers.rb`).
fn download(state: &Arc<Mutex<State>>, id: u64, req: &Request<Incoming>) -> Answer {
    let token = job_token(req).unwrap_or_default();
    let s = state.lock().unwrap();
    let Some((_, consumer)) = s.job_of(&token) else {
        return api_error(401, "401 Unauthorized");
    };
    let Some(job) = s.jobs.get(&id) else {
        return api_error(403, "403 Forbidden");
    };
    if !s.can_read(&consumer.project, &job.project) {
        return api_error(403, "403 Forbidden");
    }
    let Some(artifact) = s.artifacts.get(&id) else {
        return api_error(404, "404 Not Found");
    };
    let direct = query_value(req.uri().query().unwrap_or(""), "direct_download")
        .is_some_and(|v| v == "true");
    if direct && s.options.object_storage {
        let expires = now() + SIGNED_URL_LIFE;
        let signature = sign(&s.signing_key, id, expires);
        let host = req
            .headers()
            .get("host")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("localhost");
        let location = format!(
            "http://{host}{OBJECT_STORAGE}{id}?X-Expires={expires}&X-Signature={signature}"
        );
        let mut answer = text(
            302,
            "text/html",
            "<html><body>You are being redirected.</body></html>",
        );
        answer
            .headers_mut()
            .insert("location", location.parse().expect("a header"));
        return answer;
    }
    file_answer(artifact)
}

fn file_answer(artifact: &StoredArtifact) -> Answer {
    let mut answer = bytes(
        200,
        "application/octet-stream",
        Bytes::from(artifact.bytes.clone()),
    );
    let disposition = format!("attachment; filename=\"{}\"", artifact.filename);
    answer.headers_mut().insert(
        "content-disposition",
        disposition.parse().expect("a header"),
    );
    answer
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

fn sign(key: &ring::hmac::Key, id: u64, expires: u64) -> String {
    let tag = ring::hmac::sign(key, format!("{id}:{expires}").as_bytes());
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The object store: the signature and expiry are the only authorization (like an S3
/// presigned URL); a `JOB-TOKEN` is neither needed nor looked at. Refusals are S3's
/// `AccessDenied` XML.
pub fn object_storage<B>(state: &Arc<Mutex<State>>, req: &Request<B>) -> Answer {
    let denied = |message: &str| {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code><Message>{message}</Message></Error>"
        );
        text(403, "application/xml", &body)
    };
    let path = req.uri().path();
    let Some(id) = path
        .strip_prefix(OBJECT_STORAGE)
        .and_then(|i| i.parse::<u64>().ok())
    else {
        return denied("Access Denied");
    };
    let query = req.uri().query().unwrap_or("");
    let expires = query_value(query, "X-Expires").and_then(|e| e.parse::<u64>().ok());
    let signature = query_value(query, "X-Signature").unwrap_or_default();
    let s = state.lock().unwrap();
    let Some(expires) = expires else {
        return denied("Query-string authentication requires the Signature and Expires parameters");
    };
    let valid = ring::hmac::verify(
        &s.signing_key,
        format!("{id}:{expires}").as_bytes(),
        &hex(&signature),
    )
    .is_ok();
    if !valid {
        return denied(
            "The request signature we calculated does not match the signature you provided",
        );
    }
    if expires < now() {
        return denied("Request has expired");
    }
    match s.artifacts.get(&id) {
        Some(artifact) => file_answer(artifact),
        None => text(
            404,
            "application/xml",
            "<Error><Code>NoSuchKey</Code></Error>",
        ),
    }
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .filter_map(|i| text.get(2 * i..2 * i + 2))
        .filter_map(|pair| u8::from_str_radix(pair, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_field_is_found_among_other_fields() {
        let body = b"--XX\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nno\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\nContent-Type: application/octet-stream\r\n\r\nPK\x03\x04data\r\n--XX--\r\n";
        let (name, file) =
            file_part("multipart/form-data; boundary=XX", body).expect("a file part");
        assert_eq!(name, "artifacts.zip");
        assert_eq!(file, b"PK\x03\x04data");
    }

    #[test]
    fn job_ids_come_from_the_artifacts_path_only() {
        assert_eq!(job_id("/api/v4/jobs/12/artifacts"), Some(12));
        assert_eq!(job_id("/api/v4/jobs/12/trace"), None);
    }
}

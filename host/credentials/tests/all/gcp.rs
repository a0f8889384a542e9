//! The `gcp` credential kind against loopback servers with Google's documented shapes (no
//! emulator exists for Google's OAuth endpoints or the metadata server):
//! - the token endpoint of the JWT bearer grant verifies the RS256 signature with the key's
//!   public half and checks every claim
//!   (<https://developers.google.com/identity/protocols/oauth2/service-account#authorizingrequests>);
//! - the metadata server answers only with `Metadata-Flavor: Google`
//!   (<https://cloud.google.com/compute/docs/access/authenticate-workloads#applications>).
//!
//! It sets environment variables: it holds `crate::env::lock()` for its whole run.

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use flotilla_credentials::gcp::{GcpConfig, GcpHandle};
use flotilla_credentials::{Credential, CredentialKind, SigningHints};
use flotilla_net::AllowList;
use http_body_util::Full;
use hyper::body::Bytes;

use crate::env::{set, unset};

const EMAIL: &str = "flotilla@my-project.iam.gserviceaccount.com";
const KEY_ID: &str = "0123456789abcdef";

fn rsa_pem(dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&path)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(path).unwrap()
}

fn der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

fn key_json(pem: &str, token_uri: &str) -> String {
    serde_json::json!({
        "type": "service_account",
        "project_id": "my-project",
        "private_key_id": KEY_ID,
        "private_key": pem,
        "client_email": EMAIL,
        "client_id": "1234567890",
        "token_uri": token_uri,
    })
    .to_string()
}

fn b64d(part: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap()
}

/// A token endpoint that checks the JWT bearer grant exactly and mints `ya29.test-N` tokens
/// living `lifetime` seconds. What it refused is kept for the asserts.
struct TokenEndpoint {
    url: String,
    minted: Arc<AtomicUsize>,
    lifetime: Arc<AtomicU64>,
    refusals: Arc<Mutex<Vec<String>>>,
}

async fn token_endpoint(public_key: Vec<u8>) -> TokenEndpoint {
    let minted = Arc::new(AtomicUsize::new(0));
    let lifetime = Arc::new(AtomicU64::new(3600));
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let url_cell: Arc<Mutex<String>> = Arc::new(Mutex::new(String::new()));
    let (m, l, r, u) = (
        minted.clone(),
        lifetime.clone(),
        refusals.clone(),
        url_cell.clone(),
    );
    let addr = flotilla_peers::serve::serve_http(
        move |req: hyper::Request<hyper::body::Incoming>| {
            let (minted, lifetime, refusals, url) =
                (m.clone(), l.clone(), r.clone(), u.lock().unwrap().clone());
            let public_key = public_key.clone();
            async move {
                use http_body_util::BodyExt as _;
                let ok_type = req
                    .headers()
                    .get("content-type")
                    .is_some_and(|v| v == "application/x-www-form-urlencoded");
                let post = req.method() == "POST" && req.uri().path() == "/token";
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let form = flotilla_peers::serve::form(&body);
                let field = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                let verdict = (|| {
                    if !post || !ok_type {
                        return Err("not a form POST to /token".to_string());
                    }
                    if field("grant_type").as_deref()
                        != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
                    {
                        return Err("wrong grant_type".into());
                    }
                    let jwt = field("assertion").ok_or("no assertion")?;
                    let parts: Vec<&str> = jwt.split('.').collect();
                    if parts.len() != 3 {
                        return Err("not a JWS".into());
                    }
                    let signed = format!("{}.{}", parts[0], parts[1]);
                    ring::signature::UnparsedPublicKey::new(
                        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                        &public_key,
                    )
                    .verify(signed.as_bytes(), &b64d(parts[2]))
                    .map_err(|_| "Invalid JWT Signature.".to_string())?;
                    let header: serde_json::Value =
                        serde_json::from_slice(&b64d(parts[0])).unwrap();
                    let claims: serde_json::Value =
                        serde_json::from_slice(&b64d(parts[1])).unwrap();
                    let (iat, exp) = (
                        claims["iat"].as_u64().unwrap_or(0),
                        claims["exp"].as_u64().unwrap_or(0),
                    );
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs();
                    let checks = [
                        (header["alg"] == "RS256", "alg"),
                        (header["kid"] == KEY_ID, "kid"),
                        (claims["iss"] == EMAIL, "iss"),
                        (claims["aud"] == url.as_str(), "aud"),
                        (
                            claims["scope"]
                                == "https://www.googleapis.com/auth/compute https://www.googleapis.com/auth/cloud-platform",
                            "scope",
                        ),
                        (exp == iat + 3600 && iat.abs_diff(now) < 60, "iat/exp"),
                    ];
                    for (ok, what) in checks {
                        if !ok {
                            return Err(format!("bad {what}"));
                        }
                    }
                    Ok(())
                })();
                let (status, json) = match verdict {
                    Ok(()) => {
                        let n = minted.fetch_add(1, Ordering::SeqCst) + 1;
                        (
                            200,
                            serde_json::json!({
                                "access_token": format!("ya29.test-{n}"),
                                "expires_in": lifetime.load(Ordering::SeqCst),
                                "token_type": "Bearer",
                            }),
                        )
                    }
                    Err(why) => {
                        refusals.lock().unwrap().push(why.clone());
                        (
                            400,
                            serde_json::json!({"error": "invalid_grant", "error_description": why}),
                        )
                    }
                };
                Ok::<_, Infallible>(
                    hyper::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(json.to_string())))
                        .unwrap(),
                )
            }
        },
    )
    .await;
    let url = format!("http://{addr}/token");
    *url_cell.lock().unwrap() = url.clone();
    TokenEndpoint {
        url,
        minted,
        lifetime,
        refusals,
    }
}

/// A metadata server that hands out tokens only to `Metadata-Flavor: Google` requests for the
/// configured scopes.
async fn metadata_server(fetches: Arc<AtomicUsize>) -> String {
    let addr = flotilla_peers::serve::serve_http(
        move |req: hyper::Request<hyper::body::Incoming>| {
            let fetches = fetches.clone();
            async move {
                let flavored = req
                    .headers()
                    .get("metadata-flavor")
                    .is_some_and(|v| v == "Google");
                let right = req.uri().path()
                    == "/computeMetadata/v1/instance/service-accounts/default/token"
                    && req.uri().query()
                        == Some("scopes=https://www.googleapis.com/auth/cloud-platform");
                let (status, body) = if flavored && right {
                    let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
                    (
                        200,
                        serde_json::json!({"access_token": format!("ya29.metadata-{n}"), "expires_in": 3599, "token_type": "Bearer"})
                            .to_string(),
                    )
                } else {
                    (403, "Missing Metadata-Flavor:Google header.".to_string())
                };
                Ok::<_, Infallible>(
                    hyper::Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::from(body)))
                        .unwrap(),
                )
            }
        },
    )
    .await;
    format!("http://{addr}")
}

const AUDIENCE: &str =
    "//iam.googleapis.com/projects/123456/locations/global/workloadIdentityPools/ci/providers/aws";
const SUBJECT: &str = "eyJhbGciOiJSUzI1NiJ9.subject-token-from-the-platform.sig";
const AWS_TOKEN_TYPE: &str = "urn:ietf:params:aws:token-type:aws4_request";
const AWS_KEY_ID: &str = "AKIAIOSFODNN7FEDERAT";

/// What Google's STS checks of an AWS subject token before it forwards the request to AWS
/// (google-auth-library-python `aws.py`; <https://google.aip.dev/auth/4117>): the URL-quoted
/// JSON of a signed `POST` to the regional `GetCallerIdentity`, its headers sorted by key and
/// naming the audience in `x-goog-cloud-target-resource`, signed with SigV4 for `sts` in the
/// request's region.
fn aws_subject_is_valid(token: &str) -> bool {
    let decoded = flotilla_peers::serve::form(format!("t={token}").as_bytes());
    let Some((_, json)) = decoded.first() else {
        return false;
    };
    let Ok(request) = serde_json::from_str::<serde_json::Value>(json) else {
        return false;
    };
    let headers: Vec<(String, String)> = request["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| {
            Some((
                h["key"].as_str()?.to_string(),
                h["value"].as_str()?.to_string(),
            ))
        })
        .collect();
    let header = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    };
    let mut sorted = headers.clone();
    sorted.sort();
    request["method"] == "POST"
        && request["url"]
            == "https://sts.us-east-1.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15"
        && sorted == headers
        && header("x-goog-cloud-target-resource") == Some(AUDIENCE)
        && header("host") == Some("sts.us-east-1.amazonaws.com")
        && header("x-amz-date").is_some()
        && header("authorization").is_some_and(|a| {
            a.starts_with("AWS4-HMAC-SHA256 Credential=")
                && a.contains(&format!("{AWS_KEY_ID}/"))
                && a.contains("/us-east-1/sts/aws4_request")
                && a.contains("x-goog-cloud-target-resource")
        })
}

/// An STS token exchange and IAM's generateAccessToken: the STS checks the subject token the
/// file holds; impersonation needs the federated token.
async fn federation(exchanges: Arc<AtomicUsize>) -> String {
    let addr = flotilla_peers::serve::serve_http(
        move |req: hyper::Request<hyper::body::Incoming>| {
            let exchanges = exchanges.clone();
            async move {
                use http_body_util::BodyExt as _;
                let path = req.uri().path().to_string();
                let auth = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let text = String::from_utf8_lossy(&body).to_string();
                let form = flotilla_peers::serve::form(text.as_bytes());
                let field = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                let (status, answer) = if path == "/v1/token" {
                    let ok = field("grant_type").as_deref()
                        == Some("urn:ietf:params:oauth:grant-type:token-exchange")
                        && field("audience").as_deref() == Some(AUDIENCE)
                        && field("requested_token_type").as_deref()
                            == Some("urn:ietf:params:oauth:token-type:access_token")
                        && matches!(
                            field("subject_token_type").as_deref(),
                            Some("urn:ietf:params:oauth:token-type:jwt" | AWS_TOKEN_TYPE)
                        )
                        && field("scope").as_deref()
                            == Some("https://www.googleapis.com/auth/cloud-platform");
                    if !ok {
                        (400, serde_json::json!({"error": "invalid_request", "error_description": "bad token exchange"}))
                    } else if field("subject_token").as_deref() != Some(SUBJECT)
                        && !aws_subject_is_valid(&field("subject_token").unwrap_or_default())
                    {
                        (400, serde_json::json!({"error": "invalid_grant", "error_description": "The ID Token is invalid."}))
                    } else {
                        let n = exchanges.fetch_add(1, Ordering::SeqCst) + 1;
                        (200, serde_json::json!({
                            "access_token": format!("ya29.federated-{n}"),
                            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                            "token_type": "Bearer", "expires_in": 3600,
                        }))
                    }
                } else if path == format!("/v1/projects/-/serviceAccounts/{EMAIL}:generateAccessToken") {
                    let scopes: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                    if auth.starts_with("Bearer ya29.federated-")
                        && scopes["scope"][0] == "https://www.googleapis.com/auth/cloud-platform"
                    {
                        let expires = chrono::Utc::now() + chrono::Duration::hours(1);
                        (200, serde_json::json!({
                            "accessToken": "ya29.impersonated",
                            "expireTime": expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        }))
                    } else {
                        (403, serde_json::json!({"error": {"code": 403, "message": "Permission 'iam.serviceAccounts.getAccessToken' denied", "status": "PERMISSION_DENIED"}}))
                    }
                } else {
                    (404, serde_json::json!({}))
                };
                Ok::<_, Infallible>(
                    hyper::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(answer.to_string())))
                        .unwrap(),
                )
            }
        },
    )
    .await;
    format!("http://{addr}")
}

fn external_account(
    dir: &Path,
    sts: &str,
    subject_file: &Path,
    impersonate: bool,
    json_format: bool,
) -> std::path::PathBuf {
    let mut config = serde_json::json!({
        "type": "external_account",
        "audience": AUDIENCE,
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": format!("{sts}/v1/token"),
        "credential_source": { "file": subject_file },
    });
    if impersonate {
        config["service_account_impersonation_url"] = serde_json::json!(format!(
            "{sts}/v1/projects/-/serviceAccounts/{EMAIL}:generateAccessToken"
        ));
    }
    if json_format {
        config["credential_source"]["format"] =
            serde_json::json!({"type": "json", "subject_token_field_name": "id_token"});
    }
    let path = dir.join(format!("external-{impersonate}-{json_format}.json"));
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn credential(config: GcpConfig) -> Credential {
    Credential {
        name: "gcp".into(),
        kind: CredentialKind::Gcp(GcpHandle::new(config)),
        hosts: AllowList::parse(&["https://compute.googleapis.com"]).unwrap(),
    }
}

/// The Authorization header the credential puts on a request, or its error.
async fn authorize(c: &Credential) -> Result<http::HeaderValue, String> {
    let mut req = http::Request::get("https://compute.googleapis.com/compute/v1/projects/p")
        .body(())
        .unwrap();
    c.apply(&mut req, b"", &SigningHints::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(req.headers()["authorization"].clone())
}

#[tokio::test(flavor = "current_thread")]
async fn gcp_tokens_from_a_service_account_key_and_the_metadata_server() {
    let _env = crate::env::lock().await;
    unset("GOOGLE_APPLICATION_CREDENTIALS");
    unset("GCE_METADATA_HOST");
    let dir = tempfile::tempdir().unwrap();
    let pem = rsa_pem(dir.path(), "key.pem");
    let public = ring::signature::RsaKeyPair::from_pkcs8(&der(&pem))
        .unwrap()
        .public()
        .as_ref()
        .to_vec();
    let endpoint = token_endpoint(public).await;
    let key_file = dir.path().join("key.json");
    std::fs::write(&key_file, key_json(&pem, &endpoint.url)).unwrap();
    let scopes = vec![
        "https://www.googleapis.com/auth/compute".to_string(),
        "https://www.googleapis.com/auth/cloud-platform".to_string(),
    ];

    // A key file: a verified grant, the token sent as a sensitive bearer, then cached.
    let c = credential(GcpConfig {
        service_account_key: Some(flotilla_credentials::SecretSource::File(key_file.clone())),
        scopes: scopes.clone(),
        ..GcpConfig::default()
    });
    let auth = authorize(&c).await.unwrap();
    assert_eq!(auth, "Bearer ya29.test-1", "{:?}", endpoint.refusals);
    assert!(auth.is_sensitive());
    assert_eq!(authorize(&c).await.unwrap(), "Bearer ya29.test-1");
    assert_eq!(endpoint.minted.load(Ordering::SeqCst), 1, "not cached");

    // A short-lived token is minted again at half its life.
    endpoint.lifetime.store(2, Ordering::SeqCst);
    let short = credential(GcpConfig {
        service_account_key: Some(flotilla_credentials::SecretSource::File(key_file.clone())),
        scopes: scopes.clone(),
        ..GcpConfig::default()
    });
    assert_eq!(authorize(&short).await.unwrap(), "Bearer ya29.test-2");
    assert_eq!(authorize(&short).await.unwrap(), "Bearer ya29.test-2");
    // Deliberate: half of the 2 s token lifetime must pass before it is minted again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(authorize(&short).await.unwrap(), "Bearer ya29.test-3");
    endpoint.lifetime.store(3600, Ordering::SeqCst);

    // A key the endpoint does not know: its answer in the error, and nothing secret.
    let other = rsa_pem(dir.path(), "other.pem");
    let wrong_file = dir.path().join("wrong.json");
    std::fs::write(&wrong_file, key_json(&other, &endpoint.url)).unwrap();
    let wrong = credential(GcpConfig {
        service_account_key: Some(flotilla_credentials::SecretSource::File(wrong_file)),
        scopes: scopes.clone(),
        ..GcpConfig::default()
    });
    let e = authorize(&wrong).await.unwrap_err();
    assert!(
        e.contains("invalid_grant") && e.contains("Invalid JWT Signature"),
        "{e}"
    );
    // A refusal is remembered: the next request does not ask the endpoint again.
    let again = authorize(&wrong).await.unwrap_err();
    assert!(again.contains("asked again in"), "{again}");
    assert_eq!(
        endpoint.refusals.lock().unwrap().len(),
        1,
        "the bad key was tried twice"
    );
    let other_body: String = other.lines().filter(|l| !l.starts_with("-----")).collect();
    for secret in [&other_body[..40], "eyJ", "assertion"] {
        assert!(!e.contains(secret), "the error shows {secret}: {e}");
    }

    // A file that is not a key says so, by line and column, without its content.
    let junk = dir.path().join("junk.json");
    std::fs::write(
        &junk,
        "{\"type\": \"service_account\",\n \"private_key\": 7}",
    )
    .unwrap();
    let e = authorize(&credential(GcpConfig {
        service_account_key: Some(flotilla_credentials::SecretSource::File(junk)),
        ..GcpConfig::default()
    }))
    .await
    .unwrap_err();
    assert!(e.contains("not valid JSON") && e.contains("line 2"), "{e}");

    // Eight requests at once on a cold credential mint one token (single flight).
    let before = endpoint.minted.load(Ordering::SeqCst);
    let cold = credential(GcpConfig {
        service_account_key: Some(flotilla_credentials::SecretSource::File(key_file.clone())),
        scopes: scopes.clone(),
        ..GcpConfig::default()
    });
    let all = futures_util::future::join_all((0..8).map(|_| authorize(&cold))).await;
    assert!(
        all.iter()
            .all(|a| a.as_ref().is_ok_and(|v| v == all[0].as_ref().unwrap()))
    );
    assert_eq!(
        endpoint.minted.load(Ordering::SeqCst),
        before + 1,
        "not single-flight"
    );

    // GOOGLE_APPLICATION_CREDENTIALS names the key when the config does not.
    set(
        "GOOGLE_APPLICATION_CREDENTIALS",
        &key_file.display().to_string(),
    );
    let from_env = credential(GcpConfig {
        scopes: scopes.clone(),
        ..GcpConfig::default()
    });
    assert_eq!(authorize(&from_env).await.unwrap(), "Bearer ya29.test-5");
    unset("GOOGLE_APPLICATION_CREDENTIALS");

    // No key anywhere: the metadata server, asked with Metadata-Flavor: Google.
    let fetches = Arc::new(AtomicUsize::new(0));
    let metadata = metadata_server(fetches.clone()).await;
    let from_metadata = credential(GcpConfig {
        metadata_endpoint: Some(metadata.clone()),
        ..GcpConfig::default()
    });
    assert_eq!(
        authorize(&from_metadata).await.unwrap(),
        "Bearer ya29.metadata-1"
    );
    assert_eq!(
        authorize(&from_metadata).await.unwrap(),
        "Bearer ya29.metadata-1"
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    // GCE_METADATA_HOST, as GKE and the Google libraries use it.
    set("GCE_METADATA_HOST", metadata.trim_start_matches("http://"));
    assert_eq!(
        authorize(&credential(GcpConfig::default())).await.unwrap(),
        "Bearer ya29.metadata-2"
    );
    unset("GCE_METADATA_HOST");
    assert!(endpoint.refusals.lock().unwrap().len() == 1);

    // Workload identity federation: the subject token from a file, exchanged at the STS.
    let exchanges = Arc::new(AtomicUsize::new(0));
    let sts = federation(exchanges.clone()).await;
    let subject_file = dir.path().join("subject-token");
    std::fs::write(&subject_file, format!("{SUBJECT}\n")).unwrap();
    let federated = |path: std::path::PathBuf| {
        credential(GcpConfig {
            service_account_key: Some(flotilla_credentials::SecretSource::File(path)),
            ..GcpConfig::default()
        })
    };
    let plain = federated(external_account(
        dir.path(),
        &sts,
        &subject_file,
        false,
        false,
    ));
    assert_eq!(authorize(&plain).await.unwrap(), "Bearer ya29.federated-1");
    // ... then a service account's token generated with the federated one.
    let impersonating = federated(external_account(
        dir.path(),
        &sts,
        &subject_file,
        true,
        false,
    ));
    assert_eq!(
        authorize(&impersonating).await.unwrap(),
        "Bearer ya29.impersonated"
    );
    assert_eq!(exchanges.load(Ordering::SeqCst), 2);
    // A JSON subject token file with the token in a named field.
    let json_subject = dir.path().join("subject.json");
    std::fs::write(
        &json_subject,
        serde_json::json!({ "id_token": SUBJECT }).to_string(),
    )
    .unwrap();
    let from_json = federated(external_account(
        dir.path(),
        &sts,
        &json_subject,
        false,
        true,
    ));
    assert_eq!(
        authorize(&from_json).await.unwrap(),
        "Bearer ya29.federated-3"
    );
    // A subject token the STS does not accept: its answer, and not the token.
    std::fs::write(&subject_file, "eyJ.not-the-platform-token.sig").unwrap();
    let stale = federated(external_account(
        dir.path(),
        &sts,
        &subject_file,
        false,
        false,
    ));
    let e = authorize(&stale).await.unwrap_err();
    assert!(
        e.contains("invalid_grant") && e.contains("The ID Token is invalid"),
        "{e}"
    );
    assert!(!e.contains("not-the-platform-token"), "{e}");

    // A URL source (Azure's IMDS, a metadata server), with the headers it requires.
    std::fs::write(&subject_file, format!("{SUBJECT}\n")).unwrap();
    let source = flotilla_peers::serve::serve_http(
        |req: hyper::Request<hyper::body::Incoming>| async move {
            let ok = req.headers().get("metadata").is_some_and(|v| v == "true");
            Ok::<_, Infallible>(
                hyper::Response::builder()
                    .status(if ok { 200 } else { 400 })
                    .body(Full::new(Bytes::from(if ok { SUBJECT } else { "no" })))
                    .unwrap(),
            )
        },
    )
    .await;
    let with_source = |name: &str, source: serde_json::Value, token_type: &str| {
        let config = serde_json::json!({
            "type": "external_account",
            "audience": AUDIENCE,
            "subject_token_type": token_type,
            "token_url": format!("{sts}/v1/token"),
            "credential_source": source,
        });
        let path = dir.path().join(format!("external-{name}.json"));
        std::fs::write(&path, config.to_string()).unwrap();
        federated(path)
    };
    let from_url = with_source(
        "url",
        serde_json::json!({"url": format!("http://{source}/token"), "headers": {"Metadata": "true"}}),
        "urn:ietf:params:oauth:token-type:jwt",
    );
    assert!(
        authorize(&from_url)
            .await
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("Bearer ya29.federated-")
    );

    // An executable source: only when allowed, told the audience, its answer's token.
    let script = dir.path().join("token-source.sh");
    let expires = chrono::Utc::now().timestamp() + 3600;
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$GOOGLE_EXTERNAL_ACCOUNT_AUDIENCE\" = '{AUDIENCE}' ] || exit 3\n\
             echo '{{\"version\": 1, \"success\": true, \"token_type\": \"urn:ietf:params:oauth:token-type:jwt\", \"id_token\": \"{SUBJECT}\", \"expiration_time\": {expires}}}'\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    let from_executable = with_source(
        "executable",
        serde_json::json!({"executable": {"command": script.display().to_string(), "timeout_millis": 5000}}),
        "urn:ietf:params:oauth:token-type:jwt",
    );
    let refused = authorize(&from_executable).await.unwrap_err();
    assert!(
        refused.contains("GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES"),
        "{refused}"
    );
    set("GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES", "1");
    let from_executable = with_source(
        "executable2",
        serde_json::json!({"executable": {"command": script.display().to_string(), "timeout_millis": 5000}}),
        "urn:ietf:params:oauth:token-type:jwt",
    );
    assert!(
        authorize(&from_executable)
            .await
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("Bearer ya29.federated-")
    );
    unset("GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES");

    // The AWS form: a GetCallerIdentity request signed with the host's AWS keys.
    set("AWS_ACCESS_KEY_ID", AWS_KEY_ID);
    set(
        "AWS_SECRET_ACCESS_KEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYFEDERATED",
    );
    set("AWS_REGION", "us-east-1");
    let from_aws = with_source(
        "aws",
        serde_json::json!({
            "environment_id": "aws1",
            "region_url": "http://169.254.169.254/latest/meta-data/placement/availability-zone",
            "url": "http://169.254.169.254/latest/meta-data/iam/security-credentials",
            "regional_cred_verification_url": "https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15",
        }),
        AWS_TOKEN_TYPE,
    );
    let header = authorize(&from_aws)
        .await
        .unwrap_or_else(|e| panic!("aws: {e}"));
    assert!(
        header
            .to_str()
            .unwrap()
            .starts_with("Bearer ya29.federated-")
    );
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"] {
        unset(var);
    }
}

//! The `azure` credential kind against loopback servers with Microsoft's documented shapes
//! (no emulator exists for Entra ID or the instance metadata service):
//! - the token endpoint of the client credentials grant
//!   (<https://learn.microsoft.com/en-us/entra/identity-platform/v2-oauth2-client-creds-grant-flow>)
//!   checks the secret, verifies a certificate assertion's PS256 signature with the public key
//!   taken from the certificate and its `x5t#S256` against the certificate, as MSAL sends it
//!   today for Entra ID (MSAL .NET 4.59.1+ `JsonWebToken.cs`, MSAL Go 1.4.2+, MSAL Python
//!   1.30+); RS256, or a SHA-1 `x5t`, is refused here, as a mix no current client sends
//!   (<https://learn.microsoft.com/en-us/entra/identity-platform/certificate-credentials>),
//!   and checks a federated token against the file's;
//! - the managed identity endpoint answers only with `Metadata: true`
//!   (<https://learn.microsoft.com/en-us/entra/identity/managed-identities-azure-resources/how-to-use-vm-token#get-a-token-using-http>).
//!
//! It sets environment variables: it holds `crate::env::lock()` for its whole run.

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use flotilla_credentials::azure::{AzureConfig, AzureHandle};
use flotilla_credentials::{Credential, CredentialKind, Secret, SecretSource, SigningHints};
use flotilla_net::AllowList;
use http_body_util::Full;
use hyper::body::Bytes;

use crate::env::{set, unset};

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "6731de76-14a6-49ae-97bc-6eba6914391e";
const SECRET: &str = "qWgdYAmab0YSkuL1qKv5bPX~really-secret~";
const FEDERATED: &str = "eyJhbGciOiJSUzI1NiJ9.federated-service-account-token.sig";

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A self-signed certificate and its key in one PEM file, and the public key as the
/// certificate states it (PKCS#1 DER, as ring verifies).
fn certificate(dir: &Path) -> (std::path::PathBuf, Vec<u8>, Vec<u8>) {
    let (key, cert) = (dir.join("key.pem"), dir.join("cert.pem"));
    let (key_s, cert_s) = (key.display().to_string(), cert.display().to_string());
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=flotilla",
        "-keyout",
        &key_s,
        "-out",
        &cert_s,
    ]);
    let spki = openssl(&["x509", "-in", &cert_s, "-pubkey", "-noout"]);
    let spki_file = dir.join("spki.pem");
    std::fs::write(&spki_file, spki).unwrap();
    let pkcs1 = openssl(&[
        "rsa",
        "-pubin",
        "-in",
        &spki_file.display().to_string(),
        "-RSAPublicKey_out",
        "-outform",
        "DER",
    ]);
    let cert_pem = std::fs::read_to_string(&cert).unwrap();
    let cert_der = base64::engine::general_purpose::STANDARD
        .decode(
            cert_pem
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .unwrap();
    let both = dir.join("client.pem");
    std::fs::write(
        &both,
        format!("{cert_pem}{}", std::fs::read_to_string(&key).unwrap()),
    )
    .unwrap();
    (both, pkcs1, cert_der)
}

fn b64d(part: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap()
}

fn json(status: u16, v: serde_json::Value) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

struct Entra {
    authority: String,
    minted: Arc<AtomicUsize>,
    refused: Arc<Mutex<Vec<String>>>,
}

async fn entra(public_key: Vec<u8>, cert_der: Vec<u8>) -> Entra {
    let minted = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let base = Arc::new(Mutex::new(String::new()));
    let (m, r, b) = (minted.clone(), refused.clone(), base.clone());
    let addr = flotilla_peers::serve::serve_http(
        move |req: hyper::Request<hyper::body::Incoming>| {
            let (minted, refused, base) = (m.clone(), r.clone(), b.lock().unwrap().clone());
            let (public_key, cert_der) = (public_key.clone(), cert_der.clone());
            async move {
                use http_body_util::BodyExt as _;
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let form = flotilla_peers::serve::form(&body);
                let field = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                let endpoint = format!("{base}/{TENANT}/oauth2/v2.0/token");
                let verdict: Result<&str, (&str, String)> = (|| {
                    if path != format!("/{TENANT}/oauth2/v2.0/token") {
                        return Err(("invalid_request", format!("AADSTS90002: Tenant not found ({path})")));
                    }
                    if field("client_id").as_deref() != Some(CLIENT)
                        || field("grant_type").as_deref() != Some("client_credentials")
                        || field("scope").as_deref() != Some("https://management.azure.com/.default")
                    {
                        return Err(("invalid_request", "AADSTS900144: bad client_id, grant_type or scope".into()));
                    }
                    if let Some(secret) = field("client_secret") {
                        return if secret == SECRET {
                            Ok("secret")
                        } else {
                            Err(("invalid_client", "AADSTS7000215: Invalid client secret provided.".into()))
                        };
                    }
                    if field("client_assertion_type").as_deref()
                        != Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
                    {
                        return Err(("invalid_request", "AADSTS50012: no client credential".into()));
                    }
                    let assertion = field("client_assertion").unwrap_or_default();
                    if assertion == FEDERATED {
                        return Ok("federated");
                    }
                    let parts: Vec<&str> = assertion.split('.').collect();
                    if parts.len() != 3 {
                        return Err(("invalid_client", "AADSTS50027: Invalid JWT token".into()));
                    }
                    ring::signature::UnparsedPublicKey::new(
                        &ring::signature::RSA_PSS_2048_8192_SHA256,
                        &public_key,
                    )
                    .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &b64d(parts[2]))
                    .map_err(|_| ("invalid_client", "AADSTS700027: signature verification failed".to_string()))?;
                    let header: serde_json::Value = serde_json::from_slice(&b64d(parts[0])).unwrap();
                    let claims: serde_json::Value = serde_json::from_slice(&b64d(parts[1])).unwrap();
                    let thumbprint = base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .encode(ring::digest::digest(&ring::digest::SHA256, &cert_der));
                    let (nbf, exp) = (claims["nbf"].as_u64().unwrap_or(0), claims["exp"].as_u64().unwrap_or(0));
                    for (ok, what) in [
                        (header["alg"] == "PS256", "alg"),
                        (header.get("x5t").is_none(), "x5t (SHA-1)"),
                        (header["x5t#S256"] == thumbprint.as_str(), "x5t#S256"),
                        (claims["aud"] == endpoint.as_str(), "aud"),
                        (claims["iss"] == CLIENT && claims["sub"] == CLIENT, "iss/sub"),
                        (claims["jti"].as_str().is_some_and(|j| j.len() >= 16), "jti"),
                        (exp > nbf && exp - nbf <= 600, "nbf/exp"),
                    ] {
                        if !ok {
                            return Err(("invalid_client", format!("AADSTS700027: bad {what}")));
                        }
                    }
                    Ok("cert")
                })();
                Ok::<_, Infallible>(match verdict {
                    Ok(flow) => {
                        let n = minted.fetch_add(1, Ordering::SeqCst) + 1;
                        json(200, serde_json::json!({
                            "token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599,
                            "access_token": format!("eyJ0eXAi.azure-{flow}-{n}"),
                        }))
                    }
                    Err((error, description)) => {
                        refused.lock().unwrap().push(description.clone());
                        json(401, serde_json::json!({
                            "error": error, "error_description": description,
                            "error_codes": [7000215], "trace_id": "0000", "correlation_id": "0000",
                        }))
                    }
                })
            }
        },
    )
    .await;
    let authority = format!("http://{addr}");
    *base.lock().unwrap() = authority.clone();
    Entra {
        authority,
        minted,
        refused,
    }
}

async fn imds(fetches: Arc<AtomicUsize>) -> String {
    let addr = flotilla_peers::serve::serve_http(
        move |req: hyper::Request<hyper::body::Incoming>| {
            let fetches = fetches.clone();
            async move {
                let header = req.headers().get("metadata").is_some_and(|v| v == "true");
                let right = req.uri().path() == "/metadata/identity/oauth2/token"
                    && req.uri().query()
                        == Some("api-version=2018-02-01&resource=https%3A%2F%2Fmanagement.azure.com%2F");
                Ok::<_, Infallible>(if header && right {
                    let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
                    json(200, serde_json::json!({
                        "access_token": format!("eyJ0eXAi.azure-mi-{n}"), "refresh_token": "",
                        "expires_in": "3599", "expires_on": "1506484173", "not_before": "1506480273",
                        "resource": "https://management.azure.com/", "token_type": "Bearer",
                    }))
                } else {
                    json(400, serde_json::json!({"error": "invalid_request", "error_description": "Required metadata header not specified"}))
                })
            }
        },
    )
    .await;
    format!("http://{addr}")
}

fn credential(config: AzureConfig) -> Credential {
    Credential {
        name: "azure".into(),
        kind: CredentialKind::Azure(AzureHandle::new(config)),
        hosts: AllowList::parse(&["https://management.azure.com"]).unwrap(),
    }
}

async fn authorize(c: &Credential) -> Result<String, String> {
    let mut req = http::Request::get("https://management.azure.com/subscriptions")
        .body(())
        .unwrap();
    c.apply(&mut req, b"", &SigningHints::default())
        .await
        .map_err(|e| e.to_string())?;
    let v = &req.headers()["authorization"];
    assert!(v.is_sensitive());
    Ok(v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "current_thread")]
async fn azure_tokens_by_secret_certificate_workload_identity_and_managed_identity() {
    let _env = crate::env::lock().await;
    for v in [
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_FEDERATED_TOKEN_FILE",
        "AZURE_AUTHORITY_HOST",
    ] {
        unset(v);
    }
    let dir = tempfile::tempdir().unwrap();
    let (pem, public_key, cert_der) = certificate(dir.path());
    let entra = entra(public_key, cert_der).await;
    let app = |proof: AzureConfig| AzureConfig {
        tenant_id: Some(TENANT.into()),
        client_id: Some(CLIENT.into()),
        authority_host: Some(entra.authority.clone()),
        ..proof
    };

    // A client secret: minted once, then cached.
    let c = credential(app(AzureConfig {
        client_secret: Some(SecretSource::Value(Secret::new(SECRET))),
        ..AzureConfig::default()
    }));
    assert_eq!(
        authorize(&c).await.unwrap(),
        "Bearer eyJ0eXAi.azure-secret-1"
    );
    assert_eq!(
        authorize(&c).await.unwrap(),
        "Bearer eyJ0eXAi.azure-secret-1"
    );
    assert_eq!(entra.minted.load(Ordering::SeqCst), 1);

    // A wrong secret: Entra ID's answer, held, and no secret in the error.
    let wrong = credential(app(AzureConfig {
        client_secret: Some(SecretSource::Value(Secret::new("wrong-secret-value-123"))),
        ..AzureConfig::default()
    }));
    let e = authorize(&wrong).await.unwrap_err();
    assert!(
        e.contains("invalid_client") && e.contains("AADSTS7000215"),
        "{e}"
    );
    assert!(
        !e.contains("wrong-secret-value-123") && !e.contains(SECRET),
        "{e}"
    );
    assert!(
        authorize(&wrong)
            .await
            .unwrap_err()
            .contains("asked again in")
    );
    assert_eq!(entra.refused.lock().unwrap().len(), 1);

    // A certificate: the assertion verifies against the certificate's key and thumbprint.
    let cert = credential(app(AzureConfig {
        certificate: Some(SecretSource::File(pem.clone())),
        ..AzureConfig::default()
    }));
    assert_eq!(
        authorize(&cert).await,
        Ok("Bearer eyJ0eXAi.azure-cert-2".to_string()),
        "{:?}",
        entra.refused.lock().unwrap()
    );

    // Workload identity as the AKS webhook sets it up: nothing in the config.
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, format!("{FEDERATED}\n")).unwrap();
    set(
        "AZURE_FEDERATED_TOKEN_FILE",
        &token_file.display().to_string(),
    );
    set("AZURE_CLIENT_ID", CLIENT);
    set("AZURE_TENANT_ID", TENANT);
    set("AZURE_AUTHORITY_HOST", &format!("{}/", entra.authority));
    assert_eq!(
        authorize(&credential(AzureConfig::default())).await,
        Ok("Bearer eyJ0eXAi.azure-federated-3".to_string())
    );
    for v in [
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_FEDERATED_TOKEN_FILE",
        "AZURE_AUTHORITY_HOST",
    ] {
        unset(v);
    }

    // Managed identity: the metadata endpoint with `Metadata: true`; its expires_in is text.
    let fetches = Arc::new(AtomicUsize::new(0));
    let mi = credential(AzureConfig {
        imds_endpoint: Some(imds(fetches.clone()).await),
        ..AzureConfig::default()
    });
    assert_eq!(authorize(&mi).await.unwrap(), "Bearer eyJ0eXAi.azure-mi-1");
    assert_eq!(authorize(&mi).await.unwrap(), "Bearer eyJ0eXAi.azure-mi-1");
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "the text expires_in was not cached"
    );
}

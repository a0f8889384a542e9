//! The CNCF distribution registry (Debian `docker-registry`) on loopback, in three modes:
//! anonymous, htpasswd basic auth, and token auth backed by a small ES256 JWT issuer that
//! really grants per-user scopes (a reader gets pull only).

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;

use crate::poll;

/// How the registry authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Anonymous,
    Basic,
    Token,
}

/// Users every authenticated mode knows: (user, password, may push).
pub const WRITER: (&str, &str) = ("alice", "alice-secret-pw");
pub const READER: (&str, &str) = ("reader", "reader-secret-pw");

pub struct Registry {
    pub mode: Mode,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    _issuer: Option<tokio::task::JoinHandle<()>>,
}

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    l.local_addr().unwrap_or_else(|e| panic!("{e}"))
}

fn binary() -> String {
    let bin = std::env::var("FLOTILLA_REGISTRY_BIN").unwrap_or_else(|_| "docker-registry".into());
    if Command::new(&bin).arg("--version").output().is_err() {
        panic!(
            "{bin} not found: install Debian's docker-registry (scripts/test.sh does) or set FLOTILLA_REGISTRY_BIN"
        );
    }
    bin
}

fn htpasswd(dir: &Path) -> PathBuf {
    let path = dir.join("htpasswd");
    let mut text = String::new();
    for (u, p) in [WRITER, READER] {
        let out = Command::new("htpasswd")
            .args(["-Bbn", u, p])
            .output()
            .unwrap_or_else(|e| panic!("htpasswd (apache2-utils): {e}"));
        text.push_str(String::from_utf8_lossy(&out.stdout).trim());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    path
}

impl Registry {
    /// Starts a registry in `mode`; token mode also starts the issuer on this runtime.
    pub async fn start(mode: Mode) -> Registry {
        Self::start_with(mode, false).await
    }

    /// Starts a registry serving HTTPS with a certificate from a private CA (`ca_file`).
    pub async fn start_tls(mode: Mode) -> Registry {
        Self::start_with(mode, true).await
    }

    async fn start_with(mode: Mode, tls: bool) -> Registry {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let addr = free_port();
        let mut auth = String::new();
        let mut issuer = None;
        match mode {
            Mode::Anonymous => {}
            Mode::Basic => {
                let file = htpasswd(dir.path());
                auth = format!(
                    "auth:\n  htpasswd:\n    realm: flotilla-test\n    path: {}\n",
                    file.display()
                );
            }
            Mode::Token => {
                let (realm, cert, handle) = token_issuer().await;
                let bundle = dir.path().join("token.pem");
                std::fs::write(&bundle, cert).unwrap_or_else(|e| panic!("{e}"));
                auth = format!(
                    "auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
                    bundle.display()
                );
                issuer = Some(handle);
            }
        }
        let mut tls_config = String::new();
        if tls {
            let ca_key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
            let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())
                .unwrap_or_else(|e| panic!("{e}"));
            ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            ca_params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "flotilla test CA");
            let ca = ca_params
                .self_signed(&ca_key)
                .unwrap_or_else(|e| panic!("{e}"));
            let issuer = rcgen::Issuer::new(ca_params, ca_key);
            let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
            let params = rcgen::CertificateParams::new(vec![
                "127.0.0.1".to_string(),
                "localhost".to_string(),
            ])
            .unwrap_or_else(|e| panic!("{e}"));
            let cert = params
                .signed_by(&key, &issuer)
                .unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(dir.path().join("tls.pem"), cert.pem())
                .unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(dir.path().join("tls.key"), key.serialize_pem())
                .unwrap_or_else(|e| panic!("{e}"));
            tls_config = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("tls.pem").display(),
                dir.path().join("tls.key").display()
            );
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{tls_config}{auth}",
            dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap_or_else(|e| panic!("{e}"));
        let mut r = Registry {
            mode,
            addr,
            dir,
            child: None,
            _issuer: issuer,
        };
        r.resume().await;
        r
    }

    /// (Re)starts the registry process on the same port and storage.
    pub async fn resume(&mut self) {
        let child = Command::new(binary())
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.path().join("registry.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .unwrap_or_else(|e| panic!("start docker-registry: {e}"));
        self.child = Some(child);
        let addr = self.addr;
        poll::until("the registry to start", Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("{e}\n{}", self.log()))
        })
        .await;
    }

    /// Stops the registry process (storage stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// The private CA of a TLS registry.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn reference(&self, repo_tag: &str) -> String {
        format!("oci://{}/{repo_tag}", self.addr)
    }

    /// The file holding a blob's bytes in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

const SERVICE: &str = "flotilla-test-registry";
const ISSUER: &str = "flotilla-test-issuer";

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Starts the token issuer; returns (realm URL, certificate PEM, task).
async fn token_issuer() -> (String, String, tokio::task::JoinHandle<()>) {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap_or_else(|e| panic!("{e}"));
    let params = rcgen::CertificateParams::new(vec!["flotilla-token-issuer".to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
    let cert = params.self_signed(&key).unwrap_or_else(|e| panic!("{e}"));
    let rng = ring::rand::SystemRandom::new();
    let signer =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &key.serialize_der(), &rng)
            .unwrap_or_else(|e| panic!("{e}"));
    let x5c = base64::engine::general_purpose::STANDARD.encode(cert.der());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let state = std::sync::Arc::new((signer, x5c, rng));
    let app = axum::Router::new().route(
        "/token",
        axum::routing::get(
            move |headers: axum::http::HeaderMap,
                  axum::extract::RawQuery(query): axum::extract::RawQuery| {
                let state = state.clone();
                async move { issue(&state.0, &state.1, &state.2, &headers, query.as_deref()) }
            },
        ),
    );
    let handle = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/token"), cert.pem(), handle)
}

fn issue(
    signer: &ring::signature::EcdsaKeyPair,
    x5c: &str,
    rng: &ring::rand::SystemRandom,
    headers: &axum::http::HeaderMap,
    query: Option<&str>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let unauthorized = || {
        (
            axum::http::StatusCode::UNAUTHORIZED,
            "{\"details\":\"bad credentials\"}",
        )
            .into_response()
    };
    let Some(basic) = headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
    else {
        return unauthorized();
    };
    let may_push = if basic == format!("{}:{}", WRITER.0, WRITER.1) {
        true
    } else if basic == format!("{}:{}", READER.0, READER.1) {
        false
    } else {
        return unauthorized();
    };
    let user = basic.split(':').next().unwrap_or_default().to_string();
    let mut access = Vec::new();
    let pairs = url::form_urlencoded::parse(query.unwrap_or("").as_bytes());
    let mut grants: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in pairs {
        if k != "scope" {
            continue;
        }
        let mut parts = v.splitn(3, ':');
        let (Some("repository"), Some(name), Some(actions)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let granted = actions
            .split(',')
            .filter(|a| *a == "pull" || (may_push && *a == "push"))
            .map(str::to_string);
        grants.entry(name.to_string()).or_default().extend(granted);
    }
    for (name, actions) in grants {
        access.push(serde_json::json!({ "type": "repository", "name": name, "actions": actions }));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let header = serde_json::json!({ "typ": "JWT", "alg": "ES256", "x5c": [x5c] });
    let claims = serde_json::json!({
        "iss": ISSUER, "sub": user, "aud": SERVICE,
        "exp": now + 300, "nbf": now - 10, "iat": now,
        "jti": format!("{now}-{}", rand_id()),
        "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let Ok(sig) = signer.sign(rng, signing_input.as_bytes()) else {
        return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "sign").into_response();
    };
    let token = format!("{signing_input}.{}", b64url(sig.as_ref()));
    axum::Json(serde_json::json!({ "token": token, "access_token": token, "expires_in": 300 }))
        .into_response()
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

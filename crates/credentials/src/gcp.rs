//! The `gcp` credential kind: OAuth 2.0 access tokens for Google Cloud APIs, minted by the
//! host and sent as `Authorization: Bearer`, so a plugin never holds a key.
//!
//! Sources, first match wins:
//! 1. `service_account_key`: a service-account JSON key. The host signs a JWT (RS256) with
//!    the key and exchanges it at the key's `token_uri` (the JWT bearer grant,
//!    `urn:ietf:params:oauth:grant-type:jwt-bearer`):
//!    <https://developers.google.com/identity/protocols/oauth2/service-account#authorizingrequests>.
//! 2. `GOOGLE_APPLICATION_CREDENTIALS`, naming such a key file.
//! 3. The metadata server of GCE and GKE (workload identity on GKE):
//!    `GET /computeMetadata/v1/instance/service-accounts/default/token` with
//!    `Metadata-Flavor: Google`:
//!    <https://cloud.google.com/compute/docs/access/authenticate-workloads#applications>.
//!
//! Tokens are cached and refreshed five minutes before they expire (or at half their life
//! when they live less than ten minutes). Errors name the source and what the token endpoint
//! said, never the key, the assertion or a token.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use parking_lot::Mutex;
use serde::Deserialize;
use zeroize::Zeroizing;

use super::{CredentialError, Secret, SecretSource};

/// The scope of every Google Cloud API.
pub const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";

/// The metadata server of GCE and GKE (`GCE_METADATA_HOST` overrides the host).
const METADATA: &str = "http://metadata.google.internal";

/// How the `gcp` kind finds its tokens. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    /// A service-account JSON key: `{ file = "key.json" }`, or `{ env = "VAR" }` holding the JSON.
    #[serde(default)]
    pub service_account_key: Option<SecretSource>,
    /// OAuth scopes (default: cloud-platform).
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// The token endpoint; default: the key's `token_uri`.
    #[serde(default)]
    pub token_endpoint: Option<String>,
    /// The metadata server; default: `GCE_METADATA_HOST`, then `metadata.google.internal`.
    #[serde(default)]
    pub metadata_endpoint: Option<String>,
}

impl Default for GcpConfig {
    fn default() -> Self {
        GcpConfig {
            service_account_key: None,
            scopes: default_scopes(),
            token_endpoint: None,
            metadata_endpoint: None,
        }
    }
}

fn default_scopes() -> Vec<String> {
    vec![CLOUD_PLATFORM.to_string()]
}

impl GcpConfig {
    /// Problems visible without reading a secret: no scope, a blank scope, an endpoint that
    /// is not an http(s) URL. `(key, message)` pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.scopes.is_empty() || self.scopes.iter().any(|s| s.trim().is_empty()) {
            out.push(("scopes", "give at least one scope, none blank".to_string()));
        }
        for (key, url) in [
            ("token_endpoint", &self.token_endpoint),
            ("metadata_endpoint", &self.metadata_endpoint),
        ] {
            if let Some(u) = url {
                match url::Url::parse(u) {
                    Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => {}
                    _ => out.push((key, format!("{u:?} is not an http(s) URL"))),
                }
            }
        }
        out
    }
}

/// A minted token and when to mint the next (`Debug` shows no token: [`Secret`] redacts).
#[derive(Debug, Clone)]
struct Cached {
    token: Secret,
    refresh_at: SystemTime,
}

/// The kind's configuration plus its token cache (shared by clones of one credential).
#[derive(Debug, Default)]
pub struct GcpTokens {
    /// Configuration.
    pub config: GcpConfig,
    cache: Mutex<Option<Cached>>,
    /// Held while minting, so concurrent callers wait for one mint (single flight).
    minting: tokio::sync::Mutex<()>,
    /// A refusal by the token endpoint (a revoked key, a wrong account) and until when it is
    /// answered from here, so a bad key is not hammered by every request.
    refused: Mutex<Option<(String, SystemTime)>>,
}

/// How long a refusal of the token endpoint is remembered before the next try.
const REFUSAL_HOLD: Duration = Duration::from_secs(30);

/// The fields of a service-account JSON key the host uses.
#[derive(Deserialize)]
struct ServiceAccountKey {
    #[serde(rename = "type")]
    kind: String,
    client_email: String,
    private_key: Secret,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    token_uri: Option<String>,
}

/// What the token endpoint and the metadata server answer.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Secret,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// An OAuth error answer (`{"error": "invalid_grant", "error_description": "..."}`).
#[derive(Deserialize)]
struct OAuthError {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
const JWT_LIFETIME: u64 = 3600;

impl GcpTokens {
    /// A token source for `config`.
    pub fn new(config: GcpConfig) -> Self {
        GcpTokens {
            config,
            ..GcpTokens::default()
        }
    }

    fn cached(&self) -> Option<Secret> {
        let now = SystemTime::now();
        self.cache
            .lock()
            .as_ref()
            .filter(|c| now < c.refresh_at)
            .map(|c| c.token.clone())
    }

    /// A valid access token, from the cache or minted once for all concurrent callers.
    pub async fn token(&self, credential: &str) -> Result<Secret, CredentialError> {
        if let Some(token) = self.cached() {
            return Ok(token);
        }
        let _one = self.minting.lock().await;
        // Another caller may have minted while this one waited.
        if let Some(token) = self.cached() {
            return Ok(token);
        }
        let held = self.refused.lock().clone();
        if let Some((why, until)) = held.filter(|(_, until)| SystemTime::now() < *until) {
            let left = until
                .duration_since(SystemTime::now())
                .map_or(0, |d| d.as_secs());
            return Err(CredentialError::Unavailable {
                name: credential.to_string(),
                detail: format!("{why} (asked again in {left}s)"),
            });
        }
        match self.mint(credential).await {
            Ok(minted) => {
                let token = minted.token.clone();
                *self.cache.lock() = Some(minted);
                *self.refused.lock() = None;
                Ok(token)
            }
            Err(Mint::Refused(e)) => {
                if let CredentialError::Unavailable { detail, .. } = &e {
                    *self.refused.lock() = Some((detail.clone(), SystemTime::now() + REFUSAL_HOLD));
                }
                Err(e)
            }
            Err(Mint::Failed(e)) => Err(e),
        }
    }

    async fn mint(&self, credential: &str) -> Result<Cached, Mint> {
        let unavailable = |detail: String| {
            Mint::Failed(CredentialError::Unavailable {
                name: credential.to_string(),
                detail,
            })
        };
        let answered = |(refused, detail): (bool, String)| {
            let e = CredentialError::Unavailable {
                name: credential.to_string(),
                detail,
            };
            if refused {
                Mint::Refused(e)
            } else {
                Mint::Failed(e)
            }
        };
        let key_json = match &self.config.service_account_key {
            Some(source) => Some(key_text(source.resolve(credential).map_err(Mint::Failed)?)),
            None => match std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
                Ok(path) if !path.is_empty() => Some(key_text(
                    SecretSource::File(path.into())
                        .resolve(credential)
                        .map_err(Mint::Failed)?,
                )),
                _ => None,
            },
        };
        let client = super::aws::http_client().map_err(&unavailable)?;
        let answer = match key_json {
            Some(json) => {
                let key: ServiceAccountKey = serde_json::from_str(&json).map_err(|e| {
                    unavailable(format!(
                        "the service-account key is not valid JSON with client_email and private_key (line {}, column {})",
                        e.line(),
                        e.column()
                    ))
                })?;
                if key.kind != "service_account" {
                    return Err(unavailable(format!(
                        "the key is of type {:?}; only \"service_account\" keys are supported",
                        key.kind
                    )));
                }
                let endpoint = self
                    .config
                    .token_endpoint
                    .clone()
                    .or_else(|| key.token_uri.clone())
                    .unwrap_or_else(|| GOOGLE_TOKEN_URI.to_string());
                let assertion =
                    jwt(&key, &self.config.scopes, &endpoint, now_secs()).map_err(&unavailable)?;
                let form = Zeroizing::new(format!(
                    "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={}",
                    assertion.as_str()
                ));
                let response = client
                    .post(&endpoint)
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(form.as_bytes().to_vec())
                    .send()
                    .await
                    .map_err(|e| {
                        unavailable(format!(
                            "token endpoint {endpoint}: {}",
                            super::aws::without_url(&e)
                        ))
                    })?;
                read_answer(response, &format!("token endpoint {endpoint}"))
                    .await
                    .map_err(answered)?
            }
            None => {
                let base = self
                    .config
                    .metadata_endpoint
                    .clone()
                    .or_else(|| {
                        std::env::var("GCE_METADATA_HOST")
                            .ok()
                            .filter(|h| !h.is_empty())
                            .map(|h| format!("http://{h}"))
                    })
                    .unwrap_or_else(|| METADATA.to_string());
                let url = format!(
                    "{}/computeMetadata/v1/instance/service-accounts/default/token?scopes={}",
                    base.trim_end_matches('/'),
                    self.config.scopes.join(",")
                );
                let response = client
                    .get(&url)
                    .header("Metadata-Flavor", "Google")
                    .send()
                    .await
                    .map_err(|e| {
                        unavailable(format!(
                            "no service_account_key or GOOGLE_APPLICATION_CREDENTIALS, and the metadata server {base} is not reachable: {}",
                            super::aws::without_url(&e)
                        ))
                    })?;
                read_answer(response, &format!("metadata server {base}"))
                    .await
                    .map_err(answered)?
            }
        };
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(JWT_LIFETIME));
        let early = if lifetime > Duration::from_secs(600) {
            Duration::from_secs(300)
        } else {
            lifetime / 2
        };
        Ok(Cached {
            token: answer.access_token,
            refresh_at: SystemTime::now() + lifetime - early,
        })
    }
}

/// The key's JSON, from a file (`{ file = ... }`) or a variable holding it.
fn key_text(secret: Secret) -> Zeroizing<String> {
    Zeroizing::new(secret.expose().to_string())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The signed JWT of the bearer grant: RS256 over `header.claims`, the key id in `kid`.
fn jwt(
    key: &ServiceAccountKey,
    scopes: &[String],
    audience: &str,
    now: u64,
) -> Result<Zeroizing<String>, String> {
    let der = pem_pkcs8(key.private_key.expose())?;
    let pair = ring::signature::RsaKeyPair::from_pkcs8(&der)
        .map_err(|e| format!("the service-account private key is not an RSA PKCS#8 key: {e}"))?;
    let header = match &key.private_key_id {
        Some(kid) => serde_json::json!({ "alg": "RS256", "typ": "JWT", "kid": kid }),
        None => serde_json::json!({ "alg": "RS256", "typ": "JWT" }),
    };
    let claims = serde_json::json!({
        "iss": key.client_email,
        "scope": scopes.join(" "),
        "aud": audience,
        "iat": now,
        "exp": now + JWT_LIFETIME,
    });
    let signing_input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut signature,
    )
    .map_err(|_| "cannot sign the token request with the service-account key".to_string())?;
    Ok(Zeroizing::new(format!(
        "{signing_input}.{}",
        b64(&signature)
    )))
}

/// The DER inside a `-----BEGIN PRIVATE KEY-----` PEM block.
fn pem_pkcs8(pem: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN PRIVATE KEY-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END PRIVATE KEY-----"))
        .collect();
    if body.is_empty() {
        return Err("the service-account key has no \"-----BEGIN PRIVATE KEY-----\" block".into());
    }
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .map(Zeroizing::new)
        .map_err(|_| "the service-account private key is not valid base64".to_string())
}

/// Why a mint failed: refused by the endpoint (a 4xx: the key or account is wrong, so asking
/// again soon is pointless), or anything else (network, 5xx, a bad answer).
enum Mint {
    Refused(CredentialError),
    Failed(CredentialError),
}

/// A token answer, or what the endpoint said (its OAuth error, or the status) and whether it
/// was a refusal (4xx).
async fn read_answer(
    response: reqwest::Response,
    what: &str,
) -> Result<TokenAnswer, (bool, String)> {
    let status = response.status();
    // The answer holds a token: copied into a buffer that is wiped when dropped.
    let body = Zeroizing::new(
        response
            .bytes()
            .await
            .map_err(|e| {
                (
                    false,
                    format!(
                        "{what}: reading the answer: {}",
                        super::aws::without_url(&e)
                    ),
                )
            })?
            .to_vec(),
    );
    if !status.is_success() {
        let refused = status.is_client_error() && status != reqwest::StatusCode::TOO_MANY_REQUESTS;
        return Err((
            refused,
            match serde_json::from_slice::<OAuthError>(&body) {
                Ok(e) => format!(
                    "{what} refused the token request ({status}): {}{}",
                    e.error,
                    e.error_description
                        .map(|d| format!(": {d}"))
                        .unwrap_or_default()
                ),
                Err(_) => format!("{what} answered {status}"),
            },
        ));
    }
    serde_json::from_slice::<TokenAnswer>(&body)
        .map_err(|_| (false, format!("{what} answered without an access_token")))
}

/// A shared handle, so a credential's token cache outlives request clones.
#[derive(Debug, Clone, Default)]
pub struct GcpHandle(pub Arc<GcpTokens>);

impl PartialEq for GcpHandle {
    fn eq(&self, other: &Self) -> bool {
        self.0.config == other.0.config
    }
}

impl Eq for GcpHandle {}

impl<'de> Deserialize<'de> for GcpHandle {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        GcpConfig::deserialize(d).map(|c| GcpHandle(Arc::new(GcpTokens::new(c))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_the_key() {
        let c = GcpConfig {
            scopes: vec![" ".into()],
            token_endpoint: Some("ftp://x".into()),
            ..GcpConfig::default()
        };
        let keys: Vec<&str> = c.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["scopes", "token_endpoint"]);
        assert!(GcpConfig::default().problems().is_empty());
    }

    #[test]
    fn a_key_without_a_pem_block_is_refused_by_name() {
        let e = pem_pkcs8("not a key").err().unwrap_or_default();
        assert!(e.contains("BEGIN PRIVATE KEY"), "{e}");
    }
}

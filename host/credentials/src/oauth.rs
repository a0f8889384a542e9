//! What the OAuth token kinds (`gcp`, `azure`) share: the token cache with single-flight
//! minting and a hold on refusals, the token endpoints' answers and errors, and RS256 JWS
//! signing of assertions with a PKCS#8 key (ring does the cryptography).

use std::future::Future;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use parking_lot::Mutex;
use serde::Deserialize;
use zeroize::Zeroizing;

use super::{CredentialError, Secret};

/// How long a refusal by a token endpoint is remembered before the next try, so a revoked
/// key or a wrong client is not asked again by every request.
pub(crate) const REFUSAL_HOLD: Duration = Duration::from_secs(30);

/// The least time between two tokens minted because the cloud refused a cached one, so a
/// credential the cloud always refuses costs one extra mint per hold, not one per request.
pub const REMINT_HOLD: Duration = Duration::from_secs(15);

/// A token and how long it lives.
pub(crate) struct Minted {
    pub token: Secret,
    pub lifetime: Duration,
}

/// Why a mint failed: refused by the endpoint (a 4xx other than 429: the key, secret or client
/// is wrong, so asking again soon is pointless), or anything else (network, 5xx, a bad answer).
pub(crate) enum Mint {
    Refused(CredentialError),
    Failed(CredentialError),
}

impl Mint {
    /// A failure (not a refusal) of credential `name`.
    pub fn failed(name: &str, detail: String) -> Mint {
        Mint::Failed(CredentialError::Unavailable {
            name: name.to_string(),
            detail,
        })
    }

    /// What [`read_answer`] said, as a refusal or a failure.
    pub fn answered(name: &str, (refused, detail): (bool, String)) -> Mint {
        let e = CredentialError::Unavailable {
            name: name.to_string(),
            detail,
        };
        if refused {
            Mint::Refused(e)
        } else {
            Mint::Failed(e)
        }
    }
}

/// A cached token (`Debug` shows no token: [`Secret`] redacts).
#[derive(Debug, Clone)]
struct Cached {
    token: Secret,
    refresh_at: SystemTime,
}

/// A credential's tokens: cached until five minutes before expiry (half the life of tokens
/// living under ten minutes), minted once for all concurrent callers, and a refusal held for
/// [`REFUSAL_HOLD`].
#[derive(Debug, Default)]
pub(crate) struct TokenCache {
    cache: Mutex<Option<Cached>>,
    minting: tokio::sync::Mutex<()>,
    refused: Mutex<Option<(String, SystemTime)>>,
    /// When a cached token was last dropped because the cloud refused it.
    forced: Mutex<Option<SystemTime>>,
}

impl TokenCache {
    /// Drops the cached token when it is `sent`, which the cloud refused before its expiry
    /// (revoked, a rotated key, clock skew), so the next request mints anew; at most once per
    /// [`REMINT_HOLD`]. `true` when the next request carries another token than `sent`.
    pub fn forget(&self, sent: &str) -> bool {
        let mut cache = self.cache.lock();
        if !cache
            .as_ref()
            .is_some_and(|c| c.token.matches(sent.as_bytes()))
        {
            // Minted anew by another caller already, or nothing cached: the next is another.
            return true;
        }
        let now = SystemTime::now();
        let mut forced = self.forced.lock();
        if forced.is_some_and(|at| now.duration_since(at).is_ok_and(|d| d < REMINT_HOLD)) {
            return false;
        }
        *forced = Some(now);
        *cache = None;
        true
    }

    fn cached(&self) -> Option<Secret> {
        let now = SystemTime::now();
        self.cache
            .lock()
            .as_ref()
            .filter(|c| now < c.refresh_at)
            .map(|c| c.token.clone())
    }

    /// A valid token of credential `name`, from the cache or from `mint`.
    pub async fn token<F, Fut>(&self, name: &str, mint: F) -> Result<Secret, CredentialError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Minted, Mint>>,
    {
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
            return Err(CredentialError::Refused {
                name: name.to_string(),
                detail: format!("{why} (asked again in {left}s)"),
            });
        }
        match mint().await {
            Ok(Minted { token, lifetime }) => {
                let early = if lifetime > Duration::from_secs(600) {
                    Duration::from_secs(300)
                } else {
                    lifetime / 2
                };
                *self.cache.lock() = Some(Cached {
                    token: token.clone(),
                    refresh_at: SystemTime::now() + lifetime - early,
                });
                *self.refused.lock() = None;
                Ok(token)
            }
            Err(Mint::Refused(e)) => {
                let detail = match e {
                    CredentialError::Unavailable { detail, .. }
                    | CredentialError::Refused { detail, .. }
                    | CredentialError::Signing { detail, .. } => detail,
                };
                *self.refused.lock() = Some((detail.clone(), SystemTime::now() + REFUSAL_HOLD));
                Err(CredentialError::Refused {
                    name: name.to_string(),
                    detail,
                })
            }
            Err(Mint::Failed(e)) => Err(e),
        }
    }
}

/// A token endpoint's answer. `expires_in` is a number at Google and Entra ID, and a string
/// at Azure's instance metadata service.
#[derive(Deserialize)]
pub(crate) struct TokenAnswer {
    pub access_token: Secret,
    #[serde(default, deserialize_with = "number_or_string")]
    pub expires_in: Option<u64>,
}

fn number_or_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        Number(u64),
        Text(String),
    }
    Ok(match Option::<N>::deserialize(d)? {
        Some(N::Number(n)) => Some(n),
        Some(N::Text(t)) => t.trim().parse().ok(),
        None => None,
    })
}

/// An OAuth error answer (`{"error": "invalid_grant", "error_description": "..."}`).
#[derive(Deserialize)]
struct OAuthError {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// A token answer, or what the endpoint said (its OAuth error, or the status) and whether it
/// was a refusal (a 4xx other than 429).
pub(crate) async fn read_answer(
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

/// A token kind's configuration plus its token cache.
#[derive(Debug, Default)]
pub struct Tokens<C> {
    /// Configuration.
    pub config: C,
    pub(crate) cache: TokenCache,
}

impl<C> Tokens<C> {
    /// A token source for `config`.
    pub fn new(config: C) -> Self {
        Tokens {
            config,
            cache: TokenCache::default(),
        }
    }
}

/// A shared handle on a token kind, so a credential's token cache outlives request clones;
/// two handles are equal when their configurations are.
#[derive(Debug, Default)]
pub struct TokenHandle<C>(pub std::sync::Arc<Tokens<C>>);

impl<C> TokenHandle<C> {
    /// A handle on a new token source for `config`.
    pub fn new(config: C) -> Self {
        TokenHandle(std::sync::Arc::new(Tokens::new(config)))
    }

    /// See [`TokenCache::forget`].
    pub fn forget(&self, sent: &str) -> bool {
        self.0.cache.forget(sent)
    }
}

impl<C> Clone for TokenHandle<C> {
    fn clone(&self) -> Self {
        TokenHandle(self.0.clone())
    }
}

impl<C: PartialEq> PartialEq for TokenHandle<C> {
    fn eq(&self, other: &Self) -> bool {
        self.0.config == other.0.config
    }
}

impl<C: Eq> Eq for TokenHandle<C> {}

impl<'de, C: Deserialize<'de>> Deserialize<'de> for TokenHandle<C> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        C::deserialize(d).map(TokenHandle::new)
    }
}

/// Adds a problem for each configured endpoint that is not an http(s) URL with a host.
pub(crate) fn endpoint_problems<const N: usize>(
    endpoints: [(&'static str, &Option<String>); N],
    out: &mut Vec<(&'static str, String)>,
) {
    for (key, url) in endpoints {
        if let Some(u) = url {
            match url::Url::parse(u) {
                Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => {}
                _ => out.push((key, format!("{u:?} is not an http(s) URL"))),
            }
        }
    }
}

/// POSTs a form to a token endpoint and reads its answer; `what` names the endpoint in errors.
pub(crate) async fn post_form(
    client: &reqwest::Client,
    credential: &str,
    endpoint: &str,
    form: &str,
    what: &str,
) -> Result<TokenAnswer, Mint> {
    let response = client
        .post(endpoint)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form.as_bytes().to_vec())
        .send()
        .await
        .map_err(|e| {
            Mint::failed(
                credential,
                format!("{what}: {}", super::aws::without_url(&e)),
            )
        })?;
    read_answer(response, what)
        .await
        .map_err(|a| Mint::answered(credential, a))
}

/// Base64url without padding, as JWS uses.
pub(crate) fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The DER of the first `-----BEGIN {label}-----` block of a PEM text.
pub(crate) fn pem_block(pem: &str, label: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let body: String = pem
        .lines()
        .skip_while(|l| l.trim() != begin)
        .skip(1)
        .take_while(|l| l.trim() != end)
        .collect();
    if body.is_empty() {
        return Err(format!("no \"{begin}\" block"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .map(Zeroizing::new)
        .map_err(|_| format!("the {label} block is not valid base64"))
}

/// A compact JWS (RS256) of `header` and `claims`, signed with the PKCS#8 RSA key in `pem`.
pub(crate) fn rs256_jws(
    header: &serde_json::Value,
    claims: &serde_json::Value,
    pem: &str,
) -> Result<Zeroizing<String>, String> {
    jws(header, claims, pem, &ring::signature::RSA_PKCS1_SHA256)
}

/// A compact JWS signed with RSASSA-PSS and SHA-256 (`PS256`) by the PKCS#8 key in `pem`.
pub(crate) fn ps256_jws(
    header: &serde_json::Value,
    claims: &serde_json::Value,
    pem: &str,
) -> Result<Zeroizing<String>, String> {
    jws(header, claims, pem, &ring::signature::RSA_PSS_SHA256)
}

fn jws(
    header: &serde_json::Value,
    claims: &serde_json::Value,
    pem: &str,
    algorithm: &'static dyn ring::signature::RsaEncoding,
) -> Result<Zeroizing<String>, String> {
    let der = pem_block(pem, "PRIVATE KEY")?;
    let pair = ring::signature::RsaKeyPair::from_pkcs8(&der)
        .map_err(|e| format!("the private key is not an RSA PKCS#8 key: {e}"))?;
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        algorithm,
        &ring::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut signature,
    )
    .map_err(|_| "cannot sign the assertion with the private key".to_string())?;
    Ok(Zeroizing::new(format!(
        "{signing_input}.{}",
        b64url(&signature)
    )))
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Percent-encodes a form value (RFC 3986 unreserved characters pass).
pub(crate) fn form_value(v: &str) -> Zeroizing<String> {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Zeroizing::new(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pem_without_the_block_is_refused_by_name() {
        let e = pem_block("not a key", "PRIVATE KEY")
            .err()
            .unwrap_or_default();
        assert!(e.contains("BEGIN PRIVATE KEY"), "{e}");
    }

    #[test]
    fn form_values_are_percent_encoded() {
        assert_eq!(
            form_value("https://management.azure.com/.default a+b").as_str(),
            "https%3A%2F%2Fmanagement.azure.com%2F.default%20a%2Bb"
        );
    }
}

//! The `gcp` credential kind: OAuth 2.0 access tokens for Google Cloud APIs, minted by the
//! host and sent as `Authorization: Bearer`, so a plugin never holds a key.
//!
//! Sources, first match wins:
//! 1. `service_account_key`: a service-account JSON key. The host signs a JWT (RS256) with
//!    the key and exchanges it at the key's `token_uri` (the JWT bearer grant,
//!    `urn:ietf:params:oauth:grant-type:jwt-bearer`):
//!    <https://developers.google.com/identity/protocols/oauth2/service-account#authorizingrequests>.
//!    The same key may instead hold an `external_account` configuration (workload identity
//!    federation): its subject token file is exchanged at the STS, then optionally traded for a
//!    service account token (`GcpTokens::federate`).
//! 2. `GOOGLE_APPLICATION_CREDENTIALS`, naming such a file.
//! 3. The metadata server of GCE and GKE (workload identity on GKE):
//!    `GET /computeMetadata/v1/instance/service-accounts/default/token` with
//!    `Metadata-Flavor: Google`:
//!    <https://cloud.google.com/compute/docs/access/authenticate-workloads#applications>.
//!
//! Tokens are cached and refreshed five minutes before they expire (or at half their life
//! when they live less than ten minutes). Errors name the source and what the token endpoint
//! said, never the key, the assertion or a token.

use crate::gcp_subject::{CredentialSource, Federation};
use std::time::Duration;

use serde::Deserialize;
use zeroize::Zeroizing;

use super::oauth::{
    Mint, Minted, TokenAnswer, TokenHandle, Tokens, endpoint_problems, form_value, now_secs,
    post_form, read_answer, rs256_jws,
};
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
        endpoint_problems(
            [
                ("token_endpoint", &self.token_endpoint),
                ("metadata_endpoint", &self.metadata_endpoint),
            ],
            &mut out,
        );
        out
    }
}

/// The `gcp` kind's configuration and token cache.
pub type GcpTokens = Tokens<GcpConfig>;

/// A shared handle on a `gcp` credential's tokens.
pub type GcpHandle = TokenHandle<GcpConfig>;

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

const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
const JWT_LIFETIME: u64 = 3600;

impl Tokens<GcpConfig> {
    /// A valid access token, from the cache or minted once for all concurrent callers.
    pub async fn token(&self, credential: &str) -> Result<Secret, CredentialError> {
        self.cache.token(credential, || self.mint(credential)).await
    }

    async fn mint(&self, credential: &str) -> Result<Minted, Mint> {
        let unavailable = |detail: String| Mint::failed(credential, detail);
        let key_json = match &self.config.service_account_key {
            Some(source) => Some(source.resolve(credential).map_err(Mint::Failed)?),
            None => match std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
                Ok(path) if !path.is_empty() => Some(
                    SecretSource::File(path.into())
                        .resolve(credential)
                        .map_err(Mint::Failed)?,
                ),
                _ => None,
            },
        };
        let client = super::aws::http_client().map_err(unavailable)?;
        let answer = match key_json {
            Some(json) if json_type(json.expose()).as_deref() == Some("external_account") => {
                let config: ExternalAccount =
                    serde_json::from_str(json.expose()).map_err(|e| {
                        unavailable(format!(
                            "the external_account configuration lacks audience, subject_token_type, token_url or credential_source (line {}, column {})",
                            e.line(),
                            e.column()
                        ))
                    })?;
                return self.federate(credential, &client, &config).await;
            }
            Some(json) => {
                self.mint_from_key(&client, credential, json.expose())
                    .await?
            }
            None => self.mint_from_metadata(&client, credential).await?,
        };
        Ok(Minted {
            token: answer.access_token,
            lifetime: Duration::from_secs(answer.expires_in.unwrap_or(JWT_LIFETIME)),
        })
    }
}

impl Tokens<GcpConfig> {
    /// A token for a service account's key: a signed JWT exchanged at the token endpoint.
    async fn mint_from_key(
        &self,
        client: &reqwest::Client,
        credential: &str,
        json: &str,
    ) -> Result<TokenAnswer, Mint> {
        let unavailable = |detail: String| Mint::failed(credential, detail);
        let key: ServiceAccountKey = serde_json::from_str(json).map_err(|e| {
            unavailable(format!(
                "the service-account key is not valid JSON with client_email and private_key (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        if key.kind != "service_account" {
            return Err(unavailable(format!(
                "the key is of type {:?}; \"service_account\" and \"external_account\" are supported",
                key.kind
            )));
        }
        let endpoint = self
            .config
            .token_endpoint
            .clone()
            .or_else(|| key.token_uri.clone())
            .unwrap_or_else(|| GOOGLE_TOKEN_URI.to_string());
        let assertion = jwt(&key, &self.config.scopes, &endpoint, now_secs())
            .map_err(|e| unavailable(format!("the service-account key: {e}")))?;
        let form = Zeroizing::new(format!(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={}",
            assertion.as_str()
        ));
        post_form(
            client,
            credential,
            &endpoint,
            &form,
            &format!("token endpoint {endpoint}"),
        )
        .await
    }

    /// A token from the metadata server: the machine's (or the workload's) own service account.
    async fn mint_from_metadata(
        &self,
        client: &reqwest::Client,
        credential: &str,
    ) -> Result<TokenAnswer, Mint> {
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
                Mint::failed(
                    credential,
                    format!(
                        "no service_account_key or GOOGLE_APPLICATION_CREDENTIALS, and the metadata server {base} is not reachable: {}",
                        super::aws::without_url(&e)
                    ),
                )
            })?;
        read_answer(response, &format!("metadata server {base}"))
            .await
            .map_err(|a| Mint::answered(credential, a))
    }
}

/// The `type` of a Google credentials JSON, if it has one.
fn json_type(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Typed>(text).ok().map(|t| t.kind)
}

/// An `external_account` configuration of workload identity federation
/// (<https://google.aip.dev/auth/4117>); its credential source is a file, a URL, an
/// executable or AWS (`gcp_subject.rs`).
#[derive(Deserialize)]
struct ExternalAccount {
    audience: String,
    subject_token_type: String,
    token_url: String,
    #[serde(default)]
    service_account_impersonation_url: Option<String>,
    credential_source: CredentialSource,
}

/// What `generateAccessToken` answers
/// (<https://cloud.google.com/iam/docs/reference/credentials/rest/v1/projects.serviceAccounts/generateAccessToken>).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Impersonated {
    access_token: Secret,
    expire_time: String,
}

impl Tokens<GcpConfig> {
    /// Workload identity federation: the subject token from the file, exchanged at the STS
    /// (<https://cloud.google.com/iam/docs/reference/sts/rest/v1/TopLevel/token>), then, when
    /// configured, a service account's token generated with it.
    async fn federate(
        &self,
        credential: &str,
        client: &reqwest::Client,
        config: &ExternalAccount,
    ) -> Result<Minted, Mint> {
        let unavailable = |detail: String| Mint::failed(credential, detail);
        // The service account's email, which an executable source is told of.
        let impersonated = config
            .service_account_impersonation_url
            .as_deref()
            .and_then(|u| u.rsplit('/').next())
            .and_then(|last| last.strip_suffix(":generateAccessToken"));
        let federation = Federation {
            audience: &config.audience,
            subject_token_type: &config.subject_token_type,
            impersonated,
        };
        let subject = config
            .credential_source
            .subject_token(credential, client, &federation)
            .await?;
        let scope = if config.service_account_impersonation_url.is_some() {
            CLOUD_PLATFORM.to_string()
        } else {
            self.config.scopes.join(" ")
        };
        let form = Zeroizing::new(format!(
            "grant_type={}&audience={}&scope={}&requested_token_type={}&subject_token={}&subject_token_type={}",
            form_value("urn:ietf:params:oauth:grant-type:token-exchange").as_str(),
            form_value(&config.audience).as_str(),
            form_value(&scope).as_str(),
            form_value("urn:ietf:params:oauth:token-type:access_token").as_str(),
            form_value(subject.expose()).as_str(),
            form_value(&config.subject_token_type).as_str(),
        ));
        let sts = &config.token_url;
        let response = client
            .post(sts)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.as_bytes().to_vec())
            .send()
            .await
            .map_err(|e| unavailable(format!("STS {sts}: {}", super::aws::without_url(&e))))?;
        let federated = read_answer(response, &format!("STS {sts}"))
            .await
            .map_err(|a| Mint::answered(credential, a))?;
        let Some(url) = &config.service_account_impersonation_url else {
            return Ok(Minted {
                token: federated.access_token,
                lifetime: Duration::from_secs(federated.expires_in.unwrap_or(3600)),
            });
        };
        self.impersonate(credential, client, url, &federated.access_token)
            .await
    }

    /// The service account's own token, generated with the federated one
    /// (<https://cloud.google.com/iam/docs/reference/credentials/rest/v1/projects.serviceAccounts/generateAccessToken>).
    async fn impersonate(
        &self,
        credential: &str,
        client: &reqwest::Client,
        url: &str,
        federated: &Secret,
    ) -> Result<Minted, Mint> {
        let unavailable = |detail: String| Mint::failed(credential, detail);
        let response = client
            .post(url)
            .bearer_auth(federated.expose())
            .header("content-type", "application/json")
            .body(
                serde_json::json!({ "scope": self.config.scopes, "lifetime": "3600s" }).to_string(),
            )
            .send()
            .await
            .map_err(|e| {
                unavailable(format!(
                    "service account impersonation {url}: {}",
                    super::aws::without_url(&e)
                ))
            })?;
        let status = response.status();
        let body = Zeroizing::new(
            response
                .bytes()
                .await
                .map_err(|e| unavailable(super::aws::without_url(&e)))?
                .to_vec(),
        );
        if !status.is_success() {
            let e = CredentialError::Unavailable {
                name: credential.to_string(),
                detail: format!(
                    "service account impersonation {url} answered {status}: {}",
                    String::from_utf8_lossy(&body)
                        .chars()
                        .take(300)
                        .collect::<String>()
                ),
            };
            return Err(if status.is_client_error() {
                Mint::Refused(e)
            } else {
                Mint::Failed(e)
            });
        }
        let token: Impersonated = serde_json::from_slice(&body).map_err(|_| {
            unavailable(format!(
                "service account impersonation {url} answered without accessToken and expireTime"
            ))
        })?;
        let expires = chrono::DateTime::parse_from_rfc3339(&token.expire_time).map_err(|_| {
            unavailable(format!(
                "expireTime {:?} is not RFC 3339",
                token.expire_time
            ))
        })?;
        let left = (expires.timestamp() - chrono::Utc::now().timestamp()).max(0);
        Ok(Minted {
            token: token.access_token,
            lifetime: Duration::from_secs(u64::try_from(left).unwrap_or(0)),
        })
    }
}

/// The signed JWT of the bearer grant: RS256 over `header.claims`, the key id in `kid`.
fn jwt(
    key: &ServiceAccountKey,
    scopes: &[String],
    audience: &str,
    now: u64,
) -> Result<Zeroizing<String>, String> {
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
    rs256_jws(&header, &claims, key.private_key.expose())
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
}

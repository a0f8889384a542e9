//! The `azure` credential kind: Microsoft Entra ID access tokens for Azure Resource Manager,
//! minted by the host and sent as `Authorization: Bearer`, so a plugin never holds a secret.
//!
//! Sources, first match wins:
//! 1. `client_secret`: the client credentials grant with a secret
//!    (<https://learn.microsoft.com/en-us/entra/identity-platform/v2-oauth2-client-creds-grant-flow>).
//! 2. `certificate`: the same grant with a client assertion, a JWT (PS256, as MSAL signs it) signed with the
//!    certificate's key and naming it by `x5t#S256`
//!    (<https://learn.microsoft.com/en-us/entra/identity-platform/certificate-credentials>).
//! 3. Workload identity (AKS): `federated_token_file` or `AZURE_FEDERATED_TOKEN_FILE`, whose
//!    token is the client assertion, with `AZURE_CLIENT_ID`, `AZURE_TENANT_ID` and
//!    `AZURE_AUTHORITY_HOST` as the AKS webhook sets them
//!    (<https://azure.github.io/azure-workload-identity/docs/quick-start.html>).
//! 4. Managed identity: the instance metadata service, `GET /metadata/identity/oauth2/token`
//!    with `Metadata: true`
//!    (<https://learn.microsoft.com/en-us/entra/identity/managed-identities-azure-resources/how-to-use-vm-token#get-a-token-using-http>).
//!
//! Tokens are cached, minted once for concurrent callers, and a refusal (a wrong secret, an
//! unknown client) is held for 30 s; see `oauth.rs`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use zeroize::Zeroizing;

use super::oauth::{
    Mint, Minted, TokenAnswer, TokenHandle, Tokens, b64url, endpoint_problems, form_value,
    now_secs, pem_block, post_form, ps256_jws, read_answer,
};
use super::{CredentialError, SecretSource};

/// Azure Resource Manager.
pub const MANAGEMENT_SCOPE: &str = "https://management.azure.com/.default";
const AUTHORITY: &str = "https://login.microsoftonline.com";
const IMDS: &str = "http://169.254.169.254";
const ASSERTION_LIFETIME: u64 = 600;

/// How the `azure` kind finds its tokens.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureConfig {
    /// The directory (tenant) id; default `AZURE_TENANT_ID`.
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// The application (client) id; default `AZURE_CLIENT_ID`. With managed identity, it
    /// picks a user-assigned identity.
    #[serde(default)]
    pub client_id: Option<String>,
    /// A client secret.
    #[serde(default)]
    pub client_secret: Option<SecretSource>,
    /// A PEM file with the client certificate and its PKCS#8 private key.
    #[serde(default)]
    pub certificate: Option<SecretSource>,
    /// The federated token of workload identity; default `AZURE_FEDERATED_TOKEN_FILE`.
    #[serde(default)]
    pub federated_token_file: Option<PathBuf>,
    /// The scope (default: Azure Resource Manager's `.default`).
    #[serde(default = "default_scope")]
    pub scope: String,
    /// The Entra ID authority; default `AZURE_AUTHORITY_HOST`, then login.microsoftonline.com.
    #[serde(default)]
    pub authority_host: Option<String>,
    /// The instance metadata service of managed identity (default 169.254.169.254).
    #[serde(default)]
    pub imds_endpoint: Option<String>,
}

fn default_scope() -> String {
    MANAGEMENT_SCOPE.to_string()
}

impl Default for AzureConfig {
    fn default() -> Self {
        AzureConfig {
            tenant_id: None,
            client_id: None,
            client_secret: None,
            certificate: None,
            federated_token_file: None,
            scope: default_scope(),
            authority_host: None,
            imds_endpoint: None,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl AzureConfig {
    /// Problems visible without reading a secret, as `(key, message)` pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.client_secret.is_some() && self.certificate.is_some() {
            out.push((
                "certificate",
                "give client_secret or certificate, not both".to_string(),
            ));
        }
        if self.client_secret.is_some() || self.certificate.is_some() {
            for (key, value) in [
                ("tenant_id", &self.tenant_id),
                ("client_id", &self.client_id),
            ] {
                if value.is_none() {
                    out.push((
                        key,
                        "is required with client_secret or certificate".to_string(),
                    ));
                }
            }
        }
        if let Some(t) = &self.tenant_id {
            let ok = !t.is_empty()
                && t.len() <= 253
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            if !ok {
                out.push(("tenant_id", format!("{t:?} is not a tenant id or domain")));
            }
        }
        if self.scope.trim().is_empty() {
            out.push(("scope", "is empty".to_string()));
        }
        endpoint_problems(
            [
                ("authority_host", &self.authority_host),
                ("imds_endpoint", &self.imds_endpoint),
            ],
            &mut out,
        );
        out
    }
}

/// The `azure` kind's configuration and token cache.
pub type AzureTokens = Tokens<AzureConfig>;

/// A shared handle on an `azure` credential's tokens.
pub type AzureHandle = TokenHandle<AzureConfig>;

/// How this mint proves the client.
enum Proof {
    Secret(Zeroizing<String>),
    Assertion(Zeroizing<String>),
}

impl Tokens<AzureConfig> {
    /// A valid access token, from the cache or minted once for all concurrent callers.
    pub async fn token(&self, credential: &str) -> Result<super::Secret, CredentialError> {
        self.cache.token(credential, || self.mint(credential)).await
    }

    async fn mint(&self, credential: &str) -> Result<Minted, Mint> {
        let unavailable = |detail: String| Mint::failed(credential, detail);
        let c = &self.config;
        let client_id = c.client_id.clone().or_else(|| env("AZURE_CLIENT_ID"));
        let client = super::aws::http_client().map_err(unavailable)?;
        let answer = match self.grant(credential)? {
            Some((how, proof)) => {
                let tenant = c.tenant_id.clone().or_else(|| env("AZURE_TENANT_ID"));
                let (Some(client_id), Some(tenant)) = (client_id, tenant) else {
                    return Err(unavailable(format!(
                        "{how} needs tenant_id and client_id (or AZURE_TENANT_ID and AZURE_CLIENT_ID)"
                    )));
                };
                self.mint_at_token_endpoint(&client, credential, (how, proof), &client_id, &tenant)
                    .await?
            }
            None => {
                self.mint_from_managed_identity(&client, credential, client_id.as_deref())
                    .await?
            }
        };
        Ok(Minted {
            token: answer.access_token,
            lifetime: Duration::from_secs(answer.expires_in.unwrap_or(3600)),
        })
    }

    /// How the client proves itself, in the SDKs' order: a client secret, a certificate, a
    /// federated token file; `None` leaves the managed identity.
    fn grant(&self, credential: &str) -> Result<Option<(&'static str, Proof)>, Mint> {
        let c = &self.config;
        let federated = c
            .federated_token_file
            .clone()
            .or_else(|| env("AZURE_FEDERATED_TOKEN_FILE").map(PathBuf::from));
        let resolved = |source: &SecretSource| -> Result<Zeroizing<String>, Mint> {
            Ok(Zeroizing::new(
                source
                    .resolve(credential)
                    .map_err(Mint::Failed)?
                    .expose()
                    .to_string(),
            ))
        };
        Ok(match (&c.client_secret, &c.certificate, &federated) {
            (Some(secret), _, _) => Some(("client secret", Proof::Secret(resolved(secret)?))),
            (None, Some(cert), _) => Some(("certificate", Proof::Assertion(resolved(cert)?))),
            (None, None, Some(file)) => Some((
                "workload identity",
                Proof::Assertion(resolved(&SecretSource::File(file.clone()))?),
            )),
            (None, None, None) => None,
        })
    }

    /// A token from the tenant's token endpoint, for the client's proof.
    async fn mint_at_token_endpoint(
        &self,
        client: &reqwest::Client,
        credential: &str,
        (how, proof): (&'static str, Proof),
        client_id: &str,
        tenant: &str,
    ) -> Result<TokenAnswer, Mint> {
        let c = &self.config;
        let authority = c
            .authority_host
            .clone()
            .or_else(|| env("AZURE_AUTHORITY_HOST"))
            .unwrap_or_else(|| AUTHORITY.to_string());
        let endpoint = format!(
            "{}/{tenant}/oauth2/v2.0/token",
            authority.trim_end_matches('/')
        );
        let proof = match proof {
            Proof::Secret(secret) => {
                Zeroizing::new(format!("client_secret={}", form_value(&secret).as_str()))
            }
            Proof::Assertion(text) if how == "certificate" => {
                let jwt = certificate_assertion(&text, client_id, &endpoint)
                    .map_err(|e| Mint::failed(credential, format!("the certificate: {e}")))?;
                assertion_form(&jwt)
            }
            Proof::Assertion(token) => assertion_form(&token),
        };
        let form = Zeroizing::new(format!(
            "client_id={}&scope={}&grant_type=client_credentials&{}",
            form_value(client_id).as_str(),
            form_value(&c.scope).as_str(),
            proof.as_str()
        ));
        post_form(
            client,
            credential,
            &endpoint,
            &form,
            &format!("token endpoint {endpoint} ({how})"),
        )
        .await
    }

    /// A token from the managed identity endpoint (IMDS), for `client_id`'s identity or the
    /// machine's only one.
    async fn mint_from_managed_identity(
        &self,
        client: &reqwest::Client,
        credential: &str,
        client_id: Option<&str>,
    ) -> Result<TokenAnswer, Mint> {
        let c = &self.config;
        let base = c.imds_endpoint.clone().unwrap_or_else(|| IMDS.to_string());
        let resource = c.scope.trim_end_matches(".default");
        let mut url = format!(
            "{}/metadata/identity/oauth2/token?api-version=2018-02-01&resource={}",
            base.trim_end_matches('/'),
            form_value(resource).as_str()
        );
        if let Some(id) = client_id {
            url.push_str(&format!("&client_id={}", form_value(id).as_str()));
        }
        let response = client
            .get(&url)
            .header("Metadata", "true")
            .send()
            .await
            .map_err(|e| {
                Mint::failed(
                    credential,
                    format!(
                        "no client_secret, certificate or federated token, and the managed identity endpoint {base} is not reachable: {}",
                        super::aws::without_url(&e)
                    ),
                )
            })?;
        // 404 while an identity is being set up, 410 while IMDS upgrades (back within
        // 70 s), 429 and 5xx: the SDKs retry all of them, so they are failures to try
        // again, never a refusal that pauses the pool as unauthorized.
        // <https://learn.microsoft.com/en-us/entra/identity/managed-identities-azure-resources/how-to-use-vm-token#error-handling>
        let retry = matches!(response.status().as_u16(), 404 | 410 | 429 | 500..=599);
        read_answer(response, &format!("managed identity endpoint {base}"))
            .await
            .map_err(|(refused, detail)| {
                let detail = if retry {
                    format!("{detail} (the identity is being set up or IMDS is upgrading; asked again at the next call)")
                } else {
                    detail
                };
                Mint::answered(credential, (refused && !retry, detail))
            })
    }
}

fn assertion_form(jwt: &str) -> Zeroizing<String> {
    Zeroizing::new(format!(
        "client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type%3Ajwt-bearer&client_assertion={}",
        form_value(jwt.trim()).as_str()
    ))
}

/// The client assertion of the certificate flow as MSAL makes it today for Entra ID: PS256
/// with the certificate's SHA-256 thumbprint in `x5t#S256` (base64url), the token endpoint as
/// `aud`, the client as `iss` and `sub`, ten minutes. (MSAL .NET 4.59.1+ `JsonWebToken.cs`,
/// MSAL Go 1.4.2+ `accesstokens.go`, MSAL Python 1.30+ `oauth2cli/assertion.py`; RS256 with a
/// SHA-1 `x5t` is their fallback for ADFS only. The older certificate-credentials page's RS256
/// with `x5t#S256` is a mix no MSAL sends.)
fn certificate_assertion(
    pem: &str,
    client_id: &str,
    endpoint: &str,
) -> Result<Zeroizing<String>, String> {
    let cert = pem_block(pem, "CERTIFICATE")?;
    let thumbprint = ring::digest::digest(&ring::digest::SHA256, &cert);
    let header = serde_json::json!({
        "alg": "PS256",
        "typ": "JWT",
        "x5t#S256": b64url(thumbprint.as_ref()),
    });
    let mut jti = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut jti)
        .map_err(|_| "no randomness for the assertion id".to_string())?;
    let now = now_secs();
    let claims = serde_json::json!({
        "aud": endpoint,
        "iss": client_id,
        "sub": client_id,
        "jti": b64url(&jti),
        "nbf": now,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME,
    });
    ps256_jws(&header, &claims, pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_the_key() {
        let c = AzureConfig {
            client_secret: Some(SecretSource::Env("S".into())),
            certificate: Some(SecretSource::Env("C".into())),
            tenant_id: Some("bad tenant".into()),
            ..AzureConfig::default()
        };
        let keys: Vec<&str> = c.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["certificate", "client_id", "tenant_id"]);
        assert!(AzureConfig::default().problems().is_empty());
    }
}

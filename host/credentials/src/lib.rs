//! Credentials a pool may use: named, bound to hosts, applied by the host to a plugin's
//! outgoing request. Secret values never leave this module except into the request that
//! leaves the machine, and are redacted in `Debug` and `Display`.
//!
//! Owns: secret sources (value, env, file), the credential kinds (bearer, basic, AWS SigV4,
//! the AWS chain, Google Cloud and Azure tokens), and signing or authorising one request.
//! Must not know: plugins, wasmtime, pools or config files; the egress hook calls in here.

use std::fmt;
use std::path::PathBuf;
use std::time::SystemTime;

use base64::Engine as _;
use serde::Deserialize;
use zeroize::Zeroizing;

use flotilla_net::AllowList;

pub mod aws;
pub mod azure;
pub mod config;
pub mod gcp;
mod gcp_subject;
pub mod oauth;

/// A shared handle on an AWS chain, so its cache of temporary keys outlives request clones.
#[derive(Debug, Clone, Default)]
pub struct AwsChainHandle(pub std::sync::Arc<aws::AwsChain>);

impl PartialEq for AwsChainHandle {
    fn eq(&self, other: &Self) -> bool {
        self.0.config == other.0.config
    }
}

impl Eq for AwsChainHandle {}

impl<'de> Deserialize<'de> for AwsChainHandle {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        aws::AwsChainConfig::deserialize(d)
            .map(|c| AwsChainHandle(std::sync::Arc::new(aws::AwsChain::new(c))))
    }
}

/// A secret value: redacted when printed, wiped from memory when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(Zeroizing::new(value.into()))
    }

    /// The value, for the one place that applies it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Whether two secrets hold the same value (so one can be refused as a copy of the other).
    pub fn same_as(&self, other: &Secret) -> bool {
        self.matches(other.0.as_bytes())
    }

    /// Whether `given` equals the secret, compared in constant time (for bearer tokens a
    /// client presents), so the secret itself never leaves this crate.
    pub fn matches(&self, given: &[u8]) -> bool {
        let ours = self.0.as_bytes();
        if ours.len() != given.len() {
            return false;
        }
        ours.iter()
            .zip(given)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// Where a secret comes from: inline config, an environment variable or a file.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum SecretSource {
    /// Written in the config (discouraged outside tests).
    Value(Secret),
    /// Read from an environment variable at use.
    Env(String),
    /// Read from a file at use (trailing newline trimmed), so rotated files are picked up.
    File(PathBuf),
}

impl fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Value(_) => f.write_str("Value(<redacted>)"),
            SecretSource::Env(name) => write!(f, "Env({name})"),
            SecretSource::File(path) => write!(f, "File({})", path.display()),
        }
    }
}

/// Why a credential could not be applied. Messages never contain a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The source of a secret is unavailable.
    #[error("credential {name}: {detail}")]
    Unavailable {
        /// The credential.
        name: String,
        /// What is missing (an env var name or a file path, never a value).
        detail: String,
    },
    /// The credential's identity provider refused to issue a token (a revoked key, a wrong
    /// secret or client): an authorisation failure, not a transient one.
    #[error("credential {name}: {detail}")]
    Refused {
        /// The credential.
        name: String,
        /// What the identity provider said (never a secret).
        detail: String,
    },
    /// Signing failed.
    #[error("credential {name}: cannot sign request: {detail}")]
    Signing {
        /// The credential.
        name: String,
        /// What went wrong.
        detail: String,
    },
}

impl SecretSource {
    /// Reads the secret now.
    pub fn resolve(&self, credential: &str) -> Result<Secret, CredentialError> {
        let unavailable = |detail: String| CredentialError::Unavailable {
            name: credential.to_string(),
            detail,
        };
        match self {
            SecretSource::Value(s) => Ok(s.clone()),
            SecretSource::Env(var) => match std::env::var(var) {
                Ok(v) if !v.is_empty() => Ok(Secret::new(v)),
                _ => Err(unavailable(format!(
                    "environment variable {var} is not set"
                ))),
            },
            SecretSource::File(path) => match std::fs::read_to_string(path) {
                Ok(v) => {
                    let v = Zeroizing::new(v);
                    let trimmed = v.trim_end_matches(['\n', '\r']);
                    if trimmed.is_empty() {
                        Err(unavailable(format!("{} is empty", path.display())))
                    } else {
                        Ok(Secret::new(trimmed))
                    }
                }
                Err(e) => Err(unavailable(format!(
                    "cannot read {}: {}",
                    path.display(),
                    e.kind()
                ))),
            },
        }
    }

    /// What is wrong with the source, visible without reading the secret (for config checks).
    fn problem(&self) -> Option<&'static str> {
        match self {
            SecretSource::Value(s) if s.expose().is_empty() => Some("value is empty"),
            SecretSource::Env(v) if v.is_empty() => Some("env name is empty"),
            _ => None,
        }
    }
}

/// How a credential authorises a request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum CredentialKind {
    /// `Authorization: Bearer <token>`.
    Bearer {
        /// The token.
        token: SecretSource,
    },
    /// `Authorization: Basic base64(user:password)`.
    Basic {
        /// The user name (not secret).
        username: String,
        /// The password.
        password: SecretSource,
    },
    /// AWS Signature Version 4, computed by the host over the buffered body.
    AwsSigv4 {
        /// The access key id.
        access_key_id: SecretSource,
        /// The secret access key.
        secret_access_key: SecretSource,
        /// A session token for temporary credentials.
        #[serde(default)]
        session_token: Option<SecretSource>,
        /// The signing region; derived from the host name when absent.
        #[serde(default)]
        region: Option<String>,
        /// The signing service; derived from the host name (or the plugin's
        /// `flotilla-aws-service` hint) when absent.
        #[serde(default)]
        service: Option<String>,
    },
    /// The AWS credential chain (config, environment, shared files, web identity, IMDSv2),
    /// signed with SigV4.
    Aws(AwsChainHandle),
    /// Google Cloud OAuth access tokens minted by the host (a service-account key, or the
    /// GCE/GKE metadata server), sent as `Authorization: Bearer`.
    Gcp(gcp::GcpHandle),
    /// Microsoft Entra ID access tokens minted by the host (client secret, client certificate,
    /// workload identity or managed identity), sent as `Authorization: Bearer`.
    Azure(azure::AzureHandle),
}

/// A named credential and the hosts it may be sent to.
#[derive(Debug, Clone)]
pub struct Credential {
    /// The name plugins use in `flotilla-credential`.
    pub name: String,
    /// How it authorises.
    pub kind: CredentialKind,
    /// Where it may be sent; a request to any other host is refused.
    pub hosts: AllowList,
}

/// The reserved request header naming a credential; stripped by the host.
pub const CREDENTIAL_HEADER: &str = "flotilla-credential";
/// Optional hint naming the AWS service to sign for; stripped by the host.
pub const AWS_SERVICE_HEADER: &str = "flotilla-aws-service";
/// Optional hint naming the AWS region to sign for; stripped by the host.
pub const AWS_REGION_HEADER: &str = "flotilla-aws-region";

/// What a plugin may suggest for signing; configuration always wins.
#[derive(Debug, Clone, Default)]
pub struct SigningHints {
    /// The AWS service (`ec2`, `autoscaling`...).
    pub service: Option<String>,
    /// The AWS region.
    pub region: Option<String>,
}

/// Service and region from an AWS host name such as `ec2.eu-west-1.amazonaws.com`.
pub fn aws_service_region(host: &str) -> (Option<String>, Option<String>) {
    let trimmed = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"));
    let Some(prefix) = trimmed else {
        return (None, None);
    };
    let labels: Vec<&str> = prefix.split('.').collect();
    match labels.as_slice() {
        [service] => (Some((*service).to_string()), Some("us-east-1".to_string())),
        [service, region] => (Some((*service).to_string()), Some((*region).to_string())),
        [.., service, region] => (Some((*service).to_string()), Some((*region).to_string())),
        [] => (None, None),
    }
}

impl Credential {
    /// Adds authorisation to `request`, whose body is fully buffered in `body`.
    pub async fn apply<B>(
        &self,
        request: &mut http::Request<B>,
        body: &[u8],
        hints: &SigningHints,
    ) -> Result<(), CredentialError> {
        let signing = |detail: String| CredentialError::Signing {
            name: self.name.clone(),
            detail,
        };
        match &self.kind {
            CredentialKind::Bearer { token } => {
                let token = token.resolve(&self.name)?;
                set_sensitive(request, &format!("Bearer {}", token.expose())).map_err(signing)
            }
            CredentialKind::Basic { username, password } => {
                let password = password.resolve(&self.name)?;
                let raw = Zeroizing::new(format!("{username}:{}", password.expose()));
                let encoded = Zeroizing::new(
                    base64::engine::general_purpose::STANDARD.encode(raw.as_bytes()),
                );
                set_sensitive(request, &format!("Basic {}", encoded.as_str())).map_err(signing)
            }
            CredentialKind::AwsSigv4 {
                access_key_id,
                secret_access_key,
                session_token,
                region,
                service,
            } => {
                let (service, region) = self.scope(request.uri(), service, region, hints)?;
                let akid = access_key_id.resolve(&self.name)?;
                let secret = secret_access_key.resolve(&self.name)?;
                let token = session_token
                    .as_ref()
                    .map(|t| t.resolve(&self.name))
                    .transpose()?;
                sign_sigv4(
                    request,
                    body,
                    &service,
                    &region,
                    &akid,
                    &secret,
                    token.as_ref(),
                )
                .map_err(signing)
            }
            CredentialKind::Gcp(tokens) => {
                let token = tokens.0.token(&self.name).await?;
                set_sensitive(request, &format!("Bearer {}", token.expose())).map_err(signing)
            }
            CredentialKind::Azure(tokens) => {
                let token = tokens.0.token(&self.name).await?;
                set_sensitive(request, &format!("Bearer {}", token.expose())).map_err(signing)
            }
            CredentialKind::Aws(chain) => {
                let cfg = &chain.0.config;
                let (service, region) =
                    self.scope(request.uri(), &cfg.service, &cfg.region, hints)?;
                let keys = chain.0.keys(&self.name, Some(&region)).await?;
                sign_sigv4(
                    request,
                    body,
                    &service,
                    &region,
                    &keys.access_key_id,
                    &keys.secret_access_key,
                    keys.session_token.as_ref(),
                )
                .map_err(signing)
            }
        }
    }
}

/// How an answer shows that the cloud refused a cached token or temporary keys before their
/// expiry, so minting anew may cure it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalSign {
    /// This answer cannot be such a refusal.
    None,
    /// Its status says so: a 401 to a bearer token the host minted (ARM's
    /// `ExpiredAuthenticationToken` and `InvalidAuthenticationToken`, Compute's
    /// `UNAUTHENTICATED`).
    Status,
    /// Its body says so when it names one of these error codes: AWS answers an expired
    /// session token with 400 or 403 and `ExpiredToken` (`ExpiredTokenException` in the
    /// JSON protocols).
    Body(&'static [&'static str]),
}

/// AWS's error codes for temporary keys the service no longer accepts.
/// <https://docs.aws.amazon.com/STS/latest/APIReference/CommonErrors.html>
const AWS_EXPIRED: [&str; 2] = ["ExpiredToken", "ExpiredTokenException"];

impl Credential {
    /// How an answer of `status` would show a refused cached token (see [`RefusalSign`]).
    /// Credentials that cache nothing never do: their secret is read as configured each time.
    pub fn refusal_sign(&self, status: u16) -> RefusalSign {
        match (&self.kind, status) {
            (CredentialKind::Gcp(_) | CredentialKind::Azure(_), 401) => RefusalSign::Status,
            (CredentialKind::Aws(_), 400 | 401 | 403) => RefusalSign::Body(&AWS_EXPIRED),
            _ => RefusalSign::None,
        }
    }

    /// Drops the cached token or keys that a refused request carried (its `Authorization`
    /// header), so the next [`Credential::apply`] mints anew. Bounded to one forced mint per
    /// [`oauth::REMINT_HOLD`], so a credential the cloud always refuses cannot loop. `true`
    /// when applying again would authorise with something else than what was refused.
    pub fn forget(&self, authorization: &http::HeaderValue) -> bool {
        let Ok(sent) = authorization.to_str() else {
            return false;
        };
        match &self.kind {
            CredentialKind::Gcp(tokens) => sent
                .strip_prefix("Bearer ")
                .is_some_and(|t| tokens.forget(t)),
            CredentialKind::Azure(tokens) => sent
                .strip_prefix("Bearer ")
                .is_some_and(|t| tokens.forget(t)),
            CredentialKind::Aws(chain) => sent
                .split_once("Credential=")
                .and_then(|(_, rest)| rest.split('/').next())
                .is_some_and(|akid| chain.0.forget(akid)),
            _ => false,
        }
    }
}

impl Credential {
    /// The SigV4 service and region: configuration, then the plugin's hints, then the host name.
    fn scope(
        &self,
        uri: &http::Uri,
        service: &Option<String>,
        region: &Option<String>,
        hints: &SigningHints,
    ) -> Result<(String, String), CredentialError> {
        let signing = |detail: String| CredentialError::Signing {
            name: self.name.clone(),
            detail,
        };
        let host = uri.host().unwrap_or_default();
        let (derived_service, derived_region) = aws_service_region(host);
        let service = service
            .clone()
            .or_else(|| hints.service.clone())
            .or(derived_service)
            .ok_or_else(|| {
                signing(format!(
                    "cannot derive the AWS service from host {host}; set `service`"
                ))
            })?;
        let region = region
            .clone()
            .or_else(|| hints.region.clone())
            .or(derived_region)
            .ok_or_else(|| {
                signing(format!(
                    "cannot derive the AWS region from host {host}; set `region`"
                ))
            })?;
        Ok((service, region))
    }
}

fn set_sensitive<B>(request: &mut http::Request<B>, value: &str) -> Result<(), String> {
    let mut v = http::HeaderValue::from_str(value)
        .map_err(|_| "the secret is not a valid header value".to_string())?;
    v.set_sensitive(true);
    request.headers_mut().insert(http::header::AUTHORIZATION, v);
    Ok(())
}

fn sign_sigv4<B>(
    request: &mut http::Request<B>,
    body: &[u8],
    service: &str,
    region: &str,
    akid: &Secret,
    secret: &Secret,
    token: Option<&Secret>,
) -> Result<(), String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;

    let credentials = aws_credential_types::Credentials::new(
        akid.expose(),
        secret.expose(),
        token.map(|t| t.expose().to_string()),
        None,
        "flotilla",
    );
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let mut headers = Vec::with_capacity(request.headers().len());
    for (k, v) in request.headers() {
        let v = v
            .to_str()
            .map_err(|_| format!("header {k} is not valid text"))?;
        headers.push((k.as_str(), v));
    }
    let uri = request.uri().to_string();
    let signable = SignableRequest::new(
        request.method().as_str(),
        uri,
        headers.into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| e.to_string())?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    instructions.apply_to_request_http1x(request);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let s = SecretSource::Value(Secret::new("hunter2"));
        assert!(!format!("{s:?}").contains("hunter2"));
        let kind = CredentialKind::Basic {
            username: "u".into(),
            password: s,
        };
        assert!(!format!("{kind:?}").contains("hunter2"));
        assert_eq!(Secret::new("x").to_string(), "<redacted>");
    }

    /// Only kinds that cache what they apply can be cured by minting anew; AWS is judged by
    /// the error code in the body, the token kinds by the 401 alone.
    #[test]
    fn refusal_signs_by_kind() {
        let named = |kind| Credential {
            name: "c".into(),
            kind,
            hosts: AllowList::default(),
        };
        let gcp = named(CredentialKind::Gcp(gcp::GcpHandle::default()));
        assert_eq!(gcp.refusal_sign(401), RefusalSign::Status);
        assert_eq!(gcp.refusal_sign(403), RefusalSign::None);
        let aws = named(CredentialKind::Aws(AwsChainHandle::default()));
        assert_eq!(aws.refusal_sign(400), RefusalSign::Body(&AWS_EXPIRED));
        assert_eq!(aws.refusal_sign(500), RefusalSign::None);
        let bearer = named(CredentialKind::Bearer {
            token: SecretSource::Value(Secret::new("x")),
        });
        assert_eq!(bearer.refusal_sign(401), RefusalSign::None);
        let header = http::HeaderValue::from_static("Bearer x");
        assert!(!bearer.forget(&header), "nothing to mint anew");
        assert!(gcp.forget(&header), "nothing cached: the next mints anew");
    }

    #[test]
    fn derives_service_and_region() {
        assert_eq!(
            aws_service_region("ec2.eu-west-1.amazonaws.com"),
            (Some("ec2".into()), Some("eu-west-1".into()))
        );
        assert_eq!(
            aws_service_region("sts.amazonaws.com"),
            (Some("sts".into()), Some("us-east-1".into()))
        );
        assert_eq!(aws_service_region("127.0.0.1"), (None, None));
    }

    #[test]
    fn sources_report_what_is_missing_not_values() {
        let e = SecretSource::Env("FLOTILLA_SURELY_UNSET_VAR".into())
            .resolve("c")
            .err();
        assert!(e.is_some_and(|e| e.to_string().contains("FLOTILLA_SURELY_UNSET_VAR")));
        let e = SecretSource::File("/nonexistent/token".into())
            .resolve("c")
            .err();
        assert!(e.is_some_and(|e| e.to_string().contains("/nonexistent/token")));
    }
}

//! The AWS credential chain for the `aws` credential kind: explicit config, environment,
//! shared credentials/config files with a profile, web identity (EKS IRSA) through STS, and
//! the EC2 instance metadata service (IMDSv2). Temporary credentials are cached and
//! refreshed five minutes before they expire.
//!
//! Implemented here on `aws-sigv4`/`aws-credential-types` and a small HTTP client rather than
//! `aws-config`, whose dependency tree (the whole smithy runtime and an AWS TLS stack) would
//! double the host's build for five well-documented HTTP exchanges.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::{CredentialError, Secret, SecretSource};

/// Resolved keys; temporary ones carry a token and an expiry.
#[derive(Clone)]
pub struct AwsKeys {
    /// Access key id.
    pub access_key_id: Secret,
    /// Secret access key.
    pub secret_access_key: Secret,
    /// Session token of temporary credentials.
    pub session_token: Option<Secret>,
    /// When temporary credentials stop working.
    pub expires: Option<SystemTime>,
    /// Which link of the chain produced them (for logs; never a value).
    pub source: &'static str,
}

impl std::fmt::Debug for AwsKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsKeys")
            .field("source", &self.source)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// How the `aws` kind finds its keys. Every field is optional; unset links are skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsChainConfig {
    /// Explicit keys (first link).
    #[serde(default)]
    pub access_key_id: Option<SecretSource>,
    /// Explicit secret.
    #[serde(default)]
    pub secret_access_key: Option<SecretSource>,
    /// Explicit session token.
    #[serde(default)]
    pub session_token: Option<SecretSource>,
    /// Profile in the shared files (default: `AWS_PROFILE`, then `default`).
    #[serde(default)]
    pub profile: Option<String>,
    /// STS endpoint for web identity (default: `AWS_ENDPOINT_URL_STS`, then the regional one).
    #[serde(default)]
    pub sts_endpoint: Option<String>,
    /// Instance metadata endpoint (default: `AWS_EC2_METADATA_SERVICE_ENDPOINT`, then 169.254.169.254).
    #[serde(default)]
    pub imds_endpoint: Option<String>,
    /// Signing region (derived from the host name or the plugin's hint when absent).
    #[serde(default)]
    pub region: Option<String>,
    /// Signing service (derived when absent).
    #[serde(default)]
    pub service: Option<String>,
}

/// The chain plus its cache of temporary credentials.
#[derive(Debug, Default)]
pub struct AwsChain {
    /// Configuration.
    pub config: AwsChainConfig,
    cache: Mutex<Option<(AwsKeys, SystemTime)>>,
    /// The shared files as they were when the cached keys were read.
    stamp: Mutex<FileStamp>,
    /// When cached keys were last dropped because the cloud refused them.
    forced: Mutex<Option<SystemTime>>,
    /// Where the `AWS_*` variables are read.
    vars: ChainEnv,
}

/// Where a chain reads its `AWS_*` variables (and `HOME`): the process's environment, as the
/// AWS SDKs do, or a fixed set, so a test states the environment of each link without changing
/// the process's own (which other threads read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ChainEnv {
    /// The process's environment.
    #[default]
    Process,
    /// These variables and no others.
    Fixed(std::collections::BTreeMap<String, String>),
}

impl ChainEnv {
    /// The value of `name`; an empty one counts as unset, as in the SDKs.
    fn get(&self, name: &str) -> Option<String> {
        match self {
            ChainEnv::Process => std::env::var(name).ok(),
            ChainEnv::Fixed(vars) => vars.get(name).cloned(),
        }
        .filter(|v| !v.is_empty())
    }
}

/// Modification time and size of the shared credentials and config files.
type FileStamp = [Option<(Option<SystemTime>, u64)>; 2];

/// The chain link of keys read from the shared files.
const SHARED_FILES: &str = "shared files";

impl Clone for AwsChain {
    fn clone(&self) -> Self {
        AwsChain {
            config: self.config.clone(),
            cache: Mutex::new(None),
            stamp: Mutex::new([None, None]),
            forced: Mutex::new(None),
            vars: self.vars.clone(),
        }
    }
}

impl PartialEq for AwsChain {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config && self.vars == other.vars
    }
}

impl Eq for AwsChain {}

const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// Long-lived keys (configured files, environment, shared files) are read again this often,
/// so a rotated file is used without a restart.
pub const STATIC_REFRESH: Duration = Duration::from_secs(5);

/// The client the host's own credential exchanges use (public CA roots, short timeouts).
pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())
}

/// Reads `key = value` pairs of one `[section]` of an INI-style AWS file.
fn ini_section(text: &str, section: &str) -> Option<Vec<(String, String)>> {
    let mut inside = false;
    let mut found = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            found |= inside;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    found.then_some(out)
}

impl AwsChain {
    /// A chain from its configuration, reading the process's environment.
    pub fn new(config: AwsChainConfig) -> Self {
        AwsChain::with_env(config, ChainEnv::Process)
    }

    /// A chain from its configuration that reads its variables from `vars`.
    pub fn with_env(config: AwsChainConfig, vars: ChainEnv) -> Self {
        AwsChain {
            config,
            cache: Mutex::new(None),
            stamp: Mutex::new([None, None]),
            forced: Mutex::new(None),
            vars,
        }
    }

    fn env(&self, name: &str) -> Option<String> {
        self.vars.get(name)
    }

    fn home(&self) -> PathBuf {
        PathBuf::from(self.env("HOME").unwrap_or_default())
    }

    /// Drops cached temporary keys whose access key id is `sent`, which the cloud refused as
    /// expired before the expiry it gave (`ExpiredToken`: a revoked session, clock skew), so
    /// the next request fetches new ones; at most once per
    /// [`REMINT_HOLD`](crate::oauth::REMINT_HOLD). `true` when the next request signs with
    /// other keys than `sent`.
    pub fn forget(&self, sent: &str) -> bool {
        let mut cache = self.cache.lock();
        let Some((keys, _)) = cache.as_ref() else {
            return true;
        };
        if !keys.access_key_id.matches(sent.as_bytes()) {
            return true;
        }
        if keys.expires.is_none() {
            // Long-lived keys are read again every few seconds anyway; new ones are not minted.
            return false;
        }
        let now = SystemTime::now();
        let mut forced = self.forced.lock();
        if forced.is_some_and(|at| {
            now.duration_since(at)
                .is_ok_and(|d| d < crate::oauth::REMINT_HOLD)
        }) {
            return false;
        }
        *forced = Some(now);
        *cache = None;
        true
    }

    /// Current keys: temporary ones from the cache while they stay valid for five more
    /// minutes; long-lived ones read again every [`STATIC_REFRESH`], so rotated files and
    /// variables are picked up. A refresh that fails keeps the last good keys (the cloud
    /// refuses them if they were really revoked).
    pub async fn keys(&self, name: &str, region: Option<&str>) -> Result<AwsKeys, CredentialError> {
        let now = SystemTime::now();
        let cached = self.cache.lock().clone();
        if let Some((k, fetched)) = &cached {
            // Keys from the shared files are read again as soon as either file changes (its
            // time or size), as the SDKs do: a rotation that deletes the old key at once must
            // not leave the pool signing with it for the refresh period.
            let files_changed =
                k.source == SHARED_FILES && self.shared_stamp() != *self.stamp.lock();
            let fresh = !files_changed
                && match k.expires {
                    Some(e) => now + REFRESH_BEFORE < e,
                    None => now
                        .duration_since(*fetched)
                        .is_ok_and(|d| d < STATIC_REFRESH),
                };
            if fresh {
                return Ok(k.clone());
            }
        }
        let stamp = self.shared_stamp();
        let keys = match self.resolve(name, region).await {
            Ok(keys) => keys,
            Err(e) => match cached {
                Some((k, _)) if k.expires.is_none_or(|x| now < x) => {
                    tracing::warn!(
                        credential = name,
                        "refreshing AWS credentials failed; keeping the last good ones: {e}"
                    );
                    *self.cache.lock() = Some((k.clone(), now));
                    return Ok(k);
                }
                _ => return Err(e),
            },
        };
        tracing::debug!(
            credential = name,
            source = keys.source,
            "AWS credentials resolved"
        );
        *self.cache.lock() = Some((keys.clone(), now));
        *self.stamp.lock() = stamp;
        Ok(keys)
    }

    /// The two shared files' paths, for the profile in force.
    fn shared_paths(&self) -> (PathBuf, PathBuf) {
        let creds_file = self
            .env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.home().join(".aws/credentials"));
        let config_file = self
            .env("AWS_CONFIG_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.home().join(".aws/config"));
        (creds_file, config_file)
    }

    /// When and how large the shared files are now (`None` for a missing one).
    fn shared_stamp(&self) -> FileStamp {
        let (creds, config) = self.shared_paths();
        let stat = |p: &PathBuf| {
            std::fs::metadata(p)
                .ok()
                .map(|m| (m.modified().ok(), m.len()))
        };
        [stat(&creds), stat(&config)]
    }

    async fn resolve(&self, name: &str, region: Option<&str>) -> Result<AwsKeys, CredentialError> {
        let unavailable = |detail: String| CredentialError::Unavailable {
            name: name.to_string(),
            detail,
        };
        let c = &self.config;
        // 1. Explicit configuration.
        if let (Some(id), Some(secret)) = (&c.access_key_id, &c.secret_access_key) {
            return Ok(AwsKeys {
                access_key_id: id.resolve(name)?,
                secret_access_key: secret.resolve(name)?,
                session_token: c
                    .session_token
                    .as_ref()
                    .map(|t| t.resolve(name))
                    .transpose()?,
                expires: None,
                source: "config",
            });
        }
        // 2. Environment.
        if let (Some(id), Some(secret)) = (
            self.env("AWS_ACCESS_KEY_ID"),
            self.env("AWS_SECRET_ACCESS_KEY"),
        ) {
            return Ok(AwsKeys {
                access_key_id: Secret::new(id),
                secret_access_key: Secret::new(secret),
                session_token: self.env("AWS_SESSION_TOKEN").map(Secret::new),
                expires: None,
                source: "environment",
            });
        }
        // 3. Shared credentials and config files.
        if let Some(keys) = self.shared_files() {
            return Ok(keys);
        }
        // 4. Web identity (EKS IRSA).
        if let (Some(role), Some(token_file)) = (
            self.env("AWS_ROLE_ARN"),
            self.env("AWS_WEB_IDENTITY_TOKEN_FILE"),
        ) {
            return self
                .web_identity(&role, &token_file, region)
                .await
                .map_err(unavailable);
        }
        // 5. Instance metadata (IMDSv2).
        if self
            .env("AWS_EC2_METADATA_DISABLED")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Err(unavailable("no AWS credentials found (config, environment, shared files, web identity; instance metadata is disabled)".into()));
        }
        self.imds().await.map_err(|e| {
            unavailable(format!(
                "no AWS credentials found (config, environment, shared files, web identity, instance metadata: {e})"
            ))
        })
    }

    fn shared_files(&self) -> Option<AwsKeys> {
        let profile = self
            .config
            .profile
            .clone()
            .or_else(|| self.env("AWS_PROFILE"))
            .unwrap_or_else(|| "default".into());
        let (creds_file, config_file) = self.shared_paths();
        let config_section = if profile == "default" {
            profile.clone()
        } else {
            format!("profile {profile}")
        };
        for (file, section) in [(creds_file, profile.clone()), (config_file, config_section)] {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            let Some(pairs) = ini_section(&text, &section) else {
                continue;
            };
            let get = |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            if let (Some(id), Some(secret)) =
                (get("aws_access_key_id"), get("aws_secret_access_key"))
            {
                return Some(AwsKeys {
                    access_key_id: Secret::new(id),
                    secret_access_key: Secret::new(secret),
                    session_token: get("aws_session_token").map(Secret::new),
                    expires: None,
                    source: SHARED_FILES,
                });
            }
        }
        None
    }

    async fn web_identity(
        &self,
        role: &str,
        token_file: &str,
        region: Option<&str>,
    ) -> Result<AwsKeys, String> {
        let token = std::fs::read_to_string(token_file)
            .map_err(|e| format!("cannot read {token_file}: {}", e.kind()))?;
        let token = zeroize::Zeroizing::new(token.trim().to_string());
        let endpoint = self
            .config
            .sts_endpoint
            .clone()
            .or_else(|| self.env("AWS_ENDPOINT_URL_STS"))
            .unwrap_or_else(|| {
                match region
                    .map(str::to_string)
                    .or_else(|| self.env("AWS_REGION"))
                {
                    Some(r) => format!("https://sts.{r}.amazonaws.com/"),
                    None => "https://sts.amazonaws.com/".to_string(),
                }
            });
        let session = self
            .env("AWS_ROLE_SESSION_NAME")
            .unwrap_or_else(|| "flotilla".into());
        let form = [
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", role),
            ("RoleSessionName", session.as_str()),
            ("WebIdentityToken", token.as_str()),
        ];
        let body = form_body(&form);
        let response = http_client()?
            .post(&endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("STS {endpoint}: {}", without_url(&e)))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| format!("STS: {}", without_url(&e)))?;
        if !status.is_success() {
            let code = xml_text(&text, "Code").unwrap_or_default();
            return Err(format!(
                "STS AssumeRoleWithWebIdentity failed: HTTP {status} {code}"
            ));
        }
        let field = |n: &str| xml_text(&text, n).ok_or_else(|| format!("STS answer lacks {n}"));
        Ok(AwsKeys {
            access_key_id: Secret::new(field("AccessKeyId")?),
            secret_access_key: Secret::new(field("SecretAccessKey")?),
            session_token: Some(Secret::new(field("SessionToken")?)),
            expires: xml_text(&text, "Expiration").and_then(|e| parse_time(&e)),
            source: "web identity",
        })
    }

    async fn imds(&self) -> Result<AwsKeys, String> {
        let base = self
            .config
            .imds_endpoint
            .clone()
            .or_else(|| self.env("AWS_EC2_METADATA_SERVICE_ENDPOINT"))
            .unwrap_or_else(|| "http://169.254.169.254".into());
        let base = base.trim_end_matches('/');
        let client = http_client()?;
        let token = client
            .put(format!("{base}/latest/api/token"))
            .header("x-aws-ec2-metadata-token-ttl-seconds", "21600")
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("IMDSv2 token: {}", without_url(&e)))?
            .text()
            .await
            .map_err(|e| without_url(&e))?;
        let get = |path: String| {
            let req = client
                .get(format!("{base}{path}"))
                .header("x-aws-ec2-metadata-token", token.as_str());
            async move {
                req.send()
                    .await
                    .and_then(|r| r.error_for_status())
                    .map_err(|e| format!("IMDS: {}", without_url(&e)))?
                    .text()
                    .await
                    .map_err(|e| without_url(&e))
            }
        };
        let roles = get("/latest/meta-data/iam/security-credentials/".into()).await?;
        let role = roles
            .lines()
            .next()
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .ok_or("no instance role")?;
        let json = get(format!("/latest/meta-data/iam/security-credentials/{role}")).await?;
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Imds {
            access_key_id: String,
            secret_access_key: String,
            token: String,
            expiration: String,
        }
        let c: Imds = serde_json::from_str(&json).map_err(|e| format!("IMDS credentials: {e}"))?;
        Ok(AwsKeys {
            access_key_id: Secret::new(c.access_key_id),
            secret_access_key: Secret::new(c.secret_access_key),
            session_token: Some(Secret::new(c.token)),
            expires: parse_time(&c.expiration),
            source: "instance metadata",
        })
    }
}

/// A reqwest error without its URL (query strings may carry tokens).
pub(crate) fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "<url>");
    }
    s
}

fn form_body(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", url_encode(k), url_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn url_encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&close)? + start;
    Some(xml[start..end].trim().to_string())
}

fn parse_time(s: &str) -> Option<SystemTime> {
    let t = chrono::DateTime::parse_from_rfc3339(s.trim()).ok()?;
    let secs = u64::try_from(t.timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_profiles() {
        let text = "[default]\naws_access_key_id = A\n\n[profile ci]\naws_access_key_id=B\naws_secret_access_key = S\n";
        assert_eq!(ini_section(text, "profile ci").map(|p| p.len()), Some(2));
        assert!(ini_section(text, "nope").is_none());
    }

    fn seeded(expires: Option<SystemTime>) -> AwsChain {
        let chain = AwsChain::new(AwsChainConfig::default());
        let keys = AwsKeys {
            access_key_id: Secret::new("ASIAREFUSED"),
            secret_access_key: Secret::new("s"),
            session_token: expires.map(|_| Secret::new("t")),
            expires,
            source: "test",
        };
        *chain.cache.lock() = Some((keys, SystemTime::now()));
        chain
    }

    /// Temporary keys the cloud refused are dropped once per hold; other keys, and long-lived
    /// keys (which no mint can replace), are kept.
    #[test]
    fn refused_temporary_keys_are_dropped_once_per_hold() {
        let later = SystemTime::now() + Duration::from_secs(3600);
        let chain = seeded(Some(later));
        assert!(chain.forget("ASIAOTHER"), "other keys: a retry signs anew");
        assert!(
            chain.cache.lock().is_some(),
            "other keys do not drop the cache"
        );
        assert!(chain.forget("ASIAREFUSED"));
        assert!(chain.cache.lock().is_none());
        *chain.cache.lock() = seeded(Some(later)).cache.lock().take();
        assert!(
            !chain.forget("ASIAREFUSED"),
            "a second forced refresh within the hold"
        );
        assert!(chain.cache.lock().is_some());
        let long_lived = seeded(None);
        assert!(!long_lived.forget("ASIAREFUSED"));
        assert!(long_lived.cache.lock().is_some());
    }

    #[test]
    fn sts_fields() {
        let xml = "<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIA1</AccessKeyId><Expiration>2030-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult>";
        assert_eq!(xml_text(xml, "AccessKeyId").as_deref(), Some("ASIA1"));
        assert!(
            xml_text(xml, "Expiration")
                .and_then(|e| parse_time(&e))
                .is_some()
        );
    }
}

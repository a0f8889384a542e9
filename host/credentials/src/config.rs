//! The credentials' part of a pool's configuration: `[[pool.credentials]]`, one table per
//! credential, validated into [`Credential`]s. The kinds and their keys come from the serde
//! shape of [`CredentialKind`], so the list of kinds in an error is always the real one.

use serde::Deserialize;

use flotilla_net::AllowList;
use flotilla_validate::{Context, KeyPath, Problems, Validate};

use crate::{Credential, CredentialKind, SecretSource};

/// One `[[pool.credentials]]` table as written.
#[derive(Debug, Clone, Deserialize)]
pub struct CredentialConfig {
    /// The name plugins use in `flotilla-credential`.
    pub name: String,
    /// `scheme://host[:port]` entries this credential may be sent to; required.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// `kind = "bearer" | "basic" | "aws-sigv4" | "aws" | "gcp" | "azure"` and that kind's keys.
    #[serde(flatten)]
    pub kind: CredentialKind,
}

impl SecretSource {
    /// The same source with a relative file path resolved against the config directory.
    pub fn resolved(&self, cx: &Context) -> SecretSource {
        match self {
            SecretSource::File(path) => SecretSource::File(cx.resolve(path)),
            other => other.clone(),
        }
    }

    /// Adds this source's problem (an empty value or env name) at `at`; `false` if there was one.
    pub fn check(&self, at: &KeyPath, problems: &mut Problems) -> bool {
        match self.problem() {
            Some(problem) => {
                problems.add(at, problem);
                false
            }
            None => true,
        }
    }
}

impl CredentialKind {
    /// The same kind with every secret file resolved against the config directory.
    fn resolved(&self, cx: &Context) -> CredentialKind {
        match self {
            CredentialKind::Bearer { token } => CredentialKind::Bearer {
                token: token.resolved(cx),
            },
            CredentialKind::Basic { username, password } => CredentialKind::Basic {
                username: username.clone(),
                password: password.resolved(cx),
            },
            CredentialKind::AwsSigv4 {
                access_key_id,
                secret_access_key,
                session_token,
                region,
                service,
            } => CredentialKind::AwsSigv4 {
                access_key_id: access_key_id.resolved(cx),
                secret_access_key: secret_access_key.resolved(cx),
                session_token: session_token.as_ref().map(|t| t.resolved(cx)),
                region: region.clone(),
                service: service.clone(),
            },
            CredentialKind::Aws(chain) => CredentialKind::Aws(chain.clone()),
            CredentialKind::Gcp(tokens) => {
                let mut config = tokens.0.config.clone();
                config.service_account_key = config.service_account_key.map(|k| k.resolved(cx));
                CredentialKind::Gcp(crate::gcp::GcpHandle::new(config))
            }
            CredentialKind::Azure(tokens) => {
                let mut config = tokens.0.config.clone();
                config.client_secret = config.client_secret.map(|s| s.resolved(cx));
                config.certificate = config.certificate.map(|s| s.resolved(cx));
                config.federated_token_file = config.federated_token_file.map(|f| cx.resolve(&f));
                CredentialKind::Azure(crate::azure::AzureHandle::new(config))
            }
        }
    }

    /// Every secret source of this kind, with its key, for checking.
    fn sources(&self) -> Vec<(&'static str, &SecretSource)> {
        match self {
            CredentialKind::Bearer { token } => vec![("token", token)],
            CredentialKind::Basic { password, .. } => vec![("password", password)],
            CredentialKind::AwsSigv4 {
                access_key_id,
                secret_access_key,
                session_token,
                ..
            } => {
                let mut v = vec![
                    ("access_key_id", access_key_id),
                    ("secret_access_key", secret_access_key),
                ];
                v.extend(session_token.as_ref().map(|t| ("session_token", t)));
                v
            }
            CredentialKind::Aws(chain) => {
                let cfg = &chain.0.config;
                [
                    ("access_key_id", &cfg.access_key_id),
                    ("secret_access_key", &cfg.secret_access_key),
                    ("session_token", &cfg.session_token),
                ]
                .into_iter()
                .filter_map(|(k, s)| s.as_ref().map(|s| (k, s)))
                .collect()
            }
            CredentialKind::Gcp(tokens) => tokens
                .0
                .config
                .service_account_key
                .iter()
                .map(|s| ("service_account_key", s))
                .collect(),
            CredentialKind::Azure(tokens) => {
                let cfg = &tokens.0.config;
                [
                    ("client_secret", &cfg.client_secret),
                    ("certificate", &cfg.certificate),
                ]
                .into_iter()
                .filter_map(|(k, s)| s.as_ref().map(|s| (k, s)))
                .collect()
            }
        }
    }
}

impl Validate for CredentialConfig {
    type Output = Credential;

    fn validate(&self, cx: &Context, at: &KeyPath, problems: &mut Problems) -> Option<Credential> {
        let mut ok = true;
        if self.name.is_empty() {
            problems.add(&at.key("name"), "is empty: every credential needs a name");
            ok = false;
        }
        if self.hosts.is_empty() {
            problems.add(
                &at.key("hosts"),
                "list the hosts this credential may be sent to",
            );
            ok = false;
        }
        let hosts = match AllowList::parse(&self.hosts) {
            Ok(hosts) => Some(hosts),
            Err(errors) => {
                for e in errors {
                    let n = self.hosts.iter().position(|h| *h == e.entry).unwrap_or(0);
                    problems.add(&at.key("hosts").index(n), e.to_string());
                }
                None
            }
        };
        if let CredentialKind::Aws(chain) = &self.kind {
            let cfg = &chain.0.config;
            if cfg.access_key_id.is_some() != cfg.secret_access_key.is_some() {
                problems.add(
                    &at.key("access_key_id"),
                    "give both access_key_id and secret_access_key, or neither",
                );
                ok = false;
            }
        }
        let kind_problems = match &self.kind {
            CredentialKind::Gcp(tokens) => tokens.0.config.problems(),
            CredentialKind::Azure(tokens) => tokens.0.config.problems(),
            _ => Vec::new(),
        };
        for (key, message) in kind_problems {
            problems.add(&at.key(key), message);
            ok = false;
        }
        let kind = self.kind.resolved(cx);
        for (key, source) in kind.sources() {
            ok &= source.check(&at.key(key), problems);
        }
        if !ok {
            return None;
        }
        Some(Credential {
            name: self.name.clone(),
            kind,
            hosts: hosts?,
        })
    }
}

/// A pool's credentials: each one valid, and no name twice.
pub fn validate_all(
    configs: &[CredentialConfig],
    cx: &Context,
    at: &KeyPath,
    problems: &mut Problems,
) -> Option<Vec<Credential>> {
    let mut out = Vec::new();
    let mut ok = true;
    for (n, config) in configs.iter().enumerate() {
        let here = at.index(n);
        if configs.iter().take(n).any(|c| c.name == config.name) {
            problems.add(
                &here.key("name"),
                format!("duplicate credential name {:?}", config.name),
            );
            ok = false;
        }
        match config.validate(cx, &here, problems) {
            Some(c) => out.push(c),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

//! The registry part of the configuration file: `[oci]`, validated into
//! [`RegistryOptions`], and a pool's `verify = { key = ... }`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use flotilla_validate::{Context, KeyPath, Problems, Validate};

use crate::{OciRef, PublicKey, RegistryOptions};

/// `[oci]`: registry access for `oci://` plugins.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciConfig {
    /// Registries (`host:port`) that may be reached over plain HTTP.
    #[serde(default)]
    pub insecure_registries: Vec<String>,
    /// Registry connect and read timeout (default 30 s).
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Extra PEM root certificates for registries (relative to the config file).
    #[serde(default)]
    pub tls_ca_files: Vec<PathBuf>,
    /// The longest a whole pull may take (default 10 min).
    #[serde(default, with = "humantime_serde")]
    pub pull_timeout: Option<Duration>,
}

impl Validate for OciConfig {
    type Output = RegistryOptions;

    fn validate(
        &self,
        cx: &Context,
        at: &KeyPath,
        problems: &mut Problems,
    ) -> Option<RegistryOptions> {
        let mut ok = true;
        if self.pull_timeout.is_some_and(|t| t.is_zero()) {
            problems.add(&at.key("pull_timeout"), "must be more than 0s");
            ok = false;
        }
        for (i, r) in self.insecure_registries.iter().enumerate() {
            if OciRef::parse(&format!("oci://{r}/x:y")).is_err() || r.contains('/') {
                problems.add(
                    &at.key("insecure_registries").index(i),
                    format!("{r:?} is not a registry like host:port (no scheme, no path)"),
                );
                ok = false;
            }
        }
        let mut ca_files = Vec::new();
        for (i, f) in self.tls_ca_files.iter().enumerate() {
            let file = cx.resolve(f);
            if cx.check_files && !file.is_file() {
                problems.add(
                    &at.key("tls_ca_files").index(i),
                    format!("{} does not exist or is not a file", file.display()),
                );
                ok = false;
            }
            ca_files.push(file);
        }
        ok.then(|| RegistryOptions {
            insecure: self.insecure_registries.clone(),
            plain_http_loopback: false,
            timeout: self.timeout.unwrap_or(Duration::from_secs(30)),
            progress: false,
            ca_files,
            pull_timeout: self
                .pull_timeout
                .unwrap_or(crate::registry::DEFAULT_PULL_TIMEOUT),
        })
    }
}

/// `verify = { key = "cosign.pub" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    /// cosign public key (PEM), relative to the config file.
    pub key: PathBuf,
}

impl Validate for VerifyConfig {
    type Output = PathBuf;

    /// The key's resolved path, once it loads as a cosign public key.
    fn validate(&self, cx: &Context, at: &KeyPath, problems: &mut Problems) -> Option<PathBuf> {
        let key = cx.resolve(&self.key);
        let at = at.key("key");
        if !key.is_file() {
            problems.add(
                &at,
                format!("{} does not exist or is not a file", key.display()),
            );
            return None;
        }
        match PublicKey::load(&key) {
            Ok(_) => Some(key),
            Err(e) => {
                problems.add(&at, e.to_string());
                None
            }
        }
    }
}

//! The plugin runtime's part of a pool's configuration: where the plugin comes from
//! (`plugin`, `pull_policy`, `verify`), its egress (`allowed_outbound_hosts`,
//! `allowed_ip_ranges`, `resolve`, `tls_ca_files`) and `[pool.limits]`. These keys sit directly
//! in `[[pool]]`; the binary hands them over, and this module turns them into a
//! [`PluginSource`] and a [`Sandbox`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;

use flotilla_credentials::Credential;
use flotilla_net::AllowList;
use flotilla_oci::config::VerifyConfig;
use flotilla_oci::{OciRef, PullPolicy};
use flotilla_validate::{Context, KeyPath, Problems, Validate};

use crate::loader::{BUILTIN_PREFIX, Embedded, PluginSource};
use crate::{EgressPolicy, Limits, Sandbox};

/// `plugin`, `pull_policy` and `verify` of one pool.
#[derive(Debug, Clone, Copy)]
pub struct SourceConfig<'a> {
    /// A path to a `.wasm` component (relative to the config file), `builtin:NAME`, or
    /// `oci://...`.
    pub plugin: &'a str,
    /// For `oci://` plugins only.
    pub pull_policy: Option<PullPolicy>,
    /// For `oci://` plugins only.
    pub verify: Option<&'a VerifyConfig>,
    /// The plugins the binary embeds, which `builtin:NAME` may name.
    pub embedded: &'a [Embedded],
}

impl Validate for SourceConfig<'_> {
    type Output = PluginSource;

    fn validate(
        &self,
        cx: &Context,
        at: &KeyPath,
        problems: &mut Problems,
    ) -> Option<PluginSource> {
        if self.plugin.starts_with("oci://") {
            let reference = OciRef::parse(self.plugin)
                .map_err(|e| problems.add(&at.key("plugin"), e.to_string()))
                .ok();
            let verify_key = match self.verify {
                None => Some(None),
                Some(v) => v.validate(cx, &at.key("verify"), problems).map(Some),
            };
            return Some(PluginSource::Oci {
                reference: reference?,
                pull_policy: self.pull_policy.unwrap_or_default(),
                verify_key: verify_key?,
            });
        }
        let builtin = match self.plugin.strip_prefix(BUILTIN_PREFIX) {
            Some(name) => match self.embedded.iter().find(|e| e.name == name) {
                Some(builtin) => Some(*builtin),
                None => {
                    let names: Vec<_> = self.embedded.iter().map(|e| e.name).collect();
                    problems.add(
                        &at.key("plugin"),
                        format!(
                            "no built-in plugin {name:?}; built in: {}",
                            names.join(", ")
                        ),
                    );
                    return None;
                }
            },
            None => None,
        };
        let path = cx.resolve(std::path::Path::new(self.plugin));
        let mut ok = true;
        if builtin.is_none() && cx.check_files && !path.is_file() {
            problems.add(
                &at.key("plugin"),
                format!("{} does not exist or is not a file", path.display()),
            );
            ok = false;
        }
        if self.pull_policy.is_some() {
            problems.add(&at.key("pull_policy"), "only applies to oci:// plugins");
            ok = false;
        }
        if self.verify.is_some() {
            problems.add(
                &at.key("verify"),
                "signatures can only be checked for oci:// plugins",
            );
            ok = false;
        }
        ok.then_some(match builtin {
            Some(builtin) => PluginSource::Builtin(builtin),
            None => PluginSource::File(path),
        })
    }
}

/// The egress keys of one pool, plus its already validated credentials.
#[derive(Debug, Clone)]
pub struct EgressConfig<'a> {
    /// `scheme://host[:port]` entries; empty denies all.
    pub allowed_outbound_hosts: &'a [String],
    /// Normally refused ranges this pool may reach (e.g. `127.0.0.0/8` for an emulator).
    pub allowed_ip_ranges: &'a [IpNet],
    /// Fixed name resolution, checked like DNS answers.
    pub resolve: &'a BTreeMap<String, Vec<IpAddr>>,
    /// Extra CA certificates (PEM files, relative to the config file) trusted for HTTPS.
    pub tls_ca_files: &'a [PathBuf],
    /// The pool's credentials.
    pub credentials: Vec<Credential>,
}

impl Validate for EgressConfig<'_> {
    type Output = EgressPolicy;

    fn validate(
        &self,
        cx: &Context,
        at: &KeyPath,
        problems: &mut Problems,
    ) -> Option<EgressPolicy> {
        let allow = match AllowList::parse(self.allowed_outbound_hosts) {
            Ok(a) => Some(a),
            Err(errors) => {
                for e in errors {
                    let n = self
                        .allowed_outbound_hosts
                        .iter()
                        .position(|h| *h == e.entry)
                        .unwrap_or(0);
                    problems.add(&at.key("allowed_outbound_hosts").index(n), e.to_string());
                }
                None
            }
        };
        let extra_roots = ca_roots(self.tls_ca_files, cx, &at.key("tls_ca_files"), problems);
        Some(EgressPolicy {
            allow: allow?,
            allowed_ip_ranges: self.allowed_ip_ranges.to_vec(),
            resolve_overrides: self.resolve.clone(),
            credentials: self.credentials.clone(),
            extra_roots: extra_roots?,
            ..EgressPolicy::default()
        })
    }
}

/// Reads every PEM certificate of every file; each unreadable file or file without a
/// certificate is a problem.
fn ca_roots(
    files: &[PathBuf],
    cx: &Context,
    at: &KeyPath,
    problems: &mut Problems,
) -> Option<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = Vec::new();
    let mut ok = true;
    for (n, f) in files.iter().enumerate() {
        let file = cx.resolve(f);
        let here = at.index(n);
        let certs = match rustls::pki_types::CertificateDer::pem_file_iter(&file) {
            Ok(certs) => certs,
            Err(e) => {
                problems.add(&here, format!("cannot read {}: {e}", file.display()));
                ok = false;
                continue;
            }
        };
        let before = roots.len();
        for cert in certs {
            match cert {
                Ok(c) => roots.push(c),
                Err(e) => {
                    problems.add(&here, format!("{}: {e}", file.display()));
                    ok = false;
                }
            }
        }
        if roots.len() == before {
            problems.add(
                &here,
                format!("{}: no PEM certificate found", file.display()),
            );
            ok = false;
        }
    }
    ok.then_some(roots)
}

impl Validate for Limits {
    type Output = Limits;

    fn validate(&self, _: &Context, at: &KeyPath, problems: &mut Problems) -> Option<Limits> {
        let found = self.problems();
        let ok = found.is_empty();
        for problem in found {
            problems.add(at, problem);
        }
        ok.then(|| self.clone())
    }
}

/// A pool's sandbox from its validated parts.
pub fn sandbox(egress: Option<EgressPolicy>, limits: Option<Limits>) -> Option<Sandbox> {
    Some(Sandbox {
        egress: egress?,
        limits: limits?,
        // Set by the host from the pool's connector key, not from the config file.
        ssh_public_key: None,
        // Set by the host from its store, for the pool.
        state: None,
        #[cfg(feature = "test-probe")]
        probe: None,
    })
}

//! The sandbox flags of a quick try (`plugin check` and `plugin test` without a config): what
//! the plugin may reach and as whom, and which flag would have allowed a request the sandbox
//! denied.

use flotilla_credentials::{Credential, CredentialKind};
use flotilla_net::AllowList;
use flotilla_plugin_runtime::{EgressPolicy, Sandbox};

/// The sandbox of a quick try, from flags: what the plugin may reach and as whom.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SandboxArgs {
    /// Allow the plugin to reach this scheme://host[:port] (repeatable).
    #[arg(long = "allow-host")]
    pub allow_hosts: Vec<String>,
    /// Allow connections to this private or loopback range, e.g. 127.0.0.0/8 (repeatable).
    #[arg(long = "allow-ip-range")]
    pub allow_ip_ranges: Vec<String>,
    /// A credential for the allowed hosts: NAME=bearer:env:VAR, NAME=bearer:file:PATH,
    /// NAME=basic:USER:env:VAR, NAME=basic:USER:file:PATH, or NAME=aws|gcp|azure (from the
    /// environment, as the host finds them) (repeatable).
    #[arg(long = "credential")]
    pub credentials: Vec<String>,
}

/// Which flag would have allowed a request the sandbox denied (`denial` as
/// `EgressStats::last_denial` words it).
pub fn flag_hint(denial: &str) -> String {
    let flag = if let Some(target) = denial
        .split(": ")
        .find_map(|part| part.strip_suffix(" is not in the allow-list"))
    {
        format!("--allow-host {target}")
    } else if denial.contains("the allow-list is empty") {
        format!("--allow-host {}", origin_of(denial))
    } else if let Some(ip) = denial
        .split("resolves to ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
    {
        let bits = if ip.contains(':') { 128 } else { 32 };
        format!("--allow-ip-range {ip}/{bits}")
    } else if let Some(name) = denial
        .split("unknown credential ")
        .nth(1)
        .map(|n| n.trim_matches('"'))
    {
        format!("--credential {name}=KIND:...")
    } else {
        return format!("refused: {denial}");
    };
    format!("refused: {denial} (allow it with {flag})")
}

/// `scheme://host:port` of the request a denial names (`METHOD URI: reason`).
fn origin_of(denial: &str) -> String {
    let uri = denial
        .split_whitespace()
        .nth(1)
        .map(|u| u.trim_end_matches(':'))
        .and_then(|u| u.parse::<http::Uri>().ok());
    match uri
        .as_ref()
        .and_then(|u| Some((u.scheme_str()?, u.host()?, u)))
    {
        Some((scheme, host, uri)) => {
            let port = uri
                .port_u16()
                .unwrap_or(if scheme == "https" { 443 } else { 80 });
            format!("{scheme}://{host}:{port}")
        }
        None => "scheme://host[:port]".to_string(),
    }
}

/// A secret source from `env:VAR` or `file:PATH`.
fn secret(spec: &str, what: &str) -> Result<serde_json::Value, String> {
    match spec.split_once(':') {
        Some(("env", var)) if !var.is_empty() => Ok(serde_json::json!({ "env": var })),
        Some(("file", path)) if !path.is_empty() => Ok(serde_json::json!({ "file": path })),
        _ => Err(format!(
            "{what}: give the secret as env:VAR or file:PATH, never the value itself"
        )),
    }
}

/// One `--credential NAME=KIND[:...]` flag as a credential bound to `hosts`.
pub fn parse_credential(flag: &str, hosts: &AllowList) -> Result<Credential, String> {
    let (name, spec) = flag
        .split_once('=')
        .filter(|(n, _)| !n.is_empty())
        .ok_or_else(|| format!("--credential {flag:?}: expected NAME=KIND[:...]"))?;
    let what = format!("--credential {name}");
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let value = match kind {
        "bearer" => serde_json::json!({ "kind": "bearer", "token": secret(rest, &what)? }),
        "basic" => {
            let (user, source) = rest.split_once(':').ok_or_else(|| {
                format!("{what}: expected basic:USER:env:VAR or basic:USER:file:PATH")
            })?;
            serde_json::json!({ "kind": "basic", "username": user, "password": secret(source, &what)? })
        }
        "aws" | "gcp" | "azure" if rest.is_empty() => serde_json::json!({ "kind": kind }),
        "aws" | "gcp" | "azure" => {
            return Err(format!(
                "{what}: {kind} takes no arguments here; use --config with a pool for its keys"
            ));
        }
        other => {
            return Err(format!(
                "{what}: unknown kind {other:?} (bearer, basic, aws, gcp, azure)"
            ));
        }
    };
    let kind: CredentialKind = serde_json::from_value(value).map_err(|e| format!("{what}: {e}"))?;
    Ok(Credential {
        name: name.to_string(),
        kind,
        hosts: hosts.clone(),
    })
}

impl SandboxArgs {
    /// The sandbox these flags describe (defaults for everything else).
    pub fn sandbox(&self) -> Result<Sandbox, String> {
        let allow = AllowList::parse(&self.allow_hosts).map_err(|errors| {
            errors
                .iter()
                .map(|e| format!("--allow-host: {e}"))
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        let mut ranges = Vec::new();
        for r in &self.allow_ip_ranges {
            ranges.push(
                r.parse()
                    .map_err(|e| format!("--allow-ip-range {r:?}: {e}"))?,
            );
        }
        let credentials = self
            .credentials
            .iter()
            .map(|c| parse_credential(c, &allow))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sandbox {
            egress: EgressPolicy {
                allow,
                allowed_ip_ranges: ranges,
                credentials,
                ..EgressPolicy::default()
            },
            ..Sandbox::default()
        })
    }
}

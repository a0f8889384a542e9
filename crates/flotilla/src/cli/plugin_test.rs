//! `flotilla plugin test`: the conformance kit on the command line, and the sandbox flags it
//! shares with `plugin check`.

use std::path::PathBuf;
use std::time::Duration;

use flotilla_credentials::{Credential, CredentialKind, Secret, SecretSource};
use flotilla_net::AllowList;
use flotilla_plugin_runtime::{EgressPolicy, PluginRuntime, RuntimeOptions, Sandbox};

use super::{Reported, print_json};
use crate::conformance::{self, KitOptions};
use crate::example_cloud::{self, ExampleCloud};

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

/// `flotilla plugin test` arguments.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The plugin component (.wasm); with --config and --pool, the pool's plugin by default.
    pub plugin: Option<PathBuf>,
    /// A Flotilla config: the pool's sandbox, credentials, limits and settings are used.
    #[arg(long, short = 'c', requires = "pool")]
    pub config: Option<PathBuf>,
    /// The pool of --config to test as.
    #[arg(long, requires = "config")]
    pub pool: Option<String>,
    /// Settings (a JSON or TOML file, or inline JSON) to call init with.
    #[arg(long)]
    pub settings: Option<String>,
    /// Start the built-in example cloud on loopback and test against it (the templates' API).
    #[arg(long, conflicts_with = "config")]
    pub example_cloud: bool,
    /// Also run the rules that create one real instance (and remove it).
    #[arg(long)]
    pub provision: bool,
    /// How long an instance may take to run, and to go away.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print a JSON report.
    #[arg(long)]
    pub json: bool,
    /// The sandbox of a quick try (ignored with --config).
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

/// Settings from a file path, or inline JSON (text starting with `{`).
fn settings_arg(arg: &str) -> Result<String, String> {
    if arg.trim_start().starts_with('{') {
        let value: serde_json::Value =
            serde_json::from_str(arg).map_err(|e| format!("--settings: not valid JSON: {e}"))?;
        if !value.is_object() {
            return Err("--settings: must be a JSON object".into());
        }
        return Ok(arg.to_string());
    }
    crate::check::read_settings(std::path::Path::new(arg))
}

/// Runs the kit; a non-zero exit on any failure.
pub async fn run(args: TestArgs) -> anyhow::Result<()> {
    let runtime = PluginRuntime::new(RuntimeOptions {
        cache_dir: flotilla_plugin_runtime::default_cache_dir(),
    })?;
    let mut settings = args
        .settings
        .as_deref()
        .map(settings_arg)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let mut example = None;
    let (plugin, sandbox, label) = match (&args.config, &args.pool) {
        (Some(path), Some(pool_name)) => {
            let cfg = crate::config::load(path)?;
            let pool = cfg
                .pools
                .iter()
                .find(|p| &p.name == pool_name)
                .ok_or_else(|| {
                    anyhow::anyhow!(format!(
                        "{}: no pool named {pool_name:?} (there are: {})",
                        path.display(),
                        cfg.pools
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            let plugin = match &args.plugin {
                Some(file) => runtime.load_file(file)?,
                None => {
                    let registry = crate::app::registry_for(&cfg)?;
                    flotilla_plugin_runtime::loader::load_plugin(
                        &runtime,
                        Some(&registry),
                        &pool.name,
                        &pool.plugin,
                    )
                    .await?
                }
            };
            if settings.is_none() {
                settings = Some(pool.settings.clone());
            }
            (plugin, pool.sandbox.clone(), format!("pool {}", pool.name))
        }
        _ => {
            let Some(file) = &args.plugin else {
                anyhow::bail!("give the plugin file, or --config and --pool");
            };
            let plugin = runtime.load_file(file)?;
            let mut quick = args.sandbox.clone();
            let mut token = None;
            if args.example_cloud {
                let secret = format!("example-{:016x}", random_u64());
                let cloud = ExampleCloud::start(&secret).await?;
                quick.allow_hosts.push(cloud.endpoint.clone());
                quick
                    .allow_ip_ranges
                    .push(format!("{}/32", cloud.addr.ip()));
                token = Some(secret);
                if settings.is_none() {
                    settings = Some(
                        serde_json::json!({
                            "endpoint": cloud.endpoint,
                            "group": example_cloud::GROUP,
                            "credential": "example",
                        })
                        .to_string(),
                    );
                }
                example = Some(cloud);
            }
            let mut sandbox = quick.sandbox().map_err(anyhow::Error::msg)?;
            if let Some(secret) = token {
                // The example cloud's token, bound to it like any pool credential.
                sandbox.egress.credentials.push(Credential {
                    name: "example".into(),
                    kind: CredentialKind::Bearer {
                        token: SecretSource::Value(Secret::new(secret)),
                    },
                    hosts: sandbox.egress.allow.clone(),
                });
            }
            (plugin, sandbox, file.display().to_string())
        }
    };
    let provider = plugin.provider("plugin-test", sandbox);
    let report = conformance::run(
        &plugin,
        &label,
        &provider,
        &KitOptions {
            settings,
            provision: args.provision,
            timeout: args.timeout,
            poll: Duration::from_millis(500),
        },
        async {
            let _ = tokio::signal::ctrl_c().await; // an error here means no Ctrl-C to wait for
        },
    )
    .await;
    drop(example);
    let mut report = report;
    if let Some(denial) = provider.egress_stats().last_denial.lock().clone()
        && let Some(rule) = report
            .rules
            .iter_mut()
            .find(|r| r.rule == "init.ok" && r.outcome == conformance::Outcome::Fail)
    {
        rule.reason = format!("{}; {}", rule.reason, flag_hint(&denial));
    }
    if args.json {
        print_json(&report)?;
    } else {
        print!("{}", report.render());
    }
    if !report.ok() {
        return Err(Reported("plugin test failed".to_string()).into());
    }
    Ok(())
}

/// A random number for the example cloud's token (the standard library's per-process keys).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}

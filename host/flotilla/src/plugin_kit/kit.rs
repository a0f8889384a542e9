//! One `plugin test` run: load the plugin (a file, or a config's pool), build its sandbox (the
//! pool's, or the quick flags' with the example cloud when asked), run the conformance kit,
//! and name the flag that would have allowed what the sandbox refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_credentials::{Credential, CredentialKind, Secret, SecretSource};
use flotilla_plugin_runtime::{LoadedPlugin, PluginRuntime, RuntimeOptions, Sandbox};

use super::conformance::{self, KitOptions, Outcome, Report};
use super::sandbox::{SandboxArgs, flag_hint};
use flotilla_example_cloud::{self as example_cloud, ExampleCloud};

/// What to test, and how.
#[derive(Debug, Clone, Default)]
pub struct TestPlan {
    /// The plugin component; with a config's pool, that pool's plugin when absent.
    pub plugin: Option<PathBuf>,
    /// A config and the pool of it to test as (its sandbox, credentials and settings).
    pub pool: Option<(PathBuf, String)>,
    /// Settings text: a JSON or TOML file, or inline JSON.
    pub settings: Option<String>,
    /// Serve the example cloud on loopback and point the plugin at it.
    pub example_cloud: bool,
    /// Also create one real instance (and remove it).
    pub provision: bool,
    /// How long an instance may take to run, and to go away.
    pub timeout: Duration,
    /// The sandbox of a quick try (ignored with a pool).
    pub sandbox: SandboxArgs,
}

/// Runs the kit on `plan`, until done or Ctrl-C.
pub async fn test(plan: &TestPlan) -> anyhow::Result<Report> {
    let runtime = PluginRuntime::new(RuntimeOptions {
        cache_dir: flotilla_plugin_runtime::default_cache_dir(),
    })?;
    let mut settings = plan
        .settings
        .as_deref()
        .map(settings_arg)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let mut example = None;
    let (plugin, sandbox, label) = match &plan.pool {
        Some((path, pool_name)) => as_pool(&runtime, plan, path, pool_name, &mut settings).await?,
        None => quick_try(&runtime, plan, &mut settings, &mut example).await?,
    };
    let provider = plugin.provider("plugin-test", sandbox);
    let mut report = conformance::run(
        &plugin,
        &label,
        &provider,
        &KitOptions {
            settings,
            provision: plan.provision,
            timeout: plan.timeout,
            poll: Duration::from_millis(500),
        },
        async {
            let _ = tokio::signal::ctrl_c().await; // an error here means no Ctrl-C to wait for
        },
    )
    .await;
    drop(example);
    if let Some(denial) = provider.egress_stats().last_denial.lock().clone()
        && let Some(rule) = report
            .rules
            .iter_mut()
            .find(|r| r.rule == "init.ok" && r.outcome == Outcome::Fail)
    {
        rule.reason = format!("{}; {}", rule.reason, flag_hint(&denial));
    }
    Ok(report)
}

/// The plugin, sandbox and label of a pool of a config: its plugin (or `plan`'s file), and its
/// settings unless `settings` has some.
async fn as_pool(
    runtime: &PluginRuntime,
    plan: &TestPlan,
    path: &std::path::Path,
    pool_name: &str,
    settings: &mut Option<String>,
) -> anyhow::Result<(LoadedPlugin, Sandbox, String)> {
    let cfg = crate::config::load(path)?;
    let pool = cfg
        .pools
        .iter()
        .find(|p| p.name == pool_name)
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
    let plugin = match &plan.plugin {
        Some(file) => runtime.load_file(file)?,
        None => {
            let registry = crate::app::registry_for(&cfg)?;
            flotilla_plugin_runtime::loader::load_plugin(
                runtime,
                Some(&registry),
                &pool.name,
                &pool.plugin,
            )
            .await?
        }
    };
    if settings.is_none() {
        *settings = Some(pool.settings.clone());
    }
    Ok((plugin, pool.sandbox.clone(), format!("pool {}", pool.name)))
}

/// The plugin, sandbox and label of a quick try of `plan`'s file: the sandbox flags, and with
/// `--example-cloud` the example cloud (kept in `example` for the run) and its token.
async fn quick_try(
    runtime: &PluginRuntime,
    plan: &TestPlan,
    settings: &mut Option<String>,
    example: &mut Option<ExampleCloud>,
) -> anyhow::Result<(LoadedPlugin, Sandbox, String)> {
    let Some(file) = &plan.plugin else {
        anyhow::bail!("give the plugin file, or --config and --pool");
    };
    let plugin = runtime.load_file(file)?;
    let mut quick = plan.sandbox.clone();
    let mut token = None;
    if plan.example_cloud {
        let secret = format!("example-{:016x}", random_u64());
        let cloud = ExampleCloud::start(example_cloud::Options {
            token: Some(secret.clone()),
            ..example_cloud::Options::default()
        })
        .await?;
        quick.allow_hosts.push(cloud.endpoint());
        quick
            .allow_ip_ranges
            .push(format!("{}/32", cloud.addr.ip()));
        token = Some(secret);
        if settings.is_none() {
            *settings = Some(
                serde_json::json!({
                    "endpoint": cloud.endpoint(),
                    "group": example_cloud::GROUP,
                    "credential": "example",
                })
                .to_string(),
            );
        }
        *example = Some(cloud);
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
    Ok((plugin, sandbox, file.display().to_string()))
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
    super::check::read_settings(Path::new(arg))
}

/// A random number for the example cloud's token (the standard library's per-process keys).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}

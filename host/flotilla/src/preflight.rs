//! The checks of `config check` that need more than the file's text: the API token can be read;
//! each connector's SSH key and Docker TLS files load; and each pool's `plugin_config` is
//! accepted by the plugin itself. `run` makes the same checks as it starts each part (the token
//! and keys at start-up, the settings at each pool's `init`, reported at the same line), but a
//! pool that fails does not stop the others.
//!
//! The plugin is asked in a sandbox that reaches nothing: its own `init` runs with the pool's
//! limits and credentials but an empty allow-list and throwaway state, so the check never
//! touches the network or the lease journal. A plugin that refuses its settings says so with
//! `invalid-config`; a plugin that got as far as a request has read them.

use flotilla_plugin_runtime::loader::PluginSource;
use flotilla_plugin_runtime::{LoadedPlugin, PluginRuntime};
use flotilla_provider::{CallError, Provider, ProviderError};
use flotilla_validate::KeyPath;

use crate::config::{Checkable, PluginParts, Problem, locate};

/// What preflight found: problems, and what it could not check (and why).
#[derive(Debug, Default)]
pub struct Preflight {
    /// Problems, located in the config file.
    pub problems: Vec<Problem>,
    /// Checks skipped, e.g. an `oci://` plugin that is not in the cache yet.
    pub skipped: Vec<String>,
}

/// Runs every check on what can be checked of a configuration (all of it when it validated).
pub async fn check(cfg: &Checkable, runtime: &PluginRuntime) -> Preflight {
    let mut out = Preflight::default();
    let problem = |key: KeyPath, message: String| locate(&cfg.path, &key, message);
    if let Some(token) = &cfg.token
        && let Err(e) = token.resolve("server.token")
    {
        out.problems.push(problem(
            KeyPath::root().key("server").key("token"),
            e.to_string(),
        ));
    }
    for pool in &cfg.pools {
        let at = pool.at.clone();
        if let Some(settings) = &pool.connector {
            let connector = at.key("connector");
            if let Some(file) = &settings.ssh_key
                && let Err(e) = flotilla_connector::PoolKey::load(file)
            {
                out.problems
                    .push(problem(connector.key("ssh_key"), e.to_string()));
            }
            if let Some(files) = &settings.docker_tls
                && let Err(e) = flotilla_connector::DockerTls::load(files)
            {
                out.problems
                    .push(problem(connector.key("docker_tls"), e.to_string()));
            }
        }
        match plugin_of(cfg, runtime, pool) {
            Ok(Some(plugin)) => {
                if let Some(why) = settings_refused(&plugin, pool).await {
                    out.problems.push(problem(at.key("plugin_config"), why));
                }
            }
            Ok(None) => out.skipped.push(format!(
                "pool {}: plugin_config not checked: {} is not in the cache yet (`flotilla plugin pull` fetches it)",
                pool.name, pool.plugin
            )),
            Err(why) => out.problems.push(problem(at.key("plugin"), why)),
        }
    }
    crate::config::sort_problems(&mut out.problems);
    out
}

/// The pool's plugin from its file, the binary, or the OCI cache; `None` for an `oci://`
/// plugin that has not been pulled (preflight does not reach registries).
fn plugin_of(
    cfg: &Checkable,
    runtime: &PluginRuntime,
    pool: &PluginParts,
) -> Result<Option<LoadedPlugin>, String> {
    match &pool.plugin {
        PluginSource::File(path) => runtime.load_file(path).map(Some).map_err(|e| e.to_string()),
        PluginSource::Builtin(builtin) => runtime
            .load_bytes(&pool.plugin.to_string(), builtin.bytes)
            .map(Some)
            .map_err(|e| e.to_string()),
        PluginSource::Oci { reference, .. } => {
            let Ok(store) = flotilla_oci::Store::for_cache_dir(cfg.cache_dir.as_deref()) else {
                return Ok(None);
            };
            let text = reference.to_string();
            let cached = store
                .lookup(&text)
                .or_else(|| store.lookup(text.trim_start_matches("oci://")));
            let Some(bytes) = cached
                .and_then(|c| store.blob_path(&c.layer_digest))
                .and_then(|p| std::fs::read(p).ok())
            else {
                return Ok(None);
            };
            runtime
                .load_bytes(&text, &bytes)
                .map(Some)
                .map_err(|e| e.to_string())
        }
    }
}

/// The plugin's own verdict on the pool's settings: `Some(why)` when it refused them.
async fn settings_refused(plugin: &LoadedPlugin, pool: &PluginParts) -> Option<String> {
    let mut sandbox = pool.sandbox.clone();
    sandbox.egress.allow = Default::default();
    sandbox.egress.allowed_ip_ranges.clear();
    sandbox.egress.resolve_overrides.clear();
    sandbox.egress.quiet_denials = true;
    sandbox.state = None;
    let provider = plugin.provider(&pool.name, sandbox);
    let result = provider.init(&pool.settings).await;
    // The provider is dropped unused; its instance holds nothing outside this process.
    let _ = provider.shutdown().await;
    match result {
        Err(CallError::Provider {
            error: ProviderError::InvalidConfig(why),
            ..
        }) => {
            // Refused after a request was denied: the plugin read its settings and then
            // judged what the network would have said; that is not a settings problem.
            let tried_network = provider.egress_stats().last_denial.lock().is_some();
            (!tried_network).then(|| format!("the plugin refused it: {why}"))
        }
        // Anything else: the settings were read (a transient or network failure is the
        // plugin trying to reach its cloud, which this sandbox does not allow).
        _ => None,
    }
}

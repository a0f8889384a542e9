//! `flotilla plugin check`: load a plugin, validate it against the world, optionally `init` it,
//! and give a clear verdict for humans or JSON for machines.

use std::path::{Path, PathBuf};

use serde::Serialize;

use flotilla_plugin_runtime::{CacheOutcome, ComponentShape, ImportKind, PluginRuntime, Sandbox};
use flotilla_provider::{Provider, ProviderInfo};

/// What `plugin check` found, printed as text or JSON.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    /// Whether the plugin is usable.
    pub ok: bool,
    /// The file checked.
    pub file: String,
    /// Its sha256, when it could be read.
    pub sha256: Option<String>,
    /// Its size in bytes.
    pub size: Option<usize>,
    /// Its world, imports and exports, when it passed the load checks.
    #[serde(flatten)]
    pub shape: Option<ComponentShape>,
    /// Whether this check compiled or used the cache.
    pub compile: Option<CacheOutcome>,
    /// The result of `init`, when settings were given and init succeeded.
    pub provider_info: Option<ProviderInfo>,
    /// Why it is not usable.
    pub error: Option<String>,
}

/// Inputs of `plugin check`.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The plugin file.
    pub file: PathBuf,
    /// Settings (JSON or TOML) to `init` it with.
    pub settings: Option<PathBuf>,
    /// The sandbox of the `init` call (allowed hosts and ranges, credentials).
    pub sandbox: Sandbox,
    /// Compile cache directory; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
}

/// Reads a settings file as JSON text: `.toml` files are converted, anything else must be JSON.
pub fn read_settings(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read settings: {e}", path.display()))?;
    if path.extension().is_some_and(|e| e == "toml") {
        let value: toml::Value =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        return serde_json::to_string(&value).map_err(|e| format!("{}: {e}", path.display()));
    }
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: settings are not valid JSON: {e}", path.display()))?;
    if !value.is_object() {
        return Err(format!(
            "{}: settings must be a JSON object",
            path.display()
        ));
    }
    Ok(text)
}

/// A `builtin:NAME` argument: the embedded plugin, or why there is none; `None` for a path.
pub fn builtin(arg: &Path) -> Option<Result<&'static flotilla_builtin::Builtin, String>> {
    let name = arg.to_str()?.strip_prefix(flotilla_builtin::PREFIX)?;
    Some(flotilla_builtin::find(name).ok_or_else(|| {
        format!(
            "no built-in plugin {name:?}; built in: {}",
            flotilla_builtin::names()
        )
    }))
}

/// Runs the check; never panics, every failure lands in `error`.
pub async fn check(options: &CheckOptions) -> CheckReport {
    let mut report = CheckReport {
        ok: false,
        file: options.file.display().to_string(),
        sha256: None,
        size: None,
        shape: None,
        compile: None,
        provider_info: None,
        error: None,
    };
    let settings = match options.settings.as_deref().map(read_settings).transpose() {
        Ok(s) => s,
        Err(e) => {
            report.error = Some(e);
            return report;
        }
    };
    let runtime = match PluginRuntime::new(flotilla_plugin_runtime::RuntimeOptions {
        cache_dir: options.cache_dir.clone(),
    }) {
        Ok(r) => r,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    let loaded = match builtin(&options.file) {
        Some(Ok(b)) => runtime.load_bytes(&report.file, b.bytes),
        Some(Err(e)) => {
            report.error = Some(e);
            return report;
        }
        None => runtime.load_file(&options.file),
    };
    let plugin = match loaded {
        Ok(p) => p,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    report.sha256 = Some(plugin.sha256.clone());
    report.size = Some(plugin.size);
    report.shape = Some(plugin.shape.clone());
    report.compile = Some(plugin.cache);
    if let Some(settings) = settings {
        let provider = plugin.provider("check", options.sandbox.clone());
        match provider.init(&settings).await {
            Ok(info) => report.provider_info = Some(info),
            Err(e) => {
                // Name what the sandbox refused, and the flag that would allow it.
                let denial = provider.egress_stats().last_denial.lock().clone();
                report.error = Some(match denial {
                    Some(d) => format!("{e}\n          {}", super::sandbox::flag_hint(&d)),
                    None => e.to_string(),
                });
                return report;
            }
        }
        // The check is over either way; a plugin that fails its shutdown is still reported.
        if let Err(e) = provider.shutdown().await {
            report.error = Some(format!("shutdown: {e}"));
            return report;
        }
    }
    report.ok = true;
    report
}

impl CheckReport {
    /// Human-readable rendering.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!("plugin:   {}\n", self.file));
        if let (Some(sha), Some(size)) = (&self.sha256, self.size) {
            out.push_str(&format!(
                "sha256:   {sha}\nsize:     {} KiB\n",
                size.div_ceil(1024)
            ));
        }
        if let Some(shape) = &self.shape {
            out.push_str(&format!("world:    {}\n", shape.world));
            out.push_str("imports:\n");
            for import in &shape.imports {
                let how = match import.kind {
                    ImportKind::Contract => "contract",
                    ImportKind::Http => "outbound HTTP, allow-listed",
                    ImportKind::WasiRuntime => "WASI runtime, nothing granted",
                    ImportKind::TestProbe => "test probe (test builds only)",
                };
                out.push_str(&format!("  {:<45} {how}\n", import.name));
            }
            out.push_str("exports:\n");
            for export in &shape.exports {
                out.push_str(&format!("  {export}\n"));
            }
        }
        match self.compile {
            Some(CacheOutcome::Hit) => out.push_str("compile:  from cache\n"),
            Some(CacheOutcome::Compiled { millis }) => {
                out.push_str(&format!("compile:  {millis} ms (cached now)\n"))
            }
            Some(CacheOutcome::Uncached { millis }) => {
                out.push_str(&format!("compile:  {millis} ms (not cached)\n"))
            }
            None => {}
        }
        if let Some(info) = &self.provider_info {
            out.push_str(&format!(
                "init:     ok: id={} version={} max-size={} heartbeat={} expiring-connect-info={}\n",
                info.id, info.version, info.max_size, info.heartbeat, info.expiring_connect_info
            ));
        }
        match &self.error {
            None => out.push_str("verdict:  OK: a valid Flotilla provider plugin\n"),
            Some(e) => out.push_str(&format!("verdict:  REJECTED: {e}\n")),
        }
        out
    }
}

/// `plugin export builtin:NAME -o FILE`: the embedded bytes, written atomically; prints the
/// digest to pin.
pub fn export(name: &str, output: &std::path::Path) -> anyhow::Result<()> {
    let builtin = match builtin(std::path::Path::new(name)) {
        Some(found) => found.map_err(anyhow::Error::msg)?,
        None => anyhow::bail!(
            "{name:?} is not a built-in plugin: name one as builtin:NAME ({})",
            flotilla_builtin::names()
        ),
    };
    flotilla_net::fs::write_atomic(output, builtin.bytes)
        .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", output.display()))?;
    println!(
        "{}: {name} ({} bytes, sha256:{})",
        output.display(),
        builtin.bytes.len(),
        flotilla_net::sha256_hex(builtin.bytes)
    );
    Ok(())
}

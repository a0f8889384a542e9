//! The plugin runtime: the only crate that knows wasmtime.
//!
//! Owns: the engine, loading (from a file or an OCI reference, through [`loader`]), load-time
//! checks, the compile cache, the sandbox and its limits, the egress hook, and the adapter from
//! the WIT bindings to [`flotilla_provider::Provider`].
//! Must not know: scaling policy, config files, the API or metrics.
//!
//! A [`PluginRuntime`] owns the engine (with epoch interruption), the linker and the compile
//! cache. [`PluginRuntime::load_file`] checks and compiles a component into a [`LoadedPlugin`]
//! (an `InstancePre`), and [`LoadedPlugin::provider`] turns it into a [`WasmProvider`], the
//! implementation of [`flotilla_provider::Provider`] the scaler uses.

mod adapter;
mod cache;
pub mod config;
mod contract;
mod egress;
mod inspect;
mod limits;
pub mod loader;
mod output;
#[cfg(feature = "test-probe")]
mod probe;

#[cfg(feature = "test-probe")]
pub use probe::Probe;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

pub use adapter::WasmProvider;
pub use cache::{CacheOutcome, default_cache_dir};
pub use egress::{BlockedAddress, EgressPolicy, EgressStats};
pub use inspect::{CONTRACT_VERSION, ComponentShape, ImportInfo, ImportKind, LoadError, WORLD};
pub use limits::Limits;

use limits::AggregateLimiter;
use output::{GuestOutput, Origin};

/// The bindings of the provider world in the WIT package at `$path` (relative to this crate),
/// as the host calls every contract version: async exports, wasmtime's own WASI types.
macro_rules! provider_bindings {
    ($path:literal) => {
        wasmtime::component::bindgen!({
            path: $path,
            world: "flotilla:provider/provider",
            exports: { default: async },
            // State writes are durable commits: they run on the blocking pool, not on a
            // worker the other pools' leases need.
            imports: {
                "flotilla:provider/state.set": async,
                "flotilla:provider/state.delete": async,
            },
            with: {
                "wasi:http": wasmtime_wasi_http::p2::bindings::http,
                "wasi:io": wasmtime_wasi::p2::bindings::io,
                "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
            },
            require_store_data_send: true,
        });
    };
}
pub(crate) use provider_bindings;

/// The current contract's bindings.
mod bindings {
    crate::provider_bindings!("../../wit");
}

/// Granularity of the epoch clock that enforces deadlines inside wasm code.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Options for the runtime shared by every pool in a process.
#[derive(Debug, Clone, Default)]
pub struct RuntimeOptions {
    /// Where compiled plugins are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
}

/// Increments the engine's epoch in the background, which makes wasm deadlines fire.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("flotilla-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The ticker only sleeps and increments; a panic there has nothing left to clean.
            let _ = t.join();
        }
    }
}

/// When the running wasm code must stop: `budget` after the call started, with the clock read
/// at the first epoch check that asks (rather than when the call starts), so a call that
/// completes at once reads no clock. The deadline then falls late by at most one epoch tick.
/// A call's waits on the host are bounded apart, by a timer set at its first wait.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    budget: std::time::Duration,
    due: Option<std::time::Instant>,
}

impl Deadline {
    fn after(budget: std::time::Duration) -> Self {
        Deadline { budget, due: None }
    }

    /// The instant it falls due, fixed at the first ask.
    fn due(&mut self) -> std::time::Instant {
        *self
            .due
            .get_or_insert_with(|| std::time::Instant::now() + self.budget)
    }
}

/// Engine, linker and compile cache shared by every plugin in the process.
pub struct PluginRuntime {
    engine: Engine,
    linker: Linker<HostState>,
    cache: cache::CompileCache,
    _ticker: EpochTicker,
}

impl std::fmt::Debug for PluginRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRuntime")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

/// A checked and compiled plugin, ready to instantiate cheaply any number of times.
pub struct LoadedPlugin {
    pre: contract::ProviderPre,
    /// Where it came from, for messages.
    pub source: String,
    /// Hex sha256 of the wasm bytes.
    pub sha256: String,
    /// Size of the wasm in bytes.
    pub size: usize,
    /// What it imports and exports.
    pub shape: ComponentShape,
    /// Whether this load compiled.
    pub cache: CacheOutcome,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("source", &self.source)
            .field("sha256", &self.sha256)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

/// Per-pool sandbox settings applied to every instance of a plugin.
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    /// Outbound HTTP policy.
    pub egress: EgressPolicy,
    /// Resource limits.
    pub limits: Limits,
    /// The pool's SSH public key (one OpenSSH line), offered through `instance-access`.
    pub ssh_public_key: Option<Arc<str>>,
    /// Where the plugin's `state` is kept (the host's store); `None`: in memory, for the
    /// provider's life.
    pub state: Option<Arc<dyn flotilla_provider::PluginState>>,
    /// Test-only: where `flotilla:test/probe` reports go.
    #[cfg(feature = "test-probe")]
    pub probe: Option<Probe>,
}

impl PluginRuntime {
    /// Builds the engine, links the world with nothing granted, and starts the epoch clock.
    pub fn new(options: RuntimeOptions) -> Result<Self, LoadError> {
        let host_err = |e: wasmtime::Error| LoadError::Cache(format!("engine setup: {e:#}"));
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.max_wasm_stack(1 << 20);
        let engine = Engine::new(&config).map_err(host_err)?;
        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(host_err)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(host_err)?;
        egress::add_to_linker(&mut linker).map_err(host_err)?;
        bindings::flotilla::provider::log::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(host_err)?;
        bindings::flotilla::provider::types::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(host_err)?;
        bindings::flotilla::provider::instance_access::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(host_err)?;
        bindings::flotilla::provider::group_limits::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(host_err)?;
        bindings::flotilla::provider::state::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(host_err)?;
        #[cfg(feature = "test-probe")]
        probe::add_to_linker(&mut linker).map_err(host_err)?;
        let cache = cache::CompileCache::new(options.cache_dir)?;
        let ticker = EpochTicker::start(engine.clone())
            .map_err(|e| LoadError::Cache(format!("cannot start the epoch thread: {e}")))?;
        Ok(PluginRuntime {
            engine,
            linker,
            cache,
            _ticker: ticker,
        })
    }

    /// Reads, checks and compiles (or loads from cache) a plugin file.
    pub fn load_file(&self, path: &Path) -> Result<LoadedPlugin, LoadError> {
        let source = path.display().to_string();
        // An unchanged file whose compiled entry exists is neither read nor hashed again.
        if let Some((sha256, entry, size)) = self.cache.known(&self.engine, path)
            && let Some(component) = self.cache.load_entry(&self.engine, &entry)
        {
            return self.finish_load(source, sha256, size as usize, component, CacheOutcome::Hit);
        }
        let before = cache::FileIdentity::of(path);
        let bytes = inspect::read_plugin(path)?;
        let loaded = self.load_checked(source, &bytes)?;
        self.cache.remember(path, before, &loaded.sha256);
        Ok(loaded)
    }

    /// Header-only checks (empty, not wasm, core module) that need no compilation.
    pub fn check_header(source: &str, bytes: &[u8]) -> Result<(), LoadError> {
        inspect::check_header(source, bytes)
    }

    /// Checks and compiles plugin bytes from any source (e.g. an OCI blob).
    pub fn load_bytes(&self, source: &str, bytes: &[u8]) -> Result<LoadedPlugin, LoadError> {
        inspect::check_header(source, bytes)?;
        self.load_checked(source.to_string(), bytes)
    }

    fn load_checked(&self, source: String, bytes: &[u8]) -> Result<LoadedPlugin, LoadError> {
        let sha256 = flotilla_net::sha256_hex(bytes);
        let (component, cache) = self.cache.load(&self.engine, &source, &sha256, bytes)?;
        self.finish_load(source, sha256, bytes.len(), component, cache)
    }

    /// Checks a compiled component against the contract and links it.
    fn finish_load(
        &self,
        source: String,
        sha256: String,
        size: usize,
        component: wasmtime::component::Component,
        cache: CacheOutcome,
    ) -> Result<LoadedPlugin, LoadError> {
        let shape = inspect::check_shape(&source, &self.engine, &component)?;
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| LoadError::Invalid {
                    path: source.clone(),
                    message: format!("{e:#}"),
                })?;
        let pre = contract::ProviderPre::new(&shape.instance_group, instance_pre).map_err(|e| {
            LoadError::ContractMismatch {
                path: source.clone(),
                message: format!("{e:#}"),
            }
        })?;
        Ok(LoadedPlugin {
            pre,
            source,
            sha256,
            size,
            shape,
            cache,
        })
    }
}

impl LoadedPlugin {
    /// A provider for one pool; each pool gets its own instances and sandbox.
    pub fn provider(&self, pool: &str, sandbox: Sandbox) -> WasmProvider {
        let origin = Origin {
            pool: Arc::from(pool),
            plugin: Arc::from(&self.sha256[..12]),
        };
        WasmProvider::new(self.pre.clone(), origin, sandbox)
    }
}

/// Everything one plugin instance's store holds.
pub(crate) struct HostState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: egress::EgressHooks,
    limiter: AggregateLimiter,
    origin: Origin,
    ssh_public_key: Option<Arc<str>>,
    state: Arc<dyn flotilla_provider::PluginState>,
    /// `state` writes the running call may still make.
    state_writes_left: u32,
    log_lines_left: u32,
    /// Lines dropped in the current call (the first drop is logged).
    log_dropped: u64,
    /// When the running call (or instantiation) must end; wasm code past it is interrupted at
    /// its next epoch check.
    deadline: Deadline,
    /// The group's maximum as the running call last reported it (`group-limits`).
    reported_max: Option<flotilla_provider::GroupMax>,
    #[cfg(feature = "test-probe")]
    probe: Option<Probe>,
}

impl HostState {
    fn new(
        origin: Origin,
        limits: &Limits,
        ssh_public_key: Option<Arc<str>>,
        state: Arc<dyn flotilla_provider::PluginState>,
        egress: &egress::EgressShared,
        stdout: GuestOutput,
        stderr: GuestOutput,
    ) -> Self {
        // Nothing is granted: no preopens, env, args or stdin (WasiCtxBuilder's defaults), and
        // no sockets or name lookups.
        let wasi = WasiCtx::builder()
            .stdout(stdout)
            .stderr(stderr)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .build();
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(limits.http_fields_bytes);
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.resource_entries);
        HostState {
            wasi,
            http,
            table,
            hooks: egress::EgressHooks {
                policy: egress.policy.clone(),
                stats: egress.stats.clone(),
                origin: origin.clone(),
                requests_this_call: 0,
                connections: egress.connections.clone(),
                tls: egress.tls.clone(),
                budget: egress.budget.clone(),
                scope: egress::CallScope::default(),
            },
            limiter: AggregateLimiter::new(limits.clone()),
            origin,
            ssh_public_key,
            state,
            state_writes_left: flotilla_provider::StateLimits::default().writes_per_call,
            log_lines_left: limits.log_lines_per_call,
            log_dropped: 0,
            deadline: Deadline::after(std::time::Duration::ZERO),
            reported_max: None,
            #[cfg(feature = "test-probe")]
            probe: None,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

impl bindings::flotilla::provider::types::Host for HostState {}

impl bindings::flotilla::provider::instance_access::Host for HostState {
    fn ssh_public_key(&mut self) -> Option<String> {
        self.ssh_public_key.as_deref().map(str::to_string)
    }
}

const MAX_LOG_LINE: usize = 4096;

impl bindings::flotilla::provider::group_limits::Host for HostState {
    fn report_max_size(&mut self, max_size: Option<u32>) {
        self.reported_max = Some(max_size.into());
    }
}

impl bindings::flotilla::provider::state::Host for HostState {
    fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, wit_state::StateError> {
        self.state.get(&key).map_err(state_error)
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), wit_state::StateError> {
        self.state_write()?;
        let state = self.state.clone();
        let result = blocking(move || state.set(&key, &value)).await;
        if let Err(e) = &result {
            tracing::warn!(target: "flotilla::plugin", pool = %self.origin.pool, plugin = %self.origin.plugin, "plugin state write refused: {e:?}");
        }
        result
    }

    async fn delete(&mut self, key: String) -> Result<(), wit_state::StateError> {
        self.state_write()?;
        let state = self.state.clone();
        blocking(move || state.delete(&key)).await
    }

    fn keys(&mut self) -> Result<Vec<String>, wit_state::StateError> {
        self.state.keys().map_err(state_error)
    }
}

use bindings::flotilla::provider::state as wit_state;

impl HostState {
    /// Takes one of the running call's state writes, or refuses the write.
    fn state_write(&mut self) -> Result<(), wit_state::StateError> {
        if self.state_writes_left == 0 {
            return Err(wit_state::StateError::TooLarge(format!(
                "at most {} state writes per call",
                flotilla_provider::StateLimits::default().writes_per_call
            )));
        }
        self.state_writes_left -= 1;
        Ok(())
    }
}

/// Runs a state write on tokio's blocking pool (a durable commit waits for the disk).
async fn blocking(
    write: impl FnOnce() -> Result<(), flotilla_provider::StateError> + Send + 'static,
) -> Result<(), wit_state::StateError> {
    tokio::task::spawn_blocking(write)
        .await
        .unwrap_or_else(|e| {
            Err(flotilla_provider::StateError::Unavailable(format!(
                "the write did not finish: {e}"
            )))
        })
        .map_err(state_error)
}

fn state_error(e: flotilla_provider::StateError) -> wit_state::StateError {
    match e {
        flotilla_provider::StateError::TooLarge(m) => wit_state::StateError::TooLarge(m),
        e @ flotilla_provider::StateError::Unavailable(_) => {
            wit_state::StateError::Unavailable(e.to_string())
        }
    }
}

impl bindings::flotilla::provider::log::Host for HostState {
    fn emit(&mut self, level: bindings::flotilla::provider::log::Level, message: String) {
        use bindings::flotilla::provider::log::Level;
        if self.log_lines_left == 0 {
            if self.log_dropped == 0 {
                tracing::warn!(
                    target: "flotilla::plugin::log",
                    pool = %self.origin.pool,
                    plugin = %self.origin.plugin,
                    "plugin log cap reached; further lines of this call are dropped"
                );
            }
            self.log_dropped += 1;
            return;
        }
        self.log_lines_left -= 1;
        // Capped, and control characters escaped: a guest cannot forge host log lines.
        let msg = output::guest_text(&message, MAX_LOG_LINE);
        let msg = msg.as_str();
        let (pool, plugin) = (&*self.origin.pool, &*self.origin.plugin);
        match level {
            Level::Trace => tracing::trace!(target: "flotilla::plugin::log", pool, plugin, "{msg}"),
            Level::Debug => tracing::debug!(target: "flotilla::plugin::log", pool, plugin, "{msg}"),
            Level::Info => tracing::info!(target: "flotilla::plugin::log", pool, plugin, "{msg}"),
            Level::Warn => tracing::warn!(target: "flotilla::plugin::log", pool, plugin, "{msg}"),
            Level::Error => tracing::error!(target: "flotilla::plugin::log", pool, plugin, "{msg}"),
        }
    }
}

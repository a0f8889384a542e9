//! `flotilla run`: load every pool's plugin, run the scalers, serve the API, reload policies
//! on SIGHUP or a config change, and drain on SIGTERM.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::api::{AppState, router};
use crate::config::{self, Config, PluginSource};
use crate::metrics::Metrics;
use crate::pools::{PoolState, Pools, RunningPool};
use flotilla_connector::{Connector, DockerTls, PoolKey};
use flotilla_oci::{AuthStore, Registry, Store};
use flotilla_plugin_runtime::loader::load_plugin;
use flotilla_plugin_runtime::{PluginRuntime, RuntimeOptions};
use flotilla_provider::Provider;
use flotilla_scaler::{
    AlwaysReady, Clock, LeaseIds, LeaseJournal, Policy, PoolCore, PoolHandle, Readiness,
    SystemClock,
};
use flotilla_store::Store as LeaseStore;
use tracing::Instrument;

/// What every pool's start shares: the runtime, the registry, the lease store.
struct StartContext {
    config_path: PathBuf,
    runtime: PluginRuntime,
    registry: Option<Registry>,
    state_dir: Option<PathBuf>,
    store: Option<Arc<LeaseStore>>,
    /// Lease ids, shared by every pool so an id names one lease of one pool.
    lease_ids: LeaseIds,
    /// Policies reloaded (SIGHUP, file change) while a pool was not running yet, so that it
    /// starts with the current ones.
    policies: Mutex<BTreeMap<String, Vec<Policy>>>,
}

/// The registry client for `oci://` pools: the config's `[oci]` section, cache under `cache_dir`.
pub fn registry_for(cfg: &Config) -> anyhow::Result<Registry> {
    let store = Store::for_cache_dir(cfg.cache_dir.as_deref())?;
    Ok(Registry::new(
        cfg.registry.clone(),
        AuthStore::default_paths(),
        store,
    ))
}

/// SSH readiness with the pool's key when `[pool.connector]` is set; `None` otherwise (an
/// instance the cloud reports running is ready).
fn connector(
    pool: &config::Pool,
    state_dir: Option<&Path>,
) -> anyhow::Result<Option<Arc<Connector>>> {
    let Some(settings) = &pool.connector else {
        return Ok(None);
    };
    let key = match (&settings.ssh_key, state_dir) {
        (Some(file), _) => PoolKey::load(file)?,
        (None, Some(dir)) => PoolKey::load_or_generate(&dir.join("keys"), &pool.name)?,
        (None, None) => anyhow::bail!(
            "no state directory to keep the pool's SSH key in: set state_dir, or [pool.connector] ssh_key"
        ),
    };
    tracing::info!(pool = %pool.name, public_key = %key.public_openssh(), fingerprint = %key.fingerprint(), "pool SSH key (install the public key on the instances)");
    let mut connector = Connector::new(key, settings.clone());
    if let Some(dir) = state_dir {
        let pins = dir.join("host-keys");
        flotilla_net::fs::ensure_private_dir(&pins)
            .with_context(|| format!("cannot make {}", pins.display()))?;
        connector = connector
            .with_pins_file(&pins.join(format!("{}.json", pool.name)))
            .map_err(|e| anyhow::anyhow!("pool {}: host-key pins: {e}", pool.name))?;
    }
    if let Some(files) = &settings.docker_tls {
        let tls = DockerTls::load(files)
            .map_err(|e| anyhow::anyhow!("[pool.connector] docker_tls: {e}"))?;
        connector = connector.with_docker_tls(tls);
    }
    Ok(Some(Arc::new(connector)))
}

async fn start_pool(
    ctx: &StartContext,
    metrics: &Metrics,
    pool: &config::Pool,
) -> anyhow::Result<RunningPool> {
    let (runtime, registry, state_dir) = (
        &ctx.runtime,
        ctx.registry.as_ref(),
        ctx.state_dir.as_deref(),
    );
    let plugin = load_plugin(runtime, registry, &pool.name, &pool.plugin)
        .await
        .with_context(|| format!("pool {}", pool.name))?;
    let plugin_digest = format!("sha256:{}", plugin.sha256);
    tracing::info!(pool = %pool.name, plugin = %pool.plugin, plugin_digest = %plugin_digest, cache = ?plugin.cache, "plugin loaded");
    // Every line the pool's scaler, readiness checks and plugin calls log carries the pool
    // and the plugin digest (`span` in --log-json lines), so log pipelines can join them.
    let span = tracing::info_span!("pool", pool = %pool.name, plugin_digest = %plugin_digest);
    let connector = connector(pool, state_dir)?;
    let mut sandbox = pool.sandbox.clone();
    sandbox.ssh_public_key = connector.as_ref().map(|c| Arc::from(c.public_key()));
    if let Some(store) = &ctx.store {
        let state = store.plugin_state(&pool.name)?;
        sandbox.state = Some(Arc::new(state) as Arc<dyn flotilla_provider::PluginState>);
    }
    let provider: Arc<dyn Provider> = Arc::new(plugin.provider(&pool.name, sandbox));
    let info = init_plugin(ctx, pool, provider.as_ref(), &span).await?;
    tracing::info!(pool = %pool.name, id = %info.id, version = %info.version, max_size = info.max_size, "plugin initialised");
    let clock = Arc::new(SystemClock);
    let policies = lock(&ctx.policies)
        .get(&pool.name)
        .cloned()
        .unwrap_or_else(|| pool.policies.clone());
    let mut core = PoolCore::new(pool.scaler.clone(), policies, clock.now());
    core.set_provider_info(&info);
    core.share_lease_ids(ctx.lease_ids.clone());
    let journal = restore(ctx, pool, &mut core, clock.now())?;
    let pool_metrics = metrics.pool(&pool.name, &plugin.sha256[..12]);
    let readiness: Arc<dyn Readiness> = match &connector {
        Some(c) => c.clone(),
        None => Arc::new(AlwaysReady),
    };
    let handle = span.in_scope(|| {
        PoolHandle::spawn_journaled(
            pool.name.clone(),
            core,
            provider,
            clock,
            readiness,
            Some(Arc::new(pool_metrics.clone())),
            journal,
        )
    });
    let described = Arc::new(crate::sd::Described::default());
    // A connector keeps its readiness checks' answers; without one, the machine list asks.
    let describing = connector.is_none().then(|| {
        let asking = described.clone().keep_asking(handle.clone());
        crate::sd::AbortOnDrop(tokio::spawn(asking.instrument(span.clone())))
    });
    Ok(RunningPool {
        handle,
        connector,
        metrics: pool_metrics,
        delete_on_shutdown: pool.delete_instances_on_shutdown,
        plugin_digest,
        plugin: pool.plugin.to_string(),
        exporter_ports: pool.exporter_ports.clone(),
        group: info.id.clone(),
        described,
        describing,
        fallback: pool.fallback.clone(),
    })
}

/// The plugin's `init` with the pool's settings; settings it refuses are named where they
/// are in the config file, as `config check` names them.
async fn init_plugin(
    ctx: &StartContext,
    pool: &config::Pool,
    provider: &dyn Provider,
    span: &tracing::Span,
) -> anyhow::Result<flotilla_provider::ProviderInfo> {
    match provider.init(&pool.settings).instrument(span.clone()).await {
        Ok(info) => Ok(info),
        // The plugin refused its settings: say where they are, in the words `config check`
        // uses for the same problem, so the operator sees the line to fix.
        Err(flotilla_provider::CallError::Provider {
            error: flotilla_provider::ProviderError::InvalidConfig(why),
            ..
        }) => {
            let at = flotilla_validate::KeyPath::root()
                .key("pool")
                .index(pool.index)
                .key("plugin_config");
            let problem = config::locate(
                &ctx.config_path,
                &at,
                format!("the plugin refused it: {why}"),
            );
            anyhow::bail!("pool {}: {problem}", pool.name);
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("pool {}", pool.name))),
    }
}

/// The pool's leases and use counts from the journal into `core`, and the journal the pool
/// writes from now on (`None` without a state directory).
fn restore(
    ctx: &StartContext,
    pool: &config::Pool,
    core: &mut PoolCore,
    now: flotilla_scaler::Millis,
) -> anyhow::Result<Option<Arc<dyn LeaseJournal>>> {
    Ok(match &ctx.store {
        Some(store) => {
            let restored = store.load(&pool.name)?;
            if !restored.leases.is_empty() {
                tracing::info!(pool = %pool.name, leases = restored.leases.len(), "leases restored from the journal; acquired ones are bound again at the first update");
            }
            core.restore_with_tenants(now, restored.leases, restored.uses, restored.tenants);
            Some(Arc::new(store.journal(&pool.name)) as Arc<dyn LeaseJournal>)
        }
        None => None,
    })
}

/// Raises the soft limit of open files to the hard one: every job's Docker streams, long polls
/// and SSH channels are descriptors, and distributions start services at a soft 1024 that a
/// hundred jobs pass. A hard limit the operator set stays the bound.
fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        // Linux refuses a soft limit above nr_open even under an unlimited hard limit.
        let target = limit.maximum.unwrap_or(1 << 20);
        match limit.current {
            Some(current) if current < target => {
                let raised = Rlimit {
                    current: Some(target),
                    maximum: limit.maximum,
                };
                match setrlimit(Resource::Nofile, raised) {
                    Ok(()) => {
                        tracing::info!(
                            from = current,
                            to = target,
                            "open-file limit raised to the hard limit"
                        );
                        return Some(target);
                    }
                    Err(e) => tracing::warn!(
                        current,
                        hard = target,
                        "cannot raise the open-file limit: {e}"
                    ),
                }
            }
            _ => {}
        }
        getrlimit(Resource::Nofile).current
    }
    #[cfg(not(unix))]
    None
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

fn reload(path: &Path, pools: &Pools, ctx: &StartContext) {
    match config::load(path) {
        Ok(cfg) => {
            let running: BTreeMap<_, _> = pools.running_pools().into_iter().collect();
            for pool in cfg.pools {
                if let Some(started) = running.get(&pool.name) {
                    started.handle.set_policies(pool.policies);
                    tracing::info!(pool = %pool.name, "policies reloaded");
                } else {
                    lock(&ctx.policies).insert(pool.name.clone(), pool.policies);
                }
            }
        }
        Err(e) => tracing::error!("config reload rejected; keeping the running policies:\n{e}"),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Starts one pool, and after a failure tries again every `paused_retry_interval` until it
/// runs, so a plugin file deployed late, a fixed secret or a cloud that comes back heals the
/// pool without a restart. Each retry reads the pool's section from the config file again
/// (when it still parses), so a fixed setting is picked up too.
async fn keep_starting(ctx: Arc<StartContext>, state: Arc<AppState>, mut pool: config::Pool) {
    let mut attempt = 1u32;
    loop {
        state.pools.set(
            &pool.name,
            PoolState::Starting {
                attempt,
                since: now_ms(),
            },
        );
        state.metrics.pool_state(&pool.name, "starting");
        match start_pool(&ctx, &state.metrics, &pool).await {
            Ok(running) => {
                tracing::info!(pool = %pool.name, attempt, "pool started");
                let running = Arc::new(running);
                if running.connector.is_some() {
                    let watched = Arc::downgrade(&running);
                    tokio::spawn(crate::api::watch_lease_channels(watched));
                }
                state.pools.set(&pool.name, PoolState::Running(running));
                return;
            }
            Err(e) => {
                let reason = format!("{e:#}");
                let every = Duration::from_millis(pool.scaler.paused_retry_interval_ms);
                tracing::error!(pool = %pool.name, attempt, retry_in = ?every, "pool not started: {reason}");
                state.metrics.pool_state(&pool.name, "start-failed");
                state.pools.set(
                    &pool.name,
                    PoolState::Failed {
                        reason,
                        attempt,
                        retry_at: now_ms().saturating_add(every.as_millis() as u64),
                    },
                );
                tokio::time::sleep(every).await;
            }
        }
        attempt = attempt.saturating_add(1);
        match config::load(&ctx.config_path) {
            Ok(cfg) => {
                if let Some(fresh) = cfg.pools.into_iter().find(|p| p.name == pool.name) {
                    pool = fresh;
                }
            }
            Err(e) => {
                tracing::warn!(pool = %pool.name, "the config file does not load; the start is retried with the settings read before:\n{e}")
            }
        }
    }
}

/// Everything `flotilla run` builds before it serves: the config, what pool starts share,
/// and the API's state with every pool still starting.
struct Built {
    cfg: Config,
    ctx: Arc<StartContext>,
    state: Arc<AppState>,
}

/// The plugin runtime, with the configuration's compile cache (or the user's).
pub fn plugin_runtime(cache_dir: Option<PathBuf>) -> anyhow::Result<PluginRuntime> {
    let cache_dir = cache_dir.or_else(flotilla_plugin_runtime::default_cache_dir);
    Ok(PluginRuntime::new(RuntimeOptions { cache_dir })?)
}

/// Loads the config, the runtime, the registry client and the lease store. Pools start
/// later, each on its own task (see [`keep_starting`]).
async fn build(config_path: &Path) -> anyhow::Result<Built> {
    let cfg: Config = config::load(config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = plugin_runtime(cfg.cache_dir.clone())?;
    let metrics = Metrics::new()?;
    let token = api_token(&cfg)?;
    let needs_registry = cfg
        .pools
        .iter()
        .any(|p| matches!(p.plugin, PluginSource::Oci { .. }));
    let registry = needs_registry.then(|| registry_for(&cfg)).transpose()?;
    let store = open_store(cfg.state_dir.as_deref())?;
    // Lease ids never repeat across restarts: above every stored id, and above an epoch-derived
    // base for runs without a store.
    let first_lease_id = now_ms().saturating_mul(1024).max(match &store {
        Some(s) => s.max_lease_id()?.saturating_add(1),
        None => 1,
    });
    let sd_token = match &cfg.sd_token {
        Some(source) => {
            let sd = secret(source, "server.sd_token")?;
            if token.as_ref().is_some_and(|t| t.same_as(&sd)) {
                anyhow::bail!(
                    "server.sd_token is the lease token: give service discovery a token of its own, which opens nothing but the machine list"
                );
            }
            Some(sd)
        }
        None => None,
    };
    let operators = operator_tokens(&cfg, token.as_ref(), sd_token.as_ref())?;
    let state = Arc::new(AppState {
        pools: Pools::starting(cfg.pools.iter().map(|p| p.name.as_str()), now_ms()),
        token,
        sd_token,
        operators,
        metrics,
        draining: AtomicBool::new(false),
    });
    let ctx = Arc::new(StartContext {
        config_path: config_path.to_path_buf(),
        runtime,
        registry,
        state_dir: cfg.state_dir.clone(),
        store,
        lease_ids: {
            let ids = LeaseIds::default();
            ids.at_least(first_lease_id);
            ids
        },
        policies: Mutex::new(BTreeMap::new()),
    });
    Ok(Built { cfg, ctx, state })
}

/// The lease journal, `<state_dir>/leases.redb`; without a state directory leases live in
/// memory only (and a warning says so).
fn open_store(state_dir: Option<&Path>) -> anyhow::Result<Option<Arc<LeaseStore>>> {
    let Some(dir) = state_dir else {
        tracing::warn!("no state directory: leases are not kept across restarts");
        return Ok(None);
    };
    flotilla_net::fs::ensure_private_dir(dir)
        .with_context(|| format!("state directory {}", dir.display()))?;
    let journal = dir.join("leases.redb");
    flotilla_net::fs::ensure_private_file(&journal)
        .with_context(|| format!("lease journal {}", journal.display()))?;
    let store = LeaseStore::open(&journal).context(
        "the lease journal cannot be opened (is another flotilla using this state_dir?)",
    )?;
    Ok(Some(Arc::new(store)))
}

/// The API token. The config's validation already requires one off loopback and for every
/// pool that serves a Docker handle; a token file others can read is refused here too, since
/// the file may have changed since the check.
fn api_token(cfg: &Config) -> anyhow::Result<Option<flotilla_credentials::Secret>> {
    match &cfg.token {
        Some(source) => secret(source, "server.token").map(Some),
        None if cfg.listen.ip().is_loopback() => {
            tracing::warn!(
                "no server.token configured: the lease API is open to anyone on this machine"
            );
            Ok(None)
        }
        None => anyhow::bail!(
            "server.token is required when listening on a non-loopback address ({})",
            cfg.listen
        ),
    }
}

/// The operators' tokens, each its own: never the API token, the service-discovery token or
/// another operator's, since the log names whose token a session came with.
fn operator_tokens(
    cfg: &Config,
    api: Option<&flotilla_credentials::Secret>,
    sd: Option<&flotilla_credentials::Secret>,
) -> anyhow::Result<Vec<(String, flotilla_credentials::Secret)>> {
    let mut tokens: Vec<(String, flotilla_credentials::Secret)> = Vec::new();
    for (name, source) in &cfg.operators {
        let key = format!("server.operator {name:?}: token");
        let token = secret(source, &key)?;
        if api.is_some_and(|t| t.same_as(&token)) || sd.is_some_and(|t| t.same_as(&token)) {
            anyhow::bail!(
                "{key} is server.token or server.sd_token: give each operator a token of their own, so the log can say who used it"
            );
        }
        if let Some((other, _)) = tokens.iter().find(|(_, t)| t.same_as(&token)) {
            anyhow::bail!(
                "{key} is operator {other:?}'s too: give each operator a token of their own"
            );
        }
        tokens.push((name.clone(), token));
    }
    Ok(tokens)
}

/// A secret from its source; a file others can read is refused here too, since the file may
/// have changed since the config check.
fn secret(
    source: &flotilla_credentials::SecretSource,
    key: &str,
) -> anyhow::Result<flotilla_credentials::Secret> {
    if let flotilla_credentials::SecretSource::File(path) = source {
        flotilla_net::fs::check_secret_file_mode(path)
            .map_err(|why| anyhow::anyhow!("{key}: {why}"))?;
    }
    Ok(source.resolve(key)?)
}

/// Waits for a stop signal (SIGTERM or Ctrl-C; on Windows also Ctrl-Break, console close and
/// shutdown); meanwhile publishes plugin health and reloads policies on SIGHUP or when the
/// config file changes (the only reload on Windows).
async fn until_stopped(
    config_path: &Path,
    state: &AppState,
    ctx: &StartContext,
) -> anyhow::Result<()> {
    let mut stop = crate::signals::Stop::new()?;
    let mut hup = crate::signals::Reload::new()?;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut seen = mtime(config_path);
    loop {
        tokio::select! {
            () = stop.recv() => return Ok(()),
            () = hup.recv() => reload(config_path, &state.pools, ctx),
            _ = tick.tick() => {
                for (_, p) in state.pools.running_pools() {
                    p.metrics.publish_plugin(&p.handle.provider().health());
                }
                let now = mtime(config_path);
                if now != seen {
                    seen = now;
                    reload(config_path, &state.pools, ctx);
                }
            }
        }
    }
}

/// How long a drain may spend on the plugin after the grace period (deleting instances,
/// `shutdown`) before the pool is abandoned.
const PLUGIN_SHUTDOWN_ALLOWANCE: Duration = Duration::from_secs(15);

/// Runs until SIGTERM/SIGINT, then drains. The API listens before any pool starts, and pools
/// start concurrently, so `/healthz`, `/readyz` and `/v1/pools` answer (and say which pools
/// are still starting) while plugins compile and initialise.
pub async fn run(config_path: PathBuf) -> anyhow::Result<()> {
    let open_files = raise_open_file_limit();
    let Built {
        mut cfg,
        ctx,
        state,
    } = build(&config_path).await?;
    fit_open_files(&mut cfg.limits, open_files);
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    let bound = listener.local_addr().unwrap_or(cfg.listen);
    tracing::info!(listen = %bound, pools = cfg.pools.len(), "flotilla is listening; pools are starting");
    for note in cfg.pools.iter().filter_map(|p| p.shared_machine_note()) {
        tracing::warn!("{note}");
    }
    let tls = api_tls(cfg.tls.as_ref())?;
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let server = {
        let shutdown = shutdown.clone();
        let app = router(state.clone());
        tokio::spawn(crate::serve::serve(
            listener,
            app,
            cfg.limits,
            tls,
            Some(state.metrics.connections("api")),
            async move { shutdown.notified().await },
        ))
    };
    // One Notify per server: notify_one keeps a permit, so a stop that comes before a server
    // polls its signal is not lost.
    let metrics_shutdown = Arc::new(tokio::sync::Notify::new());
    let metrics_server = serve_metrics(&cfg, &state, metrics_shutdown.clone()).await?;
    let file_sd = cfg.file_sd.clone().map(|path| {
        tracing::info!(file_sd = %path.display(), "writing the machine list for file_sd_configs");
        tokio::spawn(crate::sd::write_file_sd(state.clone(), path))
    });
    let starters: Vec<_> = cfg
        .pools
        .iter()
        .map(|pool| tokio::spawn(keep_starting(ctx.clone(), state.clone(), pool.clone())))
        .collect();
    let stewards = crate::fallback::spawn_stewards(&cfg.pools, &state);
    until_stopped(&config_path, &state, &ctx).await?;

    tracing::info!(grace = ?cfg.shutdown_grace, "draining: new reservations are refused");
    state.draining.store(true, Ordering::Relaxed);
    // A pool still starting holds no leases: its start is abandoned.
    if let Some(writer) = &file_sd {
        writer.abort();
    }
    for s in starters.iter().chain(&stewards) {
        s.abort();
    }
    let failed_drains = drain(&state, cfg.shutdown_grace).await;
    shutdown.notify_one();
    metrics_shutdown.notify_one();
    server.await.context("the API server task panicked")?;
    if let Some(m) = metrics_server {
        m.await.context("the metrics server task panicked")?;
    }
    if failed_drains > 0 {
        anyhow::bail!("{failed_drains} pool(s) failed while draining; see the log above");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Lowers the connection bounds to fit the open-file limit, with a warning.
fn fit_open_files(limits: &mut crate::serve::Limits, open_files: Option<u64>) {
    if let Some(open_files) = open_files {
        let within = limits.within_open_files(open_files);
        if within != *limits {
            tracing::warn!(
                open_files,
                max_connections = within.max_connections,
                max_unauthenticated_connections = within.max_unauthenticated,
                "the connection bounds are lowered to fit the open-file limit (raise it with \
                 `ulimit -n` or the container's nofile limit to serve more at once)"
            );
            *limits = within;
        }
    }
}

/// The lease API's TLS from `[server] tls`, watched for new certificates; `None` for plain HTTP.
fn api_tls(
    files: Option<&(PathBuf, PathBuf)>,
) -> anyhow::Result<Option<Arc<crate::tls::ServerTls>>> {
    Ok(match files {
        Some((cert, key)) => {
            let tls = Arc::new(
                crate::tls::ServerTls::load(cert, key)
                    .map_err(|why| anyhow::anyhow!("[server] tls: {why}"))?,
            );
            tracing::info!(cert = %cert.display(), "the lease API is served over TLS; the certificate is reloaded when its files change");
            tls.clone().watch();
            Some(tls)
        }
        None => None,
    })
}

/// The plain-HTTP server of `/metrics`, `/healthz`, `/readyz` and the SD list on
/// `metrics_listen`, when set.
async fn serve_metrics(
    cfg: &config::Config,
    state: &Arc<AppState>,
    shutdown: Arc<tokio::sync::Notify>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    Ok(match cfg.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (server.metrics_listen)"))?;
            let bound = listener.local_addr().unwrap_or(addr);
            tracing::info!(metrics_listen = %bound, "serving /metrics, /healthz and /readyz");
            let app = crate::api::health_router(state.clone());
            // Scrapers and kubelets speak plain HTTP here: no lease API, no token.
            Some(tokio::spawn(crate::serve::serve(
                listener,
                app,
                cfg.limits,
                None,
                Some(state.metrics.connections("metrics")),
                async move { shutdown.notified().await },
            )))
        }
        None => None,
    })
}

/// Drains every running pool within `grace` (plus the plugin's allowance); how many failed.
async fn drain(state: &Arc<AppState>, grace: Duration) -> usize {
    let drains = state
        .pools
        .running_pools()
        .into_iter()
        .map(|(name, p)| async move {
            let drain = p.handle.shutdown(grace, p.delete_on_shutdown);
            match tokio::time::timeout(grace + PLUGIN_SHUTDOWN_ALLOWANCE, drain).await {
                Ok(()) => true,
                Err(_) => {
                    tracing::error!(pool = %name, "the pool's plugin did not finish shutting down in time; abandoned");
                    false
                }
            }
        });
    join_all(drains).await
}

/// Runs every future on its own task and waits for all; returns how many failed or panicked
/// (each is logged), so one pool's failure neither stops the others' drain nor goes
/// unreported.
async fn join_all<F: std::future::Future<Output = bool> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> usize {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut failed = 0;
    for h in handles {
        match h.await {
            Ok(true) => {}
            Ok(false) => failed += 1,
            Err(e) => {
                tracing::error!("a pool's drain task failed: {e}");
                failed += 1;
            }
        }
    }
    failed
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use flotilla_credentials::Secret;

    /// Each operator's token is their own: the API's, service discovery's or another
    /// operator's is refused at start, and the message never shows the token.
    #[test]
    fn an_operator_token_that_is_not_their_own_is_refused() {
        let config = |tokens: &[&str]| {
            let operators: String = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    format!(
                        "\n[[server.operator]]\nname = \"op{i}\"\ntoken = {{ value = \"{t}\" }}\n"
                    )
                })
                .collect();
            let text = format!(
                "[server]\ntoken = {{ value = \"api-secret-1\" }}\n{operators}\n[[pool]]\nname = \"p\"\nplugin = \"builtin:static\"\nmax_instances = 1\n"
            );
            crate::config::parse(std::path::Path::new("t.toml"), &text, false).expect("valid")
        };
        let api = Secret::new("api-secret-1");
        let sd = Secret::new("sd-secret-2");
        let ok = super::operator_tokens(&config(&["op-a", "op-b"]), Some(&api), Some(&sd))
            .expect("two tokens of their own");
        assert_eq!(ok.len(), 2);
        for (tokens, said) in [
            (&["api-secret-1"][..], "is server.token or server.sd_token"),
            (&["sd-secret-2"][..], "is server.token or server.sd_token"),
            (&["op-a", "op-a"][..], "is operator \"op0\"'s too"),
        ] {
            let refused = super::operator_tokens(&config(tokens), Some(&api), Some(&sd))
                .expect_err("refused")
                .to_string();
            assert!(refused.contains(said), "{refused}");
            for secret in ["api-secret-1", "sd-secret-2", "op-a"] {
                assert!(!refused.contains(secret), "{refused}");
            }
        }
    }
}

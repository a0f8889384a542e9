//! `flotilla run`: load every pool's plugin, run the scalers, serve the API, reload policies
//! on SIGHUP or a config change, and drain on SIGTERM.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::api::{AppState, router};
use crate::config::{self, Config, PluginSource};
use crate::metrics::Metrics;
use flotilla_connector::{Connector, DockerTls, PoolKey};
use flotilla_oci::{AuthStore, Registry, Store};
use flotilla_plugin_runtime::loader::load_plugin;
use flotilla_plugin_runtime::{PluginRuntime, RuntimeOptions};
use flotilla_provider::Provider;
use flotilla_scaler::{
    AlwaysReady, Clock, LeaseJournal, PoolCore, PoolHandle, Readiness, SystemClock,
};
use flotilla_store::Store as LeaseStore;

struct Started {
    handle: Arc<PoolHandle>,
    connector: Option<Arc<Connector>>,
    metrics: crate::metrics::PoolMetrics,
    delete_on_shutdown: bool,
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
    if let Some(files) = &settings.docker_tls {
        let tls = DockerTls::load(files)
            .map_err(|e| anyhow::anyhow!("[pool.connector] docker_tls: {e}"))?;
        connector = connector.with_docker_tls(tls);
    }
    Ok(Some(Arc::new(connector)))
}

async fn start_pool(
    runtime: &PluginRuntime,
    registry: Option<&Registry>,
    metrics: &Metrics,
    pool: &config::Pool,
    state_dir: Option<&Path>,
    store: Option<&Arc<LeaseStore>>,
    first_lease_id: u64,
) -> anyhow::Result<Started> {
    let plugin = load_plugin(runtime, registry, &pool.name, &pool.plugin)
        .await
        .with_context(|| format!("pool {}", pool.name))?;
    tracing::info!(pool = %pool.name, plugin = %pool.plugin, sha256 = %plugin.sha256, cache = ?plugin.cache, "plugin loaded");
    let connector = connector(pool, state_dir)?;
    let mut sandbox = pool.sandbox.clone();
    sandbox.ssh_public_key = connector.as_ref().map(|c| Arc::from(c.public_key()));
    let provider: Arc<dyn Provider> = Arc::new(plugin.provider(&pool.name, sandbox));
    let info = provider
        .init(&pool.settings)
        .await
        .with_context(|| format!("pool {}: init", pool.name))?;
    tracing::info!(pool = %pool.name, id = %info.id, version = %info.version, max_size = info.max_size, "plugin initialised");
    let clock = Arc::new(SystemClock);
    let mut core = PoolCore::new(pool.scaler.clone(), pool.policies.clone(), clock.now());
    core.set_provider_info(&info);
    core.set_first_lease_id(first_lease_id);
    let journal = match store {
        Some(store) => {
            let restored = store.load(&pool.name)?;
            if !restored.leases.is_empty() {
                tracing::info!(pool = %pool.name, leases = restored.leases.len(), "leases restored from the journal; acquired ones are bound again at the first update");
            }
            core.restore(clock.now(), restored.leases, restored.uses);
            Some(Arc::new(store.journal(&pool.name)) as Arc<dyn LeaseJournal>)
        }
        None => None,
    };
    let pool_metrics = metrics.pool(&pool.name, &plugin.sha256[..12]);
    let readiness: Arc<dyn Readiness> = match &connector {
        Some(c) => c.clone(),
        None => Arc::new(AlwaysReady),
    };
    let handle = PoolHandle::spawn_journaled(
        pool.name.clone(),
        core,
        provider,
        clock,
        readiness,
        Some(Arc::new(pool_metrics.clone())),
        journal,
    );
    Ok(Started {
        handle,
        connector,
        metrics: pool_metrics,
        delete_on_shutdown: pool.delete_instances_on_shutdown,
    })
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn reload(path: &Path, pools: &BTreeMap<String, Started>) {
    match config::load(path) {
        Ok(cfg) => {
            for pool in cfg.pools {
                if let Some(started) = pools.get(&pool.name) {
                    started.handle.set_policies(pool.policies);
                    tracing::info!(pool = %pool.name, "policies reloaded");
                }
            }
        }
        Err(e) => tracing::error!("config reload rejected; keeping the running policies:\n{e}"),
    }
}

/// Everything `flotilla run` built before it serves.
struct Built {
    cfg: Config,
    started: BTreeMap<String, Started>,
    state: Arc<AppState>,
}

/// Loads the config, the plugins and the pools. A pool that fails to start is reported in the
/// API (`/v1/pools`, `/readyz`) instead of stopping the others.
async fn build(config_path: &Path) -> anyhow::Result<Built> {
    let cfg: Config = config::load(config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cache_dir = cfg
        .cache_dir
        .clone()
        .or_else(flotilla_plugin_runtime::default_cache_dir);
    let runtime = PluginRuntime::new(RuntimeOptions { cache_dir })?;
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
    let first_lease_id = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64 * 1024)
        .max(match &store {
            Some(s) => s.max_lease_id()?.saturating_add(1),
            None => 1,
        });
    let mut started = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for pool in &cfg.pools {
        match start_pool(
            &runtime,
            registry.as_ref(),
            &metrics,
            pool,
            cfg.state_dir.as_deref(),
            store.as_ref(),
            first_lease_id,
        )
        .await
        {
            Ok(s) => {
                started.insert(pool.name.clone(), s);
            }
            Err(e) => {
                let reason = format!("{e:#}");
                tracing::error!(pool = %pool.name, "pool not started: {reason}");
                failed.insert(pool.name.clone(), reason);
            }
        }
    }
    let state = Arc::new(AppState {
        pools: started
            .iter()
            .map(|(k, v)| (k.clone(), v.handle.clone()))
            .collect(),
        connectors: started
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.connector.clone()?)))
            .collect(),
        failed,
        token,
        metrics,
        draining: AtomicBool::new(false),
    });
    Ok(Built {
        cfg,
        started,
        state,
    })
}

/// The lease journal, `<state_dir>/leases.redb`; without a state directory leases live in
/// memory only (and a warning says so).
fn open_store(state_dir: Option<&Path>) -> anyhow::Result<Option<Arc<LeaseStore>>> {
    let Some(dir) = state_dir else {
        tracing::warn!("no state directory: leases are not kept across restarts");
        return Ok(None);
    };
    flotilla_net::fs::create_private_dir(dir)
        .with_context(|| format!("state directory {}", dir.display()))?;
    let store = LeaseStore::open(&dir.join("leases.redb")).context(
        "the lease journal cannot be opened (is another flotilla using this state_dir?)",
    )?;
    Ok(Some(Arc::new(store)))
}

/// The API token; required unless the API listens on loopback only.
fn api_token(cfg: &Config) -> anyhow::Result<Option<flotilla_credentials::Secret>> {
    match &cfg.token {
        Some(source) => Ok(Some(source.resolve("server.token")?)),
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

/// Waits for SIGTERM or Ctrl-C; meanwhile publishes plugin health and reloads policies on
/// SIGHUP or when the config file changes.
async fn until_stopped(
    config_path: &Path,
    started: &BTreeMap<String, Started>,
) -> anyhow::Result<()> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut seen = mtime(config_path);
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = hup.recv() => reload(config_path, started),
            _ = tick.tick() => {
                for s in started.values() {
                    s.metrics.publish_plugin(&s.handle.provider().health());
                }
                let now = mtime(config_path);
                if now != seen {
                    seen = now;
                    reload(config_path, started);
                }
            }
        }
    }
}

/// Runs until SIGTERM/SIGINT, then drains.
pub async fn run(config_path: PathBuf) -> anyhow::Result<()> {
    let Built {
        cfg,
        started,
        state,
    } = build(&config_path).await?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    tracing::info!(listen = %cfg.listen, pools = started.len(), "flotilla is running");
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let server = {
        let shutdown = shutdown.clone();
        let app = router(state.clone());
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.notified().await })
                .await
        })
    };
    until_stopped(&config_path, &started).await?;

    tracing::info!(grace = ?cfg.shutdown_grace, "draining: new reservations are refused");
    state.draining.store(true, Ordering::Relaxed);
    let drains = started.values().map(|s| {
        let handle = s.handle.clone();
        let grace = cfg.shutdown_grace;
        let delete = s.delete_on_shutdown;
        async move { handle.shutdown(grace, delete).await }
    });
    let failed_drains = join_all(drains).await;
    shutdown.notify_one();
    let served = server.await.context("the API server task panicked")?;
    served.context("the API server failed")?;
    if failed_drains > 0 {
        anyhow::bail!("{failed_drains} pool(s) failed while draining; see the log above");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Runs every future on its own task and waits for all; returns how many panicked (each is
/// logged), so one pool's failure neither stops the others' drain nor goes unreported.
async fn join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> usize {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut failed = 0;
    for h in handles {
        if let Err(e) = h.await {
            tracing::error!("a pool's drain task failed: {e}");
            failed += 1;
        }
    }
    failed
}

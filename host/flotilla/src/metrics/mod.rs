//! Prometheus metrics, prefixed `flotilla_`, labelled by pool and plugin.

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use flotilla_provider::{Function, ProviderHealth};

mod families;
mod process;
use flotilla_scaler::core::{Counters, PoolSnapshot};
use flotilla_scaler::{PoolObserver, Probe};

/// Every metric family of the process.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pools: families::PoolFamilies,
    instances: families::InstanceFamilies,
    plugin: families::PluginFamilies,
    leases: families::LeaseFamilies,
    jobs: families::JobFamilies,
    server: families::ServerFamilies,
    process: process::ProcessMetrics,
}

pub use flotilla_api::JobOutcome;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// One API request in flight: counted down when dropped, however the request ends.
pub struct InFlight(prometheus::IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A listener's count of open connections (`flotilla_connections_open`) and of those it
/// accepted (`flotilla_connections_accepted_total`).
#[derive(Clone)]
pub struct Connections(prometheus::IntGauge, prometheus::IntCounter);

impl Connections {
    /// A connection was accepted; it is open until the guard is dropped.
    pub fn opened(&self) -> InFlight {
        self.1.inc();
        self.0.inc();
        InFlight(self.0.clone())
    }
}

/// Why a metric could not be registered (a programming error, reported not panicked).
pub type MetricsError = prometheus::Error;

pub(super) fn gauge(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, MetricsError> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

pub(super) fn counter(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, MetricsError> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

pub(super) fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> Result<HistogramVec, MetricsError> {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
    r.register(Box::new(h.clone()))?;
    Ok(h)
}

pub(super) const PP: &[&str] = &["pool", "plugin"];

/// The values of `flotilla_pool_state`'s `state` label.
pub const POOL_STATES: [&str; 6] = [
    "starting",
    "start-failed",
    "ready",
    "degraded",
    "paused",
    "stopped",
];

impl Metrics {
    /// Registers every family.
    pub fn new() -> Result<Metrics, MetricsError> {
        let r = Registry::new();
        Ok(Metrics {
            pools: families::PoolFamilies::register(&r)?,
            instances: families::InstanceFamilies::register(&r)?,
            plugin: families::PluginFamilies::register(&r)?,
            leases: families::LeaseFamilies::register(&r)?,
            jobs: families::JobFamilies::register(&r)?,
            server: families::ServerFamilies::register(&r)?,
            process: process::ProcessMetrics::new(&r)?,
            registry: r,
        })
    }

    /// A job's container started after `prepare` seconds, `pull` of them pulling images.
    pub fn job_started(&self, pool: &str, prepare: f64, pull: f64) {
        self.jobs.jobs_started.with_label_values(&[pool]).inc();
        self.jobs
            .job_prepare_seconds
            .with_label_values(&[pool])
            .observe(prepare);
        self.jobs
            .image_pull_seconds
            .with_label_values(&[pool])
            .observe(pull);
    }

    /// A job's main script ended.
    pub fn job_finished(&self, pool: &str, outcome: JobOutcome) {
        self.jobs
            .jobs_finished
            .with_label_values(&[pool, outcome.name()])
            .inc();
    }

    /// An API request began; the request is in flight until the guard is dropped.
    pub fn http_started(&self) -> InFlight {
        self.server.http_in_flight.inc();
        InFlight(self.server.http_in_flight.clone())
    }

    /// The count of open connections of one listener (`api` or `metrics`), for the server.
    pub fn connections(&self, listener: &str) -> Connections {
        Connections(
            self.server.connections.with_label_values(&[listener]),
            self.server.accepted.with_label_values(&[listener]),
        )
    }

    /// An upgraded Docker stream opened; it is open until the guard is dropped.
    pub fn docker_stream_opened(&self) -> InFlight {
        self.server.docker_streams.inc();
        InFlight(self.server.docker_streams.clone())
    }

    /// An API request was answered.
    pub fn http_finished(&self, route: &str, method: &str, code: u16, took: Duration) {
        let code = code.to_string();
        self.server
            .http_requests
            .with_label_values(&[route, method, &code])
            .inc();
        self.server
            .http_seconds
            .with_label_values(&[route, method])
            .observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        self.process.refresh();
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!("cannot encode metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Marks `state` as the pool's current state (one of [`POOL_STATES`]).
    pub fn pool_state(&self, pool: &str, state: &str) {
        for s in POOL_STATES {
            self.pools
                .pool_state
                .with_label_values(&[pool, s])
                .set(i64::from(s == state));
        }
    }

    /// A reservation was refused for want of a slot (the API's error code: `at_capacity` or `no_idle_slot`).
    pub fn reservation_refused(&self, pool: &str, reason: &str) {
        self.leases
            .reservations_refused
            .with_label_values(&[pool, reason])
            .inc();
    }

    /// A lease of `pool` was bound to an instance.
    pub fn lease_acquired(&self, pool: &str) {
        self.leases.leases_acquired.with_label_values(&[pool]).inc();
    }

    /// `pool` handed `n` waiting reservations to `fallback`.
    pub fn handed_over(&self, pool: &str, fallback: &str, n: u64) {
        self.leases
            .fallback_handovers
            .with_label_values(&[pool, fallback])
            .inc_by(n);
    }

    /// Whether `pool` counts as unable to grow now.
    pub fn set_cannot_grow(&self, pool: &str, cannot: bool) {
        self.pools
            .cannot_grow
            .with_label_values(&[pool])
            .set(i64::from(cannot));
    }

    /// Handles for one pool (its acquired-leases series starts at 0, so a dashboard sees a
    /// pool that served nothing yet).
    pub fn pool(&self, pool: &str, plugin: &str) -> PoolMetrics {
        self.leases.leases_acquired.with_label_values(&[pool]);
        PoolMetrics {
            m: self.clone(),
            pool: pool.to_string(),
            plugin: plugin.to_string(),
            last: Arc::new(Mutex::new(Last::default())),
        }
    }
}

#[derive(Debug, Default)]
struct Last {
    scale_up: u64,
    scale_down: u64,
    leases_failed: u64,
    leases_restored: u64,
    leases_lost: u64,
    leases_expired: u64,
    traps: u64,
    timeouts: u64,
    violations: u64,
    denied: u64,
    remints: u64,
    waited_micros: u64,
}

/// Metric handles of one pool.
#[derive(Debug, Clone)]
pub struct PoolMetrics {
    m: Metrics,
    pool: String,
    plugin: String,
    last: Arc<Mutex<Last>>,
}

fn delta(last: &mut u64, now: u64) -> u64 {
    let d = now.saturating_sub(*last);
    *last = now;
    d
}

impl PoolMetrics {
    fn pp(&self) -> [&str; 2] {
        [&self.pool, &self.plugin]
    }

    /// Publishes plugin fault counters and egress denials.
    pub fn publish_plugin(&self, health: &ProviderHealth) {
        let denied = health.egress_denied;
        let [pool, plugin] = self.pp();
        self.m
            .pools
            .circuit_open
            .with_label_values(&[pool, plugin])
            .set(i64::from(health.circuit_open));
        {
            let mut last = self.last.lock();
            let traps = delta(&mut last.traps, health.traps);
            let timeouts = delta(&mut last.timeouts, health.timeouts);
            let violations = delta(&mut last.violations, health.contract_violations);
            let denied = delta(&mut last.denied, denied);
            let remints = delta(&mut last.remints, health.egress_remints);
            let waited = delta(&mut last.waited_micros, health.call_wait_micros);
            self.m
                .plugin
                .plugin_faults
                .with_label_values(&[pool, plugin, "trap"])
                .inc_by(traps);
            self.m
                .plugin
                .plugin_faults
                .with_label_values(&[pool, plugin, "timeout"])
                .inc_by(timeouts);
            self.m
                .plugin
                .plugin_faults
                .with_label_values(&[pool, plugin, "contract-violation"])
                .inc_by(violations);
            self.m
                .plugin
                .egress_denied
                .with_label_values(&[pool, plugin])
                .inc_by(denied);
            self.m
                .plugin
                .credential_remints
                .with_label_values(&[pool, plugin])
                .inc_by(remints);
            self.m
                .plugin
                .plugin_wait_seconds
                .with_label_values(&[pool, plugin])
                .inc_by(waited as f64 / 1e6);
        }
    }
}

impl PoolObserver for PoolMetrics {
    fn journal_commit(&self, ok: bool, took: Duration) {
        let [pool, plugin] = self.pp();
        self.m
            .leases
            .journal_seconds
            .with_label_values(&[pool, plugin, if ok { "ok" } else { "error" }])
            .observe(took.as_secs_f64());
    }

    /// Records one provider call.
    fn provider_call(&self, function: Function, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        let labels = [
            self.pool.as_str(),
            self.plugin.as_str(),
            function.name(),
            outcome,
        ];
        self.m.plugin.provider_ops.with_label_values(&labels).inc();
        self.m
            .plugin
            .provider_seconds
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
    }

    /// Records a readiness check or ping, and the cause of a failure.
    fn probe(&self, probe: Probe, outcome: Result<(), &'static str>, took: Duration) {
        let [pool, plugin] = self.pp();
        let result = if outcome.is_ok() { "ok" } else { "error" };
        let labels = [pool, plugin, probe.name(), result];
        self.m.instances.probes.with_label_values(&labels).inc();
        self.m
            .instances
            .probe_seconds
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
        if let Err(cause) = outcome {
            self.m
                .instances
                .probe_failures
                .with_label_values(&[pool, plugin, probe.name(), cause])
                .inc();
        }
    }

    /// Records how long an acquire waited.
    fn lease_wait(&self, took: Duration) {
        self.m
            .leases
            .lease_wait_seconds
            .with_label_values(&self.pp())
            .observe(took.as_secs_f64());
    }

    /// Publishes a snapshot and the counters accumulated since the last one.
    fn publish(
        &self,
        snap: &PoolSnapshot,
        counters: &Counters,
        ready_ms: &[u64],
        lifetimes_ms: &[u64],
    ) {
        let [pool, plugin] = self.pp();
        for (state, n) in &snap.instances {
            self.m
                .instances
                .instances
                .with_label_values(&[pool, plugin, state])
                .set(i64::from(*n));
        }
        self.m
            .pools
            .desired
            .with_label_values(&[pool, plugin])
            .set(i64::from(snap.desired));
        self.m
            .pools
            .acquires_waiting
            .with_label_values(&[pool, plugin])
            .set(i64::from(snap.acquires_waiting));
        self.m
            .pools
            .max_instances
            .with_label_values(&[pool, plugin])
            .set(i64::from(snap.max_instances));
        for (state, n) in [
            ("idle", snap.slots.idle),
            ("reserved", snap.slots.reserved),
            ("acquired", snap.slots.acquired),
            ("unavailable", snap.slots.unavailable),
        ] {
            self.m
                .pools
                .slots
                .with_label_values(&[pool, plugin, state])
                .set(i64::from(n));
        }
        for ms in ready_ms {
            self.m
                .instances
                .ready_seconds
                .with_label_values(&[pool, plugin])
                .observe(*ms as f64 / 1000.0);
        }
        for ms in lifetimes_ms {
            self.m
                .instances
                .lifetime_seconds
                .with_label_values(&[pool, plugin])
                .observe(*ms as f64 / 1000.0);
        }
        self.publish_health(snap);
        self.publish_counters(counters);
    }
}

impl PoolMetrics {
    /// The pool's state and readiness, from the snapshot's health.
    fn publish_health(&self, snap: &PoolSnapshot) {
        let [pool, plugin] = self.pp();
        let up = matches!(snap.health, flotilla_scaler::PoolHealth::Ready);
        let state = match snap.health {
            flotilla_scaler::PoolHealth::Stopped(_) => "stopped",
            _ if !snap.paused.is_empty() => "paused",
            flotilla_scaler::PoolHealth::Starting => "starting",
            flotilla_scaler::PoolHealth::Ready => "ready",
            flotilla_scaler::PoolHealth::Degraded(_) => "degraded",
        };
        self.m.pool_state(pool, state);
        self.m
            .pools
            .pool_up
            .with_label_values(&[pool, plugin])
            .set(i64::from(up));
    }

    /// The scaler's counters since the last snapshot, as increments.
    fn publish_counters(&self, counters: &Counters) {
        let [pool, plugin] = self.pp();
        let mut last = self.last.lock();
        let up = delta(&mut last.scale_up, counters.scale_up);
        let down = delta(&mut last.scale_down, counters.scale_down);
        let failed = delta(&mut last.leases_failed, counters.leases_failed);
        let seen: &mut Last = &mut last;
        for (event, before, now) in [
            (
                "restored",
                &mut seen.leases_restored,
                counters.leases_restored,
            ),
            ("lost", &mut seen.leases_lost, counters.leases_lost),
            ("expired", &mut seen.leases_expired, counters.leases_expired),
        ] {
            self.m
                .leases
                .lease_events
                .with_label_values(&[pool, plugin, event])
                .inc_by(delta(before, now));
        }
        self.m
            .instances
            .scale_ops
            .with_label_values(&[pool, plugin, "up"])
            .inc_by(up);
        self.m
            .instances
            .scale_ops
            .with_label_values(&[pool, plugin, "down"])
            .inc_by(down);
        self.m
            .leases
            .leases_failed
            .with_label_values(&[pool, plugin])
            .inc_by(failed);
    }
}

//! Prometheus metrics, prefixed `flotilla_`, labelled by pool and plugin.

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use flotilla_provider::{Function, ProviderHealth};
use flotilla_scaler::core::{Counters, PoolSnapshot};
use flotilla_scaler::{PoolObserver, Probe};

/// Every metric family of the process.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    instances: IntGaugeVec,
    desired: IntGaugeVec,
    max_instances: IntGaugeVec,
    slots: IntGaugeVec,
    provider_ops: IntCounterVec,
    provider_seconds: HistogramVec,
    ready_seconds: HistogramVec,
    lifetime_seconds: HistogramVec,
    scale_ops: IntCounterVec,
    lease_wait_seconds: HistogramVec,
    leases_failed: IntCounterVec,
    plugin_faults: IntCounterVec,
    egress_denied: IntCounterVec,
    credential_remints: IntCounterVec,
    plugin_wait_seconds: prometheus::CounterVec,
    pool_up: IntGaugeVec,
    pool_state: IntGaugeVec,
    circuit_open: IntGaugeVec,
    reservations_refused: IntCounterVec,
    leases_acquired: IntCounterVec,
    fallback_handovers: IntCounterVec,
    cannot_grow: IntGaugeVec,
    probe_seconds: HistogramVec,
    probe_failures: IntCounterVec,
    probes: IntCounterVec,
    lease_events: IntCounterVec,
    jobs_started: IntCounterVec,
    jobs_finished: IntCounterVec,
    job_prepare_seconds: HistogramVec,
    image_pull_seconds: HistogramVec,
    acquires_waiting: IntGaugeVec,
    http_requests: IntCounterVec,
    http_seconds: HistogramVec,
    journal_seconds: HistogramVec,
    http_in_flight: prometheus::IntGauge,
    docker_streams: prometheus::IntGauge,
    process: crate::process_metrics::ProcessMetrics,
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

/// Why a metric could not be registered (a programming error, reported not panicked).
pub type MetricsError = prometheus::Error;

fn gauge(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, MetricsError> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn counter(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, MetricsError> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn histogram(
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

const PP: &[&str] = &["pool", "plugin"];

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
        let lat = vec![
            0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        let long = vec![
            1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0,
        ];
        Ok(Metrics {
            instances: gauge(
                &r,
                "flotilla_instances",
                "Instances by state.",
                &["pool", "plugin", "state"],
            )?,
            desired: gauge(
                &r,
                "flotilla_desired_instances",
                "Instances the active policy wants.",
                PP,
            )?,
            max_instances: gauge(
                &r,
                "flotilla_max_instances",
                "Upper bound on instances in force.",
                PP,
            )?,
            slots: gauge(
                &r,
                "flotilla_slots",
                "Job slots by state.",
                &["pool", "plugin", "state"],
            )?,
            provider_ops: counter(
                &r,
                "flotilla_provider_operations_total",
                "Provider calls by function and outcome.",
                &["pool", "plugin", "function", "outcome"],
            )?,
            provider_seconds: histogram(
                &r,
                "flotilla_provider_operation_duration_seconds",
                "Provider call duration by function and outcome.",
                &["pool", "plugin", "function", "outcome"],
                lat.clone(),
            )?,
            ready_seconds: histogram(
                &r,
                "flotilla_instance_creation_to_ready_seconds",
                "Time from an instance's first sighting to ready.",
                PP,
                long.clone(),
            )?,
            lifetime_seconds: histogram(
                &r,
                "flotilla_instance_lifetime_seconds",
                "Instance lifetime.",
                PP,
                long,
            )?,
            scale_ops: counter(
                &r,
                "flotilla_scale_operations_total",
                "Instances requested (up) or removed by scale-down (down).",
                &["pool", "plugin", "direction"],
            )?,
            lease_wait_seconds: histogram(
                &r,
                "flotilla_lease_wait_seconds",
                "Time an acquire waited for a ready instance.",
                PP,
                lat,
            )?,
            leases_failed: counter(
                &r,
                "flotilla_leases_failed_total",
                "Leases failed because their instance failed.",
                PP,
            )?,
            plugin_faults: counter(
                &r,
                "flotilla_plugin_faults_total",
                "Plugin traps, timeouts and contract violations.",
                &["pool", "plugin", "kind"],
            )?,
            acquires_waiting: gauge(
                &r,
                "flotilla_acquires_waiting",
                "Acquires waiting for a free slot (the pool's queue).",
                PP,
            )?,
            http_requests: counter(
                &r,
                "flotilla_http_requests_total",
                "API requests by route pattern, method and status code.",
                &["route", "method", "code"],
            )?,
            http_seconds: histogram(
                &r,
                "flotilla_http_request_duration_seconds",
                "API request time to the answer's head, by route pattern and method (an acquire's wait included).",
                &["route", "method"],
                // Fine below 100 ms, where a lease route's own time lies (the load harness
                // reads its percentiles from these), coarse above, where a long poll waits.
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 300.0,
                ],
            )?,
            journal_seconds: histogram(
                &r,
                "flotilla_journal_commit_duration_seconds",
                "Time to commit a lease change to the journal (fsync included), by outcome; the change is acknowledged after it.",
                &["pool", "plugin", "outcome"],
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ],
            )?,
            http_in_flight: {
                let g = prometheus::IntGauge::new(
                    "flotilla_http_requests_in_flight",
                    "API requests being answered now (long polls included).",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            docker_streams: {
                let g = prometheus::IntGauge::new(
                    "flotilla_docker_streams_open",
                    "Upgraded Docker streams (exec, attach) open through the leases' handles \
                     (bounded by server.max_streams).",
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            process: crate::process_metrics::ProcessMetrics::new(&r)?,
            egress_denied: counter(
                &r,
                "flotilla_egress_denied_total",
                "Outbound plugin requests denied.",
                PP,
            )?,
            plugin_wait_seconds: {
                let c = prometheus::CounterVec::new(
                    Opts::new(
                        "flotilla_plugin_call_wait_seconds_total",
                        "Time calls waited for the pool's plugin, which runs one call at a time.",
                    ),
                    PP,
                )?;
                r.register(Box::new(c.clone()))?;
                c
            },
            credential_remints: counter(
                &r,
                "flotilla_credential_remints_total",
                "Plugin requests sent once more with a new token after the cloud refused the cached one.",
                PP,
            )?,
            pool_up: gauge(
                &r,
                "flotilla_pool_ready",
                "1 when the pool is ready, 0 otherwise.",
                PP,
            )?,
            pool_state: gauge(
                &r,
                "flotilla_pool_state",
                "1 for the pool's current state (starting, start-failed, ready, degraded, paused, stopped), 0 for the others.",
                &["pool", "state"],
            )?,
            circuit_open: gauge(
                &r,
                "flotilla_plugin_circuit_open",
                "1 while the pool's plugin circuit is open (calls fail fast after repeated faults).",
                PP,
            )?,
            reservations_refused: counter(
                &r,
                "flotilla_reservations_refused_total",
                "Reservations refused for want of a slot: at_capacity (every slot up to max_instances promised) or no_idle_slot (preemptive mode), as the API's error codes.",
                &["pool", "reason"],
            )?,
            leases_acquired: counter(
                &r,
                "flotilla_leases_acquired_total",
                "Leases bound to an instance: the demand each pool served (a reservation handed \
                 to a fallback pool counts where it was acquired).",
                &["pool"],
            )?,
            fallback_handovers: counter(
                &r,
                "flotilla_fallback_handovers_total",
                "Waiting reservations a pool that could not grow handed to its fallback pool.",
                &["pool", "fallback"],
            )?,
            cannot_grow: gauge(
                &r,
                "flotilla_pool_cannot_grow",
                "1 while the pool counts as unable to grow (a quota or capacity refusal, or \
                 instances lost soon after they came), within fallback_hold.",
                &["pool"],
            )?,
            probe_seconds: histogram(
                &r,
                "flotilla_instance_probe_duration_seconds",
                "Duration of instance readiness checks and idle pings (probe), by outcome.",
                &["pool", "plugin", "probe", "outcome"],
                vec![
                    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0, 300.0,
                ],
            )?,
            probe_failures: counter(
                &r,
                "flotilla_instance_probe_failures_total",
                "Failed readiness checks and pings by probe and cause (connect-info, ssh-connect, \
                 ssh-auth, host-key, ssh, ready-command, docker).",
                &["pool", "plugin", "probe", "cause"],
            )?,
            probes: counter(
                &r,
                "flotilla_instance_probes_total",
                "Readiness checks and idle pings (Docker /_ping) by outcome.",
                &["pool", "plugin", "probe", "outcome"],
            )?,
            lease_events: counter(
                &r,
                "flotilla_lease_events_total",
                "Leases restored from the journal at start, lost with their instance in a restart, and expired (TTL or max job duration).",
                &["pool", "plugin", "event"],
            )?,
            jobs_started: counter(
                &r,
                "flotilla_jobs_started_total",
                "CI jobs whose container started on a leased instance (reported by the driver).",
                &["pool"],
            )?,
            jobs_finished: counter(
                &r,
                "flotilla_jobs_finished_total",
                "CI jobs by how their main script ended (reported by the driver).",
                &["pool", "outcome"],
            )?,
            job_prepare_seconds: histogram(
                &r,
                "flotilla_job_prepare_seconds",
                "From a job's prepare to its container's start: waiting for an instance, pulls, services.",
                &["pool"],
                vec![
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                ],
            )?,
            image_pull_seconds: histogram(
                &r,
                "flotilla_image_pull_seconds",
                "Time spent pulling a job's images (0 when they were on the instance).",
                &["pool"],
                vec![
                    0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                ],
            )?,
            registry: r,
        })
    }

    /// A job's container started after `prepare` seconds, `pull` of them pulling images.
    pub fn job_started(&self, pool: &str, prepare: f64, pull: f64) {
        self.jobs_started.with_label_values(&[pool]).inc();
        self.job_prepare_seconds
            .with_label_values(&[pool])
            .observe(prepare);
        self.image_pull_seconds
            .with_label_values(&[pool])
            .observe(pull);
    }

    /// A job's main script ended.
    pub fn job_finished(&self, pool: &str, outcome: JobOutcome) {
        self.jobs_finished
            .with_label_values(&[pool, outcome.name()])
            .inc();
    }

    /// An API request began; the request is in flight until the guard is dropped.
    pub fn http_started(&self) -> InFlight {
        self.http_in_flight.inc();
        InFlight(self.http_in_flight.clone())
    }

    /// An upgraded Docker stream opened; it is open until the guard is dropped.
    pub fn docker_stream_opened(&self) -> InFlight {
        self.docker_streams.inc();
        InFlight(self.docker_streams.clone())
    }

    /// An API request was answered.
    pub fn http_finished(&self, route: &str, method: &str, code: u16, took: Duration) {
        let code = code.to_string();
        self.http_requests
            .with_label_values(&[route, method, &code])
            .inc();
        self.http_seconds
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
            self.pool_state
                .with_label_values(&[pool, s])
                .set(i64::from(s == state));
        }
    }

    /// A reservation was refused for want of a slot (the API's error code: `at_capacity` or `no_idle_slot`).
    pub fn reservation_refused(&self, pool: &str, reason: &str) {
        self.reservations_refused
            .with_label_values(&[pool, reason])
            .inc();
    }

    /// A lease of `pool` was bound to an instance.
    pub fn lease_acquired(&self, pool: &str) {
        self.leases_acquired.with_label_values(&[pool]).inc();
    }

    /// `pool` handed `n` waiting reservations to `fallback`.
    pub fn handed_over(&self, pool: &str, fallback: &str, n: u64) {
        self.fallback_handovers
            .with_label_values(&[pool, fallback])
            .inc_by(n);
    }

    /// Whether `pool` counts as unable to grow now.
    pub fn set_cannot_grow(&self, pool: &str, cannot: bool) {
        self.cannot_grow
            .with_label_values(&[pool])
            .set(i64::from(cannot));
    }

    /// Handles for one pool (its acquired-leases series starts at 0, so a dashboard sees a
    /// pool that served nothing yet).
    pub fn pool(&self, pool: &str, plugin: &str) -> PoolMetrics {
        self.leases_acquired.with_label_values(&[pool]);
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
                .plugin_faults
                .with_label_values(&[pool, plugin, "trap"])
                .inc_by(traps);
            self.m
                .plugin_faults
                .with_label_values(&[pool, plugin, "timeout"])
                .inc_by(timeouts);
            self.m
                .plugin_faults
                .with_label_values(&[pool, plugin, "contract-violation"])
                .inc_by(violations);
            self.m
                .egress_denied
                .with_label_values(&[pool, plugin])
                .inc_by(denied);
            self.m
                .credential_remints
                .with_label_values(&[pool, plugin])
                .inc_by(remints);
            self.m
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
        self.m.provider_ops.with_label_values(&labels).inc();
        self.m
            .provider_seconds
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
    }

    /// Records a readiness check or ping, and the cause of a failure.
    fn probe(&self, probe: Probe, outcome: Result<(), &'static str>, took: Duration) {
        let [pool, plugin] = self.pp();
        let result = if outcome.is_ok() { "ok" } else { "error" };
        let labels = [pool, plugin, probe.name(), result];
        self.m.probes.with_label_values(&labels).inc();
        self.m
            .probe_seconds
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
        if let Err(cause) = outcome {
            self.m
                .probe_failures
                .with_label_values(&[pool, plugin, probe.name(), cause])
                .inc();
        }
    }

    /// Records how long an acquire waited.
    fn lease_wait(&self, took: Duration) {
        self.m
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
                .with_label_values(&[pool, plugin, state])
                .set(i64::from(*n));
        }
        self.m
            .desired
            .with_label_values(&[pool, plugin])
            .set(i64::from(snap.desired));
        self.m
            .acquires_waiting
            .with_label_values(&[pool, plugin])
            .set(i64::from(snap.acquires_waiting));
        self.m
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
                .slots
                .with_label_values(&[pool, plugin, state])
                .set(i64::from(n));
        }
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
            .pool_up
            .with_label_values(&[pool, plugin])
            .set(i64::from(up));
        for ms in ready_ms {
            self.m
                .ready_seconds
                .with_label_values(&[pool, plugin])
                .observe(*ms as f64 / 1000.0);
        }
        for ms in lifetimes_ms {
            self.m
                .lifetime_seconds
                .with_label_values(&[pool, plugin])
                .observe(*ms as f64 / 1000.0);
        }
        {
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
                    .lease_events
                    .with_label_values(&[pool, plugin, event])
                    .inc_by(delta(before, now));
            }
            self.m
                .scale_ops
                .with_label_values(&[pool, plugin, "up"])
                .inc_by(up);
            self.m
                .scale_ops
                .with_label_values(&[pool, plugin, "down"])
                .inc_by(down);
            self.m
                .leases_failed
                .with_label_values(&[pool, plugin])
                .inc_by(failed);
        }
    }
}

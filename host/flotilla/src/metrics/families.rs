//! The metric families, grouped by what they describe; `Metrics` holds one of each group.

use prometheus::{CounterVec, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::{MetricsError, PP, counter, gauge, histogram};

/// Latency buckets for calls and waits (seconds).
fn lat() -> Vec<f64> {
    vec![
        0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ]
}

/// Buckets for instance lifetimes and boot times (seconds).
fn long() -> Vec<f64> {
    vec![
        1.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0,
    ]
}

/// A pool's size and health: what it wants, what it may hold, its slots, its state.
#[derive(Clone)]
pub(super) struct PoolFamilies {
    pub(super) desired: IntGaugeVec,
    pub(super) max_instances: IntGaugeVec,
    pub(super) slots: IntGaugeVec,
    pub(super) pool_up: IntGaugeVec,
    pub(super) pool_state: IntGaugeVec,
    pub(super) circuit_open: IntGaugeVec,
    pub(super) cannot_grow: IntGaugeVec,
    pub(super) acquires_waiting: IntGaugeVec,
}

impl PoolFamilies {
    pub(super) fn register(r: &Registry) -> Result<Self, MetricsError> {
        Ok(PoolFamilies {
            desired: gauge(
                r,
                "flotilla_desired_instances",
                "Instances the active policy wants.",
                PP,
            )?,
            max_instances: gauge(
                r,
                "flotilla_max_instances",
                "Upper bound on instances in force.",
                PP,
            )?,
            slots: gauge(
                r,
                "flotilla_slots",
                "Job slots by state.",
                &["pool", "plugin", "state"],
            )?,
            pool_up: gauge(
                r,
                "flotilla_pool_ready",
                "1 when the pool is ready, 0 otherwise.",
                PP,
            )?,
            pool_state: gauge(
                r,
                "flotilla_pool_state",
                "1 for the pool's current state (starting, start-failed, ready, degraded, paused, stopped), 0 for the others.",
                &["pool", "state"],
            )?,
            circuit_open: gauge(
                r,
                "flotilla_plugin_circuit_open",
                "1 while the pool's plugin circuit is open (calls fail fast after repeated faults).",
                PP,
            )?,
            cannot_grow: gauge(
                r,
                "flotilla_pool_cannot_grow",
                "1 while the pool counts as unable to grow (a quota or capacity refusal, or \
                 instances lost soon after they came), within fallback_hold.",
                &["pool"],
            )?,
            acquires_waiting: gauge(
                r,
                "flotilla_acquires_waiting",
                "Acquires waiting for a free slot (the pool's queue).",
                PP,
            )?,
        })
    }
}

/// Instances: their states, how they came and went, and the checks that make them ready and keep them so.
#[derive(Clone)]
pub(super) struct InstanceFamilies {
    pub(super) instances: IntGaugeVec,
    pub(super) ready_seconds: HistogramVec,
    pub(super) lifetime_seconds: HistogramVec,
    pub(super) scale_ops: IntCounterVec,
    pub(super) probe_seconds: HistogramVec,
    pub(super) probe_failures: IntCounterVec,
    pub(super) probes: IntCounterVec,
}

impl InstanceFamilies {
    pub(super) fn register(r: &Registry) -> Result<Self, MetricsError> {
        Ok(InstanceFamilies {
            instances: gauge(
                r,
                "flotilla_instances",
                "Instances by state.",
                &["pool", "plugin", "state"],
            )?,
            ready_seconds: histogram(
                r,
                "flotilla_instance_creation_to_ready_seconds",
                "Time from an instance's first sighting to ready.",
                PP,
                long(),
            )?,
            lifetime_seconds: histogram(
                r,
                "flotilla_instance_lifetime_seconds",
                "Instance lifetime.",
                PP,
                long(),
            )?,
            scale_ops: counter(
                r,
                "flotilla_scale_operations_total",
                "Instances requested (up) or removed by scale-down (down).",
                &["pool", "plugin", "direction"],
            )?,
            probe_seconds: histogram(
                r,
                "flotilla_instance_probe_duration_seconds",
                "Duration of instance readiness checks and idle pings (probe), by outcome.",
                &["pool", "plugin", "probe", "outcome"],
                vec![
                    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0, 300.0,
                ],
            )?,
            probe_failures: counter(
                r,
                "flotilla_instance_probe_failures_total",
                "Failed readiness checks and pings by probe and cause (connect-info, ssh-connect, \
                 ssh-auth, host-key, ssh, ready-command, docker).",
                &["pool", "plugin", "probe", "cause"],
            )?,
            probes: counter(
                r,
                "flotilla_instance_probes_total",
                "Readiness checks and idle pings (Docker /_ping) by outcome.",
                &["pool", "plugin", "probe", "outcome"],
            )?,
        })
    }
}

/// The pool's plugin: its calls, faults, egress denials, re-minted credentials and the wait for it.
#[derive(Clone)]
pub(super) struct PluginFamilies {
    pub(super) provider_ops: IntCounterVec,
    pub(super) provider_seconds: HistogramVec,
    pub(super) plugin_faults: IntCounterVec,
    pub(super) egress_denied: IntCounterVec,
    pub(super) credential_remints: IntCounterVec,
    pub(super) plugin_wait_seconds: CounterVec,
}

impl PluginFamilies {
    pub(super) fn register(r: &Registry) -> Result<Self, MetricsError> {
        Ok(PluginFamilies {
            provider_ops: counter(
                r,
                "flotilla_provider_operations_total",
                "Provider calls by function and outcome.",
                &["pool", "plugin", "function", "outcome"],
            )?,
            provider_seconds: histogram(
                r,
                "flotilla_provider_operation_duration_seconds",
                "Provider call duration by function and outcome.",
                &["pool", "plugin", "function", "outcome"],
                lat(),
            )?,
            plugin_faults: counter(
                r,
                "flotilla_plugin_faults_total",
                "Plugin traps, timeouts and contract violations.",
                &["pool", "plugin", "kind"],
            )?,
            egress_denied: counter(
                r,
                "flotilla_egress_denied_total",
                "Outbound plugin requests denied.",
                PP,
            )?,
            credential_remints: counter(
                r,
                "flotilla_credential_remints_total",
                "Plugin requests sent once more with a new token after the cloud refused the cached one.",
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
        })
    }
}

/// Leases: refused, acquired, handed over, failed, restored or expired, and the journal that keeps them.
#[derive(Clone)]
pub(super) struct LeaseFamilies {
    pub(super) lease_wait_seconds: HistogramVec,
    pub(super) leases_failed: IntCounterVec,
    pub(super) reservations_refused: IntCounterVec,
    pub(super) leases_acquired: IntCounterVec,
    pub(super) fallback_handovers: IntCounterVec,
    pub(super) lease_events: IntCounterVec,
    pub(super) journal_seconds: HistogramVec,
}

impl LeaseFamilies {
    pub(super) fn register(r: &Registry) -> Result<Self, MetricsError> {
        Ok(LeaseFamilies {
            lease_wait_seconds: histogram(
                r,
                "flotilla_lease_wait_seconds",
                "Time an acquire waited for a ready instance.",
                PP,
                lat(),
            )?,
            leases_failed: counter(
                r,
                "flotilla_leases_failed_total",
                "Leases failed because their instance failed.",
                PP,
            )?,
            reservations_refused: counter(
                r,
                "flotilla_reservations_refused_total",
                "Reservations refused for want of a slot: at_capacity (every slot up to max_instances promised) or no_idle_slot (preemptive mode), as the API's error codes.",
                &["pool", "reason"],
            )?,
            leases_acquired: counter(
                r,
                "flotilla_leases_acquired_total",
                "Leases bound to an instance: the demand each pool served (a reservation handed \
                 to a fallback pool counts where it was acquired).",
                &["pool"],
            )?,
            fallback_handovers: counter(
                r,
                "flotilla_fallback_handovers_total",
                "Waiting reservations a pool that could not grow handed to its fallback pool.",
                &["pool", "fallback"],
            )?,
            lease_events: counter(
                r,
                "flotilla_lease_events_total",
                "Leases restored from the journal at start, lost with their instance in a restart, and expired (TTL or max job duration).",
                &["pool", "plugin", "event"],
            )?,
            journal_seconds: histogram(
                r,
                "flotilla_journal_commit_duration_seconds",
                "Time to commit a lease change to the journal (fsync included), by outcome; the change is acknowledged after it.",
                &["pool", "plugin", "outcome"],
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ],
            )?,
        })
    }
}

/// CI jobs, as the GitLab driver reports them.
#[derive(Clone)]
pub(super) struct JobFamilies {
    pub(super) jobs_started: IntCounterVec,
    pub(super) jobs_finished: IntCounterVec,
    pub(super) job_prepare_seconds: HistogramVec,
    pub(super) image_pull_seconds: HistogramVec,
}

impl JobFamilies {
    pub(super) fn register(r: &Registry) -> Result<Self, MetricsError> {
        Ok(JobFamilies {
            jobs_started: counter(
                r,
                "flotilla_jobs_started_total",
                "CI jobs whose container started on a leased instance (reported by the driver).",
                &["pool"],
            )?,
            jobs_finished: counter(
                r,
                "flotilla_jobs_finished_total",
                "CI jobs by how their main script ended (reported by the driver).",
                &["pool", "outcome"],
            )?,
            job_prepare_seconds: histogram(
                r,
                "flotilla_job_prepare_seconds",
                "From a job's prepare to its container's start: waiting for an instance, pulls, services.",
                &["pool"],
                vec![
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                ],
            )?,
            image_pull_seconds: histogram(
                r,
                "flotilla_image_pull_seconds",
                "Time spent pulling a job's images (0 when they were on the instance).",
                &["pool"],
                vec![
                    0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                ],
            )?,
        })
    }
}

/// The API server: requests by route, those in flight, and the upgraded Docker streams.
#[derive(Clone)]
pub(super) struct ServerFamilies {
    pub(super) http_requests: IntCounterVec,
    pub(super) http_seconds: HistogramVec,
    pub(super) http_in_flight: IntGauge,
    pub(super) docker_streams: IntGauge,
    pub(super) connections: prometheus::IntGaugeVec,
    pub(super) accepted: IntCounterVec,
}

impl ServerFamilies {
    pub(super) fn register(r: &Registry) -> Result<Self, MetricsError> {
        Ok(ServerFamilies {
            http_requests: counter(
                r,
                "flotilla_http_requests_total",
                "API requests by route pattern, method and status code.",
                &["route", "method", "code"],
            )?,
            http_seconds: histogram(
                r,
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
            connections: {
                let g = prometheus::IntGaugeVec::new(
                    prometheus::Opts::new(
                        "flotilla_connections_open",
                        "TCP connections being served, by listener (`api`, `metrics`): bounded by \
                         server.max_connections, long polls and upgraded streams apart.",
                    ),
                    &["listener"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            accepted: counter(
                r,
                "flotilla_connections_accepted_total",
                "TCP connections accepted, by listener (`api`, `metrics`): against the requests, \
                 how often clients reuse their connections.",
                &["listener"],
            )?,
        })
    }
}

//! The pools of a running process and where each one is: starting, running, or failed to
//! start and waiting for its next try. The API serves from here while pools start, so one
//! slow or broken plugin never keeps the API (or another pool) down.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::metrics::PoolMetrics;
use flotilla_api::status::{
    HealthState, InstanceState, NotReady, Paused, PluginHealth, PoolEntry,
    PoolHealth as HealthView, PoolStatus, Restart, ScalerStatus, Slots,
};
use flotilla_connector::Connector;
use flotilla_scaler::{InstState, Millis, PoolHandle, PoolHealth, PoolSnapshot};

/// A pool whose plugin is loaded and initialised and whose scaler runs.
pub struct RunningPool {
    /// The scaler.
    pub handle: Arc<PoolHandle>,
    /// The connector, with `[pool.connector]`.
    pub connector: Option<Arc<Connector>>,
    /// The pool's metrics.
    pub metrics: PoolMetrics,
    /// `delete_instances_on_shutdown`.
    pub delete_on_shutdown: bool,
    /// The plugin's digest (`sha256:...`), carried by the pool's log lines.
    pub plugin_digest: String,
    /// The plugin as configured (a path or an `oci://` reference).
    pub plugin: String,
    /// Exporter ports `/sd/prometheus` lists per instance.
    pub exporter_ports: Vec<u16>,
    /// The plugin's id for the pool's instance group (`provider-info.id`, from `init`).
    pub group: String,
    /// What the plugin said of each machine, for a pool without a connector.
    pub described: Arc<crate::sd::Described>,
    /// The task that asks the plugin about the machines no acquire has asked about (a pool
    /// without a connector); it ends with the pool.
    pub describing: Option<crate::sd::AbortOnDrop>,
    /// The pool that takes its waiting reservations while it cannot grow.
    pub fallback: Option<String>,
}

/// Where a pool is.
pub enum PoolState {
    /// Loading the plugin or running `init`.
    Starting {
        /// Which try this is (1 for the first).
        attempt: u32,
        /// Since when (ms since the Unix epoch).
        since: Millis,
    },
    /// The last start failed and is tried again later.
    Failed {
        /// Why it failed.
        reason: String,
        /// Which try failed.
        attempt: u32,
        /// The next try (ms since the Unix epoch).
        retry_at: Millis,
    },
    /// Serving.
    Running(Arc<RunningPool>),
}

impl PoolState {
    /// The pool's health as `/v1/pools` and `/readyz` show it.
    fn health(&self) -> HealthView {
        match self {
            PoolState::Starting { attempt, since } => HealthView {
                reason: Some(format!(
                    "loading the plugin and running init (try {attempt})"
                )),
                attempt: Some(*attempt),
                since: Some(*since),
                ..HealthView::of(HealthState::Starting)
            },
            PoolState::Failed {
                reason,
                attempt,
                retry_at,
            } => HealthView {
                reason: Some(reason.clone()),
                attempt: Some(*attempt),
                retry_at: Some(*retry_at),
                ..HealthView::of(HealthState::StartFailed)
            },
            PoolState::Running(p) => health_view(&p.handle.snapshot().health),
        }
    }
}

/// The scaler's health as the API shows it.
pub fn health_view(health: &PoolHealth) -> HealthView {
    let (state, reason) = match health {
        PoolHealth::Starting => (HealthState::Starting, None),
        PoolHealth::Ready => (HealthState::Ready, None),
        PoolHealth::Degraded(why) => (HealthState::Degraded, Some(why.clone())),
        PoolHealth::Stopped(why) => (HealthState::Stopped, Some(why.clone())),
    };
    HealthView {
        reason,
        ..HealthView::of(state)
    }
}

/// Why a pool cannot serve a request.
pub enum Unavailable {
    /// No pool by that name in the config.
    Unknown,
    /// Still starting.
    Starting {
        /// Which try is under way.
        attempt: u32,
    },
    /// Its start failed; it is tried again later.
    Failed {
        /// Why it failed.
        reason: String,
        /// The next try (ms since the Unix epoch).
        retry_at: Millis,
    },
}

/// Every configured pool by name.
#[derive(Default)]
pub struct Pools {
    inner: RwLock<BTreeMap<String, PoolState>>,
}

impl Pools {
    /// Pools that are all starting (first try), as `flotilla run` begins.
    pub fn starting<'a>(names: impl IntoIterator<Item = &'a str>, now: Millis) -> Pools {
        let map = names
            .into_iter()
            .map(|n| {
                (
                    n.to_string(),
                    PoolState::Starting {
                        attempt: 1,
                        since: now,
                    },
                )
            })
            .collect();
        Pools {
            inner: RwLock::new(map),
        }
    }

    /// Pools that are all running (tests and benchmarks that build pools by hand).
    pub fn running(pools: impl IntoIterator<Item = (String, RunningPool)>) -> Pools {
        let map = pools
            .into_iter()
            .map(|(n, p)| (n, PoolState::Running(Arc::new(p))))
            .collect();
        Pools {
            inner: RwLock::new(map),
        }
    }

    // parking_lot's lock does not poison: every write is one insert, so a panic elsewhere
    // leaves the map whole.
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, PoolState>> {
        self.inner.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, PoolState>> {
        self.inner.write()
    }

    /// Records where a pool is now.
    pub fn set(&self, name: &str, state: PoolState) {
        self.write().insert(name.to_string(), state);
    }

    /// The running pool by that name, or why there is none.
    pub fn get(&self, name: &str) -> Result<Arc<RunningPool>, Unavailable> {
        match self.read().get(name) {
            None => Err(Unavailable::Unknown),
            Some(PoolState::Running(p)) => Ok(p.clone()),
            Some(PoolState::Starting { attempt, .. }) => {
                Err(Unavailable::Starting { attempt: *attempt })
            }
            Some(PoolState::Failed {
                reason, retry_at, ..
            }) => Err(Unavailable::Failed {
                reason: reason.clone(),
                retry_at: *retry_at,
            }),
        }
    }

    /// The running pools.
    pub fn running_pools(&self) -> Vec<(String, Arc<RunningPool>)> {
        self.read()
            .iter()
            .filter_map(|(n, s)| match s {
                PoolState::Running(p) => Some((n.clone(), p.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every pool's status for `/v1/pools`: the scaler's snapshot and the plugin's health for
    /// running pools, the start state for the others.
    pub fn status(&self) -> BTreeMap<String, PoolEntry> {
        let entry = |state: &PoolState| match state {
            PoolState::Running(p) => PoolEntry {
                plugin: Some(plugin_health(&p.handle.provider().health())),
                status: pool_status(&p.handle.snapshot()),
            },
            other => PoolEntry {
                plugin: None,
                status: PoolStatus {
                    health: other.health(),
                    scaler: None,
                },
            },
        };
        let pools = self.read();
        pools.iter().map(|(n, s)| (n.clone(), entry(s))).collect()
    }

    /// The pools that are not ready, each with its state only, for `/readyz`. `/readyz` needs
    /// no token, so the why (a cloud's error text, an account id, a file path) is left to the
    /// authenticated `/v1/pools`.
    pub fn not_ready(&self) -> BTreeMap<String, NotReady> {
        let pools = self.read();
        pools
            .iter()
            .map(|(name, state)| (name, state.health().state))
            .filter(|(_, state)| *state != HealthState::Ready)
            .map(|(name, state)| (name.clone(), NotReady::Pool { state }))
            .collect()
    }
}

/// A running pool's state as `GET /v1/pools` shows it.
fn pool_status(s: &PoolSnapshot) -> PoolStatus {
    let instances = InstState::ALL.map(|st| (instance_state(st), s.instances.get(st.name())));
    let paused = s.paused.iter().map(|(call, p)| {
        let paused = Paused {
            reason: p.reason.clone(),
            retry_at: p.retry_at,
        };
        (call.to_string(), paused)
    });
    let scaler = ScalerStatus {
        acquires_waiting: s.acquires_waiting,
        capacity_per_instance: s.capacity_per_instance,
        desired: s.desired,
        instances: instances
            .into_iter()
            .map(|(st, n)| (st, n.copied().unwrap_or(0)))
            .collect(),
        last_error: s.last_error.clone(),
        max_instances: s.max_instances,
        paused: paused.collect(),
        pending: s.pending,
        restart: Restart {
            adopted_after_ms: s.restart.adopted_after_ms,
            instances_adopted: s.restart.instances_adopted,
            leases_expired: s.restart.leases_expired,
            leases_lost: s.restart.leases_lost,
            leases_restored: s.restart.leases_restored,
        },
        slots: Slots {
            acquired: s.slots.acquired,
            idle: s.slots.idle,
            reserved: s.slots.reserved,
            unavailable: s.slots.unavailable,
        },
    };
    PoolStatus {
        health: health_view(&s.health),
        scaler: Some(scaler),
    }
}

pub(crate) fn instance_state(s: InstState) -> InstanceState {
    match s {
        InstState::Creating => InstanceState::Creating,
        InstState::Running => InstanceState::Running,
        InstState::Ready => InstanceState::Ready,
        InstState::Draining => InstanceState::Draining,
        InstState::Deleting => InstanceState::Deleting,
        InstState::Failed => InstanceState::Failed,
    }
}

/// The sandbox's view of a plugin as the API shows it. The provider's health is taken apart
/// field by field, without `..`: a field added to `ProviderHealth` stops the build here until
/// the wire (`PluginHealth`) says what becomes of it.
fn plugin_health(h: &flotilla_provider::ProviderHealth) -> PluginHealth {
    let flotilla_provider::ProviderHealth {
        consecutive_faults,
        traps,
        timeouts,
        contract_violations,
        restarts,
        circuit_open,
        last_fault,
        egress_denied,
        egress_remints,
        call_wait_micros,
    } = h;
    PluginHealth {
        call_wait_micros: *call_wait_micros,
        circuit_open: *circuit_open,
        consecutive_faults: *consecutive_faults,
        contract_violations: *contract_violations,
        egress_denied: *egress_denied,
        egress_remints: *egress_remints,
        last_fault: last_fault.clone(),
        restarts: *restarts,
        timeouts: *timeouts,
        traps: *traps,
    }
}

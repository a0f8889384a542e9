//! Per-plugin resource limits: deadlines per export, an aggregate memory cap, instance and
//! table caps, and caps on guest output.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use flotilla_provider::Function;

/// How much one plugin instance may use, so a misbehaving plugin cannot starve the host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Deadline for every export not listed in `deadlines`.
    #[serde(with = "humantime_serde")]
    pub default_deadline: Duration,
    /// Deadlines per export, keyed by WIT name (`init`, `update`, `connect-info`...).
    #[serde(with = "humantime_serde_map")]
    pub deadlines: BTreeMap<Function, Duration>,
    /// Total bytes across all linear memories of one instance.
    pub memory_bytes: usize,
    /// Core instances one component may create.
    pub instances: usize,
    /// Tables one component may create.
    pub tables: usize,
    /// Elements one table may grow to.
    pub table_elements: usize,
    /// Linear memories one component may create.
    pub memories: usize,
    /// Bytes of stdout+stderr logged per instance before the rest is dropped.
    pub output_bytes: usize,
    /// Lines through the `log` interface per export call before the rest is dropped.
    pub log_lines_per_call: u32,
    /// Consecutive faults after which calls fail fast for `circuit_cooldown`.
    pub circuit_threshold: u32,
    /// How long calls fail fast once the circuit opens.
    #[serde(with = "humantime_serde")]
    pub circuit_cooldown: Duration,
    /// Outgoing requests of the pool's plugin that may be open at once (sent and not yet
    /// read to the end or dropped). Each holds a connection, so this bounds the sockets too.
    pub requests_in_flight: u32,
    /// Outgoing requests of the pool's plugin per minute (a sliding window).
    pub requests_per_minute: u32,
    /// Host resources (header sets, requests, responses, streams, pollables) one instance may
    /// hold at once. With `http_fields_bytes` this bounds the host memory a plugin can take
    /// outside its linear memory: at most `resource_entries × http_fields_bytes`.
    pub resource_entries: usize,
    /// Bytes of one header set (`wasi:http` fields) a plugin may build, counted as the host
    /// stores it.
    pub http_fields_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_deadline: Duration::from_secs(30),
            deadlines: BTreeMap::from([
                (Function::Increase, Duration::from_secs(60)),
                (Function::Decrease, Duration::from_secs(60)),
                (Function::Heartbeat, Duration::from_secs(10)),
                (Function::ConnectInfo, Duration::from_secs(15)),
            ]),
            memory_bytes: 256 << 20,
            instances: 32,
            tables: 32,
            table_elements: 100_000,
            memories: 8,
            output_bytes: 64 << 10,
            log_lines_per_call: 1_000,
            circuit_threshold: 5,
            circuit_cooldown: Duration::from_secs(30),
            requests_in_flight: 16,
            requests_per_minute: 600,
            resource_entries: 4_096,
            http_fields_bytes: 32 << 10,
        }
    }
}

impl Limits {
    /// The deadline for one export call.
    pub fn deadline(&self, function: Function) -> Duration {
        self.deadlines
            .get(&function)
            .copied()
            .unwrap_or(self.default_deadline)
    }

    /// Every problem with these limits, for config validation.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let zero_deadline =
            self.default_deadline.is_zero() || self.deadlines.values().any(|d| d.is_zero());
        if zero_deadline {
            out.push("deadlines must be greater than zero".to_string());
        }
        if self.memory_bytes < (1 << 20) {
            out.push("memory_bytes: must be at least 1 MiB".to_string());
        }
        if self.instances == 0 || self.tables == 0 || self.memories == 0 {
            out.push("instances, tables and memories must be at least 1".to_string());
        }
        if self.resource_entries < 64 {
            out.push("resource_entries: must be at least 64".to_string());
        }
        if self.http_fields_bytes < 4096 {
            out.push("http_fields_bytes: must be at least 4096".to_string());
        }
        if self.requests_in_flight == 0 || self.requests_per_minute == 0 {
            out.push("requests_in_flight and requests_per_minute must be at least 1".to_string());
        }
        if self.circuit_threshold == 0 {
            out.push("circuit_threshold: must be at least 1".to_string());
        }
        out
    }
}

mod humantime_serde_map {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    use flotilla_provider::Function;

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<Function, Duration>, D::Error> {
        let raw = BTreeMap::<Function, String>::deserialize(d)?;
        raw.into_iter()
            .map(|(k, v)| {
                humantime::parse_duration(&v)
                    .map(|d| (k, d))
                    .map_err(|e| serde::de::Error::custom(format!("deadlines.{}: {e}", k.name())))
            })
            .collect()
    }
}

/// Caps the memory of a whole store (all its linear memories together), which
/// wasmtime's per-memory `StoreLimits` cannot do.
#[derive(Debug)]
pub(crate) struct AggregateLimiter {
    limits: Limits,
    used: usize,
    /// Set when the cap refused a growth, so the trap can be reported as "memory cap".
    pub(crate) exceeded: Option<usize>,
}

impl AggregateLimiter {
    pub(crate) fn new(limits: Limits) -> Self {
        AggregateLimiter {
            limits,
            used: 0,
            exceeded: None,
        }
    }
}

impl wasmtime::ResourceLimiter for AggregateLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let after = self.used.saturating_sub(current).saturating_add(desired);
        if after > self.limits.memory_bytes {
            self.exceeded = Some(after);
            return Err(wasmtime::format_err!(
                "plugin memory cap exceeded: growing to {} MiB of {} MiB allowed",
                after >> 20,
                self.limits.memory_bytes >> 20
            ));
        }
        self.used = after;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.limits.table_elements)
    }

    fn instances(&self) -> usize {
        self.limits.instances
    }

    fn tables(&self) -> usize {
        self.limits.tables
    }

    fn memories(&self) -> usize {
        self.limits.memories
    }
}

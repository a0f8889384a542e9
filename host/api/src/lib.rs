//! The lease API's wire vocabulary, written once: the stable error codes with their HTTP
//! status, the error body, the lease as the API shows it, the request bodies, and the pools'
//! and the process's state (`status`). The server (`flotilla run`) and every client in this
//! repository (the GitLab driver first) use these types, so a code or a field cannot drift
//! between them. Tests check the docs' table of codes (each code and its status) against
//! [`ErrorCode::ALL`], and each answer the docs show against its type, field for field.
//!
//! Must not know: HTTP servers or clients, the scaler, tokio. A leaf.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// The stable error codes of the API (`{"error": {"code": ...}}`); clients match on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No such endpoint.
    NotFound,
    /// Missing or wrong bearer token.
    Unauthorized,
    /// No pool by that name.
    UnknownPool,
    /// The path's lease id is not a number.
    BadLeaseId,
    /// No lease by that id in the pool.
    UnknownLease,
    /// The lease is already bound to an instance.
    AlreadyAcquired,
    /// The lease was never bound.
    NotAcquired,
    /// The lease is bound, so it cannot be unreserved.
    Acquired,
    /// The lease failed (its instance went away); the message says why.
    LeaseFailed,
    /// The pool cannot promise another slot.
    AtCapacity,
    /// Preemptive mode, and no idle slot now.
    NoIdleSlot,
    /// The process is draining.
    ShuttingDown,
    /// The pool stopped or failed to start.
    PoolStopped,
    /// The pool is still loading its plugin or running `init`.
    PoolStarting,
    /// No instance became ready in time; the lease is still reserved.
    AcquireTimeout,
    /// The pool has no `[pool.connector]` with Docker, so the host serves no Docker API.
    NoDocker,
    /// The lease's instance could not be reached (SSH or Docker Engine failed).
    InstanceUnreachable,
    /// The request body or query is malformed; the message says where.
    BadRequest,
    /// Another live lease already carries the label.
    LabelInUse,
    /// The lease journal could not be written; nothing changed, retry.
    StoreFailed,
    /// The pool has no lease TTL, so there is nothing to renew.
    NoTtl,
    /// The lease ended while a request made under it was on its way; the request was cut.
    LeaseEnded,
    /// The lease's instance has no shell the host can reach (it is not an SSH instance, or
    /// the pool has no `[pool.connector]`), so the host serves no exec for it.
    NoShell,
    /// The pool does not allow what the request asks (a privileged container without the
    /// pool's `allow_privileged`).
    NotAllowed,
    /// The host serves as many connections as it may (`max_connections`): the connection
    /// was answered this and closed. A client waits (`Retry-After`) and asks again.
    TooManyRequests,
    /// A code this client does not know (a newer server); the HTTP status still applies.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// Every code a server sends (not [`ErrorCode::Unknown`]).
    pub const ALL: [ErrorCode; 25] = [
        ErrorCode::NotFound,
        ErrorCode::Unauthorized,
        ErrorCode::UnknownPool,
        ErrorCode::BadLeaseId,
        ErrorCode::UnknownLease,
        ErrorCode::AlreadyAcquired,
        ErrorCode::NotAcquired,
        ErrorCode::Acquired,
        ErrorCode::LeaseFailed,
        ErrorCode::AtCapacity,
        ErrorCode::NoIdleSlot,
        ErrorCode::ShuttingDown,
        ErrorCode::PoolStopped,
        ErrorCode::PoolStarting,
        ErrorCode::AcquireTimeout,
        ErrorCode::NoDocker,
        ErrorCode::InstanceUnreachable,
        ErrorCode::BadRequest,
        ErrorCode::LabelInUse,
        ErrorCode::StoreFailed,
        ErrorCode::NoTtl,
        ErrorCode::LeaseEnded,
        ErrorCode::NoShell,
        ErrorCode::NotAllowed,
        ErrorCode::TooManyRequests,
    ];

    /// The HTTP status that goes with the code.
    pub fn status(self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            ErrorCode::NotFound | ErrorCode::UnknownPool | ErrorCode::UnknownLease => S::NOT_FOUND,
            ErrorCode::Unauthorized => S::UNAUTHORIZED,
            ErrorCode::NotAllowed => S::FORBIDDEN,
            ErrorCode::BadLeaseId | ErrorCode::BadRequest => S::BAD_REQUEST,
            ErrorCode::AlreadyAcquired
            | ErrorCode::NotAcquired
            | ErrorCode::Acquired
            | ErrorCode::NoDocker
            | ErrorCode::NoShell
            | ErrorCode::LabelInUse
            | ErrorCode::NoTtl => S::CONFLICT,
            ErrorCode::LeaseFailed | ErrorCode::LeaseEnded => S::GONE,
            ErrorCode::AtCapacity | ErrorCode::NoIdleSlot => S::TOO_MANY_REQUESTS,
            ErrorCode::ShuttingDown
            | ErrorCode::PoolStopped
            | ErrorCode::PoolStarting
            | ErrorCode::StoreFailed
            | ErrorCode::TooManyRequests => S::SERVICE_UNAVAILABLE,
            ErrorCode::AcquireTimeout => S::GATEWAY_TIMEOUT,
            ErrorCode::InstanceUnreachable => S::BAD_GATEWAY,
            ErrorCode::Unknown => S::INTERNAL_SERVER_ERROR,
        }
    }

    /// The code as it is written on the wire (`unknown_lease`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::UnknownPool => "unknown_pool",
            ErrorCode::BadLeaseId => "bad_lease_id",
            ErrorCode::UnknownLease => "unknown_lease",
            ErrorCode::AlreadyAcquired => "already_acquired",
            ErrorCode::NotAcquired => "not_acquired",
            ErrorCode::Acquired => "acquired",
            ErrorCode::LeaseFailed => "lease_failed",
            ErrorCode::AtCapacity => "at_capacity",
            ErrorCode::NoIdleSlot => "no_idle_slot",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::PoolStopped => "pool_stopped",
            ErrorCode::PoolStarting => "pool_starting",
            ErrorCode::AcquireTimeout => "acquire_timeout",
            ErrorCode::NoDocker => "no_docker",
            ErrorCode::InstanceUnreachable => "instance_unreachable",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::LabelInUse => "label_in_use",
            ErrorCode::StoreFailed => "store_failed",
            ErrorCode::NoTtl => "no_ttl",
            ErrorCode::LeaseEnded => "lease_ended",
            ErrorCode::NoShell => "no_shell",
            ErrorCode::NotAllowed => "not_allowed",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::Unknown => "unknown",
        }
    }

    /// The pool is not serving now but will be: it is starting, the process is draining for
    /// a restart, or it serves as many connections as it may. A client waits and asks again.
    pub fn restarting(self) -> bool {
        matches!(
            self,
            ErrorCode::PoolStarting | ErrorCode::ShuttingDown | ErrorCode::TooManyRequests
        )
    }

    /// Every slot is promised: a client may wait for one to free up.
    pub fn pool_full(self) -> bool {
        matches!(self, ErrorCode::AtCapacity | ErrorCode::NoIdleSlot)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An error answer: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The code and the words of an error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened, for people.
    pub message: String,
}

/// Where a lease stands: `{"state": "acquired", "instance": ..., "slot": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum LeaseState {
    /// A slot is promised; no instance bound yet.
    Reserved,
    /// Bound to a slot of a ready instance.
    Acquired {
        /// The instance.
        instance: String,
        /// The slot index on it.
        slot: u32,
    },
    /// Its instance failed or vanished; the cause says why.
    Failed {
        /// What happened.
        cause: String,
    },
}

/// One lease as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// Its id, unique across the process's pools and restarts.
    pub id: u64,
    /// Where it stands.
    pub state: LeaseState,
    /// When it was reserved.
    pub reserved_at: Millis,
    /// When it was acquired.
    pub acquired_at: Option<Millis>,
    /// The client's labels; each pair is held by one live lease at most.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// With a lease TTL: when the lease fails unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Millis>,
    /// With a deadline asked for at the reservation: when the lease fails whatever its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<Millis>,
    /// Whom the lease's work belongs to, when the reservation named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The pool the lease was reserved in, when that pool handed it to the one holding it now
    /// (its fallback); the holder keeps using the first pool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_from: Option<String>,
}

/// `GET /v1/pools/{pool}/leases[?label=k=v]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseList {
    /// The pool.
    pub pool: String,
    /// Its leases (at most one with a label query).
    pub leases: Vec<LeaseView>,
}

/// `POST /v1/pools/{pool}/leases` answers `201` with this (and `GET .../leases/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAnswer {
    /// The pool.
    pub pool: String,
    /// The lease.
    pub lease: LeaseView,
}

/// The body of a reservation: `{"labels": {"key": "value"}}`, or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    /// Labels, e.g. `{"gitlab-job": "4242"}`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The lease fails this many seconds after the reservation whatever its state, unless
    /// released first: the holder's own bound (a CI job's timeout plus a grace), so a holder
    /// that never comes back cannot keep its slot for good. At most
    /// [`ReserveRequest::MAX_DEADLINE_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u64>,
    /// Whom the lease's work belongs to (the GitLab driver in instance mode: the project and
    /// its protection). An instance that served one tenant is never given to another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl ReserveRequest {
    /// The longest deadline a reservation may ask for: a year and a day (GitLab's longest
    /// job timeout is a month).
    pub const MAX_DEADLINE_SECONDS: u64 = 366 * 24 * 3600;
}

/// `POST .../leases/{id}/release` answers this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseAnswer {
    /// The pool.
    pub pool: String,
    /// The lease.
    pub lease: u64,
    /// Always true: the lease is gone.
    pub released: bool,
}

/// `DELETE .../leases/{id}` answers this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreserveAnswer {
    /// The pool.
    pub pool: String,
    /// The lease.
    pub lease: u64,
    /// Always true: the reservation is gone.
    pub unreserved: bool,
}

/// `POST .../leases/{id}/renew` answers this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewAnswer {
    /// The pool.
    pub pool: String,
    /// The lease.
    pub lease: u64,
    /// When the lease now fails unless renewed again.
    pub expires_at: Millis,
}

/// `POST .../leases/{id}/report` answers this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportAnswer {
    /// The pool.
    pub pool: String,
    /// The lease.
    pub lease: u64,
    /// Always true: the report was counted.
    pub reported: bool,
}

/// The body of a release: `{"instance_broken": "why"}` when the holder found the instance
/// unusable (it is then failed and replaced), or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// Why the instance is broken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_broken: Option<String>,
}

/// A lease holder's report on the job it runs (`POST .../leases/{id}/report`), for the job
/// metrics: `{"job_started": {...}}`, `{"job_finished": {...}}`, or both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    /// The job's container (or directory, in instance mode) is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_started: Option<JobStarted>,
    /// The job's main script ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_finished: Option<JobFinished>,
}

/// How long a job took to start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobStarted {
    /// From the start of `prepare` until the job could run, in seconds.
    pub prepare_seconds: f64,
    /// Of that, pulling the job's image, in seconds.
    pub pull_seconds: f64,
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFinished {
    /// The outcome.
    pub outcome: JobOutcome,
}

/// How a job's script ended, as its driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobOutcome {
    /// Exit 0.
    Success,
    /// The script failed.
    BuildFailure,
    /// The infrastructure failed.
    SystemFailure,
    /// Cancelled.
    Cancelled,
}

impl JobOutcome {
    /// The name on the wire and in the metrics' `outcome` label.
    pub fn name(self) -> &'static str {
        match self {
            JobOutcome::Success => "success",
            JobOutcome::BuildFailure => "build-failure",
            JobOutcome::SystemFailure => "system-failure",
            JobOutcome::Cancelled => "cancelled",
        }
    }
}

/// The answer to an acquire: the instance and slot, how to connect, and the Docker handle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcquireAnswer {
    /// The pool.
    pub pool: String,
    /// The lease.
    pub lease: u64,
    /// The instance it is bound to.
    pub instance: String,
    /// The slot on the instance.
    pub slot: u32,
    /// The plugin's connection details (no key material), when it gave them.
    pub connection: Option<serde_json::Value>,
    /// Why the plugin gave none.
    pub connection_error: Option<String>,
    /// Where the holder reaches Docker Engine on the instance, when the pool serves one.
    pub docker: Option<DockerHandle>,
}

/// The connection handle of an acquired lease: the host forwards Docker Engine API requests
/// under `path` (with the API's bearer token) to the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerHandle {
    /// The API path to use as Docker's base URL, e.g. `/v1/pools/p/leases/7/docker`.
    pub path: String,
}

pub mod exec;
pub mod status;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_written_as_its_name_and_read_back() {
        for code in ErrorCode::ALL {
            let text = serde_json::to_string(&code).expect("serialize");
            assert_eq!(text, format!("\"{}\"", code.name()));
            let back: ErrorCode = serde_json::from_str(&text).expect("deserialize");
            assert_eq!(back, code);
            assert!(code.status().is_client_error() || code.status().is_server_error());
        }
        let newer: ErrorCode = serde_json::from_str("\"from_the_future\"").expect("unknown");
        assert_eq!(newer, ErrorCode::Unknown);
    }

    #[test]
    fn a_lease_reads_as_the_server_writes_it() {
        let text = r#"{"id":7,"state":{"state":"acquired","instance":"m1","slot":0},"reserved_at":1,"acquired_at":2,"labels":{"gitlab-job":"9"}}"#;
        let lease: LeaseView = serde_json::from_str(text).expect("lease");
        assert_eq!(
            lease.state,
            LeaseState::Acquired {
                instance: "m1".into(),
                slot: 0
            }
        );
        assert_eq!(serde_json::to_string(&lease).expect("write"), text);
    }
}

#[cfg(test)]
mod docs {
    use super::ErrorCode;

    /// The rows of docs/api.md's error table: `| `code` | status | when |`.
    fn table(page: &str) -> Vec<(String, u16)> {
        let mut rows = Vec::new();
        let mut inside = false;
        for line in page.lines() {
            if line.starts_with("| code | status |") {
                inside = true;
                continue;
            }
            if !inside || line.starts_with("|---") {
                continue;
            }
            if !line.starts_with('|') {
                break;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let code = cells.get(1).map(|c| c.trim_matches('`').to_string());
            let status = cells.get(2).and_then(|s| s.parse::<u16>().ok());
            match (code, status) {
                (Some(code), Some(status)) => rows.push((code, status)),
                _ => panic!("docs/api.md: a row of the error table is not `code` | status: {line}"),
            }
        }
        rows
    }

    /// The error table of docs/api.md is the API's: one row per code the server sends, each
    /// with the status the code goes with, and no row for a code that does not exist.
    #[test]
    fn the_docs_error_table_is_the_apis() {
        let rows = table(include_str!("../../../docs/api.md"));
        let mut want: Vec<(String, u16)> = ErrorCode::ALL
            .iter()
            .map(|c| (c.name().to_string(), c.status().as_u16()))
            .collect();
        let mut got = rows.clone();
        want.sort();
        got.sort();
        assert_eq!(
            got, want,
            "docs/api.md's error table against ErrorCode::ALL"
        );
        assert_eq!(rows.len(), ErrorCode::ALL.len(), "a code is listed twice");
    }

    /// Reads `sample` as `T` and writes it back: the same JSON, so every field the docs show
    /// is one the type has, with the same shape, and none the type sends is missing.
    fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(sample: &serde_json::Value) {
        let typed: T = serde_json::from_value(sample.clone())
            .unwrap_or_else(|e| panic!("docs/api.md: {e} in {sample}"));
        let back = serde_json::to_value(&typed).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&back, sample, "docs/api.md's answer against the wire type");
    }

    /// Every answer docs/api.md shows is one of the API's types, field for field.
    #[test]
    fn the_docs_answers_are_the_apis_types() {
        let page = include_str!("../../../docs/api.md");
        let samples: Vec<serde_json::Value> = page
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(samples.len(), 4, "the answers docs/api.md shows");
        for sample in &samples {
            let has = |key: &str| sample.get(key).is_some();
            if has("pools") {
                round_trip::<super::status::PoolsAnswer>(sample);
                let pools: super::status::PoolsAnswer =
                    serde_json::from_value(sample.clone()).unwrap_or_else(|e| panic!("{e}"));
                let running = pools.pools.values().all(|p| p.status.scaler.is_some());
                assert!(running, "a running pool's counts do not read: {sample}");
            } else if has("released") {
                round_trip::<super::ReleaseAnswer>(sample);
            } else if has("instance") {
                round_trip::<super::AcquireAnswer>(sample);
            } else if sample
                .get("lease")
                .is_some_and(serde_json::Value::is_object)
            {
                round_trip::<super::LeaseAnswer>(sample);
            } else {
                panic!("docs/api.md shows an answer this test does not know: {sample}");
            }
        }
    }
}

//! The GitLab Runner Custom-executor driver (`flotilla gitlab config|prepare|run|cleanup`).
//!
//! Owns: the Custom executor protocol (stages, `CUSTOM_ENV_*`, exit codes, signals), the
//! job's identity (from the runner's `JOB_RESPONSE_FILE` only), the job's lease (reserved
//! with the job id as a label, found again by it in every stage, since the driver keeps no
//! state between stages), and the job's containers, network and volumes on the leased
//! instance, all tagged with the job id; riding through restarts of the host.
//! Must not know: SSH, keys, scaling or plugins. It reaches Docker Engine on the instance only
//! through the host's Docker handle of the lease (`/v1/pools/<pool>/leases/<id>/docker`), and
//! the lease API only through the wire types of `flotilla-api`.

pub mod api;
mod containers;
pub mod docker;
pub mod image;
pub mod job;
mod lease;
mod script;
pub mod stages;
pub mod tar;

pub use api::{ApiClient, ApiError, LeaseInfo};
pub use containers::{CACHE_LABEL, JOB_LABEL};
pub use job::{CacheBounds, DriverSettings, Job, JobError, JobLimits, PullPolicy};
pub use stages::{Outcome, cleanup, config, prepare, run};

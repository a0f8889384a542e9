//! The GitLab Runner Custom-executor driver (`flotilla gitlab config|prepare|run|cleanup`).
//!
//! Owns: the Custom executor protocol (stages, `CUSTOM_ENV_*`, exit codes, signals), the
//! job's lease (reserved with the job id as a label, found again by it in every stage, since
//! the driver keeps no state between stages), and the job's containers, network and volume on
//! the leased instance, all tagged with the job id.
//! Must not know: SSH, keys, scaling or plugins. It reaches Docker Engine on the instance only
//! through the host's Docker handle of the lease (`/v1/pools/<pool>/leases/<id>/docker`).

pub mod api;
pub mod docker;
pub mod job;
pub mod stages;
mod tar;

pub use api::{ApiClient, ApiError, LeaseInfo};
pub use job::{DriverSettings, Job, JobError, PullPolicy};
pub use stages::{Outcome, cleanup, config, prepare, run};

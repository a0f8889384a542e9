//! The GitLab Runner Custom-executor driver (`flotilla gitlab config|prepare|run|cleanup`).
//!
//! Owns: the Custom executor protocol (stages, `CUSTOM_ENV_*`, exit codes, signals), the
//! job's identity (from the runner's `JOB_RESPONSE_FILE` only), the job's lease (reserved
//! with the job id as a label, found again by it in every stage, since the driver keeps no
//! state between stages), and the job's containers, network and volumes on the leased
//! instance, all tagged with the job id; riding through restarts of the host.
//! In instance mode (`instance`, `machine`) the job runs on the machine itself instead: its own
//! directory there, its scripts run with the runner's shell (bash, or PowerShell on Windows).
//! Must not know: SSH, keys, scaling or plugins. It reaches Docker Engine on the instance only
//! through the host's Docker handle of the lease (`/v1/pools/<pool>/leases/<id>/docker`), the
//! machine's shell only through the lease's exec endpoint (`.../exec`), and the lease API only
//! through the wire types of `flotilla-api`.

pub mod api;
mod containers;
pub mod docker;
pub mod image;
pub mod instance;
pub mod job;
mod lease;
pub mod machine;
pub mod outcome;
mod script;
pub mod setting;
pub mod stages;
pub mod tar;

pub use api::{ApiClient, ApiError, LeaseInfo};
pub use containers::{CACHE_LABEL, JOB_LABEL};
pub use job::{CacheBounds, DriverSettings, Job, JobError, JobLimits, Mode, PullPolicy};
pub use machine::{InstanceSettings, MachineOs, Shell};
pub use outcome::Outcome;
pub use setting::SettingError;
pub use stages::{cleanup, config, prepare, run};

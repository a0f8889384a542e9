//! The GitLab Runner Custom-executor driver (`flotilla gitlab config|prepare|run|cleanup`).
//!
//! Owns: the Custom executor protocol (stages, `CUSTOM_ENV_*`, exit codes, signals), the
//! job's identity (from the runner's `JOB_RESPONSE_FILE` only), the job's lease (reserved
//! with the job id as a label, found again by it in every stage, since the driver keeps no
//! state between stages), and the job's place on the leased instance: its containers,
//! network and volumes, all tagged with the job id (Docker mode, `docker/`), or its own
//! directory on the machine, its scripts run with the runner's shell (instance mode,
//! `instance/`). The stages are written once for both modes (`stages`, over the `place`
//! seam), and so is riding through restarts of the host.
//! Must not know: SSH, keys, scaling or plugins. It reaches Docker Engine on the instance only
//! through the host's Docker handle of the lease (`/v1/pools/<pool>/leases/<id>/docker`), the
//! machine's shell only through the lease's exec endpoint (`.../exec`), and the lease API only
//! through the wire types of `flotilla-api`.

pub mod api;
mod detached;
pub mod docker;
pub mod image;
pub mod instance;
pub mod job;
mod kept;
mod lease;
pub mod outcome;
mod pending;
mod place;
pub mod setting;
pub mod stages;
pub mod tar;
pub mod terminal;
mod transport;
pub mod variables;

pub use api::{ApiClient, ApiError, LeaseInfo};
pub use detached::sh_quote;
pub use docker::{CACHE_LABEL, JOB_LABEL};
pub use docker::{ContainerOptions, DockerSettings};
pub use instance::settings::{InstanceSettings, MachineOs, Shell};
pub use job::{CacheBounds, DriverSettings, Job, JobError, JobLimits, Mode, PullPolicy};
pub use outcome::Outcome;
pub use pending::default_dir as default_state_dir;
pub use place::Context;
pub use setting::SettingError;
pub use stages::{cleanup, config, prepare, run};
pub use transport::TransportOptions;

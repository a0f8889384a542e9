//! Flotilla: a CI fleet autoscaler whose cloud providers are sandboxed WebAssembly plugins.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![warn(missing_docs)]

pub mod api;
pub mod check;
pub mod config;
pub mod credentials;
pub mod metrics;
pub mod oci;
pub mod plugin;
pub mod provider;
pub mod run;
pub mod scaler;
pub mod simulate;

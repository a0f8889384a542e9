//! Flotilla: a CI fleet autoscaler whose cloud providers are sandboxed WebAssembly plugins.
//!
//! This crate is the composition root. Owns: the config file (each room's shape composed into
//! one), the HTTP API, metrics, and building, serving and draining the pools (`app`).
//! Must not know: how a plugin runs (that is `flotilla-plugin-runtime`), how a registry is
//! spoken to (`flotilla-oci`), or scaling policy (`flotilla-scaler`).

pub mod api;
pub mod app;
pub mod check;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod example_cloud;
pub mod metrics;
pub mod migrate;
pub mod pools;
pub mod preflight;
pub mod serve;
pub mod signals;
pub mod simulate;

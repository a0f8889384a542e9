//! Flotilla: a CI fleet autoscaler whose cloud providers are sandboxed WebAssembly plugins.
//!
//! This crate is the binary's library. It holds two things, kept apart:
//!
//! - **What it serves** (the composition root): the config file, each room's shape composed into
//!   one (`config`); building, serving and draining the pools (`app`, `pools`, `serve`,
//!   `preflight`, `signals`); the lease API (`api`) and the metrics (`metrics`); the commands
//!   that drive them (`cli`), and the simulator over a config (`simulate`). How a plugin runs is
//!   `flotilla-plugin-runtime`'s, how a registry is spoken to `flotilla-oci`'s, scaling policy
//!   `flotilla-scaler`'s.
//! - **The tools it carries**, which nothing served depends on: the plugin author's kit
//!   (`plugin_kit`: `plugin check`, the conformance kit, the example cloud, the sandbox flags),
//!   and the move from Docker Machine (`migrate`).

// What it serves.
pub mod api;
pub mod app;
pub mod cli;
pub mod config;
pub mod custom_executor;
pub mod fallback;
pub mod metrics;
pub mod pools;
pub mod preflight;
pub mod sd;
pub mod serve;
pub mod signals;
pub mod simulate;
pub mod tls;

// The tools it carries.
pub mod migrate;
pub mod plugin_kit;

//! The guest SDK of the plugins of this repository (built for wasm32-wasip2): what every plugin
//! needs besides HTTP (`flotilla-guest-http`).
//!
//! - [`settings`]: the pool's `plugin_config` read so that `init` reports every problem at
//!   once, the known keys derived from the settings type;
//! - [`State`]: the cell that holds what `init` made for the calls that follow.
//!
//! It has no dependency beyond serde, and nothing of the host: the host never links it.

pub mod settings;
mod state;

pub use state::{NotInitialized, State};

//! From history to policy: `flotilla tune` reads a fleet's real job history and recommends
//! the cheapest policy that meets a waiting-time goal.
//!
//! - `history`: GitLab jobs API JSON, CSV and Flotilla's lease history in; jobs out, every
//!   refused record with its line and reason.
//! - `synth`: a month of synthetic jobs from a documented model.
//! - `screen`: a fast slot-level model that ranks candidates (never printed).
//! - `search`: candidates, screening, the frontier verified on the real scaler, held-out days
//!   and sensitivity.
//! - `render`: the report, the blocks to paste, the SVG.
//! - `trace` and `timeline`: `flotilla simulate`'s CSV job trace, and its runs' table and
//!   chart; with the above, the one what-if crate (the binary needs no CSV reader or plotting
//!   library of its own).
//!
//! It must not know about config files or the command line (the binary reads the pool and
//! hands over its scaler settings and policies).

pub mod history;
pub mod render;
pub mod screen;
pub mod search;
pub mod synth;
pub mod timeline;
pub mod trace;

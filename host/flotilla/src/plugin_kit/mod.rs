//! The plugin author's and the registry operator's toolbox, which the binary carries next to
//! the service: `plugin check` (`check`), the conformance kit behind `plugin test` (`conformance`,
//! run by `kit`), the example cloud the templates are tried against (the
//! `flotilla-example-cloud` crate, which the tests drive too), and the sandbox flags of a quick
//! try (`sandbox`). Nothing the service runs depends on this module.

pub mod check;
pub mod conformance;
pub mod kit;
pub mod sandbox;

//! The plugin author's and the registry operator's toolbox, which the binary carries next to
//! the service: `plugin new` (`new`, with the embedded `templates`), `plugin check` and
//! `plugin export` (`check`), the conformance kit behind `plugin test` (`conformance`, run by
//! `kit`; the example cloud the templates are tried against is the `flotilla-example-cloud`
//! crate, which the tests drive too), the sandbox flags of a quick try (`sandbox`), and the
//! registry commands `push`, `pull`, `inspect`, `login`, `logout`, `ls`, `sign` and
//! `generate-key` (`registry`). The `plugin` command in `cli/` keeps only its arguments and
//! `run`. Nothing the service runs depends on this module.

pub mod check;
pub mod conformance;
pub mod kit;
pub mod new;
pub mod registry;
pub mod sandbox;
pub mod templates;

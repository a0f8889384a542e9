//! The cloud plugins' contract suites live in this crate's one test binary
//! (`tests/all/main.rs`): each official cloud plugin through the real plugin runtime, the
//! host's credentials and the scaler, against its peer (moto with SigV4 checking for AWS; the
//! GCP and Azure stand-ins in `flotilla-peers`, which cite their sources). Nothing here starts
//! the `flotilla` process; the tests that do are the binary crate's.

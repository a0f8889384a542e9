//! The cloud plugins' contract suites, one module per plugin (see the crate's page). The
//! `aws` credential chain's test sets environment variables, so it keeps a binary of its own
//! (`tests/aws_chain.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

mod aws;
mod azure;
mod gcp;

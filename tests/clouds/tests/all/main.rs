//! The cloud plugins' contract suites, one module per plugin (see the crate's page), and the
//! `aws` credential chain's links against moto.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

mod aws;
mod aws_chain;
mod azure;
mod gcp;

//! The binary crate's tests: each module starts the `flotilla` process (or `flotilla-gitlab`,
//! as a runner starts it) and drives it as an operator, a runner or a peer would, against real
//! machines, registries, clouds' stand-ins and Docker Engines. One test binary, as every
//! crate of the house has (wasmtime's `tests/all`): `common` is compiled once, and its
//! `DOCKER` lock is one lock for every module that uses the shared Docker Engine.
//!
//! What does not need the process is tested in its room (`host/*/tests/all`, `tests/clouds`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

mod common;

mod bystander;
mod cli;
mod clouds;
mod deploy;
mod docs;
mod fleet;
mod gitlab;
mod instance;
mod migrate;
mod oci;
mod operator;
mod pipelines;
mod restart;
mod run;
mod start;
mod tenants;

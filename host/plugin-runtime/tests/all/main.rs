//! The plugin runtime's tests: the host loads each guest and runs every export; test guests
//! prove the sandbox, the limits and the egress checks from the hostile side. Each protection
//! test here fails when its protection is removed (see the issue notes). The tests that start
//! the `flotilla` process (`plugin check`, `plugin test`) are the binary's, in
//! `host/flotilla/tests/all/cli.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use flotilla_harness as common;
use flotilla_harness::must;

mod contract_0_1_0;
mod egress;
mod escape;
mod load_checks;
mod misbehave;
mod nonconforming;
mod stall_start;
mod static_plugin;
mod template;

use std::time::{Duration, Instant};

use common::{LogCapture, load, quick_sandbox};
use flotilla_plugin_runtime::Sandbox;
use flotilla_provider::{CallError, Function, InstanceState, Protocol, Provider, ProviderError};
use flotilla_test_artifacts as guests;

flotilla_test_artifacts::assert_test_guests_covered!();

/// A well-behaved second plugin in the same process, to prove faults stay contained.
async fn bystander() -> impl Provider {
    let p = load(guests::STATIC_PLUGIN).provider("bystander", Sandbox::default());
    must(p.init(r#"{"hosts":[{"address":"198.51.100.7"}]}"#)).await;
    p
}

async fn assert_bystander_works(p: &impl Provider) {
    let before = must(p.update()).await.instances.len();
    assert!(must(p.increase(1)).await <= 1);
    let after = must(p.update()).await.instances;
    assert!(after.len() >= before);
    let ids: Vec<String> = after.iter().map(|i| i.id.clone()).collect();
    must(p.decrease(&ids)).await;
}

//! How `flotilla run` starts its pools: the API listens before any plugin loads, pools start
//! concurrently, a pool that cannot start is reported and tried again until it can, and a
//! start that hangs never holds up the API, the other pools or shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

use std::time::{Duration, Instant};

use common::{Flotilla, TOKEN};
use flotilla_harness::poll;
use flotilla_test_artifacts as guests;
use serde_json::Value;

fn config(late_plugin: &std::path::Path) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "5s"

# A plugin whose start-up waits on the host forever: cut at the init deadline, every time.
[[pool]]
name = "stall"
plugin = "{stall}"
max_instances = 1
paused_retry_interval = "1s"
[pool.limits]
deadlines = {{ init = "6s" }}

# A plugin file that is half-written when the process starts, and fixed later.
[[pool]]
name = "late"
plugin = "{late}"
capacity_per_instance = 1
max_instances = 1
update_interval = "1s"
paused_retry_interval = "1s"
[pool.plugin_config]
hosts = [{{ address = "127.0.0.9" }}]

[[pool]]
name = "good"
plugin = "{good}"
capacity_per_instance = 2
max_instances = 2
instance_acquire_timeout = "10s"
update_interval = "1s"
[pool.plugin_config]
hosts = [{{ address = "127.0.0.1" }}, {{ address = "127.0.0.2" }}]
"#,
        stall = guests::STALL_START,
        late = late_plugin.display(),
        good = guests::STATIC_PLUGIN,
    )
}

fn state(pools: &Value, name: &str) -> String {
    pools["pools"][name]["status"]["health"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn the_api_serves_while_a_pool_hangs_in_start_up_and_a_failed_pool_heals_without_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let late = dir.path().join("late.wasm");
    std::fs::write(&late, b"\0asm half-copied").expect("a broken plugin file");
    let spawned = Instant::now();
    let f = Flotilla::serving(dir, &config(&late)).await;

    // The API answers before the hanging pool's init deadline (6 s) has passed: it does not
    // wait for the pools.
    let (code, pools) = f.call("GET", "/v1/pools", None).await;
    assert_eq!(code, 200, "{pools}");
    assert!(
        spawned.elapsed() < Duration::from_secs(6),
        "the API took {:?}",
        spawned.elapsed()
    );
    assert_eq!(state(&pools, "stall"), "starting", "{pools}");

    // Pools start concurrently: the good pool serves a lease cycle while "stall" still hangs.
    f.wait_for("/v1/pools", "the good pool to run", |v| {
        state(v, "good") == "ready"
    })
    .await;
    let (_, pools) = f.call("GET", "/v1/pools", None).await;
    assert_eq!(state(&pools, "stall"), "starting", "{pools}\n{}", f.log());
    f.lease_cycle("good").await;

    // A pool still starting refuses leases with its own code, not "unknown pool".
    let (code, body) = f
        .call(
            "POST",
            "/v1/pools/stall/leases",
            Some(serde_json::json!({})),
        )
        .await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error"]["code"], "pool_starting", "{body}");

    // /readyz names the pools that are not ready with their states; why (a path here, a
    // cloud's error text elsewhere) only behind the token, in /v1/pools.
    let (code, ready) = f.call("GET", "/readyz", None).await;
    assert_eq!(code, 503, "{ready}");
    assert_eq!(ready["pools"]["stall"]["state"], "starting", "{ready}");
    assert_eq!(ready["pools"]["late"]["state"], "start-failed", "{ready}");
    assert!(!ready.to_string().contains("late.wasm"), "{ready}");
    assert!(ready["pools"].get("good").is_none(), "{ready}");
    let (_, pools) = f.call("GET", "/v1/pools", None).await;
    assert!(
        pools["pools"]["late"]["status"]["health"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("late.wasm")),
        "{pools}"
    );

    // The hanging start is cut at its deadline, reported, and tried again.
    let pools = f
        .wait_for("/v1/pools", "the hanging start to be cut", |v| {
            state(v, "stall") == "start-failed"
        })
        .await;
    let stall = &pools["pools"]["stall"]["status"]["health"];
    assert!(
        stall["reason"]
            .as_str()
            .is_some_and(|r| r.contains("init: plugin did not return within 6000ms")),
        "{stall}"
    );
    assert!(stall["retry_at"].as_u64().is_some(), "{stall}");
    let (code, body) = f
        .call(
            "POST",
            "/v1/pools/stall/leases",
            Some(serde_json::json!({})),
        )
        .await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error"]["code"], "pool_stopped", "{body}");
    f.wait_for("/v1/pools", "the second try", |v| {
        v["pools"]["stall"]["status"]["health"]["attempt"].as_u64() >= Some(2)
    })
    .await;

    // Deploying the whole plugin file heals the failed pool without a restart.
    let (_, before) = f.call("GET", "/v1/pools", None).await;
    let attempts = before["pools"]["late"]["status"]["health"]["attempt"]
        .as_u64()
        .expect("attempt");
    assert!(attempts >= 2, "late was not retried: {before}");
    std::fs::copy(guests::STATIC_PLUGIN, &late).expect("deploy the plugin");
    f.wait_for("/v1/pools", "the late pool to heal", |v| {
        state(v, "late") == "ready"
    })
    .await;
}

/// SIGTERM while a pool hangs in start-up: the start is abandoned and the process drains
/// and exits 0 within its grace period.
#[tokio::test]
async fn sigterm_during_a_hanging_start_exits_within_the_grace_period() {
    let dir = tempfile::tempdir().expect("dir");
    let late = dir.path().join("never.wasm");
    std::fs::write(&late, b"not a component").expect("a broken plugin file");
    let mut f = Flotilla::serving(dir, &config(&late)).await;
    f.wait_for("/v1/pools", "the good pool to run", |v| {
        state(v, "good") == "ready"
    })
    .await;
    let (_, pools) = f.call("GET", "/v1/pools", None).await;
    assert_eq!(state(&pools, "stall"), "starting", "{pools}");
    let pid = f.process.id().to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = poll::until("the exit after SIGTERM", Duration::from_secs(5), || {
        let status = f.process.try_wait();
        async move { status.ok_or("still running") }
    })
    .await;
    assert!(status.success(), "{status:?}\n{}", f.log());
}

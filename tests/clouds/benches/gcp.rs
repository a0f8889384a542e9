//! `update()` of the GCP plugin for a group of 100 instances on the loopback Compute stand-in,
//! against the same `listManagedInstances` call made directly from the host with reqwest,
//! the same `gcp` credential (a cached token from the stand-in's metadata server) and the
//! instance ids parsed out of the JSON.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use flotilla_harness::clouds::GcpPlugin;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_credentials::SigningHints;
use flotilla_peers::gcp_cloud::{GROUP, GcpCloud, PROJECT, ZONE};
use flotilla_provider::Provider;

fn gcp(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cloud = rt.block_on(GcpCloud::start(false));
    cloud.with(|s| s.settle = Duration::ZERO);
    let credential = cloud.credential();
    // The default budget (600 requests a minute) is a production guard; the benchmark sends
    // thousands.
    let mut sandbox = cloud.sandbox(credential.clone());
    sandbox.limits.requests_per_minute = 10_000_000;
    let p = flotilla_harness::load(flotilla_test_artifacts::GCP_PLUGIN).provider("gcp", sandbox);
    rt.block_on(async {
        p.init(&cloud.settings(100)).await.unwrap();
        assert_eq!(p.increase(100).await.unwrap(), 100);
        assert_eq!(p.update().await.unwrap().instances.len(), 100);
    });
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let url = format!(
        "{}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/{GROUP}/listManagedInstances?maxResults=500",
        cloud.endpoint
    );
    let mut g = c.benchmark_group("gcp_update_100");
    g.measurement_time(Duration::from_secs(10));
    g.sample_size(30);
    g.bench_function("plugin", |b| {
        b.to_async(&rt)
            .iter(|| async { p.update().await.unwrap().instances.len() })
    });
    g.bench_function("host_reqwest", |b| {
        b.to_async(&rt).iter(|| async {
            let mut request = http::Request::post(url.as_str()).body(()).unwrap();
            credential
                .apply(&mut request, b"", &SigningHints::default())
                .await
                .unwrap();
            let mut req = client
                .post(url.as_str())
                .header("accept", "application/json");
            for (k, v) in request.headers() {
                req = req.header(k, v);
            }
            let body = req.send().await.unwrap().bytes().await.unwrap();
            let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let ids: Vec<String> = page["managedInstances"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["instance"].as_str().map(str::to_string))
                .collect();
            assert_eq!(ids.len(), 100);
            ids.len()
        })
    });
    g.finish();
}

criterion_group!(benches, gcp);
criterion_main!(benches);

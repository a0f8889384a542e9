//! `update()` of the Azure plugin for a Uniform scale set of 100 instances on the loopback ARM
//! (`test-support/src/azure_cloud.rs`), against the same VMSS VMs List call made directly from
//! the host with reqwest, authorised by the same credential (so the same cached token), and the
//! instance ids and states extracted. Goal: plugin ≤ 1.2 × host (medians, same run).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use flotilla_harness as common;
use flotilla_harness::clouds::AzurePlugin;

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_credentials::SigningHints;
use flotilla_peers::azure_cloud::{AzureCloud, Mode, Options};
use flotilla_provider::Provider;

fn azure(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let cloud = AzureCloud::start(Options {
        mode: Mode::Uniform,
        running: 100,
        page_size: 1000,
        create_after: Duration::ZERO,
        ..Options::default()
    });
    let credential = cloud.credential();
    let mut sandbox = cloud.sandbox(credential.clone());
    // The default rate limit (600 requests a minute) would throttle the measurement itself.
    sandbox.limits.requests_per_minute = 10_000_000;
    let p = common::load(flotilla_test_artifacts::AZURE_PLUGIN).provider("azure", sandbox);
    rt.block_on(async {
        p.init(&cloud.settings())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let n = p
            .update()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .instances
            .len();
        assert_eq!(n, 100);
    });
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let url = format!(
        "{}{}/virtualMachines?api-version=2024-07-01&$expand=instanceView",
        cloud.endpoint,
        AzureCloud::set_id()
    );
    let mut g = c.benchmark_group("azure_update_100");
    g.measurement_time(Duration::from_secs(10));
    g.sample_size(30);
    g.bench_function("plugin", |b| {
        b.to_async(&rt)
            .iter(|| async { p.update().await.unwrap_or_else(|e| panic!("{e}")).instances })
    });
    g.bench_function("host_reqwest_bearer", |b| {
        b.to_async(&rt).iter(|| async {
            let mut request = http::Request::get(url.as_str())
                .body(())
                .unwrap_or_else(|e| panic!("{e}"));
            credential
                .apply(&mut request, b"", &SigningHints::default())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let mut req = client.get(url.as_str());
            for (k, v) in request.headers() {
                req = req.header(k, v);
            }
            let text = req
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .text()
                .await
                .unwrap_or_default();
            let page: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let vms: Vec<(String, String)> = page["value"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|vm| {
                    let power = vm["properties"]["instanceView"]["statuses"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s["code"].as_str())
                        .find(|c| c.starts_with("PowerState/"))
                        .unwrap_or_default();
                    (
                        vm["instanceId"].as_str().unwrap_or_default().to_string(),
                        power.to_string(),
                    )
                })
                .collect();
            assert_eq!(vms.len(), 100);
            vms
        })
    });
    g.finish();
}

criterion_group!(benches, azure);
criterion_main!(benches);

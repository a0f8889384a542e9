//! What an `oci://` plugin costs at pool start, against loading the same file from disk (the
//! baseline), on the real registry: a start from the cache (`if-not-present`), a start that
//! re-resolves the tag (`always`), one that also re-checks a cosign signature, and a cold pull
//! of the 438 KB template plugin into an empty cache. Needs Debian's docker-registry.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_oci::{
    AuthStore, KeyPair, OciRef, PublicKey, PullPolicy, PushAnnotations, RegistryOptions, Store,
};
use flotilla_peers::registry::{Mode, Registry};
use flotilla_plugin_runtime::{PluginRuntime, RuntimeOptions};
use flotilla_test_artifacts as guests;

fn oci(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let reg = rt.block_on(Registry::start(Mode::Anonymous));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let runtime = PluginRuntime::new(RuntimeOptions {
        cache_dir: Some(dir.path().join("compiled")),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let auth = AuthStore {
        own: dir.path().join("auth.json"),
        docker: None,
    };
    let opts = RegistryOptions {
        plain_http_loopback: true,
        ..RegistryOptions::default()
    };
    let registry = flotilla_oci::Registry::new(
        opts.clone(),
        auth.clone(),
        Store::open(&dir.path().join("oci")).unwrap_or_else(|e| panic!("{e}")),
    );
    let r = OciRef::parse(&reg.reference("bench/template:1")).unwrap_or_else(|e| panic!("{e}"));
    let wasm = std::fs::read(guests::TEMPLATE_PLUGIN).unwrap_or_else(|e| panic!("{e}"));
    let (private, public) =
        flotilla_oci::generate_key_pair(b"pw").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("k.key"), private.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("k.pub"), public).unwrap_or_else(|e| panic!("{e}"));
    let pair = KeyPair::load(&dir.path().join("k.key"), b"pw").unwrap_or_else(|e| panic!("{e}"));
    let key = PublicKey::load(&dir.path().join("k.pub")).unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        registry
            .push(
                &wasm,
                "template.wasm",
                flotilla_plugin_runtime::WORLD,
                &r,
                PushAnnotations::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        registry
            .sign(&r, &pair)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    });
    // Warm both the OCI cache and the compile cache.
    let start = |policy: PullPolicy, key: Option<&PublicKey>| {
        let pulled = rt
            .block_on(registry.pull(&r, policy, key, None))
            .unwrap_or_else(|e| panic!("{e}"));
        let bytes = std::fs::read(&pulled.wasm).unwrap_or_else(|e| panic!("{e}"));
        runtime
            .load_bytes(&pulled.reference.to_string(), &bytes)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    start(PullPolicy::Always, Some(&key));
    runtime
        .load_file(Path::new(guests::TEMPLATE_PLUGIN))
        .unwrap_or_else(|e| panic!("{e}"));

    let mut g = c.benchmark_group("oci_start");
    g.measurement_time(Duration::from_secs(5));
    g.sample_size(30);
    g.bench_function("file_baseline", |b| {
        b.iter(|| {
            runtime
                .load_file(Path::new(guests::TEMPLATE_PLUGIN))
                .unwrap_or_else(|e| panic!("{e}"))
        })
    });
    g.bench_function("cached_if_not_present", |b| {
        b.iter(|| start(PullPolicy::IfNotPresent, None))
    });
    g.bench_function("cached_if_not_present_verified", |b| {
        b.iter(|| start(PullPolicy::IfNotPresent, Some(&key)))
    });
    g.bench_function("always_resolve_tag", |b| {
        b.iter(|| start(PullPolicy::Always, None))
    });
    g.bench_function("always_resolve_tag_verified", |b| {
        b.iter(|| start(PullPolicy::Always, Some(&key)))
    });
    // The registry's own cost for the one request `always` adds: GET the manifest by tag.
    let http = reqwest::Client::new();
    let manifest_url = format!("http://{}/v2/bench/template/manifests/1", reg.host());
    g.bench_function("reqwest_manifest_get", |b| {
        b.iter(|| {
            rt.block_on(async {
                http.get(&manifest_url)
                    .header("accept", "application/vnd.oci.image.manifest.v1+json")
                    .send()
                    .await
                    .and_then(|r| r.error_for_status())
                    .unwrap_or_else(|e| panic!("{e}"))
                    .bytes()
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            })
        })
    });
    g.bench_function("cold_pull_template", |b| {
        b.iter_batched(
            || {
                let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
                let store = Store::open(&d.path().join("oci")).unwrap_or_else(|e| panic!("{e}"));
                (
                    d,
                    flotilla_oci::Registry::new(opts.clone(), auth.clone(), store),
                )
            },
            |(_d, fresh)| {
                rt.block_on(fresh.pull(&r, PullPolicy::Always, None, None))
                    .unwrap_or_else(|e| panic!("{e}"))
            },
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, oci);
criterion_main!(benches);

//! Loading the plugin templates: the first compile and the cached load of each language, side
//! by side in one run, against the Rust template. The Python and JavaScript components are
//! built outside the workspace (`flotilla plugin new` + their build, as `scripts/templates.sh`
//! does); give their paths in `FLOTILLA_BENCH_PYTHON` and `FLOTILLA_BENCH_JS`, or only the Rust
//! template is measured.
//!
//! A cached load is what a restart of `flotilla run` pays per pool: the file's identity is
//! checked against the cache index (no hashing), the compiled code is mapped and deserialized,
//! and the imports are linked.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_plugin_runtime::{PluginRuntime, RuntimeOptions};

fn templates(c: &mut Criterion) {
    let mut plugins = vec![(
        "rust",
        PathBuf::from(flotilla_test_artifacts::TEMPLATE_PLUGIN),
    )];
    for (lang, var) in [
        ("python", "FLOTILLA_BENCH_PYTHON"),
        ("js", "FLOTILLA_BENCH_JS"),
    ] {
        match std::env::var_os(var) {
            Some(p) => plugins.push((lang, PathBuf::from(p))),
            None => eprintln!("{var} is not set: {lang} is not measured"),
        }
    }
    let cache = tempfile::tempdir().unwrap();
    let cached = PluginRuntime::new(RuntimeOptions {
        cache_dir: Some(cache.path().to_path_buf()),
    })
    .unwrap();
    for (_, path) in &plugins {
        cached.load_file(path).unwrap(); // compiles into the cache once
    }
    let mut g = c.benchmark_group("template_cached_load");
    g.measurement_time(Duration::from_secs(5));
    for (lang, path) in &plugins {
        g.bench_function(*lang, |b| b.iter(|| cached.load_file(path).unwrap()));
    }
    g.finish();
    let uncached = PluginRuntime::new(RuntimeOptions { cache_dir: None }).unwrap();
    let mut g = c.benchmark_group("template_first_compile");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(30));
    for (lang, path) in &plugins {
        g.bench_function(*lang, |b| b.iter(|| uncached.load_file(path).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, templates);
criterion_main!(benches);

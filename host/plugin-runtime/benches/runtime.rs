//! Runtime benchmarks on the static plugin and the Rust template: a trivial export call,
//! instantiation, load from the compile cache, first compile, RSS per live instance, and a
//! guest HTTP GET against the same GET made directly with reqwest on loopback.
//!
//! Run with `./scripts/bench.sh`, which prints the medians and ratios.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

#[allow(dead_code)]
use flotilla_example_cloud::{ExampleCloud, Options};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_net::AllowList;
use flotilla_plugin_runtime::{EgressPolicy, PluginRuntime, RuntimeOptions, Sandbox};
use flotilla_provider::Provider;
use flotilla_test_artifacts as guests;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn runtime(cache: Option<&Path>) -> PluginRuntime {
    PluginRuntime::new(RuntimeOptions {
        cache_dir: cache.map(Path::to_path_buf),
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

const STATIC_SETTINGS: &str = r#"{"hosts":[{"address":"192.0.2.1"}]}"#;

fn plugins(c: &mut Criterion) {
    let tokio = rt();
    let cache = std::env::temp_dir().join(format!("flotilla-bench-cache-{}", std::process::id()));
    let rt_cached = runtime(Some(&cache));
    for (name, path) in [
        ("static", guests::STATIC_PLUGIN),
        ("template", guests::TEMPLATE_PLUGIN),
    ] {
        let mut g = c.benchmark_group(name);
        g.measurement_time(Duration::from_secs(4));
        // Prime the cache.
        rt_cached
            .load_file(Path::new(path))
            .unwrap_or_else(|e| panic!("{e}"));
        g.bench_function("load_from_cache", |b| {
            b.iter(|| {
                rt_cached
                    .load_file(Path::new(path))
                    .unwrap_or_else(|e| panic!("{e}"))
            })
        });
        let rt_nocache = runtime(None);
        g.sample_size(10);
        g.bench_function("first_compile", |b| {
            b.iter(|| {
                rt_nocache
                    .load_file(Path::new(path))
                    .unwrap_or_else(|e| panic!("{e}"))
            })
        });
        g.sample_size(100);
        let plugin = rt_cached
            .load_file(Path::new(path))
            .unwrap_or_else(|e| panic!("{e}"));
        let provider = plugin.provider("bench", Sandbox::default());
        g.bench_function("instantiate", |b| {
            b.to_async(&tokio).iter(|| async {
                provider
                    .probe_instantiate()
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            })
        });
        g.finish();
    }

    let plugin = rt_cached
        .load_file(Path::new(guests::STATIC_PLUGIN))
        .unwrap_or_else(|e| panic!("{e}"));
    let provider = plugin.provider("bench", Sandbox::default());
    tokio
        .block_on(provider.init(STATIC_SETTINGS))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut g = c.benchmark_group("static");
    g.bench_function("trivial_call", |b| {
        b.to_async(&tokio).iter(|| async {
            provider
                .update()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .instances
        })
    });
    g.finish();

    rss_per_instance(&tokio, &rt_cached);
    let _ = std::fs::remove_dir_all(&cache);
}

/// Resident memory added per live, initialised instance of the static plugin.
fn rss_per_instance(tokio: &tokio::runtime::Runtime, rt: &PluginRuntime) {
    fn rss_kib() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4
    }
    let plugin = rt
        .load_file(Path::new(guests::STATIC_PLUGIN))
        .unwrap_or_else(|e| panic!("{e}"));
    const N: u64 = 1000;
    let mut live = Vec::new();
    let before = rss_kib();
    for i in 0..N {
        let p = plugin.provider(&format!("p{i}"), Sandbox::default());
        tokio
            .block_on(p.init(STATIC_SETTINGS))
            .unwrap_or_else(|e| panic!("{e}"));
        live.push(p);
    }
    let after = rss_kib();
    let per = (after.saturating_sub(before)) as f64 / N as f64;
    println!("rss_per_instance: {per:.1} KiB ({N} live instances of the static plugin)");
    if let Some(dir) = std::env::var_os("FLOTILLA_BENCH_OUT") {
        let _ = std::fs::write(
            Path::new(&dir).join("rss_per_instance_kib"),
            format!("{per:.1}"),
        );
    }
}

/// A multi-threaded runtime with `workers` worker threads, like flotilla's own.
fn workers(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn http(c: &mut Criterion) {
    // Like flotilla's own runtime: several workers, the provider called from a task on one.
    let tokio = workers(2);
    // The cloud runs on a runtime of its own, as a remote peer would: its work and its
    // wake-ups are not on the client's worker threads.
    let cloud_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let options = Options {
        group: "ci".into(),
        max_size: 3,
        token: None,
    };
    let cloud = cloud_rt
        .block_on(ExampleCloud::start(options))
        .unwrap_or_else(|e| panic!("{e}"));
    let endpoint = cloud.endpoint();
    let sandbox = Sandbox {
        egress: EgressPolicy {
            allow: AllowList::parse(&[endpoint.as_str()]).unwrap_or_else(|e| panic!("{e:?}")),
            allowed_ip_ranges: vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))],
            max_requests_per_call: 1_000_000,
            ..EgressPolicy::default()
        },
        // The budgets stay on (their cost is measured); only the rate is lifted for the loop.
        limits: flotilla_plugin_runtime::Limits {
            requests_per_minute: u32::MAX,
            ..Default::default()
        },
        ..Sandbox::default()
    };
    let rt = runtime(None);
    let plugin = rt
        .load_file(Path::new(guests::TEMPLATE_PLUGIN))
        .unwrap_or_else(|e| panic!("{e}"));
    // The same plugin with one request a minute: `init` spends it, and every GET after is
    // refused by the request budget, the last egress check, before any I/O. So
    // `guest_update_denied` is the guest's side of the cost (the call, the request built
    // through wasi:http, every egress check) without the network and the body; one GET a
    // minute does go out, which is noise among the iterations.
    let denied = plugin.provider(
        "bench-denied",
        Sandbox {
            limits: flotilla_plugin_runtime::Limits {
                requests_per_minute: 1,
                ..Default::default()
            },
            ..sandbox.clone()
        },
    );
    let provider = plugin.provider("bench", sandbox.clone());
    let settings = format!(r#"{{"endpoint":"{endpoint}","group":"ci"}}"#);
    tokio
        .block_on(provider.init(&settings))
        .unwrap_or_else(|e| panic!("{e}"));
    tokio
        .block_on(denied.init(&settings))
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{endpoint}/v1/groups/ci/instances");
    let pooled = {
        // reqwest is built without a default TLS provider; tests use ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::new()
    };
    // The host opens one connection per guest request (after its own resolution and IP
    // check), so the like-for-like baseline does not pool connections either.
    let fresh = {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
    }
    .pool_max_idle_per_host(0)
    .build()
    .unwrap_or_else(|e| panic!("{e}"));
    let (provider, denied) = (Arc::new(provider), Arc::new(denied));
    let url = Arc::new(url);
    let mut g = c.benchmark_group("http_get");
    g.measurement_time(Duration::from_secs(5));
    // One GET each: the template's update() is exactly GET {endpoint}/v1/groups/ci/instances
    // plus JSON decoding; the baseline does the same GET and decodes the same JSON.
    g.bench_function("guest_update", |b| {
        let p = provider.clone();
        b.iter_custom(on_worker(&tokio, move || {
            let p = p.clone();
            async move { p.update().await.unwrap_or_else(|e| panic!("{e}")).instances }
        }))
    });
    g.bench_function("guest_update_denied", |b| {
        let d = denied.clone();
        b.iter_custom(on_worker(&tokio, move || {
            let d = d.clone();
            async move { d.update().await }
        }))
    });
    for (name, client) in [
        ("reqwest_fresh_connection", &fresh),
        ("reqwest_pooled", &pooled),
    ] {
        g.bench_function(name, |b| {
            let (client, url) = (client.clone(), url.clone());
            b.iter_custom(on_worker(&tokio, move || {
                let (client, url) = (client.clone(), url.clone());
                async move { get_json(&client, &url).await }
            }))
        });
    }
    g.finish();
    let gets = Gets {
        provider,
        pooled,
        url: url.clone(),
    };
    cpu_per_get(&tokio, gets.clone(), "");
    interleaved_get(&tokio, gets, "");
    // One worker: the calling task and both clients' connection tasks share one thread, so no
    // GET waits on a wake-up of the other worker. On two workers, where each connection task
    // sits (next to the caller or not) varies from run to run and moves reqwest's latency
    // between about 30 and 100 µs; on one, every figure repeats within a few percent. A
    // provider and a reqwest client of its own: connections belong to the runtime that opened
    // them.
    let tokio = workers(1);
    let provider = plugin.provider("bench-one-worker", sandbox);
    tokio
        .block_on(provider.init(&settings))
        .unwrap_or_else(|e| panic!("{e}"));
    let gets = Gets {
        provider: Arc::new(provider),
        pooled: reqwest::Client::new(),
        url,
    };
    cpu_per_get(&tokio, gets.clone(), "_one_worker");
    interleaved_get(&tokio, gets, "_one_worker");
}

/// CPU time of the whole process (every thread: the caller's workers and the cloud's), in ns.
fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// CPU spent per GET, the cloud's included (it serves both alike), in alternating blocks of
/// 200 guest GETs and 200 reqwest GETs, 10 blocks each. Latency on a loopback round trip is
/// mostly waiting and waking; this says what each GET costs the machine. The figure goes to
/// `$FLOTILLA_BENCH_OUT/http_get_cpu{suffix}`.
fn cpu_per_get(tokio: &tokio::runtime::Runtime, gets: Gets, suffix: &str) {
    const BLOCK: u64 = 200;
    let (guest, baseline) = on_a_worker(tokio, async move {
        let (mut guest, mut baseline) = (0u64, 0u64);
        for _ in 0..10 {
            let start = process_cpu_ns();
            for _ in 0..BLOCK {
                std::hint::black_box(gets.guest().await);
            }
            let mid = process_cpu_ns();
            for _ in 0..BLOCK {
                std::hint::black_box(gets.baseline().await);
            }
            guest += mid - start;
            baseline += process_cpu_ns() - mid;
        }
        (guest / (10 * BLOCK), baseline / (10 * BLOCK))
    });
    let line = format!(
        "guest {:.1} µs, reqwest pooled {:.1} µs, ratio {:.2}x",
        guest as f64 / 1e3,
        baseline as f64 / 1e3,
        guest as f64 / baseline.max(1) as f64
    );
    println!("http_get{suffix} cpu per GET (process, cloud included): {line}");
    if let Some(dir) = std::env::var_os("FLOTILLA_BENCH_OUT") {
        let _ = std::fs::write(Path::new(&dir).join(format!("http_get_cpu{suffix}")), line);
    }
}

/// Criterion's timing routine for `iters` calls of `f` made one after another in one task on a
/// worker thread of `tokio`, where flotilla's scaler calls its providers. (Criterion's own
/// `to_async` runs the future with `block_on` on the bench's thread instead, outside the
/// workers, so that every wake-up of a spawned task crosses threads there and nowhere else.)
fn on_worker<F, Fut>(tokio: &tokio::runtime::Runtime, f: F) -> impl FnMut(u64) -> Duration + '_
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future + Send,
    Fut::Output: Send,
{
    move |iters| {
        let f = f.clone();
        on_a_worker(tokio, async move {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                std::hint::black_box(f().await);
            }
            start.elapsed()
        })
    }
}

/// The two clients the GET comparisons alternate: the guest (through its provider) and pooled
/// reqwest on the same URL.
#[derive(Clone)]
struct Gets {
    provider: Arc<flotilla_plugin_runtime::WasmProvider>,
    pooled: reqwest::Client,
    url: Arc<String>,
}

impl Gets {
    async fn guest(&self) -> Vec<flotilla_provider::Instance> {
        self.provider
            .update()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .instances
    }

    async fn baseline(&self) -> serde_json::Value {
        get_json(&self.pooled, &self.url).await
    }
}

/// Runs `f` to completion in a task on a worker thread of `tokio` (see `on_worker`).
fn on_a_worker<T: Send + 'static>(
    tokio: &tokio::runtime::Runtime,
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    tokio
        .block_on(tokio.spawn(f))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The baseline of the guest's GET: the same GET through reqwest, and the same JSON decoding.
async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    let body = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .bytes()
        .await;
    serde_json::from_slice(&body.unwrap_or_default()).unwrap_or_default()
}

/// The guest's GET and pooled reqwest's, interleaved two ways so that drift in the machine's
/// load hits both alike, 4,000 GETs of each after 400 of warm-up:
/// - one by one, the order flipping each round;
/// - in blocks of 20 of one kind, the kinds alternating (the first 2 GETs of each block, where
///   the runtime settles after the switch, are left out).
///
/// They differ on a 2-worker runtime: each client's connection has its own task, and switching
/// clients on every GET moves the calling task between the workers (each switch wakes the
/// other worker), which costs the guest's larger working set more. On one worker they agree.
/// Prints both medians and ratios, and leaves them in `$FLOTILLA_BENCH_OUT` (the file names
/// end in `suffix`).
fn interleaved_get(tokio: &tokio::runtime::Runtime, gets: Gets, suffix: &str) {
    const BLOCK: u32 = 20;
    // On a worker thread, like the scaler's calls (see `on_worker`).
    let (mut g, mut b, mut gb, mut bb) = on_a_worker(tokio, async move {
        let baseline = || gets.baseline();
        let guest = || gets.guest();
        let (mut g, mut b) = (Vec::new(), Vec::new());
        for round in 0..4_400u32 {
            let t = std::time::Instant::now();
            if round % 2 == 0 {
                std::hint::black_box(guest().await);
                let mid = std::time::Instant::now();
                std::hint::black_box(baseline().await);
                if round >= 400 {
                    g.push(mid - t);
                    b.push(mid.elapsed());
                }
            } else {
                std::hint::black_box(baseline().await);
                let mid = std::time::Instant::now();
                std::hint::black_box(guest().await);
                if round >= 400 {
                    b.push(mid - t);
                    g.push(mid.elapsed());
                }
            }
        }
        let (mut gb, mut bb) = (Vec::new(), Vec::new());
        for block in 0..(2 * 4_400 / BLOCK) {
            for i in 0..BLOCK {
                let t = std::time::Instant::now();
                if block % 2 == 0 {
                    std::hint::black_box(guest().await);
                } else {
                    std::hint::black_box(baseline().await);
                }
                if block >= 2 * 400 / BLOCK && i >= 2 {
                    if block % 2 == 0 {
                        gb.push(t.elapsed())
                    } else {
                        bb.push(t.elapsed())
                    }
                }
            }
        }
        (g, b, gb, bb)
    });
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let line = |g: &mut Vec<Duration>, b: &mut Vec<Duration>| {
        let (gm, bm) = (median(g), median(b));
        let ratio = gm.as_secs_f64() / bm.as_secs_f64();
        format!("guest {gm:?}, reqwest pooled {bm:?}, ratio {ratio:.2}x")
    };
    let (one, blocks) = (line(&mut g, &mut b), line(&mut gb, &mut bb));
    println!("http_get{suffix} interleaved one by one: {one}");
    println!("http_get{suffix} interleaved in blocks of {BLOCK}: {blocks}");
    if let Some(dir) = std::env::var_os("FLOTILLA_BENCH_OUT") {
        let dir = Path::new(&dir);
        let _ = std::fs::write(dir.join(format!("http_get_interleaved{suffix}")), one);
        let _ = std::fs::write(
            dir.join(format!("http_get_interleaved_blocks{suffix}")),
            blocks,
        );
    }
}

criterion_group!(benches, plugins, http);
criterion_main!(benches);

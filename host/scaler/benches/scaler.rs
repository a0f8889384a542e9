//! Scaler benchmarks: acquire+release throughput with 10,000 instances x 4 slots, the cost
//! of a reconcile tick at 10,000 instances, and the real-time latency from a new
//! reservation to the provider's `increase()` call.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_provider::fixed::Fixed;
use flotilla_provider::{Instance, InstanceState};
use flotilla_scaler::{
    AlwaysReady, Clock, Policy, PoolCore, PoolHandle, ScalerConfig, SystemClock,
};
use tokio::sync::mpsc;

const N: usize = 10_000;

fn big_pool() -> PoolCore {
    let cfg = ScalerConfig {
        capacity_per_instance: 4,
        max_instances: N as u32,
        ..ScalerConfig::default()
    };
    let policy = Policy::new(vec!["* * * * *".into()], "UTC", 0, 3_600_000, 0.0, 0, false)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let mut core = PoolCore::new(cfg, vec![policy], 0);
    let _ = core.plan(0);
    let list = (0..N)
        .map(|i| Instance {
            id: format!("i-{i}"),
            state: InstanceState::Running,
        })
        .collect::<Vec<_>>();
    core.on_update(0, Ok(list.into()));
    for _ in core.plan(1) {}
    for i in 0..N {
        core.on_ready(1, &format!("i-{i}"), Ok(()));
    }
    // Half the slots busy, so acquire works in a realistic index.
    for _ in 0..(N * 2) {
        let l = core.reserve(2).unwrap_or_else(|e| panic!("{e}"));
        core.acquire(2, l).unwrap_or_else(|e| panic!("{e}"));
    }
    core
}

fn core_benches(c: &mut Criterion) {
    let mut core = big_pool();
    let mut g = c.benchmark_group("scaler");
    g.bench_function("acquire_release_10k_x4", |b| {
        b.iter(|| {
            let l = core.reserve(3).unwrap_or_else(|e| panic!("{e}"));
            core.acquire(3, l).unwrap_or_else(|e| panic!("{e}"));
            core.release(3, l).unwrap_or_else(|e| panic!("{e}"));
        })
    });
    let mut now = 10_000;
    g.bench_function("reconcile_tick_10k", |b| {
        b.iter(|| {
            now += 1;
            core.plan(now)
        })
    });
    g.finish();
}

fn reservation_to_increase(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut g = c.benchmark_group("scaler");
    g.bench_function("reservation_to_increase", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let clock = Arc::new(SystemClock);
                let policy = Policy::new(vec!["* * * * *".into()], "UTC", 0, 60_000, 0.0, 0, false)
                    .unwrap_or_else(|e| panic!("{e:?}"));
                let cfg = ScalerConfig {
                    update_interval_ms: 3_600_000,
                    ..ScalerConfig::default()
                };
                let core = PoolCore::new(cfg, vec![policy], clock.now());
                let pool = PoolHandle::spawn(
                    "bench".into(),
                    core,
                    // A cloud that says when `increase` is called, and grants it.
                    Arc::new(Fixed::running(0).on_increase(move |delta| {
                        // The benchmark may have stopped listening; the call still succeeds.
                        let _ = tx.send(Instant::now());
                        delta
                    })),
                    clock,
                    Arc::new(AlwaysReady),
                    None,
                );
                // Wait until the first update has been applied.
                while pool.snapshot().health != flotilla_scaler::PoolHealth::Ready {
                    tokio::task::yield_now().await;
                }
                let start = Instant::now();
                pool.reserve().unwrap_or_else(|e| panic!("{e}"));
                let called = rx.recv().await.unwrap_or_else(|| panic!("no increase"));
                total += called.duration_since(start);
                pool.shutdown(Duration::ZERO, false).await;
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, core_benches, reservation_to_increase);
criterion_main!(benches);

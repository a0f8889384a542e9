//! The scaler under overload, where demand exceeds capacity and reservations pile up:
//!
//! - `live`: one hand-over in the live driver (a slot released, the oldest waiting acquire
//!   bound and answered, a new labelled reservation queued behind the others), with 1 and with
//!   10,000 reservations waiting. The ratio of the two medians is the figure: 1.0 means the
//!   cost of an event does not depend on how many wait.
//! - `simulate`: an overloaded trace (8 slots, a job every 12 s of 100-900 s, most of them
//!   timing out) of 20k, 100k and 1M jobs. Time per job must stay flat as the trace grows.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // bench code: a failed assumption is a failed run

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

use flotilla_provider::fixed::Fixed;
use flotilla_scaler::driver::AcquireError;
use flotilla_scaler::sim::{Job, SimCloud, SimOptions, simulate};
use flotilla_scaler::{
    AlwaysReady, Binding, Clock, Policy, PoolCore, PoolHandle, ScalerConfig, SystemClock,
};

type Acquiring = Pin<Box<dyn Future<Output = Result<Binding, AcquireError>> + Send>>;

/// A pool whose one slot is held, with `waiting` labelled reservations queued for it.
struct Relay {
    pool: Arc<PoolHandle>,
    /// The lease holding the slot.
    holder: u64,
    /// The queued acquires, oldest first, each polled once (so it is in the queue).
    queue: VecDeque<(u64, Acquiring)>,
    next_label: u64,
}

fn poll_once(fut: &mut Acquiring) -> Poll<Result<Binding, AcquireError>> {
    fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

impl Relay {
    fn new(rt: &tokio::runtime::Runtime, waiting: usize) -> Relay {
        let cfg = ScalerConfig {
            capacity_per_instance: 1,
            // Room for every reservation; the cloud grants no second machine.
            max_instances: waiting as u32 + 16,
            instance_acquire_timeout_ms: 3_600_000,
            ..ScalerConfig::default()
        };
        let policy = Policy::new(vec!["* * * * *".into()], "UTC", 0, 3_600_000, 0.0, 0, false)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let clock = Arc::new(SystemClock);
        let core = PoolCore::new(cfg, vec![policy], clock.now());
        let _guard = rt.enter();
        let pool = PoolHandle::spawn(
            "bench".into(),
            core,
            Arc::new(Fixed::running(1)),
            clock,
            Arc::new(AlwaysReady),
            None,
        );
        let holder = pool.reserve().unwrap();
        let binding = rt.block_on(pool.acquire(holder));
        assert!(binding.is_ok(), "{binding:?}");
        let mut relay = Relay {
            pool,
            holder,
            queue: VecDeque::new(),
            next_label: 0,
        };
        for _ in 0..waiting {
            relay.enqueue();
        }
        assert_eq!(relay.pool.waiting(), waiting);
        relay
    }

    /// A new labelled reservation (as the GitLab driver makes), queued for the slot.
    fn enqueue(&mut self) {
        self.next_label += 1;
        let labels = BTreeMap::from([("job".to_string(), self.next_label.to_string())]);
        let lease = self.pool.reserve_labelled(labels).unwrap();
        let pool = self.pool.clone();
        let mut fut: Acquiring = Box::pin(async move { pool.acquire(lease).await });
        assert!(poll_once(&mut fut).is_pending());
        self.queue.push_back((lease, fut));
    }

    /// The holder releases; the oldest waiter must be answered at once and becomes the
    /// holder; a new reservation takes its place at the back.
    fn hand_over(&mut self) {
        self.pool.release(self.holder).unwrap();
        let (lease, mut fut) = self.queue.pop_front().unwrap();
        match poll_once(&mut fut) {
            Poll::Ready(Ok(_)) => self.holder = lease,
            other => panic!("the oldest waiter was not served: {other:?}"),
        }
        self.enqueue();
    }
}

fn live(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("overload/live");
    g.measurement_time(Duration::from_secs(5));
    // Interleaved: both relays exist for the whole group, so machine noise hits both alike.
    let mut relays: Vec<(usize, Relay)> = [1, 10_000]
        .into_iter()
        .map(|w| (w, Relay::new(&rt, w)))
        .collect();
    for round in 0..2 {
        for (waiting, relay) in &mut relays {
            let _guard = rt.enter();
            g.bench_function(
                BenchmarkId::new(format!("hand_over_r{round}"), *waiting),
                |b| b.iter(|| relay.hand_over()),
            );
            assert_eq!(relay.pool.waiting(), *waiting);
        }
    }
    g.finish();
}

/// The generated overload trace: a job every 12 s on average, each 100-900 s long.
fn overload_trace(n: usize) -> Vec<Job> {
    let mut state = 7u64;
    let mut unit = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut t = 0.0f64;
    (0..n)
        .map(|_| {
            t += -12_000.0 * (1.0 - unit()).ln();
            Job {
                submit_at: t as u64,
                duration: 100_000 + (unit() * 800_000.0) as u64,
                tag: None,
            }
        })
        .collect()
}

fn simulated(c: &mut Criterion) {
    // The quick start's pool: 4 machines of 2 slots, 30 s acquire timeout, 2 idle slots.
    let cfg = ScalerConfig {
        capacity_per_instance: 2,
        max_instances: 4,
        instance_acquire_timeout_ms: 30_000,
        update_interval_ms: 30_000,
        ..ScalerConfig::default()
    };
    let policy = Policy::new(vec!["* * * * *".into()], "UTC", 2, 300_000, 0.0, 0, false)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let cloud = SimCloud::default();
    let opts = SimOptions::default();
    let mut g = c.benchmark_group("overload/simulate");
    g.sample_size(10);
    for n in [20_000, 100_000, 1_000_000] {
        let jobs = overload_trace(n);
        let (report, _) = simulate(&cfg, std::slice::from_ref(&policy), &cloud, &jobs, &opts);
        assert!(
            report.timed_out > report.jobs / 2,
            "the trace must overload the pool: {report:?}"
        );
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| simulate(&cfg, std::slice::from_ref(&policy), &cloud, &jobs, &opts))
        });
    }
    g.finish();
}

criterion_group!(benches, live, simulated);
criterion_main!(benches);

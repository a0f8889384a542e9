//! Readiness over SSH against real loopback machines (openssh-server) and a real dockerd:
//! one instance, twenty at once, and the cost an acquire pays on an already-ready instance.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // bench code

use std::collections::BTreeMap;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};

use flotilla_harness::ready::{connector_settings as settings, ready_pool};

use flotilla_connector::{Connector, PoolKey};
use flotilla_peers::dockerd::Dockerd;
use flotilla_peers::sshd::Sshd;
use flotilla_provider::fixed::Fixed;
use flotilla_scaler::{AlwaysReady, Readiness};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let keys = tempfile::tempdir().expect("key dir");
    let key = PoolKey::load_or_generate(keys.path(), "bench").expect("pool key");
    let docker = Dockerd::start();
    let machines: Vec<Sshd> = (0..20).map(|_| Sshd::start(key.public_openssh())).collect();
    let ports: std::collections::BTreeMap<String, u16> = machines
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.port))
        .collect();
    let ids: Vec<String> = ports.keys().cloned().collect();
    let all = Arc::new(Fixed::machines(ports));
    let mut group = c.benchmark_group("connector");
    group.sample_size(20);
    // A fresh Connector per iteration: every check is a new session (handshake, login,
    // ready command, Docker negotiate + ping + version).
    group.bench_function("ready_one", |b| {
        b.to_async(&rt).iter(|| async {
            let r = Connector::new(key.clone(), settings(&docker));
            r.check(all.as_ref(), &ids[0]).await.expect("ready");
        })
    });
    group.bench_function("ready_twenty_concurrently", |b| {
        b.to_async(&rt).iter(|| async {
            let r = Connector::new(key.clone(), settings(&docker));
            let checks = ids.iter().map(|id| r.check(all.as_ref(), id));
            for result in futures_util::future::join_all(checks).await {
                result.expect("ready");
            }
        })
    });
    // The periodic ping of 20 ready instances over their kept sessions: no handshake, one
    // Docker /_ping channel each.
    let kept = Connector::new(key.clone(), settings(&docker));
    rt.block_on(async {
        for id in &ids {
            kept.check(all.as_ref(), id).await.expect("ready");
        }
    });
    group.bench_function("ping_one_kept_session", |b| {
        b.to_async(&rt)
            .iter(|| async { kept.ping(all.as_ref(), &ids[0]).await.expect("alive") })
    });
    group.bench_function("ping_twenty_kept_sessions_concurrently", |b| {
        b.to_async(&rt).iter(|| async {
            let pings = ids.iter().map(|id| kept.ping(all.as_ref(), id));
            for result in futures_util::future::join_all(pings).await {
                result.expect("alive");
            }
        })
    });
    // An acquire on an instance that is already ready: the same pool with SSH readiness and
    // with none; the difference is what the connector adds to the acquire path.
    let one = Arc::new(Fixed::machines(BTreeMap::from([(
        "m0".to_string(),
        machines[0].port,
    )])));
    let ssh_pool = rt.block_on(ready_pool(
        one.clone(),
        Arc::new(Connector::new(key.clone(), settings(&docker))),
    ));
    let plain_pool = rt.block_on(ready_pool(one, Arc::new(AlwaysReady)));
    for (name, pool) in [
        ("acquire_release_ssh_ready", &ssh_pool),
        ("acquire_release_always_ready", &plain_pool),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let lease = pool.reserve().expect("reserve");
                pool.acquire(lease).await.expect("acquire");
                pool.release(lease).expect("release");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

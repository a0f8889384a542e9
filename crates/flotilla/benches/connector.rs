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
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};

use flotilla_connector::{Connector, ConnectorSettings, PoolKey};
use flotilla_scaler::{
    AlwaysReady, Clock, PoolCore, PoolHandle, PoolHealth, Readiness, ScalerConfig, SystemClock,
};
use flotilla_test_support::dockerd::Dockerd;
use flotilla_test_support::machines::Machines;
use flotilla_test_support::sshd::Sshd;

fn settings(docker: &Dockerd) -> ConnectorSettings {
    ConnectorSettings {
        username: None,
        use_external_address: false,
        ssh_key: None,
        ready_command: Some("true".into()),
        ready_timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(30),
        keepalive_interval: Duration::from_secs(15),
        known_hosts: None,
        docker_socket: Some(docker.socket().display().to_string()),
        ping_interval: None,
        docker_tls: None,
    }
}

async fn ready_pool(provider: Arc<Machines>, readiness: Arc<dyn Readiness>) -> Arc<PoolHandle> {
    let clock = Arc::new(SystemClock);
    let config = ScalerConfig {
        capacity_per_instance: 4,
        max_instances: 1,
        update_interval_ms: 60_000,
        ..ScalerConfig::default()
    };
    // Keep the one instance: four idle slots wanted at all times.
    let keep = flotilla_scaler::Policy::new(
        vec!["* * * * *".to_string()],
        "UTC",
        4,
        3_600_000,
        0.0,
        0,
        false,
    )
    .expect("policy");
    let core = PoolCore::new(config, vec![keep], clock.now());
    let pool = PoolHandle::spawn("bench".into(), core, provider, clock, readiness, None);
    while pool.snapshot().health != PoolHealth::Ready || pool.snapshot().slots.idle == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let keys = tempfile::tempdir().expect("key dir");
    let key = PoolKey::load_or_generate(keys.path(), "bench").expect("pool key");
    let docker = Dockerd::start();
    let machines: Vec<Sshd> = (0..20).map(|_| Sshd::start(key.public_openssh())).collect();
    let all = Arc::new(Machines(
        machines
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("m{i}"), m.port))
            .collect(),
    ));
    let ids: Vec<String> = all.0.keys().cloned().collect();
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
    // An acquire on an instance that is already ready: the same pool with SSH readiness and
    // with none; the difference is what the connector adds to the acquire path.
    let one = Arc::new(Machines(BTreeMap::from([(
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

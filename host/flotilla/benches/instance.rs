//! The GitLab driver's instance mode against a real sshd machine and the host's real API:
//! a job's `prepare` and first `run` on a ready machine, up to the end of a script whose
//! only output is its first byte (so the figure bounds "prepare to first byte" from above),
//! against a plain `ssh host true` by OpenSSH's own client to the same machine, the goal
//! being 1.2x or less. Criterion medians of each, then both interleaved one by one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // bench code

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

use flotilla::api::{AppState, router};
use flotilla::metrics::Metrics;
use flotilla::pools::{Pools, RunningPool};
use flotilla_connector::{Connector, ConnectorSettings, PoolKey};
use flotilla_gitlab::{ApiClient, DriverSettings, InstanceSettings, Job, MachineOs, Mode, Outcome};
use flotilla_harness::ready::ready_pool;
use flotilla_peers::sshd::Sshd;
use flotilla_provider::fixed::Fixed;

fn connector_settings() -> ConnectorSettings {
    ConnectorSettings {
        // The test machines' login is root: the operator's word, not the plugin's.
        username: Some("root".into()),
        port: None,
        use_external_address: false,
        ssh_key: None,
        ready_command: Some("true".into()),
        ready_timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(30),
        keepalive_interval: Duration::from_secs(15),
        known_hosts: None,
        docker_socket: None,
        ping_interval: None,
        docker_tls: None,
        allow_privileged: false,
        // The test machines are sshd daemons on loopback.
        targets: flotilla_connector::AllowedTargets::ranges(vec![
            "127.0.0.0/8".parse().expect("cidr"),
        ]),
    }
}

/// `ssh -i KEY -p PORT root@127.0.0.1 true` with OpenSSH's client, to its end.
fn ssh_true(key: &std::path::Path, port: u16) {
    let status = std::process::Command::new("ssh")
        .arg("-i")
        .arg(key)
        .args([
            "-p",
            &port.to_string(),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "root@127.0.0.1",
            "true",
        ])
        .status()
        .expect("ssh");
    assert!(status.success());
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let keys = tempfile::tempdir().expect("key dir");
    let key = PoolKey::load_or_generate(keys.path(), "bench").expect("pool key");
    let key_file = keys.path().join("bench/id_ed25519");
    assert!(key_file.is_file(), "the pool key at {}", key_file.display());
    let sshd = Sshd::start(key.public_openssh());
    let machines = Arc::new(Fixed::machines(BTreeMap::from([(
        "m0".to_string(),
        sshd.port,
    )])));
    let connector = Arc::new(Connector::new(key.clone(), connector_settings()));
    let api = rt.block_on(async {
        let pool = ready_pool(machines, connector.clone()).await;
        let metrics = Metrics::new().expect("metrics");
        let running = RunningPool {
            handle: pool,
            connector: Some(connector),
            metrics: metrics.pool("ci", "bench"),
            delete_on_shutdown: false,
            plugin_digest: "sha256:bench".into(),
            plugin: String::new(),
            exporter_ports: Vec::new(),
            group: "bench".into(),
            described: Default::default(),
            describing: None,
            fallback: None,
        };
        let state = Arc::new(AppState {
            sd_token: None,
            operators: Vec::new(),
            pools: Pools::running([("ci".to_string(), running)]),
            token: None,
            metrics,
            draining: AtomicBool::new(false),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(flotilla::serve::serve(
            listener,
            router(state),
            flotilla::serve::Limits::default(),
            None,
            None,
            std::future::pending(),
        ));
        ApiClient::new(&format!("http://{addr}"), None, "ci").expect("client")
    });
    let machine_dir = tempfile::tempdir().expect("machine dir");
    let settings = DriverSettings {
        acquire_timeout: Duration::from_secs(60),
        restart_window: Duration::from_secs(60),
        job_identity_from_variables: true,
        state_dir: None,
        deadline_grace: Duration::from_secs(3600),
        mode: Mode::Instance(
            InstanceSettings::new(
                MachineOs::Linux,
                None,
                Some(machine_dir.path().display().to_string()),
            )
            .expect("instance settings"),
        ),
    };
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("build_script");
    // One byte of output: the stage ends right after its first byte.
    std::fs::write(&script, "#!/usr/bin/env bash\nprintf .\n").expect("script");
    let n = AtomicU64::new(0);
    // prepare + run, measured; cleanup outside the measurement.
    let job_once = |i: u64| {
        let api = api.clone();
        let settings = settings.clone();
        let script = script.clone();
        async move {
            let env = HashMap::from([
                (
                    "CUSTOM_ENV_CI_JOB_ID".to_string(),
                    (1_000_000 + i).to_string(),
                ),
                ("CUSTOM_ENV_CI_PROJECT_ID".to_string(), "1".to_string()),
            ]);
            let job = Job::from_env(&env.into_iter().collect(), true).expect("job");
            let start = Instant::now();
            let prepared = flotilla_gitlab::prepare(&api, &job, &settings).await;
            let ran = flotilla_gitlab::run(
                &api,
                &job,
                &settings,
                &script,
                "build_script",
                std::future::pending(),
            )
            .await;
            let took = start.elapsed();
            assert_eq!((prepared, ran), (Outcome::Success, Outcome::Success));
            assert_eq!(
                flotilla_gitlab::cleanup(&api, &job, &settings).await,
                Outcome::Success
            );
            took
        }
    };
    let mut group = c.benchmark_group("instance");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(15));
    group.bench_function("ssh_host_true", |b| {
        b.iter(|| ssh_true(&key_file, sshd.port))
    });
    group.bench_function("prepare_to_first_byte", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let start = n.fetch_add(iters, Ordering::Relaxed);
            let job_once = &job_once;
            async move {
                let mut total = Duration::ZERO;
                for i in 0..iters {
                    total += job_once(start + i).await;
                }
                total
            }
        })
    });
    group.finish();
    // The two interleaved one by one: the machine's noise falls on both alike.
    let (mut ssh, mut driver) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        let start = Instant::now();
        ssh_true(&key_file, sshd.port);
        ssh.push(start.elapsed());
        let i = n.fetch_add(1, Ordering::Relaxed);
        driver.push(rt.block_on(job_once(i)));
    }
    ssh.sort();
    driver.sort();
    let (s, d) = (ssh[20], driver[20]);
    eprintln!(
        "\ninstance/interleaved x40 medians: ssh host true {s:?}, prepare to first byte {d:?}, ratio {:.2}x (goal 1.2x or less)",
        d.as_secs_f64() / s.as_secs_f64()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);

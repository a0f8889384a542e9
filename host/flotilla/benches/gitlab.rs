//! The GitLab driver's cost, against a real dockerd behind a real sshd machine and the host's
//! real API: one container lifecycle (create, start, exec a trivial script, remove) with
//! bollard straight on the engine's socket and through the lease's Docker handle (HTTP to the
//! API, then the SSH channel), interleaved; a job's `prepare` + first `run` on an idle,
//! ready instance, up to the script's first output; and one `run` stage as the driver runs it
//! (detached, its log followed, so it rides through a host restart) against the attached exec
//! it used before, interleaved in the same run.
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

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, RemoveContainerOptions,
};
use bollard::{API_DEFAULT_VERSION, BollardRequest, Docker};
use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;

use flotilla::api::{AppState, router};
use flotilla::metrics::Metrics;
use flotilla::pools::{Pools, RunningPool};
use flotilla_connector::{Connector, PoolKey};
use flotilla_gitlab::{ApiClient, DriverSettings, Job, PullPolicy};
use flotilla_harness::ready::{connector_settings as settings, ready_pool};
use flotilla_peers::dockerd::{Dockerd, busybox_rootfs_tar};
use flotilla_peers::sshd::Sshd;
use flotilla_provider::fixed::Fixed;

const IMAGE: &str = "flotilla-bench/busybox:1";
const HELPER_IMAGE: &str = "flotilla-bench/helper:1";

/// bollard on the engine's own unix socket: the baseline.
fn direct(socket: std::path::PathBuf) -> Docker {
    let transport = move |request: BollardRequest| {
        let socket = socket.clone();
        async move {
            let (mut parts, body) = request.into_parts();
            if let Some(path) = parts.uri.path_and_query().cloned() {
                parts.uri = path.into();
            }
            parts
                .headers
                .insert(http::header::HOST, http::HeaderValue::from_static("docker"));
            let stream = tokio::net::UnixStream::connect(&socket).await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = connection.with_upgrades().await;
            });
            Ok::<_, bollard::errors::Error>(
                sender
                    .send_request(http::Request::from_parts(parts, body))
                    .await?,
            )
        }
    };
    Docker::connect_with_custom_transport(
        transport,
        Some("http://docker"),
        120,
        API_DEFAULT_VERSION,
    )
    .expect("a client")
}

/// create, start, exec `true` (attached, to its end), remove.
async fn lifecycle(docker: &Docker, n: u64) {
    let name = format!("flotilla-bench-{n}");
    let body = ContainerCreateBody {
        image: Some(IMAGE.into()),
        cmd: Some(vec!["sleep".into(), "60".into()]),
        host_config: Some(bollard::models::HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            body,
        )
        .await
        .expect("create");
    docker
        .start_container(
            &name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .expect("start");
    assert_eq!(
        exec_to_end(docker, &name, vec!["sh", "-c", ":"]).await,
        Some(0)
    );
    docker
        .remove_container(
            &name,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove");
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let keys = tempfile::tempdir().expect("key dir");
    let key = PoolKey::load_or_generate(keys.path(), "bench").expect("pool key");
    let docker = Dockerd::start();
    let sshd = Sshd::start(key.public_openssh());
    let machines = Arc::new(Fixed::machines(BTreeMap::from([(
        "m0".to_string(),
        sshd.port,
    )])));
    let connector = Arc::new(Connector::new(key.clone(), settings(&docker)));
    let (api, engine) = rt.block_on(async {
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
        let engine = direct(docker.socket());
        let helper =
            flotilla_peers::helper_image::rootfs_tar(&flotilla_peers::helper_image::binary(), None);
        for (tar, repo) in [
            (busybox_rootfs_tar(), "flotilla-bench/busybox"),
            (helper, "flotilla-bench/helper"),
        ] {
            let mut import = engine.create_image(
                Some(CreateImageOptions {
                    from_src: Some("-".into()),
                    repo: Some(repo.into()),
                    tag: Some("1".into()),
                    ..Default::default()
                }),
                Some(bollard::body_full(tar.into())),
                None,
            );
            while let Some(step) = import.next().await {
                step.expect("import");
            }
        }
        let api = ApiClient::new(&format!("http://{addr}"), None, "ci").expect("client");
        (api, engine)
    });
    let n = AtomicU64::new(0);
    let mut group = c.benchmark_group("gitlab");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(20));
    // One lease held for the handle; the same lifecycle on both paths, alternating.
    let lease = rt.block_on(async {
        let l = api.reserve(&BTreeMap::new(), None).await.expect("reserve");
        api.acquire(l.id, Duration::from_secs(30))
            .await
            .expect("acquire");
        l.id
    });
    let handle = flotilla_gitlab::docker::client::for_lease(&api, lease, 120).expect("handle");
    group.bench_function("lifecycle_direct", |b| {
        b.to_async(&rt)
            .iter(|| lifecycle(&engine, n.fetch_add(1, Ordering::Relaxed)))
    });
    group.bench_function("lifecycle_through_handle", |b| {
        b.to_async(&rt)
            .iter(|| lifecycle(&handle, n.fetch_add(1, Ordering::Relaxed)))
    });
    rt.block_on(api.release(lease, None)).expect("release");

    // prepare + the first run stage of a job on an idle, ready instance; cleanup is outside
    // the measurement.
    let settings = DriverSettings {
        acquire_timeout: Duration::from_secs(60),
        restart_window: Duration::from_secs(60),
        job_identity_from_variables: true,
        state_dir: None,
        deadline_grace: Duration::from_secs(3600),
        mode: flotilla_gitlab::Mode::Docker(Box::new(flotilla_gitlab::DockerSettings {
            builds_dir: "/builds".into(),
            cache_dir: "/cache".into(),
            default_image: None,
            pull_policy: PullPolicy::IfNotPresent,
            limits: flotilla_gitlab::JobLimits::default(),
            cache: flotilla_gitlab::CacheBounds {
                max_age: Duration::from_secs(3600),
                max_volumes: 64,
            },
            helper_image: Some(HELPER_IMAGE.into()),
            helper_registry_auth: None,
            options: flotilla_gitlab::ContainerOptions::default(),
            allowed_images: Vec::new(),
            allowed_services: Vec::new(),
        })),
    };
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("build_script");
    std::fs::write(&script, "echo first-byte\n").expect("script");
    let mut bare = settings.clone();
    if let flotilla_gitlab::Mode::Docker(own) = &mut bare.mode {
        own.helper_image = Some("none".into());
    }
    for (name, settings) in [
        ("prepare_to_first_output", &settings),
        ("prepare_to_first_output_no_helper", &bare),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let n = n.fetch_add(iters, Ordering::Relaxed);
                let (api, settings, script) = (api.clone(), settings.clone(), script.clone());
                async move {
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        total +=
                            job_to_first_output(&api, &settings, &script, 1_000_000 + n + i).await;
                    }
                    total
                }
            })
        });
    }
    // The same two, interleaved one by one (the machine's noise falls on both alike).
    let (mut with_helper, mut without) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for i in 0..15 {
            let id = 2_000_000 + 2 * i;
            with_helper.push(job_to_first_output(&api, &settings, &script, id).await);
            without.push(job_to_first_output(&api, &bare, &script, id + 1).await);
        }
    });
    with_helper.sort();
    without.sort();
    let (h, w) = (with_helper[7], without[7]);
    eprintln!(
        "gitlab/prepare_to_first_output interleaved x15: with the helper {h:?}, without {w:?}, +{:?}",
        h.saturating_sub(w)
    );

    // One stage on a prepared job: the driver's detached run against the attached exec of
    // the same script (upload, exec streamed to its end, exit code), alternating.
    let job = Job::from_env(
        &HashMap::from([
            ("CUSTOM_ENV_CI_JOB_ID".to_string(), "999999".to_string()),
            ("CUSTOM_ENV_CI_PROJECT_ID".to_string(), "1".to_string()),
            ("CUSTOM_ENV_CI_JOB_IMAGE".to_string(), IMAGE.to_string()),
        ])
        .into_iter()
        .collect(),
        true,
    )
    .expect("job");
    let prepared = rt.block_on(flotilla_gitlab::prepare(&api, &job, &settings));
    assert_eq!(prepared, flotilla_gitlab::Outcome::Success);
    let stage_lease = rt
        .block_on(api.lease_by_label("gitlab-job", "999999"))
        .expect("lookup")
        .expect("the job's lease")
        .id;
    let stage_handle =
        flotilla_gitlab::docker::client::for_lease(&api, stage_lease, 120).expect("handle");
    let text = std::fs::read(&script).expect("script");
    // A predefined stage (routed to the helper) against the same script through one attached
    // exec in the helper container, interleaved.
    let (mut direct_helper, mut routed) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for _ in 0..30 {
            let start = Instant::now();
            attached_stage(&stage_handle, &job.helper_container(), &text).await;
            direct_helper.push(start.elapsed());
            let start = Instant::now();
            let ran = flotilla_gitlab::run(
                &api,
                &job,
                &settings,
                &script,
                "restore_cache",
                std::future::pending(),
            )
            .await;
            assert_eq!(ran, flotilla_gitlab::Outcome::Success);
            routed.push(start.elapsed());
        }
    });
    direct_helper.sort();
    routed.sort();
    let (d, r) = (direct_helper[15], routed[15]);
    eprintln!(
        "gitlab/helper_stage interleaved x30: attached exec in the helper {d:?}, the driver's predefined stage {r:?}, ratio {:.2}x",
        r.as_secs_f64() / d.as_secs_f64()
    );
    for (name, detached) in [
        ("stage_attached_exec", false),
        ("stage_detached_followed", true),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                if detached {
                    let ran = flotilla_gitlab::run(
                        &api,
                        &job,
                        &settings,
                        &script,
                        "build_script",
                        std::future::pending(),
                    )
                    .await;
                    assert_eq!(ran, flotilla_gitlab::Outcome::Success);
                } else {
                    attached_stage(&stage_handle, &job.container(), &text).await;
                }
            })
        });
    }
    // The same two, interleaved one by one (the machine's noise falls on both alike).
    let (mut attached, mut followed) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for _ in 0..30 {
            let start = Instant::now();
            attached_stage(&stage_handle, &job.container(), &text).await;
            attached.push(start.elapsed());
            let start = Instant::now();
            let ran = flotilla_gitlab::run(
                &api,
                &job,
                &settings,
                &script,
                "build_script",
                std::future::pending(),
            )
            .await;
            assert_eq!(ran, flotilla_gitlab::Outcome::Success);
            followed.push(start.elapsed());
        }
    });
    attached.sort();
    followed.sort();
    let (a, f) = (attached[15], followed[15]);
    eprintln!(
        "gitlab/stage interleaved x30: attached exec {a:?}, detached and followed {f:?}, ratio {:.2}x",
        f.as_secs_f64() / a.as_secs_f64()
    );
    rt.block_on(flotilla_gitlab::cleanup(&api, &job, &settings));
    group.finish();
    checkout_reuse(&rt, &api, &settings);
}

/// `get_sources` of a job on a 50 MB repository, as the runner writes it, in the helper:
/// `GIT_STRATEGY=clone` (a fresh checkout) against `fetch` (the worktree the project's last
/// job on the slot left, in its kept builds volume), interleaved, five each.
fn checkout_reuse(rt: &tokio::runtime::Runtime, api: &ApiClient, settings: &DriverSettings) {
    use flotilla_peers::gitlab::{GitLab, Options, WorkTree};
    use flotilla_peers::runner_scripts::{self, GitStrategy, JobSpec};
    let Some(ip) = flotilla_peers::netaddr::peer_ip() else {
        eprintln!("gitlab/checkout: skipped (no address containers reach)");
        return;
    };
    let gitlab = rt.block_on(GitLab::start(ip, Options::default()));
    let work = WorkTree::new();
    // Incompressible, as a repository of binaries and vendored archives is.
    let mut data = vec![0u8; 50 << 20];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut data).expect("random");
    work.write("blob.bin", &data);
    let sha = work.commit("50 MB");
    gitlab.publish("group/big", &work);
    let dir = tempfile::tempdir().expect("dir");
    let mut times: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for round in 0..6 {
        for (name, strategy) in [("clone", GitStrategy::Clone), ("fetch", GitStrategy::Fetch)] {
            let token = gitlab.job("group/big");
            let mut spec = JobSpec::new(
                &gitlab.url,
                7,
                "group/big",
                token.id,
                &token.token,
                &sha,
                "main",
            );
            spec.git_strategy = strategy;
            let env = HashMap::from([
                ("CUSTOM_ENV_CI_JOB_ID".to_string(), token.id.to_string()),
                ("CUSTOM_ENV_CI_PROJECT_ID".to_string(), "7".to_string()),
                ("CUSTOM_ENV_CI_JOB_IMAGE".to_string(), IMAGE.to_string()),
            ]);
            let job = Job::from_env(&env.into_iter().collect(), true).expect("job");
            let script = dir.path().join("get_sources");
            std::fs::write(&script, runner_scripts::script(&spec, "get_sources")).expect("script");
            let took = rt.block_on(async {
                let prepared = flotilla_gitlab::prepare(api, &job, settings).await;
                assert_eq!(prepared, flotilla_gitlab::Outcome::Success);
                let start = Instant::now();
                let ran = flotilla_gitlab::run(
                    api,
                    &job,
                    settings,
                    &script,
                    "get_sources",
                    std::future::pending(),
                )
                .await;
                let took = start.elapsed();
                assert_eq!(ran, flotilla_gitlab::Outcome::Success);
                flotilla_gitlab::cleanup(api, &job, settings).await;
                took
            });
            // The first round warms the kept worktree up for `fetch`.
            if round > 0 {
                times.entry(name).or_default().push(took);
            }
        }
    }
    let median = |name: &str| {
        let mut t = times.get(name).cloned().unwrap_or_default();
        t.sort();
        t.get(t.len() / 2).copied().unwrap_or_default()
    };
    let (clone, fetch) = (median("clone"), median("fetch"));
    eprintln!(
        "gitlab/checkout 50 MB interleaved x5: clone {clone:?}, fetch {fetch:?}, fetch/clone {:.2}x",
        fetch.as_secs_f64() / clone.as_secs_f64()
    );
}

/// One job's `prepare` and first `run` on an idle, ready instance, to the end of the script's
/// first output; its cleanup is not measured.
async fn job_to_first_output(
    api: &ApiClient,
    settings: &DriverSettings,
    script: &std::path::Path,
    id: u64,
) -> Duration {
    let env = HashMap::from([
        ("CUSTOM_ENV_CI_JOB_ID".to_string(), id.to_string()),
        ("CUSTOM_ENV_CI_PROJECT_ID".to_string(), "1".to_string()),
        ("CUSTOM_ENV_CI_JOB_IMAGE".to_string(), IMAGE.to_string()),
    ]);
    let job = Job::from_env(&env.into_iter().collect(), true).expect("job");
    let start = Instant::now();
    let prepared = flotilla_gitlab::prepare(api, &job, settings).await;
    let ran = flotilla_gitlab::run(
        api,
        &job,
        settings,
        script,
        "build_script",
        std::future::pending(),
    )
    .await;
    let took = start.elapsed();
    assert_eq!(
        (prepared, ran),
        (
            flotilla_gitlab::Outcome::Success,
            flotilla_gitlab::Outcome::Success
        )
    );
    flotilla_gitlab::cleanup(api, &job, settings).await;
    took
}

/// Runs `cmd` in `container`, attached to its end; its exit code.
async fn exec_to_end(docker: &Docker, container: &str, cmd: Vec<&str>) -> Option<i64> {
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(cmd),
                ..Default::default()
            },
        )
        .await
        .expect("exec");
    if let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&exec.id, Some(StartExecOptions::default()))
        .await
        .expect("start exec")
    {
        while output.next().await.is_some() {}
    }
    docker
        .inspect_exec(&exec.id)
        .await
        .expect("inspect")
        .exit_code
}

/// The stage as the driver ran it before it rode through restarts: the script uploaded, then
/// one exec attached to its end, then its exit code.
async fn attached_stage(docker: &Docker, container: &str, text: &[u8]) {
    docker
        .upload_to_container(
            container,
            Some(bollard::query_parameters::UploadToContainerOptions {
                path: "/tmp".into(),
                ..Default::default()
            }),
            bollard::body_full(
                flotilla_gitlab::tar::one_file("flotilla-bench.sh", 0o700, text).into(),
            ),
        )
        .await
        .expect("upload");
    assert_eq!(
        exec_to_end(docker, container, vec!["sh", "/tmp/flotilla-bench.sh"]).await,
        Some(0)
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);

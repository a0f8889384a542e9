//! The connector against real machines: Debian `openssh-server` daemons on loopback, each with
//! its own host key and the pool's public key in its authorized_keys (as a plugin would place
//! it). Readiness is SSH login with the pool's key, a trusted host key, and the ready command.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_connector::{Connector, ConnectorSettings, DockerTls, DockerTlsFiles, PoolKey};
use flotilla_harness::LogCapture;
use flotilla_harness::poll;
use flotilla_peers::dockerd::{DockerPki, Dockerd};
use flotilla_peers::sshd::Sshd;
use flotilla_provider::fixed::Fixed;
use flotilla_scaler::{PoolCore, PoolHandle, Readiness, ScalerConfig, SystemClock};

fn settings(ready_command: Option<String>, ready_timeout: Duration) -> ConnectorSettings {
    ConnectorSettings {
        // The test machines' login is root: the operator's word, not the plugin's.
        username: Some("root".into()),
        port: None,
        use_external_address: false,
        ssh_key: None,
        ready_command,
        ready_timeout,
        connect_timeout: Duration::from_secs(10),
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

struct Pool {
    _keys: tempfile::TempDir,
    key: PoolKey,
}

fn pool_key() -> Pool {
    let keys = tempfile::tempdir().expect("key dir");
    let key = PoolKey::load_or_generate(keys.path(), "p").expect("the pool key");
    Pool { _keys: keys, key }
}

fn one_machine(sshd: &Sshd) -> Fixed {
    Fixed::machines(BTreeMap::from([("m1".to_string(), sshd.port)]))
}

#[tokio::test]
async fn an_instance_is_ready_only_after_its_ready_command_finished() {
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let marker = sshd.file("ready");
    let command = format!("sleep 2 && touch {}", marker.display());
    let readiness = Arc::new(Connector::new(
        pool.key.clone(),
        settings(Some(command), Duration::from_secs(30)),
    ));
    let handle = one_slot_pool(Arc::new(one_machine(&sshd)), readiness);
    let start = Instant::now();
    let lease = handle.reserve().expect("reserve");
    let binding = handle.acquire(lease).await.expect("acquire");
    assert_eq!(binding.instance, "m1");
    assert!(marker.exists(), "ready before the ready command finished");
    assert!(start.elapsed() >= Duration::from_secs(2));
}

/// A pool of one slot on one machine, updated every 200 ms, whose acquires wait up to 30 s.
fn one_slot_pool(
    provider: Arc<dyn flotilla_provider::Provider>,
    readiness: Arc<Connector>,
) -> Arc<PoolHandle> {
    let clock = Arc::new(SystemClock);
    let config = ScalerConfig {
        capacity_per_instance: 1,
        max_instances: 1,
        update_interval_ms: 200,
        instance_acquire_timeout_ms: 30_000,
        ..ScalerConfig::default()
    };
    let core = PoolCore::new(
        config,
        Vec::new(),
        flotilla_scaler::Clock::now(clock.as_ref()),
    );
    PoolHandle::spawn("p".into(), core, provider, clock, readiness, None)
}

/// Loopback machines that count the plugin's `connect-info` calls.
struct Counting(Fixed, std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl flotilla_provider::Provider for Counting {
    async fn init(
        &self,
        settings: &str,
    ) -> Result<flotilla_provider::ProviderInfo, flotilla_provider::CallError> {
        self.0.init(settings).await
    }
    async fn update(&self) -> Result<flotilla_provider::Listing, flotilla_provider::CallError> {
        self.0.update().await
    }
    async fn increase(&self, n: u32) -> Result<u32, flotilla_provider::CallError> {
        self.0.increase(n).await
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, flotilla_provider::CallError> {
        self.0.decrease(ids).await
    }
    async fn connect_info(
        &self,
        id: &str,
    ) -> Result<flotilla_provider::Connection, flotilla_provider::CallError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.connect_info(id).await
    }
    async fn heartbeat(&self, id: &str) -> Result<(), flotilla_provider::CallError> {
        self.0.heartbeat(id).await
    }
    async fn shutdown(&self) -> Result<(), flotilla_provider::CallError> {
        self.0.shutdown().await
    }
    fn health(&self) -> flotilla_provider::ProviderHealth {
        self.0.health()
    }
}

/// A machine that is not ready yet is checked again and again; the plugin is asked how to
/// reach it once, not at every try (each answer is a cloud request against the plugin's
/// egress budget).
#[tokio::test]
async fn a_booting_machine_is_tried_again_without_asking_the_plugin_again() {
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let (tries, marker) = (sshd.file("tries"), sshd.file("booted"));
    let command = format!(
        "echo try >> {}; test -f {}",
        tries.display(),
        marker.display()
    );
    let readiness = Arc::new(Connector::new(
        pool.key.clone(),
        settings(Some(command), Duration::from_secs(30)),
    ));
    let provider = Arc::new(Counting(one_machine(&sshd), Default::default()));
    let handle = one_slot_pool(provider.clone(), readiness);
    poll::until_true(
        "the ready command to fail twice",
        Duration::from_secs(20),
        || std::fs::read_to_string(&tries).is_ok_and(|t| t.lines().count() >= 2),
        || format!("{:?}", handle.snapshot()),
    )
    .await;
    std::fs::write(&marker, "").expect("booted");
    let lease = handle.reserve().expect("reserve");
    let binding = handle.acquire(lease).await.expect("acquire");
    assert_eq!(binding.instance, "m1");
    assert_eq!(provider.1.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_machine_that_refuses_the_pool_key_is_not_ready() {
    let pool = pool_key();
    let other = pool_key();
    let sshd = Sshd::start(other.key.public_openssh());
    let readiness = Connector::new(pool.key.clone(), settings(None, Duration::from_secs(5)));
    let err = readiness
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("a machine without the pool's key is not ready");
    assert!(err.message.contains("refused the pool's key"), "{err}");
    assert_eq!(err.cause, "ssh-auth");
}

#[tokio::test]
async fn a_ready_command_that_exits_1_is_reported_with_its_status() {
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let readiness = Connector::new(
        pool.key.clone(),
        settings(
            Some("echo not yet >&2; exit 1".into()),
            Duration::from_secs(10),
        ),
    );
    let err = readiness
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("exit 1 is not ready");
    assert!(
        err.message.contains("exited 1") && err.message.contains("not yet"),
        "{err}"
    );
    assert_eq!(err.cause, "ready-command");
}

#[tokio::test]
async fn a_ready_command_that_hangs_past_ready_timeout_is_not_ready() {
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let readiness = Connector::new(
        pool.key.clone(),
        settings(Some("sleep 60".into()), Duration::from_secs(1)),
    );
    let start = Instant::now();
    let err = readiness
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("a hanging command is not ready");
    assert!(err.message.contains("did not finish within"), "{err}");
    assert_eq!(err.cause, "ready-command");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_changed_host_key_is_refused() {
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let machines = one_machine(&sshd);
    let readiness = Connector::new(pool.key.clone(), settings(None, Duration::from_secs(5)));
    readiness
        .check(&machines, "m1")
        .await
        .expect("first contact pins the key");
    sshd.new_host_key();
    sshd.restart();
    // The kept session died with the daemon; the next check connects again.
    let err = poll::until(
        "the old session to close",
        Duration::from_secs(10),
        || async {
            match readiness.check(&machines, "m1").await {
                Err(e) => Ok(e),
                Ok(()) => Err("the check still passes on the old session"),
            }
        },
    )
    .await;
    assert!(err.message.contains("host key changed"), "{err}");
    assert_eq!(err.cause, "host-key");
}

/// The plugin points an instance id it reported before at another machine, after a restart
/// of the host: the pin kept in the state directory refuses the impostor, and the ready
/// command (standing for a job's script) never runs there. Pins kept in memory only would
/// trust the impostor's key as a first contact.
#[tokio::test]
async fn a_pin_kept_in_the_state_directory_refuses_an_impostor_after_a_restart() {
    let pool = pool_key();
    let genuine = Sshd::start(pool.key.public_openssh());
    let impostor = Sshd::start(pool.key.public_openssh());
    let state = tempfile::tempdir().expect("state dir");
    let pins = state.path().join("p.json");
    let first = Connector::new(pool.key.clone(), settings(None, Duration::from_secs(5)))
        .with_pins_file(&pins)
        .expect("no pins yet");
    first
        .check(&one_machine(&genuine), "m1")
        .await
        .expect("first contact pins the key");
    drop(first);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&pins).expect("pins kept").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the pins file is the host's only");

    let reached = impostor.file("reached");
    let touch = format!("touch {}", reached.display());
    let restarted = Connector::new(
        pool.key.clone(),
        settings(Some(touch), Duration::from_secs(5)),
    )
    .with_pins_file(&pins)
    .expect("the kept pins");
    let err = restarted
        .check(&one_machine(&impostor), "m1")
        .await
        .expect_err("another machine's key for a pinned id");
    assert!(err.message.contains("host key changed"), "{err}");
    assert_eq!(err.cause, "host-key");
    assert!(!reached.exists(), "a command ran on the impostor");

    // A file that is not pins is refused, not read as "no pins".
    std::fs::write(&pins, "garbage").expect("spoil");
    let refused = Connector::new(pool.key.clone(), settings(None, Duration::from_secs(5)))
        .with_pins_file(&pins)
        .expect_err("unreadable pins");
    assert!(refused.contains("not a host-key pin file"), "{refused}");
}

/// A plugin's `connect-info` is its word: by default it may not send the host to loopback
/// (nor link-local, where the clouds' metadata services are), and it may not choose `root`.
/// Nothing runs on the machine in either case.
#[tokio::test]
async fn a_plugin_may_not_point_the_host_at_loopback_or_choose_root_by_itself() {
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let reached = sshd.file("reached");
    let touch = format!("touch {}", reached.display());
    let mut by_default = settings(Some(touch.clone()), Duration::from_secs(5));
    by_default.targets = flotilla_connector::AllowedTargets::default();
    let err = Connector::new(pool.key.clone(), by_default)
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("loopback refused by default");
    assert!(
        err.message.contains("127.0.0.1 is a loopback address")
            && err.message.contains("allowed_ranges"),
        "{err}"
    );
    assert_eq!(err.cause, "connect-info");

    let mut elsewhere = settings(Some(touch.clone()), Duration::from_secs(5));
    elsewhere.targets =
        flotilla_connector::AllowedTargets::ranges(vec!["10.0.0.0/8".parse().expect("cidr")]);
    let err = Connector::new(pool.key.clone(), elsewhere)
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("outside the ranges");
    assert!(
        err.message
            .contains("outside [pool.connector] allowed_ranges"),
        "{err}"
    );

    let mut plugin_user = settings(Some(touch), Duration::from_secs(5));
    plugin_user.username = None;
    let err = Connector::new(pool.key.clone(), plugin_user)
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("the plugin chose root");
    assert!(err.message.contains("may not pick root"), "{err}");
    assert!(!reached.exists(), "a command ran on a refused target");
}

#[tokio::test(flavor = "current_thread")]
async fn the_private_key_appears_in_no_log_line_or_error() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let keys = tempfile::tempdir().expect("key dir");
    let key = PoolKey::load_or_generate(keys.path(), "p").expect("the pool key");
    let pem = std::fs::read_to_string(keys.path().join("p/id_ed25519")).expect("read the key");
    let sshd = Sshd::start("");
    let readiness = Connector::new(key.clone(), settings(None, Duration::from_secs(5)));
    let err = readiness
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("refused");
    let text = format!("{err}\n{readiness:?}\n{key:?}\n{}", logs.text());
    for line in pem.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!text.contains(line), "a line of the private key leaked");
    }
}

/// Docker tests start their own dockerd; one at a time, so two engines never race for the
/// machine's cgroups.
static DOCKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn an_instance_is_ready_once_its_docker_engine_answers_through_the_ssh_session() {
    let _one = DOCKER.lock().await;
    let docker = Dockerd::start();
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let mut s = settings(None, Duration::from_secs(5));
    s.docker_socket = Some(docker.socket().display().to_string());
    let logs = LogCapture::default();
    let readiness = Connector::new(pool.key.clone(), s);
    let checked = {
        let _guard = logs.install();
        readiness.check(&one_machine(&sshd), "m1").await
    };
    checked.unwrap_or_else(|e| panic!("{e}\n{}", docker.log()));
    assert!(
        logs.text().contains("Docker Engine answers"),
        "{}",
        logs.text()
    );
}

#[tokio::test]
async fn an_instance_whose_docker_engine_is_down_is_not_ready() {
    let _one = DOCKER.lock().await;
    let docker = Dockerd::start();
    let socket = docker.socket().display().to_string();
    drop(docker); // the engine stops; its socket goes with it
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let mut s = settings(None, Duration::from_secs(5));
    s.docker_socket = Some(socket);
    let readiness = Connector::new(pool.key.clone(), s);
    let err = readiness
        .check(&one_machine(&sshd), "m1")
        .await
        .expect_err("no Docker Engine, not ready");
    assert!(err.message.contains("Docker Engine"), "{err}");
    assert_eq!(err.cause, "docker");
}

#[tokio::test]
async fn a_machine_that_dies_after_it_was_ready_is_found_by_the_ping_before_the_next_acquire() {
    let _one = DOCKER.lock().await;
    let docker = Dockerd::start();
    let pool = pool_key();
    let doomed = Sshd::start(pool.key.public_openssh());
    let healthy = Sshd::start(pool.key.public_openssh());
    let machines = Fixed::machines(BTreeMap::from([
        ("m1".to_string(), doomed.port),
        ("m2".to_string(), healthy.port),
    ]));
    let mut s = settings(None, Duration::from_secs(5));
    s.docker_socket = Some(docker.socket().display().to_string());
    s.ping_interval = Some(Duration::from_millis(300));
    s.connect_timeout = Duration::from_secs(2);
    let readiness = Arc::new(Connector::new(pool.key.clone(), s));
    let clock = Arc::new(SystemClock);
    let config = ScalerConfig {
        capacity_per_instance: 1,
        max_instances: 2,
        update_interval_ms: 60_000,
        instance_acquire_timeout_ms: 1_500,
        ..ScalerConfig::default()
    };
    let keep_both =
        flotilla_scaler::Policy::new(vec!["* * * * *".into()], "UTC", 2, 3_600_000, 0.0, 0, false)
            .expect("a policy");
    let now = flotilla_scaler::Clock::now(clock.as_ref());
    let core = PoolCore::new(config, vec![keep_both], now);
    let handle = PoolHandle::spawn("p".into(), core, Arc::new(machines), clock, readiness, None);
    let ready = |h: &PoolHandle| h.with_core(|c| c.count_in(flotilla_scaler::InstState::Ready));
    poll::until_true(
        "both machines to be ready",
        Duration::from_secs(20),
        || ready(&handle) >= 2,
        || docker.log(),
    )
    .await;
    doomed.stop();
    // The ping (every 300 ms, a 2 s connect timeout) takes the dead machine out of service.
    let m1_state = || {
        handle
            .with_core(|c| c.instances())
            .into_iter()
            .find(|v| v.id == "m1")
            .map(|v| v.state)
    };
    poll::until_true(
        "the ping to take m1 out of service",
        Duration::from_secs(6),
        || m1_state().is_some_and(|s| s != flotilla_scaler::InstState::Ready),
        || format!("m1 is {:?}", m1_state()),
    )
    .await;
    let first = handle.reserve().expect("reserve");
    let binding = handle.acquire(first).await.expect("the healthy machine");
    assert_eq!(binding.instance, "m2");
    let second = handle.reserve().expect("reserve");
    let err = handle
        .acquire(second)
        .await
        .expect_err("the dead machine must not be given out");
    assert!(
        err.to_string().contains("no instance became ready"),
        "{err}"
    );
    let views = handle.with_core(|c| c.instances());
    let m1 = views.iter().find(|v| v.id == "m1").expect("m1 is known");
    // The ping took it out of service; the checks after it failed and it is being replaced.
    assert_ne!(m1.state, flotilla_scaler::InstState::Ready, "{m1:?}");
    assert!(m1.failures >= 3, "{m1:?}");
}

/// Request paths and headers, in arrival order.
type Seen = Arc<parking_lot::Mutex<Vec<(String, Vec<(String, String)>)>>>;

/// A stand-in engine on a unix socket that answers like Docker and records each request head.
fn recording_engine(path: &std::path::Path) -> Seen {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    flotilla_peers::serve::serve_http_unix(
        path,
        move |req: http::Request<hyper::body::Incoming>| {
            let log = log.clone();
            async move {
                let path = req.uri().path().to_string();
                log.lock()
                    .push((path.clone(), flotilla_peers::serve::headers(&req)));
                let body = if path.ends_with("/version") {
                    r#"{"ApiVersion":"1.43","Version":"stand-in"}"#
                } else {
                    "OK"
                };
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(body.as_bytes()),
                )))
            }
        },
    );
    seen
}

#[tokio::test]
async fn the_callers_token_is_not_forwarded_to_the_instances_engine() {
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let socket = sshd.file("engine.sock");
    let seen = recording_engine(&socket);
    let mut s = settings(None, Duration::from_secs(5));
    s.docker_socket = Some(socket.display().to_string());
    let readiness = Connector::new(pool.key.clone(), s);
    readiness
        .check(&one_machine(&sshd), "m1")
        .await
        .expect("ready against the stand-in engine");
    let request = http::Request::get("/containers/json?all=1")
        .header("authorization", "Bearer api-token-must-stay-0451")
        .header("cookie", "session=also-stays")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("a request");
    let machines = one_machine(&sshd);
    let response = readiness
        .forward_docker(&machines, "m1", 1, request)
        .await
        .expect("forwarded");
    assert_eq!(response.status(), 200);
    let heads = seen.lock().clone();
    let (_, headers) = heads
        .iter()
        .find(|(p, _)| p == "/containers/json")
        .unwrap_or_else(|| panic!("the engine never saw the request: {heads:?}"));
    let text = format!("{headers:?}");
    assert!(!text.contains("api-token-must-stay"), "{text}");
    assert!(!text.contains("also-stays"), "{text}");
    // A lost session is opened again (after connect-info) for the next request.
    sshd.restart();
    // The old session may look open until opening its channel fails.
    let r = poll::until(
        "a request over a new session",
        Duration::from_secs(10),
        || async {
            let request = http::Request::get("/info")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .expect("a request");
            readiness.forward_docker(&machines, "m1", 1, request).await
        },
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(seen.lock().iter().any(|(p, _)| p == "/info"));
}

/// A lease's Docker requests one after another share one engine connection (one SSH channel
/// and one connection on the engine, not one per request); another lease's requests never use
/// it; and when a lease ends, its kept connection closes while the other lease's stays.
#[tokio::test]
async fn a_leases_docker_requests_share_one_engine_connection_until_the_lease_ends() {
    use http_body_util::BodyExt;
    let pool = pool_key();
    let sshd = Sshd::start(pool.key.public_openssh());
    let engine = flotilla_peers::fake_engine::FakeEngine::start(Duration::ZERO);
    let mut s = settings(None, Duration::from_secs(5));
    s.docker_socket = Some(engine.socket().display().to_string());
    let connector = Connector::new(pool.key.clone(), s);
    let machines = one_machine(&sshd);
    connector
        .check(&machines, "m1")
        .await
        .expect("ready against the fake engine");
    let counts = || engine.with(|e| (e.accepted, e.open_connections, e.requests));
    let (checked, _, _) = counts();
    let ask = |lease: u64, path: &'static str| {
        let connector = &connector;
        let machines = &machines;
        async move {
            let response = connector
                .forward_docker(machines, "m1", lease, get(path))
                .await
                .expect("forwarded");
            assert_eq!(response.status(), 200, "{path}");
            // Read to the end, as a client does before its next request.
            response.into_body().collect().await.expect("the answer");
        }
    };
    for path in ["/_ping", "/version", "/containers/json", "/_ping", "/info"] {
        ask(1, path).await;
        // Kept the moment its answer was read, for the next request right after.
        assert_eq!(connector.idle_engine_connections(), 1, "after {path}");
    }
    let (accepted, _, _) = counts();
    assert_eq!(
        accepted - checked,
        1,
        "five requests of one lease, one engine connection"
    );
    ask(2, "/_ping").await;
    ask(2, "/version").await;
    let (accepted, _, requests) = counts();
    assert_eq!(
        accepted - checked,
        2,
        "another lease has its own connection ({requests} requests)"
    );
    assert_eq!(connector.idle_engine_connections(), 2);
    let open = || engine.with(|e| e.open_connections);
    let engine_holds = |n: u64, what: &'static str| {
        poll::until_true(
            what,
            Duration::from_secs(5),
            move || open() == n,
            move || format!("{} open", open()),
        )
    };
    // The readiness check's own connections close on their own.
    engine_holds(2, "the engine to hold the two kept connections only").await;
    connector.end_lease(1);
    engine_holds(1, "the ended lease's connection to close").await;
    assert_eq!(connector.idle_engine_connections(), 1);
    // The other lease still uses its connection.
    ask(2, "/info").await;
    assert_eq!(counts().0 - checked, 2);
    // An answer dropped before its end leaves its connection unusable: it is not kept, and
    // the lease's next request gets a whole answer of its own.
    let unread = connector
        .forward_docker(&machines, "m1", 3, get("/version"))
        .await
        .expect("forwarded");
    drop(unread);
    assert_eq!(connector.idle_engine_connections(), 1, "lease 2's only");
    ask(3, "/_ping").await;
    assert_eq!(counts().0 - checked, 4);
}

/// A `GET` of `path` with no body, for the Docker handle.
fn get(path: &str) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::get(path)
        .body(http_body_util::Empty::new())
        .expect("a request")
}

fn tls_files(pki: &DockerPki, client: &str) -> DockerTlsFiles {
    DockerTlsFiles {
        ca: pki.file("ca.pem"),
        cert: pki.file(&format!("{client}.pem")),
        key: pki.file(&format!("{client}-key.pem")),
    }
}

#[tokio::test]
async fn a_docker_tls_instance_is_ready_with_the_pools_client_certificate_and_serves_its_handle() {
    let _one = DOCKER.lock().await;
    let pki = DockerPki::new();
    let docker = Dockerd::start_tls(&pki);
    let port = docker.tls_port.expect("a TLS port");
    let engines = Fixed::engines(BTreeMap::from([("e1".to_string(), port)]));
    let pool = pool_key();
    let mut s = settings(None, Duration::from_secs(5));
    s.docker_socket = None;
    let tls = DockerTls::load(&tls_files(&pki, "client")).expect("the pool's TLS files");
    let readiness = Connector::new(pool.key.clone(), s.clone()).with_docker_tls(tls);
    readiness
        .check(&engines, "e1")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", docker.log()));
    assert_eq!(readiness.address("e1"), Some(format!("127.0.0.1:{port}")));
    let response = readiness
        .forward_docker(&engines, "e1", 1, get("/_ping"))
        .await
        .expect("forwarded over TLS");
    assert_eq!(response.status(), 200);

    // A client certificate the engine's CA did not sign is refused by the engine.
    let stranger = DockerTls::load(&tls_files(&pki, "stranger")).expect("loads");
    let refused = Connector::new(pool.key.clone(), s.clone()).with_docker_tls(stranger);
    let err = refused.check(&engines, "e1").await.expect_err("refused");
    assert_eq!(err.cause, "docker", "{err}");

    // An engine whose certificate the pool's CA did not sign is refused by the host.
    let wrong_ca = DockerTlsFiles {
        ca: pki.file("stranger.pem"),
        ..tls_files(&pki, "client")
    };
    let distrusting = Connector::new(pool.key.clone(), s.clone())
        .with_docker_tls(DockerTls::load(&wrong_ca).expect("loads"));
    let err = distrusting
        .check(&engines, "e1")
        .await
        .expect_err("refused");
    assert!(err.message.contains("TLS"), "{err}");

    // Without docker_tls the pool cannot reach such instances, and says why.
    let plain = Connector::new(pool.key.clone(), s);
    let err = plain
        .check(&engines, "e1")
        .await
        .expect_err("no TLS settings");
    assert!(err.message.contains("docker_tls"), "{err}");
}

#[test]
fn a_docker_tls_key_that_others_can_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let pki = DockerPki::new();
    let key = pki.file("client-key.pem");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = DockerTls::load(&tls_files(&pki, "client")).expect_err("too open");
    assert!(
        matches!(err, flotilla_connector::TlsFilesError::Key(_)),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("too open") && err.contains("client-key.pem"),
        "{err}"
    );
    let junk = pki.file("junk.pem");
    std::fs::write(&junk, "not PEM at all").expect("write");
    let err = DockerTls::load(&DockerTlsFiles {
        ca: junk,
        ..tls_files(&pki, "client")
    })
    .expect_err("no CA");
    assert!(
        matches!(&err, flotilla_connector::TlsFilesError::NoCertificate { path } if path.ends_with("junk.pem"))
            || matches!(&err, flotilla_connector::TlsFilesError::NotPem { path, .. } if path.ends_with("junk.pem")),
        "{err:?}"
    );
}

/// A dropped stream to an engine's socket lets the instance close the SSH channel first: the
/// host sends EOF and waits, so the engine reads the end of the request stream but may still
/// answer, and closes the connection itself. (Closing first leaks the channel's state in the
/// host's session for the session's life: russh ignores the instance's answering close.) With
/// a channel closed at once, sshd closes the socket both ways, and the engine's late write
/// fails.
#[tokio::test]
async fn a_dropped_engine_stream_half_closes_and_lets_the_instance_close_the_channel() {
    use flotilla_connector::{HostKeyPolicy, Session, SshOptions, Target};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let keys = tempfile::tempdir().expect("dir");
    let key = PoolKey::load_or_generate(keys.path(), "close").expect("key");
    let sshd = Sshd::start(key.public_openssh());
    let socket = keys.path().join("engine.sock");
    let engine = tokio::net::UnixListener::bind(&socket).expect("bind");
    let target = Target {
        instance: "m0".into(),
        host: "127.0.0.1".into(),
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], sshd.port)),
        port: sshd.port,
        user: "root".into(),
    };
    let options = SshOptions {
        connect_timeout: Duration::from_secs(10),
        keepalive_interval: Duration::from_secs(30),
    };
    let policy = HostKeyPolicy::Pin(Arc::default());
    let session = Session::connect(&target, &key, &policy, &options)
        .await
        .expect("a session");
    let mut stream = session
        .open_unix_socket(socket.to_str().expect("utf-8"))
        .await
        .expect("a stream");
    let (mut server, _) = engine.accept().await.expect("the engine's connection");
    stream.write_all(b"request").await.expect("write");
    stream.flush().await.expect("flush");
    drop(stream);
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), server.read_to_end(&mut got))
        .await
        .expect("the engine reads the end of the request")
        .expect("read");
    assert_eq!(got, b"request");
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.write_all(b"late answer").await.expect(
            "the engine's side is still open: the instance closes the channel, not the host",
        );
    }
    drop(server);
}

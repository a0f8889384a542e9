//! Tenants and edges, from the hostile side: a job of one project against another project's
//! cache, images and job; a lease holder whose streams outlive its lease; a local client
//! without a token; a flood of idle connections; an encoded path; a forged job id; a driver
//! killed in the middle of `prepare`. Each test fails on a host without the protection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::fleet::{DOCKER, Fleet, RunnerJob, docker_cli};
use common::{Flotilla, TOKEN, cli};
use flotilla_harness::poll;
use flotilla_test_artifacts as guests;

fn inspect(fleet: &Fleet, what: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("dir");
    let out = docker_cli(&fleet.docker, dir.path(), what);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One machine of two slots: every job lands on the same instance, as jobs of different
/// projects do on a shared runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_project_can_never_reach_another_projects_cache_images_or_job() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 2, "").await;

    // The cache is per project: what mallory/fork (project 2) writes at the path acme/app
    // (project 1) restores is in another volume.
    let acme = RunnerJob::of_project(&fleet, 901, 1, false);
    assert_eq!(acme.stage(&["prepare"]).code, 0);
    let wrote = acme.run(
        "build_script",
        "mkdir -p /cache/acme/app/default && echo genuine > /cache/acme/app/default/cache.zip",
    );
    assert_eq!(wrote.code, 0, "{wrote:?}");
    assert_eq!(acme.stage(&["cleanup"]).code, 0);
    let mallory = RunnerJob::of_project(&fleet, 902, 2, false);
    assert_eq!(mallory.stage(&["prepare"]).code, 0);
    let poison = mallory.run(
        "build_script",
        "ls -R /cache; test ! -e /cache/acme/app/default/cache.zip || exit 9; \
         mkdir -p /cache/acme/app/default-protected /cache/acme/app/default && \
         echo poison > /cache/acme/app/default-protected/cache.zip && \
         echo poison > /cache/acme/app/default/cache.zip",
    );
    assert_eq!(
        poison.code, 0,
        "project 2 saw project 1's cache: {poison:?}"
    );
    assert_eq!(mallory.stage(&["cleanup"]).code, 0);
    // acme's protected branch has a cache of its own, apart from its merge requests'.
    let protected = RunnerJob::of_project(&fleet, 903, 1, true);
    assert_eq!(protected.stage(&["prepare"]).code, 0);
    let restored = protected.run(
        "build_script",
        "test ! -e /cache/acme/app/default-protected/cache.zip && test ! -e /cache/acme/app/default/cache.zip",
    );
    assert_eq!(
        restored.code, 0,
        "a protected ref restored an unprotected cache: {restored:?}"
    );
    assert_eq!(protected.stage(&["cleanup"]).code, 0);
    // And acme's own unprotected cache is still there for acme.
    let again = RunnerJob::of_project(&fleet, 904, 1, false);
    assert_eq!(again.stage(&["prepare"]).code, 0);
    let read = again.run("build_script", "cat /cache/acme/app/default/cache.zip");
    assert_eq!(read.code, 0, "{read:?}");
    assert!(
        read.stdout.contains("genuine") && !read.stdout.contains("poison"),
        "{read:?}"
    );
    assert_eq!(again.stage(&["cleanup"]).code, 0);
    let volumes = inspect(
        &fleet,
        &[
            "volume",
            "ls",
            "-q",
            "--filter",
            "label=io.flotilla.gitlab.cache.kind=cache",
        ],
    );
    let mut volumes: Vec<&str> = volumes.lines().collect();
    volumes.sort();
    assert_eq!(
        volumes,
        [
            "flotilla-cache-project-1",
            "flotilla-cache-project-1-protected",
            "flotilla-cache-project-2"
        ]
    );
    // Checkouts are kept per project, protection and slot, never shared between projects.
    let builds = inspect(
        &fleet,
        &[
            "volume",
            "ls",
            "--format",
            "{{.Name}} {{.Label \"io.flotilla.gitlab.cache\"}}",
            "--filter",
            "label=io.flotilla.gitlab.cache.kind=builds",
        ],
    );
    assert!(!builds.is_empty(), "no builds volume");
    for line in builds.lines() {
        let (name, project) = line.split_once(' ').expect("name and project");
        assert!(
            name.starts_with(&format!("runner-flotilla-project-{project}-concurrent-")),
            "{line}"
        );
    }
    assert!(builds.contains("-protected"), "{builds}");

    // Private images are pulled for every job: the image is on the instance now, but a job
    // without the registry's credentials cannot run it (the default pull policy is always).
    let mut stranger = RunnerJob::of_project(&fleet, 905, 3, false);
    stranger.env.remove("CUSTOM_ENV_DOCKER_AUTH_CONFIG");
    let refused = stranger.stage(&["prepare"]);
    assert_eq!(
        refused.code, 2,
        "a private image ran without credentials: {refused:?}"
    );
    assert!(refused.stderr.contains("pulling image"), "{refused:?}");
    assert_eq!(stranger.stage(&["cleanup"]).code, 0);

    // A digest-pinned image pulls and runs.
    let digest = inspect(
        &fleet,
        &[
            "image",
            "inspect",
            "--format",
            "{{index .RepoDigests 0}}",
            &fleet.image,
        ],
    );
    assert!(digest.contains("@sha256:"), "{digest}");
    let mut pinned = fleet.job(906);
    pinned
        .env
        .insert("CUSTOM_ENV_CI_JOB_IMAGE".into(), digest.clone());
    let prepared = pinned.stage(&["prepare"]);
    assert_eq!(prepared.code, 0, "{digest}: {prepared:?}");
    assert_eq!(pinned.run("build_script", "echo pinned").code, 0);
    assert_eq!(pinned.stage(&["cleanup"]).code, 0);

    // A job that names another job's id gets nowhere: without the runner's response file
    // there is no job at all (and no lease is taken).
    let victim = fleet.job(907);
    assert_eq!(victim.stage(&["prepare"]).code, 0);
    let mut forger = fleet.job(908);
    forger.env.remove("JOB_RESPONSE_FILE");
    for (name, value) in [
        ("CUSTOM_ENV_CI_JOB_ID", "907"),
        ("CUSTOM_ENV_CI_PROJECT_ID", "77"),
    ] {
        forger.env.insert(name.into(), value.into());
    }
    let forged = forger.run("build_script", "echo inside the victim container");
    assert_eq!(forged.code, 2, "{forged:?}");
    assert!(forged.stderr.contains("JOB_RESPONSE_FILE"), "{forged:?}");
    assert!(!forged.stdout.contains("victim"), "{forged:?}");
    assert_eq!(forger.stage(&["cleanup"]).code, 2);
    let (_, lease) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=907", None)
        .await;
    assert_eq!(lease["leases"][0]["state"]["state"], "acquired", "{lease}");
    assert_eq!(victim.run("build_script", "true").code, 0);
    assert_eq!(victim.stage(&["cleanup"]).code, 0);

    // Service variables reach the service; the job reaches only its own services.
    let mut served = fleet.job(909);
    served.env.insert(
        "CUSTOM_ENV_CI_JOB_SERVICES".into(),
        format!(
            r#"[{{"name":"{}","alias":"db","entrypoint":["/bin/sh"],"command":["-c","while true; do echo \"$GREETING\" | nc -l -p 5432; done"],"variables":{{"GREETING":"hello-from-a-variable"}}}}]"#,
            fleet.image
        ),
    );
    assert_eq!(served.stage(&["prepare"]).code, 0);
    let heard = served.run(
        "build_script",
        "for i in 1 2 3 4 5 6 7 8 9 10; do nc db 5432 && exit 0; sleep 0.5; done; exit 1",
    );
    assert_eq!(heard.code, 0, "{heard:?}");
    assert!(heard.stdout.contains("hello-from-a-variable"), "{heard:?}");
    assert_eq!(served.stage(&["cleanup"]).code, 0);

    // Per-job limits from the driver's command line.
    let mut limited = fleet.job(910);
    limited
        .args
        .extend(["--memory", "64m", "--cpus", "0.5", "--pids-limit", "64"].map(String::from));
    assert_eq!(limited.stage(&["prepare"]).code, 0);
    let host_config = inspect(
        &fleet,
        &[
            "inspect",
            "--format",
            "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.PidsLimit}}",
            "flotilla-job-910",
        ],
    );
    assert_eq!(host_config, "67108864 500000000 64");
    assert_eq!(limited.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// A driver killed at any point of `prepare` (SIGKILL: no chance to tidy), then `cleanup`:
/// nothing labelled is left, including what was being created when it died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_after_a_prepare_killed_anywhere_leaves_nothing() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 2, "").await;
    let services = format!(
        r#"[{{"name":"{image}","alias":"one","entrypoint":["/bin/sh"],"command":["-c","sleep 600"]}},{{"name":"{image}","alias":"two","entrypoint":["/bin/sh"],"command":["-c","sleep 600"]}}]"#,
        image = fleet.image
    );
    for (i, delay_ms) in [150u64, 400, 700, 1000, 1400, 1900, 2600]
        .into_iter()
        .enumerate()
    {
        let mut job = fleet.job(950 + i as u64);
        job.env
            .insert("CUSTOM_ENV_CI_JOB_SERVICES".into(), services.clone());
        let mut child = job.command(&["prepare"]).spawn().expect("prepare");
        // Deliberate: the chosen point of prepare to kill it at.
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        child.kill().expect("SIGKILL prepare");
        let _ = child.wait();
        let cleanup = job.stage(&["cleanup"]);
        assert_eq!(cleanup.code, 0, "killed after {delay_ms} ms: {cleanup:?}");
        // Anything still landing has had its time.
        // Deliberate: a late creation must not appear within this window.
        tokio::time::sleep(Duration::from_millis(500)).await;
        fleet.assert_clean().await;
    }
}

/// A container whose creation was still in flight when `prepare` died (held by the engine's
/// socket for a second) lands after cleanup's first sweep; cleanup's second sweep removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_in_flight_when_prepare_dies_is_removed_by_cleanup() {
    use flotilla_peers::proxy::SlowCreates;
    let _one = DOCKER.lock().await;
    let (fleet, slow) = Fleet::start_behind(1, 2, |engine| {
        let slow = SlowCreates::start(engine, Duration::from_millis(1000));
        (slow.socket.clone(), slow)
    })
    .await;
    let job = fleet.job(980);
    let mut child = job.command(&["prepare"]).spawn().expect("prepare");
    poll::until_true(
        "prepare to create a container",
        Duration::from_secs(60),
        || slow.held.load(std::sync::atomic::Ordering::SeqCst) > 0,
        || "no creation held".to_string(),
    )
    .await;
    child.kill().expect("SIGKILL prepare");
    let _ = child.wait();
    let cleanup = job.stage(&["cleanup"]);
    assert_eq!(cleanup.code, 0, "{cleanup:?}");
    // The held creation has landed by now, one way or the other.
    // Deliberate: waits out the 1 s the proxy holds a creation, so a late one would show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fleet.assert_clean().await;
}

/// A lease's Docker channels end with the lease: after `release`, an `/events` stream and an
/// upgraded exec stream opened under it are closed within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_leases_docker_streams_are_cut_within_a_second() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 2, "").await;
    let job = fleet.job(960);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let (_, found) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=960", None)
        .await;
    let lease = found["leases"][0]["id"].as_u64().expect("the job's lease");
    let api = flotilla_gitlab::ApiClient::new(&fleet.flotilla.base, Some(TOKEN.into()), "ci")
        .expect("client");
    let docker = flotilla_gitlab::docker::client::for_lease(&api, lease, 600).expect("handle");
    let mut events = docker.events(None::<bollard::query_parameters::EventsOptions>);
    let exec = docker
        .create_exec(
            "flotilla-job-960",
            bollard::exec::CreateExecOptions {
                attach_stdout: Some(true),
                cmd: Some(vec![
                    "sh".to_string(),
                    "-c".to_string(),
                    "while :; do echo tick; sleep 0.2; done".to_string(),
                ]),
                ..Default::default()
            },
        )
        .await
        .expect("exec");
    let bollard::exec::StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.expect("start")
    else {
        panic!("detached")
    };
    assert!(output.next().await.is_some(), "the exec streams");
    let (code, body) = fleet
        .flotilla
        .call(
            "POST",
            &format!("/v1/pools/ci/leases/{lease}/release"),
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let released = Instant::now();
    // Whatever was already in flight may still arrive; then the stream must end.
    let exec_end = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = output.next().await {}
    })
    .await;
    assert!(exec_end.is_ok(), "the exec stream outlived its lease");
    let events_end = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = events.next().await {}
    })
    .await;
    assert!(events_end.is_ok(), "the events stream outlived its lease");
    assert!(
        released.elapsed() < Duration::from_millis(1500),
        "{:?}",
        released.elapsed()
    );
    // And no new request goes through under the released lease.
    assert!(docker.ping().await.is_err());
    let dir = tempfile::tempdir().expect("dir");
    for args in [
        vec!["rm", "-f", "flotilla-job-960", "flotilla-job-960-helper"],
        vec!["network", "rm", "flotilla-job-960"],
    ] {
        docker_cli(&fleet.docker, dir.path(), &args);
    }
}

/// A privileged container can take over the machine, so the Docker handle refuses one in a
/// pool that does not allow it (`allow_privileged`), however the request spells it; other
/// creates go through unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_handle_refuses_privileged_containers_unless_the_pool_allows_them() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 2, "").await;
    let job = fleet.job(970);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let (_, found) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=970", None)
        .await;
    let lease = found["leases"][0]["id"].as_u64().expect("the job's lease");
    let create = |version: &str, privileged: bool| {
        let body = serde_json::json!({
            "Image": fleet.image,
            "Cmd": ["true"],
            "HostConfig": {"Privileged": privileged},
            "Labels": {"io.flotilla.gitlab.job": "970"},
        });
        (
            format!("/v1/pools/ci/leases/{lease}/docker{version}/containers/create"),
            reqwest::Body::from(body.to_string()),
        )
    };
    for version in ["", "/v1.41", "/v1.44"] {
        let (url, body) = create(version, true);
        let (code, answer) = fleet
            .flotilla
            .request("POST", &url, Some(body), Some(TOKEN))
            .await;
        let answer = String::from_utf8_lossy(&answer);
        assert_eq!(code, 403, "{url}: {answer}");
        assert!(answer.contains("not_allowed"), "{answer}");
    }
    // Spelled as Go's encoding/json still reads it: other cases, `ſ` for `s`, an escaped path,
    // and bytes that are not UTF-8 (Go replaces them; this side refuses what it cannot read).
    let base = "/v1.41/containers/create".to_string();
    for (path, body) in [
        (
            base.clone(),
            r#"{"Image":"x","hostconfig":{"PRIVILEGED":true}}"#.as_bytes().to_vec(),
        ),
        (
            base.clone(),
            r#"{"Image":"x","Hoſtconfig":{"privileged":true}}"#.as_bytes().to_vec(),
        ),
        (
            "/v1.41/containers/%63reate".into(),
            r#"{"Image":"x","HostConfig":{"Privileged":true}}"#.as_bytes().to_vec(),
        ),
        (
            base.clone(),
            b"{\"Image\":\"x\",\"Labels\":{\"a\":\"\xff\"},\"HostConfig\":{\"Privileged\":true}}"
                .to_vec(),
        ),
    ] {
        let url = format!("/v1/pools/ci/leases/{lease}/docker{path}");
        let (code, answer) = fleet
            .flotilla
            .request("POST", &url, Some(reqwest::Body::from(body)), Some(TOKEN))
            .await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(code == 403 || code == 400, "{url}: {code} {answer}");
    }
    let (url, body) = create("/v1.41", false);
    let (code, answer) = fleet
        .flotilla
        .request("POST", &url, Some(body), Some(TOKEN))
        .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&answer));
    // A privileged exec in an unprivileged container is refused too; a plain one is not.
    let docker = format!("/v1/pools/ci/leases/{lease}/docker/v1.41");
    let sleeper = serde_json::json!({
        "Image": fleet.image,
        "Cmd": ["sleep", "300"],
        "Labels": {"io.flotilla.gitlab.job": "970"},
    });
    let (code, answer) = fleet
        .flotilla
        .request(
            "POST",
            &format!("{docker}/containers/create"),
            Some(reqwest::Body::from(sleeper.to_string())),
            Some(TOKEN),
        )
        .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&answer));
    let created: serde_json::Value = serde_json::from_slice(&answer).expect("create's answer");
    let container = created["Id"].as_str().expect("the container's id");
    let (code, answer) = fleet
        .flotilla
        .request(
            "POST",
            &format!("{docker}/containers/{container}/start"),
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(code, 204, "{}", String::from_utf8_lossy(&answer));
    let exec = format!("/v1/pools/ci/leases/{lease}/docker/v1.41/containers/{container}/exec");
    for (body, want) in [
        (r#"{"Cmd":["true"],"Privileged":true}"#, 403),
        (r#"{"Cmd":["true"],"privileged":true}"#, 403),
        (r#"{"Cmd":["true"],"Privileged":false}"#, 201),
    ] {
        let (code, answer) = fleet
            .flotilla
            .request("POST", &exec, Some(reqwest::Body::from(body)), Some(TOKEN))
            .await;
        assert_eq!(code, want, "{body}: {}", String::from_utf8_lossy(&answer));
    }
    let (code, answer) = fleet
        .flotilla
        .request(
            "DELETE",
            &format!("/v1/pools/ci/leases/{lease}/docker/v1.41/containers/{container}?force=1"),
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(code, 204, "{}", String::from_utf8_lossy(&answer));
    // The driver's --privileged is refused by the pool, with the words to fix it.
    let mut privileged = fleet.job(971);
    privileged.args.push("--privileged".into());
    let refused = privileged.stage(&["prepare"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("allow_privileged"), "{refused:?}");
    assert_eq!(privileged.stage(&["cleanup"]).code, 0);
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

fn static_config(extra_server: &str, pools: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "2s"
{extra_server}
{pools}"#
    )
}

fn static_pool(name: &str, first_host: u8) -> String {
    format!(
        r#"
[[pool]]
name = "{name}"
plugin = "{plugin}"
capacity_per_instance = 2
max_instances = 2
update_interval = "1s"
[pool.plugin_config]
hosts = [{{ address = "127.0.0.{first_host}" }}, {{ address = "127.0.0.{next}" }}]
[[pool.policy]]
idle_count = 2
idle_time = "1h"
"#,
        plugin = guests::STATIC_PLUGIN,
        next = first_host + 1
    )
}

/// A flood of idle and half-sent connections (more than the process may open) does not keep
/// an API client out, and a request whose headers never end is dropped at the deadline. The
/// connection bounds are lowered to fit the process's open-file limit, and it says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_does_not_keep_api_clients_out() {
    let dir = tempfile::tempdir().expect("dir");
    let config = static_config("header_read_timeout = \"2s\"", &static_pool("local", 1));
    // 256 descriptors: the default bounds (4,096 connections, 1,024 of them unauthenticated)
    // are lowered at start to fit, so the flood is pushed out before it runs the process out
    // of descriptors and a newcomer can still be accepted.
    let f = Flotilla::serving_with_fd_limit(dir, &config, Some(256)).await;
    let mut flood = Vec::new();
    for _ in 0..400 {
        match tokio::net::TcpStream::connect(("127.0.0.1", f.port())).await {
            Ok(s) => flood.push(s),
            Err(_) => break, // this process's own limit
        }
    }
    assert!(flood.len() >= 300, "opened only {}", flood.len());
    let start = Instant::now();
    // Sooner than header_read_timeout (2 s) would free a place: the newcomer takes the place
    // of the oldest idle connection.
    let answered = tokio::time::timeout(
        Duration::from_millis(1500),
        f.call("GET", "/v1/pools", None),
    )
    .await
    .expect("an authenticated client is answered under the flood");
    assert_eq!(answered.0, 200, "{:?}", answered.1);
    assert!(
        f.log()
            .contains("the connection bounds are lowered to fit the open-file limit"),
        "{}",
        f.log()
    );
    println!(
        "answered in {:?} with {} idle connections open",
        start.elapsed(),
        flood.len()
    );
    drop(flood);

    let mut half = tokio::net::TcpStream::connect(("127.0.0.1", f.port()))
        .await
        .expect("connect");
    half.write_all(b"GET /v1/pools HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(5), half.read(&mut buf)).await;
    let n = closed.expect("an unfinished request is dropped at header_read_timeout");
    assert!(
        matches!(n, Ok(0) | Err(_)) || buf.starts_with(b"HTTP/1.1 408"),
        "{n:?}"
    );
}

/// Lease ids name one lease of one pool: two pools never hand out the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_ids_are_unique_across_pools() {
    let dir = tempfile::tempdir().expect("dir");
    let pools = format!("{}{}", static_pool("a", 1), static_pool("b", 3));
    let f = Flotilla::start(dir, &static_config("", &pools)).await;
    let mut ids = std::collections::BTreeSet::new();
    for pool in ["a", "b", "a", "b"] {
        let (code, body) = f
            .call("POST", &format!("/v1/pools/{pool}/leases"), None)
            .await;
        assert_eq!(code, 201, "{body}");
        assert!(
            ids.insert(body["lease"]["id"].as_u64().expect("id")),
            "{ids:?}"
        );
    }
}

/// A pool with a connector needs a token on loopback too, Docker handle or not (an instance-mode
/// pool's exec is a shell on every machine, with every running job's script), and a token file
/// others can read is refused: by `config check` and by `run` alike.
#[test]
fn the_docker_handle_is_never_open_without_a_token() {
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("key");
    std::fs::write(&key, "unused").expect("key");
    let instance = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{}[pool.connector]\nssh_key = {{ file = \"{}\" }}\ndocker = false\n",
        static_pool("shell", 1),
        key.display()
    );
    let open = dir.path().join("instance.toml");
    std::fs::write(&open, instance).expect("config");
    let open = open.display().to_string();
    for command in [&["config", "check", "-c", &open][..], &["run", "-c", &open]] {
        let (code, out, err) = cli(command);
        assert_ne!(code, 0, "{command:?}: {out}{err}");
        let said = format!("{out}{err}");
        assert!(
            said.contains("server.token") && said.contains("shell") && said.contains("exec"),
            "{command:?}: {said}"
        );
    }
    // With a token it checks, with a note on what sharing a machine means, unless each
    // machine serves one job.
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).expect("token");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::remove_file(&key).expect("key");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen");
    assert!(made.status.success(), "{made:?}");
    let shared = std::fs::read_to_string(&open).expect("config").replace(
        "[server]\n",
        &format!("[server]\ntoken = {{ file = \"{}\" }}\n", token.display()),
    );
    std::fs::write(&open, &shared).expect("config");
    let (code, out, err) = cli(&["config", "check", "-c", &open]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "note: pool shell: jobs without Docker (instance mode) share each machine's login user"
        ),
        "{out}"
    );
    let fresh = shared.replace(
        "max_instances = 2\n",
        "max_instances = 2\nmax_use_count = 1\n",
    );
    std::fs::write(&open, fresh).expect("config");
    let (code, out, err) = cli(&["config", "check", "-c", &open]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("share each machine"), "{out}");
    docker_handle_needs_a_token();
}

fn docker_handle_needs_a_token() {
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("key");
    std::fs::write(&key, "unused").expect("key");
    let pool = format!(
        "{}[pool.connector]\nssh_key = {{ file = \"{}\" }}\n",
        static_pool("docker", 1),
        key.display()
    );
    let open = dir.path().join("open.toml");
    std::fs::write(&open, format!("[server]\nlisten = \"127.0.0.1:0\"\n{pool}")).expect("config");
    let open = open.display().to_string();
    let (code, out, err) = cli(&["config", "check", "-c", &open]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        format!("{out}{err}").contains("server.token")
            && format!("{out}{err}").contains("Docker handle"),
        "{out}{err}"
    );
    let (code, out, err) = cli(&["run", "-c", &open]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("server.token"), "{err}");

    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).expect("token");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let readable = dir.path().join("readable.toml");
    std::fs::write(
        &readable,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ntoken = {{ file = \"{}\" }}\n{pool}",
            token.display()
        ),
    )
    .expect("config");
    let (code, out, err) = cli(&["config", "check", "-c", &readable.display().to_string()]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(format!("{out}{err}").contains("chmod o-rwx"), "{out}{err}");
    // Group-readable is fine (the runner's group).
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let (code, out, err) = cli(&["config", "check", "-c", &readable.display().to_string()]);
    assert!(
        !format!("{out}{err}").contains("chmod o-rwx"),
        "{code} {out}{err}"
    );
}

/// The state directory and the lease journal are private whatever the umask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_and_state_directory_are_private_under_a_wide_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let config = format!(
        "state_dir = \"{}\"\n{}",
        state.display(),
        static_config("", &static_pool("local", 1))
    );
    let options = common::Options {
        umask: Some(0o000),
        ..common::Options::default()
    };
    let f = Flotilla::start_with(dir, &config, options).await;
    let journal = state.join("leases.redb");
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    let modes = (mode(&state), mode(&journal));
    drop(f);
    assert_eq!(modes, (0o700, 0o600));
}

/// A Docker Engine stand-in on a unix socket that answers the connector's checks and records
/// every other request's head exactly as it arrived.
struct RecordingEngine {
    socket: std::path::PathBuf,
    heads: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl RecordingEngine {
    fn start() -> RecordingEngine {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let heads = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let kept = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let heads = kept.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match stream.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let line = head.lines().next().unwrap_or_default().to_string();
                    let body = if line.contains("/_ping") {
                        "OK".to_string()
                    } else if line.contains("/version") {
                        r#"{"Version":"20.10.24","ApiVersion":"1.41","MinAPIVersion":"1.12"}"#
                            .into()
                    } else {
                        heads.lock().push(head);
                        r#"{"message":"recorded"}"#.into()
                    };
                    let status = if body.starts_with("{\"message") {
                        "404 Not Found"
                    } else {
                        "200 OK"
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nApi-Version: 1.41\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        RecordingEngine {
            socket,
            heads,
            _dir: dir,
        }
    }
}

/// The handle forwards the path byte for byte (no decoding of `%3F`, `%23`, `%25`) and drops
/// hop-by-hop headers and the caller's credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_handle_forwards_the_path_as_sent_without_hop_by_hop_headers() {
    let engine = RecordingEngine::start();
    let dir = tempfile::tempdir().expect("dir");
    let key =
        flotilla_connector::PoolKey::load_or_generate(&dir.path().join("keys"), "ci").expect("key");
    let machine = flotilla_peers::sshd::Sshd::start(key.public_openssh());
    let pool = format!(
        r#"
[[pool]]
name = "ci"
plugin = "{plugin}"
max_instances = 1
update_interval = "1s"
[pool.plugin_config]
hosts = [{{ id = "m1", address = "127.0.0.1", port = {sshd}, username = "root" }}]
[pool.connector]
username = "root"
allowed_ranges = ["127.0.0.0/8"]
ssh_key = {{ file = "{key}" }}
docker_socket = "{socket}"
[[pool.policy]]
idle_count = 1
idle_time = "1h"
"#,
        plugin = guests::STATIC_PLUGIN,
        sshd = machine.port,
        key = dir.path().join("keys/ci/id_ed25519").display(),
        socket = engine.socket.display(),
    );
    let f = Flotilla::start(dir, &static_config("", &pool)).await;
    f.wait_for("/v1/pools/ci/instances", "a ready machine", |b| {
        b["instances"][0]["state"] == "ready"
    })
    .await;
    let (code, body) = f.call("POST", "/v1/pools/ci/leases", None).await;
    assert_eq!(code, 201, "{body}");
    let lease = body["lease"]["id"].as_u64().expect("id");
    let (code, body) = f
        .call(
            "POST",
            &format!("/v1/pools/ci/leases/{lease}/acquire"),
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", f.port()))
        .await
        .expect("connect");
    let request = format!(
        "GET /v1/pools/ci/leases/{lease}/docker/v1.41/containers/a%3Fb%23c%25d%2Fe/json?x=%2F1&y=2 HTTP/1.1\r\n\
         Host: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: keep-alive, X-Secret-Hop\r\nX-Secret-Hop: 1\r\nKeep-Alive: timeout=5\r\n\
         TE: trailers\r\nProxy-Connection: keep-alive\r\nX-End-To-End: kept\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("an answer")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.contains("recorded"), "{answer}");
    let heads = engine.heads.lock().clone();
    let head = heads
        .iter()
        .find(|h| h.contains("containers"))
        .unwrap_or_else(|| panic!("no request reached the engine: {heads:?}"));
    let line = head.lines().next().unwrap_or_default();
    assert_eq!(
        line,
        "GET /v1.41/containers/a%3Fb%23c%25d%2Fe/json?x=%2F1&y=2 HTTP/1.1"
    );
    let lower = head.to_ascii_lowercase();
    for gone in [
        "authorization",
        "x-secret-hop",
        "keep-alive",
        "te:",
        "proxy-connection",
        "connection:",
    ] {
        assert!(!lower.contains(gone), "{gone} was forwarded:\n{head}");
    }
    assert!(lower.contains("x-end-to-end: kept"), "{head}");
}

/// Job networks are isolated from each other on an engine with its iptables on (Docker's
/// default): a job reaches its own service, never another job's, even by address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cannot_reach_another_jobs_services() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start_with_iptables(1, 2).await;
    let local = |mut job: RunnerJob| {
        job.args
            .extend(["--pull-policy", "never"].map(String::from));
        job.env.remove("CUSTOM_ENV_DOCKER_AUTH_CONFIG");
        job.env
            .insert("CUSTOM_ENV_CI_JOB_IMAGE".into(), fleet.image.clone());
        job
    };
    let mut owner = local(fleet.job(970));
    owner.env.insert(
        "CUSTOM_ENV_CI_JOB_SERVICES".into(),
        format!(
            r#"[{{"name":"{}","alias":"db","entrypoint":["/bin/sh"],"command":["-c","while true; do echo secret-data | nc -l -p 5432; done"]}}]"#,
            fleet.image
        ),
    );
    let prepared = owner.stage(&["prepare"]);
    assert_eq!(prepared.code, 0, "{prepared:?}");
    let own = owner.run(
        "build_script",
        "for i in 1 2 3 4 5 6 7 8 9 10; do nc db 5432 && exit 0; sleep 0.5; done; exit 1",
    );
    assert!(
        own.code == 0 && own.stdout.contains("secret-data"),
        "{own:?}"
    );
    let address = inspect(
        &fleet,
        &[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            "flotilla-job-970-service-0",
        ],
    );
    assert!(!address.is_empty(), "the service's address");
    let intruder = local(fleet.job(971));
    assert_eq!(intruder.stage(&["prepare"]).code, 0);
    let tried = intruder.run(
        "build_script",
        &format!("for i in 1 2 3; do nc -w 2 {address} 5432 && exit 0; done; exit 7"),
    );
    assert_eq!(tried.code, 1, "{tried:?}");
    assert!(!tried.stdout.contains("secret-data"), "{tried:?}");
    assert_eq!(intruder.build_exit_code().as_deref(), Some("7\n"));
    assert_eq!(owner.stage(&["cleanup"]).code, 0);
    assert_eq!(intruder.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// `flotilla run` on `config`, written to `dir/flotilla.toml`, logging to `dir/flotilla.log`,
/// with its caches and state under `dir` (for tests that need the process itself: its exit
/// status, or a listener the harness cannot speak to).
fn run_in(dir: &std::path::Path, config: &str) -> flotilla_peers::process::Daemon {
    let config_file = dir.join("flotilla.toml");
    std::fs::write(&config_file, config).expect("config");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(["run", "-c"])
        .arg(&config_file)
        .env("FLOTILLA_LOG", "info")
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_DATA_HOME", dir.join("data"));
    flotilla_peers::process::Daemon::spawn(command, &dir.join("flotilla.log"))
}

/// A CA and a certificate it signs for `localhost`, as the API listener's PEM files in `dir`
/// (`cert.pem`, `key.pem` 0600, the key written first, as a renewal replaces them); the CA's
/// file is `ca-<name>.pem`.
fn listener_certificate(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("a CA");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("a certificate");
    let key_file = dir.join("key.pem");
    let staged = dir.join(format!("key-{name}.tmp"));
    std::fs::write(&staged, key.serialize_pem()).expect("key");
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600)).expect("mode");
    std::fs::rename(&staged, &key_file).expect("key in place");
    std::fs::write(dir.join("cert.pem"), cert.pem()).expect("cert");
    let ca_file = dir.join(format!("ca-{name}.pem"));
    std::fs::write(&ca_file, ca.pem()).expect("ca");
    ca_file
}

/// The lease API over TLS (`[server] tls`): the driver's client reaches it with the
/// operator's CA file; plain HTTP to it gets no lease; a renewed certificate written over the
/// files is served without a restart (the old CA no longer verifies it). And the driver
/// refuses to send its token over plain HTTP to a non-loopback address unless told
/// `--insecure-http`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_reaches_a_tls_listener_and_a_renewed_certificate_is_served_without_restart() {
    use flotilla_gitlab::{ApiClient, TransportOptions};
    let dir = tempfile::tempdir().expect("dir");
    let first = listener_certificate(dir.path(), "first");
    let config = static_config(
        &format!(
            "tls = {{ cert = {{ file = \"{}\" }}, key = {{ file = \"{}\" }} }}",
            dir.path().join("cert.pem").display(),
            dir.path().join("key.pem").display()
        ),
        &static_pool("local", 1),
    );
    let mut daemon = run_in(dir.path(), &config);
    let listen = daemon
        .logged("flotilla is listening", "listen", Duration::from_secs(60))
        .await;
    let port = listen.rsplit(':').next().expect("a port").to_string();
    let url = format!("https://localhost:{port}");
    let client = |ca: &std::path::Path| {
        let options = TransportOptions {
            ca_file: Some(ca.to_path_buf()),
            insecure_http: false,
        };
        ApiClient::with_transport(&url, Some(TOKEN.into()), "local", &options).expect("client")
    };
    let no_labels = std::collections::BTreeMap::new();
    let reserve = |ca: std::path::PathBuf| {
        let api = client(&ca);
        let labels = no_labels.clone();
        async move {
            let lease = api
                .reserve(&labels, None)
                .await
                .map_err(|e| e.to_string())?;
            api.unreserve(lease.id).await.map_err(|e| e.to_string())
        }
    };
    poll::until("a lease over TLS", Duration::from_secs(60), || {
        reserve(first.clone())
    })
    .await;
    let plain = ApiClient::new(
        &format!("http://127.0.0.1:{port}"),
        Some(TOKEN.into()),
        "local",
    )
    .expect("client")
    .reserve(&no_labels, None)
    .await;
    assert!(plain.is_err(), "plain HTTP got an answer: {plain:?}");

    let second = listener_certificate(dir.path(), "second");
    poll::until(
        "the renewed certificate to be served",
        Duration::from_secs(20),
        || reserve(second.clone()),
    )
    .await;
    let old = reserve(first.clone()).await;
    assert!(
        old.as_ref().is_err_and(|e| e.contains("certificate")),
        "the old CA still verifies: {old:?}"
    );
    daemon.terminate();

    let token = dir.path().join("token");
    flotilla_harness::write_secret(&token, TOKEN);
    let token = token.display().to_string();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "gitlab",
            "--url",
            "http://flotilla.ci.svc:8080",
            "--pool",
            "local",
            "--token-file",
            &token,
        ];
        a.extend_from_slice(extra);
        a.push("snippet");
        cli(&a)
    };
    let (code, out, err) = args(&[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("plain HTTP") && err.contains("--insecure-http"),
        "{err}"
    );
    let (code, out, err) = args(&["--insecure-http"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"--insecure-http\""), "{out}");
}

/// A plugin whose `increase` never returns (up to its two-minute deadline) when SIGTERM comes:
/// at the end of `shutdown_grace` the call is dropped, the plugin's `shutdown` runs, and the
/// process exits 0 within seconds. Without it, the drain waits behind the call until the
/// pool is abandoned (grace + 15 s) and the process exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_call_still_running_at_the_end_of_the_grace_is_dropped() {
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        r#"[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "1s"

[[pool]]
name = "stuck"
plugin = "{plugin}"
max_instances = 1
update_interval = "1s"
[pool.plugin_config]
on = {{ increase = "sleep" }}
[pool.limits]
default_deadline = "120s"
[[pool.policy]]
idle_count = 1
idle_time = "1h"
"#,
        plugin = guests::MISBEHAVE
    );
    let log = dir.path().join("flotilla.log");
    let mut daemon = run_in(dir.path(), &config);
    daemon
        .logged("flotilla is listening", "listen", Duration::from_secs(60))
        .await;
    // The pool is up; its first update finds no instance, so its increase is under way
    // (and will not come back).
    poll::until_true(
        "the pool to start",
        Duration::from_secs(60),
        || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("pool started")),
        || std::fs::read_to_string(&log).unwrap_or_default(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let status = daemon.terminate().expect("exit status");
    let took = started.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{text}");
    assert!(took < Duration::from_secs(8), "took {took:?}\n{text}");
    assert!(text.contains("stopped"), "{text}");
}

/// The runner takes no job the fleet cannot run: `snippet` asks flotilla for the pool's slots
/// (`max_instances × capacity_per_instance`, here 2 × 2) and writes them as the runner's
/// `limit`, with a `request_concurrency` to suit; `--limit` overrides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snippet_limits_the_runner_to_the_pools_slots() {
    let dir = tempfile::tempdir().expect("dir");
    let f = Flotilla::start(dir, &static_config("", &static_pool("local", 1))).await;
    let token = f.dir.path().join("token");
    flotilla_harness::write_secret(&token, TOKEN);
    let token = token.display().to_string();
    let snippet = |extra: &[&str]| {
        let mut args = vec![
            "gitlab",
            "--url",
            &f.base,
            "--pool",
            "local",
            "--token-file",
            &token,
        ];
        args.extend_from_slice(extra);
        args.push("snippet");
        let (code, out, err) = cli(&args);
        assert_eq!(code, 0, "{err}");
        let doc: toml::Value = toml::from_str(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        let runner = doc["runners"][0].clone();
        (
            runner["limit"].as_integer(),
            runner["request_concurrency"].as_integer(),
        )
    };
    assert_eq!(snippet(&[]), (Some(4), Some(1)));
    assert_eq!(snippet(&["--limit", "100"]), (Some(100), Some(10)));
}

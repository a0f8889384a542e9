//! `flotilla gitlab` as GitLab Runner's Custom executor drives it. The harness plays the
//! runner exactly as its docs and source describe: a per-job temp dir as cwd, the exit-code
//! variables, `JOB_RESPONSE_FILE`, `CUSTOM_ENV_*`, the stages in order, and SIGTERM for
//! cancellation. The fleet is real: loopback sshd machines listed by the static plugin, one
//! real dockerd behind them, and job images pulled from the real CNCF registry (basic auth,
//! credentials from `DOCKER_AUTH_CONFIG`). After every case nothing of the job may be left.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{Flotilla, TOKEN, free_port};
use flotilla_connector::PoolKey;
use flotilla_test_artifacts as guests;
use flotilla_test_support::dockerd::{Dockerd, busybox_rootfs_tar};
use flotilla_test_support::registry::{Mode, Registry, WRITER};
use flotilla_test_support::sshd::Sshd;

/// The fleet, the engine and the registry of one test.
struct Fleet {
    docker: Dockerd,
    _machines: Vec<Sshd>,
    flotilla: Flotilla,
    registry: Registry,
    image: String,
    auth: String,
    token_file: PathBuf,
}

fn docker_cli(docker: &Dockerd, config: &Path, args: &[&str]) -> Output {
    Command::new("docker")
        .arg("-H")
        .arg(format!("unix://{}", docker.socket().display()))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("the docker CLI (docker.io)")
}

fn config(port: u16, key: &Path, machines: &[&Sshd], capacity: u32, extra: &str) -> String {
    let hosts: Vec<String> = machines
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                "{{ id = \"m{}\", address = \"127.0.0.1\", port = {}, username = \"root\" }}",
                i + 1,
                m.port
            )
        })
        .collect();
    format!(
        r#"[server]
listen = "127.0.0.1:{port}"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "5s"

[[pool]]
name = "ci"
plugin = "{plugin}"
capacity_per_instance = {capacity}
max_instances = {n}
instance_acquire_timeout = "60s"
update_interval = "1s"
{extra}
[pool.plugin_config]
hosts = [{hosts}]

[pool.connector]
ssh_key = {{ file = "{key}" }}
docker_socket = "DOCKER_SOCKET"
ping_interval = "2s"

[[pool.policy]]
idle_count = {slots}
idle_time = "1h"
"#,
        plugin = guests::STATIC_PLUGIN,
        n = machines.len(),
        slots = machines.len() as u32 * capacity,
        hosts = hosts.join(", "),
        key = key.display(),
    )
}

impl Fleet {
    async fn start(machines: usize, capacity: u32, extra: &str) -> Fleet {
        let docker = Dockerd::start();
        let registry = Registry::start(Mode::Basic).await;
        let host = registry.host();
        // The job image: a FROM-scratch busybox, pushed to the registry and then removed from
        // the engine, so prepare really pulls it.
        let cli_config = tempfile::tempdir().expect("docker config dir");
        let image = format!("{}/ci/busybox:1", registry.host());
        let rootfs = cli_config.path().join("rootfs.tar");
        std::fs::write(&rootfs, busybox_rootfs_tar()).expect("rootfs");
        let rootfs = rootfs.display().to_string();
        for args in [
            vec!["import", rootfs.as_str(), image.as_str()],
            vec!["login", host.as_str(), "-u", WRITER.0, "-p", WRITER.1],
            vec!["push", image.as_str()],
            vec!["rmi", image.as_str()],
        ] {
            let out = docker_cli(&docker, cli_config.path(), &args);
            assert!(
                out.status.success(),
                "docker {args:?}: {}{}",
                String::from_utf8_lossy(&out.stderr),
                docker.log()
            );
        }
        use base64::Engine as _;
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", WRITER.0, WRITER.1));
        let auth = format!(
            r#"{{"auths":{{"{}":{{"auth":"{basic}"}}}}}}"#,
            registry.host()
        );

        let dir = tempfile::tempdir().expect("dir");
        let key = PoolKey::load_or_generate(&dir.path().join("keys"), "ci").expect("key");
        let key_file = dir.path().join("keys/ci/id_ed25519");
        let sshds: Vec<Sshd> = (0..machines)
            .map(|_| Sshd::start(key.public_openssh()))
            .collect();
        let port = free_port();
        let refs: Vec<&Sshd> = sshds.iter().collect();
        let text = config(port, &key_file, &refs, capacity, extra)
            .replace("DOCKER_SOCKET", &docker.socket().display().to_string());
        let token_file = dir.path().join("token");
        flotilla_test_support::write_secret(&token_file, TOKEN);
        let flotilla = Flotilla::start(dir, &text).await;
        let n = machines;
        flotilla
            .wait_for("/v1/pools/ci/instances", "ready machines", |b| {
                b["instances"]
                    .as_array()
                    .is_some_and(|l| l.iter().filter(|i| i["state"] == "ready").count() == n)
            })
            .await;
        Fleet {
            docker,
            _machines: sshds,
            flotilla,
            registry,
            image,
            auth,
            token_file,
        }
    }

    fn job(&self, id: u64) -> RunnerJob {
        RunnerJob::new(self, id)
    }

    /// Nothing of any job is left on the engine, and no lease in the pool.
    async fn assert_clean(&self) {
        let cli = tempfile::tempdir().expect("dir");
        for what in [
            vec!["ps", "-aq", "--filter", "label=io.flotilla.gitlab.job"],
            vec![
                "network",
                "ls",
                "-q",
                "--filter",
                "label=io.flotilla.gitlab.job",
            ],
            vec![
                "volume",
                "ls",
                "-q",
                "--filter",
                "label=io.flotilla.gitlab.job",
            ],
        ] {
            let out = docker_cli(&self.docker, cli.path(), &what);
            assert!(out.status.success());
            let left = String::from_utf8_lossy(&out.stdout);
            assert!(left.trim().is_empty(), "docker {what:?} left: {left}");
        }
        let (_, body) = self.flotilla.call("GET", "/v1/pools/ci/leases", None).await;
        assert_eq!(body["leases"], Value::Array(Vec::new()), "leases left");
    }
}

/// One job as GitLab Runner runs it: its temp dir, environment and stages.
struct RunnerJob {
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
    args: Vec<String>,
}

/// What a stage did.
#[derive(Debug)]
struct StageResult {
    code: i32,
    stdout: String,
    stderr: String,
}

impl RunnerJob {
    fn new(fleet: &Fleet, id: u64) -> RunnerJob {
        let dir = tempfile::tempdir().expect("job dir");
        let response = dir.path().join("response.json");
        std::fs::write(
            &response,
            format!(
                r#"{{"id": {id}, "token": "glcbt-job-token", "job_info": {{"project_id": 77, "name": "build"}}, "git_info": {{"ref": "main", "protected": false}}}}"#
            ),
        )
        .expect("response file");
        let env = BTreeMap::from([
            ("BUILD_FAILURE_EXIT_CODE".to_string(), "1".to_string()),
            ("SYSTEM_FAILURE_EXIT_CODE".to_string(), "2".to_string()),
            (
                "BUILD_EXIT_CODE_FILE".to_string(),
                dir.path().join("build_exit_code").display().to_string(),
            ),
            (
                "JOB_RESPONSE_FILE".to_string(),
                response.display().to_string(),
            ),
            ("TMPDIR".to_string(), dir.path().display().to_string()),
            ("CUSTOM_ENV_CI_JOB_ID".to_string(), id.to_string()),
            ("CUSTOM_ENV_CI_JOB_IMAGE".to_string(), fleet.image.clone()),
            (
                "CUSTOM_ENV_DOCKER_AUTH_CONFIG".to_string(),
                fleet.auth.clone(),
            ),
        ]);
        let args = vec![
            "gitlab".to_string(),
            "--url".into(),
            fleet.flotilla.base.clone(),
            "--pool".into(),
            "ci".into(),
            "--token-file".into(),
            fleet.token_file.display().to_string(),
            "--acquire-timeout".into(),
            "60s".into(),
        ];
        RunnerJob { dir, env, args }
    }

    fn command(&self, stage: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        cmd.args(&self.args)
            .args(stage)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn stage(&self, stage: &[&str]) -> StageResult {
        let out = self.command(stage).output().expect("flotilla gitlab");
        StageResult {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Writes a stage's script (0700, as the runner does) and returns its path.
    fn script(&self, stage: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(format!("script-{stage}"));
        std::fs::write(&path, format!("#!/usr/bin/env sh\nset -e\n{body}\n")).expect("script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        path.display().to_string()
    }

    fn run(&self, stage: &str, body: &str) -> StageResult {
        let script = self.script(stage, body);
        self.stage(&["run", &script, stage])
    }

    fn build_exit_code(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("build_exit_code")).ok()
    }
}

/// One dockerd at a time: two engines would race for the machine's cgroups.
static DOCKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_in_containers_on_leased_instances_as_gitlab_runner_drives_them() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(2, 4, "").await;

    // config: the JSON the runner reads.
    let job = fleet.job(101);
    let config = job.stage(&["config"]);
    assert_eq!(config.code, 0, "{config:?}");
    let json: Value = serde_json::from_str(&config.stdout).expect("config prints JSON");
    assert_eq!(json["builds_dir"], "/builds");
    assert_eq!(json["builds_dir_is_shared"], false);
    assert_eq!(json["driver"]["name"], "flotilla");

    // A passing job: its output in order, the builds dir shared between stages.
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}\n{}", fleet.flotilla.log());
    assert!(prepare.stdout.contains("Pulling image"), "{prepare:?}");
    assert!(
        prepare.stdout.contains("Running on instance m"),
        "{prepare:?}"
    );
    let sources = job.run(
        "get_sources",
        "mkdir -p /builds/project && echo source > /builds/project/file",
    );
    assert_eq!(sources.code, 0, "{sources:?}");
    let build = job.run(
        "build_script",
        "cat /builds/project/file; for i in 1 2 3 4 5; do echo line $i; done; echo to-stderr >&2",
    );
    assert_eq!(build.code, 0, "{build:?}");
    let expected = "source\nline 1\nline 2\nline 3\nline 4\nline 5\n";
    assert!(build.stdout.contains(expected), "{build:?}");
    // Both streams reach the job log, in the order the script wrote them.
    assert!(build.stdout.contains("line 5\nto-stderr"), "{build:?}");
    let cleanup = job.stage(&["cleanup"]);
    assert_eq!(cleanup.code, 0, "{cleanup:?}");
    fleet.assert_clean().await;
    // cleanup is idempotent.
    assert_eq!(job.stage(&["cleanup"]).code, 0);

    // A failing job: exit 42 reaches BUILD_EXIT_CODE_FILE, the driver exits with the
    // build-failure code, and after_script still runs.
    let job = fleet.job(102);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let build = job.run("build_script", "echo failing; exit 42");
    assert_eq!(build.code, 1, "{build:?}");
    assert_eq!(job.build_exit_code().as_deref(), Some("42\n"));
    let after = job.run("after_script", "echo after");
    assert_eq!(
        (after.code, after.stdout.contains("after")),
        (0, true),
        "{after:?}"
    );
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;

    // A service the job reaches by its alias, on the job's own network.
    let mut job = fleet.job(103);
    job.env.insert(
        "CUSTOM_ENV_CI_JOB_SERVICES".into(),
        format!(
            r#"[{{"name":"{}","alias":"db","entrypoint":["/bin/sh"],"command":["-c","while true; do echo hello-from-db | nc -l -p 5432; done"]}}]"#,
            fleet.image
        ),
    );
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}");
    let build = job.run(
        "build_script",
        "for i in 1 2 3 4 5 6 7 8 9 10; do nc db 5432 && exit 0; sleep 0.5; done; exit 1",
    );
    assert_eq!(build.code, 0, "{build:?}");
    assert!(build.stdout.contains("hello-from-db"), "{build:?}");
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;

    // An image that does not exist: a system failure that says so; cleanup leaves nothing.
    let mut job = fleet.job(104);
    job.env.insert(
        "CUSTOM_ENV_CI_JOB_IMAGE".into(),
        format!("{}/ci/no-such-image:1", fleet.registry.host()),
    );
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 2, "{prepare:?}");
    assert!(
        prepare.stderr.contains("no-such-image") && prepare.stderr.contains("pulling image"),
        "{prepare:?}"
    );
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;

    // Cancellation: SIGTERM during run stops the script; cleanup still works.
    let job = fleet.job(105);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let script = job.script("build_script", "echo started; sleep 300; echo never");
    let child = job
        .command(&["run", &script, "build_script"])
        .spawn()
        .expect("run");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = Instant::now();
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("started") && !stdout.contains("never"),
        "{stdout}"
    );
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;

    // prepare killed while it waits for a slot (every slot is promised to other leases), then
    // cleanup; and a prepare that died right after its reservation, then cleanup.
    let mut held = Vec::new();
    for _ in 0..8 {
        let (code, body) = fleet
            .flotilla
            .call("POST", "/v1/pools/ci/leases", None)
            .await;
        assert_eq!(code, 201, "{body}");
        held.push(body["lease"]["id"].as_u64().expect("id"));
    }
    let job = fleet.job(106);
    let mut child = job.command(&["prepare"]).spawn().expect("prepare");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        child.try_wait().expect("wait").is_none(),
        "prepare must wait for a slot"
    );
    child.kill().expect("SIGKILL prepare");
    let _ = child.wait();
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    let (code, body) = fleet
        .flotilla
        .call(
            "POST",
            "/v1/pools/ci/leases",
            Some(serde_json::json!({"labels": {"gitlab-job": "107"}})),
        )
        .await;
    assert_eq!(code, 429, "the pool is full: {body}");
    let freed = held.pop().expect("a held lease");
    let (code, _) = fleet
        .flotilla
        .call("DELETE", &format!("/v1/pools/ci/leases/{freed}"), None)
        .await;
    assert_eq!(code, 200);
    let (code, body) = fleet
        .flotilla
        .call(
            "POST",
            "/v1/pools/ci/leases",
            Some(serde_json::json!({"labels": {"gitlab-job": "107"}})),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let job = fleet.job(107);
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=107", None)
        .await;
    assert_eq!(
        body["leases"],
        Value::Array(Vec::new()),
        "cleanup unreserves"
    );
    for id in held {
        let (code, _) = fleet
            .flotilla
            .call("DELETE", &format!("/v1/pools/ci/leases/{id}"), None)
            .await;
        assert_eq!(code, 200);
    }
    fleet.assert_clean().await;

    // 8 concurrent jobs on 2 instances x capacity 4: all pass, nothing is left.
    let jobs: Vec<RunnerJob> = (200..208).map(|id| fleet.job(id)).collect();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|job| {
                s.spawn(move || {
                    let prepare = job.stage(&["prepare"]);
                    let build = job.run("build_script", "echo job $(hostname); sleep 1");
                    let cleanup = job.stage(&["cleanup"]);
                    (prepare, build, cleanup)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a job thread"))
            .collect::<Vec<_>>()
    });
    for (prepare, build, cleanup) in &results {
        assert_eq!(prepare.code, 0, "{prepare:?}");
        assert_eq!(build.code, 0, "{build:?}");
        assert_eq!(cleanup.code, 0, "{cleanup:?}");
    }
    let on: std::collections::BTreeSet<String> = results
        .iter()
        .filter_map(|(p, _, _)| {
            p.stdout
                .lines()
                .find_map(|l| l.strip_prefix("Running on instance "))
                .and_then(|l| l.split_whitespace().next())
                .map(str::to_string)
        })
        .collect();
    assert_eq!(on.len(), 2, "both instances took jobs: {on:?}");
    fleet.assert_clean().await;

    // The host counted what the driver reported.
    let (_, metrics) = fleet.flotilla.request("GET", "/metrics", None, None).await;
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    for line in [
        r#"flotilla_jobs_started_total{pool="ci"} 12"#,
        r#"flotilla_jobs_finished_total{outcome="success",pool="ci"} 10"#,
        r#"flotilla_jobs_finished_total{outcome="build-failure",pool="ci"} 1"#,
        r#"flotilla_jobs_finished_total{outcome="cancelled",pool="ci"} 1"#,
        r#"flotilla_image_pull_seconds_count{pool="ci"} 12"#,
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }

    // A restart of flotilla between prepare and run: the static plugin kept its activation in
    // the pool's state, so the lease is bound again to the same machine and the job goes on.
    let job = fleet.job(300);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let mut fleet = fleet;
    fleet.flotilla.restart().await;
    let build = job.run("build_script", "echo after restart");
    assert_eq!(build.code, 0, "{build:?}\n{}", fleet.flotilla.log());
    assert!(build.stdout.contains("after restart"), "{build:?}");
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet
        .flotilla
        .wait_for("/v1/pools/ci/instances", "ready again", |b| {
            b["instances"]
                .as_array()
                .is_some_and(|l| l.iter().filter(|i| i["state"] == "ready").count() == 2)
        })
        .await;
    for id in [301, 302] {
        let next = fleet.job(id);
        assert_eq!(next.stage(&["prepare"]).code, 0);
        assert_eq!(next.run("build_script", "true").code, 0);
        assert_eq!(next.stage(&["cleanup"]).code, 0);
    }
    fleet.assert_clean().await;

    // Docker killed mid-job: a system failure, and the instance is replaced, never reused.
    let job = fleet.job(400);
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0);
    let instance = prepare
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Running on instance "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the instance")
        .to_string();
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/instances", None)
        .await;
    let seen_before = body["instances"]
        .as_array()
        .and_then(|l| l.iter().find(|i| i["id"] == instance.as_str()))
        .and_then(|i| i["seen_at"].as_u64())
        .expect("the job's instance is listed");
    let script = job.script("build_script", "echo working; sleep 300");
    let child = job
        .command(&["run", &script, "build_script"])
        .spawn()
        .expect("run");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = std::fs::read_to_string(fleet.docker.pid_file()).expect("dockerd pid");
    let killed = Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let cleanup = job.stage(&["cleanup"]);
    assert_eq!(cleanup.code, 0, "{cleanup:?}");
    assert!(cleanup.stderr.contains("replaced"), "{cleanup:?}");
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/instances", None)
        .await;
    let view = body["instances"]
        .as_array()
        .and_then(|l| l.iter().find(|i| i["id"] == instance.as_str()).cloned());
    // Failed and deleted: it is gone, listed as failed or deleting, or (the static plugin lists
    // the machine again) a new instance record.
    if let Some(view) = view {
        let replaced = view["seen_at"].as_u64().is_some_and(|t| t > seen_before);
        let failed = view["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("reported broken"));
        assert!(replaced || failed, "{view}");
    }
    assert!(
        fleet.flotilla.log().contains(&format!("\"{instance}\"")),
        "the instance was removed"
    );
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases", None)
        .await;
    assert_eq!(body["leases"], Value::Array(Vec::new()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_use_count_retires_an_instance_after_two_jobs() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 1, "max_use_count = 2\n").await;
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/instances", None)
        .await;
    let first_seen = body["instances"][0]["seen_at"].as_u64().expect("seen_at");
    for id in [500, 501] {
        let job = fleet.job(id);
        let prepare = job.stage(&["prepare"]);
        assert_eq!(prepare.code, 0, "{prepare:?}");
        assert_eq!(job.run("build_script", "true").code, 0);
        assert_eq!(job.stage(&["cleanup"]).code, 0);
    }
    // The instance is retired and deleted; the static plugin lists the machine again, as a
    // new instance with no uses.
    let body = fleet
        .flotilla
        .wait_for("/v1/pools/ci/instances", "the replacement", |b| {
            b["instances"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|i| i["seen_at"].as_u64().is_some_and(|t| t > first_seen))
            })
        })
        .await;
    let m1 = &body["instances"][0];
    assert_eq!(m1["use_count"], 0, "{body}");
    let log = fleet.flotilla.log();
    assert!(log.contains("removing instances"), "{log}");
    fleet.assert_clean().await;
}

/// A rolling update (or a crash) restarts flotilla while GitLab Runner starts a job: prepare
/// waits for the new process instead of failing the job, and the job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_waits_out_a_flotilla_restart_and_the_job_runs() {
    let _one = DOCKER.lock().await;
    let mut fleet = Fleet::start(1, 1, "").await;
    let _ = fleet.flotilla.child.kill();
    let _ = fleet.flotilla.child.wait();

    let job = fleet.job(700);
    let prepare = std::thread::spawn(move || {
        let result = job.stage(&["prepare"]);
        (job, result)
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !prepare.is_finished(),
        "prepare ended while flotilla was down: {:?}",
        prepare.join().map(|(_, r)| r)
    );
    fleet.flotilla.restart().await;
    let (job, result) = prepare.join().expect("prepare thread");
    assert_eq!(result.code, 0, "{result:?}\n{}", fleet.flotilla.log());
    assert!(result.stdout.contains("waiting for it"), "{result:?}");
    assert!(
        result.stdout.contains("Running on instance m1"),
        "{result:?}"
    );
    let build = job.run("build_script", "echo after-the-restart");
    assert_eq!(build.code, 0, "{build:?}");
    assert!(build.stdout.contains("after-the-restart"), "{build:?}");
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

#[test]
fn the_snippet_is_a_runners_block_gitlab_runner_can_read() {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "gitlab",
            "--pool",
            "linux",
            "--token-file",
            "/etc/flotilla/token",
            "snippet",
        ])
        .output()
        .expect("snippet");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let doc: toml::Value = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let runner = &doc["runners"][0];
    assert_eq!(runner["executor"].as_str(), Some("custom"));
    let custom = &runner["custom"];
    for (stage, key) in [
        ("config", "config_args"),
        ("prepare", "prepare_args"),
        ("run", "run_args"),
        ("cleanup", "cleanup_args"),
    ] {
        let args = custom[key].as_array().expect("args");
        assert_eq!(args.last().and_then(|a| a.as_str()), Some(stage));
        assert!(
            args.iter()
                .any(|a| a.as_str() == Some("/etc/flotilla/token"))
        );
    }
    // prepare may wait the whole acquire timeout (10 min by default) before pulling.
    assert!(
        custom["prepare_exec_timeout"]
            .as_integer()
            .is_some_and(|t| t > 600)
    );
}

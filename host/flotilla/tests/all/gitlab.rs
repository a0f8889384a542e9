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

use crate::common;

use std::io::Read;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_harness::poll;
use flotilla_peers::dockerd;
use serde_json::Value;

use common::fleet::{DOCKER, Fleet, RunnerJob};

/// A stage's stdout (the job log), read on a thread as it comes.
struct Printed {
    bytes: Arc<Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Printed {
    /// Takes the child's piped stdout and reads it until it closes.
    fn follow(child: &mut std::process::Child) -> Printed {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let mut pipe = child.stdout.take().expect("a piped stdout");
        let reader = {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                loop {
                    match pipe.read(&mut chunk) {
                        Ok(0) => break,
                        Ok(n) => bytes.lock().unwrap().extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            })
        };
        Printed { bytes, reader }
    }

    /// What was printed so far.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned()
    }

    /// Waits until `line` was printed (the script got that far).
    async fn until(&self, line: &str, limit: Duration) {
        let what = format!("{line:?} in the job log");
        poll::until_true(&what, limit, || self.text().contains(line), || self.text()).await
    }

    /// Everything printed, once the stdout closed.
    fn all(self) -> String {
        self.reader.join().expect("the stdout reader");
        String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned()
    }
}

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

    // Cancellation: SIGTERM during run ends the stage's whole process tree before the driver
    // exits (a background process, one that left the session, one that ignores TERM), so
    // after_script finds none of it; cleanup still works.
    let job = fleet.job(105);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let script = job.script(
        "build_script",
        "sleep 301 & setsid sleep 302 & (trap '' TERM; sleep 303; :) & echo started; sleep 300; echo never",
    );
    let mut child = job
        .command(&["run", &script, "build_script"])
        .spawn()
        .expect("run");
    let printed = Printed::follow(&mut child);
    printed.until("started", Duration::from_secs(10)).await;
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
    let stdout = printed.all();
    assert!(
        stdout.contains("started") && !stdout.contains("never"),
        "{stdout}"
    );
    assert_ne!(out.status.code(), Some(0));
    let after = job.run(
        "after_script",
        "if ps -o pid,args | grep '[s]leep 30[0-3]'; then echo still-running; exit 1; fi; echo none-left",
    );
    assert_eq!(after.code, 0, "{after:?}");
    assert!(after.stdout.contains("none-left"), "{after:?}");
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
    // Deliberate: prepare must not end within this window (it waits for a slot).
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
    let mut child = job
        .command(&["run", &script, "build_script"])
        .spawn()
        .expect("run");
    let printed = Printed::follow(&mut child);
    printed.until("working", Duration::from_secs(10)).await;
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
    let stdout = printed.all();
    assert_eq!(out.status.code(), Some(2), "{out:?}\n{stdout}");
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
    // The killed engine's containers run on under their shims; the engine's drop stops them,
    // so no test run leaves them on the machine.
    let shims = fleet.docker.shims();
    assert_eq!(shims.len(), 2, "the job's two containers");
    drop(fleet);
    let left: Vec<_> = shims.into_iter().filter(|&p| dockerd::running(p)).collect();
    assert!(left.is_empty(), "shims left running: {left:?}");
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
    fleet.flotilla.kill();

    let job = fleet.job(700);
    let prepare = std::thread::spawn(move || {
        let result = job.stage(&["prepare"]);
        (job, result)
    });
    // Deliberate: prepare must not end within this window while flotilla is down.
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

/// The runner is told to start the lean driver. `snippet` run by an installed `flotilla`
/// names the `flotilla-gitlab` beside it, with the flags first; so does `flotilla-gitlab
/// snippet`; an install without the lean binary names `flotilla` with `gitlab` first.
/// Mutation: naming the executable that prints the block fails the first case.
#[test]
fn the_snippet_names_the_lean_driver_beside_an_installed_flotilla() {
    let dir = tempfile::tempdir().expect("dir");
    let installed = |name: &str, from: &str| {
        let to = dir.path().join(name);
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to).expect("install");
        }
        to
    };
    let full = installed("flotilla", env!("CARGO_BIN_EXE_flotilla"));
    let lean = installed("flotilla-gitlab", env!("CARGO_BIN_EXE_flotilla-gitlab"));
    let block = |exe: &std::path::Path, first: &[&str]| -> (String, Vec<String>) {
        let out = Command::new(exe)
            .args(first)
            .args(["--pool", "linux", "--limit", "4", "snippet"])
            .env_clear()
            .output()
            .expect("snippet");
        assert!(out.status.success(), "{out:?}");
        let doc: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("TOML");
        let custom = &doc["runners"][0]["custom"];
        let args = custom["run_args"].as_array().expect("run_args");
        (
            custom["run_exec"].as_str().expect("run_exec").to_string(),
            args.iter()
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect(),
        )
    };
    let lean_path = lean.display().to_string();
    for (exe, first) in [(&full, &["gitlab"][..]), (&lean, &[][..])] {
        let (exec, args) = block(exe, first);
        assert_eq!(exec, lean_path, "{exe:?}");
        assert_eq!(args.first().map(String::as_str), Some("--url"), "{exe:?}");
    }
    std::fs::remove_file(&lean).expect("uninstall the driver");
    let (exec, args) = block(&full, &["gitlab"]);
    assert_eq!(exec, full.display().to_string());
    assert_eq!(args.first().map(String::as_str), Some("gitlab"));
}

/// The driver the runner starts seven times per job carries only the driver: no wasmtime
/// compiler and no server, so a start maps and relocates a fraction of the host's pages (and
/// a stage's RSS is half the full binary's). Mutation: the lean binary able to run the full CLI
/// (`flotilla::cli::Cli`) links the whole host and fails this.
#[test]
fn the_lean_driver_is_a_fraction_of_the_host() {
    let size = |path: &str| std::fs::metadata(path).expect("binary").len();
    let (full, lean) = (
        size(env!("CARGO_BIN_EXE_flotilla")),
        size(env!("CARGO_BIN_EXE_flotilla-gitlab")),
    );
    assert!(
        lean * 3 < full,
        "flotilla-gitlab {lean} bytes, flotilla {full}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla-gitlab"))
        .arg("--help")
        .output()
        .expect("--help");
    let help = String::from_utf8_lossy(&out.stdout);
    for stage in ["config", "prepare", "run", "cleanup", "snippet", "terminal"] {
        assert!(help.contains(stage), "{help}");
    }
}

/// The driver's logger reads `FLOTILLA_LOG` as `target=level` directives, so no regex engine
/// is linked into it: `regex-syntax`'s Unicode tables are pointer tables a static-PIE binary
/// relocates at every start (with them: 21,608 relocations, 163 page faults and 0.47–0.66 ms
/// for `--version`; without: 12,024, 97 and 0.27–0.48 ms). A spec it cannot read leaves the
/// default (warnings), and says so once. Mutation: the lean binary on the host's `EnvFilter`
/// logger (`logging::init`) links `regex-automata` and `regex-syntax`, and fails this.
#[test]
fn the_lean_drivers_logger_links_no_regex_engine_and_says_what_it_cannot_read() {
    let path = env!("CARGO_BIN_EXE_flotilla-gitlab");
    let binary = std::fs::read(path).expect("the lean driver");
    // Every linked crate leaves its source paths in the binary, for panic locations.
    for engine in ["regex-syntax", "regex-automata"] {
        assert!(
            !binary.windows(engine.len()).any(|w| w == engine.as_bytes()),
            "{engine} is linked into {path}"
        );
    }
    let dir = tempfile::tempdir().expect("dir");
    let config = |spec: &str| {
        Command::new(path)
            .args(["--url", "http://127.0.0.1:1", "--pool", "ci", "config"])
            .current_dir(dir.path())
            .env("FLOTILLA_LOG", spec)
            .output()
            .expect("config")
    };
    let refused = config("[stage{job=1}]=debug");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("FLOTILLA_LOG=\"[stage{job=1}]=debug\"")
            && stderr.contains("the driver takes target=level directives"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // A spec it reads is obeyed: `off` silences even the driver's own warnings.
    let off = config("off");
    assert!(off.status.success());
    assert_eq!(String::from_utf8_lossy(&off.stderr), "");
}

/// A tiny deterministic generator for kill points; the seed is printed so a failing round can
/// be replayed (`FLOTILLA_CHAOS_SEED`).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// No job lost to a crash or an upgrade of the host: 10 jobs in every stage, each printing a
/// counter for 20 s, and flotilla killed with SIGKILL (even rounds) or stopped with SIGTERM
/// as a rolling upgrade does (odd rounds: a 5 s drain, then exit with jobs still running) at
/// a random moment, and started again 5 s later.
/// Every job passes, its output is complete and in order, and nothing is left on the machines
/// or in the pool. `FLOTILLA_CHAOS_ROUNDS` rounds (2 by default; the note's figures used 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_jobs_ride_through_a_kill_9_of_the_host() {
    let _one = DOCKER.lock().await;
    let mut fleet = Fleet::start(2, 5, "").await;
    let rounds: u64 = std::env::var("FLOTILLA_CHAOS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let seed = std::env::var("FLOTILLA_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        });
    println!("chaos seed {seed}");
    let mut rng = Lcg(seed);
    let counter = "i=1; while [ $i -le 40 ]; do echo count $i; i=$((i+1)); sleep 0.5; done";
    for round in 0..rounds {
        let jobs: Vec<RunnerJob> = (0..10)
            .map(|j| fleet.job(10_000 + round * 100 + j))
            .collect();
        let threads: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                std::thread::spawn(move || {
                    let prepare = job.stage(&["prepare"]);
                    let build = job.run("build_script", counter);
                    let cleanup = job.stage(&["cleanup"]);
                    (prepare, build, cleanup)
                })
            })
            .collect();
        // Anywhere from the jobs' prepare to their cleanup.
        let kill_at = Duration::from_millis(500 + rng.below(24_000));
        let upgrade = round % 2 == 1;
        println!(
            "round {round}: {} at {kill_at:?}",
            if upgrade { "SIGTERM" } else { "kill -9" }
        );
        // Deliberate: the random moment of the kill, somewhere in the jobs' stages.
        tokio::time::sleep(kill_at).await;
        if upgrade {
            tokio::task::block_in_place(|| fleet.flotilla.terminate());
        } else {
            fleet.flotilla.kill();
        }
        // Deliberate: the host stays down 5 s, the outage the jobs must ride through.
        tokio::time::sleep(Duration::from_secs(5)).await;
        fleet.flotilla.start_again().await;
        for thread in threads {
            let (prepare, build, cleanup) = tokio::task::spawn_blocking(move || thread.join())
                .await
                .expect("join")
                .expect("a job thread");
            assert_eq!(prepare.code, 0, "round {round}, seed {seed}: {prepare:?}");
            assert_eq!(build.code, 0, "round {round}, seed {seed}: {build:?}");
            assert_eq!(cleanup.code, 0, "round {round}, seed {seed}: {cleanup:?}");
            let counted: Vec<&str> = build
                .stdout
                .lines()
                .filter(|l| l.starts_with("count "))
                .collect();
            let expected: Vec<String> = (1..=40).map(|i| format!("count {i}")).collect();
            assert_eq!(counted, expected, "round {round}, seed {seed}: {build:?}");
        }
        fleet.assert_clean().await;
    }
}

/// A host that does not answer at all holds a stage for the restart window only, not for the
/// acquire timeout, and the job fails as a system failure (which the runner may retry); a
/// `run` stage on the lease its `prepare` noted waits out one window, not a second one to ask
/// for the lease.
#[test]
fn a_host_that_never_answers_fails_the_job_after_the_restart_window() {
    let dir = tempfile::tempdir().expect("dir");
    let response = dir.path().join("response.json");
    std::fs::write(&response, r#"{"id": 5, "job_info": {"project_id": 1}}"#).expect("file");
    // A port nothing listens on: bound, then closed.
    let nobody = format!("http://127.0.0.1:{}", reserved_port());
    let scope = flotilla_gitlab::ApiClient::new(&nobody, None, "ci")
        .expect("client")
        .scope();
    std::fs::write(dir.path().join("flotilla-prepared"), format!("{scope} 7\n")).expect("note");
    let script = dir.path().join("script");
    std::fs::write(&script, "true\n").expect("script");
    let script = script.display().to_string();
    for stage in [
        &["prepare"][..],
        &["cleanup"],
        &["run", &script, "build_script"],
    ] {
        let start = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args([
                "gitlab",
                "--url",
                &nobody,
                "--pool",
                "ci",
                "--restart-window",
                "3s",
            ])
            .args(["--acquire-timeout", "10m"])
            .args(stage)
            .env_clear()
            .env("JOB_RESPONSE_FILE", &response)
            .env("CUSTOM_ENV_CI_JOB_IMAGE", "alpine:3")
            .env("BUILD_FAILURE_EXIT_CODE", "1")
            .env("SYSTEM_FAILURE_EXIT_CODE", "2")
            .output()
            .expect("flotilla gitlab");
        let took = start.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stage:?}: {stderr}");
        assert!(stderr.contains("restart window"), "{stage:?}: {stderr}");
        assert!(
            took >= Duration::from_secs(3) && took < Duration::from_millis(5500),
            "{stage:?} took {took:?}"
        );
    }
}

/// A Docker Machine runner, migrated, runs a job: `flotilla migrate docker-machine` writes the
/// `[server]`, the pool with its `[pool.connector]` (the machine's SSH user and port from
/// MachineOptions), and the runner's new `[[runners]]` block; the job runs through that block's
/// arguments against that server. Only the cloud is swapped: the aws plugin's group becomes the
/// static plugin's loopback machine (the AWS plugin itself is tested against moto), and the
/// machine's engine socket is the test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_docker_machine_runner_runs_a_job() {
    let _one = DOCKER.lock().await;
    let work = tempfile::tempdir().expect("dir");
    let out = work.path().join("flotilla.toml");
    // The one test that names the API's port before the process starts: the migration writes
    // it into the runner blocks an operator pastes, as it would for a real host.
    let port = reserved_port();
    let fleet = Fleet::start_with(1, |key, token, sshds| {
        let runner = work.path().join("config.toml");
        std::fs::write(
            &runner,
            format!(
                r#"concurrent = 4
[[runners]]
  name = "ci"
  url = "https://gitlab.example.com"
  token = "glrt-migrated"
  executor = "docker+machine"
  limit = 1
  [runners.docker]
    image = "alpine:3.20"
  [runners.machine]
    IdleCount = 1
    IdleTime = 1800
    MachineDriver = "amazonec2"
    MachineOptions = ["amazonec2-region=eu-west-1", "amazonec2-ami=ami-1", "amazonec2-subnet-id=subnet-1", "amazonec2-ssh-user=root", "amazonec2-ssh-port={}"]
"#,
                sshds[0].port
            ),
        )
        .expect("runner config");
        let migrated = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["migrate", "docker-machine", "--runner-config"])
            .arg(&runner)
            .arg("-o")
            .arg(&out)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--token-file"])
            .arg(token)
            .output()
            .expect("migrate");
        assert!(migrated.status.success(), "{migrated:?}");
        let text = std::fs::read_to_string(&out).expect("migrated config");
        assert!(
            text.contains(&format!("[pool.connector]\nusername = \"root\"\nport = {}\ndocker = true\n", sshds[0].port)),
            "{text}"
        );
        // The cloud swapped for the loopback machine; everything else as migrated.
        let mut kept = Vec::new();
        let mut skipping = false;
        for line in text.lines() {
            if line.starts_with('[') {
                skipping = line == "[[pool.credentials]]" || line == "[pool.plugin_config]";
            }
            if skipping || line.starts_with("allowed_outbound_hosts") {
                continue;
            }
            kept.push(match line {
                "plugin = \"builtin:aws\"" => format!(
                    "plugin = \"{}\"\nupdate_interval = \"1s\"\ninstance_acquire_timeout = \"60s\"",
                    flotilla_test_artifacts::STATIC_PLUGIN
                ),
                "docker = true" => format!(
                    "docker = true\nallowed_ranges = [\"127.0.0.0/8\"]\nssh_key = {{ file = \"{}\" }}\ndocker_socket = \"DOCKER_SOCKET\"\n\n[pool.plugin_config]\nhosts = [{{ id = \"m1\", address = \"127.0.0.1\" }}]",
                    key.display()
                ),
                other => other.to_string(),
            });
        }
        kept.join("\n") + "\n"
    })
    .await;

    // The runner's new block, as the operator pastes it: its stage arguments, as written.
    let blocks =
        std::fs::read_to_string(work.path().join("flotilla.runners.toml")).expect("blocks");
    let parsed: toml::Table = toml::from_str(&blocks).expect("TOML");
    let runner = &parsed["runners"][0];
    assert_eq!(runner["executor"].as_str(), Some("custom"));
    assert_eq!(runner["token"].as_str(), Some("glrt-migrated"));
    let mut args: Vec<String> = runner["custom"]["prepare_args"]
        .as_array()
        .expect("prepare_args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    assert_eq!(args.pop().as_deref(), Some("prepare"));
    assert!(args.contains(&fleet.flotilla.base), "{args:?}");

    let mut job = fleet.job(900);
    // The fleet's own helper image (no registry outside this machine is reachable); a real
    // migrated runner pulls GitLab's.
    let helper = job
        .args
        .iter()
        .position(|a| a == "--helper-image")
        .map(|at| job.args[at..at + 4].to_vec())
        .expect("the fleet's helper flags");
    job.args = args;
    job.args.extend(helper);
    assert_eq!(job.stage(&["config"]).code, 0);
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}\n{}", fleet.flotilla.log());
    let build = job.run("build_script", "echo migrated-job-ran; uname -s");
    assert_eq!(build.code, 0, "{build:?}");
    assert!(build.stdout.contains("migrated-job-ran"), "{build:?}");
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// The host stays down past the driver's restart window while a job's remaining stages and
/// its cleanup run: the stages fail as system failures, the cleanup is queued on the
/// manager, and the first driver call after the host is back (the next job's prepare)
/// finishes it: the lease is released, the job's objects removed, and the one slot is free
/// for the next job. Mutation: without the queue, the next job waits for a slot that never
/// frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_the_host_missed_is_finished_by_the_next_driver_call() {
    let _one = DOCKER.lock().await;
    let mut fleet = Fleet::start(1, 1, "").await;
    let mut job = fleet.job(800);
    job.args
        .extend(["--restart-window".to_string(), "3s".to_string()]);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let build = job.run("build_script", "echo before-the-outage");
    assert_eq!(build.code, 0, "{build:?}");
    fleet.flotilla.kill();
    let after = job.run("after_script", "echo never-reached");
    assert_eq!(after.code, 2, "{after:?}");
    let cleanup = job.stage(&["cleanup"]);
    assert_eq!(cleanup.code, 2, "{cleanup:?}");
    assert!(cleanup.stderr.contains("queued"), "{cleanup:?}");
    let state = fleet.token_file.parent().expect("dir").join("driver-state");
    let notes = || {
        std::fs::read_dir(&state)
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    assert_eq!(notes(), 1, "one queued cleanup");
    // Deliberate: the host stays away well past the restart window.
    tokio::time::sleep(Duration::from_secs(5)).await;
    fleet.flotilla.start_again().await;
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=800", None)
        .await;
    assert_eq!(
        body["leases"][0]["state"]["state"], "acquired",
        "restored from the journal: {body}"
    );
    let next = fleet.job(801);
    let prepare = next.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}\n{}", fleet.flotilla.log());
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=800", None)
        .await;
    assert_eq!(body["leases"], Value::Array(Vec::new()), "released: {body}");
    assert_eq!(notes(), 0, "the note is done");
    let cli = tempfile::tempdir().expect("dir");
    let left = common::fleet::docker_cli(
        &fleet.docker,
        cli.path(),
        &["ps", "-aq", "--filter", "label=io.flotilla.gitlab.job=800"],
    );
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "job 800's container is gone"
    );
    assert_eq!(next.run("build_script", "true").code, 0);
    assert_eq!(next.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// With no driver call at all after a job vanished, its lease fails at the job's own timeout
/// (from the runner's job response) plus the driver's grace, and the slot is free; the next
/// job on the machine removes what the lost job left and gives its failed lease back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_fails_at_the_jobs_timeout_plus_the_grace_with_no_driver_call() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 1, "").await;
    let mut job = fleet.job(850);
    let response = job.dir.path().join("response.json");
    std::fs::write(
        &response,
        r#"{"id": 850, "token": "glcbt-job-token", "job_info": {"project_id": 77}, "runner_info": {"timeout": 2}}"#,
    )
    .expect("response file");
    job.args
        .extend(["--deadline-grace".to_string(), "2s".to_string()]);
    let reserved = Instant::now();
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=850", None)
        .await;
    let lease = &body["leases"][0];
    let deadline = lease["deadline_at"].as_u64().expect("a deadline");
    assert!(
        deadline >= lease["reserved_at"].as_u64().expect("reserved_at") + 4_000,
        "{lease}"
    );
    // The job runs on and never calls the driver again.
    let script = job.script("build_script", "echo running; sleep 300");
    let mut child = job
        .command(&["run", &script, "build_script"])
        .spawn()
        .expect("run");
    let printed = Printed::follow(&mut child);
    printed.until("running", Duration::from_secs(10)).await;
    child.kill().expect("SIGKILL the driver");
    let _ = child.wait();
    let body = fleet
        .flotilla
        .wait_for(
            "/v1/pools/ci/leases?label=gitlab-job=850",
            "the lease failed",
            |b| b["leases"][0]["state"]["state"] == "failed",
        )
        .await;
    assert!(
        reserved.elapsed() >= Duration::from_secs(4),
        "not before the deadline: {body}"
    );
    let cause = body["leases"][0]["state"]["cause"]
        .as_str()
        .unwrap_or_default();
    assert!(cause.contains("deadline"), "{body}");
    // The slot is free: the next job gets the one machine, and removes what 850 left.
    let next = fleet.job(851);
    let prepare = next.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}");
    assert_eq!(next.run("build_script", "true").code, 0);
    assert_eq!(next.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// The docker executor's options reach every container of the job as the docker executor
/// gives them (`createHostConfig`, `createHostConfigForService`): privileged (in a pool that
/// allows it), an extra volume, /dev/shm's size, a device, extra hosts and DNS, on the job's,
/// helper and service containers; a service gets the job's public variables and its own
/// expanded, never a project's masked one (`Build.GetServiceVariables`); and the job's
/// variables are every container's environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_executor_options_and_variables_reach_every_container_of_the_job() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start_with(1, |key, _, sshds| {
        common::fleet::config(key, sshds, 2, "").replace(
            "[pool.connector]\n",
            "[pool.connector]\nallow_privileged = true\n",
        )
    })
    .await;
    let mut job = fleet.job(880);
    job.args.extend(
        [
            "--shm-size",
            "96m",
            "--extra-host",
            "db.example:10.1.2.3",
            "--dns",
            "10.0.0.53",
            "--volume",
            "/opt/extra",
            "--device",
            "/dev/null:/dev/flotilla-null",
        ]
        .map(String::from),
    );
    std::fs::write(
        job.dir.path().join("response.json"),
        r#"{"id": 880, "token": "glcbt-job-token", "job_info": {"project_id": 77},
            "variables": [
              {"key": "POSTGRES_PASSWORD", "value": "from-the-job", "public": true},
              {"key": "DEPLOY_KEY", "value": "project-secret", "public": false, "masked": true},
              {"key": "CI_JOB_ID", "value": "880", "public": true}],
            "services": [{"name": "db", "variables": [{"key": "POSTGRES_DB", "value": "db-$CI_JOB_ID"}]}]}"#,
    )
    .expect("response file");
    job.env.insert(
        "CUSTOM_ENV_CI_JOB_SERVICES".into(),
        format!(
            r#"[{{"name":"{}","alias":"db","entrypoint":["/bin/sh"],"command":["-c","sleep 300"],"variables":{{"POSTGRES_DB":"db-$CI_JOB_ID"}}}}]"#,
            fleet.image
        ),
    );
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}");
    let cli = tempfile::tempdir().expect("dir");
    let inspect = |container: &str| -> Value {
        let out = common::fleet::docker_cli(&fleet.docker, cli.path(), &["inspect", container]);
        assert!(out.status.success(), "{out:?}");
        let all: Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
        all[0].clone()
    };
    for container in [
        "flotilla-job-880",
        "flotilla-job-880-helper",
        "flotilla-job-880-service-0",
    ] {
        let c = inspect(container);
        let host = &c["HostConfig"];
        assert_eq!(host["ShmSize"], 96 << 20, "{container}");
        assert_eq!(host["ExtraHosts"][0], "db.example:10.1.2.3", "{container}");
        assert_eq!(host["Dns"][0], "10.0.0.53", "{container}");
        assert_eq!(
            host["Devices"][0]["PathInContainer"], "/dev/flotilla-null",
            "{container}"
        );
        assert!(
            c["Mounts"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["Destination"] == "/opt/extra")),
            "{container}: {}",
            c["Mounts"]
        );
        let env: Vec<String> = c["Config"]["Env"]
            .as_array()
            .map(|e| {
                e.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            env.contains(&"POSTGRES_PASSWORD=from-the-job".to_string()),
            "{container}: {env:?}"
        );
        let service = container.ends_with("service-0");
        assert_eq!(
            env.contains(&"DEPLOY_KEY=project-secret".to_string()),
            !service,
            "{container}: {env:?}"
        );
        if service {
            assert!(env.contains(&"POSTGRES_DB=db-880".to_string()), "{env:?}");
        }
    }
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;

    // --privileged in a pool that allows it: the containers are created privileged. (Where the
    // tests themselves run without the capabilities, the engine cannot start one: the job then
    // fails at the start, after the host let the request through.)
    let mut privileged = fleet.job(881);
    privileged.args.push("--privileged".into());
    let prepare = privileged.stage(&["prepare"]);
    assert!(
        prepare.code == 0 || prepare.stderr.contains("operation not permitted"),
        "{prepare:?}"
    );
    assert!(!prepare.stderr.contains("not_allowed"), "{prepare:?}");
    assert_eq!(
        inspect("flotilla-job-881")["HostConfig"]["Privileged"],
        true
    );
    assert_eq!(privileged.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// A loopback port that was free a moment ago (bound, then closed). Only for an address that
/// must be known before a process starts; everything else listens on port 0.
fn reserved_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// An operator opens a shell in a running job's container through its lease: commands go in,
/// output and the exit code come back, the host logs who, which job, and the end. A session
/// still open when the job's cleanup ends the lease is cut. A job with no lease is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_opens_a_terminal_in_a_running_jobs_container() {
    use std::io::Write;
    use std::process::Stdio;

    let _one = DOCKER.lock().await;
    // An operator of their own token (a table of [server] may follow the pool's keys).
    let fleet = Fleet::start(
        1,
        1,
        "[[server.operator]]\nname = \"ops-alice\"\ntoken = { value = \"ops-alice-token-5c1e\" }\n",
    )
    .await;
    let job = fleet.job(610);
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}");

    let terminal = |input: &'static [u8]| {
        let mut child = job
            .command(&["terminal", "610", "--who", "alice"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("flotilla gitlab terminal");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input).expect("typed");
        (child, stdin)
    };
    let (child, stdin) = terminal(b"echo in-$(pwd)-$(hostname); exit 3\n");
    drop(stdin);
    let out = child.wait_with_output().expect("the session ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("in-/builds-"), "{stdout}");
    let log = fleet.flotilla.log();
    common::assert_terminal_session_logged(&log, "alice", 610);
    assert!(
        log.contains("token=\"api\"") || log.contains("token=api"),
        "{log}"
    );

    // With an operator's token the log names the token's operator, whatever the client says.
    let dir = tempfile::tempdir().expect("dir");
    let ops_token = dir.path().join("ops-token");
    flotilla_harness::write_secret(&ops_token, "ops-alice-token-5c1e");
    let fleet_token = fleet.token_file.display().to_string();
    let args = job.args.iter().map(|a| {
        if *a == fleet_token {
            ops_token.display().to_string()
        } else {
            a.clone()
        }
    });
    let mut as_operator = Command::new(env!("CARGO_BIN_EXE_flotilla-gitlab"));
    as_operator
        .args(args)
        .args([
            "terminal", "610", "--who", "mallory", "--", "sh", "-c", "exit 0",
        ])
        .current_dir(job.dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(&job.env);
    let out = as_operator.output().expect("the operator's session");
    assert!(out.status.success(), "{out:?}");
    let log = fleet.flotilla.log();
    let opened = log
        .lines()
        .filter(|l| l.contains("terminal session opened"))
        .nth(1)
        .unwrap_or_else(|| panic!("no second session:\n{log}"));
    assert!(
        opened.contains("who=ops-alice")
            && opened.contains("mallory")
            && opened.contains("operator"),
        "{opened}"
    );
    assert!(
        !log.contains("ops-alice-token-5c1e"),
        "the token reached the log"
    );

    // Any stream an operator's token opens through the lease is a session, with or without
    // the terminal's header: here an exec through the Docker handle, as any Docker client
    // opens one.
    let (_, body) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=610", None)
        .await;
    let lease = body["leases"][0]["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("the job's lease: {body}"));
    let api = flotilla_gitlab::api::ApiClient::new(
        &fleet.flotilla.base,
        Some("ops-alice-token-5c1e".into()),
        "ci",
    )
    .expect("a client");
    let docker = flotilla_gitlab::docker::client::for_lease(&api, lease, 60).expect("docker");
    let exec = docker
        .create_exec(
            "flotilla-job-610",
            bollard::exec::CreateExecOptions::<String> {
                attach_stdout: Some(true),
                cmd: Some(vec!["sh".into(), "-c".into(), "echo hi".into()]),
                ..Default::default()
            },
        )
        .await
        .expect("an exec");
    match docker.start_exec(&exec.id, None).await.expect("started") {
        bollard::exec::StartExecResults::Attached { mut output, .. } => {
            use futures_util::StreamExt;
            while output.next().await.is_some() {}
        }
        bollard::exec::StartExecResults::Detached => panic!("the exec was detached"),
    }
    let log = fleet.flotilla.log();
    let opened = log
        .lines()
        .filter(|l| l.contains("terminal session opened"))
        .nth(2)
        .unwrap_or_else(|| panic!("the operator's exec was not logged as a session:\n{log}"));
    assert!(opened.contains("who=ops-alice"), "{opened}");

    // A session left open is cut when the job's cleanup ends the lease.
    let (mut open, stdin) = terminal(b"echo still-here\n");
    let started = Instant::now();
    poll::until_true(
        "the second session to open",
        Duration::from_secs(20),
        || {
            fleet
                .flotilla
                .log()
                .matches("terminal session opened")
                .count()
                == 4
        },
        || fleet.flotilla.log(),
    )
    .await;
    let closed = || {
        fleet
            .flotilla
            .log()
            .matches("terminal session closed")
            .count()
    };
    assert_eq!(closed(), 3, "the ended sessions were logged closed");
    let streams = || async {
        let (_, text) = fleet.flotilla.request("GET", "/metrics", None, None).await;
        String::from_utf8_lossy(&text).lines().find_map(|l| {
            l.strip_prefix("flotilla_docker_streams_open ")?
                .parse::<i64>()
                .ok()
        })
    };
    assert_eq!(streams().await, Some(1), "the open session's stream");
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    let ended = poll::until(
        "the open session to be cut",
        Duration::from_secs(20),
        || {
            let status = open.try_wait().expect("wait");
            async move { status.ok_or("still open") }
        },
    )
    .await;
    drop(stdin);
    assert!(!ended.success(), "a cut session is no success");
    assert!(started.elapsed() < Duration::from_secs(20));
    poll::until_true(
        "the cut session to be logged closed",
        Duration::from_secs(5),
        || closed() == 4,
        || fleet.flotilla.log(),
    )
    .await;
    assert_eq!(streams().await, Some(0), "the cut stream is counted out");

    // No lease, no terminal.
    let out = job.stage(&["terminal", "610"]);
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("job 610 has no lease"), "{out:?}");
    fleet.assert_clean().await;
}

/// The load harness end to end, small: twelve jobs at once, each stage a real `flotilla
/// gitlab` process in the runner's order, against a real `flotilla run`, two sshd machines and
/// the fake engine. Every stage ends 0, the engine is left empty and the pool without leases,
/// every job's four stage runs reached the engine, the server's acquire latencies come from
/// its own histogram, and a driver process runs on one thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_run_drives_every_stage_of_every_job_through_the_real_binary() {
    use flotilla_harness::load::{self, Engine, Options};
    let mut o = Options::new(
        std::path::Path::new(env!("CARGO_BIN_EXE_flotilla")),
        12,
        Engine::Fake,
    );
    o.machines = 2;
    o.capacity = 6;
    o.script_time = Duration::from_secs(1);
    let report = load::run(&o).await;
    let text = report.markdown();
    assert!(report.errors.is_empty(), "{text}");
    assert_eq!(report.engine_stage_runs, Some(12 * 4), "{text}");
    // 31 Docker requests a job (40 before `prepare` listed the instance once), and room for the
    // host's own checks of idle machines.
    assert!(
        report.engine_requests.is_some_and(|r| r <= 12 * 32),
        "{text}"
    );
    // The host keeps a lease's engine connection between its Docker requests: about 6 new
    // connections (SSH channels) a job for 31 requests, where each request opened one.
    let (engine_requests, engine_connections) = (
        report.engine_requests.unwrap_or_default(),
        report.engine_connections.unwrap_or(u64::MAX),
    );
    assert!(
        engine_connections * 3 <= engine_requests,
        "{engine_connections} engine connections for {engine_requests} Docker requests\n{text}"
    );
    // A stage's lease lookup and Docker requests share a kept-alive connection to the API, an
    // exec's upgraded stream takes it over, and `prepare` asks its quick questions (listings,
    // image inspections, the volumes) one after another on it: 10 connections a job for 37
    // requests, where 11 with the volumes made at once, 14 with the questions asked at once,
    // 19 when each upgrade connected anew as well, 21 with a connection of the lookup's own,
    // and 37 with none kept.
    let requests: u64 = report.routes.iter().map(|(_, count, _)| count).sum();
    assert!(
        report.host.connections * 100 <= requests * 28,
        "{} connections for {requests} requests\n{text}",
        report.host.connections
    );
    assert_eq!(report.drivers.processes, 12 * 7, "{text}");
    let acquire = report
        .routes
        .iter()
        .find(|(route, _, _)| route == "POST /v1/pools/{pool}/leases/{id}/acquire")
        .unwrap_or_else(|| panic!("no acquire route in\n{text}"));
    assert_eq!(acquire.1, 12, "{text}");
    assert!(report.to_first_byte.p50 >= report.prepare.p50, "{text}");
    assert!(report.to_first_byte.p99 > Duration::ZERO, "{text}");
    assert!(report.overhead.p50 > Duration::ZERO, "{text}");
    assert_eq!(report.drivers.max_threads, 1, "{text}");
    assert!(
        report.host.peak_rss > 0 && report.drivers.max_rss > 0,
        "{text}"
    );
}

/// The load harness's fleet for one job: this build's host and driver, one loopback machine
/// with a fake engine behind it.
async fn one_fake_machine() -> flotilla_harness::load::Fleet {
    use flotilla_harness::load::{Engine, Fleet, Options};
    let o = Options::new(
        std::path::Path::new(env!("CARGO_BIN_EXE_flotilla")),
        1,
        Engine::Fake,
    );
    Fleet::start(&o).await
}

/// A `run` stage runs on the lease its job's `prepare` noted, without asking the host for it
/// (one request fewer per stage, on the way to every script); when that lease has ended
/// since (released behind the job's back here), the stage asks after all and names that as
/// the cause, a system failure, rather than the Docker handle's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stage_runs_on_the_lease_prepare_noted_and_names_a_lease_gone_since() {
    let fleet = one_fake_machine().await;
    let stage = |args: &[&str]| {
        fleet
            .spawn_stage(11, args)
            .wait_with_output()
            .expect("the driver")
    };
    let prepared = stage(&["prepare"]);
    assert!(prepared.status.success(), "{prepared:?}\n{}", fleet.log());
    let scripts = tempfile::tempdir().expect("dir");
    let script = scripts.path().join("script");
    std::fs::write(&script, "#!/usr/bin/env sh\necho 'prepare_script done'\n").expect("script");
    let script = script.display().to_string();
    let lookups = "/v1/pools/{pool}/leases";
    let before = fleet.answered("GET", lookups).await;
    let ran = stage(&["run", &script, "prepare_script"]);
    let said = String::from_utf8_lossy(&ran.stdout).to_string();
    assert!(ran.status.success(), "{ran:?}\n{}", fleet.log());
    assert!(
        said.contains("flotilla-load: flotilla-prepare_script-"),
        "{said}"
    );
    assert_eq!(
        fleet.answered("GET", lookups).await,
        before,
        "the run stage asked the host for the job's lease"
    );

    fleet.release_lease_of(11).await;
    let ran = stage(&["run", &script, "get_sources"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(ran.status.code(), Some(2), "a system failure: {said}");
    assert!(
        said.contains("the job has no acquired lease; did prepare run?"),
        "{said}"
    );
    let cleaned = stage(&["cleanup"]);
    assert!(cleaned.status.success(), "{cleaned:?}");
}

/// A first `prepare` reserves its lease without looking for one first, and asks the host
/// about every other job it finds on its instance in one lease list (`?label=` repeated), not
/// one request each; it removes what the job whose lease ended left there, and nothing of
/// the live ones. The list answers each named lease once, and refuses more than 100 names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_asks_after_the_other_jobs_on_its_instance_in_one_request() {
    use flotilla_harness::load::{Engine, Fleet, Options};
    // Four jobs' slots on one machine.
    let o = Options::new(
        std::path::Path::new(env!("CARGO_BIN_EXE_flotilla")),
        4,
        Engine::Fake,
    );
    let fleet = Fleet::start(&o).await;
    let engine = &fleet.engines()[0];
    let stage = |id: u64, args: &[&str]| {
        let out = fleet
            .spawn_stage(id, args)
            .wait_with_output()
            .expect("the driver");
        assert!(
            out.status.success(),
            "{id} {args:?}: {out:?}\n{}",
            fleet.log()
        );
    };
    for id in [21, 22, 23] {
        stage(id, &["prepare"]);
    }
    let (code, listed) = fleet
        .api(
            "GET",
            "/v1/pools/ci/leases?label=gitlab-job=21&label=gitlab-job=23&label=gitlab-job=99&label=gitlab-job=21",
            "",
        )
        .await;
    assert_eq!(code, 200, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("lease list");
    let jobs: Vec<&str> = listed["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .filter_map(|l| l["labels"]["gitlab-job"].as_str())
        .collect();
    assert_eq!(jobs, ["21", "23"], "{listed}");
    let many: String = (0..101).map(|i| format!("label=gitlab-job={i}&")).collect();
    let (code, refused) = fleet
        .api("GET", &format!("/v1/pools/ci/leases?{many}"), "")
        .await;
    assert_eq!(code, 400, "{refused}");
    assert!(refused.contains("at most 100"), "{refused}");

    // Job 22's lease ends behind its back: what it left on the machine is a lost job's.
    fleet.release_lease_of(22).await;
    let lookups = "/v1/pools/{pool}/leases";
    let before = fleet.answered("GET", lookups).await;
    stage(24, &["prepare"]);
    // One lookup, for the three others: a first prepare reserves its lease at once.
    assert_eq!(fleet.answered("GET", lookups).await - before, 1);
    let names: Vec<String> = engine.with(|s| s.containers.keys().cloned().collect());
    let of = |job: &str| {
        names
            .iter()
            .any(|n| n.contains(&format!("flotilla-job-{job}")))
    };
    assert!(
        !of("22"),
        "what the ended job left is still there: {names:?}"
    );
    assert!(
        of("21") && of("23") && of("24"),
        "a live job's containers went: {names:?}"
    );
    for id in [21, 23, 24] {
        stage(id, &["cleanup"]);
    }
    stage(22, &["cleanup"]);
}

/// A `prepare` killed while the engine is still creating the job's containers leaves nothing
/// once `cleanup` has run: the containers land after the kill, and cleanup's second sweep
/// (which only a `prepare` that finished lets it skip) removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_killed_mid_creation_leaves_nothing_after_cleanup() {
    let fleet = one_fake_machine().await;
    let engine = &fleet.engines()[0];
    engine.with_mut(|s| s.create_delay = Duration::from_secs(1));
    let mut prepare = fleet.spawn_stage(5, &["prepare"]);
    poll::until(
        "both containers' creation under way",
        Duration::from_secs(30),
        || async {
            match engine.with(|s| s.creating) {
                2 => Ok(()),
                n => Err(format!("{n} creating\n{}", fleet.log())),
            }
        },
    )
    .await;
    assert!(
        engine.with(|s| s.containers.is_empty()),
        "the creation should still be in flight"
    );
    prepare.kill().expect("kill prepare");
    let _ = prepare.wait();
    let cleanup = fleet
        .spawn_stage(5, &["cleanup"])
        .wait_with_output()
        .expect("cleanup");
    assert!(cleanup.status.success(), "{cleanup:?}");
    poll::until(
        "the killed creations to land",
        Duration::from_secs(10),
        || async {
            match engine.with(|s| s.created) {
                2 => Ok(()),
                n => Err(format!("{n} created")),
            }
        },
    )
    .await;
    let left: Vec<String> = engine.with(|s| s.containers.keys().cloned().collect());
    assert!(
        left.is_empty(),
        "left on the engine after cleanup: {left:?}"
    );
}

/// A first `prepare` on an instance that holds nothing of its job removes nothing (its
/// listing showed there is nothing to remove); a `prepare` of the same job again, as the
/// runner retries one, finds the first one's objects and starts from a clean slate; cleanup
/// then leaves nothing, and deletes only what is there by name or id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_prepare_removes_nothing_and_a_retried_one_starts_clean() {
    let fleet = one_fake_machine().await;
    let engine = &fleet.engines()[0];
    let stage = |args: &[&str]| {
        let out = fleet
            .spawn_stage(7, args)
            .wait_with_output()
            .expect("the driver");
        assert!(out.status.success(), "{args:?}: {out:?}\n{}", fleet.log());
        engine.with_mut(|s| std::mem::take(&mut s.log))
    };
    engine.with_mut(|s| s.log.clear());
    let first = stage(&["prepare"]);
    let deletes: Vec<&String> = first.iter().filter(|r| r.starts_with("DELETE")).collect();
    assert!(deletes.is_empty(), "a first prepare deleted {deletes:?}");
    let made = |s: &flotilla_peers::fake_engine::EngineState| {
        let mut names: Vec<String> = s.containers.keys().cloned().collect();
        names.extend(s.networks.keys().cloned());
        names
    };
    let after_first = engine.with(made);
    assert_eq!(after_first.len(), 3, "{after_first:?}");

    let again = stage(&["prepare"]);
    let removed: Vec<&String> = again.iter().filter(|r| r.starts_with("DELETE")).collect();
    let by_id = removed
        .iter()
        .filter(|r| r.starts_with("DELETE /containers/") && !r.contains("flotilla-job-7"))
        .count();
    assert_eq!(by_id, 2, "the retried prepare removed {removed:?}");
    assert!(
        removed
            .iter()
            .any(|r| *r == "DELETE /networks/flotilla-job-7"),
        "the retried prepare removed {removed:?}"
    );
    assert_eq!(engine.with(made), after_first);

    let cleanup = stage(&["cleanup"]);
    let deleted: Vec<&String> = cleanup.iter().filter(|r| r.starts_with("DELETE")).collect();
    // The two containers by id, the network, and a builds volume older drivers made per job.
    assert_eq!(deleted.len(), 4, "{cleanup:?}");
    let left = engine.with(made);
    assert!(left.is_empty(), "left after cleanup: {left:?}");
}

/// `prepare` bounds the volumes jobs share on its instance: a project cache volume older than
/// `--cache-max-age` goes, then the oldest beyond `--cache-max-volumes`; the job's own stay,
/// and so does every volume flotilla did not make, however old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_bounds_the_shared_volumes_and_leaves_other_volumes_alone() {
    use flotilla_peers::fake_engine::Object;
    let fleet = one_fake_machine().await;
    let engine = &fleet.engines()[0];
    let now = chrono::Utc::now();
    let aged = |name: &str, days: i64, labels: &[(&str, &str)]| {
        let mut o = Object::new(
            format!("{name}-id"),
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        o.created = now - chrono::Duration::days(days);
        (name.to_string(), o)
    };
    let cache = |project: &'static str| {
        [
            ("io.flotilla.gitlab.cache", project),
            ("io.flotilla.gitlab.cache.kind", "cache"),
            ("io.flotilla.gitlab.cache.protected", "false"),
        ]
    };
    engine.with_mut(|s| {
        s.volumes.extend([
            aged("flotilla-cache-project-90", 30, &cache("90")),
            aged("flotilla-cache-project-91", 3, &cache("91")),
            aged("flotilla-cache-project-92", 2, &cache("92")),
            aged("flotilla-cache-project-93", 1, &cache("93")),
            aged("someone-elses", 400, &[]),
            aged(
                "labelled-by-another-tool",
                400,
                &[("com.example.keep", "yes")],
            ),
        ]);
    });
    let out = fleet
        .spawn_stage(8, &["--cache-max-volumes", "3", "prepare"])
        .wait_with_output()
        .expect("the driver");
    assert!(out.status.success(), "{out:?}\n{}", fleet.log());
    let mut left: Vec<String> = engine.with(|s| s.volumes.keys().cloned().collect());
    // The job's own: its slot's builds volume and its project's (1001) cache.
    left.retain(|name| !name.starts_with("runner-") && name != "flotilla-cache-project-1001");
    assert_eq!(
        left,
        [
            "flotilla-cache-project-92",
            "flotilla-cache-project-93",
            "labelled-by-another-tool",
            "someone-elses",
        ],
        "the 30-day-old cache goes for its age, the 3-day-old one as the oldest beyond the count"
    );
}

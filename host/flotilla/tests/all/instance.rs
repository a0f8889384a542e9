//! `flotilla gitlab --mode instance`: each job runs directly on its leased machine over the
//! host's SSH session, as GitLab's instance executor runs macOS, Windows and one-VM-per-job
//! Linux jobs. The harness plays GitLab Runner's Custom executor (see `gitlab.rs`); the
//! machines are real Debian sshd daemons on loopback, listed by the static plugin, with no
//! Docker at all. A job's processes run on this host, so the tests look for leftovers in
//! /proc by the mark every process of a job carries.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use flotilla_harness::poll;
use serde_json::Value;

use common::fleet::RunnerJob;
use common::machines::{Machines, exists, processes_of_job, wait_no_processes};

/// A bash script as GitLab Runner writes one for the Custom executor.
fn bash(body: &str) -> String {
    format!("#!/usr/bin/env bash\nset -eo pipefail\n{body}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_on_the_machine_itself_as_gitlab_runner_drives_them() {
    let fleet = Machines::start(1, 2, "").await;
    let dir = fleet.job_dir(301);

    // config: the job's own builds directory on the machine, its project's cache, bash.
    let job = fleet.job(301);
    let config = job.stage(&["config"]);
    assert_eq!(config.code, 0, "{config:?}");
    let json: Value = serde_json::from_str(&config.stdout).expect("config prints JSON");
    assert_eq!(json["builds_dir"], format!("{}/builds", dir.display()));
    assert_eq!(
        json["cache_dir"],
        format!("{}/cache/project-77", fleet.machine_dir.display())
    );
    assert_eq!(json["builds_dir_is_shared"], false);
    assert_eq!(json["shell"], "bash");

    // prepare: the lease, and the job's directory (0700: it will hold the job's scripts).
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}\n{}", fleet.flotilla.log());
    assert!(
        prepare.stdout.contains("Running on instance m1"),
        "{prepare:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join(".flotilla"))
        .expect("the job's own directory")
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");

    // A passing job: the builds dir kept between stages, the job's directory as cwd, both
    // streams, and awkward text in variables and output, byte for byte.
    let builds = json["builds_dir"].as_str().expect("builds_dir");
    let sources = job.stage(&[
        "run",
        &job.script_file(
            "get_sources",
            &bash(&format!(
                "mkdir -p '{b}/project' && echo source > '{b}/project/file'",
                b = builds.replace('\'', r"'\''")
            )),
        ),
        "get_sources",
    ]);
    assert_eq!(sources.code, 0, "{sources:?}");
    let awkward = "it's \"quoted\" $HOME `id` \\ ünï ✓";
    let quoted = format!("'{}'", awkward.replace('\'', r"'\''"));
    let script = bash(&format!(
        "export AWKWARD={q}\ncat \"$PWD/builds/project/file\"\npwd\nfor i in 1 2 3; do echo line $i; done\necho to-stderr >&2\nprintf '%s\\n' \"$AWKWARD\"\necho \"mark=$FLOTILLA_JOB\"",
        q = quoted
    ));
    let build = job.stage(&[
        "run",
        &job.script_file("build_script", &script),
        "build_script",
    ]);
    assert_eq!(build.code, 0, "{build:?}");
    let expected = format!("source\n{}\nline 1\nline 2\nline 3\n", dir.display());
    assert!(build.stdout.contains(&expected), "{build:?}");
    // Standard error shares the job log with standard output, in the order written (as in
    // Docker mode; GitLab Runner merges them anyway).
    assert!(build.stdout.contains("line 3\nto-stderr\n"), "{build:?}");
    assert!(build.stdout.contains(&format!("{awkward}\n")), "{build:?}");
    assert!(build.stdout.contains("mark=job-301;"), "{build:?}");

    // Large and binary output arrives whole and unchanged.
    let blob = dir.join("blob.bin");
    let big = job.stage_raw(&[
        "run",
        &job.script_file(
            "step_big",
            &bash(&format!(
                "head -c 3000000 /dev/urandom > {b}\ncat {b}",
                b = format!("'{}'", blob.display().to_string().replace('\'', r"'\''"))
            )),
        ),
        "step_big",
    ]);
    assert_eq!(big.status.code(), Some(0));
    let written = std::fs::read(&blob).expect("the blob on the machine");
    assert_eq!(written.len(), 3_000_000);
    assert!(
        big.stdout.ends_with(&written),
        "stdout is {} bytes, not the 3,000,000 written",
        big.stdout.len()
    );

    // A failing job: its exit code reaches BUILD_EXIT_CODE_FILE; after_script still runs.
    let fail = job.stage(&[
        "run",
        &job.script_file("build_script2", &bash("echo failing; exit 42")),
        "build_script",
    ]);
    assert_eq!(fail.code, 1, "{fail:?}");
    assert_eq!(job.build_exit_code().as_deref(), Some("42\n"));
    let after = job.stage(&[
        "run",
        &job.script_file("after_script", &bash("echo after")),
        "after_script",
    ]);
    assert_eq!(
        (after.code, after.stdout.contains("after")),
        (0, true),
        "{after:?}"
    );

    // A stage whose directory vanished from the machine is a system failure that says so,
    // never a job failure with some shell's exit code.
    std::fs::remove_dir_all(&dir).expect("remove the job's directory");
    let lost = job.stage(&[
        "run",
        &job.script_file("build_script3", &bash("echo never")),
        "build_script",
    ]);
    assert_eq!(lost.code, 2, "{lost:?}");
    assert!(
        lost.stderr.contains("placing the build_script script"),
        "{lost:?}"
    );
    assert!(!lost.stdout.contains("never"), "{lost:?}");

    // cleanup: the job's directory is gone, the project's cache stays, the lease is back.
    let cleanup = job.stage(&["cleanup"]);
    assert_eq!(cleanup.code, 0, "{cleanup:?}");
    assert!(!exists(&dir), "the job's directory is left");
    assert!(exists(&fleet.machine_dir.join("cache/project-77")));
    fleet.assert_no_lease().await;
    assert_eq!(job.stage(&["cleanup"]).code, 0, "cleanup is idempotent");

    // A driver set up for Windows machines refuses this Linux one in prepare, and says so.
    let mut windows = fleet.job(302);
    windows.args.extend(["--os".into(), "windows".into()]);
    let cut = windows
        .args
        .iter()
        .position(|a| a == "--machine-dir")
        .expect("dir");
    windows.args.drain(cut..cut + 2);
    let prepare = windows.stage(&["prepare"]);
    assert_eq!(prepare.code, 2, "{prepare:?}");
    assert!(
        prepare.stderr.contains("runs linux") && prepare.stderr.contains("--os windows"),
        "{prepare:?}"
    );
    assert_eq!(windows.stage(&["cleanup"]).code, 0);
    fleet.assert_no_lease().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_step_leaves_no_process_of_the_job_behind() {
    let fleet = Machines::start(1, 1, "").await;
    let job = fleet.job(310);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    // A background process in the step's group, one that left it (setsid), and one that
    // ignores TERM.
    let script = job.script_file(
        "build_script",
        &bash(
            "sleep 301 &\nsetsid sleep 302 &\n(trap '' TERM; sleep 303) &\necho started\nsleep 300\necho never",
        ),
    );
    let mut child = job
        .command(&["run", &script, "build_script"])
        .spawn()
        .expect("run");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("a line").expect("text");
    assert_eq!(first, "started");
    // All four sleeps and the script's shell are up and carry the job's mark.
    poll::until_true(
        "the four sleeps of job 310",
        Duration::from_secs(10),
        || {
            processes_of_job(310)
                .iter()
                .filter(|(_, c)| c.starts_with("sleep "))
                .count()
                >= 4
        },
        || format!("{:?}", processes_of_job(310)),
    )
    .await;
    // The runner cancels: SIGTERM to the driver.
    let pid = child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let status = child.wait().expect("wait");
    assert_eq!(
        status.code(),
        Some(2),
        "a cancelled stage is a system failure"
    );
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!rest.iter().any(|l| l == "never"), "{rest:?}");
    // The driver ended the stage before it exited, so after_script would find none of it.
    assert!(
        processes_of_job(310).is_empty(),
        "{:?}",
        processes_of_job(310)
    );
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    assert!(!exists(&fleet.job_dir(310)));
    fleet.assert_no_lease().await;

    // A script that traps TERM to clean up gets its grace period before KILL comes.
    let job = fleet.job(311);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let script = job.script_file(
        "build_script",
        &bash("trap 'sleep 1; touch \"$PWD/cleaned-up\"; exit 143' TERM\necho started\nsleep 300"),
    );
    let mut child = job
        .command(&["run", &script, "build_script"])
        .spawn()
        .expect("run");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("a line").expect("text"), "started");
    let pid = child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    assert_eq!(child.wait().expect("wait").code(), Some(2));
    assert!(
        exists(&fleet.job_dir(311).join("cleaned-up")),
        "the script's TERM trap did not get to finish"
    );
    wait_no_processes(311, Duration::from_secs(5));
    assert_eq!(job.stage(&["cleanup"]).code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_jobs_share_four_slots_and_all_pass() {
    let fleet = Machines::start(2, 2, "").await;
    let shared = fleet.root.path().join("running");
    std::fs::create_dir_all(&shared).expect("dir");
    let counts = fleet.root.path().join("counts");
    let jobs: Vec<_> = (0..10u64).map(|i| fleet.job(400 + i)).collect();
    let results: Vec<(u64, i32, i32, i32, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let shared = shared.clone();
                let counts = counts.clone();
                scope.spawn(move || {
                    let id = 400 + i as u64;
                    let prepare = job.stage(&["prepare"]);
                    let script = job.script_file(
                        "build_script",
                        &bash(&format!(
                            "mkdir {s}/{id}\nls {s} | wc -l >> {c}\nsleep 1\nrmdir {s}/{id}\necho done-{id}",
                            s = shared.display(),
                            c = counts.display()
                        )),
                    );
                    let build = job.stage(&["run", &script, "build_script"]);
                    let cleanup = job.stage(&["cleanup"]);
                    (id, prepare.code, build.code, cleanup.code, build.stdout)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("job thread"))
            .collect()
    });
    for (id, prepare, build, cleanup, out) in &results {
        assert_eq!((*prepare, *build, *cleanup), (0, 0, 0), "job {id}: {out}");
        assert!(out.contains(&format!("done-{id}")), "job {id}: {out}");
    }
    let counts = std::fs::read_to_string(&counts).expect("counts");
    let most = counts
        .lines()
        .map(|l| l.trim().parse::<u32>().expect("a count"))
        .max()
        .expect("counts");
    assert!(most <= 4, "{most} jobs ran at once on 4 slots");
    assert!(most >= 2, "the slots were never shared ({most})");
    fleet.assert_no_lease().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_during_prepare_is_cleaned_up_after() {
    let fleet = Machines::start(1, 1, "").await;
    // The only slot is taken, so this prepare waits for one when it is killed.
    let holder = fleet.job(500);
    assert_eq!(holder.stage(&["prepare"]).code, 0);
    let waiting = fleet.job(501);
    let mut child = waiting.command(&["prepare"]).spawn().expect("prepare");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = out.next().expect("a line").expect("text");
    assert!(line.contains("is full"), "{line}");
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    assert_eq!(waiting.stage(&["cleanup"]).code, 0);
    assert_eq!(holder.stage(&["cleanup"]).code, 0);
    // Killed between its reservation and its acquire: cleanup gives the reservation back.
    let (code, body) = fleet
        .flotilla
        .call(
            "POST",
            "/v1/pools/ci/leases",
            Some(serde_json::json!({"labels": {"gitlab-job": "503"}})),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(fleet.job(503).stage(&["cleanup"]).code, 0);
    let (_, left) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=503", None)
        .await;
    assert_eq!(
        left["leases"],
        Value::Array(vec![]),
        "the reservation is left"
    );

    // Killed mid-way through an acquired prepare: cleanup removes what it made.
    let job = fleet.job(502);
    let mut child = job.command(&["prepare"]).spawn().expect("prepare");
    let start = Instant::now();
    while !exists(&fleet.job_dir(502)) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "prepare made no directory"
        );
        // Deliberate: checks every 5 ms, finer than the shared poll, to kill prepare mid-way.
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    assert!(!exists(&fleet.job_dir(502)), "the job's directory is left");
    fleet.assert_no_lease().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_dies_mid_job_is_a_system_failure_and_is_replaced() {
    let fleet = Machines::start(1, 1, "").await;
    let (_, before) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/instances", None)
        .await;
    let first_seen = before["instances"][0]["seen_at"].as_u64().expect("seen_at");
    let job = fleet.job(600);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let script = job.script_file("build_script", &bash("echo started\nsleep 300"));
    let mut child = job
        .command(&["run", &script, "build_script"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("line").expect("text"), "started");
    // The machine dies: its sshd and every session it started.
    fleet.machines[0].stop();
    let out = child.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a dead machine is a system failure"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the machine went away during build_script"),
        "{err}"
    );
    // cleanup cannot reach it: it releases the lease as broken, and the instance goes.
    let cleanup = job.stage(&["cleanup"]);
    assert_eq!(cleanup.code, 0, "{cleanup:?}");
    assert!(cleanup.stderr.contains("reported broken"), "{cleanup:?}");
    fleet.assert_no_lease().await;
    let log = fleet.flotilla.log();
    assert!(
        log.contains("instance_broken") || log.contains("broken"),
        "{log}"
    );
    // The machine comes back: the static plugin lists it as a new instance, ready again.
    fleet.machines[0].restart();
    fleet
        .flotilla
        .wait_for("/v1/pools/ci/instances", "the replacement", |b| {
            b["instances"].as_array().is_some_and(|l| {
                l.iter().any(|i| {
                    i["state"] == "ready" && i["seen_at"].as_u64().is_some_and(|t| t > first_seen)
                })
            })
        })
        .await;
    let again = fleet.job(601);
    assert_eq!(again.stage(&["prepare"]).code, 0);
    let build = again.stage(&[
        "run",
        &again.script_file("build_script", &bash("echo back")),
        "build_script",
    ]);
    assert_eq!(build.code, 0, "{build:?}");
    assert_eq!(again.stage(&["cleanup"]).code, 0);
    // The machine took the job's processes with it (the loopback one kills its whole tree).
    wait_no_processes(600, Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_use_count_1_each_job_gets_a_fresh_machine() {
    let fleet = Machines::start(1, 1, "max_use_count = 1\n").await;
    let mut seen = Vec::new();
    for id in [700u64, 701, 702] {
        let job = fleet.job(id);
        let prepare = job.stage(&["prepare"]);
        assert_eq!(prepare.code, 0, "{prepare:?}\n{}", fleet.flotilla.log());
        let (_, leases) = fleet
            .flotilla
            .call(
                "GET",
                &format!("/v1/pools/ci/leases?label=gitlab-job={id}"),
                None,
            )
            .await;
        assert_eq!(
            leases["leases"][0]["state"]["state"], "acquired",
            "{leases}"
        );
        let (_, instances) = fleet
            .flotilla
            .call("GET", "/v1/pools/ci/instances", None)
            .await;
        let mine = instances["instances"]
            .as_array()
            .expect("instances")
            .iter()
            .find(|i| i["use_count"] == 1)
            .cloned()
            .unwrap_or_else(|| panic!("no used instance: {instances}"));
        seen.push(mine["seen_at"].as_u64().expect("seen_at"));
        let build = job.stage(&[
            "run",
            &job.script_file("build_script", &bash("echo hi")),
            "build_script",
        ]);
        assert_eq!(build.code, 0, "{build:?}");
        assert_eq!(job.stage(&["cleanup"]).code, 0);
    }
    // Three jobs, three instances: each one was new when its job came.
    seen.dedup();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(fleet.flotilla.log().contains("removing instances"));
}

/// The instance a prepared job's lease holds.
async fn instance_of(fleet: &Machines, id: u64) -> String {
    let (_, leases) = fleet
        .flotilla
        .call(
            "GET",
            &format!("/v1/pools/ci/leases?label=gitlab-job={id}"),
            None,
        )
        .await;
    leases["leases"][0]["state"]["instance"]
        .as_str()
        .unwrap_or_else(|| panic!("job {id} holds no instance: {leases}"))
        .to_string()
}

/// Two machines of one slot each. A machine that ran a job of project 1 never runs a job of
/// project 2, nor of project 1's protected refs (a fork's merge request and the protected
/// branch are two tenants): they share the login user, so the first could plant what the
/// second runs. Project 2's job gets the other machine, though the first is free and would
/// come first; project 1's next job gets its own machine again. The bindings show in the
/// instances API. (Both machines are this host, so only where jobs land can be told apart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_ran_one_projects_job_never_runs_anothers() {
    let fleet = Machines::start(2, 1, "").await;
    let ran = |job: &RunnerJob| {
        let build = job.run("build_script", &bash("echo hi"));
        assert_eq!(build.code, 0, "{build:?}");
        assert_eq!(job.stage(&["cleanup"]).code, 0);
    };
    let first = fleet.job_of(9101, 1, false);
    let prepared = first.stage(&["prepare"]);
    assert_eq!(prepared.code, 0, "{prepared:?}");
    assert!(
        format!("{}{}", prepared.stdout, prepared.stderr).contains("serves project-1 only"),
        "prepare does not say what sharing the machine means: {prepared:?}"
    );
    let mine = instance_of(&fleet, 9101).await;
    ran(&first);

    let other = fleet.job_of(9102, 2, false);
    let prepared = other.stage(&["prepare"]);
    assert_eq!(prepared.code, 0, "{prepared:?}\n{}", fleet.flotilla.log());
    let theirs = instance_of(&fleet, 9102).await;
    assert_ne!(theirs, mine, "project 2 got project 1's machine");
    ran(&other);

    let again = fleet.job_of(9103, 1, false);
    assert_eq!(again.stage(&["prepare"]).code, 0);
    assert_eq!(instance_of(&fleet, 9103).await, mine);
    ran(&again);

    let (_, instances) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/instances", None)
        .await;
    let tenants: std::collections::BTreeMap<String, String> = instances["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap_or_default().to_string(),
                i["tenant"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(tenants.get(&mine).map(String::as_str), Some("project-1"));
    assert_eq!(tenants.get(&theirs).map(String::as_str), Some("project-2"));

    // Project 1's protected branch: no free machine it may take, so it waits for a new one
    // (the pool is at its maximum of two here) rather than take project 1's.
    let protected = fleet.job_of(9104, 1, true);
    let mut child = protected
        .command(&["prepare"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prepare");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the protected ref's job got a machine of an unprotected one"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Frames of an exec answer: stdout, stderr, and the last frame's kind and payload.
fn read_frames(body: &[u8]) -> (Vec<u8>, Vec<u8>, Option<(u8, String)>) {
    use flotilla_api::exec::{Decoder, FrameKind};
    let mut d = Decoder::default();
    d.push(body);
    let (mut out, mut err, mut last) = (Vec::new(), Vec::new(), None);
    while let Some((kind, payload)) = d.next_frame().expect("frames") {
        match kind {
            FrameKind::Stdout => out.extend(payload),
            FrameKind::Stderr => err.extend(payload),
            other => last = Some((other as u8, String::from_utf8_lossy(&payload).into_owned())),
        }
    }
    assert_eq!(d.pending(), 0, "a cut frame");
    (out, err, last)
}

/// The exec endpoint from the caller's hostile side: only the holder of an acquired lease of
/// the pool, with the token, runs anything; bad bodies are refused; the command's channel
/// ends with the lease and the command is sent KILL; the token never reaches the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exec_endpoint_serves_only_an_acquired_lease_and_ends_with_it() {
    use base64::Engine as _;
    let fleet = Machines::start(1, 2, "").await;
    let f = &fleet.flotilla;
    let exec = |id: u64| format!("/v1/pools/ci/leases/{id}/exec");
    let body = |command: &str, stdin: &[u8]| {
        serde_json::json!({
            "command": command,
            "stdin_base64": base64::engine::general_purpose::STANDARD.encode(stdin),
        })
    };
    let (_, reserved) = f
        .call("POST", "/v1/pools/ci/leases", Some(serde_json::json!({})))
        .await;
    let id = reserved["lease"]["id"].as_u64().expect("id");

    // Before the lease is acquired: nothing runs.
    let (code, answer) = f.call("POST", &exec(id), Some(body("true", b""))).await;
    assert_eq!(
        (code, answer["error"]["code"].as_str()),
        (409, Some("not_acquired")),
        "{answer}"
    );
    let (code, _) = f
        .call("POST", &exec(id + 999), Some(body("true", b"")))
        .await;
    assert_eq!(code, 404);
    let (code, answer) = f
        .call(
            "POST",
            &format!("/v1/pools/other/leases/{id}/exec"),
            Some(body("true", b"")),
        )
        .await;
    assert_eq!(
        (code, answer["error"]["code"].as_str()),
        (404, Some("unknown_pool"))
    );
    let (code, _) = f
        .call("POST", &format!("/v1/pools/ci/leases/{id}/acquire"), None)
        .await;
    assert_eq!(code, 200);
    // Without the token, or with another: refused.
    for token in [None, Some("not-the-token")] {
        let raw = body("touch /tmp/flotilla-exec-unauthorized", b"").to_string();
        let (code, _) = f.request("POST", &exec(id), Some(raw.into()), token).await;
        assert_eq!(code, 401);
    }
    assert!(!exists(std::path::Path::new(
        "/tmp/flotilla-exec-unauthorized"
    )));
    // Malformed bodies.
    for bad in [
        "not json".to_string(),
        serde_json::json!({"command": "  "}).to_string(),
        serde_json::json!({"command": "true", "stdin_base64": "!!"}).to_string(),
        serde_json::json!({"command": "true", "env": {"A": "1"}}).to_string(),
    ] {
        let (code, answer) = f
            .request(
                "POST",
                &exec(id),
                Some(bad.clone().into()),
                Some(common::TOKEN),
            )
            .await;
        let answer: Value = serde_json::from_slice(&answer).unwrap_or_default();
        assert_eq!(
            (code, answer["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{bad}: {answer}"
        );
    }

    // The holder runs a command: stdin in, both streams and the status out; the API token is
    // nowhere in the command's environment.
    let (code, answer) = f
        .request(
            "POST",
            &exec(id),
            Some(
                body("cat; echo to-err >&2; env; exit 7", b"in\x00put\n")
                    .to_string()
                    .into(),
            ),
            Some(common::TOKEN),
        )
        .await;
    assert_eq!(code, 200);
    let (out, err, last) = read_frames(&answer);
    assert!(
        out.starts_with(b"in\x00put\n"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(err, b"to-err\n");
    assert_eq!(last, Some((3, r#"{"status":7}"#.to_string())));
    assert!(!String::from_utf8_lossy(&out).contains(common::TOKEN));

    // A command still running when the lease ends is killed, and its stream says why.
    let request = f
        .client
        .post(format!("{}{}", f.base, exec(id)))
        .bearer_auth(common::TOKEN)
        .body(body("echo up; exec sleep 207", b"").to_string())
        .send();
    let running = tokio::spawn(request);
    poll::until_true(
        "the command to start",
        Duration::from_secs(10),
        || {
            std::process::Command::new("pgrep")
                .args(["-f", "^sleep 207$"])
                .output()
                .expect("pgrep")
                .status
                .success()
        },
        || "no `sleep 207` process".to_string(),
    )
    .await;
    let (code, _) = f
        .call("POST", &format!("/v1/pools/ci/leases/{id}/release"), None)
        .await;
    assert_eq!(code, 200);
    let answer = running.await.expect("task").expect("answer");
    let bytes = tokio::time::timeout(Duration::from_secs(10), answer.bytes())
        .await
        .expect("the stream ends with the lease")
        .expect("body");
    let (out, _, last) = read_frames(&bytes);
    assert_eq!(out, b"up\n");
    let (kind, why) = last.expect("a last frame");
    assert_eq!(kind, 4, "{why}");
    assert!(why.contains("lease ended"), "{why}");
    // The host sent the command KILL. OpenSSH delivers a signal request to the command's
    // process group, except for root logins, which run without privilege separation after
    // authentication: it refuses them ("session signalling requires privilege separation").
    // These machines log in as root, so the refusal in sshd's log is the proof the signal was
    // sent; the driver's cleanup ends such a command by its process group and mark.
    poll::until_true(
        "a signal request to reach sshd",
        Duration::from_secs(5),
        || {
            fleet.machines[0]
                .log()
                .contains("session signalling requires privilege separation")
        },
        || fleet.machines[0].log(),
    )
    .await;
    let _ = std::process::Command::new("pkill")
        .args(["-f", "^sleep 207$"])
        .status();
    // And the released lease runs nothing more.
    let (code, _) = f.call("POST", &exec(id), Some(body("true", b""))).await;
    assert_eq!(code, 404);
}

/// The runner block for an instance-mode pool: TOML the runner reads, the shell it must write
/// scripts for, the mode's flags in every stage, and no Docker-only flag; bad settings are
/// refused with the flag named.
#[test]
fn the_snippet_of_an_instance_pool_carries_its_mode_and_shell() {
    let (code, out, err) = common::cli(&[
        "gitlab", "--pool", "win", "--mode", "instance", "--os", "windows", "snippet",
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: toml::Value = toml::from_str(&out).expect("the block is TOML");
    let runner = &doc["runners"][0];
    assert_eq!(runner["executor"].as_str(), Some("custom"));
    assert_eq!(runner["shell"].as_str(), Some("pwsh"));
    assert_eq!(
        runner["cache_dir"].as_str(),
        Some(r"C:\flotilla\cache\project-PROJECT")
    );
    for stage in ["config", "prepare", "run", "cleanup"] {
        let args: Vec<&str> = runner["custom"][format!("{stage}_args")]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let joined = args.join(" ");
        assert!(
            joined.contains("--mode instance --os windows --shell pwsh --machine-dir C:\\flotilla"),
            "{stage}: {joined}"
        );
        assert!(!joined.contains("--pull-policy"), "{stage}: {joined}");
        assert_eq!(args.last().copied(), Some(stage));
    }
    for (flags, says) in [
        (
            vec!["--mode", "instance", "--os", "linux", "--shell", "pwsh"],
            "--shell \"pwsh\": on linux machines, use bash",
        ),
        (
            vec!["--mode", "instance", "--machine-dir", "builds"],
            "must be an absolute path",
        ),
        (vec!["--mode", "instance", "--os", "plan9"], "--os"),
        (vec!["--mode", "vm"], "invalid value 'vm' for '--mode"),
    ] {
        let mut args = vec!["gitlab", "--pool", "p"];
        args.extend(flags);
        args.push("snippet");
        let (code, _, err) = common::cli(&args);
        assert_ne!(code, 0);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// More commands at once than the machine's sshd allows on one connection (`MaxSessions 2`
/// here, 10 by default): each one past the limit gets a connection of its own, and all run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_past_the_machines_max_sessions_still_run() {
    use base64::Engine as _;
    let fleet = Machines::start_with(1, 1, "", "MaxSessions 2\n").await;
    let f = &fleet.flotilla;
    let (_, reserved) = f
        .call("POST", "/v1/pools/ci/leases", Some(serde_json::json!({})))
        .await;
    let id = reserved["lease"]["id"].as_u64().expect("id");
    let (code, _) = f
        .call("POST", &format!("/v1/pools/ci/leases/{id}/acquire"), None)
        .await;
    assert_eq!(code, 200);
    let path = format!("/v1/pools/ci/leases/{id}/exec");
    let runs = (0..6).map(|i| {
        let body = serde_json::json!({
            "command": format!("sleep 1; echo ok-{i}"),
            "stdin_base64": base64::engine::general_purpose::STANDARD.encode(b""),
        });
        f.request(
            "POST",
            &path,
            Some(body.to_string().into()),
            Some(common::TOKEN),
        )
    });
    let answers = futures_util::future::join_all(runs).await;
    for (i, (code, body)) in answers.iter().enumerate() {
        assert_eq!(*code, 200, "{}", String::from_utf8_lossy(body));
        let (out, err, last) = read_frames(body);
        assert_eq!(
            (String::from_utf8_lossy(&out).as_ref(), last),
            (
                format!("ok-{i}\n").as_str(),
                Some((3, r#"{"status":0}"#.to_string()))
            ),
            "{}",
            String::from_utf8_lossy(&err)
        );
    }
}

/// A restart of the host (kill -9, then a new process) while scripts run: each script keeps
/// running on its machine, the driver follows its log again from the byte it had printed, so
/// every line arrives once and in order, and the script's own exit code still decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_scripts_ride_through_a_kill_9_of_the_host() {
    let mut fleet = Machines::start(2, 2, "").await;
    let jobs: Vec<_> = (0..4u64).map(|i| fleet.job(800 + i)).collect();
    for job in &jobs {
        assert_eq!(job.stage(&["prepare"]).code, 0);
    }
    let counter = bash("for i in $(seq 1 20); do echo count $i; sleep 0.25; done; exit 3");
    let threads: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let script = job.script_file("build_script", &counter);
                let build = job.stage(&["run", &script, "build_script"]);
                let code = job.build_exit_code();
                let cleanup = job.stage(&["cleanup"]);
                (build, code, cleanup)
            })
        })
        .collect();
    // Every script is running and has printed (it sleeps between lines).
    poll::until_true(
        "every job's script to be printing",
        Duration::from_secs(6),
        || {
            (800..804).all(|id| {
                processes_of_job(id)
                    .iter()
                    .any(|(_, c)| c.starts_with("sleep "))
            })
        },
        || format!("{:?}", (800..804).map(processes_of_job).collect::<Vec<_>>()),
    )
    .await;
    fleet.flotilla.kill();
    // Deliberate: the host stays down 2 s while the scripts run on.
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.flotilla.start_again().await;
    for thread in threads {
        let (build, code, cleanup) = tokio::task::spawn_blocking(move || thread.join())
            .await
            .expect("join")
            .expect("a job thread");
        assert_eq!(build.code, 1, "{build:?}");
        assert_eq!(code.as_deref(), Some("3\n"), "{build:?}");
        let counted: Vec<&str> = build
            .stdout
            .lines()
            .filter(|l| l.starts_with("count "))
            .collect();
        let expected: Vec<String> = (1..=20).map(|i| format!("count {i}")).collect();
        assert_eq!(counted, expected, "{build:?}");
        assert!(
            build.stdout.contains("following again"),
            "the host was never lost: {build:?}"
        );
        assert_eq!(cleanup.code, 0, "{cleanup:?}");
    }
    for id in 800..804 {
        assert!(processes_of_job(id).is_empty(), "job {id} left processes");
    }
    fleet.assert_no_lease().await;
}

/// Prometheus discovers the machines: a real server (Debian's `prometheus`) reads
/// `/sd/prometheus` with the read-only token and scrapes a real node_exporter at each machine's
/// address; the endpoint refuses requests without that token, the lease token included; and a
/// machine the scaler removes leaves the target list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_discovers_the_machines_and_scrapes_their_node_exporter() {
    use flotilla_harness::process::Daemon;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .expect("addr")
            .port()
    };
    let work = tempfile::tempdir().expect("dir");
    let exporter_port = free();
    let _exporter = Daemon::spawn(
        {
            let mut c = std::process::Command::new("prometheus-node-exporter");
            c.arg(format!("--web.listen-address=127.0.0.1:{exporter_port}"));
            c
        },
        &work.path().join("node-exporter.log"),
    );
    let sd_token = work.path().join("sd-token");
    flotilla_harness::write_secret(&sd_token, "sd-read-only-7f3c");
    let fleet = Machines::start_full(
        2,
        1,
        &format!("exporter_ports = [{exporter_port}]\n"),
        "",
        &format!(
            "metrics_listen = \"127.0.0.1:0\"\nsd_token = {{ file = \"{}\" }}\n",
            sd_token.display()
        ),
    )
    .await;
    let metrics = fleet.flotilla.metrics.clone().expect("metrics_listen");
    let sd = format!("{metrics}/sd/prometheus");
    let client = reqwest::Client::new();
    let get = |token: Option<&'static str>| {
        let mut request = client.get(&sd);
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        async move {
            let answer = request.send().await.expect("sd");
            let status = answer.status().as_u16();
            (status, answer.text().await.unwrap_or_default())
        }
    };
    assert_eq!(get(None).await.0, 401);
    assert_eq!(
        get(Some(common::TOKEN)).await.0,
        401,
        "the lease token opened SD"
    );
    let (status, body) = get(Some("sd-read-only-7f3c")).await;
    assert_eq!(status, 200, "{body}");
    let groups: Value = serde_json::from_str(&body).expect("JSON");
    let groups = groups.as_array().expect("a list");
    assert_eq!(groups.len(), 2, "{body}");
    for g in groups {
        assert_eq!(
            g["targets"],
            serde_json::json!([format!("127.0.0.1:{exporter_port}")]),
            "{body}"
        );
        assert_eq!(g["labels"]["__meta_flotilla_pool"], "ci", "{body}");
        assert_eq!(g["labels"]["__meta_flotilla_state"], "ready", "{body}");
        assert_eq!(g["labels"]["__meta_flotilla_os"], "linux", "{body}");
        // The plugin's zone (contract 0.1.4) is passed on; no zone is no label, not an empty one.
        let zone = &g["labels"]["__meta_flotilla_zone"];
        match g["labels"]["__meta_flotilla_instance_id"].as_str() {
            Some("m1") => assert_eq!(zone, "rack-1", "{body}"),
            _ => assert!(zone.is_null(), "{body}"),
        }
    }

    let prometheus_port = free();
    let config = work.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: machines\n    http_sd_configs:\n      - url: {sd}\n        refresh_interval: 1s\n        authorization:\n          type: Bearer\n          credentials_file: {token}\n    relabel_configs:\n      - source_labels: [__meta_flotilla_instance_id]\n        target_label: flotilla_instance\n      - source_labels: [__meta_flotilla_pool]\n        target_label: pool\n      - source_labels: [__meta_flotilla_zone]\n        target_label: zone\n",
            token = sd_token.display()
        ),
    )
    .expect("prometheus.yml");
    let _prometheus = Daemon::spawn(
        {
            let mut c = std::process::Command::new("prometheus");
            c.arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    work.path().join("tsdb").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"));
            c
        },
        &work.path().join("prometheus.log"),
    );
    let targets = || {
        let client = client.clone();
        async move {
            let answer = client
                .get(format!(
                    "http://127.0.0.1:{prometheus_port}/api/v1/targets?state=active"
                ))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let v: Value = answer.json().await.map_err(|e| e.to_string())?;
            let active = v["data"]["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let text = |v: &Value| v.as_str().unwrap_or("").to_string();
            Ok::<Vec<(String, String, String)>, String>(
                active
                    .iter()
                    .map(|t| {
                        (
                            text(&t["labels"]["flotilla_instance"]),
                            text(&t["labels"]["zone"]),
                            text(&t["health"]),
                        )
                    })
                    .collect(),
            )
        }
    };
    let logs = || std::fs::read_to_string(work.path().join("prometheus.log")).unwrap_or_default();
    poll::until(
        "Prometheus to scrape both machines' node_exporter",
        Duration::from_secs(60),
        || async {
            match targets().await {
                Ok(mut t) => {
                    t.sort();
                    let up =
                        |id: &str, zone: &str| (id.to_string(), zone.to_string(), "up".to_string());
                    if t == [up("m1", "rack-1"), up("m2", "")] {
                        Ok(())
                    } else {
                        Err(format!("{t:?}\n{}", logs()))
                    }
                }
                Err(e) => Err(e),
            }
        },
    )
    .await;

    // One machine fewer: the policy keeps one idle slot, for a second.
    let config_file = fleet.flotilla.dir.path().join("flotilla.toml");
    let text = std::fs::read_to_string(&config_file).expect("config");
    let text = text
        .replace("idle_count = 2", "idle_count = 1")
        .replace("idle_time = \"1h\"", "idle_time = \"1s\"");
    std::fs::write(&config_file, text).expect("config");
    poll::until(
        "the removed machine to leave Prometheus's targets",
        Duration::from_secs(60),
        || async {
            match targets().await {
                Ok(t) if t.len() == 1 => Ok(()),
                Ok(t) => Err(format!("{t:?}\n{}", fleet.flotilla.log())),
                Err(e) => Err(e),
            }
        },
    )
    .await;
    let (status, body) = get(Some("sd-read-only-7f3c")).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body)
            .expect("JSON")
            .as_array()
            .map(Vec::len),
        Some(1),
        "{body}"
    );
}

/// An operator opens a shell in an instance-mode job's directory on its machine, through the
/// lease's terminal route and the host's SSH session: commands go in, output and the exit code
/// come back, a command after `--` runs there instead, and the host logs who, which job, and
/// the end. Asked with a size, the command gets a pseudo-terminal of that size. A session still
/// open when the job's cleanup ends the lease is cut, and a job with no lease is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_opens_a_terminal_in_an_instance_mode_jobs_directory() {
    use std::io::{Read, Write};
    let fleet = Machines::start(1, 1, "").await;
    let dir = fleet.job_dir(620);
    let job = fleet.job(620);
    let prepare = job.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}\n{}", fleet.flotilla.log());
    let terminal = |input: &'static [u8], command: &[&str]| {
        let mut args = vec!["terminal", "620", "--who", "bob"];
        if !command.is_empty() {
            args.push("--");
            args.extend_from_slice(command);
        }
        let mut child = job
            .command(&args)
            .stdin(Stdio::piped())
            .spawn()
            .expect("flotilla gitlab terminal");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input).expect("typed");
        (child, stdin)
    };
    let real = |p: &str| std::fs::canonicalize(p.trim()).expect("a path");

    let (child, stdin) = terminal(b"pwd; echo \"home=$HOME\"; exit 4\n", &[]);
    drop(stdin);
    let out = child.wait_with_output().expect("the session ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stdout}\n{stderr}");
    assert_eq!(
        real(stdout.lines().next().unwrap_or("")),
        real(&dir.display().to_string()),
        "{stdout}"
    );
    // The job's own HOME, below its directory, never the login user's.
    let home = stdout
        .lines()
        .find_map(|l| l.strip_prefix("home="))
        .unwrap_or_else(|| panic!("no HOME printed: {stdout}"));
    assert!(
        real(home).starts_with(real(&dir.display().to_string())),
        "{stdout}"
    );

    let (child, stdin) = terminal(b"", &["sh", "-c", "echo via-command in $(pwd); exit 5"]);
    drop(stdin);
    let out = child.wait_with_output().expect("the command ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{stdout}");
    assert!(stdout.contains("via-command in"), "{stdout}");

    let log = fleet.flotilla.log();
    common::assert_terminal_session_logged(&log, "bob", 620);

    // The route itself: an upgrade, a pseudo-terminal of the size asked, and the frames.
    let (_, leases) = fleet
        .flotilla
        .call("GET", "/v1/pools/ci/leases?label=gitlab-job=620", None)
        .await;
    let lease = leases["leases"][0]["id"].as_u64().expect("the job's lease");
    let authority = fleet
        .flotilla
        .base
        .trim_start_matches("http://")
        .to_string();
    let raw = |upgrade: &str| {
        let mut tcp = std::net::TcpStream::connect(&authority).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        write!(
            tcp,
            "GET /v1/pools/ci/leases/{lease}/terminal?command=stty%20size%3B%20exit%209&rows=31&cols=101 HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {}\r\nConnection: Upgrade\r\nUpgrade: {upgrade}\r\n\r\n",
            common::TOKEN
        )
        .expect("request");
        let mut got = Vec::new();
        let _ = tcp.read_to_end(&mut got);
        String::from_utf8_lossy(&got).into_owned()
    };
    let answer = raw("flotilla-terminal");
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    // The frames: stdout (kind 1) carries the size the terminal was given, exit (3) the status.
    assert!(answer.contains("31 101"), "{answer}");
    assert!(answer.contains("{\"status\":9}"), "{answer}");
    let refused = raw("websocket");
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");

    // A session left open is cut when the job's cleanup ends the lease.
    let (mut open, stdin) = terminal(b"echo still-here\n", &[]);
    poll::until_true(
        "the session to open",
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
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    let ended = poll::until(
        "the open session to be cut",
        Duration::from_secs(20),
        || {
            let status = open.try_wait().expect("wait");
            async move { status.ok_or_else(|| "still open".to_string()) }
        },
    )
    .await;
    drop(stdin);
    assert!(!ended.success(), "a cut session is no success");

    // No lease, no terminal.
    let out = job.stage(&["terminal", "620"]);
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("job 620 has no lease"), "{out:?}");
}

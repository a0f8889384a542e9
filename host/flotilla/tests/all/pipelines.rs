//! Real pipelines on plain images: GitLab Runner's own stages (checkout, cache, artifacts) run
//! in the job's helper container, the user's scripts in the job's image (`busybox`, no git, no
//! runner), as GitLab's docker executor does. Everything real runs on this machine: the
//! scripts as the runner writes them, a stand-in GitLab (`git http-backend` behind job-token
//! auth, the jobs artifacts API with object-storage redirects), real object stores for the
//! distributed cache (moto's S3, a GCS stand-in, Azurite), the stand-in helper image, and the
//! fleet of `gitlab.rs` (loopback sshd machines in front of a real dockerd). The peers listen
//! on an address of this machine that job containers reach (`flotilla_peers::netaddr`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_peers::cache_stores::{Access, AzureStore, GcsStore, S3Store};
use flotilla_peers::runner_scripts::{
    Artifact, Cache, CacheAccess, CacheUrls, Dependency, GitStrategy, JobSpec,
};

use common::fleet::{DOCKER, Fleet, docker_cli};
use common::pipeline::{self, PROJECT_ID, Project, Ran, runner_job, skipped};

/// The peers' address, or `None` (and the test says it is skipped) where it cannot be made.
fn peer_ip() -> Option<std::net::IpAddr> {
    let ip = flotilla_peers::netaddr::peer_ip();
    if ip.is_none() {
        eprintln!("skipped: no address containers reach (needs root and `ip`)");
    }
    ip
}

/// A cache store as the runner's host sees it: it signs access to each object.
struct Urls {
    download: Box<dyn Fn(&str) -> Access + Send + Sync>,
    upload: Box<dyn Fn(&str) -> Access + Send + Sync>,
}

fn access(a: Access) -> CacheAccess {
    match a {
        Access::Presigned {
            url,
            head_url,
            headers,
        } => CacheAccess::Presigned {
            url,
            head_url,
            headers,
        },
        Access::GoCloud { url, env } => CacheAccess::GoCloud { url, env },
    }
}

impl CacheUrls for Urls {
    fn download(&self, object: &str) -> CacheAccess {
        access((self.download)(object))
    }
    fn upload(&self, object: &str) -> CacheAccess {
        access((self.upload)(object))
    }
}

macro_rules! urls {
    ($store:expr) => {{
        let (d, u) = ($store.clone(), $store.clone());
        Arc::new(Urls {
            download: Box::new(move |o| d.download(o)),
            upload: Box::new(move |o| u.upload(o)),
        }) as Arc<dyn CacheUrls>
    }};
}

/// The `build` job of the docs' example: a cache of `vendor/`, artifacts of `dist/` without its
/// logs, on `busybox`, at `sha`.
fn build_job(project: &Project, sha: &str, cache: &Arc<dyn CacheUrls>) -> JobSpec {
    let mut spec = project.job(sha);
    spec.job_name = "build".into();
    let mut vendor = Cache::new("vendor-main", &["vendor/"]);
    vendor.fallback_keys = vec!["vendor-fallback".into()];
    spec.caches = vec![vendor];
    spec.cache_urls = cache.clone();
    let mut dist = Artifact::new(&["dist/"]);
    dist.exclude = vec!["dist/*.log".into()];
    spec.artifacts = vec![dist];
    spec.script = vec![
        "cat version.txt".into(),
        "test -d vendor || { mkdir -p vendor && echo fetched-once > vendor/deps; }".into(),
        "mkdir -p dist && echo app-$(cat version.txt) > dist/app && echo noisy > dist/debug.log"
            .into(),
        "touch .git/flotilla-was-here".into(),
    ];
    spec
}

/// The `test` job: fetches (reusing the worktree), restores the cache and downloads `build`'s
/// artifacts.
fn test_job(project: &Project, sha: &str, cache: &Arc<dyn CacheUrls>, build: &JobSpec) -> JobSpec {
    let mut spec = project.job(sha);
    spec.job_name = "test".into();
    spec.git_strategy = GitStrategy::Fetch;
    spec.caches = vec![Cache::new("vendor-main", &["vendor/"])];
    spec.cache_urls = cache.clone();
    spec.dependencies = vec![Dependency {
        id: build.job_id,
        name: build.job_name.clone(),
        token: spec.token.clone(),
    }];
    spec.script = vec![
        "cat dist/app".into(),
        "test ! -e dist/debug.log".into(),
        "cat vendor/deps".into(),
        "if test -e .git/flotilla-was-here; then echo worktree-reused; fi".into(),
        "touch .git/flotilla-was-here".into(),
    ];
    spec
}

/// Removes what a deleted machine takes with it: the project's cache and builds volumes.
fn forget_machine(fleet: &Fleet) {
    let cli = tempfile::tempdir().expect("dir");
    let listed = docker_cli(
        &fleet.docker,
        cli.path(),
        &[
            "volume",
            "ls",
            "-q",
            "--filter",
            "label=io.flotilla.gitlab.cache",
        ],
    );
    for volume in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
        let out = docker_cli(&fleet.docker, cli.path(), &["volume", "rm", volume]);
        assert!(out.status.success(), "{out:?}");
    }
}

fn assert_passed(ran: &Ran) {
    assert!(ran.passed(), "{}", ran.log());
    let log = ran.log();
    let skipped = skipped(&log);
    assert!(skipped.is_empty(), "{skipped:?}\n{log}");
}

/// The docs' pipeline on busybox with an S3 cache: checkout at a sha that is not the branch's
/// tip, a cache saved and restored through the store after the machine is gone, artifacts
/// without the excluded files passed to a dependent job, a `fetch` that reuses the worktree,
/// and no "Missing ..." or "not found" line anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_on_busybox_checks_out_caches_through_s3_and_passes_artifacts() {
    let Some(ip) = peer_ip() else { return };
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(2, 1, "").await;
    let project = Project::start(ip).await;
    let s3 = Arc::new(S3Store::start(ip).await);
    let cache = urls!(s3);
    let build = build_job(&project, &project.first, &cache);
    let ran = pipeline::run(&runner_job(&fleet, &build, &fleet.image), &build);
    assert_passed(&ran);
    let log = ran.log();
    assert!(
        log.contains("\none\n"),
        "checked out at the first commit:\n{log}"
    );
    assert!(!log.contains("\ntwo\n"), "{log}");
    // The artifacts reached GitLab without the excluded log.
    let stored = project
        .gitlab
        .artifact(build.job_id)
        .expect("build's artifacts");
    let names = zip_names(&stored.bytes);
    assert!(names.iter().any(|n| n == "dist/app"), "{names:?}");
    assert!(!names.iter().any(|n| n.ends_with(".log")), "{names:?}");
    // The cache is in the store, not only on the machine; the machine goes.
    let object = flotilla_peers::runner_scripts::cache_object_name(
        &build.cache_path,
        build.cache_shared,
        &flotilla_peers::runner_scripts::short_token(&build.runner_token),
        PROJECT_ID,
        &build.sent_cache_key(&build.caches[0], "vendor-main"),
        false,
    )
    .expect("an object name");
    assert!(
        s3.object(&object).is_some(),
        "the cache archive is in S3 as {object}:\n{log}"
    );
    forget_machine(&fleet);
    let test = test_job(&project, &project.first, &cache, &build);
    let ran = pipeline::run(&runner_job(&fleet, &test, &fleet.image), &test);
    assert_passed(&ran);
    let log = ran.log();
    assert!(log.contains("app-one"), "build's artifact:\n{log}");
    assert!(
        log.contains("fetched-once"),
        "the cache came back from S3:\n{log}"
    );
    assert!(
        !ran.printed("worktree-reused"),
        "a new machine has no worktree to reuse:\n{log}"
    );
    fleet.assert_clean().await;

    // A fetch on the same slot reuses the worktree the last job left.
    let again = test_job(&project, &project.first, &cache, &build);
    let ran = pipeline::run(&runner_job(&fleet, &again, &fleet.image), &again);
    assert_passed(&ran);
    assert!(ran.printed("worktree-reused"), "{}", ran.log());
    fleet.assert_clean().await;
}

/// The names in a zip archive (`unzip -Z1`, busybox's `unzip -l` otherwise).
fn zip_names(bytes: &[u8]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("a.zip");
    std::fs::write(&file, bytes).expect("zip");
    let out = std::process::Command::new("/bin/busybox")
        .args(["unzip", "-l"])
        .arg(&file)
        .output()
        .expect("busybox unzip");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .filter(|n| n.contains('/') || n.contains('.'))
        .collect()
}

/// A cache saved on one machine comes back on another through GCS (V2 signed URLs over
/// HTTPS) and Azure Blob (a SAS token and GoCloud's `azblob://`), both with a CA the helper
/// image trusts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_distributed_cache_round_trips_through_gcs_and_azure() {
    let Some(ip) = peer_ip() else { return };
    let _one = DOCKER.lock().await;
    let gcs = Arc::new(GcsStore::start(ip).await);
    let azure = Arc::new(AzureStore::start(ip).await);
    let cas = format!(
        "{}{}",
        gcs.ca_pem().unwrap_or_default(),
        azure.ca_pem().unwrap_or_default()
    );
    let fleet = Fleet::start_trusting(1, 1, &cas).await;
    let project = Project::start(ip).await;
    for (name, cache) in [("gcs", urls!(gcs)), ("azure", urls!(azure))] {
        let build = build_job(&project, &project.tip, &cache);
        let ran = pipeline::run(&runner_job(&fleet, &build, &fleet.image), &build);
        assert_passed(&ran);
        forget_machine(&fleet);
        let test = test_job(&project, &project.tip, &cache, &build);
        let ran = pipeline::run(&runner_job(&fleet, &test, &fleet.image), &test);
        assert_passed(&ran);
        assert!(ran.log().contains("fetched-once"), "{name}:\n{}", ran.log());
        assert!(ran.log().contains("app-two"), "{name}:\n{}", ran.log());
        fleet.assert_clean().await;
    }
}

/// A cancel inside a helper stage ends it before the driver exits and cleanup leaves nothing;
/// a driver killed with SIGKILL during a helper stage leaves nothing after cleanup; a restart
/// of the host during `archive_cache` does not stop the stage, which finishes and is followed
/// to its end; an unreachable cache store gives the runner's warning and the job goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_stages_are_cancelled_cleaned_up_and_ride_a_restart() {
    let Some(ip) = peer_ip() else { return };
    let _one = DOCKER.lock().await;
    let mut fleet = Fleet::start(1, 1, "").await;
    let project = Project::start(ip).await;
    let nowhere = {
        // A port nothing listens on, on the peers' address.
        let port = std::net::TcpListener::bind((ip, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a port");
        let url = format!("http://{ip}:{port}/bucket/object");
        Arc::new(Urls {
            download: Box::new({
                let url = url.clone();
                move |_| Access::Presigned {
                    url: url.clone(),
                    head_url: None,
                    headers: Vec::new(),
                }
            }),
            upload: Box::new(move |_| Access::Presigned {
                url: url.clone(),
                head_url: None,
                headers: Vec::new(),
            }),
        }) as Arc<dyn CacheUrls>
    };

    // Cancel during get_sources.
    let spec = build_job(&project, &project.tip, &nowhere);
    let job = runner_job(&fleet, &spec, &fleet.image);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let script = job.script_file(
        "get_sources",
        "#!/usr/bin/env bash\necho fetching; sleep 300; echo never\n",
    );
    let child = job
        .command(&["run", &script, "get_sources"])
        .spawn()
        .expect("run");
    let helper = format!("flotilla-job-{}-helper", spec.job_id);
    let cli = tempfile::tempdir().expect("dir");
    flotilla_harness::poll::until_true(
        "get_sources running in the helper",
        Duration::from_secs(10),
        || {
            let top = docker_cli(&fleet.docker, cli.path(), &["top", &helper]);
            String::from_utf8_lossy(&top.stdout).contains("sleep 300")
        },
        || "not yet".into(),
    )
    .await;
    let cancelled = Instant::now();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill")
            .success()
    );
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        cancelled.elapsed() < Duration::from_secs(30),
        "{:?}",
        cancelled.elapsed()
    );
    let top = docker_cli(&fleet.docker, cli.path(), &["top", &helper]);
    assert!(
        !String::from_utf8_lossy(&top.stdout).contains("sleep 300"),
        "the cancelled stage still runs: {top:?}"
    );
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;

    // SIGKILL of the driver during a helper stage, then the runner's cleanup.
    let spec = build_job(&project, &project.tip, &nowhere);
    let job = runner_job(&fleet, &spec, &fleet.image);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    let script = job.script_file(
        "restore_cache",
        "#!/usr/bin/env bash\necho restoring; sleep 300\n",
    );
    let mut child = job
        .command(&["run", &script, "restore_cache"])
        .spawn()
        .expect("run");
    let helper = format!("flotilla-job-{}-helper", spec.job_id);
    flotilla_harness::poll::until_true(
        "restore_cache running in the helper",
        Duration::from_secs(10),
        || {
            let top = docker_cli(&fleet.docker, cli.path(), &["top", &helper]);
            String::from_utf8_lossy(&top.stdout).contains("sleep 300")
        },
        || "not yet".into(),
    )
    .await;
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;

    // A restart of the host during archive_cache; an unreachable store warns, the job goes on.
    let spec = build_job(&project, &project.tip, &nowhere);
    let job = runner_job(&fleet, &spec, &fleet.image);
    assert_eq!(job.stage(&["prepare"]).code, 0);
    for name in [
        "prepare_script",
        "get_sources",
        "restore_cache",
        "build_script",
    ] {
        let text = flotilla_peers::runner_scripts::script(&spec, name);
        let r = pipeline::stage(&job, name, &text);
        assert_eq!(r.code, 0, "{name}: {r:?}");
    }
    let archive = flotilla_peers::runner_scripts::script(&spec, "archive_cache");
    // The stage waits before its real work, long enough for the host to go and come back.
    let slow = archive.replacen('\n', "\nsleep 4\n", 1);
    let path = job.script_file("archive_cache", &slow);
    let running = {
        let args = ["run".to_string(), path, "archive_cache".to_string()];
        let mut command = job.command(&args.iter().map(String::as_str).collect::<Vec<_>>());
        std::thread::spawn(move || command.output().expect("run"))
    };
    // Deliberate: the stage is underway before the host goes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.flotilla.kill();
    // Deliberate: the host stays away for a while, as a restart does.
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.flotilla.start_again().await;
    let out = tokio::task::spawn_blocking(move || running.join())
        .await
        .expect("join")
        .expect("the stage");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("following again"),
        "the host was never lost: {said}"
    );
    assert!(
        said.contains("Failed to create cache") || said.contains("WARNING"),
        "{said}"
    );
    assert_eq!(job.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// A job image with git and no runner binary: checkout, cache and artifacts still run (in
/// the helper), and no "Missing gitlab-runner" line appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_with_git_and_no_runner_never_skips_the_cache() {
    let Some(ip) = peer_ip() else { return };
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 1, "").await;
    let image = fleet.push_image("ci/git-no-runner:1", None, |root| {
        std::fs::remove_file(root.join("usr/bin/gitlab-runner-helper")).expect("no runner");
    });
    let project = Project::start(ip).await;
    let s3 = Arc::new(S3Store::start(ip).await);
    let cache = urls!(s3);
    let mut build = build_job(&project, &project.tip, &cache);
    build.script.push("git --version".into());
    build.script.push("! command -v gitlab-runner".into());
    let ran = pipeline::run(&runner_job(&fleet, &build, &image), &build);
    assert_passed(&ran);
    assert!(
        project.gitlab.artifact(build.job_id).is_some(),
        "{}",
        ran.log()
    );
    fleet.assert_clean().await;
}

/// What the helper's rules refuse stays refused: an artifact path that leaves the project
/// directory is skipped with the runner's warning (the rest is uploaded), and a cache key that
/// tries to climb out of the cache directory is sanitized as the runner does; the volume
/// layout widens neither. Submodules (recursive, relative URLs) and a shallow clone work on
/// busybox too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_paths_stay_inside_the_project_and_submodules_check_out() {
    let Some(ip) = peer_ip() else { return };
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 1, "").await;
    let project = Project::start(ip).await;
    // A library with a nested library, as relative submodules of the project.
    let inner = flotilla_peers::gitlab::WorkTree::new();
    inner.write("inner.txt", b"inner\n");
    let inner_sha = inner.commit("inner");
    project.gitlab.publish("group/inner", &inner);
    let lib = flotilla_peers::gitlab::WorkTree::new();
    lib.write("lib.txt", b"lib\n");
    lib.submodule("inner", "../inner.git", &inner_sha);
    let lib_sha = lib.commit("lib");
    project.gitlab.publish("group/lib", &lib);
    let app = flotilla_peers::gitlab::WorkTree::new();
    app.write("version.txt", b"three\n");
    app.submodule("lib", "../lib.git", &lib_sha);
    let sha = app.commit("with submodules");
    project.gitlab.publish(pipeline::PROJECT, &app);
    // The job token reaches the libraries only where they allow the project (GitLab's job
    // token allowlist).
    project.gitlab.allow("group/lib", pipeline::PROJECT);
    project.gitlab.allow("group/inner", pipeline::PROJECT);
    let cache: Arc<dyn CacheUrls> = Arc::new(flotilla_peers::runner_scripts::NoCacheStore);
    let mut spec = project.job(&sha);
    spec.pipeline_id = Some(project.gitlab.pipeline(pipeline::PROJECT, &sha));
    spec.depth = 1;
    spec.submodule_strategy = flotilla_peers::runner_scripts::SubmoduleStrategy::Recursive;
    spec.caches = vec![Cache::new("../../../escape", &["dist/"])];
    spec.cache_urls = cache;
    spec.artifacts = vec![Artifact::new(&["../../outside", "dist/"])];
    spec.script = vec![
        "cat lib/lib.txt lib/inner/inner.txt".into(),
        "test -f .git/shallow && echo shallow".into(),
        "mkdir -p dist && echo built > dist/out".into(),
        "mkdir -p ../../outside && echo secret > ../../outside/stolen".into(),
    ];
    let ran = pipeline::run(&runner_job(&fleet, &spec, &fleet.image), &spec);
    assert!(ran.passed(), "{}", ran.log());
    let log = ran.log();
    assert!(log.contains("lib\ninner\n"), "{log}");
    assert!(ran.printed("shallow"), "{log}");
    assert!(log.contains("not a subpath of project directory"), "{log}");
    let stored = project.gitlab.artifact(spec.job_id).expect("artifacts");
    let names = zip_names(&stored.bytes);
    assert!(names.iter().any(|n| n == "dist/out"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("stolen")), "{names:?}");
    // The cache archive landed inside the project's own cache directory.
    let cli = tempfile::tempdir().expect("dir");
    let found = docker_cli(
        &fleet.docker,
        cli.path(),
        &[
            "run",
            "--rm",
            "-v",
            "flotilla-cache-project-4242:/cache",
            &fleet.image,
            "sh",
            "-c",
            "find /cache -name cache.zip",
        ],
    );
    let found = String::from_utf8_lossy(&found.stdout).into_owned();
    assert!(found.lines().count() == 1, "{found}");
    assert!(found.starts_with("/cache/group/app/"), "{found}");
    fleet.assert_clean().await;
}

/// The helper image is refused clearly, and nothing is left behind: one that cannot be
/// pulled, one without the helper binary, one whose binary is for another architecture. It
/// is pulled with the operator's credentials, never the job's: a job without registry
/// credentials still gets it, and a runner without the operator's cannot use the job's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_helper_image_fails_prepare_naming_it_and_only_the_operators_credentials_pull_it() {
    let _one = DOCKER.lock().await;
    let fleet = Fleet::start(1, 1, "").await;
    let no_binary = fleet.push_image("ops/no-helper:1", None, |root| {
        std::fs::remove_file(root.join("usr/bin/gitlab-runner-helper")).expect("remove");
    });
    let other_arch = fleet.push_image("ops/arm-helper:1", None, |root| {
        // An ELF header for AArch64 (e_machine 183): the kernel refuses to run it here.
        let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        elf.resize(16, 0);
        elf.extend_from_slice(&[2, 0, 183, 0, 1, 0, 0, 0]);
        elf.resize(4096, 0);
        std::fs::write(root.join("usr/bin/gitlab-runner-helper"), elf).expect("write");
    });
    let missing = format!("{}/ops/no-such-helper:1", fleet.registry.host());
    for (id, image, says) in [
        (1101u64, missing.as_str(), "no-such-helper"),
        (1102, no_binary.as_str(), "has no gitlab-runner-helper"),
        (1103, other_arch.as_str(), "another architecture"),
    ] {
        let mut job = fleet.job(id);
        let at = job
            .args
            .iter()
            .position(|a| a == "--helper-image")
            .expect("flag");
        job.args[at + 1] = image.to_string();
        let prepare = job.stage(&["prepare"]);
        assert_eq!(prepare.code, 2, "{image}: {prepare:?}");
        assert!(prepare.stderr.contains(image), "{prepare:?}");
        assert!(prepare.stderr.contains(says), "{prepare:?}");
        assert_eq!(job.stage(&["cleanup"]).code, 0);
        fleet.assert_clean().await;
    }
    let cli = tempfile::tempdir().expect("dir");
    let forget = |image: &str| docker_cli(&fleet.docker, cli.path(), &["rmi", "-f", image]);
    // The operator's credentials pull it for a job that has none.
    forget(&fleet.helper_image);
    let mut anonymous = fleet.job(1104);
    anonymous.env.remove("CUSTOM_ENV_DOCKER_AUTH_CONFIG");
    // Its own image is on the machine already (the jobs above pulled it).
    anonymous
        .args
        .extend(["--pull-policy".to_string(), "if-not-present".to_string()]);
    let prepare = anonymous.stage(&["prepare"]);
    assert_eq!(prepare.code, 0, "{prepare:?}");
    assert_eq!(anonymous.stage(&["cleanup"]).code, 0);
    // Without the operator's, the job's credentials are never used for it.
    forget(&fleet.helper_image);
    let mut borrowing = fleet.job(1105);
    let at = borrowing
        .args
        .iter()
        .position(|a| a == "--helper-registry-auth")
        .expect("flag");
    borrowing.args.drain(at..at + 2);
    let prepare = borrowing.stage(&["prepare"]);
    assert_eq!(prepare.code, 2, "{prepare:?}");
    assert!(prepare.stderr.contains("the helper image"), "{prepare:?}");
    assert_eq!(borrowing.stage(&["cleanup"]).code, 0);
    fleet.assert_clean().await;
}

/// Instance mode runs the runner's own stages on the machine (git and the runner's helper
/// binary there, as the machine image has them): checkout, a cache through S3 and artifacts,
/// with no "Missing ..." line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_mode_runs_the_runners_own_stages_on_the_machine() {
    let Some(ip) = peer_ip() else { return };
    let fleet = common::machines::Machines::start(1, 1, "").await;
    let project = Project::start(ip).await;
    let s3 = Arc::new(S3Store::start(ip).await);
    let cache = urls!(s3);
    let mut build = build_job(&project, &project.first, &cache);
    let mut job = fleet.job(build.job_id);
    // The runner's scripts single-quote the builds directory without escaping
    // (`shells/abstract.go` `changeFilesOwnership`), so a machine directory with a `'` (as the
    // other instance tests use, to try the driver's own quoting) would break them.
    let plain = fleet.root.path().join("machines");
    let at = job
        .args
        .iter()
        .position(|a| a == "--machine-dir")
        .expect("flag");
    job.args[at + 1] = plain.display().to_string();
    let config = job.stage(&["config"]);
    let answer: serde_json::Value = serde_json::from_str(&config.stdout).expect("config");
    build.builds_dir = answer["builds_dir"].as_str().expect("builds_dir").into();
    build.cache_dir = answer["cache_dir"].as_str().expect("cache_dir").into();
    let response = serde_json::json!({
        "id": build.job_id, "token": build.token,
        "job_info": {"project_id": PROJECT_ID}, "git_info": {"protected": false},
    });
    std::fs::write(job.dir.path().join("response.json"), response.to_string()).expect("file");
    job.env.insert(
        "CUSTOM_ENV_CI_RUNNER_SHORT_TOKEN".into(),
        flotilla_peers::runner_scripts::short_token(&build.runner_token),
    );
    let ran = pipeline::run(&job, &build);
    assert_passed(&ran);
    assert!(ran.log().contains("\none\n"), "{}", ran.log());
    assert!(
        project.gitlab.artifact(build.job_id).is_some(),
        "{}",
        ran.log()
    );
    fleet.assert_no_lease().await;
}

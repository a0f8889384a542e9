//! The generated stage scripts are valid bash, and their `get_sources` does against the
//! stand-in GitLab what the runner's does: run with bash in a temporary builds dir, no
//! container, Debian's git first on `PATH`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use flotilla_peers::gitlab::{GitLab, Options, WorkTree, git};
use flotilla_peers::runner_scripts::{
    Artifact, Cache, CacheAccess, CacheUrls, Dependency, GitStrategy, JobSpec, SubmoduleStrategy,
    Variable, When, script, stages,
};

const APP: &str = "group/app";

/// A stand-in GitLab, a builds dir, a cache dir and a `HOME`, all temporary.
struct Fixture {
    gitlab: GitLab,
    dir: tempfile::TempDir,
}

struct Ran {
    ok: bool,
    output: String,
}

impl Fixture {
    async fn new() -> Fixture {
        let gitlab = GitLab::start(Ipv4Addr::LOCALHOST.into(), Options::default()).await;
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home");
        Fixture { gitlab, dir }
    }

    /// A job of `project` at `sha` of `main`, in this fixture's dirs, with a new job token
    /// and pipeline.
    fn job(&self, project: &str, sha: &str) -> JobSpec {
        let job = self.gitlab.job(project);
        let mut spec = JobSpec::new(
            &self.gitlab.url,
            7,
            project,
            job.id,
            &job.token,
            sha,
            "main",
        );
        spec.pipeline_id = Some(self.gitlab.pipeline(project, sha));
        spec.builds_dir = self.dir.path().join("builds").display().to_string();
        spec.cache_dir = self.dir.path().join("cache").display().to_string();
        spec
    }

    /// Runs one stage's script as `run_exec` would: a script file given to bash.
    fn run(&self, spec: &JobSpec, stage: &str) -> Ran {
        let file = self.dir.path().join(format!("{stage}.sh"));
        std::fs::write(&file, script(spec, stage)).expect("the script");
        let out = Command::new("/usr/bin/bash")
            .arg(&file)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.dir.path().join("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .expect("bash");
        Ran {
            ok: out.status.success(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    fn get_sources(&self, spec: &JobSpec) {
        let ran = self.run(spec, "get_sources");
        assert!(ran.ok, "get_sources failed:\n{}", ran.output);
    }
}

fn head(dir: &Path) -> String {
    git(dir, &["rev-parse", "HEAD"]).trim().to_string()
}

/// `main` with two commits; returns both.
fn two_commits(fixture: &Fixture) -> (String, String) {
    let work = WorkTree::new();
    work.write("README", b"one\n");
    let first = work.commit("one");
    work.write("README", b"two\n");
    let second = work.commit("two");
    fixture.gitlab.publish(APP, &work);
    (first, second)
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read(&path)
            .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            found.push(path);
        }
    }
    found
}

/// The body a stage `eval`s: the script with its `eval` replaced by `printf`.
fn body(script: &str) -> String {
    let printing = script.replace("; eval ", "; printf '%s' ");
    let out = Command::new("/usr/bin/bash")
        .args(["-c", &printing])
        .output()
        .expect("bash");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn bash_syntax_ok(text: &str) -> Result<(), String> {
    let out = Command::new("/usr/bin/bash")
        .args(["-n", "-c", text])
        .output()
        .expect("bash -n");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A cache store answering presigned URLs for one object and GoCloud for the rest.
struct Store;

impl CacheUrls for Store {
    fn download(&self, object: &str) -> CacheAccess {
        CacheAccess::Presigned {
            url: format!("https://store.invalid/{object}?X-Amz-Signature=a&b=c d"),
            head_url: Some(format!("https://store.invalid/{object}?head")),
            headers: Vec::new(),
        }
    }
    fn upload(&self, object: &str) -> CacheAccess {
        CacheAccess::GoCloud {
            url: format!("azblob://cache/{object}"),
            env: vec![("AZURE_STORAGE_SAS_TOKEN".into(), "sv=1&sig=x\"y".into())],
        }
    }
}

fn rich_spec() -> JobSpec {
    let mut spec = JobSpec::new(
        "https://gitlab.example",
        7,
        APP,
        42,
        "glcbt-secret",
        &"a".repeat(40),
        "main",
    );
    spec.depth = 0;
    spec.submodule_strategy = SubmoduleStrategy::Recursive;
    spec.tls_ca_chain =
        Some("-----BEGIN CERTIFICATE-----\nMII'x\n-----END CERTIFICATE-----\n".into());
    spec.variables = vec![
        Variable::file("KUBECONFIG", "a: 'b'\n$HOME"),
        Variable::new("DIR", "$CI_PROJECT_DIR/out"),
    ];
    let mut cache = Cache::new("deps-$CI_COMMIT_REF_NAME", &["vendor/", "node modules/"]);
    cache.fallback_keys = vec!["deps-main".into()];
    cache.when = When::Always;
    spec.caches = vec![cache];
    spec.cache_fallback_key = Some("deps-default".into());
    spec.cache_urls = Arc::new(Store);
    let mut artifact = Artifact::new(&["dist/"]);
    artifact.exclude = vec!["dist/*.tmp".into()];
    artifact.expire_in = Some("1 week".into());
    spec.artifacts = vec![artifact];
    spec.dependencies = vec![Dependency {
        id: 41,
        name: "build".into(),
        token: "glcbt-dep".into(),
    }];
    spec.after_script = vec![
        "echo 'done'".into(),
        "if true; then\n  echo multi\nfi".into(),
    ];
    spec
}

#[test]
fn every_stage_script_and_its_body_are_valid_bash() {
    let spec = rich_spec();
    let mut all: Vec<&str> = stages(&spec, true);
    all.extend(stages(&spec, false));
    all.push("clear_worktree");
    for stage in all {
        let text = script(&spec, stage);
        assert!(text.starts_with("#!/usr/bin/env bash\n"), "{stage}");
        bash_syntax_ok(&text).unwrap_or_else(|e| panic!("{stage}: {e}"));
        let inner = body(&text);
        assert!(!inner.is_empty(), "{stage}: no body");
        bash_syntax_ok(&inner).unwrap_or_else(|e| panic!("{stage} body: {e}\n{inner}"));
    }
}

#[test]
fn the_stage_order_follows_the_runner() {
    let spec = rich_spec();
    let ok = [
        "prepare_script",
        "get_sources",
        "restore_cache",
        "download_artifacts",
        "build_script",
        "after_script",
        "archive_cache",
        "upload_artifacts_on_success",
        "cleanup_file_variables",
    ];
    assert_eq!(stages(&spec, true), ok);
    let failed = stages(&spec, false);
    assert!(failed.contains(&"archive_cache_on_failure"));
    assert!(
        !failed.iter().any(|s| s.starts_with("upload_artifacts")),
        "artifacts are on_success"
    );
    let plain = JobSpec::new("http://x", 1, APP, 1, "t", "s", "main");
    assert_eq!(
        stages(&plain, true),
        [
            "prepare_script",
            "get_sources",
            "build_script",
            "cleanup_file_variables"
        ]
    );
}

/// A fake `gitlab-runner` that records its arguments, one per line, and succeeds.
fn fake_runner(dir: &Path) -> PathBuf {
    let runner = dir.join("gitlab-runner");
    let log = dir.join("calls");
    let text = format!(
        "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\nfor a in \"$@\"; do printf '%s\\n' \"$a\" >> {}; done\necho ---- >> {}\n",
        log.display(),
        log.display()
    );
    std::fs::write(&runner, text).expect("the fake runner");
    Command::new("chmod")
        .arg("+x")
        .arg(&runner)
        .status()
        .expect("chmod");
    runner
}

/// Runs the four helper stages of a job with the rich spec's cache, artifacts and
/// dependencies against a fake `gitlab-runner`; its calls, each as its argument list.
fn helper_calls(fixture: &Fixture, spec: &mut JobSpec) -> Vec<Vec<String>> {
    let rich = rich_spec();
    (spec.caches, spec.cache_urls) = (rich.caches, rich.cache_urls);
    (spec.artifacts, spec.dependencies) = (rich.artifacts, rich.dependencies);
    spec.runner_command = fake_runner(fixture.dir.path()).display().to_string();
    fixture.get_sources(spec);
    let stages = [
        "restore_cache",
        "download_artifacts",
        "archive_cache",
        "upload_artifacts_on_success",
    ];
    for stage in stages {
        let ran = fixture.run(spec, stage);
        assert!(ran.ok, "{stage}:\n{}", ran.output);
    }
    let calls = std::fs::read_to_string(fixture.dir.path().join("calls")).expect("calls");
    calls
        .split("----\n")
        .map(|c| c.lines().map(String::from).collect())
        .collect()
}

fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

#[tokio::test(flavor = "multi_thread")]
async fn helper_commands_get_the_flags_and_values_the_runner_writes() {
    let fixture = Fixture::new().await;
    let (first, _) = two_commits(&fixture);
    let mut spec = fixture.job(APP, &first);
    spec.protected = true;
    let calls = helper_calls(&fixture, &mut spec);
    let (extractor, downloader, archiver, uploader) = (&calls[0], &calls[1], &calls[2], &calls[3]);
    let key = "deps-main-protected";
    assert_eq!(extractor[0], "cache-extractor");
    assert!(has_pair(
        extractor,
        "--file",
        &format!("../../../cache/group/app/{key}/cache.zip")
    ));
    let url =
        format!("https://store.invalid/runner/flotillaT/project/7/{key}?X-Amz-Signature=a&b=c d");
    assert!(has_pair(extractor, "--url", &url), "{extractor:?}");
    assert!(
        extractor.iter().any(|a| a == "--alternate-url"),
        "{extractor:?}"
    );
    let id = [
        "artifacts-downloader",
        "--url",
        &fixture.gitlab.url,
        "--token",
        "glcbt-dep",
        "--id",
        "41",
    ];
    assert_eq!(downloader, &id.map(String::from));
    assert!(
        has_pair(archiver, "--path", "node modules/"),
        "{archiver:?}"
    );
    let gocloud = archiver
        .windows(2)
        .any(|w| w[0] == "--gocloud-url" && w[1].starts_with("azblob://cache/runner/"));
    assert!(gocloud, "{archiver:?}");
    assert!(has_pair(uploader, "--expire-in", "1 week"), "{uploader:?}");
    assert!(has_pair(uploader, "--token", &spec.token), "{uploader:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_runner_command_only_warns_in_the_runners_words() {
    let fixture = Fixture::new().await;
    let (first, _) = two_commits(&fixture);
    let mut spec = fixture.job(APP, &first);
    spec.caches = vec![Cache::new("k", &["vendor/"])];
    spec.runner_command = "/nonexistent/gitlab-runner".into();
    fixture.get_sources(&spec);
    let ran = fixture.run(&spec, "restore_cache");
    assert!(ran.ok, "{}", ran.output);
    assert!(
        ran.output
            .contains("Missing /nonexistent/gitlab-runner. Extracting cache is disabled."),
        "{}",
        ran.output
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_checkout_is_the_jobs_sha_not_the_branch_tip() {
    let fixture = Fixture::new().await;
    let (first, second) = two_commits(&fixture);
    let spec = fixture.job(APP, &first);
    fixture.get_sources(&spec);
    let project = PathBuf::from(spec.project_dir());
    assert_eq!(head(&project), first);
    let tip = git(&project, &["rev-parse", "refs/remotes/origin/main"]);
    assert_eq!(tip.trim(), second, "the branch itself was fetched too");
    assert_eq!(
        std::fs::read_to_string(project.join("README")).expect("README"),
        "one\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_job_token_stays_out_of_the_git_config_and_is_gone_after_cleanup() {
    let fixture = Fixture::new().await;
    let (first, _) = two_commits(&fixture);
    let spec = fixture.job(APP, &first);
    fixture.get_sources(&spec);
    let project = PathBuf::from(spec.project_dir());
    let origin = git(&project, &["config", "remote.origin.url"]);
    assert_eq!(origin.trim(), format!("{}/{APP}.git", fixture.gitlab.url));
    assert_eq!(
        files_containing(&project.join(".git"), &spec.token),
        Vec::<PathBuf>::new()
    );
    let ran = fixture.run(&spec, "cleanup_file_variables");
    assert!(ran.ok, "{}", ran.output);
    let builds = fixture.dir.path().join("builds");
    assert_eq!(
        files_containing(&builds, &spec.token),
        Vec::<PathBuf>::new()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_token_fails_the_clone() {
    let fixture = Fixture::new().await;
    let (first, _) = two_commits(&fixture);
    let mut spec = fixture.job(APP, &first);
    spec.token = "glcbt-not-a-job".into();
    let ran = fixture.run(&spec, "get_sources");
    assert!(!ran.ok, "the clone succeeded:\n{}", ran.output);
    assert!(
        ran.output.contains("Authentication failed") || ran.output.contains("401"),
        "{}",
        ran.output
    );
}

/// The pack files a repository holds.
fn packs(project: &Path) -> Vec<String> {
    let mut packs: Vec<String> = std::fs::read_dir(project.join(".git/objects/pack"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    packs.retain(|p| p.ends_with(".pack"));
    packs.sort();
    packs
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fetch_job_reuses_the_worktree_and_a_clone_job_does_not() {
    let fixture = Fixture::new().await;
    let work = WorkTree::new();
    work.write("README", b"one\n");
    let first = work.commit("one");
    fixture.gitlab.publish(APP, &work);
    let spec = fixture.job(APP, &first);
    fixture.get_sources(&spec);
    let project = PathBuf::from(spec.project_dir());
    std::fs::write(project.join(".git/flotilla-marker"), "kept").expect("marker");
    let cleaned = fixture.run(&spec, "cleanup_file_variables");
    assert!(cleaned.ok, "{}", cleaned.output);
    let before = packs(&project);
    work.write("README", b"two\n");
    let second = work.commit("two");
    fixture.gitlab.publish(APP, &work);
    let mut fetch = fixture.job(APP, &second);
    fetch.git_strategy = GitStrategy::Fetch;
    fixture.get_sources(&fetch);
    assert_eq!(head(&project), second);
    assert!(
        project.join(".git/flotilla-marker").exists(),
        "the fetch re-cloned"
    );
    let after = packs(&project);
    assert!(
        before.iter().all(|p| after.contains(p)),
        "old objects were fetched again: {before:?} {after:?}"
    );
    let clone = fixture.job(APP, &second);
    fixture.get_sources(&clone);
    assert!(
        !project.join(".git/flotilla-marker").exists(),
        "a clone job kept the old repository"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn strategies_none_and_empty_check_nothing_out() {
    let fixture = Fixture::new().await;
    let (first, _) = two_commits(&fixture);
    let mut none = fixture.job(APP, &first);
    none.git_strategy = GitStrategy::None;
    fixture.get_sources(&none);
    let project = PathBuf::from(none.project_dir());
    assert!(project.is_dir() && !project.join(".git").exists());
    let mut empty = fixture.job(APP, &first);
    empty.git_strategy = GitStrategy::Empty;
    fixture.get_sources(&empty);
    let dir = PathBuf::from(empty.project_dir());
    assert!(dir.ends_with("app-empty"), "{}", dir.display());
    assert_eq!(std::fs::read_dir(&dir).expect("the empty dir").count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_depth_limited_clone_is_shallow_and_a_full_fetch_unshallows_it() {
    let fixture = Fixture::new().await;
    let (_, second) = two_commits(&fixture);
    let mut shallow = fixture.job(APP, &second);
    shallow.depth = 1;
    fixture.get_sources(&shallow);
    let project = PathBuf::from(shallow.project_dir());
    assert!(project.join(".git/shallow").exists());
    assert_eq!(git(&project, &["rev-list", "--count", "HEAD"]).trim(), "1");
    let mut full = fixture.job(APP, &second);
    (full.depth, full.git_strategy) = (0, GitStrategy::Fetch);
    fixture.get_sources(&full);
    assert!(!project.join(".git/shallow").exists());
    assert_eq!(git(&project, &["rev-list", "--count", "HEAD"]).trim(), "2");
}

/// `group/app` with `lib` at `../lib.git`, which has `deep` at `../deep.git`.
fn nested_submodules(fixture: &Fixture) -> String {
    let deep = WorkTree::new();
    deep.write("deep.txt", b"deep\n");
    let deep_sha = deep.commit("deep");
    fixture.gitlab.publish("group/deep", &deep);
    let lib = WorkTree::new();
    lib.write("lib.txt", b"lib\n");
    lib.submodule("deep", "../deep.git", &deep_sha);
    let lib_sha = lib.commit("lib");
    fixture.gitlab.publish("group/lib", &lib);
    let app = WorkTree::new();
    app.write("app.txt", b"app\n");
    app.submodule("lib", "../lib.git", &lib_sha);
    let sha = app.commit("app");
    fixture.gitlab.publish(APP, &app);
    fixture.gitlab.allow("group/lib", APP);
    fixture.gitlab.allow("group/deep", APP);
    sha
}

#[tokio::test(flavor = "multi_thread")]
async fn normal_submodules_with_relative_urls_are_checked_out_one_level_deep() {
    let fixture = Fixture::new().await;
    let sha = nested_submodules(&fixture);
    let mut spec = fixture.job(APP, &sha);
    spec.submodule_strategy = SubmoduleStrategy::Normal;
    fixture.get_sources(&spec);
    let project = PathBuf::from(spec.project_dir());
    assert!(
        project.join("lib/lib.txt").exists(),
        "lib was not checked out"
    );
    assert!(
        !project.join("lib/deep/deep.txt").exists(),
        "normal went recursive"
    );
    assert_eq!(
        files_containing(&project.join(".git"), &spec.token),
        Vec::<PathBuf>::new()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn recursive_submodules_reach_the_nested_one() {
    let fixture = Fixture::new().await;
    let sha = nested_submodules(&fixture);
    let mut spec = fixture.job(APP, &sha);
    spec.submodule_strategy = SubmoduleStrategy::Recursive;
    fixture.get_sources(&spec);
    let project = PathBuf::from(spec.project_dir());
    assert_eq!(
        std::fs::read_to_string(project.join("lib/deep/deep.txt")).expect("deep"),
        "deep\n"
    );
    let url = git(&project.join("lib"), &["config", "remote.origin.url"]);
    assert_eq!(url.trim(), format!("{}/group/lib.git", fixture.gitlab.url));
}

#[tokio::test(flavor = "multi_thread")]
async fn git_clean_flags_decide_what_a_fetch_job_removes() {
    let fixture = Fixture::new().await;
    let (first, _) = two_commits(&fixture);
    let spec = fixture.job(APP, &first);
    fixture.get_sources(&spec);
    let project = PathBuf::from(spec.project_dir());
    std::fs::write(project.join("junk.txt"), "x").expect("junk");
    std::fs::write(project.join("keep.me"), "x").expect("keep");
    let mut fetch = fixture.job(APP, &first);
    fetch.git_strategy = GitStrategy::Fetch;
    fetch.git_clean_flags = "-ffdx -e keep.me".into();
    fixture.get_sources(&fetch);
    assert!(!project.join("junk.txt").exists() && project.join("keep.me").exists());
    std::fs::write(project.join("junk.txt"), "x").expect("junk");
    let mut none = fixture.job(APP, &first);
    none.git_strategy = GitStrategy::Fetch;
    none.git_clean_flags = "none".into();
    fixture.get_sources(&none);
    assert!(
        project.join("junk.txt").exists(),
        "GIT_CLEAN_FLAGS=none cleaned"
    );
}

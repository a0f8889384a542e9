//! The GitLab fleet of a test: loopback sshd machines listed by the static plugin, one real
//! dockerd behind them, job images in the real CNCF registry (basic auth), flotilla itself,
//! and a runner's job as GitLab Runner's Custom executor drives it.
#![allow(dead_code)] // each test file uses a different part

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use super::{Flotilla, TOKEN};
use flotilla_connector::PoolKey;
use flotilla_peers::dockerd::{Dockerd, busybox_rootfs_tar};
use flotilla_peers::helper_image;
use flotilla_peers::registry::{Mode, Registry, WRITER};
use flotilla_peers::sshd::Sshd;
use flotilla_test_artifacts as guests;

/// The fleet, the engine and the registry of one test.
pub struct Fleet {
    pub docker: Dockerd,
    pub _machines: Vec<Sshd>,
    pub flotilla: Flotilla,
    pub registry: Registry,
    pub image: String,
    pub auth: String,
    pub token_file: PathBuf,
    /// The stand-in helper image (`--helper-image`), in the registry.
    pub helper_image: String,
    /// The operator's registry credentials for it (`--helper-registry-auth`, 0600).
    pub helper_auth: PathBuf,
}

pub fn docker_cli(docker: &Dockerd, config: &Path, args: &[&str]) -> Output {
    Command::new("docker")
        .arg("-H")
        .arg(format!("unix://{}", docker.socket().display()))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("the docker CLI (docker.io)")
}

pub fn config(key: &Path, machines: &[&Sshd], capacity: u32, extra: &str) -> String {
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
listen = "127.0.0.1:0"
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
username = "root"
allowed_ranges = ["127.0.0.0/8"]
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
    pub async fn start(machines: usize, capacity: u32, extra: &str) -> Fleet {
        Fleet::start_on(Dockerd::start(), machines, capacity, extra, None).await
    }

    /// A fleet whose machines reach the engine through `wrap(engine's socket)`, a socket of
    /// the test's (a proxy that misbehaves on purpose).
    pub async fn start_behind<T>(
        machines: usize,
        capacity: u32,
        wrap: impl FnOnce(std::path::PathBuf) -> (std::path::PathBuf, T),
    ) -> (Fleet, T) {
        let docker = Dockerd::start();
        let (socket, kept) = wrap(docker.socket());
        let fleet = Fleet::start_on(docker, machines, capacity, "", Some(socket)).await;
        (fleet, kept)
    }

    /// A fleet whose engine runs as Docker does by default, with its iptables rules, in a
    /// network namespace of its own. It cannot reach the registry on the host's loopback, so
    /// its job image is imported (run it with `--pull-policy never`).
    pub async fn start_with_iptables(machines: usize, capacity: u32) -> Fleet {
        let mut fleet =
            Fleet::start_on(Dockerd::start_with_iptables(), machines, capacity, "", None).await;
        let dir = tempfile::tempdir().expect("dir");
        fleet.image = "flotilla-test/busybox:1".into();
        fleet.helper_image = "flotilla-test/helper:1".into();
        let helper = helper_image::rootfs_tar(&helper_image::binary(), None);
        for (tar, image) in [
            (busybox_rootfs_tar(), &fleet.image),
            (helper, &fleet.helper_image),
        ] {
            let rootfs = dir.path().join("rootfs.tar");
            std::fs::write(&rootfs, tar).expect("rootfs");
            let out = docker_cli(
                &fleet.docker,
                dir.path(),
                &["import", &rootfs.display().to_string(), image],
            );
            assert!(out.status.success(), "{out:?}");
        }
        fleet
    }

    async fn start_on(
        docker: Dockerd,
        machines: usize,
        capacity: u32,
        extra: &str,
        socket: Option<PathBuf>,
    ) -> Fleet {
        Fleet::start_made(docker, machines, socket, |key, _, sshds| {
            config(key, sshds, capacity, extra)
        })
        .await
    }

    /// A fleet whose configuration `make(pool key file, API token file, machines)`
    /// writes (with `DOCKER_SOCKET` standing for the engine's socket).
    pub async fn start_with(
        machines: usize,
        make: impl FnOnce(&Path, &Path, &[&Sshd]) -> String,
    ) -> Fleet {
        Fleet::start_made(Dockerd::start(), machines, None, make).await
    }

    async fn start_made(
        docker: Dockerd,
        machines: usize,
        socket: Option<PathBuf>,
        make: impl FnOnce(&Path, &Path, &[&Sshd]) -> String,
    ) -> Fleet {
        let registry = Registry::start(Mode::Basic).await;
        let host = registry.host();
        // The job image: a FROM-scratch busybox, and the stand-in helper image, pushed to the
        // registry and then removed from the engine, so prepare really pulls them.
        let cli_config = tempfile::tempdir().expect("docker config dir");
        let image = format!("{}/ci/busybox:1", registry.host());
        let helper_image = format!("{}/ops/helper:1", registry.host());
        let rootfs = cli_config.path().join("rootfs.tar");
        std::fs::write(&rootfs, busybox_rootfs_tar()).expect("rootfs");
        let rootfs = rootfs.display().to_string();
        let helper_rootfs = cli_config.path().join("helper.tar");
        // An engine in a namespace of its own cannot reach the registry: it gets no image here.
        let reaches_registry = !docker.has_own_network();
        if reaches_registry {
            let tar = helper_image::rootfs_tar(&helper_image::binary(), None);
            std::fs::write(&helper_rootfs, tar).expect("helper rootfs");
        }
        let helper_rootfs = helper_rootfs.display().to_string();
        for args in [
            vec!["import", rootfs.as_str(), image.as_str()],
            vec!["import", helper_rootfs.as_str(), helper_image.as_str()],
            vec!["login", host.as_str(), "-u", WRITER.0, "-p", WRITER.1],
            vec!["push", image.as_str()],
            vec!["push", helper_image.as_str()],
            vec!["rmi", image.as_str()],
            vec!["rmi", helper_image.as_str()],
        ]
        .into_iter()
        .filter(|_| reaches_registry)
        {
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
        let refs: Vec<&Sshd> = sshds.iter().collect();
        let token_file = dir.path().join("token");
        flotilla_harness::write_secret(&token_file, TOKEN);
        // The operator's credentials for the helper image: the registry's writer, which no job
        // is given.
        let helper_auth = dir.path().join("helper-auth.json");
        flotilla_harness::write_secret(&helper_auth, &auth);
        let text = make(&key_file, &token_file, &refs).replace(
            "DOCKER_SOCKET",
            &socket
                .unwrap_or_else(|| docker.socket())
                .display()
                .to_string(),
        );
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
            helper_image,
            helper_auth,
        }
    }

    pub fn job(&self, id: u64) -> RunnerJob {
        RunnerJob::new(self, id)
    }

    /// A fleet whose helper image also trusts `ca_pem` (the test CA of HTTPS peers).
    pub async fn start_trusting(machines: usize, capacity: u32, ca_pem: &str) -> Fleet {
        let mut fleet = Fleet::start(machines, capacity, "").await;
        fleet.helper_image = fleet.push_image("ops/helper-trusting:1", Some(ca_pem), |_| {});
        fleet
    }

    /// Pushes an image made from the stand-in helper image's root (trusting `extra_ca` too),
    /// changed by `change`, to the fleet's registry as `name`; its full reference.
    pub fn push_image(
        &self,
        name: &str,
        extra_ca: Option<&str>,
        change: impl FnOnce(&Path),
    ) -> String {
        let root = helper_image::rootfs(&helper_image::binary(), extra_ca);
        change(root.path());
        let cli = tempfile::tempdir().expect("docker config dir");
        let tar = cli.path().join("image.tar");
        std::fs::write(&tar, helper_image::tar(root.path())).expect("image tar");
        let tar = tar.display().to_string();
        let image = format!("{}/{name}", self.registry.host());
        let host = self.registry.host();
        for args in [
            vec!["import", tar.as_str(), image.as_str()],
            vec!["login", host.as_str(), "-u", WRITER.0, "-p", WRITER.1],
            vec!["push", image.as_str()],
            vec!["rmi", image.as_str()],
        ] {
            let out = docker_cli(&self.docker, cli.path(), &args);
            assert!(out.status.success(), "docker {args:?}: {out:?}");
        }
        image
    }

    /// Nothing of any job is left on the engine, and no lease in the pool.
    pub async fn assert_clean(&self) {
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
pub struct RunnerJob {
    pub dir: tempfile::TempDir,
    pub env: BTreeMap<String, String>,
    pub args: Vec<String>,
}

/// What a stage did.
#[derive(Debug)]
pub struct StageResult {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl RunnerJob {
    pub fn new(fleet: &Fleet, id: u64) -> RunnerJob {
        RunnerJob::of_project(fleet, id, 77, false)
    }

    /// A job of project `project`, on a protected ref or not (as GitLab tells the runner).
    pub fn of_project(fleet: &Fleet, id: u64, project: u64, protected: bool) -> RunnerJob {
        let mut job = RunnerJob::on(
            &fleet.flotilla.base,
            &fleet.token_file,
            id,
            project,
            protected,
        );
        job.env
            .insert("CUSTOM_ENV_CI_JOB_IMAGE".to_string(), fleet.image.clone());
        job.env.insert(
            "CUSTOM_ENV_DOCKER_AUTH_CONFIG".to_string(),
            fleet.auth.clone(),
        );
        job.args.extend([
            "--helper-image".to_string(),
            fleet.helper_image.clone(),
            "--helper-registry-auth".to_string(),
            fleet.helper_auth.display().to_string(),
        ]);
        job
    }

    /// A job of the runner whose driver talks to the API at `base` with the token in
    /// `token_file`.
    pub fn on(base: &str, token_file: &Path, id: u64, project: u64, protected: bool) -> RunnerJob {
        let dir = tempfile::tempdir().expect("job dir");
        let response = dir.path().join("response.json");
        std::fs::write(
            &response,
            format!(
                r#"{{"id": {id}, "token": "glcbt-job-token", "job_info": {{"project_id": {project}, "name": "build"}}, "git_info": {{"ref": "main", "protected": {protected}}}}}"#
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
        ]);
        let args = vec![
            "--url".to_string(),
            base.to_string(),
            "--pool".into(),
            "ci".into(),
            "--token-file".into(),
            token_file.display().to_string(),
            "--acquire-timeout".into(),
            "60s".into(),
            // One runner's queued cleanups: every job of the fleet shares the directory.
            "--state-dir".into(),
            token_file
                .parent()
                .map(|d| d.join("driver-state"))
                .expect("the fleet's directory")
                .display()
                .to_string(),
        ];
        RunnerJob { dir, env, args }
    }

    /// The stage's process: the lean driver the runner runs, `flotilla-gitlab`.
    pub fn command(&self, stage: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flotilla-gitlab"));
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

    pub fn stage(&self, stage: &[&str]) -> StageResult {
        let out = self.stage_raw(stage);
        StageResult {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// The stage's process output, bytes as written.
    pub fn stage_raw(&self, stage: &[&str]) -> Output {
        self.command(stage).output().expect("flotilla-gitlab")
    }

    /// Writes a stage's script (0700, as the runner does) and returns its path.
    pub fn script(&self, stage: &str, body: &str) -> String {
        self.script_file(stage, &format!("#!/usr/bin/env sh\nset -e\n{body}\n"))
    }

    /// Writes a stage's script exactly as given (0700) and returns its path.
    pub fn script_file(&self, stage: &str, text: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(format!("script-{stage}"));
        std::fs::write(&path, text).expect("script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        path.display().to_string()
    }

    pub fn run(&self, stage: &str, body: &str) -> StageResult {
        let script = self.script(stage, body);
        self.stage(&["run", &script, stage])
    }

    pub fn build_exit_code(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("build_exit_code")).ok()
    }
}

/// One dockerd at a time: two engines would race for the machine's cgroups.
pub static DOCKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

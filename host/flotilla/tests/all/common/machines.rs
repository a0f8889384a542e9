//! A fleet of bare machines for the GitLab driver's instance mode: loopback sshd machines
//! listed by the static plugin, reached by the host with the pool's key, no Docker. A job's
//! processes run on this very host (the machines are sshd daemons on loopback), so a test can
//! look for them in /proc. The machines need what a machine image for instance mode has:
//! git (Debian's) and the runner's helper binary on the login shell's PATH; the stand-in
//! `gitlab-runner-helper` is put in this host's /usr/local/bin for that.
#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};

use super::fleet::RunnerJob;
use super::{Flotilla, TOKEN};
use flotilla_connector::PoolKey;
use flotilla_harness::poll;
use flotilla_peers::sshd::Sshd;
use flotilla_test_artifacts as guests;

/// The machines, flotilla, and where jobs' directories go.
pub struct Machines {
    pub machines: Vec<Sshd>,
    pub flotilla: Flotilla,
    pub token_file: PathBuf,
    /// The runner's `--machine-dir` (with a space and a quote, to try the quoting for real).
    pub machine_dir: PathBuf,
    /// Holds `machine_dir`.
    pub root: tempfile::TempDir,
}

impl Machines {
    /// `n` machines of `capacity` slots each; `extra` goes into the pool's table.
    pub async fn start(n: usize, capacity: u32, extra: &str) -> Machines {
        Machines::start_with(n, capacity, extra, "").await
    }

    /// The same, with `sshd_extra` in every machine's `sshd_config`.
    pub async fn start_with(n: usize, capacity: u32, extra: &str, sshd_extra: &str) -> Machines {
        Machines::start_full(n, capacity, extra, sshd_extra, "").await
    }

    /// The same, with `server_extra` in the `[server]` table.
    pub async fn start_full(
        n: usize,
        capacity: u32,
        extra: &str,
        sshd_extra: &str,
        server_extra: &str,
    ) -> Machines {
        install_runner_helper();
        let dir = tempfile::tempdir().expect("dir");
        let key = PoolKey::load_or_generate(&dir.path().join("keys"), "ci").expect("key");
        let key_file = dir.path().join("keys/ci/id_ed25519");
        let machines: Vec<Sshd> = (0..n)
            .map(|_| Sshd::start_with(key.public_openssh(), sshd_extra))
            .collect();
        let hosts: Vec<String> = machines
            .iter()
            .enumerate()
            .map(|(i, m)| {
                // The first machine stands in a zone (a static host's `zone`), the others in
                // none, so what the host passes on can be told from what it leaves out.
                let zone = if i == 0 { ", zone = \"rack-1\"" } else { "" };
                format!(
                    "{{ id = \"m{}\", address = \"127.0.0.1\", port = {}, username = \"root\"{zone} }}",
                    i + 1,
                    m.port
                )
            })
            .collect();
        let config = format!(
            r#"[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "5s"
{server_extra}
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
docker = false
ready_command = "test -d /"
ping_interval = "2s"
connect_timeout = "5s"

[[pool.policy]]
idle_count = {slots}
idle_time = "1h"
"#,
            plugin = guests::STATIC_PLUGIN,
            slots = n as u32 * capacity,
            hosts = hosts.join(", "),
            key = key_file.display(),
        );
        let token_file = dir.path().join("token");
        flotilla_harness::write_secret(&token_file, TOKEN);
        let root = tempfile::tempdir().expect("machine dir root");
        let machine_dir = root.path().join("it's a dir");
        let flotilla = Flotilla::start(dir, &config).await;
        flotilla
            .wait_for("/v1/pools/ci/instances", "ready machines", |b| {
                b["instances"]
                    .as_array()
                    .is_some_and(|l| l.iter().filter(|i| i["state"] == "ready").count() == n)
            })
            .await;
        Machines {
            machines,
            flotilla,
            token_file,
            machine_dir,
            root,
        }
    }

    /// A job as the runner drives it, with the driver in instance mode.
    pub fn job(&self, id: u64) -> RunnerJob {
        self.job_of(id, 77, false)
    }

    /// A job of `project` (of a protected ref or not), with the driver in instance mode.
    pub fn job_of(&self, id: u64, project: u64, protected: bool) -> RunnerJob {
        let mut job = RunnerJob::on(
            &self.flotilla.base,
            &self.token_file,
            id,
            project,
            protected,
        );
        job.args.extend([
            "--mode".into(),
            "instance".into(),
            "--machine-dir".into(),
            self.machine_dir.display().to_string(),
        ]);
        job
    }

    /// The job's directory on the machines.
    pub fn job_dir(&self, id: u64) -> PathBuf {
        self.machine_dir.join(id.to_string())
    }

    /// No lease is left in the pool.
    pub async fn assert_no_lease(&self) {
        let (_, body) = self.flotilla.call("GET", "/v1/pools/ci/leases", None).await;
        assert_eq!(
            body["leases"],
            serde_json::Value::Array(Vec::new()),
            "leases left"
        );
    }
}

/// The processes whose environment carries job `id`'s mark (`FLOTILLA_JOB=job-<id>;`).
pub fn processes_of_job(id: u64) -> Vec<(u32, String)> {
    let mark = format!("FLOTILLA_JOB=job-{id};");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == mark.as_bytes()) {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            // A zombie has an empty command line and is gone once reaped.
            if !cmd.trim().is_empty() {
                found.push((pid, cmd));
            }
        }
    }
    found
}

/// Waits up to `limit` for job `id` to have no process left; fails naming what is left.
pub fn wait_no_processes(id: u64, limit: std::time::Duration) {
    let what = format!("job {id} to have no process left");
    poll::until_blocking(&what, limit, || {
        let left = processes_of_job(id);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("processes of the job left: {left:?}"))
        }
    })
}

/// Whether `path` exists.
pub fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Puts the stand-in `gitlab-runner-helper` on the machines' PATH (this host's
/// /usr/local/bin), as a machine image for instance mode would have the real one; written
/// under a temporary name and renamed, so concurrent tests never see half a binary.
pub fn install_runner_helper() {
    // Once per test process: its tests start machines concurrently.
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(install_once);
}

fn install_once() {
    let built = flotilla_peers::helper_image::binary();
    let target = Path::new("/usr/local/bin/gitlab-runner-helper");
    let same = |a: &Path, b: &Path| std::fs::read(a).ok() == std::fs::read(b).ok();
    if target.exists() && same(&built, target) {
        return;
    }
    let temp = target.with_extension(format!("new-{}", std::process::id()));
    std::fs::copy(&built, &temp).expect("copy the stand-in helper to /usr/local/bin");
    std::fs::rename(&temp, target).expect("install the stand-in helper");
}

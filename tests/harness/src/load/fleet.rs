//! The fleet a load run drives: the engines behind the machines, the pool's configuration,
//! and the `flotilla run` process with its API and metrics addresses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use flotilla_peers::dockerd::{Dockerd, busybox_rootfs_tar};
use flotilla_peers::fake_engine::FakeEngine;
use flotilla_peers::process::Daemon;
use flotilla_peers::sshd::Sshd;
use flotilla_peers::{helper_image, poll};

use flotilla_peers::gcp_cloud::{self, GcpCloud};

use super::{Engine, HELPER, IMAGE, Options, Plugin, TOKEN};

/// Where the GCP stand-in puts its instances: `127.0.1.N`, on loopback, where the machines
/// listen (the group's `n`th instance at `n % 250 + 2`, as the stand-in numbers them).
const GCP_PREFIX: &str = "127.0.1.";

/// The Compute stand-in, its instances on loopback, `instances.get` slowed by `latency`.
pub(super) async fn gcp_cloud(latency: Duration) -> GcpCloud {
    let cloud = GcpCloud::start(false).await;
    cloud.with(|s| {
        s.address_prefix = GCP_PREFIX.into();
        s.get_latency = latency;
    });
    cloud
}

/// The machines: for the static plugin each sshd on its own port of 127.0.0.1; for the GCP
/// plugin the group's instances' addresses, on one port, as a cloud's machines are. Each sees
/// its own fake engine at the configured socket path.
pub(super) fn machines(o: &Options, public: &str, engine: &Running) -> Vec<Sshd> {
    let port = Sshd::free_port();
    (0..o.machines)
        .map(|i| {
            let fake = match engine {
                Running::Fake(all, _) => all.get(i).map(|f| f.socket()),
                Running::Real(_) => None,
            };
            let shared = engine.socket();
            let mounted = fake.as_deref().map(|own| (own, shared.as_path()));
            match (o.plugin, mounted) {
                (Plugin::Gcp(_), mounted) => {
                    let address = format!("{GCP_PREFIX}{}", (i + 1) % 250 + 2);
                    Sshd::start_at(public, &address, port, mounted)
                }
                (Plugin::Static, Some((own, at))) => Sshd::start_with_engine(public, own, at),
                (Plugin::Static, None) => Sshd::start(public),
            }
        })
        .collect()
}

/// The engine a run holds while it runs: one real engine every machine shares, or a fake
/// one per machine, each seen at the same path by its machine's sessions.
pub(super) enum Running {
    Real(Dockerd),
    Fake(Vec<FakeEngine>, tempfile::TempDir),
}

impl Running {
    pub(super) fn start(engine: Engine, script_time: Duration, machines: usize) -> Running {
        match engine {
            Engine::Fake => Running::Fake(
                (0..machines)
                    .map(|_| FakeEngine::start(script_time))
                    .collect(),
                tempfile::tempdir().expect("dir"),
            ),
            Engine::Dockerd => {
                let docker = Dockerd::start();
                let dir = tempfile::tempdir().expect("dir");
                let helper = helper_image::rootfs_tar(&helper_image::binary(), None);
                for (tar, image) in [(busybox_rootfs_tar(), IMAGE), (helper, HELPER)] {
                    let file = dir.path().join("rootfs.tar");
                    std::fs::write(&file, tar).expect("rootfs");
                    let out = Command::new("docker")
                        .arg("-H")
                        .arg(format!("unix://{}", docker.socket().display()))
                        .arg("--config")
                        .arg(dir.path())
                        .arg("import")
                        .arg(&file)
                        .arg(image)
                        .output()
                        .expect("the docker CLI");
                    assert!(out.status.success(), "docker import: {out:?}");
                }
                Running::Real(docker)
            }
        }
    }

    pub(super) fn stage_runs(&self) -> Option<u64> {
        match self {
            Running::Fake(all, _) => Some(all.iter().map(|f| f.with(|s| s.stage_runs)).sum()),
            Running::Real(_) => None,
        }
    }

    /// Requests the fake engines have answered, and connections they have accepted (`None` on
    /// a real engine).
    pub(super) fn requests(&self) -> Option<(u64, u64)> {
        match self {
            Running::Fake(all, _) => Some(all.iter().fold((0, 0), |(r, c), f| {
                f.with(|s| (r + s.requests, c + s.accepted))
            })),
            Running::Real(_) => None,
        }
    }

    pub(super) fn socket(&self) -> PathBuf {
        match self {
            Running::Real(d) => d.socket(),
            Running::Fake(_, shared) => shared.path().join("docker.sock"),
        }
    }

    /// Waits up to 5 s for the engines' connections to close (a channel's close is sent a
    /// moment after its stream is dropped).
    pub(super) async fn settle(&self) {
        if let Running::Fake(all, _) = self {
            for _ in 0..50 {
                if all.iter().all(|f| f.with(|s| s.open_connections) == 0) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// What the jobs left behind on the engine, and the requests it could not answer.
    pub(super) fn leftovers(&self) -> Vec<String> {
        match self {
            Running::Fake(all, _) => all
                .iter()
                .flat_map(|f| {
                    f.with(|s| {
                        let mut left: Vec<String> = s
                            .containers
                            .keys()
                            .chain(s.networks.keys())
                            .map(|n| format!("left on the engine: {n}"))
                            .collect();
                        left.extend(s.unknown.iter().map(|r| format!("the fake engine had no answer for {r}")));
                        if s.open_connections > 0 {
                            let mut by: BTreeMap<String, u64> = BTreeMap::new();
                            for line in s.last_request.values() {
                                // The route, without the object's name.
                                let route: Vec<&str> = line.split('/').take(4).collect();
                                *by.entry(route.join("/")).or_default() += 1;
                            }
                            left.push(format!(
                                "{} connection(s) to an engine left open, by their last request: {by:?}",
                                s.open_connections
                            ));
                        }
                        left
                    })
                })
                .collect(),
            Running::Real(d) => {
                let out = Command::new("docker")
                    .arg("-H")
                    .arg(format!("unix://{}", d.socket().display()))
                    .args(["ps", "-aq", "--filter", "label=io.flotilla.gitlab.job"])
                    .output()
                    .expect("the docker CLI");
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|id| format!("left on the engine: container {id}"))
                    .collect()
            }
        }
    }
}

/// The pool's plugin, its settings and what it may reach: the static plugin listing the
/// machines, or the GCP plugin managing the stand-in's group (the connector's `port` line
/// with it: the instances share one SSH port).
fn plugin(sshds: &[Sshd], cloud: Option<&GcpCloud>) -> (String, String) {
    let Some(cloud) = cloud else {
        let hosts: Vec<String> = sshds
            .iter()
            .enumerate()
            .map(|(i, m)| {
                format!(
                    "{{ id = \"m{i}\", address = \"127.0.0.1\", port = {}, username = \"root\" }}",
                    m.port
                )
            })
            .collect();
        let pool = format!(
            "plugin = \"{}\"\n\n[pool.plugin_config]\nhosts = [{}]\n",
            flotilla_test_artifacts::STATIC_PLUGIN,
            hosts.join(", ")
        );
        return (pool, String::new());
    };
    let endpoint = &cloud.endpoint;
    let pool = format!(
        r#"plugin = "{plugin}"
allowed_outbound_hosts = ["{endpoint}"]
allowed_ip_ranges = ["127.0.0.0/8"]

[pool.plugin_config]
project = "{project}"
zone = "{zone}"
name = "{group}"
max_size = {n}
endpoint = "{endpoint}"

[[pool.credentials]]
name = "gcp"
kind = "gcp"
metadata_endpoint = "{endpoint}"
scopes = ["https://www.googleapis.com/auth/compute"]
hosts = ["{endpoint}"]
"#,
        plugin = flotilla_test_artifacts::GCP_PLUGIN,
        project = gcp_cloud::PROJECT,
        zone = gcp_cloud::ZONE,
        group = gcp_cloud::GROUP,
        n = sshds.len(),
    );
    let port = sshds.first().map_or(22, |m| m.port);
    (pool, format!("port = {port}\n"))
}

/// The pool's configuration: the machines, the connector, every slot kept idle and ready.
pub(super) fn config(
    o: &Options,
    key: &Path,
    socket: &Path,
    sshds: &[Sshd],
    cloud: Option<&GcpCloud>,
) -> String {
    let (plugin, port) = plugin(sshds, cloud);
    format!(
        r#"[server]
listen = "127.0.0.1:0"
metrics_listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "5s"

[[pool]]
name = "ci"
capacity_per_instance = {capacity}
max_instances = {n}
instance_acquire_timeout = "600s"
{plugin}
[pool.connector]
username = "root"
{port}allowed_ranges = ["127.0.0.0/8"]
ssh_key = {{ file = "{key}" }}
docker_socket = "{socket}"

[[pool.policy]]
idle_count = {slots}
idle_time = "1h"
"#,
        capacity = o.capacity,
        n = sshds.len(),
        slots = sshds.len() as u64 * u64::from(o.capacity),
        key = key.display(),
        socket = socket.display(),
    )
}

/// A started `flotilla run`, its API and metrics addresses.
pub(super) struct Host {
    pub(super) daemon: Daemon,
    pub(super) api: String,
    pub(super) metrics: String,
}

impl Host {
    pub(super) async fn start(o: &Options, dir: &Path, text: &str) -> Host {
        let file = dir.join("flotilla.toml");
        std::fs::write(&file, text).expect("config");
        let mut command = Command::new(&o.flotilla);
        command
            .args(["run", "-c"])
            .arg(&file)
            .env("FLOTILLA_LOG", "info")
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("XDG_DATA_HOME", dir.join("data"));
        let mut daemon = Daemon::spawn(command, &dir.join("flotilla.log"));
        let limit = Duration::from_secs(120);
        let api = daemon
            .logged("flotilla is listening", "listen", limit)
            .await;
        let metrics = daemon
            .logged("serving /metrics", "metrics_listen", limit)
            .await;
        let host = Host {
            daemon,
            api,
            metrics,
        };
        let want = o.machines;
        poll::until("every machine to be ready", limit, || async {
            let (_, body) = get(&host.api, "/v1/pools/ci/instances").await;
            let ready = body.matches("\"state\":\"ready\"").count();
            if ready == want {
                Ok(())
            } else {
                Err(format!(
                    "{ready} of {want} ready\n{}",
                    host.daemon.own_log()
                ))
            }
        })
        .await;
        host
    }
}

/// `GET path` on `addr` with the API token, HTTP/1.0 (a body without chunks): status and body.
pub async fn get(addr: &str, path: &str) -> (u16, String) {
    call(addr, "GET", path, "").await
}

/// `method path` with `body` (JSON when not empty) on `addr` with the API token, HTTP/1.0:
/// status and body.
pub async fn call(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let content = if body.is_empty() {
        String::new()
    } else {
        format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        )
    };
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n{content}\r\n{body}"
    );
    if stream.write_all(request.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The value of an unlabelled gauge in a `/metrics` text.
pub(super) fn gauge(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

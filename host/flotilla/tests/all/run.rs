//! `flotilla run` and `flotilla config check` as an operator uses them: the real binary, the
//! static plugin, the lease API over HTTP, metrics checked by promtool, drain on SIGTERM.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use flotilla_test_artifacts as guests;
use serde_json::Value;

use crate::common;

use common::{Flotilla, TOKEN};
use flotilla_harness::poll;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    dir
}

fn config(idle_count: u32, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "20s"

[[pool]]
name = "local"
plugin = "{plugin}"
capacity_per_instance = 2
max_instances = 3
instance_acquire_timeout = "10s"
update_interval = "1s"
{extra}
[pool.plugin_config]
hosts = [{{ address = "127.0.0.1" }}, {{ address = "127.0.0.2" }}, {{ address = "127.0.0.3" }}]

[[pool.policy]]
idle_count = {idle_count}
idle_time = "1h"
"#,
        plugin = guests::STATIC_PLUGIN
    )
}

/// The common runner with this file's pool, and the calls its tests make.
struct Server {
    f: Flotilla,
    base: String,
    client: reqwest::Client,
    config: PathBuf,
}

impl Server {
    async fn start(idle_count: u32) -> Server {
        let dir = tempfile::tempdir().expect("dir");
        let config = dir.path().join("flotilla.toml");
        let f = Flotilla::start(dir, &config_text(idle_count)).await;
        Server {
            base: f.base.clone(),
            client: f.client.clone(),
            f,
            config,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                (
                    status,
                    serde_json::from_str(&text).unwrap_or(Value::String(text)),
                )
            }
            Err(_) => (0, Value::Null),
        }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, token).await
    }

    async fn post(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(TOKEN)).await
    }

    async fn pool(&self) -> Value {
        self.get("/v1/pools", Some(TOKEN)).await.1["pools"]["local"]["status"].clone()
    }

    async fn wait_for(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        poll::until(what, Duration::from_secs(20), || async {
            let status = self.pool().await;
            if check(&status) {
                Ok(status)
            } else {
                Err(status)
            }
        })
        .await
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.f.process.id().to_string()])
            .status()
            .map(|s| s.success());
        assert_eq!(ok.ok(), Some(true));
    }
}

fn config_text(idle_count: u32) -> String {
    config(idle_count, "")
}

#[tokio::test]
async fn lease_lifecycle_over_http() {
    let s = Server::start(2).await;
    // Unauthenticated and wrongly authenticated calls get 401 with no detail.
    for token in [None, Some("wrong")] {
        let (code, body) = s.get("/v1/pools", token).await;
        assert_eq!(code, 401);
        assert_eq!(body["error"]["code"], "unauthorized");
        assert!(!body.to_string().contains(TOKEN));
    }
    let ready = s
        .wait_for("idle capacity", |p| {
            p["slots"]["idle"] == 2 && p["instances"]["ready"] == 1
        })
        .await;
    assert_eq!(ready["desired"], 1);
    let (code, _) = s.get("/readyz", None).await;
    assert_eq!(code, 200);

    let (code, body) = s.post("/v1/pools/local/leases").await;
    assert_eq!(code, 201, "{body}");
    let id = body["lease"]["id"].as_u64().unwrap_or_default();
    assert_eq!(body["lease"]["state"]["state"], "reserved");
    let (code, body) = s
        .post(&format!("/v1/pools/local/leases/{id}/acquire"))
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["instance"], "127.0.0.1");
    assert_eq!(body["connection"]["protocol"], "ssh");
    // Demand changed: the idle target is restored on another instance.
    let status = s
        .wait_for("replacement idle capacity", |p| {
            p["slots"]["idle"].as_u64() >= Some(2)
        })
        .await;
    assert_eq!(status["slots"]["acquired"], 1);
    let (code, list) = s.get("/v1/pools/local/leases", Some(TOKEN)).await;
    assert_eq!(
        (code, list["leases"].as_array().map(Vec::len)),
        (200, Some(1))
    );

    let (code, _) = s
        .post(&format!("/v1/pools/local/leases/{id}/release"))
        .await;
    assert_eq!(code, 200);
    let (code, body) = s
        .post(&format!("/v1/pools/local/leases/{id}/release"))
        .await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (404, Some("unknown_lease")),
        "double release"
    );
    let (code, body) = s
        .call(
            reqwest::Method::DELETE,
            "/v1/pools/local/leases/999",
            Some(TOKEN),
        )
        .await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (404, Some("unknown_lease"))
    );
    let (code, body) = s.post("/v1/pools/local/leases/abc/acquire").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (400, Some("bad_lease_id"))
    );
    let (code, body) = s.post("/v1/pools/nope/leases").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (404, Some("unknown_pool"))
    );
    // Capacity: 3 instances x 2 slots.
    let mut ids = Vec::new();
    for _ in 0..6 {
        let (code, body) = s.post("/v1/pools/local/leases").await;
        assert_eq!(code, 201, "{body}");
        ids.push(body["lease"]["id"].as_u64().unwrap_or_default());
    }
    let (code, body) = s.post("/v1/pools/local/leases").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (429, Some("at_capacity"))
    );
    for id in ids {
        let (code, _) = s
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/pools/local/leases/{id}"),
                Some(TOKEN),
            )
            .await;
        assert_eq!(code, 200);
    }
    assert_eq!(
        s.pool().await["slots"]["reserved"],
        0,
        "state intact after the refusals"
    );
}

#[tokio::test]
async fn metrics_pass_promtool() {
    let s = Server::start(2).await;
    s.wait_for("ready", |p| p["instances"]["ready"] == 1).await;
    let (code, _) = s.post("/v1/pools/local/leases").await;
    assert_eq!(code, 201);
    let families = [
        "flotilla_instances{",
        "flotilla_desired_instances{",
        "flotilla_slots{",
        "flotilla_provider_operations_total{",
        "flotilla_provider_operation_duration_seconds_bucket{",
        "flotilla_instance_creation_to_ready_seconds_bucket{",
        "flotilla_scale_operations_total{",
        "flotilla_egress_denied_total{",
        "flotilla_credential_remints_total{",
        "flotilla_acquires_waiting{",
        "flotilla_build_info{",
        "flotilla_http_requests_total{",
        "flotilla_http_request_duration_seconds_bucket{",
        "flotilla_http_requests_in_flight ",
        "flotilla_connections_open{listener=\"api\"}",
        "flotilla_connections_accepted_total{listener=\"api\"}",
        "flotilla_journal_commit_duration_seconds_bucket{",
        "flotilla_plugin_call_wait_seconds_total{",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_threads ",
        "process_start_time_seconds ",
    ];
    let text = poll::until("every metric family", Duration::from_secs(8), || async {
        let text = s
            .client
            .get(format!("{}/metrics", s.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let text = text.text().await.unwrap_or_default();
        match families.iter().find(|family| !text.contains(**family)) {
            None => Ok(text),
            Some(family) => Err(format!("{family} missing from:\n{text}")),
        }
    })
    .await;
    assert!(text.contains(r#"flotilla_slots{plugin="#) && text.contains(r#"pool="local""#));
    // The process figures are read, not left at zero.
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
    };
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_threads",
        "process_start_time_seconds",
    ] {
        assert!(value(name) > 0.0, "{name} is 0");
    }
    // By the route's pattern: the pool's name and lease ids stay out of the labels.
    assert!(
        text.contains(r#"flotilla_http_requests_total{code="201",method="POST",route="/v1/pools/{pool}/leases"} 1"#),
        "{text}"
    );
    assert!(
        value("flotilla_http_requests_in_flight") >= 1.0,
        "this scrape is in flight"
    );
    assert!(
        value("flotilla_connections_open{listener=\"api\"}") >= 1.0,
        "this scrape's connection is open"
    );
    assert!(text.contains(&format!(
        "flotilla_build_info{{arch=\"{}\",os=\"linux\",version=\"{}\",wit=\"0.1.4\"}} 1",
        std::env::consts::ARCH,
        env!("CARGO_PKG_VERSION")
    )));
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("promtool is required (Debian package prometheus): {e}"));
    promtool
        .stdin
        .take()
        .map(|mut i| i.write_all(text.as_bytes()));
    let out = promtool
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn sighup_reloads_the_policies() {
    let s = Server::start(2).await;
    s.wait_for("ready", |p| p["desired"] == 1).await;
    // The same server address (a reload keeps its listener), a new policy.
    let text = config_text(5).replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{}\"", s.f.port()),
    );
    std::fs::write(&s.config, text).expect("rewrite the config");
    s.signal("-HUP");
    s.wait_for("reloaded policy", |p| p["desired"] == 3).await;
}

#[tokio::test]
async fn sigterm_drains_until_the_last_lease_is_released() {
    let mut s = Server::start(2).await;
    s.wait_for("ready", |p| p["desired"] == 1).await;
    let (_, body) = s.post("/v1/pools/local/leases").await;
    let id = body["lease"]["id"].as_u64().expect("a lease id");
    let (code, _) = s
        .post(&format!("/v1/pools/local/leases/{id}/acquire"))
        .await;
    assert_eq!(code, 200);
    s.signal("-TERM");
    poll::until("the drain to begin", Duration::from_secs(3), || async {
        let (code, body) = s.get("/readyz", None).await;
        if body["pools"]["(process)"] == "draining" {
            Ok(())
        } else {
            Err(format!("{code} {body}"))
        }
    })
    .await;
    let (code, body) = s.post("/v1/pools/local/leases").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (503, Some("shutting_down"))
    );
    let (code, _) = s.get("/readyz", None).await;
    assert_eq!(code, 503, "draining is not ready");
    assert!(
        s.f.process.try_wait().is_none(),
        "still running while a lease is held"
    );
    let (code, _) = s
        .post(&format!("/v1/pools/local/leases/{id}/release"))
        .await;
    assert_eq!(code, 200);
    let status = poll::until(
        "the exit after the last lease",
        Duration::from_secs(10),
        || {
            let status = s.f.process.try_wait();
            async move { status.ok_or("still running") }
        },
    )
    .await;
    assert!(status.success());
}

fn check(path: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["config", "check", "-c"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn config_check_reports_every_error_with_file_line_and_key() {
    let dir = temp_dir("check");
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        config_text(2).replace("127.0.0.1:0", "127.0.0.1:8080"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (code, out) = check(&good);
    assert_eq!(code, 0, "{out}");

    let bad = dir.join("bad.toml");
    let text = format!(
        r#"[[pool]]
name = "a"
plugin = "{plugin}"
capacity_per_instance = 0
max_instances = 2
allowed_outbound_hosts = ["https://api.example.com/path"]

[[pool.policy]]
periods = ["61 * * * *"]
timezone = "Mars/Olympus"
idle_count = 100
"#,
        plugin = guests::STATIC_PLUGIN
    );
    std::fs::write(&bad, text).unwrap_or_else(|e| panic!("{e}"));
    let (code, out) = check(&bad);
    assert_eq!(code, 1);
    let file = bad.display().to_string();
    for expected in [
        format!("{file}:4: pool[0].capacity_per_instance: must be at least 1"),
        format!("{file}:6: pool[0].allowed_outbound_hosts[0]:"),
        format!("{file}:9: pool[0].policy[0].periods[0]:"),
        format!("{file}:10: pool[0].policy[0].timezone: unknown timezone"),
        format!("{file}:11: pool[0].policy[0].idle_count: 100 idle slots can never be met"),
    ] {
        assert!(out.contains(&expected), "missing {expected:?} in:\n{out}");
    }
    assert!(out.contains("5 problem(s) found"), "{out}");

    let unknown = dir.join("unknown.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:1\"\ncolour = \"blue\"\n\n[[pool]]\nname = \"a\"\nplugin = \"{}\"\nmax_instances = 1\nmax_instance = 2\n\n[[pool.policy]]\nidle_cont = 1\n",
        guests::STATIC_PLUGIN
    );
    std::fs::write(&unknown, text).unwrap_or_else(|e| panic!("{e}"));
    let (code, out) = check(&unknown);
    assert_eq!(code, 1);
    let file = unknown.display();
    for expected in [
        format!("{file}:3: server.colour: unknown key"),
        format!("{file}:9: pool[0].max_instance: unknown key"),
        format!("{file}:12: pool[0].policy[0].idle_cont: unknown key"),
        // The plugin's own verdict on its (absent) settings, in the same pass.
        format!("{file}:5: pool[0].plugin_config: the plugin refused it: hosts: missing"),
    ] {
        assert!(out.contains(&expected), "missing {expected:?} in:\n{out}");
    }
    assert!(
        out.contains("4 problem(s) found"),
        "every unknown key at once: {out}"
    );

    // A fallback names another pool that has none of its own.
    let chained = dir.join("fallback.toml");
    let pool = |name: &str, fallback: &str| {
        format!(
            "[[pool]]\nname = \"{name}\"\nplugin = \"{}\"\nmax_instances = 1\nfallback = \"{fallback}\"\nplugin_config = {{ hosts = [\"h\"] }}\n\n",
            guests::STATIC_PLUGIN
        )
    };
    let text = [
        pool("a", "b"),
        pool("b", "c"),
        pool("c", "c"),
        pool("d", "nowhere"),
    ]
    .concat();
    std::fs::write(&chained, text).expect("write the config");
    let (code, out) = check(&chained);
    assert_eq!(code, 1, "{out}");
    let file = chained.display();
    for expected in [
        format!("{file}:5: pool[0].fallback: pool \"b\" has a fallback of its own (\"c\")"),
        format!("{file}:12: pool[1].fallback: pool \"c\" has a fallback of its own (\"c\")"),
        format!("{file}:19: pool[2].fallback: a pool cannot be its own fallback"),
        format!("{file}:26: pool[3].fallback: no pool is named \"nowhere\""),
    ] {
        assert!(out.contains(&expected), "missing {expected:?} in:\n{out}");
    }
}

#[test]
fn config_check_locates_connector_mistakes() {
    let dir = temp_dir("connector-check");
    let bad = dir.join("bad.toml");
    let text = format!(
        "[[pool]]\nname = \"a\"\nplugin = \"{}\"\nmax_instances = 1\n\n[pool.connector]\nready_timeout = \"0s\"\nssh_key = {{ file = \"missing.key\" }}\ndocker_tls = {{ ca = {{ file = \"ca.pem\" }}, cert = {{ file = \"c.pem\" }}, key = {{ file = \"k.pem\" }} }}\n",
        guests::STATIC_PLUGIN
    );
    std::fs::write(&bad, text).expect("write the config");
    let (code, out) = check(&bad);
    assert_eq!(code, 1, "{out}");
    let file = bad.display();
    for expected in [
        format!("{file}:7: pool[0].connector.ready_timeout: must be greater than zero"),
        format!("{file}:8: pool[0].connector.ssh_key.file:"),
        format!("{file}:9: pool[0].connector.docker_tls.ca.file:"),
        format!("{file}:9: pool[0].connector.docker_tls.key.file:"),
    ] {
        assert!(out.contains(&expected), "missing {expected:?} in:\n{out}");
    }
    let unknown = dir.join("unknown.toml");
    let text = format!(
        "[[pool]]\nname = \"a\"\nplugin = \"{}\"\nmax_instances = 1\n\n[pool.connector]\nready_comand = \"true\"\n",
        guests::STATIC_PLUGIN
    );
    std::fs::write(&unknown, text).expect("write the config");
    let (code, out) = check(&unknown);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "{}:7: pool[0].connector.ready_comand: unknown key; did you mean `ready_command`? (known here: username,",
            unknown.display()
        )),
        "{out}"
    );
}

/// A service started with a soft open-file limit of 256 (the hard one higher) raises it to the
/// hard limit at start: a hundred jobs' streams need more than a distribution's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_to_the_hard_limit_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("flotilla.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"a\"\nplugin = \"{}\"\nmax_instances = 1\n[pool.plugin_config]\nhosts = [{{ address = \"127.0.0.1\" }}]\n",
            guests::STATIC_PLUGIN
        ),
    )
    .expect("config");
    let mut command = std::process::Command::new("sh");
    command
        .args([
            "-c",
            "ulimit -Sn 256 && ulimit -Hn 4096 && exec \"$0\" run -c \"$1\"",
        ])
        .arg(env!("CARGO_BIN_EXE_flotilla"))
        .arg(&config)
        .env("FLOTILLA_LOG", "info")
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .env("XDG_DATA_HOME", dir.path().join("data"));
    let mut daemon =
        flotilla_harness::process::Daemon::spawn(command, &dir.path().join("flotilla.log"));
    daemon
        .logged(
            "flotilla is listening",
            "listen",
            std::time::Duration::from_secs(60),
        )
        .await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", daemon.id())).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a line");
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers, ["4096", "4096"], "{line}");
    assert!(
        daemon.log().contains("open-file limit raised"),
        "{}",
        daemon.log()
    );
}

/// `server.file_sd` keeps a file holding the same machine list as `/sd/prometheus`, in the
/// format `file_sd_configs` reads, and rewrites it whole when the fleet changes. The pool has
/// no connector: each machine's address still comes from the plugin (`connect-info`, asked once
/// per machine in the background), so every machine is a target at node_exporter's port.
#[tokio::test]
async fn the_machine_list_is_written_for_file_sd() {
    let dir = tempfile::tempdir().expect("dir");
    let targets = dir.path().join("targets.json");
    let text = config(2, "").replacen(
        "shutdown_grace = \"20s\"\n",
        &format!(
            "shutdown_grace = \"20s\"\nsd_token = {{ value = \"sd-secret\" }}\nfile_sd = \"{}\"\n",
            targets.display()
        ),
        1,
    );
    let f = Flotilla::start(dir, &text).await;
    let client = f.client.clone();
    let listed = |n: usize| {
        let targets = targets.clone();
        let client = client.clone();
        let base = f.base.clone();
        async move {
            let file: Value = std::fs::read_to_string(&targets)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null);
            let groups = file.as_array().map_or(0, Vec::len);
            if groups != n {
                return Err(format!("{groups} groups in {file}"));
            }
            let http: Value = client
                .get(format!("{base}/sd/prometheus"))
                .bearer_auth("sd-secret")
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            if http != file {
                return Err(format!("the file {file} is not the HTTP answer {http}"));
            }
            Ok(file)
        }
    };
    let file = poll::until("one machine in the file", Duration::from_secs(20), || {
        listed(1)
    })
    .await;
    assert_eq!(file[0]["labels"]["__meta_flotilla_pool"], "local", "{file}");
    // Demand for two more instances: the file follows.
    for _ in 0..3 {
        let (code, _) = f
            .call(
                "POST",
                "/v1/pools/local/leases",
                Some(serde_json::json!({})),
            )
            .await;
        assert_eq!(code, 201);
    }
    let file = poll::until(
        "three machines in the file, each a target",
        Duration::from_secs(20),
        || {
            let listed = listed(3);
            async move {
                let file = listed.await?;
                let mut targets: Vec<String> = Vec::new();
                for group in file.as_array().into_iter().flatten() {
                    targets.extend(
                        group["targets"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|t| t.as_str().map(str::to_string)),
                    );
                }
                targets.sort();
                if targets != ["127.0.0.1:9100", "127.0.0.2:9100", "127.0.0.3:9100"] {
                    return Err(format!("targets {targets:?} in {file}"));
                }
                Ok(file)
            }
        },
    )
    .await;
    for group in file.as_array().into_iter().flatten() {
        let labels = &group["labels"];
        let target = group["targets"][0].as_str().unwrap_or_default();
        assert_eq!(
            Some(target),
            labels["__meta_flotilla_addresses"]
                .as_str()
                .map(|a| format!("{a}:9100"))
                .as_deref(),
            "{file}"
        );
        assert_eq!(labels["__meta_flotilla_os"], "linux", "{file}");
        assert!(
            labels["__meta_flotilla_group"]
                .as_str()
                .is_some_and(|g| !g.is_empty()),
            "{file}"
        );
    }
    // The lease token opens nothing here; neither does no token.
    for token in [None, Some(TOKEN)] {
        assert_eq!(sd(&f, token).await.0, 401, "{token:?}");
    }
}

/// `/sd/prometheus` asked with `token`: the status and the body.
async fn sd(f: &Flotilla, token: Option<&str>) -> (u16, String) {
    let mut request = f.client.get(format!("{}/sd/prometheus", f.base));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let answer = request.send().await.expect("sd");
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap_or_default())
}

/// Without `server.sd_token` the machine list is closed (401, naming the setting), never open.
#[tokio::test]
async fn the_machine_list_is_closed_without_its_token() {
    let dir = tempfile::tempdir().expect("dir");
    let f = Flotilla::start(dir, &config(1, "")).await;
    for token in [None, Some(TOKEN)] {
        let (status, text) = sd(&f, token).await;
        assert_eq!(status, 401, "{token:?}");
        assert!(text.contains("server.sd_token"), "{text}");
    }
}

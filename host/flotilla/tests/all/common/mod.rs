//! Shared by the tests that run the `flotilla` binary with real machines: the process, its
//! API over HTTP, and its log.
#![allow(dead_code)] // each test file uses a different part

pub mod fleet;
pub mod machines;
pub mod pipeline;

use std::process::Command;
use std::time::Duration;

use flotilla_harness::poll;
use flotilla_harness::process::Daemon;

use serde_json::Value;

/// Runs `flotilla ARGS...` to completion: exit code, stdout, stderr.
pub fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("FLOTILLA_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("run flotilla: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The API token of every test config.
pub const TOKEN: &str = "fleet-token-0d9a";

/// `flotilla run` on a config in a temporary directory: the one runner of the binary's tests.
/// Configs listen on port 0 (`listen = "127.0.0.1:0"`); the runner reads the bound address
/// from the process's log, so no port is guessed before the process binds it.
pub struct Flotilla {
    pub process: Daemon,
    pub base: String,
    /// `http://` + the bound `server.metrics_listen`, when the config has one.
    pub metrics: Option<String>,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
    /// How the process is started; restarts use it again.
    options: Options,
}

/// How a [`Flotilla`] process is started.
#[derive(Clone, Default)]
pub struct Options {
    /// Logging as JSON lines (`--log-json`).
    pub json: bool,
    /// At most this many open file descriptors.
    pub nofile: Option<u32>,
    /// The file mode creation mask of the process.
    pub umask: Option<u32>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Environment variables removed.
    pub env_remove: Vec<String>,
}

impl Options {
    pub fn env(mut self, key: &str, value: &str) -> Options {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn env_remove(mut self, key: &str) -> Options {
        self.env_remove.push(key.into());
        self
    }
}

impl Flotilla {
    pub async fn start(dir: tempfile::TempDir, config: &str) -> Flotilla {
        Flotilla::start_with(dir, config, Options::default()).await
    }

    /// Starts the process and waits until the API answers and no pool is still starting.
    pub async fn start_with(dir: tempfile::TempDir, config: &str, options: Options) -> Flotilla {
        let f = Flotilla::launch(dir, config, options).await;
        f.wait_started().await;
        f
    }

    /// Starts the process and waits only for its API (pools may still be starting).
    pub async fn serving(dir: tempfile::TempDir, config: &str) -> Flotilla {
        Flotilla::launch(dir, config, Options::default()).await
    }

    /// Like [`Flotilla::serving`], with at most `nofile` open file descriptors.
    pub async fn serving_with_fd_limit(
        dir: tempfile::TempDir,
        config: &str,
        nofile: Option<u32>,
    ) -> Flotilla {
        let options = Options {
            nofile,
            ..Options::default()
        };
        Flotilla::launch(dir, config, options).await
    }

    /// Like [`Flotilla::start`], logging JSON lines (`--log-json`).
    pub async fn start_json(dir: tempfile::TempDir, config: &str) -> Flotilla {
        let options = Options {
            json: true,
            ..Options::default()
        };
        Flotilla::start_with(dir, config, options).await
    }

    /// Spawns the process on `config` and waits for its API; its addresses come from its log.
    pub async fn launch(dir: tempfile::TempDir, config: &str, options: Options) -> Flotilla {
        std::fs::write(dir.path().join("flotilla.toml"), config).expect("config");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut process = Flotilla::spawn(&dir, &options);
        let (base, metrics) = Flotilla::addresses(&mut process, config).await;
        let f = Flotilla {
            process,
            base,
            metrics,
            client: reqwest::Client::new(),
            dir,
            options,
        };
        f.wait_api().await;
        f
    }

    /// The API's and the metrics listener's addresses, as the process logged them.
    async fn addresses(process: &mut Daemon, config: &str) -> (String, Option<String>) {
        let limit = Duration::from_secs(60);
        let listen = process
            .logged("flotilla is listening", "listen", limit)
            .await;
        let metrics = if config.contains("metrics_listen") {
            let bound = process
                .logged("serving /metrics", "metrics_listen", limit)
                .await;
            Some(format!("http://{bound}"))
        } else {
            None
        };
        (format!("http://{listen}"), metrics)
    }

    fn spawn(dir: &tempfile::TempDir, options: &Options) -> Daemon {
        let mut setup = Vec::new();
        if let Some(n) = options.nofile {
            setup.push(format!("ulimit -n {n}"));
        }
        if let Some(mask) = options.umask {
            setup.push(format!("umask {mask:03o}"));
        }
        let mut command = if setup.is_empty() {
            Command::new(env!("CARGO_BIN_EXE_flotilla"))
        } else {
            let mut c = Command::new("sh");
            c.args([
                "-c",
                &format!("{} && exec \"$0\" \"$@\"", setup.join(" && ")),
            ])
            .arg(env!("CARGO_BIN_EXE_flotilla"));
            c
        };
        if options.json {
            command.arg("--log-json");
        }
        command
            .args(["run", "-c"])
            .arg(dir.path().join("flotilla.toml"))
            .env("FLOTILLA_LOG", "info")
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env("XDG_DATA_HOME", dir.path().join("data"));
        for (k, v) in &options.env {
            command.env(k, v);
        }
        for k in &options.env_remove {
            command.env_remove(k);
        }
        Daemon::spawn(command, &dir.path().join("flotilla.log"))
    }

    async fn wait_api(&self) {
        let what = format!("the API at {}", self.base);
        poll::until(&what, Duration::from_secs(30), || async {
            match self.call("GET", "/healthz", None).await.0 {
                200 => Ok(()),
                code => Err(format!("{code}\n{}", self.log())),
            }
        })
        .await
    }

    /// Waits until the API answers and no pool is still starting (running, or failed to start).
    async fn wait_started(&self) {
        self.wait_api().await;
        self.wait_for("/v1/pools", "every pool's start to end", |v| {
            v["pools"].as_object().is_some_and(|pools| {
                pools
                    .values()
                    .all(|p| p["status"]["health"]["state"] != "starting")
            })
        })
        .await;
    }

    /// The API's bound port.
    pub fn port(&self) -> u16 {
        self.base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port in the base URL")
    }

    /// Kills the process with SIGKILL, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the process as an upgrade does (SIGTERM: drain, then exit) and waits for it.
    pub fn terminate(&mut self) {
        self.process.terminate();
    }

    /// Starts the process again on the same config and state (after [`Flotilla::kill`]), on
    /// the port the first run bound, so clients configured with its URL find it again.
    pub async fn start_again(&mut self) {
        let path = self.dir.path().join("flotilla.toml");
        let config = std::fs::read_to_string(&path).expect("config");
        let port = |url: &str| url.rsplit(':').next().unwrap_or("0").to_string();
        let mut pinned = config.replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{}\"", port(&self.base)),
        );
        if let Some(m) = &self.metrics {
            pinned = pinned.replace(
                "metrics_listen = \"127.0.0.1:0\"",
                &format!("metrics_listen = \"127.0.0.1:{}\"", port(m)),
            );
        }
        std::fs::write(&path, pinned).expect("config");
        self.process = Flotilla::spawn(&self.dir, &self.options);
        let (base, metrics) = Flotilla::addresses(&mut self.process, &config).await;
        assert_eq!(base, self.base, "the restarted process moved");
        self.metrics = metrics;
        self.wait_started().await;
    }

    /// Kills the process (as a crash would) and starts it again on the same config.
    pub async fn restart(&mut self) {
        self.process.kill();
        self.start_again().await;
    }

    /// Polls `path` until `check` accepts its JSON answer.
    pub async fn wait_for(&self, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        poll::until(what, Duration::from_secs(60), || async {
            let (_, body) = self.call("GET", path, None).await;
            if check(&body) {
                Ok(body)
            } else {
                Err(format!("{body}\n{}", self.log()))
            }
        })
        .await
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<reqwest::Body>,
        token: Option<&str>,
    ) -> (u16, bytes::Bytes) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        match req.send().await {
            Ok(r) => (r.status().as_u16(), r.bytes().await.unwrap_or_default()),
            Err(_) => (0, bytes::Bytes::new()),
        }
    }

    /// Reserves, acquires and releases one lease of `pool`, asserting each answer.
    pub async fn lease_cycle(&self, pool: &str) {
        let leases = format!("/v1/pools/{pool}/leases");
        let (code, body) = self
            .call("POST", &leases, Some(serde_json::json!({})))
            .await;
        assert_eq!(code, 201, "{body}");
        let id = body["lease"]["id"].as_u64().expect("a lease id");
        for step in ["acquire", "release"] {
            let (code, body) = self
                .call("POST", &format!("{leases}/{id}/{step}"), None)
                .await;
            assert_eq!(code, 200, "{step}: {body}");
        }
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| reqwest::Body::from(b.to_string()));
        let (code, bytes) = self.request(method, path, body, Some(TOKEN)).await;
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

/// The host's log of an operator's terminal session: opened and closed, each line naming who
/// opened it and the job (its lease's `gitlab-job` label).
pub fn assert_terminal_session_logged(log: &str, who: &str, job: u64) {
    for line in ["terminal session opened", "terminal session closed"] {
        let logged = log
            .lines()
            .find(|l| l.contains(line))
            .unwrap_or_else(|| panic!("{line:?} not logged:\n{log}"));
        assert!(
            logged.contains(&format!("who={who}")) && logged.contains(&format!("gitlab-job={job}")),
            "{logged}"
        );
    }
}

//! Shared by the tests that run the `flotilla` binary with real machines: the process, its
//! API over HTTP, and its log.
#![allow(dead_code)] // each test file uses a different part

pub mod fleet;
pub mod machines;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

pub struct Flotilla {
    pub child: Child,
    pub base: String,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
    /// Logging as JSON lines (`--log-json`).
    pub json: bool,
}

impl Drop for Flotilla {
    fn drop(&mut self) {
        let _ = self.child.kill(); // already gone is fine
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Flotilla {
    pub async fn start(dir: tempfile::TempDir, config: &str) -> Flotilla {
        let f = Flotilla::serving(dir, config).await;
        f.wait_started().await;
        f
    }

    /// Starts the process and waits only for its API (pools may still be starting).
    pub async fn serving(dir: tempfile::TempDir, config: &str) -> Flotilla {
        Flotilla::serving_with_fd_limit(dir, config, None).await
    }

    /// Like [`Flotilla::serving`], with at most `nofile` open file descriptors.
    pub async fn serving_with_fd_limit(
        dir: tempfile::TempDir,
        config: &str,
        nofile: Option<u32>,
    ) -> Flotilla {
        Flotilla::launch(dir, config, nofile, false).await
    }

    /// Like [`Flotilla::start`], logging JSON lines (`--log-json`).
    pub async fn start_json(dir: tempfile::TempDir, config: &str) -> Flotilla {
        let f = Flotilla::launch(dir, config, None, true).await;
        f.wait_started().await;
        f
    }

    async fn launch(
        dir: tempfile::TempDir,
        config: &str,
        nofile: Option<u32>,
        json: bool,
    ) -> Flotilla {
        let path = dir.path().join("flotilla.toml");
        std::fs::write(&path, config).expect("config");
        let port = config
            .lines()
            .find_map(|l| l.strip_prefix("listen = \"127.0.0.1:"))
            .and_then(|r| r.trim_end_matches('"').parse::<u16>().ok())
            .expect("the listen port");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let child = Flotilla::spawn(&dir, nofile, json);
        let f = Flotilla {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            dir,
            json,
        };
        f.wait_api().await;
        f
    }

    fn spawn(dir: &tempfile::TempDir, nofile: Option<u32>, json: bool) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("flotilla.log"))
            .expect("log");
        let mut command = match nofile {
            None => Command::new(env!("CARGO_BIN_EXE_flotilla")),
            Some(n) => {
                let mut c = Command::new("sh");
                c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\"")])
                    .arg(env!("CARGO_BIN_EXE_flotilla"));
                c
            }
        };
        if json {
            command.arg("--log-json");
        }
        command
            .args(["run", "-c"])
            .arg(dir.path().join("flotilla.toml"))
            .env("FLOTILLA_LOG", "info")
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env("XDG_DATA_HOME", dir.path().join("data"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("flotilla")
    }

    async fn wait_api(&self) {
        let start = Instant::now();
        while self.call("GET", "/healthz", None).await.0 != 200 {
            assert!(start.elapsed() < Duration::from_secs(30), "{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

    /// Kills the process with SIGKILL, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill(); // already gone is fine
        let _ = self.child.wait();
    }

    /// Stops the process as an upgrade does (SIGTERM: drain, then exit) and waits for it.
    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    /// Starts the process again on the same config and state (after [`Flotilla::kill`]).
    pub async fn start_again(&mut self) {
        self.child = Flotilla::spawn(&self.dir, None, self.json);
        self.wait_started().await;
    }

    /// Kills the process (as a crash would) and starts it again on the same config.
    pub async fn restart(&mut self) {
        let _ = self.child.kill(); // already gone is fine
        let _ = self.child.wait();
        self.child = Flotilla::spawn(&self.dir, None, self.json);
        self.wait_started().await;
    }

    /// Polls `path` until `check` accepts its JSON answer.
    pub async fn wait_for(&self, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let (_, body) = self.call("GET", path, None).await;
            if check(&body) {
                return body;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}: {body}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("flotilla.log")).unwrap_or_default()
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

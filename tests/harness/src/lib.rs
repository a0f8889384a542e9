//! The test harness shared by the host crates' integration tests and benchmarks: one plugin
//! runtime per binary, log capture, quick sandboxes, the one process runner (`process`) and
//! the one poll (`poll`), pools for the scaler's tests (`pool`) and for the benches against real
//! machines (`ready`; their cloud is `flotilla_provider::fixed`), and
//! the official plugins bound to their peers (`clouds`).
//!
//! Owns: the helpers tests would otherwise copy. The peers themselves (sshd, dockerd, the
//! registry, moto, the stand-in clouds) are `flotilla-peers`, which knows no Flotilla crate.
//! Must not know: anything a production crate needs; nothing but tests and benches use it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test
#![allow(missing_docs)] // helpers named for what they start or return; read with the tests
#![allow(dead_code)]

pub mod clouds;
pub mod load;
pub mod pool;
pub mod ready;

/// The one process runner and the one poll live with the peers (which use them too); tests
/// reach them here or there.
pub use flotilla_peers::{poll, process};

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use flotilla_plugin_runtime::{EgressPolicy, LoadedPlugin, PluginRuntime, RuntimeOptions, Sandbox};

/// One runtime per test binary, without a compile cache (tests of the cache make their own).
pub fn runtime() -> &'static PluginRuntime {
    static RT: OnceLock<PluginRuntime> = OnceLock::new();
    RT.get_or_init(
        || match PluginRuntime::new(RuntimeOptions { cache_dir: None }) {
            Ok(rt) => rt,
            Err(e) => panic!("runtime: {e}"),
        },
    )
}

/// The value of a call that must succeed; a panic naming the error otherwise.
pub async fn must<T, E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> T {
    match f.await {
        Ok(v) => v,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// The contract error of a call, or a panic naming what came instead.
pub fn provider_error<T: std::fmt::Debug>(
    r: Result<T, flotilla_provider::CallError>,
) -> flotilla_provider::ProviderError {
    match r {
        Err(flotilla_provider::CallError::Provider { error, .. }) => error,
        other => panic!("expected a provider error, got {other:?}"),
    }
}

/// Loads a guest, panicking with the load error (tests only).
pub fn load(path: &str) -> LoadedPlugin {
    match runtime().load_file(Path::new(path)) {
        Ok(p) => p,
        Err(e) => panic!("load {path}: {e}"),
    }
}

/// A sandbox with short deadlines, so fault tests are quick.
pub fn quick_sandbox(allow: &[&str]) -> Sandbox {
    let mut sandbox = Sandbox::default();
    sandbox.limits.default_deadline = Duration::from_secs(2);
    sandbox.limits.deadlines.clear();
    sandbox.limits.memory_bytes = 64 << 20;
    sandbox.egress = EgressPolicy {
        allow: flotilla_net::AllowList::parse(allow).unwrap_or_else(|e| panic!("{e:?}")),
        ..EgressPolicy::default()
    };
    sandbox
}

/// Captures every log line (all targets, all levels) written on the installing thread into a
/// shared buffer.
///
/// One global subscriber serves every capture of the test binary and routes each line to the
/// capture installed on its thread. Per-thread subscribers (`set_default`) race in tracing's
/// global interest cache when tests create and drop them in parallel: an event could be
/// judged uninteresting against a stale list of subscribers and silently dropped.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

thread_local! {
    static CAPTURE: std::cell::RefCell<Vec<LogCapture>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes to the capture installed on the current thread, if any.
#[derive(Clone, Copy, Default)]
struct ThreadCapture;

impl Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(capture) = c.borrow_mut().last_mut() {
                let _ = capture.write(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Ends a capture on its thread when dropped.
pub struct CaptureGuard(());

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURE.with(|c| {
            c.borrow_mut().pop();
        });
    }
}

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().map(|b| b.clone()).unwrap_or_default()).into_owned()
    }

    /// Installs the capture for the current thread; keep the guard alive.
    pub fn install(&self) -> CaptureGuard {
        static GLOBAL: OnceLock<()> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(|| ThreadCapture)
                .finish();
            // A binary whose global subscriber is already set keeps it; captures then see
            // nothing, which their tests' assertions make plain.
            let _ = tracing::subscriber::set_global_default(subscriber);
        });
        CAPTURE.with(|c| c.borrow_mut().push(self.clone()));
        CaptureGuard(())
    }
}

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Collects what a guest reports through `flotilla:test/probe`.
#[derive(Clone, Default)]
pub struct ProbeLog(Arc<Mutex<Vec<(String, String)>>>);

impl ProbeLog {
    /// The sink to put into a sandbox (`sandbox.probe = Some(log.probe())`).
    pub fn probe(&self) -> flotilla_plugin_runtime::Probe {
        let log = self.clone();
        flotilla_plugin_runtime::Probe(Arc::new(move |key: &str, value: &str| {
            if let Ok(mut entries) = log.0.lock() {
                entries.push((key.to_string(), value.to_string()));
            }
        }))
    }

    /// Forgets everything reported so far.
    pub fn clear(&self) {
        self.0.lock().expect("probe log lock").clear();
    }

    /// The latest value reported under `key`, parsed as JSON.
    pub fn json(&self, key: &str) -> serde_json::Value {
        let entries = self.0.lock().expect("probe log lock");
        let value = entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("the guest reported nothing under {key:?}"));
        serde_json::from_str(&value).unwrap_or_else(|e| panic!("{key}: {e}: {value}"))
    }
}

/// Writes a secret file (a token) owner-only, as an operator must: flotilla refuses a secret
/// file others can read.
pub fn write_secret(path: &std::path::Path, contents: &str) {
    std::fs::write(path, contents).expect("write a secret file");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    }
}

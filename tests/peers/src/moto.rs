//! A moto server with SigV4 checking on, bootstrapped by tests/peers/moto_bootstrap.py.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub fn venv() -> PathBuf {
    std::env::var_os("FLOTILLA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/flotilla-venv")
        })
}

pub struct Moto {
    child: Child,
    pub endpoint: String,
    pub setup: Value,
    /// moto's own record of every request it received (`MOTO_ENABLE_RECORDING`).
    recording: PathBuf,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.recording); // absent when nothing was recorded
    }
}

/// Tells apart the recordings of the motos of one test process.
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The port moto's server says it listens on (werkzeug: ` * Running on http://127.0.0.1:PORT`).
/// The rest of its stderr (a line per request) is drained by a thread, so it never blocks.
fn listening_port(child: &mut Child) -> u16 {
    let port = read_port(child);
    if port.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    port.unwrap_or_else(|| panic!("moto did not say which port it listens on"))
}

fn read_port(child: &mut Child) -> Option<u16> {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("moto's stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let port = line
                .split("Running on http://127.0.0.1:")
                .nth(1)
                .and_then(|rest| rest.trim().parse::<u16>().ok());
            if let (Some(port), Some(sender)) = (port, tx.as_ref()) {
                let _ = sender.send(port);
                tx = None;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).ok()
}

pub fn python(args: &[&str]) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/peers/moto_bootstrap.py"
    );
    let out = Command::new(venv().join("bin/python"))
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("python: {e}"));
    assert!(
        out.status.success(),
        "bootstrap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Moto {
    pub fn start() -> Moto {
        Moto::start_with_max(6)
    }

    /// A moto whose group has the given MaxSize.
    ///
    /// moto binds a port of the kernel's choosing (`-p 0`) and says which on stderr: probing
    /// for a free port first raced with the other tests' servers, and a moto that lost the race
    /// could leave the bootstrap talking to another test's moto.
    pub fn start_with_max(max_size: u32) -> Moto {
        let bin = venv().join("bin/moto_server");
        let recording = std::env::temp_dir().join(format!(
            "flotilla-moto-{}-{}.jsonl",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "0")
            .env("MOTO_ENABLE_RECORDING", "1")
            .env("MOTO_RECORDER_FILEPATH", &recording)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/test.sh installs moto)", bin.display()));
        let port = listening_port(&mut child);
        // Owned by the value from here: a failed bootstrap drops it, and the drop ends moto (a
        // leaked moto would also hold the test's inherited file descriptors).
        let mut moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            setup: Value::Null,
            recording,
        };
        moto.setup = serde_json::from_str(&python(&[&moto.endpoint, &max_size.to_string()]))
            .unwrap_or_else(|e| panic!("{e}"));
        moto
    }

    /// Every request moto received so far, as moto recorded it: `method`, `url`, `headers`,
    /// and `body` (base64 when `body_encoded`).
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.recording)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn key(&self, user: &str) -> (String, String) {
        let u = &self.setup["users"][user];
        (
            u["key"].as_str().unwrap_or_default().into(),
            u["secret"].as_str().unwrap_or_default().into(),
        )
    }

    /// Replaces `user`'s IAM policy with `actions`, as the admin (safe with traffic running).
    pub fn set_policy(&self, user: &str, actions: &[&str]) {
        let (k, s) = self.key("admin");
        let mut args = vec![self.endpoint.as_str(), "--policy-as", &k, &s, user];
        args.extend_from_slice(actions);
        python(&args);
    }

    pub fn desired(&self) -> u64 {
        let (k, s) = self.key("admin");
        let out = python(&[&self.endpoint, "--describe", &k, &s, "ci-runners"]);
        serde_json::from_str::<Value>(&out)
            .ok()
            .and_then(|v| v["desired"].as_u64())
            .unwrap_or(u64::MAX)
    }

    /// The group's instances as the admin sees them: `(id, lifecycle state)`; none when the
    /// group does not exist.
    pub fn instances(&self) -> Vec<(String, String)> {
        let (k, s) = self.key("admin");
        let out = python(&[&self.endpoint, "--instances", &k, &s, "ci-runners"]);
        serde_json::from_str::<Vec<Value>>(&out)
            .unwrap_or_else(|e| panic!("{e}: {out}"))
            .iter()
            .map(|i| {
                (
                    i["id"].as_str().unwrap_or_default().to_string(),
                    i["lifecycle"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// The ids of the group's live instances (neither terminating nor terminated), sorted.
    pub fn live(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .instances()
            .into_iter()
            .filter(|(_, life)| !life.starts_with("Terminat"))
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids
    }

    /// An operator changes the group by hand: MaxSize and desired capacity.
    pub fn resize(&self, max_size: u32, desired: u32) {
        let (k, s) = self.key("admin");
        python(&[
            &self.endpoint,
            "--resize",
            &k,
            &s,
            "ci-runners",
            &max_size.to_string(),
            &desired.to_string(),
        ]);
    }

    /// An operator force-deletes the group (its instances go with it).
    pub fn delete_group(&self) {
        let (k, s) = self.key("admin");
        python(&[&self.endpoint, "--delete-group", &k, &s, "ci-runners"]);
    }

    /// An instance is terminated in EC2 (spot reclaim, an operator), behind the group's back.
    pub fn terminate(&self, instance: &str) {
        let (k, s) = self.key("admin");
        python(&[&self.endpoint, "--terminate", &k, &s, instance]);
    }

    /// Auto Scaling marks an instance Unhealthy, as it does when EC2 interrupts a Spot
    /// Instance or a health check fails.
    pub fn unhealthy(&self, instance: &str) {
        let (k, s) = self.key("admin");
        python(&[&self.endpoint, "--unhealthy", &k, &s, instance]);
    }

    /// An operator creates the group again under the same name, empty.
    pub fn create_group(&self, max_size: u32) {
        let (k, s) = self.key("admin");
        python(&[
            &self.endpoint,
            "--create-group",
            &k,
            &s,
            "ci-runners",
            &max_size.to_string(),
        ]);
    }

    pub fn settings(&self) -> String {
        format!(
            r#"{{"name":"ci-runners","region":"us-east-1","endpoint":"{}","credential":"aws"}}"#,
            self.endpoint
        )
    }
}

//! The AWS plugin through the real host against moto with SigV4 checking on
//! (`INITIAL_NO_AUTH_ACTION_COUNT=0`). The plugin never holds a key: the host signs.
//! Needs the venv that `scripts/test.sh` creates (`moto[server]` and boto3).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{LogCapture, load};
use flotilla::credentials::{Credential, CredentialKind, Secret, SecretSource};
use flotilla::plugin::{AllowList, Sandbox, WasmProvider};
use flotilla::provider::{CallError, InstanceState, Provider, ProviderError};
use flotilla_test_artifacts as guests;
use serde_json::Value;

fn venv() -> PathBuf {
    std::env::var_os("FLOTILLA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/flotilla-venv")
        })
}

struct Moto {
    child: Child,
    endpoint: String,
    setup: Value,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python(args: &[&str]) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/peers/moto_bootstrap.py"
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
    fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"));
        let bin = venv().join("bin/moto_server");
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/test.sh installs moto)", bin.display()));
        let endpoint = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "moto did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let setup: Value =
            serde_json::from_str(&python(&[&endpoint])).unwrap_or_else(|e| panic!("{e}"));
        Moto {
            child,
            endpoint,
            setup,
        }
    }

    fn key(&self, user: &str) -> (String, String) {
        let u = &self.setup["users"][user];
        (
            u["key"].as_str().unwrap_or_default().into(),
            u["secret"].as_str().unwrap_or_default().into(),
        )
    }

    fn desired(&self) -> u64 {
        let (k, s) = self.key("admin");
        let out = python(&[&self.endpoint, "--describe", &k, &s, "ci-runners"]);
        serde_json::from_str::<Value>(&out)
            .ok()
            .and_then(|v| v["desired"].as_u64())
            .unwrap_or(u64::MAX)
    }

    fn provider(&self, secret_override: Option<&str>) -> WasmProvider {
        let (key, secret) = self.key("plugin");
        let secret = secret_override.map_or(secret, str::to_string);
        let allow = AllowList::parse(&[self.endpoint.as_str()]).unwrap_or_else(|e| panic!("{e:?}"));
        let mut sandbox = Sandbox::default();
        sandbox.egress.allow = allow.clone();
        sandbox.egress.allowed_ip_ranges =
            vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))];
        sandbox.egress.credentials = vec![Credential {
            name: "aws".into(),
            kind: CredentialKind::AwsSigv4 {
                access_key_id: SecretSource::Value(Secret::new(key)),
                secret_access_key: SecretSource::Value(Secret::new(secret)),
                session_token: None,
                region: None,
                service: None,
            },
            hosts: allow,
        }];
        load(guests::AWS_PLUGIN).provider("aws", sandbox)
    }

    fn settings(&self) -> String {
        format!(
            r#"{{"name":"ci-runners","region":"us-east-1","endpoint":"{}","credential":"aws"}}"#,
            self.endpoint
        )
    }
}

async fn must<T, E: std::fmt::Display>(f: impl std::future::Future<Output = Result<T, E>>) -> T {
    match f.await {
        Ok(v) => v,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn contract_calls_against_moto_with_sigv4() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let moto = Moto::start();
    let p = moto.provider(None);
    let info = match p.init(&moto.settings()).await {
        Ok(i) => i,
        Err(e) => panic!("{e}\n{}", logs.text()),
    };
    assert_eq!(
        (info.id.as_str(), info.max_size),
        ("aws/us-east-1/ci-runners", 6)
    );

    assert_eq!(must(p.increase(5)).await, 5);
    let start = Instant::now();
    let instances = loop {
        let list = must(p.update()).await;
        if list
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .count()
            == 5
        {
            break list;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{list:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let c = must(p.connect_info(&instances[0].id)).await;
    assert!(
        c.internal_address
            .as_deref()
            .is_some_and(|a| a.starts_with("10.20.1.")),
        "{c:?}"
    );

    let ids: Vec<String> = instances[..2].iter().map(|i| i.id.clone()).collect();
    assert_eq!(must(p.decrease(&ids)).await, ids);
    let live = must(p.update()).await;
    let running: Vec<_> = live
        .iter()
        .filter(|i| i.state == InstanceState::Running)
        .collect();
    assert_eq!(running.len(), 3, "{live:?}");
    assert_eq!(
        moto.desired(),
        3,
        "moto's desired capacity followed the decrease"
    );
    assert_eq!(
        must(p.increase(10)).await,
        3,
        "capped at MaxSize 6 (moto would accept more; AWS would not)"
    );
    assert_eq!(moto.desired(), 6);

    let (_, secret) = moto.key("plugin");
    assert!(!logs.text().contains(&secret), "the secret reached the log");
}

#[tokio::test(flavor = "current_thread")]
async fn credential_failures_are_unauthorized_and_never_leak() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let moto = Moto::start();
    let wrong = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    let p = moto.provider(Some(wrong));
    let r = p.init(&moto.settings()).await;
    let Err(CallError::Provider {
        error: ProviderError::Unauthorized(msg),
        ..
    }) = &r
    else {
        panic!("expected unauthorized, got {r:?}")
    };
    assert!(
        msg.contains("DescribeAutoScalingGroups"),
        "names the action: {msg}"
    );

    // Remove one action from the plugin user's policy: only that call is refused.
    let good = moto.provider(None);
    must(good.init(&moto.settings())).await;
    python(&[
        &moto.endpoint,
        "--policy",
        "plugin",
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "ec2:DescribeInstances",
    ]);
    let r = good.increase(1).await;
    let Err(CallError::Provider {
        error: ProviderError::Unauthorized(msg),
        ..
    }) = &r
    else {
        panic!("expected unauthorized, got {r:?}")
    };
    assert!(msg.contains("SetDesiredCapacity"), "{msg}");
    must(good.update()).await;

    let (_, secret) = moto.key("plugin");
    let text = logs.text();
    for s in [secret.as_str(), wrong] {
        assert!(!text.contains(s), "a secret reached the log");
        assert!(!msg.contains(s));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn bad_settings_are_reported_at_once() {
    let moto = Moto::start();
    let p = moto.provider(None);
    let r = p
        .init(r#"{"name":"","region":"mars","endpoint":"ftp://x"}"#)
        .await;
    let Err(CallError::Provider {
        error: ProviderError::InvalidConfig(msg),
        ..
    }) = &r
    else {
        panic!("{r:?}")
    };
    for key in ["name:", "region:", "endpoint:"] {
        assert!(msg.contains(key), "{key} missing: {msg}");
    }
    let r = p
        .init(&format!(
            r#"{{"name":"nope","region":"us-east-1","endpoint":"{}","credential":"aws"}}"#,
            moto.endpoint
        ))
        .await;
    assert!(
        matches!(
            r,
            Err(CallError::Provider {
                error: ProviderError::NotFound(_),
                ..
            })
        ),
        "{r:?}"
    );
}

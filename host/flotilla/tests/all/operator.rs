//! The operator's path: `config check` finds every problem in one pass with the rules `run`
//! applies, in our words and sorted by line; the official plugins travel inside the binary
//! (`builtin:NAME`), listed with their digests, exported byte for byte, and run like any other.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use flotilla_harness::poll;
use flotilla_harness::process::Daemon;

use flotilla_test_artifacts as guests;
use serde_json::Value;

fn flotilla(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("FLOTILLA_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `flotilla run -c config`, killed when dropped.
/// `flotilla run` on `config`, and the API's base URL as the process logged it.
async fn run(config: &std::path::Path) -> (Daemon, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command.args(["run", "-c"]).arg(config);
    let log = config.with_extension("log");
    let mut process = Daemon::spawn(command, &log);
    let listen = process
        .logged("flotilla is listening", "listen", Duration::from_secs(30))
        .await;
    (process, format!("http://{listen}"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-operator-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    dir
}

/// Every kind of problem the field report found coming in rounds: keys and types of a pool, a
/// `[server]` mistake, value checks, a rule `run` applies (no token off loopback), a bad cron
/// field, and a typo inside `plugin_config` that only the plugin knows about.
const BROKEN: &str = r#"[server]
listen = "0.0.0.0:8080"
shutdown_grace = "-30s"
lisen = "127.0.0.1:8080"

[[pool]]
name = "static"
plugin = "builtin:static"
max_instanses = 3
max_instances = 3
capacity_per_instance = 0

[pool.plugin_config]
name = "lab"
hostz = []

[[pool.policy]]
periods = ["* * * 13 *"]
idle_count = 1
scale_factor = -1.5

[[pool]]
name = "second"
plugin = "builtin:nope"
max_instances = "three"
"#;

#[test]
fn config_check_reports_every_problem_in_one_pass_sorted_in_our_words() {
    let dir = temp_dir("one-pass");
    let file = dir.join("broken.toml");
    std::fs::write(&file, BROKEN).unwrap();
    let path = file.display().to_string();
    let (code, _, err) = flotilla(&["config", "check", "-c", &path]);
    assert_eq!(code, 1, "{err}");
    let expected = [
        (
            1,
            "server.token: is required when listening on a non-loopback address",
        ),
        (
            3,
            "server.shutdown_grace: expected a duration such as \"90s\"",
        ),
        (4, "server.lisen: unknown key; did you mean `listen`?"),
        (
            9,
            "pool[0].max_instanses: unknown key; did you mean `max_instances`?",
        ),
        (
            11,
            "pool[0].capacity_per_instance: must be at least 1 (got 0)",
        ),
        (
            13,
            "pool[0].plugin_config: the plugin refused it: hostz: unknown key (known: name, hosts)",
        ),
        (
            18,
            "pool[0].policy[0].periods[0]: \"* * * 13 *\": month 13 is out of range (1-12 or JAN-DEC)",
        ),
        (20, "pool[0].policy[0].scale_factor: must be a number >= 0"),
        (
            24,
            "pool[1].plugin: no built-in plugin \"nope\"; built in: aws, azure, gcp, static",
        ),
        (
            25,
            "pool[1].max_instances: expected a whole number from 0 to 4294967295, found string \"three\"",
        ),
    ];
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with(&path)).collect();
    for (line, text) in expected {
        let want = format!("{path}:{line}: {text}");
        assert!(
            lines.iter().any(|l| l.starts_with(&want)),
            "missing {want:?} in:\n{err}"
        );
    }
    // Sorted by line, as an editor lists them.
    let numbers: Vec<usize> = lines
        .iter()
        .filter_map(|l| l[path.len() + 1..].split(':').next()?.parse().ok())
        .collect();
    let mut sorted = numbers.clone();
    sorted.sort_unstable();
    assert_eq!(numbers, sorted, "{err}");
    // Every problem, and nothing in a dependency's words.
    assert!(
        err.contains(&format!("{} problem(s) found", expected.len())),
        "{err}"
    );
    for foreign in [
        "invalid type",
        "expected u32",
        "Component error",
        "missing field",
    ] {
        assert!(!err.contains(foreign), "{foreign:?} in:\n{err}");
    }

    // `run` applies the same rules, all of them, before it starts anything.
    let (code, _, err) = flotilla(&["run", "-c", &path]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("pool[0].capacity_per_instance") && err.contains("server.token"),
        "{err}"
    );
}

/// A settings problem only the plugin knows: `config check` asks the plugin in a sandbox that
/// reaches nothing; `run`, whose pools start on their own, reports the pool's failed start with
/// the same located message.
#[tokio::test]
async fn a_plugin_config_typo_is_located_by_check_and_by_run() {
    let dir = temp_dir("plugin-config");
    let file = dir.join("typo.toml");
    let text = r#"[server]
listen = "127.0.0.1:0"

[[pool]]
name = "lab"
plugin = "builtin:static"
max_instances = 2

[pool.plugin_config]
name = "lab"
hosts = [{ address = "127.0.0.1" }]
hots = []
"#;
    std::fs::write(&file, text).unwrap();
    let path = file.display().to_string();
    let want = format!(
        "{path}:9: pool[0].plugin_config: the plugin refused it: hots: unknown key (known: name, hosts)"
    );
    let (code, _, err) = flotilla(&["config", "check", "-c", &path]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&want), "{err}");

    let (_child, base) = run(std::path::Path::new(&path)).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let what = format!("start-failed with {want:?}");
    let reason = poll::until(&what, Duration::from_secs(30), || async {
        if let Ok(r) = client.get(format!("{base}/v1/pools")).send().await
            && let Ok(body) = r.json::<Value>().await
            && body["pools"]["lab"]["status"]["health"]["state"] == "start-failed"
        {
            let health = &body["pools"]["lab"]["status"]["health"];
            Ok(health["reason"].as_str().unwrap_or_default().to_string())
        } else {
            Err("no start-failed yet")
        }
    })
    .await;
    assert!(reason.contains(&want), "{reason}");
    // /readyz, which needs no token, says the state and keeps the why to itself.
    let ready: Value = client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("/readyz")
        .json()
        .await
        .expect("JSON");
    assert_eq!(ready["pools"]["lab"]["state"], "start-failed", "{ready}");
    assert!(!ready.to_string().contains("hots"), "{ready}");

    // Fixed, the check passes.
    std::fs::write(&file, text.replace("hots = []\n", "")).unwrap();
    let (code, out, err) = flotilla(&["config", "check", "-c", &path]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn a_cloud_plugin_that_reads_its_settings_then_calls_out_passes_the_check_quietly() {
    let dir = temp_dir("aws-check");
    let file = dir.join("aws.toml");
    let text = r#"[[pool]]
name = "aws"
plugin = "builtin:aws"
max_instances = 4
allowed_outbound_hosts = ["https://autoscaling.eu-west-1.amazonaws.com", "https://ec2.eu-west-1.amazonaws.com"]

[pool.plugin_config]
name = "ci-runners"
region = "eu-west-1"
credential = "aws"

[[pool.credentials]]
name = "aws"
kind = "aws"
region = "eu-west-1"
access_key_id = { value = "AKIDEXAMPLE" }
secret_access_key = { value = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY" }
hosts = ["https://autoscaling.eu-west-1.amazonaws.com", "https://ec2.eu-west-1.amazonaws.com"]
"#;
    std::fs::write(&file, text).unwrap();
    let path = file.display().to_string();
    let (code, out, err) = flotilla(&["config", "check", "-c", &path]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        !err.contains("denied"),
        "a settings check is not a denial to warn about: {err}"
    );
    std::fs::write(
        &file,
        text.replace(
            "region = \"eu-west-1\"\ncredential",
            "regoin = \"eu-west-1\"\ncredential",
        ),
    )
    .unwrap();
    let (code, _, err) = flotilla(&["config", "check", "-c", &path]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "{path}:7: pool[0].plugin_config: the plugin refused it"
        )),
        "{err}"
    );
    assert!(err.contains("regoin"), "{err}");
}

#[test]
fn builtin_plugins_are_listed_exported_and_checked_like_files() {
    let dir = temp_dir("builtin");
    let (code, out, err) = flotilla(&[
        "plugin",
        "ls",
        "--json",
        "--cache-dir",
        &dir.display().to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["source"] == "builtin")
        .filter_map(|e| e["reference"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "builtin:aws",
            "builtin:azure",
            "builtin:gcp",
            "builtin:static"
        ]
    );

    for (name, guest) in [
        ("static", guests::STATIC_PLUGIN),
        ("aws", guests::AWS_PLUGIN),
        ("gcp", guests::GCP_PLUGIN),
        ("azure", guests::AZURE_PLUGIN),
    ] {
        let out_file = dir.join(format!("{name}.wasm"));
        let (code, out, err) = flotilla(&[
            "plugin",
            "export",
            &format!("builtin:{name}"),
            "-o",
            &out_file.display().to_string(),
        ]);
        assert_eq!(code, 0, "{err}");
        let bytes = std::fs::read(&out_file).unwrap();
        let digest = format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))
        );
        // The digest printed, the digest listed and the bytes written agree.
        assert!(out.contains(&digest), "{out}");
        let entry = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["reference"] == format!("builtin:{name}"))
            .unwrap();
        assert_eq!(entry["digest"], digest.as_str());
        let (code, out, err) =
            flotilla(&["plugin", "check", &format!("builtin:{name}"), "--no-cache"]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(&digest[7..]), "{out}");
        // The same component as the one this workspace builds from plugins/: the same world,
        // imports and exports as the file the other tests load.
        let (_, from_file, _) = flotilla(&["plugin", "check", guest, "--no-cache"]);
        let shape = |report: &str| {
            report
                .lines()
                .skip_while(|l| !l.starts_with("world:"))
                .take_while(|l| !l.starts_with("compile"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert!(shape(&out).len() > 3, "{out}");
        assert_eq!(
            shape(&out),
            shape(&from_file),
            "builtin:{name} against {guest}"
        );
    }
    let (code, _, err) = flotilla(&[
        "plugin",
        "export",
        "builtin:docker-machine",
        "-o",
        "/dev/null",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no built-in plugin \"docker-machine\"; built in: aws, azure, gcp, static"),
        "{err}"
    );
    let (code, _, err) = flotilla(&["plugin", "export", "plugins/aws.wasm", "-o", "/dev/null"]);
    assert_eq!(code, 1);
    assert!(err.contains("is not a built-in plugin"), "{err}");
}

/// A config naming `builtin:static` starts and serves leases: the embedded bytes go through
/// the same load checks, sandbox and limits as a file.
#[tokio::test]
async fn a_builtin_plugin_runs_a_pool() {
    let dir = temp_dir("builtin-run");
    let file = dir.join("run.toml");
    std::fs::write(
        &file,
        r#"state_dir = "state"
cache_dir = "cache"
[server]
listen = "127.0.0.1:0"

[[pool]]
name = "lab"
plugin = "builtin:static"
max_instances = 2
update_interval = "1s"

[pool.plugin_config]
name = "lab"
hosts = [{ address = "127.0.0.1" }, { address = "127.0.0.2" }]

[[pool.policy]]
idle_count = 1
"#,
    )
    .unwrap();
    let (_child, base) = run(&file).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/pools/lab/leases");
    let lease = poll::until("a lease", Duration::from_secs(60), || async {
        match client.post(&url).json(&serde_json::json!({})).send().await {
            Ok(r) if r.status().is_success() => Ok(r.json::<Value>().await.unwrap()),
            Ok(r) => Err(r.status().to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    let id = lease["lease"]["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("{lease}"));
    // Acquired: an instance of the embedded static plugin's hosts, made ready by the scaler.
    let acquired = client
        .post(format!("{url}/{id}/acquire"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert!(acquired.status().is_success(), "{}", acquired.status());
    let acquired = acquired.text().await.unwrap();
    assert!(acquired.contains("127.0.0."), "{acquired}");
    let status: Value = client
        .get(format!("{base}/v1/pools"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(status.to_string().contains("lab"), "{status}");
}

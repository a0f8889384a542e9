//! `flotilla plugin check` as a user runs it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

mod common;

use common::cli as flotilla;
use flotilla_test_artifacts as guests;

fn temp(name: &str, contents: &[u8]) -> String {
    let dir = std::env::temp_dir().join(format!("flotilla-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("{e}"));
    path.display().to_string()
}

#[test]
fn check_accepts_the_shipped_plugins() {
    for plugin in [guests::STATIC_PLUGIN, guests::TEMPLATE_PLUGIN] {
        let (code, out, err) = flotilla(&["plugin", "check", "--no-cache", plugin]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(
            out.contains("world:    flotilla:provider/provider@0.1.3"),
            "{out}"
        );
        assert!(
            out.contains("flotilla:provider/instance-group@0.1.3"),
            "{out}"
        );
        assert!(out.contains("verdict:  OK"), "{out}");
    }
}

#[test]
fn check_with_settings_calls_init() {
    let settings = temp(
        "static.toml",
        b"name = \"lab\"\n[[hosts]]\naddress = \"192.0.2.1\"\n",
    );
    let (code, out, err) = flotilla(&[
        "plugin",
        "check",
        "--no-cache",
        "--settings",
        &settings,
        guests::STATIC_PLUGIN,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("init:     ok: id=static/lab"), "{out}");

    let bad = temp("bad.json", b"{\"hosts\": []}");
    let (code, out, _) = flotilla(&[
        "plugin",
        "check",
        "--no-cache",
        "--settings",
        &bad,
        guests::STATIC_PLUGIN,
    ]);
    assert_eq!(code, 1);
    assert!(
        out.contains("REJECTED: init: invalid config: hosts"),
        "{out}"
    );

    let broken = temp("broken.json", b"{\"hosts\": [");
    let (code, out, _) = flotilla(&[
        "plugin",
        "check",
        "--settings",
        &broken,
        guests::STATIC_PLUGIN,
    ]);
    assert_eq!(code, 1);
    assert!(
        out.contains("broken.json: settings are not valid JSON"),
        "{out}"
    );
}

#[test]
fn check_json_is_machine_readable() {
    let (code, out, _) = flotilla(&[
        "plugin",
        "check",
        "--no-cache",
        "--json",
        guests::STATIC_PLUGIN,
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["ok"], true);
    assert_eq!(v["world"], "flotilla:provider/provider@0.1.3");
    assert!(
        v["imports"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["name"] == "flotilla:provider/log@0.1.3"))
    );
    assert_eq!(v["sha256"].as_str().map(str::len), Some(64));
}

#[test]
fn check_rejects_bad_files_with_a_verdict() {
    let core = temp("core.wasm", b"\0asm\x01\0\0\0");
    let (code, out, _) = flotilla(&["plugin", "check", "--no-cache", &core]);
    assert_eq!(code, 1);
    assert!(
        out.contains("REJECTED") && out.contains("core WebAssembly module"),
        "{out}"
    );
    let (code, out, _) = flotilla(&[
        "plugin",
        "check",
        "--no-cache",
        "--json",
        "/nonexistent.wasm",
    ]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["ok"], false);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("/nonexistent.wasm: cannot read plugin")),
        "{v}"
    );
}

#[test]
fn simulate_reports_and_rejects_bad_traces() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let cap1 = format!("{root}/sim-capacity-1.toml");
    let cap4 = format!("{root}/sim-capacity-4.toml");
    let trace = format!("{root}/traces/steady-trickle.csv");
    let svg = temp("out.svg", b"");
    let (code, out, err) = flotilla(&[
        "simulate", "-c", &cap1, "-c", &cap4, "--trace", &trace, "--json", "--svg", &svg,
    ]);
    assert_eq!(code, 0, "{err}");
    let runs: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(runs[0]["name"], "sim-capacity-1:cap1");
    assert_eq!(runs[0]["report"]["jobs"], 351);
    assert_eq!(runs[1]["report"]["completed"], 351);
    let svg_text = std::fs::read_to_string(&svg).unwrap_or_default();
    assert!(
        svg_text.starts_with("<svg") && svg_text.contains("queued jobs"),
        "svg drawn"
    );

    let bad = temp("bad.csv", b"submit_at_s,duration_s\n1,10\nx,5\n3,-1\n4\n");
    let (code, _, err) = flotilla(&["simulate", "-c", &cap1, "--trace", &bad]);
    assert_eq!(code, 1);
    for row in [
        "row 3: submit_at_s \"x\" is not a number",
        "row 4: duration_s must be >= 0",
        "row 5: missing duration_s",
    ] {
        assert!(err.contains(row), "{row:?} missing from {err}");
    }
}

/// The `gcp` credential kind's own checks, located like every config problem.
#[test]
fn gcp_credential_config_problems_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flotilla.toml");
    std::fs::write(
        &path,
        format!(
            r#"[[pool]]
name = "gce"
plugin = "{plugin}"
max_instances = 1
allowed_outbound_hosts = ["https://compute.googleapis.com"]

[[pool.credentials]]
name = "gcp"
kind = "gcp"
scopes = []
token_endpoint = "not a url"
hosts = ["https://compute.googleapis.com"]
"#,
            plugin = guests::STATIC_PLUGIN
        ),
    )
    .unwrap();
    let (code, _, stderr) = flotilla(&["config", "check", "-c", &path.display().to_string()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("flotilla.toml:10: pool[0].credentials[0].scopes"),
        "{stderr}"
    );
    assert!(
        stderr.contains("flotilla.toml:11: pool[0].credentials[0].token_endpoint"),
        "{stderr}"
    );
}

/// The `azure` credential kind's own checks, located like every config problem.
#[test]
fn azure_credential_config_problems_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flotilla.toml");
    std::fs::write(
        &path,
        format!(
            r#"[[pool]]
name = "vmss"
plugin = "{plugin}"
max_instances = 1
allowed_outbound_hosts = ["https://management.azure.com"]

[[pool.credentials]]
name = "azure"
kind = "azure"
client_secret = {{ env = "AZURE_CLIENT_SECRET" }}
certificate = {{ file = "client.pem" }}
hosts = ["https://management.azure.com"]
"#,
            plugin = guests::STATIC_PLUGIN
        ),
    )
    .unwrap();
    let (code, _, stderr) = flotilla(&["config", "check", "-c", &path.display().to_string()]);
    assert_eq!(code, 1, "{stderr}");
    for expected in [
        "flotilla.toml:11: pool[0].credentials[0].certificate: give client_secret or certificate, not both",
        "pool[0].credentials[0].tenant_id: is required",
        "pool[0].credentials[0].client_id: is required",
    ] {
        assert!(stderr.contains(expected), "{expected}\n{stderr}");
    }
}

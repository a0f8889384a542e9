//! What operators deploy next to `flotilla run` (`deploy/`), checked against a live process:
//! every metric the Grafana dashboard and the alert rules query exists in `/metrics` with the
//! label values they select, promtool accepts and unit-tests the rules, the metrics listener
//! serves health and metrics but never the lease API, and `--log-json` lines carry the pool,
//! the plugin digest, the lease and the instance so log pipelines can join them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Flotilla, TOKEN};
use flotilla_harness::poll;
use flotilla_test_artifacts as guests;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config(missing_plugin: &Path) -> String {
    std::fs::write(missing_plugin, b"\0asm half-copied").expect("a broken plugin file");
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
metrics_listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "5s"

[[pool]]
name = "ci"
plugin = "{good}"
capacity_per_instance = 1
max_instances = 1
instance_acquire_timeout = "10s"
update_interval = "1s"
[pool.plugin_config]
hosts = [{{ address = "127.0.0.1" }}]
[[pool.policy]]
periods = ["* * * * *"]
idle_count = 1

# A plugin that traps in every update: provider errors, plugin faults, an open circuit.
[[pool]]
name = "faulty"
plugin = "{misbehave}"
max_instances = 1
update_interval = "1s"
fallback = "ci"
[pool.plugin_config]
on = {{ update = "trap" }}
[pool.limits]
circuit_threshold = 2

# A pool whose plugin file is half-copied: start-failed, as the alert rules see it.
[[pool]]
name = "broken"
plugin = "{missing}"
max_instances = 1
paused_retry_interval = "30s"
"#,
        good = guests::STATIC_PLUGIN,
        misbehave = guests::MISBEHAVE,
        missing = missing_plugin.display(),
    )
}

/// The samples of a text exposition: metric name → label sets.
fn samples(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, rest) = match line.find('{') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line.split(' ').next().unwrap(), ""),
        };
        let mut labels = BTreeMap::new();
        if let Some(end) = rest.find('}') {
            for pair in rest[..end].split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').expect("label=value");
                labels.insert(k.to_string(), v.trim_matches('"').to_string());
            }
        }
        out.entry(name.to_string()).or_default().push(labels);
    }
    out
}

/// A label matcher: the label and the values it accepts.
type Matcher = (String, Vec<String>);

/// Each `flotilla_*` selector in a PromQL expression: the metric name and its `label="value"`
/// and `label=~"a|b"` matchers (values as alternatives).
fn selectors(expr: &str) -> Vec<(String, Vec<Matcher>)> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("flotilla_") {
        let start = i + at;
        let prev = start.checked_sub(1).map(|p| bytes[p]);
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        i = end;
        if prev.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'"') {
            continue; // inside another identifier or a string (a help text, a label value)
        }
        let name = expr[start..end].to_string();
        let mut matchers = Vec::new();
        if expr[end..].starts_with('{') {
            let close = expr[end..].find('}').expect("a closing brace") + end;
            for m in expr[end + 1..close].split(',') {
                let m = m.trim();
                // Dashboard variables (`$pool`) match whatever exists; skip them.
                if let Some((k, v)) = m.split_once("=~").filter(|(_, v)| !v.contains('$')) {
                    let alts = v.trim().trim_matches('"').split('|');
                    matchers.push((k.trim().to_string(), alts.map(String::from).collect()));
                } else if let Some((k, v)) = m.split_once('=').filter(|(_, v)| !v.contains('$')) {
                    let v = v.trim().trim_matches('"').to_string();
                    matchers.push((k.trim().to_string(), vec![v]));
                }
            }
            i = close;
        }
        out.push((name, matchers));
    }
    out
}

/// Every expression of the dashboard's panels and variables.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/flotilla.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("a panel's targets");
        assert!(
            !targets.is_empty(),
            "panel {} queries nothing",
            panel["title"]
        );
        for t in targets {
            exprs.push(t["expr"].as_str().expect("an expr").to_string());
        }
    }
    for var in dash["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = var["query"]["query"].as_str() {
            exprs.push(q.to_string());
        }
    }
    exprs
}

/// Every `expr:` of the alert rules (one line each, as the file's header promises).
fn rule_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/rules.yaml")).unwrap();
    let exprs: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .map(String::from)
        .collect();
    let alerts = text
        .lines()
        .filter(|l| l.trim().starts_with("- alert:"))
        .count();
    assert_eq!(exprs.len(), alerts, "every rule has a one-line expr");
    exprs
}

/// Whether a selector names a series in `/metrics` (histograms through their `_bucket`,
/// `_sum` and `_count` series) with every label value it selects.
fn missing(
    have: &BTreeMap<String, Vec<BTreeMap<String, String>>>,
    name: &str,
    matchers: &[Matcher],
) -> Option<String> {
    let Some(series) = have.get(name) else {
        return Some(format!("{name} is not in /metrics"));
    };
    for (label, values) in matchers {
        for v in values {
            if !series.iter().any(|s| s.get(label) == Some(v)) {
                return Some(format!("{name} has no series with {label}={v:?}"));
            }
        }
    }
    None
}

#[tokio::test]
async fn the_dashboard_and_alert_rules_query_only_metrics_a_live_process_exports() {
    let dir = tempfile::tempdir().expect("dir");
    let missing_plugin = dir.path().join("not-deployed-yet.wasm");
    let f = Flotilla::start_json(dir, &config(&missing_plugin)).await;

    // Traffic that makes every family appear: a lease with a job report, and a reservation
    // refused at capacity (one slot in the pool, and it is taken).
    let leases = "/v1/pools/ci/leases";
    let (code, body) = f.call("POST", leases, Some(json!({}))).await;
    assert_eq!(code, 201, "{body}");
    let id = body["lease"]["id"].as_u64().unwrap();
    let (code, body) = f
        .call("POST", &format!("{leases}/{id}/acquire"), None)
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = f.call("POST", leases, Some(json!({}))).await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (429, Some("at_capacity")),
        "{body}"
    );
    for report in [
        json!({"job_started": {"prepare_seconds": 2.5, "pull_seconds": 0.5}}),
        json!({"job_finished": {"outcome": "success"}}),
    ] {
        let (code, body) = f
            .call("POST", &format!("{leases}/{id}/report"), Some(report))
            .await;
        assert_eq!(code, 200, "{body}");
    }
    let (code, body) = f
        .call("POST", &format!("{leases}/{id}/release"), None)
        .await;
    assert_eq!(code, 200, "{body}");

    // The metrics listener: health and metrics, never the lease API (not even with the token).
    let metrics_base = f.metrics.clone().expect("the metrics listener");
    let get = |path: &str| {
        let url = format!("{metrics_base}{path}");
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("the metrics listener answers");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(
        get("/v1/pools").await.0,
        404,
        "the metrics listener served the lease API"
    );
    // /readyz names the pool that did not start.
    let (code, ready) = get("/readyz").await;
    assert_eq!(code, 503, "{ready}");
    assert!(ready.contains("broken"), "{ready}");

    // Published every 2 s (plugin health) and on each scaler change: wait for the families,
    // and for the faulting plugin's circuit to open.
    let circuit_open = |text: &str| {
        text.lines().any(|l| {
            l.starts_with("flotilla_plugin_circuit_open{")
                && l.contains("pool=\"faulty\"")
                && l.ends_with(" 1")
        })
    };
    let text = poll::until(
        "the metric families and the faulting plugin's open circuit",
        std::time::Duration::from_secs(20),
        || async {
            let text = get("/metrics").await.1;
            if circuit_open(&text)
                && text.contains("flotilla_instance_creation_to_ready_seconds_count{")
            {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    let have = samples(&text);

    let mut problems = BTreeSet::new();
    let mut checked = 0;
    for (source, exprs) in [("dashboard", dashboard_exprs()), ("rules", rule_exprs())] {
        for expr in exprs {
            let sel = selectors(&expr);
            assert!(!sel.is_empty(), "{source}: {expr} names no flotilla metric");
            for (name, matchers) in sel {
                checked += 1;
                if let Some(p) = missing(&have, &name, &matchers) {
                    problems.insert(format!("{source}: {p} (in {expr})"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n\n/metrics:\n{text}",
        problems.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(checked >= 30, "only {checked} selectors checked");

    // The states the rules and the dashboard rely on, as the process reports them.
    let state = |pool: &str, s: &str| {
        have["flotilla_pool_state"]
            .iter()
            .any(|l| l["pool"] == pool && l["state"] == s)
            && text.contains(&format!(
                "flotilla_pool_state{{pool=\"{pool}\",state=\"{s}\"}} 1"
            ))
    };
    assert!(state("ci", "ready"), "{text}");
    assert!(state("broken", "start-failed"), "{text}");
    assert!(
        circuit_open(&text),
        "the faulting plugin's circuit is not shown open:\n{text}"
    );
    assert!(
        text.contains("flotilla_reservations_refused_total{pool=\"ci\",reason=\"at_capacity\"} 1"),
        "{text}"
    );
}

#[test]
fn promtool_accepts_the_alert_rules_and_their_unit_tests_pass() {
    let dir = repo().join("deploy/prometheus");
    for args in [
        ["check", "rules", "rules.yaml"],
        ["test", "rules", "rules.test.yaml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool (scripts/test.sh installs prometheus)");
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every rule has a unit test that expects it to fire.
    let tests = std::fs::read_to_string(dir.join("rules.test.yaml")).unwrap();
    for expr_alert in rule_alert_names() {
        assert!(
            tests.contains(&format!("alertname: {expr_alert}")),
            "{expr_alert} has no unit test"
        );
    }
}

fn rule_alert_names() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/rules.yaml")).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn json_log_lines_carry_the_pool_plugin_digest_lease_and_instance() {
    let dir = tempfile::tempdir().expect("dir");
    let missing_plugin = dir.path().join("absent.wasm");
    let f = Flotilla::start_json(dir, &config(&missing_plugin)).await;
    f.lease_cycle("ci").await;
    // The lease lines are written before the API answers; the log is flushed per line.
    let log = f.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let digest = format!("sha256:{}", hex::encode(sha2_of(guests::STATIC_PLUGIN)));
    // Three pools log concurrently: find a message of one pool (named on the line or by its span).
    let find = |pool: &str, message: &str| -> &Value {
        lines
            .iter()
            .find(|l| {
                l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(message))
                    && (l["pool"] == pool || l["span"]["pool"] == pool)
            })
            .unwrap_or_else(|| panic!("no {message:?} line of pool {pool} in:\n{log}"))
    };

    let loaded = find("ci", "plugin loaded");
    assert_eq!(
        (&loaded["pool"], &loaded["plugin_digest"]),
        (&json!("ci"), &json!(digest))
    );
    // Lines logged inside the pool (its scaler, its plugin) carry the pool's span.
    let scaled = find("ci", "scaled up");
    assert_eq!(scaled["span"]["pool"], "ci", "{scaled}");
    assert_eq!(scaled["span"]["plugin_digest"], json!(digest), "{scaled}");
    let guest = lines
        .iter()
        .find(|l| l["target"] == "flotilla::plugin::log" && l["span"]["pool"] == "ci")
        .unwrap_or_else(|| panic!("no plugin log line in:\n{log}"));
    assert_eq!(guest["span"]["plugin_digest"], json!(digest), "{guest}");

    // A lease's lines join the lease, its instance, the pool and the plugin.
    let reserved = find("ci", "lease reserved");
    let lease = reserved["lease"].as_u64().expect("a lease id");
    for message in ["lease acquired", "lease released"] {
        let l = find("ci", message);
        assert_eq!(l["lease"], lease, "{l}");
        assert_eq!(l["pool"], "ci", "{l}");
        assert_eq!(l["plugin_digest"], json!(digest), "{l}");
        assert_eq!(l["instance"], "127.0.0.1", "{l}");
    }
    // The pool that failed to start says which, with its name.
    let failed = find("broken", "pool not started");
    assert_eq!(failed["pool"], "broken", "{failed}");
}

fn sha2_of(path: &str) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(path).expect("the plugin")).to_vec()
}

#[test]
fn a_metrics_listener_on_the_api_address_is_refused_with_its_line() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("flotilla.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\nmetrics_listen = \"127.0.0.1:8080\"\n\n[[pool]]\nname = \"ci\"\nplugin = \"{}\"\nmax_instances = 1\n",
            guests::STATIC_PLUGIN
        ),
    )
    .expect("config");
    let (code, _, stderr) = common::cli(&["config", "check", "-c", &path.display().to_string()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(
            "flotilla.toml:3: server.metrics_listen: is the same address as server.listen"
        ),
        "{stderr}"
    );
}

//! `flotilla plugin check` as a user runs it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

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
            out.contains("world:    flotilla:provider/provider@0.1.4"),
            "{out}"
        );
        assert!(
            out.contains("flotilla:provider/instance-group@0.1.4"),
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
    assert_eq!(v["world"], "flotilla:provider/provider@0.1.4");
    assert!(
        v["imports"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["name"] == "flotilla:provider/log@0.1.4"))
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

    // A spot pool out of capacity from minute 20 to 30, alone and with its fallback.
    let spot = format!("{root}/sim-spot-fallback.toml");
    let trace = format!("{root}/traces/spot-stockout.csv");
    let (code, out, err) = flotilla(&[
        "simulate",
        "-c",
        &spot,
        "--trace",
        &trace,
        "--stockout",
        "1200..1800",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let runs: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let names: Vec<&str> = runs
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        [
            "sim-spot-fallback:spot",
            "sim-spot-fallback:spot+on-demand",
            "sim-spot-fallback:on-demand"
        ]
    );
    let (alone, paired) = (&runs[0]["report"], &runs[1]["report"]);
    assert!(alone["timed_out"].as_u64() > Some(0), "{alone}");
    assert_eq!(paired["timed_out"], 0, "{paired}");
    assert_eq!(paired["completed"], 70, "{paired}");
    assert!(
        paired["served_by_fallback"].as_u64() >= Some(10),
        "{paired}"
    );
    let (code, _, err) = flotilla(&[
        "simulate",
        "-c",
        &spot,
        "--trace",
        &trace,
        "--stockout",
        "1800..1200",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("expected MIN..MAX seconds"), "{err}");

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

/// Runs `flotilla tune` on the shipped month and pool; its JSON.
fn tune(extra: &[&str]) -> (i32, String, String) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tune");
    let pool = format!("{root}/pool.toml");
    let month = format!("{root}/month.csv");
    let mut args = vec!["tune", "-c", &pool, "--history", &month];
    args.extend_from_slice(extra);
    flotilla(&args)
}

#[test]
fn tune_recommends_what_simulate_then_reproduces_and_reports_held_out_days_apart() {
    let trace = temp("fit.csv", b"");
    let svg = temp("frontier.svg", b"");
    let (code, out, err) = tune(&[
        "--wait-p95",
        "60s",
        "--cost-per-hour",
        "0.096",
        "--json",
        "--export-trace",
        &trace,
        "--svg",
        &svg,
    ]);
    assert_eq!(code, 0, "{err}");
    let o: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let rec = &o["recommended"]["fit"];
    assert!(rec["wait_p95_s"].as_f64().unwrap() <= 60.0, "{rec}");
    assert_eq!(rec["timed_out"], 0);
    // Cheaper than the current flat policy, and priced.
    let hours = rec["instance_hours"].as_f64().unwrap();
    assert!(hours < o["current"]["fit"]["instance_hours"].as_f64().unwrap());
    assert!((rec["cost"].as_f64().unwrap() - hours * 0.096).abs() < 1e-6);

    // The blocks, pasted into the pool, simulate to the same figures.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tune");
    let text = std::fs::read_to_string(format!("{root}/pool.toml")).unwrap();
    let head = &text[..text.find("[[pool.policy]]").unwrap()];
    let blocks = o["recommended_toml"].as_str().unwrap();
    let applied = temp("applied.toml", format!("{head}{blocks}").as_bytes());
    let start = o["fit_start"].as_str().unwrap();
    let (code, out, err) = flotilla(&[
        "simulate",
        "-c",
        &applied,
        "--trace",
        &trace,
        "--start",
        start,
        "--provisioning-delay",
        "30..90",
        "--seed",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let runs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let report = &runs[0]["report"];
    assert_eq!(report["jobs"], o["fit_jobs"]);
    assert_eq!(report["timed_out"], rec["timed_out"]);
    assert_eq!(report["wait_p95_s"], rec["wait_p95_s"]);
    assert_eq!(report["wait_max_s"], rec["wait_max_s"]);
    let simulated = report["instance_seconds"].as_f64().unwrap() / 3600.0;
    assert!((simulated - hours).abs() < 1e-6, "{simulated} vs {hours}");

    // The held-out days are figures of their own.
    let held = o["holdout_jobs"].as_u64().unwrap();
    assert!(held > 1000, "{held}");
    assert_eq!(o["recommended_holdout"]["jobs"].as_u64(), Some(held));
    assert_eq!(o["current_holdout"]["jobs"].as_u64(), Some(held));
    assert_ne!(o["fit_jobs"].as_u64(), Some(held));
    let svg_text = std::fs::read_to_string(&svg).unwrap_or_default();
    assert!(svg_text.contains("frontier") && svg_text.contains("recommended"));
}

#[test]
fn tune_refuses_bad_histories_by_line_and_names_the_closest_goal_when_out_of_reach() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tune");
    let pool = format!("{root}/pool.toml");
    let run = |history: &str| {
        flotilla(&[
            "tune",
            "-c",
            &pool,
            "--history",
            history,
            "--wait-p95",
            "60s",
        ])
    };

    let gitlab = temp(
        "jobs.json",
        br#"[
  {"id": 2, "status": "success", "started_at": "2026-11-02T09:01:00Z", "duration": 30, "queued_duration": 1},
  {"id": 1, "status": "success", "started_at": "2026-11-02T09:0", "duration": 30, "queued_duration": 1}
]"#,
    );
    let (code, _, err) = run(&gitlab);
    assert_eq!(code, 1);
    assert!(
        err.contains("line 3: started_at \"2026-11-02T09:0\" is not an RFC 3339 time"),
        "{err}"
    );

    let unordered = temp(
        "jobs.csv",
        b"submit_at,duration_s\n2026-11-02T10:00:00Z,60\n2026-11-02T09:00:00Z,60\n",
    );
    let (code, _, err) = run(&unordered);
    assert_eq!(code, 1);
    assert!(err.contains("line 3: out of order"), "{err}");

    let empty = temp(
        "none.json",
        br#"[{"id": 5, "status": "manual", "started_at": null}]"#,
    );
    let (code, _, err) = run(&empty);
    assert_eq!(code, 1);
    assert!(
        err.contains("no jobs to tune on (set aside: 1 never started (status manual))"),
        "{err}"
    );

    let (code, out, _) = tune(&["--wait-p95", "0s"]);
    assert_eq!(code, 1);
    assert!(
        out.contains("closest achievable goal is --wait-p95 "),
        "{out}"
    );
}

/// A pool too small for its history: every candidate, screened or verified, has jobs giving up.
/// `tune` says how many at least (never "at least 0"), and exits 1.
#[test]
fn tune_says_how_many_jobs_give_up_when_every_candidate_times_out() {
    let pool = temp(
        "small.toml",
        br#"[[pool]]
name = "tiny"
plugin = "builtin:static"
capacity_per_instance = 1
max_instances = 1
instance_acquire_timeout = "1m"
update_interval = "30s"

[[pool.policy]]
periods = ["* * * * *"]
timezone = "UTC"
idle_count = 1
idle_time = "30m"
"#,
    );
    let mut csv = String::from("submit_at,duration_s\n");
    for day in 2..=9 {
        for i in 0..20 {
            csv.push_str(&format!("2026-11-{day:02}T10:00:{i:02}Z,3600\n"));
        }
    }
    let history = temp("crowd.csv", csv.as_bytes());
    let (code, out, err) = flotilla(&[
        "tune",
        "-c",
        &pool,
        "--history",
        &history,
        "--wait-p95",
        "60s",
        "--holdout",
        "0s",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let said = format!("{out}{err}");
    assert!(said.contains("no policy tried avoids timeouts"), "{said}");
    assert!(!said.contains("at least 0 "), "{said}");
    let fewest: u64 = said
        .split("at least ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {said}"));
    // 20 jobs a day at once for one slot: 19 of them cannot wait an hour.
    assert!(fewest >= 19, "{said}");
}

/// The recommendation, replayed on held-out days much busier than the fitted ones, misses the
/// goal: `tune` warns in plain words, and `--strict` exits 1.
#[test]
fn tune_warns_when_the_held_out_days_miss_the_goal_and_strict_fails() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tune");
    let pool = format!("{root}/pool.toml");
    // Two quiet weeks (a job every ten minutes), then a week of bursts of 60 jobs an hour.
    let mut csv = String::from("submit_at,duration_s\n");
    for day in 2..=15 {
        for minute in (0..24 * 60).step_by(10) {
            csv.push_str(&format!(
                "2026-11-{day:02}T{:02}:{:02}:00Z,300\n",
                minute / 60,
                minute % 60
            ));
        }
    }
    for day in 16..=22 {
        for hour in 0..24 {
            for i in 0..60 {
                csv.push_str(&format!("2026-11-{day:02}T{hour:02}:00:{i:02}Z,900\n"));
            }
        }
    }
    let history = temp("shift.csv", csv.as_bytes());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "tune",
            "-c",
            &pool,
            "--history",
            &history,
            "--wait-p95",
            "60s",
            "--holdout",
            "7days",
        ];
        args.extend_from_slice(extra);
        flotilla(&args)
    };
    let (code, out, err) = run(&[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("WARNING: the recommendation misses the goal on the held-out days"),
        "{out}"
    );
    assert!(err.contains("warning:"), "{err}");
    let (code, _, err) = run(&["--strict"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--strict: the recommendation misses the goal"),
        "{err}"
    );
}

/// `flotilla plugin check` and `flotilla plugin test` on the template plugin against the
/// example cloud, and the conformance kit against a plugin with one deliberate flaw per run:
/// each flaw fails exactly its rule, and the flawless run passes.
mod plugin_kit {
    use super::guests;
    use flotilla_example_cloud::{ExampleCloud, Options};

    /// The example cloud (the one `plugin test --example-cloud` serves), with a group `ci` of
    /// at most `max_size` and no token check.
    async fn example_cloud(max_size: u32) -> ExampleCloud {
        let options = Options {
            group: "ci".into(),
            max_size,
            token: None,
        };
        ExampleCloud::start(options)
            .await
            .unwrap_or_else(|e| panic!("the example cloud: {e}"))
    }

    /// Runs the `flotilla` binary; exit code and stdout+stderr.
    fn flotilla(args: &[&str], cache: &std::path::Path) -> (i32, String) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .env("XDG_CACHE_HOME", cache)
            .env("FLOTILLA_LOG", "warn")
            .output()
            .unwrap_or_else(|e| panic!("run flotilla: {e}"));
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// `plugin check --settings` refused by the sandbox names the flag that allows it, one
    /// refusal at a time, and passes once both flags are given.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plugin_check_names_the_flag_a_refused_request_needs() {
        let cloud = example_cloud(3).await;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let settings = dir.path().join("settings.json");
        std::fs::write(
            &settings,
            format!(r#"{{"endpoint":"{}","group":"ci"}}"#, cloud.endpoint()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let settings = settings.display().to_string();
        let host = format!("http://127.0.0.1:{}", cloud.addr.port());
        let base = [
            "plugin",
            "check",
            guests::TEMPLATE_PLUGIN,
            "--settings",
            &settings,
        ];
        let (code, out) = flotilla(&base, dir.path());
        assert_ne!(code, 0, "{out}");
        assert!(
            out.contains(&format!("(allow it with --allow-host {host})")),
            "{out}"
        );
        let with_host: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--allow-host", &host])
            .collect();
        let (code, out) = flotilla(&with_host, dir.path());
        assert_ne!(code, 0, "{out}");
        assert!(
            out.contains("(allow it with --allow-ip-range 127.0.0.1/32)"),
            "{out}"
        );
        let both: Vec<&str> = with_host
            .iter()
            .copied()
            .chain(["--allow-ip-range", "127.0.0.1/32"])
            .collect();
        let (code, out) = flotilla(&both, dir.path());
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("init:     ok"), "{out}");
    }

    /// `plugin test --config --pool` runs the kit in that pool's own sandbox and settings,
    /// and an unknown pool is named with the ones that exist.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plugin_test_uses_a_pools_sandbox_and_settings() {
        let cloud = example_cloud(3).await;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let config = dir.path().join("flotilla.toml");
        std::fs::write(
            &config,
            format!(
                r#"[[pool]]
    name = "tmpl"
    plugin = "{plugin}"
    max_instances = 2
    allowed_outbound_hosts = ["{ep}"]
    allowed_ip_ranges = ["127.0.0.0/8"]

    [pool.plugin_config]
    endpoint = "{ep}"
    group = "ci"
    "#,
                plugin = guests::TEMPLATE_PLUGIN,
                ep = cloud.endpoint()
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let config = config.display().to_string();
        let (code, out) = flotilla(
            &[
                "plugin", "test", "--config", &config, "--pool", "tmpl", "--json",
            ],
            dir.path(),
        );
        assert_eq!(code, 0, "{out}");
        let report: serde_json::Value = serde_json::from_str(
            out.lines()
                .skip_while(|l| !l.starts_with('{'))
                .collect::<Vec<_>>()
                .join("\n")
                .as_str(),
        )
        .unwrap_or_else(|e| panic!("{e}: {out}"));
        let outcome = |rule: &str| {
            report["rules"]
                .as_array()
                .and_then(|r| r.iter().find(|x| x["rule"] == rule))
                .map(|x| x["outcome"].as_str().unwrap_or_default().to_string())
        };
        assert_eq!(outcome("init.ok").as_deref(), Some("PASS"), "{report:#}");
        assert_eq!(
            outcome("init.all-problems").as_deref(),
            Some("PASS"),
            "{report:#}"
        );
        assert_eq!(outcome("provision").as_deref(), Some("SKIP"), "{report:#}");
        assert!(
            cloud.seen().iter().any(|s| s.path == "/v1/groups/ci"),
            "the pool's settings reached the cloud"
        );
        let (code, out) = flotilla(
            &["plugin", "test", "--config", &config, "--pool", "nope"],
            dir.path(),
        );
        assert_ne!(code, 0);
        assert!(
            out.contains("no pool named \"nope\" (there are: tmpl)"),
            "{out}"
        );
    }

    /// `flotilla plugin test` on the guest with `flaw`, provisioning: exit code and
    /// `(rule, outcome)` of every rule.
    fn kit(flaw: &str, cache: &std::path::Path) -> (i32, Vec<(String, String)>) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args([
                "plugin",
                "test",
                guests::NONCONFORMING,
                "--provision",
                "--json",
            ])
            .args(["--timeout", "10s", "--settings"])
            .arg(format!(r#"{{"flaw":"{flaw}"}}"#))
            .env("XDG_CACHE_HOME", cache)
            .env("FLOTILLA_LOG", "warn")
            .output()
            .expect("run flotilla");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{flaw}: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(report["left_behind"], serde_json::json!([]), "{report:#}");
        let rules = report["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(|r| {
                (
                    r["rule"].as_str().unwrap_or_default().to_string(),
                    r["outcome"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        (out.status.code().unwrap_or(-1), rules)
    }

    #[test]
    fn each_flaw_fails_exactly_its_rule() {
        let cache = tempfile::tempdir().expect("cache dir");
        let (code, rules) = kit("none", cache.path());
        assert_eq!(code, 0, "{rules:?}");
        let passed: Vec<&str> = rules
            .iter()
            .filter(|(_, o)| o == "PASS")
            .map(|(r, _)| r.as_str())
            .collect();
        for rule in [
            "init.ok",
            "init.unknown-key",
            "init.all-problems",
            "update.stable",
            "update.unique",
            "connect-info.unknown",
            "provision.increase",
            "provision.appears",
            "provision.connect-info",
            "decrease.subset",
            "decrease.idempotent",
            "provision.gone",
        ] {
            assert!(passed.contains(&rule), "{rule} did not pass: {rules:?}");
        }
        for (flaw, rule) in [
            ("increase-more", "provision.increase"),
            ("decrease-extra", "decrease.subset"),
            ("update-duplicate", "update.unique"),
            ("accept-unknown", "init.unknown-key"),
            ("first-problem-only", "init.all-problems"),
            ("decrease-not-idempotent", "decrease.idempotent"),
        ] {
            let (code, rules) = kit(flaw, cache.path());
            assert_eq!(code, 1, "{flaw}: {rules:?}");
            let failed: Vec<&str> = rules
                .iter()
                .filter(|(_, o)| o == "FAIL")
                .map(|(r, _)| r.as_str())
                .collect();
            assert_eq!(
                failed,
                vec![rule],
                "{flaw} must fail exactly {rule}: {rules:?}"
            );
        }
    }
}

//! The host loads each guest and runs every export; test guests prove the sandbox and limits.
//! Each protection test here fails when its protection is removed (see the issue notes).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use flotilla_harness as common;
use flotilla_harness::must;
#[path = "plugins/egress.rs"]
mod egress;

use std::time::{Duration, Instant};

use common::{LogCapture, load, quick_sandbox};
use flotilla_plugin_runtime::Sandbox;
use flotilla_provider::{CallError, Function, InstanceState, Protocol, Provider, ProviderError};
use flotilla_test_artifacts as guests;

flotilla_test_artifacts::assert_test_guests_covered!();

/// A well-behaved second plugin in the same process, to prove faults stay contained.
async fn bystander() -> impl Provider {
    let p = load(guests::STATIC_PLUGIN).provider("bystander", Sandbox::default());
    must(p.init(r#"{"hosts":[{"address":"198.51.100.7"}]}"#)).await;
    p
}

async fn assert_bystander_works(p: &impl Provider) {
    let before = must(p.update()).await.instances.len();
    assert!(must(p.increase(1)).await <= 1);
    let after = must(p.update()).await.instances;
    assert!(after.len() >= before);
    let ids: Vec<String> = after.iter().map(|i| i.id.clone()).collect();
    must(p.decrease(&ids)).await;
}

mod static_plugin {
    use super::*;

    const SETTINGS: &str = r#"{"name":"lab","hosts":[
        {"address":"192.0.2.1","username":"ci"},
        {"id":"win","address":"192.0.2.2","protocol":"winrm","os":"windows","external_address":"203.0.113.2"},
        {"address":"192.0.2.3","port":2222}]}"#;

    #[tokio::test]
    async fn every_export() {
        let p = load(guests::STATIC_PLUGIN).provider("static", Sandbox::default());
        let info = must(p.init(SETTINGS)).await;
        assert_eq!(info.id, "static/lab");
        assert_eq!(info.max_size, 3);
        assert!(
            must(p.update()).await.instances.is_empty(),
            "nothing is active before increase"
        );

        assert_eq!(must(p.increase(2)).await, 2);
        let active = must(p.update()).await.instances;
        let ids: Vec<&str> = active.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["192.0.2.1", "win"]);
        assert!(active.iter().all(|i| i.state == InstanceState::Running));

        assert_eq!(
            must(p.increase(5)).await,
            1,
            "partial success: only one host left"
        );
        assert_eq!(must(p.increase(1)).await, 0);

        let win = must(p.connect_info("win")).await;
        assert_eq!(win.protocol, Protocol::Winrm);
        assert_eq!(win.port, 5986);
        assert_eq!(win.internal_address.as_deref(), Some("192.0.2.2"));
        assert_eq!(win.external_address.as_deref(), Some("203.0.113.2"));
        let third = must(p.connect_info("192.0.2.3")).await;
        assert_eq!((third.protocol, third.port), (Protocol::Ssh, 2222));
        let missing = p.connect_info("nope").await;
        assert!(
            matches!(
                missing,
                Err(CallError::Provider {
                    error: ProviderError::NotFound(_),
                    ..
                })
            ),
            "{missing:?}"
        );

        must(p.heartbeat("win")).await;
        let accepted = must(p.decrease(&["win".to_string(), "unknown".to_string()])).await;
        assert_eq!(accepted, ["win"], "unknown ids are not accepted");
        assert_eq!(
            must(p.decrease(&["win".to_string()])).await,
            ["win"],
            "decrease is idempotent"
        );
        assert!(
            p.heartbeat("win").await.is_err(),
            "released host is not alive"
        );
        let ids: Vec<String> = must(p.update())
            .await
            .instances
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(ids, ["192.0.2.1", "192.0.2.3"]);
        must(p.shutdown()).await;
    }

    #[tokio::test]
    async fn bad_settings_report_every_problem() {
        let p = load(guests::STATIC_PLUGIN).provider("static", Sandbox::default());
        let err = p
            .init(r#"{"hosts":[{"address":""},{"address":"x","os":"plan9"},{"address":"x"}],"colour":1}"#)
            .await;
        let Err(CallError::Provider {
            error: ProviderError::InvalidConfig(msg),
            ..
        }) = err
        else {
            panic!("expected invalid-config, got {err:?}");
        };
        for needle in [
            "colour: unknown key",
            "hosts[0].address",
            "hosts[1].os",
            "duplicate id \"x\"",
        ] {
            assert!(msg.contains(needle), "{needle:?} missing from {msg:?}");
        }
        for bad in ["not json", "[]", "{}"] {
            let r = p.init(bad).await;
            assert!(
                matches!(
                    r,
                    Err(CallError::Provider {
                        error: ProviderError::InvalidConfig(_),
                        ..
                    })
                ),
                "{bad}: {r:?}"
            );
        }
        let r = p.update().await;
        assert!(matches!(r, Err(CallError::NotInitialized { .. })), "{r:?}");
    }
}

mod template {
    use super::*;
    use flotilla_example_cloud::{ExampleCloud, Options};

    /// The example cloud the templates are tried against (the one `plugin test
    /// --example-cloud` serves), with a group `ci` of at most `max_size` and no token check
    /// (the tests that need one assert the header themselves).
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

    /// A sandbox that lets the plugin reach `cloud` on loopback, and nothing else.
    fn reaching(cloud: &ExampleCloud) -> Sandbox {
        let mut sandbox = quick_sandbox(&[format!("http://{}", cloud.addr).as_str()]);
        sandbox.egress.allowed_ip_ranges =
            vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))];
        sandbox
    }

    /// A credential its identity provider refuses (here a metadata server answering 403):
    /// the request never reaches the cloud, and the plugin gets a 401 it reports as
    /// `unauthorized`, with the refusal, so the scaler pauses the call.
    #[tokio::test]
    async fn a_refused_credential_reaches_the_plugin_as_unauthorized_and_never_the_cloud() {
        let cloud = example_cloud(3).await;
        let allow = format!("http://{}", cloud.addr);
        let idp = flotilla_peers::serve::serve_http(|_req: hyper::Request<hyper::body::Incoming>| async {
            Ok::<_, std::convert::Infallible>(
                hyper::Response::builder()
                    .status(403)
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(
                        b"{\"error\":\"access_denied\",\"error_description\":\"workload identity is not enabled\"}",
                    )))
                    .unwrap_or_else(|e| panic!("{e}")),
            )
        })
        .await;
        let mut sandbox = quick_sandbox(&[allow.as_str()]);
        sandbox.egress.allowed_ip_ranges =
            vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))];
        sandbox.egress.credentials = vec![flotilla_credentials::Credential {
            name: "gcp".into(),
            kind: flotilla_credentials::CredentialKind::Gcp(
                flotilla_credentials::gcp::GcpHandle::new(flotilla_credentials::gcp::GcpConfig {
                    metadata_endpoint: Some(format!("http://{idp}")),
                    ..Default::default()
                }),
            ),
            hosts: flotilla_net::AllowList::parse(&[allow.as_str()])
                .unwrap_or_else(|e| panic!("{e:?}")),
        }];
        let p = load(guests::TEMPLATE_PLUGIN).provider("template", sandbox);
        let settings = format!(
            r#"{{"endpoint":"{}","group":"ci","credential":"gcp"}}"#,
            cloud.endpoint()
        );
        let r = p.init(&settings).await;
        match &r {
            Err(CallError::Provider {
                error: ProviderError::Unauthorized(message),
                ..
            }) => assert!(
                message.contains("access_denied") && message.contains("workload identity"),
                "{message}"
            ),
            other => panic!("expected unauthorized, got {other:?}"),
        }
        assert!(cloud.seen().is_empty(), "the request reached the cloud");
        assert_eq!(
            p.health().egress_denied,
            0,
            "a refusal is not an egress denial"
        );
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

    #[tokio::test]
    async fn every_export_over_http() {
        let cloud = example_cloud(3).await;
        let mut sandbox = reaching(&cloud);
        sandbox.egress.credentials = vec![flotilla_credentials::Credential {
            name: "example".into(),
            kind: flotilla_credentials::CredentialKind::Bearer {
                token: flotilla_credentials::SecretSource::Value(
                    flotilla_credentials::Secret::new("tkn-123"),
                ),
            },
            hosts: flotilla_net::AllowList::parse(&[format!("http://{}", cloud.addr).as_str()])
                .unwrap_or_else(|e| panic!("{e:?}")),
        }];
        let p = load(guests::TEMPLATE_PLUGIN).provider("template", sandbox);
        let settings = format!(
            r#"{{"endpoint":"{}","group":"ci","credential":"example"}}"#,
            cloud.endpoint()
        );
        let info = must(p.init(&settings)).await;
        assert_eq!((info.id.as_str(), info.max_size), ("example/ci", 3));
        assert_eq!(must(p.increase(5)).await, 3, "the cloud granted only 3");
        let list = must(p.update()).await.instances;
        assert_eq!(list.len(), 3);
        assert!(list.iter().all(|i| i.state == InstanceState::Creating));
        let c = must(p.connect_info("i-0002")).await;
        assert_eq!(c.internal_address.as_deref(), Some("127.0.0.1"));
        let accepted = must(p.decrease(&["i-0001".into(), "i-0009".into()])).await;
        assert_eq!(accepted, ["i-0001"]);
        // The removed instance is terminating for a while, then gone.
        let list = must(p.update()).await.instances;
        let deleting: Vec<&str> = list
            .iter()
            .filter(|i| i.state == InstanceState::Deleting)
            .map(|i| i.id.as_str())
            .collect();
        assert_eq!((list.len(), deleting), (3, vec!["i-0001"]));
        let hb = p.heartbeat("i-2").await;
        assert!(matches!(
            hb,
            Err(CallError::Provider {
                error: ProviderError::Unsupported(_),
                ..
            })
        ));
        must(p.shutdown()).await;
        // Every call was authenticated by the host, not by the plugin.
        for seen in cloud.seen() {
            let auth = seen
                .headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v.as_str());
            assert_eq!(
                auth,
                Some("Bearer tkn-123"),
                "{} {}",
                seen.method,
                seen.path
            );
        }
        let paths: Vec<String> = cloud
            .seen()
            .iter()
            .map(|s| format!("{} {}", s.method, s.path))
            .collect();
        assert_eq!(
            paths,
            [
                "GET /v1/groups/ci",
                "POST /v1/groups/ci/increase",
                "GET /v1/groups/ci/instances",
                "GET /v1/groups/ci/instances/i-0002",
                "POST /v1/groups/ci/decrease",
                "GET /v1/groups/ci/instances",
            ]
        );
    }

    #[tokio::test]
    async fn cloud_errors_map_to_contract_errors() {
        let cloud = example_cloud(3).await;
        let sandbox = reaching(&cloud);
        let p = load(guests::TEMPLATE_PLUGIN).provider("template", sandbox);
        must(p.init(&format!(
            r#"{{"endpoint":"{}","group":"ci"}}"#,
            cloud.endpoint()
        )))
        .await;
        for (status, check) in [
            (
                403u16,
                (|e: &ProviderError| matches!(e, ProviderError::Unauthorized(_)))
                    as fn(&ProviderError) -> bool,
            ),
            // The cloud's Retry-After (7 s) and its words come through.
            (429, |e| {
                matches!(e, ProviderError::Throttled { retry_after, message }
                    if *retry_after == Duration::from_secs(7) && message.contains("failing on purpose"))
            }),
            (503, |e| matches!(e, ProviderError::Transient(_))),
        ] {
            cloud.fail_with(Some(status));
            let r = p.update().await;
            let e = r.as_ref().err().and_then(CallError::provider_error);
            assert!(e.is_some_and(check), "HTTP {status} gave {r:?}");
        }
    }

    #[tokio::test]
    async fn a_refused_post_says_why() {
        let cloud = example_cloud(3).await;
        let mut sandbox = reaching(&cloud);
        // One request a minute: init spends it, and the POST after it is refused unsent.
        sandbox.limits.requests_per_minute = 1;
        let p = load(guests::TEMPLATE_PLUGIN).provider("template", sandbox);
        must(p.init(&format!(
            r#"{{"endpoint":"{}","group":"ci"}}"#,
            cloud.endpoint()
        )))
        .await;
        let r = p.increase(2).await;
        let Err(CallError::Provider {
            error: ProviderError::Transient(msg),
            ..
        }) = &r
        else {
            panic!("expected a refused request, got {r:?}");
        };
        // The refusal, not the body stream it closed on the way.
        assert!(msg.contains("HttpRequestDenied"), "{msg}");
        assert!(
            !cloud.seen().iter().any(|s| s.method == "POST"),
            "the POST reached the cloud"
        );
    }

    #[tokio::test]
    async fn requests_outside_the_allow_list_never_leave() {
        let cloud = example_cloud(3).await;
        let logs = LogCapture::default();
        let _guard = logs.install();
        // Allowed: a different port on the same host.
        let mut sandbox = quick_sandbox(&["http://127.0.0.1:1"]);
        sandbox.egress.allowed_ip_ranges =
            vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))];
        let p = load(guests::TEMPLATE_PLUGIN).provider("walled", sandbox);
        let r = p
            .init(&format!(
                r#"{{"endpoint":"{}","group":"ci"}}"#,
                cloud.endpoint()
            ))
            .await;
        let Err(CallError::Provider {
            error: ProviderError::Transient(msg),
            ..
        }) = &r
        else {
            panic!("expected a denied request, got {r:?}");
        };
        assert!(msg.to_lowercase().contains("denied"), "{msg}");
        assert!(cloud.seen().is_empty(), "the request reached the server");
        let text = logs.text();
        assert!(
            text.contains("denied plugin request") && text.contains("pool=walled"),
            "{text}"
        );
        assert_eq!(
            p.egress_stats()
                .denied
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    #[tokio::test]
    async fn empty_allow_list_denies_all() {
        let cloud = example_cloud(3).await;
        let p = load(guests::TEMPLATE_PLUGIN).provider("empty", quick_sandbox(&[]));
        let r = p
            .init(&format!(
                r#"{{"endpoint":"{}","group":"ci"}}"#,
                cloud.endpoint()
            ))
            .await;
        assert!(r.is_err());
        assert!(cloud.seen().is_empty());
    }
}

mod misbehave {
    use super::*;

    fn provider(
        pool: &str,
        settings_sandbox: impl FnOnce(&mut Sandbox),
    ) -> flotilla_plugin_runtime::WasmProvider {
        let mut sandbox = quick_sandbox(&[]);
        settings_sandbox(&mut sandbox);
        load(guests::MISBEHAVE).provider(pool, sandbox)
    }

    async fn call(p: &impl Provider, f: Function) -> Result<(), CallError> {
        match f {
            Function::Init => unreachable!(),
            Function::Update => p.update().await.map(drop),
            Function::Increase => p.increase(1).await.map(drop),
            Function::Decrease => p.decrease(&["m-1".to_string()]).await.map(drop),
            Function::ConnectInfo => p.connect_info("m-1").await.map(drop),
            Function::Heartbeat => p.heartbeat("m-1").await,
            Function::Shutdown => p.shutdown().await,
        }
    }

    #[tokio::test]
    async fn infinite_loop_hits_the_deadline() {
        let p = provider("loop", |s| {
            s.limits.default_deadline = Duration::from_millis(300)
        });
        must(p.init(r#"{"on":{"update":"loop"}}"#)).await;
        let start = Instant::now();
        let r = p.update().await;
        assert!(
            matches!(
                r,
                Err(CallError::Timeout {
                    function: Function::Update,
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        // The next call runs in a fresh, re-initialised instance.
        assert_eq!(must(p.increase(2)).await, 2);
        assert_eq!(p.health().timeouts, 1);
        assert_eq!(p.health().restarts, 1);
    }

    /// On a single-threaded runtime, two guests spinning until their 2 s deadline leave the
    /// thread to other tasks: guest code yields to the executor at every epoch tick, so a
    /// ticker that wants to run every 10 ms is never held up by more than a few ticks.
    #[tokio::test(flavor = "current_thread")]
    async fn spinning_guests_do_not_starve_the_executor() {
        let spinners: Vec<_> = ["spin-a", "spin-b"]
            .into_iter()
            .map(|name| provider(name, |s| s.limits.default_deadline = Duration::from_secs(2)))
            .collect();
        for p in &spinners {
            must(p.init(r#"{"on":{"update":"loop"}}"#)).await;
        }
        let ticker = async {
            let mut worst = Duration::ZERO;
            let mut last = Instant::now();
            let end = last + Duration::from_millis(1500);
            while Instant::now() < end {
                // Deliberate: the ticker's own period.
                tokio::time::sleep(Duration::from_millis(10)).await;
                let now = Instant::now();
                worst = worst.max(now - last);
                last = now;
            }
            worst
        };
        let spins = futures_util::future::join_all(spinners.iter().map(|p| p.update()));
        let (worst, results) = tokio::join!(ticker, spins);
        for r in results {
            assert!(
                matches!(
                    r,
                    Err(CallError::Timeout {
                        function: Function::Update,
                        ..
                    })
                ),
                "{r:?}"
            );
        }
        assert!(
            worst < Duration::from_millis(60),
            "the executor was held for {worst:?} by spinning guests"
        );
    }

    #[tokio::test]
    async fn waiting_on_host_io_hits_the_deadline() {
        // Epochs do not fire while the guest blocks in a host call; the tokio timeout must.
        let p = provider("sleep", |s| {
            s.limits.default_deadline = Duration::from_millis(300)
        });
        must(p.init(r#"{"on":{"heartbeat":"sleep"}}"#)).await;
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), p.heartbeat("x")).await;
        assert!(matches!(r, Ok(Err(CallError::Timeout { .. }))), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        must(p.update()).await;
    }

    #[tokio::test]
    async fn allocation_past_the_cap_traps() {
        let p = provider("alloc", |s| s.limits.memory_bytes = 48 << 20);
        must(p.init(r#"{"on":{"update":"alloc"}}"#)).await;
        let r = p.update().await;
        let Err(CallError::Trap { message, .. }) = &r else {
            panic!("expected a trap, got {r:?}")
        };
        assert!(message.contains("memory cap exceeded"), "{message}");
        must(p.increase(1)).await;
    }

    #[tokio::test]
    async fn trap_or_panic_in_each_export_is_contained() {
        let other = bystander().await;
        for fault in ["trap", "panic"] {
            for f in Function::ALL.into_iter().filter(|f| *f != Function::Init) {
                let p = provider("faulty", |_| {});
                must(p.init(&format!(r#"{{"on":{{"{}":"{fault}"}}}}"#, f.name()))).await;
                let r = call(&p, f).await;
                assert!(
                    matches!(&r, Err(CallError::Trap { function, .. }) if *function == f),
                    "{fault} in {f}: {r:?}"
                );
                // Another export of the same pool works in a fresh instance...
                let healthy = if f == Function::Update {
                    Function::Increase
                } else {
                    Function::Update
                };
                call(&p, healthy)
                    .await
                    .unwrap_or_else(|e| panic!("after {fault} in {f}: {e}"));
                // ...and so does another plugin in the same process.
                assert_bystander_works(&other).await;
            }
            let p = provider("faulty-init", |_| {});
            let r = p.init(&format!(r#"{{"on":{{"init":"{fault}"}}}}"#)).await;
            assert!(
                matches!(
                    r,
                    Err(CallError::Trap {
                        function: Function::Init,
                        ..
                    })
                ),
                "{r:?}"
            );
            assert!(matches!(
                p.update().await,
                Err(CallError::NotInitialized { .. })
            ));
        }
    }

    /// A panic's own words (what the guest wrote to stderr) head the trap's message, above
    /// the wasm backtrace, so an author sees the panic, a Python traceback or a JS stack.
    #[tokio::test]
    async fn a_panic_reports_the_guests_last_stderr_lines_above_the_backtrace() {
        let p = provider("words", |_| {});
        must(p.init(r#"{"on":{"update":"panic"}}"#)).await;
        let r = p.update().await;
        let Err(CallError::Trap { message, .. }) = &r else {
            panic!("expected a trap, got {r:?}")
        };
        let words = message
            .find("misbehave: panic in update")
            .unwrap_or_else(|| panic!("the panic message is missing: {message}"));
        let backtrace = message.find("wasm backtrace").unwrap_or(usize::MAX);
        assert!(
            message.starts_with("guest stderr (last ") && words < backtrace,
            "{message}"
        );
        assert_eq!(
            p.health()
                .last_fault
                .as_deref()
                .map(|f| f.contains("misbehave: panic in update")),
            Some(true)
        );
    }

    #[tokio::test]
    async fn a_trap_poisons_only_its_own_store() {
        let plugin = load(guests::MISBEHAVE);
        let a = plugin.provider("a", quick_sandbox(&[]));
        let b = plugin.provider("b", quick_sandbox(&[]));
        must(a.init(r#"{"trap_on_delta":13}"#)).await;
        must(b.init(r#"{"trap_on_delta":13}"#)).await;
        must(a.increase(2)).await;
        must(b.increase(2)).await;
        assert!(matches!(a.increase(13).await, Err(CallError::Trap { .. })));
        // a's instance was replaced: its in-memory group starts empty again; b keeps its state.
        assert_eq!(must(a.update()).await.instances.len(), 0);
        assert_eq!(must(b.update()).await.instances.len(), 2);
    }

    #[tokio::test]
    async fn repeated_faults_open_the_circuit() {
        let logs = LogCapture::default();
        let _guard = logs.install();
        let p = provider("flaky", |s| {
            s.limits.circuit_threshold = 3;
            s.limits.circuit_cooldown = Duration::from_millis(400);
        });
        must(p.init(r#"{"on":{"update":"trap"}}"#)).await;
        for _ in 0..3 {
            assert!(matches!(p.update().await, Err(CallError::Trap { .. })));
        }
        let h = p.health();
        assert!(
            h.circuit_open && h.consecutive_faults == 3 && h.traps == 3,
            "{h:?}"
        );
        let r = p.increase(1).await;
        assert!(
            matches!(r, Err(CallError::CircuitOpen { faults: 3, .. })),
            "{r:?}"
        );
        // Deliberate: waits out the circuit's cool-down, the behaviour under test.
        tokio::time::sleep(Duration::from_millis(450)).await;
        must(p.increase(1)).await;
        assert!(!p.health().circuit_open);
        assert!(
            logs.text().contains("plugin fault"),
            "faults are reported in the log"
        );
    }

    /// A plugin that writes its state in a loop is refused after the per-call budget, and the
    /// next call gets a fresh one: each write is a durable commit to the file the lease
    /// journal shares.
    #[tokio::test]
    async fn state_writes_are_bounded_per_call() {
        let p = provider("flood", |_| {});
        must(p.init(r#"{"on":{"update":"state-flood"}}"#)).await;
        for _ in 0..2 {
            let e = p.update().await;
            assert!(
                matches!(&e, Err(CallError::Provider { error: ProviderError::Transient(m), .. })
                    if m.contains("refused after 64 writes") && m.contains("per call")),
                "{e:?}"
            );
        }
    }

    /// After a trap the next call re-instantiates the plugin and calls `init` again; an `init`
    /// that then blocks is cut at the init deadline, counted as a timeout and fed to the
    /// circuit, so the pool neither wedges nor hides it.
    #[tokio::test]
    async fn a_re_instantiation_that_blocks_is_cut_counted_and_trips_the_circuit() {
        let p = provider("wedge", |s| {
            s.limits.circuit_threshold = 3;
            s.limits.circuit_cooldown = Duration::from_secs(60);
            s.limits
                .deadlines
                .insert(Function::Init, Duration::from_millis(500));
        });
        must(p.init(r#"{"on":{"update":"trap"},"again":{"init":"sleep"}}"#)).await;
        assert!(matches!(p.update().await, Err(CallError::Trap { .. })));
        for round in 0..2 {
            let start = std::time::Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(5), p.update())
                .await
                .unwrap_or_else(|_| panic!("round {round}: the re-instantiation wedged the call"));
            assert!(
                matches!(
                    r,
                    Err(CallError::Timeout {
                        function: Function::Init,
                        ..
                    })
                ),
                "round {round}: {r:?}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{:?}",
                start.elapsed()
            );
        }
        let h = p.health();
        assert_eq!((h.traps, h.timeouts), (1, 2), "{h:?}");
        assert!(h.circuit_open, "{h:?}");
        assert!(matches!(
            p.update().await,
            Err(CallError::CircuitOpen { .. })
        ));
    }

    #[tokio::test]
    async fn a_plugin_that_alternates_success_and_fault_still_trips_the_circuit() {
        let p = provider("alternating", |s| {
            s.limits.circuit_threshold = 3;
            s.limits.circuit_cooldown = Duration::from_secs(60);
        });
        must(p.init(r#"{"on":{"update":"trap"}}"#)).await;
        for round in 0..3 {
            assert!(
                matches!(p.update().await, Err(CallError::Trap { .. })),
                "round {round}"
            );
            if round < 2 {
                must(p.increase(1)).await;
            }
        }
        let h = p.health();
        assert!(h.circuit_open, "3 faults among the last 6 calls: {h:?}");
        assert!(matches!(
            p.increase(1).await,
            Err(CallError::CircuitOpen { .. })
        ));
    }

    #[tokio::test]
    async fn contract_violations_are_not_forwarded() {
        let p = provider("liar", |_| {});
        must(p.init(
            r#"{"on":{"update":"dup-ids","increase":"over-increase","decrease":"foreign-ids"}}"#,
        ))
        .await;
        let r = p.increase(2).await;
        assert!(
            matches!(
                &r,
                Err(CallError::ContractViolation {
                    function: Function::Increase,
                    ..
                })
            ),
            "{r:?}"
        );
        let r = p.update().await;
        assert!(
            matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains("twice")),
            "{r:?}"
        );
        let r = p.decrease(&["m-1".to_string()]).await;
        assert!(
            matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains("never-asked-for")),
            "{r:?}"
        );
        assert_eq!(p.health().contract_violations, 3);
    }

    #[tokio::test]
    async fn oversized_answers_are_contract_violations_not_host_state() {
        let other = bystander().await;
        for (fault, expect) in [("huge-list", "at most 10000"), ("long-id", "at most 256")] {
            let p = provider(fault, |s| {
                s.limits.memory_bytes = 256 << 20;
                s.limits.default_deadline = Duration::from_secs(20);
            });
            must(p.init(&format!(r#"{{"on":{{"update":"{fault}"}}}}"#))).await;
            let r = p.update().await;
            assert!(
                matches!(&r, Err(CallError::ContractViolation { detail, .. }) if detail.contains(expect)),
                "{fault}: {:?}",
                r.as_ref().map(|l| l.instances.len())
            );
        }
        assert_bystander_works(&other).await;
    }

    /// Header sets live in host memory, outside `memory_bytes`: one over `http_fields_bytes` is
    /// refused, and the number held is capped by `resource_entries`, so the host memory a
    /// guest can take this way is bounded (here 500 × 16 KiB) and the fault is contained.
    #[tokio::test(flavor = "current_thread")]
    async fn host_side_http_memory_is_bounded() {
        let logs = LogCapture::default();
        let _guard = logs.install();
        let other = bystander().await;
        let p = provider("fields", |s| {
            s.limits.resource_entries = 500;
            s.limits.default_deadline = Duration::from_secs(20);
        });
        must(p.init(r#"{"on":{"update":"fields-flood"}}"#)).await;
        let r = p.update().await;
        let text = logs.text();
        let most = text
            .lines()
            .filter_map(|l| l.split("header sets held: ").nth(1))
            .filter_map(|n| {
                n.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .max()
            .unwrap_or(0);
        assert!((100..=500).contains(&most), "held {most}: {r:?}");
        // Refused by the table: a trap, and the instance (with everything it held) is discarded.
        assert!(
            matches!(&r, Err(CallError::Trap { message, .. }) if message.contains("resource table has no free keys")),
            "{r:?}"
        );
        assert_eq!(
            must(p.increase(1)).await,
            1,
            "the next call gets a fresh instance"
        );

        let p = provider("fields-big", |_| {});
        must(p.init(r#"{"on":{"update":"fields-oversized"}}"#)).await;
        let r = p.update().await;
        assert!(
            matches!(&r, Err(CallError::Trap { message, .. }) if message.contains("fields exceeds limit")),
            "{r:?}"
        );
        assert_bystander_works(&other).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn guest_text_is_capped_and_cannot_forge_host_log_lines() {
        let logs = LogCapture::default();
        let _guard = logs.install();
        let p = provider("forger", |_| {});
        must(p.init(r#"{"on":{"update":"log-forge"}}"#)).await;
        must(p.update()).await;
        let p = provider("shouter", |_| {});
        must(p.init(r#"{"on":{"update":"long-error"}}"#)).await;
        let r = p.update().await;
        let Err(CallError::Provider {
            error: ProviderError::Transient(message),
            ..
        }) = &r
        else {
            panic!("{r:?}")
        };
        assert!(message.len() < 4_096, "{} bytes kept", message.len());
        assert!(!message.contains('\n'), "control characters are escaped");
        let text = logs.text();
        assert!(
            text.contains("forged: pool stopped"),
            "the line is logged, escaped"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("2026-01-01T00:00:00Z")),
            "a guest forged a host log line:\n{text}"
        );
    }
}

mod escape {
    //! One behaviour per test: the escape guest tries everything in `init` and reports each
    //! attempt through the test probe; each test checks one of them.
    use super::*;
    use flotilla_harness::ProbeLog;
    use serde_json::json;

    /// What one run of the escape guest left: its reports, the host log, and whether anything
    /// connected to the loopback listener it was pointed at.
    struct Escaped {
        probe: ProbeLog,
        logs: String,
        connected: bool,
    }

    async fn escape(file: &std::path::Path) -> Escaped {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let port = listener.local_addr().expect("listener address").port();
        let capture = LogCapture::default();
        let _guard = capture.install();
        let probe = ProbeLog::default();
        let mut sandbox = quick_sandbox(&[]);
        sandbox.limits.output_bytes = 10_000;
        sandbox.limits.log_lines_per_call = 5;
        sandbox.probe = Some(probe.probe());
        let p = load(guests::ESCAPE).provider("escape", sandbox);
        let settings = json!({
            "tcp": format!("127.0.0.1:{port}"),
            "print_bytes": 1_000_000,
            "log_lines": 100,
            "write_to": file.display().to_string(),
        });
        must(p.init(&settings.to_string())).await;
        Escaped {
            probe,
            logs: capture.text(),
            connected: listener.accept().is_ok(),
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("flotilla-escape-{name}-{}", std::process::id()))
    }

    async fn refused(key: &str) {
        let run = escape(&scratch(key)).await;
        let outcome = run.probe.json(key);
        assert!(outcome.get("err").is_some(), "{key} succeeded: {outcome}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_cannot_list_the_root_directory() {
        refused("read_dir_root").await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_has_no_working_directory() {
        refused("read_dir_dot").await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_cannot_read_host_files() {
        refused("read_passwd").await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_cannot_write_files() {
        let file = scratch("write");
        let _ = std::fs::remove_file(&file); // absent before is what the test needs
        let run = escape(&file).await;
        assert!(run.probe.json("write_file").get("err").is_some());
        assert!(!file.exists(), "the guest wrote {}", file.display());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_sees_none_of_the_host_environment() {
        assert!(
            std::env::var_os("PATH").is_some(),
            "the test needs a host environment to leak"
        );
        let run = escape(&scratch("env")).await;
        assert_eq!(run.probe.json("env"), json!([]));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_gets_no_arguments() {
        let run = escape(&scratch("args")).await;
        assert_eq!(run.probe.json("args"), json!([]));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_reads_an_empty_stdin() {
        let run = escape(&scratch("stdin")).await;
        assert_eq!(run.probe.json("stdin")["ok"], "(0, \"\")");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_cannot_open_a_tcp_connection() {
        let run = escape(&scratch("tcp")).await;
        assert!(run.probe.json("tcp_connect").get("err").is_some());
        assert!(!run.connected, "the guest reached the loopback listener");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_guest_cannot_resolve_names() {
        refused("dns").await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn guest_stdout_is_logged_up_to_its_cap() {
        let run = escape(&scratch("stdout")).await;
        let printed = run
            .logs
            .lines()
            .filter(|l| l.contains("stream=\"stdout\""))
            .map(str::len)
            .sum::<usize>();
        assert!(printed > 0, "stdout is logged");
        assert!(
            run.logs.contains("output cap reached"),
            "the cap is reported"
        );
        assert!(
            printed < 10_000 + 4_096 * 4,
            "stdout was not capped: {printed} bytes logged"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn guest_stderr_is_logged() {
        let run = escape(&scratch("stderr")).await;
        assert!(
            run.logs.contains("escape guest: stderr line"),
            "{}",
            run.logs
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn guest_log_lines_are_capped_per_call() {
        let run = escape(&scratch("log")).await;
        let logged = run
            .logs
            .lines()
            .filter(|l| l.contains("escape log line"))
            .count();
        assert_eq!(logged, 5, "log lines are capped per call");
        assert!(
            run.logs.contains("plugin log cap reached"),
            "the log cap is reported"
        );
    }
}

mod load_checks {
    use super::*;
    use flotilla_plugin_runtime::LoadError;
    use std::path::Path;

    fn write(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("flotilla-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
        path
    }

    fn wat(text: &str) -> Vec<u8> {
        wat::parse_str(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn load_err(path: &Path) -> LoadError {
        match common::runtime().load_file(path) {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(e) => e,
        }
    }

    #[test]
    fn bad_files_get_clear_errors() {
        let missing = load_err(Path::new("/nonexistent/plugin.wasm"));
        assert!(
            matches!(missing, LoadError::Unreadable { .. })
                && missing.to_string().contains("/nonexistent/plugin.wasm")
        );
        let empty = load_err(&write("empty.wasm", b""));
        assert!(empty.to_string().contains("empty"), "{empty}");
        let text = load_err(&write("text.wasm", b"#!/bin/sh\necho hi\n"));
        assert!(
            text.to_string().contains("not a WebAssembly binary"),
            "{text}"
        );
        let core = load_err(&write("core.wasm", &wat("(module (func (export \"f\")))")));
        assert!(
            matches!(core, LoadError::CoreModule { .. })
                && core.to_string().contains("core WebAssembly module"),
            "{core}"
        );
        let garbage = load_err(&write("garbage.wasm", b"\0asm\x0d\0\x01\0garbage"));
        assert!(matches!(garbage, LoadError::Invalid { .. }), "{garbage}");
    }

    #[test]
    fn foreign_imports_are_named() {
        let e = load_err(&write(
            "kv.wasm",
            &wat(r#"(component (import "wasi:keyvalue/store@0.2.0" (instance)))"#),
        ));
        assert!(
            matches!(e, LoadError::ForbiddenImport { ref import, .. } if import == "wasi:keyvalue/store@0.2.0"),
            "{e}"
        );
        assert!(e.to_string().contains("`wasi:keyvalue/store@0.2.0`"), "{e}");
        let e = load_err(&write(
            "inc.wasm",
            &wat(r#"(component (import "wasi:http/incoming-handler@0.2.12" (instance)))"#),
        ));
        assert!(e.to_string().contains("wasi:http/incoming-handler"), "{e}");
        let e = load_err(&write(
            "func.wasm",
            &wat(r#"(component (import "exec" (func)))"#),
        ));
        assert!(e.to_string().contains("`exec`"), "{e}");
    }

    #[test]
    fn wrong_world_or_version_is_rejected() {
        let e = load_err(&write("none.wasm", &wat("(component)")));
        assert!(
            matches!(e, LoadError::MissingExport { .. })
                && e.to_string().contains("exports nothing"),
            "{e}"
        );
        let v2 = wat(
            r#"(component (instance $i) (export "flotilla:provider/instance-group@0.2.0" (instance $i)))"#,
        );
        let e = load_err(&write("v2.wasm", &v2));
        assert!(e.to_string().contains("instance-group@0.2.0"), "{e}");
        let log2 = wat(r#"(component (import "flotilla:provider/log@0.2.0" (instance)))"#);
        let e = load_err(&write("log2.wasm", &log2));
        assert!(e.to_string().contains("0.1.4"), "{e}");
        let hollow = wat(
            r#"(component (instance $i) (export "flotilla:provider/instance-group@0.1.0" (instance $i)))"#,
        );
        let e = load_err(&write("hollow.wasm", &hollow));
        assert!(matches!(e, LoadError::ContractMismatch { .. }), "{e}");
    }

    /// A load from the cache skips reading and hashing a file whose identity (device, inode,
    /// size, mtime, ctime) is unchanged; any change to the file is hashed again, so the
    /// digest always names the bytes on disk.
    #[test]
    fn the_digest_follows_the_file_even_when_hashing_is_skipped() {
        use flotilla_plugin_runtime::{CacheOutcome, PluginRuntime, RuntimeOptions};
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let rt = PluginRuntime::new(RuntimeOptions {
            cache_dir: Some(dir.path().join("cache")),
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("plugin.wasm");
        let digest =
            |p: &str| flotilla_net::sha256_hex(&std::fs::read(p).unwrap_or_else(|e| panic!("{e}")));
        std::fs::copy(guests::STATIC_PLUGIN, &path).unwrap_or_else(|e| panic!("{e}"));
        let load = || rt.load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let first = load();
        assert_eq!(first.sha256, digest(guests::STATIC_PLUGIN));
        let again = load();
        assert_eq!(
            (again.sha256.as_str(), again.cache),
            (first.sha256.as_str(), CacheOutcome::Hit)
        );
        assert_eq!(again.size, first.size);
        // Replaced in place by another plugin: read and hashed again.
        std::fs::copy(guests::TEMPLATE_PLUGIN, &path).unwrap_or_else(|e| panic!("{e}"));
        let replaced = load();
        assert_eq!(replaced.sha256, digest(guests::TEMPLATE_PLUGIN));
        assert_ne!(replaced.sha256, first.sha256);
        // Back to the first bytes: the digest follows again (and its compiled code is reused).
        std::fs::copy(guests::STATIC_PLUGIN, &path).unwrap_or_else(|e| panic!("{e}"));
        let back = load();
        assert_eq!(
            (back.sha256.as_str(), back.cache),
            (first.sha256.as_str(), CacheOutcome::Hit)
        );
        // A record that names another digest for the file's current identity is believed only
        // while that identity holds: touching the file (new ctime) makes it hash again.
        let records = dir.path().join("cache").join("by-path");
        for r in std::fs::read_dir(&records)
            .unwrap_or_else(|e| panic!("{e}"))
            .flatten()
        {
            let text = std::fs::read_to_string(r.path()).unwrap_or_else(|e| panic!("{e}"));
            let (identity, _) = text.split_once('\n').unwrap_or_else(|| panic!("{text}"));
            std::fs::write(r.path(), format!("{identity}\n{}", replaced.sha256))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{e}"));
        f.set_modified(std::time::SystemTime::now())
            .unwrap_or_else(|e| panic!("{e}"));
        drop(f);
        assert_eq!(load().sha256, first.sha256);
    }

    #[test]
    fn compile_cache_skips_the_second_compile() {
        use flotilla_plugin_runtime::{CacheOutcome, PluginRuntime, RuntimeOptions};
        let dir = std::env::temp_dir().join(format!("flotilla-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let open = || {
            PluginRuntime::new(RuntimeOptions {
                cache_dir: Some(dir.clone()),
            })
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let first = open()
            .load_file(Path::new(guests::STATIC_PLUGIN))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(first.cache, CacheOutcome::Compiled { .. }),
            "{:?}",
            first.cache
        );
        let second = open()
            .load_file(Path::new(guests::STATIC_PLUGIN))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(second.cache, CacheOutcome::Hit);
        // A corrupt entry is discarded and recompiled, never trusted. (Replace, never truncate,
        // a file that may be memory-mapped: that is how the cache itself writes.)
        drop((first, second));
        for entry in std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{e}"))
            .flatten()
            .filter(|e| e.path().is_file())
        {
            let tmp = entry.path().with_extension("tmp");
            std::fs::write(&tmp, b"corrupt").unwrap_or_else(|e| panic!("{e}"));
            std::fs::rename(&tmp, entry.path()).unwrap_or_else(|e| panic!("{e}"));
        }
        let third = open()
            .load_file(Path::new(guests::STATIC_PLUGIN))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(third.cache, CacheOutcome::Compiled { .. }),
            "{:?}",
            third.cache
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A plugin built against the frozen 0.1.0 contract loads and runs unchanged on this 0.1.4 host.
mod contract_0_1_0 {
    use super::*;

    #[tokio::test]
    async fn a_plugin_built_against_0_1_0_loads_and_runs_unchanged() {
        let plugin = load(guests::CONTRACT_0_1_0);
        let names: Vec<&str> = plugin
            .shape
            .imports
            .iter()
            .map(|i| i.name.as_str())
            .collect();
        assert!(names.contains(&"flotilla:provider/log@0.1.0"), "{names:?}");
        assert!(
            !names.iter().any(|n| n.contains("instance-access")),
            "{names:?}"
        );
        assert_eq!(
            plugin.shape.instance_group,
            "flotilla:provider/instance-group@0.1.0"
        );
        let logs = LogCapture::default();
        let p = {
            let _guard = logs.install();
            let p = plugin.provider("legacy", Sandbox::default());
            let info = must(p.init("{}")).await;
            assert_eq!(info.id, "legacy/0.1.0");
            p
        };
        assert!(
            logs.text().contains("built against 0.1.0"),
            "{}",
            logs.text()
        );
        let instances = must(p.update()).await.instances;
        assert_eq!(instances.len(), 1);
        assert_eq!(instances[0].state, InstanceState::Running);
        // Its `connection` is the older record (no zone): it is called through the 0.1.3
        // bindings and lifted.
        let c = must(p.connect_info("legacy-1")).await;
        assert_eq!(c.protocol, Protocol::Ssh);
        assert_eq!(c.zone, None);
    }
}

/// A guest whose start-up blocks on a host pollable: instantiation is bounded by the init
/// deadline, the fault is reported, and a bystander keeps working.
mod stall_start {
    use super::*;

    #[tokio::test]
    async fn a_start_up_that_waits_on_the_host_is_cut_at_the_init_deadline() {
        let other = bystander().await;
        let p = load(guests::STALL_START).provider("stall", quick_sandbox(&[]));
        let start = Instant::now();
        let r = p.init("{}").await;
        assert!(
            matches!(
                r,
                Err(CallError::Timeout {
                    function: Function::Init,
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(p.health().timeouts, 1);
        assert_bystander_works(&other).await;
    }
}

/// The conformance kit (`flotilla plugin test`) against a plugin with one deliberate flaw per
/// run: each flaw fails exactly its rule, and the flawless run passes.
mod nonconforming {
    use super::guests;

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

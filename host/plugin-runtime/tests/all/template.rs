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
        kind: flotilla_credentials::CredentialKind::Gcp(flotilla_credentials::gcp::GcpHandle::new(
            flotilla_credentials::gcp::GcpConfig {
                metadata_endpoint: Some(format!("http://{idp}")),
                ..Default::default()
            },
        )),
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

#[tokio::test]
async fn every_export_over_http() {
    let cloud = example_cloud(3).await;
    let mut sandbox = reaching(&cloud);
    sandbox.egress.credentials = vec![flotilla_credentials::Credential {
        name: "example".into(),
        kind: flotilla_credentials::CredentialKind::Bearer {
            token: flotilla_credentials::SecretSource::Value(flotilla_credentials::Secret::new(
                "tkn-123",
            )),
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

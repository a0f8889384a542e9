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
        .init(
            r#"{"hosts":[{"address":""},{"address":"x","os":"plan9"},{"address":"x"}],"colour":1}"#,
        )
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

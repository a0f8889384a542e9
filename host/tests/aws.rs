//! The AWS plugin through the real host against moto with SigV4 checking on
//! (`INITIAL_NO_AUTH_ACTION_COUNT=0`). The plugin never holds a key: the host signs.
//! Needs the venv that `scripts/test.sh` creates (`moto[server]` and boto3).

mod common;

use std::time::{Duration, Instant};

use common::LogCapture;
use common::moto::{Moto, python};
use flotilla::provider::{CallError, InstanceState, Provider, ProviderError};

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

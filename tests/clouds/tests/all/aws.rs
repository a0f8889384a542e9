//! The AWS plugin through the real host against moto with SigV4 checking on
//! (`INITIAL_NO_AUTH_ACTION_COUNT=0`). The plugin never holds a key: the host signs.
//! Needs the venv that `scripts/test.sh` creates (`moto[server]` and boto3).

use flotilla_harness as common;
use flotilla_harness::clouds::AwsPlugin;
use flotilla_harness::pool::{Counting, spawn_pool};
use flotilla_harness::{must, poll, provider_error};

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::LogCapture;
use flotilla_peers::moto::Moto;
use flotilla_provider::{CallError, InstanceState, Provider, ProviderError};

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
    let instances = poll::until("5 running instances", Duration::from_secs(20), || async {
        let list = must(p.update()).await.instances;
        if list
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .count()
            == 5
        {
            Ok(list)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await;
    let c = must(p.connect_info(&instances[0].id)).await;
    assert!(
        c.internal_address
            .as_deref()
            .is_some_and(|a| a.starts_with("10.20.1.")),
        "{c:?}"
    );
    // The instance's `placement.availabilityZone` (contract 0.1.4).
    assert!(
        c.zone
            .as_deref()
            .is_some_and(|z| z.len() == "us-east-1a".len() && z.starts_with("us-east-1")),
        "{c:?}"
    );

    let ids: Vec<String> = instances[..2].iter().map(|i| i.id.clone()).collect();
    assert_eq!(must(p.decrease(&ids)).await, ids);
    let live = must(p.update()).await.instances;
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
    moto.set_policy(
        "plugin",
        &[
            "autoscaling:DescribeAutoScalingGroups",
            "autoscaling:TerminateInstanceInAutoScalingGroup",
            "ec2:DescribeInstances",
        ],
    );
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

/// A request the host refuses says why (the refusal), not how its body stream closed on the
/// way: every AWS call is a POST with a body, and the plugins' HTTP client reads a request's
/// answer before it reports a failed write.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_post_says_why() {
    let moto = Moto::start();
    let first = moto.provider(None);
    must(first.init(&moto.settings())).await;
    // As many requests a minute as `init` makes: the first one after it is refused unsent.
    let init_requests = first.egress_stats().allowed.load(Relaxed);
    let mut sandbox = moto.plugin_sandbox();
    sandbox.limits.requests_per_minute = u32::try_from(init_requests).unwrap();
    let p = common::load(flotilla_test_artifacts::AWS_PLUGIN).provider("aws", sandbox);
    must(p.init(&moto.settings())).await;
    let r = p.update().await;
    let Err(CallError::Provider {
        error: ProviderError::Transient(msg),
        ..
    }) = &r
    else {
        panic!("expected a refused request, got {r:?}");
    };
    assert!(msg.contains("HttpRequestDenied"), "{msg}");
    assert_eq!(p.egress_stats().denied.load(Relaxed), 1);
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

/// Settings for the moto group with EC2 Instance Connect on.
fn instance_connect_settings(moto: &Moto) -> String {
    format!(
        r#"{{"name":"ci-runners","region":"us-east-1","endpoint":"{}","credential":"aws","username":"ubuntu","instance_connect":true}}"#,
        moto.endpoint
    )
}

/// The pool's public key reaches the plugin through `instance-access`, and the plugin pushes it
/// with EC2 Instance Connect before each connection, signed by the host for the
/// `ec2-instance-connect` service. moto records what it received.
#[tokio::test(flavor = "current_thread")]
async fn instance_connect_pushes_the_pools_public_key_before_each_connection() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let moto = Moto::start();
    let keys = tempfile::tempdir().expect("key dir");
    let key = flotilla_connector::PoolKey::load_or_generate(keys.path(), "aws").expect("key");
    let public = key.public_openssh().to_string();
    let p = moto.provider_with_ssh_key(&public);
    let info = match p.init(&instance_connect_settings(&moto)).await {
        Ok(i) => i,
        Err(e) => panic!("{e}\n{}", logs.text()),
    };
    assert!(info.expiring_connect_info);
    assert_eq!(must(p.increase(1)).await, 1);
    let id = poll::until("a running instance", Duration::from_secs(20), || async {
        let list = must(p.update()).await.instances;
        match list.iter().find(|i| i.state == InstanceState::Running) {
            Some(i) => Ok(i.id.clone()),
            None => Err(format!("{list:?}")),
        }
    })
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let c = match p.connect_info(&id).await {
        Ok(c) => c,
        Err(e) => panic!("{e}\n{}", logs.text()),
    };
    assert_eq!(c.username, "ubuntu");
    let expires = c.expires.expect("pushed keys expire");
    assert!(
        (now + 40..=now + 60).contains(&expires),
        "{expires} vs {now}"
    );
    must(p.connect_info(&id)).await;

    let pushes: Vec<serde_json::Value> = moto
        .requests()
        .into_iter()
        .filter(|r| r["headers"]["X-Amz-Target"] == "AWSEC2InstanceConnectService.SendSSHPublicKey")
        .collect();
    assert_eq!(pushes.len(), 2, "one push per connect-info");
    let push = &pushes[0];
    let auth = push["headers"]["Authorization"]
        .as_str()
        .unwrap_or_default();
    assert!(
        auth.contains("/us-east-1/ec2-instance-connect/aws4_request"),
        "{auth}"
    );
    use base64::Engine as _;
    let body = if push["body_encoded"] == true {
        base64::engine::general_purpose::STANDARD
            .decode(push["body"].as_str().unwrap_or_default())
            .expect("base64")
    } else {
        push["body"]
            .as_str()
            .unwrap_or_default()
            .as_bytes()
            .to_vec()
    };
    let body: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
    assert_eq!(body["InstanceId"], id.as_str());
    assert_eq!(body["InstanceOSUser"], "ubuntu");
    assert_eq!(body["SSHPublicKey"], public.as_str());
    assert!(
        body["AvailabilityZone"]
            .as_str()
            .is_some_and(|z| z.starts_with("us-east-1"))
    );
    let (_, secret) = moto.key("plugin");
    assert!(!logs.text().contains(&secret));

    // A terminated instance is gone, not "not ready yet": no key is pushed to it, and the
    // host is told it does not exist.
    moto.terminate(&id);
    let e = provider_error(p.connect_info(&id).await);
    assert!(
        matches!(&e, ProviderError::NotFound(m) if m.contains("terminated")),
        "{e:?}"
    );
    let pushes_after = moto
        .requests()
        .into_iter()
        .filter(|r| r["headers"]["X-Amz-Target"] == "AWSEC2InstanceConnectService.SendSSHPublicKey")
        .count();
    assert_eq!(pushes_after, 2, "no push to a terminated instance");
}

#[tokio::test(flavor = "current_thread")]
async fn instance_connect_without_a_connector_key_is_a_config_error() {
    let moto = Moto::start();
    let p = moto.provider(None);
    let r = p.init(&instance_connect_settings(&moto)).await;
    let Err(CallError::Provider {
        error: ProviderError::InvalidConfig(msg),
        ..
    }) = &r
    else {
        panic!("{r:?}")
    };
    assert!(
        msg.contains("instance_connect") && msg.contains("[pool.connector]"),
        "{msg}"
    );
}

/// The action missing from the IAM policy is named, and classified as unauthorized.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_instance_connect_push_is_unauthorized_and_named() {
    let moto = Moto::start();
    let p = moto.provider_with_ssh_key(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test",
    );
    must(p.init(&instance_connect_settings(&moto))).await;
    assert_eq!(must(p.increase(1)).await, 1);
    let id = must(p.update())
        .await
        .instances
        .first()
        .map(|i| i.id.clone())
        .expect("an instance");
    moto.set_policy(
        "plugin",
        &[
            "autoscaling:DescribeAutoScalingGroups",
            "ec2:DescribeInstances",
        ],
    );
    let r = p.connect_info(&id).await;
    let Err(CallError::Provider {
        error: ProviderError::Unauthorized(msg),
        ..
    }) = &r
    else {
        panic!("{r:?}")
    };
    assert!(msg.contains("SendSSHPublicKey"), "{msg}");
}

/// One denied action (`SetDesiredCapacity`) stops only scale-up; `update` goes on; once the
/// policy is re-attached the pool scales up and is ready again, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_action_stops_only_itself_and_the_pool_heals_when_it_is_allowed_again() {
    use flotilla_scaler::ScalerConfig;
    let moto = Moto::start();
    let provider = Arc::new(Counting::new(moto.provider(None)));
    let info = must(provider.init(&moto.settings())).await;
    moto.set_policy(
        "plugin",
        &[
            "autoscaling:DescribeAutoScalingGroups",
            "autoscaling:TerminateInstanceInAutoScalingGroup",
            "ec2:DescribeInstances",
        ],
    );
    let config = ScalerConfig {
        update_interval_ms: 500,
        paused_retry_interval_ms: 1_000,
        max_instances: 4,
        ..ScalerConfig::default()
    };
    let pool = spawn_pool("aws", provider.clone(), &info, config, 2, 3_600_000);
    poll::until_true(
        "scale-up to be paused",
        Duration::from_secs(20),
        || pool.snapshot().paused.contains_key("increase"),
        || format!("{:?}", pool.snapshot()),
    )
    .await;
    let snap = pool.snapshot();
    assert!(
        snap.paused["increase"]
            .reason
            .contains("SetDesiredCapacity"),
        "{snap:?}"
    );
    let before = provider.updates.load(Relaxed);
    poll::until_true(
        "update to go on while scale-up is paused",
        Duration::from_secs(6),
        || provider.updates.load(Relaxed) >= before + 2,
        || format!("{before} -> {}", provider.updates.load(Relaxed)),
    )
    .await;
    assert_eq!(moto.desired(), 0);
    // The operator re-attaches the policy: the next retry scales up.
    moto.set_policy(
        "plugin",
        &[
            "autoscaling:DescribeAutoScalingGroups",
            "autoscaling:SetDesiredCapacity",
            "autoscaling:TerminateInstanceInAutoScalingGroup",
            "ec2:DescribeInstances",
        ],
    );
    poll::until_true(
        "the pool to scale up again",
        Duration::from_secs(20),
        || moto.desired() >= 1 && pool.snapshot().paused.is_empty(),
        || format!("{:?}", pool.snapshot()),
    )
    .await;
    pool.shutdown(Duration::from_secs(1), false).await;
}

/// `increase` reports what the group will really launch: MaxSize lowered by hand below what
/// exists grants nothing, and a desired count lowered by hand below the instances that exist
/// does not make instances that are already there count as new.
#[tokio::test(flavor = "current_thread")]
async fn increase_reports_only_what_the_group_will_really_launch() {
    let moto = Moto::start();
    let p = moto.provider(None);
    must(p.init(&moto.settings())).await;
    assert_eq!(must(p.increase(3)).await, 3);
    poll::until("3 instances", Duration::from_secs(20), || async {
        let n = must(p.update()).await.instances.len();
        if n >= 3 {
            Ok(())
        } else {
            Err(format!("{n} instances"))
        }
    })
    .await;
    // MaxSize lowered to what exists: nothing more can come.
    moto.resize(3, 3);
    assert_eq!(must(p.increase(2)).await, 0, "MaxSize 3 with 3 instances");
    // MaxSize back up: only the room above the 3 existing instances is granted.
    moto.resize(4, 3);
    assert_eq!(must(p.increase(5)).await, 1);
    assert_eq!(moto.desired(), 4);
}

/// Polls `done` for up to `within`, then fails with `what` and the pool's view.
async fn until(
    within: Duration,
    what: &str,
    pool: &flotilla_scaler::PoolHandle,
    done: impl FnMut() -> bool,
) {
    poll::until_true(what, within, done, || format!("{:?}", pool.snapshot())).await
}

/// The pool's instances, sorted.
fn seen(pool: &flotilla_scaler::PoolHandle) -> Vec<String> {
    let mut ids: Vec<String> =
        pool.with_core(|c| c.instances().into_iter().map(|i| i.id).collect());
    ids.sort();
    ids
}

/// The cloud changes under a running pool: MaxSize to 0 and back, then the group deleted and
/// created again. The pool learns each MaxSize within two updates, asks nothing of a full
/// group, deletes no real instance, backs off from a group that is gone instead of hammering
/// the API, and follows the cloud back without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_follows_the_group_through_max_0_and_a_recreated_group() {
    use flotilla_scaler::{PoolHandle, ScalerConfig};
    let moto = Moto::start_with_max(4);
    let provider = Arc::new(Counting::new(moto.provider(None)));
    let info = must(provider.init(&moto.settings())).await;
    let interval = Duration::from_millis(500);
    let config = ScalerConfig {
        update_interval_ms: 500,
        instance_acquire_timeout_ms: 5_000,
        max_instances: 4,
        ..ScalerConfig::default()
    };
    // Two idle instances; an idle one beyond them goes after a second.
    let pool = spawn_pool("aws", provider.clone(), &info, config, 2, 1_000);
    let ready = |pool: &PoolHandle, n: u32| {
        let snap = pool.snapshot();
        snap.instances.get("ready").copied().unwrap_or(0) == n && snap.pending == 0
    };
    until(Duration::from_secs(20), "two idle instances", &pool, || {
        ready(&pool, 2) && moto.live().len() == 2
    })
    .await;

    // Two jobs take both instances. Then MaxSize 0: the leased instances stay (scale-in
    // protected, and the pool never deletes a busy one), nothing more can come. The plugin
    // reports the new maximum from `update` (contract 0.1.2), so the pool knows it within two
    // update intervals and stops asking for the idle instances its policy wants.
    let mut leases = Vec::new();
    let mut busy = Vec::new();
    for _ in 0..2 {
        let id = pool.reserve().expect("reserve");
        busy.push(pool.acquire(id).await.expect("acquire").instance);
        leases.push(id);
    }
    busy.sort();
    moto.resize(0, 0);
    until(4 * interval, "MaxSize 0 to reach the pool", &pool, || {
        pool.snapshot().max_instances == 0
    })
    .await;
    // The policy now wants two more idle instances that the group will not launch.
    // Deliberate: two updates settle before the quiet window below is counted from.
    tokio::time::sleep(2 * interval).await;
    let (inc, dec) = (
        provider.increases.load(Relaxed),
        provider.decreases.load(Relaxed),
    );
    // Deliberate: nothing may be asked or deleted within this window.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let snap = pool.snapshot();
    assert_eq!(snap.pending, 0, "a phantom outlived two updates: {snap:?}");
    let refused = provider.increases.load(Relaxed) - inc;
    assert_eq!(refused, 0, "scale-ups of a group at its maximum");
    assert_eq!(provider.decreases.load(Relaxed), dec, "{snap:?}");
    assert_eq!(moto.live(), busy, "the leased instances stay");
    assert_eq!(seen(&pool), busy);

    // MaxSize back to 4: the two idle instances come at once, with no restart.
    moto.resize(4, 2);
    until(
        Duration::from_secs(5),
        "MaxSize 4 to be used",
        &pool,
        || ready(&pool, 4) && moto.live().len() == 4,
    )
    .await;
    for id in leases {
        pool.release(id).expect("release");
    }
    until(
        Duration::from_secs(20),
        "scale-down to two idle",
        &pool,
        || moto.live().len() == 2 && seen(&pool) == moto.live(),
    )
    .await;

    // The group is deleted: updates fail as not-found and back off.
    moto.delete_group();
    // Deliberate: two updates meet the missing group before the window below is counted from.
    tokio::time::sleep(2 * interval).await;
    let updates = provider.updates.load(Relaxed);
    // Deliberate: the window in which the backed-off updates are counted.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = provider.updates.load(Relaxed) - updates;
    let snap = pool.snapshot();
    assert!(
        during <= 5,
        "{during} updates in 6 s of a group that does not exist (every 500 ms would be 12)"
    );
    assert!(
        snap.last_error
            .as_deref()
            .is_some_and(|e| e.contains("does not exist")),
        "{snap:?}"
    );

    // Created again, empty: the pool forgets the old instances and fills the new group.
    let old = seen(&pool);
    moto.create_group(4);
    until(
        Duration::from_secs(25),
        "the new group to be filled",
        &pool,
        || {
            let now = moto.live();
            now.len() == 2 && seen(&pool) == now && ready(&pool, 2)
        },
    )
    .await;
    assert!(
        seen(&pool).iter().all(|id| !old.contains(id)),
        "{old:?} {:?}",
        seen(&pool)
    );
    pool.shutdown(Duration::from_secs(1), false).await;
}

/// Instances of a warm pool, and instances leaving it for service, are never failed: the
/// warm pool's own (`Warmed:*`, stopped, hibernated or running there) serve nothing and are
/// not listed or counted toward the group's size; one leaving it passes through `Pending:Wait`
/// like a new launch and is coming. moto serves no warm pool, so a proxy in front of it adds
/// the documented states to its DescribeAutoScalingGroups answers.
/// <https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pool-instance-lifecycle.html>
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_pool_instances_are_not_failed_nor_counted() {
    use flotilla_peers::proxy::LosingProxy;

    let moto = Moto::start();
    let proxy = LosingProxy::start(&moto.endpoint).await;
    let warm = [
        ("i-0a000000000000001", "Warmed:Stopped"),
        ("i-0a000000000000002", "Warmed:Pending:Wait"),
        ("i-0a000000000000003", "Warmed:Running"),
        ("i-0a000000000000004", "Warmed:Hibernated"),
        ("i-0a000000000000005", "Warmed:Terminating:Wait"),
        ("i-0a000000000000006", "Pending:Wait"),
    ];
    proxy.rewrite(move |request, answer| {
        if !String::from_utf8_lossy(request).contains("Action=DescribeAutoScalingGroups") {
            return answer;
        }
        let members: String = warm
            .iter()
            .map(|(id, state)| {
                format!(
                    "<member><HealthStatus>Healthy</HealthStatus><AvailabilityZone>us-east-1a</AvailabilityZone><InstanceId>{id}</InstanceId><InstanceType>t3.micro</InstanceType><LifecycleState>{state}</LifecycleState><ProtectedFromScaleIn>true</ProtectedFromScaleIn></member>"
                )
            })
            .collect();
        let text = String::from_utf8_lossy(&answer).replacen(
            "</Instances>",
            &format!("{members}</Instances>"),
            1,
        );
        text.into_bytes().into()
    });
    let mut sandbox = moto.plugin_sandbox();
    sandbox.egress.allow = flotilla_net::AllowList::parse(&[proxy.endpoint.as_str()]).unwrap();
    for c in &mut sandbox.egress.credentials {
        c.hosts = flotilla_net::AllowList::parse(&[proxy.endpoint.as_str()]).unwrap();
    }
    let p = common::load(flotilla_test_artifacts::AWS_PLUGIN).provider("aws", sandbox);
    must(p.init(&moto.settings().replace(&moto.endpoint, &proxy.endpoint))).await;
    assert_eq!(must(p.increase(1)).await, 1);
    poll::until("moto's instance", Duration::from_secs(20), || async {
        match moto.live().len() {
            1 => Ok(()),
            n => Err(format!("{n} instances")),
        }
    })
    .await;

    let listed = must(p.update()).await.instances;
    let failed: Vec<_> = listed
        .iter()
        .filter(|i| matches!(i.state, InstanceState::Failed(_)))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        listed.len(),
        2,
        "moto's and the one leaving the warm pool: {listed:?}"
    );
    let leaving = listed.iter().find(|i| i.id == "i-0a000000000000006");
    assert!(
        leaving.is_some_and(|i| matches!(i.state, InstanceState::Creating)),
        "{listed:?}"
    );
    // The warm pool does not count toward the desired size: one more on top of the two.
    assert_eq!(must(p.increase(1)).await, 1);
    assert_eq!(moto.desired(), 3);
}

/// An instance Auto Scaling marks Unhealthy (as it does when EC2 interrupts a Spot Instance)
/// is failed at the next update, with a cause that names a Spot interruption, so the host
/// takes it out of service and its job fails as a system failure.
#[tokio::test(flavor = "current_thread")]
async fn an_instance_auto_scaling_marks_unhealthy_is_failed_as_interrupted() {
    let moto = Moto::start();
    let p = moto.provider(None);
    must(p.init(&moto.settings())).await;
    assert_eq!(must(p.increase(1)).await, 1);
    let id = poll::until("a running instance", Duration::from_secs(20), || async {
        let list = must(p.update()).await.instances;
        match list.iter().find(|i| i.state == InstanceState::Running) {
            Some(i) => Ok(i.id.clone()),
            None => Err(format!("{list:?}")),
        }
    })
    .await;
    moto.unhealthy(&id);
    let list = must(p.update()).await.instances;
    let state = list.iter().find(|i| i.id == id).map(|i| i.state.clone());
    assert!(
        matches!(&state, Some(InstanceState::Failed(why)) if why.contains("Unhealthy") && why.contains("Spot")),
        "{list:?}"
    );
}

/// From demand to a lease on moto: an empty pool whose `update_interval` is a minute, one job.
/// The reservation asks for an instance at once, and moto's group reports the instance it
/// launches at once, so the update the pool makes right after the increase finds it (had it
/// not, the 2 s `update_interval_when_expecting` poll would, which the scaler's
/// `a_machine_is_leased_within_seconds_of_running` proves): leased within seconds, never at
/// the next minute's update. The time is printed (`--nocapture`) and in
/// `docs/scaling-out.md`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_is_leased_within_seconds_of_moto_reporting_it() {
    use flotilla_scaler::ScalerConfig;
    let moto = Moto::start();
    let provider = Arc::new(Counting::new(moto.provider(None)));
    let info = must(provider.init(&moto.settings())).await;
    let config = ScalerConfig {
        update_interval_ms: 60_000,
        instance_acquire_timeout_ms: 60_000,
        max_instances: 2,
        ..ScalerConfig::default()
    };
    let pool = spawn_pool("aws", provider.clone(), &info, config, 0, 60_000);
    // The first update (at once) finds an empty group; the next regular one is a minute away.
    poll::until_true(
        "the first update",
        Duration::from_secs(20),
        || provider.updates.load(Relaxed) >= 1,
        || format!("{:?}", pool.snapshot()),
    )
    .await;
    let start = std::time::Instant::now();
    let id = pool.reserve().expect("reserve");
    let bound = tokio::time::timeout(Duration::from_secs(20), pool.acquire(id))
        .await
        .expect("leased within 20 s, not at the next minute's update")
        .expect("acquired");
    let took = start.elapsed();
    println!(
        "moto: reserve to lease on a new instance {took:.2?}, {} updates",
        provider.updates.load(Relaxed)
    );
    assert!(moto.live().contains(&bound.instance), "{bound:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    pool.shutdown(Duration::from_secs(1), false).await;
}

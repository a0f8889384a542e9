//! The GCP plugin (one managed instance group) through the real host, against a loopback
//! stand-in for the Compute Engine API and the metadata server (`gcp_cloud`): no emulator
//! exists, so the stand-in copies the documented REST shapes. The plugin holds no key: the
//! host mints the access tokens (kind `gcp`, metadata server) and adds them.

use flotilla_harness::clouds::GcpPlugin;
use flotilla_harness::pool::{spawn_pool, wait_until};
use flotilla_harness::{must, poll, provider_error};
use std::sync::Arc;
use std::time::Duration;

use flotilla_harness::LogCapture;
use flotilla_peers::gcp_cloud::{GcpCloud, REGION, ZONE};
use flotilla_provider::{InstanceState, Provider, ProviderError};

/// Updates until `n` instances run; their ids.
async fn until_running(p: &impl Provider, n: usize) -> Vec<String> {
    let what = format!("{n} running instances");
    poll::until(&what, Duration::from_secs(10), || async {
        let list = must(p.update()).await.instances;
        let running: Vec<String> = list
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .map(|i| i.id.clone())
            .collect();
        if running.len() == n && list.len() == n {
            Ok(running)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await
}

/// How many requests so far went to paths ending in `suffix`.
fn calls(cloud: &GcpCloud, suffix: &str) -> usize {
    cloud
        .seen()
        .iter()
        .filter(|s| s.path.ends_with(suffix))
        .count()
}

/// The contract cycle, for a zonal and a regional group: grow to 5, addresses, shrink 2
/// (the target drops with them), an idempotent repeat, ids that are not the group's, the
/// max-size cap, and an unknown id.
#[tokio::test(flavor = "current_thread")]
async fn contract_cycle_on_a_zonal_and_a_regional_group() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    for regional in [false, true] {
        let cloud = GcpCloud::start(regional).await;
        let p = cloud.provider(cloud.credential());
        let info = match p.init(&cloud.settings(6)).await {
            Ok(i) => i,
            Err(e) => panic!("{e}\n{}", logs.text()),
        };
        let location = if regional {
            format!("regions/{REGION}")
        } else {
            format!("zones/{ZONE}")
        };
        assert_eq!(
            (info.id.as_str(), info.max_size),
            (
                format!("gcp/ci-project-1/{location}/ci-runners").as_str(),
                6
            )
        );

        assert_eq!(must(p.increase(5)).await, 5);
        assert_eq!(cloud.target_size(), 5);
        // `resize` is a POST without a body: it says so with its length, as Google's front
        // ends require (411 otherwise), and names no content type.
        let seen = cloud.seen();
        let resize = seen
            .iter()
            .find(|s| s.method == "POST" && s.path.contains("/resize"))
            .expect("a resize");
        let header = |name: &str| {
            resize
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("content-length"), Some("0"), "{resize:?}");
        assert_eq!(header("content-type"), None, "{resize:?}");
        let mut ids = until_running(&p, 5).await;
        ids.sort();
        assert_eq!(ids, cloud.live(), "ids are ZONE/NAME");
        let zones: std::collections::BTreeSet<&str> =
            ids.iter().filter_map(|i| i.split('/').next()).collect();
        assert_eq!(zones.len(), if regional { 3 } else { 1 }, "{ids:?}");

        let c = must(p.connect_info(&ids[0])).await;
        // The zone the instance lives in, the first half of its id (contract 0.1.4).
        assert_eq!(c.zone.as_deref(), ids[0].split('/').next(), "{c:?}");
        assert!(
            c.internal_address
                .as_deref()
                .is_some_and(|a| a.starts_with("10.128.0.")),
            "{c:?}"
        );
        assert!(
            c.external_address
                .as_deref()
                .is_some_and(|a| a.starts_with("34.70.1.")),
            "{c:?}"
        );
        assert_eq!((c.port, c.username.as_str()), (22, "flotilla"));

        let gone = ids[..2].to_vec();
        assert_eq!(must(p.decrease(&gone)).await, gone);
        assert_eq!(
            cloud.target_size(),
            3,
            "the target drops with the deletions"
        );
        let list = must(p.update()).await.instances;
        for id in &gone {
            let state = list.iter().find(|i| &i.id == id).map(|i| i.state.clone());
            assert!(
                matches!(state, None | Some(InstanceState::Deleting)),
                "{id}: {state:?}"
            );
        }
        // Repeating it, and naming instances the group never had, changes nothing.
        assert_eq!(must(p.decrease(&gone)).await, gone);
        // An instance the group never had, in its zone and in a zone outside it.
        let foreign = vec![
            format!("{ZONE}/no-such-instance"),
            "europe-west4-b/elsewhere".to_string(),
        ];
        assert_eq!(must(p.decrease(&foreign)).await, foreign);
        assert_eq!(
            must(p.decrease(&["not an id".to_string()])).await,
            Vec::<String>::new(),
            "a malformed id is not accepted"
        );
        assert_eq!(cloud.target_size(), 3);
        assert_eq!(cloud.live(), ids[2..].to_vec());

        // max_size 6 with a target of 3: at most 3 more, never more than asked.
        assert_eq!(must(p.increase(10)).await, 3);
        assert_eq!(must(p.increase(1)).await, 0);
        assert_eq!(cloud.target_size(), 6);

        let e = provider_error(p.connect_info(&format!("{ZONE}/no-such-instance")).await);
        assert!(matches!(e, ProviderError::NotFound(_)), "{e:?}");
        let e = provider_error(p.connect_info("nonsense").await);
        assert!(matches!(e, ProviderError::NotFound(_)), "{e:?}");

        // The plugin named its credential; the host added a token it minted.
        let seen = cloud.seen();
        let compute: Vec<_> = seen
            .iter()
            .filter(|s| s.path.starts_with("/compute/"))
            .collect();
        assert!(!compute.is_empty());
        for s in &compute {
            let header = |n: &str| s.headers.iter().find(|(k, _)| k == n).map(|(_, v)| v);
            assert!(
                header("authorization").is_some_and(|v| v.starts_with("Bearer ya29.fake-")),
                "{s:?}"
            );
            assert!(header("flotilla-credential").is_none(), "{s:?}");
        }
    }
    assert!(
        !logs.text().contains("ya29.fake-"),
        "a token reached the log"
    );
}

/// Every list call pages: 5 instances at 2 per page are 3 `listManagedInstances` calls.
/// Operations are followed to the end: a resize that is DONE at the third poll.
#[tokio::test(flavor = "current_thread")]
async fn lists_page_and_operations_are_followed_to_done() {
    let cloud = GcpCloud::start(false).await;
    let p = cloud.provider(cloud.credential());
    must(p.init(&cloud.settings(8))).await;
    cloud.with(|s| s.operation_polls = 3);
    assert_eq!(must(p.increase(5)).await, 5);
    assert_eq!(
        cloud
            .seen()
            .iter()
            .filter(|s| s.path.contains("/operations/operation-"))
            .count(),
        3,
        "three polls until DONE"
    );
    // PAGELESS, the groups' default: one answer, whatever maxResults says.
    cloud.with(|s| {
        s.operation_polls = 0;
        s.page_size = 2;
    });
    let ids = until_running(&p, 5).await;
    let before = calls(&cloud, "/listManagedInstances");
    assert_eq!(must(p.update()).await.instances.len(), 5);
    assert_eq!(calls(&cloud, "/listManagedInstances") - before, 1);
    // PAGINATED: every page.
    cloud.with(|s| s.list_results = "PAGINATED");
    let before = calls(&cloud, "/listManagedInstances");
    let list = must(p.update()).await.instances;
    assert_eq!(calls(&cloud, "/listManagedInstances") - before, 3);
    assert_eq!(list.len(), 5);
    let mut all: Vec<String> = list.into_iter().map(|i| i.id).collect();
    all.sort();
    let mut ids = ids;
    ids.sort();
    assert_eq!(all, ids, "every page's instances, once");

    // An operation that ends in an error is classified by its code.
    cloud.with(|s| {
        s.fail_next_operation = Some((
            "QUOTA_EXCEEDED".into(),
            "Quota 'CPUS' exceeded.  Limit: 24.0 in region us-central1.".into(),
        ))
    });
    let e = provider_error(p.increase(1).await);
    assert!(
        matches!(&e, ProviderError::QuotaExceeded(m) if m.contains("CPUS")),
        "{e:?}"
    );
}

/// Compute's rate quota (403 `rateLimitExceeded`, no `Retry-After`) is `throttled` for the
/// minute Google says to wait, and a missing permission is `unauthorized` naming it.
#[tokio::test(flavor = "current_thread")]
async fn throttling_and_permission_errors_are_typed() {
    let cloud = GcpCloud::start(true).await;
    let p = cloud.provider(cloud.credential());
    must(p.init(&cloud.settings(4))).await;
    cloud.with(|s| s.throttle_next = Some(7));
    let e = provider_error(p.update().await);
    let ProviderError::Throttled { retry_after, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(retry_after, Duration::from_secs(60));

    cloud.with(|s| {
        s.denied
            .insert("compute.instanceGroupManagers.update".into())
    });
    let e = provider_error(p.increase(1).await);
    assert!(
        matches!(&e, ProviderError::Unauthorized(m) if m.contains("compute.instanceGroupManagers.update")),
        "{e:?}"
    );
    assert_eq!(cloud.target_size(), 0);
    must(p.update()).await;
}

/// Tokens that expire are minted again once, for all callers at once: two pools sharing the
/// credential call together after the metadata server's tokens ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_minted_again_once_for_concurrent_callers() {
    let cloud = GcpCloud::start(false).await;
    // Tokens live 2 s; the host refreshes at half their life.
    cloud.with(|s| s.token_life = Duration::from_secs(2));
    let credential = cloud.credential();
    let a = cloud.provider(credential.clone());
    let b = cloud.provider(credential);
    must(a.init(&cloud.settings(4))).await;
    must(b.init(&cloud.settings(4))).await;
    assert_eq!(cloud.with(|s| s.mints), 1, "one token for both");
    assert_eq!(
        cloud.with(|s| s.scopes.clone()),
        vec!["https://www.googleapis.com/auth/compute".to_string()]
    );
    // Deliberate: the 2 s tokens must expire before both pools call together.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let (ra, rb) = tokio::join!(a.update(), b.update());
    ra.unwrap();
    rb.unwrap();
    assert_eq!(cloud.with(|s| s.mints), 2, "refreshed once, single-flight");
}

/// Compute refuses the cached token before its expiry (401 `UNAUTHENTICATED`: revoked, a
/// rotated key): the host mints anew and sends once more, and the pool stays ready. Refused
/// again at once, it does not mint again within the hold, and the call is `unauthorized`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_compute_refuses_early_is_minted_anew_once() {
    let cloud = GcpCloud::start(false).await;
    let p = cloud.provider(cloud.credential());
    must(p.init(&cloud.settings(4))).await;
    must(p.increase(1)).await;
    assert_eq!(cloud.with(|s| s.mints), 1);
    cloud.expire_tokens();
    must(p.update()).await;
    assert_eq!(cloud.with(|s| s.mints), 2, "minted anew after the refusal");
    assert_eq!(p.health().egress_remints, 1, "counted for the metric");
    cloud.expire_tokens();
    let e = provider_error(p.update().await);
    assert!(
        matches!(&e, ProviderError::Unauthorized(m) if m.contains("UNAUTHENTICATED")),
        "{e:?}"
    );
    assert_eq!(
        cloud.with(|s| s.mints),
        2,
        "no second forced mint within the hold"
    );
}

/// Every settings problem at once; an attached autoscaler and a missing group are refused
/// at `init`.
#[tokio::test(flavor = "current_thread")]
async fn bad_settings_an_autoscaler_and_a_missing_group_are_refused_at_init() {
    let cloud = GcpCloud::start(false).await;
    let p = cloud.provider(cloud.credential());
    let e = provider_error(
        p.init(r#"{"project":"X","zone":"mars","region":"us-central1","name":"Bad_Name","max_size":0,"endpoint":"ftp://x","credential":""}"#)
            .await,
    );
    let ProviderError::InvalidConfig(msg) = e else {
        panic!("{e:?}")
    };
    for key in [
        "project:",
        "zone, region:",
        "name:",
        "max_size:",
        "endpoint:",
        "credential:",
    ] {
        assert!(msg.contains(key), "{key} missing: {msg}");
    }
    // An endpoint the HTTP client could not send to is refused at init, not at the first call.
    let e = provider_error(p.init(r#"{"project":"ci-project-1","zone":"us-central1-a","name":"g","max_size":1,"credential":"gcp","endpoint":"https://user:pw@compute.example"}"#).await);
    assert!(
        matches!(&e, ProviderError::InvalidConfig(m) if m.contains("endpoint:") && m.contains("user info")),
        "{e:?}"
    );
    let e = provider_error(p.init(r#"{"project":"ci-project-1","zone":"us-central1-a","name":"g","max_size":1,"colour":"red"}"#).await);
    assert!(
        matches!(&e, ProviderError::InvalidConfig(m) if m.contains("colour")),
        "{e:?}"
    );

    cloud.with(|s| {
        s.autoscaler = Some(
            "https://www.googleapis.com/compute/v1/projects/ci-project-1/zones/us-central1-a/autoscalers/ci-runners-as".into(),
        )
    });
    let e = provider_error(p.init(&cloud.settings(4)).await);
    assert!(
        matches!(&e, ProviderError::InvalidConfig(m) if m.contains("autoscaler")),
        "{e:?}"
    );
    cloud.with(|s| s.autoscaler = None);
    let e = provider_error(
        p.init(&cloud.settings(4).replace("\"ci-runners\"", "\"nope\""))
            .await,
    );
    assert!(matches!(e, ProviderError::NotFound(_)), "{e:?}");
}

/// Under the real scaler: after a rate-quota refusal no update reaches the API (they run every
/// 300 ms otherwise); a missing permission pauses scale-up with the permission named, while
/// updates go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_waits_out_retry_after_and_pauses_on_a_missing_permission() {
    let cloud = GcpCloud::start(false).await;
    let provider = Arc::new(cloud.provider(cloud.credential()));
    let info = must(provider.init(&cloud.settings(4))).await;
    cloud.with(|s| {
        s.denied
            .insert("compute.instanceGroupManagers.update".into())
    });
    let pool = spawn_pool(
        "gcp",
        provider.clone(),
        &info,
        flotilla_scaler::ScalerConfig {
            update_interval_ms: 300,
            paused_retry_interval_ms: 1_000,
            max_instances: 4,
            ..flotilla_scaler::ScalerConfig::default()
        },
        2,
        3_600_000,
    );
    wait_until(&pool, || pool.snapshot().paused.contains_key("increase")).await;
    let reason = pool.snapshot().paused["increase"].reason.clone();
    assert!(
        reason.contains("compute.instanceGroupManagers.update"),
        "{reason}"
    );
    assert_eq!(cloud.target_size(), 0);
    let before = calls(&cloud, "/listManagedInstances");
    poll::until_true(
        "updates to go on while scale-up is paused",
        Duration::from_secs(3),
        || calls(&cloud, "/listManagedInstances") >= before + 2,
        || {
            format!(
                "{} updates since",
                calls(&cloud, "/listManagedInstances") - before
            )
        },
    )
    .await;

    // The permission is granted again: the pool scales up without a restart.
    cloud.with(|s| s.denied.clear());
    wait_until(&pool, || cloud.target_size() > 0).await;

    // Throttled by the rate quota (403, no Retry-After): no update for the minute Google says
    // to wait; here, none within 2.5 s, where updates came every 300 ms.
    cloud.with(|s| s.throttle_next = Some(0));
    let throttled_at = poll::until("the rate-quota refusal", Duration::from_secs(5), || {
        let at = cloud.with(|s| s.throttled_at);
        async move { at.ok_or("no refusal yet") }
    })
    .await;
    // Deliberate: no update may come within this window (they came every 300 ms).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let updates_since = cloud
        .seen()
        .iter()
        .filter(|s| s.path.ends_with("/listManagedInstances") && s.at > throttled_at)
        .count();
    assert_eq!(updates_since, 0, "updates waited out the rate quota");

    pool.shutdown(Duration::from_secs(1), false).await;
}

/// The conformance kit (`flotilla plugin test`), provisioning included, passes on a zonal and
/// a regional group: the same rules every plugin is held to.
#[tokio::test(flavor = "current_thread")]
async fn the_conformance_kit_passes_with_provisioning() {
    for regional in [false, true] {
        let cloud = GcpCloud::start(regional).await;
        let plugin = flotilla_harness::load(flotilla_test_artifacts::GCP_PLUGIN);
        let p = plugin.provider("kit", cloud.sandbox(cloud.credential()));
        let report = flotilla::plugin_kit::conformance::run(
            &plugin,
            "gcp",
            &p,
            &flotilla::plugin_kit::conformance::KitOptions {
                settings: Some(cloud.settings(4)),
                provision: true,
                timeout: Duration::from_secs(10),
                poll: Duration::from_millis(100),
            },
            std::future::pending(),
        )
        .await;
        assert!(report.ok(), "{}", report.render());
        assert!(
            report.rules.iter().any(|r| r.rule == "provision.gone"
                && r.outcome == flotilla::plugin_kit::conformance::Outcome::Pass),
            "{}",
            report.render()
        );
    }
}

/// A resize is DONE once scheduled; when Compute cannot create the instances (a quota, a
/// zone out of capacity) the errors show only per instance, in `lastAttempt`, while the group
/// retries for ever. Those instances are reported failed (not awaited), and scale-up answers
/// `quota-exceeded` so the scaler backs off.
#[tokio::test(flavor = "current_thread")]
async fn instances_compute_cannot_create_are_failed_and_scale_up_backs_off() {
    for (code, message) in [
        (
            "QUOTA_EXCEEDED",
            "Instance '{instance}' creation failed: Quota 'N2D_CPUS' exceeded. Limit: 500.0 in region us-central1.",
        ),
        (
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            "Instance '{instance}' creation failed: The zone 'projects/ci-project-1/zones/us-central1-a' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.",
        ),
    ] {
        let cloud = GcpCloud::start(false).await;
        let p = cloud.provider(cloud.credential());
        must(p.init(&cloud.settings(8))).await;
        cloud.with(|s| s.creation_error = Some((code.into(), message.into())));
        assert_eq!(
            must(p.increase(2)).await,
            2,
            "the resize itself is accepted"
        );
        let list = must(p.update()).await.instances;
        assert_eq!(list.len(), 2, "{list:?}");
        for i in &list {
            assert!(
                matches!(&i.state, InstanceState::Failed(why) if why.contains(code)),
                "{code}: {i:?}"
            );
        }
        let e = provider_error(p.increase(1).await);
        assert!(
            matches!(&e, ProviderError::QuotaExceeded(m) if m.contains(code)),
            "{code}: {e:?}"
        );
        assert_eq!(
            cloud.target_size(),
            2,
            "no resize while the group cannot create"
        );
    }
}

/// REFRESHING applies configuration without stopping the instance: a busy VM is not failed.
#[tokio::test(flavor = "current_thread")]
async fn a_refreshing_instance_keeps_running() {
    let cloud = GcpCloud::start(false).await;
    let p = cloud.provider(cloud.credential());
    must(p.init(&cloud.settings(4))).await;
    assert_eq!(must(p.increase(2)).await, 2);
    let ids = until_running(&p, 2).await;
    cloud.refresh(&ids[0]);
    let list = must(p.update()).await.instances;
    let refreshed = list.iter().find(|i| i.id == ids[0]).expect("listed");
    assert_eq!(refreshed.state, InstanceState::Running, "{list:?}");
}

/// An autoscaler in mode OFF stays attached and no longer sizes the group: `init` accepts it,
/// as its refusal of an active one says to do. A zonal group holds at most 1,000 VMs.
#[tokio::test(flavor = "current_thread")]
async fn an_autoscaler_in_mode_off_is_accepted_and_zonal_groups_stop_at_1000() {
    let cloud = GcpCloud::start(false).await;
    let p = cloud.provider(cloud.credential());
    cloud.with(|s| {
        s.autoscaler = Some(format!(
            "https://www.googleapis.com/compute/v1/projects/ci-project-1/zones/{ZONE}/autoscalers/ci-runners-as"
        ));
        s.autoscaler_mode = "ON".into();
    });
    let e = provider_error(p.init(&cloud.settings(4)).await);
    assert!(
        matches!(&e, ProviderError::InvalidConfig(m) if m.contains("mode ON") && m.contains("set its mode to OFF")),
        "{e:?}"
    );
    cloud.with(|s| s.autoscaler_mode = "OFF".into());
    must(p.init(&cloud.settings(4))).await;
    let e = provider_error(p.init(&cloud.settings(1500)).await);
    assert!(
        matches!(&e, ProviderError::InvalidConfig(m) if m.contains("1-1000")),
        "{e:?}"
    );
    let regional = GcpCloud::start(true).await;
    let p = regional.provider(regional.credential());
    must(p.init(&regional.settings(1500))).await;
}

/// An operation refused for too many operations on one resource is throttled, not `other`.
#[tokio::test(flavor = "current_thread")]
async fn a_resource_operation_rate_refusal_is_throttled() {
    let cloud = GcpCloud::start(false).await;
    let p = cloud.provider(cloud.credential());
    must(p.init(&cloud.settings(4))).await;
    cloud.with(|s| {
        s.fail_next_operation = Some((
            "RESOURCE_OPERATION_RATE_EXCEEDED".into(),
            "Operation rate exceeded for resource 'projects/ci-project-1/zones/us-central1-a/instanceGroupManagers/ci-runners'. Too frequent operations from the source resource.".into(),
        ))
    });
    let e = provider_error(p.increase(1).await);
    assert!(
        matches!(e, ProviderError::Throttled { retry_after, .. } if retry_after >= Duration::from_secs(30)),
        "{e:?}"
    );
}

/// A Spot VM Compute preempts is taken out of service at once: the lease on it fails with a
/// cause that says so (the GitLab driver reports that as a system failure, which the runner
/// retries), the pool removes it, and the next lease goes to another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_spot_vm_fails_its_lease_and_takes_no_new_one() {
    let cloud = GcpCloud::start(false).await;
    let provider = Arc::new(cloud.provider(cloud.credential()));
    let info = must(provider.init(&cloud.settings(4))).await;
    let config = flotilla_scaler::ScalerConfig {
        update_interval_ms: 200,
        update_interval_when_expecting_ms: 200,
        max_instances: 4,
        ..flotilla_scaler::ScalerConfig::default()
    };
    let pool = spawn_pool("spot", provider, &info, config, 0, 3_600_000);
    let first = pool.reserve().expect("reserve");
    let bound = tokio::time::timeout(Duration::from_secs(10), pool.acquire(first))
        .await
        .expect("acquired in time")
        .expect("acquired");
    cloud.preempt(&bound.instance);
    wait_until(&pool, || {
        pool.with_core(|c| {
            matches!(
                c.lease(first).map(|l| &l.state),
                Some(flotilla_scaler::LeaseState::Failed { .. })
            )
        })
    })
    .await;
    let cause = pool.with_core(|c| match c.lease(first).map(|l| l.state.clone()) {
        Some(flotilla_scaler::LeaseState::Failed { cause }) => cause,
        other => panic!("{other:?}"),
    });
    assert!(
        cause.contains("TERMINATED") && cause.contains("preempted"),
        "{cause}"
    );
    let second = pool.reserve().expect("reserve");
    let next = tokio::time::timeout(Duration::from_secs(10), pool.acquire(second))
        .await
        .expect("acquired in time")
        .expect("acquired");
    assert_ne!(next.instance, bound.instance, "a preempted VM took a lease");
    pool.shutdown(Duration::from_secs(1), false).await;
}

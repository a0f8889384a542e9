//! The Azure plugin through the real host against a loopback Azure Resource Manager
//! (`test-support/src/azure_cloud.rs`) that serves the documented REST shapes of one scale
//! set, Uniform or Flexible, and mints managed-identity tokens. The plugin never holds a
//! token: the host authorises every request.

use flotilla_harness as common;
use flotilla_harness::clouds::AzurePlugin;
use flotilla_harness::pool::{Counting, spawn_pool, wait_until};
use flotilla_harness::{must, poll, provider_error};

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::LogCapture;
use flotilla_peers::azure_cloud::{AzureCloud, Kind, Mode, Options};
use flotilla_plugin_runtime::WasmProvider;
use flotilla_provider::{InstanceState, Provider, ProviderError};

fn options(mode: Mode) -> Options {
    Options {
        mode,
        ..Options::default()
    }
}

/// A started cloud and an initialised provider.
async fn started(options: Options) -> (AzureCloud, WasmProvider) {
    let cloud = AzureCloud::start(options);
    let p = cloud.provider();
    must(p.init(&cloud.settings())).await;
    (cloud, p)
}

/// Updates until `n` instances run; the list.
async fn until_running(p: &WasmProvider, n: usize) -> Vec<flotilla_provider::Instance> {
    let what = format!("{n} running instances");
    poll::until(&what, Duration::from_secs(10), || async {
        let list = must(p.update()).await.instances;
        if list
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .count()
            == n
        {
            Ok(list)
        } else {
            Err(format!("{list:?}"))
        }
    })
    .await
}

async fn contract_cycle(mode: Mode) {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let cloud = AzureCloud::start(options(mode));
    let p = cloud.provider();
    let info = match p.init(&cloud.settings()).await {
        Ok(i) => i,
        Err(e) => panic!("{e}\n{}", logs.text()),
    };
    assert_eq!(
        (info.id.as_str(), info.max_size),
        (
            "azure/00000000-0000-0000-0000-00000000c0de/ci-rg/ci-vmss",
            8
        )
    );

    match p.increase(5).await {
        Ok(n) => assert_eq!(n, 5),
        Err(e) => panic!("{e}\n{}", logs.text()),
    }
    assert_eq!(cloud.capacity(), 5);
    let first = must(p.update()).await.instances;
    assert_eq!(first.len(), 5, "{first:?}");
    assert!(
        first.iter().all(|i| i.state == InstanceState::Creating),
        "new VMs are creating: {first:?}"
    );
    let instances = until_running(&p, 5).await;
    let mut ids: Vec<String> = instances.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, cloud.live());

    let c = must(p.connect_info(&ids[0])).await;
    assert!(
        c.internal_address
            .as_deref()
            .is_some_and(|a| a.starts_with("10.0.")),
        "{c:?}"
    );
    // The VM's location with its `zones` entry, as `westeurope-2` (contract 0.1.4).
    assert!(
        c.zone
            .as_deref()
            .and_then(|z| z.strip_prefix("westeurope-"))
            .is_some_and(|n| ["1", "2", "3"].contains(&n)),
        "{c:?}"
    );
    assert!(
        c.external_address
            .as_deref()
            .is_some_and(|a| a.starts_with("20.50.")),
        "{c:?}"
    );
    assert_eq!((c.username.as_str(), c.port), ("azureuser", 22));
    assert!(matches!(
        provider_error(p.connect_info("no-such-id").await),
        ProviderError::NotFound(_)
    ));

    let gone: Vec<String> = vec![ids[1].clone(), ids[3].clone()];
    assert_eq!(must(p.decrease(&gone)).await, gone);
    assert_eq!(cloud.capacity(), 3, "the capacity dropped with them");
    let live = cloud.live();
    assert!(gone.iter().all(|g| !live.contains(g)), "{live:?}");
    assert_eq!(live.len(), 3);
    let after = must(p.update()).await.instances;
    for i in &after {
        let want = if gone.contains(&i.id) {
            InstanceState::Deleting
        } else {
            InstanceState::Running
        };
        assert_eq!(i.state, want, "{after:?}");
    }
    // Deleted instances disappear, the others stay.
    poll::until(
        "the deleted instances to disappear",
        Duration::from_secs(2),
        || async {
            let mut left: Vec<String> = must(p.update())
                .await
                .instances
                .into_iter()
                .map(|i| i.id)
                .collect();
            left.sort();
            if left == live {
                Ok(())
            } else {
                Err(format!("{left:?}, want {live:?}"))
            }
        },
    )
    .await;
    assert!(matches!(
        provider_error(p.connect_info(&gone[0]).await),
        ProviderError::NotFound(_)
    ));
    assert!(matches!(
        provider_error(p.heartbeat(&ids[0]).await),
        ProviderError::Unsupported(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uniform_set_grows_to_five_runs_them_and_deletes_the_two_named() {
    contract_cycle(Mode::Uniform).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flexible_set_grows_to_five_runs_them_and_deletes_the_two_named() {
    contract_cycle(Mode::Flexible).await;
}

async fn three_pages(mode: Mode, https: bool) {
    let options = Options {
        mode,
        running: 5,
        page_size: 2,
        ..Options::default()
    };
    let cloud = if https {
        AzureCloud::start_https(options)
    } else {
        AzureCloud::start(options)
    };
    let p = cloud.provider();
    must(p.init(&cloud.settings())).await;
    let list = must(p.update()).await.instances;
    let mut ids: Vec<String> = list.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "{list:?}");
    assert_eq!(ids, cloud.live());
    let pages: Vec<String> = cloud
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.uri.contains("instanceView"))
        .map(|r| r.uri)
        .collect();
    assert_eq!(pages.len(), 3, "{pages:?}");
    assert!(pages[2].contains("skiptoken=4"), "{pages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uniform_update_follows_next_link_across_three_pages() {
    three_pages(Mode::Uniform, false).await;
}

/// The Flexible list asks with the quoted filter and follows `nextLink`s that carry it raw
/// (spaces and quotes unencoded, azure-rest-api-specs #25640).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flexible_update_follows_next_link_across_three_pages() {
    three_pages(Mode::Flexible, false).await;
}

/// ARM served on 443 writes `nextLink`s as `https://host:443/...` (azure-sdk-for-go #21296):
/// the same endpoint as `https://host`, so the list goes on past its first page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_links_that_spell_port_443_are_followed_on_https() {
    three_pages(Mode::Uniform, true).await;
    three_pages(Mode::Flexible, true).await;
}

/// Compute refuses a state conflict with OperationNotAllowed too: that is a conflict to wait
/// out, not a quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_not_allowed_for_a_conflict_is_not_a_quota() {
    let (cloud, p) = started(options(Mode::Uniform)).await;
    cloud.conflict_next_scale_out();
    let e = provider_error(p.increase(1).await);
    assert!(
        matches!(&e, ProviderError::Transient(m) if m.contains("marked for deletion")),
        "{e:?}"
    );
    assert_eq!(must(p.increase(1)).await, 1);
}

/// IMDS answers 404 while a managed identity is being set up and 410 during a host upgrade;
/// neither is a refusal: the call fails as transient and the next one gets its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imds_404_and_410_are_waited_out_not_taken_as_unauthorized() {
    let cloud = AzureCloud::start(options(Mode::Uniform));
    cloud.imds_unready(&[404, 410]);
    let p = cloud.provider();
    let logs = LogCapture::default();
    let _guard = logs.install();
    for status in ["404", "410"] {
        let e = provider_error(p.init(&cloud.settings()).await);
        assert!(matches!(&e, ProviderError::Transient(_)), "{status}: {e:?}");
        assert!(logs.text().contains(status), "{}", logs.text());
    }
    must(p.init(&cloud.settings())).await;
    must(p.update()).await;
}

/// A throttling window close to empty is said in the log before Compute starts refusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearly_spent_throttling_windows_are_reported() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let (cloud, p) = started(options(Mode::Uniform)).await;
    must(p.update()).await;
    assert!(!logs.text().contains("nearly spent"), "{}", logs.text());
    cloud.remaining_calls(3);
    must(p.update()).await;
    let text = logs.text();
    assert!(
        text.contains("nearly spent") && text.contains("HighCostGet3Min: 3 left"),
        "{text}"
    );
}

/// Azure-AsyncOperation for the scale-out, Location only for the delete: both are followed
/// until the operation ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_are_followed_until_they_succeed_after_three_polls() {
    let (cloud, p) = started(options(Mode::Uniform)).await;
    cloud.lro_polls(3);
    assert_eq!(must(p.increase(2)).await, 2);
    assert_eq!(cloud.polls(), 3, "{:?}", cloud.requests());
    let ids: Vec<String> = until_running(&p, 2)
        .await
        .into_iter()
        .map(|i| i.id)
        .collect();
    cloud.location_only(true);
    assert_eq!(must(p.decrease(&ids[..1])).await, ids[..1].to_vec());
    assert_eq!(cloud.polls(), 6);
    let monitor = cloud
        .requests()
        .into_iter()
        .filter(|r| r.uri.contains("monitor=true"))
        .count();
    assert_eq!(monitor, 3, "the delete was followed by its Location");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_that_ends_failed_is_a_classified_error() {
    let (cloud, p) = started(options(Mode::Flexible)).await;
    cloud.lro_polls(2);
    cloud.fail_next_operation(
        "AllocationFailed",
        "Allocation failed. We do not have sufficient capacity for the requested VM size in this region.",
    );
    let e = provider_error(p.increase(2).await);
    let ProviderError::QuotaExceeded(msg) = &e else {
        panic!("{e:?}")
    };
    assert!(msg.contains("AllocationFailed"), "{msg}");
    assert_eq!(cloud.capacity(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_throttled_with_the_seconds_of_its_retry_after() {
    let (cloud, p) = started(options(Mode::Uniform)).await;
    cloud.throttle_next(Kind::Read, 17);
    let e = provider_error(p.update().await);
    let ProviderError::Throttled { retry_after, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*retry_after, Duration::from_secs(17));
    // Compute's 429 carries the code OperationNotAllowed: the status wins, not quota.
    cloud.throttle_next(Kind::Write, 3);
    let e = provider_error(p.increase(1).await);
    assert!(
        matches!(e, ProviderError::Throttled { retry_after, .. } if retry_after == Duration::from_secs(3)),
        "{e:?}"
    );
    must(p.update()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_action_is_unauthorized_and_named() {
    let (cloud, p) = started(options(Mode::Flexible)).await;
    cloud.deny("Microsoft.Compute/virtualMachineScaleSets/write");
    let e = provider_error(p.increase(1).await);
    let ProviderError::Unauthorized(msg) = &e else {
        panic!("{e:?}")
    };
    assert!(
        msg.contains("Microsoft.Compute/virtualMachineScaleSets/write")
            && msg.contains("AuthorizationFailed"),
        "{msg}"
    );
    assert!(msg.chars().count() <= 301, "capped: {}", msg.len());
    must(p.update()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_error_on_scale_out_is_quota_exceeded() {
    let (cloud, p) = started(options(Mode::Uniform)).await;
    cloud.quota_on_scale_out(true);
    let e = provider_error(p.increase(3).await);
    assert!(
        matches!(&e, ProviderError::QuotaExceeded(m) if m.contains("OperationNotAllowed") && m.contains("quota")),
        "{e:?}"
    );
    assert_eq!(cloud.capacity(), 0);
}

/// `increase` counts against `max_size` (8 in the test settings) and what already exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increase_never_grants_more_than_max_size_allows() {
    let (cloud, p) = started(Options {
        running: 6,
        ..options(Mode::Flexible)
    })
    .await;
    assert_eq!(must(p.increase(5)).await, 2);
    assert_eq!(cloud.capacity(), 8);
    assert_eq!(must(p.increase(1)).await, 0);
    assert_eq!(cloud.capacity(), 8);
}

async fn idempotent_decrease(mode: Mode) {
    let (cloud, p) = started(Options {
        running: 4,
        ..options(mode)
    })
    .await;
    let ids = cloud.live();
    cloud.remove(&ids[0]);
    let asked = vec![ids[0].clone(), "no-such-id".to_string(), ids[1].clone()];
    assert_eq!(
        must(p.decrease(&asked)).await,
        asked,
        "gone ids count as accepted"
    );
    // Asked again while the instance is deleting: accepted, and not deleted twice.
    let deletes = |c: &AzureCloud| {
        c.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.uri.contains("/delete?"))
            .count()
    };
    let before = deletes(&cloud);
    assert_eq!(must(p.decrease(&ids[1..2])).await, ids[1..2].to_vec());
    assert_eq!(deletes(&cloud), before);
    assert_eq!(cloud.capacity(), 2);

    // One instance the cloud refuses to delete: the others go (partial success).
    cloud.fail_delete_of(&ids[2]);
    let asked = vec![ids[2].clone(), ids[3].clone()];
    assert_eq!(must(p.decrease(&asked)).await, vec![ids[3].clone()]);
    assert_eq!(cloud.live(), vec![ids[2].clone()]);
    let e = provider_error(p.decrease(&ids[2..3]).await);
    assert!(matches!(e, ProviderError::Other(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uniform_decrease_is_idempotent_and_partial() {
    idempotent_decrease(Mode::Uniform).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flexible_decrease_is_idempotent_and_partial() {
    idempotent_decrease(Mode::Flexible).await;
}

/// Four pools of `cloud` holding one credential, initialised: one token minted between them.
async fn four_pools_sharing_a_credential(cloud: &AzureCloud) -> Vec<WasmProvider> {
    let credential = cloud.credential();
    let providers: Vec<WasmProvider> = (0..4)
        .map(|_| cloud.provider_with(credential.clone()))
        .collect();
    for p in &providers {
        must(p.init(&cloud.settings())).await;
    }
    assert_eq!(cloud.mints(), 1);
    providers
}

/// Tokens live 2 s; the host refreshes them at half their life. Four pools sharing one
/// credential call at once after that: one mint between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_token_is_minted_once_for_concurrent_callers() {
    let cloud = AzureCloud::start(Options {
        token_lifetime: Duration::from_secs(2),
        running: 2,
        ..options(Mode::Uniform)
    });
    let providers = four_pools_sharing_a_credential(&cloud).await;
    // Deliberate: half of the 2 s token life must pass before the host refreshes.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let calls = providers.iter().map(|p| p.update());
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(r.expect("update").instances.len(), 2);
    }
    assert_eq!(cloud.mints(), 2, "one refresh for four concurrent callers");
}

/// ARM refuses the cached token before its expiry (`ExpiredAuthenticationToken`: revoked,
/// clock skew): the host drops it, mints once for all refused callers, and sends each request
/// once more, so the pool never sees the refusal. Refused again at once, it does not mint
/// again within the hold: a credential the cloud keeps refusing cannot loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_arm_refuses_early_is_minted_anew_once() {
    let cloud = AzureCloud::start(Options {
        running: 2,
        ..options(Mode::Uniform)
    });
    let providers = four_pools_sharing_a_credential(&cloud).await;
    cloud.expire_tokens();
    let calls = providers.iter().map(|p| p.update());
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(r.expect("update after an early refusal").instances.len(), 2);
    }
    assert_eq!(cloud.mints(), 2, "one new token for four refused callers");

    cloud.expire_tokens();
    let e = provider_error(providers[0].update().await);
    assert!(
        matches!(&e, ProviderError::Transient(m) if m.contains("ExpiredAuthenticationToken")),
        "{e:?}"
    );
    assert_eq!(cloud.mints(), 2, "no second forced mint within the hold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_reported_at_once() {
    let cloud = AzureCloud::start(Options::default());
    let p = cloud.provider();
    let e = provider_error(
        p.init(r#"{"subscription_id":"nope","resource_group":"bad/group","endpoint":"ftp://x","max_size":0,"username":""}"#)
            .await,
    );
    let ProviderError::InvalidConfig(msg) = &e else {
        panic!("{e:?}")
    };
    for key in [
        "subscription_id:",
        "resource_group:",
        "name: is required",
        "endpoint:",
        "max_size:",
        "username:",
    ] {
        assert!(msg.contains(key), "{key} missing: {msg}");
    }
    let e = provider_error(p.init(r#"{"name":"x","region":"westeurope"}"#).await);
    assert!(
        matches!(&e, ProviderError::InvalidConfig(m) if m.contains("region")),
        "{e:?}"
    );
    let other_set = cloud.settings().replace("ci-vmss", "other-vmss");
    let e = provider_error(p.init(&other_set).await);
    assert!(matches!(e, ProviderError::NotFound(_)), "{e:?}");
}

/// The host authorises every request and strips the credential name; no token reaches a log
/// line, an error or the plugin's view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_reaches_a_log_or_the_plugin() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let (cloud, p) = started(Options {
        running: 2,
        ..options(Mode::Flexible)
    })
    .await;
    let ids: Vec<String> = must(p.update())
        .await
        .instances
        .into_iter()
        .map(|i| i.id)
        .collect();
    must(p.connect_info(&ids[0])).await;
    cloud.deny("Microsoft.Compute/virtualMachineScaleSets/delete/action");
    let e = provider_error(p.decrease(&ids).await);
    // Refused early once: minted anew and sent again (logged); refused again at once: the
    // refusal reaches the plugin.
    cloud.expire_tokens();
    must(p.update()).await;
    cloud.expire_tokens();
    let e2 = provider_error(p.update().await);

    let tokens = cloud.tokens();
    assert!(!tokens.is_empty());
    let text = logs.text();
    for t in &tokens {
        assert!(!text.contains(t.as_str()), "a token reached the log");
        assert!(!format!("{e:?}{e2:?}").contains(t.as_str()));
    }
    let arm: Vec<_> = cloud
        .requests()
        .into_iter()
        .filter(|r| !r.uri.contains("/metadata/"))
        .collect();
    assert!(!arm.is_empty());
    for r in &arm {
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let auth = header("authorization").unwrap_or_default();
        assert!(
            tokens.iter().any(|t| auth == format!("Bearer {t}")),
            "{} had no minted token",
            r.uri
        );
        assert_eq!(header("flotilla-credential"), None, "stripped by the host");
    }
}

/// A denied scale-out pauses only `increase`, naming the action; allowed again, the pool
/// scales up without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_pauses_scale_up_naming_the_denied_action() {
    let cloud = AzureCloud::start(options(Mode::Flexible));
    let provider = Arc::new(Counting::new(cloud.provider()));
    let info = must(provider.init(&cloud.settings())).await;
    cloud.deny("Microsoft.Compute/virtualMachineScaleSets/write");
    let pool = spawn_pool(
        "azure",
        provider.clone(),
        &info,
        scaler_config(),
        2,
        3_600_000,
    );
    wait_until(&pool, || pool.snapshot().paused.contains_key("increase")).await;
    let snap = pool.snapshot();
    assert!(
        snap.paused["increase"]
            .reason
            .contains("Microsoft.Compute/virtualMachineScaleSets/write"),
        "{snap:?}"
    );
    assert_eq!(cloud.capacity(), 0);
    cloud.allow_all();
    wait_until(&pool, || cloud.capacity() >= 1).await;
    pool.shutdown(Duration::from_secs(1), false).await;
}

/// A 429 with `Retry-After: 2` holds the pool's next call for two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_waits_out_a_throttle() {
    let cloud = AzureCloud::start(Options {
        running: 1,
        ..options(Mode::Uniform)
    });
    let provider = Arc::new(Counting::new(cloud.provider()));
    let info = must(provider.init(&cloud.settings())).await;
    let pool = spawn_pool(
        "azure",
        provider.clone(),
        &info,
        scaler_config(),
        0,
        3_600_000,
    );
    poll::until_true(
        "3 updates",
        Duration::from_secs(10),
        || provider.updates.load(Relaxed) >= 3,
        || format!("{} updates", provider.updates.load(Relaxed)),
    )
    .await;
    cloud.throttle_next(Kind::Read, 2);
    poll::until_true(
        "the throttled call",
        Duration::from_secs(10),
        || !cloud.throttle_pending(),
        || "the throttle is still pending".to_string(),
    )
    .await;
    let thrown = provider.updates.load(Relaxed);
    // Deliberate: no update may come within the 2 s the cloud asked for.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        provider.updates.load(Relaxed),
        thrown,
        "an update within the 2 s the cloud asked for"
    );
    poll::until_true(
        "updates to resume",
        Duration::from_secs(5),
        || provider.updates.load(Relaxed) > thrown,
        || {
            format!(
                "{} updates, {thrown} when throttled",
                provider.updates.load(Relaxed)
            )
        },
    )
    .await;
    pool.shutdown(Duration::from_secs(1), false).await;
}

/// The conformance kit (`flotilla plugin test`), provisioning included, passes on a Uniform and
/// a Flexible set: the same rules every plugin is held to.
#[tokio::test(flavor = "current_thread")]
async fn the_conformance_kit_passes_with_provisioning() {
    for mode in [Mode::Uniform, Mode::Flexible] {
        let (cloud, p) = started(options(mode)).await;
        let plugin = flotilla_harness::load(flotilla_test_artifacts::AZURE_PLUGIN);
        let report = flotilla::plugin_kit::conformance::run(
            &plugin,
            "azure",
            &p,
            &flotilla::plugin_kit::conformance::KitOptions {
                settings: Some(cloud.settings()),
                provision: true,
                timeout: Duration::from_secs(10),
                poll: Duration::from_millis(100),
            },
            std::future::pending(),
        )
        .await;
        assert!(report.ok(), "{mode:?}: {}", report.render());
    }
}

/// The scaler settings of these tests: quick updates, a quick retry of paused calls.
fn scaler_config() -> flotilla_scaler::ScalerConfig {
    flotilla_scaler::ScalerConfig {
        update_interval_ms: 200,
        paused_retry_interval_ms: 1_000,
        max_instances: 4,
        ..flotilla_scaler::ScalerConfig::default()
    }
}

/// A Spot VM Azure evicts (eviction policy Deallocate: stopped and deallocated in place) is
/// failed with the eviction named as its cause, in both modes, so its leases end with that
/// cause and no new lease goes to it; the VMs beside it keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_spot_vm_is_failed_as_reclaimed() {
    for mode in [Mode::Uniform, Mode::Flexible] {
        let (cloud, p) = started(Options {
            running: 2,
            ..options(mode)
        })
        .await;
        let ids = cloud.all();
        cloud.evict(&ids[0]);
        let listed = must(p.update()).await.instances;
        let state_of = |id: &str| {
            listed
                .iter()
                .find(|i| i.id == id)
                .map(|i| i.state.clone())
                .unwrap_or_else(|| panic!("{id} missing from {listed:?}"))
        };
        assert!(
            matches!(state_of(&ids[0]), InstanceState::Failed(why) if why.contains("reclaimed this Spot VM") && why.contains("deallocated")),
            "{mode:?}: {listed:?}"
        );
        assert_eq!(state_of(&ids[1]), InstanceState::Running, "{mode:?}");
    }
}

//! The whole path over every official cloud plugin at once: one `flotilla run` with an AWS
//! pool on moto (SigV4 checked), a GCP pool on the Compute stand-in (tokens from its metadata
//! server) and an Azure pool on the scale-set stand-in (tokens from its managed-identity
//! endpoint). Through the lease API each group holds its idle capacity, grows under a burst
//! of leases to the pool's maximum, and shrinks again after `idle_time`; no token reaches the
//! log.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::common;

use std::time::Duration;

use flotilla_harness::poll;
use flotilla_peers::azure_cloud::{self, AzureCloud, Mode, Options};
use flotilla_peers::gcp_cloud::{GcpCloud, REGION, ZONE};
use flotilla_peers::moto::Moto;

use common::{Flotilla, TOKEN};

/// One pool's shape, the same for every cloud: 2 slots per instance, at most 4 instances, 2
/// idle slots kept for 3 s.
fn pool(name: &str, plugin: &str, endpoint: &str, plugin_config: &str, credential: &str) -> String {
    format!(
        r#"
[[pool]]
name = "{name}"
plugin = "{plugin}"
capacity_per_instance = 2
max_instances = 4
update_interval = "1s"
instance_acquire_timeout = "20s"
allowed_outbound_hosts = ["{endpoint}"]
allowed_ip_ranges = ["127.0.0.0/8"]

[pool.plugin_config]
{plugin_config}

[[pool.credentials]]
{credential}
hosts = ["{endpoint}"]

[[pool.policy]]
idle_count = 2
idle_time = "3s"
"#
    )
}

/// A cloud under test: its pool, the private addresses its instances get, and its group's
/// size as the cloud itself reports it.
struct Cloud<'a> {
    pool: &'static str,
    address_prefix: &'static str,
    size: Box<dyn Fn() -> u64 + Send + Sync + 'a>,
}

impl Cloud<'_> {
    async fn wait_size(&self, want: u64, what: &str, f: &Flotilla) {
        let what = format!("{}: {what} ({want} instances)", self.pool);
        poll::until(&what, Duration::from_secs(40), || {
            let size = (self.size)();
            let log = f.log();
            async move {
                if size == want {
                    Ok(())
                } else {
                    Err(format!("size {size}\n{log}"))
                }
            }
        })
        .await
    }
}

/// Where each pool's plugin sends its calls, and where the host mints the pool's tokens.
struct Endpoints<'a> {
    aws: &'a str,
    gcp: &'a str,
    gcp_tokens: &'a str,
    azure: &'a str,
    azure_imds: &'a str,
}

/// The config of one `flotilla run` with a pool per cloud, each pool's table passed through
/// `shape`; the AWS pool signs with `key` and the secret in `FLOTILLA_TEST_AWS_SECRET`.
fn three_pools(key: &str, at: &Endpoints<'_>, shape: impl Fn(String) -> String) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ntoken = {{ value = \"{TOKEN}\" }}\nshutdown_grace = \"5s\"\n{}{}{}",
        shape(pool(
            "aws",
            flotilla_test_artifacts::AWS_PLUGIN,
            at.aws,
            &format!(
                "name = \"ci-runners\"\nregion = \"us-east-1\"\nendpoint = \"{}\"",
                at.aws
            ),
            &format!(
                "name = \"aws\"\nkind = \"aws-sigv4\"\naccess_key_id = {{ value = \"{key}\" }}\nsecret_access_key = {{ env = \"FLOTILLA_TEST_AWS_SECRET\" }}"
            ),
        )),
        shape(pool(
            "gcp",
            flotilla_test_artifacts::GCP_PLUGIN,
            at.gcp,
            &format!(
                "project = \"ci-project-1\"\nregion = \"{REGION}\"\nname = \"ci-runners\"\nmax_size = 10\nendpoint = \"{}\"",
                at.gcp
            ),
            &format!(
                "name = \"gcp\"\nkind = \"gcp\"\nmetadata_endpoint = \"{}\"\nscopes = [\"https://www.googleapis.com/auth/compute\"]",
                at.gcp_tokens
            ),
        )),
        shape(pool(
            "azure",
            flotilla_test_artifacts::AZURE_PLUGIN,
            at.azure,
            &format!(
                "subscription_id = \"{}\"\nresource_group = \"ci-rg\"\nname = \"ci-vmss\"\nendpoint = \"{}\"",
                azure_cloud::SUBSCRIPTION,
                at.azure
            ),
            &format!(
                "name = \"azure\"\nkind = \"azure\"\nimds_endpoint = \"{}\"",
                at.azure_imds
            ),
        )),
    )
}

/// The process's environment: the AWS secret, and no Azure identity of the machine's own.
fn run_options(aws_secret: &str) -> common::Options {
    common::Options::default()
        .env("FLOTILLA_TEST_AWS_SECRET", aws_secret)
        .env_remove("AZURE_CLIENT_ID")
        .env_remove("AZURE_TENANT_ID")
        .env_remove("AZURE_FEDERATED_TOKEN_FILE")
}

/// The three clouds under test, each with its group's size as the cloud reports it.
fn clouds<'a>(moto: &'a Moto, gcp: &'a GcpCloud, azure: &'a AzureCloud) -> [Cloud<'a>; 3] {
    [
        Cloud {
            pool: "aws",
            address_prefix: "10.20.",
            size: Box::new(move || moto.desired()),
        },
        Cloud {
            pool: "gcp",
            address_prefix: "10.128.0.",
            size: Box::new(move || u64::from(gcp.target_size())),
        },
        Cloud {
            pool: "azure",
            address_prefix: "10.0.",
            size: Box::new(move || u64::from(azure.capacity())),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cloud_scales_through_flotilla_run_and_the_lease_api() {
    let moto = Moto::start();
    let (key, secret) = moto.key("plugin");
    let gcp = GcpCloud::start(true).await;
    let azure = AzureCloud::start(Options {
        mode: Mode::Flexible,
        ..Options::default()
    });

    let at = Endpoints {
        aws: &moto.endpoint,
        gcp: &gcp.endpoint,
        gcp_tokens: &gcp.endpoint,
        azure: &azure.endpoint,
        azure_imds: &azure.endpoint,
    };
    let config = three_pools(&key, &at, |p| p);
    let options = run_options(&secret);
    let f = Flotilla::start_with(tempfile::tempdir().expect("dir"), &config, options).await;

    let clouds = clouds(&moto, &gcp, &azure);
    for cloud in &clouds {
        cloud
            .wait_size(1, "idle_count 2 at 2 slots per instance", &f)
            .await;
    }

    // A burst of 6 leases in every pool at once: 6 busy slots and 2 idle make 4 instances,
    // the pools' maximum.
    let mut leases = Vec::new();
    for cloud in &clouds {
        let path = format!("/v1/pools/{}/leases", cloud.pool);
        for _ in 0..6 {
            let (code, body) = f.call("POST", &path, Some(serde_json::json!({}))).await;
            assert_eq!(code, 201, "{}: {body}", cloud.pool);
            leases.push((cloud, body["lease"]["id"].as_u64().expect("a lease id")));
        }
    }
    for (cloud, id) in &leases {
        let path = format!("/v1/pools/{}/leases/{id}/acquire", cloud.pool);
        let (code, body) = f.call("POST", &path, None).await;
        assert_eq!(code, 200, "{}: {body}", cloud.pool);
        let address = body["connection"]["internal_address"].as_str();
        assert!(
            address.is_some_and(|a| a.starts_with(cloud.address_prefix)),
            "{}: {body}",
            cloud.pool
        );
    }
    for cloud in &clouds {
        cloud.wait_size(4, "6 busy slots + 2 idle", &f).await;
    }
    for (cloud, id) in &leases {
        let path = format!("/v1/pools/{}/leases/{id}/release", cloud.pool);
        let (code, body) = f.call("POST", &path, None).await;
        assert_eq!(code, 200, "{}: {body}", cloud.pool);
    }
    for cloud in &clouds {
        cloud.wait_size(1, "scale-down after idle_time", &f).await;
    }
    let log = f.log();
    for token in ["ya29.fake-", &secret] {
        assert!(!log.contains(token), "a secret reached the log");
    }
}

/// The largest value `size` takes while `during` runs, sampled every 20 ms.
async fn largest_during<T>(
    size: impl Fn() -> u64 + Send + Sync,
    during: impl std::future::Future<Output = T>,
) -> (u64, T) {
    let largest = std::sync::atomic::AtomicU64::new(0);
    let sample = async {
        loop {
            largest.fetch_max(size(), std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let out = tokio::select! {
        out = during => out,
        () = sample => unreachable!("sampling never ends"),
    };
    largest.fetch_max(size(), std::sync::atomic::Ordering::SeqCst);
    (largest.load(std::sync::atomic::Ordering::SeqCst), out)
}

/// A scaling write that takes effect while its answer is lost costs nothing: each cloud's
/// first write loses its answer (GCP's resize to a reset, Azure's capacity PATCH to a
/// gateway's 504, AWS's SetDesiredCapacity to a stall and a closed connection), then the
/// operation polls that follow GCP's and Azure's next writes lose theirs, and AWS's next
/// write gets a 504. Every group ends at the size its leases need, is never above it, and
/// every lease is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaling_write_whose_answer_is_lost_never_overshoots() {
    use flotilla_peers::proxy::{LosingProxy, Loss};

    let moto = Moto::start();
    let (key, secret) = moto.key("plugin");
    let gcp = GcpCloud::start(true).await;
    // New instances reach the lists 3 s after the group counts them, so a listing right after
    // a lost write does not show what it added.
    gcp.with(|s| {
        s.operation_polls = 2;
        s.list_lag = Duration::from_secs(3);
    });
    let azure = AzureCloud::start(Options {
        mode: Mode::Flexible,
        list_lag: Duration::from_secs(3),
        ..Options::default()
    });
    let aws_proxy = LosingProxy::start(&moto.endpoint).await;
    let gcp_proxy = LosingProxy::start(&gcp.endpoint).await;
    let azure_proxy = LosingProxy::start(&azure.endpoint).await;
    azure.link_to(&azure_proxy.endpoint);
    aws_proxy.lose_next(
        |_, _, body| String::from_utf8_lossy(body).contains("Action=SetDesiredCapacity"),
        Loss::Stall(Duration::from_secs(3)),
    );
    gcp_proxy.lose_next(
        |m, path, _| m == "POST" && path.contains("/resize?"),
        Loss::Reset,
    );
    azure_proxy.lose_next(|m, _, _| m == "PATCH", Loss::GatewayTimeout);

    // No idle capacity and no scale-down while the test runs: the groups follow the leases.
    let quiet = |p: String| {
        p.replace("max_instances = 4", "max_instances = 6")
            .replace("capacity_per_instance = 2", "capacity_per_instance = 1")
            .replace(
                "idle_count = 2\nidle_time = \"3s\"",
                "idle_count = 0\nidle_time = \"10m\"",
            )
    };
    let at = Endpoints {
        aws: &aws_proxy.endpoint,
        gcp: &gcp_proxy.endpoint,
        gcp_tokens: &gcp.endpoint,
        azure: &azure_proxy.endpoint,
        azure_imds: &azure.endpoint,
    };
    let config = three_pools(&key, &at, quiet);
    let options = run_options(&secret);
    let f = Flotilla::start_with(tempfile::tempdir().expect("dir"), &config, options).await;

    let clouds = clouds(&moto, &gcp, &azure);
    let serve = |cloud: &'static str, n: usize| {
        let f = &f;
        async move {
            let path = format!("/v1/pools/{cloud}/leases");
            let mut ids = Vec::new();
            for _ in 0..n {
                let (code, body) = f.call("POST", &path, Some(serde_json::json!({}))).await;
                assert_eq!(code, 201, "{cloud}: {body}");
                ids.push(body["lease"]["id"].as_u64().expect("a lease id"));
            }
            for id in ids {
                let (code, body) = f.call("POST", &format!("{path}/{id}/acquire"), None).await;
                assert_eq!(
                    code,
                    200,
                    "{cloud}: a lease not served: {body}\n{}",
                    f.log()
                );
            }
        }
    };
    for (round, want) in [(1, 2u64), (2, 4)] {
        if round == 2 {
            // The next writes are answered; the polls of their operations are lost.
            gcp_proxy.lose_next(
                |m, path, _| m == "GET" && path.contains("/operations/"),
                Loss::Reset,
            );
            azure_proxy.lose_next(
                |m, path, _| m == "GET" && path.contains("/operations/"),
                Loss::GatewayTimeout,
            );
            aws_proxy.lose_next(
                |_, _, body| String::from_utf8_lossy(body).contains("Action=SetDesiredCapacity"),
                Loss::GatewayTimeout,
            );
        }
        let rounds = clouds.iter().map(|cloud| {
            largest_during(&cloud.size, async {
                serve(cloud.pool, 2).await;
                // Long enough for a retry on top of a lost write to show.
                tokio::time::sleep(Duration::from_secs(4)).await;
            })
        });
        let largest = futures_util::future::join_all(rounds).await;
        for (cloud, (largest, ())) in clouds.iter().zip(largest) {
            let name = cloud.pool;
            assert_eq!(
                largest,
                want,
                "{name}: round {round}: the group went above its leases' need\n{}",
                f.log()
            );
            assert_eq!((cloud.size)(), want, "{name}: round {round}");
        }
    }
    assert_eq!(aws_proxy.lost(), 2);
    assert_eq!(gcp_proxy.lost(), 2);
    assert_eq!(azure_proxy.lost(), 2);
}

/// A GCP pool, `name`, on the Compute stand-in at `cloud`: one job per instance, at most 4, no
/// idle capacity, unused instances gone after 2 s; `extra` lines go into its table.
fn gcp_pool(name: &str, cloud: &GcpCloud, extra: &str) -> String {
    let table = pool(
        name,
        flotilla_test_artifacts::GCP_PLUGIN,
        &cloud.endpoint,
        &format!(
            "project = \"ci-project-1\"\nzone = \"{ZONE}\"\nname = \"ci-runners\"\nmax_size = 10\nendpoint = \"{}\"",
            cloud.endpoint
        ),
        &format!(
            "name = \"gcp\"\nkind = \"gcp\"\nmetadata_endpoint = \"{}\"\nscopes = [\"https://www.googleapis.com/auth/compute\"]",
            cloud.endpoint
        ),
    );
    table
        .replace(
            "capacity_per_instance = 2",
            &format!("capacity_per_instance = 1\n{extra}"),
        )
        .replace(
            "idle_count = 2\nidle_time = \"3s\"",
            "idle_count = 0\nidle_time = \"2s\"",
        )
}

/// A spot pool whose zone is out of capacity hands its waiting jobs to its on-demand fallback:
/// both are served there, through the spot pool's own lease URLs, and neither group is ever
/// above its need. When capacity returns (and `fallback_hold` has passed), the next job is
/// served by spot, and the fallback scales in by its idle policy. The metrics say who served
/// what.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_pool_out_of_capacity_hands_its_jobs_to_its_on_demand_fallback() {
    let spot = GcpCloud::start(false).await;
    let on_demand = GcpCloud::start(false).await;
    spot.with(|s| {
        s.creation_error = Some((
            "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
            "Instance '{instance}' creation failed: The zone 'projects/ci-project-1/zones/us-central1-a' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.".into(),
        ));
    });
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ntoken = {{ value = \"{TOKEN}\" }}\nshutdown_grace = \"5s\"\n{}{}",
        gcp_pool(
            "spot",
            &spot,
            "fallback = \"on-demand\"\nfallback_hold = \"5s\""
        ),
        gcp_pool("on-demand", &on_demand, ""),
    );
    let f = Flotilla::start(tempfile::tempdir().expect("dir"), &config).await;
    let leases = "/v1/pools/spot/leases";

    let (spot_size, on_demand_size) = (
        || {
            u64::from(
                spot.with(|s| s.instances.iter().filter(|i| i.status == "RUNNING").count() as u32),
            )
        },
        || u64::from(on_demand.target_size()),
    );
    let served = largest_during(on_demand_size, async {
        largest_during(spot_size, async {
            let mut ids = Vec::new();
            for job in ["1", "2"] {
                let body = serde_json::json!({ "labels": { "job": job } });
                let (code, body) = f.call("POST", leases, Some(body)).await;
                assert_eq!(code, 201, "{body}");
                ids.push(body["lease"]["id"].as_u64().expect("a lease id"));
            }
            let acquires = ids.iter().map(|id| {
                let f = &f;
                async move {
                    f.call("POST", &format!("{leases}/{id}/acquire"), None)
                        .await
                }
            });
            futures_util::future::join_all(acquires).await
        })
        .await
    })
    .await;
    let (largest_on_demand, (largest_spot, acquired)) = served;
    for (code, body) in &acquired {
        assert_eq!(code, &200, "{body}\n{}", f.log());
        assert_eq!(body["pool"], "on-demand", "{body}");
    }
    assert_eq!(
        largest_spot, 0,
        "spot ran a machine in a zone out of capacity"
    );
    assert_eq!(largest_on_demand, 2, "the fallback went above its 2 jobs");
    assert_eq!(on_demand.live().len(), 2);

    // The handed leases are still the spot pool's to their holder: found by label, released
    // through its URL; and a label stays held once across the pair.
    let (code, found) = f.call("GET", &format!("{leases}?label=job=1"), None).await;
    assert_eq!(code, 200, "{found}");
    let first = found["leases"][0]["id"].as_u64().expect("found by label");
    assert_eq!(found["leases"][0]["handed_from"], "spot", "{found}");
    let again = serde_json::json!({ "labels": { "job": "1" } });
    let (code, body) = f.call("POST", leases, Some(again)).await;
    assert_eq!(code, 409, "a held label was reserved again: {body}");
    for (_, body) in &acquired {
        let id = body["lease"].as_u64().expect("id");
        let (code, body) = f
            .call("POST", &format!("{leases}/{id}/release"), None)
            .await;
        assert_eq!(code, 200, "{body}");
    }
    assert!(acquired.iter().any(|(_, b)| b["lease"] == first));

    // Capacity comes back; once the hold has passed, spot serves the next job, and the
    // fallback scales in by its idle policy.
    spot.with(|s| s.creation_error = None);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (code, body) = f
        .call(
            "POST",
            leases,
            Some(serde_json::json!({ "labels": { "job": "3" } })),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let id = body["lease"]["id"].as_u64().expect("a lease id");
    let (code, body) = f
        .call("POST", &format!("{leases}/{id}/acquire"), None)
        .await;
    assert_eq!(code, 200, "{body}\n{}", f.log());
    assert_eq!(body["pool"], "spot", "{body}\n{}", f.log());
    poll::until("the fallback to scale in", Duration::from_secs(30), || {
        let size = on_demand.target_size();
        async move {
            if size == 0 {
                Ok(())
            } else {
                Err(format!("on-demand at {size}"))
            }
        }
    })
    .await;

    let (_, text) = f.request("GET", "/metrics", None, None).await;
    let text = String::from_utf8_lossy(&text);
    for line in [
        "flotilla_fallback_handovers_total{fallback=\"on-demand\",pool=\"spot\"} 2",
        "flotilla_leases_acquired_total{pool=\"on-demand\"} 2",
        "flotilla_leases_acquired_total{pool=\"spot\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

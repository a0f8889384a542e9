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

mod common;

use std::time::Duration;

use flotilla_harness::poll;
use flotilla_peers::azure_cloud::{self, AzureCloud, Mode, Options};
use flotilla_peers::gcp_cloud::{GcpCloud, REGION};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cloud_scales_through_flotilla_run_and_the_lease_api() {
    let moto = Moto::start();
    let (key, secret) = moto.key("plugin");
    let gcp = GcpCloud::start(true).await;
    let azure = AzureCloud::start(Options {
        mode: Mode::Flexible,
        ..Options::default()
    });

    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ntoken = {{ value = \"{TOKEN}\" }}\nshutdown_grace = \"5s\"\n{}{}{}",
        pool(
            "aws",
            flotilla_test_artifacts::AWS_PLUGIN,
            &moto.endpoint,
            &format!(
                "name = \"ci-runners\"\nregion = \"us-east-1\"\nendpoint = \"{}\"",
                moto.endpoint
            ),
            &format!(
                "name = \"aws\"\nkind = \"aws-sigv4\"\naccess_key_id = {{ value = \"{key}\" }}\nsecret_access_key = {{ env = \"FLOTILLA_TEST_AWS_SECRET\" }}"
            ),
        ),
        pool(
            "gcp",
            flotilla_test_artifacts::GCP_PLUGIN,
            &gcp.endpoint,
            &format!(
                "project = \"ci-project-1\"\nregion = \"{REGION}\"\nname = \"ci-runners\"\nmax_size = 10\nendpoint = \"{}\"",
                gcp.endpoint
            ),
            &format!(
                "name = \"gcp\"\nkind = \"gcp\"\nmetadata_endpoint = \"{}\"\nscopes = [\"https://www.googleapis.com/auth/compute\"]",
                gcp.endpoint
            ),
        ),
        pool(
            "azure",
            flotilla_test_artifacts::AZURE_PLUGIN,
            &azure.endpoint,
            &format!(
                "subscription_id = \"{}\"\nresource_group = \"ci-rg\"\nname = \"ci-vmss\"\nendpoint = \"{}\"",
                azure_cloud::SUBSCRIPTION,
                azure.endpoint
            ),
            &format!(
                "name = \"azure\"\nkind = \"azure\"\nimds_endpoint = \"{}\"",
                azure.endpoint
            ),
        ),
    );
    let options = common::Options::default()
        .env("FLOTILLA_TEST_AWS_SECRET", &secret)
        .env_remove("AZURE_CLIENT_ID")
        .env_remove("AZURE_TENANT_ID")
        .env_remove("AZURE_FEDERATED_TOKEN_FILE");
    let f = Flotilla::start_with(tempfile::tempdir().expect("dir"), &config, options).await;

    let clouds = [
        Cloud {
            pool: "aws",
            address_prefix: "10.20.",
            size: Box::new(|| moto.desired()),
        },
        Cloud {
            pool: "gcp",
            address_prefix: "10.128.0.",
            size: Box::new(|| u64::from(gcp.target_size())),
        },
        Cloud {
            pool: "azure",
            address_prefix: "10.0.",
            size: Box::new(|| u64::from(azure.capacity())),
        },
    ];
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

//! Durable leases: `flotilla run` is killed with SIGKILL at random points of lease traffic and
//! started again on the same state directory, 20 times. After each restart every lease the API
//! acknowledged is there in the state it was acknowledged in (an operation in flight at the
//! kill may have happened or not), released leases are gone, and new lease ids never repeat an
//! old one. Against moto behind a latency proxy, the kills also land in the middle of scale-up
//! and scale-down calls: no instance leaks and no instance holding a lease is deleted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use common::{Flotilla, TOKEN};
use flotilla_example_cloud::{ExampleCloud, Options};
use flotilla_peers::moto::Moto;
use flotilla_peers::proxy::LatencyProxy;
use flotilla_test_artifacts as guests;

/// What the client last saw acknowledged for a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Acked {
    Reserved,
    Acquired(String),
    Gone,
}

/// The client's record: acknowledged states, and the lease an operation was in flight on.
#[derive(Debug, Default)]
struct Book {
    acked: BTreeMap<u64, Acked>,
    in_flight: Option<u64>,
    reserving: bool,
}

/// A small xorshift, so each run's traffic differs but the test needs no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

async fn call(
    client: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
) -> Option<(u16, Value)> {
    let r = client
        .request(method, format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    let body = r.bytes().await.ok()?;
    Some((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

/// Lease traffic until the server dies: reserve, acquire, release and unreserve at random.
async fn traffic(base: String, pool: &'static str, book: Arc<Mutex<Book>>, seed: u64) {
    let client = reqwest::Client::new();
    let mut rng = Rng(seed | 1);
    let pools = format!("/v1/pools/{pool}/leases");
    let pools = pools.as_str();
    loop {
        let live: Vec<(u64, Acked)> = book
            .lock()
            .expect("book")
            .acked
            .iter()
            .filter(|(_, a)| **a != Acked::Gone)
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        let pick = live.get((rng.next() as usize) % live.len().max(1)).cloned();
        let op = rng.next() % 4;
        match (op, pick) {
            (0, _) | (_, None) => {
                book.lock().expect("book").reserving = true;
                let Some((code, body)) = call(&client, &base, reqwest::Method::POST, pools).await
                else {
                    return;
                };
                let mut b = book.lock().expect("book");
                b.reserving = false;
                if code == 201 {
                    let id = body["lease"]["id"].as_u64().expect("id");
                    b.acked.insert(id, Acked::Reserved);
                }
            }
            (_, Some((id, Acked::Reserved))) => {
                book.lock().expect("book").in_flight = Some(id);
                let path = if op == 1 {
                    format!("{pools}/{id}")
                } else {
                    format!("{pools}/{id}/acquire")
                };
                let method = if op == 1 {
                    reqwest::Method::DELETE
                } else {
                    reqwest::Method::POST
                };
                let Some((code, body)) = call(&client, &base, method, &path).await else {
                    return;
                };
                let mut b = book.lock().expect("book");
                b.in_flight = None;
                if code == 200 {
                    let state = if op == 1 {
                        Acked::Gone
                    } else {
                        Acked::Acquired(body["instance"].as_str().expect("instance").to_string())
                    };
                    b.acked.insert(id, state);
                }
            }
            (_, Some((id, _))) => {
                book.lock().expect("book").in_flight = Some(id);
                let path = format!("{pools}/{id}/release");
                let Some((code, _)) = call(&client, &base, reqwest::Method::POST, &path).await
                else {
                    return;
                };
                let mut b = book.lock().expect("book");
                b.in_flight = None;
                if code == 200 {
                    b.acked.insert(id, Acked::Gone);
                }
            }
        }
    }
}

/// Waits for the pool to be ready, runs lease traffic for a random while in `window_ms`,
/// kills the process and starts it again. Returns the next seed.
async fn kill_during_traffic(
    flotilla: &mut Flotilla,
    pool: &'static str,
    book: &Arc<Mutex<Book>>,
    seed: u64,
    window_ms: std::ops::Range<u64>,
) -> u64 {
    wait_ready(flotilla, pool, "the pool to be ready").await;
    let task = tokio::spawn(traffic(flotilla.base.clone(), pool, book.clone(), seed));
    let seed = Rng(seed).next();
    let window = window_ms.start + seed % (window_ms.end - window_ms.start);
    // Deliberate: the kill lands at a random point of the traffic, which is the test.
    tokio::time::sleep(Duration::from_millis(window)).await;
    flotilla.restart().await; // SIGKILL, then start on the same state directory
    task.abort();
    let _ = task.await;
    wait_ready(flotilla, pool, "the pool to be ready again").await;
    seed
}

async fn wait_ready(flotilla: &Flotilla, pool: &str, what: &str) {
    flotilla
        .wait_for("/v1/pools", what, |b| {
            b["pools"][pool]["status"]["health"]["state"] == "ready"
        })
        .await;
}

/// After a restart: every acknowledged lease is as acknowledged, nothing unacknowledged exists
/// but a reservation in flight at the kill, and a new lease takes an id above every old one.
/// Settles the book to what the server says and returns the highest id seen.
async fn check_after_restart(
    run: usize,
    flotilla: &Flotilla,
    pool: &str,
    book: &Mutex<Book>,
    highest_before: u64,
) -> u64 {
    let leases_path = format!("/v1/pools/{pool}/leases");
    let (_, leases) = flotilla.call("GET", &leases_path, None).await;
    let found: BTreeMap<u64, Value> = leases["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| (l["id"].as_u64().expect("id"), l["state"].clone()))
        .collect();
    let highest = {
        let mut b = book.lock().expect("book");
        let in_flight = b.in_flight.take();
        for (id, acked) in &b.acked {
            let now = found.get(id);
            let ok = match (acked, now) {
                (Acked::Gone, None) => true,
                (Acked::Reserved, Some(s)) => s["state"] == "reserved",
                (Acked::Acquired(instance), Some(s)) => {
                    s["state"] == "acquired" && s["instance"] == instance.as_str()
                }
                _ => false,
            };
            // The operation in flight at the kill may or may not have been applied.
            let maybe = Some(*id) == in_flight;
            assert!(
                ok || maybe,
                "run {run}: lease {id} was acknowledged as {acked:?}, now {now:?}\n{}",
                flotilla.log()
            );
        }
        // Leases nobody acknowledged can exist only from a reservation in flight at the kill.
        let unknown: Vec<&u64> = found
            .keys()
            .filter(|id| !b.acked.contains_key(id))
            .collect();
        assert!(
            unknown.len() <= usize::from(b.reserving),
            "run {run}: unacknowledged leases {unknown:?}"
        );
        for id in unknown.into_iter().copied().collect::<Vec<_>>() {
            b.acked.insert(id, Acked::Reserved);
        }
        b.reserving = false;
        // Settle the uncertain one to what the server now says.
        if let Some(id) = in_flight {
            let state = match found.get(&id) {
                None => Acked::Gone,
                Some(s) if s["state"] == "reserved" => Acked::Reserved,
                Some(s) => Acked::Acquired(s["instance"].as_str().unwrap_or_default().to_string()),
            };
            b.acked.insert(id, state);
        }
        b.acked.keys().max().copied().unwrap_or(0)
    };
    assert!(highest >= highest_before);
    // A new lease never takes an old id.
    let (code, body) = flotilla.call("POST", &leases_path, Some(json!({}))).await;
    if code == 201 {
        let id = body["lease"]["id"].as_u64().expect("id");
        assert!(id > highest, "run {run}: new id {id} <= {highest}");
        let (code, _) = flotilla
            .call("DELETE", &format!("{leases_path}/{id}"), None)
            .await;
        assert_eq!(code, 200);
    }
    highest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_leases_survive_kill_9_at_random_points() {
    // The cloud lives in this process, so its instances outlive every flotilla process.
    let cloud = ExampleCloud::start(Options {
        group: "ci".into(),
        max_size: 4,
        token: Some("tkn-123".into()),
    })
    .await
    .expect("the example cloud");
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        r#"state_dir = "state"

[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}

[[pool]]
name = "local"
plugin = "{plugin}"
capacity_per_instance = 4
max_instances = 4
instance_acquire_timeout = "1s"
update_interval = "1s"
allowed_outbound_hosts = ["{endpoint}"]
allowed_ip_ranges = ["127.0.0.0/8"]

[[pool.credentials]]
name = "example"
kind = "bearer"
token = {{ value = "tkn-123" }}
hosts = ["{endpoint}"]

[pool.plugin_config]
endpoint = "{endpoint}"
group = "ci"
credential = "example"

[[pool.policy]]
idle_count = 16
idle_time = "1h"
"#,
        plugin = guests::TEMPLATE_PLUGIN,
        endpoint = cloud.endpoint(),
    );
    let mut flotilla = Flotilla::start(dir, &config).await;
    let book = Arc::new(Mutex::new(Book::default()));
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut highest_before = 0;
    for run in 0..20 {
        seed = kill_during_traffic(&mut flotilla, "local", &book, seed, 30..330).await;
        highest_before = check_after_restart(run, &flotilla, "local", &book, highest_before).await;
    }
    let acked = book.lock().expect("book").acked.len();
    assert!(acked >= 20, "the traffic made only {acked} leases");
    let (_, pools) = flotilla.call("GET", "/v1/pools", None).await;
    // The metrics count what the last start restored, as /v1/pools does.
    let restored = pools["pools"]["local"]["status"]["restart"]["leases_restored"]
        .as_u64()
        .expect("leases_restored");
    let (_, metrics) = flotilla.request("GET", "/metrics", None, None).await;
    let metrics = String::from_utf8_lossy(&metrics);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("flotilla_lease_events_total{event=\"restored\""))
        .unwrap_or_else(|| panic!("no restored-leases metric:\n{metrics}"));
    assert!(
        line.ends_with(&format!(" {restored}")),
        "{line} vs {restored}"
    );
    assert!(
        pools["pools"]["local"]["status"]["restart"]["adopted_after_ms"]
            .as_u64()
            .is_some(),
        "{pools}"
    );
    // Twenty kills later, the lease history is whole and reads as `tune`'s input.
    let history = std::fs::read_to_string(flotilla.dir.path().join("state/history.jsonl"))
        .expect("the lease history");
    let filter = flotilla_tune::history::Filter {
        pool: Some("local".into()),
        ..Default::default()
    };
    let read = flotilla_tune::history::parse(&history, &filter)
        .unwrap_or_else(|e| panic!("{e:?}\n{history}"));
    assert!(!read.jobs.is_empty(), "{history}");
}

/// The same kills against moto behind a proxy that holds each request 150 ms, so they land in
/// the middle of `SetDesiredCapacity` and `TerminateInstanceInAutoScalingGroup` as the lease
/// traffic scales the group up and down. After each restart, besides the leases' checks: every
/// instance the group has is one the pool knows (nothing leaked), and every instance holding an
/// acquired lease is still alive, and held by that lease alone, once an idle instance would
/// have been scaled down. At the end, with every lease released, the group shrinks to nothing
/// (the policy keeps no idle instance).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_cloud_scaling_leaks_no_instance_and_deletes_no_leased_one() {
    let moto = Moto::start_with_max(6);
    let proxy = LatencyProxy::start(&moto.endpoint, Duration::from_millis(150)).await;
    let (key, secret) = moto.key("plugin");
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        r#"state_dir = "state"

[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}

[[pool]]
name = "aws"
plugin = "{plugin}"
capacity_per_instance = 1
max_instances = 6
instance_acquire_timeout = "3s"
update_interval = "1s"
allowed_outbound_hosts = ["{endpoint}"]
allowed_ip_ranges = ["127.0.0.0/8"]

[pool.plugin_config]
name = "ci-runners"
region = "us-east-1"
endpoint = "{endpoint}"

[[pool.credentials]]
name = "aws"
kind = "aws-sigv4"
access_key_id = {{ value = "{key}" }}
secret_access_key = {{ value = "{secret}" }}
hosts = ["{endpoint}"]

[[pool.policy]]
idle_count = 0
idle_time = "1s"
"#,
        plugin = guests::AWS_PLUGIN,
        endpoint = proxy.endpoint,
    );
    let mut flotilla = Flotilla::start(dir, &config).await;
    let book = Arc::new(Mutex::new(Book::default()));
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut highest_before = 0;
    let mut scaled = 0;
    for run in 0..20 {
        let before = moto.live();
        seed = kill_during_traffic(&mut flotilla, "aws", &book, seed, 300..2300).await;
        highest_before = check_after_restart(run, &flotilla, "aws", &book, highest_before).await;
        // Long enough for an idle instance to be scaled down (idle_time 1 s, updates every 1 s):
        // one the restart forgot was leased would go now.
        // Deliberate: waits out idle_time for a removal that must not happen.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let live = moto.live();
        scaled += usize::from(live != before);
        let mut holders = BTreeMap::new();
        for (id, acked) in &book.lock().expect("book").acked {
            if let Acked::Acquired(instance) = acked {
                assert!(
                    live.contains(instance),
                    "run {run}: lease {id}'s instance {instance} was deleted under it: {live:?}"
                );
                // One slot per instance: a restart must not hand a held slot out again.
                if let Some(other) = holders.insert(instance.clone(), *id) {
                    panic!("run {run}: leases {other} and {id} both hold {instance}");
                }
            }
        }
        // Every instance the group has is adopted (one launched by a call in flight at the
        // kill shows up at the next update).
        flotilla
            .wait_for("/v1/pools/aws/instances", "every instance adopted", |b| {
                let known: Vec<&str> = b["instances"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|i| i["id"].as_str()).collect())
                    .unwrap_or_default();
                moto.live().iter().all(|id| known.contains(&id.as_str()))
            })
            .await;
    }
    assert!(scaled >= 5, "the group changed in only {scaled} of 20 runs");
    // Every lease released: the group comes down to nothing, as the policy keeps no idle one.
    let live: Vec<(u64, Acked)> = book
        .lock()
        .expect("book")
        .acked
        .iter()
        .map(|(id, a)| (*id, a.clone()))
        .collect();
    for (id, acked) in live {
        let path = match acked {
            Acked::Gone => continue,
            Acked::Reserved => format!("/v1/pools/aws/leases/{id}"),
            Acked::Acquired(_) => format!("/v1/pools/aws/leases/{id}/release"),
        };
        let method = if path.ends_with("release") {
            "POST"
        } else {
            "DELETE"
        };
        let (code, body) = flotilla.call(method, &path, None).await;
        assert_eq!(code, 200, "{method} {path}: {body}");
    }
    // Every instance is idle at once, so several may go in one update: wait for the end state,
    // not for a count on the way there.
    flotilla
        .wait_for(
            "/v1/pools/aws/instances",
            "the group to shrink to nothing",
            |b| {
                let known = b["instances"].as_array().map_or(0, Vec::len);
                known == 0 && moto.live().is_empty()
            },
        )
        .await;
}

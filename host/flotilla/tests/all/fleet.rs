//! The fleet end to end, as a job runner sees it: `flotilla run` with the static plugin listing
//! two real machines (Debian sshd on loopback, the pool's key in their authorized_keys), one
//! real Docker Engine behind them, the instances view, the metrics, and a container run on a
//! leased instance through the host's Docker handle, with no key in the runner's hands.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Flotilla, TOKEN};

use flotilla_harness::poll;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use flotilla_connector::PoolKey;
use flotilla_peers::dockerd::{Dockerd, busybox_rootfs_tar};
use flotilla_peers::sshd::Sshd;
use flotilla_test_artifacts as guests;

fn config(key: &std::path::Path, machines: &[&Sshd], docker: &Dockerd) -> String {
    let hosts: Vec<String> = machines
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                "{{ id = \"m{}\", address = \"127.0.0.1\", port = {}, username = \"root\" }}",
                i + 1,
                m.port
            )
        })
        .collect();
    format!(
        r#"state_dir = "state"

[server]
listen = "127.0.0.1:0"
token = {{ value = "{TOKEN}" }}
shutdown_grace = "5s"

[[pool]]
name = "fleet"
plugin = "{plugin}"
capacity_per_instance = 1
max_instances = {n}
instance_acquire_timeout = "30s"
update_interval = "1s"

[pool.plugin_config]
hosts = [{hosts}]

[pool.connector]
username = "root"
allowed_ranges = ["127.0.0.0/8"]
ssh_key = {{ file = "{key}" }}
ready_command = "test -d /tmp"
docker_socket = "{socket}"
ping_interval = "1s"

[[pool.policy]]
idle_count = {n}
idle_time = "1h"
"#,
        plugin = guests::STATIC_PLUGIN,
        n = machines.len(),
        hosts = hosts.join(", "),
        key = key.display(),
        socket = docker.socket().display(),
    )
}

/// Reads an HTTP/1.1 response head from a raw stream.
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).await.expect("read"),
            1,
            "closed early"
        );
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[tokio::test]
async fn a_job_runs_in_a_container_on_a_leased_instance_through_the_hosts_docker_handle() {
    // One dockerd at a time, with the other modules' engines (their cgroups would race).
    let _one = common::fleet::DOCKER.lock().await;
    let docker = Dockerd::start();
    let dir = tempfile::tempdir().expect("dir");
    let key = PoolKey::load_or_generate(&dir.path().join("keys"), "fleet").expect("key");
    let key_file = dir.path().join("keys/fleet/id_ed25519");
    let m1 = Sshd::start(key.public_openssh());
    let m2 = Sshd::start(key.public_openssh());
    let text = config(&key_file, &[&m1, &m2], &docker);
    let f = Flotilla::start(dir, &text).await;

    // Both machines become ready, with where the host reaches them.
    let instances = poll::until(
        "both machines to be ready",
        Duration::from_secs(30),
        || async {
            let (code, body) = f.call("GET", "/v1/pools/fleet/instances", None).await;
            assert_eq!(code, 200, "{body}");
            let list = body["instances"].as_array().cloned().unwrap_or_default();
            if list.len() == 2 && list.iter().all(|i| i["state"] == "ready") {
                Ok(list)
            } else {
                Err(format!("{body}\n{}", f.log()))
            }
        },
    )
    .await;
    assert_eq!(instances[0]["id"], "m1");
    assert_eq!(
        instances[0]["address"],
        format!("127.0.0.1:{}", m1.port),
        "{instances:?}"
    );
    assert!(instances[0]["ready_since"].as_u64().is_some());
    assert_eq!(instances[0]["use_count"], 0);

    // A reserved lease has no Docker handle yet.
    let (code, body) = f.call("POST", "/v1/pools/fleet/leases", None).await;
    assert_eq!(code, 201, "{body}");
    let lease = body["lease"]["id"].as_u64().expect("lease id");
    let docker_path = format!("/v1/pools/fleet/leases/{lease}/docker");
    let (code, body) = f.call("GET", &format!("{docker_path}/_ping"), None).await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (409, &json!("not_acquired"))
    );

    // The acquire reads the connect-info answer readiness got: no plugin call of its own.
    let connect_infos = || async {
        let (_, text) = f.request("GET", "/metrics", None, None).await;
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| {
                l.starts_with("flotilla_provider_operations_total")
                    && l.contains("function=\"connect-info\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let asked_before = connect_infos().await;
    let (code, body) = f
        .call(
            "POST",
            &format!("/v1/pools/fleet/leases/{lease}/acquire"),
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["docker"]["path"], docker_path.as_str());
    assert_eq!(body["connection"]["port"], m1.port, "{body}");
    assert!(asked_before >= 2, "readiness asked for both machines");
    assert_eq!(
        connect_infos().await,
        asked_before,
        "the acquire asked the plugin again"
    );
    assert!(!body.to_string().contains("PRIVATE KEY"));

    // The handle needs the API token, like the rest of /v1.
    let (code, _) = f
        .request("GET", &format!("{docker_path}/_ping"), None, None)
        .await;
    assert_eq!(code, 401);
    let (code, pong) = f
        .request("GET", &format!("{docker_path}/_ping"), None, Some(TOKEN))
        .await;
    assert_eq!((code, &pong[..]), (200, &b"OK"[..]));

    // Import a FROM-scratch busybox image (a streamed request body), then run a job in it.
    let tar = busybox_rootfs_tar();
    let (code, body) = f
        .request(
            "POST",
            &format!("{docker_path}/images/create?fromSrc=-&repo=flotilla-job&tag=1"),
            Some(reqwest::Body::from(tar)),
            Some(TOKEN),
        )
        .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let create = json!({
        "Image": "flotilla-job:1",
        "Cmd": ["/bin/sh", "-c", "echo job output; exit 3"],
        "HostConfig": { "NetworkMode": "none" },
    });
    let (code, body) = f
        .call(
            "POST",
            &format!("{docker_path}/containers/create"),
            Some(create),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let id = body["Id"].as_str().expect("container id").to_string();
    let (code, _) = f
        .call(
            "POST",
            &format!("{docker_path}/containers/{id}/start"),
            None,
        )
        .await;
    assert_eq!(code, 204);
    let (code, body) = f
        .call("POST", &format!("{docker_path}/containers/{id}/wait"), None)
        .await;
    assert_eq!((code, &body["StatusCode"]), (200, &json!(3)), "{body}");
    let (code, logs) = f
        .request(
            "GET",
            &format!("{docker_path}/containers/{id}/logs?stdout=1"),
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(code, 200);
    assert!(
        String::from_utf8_lossy(&logs).contains("job output"),
        "{logs:?}"
    );

    // An interactive job: attach upgrades the connection, and bytes flow both ways.
    let create = json!({
        "Image": "flotilla-job:1",
        "Cmd": ["/bin/sh", "-c", "read line; echo got $line"],
        "OpenStdin": true, "StdinOnce": true, "AttachStdin": true, "AttachStdout": true,
        "Tty": true,
        "HostConfig": { "NetworkMode": "none" },
    });
    let (code, body) = f
        .call(
            "POST",
            &format!("{docker_path}/containers/create"),
            Some(create),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let id = body["Id"].as_str().expect("container id").to_string();
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", f.port()))
        .await
        .expect("connect");
    let attach = format!(
        "POST {docker_path}/containers/{id}/attach?stream=1&stdin=1&stdout=1 HTTP/1.1\r\n\
         Host: flotilla\r\nAuthorization: Bearer {TOKEN}\r\nConnection: Upgrade\r\n\
         Upgrade: tcp\r\nContent-Length: 0\r\n\r\n"
    );
    raw.write_all(attach.as_bytes()).await.expect("write");
    let head = read_head(&mut raw).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let (code, _) = f
        .call(
            "POST",
            &format!("{docker_path}/containers/{id}/start"),
            None,
        )
        .await;
    assert_eq!(code, 204);
    raw.write_all(b"hello\n").await.expect("stdin");
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&seen).contains("got hello") {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            String::from_utf8_lossy(&seen)
        );
        let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut buf))
            .await
            .expect("attach output in time")
            .expect("read");
        assert!(n > 0, "{:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }

    // Released: the handle is gone with the lease.
    let (code, _) = f
        .call(
            "POST",
            &format!("/v1/pools/fleet/leases/{lease}/release"),
            None,
        )
        .await;
    assert_eq!(code, 200);
    let (code, _) = f.call("GET", &format!("{docker_path}/_ping"), None).await;
    assert_eq!(code, 404);

    // Metrics: readiness checks and idle pings by outcome, in a format promtool accepts.
    let families = [
        r#"flotilla_instance_probes_total{outcome="ok",plugin="#,
        r#"probe="readiness"}"#,
        r#"probe="ping"}"#,
        "flotilla_instance_probe_duration_seconds_bucket{",
    ];
    let metrics = poll::until("the probe metrics", Duration::from_secs(8), || async {
        let (_, metrics) = f.request("GET", "/metrics", None, None).await;
        let metrics = String::from_utf8_lossy(&metrics).into_owned();
        match families.iter().find(|family| !metrics.contains(**family)) {
            None => Ok(metrics),
            Some(family) => Err(format!("{family} missing:\n{metrics}")),
        }
    })
    .await;
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    promtool
        .stdin
        .take()
        .map(|mut i| i.write_all(metrics.as_bytes()));
    let out = promtool.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(m2);
    drop(m1);
}

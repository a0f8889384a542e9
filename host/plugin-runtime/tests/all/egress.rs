//! The hostile-guest suite for outbound HTTP: every attack fails, the host and a
//! well-behaved plugin in the same process keep working, and no secret leaks.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use flotilla_credentials::{Credential, CredentialKind, Secret, SecretSource};
use flotilla_harness::ProbeLog;
use flotilla_net::AllowList;
use flotilla_peers::peer::Peer;
use flotilla_plugin_runtime::WasmProvider;

const SECRET: &str = "s3cr3t-t0ken-do-not-leak";

fn allow(entries: &[String]) -> AllowList {
    AllowList::parse(entries).unwrap_or_else(|e| panic!("{e:?}"))
}

fn loopback() -> Vec<ipnet::IpNet> {
    vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))]
}

/// The egress guest and what it reports through the test probe.
struct Egress {
    provider: WasmProvider,
    probe: ProbeLog,
}

impl std::ops::Deref for Egress {
    type Target = WasmProvider;
    fn deref(&self) -> &WasmProvider {
        &self.provider
    }
}

fn egress_plugin(configure: impl FnOnce(&mut Sandbox)) -> Egress {
    let probe = ProbeLog::default();
    let mut sandbox = quick_sandbox(&[]);
    sandbox.probe = Some(probe.probe());
    configure(&mut sandbox);
    Egress {
        provider: load(guests::EGRESS).provider("egress", sandbox),
        probe,
    }
}

/// Runs one command in the guest and returns its report.
async fn attack(p: &Egress, cmd: Value) -> Value {
    if p.update().await.is_err() {
        must(p.init("{}")).await;
    }
    p.probe.clear();
    must(p.connect_info(&cmd.to_string())).await;
    p.probe.json("report")
}

fn denied(report: &Value) -> bool {
    report["results"][0]["error"]
        .as_str()
        .is_some_and(|e| e.contains("HttpRequestDenied"))
}

#[tokio::test]
async fn hosts_ports_and_schemes_off_the_list_are_denied() {
    let other = bystander().await;
    let peer = Peer::start().await;
    let port = peer.addr.port();
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://127.0.0.1:{port}")]);
        s.egress.allowed_ip_ranges = loopback();
    });
    // Control: the allowed target works, so the denials below are the policy's doing.
    let ok = attack(&p, json!({"url": peer.url("/ok")})).await;
    assert_eq!(ok["results"][0]["status"], 200, "{ok}");
    for url in [
        format!("http://127.0.0.2:{port}/ok"),       // another host
        format!("http://localhost:{port}/ok"),       // another name for it
        format!("http://127.0.0.1:{}/ok", port + 1), // wrong port
        format!("https://127.0.0.1:{port}/ok"),      // wrong scheme
    ] {
        let r = attack(&p, json!({ "url": url })).await;
        assert!(denied(&r), "{url}: {r}");
    }
    assert_eq!(peer.arrivals().len(), 1, "only the control request arrived");
    assert_bystander_works(&other).await;
}

#[tokio::test]
async fn allowed_names_that_resolve_to_forbidden_addresses_are_denied() {
    let other = bystander().await;
    let peer = Peer::start().await;
    let port = peer.addr.port();
    let logs = LogCapture::default();
    let _guard = logs.install();
    for (name, ip) in [
        ("api.test", "127.0.0.1"),
        ("metadata.test", "169.254.169.254"),
        ("lan.test", "10.1.2.3"),
        // IPv6 forms that carry the metadata service or loopback (found in review).
        ("compat.test", "::169.254.169.254"),
        ("nat64.test", "64:ff9b::a9fe:a9fe"),
        ("nat64-local.test", "64:ff9b:1::a9fe:a9fe"),
        ("sixtofour.test", "2002:7f00:1::"),
        ("siit.test", "::ffff:0:7f00:1"),
        ("sitelocal.test", "fec0::1"),
    ] {
        let p = egress_plugin(|s| {
            s.egress.allow = allow(&[format!("http://{name}:{port}")]);
            let ip: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{e}"));
            s.egress.resolve_overrides = BTreeMap::from([(name.to_string(), vec![ip])]);
        });
        let r = attack(&p, json!({"url": format!("http://{name}:{port}/ok")})).await;
        assert!(denied(&r), "{name} -> {ip}: {r}");
        let shown: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            logs.text().contains(&format!("resolves to {shown}")),
            "reason logged for {ip}"
        );
    }
    assert!(peer.arrivals().is_empty());
    // Control: the same name works once the pool explicitly allows loopback.
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://api.test:{port}")]);
        s.egress.resolve_overrides =
            BTreeMap::from([("api.test".to_string(), vec![peer.addr.ip()])]);
        s.egress.allowed_ip_ranges = loopback();
    });
    let r = attack(&p, json!({"url": format!("http://api.test:{port}/ok")})).await;
    assert_eq!(r["results"][0]["status"], 200, "{r}");
    assert_eq!(peer.arrivals().len(), 1);
    assert_bystander_works(&other).await;
}

#[tokio::test]
async fn a_huge_response_is_cut_at_the_cap() {
    let other = bystander().await;
    let peer = Peer::start().await;
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://{}", peer.addr)]);
        s.egress.allowed_ip_ranges = loopback();
        s.egress.max_response_bytes = 4 << 20;
        s.limits.default_deadline = Duration::from_secs(20);
    });
    let r = attack(&p, json!({"url": peer.url("/huge")})).await;
    let result = &r["results"][0];
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.contains("exceeds limit")),
        "{r}"
    );
    assert!(
        result["bytes"].as_u64().is_some_and(|b| b <= 4 << 20),
        "{r}"
    );
    assert_bystander_works(&other).await;
}

#[tokio::test]
async fn a_server_that_stalls_after_the_headers_does_not_hang_the_host() {
    let other = bystander().await;
    let peer = Peer::start().await;
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://{}", peer.addr)]);
        s.egress.allowed_ip_ranges = loopback();
        s.egress.max_between_bytes_timeout = Duration::from_millis(300);
    });
    let start = Instant::now();
    let r = attack(&p, json!({"url": peer.url("/stall")})).await;
    assert!(
        r["results"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("timeout")),
        "{r}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // With a generous between-bytes clamp, the export deadline still ends the call.
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://{}", peer.addr)]);
        s.egress.allowed_ip_ranges = loopback();
        s.limits.default_deadline = Duration::from_millis(500);
    });
    must(p.init("{}")).await;
    let start = Instant::now();
    let r = p
        .connect_info(&json!({"url": peer.url("/stall")}).to_string())
        .await;
    assert!(matches!(r, Err(CallError::Timeout { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_bystander_works(&other).await;
}

#[tokio::test]
async fn a_request_flood_is_capped_per_call() {
    let other = bystander().await;
    let peer = Peer::start().await;
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://{}", peer.addr)]);
        s.egress.allowed_ip_ranges = loopback();
        s.egress.max_requests_per_call = 50;
        s.limits.default_deadline = Duration::from_secs(20);
    });
    let r = attack(&p, json!({"url": peer.url("/ok"), "count": 1000})).await;
    let results = r["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 1000);
    assert!(
        results[..50].iter().all(|r| r["status"] == 200),
        "{}",
        results[0]
    );
    assert!(
        results[50..]
            .iter()
            .all(|r| r["error"].as_str().is_some_and(|e| e.contains("Denied")))
    );
    assert_eq!(peer.arrivals().len(), 50);
    // The cap is per call: the next call may make requests again.
    let again = attack(&p, json!({"url": peer.url("/ok")})).await;
    assert_eq!(again["results"][0]["status"], 200);
    assert_bystander_works(&other).await;
}

fn bearer(name: &str, hosts: &[String]) -> Credential {
    Credential {
        name: name.to_string(),
        kind: CredentialKind::Bearer {
            token: SecretSource::Value(Secret::new(SECRET)),
        },
        hosts: allow(hosts),
    }
}

#[tokio::test]
async fn credentials_are_injected_by_the_host_and_never_seen_by_the_guest() {
    let other = bystander().await;
    let logs = LogCapture::default();
    let _guard = logs.install();
    let cloud = Peer::start().await;
    let elsewhere = Peer::start().await;
    let cloud_host = format!("http://{}", cloud.addr);
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[cloud_host.clone(), format!("http://{}", elsewhere.addr)]);
        s.egress.allowed_ip_ranges = loopback();
        s.egress.credentials = vec![
            bearer("api", std::slice::from_ref(&cloud_host)),
            Credential {
                name: "basic".into(),
                kind: CredentialKind::Basic {
                    username: "robot".into(),
                    password: SecretSource::Value(Secret::new(SECRET)),
                },
                hosts: allow(std::slice::from_ref(&cloud_host)),
            },
        ];
    });

    let r = attack(&p, json!({"url": cloud.url("/ok"), "credential": "api"})).await;
    assert_eq!(r["results"][0]["status"], 200, "{r}");
    let arrived = cloud.arrivals();
    let auth = |a: &flotilla_peers::peer::Arrival| {
        a.headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        auth(&arrived[0]).as_deref(),
        Some(format!("Bearer {SECRET}").as_str()),
        "injected"
    );
    assert!(
        !arrived[0]
            .headers
            .iter()
            .any(|(k, _)| k == "flotilla-credential"),
        "the reserved header is stripped"
    );
    // The guest's own view of its request holds the name, not the secret.
    let sent = r["sent_headers"].to_string();
    assert!(
        sent.contains("flotilla-credential") && sent.contains("api"),
        "{sent}"
    );
    assert!(
        !r.to_string().contains(SECRET),
        "the secret reached the guest: {r}"
    );

    let r = attack(&p, json!({"url": cloud.url("/ok"), "credential": "basic"})).await;
    assert_eq!(r["results"][0]["status"], 200, "{r}");
    assert!(auth(&cloud.arrivals()[1]).is_some_and(|v| v.starts_with("Basic ")));

    // Attached to a host it is not bound to: refused, and nothing arrives there.
    let r = attack(
        &p,
        json!({"url": elsewhere.url("/ok"), "credential": "api"}),
    )
    .await;
    assert!(denied(&r), "{r}");
    assert!(elsewhere.arrivals().is_empty());
    // An unknown credential name is a guest-visible error.
    let r = attack(&p, json!({"url": cloud.url("/ok"), "credential": "nope"})).await;
    assert!(denied(&r), "{r}");
    assert_eq!(cloud.arrivals().len(), 2);

    let text = logs.text();
    assert!(
        text.contains("not bound to this host") && text.contains("unknown credential"),
        "{text}"
    );
    assert!(!text.contains(SECRET), "the secret reached the log");
    assert_bystander_works(&other).await;
}

#[tokio::test]
async fn aws_requests_are_signed_by_the_host() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let cloud = Peer::start().await;
    let host = format!("http://{}", cloud.addr);
    let p = egress_plugin(|s| {
        s.egress.allow = allow(std::slice::from_ref(&host));
        s.egress.allowed_ip_ranges = loopback();
        s.egress.credentials = vec![Credential {
            name: "aws".into(),
            kind: CredentialKind::AwsSigv4 {
                access_key_id: SecretSource::Value(Secret::new("AKIDEXAMPLE")),
                secret_access_key: SecretSource::Value(Secret::new(SECRET)),
                session_token: Some(SecretSource::Value(Secret::new("session-token-value"))),
                region: Some("eu-west-1".into()),
                service: None,
            },
            hosts: allow(std::slice::from_ref(&host)),
        }];
    });
    let body = "Action=DescribeAutoScalingGroups&Version=2011-01-01";
    let r = attack(
        &p,
        json!({"url": cloud.url("/"), "method": "POST", "body": body, "credential": "aws", "service": "autoscaling"}),
    )
    .await;
    assert_eq!(r["results"][0]["status"], 200, "{r}");
    let arrived = &cloud.arrivals()[0];
    let header = |name: &str| {
        arrived
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let auth = header("authorization").unwrap_or_default();
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
        "{auth}"
    );
    assert!(
        auth.contains("/eu-west-1/autoscaling/aws4_request"),
        "{auth}"
    );
    assert!(header("x-amz-date").is_some());
    assert_eq!(
        header("x-amz-security-token").as_deref(),
        Some("session-token-value")
    );
    assert!(!r.to_string().contains(SECRET));
    assert!(!logs.text().contains(SECRET));
}

/// A TLS server on loopback for `api.test`, with a self-signed certificate.
async fn tls_peer() -> (
    std::net::SocketAddr,
    rustls::pki_types::CertificateDer<'static>,
) {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = rcgen::generate_simple_self_signed(vec!["api.test".to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
    let cert = key.cert.der().clone();
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.signing_key.serialize_der()));
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| {
        b.with_no_client_auth()
            .with_single_cert(vec![cert.clone()], private)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(hyper::body::Bytes::from_static(b"secure hello")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, cert)
}

#[tokio::test]
async fn https_verifies_the_server_against_the_pool_roots() {
    let (addr, cert) = tls_peer().await;
    let url = format!("https://api.test:{}/", addr.port());
    let setup = |s: &mut Sandbox, trust: bool| {
        s.egress.allow = allow(&[format!("https://api.test:{}", addr.port())]);
        s.egress.allowed_ip_ranges = loopback();
        s.egress.resolve_overrides = BTreeMap::from([("api.test".to_string(), vec![addr.ip()])]);
        if trust {
            s.egress.extra_roots = vec![cert.clone()];
        }
    };
    // Without the pool trusting the certificate, the TLS handshake fails.
    let p = egress_plugin(|s| setup(s, false));
    let r = attack(&p, json!({ "url": url })).await;
    assert!(
        r["results"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("Tls")),
        "{r}"
    );
    // With it, the request goes through over TLS, twice on one kept-alive connection.
    let p = egress_plugin(|s| setup(s, true));
    let r = attack(&p, json!({ "url": url, "count": 2 })).await;
    assert_eq!(r["results"][0]["status"], 200, "{r}");
    assert_eq!(r["results"][1]["bytes"], 12, "{r}");
}

/// A guest that keeps response handles (and so connections) in its state gets at most
/// `requests_in_flight` of them, and loses them all when its call returns: the next call has
/// the whole budget again, although the guest still holds the old handles.
#[tokio::test]
async fn held_responses_are_capped_and_do_not_outlive_their_call() {
    let other = bystander().await;
    let peer = Peer::start().await;
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://{}", peer.addr)]);
        s.egress.allowed_ip_ranges = loopback();
        s.limits.requests_in_flight = 4;
        s.limits.default_deadline = Duration::from_secs(20);
    });
    let hold = json!({"url": peer.url("/stall"), "count": 10, "hold": true});
    let r = attack(&p, hold.clone()).await;
    let results = r["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 10, "{r}");
    assert!(
        results[..4]
            .iter()
            .all(|r| r["status"] == 200 && r["held"] == true),
        "{r}"
    );
    assert!(
        results[4..]
            .iter()
            .all(|r| r["error"].as_str().is_some_and(|e| e.contains("Denied"))),
        "{r}"
    );
    assert_eq!(peer.arrivals().len(), 4);
    assert_eq!(
        p.requests_in_flight(),
        0,
        "the call returned, its requests end"
    );
    // The guest still holds the four old responses; the budget is whole again anyway.
    let r = attack(&p, hold).await;
    let results = r["results"].as_array().cloned().unwrap_or_default();
    assert!(results[..4].iter().all(|r| r["status"] == 200), "{r}");
    assert_eq!(peer.arrivals().len(), 8);
    assert_bystander_works(&other).await;
}

/// `requests_per_minute` is a window over calls, not a per-call cap.
#[tokio::test]
async fn requests_per_minute_hold_across_calls() {
    let peer = Peer::start().await;
    let p = egress_plugin(|s| {
        s.egress.allow = allow(&[format!("http://{}", peer.addr)]);
        s.egress.allowed_ip_ranges = loopback();
        s.limits.requests_per_minute = 5;
    });
    let r = attack(&p, json!({"url": peer.url("/ok"), "count": 8})).await;
    let results = r["results"].as_array().cloned().unwrap_or_default();
    assert!(results[..5].iter().all(|r| r["status"] == 200), "{r}");
    assert!(
        results[5..]
            .iter()
            .all(|r| r["error"].as_str().is_some_and(|e| e.contains("Denied"))),
        "{r}"
    );
    let r = attack(&p, json!({"url": peer.url("/ok")})).await;
    assert!(denied(&r), "{r}");
    assert_eq!(peer.arrivals().len(), 5);
}

/// A bound host that reflects the request (as TRACE or an echo endpoint does) cannot hand
/// the guest the secret the host injected: bearer, basic and the SigV4 session token are
/// masked in the response headers and in a body that arrives in 5-byte chunks, and no
/// credential is applied to TRACE at all.
#[tokio::test]
async fn a_reflecting_host_cannot_hand_the_secret_back() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    let echo = Peer::start().await;
    let host = format!("http://{}", echo.addr);
    let p = egress_plugin(|s| {
        s.egress.allow = allow(std::slice::from_ref(&host));
        s.egress.allowed_ip_ranges = loopback();
        s.egress.credentials = vec![
            bearer("api", std::slice::from_ref(&host)),
            Credential {
                name: "basic".into(),
                kind: CredentialKind::Basic {
                    username: "robot".into(),
                    password: SecretSource::Value(Secret::new(SECRET)),
                },
                hosts: allow(std::slice::from_ref(&host)),
            },
            Credential {
                name: "aws".into(),
                kind: CredentialKind::AwsSigv4 {
                    access_key_id: SecretSource::Value(Secret::new("AKIDEXAMPLE")),
                    secret_access_key: SecretSource::Value(Secret::new(SECRET)),
                    session_token: Some(SecretSource::Value(Secret::new(
                        "session-token-value-9f2e",
                    ))),
                    region: Some("eu-west-1".into()),
                    service: Some("ec2".into()),
                },
                hosts: allow(std::slice::from_ref(&host)),
            },
        ];
    });
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("robot:{SECRET}"))
    };
    for (credential, secret) in [
        ("api", SECRET.to_string()),
        ("basic", basic),
        ("aws", "session-token-value-9f2e".to_string()),
    ] {
        let r = attack(
            &p,
            json!({"url": echo.url("/echo"), "credential": credential, "capture": true}),
        )
        .await;
        let result = &r["results"][0];
        assert_eq!(result["status"], 200, "{r}");
        // The echo arrived: the request carried the secret, the answer quoted it back.
        let arrived = echo.arrivals();
        let last = arrived
            .last()
            .map(|a| format!("{:?}", a.headers))
            .unwrap_or_default();
        assert!(last.contains(&secret), "{credential}: not injected? {last}");
        let body = result["body"].as_str().unwrap_or_default();
        assert!(body.contains("authorization: "), "{credential}: {r}");
        assert!(
            !r.to_string().contains(&secret),
            "{credential}: the secret came back: {r}"
        );
        assert!(body.contains("****"), "{credential}: {body}");
        let headers = result["headers"].to_string();
        assert!(headers.contains("x-echo-authorization"), "{headers}");
    }
    // A credential is never applied to TRACE (or CONNECT, OPTIONS, extension methods): the
    // request is refused before it leaves.
    let before = echo.arrivals().len();
    for method in ["TRACE", "OPTIONS", "PROPFIND"] {
        let r = attack(
            &p,
            json!({"url": echo.url("/echo"), "credential": "api", "method": method}),
        )
        .await;
        assert!(denied(&r), "{method}: {r}");
    }
    assert_eq!(echo.arrivals().len(), before, "a refused request left");
    assert!(!logs.text().contains(SECRET));
    assert!(
        logs.text().contains("reflected a credential's secret"),
        "{}",
        logs.text()
    );
}

/// A guest that writes a whole request body after `handle` and before it waits for the
/// response (so nothing of the guest's polls the request meanwhile) still gets it sent and
/// answered: the host moves the request along on its own, both while it opens a connection
/// and while it reads the body to sign it.
#[tokio::test]
async fn a_body_written_before_the_wait_is_sent_whole() {
    let cloud = Peer::start().await;
    let host = format!("http://{}", cloud.addr);
    let p = egress_plugin(|s| {
        s.egress.allow = allow(std::slice::from_ref(&host));
        s.egress.allowed_ip_ranges = loopback();
        s.egress.credentials = vec![bearer("api", std::slice::from_ref(&host))];
        s.limits.default_deadline = Duration::from_secs(10);
    });
    const N: u64 = 1 << 20;
    for cmd in [
        json!({"url": cloud.url("/count"), "write_first": N}),
        json!({"url": cloud.url("/count"), "write_first": N, "credential": "api"}),
    ] {
        let r = attack(&p, cmd.clone()).await;
        assert_eq!(r["results"][0]["status"], 200, "{cmd}: {r}");
        assert_eq!(r["results"][0]["body"], N.to_string(), "{cmd}: {r}");
    }
    assert_eq!(cloud.arrivals().len(), 2);
}

//! `update()` of the AWS plugin for a group of 100 instances on moto, against the same
//! DescribeAutoScalingGroups call made directly from the host with reqwest plus SigV4 (signed
//! by the same host code) and the instance ids extracted. Needs the venv of scripts/test.sh.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use flotilla_harness::clouds::AwsPlugin;

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_credentials::{Credential, CredentialKind, Secret, SecretSource, SigningHints};
use flotilla_net::AllowList;
use flotilla_peers::moto::Moto;
use flotilla_provider::Provider;

fn aws(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let moto = Moto::start_with_max(100);
    let p = moto.provider(None);
    rt.block_on(async {
        p.init(&moto.settings())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        p.increase(100).await.unwrap_or_else(|e| panic!("{e}"));
        let n = p
            .update()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .instances
            .len();
        assert_eq!(n, 100);
    });
    let (key, secret) = moto.key("plugin");
    let credential = Credential {
        name: "aws".into(),
        kind: CredentialKind::AwsSigv4 {
            access_key_id: SecretSource::Value(Secret::new(key)),
            secret_access_key: SecretSource::Value(Secret::new(secret)),
            session_token: None,
            region: Some("us-east-1".into()),
            service: Some("autoscaling".into()),
        },
        hosts: AllowList::parse(&[moto.endpoint.as_str()]).unwrap_or_else(|e| panic!("{e:?}")),
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let url = format!("{}/", moto.endpoint);
    let body = "Action=DescribeAutoScalingGroups&Version=2011-01-01&AutoScalingGroupNames.member.1=ci-runners";
    let mut g = c.benchmark_group("aws_update_100");
    g.measurement_time(Duration::from_secs(10));
    g.sample_size(30);
    g.bench_function("plugin", |b| {
        b.to_async(&rt)
            .iter(|| async { p.update().await.unwrap_or_else(|e| panic!("{e}")).instances })
    });
    g.bench_function("host_reqwest_sigv4", |b| {
        b.to_async(&rt).iter(|| async {
            let mut request = http::Request::post(url.as_str())
                .header(
                    "content-type",
                    "application/x-www-form-urlencoded; charset=utf-8",
                )
                .header(
                    "host",
                    url.trim_start_matches("http://").trim_end_matches('/'),
                )
                .body(())
                .unwrap_or_else(|e| panic!("{e}"));
            credential
                .apply(&mut request, body.as_bytes(), &SigningHints::default())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let mut req = client.post(url.as_str()).body(body);
            for (k, v) in request.headers() {
                req = req.header(k, v);
            }
            let text = req
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .text()
                .await
                .unwrap_or_default();
            let ids = text.matches("<InstanceId>").count();
            assert_eq!(ids, 100);
            ids
        })
    });
    g.finish();
}

criterion_group!(benches, aws);
criterion_main!(benches);

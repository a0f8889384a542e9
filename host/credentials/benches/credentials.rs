//! What a credential adds to one request: a `gcp` credential with a cached token against the
//! plain `bearer` kind reading its token from the config (the baseline), in the same run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use std::convert::Infallible;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_credentials::gcp::{GcpConfig, GcpHandle};
use flotilla_credentials::{Credential, CredentialKind, Secret, SecretSource, SigningHints};
use flotilla_net::AllowList;
use http_body_util::Full;
use hyper::body::Bytes;

fn credential(kind: CredentialKind) -> Credential {
    Credential {
        name: "c".into(),
        kind,
        hosts: AllowList::parse(&["https://compute.googleapis.com"]).unwrap(),
    }
}

async fn apply(c: &Credential) {
    let mut req = http::Request::get("https://compute.googleapis.com/compute/v1/projects/p")
        .body(())
        .unwrap();
    c.apply(&mut req, b"", &SigningHints::default())
        .await
        .unwrap();
    std::hint::black_box(req);
}

fn credentials(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A metadata server handing out one long-lived token; the bench then runs on the cache.
    let addr = rt.block_on(flotilla_peers::serve::serve_http(
        |_req: hyper::Request<hyper::body::Incoming>| async {
            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                r#"{"access_token":"ya29.bench-token-0123456789","expires_in":3599,"token_type":"Bearer"}"#,
            ))))
        },
    ));
    let gcp = credential(CredentialKind::Gcp(GcpHandle::new(GcpConfig {
        metadata_endpoint: Some(format!("http://{addr}")),
        ..GcpConfig::default()
    })));
    rt.block_on(apply(&gcp));
    let bearer = credential(CredentialKind::Bearer {
        token: SecretSource::Value(Secret::new("ya29.bench-token-0123456789")),
    });
    let mut g = c.benchmark_group("credentials");
    g.bench_function("bearer_from_config", |b| {
        b.iter(|| rt.block_on(apply(&bearer)))
    });
    g.bench_function("gcp_cached_token", |b| b.iter(|| rt.block_on(apply(&gcp))));
    g.finish();
}

criterion_group!(benches, credentials);
criterion_main!(benches);

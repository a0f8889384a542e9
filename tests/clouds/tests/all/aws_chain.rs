//! The `aws` credential chain, link by link, against moto with SigV4 checking on: shared files
//! with a profile, the environment overriding them, web identity through moto's STS, and
//! IMDSv2 (a loopback server with the documented shapes, since no emulator exists), with the
//! refresh of temporary credentials. Each link's environment is the chain's own
//! ([`ChainEnv::Fixed`]), so the process's environment, which other tests read, is never changed.

use flotilla_harness as common;
use flotilla_harness::clouds::AwsPlugin;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use flotilla_credentials::aws::{AwsChain, AwsChainConfig, ChainEnv};
use flotilla_credentials::{AwsChainHandle, CredentialKind};
use flotilla_peers::moto::{Moto, python};
use flotilla_provider::{CallError, Provider, ProviderError};
use http_body_util::Full;
use hyper::body::Bytes;

/// The environment a chain reads: set and unset like the process's, but the chain's own.
#[derive(Default)]
struct Vars(BTreeMap<String, String>);

impl Vars {
    fn set(&mut self, var: &str, value: &str) {
        self.0.insert(var.to_string(), value.to_string());
    }

    fn unset_all(&mut self) {
        self.0.clear();
    }

    fn chain(&self, config: AwsChainConfig) -> CredentialKind {
        let vars = ChainEnv::Fixed(self.0.clone());
        CredentialKind::Aws(AwsChainHandle(Arc::new(AwsChain::with_env(config, vars))))
    }
}

async fn works(moto: &Moto, kind: CredentialKind) -> Result<(), CallError> {
    let p = moto.provider_with(kind);
    p.init(&moto.settings()).await.map(drop)
}

/// A loopback IMDSv2 that hands out `keys` (id, secret, token) with the given lifetime and
/// counts credential fetches.
async fn imds(
    keys: (String, String, String),
    lifetime_s: i64,
    fetches: Arc<AtomicUsize>,
) -> String {
    let addr =
        flotilla_peers::serve::serve_http(move |req: hyper::Request<hyper::body::Incoming>| {
            let keys = keys.clone();
            let fetches = fetches.clone();
            async move {
                let token_ok = req
                    .headers()
                    .get("x-aws-ec2-metadata-token")
                    .is_some_and(|t| t == "imds-token");
                let body = match (req.method().as_str(), req.uri().path()) {
                    ("PUT", "/latest/api/token") => "imds-token".to_string(),
                    ("GET", "/latest/meta-data/iam/security-credentials/") if token_ok => {
                        "ci-role\n".to_string()
                    }
                    ("GET", "/latest/meta-data/iam/security-credentials/ci-role") if token_ok => {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        let expires = chrono::Utc::now() + chrono::Duration::seconds(lifetime_s);
                        serde_json::json!({
                    "Code": "Success",
                    "AccessKeyId": keys.0,
                    "SecretAccessKey": keys.1,
                    "Token": keys.2,
                    "Expiration": expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                })
                .to_string()
                    }
                    _ => {
                        let mut r = hyper::Response::new(Full::new(Bytes::from_static(b"")));
                        *r.status_mut() = hyper::StatusCode::UNAUTHORIZED;
                        return Ok::<_, Infallible>(r);
                    }
                };
                Ok(hyper::Response::new(Full::new(Bytes::from(body))))
            }
        })
        .await;
    format!("http://{addr}")
}

#[tokio::test(flavor = "current_thread")]
async fn every_link_of_the_chain_signs_requests_moto_accepts() {
    let mut env = Vars::default();
    let logs = common::LogCapture::default();
    let _guard = logs.install();
    let moto = Moto::start();
    let (key, secret) = moto.key("plugin");
    let dir = std::env::temp_dir().join(format!("flotilla-aws-chain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));

    // Shared credentials file, named profile.
    let file = dir.join("credentials");
    std::fs::write(&file, format!("[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n[ci]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    env.set("AWS_SHARED_CREDENTIALS_FILE", &file.display().to_string());
    env.set("AWS_CONFIG_FILE", &dir.join("none").display().to_string());
    env.set("AWS_EC2_METADATA_DISABLED", "true");
    let profile = AwsChainConfig {
        profile: Some("ci".into()),
        ..AwsChainConfig::default()
    };
    works(&moto, env.chain(profile.clone()))
        .await
        .unwrap_or_else(|e| panic!("shared file: {e}"));
    let r = works(&moto, env.chain(AwsChainConfig::default())).await;
    assert!(
        matches!(
            r,
            Err(CallError::Provider {
                error: ProviderError::Unauthorized(_),
                ..
            })
        ),
        "default profile has wrong keys: {r:?}"
    );

    // A rotated shared credentials file is used at once, without a restart, by the same pool
    // (the old key may already be deleted); a file that then disappears keeps the last good
    // keys.
    std::fs::write(
        &file,
        "[ci]\naws_access_key_id = OLD\naws_secret_access_key = REVOKED\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let rotating = moto.provider_with(env.chain(profile.clone()));
    let r = rotating.init(&moto.settings()).await;
    assert!(r.is_err(), "the revoked key is refused");
    std::fs::write(
        &file,
        format!("[ci]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    rotating
        .init(&moto.settings())
        .await
        .unwrap_or_else(|e| panic!("the rotated file was not re-read at once: {e}"));
    std::fs::remove_file(&file).unwrap_or_else(|e| panic!("{e}"));
    // Deliberate: the refresh interval must pass so the chain looks for the gone file.
    tokio::time::sleep(
        flotilla_credentials::aws::STATIC_REFRESH + std::time::Duration::from_millis(500),
    )
    .await;
    rotating
        .update()
        .await
        .unwrap_or_else(|e| panic!("the last good keys were dropped: {e}"));
    std::fs::write(&file, format!("[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n[ci]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"))
        .unwrap_or_else(|e| panic!("{e}"));

    // The environment comes before the files.
    env.set("AWS_ACCESS_KEY_ID", &key);
    env.set("AWS_SECRET_ACCESS_KEY", "wrong-secret-from-env");
    let r = works(&moto, env.chain(profile.clone())).await;
    assert!(
        matches!(
            r,
            Err(CallError::Provider {
                error: ProviderError::Unauthorized(_),
                ..
            })
        ),
        "env wins: {r:?}"
    );
    env.set("AWS_SECRET_ACCESS_KEY", &secret);
    works(&moto, env.chain(profile))
        .await
        .unwrap_or_else(|e| panic!("env: {e}"));
    env.unset_all();

    // Web identity: STS AssumeRoleWithWebIdentity gives temporary keys for the role.
    let token = dir.join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjaSJ9.sig")
        .unwrap_or_else(|e| panic!("{e}"));
    env.set(
        "AWS_ROLE_ARN",
        moto.setup["role"].as_str().unwrap_or_default(),
    );
    env.set("AWS_WEB_IDENTITY_TOKEN_FILE", &token.display().to_string());
    env.set(
        "AWS_SHARED_CREDENTIALS_FILE",
        &dir.join("none").display().to_string(),
    );
    python(&[&moto.endpoint, "--allow-unsigned", "1"]);
    let wi = AwsChainConfig {
        sts_endpoint: Some(format!("{}/", moto.endpoint)),
        ..AwsChainConfig::default()
    };
    works(&moto, env.chain(wi))
        .await
        .unwrap_or_else(|e| panic!("web identity: {e}"));
    env.unset_all();

    // IMDSv2, with refresh: credentials that expire within five minutes are fetched again.
    env.set(
        "AWS_SHARED_CREDENTIALS_FILE",
        &dir.join("none").display().to_string(),
    );
    let role = moto.setup["role"].as_str().unwrap_or_default().to_string();
    let temp: serde_json::Value =
        serde_json::from_str(&python(&[&moto.endpoint, "--assume-role", &role]))
            .unwrap_or_else(|e| panic!("{e}"));
    let field = |k: &str| temp[k].as_str().unwrap_or_default().to_string();
    for (lifetime, expected) in [(3600, 1), (120, 2)] {
        let fetches = Arc::new(AtomicUsize::new(0));
        let endpoint = imds(
            (field("key"), field("secret"), field("token")),
            lifetime,
            fetches.clone(),
        )
        .await;
        let kind = env.chain(AwsChainConfig {
            imds_endpoint: Some(endpoint),
            ..AwsChainConfig::default()
        });
        let p = moto.provider_with(kind);
        p.init(&moto.settings())
            .await
            .unwrap_or_else(|e| panic!("imds: {e}"));
        p.update().await.unwrap_or_else(|e| panic!("imds: {e}"));
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            expected,
            "lifetime {lifetime}s"
        );
    }

    // Nothing anywhere: the request is refused and the host log says why, with no secret.
    env.set("AWS_EC2_METADATA_DISABLED", "true");
    let r = works(&moto, env.chain(AwsChainConfig::default())).await;
    assert!(format!("{r:?}").contains("HttpRequestDenied"), "{r:?}");
    let text = logs.text();
    assert!(text.contains("no AWS credentials found"), "{text}");
    for s in [
        secret.as_str(),
        field("secret").as_str(),
        field("token").as_str(),
    ] {
        assert!(!text.contains(s), "a secret reached the log");
    }
    env.unset_all();
}

//! Plugin distribution against a real CNCF distribution registry (anonymous, htpasswd and
//! token auth), cross-checked with an independent client (oras-py).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

use flotilla_harness as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::poll;
use common::process::Daemon;
use flotilla_oci::{AuthStore, RegistryOptions, Store};
use flotilla_peers::registry::{Mode, READER, Registry, WRITER};
use flotilla_test_artifacts as guests;
use serde_json::Value;

const PASSWORD: &str = "key-pass-8d2e";

struct Out {
    code: i32,
    out: String,
    err: String,
}

impl Out {
    fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "stdout:\n{}\nstderr:\n{}", self.out, self.err);
        self
    }
    /// Fails with exactly one `error:` line containing every needle.
    fn fails_with(&self, needles: &[&str]) -> &Self {
        assert_eq!(
            self.code, 1,
            "expected failure:\n{}\n{}",
            self.out, self.err
        );
        let lines: Vec<&str> = self.err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line expected:\n{}", self.err);
        assert!(lines[0].starts_with("error: "), "{}", self.err);
        for n in needles {
            assert!(self.err.contains(n), "missing {n:?} in: {}", self.err);
        }
        for secret in [WRITER.1, READER.1, PASSWORD, "wrong-password"] {
            assert!(!self.err.contains(secret), "a secret leaked: {}", self.err);
        }
        self
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.out).unwrap_or_else(|e| panic!("{e}: {}", self.out))
    }
    fn field(&self, prefix: &str) -> String {
        self.out
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| panic!("no {prefix:?} in {}", self.out))
    }
}

/// An isolated user: own credential store, Docker config and cache.
struct User {
    dir: tempfile::TempDir,
    registry: String,
}

impl User {
    fn new(registry: &str) -> User {
        User {
            dir: tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
            registry: registry.to_string(),
        }
    }

    fn raw(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        cmd.args(args)
            .env("FLOTILLA_LOG", "warn")
            .env("FLOTILLA_CONFIG_HOME", self.dir.path().join("config"))
            .env("DOCKER_CONFIG", self.dir.path().join("docker"))
            .env("XDG_CACHE_HOME", self.dir.path().join("xdg"))
            .env("XDG_DATA_HOME", self.dir.path().join("xdg-data"))
            .env("COSIGN_PASSWORD", PASSWORD)
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{e}"));
        if let Some(mut sin) = child.stdin.take() {
            use std::io::Write;
            let _ = sin.write_all(stdin.unwrap_or("").as_bytes());
        }
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        Out {
            code: out.status.code().unwrap_or(-1),
            out: String::from_utf8_lossy(&out.stdout).into_owned(),
            err: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs an OCI command with this user's cache and plain HTTP to the loopback registry.
    fn oci(&self, args: &[&str]) -> Out {
        self.oci_in(args, None)
    }

    fn oci_in(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let cache = self.cache_dir();
        let mut all: Vec<&str> = args.to_vec();
        if !args.contains(&"--timeout") {
            all.extend(["--timeout", "5s"]);
        }
        all.extend(["--plain-http", "--cache-dir"]);
        let cache = cache.display().to_string();
        all.push(&cache);
        self.raw(&all, stdin)
    }

    /// Runs an OCI command over HTTPS (no --plain-http).
    fn https(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let cache = self.cache_dir().display().to_string();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--timeout", "5s", "--cache-dir", &cache]);
        self.raw(&all, stdin)
    }

    fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    fn login(&self, who: (&str, &str)) -> Out {
        self.oci_in(
            &["plugin", "login", &self.registry, "-u", who.0],
            Some(&format!("{}\n", who.1)),
        )
    }

    fn auth_file(&self) -> PathBuf {
        self.dir.path().join("config/auth.json")
    }

    fn docker_config(&self, who: (&str, &str)) {
        let dir = self.dir.path().join("docker");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", who.0, who.1));
        let v = serde_json::json!({ "auths": { self.registry.clone(): { "auth": auth } } });
        std::fs::write(dir.join("config.json"), v.to_string()).unwrap_or_else(|e| panic!("{e}"));
    }

    fn keys(&self, name: &str) -> (String, String) {
        let prefix = self.dir.path().join(name);
        self.raw(
            &["plugin", "generate-key", &prefix.display().to_string()],
            None,
        )
        .ok();
        (
            prefix.with_extension("key").display().to_string(),
            prefix.with_extension("pub").display().to_string(),
        )
    }

    /// Every file in the OCI cache (blobs, manifests, temporaries).
    fn cache_files(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let root = self.cache_dir().join("oci");
        let mut out = Vec::new();
        walk(&root, &mut out);
        out.into_iter()
            .filter_map(|p| p.strip_prefix(&root).ok().map(Path::to_path_buf))
            .collect()
    }

    fn assert_no_partial_files(&self) {
        let tmp: Vec<_> = self
            .cache_files()
            .into_iter()
            .filter(|p| p.components().any(|c| c.as_os_str() == "tmp"))
            .collect();
        assert!(tmp.is_empty(), "temporary files left: {tmp:?}");
    }

    fn assert_cache_empty(&self) {
        let files: Vec<_> = self
            .cache_files()
            .into_iter()
            .filter(|p| {
                p.components()
                    .any(|c| c.as_os_str() == "blobs" || c.as_os_str() == "manifests")
                    || p.components().any(|c| c.as_os_str() == "tmp")
            })
            .collect();
        assert!(files.is_empty(), "cache should hold nothing: {files:?}");
    }

    /// In-process load of a pool config the way `flotilla run` does it.
    async fn load_pool(
        &self,
        toml_pool: &str,
    ) -> anyhow::Result<flotilla_plugin_runtime::LoadedPlugin> {
        let oci = format!("insecure_registries = [\"{}\"]", self.registry);
        self.load_pool_oci(toml_pool, &oci).await
    }

    /// Like `load_pool`, with the `[oci]` section given.
    async fn load_pool_oci(
        &self,
        toml_pool: &str,
        oci: &str,
    ) -> anyhow::Result<flotilla_plugin_runtime::LoadedPlugin> {
        let path = self.dir.path().join("flotilla.toml");
        let text = format!(
            "cache_dir = \"{}\"\n[oci]\n{oci}\ntimeout = \"5s\"\n[[pool]]\nname = \"p\"\nmax_instances = 1\n{toml_pool}\n",
            self.cache_dir().display(),
        );
        std::fs::write(&path, &text)?;
        let cfg =
            flotilla::config::parse(&path, &text, true).map_err(|e| anyhow::anyhow!("{e}"))?;
        let registry = flotilla_oci::Registry::new(
            RegistryOptions {
                insecure: cfg.registry.insecure.clone(),
                ca_files: cfg.registry.ca_files.clone(),
                timeout: Duration::from_secs(5),
                ..RegistryOptions::default()
            },
            AuthStore {
                own: self.auth_file(),
                docker: Some(self.dir.path().join("docker/config.json")),
            },
            Store::open(&self.cache_dir().join("oci"))?,
        );
        flotilla_plugin_runtime::loader::load_plugin(
            common::runtime(),
            Some(&registry),
            &cfg.pools[0].name,
            &cfg.pools[0].plugin,
        )
        .await
        .map_err(anyhow::Error::from)
    }
}

fn sha256_file(path: &str) -> String {
    flotilla_net::sha256_hex(&std::fs::read(path).unwrap_or_else(|e| panic!("{e}")))
}

fn venv_python() -> PathBuf {
    flotilla_peers::moto::venv().join("bin/python")
}

fn oras(args: &[&str], auth: Option<(&str, &str)>, token: bool) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/peers/oras_client.py");
    let mut cmd = Command::new(venv_python());
    cmd.arg(script).args(args);
    if let Some((u, p)) = auth {
        cmd.args(["--user", u, "--password", p]);
    }
    if token {
        cmd.arg("--token");
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("oras-py ({e}); run scripts/test.sh"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Pushes arbitrary layers with the CNCF media types (or others) through oras.
fn oras_push(
    reg: &Registry,
    repo_tag: &str,
    config: (&str, &str),
    layers: &[(&Path, &str)],
    auth: Option<(&str, &str)>,
) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, config.0).unwrap_or_else(|e| panic!("{e}"));
    let target = format!("{}/{repo_tag}", reg.host());
    let mut args = vec![
        "push".to_string(),
        reg.host(),
        target,
        format!("{}:{}", cfg.display(), config.1),
    ];
    for (p, media) in layers {
        args.push(format!("{}:{media}", p.display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = oras(&args, auth, reg.mode == Mode::Token);
    assert!(ok, "oras push: {out}");
}

const CNCF_CONFIG: &str = r#"{"architecture":"wasm","os":"wasip2","layerDigests":[],"component":{"exports":["flotilla:provider/instance-group@0.1.4"],"imports":["flotilla:provider/log@0.1.4"]}}"#;
const WASM_CONFIG_TYPE: &str = "application/vnd.wasm.config.v0+json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_in_all_three_auth_modes() {
    for mode in [Mode::Anonymous, Mode::Basic, Mode::Token] {
        let reg = Registry::start(mode).await;
        let user = User::new(&reg.host());
        let r = reg.reference("flotilla/static:1.0");
        let ctx = format!("{mode:?}");

        if mode == Mode::Anonymous {
            let login = user.login(WRITER);
            assert!(
                login.ok().out.contains("accepts anonymous access"),
                "{}",
                login.out
            );
            user.raw(&["plugin", "logout", &reg.host()], None).ok();
        } else {
            user.oci(&["plugin", "push", guests::STATIC_PLUGIN, &r])
                .fails_with(&["401", "flotilla plugin login"]);
            user.login(("alice", "wrong-password"))
                .fails_with(&["rejected the username or password"]);
            assert!(
                !user.auth_file().exists(),
                "{ctx}: nothing saved on a failed login"
            );
            user.login(WRITER).ok();
            let saved = std::fs::read_to_string(user.auth_file()).unwrap_or_default();
            assert!(saved.contains(&reg.host()), "{ctx}: {saved}");
            assert!(!saved.contains(WRITER.1), "{ctx}: password stored in clear");
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(user.auth_file())
                    .map(|m| m.permissions().mode() & 0o777)
                    .unwrap_or(0);
                assert_eq!(mode, 0o600, "{ctx}: auth file mode");
            }
        }

        let pushed = user.oci(&[
            "plugin",
            "push",
            guests::STATIC_PLUGIN,
            &r,
            "--annotation",
            "description=Static host list",
            "-a",
            "org.opencontainers.image.licenses=Apache-2.0",
        ]);
        pushed.ok();
        let digest = pushed.field("digest:");
        assert!(digest.starts_with("sha256:"), "{ctx}");

        let inspect = user.oci(&["plugin", "inspect", &r, "--json"]);
        let info = inspect.ok().json();
        assert_eq!(info["digest"], digest.as_str(), "{ctx}");
        assert_eq!(info["world"], "flotilla:provider/provider@0.1.4", "{ctx}");
        assert_eq!(
            info["annotations"]["org.opencontainers.image.description"],
            "Static host list"
        );
        assert_eq!(
            info["annotations"]["org.opencontainers.image.licenses"],
            "Apache-2.0"
        );
        assert_eq!(
            info["annotations"]["org.opencontainers.image.version"],
            "1.0"
        );
        assert!(info["annotations"]["org.opencontainers.image.created"].is_string());
        let exports = info["exports"].to_string();
        assert!(
            exports.contains("flotilla:provider/instance-group@0.1.4"),
            "{exports}"
        );
        assert!(
            info["imports"]
                .to_string()
                .contains("flotilla:provider/log@0.1.4")
        );
        // inspect does not download the layer
        let layer_digest = info["layer_digest"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            !user
                .cache_files()
                .iter()
                .any(|p| p.ends_with(layer_digest.trim_start_matches("sha256:"))),
            "{ctx}: inspect downloaded the layer"
        );

        let out_file = user.dir.path().join("pulled.wasm");
        let pulled = user.oci(&["plugin", "pull", &r, "-o", &out_file.display().to_string()]);
        pulled.ok();
        assert_eq!(pulled.field("digest:"), digest);
        assert_eq!(
            std::fs::read(&out_file).unwrap_or_default(),
            std::fs::read(guests::STATIC_PLUGIN).unwrap_or_default(),
            "{ctx}: pulled bytes differ"
        );

        let ls = user.oci(&["plugin", "ls", "--json"]);
        let listed = ls.ok().json();
        let entry = listed
            .as_array()
            .and_then(|a| {
                a.iter()
                    .find(|e| e["reference"] == format!("{}/flotilla/static:1.0", reg.host()))
            })
            .cloned()
            .unwrap_or_else(|| panic!("{ctx}: not listed: {listed}"));
        assert_eq!(entry["digest"], digest.as_str());
        assert_eq!(entry["cached"], true);

        let (key, public) = user.keys("cosign");
        let (_, other_public) = user.keys("other");
        user.oci(&["plugin", "sign", &r, "--key", &key]).ok();
        user.oci(&["plugin", "pull", &r, "--verify-key", &public])
            .ok();
        user.oci(&["plugin", "pull", &r, "--verify-key", &other_public])
            .fails_with(&["signature check", "does not verify"]);

        // The way `flotilla run` loads it: tag resolved, signature checked, bytes compiled.
        let loaded = user
            .load_pool(&format!(
                "plugin = \"{r}\"\nverify = {{ key = \"{public}\" }}\npull_policy = \"always\""
            ))
            .await
            .unwrap_or_else(|e| panic!("{ctx}: {e:#}"));
        assert_eq!(loaded.sha256, sha256_file(guests::STATIC_PLUGIN), "{ctx}");

        if mode != Mode::Anonymous {
            user.raw(&["plugin", "logout", &reg.host()], None).ok();
            assert!(
                !std::fs::read_to_string(user.auth_file())
                    .unwrap_or_default()
                    .contains(&reg.host())
            );
            user.oci(&["plugin", "pull", &r])
                .fails_with(&["401", "flotilla plugin login"]);
            // Docker's config.json is the fallback.
            user.docker_config(READER);
            user.oci(&["plugin", "pull", &r]).ok();
            if mode == Mode::Token {
                // The issuer grants the reader pull only; the registry enforces it.
                let denied = user.oci(&[
                    "plugin",
                    "push",
                    guests::STATIC_PLUGIN,
                    &reg.reference("flotilla/static:2.0"),
                ]);
                assert_eq!(denied.code, 1, "{ctx}: reader pushed: {}", denied.out);
                assert!(
                    denied.err.contains("401") || denied.err.contains("403"),
                    "{}",
                    denied.err
                );
            }
        }
        user.assert_no_partial_files();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oras_and_flotilla_read_each_others_artifacts() {
    for mode in [Mode::Anonymous, Mode::Basic, Mode::Token] {
        let reg = Registry::start(mode).await;
        let user = User::new(&reg.host());
        let creds = (mode != Mode::Anonymous).then_some(WRITER);
        if creds.is_some() {
            user.login(WRITER).ok();
        }
        // flotilla pushes, oras pulls: identical bytes.
        let r = reg.reference("cross/static:1");
        user.oci(&["plugin", "push", guests::STATIC_PLUGIN, &r])
            .ok();
        let out = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let target = format!("{}/cross/static:1", reg.host());
        let (ok, files) = oras(
            &[
                "pull",
                &reg.host(),
                &target,
                &out.path().display().to_string(),
            ],
            creds,
            mode == Mode::Token,
        );
        assert!(ok, "oras pull: {files}");
        let file = files.lines().next().unwrap_or_default().trim().to_string();
        assert_eq!(
            sha256_file(&file),
            sha256_file(guests::STATIC_PLUGIN),
            "oras got different bytes"
        );

        // oras pushes with the CNCF media types, flotilla loads it. (oras-py 0.2.43 cannot
        // push through token auth: it does not fetch a token for the upload session.)
        if mode == Mode::Token {
            continue;
        }
        oras_push(
            &reg,
            "cross/template:1",
            (CNCF_CONFIG, WASM_CONFIG_TYPE),
            &[(Path::new(guests::TEMPLATE_PLUGIN), "application/wasm")],
            creds,
        );
        let r2 = reg.reference("cross/template:1");
        let info = user.oci(&["plugin", "inspect", &r2, "--json"]);
        assert_eq!(
            info.ok().json()["world"],
            "flotilla:provider/provider@0.1.4"
        );
        let loaded = user
            .load_pool(&format!("plugin = \"{r2}\""))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(loaded.sha256, sha256_file(guests::TEMPLATE_PLUGIN));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_refused() {
    let reg = Registry::start(Mode::Anonymous).await;
    let publisher = User::new(&reg.host());

    // 1. A blob overwritten in the registry's storage.
    let r = reg.reference("tamper/blob:1");
    publisher
        .oci(&["plugin", "push", guests::STATIC_PLUGIN, &r])
        .ok();
    let layer = format!("sha256:{}", sha256_file(guests::STATIC_PLUGIN));
    let file = reg.blob_file(&layer);
    let mut bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap_or_else(|e| panic!("{e}"));
    let victim = User::new(&reg.host());
    victim.oci(&["plugin", "pull", &r]).fails_with(&[
        "failed digest verification",
        &layer,
        "tampered",
    ]);
    victim.assert_cache_empty();
    let err = victim
        .load_pool(&format!("plugin = \"{r}\""))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(err.contains("failed digest verification"), "{err}");
    victim.assert_cache_empty();
    // Restore it: the registry shares blob storage between repositories.
    bytes[last] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap_or_else(|e| panic!("{e}"));

    // 1b. A cache entry corrupted on disk is noticed, evicted and fetched again.
    let r = reg.reference("tamper/cache:1");
    publisher
        .oci(&["plugin", "push", guests::STATIC_PLUGIN, &r])
        .ok();
    let user = User::new(&reg.host());
    user.load_pool(&format!("plugin = \"{r}\""))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let cached = user
        .cache_dir()
        .join("oci/blobs")
        .join(layer.replacen(':', "/", 1));
    std::fs::write(&cached, b"\0asm\x0d\0\x01\0garbage").unwrap_or_else(|e| panic!("{e}"));
    let again = user
        .load_pool(&format!("plugin = \"{r}\""))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(again.sha256, sha256_file(guests::STATIC_PLUGIN));
    assert_eq!(
        std::fs::read(&cached).unwrap_or_default(),
        std::fs::read(guests::STATIC_PLUGIN).unwrap_or_default()
    );

    // 2. A pinned digest survives the tag moving.
    let r = reg.reference("tamper/pin:stable");
    let original = publisher.oci(&["plugin", "push", guests::STATIC_PLUGIN, &r]);
    let digest = original.ok().field("digest:");
    publisher
        .oci(&["plugin", "push", guests::TEMPLATE_PLUGIN, &r])
        .ok();
    let fresh = User::new(&reg.host());
    let pinned = format!("{r}@{digest}");
    let loaded = fresh
        .load_pool(&format!("plugin = \"{pinned}\""))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        loaded.sha256,
        sha256_file(guests::STATIC_PLUGIN),
        "pinned load got the moved tag"
    );
    let moved = fresh
        .load_pool(&format!("plugin = \"{r}\""))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(moved.sha256, sha256_file(guests::TEMPLATE_PLUGIN));

    // 3. Signed, then different bytes pushed under the same tag.
    let r = reg.reference("tamper/signed:1");
    let (key, public) = publisher.keys("cosign");
    publisher
        .oci(&["plugin", "push", guests::STATIC_PLUGIN, &r])
        .ok();
    publisher.oci(&["plugin", "sign", &r, "--key", &key]).ok();
    publisher
        .oci(&["plugin", "push", guests::TEMPLATE_PLUGIN, &r])
        .ok();
    let victim = User::new(&reg.host());
    victim
        .oci(&["plugin", "pull", &r, "--verify-key", &public])
        .fails_with(&["signature check", "not signed"]);
    let err = victim
        .load_pool(&format!(
            "plugin = \"{r}\"\nverify = {{ key = \"{public}\" }}"
        ))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("signature check") && err.contains("not signed"),
        "{err}"
    );
    victim.assert_cache_empty();

    // 4. A valid signature copied to the new digest's `.sig` tag: it names the old digest.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let signed = publisher.oci(&["plugin", "inspect", &r, "--json"]).json();
    let new_digest = signed["digest"].as_str().unwrap_or_default().to_string();
    let old_digest = format!("sha256:{}", {
        let tags: Value = reqwest::get(format!("http://{}/v2/tamper/signed/tags/list", reg.host()))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tags["tags"]
            .as_array()
            .and_then(|t| {
                t.iter().find_map(|t| {
                    t.as_str()?
                        .strip_prefix("sha256-")?
                        .strip_suffix(".sig")
                        .map(str::to_string)
                })
            })
            .unwrap_or_else(|| panic!("no signature tag: {tags}"))
    });
    let http = reqwest::Client::new();
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let sig_manifest = http
        .get(format!(
            "http://{}/v2/tamper/signed/manifests/{}",
            reg.host(),
            old_digest.replacen(':', "-", 1) + ".sig"
        ))
        .header("accept", accept)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| panic!("{e}"))
        .bytes()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    http.put(format!(
        "http://{}/v2/tamper/signed/manifests/{}",
        reg.host(),
        new_digest.replacen(':', "-", 1) + ".sig"
    ))
    .header("content-type", accept)
    .body(sig_manifest)
    .send()
    .await
    .and_then(|r| r.error_for_status())
    .unwrap_or_else(|e| panic!("{e}"));
    victim
        .oci(&["plugin", "pull", &r, "--verify-key", &public])
        .fails_with(&[
            "signature check",
            &format!("covers {old_digest}, not {new_digest}"),
        ]);
    victim.assert_cache_empty();
    // Without verification configured the moved tag loads as usual.
    victim.oci(&["plugin", "pull", &r]).ok();

    // 5. The signed artifact and its signature copied whole into another repository: the
    //    signature names the repository it was made for.
    let renamed = reg.reference("tamper/renamed:1");
    // Copied as a registry copies: each manifest's blobs mounted, then the manifest put, so
    // the digests stay those that were signed.
    let copy = |tag: String| {
        let http = http.clone();
        let host = reg.host();
        async move {
            let manifest = http
                .get(format!("http://{host}/v2/tamper/signed/manifests/{tag}"))
                .header("accept", accept)
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .unwrap_or_else(|e| panic!("{e}"))
                .bytes()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let parsed: Value = serde_json::from_slice(&manifest).unwrap_or_else(|e| panic!("{e}"));
            let blobs: Vec<String> = std::iter::once(&parsed["config"])
                .chain(parsed["layers"].as_array().into_iter().flatten())
                .filter_map(|d| d["digest"].as_str().map(str::to_string))
                .collect();
            for blob in blobs {
                http.post(format!(
                    "http://{host}/v2/tamper/renamed/blobs/uploads/?mount={blob}&from=tamper/signed"
                ))
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .unwrap_or_else(|e| panic!("{e}"));
            }
            let target = if tag.starts_with("sha256:") {
                "1".to_string()
            } else {
                tag
            };
            http.put(format!(
                "http://{host}/v2/tamper/renamed/manifests/{target}"
            ))
            .header("content-type", accept)
            .body(manifest)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .unwrap_or_else(|e| panic!("{e}"));
        }
    };
    copy(old_digest.clone()).await;
    copy(old_digest.replacen(':', "-", 1) + ".sig").await;
    let copied = publisher
        .oci(&["plugin", "inspect", &renamed, "--json"])
        .json();
    assert_eq!(copied["digest"], old_digest.as_str(), "copied as signed");
    let another = User::new(&reg.host());
    another
        .oci(&["plugin", "pull", &renamed, "--verify-key", &public])
        .fails_with(&[
            "signature check",
            &format!(
                "names {}/tamper/signed, not {}/tamper/renamed",
                reg.host(),
                reg.host()
            ),
        ]);
    another.assert_cache_empty();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_plugin_starts_with_the_registry_down() {
    let mut reg = Registry::start(Mode::Basic).await;
    let user = User::new(&reg.host());
    user.login(WRITER).ok();
    let r = reg.reference("offline/static:1");
    user.oci(&["plugin", "push", guests::STATIC_PLUGIN, &r])
        .ok();
    let (key, public) = user.keys("cosign");
    user.oci(&["plugin", "sign", &r, "--key", &key]).ok();

    let pool = format!("plugin = \"{r}\"\nverify = {{ key = \"{public}\" }}");
    let first = user
        .load_pool(&pool)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    reg.stop();
    // Default policy (if-not-present): tag resolved from the cache, signature re-checked.
    let again = user
        .load_pool(&pool)
        .await
        .unwrap_or_else(|e| panic!("offline: {e:#}"));
    assert_eq!(first.sha256, again.sha256);
    // The cached signature is checked again, against the key configured now.
    let (_, other_public) = user.keys("other");
    let err = user
        .load_pool(&format!(
            "plugin = \"{r}\"\nverify = {{ key = \"{other_public}\" }}"
        ))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        err.contains("cannot reach registry"),
        "a cached signature by another key was accepted: {err}"
    );
    // always: a tag cannot be resolved offline, and the error says so.
    let err = user
        .load_pool(&format!("{pool}\npull_policy = \"always\""))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(err.contains("cannot be reached"), "{err}");
    // A new user with an empty cache gets a clear error.
    let stranger = User::new(&reg.host());
    stranger
        .oci(&["plugin", "pull", &r])
        .fails_with(&["cannot reach registry", &reg.host()]);
    stranger.assert_cache_empty();

    // The real binary: `flotilla run` starts the pool from the cache.
    let config = user.dir.path().join("run.toml");
    std::fs::write(
        &config,
        format!(
            r#"cache_dir = "{cache}"
[server]
listen = "127.0.0.1:0"
[oci]
insecure_registries = ["{host}"]
[[pool]]
name = "offline"
max_instances = 2
{pool}
[pool.plugin_config]
hosts = [{{ address = "127.0.0.1" }}]
"#,
            cache = user.cache_dir().display(),
            host = reg.host(),
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let log = user.dir.path().join("run.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(["run", "-c"])
        .arg(&config)
        .env("FLOTILLA_LOG", "info")
        .env("FLOTILLA_CONFIG_HOME", user.dir.path().join("config"))
        .env("DOCKER_CONFIG", user.dir.path().join("docker"))
        .env("XDG_DATA_HOME", user.dir.path().join("data"));
    let mut process = Daemon::spawn(command, &log);
    let limit = Duration::from_secs(30);
    let listen = process
        .logged("flotilla is listening", "listen", limit)
        .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let state = poll::until("the pool's start to end", limit, || async {
        let answer = client.get(format!("http://{listen}/v1/pools")).send().await;
        let state = match answer {
            Ok(resp) => resp.json::<Value>().await.unwrap_or(Value::Null),
            Err(e) => return Err(e.to_string()),
        };
        if state["pools"]["offline"]["status"]["health"]["state"] != "starting" {
            Ok(state)
        } else {
            Err(state.to_string())
        }
    })
    .await;
    process.kill();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let pool_state = &state["pools"]["offline"];
    assert!(pool_state.is_object(), "no pool: {state}\n{log}");
    assert_ne!(
        pool_state["status"]["health"]["state"], "stopped",
        "{state}\n{log}"
    );
    assert!(log.contains("from_cache=true"), "{log}");
    assert!(log.contains("signature_verified=true"), "{log}");
    assert!(log.contains(&first_digest_line(&log)), "{log}");
}

fn first_digest_line(log: &str) -> String {
    log.lines()
        .find(|l| l.contains("plugin artifact resolved"))
        .and_then(|l| l.split("digest=").nth(1))
        .map(|d| d.split_whitespace().next().unwrap_or_default().to_string())
        .filter(|d| d.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("digest not logged: {log}"))
}

/// A loopback server that accepts connections and never answers (registry timeout).
async fn silent_server() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

/// A loopback server answering every request with the registry's 403 DENIED shape.
async fn denying_server() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let app = axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::FORBIDDEN,
            [("content-type", "application/json")],
            r#"{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}"#,
        )
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_one_line_errors_and_leaves_nothing_in_the_cache() {
    let reg = Registry::start(Mode::Basic).await;
    let admin = User::new(&reg.host());
    admin.login(WRITER).ok();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a plugin").unwrap_or_else(|e| panic!("{e}"));
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, wat::parse_str("(module)").unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    let empty = dir.path().join("empty.wasm");
    std::fs::write(&empty, b"").unwrap_or_else(|e| panic!("{e}"));
    let creds = Some(WRITER);
    oras_push(
        &reg,
        "bad/text:1",
        ("{}", "application/vnd.oci.image.config.v1+json"),
        &[(&text, "text/plain")],
        creds,
    );
    oras_push(
        &reg,
        "bad/core:1",
        (CNCF_CONFIG, WASM_CONFIG_TYPE),
        &[(&core, "application/wasm")],
        creds,
    );
    oras_push(
        &reg,
        "bad/empty:1",
        (CNCF_CONFIG, WASM_CONFIG_TYPE),
        &[(&empty, "application/wasm")],
        creds,
    );
    oras_push(
        &reg,
        "bad/two:1",
        (CNCF_CONFIG, WASM_CONFIG_TYPE),
        &[
            (Path::new(guests::STATIC_PLUGIN), "application/wasm"),
            (&core, "application/wasm"),
        ],
        creds,
    );
    let silent = silent_server().await;
    let denying = denying_server().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().unwrap_or_else(|e| panic!("{e}"))
    };

    let cases: Vec<(String, Vec<&str>, bool)> = vec![
        (
            "oci://flotilla/static:1".into(),
            vec!["invalid plugin reference", "not a registry host"],
            false,
        ),
        (
            "oci://127.0.0.1:5000/Bad/Name:1".into(),
            vec!["invalid plugin reference", "not a valid repository"],
            false,
        ),
        (
            "oci://registry.invalid:5000/acme/aws:1".into(),
            vec!["cannot reach registry registry.invalid"],
            false,
        ),
        (
            reg.reference("bad/text:1"),
            vec!["not a Wasm plugin artifact", "config media type"],
            true,
        ),
        (
            reg.reference("bad/two:1"),
            vec!["not a Wasm plugin artifact", "2 layers"],
            true,
        ),
        (
            reg.reference("bad/core:1"),
            vec!["not a usable Flotilla plugin", "core WebAssembly module"],
            true,
        ),
        (
            reg.reference("bad/empty:1"),
            vec!["not a usable Flotilla plugin", "empty"],
            true,
        ),
        (
            reg.reference("bad/text:nope"),
            vec!["not found", "check the repository name and tag"],
            true,
        ),
        (
            reg.reference("bad/text:1"),
            vec!["401", "flotilla plugin login"],
            false,
        ),
        (
            format!("oci://{denying}/acme/aws:1"),
            vec!["403", "lacks that permission"],
            false,
        ),
        (
            format!("oci://{closed}/acme/aws:1"),
            vec!["cannot reach registry", "connection"],
            false,
        ),
        (
            format!("oci://{silent}/acme/aws:1"),
            vec!["cannot reach registry", "timed out"],
            false,
        ),
    ];
    for (reference, needles, logged_in) in cases {
        let user = User::new(&reg.host());
        if logged_in {
            user.login(WRITER).ok();
        }
        let started = Instant::now();
        let out = user.oci_in(
            &[
                "plugin",
                "pull",
                &reference,
                "--timeout",
                "2s",
                "--insecure-registry",
                "registry.invalid:5000",
            ],
            None,
        );
        out.fails_with(&needles);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{reference} hung"
        );
        user.assert_cache_empty();
    }

    // Plain HTTP to a remote registry needs it listed as insecure.
    let user = User::new("example.com:5000");
    user.oci(&["plugin", "pull", "oci://example.com:5000/acme/aws:1"])
        .fails_with(&["refusing plain HTTP", "insecure"]);
    // Login with a wrong password, and push of something that is not a plugin.
    let user = User::new(&reg.host());
    user.login(("alice", "nope"))
        .fails_with(&["login to", "rejected"]);
    user.login(WRITER).ok();
    user.oci(&[
        "plugin",
        "push",
        &core.display().to_string(),
        &reg.reference("bad/push:1"),
    ])
    .fails_with(&["not a usable Flotilla plugin", "core WebAssembly module"]);
    user.oci(&[
        "plugin",
        "push",
        guests::STATIC_PLUGIN,
        &reg.reference("bad/push"),
    ])
    .fails_with(&["no implicit :latest"]);
    let (key, _) = user.keys("cosign");
    user.raw(
        &[
            "plugin",
            "sign",
            &reg.reference("bad/text:1"),
            "--key",
            &key,
            "--plain-http",
        ],
        None,
    )
    .fails_with(&["not a Wasm plugin artifact"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_shows_progress_only_on_a_terminal() {
    let reg = Registry::start(Mode::Anonymous).await;
    let user = User::new(&reg.host());
    let r = reg.reference("progress/template:1");
    user.oci(&["plugin", "push", guests::TEMPLATE_PLUGIN, &r])
        .ok();
    // Not a terminal: quiet.
    let quiet = user.oci(&["plugin", "pull", &r]);
    assert!(!quiet.ok().err.contains("pulling"), "{}", quiet.err);
    // A pseudo-terminal via util-linux `script`: a progress bar; with --json, none.
    let run_tty = |extra: &str| {
        let cmd = format!(
            "{} plugin pull {r} --plain-http --cache-dir {} {extra}",
            env!("CARGO_BIN_EXE_flotilla"),
            user.dir
                .path()
                .join(format!("tty-cache{}", extra.len()))
                .display()
        );
        let out = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("FLOTILLA_LOG", "warn")
            .output()
            .unwrap_or_else(|e| panic!("script (util-linux): {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tty = run_tty("");
    assert!(tty.contains("pulling wasm layer"), "{tty}");
    let tty_json = run_tty("--json");
    assert!(!tty_json.contains("pulling"), "{tty_json}");
    assert!(tty_json.contains("\"digest\""), "{tty_json}");
}

#[test]
fn config_check_reports_oci_mistakes_with_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("flotilla.toml");
    std::fs::write(
        &path,
        format!(
            r#"[oci]
insecure_registries = ["http://127.0.0.1:5000"]

[[pool]]
name = "a"
max_instances = 1
plugin = "oci://registry/flotilla"

[[pool]]
name = "b"
max_instances = 1
plugin = "{}"
verify = {{ key = "cosign.pub" }}
pull_policy = "always"

[[pool]]
name = "c"
max_instances = 1
plugin = "oci://127.0.0.1:5000/flotilla/static:1"
verify = {{ key = "missing.pub" }}
"#,
            guests::STATIC_PLUGIN
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["config", "check", "-c"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in [
        ":2: oci.insecure_registries[0]",
        ":7: pool[0].plugin",
        "not a registry host",
        ":13: pool[1].verify",
        ":14: pool[1].pull_policy",
        ":20: pool[2].verify.key",
    ] {
        assert!(err.contains(needle), "missing {needle:?}:\n{err}");
    }
    // A bad policy value is a type error with its line.
    std::fs::write(
        &path,
        "[[pool]]\nname = \"a\"\nmax_instances = 1\nplugin = \"oci://127.0.0.1:5000/a/b:1\"\npull_policy = \"sometimes\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["config", "check", "-c"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":5:") && err.contains("if-not-present"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_policy_always_sees_a_moved_tag_and_if_not_present_does_not() {
    let reg = Registry::start(Mode::Anonymous).await;
    let user = User::new(&reg.host());
    let r = reg.reference("policy/p:1");
    user.oci(&["plugin", "push", guests::STATIC_PLUGIN, &r])
        .ok();
    let first = user
        .load_pool(&format!("plugin = \"{r}\""))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    user.oci(&["plugin", "push", guests::TEMPLATE_PLUGIN, &r])
        .ok();
    let cached = user
        .load_pool(&format!("plugin = \"{r}\""))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        first.sha256, cached.sha256,
        "if-not-present must not re-resolve"
    );
    let always = user
        .load_pool(&format!("plugin = \"{r}\"\npull_policy = \"always\""))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(always.sha256, sha256_file(guests::TEMPLATE_PLUGIN));
}

/// A registry that lies: wrong manifest bytes for a pinned digest, a layer whose bytes do not
/// match its descriptor, and a layer longer than declared.
async fn lying_registry() -> std::net::SocketAddr {
    use axum::http::{HeaderMap, StatusCode, Uri};
    let wasm = std::fs::read(guests::STATIC_PLUGIN).unwrap_or_default();
    let config = CNCF_CONFIG.as_bytes().to_vec();
    let digest = |b: &[u8]| format!("sha256:{}", flotilla_net::sha256_hex(b));
    let manifest = |layer_digest: &str, layer_size: usize| {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": WASM_CONFIG_TYPE, "digest": digest(&config), "size": config.len() },
            "layers": [{ "mediaType": "application/wasm", "digest": layer_digest, "size": layer_size }],
        })
        .to_string()
    };
    let honest = manifest(&digest(&wasm), wasm.len());
    let short = manifest(&digest(&wasm[..100]), 100);
    let (config_digest, wasm_digest) = (digest(&config), digest(&wasm));
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let (honest, short, config, wasm) =
            (honest.clone(), short.clone(), config.clone(), wasm.clone());
        let (config_digest, wasm_digest) = (config_digest.clone(), wasm_digest.clone());
        async move {
            let path = uri.path().to_string();
            let mut headers = HeaderMap::new();
            headers.insert(
                "content-type",
                "application/vnd.oci.image.manifest.v1+json"
                    .parse()
                    .unwrap_or_else(|_| unreachable!()),
            );
            let body: Vec<u8> = if path == "/v2/" {
                b"{}".to_vec()
            } else if path.starts_with("/v2/lie/pinned/manifests/")
                || path == "/v2/lie/blob/manifests/1"
            {
                honest.into_bytes()
            } else if path == "/v2/lie/huge/manifests/1" {
                vec![b' '; 5 << 20]
            } else if path == "/v2/lie/long/manifests/1" {
                short.into_bytes()
            } else if path.ends_with(&format!("/blobs/{config_digest}")) {
                config
            } else if path.starts_with("/v2/lie/blob/blobs/") && path.ends_with(&wasm_digest) {
                let mut w = wasm;
                w[10] ^= 0x55;
                w
            } else if path.starts_with("/v2/lie/long/blobs/") {
                wasm
            } else {
                return (
                    StatusCode::NOT_FOUND,
                    headers,
                    br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#.to_vec(),
                );
            };
            (StatusCode::OK, headers, body)
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_registry_is_caught_and_nothing_is_cached() {
    let addr = lying_registry().await;
    let other = format!("sha256:{}", "ab".repeat(32));
    for (reference, needles) in [
        (
            format!("oci://{addr}/lie/pinned@{other}"),
            vec!["failed digest verification", other.as_str()],
        ),
        (
            format!("oci://{addr}/lie/blob:1"),
            vec!["wasm layer", "failed digest verification"],
        ),
        (
            format!("oci://{addr}/lie/huge:1"),
            vec!["manifest", "too large", "limit 4194304"],
        ),
        (
            format!("oci://{addr}/lie/long:1"),
            vec!["wasm layer", "more than 100 bytes"],
        ),
    ] {
        let user = User::new(&addr.to_string());
        user.oci(&["plugin", "pull", &reference])
            .fails_with(&needles);
        user.assert_cache_empty();
    }
}

/// A registry whose signature layers never end: one streams the payload's bytes forever, one
/// answers its GET with an endless error. Each costs a bounded read and an error that names
/// the size, and nothing is cached.
async fn bottomless_signature_registry() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use futures_util::StreamExt as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    // Bytes of the bottomless bodies handed to the connection: 256 MiB each if nobody stops
    // reading, so a reader without a bound takes them all (and the test can see it).
    let served = std::sync::Arc::new(AtomicU64::new(0));
    let counter = served.clone();
    use axum::http::{StatusCode, Uri};
    let wasm = std::fs::read(guests::STATIC_PLUGIN).unwrap_or_default();
    let config = CNCF_CONFIG.as_bytes().to_vec();
    let digest = |b: &[u8]| format!("sha256:{}", flotilla_net::sha256_hex(b));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": WASM_CONFIG_TYPE, "digest": digest(&config), "size": config.len() },
        "layers": [{ "mediaType": "application/wasm", "digest": digest(&wasm), "size": wasm.len() }],
    })
    .to_string();
    let signed = digest(manifest.as_bytes()).replacen(':', "-", 1) + ".sig";
    let payload_digest = format!("sha256:{}", "cd".repeat(32));
    let signatures = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(b"{}"), "size": 2 },
        "layers": [{
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": payload_digest,
            "size": 200,
            "annotations": { "dev.cosignproject.cosign/signature": "MEUCIQ==" },
        }],
    })
    .to_string();
    let endless = move || {
        let served = counter.clone();
        axum::body::Body::from_stream(
            futures_util::stream::repeat_with(move || {
                served.fetch_add(64 * 1024, Ordering::Relaxed);
                Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 64 * 1024]))
            })
            .take(4096),
        )
    };
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let (manifest, signatures, config, wasm) = (
            manifest.clone(),
            signatures.clone(),
            config.clone(),
            wasm.clone(),
        );
        let (signed, payload_digest) = (signed.clone(), payload_digest.clone());
        let endless = endless.clone();
        async move {
            let path = uri.path().to_string();
            let typed = |body: axum::body::Body| {
                axum::response::Response::builder()
                    .header("content-type", "application/vnd.oci.image.manifest.v1+json")
                    .body(body)
                    .unwrap_or_default()
            };
            if path == "/v2/" {
                typed("{}".into())
            } else if path.ends_with(&format!("/manifests/{signed}")) {
                typed(signatures.into())
            } else if path.contains("/manifests/") {
                typed(manifest.into())
            } else if path.ends_with(&format!("/blobs/{payload_digest}")) {
                if path.starts_with("/v2/bottomless/error/") {
                    let mut answer = typed(endless());
                    *answer.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    answer
                } else {
                    typed(endless())
                }
            } else if path.contains("/blobs/sha256:") && path.ends_with(&digest(&config)) {
                typed(config.into())
            } else if path.contains("/blobs/") {
                typed(wasm.into())
            } else {
                let mut answer = typed("{}".into());
                *answer.status_mut() = StatusCode::NOT_FOUND;
                answer
            }
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (addr, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bottomless_signature_costs_a_bounded_read() {
    let (addr, served) = bottomless_signature_registry().await;
    for (repository, needles) in [
        (
            "bottomless/payload",
            vec!["signature payload", "too large", "limit 200"],
        ),
        (
            "bottomless/error",
            vec!["error answer", "too large", "limit 65536"],
        ),
    ] {
        let user = User::new(&addr.to_string());
        let (_, public) = user.keys("cosign");
        let reference = format!("oci://{addr}/{repository}:1");
        let before = served.load(std::sync::atomic::Ordering::Relaxed);
        user.oci(&["plugin", "pull", &reference, "--verify-key", &public])
            .fails_with(&needles);
        user.assert_cache_empty();
        // What the connection buffers before the reader stops, not the 256 MiB on offer.
        let taken = served.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!(taken < 32 << 20, "{repository}: {taken} bytes served");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_registry_with_a_private_ca() {
    let reg = Registry::start_tls(Mode::Basic).await;
    let ca = reg.ca_file().display().to_string();
    let user = User::new(&reg.host());
    let r = reg.reference("tls/static:1");
    // Not trusted: one clear line, nothing sent.
    user.https(
        &["plugin", "login", &reg.host(), "-u", WRITER.0],
        Some(&format!("{}\n", WRITER.1)),
    )
    .fails_with(&["cannot reach registry", "certificate"]);
    user.https(
        &[
            "plugin",
            "login",
            &reg.host(),
            "-u",
            WRITER.0,
            "--ca-file",
            &ca,
        ],
        Some(&format!("{}\n", WRITER.1)),
    )
    .ok();
    user.https(&["plugin", "push", guests::STATIC_PLUGIN, &r], None)
        .fails_with(&["cannot reach registry", "certificate"]);
    user.https(
        &[
            "plugin",
            "push",
            guests::STATIC_PLUGIN,
            &r,
            "--ca-file",
            &ca,
        ],
        None,
    )
    .ok();
    // Plain HTTP against the TLS port fails too: the flag does not downgrade silently.
    assert_eq!(user.oci(&["plugin", "pull", &r]).code, 1);
    // The config's [oci] tls_ca_files.
    let loaded = user
        .load_pool_oci(
            &format!("plugin = \"{r}\""),
            &format!("tls_ca_files = [\"{ca}\"]"),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(loaded.sha256, sha256_file(guests::STATIC_PLUGIN));
    let fresh = User::new(&reg.host());
    fresh.docker_config(READER);
    let err = fresh
        .load_pool_oci(&format!("plugin = \"{r}\""), "")
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(err.contains("certificate"), "{err}");
}

/// A registry that asks for a token and whose token realm answers without end, and one that
/// sends a manifest a byte at a time. The first costs a bounded read and an error naming the
/// size; the second ends at the pull's overall timeout though every read is quick.
async fn hostile_token_and_slow_registry() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use futures_util::StreamExt as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    let served = std::sync::Arc::new(AtomicU64::new(0));
    let counter = served.clone();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let served = counter.clone();
        async move {
            let path = uri.path().to_string();
            let answer = axum::response::Response::builder();
            if path == "/v2/" {
                return answer
                    .status(401)
                    .header(
                        "www-authenticate",
                        format!(r#"Bearer realm="http://{addr}/token",service="hostile""#),
                    )
                    .body(axum::body::Body::from("{}"))
                    .unwrap_or_default();
            }
            if path == "/token" {
                // 256 MiB of token, if nobody stops reading.
                let body = futures_util::stream::repeat_with(move || {
                    served.fetch_add(64 * 1024, Ordering::Relaxed);
                    Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 64 * 1024]))
                })
                .take(4096);
                return answer
                    .body(axum::body::Body::from_stream(body))
                    .unwrap_or_default();
            }
            answer
                .status(404)
                .body(axum::body::Body::from("{}"))
                .unwrap_or_default()
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (addr, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_token_answer_costs_a_bounded_read() {
    let (addr, served) = hostile_token_and_slow_registry().await;
    let user = User::new(&addr.to_string());
    let reference = format!("oci://{addr}/hostile/token:1");
    user.oci(&["plugin", "pull", &reference]).fails_with(&[
        "token answer",
        "too large",
        "limit 65536",
    ]);
    user.assert_cache_empty();
    let taken = served.load(std::sync::atomic::Ordering::Relaxed);
    assert!(taken < 32 << 20, "{taken} bytes of token served");
}

/// A registry that answers every request, a byte every half second: no read ever waits
/// long, so only the pull's overall bound ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_dribbles_is_cut_at_the_pull_timeout() {
    use futures_util::StreamExt as _;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let app = axum::Router::new().fallback(|| async {
        let body = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b" ")), ()))
        })
        .take(600);
        axum::response::Response::builder()
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(axum::body::Body::from_stream(body))
            .unwrap_or_default()
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let user = User::new(&addr.to_string());
    let started = std::time::Instant::now();
    user.oci(&[
        "plugin",
        "pull",
        &format!("oci://{addr}/slow/plugin:1"),
        "--pull-timeout",
        "3s",
    ])
    .fails_with(&["did not finish within 3s", "pull_timeout"]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

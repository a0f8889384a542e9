//! The registry commands of `flotilla plugin`: push, pull, inspect, login, logout, ls, sign
//! and generate-key. Each returns its standard output, or one [`OciError`] line for standard
//! error.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use zeroize::Zeroizing;

use flotilla_oci::{
    AuthStore, KeyPair, OciError, OciRef, PublicKey, PullPolicy, PushAnnotations, Registry,
    RegistryOptions, Store, generate_key_pair,
};
use flotilla_plugin_runtime::PluginRuntime;

/// Registry access flags shared by the OCI commands.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// Allow plain HTTP to this registry (host:port; repeatable).
    #[arg(long = "insecure-registry", global = true)]
    pub insecure: Vec<String>,
    /// Allow plain HTTP when the registry is on loopback.
    #[arg(long, global = true)]
    pub plain_http: bool,
    /// Connect and read timeout, e.g. 30s.
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// The longest a whole pull may take, e.g. 10m.
    #[arg(long, global = true, default_value = "10m", value_parser = humantime::parse_duration)]
    pub pull_timeout: Duration,
    /// Extra PEM root certificate for the registry's TLS (repeatable).
    #[arg(long = "ca-file", global = true)]
    pub ca_files: Vec<PathBuf>,
    /// Cache directory (default: the user's cache dir); artifacts live in its `oci/`.
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
}

fn compile_cache(args: &RegistryArgs) -> Option<PathBuf> {
    args.cache_dir
        .as_ref()
        .map(|d| d.to_path_buf())
        .or_else(flotilla_plugin_runtime::default_cache_dir)
}

/// Builds the registry client for a command; progress only on a terminal and not for JSON.
pub fn registry(args: &RegistryArgs, json: bool) -> Result<Registry, OciError> {
    let store = Store::for_cache_dir(args.cache_dir.as_deref())?;
    let opts = RegistryOptions {
        insecure: args.insecure.clone(),
        plain_http_loopback: args.plain_http,
        timeout: args.timeout,
        progress: !json && std::io::stderr().is_terminal(),
        ca_files: args.ca_files.clone(),
        pull_timeout: args.pull_timeout,
    };
    Ok(Registry::new(opts, AuthStore::default_paths(), store))
}

fn runtime(args: &RegistryArgs) -> Result<PluginRuntime, OciError> {
    PluginRuntime::new(flotilla_plugin_runtime::RuntimeOptions {
        cache_dir: compile_cache(args),
    })
    .map_err(|e| OciError::Local {
        path: "(plugin runtime)".to_string(),
        why: e.to_string(),
    })
}

fn render(json_out: bool, value: serde_json::Value, text: String) -> String {
    if json_out {
        serde_json::to_string_pretty(&value).unwrap_or_default() + "\n"
    } else {
        text
    }
}

/// `plugin push FILE REF`: refuses anything `plugin check` would refuse.
pub async fn push(
    args: &RegistryArgs,
    file: &Path,
    reference: &str,
    annotations: &[String],
    json_out: bool,
) -> Result<String, OciError> {
    let r = OciRef::parse(reference)?;
    let annotations =
        PushAnnotations::parse(annotations).map_err(|why| OciError::BadReference {
            reference: reference.to_string(),
            why,
        })?;
    let runtime = runtime(args)?;
    let bytes = std::fs::read(file).map_err(|e| OciError::local(file, e))?;
    let loaded = runtime
        .load_bytes(&file.display().to_string(), &bytes)
        .map_err(|e| OciError::InvalidComponent {
            source_name: file.display().to_string(),
            why: e.to_string(),
        })?;
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "plugin.wasm".to_string());
    let registry = registry(args, json_out)?;
    let digest = registry
        .push(&bytes, &name, &loaded.shape.world, &r, annotations)
        .await?;
    let pinned = r.pinned(&digest);
    Ok(render(
        json_out,
        json!({ "reference": r.to_string(), "digest": digest, "pinned": pinned.to_string(), "size": bytes.len() }),
        format!("pushed {r}\ndigest: {digest}\npin with: {pinned}\n"),
    ))
}

/// `plugin pull REF [-o FILE]`: pulls into the cache (validated), optionally copies out.
pub async fn pull(
    args: &RegistryArgs,
    reference: &str,
    out: Option<&Path>,
    verify_key: Option<&Path>,
    json_out: bool,
) -> Result<String, OciError> {
    let r = OciRef::parse(reference)?;
    let key = verify_key.map(PublicKey::load).transpose()?;
    let runtime = runtime(args)?;
    let source = r.to_string();
    let validate = flotilla_plugin_runtime::loader::component_check(&runtime, &source);
    let registry = registry(args, json_out)?;
    let pulled = registry
        .pull(&r, PullPolicy::Always, key.as_ref(), Some(&validate))
        .await?;
    if let Some(out) = out {
        registry.export(&pulled, out)?;
    }
    let dest = out.map_or_else(|| pulled.wasm.clone(), Path::to_path_buf);
    Ok(render(
        json_out,
        json!({
            "reference": r.to_string(),
            "digest": pulled.digest,
            "pinned": pulled.reference.to_string(),
            "size": pulled.size,
            "file": dest,
            "signature_verified": pulled.verified,
        }),
        format!(
            "pulled {r}\ndigest: {}\nfile:   {} ({} bytes){}\n",
            pulled.digest,
            dest.display(),
            pulled.size,
            if pulled.verified {
                "\nsignature: verified"
            } else {
                ""
            }
        ),
    ))
}

/// `plugin inspect REF`: manifest and config only, the layer is not downloaded.
pub async fn inspect(
    args: &RegistryArgs,
    reference: &str,
    json_out: bool,
) -> Result<String, OciError> {
    let r = OciRef::parse(reference)?;
    let info = registry(args, json_out)?.inspect(&r).await?;
    Ok(render(
        json_out,
        serde_json::to_value(&info).unwrap_or_default(),
        info.render(),
    ))
}

fn registry_name(text: &str) -> Result<String, OciError> {
    let trimmed = text
        .trim_start_matches("oci://")
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    OciRef::parse(&format!("oci://{trimmed}/x:y"))
        .ok()
        .filter(|_| !trimmed.contains('/'))
        .map(|r| r.registry)
        .ok_or_else(|| OciError::BadReference {
            reference: text.to_string(),
            why: "expected a registry host[:port], e.g. ghcr.io or 127.0.0.1:5000".to_string(),
        })
}

/// `plugin login REGISTRY -u USER` with the password on stdin; checked before it is saved.
pub async fn login(
    args: &RegistryArgs,
    registry_text: &str,
    user: &str,
    stdin: impl std::io::BufRead,
) -> Result<String, OciError> {
    let name = registry_name(registry_text)?;
    let password = flotilla_oci::read_password(stdin).map_err(|why| OciError::Login {
        registry: name.clone(),
        why,
    })?;
    let registry = registry(args, true)?;
    let probe_ref = OciRef::parse(&format!("oci://{name}/x:y"))?;
    let base = registry.base_url(&probe_ref)?;
    let http = registry.http()?;
    let needed = flotilla_oci::login_probe(&http, &base, &name, user, &password).await?;
    AuthStore::default_paths().save(&name, user, &password)?;
    Ok(if needed {
        format!("login succeeded; credentials for {name} saved\n")
    } else {
        format!("{name} accepts anonymous access; credentials saved anyway\n")
    })
}

/// `plugin logout REGISTRY`.
pub fn logout(registry_text: &str) -> Result<String, OciError> {
    let name = registry_name(registry_text)?;
    if AuthStore::default_paths().remove(&name)? {
        Ok(format!("removed credentials for {name}\n"))
    } else {
        Ok(format!("no stored credentials for {name}\n"))
    }
}

/// `plugin ls`: what the cache holds.
pub fn ls(args: &RegistryArgs, json_out: bool) -> Result<String, OciError> {
    let store = Store::for_cache_dir(args.cache_dir.as_deref())?;
    let index = store.index();
    let entries: Vec<_> = index
        .values()
        .map(|e| {
            let present = store.blob_path(&e.layer_digest).is_some();
            (e, present)
        })
        .collect();
    // The built-in plugins first: always present, pinned by the binary itself.
    let builtins = flotilla_builtin::ALL.iter().map(|b| {
        (
            format!("{}{}", flotilla_builtin::PREFIX, b.name),
            format!("sha256:{}", flotilla_net::sha256_hex(b.bytes)),
            b.bytes.len(),
        )
    });
    let mut listed: Vec<serde_json::Value> = builtins
        .clone()
        .map(|(reference, digest, size)| {
            json!({
                "reference": reference,
                "source": "builtin",
                "digest": digest,
                "size": size,
                "cached": true,
            })
        })
        .collect();
    listed.extend(entries.iter().map(|(e, present)| {
        json!({
            "reference": e.reference,
            "source": "cache",
            "digest": e.digest,
            "size": e.size,
            "resolved_at": e.resolved_at,
            "signature_verified": e.signature_verified,
            "cached": present,
        })
    }));
    let mut text = format!(
        "{:<60} {:<71} {:>10} SIGNED\n",
        "REFERENCE", "DIGEST", "SIZE"
    );
    for (reference, digest, size) in builtins {
        text.push_str(&format!(
            "{reference:<60} {digest:<71} {size:>10} built in\n"
        ));
    }
    for (e, present) in &entries {
        text.push_str(&format!(
            "{:<60} {:<71} {:>10} {}{}\n",
            e.reference,
            e.digest,
            e.size,
            if e.signature_verified { "yes" } else { "no" },
            if *present { "" } else { " (blob missing)" }
        ));
    }
    if entries.is_empty() {
        text.push_str(&format!(
            "(no pulled plugins cached in {})\n",
            store.root().display()
        ));
    }
    Ok(render(json_out, serde_json::Value::Array(listed), text))
}

fn key_password() -> Zeroizing<Vec<u8>> {
    Zeroizing::new(
        std::env::var("COSIGN_PASSWORD")
            .unwrap_or_default()
            .into_bytes(),
    )
}

/// `plugin sign REF --key cosign.key` (password from `COSIGN_PASSWORD`, as with cosign).
pub async fn sign(args: &RegistryArgs, reference: &str, key: &Path) -> Result<String, OciError> {
    let r = OciRef::parse(reference)?;
    let pair = KeyPair::load(key, &key_password())?;
    let (digest, tag) = registry(args, true)?.sign(&r, &pair).await?;
    Ok(format!(
        "signed {r}\ndigest: {digest}\nsignature tag: {tag}\n"
    ))
}

/// `plugin generate-key PREFIX`: writes `PREFIX.key` (encrypted with `COSIGN_PASSWORD`) and `PREFIX.pub`.
pub fn generate_key(prefix: &Path) -> Result<String, OciError> {
    let private_path = prefix.with_extension("key");
    let public_path = prefix.with_extension("pub");
    for p in [&private_path, &public_path] {
        if p.exists() {
            return Err(OciError::Key {
                path: p.display().to_string(),
                why: "already exists; refusing to overwrite a key".to_string(),
            });
        }
    }
    let (private, public) = generate_key_pair(&key_password()).map_err(|why| OciError::Key {
        path: private_path.display().to_string(),
        why,
    })?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    use std::io::Write;
    options
        .open(&private_path)
        .and_then(|mut f| f.write_all(private.as_bytes()))
        .map_err(|e| OciError::local(&private_path, e))?;
    std::fs::write(&public_path, public).map_err(|e| OciError::local(&public_path, e))?;
    Ok(format!(
        "private key: {}\npublic key:  {}\n",
        private_path.display(),
        public_path.display()
    ))
}

//! The helper-command stages: `restore_cache`, `archive_cache*`, `download_artifacts` and
//! `upload_artifacts_*`, following `shells/abstract.go` (`cacheExtractor`, `archiveCache`,
//! `downloadAllArtifacts`, `writeUploadArtifacts`). Every helper call sits behind
//! `guardRunnerCommand`: a missing `gitlab-runner` only prints a warning.
//!
//! Owns: the helper command lines and cache keys. Must not know: git.

use super::shell::{Shell, join, relative};
use super::{
    Artifact, Cache, CacheAccess, CachePolicy, JobSpec, artifact_args, cache_args,
    cache_object_name, short_token, vars,
};

const CACHE_ENV_FILE: &str = "gitlab_runner_cache_env";
/// `CACHE_REQUEST_TIMEOUT`'s default, in minutes (`common/consts.go`).
const CACHE_REQUEST_TIMEOUT: &str = "10";

/// `newCacheConfig` without `FF_HASH_CACHE_KEYS`: the key sanitized, its archive relative to
/// the project dir, and the sha256 "alternate" key the helper may migrate from.
struct CacheKey {
    human: String,
    archive: String,
    alternate_key: String,
    alternate_archive: String,
}

/// `cache/cachekey/cachekey.go` `Sanitize`.
fn sanitize(key: &str) -> Result<String, String> {
    let decoded = key
        .replace("%2f", "/")
        .replace("%2F", "/")
        .replace("%2e", ".")
        .replace("%2E", ".")
        .replace('\\', "/");
    let cleaned = super::shell::clean(&format!("/{decoded}"));
    let mut parts: Vec<&str> = cleaned[1..].split('/').collect();
    while let Some(last) = parts.last_mut() {
        *last = last.trim_end();
        if !last.is_empty() {
            break;
        }
        parts.pop();
    }
    let key_out = parts.join("/");
    if key_out.is_empty() {
        return Err(format!(
            "cache key {} could not be sanitized",
            super::shell::go_quote(key)
        ));
    }
    Ok(key_out)
}

fn sha256_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `newCacheConfig`: `Err` carries the notice; the warning (if any) is printed first.
fn cache_key(w: &mut Shell, spec: &JobSpec, key: &str) -> Result<CacheKey, String> {
    let raw = expand(spec, key);
    let human = match sanitize(&raw) {
        Ok(h) if h != raw => {
            let (from, to) = (super::shell::go_quote(&raw), super::shell::go_quote(&h));
            w.warning(&format!("cache key {from} sanitized to {to}"));
            h
        }
        Ok(h) => h,
        Err(e) => {
            w.warning(&e);
            return Err("empty cache key".into());
        }
    };
    let project = spec.project_dir();
    let archive = |k: &str| relative(&project, &join(&[&spec.build_cache_dir(), k, "cache.zip"]));
    let alternate_key = sha256_hex(&human);
    Ok(CacheKey {
        archive: archive(&human),
        alternate_archive: archive(&alternate_key),
        alternate_key,
        human,
    })
}

fn expand(spec: &JobSpec, text: &str) -> String {
    let all = vars::all(spec, None);
    let tmp = spec.tmp_dir();
    vars::expand(text, &|name| {
        all.iter()
            .rev()
            .find(|v| v.key == name)
            .map(|v| {
                if v.file {
                    format!("{tmp}/{}", v.key)
                } else {
                    v.value.clone()
                }
            })
            .unwrap_or_default()
    })
}

fn object(spec: &JobSpec, key: &str, sharded: bool) -> Option<String> {
    let short = short_token(&spec.runner_token);
    cache_object_name(
        &spec.cache_path,
        spec.cache_shared,
        &short,
        spec.project_id,
        key,
        sharded,
    )
}

/// `guardRunnerCommand`: `body` runs only where `<runner> --version` succeeds.
fn guard(w: &mut Shell, spec: &JobSpec, action: &str, body: impl FnOnce(&mut Shell)) {
    w.if_cmd(&spec.runner_command, &["--version"]);
    body(w);
    w.else_();
    w.warning(&format!(
        "Missing {}. {action} is disabled.",
        spec.runner_command
    ));
    w.end_if();
}

/// `writeRestoreCacheScript` / `cacheExtractor`.
pub fn restore(w: &mut Shell, spec: &JobSpec) {
    vars::exports(w, spec, false, None);
    w.cd(&spec.project_dir());
    for cache in &spec.caches {
        if cache_args(cache).is_empty() {
            continue;
        }
        let key = match cache_key(w, spec, &spec.sent_cache_key(cache, &cache.key)) {
            Ok(k) => k,
            Err(e) => {
                w.notice(&format!("Skipping cache extraction due to {e}"));
                continue;
            }
        };
        if cache.policy == CachePolicy::Push {
            w.notice(&format!(
                "Not downloading cache {} due to policy",
                key.human
            ));
            continue;
        }
        let keys = fallbacks(w, spec, cache, key);
        guard(w, spec, "Extracting cache", |w| extract(w, spec, &keys));
    }
    change_ownership(w, spec, &[&spec.build_cache_dir(), &spec.builds_dir]);
}

/// `extractCacheOrFallbackCachesWrapper`: the key, then `cache:fallback_keys` (suffixed by
/// GitLab), then `CACHE_FALLBACK_KEY`, which may not end in `-protected`.
fn fallbacks(w: &mut Shell, spec: &JobSpec, cache: &Cache, first: CacheKey) -> Vec<CacheKey> {
    let mut keys = vec![first];
    for fallback in &cache.fallback_keys {
        match cache_key(
            w,
            spec,
            &spec.sent_cache_key(cache, &expand(spec, fallback)),
        ) {
            Ok(k) => keys.push(k),
            Err(e) => w.notice(&format!("Skipping cache extraction due to {e}")),
        }
    }
    let Some(fallback) = vars::setting(spec, "CACHE_FALLBACK_KEY") else {
        return keys;
    };
    if fallback
        .trim_end_matches(['.', ' '])
        .ends_with("-protected")
    {
        let quoted = super::shell::go_quote(&fallback);
        w.warning(&format!(
            "CACHE_FALLBACK_KEY {quoted} not allowed to end in \"-protected\""
        ));
        return keys;
    }
    match cache_key(w, spec, &fallback) {
        Ok(k) => keys.push(k),
        Err(e) => w.notice(&format!("Skipping cache extraction due to {e}")),
    }
    keys
}

/// `addExtractCacheCommand`: one extractor call; on failure the next key, nested in `else`.
fn extract(w: &mut Shell, spec: &JobSpec, keys: &[CacheKey]) {
    let Some((key, rest)) = keys.split_first() else {
        return;
    };
    let mut args: Vec<String> = [
        "cache-extractor",
        "--file",
        &key.archive,
        "--timeout",
        CACHE_REQUEST_TIMEOUT,
    ]
    .map(String::from)
    .to_vec();
    w.notice(&format!("Checking cache for {}...", key.human));
    let env_file = download_args(w, spec, key, &mut args);
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    w.if_cmd_with_output(&spec.runner_command, &words);
    w.notice("Successfully extracted cache");
    w.else_();
    w.warning("Failed to extract cache");
    extract(w, spec, rest);
    w.end_if();
    if let Some(file) = env_file {
        w.rm_file(&file);
    }
}

/// `getCacheDownloadURLAndEnv` and `getAlternateCacheDownloadURL`: the object's GoCloud URL
/// (with an env file, whose path is returned) or presigned URLs, then the sha256-named
/// object's, sharded as `FF_HASH_CACHE_KEYS` would have stored it.
fn download_args(
    w: &mut Shell,
    spec: &JobSpec,
    key: &CacheKey,
    args: &mut Vec<String>,
) -> Option<String> {
    let access =
        |object: Option<String>| object.map_or(CacheAccess::None, |o| spec.cache_urls.download(&o));
    let mut env_file = None;
    match access(object(spec, &key.human, false)) {
        CacheAccess::GoCloud { url, env } => {
            args.extend(["--gocloud-url".to_string(), url]);
            if !env.is_empty() {
                let file = w.dot_env(CACHE_ENV_FILE, &env);
                args.extend(["--env-file".to_string(), file.clone()]);
                env_file = Some(file);
            }
        }
        CacheAccess::Presigned { url, head_url, .. } => {
            args.extend(["--url".to_string(), url]);
            args.extend(
                head_url
                    .into_iter()
                    .flat_map(|h| ["--head-url".to_string(), h]),
            );
        }
        CacheAccess::None => {}
    }
    match access(object(spec, &key.alternate_key, true)) {
        CacheAccess::GoCloud { url, .. } => {
            args.extend(["--alternate-gocloud-url".to_string(), url])
        }
        CacheAccess::Presigned { url, head_url, .. } => {
            args.extend(["--alternate-url".to_string(), url]);
            args.extend(
                head_url
                    .into_iter()
                    .flat_map(|h| ["--alternate-head-url".to_string(), h]),
            );
        }
        CacheAccess::None => {}
    }
    env_file
}

/// `cacheArchiver` / `archiveCache`.
pub fn archive(w: &mut Shell, spec: &JobSpec, succeeded: bool) {
    vars::exports(w, spec, false, None);
    w.cd(&spec.project_dir());
    for cache in &spec.caches {
        let paths = cache_args(cache);
        if !cache.when.applies(succeeded) || paths.is_empty() {
            continue;
        }
        let key = match cache_key(w, spec, &spec.sent_cache_key(cache, &cache.key)) {
            Ok(k) => k,
            Err(e) => {
                w.notice(&format!("Skipping cache archiving due to {e}"));
                continue;
            }
        };
        if cache.policy == CachePolicy::Pull {
            w.notice(&format!("Not uploading cache {} due to policy", key.human));
            continue;
        }
        upload_cache(w, spec, &key, paths);
    }
}

/// `addCacheUploadCommand`: the archiver always gets an env file, for `CACHE_METADATA`.
fn upload_cache(w: &mut Shell, spec: &JobSpec, key: &CacheKey, paths: Vec<String>) {
    let mut args: Vec<String> = [
        "cache-archiver",
        "--file",
        &key.archive,
        "--alternate-file",
        &key.alternate_archive,
        "--timeout",
        CACHE_REQUEST_TIMEOUT,
    ]
    .map(String::from)
    .to_vec();
    args.extend(paths);
    let metadata = serde_json::json!({ "cachekey": key.human }).to_string();
    // Go's encoding/json escapes these three for HTML safety.
    let metadata = metadata
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let mut env = vec![("CACHE_METADATA".to_string(), metadata)];
    let access =
        object(spec, &key.human, false).map_or(CacheAccess::None, |o| spec.cache_urls.upload(&o));
    match access {
        CacheAccess::GoCloud { url, env: extra } => {
            args.extend(["--gocloud-url".to_string(), url]);
            env.extend(extra);
        }
        CacheAccess::Presigned {
            url,
            head_url,
            headers,
        } => {
            args.extend(["--url".to_string(), url]);
            for (name, value) in headers {
                args.extend(["--header".to_string(), format!("{name}: {value}")]);
            }
            if let Some(head) = head_url {
                args.extend(["--check-url".to_string(), head]);
            }
        }
        CacheAccess::None => {}
    }
    guard(w, spec, "Creating cache", |w| {
        w.notice(&format!("Creating cache {}...", key.human));
        let file = w.dot_env(CACHE_ENV_FILE, &env);
        args.extend(["--env-file".to_string(), file.clone()]);
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        w.if_cmd_with_output(&spec.runner_command, &words);
        w.notice("Created cache");
        w.else_();
        w.warning("Failed to create cache");
        w.end_if();
        w.rm_file(&file);
    });
}

/// `writeDownloadArtifactsScript` / `downloadAllArtifacts`: one downloader call per
/// dependency, with that dependency's token.
pub fn download(w: &mut Shell, spec: &JobSpec) {
    vars::exports(w, spec, false, None);
    w.cd(&spec.project_dir());
    guard(w, spec, "Artifacts downloading", |w| {
        for dep in &spec.dependencies {
            w.notice(&format!(
                "Downloading artifacts for {} ({})...",
                dep.name, dep.id
            ));
            let id = dep.id.to_string();
            let args = [
                "artifacts-downloader",
                "--url",
                &spec.server_url,
                "--token",
                &dep.token,
                "--id",
                &id,
            ];
            w.command(&spec.runner_command, &args);
        }
    });
    change_ownership(w, spec, &[&spec.build_cache_dir(), &spec.builds_dir]);
}

/// `writeUploadArtifacts` / `writeUploadArtifact` (default upload timeouts: 1 h, and 10 min
/// for response headers; `common/consts.go`).
pub fn upload(w: &mut Shell, spec: &JobSpec, succeeded: bool) {
    vars::exports(w, spec, false, None);
    w.cd(&spec.project_dir());
    for artifact in spec.artifacts.iter().filter(|a| a.when.applies(succeeded)) {
        let paths = artifact_args(artifact);
        if paths.is_empty() {
            continue;
        }
        let args = uploader_args(spec, artifact, paths);
        guard(w, spec, "Uploading artifacts", |w| {
            w.notice("Uploading artifacts...");
            let words: Vec<&str> = args.iter().map(String::as_str).collect();
            w.command(&spec.runner_command, &words);
        });
    }
}

fn uploader_args(spec: &JobSpec, artifact: &Artifact, paths: Vec<String>) -> Vec<String> {
    let id = spec.job_id.to_string();
    let mut args: Vec<String> = [
        "artifacts-uploader",
        "--url",
        &spec.server_url,
        "--token",
        &spec.token,
        "--id",
        &id,
        "--timeout",
        "1h0m0s",
        "--response-header-timeout",
        "10m0s",
    ]
    .map(String::from)
    .to_vec();
    args.extend(paths);
    let optional = [
        ("--name", artifact.name.clone()),
        ("--expire-in", artifact.expire_in.clone()),
        ("--artifact-format", Some(artifact.format.clone())),
        ("--artifact-type", Some(artifact.artifact_type.clone())),
    ];
    for (flag, value) in optional {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            args.extend([flag.to_string(), v]);
        }
    }
    args
}

/// `changeFilesOwnership`: only acts where the Kubernetes executor left its uid file, but the
/// lines are in every bash script.
pub fn change_ownership(w: &mut Shell, spec: &JobSpec, dirs: &[&str]) {
    let uid_file = format!("{}/.gitlab-build-uid-gid", spec.builds_dir);
    w.if_file(&uid_file);
    for dir in dirs.iter().filter(|d| !d.trim().is_empty()) {
        w.if_directory(dir);
        w.line(&format!(
            r#"chown -R "$(stat -c '%u:%g' '{uid_file}')" '{dir}'"#
        ));
        w.end_if();
    }
    w.end_if();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_are_sanitized_as_the_runner_does() {
        let table = [
            ("a%2Fb", Ok("a/b")),
            ("../../x", Ok("x")),
            ("a\\b/ ", Ok("a/b")),
            ("  ", Err(())),
        ];
        for (key, want) in table {
            assert_eq!(
                sanitize(key).map_err(|_| ()),
                want.map(String::from),
                "{key}"
            );
        }
    }
}

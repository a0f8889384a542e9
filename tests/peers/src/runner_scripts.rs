//! The stage scripts GitLab Runner's Custom executor hands to `run_exec`, generated for a test
//! runner from a [`JobSpec`], so a driver can be tested with what the real runner would send.
//! Written from the runner's source (snapshot 19.4.0, `shells/abstract.go` and
//! `shells/bash.go`), not copied: each part names the Go function it follows.
//!
//! What is modelled is what a driver meets: the bash wrapper (`BashWriter.Finish`), variable
//! exports (file variables written under `<project dir>.tmp/`), the git template and external
//! git config with `url.<with creds>.insteadOf`, init/fetch/checkout/clean, submodules, the
//! LFS guard, the `gitlab-runner` guards with their exact wording, the cache and artifacts
//! helper command lines (cache URLs come from the caller's [`CacheUrls`]), the fallback keys as
//! nested `else` branches, and the `clean_git_config` cleanup. `CI_DEBUG_TRACE=true` among the
//! variables adds `set -o xtrace`, as the runner does.
//!
//! Left out, as no driver sees them differ: feature flags other than their defaults (only the
//! flags the helper reads, and those that shaped these scripts, are exported), `GIT_CLONE_PATH`
//! (`custom_build_dir` is off for Custom), shared builds dirs, hooks and `pre_clone_script`,
//! the native-clone and tokenless-URL paths, proxy-exec, step-runner, secrets resolution,
//! artifact metadata (SLSA), `max_uploaded_archive_size`, PowerShell, and the long tail of
//! GitLab's predefined variables (the server's, project's, job's and commit's are exported).
//! GitLab's side of the payload is modelled where it shapes a script: refspecs
//! ([`JobSpec::refspecs`]) and the cache key suffixes ([`JobSpec::sent_cache_key`]).
//!
//! Owns: [`JobSpec`], [`script`], [`stages`], [`cache_object_name`]. Must not know: any driver.

use std::sync::Arc;

mod git;
mod shell;
mod transfer;
mod vars;

use shell::Shell;
#[cfg(test)]
use shell::{escape, quote_meta};

/// The runner version the scripts claim (`VERSION` of the snapshot they follow).
pub const RUNNER_VERSION: &str = "19.4.0";

/// `GIT_STRATEGY` (`common/build_settings.go` `GitStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitStrategy {
    Clone,
    Fetch,
    None,
    Empty,
}

impl GitStrategy {
    pub fn name(self) -> &'static str {
        match self {
            GitStrategy::Clone => "clone",
            GitStrategy::Fetch => "fetch",
            GitStrategy::None => "none",
            GitStrategy::Empty => "empty",
        }
    }
}

/// `GIT_SUBMODULE_STRATEGY` (`common/build_settings.go` `SubmoduleStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmoduleStrategy {
    None,
    Normal,
    Recursive,
}

impl SubmoduleStrategy {
    pub fn name(self) -> &'static str {
        match self {
            SubmoduleStrategy::None => "none",
            SubmoduleStrategy::Normal => "normal",
            SubmoduleStrategy::Recursive => "recursive",
        }
    }
}

/// `cache:policy` (`common/spec/spec.go` `CachePolicy`, `Cache.CheckPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachePolicy {
    Pull,
    Push,
    PullPush,
}

/// `cache:when` / `artifacts:when` (`spec.go` `CacheWhen.ShouldCache`, `ArtifactWhen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    OnSuccess,
    OnFailure,
    Always,
}

impl When {
    fn applies(self, succeeded: bool) -> bool {
        match self {
            When::Always => true,
            When::OnSuccess => succeeded,
            When::OnFailure => !succeeded,
        }
    }
}

/// One job variable as GitLab sends it (`spec.go` `Variable`). `masked` and `public` change
/// nothing in a script (masking is the trace's business); they are kept for the driver's env.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    pub key: String,
    pub value: String,
    pub public: bool,
    pub masked: bool,
    /// A file variable: the script writes the value to `<project dir>.tmp/<KEY>` and exports
    /// the path.
    pub file: bool,
    /// Not expanded (`Variables.ExpandWith` skips raw ones).
    pub raw: bool,
}

impl Variable {
    pub fn new(key: &str, value: &str) -> Variable {
        Variable {
            key: key.into(),
            value: value.into(),
            public: true,
            masked: false,
            file: false,
            raw: false,
        }
    }

    pub fn file(key: &str, value: &str) -> Variable {
        Variable {
            public: false,
            file: true,
            ..Variable::new(key, value)
        }
    }

    pub fn masked(key: &str, value: &str) -> Variable {
        Variable {
            public: false,
            masked: true,
            ..Variable::new(key, value)
        }
    }
}

/// One `cache:` entry as written in `.gitlab-ci.yml`; GitLab adds the protection suffix
/// before sending it ([`JobSpec::sent_cache_key`]).
#[derive(Debug, Clone)]
pub struct Cache {
    /// GitLab's default key is `default`.
    pub key: String,
    pub fallback_keys: Vec<String>,
    pub paths: Vec<String>,
    pub untracked: bool,
    pub policy: CachePolicy,
    pub when: When,
    /// `cache:unprotect`: always the `-non_protected` suffix.
    pub unprotect: bool,
}

impl Cache {
    pub fn new(key: &str, paths: &[&str]) -> Cache {
        Cache {
            key: key.into(),
            fallback_keys: Vec::new(),
            paths: paths.iter().map(|p| (*p).to_string()).collect(),
            untracked: false,
            policy: CachePolicy::PullPush,
            when: When::OnSuccess,
            unprotect: false,
        }
    }
}

/// The `artifacts:` archive as GitLab sends it (`app/presenters/ci/build_runner_presenter.rb`
/// `create_archive`: type `archive`, format `zip`).
#[derive(Debug, Clone)]
pub struct Artifact {
    pub name: Option<String>,
    pub paths: Vec<String>,
    pub exclude: Vec<String>,
    pub untracked: bool,
    pub when: When,
    pub expire_in: Option<String>,
    pub format: String,
    pub artifact_type: String,
}

impl Artifact {
    pub fn new(paths: &[&str]) -> Artifact {
        Artifact {
            name: None,
            paths: paths.iter().map(|p| (*p).to_string()).collect(),
            exclude: Vec::new(),
            untracked: false,
            when: When::OnSuccess,
            expire_in: None,
            format: "zip".into(),
            artifact_type: "archive".into(),
        }
    }
}

/// A job whose artifacts this one downloads (`spec.go` `Dependency`, with an artifacts file).
#[derive(Debug, Clone)]
pub struct Dependency {
    pub id: u64,
    pub name: String,
    pub token: String,
}

/// How the helper reaches one cache object, as the runner host's cache adapter answers
/// (`cache/cache.go` `Adapter`: `GetGoCloudURL` is preferred, else presigned URLs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheAccess {
    /// No `[runners.cache]`: the archive stays local (`nopAdapter`).
    None,
    Presigned {
        url: String,
        head_url: Option<String>,
        /// Upload only: headers the PUT must carry (`PresignedURL.Headers`).
        headers: Vec<(String, String)>,
    },
    GoCloud {
        url: String,
        /// Written to the env file the helper loads (credentials, `AZURE_STORAGE_*`, ...).
        env: Vec<(String, String)>,
    },
}

/// The caller's cache store: URLs for an object name from [`cache_object_name`]. The real
/// runner signs these on its host while generating the script (`getCacheDownloadURLAndEnv`,
/// `getCacheUploadURLAndEnv`).
pub trait CacheUrls: Send + Sync {
    fn download(&self, object: &str) -> CacheAccess;
    fn upload(&self, object: &str) -> CacheAccess;
}

/// No distributed cache configured.
pub struct NoCacheStore;

impl CacheUrls for NoCacheStore {
    fn download(&self, _object: &str) -> CacheAccess {
        CacheAccess::None
    }
    fn upload(&self, _object: &str) -> CacheAccess {
        CacheAccess::None
    }
}

/// One job as the runner sees it after GitLab's job payload and the driver's `config` answer.
#[derive(Clone)]
pub struct JobSpec {
    pub job_id: u64,
    pub job_name: String,
    pub token: String,
    pub project_id: u64,
    /// `group/name`.
    pub project_path: String,
    /// `CI_SERVER_URL`, also the runner's `[[runners]] url` (the helper commands' `--url`).
    pub server_url: String,
    /// `git_info.repo_url` without credentials; the token is put in as GitLab does.
    pub repo_url: String,
    pub sha: String,
    pub ref_name: String,
    pub tag: bool,
    /// `git_info.protected`: picks the cache key suffix.
    pub protected: bool,
    /// The pipeline whose persistent ref (`refs/pipelines/<id>`) the fetch names.
    pub pipeline_id: Option<u64>,
    /// `git_info.depth` (GitLab's default for new projects is 20).
    pub depth: u32,
    pub git_strategy: GitStrategy,
    pub submodule_strategy: SubmoduleStrategy,
    /// `GIT_CLEAN_FLAGS`; `none` for no clean.
    pub git_clean_flags: String,
    pub git_checkout: bool,
    /// The driver's `config` answer.
    pub builds_dir: String,
    pub cache_dir: String,
    /// How scripts call the runner (`custom.NewProvider("gitlab-runner")`).
    pub runner_command: String,
    /// The runner's authentication token (its short form names cache objects).
    pub runner_token: String,
    pub variables: Vec<Variable>,
    pub caches: Vec<Cache>,
    pub cache_fallback_key: Option<String>,
    pub cache_urls: Arc<dyn CacheUrls>,
    /// `[runners.cache] Path` and `Shared`.
    pub cache_path: String,
    pub cache_shared: bool,
    pub artifacts: Vec<Artifact>,
    pub dependencies: Vec<Dependency>,
    /// `before_script` + `script`.
    pub script: Vec<String>,
    pub after_script: Vec<String>,
    /// The CA chain the runner exports as `CI_SERVER_TLS_CA_FILE` for an HTTPS GitLab.
    pub tls_ca_chain: Option<String>,
    /// The job request's correlation id (`FF_USE_GITALY_CORRELATION_ID`, on by default).
    pub correlation_id: String,
}

impl JobSpec {
    /// A job of a branch pipeline with GitLab's and the runner's defaults.
    pub fn new(
        server_url: &str,
        project_id: u64,
        project_path: &str,
        job_id: u64,
        token: &str,
        sha: &str,
        ref_name: &str,
    ) -> JobSpec {
        let server_url = server_url.trim_end_matches('/').to_string();
        JobSpec {
            job_id,
            job_name: "test".into(),
            token: token.into(),
            project_id,
            project_path: project_path.into(),
            repo_url: format!("{server_url}/{project_path}.git"),
            server_url,
            sha: sha.into(),
            ref_name: ref_name.into(),
            tag: false,
            protected: false,
            pipeline_id: None,
            depth: 20,
            git_strategy: GitStrategy::Clone,
            submodule_strategy: SubmoduleStrategy::None,
            git_clean_flags: "-ffdx".into(),
            git_checkout: true,
            builds_dir: "/builds".into(),
            cache_dir: "/cache".into(),
            runner_command: "gitlab-runner".into(),
            runner_token: "glrt-t1_flotillaTestRunnerToken".into(),
            variables: Vec::new(),
            caches: Vec::new(),
            cache_fallback_key: None,
            cache_urls: Arc::new(NoCacheStore),
            cache_path: String::new(),
            cache_shared: false,
            artifacts: Vec::new(),
            dependencies: Vec::new(),
            script: vec!["echo hello".into()],
            after_script: Vec::new(),
            tls_ca_chain: None,
            correlation_id: format!("01flotilla{job_id:016x}"),
        }
    }

    /// The refspecs GitLab sends (`app/presenters/ci/build_runner_presenter.rb` `refspecs`):
    /// the persistent pipeline ref, then with a depth only the job's ref, else every branch
    /// and tag.
    pub fn refspecs(&self) -> Vec<String> {
        let mut specs = Vec::new();
        if let Some(id) = self.pipeline_id {
            specs.push(format!("+{}:refs/pipelines/{id}", self.sha));
        }
        let branch = |r: &str| format!("+refs/heads/{r}:refs/remotes/origin/{r}");
        let tag = |r: &str| format!("+refs/tags/{r}:refs/tags/{r}");
        if self.depth > 0 {
            specs.push(if self.tag {
                tag(&self.ref_name)
            } else {
                branch(&self.ref_name)
            });
        } else {
            specs.push(branch("*"));
            specs.push(tag("*"));
        }
        specs
    }

    /// The cache key as GitLab sends it: `<key>-protected` or `<key>-non_protected` (GitLab
    /// `app/models/ci/build.rb` `Ci::Build#cache`, with `ci_separated_caches`, the default;
    /// the runner itself never suffixes). The `jobs_cache_index` part ("Clear runner
    /// caches") is left out.
    pub fn sent_cache_key(&self, cache: &Cache, key: &str) -> String {
        let suffix = if self.protected && !cache.unprotect {
            "protected"
        } else {
            "non_protected"
        };
        format!("{key}-{suffix}")
    }

    /// `<builds_dir>/<project path>` (`common/build.go` `ProjectUniqueDir`, not shared; the
    /// `empty` strategy adds `-empty`).
    pub fn project_dir(&self) -> String {
        shell::join(&[&self.builds_dir, &self.unique_dir()])
    }

    /// `Build.CacheDir`: `<cache_dir>/<project path>` (`StartBuild`).
    pub fn build_cache_dir(&self) -> String {
        shell::join(&[&self.cache_dir, &self.unique_dir()])
    }

    fn unique_dir(&self) -> String {
        let slug = url::Url::parse(&self.repo_url)
            .map(|u| u.path().trim_end_matches(".git").to_string())
            .unwrap_or_else(|_| format!("project-{}", self.project_id));
        if self.git_strategy == GitStrategy::Empty {
            format!("{slug}-empty")
        } else {
            slug
        }
    }

    /// `TmpProjectDir`: where file variables, the env file and the git configs live.
    pub fn tmp_dir(&self) -> String {
        format!("{}.tmp", self.project_dir())
    }

    /// The remote with `gitlab-ci-token:<token>@`, as GitLab sends `repo_url`.
    pub fn repo_url_with_token(&self) -> String {
        with_credentials(&self.repo_url, &self.token)
    }
}

/// The runner's short token (`helpers/shorten_token.go` `ShortenToken`): known prefixes
/// stripped, then the first 9 characters.
pub fn short_token(token: &str) -> String {
    let mut rest = token;
    if let Some(r) = rest.strip_prefix("glrt-") {
        rest = r;
    }
    for partition in ["t1_", "t2_", "t3_"] {
        if let Some(r) = rest.strip_prefix(partition) {
            rest = r;
        }
    }
    rest = rest.strip_prefix("glrtr-").unwrap_or(rest);
    rest = rest.strip_prefix("glcbt-").unwrap_or(rest);
    let registration = rest.starts_with("GR")
        && rest
            .get(2..9)
            .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()));
    if registration {
        rest = rest.get(9..).unwrap_or("");
    }
    rest.chars().take(9).collect()
}

/// The cache object's name (`cache/cache.go` `GetAdapter`):
/// `[<path>/][runner/<short token>/]project/<id>/[<2 chars>/]<key>`; `None` when the key
/// leaves the project's prefix (the runner then uses no adapter).
pub fn cache_object_name(
    path: &str,
    shared: bool,
    short_token: &str,
    project_id: u64,
    key: &str,
    sharded: bool,
) -> Option<String> {
    let namespace = if shared {
        String::new()
    } else {
        format!("runner/{short_token}")
    };
    let base = shell::join(&[path, &namespace, "project", &project_id.to_string()]);
    let full = match (sharded, key.get(..2)) {
        (true, Some(shard)) => shell::join(&[&base, shard, key]),
        (true, None) => return None,
        (false, _) => shell::join(&[&base, key]),
    };
    full.starts_with(&format!("{base}/")).then_some(full)
}

fn with_credentials(url: &str, token: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://gitlab-ci-token:{token}@{rest}"),
        None => url.to_string(),
    }
}

/// `scheme://host[:port]` of a URL (`helpers/url` `OnlySchemeAndHost`).
fn scheme_and_host(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let host = rest.split('/').next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or(host);
    format!("{scheme}://{host}")
}

/// The stages the runner runs through `run_exec`, in order, for a job whose `build_script`
/// succeeded or failed (`common/build.go` `executeScript`, `executePrepareScripts`,
/// `executeUserScripts`); stages whose script would be empty are skipped as the runner does
/// (`ErrSkipBuildStage`). `clear_worktree` runs only on a `get_sources` retry.
pub fn stages(spec: &JobSpec, succeeded: bool) -> Vec<&'static str> {
    let mut stages = vec!["prepare_script", "get_sources"];
    if spec.caches.iter().any(|c| !cache_args(c).is_empty()) {
        stages.push("restore_cache");
    }
    if !spec.dependencies.is_empty() {
        stages.push("download_artifacts");
    }
    stages.push("build_script");
    if !spec.after_script.is_empty() {
        stages.push("after_script");
    }
    let archive = spec
        .caches
        .iter()
        .any(|c| c.when.applies(succeeded) && !cache_args(c).is_empty());
    if archive {
        stages.push(if succeeded {
            "archive_cache"
        } else {
            "archive_cache_on_failure"
        });
    }
    if spec
        .artifacts
        .iter()
        .any(|a| a.when.applies(succeeded) && !artifact_args(a).is_empty())
    {
        stages.push(if succeeded {
            "upload_artifacts_on_success"
        } else {
            "upload_artifacts_on_failure"
        });
    }
    stages.push("cleanup_file_variables");
    stages
}

/// The script for `stage` (`shells/abstract.go` `writeScript`, wrapped by `BashWriter.Finish`).
/// `after_script` sees `CI_JOB_STATUS=success`; see [`after_script`] for a failed job.
pub fn script(spec: &JobSpec, stage: &str) -> String {
    let mut w = Shell::new(&spec.tmp_dir());
    match stage {
        "prepare_script" => prepare(&mut w),
        "get_sources" => git::get_sources(&mut w, spec),
        "clear_worktree" => git::clear_worktree(&mut w, spec),
        "restore_cache" => transfer::restore(&mut w, spec),
        "download_artifacts" => transfer::download(&mut w, spec),
        "build_script" | "step_script" => user_script(&mut w, spec, &spec.script, None),
        "after_script" => return after_script(spec, true),
        "archive_cache" => transfer::archive(&mut w, spec, true),
        "archive_cache_on_failure" => transfer::archive(&mut w, spec, false),
        "upload_artifacts_on_success" => transfer::upload(&mut w, spec, true),
        "upload_artifacts_on_failure" => transfer::upload(&mut w, spec, false),
        "cleanup_file_variables" => git::cleanup(&mut w, spec),
        other => panic!("no such stage: {other}"),
    }
    w.finish(debug_trace(spec))
}

/// The `after_script` stage with `CI_JOB_STATUS` as the runner sets it
/// (`Build.executeAfterScript`: `success` or `failed`).
pub fn after_script(spec: &JobSpec, succeeded: bool) -> String {
    let mut w = Shell::new(&spec.tmp_dir());
    let status = if succeeded { "success" } else { "failed" };
    user_script(&mut w, spec, &spec.after_script, Some(status));
    w.finish(debug_trace(spec))
}

fn debug_trace(spec: &JobSpec) -> bool {
    vars::setting(spec, "CI_DEBUG_TRACE").is_some_and(|v| v == "true" || v == "1")
}

/// `writePrepareScript`, after `ensurePrepareStageHostnameMessage` (Custom shows no runner
/// hostname).
fn prepare(w: &mut Shell) {
    w.line(r#"echo "Running on $(hostname)...""#);
    w.rm_file(&w.tmp_file("gitlab_runner_env"));
    w.rm_file(&w.tmp_file("masking.db"));
}

/// `writeUserScript` and `writeAfterScript` with `writeCommands`: each command is echoed as
/// `$ <command>` in green, multi-line ones by their first line.
fn user_script(w: &mut Shell, spec: &JobSpec, commands: &[String], status: Option<&str>) {
    vars::exports(w, spec, false, status);
    w.cd(&spec.project_dir());
    if status.is_some() {
        w.notice("Running after script...");
    }
    for command in commands {
        let command = command.trim();
        if command.is_empty() {
            w.empty_line();
        } else if let Some((first, _)) = command.split_once('\n') {
            w.notice(&format!("$ {first} # collapsed multi-line command"));
        } else {
            w.notice(&format!("$ {command}"));
        }
        w.line(command);
    }
}

/// `--path`/`--untracked` of a cache entry (`cacheExtractor`, `getArchiverArgs`).
fn cache_args(cache: &Cache) -> Vec<String> {
    let mut args = Vec::new();
    for path in &cache.paths {
        args.extend(["--path".to_string(), path.clone()]);
    }
    if cache.untracked {
        args.push("--untracked".into());
    }
    args
}

/// `--path`/`--exclude`/`--untracked` of an artifact (`writeUploadArtifact`).
fn artifact_args(artifact: &Artifact) -> Vec<String> {
    let mut args = Vec::new();
    for path in &artifact.paths {
        args.extend(["--path".to_string(), path.clone()]);
    }
    for path in &artifact.exclude {
        args.extend(["--exclude".to_string(), path.clone()]);
    }
    if artifact.untracked {
        args.push("--untracked".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tokens_drop_known_prefixes_and_keep_nine_characters() {
        let table = [
            ("glrt-t1_abcdefghijklmn", "abcdefghi"),
            ("glrt-abcdefghijk", "abcdefghi"),
            ("t2_abcdefghijk", "abcdefghi"),
            ("GR1348941abcdefghijk", "abcdefghi"),
            ("short", "short"),
        ];
        for (token, short) in table {
            assert_eq!(short_token(token), short, "{token}");
        }
    }

    #[test]
    fn cache_objects_sit_under_the_runner_and_project_and_refuse_traversal() {
        let name = cache_object_name("", false, "longtoken", 10, "key", false);
        assert_eq!(name.as_deref(), Some("runner/longtoken/project/10/key"));
        let shared = cache_object_name("pre", true, "t", 10, "ab12", true);
        assert_eq!(shared.as_deref(), Some("pre/project/10/ab/ab12"));
        assert_eq!(
            cache_object_name("", false, "t", 10, "../11/key", false),
            None
        );
    }

    #[test]
    fn quoting_follows_the_runners_shell_escape() {
        assert_eq!(escape("plain/path-1.2_x"), "plain/path-1.2_x");
        assert_eq!(escape(""), "''");
        assert_eq!(escape("a b"), "$'a b'");
        assert_eq!(escape("it's\n"), "$'it\\'s\\n'");
        assert_eq!(escape("\u{1b}[0m"), "$'\\x1b[0m'");
        assert_eq!(quote_meta("a.b:c"), "a\\.b:c");
    }
}

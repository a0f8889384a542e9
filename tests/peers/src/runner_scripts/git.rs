//! The git stages: `get_sources`, `clear_worktree` and `cleanup_file_variables`, following
//! `shells/abstract.go` (`writeGetSourcesScript` and the functions it calls). The remote in
//! `.git/config` stays free of the token: an external config in `<project dir>.tmp` maps the
//! plain URL to the one with credentials (`url.<with>.insteadOf <without>`).
//!
//! Owns: git command lines. Must not know: cache or artifacts.

use super::shell::{Shell, quote_meta};
use super::{GitStrategy, JobSpec, RUNNER_VERSION, SubmoduleStrategy, scheme_and_host, vars};

const EXTERNAL_CONFIG: &str = ".gitlab-runner.ext.conf";
const EXTERNAL_CONFIG_ENV: &str = "GLR_EXT_GIT_CONFIG_PATH";
const TEMPLATE_DIR: &str = "git-template";

/// `GIT_LFS_SKIP_SMUDGE` set by the user (`IsLFSSmudgeDisabled`).
fn lfs_skipped(spec: &JobSpec) -> bool {
    vars::setting(spec, "GIT_LFS_SKIP_SMUDGE")
        .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "TRUE" | "True" | "t" | "T"))
}

/// `GetGitCleanFlags`: `none` means no clean.
fn clean_flags(spec: &JobSpec) -> Vec<String> {
    match spec.git_clean_flags.as_str() {
        "none" => Vec::new(),
        "" => vec!["-ffdx".into()],
        flags => flags.split_whitespace().map(String::from).collect(),
    }
}

/// `GetSubmoduleStrategy`: none for the `none` and `empty` strategies.
fn submodule_strategy(spec: &JobSpec) -> SubmoduleStrategy {
    match spec.git_strategy {
        GitStrategy::None | GitStrategy::Empty => SubmoduleStrategy::None,
        _ => spec.submodule_strategy,
    }
}

/// A flags setting: default when unset, `none` for none (`build_settings.go` `cmdFlags`).
fn flags(spec: &JobSpec, name: &str, default: &[&str]) -> Vec<String> {
    match vars::setting(spec, name) {
        None => default.iter().map(|s| (*s).to_string()).collect(),
        Some(v) if v == "none" => Vec::new(),
        Some(v) => v.split_whitespace().map(String::from).collect(),
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `writeGetSourcesScript` (no hooks, no tokenless mode; Custom is a shared environment, so
/// no `--global` SSL config).
pub fn get_sources(w: &mut Shell, spec: &JobSpec) {
    vars::exports(w, spec, false, None);
    w.export("GIT_TERMINAL_PROMPT", "0");
    w.export("GCM_INTERACTIVE", "Never");
    clone_fetch(w, spec);
    submodules(w, spec);
    super::transfer::change_ownership(w, spec, &[&spec.builds_dir]);
    clear_credentials(w, spec);
}

/// `writeCloneFetchCmds` with `handleGetSourcesStrategy` and the LFS guard.
fn clone_fetch(w: &mut Shell, spec: &JobSpec) {
    let lfs = !lfs_skipped(spec);
    if lfs {
        w.export("GIT_LFS_SKIP_SMUDGE", "1");
    }
    let project = spec.project_dir();
    match spec.git_strategy {
        GitStrategy::Clone | GitStrategy::Fetch => {
            cleanup_locks_and_configs(w, spec);
            let (template, remote) = template_dir(w, spec);
            if spec.git_strategy == GitStrategy::Clone {
                // writeCloneCmdIfPossible: the old clone always goes first.
                w.rm_dir(&project);
            }
            refspec_fetch(w, spec, &template, &remote);
        }
        GitStrategy::None => {
            w.notice("Skipping Git repository setup");
            w.mkdir(&project);
        }
        GitStrategy::Empty => {
            w.notice("Skipping Git repository setup and creating an empty build directory");
            w.rm_dir(&project);
            w.mkdir(&project);
        }
    }
    let checkout =
        spec.git_checkout && matches!(spec.git_strategy, GitStrategy::Clone | GitStrategy::Fetch);
    if !checkout {
        w.notice("Skipping Git checkout");
        return;
    }
    checkout_cmd(w, spec);
    if lfs {
        w.if_cmd("git", &["lfs", "version"]);
        w.command("git", &["lfs", "pull"]);
        w.empty_line();
        w.end_if();
    }
}

/// `writeGitCleanup`: stale lock files, then `writeGitCleanupAllConfigs`.
fn cleanup_locks_and_configs(w: &mut Shell, spec: &JobSpec) {
    let project = spec.project_dir();
    let git = super::shell::join(&[&project, ".git"]);
    let modules = super::shell::join(&[&git, "modules"]);
    let for_submodules = submodule_strategy(spec) != SubmoduleStrategy::None;
    for file in [
        "index.lock",
        "shallow.lock",
        "HEAD.lock",
        "hooks/post-checkout",
        "config.lock",
    ] {
        w.rm_file(&super::shell::join(&[&git, file]));
        if for_submodules {
            let base = file.rsplit('/').next().unwrap_or(file);
            w.rm_recursive(&modules, base, false);
        }
    }
    w.rm_recursive(&super::shell::join(&[&git, "refs"]), "*.lock", false);
    cleanup_all_configs(w, spec, for_submodules);
}

/// `writeGitCleanupAllConfigs`: the configs and hooks a job could have planted, on by
/// default for every executor but shell, and off for the `none` strategy.
fn cleanup_all_configs(w: &mut Shell, spec: &JobSpec, for_submodules: bool) {
    if spec.git_strategy == GitStrategy::None {
        return;
    }
    let git = super::shell::join(&[&spec.project_dir(), ".git"]);
    for dir in [w.tmp_file(TEMPLATE_DIR), git.clone()] {
        w.rm_file(&super::shell::join(&[&dir, "config"]));
        w.rm_dir(&super::shell::join(&[&dir, "hooks"]));
    }
    if for_submodules {
        let modules = super::shell::join(&[&git, "modules"]);
        w.rm_recursive(&modules, "config", false);
        w.rm_recursive(&modules, "hooks", true);
    }
}

/// `setupTemplateDir`: the template every `git init` copies, including the external config.
/// Returns the template dir and the remote URL without credentials.
fn template_dir(w: &mut Shell, spec: &JobSpec) -> (String, String) {
    let template = w.mk_tmp_dir(TEMPLATE_DIR);
    let file = super::shell::join(&[&template, "config"]);
    for (key, value) in [
        ("init.defaultBranch", "none"),
        ("fetch.recurseSubmodules", "false"),
        ("credential.interactive", "never"),
        ("gc.autoDetach", "false"),
    ] {
        w.command("git", &["config", "-f", &file, key, value]);
    }
    let external = w.tmp_file(EXTERNAL_CONFIG);
    external_config(w, spec, &external);
    // includeExternalGitConfig
    let pattern = format!("{}$", quote_meta(EXTERNAL_CONFIG));
    w.command_expand(
        "git",
        &[
            "config",
            "--file",
            &file,
            "--replace-all",
            "include.path",
            &external,
            &pattern,
        ],
    );
    w.export_raw(EXTERNAL_CONFIG_ENV, &external);
    (template, spec.repo_url.clone())
}

/// `setupExternalGitConfig` with the default flags (Gitaly correlation id and bundle URIs
/// on), the SSL settings of a shared environment, and the `insteadOf` rewrites of
/// `helpers/url/gitauth.go` `GetInsteadOfs` (the remote, the server base, the repo's base).
fn external_config(w: &mut Shell, spec: &JobSpec, file: &str) {
    w.rm_file(file);
    let header = format!("X-Gitaly-Correlation-ID: {}", spec.correlation_id);
    w.command_expand("git", &["config", "-f", file, "http.extraHeader", &header]);
    w.notice(&format!("Gitaly correlation ID: {}", spec.correlation_id));
    w.command_expand("git", &["config", "-f", file, "transfer.bundleURI", "true"]);
    if spec.tls_ca_chain.is_some() {
        let key = format!("http.{}.sslCAInfo", scheme_and_host(&spec.repo_url));
        w.command_expand(
            "git",
            &["config", "-f", file, &key, "$CI_SERVER_TLS_CA_FILE"],
        );
    }
    let token = &spec.token;
    let server = spec.server_url.trim_end_matches('/');
    let repo_base = scheme_and_host(&spec.repo_url);
    let mut rewrites: Vec<(String, String)> = vec![
        (
            super::with_credentials(&spec.repo_url, token),
            spec.repo_url.clone(),
        ),
        (super::with_credentials(server, token), server.to_string()),
        (super::with_credentials(&repo_base, token), repo_base),
    ];
    let mut seen = Vec::new();
    rewrites.retain(|r| {
        !seen.contains(r) && {
            seen.push(r.clone());
            true
        }
    });
    for (with, without) in rewrites {
        let stanza = format!("url.{with}.insteadOf");
        let pattern = format!("^{}$", quote_meta(&without));
        w.command_expand(
            "git",
            &[
                "config",
                "--file",
                file,
                "--replace-all",
                &stanza,
                &without,
                &pattern,
            ],
        );
    }
}

/// `writeRefspecFetchCmd`: `git init` (idempotent), origin added or re-pointed, then one
/// fetch of GitLab's refspecs; unshallowed when a full clone meets a shallow repo.
fn refspec_fetch(w: &mut Shell, spec: &JobSpec, template: &str, remote: &str) {
    let project = spec.project_dir();
    if spec.depth > 0 {
        w.notice(&format!(
            "Fetching changes with git depth set to {}...",
            spec.depth
        ));
    } else {
        w.notice("Fetching changes...");
    }
    w.command("git", &["init", &project, "--template", template]);
    w.cd(&project);
    w.if_cmd("git", &["remote", "add", "origin", remote]);
    w.notice("Created fresh repository.");
    w.else_();
    w.command("git", &["remote", "set-url", "origin", remote]);
    // setupExistingRepoConfig
    let pattern = format!("{}$", quote_meta(EXTERNAL_CONFIG));
    let external = format!("${EXTERNAL_CONFIG_ENV}");
    w.command_expand(
        "git",
        &[
            "config",
            "--file",
            ".git/config",
            "--replace-all",
            "include.path",
            &external,
            &pattern,
        ],
    );
    w.end_if();
    let agent = format!("http.userAgent=gitlab-runner {RUNNER_VERSION} linux/amd64");
    let mut args: Vec<String> = ["-c", &agent, "fetch", "origin", "--no-recurse-submodules"]
        .map(String::from)
        .to_vec();
    args.extend(spec.refspecs());
    if spec.depth > 0 {
        args.extend(["--depth".to_string(), spec.depth.to_string()]);
    }
    args.extend(flags(
        spec,
        "GIT_FETCH_EXTRA_FLAGS",
        &["--prune", "--quiet"],
    ));
    if spec.depth > 0 {
        w.command("git", &strs(&args));
        return;
    }
    w.if_file(".git/shallow");
    let mut unshallow = strs(&args);
    unshallow.push("--unshallow");
    w.command("git", &unshallow);
    w.else_();
    w.command("git", &strs(&args));
    w.end_if();
}

/// `writeCheckoutCmd`: the job's sha, detached, then `git clean <GIT_CLEAN_FLAGS>`.
fn checkout_cmd(w: &mut Shell, spec: &JobSpec) {
    let short = spec.sha.get(..8).unwrap_or(&spec.sha);
    w.notice(&format!(
        "Checking out {short} as detached HEAD (ref is {})...",
        spec.ref_name
    ));
    w.command(
        "git",
        &[
            "-c",
            "submodule.recurse=false",
            "checkout",
            "-f",
            "-q",
            &spec.sha,
        ],
    );
    let flags = clean_flags(spec);
    if !flags.is_empty() {
        let mut args = vec!["clean"];
        args.extend(strs(&flags));
        w.command("git", &args);
    }
}

/// The argument lists `writeSubmoduleUpdateCmd` builds.
struct SubmoduleArgs {
    sync: Vec<String>,
    update: Vec<String>,
    foreach: Vec<String>,
    /// `git clean <GIT_CLEAN_FLAGS or -ffdx>`, run in each submodule.
    clean: Vec<String>,
    /// `GIT_SUBMODULE_UPDATE_FLAGS` contains `--remote`.
    remote: bool,
}

impl SubmoduleArgs {
    fn new(spec: &JobSpec, recursive: bool, depth: u32) -> SubmoduleArgs {
        let mut paths = flags(spec, "GIT_SUBMODULE_PATHS", &[]);
        if !paths.is_empty() {
            paths.insert(0, "--".into());
        }
        let words = |w: &[&str]| w.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        let (mut sync, mut update) = (
            words(&["submodule", "sync"]),
            words(&["submodule", "update", "--init"]),
        );
        let mut foreach = words(&["submodule", "foreach"]);
        if recursive {
            for list in [&mut sync, &mut update, &mut foreach] {
                list.push("--recursive".into());
            }
        }
        sync.extend(paths.iter().cloned());
        if depth > 0 {
            update.extend(["--depth".to_string(), depth.to_string()]);
        }
        let update_flags = flags(spec, "GIT_SUBMODULE_UPDATE_FLAGS", &[]);
        let remote = update_flags
            .iter()
            .any(|f| f.eq_ignore_ascii_case("--remote"));
        update.extend(update_flags);
        update.extend(paths);
        let mut clean = words(&["git", "clean"]);
        let configured = clean_flags(spec);
        clean.extend(if configured.is_empty() {
            words(&["-ffdx"])
        } else {
            configured
        });
        SubmoduleArgs {
            sync,
            update,
            foreach,
            clean,
            remote,
        }
    }

    fn foreach(&self, tail: &[&str]) -> Vec<String> {
        let mut args = self.foreach.clone();
        args.extend(tail.iter().map(|s| (*s).to_string()));
        args
    }
}

/// `-c include.path=$GLR_EXT_GIT_CONFIG_PATH` before `args`: submodule operations that do not
/// read the main repository's config still get the credentials.
fn with_external_config(args: &[String]) -> Vec<String> {
    let mut all = vec![
        "-c".to_string(),
        format!("include.path=${EXTERNAL_CONFIG_ENV}"),
    ];
    all.extend(args.iter().cloned());
    all
}

/// `writeSubmoduleUpdateCmds` / `writeSubmoduleUpdateCmd`: init, sync, clean and reset each
/// submodule, update with the credentials (retried once), clean again.
fn submodules(w: &mut Shell, spec: &JobSpec) {
    let recursive = match submodule_strategy(spec) {
        SubmoduleStrategy::None => {
            w.notice("Skipping Git submodules setup");
            return;
        }
        SubmoduleStrategy::Normal => false,
        SubmoduleStrategy::Recursive => true,
    };
    let depth: u32 = vars::setting(spec, "GIT_SUBMODULE_DEPTH")
        .and_then(|d| d.parse().ok())
        .unwrap_or(spec.depth);
    let how = if recursive {
        "submodules recursively"
    } else {
        "submodules"
    };
    w.notice(&if depth > 0 {
        format!("Updating/initializing {how} with git depth set to {depth}...")
    } else {
        format!("Updating/initializing {how}...")
    });
    let args = SubmoduleArgs::new(spec, recursive, depth);
    let clean: Vec<&str> = strs(&args.clean);
    w.command("git", &["submodule", "init"]);
    w.command("git", &strs(&args.sync));
    w.command("git", &strs(&args.foreach(&clean)));
    w.command("git", &strs(&args.foreach(&["git", "reset", "--hard"])));
    w.if_cmd_with_output_expand("git", &strs(&with_external_config(&args.update)));
    w.notice("Updated submodules");
    w.command("git", &strs(&args.sync));
    w.else_();
    w.warning("Updating submodules failed. Retrying...");
    if args.remote {
        let fetch = args.foreach(&[
            "git",
            "fetch",
            "origin",
            "+refs/heads/*:refs/remotes/origin/*",
        ]);
        w.command_expand("git", &strs(&with_external_config(&fetch)));
    }
    w.command("git", &strs(&args.sync));
    w.command_expand("git", &strs(&with_external_config(&args.update)));
    w.command("git", &strs(&args.foreach(&["git", "reset", "--hard"])));
    w.end_if();
    w.command("git", &strs(&args.foreach(&clean)));
    submodule_credentials(w, spec, &args.foreach, recursive);
}

/// `configureSubmoduleCredentials` and the submodules' LFS pull: every submodule includes
/// the external config, so later git calls inside them authenticate.
fn submodule_credentials(w: &mut Shell, spec: &JobSpec, foreach: &[String], recursive: bool) {
    w.notice("Configuring submodules to use parent git credentials...");
    let mut args = foreach.to_vec();
    if !recursive {
        args.push("--recursive".into());
    }
    let external = format!("${EXTERNAL_CONFIG_ENV}");
    args.extend(["git", "config", "--replace-all", "include.path", &external].map(String::from));
    w.command_expand("git", &strs(&args));
    if !lfs_skipped(spec) {
        w.if_cmd("git", &["lfs", "version"]);
        w.notice("Pulling LFS files...");
        let mut pull = vec!["-c".to_string(), format!("include.path={external}")];
        pull.extend(foreach.iter().cloned());
        pull.extend(["git", "lfs", "pull"].map(String::from));
        w.command_expand("git", &strs(&pull));
        w.end_if();
    }
}

/// `writeClearGitCredentials`: a best-effort `git credential reject` for the remote host.
fn clear_credentials(w: &mut Shell, spec: &JobSpec) {
    let host = scheme_and_host(&spec.repo_url);
    let scheme = host.split("://").next().unwrap_or("");
    if !matches!(scheme, "http" | "https" | "ssh") || host.ends_with("://") {
        return;
    }
    let stdin = format!("url={host}\nusername=gitlab-ci-token");
    w.command_with_stdin_best_effort(&stdin, "git", &["credential", "reject"]);
}

/// `writeClearWorktreeScript`: run before a `get_sources` retry.
pub fn clear_worktree(w: &mut Shell, spec: &JobSpec) {
    w.notice("Deleting tracked and untracked files...");
    let project = spec.project_dir();
    w.if_directory(&project);
    w.cd(&project);
    w.command("git", &["rm", "-rf", "--ignore-unmatch", "--quiet", "."]);
    w.command("git", &["clean", "-ffdx", "-q"]);
    w.end_if();
}

/// `writeCleanupScript` (`FF_ENABLE_JOB_CLEANUP` off): the env, file variables, the
/// external config and the planted git configs go.
pub fn cleanup(w: &mut Shell, spec: &JobSpec) {
    vars::exports(w, spec, true, None);
    clear_credentials(w, spec);
    for name in [
        "gitlab_runner_env",
        "masking.db",
        EXTERNAL_CONFIG,
        ".glr.gconf",
    ] {
        let file = w.tmp_file(name);
        w.rm_file(&file);
    }
    for v in vars::all(spec, None).iter().filter(|v| v.file) {
        let file = w.tmp_file(&v.key);
        w.rm_file(&file);
    }
    cleanup_locks_and_configs(w, spec);
    w.rm_file(&super::shell::join(&[
        &spec.builds_dir,
        ".gitlab-build-uid-gid",
    ]));
}

//! The job's variables as the runner assembles and exports them: `common/build.go`
//! `GetAllVariables` (feature flags, runner and default variables, the job's variables, then
//! the shared-environment and version variables, all expanded), and `shells/abstract.go`
//! `exportVariables`.
//!
//! Owns: the variable list and its expansion. Must not know: stages.

use super::shell::Shell;
use super::{JobSpec, RUNNER_VERSION, Variable, short_token};

/// The feature flags that either the helper reads from its environment
/// (`FF_USE_DIRECT_DOWNLOAD`, `FF_USE_FASTZIP`, the parallel transfers) or that shaped these
/// scripts, at their defaults (`helpers/featureflags/flags.go`). The runner exports every
/// flag; the rest change nothing here.
const FEATURE_FLAGS: &[(&str, bool)] = &[
    ("FF_USE_DIRECT_DOWNLOAD", true),
    ("FF_USE_FASTZIP", true),
    ("FF_USE_PARALLEL_CACHE_TRANSFER", false),
    ("FF_USE_PARALLEL_ARTIFACT_TRANSFER", false),
    ("FF_USE_GITALY_CORRELATION_ID", true),
    ("FF_USE_GIT_BUNDLE_URIS", true),
    ("FF_GIT_URLS_WITHOUT_TOKENS", false),
    ("FF_USE_GIT_NATIVE_CLONE", false),
    ("FF_HASH_CACHE_KEYS", false),
    ("FF_ENABLE_JOB_CLEANUP", false),
];

fn var(key: &str, value: &str) -> Variable {
    Variable::new(key, value)
}

/// The server's predefined variables (GitLab docs, "Predefined CI/CD variables reference",
/// https://docs.gitlab.com/ci/variables/predefined_variables/).
fn server_variables(spec: &JobSpec) -> Vec<Variable> {
    let server = url::Url::parse(&spec.server_url).ok();
    let host = server.as_ref().and_then(|u| u.host_str().map(String::from));
    let port = server.as_ref().and_then(url::Url::port_or_known_default);
    let scheme = server.as_ref().map(|u| u.scheme().to_string());
    vec![
        var("CI", "true"),
        var("GITLAB_CI", "true"),
        var("CI_SERVER_URL", &spec.server_url),
        var("CI_SERVER_HOST", &host.unwrap_or_default()),
        var("CI_SERVER_PORT", &port.unwrap_or(0).to_string()),
        var("CI_SERVER_PROTOCOL", &scheme.unwrap_or_default()),
        var("CI_API_V4_URL", &format!("{}/api/v4", spec.server_url)),
    ]
}

/// The project's, job's and commit's predefined variables (same reference).
fn job_variables(spec: &JobSpec) -> Vec<Variable> {
    let path = &spec.project_path;
    let (namespace, name) = path.rsplit_once('/').unwrap_or(("", path));
    let mut vars = vec![
        var("CI_PROJECT_ID", &spec.project_id.to_string()),
        var("CI_PROJECT_NAME", name),
        var("CI_PROJECT_NAMESPACE", namespace),
        var("CI_PROJECT_PATH", path),
        var("CI_PROJECT_URL", &format!("{}/{path}", spec.server_url)),
        Variable::masked("CI_REPOSITORY_URL", &spec.repo_url_with_token()),
        var("CI_JOB_ID", &spec.job_id.to_string()),
        var("CI_JOB_NAME", &spec.job_name),
        Variable::masked("CI_JOB_TOKEN", &spec.token),
        var("CI_COMMIT_SHA", &spec.sha),
        var(
            "CI_COMMIT_SHORT_SHA",
            spec.sha.get(..8).unwrap_or(&spec.sha),
        ),
        var("CI_COMMIT_REF_NAME", &spec.ref_name),
        var(
            "CI_COMMIT_REF_PROTECTED",
            if spec.protected { "true" } else { "false" },
        ),
        var(
            if spec.tag {
                "CI_COMMIT_TAG"
            } else {
                "CI_COMMIT_BRANCH"
            },
            &spec.ref_name,
        ),
    ];
    if let Some(id) = spec.pipeline_id {
        vars.push(var("CI_PIPELINE_ID", &id.to_string()));
    }
    vars
}

/// What GitLab sends for this job: the predefined variables above, the git settings of the
/// [`JobSpec`] as if set in `.gitlab-ci.yml`, then the job's own variables.
fn sent_by_gitlab(spec: &JobSpec) -> Vec<Variable> {
    let mut vars = server_variables(spec);
    vars.extend(job_variables(spec));
    vars.extend([
        var("GIT_STRATEGY", spec.git_strategy.name()),
        var("GIT_SUBMODULE_STRATEGY", spec.submodule_strategy.name()),
        var("GIT_CLEAN_FLAGS", &spec.git_clean_flags),
        var(
            "GIT_CHECKOUT",
            if spec.git_checkout { "true" } else { "false" },
        ),
        var("GIT_DEPTH", &spec.depth.to_string()),
    ]);
    if let Some(key) = &spec.cache_fallback_key {
        vars.push(var("CACHE_FALLBACK_KEY", key));
    }
    vars.extend(spec.variables.iter().cloned());
    vars
}

/// `GetAllVariables`, expanded; `job_status` overrides `CI_JOB_STATUS` in place, as
/// `executeAfterScript` does.
pub fn all(spec: &JobSpec, job_status: Option<&str>) -> Vec<Variable> {
    let mut vars: Vec<Variable> = FEATURE_FLAGS
        .iter()
        .map(|(k, v)| var(k, if *v { "true" } else { "false" }))
        .collect();
    let timeout = 3600;
    vars.extend([
        var("CI_RUNNER_SHORT_TOKEN", &short_token(&spec.runner_token)),
        var("CI_BUILDS_DIR", &spec.builds_dir),
        var("CI_PROJECT_DIR", &spec.project_dir()),
        var("CI_CONCURRENT_ID", "0"),
        var("CI_CONCURRENT_PROJECT_ID", "0"),
        var("CI_SERVER", "yes"),
        var("CI_JOB_STATUS", job_status.unwrap_or("running")),
        var("CI_JOB_TIMEOUT", &timeout.to_string()),
    ]);
    if let Some(ca) = &spec.tls_ca_chain {
        vars.push(Variable::file("CI_SERVER_TLS_CA_FILE", ca));
    }
    vars.extend(sent_by_gitlab(spec));
    vars.extend([
        var("CI_SHARED_ENVIRONMENT", "true"),
        var("CI_RUNNER_VERSION", RUNNER_VERSION),
        var("CI_RUNNER_REVISION", "flotilla"),
        var("CI_RUNNER_EXECUTABLE_ARCH", "linux/amd64"),
        var("RUNNER_TEMP_PROJECT_DIR", &spec.tmp_dir()),
    ]);
    let tmp = spec.tmp_dir();
    let source = vars.clone();
    for v in vars.iter_mut().filter(|v| !v.raw) {
        v.value = expand(&v.value, &|name| lookup(&source, &tmp, name));
    }
    vars
}

/// `Variables.Get`: the last variable of that name; a file variable's path.
fn lookup(vars: &[Variable], tmp: &str, name: &str) -> String {
    match name {
        "$" => return "$".into(),
        "*" | "#" | "@" | "!" | "?" | "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" => {
            return String::new();
        }
        _ => {}
    }
    match vars.iter().rev().find(|v| v.key == name) {
        Some(v) if v.file => format!("{tmp}/{}", v.key),
        Some(v) => v.value.clone(),
        None => String::new(),
    }
}

/// A setting the runner reads from the job's variables (`build_settings.go` `validate`).
pub fn setting(spec: &JobSpec, name: &str) -> Option<String> {
    let value = all(spec, None)
        .into_iter()
        .rev()
        .find(|v| v.key == name)?
        .value;
    (!value.is_empty()).then_some(value)
}

/// `ExpandValue` (Go's `os.Expand`): `$NAME`, `${NAME}` and the one-character special names;
/// bad `${` syntax is eaten as Go does.
pub fn expand(text: &str, get: &dyn Fn(&str) -> String) -> String {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut start = 0;
    let mut j = 0;
    while j < bytes.len() {
        if bytes[j] == b'$' && j + 1 < bytes.len() {
            out.push_str(&text[start..j]);
            let (name, width) = shell_name(&text[j + 1..]);
            match (name, width) {
                (None, 0) => out.push('$'),
                (None, _) => {}
                (Some(name), _) => out.push_str(&get(name)),
            }
            j += width;
            start = j + 1;
        }
        j += 1;
    }
    out.push_str(&text[start.min(text.len())..]);
    out
}

fn shell_name(s: &str) -> (Option<&str>, usize) {
    let special = |b: u8| b"*#$@!?-".contains(&b) || b.is_ascii_digit();
    let bytes = s.as_bytes();
    if bytes[0] == b'{' {
        if bytes.len() > 2 && special(bytes[1]) && bytes[2] == b'}' {
            return (Some(&s[1..2]), 3);
        }
        return match s[1..].find('}') {
            Some(0) => (None, 2),
            Some(i) => (Some(&s[1..=i]), i + 2),
            None => (None, 1),
        };
    }
    if special(bytes[0]) {
        return (Some(&s[..1]), 1);
    }
    let end = bytes
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
        .unwrap_or(bytes.len());
    if end == 0 {
        (None, 0)
    } else {
        (Some(&s[..end]), end)
    }
}

/// `exportVariables`: each variable (file ones written out, or with `env_only` just their
/// path), then `GITLAB_ENV` and the lines a previous stage appended to it.
pub fn exports(w: &mut Shell, spec: &JobSpec, env_only: bool, job_status: Option<&str>) {
    for v in all(spec, job_status) {
        match (v.file, env_only) {
            (true, true) => {
                let path = w.tmp_file(&v.key);
                w.export(&v.key, &path);
            }
            (true, false) => w.export_file(&v.key, &v.value),
            (false, _) => w.export(&v.key, &v.value),
        }
    }
    let env_file = w.tmp_file("gitlab_runner_env");
    w.export("GITLAB_ENV", &env_file);
    w.source_env(&env_file);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_go_os_expand() {
        let get = |name: &str| match name {
            "A" => "x".to_string(),
            "$" => "$".to_string(),
            _ => String::new(),
        };
        let table = [
            ("$A/${A}", "x/x"),
            ("$$", "$"),
            ("a$", "a$"),
            ("$-x", "x"),
            ("${}z", "z"),
            ("${A", "A"),
            ("$/", "$/"),
            ("$B.", "."),
        ];
        for (text, want) in table {
            assert_eq!(expand(text, &get), want, "{text}");
        }
    }
}

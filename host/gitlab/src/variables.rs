//! The job's CI variables as GitLab sent them to the runner (the `variables` of the job
//! response file), and the two uses the docker executor makes of them outside the scripts:
//! the containers' environment, and each service's environment (`Build.GetServiceVariables` in
//! GitLab Runner's `common/build.go`: the job's public and internal variables, then the
//! service's own `variables:` expanded against all of them).

use std::collections::BTreeMap;

use serde::Deserialize;

/// One variable of the job response (`common/spec/variables.go` `Variable` in GitLab Runner).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Variable {
    /// Its name.
    pub key: String,
    /// Its value (for a file variable, the file's contents).
    #[serde(default)]
    pub value: String,
    /// Public: defined in `.gitlab-ci.yml` or predefined, so it may be shown.
    #[serde(default)]
    pub public: bool,
    /// Internal: set by GitLab or the runner for their own use.
    #[serde(default)]
    pub internal: bool,
    /// A file variable: the script writes its value to a file and exports the path.
    #[serde(default)]
    pub file: bool,
    /// Masked in the job log.
    #[serde(default)]
    pub masked: bool,
    /// Not to be expanded.
    #[serde(default)]
    pub raw: bool,
}

/// How many variables a job may carry into a container's environment: more is refused, so a
/// hostile job response cannot make the engine's request unbounded.
pub(crate) const MAX_VARIABLES: usize = 4096;

/// `KEY=value` lines for a container's environment: every variable but file variables (their
/// scripts write those to files), later definitions winning as they do in the scripts.
pub(crate) fn environment(all: &[Variable]) -> Vec<String> {
    let mut map: BTreeMap<&str, &str> = BTreeMap::new();
    for v in all.iter().filter(|v| !v.file && valid_name(&v.key)) {
        map.insert(&v.key, &v.value);
    }
    map.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// A service's environment, as `Build.GetServiceVariables` builds it: the job's public or
/// internal variables (never a project's masked secret), then the service's own variables
/// with `$NAME` and `${NAME}` expanded against all the job's variables and its own.
pub(crate) fn for_service(all: &[Variable], own: &BTreeMap<String, String>) -> Vec<String> {
    let mut source: BTreeMap<&str, &str> = all
        .iter()
        .map(|v| (v.key.as_str(), v.value.as_str()))
        .collect();
    for (k, v) in own {
        source.insert(k, v);
    }
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for v in all
        .iter()
        .filter(|v| (v.public || v.internal) && !v.file && valid_name(&v.key))
    {
        map.insert(v.key.clone(), v.value.clone());
    }
    for (k, v) in own.iter().filter(|(k, _)| valid_name(k)) {
        map.insert(k.clone(), expand(v, &source));
    }
    map.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// A name a container's environment can carry.
fn valid_name(key: &str) -> bool {
    !key.is_empty() && !key.contains(['=', '\0'])
}

/// `$NAME` and `${NAME}` replaced by their values (unknown names by nothing), as Go's
/// `os.Expand` does for the runner's `ExpandValue`; `$$` stays `$$`.
pub(crate) fn expand(text: &str, source: &BTreeMap<&str, &str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(rest.get(..at).unwrap_or_default());
        let after = rest.get(at + 1..).unwrap_or_default();
        if let Some(braced) = after.strip_prefix('{')
            && let Some(end) = braced.find('}')
        {
            let name = braced.get(..end).unwrap_or_default();
            out.push_str(source.get(name).copied().unwrap_or_default());
            rest = braced.get(end + 1..).unwrap_or_default();
            continue;
        }
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if len == 0 {
            out.push('$');
            rest = after;
            continue;
        }
        let name = after.get(..len).unwrap_or_default();
        out.push_str(source.get(name).copied().unwrap_or_default());
        rest = after.get(len..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(key: &str, value: &str, public: bool, masked: bool) -> Variable {
        Variable {
            key: key.into(),
            value: value.into(),
            public,
            internal: false,
            file: false,
            masked,
            raw: false,
        }
    }

    #[test]
    fn a_service_gets_the_jobs_public_variables_and_its_own_expanded_but_no_project_secret() {
        let all = vec![
            var("POSTGRES_PASSWORD", "from-the-job", true, false),
            var("CI_JOB_ID", "42", true, false),
            var("DEPLOY_KEY", "project-secret", false, true),
        ];
        let own = BTreeMap::from([
            ("POSTGRES_DB".to_string(), "db-$CI_JOB_ID".to_string()),
            ("COPY".to_string(), "${DEPLOY_KEY}".to_string()),
        ]);
        let env = for_service(&all, &own);
        assert!(env.contains(&"POSTGRES_PASSWORD=from-the-job".to_string()));
        assert!(env.contains(&"POSTGRES_DB=db-42".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("DEPLOY_KEY=")));
        // The service asked for it by name: expanded against all, as the runner does.
        assert!(env.contains(&"COPY=project-secret".to_string()));
    }

    #[test]
    fn expansion_follows_go_os_expand() {
        let source = BTreeMap::from([("A", "1"), ("B_2", "two")]);
        assert_eq!(expand("$A-${B_2}-$C-$$-$", &source), "1-two--$$-$");
        assert_eq!(expand("${unclosed", &source), "${unclosed");
    }

    #[test]
    fn the_containers_environment_skips_file_variables_and_keeps_the_last_value() {
        let mut file = var("CA", "pem", true, false);
        file.file = true;
        let all = vec![
            var("X", "1", true, false),
            var("X", "2", false, false),
            file,
        ];
        assert_eq!(environment(&all), vec!["X=2".to_string()]);
    }
}

//! Images on the instance: which a job may use (`--allowed-images`, `--allowed-services`, as
//! the docker executor's `allowed_images` and `allowed_services` restrict them), and pulling
//! them as the policy says with the right registry credentials: the job's own
//! (`DOCKER_AUTH_CONFIG`) for its image and services, the operator's for the helper image.

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::CreateImageOptions;
use futures_util::StreamExt;

use crate::docker::client::step;
use crate::image::Reference;
use crate::job::PullPolicy;
use crate::outcome::say;
use crate::place::StepError;

/// Registry credentials in Docker's `config.json` shape (`{"auths": {...}}`), and where they
/// come from, for messages (`DOCKER_AUTH_CONFIG`, `--helper-registry-auth`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Auth<'a> {
    pub(crate) text: &'a str,
    pub(crate) source: &'a str,
}

/// The engine's credentials for `image`'s registry in `auth`, if any.
fn credentials(
    auth: Option<Auth<'_>>,
    image: &Reference,
) -> Result<Option<bollard::auth::DockerCredentials>, StepError> {
    let Some(auth) = auth else {
        return Ok(None);
    };
    let failed = |why: String| StepError::Failed(format!("{}: {why}", auth.source));
    let config: serde_json::Value =
        serde_json::from_str(auth.text).map_err(|e| failed(format!("not JSON: {e}")))?;
    let registry = image.registry();
    let auths = config.get("auths").and_then(|a| a.as_object());
    let entry = auths.and_then(|a| {
        a.iter().find_map(|(key, value)| {
            let host = key
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .split('/')
                .next()
                .unwrap_or_default();
            let docker_hub = registry == "docker.io"
                && (host == "index.docker.io" || host == "registry-1.docker.io");
            (host == registry || docker_hub).then_some(value)
        })
    });
    let Some(entry) = entry.and_then(|e| e.get("auth")).and_then(|a| a.as_str()) else {
        return Ok(None);
    };
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry)
        .map_err(|_| failed(format!("the auth of {registry} is not base64")))?;
    let decoded = String::from_utf8_lossy(&decoded).into_owned();
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| failed(format!("the auth of {registry} is not user:password")))?;
    Ok(Some(bollard::auth::DockerCredentials {
        username: Some(user.to_string()),
        password: Some(password.to_string()),
        serveraddress: Some(registry),
        ..Default::default()
    }))
}

/// Whether `image` must be pulled under `policy`: a quick inspect of the instance's images
/// (none for `always`); an error when it is missing and the policy is `never`.
pub(crate) async fn must_pull(
    docker: &Docker,
    image: &str,
    policy: PullPolicy,
) -> Result<bool, StepError> {
    let present = match policy {
        PullPolicy::Always => false,
        _ => docker.inspect_image(image).await.is_ok(),
    };
    match (policy, present) {
        (PullPolicy::IfNotPresent | PullPolicy::Never, true) => Ok(false),
        (PullPolicy::Never, false) => Err(StepError::Failed(format!(
            "image {image} is not on the instance and the pull policy is never"
        ))),
        _ => Ok(true),
    }
}

/// Pulls `image` with `auth`; the time spent pulling.
pub(crate) async fn pull(
    docker: &Docker,
    auth: Option<Auth<'_>>,
    image: &str,
) -> Result<Duration, StepError> {
    say(&format!("Pulling image {image}..."));
    let start = Instant::now();
    let reference = Reference::parse(image);
    let options = CreateImageOptions {
        from_image: Some(reference.repository.clone()),
        tag: Some(reference.pull_tag()),
        ..Default::default()
    };
    let credentials = credentials(auth, &reference)?;
    let mut progress = docker.create_image(Some(options), None, credentials);
    while let Some(item) = progress.next().await {
        let info = item.map_err(step(format!("pulling image {image}")))?;
        if let Some(error) = info.error_detail.and_then(|d| d.message) {
            return Err(StepError::Failed(format!("pulling image {image}: {error}")));
        }
    }
    say(&format!(
        "Pulled image {image} in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    Ok(start.elapsed())
}

/// Refuses `image` unless it matches one of `allowed` (none: any image), as the docker
/// executor's `verifyAllowedImage` does with doublestar globs: `*` within a path component,
/// `**` across them, `?` one character.
pub(crate) fn check_allowed(image: &str, allowed: &[String], what: &str) -> Result<(), String> {
    if allowed.is_empty() || allowed.iter().any(|pattern| glob(pattern, image)) {
        return Ok(());
    }
    Err(format!(
        "the {what} {image:?} is not allowed on this runner (--allowed-{what}s: {})",
        allowed.join(", ")
    ))
}

/// Whether `text` matches the glob `pattern` (`*` stops at `/`, `**` does not, `?` is one
/// character but `/`).
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    matches_from(&p, &t)
}

fn matches_from(p: &[char], t: &[char]) -> bool {
    match p.split_first() {
        None => t.is_empty(),
        Some(('*', rest)) => {
            let (across, rest) = match rest.split_first() {
                Some(('*', after)) => (true, after),
                _ => (false, rest),
            };
            (0..=t.len()).any(|skip| {
                let skipped = t.get(..skip).unwrap_or_default();
                (across || !skipped.contains(&'/'))
                    && matches_from(rest, t.get(skip..).unwrap_or_default())
            })
        }
        Some(('?', rest)) => {
            matches!(t.split_first(), Some((c, tail)) if *c != '/' && matches_from(rest, tail))
        }
        Some((c, rest)) => {
            matches!(t.split_first(), Some((d, tail)) if c == d && matches_from(rest, tail))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_images_match_as_the_docker_executors_globs_do() {
        let allowed = vec![
            "ruby:*".to_string(),
            "registry.example.com:5000/**".to_string(),
            "alpine:3.?".to_string(),
        ];
        for ok in [
            "ruby:3.3",
            "registry.example.com:5000/team/app:1",
            "alpine:3.9",
        ] {
            assert!(check_allowed(ok, &allowed, "image").is_ok(), "{ok}");
        }
        for refused in ["ruby/evil:1", "python:3", "alpine:3.20", "evil.com/ruby:1"] {
            let why = check_allowed(refused, &allowed, "image").expect_err(refused);
            assert!(why.contains("--allowed-images"), "{why}");
        }
        assert!(check_allowed("anything", &[], "service").is_ok());
    }
}

//! The job's helper container, as GitLab's docker executor has one: git and the runner's
//! helper binary (`gitlab-runner-helper`), for the runner's own stages (checkout, cache,
//! artifacts), so the job's image needs nothing but a shell. One per job, created with the
//! job's container and removed with it; it shares the job's builds and cache volumes,
//! network, variables, limits and labels.
//!
//! The image: `--helper-image`, else GitLab's official reference for the runner's version and
//! the machine's architecture, spelled as the runner spells it
//! (`helpers/container/helperimage` in GitLab Runner: `info.go` `GitLabRegistryName` and
//! `Version`, `linux_info.go` `linuxInfo.Create` and `architecture`). It is pulled with the
//! operator's registry credentials (`--helper-registry-auth`), never a job's, when it is not
//! on the machine; a digest pin pulls by digest.
//!
//! GitLab Runner 19's Custom-executor scripts call the helper as `gitlab-runner` (`main.go`
//! `newExecutorProviders`: `custom.NewProvider("gitlab-runner")`), some earlier releases by
//! the runner's own absolute path; the official image ships it only as
//! `gitlab-runner-helper`. So both spellings are linked to it in the container.

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;

use crate::detached::sh_quote;
use crate::docker::DockerSettings;
use crate::docker::client::step;
use crate::job::Job;
use crate::place::StepError;

/// Where GitLab publishes the helper images (`info.go` `GitLabRegistryName`).
pub const GITLAB_HELPER: &str = "registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper";

/// The runner's helper image for `arch` (Docker's `Info.Architecture` of the machine) and the
/// runner's `version`: `<registry>:<arch>-v<major.minor.patch>`, or `<arch>-latest` for a
/// version without one (a development build), as `linuxInfo.Create` names it for the default
/// (alpine) flavour.
pub fn official(arch: &str, version: Option<&str>) -> String {
    let arch = match arch {
        "amd64" | "x86_64" | "" => "x86_64",
        "aarch64" | "arm64" => "arm64",
        "armv6l" | "armv7l" | "arm" => "arm",
        other => other,
    };
    let version = version
        .and_then(release)
        .map_or_else(|| "latest".to_string(), |v| format!("v{v}"));
    format!("{GITLAB_HELPER}:{arch}-{version}")
}

/// `19.4.0` of `19.4.0~beta.105.gd2263193` (`info.go` `Version`'s pattern: the leading
/// `major.minor.patch`).
fn release(version: &str) -> Option<String> {
    let mut parts = version.splitn(3, '.');
    let major = parts.next()?;
    let minor = parts.next()?;
    let rest = parts.next()?;
    let patch: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (numeric(major) && numeric(minor) && numeric(&patch))
        .then(|| format!("{major}.{minor}.{patch}"))
}

/// `--helper-image none`: no helper container; every stage runs in the job's image, as the
/// bare Custom executor runs them (the image must then have git and `gitlab-runner`).
pub const NONE: &str = "none";

/// Whether the operator turned the helper off.
pub(crate) fn disabled(own: &DockerSettings) -> bool {
    own.helper_image.as_deref() == Some(NONE)
}

/// The helper image for `job` on the engine `docker`: the operator's, else the official one
/// for the machine's architecture; `None` when the operator turned the helper off.
pub(crate) async fn image(
    docker: &Docker,
    own: &DockerSettings,
    job: &Job,
) -> Result<Option<String>, StepError> {
    if disabled(own) {
        return Ok(None);
    }
    if let Some(image) = &own.helper_image {
        return Ok(Some(image.clone()));
    }
    let info = docker
        .info()
        .await
        .map_err(step("asking Docker Engine for the machine's architecture"))?;
    Ok(Some(official(
        info.architecture.as_deref().unwrap_or_default(),
        job.runner_version.as_deref(),
    )))
}

/// The commands that make `gitlab-runner` (and the absolute runner paths `paths`) run the
/// helper binary in the helper container, and prove it runs there. Exits 3 when the image
/// has no helper binary, 4 when it does not run (another architecture), 5 when a path cannot
/// be linked.
pub(crate) fn install_command(paths: &[String]) -> String {
    let links: String = paths
        .iter()
        .map(|p| {
            let p = sh_quote(p);
            format!(
                "if [ ! -e {p} ]; then mkdir -p \"$(dirname {p})\" && ln -s \"$h\" {p} || exit 5; fi\n"
            )
        })
        .collect();
    format!(
        "h=$(command -v gitlab-runner-helper) || h=$(command -v gitlab-runner) || exit 3\n\
         \"$h\" --version >/dev/null 2>&1 || exit 4\n\
         command -v gitlab-runner >/dev/null 2>&1 || ln -s \"$h\" \"$(dirname \"$h\")/gitlab-runner\" || exit 5\n\
         {links}true\n"
    )
}

/// The absolute paths a stage's script runs the runner by (`if /path/to/gitlab-runner
/// --version >/dev/null 2>&1; then`, the guard `shells/abstract.go` `guardRunnerCommand`
/// writes), which must exist in the helper container. A path with characters the runner's
/// bash writer would have quoted cannot be resolved: the error says so.
pub(crate) fn runner_paths(script: &[u8]) -> Result<Vec<String>, String> {
    let text = String::from_utf8_lossy(script);
    let mut paths = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix("if ") else {
            continue;
        };
        let Some(command) = rest.strip_suffix(" --version >/dev/null 2>&1; then") else {
            continue;
        };
        if !command.contains("gitlab-runner") || !command.starts_with(['/', '\'', '"', '$']) {
            continue;
        }
        let plain = command
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b));
        if !plain || !command.starts_with('/') || command.split('/').any(|c| c == "..") {
            return Err(format!(
                "the script runs the runner as {command:?}, a path the driver cannot link to the helper binary; run GitLab Runner from a plain absolute path (or 19.x, which calls it gitlab-runner)"
            ));
        }
        if !paths.iter().any(|p| p == command) {
            paths.push(command.to_string());
        }
    }
    Ok(paths)
}

/// The last line of [`exec_root`]'s output: the command's exit status (read from the output
/// rather than asked for with one more request).
const EXIT_MARK: &str = "flotilla-exit ";

/// Runs `command` as root in `container` to its end; its exit code and output.
pub(crate) async fn exec_root(
    docker: &Docker,
    container: &str,
    command: String,
) -> Result<(i64, String), StepError> {
    let command = format!("( {command} ) 2>&1; echo \"{EXIT_MARK}$?\"");
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                user: Some("0".into()),
                cmd: Some(vec!["sh".to_string(), "-c".to_string(), command]),
                ..Default::default()
            },
        )
        .await
        .map_err(step("running a command in the helper container"))?;
    let started = docker
        .start_exec(&exec.id, Some(StartExecOptions::default()))
        .await
        .map_err(step("running a command in the helper container"))?;
    let mut said = Vec::new();
    let mut cut = None;
    if let StartExecResults::Attached { mut output, .. } = started {
        while let Some(piece) = output.next().await {
            match piece {
                Ok(chunk) => {
                    said.extend_from_slice(&chunk.into_bytes());
                    // Only the tail matters: the words before the status line, and the line.
                    let excess = said.len().saturating_sub(4096);
                    said.drain(..excess);
                }
                Err(e) => {
                    cut = Some(e);
                    break;
                }
            }
        }
    }
    let said = String::from_utf8_lossy(&said).trim().to_string();
    let (words, status) = said.rsplit_once(EXIT_MARK).unwrap_or((&said, ""));
    if let Ok(code) = status.trim().parse() {
        return Ok((code, words.trim().to_string()));
    }
    // No status line. The stream broke (the host went away mid-command: a restart to ride
    // through), or the shell never ran (an image without `sh`): the engine says which.
    if let Some(e) = cut {
        return Err(step("running a command in the helper container")(e));
    }
    let ended = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(step("running a command in the helper container"))?;
    match (ended.running, ended.exit_code) {
        (Some(false) | None, Some(code)) => Ok((code, words.trim().to_string())),
        _ => Err(StepError::HostDown(
            "the command's output ended before its status: the host went away mid-command"
                .to_string(),
        )),
    }
}

/// Links the runner's names to the helper binary in the job's helper container and checks it
/// runs; a clear failure naming the image otherwise.
pub(crate) async fn install(
    docker: &Docker,
    job: &Job,
    image: &str,
    paths: &[String],
) -> Result<(), StepError> {
    let (code, said) = exec_root(docker, &job.helper_container(), install_command(paths)).await?;
    let why = match code {
        0 => return Ok(()),
        3 => format!(
            "the helper image {image} has no gitlab-runner-helper (nor gitlab-runner) on its PATH; set --helper-image to an image of GitLab's gitlab-runner-helper"
        ),
        4 => format!(
            "the helper image {image}'s gitlab-runner-helper does not run on this machine (built for another architecture?): {said}"
        ),
        5 => format!("the runner's path cannot be linked in the helper image {image}: {said}"),
        126 | 127 => {
            format!("the helper image {image} has no shell to run the driver's commands: {said}")
        }
        other => format!("preparing the helper image {image} exited {other}: {said}"),
    };
    Err(StepError::Failed(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_official_image_is_named_as_the_runner_names_it() {
        assert_eq!(
            official("x86_64", Some("19.4.0")),
            format!("{GITLAB_HELPER}:x86_64-v19.4.0")
        );
        assert_eq!(
            official("aarch64", Some("16.6.0~beta.105.gd2263193")),
            format!("{GITLAB_HELPER}:arm64-v16.6.0")
        );
        assert_eq!(
            official("armv7l", None),
            format!("{GITLAB_HELPER}:arm-latest")
        );
        assert_eq!(
            official("s390x", Some("development version")),
            format!("{GITLAB_HELPER}:s390x-latest")
        );
    }

    #[test]
    fn the_runners_absolute_path_is_found_in_its_guards_and_odd_ones_refused() {
        let script = b"if gitlab-runner --version >/dev/null 2>&1; then\n  gitlab-runner cache-extractor\nfi\n\
            if /usr/local/bin/gitlab-runner --version >/dev/null 2>&1; then\nfi\n\
            if /usr/local/bin/gitlab-runner --version >/dev/null 2>&1; then\nfi\n";
        assert_eq!(
            runner_paths(script).expect("paths"),
            vec!["/usr/local/bin/gitlab-runner".to_string()]
        );
        for odd in [
            "if $'/opt/my runner/gitlab-runner' --version >/dev/null 2>&1; then\n",
            "if /opt/../etc/gitlab-runner --version >/dev/null 2>&1; then\n",
        ] {
            let refused = runner_paths(odd.as_bytes()).expect_err(odd);
            assert!(refused.contains("cannot link"), "{refused}");
        }
    }

    #[test]
    fn the_install_command_is_valid_sh_and_links_each_path_once() {
        let command = install_command(&["/usr/bin/gitlab-runner".into()]);
        let out = std::process::Command::new("/bin/sh")
            .args(["-n", "-c", &command])
            .output()
            .expect("sh");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(command.matches("'/usr/bin/gitlab-runner'").count(), 3);
    }
}

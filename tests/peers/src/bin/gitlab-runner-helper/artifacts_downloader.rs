//! `gitlab-runner-helper artifacts-downloader` (`commands/helpers/artifacts_downloader.go`
//! `ArtifactsDownloaderCommand.Execute`, `network/gitlab.go` `DownloadArtifacts`): fetch a
//! dependency's artifacts into a temporary file and extract them into the project directory.
//! The first attempt, with direct download on (`--direct-download`, or
//! `FF_USE_DIRECT_DOWNLOAD`, which the runner exports as `true` by default), asks
//! `GET {url}/api/v4/jobs/{id}/artifacts?direct_download=true` without following redirects;
//! a 302/307 logs `Direct download from <host>` and the request is made again following the
//! redirect (to object storage; `JOB-TOKEN` is not sent to another host). Retries (2, 1 s
//! apart, `retryHelper`) use the plain URL. 404 → `file does not exist`, 401/403 →
//! `permission denied`, both final; other failures → `invalid argument`, retried. The
//! script runs it as a plain command, so a failure fails the stage.
//!
//! Limits: zip archives only; no parallel range downloads
//! (`FF_USE_PARALLEL_ARTIFACT_TRANSFER`).
//!
//! Owns: the command's flow and messages. Must not know: zip layouts.

use std::fs::File;
use std::io;
use std::time::Duration;

use crate::cache_common::{Failure, Retry};
use crate::ctx::{Ctx, Exit, go_error};
use crate::flags::{Flag, Kind, Parsed, env_flag, flag};
use crate::gitlab::{self, JobCredentials};
use crate::http::{Client, Request, Response};
use crate::log::Level;

/// `NewArtifactsDownloaderCommand`'s description.
pub const USAGE: &str = "download and extract build artifacts (internal)";

const OWN_FLAGS: &[Flag] = &[
    flag("retry", Kind::Integer),
    flag("retry-time", Kind::Duration),
    env_flag(
        "transfer-meter-frequency",
        Kind::Duration,
        "TRANSFER_METER_FREQUENCY",
    ),
    env_flag("direct-download", Kind::Switch, "FF_USE_DIRECT_DOWNLOAD"),
    env_flag("archiver-staging-dir", Kind::Text, "ARCHIVER_STAGING_DIR"),
];

/// Every flag of the command.
pub fn flags() -> Vec<Flag> {
    gitlab::CREDENTIAL_FLAGS
        .iter()
        .chain(OWN_FLAGS)
        .copied()
        .collect()
}

/// `common.DownloadState`.
enum State {
    Succeeded,
    NotFound,
    Denied,
    Failed,
}

/// Runs the command.
pub fn run(ctx: &mut Ctx, parsed: &Parsed) -> Result<(), Exit> {
    let credentials = JobCredentials::from_flags(parsed);
    if credentials.url.is_empty() {
        ctx.log.warn("Missing URL (--url)");
    }
    if credentials.token.is_empty() {
        ctx.log.warn("Missing runner credentials (--token)");
    }
    if credentials.id <= 0 {
        ctx.log.warn("Missing build ID (--id)");
    }
    if credentials.id <= 0 || credentials.token.is_empty() || credentials.url.is_empty() {
        return fatal(ctx, "Incomplete arguments");
    }
    let staging = parsed.text("archiver-staging-dir");
    let staging = if staging.is_empty() {
        std::env::temp_dir()
    } else {
        ctx.resolve(&staging)
    };
    let temp = match tempfile::Builder::new()
        .prefix("artifacts")
        .tempfile_in(&staging)
    {
        Ok(temp) => temp,
        Err(err) => return fatal(ctx, &go_error(&err)),
    };
    // The runner's default for this flag is the feature flag's default (true): the variable
    // is always exported into the job environment.
    let direct = parsed.switch("direct-download").unwrap_or(true);
    let client = credentials.client(
        &ctx.env,
        Some(Duration::from_secs(3600)),
        Duration::from_secs(600),
    );
    let path = temp.path().to_path_buf();
    let outcome = Retry::from_flags(parsed).run(ctx, |ctx, retry| {
        let file = File::create(&path)
            .map_err(|e| Failure::fatal(format!("creating target file: {}", go_error(&e))))?;
        match download(ctx, &credentials, &client, file, direct && retry == 0) {
            State::Succeeded => Ok(()),
            State::NotFound => Err(Failure::fatal("file does not exist")),
            State::Denied => Err(Failure::fatal("permission denied")),
            State::Failed => Err(Failure::retryable("invalid argument")),
        }
    });
    if let Err(failure) = outcome {
        return fatal(ctx, &failure.message);
    }
    if let Err(err) = crate::extract::extract_file(ctx, &path) {
        return fatal(ctx, &err);
    }
    Ok(())
}

fn fatal(ctx: &mut Ctx, message: &str) -> Result<(), Exit> {
    ctx.log.fatal(message);
    Err(Exit::FAILURE)
}

const PREFIX: &str = "Downloading artifacts from coordinator...";

type Fields = Vec<(&'static str, String)>;

/// `DownloadArtifacts`.
fn download(
    ctx: &mut Ctx,
    credentials: &JobCredentials,
    client: &Client,
    file: File,
    direct: bool,
) -> State {
    let correlation = gitlab::correlation_id();
    let mut fields = credentials.fields(&correlation);
    let path = if direct {
        format!("jobs/{}/artifacts?direct_download=true", credentials.id)
    } else {
        format!("jobs/{}/artifacts", credentials.id)
    };
    let url = match credentials.api_url(&path) {
        Ok(url) => url,
        Err(err) => {
            fields.push(("error", err));
            ctx.log
                .line(Level::Error, &format!("{PREFIX} error"), &fields);
            return State::Failed;
        }
    };
    let request = Request::new("GET", url)
        .header("JOB-TOKEN", &credentials.token)
        .header("X-Request-Id", &correlation);
    if direct {
        direct_download(ctx, client, request, file, fields)
    } else {
        standard_download(ctx, client, request, file, fields)
    }
}

fn answered(response: &Response, fields: &mut Fields) {
    if let Some(id) = response.header("X-Request-Id").filter(|id| !id.is_empty()) {
        fields.retain(|(k, _)| *k != "correlation_id");
        fields.push(("correlation_id", id.to_string()));
    }
    fields.retain(|(k, _)| *k != "status");
    fields.push(("status", response.status.to_string()));
}

/// The direct-download path: no redirect on the first request, then a followed one.
fn direct_download(
    ctx: &mut Ctx,
    client: &Client,
    request: Request<'_>,
    file: File,
    mut fields: Fields,
) -> State {
    let first = match client.send_once(request.clone()) {
        Ok(response) => response,
        Err(err) => {
            fields.push(("error", err.to_string()));
            ctx.log
                .line(Level::Error, &format!("{PREFIX} error"), &fields);
            return State::Failed;
        }
    };
    answered(&first, &mut fields);
    let mut response = first;
    if response.status == 200 {
        return save(ctx, &mut response, file, &fields);
    }
    if matches!(response.status, 302 | 307) {
        if let Some(host) = redirect_host(&response) {
            let line = format!("Direct download from {host}");
            ctx.log.line(Level::Info, &line, &fields);
        }
        let mut followed = match gitlab::send_api(ctx, client, request) {
            Ok(response) => response,
            Err(err) => {
                fields.push(("error", err.to_string()));
                ctx.log
                    .line(Level::Error, &format!("{PREFIX} error"), &fields);
                return State::Failed;
            }
        };
        if followed.status == 200 {
            return save(ctx, &mut followed, file, &fields);
        }
        response = followed;
    }
    if let Some(state) = refused(ctx, &mut response, &fields) {
        return state;
    }
    ctx.log
        .line(Level::Warn, &format!("{PREFIX} failed"), &fields);
    State::Failed
}

/// Go's `URL.Host` of the `Location`: the host with its port, if it has one.
fn redirect_host(response: &Response) -> Option<String> {
    let location = response.url.join(response.header("Location")?).ok()?;
    let host = location.host_str()?;
    Some(
        location
            .port()
            .map_or_else(|| host.to_string(), |p| format!("{host}:{p}")),
    )
}

fn standard_download(
    ctx: &mut Ctx,
    client: &Client,
    request: Request<'_>,
    file: File,
    mut fields: Fields,
) -> State {
    let mut response = match gitlab::send_api(ctx, client, request) {
        Ok(response) => response,
        Err(err) => {
            ctx.log
                .line(Level::Error, &format!("{PREFIX} error {err}"), &fields);
            return State::Failed;
        }
    };
    answered(&response, &mut fields);
    if let Some(host) = response.url.host_str() {
        fields.push(("host", host.to_string()));
    }
    if response.status == 200 {
        return save(ctx, &mut response, file, &fields);
    }
    if let Some(state) = refused(ctx, &mut response, &fields) {
        return state;
    }
    fields.retain(|(k, _)| *k != "status");
    fields.push(("status", response.status_text()));
    ctx.log
        .line(Level::Warn, &format!("{PREFIX} failed"), &fields);
    State::Failed
}

/// `artifactDownloadStateFromResponse`: 403, 401 and 404.
fn refused(ctx: &mut Ctx, response: &mut Response, fields: &Fields) -> Option<State> {
    let mut fields = fields.clone();
    let (state, word, status) = match response.status {
        403 => (
            State::Denied,
            "forbidden",
            Some(gitlab::message_from_json_or_xml("GET", response)),
        ),
        401 => (State::Denied, "unauthorized", Some(response.status_text())),
        404 => (State::NotFound, "not found", None),
        _ => return None,
    };
    if let Some(status) = status {
        fields.retain(|(k, _)| *k != "status");
        fields.push(("status", status));
    }
    ctx.log
        .line(Level::Error, &format!("{PREFIX} {word}"), &fields);
    Some(state)
}

/// `downloadArtifactFile`.
fn save(ctx: &mut Ctx, response: &mut Response, mut file: File, fields: &Fields) -> State {
    let mut fields = fields.clone();
    match io::copy(response, &mut file) {
        Ok(_) => {
            ctx.log.line(Level::Info, &format!("{PREFIX} ok"), &fields);
            State::Succeeded
        }
        Err(err) => {
            fields.push(("error", err.to_string()));
            ctx.log
                .line(Level::Error, &format!("{PREFIX} error"), &fields);
            State::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{Reply, Server, args, project};

    fn zip_of_one_file(name: &str, text: &str) -> Vec<u8> {
        let (dir, mut ctx, _captured) = project(&[]);
        std::fs::write(ctx.wd.join(name), text).expect("file");
        let zip = crate::archive_write::write_archive(
            &mut ctx,
            crate::archive_write::Format::Zip,
            &[name.to_string()],
            Vec::new(),
        );
        drop(dir);
        zip.expect("zip")
    }

    fn download_from(ctx: &mut Ctx, base: &str, extra: &[&str]) -> Result<(), Exit> {
        let mut list = args(&["--url", base, "--token", "glcbt-job-token", "--id", "9"]);
        list.extend(args(extra));
        let parsed = crate::flags::parse(&flags(), &list, &ctx.env).expect("flags");
        run(ctx, &parsed)
    }

    #[test]
    fn a_direct_download_follows_the_redirect_to_object_storage_without_the_job_token() {
        let zip = zip_of_one_file("dist.txt", "built");
        let storage = Server::start(move |_| Reply::new(200).body(zip.clone()));
        let location = format!(
            "{}/bucket/artifacts.zip?X-Amz-Signature=secret",
            storage.base.replace("127.0.0.1", "localhost")
        );
        let gitlab = Server::start(move |_| Reply::new(302).header("Location", &location));
        let (_dir, mut ctx, captured) = project(&[]);
        download_from(&mut ctx, &gitlab.base, &[]).expect("downloaded");
        assert_eq!(
            std::fs::read_to_string(ctx.wd.join("dist.txt")).expect("extracted"),
            "built"
        );
        let asked = gitlab.requests();
        assert_eq!(
            asked.len(),
            2,
            "the no-redirect probe, then the followed request"
        );
        assert!(
            asked
                .iter()
                .all(|r| r.target == "/api/v4/jobs/9/artifacts?direct_download=true")
        );
        assert!(
            asked
                .iter()
                .all(|r| r.header("JOB-TOKEN") == Some("glcbt-job-token"))
        );
        let fetched = storage.requests();
        assert_eq!(fetched.len(), 1);
        assert_eq!(fetched[0].header("JOB-TOKEN"), None);
        let log = captured.text();
        assert!(log.contains("Direct download from localhost"), "{log}");
        assert!(
            log.contains("Downloading artifacts from coordinator... ok"),
            "{log}"
        );
        assert!(
            !log.contains("secret") && !log.contains("glcbt-job-token"),
            "{log}"
        );
    }

    #[test]
    fn missing_artifacts_are_not_retried() {
        let gitlab = Server::start(|_| {
            Reply::new(404)
                .header("Content-Type", "application/json")
                .body("{\"message\":\"404 Not Found\"}")
        });
        let (_dir, mut ctx, captured) = project(&[]);
        assert_eq!(
            download_from(&mut ctx, &gitlab.base, &["--direct-download=false"]),
            Err(Exit::FAILURE)
        );
        assert_eq!(gitlab.requests().len(), 1);
        assert_eq!(gitlab.requests()[0].target, "/api/v4/jobs/9/artifacts");
        let log = captured.text();
        assert!(
            log.contains("ERROR: Downloading artifacts from coordinator... not found"),
            "{log}"
        );
        assert!(log.contains("FATAL: file does not exist"), "{log}");
    }

    #[test]
    fn incomplete_credentials_are_fatal() {
        let (_dir, mut ctx, captured) = project(&[]);
        ctx.env.set("CI_JOB_TOKEN", "");
        ctx.env.set("CI_JOB_ID", "");
        let parsed =
            crate::flags::parse(&flags(), &args(&["--url", "http://x"]), &ctx.env).expect("flags");
        assert_eq!(run(&mut ctx, &parsed), Err(Exit::FAILURE));
        let log = captured.text();
        assert!(
            log.contains("WARNING: Missing runner credentials (--token)")
                && log.contains("FATAL: Incomplete arguments")
        );
    }
}

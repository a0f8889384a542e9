//! `gitlab-runner-helper artifacts-uploader` (`commands/helpers/artifacts_uploader.go`
//! `ArtifactsUploaderCommand.Execute` / `Run`): select the artifact paths, build the archive
//! (in memory here; the runner streams it through a pipe) and POST it as
//! `multipart/form-data` field `file` (`<name>.zip`, `.gz`, or the bare name for raw) to
//! `{url}/api/v4/jobs/{id}/artifacts?artifact_format=…&artifact_type=…&expire_in=…` (only the
//! options given, keys sorted as `url.Values.Encode` sorts them) with `JOB-TOKEN`
//! (`network/gitlab.go` `UploadRawArtifacts`, `uploadRawArtifactsQuery`,
//! `createArtifactsContentProvider`). The answer is read as `determineUploadState` reads it:
//! 201 succeeds; 403 (`permission denied`) and 413 (`too large`) fail at once; 503 is retried
//! up to 6 tries, other failures up to 3 (`shouldRetry`), 1 s, 2 s, 4 s apart. A 307/308 is
//! followed with the body sent again, as Go's client does for a request with `GetBody`. The
//! command ends `FATAL: …` with status 1 when the upload fails (the script's `Command`
//! fails the stage), and `ERROR: No files to upload` with status 0 when nothing matched.
//!
//! Limits: zip, gzip and raw formats (`zipzstd` / `tarzstd` are refused).
//!
//! Owns: the command's flow and messages. Must not know: zip layouts.

use std::time::Duration;

use crate::archive_write::{self, Format};
use crate::ctx::{Ctx, Exit};
use crate::flags::{Flag, Kind, Parsed, env_flag, flag};
use crate::gitlab::{self, JobCredentials};
use crate::http::{Body, Request, Response};
use crate::log::Level;
use crate::paths::{FileArchiver, Selection};

/// `NewArtifactsUploaderCommand`'s description.
pub const USAGE: &str = "create and upload build artifacts (internal)";

const OWN_FLAGS: &[Flag] = &[
    flag("path", Kind::Texts),
    flag("exclude", Kind::Texts),
    flag("untracked", Kind::Switch),
    flag("verbose", Kind::Switch),
    env_flag(
        "transfer-meter-frequency",
        Kind::Duration,
        "TRANSFER_METER_FREQUENCY",
    ),
    flag("name", Kind::Text),
    flag("expire-in", Kind::Text),
    flag("artifact-format", Kind::Text),
    flag("artifact-type", Kind::Text),
    env_flag(
        "compression-level",
        Kind::Text,
        "ARTIFACT_COMPRESSION_LEVEL",
    ),
    flag("timeout", Kind::Duration),
    flag("response-header-timeout", Kind::Duration),
    env_flag("ci-debug-trace", Kind::Switch, "CI_DEBUG_TRACE"),
];

/// Every flag of the command.
pub fn flags() -> Vec<Flag> {
    gitlab::CREDENTIAL_FLAGS
        .iter()
        .chain(OWN_FLAGS)
        .chain(crate::statement::FLAGS)
        .copied()
        .collect()
}

struct Uploader {
    credentials: JobCredentials,
    name: String,
    expire_in: String,
    format_name: String,
    format: Format,
    artifact_type: String,
    compression_level: String,
    timeout: Duration,
    header_timeout: Duration,
    debug_trace: bool,
}

/// Why one attempt failed (`Run`'s error).
struct Failed {
    message: String,
    retryable: bool,
    unavailable: bool,
}

impl Failed {
    fn retry(message: impl Into<String>) -> Failed {
        Failed {
            message: message.into(),
            retryable: true,
            unavailable: false,
        }
    }

    fn stop(message: impl Into<String>) -> Failed {
        Failed {
            message: message.into(),
            retryable: false,
            unavailable: false,
        }
    }
}

/// Runs the command.
pub fn run(ctx: &mut Ctx, parsed: &Parsed) -> Result<(), Exit> {
    let uploader = setup(ctx, parsed)?;
    let mut archiver = FileArchiver::from_flags(parsed);
    archiver.expand(ctx);
    let mut selection = archiver.enumerate(ctx);
    if parsed
        .switch("generate-artifacts-metadata")
        .unwrap_or(false)
    {
        ctx.log.info("Generating artifacts statement");
        let id = uploader.credentials.id;
        match crate::statement::generate(ctx, parsed, &uploader.name, &selection, id) {
            Ok(file) => {
                let path = ctx.wd.join(&file);
                let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
                selection.files.insert(file, modified);
            }
            Err(err) => return Err(fail(ctx, &err)),
        }
    }
    match uploader.upload_with_retries(ctx, &selection) {
        Ok(()) => Ok(()),
        Err(message) => Err(fail(ctx, &message)),
    }
}

/// `normalizeArgs` and the flag values.
fn setup(ctx: &mut Ctx, parsed: &Parsed) -> Result<Uploader, Exit> {
    let credentials = JobCredentials::from_flags(parsed);
    if credentials.url.is_empty() || credentials.token.is_empty() {
        return Err(fail(ctx, "Missing runner credentials"));
    }
    if credentials.id <= 0 {
        return Err(fail(ctx, "Missing build ID"));
    }
    let mut name = parsed.text("name");
    if name.is_empty() {
        name = "artifacts".into();
    }
    match crate::expand::shell_expand(&name, &ctx.env) {
        Ok(expanded) => name = expanded,
        Err(err) => ctx.log.warn(&format!("invalid artifact name: {err}")),
    }
    let format_name = parsed.text("artifact-format");
    let format = Format::parse(&format_name).map_err(|err| fail(ctx, &err))?;
    Ok(Uploader {
        credentials,
        name,
        expire_in: parsed.text("expire-in"),
        format_name,
        format,
        artifact_type: parsed.text("artifact-type"),
        compression_level: parsed.text("compression-level"),
        timeout: parsed
            .duration("timeout")
            .unwrap_or(Duration::from_secs(3600)),
        header_timeout: parsed
            .duration("response-header-timeout")
            .unwrap_or(Duration::from_secs(600)),
        debug_trace: parsed.switch("ci-debug-trace").unwrap_or(false),
    })
}

/// `logrus.Fatalln`: the line, then status 1.
fn fail(ctx: &mut Ctx, message: &str) -> Exit {
    ctx.log.fatal(message);
    Exit::FAILURE
}

/// `artifactFilename`.
fn artifact_filename(name: &str, format: Format) -> String {
    let base = crate::cache_common::base_name(name);
    let base = if base.is_empty() || base == "." {
        "default".to_string()
    } else {
        base
    };
    match format {
        Format::Zip => format!("{base}.zip"),
        Format::Gzip => format!("{base}.gz"),
        Format::Raw => base,
    }
}

fn random_hex(bytes: usize) -> String {
    use ring::rand::SecureRandom;
    let mut raw = vec![0u8; bytes];
    let _filled = ring::rand::SystemRandom::new().fill(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// The multipart body Go's `multipart.Writer` writes for one `CreateFormFile` part.
fn multipart(boundary: &str, filename: &str, data: &[u8]) -> Vec<u8> {
    let escaped = filename.replace('\\', "\\\\").replace('"', "\\\"");
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{escaped}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

impl Uploader {
    /// `retry.WithFn(c, c.Run)` with `shouldRetry`: 1 s, 2 s, 4 s… (at most 5 s) apart.
    fn upload_with_retries(&self, ctx: &mut Ctx, selection: &Selection) -> Result<(), String> {
        let mut tries = 0;
        let mut backoff = Duration::from_secs(1);
        loop {
            tries += 1;
            let Err(failed) = self.attempt(ctx, selection) else {
                return Ok(());
            };
            let limit = if failed.unavailable { 6 } else { 3 };
            if !failed.retryable || tries >= limit {
                return Err(failed.message);
            }
            let fields = [
                ("context", "artifacts-uploader".to_string()),
                ("error", failed.message.clone()),
            ];
            ctx.log.line(Level::Warn, "Retrying...", &fields);
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// `Run`: one upload.
    fn attempt(&self, ctx: &mut Ctx, selection: &Selection) -> Result<(), Failed> {
        if selection.files.is_empty() {
            ctx.log.error("No files to upload");
            return Ok(());
        }
        archive_write::check_compression_level(ctx, &self.compression_level);
        let files: Vec<String> = selection.files.keys().cloned().collect();
        let archive = archive_write::write_archive(ctx, self.format, &files, Vec::new())
            .map_err(Failed::retry)?;
        let boundary = random_hex(30);
        let body = multipart(
            &boundary,
            &artifact_filename(&self.name, self.format),
            &archive,
        );
        let query = self.query();
        let path = format!("jobs/{}/artifacts?{query}", self.credentials.id);
        let url = self.credentials.api_url(&path).map_err(Failed::retry)?;
        let correlation = gitlab::correlation_id();
        let request = Request::new("POST", url)
            .header("JOB-TOKEN", &self.credentials.token)
            .header("X-Request-Id", &correlation)
            .header(
                "Content-Type",
                &format!("multipart/form-data; boundary={boundary}"),
            )
            .body(Body::Bytes(&body));
        let client = self
            .credentials
            .client(&ctx.env, Some(self.timeout), self.header_timeout);
        let prefix = if self.artifact_type.is_empty() {
            "Uploading artifacts to coordinator...".to_string()
        } else {
            format!(
                "Uploading artifacts as {:?} to coordinator...",
                self.artifact_type
            )
        };
        let mut fields = self.credentials.fields(&correlation);
        let mut response = match gitlab::send_api(ctx, &client, request) {
            Ok(response) => response,
            Err(err) => {
                fields.push(("error", err.to_string()));
                ctx.log
                    .line(Level::Error, &format!("{prefix} error"), &fields);
                return Err(Failed::retry(err.to_string()));
            }
        };
        self.judge(ctx, &mut response, &prefix, fields)
    }

    /// `uploadRawArtifactsQuery`, encoded with sorted keys.
    fn query(&self) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        let mut pairs = vec![
            ("artifact_format", self.format_name.as_str()),
            ("artifact_type", self.artifact_type.as_str()),
            ("expire_in", self.expire_in.as_str()),
        ];
        pairs.retain(|(_, value)| !value.is_empty());
        for (key, value) in pairs {
            query.append_pair(key, value);
        }
        query.finish()
    }

    /// `determineUploadState`.
    fn judge(
        &self,
        ctx: &mut Ctx,
        response: &mut Response,
        prefix: &str,
        mut fields: Vec<(&'static str, String)>,
    ) -> Result<(), Failed> {
        if let Some(id) = response.header("X-Request-Id").filter(|id| !id.is_empty()) {
            fields.retain(|(k, _)| *k != "correlation_id");
            fields.push(("correlation_id", id.to_string()));
        }
        fields.push(("status", response.status.to_string()));
        if self.debug_trace {
            trace_response(ctx, response, &fields);
        }
        let status_text = gitlab::message_from_json("POST", response);
        let line = format!("{prefix} {status_text}");
        match response.status {
            201 => {
                ctx.log.line(Level::Info, &line, &fields);
                Ok(())
            }
            307 => {
                ctx.log
                    .line(Level::Error, &format!("{line} empty location"), &fields);
                Err(Failed::retry(
                    "upload failed with no response from coordinator",
                ))
            }
            403 => {
                ctx.log.line(Level::Error, &line, &fields);
                Err(Failed::stop("permission denied"))
            }
            413 => {
                ctx.log.line(Level::Error, &line, &fields);
                Err(Failed::stop("too large"))
            }
            503 => {
                ctx.log.line(Level::Error, &line, &fields);
                Err(Failed {
                    message: "service unavailable".into(),
                    retryable: true,
                    unavailable: true,
                })
            }
            _ => {
                ctx.log.line(Level::Warn, &line, &fields);
                Err(Failed::retry(
                    "upload failed with no response from coordinator",
                ))
            }
        }
    }
}

/// `logResponseDetails` for `CI_DEBUG_TRACE`: the response headers (not the body, which
/// the status text still needs).
fn trace_response(ctx: &mut Ctx, response: &Response, fields: &[(&'static str, String)]) {
    let names: Vec<String> = response
        .headers
        .iter()
        .map(|(n, _)| format!("header[{n}]"))
        .collect();
    let mut details: Vec<(&str, String)> = fields.iter().map(|(k, v)| (*k, v.clone())).collect();
    for ((_, value), name) in response.headers.iter().zip(names.iter()) {
        details.push((name.as_str(), format!("[{value}]")));
    }
    ctx.log.line(Level::Warn, "received response", &details);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{Reply, Server, args, project};

    fn upload(ctx: &mut Ctx, base: &str, extra: &[&str]) -> Result<(), Exit> {
        let mut list = args(&["--url", base, "--token", "glcbt-secret-token", "--id", "42"]);
        list.extend(args(extra));
        let parsed = crate::flags::parse(&flags(), &list, &ctx.env).expect("flags");
        run(ctx, &parsed)
    }

    #[test]
    fn the_upload_is_a_multipart_post_with_the_job_token_and_never_logs_it() {
        let server = Server::start(|_| {
            Reply::new(201)
                .header("Content-Type", "application/json")
                .body("{}")
        });
        let (_dir, mut ctx, captured) = project(&[]);
        std::fs::create_dir_all(ctx.wd.join("out")).expect("dir");
        std::fs::write(ctx.wd.join("out/report.txt"), "passed").expect("file");
        let extra = [
            "--path",
            "out/",
            "--artifact-format",
            "zip",
            "--artifact-type",
            "archive",
            "--expire-in",
            "1 week",
        ];
        upload(&mut ctx, &server.base, &extra).expect("uploaded");
        let requests = server.requests();
        let request = requests.first().expect("one request");
        assert_eq!(request.method, "POST");
        assert_eq!(
            request.target,
            "/api/v4/jobs/42/artifacts?artifact_format=zip&artifact_type=archive&expire_in=1+week"
        );
        assert_eq!(request.header("JOB-TOKEN"), Some("glcbt-secret-token"));
        let content_type = request.header("Content-Type").expect("content type");
        let boundary = content_type
            .strip_prefix("multipart/form-data; boundary=")
            .expect("multipart");
        let body = String::from_utf8_lossy(&request.body).into_owned();
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\n"
        );
        assert!(body.starts_with(&head), "{body}");
        assert!(body.ends_with(&format!("\r\n--{boundary}--\r\n")));
        assert!(body.contains("out/report.txt") && body.contains("passed"));
        let log = captured.text();
        assert!(
            log.contains("out/: found 2 matching artifact files and directories"),
            "{log}"
        );
        assert!(
            log.contains("Uploading artifacts as \"archive\" to coordinator... 201 Created"),
            "{log}"
        );
        assert!(
            log.contains("id=42") && log.contains("status=201") && log.contains("token=[MASKED]"),
            "{log}"
        );
        assert!(!log.contains("secret"), "{log}");
    }

    #[test]
    fn a_forbidden_upload_fails_at_once_with_permission_denied() {
        let server = Server::start(|_| {
            Reply::new(403)
                .header("Content-Type", "application/json")
                .body("{\"message\":\"403 Forbidden\"}")
        });
        let (_dir, mut ctx, captured) = project(&[]);
        std::fs::write(ctx.wd.join("a.txt"), "a").expect("file");
        assert_eq!(
            upload(&mut ctx, &server.base, &["--path", "a.txt"]),
            Err(Exit::FAILURE)
        );
        assert_eq!(server.requests().len(), 1);
        assert!(captured.text().contains("FATAL: permission denied"));
    }

    #[test]
    fn nothing_to_upload_is_an_error_line_but_not_a_failure() {
        let (_dir, mut ctx, captured) = project(&[]);
        assert_eq!(
            upload(&mut ctx, "http://127.0.0.1:9", &["--path", "missing/"]),
            Ok(())
        );
        assert!(captured.text().contains("ERROR: No files to upload"));
    }

    #[test]
    fn zstd_formats_are_refused_by_name() {
        let (_dir, mut ctx, captured) = project(&[]);
        assert_eq!(
            upload(
                &mut ctx,
                "http://127.0.0.1:9",
                &["--path", "a", "--artifact-format", "zipzstd"]
            ),
            Err(Exit::FAILURE)
        );
        assert!(
            captured
                .text()
                .contains("\"zipzstd\" format: unsupported archive format")
        );
    }

    #[test]
    fn artifact_file_names_follow_the_format() {
        assert_eq!(artifact_filename("artifacts", Format::Zip), "artifacts.zip");
        assert_eq!(artifact_filename("junit", Format::Gzip), "junit.gz");
        assert_eq!(artifact_filename("dir/raw.bin", Format::Raw), "raw.bin");
        assert_eq!(artifact_filename("", Format::Zip), "default.zip");
    }
}

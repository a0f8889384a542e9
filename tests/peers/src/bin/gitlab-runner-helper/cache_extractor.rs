//! `gitlab-runner-helper cache-extractor` (`commands/helpers/cache_extractor.go`
//! `CacheExtractorCommand.Execute`): with `--url` (presigned) or `--gocloud-url`, download the
//! cache to `--file` first, unless the local copy is at least as new (`… is up to date`);
//! then extract `--file` into the project directory. The script runs it inside `if … then
//! Successfully extracted cache; else Failed to extract cache` and falls back to the next
//! key (`shells/abstract.go` `addExtractCacheCommand`), so every failure here is status 1:
//! a presigned 404 warns `file does not exist`, a missing local file warns `Cache file does
//! not exist` (`warningln` = warning + `logrus.Exit(1)`), other errors are `FATAL: …`. A
//! GoCloud object that does not exist is not an error: the local file, if any, is
//! extracted. With `--alternate-url` / `--alternate-gocloud-url` the newer of the two
//! objects is downloaded (`selectPresignedURL`, `selectGoCloudSource`).
//!
//! Limits: sequential downloads only; zip archives only.
//!
//! Owns: the command's flow and messages. Must not know: the wire formats.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::time::SystemTime;

use url::Url;

use crate::cache_common::{self, Failure, Retry, SHARED_FLAGS, base_name};
use crate::ctx::{Ctx, Exit, go_error};
use crate::flags::{Flag, Kind, Parsed, flag};
use crate::http::{Client, Request, Response, clean_url};
use crate::log::Level;

/// `NewCacheExtractorCommand`'s description.
pub const USAGE: &str = "download and extract cache artifacts (internal)";

const OWN_FLAGS: &[Flag] = &[
    flag("alternate-url", Kind::Text),
    flag("alternate-gocloud-url", Kind::Text),
    flag("head-url", Kind::Text),
    flag("alternate-head-url", Kind::Text),
];

/// Every flag of the command.
pub fn flags() -> Vec<Flag> {
    SHARED_FLAGS.iter().chain(OWN_FLAGS).copied().collect()
}

struct Extractor {
    file: String,
    url: String,
    gocloud_url: String,
    alternate_url: String,
    alternate_gocloud_url: String,
    head_url: String,
    alternate_head_url: String,
    env_file: String,
    client: Client,
}

/// Runs the command.
pub fn run(ctx: &mut Ctx, parsed: &Parsed) -> Result<(), Exit> {
    if let Err(err) = cache_common::check_tuning(parsed) {
        ctx.log.fatal(&err);
        return Err(Exit::FAILURE);
    }
    let extractor = Extractor {
        file: parsed.text("file"),
        url: parsed.text("url"),
        gocloud_url: parsed.text("gocloud-url"),
        alternate_url: parsed.text("alternate-url"),
        alternate_gocloud_url: parsed.text("alternate-gocloud-url"),
        head_url: parsed.text("head-url"),
        alternate_head_url: parsed.text("alternate-head-url"),
        env_file: parsed.text("env-file"),
        client: cache_common::cache_client(ctx, parsed.integer("timeout").unwrap_or(0)),
    };
    if extractor.file.is_empty() {
        return warning_exit(ctx, "Missing cache file");
    }
    if !extractor.url.is_empty() || !extractor.gocloud_url.is_empty() {
        if let Err(failure) = Retry::from_flags(parsed).run(ctx, |ctx, _| extractor.download(ctx)) {
            return warning_exit(ctx, &failure.message);
        }
    } else {
        ctx.log.info(
            "No URL provided, cache will not be downloaded from shared cache server. Instead a local version of cache will be extracted.",
        );
    }
    let archive = ctx.resolve(&extractor.file);
    if fs::metadata(&archive).is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
        return warning_exit(ctx, "Cache file does not exist");
    }
    if let Err(err) = crate::extract::extract_file(ctx, &archive) {
        ctx.log.fatal(&err);
        return Err(Exit::FAILURE);
    }
    Ok(())
}

/// `warningln`: a warning, then `logrus.Exit(1)`.
fn warning_exit(ctx: &mut Ctx, message: &str) -> Result<(), Exit> {
    ctx.log.warn(message);
    Err(Exit::FAILURE)
}

/// `isLocalCacheFileUpToDate`: the local file exists and the remote is not newer (an
/// unknown remote time counts as not newer, as Go's zero time does).
fn up_to_date(path: &Path, remote: Option<SystemTime>) -> bool {
    match fs::symlink_metadata(path).and_then(|m| m.modified()) {
        Ok(local) => remote.is_none_or(|remote| remote <= local),
        Err(_) => false,
    }
}

/// Go's `time.Time` `%v` text for the selection log fields.
fn shown_time(time: Option<SystemTime>) -> String {
    match time {
        Some(time) => crate::timefmt::rfc3339(time)
            .replace('T', " ")
            .replace('Z', " +0000 UTC"),
        None => "0001-01-01 00:00:00 +0000 UTC".into(),
    }
}

impl Extractor {
    /// `download`: one attempt.
    fn download(&self, ctx: &mut Ctx) -> Result<(), Failure> {
        let archive = ctx.resolve(&self.file);
        let dir = archive
            .parent()
            .map_or_else(|| ctx.wd.clone(), Path::to_path_buf);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Failure::fatal(go_error(&e)))?;
        if !self.gocloud_url.is_empty() {
            ctx.log.info("Using GoCloud URL for cache download");
            return self.download_gocloud(ctx, &archive);
        }
        ctx.log.info("Using presigned URL for cache download");
        let selected = self.select_presigned(ctx);
        let url = Url::parse(&selected)
            .map_err(|e| Failure::retryable(format!("parse {selected:?}: {e}")))?;
        // `cleanedURL` is the URL asked for, not where a redirect led.
        let shown = clean_url(&url);
        let mut response = self
            .client
            .send(Request::new("GET", url))
            .map_err(|e| Failure::retryable(e.to_string()))?;
        if response.status == 404 {
            return Err(Failure::fatal("file does not exist"));
        }
        cache_common::retry_on_server_error(&mut response)?;
        let modified = response
            .header("Last-Modified")
            .and_then(crate::timefmt::parse_http_date);
        if up_to_date(&archive, modified) {
            ctx.log
                .info(&format!("{} is up to date", base_name(&self.file)));
            return Ok(());
        }
        let etag = response.header("ETag").map(str::to_string);
        let metadata = cache_common::headers_to_metadata(&response.headers);
        self.save(
            ctx,
            &archive,
            &mut response,
            modified,
            etag,
            &shown,
            &metadata,
        )
    }

    /// `selectPresignedURL`: the primary unless the alternate answers HEAD with a newer
    /// `Last-Modified`, or the primary does not answer at all.
    fn select_presigned(&self, ctx: &mut Ctx) -> String {
        if self.alternate_url.is_empty() {
            return self.url.clone();
        }
        let primary_head = if self.head_url.is_empty() {
            &self.url
        } else {
            &self.head_url
        };
        let alternate_head = if self.alternate_head_url.is_empty() {
            &self.alternate_url
        } else {
            &self.alternate_head_url
        };
        let primary = self.head_time(primary_head);
        let alternate = self.head_time(alternate_head);
        let cleaned = |raw: &str| Url::parse(raw).map(|u| clean_url(&u)).unwrap_or_default();
        let fields = [
            ("primary_url", cleaned(&self.url)),
            ("alternate_url", cleaned(&self.alternate_url)),
            (
                "primary_modified",
                shown_time(primary.as_ref().ok().copied()),
            ),
            (
                "alternate_modified",
                shown_time(alternate.as_ref().ok().copied()),
            ),
        ];
        let (message, url) = match (primary, alternate) {
            (Err(()), Ok(_)) => (
                "Selecting alternate cache URL: primary not available",
                &self.alternate_url,
            ),
            (Ok(p), Ok(a)) if a > p => (
                "Selecting alternate cache URL: newer timestamp",
                &self.alternate_url,
            ),
            _ => ("Selecting primary cache URL", &self.url),
        };
        ctx.log.line(Level::Info, message, &fields);
        url.clone()
    }

    /// `fetchPresignedTimestamp`.
    fn head_time(&self, raw: &str) -> Result<SystemTime, ()> {
        let url = Url::parse(raw).map_err(|_| ())?;
        let response = self
            .client
            .send(Request::new("HEAD", url))
            .map_err(|_| ())?;
        if response.status != 200 {
            return Err(());
        }
        response
            .header("Last-Modified")
            .and_then(crate::timefmt::parse_http_date)
            .ok_or(())
    }

    /// `handleGoCloudURL` for `azblob://`.
    fn download_gocloud(&self, ctx: &mut Ctx, archive: &Path) -> Result<(), Failure> {
        cache_common::load_env_file(ctx, &self.env_file).map_err(Failure::fatal)?;
        let primary = crate::azure::locate(&self.gocloud_url, &ctx.env).map_err(Failure::fatal)?;
        let (blob, attributes) = match self.select_gocloud(ctx, primary)? {
            (_, None) => return Ok(()),
            (blob, Some(attributes)) => (blob, attributes),
        };
        if up_to_date(archive, attributes.modified) {
            ctx.log
                .info(&format!("{} is up to date", base_name(&self.file)));
            return Ok(());
        }
        let mut response = crate::azure::get(&self.client, &blob).map_err(Failure::fatal)?;
        let shown = blob.source.clone();
        self.save(
            ctx,
            archive,
            &mut response,
            attributes.modified,
            attributes.etag,
            &shown,
            &attributes.metadata,
        )
    }

    /// `resolveGoCloudSource` + `selectGoCloudSource`: the blob to read and its attributes
    /// (`None` when it does not exist, which is not an error).
    fn select_gocloud(
        &self,
        ctx: &mut Ctx,
        primary: crate::azure::Blob,
    ) -> Result<(crate::azure::Blob, Option<crate::azure::Attributes>), Failure> {
        let alternate = if self.alternate_gocloud_url.is_empty() {
            None
        } else {
            match crate::azure::locate(&self.alternate_gocloud_url, &ctx.env) {
                Ok(blob) => Some(blob),
                Err(err) => {
                    ctx.log.line(
                        Level::Warn,
                        "Failed to open alternate GoCloud cache bucket",
                        &[("error", err)],
                    );
                    None
                }
            }
        };
        let primary_attributes = crate::azure::head(&self.client, &primary);
        let Some(alternate) = alternate else {
            return Ok((primary, primary_attributes.map_err(Failure::fatal)?));
        };
        let alternate_attributes = crate::azure::head(&self.client, &alternate);
        let fields = [
            ("primary_object", primary.object.clone()),
            ("alternate_object", alternate.object.clone()),
        ];
        match (primary_attributes, alternate_attributes) {
            (Err(_) | Ok(None), Ok(Some(a))) => {
                ctx.log.line(
                    Level::Info,
                    "Selecting alternate GoCloud cache: primary not available",
                    &fields,
                );
                Ok((alternate, Some(a)))
            }
            (Ok(Some(p)), Ok(Some(a))) if a.modified > p.modified => {
                ctx.log.line(
                    Level::Info,
                    "Selecting alternate GoCloud cache: newer timestamp",
                    &fields,
                );
                Ok((alternate, Some(a)))
            }
            (primary_attributes, _) => {
                ctx.log
                    .line(Level::Info, "Selecting primary GoCloud cache", &fields);
                Ok((primary, primary_attributes.map_err(Failure::fatal)?))
            }
        }
    }

    /// `downloadAndSaveCache`: a temporary `cache*` file beside `--file`, given the remote
    /// time, renamed over it; then `metadata.json`.
    #[allow(clippy::too_many_arguments)] // mirrors downloadAndSaveCache's parameters
    fn save(
        &self,
        ctx: &mut Ctx,
        archive: &Path,
        body: &mut Response,
        modified: Option<SystemTime>,
        etag: Option<String>,
        shown: &str,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), Failure> {
        let dir = archive
            .parent()
            .map_or_else(|| ctx.wd.clone(), Path::to_path_buf);
        let temp = tempfile::Builder::new()
            .prefix("cache")
            .tempfile_in(&dir)
            .map_err(|e| Failure::fatal(go_error(&e)))?;
        let name = base_name(&self.file);
        let name = name
            .rsplit_once('.')
            .map_or(name.as_str(), |(stem, _)| stem)
            .to_string();
        let message = format!("Downloading {name} from {shown}");
        match etag {
            Some(etag) => ctx.log.line(Level::Info, &message, &[("etag", etag)]),
            None => ctx.log.info(&message),
        }
        let mut file = temp.as_file();
        io::copy(&mut body.by_ref().take(u64::MAX), &mut file)
            .map_err(|e| Failure::retryable(e.to_string()))?;
        if let Some(time) = modified {
            file.set_modified(time)
                .map_err(|e| Failure::fatal(go_error(&e)))?;
        }
        temp.persist(archive)
            .map_err(|e| Failure::fatal(format!("renaming: {}", go_error(&e.error))))?;
        cache_common::write_metadata_file(archive, metadata).map_err(Failure::fatal)
    }
}

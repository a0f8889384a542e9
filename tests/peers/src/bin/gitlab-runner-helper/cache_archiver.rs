//! `gitlab-runner-helper cache-archiver` (`commands/helpers/cache_archiver.go`
//! `CacheArchiverCommand.Execute`): select the cache paths, build `--file` when a selected
//! file is newer than it (else `Archive is up to date!`), write `metadata.json` beside it,
//! then upload it: with `--url` an HTTP PUT of the presigned URL (`handlePresignedURL`:
//! the `--header` values, `Content-Type: application/octet-stream` unless given,
//! `Last-Modified` from the archive's mtime), with `--gocloud-url azblob://…` a block-blob
//! PUT with the env file's credentials (`handleGoCloudURL`), with neither nothing (`No URL
//! provided…`). A failed upload ends with `FATAL: …` and status 1, and the script then
//! prints `Failed to create cache` (`shells/abstract.go` `addCacheUploadCommand`).
//!
//! Limits: zip only (`CACHE_COMPRESSION_FORMAT` `tarzstd` / `zipzstd` is refused), entries
//! stored not deflated, sequential transfers (no `FF_USE_PARALLEL_CACHE_TRANSFER`), no
//! transfer meter.
//!
//! Owns: the command's flow and messages. Must not know: the wire formats.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::cache_common::{self, Failure, Retry, SHARED_FLAGS, base_name};
use crate::ctx::{Ctx, Exit, go_error};
use crate::flags::{Flag, Kind, Parsed, env_flag, flag};
use crate::http::{Body, Request, clean_url};
use crate::log::Level;
use crate::paths::FileArchiver;

/// `NewCacheArchiverCommand`'s description.
pub const USAGE: &str = "create and upload cache artifacts (internal)";

/// The command's own flags (the shared cache flags are added by [`flags`]).
const OWN_FLAGS: &[Flag] = &[
    flag("alternate-file", Kind::Text),
    flag("check-url", Kind::Text),
    flag("header", Kind::Texts),
    env_flag("metadata", Kind::Text, "CACHE_METADATA"),
    env_flag("compression-level", Kind::Text, "CACHE_COMPRESSION_LEVEL"),
    env_flag("compression-format", Kind::Text, "CACHE_COMPRESSION_FORMAT"),
    env_flag(
        "max-uploaded-archive-size",
        Kind::Integer,
        "CACHE_MAX_UPLOADED_ARCHIVE_SIZE",
    ),
    flag("path", Kind::Texts),
    flag("exclude", Kind::Texts),
    flag("untracked", Kind::Switch),
    flag("verbose", Kind::Switch),
];

/// Every flag of the command.
pub fn flags() -> Vec<Flag> {
    SHARED_FLAGS.iter().chain(OWN_FLAGS).copied().collect()
}

struct Archiver {
    file: String,
    alternate: String,
    url: String,
    check_url: String,
    gocloud_url: String,
    timeout: i64,
    headers: Vec<String>,
    metadata: BTreeMap<String, String>,
    max_size: i64,
    env_file: String,
    retry: Retry,
}

/// Runs the command.
pub fn run(ctx: &mut Ctx, parsed: &Parsed) -> Result<(), Exit> {
    let archiver = setup(ctx, parsed)?;
    let mut selection_flags = FileArchiver::from_flags(parsed);
    selection_flags.expand(ctx);
    archiver.rename_alternate(ctx);
    if let Err(err) = cache_common::check_tuning(parsed) {
        return fatal(ctx, &err);
    }
    let selection = selection_flags.enumerate(ctx);
    if selection.files.is_empty() {
        ctx.log.warn("No files to cache.");
        return Ok(());
    }
    let archive = ctx.resolve(&archiver.file);
    if !selection.changed_since(ctx, &archive) {
        if archiver.alternate != archiver.file {
            return archiver.upload_existing(ctx, &archive);
        }
        ctx.log.info("Archive is up to date!");
        return Ok(());
    }
    let format = parsed.text("compression-format").to_lowercase();
    if format == "tarzstd" || format == "zipzstd" {
        return fatal(
            ctx,
            &format!(
                "compression format {format:?} is not supported by this gitlab-runner-helper stand-in (zip only)"
            ),
        );
    }
    crate::archive_write::check_compression_level(ctx, &parsed.text("compression-level"));
    let files: Vec<String> = selection.files.keys().cloned().collect();
    let size = match create_zip(ctx, &archive, &files) {
        Ok(size) => size,
        Err(err) => return fatal(ctx, &err),
    };
    if let Err(err) = cache_common::write_metadata_file(&archive, &archiver.metadata) {
        return fatal(ctx, &err);
    }
    archiver.upload_if_needed(ctx, &archive, size)
}

fn fatal(ctx: &mut Ctx, message: &str) -> Result<(), Exit> {
    ctx.log.fatal(message);
    Err(Exit::FAILURE)
}

/// `normalizeArgs` and the flag values.
fn setup(ctx: &mut Ctx, parsed: &Parsed) -> Result<Archiver, Exit> {
    let file = parsed.text("file");
    if file.is_empty() {
        ctx.log.fatal("Missing --file");
        return Err(Exit::FAILURE);
    }
    let raw_metadata = parsed.text("metadata");
    let metadata = if raw_metadata.is_empty() {
        BTreeMap::new()
    } else {
        match serde_json::from_str::<BTreeMap<String, String>>(&raw_metadata) {
            Ok(metadata) => metadata,
            Err(err) => {
                ctx.log.fatal(&format!(
                    "invalid value {raw_metadata:?} for flag -metadata: {err}"
                ));
                return Err(Exit::FAILURE);
            }
        }
    };
    Ok(Archiver {
        file,
        alternate: parsed.text("alternate-file"),
        url: parsed.text("url"),
        check_url: parsed.text("check-url"),
        gocloud_url: parsed.text("gocloud-url"),
        timeout: parsed.integer("timeout").unwrap_or(0),
        headers: parsed.texts("header"),
        metadata,
        max_size: parsed.integer("max-uploaded-archive-size").unwrap_or(0),
        env_file: parsed.text("env-file"),
        retry: Retry::from_flags(parsed),
    })
}

/// `createZipFile`: a temporary `archive_*` file beside `--file`, renamed over it.
fn create_zip(ctx: &mut Ctx, archive: &Path, files: &[String]) -> Result<u64, String> {
    let dir = archive
        .parent()
        .map_or_else(|| ctx.wd.clone(), Path::to_path_buf);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| go_error(&e))?;
    let temp = tempfile::Builder::new()
        .prefix("archive_")
        .tempfile_in(&dir)
        .map_err(|e| go_error(&e))?;
    ctx.log
        .debug(&format!("Temporary file: {}", temp.path().display()));
    let writer = BufWriter::new(temp.as_file().try_clone().map_err(|e| go_error(&e))?);
    let mut writer =
        crate::archive_write::write_archive(ctx, crate::archive_write::Format::Zip, files, writer)?;
    writer.flush().map_err(|e| go_error(&e))?;
    drop(writer);
    let size = temp.as_file().metadata().map_err(|e| go_error(&e))?.len();
    temp.persist(archive).map_err(|e| go_error(&e.error))?;
    Ok(size)
}

impl Archiver {
    /// `tryRenameAlternateFile`.
    fn rename_alternate(&self, ctx: &mut Ctx) {
        if self.alternate.is_empty() || self.alternate == self.file {
            return;
        }
        let (file, alternate) = (ctx.resolve(&self.file), ctx.resolve(&self.alternate));
        match fs::metadata(&file) {
            Ok(_) => {
                ctx.log.debug(
                    "Primary cache file already exists locally, skipping rename from alternate",
                );
                return;
            }
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                let fields = [("error", go_error(&err))];
                ctx.log
                    .line(Level::Warn, "Failed to stat primary cache file", &fields);
                return;
            }
            Err(_) => {}
        }
        if fs::metadata(&alternate).is_err() {
            ctx.log
                .debug("Alternate cache file not found locally, nothing to rename");
            return;
        }
        let dir = file
            .parent()
            .map_or_else(|| ctx.wd.clone(), Path::to_path_buf);
        if let Err(err) = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            let fields = [("error", go_error(&err))];
            ctx.log.line(
                Level::Warn,
                "Failed to create directory for cache file rename",
                &fields,
            );
            return;
        }
        if let Err(err) = fs::rename(&alternate, &file) {
            let fields = [("error", go_error(&err))];
            ctx.log.line(
                Level::Warn,
                "Failed to rename alternate cache file to primary",
                &fields,
            );
            return;
        }
        ctx.log.info("Renamed alternate cache file to primary");
    }

    /// `uploadExistingArchiveIfNeeded`.
    fn upload_existing(&self, ctx: &mut Ctx, archive: &Path) -> Result<(), Exit> {
        let Ok(meta) = fs::metadata(archive) else {
            return Ok(());
        };
        if self.primary_remote_exists(ctx) {
            ctx.log
                .info("Primary cache already exists remotely, skipping upload");
            return Ok(());
        }
        ctx.log
            .info("Primary cache does not exist remotely, uploading existing archive");
        self.upload_if_needed(ctx, archive, meta.len())
    }

    /// `primaryRemoteExists`: true only when the object is confirmed present.
    fn primary_remote_exists(&self, ctx: &mut Ctx) -> bool {
        if !self.gocloud_url.is_empty() {
            if cache_common::load_env_file(ctx, &self.env_file).is_err() {
                return false;
            }
            let client = cache_common::cache_client(ctx, self.timeout);
            let Ok(blob) = crate::azure::locate(&self.gocloud_url, &ctx.env) else {
                return false;
            };
            return matches!(crate::azure::head(&client, &blob), Ok(Some(_)));
        }
        if self.check_url.is_empty() {
            return false;
        }
        let client = cache_common::cache_client(ctx, self.timeout);
        let request = url::Url::parse(&self.check_url).map_err(|e| e.to_string());
        match request.and_then(|url| {
            client
                .send(Request::new("HEAD", url))
                .map_err(|e| e.to_string())
        }) {
            Ok(response) => response.status == 200,
            Err(err) => {
                let fields = [("error", err)];
                ctx.log.line(
                    Level::Warn,
                    "Failed to check primary cache existence via HEAD request, assuming absent",
                    &fields,
                );
                false
            }
        }
    }

    /// `uploadArchiveIfNeeded`.
    fn upload_if_needed(&self, ctx: &mut Ctx, archive: &Path, size: u64) -> Result<(), Exit> {
        if self.url.is_empty() && self.gocloud_url.is_empty() {
            ctx.log.info("No URL provided, cache will not be uploaded to shared cache server. Cache will be stored only locally.");
            return Ok(());
        }
        if self.max_size != 0 && size as i64 > self.max_size {
            ctx.log.info(&format!(
                "Cache archive size ({size}) is too big (Limit is set to {}). Cache will be stored only locally.",
                self.max_size
            ));
            return Ok(());
        }
        let archive = archive.to_path_buf();
        match self.retry.run(ctx, |ctx, _| self.upload(ctx, &archive)) {
            Ok(()) => Ok(()),
            Err(failure) => fatal(ctx, &failure.message),
        }
    }

    /// `upload`: one attempt.
    fn upload(&self, ctx: &mut Ctx, archive: &PathBuf) -> Result<(), Failure> {
        let meta = fs::metadata(archive)
            .map_err(|e| Failure::fatal(crate::ctx::path_error("open", &self.file, &e)))?;
        if !self.gocloud_url.is_empty() {
            ctx.log.info("Using GoCloud URL for cache upload");
            return self.upload_gocloud(ctx, archive);
        }
        ctx.log.info("Using presigned URL for cache upload");
        let url = url::Url::parse(&self.url)
            .map_err(|e| Failure::retryable(format!("parse {:?}: {e}", self.url)))?;
        ctx.log.info(&format!(
            "Uploading {} to {}",
            base_name(&self.file),
            clean_url(&url)
        ));
        let mut request = Request::new("PUT", url);
        for (name, value) in split_headers(&self.headers) {
            request = request.header(&name, &value);
        }
        if !request
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("Content-Type"))
        {
            request = request.header("Content-Type", "application/octet-stream");
        }
        let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
        request = request
            .header("Last-Modified", &crate::timefmt::http_date(modified))
            .body(Body::File(archive));
        let client = cache_common::cache_client(ctx, self.timeout);
        let mut response = client
            .send(request)
            .map_err(|e| Failure::retryable(e.to_string()))?;
        cache_common::retry_on_server_error(&mut response)
    }

    /// `handleGoCloudURL` for `azblob://`.
    fn upload_gocloud(&self, ctx: &mut Ctx, archive: &Path) -> Result<(), Failure> {
        let shown = url::Url::parse(&self.gocloud_url)
            .map(|u| clean_url(&u))
            .unwrap_or_default();
        ctx.log
            .info(&format!("Uploading {} to {shown}", base_name(&self.file)));
        cache_common::load_env_file(ctx, &self.env_file).map_err(Failure::fatal)?;
        let blob = crate::azure::locate(&self.gocloud_url, &ctx.env).map_err(Failure::fatal)?;
        let client = cache_common::cache_client(ctx, self.timeout);
        crate::azure::put(&client, &blob, archive, &self.metadata).map_err(Failure::fatal)
    }
}

/// `split`: each `--header` cut at its first `:`; later duplicates win, as in the Go map.
fn split_headers(raw: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in raw {
        let Some((name, value)) = entry.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_string(), value.trim().to_string());
        out.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
        out.push((name, value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_cut_at_the_first_colon() {
        let raw = vec![
            "x-amz-meta-cachekey: a:b".to_string(),
            "nocolon".to_string(),
        ];
        assert_eq!(
            split_headers(&raw),
            vec![("x-amz-meta-cachekey".to_string(), "a:b".to_string())]
        );
    }
}

//! Extracting a downloaded or cached archive into the project directory:
//! `commands/helpers/artifacts_downloader.go` `openArchive` picks the format by magic bytes
//! (zstd → tar.zst, gzip → gzip, otherwise zip), and for zip
//! `helpers/archives/zip_extract.go` `ExtractZipArchive` runs two passes: create every entry
//! (directories with their mode, symlinks re-created, files truncated and rewritten; a
//! per-entry failure is a warning, repeated kinds suppressed), then set modes (`lchmod`,
//! skipped for symlinks) and apply the UID/GID and timestamp extra fields
//! (`zip_extra.go` `processZipExtra`).
//!
//! Stricter than the legacy extractor, like the fastzip one: an entry whose name is absolute
//! or has a `..` element refuses the whole archive before anything is written, and writing
//! through a symbolic link (an entry below a path that is a symlink on disk) is refused;
//! both are fatal ("zip slip").
//!
//! Owns: the file-system side of extraction. Must not know: HTTP or caches.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::ctx::{Ctx, go_error, path_error};
use crate::zip_read::{self, Kind, ZipEntry};

/// `openArchive` + `archive.NewExtractor` + `Extract` for the file at `archive`.
pub fn extract_file(ctx: &mut Ctx, archive: &Path) -> Result<(), String> {
    let mut file =
        File::open(archive).map_err(|e| path_error("open", &archive.to_string_lossy(), &e))?;
    let size = file.metadata().map_err(|e| go_error(&e))?.len();
    let mut magic = [0u8; 4];
    let read = file.read(&mut magic).unwrap_or(0);
    file.seek(SeekFrom::Start(0)).map_err(|e| go_error(&e))?;
    let head = magic.get(..read).unwrap_or(&[]);
    if head.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]) {
        return Err("\"tarzstd\" format: unsupported archive format (this gitlab-runner-helper stand-in extracts zip only)".into());
    }
    if head.starts_with(&[0x1F, 0x8B]) {
        return Err("\"gzip\" format: unsupported archive format".into());
    }
    extract_zip(ctx, file, size)
}

fn extract_zip(ctx: &mut Ctx, file: File, size: u64) -> Result<(), String> {
    let mut archive = zip_read::open(file, size)?;
    let entries = archive.entries.clone();
    for entry in &entries {
        if escapes_root(&entry.name) {
            return Err(format!(
                "{}: refusing to extract a path outside the project directory (zip slip)",
                entry.name
            ));
        }
    }
    let mut seen: BTreeSet<&'static str> = BTreeSet::new();
    let mut git_warned = false;
    for entry in &entries {
        if !git_warned && entry.name.split('/').next() == Some(".git") {
            git_warned = true;
            ctx.log
                .warn("Part of .git directory is on the list of files to extract");
            ctx.log.warn("This may introduce unexpected problems");
        }
        refuse_symlinked_parent(&ctx.wd, &entry.name)?;
        if let Err((op, err)) = extract_entry(ctx, &mut archive, entry) {
            warn_once(ctx, &mut seen, op, &entry.name, &err);
        }
    }
    for entry in &entries {
        if let Err((op, err)) = finish_entry(&ctx.wd, entry) {
            warn_once(ctx, &mut seen, op, &entry.name, &err);
        }
    }
    Ok(())
}

/// `pathErrorTracker.actionable`: each kind of path error is reported once.
fn warn_once(
    ctx: &mut Ctx,
    seen: &mut BTreeSet<&'static str>,
    op: &'static str,
    name: &str,
    err: &str,
) {
    if op.is_empty() || seen.insert(op) {
        ctx.log
            .warn(&format!("{name}: {err} (suppressing repeats)"));
    }
}

fn escapes_root(name: &str) -> bool {
    name.starts_with('/') || name.split('/').any(|part| part == "..")
}

/// Refuses an entry when a directory above it is a symbolic link on disk (writing there
/// would land outside the project directory).
fn refuse_symlinked_parent(wd: &Path, name: &str) -> Result<(), String> {
    let trimmed = name.trim_end_matches('/');
    let mut parts: Vec<&str> = trimmed
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    parts.pop();
    let mut here = wd.to_path_buf();
    for part in parts {
        here.push(part);
        match fs::symlink_metadata(&here) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(format!(
                    "{name}: refusing to extract through the symbolic link {part:?} (zip slip)"
                ));
            }
            Ok(_) => {}
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

type EntryError = (&'static str, String);

fn extract_entry<R: Read + Seek>(
    ctx: &mut Ctx,
    archive: &mut zip_read::ZipArchive<R>,
    entry: &ZipEntry,
) -> Result<(), EntryError> {
    // Without the trailing slash, so a directory entry over a symlink does not resolve it.
    let shown = entry.name.trim_end_matches('/');
    let path = ctx.wd.join(shown);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| ("mkdir", path_error("mkdir", shown, &e)))?;
    }
    let (kind, perm) = entry.mode();
    match kind {
        Kind::Dir => match fs::DirBuilder::new().mode(perm).create(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(("mkdir", path_error("mkdir", shown, &e)))
            }
            _ => Ok(()),
        },
        Kind::Symlink => {
            let mut target = Vec::new();
            archive
                .copy_entry(entry, &mut target)
                .map_err(|e| ("", e))?;
            let _ignored = fs::remove_file(&path);
            let target = String::from_utf8_lossy(&target).into_owned();
            std::os::unix::fs::symlink(&target, &path).map_err(|e| {
                (
                    "symlink",
                    format!("symlink {target} {shown}: {}", go_error(&e)),
                )
            })
        }
        Kind::Regular => {
            let _ignored = fs::remove_file(&path);
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(perm)
                .open(&path)
                .map_err(|e| ("open", path_error("open", shown, &e)))?;
            archive.copy_entry(entry, file).map_err(|e| ("", e))
        }
        Kind::Other => {
            ctx.log.warn(&format!("File ignored: {:?}", entry.name));
            Ok(())
        }
    }
}

/// The second pass: mode, owner and modification time.
fn finish_entry(wd: &Path, entry: &ZipEntry) -> Result<(), EntryError> {
    let shown = entry.name.trim_end_matches('/');
    let path = wd.join(shown);
    let Ok(meta) = fs::symlink_metadata(&path) else {
        return Ok(());
    };
    let (kind, perm) = entry.mode();
    let on_disk_symlink = meta.file_type().is_symlink();
    if !on_disk_symlink && kind != Kind::Symlink {
        fs::set_permissions(&path, fs::Permissions::from_mode(perm))
            .map_err(|e| ("lchmod", path_error("lchmod", shown, &e)))?;
    }
    for (tag, data) in extra_fields(&entry.extra) {
        match tag {
            0x7875 => owner(&path, shown, data)?,
            0x5455 if !on_disk_symlink && matches!(kind, Kind::Dir | Kind::Regular) => {
                modified(&path, shown, data)?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn extra_fields(extra: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(head) = extra.get(at..at + 4) {
        let tag = u16::from_le_bytes([
            head.first().copied().unwrap_or(0),
            head.get(1).copied().unwrap_or(0),
        ]);
        let len = usize::from(u16::from_le_bytes([
            head.get(2).copied().unwrap_or(0),
            head.get(3).copied().unwrap_or(0),
        ]));
        let Some(data) = extra.get(at + 4..at + 4 + len) else {
            break;
        };
        out.push((tag, data));
        at += 4 + len;
    }
    out
}

/// `processZipUIDGidField`: version 1 with 4-byte ids only.
fn owner(path: &Path, shown: &str, data: &[u8]) -> Result<(), EntryError> {
    let word = |at: usize| -> Option<u32> {
        data.get(at..at + 4)?
            .try_into()
            .ok()
            .map(u32::from_le_bytes)
    };
    let valid = data.first() == Some(&1) && data.get(1) == Some(&4) && data.get(6) == Some(&4);
    let (Some(uid), Some(gid), true) = (word(2), word(7), valid) else {
        return Err(("", "uid/gid data not supported".into()));
    };
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
        .map_err(|e| ("lchown", path_error("lchown", shown, &e)))
}

/// `processZipTimestampField`: flag bit 0 carries the modification time.
fn modified(path: &Path, shown: &str, data: &[u8]) -> Result<(), EntryError> {
    let (Some(&flags), Some(raw)) = (data.first(), data.get(1..5)) else {
        return Err(("", "unexpected EOF".into()));
    };
    if flags & 1 == 0 {
        return Ok(());
    }
    let seconds = u32::from_le_bytes(
        raw.try_into()
            .map_err(|_| ("", "unexpected EOF".to_string()))?,
    );
    let time = crate::timefmt::from_unix_seconds(i64::from(seconds));
    let file = File::open(path).map_err(|e| ("chtimes", path_error("chtimes", shown, &e)))?;
    file.set_times(
        fs::FileTimes::new()
            .set_modified(time)
            .set_accessed(std::time::SystemTime::now()),
    )
    .map_err(|e| ("chtimes", path_error("chtimes", shown, &e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive_write::{Format, write_archive, zip_of};
    use crate::testkit::project;
    use std::os::unix::fs::MetadataExt;

    fn extract_bytes(ctx: &mut Ctx, zip: &[u8]) -> Result<(), String> {
        let archive = ctx.wd.parent().expect("temp dir").join("in.zip");
        fs::write(&archive, zip).expect("archive");
        extract_file(ctx, &archive)
    }

    #[test]
    fn a_zip_round_trip_keeps_files_directories_modes_symlinks_and_empty_files() {
        let (_src_dir, mut src, _log) = project(&[]);
        fs::create_dir(src.wd.join("d")).expect("dir");
        fs::write(src.wd.join("d/run.sh"), "#!/bin/sh\necho hi\n").expect("file");
        fs::write(src.wd.join("d/empty"), "").expect("empty file");
        fs::write(src.wd.join("ro.txt"), "read only").expect("file");
        std::os::unix::fs::symlink("run.sh", src.wd.join("d/link")).expect("symlink");
        for (path, mode) in [
            ("d", 0o750),
            ("d/run.sh", 0o755),
            ("d/empty", 0o600),
            ("ro.txt", 0o444),
        ] {
            fs::set_permissions(src.wd.join(path), fs::Permissions::from_mode(mode))
                .expect("chmod");
        }
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
        File::options()
            .write(true)
            .open(src.wd.join("d/empty"))
            .expect("open")
            .set_modified(old)
            .expect("mtime");
        let names: Vec<String> = ["d", "d/empty", "d/link", "d/run.sh", "ro.txt"]
            .map(String::from)
            .to_vec();
        let zip = write_archive(&mut src, Format::Zip, &names, Vec::new()).expect("zip");

        let (_dst_dir, mut dst, log) = project(&[]);
        extract_bytes(&mut dst, &zip).expect("extracted");
        let mode = |p: &str| fs::symlink_metadata(dst.wd.join(p)).expect(p).mode() & 0o7777;
        assert_eq!(
            fs::read_to_string(dst.wd.join("d/run.sh")).expect("file"),
            "#!/bin/sh\necho hi\n"
        );
        assert_eq!(fs::read(dst.wd.join("d/empty")).expect("empty").len(), 0);
        assert_eq!(
            (mode("d"), mode("d/run.sh"), mode("d/empty"), mode("ro.txt")),
            (0o750, 0o755, 0o600, 0o444)
        );
        assert_eq!(
            fs::read_link(dst.wd.join("d/link"))
                .expect("symlink")
                .to_string_lossy(),
            "run.sh"
        );
        let mtime = fs::metadata(dst.wd.join("d/empty"))
            .expect("meta")
            .modified()
            .expect("mtime");
        assert_eq!(mtime, old);
        assert_eq!(log.text(), "");
    }

    #[test]
    fn an_entry_leaving_the_directory_refuses_the_whole_archive() {
        for evil in ["../escaped.txt", "/tmp/absolute.txt", "a/../../escaped.txt"] {
            let (dir, mut ctx, _log) = project(&[]);
            let zip = zip_of(&[("fine.txt", 0o100_644, b"ok"), (evil, 0o100_644, b"evil")]);
            let err = extract_bytes(&mut ctx, &zip).expect_err(evil);
            assert!(err.contains("zip slip"), "{err}");
            assert!(
                !ctx.wd.join("fine.txt").exists(),
                "nothing is written before the check"
            );
            assert!(!dir.path().join("escaped.txt").exists());
        }
    }

    #[test]
    fn writing_through_an_extracted_symlink_is_refused() {
        let (dir, mut ctx, _log) = project(&[]);
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).expect("outside dir");
        let target = outside.to_string_lossy().into_owned();
        let zip = zip_of(&[
            ("link", 0o120_777, target.as_bytes()),
            ("link/planted.txt", 0o100_644, b"x"),
        ]);
        let err = extract_bytes(&mut ctx, &zip).expect_err("through a symlink");
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!outside.join("planted.txt").exists());
    }

    #[test]
    fn deflated_entries_written_by_git_archive_extract() {
        let (_dir, mut ctx, _log) = project(&[]);
        let repo = ctx.wd.parent().expect("temp").join("repo");
        fs::create_dir(&repo).expect("repo dir");
        let text = "line of text that repeats\n".repeat(500);
        fs::write(repo.join("big.txt"), &text).expect("file");
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .current_dir(&repo)
                .output()
                .expect("git runs");
            assert!(
                out.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        git(&["init", "-q"]);
        git(&["add", "big.txt"]);
        git(&["commit", "-q", "-m", "one"]);
        let zip = git(&["archive", "--format=zip", "HEAD"]);
        assert!(zip.len() < text.len() / 4, "git deflated the entry");
        extract_bytes(&mut ctx, &zip).expect("extracted");
        assert_eq!(
            fs::read_to_string(ctx.wd.join("big.txt")).expect("file"),
            text
        );
    }

    #[test]
    fn a_gzip_download_is_refused_like_the_runner_does() {
        let (_dir, mut ctx, _log) = project(&[]);
        let err = extract_bytes(&mut ctx, &[0x1f, 0x8b, 8, 0]).expect_err("gzip");
        assert_eq!(err, "\"gzip\" format: unsupported archive format");
    }
}

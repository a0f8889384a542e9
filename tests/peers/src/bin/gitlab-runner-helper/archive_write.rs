//! Writing archives of the selected files, in the formats the runner's helper writes for
//! caches and artifacts that this stand-in supports:
//! - zip (`helpers/archives/zip_create.go` `CreateZipArchive`): one entry per path in
//!   sorted order; directories as `name/`; symlinks as entries holding the link target;
//!   regular files with their Unix mode in the external attributes, the UID/GID (`0x7875`)
//!   and modification-time (`0x5455`) extra fields (`zip_extra.go`), the UTF-8 flag; pipes,
//!   sockets and devices skipped with `File ignored: …`. Entries are *stored*, not deflated
//!   (the real helper deflates; any zip reader takes both). ZIP64 is not written: an entry or
//!   archive of 4 GiB or more, or more than 65535 entries, is refused.
//! - gzip (`helpers/archives/gzip_create.go` `CreateGzipArchive`, for `artifacts:reports`):
//!   one gzip member per regular file, name and comment sanitised as `sanitizePath` does,
//!   deflate *stored* blocks.
//! - raw (`commands/helpers/archive/raw/raw_archiver.go`): the single file's bytes.
//!
//! Owns: those layouts. Must not know: HTTP or where the archive goes.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::checksum::{Crc32, CrcWriter};
use crate::ctx::{Ctx, path_error};
use crate::timefmt;

/// The archive formats this stand-in writes (`spec.ArtifactFormat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Zip,
    Gzip,
    Raw,
}

impl Format {
    /// `spec.ArtifactFormat` names; the empty (default) format is zip. zstd formats are
    /// refused by name so the caller can say so.
    pub fn parse(name: &str) -> Result<Format, String> {
        match name {
            "" | "zip" => Ok(Format::Zip),
            "gzip" => Ok(Format::Gzip),
            "raw" => Ok(Format::Raw),
            other => Err(format!(
                "{other:?} format: unsupported archive format (this gitlab-runner-helper stand-in writes zip, gzip and raw)"
            )),
        }
    }
}

/// `GetCompressionLevel` (`commands/helpers/archiver.go`): entries are stored whatever the
/// level, but an unknown name is warned about as the runner warns.
pub fn check_compression_level(ctx: &mut Ctx, name: &str) {
    if !matches!(
        name,
        "" | "fastest" | "fast" | "default" | "slow" | "slowest"
    ) {
        ctx.log.warn(&format!(
            "compression level {name:?} is invalid, falling back to default"
        ));
    }
}

/// Writes `files` (relative to the project directory, sorted) to `out` in `format`.
pub fn write_archive<W: Write>(
    ctx: &mut Ctx,
    format: Format,
    files: &[String],
    out: W,
) -> Result<W, String> {
    match format {
        Format::Zip => write_zip(ctx, files, out),
        Format::Gzip => write_gzip(ctx, files, out),
        Format::Raw => write_raw(ctx, files, out),
    }
}

const ZIP_LIMIT: u64 = 0xFFFF_FFFF;
const ZIP64_REFUSAL: &str = "needs ZIP64 (4 GiB or more, or over 65535 entries), which this gitlab-runner-helper stand-in does not write";

struct Counting<W> {
    inner: W,
    offset: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.offset += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// One entry's header fields.
struct Entry {
    name: String,
    crc: u32,
    size: u64,
    external: u32,
    dos: (u16, u16),
    extra: Vec<u8>,
    offset: u64,
}

fn write_zip<W: Write>(ctx: &mut Ctx, files: &[String], out: W) -> Result<W, String> {
    let mut out = Counting {
        inner: out,
        offset: 0,
    };
    let mut entries: Vec<Entry> = Vec::new();
    let mut git_warned = false;
    for name in files {
        if !git_warned && is_git_path(name) {
            git_warned = true;
            ctx.log
                .warn("Part of .git directory is on the list of files to archive");
            ctx.log.warn("This may introduce unexpected problems");
        }
        let path = ctx.wd.join(name);
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(err) => {
                ctx.log.warn(&format!(
                    "File ignored: {}",
                    path_error("lstat", name, &err)
                ));
                continue;
            }
        };
        let file_type = meta.file_type();
        let mut entry = Entry {
            name: name.clone(),
            crc: 0,
            size: 0,
            external: external_attributes(&meta),
            dos: timefmt::dos_date_time(meta.modified().unwrap_or(std::time::UNIX_EPOCH)),
            extra: extra_fields(&meta),
            offset: out.offset,
        };
        if file_type.is_dir() {
            entry.name.push('/');
            write_local(&mut out, &entry)?;
        } else if file_type.is_symlink() {
            let target = fs::read_link(&path).map_err(|e| path_error("readlink", name, &e))?;
            let bytes = target.as_os_str().as_encoded_bytes().to_vec();
            let mut crc = Crc32::default();
            crc.update(&bytes);
            (entry.crc, entry.size) = (crc.value(), bytes.len() as u64);
            write_local(&mut out, &entry)?;
            out.write_all(&bytes).map_err(|e| format!("write: {e}"))?;
        } else if file_type.is_file() {
            write_file_entry(&mut out, &mut entry, &path, name)?;
        } else {
            ctx.log.warn(&format!("File ignored: {name}"));
            continue;
        }
        if out.offset > ZIP_LIMIT {
            return Err(format!("{name}: the archive {ZIP64_REFUSAL}"));
        }
        entries.push(entry);
    }
    finish_zip(out, &entries)
}

/// A regular file: its checksum first (stored entries carry sizes in the local header),
/// then its bytes.
fn write_file_entry<W: Write>(
    out: &mut Counting<W>,
    entry: &mut Entry,
    path: &Path,
    name: &str,
) -> Result<(), String> {
    let mut file = File::open(path).map_err(|e| path_error("open", name, &e))?;
    let mut sum = CrcWriter::new(io::sink());
    io::copy(&mut file, &mut sum).map_err(|e| path_error("read", name, &e))?;
    if sum.written >= ZIP_LIMIT {
        return Err(format!("{name}: {ZIP64_REFUSAL}"));
    }
    (entry.crc, entry.size) = (sum.crc.value(), sum.written);
    write_local(out, entry)?;
    let mut file = File::open(path).map_err(|e| path_error("open", name, &e))?;
    let mut copy = CrcWriter::new(&mut *out);
    io::copy(&mut (&mut file).take(entry.size), &mut copy)
        .map_err(|e| path_error("read", name, &e))?;
    if copy.written != entry.size || copy.crc.value() != entry.crc {
        return Err(format!("{name}: file changed while it was being archived"));
    }
    Ok(())
}

fn is_git_path(name: &str) -> bool {
    crate::lexical::clean(name).split('/').next() == Some(".git")
}

/// Go's `FileHeader.SetMode`: the Unix mode in the high 16 bits, MS-DOS directory and
/// read-only bits in the low ones.
fn external_attributes(meta: &fs::Metadata) -> u32 {
    let mode = meta.mode() & 0xFFFF;
    let mut external = mode << 16;
    if meta.is_dir() {
        external |= 0x10;
    }
    if mode & 0o200 == 0 {
        external |= 0x01;
    }
    external
}

/// `createZipExtra`: UID/GID (`0x7875`, version 1, 4-byte ids) then the extended timestamp
/// (`0x5455`, flags 1, modification time).
fn extra_fields(meta: &fs::Metadata) -> Vec<u8> {
    let mut extra = Vec::with_capacity(24);
    extra.extend_from_slice(&0x7875u16.to_le_bytes());
    extra.extend_from_slice(&11u16.to_le_bytes());
    extra.push(1);
    extra.push(4);
    extra.extend_from_slice(&meta.uid().to_le_bytes());
    extra.push(4);
    extra.extend_from_slice(&meta.gid().to_le_bytes());
    extra.extend_from_slice(&0x5455u16.to_le_bytes());
    extra.extend_from_slice(&5u16.to_le_bytes());
    extra.push(1);
    extra.extend_from_slice(&(meta.mtime() as u32).to_le_bytes());
    extra
}

const FLAG_UTF8: u16 = 0x800;
const VERSION_20: u16 = 20;
const CREATOR_UNIX: u16 = 3 << 8;

fn write_local<W: Write>(out: &mut W, entry: &Entry) -> Result<(), String> {
    let mut header = Vec::with_capacity(30 + entry.name.len() + entry.extra.len());
    header.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
    header.extend_from_slice(&VERSION_20.to_le_bytes());
    header.extend_from_slice(&FLAG_UTF8.to_le_bytes());
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&entry.dos.1.to_le_bytes());
    header.extend_from_slice(&entry.dos.0.to_le_bytes());
    header.extend_from_slice(&entry.crc.to_le_bytes());
    header.extend_from_slice(&(entry.size as u32).to_le_bytes());
    header.extend_from_slice(&(entry.size as u32).to_le_bytes());
    header.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
    header.extend_from_slice(&(entry.extra.len() as u16).to_le_bytes());
    header.extend_from_slice(entry.name.as_bytes());
    header.extend_from_slice(&entry.extra);
    out.write_all(&header).map_err(|e| format!("write: {e}"))
}

fn finish_zip<W: Write>(mut out: Counting<W>, entries: &[Entry]) -> Result<W, String> {
    if entries.len() > 0xFFFF {
        return Err(format!("the archive {ZIP64_REFUSAL}"));
    }
    let start = out.offset;
    let mut central = Vec::new();
    for entry in entries {
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&(CREATOR_UNIX | VERSION_20).to_le_bytes());
        central.extend_from_slice(&VERSION_20.to_le_bytes());
        central.extend_from_slice(&FLAG_UTF8.to_le_bytes());
        central.extend_from_slice(&0u16.to_le_bytes());
        central.extend_from_slice(&entry.dos.1.to_le_bytes());
        central.extend_from_slice(&entry.dos.0.to_le_bytes());
        central.extend_from_slice(&entry.crc.to_le_bytes());
        central.extend_from_slice(&(entry.size as u32).to_le_bytes());
        central.extend_from_slice(&(entry.size as u32).to_le_bytes());
        central.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
        central.extend_from_slice(&(entry.extra.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        central.extend_from_slice(&entry.external.to_le_bytes());
        central.extend_from_slice(&(entry.offset as u32).to_le_bytes());
        central.extend_from_slice(entry.name.as_bytes());
        central.extend_from_slice(&entry.extra);
    }
    if start + central.len() as u64 > ZIP_LIMIT {
        return Err(format!("the archive {ZIP64_REFUSAL}"));
    }
    let count = entries.len() as u16;
    let size = central.len() as u32;
    central.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    central.extend_from_slice(&[0, 0, 0, 0]);
    central.extend_from_slice(&count.to_le_bytes());
    central.extend_from_slice(&count.to_le_bytes());
    central.extend_from_slice(&size.to_le_bytes());
    central.extend_from_slice(&(start as u32).to_le_bytes());
    central.extend_from_slice(&0u16.to_le_bytes());
    out.write_all(&central).map_err(|e| format!("write: {e}"))?;
    out.flush().map_err(|e| format!("write: {e}"))?;
    Ok(out.inner)
}

/// `sanitizePath`: names with non-ASCII characters or `%` are written as `e:` plus their
/// `url.PathEscape` form.
fn sanitize_gzip_name(name: &str) -> String {
    if !name.chars().any(|c| !c.is_ascii() || c == '%') {
        return name.to_string();
    }
    let mut out = String::from("e:");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~$&+,:;=@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn write_gzip<W: Write>(ctx: &mut Ctx, files: &[String], mut out: W) -> Result<W, String> {
    for name in files {
        let path = ctx.wd.join(name);
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                ctx.log.warn(&format!(
                    "File ignored: {}",
                    path_error("lstat", name, &err)
                ));
                continue;
            }
            Err(err) => return Err(path_error("lstat", name, &err)),
        };
        if !meta.is_file() {
            return Err(format!("the {name:?} is not a regular file"));
        }
        let base = name.rsplit('/').next().unwrap_or(name);
        let mut header = vec![0x1f, 0x8b, 8, 0x08 | 0x10];
        header.extend_from_slice(&(meta.mtime() as u32).to_le_bytes());
        header.extend_from_slice(&[0, 255]);
        for text in [sanitize_gzip_name(base), sanitize_gzip_name(name)] {
            header.extend_from_slice(text.as_bytes());
            header.push(0);
        }
        out.write_all(&header).map_err(|e| format!("write: {e}"))?;
        let file = File::open(&path).map_err(|e| path_error("open", name, &e))?;
        let (crc, size) = stored_deflate(file, &mut out).map_err(|e| format!("{name}: {e}"))?;
        out.write_all(&crc.to_le_bytes())
            .map_err(|e| format!("write: {e}"))?;
        out.write_all(&(size as u32).to_le_bytes())
            .map_err(|e| format!("write: {e}"))?;
    }
    Ok(out)
}

/// `input` as DEFLATE stored blocks (at most 65535 bytes each, the last one marked final);
/// the CRC-32 and length of the input.
fn stored_deflate<R: Read, W: Write>(mut input: R, out: &mut W) -> io::Result<(u32, u64)> {
    let mut crc = Crc32::default();
    let mut total = 0u64;
    let mut current = read_block(&mut input)?;
    loop {
        let next = if current.is_empty() {
            Vec::new()
        } else {
            read_block(&mut input)?
        };
        let last = next.is_empty();
        let len = current.len() as u16;
        out.write_all(&[u8::from(last)])?;
        out.write_all(&len.to_le_bytes())?;
        out.write_all(&(!len).to_le_bytes())?;
        out.write_all(&current)?;
        crc.update(&current);
        total += current.len() as u64;
        if last {
            return Ok((crc.value(), total));
        }
        current = next;
    }
}

fn read_block<R: Read>(input: &mut R) -> io::Result<Vec<u8>> {
    let mut block = Vec::with_capacity(0xFFFF);
    input.take(0xFFFF).read_to_end(&mut block)?;
    Ok(block)
}

fn write_raw<W: Write>(ctx: &mut Ctx, files: &[String], mut out: W) -> Result<W, String> {
    if files.len() > 1 {
        return Err("only one file can be sent as raw".into());
    }
    if let Some(name) = files.first() {
        let mut file = File::open(ctx.wd.join(name)).map_err(|e| path_error("open", name, &e))?;
        io::copy(&mut file, &mut out).map_err(|e| path_error("read", name, &e))?;
    }
    Ok(out)
}

/// A zip of hand-made entries `(name, unix mode with type bits, data)`, for tests of what
/// the extractor must refuse.
#[cfg(test)]
pub fn zip_of(entries: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut out = Counting {
        inner: Vec::new(),
        offset: 0,
    };
    let mut written = Vec::new();
    for (name, mode, data) in entries {
        let mut crc = Crc32::default();
        crc.update(data);
        let entry = Entry {
            name: (*name).to_string(),
            crc: crc.value(),
            size: data.len() as u64,
            external: mode << 16,
            dos: (33, 0),
            extra: Vec::new(),
            offset: out.offset,
        };
        write_local(&mut out, &entry).expect("local header");
        out.write_all(data).expect("data");
        written.push(entry);
    }
    finish_zip(out, &written).expect("central directory")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::Env;
    use crate::log::Log;

    #[test]
    fn a_gzip_member_holds_the_file_in_stored_blocks() {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::write(dir.path().join("report.xml"), "<testsuite/>").expect("file");
        let (log, _captured) = Log::capture();
        let mut ctx = Ctx {
            wd: dir.path().to_path_buf(),
            env: Env::default(),
            log,
        };
        let gz = write_archive(&mut ctx, Format::Gzip, &["report.xml".into()], Vec::new())
            .expect("gzip");
        assert_eq!(&gz[..4], &[0x1f, 0x8b, 8, 0x18]);
        let name_end = 10 + gz[10..].iter().position(|b| *b == 0).expect("name");
        assert_eq!(&gz[10..name_end], b"report.xml");
        let comment_end = name_end
            + 1
            + gz[name_end + 1..]
                .iter()
                .position(|b| *b == 0)
                .expect("comment");
        let mut inflated = Vec::new();
        crate::inflate::inflate(&gz[comment_end + 1..gz.len() - 8], &mut inflated)
            .expect("deflate");
        assert_eq!(inflated, b"<testsuite/>");
    }

    #[test]
    fn raw_refuses_more_than_one_file() {
        let (log, _captured) = Log::capture();
        let mut ctx = Ctx {
            wd: std::env::temp_dir(),
            env: Env::default(),
            log,
        };
        let err = write_archive(&mut ctx, Format::Raw, &["a".into(), "b".into()], Vec::new())
            .expect_err("two files");
        assert_eq!(err, "only one file can be sent as raw");
    }

    #[test]
    fn gzip_names_with_non_ascii_are_escaped() {
        assert_eq!(sanitize_gzip_name("plain.txt"), "plain.txt");
        assert_eq!(sanitize_gzip_name("é 100%"), "e:%C3%A9%20100%25");
    }
}

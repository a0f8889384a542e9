//! Private files: directories only the owner can enter (0700 on Unix) and writes that are
//! atomic and durable (temporary file in the same directory, fsync, rename). Every cache and
//! key store of the host writes through here.

use std::io::Write;
use std::path::Path;

/// Creates `dir` and its parents; on Unix the created directories are mode 0700.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Writes `bytes` to `path` atomically: a temporary file in `temp_dir` (which must be on the
/// same filesystem), fsynced, then renamed over `path`. The temporary file is created 0600 on
/// Unix, so a reader sees the old contents or the new, never a part, and never a wider mode.
pub fn write_atomic_in(temp_dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(temp_dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// [`write_atomic_in`] with the temporary file beside `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    write_atomic_in(dir, path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_whole_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f");
        write_atomic(&path, b"first, and longer").expect("first write");
        write_atomic(&path, b"second").expect("second write");
        assert_eq!(std::fs::read(&path).expect("read back"), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            names.len(),
            1,
            "no temporary file is left behind: {names:?}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn private_directories_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let inner = dir.path().join("a/b");
        create_private_dir(&inner).expect("create");
        let mode = std::fs::metadata(&inner)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}

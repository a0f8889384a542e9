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

/// Creates `dir` (and its parents) and makes it owner-only (0700 on Unix) even when it
/// existed before with a wider mode or the umask would have left it wider: a state directory
/// holds keys and the lease journal.
pub fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    create_private_dir(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// Why `dir` cannot be trusted with files this process will later execute or map (compiled
/// plugins): it must be a real directory (not a symbolic link), belong to this process's
/// user, and be writable by nobody else. `None` when it can. The owner is compared with that
/// of a probe file created in it, which is this process's effective user on every Unix.
pub fn untrusted_dir(dir: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = match std::fs::symlink_metadata(dir) {
            Ok(m) => m,
            Err(e) => return Some(format!("cannot read it: {e}")),
        };
        if m.file_type().is_symlink() {
            return Some("it is a symbolic link".into());
        }
        if !m.is_dir() {
            return Some("it is not a directory".into());
        }
        let mode = m.permissions().mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Some(format!(
                "the group or others may write in it (mode {mode:o})"
            ));
        }
        let probe = match tempfile::NamedTempFile::new_in(dir) {
            Ok(p) => p,
            Err(e) => return Some(format!("cannot write in it: {e}")),
        };
        let me = probe.as_file().metadata().map(|p| p.uid()).ok();
        if me != Some(m.uid()) {
            return Some(format!(
                "it belongs to uid {}, not to this process's user",
                m.uid()
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    None
}

/// Whether `file` (in a directory [`untrusted_dir`] accepted) can be trusted as this process
/// wrote it: a regular file, not a link, owned like its directory, writable by its owner only.
pub fn trusted_file(file: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (Ok(m), Some(Ok(parent))) = (
            std::fs::symlink_metadata(file),
            file.parent().map(std::fs::metadata),
        ) else {
            return false;
        };
        m.file_type().is_file() && m.uid() == parent.uid() && m.permissions().mode() & 0o022 == 0
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        true
    }
}

/// Creates `path` if it is missing and makes it owner-only (0600 on Unix) whatever the umask,
/// before a library opens it with its own (wider) default mode.
pub fn ensure_private_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    drop(options.open(path)?);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// Why a file holding a secret is refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file's mode could not be read.
    #[error("{}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Users other than its owner and group can read or write it.
    #[error(
        "{} is readable or writable by other users (mode {mode:o}); it holds a secret: chmod o-rwx {} (0600, or 0640 for a group that needs it)",
        path.display(),
        path.display()
    )]
    OpenToOthers {
        /// The file.
        path: std::path::PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Refuses a file holding a secret that users other than its owner and group can read or
/// write; the error names the file and the fix. (Group access is allowed, so a token can be
/// shared with the runner's group.) Always `Ok` off Unix.
pub fn check_secret_file_mode(path: &Path) -> Result<(), SecretFileError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|source| SecretFileError::Unreadable {
                path: path.to_path_buf(),
                source,
            })?
            .permissions()
            .mode();
        if mode & 0o007 != 0 {
            return Err(SecretFileError::OpenToOthers {
                path: path.to_path_buf(),
                mode: mode & 0o777,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
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
    fn a_state_directory_and_file_are_made_private_whatever_they_were() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).expect("mkdir");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_private_dir(&state).expect("private dir");
        let file = state.join("leases.redb");
        std::fs::write(&file, b"x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        ensure_private_file(&file).expect("private file");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!((mode(&state), mode(&file)), (0o700, 0o600));
        assert_eq!(std::fs::read(&file).expect("read"), b"x", "contents kept");
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_file_others_can_read_is_refused_and_a_group_readable_one_is_not() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("token");
        std::fs::write(&file, b"t").expect("write");
        for (mode, ok) in [(0o600, true), (0o640, true), (0o644, false), (0o602, false)] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let checked = check_secret_file_mode(&file);
            assert_eq!(checked.is_ok(), ok, "mode {mode:o}: {checked:?}");
            if let Err(why) = checked {
                assert!(
                    matches!(&why, SecretFileError::OpenToOthers { mode: m, .. } if *m == mode),
                    "{why:?}"
                );
                let words = why.to_string();
                assert!(
                    words.contains("chmod o-rwx") && words.contains("token"),
                    "{words}"
                );
            }
        }
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

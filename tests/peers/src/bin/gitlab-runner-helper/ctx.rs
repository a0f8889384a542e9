//! What every subcommand runs with: the project directory (the process's working directory
//! in the real helper, passed explicitly here so tests can run commands side by side), a
//! snapshot of the environment (the env file of a cache command is merged into it instead of
//! `os.Setenv`, as `commands/helpers/cache_env.go` `loadEnvFile` does), and the log.
//!
//! Owns: `Ctx`, `Env`, the `Exit` status a command ends with, and Go-like I/O error text.
//! Must not know: any subcommand.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use crate::log::Log;

/// The exit status a command ends with. `logrus.Fatal*` and `logrus.Exit(1)` in the runner
/// both end the process with status 1, so every failure here is `Exit(1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit(pub i32);

impl Exit {
    /// `logrus.Fatalln` / `logrus.Exit(1)`.
    pub const FAILURE: Exit = Exit(1);
}

/// The environment the helper sees: the process environment at start, plus any env file a
/// cache command loads (later keys win, as `os.Setenv` would).
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: BTreeMap<String, String>,
}

impl Env {
    /// The process environment (non-UTF-8 entries are skipped: no flag or variable the
    /// helper reads can hold them).
    pub fn from_process() -> Env {
        Env {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        }
    }

    /// An environment holding exactly `pairs` (tests).
    #[cfg(test)]
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Env {
        Env {
            vars: pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        }
    }

    /// The value of `key`, if set (an empty value counts as set).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }

    /// Sets `key`, as `os.Setenv` does for the env file.
    pub fn set(&mut self, key: &str, value: &str) {
        self.vars.insert(key.to_string(), value.to_string());
    }

    /// Every pair, for child processes (`git ls-files` gets `os.Environ()` in the runner).
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// One command's surroundings.
pub struct Ctx {
    /// The project directory: where paths are resolved and archives are extracted.
    pub wd: PathBuf,
    /// See [`Env`].
    pub env: Env,
    /// Where the runner-formatted lines go (stderr in the binary).
    pub log: Log,
}

impl Ctx {
    /// A path given on the command line, resolved against the project directory as the
    /// runner's relative paths are resolved against its working directory.
    pub fn resolve(&self, path: &str) -> PathBuf {
        self.wd.join(path)
    }
}

/// Go's text for the common `syscall.Errno` values, so messages read like the runner's
/// (`lstat x: no such file or directory` rather than Rust's `No such file or directory (os
/// error 2)`).
pub fn go_error(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(2) => "no such file or directory".into(),
        Some(13) => "permission denied".into(),
        Some(1) => "operation not permitted".into(),
        Some(17) => "file exists".into(),
        Some(20) => "not a directory".into(),
        Some(21) => "is a directory".into(),
        Some(28) => "no space left on device".into(),
        Some(39) => "directory not empty".into(),
        Some(40) => "too many levels of symbolic links".into(),
        Some(111) => "connection refused".into(),
        _ => {
            let text = err.to_string();
            match text.find(" (os error") {
                Some(at) => text.get(..at).unwrap_or(&text).to_lowercase(),
                None => text,
            }
        }
    }
}

/// `op path: error`, Go's `*os.PathError` text.
pub fn path_error(op: &str, path: &str, err: &io::Error) -> String {
    format!("{op} {path}: {}", go_error(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_reads_like_gos_path_error() {
        let err = io::Error::from_raw_os_error(2);
        assert_eq!(
            path_error("lstat", "x", &err),
            "lstat x: no such file or directory"
        );
    }

    #[test]
    fn the_env_file_overrides_the_process_environment() {
        let mut env = Env::from_pairs(&[("A", "1")]);
        env.set("A", "2");
        assert_eq!(env.get("A"), Some("2"));
    }
}

//! A working tree a test builds with Debian's git (commits, branches, tags, submodules) before
//! [`super::GitLab::publish`] makes it a served repository. Commits are made with a fixed
//! identity and no user or system config, so they do not depend on the machine.
//!
//! Owns: the `git` CLI runs of test setup. Must not know: the server.

use std::path::Path;
use std::process::Command;

use super::GIT;

/// Runs Debian's git in `dir` with no user or system config; panics with its output when it
/// fails. Returns its standard output.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(GIT)
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Flotilla Test")
        .env("GIT_AUTHOR_EMAIL", "test@flotilla.invalid")
        .env("GIT_COMMITTER_NAME", "Flotilla Test")
        .env("GIT_COMMITTER_EMAIL", "test@flotilla.invalid")
        .output()
        .unwrap_or_else(|e| panic!("{GIT}: {e}"));
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A non-bare repository in a temporary directory, on branch `main`.
pub struct WorkTree {
    dir: tempfile::TempDir,
}

impl Default for WorkTree {
    fn default() -> WorkTree {
        WorkTree::new()
    }
}

impl WorkTree {
    pub fn new() -> WorkTree {
        let dir = tempfile::tempdir().expect("a work tree dir");
        git(dir.path(), &["init", "--quiet", "--initial-branch", "main"]);
        WorkTree { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `contents` to `file` (directories made as needed).
    pub fn write(&self, file: &str, contents: &[u8]) {
        let path = self.path().join(file);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
        std::fs::write(&path, contents).expect("a file");
    }

    /// Commits everything and returns the new commit's sha.
    pub fn commit(&self, message: &str) -> String {
        git(self.path(), &["add", "--all"]);
        git(
            self.path(),
            &["commit", "--quiet", "--allow-empty", "--message", message],
        );
        self.head()
    }

    pub fn head(&self) -> String {
        git(self.path(), &["rev-parse", "HEAD"]).trim().to_string()
    }

    /// Creates branch `name` at HEAD and switches to it.
    pub fn branch(&self, name: &str) {
        git(self.path(), &["checkout", "--quiet", "-b", name]);
    }

    pub fn checkout(&self, name: &str) {
        git(self.path(), &["checkout", "--quiet", name]);
    }

    pub fn tag(&self, name: &str) {
        git(self.path(), &["tag", name]);
    }

    /// Records a submodule at `path` with `url` (e.g. the relative `../lib.git`) pinned at
    /// `sha`, without cloning it: `.gitmodules` and a gitlink in the index, as
    /// `git submodule add` would leave them (with the empty directory of a submodule not
    /// checked out, so a later `commit` keeps the gitlink).
    pub fn submodule(&self, path: &str, url: &str, sha: &str) {
        std::fs::create_dir_all(self.path().join(path)).expect("the submodule's dir");
        let name = format!("submodule.{path}");
        git(
            self.path(),
            &["config", "-f", ".gitmodules", &format!("{name}.path"), path],
        );
        git(
            self.path(),
            &["config", "-f", ".gitmodules", &format!("{name}.url"), url],
        );
        git(self.path(), &["add", ".gitmodules"]);
        let entry = format!("160000,{sha},{path}");
        git(
            self.path(),
            &["update-index", "--add", "--cacheinfo", &entry],
        );
    }
}

//! Which files go into an archive: `commands/helpers/file_archiver.go` `fileArchiver`.
//! `--path` entries are resolved against the project directory (`findRelativePathInProject`:
//! a path whose non-glob part leaves the directory is refused with `processPath: artifact
//! path is not a subpath of project directory: …` and skipped, not fatal), globbed with
//! doublestar (`processPath`), and every match is walked without following symlinks
//! (`filepath.Walk`), each visited path being kept unless an `--exclude` pattern matches it
//! (`process`, `isExcluded`). `--untracked` adds `git ls-files -o -z`, which lists ignored
//! files too (no `--exclude-standard`: `processUntracked`).
//!
//! Owns: the selection and its messages. Must not know: archive formats.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

use crate::ctx::{Ctx, path_error};
use crate::flags::Parsed;
use crate::glob;
use crate::lexical;

/// The `fileArchiver` flags.
#[derive(Debug, Clone, Default)]
pub struct FileArchiver {
    pub paths: Vec<String>,
    pub exclude: Vec<String>,
    pub untracked: bool,
}

/// The selected paths, relative to the project directory and `/`-separated, sorted as
/// `sort.Strings` sorts them (bytewise), with their modification times.
#[derive(Debug, Default)]
pub struct Selection {
    pub files: BTreeMap<String, Option<SystemTime>>,
}

impl Selection {
    /// `fileArchiver.isFileChanged`: true unless `archive` exists and no selected file is
    /// newer than it.
    pub fn changed_since(&self, ctx: &mut Ctx, archive: &Path) -> bool {
        match fs::metadata(archive) {
            Ok(meta) => {
                let Ok(archived) = meta.modified() else {
                    return true;
                };
                self.files.values().any(|m| m.is_some_and(|m| m > archived))
            }
            Err(err) => {
                if err.kind() != std::io::ErrorKind::NotFound {
                    let shown = archive.to_string_lossy();
                    ctx.log.warn(&path_error("stat", &shown, &err));
                }
                true
            }
        }
    }
}

impl FileArchiver {
    /// The flags as parsed.
    pub fn from_flags(parsed: &Parsed) -> FileArchiver {
        FileArchiver {
            paths: parsed.texts("path"),
            exclude: parsed.texts("exclude"),
            untracked: parsed.switch("untracked").unwrap_or(false),
        }
    }

    /// `normalizeArgs`: `shell.Expand` on every path and exclude; a failure warns and keeps
    /// the text as given.
    pub fn expand(&mut self, ctx: &mut Ctx) {
        for list in [&mut self.paths, &mut self.exclude] {
            for path in list.iter_mut() {
                match crate::expand::shell_expand(path, &ctx.env) {
                    Ok(expanded) => *path = expanded,
                    Err(err) => ctx.log.warn(&format!("invalid path {path:?}: {err}")),
                }
            }
        }
    }

    /// `enumerate`: paths, then untracked files, then one line per exclude rule that hit.
    pub fn enumerate(&self, ctx: &mut Ctx) -> Selection {
        let mut walk = Walk {
            archiver: self,
            selection: Selection::default(),
            excluded: BTreeMap::new(),
        };
        for path in &self.paths {
            walk.process_path(ctx, path);
        }
        if self.untracked {
            walk.process_untracked(ctx);
        }
        for (rule, count) in &walk.excluded {
            ctx.log.info(&format!("{rule}: excluded {count} files"));
        }
        walk.selection
    }
}

struct Walk<'a> {
    archiver: &'a FileArchiver,
    selection: Selection,
    excluded: BTreeMap<String, u64>,
}

impl Walk<'_> {
    fn process_path(&mut self, ctx: &mut Ctx, path: &str) {
        if path.is_empty() {
            ctx.log.warn("No matching files. Path is empty.");
            return;
        }
        let relative = match relative_in_project(ctx, path) {
            Ok(relative) => relative,
            Err(err) => {
                ctx.log.warn(&format!("processPath: {err}"));
                return;
            }
        };
        let matches = match glob::glob(&ctx.wd, &relative) {
            Ok(matches) => matches,
            Err(err) => {
                ctx.log.warn(&format!("{path}: {err}"));
                return;
            }
        };
        let mut found = 0u64;
        for matched in matches {
            for visited in walk_tree(&ctx.wd, &matched) {
                if self.process(ctx, &visited) {
                    found += 1;
                }
            }
        }
        if found == 0 {
            let wd = ctx.wd.to_string_lossy().to_string();
            ctx.log.warn(&format!(
                "{path}: no matching files. Ensure that the artifact path is relative to the working directory ({wd})"
            ));
        } else {
            ctx.log.info(&format!(
                "{path}: found {found} matching artifact files and directories"
            ));
        }
    }

    /// `process`: keeps one path unless it is outside the project or excluded.
    fn process(&mut self, ctx: &mut Ctx, matched: &str) -> bool {
        let wd = ctx.wd.to_string_lossy().to_string();
        let relative = lexical::rel(&wd, &lexical::abs(&ctx.wd, matched));
        if lexical::escapes(&relative) {
            ctx.log.warn(&format!(
                "{matched}: not supported: outside build directory"
            ));
            return false;
        }
        if let Some(rule) = self.excluded_by(ctx, &relative) {
            *self.excluded.entry(rule).or_insert(0) += 1;
            return false;
        }
        match fs::symlink_metadata(ctx.wd.join(&relative)) {
            Ok(meta) => {
                self.selection.files.insert(relative, meta.modified().ok());
                true
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => false,
            Err(err) => {
                ctx.log.warn(&format!(
                    "{matched}: {}",
                    path_error("lstat", &relative, &err)
                ));
                false
            }
        }
    }

    /// `isExcluded`: the first rule matching, if any. A rule outside the project stops the
    /// check with a warning, as in the runner.
    fn excluded_by(&self, ctx: &mut Ctx, relative: &str) -> Option<String> {
        for pattern in &self.archiver.exclude {
            let rel_pattern = match relative_in_project(ctx, pattern) {
                Ok(rel) => rel,
                Err(err) => {
                    ctx.log.warn(&format!("isExcluded: {err}"));
                    return None;
                }
            };
            if glob::matches(&rel_pattern, relative) == Ok(true) {
                return Some(pattern.clone());
            }
        }
        None
    }

    fn process_untracked(&mut self, ctx: &mut Ctx) {
        ctx.log.debug("Executing command: git ls-files -o -z");
        let output = Command::new("git")
            .args(["ls-files", "-o", "-z"])
            .current_dir(&ctx.wd)
            .env_clear()
            .envs(ctx.env.pairs())
            .output();
        let output = match output {
            Ok(output) => output,
            Err(err) => {
                let why = crate::ctx::go_error(&err);
                ctx.log.warn(&format!("untracked: exec: \"git\": {why}"));
                return;
            }
        };
        ctx.log.raw(&output.stderr);
        if !output.status.success() {
            let code = output.status.code().unwrap_or(-1);
            ctx.log.warn(&format!("untracked: exit status {code}"));
            return;
        }
        let mut found = 0u64;
        for entry in output.stdout.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            if self.process(ctx, &String::from_utf8_lossy(entry)) {
                found += 1;
            }
        }
        if found == 0 {
            ctx.log.warn("untracked: no files");
        } else {
            ctx.log.info(&format!("untracked: found {found} files"));
        }
    }
}

/// `findRelativePathInProject`: the pattern relative to the project directory, or the
/// runner's refusal when its non-glob part leaves it.
pub fn relative_in_project(ctx: &Ctx, path: &str) -> Result<String, String> {
    let wd = ctx.wd.to_string_lossy().to_string();
    if lexical::clean(path) == lexical::clean(&wd) {
        return Ok(".".into());
    }
    let (base, pattern) = if path.contains(['*', '?', '[', '{']) {
        glob::split_pattern(path)
    } else {
        (path.to_string(), String::new())
    };
    let relative = lexical::rel(&wd, &lexical::abs(&ctx.wd, &base));
    if lexical::escapes(&relative) {
        return Err(format!(
            "artifact path is not a subpath of project directory: {path}"
        ));
    }
    Ok(lexical::join(&relative, &pattern))
}

/// `filepath.Walk(root)`: the root, then every entry below it in lexical order, without
/// following symlinks. A root that does not exist is still visited (its `Lstat` fails later).
fn walk_tree(wd: &Path, root: &str) -> Vec<String> {
    let mut out = vec![root.to_string()];
    let is_dir = fs::symlink_metadata(wd.join(root)).is_ok_and(|m| m.is_dir());
    if is_dir {
        walk_below(wd, root, &mut out);
    }
    out
}

fn walk_below(wd: &Path, dir: &str, out: &mut Vec<String>) {
    let Ok(read) = fs::read_dir(wd.join(dir)) else {
        return;
    };
    let mut names: Vec<(String, bool)> = read
        .filter_map(Result::ok)
        .filter_map(|e| {
            Some((
                e.file_name().into_string().ok()?,
                e.file_type().is_ok_and(|t| t.is_dir()),
            ))
        })
        .collect();
    names.sort();
    for (name, is_dir) in names {
        let path = format!("{dir}/{name}");
        out.push(path.clone());
        if is_dir {
            walk_below(wd, &path, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::Env;
    use crate::log::Log;

    fn project() -> (tempfile::TempDir, Ctx, crate::log::Captured) {
        let dir = tempfile::tempdir().expect("temp dir");
        let wd = dir.path().join("proj");
        fs::create_dir_all(wd.join("build/sub")).expect("dirs");
        fs::write(wd.join("build/a.o"), "a").expect("file");
        fs::write(wd.join("build/b.txt"), "b").expect("file");
        fs::write(wd.join("build/sub/c.o"), "c").expect("file");
        fs::write(dir.path().join("outside.txt"), "x").expect("file");
        let (log, captured) = Log::capture();
        let ctx = Ctx {
            wd,
            env: Env::from_process(),
            log,
        };
        (dir, ctx, captured)
    }

    fn selected(selection: &Selection) -> Vec<&str> {
        selection.files.keys().map(String::as_str).collect()
    }

    #[test]
    fn a_directory_path_selects_it_and_everything_below() {
        let (_dir, mut ctx, captured) = project();
        let archiver = FileArchiver {
            paths: vec!["build/".into()],
            ..Default::default()
        };
        let selection = archiver.enumerate(&mut ctx);
        assert_eq!(
            selected(&selection),
            vec![
                "build",
                "build/a.o",
                "build/b.txt",
                "build/sub",
                "build/sub/c.o"
            ]
        );
        assert!(
            captured
                .text()
                .contains("build/: found 5 matching artifact files and directories")
        );
    }

    #[test]
    fn doublestar_paths_and_excludes_select_only_the_matching_files() {
        let (_dir, mut ctx, captured) = project();
        let archiver = FileArchiver {
            paths: vec!["build/**/*.o".into(), "build/*.txt".into()],
            exclude: vec!["build/sub/**".into()],
            untracked: false,
        };
        let selection = archiver.enumerate(&mut ctx);
        assert_eq!(selected(&selection), vec!["build/a.o", "build/b.txt"]);
        assert!(captured.text().contains("build/sub/**: excluded 1 files"));
    }

    #[test]
    fn a_path_outside_the_project_is_skipped_with_the_runners_warning() {
        let (_dir, mut ctx, captured) = project();
        let archiver = FileArchiver {
            paths: vec!["../outside.txt".into(), "build/b.txt".into()],
            ..Default::default()
        };
        let selection = archiver.enumerate(&mut ctx);
        assert_eq!(selected(&selection), vec!["build/b.txt"]);
        assert!(captured
            .text()
            .contains("WARNING: processPath: artifact path is not a subpath of project directory: ../outside.txt"));
    }

    #[test]
    fn a_path_matching_nothing_warns_with_the_working_directory() {
        let (_dir, mut ctx, captured) = project();
        let archiver = FileArchiver {
            paths: vec!["nothing/*".into()],
            ..Default::default()
        };
        assert!(archiver.enumerate(&mut ctx).files.is_empty());
        assert!(
            captured.text().contains(
                "nothing/*: no matching files. Ensure that the artifact path is relative"
            )
        );
    }

    #[test]
    fn untracked_lists_ignored_and_new_files_but_not_committed_ones() {
        let (_dir, mut ctx, captured) = project();
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .current_dir(&ctx.wd)
                .output()
                .expect("git runs")
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        fs::write(ctx.wd.join(".gitignore"), "*.o\n").expect("gitignore");
        git(&["add", ".gitignore", "build/b.txt"]);
        git(&["commit", "-q", "-m", "one"]);
        let archiver = FileArchiver {
            untracked: true,
            ..Default::default()
        };
        let selection = archiver.enumerate(&mut ctx);
        assert_eq!(selected(&selection), vec!["build/a.o", "build/sub/c.o"]);
        assert!(captured.text().contains("untracked: found 2 files"));
    }

    #[test]
    fn an_archive_older_than_a_selected_file_is_changed() {
        let (_dir, mut ctx, _captured) = project();
        let archiver = FileArchiver {
            paths: vec!["build".into()],
            ..Default::default()
        };
        let selection = archiver.enumerate(&mut ctx);
        let archive = ctx.wd.join("cache.zip");
        assert!(
            selection.changed_since(&mut ctx, &archive),
            "a missing archive is changed"
        );
        fs::write(&archive, "zip").expect("archive");
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        fs::File::options()
            .write(true)
            .open(&archive)
            .expect("open")
            .set_modified(later)
            .expect("mtime");
        assert!(!selection.changed_since(&mut ctx, &archive));
    }
}

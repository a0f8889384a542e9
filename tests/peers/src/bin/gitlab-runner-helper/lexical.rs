//! Lexical path arithmetic on `/`-separated strings, as Go's `path/filepath` does it on
//! Unix: `Clean`, `Join`, `Rel` and `Abs` (against the project directory instead of the
//! process's working directory). No file system access, so `..` is resolved by text, like
//! the runner's `file_archiver.go` `findRelativePathInProject` and `process`.
//!
//! Owns: those four functions. Must not know: globs or archives.

use std::path::Path;

/// `filepath.Clean`.
pub fn clean(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            _ => parts.push(part),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// `filepath.Join` (which cleans).
pub fn join(base: &str, more: &str) -> String {
    match (base.is_empty(), more.is_empty()) {
        (true, true) => String::new(),
        (true, false) => clean(more),
        (false, true) => clean(base),
        (false, false) => clean(&format!("{base}/{more}")),
    }
}

/// `filepath.Abs` with `wd` as the working directory.
pub fn abs(wd: &Path, path: &str) -> String {
    if path.starts_with('/') {
        clean(path)
    } else {
        join(&wd.to_string_lossy(), path)
    }
}

/// `filepath.Rel(base, target)` for two absolute, clean paths: `..` steps up out of `base`.
pub fn rel(base: &str, target: &str) -> String {
    let base_parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    let target_parts: Vec<&str> = target.split('/').filter(|p| !p.is_empty()).collect();
    let common = base_parts
        .iter()
        .zip(target_parts.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out: Vec<&str> = vec![".."; base_parts.len() - common];
    out.extend(target_parts.iter().skip(common));
    if out.is_empty() {
        ".".into()
    } else {
        out.join("/")
    }
}

/// True when a relative path leaves its base (`..` or `../…`).
pub fn escapes(relative: &str) -> bool {
    relative == ".." || relative.starts_with("../")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_resolves_dots_like_go() {
        let cases = [
            ("a/./b/../c/", "a/c"),
            ("../x/..", ".."),
            ("/../a", "/a"),
            ("", "."),
            ("a/..", "."),
        ];
        for (given, expected) in cases {
            assert_eq!(clean(given), expected, "{given}");
        }
    }

    #[test]
    fn rel_steps_up_out_of_the_base() {
        assert_eq!(rel("/p/proj", "/p/proj/a/b"), "a/b");
        assert_eq!(rel("/p/proj", "/p/other"), "../other");
        assert_eq!(rel("/p/proj", "/p/proj"), ".");
        assert!(escapes(&rel("/p/proj", "/p")));
    }
}

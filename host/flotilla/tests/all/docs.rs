//! The docs stay true: every ```console block in the README and docs/ is run, command by
//! command, with this build's `flotilla` first on PATH and the repository root as the working
//! directory, and its output compared with what the page shows (`...` on a line of its own
//! stands for any lines, `[..]` for any part of a line) with its standard output. A block that shows output it does not
//! run (```text, or no language) must be marked `<!-- illustrative -->` on the line before.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The pages users read: the README, docs/, and the plugins' and templates' READMEs.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    for dir in ["docs", "plugins", "plugin-template"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            } else if path.join("README.md").is_file() {
                pages.push(path.join("README.md"));
            }
        }
    }
    pages.sort();
    pages
}

/// One fenced block: its language, its first line's number, its lines, and the line before.
struct Block {
    lang: String,
    line: usize,
    lines: Vec<String>,
    before: String,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    let mut previous = String::new();
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(lang)) => {
                open = Some(Block {
                    lang: lang.trim().to_string(),
                    line: i + 1,
                    lines: Vec::new(),
                    before: previous.clone(),
                });
            }
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some(block), None) => block.lines.push(line.to_string()),
            (None, None) => {}
        }
        if !line.trim().is_empty() {
            previous = line.trim().to_string();
        }
    }
    out
}

/// Whether `actual` matches `expected` with `[..]` wildcards inside the line.
fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    if parts.len() == 1 {
        return expected.trim_end() == actual.trim_end();
    }
    let mut rest = actual.trim_end();
    let last = parts.len() - 1;
    for (i, part) in parts.iter().enumerate() {
        let part = if i == last { part.trim_end() } else { part };
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == last {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

/// Whether the output lines match the expected ones, with `...` standing for any lines.
fn output_matches(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.iter().all(|l| l.trim().is_empty()),
        Some((first, rest)) if first.trim() == "..." => {
            (0..=actual.len()).any(|skip| output_matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => match actual.split_first() {
            Some((line, more)) => line_matches(first, line) && output_matches(rest, more),
            None => false,
        },
    }
}

#[test]
fn every_console_block_runs_as_shown_and_other_output_is_marked() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_flotilla"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    let mut failures = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page
            .strip_prefix(root())
            .unwrap_or(&page)
            .display()
            .to_string();
        for block in blocks(&text) {
            let here = format!("{name}:{}", block.line);
            if block.lang == "text" || block.lang.is_empty() {
                if block.before != "<!-- illustrative -->" {
                    failures.push(format!(
                        "{here}: a ```{} block that is not run must follow <!-- illustrative -->",
                        block.lang
                    ));
                }
                continue;
            }
            if block.lang != "console" {
                continue;
            }
            // Commands and the output each shows.
            let mut steps: Vec<(String, Vec<String>)> = Vec::new();
            for line in &block.lines {
                match line.strip_prefix("$ ") {
                    Some(command) => steps.push((command.to_string(), Vec::new())),
                    None => match steps.last_mut() {
                        Some((_, output)) => output.push(line.clone()),
                        None => failures.push(format!("{here}: output before any `$ ` command")),
                    },
                }
            }
            for (command, expected) in steps {
                assert!(
                    command.starts_with("flotilla ") || command.starts_with("flotilla-gitlab "),
                    "{here}: console blocks run flotilla or flotilla-gitlab only: {command}"
                );
                let out = Command::new("sh")
                    .arg("-c")
                    .arg(&command)
                    .current_dir(root())
                    .env("PATH", &path)
                    .env("FLOTILLA_LOG", "warn")
                    .output()
                    .unwrap();
                ran += 1;
                // What the page shows is standard output; warnings (stderr) are not part of it.
                let actual = String::from_utf8_lossy(&out.stdout).into_owned();
                let lines: Vec<&str> = actual.lines().collect();
                if !out.status.success() {
                    failures.push(format!(
                        "{here}: `{command}` failed:\n{actual}{}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                } else if !output_matches(&expected, &lines) {
                    failures.push(format!(
                        "{here}: `{command}` printed:\n{actual}\nthe page shows:\n{}",
                        expected.join("\n")
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran >= 5, "only {ran} commands found in console blocks");
}

#[test]
fn the_matcher_takes_wildcards_and_refuses_drift() {
    assert!(line_matches(
        "config_exec = \"[..]\"",
        "config_exec = \"/usr/bin/flotilla\""
    ));
    assert!(!line_matches("jobs  3526", "jobs  3527"));
    let expected: Vec<String> = ["a", "...", "z"].iter().map(|s| s.to_string()).collect();
    assert!(output_matches(&expected, &["a", "b", "c", "z"]));
    assert!(!output_matches(&expected, &["a", "b"]));
}

/// Every Rust source file of the repository's crates (not the build output or vendored trees).
fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if !matches!(name.to_str(), Some("target" | "node_modules" | ".git")) {
                rust_sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The test run builds no doc tests (`scripts/test.sh` says why), so a code example in an API
/// doc comment would never run: such blocks are text (```text), or the example is a test.
#[test]
fn no_api_doc_carries_an_example_that_no_test_runs() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["host", "plugins", "plugin-template", "tests"] {
        rust_sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} sources", files.len());
    let mut runnable = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut open = false;
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let Some(doc) = trimmed
                .strip_prefix("///")
                .or_else(|| trimmed.strip_prefix("//!"))
            else {
                continue;
            };
            let Some(lang) = doc.trim().strip_prefix("```") else {
                continue;
            };
            if !open && !matches!(lang.trim(), "text" | "ignore" | "sh" | "toml" | "json") {
                runnable.push(format!("{}:{}", file.display(), n + 1));
            }
            open = !open;
        }
    }
    assert!(
        runnable.is_empty(),
        "doc examples no test runs: {runnable:?}"
    );
}

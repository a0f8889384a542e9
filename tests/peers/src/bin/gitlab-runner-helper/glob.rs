//! Glob patterns as `github.com/bmatcuk/doublestar/v4` reads them (the runner's
//! `file_archiver.go` uses `doublestar.Match` for `--exclude` and
//! `doublestar.FilepathGlob(…, WithNoFollow())` for `--path`): `*` and `?` within one path
//! element, `[abc]` / `[a-z]` / `[^…]` / `[!…]` classes, `{alt1,alt2}` alternatives, `\`
//! escapes, and `**` as a whole element matching zero or more elements (`a/**` matches `a`
//! and everything below it; `**` inside an element is a plain `*`). `**` does not descend
//! into symbolic links to directories (`WithNoFollow`); literal elements are looked up
//! through them, as the README of doublestar describes.
//!
//! Owns: `matches`, `glob`, `split_pattern`. Must not know: the project directory rules.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// doublestar's `ErrBadPattern` text (it is `path.ErrBadPattern`).
pub const BAD_PATTERN: &str = "syntax error in pattern";

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Literal(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    fn accepts(&self, c: char) -> bool {
        match self {
            Token::Literal(l) => *l == c,
            Token::Any => true,
            Token::Star => false,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|(lo, hi)| *lo <= c && c <= *hi) != *negated
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    GlobStar,
    Tokens(Vec<Token>),
}

/// `doublestar.Match(pattern, path)`.
pub fn matches(pattern: &str, path: &str) -> Result<bool, String> {
    let compiled = expand_braces(pattern)?
        .iter()
        .map(|alt| compile(alt))
        .collect::<Result<Vec<_>, _>>()?;
    let parts: Vec<Vec<char>> = path.split('/').map(|p| p.chars().collect()).collect();
    Ok(compiled
        .iter()
        .any(|segments| match_segments(segments, &parts)))
}

/// `doublestar.FilepathGlob(pattern, WithNoFollow())` with `root` as the working directory:
/// the matching paths, relative and `/`-separated, sorted.
pub fn glob(root: &Path, pattern: &str) -> Result<Vec<String>, String> {
    let mut found = BTreeSet::new();
    for alt in expand_braces(pattern)? {
        let segments = compile(&crate::lexical::clean(&alt))?;
        walk(root, "", &segments, &mut found);
    }
    Ok(found.into_iter().collect())
}

/// `doublestar.SplitPattern`: the part before the last `/` that precedes any meta character
/// (unescaped), and the rest.
pub fn split_pattern(pattern: &str) -> (String, String) {
    let bytes = pattern.as_bytes();
    let mut split = None;
    let mut at = 0;
    while let Some(&c) = bytes.get(at) {
        match c {
            b'\\' => at += 1,
            b'/' => split = Some(at),
            b'*' | b'?' | b'[' | b'{' => break,
            _ => {}
        }
        at += 1;
    }
    match split {
        Some(0) => ("/".into(), pattern.get(1..).unwrap_or("").into()),
        Some(at) => (
            unescape(pattern.get(..at).unwrap_or("")),
            pattern.get(at + 1..).unwrap_or("").into(),
        ),
        None => (".".into(), pattern.into()),
    }
}

fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Expands `{a,b}` alternatives (nested too) into brace-free patterns.
fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let Some(open) = find_unescaped(&chars, 0, |c| c == '{') else {
        return Ok(vec![pattern.to_string()]);
    };
    let mut depth = 0usize;
    let mut commas = Vec::new();
    let mut close = None;
    let mut at = open;
    while let Some(&c) = chars.get(at) {
        match c {
            '\\' => at += 1,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(at);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(at),
            _ => {}
        }
        at += 1;
    }
    let close = close.ok_or(BAD_PATTERN)?;
    let text = |from: usize, to: usize| -> String {
        chars
            .get(from..to)
            .map(|s| s.iter().collect())
            .unwrap_or_default()
    };
    let (prefix, suffix) = (text(0, open), text(close + 1, chars.len()));
    let mut bounds = vec![open];
    bounds.extend(commas);
    bounds.push(close);
    let mut out = Vec::new();
    for pair in bounds.windows(2) {
        let (Some(&from), Some(&to)) = (pair.first(), pair.get(1)) else {
            continue;
        };
        out.extend(expand_braces(&format!(
            "{prefix}{}{suffix}",
            text(from + 1, to)
        ))?);
        if out.len() > 10_000 {
            return Err(BAD_PATTERN.into());
        }
    }
    Ok(out)
}

/// The first unescaped character at or after `from` satisfying `wanted`, outside classes.
fn find_unescaped(chars: &[char], from: usize, wanted: impl Fn(char) -> bool) -> Option<usize> {
    let mut at = from;
    let mut in_class = false;
    while let Some(&c) = chars.get(at) {
        match c {
            '\\' => at += 1,
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            _ if !in_class && wanted(c) => return Some(at),
            _ => {}
        }
        at += 1;
    }
    None
}

/// A brace-free pattern as path elements.
fn compile(pattern: &str) -> Result<Vec<Segment>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut segments = Vec::new();
    let mut start = 0;
    loop {
        let end = find_unescaped(&chars, start, |c| c == '/').unwrap_or(chars.len());
        let element = chars.get(start..end).unwrap_or(&[]);
        if element == ['*', '*'] {
            segments.push(Segment::GlobStar);
        } else {
            segments.push(Segment::Tokens(tokens(element)?));
        }
        if end >= chars.len() {
            return Ok(segments);
        }
        start = end + 1;
    }
}

fn tokens(element: &[char]) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = element.iter().copied().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(Token::Literal(chars.next().ok_or(BAD_PATTERN)?)),
            '?' => out.push(Token::Any),
            '*' => {
                if out.last() != Some(&Token::Star) {
                    out.push(Token::Star);
                }
            }
            '[' => out.push(class(&mut chars)?),
            _ => out.push(Token::Literal(c)),
        }
    }
    Ok(out)
}

fn class(
    chars: &mut std::iter::Peekable<impl Iterator<Item = char> + Clone>,
) -> Result<Token, String> {
    let negated = matches!(chars.peek(), Some('^' | '!'));
    if negated {
        chars.next();
    }
    let mut ranges = Vec::new();
    loop {
        let c = chars.next().ok_or(BAD_PATTERN)?;
        if c == ']' {
            if ranges.is_empty() {
                return Err(BAD_PATTERN.into());
            }
            return Ok(Token::Class { negated, ranges });
        }
        let lo = if c == '\\' {
            chars.next().ok_or(BAD_PATTERN)?
        } else {
            c
        };
        if chars.peek() == Some(&'-') {
            let mut ahead = chars.clone();
            ahead.next();
            if let Some(next) = ahead.peek().copied().filter(|n| *n != ']') {
                chars.next();
                chars.next();
                let hi = if next == '\\' {
                    chars.next().ok_or(BAD_PATTERN)?
                } else {
                    next
                };
                ranges.push((lo, hi));
                continue;
            }
        }
        ranges.push((lo, lo));
    }
}

fn match_segments(segments: &[Segment], parts: &[Vec<char>]) -> bool {
    match segments.split_first() {
        None => parts.is_empty(),
        Some((Segment::GlobStar, rest)) => {
            (0..=parts.len()).any(|skip| match_segments(rest, parts.get(skip..).unwrap_or(&[])))
        }
        Some((Segment::Tokens(tokens), rest)) => parts
            .split_first()
            .is_some_and(|(part, more)| match_tokens(tokens, part) && match_segments(rest, more)),
    }
}

/// Wildcard matching of one element, backtracking to the last `*`.
fn match_tokens(tokens: &[Token], name: &[char]) -> bool {
    let (mut t, mut n) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    loop {
        match (tokens.get(t), name.get(n)) {
            (Some(Token::Star), _) => {
                star = Some((t, n));
                t += 1;
                continue;
            }
            (Some(token), Some(&c)) if token.accepts(c) => {
                t += 1;
                n += 1;
                continue;
            }
            (None, None) => return true,
            _ => {}
        }
        match star {
            Some((star_t, star_n)) if star_n < name.len() => {
                star = Some((star_t, star_n + 1));
                t = star_t + 1;
                n = star_n + 1;
            }
            _ => return false,
        }
    }
}

/// The element as plain text when it has no wildcard.
fn literal(tokens: &[Token]) -> Option<String> {
    tokens
        .iter()
        .map(|t| match t {
            Token::Literal(c) => Some(*c),
            _ => None,
        })
        .collect()
}

fn child(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Entries of a directory, sorted, with whether each is a real (not symlinked) directory.
fn entries(dir: &Path) -> Vec<(String, bool)> {
    let Ok(read) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, bool)> = read
        .filter_map(Result::ok)
        .filter_map(|e| {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            Some((e.file_name().into_string().ok()?, is_dir))
        })
        .collect();
    out.sort();
    out
}

fn walk(root: &Path, prefix: &str, segments: &[Segment], found: &mut BTreeSet<String>) {
    let here = if prefix.is_empty() {
        root.to_path_buf()
    } else {
        root.join(prefix)
    };
    match segments.split_first() {
        None => {
            if !prefix.is_empty() && fs::symlink_metadata(&here).is_ok() {
                found.insert(prefix.to_string());
            }
        }
        Some((Segment::GlobStar, [])) => {
            if !prefix.is_empty() && fs::symlink_metadata(&here).is_ok() {
                found.insert(prefix.to_string());
            }
            descendants(root, prefix, found);
        }
        Some((Segment::GlobStar, rest)) => {
            walk(root, prefix, rest, found);
            for (name, is_dir) in entries(&here) {
                if is_dir {
                    walk(root, &child(prefix, &name), segments, found);
                }
            }
        }
        Some((Segment::Tokens(tokens), rest)) => match literal(tokens) {
            Some(name) => {
                let next = child(prefix, &name);
                if rest.is_empty() || root.join(&next).is_dir() {
                    walk(root, &next, rest, found);
                }
            }
            None => {
                for (name, is_dir) in entries(&here) {
                    let chars: Vec<char> = name.chars().collect();
                    if match_tokens(tokens, &chars) && (rest.is_empty() || is_dir) {
                        walk(root, &child(prefix, &name), rest, found);
                    }
                }
            }
        },
    }
}

fn descendants(root: &Path, prefix: &str, found: &mut BTreeSet<String>) {
    let here = if prefix.is_empty() {
        root.to_path_buf()
    } else {
        root.join(prefix)
    };
    for (name, is_dir) in entries(&here) {
        let path = child(prefix, &name);
        found.insert(path.clone());
        if is_dir {
            descendants(root, &path, found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doublestar_matching_rules_hold() {
        let cases = [
            ("*.txt", "notes.txt", true),
            ("*", "a/b", false),
            ("a/**", "a", true),
            ("a/**", "a/b/c", true),
            ("**/c", "c", true),
            ("**/c", "x/y/c", true),
            ("**/c", "x/abc", false),
            ("a/**/d", "a/b/c/d", true),
            ("ab[b-d]", "abc", true),
            ("ab[^b-d]", "abc", false),
            ("[a-b-d]", "-", true),
            ("[a-b-d]", "c", false),
            ("x{1,2}y", "x2y", true),
            ("{a/{b,c},abc}", "a/c", true),
            ("a\\*b", "a*b", true),
            ("abc**", "abc/b", false),
            ("?", "é", true),
        ];
        for (pattern, path, expected) in cases {
            assert_eq!(matches(pattern, path), Ok(expected), "{pattern} vs {path}");
        }
    }

    #[test]
    fn malformed_patterns_are_bad_patterns() {
        for pattern in ["[", "a[", "[]a]", "\\", "ab{c,d"] {
            assert_eq!(
                matches(pattern, "a"),
                Err(BAD_PATTERN.to_string()),
                "{pattern}"
            );
        }
    }

    #[test]
    fn split_pattern_stops_at_the_first_meta_character() {
        assert_eq!(
            split_pattern("../../path/to/meta*/**"),
            ("../../path/to".into(), "meta*/**".into())
        );
        assert_eq!(split_pattern("meta*/**"), (".".into(), "meta*/**".into()));
        assert_eq!(split_pattern("/x*"), ("/".into(), "x*".into()));
    }

    #[test]
    fn globbing_walks_the_tree_without_following_symlinked_directories() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        fs::create_dir_all(root.join("a/b")).expect("dirs");
        fs::write(root.join("a/b/c.txt"), "x").expect("file");
        fs::write(root.join("a/d.txt"), "x").expect("file");
        std::os::unix::fs::symlink(root.join("a"), root.join("link")).expect("symlink");
        let all = glob(root, "**/*.txt").expect("valid pattern");
        assert_eq!(all, vec!["a/b/c.txt", "a/d.txt"]);
        assert_eq!(glob(root, "a/*").expect("valid"), vec!["a/b", "a/d.txt"]);
        assert_eq!(
            glob(root, "link/b/c.txt").expect("valid"),
            vec!["link/b/c.txt"]
        );
        assert_eq!(glob(root, "nope/*").expect("valid"), Vec::<String>::new());
    }
}

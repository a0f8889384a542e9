//! Every unknown key and type error at once. serde stops at the first error; this module
//! records it, removes the offending key from a copy of the document, and deserializes again,
//! so the one schema (the serde shapes, with `deny_unknown_fields`) is also the list of known
//! keys, and no hand-kept list can drift from it.

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

use flotilla_validate::{KeyPath, Seg};

/// More rounds than this means something keeps failing the same way; stop there.
const MAX_ROUNDS: usize = 200;

/// One serde problem: where, and what (in the config's words).
pub(super) struct SerdeProblem {
    pub path: KeyPath,
    /// A byte offset in the original text, when serde knows the place and the key path does not.
    pub offset: Option<usize>,
    pub message: String,
}

/// Deserializes `text`, or returns every problem serde can find in it.
pub(super) fn deserialize_all<T: DeserializeOwned>(text: &str) -> Result<T, Vec<SerdeProblem>> {
    let mut doc = match text.parse::<toml_edit::DocumentMut>() {
        Ok(doc) => doc,
        Err(e) => {
            return Err(vec![SerdeProblem {
                path: KeyPath::root().key("(syntax)"),
                offset: e.span().map(|s| s.start),
                message: e.message().to_string(),
            }]);
        }
    };
    let mut problems = Vec::new();
    let mut removed: Vec<(Vec<Seg>, String)> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let current = doc.to_string();
        let de = match toml::de::Deserializer::parse(&current) {
            Ok(de) => de,
            Err(e) => {
                problems.push(SerdeProblem {
                    path: KeyPath::root().key("(syntax)"),
                    offset: None,
                    message: e.message().to_string(),
                });
                break;
            }
        };
        let e = match serde_path_to_error::deserialize::<_, T>(de) {
            Ok(value) if problems.is_empty() => return Ok(value),
            Ok(_) => break,
            Err(e) => e,
        };
        let path = segments(e.path());
        let message = e.inner().message().to_string();
        let Some((removal, problem)) = classify(&path, &message, &removed) else {
            break;
        };
        problems.push(problem);
        match removal {
            Some((table, key)) if remove(doc.as_table_mut(), &table, &key) => {
                removed.push((table, key));
            }
            // The whole table is wrong (a missing field, a bad tag): nothing to remove safely.
            _ => break,
        }
    }
    Err(problems)
}

fn segments(path: &serde_path_to_error::Path) -> Vec<Seg> {
    path.iter()
        .filter_map(|seg| match seg {
            Segment::Map { key } => Some(Seg::Key(key.clone())),
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Enum { .. } | Segment::Unknown => None,
        })
        .collect()
}

/// A key to remove: the path of its table, and its name.
type Removal = (Vec<Seg>, String);

/// What to remove and what to report. `None` ends the rounds: a missing field that is only
/// missing because an earlier round removed it has been reported already.
fn classify(
    path: &[Seg],
    message: &str,
    removed: &[Removal],
) -> Option<(Option<Removal>, SerdeProblem)> {
    let at = KeyPath::from(path.to_vec());
    let problem = |path: KeyPath, message: String| SerdeProblem {
        path,
        offset: None,
        message,
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        // serde's words: unknown field `k`, expected one of `a`, `b` (or: expected `a`).
        let (key, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let known = expected
            .trim_start_matches(", expected ")
            .trim_start_matches("one of ")
            .replace('`', "")
            .replace(" or ", ", ");
        let text = if known.is_empty() || known.starts_with("there are no fields") {
            "unknown key (this table takes no keys)".to_string()
        } else {
            format!("unknown key (known here: {known})")
        };
        // serde_path_to_error ends the path with the unknown key itself for plain structs, and
        // at the enclosing table for flattened ones; either way, remove `key` from its table.
        let table = match path.split_last() {
            Some((Seg::Key(last), table)) if last == key => table.to_vec(),
            _ => path.to_vec(),
        };
        let at = KeyPath::from(table.clone()).key(key);
        return Some((Some((table, key.to_string())), problem(at, text)));
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let key = rest.split('`').next().unwrap_or_default();
        if removed.iter().any(|(p, k)| p == path && k == key) {
            return None;
        }
    }
    // A type error's path ends with the key that holds the bad value.
    let removal = match path.split_last() {
        Some((Seg::Key(key), table)) => Some((table.to_vec(), key.clone())),
        _ => None,
    };
    Some((removal, problem(at, message.to_string())))
}

/// Removes `key` from the table at `path`; whether something was removed.
fn remove(root: &mut toml_edit::Table, path: &[Seg], key: &str) -> bool {
    match table_at(root, path) {
        Some(table) => table.remove(key).is_some(),
        None => false,
    }
}

fn table_at<'a>(
    table: &'a mut dyn toml_edit::TableLike,
    path: &[Seg],
) -> Option<&'a mut dyn toml_edit::TableLike> {
    let Some((seg, rest)) = path.split_first() else {
        return Some(table);
    };
    let Seg::Key(key) = seg else {
        return None;
    };
    let item = table.get_mut(key)?;
    match rest.split_first() {
        Some((Seg::Index(i), after)) => {
            let next: &mut dyn toml_edit::TableLike = match item {
                toml_edit::Item::ArrayOfTables(a) => a.get_mut(*i)?,
                toml_edit::Item::Value(toml_edit::Value::Array(a)) => {
                    a.get_mut(*i)?.as_inline_table_mut()?
                }
                _ => return None,
            };
            table_at(next, after)
        }
        _ => table_at(item.as_table_like_mut()?, rest),
    }
}

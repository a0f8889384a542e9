//! Every unknown key and type error at once. serde stops at the first error; this module
//! records it, removes the offending key from a copy of the document, and deserializes again,
//! so the one schema (the serde shapes, with `deny_unknown_fields`) is also the list of known
//! keys, and no hand-kept list can drift from it. A table that lacks a required key is removed
//! whole (an array element with its index remembered), so what remains still deserializes and
//! its values can be validated in the same pass: one run finds every problem.
//!
//! The messages are ours: serde's and toml's words ("expected u32", "invalid type: string")
//! are turned into the config's.

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

use flotilla_validate::{KeyPath, Seg};

/// More rounds than this means something keeps failing the same way; stop there.
const MAX_ROUNDS: usize = 200;

/// One serde problem: where (in the document as written), and what (in the config's words).
pub(super) struct SerdeProblem {
    pub path: KeyPath,
    /// A byte offset in the original text, when serde knows the place and the key path does not.
    pub offset: Option<usize>,
    pub message: String,
}

/// What `deserialize_all` found: the value of what was left after removing every bad key and
/// table (when anything was left), the problems, and the map back to the document as written.
pub(super) struct Found<T> {
    pub value: Option<T>,
    pub problems: Vec<SerdeProblem>,
    pub pruned: Pruned,
}

/// The array elements removed while looking for problems, so a path in the pruned document
/// (which is what the value, and so the validation, sees) can be mapped to the document as
/// written.
#[derive(Default)]
pub(super) struct Pruned {
    /// (path of the array as written, index as written).
    elements: Vec<(Vec<Seg>, usize)>,
}

impl Pruned {
    /// A path in the pruned document, as written.
    pub fn original(&self, path: &[Seg]) -> Vec<Seg> {
        let mut out: Vec<Seg> = Vec::with_capacity(path.len());
        for seg in path {
            match seg {
                Seg::Index(i) => {
                    let mut gone: Vec<usize> = self
                        .elements
                        .iter()
                        .filter(|(array, _)| *array == out)
                        .map(|(_, index)| *index)
                        .collect();
                    gone.sort_unstable();
                    // The i-th element that is still there.
                    let mut index = *i;
                    for g in gone {
                        if g <= index {
                            index += 1;
                        }
                    }
                    out.push(Seg::Index(index));
                }
                key => out.push(key.clone()),
            }
        }
        out
    }

    /// Whether `path` (as written) names an array that lost elements: a problem about the array
    /// as a whole ("no [[pool]] defined") may only be an echo of their removal.
    pub fn lost_elements(&self, path: &[Seg]) -> bool {
        self.elements.iter().any(|(array, _)| array == path)
    }
}

/// Deserializes `text`, finding every problem serde can find in it.
pub(super) fn deserialize_all<T: DeserializeOwned>(text: &str) -> Found<T> {
    let doc = match text.parse::<toml_edit::DocumentMut>() {
        Ok(doc) => doc,
        Err(e) => {
            return Found {
                value: None,
                problems: vec![SerdeProblem {
                    path: KeyPath::root().key("(syntax)"),
                    offset: e.span().map(|s| s.start),
                    message: syntax_message(e.message()),
                }],
                pruned: Pruned::default(),
            };
        }
    };
    let mut rounds = Rounds {
        doc,
        pruned: Pruned::default(),
        problems: Vec::new(),
        removed: Vec::new(),
        stand_ins: Vec::new(),
    };
    for _ in 0..MAX_ROUNDS {
        let current = rounds.doc.to_string();
        let de = match toml::de::Deserializer::parse(&current) {
            Ok(de) => de,
            Err(e) => {
                rounds.problems.push(SerdeProblem {
                    path: KeyPath::root().key("(syntax)"),
                    offset: None,
                    message: syntax_message(e.message()),
                });
                break;
            }
        };
        let e = match serde_path_to_error::deserialize::<_, T>(de) {
            Ok(value) => {
                return Found {
                    value: Some(value),
                    problems: rounds.problems,
                    pruned: rounds.pruned,
                };
            }
            Err(e) => e,
        };
        let here = segments(e.path());
        let written = rounds.pruned.original(&here);
        let message = e.inner().message().to_string();
        if rounds.stand_in(&here, &written, &message) {
            continue;
        }
        let step = classify(&here, &written, &message, &rounds.removed);
        if !rounds.prune(step, &here, &written) {
            break;
        }
    }
    Found {
        value: None,
        problems: rounds.problems,
        pruned: rounds.pruned,
    }
}

/// The document as the rounds of [`deserialize_all`] change it, and what they found.
struct Rounds {
    doc: toml_edit::DocumentMut,
    pruned: Pruned,
    problems: Vec<SerdeProblem>,
    /// Keys removed after a problem was reported, as written: their absence is not news.
    removed: Vec<(Vec<Seg>, String)>,
    /// Stand-ins in place (pruned path of the key, index into STAND_INS).
    stand_ins: Vec<(Vec<Seg>, usize)>,
}

impl Rounds {
    /// A required key removed for its bad value: stands a value of some type in for it (or
    /// the next type, when the last stand-in was refused), so the rest of its table is still
    /// read and validated; problems about the stand-in are dropped as echoes of the one
    /// already reported. Whether one was put in.
    fn stand_in(&mut self, here: &[Seg], written: &[Seg], message: &str) -> bool {
        if let Some(key) = message
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
            && self.removed.iter().any(|(p, k)| p == written && k == key)
        {
            let mut at = here.to_vec();
            at.push(Seg::Key(key.to_string()));
            if set_key(
                self.doc.as_table_mut(),
                here,
                key,
                STAND_INS.first().copied().unwrap_or("1"),
            ) {
                self.stand_ins.push((at, 0));
                return true;
            }
        }
        if let Some(slot) = self.stand_ins.iter_mut().find(|(at, _)| at == here)
            && let Some(next) = STAND_INS.get(slot.1 + 1).copied()
        {
            slot.1 += 1;
            if let Some((Seg::Key(key), table)) = here.split_last()
                && set_key(self.doc.as_table_mut(), table, key, next)
            {
                return true;
            }
        }
        false
    }

    /// Records the step's problem and removes what it names; `false` when nothing could be
    /// removed (the rounds stop).
    fn prune(&mut self, step: Step, here: &[Seg], written: &[Seg]) -> bool {
        match step {
            Step::RemoveKey {
                table,
                key,
                problem,
            } => {
                self.problems.extend(problem);
                let table_written = self.pruned.original(&table);
                if !remove_key(self.doc.as_table_mut(), &table, &key) {
                    return false;
                }
                self.removed.push((table_written, key));
            }
            Step::RemoveTable { problem } => {
                self.problems.extend(problem);
                // The table itself goes: an array element (remembered, so later indices are
                // mapped back), or a key of its parent.
                match here.split_last() {
                    Some((Seg::Index(i), array)) => {
                        if !remove_element(self.doc.as_table_mut(), array, *i) {
                            return false;
                        }
                        let at = self.pruned.original(array);
                        self.pruned.elements.push((at, written_index(written)));
                    }
                    Some((Seg::Key(key), parent)) => {
                        let parent_written = self.pruned.original(parent);
                        if !remove_key(self.doc.as_table_mut(), parent, key) {
                            return false;
                        }
                        self.removed.push((parent_written, key.clone()));
                    }
                    None => return false,
                }
            }
        }
        true
    }
}

/// Values of each TOML type, tried in turn for a required key whose value was refused.
const STAND_INS: &[&str] = &["1", "\"1s\"", "true", "1.0", "[]", "{}"];

/// Sets `key` in the table at `path` to the TOML value `value`; whether it was set.
fn set_key(root: &mut toml_edit::Table, path: &[Seg], key: &str, value: &str) -> bool {
    let Ok(value) = value.parse::<toml_edit::Value>() else {
        return false;
    };
    match table_at(root, path) {
        Some(table) => {
            table.insert(key, toml_edit::Item::Value(value));
            true
        }
        None => false,
    }
}

fn written_index(written: &[Seg]) -> usize {
    match written.last() {
        Some(Seg::Index(i)) => *i,
        _ => 0,
    }
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

/// What to do about one serde error.
enum Step {
    /// Remove `key` from the table at `table` (pruned coordinates) and go on.
    RemoveKey {
        table: Vec<Seg>,
        key: String,
        problem: Option<SerdeProblem>,
    },
    /// The table at the error's path cannot be read at all (a required key is missing, a tag
    /// is wrong): remove it whole and go on.
    RemoveTable { problem: Option<SerdeProblem> },
}

/// What to remove and what to report. `here` is the error's path in the pruned document,
/// `written` the same path as written.
fn classify(here: &[Seg], written: &[Seg], message: &str, removed: &[(Vec<Seg>, String)]) -> Step {
    let problem = |path: Vec<Seg>, message: String| {
        Some(SerdeProblem {
            path: KeyPath::from(path),
            offset: None,
            message,
        })
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        // serde's words: unknown field `k`, expected one of `a`, `b` (or: expected `a`).
        let (key, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let known: Vec<String> = expected
            .trim_start_matches(", expected ")
            .trim_start_matches("one of ")
            .replace(" or ", ", ")
            .split(", ")
            .map(|k| k.trim_matches('`').to_string())
            .filter(|k| !k.is_empty() && !k.starts_with("there are no fields"))
            .collect();
        // serde_path_to_error ends the path with the unknown key itself for plain structs, and
        // at the enclosing table for flattened ones; either way, remove `key` from its table.
        let (table, table_written) = match (here.split_last(), written.split_last()) {
            (Some((Seg::Key(last), table)), Some((_, table_written))) if last == key => {
                (table.to_vec(), table_written.to_vec())
            }
            _ => (here.to_vec(), written.to_vec()),
        };
        let mut at = table_written;
        at.push(Seg::Key(key.to_string()));
        return Step::RemoveKey {
            table,
            key: key.to_string(),
            problem: problem(at, unknown_key(key, &known)),
        };
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let key = rest.split('`').next().unwrap_or_default();
        // Missing only because an earlier round removed it: reported already.
        let known_gone = removed.iter().any(|(p, k)| p == written && k == key);
        let mut at = written.to_vec();
        at.push(Seg::Key(key.to_string()));
        return Step::RemoveTable {
            problem: if known_gone {
                None
            } else {
                problem(at, format!("is required in this table; add `{key} = ...`"))
            },
        };
    }
    // A type error's path ends with the key that holds the bad value.
    match (here.split_last(), written) {
        (Some((Seg::Key(key), table)), written) => Step::RemoveKey {
            table: table.to_vec(),
            key: key.clone(),
            problem: problem(written.to_vec(), value_message(message)),
        },
        // An element of a list of values, or a whole table of the wrong shape.
        _ => Step::RemoveTable {
            problem: problem(written.to_vec(), value_message(message)),
        },
    }
}

/// "unknown key", with the nearest known one when it is close enough to be a typo.
fn unknown_key(key: &str, known: &[String]) -> String {
    if known.is_empty() {
        return "unknown key (this table takes no keys)".to_string();
    }
    let nearest = known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), k))
        .min_by_key(|(distance, _)| *distance)
        .filter(|(distance, k)| *distance <= (k.len().max(key.len()) / 3).max(1));
    let list = known.join(", ");
    match nearest {
        Some((_, k)) => format!("unknown key; did you mean `{k}`? (known here: {list})"),
        None => format!("unknown key (known here: {list})"),
    }
}

/// A value error in the config's words: what was expected, and what was found.
fn value_message(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return format!("expected {}, found {}", expectation(expected), found);
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((variant, expected)) = rest.split_once("`, expected ")
    {
        let choices = expected
            .trim_start_matches("one of ")
            .replace('`', "\"")
            .replace(" or ", ", ");
        return format!("\"{variant}\" is not one of {choices}");
    }
    // humantime's parser: "expected number at 0", "unknown time unit \"x\"", ...
    if message.contains("time unit")
        || message.contains("expected number at")
        || message.contains("number is too large")
    {
        return format!(
            "is not a duration ({message}); write a positive amount with its unit, e.g. \"90s\", \"5m\", \"1h 30m\""
        );
    }
    message.to_string()
}

/// serde's name of a type, as a user would say it.
fn expectation(serde: &str) -> String {
    let whole = |max: u64| format!("a whole number from 0 to {max}");
    match serde {
        "u8" => whole(u64::from(u8::MAX)),
        "u16" => whole(u64::from(u16::MAX)),
        "u32" => whole(u64::from(u32::MAX)),
        "u64" | "usize" => whole(u64::MAX),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".to_string(),
        "f32" | "f64" => "a number".to_string(),
        "a boolean" => "true or false".to_string(),
        "a sequence" => "a list, e.g. [\"a\", \"b\"]".to_string(),
        "a map" => "a table".to_string(),
        other if other.starts_with("struct ") => "a table".to_string(),
        other if other.contains("duration") => {
            "a duration such as \"90s\", \"5m\" or \"1h 30m\"".to_string()
        }
        other => other.to_string(),
    }
}

/// toml's syntax errors are already about the text; say which kind of problem this is.
fn syntax_message(message: &str) -> String {
    format!("not valid TOML: {}", message.trim())
}

/// Removes `key` from the table at `path`; whether something was removed.
fn remove_key(root: &mut toml_edit::Table, path: &[Seg], key: &str) -> bool {
    match table_at(root, path) {
        Some(table) => table.remove(key).is_some(),
        None => false,
    }
}

/// Removes element `index` of the array at `path`; whether something was removed.
fn remove_element(root: &mut toml_edit::Table, path: &[Seg], index: usize) -> bool {
    let Some((Seg::Key(key), parent)) = path.split_last() else {
        return false;
    };
    let Some(table) = table_at(root, parent) else {
        return false;
    };
    match table.get_mut(key) {
        Some(toml_edit::Item::ArrayOfTables(a)) if index < a.len() => {
            a.remove(index);
            true
        }
        Some(toml_edit::Item::Value(toml_edit::Value::Array(a))) if index < a.len() => {
            a.remove(index);
            true
        }
        _ => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_in_the_pruned_document_maps_back_past_removed_elements() {
        let pool = vec![Seg::Key("pool".into())];
        let pruned = Pruned {
            elements: vec![(pool.clone(), 1), (pool.clone(), 3)],
        };
        let at = |i| {
            vec![
                Seg::Key("pool".into()),
                Seg::Index(i),
                Seg::Key("name".into()),
            ]
        };
        assert_eq!(pruned.original(&at(0)), at(0));
        assert_eq!(pruned.original(&at(1)), at(2));
        assert_eq!(pruned.original(&at(2)), at(4));
        assert!(pruned.lost_elements(&pool));
    }

    #[test]
    fn a_typo_gets_the_nearest_key_and_nonsense_gets_none() {
        let known: Vec<String> = ["max_instances", "max_use_count", "name"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(unknown_key("max_instanses", &known).contains("did you mean `max_instances`?"));
        assert!(!unknown_key("colour", &known).contains("did you mean"));
    }

    #[test]
    fn type_errors_are_in_our_words() {
        assert_eq!(
            value_message("invalid type: string \"three\", expected u32"),
            "expected a whole number from 0 to 4294967295, found string \"three\""
        );
        assert_eq!(
            value_message("invalid value: integer `-1`, expected u32"),
            "expected a whole number from 0 to 4294967295, found integer `-1`"
        );
    }
}

//! Configuration validation shared by the rooms: a key path ([`KeyPath`]), a collector that
//! takes every problem at once ([`Problems`]), the [`Validate`] trait that turns a room's serde
//! shape into its runtime type, and the one rule for relative paths ([`Context::resolve`]).
//!
//! Owns: the vocabulary of "what is wrong, and where in the document".
//! Must not know: file formats, line numbers or any room's types. The binary parses the file
//! and maps each [`KeyPath`] to its line; rooms only name keys relative to where they sit.

use std::fmt;
use std::path::{Path, PathBuf};

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// Where a value sits in the document, e.g. `pool[0].policy[1].timezone`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPath(Vec<Seg>);

impl KeyPath {
    /// The document root.
    pub fn root() -> Self {
        KeyPath(Vec::new())
    }

    /// This path plus a key.
    pub fn key(&self, key: &str) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_string()));
        KeyPath(segs)
    }

    /// This path plus an index.
    pub fn index(&self, index: usize) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        KeyPath(segs)
    }

    /// The steps, from the root.
    pub fn segments(&self) -> &[Seg] {
        &self.0
    }
}

impl From<Vec<Seg>> for KeyPath {
    fn from(segs: Vec<Seg>) -> Self {
        KeyPath(segs)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => f.write_str(k)?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// One problem: where, and what is wrong (with the fix where there is one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key the problem is about.
    pub path: KeyPath,
    /// What is wrong.
    pub message: String,
}

/// Every problem found so far; validation goes on after a problem, so the user sees all.
#[derive(Debug, Default)]
pub struct Problems(Vec<Problem>);

impl Problems {
    /// Records a problem at `path`.
    pub fn add(&mut self, path: &KeyPath, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.clone(),
            message: message.into(),
        });
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many were found.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The problems, in the order found.
    pub fn into_vec(self) -> Vec<Problem> {
        self.0
    }

    /// Whether every named duration is greater than zero; each zero one is a problem under `at`.
    pub fn nonzero_durations(
        &mut self,
        at: &KeyPath,
        durations: &[(&str, std::time::Duration)],
    ) -> bool {
        let mut ok = true;
        for (key, d) in durations {
            if d.is_zero() {
                self.add(&at.key(key), "must be greater than zero");
                ok = false;
            }
        }
        ok
    }

    /// `value`, or a problem when it is below `min`. Counts parsed by serde are already
    /// non-negative; this is for the lower bounds the type cannot say.
    pub fn at_least(&mut self, path: &KeyPath, value: u32, min: u32) -> Option<u32> {
        if value < min {
            self.add(path, format!("must be at least {min} (got {value})"));
            None
        } else {
            Some(value)
        }
    }
}

/// What validation may look at besides the values: where relative paths start, and whether
/// files named by the config must exist now.
#[derive(Debug, Clone)]
pub struct Context {
    /// The directory of the config file.
    pub base_dir: PathBuf,
    /// Check that named files exist (off for `simulate`, which never loads plugins).
    pub check_files: bool,
}

impl Context {
    /// A path from the config: absolute as written, relative to the config file otherwise.
    /// This is the one rule for relative paths.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }
}

/// A room's config shape, turned into its runtime type. Problems are added (all of them), and
/// `None` is returned when there was any: no placeholder value stands in after an error.
pub trait Validate {
    /// The runtime type.
    type Output;
    /// Checks `self`, which sits at `at` in the document.
    fn validate(&self, cx: &Context, at: &KeyPath, problems: &mut Problems)
    -> Option<Self::Output>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_path_prints_like_the_document_names_it() {
        let p = KeyPath::root()
            .key("pool")
            .index(0)
            .key("policy")
            .index(1)
            .key("timezone");
        assert_eq!(p.to_string(), "pool[0].policy[1].timezone");
    }

    #[test]
    fn a_relative_path_is_resolved_against_the_config_directory() {
        let cx = Context {
            base_dir: PathBuf::from("/etc/flotilla"),
            check_files: true,
        };
        assert_eq!(
            cx.resolve(Path::new("p.wasm")),
            PathBuf::from("/etc/flotilla/p.wasm")
        );
        assert_eq!(
            cx.resolve(Path::new("/opt/p.wasm")),
            PathBuf::from("/opt/p.wasm")
        );
    }

    #[test]
    fn a_value_below_its_minimum_is_a_problem_and_no_value() {
        let mut problems = Problems::default();
        let at = KeyPath::root().key("n");
        assert_eq!(problems.at_least(&at, 0, 1), None);
        assert_eq!(problems.at_least(&at, 2, 1), Some(2));
        assert_eq!(problems.len(), 1);
    }
}

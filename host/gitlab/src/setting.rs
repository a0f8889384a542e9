//! A driver setting that cannot be used: the one error every setting's parser returns.

/// A driver setting that cannot be used: the setting, the value given, and why (the words a
/// person reads, e.g. `--url "ftp://x": only http:// is supported`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {value:?}: {why}")]
pub struct SettingError {
    /// The setting (a flag, or its name).
    pub setting: &'static str,
    /// What was given.
    pub value: String,
    /// Why it cannot be used.
    pub why: String,
}

impl SettingError {
    /// `setting` given as `value` cannot be used, because `why`.
    pub fn new(setting: &'static str, value: &str, why: impl Into<String>) -> SettingError {
        SettingError {
            setting,
            value: value.to_string(),
            why: why.into(),
        }
    }
}

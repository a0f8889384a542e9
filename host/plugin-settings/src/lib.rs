//! Reading a plugin's settings (the pool's `plugin_config`, as JSON) so that `init` can report
//! every problem at once, as the contract asks: serde's `deny_unknown_fields` stops at the
//! first unknown key, so the keys are checked here first, all of them, and only the known ones
//! are read into the plugin's settings type.
//!
//! Used by the plugins of this repository (built for wasm32-wasip2); it has no dependency
//! beyond serde.

use serde::de::DeserializeOwned;

/// The settings in `text`, read into `T` from the `known` keys, and the problems found so far
/// (one per unknown key). `Err` holds every problem when `T` could not be read at all: then the
/// unknown keys are listed along with the reason.
pub fn read<T: DeserializeOwned>(
    text: &str,
    known: &[&str],
) -> Result<(T, Vec<String>), Vec<String>> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| vec![format!("settings: not valid JSON: {e}")])?;
    let Some(map) = value.as_object() else {
        return Err(vec!["settings: must be a JSON object".to_string()]);
    };
    let mut problems: Vec<String> = map
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| {
            let shown: String = k.chars().take(64).collect();
            format!("{shown:?}: unknown key (known: {})", known.join(", "))
        })
        .collect();
    let kept: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .filter(|(k, _)| known.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match serde_json::from_value(serde_json::Value::Object(kept)) {
        Ok(settings) => Ok((settings, problems)),
        Err(e) => {
            problems.push(format!("settings: {e}"));
            Err(problems)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)] // test code
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)] // read by the assertions through Debug only
    struct S {
        name: String,
        #[serde(default)]
        size: u32,
    }

    #[test]
    fn every_unknown_key_is_named_and_the_known_ones_are_read() {
        let (s, problems) = read::<S>(r#"{"name":"a","colour":1,"shape":2}"#, &["name", "size"])
            .unwrap_or_else(|p| panic!("{p:?}"));
        assert_eq!(s.name, "a");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("colour") && problems[1].contains("shape"));
    }

    #[test]
    fn a_type_error_comes_with_the_unknown_keys() {
        let problems = read::<S>(r#"{"name":7,"extra":true}"#, &["name", "size"])
            .map(|_| ())
            .unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("extra") && problems[1].contains("invalid type"));
    }

    #[test]
    fn not_an_object_is_one_problem() {
        assert_eq!(read::<S>("[]", &["name"]).map(|_| ()).unwrap_err().len(), 1);
        assert_eq!(read::<S>("{", &["name"]).map(|_| ()).unwrap_err().len(), 1);
    }
}

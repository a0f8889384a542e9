//! Reading a plugin's settings (the pool's `plugin_config`, as JSON) so that `init` can report
//! every problem at once, as the contract asks: serde's `deny_unknown_fields` stops at the
//! first unknown key, so the keys are checked here first, all of them, and only the known ones
//! are read into the plugin's settings type. The known keys are the settings type's own field
//! names, as its `Deserialize` derive declares them (after `rename`), so no list is kept by hand.

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

/// The settings in `text`, read into `T` from its known keys, and the problems found so far
/// (one per unknown key). `Err` holds every problem when `T` could not be read at all: then the
/// unknown keys are listed along with the reason. `T` is a struct with named fields that
/// derives `Deserialize` (without `flatten`, whose keys serde does not declare).
pub fn read<T: DeserializeOwned>(text: &str) -> Result<(T, Vec<String>), Vec<String>> {
    let known = keys::<T>();
    if known.is_empty() {
        return Err(vec![
            "settings: the plugin's settings type declares no keys (not a struct with named fields)"
                .to_string(),
        ]);
    }
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

/// The keys a settings type declares: the field names its derived `Deserialize` hands to
/// `deserialize_struct`. Empty for anything but a struct with named fields.
pub fn keys<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields = None;
    // The probe always ends in an error once it has the names: nothing is deserialized.
    let _ = T::deserialize(FieldProbe(&mut fields));
    fields.unwrap_or(&[])
}

/// A deserializer that reads nothing: it only records the field names a struct asks for.
struct FieldProbe<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for FieldProbe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("field names recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
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

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Renamed {
        #[serde(rename = "max-size", default)]
        _max_size: u32,
        #[serde(default)]
        _zone: Option<String>,
    }

    #[test]
    fn the_keys_are_the_types_own_field_names_after_rename() {
        assert_eq!(keys::<S>(), ["name", "size"]);
        assert_eq!(keys::<Renamed>(), ["max-size", "_zone"]);
        assert!(keys::<u32>().is_empty());
        assert!(keys::<std::collections::BTreeMap<String, u32>>().is_empty());
        let problems = read::<u32>("{}").map(|_| ()).unwrap_err();
        assert!(problems[0].contains("declares no keys"), "{problems:?}");
        let (_, problems) =
            read::<Renamed>(r#"{"max-size":3,"max_size":3}"#).unwrap_or_else(|p| panic!("{p:?}"));
        assert_eq!(
            problems,
            [r#""max_size": unknown key (known: max-size, _zone)"#]
        );
    }

    #[test]
    fn every_unknown_key_is_named_and_the_known_ones_are_read() {
        let (s, problems) =
            read::<S>(r#"{"name":"a","colour":1,"shape":2}"#).unwrap_or_else(|p| panic!("{p:?}"));
        assert_eq!(s.name, "a");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("colour") && problems[1].contains("shape"));
    }

    #[test]
    fn a_type_error_comes_with_the_unknown_keys() {
        let problems = read::<S>(r#"{"name":7,"extra":true}"#)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("extra") && problems[1].contains("invalid type"));
    }

    #[test]
    fn not_an_object_is_one_problem() {
        assert_eq!(read::<S>("[]").map(|_| ()).unwrap_err().len(), 1);
        assert_eq!(read::<S>("{").map(|_| ()).unwrap_err().len(), 1);
    }
}

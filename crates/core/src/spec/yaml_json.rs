//! A spec's YAML read straight into JSON, without building serde_yaml's own
//! value first and converting it: a tenth of a 10,000-node spec's load.
//!
//! Only for what the general path ([`super::load`]'s `parse_yaml`: a YAML
//! value, its merge keys applied, converted to JSON) would read the same way:
//! string keys, each once, plain scalars, sequences and mappings. Anything
//! else (a merge key, a key that is not a string, a repeated key, a tag, a
//! number JSON cannot hold, a YAML error) makes this return `None`, and the
//! general path reads the text, giving the value or its error as before.

use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The text as JSON when the direct reading applies (see the module).
pub(crate) fn parse(text: &str) -> Option<Value> {
    if text.contains("<<") {
        return None;
    }
    // One document, as `serde_yaml_ng::from_str` reads (more is an error there).
    Direct.deserialize(serde_yaml_ng::Deserializer::from_str(text)).ok()
}

/// Builds a JSON value from YAML's events, refusing what the general path
/// would read otherwise.
#[derive(Clone, Copy)]
struct Direct;

impl<'de> DeserializeSeed<'de> for Direct {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// A mapping's key: a string, and nothing else.
struct StringKey;

impl<'de> DeserializeSeed<'de> for StringKey {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringKey {
    type Value = String;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E: Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
}

impl<'de> Visitor<'de> for Direct {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("plain YAML")
    }
    fn visit_bool<E: Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v).map(Value::Number).ok_or_else(|| E::custom("a number JSON cannot hold"))
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(StringKey)? {
            let value = map.next_value_seed(self)?;
            if out.insert(key, value).is_some() {
                return Err(A::Error::custom("a repeated key"));
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The general path, as `load` reads a file without the direct one.
    fn general(text: &str) -> Option<Value> {
        let mut yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
        yaml.apply_merge().ok()?;
        serde_json::to_value(&yaml).ok()
    }

    /// Every spec in the repository, and YAML written to trip it: where the
    /// direct reading gives a value, the general path gives the same one;
    /// where the general path fails or reads something else (merge keys,
    /// tags, keys that are not strings, repeated keys, non-finite numbers),
    /// the direct reading declines.
    #[test]
    fn the_direct_reading_gives_the_general_paths_value_or_declines() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut texts = Vec::new();
        let mut stack = vec![root.join("experiments"), root.join("tests"), root.join("docs")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if entry.file_type().unwrap().is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    texts.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        assert!(texts.len() >= 10, "found only {} YAML files", texts.len());
        let direct_count = texts.iter().filter(|(_, t)| parse(t).is_some()).count();
        assert!(direct_count * 2 >= texts.len(), "the direct reading declined most specs: {direct_count}");
        let tricky = [
            "a: 1\nb: [1, 2.5, -3, 1e3, true, null, ~, 'x', \"y\"]\nc: {d: {e: f}}\n",
            "yes: on\nno: off\nempty:\nlist:\n  - a\n  -\n",
            "base: &b {x: 1}\nuse: *b\n",
            "base: &b {x: 1}\nmerged:\n  <<: *b\n  y: 2\n",
            "1: one\n2.5: two\ntrue: three\n",
            "~: nothing\n",
            "[a]: sequence key\n",
            "a: 1\na: 2\n",
            "nodes:\n  x: {op: shell}\n  x: {op: shell}\n",
            "tagged: !custom value\n",
            "tagged: !!str 12\n",
            "inf: .inf\nnan: .nan\n",
            "big: 18446744073709551615\nneg: -9223372036854775808\n",
            "text: |\n  line one\n  line two\n",
            "- a\n- b\n",
            "",
            "a: [unclosed\n",
            "---\na: 1\n---\nb: 2\n",
        ];
        for (name, text) in texts.iter().map(|(n, t)| (n.as_str(), t.as_str())).chain(tricky.iter().map(|t| (*t, *t))) {
            if let Some(direct) = parse(text) {
                assert_eq!(Some(direct), general(text), "{name}");
            }
        }
        for declined in ["a: 1\na: 2\n", "tagged: !custom value\n", "~: nothing\n", "1: one\n", "inf: .inf\n"] {
            assert_eq!(parse(declined), None, "{declined}");
        }
        assert_eq!(parse("base: &b {x: 1}\nmerged:\n  <<: *b\n"), None);
    }
}

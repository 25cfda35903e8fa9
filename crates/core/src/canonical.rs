//! The encodings that writers and readers share, below every other module:
//! the canonical JSON that keys and seals hash, and the strict reading of a
//! typed artifact (a missing or ill-typed field is an error naming the file and
//! the field, never a default).

use std::io::Write as _;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A typed artifact that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// JSON with object keys sorted at every level and no whitespace. Independent
/// of how the map type orders its keys, so the encoding cannot drift with a
/// dependency's feature flags.
pub fn canonical_json(v: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(v, &mut out);
    // Only JSON text was written: serde_json's escaping keeps it UTF-8.
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

/// [`canonical_json`] of any serializable value: what a typed record or event
/// seals and hashes.
pub fn to_canonical_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, serde_json::Error> {
    Ok(canonical_json(&serde_json::to_value(v)?))
}

/// Writes `v` canonically into `out`. Strings (keys too) are escaped as
/// serde_json escapes them, straight from the borrowed text: a key is not
/// copied into a new JSON value to be printed.
fn write_canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(k.as_str(), out);
                out.push(b':');
                write_canonical(&map[*k], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Number(n) => {
            // 1.0 and 1 are the same param value; integers print as integers.
            match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                    let _ = write!(out, "{}", f as i64);
                }
                _ => write_scalar(n, out),
            }
        }
        other => write_scalar(other, out),
    }
}

/// A string, number, bool or null as serde_json prints it.
fn write_scalar<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    serde_json::to_writer(out, value).expect("a JSON scalar serializes into memory");
}

/// The largest JSON artifact read whole (a results table, an evaluation's
/// summary, training metrics): far above any this project writes, and a
/// bound on what a pack from elsewhere can make a reader hold.
pub const MAX_JSON_ARTIFACT_BYTES: u64 = 1 << 30;

/// Reads a JSON artifact (a regular file of at most
/// [`MAX_JSON_ARTIFACT_BYTES`]: a FIFO in a pack is refused at once, never
/// waited on) as text. Errors name the file.
pub fn read_artifact_text(path: &Path) -> Result<String, ArtifactError> {
    crate::fsread::read_regular_text(path, MAX_JSON_ARTIFACT_BYTES)
        .map_err(|source| ArtifactError::Io { path: path.display().to_string(), source })
}

/// Reads a JSON artifact into its shared type. A missing or ill-typed field is
/// an error naming the file and the field's path, never a default.
pub fn read_typed<T: DeserializeOwned>(path: &Path) -> Result<T, ArtifactError> {
    parse_typed(&read_artifact_text(path)?, path)
}

/// [`read_typed`] of a text already read from `path` (named in errors).
pub fn parse_typed<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, ArtifactError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let field = if at == "." { String::new() } else { format!(": field {at}") };
        ArtifactError::Invalid(format!("{}{field}: {}", path.display(), e.inner()))
    })
}

/// Reads a JSON value into a type, with the path of the first problem on
/// failure. Read first without tracking the path (which allocates a segment
/// per key, for every node of a spec), and again with it only when that
/// fails: both reads are of one value, so they fail alike.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    match T::deserialize(value) {
        Ok(typed) => Ok(typed),
        Err(_) => serde_path_to_error::deserialize(value),
    }
}

/// For an `Option` field of a shared artifact type that must be present, as a
/// value or as `null`: serde's derive would otherwise read a missing one as
/// `None`, and a missing number would pass as "undefined" instead of failing.
pub fn required<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    <Option<T> as serde::Deserialize>::deserialize(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The encoder as it was before it wrote into bytes (each key copied into
    /// a JSON string value and printed): keys hash these bytes, so the two must
    /// agree on every document.
    fn as_before(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    as_before(&map[*k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    as_before(item, out);
                }
                out.push(']');
            }
            Value::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => out.push_str(&(f as i64).to_string()),
                _ => out.push_str(&n.to_string()),
            },
            other => out.push_str(&other.to_string()),
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            (-1.0e16f64..1.0e16).prop_map(|f| Value::from(f.trunc())),
            any::<String>().prop_map(Value::from),
            "[\"\\\\\u{0}-\u{1f}\u{7f}é😀a-z]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_bytes_are_those_the_encoder_wrote_before(v in arb_json()) {
            let mut before = String::new();
            as_before(&v, &mut before);
            prop_assert_eq!(canonical_json(&v), before);
        }
    }

    #[test]
    fn keys_are_sorted_escaped_and_integral_floats_print_as_integers() {
        let v = json!({"b": [1.0, 2.5, -0.0, 1e300], "a\"\n": {"z": null, "é": true}, "": "\u{1}"});
        assert_eq!(canonical_json(&v), r#"{"":"\u0001","a\"\n":{"z":null,"é":true},"b":[1,2.5,0,1e+300]}"#);
    }
}

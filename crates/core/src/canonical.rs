//! The encodings that writers and readers share, below every other module:
//! the canonical JSON that keys and seals hash, and the strict reading of a
//! typed artifact (a missing or ill-typed field is an error naming the file and
//! the field, never a default).

use std::fmt::Write as _;
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
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
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
                write_canonical(&map[*k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Number(n) => {
            // 1.0 and 1 are the same param value; integers print as integers.
            match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                    let _ = write!(out, "{}", f as i64);
                }
                _ => out.push_str(&n.to_string()),
            }
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Reads a JSON artifact into its shared type. A missing or ill-typed field is
/// an error naming the file and the field's path, never a default.
pub fn read_typed<T: DeserializeOwned>(path: &Path) -> Result<T, ArtifactError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ArtifactError::Io { path: path.display().to_string(), source })?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let field = if at == "." { String::new() } else { format!(": field {at}") };
        ArtifactError::Invalid(format!("{}{field}: {}", path.display(), e.inner()))
    })
}

/// For an `Option` field of a shared artifact type that must be present, as a
/// value or as `null`: serde's derive would otherwise read a missing one as
/// `None`, and a missing number would pass as "undefined" instead of failing.
pub fn required<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    <Option<T> as serde::Deserialize>::deserialize(d)
}

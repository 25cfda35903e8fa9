//! The user's structured files: params files (`params_files:`) and metrics
//! files (`metrics:`), written as YAML, JSON or TOML (by extension), read into
//! one JSON value. One reader for every command that reads them (keys,
//! `explain`, `compare`, `report`, `export tensorboard`, gates), so they all
//! agree on what a file says.
//!
//! The files are the user's, so hostile until checked: a file is read only
//! from inside the spec's folder, never through a link, and at most
//! [`MAX_BYTES`]; a value that is missing or not a number is said as such,
//! never read as 0.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest params or metrics file read (16 MiB).
pub const MAX_BYTES: u64 = 16 << 20;

/// The formats, by file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
    Toml,
}

impl Format {
    /// The format a file name's extension says, if any.
    pub fn of(path: &str) -> Option<Format> {
        let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "json" => Some(Format::Json),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
}

/// Reads `root/rel` (a relative path, no link on the way) and parses it by
/// its extension. The error names the file and what was expected.
pub fn read(root: &Path, rel: &str) -> Result<Value, String> {
    let format = Format::of(rel).ok_or_else(|| {
        format!("'{rel}': expected a .yaml, .yml, .json or .toml file (the extension says how it is read)")
    })?;
    read_as(root, rel, format)
}

/// [`read`] in a format given (a store object's name has no extension).
pub fn read_as(root: &Path, rel: &str, format: Format) -> Result<Value, String> {
    if let Some(link) = crate::store::fsx::link_on_path(root, rel) {
        return Err(format!(
            "'{rel}': {} is a symbolic link; params and metrics files are read from real files only",
            link.display()
        ));
    }
    let path = root.join(rel);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| format!("'{rel}' cannot be read ({}): {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("'{rel}': {e}"))?;
    if !meta.is_file() {
        return Err(format!("'{rel}' ({}) is not a regular file", path.display()));
    }
    if meta.len() > MAX_BYTES {
        return Err(format!("'{rel}' is {} bytes; params and metrics files are read up to {MAX_BYTES}", meta.len()));
    }
    let mut text = String::new();
    file.take(MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("'{rel}' cannot be read as UTF-8 text: {e}"))?;
    parse(format, &text).map_err(|e| format!("'{rel}' is not valid {}: {e}", name(format)))
}

fn name(f: Format) -> &'static str {
    match f {
        Format::Yaml => "YAML",
        Format::Json => "JSON",
        Format::Toml => "TOML",
    }
}

/// Parses text of a format into a JSON value.
pub fn parse(format: Format, text: &str) -> Result<Value, String> {
    match format {
        Format::Json => serde_json::from_str(text).map_err(|e| e.to_string()),
        Format::Yaml => serde_yaml_ng::from_str(text).map_err(|e| e.to_string()),
        Format::Toml => {
            let v: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
            serde_json::to_value(v).map_err(|e| e.to_string())
        }
    }
}

/// The value at a dotted key (`train.lr`) of a document; a list element is
/// its index (`layers.0.size`). `Err` says how far the key got.
pub fn lookup<'a>(doc: &'a Value, key: &str) -> Result<&'a Value, String> {
    let mut at = doc;
    let mut walked: Vec<&str> = Vec::new();
    for part in key.split('.') {
        let next = match at {
            Value::Object(map) => map.get(part),
            Value::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(v) => {
                walked.push(part);
                at = v;
            }
            None => {
                let here =
                    if walked.is_empty() { "the top level".to_string() } else { format!("'{}'", walked.join(".")) };
                let near: Vec<String> = match at {
                    Value::Object(map) => map.keys().cloned().collect(),
                    _ => Vec::new(),
                };
                let hint = crate::suggest::did_you_mean(part, near.iter().map(String::as_str));
                return Err(format!("no key '{part}' under {here}{hint}"));
            }
        }
    }
    Ok(at)
}

/// A metric's value: a number, or why it has none. Never a made-up 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricValue {
    Number(f64),
    Undefined(String),
}

impl MetricValue {
    pub fn number(&self) -> Option<f64> {
        match self {
            MetricValue::Number(x) => Some(*x),
            MetricValue::Undefined(_) => None,
        }
    }
}

impl std::fmt::Display for MetricValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricValue::Number(x) => write!(f, "{x}"),
            MetricValue::Undefined(why) => write!(f, "undefined ({why})"),
        }
    }
}

/// A metrics document flattened: every leaf at its dotted path (`eval.mse`),
/// numbers as numbers, anything else (a string, a bool, null, an empty list
/// or object) undefined with the reason. Lists are indexed (`per_class.0`).
pub fn flatten_metrics(doc: &Value) -> BTreeMap<String, MetricValue> {
    fn walk(prefix: &str, v: &Value, out: &mut BTreeMap<String, MetricValue>) {
        let at = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, child) in map {
                    walk(&at(k), child, out);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for (i, child) in items.iter().enumerate() {
                    walk(&at(&i.to_string()), child, out);
                }
            }
            Value::Number(n) => {
                let value = match n.as_f64() {
                    Some(x) if x.is_finite() => MetricValue::Number(x),
                    _ => MetricValue::Undefined(format!("{n} is not a finite number")),
                };
                out.insert(prefix.to_string(), value);
            }
            other => {
                let what = match other {
                    Value::Null => "null".to_string(),
                    Value::Bool(b) => format!("the boolean {b}"),
                    Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                        "nan" | "inf" | "-inf" | "infinity" | "-infinity" => format!("\"{s}\" is not a finite number"),
                        _ => format!("the string {s:?} is not a number"),
                    },
                    Value::Array(_) => "an empty list".to_string(),
                    Value::Object(_) => "an empty object".to_string(),
                    Value::Number(_) => unreachable!(),
                };
                out.insert(prefix.to_string(), MetricValue::Undefined(what));
            }
        }
    }
    let mut out = BTreeMap::new();
    if !doc.is_object() && !doc.is_array() {
        out.insert("value".to_string(), MetricValue::Undefined("the file is not an object of metrics".into()));
        return out;
    }
    walk("", doc, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_formats_read_the_same_values() {
        let yaml = parse(Format::Yaml, "train:\n  lr: 0.01\n  epochs: 3\n").unwrap();
        let json = parse(Format::Json, r#"{"train": {"lr": 0.01, "epochs": 3}}"#).unwrap();
        let toml = parse(Format::Toml, "[train]\nlr = 0.01\nepochs = 3\n").unwrap();
        for doc in [&yaml, &json, &toml] {
            assert_eq!(lookup(doc, "train.lr").unwrap().as_f64(), Some(0.01));
            assert_eq!(lookup(doc, "train.epochs").unwrap().as_u64(), Some(3));
        }
    }

    #[test]
    fn a_missing_key_says_how_far_it_got_and_suggests() {
        let doc = parse(Format::Yaml, "train:\n  lr: 0.01\n").unwrap();
        let e = lookup(&doc, "train.learning_rat").unwrap_err();
        assert!(e.contains("no key 'learning_rat' under 'train'"), "{e}");
        let e = lookup(&doc, "trian.lr").unwrap_err();
        assert!(e.contains("under the top level") && e.contains("did you mean 'train'"), "{e}");
    }

    #[test]
    fn metrics_flatten_nested_numbers_and_say_why_others_are_undefined() {
        let doc = parse(
            Format::Json,
            r#"{"test_mse": 0.01594, "eval": {"acc": 1, "note": "ok", "x": null}, "per": [0.5, true]}"#,
        )
        .unwrap();
        let m = flatten_metrics(&doc);
        assert_eq!(m["test_mse"], MetricValue::Number(0.01594));
        assert_eq!(m["eval.acc"], MetricValue::Number(1.0));
        assert_eq!(m["per.0"], MetricValue::Number(0.5));
        assert!(matches!(&m["eval.note"], MetricValue::Undefined(w) if w.contains("not a number")));
        assert!(matches!(&m["eval.x"], MetricValue::Undefined(w) if w == "null"));
        assert!(matches!(&m["per.1"], MetricValue::Undefined(w) if w.contains("boolean")));
        let nan = parse(Format::Yaml, "loss: .nan\n").unwrap();
        assert_eq!(flatten_metrics(&nan).get("loss").and_then(MetricValue::number), None);
    }

    #[test]
    fn a_linked_or_oversized_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("real.yaml"), "a: 1\n").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real.yaml"), dir.path().join("link.yaml")).unwrap();
        assert!(read(dir.path(), "link.yaml").unwrap_err().contains("symbolic link"));
        assert!(read(dir.path(), "real.txt").unwrap_err().contains("expected a .yaml"));
        assert_eq!(read(dir.path(), "real.yaml").unwrap()["a"], 1);
    }
}

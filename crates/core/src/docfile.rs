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
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Separates a params file from one of its keys in a node key's field name
/// and in what people read (`params.yaml:train.lr`), as DVC writes them.
pub const PARAMS_KEY_SEP: &str = ":";

/// The largest params or metrics file read (16 MiB).
pub const MAX_BYTES: u64 = 16 << 20;

/// Why a user's params, metrics or series file did not read; each names the
/// file (as the user wrote it), the line or the key, and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("'{file}': expected a .yaml, .yml, .json or .toml file (the extension says how it is read)")]
    Extension { file: String },
    #[error(transparent)]
    Open(#[from] crate::store::fsx::UserFileError),
    #[error("'{file}': {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("'{file}' is not a regular file of at most {MAX_BYTES} bytes")]
    TooLarge { file: String },
    #[error("'{file}' is not UTF-8 text: {source}")]
    NotText {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// Text that is not valid in its format (the parser's message).
    #[error("{0}")]
    Syntax(String),
    #[error("'{file}' is not valid {format}: {reason}")]
    Invalid { file: String, format: &'static str, reason: String },
    #[error("no key '{part}' under {at}{hint}")]
    NoKey { part: String, at: String, hint: String },
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("expected a 'step' column in the header row")]
    NoStepColumn,
    #[error("more than {MAX_STEPS} steps")]
    TooManySteps,
    /// A series file's error, with the file it is in.
    #[error("'{file}': {source}")]
    InFile {
        file: String,
        #[source]
        source: Box<DocError>,
    },
}

fn line_error(n: usize, reason: impl Into<String>) -> DocError {
    DocError::Line { line: n + 1, reason: reason.into() }
}

/// The formats, by file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
    Toml,
}

/// A file name's extension, lower-cased (`metrics.JSON` → `json`).
fn extension(path: &str) -> Option<String> {
    path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())
}

impl Format {
    /// The format a file name's extension says, if any.
    pub fn of(path: &str) -> Option<Format> {
        match extension(path)?.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "json" => Some(Format::Json),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
}

/// Reads `root/rel` (a relative path, no link on the way) and parses it by
/// its extension. The error names the file and what was expected.
pub fn read(root: &Path, rel: &str) -> Result<Value, DocError> {
    let format = Format::of(rel).ok_or_else(|| DocError::Extension { file: rel.to_string() })?;
    read_as(root, rel, format)
}

/// [`read`] in a format given (a store object's name has no extension).
pub fn read_as(root: &Path, rel: &str, format: Format) -> Result<Value, DocError> {
    let text = read_text(root, rel)?;
    parse(format, &text).map_err(|e| DocError::Invalid {
        file: rel.to_string(),
        format: name(format),
        reason: e.to_string(),
    })
}

fn name(f: Format) -> &'static str {
    match f {
        Format::Yaml => "YAML",
        Format::Json => "JSON",
        Format::Toml => "TOML",
    }
}

/// Parses text of a format into a JSON value.
pub fn parse(format: Format, text: &str) -> Result<Value, DocError> {
    let syntax = |e: &dyn std::fmt::Display| DocError::Syntax(e.to_string());
    match format {
        Format::Json => serde_json::from_str(text).map_err(|e| syntax(&e)),
        Format::Yaml => serde_yaml_ng::from_str(text).map_err(|e| syntax(&e)),
        Format::Toml => {
            let v: toml::Value = toml::from_str(text).map_err(|e| syntax(&e))?;
            serde_json::to_value(v).map_err(|e| syntax(&e))
        }
    }
}

/// The value at a dotted key (`train.lr`) of a document; a list element is
/// its index (`layers.0.size`). `Err` says how far the key got.
pub fn lookup<'a>(doc: &'a Value, key: &str) -> Result<&'a Value, DocError> {
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
                return Err(DocError::NoKey { part: part.to_string(), at: here, hint });
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

/// How a step series is written, by extension: JSON lines (`.jsonl`,
/// `.ndjson`; one object per step) or CSV (`.csv`; a header row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesFormat {
    JsonLines,
    Csv,
}

impl SeriesFormat {
    pub fn of(path: &str) -> Option<SeriesFormat> {
        match extension(path)?.as_str() {
            "jsonl" | "ndjson" => Some(SeriesFormat::JsonLines),
            "csv" => Some(SeriesFormat::Csv),
            _ => None,
        }
    }
}

/// The most steps a series file may hold.
pub const MAX_STEPS: usize = 1_000_000;

/// A step series: each metric's value at each step (`None` where a step does
/// not give a number for it: a gap, never 0), steps in file order.
pub type Series = BTreeMap<String, Vec<(f64, Option<f64>)>>;

/// Reads a step series (`root/rel`, no link, at most [`MAX_BYTES`]). Every
/// row must have a numeric `step`; the error names the file and the line.
pub fn read_series(root: &Path, rel: &str, format: SeriesFormat) -> Result<Series, DocError> {
    let text = read_text(root, rel)?;
    let parsed = match format {
        SeriesFormat::JsonLines => parse_json_lines(&text),
        SeriesFormat::Csv => parse_csv(&text),
    };
    parsed.map_err(|e| DocError::InFile { file: rel.to_string(), source: Box::new(e) })
}

fn read_text(root: &Path, rel: &str) -> Result<String, DocError> {
    use crate::fsread::{read_opened, OpenedReadError};
    let file = crate::store::fsx::open_user_file(root, rel)?;
    let bytes = read_opened(file, MAX_BYTES).map_err(|e| match e {
        OpenedReadError::TooLarge(_) => DocError::TooLarge { file: rel.to_string() },
        OpenedReadError::Io(source) => DocError::Io { file: rel.to_string(), source },
    })?;
    String::from_utf8(bytes).map_err(|e| DocError::NotText {
        file: rel.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
    })
}

/// Adds one step's values; metrics seen before but absent here get a gap.
fn push_step(out: &mut Series, rows: usize, step: f64, values: BTreeMap<String, Option<f64>>) -> Result<(), DocError> {
    if rows >= MAX_STEPS {
        return Err(DocError::TooManySteps);
    }
    for (name, v) in values {
        let column = out.entry(name).or_default();
        column.push((step, v));
    }
    Ok(())
}

pub fn parse_json_lines(text: &str) -> Result<Series, DocError> {
    let mut out = Series::new();
    let mut rows = 0;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| line_error(n, format!("not JSON: {e}")))?;
        let Some(obj) = v.as_object() else { return Err(line_error(n, "expected a JSON object per step")) };
        let step = match obj.get("step") {
            Some(Value::Number(x)) => x.as_f64().filter(|x| x.is_finite()),
            _ => None,
        }
        .ok_or_else(|| line_error(n, "expected a numeric \"step\" field"))?;
        let mut values = BTreeMap::new();
        let mut rest = obj.clone();
        rest.remove("step");
        for (k, m) in flatten_metrics(&Value::Object(rest)) {
            values.insert(k, m.number());
        }
        push_step(&mut out, rows, step, values)?;
        rows += 1;
    }
    Ok(out)
}

/// One CSV record's fields (RFC 4180: quoted fields, doubled quotes).
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => out.push(std::mem::take(&mut field)),
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err("an unclosed quote".into());
    }
    out.push(field);
    Ok(out)
}

pub fn parse_csv(text: &str) -> Result<Series, DocError> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else { return Ok(Series::new()) };
    let header: Vec<String> = csv_fields(header.trim_end_matches('\r'))
        .map_err(|e| line_error(0, e))?
        .into_iter()
        .map(|h| h.trim().to_string())
        .collect();
    let step_at = header.iter().position(|h| h == "step").ok_or(DocError::NoStepColumn)?;
    let mut out = Series::new();
    for (rows, (n, line)) in lines.enumerate() {
        let fields = csv_fields(line.trim_end_matches('\r')).map_err(|e| line_error(n, e))?;
        if fields.len() != header.len() {
            return Err(line_error(n, format!("{} fields, the header has {}", fields.len(), header.len())));
        }
        let step: f64 = fields[step_at]
            .trim()
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite())
            .ok_or_else(|| line_error(n, format!("step {:?} is not a number", fields[step_at])))?;
        let values = header
            .iter()
            .zip(&fields)
            .enumerate()
            .filter(|(i, _)| *i != step_at)
            .map(|(_, (h, f))| (h.clone(), f.trim().parse::<f64>().ok().filter(|x| x.is_finite())))
            .collect();
        push_step(&mut out, rows, step, values)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_and_csv_give_the_same_series_with_gaps_not_zeros() {
        let j = parse_json_lines(
            "{\"step\": 1, \"loss\": 0.5, \"eval\": {\"acc\": 0.1}}\n\n{\"step\": 2, \"loss\": null}\n",
        )
        .unwrap();
        assert_eq!(j["loss"], vec![(1.0, Some(0.5)), (2.0, None)]);
        assert_eq!(j["eval.acc"], vec![(1.0, Some(0.1))]);
        let c = parse_csv("step,loss,\"note, quoted\"\n1,0.5,a\n2,,\"b \"\"c\"\"\"\n").unwrap();
        assert_eq!(c["loss"], vec![(1.0, Some(0.5)), (2.0, None)]);
        assert_eq!(c["note, quoted"], vec![(1.0, None), (2.0, None)]);
        assert!(parse_json_lines("{\"loss\": 1}\n")
            .unwrap_err()
            .to_string()
            .contains("line 1: expected a numeric \"step\""));
        assert!(parse_csv("epoch,loss\n1,2\n").unwrap_err().to_string().contains("'step' column"));
        assert!(parse_csv("step,loss\n1\n").unwrap_err().to_string().contains("line 2: 1 fields, the header has 2"));
    }

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
        let e = lookup(&doc, "train.learning_rat").unwrap_err().to_string();
        assert!(e.contains("no key 'learning_rat' under 'train'"), "{e}");
        let e = lookup(&doc, "trian.lr").unwrap_err().to_string();
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
        assert!(read(dir.path(), "link.yaml").unwrap_err().to_string().contains("symbolic link"));
        std::fs::write(dir.path().join("big.json"), vec![b' '; (MAX_BYTES + 1) as usize]).unwrap();
        assert!(read(dir.path(), "big.json").unwrap_err().to_string().contains("at most"));
        assert!(read(dir.path(), "real.txt").unwrap_err().to_string().contains("expected a .yaml"));
        assert_eq!(read(dir.path(), "real.yaml").unwrap()["a"], 1);
    }
}

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
    #[error(
        "'{file}': {key} is {value}, which a node's key cannot hold exactly: JSON has no NaN or infinity, so \
         .inf, -.inf, .nan and null would be one key and a result for one would be reused for another. Write a \
         finite number, or a string your program parses"
    )]
    NonFinite { file: String, key: String, value: String },
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

/// Parses text of a format into a JSON value. A number JSON cannot hold
/// (YAML's `.nan` and `.inf`, TOML's `nan` and `inf`, and the `NaN` and
/// `Infinity` Python's `json.dump` writes) is kept as what it is
/// ([`non_finite`]), never read as `null`.
pub fn parse(format: Format, text: &str) -> Result<Value, DocError> {
    let syntax = |e: &dyn std::fmt::Display| DocError::Syntax(e.to_string());
    match format {
        Format::Json => serde_json::from_str(&python_json(text)).map_err(|e| syntax(&e)),
        Format::Yaml => {
            // Merge keys (`<<: *defaults`) applied, as Python's and DVC's YAML readers apply them.
            let mut yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| syntax(&e))?;
            yaml.apply_merge().map_err(|e| syntax(&e))?;
            yaml_to_json(yaml).map_err(|e| syntax(&e))
        }
        Format::Toml => {
            let v: toml::Value = toml::from_str(text).map_err(|e| syntax(&e))?;
            toml_to_json(v).map_err(|e| syntax(&e))
        }
    }
}

/// Where a parsed document holds a number JSON cannot (NaN, ±infinity): a
/// string no text of the user's can hold as such (it starts with a NUL), so
/// [`non_finite`] tells it apart and every reader says what the file says.
const NON_FINITE: &str = "\u{0}orchestrate-non-finite:";

fn non_finite_value(x: f64) -> Value {
    format!("{NON_FINITE}{}", non_finite_spelled(x)).into()
}

/// A number JSON cannot hold as people write it: `NaN`, `inf` or `-inf`.
pub fn non_finite_spelled(x: f64) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else if x > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// The number JSON cannot hold that a parsed value stands for, as people
/// write it: `NaN`, `inf` or `-inf`.
pub fn non_finite(v: &Value) -> Option<&str> {
    v.as_str()?.strip_prefix(NON_FINITE)
}

/// The number a [`non_finite`] value stands for: NaN or an infinity.
pub fn non_finite_number(v: &Value) -> Option<f64> {
    match non_finite(v)? {
        "NaN" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// A parsed value as people read it: a non-finite number as `NaN`, `inf`
/// or `-inf`, anything else as JSON.
pub fn shown(v: &Value) -> String {
    non_finite(v).map_or_else(|| v.to_string(), str::to_string)
}

/// The first non-finite number in `v` ([`non_finite`]), with its dotted
/// path under `at`.
pub fn first_non_finite<'a>(v: &'a Value, at: &str) -> Option<(String, &'a str)> {
    let under = |k: &str| if at.is_empty() { k.to_string() } else { format!("{at}.{k}") };
    match v {
        Value::Object(map) => map.iter().find_map(|(k, child)| first_non_finite(child, &under(k))),
        Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, child)| first_non_finite(child, &under(&i.to_string())))
        }
        _ => non_finite(v).map(|spelled| (at.to_string(), spelled)),
    }
}

/// Refuses the value `v` of a params file's key `key` if it holds a number
/// JSON cannot hold: a key records params as JSON, where it would be `null`.
pub fn exact_param(file: &str, key: &str, v: &Value) -> Result<(), DocError> {
    match first_non_finite(v, key) {
        Some((key, value)) => Err(DocError::NonFinite { file: file.to_string(), key, value: value.to_string() }),
        None => Ok(()),
    }
}

/// JSON as Python's `json` module writes and reads it: the bare `NaN`,
/// `Infinity` and `-Infinity` it writes for non-finite floats become
/// [`non_finite`] strings. Outside strings, valid JSON has no letters but
/// those of `true`, `false` and `null`, so nothing valid is changed.
fn python_json(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("NaN") && !text.contains("Infinity") {
        return std::borrow::Cow::Borrowed(text);
    }
    let (mut out, mut rest, mut in_string, mut escaped) = (String::with_capacity(text.len()), text, false, false);
    while let Some(c) = rest.chars().next() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            in_string = true;
        } else if let Some((token, x)) =
            [("-Infinity", f64::NEG_INFINITY), ("Infinity", f64::INFINITY), ("NaN", f64::NAN)]
                .into_iter()
                .find(|(token, _)| rest.starts_with(token))
        {
            out.push_str(&non_finite_value(x).to_string());
            rest = &rest[token.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

/// TOML's value as JSON (as `serde_json::to_value` gives it), with its
/// `nan` and `inf` kept ([`non_finite`]).
fn toml_to_json(v: toml::Value) -> Result<Value, serde_json::Error> {
    Ok(match v {
        toml::Value::Float(x) if !x.is_finite() => non_finite_value(x),
        toml::Value::Array(items) => items.into_iter().map(toml_to_json).collect::<Result<Vec<_>, _>>()?.into(),
        toml::Value::Table(table) => table
            .into_iter()
            .map(|(k, v)| Ok((k, toml_to_json(v)?)))
            .collect::<Result<serde_json::Map<_, _>, _>>()?
            .into(),
        other => serde_json::to_value(other)?,
    })
}

/// A YAML value (merge keys applied) as JSON, as `serde_json::to_value`
/// gives it (the spec's own reading: keys that are numbers or booleans
/// become their text, a tagged value `{"!tag": value}`), except that a float
/// JSON cannot hold is kept ([`non_finite`]) where that makes it `null`.
fn yaml_to_json(v: serde_yaml_ng::Value) -> Result<Value, serde_json::Error> {
    use serde_yaml_ng::Value as Yaml;
    Ok(match v {
        Yaml::Number(n) if n.as_f64().is_some_and(|x| !x.is_finite()) => {
            non_finite_value(n.as_f64().unwrap_or(f64::NAN))
        }
        Yaml::Sequence(items) => items.into_iter().map(yaml_to_json).collect::<Result<Vec<_>, _>>()?.into(),
        Yaml::Mapping(map) => {
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                let key = match serde_json::to_value(&k)? {
                    Value::String(s) => s,
                    key @ (Value::Number(_) | Value::Bool(_)) => key.to_string(),
                    _ => return Err(serde::ser::Error::custom("key must be a string")),
                };
                out.insert(key, yaml_to_json(v)?);
            }
            out.into()
        }
        Yaml::Tagged(tagged) => {
            let tagged = *tagged;
            serde_json::Map::from_iter([(tagged.tag.to_string(), yaml_to_json(tagged.value)?)]).into()
        }
        other => serde_json::to_value(other)?,
    })
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
/// Two leaves whose paths read the same (a key `eval.mse` beside `mse` under
/// `eval`) are one name for two values: that name is undefined, saying so.
pub fn flatten_metrics(doc: &Value) -> BTreeMap<String, MetricValue> {
    fn put(out: &mut BTreeMap<String, MetricValue>, name: &str, value: MetricValue) {
        if out.insert(name.to_string(), value).is_some() {
            let why =
                format!("two values in the file have the name '{name}' (a key holding dots, and the same path nested)");
            out.insert(name.to_string(), MetricValue::Undefined(why));
        }
    }
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
                put(out, prefix, value);
            }
            other => {
                let what = match other {
                    Value::Null => "null".to_string(),
                    Value::Bool(b) => format!("the boolean {b}"),
                    Value::String(_) if non_finite(other).is_some() => {
                        format!("{} is not a finite number", shown(other))
                    }
                    Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                        "nan" | "inf" | "-inf" | "infinity" | "-infinity" => format!("\"{s}\" is not a finite number"),
                        _ => format!("the string {s:?} is not a number"),
                    },
                    Value::Array(_) => "an empty list".to_string(),
                    Value::Object(_) => "an empty object".to_string(),
                    Value::Number(_) => unreachable!(),
                };
                put(out, prefix, MetricValue::Undefined(what));
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
        let v: Value = serde_json::from_str(&python_json(line)).map_err(|e| line_error(n, format!("not JSON: {e}")))?;
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

    /// NaN and ±infinity read as what they are in every format (Python's
    /// `json.dump` writes `NaN`, `Infinity`, `-Infinity`), never as `null`;
    /// the same words inside a JSON string are text.
    #[test]
    fn numbers_json_cannot_hold_are_kept_in_every_format_and_never_null() {
        let json = parse(
            Format::Json,
            r#"{"a": NaN, "b": [Infinity, -Infinity], "note": "NaN and \"Infinity\" \\", "c": null}"#,
        )
        .unwrap();
        let yaml =
            parse(Format::Yaml, "a: .nan\nb: [.inf, -.inf]\nnote: 'NaN and \"Infinity\" \\'\nc: null\n").unwrap();
        let toml = parse(Format::Toml, "a = nan\nb = [inf, -inf]\nnote = 'NaN and \"Infinity\" \\'\n").unwrap();
        for (format, doc) in [("json", &json), ("yaml", &yaml), ("toml", &toml)] {
            let at = |k: &str| lookup(doc, k).unwrap();
            assert_eq!(shown(at("a")), "NaN", "{format}");
            assert_eq!(shown(at("b.0")), "inf", "{format}");
            assert_eq!(shown(at("b.1")), "-inf", "{format}");
            assert_eq!(at("note").as_str(), Some(r#"NaN and "Infinity" \"#), "{format}");
            assert_eq!(first_non_finite(doc, "").map(|(k, v)| (k, v.to_string())), Some(("a".into(), "NaN".into())));
            let flat = flatten_metrics(doc);
            assert_eq!(flat["b.1"], MetricValue::Undefined("-inf is not a finite number".into()), "{format}");
        }
        assert_eq!(lookup(&json, "c").unwrap(), &Value::Null);
        assert!(exact_param("p.yaml", "b", lookup(&yaml, "b").unwrap())
            .unwrap_err()
            .to_string()
            .contains("b.0 is inf"));
        assert!(exact_param("p.yaml", "note", lookup(&yaml, "note").unwrap()).is_ok());
        // A step whose loss is NaN is a gap in the series, not a file that does not read.
        let series = parse_json_lines("{\"step\": 1, \"loss\": 0.5}\n{\"step\": 2, \"loss\": NaN}\n").unwrap();
        assert_eq!(series["loss"], vec![(1.0, Some(0.5)), (2.0, None)]);
    }

    /// Apart from what JSON cannot hold, a YAML file reads as the spec's
    /// own YAML is read (merge keys applied, as Python's and DVC's readers
    /// apply them): the same value, or an error where that fails.
    #[test]
    fn yaml_reads_as_the_spec_reads_it_merge_keys_applied() {
        for text in [
            "a: 1\nb: -2\nc: 2.5\nd: true\ne: ~\nf: text\ng: [1, {h: null}]\n",
            "big: 18446744073709551615\nneg: -9223372036854775808\n",
            "huge: 340282366920938463463374607431768211455\n",
            "1: one\ntrue: two\n2.5: three\n",
            "base: &b {x: 1, z: 0}\nmerged:\n  <<: *b\n  y: 2\n  z: 3\n",
            "tagged: !custom value\n",
            "a: !!int 3\nq: '12'\nhex: 0x1F\nzero: 012\n",
            "- a\n- [b, c]\n",
            "",
        ] {
            let spec_reads = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text).ok().and_then(|mut v| {
                v.apply_merge().ok()?;
                serde_json::to_value(v).ok()
            });
            assert_eq!(parse(Format::Yaml, text).ok(), spec_reads, "{text:?}");
        }
        let merged = parse(Format::Yaml, "base: &b {x: 1, z: 0}\nmerged:\n  <<: *b\n  z: 3\n").unwrap();
        assert_eq!(lookup(&merged, "merged.x").unwrap(), &Value::from(1));
        assert_eq!(lookup(&merged, "merged.z").unwrap(), &Value::from(3));
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

    /// Two values whose dotted names are the same (a key `eval.mse` beside
    /// `mse` under `eval`) were one metric: the one flattened last replaced
    /// the other, so `compare` showed a number the file holds twice over
    /// without a word. Both are now undefined, saying why.
    #[test]
    fn two_values_flattened_to_one_name_are_undefined_not_one_of_them() {
        for text in [
            r#"{"eval.mse": 0.5, "eval": {"mse": 0.1}, "acc": 1}"#,
            r#"{"eval": {"mse": 0.1}, "eval.mse": 0.5, "acc": 1}"#,
        ] {
            let m = flatten_metrics(&parse(Format::Json, text).unwrap());
            assert!(
                matches!(&m["eval.mse"], MetricValue::Undefined(w) if w.contains("two values") && w.contains("'eval.mse'")),
                "{text}: {:?}",
                m["eval.mse"]
            );
            assert_eq!(m["acc"], MetricValue::Number(1.0));
        }
        // The same name three times over is still one undefined metric.
        let m = flatten_metrics(&parse(Format::Json, r#"{"a.b.c": 1, "a": {"b.c": 2, "b": {"c": 3}}}"#).unwrap());
        assert!(matches!(&m["a.b.c"], MetricValue::Undefined(_)), "{:?}", m["a.b.c"]);
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

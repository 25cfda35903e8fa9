//! Gates as data: pre-registered criteria over node outputs, declared in
//! `gates/*.yaml`, evaluated in the DAG by the `gate` op and again, from a
//! frozen pack's own files, by `orchestrate audit`.
//!
//! ```yaml
//! name: grpo-main
//! gates:
//!   - name: grpo-resume-exact
//!     description: GRPO interrupted at 40 and resumed equals the continuous run
//!     evidence: {report: 'grpo-check:report'}
//!     check: {field: report.identical, equals: true}
//!   - name: json-validity
//!     evidence: {table: 'results:table.json'}
//!     check: {field: 'table.rows.0.json_validity', at_least: 0.5}
//!   - name: non-inferiority
//!     evidence: {on: 'e2:on.json', off: 'e2:off.json'}
//!     check: {margin: {a: on.success, b: off.success}, at_least: -0.0625}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A gate file.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GateFile {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub gates: Vec<Gate>,
}

/// One pre-registered criterion.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// The evidence it reads, by alias: `{alias: NODE:OUTPUT}` (JSON outputs).
    pub evidence: BTreeMap<String, String>,
    pub check: Check,
}

/// What must hold. Fields are `alias.path.to.value` (array indices as numbers).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// The value checked (or use `margin`): `alias.key.0.key`, a dotted path
    /// (array indices are numbers); a segment in double quotes is one key
    /// whole, dots and all (`m."eval.acc"`).
    #[serde(default)]
    pub field: Option<String>,
    /// `a − b`, for non-inferiority margins.
    #[serde(default)]
    pub margin: Option<Margin>,
    #[serde(default)]
    pub equals: Option<Value>,
    /// The value must equal another field (counts: matched = total).
    #[serde(default)]
    pub equals_field: Option<String>,
    #[serde(default)]
    pub at_least: Option<f64>,
    #[serde(default)]
    pub at_most: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Margin {
    pub a: String,
    pub b: String,
}

/// A gate's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateResult {
    pub name: String,
    pub description: Option<String>,
    pub passed: bool,
    /// What was observed, and against what.
    pub detail: String,
    /// Evidence alias → (NODE:OUTPUT, content hash).
    pub evidence: BTreeMap<String, (String, String)>,
}

impl GateResult {
    /// A gate that could not be evaluated (its evidence unread), which fails
    /// saying why: in the run and in the audit alike.
    pub fn unevaluated(gate: &Gate, detail: String, evidence: BTreeMap<String, (String, String)>) -> Self {
        GateResult { name: gate.name.clone(), description: gate.description.clone(), passed: false, detail, evidence }
    }
}

/// What the `gate` op writes as `gates.json`, and what `run` and `audit` read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateReport {
    /// The gate file's `name`.
    pub gate_file: String,
    pub all_passed: bool,
    pub results: Vec<GateResult>,
}

impl GateReport {
    pub fn new(gate_file: String, results: Vec<GateResult>) -> Self {
        GateReport { gate_file, all_passed: results.iter().all(|r| r.passed), results }
    }

    /// Reads a `gates.json`; a missing, unreadable or ill-typed one is an error
    /// naming the file and what is wrong, never an empty report.
    pub fn read(path: &Path) -> Result<Self, GateError> {
        // From a pack too (`report`, `compare`): a regular file, bounded.
        let text = crate::fsread::read_regular_text(path, crate::canonical::MAX_JSON_ARTIFACT_BYTES)
            .map_err(GateError::io(path))?;
        serde_json::from_str(&text)
            .map_err(|e| GateError::NotAReport { path: path.to_path_buf(), reason: e.to_string() })
    }

    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| !r.passed).count()
    }
}

/// Why a gate file, a gate file's path or a gate report was refused; each
/// names the file (or the param) and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A gate file that is a link, not a file, or over [`MAX_GATE_FILE_BYTES`].
    #[error(transparent)]
    File(#[from] crate::fsread::BoundedFileError),
    #[error("{}: not a gate report: {reason}", .path.display())]
    NotAReport { path: PathBuf, reason: String },
    #[error("{}: not a gate file: {reason}", .path.display())]
    NotAGateFile { path: PathBuf, reason: String },
    #[error("{}: {count} gates, over the limit of {MAX_GATES}", .path.display())]
    TooMany { path: PathBuf, count: usize },
    /// One gate of the file is malformed.
    #[error("{}: gate '{gate}': {problem}", .path.display())]
    Gate { path: PathBuf, gate: String, problem: String },
    #[error("evidence {reference} does not read: {source}")]
    Evidence {
        reference: String,
        #[source]
        source: crate::docfile::DocError,
    },
    /// A gate node's report, in a run.
    #[error("gate node '{node}' has no {output} output")]
    NoReport { node: String, output: String },
    #[error("gate node '{node}': {output} {source}")]
    InNode {
        node: String,
        output: String,
        #[source]
        source: Box<GateError>,
    },
    #[error("gate file '{shown}': give a path relative to the spec's folder, inside its project (no absolute path)")]
    Absolute { shown: String },
    #[error("gate file '{shown}' is outside the spec's project {} (gate files, like deps, stay inside it)", .root.display())]
    Outside { shown: String, root: PathBuf },
}

impl GateError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> GateError + '_ {
        move |source| GateError::Io { path: path.to_path_buf(), source }
    }
}

/// Reads and checks a gate file.
/// A gate file larger than this is not read (they are a few kilobytes).
pub const MAX_GATE_FILE_BYTES: u64 = 1 << 20;
/// At most this many gates in one file (an audit prints a row per gate).
pub const MAX_GATES: usize = 1000;

/// Where a spec's gate file is, checked: a relative path that stays inside the
/// spec's project ([`project_root`]), also once links are resolved. `/etc/passwd`, or
/// `../../x` past the project, is refused naming the param.
pub fn gate_file_path(spec_dir: &Path, file: &str) -> Result<PathBuf, GateError> {
    let shown = crate::ids::escaped(file);
    if file.is_empty() || Path::new(file).is_absolute() {
        return Err(GateError::Absolute { shown: shown.into_owned() });
    }
    let spec_dir = std::path::absolute(spec_dir).map_err(GateError::io(spec_dir))?;
    let root = project_root(&spec_dir);
    let mut joined = spec_dir.clone();
    for part in Path::new(file).components() {
        match part {
            std::path::Component::ParentDir => {
                joined.pop();
            }
            std::path::Component::Normal(p) => joined.push(p),
            _ => {}
        }
    }
    let outside = || GateError::Outside { shown: shown.to_string(), root: root.clone() };
    if !joined.starts_with(&root) {
        return Err(outside());
    }
    // A link inside the project may still point out of it.
    if let (Ok(real), Ok(real_root)) = (joined.canonicalize(), root.canonicalize()) {
        if !real.starts_with(&real_root) {
            return Err(outside());
        }
    }
    Ok(joined)
}

/// A spec's project: the nearest folder at or above `dir` holding `.git`; else
/// the current folder, when it holds the spec (`orchestrate run
/// experiments/x.yaml` from an unpacked tarball's top); else `dir` itself.
fn project_root(dir: &Path) -> std::path::PathBuf {
    if let Some(git) = dir.ancestors().find(|d| d.join(".git").exists()) {
        return git.to_path_buf();
    }
    match std::env::current_dir().and_then(std::path::absolute) {
        Ok(cwd) if dir.starts_with(&cwd) => cwd,
        _ => dir.to_path_buf(),
    }
}

/// A parse error about a file that may not be a gate file at all: quoted
/// values in it are cut to a few characters and escaped, so an error never
/// prints the file (`/etc/passwd`, a credentials file) back.
pub fn bounded_error(message: &str) -> String {
    const QUOTED: usize = 16;
    const ALL: usize = 300;
    let mut out = String::new();
    let mut inside = false;
    let mut run = 0;
    for c in message.chars() {
        if c == '"' {
            if inside && run > QUOTED {
                out.push('…');
            }
            inside = !inside;
            run = 0;
            out.push(c);
            continue;
        }
        if inside {
            run += 1;
            if run > QUOTED {
                continue;
            }
        }
        out.push(c);
    }
    crate::ids::excerpt(&out, ALL)
}

pub fn read_gate_file(path: &Path) -> Result<GateFile, GateError> {
    // A gate file may come from a pack (hostile input): a regular file, bounded.
    let text = crate::fsread::read_bounded_text(path, MAX_GATE_FILE_BYTES)?;
    parse_gate_file(path, &text)
}

/// A gate file's text, read from `path` (which errors name), checked as
/// [`read_gate_file`] checks it.
pub fn parse_gate_file(path: &Path, text: &str) -> Result<GateFile, GateError> {
    let file: GateFile = serde_yaml_ng::from_str(text)
        .map_err(|e| GateError::NotAGateFile { path: path.to_path_buf(), reason: bounded_error(&e.to_string()) })?;
    if file.gates.len() > MAX_GATES {
        return Err(GateError::TooMany { path: path.to_path_buf(), count: file.gates.len() });
    }
    // The same text with NaN and infinities kept (read into `Check`, `equals`
    // would hold them as null).
    let marked = crate::docfile::parse(crate::docfile::Format::Yaml, text).ok();
    for (i, g) in file.gates.iter().enumerate() {
        let bad = |problem: String| GateError::Gate { path: path.to_path_buf(), gate: g.name.clone(), problem };
        let c = &g.check;
        let equals = marked.as_ref().and_then(|m| m.get("gates")?.get(i)?.get("check")?.get("equals"));
        if let Some((_, value)) = equals.and_then(|v| crate::docfile::first_non_finite(v, "")) {
            return Err(bad(format!(
                "check.equals holds {value}, which JSON cannot hold: it would be compared as null. Write a finite number"
            )));
        }
        for (name, bound) in [("at_least", c.at_least), ("at_most", c.at_most)] {
            if bound.is_some_and(f64::is_nan) {
                return Err(bad(format!("check.{name} is NaN, which no value is {name}. Write a number")));
            }
        }
        let paths = [("check.field", c.field.as_ref()), ("check.equals_field", c.equals_field.as_ref())]
            .into_iter()
            .chain(c.margin.iter().flat_map(|m| [("check.margin.a", Some(&m.a)), ("check.margin.b", Some(&m.b))]));
        for (name, path) in paths {
            if let Some(problem) = path.and_then(|p| field_segments(p).err()) {
                return Err(bad(format!("{name}: {problem}")));
            }
        }
        if c.field.is_some() == c.margin.is_some() {
            return Err(bad("give exactly one of check.field and check.margin".into()));
        }
        if c.equals.is_none() && c.equals_field.is_none() && c.at_least.is_none() && c.at_most.is_none() {
            return Err(bad("the check has no criterion (equals, equals_field, at_least, at_most)".into()));
        }
        for r in g.evidence.values() {
            if !r.contains(':') {
                return Err(bad(format!("evidence '{r}' is not NODE:OUTPUT")));
            }
        }
    }
    Ok(file)
}

/// The segments of a field path: `alias.key.0.key`, split at each dot, where
/// a segment written in double quotes is taken whole (`m."eval.acc"` names
/// the key `eval.acc`; `\"` and `\\` inside quotes are a quote and a
/// backslash), as JMESPath quotes an identifier.
fn field_segments(field: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = field.chars().peekable();
    loop {
        let mut segment = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(format!("'{field}' has a quote that is not closed")),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(c @ ('"' | '\\')) => segment.push(c),
                        _ => return Err(format!("'{field}': inside quotes, a backslash escapes only '\"' or '\\'")),
                    },
                    Some(c) => segment.push(c),
                }
            }
            if !matches!(chars.peek(), None | Some('.')) {
                return Err(format!("'{field}': a quoted segment is followed by something other than '.'"));
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                segment.push(c);
                chars.next();
            }
            if segment.is_empty() {
                return Err(format!("'{field}' has an empty segment (a key that is empty is written \"\")"));
            }
        }
        out.push(segment);
        if chars.next().is_none() {
            return Ok(out);
        }
    }
}

/// Gate evidence larger than this is read neither by a gate node nor by an
/// audit (evidence is metrics and tables, kilobytes to megabytes): the gate
/// fails, saying so, in the run and in the audit alike.
pub const MAX_EVIDENCE_BYTES: u64 = 64 << 20;

/// The detail of a gate whose evidence is over [`MAX_EVIDENCE_BYTES`].
pub fn evidence_too_large(reference: &str) -> String {
    format!("cannot evaluate: evidence {reference} is over the limit of {MAX_EVIDENCE_BYTES} bytes")
}

/// Looks up `alias.path` in the loaded evidence.
fn lookup<'a>(evidence: &'a BTreeMap<String, Value>, field: &str) -> Result<&'a Value, String> {
    let segments = field_segments(field)?;
    let (alias, path) = segments.split_first().expect("a path has a segment");
    let mut cur = evidence.get(alias).ok_or_else(|| format!("no evidence '{alias}'"))?;
    for p in path {
        cur = match cur {
            Value::Array(items) => p.parse::<usize>().ok().and_then(|i| items.get(i)),
            Value::Object(map) => map.get(p),
            _ => None,
        }
        .ok_or_else(|| format!("'{field}' not found in the evidence"))?;
    }
    Ok(cur)
}

/// Whether two JSON values are equal as Python's `==` finds them: numbers by
/// value (`0.0` equals `0`; two integers exactly, past 2^53 too), lists and
/// objects element by element, NaN equal to nothing (itself included) and
/// an infinity to the same infinity, anything else as JSON (`true` is not `1`).
fn same_value(a: &Value, b: &Value) -> bool {
    match (crate::docfile::non_finite_number(a), crate::docfile::non_finite_number(b)) {
        // f64's `==`: NaN equals nothing, an infinity only itself.
        (Some(x), Some(y)) => return x == y,
        (Some(_), None) | (None, Some(_)) => return false,
        (None, None) => {}
    }
    if let (Some(x), Some(y)) = (a.as_number(), b.as_number()) {
        let int = |n: &serde_json::Number| n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from));
        return match (int(x), int(y)) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        };
    }
    if let (Some(x), Some(y)) = (a.as_array(), b.as_array()) {
        return x.len() == y.len() && x.iter().zip(y).all(|(u, v)| same_value(u, v));
    }
    if let (Some(x), Some(y)) = (a.as_object(), b.as_object()) {
        return x.len() == y.len() && x.iter().all(|(k, u)| y.get(k).is_some_and(|v| same_value(u, v)));
    }
    a == b
}

/// Evaluates one gate on loaded evidence (alias → JSON). A gate whose evidence
/// lacks the field, or is not a number where one is needed, fails with that detail.
pub fn evaluate(
    gate: &Gate,
    evidence: &BTreeMap<String, Value>,
    hashes: &BTreeMap<String, (String, String)>,
) -> GateResult {
    let outcome = (|| -> Result<(bool, String), String> {
        let c = &gate.check;
        let (observed, label) = match (&c.field, &c.margin) {
            (Some(f), _) => (lookup(evidence, f)?.clone(), f.clone()),
            (None, Some(m)) => {
                let num = |f: &str| {
                    let v = lookup(evidence, f)?;
                    v.as_f64().ok_or_else(|| match crate::docfile::non_finite(v) {
                        Some(x) => format!("'{f}' is {x}, not a number"),
                        None => format!("'{f}' is not a number"),
                    })
                };
                (json!(num(&m.a)? - num(&m.b)?), format!("{} − {}", m.a, m.b))
            }
            (None, None) => return Err("no field".into()),
        };
        let mut clauses = Vec::new();
        let mut ok = true;
        if let Some(want) = &c.equals {
            ok &= same_value(&observed, want);
            clauses.push(format!("= {want}"));
        }
        if let Some(other) = &c.equals_field {
            let want = lookup(evidence, other)?;
            ok &= same_value(&observed, want);
            clauses.push(format!("= {other} ({})", crate::docfile::shown(want)));
        }
        let shown = crate::docfile::shown(&observed);
        let number = || observed.as_f64().ok_or_else(|| format!("{label} is {shown}, not a number"));
        if let Some(min) = c.at_least {
            ok &= number()? >= min;
            clauses.push(format!("≥ {min}"));
        }
        if let Some(max) = c.at_most {
            ok &= number()? <= max;
            clauses.push(format!("≤ {max}"));
        }
        Ok((ok, format!("{label} = {shown}, required {}", clauses.join(" and "))))
    })();
    let (passed, detail) = match outcome {
        Ok(x) => x,
        Err(e) => (false, format!("cannot evaluate: {e}")),
    };
    GateResult {
        name: gate.name.clone(),
        description: gate.description.clone(),
        passed,
        detail,
        evidence: hashes.clone(),
    }
}

/// A plain table of results.
pub fn table(results: &[GateResult]) -> String {
    let mut out = String::from("| gate | result | evidence |\n|---|---|---|\n");
    for r in results {
        let ev: Vec<String> = r
            .evidence
            .values()
            .map(|(reference, hash)| format!("{reference} ({})", &hash[..hash.len().min(12)]))
            .collect();
        out.push_str(&format!(
            "| {} | {} — {} | {} |\n",
            r.name,
            if r.passed { "PASS" } else { "FAIL" },
            r.detail,
            ev.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate file holding one gate, `name`, with this check, as
    /// [`read_gate_file`] reads it from disk.
    fn one_gate_file(name: &str, check: &str) -> Result<GateFile, GateError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.yaml");
        let text = format!("name: own\ngates:\n  - name: {name}\n    evidence: {{m: 'n:o'}}\n    check: {check}\n");
        std::fs::write(&path, text).unwrap();
        read_gate_file(&path)
    }

    fn gate(check: &str) -> Gate {
        serde_yaml_ng::from_str(&format!("name: g\nevidence: {{r: 'n:o'}}\ncheck: {check}\n")).unwrap()
    }

    #[test]
    fn checks_pass_and_fail_with_what_was_observed() {
        let ev: BTreeMap<String, Value> = [(
            "r".to_string(),
            json!({"identical": true, "matched": 12, "total": 12, "rows": [{"v": 0.4}], "on": 0.25, "off": 0.30}),
        )]
        .into();
        let h = BTreeMap::new();
        assert!(evaluate(&gate("{field: r.identical, equals: true}"), &ev, &h).passed);
        assert!(evaluate(&gate("{field: r.matched, equals_field: r.total}"), &ev, &h).passed);
        let r = evaluate(&gate("{field: r.rows.0.v, at_least: 0.5}"), &ev, &h);
        assert!(!r.passed);
        assert_eq!(r.detail, "r.rows.0.v = 0.4, required ≥ 0.5");
        assert!(evaluate(&gate("{margin: {a: r.on, b: r.off}, at_least: -0.0625}"), &ev, &h).passed);
        assert!(!evaluate(&gate("{margin: {a: r.on, b: r.off}, at_least: -0.01}"), &ev, &h).passed);
        let missing = evaluate(&gate("{field: r.nope, equals: 1}"), &ev, &h);
        assert!(!missing.passed && missing.detail.contains("not found"));
    }

    /// A criterion written as NaN or an infinity: `equals: .nan` read as
    /// JSON was `equals: null` (so a metric written as null passed it), and
    /// `at_least: .nan` could never pass. Both are refused naming the gate.
    #[test]
    fn a_criterion_json_cannot_hold_is_refused_naming_the_gate() {
        for (check, said) in [
            ("{field: m.loss, equals: .nan}", "check.equals"),
            ("{field: m.loss, equals: [1, -.inf]}", "check.equals"),
            ("{field: m.loss, at_least: .nan}", "check.at_least"),
            ("{field: m.loss, at_most: .NaN}", "check.at_most"),
        ] {
            let e = one_gate_file("loss-ok", check).expect_err(check).to_string();
            assert!(e.contains("loss-ok") && e.contains(said), "{check}: {e}");
        }
        // An infinite bound is a bound: at_most: .inf holds for every finite value.
        assert!(one_gate_file("loss-ok", "{field: m.loss, at_most: .inf}").is_ok());
    }

    /// NaN equals nothing, itself included, as in Python (`float('nan') ==
    /// float('nan')` is False): a diverged run whose `matched` and `total`
    /// are both NaN does not pass `matched equals_field total`. Before, the
    /// two NaNs, kept as one marker, compared equal and the gate passed.
    /// An infinity equals the same infinity, as in Python.
    #[test]
    fn nan_equals_nothing_not_even_nan() {
        let doc = crate::docfile::parse(
            crate::docfile::Format::Json,
            r#"{"a": NaN, "b": NaN, "i": Infinity, "j": Infinity, "k": -Infinity, "l": [NaN], "m": [NaN]}"#,
        )
        .unwrap();
        let ev: BTreeMap<String, Value> = [("m".to_string(), doc)].into();
        let h = BTreeMap::new();
        for (check, passes) in [
            ("{field: m.a, equals_field: m.b}", false),
            ("{field: m.a, equals_field: m.a}", false),
            ("{field: m.l, equals_field: m.m}", false),
            ("{field: m.i, equals_field: m.j}", true),
            ("{field: m.i, equals_field: m.k}", false),
        ] {
            let r = evaluate(&gate(check), &ev, &h);
            assert_eq!(r.passed, passes, "{check}: {}", r.detail);
        }
    }

    /// A metric whose own name holds a dot (`{"eval.acc": 0.5}`, as a tool
    /// that flattens its metrics writes) is named by quoting that segment:
    /// `m."eval.acc"`. Before, a field was split at every dot, so no path
    /// could name it and its gate failed "not found".
    #[test]
    fn a_quoted_segment_names_a_key_that_holds_dots() {
        let ev: BTreeMap<String, Value> =
            [("m".to_string(), json!({"eval.acc": 0.5, "eval": {"acc": 0.1}, "a\"b": 2, "": 3}))].into();
        let h = BTreeMap::new();
        for (check, passes) in [
            (r#"{field: 'm."eval.acc"', at_least: 0.4}"#, true),
            ("{field: m.eval.acc, at_least: 0.4}", false),
            (r#"{field: 'm."eval".acc', equals: 0.1}"#, true),
            (r#"{field: '"m"."eval.acc"', equals_field: 'm."eval.acc"'}"#, true),
            (r#"{margin: {a: 'm."eval.acc"', b: m.eval.acc}, at_least: 0.39}"#, true),
            (r#"{field: 'm."a\"b"', equals: 2}"#, true),
            (r#"{field: 'm.""', equals: 3}"#, true),
        ] {
            let r = evaluate(&gate(check), &ev, &h);
            assert_eq!(r.passed, passes, "{check}: {}", r.detail);
        }
        // A path that cannot be read is refused when the gate file is read, naming the gate.
        for (check, said) in [
            (r#"{field: 'm."eval.acc', at_least: 0}"#, "check.field"),
            (r#"{field: 'm."eval"acc', at_least: 0}"#, "check.field"),
            ("{field: m..acc, at_least: 0}", "check.field"),
            ("{field: m.acc., at_least: 0}", "check.field"),
            (r#"{field: m.acc, equals_field: 'm."n'}"#, "check.equals_field"),
            (r#"{margin: {a: m.a, b: 'm."b'}, at_least: 0}"#, "check.margin.b"),
        ] {
            let e = one_gate_file("acc-ok", check).expect_err(check).to_string();
            assert!(e.contains("acc-ok") && e.contains(said), "{check}: {e}");
        }
    }

    /// `equals` compares numbers as numbers, as Python's `==` does: a
    /// metric a program wrote as `0.0` (what `json.dump` writes for a float)
    /// equals a gate's `0`. Before, JSON's 0.0 and 0 differed, so such a
    /// gate failed ("m.errors = 0.0, required = 0") in the run and the audit.
    #[test]
    fn equals_compares_numbers_as_numbers_in_lists_and_objects_too() {
        let ev: BTreeMap<String, Value> = [(
            "m".to_string(),
            json!({"errors": 0.0, "acc": 1.0, "n": 200, "big": 9007199254740993u64, "list": [1.0, 2], "obj": {"a": 3.0}, "t": true}),
        )]
        .into();
        let h = BTreeMap::new();
        for (check, passes) in [
            ("{field: m.errors, equals: 0}", true),
            ("{field: m.acc, equals: 1}", true),
            ("{field: m.n, equals: 200.0}", true),
            ("{field: m.list, equals: [1, 2.0]}", true),
            ("{field: m.obj, equals: {a: 3}}", true),
            ("{field: m.n, equals_field: m.n}", true),
            ("{field: m.acc, equals: 0.999}", false),
            ("{field: m.list, equals: [1, 2, 3]}", false),
            ("{field: m.obj, equals: {a: 3, b: 1}}", false),
            ("{field: m.t, equals: 1}", false),
            ("{field: m.errors, equals: '0'}", false),
            // Integers past 2^53 are compared exactly, not through a float.
            ("{field: m.big, equals: 9007199254740992}", false),
            ("{field: m.big, equals: 9007199254740993}", true),
        ] {
            let r = evaluate(&gate(check), &ev, &h);
            assert_eq!(r.passed, passes, "{check}: {}", r.detail);
        }
    }
}

//! Reading spec files: `extends:`, profiles, `--set`, typed checking, matrix expansion.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::{did_you_mean, Location, SpecError, SpecErrorKind};
use super::locate::Locator;
use super::{matrix_value_label, AxisValue, MatrixAxis, NodeDef, OutputRef, Spec, SpecDoc};

/// Choices made on the command line.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub profile: Option<String>,
    pub overrides: Vec<Override>,
    /// `--executor`: instead of the spec's `executor:`.
    pub executor: Option<super::ExecutorKind>,
    /// `--partition`, `--gpus`, …: laid over every node's own `resources:`
    /// (what the command line gives wins, field by field).
    pub resources: Option<super::SlurmResources>,
    /// The workspace's parse cache: spec files read before are not parsed
    /// again (`None`: every file is parsed).
    pub parsed: Option<std::sync::Arc<super::parsed::ParseCache>>,
}

/// One `--set path.to.key=value` (the value is read as YAML: `1e-3`, `[2, 4]`, `true`).
#[derive(Debug, Clone)]
pub struct Override {
    pub path: Vec<String>,
    pub raw: String,
    pub value: Value,
}

impl Override {
    pub fn parse(arg: &str) -> Result<Self, SpecError> {
        let at = Location::file(format!("--set {arg}"), None);
        let Some((path, value)) = arg.split_once('=') else {
            return Err(SpecError::new(
                SpecErrorKind::Override,
                at,
                "expected PATH=VALUE, e.g. nodes.grpo.params.lr=1e-6",
            ));
        };
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if segments.iter().any(String::is_empty) {
            return Err(SpecError::new(
                SpecErrorKind::Override,
                at,
                format!("'{path}' has an empty segment; expected dot-separated keys"),
            ));
        }
        if matches!(segments[0].as_str(), "extends" | "profiles") {
            return Err(SpecError::new(
                SpecErrorKind::Override,
                at,
                format!(
                    "'{}' cannot be set with --set: it is read before overrides apply. Write it in the spec{}",
                    segments[0],
                    if segments[0] == "profiles" { ", or choose a profile with --profile" } else { "" }
                ),
            ));
        }
        if super::locate::too_deep(value).is_some() {
            return Err(SpecError::new(
                SpecErrorKind::Override,
                at,
                format!("the value nests deeper than {} levels", super::locate::MAX_DEPTH),
            ));
        }
        let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(value).map_err(|e| {
            SpecError::new(SpecErrorKind::Override, at.clone(), format!("value '{value}' is not valid YAML: {e}"))
        })?;
        if let Some((inner, spelled)) = non_finite_at(&yaml) {
            let full: Vec<String> = segments.iter().cloned().chain(inner).collect();
            return Err(SpecError::new(SpecErrorKind::Override, at, non_finite_message(&full, spelled)));
        }
        let value = serde_json::to_value(yaml)
            .map_err(|e| SpecError::new(SpecErrorKind::Override, at, format!("value '{value}': {e}")))?;
        Ok(Override { path: segments, raw: arg.to_string(), value })
    }
}

struct Layer {
    file: String,
    locator: Locator,
    prefix: Vec<String>,
}

/// Where each part of a merged spec came from, in order of precedence, so an
/// error found after merging still names the file, line and column that wrote it.
#[derive(Default)]
pub struct Sources {
    layers: Vec<Layer>,
    overrides: Vec<Override>,
}

impl Sources {
    /// The `--set` overrides applied, in order.
    pub fn overrides(&self) -> &[Override] {
        &self.overrides
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.layers.iter().map(|l| (&l.file, &l.prefix))).finish()
    }
}

impl Clone for Sources {
    fn clone(&self) -> Self {
        Sources {
            layers: self
                .layers
                .iter()
                .map(|l| Layer { file: l.file.clone(), locator: l.locator.clone(), prefix: l.prefix.clone() })
                .collect(),
            overrides: self.overrides.clone(),
        }
    }
}

impl Sources {
    /// Locates a path of the merged document, pointing at its key.
    pub fn locate(&self, path: &[String]) -> Location {
        self.find(path, false)
    }

    /// Locates a path of the merged document, pointing at its value.
    pub fn locate_value(&self, path: &[String]) -> Location {
        self.find(path, true)
    }

    fn find(&self, path: &[String], value: bool) -> Location {
        for o in &self.overrides {
            if path.starts_with(&o.path) {
                return Location::file(format!("--set {}", o.raw), None);
            }
        }
        // The deepest written ancestor wins, so a missing key points at its parent.
        for depth in (0..=path.len()).rev() {
            let sub = &path[..depth];
            for layer in &self.layers {
                let full: Vec<String> = layer.prefix.iter().chain(sub).cloned().collect();
                if layer.locator.has(&full) {
                    let pos = if value { layer.locator.value(&full) } else { layer.locator.key(&full) };
                    return Location::file(layer.file.clone(), pos);
                }
            }
        }
        Location::file(self.layers.last().map(|l| l.file.clone()).unwrap_or_default(), None)
    }
}

struct FileDoc {
    display: String,
    locator: Locator,
}

/// Loads a spec file with the given profile and overrides.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Spec, SpecError> {
    let mut files = Vec::new();
    let mut chain = Vec::new();
    let parsed = opts.parsed.as_deref();
    let mut merged = read_with_extends(path, &mut files, &mut chain, parsed)?;

    let mut sources = Sources::default();
    if let Some(profile) = &opts.profile {
        let prefix = vec!["profiles".to_string(), profile.clone()];
        let overlay = merged.get("profiles").and_then(|p| p.get(profile)).cloned();
        let Some(overlay) = overlay else {
            let known: Vec<String> = merged
                .get("profiles")
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            let listed = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            return Err(SpecError::new(
                SpecErrorKind::Profile,
                Location::file(files[0].display.clone(), None),
                format!(
                    "no profile '{profile}'{}; profiles in this spec: {listed}",
                    did_you_mean(profile, known.iter().map(String::as_str))
                ),
            ));
        };
        if let Some(obj) = overlay.as_object() {
            for forbidden in ["profiles", "extends"] {
                if obj.contains_key(forbidden) {
                    let mut p = prefix.clone();
                    p.push(forbidden.to_string());
                    let at = files.iter().find(|f| f.locator.has(&p)).map_or_else(
                        || Location::file(files[0].display.clone(), None),
                        |f| Location::file(f.display.clone(), f.locator.key(&p)),
                    );
                    return Err(SpecError::new(
                        SpecErrorKind::Profile,
                        at,
                        format!("a profile cannot set '{forbidden}'"),
                    ));
                }
            }
        }
        deep_merge(&mut merged, overlay);
        for f in &files {
            sources.layers.push(Layer { file: f.display.clone(), locator: f.locator.clone(), prefix: prefix.clone() });
        }
    }
    for f in files {
        sources.layers.push(Layer { file: f.display, locator: f.locator, prefix: Vec::new() });
    }

    for o in &opts.overrides {
        apply_override(&mut merged, o)?;
    }
    sources.overrides = opts.overrides.clone();

    let doc: SpecDoc = crate::canonical::from_value(&merged).map_err(|e| typed_error(e, &sources))?;
    let nodes = expand(&doc, &sources)?;
    let mut nodes = nodes;
    if let Some(over) = &opts.resources {
        for node in &mut nodes {
            node.resources = over.over(&node.resources);
        }
    }
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok(Spec {
        name: doc.name,
        path: path.to_path_buf(),
        files: chain,
        base_dir: if base_dir.as_os_str().is_empty() { PathBuf::from(".") } else { base_dir },
        profile: opts.profile.clone(),
        executor: opts.executor.unwrap_or(doc.executor),
        resolved: merged,
        nodes,
        sources,
    })
}

/// The largest spec file read (a real one is a few KB).
pub const MAX_SPEC_BYTES: u64 = 4 << 20;

/// A spec file's text: a regular file (a FIFO, a device or a folder is said
/// as such, not as "no such file"), at most [`MAX_SPEC_BYTES`], UTF-8.
fn read_spec_text(path: &Path) -> Result<String, String> {
    use crate::fsread::{open_regular, read_opened, OpenedReadError};
    // Opened first, then checked on the descriptor: what is read is what was
    // checked (a FIFO swapped in after a check by path would be waited on).
    let file = open_regular(path, 0).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) => {
            "is a folder, not a spec file".to_string()
        }
        std::io::ErrorKind::InvalidInput => {
            "is not a regular file (a FIFO, a device or a socket): a spec is a YAML file".to_string()
        }
        _ => format!("cannot read: {e}"),
    })?;
    let bytes = read_opened(file, MAX_SPEC_BYTES).map_err(|e| match e {
        OpenedReadError::TooLarge(n) => format!("is {n} bytes, over the limit of {MAX_SPEC_BYTES} for a spec"),
        OpenedReadError::Io(e) => format!("cannot read: {e}"),
    })?;
    String::from_utf8(bytes)
        .map_err(|e| format!("is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()))
}

fn read_with_extends(
    path: &Path,
    files: &mut Vec<FileDoc>,
    chain: &mut Vec<PathBuf>,
    parsed: Option<&super::parsed::ParseCache>,
) -> Result<Value, SpecError> {
    let display = path.display().to_string();
    let text = read_spec_text(path)
        .map_err(|why| SpecError::new(SpecErrorKind::Io, Location::file(display.clone(), None), why))?;
    // A text parsed before (without error) is read from the cache; the
    // checks below then come in the order they always do.
    let cached = parsed.and_then(|c| c.get(&text));
    if cached.is_none() {
        if let Some(pos) = super::locate::too_deep(&text) {
            return Err(SpecError::new(
                SpecErrorKind::Syntax,
                Location::file(display, Some(pos)),
                format!("the YAML nests deeper than {} levels here; a spec never needs that", super::locate::MAX_DEPTH),
            ));
        }
    }
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    if chain.contains(&canonical) {
        let names: Vec<String> = chain.iter().chain([&canonical]).map(|p| p.display().to_string()).collect();
        return Err(SpecError::new(
            SpecErrorKind::Extends,
            Location::file(display, None),
            format!("extends cycle: {}", names.join(" → ")),
        ));
    }
    chain.push(canonical);
    let doc = match cached {
        // A mapping: only those are kept.
        Some(doc) => doc,
        None => {
            let doc = parse_yaml(&text, &display)?;
            if !doc.is_object() {
                return Err(SpecError::new(
                    SpecErrorKind::WrongType,
                    Location::file(display, Some(super::locate::Pos { line: 1, col: 1 })),
                    "expected a mapping with at least `name` and `nodes`",
                ));
            }
            if let Some(cache) = parsed {
                cache.remember(&text, &doc);
            }
            doc
        }
    };
    let locator = Locator::new(&text);
    let extends = doc.get("extends").cloned();
    // Where `extends` was written, for its errors only (locating parses the file again).
    let at_extends = {
        let (display, locator) = (display.clone(), locator.clone());
        move || Location::file(display, locator.value(&["extends".to_string()]))
    };
    files.push(FileDoc { display, locator });

    match extends {
        None | Some(Value::Null) => Ok(doc),
        Some(Value::String(parent)) => {
            let parent_path = path.parent().unwrap_or(Path::new(".")).join(&parent);
            if let Err(why) = std::fs::metadata(&parent_path).map_err(|_| "no such file".to_string()).and_then(|m| {
                if m.is_dir() {
                    Err("is a folder, not a spec file".to_string())
                } else if !m.is_file() {
                    Err("is not a regular file (a FIFO, a device or a socket)".to_string())
                } else {
                    Ok(())
                }
            }) {
                return Err(SpecError::new(
                    SpecErrorKind::Extends,
                    at_extends(),
                    format!("extends '{parent}': {why}: {}", parent_path.display()),
                ));
            }
            let mut base = read_with_extends(&parent_path, files, chain, parsed)?;
            deep_merge(&mut base, doc);
            Ok(base)
        }
        Some(_) => Err(SpecError::new(SpecErrorKind::WrongType, at_extends(), "extends: expected a file path")),
    }
}

/// A spec file's text as a JSON document: YAML, with merge keys (`<<:
/// *anchor`) applied as users of anchors expect. What the parse cache keeps.
fn parse_yaml(text: &str, display: &str) -> Result<Value, SpecError> {
    if let Some(direct) = super::yaml_json::parse(text) {
        return Ok(direct);
    }
    let yaml: serde_yaml_ng::Value = match serde_yaml_ng::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let locator = Locator::new(text);
            // A repeated key in `nodes:` is the usual way to write a duplicate node id;
            // point at the second definition, which serde's error does not.
            if let Some((path, first, second)) = locator.first_duplicate() {
                let (what, name) = match path.as_slice() {
                    [n, id] if n == "nodes" => ("node id".to_string(), id.clone()),
                    _ => ("key".to_string(), path.join(".")),
                };
                return Err(SpecError::new(
                    SpecErrorKind::DuplicateId,
                    Location::file(display.to_string(), Some(*second)),
                    format!("duplicate {what} '{name}' (first defined at line {}, column {})", first.line, first.col),
                ));
            }
            let pos = e.location().map(|l| super::locate::Pos { line: l.line(), col: l.column() });
            return Err(SpecError::new(
                SpecErrorKind::Syntax,
                Location::file(display.to_string(), pos),
                format!("invalid YAML: {e}"),
            ));
        }
    };
    if let Some((mut path, spelled)) = non_finite_at(&yaml) {
        // The value's line, or that of the nearest key above it (a list item has none of its own).
        let locator = Locator::new(text);
        let full = path.clone();
        let pos = loop {
            if let Some(pos) = locator.value(&path) {
                break Some(pos);
            }
            if path.pop().is_none() {
                break None;
            }
        };
        return Err(SpecError::new(
            SpecErrorKind::WrongType,
            Location::file(display.to_string(), pos),
            non_finite_message(&full, spelled),
        ));
    }
    let mut yaml = yaml;
    yaml.apply_merge().map_err(|e| {
        SpecError::new(
            SpecErrorKind::Syntax,
            Location::file(display.to_string(), None),
            format!("invalid merge key (<<): {e}"),
        )
    })?;
    serde_json::to_value(&yaml).map_err(|e| {
        SpecError::new(
            SpecErrorKind::Syntax,
            Location::file(display.to_string(), None),
            format!("unsupported YAML: {e}"),
        )
    })
}

/// The first number in a YAML document that JSON cannot hold (`.inf`,
/// `-.inf`, `.nan`), with its path and how YAML writes it. Read into JSON
/// it would be `null`: said as null, one matrix value with another, and, in
/// a file that extends another or a `--set`, a merge's "remove this key".
fn non_finite_at(yaml: &serde_yaml_ng::Value) -> Option<(Vec<String>, &'static str)> {
    use serde_yaml_ng::Value as Yaml;
    let under = |segment: String, v: &Yaml| {
        non_finite_at(v).map(|(mut path, spelled)| {
            path.insert(0, segment);
            (path, spelled)
        })
    };
    match yaml {
        Yaml::Number(n) => match n.as_f64() {
            Some(x) if x.is_nan() => Some((Vec::new(), ".nan")),
            Some(x) if x.is_infinite() => Some((Vec::new(), if x > 0.0 { ".inf" } else { "-.inf" })),
            _ => None,
        },
        Yaml::Sequence(items) => items.iter().enumerate().find_map(|(i, v)| under(i.to_string(), v)),
        Yaml::Mapping(map) => map.iter().find_map(|(k, v)| {
            let key = match k {
                Yaml::String(s) => s.clone(),
                other => serde_yaml_ng::to_string(other).unwrap_or_default().trim_end().to_string(),
            };
            under(key, v)
        }),
        Yaml::Tagged(tagged) => non_finite_at(&tagged.value),
        _ => None,
    }
}

fn non_finite_message(path: &[String], spelled: &str) -> String {
    format!(
        "{} is {spelled}, a number JSON cannot hold: the spec is read as JSON, where it would be null (and a null \
         in a file that extends another, or in --set, removes the key it sets). Write a finite number, or a string",
        path.join(".")
    )
}

/// Merges `overlay` into `base`: mappings recursively, anything else replaced;
/// a `null` in the overlay removes the key.
pub fn deep_merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(&k);
                } else if let Some(existing) = b.get_mut(&k) {
                    deep_merge(existing, v);
                } else {
                    b.insert(k, v);
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// The keys an override walks: a matrix axis is one key even when dotted
/// (`nodes.train.matrix.env.LR` sets the axis `env.LR`), unless the matrix
/// has a key named by the first segment alone.
fn override_path(doc: &Value, path: &[String]) -> Vec<String> {
    if path.len() > 4 && path[0] == "nodes" && path[2] == "matrix" {
        let matrix = doc.get("nodes").and_then(|n| n.get(&path[1])).and_then(|n| n.get("matrix"));
        if matrix.is_none_or(|m| m.get(&path[3]).is_none()) {
            let mut out = path[..3].to_vec();
            out.push(path[3..].join("."));
            return out;
        }
    }
    path.to_vec()
}

fn apply_override(doc: &mut Value, o: &Override) -> Result<(), SpecError> {
    let at = || Location::file(format!("--set {}", o.raw), None);
    let path = override_path(doc, &o.path);
    let (last, parents) = path.split_last().expect("parse rejects an empty path");
    let mut cur = doc;
    let mut walked = Vec::new();
    for seg in parents {
        let Value::Object(map) = cur else {
            return Err(SpecError::new(
                SpecErrorKind::Override,
                at(),
                format!("'{}' is not a mapping, so it has no key '{seg}'", walked.join(".")),
            ));
        };
        let keys: Vec<String> = map.keys().cloned().collect();
        match map.get_mut(seg) {
            Some(next) => cur = next,
            None => {
                let place =
                    if walked.is_empty() { "the top level".to_string() } else { format!("'{}'", walked.join(".")) };
                return Err(SpecError::new(
                    SpecErrorKind::Override,
                    at(),
                    format!(
                        "no key '{seg}' under {place}{}; keys there: {}",
                        did_you_mean(seg, keys.iter().map(String::as_str)),
                        keys.join(", ")
                    ),
                ));
            }
        }
        walked.push(seg.clone());
    }
    match cur {
        // `null` removes a key, as it does in a profile or an extending spec.
        Value::Object(map) if o.value.is_null() => {
            if map.remove(last).is_none() {
                let keys: Vec<String> = map.keys().cloned().collect();
                return Err(SpecError::new(
                    SpecErrorKind::Override,
                    at(),
                    format!(
                        "no key '{last}' to remove{}; keys there: {}",
                        did_you_mean(last, keys.iter().map(String::as_str)),
                        keys.join(", ")
                    ),
                ));
            }
            Ok(())
        }
        Value::Object(map) => {
            map.insert(last.clone(), o.value.clone());
            Ok(())
        }
        _ => Err(SpecError::new(
            SpecErrorKind::Override,
            at(),
            format!("'{}' is not a mapping, so it has no key '{last}'", walked.join(".")),
        )),
    }
}

fn typed_error(e: serde_path_to_error::Error<serde_json::Error>, sources: &Sources) -> SpecError {
    let mut path: Vec<String> = Vec::new();
    for seg in e.path().iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => path.push(index.to_string()),
            serde_path_to_error::Segment::Map { key } => path.push(key.clone()),
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
        }
    }
    let inner = e.inner().to_string();
    let place = describe(&path);
    if let Some(rest) = inner.strip_prefix("unknown field `") {
        let name = rest.split('`').next().unwrap_or_default().to_string();
        let expected: Vec<&str> = rest.split('`').skip(2).step_by(2).collect();
        if path.last() != Some(&name) {
            path.push(name.clone());
        }
        return SpecError::new(
            SpecErrorKind::UnknownKey,
            sources.locate(&path),
            format!(
                "unknown key '{name}'{}{}; expected one of: {}",
                place,
                did_you_mean(&name, expected.iter().copied()),
                expected.join(", ")
            ),
        );
    }
    if let Some(rest) = inner.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or_default();
        return SpecError::new(
            SpecErrorKind::MissingField,
            sources.locate(&path),
            format!("missing required key '{name}'{place}"),
        );
    }
    let message = if inner.contains("untagged enum InputRefs") {
        "expected NODE:OUTPUT or a list of them".to_string()
    } else {
        inner
    };
    SpecError::new(SpecErrorKind::WrongType, sources.locate_value(&path), format!("{}: {message}", path.join(".")))
}

fn describe(path: &[String]) -> String {
    match path {
        [n, id, ..] if n == "nodes" => format!(" in node '{id}'"),
        [] => " at the top level".to_string(),
        _ => format!(" in '{}'", path.join(".")),
    }
}

/// The most nodes a spec may expand to (matrices included): a 1000 × 1000
/// matrix, 8 KB of YAML, took 35 s and 7.8 GB to plan.
pub const MAX_NODES: usize = 100_000;

/// The axes a `matrix: {from: NODE}` follows: NODE's own axes (and those it
/// follows in turn), each as labels only.
fn followed_axes(doc: &SpecDoc, from: &str, upstream: &str) -> Result<BTreeMap<String, Vec<AxisValue>>, String> {
    let mut out = BTreeMap::new();
    let mut at = upstream.to_string();
    let mut seen = vec![from.to_string()];
    loop {
        if seen.contains(&at) {
            return Err(format!("following matrices goes round in a circle ({} → {at})", seen.join(" → ")));
        }
        let Some(node) = doc.nodes.get(&at) else {
            return Err(format!(
                "no node '{at}' to follow{}",
                crate::suggest::did_you_mean(&at, doc.nodes.keys().map(String::as_str))
            ));
        };
        seen.push(at.clone());
        let mut next = None;
        for (axis, written) in &node.matrix {
            match written {
                MatrixAxis::From(n) if axis == super::MATRIX_FROM => next = Some(n.clone()),
                _ => {
                    let values = written.values().map_err(|why| format!("its axis '{axis}': {why}"))?;
                    let labels = values.into_iter().map(|v| AxisValue { label: v.label, param: None }).collect();
                    out.entry(axis.clone()).or_insert(labels);
                }
            }
        }
        match next {
            Some(n) => at = n,
            None => break,
        }
    }
    if out.is_empty() {
        return Err(format!("'{upstream}' has no matrix to follow"));
    }
    Ok(out)
}

fn expand(doc: &SpecDoc, sources: &Sources) -> Result<Vec<NodeDef>, SpecError> {
    let mut out: BTreeMap<String, NodeDef> = BTreeMap::new();
    let mut expanded = 0usize;
    for (base_id, node) in &doc.nodes {
        let node_path = |rest: &[&str]| -> Vec<String> {
            ["nodes", base_id.as_str()].iter().chain(rest).map(|s| s.to_string()).collect()
        };
        if let Some(why) = crate::ids::base_id_problem(base_id) {
            return Err(SpecError::new(
                SpecErrorKind::WrongType,
                sources.locate(&node_path(&[])),
                format!("node id '{}': {why}", crate::ids::escaped(base_id)),
            ));
        }
        for (axis, written) in &node.matrix {
            if written.sets_param() && get_dotted(&Value::Object(node.params.clone()), axis).is_some() {
                return Err(SpecError::new(
                    SpecErrorKind::DuplicateId,
                    sources.locate(&node_path(&["matrix", axis])),
                    format!("matrix axis '{axis}' of node '{base_id}' is also set in its params; set it in one place"),
                ));
            }
        }
        let mut axes: BTreeMap<String, Vec<AxisValue>> = BTreeMap::new();
        for (axis, written) in &node.matrix {
            if axis == super::MATRIX_FROM {
                if let MatrixAxis::From(upstream) = written {
                    let followed = followed_axes(doc, base_id, upstream).map_err(|why| {
                        SpecError::new(
                            SpecErrorKind::MissingReference,
                            sources.locate(&node_path(&["matrix", axis])),
                            format!("node '{base_id}' matrix {}: {upstream}: {why}", super::MATRIX_FROM),
                        )
                    })?;
                    for (a, values) in followed {
                        if node.matrix.contains_key(&a) {
                            return Err(SpecError::new(
                                SpecErrorKind::DuplicateId,
                                sources.locate(&node_path(&["matrix", &a])),
                                format!("matrix axis '{a}' of node '{base_id}' is also followed from '{upstream}'; give it in one place"),
                            ));
                        }
                        axes.insert(a, values);
                    }
                    continue;
                }
            }
            let values = written.values().map_err(|why| {
                SpecError::new(
                    SpecErrorKind::Constraint,
                    sources.locate(&node_path(&["matrix", axis])),
                    format!("matrix axis '{axis}' of node '{base_id}': {why}"),
                )
            })?;
            axes.insert(axis.clone(), values);
        }
        let count = axes.values().try_fold(1usize, |n, v| n.checked_mul(v.len().max(1))).unwrap_or(usize::MAX);
        expanded = expanded.saturating_add(count);
        if expanded > MAX_NODES {
            return Err(SpecError::new(
                SpecErrorKind::Constraint,
                sources.locate(&node_path(&["matrix"])),
                format!(
                    "the matrix of node '{base_id}' expands to {} nodes ({} in the spec so far), over the limit of \
                     {MAX_NODES} nodes a spec may have",
                    if count == usize::MAX { "more than 2^64".to_string() } else { count.to_string() },
                    if expanded == usize::MAX { "more than 2^64".to_string() } else { expanded.to_string() },
                ),
            ));
        }
        for chosen in cartesian(&axes) {
            let binding: BTreeMap<String, Value> = chosen.iter().map(|(k, v)| (k.clone(), v.label.clone())).collect();
            let id = if binding.is_empty() {
                base_id.clone()
            } else {
                let parts: Vec<String> =
                    binding.iter().map(|(k, v)| format!("{k}={}", matrix_value_label(v))).collect();
                format!("{base_id}@{}", parts.join(","))
            };
            if let Some(why) = crate::ids::id_problem(&id) {
                return Err(SpecError::new(
                    SpecErrorKind::Constraint,
                    sources.locate(&node_path(&["matrix"])),
                    format!("node id '{}' (an expansion of '{base_id}'): {why}", crate::ids::escaped(&id)),
                ));
            }
            let mut params = Value::Object(node.params.clone());
            for (axis, v) in &chosen {
                if let Some(p) = &v.param {
                    set_dotted(&mut params, axis, p.clone());
                }
            }
            if !binding.is_empty() {
                interpolate(&mut params, &binding).map_err(|unknown| {
                    SpecError::new(
                        SpecErrorKind::MissingReference,
                        sources.locate(&node_path(&["params"])),
                        format!(
                            "node '{base_id}' uses ${{matrix.{unknown}}} but its matrix axes are: {}",
                            binding.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    )
                })?;
            }
            let mut inputs = BTreeMap::new();
            for (name, refs) in &node.inputs {
                let mut parsed = Vec::new();
                for (i, written) in refs.as_slice().iter().enumerate() {
                    let mut p = node_path(&["inputs", name]);
                    if matches!(refs, super::InputRefs::Many(_)) {
                        p.push(i.to_string());
                    }
                    let mut r = Value::String(written.clone());
                    interpolate(&mut r, &binding).map_err(|unknown| {
                        SpecError::new(
                            SpecErrorKind::MissingReference,
                            sources.locate_value(&p),
                            format!("input '{name}' of node '{base_id}' uses ${{matrix.{unknown}}}, which is not an axis of its matrix"),
                        )
                    })?;
                    let r = r.as_str().unwrap_or_default().to_string();
                    let Some((n, o)) = r.split_once(':') else {
                        return Err(SpecError::new(
                            SpecErrorKind::WrongType,
                            sources.locate_value(&p),
                            format!(
                                "input '{name}' of node '{base_id}': '{r}' is not NODE:OUTPUT (inputs are other nodes' outputs; a file of yours is read by a `dataset.import` node's `files`, or is a `shell` node's `deps`)"
                            ),
                        ));
                    };
                    parsed.push(OutputRef { node: n.to_string(), output: o.to_string() });
                }
                inputs.insert(name.clone(), parsed);
            }
            let def = NodeDef {
                id: id.clone(),
                base_id: base_id.clone(),
                op: node.op.clone(),
                params,
                inputs,
                binding,
                resources: node.resources.over(&doc.slurm),
                threads: node.threads,
            };
            if out.insert(id.clone(), def).is_some() {
                return Err(SpecError::new(
                    SpecErrorKind::DuplicateId,
                    sources.locate(&node_path(&["matrix"])),
                    format!("node id '{id}' is produced twice (a repeated matrix value, or a node already named so)"),
                ));
            }
        }
    }
    Ok(out.into_values().collect())
}

/// Sets `a.b.c` inside an object, creating intermediate objects.
fn set_dotted(root: &mut Value, dotted: &str, value: Value) {
    let mut cur = root;
    let parts: Vec<&str> = dotted.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let Value::Object(map) = cur else { return };
        if i + 1 == parts.len() {
            map.insert(part.to_string(), value);
            return;
        }
        cur = map.entry(part.to_string()).or_insert_with(|| Value::Object(Default::default()));
    }
}

fn get_dotted<'a>(root: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(root, |cur, part| cur.get(part))
}

/// Replaces `${matrix.AXIS}` in every string with the axis value; `Err(axis)`
/// names an axis the node does not have.
fn interpolate(v: &mut Value, binding: &BTreeMap<String, Value>) -> Result<(), String> {
    match v {
        Value::String(s) => {
            let mut out = String::with_capacity(s.len());
            let mut rest = s.as_str();
            while let Some(start) = rest.find("${matrix.") {
                out.push_str(&rest[..start]);
                let after = &rest[start + "${matrix.".len()..];
                let Some(end) = after.find('}') else {
                    out.push_str(&rest[start..]);
                    rest = "";
                    break;
                };
                let axis = &after[..end];
                let value = binding.get(axis).ok_or_else(|| axis.to_string())?;
                out.push_str(&matrix_value_label(value));
                rest = &after[end + 1..];
            }
            out.push_str(rest);
            *s = out;
        }
        Value::Array(items) => items.iter_mut().try_for_each(|i| interpolate(i, binding))?,
        Value::Object(map) => map.values_mut().try_for_each(|i| interpolate(i, binding))?,
        _ => {}
    }
    Ok(())
}

fn cartesian<T: Clone>(matrix: &BTreeMap<String, Vec<T>>) -> Vec<BTreeMap<String, T>> {
    let mut combos = vec![BTreeMap::new()];
    for (axis, values) in matrix {
        let mut next = Vec::with_capacity(combos.len() * values.len());
        for combo in &combos {
            for v in values {
                let mut c: BTreeMap<String, T> = combo.clone();
                c.insert(axis.clone(), v.clone());
                next.push(c);
            }
        }
        combos = next;
    }
    combos
}

//! Node keys: the one place that decides what a node's result depends on.
//!
//! A key is blake3 over the canonical encoding of a [`HashInputs`] record:
//!
//! | field        | what goes in                                                        |
//! |--------------|---------------------------------------------------------------------|
//! | `op`         | the op's name                                                       |
//! | `op_version` | the op's version (bumped when the same inputs give other results)   |
//! | `params`     | the node's params, keys sorted at every level, numbers normalized   |
//! | `inputs`     | for each input name, the *content hash* of each referenced output   |
//! | `files`      | for each declared file dep (relative path), the blake3 of its bytes |
//! | `interpreters` | a program's interpreter (`python3`) → its `--version` line       |
//! | `env`        | numerical ops only: device, libtorch, CPU capability and vendor      |
//!
//! Inputs enter by content, not by the upstream key, so an upstream re-run that
//! reproduces identical bytes leaves everything downstream cached. Never in a
//! key: a time, an absolute or temporary path, a map in iteration order, the
//! node's id (renaming a node keeps its cache).
//!
//! The record is stored beside the key so `plan` and `explain` can say which
//! field changed and how.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

pub use crate::record::{EnvPart, HashInputs, Key};

pub use crate::canonical::canonical_json;

/// One field that differs between two records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Dotted path: `params.lr`, `inputs.data`, `files.data/raw.csv`, `env.device`.
    pub field: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".to_string());
        write!(f, "{}: {} → {}", self.field, show(&self.old), show(&self.new))
    }
}

/// The field-level differences between an old and a new record, sorted by field.
pub fn diff(old: &HashInputs, new: &HashInputs) -> Vec<Change> {
    let (a, b) = (fields(old), fields(new));
    let mut fields: Vec<&String> = a.keys().chain(b.keys()).collect();
    fields.sort();
    fields.dedup();
    let changed: Vec<&String> = fields.into_iter().filter(|f| a.get(*f) != b.get(*f)).collect();
    // An empty map or list on one side whose entries are on the other (a
    // record keying its first file: `files: {} → (absent)`): the entries say it.
    let said_by_entries = |f: &str| {
        let empty = |v: Option<&String>| v.is_some_and(|v| v == "{}" || v == "[]");
        (empty(a.get(f)) && !b.contains_key(f) || empty(b.get(f)) && !a.contains_key(f))
            && changed.iter().any(|g| g.len() > f.len() && g.starts_with(f) && g.as_bytes()[f.len()] == b'.')
    };
    changed
        .iter()
        .filter(|f| !said_by_entries(f))
        .map(|f| Change { field: f.to_string(), old: a.get(*f).cloned(), new: b.get(*f).cloned() })
        .collect()
}

/// Separates a tree dep from one of its files in a field name
/// (`trees.data/prepared//train.jsonl`): `//` is in no normalized path.
pub const TREE_FILE_SEP: &str = "//";

pub use crate::docfile::PARAMS_KEY_SEP;

/// A record as dotted field → canonical JSON value (`params.lr` → `0.001`):
/// the fields [`diff`] compares. A tree dep's files are one field each,
/// `trees.DEP//FILE`, so a diff names the files that changed.
pub fn fields(record: &HashInputs) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        map.remove("trees");
        map.remove("params_files");
    }
    flatten("", &value, &mut out);
    for (file, keys) in &record.params_files {
        for (key, v) in keys {
            out.insert(format!("params_files.{file}{PARAMS_KEY_SEP}{key}"), canonical_json(v));
        }
    }
    for (dep, files) in &record.trees {
        for (file, hash) in files {
            out.insert(format!("trees.{dep}{TREE_FILE_SEP}{file}"), canonical_json(&Value::String(hash.clone())));
        }
    }
    out
}

/// Changes as people read them: `input 'data' changed`, `dep 'raw.csv'
/// changed`, `dep 'data/prepared': test.jsonl added, train.jsonl changed`,
/// `params.yaml:train.lr: 0.01 → 0.02`, and other fields as
/// `field: old → new`; joined with `; `.
pub fn describe(changes: &[Change]) -> String {
    describe_each(changes).join("; ")
}

/// What `explain` lists, one line each: every field as [`Change`] shows it
/// (with both hashes), except a folder or glob dep's files, summarised per dep
/// as in [`describe`], and params-file keys, written `FILE:KEY: old → new`.
pub fn explain_lines(changes: &[Change]) -> Vec<String> {
    let (grouped, raw): (Vec<Change>, Vec<Change>) =
        changes.iter().cloned().partition(|c| c.field.starts_with("trees.") || c.field.starts_with("params_files."));
    let mut lines: Vec<String> = raw.iter().map(ToString::to_string).collect();
    lines.extend(describe_each(&grouped));
    lines
}

fn describe_each(changes: &[Change]) -> Vec<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut trees: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in changes {
        match c.field.split_once('.') {
            Some(("inputs", name)) => parts.push(format!("input '{name}' changed")),
            Some(("files", name)) => parts.push(format!("dep '{name}' changed")),
            Some(("params_files", key)) => {
                let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".to_string());
                parts.push(format!("{key}: {} → {}", show(&c.old), show(&c.new)))
            }
            Some(("trees", rest)) => {
                let (dep, file) = rest.split_once(TREE_FILE_SEP).unwrap_or((rest, ""));
                let what = match (&c.old, &c.new) {
                    (None, _) => "added",
                    (_, None) => "removed",
                    _ => "changed",
                };
                trees.entry(dep).or_default().push(format!("{file} {what}"));
            }
            _ => parts.push(c.to_string()),
        }
    }
    for (dep, files) in trees {
        const SHOWN: usize = 10;
        let more = files.len().saturating_sub(SHOWN);
        let mut list = files.into_iter().take(SHOWN).collect::<Vec<_>>().join(", ");
        if more > 0 {
            list.push_str(&format!(" and {more} more"));
        }
        parts.push(format!("dep '{dep}': {list}"));
    }
    parts
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&p, child, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), canonical_json(other));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn record(params: Value) -> HashInputs {
        HashInputs {
            op: "shell".into(),
            op_version: 1,
            params,
            inputs: BTreeMap::new(),
            files: BTreeMap::new(),
            trees: BTreeMap::new(),
            params_files: BTreeMap::new(),
            interpreters: BTreeMap::new(),
            env: None,
        }
    }

    #[test]
    fn a_tree_dep_diff_names_each_file_added_removed_or_changed() {
        let tree = |files: &[(&str, &str)]| {
            let mut r = record(json!({}));
            r.trees.insert("data/prepared".into(), files.iter().map(|(f, h)| (f.to_string(), h.to_string())).collect());
            r
        };
        let old = tree(&[("train.jsonl", "aa"), ("val.jsonl", "bb")]);
        let new = tree(&[("test.jsonl", "cc"), ("train.jsonl", "ab")]);
        assert_ne!(old.key(), new.key());
        assert_eq!(
            describe(&diff(&old, &new)),
            "dep 'data/prepared': test.jsonl added, train.jsonl changed, val.jsonl removed"
        );
        // A record without tree deps keeps the key it had before trees existed.
        let plain = record(json!({"lr": 1}));
        assert!(!serde_json::to_string(&plain).unwrap().contains("trees"));
    }

    #[test]
    fn numerically_equal_params_give_the_same_key() {
        assert_eq!(record(json!({"lr": 1.0})).key(), record(json!({"lr": 1})).key());
        assert_ne!(record(json!({"lr": 1.5})).key(), record(json!({"lr": 1})).key());
    }

    #[test]
    fn diff_names_the_changed_param_with_old_and_new_values() {
        let changes = diff(&record(json!({"lr": 0.001, "g": 4})), &record(json!({"lr": 0.002, "g": 4})));
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].to_string(), "params.lr: 0.001 → 0.002");
    }

    /// An empty map gaining its first entry (or losing its last) is said by
    /// the entry alone: `plan` said `files: {} → (absent); dep 'train.py'
    /// changed` when a record first keyed a file. An empty map that simply
    /// appears or goes, with no entry beside it, is still said.
    #[test]
    fn an_empty_map_gaining_entries_is_said_by_the_entries() {
        let mut keyed = record(json!({"env": {}}));
        keyed.files.insert("train.py".into(), "aa".into());
        assert_eq!(describe(&diff(&record(json!({"env": {}})), &keyed)), "dep 'train.py' changed");
        assert_eq!(describe(&diff(&keyed, &record(json!({"env": {}})))), "dep 'train.py' changed");
        let with_lr = record(json!({"env": {"LR": 1}}));
        assert_eq!(describe(&diff(&record(json!({"env": {}})), &with_lr)), "params.env.LR: (absent) → 1");
        assert_eq!(describe(&diff(&record(json!({})), &record(json!({"env": {}})))), "params.env: (absent) → {}");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i64>().prop_map(Value::from),
            "[a-z]{0,6}".prop_map(Value::from),
            any::<bool>().prop_map(Value::from)
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::vec(("[a-z]{1,4}", inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn reverse_keys(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut entries: Vec<(String, Value)> = m.iter().map(|(k, v)| (k.clone(), reverse_keys(v))).collect();
                entries.reverse();
                let mut out = serde_json::Map::new();
                for (k, v) in entries {
                    out.insert(k, v);
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(reverse_keys).collect()),
            o => o.clone(),
        }
    }

    proptest! {
        #[test]
        fn keys_are_stable_under_key_order(params in arb_json()) {
            prop_assert_eq!(record(params.clone()).key(), record(reverse_keys(&params)).key());
        }

        #[test]
        fn canonical_json_round_trips_to_the_same_value(v in arb_json()) {
            let back: Value = serde_json::from_str(&canonical_json(&v)).unwrap();
            prop_assert_eq!(back, v);
        }
    }
}

//! The JSON Schema of specs, generated from the same Rust types that read them.
//!
//! `schemas/experiment.schema.json` is this output, checked in so editors can
//! complete specs (`# yaml-language-server: $schema=../schemas/experiment.schema.json`);
//! a test fails when it is stale. Each op's params schema is attached to nodes
//! whose `op` names it, so completion works inside `params:` too.

use std::collections::BTreeMap;

use schemars::generate::SchemaSettings;
use serde_json::{json, Value};

use super::{Spec, SpecDoc, SpecError, SpecErrorKind};
use crate::ops::Registry;

/// File name of the generated schema inside `schemas/`.
pub const SCHEMA_FILE: &str = "experiment.schema.json";

/// The full spec schema, op params included.
pub fn spec_schema(registry: &Registry) -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut op_params = BTreeMap::new();
    for op in registry.iter() {
        op_params.insert(op.name(), op.params_schema(&mut generator).to_value());
    }
    let mut root = generator.root_schema_for::<SpecDoc>().to_value();
    if let Some(node) = root.pointer_mut("/$defs/NodeSpec").and_then(Value::as_object_mut) {
        let names: Vec<&str> = op_params.keys().copied().collect();
        if let Some(op) = node.get_mut("properties").and_then(|p| p.get_mut("op")).and_then(Value::as_object_mut) {
            op.insert("enum".into(), json!(names));
        }
        let branches: Vec<Value> = op_params
            .iter()
            .map(|(name, params)| {
                json!({
                    "if": {"properties": {"op": {"const": name}}, "required": ["op"]},
                    "then": {"properties": {"params": params}}
                })
            })
            .collect();
        node.insert("allOf".into(), Value::Array(branches));
    }
    root
}

/// The schema of one op's params as a standalone document, for checking
/// params (not for editors: `schemas/` is draft 2020-12). It is draft-07:
/// the keywords our params use (types, ranges, `const`, `anyOf`) mean the
/// same there, and jsonschema first checks a schema against its draft's
/// meta-schema, which for 2020-12 (its vocabularies and dynamic references)
/// took about 1 ms of every command that loads a spec, and for draft-07 half.
fn op_params_schema(registry: &Registry, op: &str) -> Option<Value> {
    let op = registry.get(op)?;
    let settings = SchemaSettings::draft07();
    let (meta, definitions) = (settings.meta_schema.clone(), settings.definitions_path.clone());
    let mut generator = settings.into_generator();
    let mut schema = op.params_schema(&mut generator).to_value();
    let defs = generator.take_definitions(true);
    if let Some(obj) = schema.as_object_mut() {
        if let Some(meta) = meta {
            obj.insert("$schema".into(), Value::String(meta.into_owned()));
        }
        // `/definitions`, where the generator points each `$ref`.
        let key = definitions.trim_start_matches('/').to_string();
        obj.insert(key, Value::Object(defs));
    }
    Some(schema)
}

/// Checks each node's params (after matrix expansion) against its op's schema:
/// the constraints serde does not express (ranges, patterns, enums).
pub fn check_constraints(spec: &Spec, registry: &Registry) -> Result<(), SpecError> {
    let mut validators: BTreeMap<&str, Option<jsonschema::Validator>> = BTreeMap::new();
    for def in &spec.nodes {
        let validator = validators
            .entry(def.op.as_str())
            .or_insert_with(|| op_params_schema(registry, &def.op).and_then(|s| jsonschema::validator_for(&s).ok()));
        let Some(validator) = validator else { continue };
        let first = validator.iter_errors(&def.params).next().map(|e| (e.instance_path().to_string(), e.to_string()));
        if let Some((pointer, err)) = first {
            let inner: Vec<String> = pointer_segments(&pointer);
            let dotted = inner.join(".");
            let axis = def.binding.keys().find(|a| dotted == **a || dotted.starts_with(&format!("{a}.")));
            let path: Vec<String> = match axis {
                Some(axis) => vec!["nodes".into(), def.base_id.clone(), "matrix".into(), axis.clone()],
                _ => {
                    ["nodes".to_string(), def.base_id.clone(), "params".to_string()].into_iter().chain(inner).collect()
                }
            };
            return Err(SpecError::new(
                SpecErrorKind::Constraint,
                spec.sources.locate_value(&path),
                format!("node '{}' ({}): params.{}: {}", def.id, def.op, path[3..].join("."), err),
            ));
        }
    }
    Ok(())
}

fn pointer_segments(pointer: &str) -> Vec<String> {
    pointer.split('/').skip(1).map(|s| s.replace("~1", "/").replace("~0", "~")).collect()
}

/// The schema as written to `schemas/`: pretty JSON with a trailing newline.
pub fn render(registry: &Registry) -> String {
    let mut text = serde_json::to_string_pretty(&spec_schema(registry)).expect("schema serializes");
    text.push('\n');
    text
}

/// The schemas of the pages and labels rows (docs/data.md), by file name
/// inside `schemas/`, rendered like [`render`].
pub fn data_schemas() -> Vec<(&'static str, String)> {
    fn one<T: schemars::JsonSchema>() -> String {
        let schema = SchemaSettings::draft2020_12().into_generator().root_schema_for::<T>();
        let mut text = serde_json::to_string_pretty(&schema).expect("schema serializes");
        text.push('\n');
        text
    }
    vec![
        ("pages.schema.json", one::<crate::data::rows::PageRow>()),
        ("labels.schema.json", one::<crate::data::rows::LabelRow>()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check_constraints` skips an op whose schema does not compile, so each
    /// must: a draft-07 document that jsonschema accepts, whose `$ref`s resolve
    /// and whose bounds are those of the editors' 2020-12 schema.
    #[test]
    fn every_ops_params_schema_compiles_and_keeps_its_bounds() {
        let registry = Registry::builtin();
        for op in registry.iter() {
            // The same params as the editors' 2020-12 schema writes them.
            let mut generator = SchemaSettings::draft2020_12().into_generator();
            let mut editors = op.params_schema(&mut generator).to_value().to_string();
            editors.push_str(&Value::Object(generator.take_definitions(true)).to_string());
            let schema = op_params_schema(&registry, op.name()).expect("a registered op");
            assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#", "{}", op.name());
            let validator = jsonschema::validator_for(&schema)
                .unwrap_or_else(|e| panic!("{}: the params schema does not compile: {e}", op.name()));
            // Every definition it names resolves (a dangling $ref fails here).
            let _ = validator.is_valid(&serde_json::json!({}));
            let text = schema.to_string();
            for bound in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern"] {
                let count = |t: &str| t.matches(&format!("\"{bound}\"")).count();
                assert_eq!(count(&text), count(&editors), "{}: {bound}", op.name());
            }
        }
        let tokenizer = op_params_schema(&registry, "tokenizer.build").unwrap();
        let validator = jsonschema::validator_for(&tokenizer).unwrap();
        assert!(!validator.is_valid(&serde_json::json!({"vocab_size": 10})), "the bound is checked");
        assert!(validator.is_valid(&serde_json::json!({"vocab_size": 400})));
    }

    #[test]
    fn the_checked_in_schema_is_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
        let mut files = vec![(SCHEMA_FILE, render(&Registry::builtin()))];
        files.extend(data_schemas());
        for (name, text) in files {
            let path = dir.join(name);
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                on_disk == text,
                "{} is stale: run `cargo run -- schema --out schemas` and commit it",
                path.display()
            );
        }
    }

    #[test]
    fn the_rows_schemas_accept_what_the_generator_writes_and_refuse_a_missing_field() {
        let rows = crate::data::generate::generate(2, &crate::data::generate::Counts::default()).unwrap();
        let schemas: BTreeMap<&str, jsonschema::Validator> = data_schemas()
            .into_iter()
            .map(|(n, t)| (n, jsonschema::validator_for(&serde_json::from_str(&t).unwrap()).unwrap()))
            .collect();
        let r = &rows[0];
        let mut label = serde_json::to_value(r.label()).unwrap();
        assert!(schemas["pages.schema.json"].is_valid(&serde_json::to_value(r.page()).unwrap()));
        assert!(schemas["labels.schema.json"].is_valid(&label));
        label.as_object_mut().unwrap().remove("warmstart");
        assert!(!schemas["labels.schema.json"].is_valid(&label));
    }

    #[test]
    fn the_schema_attaches_each_ops_params_to_its_nodes() {
        let schema = spec_schema(&Registry::builtin());
        let all_of = schema.pointer("/$defs/NodeSpec/allOf").and_then(Value::as_array).expect("allOf");
        assert!(all_of.iter().any(|b| b.pointer("/if/properties/op/const") == Some(&json!("shell"))));
        assert!(jsonschema::validator_for(&schema).is_ok());
    }
}

//! Experiment specs: YAML in, a typed and fully expanded [`Spec`] out.
//!
//! Reading happens in two phases (as ripgrep does with its flags): the raw
//! documents are parsed, merged (`extends:`, the chosen profile, `--set`) and
//! checked against the typed [`SpecDoc`] and the generated JSON Schema, with
//! every error located at a file, line and column; only then is the matrix
//! expanded into concrete nodes. The DAG compiler takes it from there.

mod error;
mod load;
pub mod locate;
pub mod schema;

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use error::{did_you_mean, nearest, Location, SpecError, SpecErrorKind};
pub use load::{load, LoadOptions, Override, Sources};

/// An experiment document as written (after merging), the type the JSON Schema
/// in `schemas/` is generated from.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "orchestrate experiment spec")]
pub struct SpecDoc {
    /// The experiment's name; runs and packs are recorded under it.
    pub name: String,
    /// Free text for people reading the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Another spec file, relative to this one, that this spec starts from: its
    /// nodes and profiles are deep-merged under this file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    /// Named overlays chosen with `--profile NAME`, deep-merged over the spec
    /// (a `null` removes a key).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, serde_json::Map<String, Value>>,
    /// The pipeline's nodes, by id.
    pub nodes: BTreeMap<String, NodeSpec>,
}

/// One node as written: an op, its params, where its inputs come from, and an
/// optional matrix that expands it into several nodes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// The op that runs this node (`orchestrate ops` lists them).
    pub op: String,
    /// Free text for people reading the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The op's parameters; each op documents its own.
    #[serde(default)]
    pub params: serde_json::Map<String, Value>,
    /// Named inputs, each `NODE:OUTPUT` or a list of them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, InputRefs>,
    /// Param values to expand over: `{group_size: [2, 4, 8]}` gives the nodes
    /// `ID@group_size=2`, `ID@group_size=4` and `ID@group_size=8`, each with that
    /// param set. A dotted axis (`env.SEED`) sets a nested param, and
    /// `${matrix.AXIS}` inside any string param is replaced by the value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub matrix: BTreeMap<String, Vec<Value>>,
}

/// One reference or a list of references to other nodes' outputs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum InputRefs {
    One(String),
    Many(Vec<String>),
}

impl InputRefs {
    pub fn as_slice(&self) -> &[String] {
        match self {
            InputRefs::One(s) => std::slice::from_ref(s),
            InputRefs::Many(v) => v,
        }
    }
}

/// A reference to one output of another node, written `NODE:OUTPUT`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OutputRef {
    pub node: String,
    pub output: String,
}

impl std::fmt::Display for OutputRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.output)
    }
}

/// A concrete node after matrix expansion.
#[derive(Debug, Clone)]
pub struct NodeDef {
    /// The node's id: the written id, plus `@axis=value,...` for matrix nodes.
    pub id: String,
    /// The id as written in the spec.
    pub base_id: String,
    pub op: String,
    pub params: serde_json::Map<String, Value>,
    pub inputs: BTreeMap<String, Vec<OutputRef>>,
    /// This node's matrix values, if it came from a matrix.
    pub binding: BTreeMap<String, Value>,
}

/// A loaded, merged, validated and expanded experiment.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    /// The spec file that was loaded.
    pub path: PathBuf,
    /// Relative paths in params (files, deps, outs) are relative to this folder.
    pub base_dir: PathBuf,
    pub profile: Option<String>,
    /// The merged document, as the ops will see it (for manifests and `explain`).
    pub resolved: Value,
    /// Concrete nodes, sorted by id.
    pub nodes: Vec<NodeDef>,
    /// Where each part of the merged document came from, to locate later errors.
    pub sources: Sources,
}

impl Spec {
    pub fn node(&self, id: &str) -> Option<&NodeDef> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// Renders a matrix value for a node id: strings bare, everything else as JSON.
pub fn matrix_value_label(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

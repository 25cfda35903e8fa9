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
pub mod parsed;
pub mod schema;
mod yaml_json;

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
    /// Where nodes run: `local` (default, this machine, up to `--jobs` at once)
    /// or `slurm` (each node a Slurm job; see `slurm`). `--executor` overrides it.
    #[serde(default)]
    pub executor: ExecutorKind,
    /// Slurm resources every node's job asks for unless the node's own
    /// `resources` says otherwise. Read only with `executor: slurm`.
    #[serde(default, skip_serializing_if = "SlurmResources::is_empty")]
    pub slurm: SlurmResources,
    /// The pipeline's nodes, by id.
    pub nodes: BTreeMap<String, NodeSpec>,
}

/// Where a spec's nodes run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// On this machine, as child processes of `orchestrate run`.
    #[default]
    Local,
    /// As Slurm jobs (`sbatch`), each running `orchestrate exec-node` on the shared workspace.
    Slurm,
}

/// What one node's Slurm job asks for. Unset fields fall back to the spec's
/// `slurm:` block; `sbatch` and `setup` lines add to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmResources {
    /// `--partition`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// `--account`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// `--time`, in any form sbatch takes (`90`, `4:00:00`, `1-12:00:00`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// GPUs per node (`--gpus-per-node`). Numerical nodes asking for GPUs are
    /// keyed on device `cuda` and run with `ORCHESTRATE_DEVICE=cuda`; without, on `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// `--cpus-per-task`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// `--mem`, e.g. `64G`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
    /// More sbatch options, one per line, written as `#SBATCH` lines
    /// (`--qos=high`, `--constraint=h100`; a leading `#SBATCH` is accepted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch: Vec<String>,
    /// Shell lines the job runs before `orchestrate exec-node` (`module load cuda/12.8`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
    /// How many times a job Slurm ended before the node finished (time limit,
    /// preemption, node failure) is resubmitted; GRPO resumes from its last
    /// checkpoint. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
}

impl SlurmResources {
    pub fn is_empty(&self) -> bool {
        *self == SlurmResources::default()
    }

    /// `self` (a node's own resources) over `base` (the spec's defaults).
    pub fn over(&self, base: &SlurmResources) -> SlurmResources {
        SlurmResources {
            partition: self.partition.clone().or_else(|| base.partition.clone()),
            account: self.account.clone().or_else(|| base.account.clone()),
            time: self.time.clone().or_else(|| base.time.clone()),
            gpus: self.gpus.or(base.gpus),
            cpus: self.cpus.or(base.cpus),
            mem: self.mem.clone().or_else(|| base.mem.clone()),
            sbatch: base.sbatch.iter().chain(&self.sbatch).cloned().collect(),
            setup: base.setup.iter().chain(&self.setup).cloned().collect(),
            retries: self.retries.or(base.retries),
        }
    }
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
    /// `${matrix.AXIS}` inside any string param or input is replaced by the
    /// value. An axis may also name its values (`{values: {f1: {...}}}`: the
    /// param gets the structured value, the id and `${matrix.AXIS}` the label),
    /// or only label the expansions without setting a param (`{labels: [0, 1]}`).
    /// `from: NODE` follows another node's matrix: one expansion per expansion
    /// of NODE, labelled as it is (setting no param), so references to NODE
    /// bind to the same expansion.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub matrix: BTreeMap<String, MatrixAxis>,
    /// This node's Slurm job resources, over the spec's `slurm:` block (every
    /// matrix expansion gets the same). Ignored by the local executor; never
    /// part of the node's key, except that GPUs decide the keyed device.
    #[serde(default, skip_serializing_if = "SlurmResources::is_empty")]
    pub resources: SlurmResources,
    /// libtorch CPU threads of this numerical node (default: `ORCHESTRATE_THREADS`,
    /// itself 1), as Snakemake's `threads`. Keyed, since the bytes depend on it;
    /// locally the node waits until that many of the machine's cores are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<usize>,
}

/// One matrix axis as written.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum MatrixAxis {
    /// Values, each set as the param named by the axis and written in the id.
    Values(Vec<Value>),
    /// Named values, or labels only.
    Named(NamedAxis),
    /// `from: NODE`: the axes of another node's matrix, as labels.
    From(String),
}

/// The matrix key that follows another node's matrix (`matrix: {from: train}`).
pub const MATRIX_FROM: &str = "from";

/// An axis whose expansions are named by labels: `values` maps each label to
/// the value the param is set to (a fault spec, a list, an object), `labels`
/// sets no param at all (an axis that pairs a node with its seed's upstream
/// node, say). Exactly one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedAxis {
    /// Label → the value the axis's param is set to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<BTreeMap<String, Value>>,
    /// Labels that only name the expansions (and fill `${matrix.AXIS}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<Value>>,
}

impl<'de> Deserialize<'de> for MatrixAxis {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::Array(values) => Ok(MatrixAxis::Values(values)),
            Value::Object(map) => {
                serde_json::from_value(Value::Object(map)).map(MatrixAxis::Named).map_err(D::Error::custom)
            }
            Value::String(node) => Ok(MatrixAxis::From(node)),
            other => Err(D::Error::custom(format!(
                "a matrix axis is a list of values, {{values: {{LABEL: VALUE, ...}}}} or {{labels: [...]}} (or `from: NODE`), not {other}"
            ))),
        }
    }
}

/// One expansion value of an axis: what the id and `${matrix.AXIS}` show,
/// and what the param is set to (`None`: a label-only axis sets none).
#[derive(Debug, Clone, PartialEq)]
pub struct AxisValue {
    pub label: Value,
    pub param: Option<Value>,
}

/// Why a matrix axis is ill-formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AxisError {
    #[error(
        "'{node}' is a node to follow, which only the key `{MATRIX_FROM}` takes (`matrix: {{{MATRIX_FROM}: {node}}}`)"
    )]
    FollowOnly { node: String },
    #[error("give either values (label → value) or labels, not both")]
    ValuesAndLabels,
    #[error("give values (label → value) or labels")]
    Neither,
    #[error("label '{label}': a label is letters, digits and _ - . + (it becomes part of node ids)")]
    BadName { label: String },
    /// A `labels` entry, as written (JSON).
    #[error("label {label}: a label is a number or a string of letters, digits and _ - . +")]
    BadLabel { label: String },
    #[error("has no values")]
    Empty,
}

impl MatrixAxis {
    /// The axis's expansion values, or why the axis is ill-formed.
    pub fn values(&self) -> Result<Vec<AxisValue>, AxisError> {
        let label_ok = |l: &str| {
            !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '+'))
        };
        let out: Vec<AxisValue> = match self {
            MatrixAxis::From(node) => return Err(AxisError::FollowOnly { node: node.clone() }),
            MatrixAxis::Values(v) => v.iter().map(|v| AxisValue { label: v.clone(), param: Some(v.clone()) }).collect(),
            MatrixAxis::Named(NamedAxis { values: Some(_), labels: Some(_) }) => {
                return Err(AxisError::ValuesAndLabels)
            }
            MatrixAxis::Named(NamedAxis { values: None, labels: None }) => return Err(AxisError::Neither),
            MatrixAxis::Named(NamedAxis { values: Some(map), .. }) => {
                if let Some(bad) = map.keys().find(|l| !label_ok(l)) {
                    return Err(AxisError::BadName { label: bad.clone() });
                }
                map.iter().map(|(l, v)| AxisValue { label: Value::String(l.clone()), param: Some(v.clone()) }).collect()
            }
            MatrixAxis::Named(NamedAxis { labels: Some(labels), .. }) => {
                for l in labels {
                    let shown = matrix_value_label(l);
                    if !(l.is_string() || l.is_number()) || !label_ok(&shown) {
                        return Err(AxisError::BadLabel { label: l.to_string() });
                    }
                }
                labels.iter().map(|l| AxisValue { label: l.clone(), param: None }).collect()
            }
        };
        if out.is_empty() {
            return Err(AxisError::Empty);
        }
        Ok(out)
    }

    /// Whether the axis sets a param (every form but `labels`).
    pub fn sets_param(&self) -> bool {
        !matches!(self, MatrixAxis::Named(NamedAxis { labels: Some(_), values: None }) | MatrixAxis::From(_))
    }
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
    /// Always a JSON object (its params, the matrix's values put in): kept as
    /// a value so the schema check and the op's parse read it as it is,
    /// without a copy of each node's params for each.
    pub params: Value,
    pub inputs: BTreeMap<String, Vec<OutputRef>>,
    /// This node's matrix values (their labels), if it came from a matrix.
    pub binding: BTreeMap<String, Value>,
    /// Its Slurm resources, the spec's `slurm:` block already applied under them.
    pub resources: SlurmResources,
    /// Its libtorch CPU threads, when the spec sets them (numerical ops only).
    pub threads: Option<usize>,
}

/// A loaded, merged, validated and expanded experiment.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    /// The spec file that was loaded.
    pub path: PathBuf,
    /// The real paths of the spec file and of each file it extends: no
    /// node's out may be one or hold one (an out is removed before its
    /// command runs).
    pub files: Vec<PathBuf>,
    /// Relative paths in params (files, deps, outs) are relative to this folder.
    pub base_dir: PathBuf,
    pub profile: Option<String>,
    /// The merged document, as the ops will see it (for manifests and `explain`).
    pub resolved: Value,
    /// Where nodes run (the spec's `executor:`, or `--executor`).
    pub executor: ExecutorKind,
    /// Concrete nodes, sorted by id.
    pub nodes: Vec<NodeDef>,
    /// Where each part of the merged document came from, to locate later errors.
    pub sources: Sources,
}

impl Spec {
    /// Its name and profile, as the index looks a node's last record up.
    pub fn spec_ref(&self) -> crate::store::SpecRef<'_> {
        crate::store::SpecRef { name: &self.name, profile: self.profile.as_deref() }
    }
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

//! `orchestrate compare`: what changed between runs, packs and matrix points,
//! and why. Each side is a [`RunView`] (a run of the workspace or a frozen
//! pack); the first side is the baseline.
//!
//! Its sections, in a long layout (one row per node and field):
//! - **keys**: nodes whose keys differ, with the hash-input fields that differ
//!   (the vocabulary of `plan` and `explain`), an input's content named by the
//!   node that produced it on each side;
//! - **outputs** that differ under one key: a node that did not give the same
//!   bytes twice for the same inputs (shown only when there is one);
//! - **metrics** of nodes present on several sides, read through their
//!   writers' types (an unreadable file is listed, never read as zeros);
//! - **gates** whose verdict differs.
//!
//! Rows whose values agree on every side are left out unless `all` is asked.
//! [`super::group`] is the other question: over one matrix axis of one run (seeds),
//! mean ± sample standard deviation and n at each remaining matrix point, and
//! a paired bootstrap interval between evaluations of the same problems.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::metrics::{MetricTable, Unit};
use super::{label, NodeView, RunView, Side};
use crate::dag::key::fields;
use crate::gate::GateReport;
use crate::ops::artifacts::{ArtifactKind, NodeKind};

/// One hash-input field (or the node's presence) that differs between sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyRow {
    pub node: String,
    /// `params.lr`, `input model`, `env.device`, `op_version`, or `node` for
    /// a node present on some sides only.
    pub field: String,
    /// One per side; `None`: absent there.
    pub values: Vec<Option<String>>,
}

/// An output of a node whose key is the same on every side, whose bytes are
/// not: the node did not give the same bytes twice for the same inputs (a
/// later `run --force`, two workspaces, a pack and a run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputRow {
    pub node: String,
    pub output: String,
    /// One per side: the short hash of its object; `None`: absent there.
    pub values: Vec<Option<String>>,
}

/// One metric of one node, on every side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricRow {
    pub node: String,
    pub metric: String,
    pub unit: Unit,
    /// One per side; `None`: undefined, or the node is not on that side.
    pub values: Vec<Option<f64>>,
    /// Each side after the first minus the first; `None` when either is undefined.
    pub changes: Vec<Option<f64>>,
}

/// One gate's verdict on every side (`None`: not evaluated there).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateRow {
    pub gate: String,
    pub passed: Vec<Option<bool>>,
}

/// A file that could not be read, so nothing was compared from it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unreadable {
    pub side: String,
    pub node: String,
    pub error: String,
}

/// The comparison of two or more sides; the first is the baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// `A`, `B`, ... and what each names.
    pub sides: Vec<(String, String)>,
    /// Whether unchanged rows are included.
    pub all: bool,
    pub keys: Vec<KeyRow>,
    /// Outputs that differ under one key (only those, `all` or not).
    pub outputs: Vec<OutputRow>,
    pub metrics: Vec<MetricRow>,
    pub gates: Vec<GateRow>,
    pub unreadable: Vec<Unreadable>,
}

/// The fields of a node's record, an input written as the outputs that
/// produced its content on that side (`warmstart:model 3fa1c2d8`).
fn key_fields(node: &NodeView, producers: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
    let Some(record) = &node.record else {
        return BTreeMap::from([("key".to_string(), "(no record)".to_string())]);
    };
    let mut out: BTreeMap<String, String> =
        fields(record).into_iter().filter(|(f, _)| !f.starts_with("inputs.") && f != "inputs").collect();
    for (name, hashes) in &record.inputs {
        let shown: Vec<String> = hashes
            .iter()
            .map(|h| {
                let short = &h[..h.len().min(8)];
                // Identical bytes may come from several nodes (a resume check's
                // model is the continuous run's): the first names it.
                match producers.get(h).map(Vec::as_slice) {
                    Some([one]) => format!("{one} {short}"),
                    Some([first, rest @ ..]) => format!("{first} (+{} more) {short}", rest.len()),
                    _ => short.to_string(),
                }
            })
            .collect();
        out.insert(format!("input {name}"), shown.join(", "));
    }
    out
}

/// Which `NODE:OUTPUT`s hold each content hash on one side.
fn producers(src: &RunView) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in &src.nodes {
        for (name, hash) in &n.hashes {
            out.entry(hash.clone()).or_default().push(format!("{}:{name}", n.id));
        }
    }
    out
}

fn gate_verdicts(node: &NodeView) -> Result<BTreeMap<String, bool>, String> {
    let Some(p) = node.artifact(ArtifactKind::GateReport) else { return Ok(BTreeMap::new()) };
    let r = GateReport::read(p?).map_err(|e| e.to_string())?;
    Ok(r.results.into_iter().map(|g| (g.name, g.passed)).collect())
}

fn same<T: PartialEq>(values: &[T]) -> bool {
    values.windows(2).all(|w| w[0] == w[1])
}

/// The key rows of one node: its presence where some side lacks it, else
/// the record's fields that differ (all of them with `all`).
fn key_rows(
    id: &str,
    nodes: &[Option<&NodeView>],
    producers: &[BTreeMap<String, Vec<String>>],
    all: bool,
) -> Vec<KeyRow> {
    let row = |field: &str, values: Vec<Option<String>>| KeyRow { node: id.to_string(), field: field.into(), values };
    let presence: Vec<Option<String>> =
        nodes.iter().map(|x| x.map(|x| x.key.as_ref().map_or("present".into(), |k| k.short().to_string()))).collect();
    let present: Vec<&NodeView> = nodes.iter().flatten().copied().collect();
    if present.len() < nodes.len() {
        return vec![row("node", presence)];
    }
    let keys: Vec<_> = present.iter().map(|x| x.key.clone()).collect();
    if same(&keys) && !all {
        return Vec::new();
    }
    let per_side: Vec<BTreeMap<String, String>> =
        present.iter().zip(producers).map(|(x, p)| key_fields(x, p)).collect();
    let names: BTreeSet<&String> = per_side.iter().flat_map(|m| m.keys()).collect();
    let mut rows: Vec<KeyRow> = names
        .into_iter()
        .map(|f| row(f, per_side.iter().map(|m| m.get(f).cloned()).collect()))
        .filter(|r| all || !same(&r.values))
        .collect();
    if rows.is_empty() && !same(&keys) {
        // Only possible for a record that does not read the same way.
        rows.push(row("key", keys.iter().map(|k| k.as_ref().map(|k| k.short().to_string())).collect()));
    }
    if all && same(&keys) {
        rows.insert(0, row("key", presence));
    }
    rows
}

/// The outputs of one node present on every side under one key whose
/// objects differ between sides.
fn output_rows(id: &str, nodes: &[Option<&NodeView>]) -> Vec<OutputRow> {
    let Some(present) = nodes.iter().copied().collect::<Option<Vec<&NodeView>>>() else { return Vec::new() };
    let keys: Vec<_> = present.iter().map(|x| x.key.as_ref()).collect();
    if keys.iter().any(Option::is_none) || !same(&keys) {
        return Vec::new();
    }
    let names: BTreeSet<&String> = present.iter().flat_map(|x| x.hashes.keys()).collect();
    names
        .into_iter()
        .map(|name| OutputRow {
            node: id.to_string(),
            output: name.clone(),
            values: present.iter().map(|x| x.hashes.get(name).map(|h| crate::ids::short(h).to_string())).collect(),
        })
        .filter(|r| !same(&r.values))
        .collect()
}

/// Compares the sides (at least one); rows that agree everywhere are left
/// out unless `all`.
pub fn compare(sides: &[Side], all: bool) -> Comparison {
    let n = sides.len();
    let mut ids: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for s in sides {
        for node in &s.view.nodes {
            if seen.insert(node.id.clone()) {
                ids.push(node.id.clone());
            }
        }
    }
    let lookup: Vec<BTreeMap<&str, &NodeView>> =
        sides.iter().map(|s| s.view.nodes.iter().map(|n| (n.id.as_str(), n)).collect()).collect();
    let producers: Vec<_> = sides.iter().map(|s| producers(&s.view)).collect();
    let mut out = Comparison {
        sides: sides.iter().enumerate().map(|(i, s)| (label(i), s.name.clone())).collect(),
        all,
        keys: Vec::new(),
        outputs: Vec::new(),
        metrics: Vec::new(),
        gates: Vec::new(),
        unreadable: Vec::new(),
    };
    let mut gates: BTreeMap<String, Vec<Option<bool>>> = BTreeMap::new();
    for id in &ids {
        let nodes: Vec<Option<&NodeView>> = lookup.iter().map(|l| l.get(id.as_str()).copied()).collect();
        out.keys.extend(key_rows(id, &nodes, &producers, all));
        out.outputs.extend(output_rows(id, &nodes));
        // Metrics.
        let table = MetricTable::of(&nodes);
        for (i, error) in &table.unreadable {
            out.unreadable.push(Unreadable { side: label(*i), node: id.clone(), error: error.clone() });
        }
        for name in &table.order {
            let (unit, values) = table.column(name);
            let bits: Vec<Option<u64>> = values.iter().map(|v| v.map(f64::to_bits)).collect();
            if !all && same(&bits) {
                continue;
            }
            let changes = values[1..].iter().map(|v| Some(v.as_ref()? - values[0].as_ref()?)).collect();
            out.metrics.push(MetricRow { node: id.clone(), metric: name.clone(), unit, values, changes });
        }
        // Gates.
        for (i, x) in nodes.iter().enumerate() {
            let Some(node) = x.filter(|x| x.kind() == NodeKind::Gate) else { continue };
            match gate_verdicts(node) {
                Ok(v) => {
                    for (gate, passed) in v {
                        gates.entry(gate).or_insert_with(|| vec![None; n])[i] = Some(passed);
                    }
                }
                Err(error) => out.unreadable.push(Unreadable { side: label(i), node: id.clone(), error }),
            }
        }
    }
    out.gates =
        gates.into_iter().map(|(gate, passed)| GateRow { gate, passed }).filter(|g| all || !same(&g.passed)).collect();
    out
}

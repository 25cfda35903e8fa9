//! `orchestrate compare`: what changed between runs, packs and matrix points,
//! and why. Each side is a [`Source`] (a run of the workspace or a frozen
//! pack, as the report reads them); the first side is the baseline.
//!
//! Three sections, in a long layout (one row per node and field):
//! - **keys**: nodes whose keys differ, with the hash-input fields that differ
//!   (the vocabulary of `plan` and `explain`), an input's content named by the
//!   node that produced it on each side;
//! - **metrics** of nodes present on several sides, read through their
//!   writers' types (an unreadable file is listed, never read as zeros);
//! - **gates** whose verdict differs.
//!
//! Rows whose values agree on every side are left out unless `all` is asked.
//! [`group`] is the other question: over one matrix axis of one run (seeds),
//! mean ± sample standard deviation and n at each remaining matrix point, and
//! a paired bootstrap interval between evaluations of the same problems.

use crate::ops::artifacts::{ArtifactKind, NodeKind};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::dag::key::fields;
use crate::gate::GateReport;
use crate::ops::eval::{EvalResults, EvalSummary, ALL};
use crate::ops::results::ResultsTableFile;
use crate::report::{Node, Source};
use crate::stats::mean_of as mean;
use crate::stats::Interval;
use crate::train::metrics::{GrpoMetrics, SftMetrics, TrainingMetrics, UpdateStats};

/// One thing compared: a label (`A`, `B`, ...) and what it was made from.
#[derive(Debug, Clone)]
pub struct Side {
    /// What the user named: a run id, a spec, a pack folder.
    pub name: String,
    pub source: Source,
}

/// How a metric's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// A share in [0, 1] or a mean reward: 4 decimals.
    Rate,
    /// A loss, a KL, a norm: 4 significant-enough decimals, or scientific when small.
    Value,
    Seconds,
    Megabytes,
    Count,
    /// A user's own metric: six significant digits, whatever its scale.
    Number,
}

impl Unit {
    /// The value at this unit's fixed precision; `undefined` for none.
    pub fn show(self, v: Option<f64>) -> String {
        match v {
            Some(x) if x.is_finite() => match self {
                Unit::Rate => format!("{x:.4}"),
                Unit::Value if x != 0.0 && x.abs() < 1e-3 => format!("{x:.3e}"),
                Unit::Value => format!("{x:.4}"),
                Unit::Seconds => format!("{x:.2}"),
                Unit::Megabytes | Unit::Count => format!("{x:.0}"),
                Unit::Number => significant(x, 6),
            },
            _ => "undefined".into(),
        }
    }

    /// A signed change at the same precision.
    pub fn show_change(self, v: Option<f64>) -> String {
        match v {
            Some(x) if x.is_finite() => {
                let s = self.show(Some(x.abs()));
                if x < 0.0 {
                    format!("-{s}")
                } else {
                    format!("+{s}")
                }
            }
            _ => "undefined".into(),
        }
    }
}

/// `x` to `digits` significant digits, without trailing zeros (`0.01594`,
/// `1.5e-7`, `12345.7`).
fn significant(x: f64, digits: usize) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let magnitude = x.abs().log10().floor() as i32;
    if !(-4..15).contains(&magnitude) {
        let s = format!("{:.*e}", digits - 1, x);
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa =
            if mantissa.contains('.') { mantissa.trim_end_matches('0').trim_end_matches('.') } else { mantissa };
        return format!("{mantissa}e{exp}");
    }
    let decimals = (digits as i32 - 1 - magnitude).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// One measured quantity of one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    pub name: String,
    pub unit: Unit,
    /// `None`: undefined (no update ran, an empty population), never 0.
    pub value: Option<f64>,
}

fn metric(name: impl Into<String>, unit: Unit, value: Option<f64>) -> Metric {
    Metric { name: name.into(), unit, value: value.filter(|v| v.is_finite()) }
}

/// The mean of one statistic over every update of a run (undefined when none ran).
fn over_updates(m: &GrpoMetrics, field: impl Fn(&UpdateStats) -> f64) -> Option<f64> {
    mean(m.history.iter().flat_map(|h| h.updates.iter().map(&field)))
}

/// How many iterations the reward windows of the results table span.
const REWARD_WINDOW: usize = 20;

fn grpo_metrics(m: &GrpoMetrics) -> Vec<Metric> {
    let h = &m.history;
    let last = h.len().saturating_sub(REWARD_WINDOW);
    vec![
        metric("train reward (mean over iterations)", Unit::Rate, mean(h.iter().map(|i| i.mean_reward))),
        metric(
            format!("train reward (last {REWARD_WINDOW} iterations)"),
            Unit::Rate,
            mean(h[last..].iter().map(|i| i.mean_reward)),
        ),
        metric("zero-variance group share", Unit::Rate, mean(h.iter().map(|i| i.zero_variance_fraction))),
        metric("exact KL (mean per update)", Unit::Value, over_updates(m, |u| u.kl)),
        metric("clip fraction (mean per update)", Unit::Rate, over_updates(m, |u| u.clip_fraction)),
        metric("gradient norm (mean per update)", Unit::Value, over_updates(m, |u| u.grad_norm)),
        metric("updates", Unit::Count, Some(m.updates as f64)),
        metric("refused batches", Unit::Count, Some(m.guard.detections.len() as f64)),
        metric("bad updates applied", Unit::Count, Some(m.guard.bad_updates_applied as f64)),
    ]
}

/// What a node's process cost ([`Node::costs`]): seconds, GRPO's cost
/// categories summed over its iterations, peak memory.
fn cost_metrics(node: &Node, m: Option<&TrainingMetrics>) -> Vec<Metric> {
    let Some(c) = node.costs(m) else { return Vec::new() };
    let mb = c.process.peak_rss_bytes.map(|b| b as f64 / 1048576.0);
    let seconds = if node.kind() == NodeKind::Generation { "generation seconds" } else { "seconds" };
    let mut out = vec![metric(seconds, Unit::Seconds, Some(c.process.seconds))];
    match m {
        Some(TrainingMetrics::Grpo(g)) => {
            let n = g.history.len();
            out.push(metric("generation seconds", Unit::Seconds, c.total(n, |c| c.generation_seconds)));
            out.push(metric("behavior check seconds", Unit::Seconds, c.total(n, |c| c.behavior_verification_seconds)));
            out.push(metric(
                "optimization seconds",
                Unit::Seconds,
                c.total(n, |c| c.optimization_with_reference_seconds),
            ));
            out.push(metric("hashing seconds", Unit::Seconds, c.total(n, |c| c.state_hashing_seconds)));
            // What E1's overhead is about: a whole iteration, over those no
            // fault touched and this process ran (so arms time the same work).
            let unfaulted =
                g.history.iter().filter(|h| h.faults.is_empty()).filter_map(|h| c.iterations.get(&h.iteration));
            out.push(metric(
                "step seconds (unfaulted iterations)",
                Unit::Seconds,
                mean(unfaulted.map(|c| c.loop_seconds)),
            ));
        }
        Some(TrainingMetrics::Sft(_)) => {
            out.push(metric("optimization seconds", Unit::Seconds, c.process.optimization_seconds))
        }
        None => {}
    }
    out.push(metric("peak RSS MB", Unit::Megabytes, mb));
    out
}

fn sft_metrics(m: &SftMetrics) -> Vec<Metric> {
    vec![
        metric("final training NLL", Unit::Value, m.history.last().map(|u| u.loss)),
        metric("final validation NLL", Unit::Value, m.validation_history.last().map(|v| v.validation_nll)),
        metric("updates", Unit::Count, Some(m.updates as f64)),
    ]
}

fn eval_metrics(r: &EvalResults) -> Vec<Metric> {
    let mut out = Vec::new();
    for (mode, scores) in [("greedy", &r.greedy), ("sample", &r.sample)] {
        for pop in scores.names() {
            let Some(s) = scores.population(pop) else { continue };
            out.push(metric(format!("{mode} success {pop}"), Unit::Rate, s.success_rate));
            out.push(metric(format!("{mode} JSON validity {pop}"), Unit::Rate, s.json_validity));
        }
    }
    out
}

fn table_metrics(t: &ResultsTableFile) -> Vec<Metric> {
    let mut out = Vec::new();
    for r in &t.rows {
        let at = format!("{} {}", r.policy, r.population);
        out.push(metric(format!("greedy pass@1 {at}"), Unit::Rate, r.greedy_pass_at_1));
        out.push(metric(format!("per-draw success {at}"), Unit::Rate, r.per_draw_success));
    }
    for c in t.comparisons.iter().flatten() {
        let at = format!("{} − {} {}", c.policy, c.baseline, c.population);
        out.push(metric(format!("paired difference {at}"), Unit::Rate, c.difference.map(|d| d.estimate)));
    }
    for c in t.draw_comparisons.iter().flatten() {
        let at = format!("{} − {} {}", c.policy, c.baseline, c.population);
        out.push(metric(format!("paired per-draw difference {at}"), Unit::Rate, c.difference.map(|d| d.estimate)));
    }
    for r in t.reward_trends.iter().flatten() {
        out.push(metric(
            format!("reward trend {} (last − first {})", r.run, r.window),
            Unit::Rate,
            r.difference.map(|d| d.estimate),
        ));
    }
    out
}

/// What one node measured, read through its writer's type. `Err` names the
/// file and the field that did not read.
pub fn node_metrics(node: &Node) -> Result<Vec<Metric>, String> {
    let read_err = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    match node.kind() {
        NodeKind::Training => {
            let Some(p) = node.artifact(ArtifactKind::TrainingMetrics) else { return Ok(cost_metrics(node, None)) };
            let m = TrainingMetrics::read(p).map_err(|e| read_err("metrics", &e))?;
            let mut out = match &m {
                TrainingMetrics::Grpo(m) => grpo_metrics(m),
                TrainingMetrics::Sft(m) => sft_metrics(m),
            };
            out.extend(cost_metrics(node, Some(&m)));
            Ok(out)
        }
        NodeKind::Scoring => {
            let Some(p) = node.artifact(ArtifactKind::EvalResults) else { return Ok(Vec::new()) };
            Ok(eval_metrics(&EvalResults::read(p).map_err(|e| read_err("results", &e))?))
        }
        NodeKind::Generation => {
            // A summary that does not read is said, never taken for "no costs".
            if let Some(p) = node.artifact(ArtifactKind::EvalSummary) {
                let _: EvalSummary = crate::canonical::read_typed(p).map_err(|e| read_err("summary", &e))?;
            }
            Ok(cost_metrics(node, None))
        }
        NodeKind::ResultsTable => {
            let Some(p) = node.artifact(ArtifactKind::ResultsTable) else { return Ok(Vec::new()) };
            let t: ResultsTableFile = crate::canonical::read_typed(p).map_err(|e| read_err("table.json", &e))?;
            Ok(table_metrics(&t))
        }
        NodeKind::Command => shell_metrics(node),
        NodeKind::Gate | NodeKind::Other => Ok(Vec::new()),
    }
}

/// A shell node's own metrics ([`crate::report::user_metrics`]).
fn shell_metrics(node: &Node) -> Result<Vec<Metric>, String> {
    Ok(crate::report::user_metrics(node)?
        .into_iter()
        .map(|(name, value)| Metric { name, unit: Unit::Number, value: value.number() })
        .collect())
}

/// The metrics of several nodes side by side (a node absent from a side has none).
struct MetricTable {
    /// Each node's metrics by name.
    by_node: Vec<BTreeMap<String, Metric>>,
    /// Every name, in order of first appearance.
    order: Vec<String>,
    /// (position, why its files did not read): nothing is taken from those.
    unreadable: Vec<(usize, String)>,
}

impl MetricTable {
    fn of(nodes: &[Option<&Node>]) -> MetricTable {
        let mut t = MetricTable { by_node: Vec::with_capacity(nodes.len()), order: Vec::new(), unreadable: Vec::new() };
        for (i, x) in nodes.iter().enumerate() {
            let mut m = BTreeMap::new();
            match x.map(node_metrics) {
                Some(Ok(list)) => {
                    for metric in list {
                        if !t.order.contains(&metric.name) {
                            t.order.push(metric.name.clone());
                        }
                        m.insert(metric.name.clone(), metric);
                    }
                }
                Some(Err(error)) => t.unreadable.push((i, error)),
                None => {}
            }
            t.by_node.push(m);
        }
        t
    }

    /// One metric's unit and its value on each node (`None`: undefined or absent).
    fn column(&self, name: &str) -> (Unit, Vec<Option<f64>>) {
        let unit = self.by_node.iter().find_map(|m| m.get(name)).map_or(Unit::Value, |m| m.unit);
        (unit, self.by_node.iter().map(|m| m.get(name).and_then(|m| m.value)).collect())
    }
}

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
    pub metrics: Vec<MetricRow>,
    pub gates: Vec<GateRow>,
    pub unreadable: Vec<Unreadable>,
}

/// `A`, `B`, ..., `Z`, `S27`, ...
pub fn label(i: usize) -> String {
    if i < 26 {
        char::from(b'A' + i as u8).to_string()
    } else {
        format!("S{}", i + 1)
    }
}

/// The fields of a node's record, an input written as the outputs that
/// produced its content on that side (`warmstart:model 3fa1c2d8`).
fn key_fields(node: &Node, producers: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
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
fn producers(src: &Source) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in &src.nodes {
        for (name, hash) in &n.hashes {
            out.entry(hash.clone()).or_default().push(format!("{}:{name}", n.id));
        }
    }
    out
}

fn gate_verdicts(node: &Node) -> Result<BTreeMap<String, bool>, String> {
    let Some(p) = node.artifact(ArtifactKind::GateReport) else { return Ok(BTreeMap::new()) };
    let r = GateReport::read(p)?;
    Ok(r.results.into_iter().map(|g| (g.name, g.passed)).collect())
}

fn same<T: PartialEq>(values: &[T]) -> bool {
    values.windows(2).all(|w| w[0] == w[1])
}

/// Compares the sides (at least one); rows that agree everywhere are left
/// out unless `all`.
pub fn compare(sides: &[Side], all: bool) -> Comparison {
    let n = sides.len();
    let mut ids: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for s in sides {
        for node in &s.source.nodes {
            if seen.insert(node.id.clone()) {
                ids.push(node.id.clone());
            }
        }
    }
    let lookup: Vec<BTreeMap<&str, &Node>> =
        sides.iter().map(|s| s.source.nodes.iter().map(|n| (n.id.as_str(), n)).collect()).collect();
    let producers: Vec<_> = sides.iter().map(|s| producers(&s.source)).collect();
    let mut out = Comparison {
        sides: sides.iter().enumerate().map(|(i, s)| (label(i), s.name.clone())).collect(),
        all,
        keys: Vec::new(),
        metrics: Vec::new(),
        gates: Vec::new(),
        unreadable: Vec::new(),
    };
    let mut gates: BTreeMap<String, Vec<Option<bool>>> = BTreeMap::new();
    for id in &ids {
        let nodes: Vec<Option<&Node>> = lookup.iter().map(|l| l.get(id.as_str()).copied()).collect();
        // Keys.
        let presence: Vec<Option<String>> = nodes
            .iter()
            .map(|x| x.map(|x| x.key.as_ref().map_or("present".into(), |k| k.short().to_string())))
            .collect();
        if nodes.iter().any(Option::is_none) {
            out.keys.push(KeyRow { node: id.clone(), field: "node".into(), values: presence });
        } else {
            let keys: Vec<_> = nodes.iter().map(|x| x.and_then(|x| x.key.clone())).collect();
            if !same(&keys) || all {
                let per_side: Vec<BTreeMap<String, String>> =
                    nodes.iter().zip(&producers).map(|(x, p)| key_fields(x.expect("present"), p)).collect();
                let names: BTreeSet<&String> = per_side.iter().flat_map(|m| m.keys()).collect();
                let mut rows: Vec<KeyRow> = names
                    .into_iter()
                    .map(|f| KeyRow {
                        node: id.clone(),
                        field: f.clone(),
                        values: per_side.iter().map(|m| m.get(f).cloned()).collect(),
                    })
                    .filter(|r| all || !same(&r.values))
                    .collect();
                if rows.is_empty() && !same(&keys) {
                    // Only possible for a record that does not read the same way.
                    rows.push(KeyRow {
                        node: id.clone(),
                        field: "key".into(),
                        values: keys.iter().map(|k| k.as_ref().map(|k| k.short().to_string())).collect(),
                    });
                }
                if all && same(&keys) {
                    rows.insert(0, KeyRow { node: id.clone(), field: "key".into(), values: presence });
                }
                out.keys.extend(rows);
            }
        }
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

/// Columns padded to their widest cell.
fn columns(rows: &[Vec<String>]) -> String {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..width)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, s)| if c + 1 == r.len() { s.clone() } else { format!("{s:<w$}", w = widths[c]) })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn verdict(v: Option<bool>) -> String {
    match v {
        Some(true) => "PASS".into(),
        Some(false) => "FAIL".into(),
        None => "-".into(),
    }
}

impl Comparison {
    fn change_headers(&self) -> Vec<String> {
        self.sides[1..].iter().map(|(l, _)| format!("{l}-{}", self.sides[0].0)).collect()
    }

    fn labels(&self) -> Vec<String> {
        self.sides.iter().map(|(l, _)| l.clone()).collect()
    }

    fn key_cells(r: &KeyRow) -> Vec<String> {
        r.values.iter().map(|v| v.clone().unwrap_or_else(|| "(absent)".into())).collect()
    }

    fn metric_cells(&self, r: &MetricRow) -> Vec<String> {
        let mut cells: Vec<String> = r
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let side = label(i);
                if self.unreadable.iter().any(|u| u.node == r.node && u.side == side) {
                    "unreadable".into()
                } else {
                    r.unit.show(*v)
                }
            })
            .collect();
        cells.extend(r.changes.iter().map(|c| r.unit.show_change(*c)));
        cells
    }

    /// The plain-text long layout.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (l, name) in &self.sides {
            let _ = writeln!(out, "{l}: {name}");
        }
        let hidden = if self.all { "" } else { " (unchanged rows hidden; --all shows them)" };
        let _ = writeln!(out, "\nkeys{hidden}");
        if self.keys.is_empty() {
            out.push_str("  every node has the same key\n");
        } else {
            // Values are as long as a param or an input's producer: written
            // `A → B → C` after the padded node and field, never padded.
            let arrows = self.labels().join(" → ");
            let mut rows = vec![vec!["node".to_string(), "field".into(), arrows]];
            rows.extend(
                self.keys.iter().map(|r| vec![r.node.clone(), r.field.clone(), Self::key_cells(r).join(" → ")]),
            );
            out.push_str(&indent(&columns(&rows)));
        }
        let _ = writeln!(out, "\nmetrics{hidden}");
        if self.metrics.is_empty() {
            out.push_str("  no metric differs\n");
        } else {
            let mut rows =
                vec![[vec!["node".to_string(), "metric".into()], self.labels(), self.change_headers()].concat()];
            rows.extend(
                self.metrics.iter().map(|r| [vec![r.node.clone(), r.metric.clone()], self.metric_cells(r)].concat()),
            );
            out.push_str(&indent(&columns(&rows)));
        }
        let _ = writeln!(out, "\ngates{hidden}");
        if self.gates.is_empty() {
            out.push_str("  no verdict differs\n");
        } else {
            let mut rows = vec![[vec!["gate".to_string()], self.labels()].concat()];
            rows.extend(
                self.gates
                    .iter()
                    .map(|g| [vec![g.gate.clone()], g.passed.iter().map(|p| verdict(*p)).collect()].concat()),
            );
            out.push_str(&indent(&columns(&rows)));
        }
        if !self.unreadable.is_empty() {
            out.push_str("\ncannot read (nothing compared from these)\n");
            for u in &self.unreadable {
                let _ = writeln!(out, "  {} on {}: {}", u.node, u.side, u.error);
            }
        }
        out
    }

    /// Markdown tables (for a pull request or a release note).
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for (l, name) in &self.sides {
            let _ = writeln!(out, "- **{l}**: `{}`", md_cell(name));
        }
        let table = |out: &mut String, head: Vec<String>, rows: Vec<Vec<String>>| {
            if rows.is_empty() {
                out.push_str("\nNo difference.\n");
                return;
            }
            let _ = writeln!(out, "\n| {} |", head.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
            for r in rows {
                let cells: Vec<String> = r.iter().map(|c| md_cell(c)).collect();
                let _ = writeln!(out, "| {} |", cells.join(" | "));
            }
        };
        out.push_str("\n### Keys\n");
        table(
            &mut out,
            [vec!["node".into(), "field".into()], self.labels()].concat(),
            self.keys.iter().map(|r| [vec![r.node.clone(), r.field.clone()], Self::key_cells(r)].concat()).collect(),
        );
        out.push_str("\n### Metrics\n");
        table(
            &mut out,
            [vec!["node".into(), "metric".into()], self.labels(), self.change_headers()].concat(),
            self.metrics
                .iter()
                .map(|r| [vec![r.node.clone(), r.metric.clone()], self.metric_cells(r)].concat())
                .collect(),
        );
        out.push_str("\n### Gates\n");
        table(
            &mut out,
            [vec!["gate".into()], self.labels()].concat(),
            self.gates
                .iter()
                .map(|g| [vec![g.gate.clone()], g.passed.iter().map(|p| verdict(*p)).collect()].concat())
                .collect(),
        );
        for u in &self.unreadable {
            let _ = writeln!(out, "\n**Cannot read** `{}` on {}: {}", md_cell(&u.node), u.side, md_cell(&u.error));
        }
        out
    }
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A node id split into its written id and matrix values (`grpo@g=4,seed=0`
/// → `grpo`, {g: 4, seed: 0}). A value rendered as JSON may hold commas;
/// a segment starts only where an axis name and `=` follow one.
pub fn split_id(id: &str) -> (String, BTreeMap<String, String>) {
    let Some((base, rest)) = id.split_once('@') else { return (id.to_string(), BTreeMap::new()) };
    let is_axis = |s: &str| {
        s.split_once('=').is_some_and(|(a, _)| {
            !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        })
    };
    let mut parts: Vec<String> = Vec::new();
    for piece in rest.split(',') {
        match parts.last_mut() {
            Some(last) if !is_axis(piece) => {
                last.push(',');
                last.push_str(piece);
            }
            _ => parts.push(piece.to_string()),
        }
    }
    let binding = parts.iter().filter_map(|p| p.split_once('=')).map(|(a, v)| (a.to_string(), v.to_string())).collect();
    (base.to_string(), binding)
}

/// The matrix axis `written` names among the sides' nodes: itself when some
/// node has it, else the one axis whose last dotted part it is, case aside
/// (`seed` for `env.SEED`, as a user says it); `written` unchanged when none
/// or several are.
pub fn resolve_axis(sides: &[Side], written: &str) -> String {
    let mut axes = BTreeSet::new();
    for s in sides {
        for n in &s.source.nodes {
            axes.extend(split_id(&n.id).1.into_keys());
        }
    }
    if axes.contains(written) {
        return written.to_string();
    }
    let matching: Vec<&String> =
        axes.iter().filter(|a| a.rsplit('.').next().is_some_and(|last| last.eq_ignore_ascii_case(written))).collect();
    match matching.as_slice() {
        [one] => (*one).clone(),
        _ => written.to_string(),
    }
}

/// The group of a matrix node over one axis (its id without that axis:
/// `e2@guard=on,seed=3` over `seed` → `e2@guard=on`) and its value on the
/// axis; `None` when the node does not have the axis.
pub fn group_of(id: &str, axis: &str) -> Option<(String, String)> {
    let (base, mut binding) = split_id(id);
    let member = binding.remove(axis)?;
    let rest: Vec<String> = binding.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Some((if rest.is_empty() { base } else { format!("{base}@{}", rest.join(",")) }, member))
}

/// Mean, sample standard deviation and count of the defined values of a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Values that were defined.
    pub n: usize,
    /// Members whose value was undefined (left out of n, mean and std).
    pub undefined: usize,
    /// `None` when no member's value is defined.
    pub mean: Option<f64>,
    /// Sample standard deviation (n − 1); `None` below two defined values.
    pub std: Option<f64>,
}

impl Summary {
    pub fn of(values: &[Option<f64>]) -> Summary {
        let defined: Vec<f64> = values.iter().flatten().copied().filter(|v| v.is_finite()).collect();
        let n = defined.len();
        Summary {
            n,
            undefined: values.len() - n,
            mean: mean(defined.iter().copied()),
            std: crate::stats::sample_std(&defined),
        }
    }
}

/// One metric over the members of one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupRow {
    /// The written id plus the matrix values that remain (`grpo@g=4`).
    pub group: String,
    pub metric: String,
    pub unit: Unit,
    /// The grouped axis's values of the members, in order.
    pub members: Vec<String>,
    pub values: Vec<Option<f64>>,
    #[serde(flatten)]
    pub summary: Summary,
}

/// Greedy success of one group against a baseline group of the same written
/// id, paired over the problems both answered (each problem's success is its
/// mean over the group's members).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairedRow {
    pub baseline: String,
    pub group: String,
    pub population: String,
    pub problems: usize,
    /// `group − baseline`; `None` with `undefined_because` when it cannot be computed.
    pub difference: Option<Interval>,
    pub undefined_because: Option<String>,
}

/// Every group of a run over one axis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grouped {
    pub source: String,
    pub axis: String,
    pub rows: Vec<GroupRow>,
    pub paired: Vec<PairedRow>,
    pub unreadable: Vec<Unreadable>,
}

/// The seed every paired interval of `compare --group-by` resamples with.
const GROUP_SEED: u64 = 0x0c0a_9a4e;

/// Groups the nodes of one source that have `axis` in their matrix by their
/// other matrix values; `Err` when no node has that axis.
pub fn group(side: &Side, axis: &str) -> Result<Grouped, String> {
    // group id → (member value, node), members in id order.
    let mut groups: BTreeMap<String, Vec<(String, &Node)>> = BTreeMap::new();
    let mut axes = BTreeSet::new();
    for node in &side.source.nodes {
        axes.extend(split_id(&node.id).1.into_keys());
        let Some((id, member)) = group_of(&node.id, axis) else { continue };
        groups.entry(id).or_default().push((member, node));
    }
    if groups.is_empty() {
        return Err(format!(
            "no node of {} has a matrix axis '{axis}' (its axes: {})",
            side.name,
            if axes.is_empty() { "none".to_string() } else { axes.into_iter().collect::<Vec<_>>().join(", ") }
        ));
    }
    let mut out = Grouped {
        source: side.name.clone(),
        axis: axis.into(),
        rows: Vec::new(),
        paired: Vec::new(),
        unreadable: Vec::new(),
    };
    // Per group: each problem's success per member, for the paired intervals.
    let mut problems: BTreeMap<String, Result<Outcomes, String>> = BTreeMap::new();
    for (id, members) in &groups {
        let table = MetricTable::of(&members.iter().map(|(_, n)| Some(*n)).collect::<Vec<_>>());
        for (i, error) in &table.unreadable {
            let node = members[*i].1.id.clone();
            out.unreadable.push(Unreadable { side: side.name.clone(), node, error: error.clone() });
        }
        for name in &table.order {
            let (unit, values) = table.column(name);
            out.rows.push(GroupRow {
                group: id.clone(),
                metric: name.clone(),
                unit,
                members: members.iter().map(|(v, _)| v.clone()).collect(),
                summary: Summary::of(&values),
                values,
            });
        }
        if members.iter().all(|(_, n)| n.kind() == NodeKind::Scoring) {
            problems.insert(id.clone(), per_problem(members));
        }
    }
    // Paired intervals: every group against the first of the same written id.
    let mut by_base: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for id in problems.keys() {
        by_base.entry(split_id(id).0).or_default().push(id);
    }
    for ids in by_base.values() {
        let Some((baseline, rest)) = ids.split_first() else { continue };
        // The populations of the baseline's problems, ALL first.
        let mut populations = vec![ALL.to_string()];
        if let Some(Ok(outcomes)) = problems.get(*baseline) {
            let named: BTreeSet<&String> = outcomes.values().map(|(p, _)| p).filter(|p| *p != ALL).collect();
            populations.extend(named.into_iter().cloned());
        }
        for id in rest {
            for pop in &populations {
                out.paired.push(paired(&problems, baseline, id, pop));
            }
        }
    }
    Ok(out)
}

/// Problem id → its population and its greedy success (1 or 0) per member.
type Outcomes = BTreeMap<String, (String, Vec<f64>)>;

/// Each problem's population and greedy success per member; `Err` when a
/// results file does not read or the members did not answer the same problems.
fn per_problem(members: &[(String, &Node)]) -> Result<Outcomes, String> {
    let mut out: BTreeMap<String, (String, Vec<f64>)> = BTreeMap::new();
    for (i, (_, node)) in members.iter().enumerate() {
        let path = node.artifact(ArtifactKind::EvalResults).ok_or_else(|| format!("{}: no results file", node.id))?;
        let r = EvalResults::read(path).map_err(|e| e.to_string())?;
        if i > 0 && (r.greedy_problems.len() != out.len() || r.greedy_problems.keys().any(|k| !out.contains_key(k))) {
            return Err(format!("{} did not answer the same problems as the group's other members", node.id));
        }
        for (problem, o) in r.greedy_problems {
            out.entry(problem)
                .or_insert_with(|| (o.population.clone(), Vec::new()))
                .1
                .push(f64::from(u8::from(o.correct)));
        }
    }
    Ok(out)
}

fn paired(
    problems: &BTreeMap<String, Result<Outcomes, String>>,
    baseline: &str,
    group: &str,
    population: &str,
) -> PairedRow {
    let mut row = PairedRow {
        baseline: baseline.into(),
        group: group.into(),
        population: population.into(),
        problems: 0,
        difference: None,
        undefined_because: None,
    };
    let (Some(Ok(a)), Some(Ok(b))) = (problems.get(baseline), problems.get(group)) else {
        let why = [problems.get(baseline), problems.get(group)]
            .into_iter()
            .flatten()
            .find_map(|r| r.as_ref().err().cloned())
            .unwrap_or_else(|| "no results".into());
        row.undefined_because = Some(why);
        return row;
    };
    let pairs: Vec<(f64, f64)> = a
        .iter()
        .filter(|(_, (pop, _))| population == ALL || pop == population)
        .filter_map(|(id, (_, xs))| {
            let ys = &b.get(id)?.1;
            Some((mean(xs.iter().copied())?, mean(ys.iter().copied())?))
        })
        .collect();
    row.problems = pairs.len();
    row.difference = crate::stats::paired_difference(&pairs, GROUP_SEED);
    if row.difference.is_none() {
        row.undefined_because = Some(format!("no problem of {population} was answered by both"));
    }
    row
}

impl Grouped {
    fn group_cells(r: &GroupRow) -> Vec<String> {
        let std = match r.summary.std {
            Some(s) => r.unit.show(Some(s)),
            None => "undefined".into(),
        };
        let undefined =
            if r.summary.undefined > 0 { format!(" ({} undefined)", r.summary.undefined) } else { String::new() };
        vec![
            r.group.clone(),
            r.metric.clone(),
            r.unit.show(r.summary.mean),
            std,
            format!("{}{undefined}", r.summary.n),
            r.values.iter().map(|v| r.unit.show(*v)).collect::<Vec<_>>().join(" "),
        ]
    }

    fn paired_cells(p: &PairedRow) -> Vec<String> {
        let diff = match (&p.difference, &p.undefined_because) {
            (Some(i), _) => format!("{:+.4} [{:+.4}, {:+.4}]", i.estimate, i.low, i.high),
            (None, why) => format!("undefined ({})", why.as_deref().unwrap_or("-")),
        };
        vec![format!("{} − {}", p.group, p.baseline), p.population.clone(), p.problems.to_string(), diff]
    }

    /// The plain-text long layout.
    pub fn text(&self) -> String {
        let mut out = format!("{} grouped by {}: mean ± sample std over the members\n\n", self.source, self.axis);
        let head = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut rows = vec![head(&["group", "metric", "mean", "std", "n", &format!("values by {}", self.axis)])];
        rows.extend(self.rows.iter().map(Self::group_cells));
        out.push_str(&indent(&columns(&rows)));
        if !self.paired.is_empty() {
            out.push_str("\ngreedy success, paired over problems (95% bootstrap interval)\n");
            let mut rows = vec![head(&["difference", "population", "problems", "estimate [interval]"])];
            rows.extend(self.paired.iter().map(Self::paired_cells));
            out.push_str(&indent(&columns(&rows)));
        }
        if !self.unreadable.is_empty() {
            out.push_str("\ncannot read (nothing grouped from these)\n");
            for u in &self.unreadable {
                let _ = writeln!(out, "  {}: {}", u.node, u.error);
            }
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut out =
            format!("**{}** grouped by `{}`: mean ± sample std over the members\n\n", md_cell(&self.source), self.axis);
        let _ =
            writeln!(out, "| group | metric | mean | std | n | values by {} |\n|---|---|---|---|---|---|", self.axis);
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} |",
                Self::group_cells(r).iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        if !self.paired.is_empty() {
            out.push_str("\n| difference | population | problems | estimate [95% interval] |\n|---|---|---|---|\n");
            for p in &self.paired {
                let _ = writeln!(
                    out,
                    "| {} |",
                    Self::paired_cells(p).iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | ")
                );
            }
        }
        for u in &self.unreadable {
            let _ = writeln!(out, "\n**Cannot read** `{}`: {}", md_cell(&u.node), md_cell(&u.error));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (Issue #35.) A user's command with an output of its own named
    /// `metrics` gives its declared metrics, never a training-metrics reading.
    #[test]
    fn a_commands_own_output_named_metrics_is_not_read_as_training_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("metrics");
        std::fs::write(&theirs, "{\"accuracy\": 0.9}").unwrap();
        let shell = Node {
            id: "train".into(),
            op: "shell".into(),
            key: None,
            outcome: "ran".into(),
            seconds: Some(1.0),
            deps: vec![],
            outputs: BTreeMap::from([("metrics".to_string(), theirs.clone())]),
            hashes: BTreeMap::new(),
            record: None,
            costs: None,
        };
        assert_eq!(node_metrics(&shell).unwrap(), Vec::new(), "no declared metrics, and no training reading");
        // The same file under a training op is read as training metrics, and refused.
        let training = Node { op: "train.sft".into(), ..shell };
        assert!(node_metrics(&training).unwrap_err().contains("metrics"));
    }

    #[test]
    fn a_matrix_id_splits_into_its_written_id_and_values_even_with_json_labels() {
        let (base, b) = split_id("grpo@fault={\"at\":2,\"family\":\"F3\"},seed=1");
        assert_eq!(base, "grpo");
        assert_eq!(b.get("fault").map(String::as_str), Some("{\"at\":2,\"family\":\"F3\"}"));
        assert_eq!(b.get("seed").map(String::as_str), Some("1"));
        assert_eq!(split_id("data"), ("data".to_string(), BTreeMap::new()));
    }

    #[test]
    fn a_summary_leaves_undefined_values_out_and_never_invents_a_spread() {
        let s = Summary::of(&[Some(1.0), None, Some(3.0)]);
        assert_eq!((s.n, s.undefined, s.mean), (2, 1, Some(2.0)));
        assert!((s.std.unwrap() - 2f64.sqrt()).abs() < 1e-12);
        let one = Summary::of(&[Some(0.5)]);
        assert_eq!((one.mean, one.std), (Some(0.5), None));
        let none = Summary::of(&[None, None]);
        assert_eq!((none.n, none.mean, none.std), (0, None, None));
    }

    #[test]
    fn a_tables_per_draw_comparisons_are_compared_and_an_older_table_simply_has_none() {
        let path = crate::example_packs::outputs("v0.3.0").join("results/table.json");
        let mut t: ResultsTableFile = crate::canonical::read_typed(&path).unwrap();
        assert!(t.draw_comparisons.is_none(), "v0.3.0 was written by results.table version 2");
        let names = |t: &ResultsTableFile| table_metrics(t).into_iter().map(|m| m.name).collect::<Vec<_>>();
        assert!(names(&t).iter().any(|n| n == "paired difference grpo − sft ID50"), "{:?}", names(&t));
        assert!(!names(&t).iter().any(|n| n.starts_with("paired per-draw")));
        let interval = crate::stats::paired_difference(&[(0.25, 0.5), (0.0, 0.25)], 1);
        t.draw_comparisons = Some(vec![crate::ops::results::PairedDrawComparison {
            baseline: "sft".into(),
            baseline_per_draw: Some(0.125),
            difference: interval,
            policy: "grpo".into(),
            policy_per_draw: Some(0.375),
            population: "ID50".into(),
            problems: 2,
            undefined_because: None,
        }]);
        let m = table_metrics(&t).into_iter().find(|m| m.name == "paired per-draw difference grpo − sft ID50").unwrap();
        assert_eq!(m.value, Some(0.25));
    }

    #[test]
    fn changes_are_signed_at_the_unit_precision_and_undefined_stays_undefined() {
        assert_eq!(Unit::Rate.show_change(Some(-0.02)), "-0.0200");
        assert_eq!(Unit::Rate.show_change(Some(0.0)), "+0.0000");
        assert_eq!(Unit::Seconds.show_change(None), "undefined");
        assert_eq!(Unit::Value.show(Some(2.5e-5)), "2.500e-5");
    }
}

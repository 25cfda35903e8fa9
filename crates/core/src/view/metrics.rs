//! What a node measured, each value read through its writer's type: the
//! training curves ([`grpo_curves`], [`sft_curves`]), one value per metric
//! ([`node_metrics`]: rates, losses, costs, a results table's differences),
//! and a command's own `metrics:` and `series:` files. A file that does not
//! read is an error naming it and the field, never a zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{NodeView, Result, ViewError};
use crate::ops::artifacts::{ArtifactKind, NodeKind};
use crate::ops::eval::{EvalResults, EvalSummary};
use crate::ops::results::ResultsTableFile;
use crate::stats::mean_of;
use crate::stats::mean_of as mean;
use crate::train::metrics::{GrpoMetrics, SftMetrics, TrainingMetrics, UpdateStats};

/// A shell node's declared params, as its record keeps them (`None` for
/// other ops and for a node that never completed).
fn shell_params(node: &NodeView) -> Result<Option<crate::ops::ShellParams>> {
    if node.kind() != NodeKind::Command {
        return Ok(None);
    }
    let Some(record) = &node.record else { return Ok(None) };
    serde_json::from_value(record.params.clone())
        .map(Some)
        .map_err(|e| ViewError::Invalid(format!("the recorded params of shell node '{}' do not read: {e}", node.id)))
}

/// Where a declared file of a node is: its out's readable path, and the
/// file's path inside it (a store object has no extension, so the declared
/// name is what says the format).
fn declared_file(
    node: &NodeView,
    rel: &str,
    holder: &str,
    inside: &str,
) -> std::result::Result<(PathBuf, String), String> {
    let object = node.outputs.get(holder).ok_or_else(|| match node.unavailable.get(holder) {
        Some(why) => format!("'{rel}': its out '{holder}' is not shown: {why}"),
        None => format!("'{rel}': its out '{holder}' is not available"),
    })?;
    let path = if inside.is_empty() { object.clone() } else { object.join(inside) };
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => Ok((dir.to_path_buf(), name.to_string_lossy().into_owned())),
        _ => Err(format!("'{rel}': no readable path")),
    }
}

/// A shell node's own metrics (`metrics:`), read with the one reader of the
/// user's files ([`crate::docfile`]): each leaf at its dotted path, prefixed
/// with the file when the node declares several; what is not a number is
/// undefined with the reason. Empty for other ops. Shared by `compare`, the
/// report and `export tensorboard`.
pub fn user_metrics(node: &NodeView) -> Result<Vec<(String, crate::docfile::MetricValue)>> {
    declared(node, "metrics", crate::ops::ShellParams::metrics_files, |root, name, rel| {
        let format = crate::docfile::Format::of(rel).ok_or_else(|| format!("'{rel}': not a metrics file format"))?;
        let doc = crate::docfile::read_as(root, name, format).map_err(|e| e.to_string())?;
        Ok(crate::docfile::flatten_metrics(&doc).into_iter().collect())
    })
}

/// A shell node's step series (`series:`): one curve per metric, prefixed
/// with the file when the node declares several. Empty for other ops.
pub fn user_series(node: &NodeView) -> Result<Vec<(String, Curve)>> {
    declared(node, "series", crate::ops::ShellParams::series_files, |root, name, rel| {
        let format =
            crate::docfile::SeriesFormat::of(rel).ok_or_else(|| format!("'{rel}': not a series file format"))?;
        Ok(crate::docfile::read_series(root, name, format).map_err(|e| e.to_string())?.into_iter().collect())
    })
}

/// Every named value a shell node's declared files of one kind hold, each
/// file read by `read(folder, name, declared path)`; a name is prefixed with
/// its file when the node declares several.
fn declared<T>(
    node: &NodeView,
    what: &str,
    files_of: fn(&crate::ops::ShellParams) -> Vec<(String, String, String)>,
    read: impl Fn(&Path, &str, &str) -> std::result::Result<Vec<(String, T)>, String>,
) -> Result<Vec<(String, T)>> {
    let Some(params) = shell_params(node)? else { return Ok(Vec::new()) };
    let files = files_of(&params);
    let mut out = Vec::new();
    for (rel, holder, inside) in &files {
        let (root, name) =
            declared_file(node, rel, holder, inside).map_err(|e| ViewError::Invalid(format!("{what} file {e}")))?;
        let values = read(&root, &name, rel).map_err(|e| ViewError::Invalid(format!("{what} file {rel}: {e}")))?;
        for (key, value) in values {
            out.push((if files.len() == 1 { key } else { format!("{rel}:{key}") }, value));
        }
    }
    Ok(out)
}

/// One metric of one node: y at each x, `None` where undefined.
pub type Curve = Vec<(f64, Option<f64>)>;

/// The GRPO curves the reports draw, by iteration (the last four averaged
/// over the iteration's updates; undefined, not 0, where none ran).
pub fn grpo_curves(m: &GrpoMetrics) -> Vec<(String, Curve)> {
    let h = &m.history;
    let over = |i: &crate::train::metrics::GrpoIteration, f: fn(&UpdateStats) -> f64| mean_of(i.updates.iter().map(f));
    let curve = |y: &dyn Fn(&crate::train::metrics::GrpoIteration) -> Option<f64>| -> Curve {
        h.iter().map(|i| (i.iteration as f64, y(i))).collect()
    };
    let mut out: Vec<(String, Curve)> = vec![
        ("mean reward", curve(&|i| Some(i.mean_reward))),
        ("zero-variance group fraction", curve(&|i| Some(i.zero_variance_fraction))),
        ("mean exact KL", curve(&|i| over(i, |u| u.kl))),
        ("clip fraction", curve(&|i| over(i, |u| u.clip_fraction))),
        ("gradient norm", curve(&|i| over(i, |u| u.grad_norm))),
        ("learning rate", curve(&|i| over(i, |u| u.lr))),
    ]
    .into_iter()
    .map(|(t, c)| (t.to_string(), c))
    .collect();
    // Each reward term's mean and std (TRL's rewards/<name>/mean and /std),
    // when the reward has several terms or one of them is a program.
    let names: std::collections::BTreeSet<&String> = h.iter().flat_map(|i| i.reward_terms.keys()).collect();
    let plain = names.len() == 1 && h.iter().all(|i| i.reward_terms.values().all(|t| t.mean == i.mean_reward));
    if !plain {
        for name in names {
            out.push((format!("rewards/{name}/mean"), curve(&|i| i.reward_terms.get(name).map(|t| t.mean))));
            out.push((format!("rewards/{name}/std"), curve(&|i| i.reward_terms.get(name).and_then(|t| t.std))));
        }
    }
    out
}

/// The SFT curves the reports draw.
pub fn sft_curves(m: &SftMetrics) -> Vec<(String, Curve)> {
    let curves: Vec<(&str, Curve)> = vec![
        ("training NLL per update", m.history.iter().map(|u| (u.update as f64, Some(u.loss))).collect()),
        (
            "validation NLL per epoch",
            m.validation_history.iter().map(|v| (v.epoch as f64 + 1.0, Some(v.validation_nll))).collect(),
        ),
    ];
    curves.into_iter().map(|(t, c)| (t.to_string(), c)).collect()
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
fn cost_metrics(node: &NodeView, m: Option<&TrainingMetrics>) -> Vec<Metric> {
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
pub fn node_metrics(node: &NodeView) -> Result<Vec<Metric>> {
    let read_err = |what: &str, e: &dyn std::fmt::Display| ViewError::Invalid(format!("{what}: {e}"));
    match node.kind() {
        NodeKind::Training => {
            let Some(p) = node.artifact(ArtifactKind::TrainingMetrics) else { return Ok(cost_metrics(node, None)) };
            let m = TrainingMetrics::read(p.map_err(|why| read_err("metrics", &why))?)
                .map_err(|e| read_err("metrics", &e))?;
            let mut out = match &m {
                TrainingMetrics::Grpo(m) => grpo_metrics(m),
                TrainingMetrics::Sft(m) => sft_metrics(m),
            };
            out.extend(cost_metrics(node, Some(&m)));
            Ok(out)
        }
        NodeKind::Scoring => {
            let Some(p) = node.artifact(ArtifactKind::EvalResults) else { return Ok(Vec::new()) };
            let p = p.map_err(|why| read_err("results", &why))?;
            Ok(eval_metrics(&EvalResults::read(p).map_err(|e| read_err("results", &e))?))
        }
        NodeKind::Generation => {
            // A summary that does not read is said, never taken for "no costs".
            if let Some(p) = node.artifact(ArtifactKind::EvalSummary) {
                let p = p.map_err(|why| read_err("summary", &why))?;
                let _: EvalSummary = crate::canonical::read_typed(p).map_err(|e| read_err("summary", &e))?;
            }
            Ok(cost_metrics(node, None))
        }
        NodeKind::ResultsTable => {
            let Some(p) = node.artifact(ArtifactKind::ResultsTable) else { return Ok(Vec::new()) };
            let p = p.map_err(|why| read_err("table.json", &why))?;
            let t: ResultsTableFile = crate::canonical::read_typed(p).map_err(|e| read_err("table.json", &e))?;
            Ok(table_metrics(&t))
        }
        NodeKind::Command => shell_metrics(node),
        NodeKind::Gate | NodeKind::Other => Ok(Vec::new()),
    }
}

/// A shell node's own metrics ([`user_metrics`]).
fn shell_metrics(node: &NodeView) -> Result<Vec<Metric>> {
    Ok(user_metrics(node)?
        .into_iter()
        .map(|(name, value)| Metric { name, unit: Unit::Number, value: value.number() })
        .collect())
}

/// The metrics of several nodes side by side (a node absent from a side has none).
pub(crate) struct MetricTable {
    /// Each node's metrics by name.
    by_node: Vec<BTreeMap<String, Metric>>,
    /// Every name, in order of first appearance.
    pub(crate) order: Vec<String>,
    /// (position, why its files did not read): nothing is taken from those.
    pub(crate) unreadable: Vec<(usize, String)>,
}

impl MetricTable {
    pub(crate) fn of(nodes: &[Option<&NodeView>]) -> MetricTable {
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
                Some(Err(error)) => t.unreadable.push((i, error.to_string())),
                None => {}
            }
            t.by_node.push(m);
        }
        t
    }

    /// One metric's unit and its value on each node (`None`: undefined or absent).
    pub(crate) fn column(&self, name: &str) -> (Unit, Vec<Option<f64>>) {
        let unit = self.by_node.iter().find_map(|m| m.get(name)).map_or(Unit::Value, |m| m.unit);
        (unit, self.by_node.iter().map(|m| m.get(name).and_then(|m| m.value)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_node;
    use super::*;

    /// (Issue #35.) A user's command with an output of its own named
    /// `metrics` gives its declared metrics, never a training-metrics reading.
    #[test]
    fn a_commands_own_output_named_metrics_is_not_read_as_training_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("metrics");
        std::fs::write(&theirs, "{\"accuracy\": 0.9}").unwrap();
        let shell = test_node("train", "shell", &[("metrics", &theirs)]);
        assert_eq!(node_metrics(&shell).unwrap(), Vec::new(), "no declared metrics, and no training reading");
        // The same file under a training op is read as training metrics, and refused.
        let training = NodeView { op: "train.sft".into(), ..shell };
        assert!(node_metrics(&training).unwrap_err().to_string().contains("metrics"));
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

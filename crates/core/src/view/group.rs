//! `compare --group-by AXIS`: over one matrix axis of one run (seeds), mean ±
//! sample standard deviation and n at each remaining matrix point, and a
//! paired bootstrap interval between evaluations of the same problems.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::compare::Unreadable;
use super::metrics::{MetricTable, Unit};
use super::{NodeView, Side};
use crate::ops::artifacts::{ArtifactKind, NodeKind};
use crate::ops::eval::{EvalResults, ALL};
use crate::stats::mean_of as mean;
use crate::stats::Interval;

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
        for n in &s.view.nodes {
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
pub fn group(side: &Side, axis: &str) -> super::Result<Grouped> {
    // group id → (member value, node), members in id order.
    let mut groups: BTreeMap<String, Vec<(String, &NodeView)>> = BTreeMap::new();
    let mut axes = BTreeSet::new();
    for node in &side.view.nodes {
        axes.extend(split_id(&node.id).1.into_keys());
        let Some((id, member)) = group_of(&node.id, axis) else { continue };
        groups.entry(id).or_default().push((member, node));
    }
    if groups.is_empty() {
        return Err(super::ViewError::Invalid(format!(
            "no node of {} has a matrix axis '{axis}' (its axes: {})",
            side.name,
            if axes.is_empty() { "none".to_string() } else { axes.into_iter().collect::<Vec<_>>().join(", ") }
        )));
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
fn per_problem(members: &[(String, &NodeView)]) -> Result<Outcomes, String> {
    let mut out: BTreeMap<String, (String, Vec<f64>)> = BTreeMap::new();
    for (i, (_, node)) in members.iter().enumerate() {
        let path = node
            .artifact(ArtifactKind::EvalResults)
            .ok_or_else(|| format!("{}: no results file", node.id))?
            .map_err(|why| format!("{}: {why}", node.id))?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

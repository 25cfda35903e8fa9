//! The plain-text long layouts of a comparison and a grouping.

use std::fmt::Write as _;

use super::cells::{group_cells, paired_cells, verdict};
use super::compare::Comparison;
use super::group::Grouped;

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

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}

/// A comparison, one row per node and field, in padded columns.
pub fn comparison(c: &Comparison) -> String {
    let mut out = String::new();
    for (l, name) in &c.sides {
        let _ = writeln!(out, "{l}: {name}");
    }
    let hidden = if c.all { "" } else { " (unchanged rows hidden; --all shows them)" };
    let _ = writeln!(out, "\nkeys{hidden}");
    if c.keys.is_empty() {
        out.push_str("  every node has the same key\n");
    } else {
        // Values are as long as a param or an input's producer: written
        // `A → B → C` after the padded node and field, never padded.
        let arrows = c.labels().join(" → ");
        let mut rows = vec![vec!["node".to_string(), "field".into(), arrows]];
        rows.extend(c.keys.iter().map(|r| vec![r.node.clone(), r.field.clone(), Comparison::key_cells(r).join(" → ")]));
        out.push_str(&indent(&columns(&rows)));
    }
    if !c.outputs.is_empty() {
        // Shown only when there is one: the same inputs gave other bytes.
        out.push_str(
            "\noutputs that differ under the same key (the node did not give the same bytes twice: \
                      `orchestrate run SPEC --check NODE` re-executes it)\n",
        );
        let mut rows = vec![vec!["node".to_string(), "output".into(), c.labels().join(" → ")]];
        rows.extend(
            c.outputs.iter().map(|r| vec![r.node.clone(), r.output.clone(), Comparison::hash_cells(r).join(" → ")]),
        );
        out.push_str(&indent(&columns(&rows)));
    }
    let _ = writeln!(out, "\nmetrics{hidden}");
    if c.metrics.is_empty() {
        out.push_str("  no metric differs\n");
    } else {
        let mut rows = vec![[vec!["node".to_string(), "metric".into()], c.labels(), c.change_headers()].concat()];
        rows.extend(c.metrics.iter().map(|r| [vec![r.node.clone(), r.metric.clone()], c.metric_cells(r)].concat()));
        out.push_str(&indent(&columns(&rows)));
    }
    let _ = writeln!(out, "\ngates{hidden}");
    if c.gates.is_empty() {
        out.push_str("  no verdict differs\n");
    } else {
        let mut rows = vec![[vec!["gate".to_string()], c.labels()].concat()];
        rows.extend(
            c.gates.iter().map(|g| [vec![g.gate.clone()], g.passed.iter().map(|p| verdict(*p)).collect()].concat()),
        );
        out.push_str(&indent(&columns(&rows)));
    }
    if !c.unreadable.is_empty() {
        out.push_str("\ncannot read (nothing compared from these)\n");
        for u in &c.unreadable {
            let _ = writeln!(out, "  {} on {}: {}", u.node, u.side, u.error);
        }
    }
    out
}

/// A grouping: one row per group and metric, then the paired intervals.
pub fn grouped(g: &Grouped) -> String {
    let mut out = format!("{} grouped by {}: mean ± sample std over the members\n\n", g.source, g.axis);
    let head = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut rows = vec![head(&["group", "metric", "mean", "std", "n", &format!("values by {}", g.axis)])];
    rows.extend(g.rows.iter().map(group_cells));
    out.push_str(&indent(&columns(&rows)));
    if !g.paired.is_empty() {
        out.push_str("\ngreedy success, paired over problems (95% bootstrap interval)\n");
        let mut rows = vec![head(&["difference", "population", "problems", "estimate [interval]"])];
        rows.extend(g.paired.iter().map(paired_cells));
        out.push_str(&indent(&columns(&rows)));
    }
    if !g.unreadable.is_empty() {
        out.push_str("\ncannot read (nothing grouped from these)\n");
        for u in &g.unreadable {
            let _ = writeln!(out, "  {}: {}", u.node, u.error);
        }
    }
    out
}

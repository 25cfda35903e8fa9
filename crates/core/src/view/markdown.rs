//! Markdown tables of a comparison and a grouping (for a pull request or a
//! release note).

use std::fmt::Write as _;

use super::cells::{group_cells, paired_cells, verdict};
use super::compare::Comparison;
use super::group::Grouped;

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A comparison: the sides, then a table per section.
pub fn comparison(c: &Comparison) -> String {
    let mut out = String::new();
    for (l, name) in &c.sides {
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
        [vec!["node".into(), "field".into()], c.labels()].concat(),
        c.keys.iter().map(|r| [vec![r.node.clone(), r.field.clone()], Comparison::key_cells(r)].concat()).collect(),
    );
    if !c.outputs.is_empty() {
        out.push_str("\n### Outputs that differ under the same key\n");
        table(
            &mut out,
            [vec!["node".into(), "output".into()], c.labels()].concat(),
            c.outputs
                .iter()
                .map(|r| [vec![r.node.clone(), r.output.clone()], Comparison::hash_cells(r)].concat())
                .collect(),
        );
    }
    out.push_str("\n### Metrics\n");
    table(
        &mut out,
        [vec!["node".into(), "metric".into()], c.labels(), c.change_headers()].concat(),
        c.metrics.iter().map(|r| [vec![r.node.clone(), r.metric.clone()], c.metric_cells(r)].concat()).collect(),
    );
    out.push_str("\n### Gates\n");
    table(
        &mut out,
        [vec!["gate".into()], c.labels()].concat(),
        c.gates
            .iter()
            .map(|g| [vec![g.gate.clone()], g.passed.iter().map(|p| verdict(*p)).collect()].concat())
            .collect(),
    );
    for u in &c.unreadable {
        let _ = writeln!(out, "\n**Cannot read** `{}` on {}: {}", md_cell(&u.node), u.side, md_cell(&u.error));
    }
    out
}

/// A grouping: a table of the groups, then one of the paired intervals.
pub fn grouped(g: &Grouped) -> String {
    let mut out = format!("**{}** grouped by `{}`: mean ± sample std over the members\n\n", md_cell(&g.source), g.axis);
    let _ = writeln!(out, "| group | metric | mean | std | n | values by {} |\n|---|---|---|---|---|---|", g.axis);
    for r in &g.rows {
        let _ = writeln!(out, "| {} |", group_cells(r).iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | "));
    }
    if !g.paired.is_empty() {
        out.push_str("\n| difference | population | problems | estimate [95% interval] |\n|---|---|---|---|\n");
        for p in &g.paired {
            let _ = writeln!(out, "| {} |", paired_cells(p).iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | "));
        }
    }
    for u in &g.unreadable {
        let _ = writeln!(out, "\n**Cannot read** `{}`: {}", md_cell(&u.node), md_cell(&u.error));
    }
    out
}

//! The cells of a comparison's and a grouping's rows, as both the text and
//! the Markdown renderers write them.

use super::compare::{Comparison, KeyRow, MetricRow, OutputRow};
use super::group::{GroupRow, PairedRow};
use super::label;

pub(crate) fn verdict(v: Option<bool>) -> String {
    match v {
        Some(true) => "PASS".into(),
        Some(false) => "FAIL".into(),
        None => "-".into(),
    }
}

impl Comparison {
    pub(crate) fn change_headers(&self) -> Vec<String> {
        self.sides[1..].iter().map(|(l, _)| format!("{l}-{}", self.sides[0].0)).collect()
    }

    pub(crate) fn labels(&self) -> Vec<String> {
        self.sides.iter().map(|(l, _)| l.clone()).collect()
    }

    pub(crate) fn key_cells(r: &KeyRow) -> Vec<String> {
        absent_as_said(&r.values)
    }

    pub(crate) fn hash_cells(r: &OutputRow) -> Vec<String> {
        absent_as_said(&r.values)
    }

    pub(crate) fn metric_cells(&self, r: &MetricRow) -> Vec<String> {
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
}

pub(crate) fn group_cells(r: &GroupRow) -> Vec<String> {
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

pub(crate) fn paired_cells(p: &PairedRow) -> Vec<String> {
    let diff = match (&p.difference, &p.undefined_because) {
        (Some(i), _) => format!("{:+.4} [{:+.4}, {:+.4}]", i.estimate, i.low, i.high),
        (None, why) => format!("undefined ({})", why.as_deref().unwrap_or("-")),
    };
    vec![format!("{} − {}", p.group, p.baseline), p.population.clone(), p.problems.to_string(), diff]
}

fn absent_as_said(values: &[Option<String>]) -> Vec<String> {
    values.iter().map(|v| v.clone().unwrap_or_else(|| "(absent)".into())).collect()
}

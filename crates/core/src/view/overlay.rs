//! `orchestrate report A B ...` and `report --group-by AXIS`: the GRPO and SFT
//! curves of several runs or packs in one self-contained HTML file (inline
//! SVG, no script, nothing fetched), one chart per node and metric with a line
//! per run, a legend naming each. With `--group-by seed`, a matrix node's
//! expansions over the seeds become one line, their mean, with a band of ± one
//! sample standard deviation, and `n` in the legend. An undefined point breaks
//! a line; a metrics file that does not read is named in red, never drawn.

use crate::ops::artifacts::{ArtifactKind, NodeKind};
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::group::group_of;
use super::metrics::{grpo_curves, sft_curves, user_series, Curve};
use super::svg::{esc, Plot};
use super::{label, Side};
use crate::train::metrics::TrainingMetrics;

const PALETTE: [&str; 8] = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#4e342e"];

/// One side's colour.
pub fn colour(side: usize) -> &'static str {
    PALETTE[side % PALETTE.len()]
}

/// One point of a line: x, the mean (`None` where no member is defined), and
/// the band (mean ± sample std) where two or more are.
pub type Point = (f64, Option<f64>, Option<(f64, f64)>);

/// One line of a chart: a side's node, or its group's mean with a band.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub side: usize,
    /// How many runs it stands for (1: a node; more: a group's members).
    pub n: usize,
    /// (x, mean, band) at every x some member has; `None` mean where none is
    /// defined; the band (mean ± sample std) where two or more are.
    pub points: Vec<Point>,
}

/// The mean line and band of several curves of one metric.
pub fn combine(curves: &[&Curve]) -> Vec<Point> {
    let mut at: BTreeMap<u64, (f64, Vec<f64>)> = BTreeMap::new();
    for c in curves {
        for &(x, y) in c.iter() {
            let e = at.entry(x.to_bits()).or_insert((x, Vec::new()));
            if let Some(y) = y.filter(|y| y.is_finite()) {
                e.1.push(y);
            }
        }
    }
    let mut out: Vec<Point> = at
        .into_values()
        .map(|(x, ys)| {
            if ys.is_empty() {
                return (x, None, None);
            }
            let m = ys.iter().sum::<f64>() / ys.len() as f64;
            let band = crate::stats::sample_std(&ys).map(|sd| (m - sd, m + sd));
            (x, Some(m), band)
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// A chart's place: its section (`grpo`, `sft`), curve id and metric.
pub type ChartKey = (&'static str, String, String);

/// Every chart: (section, curve id, metric) → its lines, in order of appearance.
#[derive(Debug, Default)]
pub struct Charts {
    pub charts: Vec<(ChartKey, Vec<Line>)>,
    /// (side, node, why its metrics could not be read)
    pub unreadable: Vec<(usize, String, String)>,
}

/// The curve id of a node: its id, or with `group_by` its group's (the id
/// without that axis), when the node has the axis.
fn curve_id(id: &str, group_by: Option<&str>) -> String {
    group_by.and_then(|axis| group_of(id, axis)).map_or_else(|| id.to_string(), |(group, _)| group)
}

/// Reads every training node of every side and builds the charts.
pub fn charts(sides: &[Side], group_by: Option<&str>) -> Charts {
    let mut out = Charts::default();
    // (section, curve id, metric) → side → member curves
    let mut members: Vec<(ChartKey, BTreeMap<usize, Vec<Curve>>)> = Vec::new();
    for (s, side) in sides.iter().enumerate() {
        for node in &side.view.nodes {
            let named = |curves: Vec<(String, Curve)>| -> Vec<(String, Curve)> { curves };
            let (section, curves) = if node.kind() == NodeKind::Command {
                match user_series(node) {
                    Ok(c) if c.is_empty() => continue,
                    Ok(c) => ("series", c),
                    Err(e) => {
                        out.unreadable.push((s, node.id.clone(), e.to_string()));
                        continue;
                    }
                }
            } else {
                let Some(path) = node.artifact(ArtifactKind::TrainingMetrics) else { continue };
                let path = match path {
                    Ok(path) => path,
                    Err(why) => {
                        out.unreadable.push((s, node.id.clone(), why));
                        continue;
                    }
                };
                match TrainingMetrics::read(path) {
                    Ok(TrainingMetrics::Grpo(m)) => ("grpo", named(grpo_curves(&m))),
                    Ok(TrainingMetrics::Sft(m)) => ("sft", named(sft_curves(&m))),
                    Err(e) => {
                        out.unreadable.push((s, node.id.clone(), e.to_string()));
                        continue;
                    }
                }
            };
            let id = curve_id(&node.id, group_by);
            for (metric, curve) in curves {
                let key = (section, id.clone(), metric);
                let at = match members.iter().position(|(k, _)| *k == key) {
                    Some(i) => i,
                    None => {
                        members.push((key, BTreeMap::new()));
                        members.len() - 1
                    }
                };
                members[at].1.entry(s).or_default().push(curve);
            }
        }
    }
    for (key, by_side) in members {
        let lines = by_side
            .into_iter()
            .map(|(side, curves)| Line { side, n: curves.len(), points: combine(&curves.iter().collect::<Vec<_>>()) })
            .collect();
        out.charts.push((key, lines));
    }
    out
}

fn chart(title: &str, lines: &[Line]) -> String {
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for l in lines {
        for (x, y, band) in &l.points {
            if let Some(y) = y {
                xs.push(*x);
                ys.push(*y);
            }
            if let Some((lo, hi)) = band {
                ys.extend([*lo, *hi]);
            }
        }
    }
    let mut svg = String::new();
    if let Some(plot) = Plot::open(&mut svg, (340.0, 180.0, 38.0), &xs, &ys) {
        for l in lines {
            let c = colour(l.side);
            // The band: one polygon per run of consecutive points that have one.
            let mut run: Vec<(f64, f64, f64)> = Vec::new();
            let flush_band = |run: &mut Vec<(f64, f64, f64)>, svg: &mut String| {
                if run.len() >= 2 {
                    let upper = run.iter().map(|(x, _, hi)| format!("{:.1},{:.1}", plot.sx(*x), plot.sy(*hi)));
                    let lower = run.iter().rev().map(|(x, lo, _)| format!("{:.1},{:.1}", plot.sx(*x), plot.sy(*lo)));
                    let pts: Vec<String> = upper.chain(lower).collect();
                    let _ = write!(
                        svg,
                        r#"<polygon class="band" points="{}" fill="{c}" fill-opacity="0.18" stroke="none"/>"#,
                        pts.join(" ")
                    );
                }
                run.clear();
            };
            for (x, _, band) in &l.points {
                match band {
                    Some((lo, hi)) => run.push((*x, *lo, *hi)),
                    None => flush_band(&mut run, &mut svg),
                }
            }
            flush_band(&mut run, &mut svg);
            plot.line(&mut svg, l.points.iter().map(|(x, y, _)| (*x, *y)), c);
        }
        plot.labels(&mut svg);
    }
    svg.push_str("</svg>");
    let who: Vec<String> =
        lines.iter().map(|l| if l.n > 1 { format!("{} n={}", label(l.side), l.n) } else { label(l.side) }).collect();
    let _ = write!(svg, "<figcaption>{} ({})</figcaption></figure>", esc(title), esc(&who.join(", ")));
    svg
}

/// The overlay report.
pub fn render(sides: &[Side], group_by: Option<&str>) -> String {
    let c = charts(sides, group_by);
    let title = format!(
        "{} — {}",
        sides.iter().enumerate().map(|(i, _)| label(i)).collect::<Vec<_>>().join(" vs "),
        match group_by {
            Some(a) => format!("curves grouped by {a}"),
            None => "curves".into(),
        }
    );
    let mut html = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    html.push_str(&esc(&title));
    html.push_str("</title><style>body{font-family:sans-serif;margin:1.5em;color:#222}figure{display:inline-block;margin:4px}figcaption{font-size:12px;text-align:center}.fail{color:#c62828;font-weight:bold}.legend li{list-style:none;margin:3px 0}.swatch{display:inline-block;width:22px;height:4px;margin-right:8px;vertical-align:middle}</style></head><body>\n");
    let _ = writeln!(html, "<h1>{}</h1>", esc(&title));
    html.push_str("<section id=\"legend\"><ul class=\"legend\">\n");
    for (i, s) in sides.iter().enumerate() {
        let _ = writeln!(
            html,
            "<li><span class=\"swatch\" style=\"background:{}\"></span><b>{}</b>: {}</li>",
            colour(i),
            label(i),
            esc(&s.name)
        );
    }
    html.push_str("</ul>");
    if let Some(axis) = group_by {
        let _ = writeln!(
            html,
            "<p>The expansions of a matrix node over <code>{}</code> are one line: their mean, with a band of ± one sample standard deviation where two or more are defined; <i>n</i> is in each caption.</p>",
            esc(axis)
        );
    }
    for (s, node, why) in &c.unreadable {
        let _ = writeln!(
            html,
            "<p class=\"fail\">{} on {}: the metrics cannot be read: {}</p>",
            esc(node),
            label(*s),
            esc(why)
        );
    }
    html.push_str("</section>\n");
    for (section, heading) in [("grpo", "GRPO curves"), ("sft", "SFT"), ("series", "Series of shell nodes")] {
        // The protocol's sections are always there; the shell nodes' only when some side has one.
        if section == "series" && !c.charts.iter().any(|((sec, _, _), _)| *sec == "series") {
            continue;
        }
        let _ = writeln!(html, "<section id=\"{section}\"><h2>{heading}</h2>");
        let mut current = String::new();
        let mut any = false;
        for ((sec, id, metric), lines) in &c.charts {
            if sec != &section {
                continue;
            }
            if *id != current {
                if any {
                    html.push_str("</div>\n");
                }
                let _ = writeln!(html, "<h3>{}</h3><div>", esc(id));
                current = id.clone();
                any = true;
            }
            html.push_str(&chart(metric, lines));
        }
        if any {
            html.push_str("</div>\n");
        } else {
            html.push_str("<p>No such node on any side.</p>");
        }
        html.push_str("</section>\n");
    }
    html.push_str("</body></html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_line_is_the_mean_with_a_band_of_one_sample_std_and_undefined_stays_a_gap() {
        let a: Curve = vec![(0.0, Some(1.0)), (1.0, Some(2.0)), (2.0, None)];
        let b: Curve = vec![(0.0, Some(3.0)), (1.0, None), (2.0, None)];
        let p = combine(&[&a, &b]);
        assert_eq!(p[0].1, Some(2.0));
        let (lo, hi) = p[0].2.unwrap();
        assert!((hi - 2.0 - 2f64.sqrt()).abs() < 1e-12 && (2.0 - lo - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!((p[1].1, p[1].2), (Some(2.0), None), "one defined value: a mean, no band");
        assert_eq!((p[2].1, p[2].2), (None, None), "none defined: a gap");
    }

    #[test]
    fn the_curve_id_drops_the_grouped_axis_only() {
        assert_eq!(curve_id("e2@guard=on,seed=3", Some("seed")), "e2@guard=on");
        assert_eq!(curve_id("grpo@seed=1", Some("seed")), "grpo");
        assert_eq!(curve_id("grpo@g=4", Some("seed")), "grpo@g=4");
        assert_eq!(curve_id("grpo@seed=1", None), "grpo@seed=1");
    }
}

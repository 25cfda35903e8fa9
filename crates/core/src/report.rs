//! `orchestrate report`: one self-contained HTML file (inline SVG, no script, no
//! network) for a run in the workspace or a frozen pack: the DAG coloured by
//! outcome, GRPO and SFT curves, the evaluation table, costs, gates and the fault
//! matrix. An undefined value is written `undefined`, never 0.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::ops::results::{pct, ResultsTableFile};
use crate::store::{StoreError, Workspace};

/// A report that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

type Result<T> = std::result::Result<T, ReportError>;

/// One node as the report sees it.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub op: String,
    pub key: Option<crate::store::Key>,
    /// `ran`, `cached`, `failed`, `skipped` or what the source recorded.
    pub outcome: String,
    pub seconds: Option<f64>,
    pub deps: Vec<String>,
    /// Output name → readable file (absent when not available).
    pub outputs: BTreeMap<String, PathBuf>,
}

/// What a report is made from.
#[derive(Debug, Clone)]
pub struct Source {
    pub title: String,
    pub nodes: Vec<Node>,
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// A run of the workspace (default: the latest). Edges come from the recorded
/// input hashes: a node depends on the run's nodes that produced them.
pub fn from_run(ws: &Workspace, run: Option<String>) -> Result<Source> {
    let run = ws.resolve_run(run)?;
    let index = ws.index()?;
    let row = index
        .recent_runs(usize::MAX >> 1)?
        .into_iter()
        .find(|r| r.run_id == run)
        .ok_or_else(|| ReportError::Invalid(format!("run {run} vanished from the index")))?;
    let mut nodes = Vec::new();
    let mut producers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut records = Vec::new();
    for n in index.run_nodes(&run)? {
        let cached = match &n.key {
            Some(k) => index.lookup(k)?,
            None => None,
        };
        let mut outputs = BTreeMap::new();
        if let Some(c) = &cached {
            for o in &c.outputs {
                producers.entry(o.object.hash.clone()).or_default().push(n.node_id.clone());
                outputs.insert(o.name.clone(), ws.object_path(&o.object.hash));
            }
        }
        let record = cached.as_ref().map(|c| crate::dag::key::HashInputs::from_stored(&c.record)).transpose()?;
        records.push(record.as_ref().map(|r| r.inputs.clone()).unwrap_or_default());
        nodes.push(Node {
            id: n.node_id.clone(),
            op: record.as_ref().map(|r| r.op.clone()).unwrap_or_default(),
            key: n.key.clone(),
            outcome: n.outcome.to_string(),
            seconds: n.seconds,
            deps: Vec::new(),
            outputs,
        });
    }
    for (node, inputs) in nodes.iter_mut().zip(records) {
        let mut deps: Vec<String> = inputs
            .values()
            .flatten()
            .filter_map(|h| producers.get(h))
            .flatten()
            .filter(|d| **d != node.id)
            .cloned()
            .collect();
        deps.sort();
        deps.dedup();
        node.deps = deps;
    }
    let profile = row.profile.map(|p| format!(" --profile {p}")).unwrap_or_default();
    Ok(Source { title: format!("{}{profile} — run {run} ({})", row.spec, row.status), nodes })
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "undefined".into(),
    }
}

fn colour(outcome: &str) -> &'static str {
    match outcome {
        "ran" => "#66bb6a",
        "cached" => "#90caf9",
        "failed" => "#e57373",
        "skipped" => "#e0e0e0",
        _ => "#fff59d",
    }
}

fn dag_svg(nodes: &[Node]) -> String {
    let pos: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
    let mut depth = vec![0usize; nodes.len()];
    // Longest path from a source; a few passes suffice for a DAG listed in any order.
    for _ in 0..nodes.len() {
        let mut changed = false;
        for (i, n) in nodes.iter().enumerate() {
            let d = n.deps.iter().filter_map(|d| pos.get(d.as_str())).map(|&j| depth[j] + 1).max().unwrap_or(0);
            if d > depth[i] {
                depth[i] = d;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let (w, h, gx, gy) = (210.0, 44.0, 60.0, 14.0);
    let mut row_of = vec![0usize; nodes.len()];
    let mut rows: BTreeMap<usize, usize> = BTreeMap::new();
    for i in 0..nodes.len() {
        let r = rows.entry(depth[i]).or_default();
        row_of[i] = *r;
        *r += 1;
    }
    let cols = depth.iter().max().map_or(1, |d| d + 1);
    let max_rows = rows.values().max().copied().unwrap_or(1);
    let (width, height) = (cols as f64 * (w + gx) + 20.0, max_rows as f64 * (h + gy) + 20.0);
    let at = |i: usize| (10.0 + depth[i] as f64 * (w + gx), 10.0 + row_of[i] as f64 * (h + gy));
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    for (i, n) in nodes.iter().enumerate() {
        for d in &n.deps {
            if let Some(&j) = pos.get(d.as_str()) {
                let ((x1, y1), (x2, y2)) = (at(j), at(i));
                let _ = write!(
                    svg,
                    r##"<line x1="{}" y1="{}" x2="{x2}" y2="{}" stroke="#888" stroke-width="1"/>"##,
                    x1 + w,
                    y1 + h / 2.0,
                    y2 + h / 2.0
                );
            }
        }
    }
    for (i, n) in nodes.iter().enumerate() {
        let (x, y) = at(i);
        let key = n.key.as_deref().map_or("--------", |k| &k[..8.min(k.len())]);
        let secs = n.seconds.map_or(String::new(), |s| format!(" · {s:.1}s"));
        let _ = write!(
            svg,
            r##"<g><title>{} ({}) {}</title><rect x="{x}" y="{y}" width="{w}" height="{h}" rx="5" fill="{}" stroke="#555"/><text x="{}" y="{}">{}</text><text x="{}" y="{}" fill="#333">{} {key}{secs}</text></g>"##,
            esc(&n.id),
            esc(&n.op),
            esc(&n.outcome),
            colour(&n.outcome),
            x + 6.0,
            y + 17.0,
            esc(&n.id.chars().take(32).collect::<String>()),
            x + 6.0,
            y + 34.0,
            esc(&n.outcome),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A line chart of one series; `None` points are gaps, listed as undefined.
fn chart(title: &str, xs: &[f64], ys: &[Option<f64>]) -> String {
    let (w, h, m) = (320.0, 170.0, 36.0);
    let defined: Vec<(f64, f64)> =
        xs.iter().zip(ys).filter_map(|(x, y)| y.filter(|v| v.is_finite()).map(|v| (*x, v))).collect();
    let undefined = ys.iter().filter(|y| !y.is_some_and(f64::is_finite)).count();
    let mut svg = format!(
        r#"<figure><svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">"#
    );
    let _ = write!(
        svg,
        r##"<rect x="{m}" y="8" width="{}" height="{}" fill="none" stroke="#aaa"/>"##,
        w - m - 8.0,
        h - m - 8.0
    );
    if defined.is_empty() {
        let _ = write!(svg, r#"<text x="{}" y="{}">undefined</text>"#, w / 2.0 - 20.0, h / 2.0);
    } else {
        let (x0, x1) = defined.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (y0, y1) = defined.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let (y0, y1) = if (y1 - y0).abs() < 1e-300 { (y0 - 1.0, y1 + 1.0) } else { (y0, y1) };
        let sx = |x: f64| m + (x - x0) / (x1 - x0).max(1e-300) * (w - m - 8.0);
        let sy = |y: f64| 8.0 + (1.0 - (y - y0) / (y1 - y0)) * (h - m - 8.0);
        // Break the line at undefined points.
        let mut segment = Vec::new();
        let flush = |seg: &mut Vec<String>, svg: &mut String| {
            if seg.len() == 1 {
                // A point between two gaps: a dot, since a one-point line draws nothing.
                let (cx, cy) = seg[0].split_once(',').unwrap_or(("0", "0"));
                let _ = write!(svg, r##"<circle cx="{cx}" cy="{cy}" r="2.5" fill="#1565c0"/>"##);
            }
            if !seg.is_empty() {
                let _ = write!(
                    svg,
                    r##"<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{}"/>"##,
                    seg.join(" ")
                );
                seg.clear();
            }
        };
        for (x, y) in xs.iter().zip(ys) {
            match y.filter(|v| v.is_finite()) {
                Some(v) => segment.push(format!("{:.1},{:.1}", sx(*x), sy(v))),
                None => flush(&mut segment, &mut svg),
            }
        }
        flush(&mut segment, &mut svg);
        let _ = write!(svg, r#"<text x="2" y="14">{}</text><text x="2" y="{}">{}</text>"#, short(y1), h - m, short(y0));
        let _ = write!(
            svg,
            r#"<text x="{m}" y="{}">{}</text><text x="{}" y="{}" text-anchor="end">{}</text>"#,
            h - m + 14.0,
            x0,
            w - 8.0,
            h - m + 14.0,
            x1
        );
    }
    svg.push_str("</svg>");
    let note = if undefined > 0 { format!(" ({undefined} undefined)") } else { String::new() };
    let _ = write!(svg, "<figcaption>{}{note}</figcaption></figure>", esc(title));
    svg
}

fn short(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-2 || v.abs() >= 1e4) {
        format!("{v:.2e}")
    } else {
        format!("{v:.3}")
    }
}

fn mean_of(items: &[Value], field: &str) -> Option<f64> {
    let v: Vec<f64> = items.iter().filter_map(|u| u[field].as_f64()).collect();
    if v.is_empty() {
        None
    } else {
        Some(v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// The HTML report.
pub fn render(src: &Source) -> String {
    let mut html = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    html.push_str(&esc(&src.title));
    html.push_str("</title><style>body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left}figure{display:inline-block;margin:4px}figcaption{font-size:12px;text-align:center}.pass{color:#2e7d32}.fail{color:#c62828;font-weight:bold}.legend span{padding:2px 8px;margin-right:6px;border:1px solid #555}</style></head><body>\n");
    let _ = writeln!(html, "<h1>{}</h1>", esc(&src.title));

    let _ = writeln!(html, "<section id=\"dag\"><h2>DAG</h2><p class=\"legend\">");
    for o in ["ran", "cached", "failed", "skipped"] {
        let _ = write!(html, "<span style=\"background:{}\">{o}</span>", colour(o));
    }
    let _ = writeln!(html, "</p><div style=\"overflow-x:auto\">{}</div></section>", dag_svg(&src.nodes));

    let metrics: Vec<(&Node, Value)> =
        src.nodes.iter().filter_map(|n| n.outputs.get("metrics").and_then(|p| read_json(p)).map(|m| (n, m))).collect();

    html.push_str("<section id=\"grpo\"><h2>GRPO curves</h2>\n");
    let mut any = false;
    for (n, m) in metrics.iter().filter(|(_, m)| m["kind"] == "grpo") {
        any = true;
        let history = m["history"].as_array().cloned().unwrap_or_default();
        let xs: Vec<f64> = history.iter().map(|h| h["iteration"].as_f64().unwrap_or(f64::NAN)).collect();
        let updates = |h: &Value| h["updates"].as_array().cloned().unwrap_or_default();
        let series: [(&str, Vec<Option<f64>>); 6] = [
            ("mean reward", history.iter().map(|h| h["mean_reward"].as_f64()).collect()),
            ("zero-variance group fraction", history.iter().map(|h| h["zero_variance_fraction"].as_f64()).collect()),
            ("mean exact KL", history.iter().map(|h| mean_of(&updates(h), "kl")).collect()),
            ("clip fraction", history.iter().map(|h| mean_of(&updates(h), "clip_fraction")).collect()),
            ("gradient norm", history.iter().map(|h| mean_of(&updates(h), "grad_norm")).collect()),
            ("learning rate", history.iter().map(|h| mean_of(&updates(h), "lr")).collect()),
        ];
        let _ = writeln!(html, "<h3>{}</h3><div>", esc(&n.id));
        for (title, ys) in &series {
            html.push_str(&chart(title, &xs, ys));
        }
        html.push_str("</div>\n");
    }
    if !any {
        html.push_str("<p>No GRPO node in this run.</p>");
    }
    html.push_str("</section>\n<section id=\"sft\"><h2>SFT</h2>\n");
    let mut any = false;
    for (n, m) in metrics.iter().filter(|(_, m)| m["kind"] == "sft") {
        any = true;
        let history = m["history"].as_array().cloned().unwrap_or_default();
        let xs: Vec<f64> = history.iter().map(|h| h["update"].as_f64().unwrap_or(f64::NAN)).collect();
        let ys: Vec<Option<f64>> = history.iter().map(|h| h["loss"].as_f64()).collect();
        let val = m["validation_history"].as_array().cloned().unwrap_or_default();
        let vx: Vec<f64> = val.iter().map(|v| v["epoch"].as_f64().unwrap_or(f64::NAN) + 1.0).collect();
        let vy: Vec<Option<f64>> = val.iter().map(|v| v["validation_nll"].as_f64()).collect();
        let _ = writeln!(html, "<h3>{}</h3><div>", esc(&n.id));
        html.push_str(&chart("training NLL per update", &xs, &ys));
        html.push_str(&chart("validation NLL per epoch", &vx, &vy));
        html.push_str("</div>\n");
    }
    if !any {
        html.push_str("<p>No SFT node in this run.</p>");
    }
    html.push_str("</section>\n");

    html.push_str("<section id=\"evaluation\"><h2>Evaluation</h2>\n");
    let tables: Vec<(&Node, &PathBuf)> = src
        .nodes
        .iter()
        .filter(|n| n.op == "results.table")
        .filter_map(|n| Some((n, n.outputs.get("table.json")?)))
        .collect();
    if tables.is_empty() {
        html.push_str("<p>No results table in this run.</p>");
    }
    for (n, path) in &tables {
        let t: ResultsTableFile = match crate::canonical::read_typed(path) {
            Ok(t) => t,
            Err(e) => {
                // Said, not skipped: a table that cannot be read is not an empty one.
                let _ = writeln!(
                    html,
                    "<h3>{}</h3><p>The results table cannot be read: {}</p>",
                    esc(&n.id),
                    esc(&e.to_string())
                );
                continue;
            }
        };
        let _ = writeln!(html, "<h3>{}</h3><table><tr><th>policy</th><th>population</th><th>greedy pass@1</th><th>per-draw success</th><th>JSON validity</th><th>no EOS</th><th>mean tokens</th></tr>", esc(&n.id));
        for r in &t.rows {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.policy),
                esc(&r.population),
                pct(r.greedy_pass_at_1),
                pct(r.per_draw_success),
                pct(r.json_validity),
                pct(r.no_eos),
                num(r.mean_tokens, 1)
            );
        }
        html.push_str("</table>\n");
    }
    html.push_str("</section>\n");

    html.push_str("<section id=\"costs\"><h2>Costs</h2><table><tr><th>node</th><th>op</th><th>outcome</th><th>seconds (this run)</th><th>generation s</th><th>behavior check s</th><th>optimization s</th><th>hashing s</th><th>peak RSS MB</th></tr>\n");
    for n in &src.nodes {
        let m = metrics.iter().find(|(x, _)| x.id == n.id).map(|(_, m)| m);
        let sum = |k: &str| -> String {
            let Some(m) = m.filter(|m| m["kind"] == "grpo") else { return "-".into() };
            let v: Vec<f64> =
                m["history"].as_array().into_iter().flatten().filter_map(|h| h["costs"][k].as_f64()).collect();
            if v.is_empty() {
                "undefined".into()
            } else {
                format!("{:.2}", v.iter().sum::<f64>())
            }
        };
        let rss = m.map_or("-".into(), |m| num(m["costs"]["peak_rss_bytes"].as_f64().map(|b| b / 1048576.0), 0));
        let seconds = if n.outcome == "cached" { "cached".to_string() } else { num(n.seconds, 2) };
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{seconds}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{rss}</td></tr>",
            esc(&n.id),
            esc(&n.op),
            esc(&n.outcome),
            sum("generation_seconds"),
            sum("behavior_verification_seconds"),
            sum("optimization_with_reference_seconds"),
            sum("state_hashing_seconds")
        );
    }
    html.push_str("</table></section>\n");

    html.push_str("<section id=\"gates\"><h2>Gates</h2>\n");
    let gate_results: Vec<Value> = src
        .nodes
        .iter()
        .filter(|n| n.op == "gate")
        .filter_map(|n| n.outputs.get("gates.json").and_then(|p| read_json(p)))
        .flat_map(|g| g["results"].as_array().cloned().unwrap_or_default())
        .collect();
    if gate_results.is_empty() {
        html.push_str("<p>No gates in this run.</p>");
    } else {
        html.push_str("<table><tr><th>gate</th><th>result</th><th>detail</th></tr>\n");
        for g in &gate_results {
            let passed = g["passed"].as_bool() == Some(true);
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
                esc(g["name"].as_str().unwrap_or("?")),
                if passed { "pass" } else { "fail" },
                if passed { "PASS" } else { "FAIL" },
                esc(g["detail"].as_str().unwrap_or(""))
            );
        }
        html.push_str("</table>");
    }
    html.push_str("</section>\n");

    html.push_str("<section id=\"faults\"><h2>Fault matrix</h2>\n");
    let mut rows = String::new();
    for (n, m) in metrics.iter().filter(|(_, m)| m["kind"] == "grpo") {
        let detections = m["guard"]["detections"].as_array().cloned().unwrap_or_default();
        for f in m["guard"]["faults"].as_array().into_iter().flatten() {
            let at = f["at_iteration"].as_u64();
            let observed = detections
                .iter()
                .find(|d| d["iteration"].as_u64() == at)
                .map_or("none".to_string(), |d| d["codes"].to_string());
            // The pre-registered expectation: a gate on this node's codes.
            let expected = gate_results
                .iter()
                .find(|g| {
                    g["evidence"].as_object().is_some_and(|e| {
                        e.values().any(|v| v[0].as_str() == Some(format!("{}:metrics", n.id).as_str()))
                    }) && g["detail"].as_str().is_some_and(|d| d.contains(".codes"))
                })
                .and_then(|g| g["detail"].as_str().and_then(|d| d.split("required = ").nth(1)).map(str::to_string))
                .unwrap_or_else(|| "not pre-registered".into());
            let _ = writeln!(
                rows,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&n.id),
                esc(f["family"].as_str().unwrap_or("?")),
                at.map_or("undefined".into(), |a| a.to_string()),
                esc(m["guard"]["switch"].as_str().unwrap_or("?")),
                esc(&expected),
                esc(&observed)
            );
        }
    }
    if rows.is_empty() {
        html.push_str("<p>No fault was injected in this run.</p>");
    } else {
        let _ = write!(html, "<table><tr><th>node</th><th>family</th><th>injected at</th><th>guard</th><th>expected codes</th><th>observed codes</th></tr>\n{rows}</table>");
    }
    html.push_str("</section>\n</body></html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undefined_value_is_shown_as_undefined_never_as_zero() {
        assert_eq!(num(None, 2), "undefined");
        assert_eq!(num(Some(f64::NAN), 2), "undefined");
        let c = chart("kl", &[0.0, 1.0, 2.0], &[Some(1.0), None, Some(3.0)]);
        assert!(c.contains("kl (1 undefined)"), "{c}");
        // The line breaks at the gap: two one-point segments are not drawn as one.
        assert_eq!(c.matches("<polyline").count(), 2);
        let empty = chart("reward", &[0.0], &[None]);
        assert!(empty.contains(">undefined<") && !empty.contains("<polyline"));
    }

    #[test]
    fn node_names_are_escaped() {
        let n = Node {
            id: "a<b>&\"c\"".into(),
            op: "shell".into(),
            key: None,
            outcome: "ran".into(),
            seconds: None,
            deps: vec![],
            outputs: BTreeMap::new(),
        };
        let html = render(&Source { title: "<t>".into(), nodes: vec![n] });
        assert!(html.contains("a&lt;b&gt;&amp;&quot;c&quot;") && !html.contains("a<b>"));
    }
}

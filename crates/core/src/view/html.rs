//! `orchestrate report`: one self-contained HTML file (inline SVG, no script, no
//! network) for a run in the workspace or a frozen pack: the DAG coloured by
//! outcome, GRPO and SFT curves, the evaluation table, costs, gates and the fault
//! matrix. An undefined value is written `undefined`, never 0.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::metrics::{grpo_curves, sft_curves, user_metrics, user_series, Curve};
use super::svg::{chart, colour, dag_svg, esc};
use super::{NodeView, Outcome, Result, RunView};
use crate::gate::{GateReport, GateResult};
use crate::ops::artifacts::{ArtifactKind, NodeKind};
use crate::ops::results::{interval_text, pct, ResultsTableFile};
use crate::train::metrics::{GrpoMetrics, IterationCosts, SftMetrics, TrainingMetrics};

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "undefined".into(),
    }
}

/// The HTML report of a run: the DAG, the training curves, a command's own
/// metrics and series, the evaluation tables, costs, gates and the fault matrix.
pub fn render(view: &RunView) -> String {
    let mut html = head(&view.title);
    dag_section(&mut html, &view.nodes);
    let training = Training::read(&view.nodes);
    curve_sections(&mut html, &training);
    commands_section(&mut html, &view.nodes);
    evaluation_section(&mut html, &view.nodes);
    costs_section(&mut html, &view.nodes, &training);
    let gates = gates_section(&mut html, &view.nodes);
    faults_section(&mut html, &training, &gates);
    html.push_str("</body></html>\n");
    html
}

/// A pack's own report, from the pack's files alone (what `pack freeze`
/// seals into it as `report.html`).
pub fn pack_report(dir: &Path, title: &str) -> Result<String> {
    let mut view = RunView::from_pack_files(dir)?;
    view.title = title.to_string();
    Ok(render(&view))
}

fn head(title: &str) -> String {
    let mut html = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    html.push_str(&esc(title));
    html.push_str("</title><style>body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left}figure{display:inline-block;margin:4px}figcaption{font-size:12px;text-align:center}.pass{color:#2e7d32}.fail{color:#c62828;font-weight:bold}.legend span{padding:2px 8px;margin-right:6px;border:1px solid #555}</style></head><body>\n");
    let _ = writeln!(html, "<h1>{}</h1>", esc(title));
    html
}

fn dag_section(html: &mut String, nodes: &[NodeView]) {
    let _ = writeln!(html, "<section id=\"dag\"><h2>DAG</h2><p class=\"legend\">");
    for o in [Outcome::Ran, Outcome::Cached, Outcome::Failed, Outcome::Skipped] {
        let _ = write!(html, "<span style=\"background:{}\">{o}</span>", colour(o));
    }
    let _ = writeln!(html, "</p><div style=\"overflow-x:auto\">{}</div></section>", dag_svg(nodes));
}

/// Every training node's metrics, each file read through the type its
/// writer uses: one that cannot be read is said, naming the file and the
/// field, never drawn from defaults.
struct Training<'a> {
    metrics: Vec<(&'a NodeView, TrainingMetrics)>,
    unreadable: Vec<(&'a NodeView, String)>,
}

impl<'a> Training<'a> {
    fn read(nodes: &'a [NodeView]) -> Self {
        let mut t = Training { metrics: Vec::new(), unreadable: Vec::new() };
        for n in nodes {
            match n.artifact(ArtifactKind::TrainingMetrics) {
                Some(Ok(p)) => match TrainingMetrics::read(p) {
                    Ok(m) => t.metrics.push((n, m)),
                    Err(e) => t.unreadable.push((n, e.to_string())),
                },
                Some(Err(why)) => t.unreadable.push((n, why)),
                None => {}
            }
        }
        t
    }

    fn grpo(&self) -> Vec<(&'a NodeView, &GrpoMetrics)> {
        self.metrics
            .iter()
            .filter_map(|(n, m)| match m {
                TrainingMetrics::Grpo(g) => Some((*n, g)),
                TrainingMetrics::Sft(_) => None,
            })
            .collect()
    }

    fn sft(&self) -> Vec<(&'a NodeView, &SftMetrics)> {
        self.metrics
            .iter()
            .filter_map(|(n, m)| match m {
                TrainingMetrics::Sft(s) => Some((*n, s)),
                TrainingMetrics::Grpo(_) => None,
            })
            .collect()
    }

    fn of(&self, node: &NodeView) -> Option<&TrainingMetrics> {
        self.metrics.iter().find(|(x, _)| x.id == node.id).map(|(_, m)| m)
    }
}

/// Says, in red, that a node's file cannot be read.
fn cannot_read(html: &mut String, what: &str, node: &NodeView, error: &str) {
    let _ = writeln!(html, "<h3>{}</h3><p class=\"fail\">The {what} cannot be read: {}</p>", esc(&node.id), esc(error));
}

/// A node's charts under its name.
fn charts(html: &mut String, node: &NodeView, curves: Vec<(String, Curve)>) {
    let _ = writeln!(html, "<h3>{}</h3><div>", esc(&node.id));
    for (title, curve) in curves {
        html.push_str(&chart(&title, &curve));
    }
    html.push_str("</div>\n");
}

fn curve_sections(html: &mut String, training: &Training) {
    html.push_str("<section id=\"grpo\"><h2>GRPO curves</h2>\n");
    for (n, e) in &training.unreadable {
        cannot_read(html, "metrics", n, e);
    }
    let grpo = training.grpo();
    for (n, m) in &grpo {
        charts(html, n, grpo_curves(m));
    }
    if grpo.is_empty() && training.unreadable.is_empty() {
        html.push_str("<p>No GRPO node in this run.</p>");
    }
    html.push_str("</section>\n<section id=\"sft\"><h2>SFT</h2>\n");
    let sft = training.sft();
    for (n, m) in &sft {
        charts(html, n, sft_curves(m));
    }
    if sft.is_empty() {
        html.push_str("<p>No SFT node in this run.</p>");
    }
    html.push_str("</section>\n");
}

/// A shell node's own metrics and step series (`metrics:`, `series:`); the
/// section is there only when some shell node declares either.
fn commands_section(html: &mut String, nodes: &[NodeView]) {
    let mut own = String::new();
    for n in nodes {
        let (metrics, series) = (user_metrics(n), user_series(n));
        if matches!((&metrics, &series), (Ok(m), Ok(s)) if m.is_empty() && s.is_empty()) {
            continue;
        }
        let _ = writeln!(own, "<h3>{}</h3>", esc(&n.id));
        match metrics {
            Ok(m) if !m.is_empty() => {
                own.push_str("<table><tr><th>metric</th><th>value</th></tr>");
                for (name, v) in m {
                    let _ = write!(own, "<tr><td>{}</td><td>{}</td></tr>", esc(&name), esc(&v.to_string()));
                }
                own.push_str("</table>\n");
            }
            Ok(_) => {}
            Err(e) => {
                let _ = writeln!(own, "<p class=\"fail\">The metrics cannot be read: {}</p>", esc(&e.to_string()));
            }
        }
        match series {
            Ok(s) => {
                own.push_str("<div>");
                for (title, curve) in s {
                    own.push_str(&chart(&title, &curve));
                }
                own.push_str("</div>\n");
            }
            Err(e) => {
                let _ = writeln!(own, "<p class=\"fail\">The series cannot be read: {}</p>", esc(&e.to_string()));
            }
        }
    }
    if !own.is_empty() {
        html.push_str("<section id=\"series\"><h2>Metrics and series of shell nodes</h2>\n");
        html.push_str(&own);
        html.push_str("</section>\n");
    }
}

fn evaluation_section(html: &mut String, nodes: &[NodeView]) {
    html.push_str("<section id=\"evaluation\"><h2>Evaluation</h2>\n");
    let tables: Vec<(&NodeView, std::result::Result<&PathBuf, String>)> =
        nodes.iter().filter_map(|n| Some((n, n.artifact(ArtifactKind::ResultsTable)?))).collect();
    if tables.is_empty() {
        html.push_str("<p>No results table in this run.</p>");
    }
    for (n, path) in &tables {
        let path = match path {
            Ok(path) => path,
            Err(why) => {
                cannot_read(html, "results table", n, why);
                continue;
            }
        };
        let t: ResultsTableFile = match crate::canonical::read_typed(path) {
            Ok(t) => t,
            Err(e) => {
                // Said, not skipped: a table that cannot be read is not an empty one.
                cannot_read(html, "results table", n, &e.to_string());
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
        comparison_tables(html, &t);
    }
    html.push_str("</section>\n");
}

fn costs_section(html: &mut String, nodes: &[NodeView], training: &Training) {
    html.push_str("<section id=\"costs\"><h2>Costs</h2><p>As each node's record keeps them (measured where it ran; never part of a key).</p><table><tr><th>node</th><th>op</th><th>outcome</th><th>seconds (this run)</th><th>seconds (when it ran)</th><th>generation s</th><th>behavior check s</th><th>optimization s</th><th>hashing s</th><th>peak RSS MB</th></tr>\n");
    for n in nodes {
        costs_row(html, n, training.of(n));
    }
    html.push_str("</table></section>\n");
}

/// One node's costs: its process, and for GRPO each phase summed over its iterations.
fn costs_row(html: &mut String, n: &NodeView, m: Option<&TrainingMetrics>) {
    let costs = n.costs(m);
    let is_grpo = matches!(m, Some(TrainingMetrics::Grpo(_)));
    let sum = |k: fn(&IterationCosts) -> f64| -> String {
        match (&costs, m.and_then(TrainingMetrics::iterations)) {
            (Some(c), Some(iterations)) if is_grpo => num(c.total(iterations, k), 2),
            _ => "-".into(),
        }
    };
    let generation = match (&costs, n.kind()) {
        (Some(c), NodeKind::Generation) => num(Some(c.process.seconds), 2),
        _ => sum(|c| c.generation_seconds),
    };
    let optimization = match (&costs, m) {
        (Some(c), Some(TrainingMetrics::Sft(_))) => num(c.process.optimization_seconds, 2),
        _ => sum(|c| c.optimization_with_reference_seconds),
    };
    let rss = costs.as_ref().map_or("-".into(), |c| num(c.process.peak_rss_bytes.map(|b| b as f64 / 1048576.0), 0));
    let ran = costs.as_ref().map_or("-".into(), |c| num(Some(c.process.seconds), 2));
    let seconds = if n.outcome == Outcome::Cached { "cached".to_string() } else { num(n.seconds, 2) };
    let _ = writeln!(
        html,
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{seconds}</td><td>{ran}</td><td>{generation}</td><td>{}</td><td>{optimization}</td><td>{}</td><td>{rss}</td></tr>",
        esc(&n.id),
        esc(&n.op),
        n.outcome,
        sum(|c| c.behavior_verification_seconds),
        sum(|c| c.state_hashing_seconds)
    );
}

/// The gates' verdicts; returns every result read, for the fault matrix.
fn gates_section(html: &mut String, nodes: &[NodeView]) -> Vec<GateResult> {
    html.push_str("<section id=\"gates\"><h2>Gates</h2>\n");
    let mut gate_results: Vec<GateResult> = Vec::new();
    let mut any_gate = false;
    for n in nodes.iter().filter(|n| n.kind() == NodeKind::Gate) {
        let Some(p) = n.artifact(ArtifactKind::GateReport) else { continue };
        any_gate = true;
        let p = match p {
            Ok(p) => p,
            Err(why) => {
                cannot_read(html, "gate report", n, &why);
                continue;
            }
        };
        match GateReport::read(p) {
            Ok(r) => gate_results.extend(r.results),
            // An unreadable gate report is a failure to show, never "no gates".
            Err(e) => cannot_read(html, "gate report", n, &e.to_string()),
        }
    }
    if !any_gate {
        html.push_str("<p>No gates in this run.</p>");
    } else if !gate_results.is_empty() {
        html.push_str("<table><tr><th>gate</th><th>result</th><th>detail</th></tr>\n");
        for g in &gate_results {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
                esc(&g.name),
                if g.passed { "pass" } else { "fail" },
                if g.passed { "PASS" } else { "FAIL" },
                esc(&g.detail)
            );
        }
        html.push_str("</table>");
    }
    html.push_str("</section>\n");
    gate_results
}

/// Each injected fault, the codes its pre-registered gate expects and the
/// codes the guard observed.
fn faults_section(html: &mut String, training: &Training, gate_results: &[GateResult]) {
    html.push_str("<section id=\"faults\"><h2>Fault matrix</h2>\n");
    let mut rows = String::new();
    for (n, m) in &training.grpo() {
        let evidence = format!("{}:metrics", n.id);
        for f in &m.guard.faults {
            let observed = m
                .guard
                .detections
                .iter()
                .find(|d| d.iteration == f.at_iteration)
                .map_or("none".to_string(), |d| format!("{:?}", d.codes));
            // The pre-registered expectation: a gate on this node's codes.
            let expected = gate_results
                .iter()
                .find(|g| g.evidence.values().any(|(r, _)| *r == evidence) && g.detail.contains(".codes"))
                .and_then(|g| g.detail.split("required = ").nth(1))
                .map_or_else(|| "not pre-registered".to_string(), str::to_string);
            let _ = writeln!(
                rows,
                "<tr><td>{}</td><td>{:?}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&n.id),
                f.family,
                f.at_iteration,
                m.guard.switch.label(),
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
    html.push_str("</section>\n");
}

/// A results table's GRPO reward trends and paired comparisons (greedy and per
/// draw), with their intervals, as the table prints them; a table written
/// before they existed has none, and nothing is shown for them.
fn comparison_tables(html: &mut String, t: &ResultsTableFile) {
    if let Some(trends) = t.reward_trends.as_ref().filter(|v| !v.is_empty()) {
        html.push_str("<table class=\"trends\"><tr><th>GRPO run</th><th>mean train reward, first iterations</th><th>last iterations</th><th>last − first (95% bootstrap interval)</th></tr>\n");
        for r in trends {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{} (first {})</td><td>{} (last {})</td><td>{}</td></tr>",
                esc(&r.run),
                num(r.first_mean, 3),
                r.window,
                num(r.last_mean, 3),
                r.window,
                esc(&interval_text(r.difference.as_ref(), r.undefined_because.as_deref()))
            );
        }
        html.push_str("</table>\n");
    }
    let paired = |html: &mut String, what: &str, rows: Vec<[String; 6]>| {
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(html, "<table class=\"paired\"><tr><th>{what}, same problems</th><th>population</th><th>problems</th><th>baseline</th><th>policy</th><th>policy − baseline (95% paired bootstrap interval)</th></tr>");
        for r in rows {
            html.push_str("<tr>");
            for cell in r {
                let _ = write!(html, "<td>{}</td>", esc(&cell));
            }
            html.push_str("</tr>\n");
        }
        html.push_str("</table>\n");
    };
    paired(html, "greedy pass@1", t.comparisons.iter().flatten().map(|c| c.cells()).collect());
    paired(html, "per-draw success", t.draw_comparisons.iter().flatten().map(|c| c.cells()).collect());
}

#[cfg(test)]
mod tests {
    use super::super::svg::chart;
    use super::super::test_node;
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn an_undefined_value_is_shown_as_undefined_never_as_zero() {
        assert_eq!(num(None, 2), "undefined");
        assert_eq!(num(Some(f64::NAN), 2), "undefined");
        let c = chart("kl", &[(0.0, Some(1.0)), (1.0, None), (2.0, Some(3.0))]);
        assert!(c.contains("kl (1 undefined)"), "{c}");
        // The line breaks at the gap: two one-point segments are two dots, not one line.
        assert_eq!((c.matches("<circle").count(), c.matches("<polyline").count()), (2, 0), "{c}");
        let joined = chart("kl", &[(0.0, Some(1.0)), (1.0, Some(2.0)), (2.0, Some(3.0))]);
        assert_eq!((joined.matches("<circle").count(), joined.matches("<polyline").count()), (0, 1));
        let empty = chart("reward", &[(0.0, None)]);
        assert!(empty.contains(">undefined<") && !empty.contains("<polyline"));
    }

    #[test]
    fn metrics_or_a_gate_report_that_cannot_be_read_are_said_naming_the_file_and_field_never_drawn() {
        let dir = tempfile::tempdir().unwrap();
        // A GRPO metrics file whose first iteration lacks its mean reward: the
        // untyped reader drew six curves from it, with "undefined" where a field was.
        let metrics = dir.path().join("metrics");
        std::fs::write(&metrics, r#"{"kind": "grpo", "history": [{"iteration": 0}]}"#).unwrap();
        let gates = dir.path().join("gates.json");
        std::fs::write(&gates, r#"{"results": [{"name": "g"}]}"#).unwrap();
        let src = RunView {
            title: "t".into(),
            nodes: vec![
                test_node("grpo", "train.grpo", &[("metrics", &metrics)]),
                test_node("gates", "gate", &[("gates.json", &gates)]),
            ],
        };
        let html = render(&src);
        let section = |id: &str| {
            html.split(&format!("<section id=\"{id}\">"))
                .nth(1)
                .unwrap()
                .split("</section>")
                .next()
                .unwrap()
                .to_string()
        };
        let grpo = section("grpo");
        assert!(grpo.contains("cannot be read") && grpo.contains(&*metrics.display().to_string()), "{grpo}");
        assert!(grpo.contains("field history[0]: missing field"), "the field is named: {grpo}");
        assert!(!grpo.contains("<figure>"), "nothing drawn from defaults: {grpo}");
        let g = section("gates");
        assert!(g.contains("cannot be read") && g.contains("gates.json") && !g.contains("No gates"), "{g}");
    }

    /// (Issue #35.) A user's command with an output of its own named
    /// `metrics` is not a training node: its file is never read as training
    /// metrics (the report said it "cannot be read", and compare, overlays
    /// and the TensorBoard export picked nodes by those names too).
    #[test]
    fn a_commands_own_output_named_metrics_is_not_read_as_training_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("metrics");
        std::fs::write(&theirs, "{\"accuracy\": 0.9}").unwrap();
        let src = RunView { title: "t".into(), nodes: vec![test_node("train", "shell", &[("metrics", &theirs)])] };
        let html = render(&src);
        assert!(!html.contains("cannot be read"), "{html}");
    }

    /// A node's typed artifact that is not shown (its object damaged) is said
    /// where it would be drawn, with why, by the report and by `compare`'s
    /// metrics, never left out as if the node had none.
    #[test]
    fn an_artifact_not_shown_is_said_with_why() {
        let why = "its object 0123456789ab is damaged: its bytes no longer hash to its name";
        for (op, output) in [("train.grpo", "metrics"), ("results.table", "table.json"), ("gate", "gates.json")] {
            let mut n = crate::view::test_node("n", op, &[]);
            n.unavailable.insert(output.to_string(), why.to_string());
            let html = render(&RunView { title: "t".into(), nodes: vec![n.clone()] });
            assert!(html.contains(why), "{op}: the report does not say why its {output} is not shown");
            if op != "gate" {
                let e = crate::view::metrics::node_metrics(&n).unwrap_err().to_string();
                assert!(e.contains(why), "{op}: {e}");
            }
        }
    }

    #[test]
    fn node_names_are_escaped() {
        let n = NodeView {
            id: "a<b>&\"c\"".into(),
            op: "shell".into(),
            key: None,
            outcome: Outcome::Ran,
            seconds: None,
            deps: vec![],
            outputs: BTreeMap::new(),
            unavailable: BTreeMap::new(),
            hashes: BTreeMap::new(),
            record: None,
            costs: None,
        };
        let html = render(&RunView { title: "<t>".into(), nodes: vec![n] });
        assert!(html.contains("a&lt;b&gt;&amp;&quot;c&quot;") && !html.contains("a<b>"));
    }
}

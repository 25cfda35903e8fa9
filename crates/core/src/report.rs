//! `orchestrate report`: one self-contained HTML file (inline SVG, no script, no
//! network) for a run in the workspace or a frozen pack: the DAG coloured by
//! outcome, GRPO and SFT curves, the evaluation table, costs, gates and the fault
//! matrix. An undefined value is written `undefined`, never 0.

use crate::ops::artifacts::{ArtifactKind, NodeKind};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::gate::{GateReport, GateResult};
use crate::ops::results::{interval_text, pct, ResultsTableFile};
use crate::stats::mean_of;
use crate::store::{StoreError, Workspace};
use crate::train::metrics::{GrpoMetrics, IterationCosts, SftMetrics, TrainingMetrics, UpdateStats};

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
    /// Output name → blake3 of its content (also for outputs a pack lists
    /// without their bytes).
    pub hashes: BTreeMap<String, String>,
    /// The hash-input record its key was computed from (absent when the
    /// node never completed).
    pub record: Option<crate::dag::key::HashInputs>,
    /// What its process cost, as its record (or a pack's manifest) keeps it.
    pub costs: Option<crate::costs::NodeCosts>,
}

impl Node {
    /// What kind of node this is, for its readers.
    pub fn kind(&self) -> NodeKind {
        NodeKind::of(&self.op)
    }

    /// The readable file of one of its typed artifacts: `None` when its op
    /// writes no such artifact, or the file is not here.
    pub fn artifact(&self, kind: ArtifactKind) -> Option<&PathBuf> {
        kind.output_of(&self.op).and_then(|name| self.outputs.get(name))
    }

    /// What the node's process cost: its record's, or for outputs written
    /// before costs moved to the record (the committed packs), what its
    /// training `metrics` (given, as read) or its evaluation `summary` hold.
    pub fn costs(&self, metrics: Option<&TrainingMetrics>) -> Option<crate::costs::NodeCosts> {
        if self.costs.is_some() {
            return self.costs.clone();
        }
        if let Some(m) = metrics {
            return m.legacy_costs();
        }
        let summary: crate::ops::eval::EvalSummary =
            crate::canonical::read_typed(self.artifact(ArtifactKind::EvalSummary)?).ok()?;
        summary.legacy_costs()
    }
}

/// A shell node's declared params, as its record keeps them (`None` for
/// other ops and for a node that never completed).
fn shell_params(node: &Node) -> std::result::Result<Option<crate::ops::ShellParams>, String> {
    if node.kind() != NodeKind::Command {
        return Ok(None);
    }
    let Some(record) = &node.record else { return Ok(None) };
    serde_json::from_value(record.params.clone())
        .map(Some)
        .map_err(|e| format!("the recorded params of shell node '{}' do not read: {e}", node.id))
}

/// Where a declared file of a node is: its out's readable path, and the
/// file's path inside it (a store object has no extension, so the declared
/// name is what says the format).
fn declared_file(node: &Node, rel: &str, holder: &str, inside: &str) -> std::result::Result<(PathBuf, String), String> {
    let object = node.outputs.get(holder).ok_or_else(|| format!("'{rel}': its out '{holder}' is not available"))?;
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
pub fn user_metrics(node: &Node) -> std::result::Result<Vec<(String, crate::docfile::MetricValue)>, String> {
    declared(node, "metrics", crate::ops::ShellParams::metrics_files, |root, name, rel| {
        let format = crate::docfile::Format::of(rel).ok_or_else(|| format!("'{rel}': not a metrics file format"))?;
        Ok(crate::docfile::flatten_metrics(&crate::docfile::read_as(root, name, format)?).into_iter().collect())
    })
}

/// A shell node's step series (`series:`): one curve per metric, prefixed
/// with the file when the node declares several. Empty for other ops.
pub fn user_series(node: &Node) -> std::result::Result<Vec<(String, Curve)>, String> {
    declared(node, "series", crate::ops::ShellParams::series_files, |root, name, rel| {
        let format =
            crate::docfile::SeriesFormat::of(rel).ok_or_else(|| format!("'{rel}': not a series file format"))?;
        Ok(crate::docfile::read_series(root, name, format)?.into_iter().collect())
    })
}

/// Every named value a shell node's declared files of one kind hold, each
/// file read by `read(folder, name, declared path)`; a name is prefixed with
/// its file when the node declares several.
fn declared<T>(
    node: &Node,
    what: &str,
    files_of: fn(&crate::ops::ShellParams) -> Vec<(String, String, String)>,
    read: impl Fn(&Path, &str, &str) -> std::result::Result<Vec<(String, T)>, String>,
) -> std::result::Result<Vec<(String, T)>, String> {
    let Some(params) = shell_params(node)? else { return Ok(Vec::new()) };
    let files = files_of(&params);
    let mut out = Vec::new();
    for (rel, holder, inside) in &files {
        let (root, name) = declared_file(node, rel, holder, inside).map_err(|e| format!("{what} file {e}"))?;
        let values = read(&root, &name, rel).map_err(|e| format!("{what} file {rel}: {e}"))?;
        for (key, value) in values {
            out.push((if files.len() == 1 { key } else { format!("{rel}:{key}") }, value));
        }
    }
    Ok(out)
}

/// What a report is made from.
#[derive(Debug, Clone)]
pub struct Source {
    pub title: String,
    pub nodes: Vec<Node>,
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
        let mut hashes = BTreeMap::new();
        if let Some(c) = &cached {
            for o in &c.outputs {
                producers.entry(o.object.hash.clone()).or_default().push(n.node_id.clone());
                outputs.insert(o.name.clone(), ws.object_path(&o.object.hash));
                hashes.insert(o.name.clone(), o.object.hash.clone());
            }
        }
        let record = cached.as_ref().map(|c| crate::dag::key::HashInputs::from_stored(&c.record)).transpose()?;
        records.push(record.as_ref().map(|r| r.inputs.clone()).unwrap_or_default());
        let op = record.as_ref().map(|r| r.op.clone()).unwrap_or_default();
        nodes.push(Node {
            id: n.node_id.clone(),
            op,
            key: n.key.clone(),
            outcome: n.outcome.to_string(),
            seconds: n.seconds,
            deps: Vec::new(),
            outputs,
            hashes,
            record,
            costs: cached.and_then(|c| c.costs),
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

pub(crate) fn esc(s: &str) -> String {
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

/// Where each node of a DAG drawing goes. Vertices are the nodes (`0..real`)
/// and, as in Graphviz's `dot`, one dummy vertex per rank an edge passes over,
/// so a long edge is routed between the boxes instead of through them.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Each vertex's rank, top to bottom (a node's: the longest path from a source).
    pub rank: Vec<usize>,
    /// Vertices per rank, left to right.
    pub layers: Vec<Vec<usize>>,
    /// How many vertices are nodes.
    pub real: usize,
    /// Each edge as the vertices it passes: `[parent, dummies..., child]`.
    pub chains: Vec<Vec<usize>>,
}

impl Layout {
    /// A vertex's place within its rank, centred on the rank's middle.
    fn x(&self, i: usize) -> f64 {
        let layer = &self.layers[self.rank[i]];
        let at = layer.iter().position(|&j| j == i).unwrap_or(0);
        at as f64 - (layer.len() as f64 - 1.0) / 2.0
    }

    /// Pairs of segments (between adjacent ranks) that cross.
    pub fn crossings(&self) -> usize {
        let segments: Vec<(usize, f64, f64)> = self
            .chains
            .iter()
            .flat_map(|c| c.windows(2).map(|w| (self.rank[w[0]], self.x(w[0]), self.x(w[1]))))
            .collect();
        let mut n = 0;
        for (i, a) in segments.iter().enumerate() {
            for b in &segments[i + 1..] {
                if a.0 == b.0 && (a.1 - b.1) * (a.2 - b.2) < 0.0 {
                    n += 1;
                }
            }
        }
        n
    }
}

/// The edges (parent, child) of nodes listed with their deps by id.
pub fn edges(nodes: &[Node]) -> Vec<(usize, usize)> {
    let pos: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for d in &n.deps {
            if let Some(&j) = pos.get(d.as_str()) {
                if j != i {
                    out.push((j, i));
                }
            }
        }
    }
    out
}

/// Ranks and dummy vertices, each rank in listing order: the layout before
/// any crossing is reduced.
pub fn listed(nodes: &[Node]) -> Layout {
    let edges = edges(nodes);
    let mut rank = vec![0usize; nodes.len()];
    // Longest path from a source; a pass per node suffices for a DAG listed in any order.
    for _ in 0..nodes.len() {
        let mut changed = false;
        for &(u, v) in &edges {
            if rank[v] < rank[u] + 1 && rank[u] < nodes.len() {
                rank[v] = rank[u] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut chains = Vec::with_capacity(edges.len());
    for &(u, v) in &edges {
        let mut chain = vec![u];
        for r in rank[u] + 1..rank[v] {
            rank.push(r);
            chain.push(rank.len() - 1);
        }
        chain.push(v);
        chains.push(chain);
    }
    let ranks = rank.iter().max().map_or(0, |r| r + 1);
    let mut layers: Vec<Vec<usize>> = vec![Vec::new(); ranks];
    for (i, &r) in rank.iter().enumerate() {
        layers[r].push(i);
    }
    Layout { rank, layers, real: nodes.len(), chains }
}

/// A layered drawing as Graphviz's `dot` makes one (Sugiyama's method, simply):
/// [`listed`], then sweeps down and up that order each rank by the mean place
/// of its neighbours in the rank above (below), the barycentre heuristic,
/// keeping the order with the fewest crossings.
pub fn layered(nodes: &[Node]) -> Layout {
    let mut layout = listed(nodes);
    let segments: Vec<(usize, usize)> = layout.chains.iter().flat_map(|c| c.windows(2).map(|w| (w[0], w[1]))).collect();
    let ranks = layout.layers.len();
    let mut best = (layout.crossings(), layout.layers.clone());
    for sweep in 0..12 {
        let down = sweep % 2 == 0;
        let order: Vec<usize> = if down { (1..ranks).collect() } else { (0..ranks.saturating_sub(1)).rev().collect() };
        for r in order {
            let centre = (layout.layers[r].len() as f64 - 1.0) / 2.0;
            let mut keyed: Vec<(f64, usize, usize)> = layout.layers[r]
                .iter()
                .enumerate()
                .map(|(at, &i)| {
                    let near: Vec<f64> = segments
                        .iter()
                        .filter_map(|&(u, v)| match (down, u == i, v == i) {
                            (true, _, true) => Some(layout.x(u)),
                            (false, true, _) => Some(layout.x(v)),
                            _ => None,
                        })
                        .collect();
                    let key =
                        if near.is_empty() { at as f64 - centre } else { near.iter().sum::<f64>() / near.len() as f64 };
                    (key, at, i)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            layout.layers[r] = keyed.into_iter().map(|(_, _, i)| i).collect();
        }
        let c = layout.crossings();
        if c < best.0 {
            best = (c, layout.layers.clone());
        }
    }
    layout.layers = best.1;
    layout
}

fn dag_svg(nodes: &[Node]) -> String {
    let layout = layered(nodes);
    let (w, h, gx, gy, dummy) = (210.0, 44.0, 24.0, 46.0, 14.0);
    let width_of = |i: usize| if i < layout.real { w } else { dummy };
    let layer_width = |l: &Vec<usize>| l.iter().map(|&i| width_of(i) + gx).sum::<f64>();
    let widest = layout.layers.iter().map(layer_width).fold(0.0, f64::max);
    let (width, height) = (widest + 20.0, layout.layers.len() as f64 * (h + gy) + 20.0);
    // Each vertex's box: left x, top y.
    let mut place = vec![(0.0, 0.0); layout.rank.len()];
    for (r, layer) in layout.layers.iter().enumerate() {
        let mut x = 10.0 + (widest - layer_width(layer)) / 2.0;
        for &i in layer {
            place[i] = (x, 10.0 + r as f64 * (h + gy));
            x += width_of(i) + gx;
        }
    }
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    svg.push_str(r##"<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs>"##);
    for chain in &layout.chains {
        // Down the middle of each dummy, a curve between ranks.
        let mut d = String::new();
        for (k, pair) in chain.windows(2).enumerate() {
            let (a, b) = (pair[0], pair[1]);
            let (sx, sy) = (place[a].0 + width_of(a) / 2.0, place[a].1 + h);
            let (ex, ey) = (place[b].0 + width_of(b) / 2.0, place[b].1);
            let mid = (sy + ey) / 2.0;
            if k == 0 {
                let _ = write!(d, "M{sx:.1},{sy:.1} ");
            }
            let _ = write!(d, "C{sx:.1},{mid:.1} {ex:.1},{mid:.1} {ex:.1},{ey:.1} ");
            if b >= layout.real {
                let _ = write!(d, "L{ex:.1},{:.1} ", ey + h);
            }
        }
        let _ = write!(
            svg,
            r##"<path d="{}" fill="none" stroke="#888" stroke-width="1" marker-end="url(#arrow)"/>"##,
            d.trim_end()
        );
    }
    for (i, n) in nodes.iter().enumerate() {
        let (x, y) = place[i];
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

/// A chart's frame and scales: a `W`×`H` SVG whose plot box starts `M` from
/// the left and ends `M` above the bottom, scaled to the points' bounds.
pub(crate) struct Plot {
    w: f64,
    h: f64,
    m: f64,
    x: (f64, f64),
    y: (f64, f64),
}

impl Plot {
    /// Opens the figure and draws the plot box; `None` (after writing
    /// `undefined` in the box) when there is no point to draw.
    pub(crate) fn open(svg: &mut String, (w, h, m): (f64, f64, f64), xs: &[f64], ys: &[f64]) -> Option<Plot> {
        let _ = write!(
            svg,
            r##"<figure><svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10"><rect x="{m}" y="8" width="{}" height="{}" fill="none" stroke="#aaa"/>"##,
            w - m - 8.0,
            h - m - 8.0
        );
        if xs.is_empty() || ys.is_empty() {
            let _ = write!(svg, r#"<text x="{}" y="{}">undefined</text>"#, w / 2.0 - 20.0, h / 2.0);
            return None;
        }
        let bounds = |v: &[f64]| v.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        let (y0, y1) = bounds(ys);
        let y = if (y1 - y0).abs() < 1e-300 { (y0 - 1.0, y1 + 1.0) } else { (y0, y1) };
        Some(Plot { w, h, m, x: bounds(xs), y })
    }

    pub(crate) fn sx(&self, x: f64) -> f64 {
        self.m + (x - self.x.0) / (self.x.1 - self.x.0).max(1e-300) * (self.w - self.m - 8.0)
    }

    pub(crate) fn sy(&self, y: f64) -> f64 {
        8.0 + (1.0 - (y - self.y.0) / (self.y.1 - self.y.0)) * (self.h - self.m - 8.0)
    }

    /// A line through the defined points, broken at undefined ones; a point
    /// alone between two gaps is a dot (a one-point line draws nothing).
    pub(crate) fn line(&self, svg: &mut String, points: impl IntoIterator<Item = (f64, Option<f64>)>, colour: &str) {
        let mut seg: Vec<String> = Vec::new();
        let flush = |seg: &mut Vec<String>, svg: &mut String| {
            if seg.len() == 1 {
                let (cx, cy) = seg[0].split_once(',').unwrap_or(("0", "0"));
                let _ = write!(svg, r#"<circle cx="{cx}" cy="{cy}" r="2.5" fill="{colour}"/>"#);
            } else if seg.len() > 1 {
                let _ = write!(
                    svg,
                    r#"<polyline class="line" fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
                    seg.join(" ")
                );
            }
            seg.clear();
        };
        for (x, y) in points {
            match y.filter(|v| v.is_finite()) {
                Some(v) => seg.push(format!("{:.1},{:.1}", self.sx(x), self.sy(v))),
                None => flush(&mut seg, svg),
            }
        }
        flush(&mut seg, svg);
    }

    /// The axes' end labels.
    pub(crate) fn labels(&self, svg: &mut String) {
        let (w, h, m) = (self.w, self.h, self.m);
        let _ = write!(
            svg,
            r#"<text x="2" y="14">{}</text><text x="2" y="{}">{}</text><text x="{m}" y="{}">{}</text><text x="{}" y="{}" text-anchor="end">{}</text>"#,
            short(self.y.1),
            h - m,
            short(self.y.0),
            h - m + 14.0,
            self.x.0,
            w - 8.0,
            h - m + 14.0,
            self.x.1
        );
    }
}

/// One metric of one node: y at each x, `None` where undefined.
pub(crate) type Curve = Vec<(f64, Option<f64>)>;

/// The GRPO curves the reports draw, by iteration (the last four averaged
/// over the iteration's updates; undefined, not 0, where none ran).
pub(crate) fn grpo_curves(m: &GrpoMetrics) -> Vec<(String, Curve)> {
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
pub(crate) fn sft_curves(m: &SftMetrics) -> Vec<(String, Curve)> {
    let curves: Vec<(&str, Curve)> = vec![
        ("training NLL per update", m.history.iter().map(|u| (u.update as f64, Some(u.loss))).collect()),
        (
            "validation NLL per epoch",
            m.validation_history.iter().map(|v| (v.epoch as f64 + 1.0, Some(v.validation_nll))).collect(),
        ),
    ];
    curves.into_iter().map(|(t, c)| (t.to_string(), c)).collect()
}

/// A line chart of one series; `None` points are gaps, listed as undefined.
fn chart(title: &str, curve: &[(f64, Option<f64>)]) -> String {
    let defined: Vec<(f64, f64)> =
        curve.iter().filter_map(|(x, y)| y.filter(|v| v.is_finite()).map(|v| (*x, v))).collect();
    let undefined = curve.len() - defined.len();
    let mut svg = String::new();
    let dx: Vec<f64> = defined.iter().map(|p| p.0).collect();
    let dy: Vec<f64> = defined.iter().map(|p| p.1).collect();
    if let Some(plot) = Plot::open(&mut svg, (320.0, 170.0, 36.0), &dx, &dy) {
        plot.line(&mut svg, curve.iter().copied(), "#1565c0");
        plot.labels(&mut svg);
    }
    svg.push_str("</svg>");
    let note = if undefined > 0 { format!(" ({undefined} undefined)") } else { String::new() };
    let _ = write!(svg, "<figcaption>{}{note}</figcaption></figure>", esc(title));
    svg
}

pub(crate) fn short(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-2 || v.abs() >= 1e4) {
        format!("{v:.2e}")
    } else {
        format!("{v:.3}")
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

    // Every metrics file through the type its writer uses: one that cannot be
    // read is said, naming the file and the field, never drawn from defaults.
    let mut metrics: Vec<(&Node, TrainingMetrics)> = Vec::new();
    let mut unreadable: Vec<(&Node, String)> = Vec::new();
    for n in &src.nodes {
        if let Some(p) = n.artifact(ArtifactKind::TrainingMetrics) {
            match TrainingMetrics::read(p) {
                Ok(m) => metrics.push((n, m)),
                Err(e) => unreadable.push((n, e.to_string())),
            }
        }
    }
    let grpo: Vec<(&Node, &GrpoMetrics)> = metrics
        .iter()
        .filter_map(|(n, m)| match m {
            TrainingMetrics::Grpo(g) => Some((*n, g)),
            TrainingMetrics::Sft(_) => None,
        })
        .collect();
    let sft: Vec<(&Node, &SftMetrics)> = metrics
        .iter()
        .filter_map(|(n, m)| match m {
            TrainingMetrics::Sft(s) => Some((*n, s)),
            TrainingMetrics::Grpo(_) => None,
        })
        .collect();
    let cannot_read = |html: &mut String, what: &str, errors: &[(&Node, String)]| {
        for (n, e) in errors {
            let _ =
                writeln!(html, "<h3>{}</h3><p class=\"fail\">The {what} cannot be read: {}</p>", esc(&n.id), esc(e));
        }
    };

    html.push_str("<section id=\"grpo\"><h2>GRPO curves</h2>\n");
    if !unreadable.is_empty() {
        cannot_read(&mut html, "metrics", &unreadable);
    }
    for (n, m) in &grpo {
        let _ = writeln!(html, "<h3>{}</h3><div>", esc(&n.id));
        for (title, curve) in grpo_curves(m) {
            html.push_str(&chart(&title, &curve));
        }
        html.push_str("</div>\n");
    }
    if grpo.is_empty() && unreadable.is_empty() {
        html.push_str("<p>No GRPO node in this run.</p>");
    }
    html.push_str("</section>\n<section id=\"sft\"><h2>SFT</h2>\n");
    for (n, m) in &sft {
        let _ = writeln!(html, "<h3>{}</h3><div>", esc(&n.id));
        for (title, curve) in sft_curves(m) {
            html.push_str(&chart(&title, &curve));
        }
        html.push_str("</div>\n");
    }
    if sft.is_empty() {
        html.push_str("<p>No SFT node in this run.</p>");
    }
    html.push_str("</section>\n");

    // A shell node's own metrics and step series (`metrics:`, `series:`).
    // The section is there only when some shell node declares either.
    let mut own = String::new();
    for n in &src.nodes {
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
                let _ = writeln!(own, "<p class=\"fail\">The metrics cannot be read: {}</p>", esc(&e));
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
                let _ = writeln!(own, "<p class=\"fail\">The series cannot be read: {}</p>", esc(&e));
            }
        }
    }
    if !own.is_empty() {
        html.push_str("<section id=\"series\"><h2>Metrics and series of shell nodes</h2>\n");
        html.push_str(&own);
        html.push_str("</section>\n");
    }

    html.push_str("<section id=\"evaluation\"><h2>Evaluation</h2>\n");
    let tables: Vec<(&Node, &PathBuf)> =
        src.nodes.iter().filter_map(|n| Some((n, n.artifact(ArtifactKind::ResultsTable)?))).collect();
    if tables.is_empty() {
        html.push_str("<p>No results table in this run.</p>");
    }
    for (n, path) in &tables {
        let t: ResultsTableFile = match crate::canonical::read_typed(path) {
            Ok(t) => t,
            Err(e) => {
                // Said, not skipped: a table that cannot be read is not an empty one.
                cannot_read(&mut html, "results table", &[(n, e.to_string())]);
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
        comparison_tables(&mut html, &t);
    }
    html.push_str("</section>\n");

    html.push_str("<section id=\"costs\"><h2>Costs</h2><p>As each node's record keeps them (measured where it ran; never part of a key).</p><table><tr><th>node</th><th>op</th><th>outcome</th><th>seconds (this run)</th><th>seconds (when it ran)</th><th>generation s</th><th>behavior check s</th><th>optimization s</th><th>hashing s</th><th>peak RSS MB</th></tr>\n");
    for n in &src.nodes {
        let m = metrics.iter().find(|(x, _)| x.id == n.id).map(|(_, m)| m);
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
        let seconds = if n.outcome == "cached" { "cached".to_string() } else { num(n.seconds, 2) };
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{seconds}</td><td>{ran}</td><td>{generation}</td><td>{}</td><td>{optimization}</td><td>{}</td><td>{rss}</td></tr>",
            esc(&n.id),
            esc(&n.op),
            esc(&n.outcome),
            sum(|c| c.behavior_verification_seconds),
            sum(|c| c.state_hashing_seconds)
        );
    }
    html.push_str("</table></section>\n");

    html.push_str("<section id=\"gates\"><h2>Gates</h2>\n");
    let mut gate_results: Vec<GateResult> = Vec::new();
    let mut any_gate = false;
    for n in src.nodes.iter().filter(|n| n.kind() == NodeKind::Gate) {
        let Some(p) = n.artifact(ArtifactKind::GateReport) else { continue };
        any_gate = true;
        match GateReport::read(p) {
            Ok(r) => gate_results.extend(r.results),
            // An unreadable gate report is a failure to show, never "no gates".
            Err(e) => cannot_read(&mut html, "gate report", &[(n, e)]),
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

    html.push_str("<section id=\"faults\"><h2>Fault matrix</h2>\n");
    let mut rows = String::new();
    for (n, m) in &grpo {
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
    html.push_str("</section>\n</body></html>\n");
    html
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
    use super::*;
    use std::path::Path;

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

    fn node(id: &str, op: &str, outputs: &[(&str, &Path)]) -> Node {
        Node {
            id: id.into(),
            op: op.into(),
            key: None,
            outcome: "ran".into(),
            seconds: Some(1.0),
            deps: vec![],
            outputs: outputs.iter().map(|(k, p)| (k.to_string(), p.to_path_buf())).collect(),
            hashes: BTreeMap::new(),
            record: None,
            costs: None,
        }
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
        let src = Source {
            title: "t".into(),
            nodes: vec![
                node("grpo", "train.grpo", &[("metrics", &metrics)]),
                node("gates", "gate", &[("gates.json", &gates)]),
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
        let src = Source { title: "t".into(), nodes: vec![node("train", "shell", &[("metrics", &theirs)])] };
        let html = render(&src);
        assert!(!html.contains("cannot be read"), "{html}");
    }

    fn dag(edges: &[(&str, &[&str])]) -> Vec<Node> {
        edges
            .iter()
            .map(|(id, deps)| Node { deps: deps.iter().map(|d| d.to_string()).collect(), ..node(id, "shell", &[]) })
            .collect()
    }

    #[test]
    fn the_layered_layout_ranks_by_longest_path_and_uncrosses_what_listing_order_crosses() {
        // Listed in this order, p (child of y) sits left of q (child of x): the
        // edges cross; x → z passes rank 1 through a dummy vertex.
        let nodes = dag(&[("x", &[]), ("y", &[]), ("p", &["y"]), ("q", &["x"]), ("z", &["p", "x"])]);
        let naive = listed(&nodes);
        assert_eq!(&naive.rank[..5], [0, 0, 1, 1, 2], "z is below p, which is below y");
        assert_eq!(naive.rank.len(), 6, "one dummy, for x → z at rank 1");
        assert!(naive.crossings() >= 1);
        let l = layered(&nodes);
        assert_eq!(l.crossings(), 0, "{l:?}");
        assert!(l.chains.iter().all(|c| c.windows(2).all(|w| l.rank[w[0]] + 1 == l.rank[w[1]])), "{l:?}");
    }

    /// The committed packs' metrics and evaluation summaries still hold their
    /// costs (from before they moved to the record): the report reads them there.
    #[test]
    fn costs_of_outputs_from_before_the_record_kept_them_are_read_from_the_outputs() {
        let outputs = crate::example_packs::outputs("v0.3.0");
        let grpo = node("grpo", "train.grpo", &[("metrics", &outputs.join("grpo@mode=continuous/metrics"))]);
        let m = TrainingMetrics::read(&grpo.outputs["metrics"]).unwrap();
        let c = grpo.costs(Some(&m)).expect("the pack's GRPO metrics hold costs");
        assert!(c.process.seconds > 0.0);
        assert!(c.total(m.iterations().unwrap(), |c| c.loop_seconds).is_some(), "every iteration's");
        let eval = node("eval", "eval.generate", &[("summary", &outputs.join("eval@policy=sft/summary"))]);
        assert!(eval.costs(None).expect("the pack's summary holds its generation seconds").process.seconds > 0.0);
        // A record's costs come first.
        let recorded = crate::costs::NodeCosts {
            process: crate::costs::RunCosts { seconds: 1.25, optimization_seconds: None, peak_rss_bytes: None },
            iterations: Default::default(),
        };
        let n = Node { costs: Some(recorded.clone()), ..grpo };
        assert_eq!(n.costs(Some(&m)), Some(recorded));
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
            hashes: BTreeMap::new(),
            record: None,
            costs: None,
        };
        let html = render(&Source { title: "<t>".into(), nodes: vec![n] });
        assert!(html.contains("a&lt;b&gt;&amp;&quot;c&quot;") && !html.contains("a<b>"));
    }
}

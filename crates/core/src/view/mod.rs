//! The read side: what a finished run, in the workspace or frozen in a pack,
//! holds, as one typed model ([`RunView`]), and the pieces that read it.
//!
//! - [`RunView`]: each node's id, op, key, [`Outcome`], record, costs and
//!   readable outputs, asked for by [`ArtifactKind`]; made by
//!   [`RunView::from_run`] or [`RunView::from_pack`].
//! - [`metrics`]: what a node measured (training curves, evaluation rates,
//!   costs, a command's own metrics and series), each read through its
//!   writer's type.
//! - [`compare`] and [`group`]: the differences between views (keys, metrics,
//!   gates) and the statistics of a matrix axis.
//! - Renderers over those: [`html`] (the report), [`overlay`] (several runs'
//!   curves), [`text`] and [`markdown`] (comparisons), [`tensorboard`]
//!   (event files), with [`svg`] and [`layout`] for the drawings.
//!
//! Nothing here writes into a workspace or a pack; below it are the store,
//! the ops' typed artifacts and the pack format, and nothing below reads it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ops::artifacts::{ArtifactKind, NodeKind};
use crate::store::{NodeOutcome, RunOutput, StoreError, Workspace};
use crate::train::metrics::TrainingMetrics;

mod cells;
pub mod compare;
pub mod group;
pub mod html;
pub mod layout;
pub mod markdown;
pub mod metrics;
pub mod overlay;
pub mod svg;
pub mod tensorboard;
pub mod text;

/// A view that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Pack(#[from] crate::pack::PackError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl ViewError {
    fn io(context: String) -> impl FnOnce(std::io::Error) -> ViewError {
        move |source| ViewError::Io { context, source }
    }
}

pub type Result<T> = std::result::Result<T, ViewError>;

/// One node of a run, as its readers see it.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub id: String,
    pub op: String,
    pub key: Option<crate::store::Key>,
    /// What happened to it in the run (a pack's node without an event: frozen).
    pub outcome: Outcome,
    pub seconds: Option<f64>,
    pub deps: Vec<String>,
    /// Output name → readable file (absent when not available).
    pub outputs: BTreeMap<String, PathBuf>,
    /// Output name → why it is not in `outputs` though the node has it (its
    /// object damaged or no longer stored, an output a pack lists by hash
    /// only), for readers to say.
    pub unavailable: BTreeMap<String, String>,
    /// Output name → blake3 of its content (also for outputs a pack lists
    /// without their bytes).
    pub hashes: BTreeMap<String, String>,
    /// The hash-input record its key was computed from (absent when the
    /// node never completed).
    pub record: Option<crate::dag::key::HashInputs>,
    /// What its process cost, as its record (or a pack's manifest) keeps it.
    pub costs: Option<crate::costs::NodeCosts>,
}

impl NodeView {
    /// What kind of node this is, for its readers.
    pub fn kind(&self) -> NodeKind {
        NodeKind::of(&self.op)
    }

    /// The readable file of one of its typed artifacts: `None` when its op
    /// writes no such artifact, or the file is not here; `Some(Err(why))`
    /// when the node has it but it is not shown ([`NodeView::unavailable`]),
    /// which a reader says rather than showing nothing.
    pub fn artifact(&self, kind: ArtifactKind) -> Option<std::result::Result<&PathBuf, String>> {
        let name = kind.output_of(&self.op)?;
        match (self.outputs.get(name), self.unavailable.get(name)) {
            (Some(path), _) => Some(Ok(path)),
            (None, Some(why)) => Some(Err(format!("{name}: {why}"))),
            (None, None) => None,
        }
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
            crate::canonical::read_typed(self.artifact(ArtifactKind::EvalSummary)?.ok()?).ok()?;
        summary.legacy_costs()
    }
}

/// A run, as its readers see it: the nodes in the order it listed them.
#[derive(Debug, Clone)]
pub struct RunView {
    pub title: String,
    pub nodes: Vec<NodeView>,
}

/// The largest output a run's view checks against its object's name before
/// readers see it: metrics, results tables, summaries and logs, not a model
/// folder or a training state, which no reader reads.
const VERIFIED_BYTES: u64 = 16 << 20;

/// A run of the workspace (default: the latest). Edges come from the recorded
/// input hashes: a node depends on the run's nodes that produced them.
impl RunView {
    pub fn from_run(ws: &Workspace, run: Option<String>) -> Result<RunView> {
        let run = ws.resolve_run(run)?;
        let index = ws.index()?;
        let row = index
            .recent_runs(usize::MAX >> 1)?
            .into_iter()
            .find(|r| r.run_id == run)
            .ok_or_else(|| ViewError::Invalid(format!("run {run} vanished from the index")))?;
        let mut nodes = Vec::new();
        let mut producers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut records = Vec::new();
        for n in index.run_nodes(&run)? {
            let cached = match &n.key {
                Some(k) => index.lookup(k)?,
                None => None,
            };
            let (mut outputs, mut hashes, mut unavailable) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
            for o in &n.outputs_had(cached.as_ref()) {
                producers.entry(o.object.hash.clone()).or_default().push(n.node_id.clone());
                hashes.insert(o.name.clone(), o.object.hash.clone());
                if let Some(why) = not_shown(ws, o)? {
                    unavailable.insert(o.name.clone(), why);
                    continue;
                }
                outputs.insert(o.name.clone(), ws.object_path(&o.object.hash));
            }
            let record = cached.as_ref().map(|c| c.record.clone());
            records.push(record.as_ref().map(|r| r.inputs.clone()).unwrap_or_default());
            let op = record.as_ref().map(|r| r.op.clone()).unwrap_or_default();
            nodes.push(NodeView {
                id: n.node_id.clone(),
                op,
                key: n.key.clone(),
                outcome: Outcome::from(n.outcome),
                seconds: n.seconds,
                deps: Vec::new(),
                outputs,
                unavailable,
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
        Ok(RunView { title: format!("{}{profile} — run {run} ({})", row.spec, row.status), nodes })
    }
}

/// Why a run's output is not shown, if it is not: its object is gone, or (for
/// one a reader may read, up to [`VERIFIED_BYTES`]) no longer hashes to its
/// name. What a reader shows is the run's result.
fn not_shown(ws: &Workspace, o: &RunOutput) -> std::result::Result<Option<String>, StoreError> {
    let path = ws.object_path(&o.object.hash);
    let short = crate::ids::short(&o.object.hash);
    let intact = if o.object.size <= VERIFIED_BYTES {
        crate::store::objects::intact(&path, &o.object.hash, o.object.kind)?
    } else {
        std::fs::symlink_metadata(&path).ok().map(|_| true)
    };
    Ok(match intact {
        Some(true) => None,
        Some(false) => Some(format!(
            "its object {short} is damaged: its bytes no longer hash to its name \
             (`orchestrate verify` lists it; run the node again)"
        )),
        None => Some(format!(
            "its object {short} is no longer in the store (gc removes the results no kept run needs, \
             and `gc --drop-states` training states)"
        )),
    })
}

/// What happened to a node in the run a view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ran,
    Cached,
    Failed,
    Skipped,
    /// In a pack whose event log has no outcome for it.
    Frozen,
}

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::Cached => "cached",
            Outcome::Failed => "failed",
            Outcome::Skipped => "skipped",
            Outcome::Frozen => "frozen",
        }
    }
}

impl From<NodeOutcome> for Outcome {
    fn from(o: NodeOutcome) -> Self {
        match o {
            NodeOutcome::Ran => Outcome::Ran,
            NodeOutcome::Cached => Outcome::Cached,
            NodeOutcome::Failed => Outcome::Failed,
            NodeOutcome::Skipped => Outcome::Skipped,
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing read or compared, named as the user named it (a run id, a
/// spec, a pack folder).
#[derive(Debug, Clone)]
pub struct Side {
    pub name: String,
    pub view: RunView,
}

/// `A`, `B`, ..., `Z`, `S27`, ...: a side's label.
pub fn label(i: usize) -> String {
    if i < 26 {
        char::from(b'A' + i as u8).to_string()
    } else {
        format!("S{}", i + 1)
    }
}

impl RunView {
    /// A frozen pack, from its files alone, verified first
    /// ([`crate::pack::verify`]): what a reader shows a reviewer is what the
    /// pack can prove, so one whose files were changed after freezing is
    /// refused, naming its problems. Before, a metric edited in a pack was
    /// reported, compared and exported as if frozen so.
    pub fn from_pack(dir: &Path) -> Result<RunView> {
        let problems = crate::pack::verify(dir)?;
        if let Some(first) = problems.first() {
            let more = match problems.len() {
                1 => String::new(),
                n => format!(" and {} more", n - 1),
            };
            return Err(ViewError::Invalid(format!(
                "{} is a pack that does not verify ({first}{more}): nothing of it is shown. `orchestrate pack verify {}` \
                 lists every problem",
                dir.display(),
                dir.display()
            )));
        }
        Self::from_pack_files(dir)
    }

    /// A pack's manifest's nodes, their outcomes from the sealed events, and
    /// their packed outputs, as the files are: for the pack `pack freeze` is
    /// writing (it has no SHA256SUMS yet), whose report it seals into it.
    pub fn from_pack_files(dir: &Path) -> Result<RunView> {
        let manifest = crate::pack::Manifest::read(dir).map_err(crate::pack::PackError::from)?;
        let outcome = crate::pack::node_outcomes(dir, &manifest)?;
        let mut nodes = Vec::new();
        for n in &manifest.nodes {
            let mut deps: Vec<String> = n.inputs.values().flatten().map(|r| r.node.clone()).collect();
            deps.sort();
            deps.dedup();
            let outputs = n
                .outputs
                .iter()
                .filter_map(|o| Some((o.name.clone(), crate::pack::inside(dir, o.path.as_ref()?).ok()?)))
                .collect();
            let (o, seconds) = outcome.get(&n.id).map_or((Outcome::Frozen, None), |(o, s)| (Outcome::from(*o), *s));
            let record = n.hash_inputs.clone();
            nodes.push(NodeView {
                id: n.id.clone(),
                op: n.op.clone(),
                key: Some(n.key.clone()),
                outcome: o,
                seconds,
                deps,
                outputs,
                // Listed by hash only: why, as the manifest says.
                unavailable: n
                    .outputs
                    .iter()
                    .filter_map(|o| Some((o.name.clone(), format!("not in the pack: {}", o.omitted.as_ref()?))))
                    .collect(),
                hashes: n.outputs.iter().map(|o| (o.name.clone(), o.blake3.clone())).collect(),
                record: Some(record),
                costs: n.costs.clone(),
            });
        }
        if nodes.is_empty() {
            return Err(ViewError::Invalid(format!("{}: the manifest lists no nodes", dir.display())));
        }
        Ok(RunView { title: format!("pack {} — {}", manifest.spec.name, dir.display()), nodes })
    }
}

/// A node with outputs at the given files, as the readers' tests make them.
#[cfg(test)]
pub(crate) fn test_node(id: &str, op: &str, outputs: &[(&str, &Path)]) -> NodeView {
    NodeView {
        id: id.into(),
        op: op.into(),
        key: None,
        outcome: Outcome::Ran,
        seconds: Some(1.0),
        deps: vec![],
        outputs: outputs.iter().map(|(k, p)| (k.to_string(), p.to_path_buf())).collect(),
        unavailable: BTreeMap::new(),
        hashes: BTreeMap::new(),
        record: None,
        costs: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed packs' metrics and evaluation summaries still hold their
    /// costs (from before they moved to the record): the report reads them there.
    #[test]
    fn costs_of_outputs_from_before_the_record_kept_them_are_read_from_the_outputs() {
        let outputs = crate::example_packs::outputs("v0.3.0");
        let grpo = test_node("grpo", "train.grpo", &[("metrics", &outputs.join("grpo@mode=continuous/metrics"))]);
        let m = TrainingMetrics::read(&grpo.outputs["metrics"]).unwrap();
        let c = grpo.costs(Some(&m)).expect("the pack's GRPO metrics hold costs");
        assert!(c.process.seconds > 0.0);
        assert!(c.total(m.iterations().unwrap(), |c| c.loop_seconds).is_some(), "every iteration's");
        let eval = test_node("eval", "eval.generate", &[("summary", &outputs.join("eval@policy=sft/summary"))]);
        assert!(eval.costs(None).expect("the pack's summary holds its generation seconds").process.seconds > 0.0);
        // A record's costs come first.
        let recorded = crate::costs::NodeCosts {
            process: crate::costs::RunCosts { seconds: 1.25, optimization_seconds: None, peak_rss_bytes: None },
            iterations: Default::default(),
        };
        let n = NodeView { costs: Some(recorded.clone()), ..grpo };
        assert_eq!(n.costs(Some(&m)), Some(recorded));
    }
}

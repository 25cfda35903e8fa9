//! What a node's outputs are, for readers (the report, `compare`, overlays,
//! the TensorBoard export, packs): a reader asks what kind of node it holds
//! and for an artifact kind, never for an op or output name, so the names live
//! here beside the ops that write them.

use super::worker::WorkerOp;

/// What a node is, as its readers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// `train.sft`, `train.grpo`: [`ArtifactKind::TrainingMetrics`].
    Training,
    /// `eval.generate`: [`ArtifactKind::EvalSummary`]; its process seconds
    /// are its generation's.
    Generation,
    /// `eval.score`: [`ArtifactKind::EvalResults`], per problem.
    Scoring,
    /// `results.table`: [`ArtifactKind::ResultsTable`].
    ResultsTable,
    /// `gate`: [`ArtifactKind::GateReport`].
    Gate,
    /// `shell`: the user's command; its metrics and series are the files it declares.
    Command,
    /// Any other op: nothing a reader takes measurements from.
    Other,
}

impl NodeKind {
    pub fn of(op: &str) -> NodeKind {
        match op {
            _ if op == WorkerOp::TrainSft.name() || op == WorkerOp::TrainGrpo.name() => NodeKind::Training,
            _ if op == WorkerOp::EvalGenerate.name() => NodeKind::Generation,
            "eval.score" => NodeKind::Scoring,
            "results.table" => NodeKind::ResultsTable,
            super::gate::GateOp::NAME => NodeKind::Gate,
            "shell" => NodeKind::Command,
            _ => NodeKind::Other,
        }
    }
}

/// A typed artifact an op writes, read through its writer's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    /// A training node's `metrics` (`train::metrics::TrainingMetrics`).
    TrainingMetrics,
    /// A generation's `summary` (`ops::eval::EvalSummary`).
    EvalSummary,
    /// A scoring's `results` (`ops::eval::EvalResults`).
    EvalResults,
    /// A results table's `table.json` (`ops::results::ResultsTableFile`).
    ResultsTable,
    /// A gate node's `gates.json` (`gate::GateReport`).
    GateReport,
    /// A GRPO node's `rollouts` folder (`guard::rollouts`): the token
    /// artifacts its guard log's generation events name.
    Rollouts,
}

impl ArtifactKind {
    /// The output of a node of `op` that holds this artifact, if it writes one.
    pub fn output_of(self, op: &str) -> Option<&'static str> {
        match (self, NodeKind::of(op)) {
            (ArtifactKind::TrainingMetrics, NodeKind::Training) => Some("metrics"),
            (ArtifactKind::EvalSummary, NodeKind::Generation) => Some("summary"),
            (ArtifactKind::EvalResults, NodeKind::Scoring) => Some("results"),
            (ArtifactKind::ResultsTable, NodeKind::ResultsTable) => Some("table.json"),
            (ArtifactKind::GateReport, NodeKind::Gate) => Some(super::gate::GateOp::REPORT),
            (ArtifactKind::Rollouts, NodeKind::Training) if op == WorkerOp::TrainGrpo.name() => {
                Some(crate::guard::rollouts::OUTPUT)
            }
            _ => None,
        }
    }
}

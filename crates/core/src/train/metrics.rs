//! What a training node writes as `metrics` (and as its `state`'s metadata),
//! and what `results.table`, `analysis.arms`, the report, `check.resume` and a
//! resuming run read: one type for writer and readers. A missing or ill-typed
//! field is an error naming the file and the field, never a default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::canonical::ArtifactError;
pub use crate::costs::{IterationCosts, NodeCosts, RunCosts};
use crate::guard::{Canary, Decision};
use crate::train::params::{FaultSpec, GrpoParams, GuardSwitch, Mode, SftParams};

/// A training node's metrics, by kind.
// One value per metrics file read, never held in bulk: boxing the larger
// variant would buy nothing but an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TrainingMetrics {
    Sft(SftMetrics),
    Grpo(GrpoMetrics),
}

/// The headline figures of a training node's run, as its worker reports
/// them beside its outputs (in [`crate::ops::worker::WorkerResult`]): what
/// `run` prints as the node finishes and its `node_finished` event keeps.
/// Never hashed and never an output: the `metrics` output holds the whole
/// history these are taken from. A figure there is none of (no update was
/// made) is `None`, said "undefined", never 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum TrainingSummary {
    Sft {
        /// Optimizer updates the node's whole training made.
        updates: usize,
        /// The loss of its first and of its last update.
        first_loss: Option<f64>,
        last_loss: Option<f64>,
        /// The validation NLL after its last validated epoch.
        validation_nll: Option<f64>,
    },
    Grpo {
        /// Iterations the node's whole training ran.
        iterations: usize,
        /// The mean reward of its first and of its last iteration.
        first_mean_reward: Option<f64>,
        last_mean_reward: Option<f64>,
        /// The exact KL to the reference at its last update.
        last_kl: Option<f64>,
        /// Iterations whose batch the guard did not allow (quarantined or
        /// rejected: no update made from it).
        refused: usize,
    },
}

impl TrainingSummary {
    /// The summary of a finished training's metrics.
    pub fn of(metrics: &TrainingMetrics) -> TrainingSummary {
        match metrics {
            TrainingMetrics::Sft(m) => TrainingSummary::Sft {
                updates: m.updates,
                first_loss: m.history.first().map(|u| u.loss),
                last_loss: m.history.last().map(|u| u.loss),
                validation_nll: m.validation_history.last().map(|v| v.validation_nll),
            },
            TrainingMetrics::Grpo(m) => TrainingSummary::Grpo {
                iterations: m.history.len(),
                first_mean_reward: m.history.first().map(|i| i.mean_reward),
                last_mean_reward: m.history.last().map(|i| i.mean_reward),
                last_kl: m.history.iter().rev().find_map(|i| i.updates.last()).map(|u| u.kl),
                refused: m.history.iter().filter(|i| i.guard.decision != Decision::Allow).count(),
            },
        }
    }
}

impl std::fmt::Display for TrainingSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |x: &Option<f64>| x.map_or("undefined".to_string(), |x| format!("{x:.4}"));
        match self {
            TrainingSummary::Sft { updates, first_loss, last_loss, validation_nll } => {
                write!(f, "loss {} -> {} over {updates} updates", n(first_loss), n(last_loss))?;
                if validation_nll.is_some() {
                    write!(f, ", validation NLL {}", n(validation_nll))?;
                }
                Ok(())
            }
            TrainingSummary::Grpo { iterations, first_mean_reward, last_mean_reward, last_kl, refused } => {
                write!(
                    f,
                    "mean reward {} -> {} over {iterations} iterations, last KL {}",
                    n(first_mean_reward),
                    n(last_mean_reward),
                    n(last_kl)
                )?;
                if *refused > 0 {
                    write!(f, ", {refused} refused by the guard")?;
                }
                Ok(())
            }
        }
    }
}

impl TrainingMetrics {
    /// Reads a `metrics` file.
    pub fn read(path: &std::path::Path) -> Result<Self, ArtifactError> {
        let text = crate::canonical::read_artifact_text(path)?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ArtifactError::Invalid(format!("{}: not JSON: {e}", path.display())))?;
        Self::from_meta(&value, &path.display().to_string())
    }

    /// Reads metrics (a `metrics` file's or a state file's metadata); `what`
    /// names them in errors, which give the full path of the field.
    pub fn from_meta(meta: &serde_json::Value, what: &str) -> Result<Self, ArtifactError> {
        // The kind is dispatched by hand: serde's internally tagged enums buffer
        // their content and lose the path of an error inside it.
        let kind = meta.get("kind").and_then(serde_json::Value::as_str);
        let mut body = meta.clone();
        if let Some(fields) = body.as_object_mut() {
            fields.remove("kind");
        }
        let fail = |e: serde_path_to_error::Error<serde_json::Error>| {
            ArtifactError::Invalid(format!("{what}: field {}: {}", e.path(), e.inner()))
        };
        match kind {
            Some("sft") => serde_path_to_error::deserialize(body).map(TrainingMetrics::Sft).map_err(fail),
            Some("grpo") => serde_path_to_error::deserialize(body).map(TrainingMetrics::Grpo).map_err(fail),
            Some(other) => {
                Err(ArtifactError::Invalid(format!("{what}: field kind: '{other}' is not a training kind (sft, grpo)")))
            }
            None => Err(ArtifactError::Invalid(format!("{what}: field kind: missing (expected sft or grpo)"))),
        }
    }

    /// The `metrics` file's text: pretty JSON with its keys sorted (through a
    /// JSON value, as the state's metadata is written).
    pub fn to_json_pretty(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(&serde_json::to_value(self)?)
    }

    pub fn kind(&self) -> &'static str {
        match self {
            TrainingMetrics::Sft(_) => "sft",
            TrainingMetrics::Grpo(_) => "grpo",
        }
    }

    /// The costs that metrics written before costs moved to the node's
    /// record hold (the committed packs'); `None` for metrics written since,
    /// whose costs are in the record ([`crate::costs`]).
    pub fn legacy_costs(&self) -> Option<NodeCosts> {
        match self {
            TrainingMetrics::Sft(m) => NodeCosts::legacy(m.costs.as_ref(), BTreeMap::new()),
            TrainingMetrics::Grpo(m) => NodeCosts::legacy(
                m.costs.as_ref(),
                m.history.iter().filter_map(|h| h.costs.clone().map(|c| (h.iteration, c))).collect(),
            ),
        }
    }

    /// How many GRPO iterations the run has in all (`None` for SFT): what a
    /// total over [`NodeCosts::iterations`] needs.
    pub fn iterations(&self) -> Option<usize> {
        match self {
            TrainingMetrics::Sft(_) => None,
            TrainingMetrics::Grpo(m) => Some(m.history.len()),
        }
    }

    pub fn updates(&self) -> usize {
        match self {
            TrainingMetrics::Sft(m) => m.updates,
            TrainingMetrics::Grpo(m) => m.updates,
        }
    }
}

/// What makes two processes one run: their settings except the mode and the
/// interrupt point (an interrupted run and its resume are one run, and the
/// continuous run is the same run again), and the starting weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoIdentity {
    /// The run's params with `mode: continuous` and `interrupt_at: 0`.
    pub params: GrpoParams,
    pub initial_model_digest: String,
    pub verifier_protocol: String,
}

impl GrpoIdentity {
    pub fn new(params: &GrpoParams, initial_model_digest: String, verifier_protocol: String) -> Self {
        let params = GrpoParams { mode: Mode::Continuous, interrupt_at: 0, ..params.clone() };
        GrpoIdentity { params, initial_model_digest, verifier_protocol }
    }
}

/// The SFT counterpart of [`GrpoIdentity`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftIdentity {
    /// The run's params with `mode: continuous` and `interrupt_after_epochs: 0`.
    pub params: SftParams,
    pub initial_model_digest: String,
    pub examples: usize,
}

impl SftIdentity {
    pub fn new(params: &SftParams, initial_model_digest: String, examples: usize) -> Self {
        let params = SftParams { mode: Mode::Continuous, interrupt_after_epochs: 0, ..params.clone() };
        SftIdentity { params, initial_model_digest, examples }
    }
}

/// Where the learning-rate schedule stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheduler {
    pub next_update: usize,
    pub total: usize,
}

/// `train.sft`'s metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftMetrics {
    pub identity: SftIdentity,
    pub next_epoch: usize,
    pub complete: bool,
    pub updates: usize,
    pub adam_step: i64,
    pub scheduler: Scheduler,
    pub history: Vec<SftUpdate>,
    pub validation_history: Vec<SftValidation>,
    pub final_model_digest: String,
    /// Only in metrics written before costs moved to the node's record
    /// (train.sft v3, train.grpo v8; see [`crate::costs`]): never written now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<RunCosts>,
}

/// One SFT update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftUpdate {
    pub update: usize,
    pub epoch: usize,
    pub loss: f64,
    pub tokens: f64,
    pub lr: f64,
    pub grad_norm: f64,
}

/// Validation NLL after one epoch (recorded, never used to pick a checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftValidation {
    pub epoch: usize,
    pub validation_nll: f64,
    pub tokens: f64,
}

/// Where the prompt order stands: epoch of the pool permutation, and position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    pub epoch: usize,
    pub offset: usize,
}

/// `train.grpo`'s metrics; a WAL checkpoint holds the same, as of its iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoMetrics {
    pub identity: GrpoIdentity,
    /// The rollout lineage (not compared by `check.resume`: a continuous run
    /// replays the same rollout ids in a lineage of its own).
    pub lineage: String,
    pub next_iteration: usize,
    pub complete: bool,
    pub updates: usize,
    pub adam_step: i64,
    pub scheduler: Scheduler,
    pub cursor: Cursor,
    /// Rollout id ranges `[first, end)` consumed so far.
    pub consumed_rollouts: Vec<[u64; 2]>,
    /// Distinct rollout ids consumed.
    pub rollouts_consumed: usize,
    pub history: Vec<GrpoIteration>,
    pub reference_digest: String,
    pub reference_unchanged: bool,
    pub guard: GuardSummary,
    pub final_model_digest: String,
    /// Only in metrics written before costs moved to the node's record
    /// (train.sft v3, train.grpo v8; see [`crate::costs`]): never written now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<RunCosts>,
}

/// One GRPO iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoIteration {
    pub iteration: usize,
    /// The prompt ids of the iteration, in order.
    pub prompts: Vec<String>,
    pub rollouts: [u64; 2],
    pub mean_reward: f64,
    pub rewards: Vec<f64>,
    /// Each reward term's mean and sample std over the iteration's responses
    /// (TRL's `rewards/<name>/mean` and `/std`); absent before train.grpo v7.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_terms: BTreeMap<String, crate::reward::TermStats>,
    pub zero_variance_groups: usize,
    pub zero_variance_fraction: f64,
    pub finish: FinishCounts,
    /// Each response's length in tokens, its EOS included (as TRL's
    /// `completions/*_length`); absent from metrics written before train.grpo v6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_tokens: Option<Vec<usize>>,
    pub behavior_max_gap: f64,
    /// The updates made (none when the guard refused the batch).
    pub updates: Vec<UpdateStats>,
    pub weights_changed: bool,
    pub guard: IterationGuard,
    pub canary: Canary,
    /// Fault families injected at this iteration.
    pub faults: Vec<String>,
    /// Only in metrics written before train.grpo v8 (see [`crate::costs`]),
    /// and there absent for the iterations a resumed run took over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<IterationCosts>,
}

/// How the responses of an iteration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishCounts {
    pub eos: usize,
    pub length: usize,
}

/// What one update measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateStats {
    pub loss: f64,
    pub surrogate: f64,
    pub kl: f64,
    pub clip_fraction: f64,
    pub grad_norm: f64,
    pub lr: f64,
}

/// The guard's decision on an iteration's batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IterationGuard {
    pub decision: Decision,
    pub codes: Vec<String>,
    /// How many rollouts were refused (absent when the batch was allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollouts: Option<usize>,
}

/// What the guard did over the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardSummary {
    pub switch: GuardSwitch,
    pub faults: Vec<FaultSpec>,
    pub detections: Vec<Detection>,
    /// Updates applied on a faulted batch (guard off).
    pub bad_updates_applied: usize,
    /// Updates made without validation, counted from the sealed log.
    pub unguarded_updates: usize,
    pub event_log: EventLogSummary,
}

/// A refused batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Detection {
    pub iteration: usize,
    pub decision: Decision,
    pub codes: Vec<String>,
}

/// The lineage's sealed event log as of this state. Its chain was verified:
/// a broken one stops the run instead of being summarised (so there is no
/// `intact` flag, which could only ever say `true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventLogSummary {
    pub events: usize,
}

#[cfg(test)]
mod tests {
    use super::TrainingMetrics;

    #[test]
    fn every_training_metrics_file_of_the_committed_packs_since_v0_2_0_reads_typed_and_writes_back_identically() {
        // v0.1.0's metrics predate the shared type.
        for version in &crate::example_packs::VERSIONS[1..] {
            let outputs = crate::example_packs::outputs(version);
            let mut read = 0;
            for node in std::fs::read_dir(&outputs).unwrap() {
                let path = node.unwrap().path().join("metrics");
                if !path.is_file() {
                    continue;
                }
                let m = TrainingMetrics::read(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(m.updates() > 0, "{}", path.display());
                let text = std::fs::read_to_string(&path).unwrap();
                let again: serde_json::Value = serde_json::to_value(&m).unwrap();
                assert_eq!(again, serde_json::from_str::<serde_json::Value>(&text).unwrap(), "{}", path.display());
                read += 1;
            }
            // drills, pretrain, 2 warm-start, warm-start resume, 2 SFT, SFT resume, 2 GRPO, GRPO resume.
            assert_eq!(read, 11, "{version}");
        }
    }
}

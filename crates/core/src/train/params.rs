//! The params of the training ops (`train.sft`, `train.grpo`), with the
//! protocol's defaults (shared/seeds/003: "Trois politiques différentes", "Du
//! groupe à l'avantage", "Budget, coûts et reprise"). They live beside the
//! metrics that embed them; `ops::train` registers the ops that take them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::DEFAULT_SYSTEM;

/// How a training node relates to an interruption test.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Run every epoch or iteration.
    #[default]
    Continuous,
    /// Stop at the interruption point and write the full state.
    Interrupt,
    /// Continue from a state (input `resume_from`) to the end.
    Resume,
}

/// Which SFT branch: the warm-start examples, or the rest of train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SftBranch {
    /// The 128 warm-start examples, from the base model.
    Warmstart,
    /// The 872 other train examples, from the warm-start model.
    Sft,
    /// Every example of the given labels (the optional pretraining corpus).
    Pretrain,
}

impl SftBranch {
    /// As written in a spec (`warmstart`, `sft`, `pretrain`).
    pub fn label(self) -> &'static str {
        match self {
            SftBranch::Warmstart => "warmstart",
            SftBranch::Sft => "sft",
            SftBranch::Pretrain => "pretrain",
        }
    }
}

pub(crate) fn d_system() -> String {
    DEFAULT_SYSTEM.to_string()
}
pub(crate) fn d_8() -> usize {
    8
}
pub(crate) fn d_sft_lr() -> f64 {
    2e-5
}
pub(crate) fn d_wd() -> f64 {
    0.01
}
pub(crate) fn d_one() -> f64 {
    1.0
}
pub(crate) fn d_tenth() -> f64 {
    0.1
}
pub(crate) fn d_prompt_tokens() -> usize {
    crate::model::MAX_PROMPT_TOKENS
}
pub(crate) fn d_response_tokens() -> usize {
    crate::model::MAX_RESPONSE_TOKENS
}

/// Params of `train.sft`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SftParams {
    pub branch: SftBranch,
    /// 3 for warm-start (48 updates of 8), 2 for SFT (218 updates).
    #[schemars(range(min = 1))]
    pub epochs: usize,
    /// Examples per update.
    #[serde(default = "d_8")]
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    #[serde(default = "d_sft_lr")]
    pub lr: f64,
    #[serde(default = "d_wd")]
    pub weight_decay: f64,
    #[serde(default = "d_one")]
    pub max_grad_norm: f64,
    #[serde(default = "d_tenth")]
    pub warmup_ratio: f64,
    #[serde(default = "d_tenth")]
    pub min_lr_ratio: f64,
    /// Seed of the per-epoch example order.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub mode: Mode,
    /// With `mode: interrupt`: stop after this many epochs.
    #[serde(default = "d_usize_one")]
    pub interrupt_after_epochs: usize,
    /// Use only the first N examples of the branch (small budgets for tests); all by default.
    #[serde(default)]
    pub limit_examples: Option<usize>,
    #[serde(default = "d_system")]
    pub system: String,
    /// The chat template prompts are rendered with: `model` (the model
    /// folder's own, `tokenizer_config.json`'s `chat_template`; the built-in
    /// ChatML when it ships none) or `chatml`.
    #[serde(default, skip_serializing_if = "crate::model::chat::TemplateChoice::is_default")]
    pub chat_template: crate::model::chat::TemplateChoice,
    /// The user message around each statement, `{prompt}` standing for it
    /// (`"Solve step by step: {prompt}"`). Absent: the statement itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<String>,
    #[serde(default = "d_prompt_tokens")]
    pub max_prompt_tokens: usize,
    #[serde(default = "d_response_tokens")]
    pub max_response_tokens: usize,
    /// Pretraining only: also train, every epoch, on the first N examples of a
    /// second corpus (inputs `mix_pages` and `mix_labels`, required when this
    /// is set), shuffled in with the others. Replaying an earlier stage's corpus
    /// keeps what it taught while a new one is learned (the tiny profile replays
    /// arithmetic drills during statement pretraining). Absent: no second corpus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub mix_examples: Option<usize>,
}

pub(crate) fn d_usize_one() -> usize {
    1
}

/// Params of `train.grpo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrpoParams {
    /// Responses per prompt (G).
    #[serde(default = "d_group")]
    #[schemars(range(min = 2))]
    pub group_size: usize,
    #[serde(default = "d_group")]
    #[schemars(range(min = 1))]
    pub prompts_per_iteration: usize,
    #[serde(default = "d_iterations")]
    #[schemars(range(min = 1))]
    pub iterations: usize,
    #[serde(default = "d_updates")]
    #[schemars(range(min = 1))]
    pub updates_per_iteration: usize,
    #[serde(default = "d_grpo_lr")]
    pub lr: f64,
    #[serde(default = "d_wd")]
    pub weight_decay: f64,
    #[serde(default = "d_one")]
    pub max_grad_norm: f64,
    /// ρ is clipped to [1 − ε, 1 + ε].
    #[serde(default = "d_clip")]
    pub clip_eps: f64,
    /// Coefficient of the exact prefix KL to the reference.
    #[serde(default = "d_beta")]
    pub beta: f64,
    #[serde(default = "d_block")]
    #[schemars(range(min = 1))]
    pub kl_block: i64,
    /// Groups per forward/backward pass of an update, the gradients accumulated
    /// over the iteration's batch (as TRL's per-device batch with gradient
    /// accumulation): less memory, the same update up to float rounding. Unset:
    /// the whole batch in one pass (and absent from the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub micro_batch_groups: Option<usize>,
    #[serde(default = "d_tenth")]
    pub warmup_ratio: f64,
    #[serde(default = "d_tenth")]
    pub min_lr_ratio: f64,
    #[serde(default = "d_response_tokens")]
    pub max_new_tokens: usize,
    #[serde(default = "d_prompt_tokens")]
    pub max_prompt_tokens: usize,
    /// Seed of prompt order and of sampling (with rollout ids and positions).
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub mode: Mode,
    /// With `mode: interrupt`: stop after this many iterations.
    #[serde(default = "d_interrupt_at")]
    pub interrupt_at: usize,
    /// Behavior log-probs must match full re-scoring within this before the first update.
    #[serde(default = "d_behavior_tol")]
    pub behavior_tolerance: f64,
    /// The verifier whose reward trains the policy (absent `reward`).
    #[serde(default = "d_verifier")]
    pub verifier: String,
    /// The reward as a weighted sum of terms, each a registered verifier or a
    /// program of your own speaking JSON lines (docs/rewards.md):
    /// `[{name: correct, verifier: gsm8k_last_number, weight: 1.0},
    /// {name: format, command: [python3, rewards/format.py], weight: 0.2}]`.
    /// Absent: the `verifier` alone (and absent from the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<Vec<crate::reward::RewardTerm>>,
    #[serde(default = "d_system")]
    pub system: String,
    /// The chat template prompts are rendered with: `model` (the model
    /// folder's own, `tokenizer_config.json`'s `chat_template`; the built-in
    /// ChatML when it ships none) or `chatml`.
    #[serde(default, skip_serializing_if = "crate::model::chat::TemplateChoice::is_default")]
    pub chat_template: crate::model::chat::TemplateChoice,
    /// The user message around each statement, `{prompt}` standing for it
    /// (`"Solve step by step: {prompt}"`). Absent: the statement itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<String>,
    /// The trajectory guard: `on` (only validated batches update parameters) or
    /// `off` (explicit, loudly logged; bad updates happen and are counted).
    #[serde(default)]
    pub guard: GuardSwitch,
    /// Faults injected on purpose (the fault matrix).
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
    /// The guard's protocol: `bounded` (rollouts may lag the trainer by up to
    /// updates_per_iteration − 1 versions, corrected by the clipped ratio) or
    /// `strict` (on-policy only; needs updates_per_iteration: 1).
    #[serde(default)]
    pub protocol: GuardProtocol,
    /// Write a recovery checkpoint every N iterations (0: never). A run that
    /// crashes resumes from its last committed checkpoint when re-run.
    #[serde(default = "d_checkpoint_every")]
    pub checkpoint_every: usize,
}

impl GrpoParams {
    /// The reward's terms: `reward`, or the `verifier` as its only term.
    pub fn reward_terms(&self) -> Vec<crate::reward::RewardTerm> {
        match &self.reward {
            Some(terms) => terms.clone(),
            None => vec![crate::reward::RewardTerm::of_verifier(&self.verifier)],
        }
    }
}

pub(crate) fn d_checkpoint_every() -> usize {
    10
}

/// The guard's on-policy requirement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GuardProtocol {
    #[default]
    Bounded,
    Strict,
}

/// Whether the guard stands between rollouts and the optimizer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GuardSwitch {
    #[default]
    On,
    Off,
}

impl GuardSwitch {
    /// As written in a spec (`on`, `off`).
    pub fn label(self) -> &'static str {
        match self {
            GuardSwitch::On => "on",
            GuardSwitch::Off => "off",
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub family: FaultFamily,
    /// The iteration whose rollout set is corrupted.
    pub at_iteration: usize,
    /// F4: how far the mask is shifted (default 1).
    #[serde(default)]
    pub shift: Option<usize>,
}

/// The fault families of shared/seeds/000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum FaultFamily {
    /// Static rollout policy: the sync to the rollout engine is silently skipped.
    F1,
    /// Misbound old log-probs (scored by another policy, off by one position).
    F2,
    /// Retokenization: the response is decoded and re-encoded for the update.
    F3,
    /// The completion mask shifted by `shift` positions.
    F4,
    /// Split leakage: a test prompt's rollout enters the update.
    F5,
    /// Evaluator alias: the reward names an alias of a registered verifier.
    F6,
    /// Event reorder: scoring logged after an update.
    F7,
    /// Artifact mutation: a stored token artifact edited after it was recorded.
    F8,
    /// Reward from an unregistered verifier.
    F9,
    /// Prompt content substituted under the same id.
    F10,
}

pub(crate) fn d_group() -> usize {
    4
}
pub(crate) fn d_iterations() -> usize {
    100
}
pub(crate) fn d_updates() -> usize {
    2
}
pub(crate) fn d_grpo_lr() -> f64 {
    1e-6
}
pub(crate) fn d_clip() -> f64 {
    0.2
}
pub(crate) fn d_beta() -> f64 {
    0.02
}
pub(crate) fn d_block() -> i64 {
    4096
}
pub(crate) fn d_interrupt_at() -> usize {
    40
}
pub(crate) fn d_behavior_tol() -> f64 {
    2e-4
}
pub(crate) fn d_verifier() -> String {
    crate::data::verifier::PROTOCOL_VERIFIER.into()
}

#[cfg(test)]
mod tests {
    use super::{GuardSwitch, SftBranch};

    /// A label is what a spec writes: the serde name of the value.
    #[test]
    fn labels_are_the_spec_spellings() {
        for b in [SftBranch::Warmstart, SftBranch::Sft, SftBranch::Pretrain] {
            assert_eq!(serde_json::to_value(b).unwrap(), b.label());
        }
        for g in [GuardSwitch::On, GuardSwitch::Off] {
            assert_eq!(serde_json::to_value(g).unwrap(), g.label());
        }
    }
}

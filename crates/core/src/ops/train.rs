//! Training ops. `train.sft` and `train.grpo` run in the worker; `check.resume`
//! compares two state files here. Defaults are the protocol's numbers
//! (shared/seeds/003: "Trois politiques différentes", "Du groupe à l'avantage",
//! "Budget, coûts et reprise").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::worker::{WorkerOp, WorkerTask};
use super::{check_ranges, InputDecl, Op, OpError, OutputDecl, OutputKind, ParamError, Range, Role, RunContext};

pub use crate::train::params::*;

/// A model trained on train labels is a model, not labels: training outputs
/// carry no taint. (A training node cannot read test data at all, so nothing
/// derived from the test split can flow through one.)
fn train_outputs() -> Vec<OutputDecl> {
    let clean = || Some(std::collections::BTreeSet::new());
    vec![
        OutputDecl { kind: OutputKind::Dir, taint: clean(), ..OutputDecl::file("model") },
        OutputDecl { taint: clean(), ..OutputDecl::file("state") },
        OutputDecl { taint: clean(), ..OutputDecl::file("metrics") },
    ]
}

fn mode_inputs(mode: Mode, mut inputs: Vec<InputDecl>) -> Vec<InputDecl> {
    if mode == Mode::Resume {
        inputs.push(InputDecl::required("resume_from", "the state written by the interrupt node (NODE:state)"));
    }
    inputs
}

/// `train.sft`: supervised fine-tuning on reference responses.
pub struct TrainSft;

impl Op for TrainSft {
    fn name(&self) -> &'static str {
        WorkerOp::TrainSft.name()
    }
    fn version(&self) -> u32 {
        // 2: metrics and state metadata are the shared `TrainingMetrics` type.
        // 3: the metrics keep no seconds and no memory peak (they are in the
        //    node's record, so two runs of one key write the same bytes).
        3
    }
    fn summary(&self) -> &'static str {
        "SFT on reference responses (warm-start or SFT branch), resumable (runs in the worker)"
    }
    type Params = SftParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        super::check_prompt_template(&p.prompt_template)?;
        check_ranges(&[
            ("lr", p.lr, Range::Positive),
            ("weight_decay", p.weight_decay, Range::NonNegative),
            ("max_grad_norm", p.max_grad_norm, Range::Positive),
            ("warmup_ratio", p.warmup_ratio, Range::Unit),
            ("min_lr_ratio", p.min_lr_ratio, Range::Unit),
            ("max_prompt_tokens", p.max_prompt_tokens as f64, Range::AtLeastOne),
            ("max_response_tokens", p.max_response_tokens as f64, Range::AtLeastOne),
        ])?;
        if p.mode == Mode::Interrupt && p.interrupt_after_epochs >= p.epochs {
            return Err(ParamError {
                path: vec!["interrupt_after_epochs".into()],
                message: format!("must be below epochs ({}) to interrupt anything", p.epochs),
                unknown_key: false,
            });
        }
        if p.mix_examples.is_some() && p.branch != SftBranch::Pretrain {
            return Err(ParamError {
                path: vec!["mix_examples".into()],
                message: format!(
                    "a second corpus is for the pretraining branch only; the {} branch trains on the protocol's examples alone",
                    p.branch.label()
                ),
                unknown_key: false,
            });
        }
        Ok(())
    }
    fn inputs(&self, params: &Self::Params) -> Option<Vec<InputDecl>> {
        let mode = params.mode;
        let mut inputs = vec![
            InputDecl::required("model", "the starting model folder"),
            InputDecl::required("pages", "train pages"),
            InputDecl::required("labels", "train labels (reference responses)"),
            InputDecl::required("validation_pages", "validation pages"),
            InputDecl::required("validation_labels", "validation labels (for the NLL, never for selection)"),
        ];
        if params.mix_examples.is_some() {
            inputs.push(InputDecl::required("mix_pages", "pages of the second corpus (with mix_examples)"));
            inputs.push(InputDecl::required("mix_labels", "labels of the second corpus (with mix_examples)"));
        }
        Some(mode_inputs(mode, inputs))
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        train_outputs()
    }
    fn numerical(&self) -> bool {
        true
    }
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Training
    }
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        super::worker::run_in_worker(WorkerTask::TrainSft(params.clone()), ctx)
    }
}

/// `train.grpo`: GRPO with the exact prefix KL, from the warm-start model.
pub struct TrainGrpo;

impl Op for TrainGrpo {
    fn name(&self) -> &'static str {
        WorkerOp::TrainGrpo.name()
    }
    fn version(&self) -> u32 {
        // 2: the guard in the loop (rollout engine, envelopes, event log, WAL).
        // 3: metrics, state metadata and WAL checkpoints are the shared
        // `TrainingMetrics` type; updates go through `UpdateBatch`.
        // 4: the event-log summary lost its always-true `intact` flag.
        // 5: logits at the response positions only (other float rounding).
        // 6: metrics record each response's length (`response_tokens`).
        // 7: rewards are terms (`reward:`), each logged per iteration
        //    (`reward_terms`: TRL's rewards/<name>/mean and /std).
        // 8: the metrics keep no seconds and no memory peak, the run's or an
        //    iteration's (they are in the node's record).
        // 9: the rollouts are an output (`rollouts`), written into staging
        //    and kept by the WAL, not objects no cache row names.
        9
    }
    fn summary(&self) -> &'static str {
        "GRPO (clipped surrogate + β × exact prefix KL), resumable (runs in the worker)"
    }
    type Params = GrpoParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        super::check_prompt_template(&p.prompt_template)?;
        check_ranges(&[
            ("lr", p.lr, Range::Positive),
            ("weight_decay", p.weight_decay, Range::NonNegative),
            ("max_grad_norm", p.max_grad_norm, Range::Positive),
            ("clip_eps", p.clip_eps, Range::OpenUnit),
            ("beta", p.beta, Range::NonNegative),
            ("warmup_ratio", p.warmup_ratio, Range::Unit),
            ("min_lr_ratio", p.min_lr_ratio, Range::Unit),
            ("behavior_tolerance", p.behavior_tolerance, Range::Positive),
            ("max_new_tokens", p.max_new_tokens as f64, Range::AtLeastOne),
            ("max_prompt_tokens", p.max_prompt_tokens as f64, Range::AtLeastOne),
        ])?;
        if p.mode == Mode::Interrupt && (p.interrupt_at == 0 || p.interrupt_at >= p.iterations) {
            return Err(ParamError {
                path: vec!["interrupt_at".into()],
                message: format!("must be in 1..{} to interrupt anything", p.iterations),
                unknown_key: false,
            });
        }
        if p.protocol == GuardProtocol::Strict && p.updates_per_iteration != 1 {
            return Err(ParamError {
                path: vec!["protocol".into()],
                message: format!(
                    "strict on-policy allows one update per rollout set, but updates_per_iteration is {}",
                    p.updates_per_iteration
                ),
                unknown_key: false,
            });
        }
        known_verifier(&p.verifier)?;
        if let Some(terms) = &p.reward {
            if p.verifier != crate::data::verifier::PROTOCOL_VERIFIER {
                return Err(ParamError {
                    path: vec!["verifier".into()],
                    message: "give either 'verifier' or 'reward' (a term `{name, verifier, weight}` names a verifier)"
                        .into(),
                    unknown_key: false,
                });
            }
            crate::reward::check_terms(terms).map_err(|(rest, message)| ParamError {
                path: std::iter::once("reward".to_string()).chain(rest).collect(),
                message,
                unknown_key: false,
            })?;
        }
        Ok(())
    }
    fn file_deps(&self, p: &Self::Params, spec_dir: &std::path::Path) -> Vec<String> {
        crate::reward::program_files(&p.reward_terms(), spec_dir)
    }
    fn interpreters(&self, p: &Self::Params) -> Vec<String> {
        crate::reward::program_interpreters(&p.reward_terms())
    }
    fn inputs(&self, params: &Self::Params) -> Option<Vec<InputDecl>> {
        let mode = params.mode;
        Some(mode_inputs(
            mode,
            vec![
                InputDecl::required("model", "the warm-start model folder (also the frozen reference)"),
                InputDecl::required("pages", "train pages (the prompts)"),
                InputDecl::required("labels", "train labels (the verifier's problems)"),
            ],
        ))
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        // The rollouts hold train prompts' token ids and no label, as the
        // model does: no taint.
        let rollouts = OutputDecl {
            kind: OutputKind::Dir,
            taint: Some(std::collections::BTreeSet::new()),
            ..OutputDecl::file(crate::guard::rollouts::OUTPUT)
        };
        train_outputs().into_iter().chain([rollouts]).collect()
    }
    fn numerical(&self) -> bool {
        true
    }
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Training
    }
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        super::worker::run_in_worker(WorkerTask::TrainGrpo(params.clone()), ctx)
    }
}

/// A `verifier` param must name a builtin verifier.
pub(super) fn known_verifier(name: &str) -> Result<(), ParamError> {
    let registry = crate::data::verifier::VerifierRegistry::builtin();
    match registry.get(name) {
        Some(_) => Ok(()),
        None => Err(ParamError {
            path: vec!["verifier".into()],
            message: format!(
                "no verifier '{name}'{} (see `orchestrate verifier list`)",
                crate::suggest::did_you_mean(name, registry.iter().map(|v| v.name()))
            ),
            unknown_key: false,
        }),
    }
}

/// `check.resume`: a continuous state and a resumed one must be identical,
/// tensor by tensor and field by field (wall-clock costs aside).
pub struct CheckResume;

/// Fields never compared: wall-clock measurements, and the rollout lineage
/// (which run consumed the rollouts: by design a continuous run and an
/// interrupted one replay the same rollout ids in lineages of their own).
pub const UNCOMPARED: [&str; 2] = ["costs", "lineage"];

impl Op for CheckResume {
    fn name(&self) -> &'static str {
        "check.resume"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "fails with the first difference between a continuous and a resumed training state"
    }
    type Params = EmptyParams;
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("continuous", "the continuous run's state"),
            InputDecl::required("resumed", "the resumed run's state"),
        ])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("report")]
    }
    fn run(&self, _params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        use crate::train::state::{first_difference_in_readers, StateReader};
        let failed = |e: crate::train::state::StateError| OpError::Failed(e.to_string());
        let continuous = StateReader::open(ctx.input_path("continuous")?).map_err(failed)?;
        let resumed = StateReader::open(ctx.input_path("resumed")?).map_err(failed)?;
        let tensors = continuous.heads().len();
        // The two states side by side, a block at a time (never both in memory).
        let difference = first_difference_in_readers(continuous, resumed, &UNCOMPARED).map_err(failed)?;
        let report = ResumeReport {
            identical: difference.is_none(),
            first_difference: difference.clone(),
            tensors,
            ignored_fields: UNCOMPARED.iter().map(|f| f.to_string()).collect(),
        };
        let text = serde_json::to_string_pretty(&report).map_err(|e| OpError::Failed(e.to_string()))? + "\n";
        ctx.write_output("report", text)?;
        match difference {
            None => Ok(()),
            Some(d) => Err(OpError::Failed(format!("resumed state differs from continuous: {d}"))),
        }
    }
}

/// What `check.resume` writes as `report` (gates read `report.identical`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeReport {
    // In the order the report has always been written (sorted), so the bytes stay the same.
    /// The first field or tensor that differs, named.
    #[serde(deserialize_with = "crate::canonical::required")]
    pub first_difference: Option<String>,
    pub identical: bool,
    /// Fields never compared (wall-clock costs, the rollout lineage).
    pub ignored_fields: Vec<String>,
    /// How many tensors were compared.
    pub tensors: usize,
}

/// Params of ops that take none.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyParams {}

/// `replay.json`: what a paired gradient replay measured (written by the
/// worker, read by whoever audits a fault's effect). Its fields in name order,
/// so the file is the one the untyped writer wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayReport {
    pub clean: LossStats,
    pub faults: Vec<ReplayFault>,
    pub note: String,
    pub rewards: ReplayRewards,
    /// Rollouts generated (prompts × group size).
    pub rollouts: usize,
}

impl ReplayReport {
    pub const NOTE: &'static str = "gradients of the GRPO loss (clipped surrogate + beta x exact prefix KL) at the same weights, before clipping; no parameter changes";
}

/// Where a replay's rewards came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplayRewards {
    #[serde(rename = "constructed (1, 0, 1, 0, ... per group), not the verifier's")]
    Constructed,
    #[serde(rename = "verifier")]
    Verifier,
}

/// One fault's batch beside the clean one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayFault {
    pub family: FaultFamily,
    pub faulty: LossStats,
    pub gradient: GradientComparison,
    /// The guard's reason codes for the faulty batch.
    pub guard_codes: std::collections::BTreeSet<String>,
    /// The faulty batch's loss minus the clean one's.
    pub loss_change: f64,
}

/// What one backward pass of the GRPO loss measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossStats {
    pub clip_fraction: f64,
    pub kl: f64,
    pub loss: f64,
    /// Mean and largest ρ = exp(logp − logp_old) over response tokens.
    pub ratio_max: f64,
    pub ratio_mean: f64,
    pub surrogate: f64,
}

/// Two flat gradients compared: cosine similarity and relative L2 difference,
/// each undefined (never 0 or 1) where a norm is about zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GradientComparison {
    pub clean_norm: f64,
    pub cosine: NearZero,
    pub faulty_norm: f64,
    pub relative_l2: NearZero,
}

/// A ratio over a norm: its value, or `undefined_near_zero` when the norm is ≈ 0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NearZero {
    Value(f64),
    Undefined(Undefined),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Undefined {
    UndefinedNearZero,
}

/// Params of `replay`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayParams {
    /// The fault families to compare against the clean batch.
    pub faults: Vec<FaultFamily>,
    /// F4's mask shift.
    #[serde(default)]
    pub shift: Option<usize>,
    #[serde(default = "d_group")]
    pub group_size: usize,
    #[serde(default = "d_group")]
    pub prompts: usize,
    #[serde(default = "d_response_tokens")]
    pub max_new_tokens: usize,
    #[serde(default = "d_clip")]
    pub clip_eps: f64,
    #[serde(default = "d_beta")]
    pub beta: f64,
    #[serde(default = "d_block")]
    pub kl_block: i64,
    #[serde(default)]
    pub seed: u64,
    /// Use constructed rewards (1, 0, 1, 0, … in each group, labelled as such)
    /// instead of the verifier's, so that a model that never succeeds still has
    /// a reward gradient to compare.
    #[serde(default)]
    pub constructed_rewards: bool,
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
    /// Prompts longer than this many tokens are refused (as in `train.grpo`).
    #[serde(default = "d_prompt_tokens")]
    pub max_prompt_tokens: usize,
    /// The verifier that scores the responses (`orchestrate verifier list`).
    #[serde(default = "d_verifier")]
    pub verifier: String,
}

/// `replay`: clean and faulty update batches from the same frozen rollouts at the
/// same weights, and how their gradients differ.
pub struct Replay;

impl Op for Replay {
    fn name(&self) -> &'static str {
        WorkerOp::Replay.name()
    }
    fn version(&self) -> u32 {
        // 2: logits at the response positions only (other float rounding).
        2
    }
    fn summary(&self) -> &'static str {
        "paired gradient replay: clean vs faulty batch at the same weights (cosine, relative L2, norms, ratios)"
    }
    type Params = ReplayParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        super::check_prompt_template(&p.prompt_template)?;
        check_ranges(&[
            ("group_size", p.group_size as f64, Range::AtLeastOne),
            ("prompts", p.prompts as f64, Range::AtLeastOne),
            ("max_new_tokens", p.max_new_tokens as f64, Range::AtLeastOne),
            ("max_prompt_tokens", p.max_prompt_tokens as f64, Range::AtLeastOne),
            ("clip_eps", p.clip_eps, Range::OpenUnit),
            ("beta", p.beta, Range::NonNegative),
        ])?;
        known_verifier(&p.verifier)
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("model", "the policy (also the reference)"),
            InputDecl::required("pages", "train pages"),
            InputDecl::required("labels", "train labels (the verifier's problems)"),
        ])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl { taint: Some(std::collections::BTreeSet::new()), ..OutputDecl::file("replay.json") }]
    }
    fn numerical(&self) -> bool {
        true
    }
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Training
    }
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        super::worker::run_in_worker(WorkerTask::Replay(params.clone()), ctx)
    }
}

#[cfg(test)]
mod resume_report_tests {
    use super::ResumeReport;

    #[test]
    fn the_committed_resume_reports_read_and_a_missing_field_is_an_error() {
        use crate::example_packs::{outputs, VERSIONS};
        for (version, check) in
            VERSIONS.iter().flat_map(|v| ["warmstart-check", "sft-check", "grpo-check"].map(|c| (*v, c)))
        {
            let path = outputs(version).join(check).join("report");
            let r: ResumeReport = crate::canonical::read_typed(&path).unwrap();
            assert!(r.identical && r.first_difference.is_none() && r.tensors > 0, "{check}: {r:?}");
            // Written as before, byte for byte: cached reports stay valid.
            let written = serde_json::to_string_pretty(&r).unwrap() + "\n";
            assert_eq!(written, std::fs::read_to_string(&path).unwrap(), "{check}");
        }
        let err = serde_json::from_str::<ResumeReport>(r#"{"identical": true, "tensors": 3, "ignored_fields": []}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("first_difference"), "{err}");
    }
}

//! One GRPO update: the policy (with gradients) and the frozen reference
//! (without) on the same sequences, the clipped surrogate against the old
//! (behavior) log-probs, plus β × the exact prefix KL, reduced tokens →
//! responses → prompts, then gradient clipping and an AdamW step.

use std::collections::BTreeMap;

use crate::error::{bail, Result};
use tch::{Kind, Tensor};

use orchestrate_core::guard::{TokenArtifacts, UpdateBatch};

use super::adamw::{clip_grad_norm, zero_grad, AdamW};
use super::objective::{clipped_surrogate, exact_kl, reduce_tokens_responses_prompts};
use crate::decoder::CausalLm;
use crate::generate::response_logits;

/// A rollout set ready for updates: rows in group order, `group_size` per prompt.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RolloutBatch {
    pub prompts: Vec<Vec<i64>>,
    pub responses: Vec<Vec<i64>>,
    /// Behavior log-probs captured at sampling time: never recomputed.
    pub old_logprobs: Vec<Vec<f32>>,
    pub advantages: Vec<f64>,
    pub group_size: usize,
}

impl RolloutBatch {
    /// The update batch rebuilt from stored artifacts (the ids the store holds,
    /// with the span the mask selects), never from text.
    pub fn from_artifacts(rollouts: &[TokenArtifacts], advantages: Vec<f64>, group_size: usize) -> RolloutBatch {
        let mut prompts = Vec::new();
        let mut responses = Vec::new();
        let mut old = Vec::new();
        for a in rollouts {
            let full: Vec<i64> = a.prompt_ids.iter().chain(&a.response_ids).copied().collect();
            let start = a.mask_start.min(full.len().saturating_sub(1)).max(1);
            let end = (start + a.mask_len).min(full.len());
            prompts.push(full[..start].to_vec());
            responses.push(full[start..end].to_vec());
            let mut o = a.old_logprobs.clone();
            o.resize(end - start, 0.0);
            old.push(o);
        }
        RolloutBatch { prompts, responses, old_logprobs: old, advantages, group_size }
    }
}

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct GrpoHyper {
    pub clip_eps: f64,
    pub beta: f64,
    pub kl_block: i64,
    pub max_grad_norm: f64,
    /// Groups per forward/backward pass, the gradients accumulated over the
    /// batch; 0: the whole batch in one pass.
    #[serde(default)]
    pub micro_groups: usize,
}

impl GrpoHyper {
    /// A run's update settings, from its params.
    pub fn of(p: &orchestrate_core::train::params::GrpoParams) -> GrpoHyper {
        GrpoHyper {
            clip_eps: p.clip_eps,
            beta: p.beta,
            kl_block: p.kl_block,
            max_grad_norm: p.max_grad_norm,
            micro_groups: p.micro_batch_groups.unwrap_or(0),
        }
    }
}

/// What one update measured (the metrics' own type).
pub use orchestrate_core::train::metrics::UpdateStats;

/// The largest gap between captured behavior log-probs and a full teacher-forced
/// re-scoring of the same sequences by `policy`. Before the first update of an
/// iteration it must be within tolerance, or old log-probs are misbound.
pub fn behavior_gap(
    policy: &CausalLm,
    prompts: &[Vec<i64>],
    responses: &[Vec<i64>],
    behavior: &[Vec<f32>],
) -> Result<f64> {
    let rescored = crate::generate::score(policy, prompts, responses)?;
    let mut gap = 0f64;
    for (b, r) in behavior.iter().zip(&rescored) {
        if b.len() != r.len() {
            return Ok(f64::INFINITY);
        }
        for (x, y) in b.iter().zip(r) {
            gap = gap.max(f64::from((x - y).abs()));
        }
    }
    Ok(gap)
}

/// What one backward pass of the GRPO loss measured (shared with the replay's report).
pub use orchestrate_core::ops::LossStats;

/// The GRPO loss of `batch` for `policy`, backpropagated: after this, each
/// parameter's `.grad()` holds its gradient (nothing is clipped or stepped).
pub fn grpo_gradients(
    policy: &CausalLm,
    reference: &CausalLm,
    params: &BTreeMap<String, Tensor>,
    batch: &RolloutBatch,
    hyper: &GrpoHyper,
) -> Result<LossStats> {
    let rows = batch.prompts.len();
    if rows == 0
        || !rows.is_multiple_of(batch.group_size)
        || batch.responses.len() != rows
        || batch.old_logprobs.len() != rows
    {
        bail!(
            "a rollout batch needs whole groups of {} with one response and old log-probs per prompt",
            batch.group_size
        );
    }
    let g = batch.group_size;
    let groups = rows / g;
    let per_pass = if hyper.micro_groups == 0 { groups } else { hyper.micro_groups.min(groups) };
    zero_grad(params);
    let mut sums = PassStats::default();
    let mut start = 0;
    while start < groups {
        let n = per_pass.min(groups - start);
        let part = (start * g)..((start + n) * g);
        let sub = RolloutBatch {
            prompts: batch.prompts[part.clone()].to_vec(),
            responses: batch.responses[part.clone()].to_vec(),
            old_logprobs: batch.old_logprobs[part.clone()].to_vec(),
            advantages: batch.advantages[part].to_vec(),
            group_size: g,
        };
        // Each pass's loss is its groups' mean; weighted by its share of the groups,
        // the accumulated gradient is the whole batch's.
        let weight = if n == groups { None } else { Some(n as f64 / groups as f64) };
        sums.add(&pass(policy, reference, &sub, hyper, weight)?);
        start += n;
    }
    let tokens = sums.tokens.max(1.0);
    Ok(LossStats {
        loss: sums.loss,
        surrogate: sums.surrogate,
        kl: sums.kl,
        clip_fraction: sums.clipped / tokens,
        ratio_mean: sums.ratio_sum / tokens,
        ratio_max: sums.ratio_max,
    })
}

/// What one forward/backward pass adds up (losses already weighted by its share).
#[derive(Default)]
struct PassStats {
    loss: f64,
    surrogate: f64,
    kl: f64,
    clipped: f64,
    tokens: f64,
    ratio_sum: f64,
    ratio_max: f64,
}

impl PassStats {
    fn add(&mut self, o: &PassStats) {
        self.loss += o.loss;
        self.surrogate += o.surrogate;
        self.kl += o.kl;
        self.clipped += o.clipped;
        self.tokens += o.tokens;
        self.ratio_sum += o.ratio_sum;
        self.ratio_max = self.ratio_max.max(o.ratio_max);
    }
}

/// One forward/backward pass over whole groups: the loss is their mean, times
/// `weight` (their share of the batch) when the batch takes several passes.
fn pass(
    policy: &CausalLm,
    reference: &CausalLm,
    batch: &RolloutBatch,
    hyper: &GrpoHyper,
    weight: Option<f64>,
) -> Result<PassStats> {
    let rows = batch.prompts.len();
    let device = policy.device();
    let (logits, targets, mask) = response_logits(policy, &batch.prompts, &batch.responses);
    let (ref_logits, _, _) = tch::no_grad(|| response_logits(reference, &batch.prompts, &batch.responses));
    let logp_all = logits.log_softmax(-1, Kind::Float);
    let logp = logp_all.gather(2, &targets.unsqueeze(2), false).squeeze_dim(2);
    let t_max = targets.size()[1] as usize;
    let old: Vec<f32> = batch
        .old_logprobs
        .iter()
        .flat_map(|o| o.iter().copied().chain(std::iter::repeat_n(0.0, t_max - o.len())))
        .collect();
    let old = Tensor::from_slice(&old).view([rows as i64, t_max as i64]).to_device(device);
    let advantages = Tensor::from_slice(&batch.advantages).to_kind(Kind::Float).to_device(device);
    let (surrogate, clipped) = clipped_surrogate(&logp, &old, &advantages, hyper.clip_eps);
    let kl = exact_kl(&logits, &ref_logits, hyper.kl_block);
    let per_token = -&surrogate + &kl * hyper.beta;
    let g = batch.group_size as i64;
    let loss = reduce_tokens_responses_prompts(&per_token, &mask, g);
    let loss_value = loss.double_value(&[]);
    if !loss_value.is_finite() {
        bail!("non-finite GRPO loss");
    }
    let w = weight.unwrap_or(1.0);
    match weight {
        // One pass: the loss as it is (bit for bit what a single pass always did).
        None => loss.backward(),
        Some(w) => (loss * w).backward(),
    }
    tch::no_grad(|| {
        let ratio = (&logp - &old).exp() * &mask;
        Ok(PassStats {
            loss: loss_value * w,
            surrogate: reduce_tokens_responses_prompts(&surrogate, &mask, g).double_value(&[]) * w,
            kl: reduce_tokens_responses_prompts(&kl, &mask, g).double_value(&[]) * w,
            clipped: (clipped.to_kind(Kind::Float) * &mask).sum(Kind::Float).double_value(&[]),
            tokens: mask.sum(Kind::Float).double_value(&[]),
            ratio_sum: ratio.sum(Kind::Float).double_value(&[]),
            ratio_max: ratio.max().double_value(&[]),
        })
    })
}

/// One update of `policy`: the gradients, clipping, an AdamW step, on exactly
/// the rollouts of `batch`. This is the only way rollouts change parameters, and
/// it takes an [`UpdateBatch`]: the guard's handle spent on that batch, or the
/// explicit, logged `UpdateBatch::unguarded`. A batch built by hand does not
/// type-check here (see `orchestrate_core::guard::UpdateBatch`).
#[allow(clippy::too_many_arguments)]
pub fn grpo_update(
    policy: &CausalLm,
    reference: &CausalLm,
    params: &BTreeMap<String, Tensor>,
    adam: &mut AdamW,
    batch: &UpdateBatch,
    advantages: Vec<f64>,
    group_size: usize,
    hyper: &GrpoHyper,
    lr: f64,
) -> Result<UpdateStats> {
    if advantages.len() != batch.rollouts().len() {
        bail!("{} advantages for {} authorized rollouts", advantages.len(), batch.rollouts().len());
    }
    let rollouts = RolloutBatch::from_artifacts(batch.rollouts(), advantages, group_size);
    step(policy, reference, params, adam, &rollouts, hyper, lr)
}

/// The step itself, on a batch that is already tensors' worth of ids. Visible
/// only inside `train`, whose unit tests compare one step with PyTorch's on a
/// hand-built batch; everything else goes through [`grpo_update`].
pub(super) fn step(
    policy: &CausalLm,
    reference: &CausalLm,
    params: &BTreeMap<String, Tensor>,
    adam: &mut AdamW,
    batch: &RolloutBatch,
    hyper: &GrpoHyper,
    lr: f64,
) -> Result<UpdateStats> {
    let stats = grpo_gradients(policy, reference, params, batch, hyper)?;
    let grad_norm = clip_grad_norm(params, hyper.max_grad_norm);
    adam.step(params, lr);
    Ok(UpdateStats {
        loss: stats.loss,
        surrogate: stats.surrogate,
        kl: stats.kl,
        clip_fraction: stats.clip_fraction,
        grad_norm,
        lr,
    })
}

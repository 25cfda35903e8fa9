//! `replay`: one frozen rollout set, one set of weights, the clean update batch
//! and each faulty one, and how their gradients compare. This is the evidence
//! that a fault like F2 can barely move the loss while the guard still rejects
//! it on identity.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Result;
use orchestrate_core::data::verifier::VerifierRegistry;
use orchestrate_core::guard::{
    validate, Envelope, EventKind, EventRef, GuardContext, ProtocolMode, RewardRef, TokenArtifacts,
};
use orchestrate_core::ops::worker::WorkerJob;
use orchestrate_core::ops::{
    FaultFamily, FaultSpec, GradientComparison, LossStats, NearZero, ReplayFault, ReplayParams, ReplayReport,
    ReplayRewards, Undefined,
};
use tch::{Kind, Tensor};

use super::adamw::digest;
use super::common::{examples, input_path, load_model, load_reference, params as params_of, rl_pool, Prompter};
use super::guarded::{inject, prompt_registry, reward_of, Recorded, VERIFIER_ALIAS};
use super::objective::group_advantages;
use super::update::{grpo_gradients, GrpoHyper, RolloutBatch};
use crate::generate::{generate, pick_device, Sampling};

/// Below this norm a gradient is treated as zero.
pub const NEAR_ZERO: f64 = 1e-12;

/// Compares two flat gradients: cosine similarity and relative L2 difference,
/// or `undefined_near_zero` (with the norms) when either norm is ≈ 0; never 0 or 1.
pub fn compare(clean: &[f64], faulty: &[f64]) -> GradientComparison {
    let dot: f64 = clean.iter().zip(faulty).map(|(a, b)| a * b).sum();
    let nc = clean.iter().map(|a| a * a).sum::<f64>().sqrt();
    let nf = faulty.iter().map(|a| a * a).sum::<f64>().sqrt();
    let diff = clean.iter().zip(faulty).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
    let undefined = NearZero::Undefined(Undefined::UndefinedNearZero);
    let over = |x: f64, norm: f64| if norm < NEAR_ZERO { undefined } else { NearZero::Value(x / norm) };
    let cosine = if nc < NEAR_ZERO || nf < NEAR_ZERO { undefined } else { NearZero::Value(dot / (nc * nf)) };
    GradientComparison { clean_norm: nc, cosine, faulty_norm: nf, relative_l2: over(diff, nc) }
}

/// Every parameter's gradient, flattened in name order (zeros where none).
fn flat_grads(params: &BTreeMap<String, Tensor>) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for p in params.values() {
        let g = p.grad();
        if g.defined() {
            out.extend(Vec::<f64>::try_from(&g.to_kind(Kind::Double).view([-1]))?);
        } else {
            out.extend(std::iter::repeat_n(0.0, p.numel()));
        }
    }
    Ok(out)
}

pub fn run(job: &WorkerJob, p: ReplayParams) -> Result<()> {
    let device = pick_device()?;
    let model_dir = input_path(job, "model")?;
    let (policy, tokenizer) = load_model(model_dir, device)?;
    let prompter = Prompter::new(model_dir, p.chat_template, &p.system, p.prompt_template.as_deref())?;
    let reference = load_reference(model_dir, device)?;
    let params = params_of(&policy);
    let reference_digest = digest(&params_of(&reference));
    let verifier = VerifierRegistry::builtin()
        .get(&p.verifier)
        .cloned()
        .ok_or_else(|| crate::error::err!("no verifier {} (see `orchestrate verifier list`)", p.verifier))?;
    let stops = tokenizer.stop_ids();
    let mut pool = rl_pool(examples(job, "pages", "labels")?, "labels")?;
    pool.truncate(p.prompts);
    let prompts: Vec<Vec<i64>> = pool
        .iter()
        .map(|e| prompter.ids(&tokenizer, &e.statement, p.max_prompt_tokens, &e.id))
        .collect::<Result<_>>()?;
    let batch_prompts: Vec<Vec<i64>> =
        prompts.iter().flat_map(|x| std::iter::repeat_n(x.clone(), p.group_size)).collect();
    let rollout_ids: Vec<u64> = (0..batch_prompts.len() as u64).collect();
    let generated = generate(
        &policy,
        &batch_prompts,
        p.max_new_tokens,
        &stops,
        &Sampling::Sample { seed: p.seed, rollout_ids },
        true,
    )?;
    let mut rewards = Vec::new();
    for (row, g) in generated.iter().enumerate() {
        if p.constructed_rewards {
            rewards.push((row % p.group_size).is_multiple_of(2) as u8 as f64);
            continue;
        }
        let example = &pool[row / p.group_size];
        rewards.push(reward_of(verifier.as_ref(), &tokenizer, &example.label.problem, g)?);
    }
    let advantages: Vec<f64> = rewards.chunks(p.group_size).flat_map(group_advantages).collect();
    let policy_digest = digest(&params);
    let tokenizer_hash = blake3::hash(&std::fs::read(model_dir.join("tokenizer.json"))?).to_hex().to_string();
    let record = || -> (Vec<Recorded>, BTreeMap<String, TokenArtifacts>) {
        let mut store = BTreeMap::new();
        let recorded = generated
            .iter()
            .enumerate()
            .map(|(row, g)| {
                let artifacts = TokenArtifacts {
                    prompt_ids: batch_prompts[row].clone(),
                    response_ids: g.ids.clone(),
                    old_logprobs: g.behavior_logprobs.clone(),
                    mask_start: batch_prompts[row].len(),
                    mask_len: g.ids.len(),
                };
                store.insert(artifacts.hash(), artifacts.clone());
                let envelope = Envelope {
                    rollout_id: row as u64,
                    prompt_id: pool[row / p.group_size].id.clone(),
                    split: orchestrate_core::data::Split::Train,
                    artifacts_hash: artifacts.hash(),
                    tokenizer_hash: tokenizer_hash.clone(),
                    behavior_policy_version: 0,
                    behavior_policy_digest: policy_digest.clone(),
                    scorer_policy_digest: policy_digest.clone(),
                    off_policy_correction: true,
                    reward: RewardRef {
                        verifier: verifier.name().to_string(),
                        protocol_hash: verifier.protocol_hash(),
                    },
                    events: vec![
                        EventRef { kind: EventKind::Generation, seq: 1, policy_version: 0 },
                        EventRef { kind: EventKind::Scoring, seq: 2, policy_version: 0 },
                        EventRef { kind: EventKind::Reward, seq: 3, policy_version: 0 },
                    ],
                };
                Recorded { envelope, artifacts }
            })
            .collect();
        (recorded, store)
    };
    let hyper = GrpoHyper {
        clip_eps: p.clip_eps,
        beta: p.beta,
        kl_block: p.kl_block,
        max_grad_norm: f64::INFINITY,
        micro_groups: 0,
    };
    let gradient_of = |rollouts: &[TokenArtifacts]| -> Result<(Vec<f64>, LossStats)> {
        let batch = RolloutBatch::from_artifacts(rollouts, advantages.clone(), p.group_size);
        let stats = grpo_gradients(&policy, &reference, &params, &batch, &hyper)?;
        Ok((flat_grads(&params)?, stats))
    };
    let (clean_recorded, clean_store) = record();
    let clean_rollouts: Vec<TokenArtifacts> =
        clean_recorded.iter().map(|r| clean_store[&r.envelope.artifacts_hash].clone()).collect();
    let (clean_grad, clean_stats) = gradient_of(&clean_rollouts)?;
    let verifiers = VerifierRegistry::builtin();
    let aliases: BTreeMap<String, String> = [(VERIFIER_ALIAS.to_string(), verifier.name().to_string())].into();
    let registry = prompt_registry(&pool.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), &prompts);
    let mut results = Vec::new();
    for family in &p.faults {
        let (mut recorded, mut store) = record();
        let spec = FaultSpec { family: *family, at_iteration: 0, shift: p.shift };
        inject(&[&spec], &mut recorded, &mut store, &tokenizer, &reference_digest)?;
        let rollouts: Vec<TokenArtifacts> = recorded
            .iter()
            .map(|r| store.get(&r.envelope.artifacts_hash).cloned().unwrap_or_else(|| r.artifacts.clone()))
            .collect();
        let (faulty_grad, faulty_stats) = gradient_of(&rollouts)?;
        let ctx = GuardContext {
            mode: ProtocolMode::BoundedOffPolicy { max_lag: 1 },
            trainer_policy_version: if *family == FaultFamily::F1 { 2 } else { 0 },
            tokenizer_hash: tokenizer_hash.clone(),
            artifacts: &store,
            trainable_splits: BTreeSet::from([orchestrate_core::data::Split::Train]),
            prompt_registry: &registry,
            verifiers: &verifiers,
            verifier_aliases: &aliases,
            canary: None,
        };
        let codes: BTreeSet<String> =
            recorded.iter().flat_map(|r| validate(&r.envelope, &ctx).codes.into_iter().map(|c| c.id())).collect();
        results.push(ReplayFault {
            family: *family,
            gradient: compare(&clean_grad, &faulty_grad),
            loss_change: faulty_stats.loss - clean_stats.loss,
            faulty: faulty_stats,
            guard_codes: codes,
        });
    }
    let report = ReplayReport {
        rewards: if p.constructed_rewards { ReplayRewards::Constructed } else { ReplayRewards::Verifier },
        rollouts: generated.len(),
        clean: clean_stats,
        faults: results,
        note: ReplayReport::NOTE.to_string(),
    };
    orchestrate_core::store::fsx::write_file(
        &job.staging.join("replay.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of a comparison, or a panic naming it undefined.
    fn value(x: NearZero) -> f64 {
        match x {
            NearZero::Value(v) => v,
            NearZero::Undefined(_) => panic!("undefined"),
        }
    }

    #[test]
    fn identical_gradients_have_cosine_one_and_no_difference() {
        let g = vec![0.5, -1.0, 2.0];
        let c = compare(&g, &g);
        assert!((value(c.cosine) - 1.0).abs() < 1e-12);
        assert_eq!(value(c.relative_l2), 0.0);
    }

    #[test]
    fn a_zero_gradient_is_undefined_near_zero_never_zero_or_one() {
        let undefined = NearZero::Undefined(Undefined::UndefinedNearZero);
        let c = compare(&[0.0, 0.0], &[1.0, 2.0]);
        assert_eq!((c.cosine, c.relative_l2, c.clean_norm), (undefined, undefined, 0.0));
        let written = serde_json::to_value(&c).unwrap();
        assert_eq!(written["cosine"], "undefined_near_zero", "as the report writes it");
        let c = compare(&[1.0, 0.0], &[0.0, 0.0]);
        assert_eq!(c.cosine, undefined);
        assert_eq!(value(c.relative_l2), 1.0);
    }

    #[test]
    fn opposite_gradients_are_minus_one() {
        let c = compare(&[1.0, 2.0], &[-1.0, -2.0]);
        assert!((value(c.cosine) + 1.0).abs() < 1e-12);
        assert!((value(c.relative_l2) - 2.0).abs() < 1e-12);
    }
}

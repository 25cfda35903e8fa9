//! The guard inside the GRPO loop: a rollout engine with its own weights and
//! explicit syncs, an envelope per rollout, fault injection, and the
//! materialized batch the optimizer is allowed to use.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Result;
use orchestrate_core::guard::{content_hash, Envelope, EventKind, EventRef, RewardRef, TokenArtifacts};
use orchestrate_core::model::TextTokenizer;
use orchestrate_core::ops::{FaultFamily, FaultSpec};
use tch::Tensor;

use super::adamw::digest;
use crate::decoder::CausalLm;

/// The generation side: its own copy of the weights, changed only by `sync`,
/// which records the version and digest of what it actually loaded.
pub struct RolloutEngine {
    pub model: CausalLm,
    pub version: u64,
    pub digest: String,
}

impl RolloutEngine {
    pub fn new(model: CausalLm) -> Self {
        let digest = digest(&model.vs.variables().into_iter().collect());
        RolloutEngine { model, version: 0, digest }
    }

    /// Loads the trainer's current weights.
    pub fn sync(&mut self, trainer: &BTreeMap<String, Tensor>, version: u64) {
        let mine = self.model.vs.variables();
        tch::no_grad(|| {
            for (name, t) in trainer {
                mine[name].shallow_clone().copy_(t);
            }
        });
        self.version = version;
        self.digest = digest(&mine.into_iter().collect());
    }
}

/// The canary: the largest difference between the engine's and the trainer's
/// next-token logits on fixed prompts. Exactly 0 when the engine holds the
/// trainer's weights; above the baseline (recorded after the first sync) when
/// it serves something else.
pub fn canary_drift(engine: &CausalLm, trainer: &CausalLm, prompts: &[Vec<i64>]) -> f64 {
    use crate::decoder::attention_mask;
    use tch::{Kind, Tensor as T};
    tch::no_grad(|| {
        let mut worst = 0f64;
        for p in prompts {
            let n = p.len() as i64;
            let ids = T::from_slice(p).view([1, n]).to_device(trainer.device());
            let pos = T::arange(n, (Kind::Int64, trainer.device())).view([1, n]);
            let mask = attention_mask(&T::ones([1, n], (Kind::Int64, trainer.device())), n);
            let a = engine.forward_last(&ids, &pos, &mask, None);
            let b = trainer.forward_last(&ids, &pos, &mask, None);
            worst = worst.max((a - b).abs().max().double_value(&[]));
        }
        worst
    })
}

/// One rollout as the generation side recorded it.
pub struct Recorded {
    pub envelope: Envelope,
    pub artifacts: TokenArtifacts,
}

/// The faults active at an iteration.
pub fn active(faults: &[FaultSpec], iteration: usize) -> Vec<&FaultSpec> {
    faults.iter().filter(|f| f.at_iteration == iteration).collect()
}

/// An alias of the registered verifier (for F6).
pub const VERIFIER_ALIAS: &str = "stock_arithmetic";

/// Applies faults to the recorded rollouts and the store, as a buggy pipeline
/// would: each family corrupts what its real-world bug corrupts.
pub fn inject(
    faults: &[&FaultSpec],
    rollouts: &mut [Recorded],
    store: &mut BTreeMap<String, TokenArtifacts>,
    tokenizer: &TextTokenizer,
    reference_digest: &str,
) -> Result<()> {
    let restamp = |r: &mut Recorded, store: &mut BTreeMap<String, TokenArtifacts>| {
        let h = r.artifacts.hash();
        store.insert(h.clone(), r.artifacts.clone());
        r.envelope.artifacts_hash = h;
    };
    for f in faults {
        for r in rollouts.iter_mut() {
            match f.family {
                // F1 acts on the sync itself (see the loop); nothing to corrupt here.
                FaultFamily::F1 => {}
                FaultFamily::F2 => {
                    // Old log-probs from another policy, one position off.
                    r.artifacts.old_logprobs.rotate_left(1);
                    // Bound to another scorer than the behavior policy (even when the
                    // reference happens to hold the same weights, as in a replay).
                    r.envelope.scorer_policy_digest = format!("{reference_digest}@another-scorer");
                    restamp(r, store);
                }
                FaultFamily::F3 => {
                    // The update sees re-encoded text, not the sampled ids; the
                    // envelope still points at what was sampled.
                    let text = tokenizer.decode(&r.artifacts.response_ids)?.text;
                    let mut again = r.artifacts.clone();
                    again.response_ids = tokenizer.encode(&text)?;
                    if again.response_ids == r.artifacts.response_ids {
                        // Re-encoding was lossless here: the bug would still re-encode (a BPE
                        // may merge differently); model it by re-encoding with a leading space.
                        again.response_ids = tokenizer.encode(&format!(" {text}"))?;
                    }
                    again.mask_len = again.response_ids.len();
                    store.insert(r.envelope.artifacts_hash.clone(), again);
                }
                FaultFamily::F4 => {
                    let k = f.shift.unwrap_or(1).min(r.artifacts.mask_start);
                    r.artifacts.mask_start -= k;
                    restamp(r, store);
                }
                FaultFamily::F5 => r.envelope.split = orchestrate_core::data::Split::Test,
                FaultFamily::F6 => r.envelope.reward.verifier = VERIFIER_ALIAS.to_string(),
                FaultFamily::F7 => {
                    // Scoring logged after an update of the trainer.
                    let v = r.envelope.events[0].policy_version;
                    r.envelope.events.retain(|e| e.kind != EventKind::Scoring);
                    r.envelope.events.push(EventRef { kind: EventKind::Update, seq: 10, policy_version: v });
                    r.envelope.events.push(EventRef { kind: EventKind::Scoring, seq: 11, policy_version: v + 1 });
                }
                FaultFamily::F8 => {
                    // The stored artifact is edited after it was recorded.
                    if let Some(a) = store.get_mut(&r.envelope.artifacts_hash) {
                        if let Some(t) = a.response_ids.first_mut() {
                            *t = (*t + 1) % i64::from(tokenizer.vocab_size().max(2));
                        }
                    }
                }
                FaultFamily::F9 => {
                    r.envelope.reward = RewardRef { verifier: "unregistered_v0".into(), protocol_hash: "0".repeat(64) }
                }
                FaultFamily::F10 => {
                    // Another prompt's content under the same id.
                    if let Some(t) = r.artifacts.prompt_ids.iter_mut().rev().nth(2) {
                        *t = (*t + 1) % i64::from(tokenizer.vocab_size().max(2));
                    }
                    r.artifacts.mask_start = r.artifacts.prompt_ids.len();
                    restamp(r, store);
                }
            }
        }
    }
    Ok(())
}

/// Frozen content hashes of the prompts a run may use, by id.
pub fn prompt_registry(ids: &[String], prompts: &[Vec<i64>]) -> BTreeMap<String, String> {
    ids.iter().cloned().zip(prompts.iter().map(|p| content_hash(p))).collect()
}

/// Distinct codes of a rejection, sorted.
pub fn codes_of(refused: &[(u64, orchestrate_core::guard::Verdict)]) -> Vec<String> {
    let set: BTreeSet<String> = refused.iter().flat_map(|(_, v)| v.codes.iter().map(|c| c.id())).collect();
    set.into_iter().collect()
}

/// The verifier's reward for one generated response (decoded without its EOS
/// token; undecodable ids make the tokenization invalid).
pub fn reward_of(
    verifier: &dyn orchestrate_core::data::verifier::Verifier,
    tokenizer: &TextTokenizer,
    problem: &serde_json::Value,
    g: &crate::generate::Generated,
) -> Result<f64> {
    use orchestrate_core::data::verifier::{FinishReason, Response};
    let body = if g.finish == FinishReason::Eos { &g.ids[..g.ids.len() - 1] } else { &g.ids[..] };
    let decoded = tokenizer.decode(body)?;
    let verdict = verifier.verify(
        problem,
        &Response { text: &decoded.text, finish: g.finish, tokenization_valid: decoded.undecodable.is_empty() },
    )?;
    Ok(f64::from(verdict.reward))
}

/// What a reward's terms see of one generated response: the problem's label,
/// the text decoded without its final end-of-sequence token, how it ended and
/// whether every id decoded.
pub fn reward_request(
    tokenizer: &TextTokenizer,
    example: &super::common::Example,
    row: u64,
    g: &crate::generate::Generated,
) -> Result<orchestrate_core::reward::RewardRequest> {
    use orchestrate_core::data::verifier::FinishReason;
    let body = if g.finish == FinishReason::Eos { &g.ids[..g.ids.len() - 1] } else { &g.ids[..] };
    let decoded = tokenizer.decode(body)?;
    Ok(orchestrate_core::reward::RewardRequest {
        id: example.id.clone(),
        row,
        label: example.label.clone(),
        response: decoded.text,
        finish: g.finish,
        tokenization_valid: decoded.undecodable.is_empty(),
    })
}

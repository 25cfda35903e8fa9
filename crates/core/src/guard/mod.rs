//! The trajectory guard's core (shared/seeds/000): envelopes that reference a
//! rollout's artifacts by hash, reason-coded validation, and the single-use
//! [`ValidatedBatchHandle`] that only [`materialize`] can mint, bound to the
//! batch hash, the policy digest and a nonce recorded exactly once in SQLite.
//!
//! Not yet wired into `train.grpo` (see docs/guard.md for what is and is not done).

pub mod codes;
pub mod events;
pub mod ledger;
pub mod rollouts;
pub mod served;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use codes::{Code, Decision};

use crate::canonical::canonical_json;
use crate::data::verifier::VerifierRegistry;
use crate::data::Split;
use crate::store::StoreError;
pub use ledger::Ledger;

/// The token artifacts of one rollout, as the generation side stored them.
/// The update path consumes these ids, never text: giving it text does not compile.
///
/// ```compile_fail,E0308
/// let a = orchestrate_core::guard::TokenArtifacts {
///     prompt_ids: vec![1, 2],
///     response_ids: "{\"final_stock\": 6}".to_string(), // text, not token ids
///     old_logprobs: vec![],
///     mask_start: 2,
///     mask_len: 1,
/// };
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenArtifacts {
    pub prompt_ids: Vec<i64>,
    pub response_ids: Vec<i64>,
    pub old_logprobs: Vec<f32>,
    /// The completion mask as a span of the full sequence (prompt + response).
    pub mask_start: usize,
    pub mask_len: usize,
}

impl TokenArtifacts {
    /// The canonical bytes: what the store holds, and what the hash covers.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let v = serde_json::to_value(self).expect("artifacts serialize");
        canonical_json(&v).into_bytes()
    }

    /// blake3 of the canonical bytes (equal to the store's object hash).
    pub fn hash(&self) -> String {
        blake3::hash(&self.canonical_bytes()).to_hex().to_string()
    }
}

/// Hash of a prompt's token content (the frozen registry holds these per prompt id).
pub fn content_hash(prompt_ids: &[i64]) -> String {
    blake3::hash(serde_json::to_string(prompt_ids).unwrap_or_default().as_bytes()).to_hex().to_string()
}

/// The kinds of events in a rollout's lineage, in their required order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Generation,
    Scoring,
    Reward,
    Update,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRef {
    pub kind: EventKind,
    pub seq: u64,
    /// The trainer's policy version when the event happened.
    pub policy_version: u64,
}

/// The reward a rollout received, by verifier identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardRef {
    pub verifier: String,
    pub protocol_hash: String,
}

/// A pre-update envelope: references (hashes) only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub rollout_id: u64,
    pub prompt_id: String,
    pub split: Split,
    pub artifacts_hash: String,
    pub tokenizer_hash: String,
    pub behavior_policy_version: u64,
    pub behavior_policy_digest: String,
    /// The policy that computed the old log-probs.
    pub scorer_policy_digest: String,
    pub off_policy_correction: bool,
    pub reward: RewardRef,
    pub events: Vec<EventRef>,
}

/// How strictly rollouts must be on-policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ProtocolMode {
    StrictOnPolicy,
    /// Rollouts may lag by up to `max_lag` versions, with an off-policy correction.
    BoundedOffPolicy {
        max_lag: u64,
    },
}

/// A canary comparison after a sync: token drift between the rollout engine's
/// and the trainer's greedy outputs, and the recorded baseline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Canary {
    pub drift: f64,
    pub baseline: f64,
}

/// What the validators check envelopes against.
pub struct GuardContext<'a> {
    pub mode: ProtocolMode,
    pub trainer_policy_version: u64,
    pub tokenizer_hash: String,
    /// Token artifacts by hash (the content-addressed store).
    pub artifacts: &'a BTreeMap<String, TokenArtifacts>,
    /// Splits an update may use.
    pub trainable_splits: BTreeSet<Split>,
    /// Frozen prompt content hashes by prompt id.
    pub prompt_registry: &'a BTreeMap<String, String>,
    pub verifiers: &'a VerifierRegistry,
    /// Names that are aliases of registered verifiers (name → verifier).
    pub verifier_aliases: &'a BTreeMap<String, String>,
    pub canary: Option<Canary>,
}

/// A validation result: the decision and every code that applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub decision: Decision,
    pub codes: Vec<Code>,
}

/// Validates one envelope. The decision is the strictest any code forces.
pub fn validate(env: &Envelope, ctx: &GuardContext<'_>) -> Verdict {
    let mut codes = BTreeSet::new();
    // Policy lineage.
    let lag = ctx.trainer_policy_version.saturating_sub(env.behavior_policy_version);
    let ahead = env.behavior_policy_version > ctx.trainer_policy_version;
    match ctx.mode {
        ProtocolMode::StrictOnPolicy => {
            if lag > 0 || ahead {
                codes.insert(Code::P004StalePolicyStrict);
            }
        }
        ProtocolMode::BoundedOffPolicy { max_lag } => {
            if lag > max_lag || ahead {
                codes.insert(Code::P005PolicyLagOverBound);
            } else if lag > 0 && !env.off_policy_correction {
                codes.insert(Code::P006MissingOffPolicyCorrection);
            }
        }
    }
    // Event order: generation, scoring, reward, and no update in between.
    let mut seen: Vec<&EventRef> = env.events.iter().collect();
    seen.sort_by_key(|e| e.seq);
    let kinds: Vec<EventKind> = seen.iter().map(|e| e.kind).collect();
    let lineage: Vec<EventKind> = kinds.iter().copied().filter(|k| *k != EventKind::Update).collect();
    if lineage != [EventKind::Generation, EventKind::Scoring, EventKind::Reward] {
        codes.insert(Code::P007EventOrderViolation);
    }
    let pos = |k: EventKind| kinds.iter().position(|x| *x == k);
    if let (Some(g), Some(s)) = (pos(EventKind::Generation), pos(EventKind::Scoring)) {
        let update_between = kinds[g.min(s)..g.max(s)].contains(&EventKind::Update);
        let versions_differ = seen[g].policy_version != seen[s].policy_version;
        if s < g || update_between || versions_differ {
            codes.insert(Code::L005ScoringAfterUpdate);
        }
    }
    if let Some(c) = ctx.canary {
        if c.drift > c.baseline {
            codes.insert(Code::P008CanaryMismatch);
        }
    }
    // Tokens and masks.
    if env.tokenizer_hash != ctx.tokenizer_hash {
        codes.insert(Code::T002TokenizerMismatch);
    }
    match ctx.artifacts.get(&env.artifacts_hash) {
        Some(a) if a.hash() == env.artifacts_hash => {
            let prompt_len = a.prompt_ids.len();
            let total = prompt_len + a.response_ids.len();
            if a.mask_start < prompt_len || a.mask_start + a.mask_len > total {
                codes.insert(Code::M002PromptSelected);
            }
            if a.mask_start != prompt_len
                || a.mask_len != a.response_ids.len()
                || a.old_logprobs.len() != a.response_ids.len()
            {
                codes.insert(Code::M004CanonicalMaskMismatch);
            }
            if ctx.prompt_registry.get(&env.prompt_id) != Some(&content_hash(&a.prompt_ids)) {
                codes.insert(Code::D004PromptContentMismatch);
            }
        }
        _ => {
            codes.insert(Code::T001ArtifactHashMismatch);
        }
    }
    if env.scorer_policy_digest != env.behavior_policy_digest {
        codes.insert(Code::L003ScorerPolicyMismatch);
    }
    if !ctx.trainable_splits.contains(&env.split) {
        codes.insert(Code::D003SplitOverlap);
    }
    // Reward identity.
    if ctx.verifier_aliases.contains_key(&env.reward.verifier) {
        codes.insert(Code::R006EvaluatorAlias);
    } else if !ctx.verifiers.is_registered(&env.reward.verifier, &env.reward.protocol_hash) {
        codes.insert(Code::R008RewardVerifierUnregistered);
    }
    let decision = codes.iter().map(|c| c.decision()).max().unwrap_or(Decision::Allow);
    Verdict { decision, codes: codes.into_iter().collect() }
}

/// The update tensors' source, rebuilt from stored artifacts (never from text).
/// Read-only outside this module: a batch cannot be edited after its handle was
/// minted for it, nor built by hand to match another batch's hash.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaterializedBatch {
    rollouts: Vec<TokenArtifacts>,
    batch_hash: String,
}

impl MaterializedBatch {
    pub fn rollouts(&self) -> &[TokenArtifacts] {
        &self.rollouts
    }
    pub fn batch_hash(&self) -> &str {
        &self.batch_hash
    }
}

/// Why an [`UpdateBatch`] may update parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Authority {
    /// Every envelope was validated, and the handle minted for this batch was spent.
    Validated { batch_hash: String, nonce: String },
    /// `guard: off`: nothing was validated; the guard log says so for this update.
    Unguarded,
}

/// The only thing the optimizer step accepts: rollouts with the authority to
/// update parameters. There are exactly two ways to get one, both here:
/// [`ValidatedBatchHandle::spend`] on the batch its handle was minted for, or
/// [`UpdateBatch::unguarded`], which first appends an `update_unguarded` event to
/// the guard's sealed log. It cannot be built or edited anywhere else:
///
/// ```compile_fail,E0451
/// let forged = orchestrate_core::guard::UpdateBatch {
///     rollouts: vec![],
///     authority: orchestrate_core::guard::Authority::Unguarded,
/// };
/// ```
///
/// and a materialized batch is not one (the handle must be spent on it):
///
/// ```compile_fail,E0308
/// fn step(batch: orchestrate_core::guard::MaterializedBatch) -> orchestrate_core::guard::UpdateBatch {
///     batch
/// }
/// ```
#[derive(Debug)]
pub struct UpdateBatch {
    rollouts: Vec<TokenArtifacts>,
    authority: Authority,
}

impl UpdateBatch {
    /// The explicit way around the guard (`guard: off`): records an
    /// `update_unguarded` event (lineage, producer `control`) for this
    /// iteration and update in the sealed log before handing out the batch, so
    /// every unvalidated step is on record. Fails, and hands out nothing, if the
    /// event cannot be recorded.
    pub fn unguarded(
        rollouts: Vec<TokenArtifacts>,
        ledger: &mut Ledger,
        lineage: &str,
        iteration: usize,
        update: usize,
    ) -> Result<Self, events::EventError> {
        let event = events::ControlEvent::UpdateUnguarded(events::Unguarded {
            iteration,
            update,
            guard: events::GuardOff::Off,
        });
        events::log(ledger, lineage, &events::GuardEvent::Control(event))?;
        Ok(UpdateBatch { rollouts, authority: Authority::Unguarded })
    }

    pub fn rollouts(&self) -> &[TokenArtifacts] {
        &self.rollouts
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

/// The guard-log event kind of an update made without validation.
pub const UNGUARDED_EVENT: &str = "update_unguarded";

mod sealed {
    /// Only this module can build one: the handle cannot be constructed elsewhere.
    #[derive(Debug)]
    pub struct Sealed(pub(super) ());
}

/// Permission to make exactly one optimizer step with exactly one batch. Only
/// [`materialize`] mints it, after every envelope was allowed; it is consumed
/// by value, and its nonce is recorded once in SQLite, so it can be used once,
/// across processes too. It cannot be built anywhere else:
///
/// ```compile_fail,E0451
/// let forged = orchestrate_core::guard::ValidatedBatchHandle {
///     batch_hash: String::new(),
///     policy_digest: String::new(),
///     nonce: String::new(),
/// };
/// ```
///
/// and a spent handle cannot be spent again:
///
/// ```compile_fail,E0382
/// use orchestrate_core::guard::{Ledger, MaterializedBatch, ValidatedBatchHandle};
/// fn twice(h: ValidatedBatchHandle, a: MaterializedBatch, b: MaterializedBatch, ledger: &mut Ledger) {
///     let _ = h.spend(a, ledger);
///     let _ = h.spend(b, ledger); // use of a moved value
/// }
/// ```
///
/// The names these examples use resolve, and the same steps done once and
/// with token ids compile: only what the examples do is refused (stable
/// rustdoc does not check a `compile_fail` example's error code).
///
/// ```
/// use orchestrate_core::guard::{Authority, Ledger, MaterializedBatch, TokenArtifacts, UpdateBatch, ValidatedBatchHandle};
/// fn spend_once(h: ValidatedBatchHandle, a: MaterializedBatch, ledger: &mut Ledger) -> Option<UpdateBatch> {
///     h.spend(a, ledger).ok()
/// }
/// let _ = TokenArtifacts { prompt_ids: vec![1, 2], response_ids: vec![3], old_logprobs: vec![], mask_start: 2, mask_len: 1 };
/// let _ = Authority::Unguarded;
/// ```
#[derive(Debug)]
pub struct ValidatedBatchHandle {
    batch_hash: String,
    policy_digest: String,
    nonce: String,
    _sealed: sealed::Sealed,
}

impl ValidatedBatchHandle {
    pub fn batch_hash(&self) -> &str {
        &self.batch_hash
    }
    pub fn policy_digest(&self) -> &str {
        &self.policy_digest
    }
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// Spends the handle on the batch it was minted for: marks its nonce used,
    /// exactly once, and returns what the optimizer step accepts. An error (a
    /// nonce already spent, or another batch than the handle's) means the step
    /// must not happen.
    pub fn spend(self, batch: MaterializedBatch, ledger: &mut Ledger) -> Result<UpdateBatch, GuardError> {
        if batch.batch_hash != self.batch_hash {
            return Err(GuardError::OtherBatch { handle: self.batch_hash, batch: batch.batch_hash });
        }
        if !ledger.consume_nonce(&self.nonce).map_err(GuardError::Store)? {
            return Err(GuardError::NonceSpent(self.nonce));
        }
        Ok(UpdateBatch {
            rollouts: batch.rollouts,
            authority: Authority::Validated { batch_hash: self.batch_hash, nonce: self.nonce },
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("batch rejected before backward: {}", .0.iter().map(|(id, v)| format!("rollout {id}: {:?} {}", v.decision, v.codes.iter().map(|c| c.id()).collect::<Vec<_>>().join(","))).collect::<Vec<_>>().join("; "))]
    Rejected(Vec<(u64, Verdict)>),
    #[error("nonce {0} was already spent: a validated batch updates parameters once")]
    NonceSpent(String),
    #[error("the handle was minted for batch {handle}, not for batch {batch}")]
    OtherBatch { handle: String, batch: String },
    #[error(transparent)]
    Store(StoreError),
}

/// What an update uses besides its rollouts, bound into its handle: an update
/// with other rewards, advantages, group layout or reference model than the
/// validated ones would not match its handle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpdateBinding {
    pub rewards: Vec<f64>,
    pub advantages: Vec<f64>,
    pub group_size: usize,
    /// The reference model's digest.
    pub reference: String,
}

/// What a batch hash covers.
#[derive(Serialize)]
struct Bound<'a> {
    rollouts: &'a [TokenArtifacts],
    binding: &'a UpdateBinding,
    policy: &'a str,
}

/// Validates every envelope and, only if all are allowed, rebuilds the batch
/// from stored artifacts and mints its single-use handle.
///
/// `binding` is everything else the update will use and the handle must be
/// bound to (rewards, advantages, group size, reference model identity): it
/// enters the batch hash, so an update with other rewards or another group
/// layout than the validated ones would not match its handle.
pub fn materialize(
    envelopes: &[Envelope],
    ctx: &GuardContext<'_>,
    policy_digest: &str,
    binding: &UpdateBinding,
    ledger: &mut Ledger,
) -> Result<(MaterializedBatch, ValidatedBatchHandle), GuardError> {
    let verdicts: Vec<(u64, Verdict)> = envelopes.iter().map(|e| (e.rollout_id, validate(e, ctx))).collect();
    let refused: Vec<(u64, Verdict)> = verdicts.into_iter().filter(|(_, v)| v.decision != Decision::Allow).collect();
    if !refused.is_empty() {
        return Err(GuardError::Rejected(refused));
    }
    let rollouts: Vec<TokenArtifacts> = envelopes.iter().map(|e| ctx.artifacts[&e.artifacts_hash].clone()).collect();
    let bound = Bound { rollouts: &rollouts, binding, policy: policy_digest };
    let bound = serde_json::to_value(&bound).expect("a batch's binding serializes");
    let batch_hash = blake3::hash(canonical_json(&bound).as_bytes()).to_hex().to_string();
    let nonce = format!("{}-{}", &batch_hash[..32], crate::store::objects::unique_suffix());
    ledger.register_nonce(&nonce, &batch_hash, policy_digest).map_err(GuardError::Store)?;
    let handle = ValidatedBatchHandle {
        batch_hash: batch_hash.clone(),
        policy_digest: policy_digest.to_string(),
        nonce,
        _sealed: sealed::Sealed(()),
    };
    Ok((MaterializedBatch { rollouts, batch_hash }, handle))
}

#[cfg(test)]
mod tests;

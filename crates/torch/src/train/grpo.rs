//! `train.grpo`: each iteration takes prompts in a seeded order, samples a group
//! per prompt at temperature 1, scores them with the verifier, checks the
//! captured behavior log-probs against full re-scoring, then makes the
//! configured number of updates against those old log-probs, with the exact
//! prefix KL to a frozen reference. No critic.
//!
//! The loop is a sequence of steps, each a function over what the run set up
//! ([`Setup`]) and where it stands ([`Position`]): [`sample`], [`score`],
//! [`envelope`] (what the generation side records, faults included),
//! [`validate`] (the guard, or the logged way around it), [`apply`] (one
//! optimizer step on what validation handed out) and [`record`] (the
//! iteration's history and its checkpoint).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Instant;

use orchestrate_core::data::verifier::{FinishReason, VerifierRegistry};
use orchestrate_core::guard::events::{
    BatchDecision, Committed, ControlEvent, EnvelopeDigests, Generation, GuardEvent, MaterializerEvent, PolicySync,
    Prepared, Reward, RolloutEngineEvent, UpdateRef, VerifierEvent,
};
use orchestrate_core::guard::rollouts;
use orchestrate_core::guard::{
    materialize, Canary, Decision, Envelope, EventKind, EventRef, GuardContext, GuardError, Ledger, ProtocolMode,
    RewardRef, TokenArtifacts, UpdateBatch, UpdateBinding,
};
use orchestrate_core::model::TextTokenizer;
use orchestrate_core::ops::worker::WorkerJob;
use orchestrate_core::ops::{FaultFamily, FaultSpec, GrpoParams, GuardProtocol, GuardSwitch, Mode};
use orchestrate_core::reward::{term_stats, RewardFunction, TermStats};
use orchestrate_core::train::metrics::{
    Cursor, Detection, EventLogSummary, FinishCounts, GrpoIdentity, GrpoIteration, GrpoMetrics, GuardSummary,
    IterationCosts, IterationGuard, NodeCosts, RunCosts, Scheduler, TrainingMetrics, TrainingSummary, UpdateStats,
};
use tch::Tensor;

use super::adamw::{digest, learning_rate, AdamW, AdamWConfig};
use super::common::{
    examples, input_path, load_model, load_reference, params, peak_rss_bytes, permutation, restore_state, rl_pool,
    write_outputs, Example, Prompter,
};
use super::guarded::{
    active, canary_drift, codes_of, inject, prompt_registry, reward_request, Recorded, RolloutEngine, VERIFIER_ALIAS,
};
use super::objective::group_advantages;
use super::update::{behavior_gap, grpo_update, GrpoHyper};
use super::wal::{failpoint, Wal};
use crate::decoder::CausalLm;
use crate::error::{bail, err, Error, Result};
use crate::generate::{generate, pick_device, Generated, Sampling};

/// Where a run stands, restored from a state file (a resume input or a WAL
/// checkpoint): weights and AdamW into `params` and `adam`, the rest returned.
/// A state of another kind or run is refused before its tensors are read.
fn restore_position(
    path: &std::path::Path,
    what: &str,
    identity: &GrpoIdentity,
    params: &BTreeMap<String, Tensor>,
    adam: &mut AdamW,
) -> Result<GrpoMetrics> {
    restore_state(path, what, params, adam, |m| match m {
        TrainingMetrics::Grpo(m) if &m.identity == identity => Ok(m),
        TrainingMetrics::Grpo(_) => {
            Err(Error::Input(format!("{what} belongs to another GRPO run (identity differs): refusing it")))
        }
        other => Err(Error::Input(format!("{what} is the state of a {} run, not of a GRPO run", other.kind()))),
    })
}

/// What a run reads and never changes once set up: the params, the RL pool
/// and its prompts, the verifier and the registries the guard checks against,
/// the run's identity and lineage.
pub struct Setup {
    pub p: GrpoParams,
    pub started: Instant,
    pub pool: Vec<Example>,
    pub prompts: Vec<Vec<i64>>,
    pub tokenizer: TextTokenizer,
    /// The ids that end a rollout.
    pub stops: Vec<i64>,
    /// The reward's terms, programs running (behind a lock: scoring a
    /// response talks to them).
    pub reward: Mutex<RewardFunction>,
    /// What every envelope names as its reward (the verifier's name and hash
    /// for a plain verifier, else the sum of terms' identity).
    pub reward_ref: RewardRef,
    pub reward_names: Vec<String>,
    pub verifiers: VerifierRegistry,
    pub aliases: BTreeMap<String, String>,
    pub tokenizer_hash: String,
    pub prompt_registry: BTreeMap<String, String>,
    pub identity: GrpoIdentity,
    pub lineage: String,
    pub reference_digest: String,
    pub hyper: GrpoHyper,
    pub total_updates: usize,
    /// Rollouts per iteration (prompts × group size).
    pub per_iteration: u64,
    /// The canary's fixed prompts, and its baseline right after the first sync.
    pub canary_prompts: Vec<Vec<i64>>,
    pub canary_baseline: f64,
    /// The node key: the owner of the rollouts it claims.
    pub key: String,
}

/// Where the run stands: what a checkpoint and the final state record.
#[derive(Debug, Clone)]
pub struct Position {
    pub updates: usize,
    pub cursor: Cursor,
    /// This epoch's prompt order.
    pub order: Vec<usize>,
    pub history: Vec<GrpoIteration>,
    pub bad_updates: usize,
    pub detections: Vec<Detection>,
    pub consumed: Vec<[u64; 2]>,
    /// What each iteration this process ran cost: kept apart from the
    /// history (no checkpoint or output holds a duration), for the record.
    pub costs: BTreeMap<usize, IterationCosts>,
}

/// One iteration's rollouts as sampled.
pub struct Sampled {
    pub iteration: usize,
    /// Indices into the pool, one per prompt.
    pub chosen: Vec<usize>,
    /// The first rollout id of the iteration.
    pub first: u64,
    /// One prompt per rollout (each prompt repeated group-size times).
    pub prompts: Vec<Vec<i64>>,
    pub generated: Vec<Generated>,
    pub faults: Vec<FaultSpec>,
    pub canary: Canary,
    pub generation_seconds: f64,
}

/// The rollouts' rewards, the behavior check, and the group advantages.
pub struct Scored {
    /// Each response's reward: the weighted sum of its terms.
    pub rewards: Vec<f64>,
    /// Each term's mean and std over the iteration's responses.
    pub terms: BTreeMap<String, TermStats>,
    /// Seconds spent computing the rewards (programs' replies included).
    pub reward_seconds: f64,
    pub finishes: FinishCounts,
    pub behavior_gap: f64,
    pub verification_seconds: f64,
    pub advantages: Vec<f64>,
    pub zero_variance_groups: usize,
}

/// What the generation side recorded for the trainer: token artifacts by hash
/// (as the store holds them) and one envelope per rollout, after any fault.
pub struct RolloutRecord {
    pub artifacts: BTreeMap<String, TokenArtifacts>,
    pub envelopes: Vec<Envelope>,
    /// The reference weights' digest when recorded.
    pub reference_now: String,
}

impl Setup {
    /// Appends a sealed event to the run's lineage.
    fn log(&self, ledger: &mut Ledger, event: GuardEvent) -> Result<()> {
        orchestrate_core::guard::events::log(ledger, &self.lineage, &event)?;
        Ok(())
    }

    /// The run's metrics as of a point: what a WAL checkpoint and the final state hold.
    fn metrics(
        &self,
        ledger: &Ledger,
        pos: &Position,
        next_iteration: usize,
        adam_step: i64,
        final_model_digest: String,
        reference_digest_now: &str,
    ) -> Result<GrpoMetrics> {
        let events = ledger.events(&self.lineage)?;
        if let Some(problem) = orchestrate_core::guard::events::verify_events(&events) {
            bail!("the guard's event log is broken: {problem}");
        }
        // Counted from the sealed log itself, so an interrupted + resumed lineage
        // counts the updates of both processes.
        let unguarded_updates = events.iter().filter(|e| e.kind == orchestrate_core::guard::UNGUARDED_EVENT).count();
        let distinct: BTreeSet<u64> = pos.consumed.iter().flat_map(|[a, b]| *a..*b).collect();
        Ok(GrpoMetrics {
            identity: self.identity.clone(),
            lineage: self.lineage.clone(),
            next_iteration,
            complete: next_iteration == self.p.iterations,
            updates: pos.updates,
            adam_step,
            scheduler: Scheduler { next_update: pos.updates, total: self.total_updates },
            cursor: pos.cursor,
            consumed_rollouts: pos.consumed.clone(),
            rollouts_consumed: distinct.len(),
            history: pos.history.clone(),
            reference_digest: self.reference_digest.clone(),
            reference_unchanged: reference_digest_now == self.reference_digest,
            guard: GuardSummary {
                switch: self.p.guard,
                faults: self.p.faults.clone(),
                detections: pos.detections.clone(),
                bad_updates_applied: pos.bad_updates,
                unguarded_updates,
                event_log: EventLogSummary { events: events.len() },
            },
            final_model_digest,
            costs: None,
        })
    }

    /// What this process cost: its seconds and memory, and each iteration it ran.
    fn costs(&self, pos: &Position) -> NodeCosts {
        NodeCosts {
            process: RunCosts {
                seconds: self.started.elapsed().as_secs_f64(),
                optimization_seconds: None,
                peak_rss_bytes: peak_rss_bytes(),
            },
            iterations: pos.costs.clone(),
        }
    }
}

/// Sample: the iteration's prompts (the next ones of this epoch's order),
/// its rollout ids claimed once in the ledger, the rollout engine synced to
/// the trainer (unless fault F1 silently skips it), and one group of
/// responses per prompt at temperature 1.
#[allow(clippy::too_many_arguments)]
pub fn sample(
    s: &Setup,
    pos: &mut Position,
    engine: &mut RolloutEngine,
    policy: &CausalLm,
    params: &BTreeMap<String, Tensor>,
    ledger: &mut Ledger,
    iteration: usize,
) -> Result<Sampled> {
    let p = &s.p;
    if pos.cursor.offset + p.prompts_per_iteration > pos.order.len() {
        pos.cursor = Cursor { epoch: pos.cursor.epoch + 1, offset: 0 };
        pos.order = permutation(s.pool.len(), p.seed, "grpo/prompts", pos.cursor.epoch);
    }
    let chosen: Vec<usize> = pos.order[pos.cursor.offset..pos.cursor.offset + p.prompts_per_iteration].to_vec();
    pos.cursor.offset += p.prompts_per_iteration;
    let first = iteration as u64 * s.per_iteration;
    let rollout_ids: Vec<u64> = (first..first + s.per_iteration).collect();
    ledger.claim_rollouts(&s.lineage, &s.key, &rollout_ids)?;
    if pos.consumed.iter().any(|[a, b]| first < *b && *a < first + s.per_iteration) {
        bail!("rollouts {first}..{} were already consumed in this run's state", first + s.per_iteration);
    }
    pos.consumed.push([first, first + s.per_iteration]);

    let prompts: Vec<Vec<i64>> =
        chosen.iter().flat_map(|&i| std::iter::repeat_n(s.prompts[i].clone(), p.group_size)).collect();
    let t = Instant::now();
    let faults: Vec<FaultSpec> = active(&p.faults, iteration).into_iter().cloned().collect();
    if faults.iter().any(|f| f.family == FaultFamily::F1) {
        // F1 is silent: the control plane believes it synced.
        eprintln!("fault F1 at iteration {iteration}: the sync to the rollout engine is skipped");
    } else {
        engine.sync(params, pos.updates as u64);
    }
    s.log(ledger, GuardEvent::Control(ControlEvent::Sync(PolicySync { iteration, trainer_version: pos.updates })))?;
    let canary = Canary { drift: canary_drift(&engine.model, policy, &s.canary_prompts), baseline: s.canary_baseline };
    let generated = generate(
        &engine.model,
        &prompts,
        p.max_new_tokens,
        &s.stops,
        &Sampling::Sample { seed: p.seed, rollout_ids },
        true,
    )?;
    Ok(Sampled {
        iteration,
        chosen,
        first,
        prompts,
        generated,
        faults,
        canary,
        generation_seconds: t.elapsed().as_secs_f64(),
    })
}

/// Score: each response's reward from the verifier; then, before any update,
/// full re-scoring must agree with the captured behavior log-probs (the run
/// stops otherwise); then the advantages of each group.
pub fn score(s: &Setup, engine: &RolloutEngine, sampled: &Sampled) -> Result<Scored> {
    let p = &s.p;
    let mut rows = Vec::with_capacity(sampled.generated.len());
    let mut finishes = FinishCounts { eos: 0, length: 0 };
    let t = Instant::now();
    let mut reward = s.reward.lock().unwrap_or_else(|e| e.into_inner());
    for (row, g) in sampled.generated.iter().enumerate() {
        let example = &s.pool[sampled.chosen[row / p.group_size]];
        let request = reward_request(&s.tokenizer, example, sampled.first + row as u64, g)?;
        rows.push(reward.score(&request).map_err(|e| err!("iteration {}: {e}", sampled.iteration))?);
        if g.finish == FinishReason::Eos {
            finishes.eos += 1;
        } else {
            finishes.length += 1;
        }
    }
    drop(reward);
    let reward_seconds = t.elapsed().as_secs_f64();
    let rewards: Vec<f64> = rows.iter().map(|r| r.total).collect();
    let terms = term_stats(&s.reward_names, &rows);
    let t = Instant::now();
    let responses: Vec<Vec<i64>> = sampled.generated.iter().map(|g| g.ids.clone()).collect();
    let behavior: Vec<Vec<f32>> = sampled.generated.iter().map(|g| g.behavior_logprobs.clone()).collect();
    let gap = behavior_gap(&engine.model, &sampled.prompts, &responses, &behavior)?;
    if gap > p.behavior_tolerance {
        bail!(
            "iteration {}: behavior log-probs differ from full re-scoring by {gap:e} > {:e}: refusing to update",
            sampled.iteration,
            p.behavior_tolerance
        );
    }
    let verification_seconds = t.elapsed().as_secs_f64();
    let mut advantages = Vec::with_capacity(rewards.len());
    let mut zero_variance_groups = 0;
    for group in rewards.chunks(p.group_size) {
        let a = group_advantages(group);
        if a.iter().all(|v| *v == 0.0) {
            zero_variance_groups += 1;
        }
        advantages.extend(a);
    }
    Ok(Scored {
        rewards,
        terms,
        reward_seconds,
        finishes,
        behavior_gap: gap,
        verification_seconds,
        advantages,
        zero_variance_groups,
    })
}

/// Envelope: what the generation side records. The iteration's token
/// artifacts are written into the node's `rollouts` output (create-new, synced)
/// and read back from there (what the materializer reads is what the output
/// holds); each gets an envelope; generation and rewards go on the sealed log;
/// the iteration's faults corrupt what their bugs corrupt.
#[allow(clippy::too_many_arguments)]
pub fn envelope(
    s: &Setup,
    pos: &Position,
    rollouts_dir: &std::path::Path,
    ledger: &mut Ledger,
    engine: &RolloutEngine,
    reference_params: &BTreeMap<String, Tensor>,
    sampled: &Sampled,
    scored: &Scored,
) -> Result<RolloutRecord> {
    let p = &s.p;
    let (iteration, first) = (sampled.iteration, sampled.first);
    let trainer_version = pos.updates as u64;
    let written: Vec<TokenArtifacts> = sampled
        .generated
        .iter()
        .enumerate()
        .map(|(row, g)| TokenArtifacts {
            prompt_ids: sampled.prompts[row].clone(),
            response_ids: g.ids.clone(),
            old_logprobs: g.behavior_logprobs.clone(),
            mask_start: sampled.prompts[row].len(),
            mask_len: g.ids.len(),
        })
        .collect();
    let hashes = rollouts::write_iteration(rollouts_dir, iteration, &written).map_err(|e| err!("{e}"))?;
    let read = rollouts::read_iteration(rollouts_dir, iteration).map_err(|e| err!("{e}"))?;
    crate::error::ensure!(
        read.iter().map(|(h, _)| h).eq(hashes.iter()),
        "iteration {iteration}: the rollouts read back are not the ones written"
    );
    let mut store: BTreeMap<String, TokenArtifacts> = BTreeMap::new();
    let mut recorded: Vec<Recorded> = Vec::with_capacity(read.len());
    for (row, (hash, artifacts)) in read.into_iter().enumerate() {
        let example = &s.pool[sampled.chosen[row / p.group_size]];
        store.insert(hash.clone(), artifacts.clone());
        let envelope = Envelope {
            rollout_id: first + row as u64,
            prompt_id: example.id.clone(),
            split: orchestrate_core::data::Split::Train,
            artifacts_hash: hash,
            tokenizer_hash: s.tokenizer_hash.clone(),
            behavior_policy_version: engine.version,
            behavior_policy_digest: engine.digest.clone(),
            scorer_policy_digest: engine.digest.clone(),
            off_policy_correction: true,
            reward: s.reward_ref.clone(),
            events: vec![
                EventRef { kind: EventKind::Generation, seq: 1, policy_version: trainer_version },
                EventRef { kind: EventKind::Scoring, seq: 2, policy_version: trainer_version },
                EventRef { kind: EventKind::Reward, seq: 3, policy_version: trainer_version },
            ],
        };
        recorded.push(Recorded { envelope, artifacts });
    }
    let generation = Generation {
        iteration,
        rollouts: [first, first + s.per_iteration],
        policy_version: engine.version,
        policy_digest: engine.digest.clone(),
        artifacts: recorded.iter().map(|r| r.envelope.artifacts_hash.clone()).collect(),
    };
    s.log(ledger, GuardEvent::RolloutEngine(RolloutEngineEvent::Generation(generation)))?;
    let reward = Reward {
        iteration,
        verifier: s.reward_ref.verifier.clone(),
        protocol_hash: s.reward_ref.protocol_hash.clone(),
        rewards: scored.rewards.clone(),
    };
    s.log(ledger, GuardEvent::Verifier(VerifierEvent::Reward(reward)))?;
    let reference_now = digest(reference_params);
    let faults: Vec<&FaultSpec> = sampled.faults.iter().collect();
    inject(&faults, &mut recorded, &mut store, &s.tokenizer, &reference_now)?;
    let envelopes: Vec<Envelope> = recorded.iter().map(|r| r.envelope.clone()).collect();
    let digests = envelopes
        .iter()
        .map(|e| Ok(blake3::hash(serde_json::to_string(e)?.as_bytes()).to_hex().to_string()))
        .collect::<Result<Vec<String>>>()?;
    let logged = EnvelopeDigests { iteration, envelopes: digests };
    s.log(ledger, GuardEvent::Materializer(MaterializerEvent::Envelope(logged)))?;
    Ok(RolloutRecord { artifacts: store, envelopes, reference_now })
}

/// Validate: what the next optimizer step may take. With the guard on, the
/// envelopes are validated and, only if every one is allowed, the batch is
/// rebuilt from stored artifacts and its single-use handle spent on it; a
/// refused batch is a detection, logged, and `None` (no step). With the guard
/// off, the named way around it, logged first; an artifact the store does not
/// hold still stops the run.
#[allow(clippy::too_many_arguments)]
pub fn validate(
    s: &Setup,
    pos: &mut Position,
    ledger: &mut Ledger,
    params: &BTreeMap<String, Tensor>,
    sampled: &Sampled,
    scored: &Scored,
    batch: &RolloutRecord,
    guard_record: &mut IterationGuard,
) -> Result<Option<UpdateBatch>> {
    let p = &s.p;
    let iteration = sampled.iteration;
    match p.guard {
        GuardSwitch::On => {
            let ctx = GuardContext {
                mode: match p.protocol {
                    GuardProtocol::Strict => ProtocolMode::StrictOnPolicy,
                    GuardProtocol::Bounded => {
                        ProtocolMode::BoundedOffPolicy { max_lag: (p.updates_per_iteration - 1) as u64 }
                    }
                },
                trainer_policy_version: pos.updates as u64,
                tokenizer_hash: s.tokenizer_hash.clone(),
                artifacts: &batch.artifacts,
                trainable_splits: BTreeSet::from([orchestrate_core::data::Split::Train]),
                prompt_registry: &s.prompt_registry,
                verifiers: &s.verifiers,
                verifier_aliases: &s.aliases,
                canary: Some(sampled.canary),
            };
            let binding = UpdateBinding {
                rewards: scored.rewards.clone(),
                advantages: scored.advantages.clone(),
                group_size: p.group_size,
                reference: batch.reference_now.clone(),
            };
            match materialize(&batch.envelopes, &ctx, &digest(params), &binding, ledger) {
                Ok((materialized, handle)) => {
                    let allowed = BatchDecision {
                        iteration,
                        decision: Decision::Allow,
                        batch: Some(handle.batch_hash().to_string()),
                        codes: None,
                    };
                    s.log(ledger, GuardEvent::Materializer(MaterializerEvent::Decision(allowed)))?;
                    let prepared = Prepared { iteration, update: pos.updates, nonce: handle.nonce().to_string() };
                    s.log(ledger, GuardEvent::Control(ControlEvent::UpdatePrepared(prepared)))?;
                    // What the optimizer step takes exists only once the handle is spent.
                    Ok(Some(handle.spend(materialized, ledger)?))
                }
                Err(GuardError::Rejected(refused)) => {
                    let decision = refused.iter().map(|(_, v)| v.decision).max().unwrap_or(Decision::Reject);
                    *guard_record =
                        IterationGuard { decision, codes: codes_of(&refused), rollouts: Some(refused.len()) };
                    pos.detections.push(Detection { iteration, decision, codes: codes_of(&refused) });
                    eprintln!("guard: iteration {iteration} batch {:?}: {:?}", decision, codes_of(&refused));
                    let refusal = BatchDecision { iteration, decision, batch: None, codes: Some(codes_of(&refused)) };
                    s.log(ledger, GuardEvent::Materializer(MaterializerEvent::Decision(refusal)))?;
                    let aborted = UpdateRef { iteration, update: pos.updates };
                    s.log(ledger, GuardEvent::Control(ControlEvent::UpdateAborted(aborted)))?;
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        }
        GuardSwitch::Off => {
            if !sampled.faults.is_empty() {
                pos.bad_updates += 1;
            }
            // Unvalidated, but never a substitute: an envelope whose artifact
            // the store does not hold stops the run.
            let rollouts: Vec<TokenArtifacts> = batch
                .envelopes
                .iter()
                .map(|e| {
                    batch.artifacts.get(&e.artifacts_hash).cloned().ok_or_else(|| {
                        err!(
                            "iteration {iteration}: rollout {}: its token artifact {} is not in the store; \
                             refusing to update on anything else",
                            e.rollout_id,
                            e.artifacts_hash
                        )
                    })
                })
                .collect::<Result<_>>()?;
            // The named way around the guard: the guard log records it first.
            Ok(Some(UpdateBatch::unguarded(rollouts, ledger, &s.lineage, iteration, pos.updates)?))
        }
    }
}

/// Apply: one optimizer step on what [`validate`] handed out, at this
/// update's learning rate, logged as applied and committed.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    s: &Setup,
    pos: &mut Position,
    ledger: &mut Ledger,
    model: (&CausalLm, &CausalLm),
    params: &BTreeMap<String, Tensor>,
    adam: &mut AdamW,
    update: &UpdateBatch,
    scored: &Scored,
    iteration: usize,
) -> Result<UpdateStats> {
    let p = &s.p;
    let (policy, reference) = model;
    let lr = learning_rate(pos.updates, s.total_updates, p.lr, p.warmup_ratio, p.min_lr_ratio);
    let stats =
        grpo_update(policy, reference, params, adam, update, scored.advantages.clone(), p.group_size, &s.hyper, lr)?;
    let applied = UpdateRef { iteration, update: pos.updates };
    s.log(ledger, GuardEvent::Control(ControlEvent::UpdateApplied(applied)))?;
    pos.updates += 1;
    let committed = Committed { iteration, update: Some(pos.updates - 1), checkpoint: None };
    s.log(ledger, GuardEvent::Control(ControlEvent::UpdateCommitted(committed)))?;
    Ok(stats)
}

/// What one iteration did, for [`record`].
pub struct Done {
    pub sampled: Sampled,
    pub scored: Scored,
    pub reference_now: String,
    pub weights_before: String,
    pub hashing_before: f64,
    pub updates: Vec<UpdateStats>,
    pub guard: IterationGuard,
    pub optimization_seconds: f64,
    pub started: Instant,
}

/// Record: the iteration's history entry and, at a checkpoint boundary of the
/// whole run, a committed WAL checkpoint; then the progress lines.
#[allow(clippy::too_many_arguments)]
pub fn record(
    s: &Setup,
    pos: &mut Position,
    ledger: &mut Ledger,
    wal: &Wal,
    params: &BTreeMap<String, Tensor>,
    adam: &AdamW,
    done: Done,
) -> Result<()> {
    let p = &s.p;
    let Done { sampled, scored, reference_now, weights_before, hashing_before, updates, guard, .. } = done;
    let iteration = sampled.iteration;
    let t = Instant::now();
    let after = digest(params);
    let hashing_seconds = hashing_before + t.elapsed().as_secs_f64();
    let mean_reward = scored.rewards.iter().sum::<f64>() / scored.rewards.len() as f64;
    let kl_long = updates.last().map_or("- (no update)".to_string(), |u| format!("{:.3e}", u.kl));
    let kl_short = updates.last().map_or("-".to_string(), |u| format!("{:.2e}", u.kl));
    pos.history.push(GrpoIteration {
        iteration,
        prompts: sampled.chosen.iter().map(|&i| s.pool[i].id.clone()).collect(),
        rollouts: [sampled.first, sampled.first + s.per_iteration],
        mean_reward,
        rewards: scored.rewards,
        reward_terms: scored.terms,
        zero_variance_groups: scored.zero_variance_groups,
        zero_variance_fraction: scored.zero_variance_groups as f64 / p.prompts_per_iteration as f64,
        finish: scored.finishes,
        response_tokens: Some(sampled.generated.iter().map(|g| g.ids.len()).collect()),
        behavior_max_gap: scored.behavior_gap,
        updates,
        weights_changed: weights_before != after,
        guard,
        canary: sampled.canary,
        faults: sampled.faults.iter().map(|f| format!("{:?}", f.family)).collect(),
        costs: None,
    });
    pos.costs.insert(
        iteration,
        IterationCosts {
            generation_seconds: sampled.generation_seconds,
            reward_seconds: Some(scored.reward_seconds),
            behavior_verification_seconds: scored.verification_seconds,
            optimization_with_reference_seconds: done.optimization_seconds,
            state_hashing_seconds: hashing_seconds,
            loop_seconds: done.started.elapsed().as_secs_f64(),
        },
    );
    // A boundary of the whole run is a committed checkpoint, whether or not this
    // process stops there: an interrupt at a boundary commits it exactly as the
    // continuous run does, so both lineages log the same events. Only the run's
    // last iteration has none (the final state is the node's output).
    if p.checkpoint_every > 0 && (iteration + 1) % p.checkpoint_every == 0 && iteration + 1 < p.iterations {
        // The digests this iteration already took (weights after its updates, reference).
        let meta = s.metrics(ledger, pos, iteration + 1, adam.step, after, &reference_now)?;
        wal.checkpoint(params, adam, &TrainingMetrics::Grpo(meta), iteration)?;
        let committed = Committed { iteration, update: None, checkpoint: Some(iteration + 1) };
        s.log(ledger, GuardEvent::Control(ControlEvent::UpdateCommitted(committed)))?;
    }
    // No update ran (the guard refused the batch): there is no KL to report.
    eprintln!(
        "grpo iteration {iteration}: mean reward {mean_reward:.3}, zero-variance groups {}/{}, kl {kl_long}",
        scored.zero_variance_groups, p.prompts_per_iteration,
    );
    // The live progress line `orchestrate run` shows for this node.
    eprintln!(
        "{}iteration {}/{}  mean reward {mean_reward:.3}  KL {kl_short}",
        orchestrate_core::exec::report::PROGRESS_PREFIX,
        iteration + 1,
        p.iterations,
    );
    Ok(())
}

pub fn run(job: &WorkerJob, p: GrpoParams, mut ledger: Ledger) -> Result<(NodeCosts, TrainingSummary)> {
    let started = Instant::now();
    let device = pick_device()?;
    let model_dir = input_path(job, "model")?;
    let (policy, tokenizer) = load_model(model_dir, device)?;
    let prompter = Prompter::new(model_dir, p.chat_template, &p.system, p.prompt_template.as_deref())?;
    let reference = load_reference(model_dir, device)?;
    let reward = RewardFunction::start(&p.reward_terms(), &job.spec_dir).map_err(|e| err!("{e}"))?;
    let reward_ref = RewardRef { verifier: reward.name(), protocol_hash: reward.protocol_hash() };
    let stops = tokenizer.stop_ids();
    // The RL pool: train problems outside the warm-start set.
    let pool = rl_pool(examples(job, "pages", "labels")?, "labels")?;
    if pool.len() < p.prompts_per_iteration {
        bail!("the RL pool has {} prompts, fewer than {} per iteration", pool.len(), p.prompts_per_iteration);
    }
    let prompts: Vec<Vec<i64>> = pool
        .iter()
        .map(|e| prompter.ids(&tokenizer, &e.statement, p.max_prompt_tokens, &e.id))
        .collect::<Result<_>>()?;

    let params = params(&policy);
    let reference_params = super::common::params(&reference);
    let reference_digest = digest(&reference_params);
    let mut adam = AdamW::new(AdamWConfig::new(p.weight_decay), &params);
    let identity = GrpoIdentity::new(&p, digest(&params), reward_ref.protocol_hash.clone());
    let identity_text = serde_json::to_string(&identity)?;
    // Rollouts belong to a lineage, one trajectory: an interrupted run and its
    // resume share one (the resume reads it from the state); a continuous run
    // replays the same ids in a lineage of its own. A fresh run's lineage names
    // its node key too: a node re-keyed with the same identity (an op version, its
    // threads) is a new trajectory, not a replay of the old one's rollouts.
    let lineage_of =
        |mode: &str| blake3::hash(format!("{identity_text}|{mode}|{}", job.key).as_bytes()).to_hex().to_string();

    let mut next_iteration = 0usize;
    let mut pos = Position {
        updates: 0,
        cursor: Cursor { epoch: 0, offset: 0 },
        order: Vec::new(),
        history: Vec::new(),
        bad_updates: 0,
        detections: Vec::new(),
        consumed: Vec::new(),
        costs: BTreeMap::new(),
    };
    let restored = |m: GrpoMetrics, pos: &mut Position| {
        (pos.updates, pos.cursor, pos.history, pos.consumed) = (m.updates, m.cursor, m.history, m.consumed_rollouts);
        (pos.bad_updates, pos.detections) = (m.guard.bad_updates_applied, m.guard.detections);
        m.next_iteration
    };
    // The events of the lineage this attempt continues: none for a fresh start
    // (a deliberate re-run is a new attempt), those its input state counted
    // for a resume. `None`: a crash recovery, which continues its chain.
    let mut continues_after: Option<usize> = Some(0);
    let lineage = match p.mode {
        Mode::Continuous => lineage_of("continuous"),
        Mode::Interrupt => lineage_of("interrupted"),
        Mode::Resume => {
            let m =
                restore_position(input_path(job, "resume_from")?, "the resume state", &identity, &params, &mut adam)?;
            let lineage = m.lineage.clone();
            continues_after = Some(m.guard.event_log.events);
            next_iteration = restored(m, &mut pos);
            lineage
        }
    };
    // The node's rollouts: an output, written as each iteration is generated.
    let rollouts_dir = job.staging.join(rollouts::OUTPUT);
    rollouts::ensure_dir(&rollouts_dir).map_err(|e| err!("{e}"))?;
    // The update WAL's checkpoints live where the executor says, by node key:
    // a re-run of a crashed node recovers from its last committed checkpoint,
    // and the rollouts the checkpoint kept.
    let wal = Wal::new(&job.checkpoints, &rollouts_dir, next_iteration);
    if p.mode != Mode::Resume {
        if let Some(state) = wal.last_committed()? {
            let m = restore_position(&state, "the committed checkpoint", &identity, &params, &mut adam)?;
            let started_at = next_iteration;
            next_iteration = restored(m, &mut pos);
            wal.recover_rollouts(started_at, next_iteration)?;
            continues_after = None;
            eprintln!("recovered from the committed checkpoint after iteration {next_iteration}");
        }
    }
    // Events of an earlier attempt past this one's starting point (a finished
    // run forced again, a resume run again) are set aside, not counted twice.
    if let Some(keep) = continues_after {
        if let Some(aside) = ledger.restart_chain(&lineage, keep)? {
            eprintln!("guard: an earlier attempt's events of this lineage were set aside as {aside}; this attempt logs its own");
        }
    }
    // The rollout engine: its own weights, synced explicitly (what makes F1 observable).
    let (engine_model, _) = load_model(model_dir, device)?;
    let mut engine = RolloutEngine::new(engine_model);
    engine.sync(&params, pos.updates as u64);
    if p.guard == GuardSwitch::Off {
        eprintln!(
            "WARNING: guard: off. Batches update parameters without validation; bad updates are counted, not blocked."
        );
    }
    let canary_prompts: Vec<Vec<i64>> = prompts.iter().take(2).cloned().collect();
    let canary_baseline = canary_drift(&engine.model, &policy, &canary_prompts);
    pos.order = permutation(pool.len(), p.seed, "grpo/prompts", pos.cursor.epoch);
    let s = Setup {
        started,
        tokenizer_hash: blake3::hash(&std::fs::read(model_dir.join("tokenizer.json"))?).to_hex().to_string(),
        prompt_registry: prompt_registry(&pool.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), &prompts),
        verifiers: reward.registry(),
        aliases: [(VERIFIER_ALIAS.to_string(), reward_ref.verifier.clone())].into(),
        reward_names: reward.names(),
        reward: Mutex::new(reward),
        reward_ref,
        identity,
        lineage,
        reference_digest,
        hyper: GrpoHyper::of(&p),
        total_updates: p.iterations * p.updates_per_iteration,
        per_iteration: (p.prompts_per_iteration * p.group_size) as u64,
        canary_prompts,
        canary_baseline,
        key: job.key.to_string(),
        pool,
        prompts,
        tokenizer,
        stops,
        p,
    };
    let stop = if s.p.mode == Mode::Interrupt { s.p.interrupt_at } else { s.p.iterations };

    for iteration in next_iteration..stop {
        let t_loop = Instant::now();
        let sampled = sample(&s, &mut pos, &mut engine, &policy, &params, &mut ledger, iteration)?;
        let scored = score(&s, &engine, &sampled)?;
        let batch = envelope(&s, &pos, &rollouts_dir, &mut ledger, &engine, &reference_params, &sampled, &scored)?;
        let t = Instant::now();
        let weights_before = digest(&params);
        let hashing_before = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut updates = Vec::new();
        let mut guard = IterationGuard { decision: Decision::Allow, codes: Vec::new(), rollouts: None };
        failpoint("prepared", iteration);
        for _ in 0..s.p.updates_per_iteration {
            let Some(update) = validate(&s, &mut pos, &mut ledger, &params, &sampled, &scored, &batch, &mut guard)?
            else {
                break;
            };
            let model = (&policy, &reference);
            updates.push(apply(&s, &mut pos, &mut ledger, model, &params, &mut adam, &update, &scored, iteration)?);
        }
        let optimization_seconds = t.elapsed().as_secs_f64();
        failpoint("applied", iteration);
        let done = Done {
            sampled,
            scored,
            reference_now: batch.reference_now,
            weights_before,
            hashing_before,
            updates,
            guard,
            optimization_seconds,
            started: t_loop,
        };
        record(&s, &mut pos, &mut ledger, &wal, &params, &adam, done)?;
    }
    let reference_now = digest(&reference_params);
    if reference_now != s.reference_digest {
        bail!("the reference model changed during training");
    }
    let meta = s.metrics(&ledger, &pos, stop, adam.step, digest(&params), &reference_now)?;
    let costs = s.costs(&pos);
    s.reward.into_inner().unwrap_or_else(|e| e.into_inner()).finish().map_err(|e| err!("{e}"))?;
    let meta = TrainingMetrics::Grpo(meta);
    let summary = TrainingSummary::of(&meta);
    write_outputs(job, &policy, model_dir, &params, &adam, meta)?;
    // The node's outputs are complete: its recovery checkpoints are no longer needed.
    wal.clear();
    Ok((costs, summary))
}

#[cfg(test)]
mod tests {
    //! The loop's steps called one by one on a tiny random model: a batch
    //! whose mask a fault shifted is refused by `validate` and never reaches
    //! `apply`; a clean one is handed out once and changes the weights.

    use super::*;
    use crate::tests::{serial, tiny_config};
    use orchestrate_core::ops::FaultFamily;
    use serde_json::json;

    fn setup(dir: &std::path::Path) -> (Setup, CausalLm, CausalLm, RolloutEngine) {
        let texts: Vec<String> = (0..60).map(|i| format!("stock {i} boxes, then {} more", i * 7 % 13)).collect();
        let tokenizer_path = dir.join("tokenizer.json");
        orchestrate_core::model::build_bpe(&texts, 96, &tokenizer_path).unwrap();
        let tokenizer = TextTokenizer::from_file(&tokenizer_path).unwrap();
        let vocab = (tokenizer.vocab_size() as usize).div_ceil(32) * 32;
        let model = |seed| {
            let mut m = CausalLm::new(&tiny_config(vocab), tch::Device::Cpu).unwrap();
            m.init_weights(seed);
            m
        };
        let p: GrpoParams = orchestrate_core::ops::parse_params(&json!({
            "group_size": 2, "prompts_per_iteration": 2, "iterations": 2, "updates_per_iteration": 1,
            "max_new_tokens": 6, "lr": 1e-3, "checkpoint_every": 0
        }))
        .unwrap();
        let pool: Vec<Example> = (0..2)
            .map(|i| Example {
                id: format!("p{i}"),
                statement: texts[i].clone(),
                label: orchestrate_core::data::rows::LabelRow {
                    id: format!("p{i}"),
                    split: orchestrate_core::data::Split::Train,
                    population: None,
                    problem: json!({}),
                    target: None,
                    warmstart: false,
                    reference_response: None,
                    template: None,
                },
            })
            .collect();
        let prompts: Vec<Vec<i64>> = pool.iter().map(|e| tokenizer.encode(&e.statement).unwrap()).collect();
        let (policy, reference) = (model(1), model(1));
        let mut engine = RolloutEngine::new(model(1));
        let params = super::params(&policy);
        engine.sync(&params, 0);
        let reward = RewardFunction::start(&p.reward_terms(), dir).unwrap();
        let reward_ref = RewardRef { verifier: reward.name(), protocol_hash: reward.protocol_hash() };
        let identity = GrpoIdentity::new(&p, digest(&params), reward_ref.protocol_hash.clone());
        let s = Setup {
            started: Instant::now(),
            stops: tokenizer.stop_ids(),
            tokenizer_hash: "tok".into(),
            prompt_registry: prompt_registry(&pool.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), &prompts),
            verifiers: VerifierRegistry::builtin(),
            aliases: BTreeMap::new(),
            identity,
            lineage: "lineage-test".into(),
            reference_digest: digest(&super::params(&reference)),
            hyper: GrpoHyper::of(&p),
            total_updates: 2,
            per_iteration: 4,
            canary_prompts: prompts.clone(),
            canary_baseline: 0.0,
            key: "0".repeat(64),
            pool,
            prompts,
            tokenizer,
            reward_names: reward.names(),
            reward: Mutex::new(reward),
            reward_ref,
            p,
        };
        (s, policy, reference, engine)
    }

    /// Rewards that make both groups informative (one success, one failure each).
    fn scored() -> Scored {
        let rewards = vec![1.0, 0.0, 0.0, 1.0];
        let advantages = rewards.chunks(2).flat_map(group_advantages).collect();
        Scored {
            rewards,
            terms: BTreeMap::new(),
            reward_seconds: 0.0,
            finishes: FinishCounts { eos: 0, length: 4 },
            behavior_gap: 0.0,
            verification_seconds: 0.0,
            advantages,
            zero_variance_groups: 0,
        }
    }

    #[test]
    fn the_steps_refuse_a_shifted_mask_and_apply_a_clean_batch_once() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let (s, policy, reference, mut engine) = setup(dir.path());
        let params = super::params(&policy);
        let reference_params = super::params(&reference);
        let mut adam = AdamW::new(AdamWConfig::new(0.0), &params);
        let out = dir.path().join("rollouts");
        rollouts::ensure_dir(&out).unwrap();
        let mut ledger = Ledger::open_at(&dir.path().join("guard.sqlite")).unwrap();
        let mut pos = Position {
            updates: 0,
            cursor: Cursor { epoch: 0, offset: 0 },
            order: vec![0, 1],
            history: Vec::new(),
            bad_updates: 0,
            detections: Vec::new(),
            consumed: Vec::new(),
            costs: BTreeMap::new(),
        };
        let allow = || IterationGuard { decision: Decision::Allow, codes: Vec::new(), rollouts: None };

        // Iteration 0, with the completion mask shifted by one (F4).
        let mut sampled = sample(&s, &mut pos, &mut engine, &policy, &params, &mut ledger, 0).unwrap();
        assert_eq!(sampled.generated.len(), 4);
        assert_eq!(pos.consumed, vec![[0, 4]]);
        sampled.faults = vec![FaultSpec { family: FaultFamily::F4, at_iteration: 0, shift: None }];
        let batch = envelope(&s, &pos, &out, &mut ledger, &engine, &reference_params, &sampled, &scored()).unwrap();
        let mut guard = allow();
        let before = digest(&params);
        let refused = validate(&s, &mut pos, &mut ledger, &params, &sampled, &scored(), &batch, &mut guard).unwrap();
        assert!(refused.is_none(), "a shifted mask must not reach the optimizer");
        assert_ne!(guard.decision, Decision::Allow);
        assert_eq!(pos.detections.len(), 1);
        assert!(
            pos.detections[0].codes.iter().any(|c| c.starts_with("M002") || c.starts_with("M004")),
            "{:?}",
            pos.detections
        );
        assert_eq!((pos.updates, digest(&params)), (0, before.clone()), "nothing changed");

        // Iteration 1, clean: validated, handed out, applied once.
        let sampled = sample(&s, &mut pos, &mut engine, &policy, &params, &mut ledger, 1).unwrap();
        assert_eq!(pos.consumed, vec![[0, 4], [4, 8]]);
        let batch = envelope(&s, &pos, &out, &mut ledger, &engine, &reference_params, &sampled, &scored()).unwrap();
        let mut guard = allow();
        let update = validate(&s, &mut pos, &mut ledger, &params, &sampled, &scored(), &batch, &mut guard)
            .unwrap()
            .expect("a clean batch is handed out");
        let stats =
            apply(&s, &mut pos, &mut ledger, (&policy, &reference), &params, &mut adam, &update, &scored(), 1).unwrap();
        assert!(stats.grad_norm > 0.0, "{stats:?}");
        assert_eq!(pos.updates, 1);
        assert_ne!(digest(&params), before, "the step changed the weights");
        // The sealed log holds every step, intact, and the rollouts it names
        // are the output's, both iterations (the refused one included).
        assert_eq!(orchestrate_core::guard::events::verify(&ledger, &s.lineage).unwrap(), None);
        for i in 0..2 {
            let held = rollouts::read_iteration(&out, i).unwrap();
            assert_eq!(held.len(), 4, "iteration {i}");
        }
        let kinds: Vec<String> = ledger.events(&s.lineage).unwrap().into_iter().map(|e| e.kind).collect();
        assert!(kinds.contains(&"update_aborted".to_string()) && kinds.contains(&"update_applied".to_string()));
    }
}

//! `train.grpo`: each iteration takes prompts in a seeded order, samples a group
//! per prompt at temperature 1, scores them with the verifier, checks the
//! captured behavior log-probs against full re-scoring, then makes the
//! configured number of updates against those old log-probs, with the exact
//! prefix KL to a frozen reference. No critic.

use std::collections::BTreeSet;

use orchestrate_core::guard::Decision;
use orchestrate_core::train::metrics::{
    Cursor, Detection, EventLogSummary, FinishCounts, GrpoIdentity, GrpoIteration, GrpoMetrics, GuardSummary,
    IterationCosts, IterationGuard, RunCosts, Scheduler, TrainingMetrics,
};
use std::time::Instant;

use crate::error::{bail, err, Result};
use orchestrate_core::data::verifier::{FinishReason, VerifierRegistry};
use orchestrate_core::guard::Ledger;
use orchestrate_core::ops::worker::WorkerJob;
use orchestrate_core::ops::{parse_params, GrpoParams, Mode};
use serde_json::{json, Value};

use super::adamw::{digest, learning_rate, AdamW, AdamWConfig};
use super::common::{
    examples, input_path, load_model, load_reference, params, peak_rss_bytes, permutation, prompt_ids, read,
    restore_state, write_outputs,
};
use super::guarded::{active, codes_of, inject, prompt_registry, Recorded, RolloutEngine, VERIFIER_ALIAS};
use super::objective::group_advantages;
use super::update::{behavior_gap, grpo_update, GrpoHyper};
use crate::generate::{generate, pick_device, Sampling};
use orchestrate_core::guard::{
    materialize, Envelope, EventKind, EventRef, GuardContext, GuardError, ProtocolMode, RewardRef, TokenArtifacts,
    UpdateBatch,
};
use orchestrate_core::ops::{FaultFamily, GuardProtocol, GuardSwitch};
use std::collections::BTreeMap;

use super::guarded::{canary_drift, reward_of};
use super::guarded::{load_artifact, publish_artifact};
use super::wal::{failpoint, Wal};
use orchestrate_core::guard::Canary;

/// Where a run stands, restored from a state (a resume input or a WAL
/// checkpoint): weights and AdamW into `params` and `adam`, the rest returned.
fn restore_position(
    state: &orchestrate_core::train::state::StateFile,
    what: &str,
    params: &BTreeMap<String, tch::Tensor>,
    adam: &mut AdamW,
) -> Result<GrpoMetrics> {
    let metrics = match TrainingMetrics::from_meta(&state.meta, what).map_err(|e| err!("{e}"))? {
        TrainingMetrics::Grpo(m) => m,
        other => bail!("{what} is the state of a {} run, not of a GRPO run", other.kind()),
    };
    restore_state(state, params, adam)?;
    Ok(metrics)
}

/// The moving parts of a run at one point, for [`GrpoMetrics`].
struct Snapshot<'a> {
    next_iteration: usize,
    updates: usize,
    adam_step: i64,
    cursor: Cursor,
    consumed: &'a [[u64; 2]],
    history: &'a [GrpoIteration],
    detections: &'a [Detection],
    bad_updates: usize,
    final_model_digest: String,
    /// The reference weights' digest at this point (the run's start digest if unchanged).
    reference_digest_now: String,
}

pub fn run(job: &WorkerJob) -> Result<()> {
    let started = Instant::now();
    let p: GrpoParams = parse_params(&job.params)?;
    let device = pick_device()?;
    let model_dir = input_path(job, "model")?;
    let (policy, tokenizer) = load_model(model_dir, device)?;
    let reference = load_reference(model_dir, device)?;
    let verifier =
        VerifierRegistry::builtin().get(&p.verifier).cloned().ok_or_else(|| err!("no verifier {}", p.verifier))?;
    let eos = tokenizer.eos_id()?;
    let mut pool = examples(input_path(job, "pages")?, input_path(job, "labels")?)?;
    // The RL pool: train problems outside the warm-start set.
    pool.retain(|e| e.label["warmstart"].as_bool() == Some(false));
    if pool.len() < p.prompts_per_iteration {
        bail!("the RL pool has {} prompts, fewer than {} per iteration", pool.len(), p.prompts_per_iteration);
    }
    let prompts: Vec<Vec<i64>> = pool
        .iter()
        .map(|e| prompt_ids(&tokenizer, &p.system, &e.statement, p.max_prompt_tokens, &e.id))
        .collect::<Result<_>>()?;

    let params = params(&policy);
    let reference_params = super::common::params(&reference);
    let reference_digest = digest(&reference_params);
    let mut adam = AdamW::new(AdamWConfig::new(p.weight_decay), &params);
    let total_updates = p.iterations * p.updates_per_iteration;
    let hyper = GrpoHyper { clip_eps: p.clip_eps, beta: p.beta, kl_block: p.kl_block, max_grad_norm: p.max_grad_norm };
    let identity = GrpoIdentity::new(&p, digest(&params), verifier.protocol_hash());
    let identity_text = serde_json::to_string(&identity)?;
    // Rollouts belong to a lineage: an interrupted run and its resume share one;
    // a continuous run replays the same ids in a lineage of its own.
    let lineage_of = |mode: &str| blake3::hash(format!("{identity_text}|{mode}").as_bytes()).to_hex().to_string();

    let (mut next_iteration, mut updates) = (0usize, 0usize);
    let mut cursor = Cursor { epoch: 0, offset: 0 };
    let mut history: Vec<GrpoIteration> = Vec::new();
    let mut bad_updates = 0usize;
    let mut detections: Vec<Detection> = Vec::new();
    let mut consumed: Vec<[u64; 2]> = Vec::new();
    let lineage = match p.mode {
        Mode::Continuous => lineage_of("continuous"),
        Mode::Interrupt => lineage_of("interrupted"),
        Mode::Resume => {
            let state = read(input_path(job, "resume_from")?)?;
            let m = restore_position(&state, "the resume state", &params, &mut adam)?;
            if m.identity != identity {
                bail!("the resume state belongs to another GRPO run (identity differs): refusing to resume");
            }
            (next_iteration, updates, cursor, history, consumed) =
                (m.next_iteration, m.updates, m.cursor, m.history, m.consumed_rollouts);
            (bad_updates, detections) = (m.guard.bad_updates_applied, m.guard.detections);
            m.lineage
        }
    };
    let mut ledger = Ledger::open_at(&job.workspace.join(orchestrate_core::guard::ledger::FILE))?;
    let ws = orchestrate_core::store::Workspace::open(&job.workspace)?;
    // The update WAL's checkpoints live beside the workspace, by node key: a
    // re-run of a crashed node recovers from its last committed checkpoint.
    let wal = Wal::new(&job.workspace, &job.key);
    if p.mode != Mode::Resume {
        if let Some(state) = wal.last_committed()? {
            let m = restore_position(&state, "the committed checkpoint", &params, &mut adam)?;
            if m.identity != identity {
                bail!("the committed checkpoint belongs to another run (identity differs)");
            }
            (next_iteration, updates, cursor, history, consumed) =
                (m.next_iteration, m.updates, m.cursor, m.history, m.consumed_rollouts);
            (bad_updates, detections) = (m.guard.bad_updates_applied, m.guard.detections);
            eprintln!("recovered from the committed checkpoint after iteration {next_iteration}");
        }
    }
    // The rollout engine: its own weights, synced explicitly (what makes F1 observable).
    let (engine_model, _) = load_model(model_dir, device)?;
    let mut engine = RolloutEngine::new(engine_model);
    engine.sync(&params, updates as u64);
    let tokenizer_hash = blake3::hash(&std::fs::read(model_dir.join("tokenizer.json"))?).to_hex().to_string();
    let registry = prompt_registry(&pool.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), &prompts);
    let verifiers = VerifierRegistry::builtin();
    let aliases: BTreeMap<String, String> = [(VERIFIER_ALIAS.to_string(), p.verifier.clone())].into();
    if p.guard == GuardSwitch::Off {
        eprintln!(
            "WARNING: guard: off. Batches update parameters without validation; bad updates are counted, not blocked."
        );
    }
    // The canary's fixed prompts, and its baseline right after the first sync.
    let canary_prompts: Vec<Vec<i64>> = prompts.iter().take(2).cloned().collect();
    let canary_baseline = canary_drift(&engine.model, &policy, &canary_prompts);
    let log = |ledger: &mut Ledger, producer: &str, kind: &str, payload: Value| -> Result<()> {
        orchestrate_core::guard::events::append(ledger, &lineage, producer, kind, &payload)?;
        Ok(())
    };
    let stop = if p.mode == Mode::Interrupt { p.interrupt_at } else { p.iterations };
    // The run as of a point: what a WAL checkpoint and the final state hold.
    let snapshot = |ledger: &Ledger, at: Snapshot<'_>| -> Result<GrpoMetrics> {
        if let Some(problem) = orchestrate_core::guard::events::verify(ledger, &lineage)? {
            bail!("the guard's event log is broken: {problem}");
        }
        let events = ledger.events(&lineage)?;
        // Counted from the sealed log itself, so an interrupted + resumed lineage
        // counts the updates of both processes.
        let unguarded_updates = events.iter().filter(|e| e.kind == orchestrate_core::guard::UNGUARDED_EVENT).count();
        let distinct: BTreeSet<u64> = at.consumed.iter().flat_map(|[a, b]| *a..*b).collect();
        Ok(GrpoMetrics {
            identity: identity.clone(),
            lineage: lineage.clone(),
            next_iteration: at.next_iteration,
            complete: at.next_iteration == p.iterations,
            updates: at.updates,
            adam_step: at.adam_step,
            scheduler: Scheduler { next_update: at.updates, total: total_updates },
            cursor: at.cursor,
            consumed_rollouts: at.consumed.to_vec(),
            rollouts_consumed: distinct.len(),
            history: at.history.to_vec(),
            reference_digest: reference_digest.clone(),
            reference_unchanged: at.reference_digest_now == reference_digest,
            guard: GuardSummary {
                switch: p.guard,
                faults: p.faults.clone(),
                detections: at.detections.to_vec(),
                bad_updates_applied: at.bad_updates,
                unguarded_updates,
                event_log: EventLogSummary { events: events.len(), intact: true },
            },
            final_model_digest: at.final_model_digest,
            costs: RunCosts {
                seconds: started.elapsed().as_secs_f64(),
                optimization_seconds: None,
                peak_rss_bytes: peak_rss_bytes(),
            },
        })
    };
    // (A macro, not a closure: the loop keeps mutating what it reads.)
    macro_rules! snapshot_at {
        ($next_iteration:expr, $model_digest:expr, $reference_digest_now:expr) => {{
            let at = Snapshot {
                next_iteration: $next_iteration,
                updates,
                adam_step: adam.step,
                cursor,
                consumed: &consumed,
                history: &history,
                detections: &detections,
                bad_updates,
                final_model_digest: $model_digest,
                reference_digest_now: $reference_digest_now,
            };
            serde_json::to_value(TrainingMetrics::Grpo(snapshot(&ledger, at)?))?
        }};
    }
    let per_iteration = (p.prompts_per_iteration * p.group_size) as u64;
    let mut order = permutation(pool.len(), p.seed, "grpo/prompts", cursor.epoch);

    for iteration in next_iteration..stop {
        let t_loop = Instant::now();
        // Prompts: the next ones of this epoch's order (a new order when too few remain).
        if cursor.offset + p.prompts_per_iteration > order.len() {
            cursor = Cursor { epoch: cursor.epoch + 1, offset: 0 };
            order = permutation(pool.len(), p.seed, "grpo/prompts", cursor.epoch);
        }
        let chosen: Vec<usize> = order[cursor.offset..cursor.offset + p.prompts_per_iteration].to_vec();
        cursor.offset += p.prompts_per_iteration;
        let first = iteration as u64 * per_iteration;
        let rollout_ids: Vec<u64> = (first..first + per_iteration).collect();
        ledger.claim_rollouts(&lineage, &job.key, &rollout_ids)?;
        if consumed.iter().any(|[a, b]| first < *b && *a < first + per_iteration) {
            bail!("rollouts {first}..{} were already consumed in this run's state", first + per_iteration);
        }
        consumed.push([first, first + per_iteration]);

        let batch_prompts: Vec<Vec<i64>> =
            chosen.iter().flat_map(|&i| std::iter::repeat_n(prompts[i].clone(), p.group_size)).collect();
        let t = Instant::now();
        let faults = active(&p.faults, iteration);
        let skipped = faults.iter().any(|f| f.family == FaultFamily::F1);
        if skipped {
            // F1 is silent: the control plane believes it synced.
            eprintln!("fault F1 at iteration {iteration}: the sync to the rollout engine is skipped");
        } else {
            engine.sync(&params, updates as u64);
        }
        log(&mut ledger, "control", "sync", json!({"iteration": iteration, "trainer_version": updates}))?;
        let canary = Canary { drift: canary_drift(&engine.model, &policy, &canary_prompts), baseline: canary_baseline };
        let generated = generate(
            &engine.model,
            &batch_prompts,
            p.max_new_tokens,
            eos,
            &Sampling::Sample { seed: p.seed, rollout_ids },
            true,
        )?;
        let generation_seconds = t.elapsed().as_secs_f64();

        let mut rewards = Vec::with_capacity(generated.len());
        let mut finishes = (0usize, 0usize);
        for (row, g) in generated.iter().enumerate() {
            let example = &pool[chosen[row / p.group_size]];
            rewards.push(reward_of(verifier.as_ref(), &tokenizer, &example.label["problem"], g)?);
            if g.finish == FinishReason::Eos {
                finishes.0 += 1;
            } else {
                finishes.1 += 1;
            }
        }

        // Before any update: full re-scoring must agree with the captured behavior log-probs.
        let t = Instant::now();
        let responses: Vec<Vec<i64>> = generated.iter().map(|g| g.ids.clone()).collect();
        let behavior: Vec<Vec<f32>> = generated.iter().map(|g| g.behavior_logprobs.clone()).collect();
        let behavior_gap = behavior_gap(&engine.model, &batch_prompts, &responses, &behavior)?;
        if behavior_gap > p.behavior_tolerance {
            bail!(
                "iteration {iteration}: behavior log-probs differ from full re-scoring by {behavior_gap:e} > {:e}: refusing to update",
                p.behavior_tolerance
            );
        }
        let verification_seconds = t.elapsed().as_secs_f64();

        let mut advantages = Vec::with_capacity(rewards.len());
        let mut zero_variance = 0;
        for group in rewards.chunks(p.group_size) {
            let a = group_advantages(group);
            if a.iter().all(|v| *v == 0.0) {
                zero_variance += 1;
            }
            advantages.extend(a);
        }
        // What the generation side records: token artifacts by hash, and an envelope per rollout.
        let trainer_version = updates as u64;
        let mut store: BTreeMap<String, TokenArtifacts> = BTreeMap::new();
        let mut recorded: Vec<Recorded> = Vec::with_capacity(generated.len());
        let staging = ws.staging()?;
        for (row, g) in generated.iter().enumerate() {
            let example = &pool[chosen[row / p.group_size]];
            let artifacts = TokenArtifacts {
                prompt_ids: batch_prompts[row].clone(),
                response_ids: g.ids.clone(),
                old_logprobs: g.behavior_logprobs.clone(),
                mask_start: batch_prompts[row].len(),
                mask_len: g.ids.len(),
            };
            // The generation side publishes the artifact into the content-addressed
            // store; what the materializer reads is what the store holds.
            let hash = publish_artifact(&ws, &staging, &artifacts)?;
            store.insert(hash.clone(), load_artifact(&ws, &hash)?);
            let envelope = Envelope {
                rollout_id: first + row as u64,
                prompt_id: example.id.clone(),
                split: orchestrate_core::data::Split::Train,
                artifacts_hash: hash,
                tokenizer_hash: tokenizer_hash.clone(),
                behavior_policy_version: engine.version,
                behavior_policy_digest: engine.digest.clone(),
                scorer_policy_digest: engine.digest.clone(),
                off_policy_correction: true,
                reward: RewardRef { verifier: verifier.name().to_string(), protocol_hash: verifier.protocol_hash() },
                events: vec![
                    EventRef { kind: EventKind::Generation, seq: 1, policy_version: trainer_version },
                    EventRef { kind: EventKind::Scoring, seq: 2, policy_version: trainer_version },
                    EventRef { kind: EventKind::Reward, seq: 3, policy_version: trainer_version },
                ],
            };
            recorded.push(Recorded { envelope, artifacts });
        }
        log(
            &mut ledger,
            "rollout_engine",
            "generation",
            json!({"iteration": iteration, "rollouts": [first, first + per_iteration],
            "policy_version": engine.version, "policy_digest": engine.digest,
            "artifacts": recorded.iter().map(|r| r.envelope.artifacts_hash.clone()).collect::<Vec<_>>()}),
        )?;
        log(
            &mut ledger,
            "verifier",
            "reward",
            json!({"iteration": iteration, "verifier": verifier.name(), "protocol_hash": verifier.protocol_hash(), "rewards": rewards}),
        )?;
        let reference_now = digest(&reference_params);
        inject(&faults, &mut recorded, &mut store, &tokenizer, &reference_now)?;
        let envelopes: Vec<Envelope> = recorded.iter().map(|r| r.envelope.clone()).collect();
        log(
            &mut ledger,
            "materializer",
            "envelope",
            json!({"iteration": iteration,
            "envelopes": envelopes.iter().map(|e| blake3::hash(serde_json::to_string(e).unwrap_or_default().as_bytes()).to_hex().to_string()).collect::<Vec<_>>()}),
        )?;
        let t = Instant::now();
        let before = digest(&params);
        let hashing_before = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut update_stats = Vec::new();
        let mut guard_record = IterationGuard { decision: Decision::Allow, codes: Vec::new(), rollouts: None };
        failpoint("prepared", iteration);
        for _ in 0..p.updates_per_iteration {
            let lr = learning_rate(updates, total_updates, p.lr, p.warmup_ratio, p.min_lr_ratio);
            let update: UpdateBatch = match p.guard {
                GuardSwitch::On => {
                    let ctx = GuardContext {
                        mode: match p.protocol {
                            GuardProtocol::Strict => ProtocolMode::StrictOnPolicy,
                            GuardProtocol::Bounded => {
                                ProtocolMode::BoundedOffPolicy { max_lag: (p.updates_per_iteration - 1) as u64 }
                            }
                        },
                        trainer_policy_version: updates as u64,
                        tokenizer_hash: tokenizer_hash.clone(),
                        artifacts: &store,
                        trainable_splits: BTreeSet::from([orchestrate_core::data::Split::Train]),
                        prompt_registry: &registry,
                        verifiers: &verifiers,
                        verifier_aliases: &aliases,
                        canary: Some(canary),
                    };
                    let binding = json!({"rewards": rewards, "advantages": advantages, "group_size": p.group_size, "reference": reference_now});
                    match materialize(&envelopes, &ctx, &digest(&params), &binding, &mut ledger) {
                        Ok((batch, handle)) => {
                            log(
                                &mut ledger,
                                "materializer",
                                "decision",
                                json!({"iteration": iteration, "decision": "allow", "batch": handle.batch_hash()}),
                            )?;
                            log(
                                &mut ledger,
                                "control",
                                "update_prepared",
                                json!({"iteration": iteration, "update": updates, "nonce": handle.nonce()}),
                            )?;
                            // What the optimizer step takes exists only once the handle is spent.
                            handle.spend(batch, &mut ledger)?
                        }
                        Err(GuardError::Rejected(refused)) => {
                            let decision = refused
                                .iter()
                                .map(|(_, v)| v.decision)
                                .max()
                                .unwrap_or(orchestrate_core::guard::Decision::Reject);
                            guard_record =
                                IterationGuard { decision, codes: codes_of(&refused), rollouts: Some(refused.len()) };
                            detections.push(Detection { iteration, decision, codes: codes_of(&refused) });
                            eprintln!("guard: iteration {iteration} batch {:?}: {:?}", decision, codes_of(&refused));
                            log(
                                &mut ledger,
                                "materializer",
                                "decision",
                                json!({"iteration": iteration, "decision": decision, "codes": codes_of(&refused)}),
                            )?;
                            log(
                                &mut ledger,
                                "control",
                                "update_aborted",
                                json!({"iteration": iteration, "update": updates}),
                            )?;
                            break;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                GuardSwitch::Off => {
                    if !faults.is_empty() {
                        bad_updates += 1;
                    }
                    // Unvalidated, but never a substitute: an envelope whose artifact
                    // the store does not hold stops the run.
                    let rollouts: Vec<TokenArtifacts> = envelopes
                        .iter()
                        .map(|e| {
                            store.get(&e.artifacts_hash).cloned().ok_or_else(|| {
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
                    UpdateBatch::unguarded(
                        rollouts,
                        &mut ledger,
                        &lineage,
                        &json!({"iteration": iteration, "update": updates, "guard": "off"}),
                    )?
                }
            };
            update_stats.push(grpo_update(
                &policy,
                &reference,
                &params,
                &mut adam,
                &update,
                advantages.clone(),
                p.group_size,
                &hyper,
                lr,
            )?);
            log(&mut ledger, "control", "update_applied", json!({"iteration": iteration, "update": updates}))?;
            updates += 1;
            log(&mut ledger, "control", "update_committed", json!({"iteration": iteration, "update": updates - 1}))?;
        }
        let optimization_seconds = t.elapsed().as_secs_f64();
        failpoint("applied", iteration);
        let t = Instant::now();
        let after = digest(&params);
        let hashing_seconds = hashing_before + t.elapsed().as_secs_f64();
        let mean_reward = rewards.iter().sum::<f64>() / rewards.len() as f64;
        history.push(GrpoIteration {
            iteration,
            prompts: chosen.iter().map(|&i| pool[i].id.clone()).collect(),
            rollouts: [first, first + per_iteration],
            mean_reward,
            rewards,
            zero_variance_groups: zero_variance,
            zero_variance_fraction: zero_variance as f64 / p.prompts_per_iteration as f64,
            finish: FinishCounts { eos: finishes.0, length: finishes.1 },
            behavior_max_gap: behavior_gap,
            updates: update_stats.clone(),
            weights_changed: before != after,
            guard: guard_record,
            canary,
            faults: faults.iter().map(|f| format!("{:?}", f.family)).collect(),
            costs: IterationCosts {
                generation_seconds,
                behavior_verification_seconds: verification_seconds,
                optimization_with_reference_seconds: optimization_seconds,
                state_hashing_seconds: hashing_seconds,
                loop_seconds: t_loop.elapsed().as_secs_f64(),
            },
        });
        // A boundary of the whole run is a committed checkpoint, whether or not this
        // process stops there: an interrupt at a boundary commits it exactly as the
        // continuous run does, so both lineages log the same events. Only the run's
        // last iteration has none (the final state is the node's output).
        if p.checkpoint_every > 0 && (iteration + 1) % p.checkpoint_every == 0 && iteration + 1 < p.iterations {
            // The digests this iteration already took (weights after its updates, reference).
            let meta = snapshot_at!(iteration + 1, after.clone(), reference_now.clone());
            wal.checkpoint(&params, &adam, &meta, iteration)?;
            log(
                &mut ledger,
                "control",
                "update_committed",
                json!({"iteration": iteration, "checkpoint": iteration + 1}),
            )?;
        }
        // No update ran (the guard refused the batch): there is no KL to report.
        let kl = update_stats.last().map_or("- (no update)".to_string(), |s| format!("{:.3e}", s.kl));
        eprintln!(
            "grpo iteration {iteration}: mean reward {mean_reward:.3}, zero-variance groups {zero_variance}/{}, kl {kl}",
            p.prompts_per_iteration,
        );
        // The live progress line `orchestrate run` shows for this node.
        eprintln!(
            "{}iteration {}/{}  mean reward {mean_reward:.3}  KL {}",
            orchestrate_core::exec::report::PROGRESS_PREFIX,
            iteration + 1,
            p.iterations,
            update_stats.last().map_or("-".to_string(), |s| format!("{:.2e}", s.kl))
        );
    }
    let reference_now = digest(&reference_params);
    if reference_now != reference_digest {
        bail!("the reference model changed during training");
    }
    let meta = snapshot_at!(stop, digest(&params), reference_now);
    write_outputs(job, &policy, model_dir, &params, &adam, &meta)?;
    // The node's outputs are complete: its recovery checkpoints are no longer needed.
    wal.clear();
    Ok(())
}

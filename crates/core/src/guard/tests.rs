//! Every code has a case that triggers it and a near-miss that does not.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::data::verifier::{StockArithmetic, Verifier};

struct World {
    env: Envelope,
    artifacts: BTreeMap<String, TokenArtifacts>,
    registry: BTreeMap<String, String>,
    verifiers: VerifierRegistry,
    aliases: BTreeMap<String, String>,
    mode: ProtocolMode,
    trainer_version: u64,
    canary: Option<Canary>,
}

fn binding(rewards: Vec<f64>, group_size: usize) -> UpdateBinding {
    UpdateBinding { advantages: vec![0.0; rewards.len()], rewards, group_size, reference: "ref".into() }
}

fn world() -> World {
    let a = TokenArtifacts {
        prompt_ids: vec![1, 2, 3, 4],
        response_ids: vec![7, 8, 2],
        old_logprobs: vec![-0.1, -0.2, -0.3],
        mask_start: 4,
        mask_len: 3,
    };
    let hash = a.hash();
    let env = Envelope {
        rollout_id: 0,
        prompt_id: "train-0001".into(),
        split: Split::Train,
        artifacts_hash: hash.clone(),
        tokenizer_hash: "tok".into(),
        behavior_policy_version: 5,
        behavior_policy_digest: "pol5".into(),
        scorer_policy_digest: "pol5".into(),
        off_policy_correction: false,
        reward: RewardRef { verifier: "stock_arithmetic_v1".into(), protocol_hash: StockArithmetic.protocol_hash() },
        events: vec![
            EventRef { kind: EventKind::Generation, seq: 1, policy_version: 5 },
            EventRef { kind: EventKind::Scoring, seq: 2, policy_version: 5 },
            EventRef { kind: EventKind::Reward, seq: 3, policy_version: 5 },
        ],
    };
    World {
        registry: [("train-0001".to_string(), content_hash(&a.prompt_ids))].into(),
        artifacts: [(hash, a)].into(),
        env,
        verifiers: VerifierRegistry::builtin(),
        aliases: [("stock_v1".to_string(), "stock_arithmetic_v1".to_string())].into(),
        mode: ProtocolMode::StrictOnPolicy,
        trainer_version: 5,
        canary: Some(Canary { drift: 0.0, baseline: 0.0 }),
    }
}

fn check(w: &World) -> Verdict {
    let ctx = GuardContext {
        mode: w.mode,
        trainer_policy_version: w.trainer_version,
        tokenizer_hash: "tok".into(),
        artifacts: &w.artifacts,
        trainable_splits: BTreeSet::from([Split::Train, Split::Pretrain]),
        prompt_registry: &w.registry,
        verifiers: &w.verifiers,
        verifier_aliases: &w.aliases,
        canary: w.canary,
    };
    validate(&w.env, &ctx)
}

/// Replaces the artifacts with `f(artifacts)` and points the envelope at them.
fn with_artifacts(w: &mut World, f: impl FnOnce(&mut TokenArtifacts)) {
    let mut a = w.artifacts.values().next().unwrap().clone();
    f(&mut a);
    let h = a.hash();
    w.artifacts = [(h.clone(), a)].into();
    w.env.artifacts_hash = h;
}

#[test]
fn the_canonical_trajectory_is_allowed() {
    assert_eq!(check(&world()), Verdict { decision: Decision::Allow, codes: vec![] });
}

fn expect(w: &World, code: Code) {
    let v = check(w);
    assert!(v.codes.contains(&code), "expected {} in {:?}", code.id(), v.codes);
    assert_eq!(v.decision, code.decision().max(v.decision));
    assert_ne!(v.decision, Decision::Allow);
}

fn allowed(w: &World) {
    assert_eq!(check(w).decision, Decision::Allow, "{:?}", check(w).codes);
}

#[test]
fn p004_stale_policy_in_strict_mode() {
    let mut w = world();
    w.trainer_version = 6;
    expect(&w, Code::P004StalePolicyStrict);
    w.trainer_version = 5;
    allowed(&w);
}

#[test]
fn p005_and_p006_in_bounded_off_policy_mode() {
    let mut w = world();
    w.mode = ProtocolMode::BoundedOffPolicy { max_lag: 2 };
    w.trainer_version = 8; // lag 3 > 2
    w.env.off_policy_correction = true;
    expect(&w, Code::P005PolicyLagOverBound);
    w.trainer_version = 7; // lag exactly at the bound, corrected: allowed
    allowed(&w);
    w.env.off_policy_correction = false;
    expect(&w, Code::P006MissingOffPolicyCorrection);
}

#[test]
fn p007_and_l005_on_reordered_events() {
    let mut w = world();
    w.env.events[1].seq = 4; // scoring after the reward
    expect(&w, Code::P007EventOrderViolation);
    let mut w = world();
    w.env.events.push(EventRef { kind: EventKind::Update, seq: 9, policy_version: 5 });
    allowed(&w); // an update after the reward is the normal lineage
    w.env.events[1] = EventRef { kind: EventKind::Scoring, seq: 2, policy_version: 6 };
    w.env.events.insert(1, EventRef { kind: EventKind::Update, seq: 1, policy_version: 5 });
    w.env.events[0].seq = 0;
    expect(&w, Code::L005ScoringAfterUpdate);
}

#[test]
fn p008_canary_drift_beyond_the_baseline() {
    let mut w = world();
    w.canary = Some(Canary { drift: 0.2, baseline: 0.06 });
    expect(&w, Code::P008CanaryMismatch);
    w.canary = Some(Canary { drift: 0.06, baseline: 0.06 });
    allowed(&w);
}

#[test]
fn t001_a_mutated_artifact() {
    let mut w = world();
    let h = w.env.artifacts_hash.clone();
    w.artifacts.get_mut(&h).unwrap().response_ids[0] = 9; // mutated in place, hash unchanged
    expect(&w, Code::T001ArtifactHashMismatch);
    let mut w = world();
    w.env.artifacts_hash = "0".repeat(64);
    expect(&w, Code::T001ArtifactHashMismatch);
    allowed(&world());
}

#[test]
fn t002_another_tokenizer() {
    let mut w = world();
    w.env.tokenizer_hash = "other".into();
    expect(&w, Code::T002TokenizerMismatch);
}

#[test]
fn m002_and_m004_a_shifted_mask() {
    let mut w = world();
    with_artifacts(&mut w, |a| a.mask_start = 3); // shift by one into the prompt
    expect(&w, Code::M002PromptSelected);
    expect(&w, Code::M004CanonicalMaskMismatch);
    let mut w = world();
    with_artifacts(&mut w, |a| a.mask_len = 2); // shorter, still inside the response
    expect(&w, Code::M004CanonicalMaskMismatch);
    assert!(!check(&w).codes.contains(&Code::M002PromptSelected));
    let mut w = world();
    with_artifacts(&mut w, |a| a.old_logprobs.push(-0.4)); // misbound length
    expect(&w, Code::M004CanonicalMaskMismatch);
}

#[test]
fn l003_old_logprobs_scored_by_another_policy() {
    let mut w = world();
    w.env.scorer_policy_digest = "pol4".into();
    expect(&w, Code::L003ScorerPolicyMismatch);
}

#[test]
fn d003_a_test_prompt_in_an_update() {
    let mut w = world();
    w.env.split = Split::Test;
    expect(&w, Code::D003SplitOverlap);
    w.env.split = Split::Pretrain;
    allowed(&w);
}

#[test]
fn d004_prompt_content_substituted_under_the_same_id() {
    let mut w = world();
    with_artifacts(&mut w, |a| a.prompt_ids[1] = 99);
    let v = check(&w);
    assert!(v.codes.contains(&Code::D004PromptContentMismatch), "{v:?}");
}

#[test]
fn r006_and_r008_reward_identity() {
    let mut w = world();
    w.env.reward.verifier = "stock_v1".into();
    let v = check(&w);
    assert_eq!(v, Verdict { decision: Decision::Quarantine, codes: vec![Code::R006EvaluatorAlias] });
    let mut w = world();
    w.env.reward.verifier = "homemade".into();
    expect(&w, Code::R008RewardVerifierUnregistered);
    let mut w = world();
    w.env.reward.protocol_hash = "0".repeat(64);
    expect(&w, Code::R008RewardVerifierUnregistered);
}

#[test]
fn a_non_allowed_batch_mints_no_handle_and_an_allowed_one_mints_one_use() {
    let dir = tempfile::tempdir().unwrap();
    let ws = crate::store::Workspace::open(dir.path()).unwrap();
    let mut index = Ledger::open(&ws).unwrap();
    let w = world();
    let ctx = materialize_ctx(&w);
    let mut bad = w.env.clone();
    bad.tokenizer_hash = "other".into();
    let err =
        materialize(&[w.env.clone(), bad], &ctx, "pol5", &binding(vec![1.0], 1), &mut index).unwrap_err().to_string();
    assert!(err.contains("rejected before backward") && err.contains("T002_TOKENIZER_MISMATCH"), "{err}");
    let bound = binding(vec![1.0], 1);
    let (batch, handle) = materialize(std::slice::from_ref(&w.env), &ctx, "pol5", &bound, &mut index).unwrap();
    // The handle is bound to the rewards and group layout too.
    let (other, _) =
        materialize(std::slice::from_ref(&w.env), &ctx, "pol5", &binding(vec![0.0], 1), &mut index).unwrap();
    assert_ne!(other.batch_hash(), batch.batch_hash());
    assert_eq!(batch.rollouts()[0].response_ids, vec![7, 8, 2]);
    assert_eq!(handle.batch_hash(), batch.batch_hash());
    let nonce = handle.nonce().to_string();
    let update = handle.spend(batch, &mut index).unwrap();
    assert_eq!(update.rollouts()[0].response_ids, vec![7, 8, 2]);
    assert!(matches!(update.authority(), Authority::Validated { nonce: n, .. } if *n == nonce));
    // The handle is gone (moved); its nonce cannot be spent again either.
    assert!(!index.consume_nonce(&nonce).unwrap());
}

/// What `materialize` checks against in these tests: the world's registries, no canary.
fn materialize_ctx(w: &World) -> GuardContext<'_> {
    GuardContext {
        mode: w.mode,
        trainer_policy_version: 5,
        tokenizer_hash: "tok".into(),
        artifacts: &w.artifacts,
        trainable_splits: BTreeSet::from([Split::Train]),
        prompt_registry: &w.registry,
        verifiers: &w.verifiers,
        verifier_aliases: &w.aliases,
        canary: None,
    }
}

#[test]
fn a_handle_spent_on_another_batch_than_its_own_authorizes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = Ledger::open_at(&dir.path().join("guard.sqlite")).unwrap();
    let w = world();
    let ctx = materialize_ctx(&w);
    let (mine, handle) =
        materialize(std::slice::from_ref(&w.env), &ctx, "pol5", &binding(vec![1.0], 1), &mut index).unwrap();
    let (other, _) =
        materialize(std::slice::from_ref(&w.env), &ctx, "pol5", &binding(vec![1.0], 2), &mut index).unwrap();
    let nonce = handle.nonce().to_string();
    assert!(matches!(handle.spend(other, &mut index), Err(GuardError::OtherBatch { .. })));
    drop(mine);
    // Refused before the nonce was touched: nothing was spent.
    assert!(index.consume_nonce(&nonce).unwrap());
}

#[test]
fn an_unguarded_update_batch_is_on_the_guard_log_before_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let mut index = Ledger::open_at(&dir.path().join("guard.sqlite")).unwrap();
    let w = world();
    let rollouts: Vec<TokenArtifacts> = w.artifacts.values().cloned().collect();
    let batch = UpdateBatch::unguarded(rollouts, &mut index, "lineage-a", 3, 0).unwrap();
    assert_eq!(batch.authority(), &Authority::Unguarded);
    let logged = index.events("lineage-a").unwrap();
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0].kind, UNGUARDED_EVENT);
    // Typed: it reads back as the unguarded update it recorded.
    let event = events::GuardEvent::parse(&logged[0].producer, &logged[0].kind, &logged[0].payload).unwrap();
    let expected = events::Unguarded { iteration: 3, update: 0, guard: events::GuardOff::Off };
    assert_eq!(event, events::GuardEvent::Control(events::ControlEvent::UpdateUnguarded(expected)));
}

#[test]
fn restarting_a_chain_sets_the_superseded_attempt_aside_whole_and_keeps_both_verifiable() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open_at(&dir.path().join("guard.sqlite")).unwrap();
    let sync = |ledger: &mut Ledger, i: u64| {
        events::append(ledger, "L", "control", "sync", &format!(r#"{{"version":{i}}}"#)).unwrap();
    };
    for i in 0..5 {
        sync(&mut ledger, i);
    }
    assert_eq!(ledger.restart_chain("L", 5).unwrap(), None, "nothing past the kept events");
    // A resume from a state that counted 3 events: the 2 after them were a superseded attempt's.
    assert_eq!(ledger.restart_chain("L", 3).unwrap().as_deref(), Some("L~1"));
    assert_eq!((ledger.events("L").unwrap().len(), ledger.events("L~1").unwrap().len()), (3, 5));
    sync(&mut ledger, 3);
    for lineage in ["L", "L~1"] {
        assert_eq!(events::verify(&ledger, lineage).unwrap(), None, "{lineage} verifies");
    }
    // A deliberate re-run starts over; the next attempt goes beside the first.
    assert_eq!(ledger.restart_chain("L", 0).unwrap().as_deref(), Some("L~2"));
    assert!(ledger.events("L").unwrap().is_empty());
    assert_eq!(ledger.events("L~2").unwrap().len(), 4);
}

/// (Issue #35.) The typed binding covers what the `json!` binding covered, in
/// the same canonical bytes: batch hashes (and the decision events holding
/// them) are unchanged.
#[test]
fn the_typed_binding_hashes_as_the_untyped_one_did() {
    let w = world();
    let rollouts = vec![w.artifacts.values().next().unwrap().clone()];
    let typed = binding(vec![1.0, 0.0], 2);
    let bound = serde_json::to_value(Bound { rollouts: &rollouts, binding: &typed, policy: "pol5" }).unwrap();
    let before = serde_json::json!({
        "rollouts": rollouts,
        "binding": {"rewards": [1.0, 0.0], "advantages": [0.0, 0.0], "group_size": 2, "reference": "ref"},
        "policy": "pol5",
    });
    assert_eq!(canonical_json(&bound), canonical_json(&before));
}

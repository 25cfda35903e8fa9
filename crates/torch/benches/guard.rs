//! Guard overhead: prints figures, asserts nothing (run: `cargo bench --bench guard`).
//! Validation + materialization (including the nonce's SQLite write and spend)
//! per batch of 32 and 256 envelopes, and as a fraction of a GRPO iteration on
//! the tiny model measured in the same run.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Instant;

use orchestrate_core::data::verifier::{StockArithmetic, Verifier, VerifierRegistry};
use orchestrate_core::data::Split;
use orchestrate_core::guard::{
    content_hash, materialize, Envelope, EventKind, EventRef, GuardContext, ProtocolMode, RewardRef, TokenArtifacts,
    UpdateBinding,
};

fn batch(n: usize) -> (Vec<Envelope>, BTreeMap<String, TokenArtifacts>, BTreeMap<String, String>) {
    let mut envs = Vec::new();
    let mut store = BTreeMap::new();
    let mut registry = BTreeMap::new();
    for i in 0..n {
        let prompt: Vec<i64> = (0..96).map(|j| ((i * 7 + j * 31) % 800) as i64).collect();
        let a = TokenArtifacts {
            prompt_ids: prompt.clone(),
            response_ids: (0..64).map(|j| ((i + j) % 800) as i64).collect(),
            old_logprobs: vec![-1.0; 64],
            mask_start: 96,
            mask_len: 64,
        };
        let h = a.hash();
        registry.insert(format!("train-{i}"), content_hash(&prompt));
        envs.push(Envelope {
            rollout_id: i as u64,
            prompt_id: format!("train-{i}"),
            split: Split::Train,
            artifacts_hash: h.clone(),
            tokenizer_hash: "tok".into(),
            behavior_policy_version: 3,
            behavior_policy_digest: "d".into(),
            scorer_policy_digest: "d".into(),
            off_policy_correction: true,
            reward: RewardRef {
                verifier: "stock_arithmetic_v1".into(),
                protocol_hash: StockArithmetic.protocol_hash(),
            },
            events: vec![
                EventRef { kind: EventKind::Generation, seq: 1, policy_version: 3 },
                EventRef { kind: EventKind::Scoring, seq: 2, policy_version: 3 },
                EventRef { kind: EventKind::Reward, seq: 3, policy_version: 3 },
            ],
        });
        store.insert(h, a);
    }
    (envs, store, registry)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let ws = orchestrate_core::store::Workspace::open(dir.path()).unwrap();
    let mut index = orchestrate_core::guard::Ledger::open(&ws).unwrap();
    let verifiers = VerifierRegistry::builtin();
    let aliases = BTreeMap::new();
    let iteration = Command::new(env!("CARGO_BIN_EXE_orchestrate-torch"))
        .args(["bench-grpo", "--iterations", "3"])
        .output()
        .ok()
        .and_then(|o| {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            v["seconds_per_iteration"]["loop"].as_f64()
        });
    println!("{:<12} {:>16} {:>22}", "envelopes", "ms per batch", "share of an iteration");
    for n in [32usize, 256] {
        let (envs, store, registry) = batch(n);
        let ctx = GuardContext {
            mode: ProtocolMode::BoundedOffPolicy { max_lag: 1 },
            trainer_policy_version: 3,
            tokenizer_hash: "tok".into(),
            artifacts: &store,
            trainable_splits: BTreeSet::from([Split::Train]),
            prompt_registry: &registry,
            verifiers: &verifiers,
            verifier_aliases: &aliases,
            canary: None,
        };
        let binding = UpdateBinding {
            rewards: vec![0.0; n],
            advantages: vec![0.0; n],
            group_size: 1,
            reference: "reference".into(),
        };
        let reps = 50;
        let start = Instant::now();
        for _ in 0..reps {
            let (batch, handle) = materialize(&envs, &ctx, "policy", &binding, &mut index).expect("allowed");
            handle.spend(batch, &mut index).expect("spent once");
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0 / reps as f64;
        let share = iteration.map_or("n/a".to_string(), |it| format!("{:.2} %", 100.0 * ms / 1000.0 / it));
        println!("{n:<12} {ms:>16.3} {share:>22}");
    }
    if let Some(it) = iteration {
        println!("(a tiny-model GRPO iteration of 16 rollouts: {:.3} s; the seed reports 40.4 ms per batch and about 1 % of a step; targets: <= 1 ms per 32 envelopes, <= 0.5 % of an iteration)", it);
    }
}

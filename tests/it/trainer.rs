//! SFT and GRPO through the binaries on a small budget: interrupt + resume
//! equals continuous bit for bit, the reference never changes, and a rollout
//! is never consumed twice.

use crate::common;

use common::{nodes_with, stderr, stdout, Project};

const SPEC: &str = include_str!("../fixtures/train-small.yaml");

fn json_output(p: &Project, output: &str) -> serde_json::Value {
    let out = p.run(&["path", "train.yaml", output]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = stdout(&out).trim().to_string();
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn interrupt_and_resume_equal_continuous_and_the_reference_never_changes() {
    let p = Project::new();
    p.write("train.yaml", SPEC);
    let ev = p.run_json(&["train.yaml"], 0);
    assert!(nodes_with(&ev, "node_failed").is_empty(), "{ev:?}");
    for check in ["warmstart-check:report", "grpo-check:report"] {
        let report = json_output(&p, check);
        assert_eq!(report["identical"], true, "{check}: {report}");
        assert!(report["tensors"].as_u64().unwrap() > 0);
    }
    let m = json_output(&p, "grpo@mode=continuous:metrics");
    // 3 iterations × 4 prompts × 4 responses, 2 updates each.
    assert_eq!(m["rollouts_consumed"], 48);
    assert_eq!(m["updates"], 6);
    assert_eq!(m["history"].as_array().unwrap().len(), 3);
    assert_eq!(m["reference_unchanged"], true);
    // The guard's sealed event log: per iteration sync, generation, reward, envelope,
    // then per update decision, prepared, applied, committed: 3 × (4 + 2 × 4).
    assert_eq!(m["guard"]["event_log"], serde_json::json!({"events": 36}));
    assert_eq!(m["guard"]["detections"], serde_json::json!([]));
    assert_eq!(
        m["reference_digest"], m["identity"]["initial_model_digest"],
        "the reference is the starting policy, unchanged"
    );
    for h in m["history"].as_array().unwrap() {
        assert!(h["behavior_max_gap"].as_f64().unwrap() <= 2e-4);
        let fraction = h["zero_variance_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&fraction));
        assert!(h.get("costs").is_none(), "no duration in a hashed output: {h}");
    }
    // The costs are in the node's record: each iteration's, as `status` shows them.
    let status: serde_json::Value = serde_json::from_str(&stdout(&p.run(&["status", "--json"]))).unwrap();
    let node = status["nodes"].as_array().unwrap().iter().find(|n| n["node_id"] == "grpo@mode=continuous").unwrap();
    let iterations = node["costs"]["iterations"].as_object().unwrap();
    assert_eq!(iterations.keys().collect::<Vec<_>>(), ["0", "1", "2"], "{node}");
    for c in iterations.values() {
        for cost in [
            "generation_seconds",
            "behavior_verification_seconds",
            "optimization_with_reference_seconds",
            "state_hashing_seconds",
            "loop_seconds",
        ] {
            assert!(c[cost].as_f64().unwrap() >= 0.0, "{cost}");
        }
    }
    let interrupted = json_output(&p, "grpo@mode=interrupt:metrics");
    assert_eq!(interrupted["next_iteration"], 1);
    assert_eq!(interrupted["complete"], false);
    let sft = json_output(&p, "warmstart@mode=continuous:metrics");
    // 16 warm-start examples, batches of 4, 2 epochs.
    assert_eq!(sft["updates"], 8);
    assert_eq!(sft["validation_history"].as_array().unwrap().len(), 2);
    // A second identical run is all cache hits.
    let again = p.run_json(&["train.yaml"], 0);
    assert_eq!(nodes_with(&again, "cache_hit").len(), 11);
}

#[test]
fn a_second_resume_of_the_same_interrupt_may_not_consume_its_rollouts_again() {
    let p = Project::new();
    let second = "  grpo-resume-again:\n    op: train.grpo\n    inputs: {model: 'warmstart@mode=continuous:model', pages: 'data:pages.train', labels: 'data:labels.train', resume_from: 'grpo@mode=interrupt:state'}\n    params: {iterations: 3, interrupt_at: 2, max_new_tokens: 16, lr: 1e-4, mode: resume}\n";
    p.write("train.yaml", &format!("{SPEC}{second}"));
    let ev = p.run_json(&["train.yaml", "--jobs", "1"], 1);
    let failed: Vec<&serde_json::Value> = ev.iter().filter(|e| e["event"] == "node_failed").collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let error = failed[0]["error"].as_str().unwrap();
    // Same run identity (interrupt_at is ignored when resuming), another node key.
    assert!(failed[0]["node"].as_str().unwrap().starts_with("grpo-resume"));
    assert!(error.contains("was already consumed by node key") && error.contains("never consumed twice"), "{error}");
}

#[test]
fn resuming_with_other_settings_is_refused() {
    let p = Project::new();
    p.write(
        "train.yaml",
        &SPEC.replace(
            "params: {branch: warmstart, epochs: 2, batch_size: 4, lr: 1e-3, mode: resume}",
            "params: {branch: warmstart, epochs: 2, batch_size: 4, lr: 2e-3, mode: resume}",
        ),
    );
    let ev = p.run_json(&["train.yaml"], 1);
    let failed =
        ev.iter().find(|e| e["event"] == "node_failed" && e["node"] == "warmstart-resume").expect("the resume fails");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("identity differs"), "{failed}");
    // The worker's typed result: the failure's kind, and its message once
    // (not again among the log's last lines).
    assert!(error.contains("orchestrate-torch failed (input)"), "{error}");
    assert_eq!(error.matches("identity differs").count(), 1, "{error}");
}

#[test]
fn an_interrupt_point_outside_the_run_is_a_spec_error() {
    let p = Project::new();
    p.write(
        "train.yaml",
        &SPEC.replace(
            "params: {iterations: 3, interrupt_at: 1, max_new_tokens: 16, lr: 1e-4}",
            "params: {iterations: 3, interrupt_at: 3, max_new_tokens: 16, lr: 1e-4}",
        ),
    );
    let out = p.run(&["validate", "train.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("params.interrupt_at: must be in 1..3"), "{}", stderr(&out));
}

/// The main profile's shape, scaled down: the interrupt falls on a checkpoint
/// boundary (100 iterations, checkpoint every 10, interrupt at 40 there; 4, 2
/// and 2 here). The interrupt's final checkpoint is a committed one, so the
/// interrupted + resumed lineage logs exactly the events the continuous one does.
#[test]
fn an_interrupt_on_a_checkpoint_boundary_resumes_to_the_continuous_event_log() {
    let p = Project::new();
    let spec = SPEC.replace(
        "params: {iterations: 3, interrupt_at: 1, max_new_tokens: 16, lr: 1e-4",
        "params: {iterations: 4, interrupt_at: 2, checkpoint_every: 2, max_new_tokens: 16, lr: 1e-4",
    );
    assert_eq!(spec.matches("checkpoint_every: 2").count(), 2, "both GRPO nodes get the boundary shape");
    p.write("train.yaml", &spec);
    let ev = p.run_json(&["train.yaml"], 0);
    assert!(nodes_with(&ev, "node_failed").is_empty(), "{ev:?}");
    assert_eq!(json_output(&p, "grpo-check:report")["identical"], true);
    let continuous = json_output(&p, "grpo@mode=continuous:metrics");
    let resumed = json_output(&p, "grpo-resume:metrics");
    // 4 iterations × (4 + 2 updates × 4 events), plus the one committed checkpoint
    // strictly inside the run (after iteration 2 of 4; the last has none).
    assert_eq!(continuous["guard"]["event_log"]["events"], 4 * (4 + 2 * 4) + 1);
    assert_eq!(resumed["guard"]["event_log"], continuous["guard"]["event_log"]);
    let interrupted = json_output(&p, "grpo@mode=interrupt:metrics");
    assert_eq!(interrupted["next_iteration"], 2);
}

/// A GRPO node whose key changes but whose run identity does not (here its own
/// `threads:`, keyed as part of the environment; an op version bump does the
/// same) is a new trajectory: it runs again in the same workspace, in a lineage
/// of its own, instead of being refused for consuming the rollouts of the run it
/// replaces.
#[test]
fn a_rekeyed_grpo_node_runs_again_in_the_same_workspace() {
    let p = Project::new();
    p.write("train.yaml", SPEC);
    p.run_json(&["train.yaml"], 0);
    let first = json_output(&p, "grpo@mode=continuous:metrics");
    // The resume too, so the resume check compares runs of one thread count.
    let set = ["--set", "nodes.grpo.threads=2"];
    let ev = p.run_json(&["train.yaml", set[0], set[1], "--set", "nodes.grpo-resume.threads=2"], 0);
    assert!(nodes_with(&ev, "node_finished").contains(&"grpo@mode=continuous".to_string()), "{ev:?}");
    let out = p.run(&["path", "train.yaml", "grpo@mode=continuous:metrics", set[0], set[1]]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(stdout(&out).trim()).unwrap()).unwrap();
    assert_eq!(first["identity"], again["identity"], "the same run identity");
    assert_ne!(first["lineage"], again["lineage"], "a lineage of its own");
    assert_eq!(first["rollouts_consumed"], again["rollouts_consumed"]);
}

/// train-small's data, tokenizer and base model, with pretraining and drill
/// corpora, and one pretraining node that replays drills.
fn mix_spec() -> String {
    let head = SPEC.split("  warmstart:\n").next().unwrap();
    let head = head.replace("warmstart: 16}", "warmstart: 16, pretrain: 10, drills: 5}");
    assert!(head.contains("drills: 5"), "train-small's data params changed: {head}");
    head + "  pretrain:\n    op: train.sft\n    inputs: {model: 'base:model', pages: 'data:pages.pretrain', labels: 'data:labels.pretrain', validation_pages: 'data:pages.validation', validation_labels: 'data:labels.validation', mix_pages: 'data:pages.drills', mix_labels: 'data:labels.drills'}\n    params: {branch: pretrain, epochs: 2, batch_size: 8, lr: 1e-3, mix_examples: 14}\n"
}

/// `mix_examples` replays the first N examples of a second corpus in every
/// epoch of a pretraining stage: 10 statements + 14 of the 20 drills are 24
/// examples, 3 updates of 8 per epoch.
#[test]
fn a_pretraining_stage_replays_the_first_examples_of_a_second_corpus() {
    let p = Project::new();
    let mix = mix_spec();
    p.write("train.yaml", &mix);
    let ev = p.run_json(&["train.yaml"], 0);
    assert!(nodes_with(&ev, "node_failed").is_empty(), "{ev:?}");
    let m = json_output(&p, "pretrain:metrics");
    assert_eq!(m["identity"]["examples"], 24, "{}", m["identity"]);
    assert_eq!(m["identity"]["params"]["mix_examples"], 14);
    assert_eq!(m["updates"], 6);

    // More than the second corpus holds: the node fails and says how many there are.
    p.write("train.yaml", &mix.replace("mix_examples: 14", "mix_examples: 21"));
    let ev = p.run_json(&["train.yaml"], 1);
    let failed = ev.iter().find(|e| e["event"] == "node_failed" && e["node"] == "pretrain").expect("it fails");
    assert!(failed["error"].as_str().unwrap().contains("mix_examples is 21, but the second corpus"), "{failed}");
    assert!(failed["error"].as_str().unwrap().contains("has 20 examples"), "{failed}");

    // Without the second corpus's inputs, or on a protocol branch, the spec does not compile.
    p.write("train.yaml", &mix.replace(", mix_pages: 'data:pages.drills', mix_labels: 'data:labels.drills'", ""));
    let out = p.run(&["validate", "train.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("mix_pages"), "{}", stderr(&out));
    p.write("train.yaml", &mix.replace("branch: pretrain", "branch: sft"));
    let out = p.run(&["validate", "train.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("params.mix_examples: a second corpus is for the pretraining branch only"),
        "{}",
        stderr(&out)
    );
}

/// (Issue #34.) A deliberate re-run (`--force`) of a GRPO node is a new
/// attempt: its sealed event log holds its own events, not the finished
/// attempt's as well (those are set aside), so it ends with the first run's
/// state but for its wall-clock costs, lineage and event count included, and
/// the resume check still passes; so does a forced resume.
#[test]
fn a_forced_grpo_rerun_is_a_new_attempt_and_the_resume_check_still_passes() {
    let p = Project::new();
    p.write("train.yaml", SPEC);
    p.run_json(&["train.yaml"], 0);
    let state = |output: &str| {
        let out = p.run(&["path", "train.yaml", output]);
        orchestrate_core::train::state::read_state(std::path::Path::new(stdout(&out).trim())).unwrap()
    };
    let (continuous, resumed) = (state("grpo@mode=continuous:state"), state("grpo-resume:state"));
    for _ in 0..2 {
        for node in ["grpo@mode=continuous", "grpo-resume"] {
            let ev = p.run_json(&["train.yaml", "--force", node], 0);
            assert!(nodes_with(&ev, "node_finished").contains(&node.to_string()), "{ev:?}");
        }
    }
    assert_eq!(json_output(&p, "grpo@mode=continuous:metrics")["guard"]["event_log"]["events"], 36);
    assert_eq!(json_output(&p, "grpo-resume:metrics")["guard"]["event_log"]["events"], 36);
    for (output, first) in [("grpo@mode=continuous:state", continuous), ("grpo-resume:state", resumed)] {
        let again = state(output);
        let difference = orchestrate_core::train::state::first_difference(&first, &again, &[]);
        assert_eq!(difference, None, "{output}: the forced re-run ends where the first run ended");
    }
    let ev = p.run_json(&["train.yaml", "--force", "grpo-check"], 0);
    assert!(nodes_with(&ev, "node_failed").is_empty(), "{ev:?}");
    assert_eq!(json_output(&p, "grpo-check:report")["identical"], true);
}

/// (Issue #34.) Two fresh workspaces running the same training chain agree on
/// every node's key: the resumes and their checks, the evaluation's score and
/// the results table too. No hashed output holds a wall-clock duration or a
/// memory peak (they are kept in each node's record, beside its outputs), and
/// `eval.generate`'s `policy` label is not keyed (the two name it differently).
#[test]
fn two_fresh_workspaces_agree_on_every_key_of_the_training_chain() {
    let keys = |policy: &str| {
        let p = Project::new();
        let eval = format!(
            "  eval:\n    op: eval.generate\n    inputs: {{model: 'grpo-resume:model', pages: 'data:pages.test'}}\n    params: {{draws: 1, max_new_tokens: 8, policy: {policy}}}\n\
             \x20 score:\n    op: eval.score\n    inputs: {{responses: 'eval:responses', summary: 'eval:summary', labels: 'data:labels.test'}}\n\
             \x20 results:\n    op: results.table\n    inputs: {{evals: ['score:results'], training: ['warmstart@mode=continuous:metrics', 'grpo-resume:metrics']}}\n    params: {{policies: [grpo], runs: [warmstart, grpo]}}\n"
        );
        p.write("train.yaml", &format!("{SPEC}{eval}"));
        let ev = p.run_json(&["train.yaml"], 0);
        let keys: std::collections::BTreeMap<String, String> = ev
            .iter()
            .filter(|e| e["event"] == "node_finished")
            .map(|e| (e["node"].as_str().unwrap().to_string(), e["key"].as_str().unwrap().to_string()))
            .collect();
        // What each process cost is in its node's record, not in its outputs.
        let resumed = json_output(&p, "grpo-resume:metrics");
        assert!(resumed.get("costs").is_none() && resumed["history"][2].get("costs").is_none(), "{resumed}");
        assert!(json_output(&p, "eval:summary").get("generation_seconds").is_none());
        let status = p.run(&["status", "--json"]);
        assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
        let status: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
        let grpo = status["nodes"].as_array().unwrap().iter().find(|c| c["node_id"] == "grpo-resume").unwrap();
        assert!(grpo["costs"]["process"]["seconds"].as_f64().unwrap() > 0.0, "{grpo}");
        // The resumed process ran iterations 1 and 2; iteration 0 was the interrupted one's.
        let ran: Vec<&String> = grpo["costs"]["iterations"].as_object().unwrap().keys().collect();
        assert_eq!(ran, ["1", "2"], "{grpo}");
        keys
    };
    let (first, second) = (keys("resumed"), keys("grpo"));
    assert_eq!(first.len(), 14, "{first:?}");
    for (node, key) in &first {
        assert_eq!(Some(key), second.get(node), "node {node} has another key in the second workspace");
    }
}

/// (Issue #34.) `run --check` re-executes training nodes and they reproduce
/// every output byte for byte: the model, the state and the metrics (which
/// hold no wall-clock duration; those are in the record).
#[test]
fn run_check_reproduces_sft_grpo_and_their_resumes() {
    let p = Project::new();
    p.write("train.yaml", SPEC);
    p.run_json(&["train.yaml"], 0);
    let out = p.run(&["run", "train.yaml", "--check", "warmstart-resume", "grpo@mode=continuous", "grpo-resume"]);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    for node in ["warmstart-resume", "grpo@mode=continuous", "grpo-resume"] {
        assert!(text.contains(&format!("reproduced  {node} ")), "{text}");
    }
    assert!(text.contains("checked 3 node(s): 3 reproduced, 0 did not"), "{text}");
}

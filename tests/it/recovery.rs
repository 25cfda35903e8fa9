//! The update WAL: a worker killed at any phase of an update recovers, on
//! re-run, from the last committed checkpoint and ends exactly where an
//! uncrashed run ends.

use crate::common;

use common::{stderr, stdout, Project};

fn spec() -> String {
    common::tiny_spec(
        "recovery",
        "  grpo:
    op: train.grpo
    inputs: {model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train'}
    params: {iterations: 4, max_new_tokens: 8, lr: 1.0e-4, checkpoint_every: 1}
",
    )
}

fn final_state(p: &Project) -> orchestrate_core::train::state::StateFile {
    let out = p.run(&["path", "spec.yaml", "grpo:state"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    orchestrate_core::train::state::read_state(std::path::Path::new(stdout(&out).trim())).unwrap()
}

/// The object a node's rollouts were stored as: the hash of every file's bytes.
fn rollouts_object(p: &Project) -> String {
    let out = p.run(&["path", "spec.yaml", "grpo:rollouts"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = std::path::PathBuf::from(stdout(&out).trim());
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 4, "one file per iteration");
    path.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn a_crash_at_any_update_phase_recovers_to_the_uncrashed_result() {
    let reference = Project::new();
    reference.write("spec.yaml", &spec());
    reference.run_json(&["spec.yaml"], 0);
    let expected = final_state(&reference);
    let expected_rollouts = rollouts_object(&reference);
    for phase in ["prepared", "applied", "checkpointed", "committed"] {
        let p = Project::new();
        p.write("spec.yaml", &spec());
        let crashed =
            p.cmd(&["run", "--json", "spec.yaml"]).env("ORCHESTRATE_FAILPOINT", format!("{phase}@2")).output().unwrap();
        assert_eq!(crashed.status.code(), Some(1), "{phase}: the run fails when the worker dies");
        assert!(
            p.path().join(".orchestrate/checkpoints").is_dir(),
            "{phase}: committed checkpoints remain for recovery"
        );
        p.run_json(&["spec.yaml"], 0);
        // The re-run restored the last committed checkpoint; it did not start over.
        let explain: serde_json::Value =
            serde_json::from_str(&stdout(&p.run(&["explain", "spec.yaml", "grpo", "--json"]))).unwrap();
        let log = std::fs::read_to_string(
            p.path().join(format!(".orchestrate/logs/{}.log", explain["key"].as_str().unwrap())),
        )
        .unwrap();
        let resumed_at = if phase == "committed" { 3 } else { 2 };
        assert!(
            log.contains(&format!("recovered from the committed checkpoint after iteration {resumed_at}")),
            "{phase}: {log}"
        );
        let recovered = final_state(&p);
        let difference =
            orchestrate_core::train::state::first_difference(&expected, &recovered, &["costs", "lineage", "event_log"]);
        assert_eq!(difference, None, "{phase}: recovery must end where the uncrashed run ends");
        // The rollouts of the iterations before the crash were kept with the
        // checkpoint: the output is the uncrashed run's, byte for byte.
        assert_eq!(rollouts_object(&p), expected_rollouts, "{phase}: the rollouts differ from the uncrashed run's");
        // The guard log, the crashed attempt's generations included, names only rollouts the output holds.
        let events = p.run(&["events"]);
        assert_eq!(events.status.code(), Some(0), "{phase}: {}", stderr(&events));
        assert!(
            !p.path().join(".orchestrate/checkpoints").read_dir().unwrap().any(|_| true),
            "{phase}: checkpoints are cleared once the node completes"
        );
    }
}

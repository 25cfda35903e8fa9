//! E1 (fault survival) and E2 (non-inferiority) on the smoke profile (the
//! documented tiny profile takes minutes), with their
//! pre-registered gates; and the E1 guard-on criteria failing on a mislabelled run.

use crate::common;

use std::collections::BTreeMap;

use common::{stderr, stdout, Project};
use serde_json::Value;

fn project_with(spec: &str) -> Project {
    let p = Project::new();
    let root = env!("CARGO_MANIFEST_DIR");
    for f in [format!("experiments/{spec}.yaml"), format!("gates/{spec}.yaml")] {
        p.write(&f, &std::fs::read_to_string(format!("{root}/{f}")).unwrap());
    }
    p
}

fn json_at(p: &Project, spec: &str, output: &str) -> Value {
    let out = p.run(&["path", spec, output, "--profile", "smoke"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(stdout(&out).trim()).unwrap()).unwrap()
}

#[test]
fn e1_guard_on_blocks_both_faults_at_injection_and_guard_off_counts_every_bad_update() {
    let p = project_with("e1-fault-survival");
    let spec = "experiments/e1-fault-survival.yaml";
    let out = p.run(&["run", spec, "--profile", "smoke", "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary = json_at(&p, spec, "summary:summary.json");

    // Each run's figures, recomputed here from its own metrics.
    for (guard, seed) in [("on", 0), ("on", 1), ("off", 0), ("off", 1)] {
        let m = json_at(&p, spec, &format!("e1@guard={guard},seed={seed}:metrics"));
        let run = summary["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["arm"] == guard && r["seed"] == seed)
            .unwrap_or_else(|| panic!("no run {guard}/{seed} in {summary}"));
        let faulted: Vec<u64> = m["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| !h["faults"].as_array().unwrap().is_empty())
            .map(|h| h["iteration"].as_u64().unwrap())
            .collect();
        assert_eq!(faulted.len(), 2, "F3 and F2 each touch one iteration");
        let refused: Vec<u64> = m["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["guard"]["decision"] != "allow")
            .map(|h| h["iteration"].as_u64().unwrap())
            .collect();
        let per_iteration = m["identity"]["params"]["updates_per_iteration"].as_u64().unwrap();
        if guard == "on" {
            assert_eq!(refused, faulted, "the guard refuses exactly the faulted iterations");
            assert_eq!(run["bad_updates_applied"], 0);
            assert_eq!(run["wasted_iterations"], 2);
            // The weights did not move at a refused iteration.
            for h in m["history"].as_array().unwrap() {
                assert_eq!(h["weights_changed"], !faulted.contains(&h["iteration"].as_u64().unwrap()), "{h}");
            }
        } else {
            assert!(refused.is_empty());
            assert_eq!(run["bad_updates_applied"].as_u64().unwrap(), 2 * per_iteration);
            let iterations = m["identity"]["params"]["iterations"].as_u64().unwrap();
            assert_eq!(run["wasted_iterations"].as_u64().unwrap(), iterations - faulted[0]);
        }
    }

    // A guard-off run labelled 'on' fails the guard-on criteria.
    let typed = |v: serde_json::Value| -> orchestrate_core::train::metrics::TrainingMetrics {
        serde_json::from_value(v).expect("metrics of the shared type")
    };
    let off = typed(json_at(&p, spec, "e1@guard=off,seed=0:metrics"));
    let on = typed(json_at(&p, spec, "e1@guard=on,seed=1:metrics"));
    let records = vec![
        orchestrate_core::ops::analysis::run_record("on", &off, None, "ALL").unwrap(),
        orchestrate_core::ops::analysis::run_record("on", &on, None, "ALL").unwrap(),
        orchestrate_core::ops::analysis::run_record("off", &off, None, "ALL").unwrap(),
    ];
    let mislabelled = orchestrate_core::ops::analysis::summarize(&records, Some("off"));
    let gates = orchestrate_core::gate::read_gate_file(&p.path().join("gates/e1-fault-survival.yaml")).unwrap();
    let evidence = BTreeMap::from([("s".to_string(), serde_json::to_value(&mislabelled).unwrap())]);
    let failed: Vec<String> = gates
        .gates
        .iter()
        .map(|g| orchestrate_core::gate::evaluate(g, &evidence, &BTreeMap::new()))
        .filter(|r| !r.passed)
        .map(|r| r.name)
        .collect();
    for must_fail in ["guard-on-arm-is-guarded", "guard-on-zero-bad-updates", "guard-on-detects-every-fault"] {
        assert!(failed.iter().any(|f| f == must_fail), "{must_fail} should fail: {failed:?}");
    }
}

#[test]
fn e2_reports_both_arms_per_seed_and_gates_the_margin() {
    let p = project_with("e2-non-inferiority");
    let spec = "experiments/e2-non-inferiority.yaml";
    let out = p.run(&["run", spec, "--profile", "smoke", "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary = json_at(&p, spec, "summary:summary.json");
    for arm in ["on", "off"] {
        let a = &summary["arms"][arm];
        assert_eq!(a["runs"], 5);
        let mut values = Vec::new();
        for seed in 0..5 {
            let r = json_at(&p, spec, &format!("score@policy={arm},seed={seed}:results"));
            values.push(r["greedy"]["ALL"]["success_rate"].as_f64().unwrap());
        }
        assert_eq!(a["success"]["values"], serde_json::json!(values), "{arm}");
        // `compare --group-by seed` groups the same five scores (label-only axes).
        let out = p.run(&["compare", spec, "--profile", "smoke", "--group-by", "seed", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let g: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let row = g["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["group"] == format!("score@policy={arm}") && r["metric"] == "greedy success ALL")
            .unwrap_or_else(|| panic!("{g:#}"))
            .clone();
        assert_eq!(row["values"], serde_json::json!(values), "{row}");
        assert_eq!(row["n"], 5);
        let mean = values.iter().sum::<f64>() / 5.0;
        assert!((a["success"]["mean"].as_f64().unwrap() - mean).abs() < 1e-12);
        // Step time is no result in the summary (a duration would change every
        // key downstream); `compare --group-by seed` reads it from the records.
        assert!(a.get("step_seconds").is_none(), "{a}");
        let step = g["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["metric"] == "step seconds (unfaulted iterations)"
                    && r["group"].as_str().is_some_and(|g| g.contains(&format!("guard={arm}")))
            })
            .unwrap_or_else(|| panic!("no step time for arm {arm}: {g:#}"));
        assert_eq!(step["n"], 5, "{step}");
        assert!(step["values"].as_array().unwrap().iter().all(|v| v.as_f64().unwrap() > 0.0), "{step}");
        assert!(a["train_reward"]["std"].is_number());
    }
    let diff = summary["arms"]["on"]["success"]["mean"].as_f64().unwrap()
        - summary["arms"]["off"]["success"]["mean"].as_f64().unwrap();
    assert_eq!(summary["versus_baseline"]["on"]["success_difference"].as_f64().unwrap(), diff);
    // Its interval, paired by seed (both arms ran seeds 0..5), brackets it.
    let c = &summary["versus_baseline"]["on"];
    assert_eq!(c["paired_by_seed"], true);
    let (low, high) = (
        c["success_difference_interval"]["low"].as_f64().unwrap(),
        c["success_difference_interval"]["high"].as_f64().unwrap(),
    );
    assert!(low <= diff && diff <= high, "{c}");

    // The margin gate fails when the guard-on arm is worse by more than 1/16.
    let gates = orchestrate_core::gate::read_gate_file(&p.path().join("gates/e2-non-inferiority.yaml")).unwrap();
    let margin = gates.gates.iter().find(|g| g.name == "non-inferior-within-one-sixteenth").unwrap();
    let mut worse = summary.clone();
    let off_mean = summary["arms"]["off"]["success"]["mean"].as_f64().unwrap();
    worse["arms"]["on"]["success"]["mean"] = serde_json::json!(off_mean - 0.07);
    let evidence = BTreeMap::from([("s".to_string(), worse)]);
    assert!(!orchestrate_core::gate::evaluate(margin, &evidence, &BTreeMap::new()).passed);
    let evidence = BTreeMap::from([("s".to_string(), summary)]);
    assert!(orchestrate_core::gate::evaluate(margin, &evidence, &BTreeMap::new()).passed);
}

/// E1 with a persistent fault and a clean arm: every faulted iteration of the
/// guarded runs is refused at injection, every update of the unguarded ones on a
/// faulted batch is counted, the clean arm has no fault, and both the guarded and
/// the clean arm are compared with the unguarded one.
#[test]
fn e1_persistent_fault_has_a_clean_arm_and_compares_every_arm_with_the_unguarded_one() {
    let p = project_with("e1-persistent-fault");
    let root = env!("CARGO_MANIFEST_DIR");
    p.write(
        "experiments/e1-fault-survival.yaml",
        &std::fs::read_to_string(format!("{root}/experiments/e1-fault-survival.yaml")).unwrap(),
    );
    let spec = "experiments/e1-persistent-fault.yaml";
    let out = p.run(&["run", spec, "--profile", "smoke", "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary = json_at(&p, spec, "summary:summary.json");
    let per_iteration = json_at(&p, spec, "e1@guard=off,seed=0:metrics")["identity"]["params"]["updates_per_iteration"]
        .as_u64()
        .unwrap();
    let arms = &summary["arms"];
    assert_eq!(arms["on"]["faults_injected"], 6, "3 faults in each of 2 runs: {arms}");
    assert_eq!(arms["on"]["undetected_faults"], 0);
    assert_eq!(arms["on"]["bad_updates_applied"], 0);
    assert_eq!(arms["off"]["bad_updates_applied"].as_u64().unwrap(), 6 * per_iteration);
    assert_eq!(arms["clean"]["faults_injected"], 0);
    assert_eq!(arms["clean"]["bad_updates_applied"], 0);
    for arm in ["on", "clean"] {
        let c = &summary["versus_baseline"][arm];
        assert!(c["success_difference"].is_number(), "{arm}: {c}");
    }
    assert!(summary["versus_baseline"].get("off").is_none(), "the baseline is not compared with itself");
}

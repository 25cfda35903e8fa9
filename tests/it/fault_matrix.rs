//! The fault matrix end to end: every fault family blocked with its
//! pre-registered codes at the injected iteration, no false rejects, and bad
//! updates counted with the guard off (gates/fault-matrix.yaml).

use crate::common;

use common::{stderr, stdout, Project};

#[test]
fn every_fault_is_blocked_with_its_codes_and_the_normal_run_is_allowed() {
    let p = Project::new();
    let root = env!("CARGO_MANIFEST_DIR");
    for f in ["experiments/fault-matrix.yaml", "gates/fault-matrix.yaml"] {
        p.write(f, &std::fs::read_to_string(format!("{root}/{f}")).unwrap());
    }
    let out = p.run(&["run", "experiments/fault-matrix.yaml"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let path = stdout(&p.run(&["path", "experiments/fault-matrix.yaml", "gates:gates.json"])).trim().to_string();
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 31);
    assert!(results.iter().all(|r| r["passed"] == true), "{report}");
    // The guard-off run records that it ran unguarded.
    let path = stdout(&p.run(&["path", "experiments/fault-matrix.yaml", "guard-off-f3:metrics"])).trim().to_string();
    let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(metrics["guard"]["switch"], "off");
}

#[test]
fn strict_on_policy_refuses_two_updates_per_rollout_set() {
    let p = Project::new();
    let root = env!("CARGO_MANIFEST_DIR");
    let spec = std::fs::read_to_string(format!("{root}/experiments/fault-matrix.yaml"))
        .unwrap()
        .replace("protocol: strict, updates_per_iteration: 1,", "protocol: strict, updates_per_iteration: 2,");
    p.write("experiments/fault-matrix.yaml", &spec);
    p.write("gates/fault-matrix.yaml", &std::fs::read_to_string(format!("{root}/gates/fault-matrix.yaml")).unwrap());
    let out = p.run(&["validate", "experiments/fault-matrix.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("params.protocol: strict on-policy allows one update per rollout set"),
        "{}",
        stderr(&out)
    );
}

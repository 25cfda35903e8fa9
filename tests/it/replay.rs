//! Paired gradient replay on the tiny model: F2, F3 and F4 against the clean batch.

use crate::common;

use common::{stderr, stdout, Project};

#[test]
fn replay_reports_gradient_differences_and_the_guards_verdict_per_fault() {
    let p = Project::new();
    let root = env!("CARGO_MANIFEST_DIR");
    p.write("experiments/replay.yaml", &std::fs::read_to_string(format!("{root}/experiments/replay.yaml")).unwrap());
    let out = p.run(&["run", "experiments/replay.yaml", "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = stdout(&p.run(&["path", "experiments/replay.yaml", "replay:replay.json"])).trim().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    // The report is the shared type, field for field, and its bytes are those
    // of the untyped writer's (keys in name order at every level).
    let typed: orchestrate_core::ops::ReplayReport = serde_json::from_str(&text).unwrap();
    let sorted = serde_json::to_value(&typed).unwrap();
    assert_eq!(serde_json::to_string_pretty(&sorted).unwrap() + "\n", text);
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(r["rewards"].as_str().unwrap().starts_with("constructed"), "constructed rewards are labelled");
    let faults = r["faults"].as_array().unwrap();
    let expected = [
        ("F2", vec!["L003_SCORER_POLICY_MISMATCH"]),
        ("F3", vec!["T001_ARTIFACT_HASH_MISMATCH"]),
        ("F4", vec!["M002_PROMPT_SELECTED", "M004_CANONICAL_MASK_MISMATCH"]),
    ];
    assert_eq!(faults.len(), 3);
    for (f, (family, codes)) in faults.iter().zip(expected) {
        assert_eq!(f["family"], family);
        assert_eq!(f["guard_codes"], serde_json::json!(codes), "{family}");
        let cosine = f["gradient"]["cosine"].as_f64().unwrap_or_else(|| panic!("{family}: {}", f["gradient"]));
        assert!((-1.0..=1.0).contains(&cosine), "{family}: {cosine}");
        assert!(cosine < 1.0 - 1e-6, "{family}: the fault changes the gradient");
        assert!(f["gradient"]["relative_l2"].as_f64().unwrap() > 0.0);
        assert!(f["faulty"]["ratio_max"].as_f64().unwrap() >= 1.0);
    }
    // The clean batch's old log-probs are the behavior log-probs: every ratio is 1.
    assert!((r["clean"]["ratio_mean"].as_f64().unwrap() - 1.0).abs() < 1e-4, "{}", r["clean"]);
}

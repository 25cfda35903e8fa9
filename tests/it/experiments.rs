//! grpo-main.yaml end to end on a small budget (its tiny profile, shrunk), and
//! what a change re-runs.

use crate::common;

use common::{nodes_with, stderr, stdout, Project};

fn project() -> Project {
    let p = Project::new();
    let root = env!("CARGO_MANIFEST_DIR");
    for f in [
        "experiments/grpo-main.yaml",
        "experiments/grpo-group-size.yaml",
        "gates/grpo-main.yaml",
        "tests/fixtures/gates-small.yaml",
    ] {
        p.write(f, &std::fs::read_to_string(format!("{root}/{f}")).unwrap());
    }
    // Next to the spec it extends: relative paths are relative to the spec being run.
    p.write(
        "experiments/grpo-main-small.yaml",
        &std::fs::read_to_string(format!("{root}/tests/fixtures/grpo-main-small.yaml")).unwrap(),
    );
    p
}

const SPEC: &str = "experiments/grpo-main-small.yaml";

fn output_json(p: &Project, output: &str) -> serde_json::Value {
    let out = p.run(&["path", SPEC, output, "--profile", "tiny"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(stdout(&out).trim()).unwrap()).unwrap()
}

#[test]
fn the_main_spec_runs_end_to_end_and_a_grpo_change_reruns_only_grpo_and_descendants() {
    let p = project();
    let out = p.run(&["run", SPEC, "--profile", "tiny"]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("| policy | population | greedy pass@1 | per-draw success"), "the table is printed: {text}");
    for check in ["warmstart-check:report", "sft-check:report", "grpo-check:report"] {
        assert_eq!(output_json(&p, check)["identical"], true, "{check}");
    }
    // Per-draw success counts every draw: 8 problems × 4 draws.
    let score = output_json(&p, "score@policy=grpo:results");
    assert_eq!(score["sample"]["ALL"]["responses"], 32);
    assert_eq!(score["greedy"]["ALL"]["responses"], 8);
    assert_eq!(score["sample"]["ALL"]["problems"], 8);
    let table = output_json(&p, "results:table.json");
    assert_eq!(table["rows"].as_array().unwrap().len(), 9, "3 policies × 3 populations");

    // Only a GRPO parameter changes: data, tokenizer, base, pretrain, warm-start, SFT stay cached.
    // Interrupted and resumed runs must agree on it too, or the resume is (rightly) refused.
    let ev = p.run_json(
        &[SPEC, "--profile", "tiny", "--set", "nodes.grpo.params.lr=3e-5", "--set", "nodes.grpo-resume.params.lr=3e-5"],
        0,
    );
    let ran = nodes_with(&ev, "node_finished");
    assert!(
        ran.contains(&"grpo@mode=continuous".to_string()) && ran.contains(&"grpo@mode=interrupt".to_string()),
        "{ran:?}"
    );
    for cached in [
        "data",
        "tokenizer",
        "base",
        "pretrain",
        "warmstart@mode=continuous",
        "sft@mode=continuous",
        "eval@policy=sft",
        "eval@policy=warmstart",
    ] {
        assert!(nodes_with(&ev, "cache_hit").contains(&cached.to_string()), "{cached} stays cached: ran {ran:?}");
    }
    for r in &ran {
        assert!(r.contains("grpo") || r == "results" || r == "gates", "{r} should not re-run");
    }

    // `compare` says why: the two runs differ in the GRPO nodes' lr, and
    // downstream only in inputs whose content changed.
    let out = p.run(&["status", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let ids: Vec<&str> = runs["runs"].as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    let (old, new) = (ids[1], ids[0]);
    let out = p.run(&["compare", "--json", old, new]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let c: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    for k in c["keys"].as_array().unwrap() {
        let (node, field) = (k["node"].as_str().unwrap(), k["field"].as_str().unwrap());
        let changed_param = field == "params.lr" && (node.starts_with("grpo@") || node == "grpo-resume");
        assert!(changed_param || field.starts_with("input "), "{node} {field}: only lr and inputs differ: {k}");
        if field == "params.lr" {
            assert_eq!(k["values"][1], "0.00003", "{k}");
        }
    }
    assert!(c["keys"].as_array().unwrap().iter().any(|k| k["node"] == "results" && k["field"] == "input training"));
    // The metrics of the re-run GRPO node: both sides read from its files, the change signed.
    let reward = |m: &serde_json::Value| {
        let h = m["history"].as_array().unwrap();
        h.iter().map(|i| i["mean_reward"].as_f64().unwrap()).sum::<f64>() / h.len() as f64
    };
    let row = c["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == "grpo@mode=continuous" && r["metric"] == "train reward (mean over iterations)")
        .cloned();
    let now = reward(&output_json(&p, "grpo@mode=continuous:metrics"));
    match row {
        // Unchanged rewards are hidden; then the new run's equals the old one's.
        None => assert!(c["metrics"].as_array().unwrap().iter().any(|r| r["node"] == "grpo@mode=continuous")),
        Some(r) => {
            assert_eq!(r["values"][1].as_f64().unwrap(), now);
            let change = r["changes"][0].as_f64().unwrap();
            assert!((change - (now - r["values"][0].as_f64().unwrap())).abs() < 1e-15, "{r}");
        }
    }
    // Against a freshly frozen pack of this run and the committed v0.1.0 pack.
    let out = p.run(&[
        "pack",
        "freeze",
        SPEC,
        "--profile",
        "tiny",
        "--set",
        "nodes.grpo.params.lr=3e-5",
        "--set",
        "nodes.grpo-resume.params.lr=3e-5",
        "--out",
        "pack",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v010 = format!("{}/artifacts/grpo-main-tiny/v0.1.0", env!("CARGO_MANIFEST_DIR"));
    let out = p.run(&["compare", "--json", &v010, "pack", new]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let c: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(c["sides"][1][1], "pack pack");
    // The pack is the run: no metric differs between B and C.
    for r in c["metrics"].as_array().unwrap() {
        assert_eq!(r["values"][1], r["values"][2], "{r}");
    }
    // v0.1.0 has the protocol's data sizes, this test a small budget: data's params differ.
    assert!(c["keys"].as_array().unwrap().iter().any(|k| k["node"] == "data" && k["field"] == "params.train"), "{c:#}");
    // The results table of v0.1.0 reads; its GRPO metrics predate the shared type and are listed, not zeroed.
    let table = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(format!("{v010}/outputs/results/table.json")).unwrap(),
    )
    .unwrap();
    let first = &table["rows"][0];
    let metric =
        format!("greedy pass@1 {} {}", first["policy"].as_str().unwrap(), first["population"].as_str().unwrap());
    let row =
        c["metrics"].as_array().unwrap().iter().find(|r| r["node"] == "results" && r["metric"] == metric.as_str());
    if let Some(row) = row {
        assert_eq!(row["values"][0], first["greedy_pass_at_1"], "{row}");
    }
    assert!(
        c["unreadable"].as_array().unwrap().iter().any(|u| u["side"] == "A" && u["node"] == "grpo@mode=continuous"),
        "{:#}",
        c["unreadable"]
    );
}

#[test]
fn the_evaluation_op_cannot_be_wired_to_labels() {
    let p = project();
    let spec = std::fs::read_to_string(p.path().join("experiments/grpo-main.yaml")).unwrap().replace(
        "      pages: data:pages.test\n    params: {draws: 4}",
        "      pages: data:labels.test\n    params: {draws: 4}",
    );
    p.write("experiments/leak.yaml", &spec);
    let out = p.run(&["validate", "experiments/leak.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("an inference node may not read labels"), "{}", stderr(&out));
}

#[test]
fn the_group_size_spec_reuses_the_cached_warm_start() {
    let p = project();
    // The small budgets of grpo-main-small, under the group-size spec (which extends grpo-main).
    let small = std::fs::read_to_string(p.path().join(SPEC)).unwrap();
    let nodes = small.split("    nodes:\n").nth(1).unwrap();
    p.write(
        "experiments/gs-small.yaml",
        &format!(
            "name: gs-small\nextends: grpo-group-size.yaml\nprofiles:\n  tiny:\n    nodes:\n{nodes}      grpo-gs: {{params: {{iterations: 2, max_new_tokens: 8}}}}\n      eval-g2: {{params: {{max_new_tokens: 8}}}}\n      eval-g8: {{params: {{max_new_tokens: 8}}}}\n"
        ),
    );
    let ev = p.run_json(&[SPEC, "--profile", "tiny"], 0);
    assert!(nodes_with(&ev, "node_failed").is_empty());
    let ev = p.run_json(&["experiments/gs-small.yaml", "--profile", "tiny"], 0);
    let hits = nodes_with(&ev, "cache_hit");
    for shared in ["data", "base", "pretrain", "warmstart@mode=continuous", "eval@policy=warmstart"] {
        assert!(hits.contains(&shared.to_string()), "{shared} is a cache hit: {hits:?}");
    }
    let ran = nodes_with(&ev, "node_finished");
    assert!(
        ran.contains(&"grpo-gs@group_size=2".to_string()) && ran.contains(&"grpo-gs@group_size=8".to_string()),
        "{ran:?}"
    );
}

/// Every spec shipped under experiments/ validates, with no profile and with each
/// profile it has (its own or one from the spec it extends): a spec the docs tell
/// a user to run cannot be broken unnoticed by a change to an op, a params type
/// or the spec it extends.
#[test]
fn every_shipped_spec_validates_with_each_of_its_profiles() {
    use orchestrate_core::spec::{load, LoadOptions};
    fn specs(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                specs(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    specs(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments"), &mut files);
    files.sort();
    let p = Project::new();
    let mut checked = Vec::new();
    for file in &files {
        let spec = load(file, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let profiles: Vec<String> = spec
            .resolved
            .get("profiles")
            .and_then(serde_json::Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        let path = file.to_str().unwrap();
        for profile in std::iter::once(None).chain(profiles.iter().map(Some)) {
            let mut args = vec!["validate", path];
            if let Some(profile) = profile {
                args.extend(["--profile", profile.as_str()]);
            }
            let out = p.run(&args);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
            checked.push(format!("{}{}", path, profile.map(|p| format!(" --profile {p}")).unwrap_or_default()));
        }
    }
    // The main spec and its tiny profile are among them (the walk found the folder).
    assert!(checked.iter().any(|c| c.ends_with("experiments/grpo-main.yaml --profile tiny")), "{checked:?}");
}

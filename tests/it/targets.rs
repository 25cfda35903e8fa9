//! `run SPEC NODE...` and `plan SPEC NODE...`: only the targets and what they
//! need, as `dvc repro STAGE` and Snakemake targets.

use crate::common;

use common::{nodes_with, stderr, stdout, Project, CHAIN};

#[test]
fn a_target_runs_with_what_it_needs_and_nothing_else() {
    let p = Project::new();
    p.write("chain.yaml", CHAIN);
    let ev = p.run_json(&["chain.yaml", "b"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["a", "b"]);
    assert!(!p.path().join("c.txt").exists() && !p.path().join("d.txt").exists());
    // The keys are the whole spec's: the rest of the spec runs, a and b are hits.
    let ev = p.run_json(&["chain.yaml"], 0);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["a", "b"]);
    assert_eq!(nodes_with(&ev, "node_finished"), ["c", "d"]);
    // Two targets, one already cached.
    let ev = p.run_json(&["chain.yaml", "d", "a", "--force", "d"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["d"]);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["a"]);
}

#[test]
fn a_matrix_base_name_selects_every_expansion_and_plan_shows_only_the_selection() {
    let p = Project::new();
    p.write(
        "m.yaml",
        r#"
name: m
nodes:
  corpus:
    op: shell
    params: {cmd: seq 1 50 > corpus.txt, outs: [corpus.txt]}
  sample:
    op: shell
    matrix: {env.LINES: [10, 20]}
    params:
      cmd: head -n "$LINES" corpus.txt > "sample-${matrix.env.LINES}.txt"
      deps: [corpus.txt]
      outs: ["sample-${matrix.env.LINES}.txt"]
  other:
    op: shell
    params: {cmd: echo other > other.txt, outs: [other.txt]}
"#,
    );
    let out = p.run(&["plan", "m.yaml", "sample", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let planned: Vec<String> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["node"].as_str().unwrap().to_string())
        .collect();
    let mut planned = planned;
    planned.sort();
    assert_eq!(planned, ["corpus", "sample@env.LINES=10", "sample@env.LINES=20"]);
    let ev = p.run_json(&["m.yaml", "sample"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["corpus", "sample@env.LINES=10", "sample@env.LINES=20"]);
    assert!(!p.path().join("other.txt").exists());
    // One expansion by its exact id.
    let ev = p.run_json(&["m.yaml", "sample@env.LINES=20", "--force", "sample@env.LINES=20"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["sample@env.LINES=20"]);
}

#[test]
fn an_unknown_target_or_a_forced_node_outside_the_targets_is_a_usage_error() {
    let p = Project::new();
    p.write("chain.yaml", CHAIN);
    let out = p.run(&["run", "chain.yaml", "bb"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no node 'bb'") && stderr(&out).contains("did you mean 'b'"), "{}", stderr(&out));
    let out = p.run(&["run", "chain.yaml", "b", "--force", "d"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--force d: not one of the targets (b)"), "{}", stderr(&out));
    // Nothing ran.
    assert!(!p.path().join("a.txt").exists());
}

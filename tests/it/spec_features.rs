//! extends, profiles, --set, matrix expansion, explain and status, end to end.

use crate::common;

use common::{nodes_with, stderr, stdout, Project};

const BASE: &str = r#"
name: base
nodes:
  data:
    op: shell
    params:
      cmd: seq 1 "$N" > data.txt
      env: {N: 5}
      outs: [data.txt]
  total:
    op: shell
    params:
      cmd: awk '{s+=$1} END {print s}' data.txt > total.txt
      deps: [data.txt]
      outs: [total.txt]
profiles:
  small:
    nodes:
      data:
        params:
          env: {N: 3}
"#;

#[test]
fn a_profile_overlays_the_spec() {
    let p = Project::new();
    p.write("base.yaml", BASE);
    p.run_json(&["base.yaml"], 0);
    assert_eq!(p.read("total.txt").trim(), "15");
    p.run_json(&["base.yaml", "--profile", "small"], 0);
    assert_eq!(p.read("total.txt").trim(), "6");
}

#[test]
fn extends_reuses_the_parent_and_its_cache() {
    let p = Project::new();
    p.write("base.yaml", BASE);
    p.write(
        "child.yaml",
        "extends: base.yaml\nname: child\nnodes:\n  double:\n    op: shell\n    params:\n      cmd: echo $(( $(cat total.txt) * 2 )) > double.txt\n      deps: [total.txt]\n      outs: [double.txt]\n",
    );
    p.run_json(&["base.yaml"], 0);
    let ev = p.run_json(&["child.yaml"], 0);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["data", "total"], "the shared prefix is a cache hit");
    assert_eq!(nodes_with(&ev, "node_finished"), ["double"]);
    assert_eq!(p.read("double.txt").trim(), "30");
    // The parent's profiles apply to the child too.
    p.run_json(&["child.yaml", "--profile", "small"], 0);
    assert_eq!(p.read("double.txt").trim(), "12");
}

#[test]
fn null_in_an_overlay_removes_a_node() {
    let p = Project::new();
    p.write("base.yaml", BASE);
    p.write("child.yaml", "extends: base.yaml\nname: child\nnodes:\n  total: null\n");
    let out = p.run(&["validate", "child.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("1 nodes"), "{}", stdout(&out));
}

#[test]
fn a_matrix_expands_into_distinct_nodes_and_consumers_bind_by_axis() {
    let p = Project::new();
    p.write(
        "m.yaml",
        r#"
name: m
nodes:
  gen:
    op: shell
    matrix:
      env.G: [2, 4, 8]
    params:
      cmd: echo "group $G" > "gen-${matrix.env.G}.txt"
      outs: ["gen-${matrix.env.G}.txt"]
  read:
    op: shell
    matrix:
      env.G: [2, 4, 8]
    inputs:
      src: "gen:gen-${matrix.env.G}.txt"
    params:
      cmd: cat "$ORCHESTRATE_INPUT_SRC" > "read-${matrix.env.G}.txt"
      outs: ["read-${matrix.env.G}.txt"]
  all:
    op: shell
    inputs:
      parts: ["gen@env.G=2:gen-2.txt", "gen@env.G=8:gen-8.txt"]
    params:
      cmd: cat $ORCHESTRATE_INPUT_PARTS > all.txt
      outs: [all.txt]
"#,
    );
    let ev = p.run_json(&["m.yaml"], 0);
    assert_eq!(
        nodes_with(&ev, "node_finished"),
        ["all", "gen@env.G=2", "gen@env.G=4", "gen@env.G=8", "read@env.G=2", "read@env.G=4", "read@env.G=8"]
    );
    assert_eq!(p.read("read-4.txt"), "group 4\n");
    assert_eq!(p.read("all.txt"), "group 2\ngroup 8\n");
}

#[test]
fn a_matrix_axis_can_name_structured_values_or_only_label_expansions() {
    let p = Project::new();
    p.write(
        "m.yaml",
        r#"
name: m
nodes:
  gen:
    op: shell
    matrix:
      # Named structured values: the param gets the object, the id the label.
      env: {values: {small: {N: 2}, big: {N: 4}}}
    params: {cmd: 'seq 1 "$N" > "gen-${matrix.env}.txt"', outs: ["gen-${matrix.env}.txt"]}
  read:
    op: shell
    # Label-only: sets no param (shell's env stays unset), pairs with gen's expansion.
    matrix: {env: {labels: [small, big]}}
    inputs: {src: "gen:gen-${matrix.env}.txt"}
    params: {cmd: 'cat "$ORCHESTRATE_INPUT_SRC" > "read-${matrix.env}.txt"', outs: ["read-${matrix.env}.txt"]}
"#,
    );
    let ev = p.run_json(&["m.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["gen@env=big", "gen@env=small", "read@env=big", "read@env=small"]);
    assert_eq!(p.read("read-small.txt"), "1\n2\n");
    assert_eq!(p.read("read-big.txt"), "1\n2\n3\n4\n");
    // The key is the params', not the matrix's: the same node written out by hand is a cache hit.
    p.write(
        "plain.yaml",
        "name: plain\nnodes:\n  small:\n    op: shell\n    params: {cmd: 'seq 1 \"$N\" > \"gen-small.txt\"', env: {N: 2}, outs: [gen-small.txt]}\n",
    );
    let ev = p.run_json(&["plain.yaml"], 0);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["small"]);

    for (axis, expected) in [
        ("{values: {a: 1}, labels: [a]}", "give either values (label → value) or labels, not both"),
        ("{labels: ['a b']}", "label \"a b\": a label is a number or a string"),
        ("{values: {'x,y': 1}}", "label 'x,y': a label is letters"),
        ("{labels: []}", "has no values"),
        ("{label: [a]}", "unknown key 'label'"),
        ("7", "a matrix axis is a list of values"),
    ] {
        p.write(
            "bad.yaml",
            &format!(
                "name: bad\nnodes:\n  gen:\n    op: shell\n    matrix: {{k: {axis}}}\n    params: {{cmd: 'true'}}\n"
            ),
        );
        let out = p.run(&["validate", "bad.yaml"]);
        assert_eq!(out.status.code(), Some(2), "{axis}");
        let err = stderr(&out);
        assert!(err.contains(expected) && err.contains("bad.yaml:5"), "{axis}: {err}");
    }
}

#[test]
fn a_reference_to_a_matrix_node_without_matching_axes_lists_its_expansions() {
    let p = Project::new();
    p.write(
        "m.yaml",
        "name: m\nnodes:\n  gen:\n    op: shell\n    matrix: {env.G: [2, 4]}\n    params: {cmd: 'true', outs: ['g${matrix.env.G}.txt']}\n  use:\n    op: shell\n    inputs: {x: 'gen:g2.txt'}\n    params: {cmd: 'true'}\n",
    );
    let out = p.run(&["validate", "m.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("expanded into gen@env.G=2, gen@env.G=4"), "{err}");
}

#[test]
fn explain_prints_the_field_level_diff() {
    let p = Project::new();
    p.write("base.yaml", BASE);
    p.run_json(&["base.yaml"], 0);
    let out = p.run(&["explain", "base.yaml", "data", "--set", "nodes.data.params.env.N=7"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(text.contains("params.env.N: 5 → 7"), "{text}");
    // Unchanged: says so.
    let text = stdout(&p.run(&["explain", "base.yaml", "total"]));
    assert!(text.contains("no hash input changed"), "{text}");
}

#[test]
fn status_lists_runs_and_the_outcome_of_each_node() {
    let p = Project::new();
    p.write("base.yaml", BASE);
    p.run_json(&["base.yaml"], 0);
    p.run_json(&["base.yaml", "--set", "nodes.total.params.cmd=exit 1"], 1);
    let out = p.run(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["status"], "failed");
    assert_eq!(runs[1]["status"], "ok");
    let outcomes: Vec<(String, String)> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node_id"].as_str().unwrap().to_string(), n["outcome"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(outcomes, [("data".into(), "cached".into()), ("total".into(), "failed".into())]);
}

#[test]
fn plain_output_names_each_node_with_its_key_prefix() {
    let p = Project::new();
    p.write("base.yaml", BASE);
    let out = p.run(&["run", "base.yaml"]);
    let text = stdout(&out);
    assert!(text.lines().any(|l| l.starts_with("done     data ") && l.contains(" in ")), "{text}");
    assert!(text.contains("2 ran, 0 cached, 0 failed, 0 skipped"), "{text}");
}

#[test]
fn inputs_reach_a_command_in_another_folder_by_absolute_path() {
    let p = Project::new();
    p.write(
        "sub/s.yaml",
        "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'echo hi > a.txt', outs: [a.txt]}\n  b:\n    op: shell\n    inputs: {x: 'a:a.txt'}\n    params: {cmd: 'cat \"$ORCHESTRATE_INPUT_X\" > b.txt', outs: [b.txt]}\n",
    );
    // orchestrate runs from the project root; the commands run in sub/.
    p.run_json(&["sub/s.yaml"], 0);
    assert_eq!(p.read("sub/b.txt"), "hi\n");
}

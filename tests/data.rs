//! The StockArithmetic dataset op, data isolation at compile time, and the verifier CLI.

mod common;

use common::{nodes_with, stderr, stdout, Project};

const DATA: &str = "name: d\nnodes:\n  data:\n    op: dataset.stock_arithmetic\n    params: {seed: 3}\n";

fn jsonl(p: &Project, spec: &str, output: &str) -> Vec<serde_json::Value> {
    jsonl_with(p, &[spec, output])
}

fn jsonl_with(p: &Project, args: &[&str]) -> Vec<serde_json::Value> {
    let mut full = vec!["path"];
    full.extend_from_slice(args);
    let out = p.run(&full);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let path = stdout(&out).trim().to_string();
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn the_dataset_op_writes_pages_and_labels_per_split_and_reruns_from_cache() {
    let p = Project::new();
    p.write("d.yaml", DATA);
    assert_eq!(nodes_with(&p.run_json(&["d.yaml"], 0), "node_finished"), ["data"]);
    assert_eq!(nodes_with(&p.run_json(&["d.yaml"], 0), "cache_hit"), ["data"]);

    let train_pages = jsonl(&p, "d.yaml", "data:pages.train");
    let train_labels = jsonl(&p, "d.yaml", "data:labels.train");
    let test_labels = jsonl(&p, "d.yaml", "data:labels.test");
    assert_eq!(train_pages.len(), 1000);
    assert_eq!(jsonl(&p, "d.yaml", "data:pages.validation").len(), 200);
    assert_eq!(test_labels.len(), 200);
    assert_eq!(test_labels.iter().filter(|l| l["population"] == "OOD100").count(), 100);
    assert_eq!(train_labels.iter().filter(|l| l["warmstart"] == true).count(), 128);
    // Pages carry no structure and no target; labels carry both.
    let page = train_pages[0].as_object().unwrap();
    let mut keys: Vec<&str> = page.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["id", "population", "split", "statement"]);
    assert_eq!(train_labels[0]["id"], train_pages[0]["id"]);
    assert!(train_labels[0]["problem"]["deliveries"].is_array());
    let target = train_labels[0]["target"].as_u64().unwrap();
    assert_eq!(train_labels[0]["reference_response"], format!("{{\"final_stock\": {target}}}"));
}

#[test]
fn another_seed_changes_the_data_and_the_key() {
    let p = Project::new();
    p.write("d.yaml", DATA);
    p.run_json(&["d.yaml"], 0);
    let a = jsonl(&p, "d.yaml", "data:pages.test");
    let ev = p.run_json(&["d.yaml", "--set", "nodes.data.params.seed=4"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["data"]);
    let b = jsonl_with(&p, &["d.yaml", "data:pages.test", "--set", "nodes.data.params.seed=4"]);
    assert_eq!(a.len(), b.len());
    assert!(a != b, "seed 4 gave the same test pages as seed 3");
}

fn consumer(role: &str, input: &str) -> String {
    format!("{DATA}  use:\n    op: shell\n    inputs: {{x: '{input}'}}\n    params: {{cmd: 'true', role: {role}}}\n")
}

fn rejected(yaml: &str) -> String {
    let p = Project::new();
    p.write("leak.yaml", yaml);
    let out = p.run(&["validate", "leak.yaml"]);
    assert_eq!(out.status.code(), Some(2), "expected a compile error: {}", stdout(&out));
    stderr(&out)
}

fn accepted(yaml: &str) {
    let p = Project::new();
    p.write("ok.yaml", yaml);
    let out = p.run(&["validate", "ok.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_spec_wiring_test_labels_into_training_is_rejected_naming_the_edge() {
    let err = rejected(&consumer("training", "data:labels.test"));
    assert!(err.contains("leak.yaml:8:17:"), "located at the input: {err}");
    assert!(
        err.contains("a training node may not read test data: node 'use' (shell, role training) reads test labels through input 'x' ← 'data:labels.test'"),
        "{err}"
    );
    let err = rejected(&consumer("training", "data:pages.test"));
    assert!(err.contains("reads test pages"), "{err}");
}

#[test]
fn a_leak_through_an_intermediate_node_is_still_rejected() {
    let yaml = format!(
        "{DATA}  copy:\n    op: shell\n    inputs: {{l: 'data:labels.test'}}\n    params: {{cmd: 'cp $ORCHESTRATE_INPUT_L c.jsonl', outs: [c.jsonl]}}\n  train:\n    op: shell\n    params: {{cmd: 'true', deps: [c.jsonl], role: training}}\n"
    );
    let err = rejected(&yaml);
    assert!(err.contains("through dep 'c.jsonl' ← 'copy:c.jsonl' (which derives from 'data:labels.test')"), "{err}");
}

#[test]
fn labels_may_not_reach_an_inference_node() {
    let err = rejected(&consumer("inference", "data:labels.train"));
    assert!(err.contains("an inference node may not read labels"), "{err}");
}

#[test]
fn the_allowed_wirings_compile() {
    accepted(&consumer("training", "data:labels.train"));
    accepted(&consumer("training", "data:labels.validation"));
    accepted(&consumer("inference", "data:pages.test"));
    accepted(&consumer("scoring", "data:labels.test"));
    accepted(&consumer("any", "data:labels.test"));
    accepted(&consumer("training", "data:summary"));
}

#[test]
fn verifier_check_explains_a_zero() {
    let p = Project::new();
    let mut child = p
        .cmd(&[
            "verifier",
            "check",
            "stock_arithmetic_v1",
            "--problem",
            r#"{"initial": 5, "deliveries": [3, 2], "withdrawals": [3, 1]}"#,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"```json\n{\"final_stock\": 6}\n```\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"reward": 0, "valid": false, "value": null, "expected": 6, "reason": "markdown_fence"})
    );

    let out = p.run(&["verifier", "check", "stock_arithmetic", "--problem", "{}"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("did you mean 'stock_arithmetic_v1'"), "{}", stderr(&out));
}

#[test]
fn verifier_list_prints_each_protocol_hash() {
    let p = Project::new();
    let text = stdout(&p.run(&["verifier", "list"]));
    for name in ["stock_arithmetic_v1", "gsm8k_last_number"] {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} listed: {text}"));
        assert_eq!(line.split_whitespace().last().unwrap().len(), 64);
    }
}

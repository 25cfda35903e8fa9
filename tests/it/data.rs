//! The StockArithmetic dataset op, data isolation at compile time, and the verifier CLI.

use crate::common;

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
    p.write("tr.jsonl", "");
    p.write("te.jsonl", "");
    p.write("leak.yaml", yaml);
    let out = p.run(&["validate", "leak.yaml"]);
    assert_eq!(out.status.code(), Some(2), "expected a compile error: {}", stdout(&out));
    stderr(&out)
}

fn accepted(yaml: &str) {
    let p = Project::new();
    p.write("tr.jsonl", "");
    p.write("te.jsonl", "");
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

// ---- The user's own data: dataset.import ----

/// A GSM8K-style row: a word problem and an answer ending in `#### N`.
fn gsm_row(i: usize) -> serde_json::Value {
    let (a, b) = (i + 3, 2 * i + 1);
    serde_json::json!({
        "question": format!("Tom has {a} apples and buys {b} more. How many apples does he have? (#{i})"),
        "answer": format!("He has {a} + {b} = {} apples.\n#### {}", a + b, a + b),
        "level": if i.is_multiple_of(3) { "hard" } else { "easy" },
    })
}

fn write_jsonl(p: &Project, rel: &str, rows: &[serde_json::Value]) {
    p.write(rel, &rows.iter().map(|r| r.to_string() + "\n").collect::<String>());
}

/// Writes rows as CSV (every value quoted, RFC 4180).
fn write_csv(p: &Project, rel: &str, rows: &[serde_json::Value]) {
    let cols = ["question", "answer", "level"];
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut text = cols.join(",") + "\n";
    for r in rows {
        let cells: Vec<String> = cols.iter().map(|c| quote(r[*c].as_str().unwrap())).collect();
        text += &(cells.join(",") + "\n");
    }
    p.write(rel, &text);
}

/// Writes rows as Parquet with pyarrow (snappy, as Hugging Face datasets write them).
fn write_parquet(p: &Project, rel: &str, rows: &[serde_json::Value], drop: Option<&str>) {
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let json = p.path().join(format!("{rel}.rows.json"));
    std::fs::write(&json, serde_json::to_string(rows).unwrap()).unwrap();
    let script = "import json, sys\nimport pyarrow as pa, pyarrow.parquet as pq\nrows = json.load(open(sys.argv[1]))\nt = pa.Table.from_pylist(rows)\nif sys.argv[3]: t = t.drop_columns([sys.argv[3]])\npq.write_table(t, sys.argv[2], compression='snappy')\n";
    let out = std::process::Command::new(python)
        .args(["-c", script, json.to_str().unwrap(), p.path().join(rel).to_str().unwrap(), drop.unwrap_or("")])
        .output()
        .unwrap();
    assert!(out.status.success(), "pyarrow: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(json).unwrap();
}

const FIELDS: &str = "fields: {prompt: question, answer: answer, population: level, reference_response: '{answer}'}";

fn import_node(id: &str, files: &str, extra: &str) -> String {
    import_node_with(id, files, FIELDS, extra)
}

fn import_node_with(id: &str, files: &str, fields: &str, extra: &str) -> String {
    format!("  {id}:\n    op: dataset.import\n    params: {{files: {files}, {fields}{extra}}}\n")
}

fn bytes_of(p: &Project, spec: &str, output: &str) -> Vec<u8> {
    let out = p.run(&["path", spec, output]);
    assert_eq!(out.status.code(), Some(0), "{output}: {}", stderr(&out));
    std::fs::read(stdout(&out).trim()).unwrap()
}

#[test]
fn the_same_rows_in_jsonl_json_csv_and_parquet_import_to_the_same_pages_and_labels() {
    let p = Project::new();
    let rows: Vec<serde_json::Value> = (0..12).map(gsm_row).collect();
    write_jsonl(&p, "data/t.jsonl", &rows);
    p.write("data/t.json", &serde_json::to_string_pretty(&rows).unwrap());
    write_csv(&p, "data/t.csv", &rows);
    write_parquet(&p, "data/t.parquet", &rows, None);
    let mut spec = String::from("name: formats\nnodes:\n");
    for ext in ["jsonl", "json", "csv", "parquet"] {
        spec += &import_node(ext, &format!("{{train: data/t.{ext}}}"), ", warmstart: 4");
    }
    p.write("f.yaml", &spec);
    let ev = p.run_json(&["f.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["csv", "json", "jsonl", "parquet"]);
    for output in ["pages.train", "labels.train"] {
        let reference = bytes_of(&p, "f.yaml", &format!("jsonl:{output}"));
        for ext in ["json", "csv", "parquet"] {
            assert!(
                reference == bytes_of(&p, "f.yaml", &format!("{ext}:{output}")),
                "{ext}:{output} differs from jsonl's"
            );
        }
    }
    // Every row is there, in file order, typed as docs/data.md says.
    let pages = jsonl(&p, "f.yaml", "parquet:pages.train");
    let labels = jsonl(&p, "f.yaml", "parquet:labels.train");
    assert_eq!(pages.len(), 12);
    for (i, (page, label)) in pages.iter().zip(&labels).enumerate() {
        assert_eq!(page["statement"], rows[i]["question"]);
        assert_eq!(page["population"], rows[i]["level"]);
        assert_eq!(page["id"], label["id"]);
        assert_eq!(label["problem"], serde_json::json!({"answer": rows[i]["answer"]}));
        assert_eq!(label["reference_response"], rows[i]["answer"]);
        assert_eq!(label["warmstart"], i < 4, "the first 4 train rows are the warm-start set");
    }
    let ids: std::collections::BTreeSet<&str> = pages.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 12, "content ids are distinct");
}

#[test]
fn an_imported_file_is_in_the_key_by_content_and_one_file_splits_by_a_seeded_ratio() {
    let p = Project::new();
    let rows: Vec<serde_json::Value> = (0..40).map(gsm_row).collect();
    write_jsonl(&p, "all.jsonl", &rows);
    p.write(
        "r.yaml",
        &format!("name: r\nnodes:\n  data:\n    op: dataset.import\n    params: {{file: all.jsonl, ratios: {{train: 0.75, test: 0.25}}, seed: 1, {FIELDS}}}\n"),
    );
    assert_eq!(nodes_with(&p.run_json(&["r.yaml"], 0), "node_finished"), ["data"]);
    let (train, test) = (jsonl(&p, "r.yaml", "data:pages.train"), jsonl(&p, "r.yaml", "data:pages.test"));
    assert_eq!((train.len(), test.len()), (30, 10));
    let statements: std::collections::BTreeSet<&str> =
        train.iter().chain(&test).map(|r| r["statement"].as_str().unwrap()).collect();
    assert_eq!(statements.len(), 40, "every row in exactly one split");
    // The same content (rewritten, newer mtime) is a cache hit; one changed row re-runs it.
    write_jsonl(&p, "all.jsonl", &rows);
    assert_eq!(nodes_with(&p.run_json(&["r.yaml"], 0), "cache_hit"), ["data"]);
    let mut changed = rows.clone();
    changed[5]["answer"] = serde_json::json!("#### 1000");
    write_jsonl(&p, "all.jsonl", &changed);
    assert_eq!(nodes_with(&p.run_json(&["r.yaml"], 0), "node_finished"), ["data"]);
    // Another seed, another assignment.
    p.run_json(&["r.yaml", "--set", "nodes.data.params.seed=2"], 0);
    let other = jsonl_with(&p, &["r.yaml", "data:pages.test", "--set", "nodes.data.params.seed=2"]);
    assert!(other != test);
}

#[test]
fn imported_test_labels_cannot_reach_training_even_through_a_file_another_node_wrote() {
    let data = format!("name: leak\nnodes:\n{}", import_node("data", "{train: tr.jsonl, test: te.jsonl}", ""));
    let err = rejected(&format!(
        "{data}  use:\n    op: shell\n    inputs: {{x: 'data:labels.test'}}\n    params: {{cmd: 'true', role: training}}\n"
    ));
    assert!(err.contains("a training node may not read test data") && err.contains("'data:labels.test'"), "{err}");
    // Test labels copied to a file, and that file imported as *train*: still test labels.
    let laundered = format!(
        "{data}  copy:\n    op: shell\n    inputs: {{l: 'data:labels.test'}}\n    params: {{cmd: 'cp $ORCHESTRATE_INPUT_L c.jsonl', outs: [c.jsonl]}}\n{}  use:\n    op: shell\n    inputs: {{x: 'again:labels.train'}}\n    params: {{cmd: 'true', role: training}}\n",
        import_node("again", "{train: c.jsonl}", "")
    );
    let err = rejected(&laundered);
    assert!(err.contains("reads test labels") && err.contains("which derives from 'data:labels.test'"), "{err}");
    accepted(&format!(
        "{data}  use:\n    op: shell\n    inputs: {{x: 'data:labels.train'}}\n    params: {{cmd: 'true', role: training}}\n"
    ));
}

/// Before, isolation followed only artifacts: a `role: training` node
/// listing the very file `dataset.import` reads as the test split (`deps:
/// [te.jsonl]`, a glob or a folder holding it) compiled, and so did an
/// inference node reading a raw file full of answers. A file an import reads
/// now carries that split's pages and labels, for every other node that
/// reads it, and passes them on through what that node writes.
#[test]
fn the_raw_file_an_import_reads_as_test_data_is_test_data_for_every_other_reader() {
    let rejected_here = |files: &[(&str, &str)], yaml: &str| -> String {
        let p = Project::new();
        for (rel, text) in files {
            p.write(rel, text);
        }
        p.write("leak.yaml", yaml);
        let out = p.run(&["validate", "leak.yaml"]);
        assert_eq!(out.status.code(), Some(2), "expected a compile error: {}{yaml}", stdout(&out));
        stderr(&out)
    };
    let raw = [("raw/tr.jsonl", ""), ("raw/te.jsonl", ""), ("raw/all.jsonl", "")];
    let data = format!("name: leak\nnodes:\n{}", import_node("data", "{train: raw/tr.jsonl, test: raw/te.jsonl}", ""));
    let user = |role: &str, deps: &str| {
        format!("{data}  use:\n    op: shell\n    params: {{cmd: 'true', deps: {deps}, role: {role}}}\n")
    };
    for deps in ["[raw/te.jsonl]", "['raw/*.jsonl']", "[raw]", "['**/te.jsonl']"] {
        let err = rejected_here(&raw, &user("training", deps));
        assert!(
            err.contains("a training node may not read test data: node 'use' (shell, role training) reads test")
                && err.contains("'raw/te.jsonl', the file node 'data' imports as its test split"),
            "{deps}: {err}"
        );
    }
    // Any labels, for inference: the train file holds answers too.
    let err = rejected_here(&raw, &user("inference", "[raw/tr.jsonl]"));
    assert!(
        err.contains("an inference node may not read labels")
            && err.contains("'raw/tr.jsonl', the file node 'data' imports as its train split"),
        "{err}"
    );
    // One file split by ratios holds every split.
    let split = format!(
        "name: leak\nnodes:\n  data:\n    op: dataset.import\n    params: {{file: raw/all.jsonl, ratios: {{train: 0.8, test: 0.2}}, {FIELDS}}}\n  \
         use:\n    op: shell\n    params: {{cmd: 'true', deps: [raw/all.jsonl], role: training}}\n"
    );
    let err = rejected_here(&raw, &split);
    assert!(err.contains("reads test") && err.contains("the file node 'data' splits into train, test"), "{err}");
    // Laundered through a node with no role, and through a second import as train.
    let laundered = format!(
        "{data}  copy:\n    op: shell\n    params: {{cmd: 'cp raw/te.jsonl c.jsonl', deps: [raw/te.jsonl], outs: [c.jsonl]}}\n  \
         use:\n    op: shell\n    params: {{cmd: 'true', deps: [c.jsonl], role: training}}\n"
    );
    let err = rejected_here(&raw, &laundered);
    assert!(err.contains("through dep 'c.jsonl' ← 'copy:c.jsonl' (which derives from 'raw/te.jsonl, the file node 'data' imports as its test split')"), "{err}");
    let again = format!(
        "{data}{}  use:\n    op: shell\n    inputs: {{x: 'again:labels.train'}}\n    params: {{cmd: 'true', role: training}}\n",
        import_node("again", "{train: raw/te.jsonl}", "")
    );
    let err = rejected_here(&raw, &again);
    assert!(err.contains("reads test") && err.contains("'again:labels.train'"), "{err}");
    // A file another node writes, imported as test.
    let written = format!(
        "name: leak\nnodes:\n  gen:\n    op: shell\n    params: {{cmd: 'true', outs: [gen/te.jsonl]}}\n{}  \
         use:\n    op: shell\n    params: {{cmd: 'true', deps: [gen/te.jsonl], role: training}}\n",
        import_node("data", "{train: raw/tr.jsonl, test: gen/te.jsonl}", "")
    );
    let err = rejected_here(&raw, &written);
    assert!(err.contains("reads test") && err.contains("the file node 'data' imports as its test split"), "{err}");
    // A reward program's own files, read by train.grpo (a training node).
    let reward = format!(
        "{data}{OWN_MODEL}  grpo:\n    op: train.grpo\n    inputs: {{model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train'}}\n    params:\n      reward:\n        - {{name: peek, command: [python3, peek.py], files: [raw/te.jsonl]}}\n"
    );
    let err = rejected_here(&[("raw/tr.jsonl", ""), ("raw/te.jsonl", ""), ("peek.py", "")], &reward);
    assert!(
        err.contains("node 'grpo' (train.grpo, role training) reads test")
            && err.contains("'raw/te.jsonl', the file node 'data' imports as its test split"),
        "{err}"
    );
    // What stays allowed: training on the train file, scoring on anything,
    // and the import itself reading both.
    for (role, deps) in [("training", "[raw/tr.jsonl]"), ("scoring", "[raw]"), ("any", "[raw/te.jsonl]")] {
        let p = Project::new();
        for (rel, text) in raw {
            p.write(rel, text);
        }
        p.write("ok.yaml", &user(role, deps));
        let out = p.run(&["validate", "ok.yaml"]);
        assert_eq!(out.status.code(), Some(0), "{role} {deps}: {}", stderr(&out));
    }
}

/// Before, a file an import reads was data for every dep that reaches it, but
/// not for a params file: `params_files: {raw/te.json: [0.answer]}` in a
/// training node compiled, and `${param:0.answer}` put a test answer into its
/// command (and its key). A params file that is such a file is now read as
/// the data it holds, with the error naming the params file.
#[test]
fn a_raw_data_file_read_as_a_params_file_is_that_data_too() {
    let rows = r#"[{"question": "what is 2+2", "answer": "4", "level": "a"}]"#;
    let data = format!("name: leak\nnodes:\n{}", import_node("data", "{train: raw/tr.json, test: raw/te.json}", ""));
    let user = |role: &str, file: &str| {
        format!(
            "{data}  use:\n    op: shell\n    params: {{cmd: 'echo ${{param:0.answer}} > o.txt', params_files: {{{file}: ['0.answer']}}, outs: [o.txt], role: {role}}}\n"
        )
    };
    let validate = |yaml: &str| validate_beside_a_json_import(yaml, rows);
    for (role, file, why, split) in [
        ("training", "raw/te.json", "a training node may not read test data", "test"),
        ("training", "./raw/te.json", "a training node may not read test data", "test"),
        ("inference", "raw/tr.json", "an inference node may not read labels", "train"),
    ] {
        let out = validate(&user(role, file));
        assert_eq!(out.status.code(), Some(2), "{role} {file}: expected a compile error: {}", stdout(&out));
        let err = stderr(&out);
        let want =
            format!("params file 'raw/{}', the file node 'data' imports as its {split} split", &file[file.len() - 7..]);
        assert!(err.contains(why) && err.contains(&want) && err.contains("leak.yaml:"), "{role} {file}: {err}");
    }
    // Training on the train file's values, and scoring on the test file's, stay allowed.
    for (role, file) in [("training", "raw/tr.json"), ("scoring", "raw/te.json")] {
        let out = validate(&user(role, file));
        assert_eq!(out.status.code(), Some(0), "{role} {file}: {}", stderr(&out));
    }
}

/// `validate leak.yaml` (`yaml`) in a new project holding `raw/tr.json`
/// (`rows`), `raw/te.json` (the same rows asking 3+3) and a `train.py`.
fn validate_beside_a_json_import(yaml: &str, rows: &str) -> std::process::Output {
    let p = Project::new();
    p.write("raw/tr.json", rows);
    p.write("raw/te.json", &rows.replace("2+2", "3+3"));
    p.write("train.py", "print(1)\n");
    p.write("leak.yaml", yaml);
    p.run(&["validate", "leak.yaml"])
}

/// Isolation went by what a node declares (deps, params files, inputs), so
/// a training node whose command names the test file itself
/// (`python3 train.py --data raw/te.json`), undeclared, compiled and ran. A
/// path the command names (a word, an option's value after `=`, a
/// redirection's file) that is a split's data, or a folder holding one, is
/// now read as that data, and the error points at `cmd`.
#[test]
fn a_data_file_named_in_a_command_is_that_data_too() {
    let rows = r#"[{"question": "what is 2+2", "answer": "4", "level": "a"}]"#;
    let data = format!("name: leak\nnodes:\n{}", import_node("data", "{train: raw/tr.json, test: raw/te.json}", ""));
    let user = |role: &str, cmd: &str| {
        format!("{data}  use:\n    op: shell\n    params: {{cmd: \"{cmd}\", outs: [o.txt], role: {role}}}\n")
    };
    let validate = |yaml: &str| validate_beside_a_json_import(yaml, rows);
    for (role, cmd, named, split) in [
        ("training", "python3 train.py --data raw/te.json > o.txt", "raw/te.json", "test"),
        ("training", "python3 train.py --data=./raw/te.json > o.txt", "raw/te.json", "test"),
        ("training", "python3 train.py < 'raw/te.json' > o.txt", "raw/te.json", "test"),
        ("training", "cd . && python3 train.py raw > o.txt", "raw", "test"),
        ("training", "bash -c 'python3 train.py raw/te.json' > o.txt", "raw/te.json", "test"),
        // Seen from the folder the command runs in (before: `../raw/te.json` named nothing).
        ("training", "cd sub && python3 ../train.py --data ../raw/te.json > ../o.txt", "raw/te.json", "test"),
        ("inference", "python3 train.py --prompts raw/tr.json > o.txt", "raw/tr.json", "train"),
    ] {
        let out = validate(&user(role, cmd));
        assert_eq!(out.status.code(), Some(2), "{role} {cmd}: expected a compile error: {}", stdout(&out));
        let err = stderr(&out);
        let want = format!("'{named}' named in its cmd");
        let split = format!("imports as its {split} split");
        assert!(err.contains(&want) && err.contains(&split) && err.contains("leak.yaml:"), "{role} {cmd}: {err}");
    }
    for (role, cmd) in [
        ("training", "python3 train.py --data raw/tr.json > o.txt"),
        ("scoring", "python3 train.py raw/te.json > o.txt"),
        ("any", "cat raw/te.json > o.txt"),
        ("training", "echo $RAW/te.json > o.txt"),
    ] {
        let out = validate(&user(role, cmd));
        assert_eq!(out.status.code(), Some(0), "{role} {cmd}: {}", stderr(&out));
    }
}

/// Before, a path a command named was checked against the imports' raw files
/// only: a training node running `python3 train.py derived/te.txt`, where
/// another node wrote `derived/te.txt` from the test split, compiled (and
/// had no edge to that node). Such a path is now an edge, so what the
/// output carries reaches the node, and the error points at `cmd`.
#[test]
fn another_nodes_output_named_in_a_command_is_read_through_an_edge() {
    let rows = r#"[{"question": "what is 2+2", "answer": "4", "level": "a"}]"#;
    let data = format!("name: leak\nnodes:\n{}", import_node("data", "{train: raw/tr.json, test: raw/te.json}", ""));
    let copy = "  copy:\n    op: shell\n    params: {cmd: \"mkdir -p derived && cat raw/te.json > derived/te.txt\", outs: [derived/te.txt]}\n";
    let user = |cmd: &str| {
        format!("{data}{copy}  use:\n    op: shell\n    params: {{cmd: \"{cmd}\", outs: [o.txt], role: training}}\n")
    };
    let out = validate_beside_a_json_import(&user("python3 train.py derived/te.txt > o.txt"), rows);
    assert_eq!(out.status.code(), Some(2), "expected a compile error: {}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("test pages through 'derived/te.txt' named in its cmd ← 'copy:") && err.contains("leak.yaml:"),
        "{err}"
    );
    // Naming its folder, which another node's out lies in, is no read of it.
    let out = validate_beside_a_json_import(&user("ls derived > o.txt; python3 train.py raw/tr.json"), rows);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Before, isolation went by path alone: a copy of the test file the import
/// reads (`cp raw/te.jsonl other/x.jsonl`), or of the test labels it stored
/// (`cp $(orchestrate path s.yaml data:labels.test) mine.jsonl`), was any
/// other file, and a training node reading it ran. A file a node reads with
/// the same bytes as data its role may not read is that data now: the node
/// fails when it is keyed, naming the file and what it copies, and nothing
/// runs or is stored.
#[test]
fn a_copy_of_test_data_under_another_name_is_test_data() {
    let p = Project::new();
    let rows: Vec<serde_json::Value> = (0..12).map(gsm_row).collect();
    write_jsonl(&p, "raw/tr.jsonl", &rows[..8]);
    write_jsonl(&p, "raw/te.jsonl", &rows[8..]);
    let data = format!("name: s\nnodes:\n{}", import_node("data", "{train: raw/tr.jsonl, test: raw/te.jsonl}", ""));
    let user = |role: &str, deps: &str| {
        format!("{data}  use:\n    op: shell\n    params: {{cmd: 'cat {deps} > o.txt', deps: [{deps}], outs: [o.txt], role: {role}}}\n")
    };
    // A copy of the raw test file, as a file dep and inside a folder dep.
    p.write("other/x.jsonl", &p.read("raw/te.jsonl"));
    for deps in ["other/x.jsonl", "other"] {
        p.write("s.yaml", &user("training", deps));
        assert_eq!(p.run(&["validate", "s.yaml"]).status.code(), Some(0), "{deps}: no path names test data");
        let out = p.run(&["run", "s.yaml"]);
        let said = stdout(&out) + &stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{deps}: {said}");
        assert!(
            said.contains("may not read test data")
                && said.contains("other/x.jsonl")
                && said.contains("'raw/te.jsonl', the file node 'data' imports as its test split"),
            "{deps}: {said}"
        );
        assert!(!p.path().join("o.txt").exists(), "{deps}: the node ran");
    }
    std::fs::remove_dir_all(p.path().join("other")).unwrap();
    // A copy of the stored test labels.
    p.write("s.yaml", &user("training", "raw/tr.jsonl"));
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "training on the train file runs: {}", stderr(&out));
    let labels = p.run(&["path", "s.yaml", "data:labels.test"]);
    std::fs::copy(stdout(&labels).trim(), p.path().join("mine.jsonl")).unwrap();
    p.write("s.yaml", &user("training", "mine.jsonl"));
    let out = p.run(&["run", "s.yaml"]);
    let said = stdout(&out) + &stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("mine.jsonl") && said.contains("'data:labels.test'"), "{said}");
    // Scoring may read it; inference may not read labels of any split.
    p.write("s.yaml", &user("scoring", "mine.jsonl"));
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    p.write("train-copy.jsonl", &p.read("raw/tr.jsonl"));
    p.write("s.yaml", &user("inference", "train-copy.jsonl"));
    let out = p.run(&["run", "s.yaml"]);
    let said = stdout(&out) + &stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("may not read labels") && said.contains("'raw/tr.jsonl'"), "{said}");
}

/// Runs a one-node import spec expected to fail; returns stderr, after
/// checking nothing was cached and the data file is unchanged.
fn import_fails(p: &Project, file: &str, fields: &str) -> String {
    let before = std::fs::read(p.path().join(file)).unwrap();
    p.write(
        "bad.yaml",
        &format!("name: bad\nnodes:\n{}", import_node_with("data", &format!("{{train: {file}}}"), fields, "")),
    );
    let out = p.run(&["run", "bad.yaml"]);
    assert_ne!(out.status.code(), Some(0), "{file} was imported: {}", stdout(&out));
    let err = stderr(&out) + &stdout(&out);
    let cached = p.run(&["path", "bad.yaml", "data:pages.train"]);
    assert_ne!(cached.status.code(), Some(0), "a failed import left a cached output");
    assert!(std::fs::read(p.path().join(file)).unwrap() == before, "the user's file changed");
    err
}

#[test]
fn bad_data_files_fail_naming_the_file_row_and_field_and_cache_nothing() {
    let p = Project::new();
    let good: Vec<serde_json::Value> = (0..3).map(gsm_row).collect();
    // A 200 MB line: refused at 4 MiB, without reading it whole.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(p.path().join("huge.jsonl")).unwrap();
        writeln!(f, "{}", good[0]).unwrap();
        let chunk = vec![b'x'; 1 << 20];
        f.write_all(b"{\"question\": \"").unwrap();
        for _ in 0..200 {
            f.write_all(&chunk).unwrap();
        }
        f.write_all(b"\"}\n").unwrap();
    }
    let err = import_fails(&p, "huge.jsonl", FIELDS);
    assert!(err.contains("huge.jsonl row 2 is longer than 4 MiB"), "{err}");
    // Invalid UTF-8.
    let mut bytes = (good[0].to_string() + "\n").into_bytes();
    bytes.extend_from_slice(b"{\"question\": \"caf\xe9\", \"answer\": \"1\", \"level\": \"easy\"}\n");
    std::fs::write(p.path().join("latin1.jsonl"), bytes).unwrap();
    let err = import_fails(&p, "latin1.jsonl", FIELDS);
    assert!(err.contains("latin1.jsonl row 2 is not UTF-8"), "{err}");
    // A ragged CSV row.
    p.write("ragged.csv", "question,answer,level\n\"q1\",\"#### 1\",easy\n\"q2\",\"#### 2\"\n");
    let err = import_fails(&p, "ragged.csv", FIELDS);
    assert!(err.contains("ragged.csv row 2") && err.contains("has 2 fields, but the header has 3"), "{err}");
    // A missing field, named with what the row has.
    p.write("nofield.jsonl", &format!("{}\n{{\"question\": \"q\", \"level\": \"easy\"}}\n", good[0]));
    let err = import_fails(&p, "nofield.jsonl", FIELDS);
    assert!(err.contains("nofield.jsonl row 2: no field 'answer'"), "{err}");
    // Duplicate ids.
    let with_ids: Vec<serde_json::Value> = good
        .iter()
        .map(|r| serde_json::json!({"k": "same", "question": r["question"], "answer": r["answer"], "level": "easy"}))
        .collect();
    write_jsonl(&p, "ids.jsonl", &with_ids);
    let err = import_fails(&p, "ids.jsonl", "fields: {prompt: question, answer: answer, id: k}");
    assert!(err.contains("ids.jsonl row 1 and ids.jsonl row 2 have the same id 'same'"), "{err}");
    // A prompt twice (within a split here; across splits in the unit tests).
    let mut dup = good.clone();
    dup.push(serde_json::json!({"question": good[1]["question"].as_str().unwrap().to_uppercase(), "answer": "#### 9", "level": "easy"}));
    write_jsonl(&p, "dup.jsonl", &dup);
    let err = import_fails(&p, "dup.jsonl", FIELDS);
    assert!(err.contains("dup.jsonl row 2 and dup.jsonl row 4 have the same prompt"), "{err}");
    // The same prompt in the train file and the test file: a leak, naming both rows.
    write_jsonl(&p, "tr.jsonl", &good);
    write_jsonl(
        &p,
        "te.jsonl",
        &[
            serde_json::json!({"question": format!("  {}", good[2]["question"].as_str().unwrap()), "answer": "#### 1", "level": "easy"}),
        ],
    );
    p.write(
        "leak.yaml",
        &format!("name: leak\nnodes:\n{}", import_node("data", "{train: tr.jsonl, test: te.jsonl}", "")),
    );
    let out = p.run(&["run", "leak.yaml"]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out) + &stdout(&out);
    assert!(
        err.contains("tr.jsonl row 3 and te.jsonl row 1 have the same prompt") && err.contains("across splits"),
        "{err}"
    );
    assert_ne!(p.run(&["path", "leak.yaml", "data:pages.train"]).status.code(), Some(0));
    // A Parquet file without a mapped column.
    write_parquet(&p, "nolevel.parquet", &good, Some("level"));
    let err = import_fails(&p, "nolevel.parquet", FIELDS);
    assert!(err.contains("nolevel.parquet: no column 'level' (its columns: answer, question)"), "{err}");
    // Not a Parquet file at all.
    p.write("fake.parquet", "question,answer\n");
    let err = import_fails(&p, "fake.parquet", FIELDS);
    assert!(err.contains("fake.parquet is not a readable Parquet file"), "{err}");
}

/// A Parquet float that is NaN or infinite (pandas writes a missing number
/// as NaN) in a mapped column is named as what it is. Before, it was read as
/// JSON `null`, and refused as "a null answer", or as a problem field
/// "missing or null", though the file holds a number there.
#[test]
fn a_nan_in_a_parquet_column_is_refused_as_nan_not_as_null() {
    let p = Project::new();
    for (bad, said) in [("NaN", "NaN"), ("Infinity", "inf"), ("-Infinity", "-inf")] {
        let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
        let rows = format!(
            "[{{\"question\": \"a\", \"answer\": 1.5, \"level\": \"easy\"}}, {{\"question\": \"b\", \"answer\": {bad}, \"level\": \"easy\"}}]"
        );
        p.write("rows.json", &rows);
        let script = "import json, sys\nimport pyarrow as pa, pyarrow.parquet as pq\npq.write_table(pa.Table.from_pylist(json.load(open(sys.argv[1]))), sys.argv[2])\n";
        let out = std::process::Command::new(python)
            .args([
                "-c",
                script,
                p.path().join("rows.json").to_str().unwrap(),
                p.path().join("nan.parquet").to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "pyarrow: {}", String::from_utf8_lossy(&out.stderr));
        let err = import_fails(&p, "nan.parquet", "fields: {prompt: question, answer: answer}");
        assert!(err.contains(&format!("nan.parquet row 2: column 'answer' is {said}")), "{bad}: {err}");
        assert!(!err.contains("null"), "{bad}: {err}");
    }
}

#[test]
fn a_data_file_through_a_link_or_outside_the_spec_folder_is_refused() {
    let p = Project::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("d.jsonl"), gsm_row(0).to_string() + "\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("d.jsonl"), p.path().join("link.jsonl")).unwrap();
    p.write("l.yaml", &format!("name: l\nnodes:\n{}", import_node("data", "{train: link.jsonl}", "")));
    let out = p.run(&["run", "l.yaml"]);
    assert_ne!(out.status.code(), Some(0));
    assert!((stderr(&out) + &stdout(&out)).contains("is a symbolic link"), "{}", stderr(&out));
    p.write("o.yaml", &format!("name: o\nnodes:\n{}", import_node("data", "{train: ../d.jsonl}", "")));
    let out = p.run(&["validate", "o.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("params.files.train") && stderr(&out).contains("inside it"), "{}", stderr(&out));
}

/// A model of the embedded default's shape, built on the imported train split.
const OWN_MODEL: &str = "  tokenizer:\n    op: tokenizer.build\n    inputs: {pages: 'data:pages.train', labels: 'data:labels.train'}\n    params: {vocab_size: 400}\n  base:\n    op: model.init\n    inputs: {tokenizer: 'tokenizer:tokenizer'}\n    params: {seed: 0, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1}\n";

#[test]
fn an_own_task_trains_evaluates_and_scores_with_its_verifier_and_populations() {
    let p = Project::new();
    let rows: Vec<serde_json::Value> = (0..36).map(gsm_row).collect();
    write_jsonl(&p, "tr.jsonl", &rows[..24]);
    write_csv(&p, "va.csv", &rows[24..28]);
    write_parquet(&p, "te.parquet", &rows[28..], None);
    let spec = format!(
        "name: own\nnodes:\n{}{OWN_MODEL}  sft:\n    op: train.sft\n    inputs: {{model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train', validation_pages: 'data:pages.validation', validation_labels: 'data:labels.validation'}}\n    params: {{branch: warmstart, epochs: 1, batch_size: 4, lr: 1e-3}}\n  grpo:\n    op: train.grpo\n    inputs: {{model: 'sft:model', pages: 'data:pages.train', labels: 'data:labels.train'}}\n    params: {{iterations: 1, group_size: 2, prompts_per_iteration: 2, max_new_tokens: 8, lr: 1e-4, verifier: gsm8k_last_number}}\n  gen:\n    op: eval.generate\n    inputs: {{model: 'grpo:model', pages: 'data:pages.test'}}\n    params: {{draws: 1, max_new_tokens: 8}}\n  score:\n    op: eval.score\n    inputs: {{responses: 'gen:responses', summary: 'gen:summary', labels: 'data:labels.test'}}\n    params: {{verifier: gsm8k_last_number, policy: grpo}}\n  table:\n    op: results.table\n    inputs: {{evals: ['score:results']}}\n    params: {{policies: [grpo]}}\n",
        import_node("data", "{train: tr.jsonl, validation: va.csv, test: te.parquet}", ", warmstart: 8")
    );
    p.write("own.yaml", &spec);
    let ev = p.run_json(&["own.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_failed"), Vec::<String>::new());
    let out = p.run(&["path", "own.yaml", "score:results"]);
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(stdout(&out).trim()).unwrap()).unwrap();
    assert_eq!(results["verifier"]["name"], "gsm8k_last_number");
    // The populations are the data's (the `level` field), beside ALL.
    let greedy = results["greedy"].as_object().unwrap();
    assert_eq!(greedy.keys().collect::<Vec<_>>(), ["ALL", "easy", "hard"]);
    let hard = rows[28..].iter().filter(|r| r["level"] == "hard").count();
    assert_eq!(greedy["ALL"]["problems"], 8);
    assert_eq!(greedy["hard"]["problems"], hard);
    assert_eq!(greedy["easy"]["problems"], 8 - hard);
    // The SFT trained on the reference responses (their tokens), not on EOS alone.
    let sft = p.run(&["path", "own.yaml", "sft:metrics"]);
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(stdout(&sft).trim()).unwrap()).unwrap();
    // 4 rows an update: EOS alone would be 4 tokens; each reference response is over 15.
    let tokens = m["history"][0]["tokens"].as_f64().unwrap_or_else(|| panic!("no tokens in {m}"));
    assert!(tokens > 60.0, "{tokens} tokens in the first update: {m}");
    let table = p.run(&["path", "own.yaml", "table:table.md"]);
    let md = std::fs::read_to_string(stdout(&table).trim()).unwrap();
    assert!(md.contains("| grpo | hard |") && md.contains("| grpo | ALL |"), "{md}");
    // A prompt_template wraps each statement: 300 words around it pass the prompt budget.
    let long = format!("nodes.gen.params.prompt_template={}{{prompt}}", "Please think. ".repeat(150));
    let out = p.run(&["run", "own.yaml", "--set", &long]);
    assert_ne!(out.status.code(), Some(0));
    assert!((stderr(&out) + &stdout(&out)).contains("over the budget of 256"), "{}", stderr(&out));
    let out = p.run(&["validate", "own.yaml", "--set", "nodes.gen.params.prompt_template=Solve"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("prompt_template") && stderr(&out).contains("{prompt}"), "{}", stderr(&out));
}

#[test]
fn labels_without_the_fields_training_needs_fail_saying_what_each_field_selects() {
    let p = Project::new();
    let rows: Vec<serde_json::Value> = (0..12).map(gsm_row).collect();
    write_jsonl(&p, "tr.jsonl", &rows);
    // A shell node writes labels without `warmstart`; imported data without reference responses.
    p.write(
        "strip.py",
        "import json, sys\nfor l in open(sys.argv[1]):\n    r = json.loads(l); r.pop(sys.argv[3]); print(json.dumps(r), file=open(sys.argv[2], 'a'))\n",
    );
    let sft = |labels: &str| {
        format!("  sft:\n    op: train.sft\n    inputs: {{model: 'base:model', pages: 'data:pages.train', labels: '{labels}', validation_pages: 'data:pages.train', validation_labels: 'data:labels.train'}}\n    params: {{branch: sft, epochs: 1, batch_size: 4}}\n")
    };
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let spec = format!(
        "name: strip\nnodes:\n{}{OWN_MODEL}  strip:\n    op: shell\n    inputs: {{l: 'data:labels.train'}}\n    params: {{cmd: '{python} strip.py $ORCHESTRATE_INPUT_L s.jsonl warmstart', outs: [s.jsonl]}}\n{}",
        import_node("data", "{train: tr.jsonl}", ", warmstart: 4"),
        sft("strip:s.jsonl")
    );
    p.write("s.yaml", &spec);
    let out = p.run(&["run", "s.yaml"]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out) + &stdout(&out);
    assert!(err.contains("row 1: field 'warmstart'") && err.contains("missing"), "{err}");
    assert!(err.contains("true selects the warm-start SFT set"), "{err}");
    // Without reference responses SFT refuses, naming the label and the field.
    let no_ref = format!(
        "name: noref\nnodes:\n{}{}{OWN_MODEL}{}",
        import_node("data", "{train: tr.jsonl}", ", warmstart: 4"),
        import_node_with("bare", "{train: tr.jsonl}", "fields: {prompt: question, answer: answer}", ", warmstart: 4"),
        sft("bare:labels.train").replace("'data:", "'bare:")
    );
    p.write("n.yaml", &no_ref);
    let out = p.run(&["run", "n.yaml"]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out) + &stdout(&out);
    assert!(
        err.contains("label 'h") && err.contains("has no 'reference_response' (the response train.sft trains on)"),
        "{err}"
    );
}

/// A reward of two terms, a verifier and a Python program, trains GRPO: the
/// iteration's mean reward is the weighted sum of the terms' means, each
/// term is logged under its name; the program's file is in the key (an
/// edit re-runs only GRPO); a program that crashes, or replies NaN, fails
/// the node with the term, the program and the row named, and nothing is
/// cached for it.
#[test]
fn a_reward_program_is_summed_logged_keyed_and_its_failures_fail_the_node() {
    let p = Project::new();
    let rows: Vec<serde_json::Value> = (0..24).map(gsm_row).collect();
    write_jsonl(&p, "tr.jsonl", &rows[..20]);
    write_jsonl(&p, "te.jsonl", &rows[20..]);
    let short = "import json, sys\nfor line in sys.stdin:\n    req = json.loads(line)\n    ok = len(req['response']) < 12 and req['label']['id'] == req['id']\n    print(json.dumps({'reward': 1.0 if ok else 0.0, 'valid': True, 'reason': None if ok else 'long'}), flush=True)\n";
    p.write("rewards/short.py", short);
    let spec = format!(
        "name: rw\nnodes:\n{}{OWN_MODEL}  grpo:\n    op: train.grpo\n    inputs: {{model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train'}}\n    params:\n      iterations: 2\n      group_size: 2\n      prompts_per_iteration: 2\n      max_new_tokens: 8\n      lr: 1.0e-4\n      reward:\n        - {{name: correct, verifier: gsm8k_last_number, weight: 1.0}}\n        - {{name: short, command: [python3, rewards/short.py], weight: 0.5}}\n",
        import_node("data", "{train: tr.jsonl, test: te.jsonl}", ", warmstart: 4")
    );
    p.write("rw.yaml", &spec);
    let ev = p.run_json(&["rw.yaml"], 0);
    assert!(nodes_with(&ev, "node_finished").contains(&"grpo".to_string()));
    let metrics = bytes_of(&p, "rw.yaml", "grpo:metrics");
    let m: serde_json::Value = serde_json::from_slice(&metrics).unwrap();
    for h in m["history"].as_array().unwrap() {
        let terms = h["reward_terms"].as_object().unwrap_or_else(|| panic!("no reward_terms in {h}"));
        assert_eq!(terms.keys().collect::<Vec<_>>(), ["correct", "short"]);
        let (c, s) = (terms["correct"]["mean"].as_f64().unwrap(), terms["short"]["mean"].as_f64().unwrap());
        let rewards: Vec<f64> = h["rewards"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap()).collect();
        let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
        assert!((mean - (c + 0.5 * s)).abs() < 1e-12, "mean {mean} = {c} + 0.5 × {s}");
        // Each response's reward is one of the four sums the terms can make.
        assert!(rewards.iter().all(|r| [0.0, 0.5, 1.0, 1.5].contains(r)), "{rewards:?}");
    }
    // What computing the rewards took is in the node's record, per iteration.
    let status: serde_json::Value = serde_json::from_str(&stdout(&p.run(&["status", "--json"]))).unwrap();
    let grpo = status["nodes"].as_array().unwrap().iter().find(|n| n["node_id"] == "grpo").unwrap();
    for (_, c) in grpo["costs"]["iterations"].as_object().unwrap() {
        assert!(c["reward_seconds"].as_f64().unwrap() > 0.0, "{c}");
    }
    // The envelope named the sum of terms, which the guard accepted: weights changed.
    assert!(m["history"][0]["weights_changed"].as_bool().unwrap(), "{}", m["history"][0]);
    // A reward the run did not register (F9), or an alias of its own (F6), is refused.
    for family in ["F9", "F6"] {
        let set = format!("nodes.grpo.params.faults=[{{family: {family}, at_iteration: 0}}]");
        p.run_json(&["rw.yaml", "--set", &set], 0);
        let out = p.run(&["path", "rw.yaml", "grpo:metrics", "--set", &set]);
        let f: serde_json::Value = serde_json::from_slice(&std::fs::read(stdout(&out).trim()).unwrap()).unwrap();
        let detections = f["guard"]["detections"].as_array().unwrap();
        assert_eq!(detections.len(), 1, "{family}: {}", f["guard"]);
        assert_eq!(detections[0]["iteration"], 0);
        assert!(!f["history"][0]["weights_changed"].as_bool().unwrap(), "{family}: no step on a refused batch");
    }
    // The program's file is in the key: an edit re-runs GRPO alone.
    p.write("rewards/short.py", &format!("{short}# tuned\n"));
    let ev = p.run_json(&["rw.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["grpo"]);
    let started = ev.iter().find(|e| e["event"] == "node_started").unwrap();
    assert!(started["reason"].as_str().unwrap().contains("rewards/short.py"), "{started}");
    // A crash and a NaN reply each fail the node, naming the term, the program and the row.
    for (body, says) in [
        ("import sys\nsys.stdin.readline()\nsys.stderr.write('KeyError: answer\\n')\nsys.exit(2)\n", "exited with code 2 without replying"),
        ("import json, sys\nfor line in sys.stdin:\n    print(json.dumps({'reward': float('nan'), 'valid': True}), flush=True)\n", "not a finite number"),
    ] {
        p.write("rewards/short.py", body);
        let ev = p.run_json(&["rw.yaml"], 1);
        let failed = ev.iter().find(|e| e["event"] == "node_failed").unwrap_or_else(|| panic!("{ev:?}"));
        let error = failed["error"].as_str().unwrap();
        assert!(error.contains("reward 'short' (`python3 rewards/short.py`): row 0 (problem "), "{error}");
        assert!(error.contains(says), "{error}");
        // Nothing cached: the same spec runs the node again (and fails again).
        let again = p.run_json(&["rw.yaml"], 1);
        assert_eq!(nodes_with(&again, "node_failed"), ["grpo"]);
        assert!(!nodes_with(&again, "cache_hit").contains(&"grpo".to_string()));
    }
    // A bad term is a spec error naming the field.
    let out = p.run(&["validate", "rw.yaml", "--set", "nodes.grpo.params.reward.1.weight=.nan"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = p.run(&["validate", "rw.yaml", "--set", "nodes.grpo.params.verifier=gsm8k_last_number"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("either 'verifier' or 'reward'"), "{}", stderr(&out));
}

/// The two shipped examples, copied as a user would find them: each tiny
/// profile runs from generated data through SFT, GRPO on its reward terms
/// (programs among them), evaluation and the results table, and freezes
/// into a pack that verifies; each default profile (the Hub's data and model)
/// validates.
#[test]
fn the_shipped_gsm8k_and_countdown_examples_run_tiny_and_freeze_a_verified_pack() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    for (name, terms, scored_by) in
        [("gsm8k", ["correct", "format"], "gsm8k_last_number"), ("countdown", ["correct", "format"], "program:")]
    {
        let p = Project::new();
        p.write(&format!("{name}.yaml"), &std::fs::read_to_string(root.join(format!("{name}.yaml"))).unwrap());
        for entry in std::fs::read_dir(root.join(name)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                let rel = format!("{name}/{}", path.file_name().unwrap().to_string_lossy());
                p.write(&rel, &std::fs::read_to_string(&path).unwrap());
            }
        }
        let spec = format!("{name}.yaml");
        let out = p.run(&["validate", &spec]);
        assert_eq!(out.status.code(), Some(0), "{name} default profile: {}", stderr(&out));
        let ev = p.run_json(&[&spec, "--profile", "tiny"], 0);
        assert_eq!(nodes_with(&ev, "node_failed"), Vec::<String>::new(), "{name}");
        let m: serde_json::Value =
            serde_json::from_slice(&bytes_of_profile(&p, &spec, "grpo:metrics", "tiny")).unwrap();
        let last = m["history"].as_array().unwrap().last().unwrap().clone();
        let logged: Vec<&String> = last["reward_terms"].as_object().unwrap().keys().collect();
        assert_eq!(logged, terms, "{name}: {last}");
        let results: serde_json::Value =
            serde_json::from_slice(&bytes_of_profile(&p, &spec, "score@policy=grpo:results", "tiny")).unwrap();
        assert!(
            results["verifier"]["name"].as_str().unwrap().starts_with(scored_by),
            "{name}: {}",
            results["verifier"]
        );
        assert_eq!(results["greedy"]["ALL"]["responses"], 40, "{name}");
        let table = String::from_utf8(bytes_of_profile(&p, &spec, "table:table.md", "tiny")).unwrap();
        assert!(table.contains("| grpo | ALL |") && table.contains("| sft | ALL |"), "{table}");
        let pack = p.path().join("pack");
        let out = p.run(&["pack", "freeze", &spec, "--profile", "tiny", "--out", pack.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        let out = p.run(&["pack", "verify", pack.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
    }
}

fn bytes_of_profile(p: &Project, spec: &str, output: &str, profile: &str) -> Vec<u8> {
    let out = p.run(&["path", spec, output, "--profile", profile]);
    assert_eq!(out.status.code(), Some(0), "{output}: {}", stderr(&out));
    std::fs::read(stdout(&out).trim()).unwrap()
}

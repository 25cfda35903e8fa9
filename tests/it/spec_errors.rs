//! Every bad spec gets one clear error with file, line and column, and exit code 2.

use crate::common;

use common::{stderr, Project};

/// Validates `yaml` and returns stderr, asserting exit code 2.
fn rejected(yaml: &str, extra: &[&str]) -> String {
    let p = Project::new();
    p.write("bad.yaml", yaml);
    let mut args = vec!["validate", "bad.yaml"];
    args.extend_from_slice(extra);
    let out = p.run(&args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "expected exit 2, stderr: {err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("error:")).count(), 1, "one error: {err}");
    err
}

const GOOD_NODE: &str = "  a:\n    op: shell\n    params:\n      cmd: echo a > a.txt\n      outs: [a.txt]\n";

#[test]
fn an_unknown_key_names_the_nearest_valid_one_with_its_position() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}  b:\n    opp: shell\n"), &[]);
    assert!(err.contains("bad.yaml:9:5"), "{err}");
    assert!(err.contains("unknown key 'opp'") && err.contains("did you mean 'op'"), "{err}");
}

#[test]
fn an_unknown_top_level_key_is_located() {
    let err = rejected(&format!("name: x\nnode:\n{GOOD_NODE}"), &[]);
    assert!(err.contains("bad.yaml:2:1"), "{err}");
    assert!(err.contains("did you mean 'nodes'"), "{err}");
}

#[test]
fn an_unknown_param_names_the_nearest_valid_one() {
    let err = rejected("name: x\nnodes:\n  a:\n    op: shell\n    params:\n      cmd: echo\n      out: [a.txt]\n", &[]);
    assert!(err.contains("bad.yaml:7:7"), "{err}");
    assert!(err.contains("unknown param 'out'") && err.contains("did you mean 'outs'"), "{err}");
}

#[test]
fn a_wrong_type_says_what_was_expected() {
    let err = rejected("name: x\nnodes:\n  a:\n    op: shell\n    params:\n      cmd: [echo, hi]\n", &[]);
    assert!(err.contains("bad.yaml:6:12"), "{err}");
    assert!(err.contains("expected a string"), "{err}");
}

#[test]
fn an_unknown_op_lists_the_known_ones() {
    let err = rejected("name: x\nnodes:\n  a:\n    op: shel\n", &[]);
    assert!(err.contains("bad.yaml:4:9"), "{err}");
    assert!(
        err.contains("unknown op 'shel'")
            && err.contains(&format!(
                "known ops: {}",
                orchestrate_core::ops::Registry::builtin().names().collect::<Vec<_>>().join(", ")
            ))
            && err.contains("did you mean 'shell'"),
        "{err}"
    );
}

#[test]
fn a_reference_to_a_missing_node_is_located_and_suggests_one() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}  b:\n    op: shell\n    params: {{cmd: 'true'}}\n    inputs:\n      data: aa:a.txt\n"), &[]);
    assert!(err.contains("bad.yaml:12:13"), "{err}");
    assert!(err.contains("no node 'aa'") && err.contains("did you mean 'a'"), "{err}");
}

#[test]
fn a_reference_to_a_missing_output_lists_the_outputs() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}  b:\n    op: shell\n    params: {{cmd: 'true'}}\n    inputs:\n      data: a:b.txt\n"), &[]);
    assert!(err.contains("has no output 'b.txt'") && err.contains("its outputs: a.txt"), "{err}");
}

#[test]
fn a_cycle_names_every_node_on_it() {
    let yaml = "name: x\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'true', deps: [c.txt], outs: [a.txt]}\n  b:\n    op: shell\n    params: {cmd: 'true', deps: [a.txt], outs: [b.txt]}\n  c:\n    op: shell\n    params: {cmd: 'true', deps: [b.txt], outs: [c.txt]}\n";
    let err = rejected(yaml, &[]);
    assert!(err.contains("cycle: a → b → c → a"), "{err}");
}

#[test]
fn a_duplicate_node_id_is_an_error_at_its_second_definition() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}{GOOD_NODE}"), &[]);
    assert!(err.contains("bad.yaml:8:3"), "{err}");
    assert!(err.contains("duplicate node id 'a'") && err.contains("first defined at line 3"), "{err}");
}

#[test]
fn a_matrix_that_produces_one_id_twice_is_a_duplicate_id() {
    let err = rejected(
        "name: x\nnodes:\n  a:\n    op: shell\n    matrix:\n      env.N: [1, 1]\n    params: {cmd: 'true'}\n",
        &[],
    );
    assert!(err.contains("node id 'a@env.N=1' is produced twice"), "{err}");
}

#[test]
fn two_nodes_writing_one_file_is_an_error() {
    let err = rejected(
        &format!("name: x\nnodes:\n{GOOD_NODE}  b:\n    op: shell\n    params: {{cmd: 'true', outs: [./a.txt]}}\n"),
        &[],
    );
    assert!(err.contains("'a.txt' is written by both 'a' and 'b'"), "{err}");
}

#[test]
fn invalid_yaml_points_at_the_syntax_error() {
    let err = rejected("name: x\nnodes: [\n", &[]);
    assert!(err.contains("bad.yaml:"), "{err}");
    assert!(err.contains("invalid YAML"), "{err}");
}

#[test]
fn an_unknown_profile_lists_the_profiles() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}profiles:\n  tiny: {{}}\n"), &["--profile", "tinny"]);
    assert!(
        err.contains("no profile 'tinny'")
            && err.contains("did you mean 'tiny'")
            && err.contains("profiles in this spec: tiny"),
        "{err}"
    );
}

#[test]
fn a_set_with_a_missing_parent_names_the_keys_that_exist() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}"), &["--set", "nodes.aa.params.cmd=x"]);
    assert!(err.contains("--set nodes.aa.params.cmd=x"), "{err}");
    assert!(err.contains("no key 'aa' under 'nodes'") && err.contains("did you mean 'a'"), "{err}");
}

#[test]
fn an_error_set_on_the_command_line_is_attributed_to_the_set() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}"), &["--set", "nodes.a.params.outs=5"]);
    assert!(err.contains("--set nodes.a.params.outs=5"), "{err}");
}

#[test]
fn an_error_inside_a_profile_points_into_the_profile() {
    let yaml = format!(
        "name: x\nnodes:\n{GOOD_NODE}profiles:\n  tiny:\n    nodes:\n      a:\n        params:\n          cmdd: echo\n"
    );
    let err = rejected(&yaml, &["--profile", "tiny"]);
    assert!(err.contains("bad.yaml:13:11"), "{err}");
    assert!(err.contains("unknown param 'cmdd'"), "{err}");
}

#[test]
fn an_extends_cycle_is_an_error() {
    let p = Project::new();
    p.write("a.yaml", "extends: b.yaml\nname: a\nnodes: {}\n");
    p.write("b.yaml", "extends: a.yaml\nname: b\nnodes: {}\n");
    let out = p.run(&["validate", "a.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("extends cycle"), "{}", stderr(&out));
}

#[test]
fn an_unknown_node_for_force_or_explain_is_a_usage_error() {
    let p = Project::new();
    p.write("spec.yaml", &format!("name: x\nnodes:\n{GOOD_NODE}"));
    for args in [vec!["run", "spec.yaml", "--force", "b"], vec!["explain", "spec.yaml", "b"]] {
        let out = p.run(&args);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains("no node 'b'"), "{}", stderr(&out));
    }
}

/// (Issue #34.) A typed training param outside its range is refused at validate,
/// naming the field and the range, before anything runs.
#[test]
fn a_training_param_outside_its_range_is_refused_at_validate() {
    let sft = "  sft:\n    op: train.sft\n    inputs: {model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train', validation_pages: 'data:pages.validation', validation_labels: 'data:labels.validation'}\n    params: {branch: warmstart, epochs: 1, PARAM: VALUE}\n";
    let grpo = "  grpo:\n    op: train.grpo\n    inputs: {model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train'}\n    params: {iterations: 2, PARAM: VALUE}\n";
    let cases = [
        (sft, "lr", "-0.001", "greater than 0"),
        (sft, "lr", "0", "greater than 0"),
        // NaN and infinities have no JSON form: refused as such, where written.
        (sft, "lr", ".nan", "is .nan, a number JSON cannot hold"),
        (sft, "warmup_ratio", "1.5", "[0, 1]"),
        (sft, "max_grad_norm", "0", "greater than 0"),
        (grpo, "lr", "-0.001", "greater than 0"),
        (grpo, "lr", "0", "greater than 0"),
        (grpo, "lr", ".nan", "is .nan, a number JSON cannot hold"),
        (grpo, "clip_eps", "1.5", "(0, 1)"),
        (grpo, "clip_eps", "0", "(0, 1)"),
        (grpo, "beta", "-0.02", "at least 0"),
        (grpo, "min_lr_ratio", "-0.1", "[0, 1]"),
        (grpo, "weight_decay", ".inf", "is .inf, a number JSON cannot hold"),
        (grpo, "weight_decay", "-0.01", "at least 0"),
        (grpo, "behavior_tolerance", "0", "greater than 0"),
        (grpo, "max_new_tokens", "0", "at least 1"),
    ];
    for (node, param, value, range) in cases {
        let yaml = common::tiny_spec("r", &node.replace("PARAM", param).replace("VALUE", value));
        let err = rejected(&yaml, &[]);
        assert!(err.contains(param) && err.contains(range), "{param}: {value}: {err}");
    }
    // In range, the same nodes validate.
    let p = Project::new();
    p.write(
        "ok.yaml",
        &common::tiny_spec(
            "r",
            &format!(
                "{}{}",
                sft.replace("PARAM", "lr").replace("VALUE", "1e-3"),
                grpo.replace("PARAM", "clip_eps").replace("VALUE", "0.2")
            ),
        ),
    );
    let out = p.run(&["validate", "ok.yaml"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_bad_command_line_is_exit_code_2() {
    let p = Project::new();
    let out = p.run(&["run"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Every committed experiment compiles, with each of its profiles: a spec under
/// experiments/ that no test runs (a sweep) still cannot rot unnoticed.
#[test]
fn every_committed_experiment_validates_with_each_profile() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("experiments")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut profiles: Vec<Option<String>> = vec![None];
        if let Some(map) = doc.get("profiles").and_then(|p| p.as_mapping()) {
            profiles.extend(map.keys().filter_map(|k| k.as_str()).map(|k| Some(k.to_string())));
        }
        for profile in profiles {
            let mut cmd = std::process::Command::new(common::bin());
            cmd.arg("validate").arg(&path).current_dir(root);
            if let Some(p) = &profile {
                cmd.args(["--profile", p]);
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{} {profile:?}: {}", path.display(), common::stderr(&out));
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} spec/profile pairs found");
}

#[test]
fn threads_are_refused_on_a_node_libtorch_does_not_run() {
    let err = rejected(&format!("name: x\nnodes:\n{GOOD_NODE}    threads: 2\n"), &[]);
    assert!(err.contains("bad.yaml:8:14"), "{err}");
    assert!(err.contains("node 'a' (shell): threads: only numerical ops"), "{err}");
    let err = rejected(
        "name: x\nnodes:\n  d:\n    op: dataset.stock_arithmetic\n  t:\n    op: tokenizer.build\n    inputs: {pages: 'd:pages.train', labels: 'd:labels.train'}\n  m:\n    op: model.init\n    inputs: {tokenizer: 't:tokenizer'}\n    threads: 0\n",
        &[],
    );
    assert!(err.contains("bad.yaml:11:14") && err.contains("threads"), "{err}");
}

/// A bound only the params' schema states (`#[schemars(range(..))]`, not
/// serde's types) is checked too: at validate, naming the node, the param,
/// the bound and where it was written, a matrix axis included.
#[test]
fn a_param_below_a_bound_its_schema_states_is_refused_where_it_was_written() {
    let yaml = common::tiny_spec("r", "").replace("params: {vocab_size: 400}", "params: {vocab_size: 10}");
    let err = rejected(&yaml, &[]);
    assert!(err.contains("bad.yaml:9:"), "located at the tokenizer's params: {err}");
    assert!(err.contains("node 'tokenizer' (tokenizer.build): params.vocab_size"), "{err}");
    assert!(err.contains("10 is less than the minimum of 300"), "{err}");

    let yaml = common::tiny_spec("r", "").replace(
        "params: {seed: 0, hidden_size: 64,",
        "matrix: {max_position_embeddings: [512, 256]}\n    params: {seed: 0, hidden_size: 64,",
    );
    let err = rejected(&yaml, &[]);
    assert!(err.contains("bad.yaml:13:"), "located at the matrix axis: {err}");
    let node = "node 'base@max_position_embeddings=256' (model.init): params.max_position_embeddings";
    assert!(err.contains(node), "{err}");
    assert!(err.contains("256 is less than the minimum of 320"), "{err}");
}

/// A number JSON cannot hold (`.inf`, `-.inf`, `.nan`) was read as `null`:
/// in a value it was said as "null"; in a matrix `[.inf, -.inf]` was one id
/// twice (`a@clip=null`); in a spec that `extends` another, or in `--set`,
/// the null removed the key it set (a merge's null removes), so the run went
/// on with the key unset. Each is now refused where it was written.
#[test]
fn a_number_json_cannot_hold_is_refused_where_it_was_written_never_read_as_null() {
    let node = "  a:\n    op: shell\n    params:\n      cmd: 'echo $X > a.txt'\n      outs: [a.txt]\n";
    let err = rejected(&format!("name: x\nnodes:\n{node}      env: {{X: .inf}}\n"), &[]);
    assert!(err.contains("bad.yaml:8:") && err.contains("nodes.a.params.env.X is .inf"), "{err}");
    let err = rejected(&format!("name: x\nnodes:\n{node}    matrix:\n      clip: [1, -.inf]\n"), &[]);
    assert!(err.contains("bad.yaml:9:") && err.contains("nodes.a.matrix.clip.1 is -.inf"), "{err}");
    let err = rejected(&format!("name: x\nnodes:\n{node}"), &["--set", "nodes.a.params.env.X=.NaN"]);
    assert!(err.contains("--set nodes.a.params.env.X=.NaN") && err.contains("is .nan"), "{err}");
    // A spec extending one that sets X: before, the run went on without X.
    let p = Project::new();
    p.write("base.yaml", &format!("name: x\nnodes:\n{node}      env: {{X: '1'}}\n"));
    p.write("child.yaml", "extends: base.yaml\nnodes:\n  a:\n    params:\n      env: {X: -.inf}\n");
    let out = p.run(&["run", "child.yaml"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("child.yaml:5:") && err.contains("nodes.a.params.env.X is -.inf"), "{err}");
    assert!(!p.path().join("a.txt").exists(), "the node ran");
}

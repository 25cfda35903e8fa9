//! Issue #31: a researcher's own pipeline, as written for DVC or Snakemake.
//! Folder outs and deps, glob deps, a missing dep said at `validate`.

use crate::common;

use common::{events, nodes_with, stderr, stdout, Project, TRAINER, TRL_SWEEP};

/// A `prepare` step writing a data folder and a `train` step writing a
/// checkpoint folder the way TRL's `output_dir` does; train "resumes" from a
/// `checkpoint-last.json` if one is there, as a careless script would.
const PIPELINE: &str = r#"name: own
nodes:
  prepare:
    op: shell
    params:
      cmd: mkdir -p data/prepared && echo '{"x":1}' > data/prepared/train.jsonl && echo '{"x":2}' > data/prepared/val.jsonl
      deps: [raw]
      outs: [data/prepared]
  train:
    op: shell
    params:
      cmd: >-
        test ! -e out/checkpoint-last.json || { echo stale checkpoint found >&2; exit 3; };
        mkdir -p out/checkpoint-1 && cat data/prepared/train.jsonl > out/checkpoint-1/model.bin &&
        echo "$LR" > out/lr.txt
      deps: [data/prepared]
      outs: [out]
      env: {LR: 0.1}
"#;

fn project() -> Project {
    let p = Project::new();
    p.write("raw/a.csv", "1,2\n");
    p.write("p.yaml", PIPELINE);
    p
}

#[test]
fn a_folder_out_is_stored_whole_and_a_folder_dep_makes_an_edge() {
    let p = project();
    let out = p.run(&["run", "p.yaml", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let ev = events(&out);
    assert_eq!(nodes_with(&ev, "node_finished"), ["prepare", "train"], "{}", stdout(&out));
    assert_eq!(p.read("out/checkpoint-1/model.bin"), "{\"x\":1}\n");
    // Nothing changed: both cached, the folders left as they are.
    let again = p.run(&["run", "p.yaml", "--json"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(nodes_with(&events(&again), "cache_hit"), ["prepare", "train"]);
    // A file added inside an out folder: the out no longer matches its object.
    p.write("out/checkpoint-last.json", "{\"epoch\": 7}");
    let plan = p.run(&["plan", "p.yaml"]);
    assert!(stdout(&plan).contains("train"), "{}", stdout(&plan));
    // The whole out is removed before the command runs, so the stale file cannot be "resumed" from.
    let rerun = p.run(&["run", "p.yaml", "--json"]);
    assert_eq!(rerun.status.code(), Some(0), "{}{}", stdout(&rerun), stderr(&rerun));
    assert!(!p.path().join("out/checkpoint-last.json").exists(), "a stale file survived in the out folder");
    // The folder dep's files are in train's key, and plan names the file that changed.
    p.write("data/prepared/val.jsonl", "{\"x\":3}\n");
    let plan = p.run(&["plan", "p.yaml"]);
    let text = stdout(&plan);
    assert!(text.contains("prepare") && text.contains("val.jsonl"), "{text}");
}

#[test]
fn a_folder_dep_no_node_writes_is_hashed_as_a_tree_and_its_changed_files_are_named() {
    let p = Project::new();
    p.write("data/prepared/train.jsonl", "1\n");
    p.write("data/prepared/val.jsonl", "2\n");
    p.write(
        "p.yaml",
        "name: d\nnodes:\n  count:\n    op: shell\n    params: {cmd: cat data/prepared/*.jsonl | wc -l > n.txt, deps: [data/prepared], outs: [n.txt]}\n",
    );
    let out = p.run(&["run", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    p.write("data/prepared/train.jsonl", "1\n1\n");
    p.write("data/prepared/test.jsonl", "3\n");
    let plan = p.run(&["plan", "p.yaml"]);
    let text = stdout(&plan);
    assert!(
        text.contains("dep 'data/prepared': test.jsonl added, train.jsonl changed"),
        "plan does not name the files that changed: {text}"
    );
    std::fs::remove_file(p.path().join("data/prepared/val.jsonl")).unwrap();
    let text = stdout(&p.run(&["plan", "p.yaml"]));
    assert!(text.contains("val.jsonl removed"), "{text}");
}

/// Before, a researcher's `deps: [src]` beside `python3 src/train.py`
/// (which imports `src/model.py`) ran the node twice for every edit of the
/// code: its run wrote `src/__pycache__/model.cpython-*.pyc`, which the next
/// `plan` found added (or changed) in the dep, and ran the training again.
/// Python's bytecode cache is written by Python from the `.py` files the key
/// holds, so a folder or glob dep leaves `__pycache__` out, as it leaves out
/// `.git`; an edit of the source still runs the node, once.
#[test]
fn pythons_bytecode_cache_in_a_folder_dep_does_not_run_the_node_again() {
    let p = Project::new();
    p.write("src/model.py", "def f():\n    return 3\n");
    p.write(
        "src/train.py",
        "import sys\nsys.path.insert(0, 'src')\nimport model\nopen('out.txt', 'w').write(str(model.f()))\n",
    );
    p.write(
        "p.yaml",
        "name: py\nnodes:\n  train:\n    op: shell\n    params: {cmd: python3 src/train.py, deps: [src], outs: [out.txt]}\n  \
         glob:\n    op: shell\n    params: {cmd: 'cat src/*.py > g.txt', deps: ['src/**'], outs: [g.txt]}\n",
    );
    let run = |p: &Project| {
        // Python writes its bytecode cache unless told not to (this machine's environment does).
        let o = p.cmd(&["run", "p.yaml"]).env_remove("PYTHONDONTWRITEBYTECODE").output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    };
    let plan = |p: &Project| stdout(&p.run(&["plan", "p.yaml"]));
    run(&p);
    assert!(p.path().join("src/__pycache__").is_dir(), "python3 wrote no bytecode cache, so this test shows nothing");
    assert!(plan(&p).contains("2 cached, 0 to run"), "{}", plan(&p));
    // Another size: Python takes a .pyc as current by its source's size and modification second.
    p.write("src/model.py", "def f():\n    return 42\n");
    let text = plan(&p);
    assert!(text.contains("dep 'src': model.py changed") && text.contains("0 cached, 2 to run"), "{text}");
    run(&p);
    assert_eq!(p.read("out.txt"), "42");
    assert!(plan(&p).contains("2 cached, 0 to run"), "{}", plan(&p));
}

#[test]
fn a_glob_dep_expands_sorted_into_the_key_and_one_matching_nothing_is_an_error() {
    let p = Project::new();
    p.write("data/a.jsonl", "a\n");
    p.write("data/b.jsonl", "b\n");
    p.write("data/notes.txt", "n\n");
    p.write(
        "p.yaml",
        "name: g\nnodes:\n  cat:\n    op: shell\n    params: {cmd: cat data/*.jsonl > all.txt, deps: ['data/*.jsonl'], outs: [all.txt]}\n",
    );
    let out = p.run(&["run", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    // A file the glob does not match changes nothing; one it matches is in the key.
    p.write("data/notes.txt", "changed\n");
    assert!(stdout(&p.run(&["plan", "p.yaml"])).contains("cached"), "a non-matching file changed the key");
    p.write("data/c.jsonl", "c\n");
    let text = stdout(&p.run(&["plan", "p.yaml"]));
    assert!(text.contains("dep 'data/*.jsonl': c.jsonl added") || text.contains("data/c.jsonl added"), "{text}");
    // A glob over nothing is an error at validate, naming it.
    p.write(
        "q.yaml",
        "name: q\nnodes:\n  cat:\n    op: shell\n    params: {cmd: 'true', deps: ['data/*.parquet'], outs: [x]}\n",
    );
    let out = p.run(&["validate", "q.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("data/*.parquet") && stderr(&out).contains("matches no file"), "{}", stderr(&out));
}

#[test]
fn a_dep_that_neither_exists_nor_is_written_fails_validate_with_a_suggestion() {
    let p = Project::new();
    p.write("data/train.jsonl", "a\n");
    p.write(
        "p.yaml",
        "name: m\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'true', deps: [data/trian.jsonl], outs: [x]}\n",
    );
    for cmd in ["validate", "plan"] {
        let out = p.run(&[cmd, "p.yaml"]);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}{}", stdout(&out), stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("data/trian.jsonl") && err.contains("did you mean 'data/train.jsonl'"), "{cmd}: {err}");
    }
}

#[test]
fn a_link_inside_a_folder_out_is_refused_and_not_followed() {
    let p = Project::new();
    p.write("secret.txt", "mine\n");
    p.write(
        "p.yaml",
        "name: l\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'mkdir -p o && ln -s ../secret.txt o/link && echo x > o/f', outs: [o]}\n",
    );
    let out = p.run(&["run", "p.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("symbolic link") || stderr(&out).contains("symlinks are not stored"),
        "{}",
        stderr(&out)
    );
    assert_eq!(p.read("secret.txt"), "mine\n");
}

#[test]
fn switching_a_param_back_checks_the_outs_out_of_the_store_instead_of_running() {
    let p = project();
    assert_eq!(p.run(&["run", "p.yaml"]).status.code(), Some(0));
    let first = p.read("out/lr.txt");
    let out = p.run(&["run", "p.yaml", "--set", "nodes.train.params.env.LR=0.2", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(nodes_with(&events(&out), "node_started"), ["train"]);
    assert_eq!(p.read("out/lr.txt"), "0.2\n");
    // Back to 0.1: the store holds those exact bytes; nothing runs.
    let plan = stdout(&p.run(&["plan", "p.yaml"]));
    assert!(plan.contains("restore"), "{plan}");
    let back = p.run(&["run", "p.yaml", "--json"]);
    assert_eq!(back.status.code(), Some(0), "{}", stderr(&back));
    let ev = events(&back);
    assert!(nodes_with(&ev, "node_started").is_empty(), "a node ran: {}", stdout(&back));
    let restored: Vec<&serde_json::Value> = ev.iter().filter(|e| e.get("restored").is_some()).collect();
    assert_eq!(restored.len(), 1, "{}", stdout(&back));
    assert_eq!(restored[0]["node"], "train");
    assert_eq!(p.read("out/lr.txt"), first);
    // A deleted folder out is restored whole, and the store still verifies.
    std::fs::remove_dir_all(p.path().join("data/prepared")).unwrap();
    let again = p.run(&["run", "p.yaml", "--json"]);
    assert!(nodes_with(&events(&again), "node_started").is_empty(), "{}", stdout(&again));
    assert_eq!(p.read("data/prepared/val.jsonl"), "{\"x\":2}\n");
    let verify = p.run(&["verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}{}", stdout(&verify), stderr(&verify));
    // The checked-out copy is the user's: editing it leaves the store intact.
    std::fs::write(p.path().join("out/lr.txt"), "edited\n").unwrap();
    assert_eq!(p.run(&["verify"]).status.code(), Some(0));
}

#[test]
fn a_dotted_matrix_axis_can_be_set_from_the_command_line() {
    let p = Project::new();
    p.write(
        "m.yaml",
        "name: m\nnodes:\n  t:\n    op: shell\n    params: {cmd: 'echo $LR > o-${matrix.env.LR}.txt', outs: ['o-${matrix.env.LR}.txt']}\n    matrix: {env.LR: [0.1]}\n",
    );
    let out = p.run(&["plan", "m.yaml", "--set", "nodes.t.matrix.env.LR=[0.1,0.2]"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("t@env.LR=0.1") && text.contains("t@env.LR=0.2"), "{text}");
}

/// Two nodes read different keys of one params file (DVC's `params:`). Before,
/// a params file could only be a whole-file dep: any edit re-ran both, and
/// `params_files` was an unknown param.
#[test]
fn a_params_file_key_change_reruns_exactly_the_nodes_that_read_that_key() {
    let p = Project::new();
    p.write("params.yaml", "train:\n  lr: 0.01\n  epochs: 2\neval:\n  split: val\nnotes: first\n");
    p.write(
        "p.yaml",
        r#"name: params
nodes:
  train:
    op: shell
    params:
      cmd: echo "lr=${param:train.lr} epochs=${param:params.yaml:train.epochs}" > train.txt
      params_files: {params.yaml: [train.lr, train.epochs]}
      outs: [train.txt]
  evaluate:
    op: shell
    params:
      cmd: echo "split=${param:eval.split}" > eval.txt
      params_files: {params.yaml: [eval.split]}
      outs: [eval.txt]
"#,
    );
    let out = p.run(&["run", "p.yaml", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(p.read("train.txt").trim(), "lr=0.01 epochs=2");
    assert_eq!(p.read("eval.txt").trim(), "split=val");
    // A key no node names: nothing re-runs.
    p.write("params.yaml", "train:\n  lr: 0.01\n  epochs: 2\neval:\n  split: val\nnotes: second\n");
    let out = p.run(&["run", "p.yaml", "--json"]);
    assert_eq!(nodes_with(&events(&out), "cache_hit"), ["evaluate", "train"], "{}", stdout(&out));
    // train.lr changes (and the file is written as another YAML layout): only train re-runs, and why says the key.
    p.write("params.yaml", "notes: second\neval: {split: val}\ntrain: {epochs: 2, lr: 0.02}\n");
    let plan = stdout(&p.run(&["plan", "p.yaml"]));
    assert!(plan.contains("params.yaml:train.lr: 0.01 → 0.02"), "{plan}");
    let explain = stdout(&p.run(&["explain", "p.yaml", "train"]));
    assert!(explain.contains("params.yaml:train.lr") && explain.contains("0.02"), "{explain}");
    let out = p.run(&["run", "p.yaml", "--json"]);
    let ev = events(&out);
    assert_eq!(nodes_with(&ev, "node_finished"), ["train"], "{}", stdout(&out));
    assert_eq!(nodes_with(&ev, "cache_hit"), ["evaluate"]);
    assert_eq!(p.read("train.txt").trim(), "lr=0.02 epochs=2");
    // Back to 0.01: checked out of the store, not run.
    p.write("params.yaml", "train:\n  lr: 0.01\n  epochs: 2\neval:\n  split: val\nnotes: second\n");
    let out = p.run(&["run", "p.yaml", "--json"]);
    assert!(nodes_with(&events(&out), "node_started").is_empty(), "{}", stdout(&out));
    assert_eq!(p.read("train.txt").trim(), "lr=0.01 epochs=2");

    // A key the file lacks: validate fails with exit 2, naming the file and the key.
    p.write("params.yaml", "train:\n  learning_rate: 0.01\n  epochs: 2\neval:\n  split: val\n");
    let out = p.run(&["validate", "p.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("params file 'params.yaml' has no key 'train.lr'") && err.contains("learning_rate"), "{err}");
    // A reference to a key params_files does not list is refused: its value would not be in the key.
    p.write("params.yaml", "train:\n  lr: 0.01\n  epochs: 2\neval:\n  split: val\n");
    p.write(
        "q.yaml",
        "name: q\nnodes:\n  t:\n    op: shell\n    params:\n      cmd: echo ${param:eval.split} > t.txt\n      params_files: {params.yaml: [train.lr]}\n      outs: [t.txt]\n",
    );
    let out = p.run(&["validate", "q.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no params file in params_files lists the key 'eval.split'"), "{}", stderr(&out));
}

/// Every object file or folder in the store, with its bytes (walked here, not
/// through orchestrate).
fn stored_objects(p: &Project) -> std::collections::BTreeMap<String, u64> {
    fn bytes(path: &std::path::Path) -> u64 {
        let m = std::fs::symlink_metadata(path).unwrap();
        if m.is_dir() {
            std::fs::read_dir(path).unwrap().map(|e| bytes(&e.unwrap().path())).sum()
        } else {
            m.len()
        }
    }
    let mut out = std::collections::BTreeMap::new();
    for shard in std::fs::read_dir(p.path().join(".orchestrate/objects")).unwrap() {
        for obj in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let obj = obj.unwrap();
            out.insert(obj.file_name().to_string_lossy().into_owned(), bytes(&obj.path()));
        }
    }
    out
}

const SWEEP: &str = r#"name: sweep
nodes:
  train:
    op: shell
    params:
      cmd: mkdir -p ckpt && head -c 50000 /dev/urandom > ckpt/weights.bin && echo "$SEED" > ckpt/seed.txt
      outs: [ckpt]
      env: {SEED: 1}
  evaluate:
    op: shell
    params:
      cmd: 'cat ckpt/seed.txt > score.txt; if [ -e hold ]; then sleep 30; fi'
      deps: [ckpt]
      outs: [score.txt]
"#;

/// Before, the store only grew and there was no `gc` (`unrecognized subcommand`).
#[test]
fn gc_frees_exactly_the_unreferenced_objects_and_the_kept_spec_stays_a_full_cache_hit() {
    let p = Project::new();
    p.write("s.yaml", SWEEP);
    p.write("o.yaml", "name: other\nnodes:\n  z:\n    op: shell\n    params: {cmd: echo z > z.txt, outs: [z.txt]}\n");
    for seed in ["2", "3", "1"] {
        let out = p.run(&["run", "s.yaml", "--set", &format!("nodes.train.params.env.SEED={seed}")]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(p.run(&["run", "o.yaml"]).status.code(), Some(0));
    // What the latest run of s.yaml needs, found through `path`, not gc.
    let needed: std::collections::BTreeSet<String> = ["train:ckpt", "evaluate:score.txt"]
        .iter()
        .map(|o| {
            let path = stdout(&p.run(&["path", "s.yaml", o]));
            std::path::Path::new(path.trim()).file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    let before = stored_objects(&p);
    assert!(needed.iter().all(|h| before.contains_key(h)), "{needed:?} not in {before:?}");
    let unreferenced: u64 = before.iter().filter(|(h, _)| !needed.contains(*h)).map(|(_, b)| b).sum();
    assert!(unreferenced > 100_000, "the two older checkpoints are about 100 kB: {unreferenced}");

    // `du`: the largest node first, and the store's object count.
    let du = stdout(&p.run(&["du"]));
    let first = du.lines().nth(1).unwrap_or_default();
    assert!(first.contains("sweep") && first.contains("train") && first.contains(" 3 "), "{du}");
    assert!(du.contains(&format!("store: {} objects", before.len())), "{du}");

    // --dry-run lists and removes nothing.
    let dry = p.run(&["gc", "s.yaml", "--dry-run", "--json"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let plan: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let listed: u64 = plan["removed_objects"].as_array().unwrap().iter().map(|o| o["bytes"].as_u64().unwrap()).sum();
    assert_eq!(listed, unreferenced);
    assert_eq!(stored_objects(&p), before, "--dry-run removed something");

    // gc refuses while a run has the workspace open, and removes nothing.
    p.write("hold", "");
    p.write("s2.yaml", &SWEEP.replace("name: sweep", "name: held").replace("score.txt", "held.txt"));
    let mut held = p
        .cmd(&["run", "s2.yaml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    p.wait_for("held.txt", 20, "the held run never started");
    let refused = p.run(&["gc", "s.yaml"]);
    assert_ne!(refused.status.code(), Some(0));
    assert!(stderr(&refused).contains("another orchestrate process"), "{}", stderr(&refused));
    held.kill().unwrap();
    held.wait().unwrap();
    std::fs::remove_file(p.path().join("hold")).unwrap();
    let before = stored_objects(&p);
    let unreferenced: u64 = before.iter().filter(|(h, _)| !needed.contains(*h)).map(|(_, b)| b).sum();

    let out = p.run(&["gc", "s.yaml", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let after = stored_objects(&p);
    let freed: u64 = before.iter().filter(|(h, _)| !after.contains_key(*h)).map(|(_, b)| b).sum();
    let reported: u64 = done["removed_objects"].as_array().unwrap().iter().map(|o| o["bytes"].as_u64().unwrap()).sum();
    assert_eq!(freed, unreferenced, "gc freed other bytes than those of the unreferenced objects");
    assert_eq!(reported, freed);
    assert_eq!(after.keys().cloned().collect::<std::collections::BTreeSet<_>>(), needed);
    assert!(p.run(&["verify"]).status.success(), "the store does not verify after gc");

    // The kept spec is a full cache hit; a dropped result runs again.
    let out = p.run(&["run", "s.yaml", "--json"]);
    let ev = events(&out);
    assert!(nodes_with(&ev, "node_started").is_empty(), "{}", stdout(&out));
    assert_eq!(nodes_with(&ev, "cache_hit"), ["evaluate", "train"]);
    let out = p.run(&["run", "s.yaml", "--json", "--set", "nodes.train.params.env.SEED=2"]);
    assert_eq!(nodes_with(&events(&out), "node_finished"), ["evaluate", "train"]);
    // A spec that never ran here is named.
    let out = p.run(&["gc", "nope.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// `orchestrate checkout` (`dvc checkout`): before, there was no such command.
#[test]
fn checkout_restores_missing_outs_and_keeps_edits_the_store_lacks_unless_forced() {
    let p = project();
    assert_eq!(p.run(&["run", "p.yaml"]).status.code(), Some(0));
    let model = p.read("out/checkpoint-1/model.bin");
    std::fs::remove_dir_all(p.path().join("data/prepared")).unwrap();
    p.write("out/lr.txt", "edited by hand\n");
    p.write("out/extra.txt", "not ours\n");
    // A target: only it and what it needs.
    let out = p.run(&["checkout", "p.yaml", "prepare"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("restored    prepare"), "{}", stdout(&out));
    assert!(p.path().join("data/prepared/train.jsonl").exists());
    assert_eq!(p.read("out/lr.txt"), "edited by hand\n", "a node outside the targets was touched");
    // Edits the store does not hold are kept, as `dvc checkout` keeps them
    // without --force: before, they were replaced without a word.
    let out = p.run(&["checkout", "p.yaml", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let states: Vec<serde_json::Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(states[0]["state"], "up_to_date");
    assert_eq!(states[1]["state"], "kept", "{states:?}");
    assert_eq!(states[1]["outs"][0]["path"], "out", "{states:?}");
    let changes = states[1]["outs"][0]["changes"].as_str().unwrap();
    assert!(changes.contains("lr.txt changed") && changes.contains("extra.txt added"), "{changes}");
    assert_eq!(p.read("out/lr.txt"), "edited by hand\n");
    assert_eq!(p.read("out/extra.txt"), "not ours\n");
    let text = p.run(&["checkout", "p.yaml"]);
    assert_eq!(text.status.code(), Some(1));
    assert!(stdout(&text).contains("kept        train") && stdout(&text).contains("--force"), "{}", stdout(&text));
    let out = p.run(&["checkout", "p.yaml", "--json", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let states: Vec<serde_json::Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(states[1]["state"], "restored", "{states:?}");
    assert_eq!(p.read("out/lr.txt").trim(), "0.1");
    assert_eq!(p.read("out/checkpoint-1/model.bin"), model);
    assert!(!p.path().join("out/extra.txt").exists(), "the restored folder out kept a file the store does not hold");
    // Nothing ran: the store has one run, and the outs still verify.
    let status = stdout(&p.run(&["status", "--json"]));
    let runs: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "checkout recorded or started a run");
    assert!(p.run(&["verify"]).status.success());
    // Outs the store holds (another param's result) are replaced without --force.
    assert_eq!(p.run(&["run", "p.yaml", "--set", "nodes.train.params.env.LR=0.2"]).status.code(), Some(0));
    assert_eq!(p.read("out/lr.txt").trim(), "0.2");
    let out = p.run(&["checkout", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(p.read("out/lr.txt").trim(), "0.1");
    // A key the store lacks: said, exit 1.
    let out = p.run(&["checkout", "p.yaml", "--set", "nodes.train.params.env.LR=0.3"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("not stored  train"), "{}", stdout(&out));
}

/// Before, `compare` said `no metric differs` while a shell node's own
/// `test_mse` changed, and `--group-by` printed an empty table.
#[test]
fn a_shell_nodes_own_metrics_are_compared_and_grouped_over_seeds() {
    let p = Project::new();
    p.write("train.py", TRAINER);
    p.write("s.yaml", TRL_SWEEP);
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "s.yaml", "--json"];
        args.extend_from_slice(extra);
        let out = p.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
        events(&out)[0]["run_id"].as_str().unwrap().to_string()
    };
    let a = run(&[]);
    assert!(p.path().join("runs/0.1-0/checkpoint-2/model.safetensors").exists());
    let b = run(&["--set", "nodes.train.params.env.SCALE=1.5"]);
    // The metric read back independently from the tree.
    let mse = |p: &Project, lr: &str, seed: u32| -> f64 {
        let v: serde_json::Value = serde_json::from_str(&p.read(&format!("runs/{lr}-{seed}/metrics.json"))).unwrap();
        v["test_mse"].as_f64().unwrap()
    };
    let out = p.run(&["compare", &a, &b, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cmp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = cmp["metrics"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|r| r["node"] == "train@env.LR=0.2,env.SEED=1" && r["metric"] == "test_mse")
        .unwrap_or_else(|| panic!("no test_mse row: {cmp}"));
    let expect_a = 0.02 - 0.01 * 0.2 + 0.001;
    assert!((row["values"][0].as_f64().unwrap() - expect_a).abs() < 1e-9, "{row}");
    assert!((row["values"][1].as_f64().unwrap() - mse(&p, "0.2", 1)).abs() < 1e-12, "{row}");
    let text = stdout(&p.run(&["compare", &a, &b]));
    assert!(text.contains("test_mse") && !text.contains("no metric differs"), "{text}");
    // eval.acc did not change: hidden; eval.status is no number: undefined, never 0.
    assert!(!rows.iter().any(|r| r["metric"] == "eval.acc"), "{cmp}");

    // --group-by env.SEED: mean, sample std and n, recomputed here from the files.
    let out = p.run(&["compare", &b, "--group-by", "env.SEED", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = g["rows"].as_array().unwrap();
    for lr in ["0.1", "0.2", "0.3"] {
        let xs = [mse(&p, lr, 0), mse(&p, lr, 1)];
        let mean = (xs[0] + xs[1]) / 2.0;
        let std = (((xs[0] - mean).powi(2) + (xs[1] - mean).powi(2)) / 1.0).sqrt();
        let row = rows
            .iter()
            .find(|r| r["group"] == format!("train@env.LR={lr}") && r["metric"] == "test_mse")
            .unwrap_or_else(|| panic!("no group row for LR={lr}: {g}"));
        assert_eq!(row["n"], 2);
        assert!((row["mean"].as_f64().unwrap() - mean).abs() < 1e-12, "{row}");
        assert!((row["std"].as_f64().unwrap() - std).abs() < 1e-12, "{row}");
        let status =
            rows.iter().find(|r| r["group"] == format!("train@env.LR={lr}") && r["metric"] == "eval.status").unwrap();
        assert!(status["mean"].is_null() && status["n"] == 0 && status["undefined"] == 2, "{status}");
    }
    // `--group-by seed` names the axis as a user says it (the one axis ending in `.SEED`).
    let short = p.run(&["compare", &b, "--group-by", "seed", "--json"]);
    assert_eq!(short.status.code(), Some(0), "{}", stderr(&short));
    let short: serde_json::Value = serde_json::from_slice(&short.stdout).unwrap();
    assert_eq!(short["axis"], "env.SEED");
    assert_eq!(short["rows"], g["rows"]);
    // A metrics file that is not an out is refused at validate, naming it.
    p.write("bad.yaml", &TRL_SWEEP.replace("metrics: ['runs/", "metrics: ['elsewhere/"));
    let out = p.run(&["validate", "bad.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not among outs"), "{}", stderr(&out));
}

/// Before, a downstream node had to repeat the upstream matrix by hand
/// (`from: train` was "a matrix axis is a list of values ..."), and `explain`
/// wanted a full expansion id.
#[test]
fn a_node_follows_an_upstream_matrix_and_explain_takes_the_written_id() {
    let p = Project::new();
    p.write("train.py", TRAINER);
    let spec = format!(
        "{TRL_SWEEP}  evaluate:
    op: shell
    matrix: {{from: train}}
    params:
      cmd: 'cp runs/${{matrix.env.LR}}-${{matrix.env.SEED}}/metrics.json eval-${{matrix.env.LR}}-${{matrix.env.SEED}}.json'
      deps: ['runs/${{matrix.env.LR}}-${{matrix.env.SEED}}']
      outs: ['eval-${{matrix.env.LR}}-${{matrix.env.SEED}}.json']
"
    );
    p.write("s.yaml", &spec);
    let out = p.run(&["run", "s.yaml", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let finished = nodes_with(&events(&out), "node_finished");
    let evaluated: Vec<&String> = finished.iter().filter(|n| n.starts_with("evaluate@")).collect();
    assert_eq!(evaluated.len(), 6, "{finished:?}");
    assert!(finished.contains(&"evaluate@env.LR=0.2,env.SEED=1".to_string()), "{finished:?}");
    assert_eq!(p.read("eval-0.2-1.json"), p.read("runs/0.2-1/metrics.json"));
    // Each expansion reads its own upstream expansion, and only it.
    let plan = stdout(&p.run(&["plan", "s.yaml", "evaluate@env.LR=0.2,env.SEED=1", "--workspace", "fresh"]));
    let nodes: Vec<&str> =
        plan.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.contains('@')).collect();
    assert_eq!(nodes, ["train@env.LR=0.2,env.SEED=1", "evaluate@env.LR=0.2,env.SEED=1"], "{plan}");
    // `explain` on the written id explains every expansion.
    let explain = stdout(&p.run(&["explain", "s.yaml", "evaluate"]));
    assert_eq!(explain.matches("node     evaluate@").count(), 6, "{explain}");
    // Following a node that does not exist is said, with a did-you-mean.
    p.write("bad.yaml", &spec.replace("{from: train}", "{from: trian}"));
    let out = p.run(&["validate", "bad.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no node 'trian' to follow (did you mean 'train'?)"), "{}", stderr(&out));
}

/// Before, an interrupted `--force` left its outs deleted and the next run
/// trained again although the store held them.
#[test]
fn after_an_interrupted_force_the_next_run_restores_the_outs_instead_of_running() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: s\nnodes:\n  train:\n    op: shell\n    params: {cmd: 'mkdir -p ckpt && echo w > ckpt/w.bin; if [ -e hold ]; then sleep 30 & wait; fi', outs: [ckpt]}\n",
    );
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    p.write("hold", "");
    let child = p
        .cmd(&["run", "s.yaml", "--force", "train"])
        .env("ORCHESTRATE_KILL_GRACE", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    p.wait_for("ckpt/w.bin", 20, "the forced node never started");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(!p.path().join("ckpt").exists(), "the interrupted node's incomplete out stayed");
    std::fs::remove_file(p.path().join("hold")).unwrap();
    let out = p.run(&["run", "s.yaml", "--json"]);
    let ev = events(&out);
    assert!(nodes_with(&ev, "node_started").is_empty(), "it ran again: {}", stdout(&out));
    assert!(ev.iter().any(|e| e["event"] == "cache_hit" && e["restored"].is_string()), "{}", stdout(&out));
    assert_eq!(p.read("ckpt/w.bin"), "w\n");
}

/// Gates read a shell node's own metrics by name, in the format its file is
/// written in (before, gate evidence had to be JSON: a YAML metrics file
/// failed the gate node with "is not JSON"), in the run and again in `audit`.
#[test]
fn gates_read_a_shell_nodes_yaml_metrics_in_the_run_and_in_the_audit() {
    let p = Project::new();
    p.write(
        "s.yaml",
        r#"name: own-gates
nodes:
  train:
    op: shell
    params:
      cmd: 'printf "eval:\n  mse: 0.0144\n  note: fine\n" > metrics.yaml'
      outs: [metrics.yaml]
      metrics: [metrics.yaml]
  gates:
    op: gate
    params: {file: g.yaml}
"#,
    );
    p.write(
        "g.yaml",
        "name: own\ngates:\n  - name: mse-low\n    evidence: {m: 'train:metrics.yaml'}\n    check: {field: m.eval.mse, at_most: 0.02}\n  - name: mse-very-low\n    evidence: {m: 'train:metrics.yaml'}\n    check: {field: m.eval.mse, at_most: 0.01}\n",
    );
    let out = p.run(&["run", "s.yaml"]);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("1 gate(s) failed"), "{all}");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(stdout(&p.run(&["path", "s.yaml", "gates:gates.json"])).trim()).unwrap(),
    )
    .unwrap();
    let passed: Vec<(String, bool)> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), r["passed"].as_bool().unwrap()))
        .collect();
    assert_eq!(passed, [("mse-low".to_string(), true), ("mse-very-low".to_string(), false)]);
    // The audit reads the packed YAML the same way.
    let out = p.run(&["pack", "freeze", "s.yaml", "--out", "pack"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = p.run(&["audit", "pack"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    assert!(text.contains("mse-low") && text.contains("PASS") && text.contains("FAIL"), "{text}");
}

/// A metric a diverged run writes as Python's `json.dump` does (`NaN`, not
/// valid JSON but what Python, DVC and TRL read) fails its gate saying NaN,
/// in the run and in the audit; another metric of the same file still
/// passes. Before, the whole file did not read ("expected value at line 1
/// column 18"), so the gate node failed instead of the gate; and YAML's
/// `.nan` was said as `null`, which is not what the file says.
#[test]
fn a_metric_written_as_nan_fails_its_gate_saying_nan_in_the_run_and_the_audit() {
    for (file, body) in [
        ("metrics.json", r#"{\"eval\": {\"mse\": NaN, \"acc\": 0.5, \"peak\": -Infinity}}"#),
        ("metrics.yaml", "eval:\\n  mse: .nan\\n  acc: 0.5\\n  peak: -.inf\\n"),
    ] {
        let p = Project::new();
        p.write(
            "s.yaml",
            &format!(
                "name: nan-gates\nnodes:\n  train:\n    op: shell\n    params:\n      cmd: \"printf '{body}' > {file}\"\n      outs: [{file}]\n      metrics: [{file}]\n  gates:\n    op: gate\n    params: {{file: g.yaml}}\n"
            ),
        );
        p.write(
            "g.yaml",
            &format!("name: own\ngates:\n  - name: mse-low\n    evidence: {{m: 'train:{file}'}}\n    check: {{field: m.eval.mse, at_most: 0.02}}\n  - name: acc-high\n    evidence: {{m: 'train:{file}'}}\n    check: {{field: m.eval.acc, at_least: 0.4}}\n  - name: peak-low\n    evidence: {{m: 'train:{file}'}}\n    check: {{field: m.eval.peak, at_most: 1}}\n"),
        );
        let out = p.run(&["run", "s.yaml"]);
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(1), "{file}: {all}");
        assert!(all.contains("2 gate(s) failed"), "{file}: {all}");
        let path = p.run(&["path", "s.yaml", "gates:gates.json"]);
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(stdout(&path).trim()).unwrap()).unwrap();
        let results = report["results"].as_array().unwrap();
        let detail = |name: &str| {
            let r = results.iter().find(|r| r["name"] == name).unwrap();
            (r["passed"].as_bool().unwrap(), r["detail"].as_str().unwrap().to_string())
        };
        let (passed, said) = detail("mse-low");
        assert!(!passed && said.contains("m.eval.mse is NaN, not a number"), "{file}: {said}");
        let (passed, said) = detail("peak-low");
        assert!(!passed && said.contains("m.eval.peak is -inf, not a number"), "{file}: {said}");
        assert!(detail("acc-high").0, "{file}: {results:?}");
        // The audit reads the packed file the same way.
        let out = p.run(&["pack", "freeze", "s.yaml", "--out", "pack"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let out = p.run(&["audit", "pack"]);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{file}: {text}{}", stderr(&out));
        assert!(text.contains("m.eval.mse is NaN"), "{file}: {text}");
        assert!(text.lines().any(|l| l.contains("acc-high") && l.contains("PASS")), "{file}: {text}");
    }
}

/// Gate evidence past the audit's bound (64 MiB) is read neither by the
/// run nor by the audit, so the two agree. Before, the run's gate node read
/// any size into memory and passed, and `audit` of the frozen pack then
/// failed the same gate ("over the limit"): the audit contradicted the run.
#[test]
fn gate_evidence_past_the_audits_bound_fails_in_the_run_as_in_the_audit() {
    let p = Project::new();
    let over = orchestrate_core::pack::MAX_EVIDENCE_BYTES + 1;
    p.write(
        "s.yaml",
        &format!(
            "name: big-evidence\nnodes:\n  train:\n    op: shell\n    params:\n      cmd: \"printf '{{\\\"ok\\\": true}}' > m.json && head -c {over} /dev/zero | tr '\\\\0' ' ' >> m.json\"\n      outs: [m.json]\n  gates:\n    op: gate\n    params: {{file: g.yaml}}\n"
        ),
    );
    p.write(
        "g.yaml",
        "name: own\ngates:\n  - name: ok\n    evidence: {m: 'train:m.json'}\n    check: {field: m.ok, equals: true}\n",
    );
    let out = p.run(&["run", "s.yaml"]);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(std::fs::metadata(p.path().join("m.json")).unwrap().len(), over + 12, "{all}");
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("over the limit"), "{all}");
    let out = p.run(&["pack", "freeze", "s.yaml", "--out", "pack", "--max-output-bytes", &(2 * over).to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = p.run(&["audit", "pack"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    assert!(text.contains("over the limit"), "{text}");
}

/// A gate file edited while the run is under way, after the spec compiled
/// (so its evidence became the node's inputs) and before the gate node ran,
/// now names evidence the node was not given. Before, the gate op indexed
/// its inputs by the new reference and panicked, and the run waited for the
/// dead job for ever. Now the gate node fails naming the file and the
/// reference, and says to run again; the next run evaluates the new file.
#[test]
fn a_gate_file_edited_during_the_run_fails_its_node_naming_the_change() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: edited-gates\nnodes:\n  a:\n    op: shell\n    params:\n      cmd: \"touch started; until [ -e go ]; do sleep 0.05; done; echo '{\\\"x\\\": 1}' > m.json\"\n      outs: [m.json]\n  b:\n    op: shell\n    params:\n      cmd: \"echo '{\\\"x\\\": 2}' > n.json\"\n      outs: [n.json]\n  g:\n    op: gate\n    params: {file: g.yaml}\n",
    );
    let one = "name: own\ngates:\n  - name: a\n    evidence: {m: 'a:m.json'}\n    check: {field: m.x, equals: 1}\n";
    p.write("g.yaml", one);
    let child = p
        .cmd(&["run", "s.yaml"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    p.wait_for("started", 30, "node a never started");
    p.write(
        "g.yaml",
        &format!("{one}  - name: b\n    evidence: {{m: 'b:n.json'}}\n    check: {{field: m.x, equals: 2}}\n"),
    );
    p.write("go", "");
    let out = common::output_within(child, 60, "the run");
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("g.yaml") && all.contains("b:n.json") && all.contains("run again"), "{all}");
    assert!(!all.contains("panicked"), "{all}");
    // The next run compiles the file as it now is and evaluates both gates.
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("| b | PASS"), "{}", stdout(&out));
}

/// Before, a dep edited while its node's command ran (a file, a file of a
/// folder dep, a key of a params file the script reads itself) was stored
/// under the key computed before the edit: the key named bytes the command
/// may never have read, and the next run ran the node again on the edit, or,
/// for an edit undone meanwhile, never. Such a node fails now, naming what
/// changed, and nothing is stored under that key (as Bazel keeps an action
/// whose inputs changed while it ran out of its cache); the next run runs it
/// on the bytes as they are. A file added to a folder dep is not a change:
/// the key never held it.
#[test]
fn a_dep_edited_while_its_node_ran_fails_the_node_and_nothing_is_stored_under_the_key() {
    let p = Project::new();
    p.write("data/x.txt", "one\n");
    p.write("src/a.txt", "a\n");
    p.write("params.yaml", "train: {lr: 0.1}\n");
    p.write(
        "s.yaml",
        "name: edits\nnodes:\n  w:\n    op: shell\n    params:\n      cmd: \"touch started; until [ -e go ]; do sleep 0.05; done; rm -f started go; cat data/x.txt src/a.txt params.yaml > out.txt\"\n      deps: [data/x.txt, src]\n      params_files: {params.yaml: [train.lr]}\n      outs: [out.txt]\n",
    );
    let edits: [(&str, &str, &str); 3] = [
        ("data/x.txt", "two\n", "dep 'data/x.txt' changed"),
        ("src/a.txt", "b\n", "dep 'src': a.txt changed"),
        ("params.yaml", "train: {lr: 0.2}\n", "params.yaml:train.lr: 0.1 → 0.2"),
    ];
    for (round, (file, edit, said)) in edits.into_iter().enumerate() {
        // A key not yet cached, so the node runs.
        p.write("src/round.txt", &format!("{round}\n"));
        let child = p
            .cmd(&["run", "s.yaml"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        p.wait_for("started", 30, "the node never started");
        p.write(file, edit);
        p.write("src/new.txt", "added meanwhile\n");
        p.write("go", "");
        let out = common::output_within(child, 60, "the run");
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(1), "{file}: {all}");
        assert!(all.contains(said) && all.contains("while the node ran"), "{file}: {all}");
        assert!(!all.contains("src': new.txt"), "{file}: an added file is not a change: {all}");
        // The command's complete outs are kept, out of the way.
        assert!(all.contains("its outs were moved into the workspace's trash"), "{file}: {all}");
        assert!(!p.path().join("out.txt").exists(), "{file}");
        let kept = common::tree_of(&p.path().join(".orchestrate/trash"))
            .into_keys()
            .filter(|k| k.ends_with("/out.txt"))
            .count();
        assert_eq!(kept, round + 1, "{file}: the outs of each such run are in the trash");
        std::fs::remove_file(p.path().join("src/new.txt")).unwrap();
        // Run again: the bytes as they now are, stored under their own key.
        let again = p.cmd(&["run", "s.yaml"]).spawn().unwrap();
        p.wait_for("started", 30, "the node never started again");
        p.write("go", "");
        let out = common::output_within(again, 60, "the second run");
        assert_eq!(out.status.code(), Some(0), "{file}: {}{}", stdout(&out), stderr(&out));
        assert!(p.read("out.txt").contains(edit.trim_end()), "{file}: {}", p.read("out.txt"));
    }
    // A command that writes its own dep can never be cached truthfully: said so.
    p.write("t.yaml", "name: own\nnodes:\n  v:\n    op: shell\n    params: {cmd: 'echo more >> data/x.txt; echo > v.txt', deps: [data/x.txt], outs: [v.txt]}\n");
    let out = p.run(&["run", "t.yaml"]);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("changed while the node ran (dep 'data/x.txt' changed)") && all.contains("writes only its outs"),
        "{all}"
    );
}

/// A params file that shares values through YAML merge keys
/// (`<<: *defaults`) reads as Python's `yaml.safe_load` and DVC read it.
/// Before, `train.lr` coming from the merge was "no key 'lr' under 'train'".
/// An edit of the merged-in value changes the node's key.
#[test]
fn a_params_file_with_yaml_merge_keys_reads_as_python_reads_it() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: k\nnodes:\n  a:\n    op: shell\n    params:\n      cmd: 'echo ${param:train.lr} ${param:train.epochs} > out.txt'\n      params_files: {params.yaml: [train.lr, train.epochs]}\n      outs: [out.txt]\n",
    );
    let params =
        |lr: &str| format!("defaults: &defaults\n  lr: {lr}\n  epochs: 3\ntrain:\n  <<: *defaults\n  epochs: 5\n");
    p.write("params.yaml", &params("0.1"));
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(p.read("out.txt"), "0.1 5\n");
    p.write("params.yaml", &params("0.2"));
    let out = p.run(&["run", "--json", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(nodes_with(&events(&out), "node_started"), ["a"], "{}", stdout(&out));
    assert_eq!(p.read("out.txt"), "0.2 5\n");
}

/// A params file's value that JSON cannot hold (`.inf`, `-.inf`, `.nan`)
/// was keyed as `null`, so changing `clip: .inf` to `clip: -.inf` (or to
/// `null`) was a cache hit: the node's result for one value served for
/// another. It is now refused, naming the file, the key and the value.
#[test]
fn a_params_value_a_key_cannot_hold_exactly_is_refused_not_keyed_as_null() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: k\nnodes:\n  a:\n    op: shell\n    params:\n      cmd: 'cat params.yaml > out.txt'\n      params_files: {params.yaml: [train]}\n      outs: [out.txt]\n",
    );
    for (value, said) in [(".inf", "inf"), ("-.inf", "-inf"), (".nan", "NaN")] {
        p.write("params.yaml", &format!("train:\n  lr: 0.1\n  clip: {value}\n"));
        for cmd in ["validate", "run"] {
            let out = p.run(&[cmd, "s.yaml"]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{cmd} with clip {value}: {}{err}", stdout(&out));
            assert!(
                err.contains("params.yaml") && err.contains(&format!("train.clip is {said}")),
                "{cmd} with clip {value}: {err}"
            );
        }
    }
    p.write("params.yaml", "train:\n  lr: 0.1\n  clip: null\n");
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(p.read("out.txt"), "train:\n  lr: 0.1\n  clip: null\n");
}

/// `orchestrate` as a user the read-only mode of the store binds: this
/// process's own user, or, for root (as in CI), uid 65534 through `setpriv`,
/// with the project handed to it.
fn as_unprivileged(p: &Project, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let root = unsafe_euid() == 0;
    let mut c = if root {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", common::bin()]);
        c
    } else {
        std::process::Command::new(common::bin())
    };
    c.args(args).current_dir(p.path()).env("HOME", p.path());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("orchestrate runs (setpriv from util-linux when root)")
}

fn unsafe_euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    // The owner of a file this process just made is its effective uid.
    let probe = tempfile::NamedTempFile::new().unwrap();
    std::fs::metadata(probe.path()).unwrap().uid()
}

/// DVC's `cache.type` (#31): before, every checkout was a copy. With
/// `ORCHESTRATE_CACHE_TYPE=hardlink,copy` a checked-out out is the read-only
/// object itself (no second copy); writing to it is refused; an edit forced
/// with a chmod is found by stat, the edited object is moved aside (never
/// served again), the node re-runs, and `verify` finds the store intact. Root
/// never gets a hard link (a read-only mode does not stop root).
#[test]
fn a_hardlinked_checkout_is_the_read_only_object_and_an_edit_never_corrupts_the_store() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let p = Project::new();
    p.write("s.yaml", "name: s\nnodes:\n  train:\n    op: shell\n    params: {cmd: 'mkdir -p ckpt && echo weights > ckpt/w.bin', outs: [ckpt]}\n");
    if unsafe_euid() == 0 {
        // Root: hardlink is skipped for a copy.
        assert_eq!(p.run(&["run", "s.yaml", "--workspace", "rootws"]).status.code(), Some(0));
        std::fs::remove_dir_all(p.path().join("ckpt")).unwrap();
        let out = p
            .cmd(&["checkout", "s.yaml", "--workspace", "rootws"])
            .env("ORCHESTRATE_CACHE_TYPE", "hardlink,copy")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(std::fs::metadata(p.path().join("ckpt/w.bin")).unwrap().nlink(), 1, "root got a hard link");
        std::fs::remove_dir_all(p.path().join("ckpt")).unwrap();
        let status = std::process::Command::new("chown").args(["-R", "65534:65534"]).arg(p.path()).status().unwrap();
        assert!(status.success());
    }
    let hard = [("ORCHESTRATE_CACHE_TYPE", "hardlink,copy")];
    let out = as_unprivileged(&p, &["run", "s.yaml"], &hard);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::fs::remove_dir_all(p.path().join("ckpt")).unwrap();
    let out = as_unprivileged(&p, &["checkout", "s.yaml"], &hard);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let file = p.path().join("ckpt/w.bin");
    let meta = std::fs::metadata(&file).unwrap();
    assert!(meta.nlink() >= 2, "not a hard link: the checkout copied");
    assert!(meta.permissions().readonly(), "a hard-linked out must be read-only");
    // Writing is refused for the unprivileged user.
    let out = as_unprivileged(&p, &["verify"], &[]);
    assert!(out.status.success(), "{}", stdout(&out));
    let write = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", "echo edit >> ckpt/w.bin"])
        .current_dir(p.path())
        .output();
    if unsafe_euid() == 0 {
        assert!(!write.unwrap().status.success(), "a read-only hard link was writable");
    }
    // An edit forced anyway (chmod, then write in place) edits the object.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&file, "edited\n").unwrap();
    let out = as_unprivileged(&p, &["run", "s.yaml", "--json"], &hard);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ev = events(&out);
    let started: Vec<&serde_json::Value> = ev.iter().filter(|e| e["event"] == "node_started").collect();
    assert_eq!(started.len(), 1, "{}", stdout(&out));
    let reason = started[0]["reason"].as_str().unwrap();
    assert!(reason.contains("hard link to the store"), "{reason}");
    assert_eq!(p.read("ckpt/w.bin"), "weights\n");
    let out = as_unprivileged(&p, &["verify"], &[]);
    assert!(out.status.success(), "the store does not verify: {}", stdout(&out));
}

/// The keep policy that makes the protocol fit a disk (#31): `gc --drop-states`
/// drops the training states of kept results (the largest objects), leaves
/// every node cached, and a run that needs a state again (here: the resume
/// check forced) runs its producers first, transitively, and the bit-exact
/// resume makes the same state again. Before, there was no such policy.
#[test]
fn gc_drop_states_keeps_every_node_cached_and_a_run_that_needs_a_state_makes_it_again() {
    let p = Project::new();
    let full = include_str!("../fixtures/train-small.yaml");
    let spec = &full[..full.find("  grpo:").expect("the fixture has a grpo node")];
    p.write("t.yaml", spec);
    let out = p.run(&["run", "t.yaml", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let state_path = |node: &str| stdout(&p.run(&["path", "t.yaml", &format!("{node}:state")])).trim().to_string();
    let states: Vec<String> = ["warmstart@mode=continuous", "warmstart@mode=interrupt", "warmstart-resume"]
        .iter()
        .map(|n| state_path(n))
        .collect();
    // A state keeps no durations (#34): the bit-exact resume writes the
    // continuous run's state, byte for byte, and the store keeps it once.
    assert_eq!(states[0], states[2], "the resumed state is the continuous one's object");
    let distinct: std::collections::BTreeSet<&String> = states.iter().collect();
    let state_bytes: u64 = distinct.iter().map(|s| std::fs::metadata(s).unwrap().len()).sum();
    let before = stored_objects(&p);

    let out = p.run(&["gc", "t.yaml", "--drop-states", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let after = stored_objects(&p);
    let freed: u64 = before.iter().filter(|(h, _)| !after.contains_key(*h)).map(|(_, b)| b).sum();
    assert_eq!(freed, state_bytes, "gc --drop-states freed other bytes than the states'");
    assert!(states.iter().all(|s| !std::path::Path::new(s).exists()));
    let out = p.run(&["path", "t.yaml", "warmstart-resume:state"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("was dropped by gc --drop-states"), "{}", stderr(&out));
    assert!(p.run(&["verify"]).status.success(), "{}", stdout(&p.run(&["verify"])));

    // Every node stays cached.
    let out = p.run(&["run", "t.yaml", "--json"]);
    let ev = events(&out);
    assert!(nodes_with(&ev, "node_started").is_empty(), "{}{}", stdout(&out), stderr(&out));
    // The check, forced, needs both states, and the resume needs the interrupt's: all three run again.
    let out = p.run(&["run", "t.yaml", "--json", "--force", "warmstart-check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ev = events(&out);
    assert_eq!(
        nodes_with(&ev, "node_finished"),
        ["warmstart-check", "warmstart-resume", "warmstart@mode=continuous", "warmstart@mode=interrupt"],
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("note: warmstart@mode=interrupt runs again: its 'state' was dropped by gc --drop-states and warmstart-resume needs it"), "{}", stderr(&out));
    // Each state is in the store again, and the resumed state still equals
    // the continuous one.
    for n in ["warmstart@mode=continuous", "warmstart@mode=interrupt", "warmstart-resume"] {
        let s = state_path(n);
        assert!(std::path::Path::new(&s).exists(), "the state of {n} was not made again: {s}");
    }
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(stdout(&p.run(&["path", "t.yaml", "warmstart-check:report"])).trim()).unwrap(),
    )
    .unwrap();
    assert_eq!(report["identical"], true, "{report}");
    assert!(p.run(&["verify"]).status.success());
}

/// `run --drop-states` (#31): each training state is dropped as soon as every
/// node that reads it has finished, so the store never holds all of them at
/// once; the nodes stay cached. Before, every state stayed until a gc.
#[test]
fn run_drop_states_drops_each_state_once_its_readers_finished_and_everything_stays_cached() {
    let p = Project::new();
    let full = include_str!("../fixtures/train-small.yaml");
    p.write("t.yaml", &full[..full.find("  grpo:").expect("the fixture has a grpo node")]);
    let out = p.run(&["run", "t.yaml", "--drop-states"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("dropped 3 training state(s)"), "{err}");
    for n in ["warmstart@mode=continuous", "warmstart@mode=interrupt", "warmstart-resume"] {
        assert!(err.contains(n), "{n}: {err}");
        let out = p.run(&["path", "t.yaml", &format!("{n}:state")]);
        assert!(stderr(&out).contains("was dropped by run --drop-states"), "{n}: {}", stderr(&out));
    }
    // The models stay, the check's report too, and the next run is all cache hits.
    assert_eq!(p.run(&["path", "t.yaml", "warmstart@mode=continuous:model"]).status.code(), Some(0));
    assert!(p.run(&["verify"]).status.success());
    let ev = events(&p.run(&["run", "t.yaml", "--json"]));
    assert!(nodes_with(&ev, "node_started").is_empty(), "{ev:?}");
}

/// gc removes only inside our own folders: with `records` planted as a link
/// to a folder of the user's holding files named as records are, gc said
/// `removed 1 results` and deleted the user's file through the link. It now
/// refuses, names the link, and removes nothing (no row either).
#[test]
fn gc_never_removes_through_a_link_in_the_workspace() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'echo $X > a.txt', outs: [a.txt], env: {X: 1}}\n",
    );
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    assert_eq!(p.run(&["run", "s.yaml", "--set", "nodes.a.params.env.X=2"]).status.code(), Some(0));
    let victim = tempfile::tempdir().unwrap();
    let ws = p.path().join(".orchestrate");
    for sub in ["records", "checkpoints"] {
        let real = ws.join(sub);
        std::fs::create_dir_all(&real).unwrap();
        let copy = victim.path().join(sub);
        assert!(std::process::Command::new("cp").arg("-r").arg(&real).arg(&copy).status().unwrap().success());
        std::fs::rename(&real, ws.join(format!("{sub}.real"))).unwrap();
        std::os::unix::fs::symlink(&copy, &real).unwrap();
    }
    let walk = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![d.to_path_buf()];
        while let Some(x) = stack.pop() {
            for e in std::fs::read_dir(&x).unwrap() {
                let e = e.unwrap().path();
                if e.is_dir() {
                    stack.push(e.clone())
                }
                out.push(e);
            }
        }
        out.sort();
        out
    };
    let before = walk(victim.path());
    let objects = stored_objects(&p);
    let out = p.run(&["gc", "s.yaml"]);
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert_eq!(walk(victim.path()), before, "gc removed a file outside the workspace");
    assert_eq!(stored_objects(&p), objects, "gc removed objects although it refused");
}

/// A command's `sh` is the one its `PATH` finds: orchestrate's own `PATH`
/// (looked up once a run), or the node's, when the node sets one in `env`.
/// Each planted `sh` says it ran, then runs the real one.
#[test]
fn a_commands_sh_is_the_first_on_the_path_it_runs_with() {
    use std::os::unix::fs::PermissionsExt;
    let p = Project::new();
    let real = ["/bin/sh", "/usr/bin/sh"].into_iter().find(|s| std::path::Path::new(s).exists()).unwrap();
    for (folder, name) in [("ours", "ours"), ("nodes", "nodes")] {
        let sh = p.write(
            &format!("{folder}/sh"),
            &format!("#!{real}\necho {name} >> \"$ORCHESTRATE_NODE.sh\"\nexec {real} \"$@\"\n"),
        );
        std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (ours, nodes) = (p.path().join("ours"), p.path().join("nodes"));
    let system = std::env::var("PATH").unwrap();
    p.write(
        "s.yaml",
        &format!(
            "name: s\nnodes:\n  a:\n    op: shell\n    params: {{cmd: 'echo 1 > a.txt', outs: [a.txt]}}\n  \
             b:\n    op: shell\n    params: {{cmd: 'echo 2 > b.txt', outs: [b.txt], env: {{PATH: '{}:{system}'}}}}\n",
            nodes.display()
        ),
    );
    let out = p.cmd(&["run", "s.yaml"]).env("PATH", format!("{}:{system}", ours.display())).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(p.path().join("a.sh")).unwrap(), "ours\n");
    assert_eq!(std::fs::read_to_string(p.path().join("b.sh")).unwrap(), "nodes\n");
    assert_eq!(std::fs::read_to_string(p.path().join("b.txt")).unwrap(), "2\n");
}

/// Before, `outs: [.git]` validated, and `run` removed the project's whole
/// git repository before the command ran (an out is removed whole); so did
/// `outs: [.orchestrate]` with the store, and `outs: [p.yaml]` with the spec
/// itself. DVC refuses such outs (`.git` is ignored, a dvc.yaml cannot be an
/// out). Each is now refused by `validate`, `plan`, `run` and `checkout` with
/// exit 2, naming the out and why, and nothing in the project is touched.
#[test]
fn an_out_that_is_version_control_our_store_or_the_spec_is_refused_and_nothing_is_removed() {
    let p = Project::new();
    p.write(".git/HEAD", "ref: refs/heads/main\n");
    p.write("lib/vendored/.git/HEAD", "ref: refs/heads/main\n");
    p.write(".dvc/config", "[core]\n");
    p.write("conf/base.yaml", "name: base\nnodes: {}\n");
    p.write(
        "keep.yaml",
        "name: keep\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'echo 1 > a.txt', outs: [a.txt]}\n",
    );
    assert_eq!(p.run(&["run", "keep.yaml"]).status.code(), Some(0));
    let cases = [
        (".git", "version control's folder"),
        (".git/hooks", "version control's folder"),
        ("lib/vendored/.git", "version control's folder"),
        (".dvc", "DVC's folder"),
        (".orchestrate", "orchestrate's own folder"),
        ("./.orchestrate/objects", "orchestrate's own folder"),
        ("p.yaml", "the spec file"),
        ("conf/base.yaml", "the spec file"),
        ("conf", "the spec file"),
    ];
    for (out, why) in cases {
        let spec = format!(
            "name: p\nextends: conf/base.yaml\nnodes:\n  w:\n    op: shell\n    params: {{cmd: 'mkdir -p x', outs: ['{out}']}}\n"
        );
        p.write("p.yaml", &spec);
        let before = common::tree_of(p.path());
        for verb in ["validate", "plan", "run", "checkout"] {
            let o = p.run(&[verb, "p.yaml"]);
            assert_eq!(o.status.code(), Some(2), "{verb} with out '{out}': {}{}", stdout(&o), stderr(&o));
            let e = stderr(&o);
            assert!(e.contains(&format!("out '{out}'")) && e.contains(why), "{verb} with out '{out}': {e}");
        }
        assert_eq!(common::tree_of(p.path()), before, "out '{out}': a file of the project changed");
    }
    // The spec reached through a link: the link is the user's spec too.
    std::fs::create_dir_all(p.path().join("specs")).unwrap();
    p.write(
        "specs/real.yaml",
        "name: p\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'true', outs: [linked.yaml]}\n",
    );
    std::os::unix::fs::symlink("specs/real.yaml", p.path().join("linked.yaml")).unwrap();
    let before = common::tree_of(p.path());
    let o = p.run(&["run", "linked.yaml"]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("out 'linked.yaml' is the spec file"), "{}", stderr(&o));
    assert_eq!(common::tree_of(p.path()), before);
    // Other names are anyone's: `.github`, `git`, `x.git`.
    for out in [".github/out.txt", "git", "x.git"] {
        p.write("p.yaml", &format!("name: p\nnodes:\n  w:\n    op: shell\n    params: {{cmd: 'mkdir -p {out} && rmdir {out} && echo > {out}', outs: ['{out}']}}\n"));
        let o = p.run(&["run", "p.yaml"]);
        assert_eq!(o.status.code(), Some(0), "out '{out}': {}", stderr(&o));
    }
}

/// Before, an out folder holding the workspace in use (`--workspace
/// sub/ws`, or the default `.orchestrate` of a run started in a sub-folder)
/// was removed whole with the store in it, and an out inside the workspace
/// was written into the store. Both are refused (exit 2) before anything
/// runs, by `run` and by `checkout`, and nothing is touched.
#[test]
fn an_out_holding_or_inside_the_workspace_is_refused_before_anything_is_removed() {
    let p = Project::new();
    p.write(
        "p.yaml",
        "name: p\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'mkdir -p sub && echo 1 > sub/a.txt', outs: [sub]}\n",
    );
    assert_eq!(p.run(&["run", "p.yaml", "--workspace", "ws"]).status.code(), Some(0));
    p.write("sub/a.txt", "edited\n");
    let refused = |o: &std::process::Output, out: &str| {
        assert_eq!(o.status.code(), Some(2), "{}{}", stdout(o), stderr(o));
        assert!(stderr(o).contains(&format!("out '{out}'")) && stderr(o).contains("workspace"), "{}", stderr(o));
    };
    // A workspace inside the out: given, and the default of a run started inside it.
    std::fs::create_dir_all(p.path().join("sub/deeper")).unwrap();
    let before = common::tree_of(p.path());
    for verb in ["run", "checkout"] {
        refused(&p.run(&[verb, "p.yaml", "--workspace", "sub/ws"]), "sub");
        let o = std::process::Command::new(common::bin())
            .args([verb, "../../p.yaml"])
            .current_dir(p.path().join("sub/deeper"))
            .output()
            .unwrap();
        refused(&o, "sub");
        let mut now = common::tree_of(p.path());
        now.retain(|k, _| !k.starts_with("sub/ws/") && !k.starts_with("sub/deeper/.orchestrate/"));
        assert_eq!(now, before, "{verb}: a file of the project changed");
    }
    // An out inside the workspace.
    p.write(
        "q.yaml",
        "name: q\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'mkdir -p ws/objects/x', outs: [ws/objects]}\n",
    );
    let remote = tempfile::tempdir().unwrap();
    let url = format!("file://{}", remote.path().display());
    let before = common::tree_of(p.path());
    for verb in ["run", "checkout", "pull"] {
        for ws in ["ws", "./ws/"] {
            let mut args = vec![verb, "q.yaml", "--workspace", ws];
            if verb == "pull" {
                args.extend(["--remote", url.as_str()]);
            }
            refused(&p.run(&args), "ws/objects");
        }
    }
    let mut now = common::tree_of(p.path());
    now.retain(|k, _| !k.starts_with("ws/"));
    let mut then = before.clone();
    then.retain(|k, _| !k.starts_with("ws/"));
    assert_eq!(now, then, "a file of the project changed");
    let objects = |t: &std::collections::BTreeMap<String, Vec<u8>>| {
        t.iter().filter(|(k, _)| k.starts_with("ws/objects/")).map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>()
    };
    assert_eq!(objects(&common::tree_of(p.path())), objects(&before), "the store's objects changed");
}

/// Before, `a` writing `data` and `b` writing `data/sub` validated, and the
/// two ran side by side: `a` removed `data` whole while `b` wrote into it,
/// and whether `a`'s stored folder held `b`'s file depended on which
/// finished first (it did here), so one key named different bytes from run
/// to run. DVC refuses overlapping outs; so does `validate` now, naming both.
#[test]
fn overlapping_outs_are_refused_naming_both_nodes() {
    let p = Project::new();
    for (outs_a, outs_b, first, second) in [
        ("[data]", "[data/sub]", "'data' (node 'a')", "'data/sub' (node 'b')"),
        ("[data/sub/deep.txt]", "[./data/sub/]", "'data/sub' (node 'b')", "'data/sub/deep.txt' (node 'a')"),
        ("[data, data/x.txt]", "[other]", "'data' (node 'a')", "'data/x.txt' (node 'a')"),
    ] {
        p.write(
            "p.yaml",
            &format!(
                "name: p\nnodes:\n  a:\n    op: shell\n    params: {{cmd: 'true', outs: {outs_a}}}\n  \
                 b:\n    op: shell\n    params: {{cmd: 'true', outs: {outs_b}}}\n"
            ),
        );
        for verb in ["validate", "run"] {
            let o = p.run(&[verb, "p.yaml"]);
            assert_eq!(o.status.code(), Some(2), "{verb} {outs_a} {outs_b}: {}{}", stdout(&o), stderr(&o));
            let e = stderr(&o);
            assert!(e.contains(&format!("{first} holds {second}")), "{verb} {outs_a} {outs_b}: {e}");
        }
    }
    // Siblings and names that only share a prefix do not overlap.
    p.write(
        "p.yaml",
        "name: p\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'mkdir -p data/a && echo > data/a/x', outs: [data/a]}\n  \
         b:\n    op: shell\n    params: {cmd: 'echo > data/ab', outs: [data/ab]}\n",
    );
    let o = p.run(&["run", "p.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// Before, `path` said "'train' is not cached as the spec stands: run it
/// first" whatever the reason: for a node whose store object is there but
/// whose out was deleted from the tree (`plan` says `restore`), and with no
/// reason when a param had changed. It now prints the store path of a
/// restorable output, and says why a node would run.
#[test]
fn path_prints_a_restorable_output_and_says_why_a_node_would_run() {
    let p = project();
    assert_eq!(p.run(&["run", "p.yaml"]).status.code(), Some(0));
    let stored = p.run(&["path", "p.yaml", "train:out"]);
    assert_eq!(stored.status.code(), Some(0), "{}", stderr(&stored));
    std::fs::remove_dir_all(p.path().join("out")).unwrap();
    let again = p.run(&["path", "p.yaml", "train:out"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(stdout(&again), stdout(&stored));
    assert!(std::path::Path::new(stdout(&again).trim()).join("checkpoint-1/model.bin").is_file());
    let changed = p.run(&["path", "p.yaml", "train:out", "--set", "nodes.train.params.env.LR=0.3"]);
    assert_eq!(changed.status.code(), Some(1), "{}", stdout(&changed));
    assert!(
        stderr(&changed).contains("'train' is not cached as the spec stands (it would run: params.env.LR: 0.1 → 0.3)"),
        "{}",
        stderr(&changed)
    );
}

/// Before, a dep folder holding a workspace (`--workspace data/ws` beside
/// `deps: [data]`) hashed the store's own files into the key, so the node
/// ran again on every run (`dep 'data': ws/cache.sqlite changed, ...`),
/// and an out folder holding a workspace not in use (an earlier run started
/// inside it) was removed whole with every result in it. A workspace is
/// never data: a dep walk leaves it out, and an out holding one is not
/// removed (the node fails, naming it).
#[test]
fn a_workspace_inside_a_dep_is_not_hashed_and_one_inside_an_out_is_never_removed() {
    let p = Project::new();
    p.write("data/x.txt", "x\n");
    p.write("p.yaml", "name: p\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'cat data/x.txt > a.txt', deps: [data], outs: [a.txt]}\n");
    assert_eq!(p.run(&["run", "p.yaml", "--workspace", "data/ws"]).status.code(), Some(0));
    let again = p.run(&["run", "p.yaml", "--workspace", "data/ws", "--json"]);
    assert_eq!(nodes_with(&events(&again), "cache_hit"), ["a"], "{}", stdout(&again));
    p.write("data/x.txt", "y\n");
    let changed = p.run(&["plan", "p.yaml", "--workspace", "data/ws"]);
    assert!(stdout(&changed).contains("dep 'data': x.txt changed"), "{}", stdout(&changed));

    // An out holding another workspace: made by a run started inside it.
    p.write(
        "exp/inner.yaml",
        "name: inner\nnodes:\n  i:\n    op: shell\n    params: {cmd: 'echo 1 > i.txt', outs: [i.txt]}\n",
    );
    let inner = std::process::Command::new(common::bin())
        .args(["run", "inner.yaml"])
        .current_dir(p.path().join("exp"))
        .output()
        .unwrap();
    assert_eq!(inner.status.code(), Some(0), "{}", stderr(&inner));
    p.write(
        "q.yaml",
        "name: q\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'mkdir -p exp && echo > exp/new.txt', outs: [exp]}\n",
    );
    let before = common::tree_of(&p.path().join("exp"));
    let o = p.run(&["run", "q.yaml"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let said = stdout(&o) + &stderr(&o);
    assert!(said.contains("exp/.orchestrate") && said.contains("workspace"), "{said}");
    assert_eq!(common::tree_of(&p.path().join("exp")), before, "a file under the out holding a workspace changed");
}

/// The files in the workspace's trash: each one's path under its set of
/// outs, and its text.
fn trash_files(p: &Project) -> Vec<(String, String)> {
    let trash = p.path().join(".orchestrate/trash");
    let mut found: Vec<(String, String)> = common::tree_of(&trash)
        .into_iter()
        .filter(|(k, _)| !k.ends_with('/'))
        .map(|(k, v)| (k.split_once('/').unwrap().1.to_string(), String::from_utf8(v).unwrap()))
        .collect();
    found.sort();
    found
}

/// Before, an out was removed whole before its node ran and before a cached
/// out was put back, whatever it held: a folder of the researcher's own at
/// that path (`res/precious.csv`, there before the first run), notes added to
/// a results folder, a hand edit, each gone without a copy (as `dvc repro`
/// removes them). Bytes the store lacks are never removed now: they are
/// moved into the workspace's trash, the run says where, and `gc` empties
/// it. An out as its node's last record left it is the store's, and goes.
#[test]
fn an_out_holding_bytes_the_store_lacks_is_moved_to_the_trash_never_removed() {
    let p = Project::new();
    p.write("p.yaml", "name: p\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'mkdir -p res && echo 42 > res/score.txt', outs: [res]}\n");
    p.write("res/precious.csv", "mine\n");
    let o = p.run(&["run", "p.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("out 'res' held bytes the store lacks: moved to"), "{}", stdout(&o));
    assert_eq!(trash_files(&p), [("res/precious.csv".to_string(), "mine\n".to_string())]);
    assert!(!p.path().join("res/precious.csv").exists() && p.read("res/score.txt") == "42\n");

    // A file added to the folder: `run` puts the cached out back, the notes go to the trash.
    p.write("res/notes.md", "my analysis\n");
    let events = p.run_json(&["p.yaml"], 0);
    let hit = events.iter().find(|e| e["event"] == "cache_hit").expect("a cache hit");
    assert_eq!(hit["moved"][0]["path"], "res", "{hit}");
    assert!(std::path::Path::new(hit["moved"][0]["to"].as_str().unwrap()).join("notes.md").is_file(), "{hit}");
    assert!(!p.path().join("res/notes.md").exists());

    // A hand edit replaced by `checkout --force`.
    p.write("res/score.txt", "43\n");
    let o = p.run(&["checkout", "p.yaml", "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("moved to"), "{}", stdout(&o));
    assert_eq!(p.read("res/score.txt"), "42\n");
    let mut found: Vec<String> = trash_files(&p).into_iter().map(|(f, text)| format!("{f}={text}")).collect();
    found.sort();
    let mut want =
        ["res/precious.csv=mine\n", "res/notes.md=my analysis\n", "res/score.txt=42\n", "res/score.txt=43\n"];
    want.sort();
    assert_eq!(found, want, "every replaced byte the store lacked is in the trash");

    // The out as the node left it goes, and nothing more is moved.
    let before = trash_files(&p).len();
    let o = p.run(&["run", "p.yaml", "--force", "w"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(!stdout(&o).contains("moved to"), "{}", stdout(&o));
    assert_eq!(trash_files(&p).len(), before);

    let du = stdout(&p.run(&["du"]));
    assert!(du.contains("trash: 3 sets of outs moved aside"), "{du}");
    // The trash holds the researcher's bytes, not the store's: a routine `gc`
    // (which frees the cache) keeps it, saying how to empty it. Before, it
    // emptied it, and with it a folder the run had moved aside.
    let o = p.run(&["gc", "p.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("kept the trash: 3 sets of outs") && stdout(&o).contains("--empty-trash"),
        "{}",
        stdout(&o)
    );
    assert_eq!(trash_files(&p).len(), 4, "gc without --empty-trash removed from the trash");
    let o = p.run(&["gc", "p.yaml", "--empty-trash", "--dry-run"]);
    assert!(stdout(&o).contains("would remove the trash: 3 sets of outs"), "{}", stdout(&o));
    assert_eq!(trash_files(&p).len(), 4);
    let o = p.run(&["gc", "p.yaml", "--empty-trash"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("removed the trash: 3 sets of outs"), "{}", stdout(&o));
    assert!(!p.path().join(".orchestrate/trash").exists());
}

/// Before, an out folder holding a repository of its own (`vendor/.git`: a
/// clone, a submodule, `git init` by hand) was removed whole before the
/// command ran, with the repository's history: `outs: [.git]` was refused,
/// a folder holding one was not. Such an out is never removed now, by `run`
/// or by `checkout --force`; the node fails naming the folder, and nothing
/// under it changes. An out that a command fills with one is refused when it
/// is stored, so no stored out ever holds one that a later run would keep.
#[test]
fn an_out_holding_a_repository_is_never_removed_or_stored() {
    let p = Project::new();
    p.write("p.yaml", "name: p\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'mkdir -p vendor && echo new > vendor/out.txt', outs: [vendor]}\n");
    // Folders, and a submodule's `.git` file (its history is elsewhere; the checkout is the user's).
    for (repo, file) in [(".git", "HEAD"), (".hg", "store"), (".jj", "repo"), (".dvc", "config"), (".git", "")] {
        std::fs::remove_dir_all(p.path().join("vendor")).ok();
        let at = if file.is_empty() { format!("vendor/{repo}") } else { format!("vendor/{repo}/{file}") };
        p.write(&at, "gitdir: ../.git/modules/vendor\n");
        p.write("vendor/lib.c", "mine\n");
        let before = common::tree_of(p.path());
        let o = p.run(&["run", "p.yaml"]);
        assert_eq!(o.status.code(), Some(1), "{repo}: {}{}", stdout(&o), stderr(&o));
        let said = stdout(&o) + &stderr(&o);
        assert!(said.contains(&format!("vendor/{repo}")) && said.contains("not removed"), "{repo}: {said}");
        let mut now = common::tree_of(p.path());
        now.retain(|k, _| !k.starts_with(".orchestrate/"));
        let mut then = before;
        then.retain(|k, _| !k.starts_with(".orchestrate/"));
        assert_eq!(now, then, "{repo}: a file under the out holding a repository changed");
    }
    // Stored without one, then a repository made inside it by hand: `run`
    // (which puts a cached out back) and `checkout --force` keep it.
    std::fs::remove_dir_all(p.path().join("vendor")).unwrap();
    assert_eq!(p.run(&["run", "p.yaml"]).status.code(), Some(0));
    p.write("vendor/.git/HEAD", "history\n");
    for args in [&["run", "p.yaml"][..], &["checkout", "p.yaml", "--force"][..]] {
        let o = p.run(args);
        assert_ne!(o.status.code(), Some(0), "{args:?}: {}{}", stdout(&o), stderr(&o));
        let said = stdout(&o) + &stderr(&o);
        assert!(said.contains("vendor/.git") && said.contains("not removed"), "{args:?}: {said}");
        assert_eq!(std::fs::read_to_string(p.path().join("vendor/.git/HEAD")).unwrap(), "history\n", "{args:?}");
    }
    // A command that fills its out with one fails the node, naming it.
    std::fs::remove_dir_all(p.path().join("vendor")).unwrap();
    p.write("q.yaml", "name: q\nnodes:\n  c:\n    op: shell\n    params: {cmd: 'mkdir -p clone/.git && echo x > clone/.git/HEAD', outs: [clone]}\n");
    let o = p.run(&["run", "q.yaml"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let said = stdout(&o) + &stderr(&o);
    assert!(said.contains("clone/.git") && said.contains("version control"), "{said}");
    let plan = stdout(&p.run(&["plan", "q.yaml"]));
    assert!(plan.contains("0 cached, 1 to run"), "the refused out was cached: {plan}");
}

/// Before, the copy a killed checkout left beside an out
/// (`.NAME.orchestrate-PID-NANOS-N`, a file or a folder) was hashed into
/// the key of every folder or glob dep over that folder until the next
/// checkout of that out, so nodes reading the folder ran again for a file
/// that is orchestrate's own, never data (`dep 'data': .prepared.orchestrate-…
/// added`). A dep walk leaves such names out, as it leaves out a workspace;
/// a file of the user's that only looks alike still counts.
#[test]
fn a_copy_a_killed_checkout_left_is_never_part_of_a_dep() {
    let p = Project::new();
    p.write("data/raw.csv", "1\n");
    p.write(
        "p.yaml",
        "name: p\nnodes:\n  count:\n    op: shell\n    params: {cmd: 'ls -a data | wc -l > n.txt', deps: [data], outs: [n.txt]}\n  \
         glob:\n    op: shell\n    params: {cmd: 'cat data/raw.csv > g.txt', deps: ['data/**'], outs: [g.txt]}\n",
    );
    assert_eq!(p.run(&["run", "p.yaml"]).status.code(), Some(0));
    p.write("data/.prepared.orchestrate-4194303-1700000000000000000-7", "half\n");
    p.write("data/.model.orchestrate-4194303-1700000000000000001-8/w.bin", "half\n");
    let plan = stdout(&p.run(&["plan", "p.yaml"]));
    assert!(plan.contains("2 cached, 0 to run"), "{plan}");
    p.write("data/.prepared.orchestrate-notes", "mine\n");
    let plan = stdout(&p.run(&["plan", "p.yaml"]));
    assert!(plan.contains("dep 'data': .prepared.orchestrate-notes added"), "{plan}");
}

/// A checkout copies an out beside itself under a temporary name
/// (`.NAME.orchestrate-PID-NANOS-N`) and renames it into place; killed in
/// between, the copy stayed in the user's folder for good (a dep walk
/// leaves it out, test above, but it takes space). The next checkout
/// of that out (under the out's lock, so no other process is writing one)
/// removes such leftovers, and nothing else.
#[test]
fn a_checkout_left_half_done_by_a_killed_process_is_cleared_by_the_next_one() {
    let p = project();
    assert_eq!(p.run(&["run", "p.yaml"]).status.code(), Some(0));
    p.write(".out.orchestrate-4194303-1700000000000000000-0/checkpoint-1/model.bin", "half\n");
    p.write("data/.prepared.orchestrate-4194303-1700000000000000000-7", "half\n");
    p.write(".out.orchestrate-notes", "mine\n");
    p.write("data/.prepared.orchestrate-1-2", "mine\n");
    std::fs::remove_dir_all(p.path().join("out")).unwrap();
    std::fs::remove_dir_all(p.path().join("data/prepared")).unwrap();
    let out = p.run(&["checkout", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert!(!p.path().join(".out.orchestrate-4194303-1700000000000000000-0").exists(), "a leftover copy stayed");
    assert!(!p.path().join("data/.prepared.orchestrate-4194303-1700000000000000000-7").exists());
    assert_eq!(p.read(".out.orchestrate-notes"), "mine\n");
    assert_eq!(p.read("data/.prepared.orchestrate-1-2"), "mine\n");
    assert!(p.path().join("out/checkpoint-1/model.bin").is_file());
}

/// The program a shell command runs is in its key, declared or not: the
/// script an interpreter runs (`python3 train.py`, `bash tools/prep.sh`), a
/// module (`python3 -m tools.gen`), a program given by path (`./score.sh`).
/// Before, `python3 train.py > out.txt` without `deps: [train.py]` (the form
/// of DVC's and our own docs' examples) stayed cached after train.py was
/// edited, and served the old code's result. Nothing else a command names is
/// keyed: a folder it writes logs into (`--logdir runs`) does not re-run it.
#[test]
fn the_program_a_shell_command_runs_is_in_its_key_declared_or_not() {
    let p = Project::new();
    p.write("train.py", "print(1)\n");
    p.write("tools/__init__.py", "");
    p.write("tools/gen.py", "print(1)\n");
    p.write("tools/prep.sh", "echo 1\n");
    p.write("score.sh", "#!/bin/sh\necho 1\n");
    std::fs::set_permissions(p.path().join("score.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.write(
        "p.yaml",
        r#"name: prog
nodes:
  script:
    op: shell
    params: {cmd: "mkdir -p runs && OMP_NUM_THREADS=1 python3 -u train.py --logdir runs > a.txt 2>&1 && date > runs/log", outs: [a.txt]}
  module:
    op: shell
    params: {cmd: "cd . && python3 -m tools.gen > b.txt", outs: [b.txt]}
  sh:
    op: shell
    params: {cmd: "bash tools/prep.sh | cat > c.txt", outs: [c.txt]}
  path:
    op: shell
    params: {cmd: "./score.sh > d.txt", outs: [d.txt]}
"#,
    );
    let out = p.run(&["run", "--json", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let out = p.run(&["run", "--json", "p.yaml"]);
    assert_eq!(nodes_with(&events(&out), "node_started"), Vec::<String>::new(), "a second run ran again");
    for (file, node) in
        [("train.py", "script"), ("tools/gen.py", "module"), ("tools/prep.sh", "sh"), ("score.sh", "path")]
    {
        edit_and_run(&p, file, Some(node));
    }
}

/// Edits `file` (a comment added) and runs `p.yaml`: `node`, named so by
/// `plan` with `file`, is the one node that runs, or none runs.
fn edit_and_run(p: &Project, file: &str, node: Option<&str>) {
    let before = std::fs::read_to_string(p.path().join(file)).unwrap();
    p.write(file, &format!("{before}# edited\n"));
    let plan = stdout(&p.run(&["plan", "p.yaml"]));
    if let Some(node) = node {
        assert!(plan.lines().any(|l| l.starts_with(node) && l.contains(file)), "plan does not name {file}: {plan}");
    }
    let out = p.run(&["run", "--json", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(nodes_with(&events(&out), "node_started"), Vec::from_iter(node), "after an edit of {file}");
}

/// Before, a path a command named that another node writes made no edge
/// unless deps listed it: `cat d/x.txt` ran beside the node writing
/// `d/x.txt` (before it, or on the old file), and stayed cached when that
/// node wrote other bytes. It is an edge now, as a dep is.
#[test]
fn another_nodes_output_named_in_a_command_is_an_edge() {
    let p = Project::new();
    let spec = |n: u32| {
        format!(
            "name: named\nnodes:\n  gen:\n    op: shell\n    params: {{cmd: 'sleep 0.3; mkdir -p d && echo {n} > d/x.txt', outs: [d]}}\n  use:\n    op: shell\n    params: {{cmd: 'cat d/x.txt > y.txt', outs: [y.txt]}}\n"
        )
    };
    p.write("p.yaml", &spec(1));
    // Run side by side, `use` would read `d/x.txt` before `gen` wrote it.
    let out = p.run(&["run", "--json", "-j", "2", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(std::fs::read_to_string(p.path().join("y.txt")).unwrap(), "1\n");
    p.write("p.yaml", &spec(2));
    let out = p.run(&["run", "--json", "-j", "2", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(nodes_with(&events(&out), "node_started"), ["gen", "use"]);
    assert_eq!(std::fs::read_to_string(p.path().join("y.txt")).unwrap(), "2\n");
}

/// Before, `bash scripts/train.sh` keyed the script and not what it runs:
/// an edit of the `train.py` it starts (or of a module that imports) left
/// the node cached on the old code's result.
#[test]
fn what_a_shell_script_runs_is_in_the_key_of_the_command_that_runs_it() {
    let p = Project::new();
    p.write("scripts/train.sh", "set -e\n. scripts/env.sh\npython3 train.py \"$@\"\n");
    p.write("scripts/env.sh", "export SEED=1\n");
    p.write("train.py", "from model import Net\nprint(Net)\n");
    p.write("model.py", "Net = 1\n");
    p.write(
        "p.yaml",
        "name: script\nnodes:\n  train:\n    op: shell\n    params: {cmd: 'bash scripts/train.sh --seed 1 > a.txt', outs: [a.txt]}\n",
    );
    let out = p.run(&["run", "--json", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    for file in ["train.py", "model.py", "scripts/env.sh", "scripts/train.sh"] {
        edit_and_run(&p, file, Some("train"));
    }
}

/// Before, what the program imports was in no key: `train.py` stayed
/// cached after an edit of the `model.py` it imports (the code that ran was
/// not the code the key named), and `cd sub && python3 run.py` keyed no
/// program at all (nor `./run.sh` of `sub`: a `run.sh` of the spec's folder,
/// which does not run, stood in for it where there was one).
#[test]
fn what_a_python_program_imports_and_a_program_run_from_another_folder_are_in_its_key() {
    let p = Project::new();
    p.write(
        "train.py",
        "import json, os\nfrom model import Net\nimport utils.io as uio\ns = 'import decoy'\nprint(Net, uio.X)\n",
    );
    p.write("model.py", "from layers import dense\nNet = 1\n");
    p.write("layers.py", "dense = 1\n");
    p.write("utils/__init__.py", "");
    p.write("utils/io.py", "from .fmt import F\nX = 1\n");
    p.write("utils/fmt.py", "F = 1\n");
    p.write("decoy.py", "print(1)\n");
    p.write("sub/run.py", "import helper\nprint(1)\n");
    p.write("sub/helper.py", "H = 1\n");
    p.write("sub/run.sh", "echo 1\n");
    p.write("run.sh", "echo 1\n");
    for f in ["sub/run.sh", "run.sh"] {
        std::fs::set_permissions(p.path().join(f), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    p.write(
        "p.yaml",
        r#"name: imports
nodes:
  train:
    op: shell
    params: {cmd: "python3 train.py > a.txt", outs: [a.txt]}
  sub:
    op: shell
    params: {cmd: "cd sub && python3 run.py > ../b.txt && ./run.sh >> ../b.txt", outs: [b.txt]}
"#,
    );
    let out = p.run(&["run", "--json", "p.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let out = p.run(&["run", "--json", "p.yaml"]);
    assert_eq!(nodes_with(&events(&out), "node_started"), Vec::<String>::new(), "a second run ran again");
    for (file, node) in [
        ("model.py", Some("train")),
        ("layers.py", Some("train")),
        ("utils/io.py", Some("train")),
        ("utils/fmt.py", Some("train")),
        ("utils/__init__.py", Some("train")),
        ("sub/run.py", Some("sub")),
        ("sub/helper.py", Some("sub")),
        ("sub/run.sh", Some("sub")),
        ("decoy.py", None),
        ("run.sh", None),
    ] {
        edit_and_run(&p, file, node);
    }
}

//! SIGKILL at any moment leaves nothing half-published; two runs on one
//! workspace never execute the same node twice.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{nodes_with, stdout, Project};

/// A chain of five slow nodes; each appends its id to `executions.log` when it starts.
fn slow_chain(p: &Project) {
    let mut yaml = String::from("name: slow\nnodes:\n");
    for i in 0..5 {
        let dep = if i == 0 { String::new() } else { format!(", deps: [out{}.txt]", i - 1) };
        let input = if i == 0 { "echo seed".to_string() } else { format!("cat out{}.txt", i - 1) };
        yaml.push_str(&format!(
            "  n{i}:\n    op: shell\n    params: {{cmd: \"echo n{i} >> executions.log; sleep 0.15; ({input}; echo step{i}) > out{i}.txt\"{dep}, outs: [out{i}.txt]}}\n"
        ));
    }
    p.write("spec.yaml", &yaml);
}

fn expected_last() -> String {
    let mut s = String::from("seed\n");
    for i in 0..5 {
        s.push_str(&format!("step{i}\n"));
    }
    s
}

#[test]
fn sigkill_at_any_moment_then_rerun_completes_with_nothing_corrupted() {
    for delay_ms in [20u64, 90, 170, 260, 400, 620] {
        let p = Project::new();
        slow_chain(&p);
        let mut child = p.cmd(&["run", "--quiet", "spec.yaml"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        // The next run needs no unlock and completes from the nodes that finished.
        let ev = p.run_json(&["spec.yaml"], 0);
        assert_eq!(nodes_with(&ev, "node_failed"), Vec::<String>::new(), "after kill at {delay_ms} ms");
        assert_eq!(p.read("out4.txt"), expected_last(), "after kill at {delay_ms} ms");
        // Every cached object hashes to its recorded hash.
        let verify = p.run(&["verify"]);
        assert_eq!(verify.status.code(), Some(0), "verify after kill at {delay_ms} ms: {}", stdout(&verify));
        // No staging is left behind once a run has cleaned up after the killed one.
        let leftovers: Vec<_> = std::fs::read_dir(p.path().join(".orchestrate/tmp")).unwrap().collect();
        assert!(leftovers.is_empty(), "staging left after kill at {delay_ms} ms: {leftovers:?}");
        // Nodes that completed before the kill were not executed again.
        let log = p.read("executions.log");
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for line in log.lines() {
            *counts.entry(line).or_default() += 1;
        }
        for hit in nodes_with(&ev, "cache_hit") {
            assert_eq!(counts.get(hit.as_str()), Some(&1), "{hit} was cached yet executed again: {log}");
        }
        let again = p.run_json(&["spec.yaml"], 0);
        assert_eq!(nodes_with(&again, "cache_hit").len(), 5);
    }
}

#[test]
fn two_concurrent_runs_never_execute_a_node_twice() {
    for _ in 0..3 {
        let p = Project::new();
        slow_chain(&p);
        let spawn = || {
            p.cmd(&["run", "--json", "spec.yaml"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        for out in [&a, &b] {
            assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(out), common::stderr(out));
        }
        let log = p.read("executions.log");
        let mut lines: Vec<&str> = log.lines().collect();
        lines.sort_unstable();
        assert_eq!(lines, ["n0", "n1", "n2", "n3", "n4"], "each node executed exactly once");
        // Between them every node resolved, and the one that waited said so.
        let (ea, eb) = (common::events(&a), common::events(&b));
        let ran = nodes_with(&ea, "node_finished").len() + nodes_with(&eb, "node_finished").len();
        assert_eq!(ran, 5);
        let waited = ea.iter().chain(&eb).filter(|e| e["event"] == "waiting").count();
        assert!(waited >= 1, "the second run waits for the node the first holds");
        let reason =
            ea.iter().chain(&eb).find(|e| e["event"] == "waiting").unwrap()["reason"].as_str().unwrap().to_string();
        assert!(reason.contains("another orchestrate process is running node"), "{reason}");
        assert_eq!(p.read("out4.txt"), expected_last());
    }
}

#[test]
fn dry_run_changes_nothing() {
    let p = Project::new();
    slow_chain(&p);
    // No workspace yet: none is created.
    let out = p.run(&["run", "--dry-run", "spec.yaml"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("n0"));
    assert!(!p.path().join(".orchestrate").exists());
    assert!(!p.path().join("out0.txt").exists());

    // With a workspace: its files are byte-identical afterwards.
    p.run_json(&["spec.yaml"], 0);
    p.write("spec.yaml", &p.read("spec.yaml").replace("step3", "STEP3"));
    let snapshot = |p: &Project| {
        let mut files = BTreeMap::new();
        let mut stack = vec![p.path().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    files.insert(e.path(), blake3::hash(&std::fs::read(e.path()).unwrap()).to_hex().to_string());
                }
            }
        }
        files
    };
    let before = snapshot(&p);
    let out = p.run(&["run", "--dry-run", "spec.yaml"]);
    let text = stdout(&out);
    assert!(text.contains("params.cmd"), "{text}");
    assert!(text.contains("pending"), "{text}");
    let after = snapshot(&p);
    // SQLite may create its empty -wal/-shm bookkeeping files to read a WAL
    // database; the database file and its logical content must not change.
    let bookkeeping = |k: &std::path::PathBuf| {
        let name = k.file_name().unwrap().to_string_lossy().into_owned();
        name.ends_with("-shm") || name.ends_with("-wal")
    };
    let changed: Vec<_> =
        before.keys().chain(after.keys()).filter(|k| !bookkeeping(k) && before.get(*k) != after.get(*k)).collect();
    assert!(changed.is_empty(), "--dry-run changed {changed:?}");
    let wal = p.path().join(".orchestrate/cache.sqlite-wal");
    assert!(!wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0, "--dry-run wrote to the WAL");
}

#[test]
fn a_damaged_index_is_said_once_with_how_to_recover_and_the_advice_works() {
    let p = Project::new();
    p.write("spec.yaml", common::CHAIN);
    assert_eq!(p.run(&["run", "spec.yaml"]).status.code(), Some(0));
    // Checkpoint the WAL into the file, then cut the file in half.
    assert_eq!(p.run(&["status"]).status.code(), Some(0));
    let index = p.path().join(".orchestrate/cache.sqlite");
    for side in ["cache.sqlite-wal", "cache.sqlite-shm"] {
        let _ = std::fs::remove_file(p.path().join(".orchestrate").join(side));
    }
    let len = std::fs::metadata(&index).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&index).unwrap().set_len(len / 2).unwrap();

    let out = p.run(&["run", "spec.yaml"]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is damaged") && err.contains(&index.display().to_string()), "{err}");
    assert_eq!(err.matches("malformed").count(), 1, "said once: {err}");
    assert!(err.contains(&format!("mv {} {}.damaged", index.display(), index.display())), "{err}");

    // Following the advice: a new index, every node runs again, the outputs are the same.
    std::fs::rename(&index, index.with_extension("sqlite.damaged")).unwrap();
    assert_eq!(p.run(&["run", "spec.yaml"]).status.code(), Some(0));
    assert_eq!(p.read("c.txt"), "ALPHA\nALPHA\n");
}

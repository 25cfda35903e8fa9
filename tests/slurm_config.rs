//! The Slurm executor's configuration, without a cluster: spec fields, keys
//! under Slurm resources, and the errors given before anything is submitted.

mod common;

use common::{stderr, stdout, tiny_spec, Project};
use serde_json::Value;

fn plan_key(p: &Project, node: &str, extra: &[&str]) -> String {
    let mut args = vec!["plan", "--json", "s.yaml"];
    args.extend_from_slice(extra);
    let out = p.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["node"] == node)
        .and_then(|e| e["key"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no key for {node} in\n{}", stdout(&out)))
}

#[test]
fn gpus_decide_the_keyed_device_of_numerical_nodes_only() {
    let p = Project::new();
    // Run the data and tokenizer nodes, so that the model node's inputs are known.
    let full = tiny_spec("slurm-keys", "");
    p.write("s.yaml", full.split("  base:").next().unwrap());
    let out = p.run(&["run", "-q", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    p.write("s.yaml", &full);
    let env = p.run(&["env"]);
    assert!(stdout(&env).contains("cpu"), "this test expects a CPU machine: {}", stdout(&env));

    // Without GPUs a Slurm job is keyed on cpu, like a local run on this CPU machine.
    let local = plan_key(&p, "base", &[]);
    let slurm_cpu = plan_key(&p, "base", &["--executor", "slurm"]);
    assert_eq!(local, slurm_cpu);
    // With GPUs it is keyed on cuda: a different key, so no CPU result is reused.
    let slurm_gpu = plan_key(&p, "base", &["--executor", "slurm", "--gpus", "1"]);
    assert_ne!(slurm_gpu, slurm_cpu);
    // A node's own `resources` do the same, and the spec can say `executor: slurm`.
    let text = tiny_spec("slurm-keys", "    resources: {gpus: 2, partition: gpu}\n");
    p.write("s.yaml", &format!("executor: slurm\n{text}"));
    assert_eq!(plan_key(&p, "base", &[]), slurm_gpu);
    // Other resources are not keyed; neither are non-numerical nodes.
    assert_eq!(plan_key(&p, "base", &["--partition", "other", "--time", "9:00:00"]), slurm_gpu);
    let tok_local = plan_key(&p, "tokenizer", &["--executor", "local"]);
    assert_eq!(plan_key(&p, "tokenizer", &["--gpus", "4"]), tok_local);
}

#[test]
fn bad_executor_settings_are_rejected_before_submitting() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: x\nexecutor: slurm\nslurm: {gpus: two}\nnodes:\n  a: {op: shell, params: {cmd: 'true'}}\n",
    );
    let out = p.run(&["validate", "s.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("s.yaml:3") && err.contains("slurm.gpus"), "{err}");

    p.write("s.yaml", "name: x\nexecutor: cluster\nnodes:\n  a: {op: shell, params: {cmd: 'true'}}\n");
    let out = p.run(&["validate", "s.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("executor"), "{}", stderr(&out));

    p.write("s.yaml", "name: x\nexecutor: slurm\nnodes:\n  a: {op: shell, params: {cmd: 'true'}, resources: {sbatch: ['qos=high']}}\n");
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("node 'a': sbatch line 'qos=high' is not an sbatch option"), "{}", stderr(&out));
    assert!(!p.path().join(".orchestrate/slurm").exists(), "something was written before the error");

    p.write("s.yaml", "name: x\nexecutor: slurm\nnodes:\n  a: {op: shell, params: {cmd: 'true'}}\n");
    let out = p.run(&["run", "s.yaml", "--partition", "two words"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("resources.partition 'two words' must be one word"), "{}", stderr(&out));
}

#[test]
fn exec_node_without_a_ticket_says_what_to_check() {
    let p = Project::new();
    let out = p.run(&["exec-node", ".orchestrate", "0123abcd"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("no ticket for key 0123abcd"), "{err}");
    assert!(err.contains("shares with the coordinator"), "{err}");
}

/// The SQLite header's read/write versions (bytes 18, 19): 2 in WAL mode, 1 with the rollback journal.
fn header_versions(p: &Project) -> (u8, u8) {
    let bytes = std::fs::read(p.path().join(".orchestrate/cache.sqlite")).unwrap();
    (bytes[18], bytes[19])
}

#[test]
fn the_index_uses_the_rollback_journal_where_wal_cannot_work() {
    // Local disk: WAL. A network filesystem is detected with statfs; the same
    // choice can be forced, which is how it is tested here.
    let p = Project::new();
    p.write("s.yaml", common::CHAIN);
    let out = p.run(&["run", "-q", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(header_versions(&p), (2, 2));

    let q = Project::new();
    q.write("s.yaml", common::CHAIN);
    let out = q.cmd(&["run", "-q", "-j", "4", "s.yaml"]).env("ORCHESTRATE_SQLITE_JOURNAL", "delete").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(header_versions(&q), (1, 1));
    assert!(!q.path().join(".orchestrate/cache.sqlite-wal").exists());
    // The cache works the same: a re-run is all hits.
    let out = q.cmd(&["run", "--json", "s.yaml"]).env("ORCHESTRATE_SQLITE_JOURNAL", "delete").output().unwrap();
    assert_eq!(common::nodes_with(&common::events(&out), "cache_hit").len(), 4);

    let out = q.cmd(&["run", "s.yaml"]).env("ORCHESTRATE_SQLITE_JOURNAL", "memory").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("ORCHESTRATE_SQLITE_JOURNAL=memory: expected wal or delete"), "{}", stderr(&out));
}

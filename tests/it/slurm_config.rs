//! The Slurm executor's configuration, without a cluster: spec fields, keys
//! under Slurm resources, and the errors given before anything is submitted.

use crate::common;

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
    let key = "0123abcd".repeat(8);
    let out = p.run(&["exec-node", ".orchestrate", &key]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains(&format!("no ticket for key {key}")), "{err}");
    assert!(err.contains("shares with the coordinator"), "{err}");
}

#[test]
fn exec_node_refuses_what_is_not_a_key_before_touching_the_workspace() {
    let p = Project::new();
    for bad in ["0123abcd", "../../../../etc/passwd", &"A".repeat(64)] {
        let out = p.run(&["exec-node", ".orchestrate", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = stderr(&out);
        assert!(err.contains(&format!("'{bad}' is not a node key (64 lowercase hex digits)")), "{err}");
    }
    assert!(!p.path().join(".orchestrate").exists(), "nothing was created for a refused key");
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

/// A stand-in `sbatch` that accepts every script (job 42), and `squeue`,
/// `scontrol` and `sacct` that know no jobs: enough for the coordinator to
/// write a ticket, without a cluster.
fn fake_slurm(p: &Project) -> String {
    let bin = p.path().join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, body) in [
        ("sbatch", "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'slurm 0'; exit 0; }\necho \"$2\" >> \"$(dirname \"$0\")/submitted\"\necho 42\n"),
        ("squeue", "#!/bin/sh\n[ \"$1\" = --version ] && echo 'slurm 0'\nexit 0\n"),
        ("scancel", "#!/bin/sh\n[ \"$1\" = --version ] && echo 'slurm 0'\nexit 0\n"),
        ("scontrol", "#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"),
        ("sacct", "#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n"),
    ] {
        let path = bin.join(name);
        std::fs::write(&path, body).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    format!("{}:/usr/bin:/bin", bin.display())
}

#[test]
fn exec_node_runs_a_ticket_by_hand_and_refuses_one_whose_spec_changed() {
    let p = Project::new();
    let spec = "name: x\nexecutor: slurm\nnodes:\n  a: {op: shell, params: {cmd: 'echo one > a.txt', outs: [a.txt]}}\n";
    p.write("s.yaml", spec);
    let path = fake_slurm(&p);
    // The fake job never runs and leaves the queue at once: the node fails, saying so.
    let out = p.cmd(&["run", "s.yaml"]).env("PATH", &path).env("ORCHESTRATE_SLURM_POLL", "0.1").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("Slurm job 42 ended UNKNOWN"), "{text}");
    assert!(text.contains("no job log at"), "{text}");
    let script = p.read("fake-bin/submitted");
    let key = script.trim().rsplit('/').next().unwrap().trim_end_matches(".sh").to_string();
    assert!(p
        .read(&format!(".orchestrate/slurm/jobs/{key}.sh"))
        .contains(&format!("exec-node '{}' {key}", p.path().join(".orchestrate").display())));

    // The spec changed after submission: the job must not run the new node under the old key.
    p.write("s.yaml", &spec.replace("echo one", "echo two"));
    let out = p.run(&["exec-node", ".orchestrate", &key]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("changed after submission"), "{}", stderr(&out));
    assert!(!p.path().join("a.txt").exists());

    // As submitted, it runs by hand, records its result, and the coordinator's next run finds it cached.
    p.write("s.yaml", spec);
    let out = p.run(&["exec-node", ".orchestrate", &key]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(p.read("a.txt").trim(), "one");
    let result: Value =
        serde_json::from_str(&p.read(&format!(".orchestrate/slurm/results/{key}-manual.json"))).unwrap();
    assert_eq!(result["outcome"], "ran");
    let out = p.cmd(&["run", "--json", "s.yaml"]).env("PATH", &path).output().unwrap();
    assert_eq!(common::nodes_with(&common::events(&out), "cache_hit"), ["a"]);
}

//! A GRPO node's rollouts (the token ids, behavior log-probs and masks the
//! optimizer consumed) are one of its declared outputs, `rollouts`: the cache
//! row names them, so `gc` keeps them, `push` sends them and a pack carries
//! them, and `orchestrate events` checks the guard log against them.
//!
//! Before, the worker published each rollout into the object store itself:
//! no cache row named those objects, so `gc` removed every token the guard
//! log said was generated and nothing noticed.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{stderr, stdout, Project};
use orchestrate_core::guard::rollouts;

fn spec() -> String {
    common::tiny_spec(
        "rollouts",
        "  grpo:
    op: train.grpo
    inputs: {model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train'}
    params: {iterations: 2, prompts_per_iteration: 2, group_size: 2, max_new_tokens: 6, lr: 1.0e-4}
",
    )
}

fn output_path(p: &Project, output: &str) -> PathBuf {
    let out = p.run(&["path", "spec.yaml", output]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    PathBuf::from(stdout(&out).trim())
}

/// Every artifact hash the guard log's generation events list, by iteration.
fn generated(p: &Project) -> Vec<(usize, Vec<String>)> {
    let out = p.run(&["events", "--json", "--type", "generation"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            let artifacts = e["payload"]["artifacts"].as_array().expect("a generation lists its artifacts");
            (
                e["iteration"].as_u64().unwrap() as usize,
                artifacts.iter().map(|a| a.as_str().unwrap().to_string()).collect(),
            )
        })
        .collect()
}

/// The blake3 of each line of a rollouts file, computed here.
fn line_hashes(dir: &Path, iteration: usize) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(rollouts::file_name(iteration))).unwrap();
    text.lines().map(|l| blake3::hash(l.as_bytes()).to_hex().to_string()).collect()
}

#[test]
fn the_rollouts_a_grpo_node_trained_on_are_its_output_and_survive_gc() {
    let p = Project::new();
    p.write("spec.yaml", &spec());
    p.run_json(&["spec.yaml"], 0);
    let dir = output_path(&p, "grpo:rollouts");
    assert!(dir.is_dir(), "{}", dir.display());
    let names: BTreeSet<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, BTreeSet::from([rollouts::file_name(0), rollouts::file_name(1)]));

    // Each line's own hash is what the sealed log says was generated, in order.
    let log = generated(&p);
    assert_eq!(log.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 1], "{log:?}");
    for (iteration, artifacts) in &log {
        assert_eq!(artifacts.len(), 4, "2 prompts × 2");
        assert_eq!(&line_hashes(&dir, *iteration), artifacts, "iteration {iteration}");
    }
    // And each reads back as the shared type.
    let read = rollouts::read_iteration(&dir, 1).unwrap();
    assert_eq!(read.iter().map(|(h, _)| h.clone()).collect::<Vec<_>>(), log[1].1);
    assert!(read.iter().all(|(_, a)| a.mask_len == a.response_ids.len() && !a.old_logprobs.is_empty()));

    // gc with the spec kept removes nothing the run needs: the tokens stay.
    let gc = p.run(&["gc", "spec.yaml"]);
    assert_eq!(gc.status.code(), Some(0), "{}", stderr(&gc));
    assert_eq!(line_hashes(&dir, 0), log[0].1, "gc removed the rollouts");
    let events = p.run(&["events"]);
    assert_eq!(events.status.code(), Some(0), "{}", stderr(&events));

    // A pack carries them by default (evidence, not a model folder), and verifies.
    let freeze = p.run(&["pack", "freeze", "spec.yaml", "--out", "pack"]);
    assert_eq!(freeze.status.code(), Some(0), "{}", stderr(&freeze));
    let packed = p.path().join("pack/outputs/grpo/rollouts");
    for (iteration, artifacts) in &log {
        assert_eq!(&line_hashes(&packed, *iteration), artifacts, "the pack's iteration {iteration}");
    }
    assert!(!p.path().join("pack/outputs/grpo/model").exists(), "a model folder needs --with-models");
    // And the lineage's sealed guard log, whose generations are those rollouts.
    let manifest = orchestrate_core::pack::manifest::Manifest::read(&p.path().join("pack")).unwrap();
    assert_eq!(manifest.guard.len(), 1, "{:?}", manifest.guard);
    let chain = &manifest.guard[0];
    assert_eq!(chain.nodes, vec!["grpo".to_string()]);
    let logged = p.read(&format!("pack/{}", chain.file));
    assert_eq!(logged.lines().count(), chain.events);
    assert_eq!(logged.matches("\"kind\":\"generation\"").count(), 2, "{logged}");
    let verify = p.run(&["pack", "verify", "pack"]);
    assert_eq!(verify.status.code(), Some(0), "{}{}", stdout(&verify), stderr(&verify));

    // A rollout edited in the pack, its line in SHA256SUMS rewritten to match:
    // the folder no longer has the content hash the manifest recorded.
    // (Before, a folder was checked only through SHA256SUMS, which the editor rewrote.)
    let edited = packed.join(rollouts::file_name(0));
    let text = std::fs::read_to_string(&edited).unwrap().replacen("\"mask_len\":", "\"mask_len\": ", 1);
    std::fs::write(&edited, &text).unwrap();
    let sums = p.read("pack/SHA256SUMS");
    let rel = format!("outputs/grpo/rollouts/{}", rollouts::file_name(0));
    let digest = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()));
    let sums: String = sums
        .lines()
        .map(|l| if l.ends_with(&format!("  {rel}")) { format!("{digest}  {rel}\n") } else { format!("{l}\n") })
        .collect();
    std::fs::write(p.path().join("pack/SHA256SUMS"), sums).unwrap();
    let verify = p.run(&["pack", "verify", "pack"]);
    assert_eq!(verify.status.code(), Some(1), "{}{}", stdout(&verify), stderr(&verify));
    let said = format!("{}{}", stdout(&verify), stderr(&verify));
    assert!(said.contains("outputs/grpo/rollouts") && said.contains("content hash"), "{said}");
}

/// The pack's guard log is audited from the pack alone: a decision edited in
/// it breaks its seal, and the audit fails naming the log.
#[test]
fn a_packs_guard_log_is_verified_from_the_pack_alone() {
    let p = Project::new();
    p.write("spec.yaml", &spec());
    p.run_json(&["spec.yaml"], 0);
    let freeze = p.run(&["pack", "freeze", "spec.yaml", "--out", "pack"]);
    assert_eq!(freeze.status.code(), Some(0), "{}", stderr(&freeze));
    let manifest = orchestrate_core::pack::manifest::Manifest::read(&p.path().join("pack")).unwrap();
    let file = p.path().join("pack").join(&manifest.guard[0].file);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\\\"decision\\\":\\\"allow\\\""), "{text}");
    std::fs::write(&file, text.replacen("\\\"decision\\\":\\\"allow\\\"", "\\\"decision\\\":\\\"reject\\\"", 1))
        .unwrap();
    let verify = p.run(&["pack", "verify", "pack"]);
    assert_eq!(verify.status.code(), Some(1), "{}{}", stdout(&verify), stderr(&verify));
    let said = format!("{}{}", stdout(&verify), stderr(&verify));
    assert!(said.contains("guard log of lineage") && said.contains("was edited"), "{said}");

    // A GRPO node whose guard log the workspace does not hold (as one taken
    // from a remote cache) is refused at freeze: a pack never claims a guard
    // it cannot show.
    for f in ["guard.sqlite", "guard.sqlite-wal", "guard.sqlite-shm"] {
        let _ = std::fs::remove_file(p.path().join(".orchestrate").join(f));
    }
    let refused = p.run(&["pack", "freeze", "spec.yaml", "--out", "pack2"]);
    assert_ne!(refused.status.code(), Some(0));
    let e = stderr(&refused);
    assert!(e.contains("'grpo'") && e.contains("guard log") && e.contains("--force grpo"), "{e}");
    assert!(!p.path().join("pack2").exists(), "nothing half-written");
}

/// The guard log is checked against the node's rollouts: a generation whose
/// tokens the store no longer holds is an error naming the node and the
/// iteration, not a log shown as if its evidence were there.
#[test]
fn events_refuse_a_guard_log_whose_rollouts_are_gone() {
    use std::os::unix::fs::PermissionsExt;
    let p = Project::new();
    p.write("spec.yaml", &spec());
    p.run_json(&["spec.yaml"], 0);
    let dir = output_path(&p, "grpo:rollouts");
    let file = dir.join(rollouts::file_name(1));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(&file).unwrap();
    let out = p.run(&["events"]);
    assert_eq!(out.status.code(), Some(2), "{}{}", stdout(&out), stderr(&out));
    let e = stderr(&out);
    assert!(e.contains("grpo") && e.contains("iteration 1") && e.contains("rollouts"), "{e}");
}

//! Gates, frozen packs, verify and audit: from the pack alone, with every
//! kind of tampering named.

use crate::common;

use std::path::Path;

use common::{nodes_with, stdout, Project};

const SPEC: &str = r#"
name: packed
nodes:
  measure:
    op: shell
    params: {cmd: "echo '{\"matched\": 3, \"total\": 3, \"score\": 0.7}' > m.json", outs: [m.json]}
  gates:
    op: gate
    params: {file: gates.yaml}
"#;

const GATES: &str = r#"
name: packed
gates:
  - name: fault-matrix-complete
    description: every fault matched
    evidence: {m: 'measure:m.json'}
    check: {field: m.matched, equals_field: m.total}
  - name: score-floor
    evidence: {m: 'measure:m.json'}
    check: {field: m.score, at_least: 0.5}
"#;

fn frozen() -> (Project, std::path::PathBuf) {
    let (p, dir, _) = frozen_saying();
    (p, dir)
}

/// A fresh pack, and what `pack freeze` printed.
fn frozen_saying() -> (Project, std::path::PathBuf, String) {
    let p = Project::new();
    p.write("s.yaml", SPEC);
    p.write("gates.yaml", GATES);
    p.run_json(&["s.yaml"], 0);
    let out = p.run(&["pack", "freeze", "s.yaml", "--out", "packs/v1"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let dir = p.path().join("packs/v1");
    (p, dir, stdout(&out))
}

/// The start of a long output, for an assertion message.
fn head(text: &str) -> String {
    text.chars().take(2000).collect()
}

fn audit(p: &Project, dir: &Path) -> (Option<i32>, String) {
    let out = p.run(&["audit", dir.to_str().unwrap()]);
    (out.status.code(), stdout(&out))
}

#[test]
fn freeze_verify_and_audit_pass_and_sha256sum_accepts_the_pack() {
    let (p, dir) = frozen();
    for f in [
        "MANIFEST.json",
        "SHA256SUMS",
        "events.jsonl",
        "gates/gates/gates.yaml",
        "outputs/measure/m.json",
        "outputs/gates/gates.json",
        "report.html",
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    // The pack's report is sealed with it and shows its gates.
    let sums_text = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    assert!(sums_text.lines().any(|l| l.ends_with("  report.html")));
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_eq!(html.matches(">PASS<").count(), 2, "both gates, passed");
    assert!(!html.contains(&dir.display().to_string()) && !html.contains(".tmp"), "no build path in the report");
    let (code, text) = audit(&p, &dir);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("2 gates: 2 passed, 0 failed; pack intact"), "{text}");
    let sums = std::process::Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&dir)
        .output()
        .expect("sha256sum (coreutils)");
    assert!(sums.status.success(), "{}", String::from_utf8_lossy(&sums.stdout));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("MANIFEST.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "orchestrate-pack/1");
    assert!(manifest["environment"]["orchestrate_version"].is_string());
    assert!(manifest["nodes"].as_array().unwrap().iter().all(|n| n["key"].as_str().unwrap().len() == 64));
}

/// A store object whose bytes no longer hash to its name (edited in place,
/// or rotted on disk, at the same size, so the plan still finds it cached)
/// is refused when a pack is frozen, naming the output. Before, the pack was
/// frozen with the damaged bytes, sealed in SHA256SUMS, beside a manifest
/// naming the object's original blake3.
#[test]
fn a_damaged_store_object_is_never_frozen_into_a_pack() {
    use std::os::unix::fs::PermissionsExt;
    let p = Project::new();
    p.write("s.yaml", SPEC);
    p.write("gates.yaml", GATES);
    p.run_json(&["s.yaml"], 0);
    let object = std::path::PathBuf::from(stdout(&p.run(&["path", "s.yaml", "gates:gates.json"])).trim());
    let text = std::fs::read_to_string(&object).unwrap();
    assert!(text.contains("\"all_passed\": true"), "{text}");
    std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&object, text.replace("\"all_passed\": true", "\"all_passed\": tru3")).unwrap();
    let out = p.run(&["pack", "freeze", "s.yaml", "--out", "packs/v1"]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{}{err}", stdout(&out));
    assert!(err.contains("gates.json") && err.contains("--force gates"), "{err}");
    assert!(!p.path().join("packs/v1").exists(), "a refused freeze left a pack");
    // What it says to do repairs the store, and the freeze then succeeds.
    let out = p.run(&["run", "s.yaml", "--force", "gates"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let out = p.run(&["pack", "freeze", "s.yaml", "--out", "packs/v1"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let out = p.run(&["pack", "verify", "packs/v1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn freezing_into_an_existing_pack_is_refused() {
    let (p, _) = frozen();
    let out = p.run(&["pack", "freeze", "s.yaml", "--out", "packs/v1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(common::stderr(&out).contains("never appended to or overwritten"), "{}", common::stderr(&out));
}

#[test]
fn audit_works_from_a_copy_with_the_workspace_removed() {
    let (p, dir) = frozen();
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("copy");
    let status =
        std::process::Command::new("cp").args(["-r", dir.to_str().unwrap(), copy.to_str().unwrap()]).status().unwrap();
    assert!(status.success());
    std::fs::remove_dir_all(p.path().join(".orchestrate")).unwrap();
    std::fs::remove_file(p.path().join("m.json")).unwrap();
    let (code, text) = audit(&p, &copy);
    assert_eq!(code, Some(0), "{text}");
}

/// Applies a tampering to a fresh pack and returns the audit's exit code and output.
fn tampered(f: impl FnOnce(&Path)) -> (Option<i32>, String) {
    let (p, dir) = frozen();
    f(&dir);
    audit(&p, &dir)
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from} in {}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// What a tampering case does to a pack folder.
type Tamper = Box<dyn FnOnce(&Path)>;

#[test]
fn each_kind_of_tampering_gets_its_own_message() {
    let cases: Vec<(&str, Tamper, &str)> = vec![
        (
            "edited file",
            Box::new(|d: &Path| edit(&d.join("outputs/measure/m.json"), "0.7", "0.9")),
            "checksum mismatch: outputs/measure/m.json was edited after freezing",
        ),
        (
            "removed file",
            Box::new(|d: &Path| std::fs::remove_file(d.join("outputs/measure/m.json")).unwrap()),
            "missing: outputs/measure/m.json is listed in SHA256SUMS",
        ),
        (
            "added file",
            Box::new(|d: &Path| std::fs::write(d.join("outputs/late.json"), "{}").unwrap()),
            "extra: outputs/late.json is in the pack but not in SHA256SUMS",
        ),
        (
            "edited gate definition",
            Box::new(|d: &Path| edit(&d.join("gates/gates/gates.yaml"), "at_least: 0.5", "at_least: 0.1")),
            "gate definition gates/gates/gates.yaml was edited after freezing",
        ),
        (
            "manifest edit",
            Box::new(|d: &Path| edit(&d.join("MANIFEST.json"), "\"packed\"", "\"other\"")),
            "the manifest was edited after freezing",
        ),
        (
            "reordered events",
            Box::new(|d: &Path| {
                let text = std::fs::read_to_string(d.join("events.jsonl")).unwrap();
                let mut lines: Vec<&str> = text.lines().collect();
                lines.swap(1, 2);
                std::fs::write(d.join("events.jsonl"), lines.join("\n") + "\n").unwrap();
            }),
            "events reordered or removed: line 2 holds event 2",
        ),
        (
            "edited event",
            Box::new(|d: &Path| edit(&d.join("events.jsonl"), "\"node_started\"", "\"node_finished\"")),
            "was edited: its seal does not match its content",
        ),
    ];
    for (name, tamper, message) in cases {
        let (code, text) = tampered(tamper);
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(text.contains(message), "{name}: expected «{message}» in:\n{text}");
    }
}

/// Rewrites SHA256SUMS's line for `file` to its current content (what a
/// careless or hostile editor of a pack would do).
fn reseal(dir: &Path, file: &str) {
    let out = std::process::Command::new("sha256sum").arg(file).current_dir(dir).output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let sums: String = sums
        .lines()
        .map(|l| if l.ends_with(&format!("  {file}")) { line.clone() } else { l.to_string() })
        .map(|l| l + "\n")
        .collect();
    std::fs::write(dir.join("SHA256SUMS"), sums).unwrap();
}

#[test]
fn a_manifest_missing_a_field_fails_the_audit_naming_the_file_and_the_field() {
    let (code, text) = tampered(|d: &Path| {
        // The packed output loses its path (resealed, so only the manifest's
        // own shape can tell): it would otherwise be skipped, unchecked.
        let manifest = d.join("MANIFEST.json");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
        let outputs = v["nodes"][0]["outputs"].as_array_mut().unwrap();
        assert!(outputs[0].as_object_mut().unwrap().remove("path").is_some());
        std::fs::write(&manifest, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        reseal(d, "MANIFEST.json");
    });
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("MANIFEST.json") && text.contains("nodes[0].outputs[0]"), "{text}");
    assert!(text.contains("path"), "{text}");
}

#[test]
fn a_symlink_in_a_pack_is_refused_even_with_identical_bytes() {
    let (code, text) = tampered(|d: &Path| {
        // The output replaced by a link to an outside copy of the same bytes:
        // every checksum still matches.
        let output = d.join("outputs/measure/m.json");
        let outside = d.parent().unwrap().join("outside-m.json");
        std::fs::copy(&output, &outside).unwrap();
        std::fs::remove_file(&output).unwrap();
        std::os::unix::fs::symlink(&outside, &output).unwrap();
    });
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("symlink") && text.contains("outputs/measure/m.json"), "{text}");

    // An extra link, listed in SHA256SUMS with its target's sum.
    let (code, text) = tampered(|d: &Path| {
        std::os::unix::fs::symlink("/etc/hostname", d.join("hostname")).unwrap();
        let out = std::process::Command::new("sha256sum").arg("hostname").current_dir(d).output().unwrap();
        let mut sums = std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
        sums.push_str(&String::from_utf8_lossy(&out.stdout));
        std::fs::write(d.join("SHA256SUMS"), sums).unwrap();
    });
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("symlink") && text.contains("hostname"), "{text}");
}

#[test]
fn a_manifest_path_outside_the_pack_is_refused_and_never_opened() {
    let (code, text) = tampered(|d: &Path| {
        // The gate definition moved outside the pack (same content), the
        // manifest pointing at it, SHA256SUMS resealed.
        let outside = d.parent().unwrap().join("outside-gates.yaml");
        std::fs::copy(d.join("gates/gates/gates.yaml"), &outside).unwrap();
        edit(
            &d.join("MANIFEST.json"),
            "\"definition\": \"gates/gates/gates.yaml\"",
            "\"definition\": \"../outside-gates.yaml\"",
        );
        reseal(d, "MANIFEST.json");
    });
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("../outside-gates.yaml") && text.contains("outside the pack"), "{text}");
}

#[test]
fn a_file_listed_twice_in_sha256sums_is_refused() {
    let (code, text) = tampered(|d: &Path| {
        let sums = std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
        let first = sums.lines().next().unwrap().to_string();
        std::fs::write(d.join("SHA256SUMS"), format!("{sums}{first}\n")).unwrap();
    });
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("listed twice"), "{text}");
}

#[test]
fn a_failing_gate_is_reported_as_failed_with_its_evidence_not_as_an_error() {
    let p = Project::new();
    p.write("s.yaml", SPEC);
    p.write("gates.yaml", &GATES.replace("at_least: 0.5", "at_least: 0.8"));
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(1), "a failed gate makes the run exit 1");
    let text = stdout(&out);
    assert!(text.contains("score-floor | FAIL — m.score = 0.7, required ≥ 0.8 | measure:m.json ("), "{text}");
    // The gate node itself succeeded: it recorded a result.
    let ev = p.run_json(&["s.yaml"], 1);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["gates", "measure"]);
    // Editing the criterion re-evaluates the gate and nothing else.
    p.write("gates.yaml", GATES);
    let ev = p.run_json(&["s.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["gates"]);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["measure"]);
    // A pack of a failing gate audits as failed (exit 1), with the gate in the table.
    p.write("gates.yaml", &GATES.replace("at_least: 0.5", "at_least: 0.8"));
    p.run_json(&["s.yaml"], 1);
    assert_eq!(p.run(&["pack", "freeze", "s.yaml", "--out", "packs/failing"]).status.code(), Some(0));
    let (code, text) = audit(&p, &p.path().join("packs/failing"));
    assert_eq!(code, Some(1));
    assert!(text.contains("1 failed; pack intact"), "{text}");
}

#[test]
fn a_gate_with_unknown_evidence_does_not_compile() {
    let p = Project::new();
    p.write("s.yaml", SPEC);
    p.write(
        "gates.yaml",
        &GATES.replace("measure:m.json'}\n    check: {field: m.score", "mesure:m.json'}\n    check: {field: m.score"),
    );
    let out = p.run(&["validate", "s.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(common::stderr(&out).contains("no node 'mesure' (did you mean 'measure'?)"), "{}", common::stderr(&out));
}

#[test]
fn the_committed_example_packs_audit_clean() {
    // Every release stays auditable by every later orchestrate: each folder there
    // (orchestrate-core's every_committed_pack_is_listed pins which ones they are).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts/grpo-main-tiny");
    let mut dirs: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no pack under {}", root.display());
    for dir in dirs {
        let version = dir.file_name().unwrap().to_string_lossy().into_owned();
        let p = Project::new();
        let (code, text) = audit(&p, &dir);
        assert_eq!(code, Some(0), "{version}: {text}");
        assert!(text.contains("6 gates: 6 passed, 0 failed; pack intact"), "{version}: {text}");
    }
}

/// A gate report that cannot be read is a failed check, never "0 gates failed".
#[test]
fn a_run_whose_gate_report_cannot_be_read_fails_naming_the_file() {
    let p = Project::new();
    p.write("s.yaml", SPEC);
    p.write("gates.yaml", GATES);
    p.run_json(&["s.yaml"], 0);
    let out = p.run(&["path", "s.yaml", "gates:gates.json"]);
    let object = std::path::PathBuf::from(stdout(&out).trim());
    // Same size, so the cache still takes it: only reading it can tell.
    let size = std::fs::metadata(&object).unwrap().len() as usize;
    let mut perms = std::fs::metadata(&object).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&object, perms).unwrap();
    std::fs::write(&object, "x".repeat(size)).unwrap();
    let out = p.run(&["run", "s.yaml"]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("gates.json") && err.contains("node 'gates'"), "{err}");
}

/// Before, a pack sealed the events of the spec's latest run, whatever that
/// run computed: after `run s.yaml` and a try with `--set …LR=0.2`, freezing
/// the spec as it stands (LR=0.1) packed the LR=0.1 results with the LR=0.2
/// run's events (its node finished under another key), said "recorded in the
/// events of run" of that run, and `verify` called it intact. A pack now seals
/// the latest run whose events name its results' keys, and `verify` refuses a
/// pack whose events name another key for one of its nodes.
#[test]
fn a_pack_seals_the_events_of_the_run_that_made_its_results_and_verify_refuses_others() {
    let p = Project::new();
    p.write("p.yaml", "name: p\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'echo \"$LR\"', env: {LR: 0.1}}\n");
    let first = p.run_json(&["p.yaml"], 0);
    let run_of = |events: &[serde_json::Value]| events[0]["run_id"].as_str().unwrap().to_string();
    let finished = |events: &[serde_json::Value]| {
        events.iter().find(|e| e["event"] == "node_finished").expect("the node ran")["key"].clone()
    };
    let (first_run, key) = (run_of(&first), finished(&first));
    let other = p.run_json(&["p.yaml", "--set", "nodes.w.params.env.LR=0.2"], 0);
    let other_key = finished(&other);
    assert_ne!(key, other_key);

    let out = p.run(&["pack", "freeze", "p.yaml", "--out", "pk"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    assert!(stdout(&out).contains(&format!("recorded in the events of run {first_run}")), "{}", stdout(&out));
    let sealed = std::fs::read_to_string(p.path().join("pk/events.jsonl")).unwrap();
    let keys: Vec<serde_json::Value> = sealed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["event"]["key"].clone())
        .filter(|k| !k.is_null())
        .collect();
    assert!(!keys.is_empty() && keys.iter().all(|k| *k == key), "packed {key}, sealed events of {keys:?}");

    // A pack given the other run's events (sealed, chained and listed as a
    // careful forger would) is refused, naming the node and both keys.
    let forged = p.run(&["pack", "freeze", "p.yaml", "--set", "nodes.w.params.env.LR=0.2", "--out", "pk2"]);
    assert_eq!(forged.status.code(), Some(0), "{}", common::stderr(&forged));
    let dir = p.path().join("pk");
    std::fs::copy(p.path().join("pk2/events.jsonl"), dir.join("events.jsonl")).unwrap();
    let last_seal = |d: &Path| -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(d.join("MANIFEST.json")).unwrap()).unwrap()
            ["events"]["last_seal"]
            .clone()
    };
    let seal = last_seal(&p.path().join("pk2"));
    reseal(&dir, "events.jsonl");
    set_manifest(&dir, |v| v["events"]["last_seal"] = seal);
    let out = p.run(&["pack", "verify", "pk"]);
    let said = stdout(&out) + &common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let short = |k: &serde_json::Value| k.as_str().unwrap()[..12].to_string();
    assert!(said.contains("node 'w'") && said.contains(&short(&other_key)) && said.contains(&short(&key)), "{said}");
}

/// Before, `report`, `compare` and `export tensorboard` read a pack's files as
/// they found them: a metric edited after freezing (`score` 0.7 → 0.99, not
/// even resealed) was drawn in the report, compared and exported, with exit 0
/// and no word of it, though `pack verify` failed the same pack. What readers
/// show a reviewer is what the pack can prove: each now verifies the pack
/// first and refuses one that does not verify, naming the problem, writing
/// nothing.
#[test]
fn a_pack_that_does_not_verify_is_never_reported_compared_or_exported() {
    let (p, dir) = frozen();
    for resealed in [false, true] {
        let m = dir.join("outputs/measure/m.json");
        std::fs::write(&m, "{\"matched\": 3, \"total\": 3, \"score\": 0.99}\n").unwrap();
        if resealed {
            reseal(&dir, "outputs/measure/m.json");
        }
        let pack = dir.to_str().unwrap();
        for (what, args) in [
            ("report", vec!["report", pack, "--out", "r.html"]),
            ("compare", vec!["compare", pack, pack]),
            ("export", vec!["export", "tensorboard", pack, "tb"]),
        ] {
            let out = p.run(&args);
            let said = stdout(&out) + &common::stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{what} (resealed: {resealed}): {said}");
            assert!(
                said.contains("does not verify") && said.contains("m.json"),
                "{what} (resealed: {resealed}): {said}"
            );
            assert!(!said.contains("0.99"), "{what} showed the edited value: {said}");
        }
        assert!(!p.path().join("r.html").exists() && !p.path().join("tb").exists(), "something was written");
    }
}

/// A later run that failed the very key a pack holds (`run --force w`, which
/// failed this time) does not vouch for that result either: freeze seals the
/// run that made it, not the one that failed it, and `verify` refuses events
/// that say a packed result failed.
#[test]
fn a_pack_never_seals_a_run_in_which_its_result_failed() {
    let p = Project::new();
    p.write(
        "p.yaml",
        "name: p\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'test ! -e ran && touch ran && echo made'}\n",
    );
    let first = p.run_json(&["p.yaml"], 0);
    let first_run = first[0]["run_id"].as_str().unwrap().to_string();
    let failed = p.run_json(&["p.yaml", "--force", "w"], 1);
    assert_eq!(nodes_with(&failed, "node_failed"), ["w"]);
    let out = p.run(&["pack", "freeze", "p.yaml", "--out", "pk"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    assert!(stdout(&out).contains(&format!("recorded in the events of run {first_run}")), "{}", stdout(&out));
    let sealed = std::fs::read_to_string(p.path().join("pk/events.jsonl")).unwrap();
    assert!(!sealed.contains("node_failed"), "{sealed}");
    let verified = p.run(&["pack", "verify", "pk"]);
    assert_eq!(verified.status.code(), Some(0), "{}", stdout(&verified));
}

/// Sets a manifest field with serde_json and reseals SHA256SUMS, so only the
/// manifest's own consistency can tell.
fn set_manifest(d: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let manifest = d.join("MANIFEST.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&manifest, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    reseal(d, "MANIFEST.json");
}

#[test]
fn an_ill_typed_manifest_fails_the_audit_naming_the_field() {
    for (field, value) in [("nodes", serde_json::json!("oops")), ("gates", serde_json::json!(42))] {
        let (code, text) = tampered(|d: &Path| set_manifest(d, |v| v[field] = value.clone()));
        assert_eq!(code, Some(1), "{field}: {text}");
        assert!(text.contains("MANIFEST.json") && text.contains(field), "{field}: {text}");
    }
    // An unknown format version is refused, not read as this one.
    let (code, text) = tampered(|d: &Path| set_manifest(d, |v| v["format"] = "orchestrate-pack/9".into()));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("orchestrate-pack/9") && text.contains("orchestrate-pack/1"), "{text}");
}

#[test]
fn a_pack_holding_gate_definitions_with_an_emptied_gate_list_is_refused() {
    // Everything resealed: the gates would simply not be evaluated ("0 gates, pack intact").
    let (code, text) = tampered(|d: &Path| set_manifest(d, |v| v["gates"] = serde_json::json!([])));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("gates/gates/gates.yaml") && text.contains("no gate of the manifest"), "{text}");
    // The gate node is still among the manifest's nodes: its gate entry went missing.
    assert!(text.contains("gate node 'gates'"), "{text}");
}

#[test]
fn files_listed_in_sha256sums_but_not_in_the_manifest_are_refused_with_a_bounded_report() {
    const EXTRA: usize = 100_000;
    let (code, text) = tampered(|d: &Path| {
        let extra = d.join("outputs/extra");
        std::fs::create_dir_all(&extra).unwrap();
        std::fs::write(extra.join("0"), "x").unwrap();
        let out = std::process::Command::new("sha256sum").arg("outputs/extra/0").current_dir(d).output().unwrap();
        let hash = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string();
        let mut sums = std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
        for i in 0..EXTRA {
            if i > 0 {
                std::fs::write(extra.join(i.to_string()), "x").unwrap();
            }
            sums.push_str(&format!("{hash}  outputs/extra/{i}\n"));
        }
        std::fs::write(d.join("SHA256SUMS"), sums).unwrap();
    });
    assert_eq!(code, Some(1), "{}", head(&text));
    assert!(text.contains("outputs/extra/") && text.contains("not named by the manifest"), "{}", head(&text));
    assert!(text.contains(&format!("{EXTRA} problems")), "the total is said: {}", head(&text));
    assert!(text.lines().count() < 60, "a summary, not one line per file: {} lines", text.lines().count());
}

fn root_digest(freeze_stdout: &str) -> String {
    let line = freeze_stdout.lines().find(|l| l.starts_with("root digest")).expect("freeze prints the root digest");
    let digest = line.split_whitespace().nth(2).unwrap().to_string();
    assert!(digest.starts_with("sha256:") && digest.len() == 7 + 64, "{line}");
    digest
}

#[test]
fn the_root_digest_is_printed_recorded_and_checked_by_audit_expect() {
    let (p, dir, said) = frozen_saying();
    let digest = root_digest(&said);
    // It is the SHA-256 of SHA256SUMS, so `sha256sum SHA256SUMS` tells it too.
    let sums = std::process::Command::new("sha256sum").arg("SHA256SUMS").current_dir(&dir).output().unwrap();
    assert!(String::from_utf8_lossy(&sums.stdout).starts_with(&digest["sha256:".len()..]));
    // Recorded in the run's events.
    let events = p.run(&["events", "--type", "pack_frozen", "--json"]);
    let text = stdout(&events);
    assert!(text.contains(&digest) && text.contains("packs/v1"), "{text}");

    let d = dir.to_str().unwrap();
    let ok = p.run(&["audit", d, "--expect", &digest]);
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
    assert!(stdout(&ok).contains(&format!("root {digest} (as expected)")), "{}", stdout(&ok));
    // The bare hex is accepted too.
    assert_eq!(p.run(&["audit", d, "--expect", &digest["sha256:".len()..]]).status.code(), Some(0));

    // Anyone can edit a pack and recompute SHA256SUMS: every check passes, but the root differs.
    // Here the pack's own report is rewritten to show a better score.
    edit(&dir.join("report.html"), "pack packed", "pack packed (all results improved)");
    reseal(&dir, "report.html");
    let (code, text) = audit(&p, &dir);
    assert_eq!(code, Some(0), "resealed consistently, the pack alone cannot tell: {text}");
    let bad = p.run(&["audit", d, "--expect", &digest]);
    assert_eq!(bad.status.code(), Some(1), "{}", stdout(&bad));
    assert!(stdout(&bad).contains("root digest") && stdout(&bad).contains(&digest), "{}", stdout(&bad));
    // A malformed digest is a usage error.
    let malformed = p.run(&["audit", d, "--expect", "sha256:xyz"]);
    assert_eq!(malformed.status.code(), Some(2));
    assert!(common::stderr(&malformed).contains("--expect"), "{}", common::stderr(&malformed));
}

#[test]
fn a_gate_definition_with_too_many_gates_is_refused_not_printed_row_by_row() {
    let (code, text) = tampered(|d: &Path| {
        let path = d.join("gates/gates/gates.yaml");
        let mut yaml = std::fs::read_to_string(&path).unwrap();
        for i in 0..5000 {
            yaml.push_str(&format!(
                "  - name: extra-{i}\n    evidence: {{m: 'measure:m.json'}}\n    check: {{field: m.score, at_least: 0.5}}\n"
            ));
        }
        std::fs::write(&path, yaml).unwrap();
        reseal(d, "gates/gates/gates.yaml");
    });
    assert_eq!(code, Some(1), "{}", head(&text));
    assert!(text.contains("5002 gates, over the limit"), "{}", head(&text));
    assert!(text.lines().count() < 60, "{} lines", text.lines().count());
}

/// Every regular file under a folder, relative, sorted.
fn files_of(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

fn copy_dir(from: &Path, to: &Path) {
    for rel in files_of(from) {
        let target = to.join(&rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(from.join(&rel), target).unwrap();
    }
}

/// `model_signing verify key DIR` (the OpenSSF package, installed in the venv
/// by scripts/setup.sh for tests): exit code and output.
fn model_signing_verify(dir: &Path, public_key: &Path) -> (Option<i32>, String) {
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let out = std::process::Command::new(python)
        .args(["-m", "model_signing", "verify", "key"])
        .arg(dir)
        .arg("--signature")
        .arg(dir.join("model.sig"))
        .arg("--public_key")
        .arg(public_key)
        .output()
        .unwrap();
    (out.status.code(), format!("{}{}", stdout(&out), common::stderr(&out)))
}

/// (Issue #34.) `pack sign` writes an OpenSSF model-signing bundle that the
/// real `model_signing verify key` accepts, and `audit --key` too; a one-byte
/// change to any file of the pack, an added file, another key's signature or
/// no signature fails both (or ours). The statement records the provenance.
#[test]
fn a_signed_pack_verifies_with_model_signing_and_audit_and_any_edit_fails_both() {
    let (p, dir) = frozen();
    let config = tempfile::tempdir().unwrap();
    let key_cmd = |args: &[&str]| {
        let out = p.cmd(args).env("ORCHESTRATE_CONFIG_DIR", config.path()).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", common::stderr(&out));
        stdout(&out)
    };
    key_cmd(&["key", "generate", "alice"]);
    key_cmd(&["key", "generate", "bob"]);
    let alice_pub = config.path().join("keys/alice.pub");
    let audit_with = |dir: &Path, key: &str| {
        let out = p
            .cmd(&["audit", dir.to_str().unwrap(), "--key", key])
            .env("ORCHESTRATE_CONFIG_DIR", config.path())
            .output()
            .unwrap();
        (out.status.code(), format!("{}{}", stdout(&out), common::stderr(&out)))
    };
    // Unsigned: refused when a key is asked for.
    let (code, text) = audit_with(&dir, "alice");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("unsigned: the pack has no model.sig"), "{text}");

    assert!(key_cmd(&["pack", "sign", dir.to_str().unwrap(), "--key", "alice"]).contains("signed"));
    let again = p
        .cmd(&["pack", "sign", dir.to_str().unwrap(), "--key", "alice"])
        .env("ORCHESTRATE_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2), "a signature is never replaced");
    let (code, text) = audit_with(&dir, "alice");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("signed by key 'alice'") && text.contains("pack intact"), "{text}");
    // The ecosystem's verifier, and our pack verify, accept it; another key does not.
    let (code, text) = model_signing_verify(&dir, &alice_pub);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("Verification succeeded"), "{text}");
    let out = p.run(&["pack", "verify", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "model.sig is the pack's own: {}", common::stderr(&out));
    let (code, text) = audit_with(&dir, "bob");
    assert_eq!(code, Some(1));
    assert!(text.contains("signed by another key than 'bob'"), "{text}");
    let (code, _) = model_signing_verify(&dir, &config.path().join("keys/bob.pub"));
    assert_eq!(code, Some(1));

    // The statement carries the provenance: every node's key, the resolved spec, the environment.
    let python = std::env::var("ORCHESTRATE_PYTHON").unwrap();
    let out = std::process::Command::new(python)
        .args(["-c", "import base64,json,sys; b=json.load(open(sys.argv[1])); s=json.loads(base64.b64decode(b['dsseEnvelope']['payload'])); p=s['predicate']['orchestrate_provenance']; print(json.dumps({'nodes': [n['id'] for n in p['nodes']], 'keys': all(len(n['key']) == 64 for n in p['nodes']), 'spec': p['spec']['name'], 'env': sorted(p['environment']), 'files': len(s['predicate']['resources'])}))"])
        .arg(dir.join("model.sig"))
        .output()
        .unwrap();
    let prov: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::stderr(&out)));
    assert_eq!(prov["nodes"], serde_json::json!(["measure", "gates"]), "in the manifest's order: {prov}");
    assert_eq!((prov["keys"].as_bool(), prov["spec"].as_str()), (Some(true), Some("packed")), "{prov}");
    assert!(prov["env"].as_array().unwrap().iter().any(|k| k == "git_commit"), "{prov}");
    let signed = files_of(&dir).into_iter().filter(|f| f != "model.sig").collect::<Vec<_>>();
    assert_eq!(prov["files"].as_u64(), Some(signed.len() as u64));

    // One byte changed in any file, or a file added: both verifiers refuse.
    let scratch = tempfile::tempdir().unwrap();
    let mut cases: Vec<(String, Tamper)> = signed
        .iter()
        .map(|f| {
            let what = format!("one byte of {f}");
            let f = f.clone();
            let edit: Tamper = Box::new(move |d: &Path| {
                let path = d.join(&f);
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[0] ^= 1;
                std::fs::write(&path, bytes).unwrap();
            });
            (what, edit)
        })
        .collect();
    cases
        .push(("an added file".into(), Box::new(|d: &Path| std::fs::write(d.join("outputs/extra.txt"), "x").unwrap())));
    for (i, (what, edit)) in cases.into_iter().enumerate() {
        let copy = scratch.path().join(format!("case-{i}"));
        copy_dir(&dir, &copy);
        edit(&copy);
        let (code, text) = audit_with(&copy, alice_pub.to_str().unwrap());
        assert_eq!(code, Some(1), "{what}: audit --key passed: {text}");
        assert!(text.contains("signature: "), "{what}: the signature check names it: {text}");
        let (code, text) = model_signing_verify(&copy, &alice_pub);
        assert_eq!(code, Some(1), "{what}: model_signing passed: {text}");
    }
}

/// A pack is someone else's folder: any of its files may be a FIFO. `audit`
/// and `pack verify` refuse one at once, naming it (before, the event log
/// was opened by path after the checks, and the open waited for a writer
/// forever).
#[test]
fn a_fifo_in_a_pack_is_refused_at_once_never_waited_on() {
    for file in ["events.jsonl", "SHA256SUMS", "MANIFEST.json", "model.sig"] {
        let (p, dir) = frozen();
        let path = dir.join(file);
        let _ = std::fs::remove_file(&path);
        common::mkfifo(&path);
        let d = dir.to_str().unwrap();
        for cmd in [&["audit", d][..], &["pack", "verify", d]] {
            let out = p.run_within(cmd, 30);
            let text = format!("{}{}", stdout(&out), common::stderr(&out));
            assert!(matches!(out.status.code(), Some(1 | 2)), "{file}: {cmd:?}: {text}");
            assert!(text.contains(file), "{file}: {cmd:?}: {text}");
        }
    }
}

//! What re-runs and what stays cached.

use crate::common;

use common::{nodes_with, stderr, stdout, Project, CHAIN};

fn chain() -> Project {
    let p = Project::new();
    p.write("spec.yaml", CHAIN);
    p
}

#[test]
fn a_second_identical_run_is_all_cache_hits() {
    let p = chain();
    let first = p.run_json(&["spec.yaml"], 0);
    assert_eq!(nodes_with(&first, "node_finished"), ["a", "b", "c", "d"]);
    let second = p.run_json(&["spec.yaml"], 0);
    assert_eq!(nodes_with(&second, "cache_hit"), ["a", "b", "c", "d"]);
    assert!(nodes_with(&second, "node_started").is_empty());
    assert_eq!(p.read("c.txt"), "ALPHA\nALPHA\n");
}

#[test]
fn changing_one_param_reruns_exactly_that_node_and_its_descendants() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    let ev = p.run_json(&["spec.yaml", "--set", "nodes.b.params.cmd=tr a-z A-Z < a.txt | rev > b.txt"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["b", "c"]);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["a", "d"]);
    assert_eq!(p.read("c.txt"), "AHPLA\nAHPLA\n");
    let started = ev.iter().find(|e| e["event"] == "node_started" && e["node"] == "b").unwrap();
    let reason = started["reason"].as_str().unwrap();
    assert!(reason.contains("params.cmd"), "the reason names the field: {reason}");
}

#[test]
fn an_upstream_rerun_that_reproduces_identical_bytes_leaves_downstream_cached() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    // Different command, same bytes.
    let ev = p.run_json(&["spec.yaml", "--set", "nodes.a.params.cmd=printf 'alpha\\n' > a.txt"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["a"]);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["b", "c", "d"]);
}

#[test]
fn deleting_an_output_checks_it_out_of_the_store_instead_of_running_its_node() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    std::fs::remove_file(p.path().join("b.txt")).unwrap();
    let plan = stdout(&p.run(&["plan", "spec.yaml"]));
    assert!(plan.contains("restore") && plan.contains("output 'b.txt' is missing"), "{plan}");
    let ev = p.run_json(&["spec.yaml"], 0);
    assert!(nodes_with(&ev, "node_started").is_empty(), "{ev:?}");
    assert!(ev.iter().any(|e| e["node"] == "b" && e["restored"].is_string()), "{ev:?}");
    assert_eq!(p.read("b.txt"), "ALPHA\n");
}

#[test]
fn editing_an_output_even_keeping_its_size_is_noticed_and_the_stored_bytes_put_back() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    std::fs::write(p.path().join("b.txt"), "ALPHX\n").unwrap();
    let ev = p.run_json(&["spec.yaml"], 0);
    assert!(ev.iter().any(|e| e["node"] == "b" && e["restored"].is_string()), "{ev:?}");
    assert!(nodes_with(&ev, "node_started").is_empty(), "{ev:?}");
    assert_eq!(p.read("b.txt"), "ALPHA\n");
}

/// Edits a file in place (same inode, same size) and puts its mtime back:
/// only its ctime tells, as git's index would notice.
fn edit_in_place_keeping_size_and_mtime(path: &std::path::Path, bytes: &[u8]) {
    use std::io::Write;
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), bytes.len() as u64);
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(path).unwrap().modified().unwrap(), mtime);
}

#[test]
fn an_output_edited_in_place_with_its_mtime_restored_is_noticed_and_never_poisons_a_consumer() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    edit_in_place_keeping_size_and_mtime(&p.path().join("a.txt"), b"omega\n");
    let plan = stdout(&p.run(&["plan", "spec.yaml"]));
    assert!(plan.contains("output 'a.txt' was modified"), "{plan}");
    // Forcing the consumer must not read the edited bytes under the clean key:
    // the producer's output is checked out of the store first.
    let ev = p.run_json(&["spec.yaml", "--force", "b"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["b"]);
    assert!(ev.iter().any(|e| e["node"] == "a" && e["restored"].is_string()), "{ev:?}");
    assert_eq!(p.read("a.txt"), "alpha\n");
    assert_eq!(p.read("b.txt"), "ALPHA\n");
}

#[test]
fn touching_an_output_without_changing_it_is_still_a_cache_hit() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    let path = p.path().join("a.txt");
    let text = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, text).unwrap(); // new inode and mtime, same bytes
    let ev = p.run_json(&["spec.yaml"], 0);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["a", "b", "c", "d"]);
}

#[test]
fn editing_a_declared_dep_file_reruns_the_node_and_names_the_dep() {
    let p = Project::new();
    p.write("input.txt", "one\n");
    p.write(
        "spec.yaml",
        "name: deps\nnodes:\n  count:\n    op: shell\n    params:\n      cmd: wc -l < input.txt > n.txt\n      deps: [input.txt]\n      outs: [n.txt]\n",
    );
    p.run_json(&["spec.yaml"], 0);
    p.write("input.txt", "one\ntwo\n");
    let ev = p.run_json(&["spec.yaml"], 0);
    let started = ev.iter().find(|e| e["event"] == "node_started").expect("count re-runs");
    assert_eq!(started["reason"], "dep 'input.txt' changed");
    assert_eq!(p.read("n.txt").trim(), "2");
}

#[test]
fn force_reruns_a_cached_node() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    let ev = p.run_json(&["spec.yaml", "--force", "d"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["d"]);
    let started = ev.iter().find(|e| e["event"] == "node_started").unwrap();
    assert_eq!(started["reason"], "forced");
}

#[test]
fn force_with_a_matrix_nodes_written_id_reruns_every_expansion() {
    let p = Project::new();
    p.write(
        "spec.yaml",
        "name: m\nnodes:\n  s:\n    op: shell\n    matrix: {env.N: ['1', '2']}\n    params:\n      cmd: echo $N > s-${matrix.env.N}.txt\n      outs: ['s-${matrix.env.N}.txt']\n  t:\n    op: shell\n    params: {cmd: echo t > t.txt, outs: [t.txt]}\n",
    );
    p.run_json(&["spec.yaml"], 0);
    let ev = p.run_json(&["spec.yaml", "--force", "s"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["s@env.N=1", "s@env.N=2"]);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["t"]);
    // One expansion by its full id; an unknown name is still an error.
    let ev = p.run_json(&["spec.yaml", "--force", "s@env.N=2"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["s@env.N=2"]);
    let out = p.run(&["run", "spec.yaml", "--force", "x"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_failing_node_skips_its_descendants_and_the_others_finish() {
    let p = chain();
    let ev = p.run_json(&["spec.yaml", "--set", "nodes.b.params.cmd=echo broken >&2; exit 3"], 1);
    assert_eq!(nodes_with(&ev, "node_failed"), ["b"]);
    assert_eq!(nodes_with(&ev, "node_skipped"), ["c"]);
    assert_eq!(nodes_with(&ev, "node_finished"), ["a", "d"]);
    let failed = ev.iter().find(|e| e["event"] == "node_failed").unwrap();
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("exit code 3") && error.contains("broken"), "{error}");
    // Fixing it resumes from the completed nodes.
    let ev = p.run_json(&["spec.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["b", "c"]);
}

#[test]
fn independent_nodes_run_in_parallel_up_to_jobs() {
    let p = Project::new();
    p.write(
        "spec.yaml",
        r#"
name: par
nodes:
  x:
    op: shell
    params: {cmd: "sleep 0.3; echo x > x.txt", outs: [x.txt]}
  y:
    op: shell
    params: {cmd: "sleep 0.3; echo y > y.txt", outs: [y.txt]}
"#,
    );
    let overlapping = |events: &[serde_json::Value]| {
        let first_finish = events.iter().position(|e| e["event"] == "node_finished").unwrap();
        events[..first_finish].iter().filter(|e| e["event"] == "node_started").count() == 2
    };
    let ev = p.run_json(&["spec.yaml", "--jobs", "2"], 0);
    assert!(overlapping(&ev), "with 2 jobs both start before either finishes: {ev:?}");
    let ev = p.run_json(&["spec.yaml", "--jobs", "1", "--force", "x", "--force", "y"], 0);
    assert!(!overlapping(&ev), "with 1 job they run one after the other: {ev:?}");
}

#[test]
fn keys_do_not_depend_on_key_order_or_number_spelling() {
    let p = Project::new();
    p.write("one.yaml", "name: k\nnodes:\n  a:\n    op: shell\n    params:\n      cmd: echo 1 > o.txt\n      outs: [o.txt]\n      env: {A: 1, B: 2.0}\n");
    p.write("two.yaml", "nodes:\n  a:\n    params:\n      env: {B: 2, A: 1}\n      outs: [o.txt]\n      cmd: echo 1 > o.txt\n    op: shell\nname: k\n");
    let key = |spec: &str| {
        let out = p.run(&["plan", spec, "--json"]);
        let v: serde_json::Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
        v["key"].as_str().map(str::to_string)
    };
    p.run_json(&["one.yaml"], 0);
    assert!(key("one.yaml").is_some());
    assert_eq!(key("one.yaml"), key("two.yaml"));
}

/// A node whose last attempt failed is not a "new node": plan names the run
/// it failed in and the error, until it changes or succeeds.
#[test]
fn plan_says_in_which_run_an_unchanged_node_failed() {
    let p = Project::new();
    p.write(
        "spec.yaml",
        "name: f\nnodes:\n  flaky:\n    op: shell\n    params: {cmd: \"test -f ok || { echo not yet >&2; exit 3; }; echo done > out.txt\", outs: [out.txt]}\n",
    );
    let ev = p.run_json(&["spec.yaml"], 1);
    let run_id = ev.iter().find_map(|e| e["run_id"].as_str()).expect("the run names its id").to_string();
    let out = p.run(&["plan", "spec.yaml"]);
    let text = stdout(&out);
    assert!(text.contains(&format!("failed in run {run_id}")) && text.contains("exit code 3"), "{text}");
    // The same key run again says so too, and once it succeeds it is cached.
    p.write("ok", "");
    let ev = p.run_json(&["spec.yaml"], 0);
    let started = ev.iter().find(|e| e["event"] == "node_started").unwrap();
    assert!(started["reason"].as_str().unwrap().starts_with(&format!("failed in run {run_id}")), "{started}");
    assert!(stdout(&p.run(&["plan", "spec.yaml"])).contains("1 cached, 0 to run"));
    // A changed node is described by its change, not by an old failure.
    let out = p.run(&["plan", "spec.yaml", "--set", "nodes.flaky.params.cmd=echo other > out.txt"]);
    assert!(stdout(&out).contains("params.cmd"), "{}", stdout(&out));
}

/// (Issue #34.) `run --check` re-executes cached nodes, as `nix build --check`:
/// a deterministic node reproduces; `date > out` does not, and says which
/// output and where it first differs. Nothing in the cache or the tree
/// changes: the next run executes nothing and the tree keeps the cached bytes.
#[test]
fn run_check_finds_a_nondeterministic_node_and_changes_nothing() {
    let p = Project::new();
    p.write(
        "spec.yaml",
        "name: check\nnodes:\n  det:\n    op: shell\n    params: {cmd: 'printf \"one\\ntwo\\n\" > det.txt', outs: [det.txt]}\n  clock:\n    op: shell\n    params: {cmd: 'echo run; date +%s%N > clock.txt', outs: [clock.txt]}\n  down:\n    op: shell\n    params: {cmd: 'cat clock.txt det.txt > down.txt', deps: [clock.txt, det.txt], outs: [down.txt]}\n",
    );
    p.run_json(&["spec.yaml"], 0);
    let (clock, down) = (p.read("clock.txt"), p.read("down.txt"));

    let out = p.run(&["run", "spec.yaml", "--check"]);
    assert_eq!(out.status.code(), Some(1), "stdout:\n{}\nstderr:\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("reproduced  det "), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("DIFFERS     clock ") && err.contains("output 'clock.txt'"), "{err}");
    assert!(err.contains("first difference at byte") && err.contains("(line 1)"), "{err}");
    // down is re-executed on the cached clock.txt, so it reproduces.
    assert!(stdout(&out).contains("reproduced  down "), "{}", stdout(&out));
    assert!(stdout(&out).contains("checked 3 node(s): 2 reproduced, 1 did not"), "{}", stdout(&out));
    assert_eq!((p.read("clock.txt"), p.read("down.txt")), (clock.clone(), down), "the tree keeps the cached bytes");
    let ev = p.run_json(&["spec.yaml"], 0);
    assert!(nodes_with(&ev, "node_finished").is_empty(), "the cache is as it was: {ev:?}");

    // Only the named node, and a deterministic one passes.
    let out = p.run(&["run", "spec.yaml", "det", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("checked 1 node(s): 1 reproduced"), "{}", stdout(&out));
    // A node that is not cached cannot be checked: said, exit 1.
    p.write("spec.yaml", &p.read("spec.yaml").replace("two", "three"));
    let out = p.run(&["run", "spec.yaml", "det", "--check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not cached  det: key"), "{}", stderr(&out));
}

/// Before, `run --check` on a node whose folder out held the researcher's
/// own notes (a file added after the run) and a hand edit removed both
/// without a word: the re-execution removes the outs, and the cached ones
/// were put back. A check changes nothing: such a node is not re-executed,
/// the check fails saying which out holds what, and every byte stays. Bytes
/// the store holds (a deleted out) are put back as before.
#[test]
fn run_check_never_removes_bytes_the_store_lacks() {
    let p = Project::new();
    p.write(
        "spec.yaml",
        "name: check\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'mkdir -p res && echo 42 > res/score.txt', outs: [res]}\n  \
         x:\n    op: shell\n    params: {cmd: 'echo 1 > x.txt', outs: [x.txt]}\n",
    );
    p.run_json(&["spec.yaml"], 0);
    p.write("res/notes.md", "my analysis of the run\n");
    p.write("res/score.txt", "43\n");
    std::fs::remove_file(p.path().join("x.txt")).unwrap();
    let out = p.run(&["run", "spec.yaml", "--check"]);
    assert_eq!(out.status.code(), Some(1), "stdout:\n{}\nstderr:\n{}", stdout(&out), stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("out 'res' holds bytes the store lacks") && err.contains("notes.md"), "{err}");
    assert!(stdout(&out).contains("reproduced  x "), "{}", stdout(&out));
    assert_eq!(p.read("res/notes.md"), "my analysis of the run\n", "the researcher's notes were removed");
    assert_eq!(p.read("res/score.txt"), "43\n", "the hand edit was replaced");
    assert_eq!(p.read("x.txt"), "1\n", "a missing out is put back");
}

/// (Issue #34.) `plan`'s "why" compares a node with the last record of the
/// same node in the same spec and profile, not with whatever ran last under
/// that id (another profile here).
#[test]
fn plan_says_why_against_the_same_spec_and_profile() {
    let p = Project::new();
    let spec = "name: why\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'echo CMD > a.txt', outs: [a.txt]}\nprofiles:\n  tiny:\n    nodes:\n      a:\n        params: {cmd: 'echo tinyprofile > a.txt'}\n";
    p.write("why.yaml", &spec.replace("CMD", "alpha"));
    p.run_json(&["why.yaml"], 0);
    p.run_json(&["why.yaml", "--profile", "tiny"], 0);
    p.write("why.yaml", &spec.replace("CMD", "gamma"));
    let out = p.run(&["plan", "why.yaml"]);
    let text = stdout(&out);
    assert!(text.contains("alpha") && text.contains("gamma"), "the default profile's last record: {text}");
    assert!(!text.contains("tinyprofile"), "not the tiny profile's record: {text}");
}

/// The parse cache's entries in the project's workspace: (parsed files,
/// passed params checks). A params check's entry is the JSON object
/// `{"params_checked": <nodes>}` after its 64-digit checksum line.
fn parse_cache_entries(p: &Project) -> (usize, usize) {
    let Ok(dir) = std::fs::read_dir(p.path().join(".orchestrate/specs")) else { return (0, 0) };
    let (mut parses, mut checks) = (0, 0);
    for e in dir {
        let path = e.unwrap().path();
        if !path.to_string_lossy().ends_with(".json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text[65..]).unwrap();
        match doc.as_object() {
            Some(o) if o.len() == 1 && o.contains_key("params_checked") => checks += 1,
            _ => parses += 1,
        }
    }
    (parses, checks)
}

/// A spec read again is not parsed again (its parse is kept in
/// `.orchestrate/specs/`), yet every edit, to the spec or to a file it
/// extends, is what runs; a file that does not parse is never kept and says
/// the same error every time; and `plan` keeps nothing.
#[test]
fn the_parse_cache_never_serves_an_edited_or_a_broken_spec() {
    let p = Project::new();
    let base = |word: &str| {
        format!("name: base\nnodes:\n  a: {{op: shell, params: {{cmd: 'echo {word} > a.txt', outs: [a.txt]}}}}\n")
    };
    p.write("base.yaml", &base("one"));
    p.write(
        "spec.yaml",
        "extends: base.yaml\nname: s\nnodes:\n  b: {op: shell, params: {cmd: 'cat a.txt a.txt > b.txt', deps: [a.txt], outs: [b.txt]}}\n",
    );
    let out = p.run(&["plan", "spec.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(parse_cache_entries(&p), (0, 0), "plan writes nothing");
    assert_eq!(nodes_with(&p.run_json(&["spec.yaml"], 0), "node_finished"), ["a", "b"]);
    assert_eq!(parse_cache_entries(&p), (2, 1), "an entry per file read, one for the params checked");
    assert_eq!(nodes_with(&p.run_json(&["spec.yaml"], 0), "cache_hit"), ["a", "b"]);
    assert_eq!(parse_cache_entries(&p), (2, 1));
    // The parent edited: its new text is parsed, and what it says runs.
    p.write("base.yaml", &base("two"));
    assert_eq!(nodes_with(&p.run_json(&["spec.yaml"], 0), "node_finished"), ["a", "b"]);
    assert_eq!(p.read("b.txt"), "two\ntwo\n");
    assert_eq!(parse_cache_entries(&p), (3, 2), "the parent's new text and its new params");
    // Back to the first text: its entry is read, and the store's outputs put back.
    p.write("base.yaml", &base("one"));
    assert_eq!(nodes_with(&p.run_json(&["spec.yaml"], 0), "cache_hit"), ["a", "b"]);
    assert_eq!(p.read("b.txt"), "one\none\n");
    p.write("spec.yaml", "name: s\nnodes: [\n");
    for _ in 0..2 {
        let out = p.run(&["run", "spec.yaml"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("spec.yaml:") && stderr(&out).contains("invalid YAML"), "{}", stderr(&out));
    }
    // YAML that parses but is not a mapping: refused each time, never kept.
    p.write("spec.yaml", "- a\n- b\n");
    for _ in 0..2 {
        let out = p.run(&["run", "spec.yaml"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("spec.yaml:1:1") && stderr(&out).contains("expected a mapping"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(parse_cache_entries(&p), (3, 2), "back to the first text: nothing new kept");
}

/// The parse cache's folder made a link to a folder of the user's: the run
/// goes on, says it kept nothing, and writes nothing there.
#[test]
fn a_linked_parse_cache_folder_is_never_written_through() {
    let p = Project::new();
    p.write("spec.yaml", CHAIN);
    p.run_json(&["spec.yaml"], 0);
    let mine = p.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::remove_dir_all(p.path().join(".orchestrate/specs")).unwrap();
    std::os::unix::fs::symlink(&mine, p.path().join(".orchestrate/specs")).unwrap();
    let out = p.run(&["run", "spec.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("was not kept") && stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(&mine).unwrap().count(), 0, "nothing written through the link");
}

/// The runs of `status --json`: (run id, summary), newest first.
fn runs(p: &Project) -> Vec<(String, String)> {
    let out = p.run(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let list = doc["runs"].as_array().expect("a list of runs");
    list.iter()
        .map(|r| (r["run_id"].as_str().unwrap().to_string(), r["summary"].as_str().unwrap().to_string()))
        .collect()
}

/// A run of cache hits alone is recorded beside the index
/// (`cache.sqlite-runs`) rather than in it, and reads as any other run:
/// `status` lists it and `events` shows its cache hits at once; the next run
/// with work folds it into the index, and it reads the same.
#[test]
fn a_run_of_hits_alone_is_in_the_history_at_once_and_after_it_is_folded_in() {
    let p = chain();
    p.run_json(&["spec.yaml"], 0);
    p.run_json(&["spec.yaml"], 0);
    let beside = p.path().join(".orchestrate/cache.sqlite-runs");
    let size = || std::fs::metadata(&beside).map(|m| m.len()).unwrap_or(0);
    assert!(size() > 0, "the run of hits waits beside the index");
    let listed = runs(&p);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0].1, "0 ran, 4 cached, 0 failed, 0 skipped");
    assert_eq!(listed[1].1, "4 ran, 0 cached, 0 failed, 0 skipped");
    let hits_of = |run: &str| {
        let out = p.run(&["events", "--run", run, "--type", "cache_hit", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let mut nodes: Vec<String> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["node"].as_str().unwrap().to_string())
            .collect();
        nodes.sort();
        nodes
    };
    assert_eq!(hits_of(&listed[0].0), ["a", "b", "c", "d"]);

    // A run with work folds it in: the file is emptied, the history reads the same.
    p.run_json(&["spec.yaml", "--set", "nodes.d.params.cmd=echo delta2 > d.txt"], 0);
    assert_eq!(size(), 0, "folded into the index");
    let after = runs(&p);
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(after[1..], listed[..]);
    assert_eq!(hits_of(&listed[0].0), ["a", "b", "c", "d"]);
}

/// Before, `checkout` and the restore `run` makes of a missing out copied the
/// stored object into the tree without checking it: an object damaged after
/// it was stored (bit rot, an edit after a chmod) put its bad bytes at the
/// out's path (`evil` where the node had written `good`), the command said
/// `restored`, and the next `plan` called the node cached. A restored out is
/// now checked against its object's name first: a damaged object is moved
/// aside and never placed; `checkout` says so (exit 1), and `run` runs the
/// node again instead, which stores its bytes anew.
#[test]
fn a_damaged_object_is_never_checked_out_into_the_tree() {
    let p = Project::new();
    p.write(
        "p.yaml",
        "name: p\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'echo good > o.txt && mkdir -p d && echo good > d/f.txt', outs: [o.txt, d]}\n",
    );
    p.run_json(&["p.yaml"], 0);
    let object = |out: &str| {
        let o = p.run(&["path", "p.yaml", &format!("w:{out}")]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        std::path::PathBuf::from(stdout(&o).trim())
    };
    for out in ["o.txt", "d"] {
        let stored = object(out);
        common::damage_object(&stored, "evil\n");
        std::fs::remove_dir_all(p.path().join("d")).ok();
        std::fs::remove_file(p.path().join("o.txt")).ok();
        let o = p.run(&["checkout", "p.yaml"]);
        let said = stdout(&o) + &stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{out}: {said}");
        assert!(said.contains("damaged"), "{out}: {said}");
        for placed in ["o.txt", "d/f.txt"] {
            let text = std::fs::read_to_string(p.path().join(placed)).unwrap_or_default();
            assert_ne!(text, "evil\n", "{out}: the damaged bytes were put at {placed}");
        }
        // `run` makes the out again (its object was moved aside), from the command.
        let events = p.run_json(&["p.yaml"], 0);
        assert_eq!(nodes_with(&events, "node_finished"), ["w"], "{out}: {events:?}");
        assert_eq!(p.read("o.txt"), "good\n");
        assert_eq!(p.read("d/f.txt"), "good\n");
        // And a restore by `run` checks the same.
        common::damage_object(&object(out), "evil\n");
        std::fs::remove_dir_all(p.path().join("d")).ok();
        std::fs::remove_file(p.path().join("o.txt")).ok();
        let events = p.run_json(&["p.yaml"], 0);
        assert_eq!(nodes_with(&events, "node_finished"), ["w"], "{out}: restored from a damaged object: {events:?}");
        assert_eq!((p.read("o.txt"), p.read("d/f.txt")), ("good\n".to_string(), "good\n".to_string()), "{out}");
    }
}

//! Issue #30: never touch what is not ours, and an audit that names cannot fool.
//! Each test is a repro that failed before the fix, run through the binary.

use crate::common;

use common::{stderr, stdout, Project};

const ONE: &str = "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: echo alpha > a.txt, outs: [a.txt]}\n";

#[test]
fn a_symlinked_internal_folder_is_refused_and_the_folder_it_points_to_keeps_its_files() {
    let p = Project::new();
    p.write("keep/notes.txt", "x");
    p.write("s.yaml", ONE);
    // The issue's repro: a folder holding only the link is not a workspace at all.
    std::fs::create_dir(p.path().join(".orchestrate")).unwrap();
    std::os::unix::fs::symlink("../keep", p.path().join(".orchestrate/tmp")).unwrap();
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(p.read("keep/notes.txt"), "x", "the folder the link points to was emptied");
    // In a real workspace, each of its folders replaced by a link.
    std::fs::remove_file(p.path().join(".orchestrate/tmp")).unwrap();
    std::fs::remove_dir(p.path().join(".orchestrate")).unwrap();
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    // `records` too: before, a link there was found only when the node had
    // run, and its work was lost (exit 1 after the command, not 2 before it).
    for sub in ["tmp", "logs", "locks", "objects", "records"] {
        let at = p.path().join(".orchestrate").join(sub);
        let aside = p.path().join(format!("aside-{sub}"));
        std::fs::rename(&at, &aside).unwrap();
        std::os::unix::fs::symlink("../keep", &at).unwrap();
        let out = p.run(&["run", "s.yaml", "--force", "a"]);
        assert_eq!(out.status.code(), Some(2), "{sub}: {}", stderr(&out));
        assert!(stderr(&out).contains("symbolic link"), "{sub}: {}", stderr(&out));
        assert_eq!(std::fs::read_dir(p.path().join("keep")).unwrap().count(), 1, "{sub}: keep/ was changed");
        assert_eq!(p.read("keep/notes.txt"), "x");
        std::fs::remove_file(&at).unwrap();
        std::fs::rename(&aside, &at).unwrap();
    }
    // What orchestrate did not create in tmp/ is left alone, and said.
    p.write(".orchestrate/tmp/notes.txt", "mine");
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("not made by orchestrate") && stderr(&out).contains("notes.txt"), "{}", stderr(&out));
    assert_eq!(p.read(".orchestrate/tmp/notes.txt"), "mine");
    std::fs::remove_file(p.path().join(".orchestrate/tmp/notes.txt")).unwrap();
    // The index itself: SQLite would follow a link and add our tables to their file.
    let index = p.path().join(".orchestrate/cache.sqlite");
    std::fs::rename(&index, p.path().join("aside.sqlite")).unwrap();
    p.write("keep/their.db", "theirs");
    std::os::unix::fs::symlink("../keep/their.db", &index).unwrap();
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert_eq!(p.read("keep/their.db"), "theirs");
}

#[test]
fn a_workspace_flag_at_an_ordinary_folder_is_refused_and_its_tmp_left_alone() {
    let p = Project::new();
    p.write("s.yaml", ONE);
    p.write("home/tmp/draft.txt", "mine");
    p.write("home/.profile", "mine");
    for cmd in [&["run", "s.yaml"][..], &["status"], &["verify"]] {
        let mut args = cmd.to_vec();
        args.extend(["--workspace", "home"]);
        let out = p.run(&args);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("not an orchestrate workspace"), "{cmd:?}: {}", stderr(&out));
    }
    assert_eq!(p.read("home/tmp/draft.txt"), "mine");
    assert_eq!(std::fs::read_dir(p.path().join("home")).unwrap().count(), 2, "nothing was added to home/");
    // A new folder is made a workspace, marked, and used again.
    let out = p.run(&["run", "s.yaml", "--workspace", "ws"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(p.path().join("ws/workspace.json").is_file());
    assert_eq!(p.run(&["run", "s.yaml", "--workspace", "ws"]).status.code(), Some(0));
}

#[test]
fn node_ids_that_leave_a_folder_or_rewrite_a_terminal_line_are_refused_at_validate() {
    let p = Project::new();
    for (name, id) in [
        ("dotdot", "'..'"),
        ("dot", "'.'"),
        ("newline", "\"a\\nb\""),
        ("esc", "\"a\\e[2Kb\""),
        ("bidi", "\"a\\u202Eb\""),
    ] {
        let spec = format!("name: s\nnodes:\n  {id}:\n    op: shell\n    params: {{cmd: 'true'}}\n");
        p.write(&format!("{name}.yaml"), &spec);
        let out = p.run(&["validate", &format!("{name}.yaml")]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("node id"), "{name}: {err}");
        assert!(!err.contains('\u{1b}') && !err.contains('\u{202e}'), "{name}: raw control in {err:?}");
    }
    // A matrix value becomes part of an id, so it is held to the same rule.
    p.write(
        "m.yaml",
        "name: m\nnodes:\n  x:\n    op: shell\n    matrix: {env.V: ['../..']}\n    params: {cmd: 'true'}\n",
    );
    let out = p.run(&["validate", "m.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("'/' is not allowed"), "{}", stderr(&out));
}

const TWO_GATES: &str = r#"
name: twogates
nodes:
  measure:
    op: shell
    params: {cmd: "echo '{\"score\": 0.3}' > m.json", outs: [m.json]}
  ga:
    op: gate
    params: {file: a/g.yaml}
  gb:
    op: gate
    params: {file: b/g.yaml}
"#;

#[test]
fn two_gate_files_with_one_name_are_both_kept_in_the_pack_and_audited_each_by_its_own() {
    let p = Project::new();
    p.write("s.yaml", TWO_GATES);
    let gate = |floor: f64| {
        format!(
            "name: g\ngates:\n  - name: floor\n    evidence: {{m: 'measure:m.json'}}\n    check: {{field: m.score, at_least: {floor}}}\n"
        )
    };
    p.write("a/g.yaml", &gate(0.1));
    p.write("b/g.yaml", &gate(0.9));
    let out = p.run(&["run", "s.yaml"]);
    assert_eq!(out.status.code(), Some(1), "one gate fails: {}", stderr(&out));
    let out = p.run(&["pack", "freeze", "s.yaml", "--out", "pack"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(p.path().join("pack/gates/ga/g.yaml").is_file() && p.path().join("pack/gates/gb/g.yaml").is_file());
    let out = p.run(&["audit", "pack"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("1 passed, 1 failed"), "{text}");
}

#[test]
fn a_gate_file_outside_the_project_is_refused_and_no_error_prints_a_file_back() {
    let p = Project::new();
    p.write("proj/.git/HEAD", "ref: refs/heads/main\n");
    p.write("secret.ini", "[default]\naws_secret_access_key = wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY\n");
    p.write("proj/creds.yaml", "aws_secret_access_key_wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY\n");
    for (name, file) in [("abs", "/etc/passwd"), ("up", "../secret.ini"), ("inside", "creds.yaml")] {
        p.write(
            &format!("proj/{name}.yaml"),
            &format!("name: s\nnodes:\n  g:\n    op: gate\n    params: {{file: '{file}'}}\n"),
        );
        let out = p.run(&["validate", &format!("proj/{name}.yaml")]);
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(2), "{name}: {all}");
        assert!(!all.contains("root:x:0") && !all.contains("EXAMPLEKEY"), "{name}: the file was printed: {all}");
        if name != "inside" {
            assert!(all.contains("outside the spec's project") || all.contains("no absolute path"), "{name}: {all}");
        }
    }
}

#[test]
fn a_workspace_whose_index_is_gone_is_still_verified_and_every_command_says_reindex() {
    let p = Project::new();
    p.write("s.yaml", ONE);
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    // Damage an object, then lose the index.
    let objects = p.path().join(".orchestrate/objects");
    let object = std::fs::read_dir(&objects)
        .unwrap()
        .flat_map(|s| std::fs::read_dir(s.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    std::fs::set_permissions(&object, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&object, "tampered\n").unwrap();
    for f in ["cache.sqlite", "cache.sqlite-wal", "cache.sqlite-shm"] {
        let _ = std::fs::remove_file(p.path().join(".orchestrate").join(f));
    }
    let out = p.run(&["verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("CORRUPT") && stdout(&out).contains("orchestrate reindex"), "{}", stdout(&out));
    for cmd in [&["status"][..], &["run", "s.yaml"]] {
        let out = p.run(cmd);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {}", stdout(&out));
        assert!(stderr(&out).contains("orchestrate reindex"), "{cmd:?}: {}", stderr(&out));
    }
}

#[test]
fn an_index_removed_during_a_run_fails_the_run_saying_how_to_recover() {
    let p = Project::new();
    p.write(
        "s.yaml",
        "name: s\nnodes:\n  a:\n    op: shell\n    params:\n      cmd: rm -f .orchestrate/cache.sqlite .orchestrate/cache.sqlite-wal .orchestrate/cache.sqlite-shm; echo a > a.txt\n      outs: [a.txt]\n",
    );
    let out = p.run(&["run", "s.yaml"]);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("orchestrate reindex"), "{all}");
    // And reindex does recover the node.
    let out = p.run(&["reindex"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("1 nodes re-indexed"), "{}", stdout(&out));
}

#[test]
fn a_deeply_nested_spec_and_a_huge_matrix_are_refused_at_once() {
    let p = Project::new();
    p.write("deep.yaml", &format!("name: x\nnodes: {}", "[".repeat(100_000)));
    let t = std::time::Instant::now();
    let out = p.run(&["validate", "deep.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("nests deeper than 64"), "{}", stderr(&out));
    assert!(t.elapsed() < std::time::Duration::from_secs(1), "took {:?} (56 s before)", t.elapsed());
    let values: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
    let axis = format!("[{}]", values.join(", "));
    p.write("big.yaml", &format!("name: x\nnodes:\n  a:\n    op: shell\n    matrix: {{env.A: {axis}, env.B: {axis}}}\n    params: {{cmd: 'true'}}\n"));
    let t = std::time::Instant::now();
    let out = p.run(&["plan", "big.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("expands to 1000000 nodes") && stderr(&out).contains("100000"), "{}", stderr(&out));
    assert!(t.elapsed() < std::time::Duration::from_secs(2), "took {:?} (35 s before)", t.elapsed());
}

#[test]
fn extends_and_set_say_what_is_wrong_instead_of_failing_quietly() {
    let p = Project::new();
    p.write("base.yaml", ONE);
    std::fs::create_dir(p.path().join("folder")).unwrap();
    for (target, expected) in [("/dev/zero", "not a regular file"), ("folder", "is a folder")] {
        p.write("child.yaml", &format!("extends: {target}\nname: c\n"));
        let out = p.run(&["validate", "child.yaml"]);
        assert_eq!(out.status.code(), Some(2), "{target}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{target}: {}", stderr(&out));
    }
    let out = p.run(&["validate", "base.yaml", "--set", "extends=/nonexistent.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot be set with --set"), "{}", stderr(&out));
    // `null` removes a key, as the docs say.
    p.write("two.yaml", &format!("{ONE}  b:\n    op: shell\n    params: {{cmd: echo b > b.txt, outs: [b.txt]}}\n"));
    let out = p.run(&["plan", "two.yaml", "--set", "nodes.b=null"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("a ") && !stdout(&out).contains("b "), "{}", stdout(&out));
}

/// Ctrl-C: before, nothing was said, `status` showed the run as "interrupted
/// or running" forever, and the slow node's partial out stayed in the tree.
#[test]
fn an_interrupted_run_says_so_is_recorded_as_interrupted_and_leaves_no_partial_out() {
    for (signal, code) in [(libc_sig::SIGINT, 130), (libc_sig::SIGTERM, 143)] {
        let p = Project::new();
        p.write(
            "s.yaml",
            "name: s\nnodes:\n  fast:\n    op: shell\n    params: {cmd: echo done > fast.txt, outs: [fast.txt]}\n  slow:\n    op: shell\n    params: {cmd: 'trap \"echo saw-term > term.txt; exit 143\" TERM; echo $$ > slow.pid; echo partial > slow.txt; if [ -e hold ]; then sleep 30 & wait; fi; echo rest >> slow.txt', outs: [slow.txt]}\n  after:\n    op: shell\n    params: {cmd: cat slow.txt > after.txt, deps: [slow.txt], outs: [after.txt]}\n",
        );
        p.write("hold", "");
        let child = p
            .cmd(&["run", "s.yaml", "-j", "2"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while !(p.path().join("slow.txt").exists()
            && p.path().join("slow.pid").exists()
            && p.path().join("fast.txt").exists())
        {
            assert!(t.elapsed() < std::time::Duration::from_secs(20), "the nodes never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let sleeper: i32 = p.read("slow.pid").trim().parse().unwrap();
        assert!(std::process::Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .unwrap()
            .success());
        let t = std::time::Instant::now();
        let out = child.wait_with_output().unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "took {:?} to stop", t.elapsed());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(err.contains("interrupted by SIG") && err.contains("recorded as interrupted"), "{err}");
        assert!(err.contains("stopped slow") && err.contains("1 never started"), "{err}");
        // The node had its grace period: SIGTERM first, so its trap ran (it
        // was SIGKILLed at once before).
        assert_eq!(p.read("term.txt").trim(), "saw-term", "the node never saw SIGTERM");
        assert!(!p.path().join("slow.txt").exists(), "the interrupted node's partial out was left");
        assert!(!p.path().join("after.txt").exists());
        assert!(!std::path::Path::new(&format!("/proc/{sleeper}")).exists(), "the slow node's process survived");
        let status = stdout(&p.run(&["status"]));
        assert!(status.lines().next().unwrap().contains("interrupted") && !status.contains("or running"), "{status}");
        // Its events are stored with it: what started, what was stopped.
        let stored = stdout(&p.run(&["events"]));
        assert!(stored.contains("node_started") && stored.contains("node_failed"), "{stored}");
        // The next run goes on: fast is cached, slow and after run.
        std::fs::remove_file(p.path().join("hold")).unwrap();
        let out = p.run(&["run", "--json", "s.yaml"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let ev = common::events(&out);
        assert_eq!(common::nodes_with(&ev, "cache_hit"), ["fast"]);
        assert_eq!(common::nodes_with(&ev, "node_finished"), ["after", "slow"]);
    }
}

mod libc_sig {
    pub const SIGINT: i32 = 2;
    pub const SIGTERM: i32 = 15;
}

/// A dangling link where an object shard goes said `File exists (os error
/// 17)`, and a node whose outputs could not be stored left its out in the
/// tree while it was FAILED.
#[test]
fn a_node_whose_outputs_cannot_be_stored_fails_naming_why_and_leaves_no_out() {
    let p = Project::new();
    p.write("s.yaml", ONE);
    assert_eq!(p.run(&["run", "s.yaml", "--workspace", "probe"]).status.code(), Some(0));
    let object = stdout(&p.run(&["path", "s.yaml", "a:a.txt", "--workspace", "probe"]));
    let shard = std::path::Path::new(object.trim()).parent().unwrap().file_name().unwrap().to_owned();
    std::fs::remove_file(p.path().join("a.txt")).unwrap();
    p.write("other.yaml", "name: o\nnodes:\n  z:\n    op: shell\n    params: {cmd: 'true'}\n");
    assert_eq!(p.run(&["run", "other.yaml"]).status.code(), Some(0));
    std::os::unix::fs::symlink("/nonexistent/elsewhere", p.path().join(".orchestrate/objects").join(&shard)).unwrap();
    let out = p.run(&["run", "s.yaml"]);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("symbolic link") && !all.contains("os error 17"), "{all}");
    assert!(all.contains("outs were removed"), "{all}");
    assert!(!p.path().join("a.txt").exists(), "the out of a failed node stayed in the tree");
}

/// A read-only command (`plan`, `status`) refuses an index planted as a
/// link, as `run` does, naming it: before, SQLite opened the linked file
/// read-only and `plan` answered "file is not a database" about a file of
/// the user's.
#[test]
fn a_read_only_command_never_opens_the_index_through_a_link() {
    let p = Project::new();
    p.write("s.yaml", "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: echo a > a.txt, outs: [a.txt]}\n");
    assert!(p.run(&["run", "s.yaml"]).status.success());
    let theirs = p.path().join("theirs.db");
    std::fs::write(&theirs, "keep").unwrap();
    let index = p.path().join(".orchestrate/cache.sqlite");
    std::fs::remove_file(&index).unwrap();
    std::os::unix::fs::symlink(&theirs, &index).unwrap();
    for cmd in [&["plan", "s.yaml"][..], &["status"], &["run", "s.yaml"]] {
        let out = p.run(cmd);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("cache.sqlite is a symbolic link"), "{cmd:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "keep");
}

/// The file of runs kept beside the index (`cache.sqlite-runs`, where a run
/// of cache hits alone is recorded) planted as a link to a file of the
/// user's, or as a FIFO: a run of hits and `status` refuse it, naming it,
/// and never write, read or wait on what it points to.
#[test]
fn the_runs_kept_beside_the_index_are_never_opened_through_a_link() {
    let p = Project::new();
    p.write("s.yaml", "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: echo a > a.txt, outs: [a.txt]}\n");
    assert!(p.run(&["run", "s.yaml"]).status.success());
    let theirs = p.path().join("theirs.jsonl");
    std::fs::write(&theirs, "keep").unwrap();
    let runs = p.path().join(".orchestrate/cache.sqlite-runs");
    let _ = std::fs::remove_file(&runs);
    std::os::unix::fs::symlink(&theirs, &runs).unwrap();
    for cmd in [&["run", "s.yaml"][..], &["status"]] {
        let out = p.run_within(cmd, 30);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("cache.sqlite-runs is a symbolic link"), "{cmd:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "keep");
    std::fs::remove_file(&runs).unwrap();
    common::mkfifo(&runs);
    let out = p.run_within(&["run", "s.yaml"], 30);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("cache.sqlite-runs is a symbolic link or not a regular file"), "{}", stderr(&out));
}

/// A FIFO planted where the spec names a user's file (a params file, a
/// file dep): before, opening it waited for a writer forever and the
/// command hung; now it is refused at once, named, with exit 2.
#[test]
fn a_fifo_where_a_params_file_or_a_dep_should_be_is_refused_not_waited_on() {
    let p = Project::new();
    let mkfifo = |rel: &str| common::mkfifo(&p.path().join(rel));
    p.write(
        "p.yaml",
        "name: p\nnodes:\n  t:\n    op: shell\n    params:\n      cmd: echo ${param:train.lr} > t.txt\n      \
         params_files: {params.yaml: [train.lr]}\n      outs: [t.txt]\n",
    );
    mkfifo("params.yaml");
    for cmd in ["validate", "plan", "run"] {
        let out = p.run_within(&[cmd, "p.yaml"], 30);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}", stderr(&out));
        assert!(stderr(&out).contains("'params.yaml' is not a regular file"), "{cmd}: {}", stderr(&out));
    }
    p.write(
        "d.yaml",
        "name: d\nnodes:\n  t:\n    op: shell\n    params: {cmd: cat input.txt > t.txt, deps: [input.txt], outs: [t.txt]}\n",
    );
    mkfifo("input.txt");
    let out = p.run_within(&["run", "d.yaml"], 30);
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("input.txt"), "{}", stderr(&out));
    assert!(!p.path().join("t.txt").exists());
}

/// `report --out` at a special file (a FIFO, a device such as `/dev/null`,
/// or a link to one such as `/dev/stdout`) writes into it, as `cp` and a
/// shell's `>` do. Before, the report was written beside it and renamed over
/// it: `report --out /dev/null` run as root replaced the machine's
/// `/dev/null` with a regular file (it broke every later test here that ran
/// a command as another user). A regular file is still replaced whole.
#[test]
fn a_report_written_to_a_special_file_writes_into_it_and_never_replaces_it() {
    use std::os::unix::fs::FileTypeExt;
    let p = Project::new();
    p.write("s.yaml", "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'echo 1 > a.txt', outs: [a.txt]}\n");
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    for out in ["pipe", "link"] {
        let fifo = p.path().join("pipe");
        let _ = std::fs::remove_file(&fifo);
        let _ = std::fs::remove_file(p.path().join("link"));
        common::mkfifo(&fifo);
        std::os::unix::fs::symlink("pipe", p.path().join("link")).unwrap();
        // The reader: blocks until a writer opens the FIFO, then reads to its end.
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        let done = p.run_within(&["report", "--out", out], 60);
        assert_eq!(done.status.code(), Some(0), "{out}: {}", stderr(&done));
        let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(kind.is_fifo(), "{out}: the FIFO was replaced by a {kind:?}");
        assert!(std::fs::symlink_metadata(p.path().join("link")).unwrap().file_type().is_symlink(), "{out}");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !reader.is_finished() {
            assert!(std::time::Instant::now() < until, "{out}: nothing was written into the FIFO");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(reader.join().unwrap().contains("</html>"), "{out}: the FIFO's reader got no report");
    }
    // A folder is refused; a regular file is replaced by the report.
    std::fs::create_dir(p.path().join("dir")).unwrap();
    let out = p.run(&["report", "--out", "dir"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is a folder"), "{}", stderr(&out));
    p.write("old.html", "old");
    assert_eq!(p.run(&["report", "--out", "old.html"]).status.code(), Some(0));
    assert!(p.read("old.html").contains("</html>"));
}

/// Before, a file or folder the user names for a command's own output
/// (`report --out`, `export tensorboard DIR`, `pack freeze --out`, `schema
/// --out`) was written wherever it pointed, the workspace included:
/// `report --out .orchestrate/objects/…/score.txt` replaced a stored object
/// with HTML (`verify`: `CORRUPT … no longer hashes to its name`), and
/// `report --out .orchestrate/cache.sqlite` replaced the index (`status`:
/// `file is not a database`). Each is refused now (exit 2), in any
/// workspace, and nothing in it changes.
#[test]
fn nothing_a_command_writes_for_the_user_goes_into_a_workspace() {
    let p = Project::new();
    p.write("s.yaml", "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'mkdir -p res && echo 42 > res/score.txt', outs: [res]}\n");
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    // Another workspace beside it, of another name.
    assert_eq!(p.run(&["run", "s.yaml", "--workspace", "other"]).status.code(), Some(0));
    let object = common::tree_of(&p.path().join(".orchestrate/objects"))
        .into_keys()
        .find(|k| k.ends_with("score.txt"))
        .expect("a stored file");
    let object = format!(".orchestrate/objects/{object}");
    let before = (common::tree_of(&p.path().join(".orchestrate")), common::tree_of(&p.path().join("other")));
    let attempts: [&[&str]; 8] = [
        &["report", "--out", &object],
        &["report", "--out", ".orchestrate/cache.sqlite"],
        &["report", "--out", "other/new.html"],
        &["report", "--out", "./.orchestrate/../.orchestrate/r.html"],
        &["export", "tensorboard", "s.yaml", ".orchestrate/tb"],
        &["pack", "freeze", "s.yaml", "--out", "other/pack"],
        &["schema", "--out", ".orchestrate"],
        &["schema", "--out", "other/schemas"],
    ];
    for args in attempts {
        let o = p.run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains("inside the orchestrate workspace"), "{args:?}: {}", stderr(&o));
    }
    let after = (common::tree_of(&p.path().join(".orchestrate")), common::tree_of(&p.path().join("other")));
    let changed: Vec<&String> = after.0.keys().filter(|k| before.0.get(*k) != after.0.get(*k)).collect();
    assert!(changed.iter().all(|k| k.starts_with("specs/") || k.starts_with("cache.sqlite")), "{changed:?}");
    assert_eq!(after.1.keys().collect::<Vec<_>>(), before.1.keys().collect::<Vec<_>>(), "the other workspace");
    let o = p.run(&["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

/// Before, `run -j 0` ran with one job and `push -j 0` (or `remote.jobs:
/// 0` in the workspace config) with one transfer, without a word: a user who meant "no limit" (as `xargs -P 0`) or made a
/// typo got neither. A count of 0 is refused as a usage error (exit 2),
/// naming the option and what it takes, and nothing runs.
#[test]
fn a_job_count_of_zero_is_refused_naming_the_option() {
    let p = Project::new();
    p.write("s.yaml", ONE);
    for args in [&["run", "s.yaml", "-j", "0"][..], &["run", "s.yaml", "--jobs", "0"], &["push", "s.yaml", "-j", "0"]] {
        let o = p.run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains("'0'") && stderr(&o).contains("--jobs"), "{args:?}: {}", stderr(&o));
    }
    assert!(!p.path().join("a.txt").exists(), "a node ran");
    // The workspace config's `remote.jobs: 0` likewise, naming the file and field.
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    let remote = tempfile::tempdir().unwrap();
    p.write(".orchestrate/config.yaml", &format!("remote:\n  url: file://{}\n  jobs: 0\n", remote.path().display()));
    let o = p.run(&["push", "s.yaml"]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("config.yaml: field remote.jobs"), "{}", stderr(&o));
}

//! A closed stdout (`orchestrate run SPEC | head -1`) never stops or fails a
//! run, and no command panics on it.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::{stdout, Project};

/// 40 independent shell nodes, each a little slow, so the reader is gone long before the end.
fn spec() -> String {
    let mut s = String::from("name: many\nnodes:\n");
    for i in 0..40 {
        s.push_str(&format!(
            "  n{i}:\n    op: shell\n    params: {{cmd: 'sleep 0.02 && echo {i} > o{i}.txt', outs: [o{i}.txt]}}\n"
        ));
    }
    s
}

/// Runs `args` with stdout read for one line and then closed, as `| head -1` does.
fn with_head_1(p: &Project, args: &[&str]) -> (Option<i32>, String) {
    let mut child = p.cmd(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    // The reader is dropped here: the pipe is closed.
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_run_whose_stdout_is_closed_finishes_every_node_and_exits_0() {
    let p = Project::new();
    p.write("spec.yaml", &spec());
    for args in [&["run", "spec.yaml", "--jobs", "2"][..], &["run", "spec.yaml", "--jobs", "2", "--json"][..]] {
        let (code, err) = with_head_1(&p, args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Everything ran and is cached: the closed pipe stopped nothing.
    let plan = stdout(&p.run(&["plan", "spec.yaml"]));
    assert!(plan.contains("40 cached, 0 to run"), "{plan}");
    for i in 0..40 {
        assert_eq!(p.read(&format!("o{i}.txt")).trim(), i.to_string());
    }
}

#[test]
fn status_and_plan_do_not_panic_on_a_closed_stdout() {
    let p = Project::new();
    p.write("spec.yaml", &spec());
    assert_eq!(p.run(&["run", "spec.yaml"]).status.code(), Some(0));
    for args in [&["status"][..], &["plan", "spec.yaml"][..], &["ops"][..]] {
        let (code, err) = with_head_1(&p, args);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(code, Some(0), "{args:?}: {err}");
    }
}

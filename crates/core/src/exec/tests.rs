//! The scheduler and its cache decisions in-process, with a fake op and an
//! executor that records what it was handed: no binary, no libtorch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::node::{DirtyReason, Executor, Local, NodeJob, NodeObserver, Outcome, ToRun};
use super::{run_with, Event, Reporter, RunOptions};
use crate::dag::{compile, Dag};
use crate::ops::{Op, OpError, OutputDecl, Registry, RunContext};
use crate::spec::{LoadOptions, Spec};
use crate::store::{NodeOutcome, Workspace};

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EchoParams {
    text: String,
    #[serde(default)]
    fail: bool,
    /// Panics instead of returning, as a defect in an op's code would.
    #[serde(default)]
    panic: bool,
    /// Panics while the node is keyed (asked for its interpreters), which
    /// the scheduler's own thread does for a node it can decide at once.
    #[serde(default)]
    panic_keying: bool,
}

/// Writes `text` and then every input's bytes to its output `out`; fails when asked to.
struct Echo {
    runs: Arc<AtomicUsize>,
}

impl Op for Echo {
    fn name(&self) -> &'static str {
        "test.echo"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "a fake op"
    }
    type Params = EchoParams;
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("out")]
    }
    fn interpreters(&self, p: &Self::Params) -> Vec<String> {
        if p.panic_keying {
            panic!("asked to panic while keying");
        }
        Vec::new()
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if p.fail {
            return Err(OpError::Failed("asked to fail".into()));
        }
        if p.panic {
            panic!("asked to panic");
        }
        let mut bytes = p.text.clone().into_bytes();
        for artifacts in ctx.inputs.values() {
            for a in artifacts {
                bytes.extend(std::fs::read(&a.path).map_err(|e| OpError::io("reading an input", e))?);
            }
        }
        std::fs::write(ctx.output_path("out"), bytes).map_err(|e| OpError::io("writing out", e))
    }
}

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadDepParams {
    file: String,
    /// Append to the file after the key was computed, before reading it, as
    /// an edit during the run would.
    #[serde(default)]
    edit: bool,
    /// Read it as a stream through an open file, then check that file
    /// (as `dataset.import` parses a table), instead of reading it whole.
    #[serde(default)]
    stream: bool,
}

/// Reads its file dep itself (as the gate op reads its gate file) into `out`.
struct ReadDep;

impl Op for ReadDep {
    fn name(&self) -> &'static str {
        "test.readdep"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "a fake op that reads a file dep"
    }
    type Params = ReadDepParams;
    fn file_deps(&self, p: &Self::Params, _spec_dir: &Path) -> Vec<String> {
        vec![p.file.clone()]
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("out")]
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let path = ctx.spec_dir.join(&p.file);
        if p.edit {
            let mut text = std::fs::read_to_string(&path).unwrap();
            text.push_str(" edited");
            std::fs::write(&path, text).unwrap();
        }
        let bytes = if p.stream {
            let mut file = std::fs::File::open(&path).unwrap();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes).unwrap();
            ctx.check_keyed_open_file(&p.file, &file)?;
            bytes
        } else {
            ctx.read_keyed_file(&p.file, &path, 1 << 20)?
        };
        std::fs::write(ctx.output_path("out"), bytes).map_err(|e| OpError::io("writing out", e))
    }
}

/// Local execution, recording each node it was handed and why.
#[derive(Default)]
struct Recording {
    handed: Mutex<Vec<(String, DirtyReason)>>,
    /// The run's status in the history as each node was handed over.
    statuses: Mutex<Vec<Option<String>>>,
}

impl Executor for Recording {
    fn execute(&self, job: &NodeJob<'_>, run: &ToRun<'_>, observer: &mut dyn NodeObserver) -> Outcome {
        self.handed.lock().unwrap().push((job.node.id().to_string(), run.reason.clone()));
        let runs = job.index.recent_runs(usize::MAX >> 1).unwrap();
        let status = runs.into_iter().find(|r| r.run_id == job.run_id).map(|r| r.status);
        self.statuses.lock().unwrap().push(status);
        Local.execute(job, run, observer)
    }
}

struct Quiet;

impl Reporter for Quiet {
    fn on_event(&mut self, _event: &Event) {}
}

struct World {
    dir: tempfile::TempDir,
    ws: Workspace,
    runs: Arc<AtomicUsize>,
    /// The last run's id and [`Recording::statuses`].
    last: Mutex<(String, Vec<Option<String>>)>,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(&dir.path().join(".orchestrate")).unwrap();
        World { dir, ws, runs: Arc::new(AtomicUsize::new(0)), last: Mutex::default() }
    }

    fn compile(&self, yaml: &str) -> (Spec, Dag) {
        let path = self.dir.path().join("spec.yaml");
        std::fs::write(&path, yaml).unwrap();
        let spec = crate::spec::load(&path, &LoadOptions::default()).expect("the spec loads");
        let mut registry = Registry::builtin();
        registry.register(Arc::new(Echo { runs: Arc::clone(&self.runs) }));
        registry.register(Arc::new(ReadDep));
        let dag = compile(&spec, &registry).expect("the spec compiles");
        (spec, dag)
    }

    /// Runs the spec through a recording executor: (what it was handed, outcomes by node).
    fn run(&self, yaml: &str, force: &[&str]) -> (Vec<(String, DirtyReason)>, BTreeMap<String, Outcome>) {
        let (spec, dag) = self.compile(yaml);
        let opts = RunOptions {
            jobs: 2,
            force: force.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
            env: Box::new(|| Err("no numerical node here".into())),
            argv: "test".into(),
            slurm: None,
            remote: None,
            drop_states: false,
        };
        let executor = Recording::default();
        // Runs defer their syncs process-wide; the test counting them runs alone.
        let _serial = crate::store::objects::DEFERRED_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let result = run_with(&self.ws, &spec, &dag, &opts, &executor, &mut Quiet).expect("the run completes");
        *self.last.lock().unwrap() = (result.run_id.clone(), executor.statuses.into_inner().unwrap());
        let mut handed = executor.handed.into_inner().unwrap();
        handed.sort_by(|a, b| a.0.cmp(&b.0));
        (handed, result.outcomes)
    }

    fn output(&self, outcome: &Outcome) -> String {
        let outputs = match outcome {
            Outcome::Ran { outputs, .. } | Outcome::Cached { outputs, .. } => outputs,
            other => panic!("no outputs: {other:?}"),
        };
        std::fs::read_to_string(self.ws.object_path(&outputs[0].object.hash)).unwrap()
    }
}

fn chain(b_text: &str, c_fail: bool) -> String {
    format!(
        "name: t\nnodes:\n  a:\n    op: test.echo\n    params: {{text: 'A'}}\n  b:\n    op: test.echo\n    inputs: {{x: 'a:out'}}\n    params: {{text: '{b_text}'}}\n  c:\n    op: test.echo\n    inputs: {{x: 'b:out'}}\n    params: {{text: 'C', fail: {c_fail}}}\n  d:\n    op: test.echo\n    inputs: {{x: 'c:out'}}\n    params: {{text: 'D'}}\n"
    )
}

fn names(handed: &[(String, DirtyReason)]) -> Vec<&str> {
    handed.iter().map(|(n, _)| n.as_str()).collect()
}

/// A run is in the history, as running, before its first node runs; a run
/// of cache hits alone, which writes nothing else, is recorded once as it
/// ends; either way the history holds it, its nodes and its events.
#[test]
fn a_run_is_recorded_before_its_first_node_and_a_run_of_hits_when_it_ends() {
    let w = World::new();
    for (handed, statuses) in [(4, vec![Some("running".to_string()); 4]), (0, vec![])] {
        let (ran, _) = w.run(&chain("B", false), &[]);
        let (run_id, seen) = w.last.lock().unwrap().clone();
        assert_eq!((ran.len(), seen), (handed, statuses));
        let index = w.ws.index().unwrap();
        let row = index.recent_runs(1).unwrap().remove(0);
        assert_eq!((row.run_id.as_str(), row.status.as_str()), (run_id.as_str(), "ok"));
        assert!(row.finished_at.as_ref().is_some_and(|f| *f >= row.started_at), "{row:?}");
        let outcomes: Vec<NodeOutcome> = index.run_nodes(&run_id).unwrap().iter().map(|n| n.outcome).collect();
        let expected = if handed == 0 { NodeOutcome::Cached } else { NodeOutcome::Ran };
        assert_eq!(outcomes, vec![expected; 4]);
        // Started, each node started and finished or a cache hit, finished.
        let events = if handed == 0 { 1 + 4 + 1 } else { 1 + 8 + 1 };
        assert_eq!(index.run_events(&run_id).unwrap().len(), events);
    }
    assert_eq!(w.ws.index().unwrap().recent_runs(10).unwrap().len(), 2);
}

#[test]
fn the_executor_is_handed_only_what_must_run_with_the_reason_decided_once() {
    let w = World::new();
    let (handed, outcomes) = w.run(&chain("B", false), &[]);
    assert_eq!(names(&handed), ["a", "b", "c", "d"]);
    assert!(handed.iter().all(|(_, r)| *r == DirtyReason::New), "{handed:?}");
    assert_eq!(w.output(&outcomes["d"]), "DCBA");
    assert_eq!(w.runs.load(Ordering::SeqCst), 4);

    // Nothing changed: every node is a cache hit, and the executor sees none.
    let (handed, outcomes) = w.run(&chain("B", false), &[]);
    assert!(handed.is_empty(), "{handed:?}");
    assert!(outcomes.values().all(|o| matches!(o, Outcome::Cached { .. })));
    assert_eq!(w.runs.load(Ordering::SeqCst), 4);

    // One param changed: that node runs, naming the field; its descendants run
    // because their input's bytes changed.
    let (handed, _) = w.run(&chain("b", false), &[]);
    assert_eq!(names(&handed), ["b", "c", "d"]);
    match &handed[0].1 {
        DirtyReason::Changed(changes) => {
            assert_eq!(changes.len(), 1, "{changes:?}");
            assert_eq!(changes[0].field, "params.text");
        }
        other => panic!("b should run because params.text changed, not {other:?}"),
    }
    assert!(matches!(&handed[1].1, DirtyReason::Changed(c) if c.iter().all(|c| c.field.starts_with("inputs."))));

    // Forced: handed over as forced, though cached.
    let (handed, _) = w.run(&chain("b", false), &["a"]);
    assert_eq!(handed, [("a".to_string(), DirtyReason::Forced)]);
}

#[test]
fn a_failure_skips_the_subtree_and_a_rerun_says_in_which_run_it_failed() {
    let w = World::new();
    let (_, outcomes) = w.run(&chain("B", true), &[]);
    assert!(matches!(&outcomes["c"], Outcome::Failed { error, .. } if error.contains("asked to fail")));
    assert!(matches!(&outcomes["d"], Outcome::Skipped { because } if because == "'c' failed"));
    let (handed, _) = w.run(&chain("B", true), &[]);
    assert_eq!(names(&handed), ["c"]);
    assert!(
        matches!(&handed[0].1, DirtyReason::FailedIn { error, .. } if error.contains("asked to fail")),
        "{handed:?}"
    );
}

/// A panic in a node's code (a defect of ours: an index out of range, an
/// unwrap) fails that node, naming the panic, and the run ends as after any
/// failure. Before, the job thread died without reporting, and the run
/// waited for it for ever ("interrupted or running" in `status`).
#[test]
fn a_panic_in_a_node_fails_that_node_and_the_run_ends() {
    let w = World::new();
    let spec = "name: t\nnodes:\n  a:\n    op: test.echo\n    params: {text: 'A', panic: true}\n  b:\n    op: test.echo\n    inputs: {x: 'a:out'}\n    params: {text: 'B'}\n  c:\n    op: test.echo\n    params: {text: 'C'}\n";
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = tx.send(w.run(spec, &[]).1);
        });
        let outcomes = match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(o) => o,
            Err(_) => {
                eprintln!("the run still waited after 60 s on a node whose code panicked");
                std::process::abort();
            }
        };
        assert!(
            matches!(&outcomes["a"], Outcome::Failed { error, .. } if error.contains("panicked") && error.contains("asked to panic")),
            "{:?}",
            outcomes["a"]
        );
        assert!(
            matches!(&outcomes["b"], Outcome::Skipped { because } if because == "'a' failed"),
            "{:?}",
            outcomes["b"]
        );
        assert!(matches!(&outcomes["c"], Outcome::Ran { .. }), "{:?}", outcomes["c"]);
        let index = w.ws.index().unwrap();
        assert_eq!(index.recent_runs(1).unwrap()[0].status, "failed");
    });
}

/// The same for a panic in the code that keys a node, which runs in the
/// scheduler's own thread for a node it can decide at once (a plain cache
/// hit): before, that panic ended the whole run (exit 101 in the CLI, the run
/// left "running"), the nodes beside it with it; now it fails that node alone.
#[test]
fn a_panic_while_keying_a_node_fails_that_node_alone() {
    let w = World::new();
    let spec = "name: t\nnodes:\n  a:\n    op: test.echo\n    params: {text: 'A', panic_keying: true}\n  b:\n    op: test.echo\n    inputs: {x: 'a:out'}\n    params: {text: 'B'}\n  c:\n    op: test.echo\n    params: {text: 'C'}\n";
    let outcomes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run(spec, &[]).1))
        .unwrap_or_else(|_| panic!("the run itself panicked, taking every node with it"));
    assert!(
        matches!(&outcomes["a"], Outcome::Failed { error, .. } if error.contains("panicked") && error.contains("asked to panic while keying")),
        "{:?}",
        outcomes["a"]
    );
    assert!(matches!(&outcomes["b"], Outcome::Skipped { because } if because == "'a' failed"), "{:?}", outcomes["b"]);
    assert!(matches!(&outcomes["c"], Outcome::Ran { .. }), "{:?}", outcomes["c"]);
    assert_eq!(w.ws.index().unwrap().recent_runs(1).unwrap()[0].status, "failed");
}

/// An op that reads a file dep itself gets the bytes its key holds, or an
/// error: a file edited after the key was computed and before the op read
/// it would otherwise give a result stored under a key naming other bytes.
#[test]
fn a_file_dep_an_op_reads_itself_must_hold_the_bytes_its_key_was_computed_with() {
    for stream in [false, true] {
        let w = World::new();
        std::fs::write(w.dir.path().join("crit.txt"), "criteria").unwrap();
        let spec = |edit: bool| {
            format!("name: t\nnodes:\n  r:\n    op: test.readdep\n    params: {{file: crit.txt, edit: {edit}, stream: {stream}}}\n")
        };
        let (_, outcomes) = w.run(&spec(false), &[]);
        assert_eq!(w.output(&outcomes["r"]), "criteria");
        let (_, outcomes) = w.run(&spec(true), &[]);
        assert!(
            matches!(&outcomes["r"], Outcome::Failed { error, .. } if error.contains("'crit.txt' changed while the run was under way")),
            "stream {stream}: {:?}",
            outcomes["r"]
        );
        // Run again: the key now holds the edited bytes, and they are read.
        let (_, outcomes) = w.run(&spec(false), &[]);
        assert_eq!(w.output(&outcomes["r"]), "criteria edited");
    }
}

#[test]
fn an_output_deleted_from_the_store_makes_its_node_run_again() {
    let w = World::new();
    let (_, outcomes) = w.run(&chain("B", false), &[]);
    let Outcome::Ran { outputs, .. } = &outcomes["a"] else { panic!() };
    let object = w.ws.object_path(&outputs[0].object.hash);
    crate::store::objects::remove_any(&object).unwrap();
    assert!(!Path::new(&object).exists());
    let (handed, _) = w.run(&chain("B", false), &[]);
    // a's bytes come back identical, so b, c and d stay cached.
    assert_eq!(names(&handed), ["a"]);
    assert!(matches!(&handed[0].1, DirtyReason::OutputsInvalid(_)), "{handed:?}");
}

#[test]
fn cpu_slots_bound_the_numerical_nodes_running_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let slots = super::node::CpuSlots::default();
    let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                let _slot = slots.acquire(1, 2);
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(30));
                now.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    assert_eq!(most.load(Ordering::SeqCst), 2, "six nodes, two slots: two at a time, never more");
}

/// (Issue #36.) Two processes' slots are one machine's: two `CpuSlots` on the
/// same folder (each lock file opened apart, as two processes open it) never
/// hold more cores together than there are.
#[test]
fn the_machines_cpu_slots_bound_the_nodes_of_every_process_together() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (super::node::CpuSlots::in_dir(dir.path().into()), super::node::CpuSlots::in_dir(dir.path().into()));
    let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for (i, threads) in [1, 1, 2, 1, 1, 2].into_iter().enumerate() {
            let slots = if i % 2 == 0 { &a } else { &b };
            let (now, most) = (&now, &most);
            s.spawn(move || {
                let _slot = slots.acquire(threads, 3);
                let n = now.fetch_add(threads, Ordering::SeqCst) + threads;
                most.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(60));
                now.fetch_sub(threads, Ordering::SeqCst);
            });
        }
    });
    let most = most.load(Ordering::SeqCst);
    assert!((2..=3).contains(&most), "at most 3 cores held at once, and some at once: {most}");
    // A folder that is a link is not used.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    assert!(crate::store::fsx::checked_machine_dir(link).unwrap_err().to_string().contains("not a folder"));
    assert_eq!(crate::store::fsx::checked_machine_dir(dir.path().join("new")).unwrap(), dir.path().join("new"), "made");
}

#[test]
fn a_node_with_more_threads_holds_more_cores() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let slots = super::node::CpuSlots::default();
    let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        // On 4 cores: one node of 3 threads and three of 1 never exceed 4 threads.
        for threads in [3, 1, 1, 1] {
            let (slots, now, most) = (&slots, &now, &most);
            s.spawn(move || {
                let _slot = slots.acquire(threads, 4);
                let n = now.fetch_add(threads, Ordering::SeqCst) + threads;
                most.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(30));
                now.fetch_sub(threads, Ordering::SeqCst);
            });
        }
    });
    assert!(most.load(Ordering::SeqCst) <= 4, "{}", most.load(Ordering::SeqCst));
    // More threads than cores: it runs, alone.
    drop(slots.acquire(16, 4));
}

/// (Issue #36.) A plain cache hit is decided in the scheduler's own thread
/// (`early`), with no hand-off to a job thread; a forced node, and one with
/// much to hash, are left to a job thread as before; any other node is handed
/// its record, computed once.
#[test]
fn a_plain_hit_is_decided_early_and_a_node_with_much_to_hash_is_left_to_a_job_thread() {
    use super::node::{early, Early};
    let w = World::new();
    std::fs::write(w.dir.path().join("small.txt"), "x").unwrap();
    std::fs::File::create(w.dir.path().join("big.bin")).unwrap().set_len(17 << 20).unwrap();
    let yaml = "name: t\nnodes:\n  a:\n    op: test.echo\n    params: {text: 'A'}\n  small:\n    op: shell\n    params: {cmd: 'cat small.txt > s.out', deps: [small.txt], outs: [s.out]}\n  big:\n    op: shell\n    params: {cmd: 'true', deps: [big.bin], outs: [b.out]}\n";
    w.run("name: t\nnodes:\n  a:\n    op: test.echo\n    params: {text: 'A'}\n", &[]);
    let (spec, dag) = w.compile(yaml);
    let index = w.ws.index().unwrap();
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let upstream = BTreeMap::new();
    let early_for = |id: &str, force: bool| {
        let node = &dag.nodes[dag.position(id).unwrap()];
        early(&NodeJob {
            ws: &w.ws,
            index: &index,
            node,
            spec_name: &spec.name,
            spec_profile: None,
            spec_dir: &spec.base_dir,
            run_id: "r",
            upstream: &upstream,
            env: None,
            force,
            cancel: &cancel,
            cpu: None,
            remote: None,
        })
    };
    assert!(matches!(early_for("a", false), Early::Done(Outcome::Cached { .. })));
    assert!(matches!(early_for("a", true), Early::Unknown));
    assert!(matches!(early_for("small", false), Early::Decided(d) if d.record.files.contains_key("small.txt")));
    assert!(matches!(early_for("big", false), Early::Unknown), "17 MiB to hash is left to a job thread");
}

/// A hit's outputs are those the check left: an out rewritten with the same
/// bytes (new inode and mtime) is a hit whose record carries its new stat, as
/// the index row does; looked at through a read-only view, nothing changes.
#[test]
fn a_rewritten_out_is_a_hit_carrying_its_new_stat_and_a_read_only_look_changes_nothing() {
    use crate::store::FileStat;
    let w = World::new();
    let yaml = "name: t\nnodes:\n  s:\n    op: shell\n    params: {cmd: 'echo x > o.txt', outs: [o.txt]}\n";
    let (_, outcomes) = w.run(yaml, &[]);
    let Outcome::Ran { key, outputs, .. } = &outcomes["s"] else { panic!("s ran: {:?}", outcomes["s"]) };
    let out = w.dir.path().join("o.txt");
    std::fs::remove_file(&out).unwrap();
    std::fs::write(&out, "x\n").unwrap();
    let now = FileStat::of(&out).unwrap();
    assert_ne!(outputs[0].stat.as_ref(), Some(&now), "the rewrite gave the out a new stat");
    let index = w.ws.index().unwrap();
    let stat_in_row = |index: &crate::store::Index| index.lookup(key).unwrap().unwrap().outputs[0].stat;

    let view = w.ws.read_only_view();
    let seen = super::node::cached_valid(&view, &view.index().unwrap(), w.dir.path(), key).unwrap();
    assert_eq!(seen.expect("still a hit")[0].stat.as_ref(), Some(&now));
    assert_eq!(stat_in_row(&index), outputs[0].stat, "a read-only look refreshes no row");

    let hit = super::node::cached_valid(&w.ws, &index, w.dir.path(), key).unwrap().expect("still a hit");
    assert_eq!(hit[0].stat.as_ref(), Some(&now), "the hit carries the stat the check found");
    assert_eq!(stat_in_row(&index).as_ref(), Some(&now), "and the row was refreshed to it");
}

/// Why a cached out is not a hit comes back typed: what happened to it, and
/// where, with the message `run` prints for it.
#[test]
fn why_a_cached_out_is_no_hit_is_a_typed_problem() {
    use crate::store::OutputProblem;
    let w = World::new();
    let yaml = "name: t\nnodes:\n  s:\n    op: shell\n    params: {cmd: 'echo x > o.txt', outs: [o.txt]}\n";
    let (_, outcomes) = w.run(yaml, &[]);
    let Outcome::Ran { key, .. } = &outcomes["s"] else { panic!("s ran: {:?}", outcomes["s"]) };
    let index = w.ws.index().unwrap();
    let problem = |index: &crate::store::Index| {
        super::node::cached_valid(&w.ws, index, w.dir.path(), key).unwrap().expect_err("not a hit").expect("cached")
    };
    std::fs::write(w.dir.path().join("o.txt"), "yz\n").unwrap();
    let modified = problem(&index);
    assert_eq!(modified, OutputProblem::Modified { path: "o.txt".into(), what: "size 2 → 3".into() });
    assert_eq!(modified.to_string(), "output 'o.txt' was modified (size 2 → 3)");
    std::fs::write(w.dir.path().join("o.txt"), "y\n").unwrap();
    assert_eq!(problem(&index), OutputProblem::Modified { path: "o.txt".into(), what: "content changed".into() });
    std::fs::remove_file(w.dir.path().join("o.txt")).unwrap();
    assert_eq!(problem(&index), OutputProblem::Missing { path: "o.txt".into() });
}

/// A wait for CPU slots that another process (or node) holds ends when the
/// run is interrupted: before, Ctrl-C waited until those slots were free,
/// as long as another run's training node took.
#[test]
fn a_wait_for_cpu_slots_ends_when_the_run_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let shared = (super::node::CpuSlots::in_dir(dir.path().into()), super::node::CpuSlots::in_dir(dir.path().into()));
    let own = super::node::CpuSlots::default();
    for (holder, waiter) in [(&shared.0, &shared.1), (&own, &own)] {
        let _held = holder.acquire(2, 2);
        let asked = std::time::Instant::now();
        let stop = || asked.elapsed() > std::time::Duration::from_millis(150);
        let got = waiter.acquire_until(1, 2, &stop);
        assert!(got.is_none(), "a slot was handed out while both were held");
        assert!(asked.elapsed() < std::time::Duration::from_secs(2), "the wait went on: {:?}", asked.elapsed());
    }
    // Free slots are taken whatever `stop` says later.
    assert!(own.acquire_until(2, 2, &|| true).is_some());
}

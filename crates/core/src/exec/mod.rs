//! The scheduler: runs a [`Dag`]'s nodes in dependency order, independent ones
//! in parallel up to `jobs`, and reports through [`Event`]s only.
//!
//! A node becomes ready when every node it reads has resolved; its key is
//! computed then (keys need the upstream outputs' content hashes). A failed
//! node skips its descendants; every other node still runs.

pub mod check;
pub mod events;
pub mod node;
pub mod plan;
pub mod report;
pub mod run_events;
pub mod signal;
pub mod slurm;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use events::{Event, RunStats};
pub use node::{Decision, DirtyReason, Executor, Local, Outcome};
pub use report::Reporter;

use crate::dag::key::EnvPart;
use crate::dag::Dag;
use crate::spec::Spec;
use crate::store::{now_rfc3339, Key, NodeOutcome, OutputRecord, RunNodeRow, RunOutput, RunRow, StoreError, Workspace};

pub use crate::runtime::EnvProvider;

/// How to run.
pub struct RunOptions {
    pub jobs: usize,
    /// Node ids to run even if cached.
    pub force: BTreeSet<String>,
    pub env: EnvProvider,
    /// The command line, recorded with the run.
    pub argv: String,
    /// How jobs are submitted when the spec's executor is `slurm` (default:
    /// this executable, polling every 2 s).
    pub slurm: Option<slurm::SlurmSettings>,
    /// A shared remote cache consulted on a local miss, before a node runs.
    pub remote: Option<crate::remote::Remote>,
    /// Drop each training state (a `state` output) once every node that
    /// reads it has finished (`run --drop-states`): what makes the protocol
    /// at the real scale fit a 64 GB disk. A later run that needs one runs
    /// its node again.
    pub drop_states: bool,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub run_id: String,
    pub stats: RunStats,
    pub outcomes: BTreeMap<String, Outcome>,
    /// Why the run's record (its end, node outcomes and events) could not be
    /// committed to the index, e.g. a full disk. The nodes' own results were
    /// committed as each finished; the caller decides what this costs.
    pub unrecorded: Option<String>,
    /// A signal stopped the run: what finished is cached, the rest did not run.
    pub interrupted: bool,
    /// With `drop_states`: each node whose state was dropped, and the bytes freed.
    pub dropped_states: Vec<(String, u64)>,
    /// With `drop_states`: a state that could not be dropped, and why (the run goes on).
    pub drop_errors: Vec<String>,
}

impl RunResult {
    /// How many gates failed in this run's gate nodes (ran or cached). A gate
    /// report that cannot be read is an error naming the node and the file:
    /// it must never count as passed. A gate node that failed or was skipped
    /// is already a failed run, and is not counted here.
    pub fn failed_gates(&self, ws: &Workspace, dag: &Dag) -> Result<usize, crate::gate::GateError> {
        use crate::ops::gate::GateOp;
        let mut failed = 0;
        for node in dag.nodes.iter().filter(|n| n.op.name() == GateOp::NAME) {
            let outputs = match self.outcomes.get(node.id()) {
                Some(Outcome::Ran { outputs, .. }) | Some(Outcome::Cached { outputs, .. }) => outputs,
                _ => continue,
            };
            let (node, output) = (node.id().to_string(), GateOp::REPORT.to_string());
            let Some(out) = outputs.iter().find(|o| o.name == GateOp::REPORT) else {
                return Err(crate::gate::GateError::NoReport { node, output });
            };
            let report = crate::gate::GateReport::read(&ws.object_path(&out.object.hash))
                .map_err(|e| crate::gate::GateError::InNode { node, output, source: Box::new(e) })?;
            failed += report.failed();
        }
        Ok(failed)
    }
}

enum Msg {
    Event(Event),
    Done(usize, Outcome),
}

struct Observer<'a> {
    tx: &'a mpsc::Sender<Msg>,
    node: String,
}

impl node::NodeObserver for Observer<'_> {
    fn started(&mut self, key: &Key, reason: &str) {
        let _ = self.tx.send(Msg::Event(Event::NodeStarted {
            node: self.node.clone(),
            key: key.clone(),
            reason: reason.to_string(),
        }));
    }
    fn waiting(&mut self, key: &Key, reason: &str) {
        let _ = self.tx.send(Msg::Event(Event::Waiting {
            node: self.node.clone(),
            key: key.clone(),
            reason: reason.to_string(),
        }));
    }
}

/// Refuses a DAG one of whose outs holds the workspace or lies inside it
/// (`--workspace` inside an out, or a run started in an out's folder),
/// before anything runs, restores or is removed.
pub(crate) fn refuse_outs_over_workspace(ws: &Workspace, spec: &Spec, dag: &Dag) -> Result<(), StoreError> {
    let mut shell = dag.nodes.iter().filter(|n| n.tree_outs().next().is_some()).peekable();
    if shell.peek().is_none() {
        return Ok(());
    }
    let beside = crate::store::fsx::OutsBeside::new(&spec.base_dir, ws.root())
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    for node in shell {
        beside.check(node.tree_outs()).map_err(|e| StoreError::Invalid(format!("node '{}': {e}", node.id())))?;
    }
    Ok(())
}

/// A fresh run id: UTC time and process id, readable and unique on a machine.
pub fn new_run_id() -> String {
    let t = now_rfc3339().replace(['-', ':'], "");
    format!("{}-{}", t.trim_end_matches('Z').replace('.', ""), std::process::id())
}

/// Runs every node of the DAG with the spec's executor: this machine, or
/// Slurm (with one poller thread for the queue, stopped when the run ends).
pub fn run(
    ws: &Workspace,
    spec: &Spec,
    dag: &Dag,
    opts: &RunOptions,
    reporter: &mut dyn Reporter,
) -> Result<RunResult, StoreError> {
    if spec.executor != crate::spec::ExecutorKind::Slurm {
        return run_with(ws, spec, dag, opts, &node::Local, reporter);
    }
    let settings = opts.slurm.clone().unwrap_or_default();
    let tracker = slurm::Tracker::default();
    std::thread::scope(|scope| {
        let poller = scope.spawn(|| tracker.run(settings.poll));
        let executor = slurm::SlurmRun { settings: &settings, tracker: &tracker, spec };
        let result = run_with(ws, spec, dag, opts, &executor, reporter);
        tracker.stop();
        let _ = poller.join();
        result
    })
}

/// Runs every node of the DAG, handing each node that is not a cache hit to
/// `executor`. The scheduler alone decides hit or run (and why), keeps the
/// dependency order, the `jobs` limit and the run record.
/// What every node's job in one run shares: one place builds a job, for the
/// scheduler deciding a hit early and for the job threads alike.
struct RunShared<'a> {
    ws: &'a Workspace,
    spec: &'a Spec,
    opts: &'a RunOptions,
    run_id: &'a str,
    cancel: &'a AtomicBool,
    cpu: &'a node::CpuSlots,
}

impl<'a> RunShared<'a> {
    fn job<'b>(
        &'b self,
        index: &'b crate::store::Index,
        node: &'b crate::dag::DagNode,
        upstream: &'b BTreeMap<String, Vec<OutputRecord>>,
        env: Option<EnvPart>,
    ) -> node::NodeJob<'b>
    where
        'a: 'b,
    {
        node::NodeJob {
            ws: self.ws,
            index,
            node,
            spec_name: &self.spec.name,
            spec_profile: self.spec.profile.as_deref(),
            spec_dir: &self.spec.base_dir,
            run_id: self.run_id,
            upstream,
            env,
            force: self.opts.force.contains(node.id()),
            cancel: self.cancel,
            cpu: Some(self.cpu),
            remote: self.opts.remote.as_ref(),
        }
    }
}

pub fn run_with(
    ws: &Workspace,
    spec: &Spec,
    dag: &Dag,
    opts: &RunOptions,
    executor: &dyn Executor,
    reporter: &mut dyn Reporter,
) -> Result<RunResult, StoreError> {
    let started = Instant::now();
    refuse_outs_over_workspace(ws, spec, dag)?;
    let run_id = new_run_id();
    // One syncfs when the run ends instead of fsyncs per node (see DeferredSync).
    let deferred = crate::store::objects::DeferredSync::start(ws.root());
    let mut index = ws.index()?;
    // The run is recorded as started when its first node needs more than a
    // cache hit (before anything runs, restores or is fetched); a run of
    // hits alone is recorded once, when it finishes: one write, not two.
    let run_row = RunRow {
        run_id: run_id.clone(),
        spec: spec.name.clone(),
        profile: spec.profile.clone(),
        started_at: now_rfc3339(),
        finished_at: None,
        status: "running".into(),
        summary: None,
    };
    let mut recorded = false;
    let mut log: Vec<(u64, String)> = Vec::new();
    let emit = |e: Event, reporter: &mut dyn Reporter, log: &mut Vec<(u64, String)>| {
        reporter.on_event(&e);
        log.push((log.len() as u64, e.to_json()));
    };
    let jobs = opts.jobs.max(1);
    emit(
        Event::RunStarted { run_id: run_id.clone(), spec: spec.name.clone(), nodes: dag.nodes.len(), jobs },
        reporter,
        &mut log,
    );

    let n = dag.nodes.len();
    let mut waiting_on: Vec<usize> = (0..n).map(|i| dag.parents(i).len()).collect();
    let mut outcomes: Vec<Option<Outcome>> = vec![None; n];
    let mut outputs: BTreeMap<String, Vec<OutputRecord>> = BTreeMap::new();
    let mut blocked_by: Vec<Option<String>> = vec![None; n];
    let env_cache: Mutex<Option<Result<EnvPart, String>>> = Mutex::new(None);
    let cancel = AtomicBool::new(false);
    let cpu = node::CpuSlots::machine();
    type Ready = (usize, BTreeMap<String, Vec<OutputRecord>>, Option<Box<node::Decided>>);
    let (job_tx, job_rx) = mpsc::channel::<Ready>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let (msg_tx, msg_rx) = mpsc::channel::<Msg>();
    let mut stats = RunStats::default();
    let mut interrupted = false;
    let (mut dropped_states, mut drop_errors) = (Vec::new(), Vec::new());
    // Who reads each node's state: (producer position → its readers' positions).
    let state_readers: BTreeMap<usize, Vec<usize>> = if opts.drop_states {
        let mut m: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (c, node) in dag.nodes.iter().enumerate() {
            for r in node.inputs.values().flatten().filter(|r| r.output == crate::store::gc::STATE_OUTPUT) {
                if let Some(pos) = dag.position(&r.node) {
                    m.entry(pos).or_default().push(c);
                }
            }
        }
        m
    } else {
        BTreeMap::new()
    };

    let shared = RunShared { ws, spec, opts, run_id: &run_id, cancel: &cancel, cpu: &cpu };
    std::thread::scope(|scope| -> Result<(), StoreError> {
        // The job threads start when the first node needs one: a run whose
        // nodes are all plain cache hits (a no-op) starts none, and opens no
        // index connection for them.
        let mut workers_tx = Some(msg_tx);
        let mut start_workers = || {
            let Some(msg_tx) = workers_tx.take() else { return };
            for _ in 0..jobs.min(n.max(1)) {
                let job_rx = Arc::clone(&job_rx);
                let msg_tx = msg_tx.clone();
                let (env_cache, cancel, shared) = (&env_cache, &cancel, &shared);
                scope.spawn(move || {
                    let index = match ws.index() {
                        Ok(i) => i,
                        Err(e) => {
                            // Report every job this worker takes as failed rather than hang.
                            while let Ok((pos, _, _)) = {
                                let rx = job_rx.lock().expect("job queue");
                                rx.recv()
                            } {
                                let _ = msg_tx.send(Msg::Done(
                                    pos,
                                    Outcome::Failed { key: None, error: e.to_string(), seconds: 0.0 },
                                ));
                            }
                            return;
                        }
                    };
                    loop {
                        let next = { job_rx.lock().expect("job queue").recv() };
                        let Ok((pos, upstream, record)) = next else { return };
                        let node = &dag.nodes[pos];
                        if cancel.load(std::sync::atomic::Ordering::SeqCst) {
                            // Interrupted: no node starts any more.
                            let because = "the run was interrupted before it started".to_string();
                            let _ = msg_tx.send(Msg::Done(pos, Outcome::Skipped { because }));
                            continue;
                        }
                        let env = if node.op.numerical() {
                            let mut cached = env_cache.lock().expect("env cache");
                            match cached.get_or_insert_with(|| (opts.env)()) {
                                Ok(e) => Some(slurm::node_env(spec.executor, &node.def, e)),
                                Err(e) => {
                                    let error = format!("cannot determine the numerical environment: {e}");
                                    let _ =
                                        msg_tx.send(Msg::Done(pos, Outcome::Failed { key: None, error, seconds: 0.0 }));
                                    continue;
                                }
                            }
                        } else {
                            None
                        };
                        let job = shared.job(&index, node, &upstream, env);
                        let mut observer = Observer { tx: &msg_tx, node: node.id().to_string() };
                        // A panic in a node's code (a defect of ours) fails
                        // that node, and this thread goes on to the next job:
                        // the run never waits for a report that cannot come.
                        let resolved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            node::resolve(&job, executor, &mut observer, record)
                        }));
                        let outcome = resolved.unwrap_or_else(|panic| panicked(panic.as_ref()));
                        let _ = msg_tx.send(Msg::Done(pos, outcome));
                    }
                });
            }
        };

        // A ready node that is a plain cache hit is decided here, in this
        // thread, and its outcome handled next (no hand-off to a job thread
        // and back); any other goes to a job thread with what was computed.
        let mut decided: std::collections::VecDeque<(usize, Outcome)> = std::collections::VecDeque::new();
        let index_here = &index;
        let mut dispatch = |pos: usize,
                            outputs: &BTreeMap<String, Vec<OutputRecord>>,
                            decided: &mut std::collections::VecDeque<(usize, Outcome)>| {
            let mut upstream = BTreeMap::new();
            for p in dag.parents(pos) {
                let id = dag.nodes[p].id();
                upstream.insert(id.to_string(), outputs[id].clone());
            }
            let node = &dag.nodes[pos];
            let early = if cancel.load(std::sync::atomic::Ordering::SeqCst) {
                node::Early::Unknown
            } else {
                // Hits decided one after another read one snapshot (ended
                // below before this thread waits, and by any write).
                index_here.batch_reads()?;
                // A panic here (a defect of ours, keying this node) fails
                // this node alone, as in a job thread.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    node::early(&shared.job(index_here, node, &upstream, None))
                }))
                .unwrap_or_else(|panic| node::Early::Done(panicked(panic.as_ref())))
            };
            if let node::Early::Done(outcome) = early {
                decided.push_back((pos, outcome));
                return Ok(());
            }
            if !recorded {
                index_here.start_run(&run_row, &opts.argv)?;
                recorded = true;
            }
            start_workers();
            let record = match early {
                node::Early::Decided(decided) => Some(decided),
                _ => None,
            };
            let _ = job_tx.send((pos, upstream, record));
            Ok::<(), StoreError>(())
        };
        let mut pending = n;
        for &pos in &dag.order {
            if waiting_on[pos] == 0 {
                dispatch(pos, &outputs, &mut decided)?;
            }
        }
        while pending > 0 {
            let next = match decided.pop_front() {
                Some((pos, outcome)) => Ok(Msg::Done(pos, outcome)),
                None => {
                    index_here.end_reads()?;
                    msg_rx.recv_timeout(std::time::Duration::from_millis(50))
                }
            };
            let msg = match next {
                Ok(msg) => msg,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // Ctrl-C (or SIGTERM, SIGHUP): running nodes are stopped
                    // (their groups killed, their incomplete outs removed) and
                    // none starts; finished ones stay cached.
                    if signal::interrupted() && !cancel.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        interrupted = true;
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let (pos, outcome) = match msg {
                Msg::Event(e) => {
                    emit(e, reporter, &mut log);
                    continue;
                }
                Msg::Done(pos, outcome) => (pos, outcome),
            };
            pending -= 1;
            let id = dag.nodes[pos].id().to_string();
            match &outcome {
                Outcome::Cached { key, outputs: outs, remote, restored, moved } => {
                    stats.cached += 1;
                    outputs.insert(id.clone(), outs.clone());
                    emit(
                        Event::CacheHit {
                            node: id.clone(),
                            key: key.clone(),
                            from: remote.clone(),
                            restored: restored.clone(),
                            moved: moved.clone(),
                        },
                        reporter,
                        &mut log,
                    );
                }
                Outcome::Ran { key, outputs: outs, seconds, summary, .. } => {
                    stats.ran += 1;
                    outputs.insert(id.clone(), outs.clone());
                    emit(
                        Event::NodeFinished {
                            node: id.clone(),
                            key: key.clone(),
                            seconds: *seconds,
                            summary: summary.clone(),
                        },
                        reporter,
                        &mut log,
                    );
                }
                // A worker skips only what an interrupt kept from starting.
                Outcome::Skipped { because } => {
                    stats.skipped += 1;
                    emit(Event::NodeSkipped { node: id.clone(), because: because.clone() }, reporter, &mut log);
                }
                Outcome::Failed { key, error, seconds } => {
                    stats.failed += 1;
                    emit(
                        Event::NodeFailed {
                            node: id.clone(),
                            key: key.clone(),
                            seconds: *seconds,
                            error: error.clone(),
                        },
                        reporter,
                        &mut log,
                    );
                }
            }
            let failed = matches!(outcome, Outcome::Failed { .. } | Outcome::Skipped { .. });
            outcomes[pos] = Some(outcome);
            // A state every reader of which has finished is no longer needed by this run.
            if opts.drop_states && !failed {
                let finished = |q: usize| matches!(outcomes[q], Some(Outcome::Cached { .. } | Outcome::Ran { .. }));
                for (&producer, readers) in &state_readers {
                    if !readers.contains(&pos) || !finished(producer) || !readers.iter().all(|&q| finished(q)) {
                        continue;
                    }
                    let key = match &outcomes[producer] {
                        Some(Outcome::Cached { key, .. } | Outcome::Ran { key, .. }) => key.clone(),
                        _ => continue,
                    };
                    let id = dag.nodes[producer].id().to_string();
                    let why = format!("dropped by run --drop-states in run {run_id} once its readers finished");
                    match ws.drop_output(&index, &key, crate::store::gc::STATE_OUTPUT, &why) {
                        Ok(Some(bytes)) => dropped_states.push((id, bytes)),
                        Ok(None) => {}
                        Err(e) => drop_errors.push(format!("{id}: {e}")),
                    }
                }
            }
            // Children: skipped (with their whole subtree) if this failed, else one step closer to ready.
            for child in dag.children(pos) {
                if failed || blocked_by[pos].is_some() {
                    let root = blocked_by[pos].clone().unwrap_or_else(|| id.clone());
                    blocked_by[child].get_or_insert(root);
                }
                waiting_on[child] -= 1;
                if waiting_on[child] == 0 {
                    if let Some(root) = blocked_by[child].clone() {
                        // Mark the skipped subtree as resolved without running it.
                        let mut stack = vec![child];
                        while let Some(c) = stack.pop() {
                            if outcomes[c].is_some() {
                                continue;
                            }
                            pending -= 1;
                            stats.skipped += 1;
                            let because = if interrupted {
                                "the run was interrupted before it started".to_string()
                            } else {
                                format!("'{root}' failed")
                            };
                            outcomes[c] = Some(Outcome::Skipped { because: because.clone() });
                            emit(
                                Event::NodeSkipped { node: dag.nodes[c].id().to_string(), because },
                                reporter,
                                &mut log,
                            );
                            for gc in dag.children(c) {
                                blocked_by[gc].get_or_insert(root.clone());
                                waiting_on[gc] -= 1;
                                if waiting_on[gc] == 0 {
                                    stack.push(gc);
                                }
                            }
                        }
                    } else {
                        dispatch(child, &outputs, &mut decided)?;
                    }
                }
            }
        }
        drop(job_tx);
        Ok(())
    })?;

    let seconds = started.elapsed().as_secs_f64();
    emit(
        Event::RunFinished {
            run_id: run_id.clone(),
            ran: stats.ran,
            cached: stats.cached,
            failed: stats.failed,
            skipped: stats.skipped,
            seconds,
        },
        reporter,
        &mut log,
    );
    reporter.finish();

    let mut rows = Vec::with_capacity(n);
    let mut result = BTreeMap::new();
    for (pos, outcome) in outcomes.into_iter().enumerate() {
        let Some(outcome) = outcome else { continue };
        let node_id = dag.nodes[pos].id().to_string();
        let row = match &outcome {
            Outcome::Cached { key, outputs, .. } => RunNodeRow {
                node_id: node_id.clone(),
                key: Some(key.clone()),
                outcome: NodeOutcome::Cached,
                seconds: None,
                detail: None,
                outputs: Some(outputs.iter().map(RunOutput::from).collect()),
            },
            Outcome::Ran { key, seconds, job, outputs, .. } => RunNodeRow {
                node_id: node_id.clone(),
                key: Some(key.clone()),
                outcome: NodeOutcome::Ran,
                seconds: Some(*seconds),
                detail: job.clone(),
                outputs: Some(outputs.iter().map(RunOutput::from).collect()),
            },
            Outcome::Failed { key, error, seconds } => RunNodeRow {
                node_id: node_id.clone(),
                key: key.clone(),
                outcome: NodeOutcome::Failed,
                seconds: Some(*seconds),
                detail: Some(error.clone()),
                outputs: None,
            },
            Outcome::Skipped { because } => RunNodeRow {
                node_id: node_id.clone(),
                key: None,
                outcome: NodeOutcome::Skipped,
                seconds: None,
                detail: Some(because.clone()),
                outputs: None,
            },
        };
        rows.push(row);
        result.insert(node_id, outcome);
    }
    let interrupted = interrupted || signal::interrupted();
    let status = if interrupted {
        "interrupted"
    } else if stats.success() {
        "ok"
    } else {
        "failed"
    };
    let summary =
        format!("{} ran, {} cached, {} failed, {} skipped", stats.ran, stats.cached, stats.failed, stats.skipped);
    // What the run wrote is made durable before the run is recorded finished
    // (recorded even when the sync fails, which is then the run's error).
    let synced = deferred.finish();
    let unstarted = (!recorded).then_some((&run_row, opts.argv.as_str()));
    let unrecorded = index.finish_run(&run_id, status, &summary, &rows, &log, unstarted).err().map(|e| e.to_string());
    synced?;
    Ok(RunResult { run_id, stats, outcomes: result, unrecorded, interrupted, dropped_states, drop_errors })
}

/// The message a panic was raised with (`panic!("…")` or an unwrap's), or
/// a placeholder for a payload of another type.
/// The outcome of a node whose code (ours) panicked, naming the panic.
fn panicked(payload: &(dyn std::any::Any + Send)) -> Outcome {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string());
    Outcome::Failed {
        key: None,
        error: format!("orchestrate's own code panicked on this node: {message} (a bug: please report it)"),
        seconds: 0.0,
    }
}

#[cfg(test)]
mod tests;

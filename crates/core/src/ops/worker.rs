//! Numerical ops run in the `orchestrate-torch` worker process: the library
//! declares them (params, inputs, outputs), the worker implements them. The
//! job travels as JSON on the worker's stdin; outputs land in the staging folder.

use crate::costs::NodeCosts;
use crate::store::Key;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::{process, OpError, RunContext};
use crate::runtime::{require_worker, WORKER};

/// The ops the worker implements: the one table of their names, shared by the
/// engine (whose ops declare them and hand the job over) and the worker (which
/// matches on it exhaustively, so an op declared here and not implemented
/// there does not compile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerOp {
    #[serde(rename = "model.init")]
    ModelInit,
    #[serde(rename = "train.sft")]
    TrainSft,
    #[serde(rename = "train.grpo")]
    TrainGrpo,
    #[serde(rename = "eval.generate")]
    EvalGenerate,
    #[serde(rename = "replay")]
    Replay,
}

impl WorkerOp {
    pub const ALL: [WorkerOp; 5] =
        [WorkerOp::ModelInit, WorkerOp::TrainSft, WorkerOp::TrainGrpo, WorkerOp::EvalGenerate, WorkerOp::Replay];

    /// The op's name in specs, keys and the registry.
    pub const fn name(self) -> &'static str {
        match self {
            WorkerOp::ModelInit => "model.init",
            WorkerOp::TrainSft => "train.sft",
            WorkerOp::TrainGrpo => "train.grpo",
            WorkerOp::EvalGenerate => "eval.generate",
            WorkerOp::Replay => "replay",
        }
    }
}

/// A worker op with its params, typed: what the engine parsed and checked is
/// what the worker runs (it never parses params again), and the worker
/// matches on it exhaustively.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", content = "params", deny_unknown_fields)]
pub enum WorkerTask {
    #[serde(rename = "model.init")]
    ModelInit(super::ModelInitParams),
    #[serde(rename = "train.sft")]
    TrainSft(crate::train::params::SftParams),
    #[serde(rename = "train.grpo")]
    TrainGrpo(crate::train::params::GrpoParams),
    #[serde(rename = "eval.generate")]
    EvalGenerate(super::eval::EvalGenerateParams),
    #[serde(rename = "replay")]
    Replay(super::train::ReplayParams),
}

impl WorkerTask {
    pub fn op(&self) -> WorkerOp {
        match self {
            WorkerTask::ModelInit(_) => WorkerOp::ModelInit,
            WorkerTask::TrainSft(_) => WorkerOp::TrainSft,
            WorkerTask::TrainGrpo(_) => WorkerOp::TrainGrpo,
            WorkerTask::EvalGenerate(_) => WorkerOp::EvalGenerate,
            WorkerTask::Replay(_) => WorkerOp::Replay,
        }
    }
}

/// What the worker needs to run one node: the job it reads on its stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerJob {
    pub task: WorkerTask,
    pub node_id: String,
    pub spec_dir: PathBuf,
    pub inputs: BTreeMap<String, Vec<PathBuf>>,
    /// Outputs are written here under their names, and the [`WorkerResult`]
    /// beside them ([`RESULT_FILE`]).
    pub staging: PathBuf,
    /// The folder of the node's update WAL ([`Workspace::checkpoint_dir`]):
    /// the one place outside `staging` the worker writes. Everything else a
    /// worker changes goes through the executor: its outputs (published from
    /// staging) and the guard's ledger (served over its stdin).
    ///
    /// [`Workspace::checkpoint_dir`]: crate::store::Workspace::checkpoint_dir
    pub checkpoints: PathBuf,
    /// The node's key (the owner of the rollouts it consumes).
    pub key: Key,
}

/// The file a worker leaves its [`WorkerResult`] in, in its staging folder
/// (taken out before the outputs are stored; never an output).
pub const RESULT_FILE: &str = ".result.json";

/// A result file larger than this is refused (a GRPO run of 10,000
/// iterations writes about 2 MB of costs).
pub const MAX_RESULT_BYTES: u64 = 16 << 20;

/// What a worker reports when it ends: the other half of [`WorkerJob`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerResult {
    /// What the op's process cost (kept in the node's record, never in an
    /// output); `None` for an op that measures nothing or failed first.
    pub costs: Option<NodeCosts>,
    /// What the op left in its staging folder, each entry's name, sorted
    /// (the result file aside); empty for a failure. The executor checks it
    /// against the folder and against the node's declared outputs before
    /// anything is published.
    pub outputs: Vec<String>,
    /// The headline figures of a training op's run (`None` for other ops
    /// and for a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<crate::train::metrics::TrainingSummary>,
    /// `None`: the op wrote its outputs.
    pub failure: Option<WorkerFailure>,
}

/// Why a worker's op failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(deny_unknown_fields)]
#[error("{kind}: {message}")]
pub struct WorkerFailure {
    pub kind: FailureKind,
    pub message: String,
}

/// What kind of failure ended a worker's op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The job's params do not fit the op.
    Params,
    /// An input does not read or does not fit (a state of another run, a
    /// model folder, rows, a tokenizer).
    Input,
    /// The guard refused (its ledger, an event log, a lineage).
    Guard,
    /// libtorch failed.
    Torch,
    /// Reading or writing a file failed.
    Io,
    /// The op itself refused to go on (a non-finite loss, a run that cannot resume).
    Op,
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailureKind::Params => "params",
            FailureKind::Input => "input",
            FailureKind::Guard => "guard",
            FailureKind::Torch => "libtorch",
            FailureKind::Io => "io",
            FailureKind::Op => "op",
        })
    }
}

impl WorkerResult {
    /// A finished op's result: what it cost, and what its staging folder holds.
    pub fn done(
        staging: &Path,
        costs: Option<NodeCosts>,
        summary: Option<crate::train::metrics::TrainingSummary>,
    ) -> std::io::Result<WorkerResult> {
        Ok(WorkerResult { costs, outputs: staging_entries(staging)?, summary, failure: None })
    }

    /// A failed op's result.
    pub fn failed(failure: WorkerFailure) -> WorkerResult {
        WorkerResult { costs: None, outputs: Vec::new(), summary: None, failure: Some(failure) }
    }

    /// Writes the result into `staging` (as [`RESULT_FILE`]); a link there is
    /// an error, never written through.
    pub fn write(&self, staging: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::store::fsx::open_truncate(&staging.join(RESULT_FILE))?.write_all(&bytes)
    }

    /// The result a worker left in `staging`, taken out of it; `None` when it
    /// left none (it was killed, or crashed). A result that is a link, too
    /// large or does not read is an error naming it: the worker is ours, so
    /// that is a defect to report, not a result to guess.
    pub fn take(staging: &Path) -> Result<Option<WorkerResult>, ResultFileError> {
        let path = staging.join(RESULT_FILE);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ResultFileError::Io { path, source }),
        };
        if !meta.is_file() {
            return Err(ResultFileError::NotAFile { path });
        }
        if meta.len() > MAX_RESULT_BYTES {
            return Err(ResultFileError::TooLarge { path, bytes: meta.len() });
        }
        let result = crate::canonical::read_typed(&path).map_err(ResultFileError::Invalid)?;
        if let Err(source) = std::fs::remove_file(&path) {
            return Err(ResultFileError::Io { path, source });
        }
        Ok(Some(result))
    }
}

/// The names in a staging folder, sorted, the worker's result file aside.
pub fn staging_entries(staging: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(staging)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name != RESULT_FILE {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Checks what a worker says it wrote against what its staging folder holds
/// (`found`) and what the node declares it writes there (`declared`, sorted):
/// a worker that wrote anything else, or left out a declared output, or whose
/// report does not match its folder, fails the node before anything is published.
pub fn check_outputs(reported: &[String], found: &[String], declared: &[String]) -> Result<(), OpError> {
    if reported != found {
        return Err(OpError::Failed(format!(
            "{WORKER} reports it wrote {reported:?}, but its staging folder holds {found:?}"
        )));
    }
    let extra: Vec<&String> = found.iter().filter(|n| !declared.contains(n)).collect();
    if !extra.is_empty() {
        return Err(OpError::Failed(format!(
            "{WORKER} wrote {extra:?} into its staging folder, which the node does not declare (it declares {declared:?})"
        )));
    }
    let missing: Vec<&String> = declared.iter().filter(|n| !found.contains(n)).collect();
    if !missing.is_empty() {
        return Err(OpError::Failed(format!("{WORKER} did not write the declared outputs {missing:?}")));
    }
    Ok(())
}

/// A worker's result file that is not one: a defect of ours to report.
#[derive(Debug, thiserror::Error)]
pub enum ResultFileError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the worker's result is not a plain file", .path.display())]
    NotAFile { path: std::path::PathBuf },
    #[error("{}: the worker's result is {bytes} bytes, over the {MAX_RESULT_BYTES} allowed", .path.display())]
    TooLarge { path: std::path::PathBuf, bytes: u64 },
    #[error("the worker's result: {0}")]
    Invalid(#[source] crate::canonical::ArtifactError),
}

/// Runs `task` for this node in the worker; its stdout and stderr go to the
/// node's log, what it cost into `ctx.costs`.
pub fn run_in_worker(task: WorkerTask, ctx: &RunContext<'_>) -> Result<(), OpError> {
    let op = task.op();
    let worker = require_worker().map_err(|e| OpError::Failed(format!("op '{}': {e}", op.name())))?;
    let job = WorkerJob {
        task,
        node_id: ctx.node_id.to_string(),
        spec_dir: ctx.spec_dir.to_path_buf(),
        inputs: ctx.inputs.iter().map(|(k, v)| (k.clone(), v.iter().map(|a| a.path.clone()).collect())).collect(),
        staging: ctx.staging.to_path_buf(),
        checkpoints: crate::store::Workspace::checkpoint_dir(ctx.workspace, ctx.key.as_str()),
        key: ctx.key.clone(),
    };
    let mut cmd = Command::new(&worker);
    cmd.arg("run-op");
    // The count the node's key was computed with, whatever this process's default.
    if let Some(n) = ctx.threads {
        cmd.env(crate::runtime::THREADS_VAR, n.to_string());
    }
    // The worker's stdin is a socket: its gate (the job, one line), then the
    // channel its guard ledger is served over (see `guard::served`), so the
    // worker never opens the workspace's database itself.
    let (ours, theirs) =
        std::os::unix::net::UnixStream::pair().map_err(|e| OpError::io("making the worker's channel", e))?;
    let child = process::spawn_tied_gated(&mut cmd, ctx.log_path, Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .map_err(|e| OpError::io(format!("starting {} (log {})", worker.display(), ctx.log_path.display()), e))?;
    let finished = serve_worker(child, &ours, &job, ctx)?;
    let result = WorkerResult::take(ctx.staging).map_err(|e| OpError::Failed(e.to_string()))?;
    if !finished.status.success() {
        finished.output.complete_log();
        let status = process::describe(finished.status);
        return Err(match result.and_then(|r| r.failure) {
            Some(failure) => OpError::Worker { status, failure },
            None => OpError::Failed(format!("{WORKER} failed with {status}{}", finished.output.last_lines(10))),
        });
    }
    match result {
        Some(WorkerResult { failure: Some(failure), .. }) => {
            Err(OpError::Failed(format!("{WORKER} exited 0 but reports a failure ({failure})")))
        }
        Some(WorkerResult { costs, outputs, summary, failure: None }) => {
            let found = staging_entries(ctx.staging)
                .map_err(|e| OpError::io(format!("listing {}", ctx.staging.display()), e))?;
            let mut declared: Vec<String> =
                ctx.outputs.iter().filter(|o| o.workspace_path.is_none()).map(|o| o.name.clone()).collect();
            declared.sort();
            check_outputs(&outputs, &found, &declared)?;
            if let Some(costs) = costs {
                // Set once: a node runs its op once per context.
                let _ = ctx.costs.set(costs);
            }
            if let Some(summary) = summary {
                let _ = ctx.summary.set(summary);
            }
            Ok(())
        }
        None => Err(OpError::Failed(format!("{WORKER} exited 0 without its result ({RESULT_FILE})"))),
    }
}

/// Hands the worker its job, the first line on its gate (an orchestrate
/// gone before writing it leaves the worker end-of-file, an error, and nothing
/// done), then serves its guard ledger on the same socket until it exits.
fn serve_worker(
    child: process::Tied,
    ours: &std::os::unix::net::UnixStream,
    job: &WorkerJob,
    ctx: &RunContext<'_>,
) -> Result<process::Finished, OpError> {
    let ledger = ctx.workspace.join(crate::guard::ledger::FILE);
    let owner = ctx.key.as_str();
    let channel = |e: std::io::Error| OpError::io("the worker's channel", e);
    let (mut reader, mut writer) =
        (std::io::BufReader::new(ours.try_clone().map_err(channel)?), ours.try_clone().map_err(channel)?);
    std::thread::scope(|scope| {
        let server = scope.spawn(move || crate::guard::served::serve(&ledger, owner, &mut reader, &mut writer));
        let mut line = serde_json::to_vec(job).map_err(|e| OpError::Failed(e.to_string()))?;
        line.push(b'\n');
        let sent = (&mut &*ours).write_all(&line).map_err(|e| OpError::io("sending the job to the worker", e));
        let finished = child.wait(ctx.cancel);
        // The worker is gone: whatever still holds its end (a program it
        // started), serving ends here.
        let _ = ours.shutdown(std::net::Shutdown::Both);
        let served = server.join().map_err(|_| OpError::Failed("the guard ledger's server panicked".into()))?;
        let finished = finished?;
        sent?;
        if let Err(e) = served {
            if finished.status.success() {
                return Err(OpError::io("serving the worker's guard ledger", e));
            }
        }
        Ok(finished)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::costs::RunCosts;

    /// A result round-trips through the staging folder and is taken out of
    /// it (so it never lands among the outputs); a result that does not read,
    /// or is a link, is an error naming the file, never a guess.
    #[test]
    fn a_worker_result_round_trips_through_staging_and_a_bad_one_is_named_not_guessed() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(WorkerResult::take(dir.path()).unwrap(), None);
        let process = RunCosts { seconds: 3.0, optimization_seconds: None, peak_rss_bytes: Some(7) };
        std::fs::write(dir.path().join("metrics"), "{}").unwrap();
        let summary = crate::train::metrics::TrainingSummary::Sft {
            updates: 4,
            first_loss: Some(2.5),
            last_loss: Some(0.5),
            validation_nll: None,
        };
        let costs = Some(NodeCosts { process, iterations: BTreeMap::new() });
        let done = WorkerResult::done(dir.path(), costs, Some(summary)).unwrap();
        assert_eq!(done.outputs, ["metrics"], "what staging holds");
        done.write(dir.path()).unwrap();
        assert_eq!(WorkerResult::take(dir.path()).unwrap(), Some(done));
        assert!(!dir.path().join(RESULT_FILE).exists(), "taken, so it never lands among the outputs");
        let failed =
            WorkerResult::failed(WorkerFailure { kind: FailureKind::Input, message: "the resume state is not".into() });
        failed.write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(RESULT_FILE)).unwrap();
        assert!(text.contains(r#""kind": "input""#), "{text}");
        assert_eq!(WorkerResult::take(dir.path()).unwrap(), Some(failed));
        let bad = r#"{"costs": {"process": {"seconds": "soon", "peak_rss_bytes": null}}, "failure": null}"#;
        std::fs::write(dir.path().join(RESULT_FILE), bad).unwrap();
        let e = WorkerResult::take(dir.path()).unwrap_err().to_string();
        assert!(e.contains(RESULT_FILE) && e.contains("costs.process.seconds"), "{e}");
        std::fs::remove_file(dir.path().join(RESULT_FILE)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(RESULT_FILE)).unwrap();
        assert!(WorkerResult::take(dir.path()).unwrap_err().to_string().contains("not a plain file"));
        assert!(
            std::fs::symlink_metadata(dir.path().join(RESULT_FILE)).is_ok(),
            "a link is never followed nor removed"
        );
        // Writing one where a link stands is refused; what the link points to is untouched.
        let theirs = dir.path().join("theirs.txt");
        std::fs::write(&theirs, "keep").unwrap();
        std::fs::remove_file(dir.path().join(RESULT_FILE)).unwrap();
        std::os::unix::fs::symlink(&theirs, dir.path().join(RESULT_FILE)).unwrap();
        assert!(failed_write(dir.path()).is_err(), "written through a link");
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "keep");
    }

    fn failed_write(staging: &Path) -> std::io::Result<()> {
        let failure = WorkerFailure { kind: FailureKind::Io, message: "x".into() };
        WorkerResult::failed(failure).write(staging)
    }

    /// What a worker wrote is checked before anything is published: its
    /// report against its folder, and the folder against the node's declared
    /// outputs, each mismatch named.
    #[test]
    fn a_worker_that_writes_anything_undeclared_or_misreports_its_outputs_fails_the_node() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let declared = names(&["metrics", "model"]);
        assert!(check_outputs(&declared, &declared, &declared).is_ok());
        let extra = names(&[".model.tmp", "metrics", "model"]);
        let e = check_outputs(&extra, &extra, &declared).unwrap_err().to_string();
        assert!(e.contains(r#"[".model.tmp"]"#) && e.contains("does not declare"), "{e}");
        let e = check_outputs(&names(&["metrics"]), &names(&["metrics"]), &declared).unwrap_err().to_string();
        assert!(e.contains(r#"declared outputs ["model"]"#), "{e}");
        let e = check_outputs(&declared, &names(&["metrics"]), &declared).unwrap_err().to_string();
        assert!(e.contains("reports it wrote") && e.contains("holds"), "{e}");
        // The folder is listed as it is, the result file aside.
        let dir = tempfile::tempdir().unwrap();
        for f in ["model", RESULT_FILE, "metrics"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        assert_eq!(staging_entries(dir.path()).unwrap(), declared);
    }

    /// The job carries each op's params typed: what the engine parsed (its
    /// defaults filled in) is what the worker reads back, field for field;
    /// params an op does not have, or a task naming no op, do not read.
    #[test]
    fn a_job_carries_its_ops_typed_params_and_refuses_what_does_not_fit() {
        let sft: crate::train::params::SftParams =
            super::super::parse_params(&serde_json::json!({"branch": "sft", "epochs": 2, "lr": 1e-4})).unwrap();
        let job = WorkerJob {
            task: WorkerTask::TrainSft(sft.clone()),
            node_id: "sft".into(),
            spec_dir: "/spec".into(),
            inputs: BTreeMap::new(),
            staging: "/staging".into(),
            checkpoints: "/ws/checkpoints/k".into(),
            key: Key::parse(&"a".repeat(64)).unwrap(),
        };
        let wire = serde_json::to_value(&job).unwrap();
        assert_eq!(wire["task"]["op"], "train.sft");
        assert_eq!(wire["task"]["params"]["batch_size"], 8, "defaults travel filled in");
        let back: WorkerJob = serde_json::from_value(wire.clone()).unwrap();
        let WorkerTask::TrainSft(read) = back.task else { panic!("another op came back") };
        assert_eq!(read, sft);
        let mut extra = wire.clone();
        extra["task"]["params"]["learning_rate"] = 1.into();
        assert!(serde_json::from_value::<WorkerJob>(extra).unwrap_err().to_string().contains("learning_rate"));
        let mut other = wire;
        other["task"]["op"] = "train.dpo".into();
        assert!(serde_json::from_value::<WorkerJob>(other).is_err());
    }

    #[test]
    fn the_worker_ops_are_exactly_the_registrys_numerical_ops() {
        let registry = super::super::Registry::builtin();
        let numerical: Vec<&str> = registry.iter().filter(|op| op.numerical()).map(|op| op.name()).collect();
        let table: Vec<&str> = WorkerOp::ALL.iter().map(|op| op.name()).collect();
        let mut a = numerical.clone();
        let mut b = table.clone();
        a.sort();
        b.sort();
        assert_eq!(a, b, "numerical ops in the registry vs the worker's table");
        // The name on the wire is the name in specs and keys.
        for op in WorkerOp::ALL {
            assert_eq!(serde_json::to_value(op).unwrap(), serde_json::json!(op.name()));
        }
    }
}

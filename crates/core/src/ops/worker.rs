//! Numerical ops run in the `orchestrate-torch` worker process: the library
//! declares them (params, inputs, outputs), the worker implements them. The
//! job travels as JSON on the worker's stdin; outputs land in the staging folder.

use crate::store::Key;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// What the worker needs to run one node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerJob {
    pub op: WorkerOp,
    pub node_id: String,
    pub params: Value,
    pub spec_dir: PathBuf,
    pub inputs: BTreeMap<String, Vec<PathBuf>>,
    /// Outputs are written here under their names.
    pub staging: PathBuf,
    pub workspace: PathBuf,
    /// The node's key (the owner of the rollouts it consumes).
    pub key: Key,
}

/// Runs `op` for this node in the worker; its stdout and stderr go to the node's log.
pub fn run_in_worker(op: WorkerOp, ctx: &RunContext<'_>) -> Result<(), OpError> {
    let worker = require_worker().map_err(|e| OpError::Failed(format!("op '{}': {e}", op.name())))?;
    let job = WorkerJob {
        op,
        node_id: ctx.node_id.to_string(),
        params: ctx.params.clone(),
        spec_dir: ctx.spec_dir.to_path_buf(),
        inputs: ctx.inputs.iter().map(|(k, v)| (k.clone(), v.iter().map(|a| a.path.clone()).collect())).collect(),
        staging: ctx.staging.to_path_buf(),
        workspace: ctx.workspace.to_path_buf(),
        key: ctx.key.clone(),
    };
    let mut cmd = Command::new(&worker);
    cmd.arg("run-op").stdin(Stdio::piped());
    // The count the node's key was computed with, whatever this process's default.
    if let Some(n) = ctx.threads {
        cmd.env(crate::runtime::THREADS_VAR, n.to_string());
    }
    let mut child = process::spawn_tied(&mut cmd, ctx.log_path)
        .map_err(|e| OpError::io(format!("starting {} (log {})", worker.display(), ctx.log_path.display()), e))?;
    // The job on its stdin is the worker's gate (see spawn_tied): it reads
    // it whole before doing anything, and an orchestrate gone before writing
    // it leaves it end-of-file, an error, and nothing done.
    let body = serde_json::to_vec(&job).map_err(|e| OpError::Failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin() {
        stdin.write_all(&body).map_err(|e| OpError::io("sending the job to the worker", e))?;
    }
    let finished = child.wait(ctx.cancel)?;
    if !finished.status.success() {
        finished.output.complete_log();
        return Err(OpError::Failed(format!(
            "{WORKER} failed with {}{}",
            process::describe(finished.status),
            finished.output.last_lines(10)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::WorkerOp;

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

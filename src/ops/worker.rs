//! Numerical ops run in the `orchestrate-torch` worker process: the library
//! declares them (params, inputs, outputs), the worker implements them. The
//! job travels as JSON on the worker's stdin; outputs land in the staging folder.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{process, OpError, RunContext};
use crate::runtime::{worker_binary, WORKER};

/// What the worker needs to run one node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerJob {
    pub op: String,
    pub node_id: String,
    pub params: Value,
    pub spec_dir: PathBuf,
    pub inputs: BTreeMap<String, Vec<PathBuf>>,
    /// Outputs are written here under their names.
    pub staging: PathBuf,
    pub workspace: PathBuf,
    /// The node's key (the owner of the rollouts it consumes).
    pub key: String,
}

/// Runs `op` for this node in the worker; its stdout and stderr go to the node's log.
pub fn run_in_worker(op: &str, ctx: &RunContext<'_>) -> Result<(), OpError> {
    let worker = worker_binary().ok_or_else(|| {
        OpError::Failed(format!(
            "op '{op}' needs {WORKER}, which was not found next to orchestrate: build with the default `torch` feature"
        ))
    })?;
    let job = WorkerJob {
        op: op.to_string(),
        node_id: ctx.node_id.to_string(),
        params: ctx.params.clone(),
        spec_dir: ctx.spec_dir.to_path_buf(),
        inputs: ctx.inputs.iter().map(|(k, v)| (k.clone(), v.iter().map(|a| a.path.clone()).collect())).collect(),
        staging: ctx.staging.to_path_buf(),
        workspace: ctx.workspace.to_path_buf(),
        key: ctx.key.to_string(),
    };
    let log = std::fs::File::create(ctx.log_path)
        .map_err(|e| OpError::io(format!("creating {}", ctx.log_path.display()), e))?;
    let log_err = log.try_clone().map_err(|e| OpError::io("duplicating the log handle", e))?;
    let mut cmd = Command::new(&worker);
    cmd.arg("run-op").stdin(Stdio::piped()).stdout(log).stderr(log_err);
    let mut child =
        process::spawn_tied(&mut cmd).map_err(|e| OpError::io(format!("starting {}", worker.display()), e))?;
    let body = serde_json::to_vec(&job).map_err(|e| OpError::Failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&body).map_err(|e| OpError::io("sending the job to the worker", e))?;
    }
    let status = process::wait(&mut child, ctx.cancel)?;
    if !status.success() {
        return Err(OpError::Failed(format!(
            "{WORKER} failed with {}{}",
            process::describe(status),
            super::shell::log_tail(ctx.log_path)
        )));
    }
    Ok(())
}

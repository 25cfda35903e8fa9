//! Where numerical work runs. The `orchestrate` binary does not link libtorch:
//! loading it costs ~200 ms of relocations at every start (measured with
//! LD_DEBUG=statistics), which would dominate cache-hit runs and `plan`. Nodes
//! and commands that need libtorch run in the sibling `orchestrate-torch`
//! binary, as a separate process, the same seam a cluster executor uses.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use crate::dag::key::EnvPart;
use crate::exec::EnvProvider;

/// Name of the libtorch-linked worker binary, installed next to `orchestrate`.
pub const WORKER: &str = "orchestrate-torch";

/// The worker binary next to the running executable, if it was built.
pub fn worker_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ORCHESTRATE_WORKER") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    // Test binaries live in target/<profile>/deps; the worker one level up.
    [dir.join(WORKER), dir.parent()?.join(WORKER)].into_iter().find(|p| p.is_file())
}

/// Asks the worker for the numerical environment (once per run).
pub fn env_provider() -> EnvProvider {
    Box::new(|| worker_env(false))
}

/// The device libtorch really sees here (`cuda` or `cpu`), whatever
/// `ORCHESTRATE_DEVICE` asks for.
pub fn probe_device() -> Result<String, String> {
    worker_env(true).map(|env| env.device)
}

/// `orchestrate-torch env --json`, with or without this process's `ORCHESTRATE_DEVICE`.
fn worker_env(ignore_device_choice: bool) -> Result<EnvPart, String> {
    let worker = worker_binary().ok_or_else(|| {
        format!("{WORKER} was not found next to orchestrate: build with the default `torch` feature (scripts/setup.sh, then cargo build)")
    })?;
    let mut cmd = Command::new(&worker);
    cmd.args(["env", "--json"]);
    if ignore_device_choice {
        cmd.env_remove("ORCHESTRATE_DEVICE");
    }
    let out = cmd.output().map_err(|e| format!("starting {}: {e}", worker.display()))?;
    if !out.status.success() {
        return Err(format!("{} env failed: {}", worker.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{} env printed unexpected output: {e}", worker.display()))
}

/// Runs a worker command with this process's stdio and returns its exit code.
pub fn exec_worker(args: &[String]) -> anyhow::Result<ExitCode> {
    let worker = worker_binary().ok_or_else(|| {
        anyhow::anyhow!("{WORKER} was not found next to orchestrate: build with the default `torch` feature")
    })?;
    let status =
        Command::new(&worker).args(args).status().map_err(|e| anyhow::anyhow!("starting {}: {e}", worker.display()))?;
    Ok(ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(2)))
}

//! Tickets (what a job needs to rebuild its node), result files (what it
//! reports back), and where each lives under `<workspace>/slurm/`.

use crate::store::Key;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::DIR;

/// The version of the ticket format (a job refuses another).
pub(super) const TICKET_VERSION: u32 = 1;
use crate::dag::key::EnvPart;
use crate::store::{write_atomic, NodeOutcome, OutputRecord};

/// What `exec-node` needs to rebuild a node and check that it is the one submitted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ticket {
    pub version: u32,
    pub key: Key,
    pub node: String,
    /// The spec file, absolute.
    pub spec: PathBuf,
    pub profile: Option<String>,
    /// `--set` overrides, as written.
    pub overrides: Vec<String>,
    /// The working folder of the coordinator (relative spec paths resolve against it).
    pub cwd: PathBuf,
    pub upstream: BTreeMap<String, Vec<OutputRecord>>,
    pub env: Option<EnvPart>,
    pub force: bool,
    pub run_id: String,
    /// `host:pid` of the coordinator that wrote it.
    pub coordinator: String,
    pub written_at: String,
}

/// What `exec-node` reports back (besides the cache row it commits).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobResult {
    pub key: Key,
    pub node: String,
    pub job_id: String,
    pub host: String,
    /// `ran`, `cached` or `failed`.
    pub outcome: NodeOutcome,
    pub seconds: f64,
    pub error: Option<String>,
    pub finished_at: String,
    /// A training node's headline figures, as its worker reported them
    /// (absent from the result of an orchestrate before 2026-12-05, and for
    /// a node that reports none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<crate::train::metrics::TrainingSummary>,
}

pub(super) fn slurm_dir(ws: &Path, sub: &str) -> PathBuf {
    ws.join(DIR).join(sub)
}

pub fn ticket_path(ws: &Path, key: &str) -> PathBuf {
    slurm_dir(ws, "tickets").join(format!("{key}.json"))
}

pub(super) fn script_path(ws: &Path, key: &str) -> PathBuf {
    slurm_dir(ws, "jobs").join(format!("{key}.sh"))
}

pub(super) fn job_id_path(ws: &Path, key: &str) -> PathBuf {
    slurm_dir(ws, "jobs").join(format!("{key}.id"))
}

pub fn result_path(ws: &Path, key: &str, job_id: &str) -> PathBuf {
    slurm_dir(ws, "results").join(format!("{key}-{job_id}.json"))
}

/// The job's stdout/stderr file (`%j` is the job id).
pub fn log_path(ws: &Path, node: &str, job_id: &str) -> PathBuf {
    slurm_dir(ws, "logs").join(format!("{}-{job_id}.out", safe_name(node)))
}

pub(super) fn safe_name(node: &str) -> String {
    node.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
}

pub(super) fn host() -> String {
    let mut buf = [0u8; 256];
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// [`write_atomic`] into a folder it creates, with the path in the error.
pub(super) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path.parent().expect("slurm files live in a folder");
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    write_atomic(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}

pub(super) fn read_result(ws: &Path, key: &str, job_id: &str) -> Option<JobResult> {
    let text = fs::read_to_string(result_path(ws, key, job_id)).ok()?;
    serde_json::from_str(&text).ok()
}

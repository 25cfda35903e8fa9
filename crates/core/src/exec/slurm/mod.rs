//! The Slurm executor: each node that is not cached becomes one Slurm job
//! running `orchestrate exec-node <workspace> <key>` on the shared workspace.
//!
//! The coordinator (`orchestrate run` with `executor: slurm`) keeps the DAG
//! order and `--jobs` limit exactly as the local executor does; only the
//! resolution of one node differs. It computes the node's key, takes a cache
//! hit as usual, and otherwise writes a *ticket* (everything `exec-node` needs
//! to rebuild and re-key the node: the spec's path, profile and `--set`s, the
//! upstream outputs, the keyed environment) and a job script into
//! `<workspace>/slurm/`, submits the script with `sbatch`, and waits for the
//! job to leave the queue. One poller thread asks `squeue` about every
//! tracked job at once; a job that has left it is looked up with
//! `scontrol show job` (or `sacct`) for its final state and reason.
//!
//! The cache stays the single source of truth: the job publishes the node
//! through the same code path as a local run ([`super::node::resolve`], with
//! its node lock and atomic publish), and the coordinator reads the outcome
//! back from the index. A node finished by a job whose coordinator died is a
//! cache hit for the next run. Two coordinators never submit the same key
//! twice while a job for it is queued or running (a per-key submit lock and
//! the recorded job id), and even if they did, the node lock lets one job run
//! it while the other waits and then finds it cached.

mod adopt;
mod end;
mod job;
mod queue;
mod script;
mod ticket;

pub use job::{exec_node, read_ticket, record};
pub use queue::{retryable, JobEnd, Tracker};
pub use script::{check_resources, job_script};
pub use ticket::{log_path, result_path, ticket_path, JobResult, Ticket};

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::node::{Executor, NodeJob, NodeObserver, Outcome, ToRun};
use super::signal::interrupted;
use crate::dag::key::EnvPart;
use crate::spec::{ExecutorKind, NodeDef, SlurmResources, Spec};
use crate::store::{last_lines, NodeOutcome, OutputRecord};
use adopt::{submit_or_adopt, Submission};
use end::describe_end;
use queue::DETACHED;
use ticket::read_result;

/// The workspace folder holding tickets, job scripts, job ids, logs and results.
pub const DIR: &str = "slurm";

/// How the coordinator submits and tracks jobs.
#[derive(Debug, Clone)]
pub struct SlurmSettings {
    /// The `orchestrate` binary the jobs run; it must be reachable at this
    /// path from the compute nodes (a shared filesystem).
    pub exe: PathBuf,
    /// How often `squeue` is asked about the tracked jobs.
    pub poll: Duration,
}

/// Why the Slurm executor or a job of it cannot go on; each says what to check.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(
        "no ticket for key {key} at {} ({source}): exec-node runs nodes submitted by `orchestrate run` with executor slurm, \
         and the workspace must be on a filesystem this host shares with the coordinator",
        .path.display()
    )]
    NoTicket {
        key: crate::store::Key,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a ticket: {source}", .path.display())]
    NotATicket {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{}: ticket version {found} but this orchestrate reads version {}; the coordinator and the job run different orchestrate builds",
        .path.display(),
        ticket::TICKET_VERSION
    )]
    TicketVersion { path: PathBuf, found: u32 },
    #[error("{}: the ticket is for key {found}, not {key}", .path.display())]
    WrongTicket { path: PathBuf, found: crate::store::Key, key: crate::store::Key },
    /// A ticket, a result or a script file not written (the message names it).
    #[error("{0}")]
    Write(String),
    #[error("cannot find the orchestrate executable: {0}")]
    Exe(#[source] std::io::Error),
    #[error(transparent)]
    Env(#[from] crate::net::EnvVarError),
    #[error("executor slurm: `{tool} --version` failed ({status}): {stderr}")]
    ToolFailed { tool: String, status: String, stderr: String },
    #[error("executor slurm: {0}")]
    CannotRun(String),
    #[error("node '{node}': {problem}")]
    Resources { node: String, problem: String },
}

impl Default for SlurmSettings {
    /// This executable (`orchestrate` on PATH if it cannot be found), polling every 2 s.
    fn default() -> SlurmSettings {
        SlurmSettings {
            exe: std::env::current_exe().unwrap_or_else(|_| "orchestrate".into()),
            poll: Duration::from_secs(2),
        }
    }
}

impl SlurmSettings {
    /// The defaults, with `ORCHESTRATE_SLURM_POLL` seconds if set; errors
    /// where the executable cannot be found or the variable is no number.
    pub fn for_this_exe() -> Result<SlurmSettings, SlurmError> {
        let exe = std::env::current_exe().map_err(SlurmError::Exe)?;
        let mut settings = SlurmSettings { exe, ..SlurmSettings::default() };
        if let Ok(s) = std::env::var("ORCHESTRATE_SLURM_POLL") {
            let secs: f64 =
                s.parse().ok().filter(|v: &f64| v.is_finite() && *v > 0.0).ok_or_else(|| crate::net::EnvVarError {
                    name: "ORCHESTRATE_SLURM_POLL".into(),
                    value: s.clone(),
                    expected: "a positive number of seconds".into(),
                })?;
            settings.poll = Duration::from_secs_f64(secs);
        }
        Ok(settings)
    }
}

/// Checks that `sbatch`, `squeue` and `scancel` can be run here, before anything is submitted.
pub fn check_available() -> Result<(), SlurmError> {
    for tool in ["sbatch", "squeue", "scancel"] {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(SlurmError::ToolFailed {
                    tool: tool.into(),
                    status: out.status.to_string(),
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                })
            }
            Err(e) => return Err(SlurmError::CannotRun(cannot_run(tool, &e))),
        }
    }
    Ok(())
}

/// Why a Slurm command could not be started.
fn cannot_run(tool: &str, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        format!("`{tool}` is not on PATH; run on a Slurm login node, or use --executor local")
    } else {
        format!("cannot run `{tool}`: {e}")
    }
}

/// The environment a numerical node is keyed on. Under Slurm it is where the
/// job will run, not where the coordinator runs: `cuda` if the node's job asks
/// for GPUs, else `cpu` (and the job is started with that `ORCHESTRATE_DEVICE`).
/// A node's own `threads` replace the worker's default count.
pub fn node_env(executor: ExecutorKind, def: &NodeDef, base: &EnvPart) -> EnvPart {
    let threads = def.threads.or(base.threads);
    match executor {
        ExecutorKind::Local => EnvPart { threads, ..base.clone() },
        ExecutorKind::Slurm => EnvPart { device: device_for(&def.resources).to_string(), threads, ..base.clone() },
    }
}

fn device_for(res: &SlurmResources) -> &'static str {
    if res.gpus.unwrap_or(0) > 0 {
        "cuda"
    } else {
        "cpu"
    }
}

/// Everything the Slurm resolution of one node needs beyond a [`NodeJob`].
pub struct SlurmRun<'a> {
    pub settings: &'a SlurmSettings,
    pub tracker: &'a Tracker,
    pub spec: &'a Spec,
}

/// Runs a node as a Slurm job: submits it (or adopts a live job another run
/// submitted for the same key), waits, and reads the outcome back from the cache.
impl Executor for SlurmRun<'_> {
    fn execute(&self, job: &NodeJob<'_>, to_run: &ToRun<'_>, observer: &mut dyn NodeObserver) -> Outcome {
        execute(self, job, to_run, observer)
    }
}

fn execute(run: &SlurmRun<'_>, job: &NodeJob<'_>, to_run: &ToRun<'_>, observer: &mut dyn NodeObserver) -> Outcome {
    let key = to_run.key.clone();
    let cached = || -> Option<Vec<OutputRecord>> { job.cached_valid(&key).ok()?.ok() };
    if interrupted() {
        return to_run.failed("not submitted: the run was interrupted".into());
    }
    // A local miss: the shared remote cache may have it (`run --remote`),
    // fetched into the shared workspace by this process, before any job.
    let mut reason = to_run.reason.to_string();
    match job.from_remote(&key) {
        Ok(Some(cached)) => return cached,
        Ok(None) => {}
        Err(why) => reason = format!("{reason}; {why}"),
    }
    let ws = job.ws.root();
    let res = &job.node.def.resources;

    // Up to `retries` resubmissions of a job that Slurm ended (time limit,
    // preemption, a lost node) before the node finished.
    let retries = res.retries.unwrap_or(0);
    let mut retried = 0;
    loop {
        let submitted = submit_or_adopt(job, run, &key, &cached);
        let (job_id, adopted) = match submitted {
            Ok(Submission::Submitted(id)) => (id, false),
            Ok(Submission::Adopted(id)) => (id, true),
            Ok(Submission::Cached(outputs)) => {
                return Outcome::Cached { key, outputs, remote: None, restored: None, moved: Vec::new() }
            }
            Err(e) => return to_run.failed(e),
        };
        if adopted {
            observer.waiting(&key, &format!("another orchestrate run already submitted it as Slurm job {job_id}"));
        } else if retried > 0 {
            observer.waiting(&key, &format!("resubmitted as Slurm job {job_id} (retry {retried} of {retries})"));
        } else {
            observer.started(&key, &format!("{reason}; Slurm job {job_id}"));
        }
        run.tracker.add(&job_id, adopted);
        let mut reported_pending = String::new();
        let end = run.tracker.wait(&job_id, |state, reason| {
            // `Priority` and `None` are the normal wait; other reasons (Resources,
            // ReqNodeNotAvail, a QOS limit) are worth a line, once each.
            let routine = ["", "None", "Priority"].contains(&reason);
            if state == "PENDING" && !routine && reason != reported_pending {
                reported_pending = reason.to_string();
                observer.waiting(&key, &format!("Slurm job {job_id} is pending ({reason})"));
            }
        });

        if end.state == DETACHED {
            return to_run.failed(
                format!(
                    "not waited for: the run was interrupted; Slurm job {job_id} belongs to another orchestrate run and keeps running"
                ),
            );
        }
        let log = log_path(ws, job.node.id(), &job_id);
        let log_tail = || match last_lines(&log, 16 * 1024, 20).map(|l| l.join("\n")) {
            Some(t) if !t.trim().is_empty() => format!("\n--- last lines of {}:\n{t}", log.display()),
            Some(_) => format!("\n(the job log {} is empty)", log.display()),
            None => {
                format!(
                    "\n(no job log at {}: is the workspace on a filesystem the compute nodes share?)",
                    log.display()
                )
            }
        };
        return match read_result(ws, &key, &job_id) {
            // A network filesystem may show this host stale attributes for a few
            // seconds after another host wrote a file, so a miss is retried briefly.
            Some(r) if matches!(r.outcome, NodeOutcome::Ran | NodeOutcome::Cached) => match (0..10).find_map(|i| {
                if i > 0 {
                    std::thread::sleep(Duration::from_secs(1));
                }
                cached()
            }) {
                Some(outputs) if r.outcome == NodeOutcome::Ran && !adopted => Outcome::Ran {
                    key,
                    outputs,
                    seconds: r.seconds,
                    job: Some(format!("Slurm job {job_id} on {}", r.host)),
                    summary: r.summary.clone(),
                },
                Some(outputs) => Outcome::Cached { key, outputs, remote: None, restored: None, moved: Vec::new() },
                None => to_run.failed(format!(
                    "Slurm job {job_id} on {} reports the node {}, but this coordinator finds no valid cache entry \
                         for it: do the coordinator and the compute nodes share the workspace {}?",
                    r.host,
                    r.outcome,
                    ws.display()
                )),
            },
            Some(r) => to_run.failed(
                // The node's own error already carries the tail of its log.
                format!(
                    "Slurm job {job_id} on {}: {}\n(job log: {})",
                    r.host,
                    r.error.unwrap_or_else(|| "failed".into()),
                    log.display()
                ),
            ),
            None => {
                let what = describe_end(&end, res, run.tracker.was_cancelled(&job_id));
                if retryable(&end.state) && retried < retries && !interrupted() {
                    retried += 1;
                    observer.waiting(&key, &format!("Slurm job {job_id} {what}; resubmitting"));
                    continue;
                }
                to_run.failed(format!("Slurm job {job_id} {what} before the node finished{}", log_tail()))
            }
        };
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;

    #[test]
    fn a_nodes_own_threads_replace_the_default_in_its_key_env_under_either_executor() {
        let base = EnvPart {
            device: "cpu".into(),
            libtorch: "2.11.0".into(),
            cpu: Some("AVX2".into()),
            cpu_vendor: None,
            threads: Some(1),
        };
        let mut def = NodeDef {
            id: "n".into(),
            base_id: "n".into(),
            op: "train.sft".into(),
            params: serde_json::Value::Object(Default::default()),
            inputs: Default::default(),
            binding: Default::default(),
            resources: Default::default(),
            threads: None,
        };
        assert_eq!(node_env(ExecutorKind::Local, &def, &base), base);
        def.threads = Some(2);
        for executor in [ExecutorKind::Local, ExecutorKind::Slurm] {
            assert_eq!(node_env(executor, &def, &base).threads, Some(2));
        }
    }
}

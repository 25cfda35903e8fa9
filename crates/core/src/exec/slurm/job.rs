//! The job side: `orchestrate exec-node` on a compute node reads its ticket,
//! checks it is the node submitted, runs it like a local run, and records the result.

use std::fs;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::ticket::{host, result_path, ticket_path, write_file, JobResult, Ticket, TICKET_VERSION};
use super::SlurmError;
use crate::dag::key::EnvPart;
use crate::dag::Dag;
use crate::exec::node::{resolve, Local, NodeJob, NodeObserver, Outcome};
use crate::spec::Spec;
use crate::store::{now_rfc3339, Key, NodeOutcome, Workspace};

/// Prints what the node does into the job's log.
pub(super) struct JobObserver;

impl NodeObserver for JobObserver {
    fn started(&mut self, key: &Key, reason: &str) {
        println!("running node (key {key}): {reason}");
    }
    fn waiting(&mut self, key: &Key, reason: &str) {
        println!("waiting (key {key}): {reason}");
    }
}

/// Reads a ticket, with an error that says what to check.
pub fn read_ticket(ws: &Path, key: &Key) -> Result<Ticket, SlurmError> {
    let path = ticket_path(ws, key);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(SlurmError::NoTicket { key: key.clone(), path, source }),
    };
    let ticket: Ticket = match serde_json::from_str(&text) {
        Ok(ticket) => ticket,
        Err(source) => return Err(SlurmError::NotATicket { path, source }),
    };
    if ticket.version != TICKET_VERSION {
        return Err(SlurmError::TicketVersion { path, found: ticket.version });
    }
    if &ticket.key != key {
        return Err(SlurmError::WrongTicket { path, found: ticket.key, key: key.clone() });
    }
    Ok(ticket)
}

/// Runs the node of a ticket (already rebuilt from its spec) in this process,
/// records the result file, and returns the outcome. `actual_env` is the
/// numerical environment libtorch sees here (device and CPU capability), asked
/// only for numerical nodes: a job on a node of another kind than its key says
/// fails instead of publishing bytes under a key that does not describe them.
pub fn exec_node<E: std::fmt::Display>(
    ws: &Workspace,
    ticket: &Ticket,
    spec: &Spec,
    dag: &Dag,
    actual_env: impl FnOnce() -> Result<EnvPart, E>,
) -> Result<Outcome, SlurmError> {
    let started = Instant::now();
    let outcome = (|| -> Outcome {
        let fail = |error: String| Outcome::Failed { key: Some(ticket.key.clone()), error, seconds: 0.0 };
        let Some(node) = dag.get(&ticket.node) else {
            return fail(format!(
                "the spec {} no longer has node '{}'; it changed after the node was submitted",
                ticket.spec.display(),
                ticket.node
            ));
        };
        if let (true, Some(keyed)) = (node.op.numerical(), ticket.env.as_ref()) {
            let actual = match actual_env() {
                Ok(env) => env,
                Err(e) => return fail(format!("cannot determine the numerical environment: {e}")),
            };
            if keyed.device == "cuda" && actual.device != "cuda" {
                return fail(format!(
                    "node '{}' is keyed on device cuda (its job asks for GPUs) but libtorch sees only {} on {}; \
                     check the job's --gpus-per-node and the CUDA setup (setup lines)",
                    ticket.node,
                    actual.device,
                    host()
                ));
            }
            let kind =
                |e: &EnvPart| format!("{} {}", e.cpu.as_deref().unwrap_or("-"), e.cpu_vendor.as_deref().unwrap_or("-"));
            if keyed.cpu.is_some() && (keyed.cpu != actual.cpu || keyed.cpu_vendor != actual.cpu_vendor) {
                return fail(format!(
                    "node '{}' is keyed on CPU {} (the coordinator's machine) but {} has {}: libtorch would \
                     compute other bytes there; constrain the jobs to that CPU kind (e.g. an sbatch \
                     --constraint line) or run the coordinator on one (docs/slurm.md)",
                    ticket.node,
                    kind(keyed),
                    host(),
                    kind(&actual)
                ));
            }
        }
        let index = match ws.index() {
            Ok(i) => i,
            Err(e) => return fail(e.to_string()),
        };
        let cancel = AtomicBool::new(false);
        let nj = NodeJob {
            ws,
            index: &index,
            node,
            spec_name: &spec.name,
            spec_profile: spec.profile.as_deref(),
            spec_dir: &spec.base_dir,
            run_id: &ticket.run_id,
            upstream: &ticket.upstream,
            env: ticket.env.clone(),
            force: ticket.force,
            cancel: &cancel,
            // One node per Slurm job: its CPUs are Slurm's to share out.
            cpu: None,
            remote: None,
        };
        match nj.record() {
            Ok(r) if r.key() == ticket.key => {}
            Ok(r) => {
                return fail(format!(
                    "node '{}' now has key {} but was submitted as {}: its spec, params or dep files changed after \
                     submission; run orchestrate again",
                    ticket.node,
                    r.key().short(),
                    ticket.key.short()
                ))
            }
            Err(e) => return fail(e.to_string()),
        }
        resolve(&nj, &Local, &mut JobObserver, None)
    })();
    record(ws.root(), ticket, &outcome, started.elapsed().as_secs_f64())?;
    Ok(outcome)
}

/// Writes the result file the coordinator reads (`seconds`: this process's time).
pub fn record(ws: &Path, ticket: &Ticket, outcome: &Outcome, seconds: f64) -> Result<(), SlurmError> {
    let job_id = std::env::var("SLURM_JOB_ID").unwrap_or_else(|_| "manual".into());
    let (name, seconds, error, summary) = match outcome {
        Outcome::Ran { seconds, summary, .. } => (NodeOutcome::Ran, *seconds, None, summary.clone()),
        Outcome::Cached { .. } => (NodeOutcome::Cached, seconds, None, None),
        Outcome::Failed { error, .. } => (NodeOutcome::Failed, seconds, Some(error.clone()), None),
        Outcome::Skipped { because } => (NodeOutcome::Failed, seconds, Some(because.clone()), None),
    };
    let result = JobResult {
        key: ticket.key.clone(),
        node: ticket.node.clone(),
        job_id: job_id.clone(),
        host: host(),
        outcome: name,
        seconds,
        error,
        finished_at: now_rfc3339(),
        summary,
    };
    let json = serde_json::to_vec_pretty(&result).expect("results serialize");
    write_file(&result_path(ws, &ticket.key, &job_id), &json).map_err(SlurmError::Write)
}

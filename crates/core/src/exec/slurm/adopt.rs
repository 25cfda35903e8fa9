//! Submitting a node's job, or adopting the live job another coordinator
//! submitted for the same key, under a per-key submit lock.

use std::fs::{self, File};

use super::queue::{is_live, sbatch};
use super::script::job_script;
use super::ticket::{host, job_id_path, script_path, slurm_dir, ticket_path, write_file, Ticket, TICKET_VERSION};
use super::SlurmRun;
use crate::exec::node::NodeJob;
use crate::store::{now_rfc3339, Key, OutputRecord};

pub(super) enum Submission {
    Submitted(String),
    /// A live job another coordinator submitted for the same key.
    Adopted(String),
    /// Finished by someone else meanwhile.
    Cached(Vec<OutputRecord>),
}

/// Under the key's submit lock: adopt a live job for this key, take a cache
/// hit that appeared meanwhile, or write the ticket and script and `sbatch` it.
pub(super) fn submit_or_adopt(
    job: &NodeJob<'_>,
    run: &SlurmRun<'_>,
    key: &Key,
    cached: &dyn Fn() -> Option<Vec<OutputRecord>>,
) -> Result<Submission, String> {
    let ws = job.ws.root();
    let res = &job.node.def.resources;
    let lock_path = slurm_dir(ws, "jobs").join(format!("{key}.lock"));
    fs::create_dir_all(lock_path.parent().expect("folder"))
        .map_err(|e| format!("creating {}: {e}", slurm_dir(ws, "jobs").display()))?;
    let lock = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    if let Ok(previous) = fs::read_to_string(job_id_path(ws, key)) {
        let id = previous.split_whitespace().next().unwrap_or("").to_string();
        if !id.is_empty() && is_live(&id) {
            return Ok(Submission::Adopted(id));
        }
    }
    if !job.force {
        if let Some(outputs) = cached() {
            return Ok(Submission::Cached(outputs));
        }
    }
    let cwd = std::env::current_dir().map_err(|e| format!("cannot read the working folder: {e}"))?;
    for path in [ws, cwd.as_path()] {
        let text = path.display().to_string();
        if text.contains(['"', '\n']) {
            return Err(format!(
                "the path {text:?} cannot be written into an #SBATCH line (it holds a double quote or a newline)"
            ));
        }
    }
    let spec_path =
        std::path::absolute(&run.spec.path).map_err(|e| format!("resolving {}: {e}", run.spec.path.display()))?;
    let ticket = Ticket {
        version: TICKET_VERSION,
        key: key.clone(),
        node: job.node.id().to_string(),
        spec: spec_path,
        profile: run.spec.profile.clone(),
        overrides: run.spec.sources.overrides().iter().map(|o| o.raw.clone()).collect(),
        cwd: cwd.clone(),
        upstream: job.upstream.clone(),
        env: job.env.clone(),
        force: job.force,
        run_id: job.run_id.to_string(),
        coordinator: format!("{}:{}", host(), std::process::id()),
        written_at: now_rfc3339(),
    };
    let json = serde_json::to_vec_pretty(&ticket).expect("tickets serialize");
    write_file(&ticket_path(ws, key), &json)?;
    let script = job_script(&run.settings.exe, ws, job.node.id(), key, res, &cwd);
    for sub in ["logs", "results"] {
        // Slurm does not create the folder of --output; a missing one fails the launch.
        let d = slurm_dir(ws, sub);
        fs::create_dir_all(&d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let script_file = script_path(ws, key);
    write_file(&script_file, script.as_bytes())?;
    let id = sbatch(&script_file)?;
    // The job is queued now: a failure to record its id must not lose track of it.
    if let Err(e) = write_file(&job_id_path(ws, key), format!("{id} {}\n", ticket.coordinator).as_bytes()) {
        eprintln!("warning: Slurm job {id} for node '{}': {e}; another run will not adopt it", job.node.id());
    }
    Ok(Submission::Submitted(id))
}

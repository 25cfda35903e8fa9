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

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::node::{self, why_run, NodeJob, NodeObserver, Outcome};
use crate::dag::key::EnvPart;
use crate::dag::Dag;
use crate::spec::{ExecutorKind, NodeDef, SlurmResources, Spec};
use crate::store::{last_lines, now_rfc3339, write_atomic, NodeOutcome, OutputRecord, Workspace};

/// The workspace folder holding tickets, job scripts, job ids, logs and results.
pub const DIR: &str = "slurm";
const TICKET_VERSION: u32 = 1;

/// How the coordinator submits and tracks jobs.
#[derive(Debug, Clone)]
pub struct SlurmSettings {
    /// The `orchestrate` binary the jobs run; it must be reachable at this
    /// path from the compute nodes (a shared filesystem).
    pub exe: PathBuf,
    /// How often `squeue` is asked about the tracked jobs.
    pub poll: Duration,
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
    pub fn for_this_exe() -> Result<SlurmSettings, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the orchestrate executable: {e}"))?;
        let mut settings = SlurmSettings { exe, ..SlurmSettings::default() };
        if let Ok(s) = std::env::var("ORCHESTRATE_SLURM_POLL") {
            let secs: f64 = s
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("ORCHESTRATE_SLURM_POLL={s}: expected a positive number of seconds"))?;
            settings.poll = Duration::from_secs_f64(secs);
        }
        Ok(settings)
    }
}

/// Checks that `sbatch`, `squeue` and `scancel` can be run here, before anything is submitted.
pub fn check_available() -> Result<(), String> {
    for tool in ["sbatch", "squeue", "scancel"] {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(format!(
                    "executor slurm: `{tool} --version` failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
            Err(e) => return Err(format!("executor slurm: {}", cannot_run(tool, &e))),
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
pub fn node_env(executor: ExecutorKind, def: &NodeDef, base: &EnvPart) -> EnvPart {
    match executor {
        ExecutorKind::Local => base.clone(),
        ExecutorKind::Slurm => EnvPart { device: device_for(&def.resources).to_string(), ..base.clone() },
    }
}

fn device_for(res: &SlurmResources) -> &'static str {
    if res.gpus.unwrap_or(0) > 0 {
        "cuda"
    } else {
        "cpu"
    }
}

// ---------------------------------------------------------------------------
// Interrupts

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    // A second Ctrl-C kills the coordinator at once (its jobs keep running).
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Makes SIGINT and SIGTERM set the interrupt flag instead of killing the
/// process, so the coordinator can cancel its jobs first.
pub fn install_interrupt_handler() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

/// Whether the coordinator was interrupted (Ctrl-C or SIGTERM).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------
// Tickets and results

/// What `exec-node` needs to rebuild a node and check that it is the one submitted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ticket {
    pub version: u32,
    pub key: String,
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
    pub key: String,
    pub node: String,
    pub job_id: String,
    pub host: String,
    /// `ran`, `cached` or `failed`.
    pub outcome: NodeOutcome,
    pub seconds: f64,
    pub error: Option<String>,
    pub finished_at: String,
}

fn slurm_dir(ws: &Path, sub: &str) -> PathBuf {
    ws.join(DIR).join(sub)
}

pub fn ticket_path(ws: &Path, key: &str) -> PathBuf {
    slurm_dir(ws, "tickets").join(format!("{key}.json"))
}

fn script_path(ws: &Path, key: &str) -> PathBuf {
    slurm_dir(ws, "jobs").join(format!("{key}.sh"))
}

fn job_id_path(ws: &Path, key: &str) -> PathBuf {
    slurm_dir(ws, "jobs").join(format!("{key}.id"))
}

pub fn result_path(ws: &Path, key: &str, job_id: &str) -> PathBuf {
    slurm_dir(ws, "results").join(format!("{key}-{job_id}.json"))
}

/// The job's stdout/stderr file (`%j` is the job id).
pub fn log_path(ws: &Path, node: &str, job_id: &str) -> PathBuf {
    slurm_dir(ws, "logs").join(format!("{}-{job_id}.out", safe_name(node)))
}

fn safe_name(node: &str) -> String {
    node.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
}

fn host() -> String {
    let mut buf = [0u8; 256];
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// [`write_atomic`] into a folder it creates, with the path in the error.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path.parent().expect("slurm files live in a folder");
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    write_atomic(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The batch script of one node: `#SBATCH` lines from its resources, its setup
/// lines, then `exec orchestrate exec-node`.
pub fn job_script(exe: &Path, ws: &Path, node: &str, key: &str, res: &SlurmResources, cwd: &Path) -> String {
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name=orchestrate:{}\n", safe_name(node)));
    // sbatch reads double quotes in #SBATCH lines, so paths may hold spaces
    // (submit_or_adopt refuses paths with a double quote or a newline).
    s.push_str(&format!(
        "#SBATCH --output=\"{}\"\n",
        slurm_dir(ws, "logs").join(format!("{}-%j.out", safe_name(node))).display()
    ));
    s.push_str(&format!("#SBATCH --chdir=\"{}\"\n", cwd.display()));
    if let Some(p) = &res.partition {
        s.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(a) = &res.account {
        s.push_str(&format!("#SBATCH --account={a}\n"));
    }
    if let Some(t) = &res.time {
        s.push_str(&format!("#SBATCH --time={t}\n"));
    }
    if let Some(g) = res.gpus.filter(|g| *g > 0) {
        s.push_str(&format!("#SBATCH --gpus-per-node={g}\n"));
    }
    if let Some(c) = res.cpus {
        s.push_str(&format!("#SBATCH --cpus-per-task={c}\n"));
    }
    if let Some(m) = &res.mem {
        s.push_str(&format!("#SBATCH --mem={m}\n"));
    }
    for line in &res.sbatch {
        let line = line.trim();
        let opt = line.strip_prefix("#SBATCH").map(str::trim).unwrap_or(line);
        s.push_str(&format!("#SBATCH {opt}\n"));
    }
    s.push_str(&format!("# node {node}, key {key}\nset -e\n"));
    for line in &res.setup {
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&format!("export ORCHESTRATE_DEVICE={}\n", device_for(res)));
    s.push_str(&format!(
        "exec {} exec-node {} {key}\n",
        shell_quote(&exe.display().to_string()),
        shell_quote(&ws.display().to_string())
    ));
    s
}

/// Checks resources before anything is submitted: sbatch lines must be options.
pub fn check_resources(dag: &Dag) -> Result<(), String> {
    for node in &dag.nodes {
        for line in &node.def.resources.sbatch {
            let opt = line.trim().strip_prefix("#SBATCH").map(str::trim).unwrap_or(line.trim());
            if !opt.starts_with('-') || opt.contains('\n') {
                return Err(format!(
                    "node '{}': sbatch line '{line}' is not an sbatch option (expected e.g. --qos=high)",
                    node.id()
                ));
            }
        }
        for (field, v) in [
            ("partition", &node.def.resources.partition),
            ("account", &node.def.resources.account),
            ("time", &node.def.resources.time),
            ("mem", &node.def.resources.mem),
        ] {
            if let Some(v) = v {
                if v.trim().is_empty() || v.contains(char::is_whitespace) {
                    return Err(format!("node '{}': resources.{field} '{v}' must be one word", node.id()));
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Tracking

/// How a job ended, as Slurm tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEnd {
    pub state: String,
    pub reason: String,
    pub exit: String,
}

#[derive(Default)]
struct TrackState {
    /// Live jobs: state and reason as last seen.
    live: BTreeMap<String, (String, String)>,
    ended: BTreeMap<String, JobEnd>,
    cancelled: BTreeSet<String>,
    /// Jobs another coordinator submitted and this one adopted: never cancelled from here.
    adopted: BTreeSet<String>,
    stop: bool,
    last_error: Option<String>,
}

/// Tracks every job of a run with one `squeue` call per poll.
#[derive(Default)]
pub struct Tracker {
    state: Mutex<TrackState>,
    changed: Condvar,
}

/// Not a Slurm state: the run was interrupted while waiting for an adopted job.
const DETACHED: &str = "DETACHED";

const TERMINAL: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "SPECIAL_EXIT",
];

impl Tracker {
    fn add(&self, id: &str, adopted: bool) {
        let mut st = self.state.lock().expect("tracker");
        if adopted {
            st.adopted.insert(id.to_string());
        }
        st.live.entry(id.to_string()).or_insert_with(|| ("SUBMITTED".into(), String::new()));
    }

    /// Blocks until the job has ended; `seen` hears each new (state, reason).
    fn wait(&self, id: &str, mut seen: impl FnMut(&str, &str)) -> JobEnd {
        let mut last = (String::new(), String::new());
        let mut st = self.state.lock().expect("tracker");
        loop {
            if let Some(end) = st.ended.get(id) {
                return end.clone();
            }
            if interrupted() && st.adopted.contains(id) {
                return JobEnd { state: DETACHED.into(), reason: String::new(), exit: String::new() };
            }
            if let Some(now) = st.live.get(id) {
                if *now != last {
                    last = now.clone();
                    seen(&last.0, &last.1);
                }
            }
            st = self.changed.wait_timeout(st, Duration::from_millis(500)).expect("tracker").0;
        }
    }

    fn was_cancelled(&self, id: &str) -> bool {
        self.state.lock().expect("tracker").cancelled.contains(id)
    }

    pub fn stop(&self) {
        self.state.lock().expect("tracker").stop = true;
        self.changed.notify_all();
    }

    /// The poll loop; returns after [`Tracker::stop`].
    pub fn run(&self, poll: Duration) {
        loop {
            let ids: Vec<String> = {
                let st = self.state.lock().expect("tracker");
                if st.stop {
                    return;
                }
                st.live.keys().cloned().collect()
            };
            if interrupted() {
                let fresh: Vec<String> = {
                    let st = self.state.lock().expect("tracker");
                    ids.iter().filter(|id| !st.cancelled.contains(*id) && !st.adopted.contains(*id)).cloned().collect()
                };
                if !fresh.is_empty() {
                    eprintln!("interrupted: cancelling Slurm job(s) {}", fresh.join(", "));
                    let out = Command::new("scancel").args(&fresh).output();
                    if let Err(e) = &out {
                        eprintln!("scancel failed: {e}; cancel the jobs by hand");
                    }
                    self.state.lock().expect("tracker").cancelled.extend(fresh);
                }
            }
            if !ids.is_empty() {
                match squeue(&ids) {
                    Ok(seen) => {
                        let mut finished = Vec::new();
                        {
                            let mut st = self.state.lock().expect("tracker");
                            st.last_error = None;
                            for id in &ids {
                                match seen.get(id) {
                                    Some((state, _)) if TERMINAL.contains(&state.as_str()) => finished.push(id.clone()),
                                    Some(now) => {
                                        st.live.insert(id.clone(), now.clone());
                                    }
                                    None => finished.push(id.clone()),
                                }
                            }
                        }
                        for id in finished {
                            let end = final_state(&id, seen.get(&id));
                            let mut st = self.state.lock().expect("tracker");
                            st.live.remove(&id);
                            st.ended.insert(id, end);
                        }
                    }
                    Err(e) => {
                        let mut st = self.state.lock().expect("tracker");
                        if st.last_error.as_deref() != Some(e.as_str()) {
                            eprintln!("squeue failed (retrying every poll): {e}");
                        }
                        st.last_error = Some(e);
                    }
                }
                self.changed.notify_all();
            }
            let st = self.state.lock().expect("tracker");
            if st.stop {
                return;
            }
            let wait = if interrupted() { poll.min(Duration::from_millis(500)) } else { poll };
            let _ = self.changed.wait_timeout(st, wait).expect("tracker");
        }
    }
}

/// State and reason of each listed job still known to `squeue`.
fn squeue(ids: &[String]) -> Result<BTreeMap<String, (String, String)>, String> {
    let out = Command::new("squeue")
        .args(["--noheader", "--format=%i|%T|%r", &format!("--jobs={}", ids.join(","))])
        .output()
        .map_err(|e| cannot_run("squeue", &e))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // A single job id that has left the queue is an error for squeue.
        if stderr.contains("Invalid job id") {
            return Ok(BTreeMap::new());
        }
        return Err(format!("squeue exited with {}: {}", out.status, stderr.trim()));
    }
    let mut seen = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut parts = line.trim().splitn(3, '|');
        let (Some(id), Some(state)) = (parts.next(), parts.next()) else { continue };
        let reason = parts.next().unwrap_or("").to_string();
        seen.insert(id.to_string(), (state.to_string(), reason));
    }
    Ok(seen)
}

/// How a job that left the queue ended: `scontrol` (recent jobs), else `sacct`.
fn final_state(id: &str, last: Option<&(String, String)>) -> JobEnd {
    if let Ok(out) = Command::new("scontrol").args(["show", "job", "--oneliner", id]).output() {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            let field = |name: &str| {
                text.split_whitespace().find_map(|w| w.strip_prefix(name).map(str::to_string)).unwrap_or_default()
            };
            let state = field("JobState=");
            if !state.is_empty() {
                return JobEnd { state, reason: field("Reason="), exit: field("ExitCode=") };
            }
        }
    }
    if let Ok(out) = Command::new("sacct")
        .args(["--noheader", "--parsable2", "--allocations", "--format=State,ExitCode,Reason", "--jobs", id])
        .output()
    {
        if out.status.success() {
            if let Some(line) = String::from_utf8_lossy(&out.stdout).lines().next() {
                let p: Vec<&str> = line.split('|').collect();
                if p.len() >= 2 && !p[0].is_empty() {
                    let state = p[0].split_whitespace().next().unwrap_or(p[0]).to_string();
                    return JobEnd { state, exit: p[1].to_string(), reason: p.get(2).unwrap_or(&"").to_string() };
                }
            }
        }
    }
    match last {
        Some((state, reason)) => JobEnd { state: state.clone(), reason: reason.clone(), exit: String::new() },
        None => JobEnd {
            state: "UNKNOWN".into(),
            reason: "the job left the queue and neither scontrol nor sacct knows it".into(),
            exit: String::new(),
        },
    }
}

// ---------------------------------------------------------------------------
// Submitting and resolving

/// Submits a script; returns the job id.
fn sbatch(script: &Path) -> Result<String, String> {
    let out = Command::new("sbatch").arg("--parsable").arg(script).output().map_err(|e| cannot_run("sbatch", &e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("sbatch refused the job ({}): {}", out.status, err.trim()));
    }
    // `--parsable` prints `ID` or `ID;CLUSTER`.
    let id = stdout.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return Err(format!("sbatch printed no job id: '{}'", stdout.trim()));
    }
    Ok(id)
}

/// Slurm's end states worth resubmitting for: the node did not fail, its job
/// was ended around it. A node's own failure, a cancellation and running out
/// of memory are not retried: they would happen again or were meant.
pub fn retryable(state: &str) -> bool {
    matches!(state, "TIMEOUT" | "PREEMPTED" | "NODE_FAIL" | "BOOT_FAIL")
}

/// Whether a job id is still queued or running.
fn is_live(id: &str) -> bool {
    matches!(squeue(&[id.to_string()]), Ok(seen) if seen.get(id).is_some_and(|(s, _)| !TERMINAL.contains(&s.as_str())))
}

fn read_result(ws: &Path, key: &str, job_id: &str) -> Option<JobResult> {
    let text = fs::read_to_string(result_path(ws, key, job_id)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Everything the Slurm resolution of one node needs beyond a [`NodeJob`].
pub struct SlurmRun<'a> {
    pub settings: &'a SlurmSettings,
    pub tracker: &'a Tracker,
    pub spec: &'a Spec,
}

/// Resolves one node through Slurm: cache hit, or submit (or adopt a live job
/// for the same key), wait, and read the outcome back from the cache.
pub fn resolve(job: &NodeJob<'_>, run: &SlurmRun<'_>, observer: &mut dyn NodeObserver) -> Outcome {
    let start = Instant::now();
    let failed =
        |key: Option<String>, error: String| Outcome::Failed { key, error, seconds: start.elapsed().as_secs_f64() };
    let record = match job.record() {
        Ok(r) => r,
        Err(e) => return failed(None, e),
    };
    let key = record.key();
    let cached = || -> Option<Vec<OutputRecord>> { node::cached_valid(job, &key).ok()?.ok() };
    if !job.force {
        if let Some(outputs) = cached() {
            return Outcome::Cached { key, outputs };
        }
    }
    if interrupted() {
        return failed(Some(key), "not submitted: the run was interrupted".into());
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
            Ok(Submission::Cached(outputs)) => return Outcome::Cached { key, outputs },
            Err(e) => return failed(Some(key), e),
        };
        if adopted {
            observer.waiting(&key, &format!("another orchestrate run already submitted it as Slurm job {job_id}"));
        } else if retried > 0 {
            observer.waiting(&key, &format!("resubmitted as Slurm job {job_id} (retry {retried} of {retries})"));
        } else {
            let reason = if job.force {
                "forced".to_string()
            } else {
                why_run(job.index, job.node.id(), &key, &record).map_or_else(|e| e.to_string(), |r| r.to_string())
            };
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
            return failed(
                Some(key),
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
                },
                Some(outputs) => Outcome::Cached { key, outputs },
                None => failed(
                    Some(key),
                    format!(
                        "Slurm job {job_id} on {} reports the node {}, but this coordinator finds no valid cache entry \
                         for it: do the coordinator and the compute nodes share the workspace {}?",
                        r.host,
                        r.outcome,
                        ws.display()
                    ),
                ),
            },
            Some(r) => failed(
                Some(key),
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
                failed(Some(key), format!("Slurm job {job_id} {what} before the node finished{}", log_tail()))
            }
        };
    }
}

enum Submission {
    Submitted(String),
    /// A live job another coordinator submitted for the same key.
    Adopted(String),
    /// Finished by someone else meanwhile.
    Cached(Vec<OutputRecord>),
}

/// Under the key's submit lock: adopt a live job for this key, take a cache
/// hit that appeared meanwhile, or write the ticket and script and `sbatch` it.
fn submit_or_adopt(
    job: &NodeJob<'_>,
    run: &SlurmRun<'_>,
    key: &str,
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
        key: key.to_string(),
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

/// What happened to a job that ended without its node's result, with Slurm's
/// reason and exit code.
fn describe_end(end: &JobEnd, res: &SlurmResources, cancelled_by_this_run: bool) -> String {
    let what = match end.state.as_str() {
        "CANCELLED" if cancelled_by_this_run => "was cancelled because the run was interrupted".to_string(),
        "CANCELLED" => "was cancelled (scancel, or by an administrator)".to_string(),
        "TIMEOUT" => {
            format!("hit its time limit{}", res.time.as_ref().map(|t| format!(" (time: {t})")).unwrap_or_default())
        }
        "OUT_OF_MEMORY" => {
            format!("ran out of memory{}", res.mem.as_ref().map(|m| format!(" (mem: {m})")).unwrap_or_default())
        }
        "NODE_FAIL" => "was lost with its compute node (NODE_FAIL)".to_string(),
        "PREEMPTED" => "was preempted".to_string(),
        "COMPLETED" => "completed without reporting a result (did exec-node run?)".to_string(),
        other => format!("ended {other}"),
    };
    let mut detail = Vec::new();
    if !end.reason.is_empty() && end.reason != "None" {
        detail.push(format!("reason {}", end.reason));
    }
    if !end.exit.is_empty() {
        detail.push(format!("exit code {}", end.exit));
    }
    if detail.is_empty() {
        what
    } else {
        format!("{what} ({})", detail.join(", "))
    }
}

// ---------------------------------------------------------------------------
// The job side

/// Prints what the node does into the job's log.
struct JobObserver;

impl NodeObserver for JobObserver {
    fn started(&mut self, key: &str, reason: &str) {
        println!("running node (key {key}): {reason}");
    }
    fn waiting(&mut self, key: &str, reason: &str) {
        println!("waiting (key {key}): {reason}");
    }
}

/// Reads a ticket, with an error that says what to check.
pub fn read_ticket(ws: &Path, key: &str) -> Result<Ticket, String> {
    let path = ticket_path(ws, key);
    let text = fs::read_to_string(&path).map_err(|e| {
        format!(
            "no ticket for key {key} at {} ({e}): exec-node runs nodes submitted by `orchestrate run` with executor slurm, \
             and the workspace must be on a filesystem this host shares with the coordinator",
            path.display()
        )
    })?;
    let ticket: Ticket = serde_json::from_str(&text).map_err(|e| format!("{}: not a ticket: {e}", path.display()))?;
    if ticket.version != TICKET_VERSION {
        return Err(format!(
            "{}: ticket version {} but this orchestrate reads version {TICKET_VERSION}; the coordinator and the job run different orchestrate builds",
            path.display(),
            ticket.version
        ));
    }
    if ticket.key != key {
        return Err(format!("{}: the ticket is for key {}, not {key}", path.display(), ticket.key));
    }
    Ok(ticket)
}

/// Runs the node of a ticket (already rebuilt from its spec) in this process,
/// records the result file, and returns the outcome. `actual_env` is the
/// numerical environment libtorch sees here (device and CPU capability), asked
/// only for numerical nodes: a job on a node of another kind than its key says
/// fails instead of publishing bytes under a key that does not describe them.
pub fn exec_node(
    ws: &Workspace,
    ticket: &Ticket,
    spec: &Spec,
    dag: &Dag,
    actual_env: impl FnOnce() -> Result<EnvPart, String>,
) -> Result<Outcome, String> {
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
            spec_dir: &spec.base_dir,
            run_id: &ticket.run_id,
            upstream: &ticket.upstream,
            env: ticket.env.clone(),
            force: ticket.force,
            cancel: &cancel,
        };
        match nj.record() {
            Ok(r) if r.key() == ticket.key => {}
            Ok(r) => {
                return fail(format!(
                    "node '{}' now has key {} but was submitted as {}: its spec, params or dep files changed after \
                     submission; run orchestrate again",
                    ticket.node,
                    &r.key()[..12],
                    &ticket.key[..12.min(ticket.key.len())]
                ))
            }
            Err(e) => return fail(e),
        }
        node::resolve(&nj, &mut JobObserver)
    })();
    record(ws.root(), ticket, &outcome, started.elapsed().as_secs_f64())?;
    Ok(outcome)
}

/// Writes the result file the coordinator reads (`seconds`: this process's time).
pub fn record(ws: &Path, ticket: &Ticket, outcome: &Outcome, seconds: f64) -> Result<(), String> {
    let job_id = std::env::var("SLURM_JOB_ID").unwrap_or_else(|_| "manual".into());
    let (name, seconds, error) = match outcome {
        Outcome::Ran { seconds, .. } => (NodeOutcome::Ran, *seconds, None),
        Outcome::Cached { .. } => (NodeOutcome::Cached, seconds, None),
        Outcome::Failed { error, .. } => (NodeOutcome::Failed, seconds, Some(error.clone())),
        Outcome::Skipped { because } => (NodeOutcome::Failed, seconds, Some(because.clone())),
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
    };
    let json = serde_json::to_vec_pretty(&result).expect("results serialize");
    write_file(&result_path(ws, &ticket.key, &job_id), &json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_carries_resources_and_quotes_paths() {
        let res = SlurmResources {
            partition: Some("gpu".into()),
            account: Some("lab".into()),
            time: Some("4:00:00".into()),
            gpus: Some(2),
            cpus: Some(8),
            mem: Some("64G".into()),
            sbatch: vec!["--qos=high".into(), "#SBATCH --constraint=h100".into()],
            setup: vec!["module load cuda".into()],
            retries: None,
        };
        let s = job_script(
            Path::new("/opt/o r/orchestrate"),
            Path::new("/shared/ws"),
            "grpo@seed=1",
            "abc",
            &res,
            Path::new("/home/x"),
        );
        for line in [
            "#SBATCH --partition=gpu",
            "#SBATCH --account=lab",
            "#SBATCH --time=4:00:00",
            "#SBATCH --gpus-per-node=2",
            "#SBATCH --cpus-per-task=8",
            "#SBATCH --mem=64G",
            "#SBATCH --qos=high",
            "#SBATCH --constraint=h100",
            "#SBATCH --output=\"/shared/ws/slurm/logs/grpo_seed_1-%j.out\"",
            "#SBATCH --chdir=\"/home/x\"",
            "module load cuda",
            "export ORCHESTRATE_DEVICE=cuda",
            "exec '/opt/o r/orchestrate' exec-node '/shared/ws' abc",
        ] {
            assert!(s.lines().any(|l| l == line), "missing line {line:?} in\n{s}");
        }
        // Every #SBATCH line comes before the first command, or sbatch ignores it.
        let first_cmd = s.lines().position(|l| !l.starts_with('#')).unwrap();
        assert!(s.lines().skip(first_cmd).all(|l| !l.starts_with("#SBATCH")), "{s}");
    }

    #[test]
    fn cpu_jobs_are_keyed_and_run_on_cpu() {
        let s = job_script(Path::new("/o"), Path::new("/w"), "n", "k", &SlurmResources::default(), Path::new("/"));
        assert!(s.contains("export ORCHESTRATE_DEVICE=cpu\n"));
        assert!(!s.contains("--gpus"));
    }

    #[test]
    fn node_resources_override_spec_defaults_and_add_lines() {
        let base = SlurmResources {
            partition: Some("cpu".into()),
            time: Some("1:00:00".into()),
            sbatch: vec!["--qos=low".into()],
            ..Default::default()
        };
        let own = SlurmResources {
            partition: Some("gpu".into()),
            gpus: Some(1),
            sbatch: vec!["--exclusive".into()],
            ..Default::default()
        };
        let r = own.over(&base);
        assert_eq!(r.partition.as_deref(), Some("gpu"));
        assert_eq!(r.time.as_deref(), Some("1:00:00"));
        assert_eq!(r.gpus, Some(1));
        assert_eq!(r.sbatch, vec!["--qos=low".to_string(), "--exclusive".to_string()]);
        assert_eq!(r.retries, None);
        let r = SlurmResources { retries: Some(2), ..Default::default() }.over(&base);
        assert_eq!(r.retries, Some(2));
    }

    #[test]
    fn job_ends_name_the_limit_and_slurms_reason() {
        let res = SlurmResources { time: Some("4:00:00".into()), mem: Some("8G".into()), ..Default::default() };
        let end = |state: &str, reason: &str, exit: &str| JobEnd {
            state: state.into(),
            reason: reason.into(),
            exit: exit.into(),
        };
        assert_eq!(
            describe_end(&end("TIMEOUT", "TimeLimit", "0:15"), &res, false),
            "hit its time limit (time: 4:00:00) (reason TimeLimit, exit code 0:15)"
        );
        assert_eq!(describe_end(&end("OUT_OF_MEMORY", "None", ""), &res, false), "ran out of memory (mem: 8G)");
        assert_eq!(
            describe_end(&end("CANCELLED", "None", "0:15"), &res, false),
            "was cancelled (scancel, or by an administrator) (exit code 0:15)"
        );
        assert_eq!(
            describe_end(&end("CANCELLED", "None", "0:15"), &res, true),
            "was cancelled because the run was interrupted (exit code 0:15)"
        );
        assert_eq!(describe_end(&end("DEADLINE", "", ""), &SlurmResources::default(), false), "ended DEADLINE");
    }

    #[test]
    fn only_jobs_ended_around_the_node_are_retried() {
        for state in ["TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL"] {
            assert!(retryable(state), "{state}");
        }
        for state in ["FAILED", "CANCELLED", "OUT_OF_MEMORY", "COMPLETED", "DEADLINE", DETACHED, "UNKNOWN"] {
            assert!(!retryable(state), "{state}");
        }
    }
}

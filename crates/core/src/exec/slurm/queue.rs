//! The queue: submitting with `sbatch`, one poller asking `squeue` about every
//! tracked job, and a job's final state from `scontrol`/`sacct`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::cannot_run;
use crate::exec::signal::interrupted;

/// How a job ended, as Slurm tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEnd {
    pub state: String,
    pub reason: String,
    pub exit: String,
}

#[derive(Default)]
pub(super) struct TrackState {
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
pub(super) const DETACHED: &str = "DETACHED";

pub(super) const TERMINAL: &[&str] = &[
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
    pub(super) fn add(&self, id: &str, adopted: bool) {
        let mut st = self.state.lock().expect("tracker");
        if adopted {
            st.adopted.insert(id.to_string());
        }
        st.live.entry(id.to_string()).or_insert_with(|| ("SUBMITTED".into(), String::new()));
    }

    /// Blocks until the job has ended; `seen` hears each new (state, reason).
    pub(super) fn wait(&self, id: &str, mut seen: impl FnMut(&str, &str)) -> JobEnd {
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

    pub(super) fn was_cancelled(&self, id: &str) -> bool {
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
pub(super) fn squeue(ids: &[String]) -> Result<BTreeMap<String, (String, String)>, String> {
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
pub(super) fn final_state(id: &str, last: Option<&(String, String)>) -> JobEnd {
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

/// Submits a script; returns the job id.
pub(super) fn sbatch(script: &Path) -> Result<String, String> {
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
pub(super) fn is_live(id: &str) -> bool {
    matches!(squeue(&[id.to_string()]), Ok(seen) if seen.get(id).is_some_and(|(s, _)| !TERMINAL.contains(&s.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

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

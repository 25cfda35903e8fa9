//! Events: the only thing the scheduler and the reporters share (as in nextest).

use serde::Serialize;

/// Something that happened during a run.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    RunStarted {
        run_id: String,
        spec: String,
        nodes: usize,
        jobs: usize,
    },
    /// A node starts executing; `reason` says why it was not cached.
    NodeStarted {
        node: String,
        key: String,
        reason: String,
    },
    CacheHit {
        node: String,
        key: String,
    },
    /// Another process holds this node; this run waits for it.
    Waiting {
        node: String,
        key: String,
        reason: String,
    },
    NodeFinished {
        node: String,
        key: String,
        seconds: f64,
    },
    NodeFailed {
        node: String,
        key: Option<String>,
        seconds: f64,
        error: String,
    },
    /// Not run because a node it depends on failed.
    NodeSkipped {
        node: String,
        because: String,
    },
    RunFinished {
        run_id: String,
        ran: usize,
        cached: usize,
        failed: usize,
        skipped: usize,
        seconds: f64,
    },
}

impl Event {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("events serialize")
    }
}

/// Counts at the end of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RunStats {
    pub ran: usize,
    pub cached: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl RunStats {
    pub fn success(&self) -> bool {
        self.failed == 0 && self.skipped == 0
    }
}

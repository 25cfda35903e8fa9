//! Events: the only thing the scheduler and the reporters share (as in nextest).

use crate::store::Key;
use serde::{Deserialize, Serialize};

/// Something that happened during a run. Written to the index and to packs as
/// JSON, and read back as this type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
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
        key: Key,
        reason: String,
    },
    CacheHit {
        node: String,
        key: Key,
        /// The remote cache it was fetched from (absent: the local cache).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        /// Its outputs in the user's tree were checked out of the store
        /// (missing or different there): how many files and bytes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        restored: Option<String>,
        /// Outs so replaced whose bytes the store lacked, and where in the
        /// workspace's trash they were moved (never removed).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        moved: Vec<crate::store::MovedOut>,
    },
    /// Another process holds this node; this run waits for it.
    Waiting {
        node: String,
        key: Key,
        reason: String,
    },
    NodeFinished {
        node: String,
        key: Key,
        seconds: f64,
        /// A training node's headline figures (its `metrics` output holds
        /// the whole history).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<crate::train::metrics::TrainingSummary>,
    },
    NodeFailed {
        node: String,
        key: Option<Key>,
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
    /// A release pack was frozen from this run's results; `root` is the
    /// SHA-256 of its SHA256SUMS (`sha256:HEX`), what `audit --expect` checks.
    PackFrozen {
        run_id: String,
        pack: String,
        root: String,
    },
}

impl Event {
    /// The event's name as written (`node_started`, `cache_hit`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "run_started",
            Event::NodeStarted { .. } => "node_started",
            Event::CacheHit { .. } => "cache_hit",
            Event::Waiting { .. } => "waiting",
            Event::NodeFinished { .. } => "node_finished",
            Event::NodeFailed { .. } => "node_failed",
            Event::NodeSkipped { .. } => "node_skipped",
            Event::RunFinished { .. } => "run_finished",
            Event::PackFrozen { .. } => "pack_frozen",
        }
    }

    /// The node it is about, if any.
    pub fn node(&self) -> Option<&str> {
        match self {
            Event::NodeStarted { node, .. }
            | Event::CacheHit { node, .. }
            | Event::Waiting { node, .. }
            | Event::NodeFinished { node, .. }
            | Event::NodeFailed { node, .. }
            | Event::NodeSkipped { node, .. } => Some(node),
            Event::RunStarted { .. } | Event::RunFinished { .. } | Event::PackFrozen { .. } => None,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::Event;

    #[test]
    fn an_event_reads_back_as_written_and_knows_its_name() {
        let events = [
            Event::RunStarted { run_id: "r".into(), spec: "s".into(), nodes: 2, jobs: 1 },
            Event::NodeFailed { node: "n".into(), key: None, seconds: 0.5, error: "e".into() },
        ];
        for e in events {
            let json: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
            assert_eq!(json["event"], e.kind());
            assert_eq!(serde_json::from_value::<Event>(json).unwrap(), e);
        }
        // A field of no event is refused, not ignored.
        let odd = r#"{"event": "cache_hit", "node": "n", "key": "k", "extra": 1}"#;
        assert!(serde_json::from_str::<Event>(odd).is_err());
    }
}

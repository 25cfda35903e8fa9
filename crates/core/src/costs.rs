//! What a node's process cost: wall-clock seconds and memory. An op measures
//! them and leaves them beside its outputs in its staging folder
//! ([`SIDECAR`]); the executor keeps them in the node's record
//! ([`crate::store::CachedNode::costs`]), never in an output. So no hashed
//! byte holds a duration, and two runs of one key (in two workspaces, on two
//! machines of the same kind) write the same outputs and give every node
//! downstream the same key, as a shared remote cache needs (issue #34).
//!
//! Readers (`status`, `run`'s closing table, the report, `compare`, the
//! TensorBoard export, a pack's manifest) take them from the record. Outputs
//! written before this (the committed packs' metrics and evaluation
//! summaries) still hold them, and are read through [`NodeCosts::legacy`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::canonical::required;

/// The file an op writes its costs to, in its staging folder (never an output).
pub const SIDECAR: &str = ".costs.json";

/// A costs file larger than this is refused (a GRPO run of 10,000 iterations
/// writes about 2 MB).
pub const MAX_SIDECAR_BYTES: u64 = 16 << 20;

/// Wall-clock and memory of one process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCosts {
    pub seconds: f64,
    /// SFT only: the time in forward, backward and optimizer steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimization_seconds: Option<f64>,
    /// `null` where the OS does not report it.
    #[serde(deserialize_with = "required")]
    pub peak_rss_bytes: Option<u64>,
}

/// A GRPO iteration's cost categories, in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IterationCosts {
    pub generation_seconds: f64,
    /// Computing the rewards, every term (a program's replies included);
    /// absent before train.grpo v7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_seconds: Option<f64>,
    pub behavior_verification_seconds: f64,
    pub optimization_with_reference_seconds: f64,
    pub state_hashing_seconds: f64,
    pub loop_seconds: f64,
}

/// What one run of a node's op cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeCosts {
    /// The op's process: its wall-clock seconds (an evaluation's: the
    /// generation's) and peak memory.
    pub process: RunCosts,
    /// `train.grpo`: each iteration this process ran, by iteration number.
    /// A resumed run has none for the iterations its interrupted run took.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub iterations: BTreeMap<usize, IterationCosts>,
}

impl NodeCosts {
    /// Writes the costs into `staging` (as [`SIDECAR`]).
    pub fn write(&self, staging: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(staging.join(SIDECAR), bytes)
    }

    /// The costs an op left in `staging`, if any. A costs file that is a link,
    /// too large or does not read is an error naming it: the op that wrote it
    /// is ours, so that is a defect to report, not a cost to guess.
    pub fn take(staging: &Path) -> Result<Option<NodeCosts>, String> {
        let path = staging.join(SIDECAR);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if !meta.is_file() {
            return Err(format!("{}: the op's costs are not a plain file", path.display()));
        }
        if meta.len() > MAX_SIDECAR_BYTES {
            return Err(format!(
                "{}: the op's costs are {} bytes, over the {MAX_SIDECAR_BYTES} allowed",
                path.display(),
                meta.len()
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut de = serde_json::Deserializer::from_str(&text);
        let costs = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| format!("{}: the op's costs: field {}: {}", path.display(), e.path(), e.inner()))?;
        let _ = std::fs::remove_file(&path);
        Ok(Some(costs))
    }

    /// One iteration cost summed over a run of `iterations` iterations;
    /// undefined if any of them has none (those a resumed run took over from
    /// its interrupted one), or if there are none.
    pub fn total(&self, iterations: usize, cost: fn(&IterationCosts) -> f64) -> Option<f64> {
        (iterations > 0 && self.iterations.keys().copied().eq(0..iterations))
            .then(|| self.iterations.values().map(cost).sum())
    }

    /// The costs that outputs written before they moved to the record hold:
    /// a training node's `metrics` (train.sft before v3, train.grpo before v8)
    /// or an evaluation's `summary` / `results` (its generation seconds and
    /// peak memory). `None` when they hold none.
    pub fn legacy(process: Option<&RunCosts>, iterations: BTreeMap<usize, IterationCosts>) -> Option<NodeCosts> {
        process.map(|p| NodeCosts { process: p.clone(), iterations })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(iterations: &[usize]) -> NodeCosts {
        let one = IterationCosts {
            generation_seconds: 1.0,
            reward_seconds: None,
            behavior_verification_seconds: 0.0,
            optimization_with_reference_seconds: 0.0,
            state_hashing_seconds: 0.0,
            loop_seconds: 2.0,
        };
        NodeCosts {
            process: RunCosts { seconds: 3.0, optimization_seconds: None, peak_rss_bytes: None },
            iterations: iterations.iter().map(|&i| (i, one.clone())).collect(),
        }
    }

    #[test]
    fn a_total_over_iterations_is_undefined_unless_every_iteration_has_its_costs() {
        assert_eq!(costs(&[0, 1, 2]).total(3, |c| c.loop_seconds), Some(6.0));
        // A resumed run that ran iterations 1 and 2 only.
        assert_eq!(costs(&[1, 2]).total(3, |c| c.loop_seconds), None);
        assert_eq!(costs(&[1, 2, 3]).total(3, |c| c.loop_seconds), None);
        assert_eq!(costs(&[]).total(0, |c| c.loop_seconds), None);
    }

    #[test]
    fn costs_round_trip_through_staging_and_a_bad_file_is_named_not_guessed() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(NodeCosts::take(dir.path()).unwrap(), None);
        let c = costs(&[0, 1]);
        c.write(dir.path()).unwrap();
        assert_eq!(NodeCosts::take(dir.path()).unwrap(), Some(c));
        assert!(!dir.path().join(SIDECAR).exists(), "taken, so it never lands among the outputs");
        std::fs::write(dir.path().join(SIDECAR), r#"{"process": {"seconds": "soon", "peak_rss_bytes": null}}"#)
            .unwrap();
        let e = NodeCosts::take(dir.path()).unwrap_err();
        assert!(e.contains(SIDECAR) && e.contains("process.seconds"), "{e}");
        std::fs::remove_file(dir.path().join(SIDECAR)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(SIDECAR)).unwrap();
        assert!(NodeCosts::take(dir.path()).unwrap_err().contains("not a plain file"));
    }
}

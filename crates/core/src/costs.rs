//! What a node's process cost: wall-clock seconds and memory. An op measures
//! them and reports them (the worker's ops in their
//! [`crate::ops::worker::WorkerResult`]); the executor keeps them in the node's record
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

use serde::{Deserialize, Serialize};

use crate::canonical::required;

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
}

//! `orchestrate export tensorboard`: the training curves of a run or a pack as
//! standard TensorBoard event files, one run folder per training node, so
//! `tensorboard --logdir DIR` shows them beside runs of other tools.
//!
//! The format (TensorFlow's `TFRecord` framing around `Event` protobufs):
//! each record is the data's length as a little-endian u64, the masked
//! CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data.
//! The first event of a file says `brain.Event:2`; each later one carries a
//! `Summary` of scalar values at a step.
//!
//! Tags are TRL's GRPO metric names as they reach TensorBoard through
//! transformers' `TensorBoardCallback` (`train/reward`, `train/kl`, ...;
//! evaluation under `eval/`), so an orchestrate run and a TRL run overlay tag
//! by tag. Values orchestrate measures that TRL has no name for are under
//! `orchestrate/`. An undefined value (no update ran, a group of one) is not
//! written, never written as 0.

use crate::ops::artifacts::{ArtifactKind, NodeKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost::Message;

use super::metrics::{user_metrics, user_series};
use super::{NodeView, Result, RunView, ViewError};
use crate::costs::NodeCosts;
use crate::stats::{mean_of as mean, sample_std};
use crate::train::metrics::{GrpoMetrics, SftMetrics, TrainingMetrics};

/// `tensorflow.Event`: the fields written here.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    pub what: Option<What>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with its `simple_value` (a 32-bit float, as
/// TensorBoard stores scalars). Optional so that 0.0 is written, not elided.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// One scalar point.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub tag: std::borrow::Cow<'static, str>,
    pub step: i64,
    pub value: f64,
    /// Seconds since the node started (the event's wall time is the export's
    /// base time plus this).
    pub at: f64,
}

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one framed record.
fn record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// The bytes of one event file: the version event, then one event per
/// (step, tag) in the order given.
pub fn event_file(scalars: &[Scalar], base_time: f64) -> Vec<u8> {
    let mut out = Vec::new();
    let version = Event { wall_time: base_time, step: 0, what: Some(What::FileVersion("brain.Event:2".into())) };
    record(&mut out, &version.encode_to_vec());
    for s in scalars {
        let e = Event {
            wall_time: base_time + s.at,
            step: s.step,
            what: Some(What::Summary(Summary {
                value: vec![SummaryValue { tag: s.tag.to_string(), simple_value: Some(s.value as f32) }],
            })),
        };
        record(&mut out, &e.encode_to_vec());
    }
    out
}

/// GRPO's scalars, one step per iteration; `costs` (the node record's)
/// give the wall time and the cost scalars.
pub fn grpo_scalars(m: &GrpoMetrics, costs: Option<&NodeCosts>) -> Vec<Scalar> {
    let mut out = Vec::new();
    let mut at = 0.0;
    for h in &m.history {
        let cost = costs.and_then(|c| c.iterations.get(&h.iteration));
        // Wall time advances by the iterations that record theirs.
        at += cost.map_or(0.0, |c| c.loop_seconds);
        let step = h.iteration as i64;
        let mut push = |tag: &'static str, v: Option<f64>| {
            if let Some(value) = v.filter(|v| v.is_finite()) {
                out.push(Scalar { tag: tag.into(), step, value, at });
            }
        };
        push("train/reward", Some(h.mean_reward));
        // TRL: the mean over groups of each group's reward std.
        let group = if h.prompts.is_empty() { 0 } else { h.rewards.len() / h.prompts.len() };
        let stds: Option<Vec<f64>> = (group > 0).then(|| h.rewards.chunks(group).filter_map(sample_std).collect());
        push("train/reward_std", stds.and_then(mean));
        push("train/frac_reward_zero_std", Some(h.zero_variance_fraction));
        let over = |f: fn(&crate::train::metrics::UpdateStats) -> f64| mean(h.updates.iter().map(f));
        push("train/loss", over(|u| u.loss));
        push("train/kl", over(|u| u.kl));
        push("train/clip_ratio", over(|u| u.clip_fraction));
        push("train/grad_norm", over(|u| u.grad_norm));
        push("train/learning_rate", over(|u| u.lr));
        if let Some(lengths) = &h.response_tokens {
            push("train/completions/mean_length", mean(lengths.iter().map(|&n| n as f64)));
        }
        let finished = (h.finish.eos + h.finish.length) as f64;
        push("train/completions/clipped_ratio", (finished > 0.0).then(|| h.finish.length as f64 / finished));
        push("orchestrate/behavior_max_gap", Some(h.behavior_max_gap));
        // 1 where the guard refused the iteration's batch (quarantined or rejected).
        let refused = h.guard.decision != crate::guard::codes::Decision::Allow;
        push("orchestrate/refused_batch", Some(if refused { 1.0 } else { 0.0 }));
        push("orchestrate/loop_seconds", cost.map(|c| c.loop_seconds));
        push("orchestrate/reward_seconds", cost.and_then(|c| c.reward_seconds));
        // Each reward term, under TRL's names.
        for (name, t) in &h.reward_terms {
            for (what, v) in [("mean", Some(t.mean)), ("std", t.std)] {
                if let Some(value) = v.filter(|v| v.is_finite()) {
                    out.push(Scalar { tag: format!("train/rewards/{name}/{what}").into(), step, value, at });
                }
            }
        }
    }
    out
}

/// SFT's scalars, one step per update; validation at the update that ended its epoch.
pub fn sft_scalars(m: &SftMetrics, costs: Option<&NodeCosts>) -> Vec<Scalar> {
    let mut out = Vec::new();
    let seconds = costs.map_or(0.0, |c| c.process.seconds);
    let per_update = if m.history.is_empty() { 0.0 } else { seconds / m.history.len() as f64 };
    for (i, u) in m.history.iter().enumerate() {
        let (step, at) = (u.update as i64 + 1, per_update * (i + 1) as f64);
        for (tag, value) in [("train/loss", u.loss), ("train/learning_rate", u.lr), ("train/grad_norm", u.grad_norm)] {
            if value.is_finite() {
                out.push(Scalar { tag: tag.into(), step, value, at });
            }
        }
    }
    for v in &m.validation_history {
        // The last update of that epoch (0 when the epoch made none).
        let (step, at) = m
            .history
            .iter()
            .enumerate()
            .rfind(|(_, u)| u.epoch == v.epoch)
            .map_or((0, 0.0), |(i, u)| (u.update as i64 + 1, per_update * (i + 1) as f64));
        if v.validation_nll.is_finite() {
            out.push(Scalar { tag: "eval/loss".into(), step, value: v.validation_nll, at });
        }
    }
    out
}

/// A node id as one folder name: characters outside `[A-Za-z0-9@=,._+-]`
/// become `_` (an id from a pack is not trusted to be a plain name).
pub fn run_folder(id: &str) -> String {
    let name: String = id
        .chars()
        .map(
            |c| if c.is_ascii_alphanumeric() || matches!(c, '@' | '=' | ',' | '.' | '_' | '+' | '-') { c } else { '_' },
        )
        .collect();
    match name.as_str() {
        "" | "." | ".." => format!("_{name}"),
        _ => name,
    }
}

/// What an export wrote and what it could not read.
#[derive(Debug, Default)]
pub struct Exported {
    /// (node id, event file, scalars written)
    pub written: Vec<(String, PathBuf, usize)>,
    /// (node id, why its metrics could not be read)
    pub unreadable: Vec<(String, String)>,
}

fn training_nodes(src: &RunView) -> Vec<(&NodeView, std::result::Result<&PathBuf, String>)> {
    src.nodes.iter().filter_map(|n| Some((n, n.artifact(ArtifactKind::TrainingMetrics)?))).collect()
}

/// A shell node's scalars: each series metric at its steps under its own
/// name (as the user's trainer logged it), and each of its metrics once, at
/// the last step of its series (0 without one), under `metrics/`. Undefined
/// values are not written. `None`: the node declares neither.
pub fn shell_scalars(n: &NodeView) -> Result<Option<Vec<Scalar>>> {
    let series = user_series(n)?;
    let metrics = user_metrics(n)?;
    if series.is_empty() && metrics.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    let mut last = 0i64;
    for (tag, curve) in series {
        for (step, value) in curve {
            let Some(value) = value.filter(|v| v.is_finite()) else { continue };
            let step = step.round() as i64;
            last = last.max(step);
            out.push(Scalar { tag: tag.clone().into(), step, value, at: 0.0 });
        }
    }
    for (name, value) in metrics {
        if let Some(value) = value.number() {
            out.push(Scalar { tag: format!("metrics/{name}").into(), step: last, value, at: 0.0 });
        }
    }
    Ok(Some(out))
}

/// Writes one run folder per training node of `src` under `dir`. Refuses,
/// before writing anything, a run folder that already exists (TensorBoard
/// would merge its old events with the new ones). Each file is written under
/// a temporary name and renamed, so a folder holds a whole file or none.
pub fn export(src: &RunView, dir: &Path, base_time: f64) -> Result<Exported> {
    let mut out = Exported::default();
    let mut files: Vec<(String, PathBuf, Vec<Scalar>)> = Vec::new();
    let mut folders = BTreeMap::new();
    // Each node with curves: its scalars, or why they cannot be read.
    let mut found: Vec<(&NodeView, std::result::Result<Vec<Scalar>, String>)> = Vec::new();
    for (n, metrics) in training_nodes(src) {
        let metrics = match metrics {
            Ok(metrics) => metrics,
            Err(why) => {
                found.push((n, Err(why)));
                continue;
            }
        };
        let scalars = match TrainingMetrics::read(metrics) {
            Ok(m) => {
                // Wall time from what the record keeps (older metrics: their own costs).
                let costs = n.costs(Some(&m));
                match &m {
                    TrainingMetrics::Grpo(m) => Ok(grpo_scalars(m, costs.as_ref())),
                    TrainingMetrics::Sft(m) => Ok(sft_scalars(m, costs.as_ref())),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        found.push((n, scalars));
    }
    for n in src.nodes.iter().filter(|n| n.kind() == NodeKind::Command) {
        match shell_scalars(n) {
            Ok(None) => {}
            Ok(Some(s)) => found.push((n, Ok(s))),
            Err(e) => found.push((n, Err(e.to_string()))),
        }
    }
    for (n, scalars) in found {
        let folder = run_folder(&n.id);
        if let Some(other) = folders.insert(folder.clone(), n.id.clone()) {
            return Err(ViewError::Invalid(format!(
                "nodes '{other}' and '{}' would share the run folder '{folder}'",
                n.id
            )));
        }
        let path = dir.join(&folder);
        if std::fs::symlink_metadata(&path).is_ok() {
            return Err(ViewError::Invalid(format!(
                "{} already exists: remove it, or export into another folder",
                path.display()
            )));
        }
        match scalars {
            Ok(scalars) => files.push((n.id.clone(), path, scalars)),
            Err(e) => out.unreadable.push((n.id.clone(), e)),
        }
    }
    let host = "orchestrate";
    for (id, folder, scalars) in files {
        std::fs::create_dir_all(&folder).map_err(ViewError::io(format!("creating {}", folder.display())))?;
        let name = format!("events.out.tfevents.{}.{host}", base_time as u64);
        let path = folder.join(&name);
        let tmp = folder.join(format!(".{name}.tmp"));
        // The node ended at the export's time, as far as the file can say.
        let start = base_time - scalars.iter().map(|s| s.at).fold(0.0, f64::max);
        std::fs::write(&tmp, event_file(&scalars, start))
            .map_err(ViewError::io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(ViewError::io(format!("renaming {}", tmp.display())))?;
        out.written.push((id, path, scalars.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_framed_with_the_masked_crc32c_of_its_length_and_of_its_data() {
        // TensorFlow's record_writer: masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8,
        // with CRC-32C("123456789") = 0xe3069283 (the Castagnoli check value).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let mut out = Vec::new();
        record(&mut out, b"abc");
        assert_eq!(out.len(), 8 + 4 + 3 + 4);
        assert_eq!(&out[..8], &3u64.to_le_bytes());
        assert_eq!(&out[12..15], b"abc");
        let crc = crc32c::crc32c(b"abc");
        let masked = crc.rotate_right(15).wrapping_add(0xa282_ead8);
        assert_eq!(&out[15..], &masked.to_le_bytes());
    }

    #[test]
    fn a_zero_is_written_not_elided_and_a_folder_name_never_leaves_its_parent() {
        let bytes = SummaryValue { tag: "x".into(), simple_value: Some(0.0) }.encode_to_vec();
        assert_eq!(bytes, [0x0a, 1, b'x', 0x15, 0, 0, 0, 0]);
        assert_eq!(run_folder("grpo@seed=0"), "grpo@seed=0");
        assert_eq!(run_folder("../x"), ".._x");
        assert_eq!(run_folder(".."), "_..");
        assert_eq!(run_folder("a/b c"), "a_b_c");
    }

    #[test]
    fn the_reward_std_is_the_mean_of_each_groups_sample_std_and_a_group_of_one_has_none() {
        assert_eq!(sample_std(&[1.0]), None);
        assert!((sample_std(&[0.0, 1.0]).unwrap() - 0.5f64.sqrt()).abs() < 1e-15);
    }
}

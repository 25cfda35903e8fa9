//! `analysis.constant_groups`: how often a group of G rewards is constant (so
//! every advantage is exactly zero and the group gives no reward gradient), on
//! constructed rewards, clearly labelled as such, next to the analytic value.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{InputDecl, Op, OpError, OutputDecl, ParamError, RunContext};
use crate::data::rng::Stream;
use crate::train::group_advantages;
use std::collections::{BTreeMap, BTreeSet};

use crate::stats::Interval;
use crate::train::metrics::TrainingMetrics;
use crate::train::params::{FaultFamily, GuardSwitch};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConstantGroupsParams {
    #[serde(default = "d_sizes")]
    pub group_sizes: Vec<usize>,
    /// Per-response success probabilities to study.
    #[serde(default = "d_rates")]
    pub success_rates: Vec<f64>,
    /// Constructed groups drawn per (G, p).
    #[serde(default = "d_trials")]
    pub trials: usize,
    #[serde(default)]
    pub seed: u64,
}

fn d_sizes() -> Vec<usize> {
    vec![2, 4, 8]
}
fn d_rates() -> Vec<f64> {
    vec![0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9]
}
fn d_trials() -> usize {
    20_000
}

pub struct ConstantGroups;

impl Op for ConstantGroups {
    fn name(&self) -> &'static str {
        "analysis.constant_groups"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "frequency of constant (zero-advantage) groups by group size, on constructed rewards"
    }
    type Params = ConstantGroupsParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        if let Some(bad) = p.success_rates.iter().find(|r| !(0.0..=1.0).contains(*r)) {
            return Err(ParamError {
                path: vec!["success_rates".into()],
                message: format!("{bad} is not a probability"),
                unknown_key: false,
            });
        }
        Ok(())
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(Vec::new())
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("table.json"), OutputDecl::file("table.md")]
    }
    fn printed_output(&self) -> Option<&'static str> {
        Some("table.md")
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let mut rows = Vec::new();
        let mut md = String::from("CONSTRUCTED REWARDS (Bernoulli draws, not model responses): share of groups whose advantages are all exactly zero.\n\n| G | p(success) | analytic p^G + (1-p)^G | constructed | groups |\n|---|---|---|---|---|\n");
        for &g in &p.group_sizes {
            for &rate in &p.success_rates {
                let mut rng = Stream::new(p.seed, &format!("constant-groups/{g}/{rate}"));
                let mut constant = 0usize;
                for _ in 0..p.trials {
                    let rewards: Vec<f64> = (0..g)
                        .map(|_| f64::from(u8::from((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= rate)))
                        .collect();
                    if group_advantages(&rewards).iter().all(|a| *a == 0.0) {
                        constant += 1;
                    }
                }
                let analytic = rate.powi(g as i32) + (1.0 - rate).powi(g as i32);
                let observed = constant as f64 / p.trials as f64;
                md.push_str(&format!("| {g} | {rate} | {analytic:.4} | {observed:.4} | {} |\n", p.trials));
                rows.push(json!({"group_size": g, "success_rate": rate, "analytic": analytic, "constructed": observed, "groups": p.trials}));
            }
        }
        let table = json!({"kind": "constructed rewards (Bernoulli), not model responses", "rows": rows});
        ctx.write_output("table.json", serde_json::to_string_pretty(&table).unwrap_or_default() + "\n")?;
        ctx.write_output("table.md", md)
    }
}

/// Params of `analysis.arms`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArmsParams {
    /// The arm of each `training` input, in order (e.g. `on`, `off`).
    pub arms: Vec<String>,
    /// The arm the others are compared with (success difference).
    #[serde(default)]
    pub baseline: Option<String>,
    /// The evaluation population whose greedy success is reported.
    #[serde(default = "d_population")]
    pub population: String,
    /// Sentences printed under the tables (what the comparison does not show).
    #[serde(default)]
    pub notes: Vec<String>,
}

fn d_population() -> String {
    "ALL".into()
}

/// `analysis.arms`: GRPO runs grouped into arms (guard on / off, ...): per run
/// and per arm, held-out success, train reward, bad updates applied,
/// injection-to-detection latency and wasted iterations. The evidence of E1 and
/// E2. Step time is not among them: a duration is no result of the runs' bytes
/// (it is in each node's record, and `compare --group-by seed` sets the arms'
/// side by side), and in an output it would change every key downstream.
pub struct Arms;

/// Mean and sample standard deviation (n − 1) of some values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Moments {
    /// `null` when there are no values.
    pub mean: Option<f64>,
    /// `null` below two values.
    pub std: Option<f64>,
    pub values: Vec<f64>,
}

fn moments(values: &[f64]) -> Moments {
    if values.is_empty() {
        return Moments { mean: None, std: None, values: vec![] };
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let std = (values.len() >= 2).then(|| (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
    Moments { mean: Some(mean), std, values: values.to_vec() }
}

/// One injected fault of a run, and when the guard first refused from then on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRecord {
    pub family: FaultFamily,
    pub at_iteration: u64,
    /// `null`: never detected.
    pub detected_at: Option<u64>,
    pub latency_iterations: Option<u64>,
}

/// One GRPO run of an arm (`summary.json`'s `runs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    pub arm: String,
    pub seed: u64,
    pub guard: GuardSwitch,
    /// Greedy success on the evaluated population; `null` without an evaluation.
    pub success: Option<f64>,
    pub per_draw_success: Option<f64>,
    /// Mean train reward over the run's iterations (`null` if none).
    pub train_reward: Option<f64>,
    /// Only in summaries written before analysis.arms v3: the mean whole
    /// iteration over the iterations no fault touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seconds: Option<f64>,
    pub updates: usize,
    pub bad_updates_applied: u64,
    pub faulted_updates: u64,
    pub faults: Vec<FaultRecord>,
    pub detections: usize,
    pub detection_latency_max: Option<u64>,
    pub undetected_faults: u64,
    pub wasted_iterations: u64,
}

/// The runs of one arm together (`summary.json`'s `arms.<name>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArmSummary {
    pub runs: usize,
    /// The guard settings of its runs (one, unless the arm is mislabelled).
    pub guard: BTreeSet<GuardSwitch>,
    pub seeds: Vec<u64>,
    pub success: Moments,
    pub train_reward: Moments,
    /// Only before analysis.arms v3, as [`RunRecord::step_seconds`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seconds: Option<Moments>,
    pub bad_updates_applied: u64,
    pub faulted_updates: u64,
    pub faults_injected: usize,
    pub undetected_faults: u64,
    pub detection_latency_max: Option<u64>,
    pub wasted_iterations: u64,
}

/// An arm against the baseline arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArmComparison {
    /// Mean success of the arm minus the baseline's (`null` without evaluations).
    pub success_difference: Option<f64>,
    /// Its 95 % bootstrap interval: paired by seed when both arms ran the same
    /// seeds (the seeds are resampled), else the two arms resampled apart.
    pub success_difference_interval: Option<Interval>,
    /// Whether the interval pairs runs by seed.
    pub paired_by_seed: bool,
    /// Only before analysis.arms v3, as [`RunRecord::step_seconds`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_ratio: Option<f64>,
}

/// What `analysis.arms` writes as `summary.json`, and the gates of E1/E2 read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArmsSummary {
    pub runs: Vec<RunRecord>,
    pub arms: BTreeMap<String, ArmSummary>,
    pub baseline: Option<String>,
    pub versus_baseline: BTreeMap<String, ArmComparison>,
}

fn mean_of(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Why a run's record could not be made from its metrics and evaluation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunRecordError {
    #[error("not the metrics of a GRPO run (kind {kind})")]
    NotGrpo { kind: &'static str },
    #[error("bad updates were applied but no fault is listed")]
    UnlistedFault,
    #[error("no population '{population}' in the evaluation (it has {has})")]
    NoPopulation { population: String, has: String },
    #[error("the evaluation has no greedy success rate for population '{population}' (it is empty)")]
    EmptyPopulation { population: String },
}

/// One run's record, from its training metrics and (optionally) its evaluation.
pub fn run_record(
    arm: &str,
    metrics: &TrainingMetrics,
    eval: Option<&super::eval::EvalResults>,
    population: &str,
) -> Result<RunRecord, RunRecordError> {
    let TrainingMetrics::Grpo(metrics) = metrics else {
        return Err(RunRecordError::NotGrpo { kind: metrics.kind() });
    };
    let history = &metrics.history;
    let iterations = metrics.identity.params.iterations as u64;
    let per_iteration = metrics.identity.params.updates_per_iteration as u64;
    let guard = &metrics.guard;
    let detected_at: Vec<u64> = guard.detections.iter().map(|d| d.iteration as u64).collect();
    let mut faults = Vec::new();
    let mut latencies = Vec::new();
    for f in &guard.faults {
        let at = f.at_iteration as u64;
        let first = detected_at.iter().copied().filter(|&d| d >= at).min();
        let latency = first.map(|d| d - at);
        if let Some(l) = latency {
            latencies.push(l);
        }
        faults.push(FaultRecord {
            family: f.family,
            at_iteration: at,
            detected_at: first,
            latency_iterations: latency,
        });
    }
    let bad = guard.bad_updates_applied as u64;
    let first_fault = guard.faults.iter().map(|f| f.at_iteration as u64).min();
    // Guard on: a refused iteration's rollouts are discarded. Guard off: every
    // update from the first bad one on builds on corrupted weights and has to be
    // redone from the last clean checkpoint.
    let wasted = match (bad, first_fault) {
        (0, _) => detected_at.iter().collect::<BTreeSet<_>>().len() as u64,
        (_, Some(first)) => iterations.saturating_sub(first),
        (_, None) => return Err(RunRecordError::UnlistedFault),
    };
    let faulted_updates = faults.len() as u64 * per_iteration;
    let reward: Vec<f64> = history.iter().map(|h| h.mean_reward).collect();
    let scores = |mode: &'static str| -> Result<Option<&super::eval::PopulationScore>, RunRecordError> {
        let Some(r) = eval else { return Ok(None) };
        let m = if mode == "greedy" { &r.greedy } else { &r.sample };
        m.population(population).map(Some).ok_or_else(|| RunRecordError::NoPopulation {
            population: population.to_string(),
            has: m.names().collect::<Vec<_>>().join(", "),
        })
    };
    let (greedy, sample) = (scores("greedy")?, scores("sample")?);
    let success = match greedy.map(|g| g.success_rate) {
        Some(None) => return Err(RunRecordError::EmptyPopulation { population: population.to_string() }),
        other => other.flatten(),
    };
    let undetected = (faults.len() - latencies.len()) as u64;
    Ok(RunRecord {
        arm: arm.to_string(),
        seed: metrics.identity.params.seed,
        guard: guard.switch,
        success,
        per_draw_success: sample.and_then(|s| s.success_rate),
        train_reward: mean_of(&reward),
        step_seconds: None,
        updates: metrics.updates,
        bad_updates_applied: bad,
        faulted_updates,
        faults,
        detections: guard.detections.len(),
        detection_latency_max: latencies.iter().max().copied(),
        undetected_faults: undetected,
        wasted_iterations: wasted,
    })
}

/// The per-arm summary of run records (see [`run_record`]).
pub fn summarize(records: &[RunRecord], baseline: Option<&str>) -> ArmsSummary {
    let mut arms = BTreeMap::new();
    for name in records.iter().map(|r| r.arm.clone()).collect::<BTreeSet<_>>() {
        let runs: Vec<&RunRecord> = records.iter().filter(|r| r.arm == name).collect();
        let values = |f: fn(&RunRecord) -> Option<f64>| runs.iter().filter_map(|r| f(r)).collect::<Vec<f64>>();
        arms.insert(
            name,
            ArmSummary {
                runs: runs.len(),
                guard: runs.iter().map(|r| r.guard).collect(),
                seeds: runs.iter().map(|r| r.seed).collect(),
                success: moments(&values(|r| r.success)),
                train_reward: moments(&values(|r| r.train_reward)),
                step_seconds: None,
                bad_updates_applied: runs.iter().map(|r| r.bad_updates_applied).sum(),
                faulted_updates: runs.iter().map(|r| r.faulted_updates).sum(),
                faults_injected: runs.iter().map(|r| r.faults.len()).sum(),
                undetected_faults: runs.iter().map(|r| r.undetected_faults).sum(),
                detection_latency_max: runs.iter().filter_map(|r| r.detection_latency_max).max(),
                wasted_iterations: runs.iter().map(|r| r.wasted_iterations).sum(),
            },
        );
    }
    let mut versus_baseline = BTreeMap::new();
    if let Some(base) = baseline.and_then(|b| arms.get(b)) {
        for (name, arm) in &arms {
            if Some(name.as_str()) == baseline {
                continue;
            }
            let success_difference = match (arm.success.mean, base.success.mean) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            };
            // Paired by seed when every seed ran once in each arm, with an evaluation.
            let by_seed = |arm_name: &str| -> BTreeMap<u64, f64> {
                records.iter().filter(|r| r.arm == arm_name).filter_map(|r| r.success.map(|s| (r.seed, s))).collect()
            };
            let (mine, theirs) = (by_seed(name), by_seed(baseline.unwrap_or_default()));
            let paired = !mine.is_empty()
                && mine.len() == arm.runs
                && theirs.len() == base.runs
                && mine.keys().eq(theirs.keys());
            let success_difference_interval = if paired {
                let pairs: Vec<(f64, f64)> = mine.iter().map(|(seed, &s)| (theirs[seed], s)).collect();
                crate::stats::paired_difference(&pairs, 0)
            } else {
                crate::stats::mean_difference(&base.success.values, &arm.success.values, 0)
            };
            versus_baseline.insert(
                name.clone(),
                ArmComparison {
                    success_difference,
                    success_difference_interval,
                    paired_by_seed: paired,
                    step_time_ratio: None,
                },
            );
        }
    }
    ArmsSummary { runs: records.to_vec(), arms, baseline: baseline.map(str::to_string), versus_baseline }
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
}

fn markdown(summary: &ArmsSummary, notes: &[String]) -> String {
    let mut md = String::from("| arm | seed | success | train reward | bad updates | detections | max latency | wasted it. |\n|---|---|---|---|---|---|---|---|\n");
    for r in &summary.runs {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.arm,
            r.seed,
            fmt(r.success, 4),
            fmt(r.train_reward, 4),
            r.bad_updates_applied,
            r.detections,
            r.detection_latency_max.map_or("-".into(), |l| l.to_string()),
            r.wasted_iterations
        ));
    }
    md.push_str("\n| arm | runs | guard | success mean ± sd | train reward mean ± sd | bad updates / faulted | undetected faults | wasted it. |\n|---|---|---|---|---|---|---|---|\n");
    let pm = |m: &Moments, d: usize| format!("{} ± {}", fmt(m.mean, d), fmt(m.std, d));
    for (name, a) in &summary.arms {
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} / {} | {} | {} |\n",
            a.runs,
            a.guard.iter().map(|g| GuardSwitch::label(*g)).collect::<Vec<_>>().join(", "),
            pm(&a.success, 4),
            pm(&a.train_reward, 4),
            a.bad_updates_applied,
            a.faulted_updates,
            a.undetected_faults,
            a.wasted_iterations
        ));
    }
    if let Some(base) = &summary.baseline {
        for (name, c) in &summary.versus_baseline {
            let interval = match &c.success_difference_interval {
                Some(i) => format!(
                    " [{:+.4}, {:+.4}] (95% bootstrap interval, {})",
                    i.low,
                    i.high,
                    if c.paired_by_seed { "seeds paired" } else { "arms resampled apart" }
                ),
                None => String::new(),
            };
            md.push_str(&format!(
                "\n{name} vs {base}: success difference {}{interval}\n",
                fmt(c.success_difference, 4)
            ));
        }
    }
    for n in notes {
        md.push_str(&format!("\n{n}\n"));
    }
    md
}

impl Op for Arms {
    fn name(&self) -> &'static str {
        "analysis.arms"
    }
    /// 2: the success difference's bootstrap interval, the guard column in the
    /// markdown (one shared type for summary.json).
    /// 3: no step time (a duration, kept in each node's record, not a result).
    fn version(&self) -> u32 {
        3
    }
    fn summary(&self) -> &'static str {
        "GRPO runs grouped into arms: success, reward, bad updates, detection latency, waste"
    }
    type Params = ArmsParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        if p.arms.is_empty() {
            return Err(ParamError { path: vec!["arms".into()], message: "no arms named".into(), unknown_key: false });
        }
        if let Some(b) = &p.baseline {
            if !p.arms.contains(b) {
                return Err(ParamError {
                    path: vec!["baseline".into()],
                    message: format!("'{b}' is not one of the arms ({})", p.arms.join(", ")),
                    unknown_key: false,
                });
            }
        }
        Ok(())
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("training", "train.grpo metrics, one per run"),
            InputDecl::optional("evals", "eval.score results, one per run, in the same order"),
        ])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("summary.json"), OutputDecl::file("summary.md")]
    }
    fn printed_output(&self) -> Option<&'static str> {
        Some("summary.md")
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let training = ctx.inputs.get("training").cloned().unwrap_or_default();
        let evals = ctx.inputs.get("evals").cloned().unwrap_or_default();
        if training.len() != p.arms.len() || (!evals.is_empty() && evals.len() != training.len()) {
            return Err(OpError::Failed(format!(
                "{} arms named for {} training inputs and {} evals (evals are optional, but one per run when given)",
                p.arms.len(),
                training.len(),
                evals.len()
            )));
        }
        let mut records = Vec::new();
        for (i, (arm, input)) in p.arms.iter().zip(&training).enumerate() {
            let metrics = TrainingMetrics::read(&input.path)?;
            let eval = match evals.get(i) {
                Some(e) => Some(super::eval::EvalResults::read(&e.path)?),
                None => None,
            };
            records.push(
                run_record(arm, &metrics, eval.as_ref(), &p.population)
                    .map_err(|e| OpError::Failed(format!("training input {i} ({}): {e}", input.path.display())))?,
            );
        }
        let summary = summarize(&records, p.baseline.as_deref());
        let text = serde_json::to_string_pretty(&summary).map_err(|e| OpError::Failed(e.to_string()))?;
        ctx.write_output("summary.json", text + "\n")?;
        ctx.write_output("summary.md", markdown(&summary, &p.notes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GRPO metrics of 6 iterations × 2 updates, 3 recorded, with these faults and detections.
    fn metrics(guard: &str, faults: Value, detections: &[usize], bad: usize) -> TrainingMetrics {
        use crate::train::metrics::*;
        let params: crate::ops::GrpoParams =
            crate::ops::parse_params(&json!({"seed": 3, "iterations": 6, "updates_per_iteration": 2})).unwrap();
        let iteration = |i: usize, reward: f64, faults: &[&str]| GrpoIteration {
            iteration: i,
            prompts: vec![],
            rollouts: [0, 0],
            mean_reward: reward,
            rewards: vec![],
            reward_terms: Default::default(),
            zero_variance_groups: 0,
            zero_variance_fraction: 0.0,
            finish: FinishCounts { eos: 0, length: 0 },
            response_tokens: None,
            behavior_max_gap: 0.0,
            updates: vec![],
            weights_changed: true,
            guard: IterationGuard { decision: crate::guard::Decision::Allow, codes: vec![], rollouts: None },
            canary: crate::guard::Canary { drift: 0.0, baseline: 0.0 },
            faults: faults.iter().map(|f| f.to_string()).collect(),
            costs: None,
        };
        TrainingMetrics::Grpo(GrpoMetrics {
            identity: GrpoIdentity::new(&params, "d".into(), "v".into()),
            lineage: "l".into(),
            next_iteration: 6,
            complete: true,
            updates: 10,
            adam_step: 10,
            scheduler: Scheduler { next_update: 10, total: 12 },
            cursor: Cursor { epoch: 0, offset: 0 },
            consumed_rollouts: vec![],
            rollouts_consumed: 0,
            history: vec![iteration(0, 0.5, &[]), iteration(1, 0.25, &["F3"]), iteration(2, 0.0, &[])],
            reference_digest: "r".into(),
            reference_unchanged: true,
            guard: GuardSummary {
                switch: serde_json::from_value(json!(guard)).unwrap(),
                faults: serde_json::from_value(faults).unwrap(),
                detections: detections
                    .iter()
                    .map(|&i| Detection { iteration: i, decision: crate::guard::Decision::Reject, codes: vec![] })
                    .collect(),
                bad_updates_applied: bad,
                unguarded_updates: 0,
                event_log: EventLogSummary { events: 0 },
            },
            final_model_digest: "f".into(),
            costs: None,
        })
    }
    use serde_json::Value;

    #[test]
    fn latency_is_counted_from_injection_and_an_undetected_fault_has_none() {
        let faults = json!([{"family": "F3", "at_iteration": 1}, {"family": "F2", "at_iteration": 4}]);
        let on = run_record("on", &metrics("on", faults.clone(), &[2], 0), None, "ALL").unwrap();
        assert_eq!(on.faults[0].latency_iterations, Some(1));
        assert_eq!(on.faults[1].latency_iterations, None);
        assert_eq!(on.undetected_faults, 1);
        assert_eq!(on.detection_latency_max, Some(1));
        assert_eq!(on.wasted_iterations, 1);
        // Reward averages every iteration; no duration is a result.
        assert_eq!(on.train_reward, Some(0.25));
        assert_eq!(on.step_seconds, None);
        let off = run_record("off", &metrics("off", faults, &[], 4), None, "ALL").unwrap();
        assert_eq!(off.faulted_updates, 4);
        assert_eq!(off.wasted_iterations, 5, "iterations 1..6 build on the first bad update");
        let s = summarize(&[on, off], Some("off"));
        assert_eq!(s.arms["on"].success.std, None, "one run has no deviation");
        // No evaluation: no success, so no difference and no interval, never 0.
        assert_eq!(s.versus_baseline["on"].success_difference, None);
        assert_eq!(s.versus_baseline["on"].success_difference_interval, None);
        // What is written reads back as the same type (the gates read this file).
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<ArmsSummary>(&text).unwrap(), s);
        use crate::train::metrics::{Scheduler, SftIdentity, SftMetrics};
        let sft_params: crate::ops::SftParams =
            crate::ops::parse_params(&json!({"branch": "sft", "epochs": 1})).unwrap();
        let sft = TrainingMetrics::Sft(SftMetrics {
            identity: SftIdentity::new(&sft_params, "d".into(), 1),
            next_epoch: 1,
            complete: true,
            updates: 1,
            adam_step: 1,
            scheduler: Scheduler { next_update: 1, total: 1 },
            history: vec![],
            validation_history: vec![],
            final_model_digest: "f".into(),
            costs: None,
        });
        assert!(run_record("on", &sft, None, "ALL").unwrap_err().to_string().contains("not the metrics of a GRPO run"));
    }

    /// Before the shared type, a metrics file without `bad_updates_applied` read
    /// as 0 bad updates, which is what the guard-on gates check for.
    #[test]
    fn metrics_without_bad_updates_are_an_error_naming_the_field_never_zero() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics");
        let written = metrics("off", json!([{"family": "F3", "at_iteration": 1}]), &[], 2);
        let mut v = serde_json::to_value(&written).unwrap();
        std::fs::write(&path, v.to_string()).unwrap();
        assert_eq!(TrainingMetrics::read(&path).unwrap(), written, "what is written reads back");
        v["guard"].as_object_mut().unwrap().remove("bad_updates_applied");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = TrainingMetrics::read(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("guard") && err.contains("bad_updates_applied"), "{err}");
    }

    #[test]
    fn moments_use_the_sample_deviation() {
        let m = moments(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m.mean, Some(2.5));
        assert!((m.std.unwrap() - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
    }

    fn with_success(arm: &str, seed: u64, success: f64) -> RunRecord {
        let mut r = run_record(arm, &metrics(arm, json!([]), &[], 0), None, "ALL").unwrap();
        (r.seed, r.success) = (seed, Some(success));
        r
    }

    #[test]
    fn the_success_difference_has_an_interval_paired_by_seed() {
        // Guard on beats off by exactly 0.1 on every seed: the paired interval is
        // that point, though the seeds themselves vary widely.
        let runs: Vec<RunRecord> = (0..5)
            .flat_map(|seed| {
                let base = 0.1 * seed as f64;
                [with_success("on", seed, base + 0.1), with_success("off", seed, base)]
            })
            .collect();
        let s = summarize(&runs, Some("off"));
        let c = &s.versus_baseline["on"];
        assert!(c.paired_by_seed);
        let i = c.success_difference_interval.unwrap();
        assert!((c.success_difference.unwrap() - 0.1).abs() < 1e-12);
        assert!((i.low - 0.1).abs() < 1e-12 && (i.high - 0.1).abs() < 1e-12, "{i:?}");
        // Other seeds in the two arms: resampled apart, and much wider.
        let mut apart = runs.clone();
        for r in apart.iter_mut().filter(|r| r.arm == "on") {
            r.seed += 10;
        }
        let c = &summarize(&apart, Some("off")).versus_baseline["on"];
        assert!(!c.paired_by_seed);
        let i = c.success_difference_interval.unwrap();
        assert!(i.low < 0.0 && i.high > 0.2, "{i:?}");
    }
}

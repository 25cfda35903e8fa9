//! `analysis.constant_groups`: how often a group of G rewards is constant (so
//! every advantage is exactly zero and the group gives no reward gradient), on
//! constructed rewards, clearly labelled as such, next to the analytic value.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{InputDecl, Op, OpError, OutputDecl, ParamError, RunContext};
use crate::data::rng::Stream;
use crate::train::group_advantages;
use crate::train::metrics::TrainingMetrics;

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
        std::fs::write(ctx.output_path("table.json"), serde_json::to_string_pretty(&table).unwrap_or_default() + "\n")
            .map_err(|e| OpError::io("writing table.json", e))?;
        std::fs::write(ctx.output_path("table.md"), md).map_err(|e| OpError::io("writing table.md", e))
    }
}

/// Params of `analysis.arms`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArmsParams {
    /// The arm of each `training` input, in order (e.g. `on`, `off`).
    pub arms: Vec<String>,
    /// The arm the others are compared with (success difference, step-time ratio).
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
/// and per arm, held-out success, train reward, step time, bad updates applied,
/// injection-to-detection latency and wasted iterations. The evidence of E1 and E2.
pub struct Arms;

/// Mean and sample standard deviation (n − 1); the deviation is null below two values.
fn moments(values: &[f64]) -> serde_json::Value {
    if values.is_empty() {
        return json!({"mean": null, "std": null, "values": []});
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let std = if values.len() < 2 {
        serde_json::Value::Null
    } else {
        json!((values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt())
    };
    json!({"mean": mean, "std": std, "values": values})
}

/// One run's record, from its training metrics and (optionally) its evaluation.
pub fn run_record(
    arm: &str,
    metrics: &TrainingMetrics,
    eval: Option<&super::eval::EvalResults>,
    population: &str,
) -> Result<serde_json::Value, String> {
    let TrainingMetrics::Grpo(metrics) = metrics else {
        return Err(format!("not the metrics of a GRPO run (kind {})", metrics.kind()));
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
        faults
            .push(json!({"family": f.family, "at_iteration": at, "detected_at": first, "latency_iterations": latency}));
    }
    let bad = guard.bad_updates_applied as u64;
    let first_fault = guard.faults.iter().map(|f| f.at_iteration as u64).min();
    // Guard on: a refused iteration's rollouts are discarded. Guard off: every
    // update from the first bad one on builds on corrupted weights and has to be
    // redone from the last clean checkpoint.
    let wasted = match (bad, first_fault) {
        (0, _) => detected_at.iter().collect::<std::collections::BTreeSet<_>>().len() as u64,
        (_, Some(first)) => iterations.saturating_sub(first),
        (_, None) => return Err("bad updates were applied but no fault is listed".to_string()),
    };
    let faulted_updates = faults.len() as u64 * per_iteration;
    // Step time over the iterations no fault touched, so both arms time the same work.
    let step: Vec<f64> = history.iter().filter(|h| h.faults.is_empty()).map(|h| h.costs.loop_seconds).collect();
    let reward: Vec<f64> = history.iter().map(|h| h.mean_reward).collect();
    let mean =
        |v: &[f64]| if v.is_empty() { serde_json::Value::Null } else { json!(v.iter().sum::<f64>() / v.len() as f64) };
    let scores = |mode: &'static str| -> Result<Option<&super::eval::PopulationScore>, String> {
        let Some(r) = eval else { return Ok(None) };
        let m = if mode == "greedy" { &r.greedy } else { &r.sample };
        m.population(population).map(Some).ok_or_else(|| format!("no population '{population}' (ALL, ID50, OOD100)"))
    };
    let (greedy, sample) = (scores("greedy")?, scores("sample")?);
    let success = greedy.map(|g| g.success_rate);
    if let Some(None) = success {
        return Err(format!("the evaluation has no greedy success rate for population '{population}' (it is empty)"));
    }
    Ok(json!({
        "arm": arm,
        "seed": metrics.identity.params.seed,
        "guard": guard.switch,
        "success": success,
        "per_draw_success": sample.map(|s| s.success_rate),
        "train_reward": mean(&reward),
        "step_seconds": mean(&step),
        "updates": metrics.updates,
        "bad_updates_applied": bad,
        "faulted_updates": faulted_updates,
        "faults": faults,
        "detections": guard.detections.len(),
        "detection_latency_max": latencies.iter().max(),
        "undetected_faults": faults.len() - latencies.len(),
        "wasted_iterations": wasted,
    }))
}

/// The per-arm summary of run records (see [`run_record`]).
pub fn summarize(records: &[serde_json::Value], baseline: Option<&str>) -> serde_json::Value {
    let mut names: Vec<String> = Vec::new();
    for r in records {
        let a = r["arm"].as_str().unwrap_or_default().to_string();
        if !names.contains(&a) {
            names.push(a);
        }
    }
    let mut arms = serde_json::Map::new();
    for name in &names {
        let runs: Vec<&serde_json::Value> = records.iter().filter(|r| r["arm"] == name.as_str()).collect();
        let f = |k: &str| runs.iter().filter_map(|r| r[k].as_f64()).collect::<Vec<f64>>();
        let sum = |k: &str| runs.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
        let latencies: Vec<u64> = runs.iter().filter_map(|r| r["detection_latency_max"].as_u64()).collect();
        arms.insert(
            name.clone(),
            json!({
                "runs": runs.len(),
                "guard": runs.iter().map(|r| r["guard"].as_str().unwrap_or("?").to_string()).collect::<std::collections::BTreeSet<_>>(),
                "seeds": runs.iter().map(|r| r["seed"].clone()).collect::<Vec<_>>(),
                "success": moments(&f("success")),
                "train_reward": moments(&f("train_reward")),
                "step_seconds": moments(&f("step_seconds")),
                "bad_updates_applied": sum("bad_updates_applied"),
                "faulted_updates": sum("faulted_updates"),
                "faults_injected": runs.iter().map(|r| r["faults"].as_array().map_or(0, Vec::len)).sum::<usize>(),
                "undetected_faults": sum("undetected_faults"),
                "detection_latency_max": latencies.iter().max(),
                "wasted_iterations": sum("wasted_iterations"),
            }),
        );
    }
    let mut comparisons = serde_json::Map::new();
    if let Some(base) = baseline.and_then(|b| arms.get(b).cloned()) {
        for (name, arm) in &arms {
            if Some(name.as_str()) == baseline {
                continue;
            }
            let diff = match (arm["success"]["mean"].as_f64(), base["success"]["mean"].as_f64()) {
                (Some(a), Some(b)) => json!(a - b),
                _ => serde_json::Value::Null,
            };
            let ratio = match (arm["step_seconds"]["mean"].as_f64(), base["step_seconds"]["mean"].as_f64()) {
                (Some(a), Some(b)) if b > 0.0 => json!(a / b),
                _ => serde_json::Value::Null,
            };
            comparisons.insert(name.clone(), json!({"success_difference": diff, "step_time_ratio": ratio}));
        }
    }
    json!({"runs": records, "arms": arms, "baseline": baseline, "versus_baseline": comparisons})
}

fn fmt(v: &serde_json::Value, digits: usize) -> String {
    v.as_f64().map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
}

fn markdown(summary: &serde_json::Value, notes: &[String]) -> String {
    let mut md = String::from("| arm | seed | success | train reward | step s | bad updates | detections | max latency | wasted it. |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in summary["runs"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["arm"].as_str().unwrap_or("?"),
            r["seed"],
            fmt(&r["success"], 4),
            fmt(&r["train_reward"], 4),
            fmt(&r["step_seconds"], 3),
            r["bad_updates_applied"],
            r["detections"],
            r["detection_latency_max"].as_u64().map_or("-".into(), |l| l.to_string()),
            r["wasted_iterations"]
        ));
    }
    md.push_str("\n| arm | runs | success mean ± sd | train reward mean ± sd | step s mean ± sd | bad updates / faulted | undetected faults | wasted it. |\n|---|---|---|---|---|---|---|---|\n");
    let pm = |m: &serde_json::Value, d: usize| format!("{} ± {}", fmt(&m["mean"], d), fmt(&m["std"], d));
    for (name, a) in summary["arms"].as_object().into_iter().flatten() {
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} / {} | {} | {} |\n",
            a["runs"],
            pm(&a["success"], 4),
            pm(&a["train_reward"], 4),
            pm(&a["step_seconds"], 3),
            a["bad_updates_applied"],
            a["faulted_updates"],
            a["undetected_faults"],
            a["wasted_iterations"]
        ));
    }
    if let Some(base) = summary["baseline"].as_str() {
        for (name, c) in summary["versus_baseline"].as_object().into_iter().flatten() {
            md.push_str(&format!(
                "\n{name} vs {base}: success difference {}, step-time ratio {}\n",
                fmt(&c["success_difference"], 4),
                fmt(&c["step_time_ratio"], 3)
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
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "GRPO runs grouped into arms: success, reward, step time, bad updates, detection latency, waste"
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
        std::fs::write(
            ctx.output_path("summary.json"),
            serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n",
        )
        .map_err(|e| OpError::io("writing summary.json", e))?;
        std::fs::write(ctx.output_path("summary.md"), markdown(&summary, &p.notes))
            .map_err(|e| OpError::io("writing summary.md", e))
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
        let iteration = |i: usize, reward: f64, faults: &[&str], seconds: f64| GrpoIteration {
            iteration: i,
            prompts: vec![],
            rollouts: [0, 0],
            mean_reward: reward,
            rewards: vec![],
            zero_variance_groups: 0,
            zero_variance_fraction: 0.0,
            finish: FinishCounts { eos: 0, length: 0 },
            behavior_max_gap: 0.0,
            updates: vec![],
            weights_changed: true,
            guard: IterationGuard { decision: crate::guard::Decision::Allow, codes: vec![], rollouts: None },
            canary: crate::guard::Canary { drift: 0.0, baseline: 0.0 },
            faults: faults.iter().map(|f| f.to_string()).collect(),
            costs: IterationCosts {
                generation_seconds: 0.0,
                behavior_verification_seconds: 0.0,
                optimization_with_reference_seconds: 0.0,
                state_hashing_seconds: 0.0,
                loop_seconds: seconds,
            },
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
            history: vec![iteration(0, 0.5, &[], 2.0), iteration(1, 0.25, &["F3"], 9.0), iteration(2, 0.0, &[], 4.0)],
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
                event_log: EventLogSummary { events: 0, intact: true },
            },
            final_model_digest: "f".into(),
            costs: RunCosts { seconds: 1.0, optimization_seconds: None, peak_rss_bytes: None },
        })
    }
    use serde_json::Value;

    #[test]
    fn latency_is_counted_from_injection_and_an_undetected_fault_has_none() {
        let faults = json!([{"family": "F3", "at_iteration": 1}, {"family": "F2", "at_iteration": 4}]);
        let on = run_record("on", &metrics("on", faults.clone(), &[2], 0), None, "ALL").unwrap();
        assert_eq!(on["faults"][0]["latency_iterations"], 1);
        assert_eq!(on["faults"][1]["latency_iterations"], Value::Null);
        assert_eq!(on["undetected_faults"], 1);
        assert_eq!(on["detection_latency_max"], 1);
        assert_eq!(on["wasted_iterations"], 1);
        // Step time skips the faulted iteration; reward averages every one.
        assert_eq!(on["step_seconds"], 3.0);
        assert_eq!(on["train_reward"], 0.25);
        let off = run_record("off", &metrics("off", faults, &[], 4), None, "ALL").unwrap();
        assert_eq!(off["faulted_updates"], 4);
        assert_eq!(off["wasted_iterations"], 5, "iterations 1..6 build on the first bad update");
        let s = summarize(&[on, off], Some("off"));
        assert_eq!(s["arms"]["on"]["step_seconds"]["std"], Value::Null, "one run has no deviation");
        assert_eq!(s["versus_baseline"]["on"]["step_time_ratio"], 1.0);
        use crate::train::metrics::{RunCosts, Scheduler, SftIdentity, SftMetrics};
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
            costs: RunCosts { seconds: 1.0, optimization_seconds: None, peak_rss_bytes: None },
        });
        assert!(run_record("on", &sft, None, "ALL").unwrap_err().contains("not the metrics of a GRPO run"));
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
        assert_eq!(m["mean"], 2.5);
        assert!((m["std"].as_f64().unwrap() - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
    }
}

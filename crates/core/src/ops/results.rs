//! `results.table`: the results of several policies side by side (JSON and
//! Markdown), with the cost rows of the runs that produced them; printed at the
//! end of `orchestrate run`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::eval::{EvalResults, ALL};
use super::{InputDecl, Op, OpError, OutputDecl, RunContext};
use crate::canonical::required;
use crate::train::metrics::TrainingMetrics;

/// What `results.table` writes as `table.json`, and the report and gates read:
/// one type for both. An undefined rate (an empty population) is `null`, never 0.
/// Fields are in sorted order, as the table has always been written, so its
/// bytes (a cached output) stay the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsTableFile {
    /// Paired comparisons of two policies on the same problems (`None`: a
    /// table written before version 2, which had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparisons: Option<Vec<PairedComparison>>,
    /// The same pairs on per-draw success (`None`: a table written before
    /// version 3, which had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw_comparisons: Option<Vec<PairedDrawComparison>>,
    /// Only in tables written before version 4: what each evaluation cost
    /// (the costs are in each node's record now, see [`crate::costs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation_costs: Option<Vec<EvaluationCost>>,
    pub notes: Vec<String>,
    /// What per-draw success counts.
    pub per_draw_success: String,
    /// Each GRPO run's train reward, first iterations against last (`None`:
    /// a table written before version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_trends: Option<Vec<RewardTrend>>,
    pub rows: Vec<ResultsRow>,
    /// Only in tables written before version 4, as `evaluation_costs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_costs: Option<Vec<TrainingCost>>,
    /// Each training run's updates, rollouts and zero-variance groups
    /// (`None`: a table written before version 4, whose `training_costs` held them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<Vec<TrainingRun>>,
}

/// Greedy pass@1 of `policy` minus `baseline` on the same problems of a
/// population, with a paired bootstrap interval over problems.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedComparison {
    pub baseline: String,
    #[serde(deserialize_with = "required")]
    pub baseline_pass_at_1: Option<f64>,
    /// `None` when undefined (`undefined_because` says why).
    #[serde(deserialize_with = "required")]
    pub difference: Option<crate::stats::Interval>,
    pub policy: String,
    #[serde(deserialize_with = "required")]
    pub policy_pass_at_1: Option<f64>,
    pub population: String,
    /// Problems both policies answered.
    pub problems: usize,
    #[serde(deserialize_with = "required")]
    pub undefined_because: Option<String>,
}

/// Per-draw success of `policy` minus `baseline` on the same problems of a
/// population, with a paired bootstrap interval over problems (each problem
/// counts as its share of correct draws): the success rate GRPO's reward counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedDrawComparison {
    pub baseline: String,
    #[serde(deserialize_with = "required")]
    pub baseline_per_draw: Option<f64>,
    /// `None` when undefined (`undefined_because` says why).
    #[serde(deserialize_with = "required")]
    pub difference: Option<crate::stats::Interval>,
    pub policy: String,
    #[serde(deserialize_with = "required")]
    pub policy_per_draw: Option<f64>,
    pub population: String,
    /// Problems both policies drew for.
    pub problems: usize,
    #[serde(deserialize_with = "required")]
    pub undefined_because: Option<String>,
}

impl PairedComparison {
    /// Its row as the Markdown table and the HTML report show it: who against
    /// whom, population, problems, the two rates, the difference (or why not).
    pub fn cells(&self) -> [String; 6] {
        let rates = (self.baseline_pass_at_1, self.policy_pass_at_1);
        let difference = (self.difference.as_ref(), self.undefined_because.as_deref());
        comparison_cells(&self.policy, &self.baseline, &self.population, self.problems, rates, difference)
    }
}

impl PairedDrawComparison {
    /// Its row, as [`PairedComparison::cells`].
    pub fn cells(&self) -> [String; 6] {
        let rates = (self.baseline_per_draw, self.policy_per_draw);
        let difference = (self.difference.as_ref(), self.undefined_because.as_deref());
        comparison_cells(&self.policy, &self.baseline, &self.population, self.problems, rates, difference)
    }
}

/// One paired comparison's row: rates are (baseline, policy); the difference
/// is its interval or why it is undefined.
fn comparison_cells(
    policy: &str,
    baseline: &str,
    population: &str,
    problems: usize,
    rates: (Option<f64>, Option<f64>),
    difference: (Option<&crate::stats::Interval>, Option<&str>),
) -> [String; 6] {
    [
        format!("{policy} vs {baseline}"),
        population.to_string(),
        problems.to_string(),
        pct(rates.0),
        pct(rates.1),
        interval_text(difference.0, difference.1),
    ]
}

/// Mean train reward of a GRPO run's last `window` iterations minus its first
/// `window`, with a bootstrap interval (iterations resampled in each window).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardTrend {
    #[serde(deserialize_with = "required")]
    pub difference: Option<crate::stats::Interval>,
    #[serde(deserialize_with = "required")]
    pub first_mean: Option<f64>,
    pub iterations: usize,
    #[serde(deserialize_with = "required")]
    pub last_mean: Option<f64>,
    pub run: String,
    #[serde(deserialize_with = "required")]
    pub undefined_because: Option<String>,
    pub window: usize,
}

/// How many iterations the reward trend compares at each end of a GRPO run.
pub const TREND_WINDOW: usize = 20;

/// A fixed seed: the same inputs give the same intervals (and cached bytes).
const BOOTSTRAP_SEED: u64 = 0x5EED_B007;

/// A comparison to report: `policy` against `baseline`, both names of `policies`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Compare {
    pub baseline: String,
    pub policy: String,
}

/// One policy on one population.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsRow {
    #[serde(deserialize_with = "required")]
    pub greedy_pass_at_1: Option<f64>,
    #[serde(deserialize_with = "required")]
    pub json_validity: Option<f64>,
    #[serde(deserialize_with = "required")]
    pub mean_tokens: Option<f64>,
    #[serde(deserialize_with = "required")]
    pub no_eos: Option<f64>,
    pub per_draw_responses: usize,
    #[serde(deserialize_with = "required")]
    pub per_draw_success: Option<f64>,
    pub policy: String,
    pub population: String,
}

/// What one training run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingRun {
    pub run: String,
    pub kind: String,
    pub updates: usize,
    /// GRPO only.
    #[serde(deserialize_with = "required")]
    pub rollouts: Option<usize>,
    /// GRPO only.
    #[serde(deserialize_with = "required")]
    pub zero_variance_groups: Option<usize>,
    /// GRPO only: groups in all (iterations × prompts per iteration).
    #[serde(deserialize_with = "required")]
    pub groups: Option<usize>,
}

/// What one training run cost (tables written before version 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingCost {
    pub kind: String,
    #[serde(deserialize_with = "required")]
    pub peak_rss_bytes: Option<u64>,
    /// GRPO only.
    #[serde(deserialize_with = "required")]
    pub rollouts: Option<usize>,
    pub run: String,
    pub seconds: f64,
    pub updates: usize,
    #[serde(deserialize_with = "required")]
    pub zero_variance_groups: Option<usize>,
}

/// What one evaluation cost (tables written before version 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluationCost {
    pub generation_seconds: f64,
    #[serde(deserialize_with = "required")]
    pub peak_rss_bytes: Option<u64>,
    pub policy: String,
}

/// Params of `results.table`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultsParams {
    /// A name per `evals` input, in order.
    pub policies: Vec<String>,
    /// A name per `training` input, in order.
    #[serde(default)]
    pub runs: Vec<String>,
    /// Sentences printed under the table (limits of the comparison, etc.).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Pairs of policies compared problem by problem (greedy pass@1, paired
    /// bootstrap interval), e.g. `[{baseline: sft, policy: grpo}]`.
    #[serde(default)]
    pub compare: Vec<Compare>,
}

pub struct ResultsTable;

/// A rate as a percentage, or `undefined`.
pub fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "undefined".to_string(), |x| format!("{:.1} %", 100.0 * x))
}

/// A number, or `undefined`.
pub fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "undefined".to_string(), |x| format!("{x:.digits$}"))
}

impl Op for ResultsTable {
    fn name(&self) -> &'static str {
        "results.table"
    }
    /// 2: GRPO reward trends and paired comparisons, with bootstrap intervals.
    /// 3: paired comparisons of per-draw success too.
    /// 4: no cost rows (seconds and memory are in each node's record, and
    ///    `run` and the report show them): a training row per run instead.
    fn version(&self) -> u32 {
        4
    }
    fn summary(&self) -> &'static str {
        "a results table of policies × populations, with each training run's updates (JSON and Markdown)"
    }
    type Params = ResultsParams;
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("evals", "eval.score results, one per policy"),
            InputDecl::optional("training", "training metrics, for the training rows and reward trends"),
        ])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file("table.json"), OutputDecl::file("table.md")]
    }
    fn printed_output(&self) -> Option<&'static str> {
        Some("table.md")
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let evals = ctx.inputs.get("evals").cloned().unwrap_or_default();
        let training = ctx.inputs.get("training").cloned().unwrap_or_default();
        if evals.len() != p.policies.len() || training.len() != p.runs.len() {
            return Err(OpError::Failed(format!(
                "{} policies named for {} evals, {} runs named for {} training inputs",
                p.policies.len(),
                evals.len(),
                p.runs.len(),
                training.len()
            )));
        }
        let mut rows = Vec::new();
        let mut md = String::from("| policy | population | greedy pass@1 | per-draw success | JSON validity | no EOS | mean tokens |\n|---|---|---|---|---|---|---|\n");
        // Each policy's per-problem outcomes: greedy, and draws (if scored with them).
        let mut by_policy = std::collections::BTreeMap::new();
        // Every population any evaluation reports, ALL first.
        let mut populations: Vec<String> = vec![ALL.to_string()];
        for (name, input) in p.policies.iter().zip(&evals) {
            let r = EvalResults::read(&input.path)?;
            by_policy.insert(name.clone(), (r.greedy_problems.clone(), r.sample_problems.clone()));
            for population in r.greedy.names() {
                if !populations.iter().any(|p| p == population) {
                    populations.push(population.to_string());
                }
                let (Some(g), Some(s)) = (r.greedy.population(population), r.sample.population(population)) else {
                    return Err(OpError::Failed(format!(
                        "{}: population '{population}' is in its greedy scores but not in its sampled ones",
                        input.path.display()
                    )));
                };
                let total = g.responses + s.responses;
                // Over both modes; undefined (null) for an empty population, never 0.
                let of_all =
                    |greedy: usize, sample: usize| (total > 0).then(|| (greedy + sample) as f64 / total as f64);
                let tokens = (total > 0).then(|| {
                    let sum = g.mean_response_tokens.unwrap_or_default() * g.responses as f64
                        + s.mean_response_tokens.unwrap_or_default() * s.responses as f64;
                    sum / total as f64
                });
                let row = ResultsRow {
                    policy: name.clone(),
                    population: population.to_string(),
                    greedy_pass_at_1: g.success_rate,
                    per_draw_success: s.success_rate,
                    per_draw_responses: s.responses,
                    json_validity: of_all(g.valid_json, s.valid_json),
                    no_eos: of_all(g.without_eos, s.without_eos),
                    mean_tokens: tokens,
                };
                md.push_str(&format!(
                    "| {name} | {population} | {} | {} ({} draws) | {} | {} | {} |\n",
                    pct(row.greedy_pass_at_1),
                    pct(row.per_draw_success),
                    s.responses,
                    pct(row.json_validity),
                    pct(row.no_eos),
                    num(row.mean_tokens, 1)
                ));
                rows.push(row);
            }
        }
        md.push_str("\nPer-draw success counts every sampled response; it is not best-of-k.\n");
        let mut runs = Vec::new();
        let mut trends = Vec::new();
        for (name, input) in p.runs.iter().zip(&training) {
            let m = TrainingMetrics::read(&input.path)?;
            let run = match &m {
                TrainingMetrics::Grpo(g) => {
                    let rewards: Vec<f64> = g.history.iter().map(|h| h.mean_reward).collect();
                    trends.push(reward_trend(name, &rewards));
                    TrainingRun {
                        run: name.clone(),
                        kind: m.kind().to_string(),
                        updates: g.updates,
                        rollouts: Some(g.rollouts_consumed),
                        zero_variance_groups: Some(g.history.iter().map(|h| h.zero_variance_groups).sum()),
                        groups: Some(g.history.len() * g.identity.params.prompts_per_iteration),
                    }
                }
                TrainingMetrics::Sft(s) => TrainingRun {
                    run: name.clone(),
                    kind: m.kind().to_string(),
                    updates: s.updates,
                    rollouts: None,
                    zero_variance_groups: None,
                    groups: None,
                },
            };
            runs.push(run);
        }
        if !runs.is_empty() {
            md.push_str("\n| training run | updates | rollouts | zero-variance groups |\n|---|---|---|---|\n");
            for r in &runs {
                let zero = match (r.zero_variance_groups, r.groups) {
                    (Some(z), Some(g)) => format!("{z} of {g}"),
                    _ => "-".into(),
                };
                md.push_str(&format!(
                    "| {} ({}) | {} | {} | {zero} |\n",
                    r.run,
                    r.kind,
                    r.updates,
                    r.rollouts.map_or("-".into(), |n| n.to_string())
                ));
            }
        }
        if !trends.is_empty() {
            md.push_str(&format!(
                "\n| GRPO run | mean train reward, first {TREND_WINDOW} iterations | last {TREND_WINDOW} | last − first (95% bootstrap interval) |\n|---|---|---|---|\n"
            ));
            for t in &trends {
                md.push_str(&format!(
                    "| {} | {} | {} | {} |\n",
                    t.run,
                    num(t.first_mean, 3),
                    num(t.last_mean, 3),
                    interval_text(t.difference.as_ref(), t.undefined_because.as_deref())
                ));
            }
        }
        let mut comparisons = Vec::new();
        let mut draw_comparisons = Vec::new();
        for c in &p.compare {
            let (Some(base), Some(pol)) = (by_policy.get(&c.baseline), by_policy.get(&c.policy)) else {
                return Err(OpError::Failed(format!(
                    "compare: {} vs {}: both must be among policies {:?}",
                    c.baseline, c.policy, p.policies
                )));
            };
            for population in &populations {
                comparisons.push(paired(c, population, &base.0, &pol.0));
                draw_comparisons.push(paired_draws(c, population, base.1.as_ref(), pol.1.as_ref()));
            }
        }
        if !comparisons.is_empty() {
            md.push_str("\n| greedy pass@1, same problems | population | problems | baseline | policy | policy − baseline (95% paired bootstrap interval) |\n|---|---|---|---|---|---|\n");
            for c in &comparisons {
                md.push_str(&format!("| {} |\n", c.cells().join(" | ")));
            }
        }
        if !draw_comparisons.is_empty() {
            md.push_str("\n| per-draw success, same problems | population | problems | baseline | policy | policy − baseline (95% paired bootstrap interval over problems) |\n|---|---|---|---|---|---|\n");
            for c in &draw_comparisons {
                md.push_str(&format!("| {} |\n", c.cells().join(" | ")));
            }
        }
        for n in &p.notes {
            md.push_str(&format!("\n{n}\n"));
        }
        let table = ResultsTableFile {
            comparisons: Some(comparisons),
            draw_comparisons: Some(draw_comparisons),
            reward_trends: Some(trends),
            rows,
            training_costs: None,
            evaluation_costs: None,
            training: Some(runs),
            notes: p.notes.clone(),
            per_draw_success: "every sampled response counts; not best-of-k".into(),
        };
        ctx.write_output("table.json", serde_json::to_string_pretty(&table).expect("a table serializes") + "\n")?;
        ctx.write_output("table.md", md)
    }
}

/// An interval as the table prints it, or why it is undefined.
pub fn interval_text(i: Option<&crate::stats::Interval>, undefined: Option<&str>) -> String {
    match (i, undefined) {
        (Some(i), _) => format!("{:+.3} [{:+.3}, {:+.3}]", i.estimate, i.low, i.high),
        (None, Some(why)) => format!("undefined: {why}"),
        (None, None) => "undefined".into(),
    }
}

/// The first and last [`TREND_WINDOW`] iterations' mean rewards, compared.
pub fn reward_trend(run: &str, rewards: &[f64]) -> RewardTrend {
    let n = rewards.len();
    let enough = n >= 2 * TREND_WINDOW;
    let (first, last) =
        if enough { (&rewards[..TREND_WINDOW], &rewards[n - TREND_WINDOW..]) } else { (&[][..], &[][..]) };
    let mean = |xs: &[f64]| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
    RewardTrend {
        run: run.to_string(),
        window: TREND_WINDOW,
        iterations: n,
        first_mean: mean(first),
        last_mean: mean(last),
        difference: crate::stats::mean_difference(first, last, BOOTSTRAP_SEED),
        undefined_because: (!enough)
            .then(|| format!("{n} iterations; two windows of {TREND_WINDOW} need {}", 2 * TREND_WINDOW)),
    }
}

/// Greedy pass@1 of two policies on the problems of `population` both answered.
fn paired(
    c: &Compare,
    population: &str,
    base: &std::collections::BTreeMap<String, super::eval::ProblemOutcome>,
    pol: &std::collections::BTreeMap<String, super::eval::ProblemOutcome>,
) -> PairedComparison {
    let pairs: Vec<(f64, f64)> = base
        .iter()
        .filter(|(_, o)| population == "ALL" || o.population == population)
        .filter_map(|(id, b)| pol.get(id).map(|p| (f64::from(u8::from(b.correct)), f64::from(u8::from(p.correct)))))
        .collect();
    let n = pairs.len();
    let rate = |f: fn(&(f64, f64)) -> f64| (n > 0).then(|| pairs.iter().map(f).sum::<f64>() / n as f64);
    PairedComparison {
        baseline: c.baseline.clone(),
        policy: c.policy.clone(),
        population: population.to_string(),
        problems: n,
        baseline_pass_at_1: rate(|p| p.0),
        policy_pass_at_1: rate(|p| p.1),
        difference: crate::stats::paired_difference(&pairs, BOOTSTRAP_SEED),
        undefined_because: (n == 0).then(|| "no problem of this population was answered by both".to_string()),
    }
}

/// Per-draw success of two policies on the problems of `population` both drew
/// for; each problem is its share of correct draws, so problems are what the
/// bootstrap resamples (a problem's draws are not independent of each other).
fn paired_draws(
    c: &Compare,
    population: &str,
    base: Option<&std::collections::BTreeMap<String, super::eval::DrawOutcomes>>,
    pol: Option<&std::collections::BTreeMap<String, super::eval::DrawOutcomes>>,
) -> PairedDrawComparison {
    let undefined = |why: String| PairedDrawComparison {
        baseline: c.baseline.clone(),
        policy: c.policy.clone(),
        population: population.to_string(),
        problems: 0,
        baseline_per_draw: None,
        policy_per_draw: None,
        difference: None,
        undefined_because: Some(why),
    };
    let (Some(base), Some(pol)) = (base, pol) else {
        let which = if base.is_none() { &c.baseline } else { &c.policy };
        return undefined(format!(
            "{which}'s results were scored before eval.score version 3, without per-problem draws"
        ));
    };
    type Draws = std::collections::BTreeMap<String, super::eval::DrawOutcomes>;
    let ids: Vec<&String> = base
        .iter()
        .filter(|(_, o)| (population == "ALL" || o.population == population) && o.draws > 0)
        .filter(|(id, _)| pol.get(*id).is_some_and(|p| p.draws > 0))
        .map(|(id, _)| id)
        .collect();
    if ids.is_empty() {
        return undefined("no problem of this population was drawn for by both".to_string());
    }
    let n = ids.len();
    let share = |m: &Draws, id: &String| m[id].correct as f64 / m[id].draws as f64;
    let pairs: Vec<(f64, f64)> = ids.iter().map(|id| (share(base, id), share(pol, id))).collect();
    // Per-draw rates over these problems, every draw counted.
    let rate = |m: &Draws| {
        let (correct, draws) = ids.iter().map(|id| &m[*id]).fold((0, 0), |(c, d), o| (c + o.correct, d + o.draws));
        Some(correct as f64 / draws as f64)
    };
    PairedDrawComparison {
        baseline: c.baseline.clone(),
        policy: c.policy.clone(),
        population: population.to_string(),
        problems: n,
        baseline_per_draw: rate(base),
        policy_per_draw: rate(pol),
        difference: crate::stats::paired_difference(&pairs, BOOTSTRAP_SEED),
        undefined_because: None,
    }
}

#[cfg(test)]
mod tests {
    use super::ResultsTableFile;

    #[test]
    fn per_draw_success_is_compared_problem_by_problem_and_undefined_without_draws() {
        use super::super::eval::DrawOutcomes;
        use std::collections::BTreeMap;
        let draws = |correct: &[(usize, &str)]| -> BTreeMap<String, DrawOutcomes> {
            correct
                .iter()
                .enumerate()
                .map(|(i, (c, population))| {
                    (format!("p{i:02}"), DrawOutcomes { population: population.to_string(), draws: 4, correct: *c })
                })
                .collect()
        };
        // 10 ID50 problems: 1 of 4 draws right before, 3 of 4 after; 5 OOD100: none either way.
        let mut before = vec![(1, "ID50"); 10];
        before.extend([(0, "OOD100"); 5]);
        let mut after = vec![(3, "ID50"); 10];
        after.extend([(0, "OOD100"); 5]);
        let (base, pol) = (draws(&before), draws(&after));
        let c = super::Compare { baseline: "sft".into(), policy: "grpo".into() };
        let id50 = super::paired_draws(&c, "ID50", Some(&base), Some(&pol));
        assert_eq!((id50.problems, id50.baseline_per_draw, id50.policy_per_draw), (10, Some(0.25), Some(0.75)));
        let d = id50.difference.unwrap();
        assert_eq!((d.estimate, d.low, d.high), (0.5, 0.5, 0.5));
        let all = super::paired_draws(&c, "ALL", Some(&base), Some(&pol));
        assert_eq!(all.problems, 15);
        assert!((all.difference.unwrap().estimate - 5.0 / 15.0).abs() < 1e-12);
        let ood = super::paired_draws(&c, "OOD100", Some(&base), Some(&pol)).difference.unwrap();
        assert_eq!((ood.estimate, ood.low, ood.high), (0.0, 0.0, 0.0));
        // A problem only one policy drew for is left out of the pairs.
        let mut fewer = pol.clone();
        fewer.remove("p00");
        assert_eq!(super::paired_draws(&c, "ID50", Some(&base), Some(&fewer)).problems, 9);
        // Results scored without per-problem draws: undefined, saying whose and why, never 0.
        let old = super::paired_draws(&c, "ID50", Some(&base), None);
        assert!(old.difference.is_none() && old.policy_per_draw.is_none());
        assert!(old.undefined_because.as_deref().unwrap().contains("grpo's results"), "{old:?}");
        assert!(old.undefined_because.as_deref().unwrap().contains("version 3"), "{old:?}");
    }

    #[test]
    fn a_reward_trend_needs_two_windows_and_sees_a_rise() {
        let short = super::reward_trend("g", &[0.5; 30]);
        assert!(short.difference.is_none() && short.undefined_because.as_deref().unwrap().contains("30 iterations"));
        let mut rising: Vec<f64> = (0..40).map(|i| if i % 2 == 0 { 0.1 } else { 0.3 }).collect();
        rising.extend((0..40).map(|i| if i % 2 == 0 { 0.5 } else { 0.7 }));
        let t = super::reward_trend("g", &rising);
        assert!((t.first_mean.unwrap() - 0.2).abs() < 1e-12 && (t.last_mean.unwrap() - 0.6).abs() < 1e-12, "{t:?}");
        let d = t.difference.unwrap();
        assert!(d.excludes_zero() && d.low > 0.3 && d.high < 0.5, "{d:?}");
    }

    #[test]
    fn the_committed_table_reads_and_a_missing_rate_is_an_error_naming_the_field() {
        use crate::example_packs::{outputs, VERSIONS};
        let pack = |v: &str| outputs(v).join("results/table.json");
        for version in VERSIONS {
            let path = pack(version);
            let table: ResultsTableFile = crate::canonical::read_typed(&path).expect("the committed table reads");
            assert!(!table.rows.is_empty());
            // Written as before, byte for byte: a cached table stays what a new run writes.
            let written = serde_json::to_string_pretty(&table).unwrap() + "\n";
            assert_eq!(written, std::fs::read_to_string(&path).unwrap(), "{version}");
        }
        let path = pack("v0.2.0");

        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["rows"][1].as_object_mut().unwrap().remove("no_eos");
        let dir = tempfile::tempdir().unwrap();
        let edited = dir.path().join("table.json");
        std::fs::write(&edited, v.to_string()).unwrap();
        let err = crate::canonical::read_typed::<ResultsTableFile>(&edited).unwrap_err().to_string();
        assert!(err.contains("table.json") && err.contains("rows[1]") && err.contains("no_eos"), "{err}");
    }
}

//! `results.table`: the results of several policies side by side (JSON and
//! Markdown), with the cost rows of the runs that produced them; printed at the
//! end of `orchestrate run`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::eval::{EvalResults, POPULATIONS};
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
    pub evaluation_costs: Vec<EvaluationCost>,
    pub notes: Vec<String>,
    /// What per-draw success counts.
    pub per_draw_success: String,
    pub rows: Vec<ResultsRow>,
    pub training_costs: Vec<TrainingCost>,
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

/// What one training run cost.
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

/// What one evaluation cost.
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
}

pub struct ResultsTable;

/// A rate as a percentage, or `undefined`.
pub fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "undefined".to_string(), |x| format!("{:.1} %", 100.0 * x))
}

/// A byte count as whole MiB, or `undefined` where it was not measured.
fn mebibytes(bytes: Option<u64>) -> String {
    bytes.map(|b| format!("{:.0}", b as f64 / 1048576.0)).unwrap_or_else(|| "undefined".into())
}

/// A number, or `undefined`.
pub fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "undefined".to_string(), |x| format!("{x:.digits$}"))
}

impl Op for ResultsTable {
    fn name(&self) -> &'static str {
        "results.table"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "a results table of policies × populations, with cost rows (JSON and Markdown)"
    }
    type Params = ResultsParams;
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("evals", "eval.score results, one per policy"),
            InputDecl::optional("training", "training metrics, for the cost rows"),
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
        let mut eval_costs = Vec::new();
        for (name, input) in p.policies.iter().zip(&evals) {
            let r = EvalResults::read(&input.path)?;
            for population in POPULATIONS {
                let (Some(g), Some(s)) = (r.greedy.population(population), r.sample.population(population)) else {
                    unreachable!("POPULATIONS are the populations ModeScores has")
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
            eval_costs.push(EvaluationCost {
                policy: name.clone(),
                generation_seconds: r.generation_seconds,
                peak_rss_bytes: r.peak_rss_bytes,
            });
        }
        md.push_str("\nPer-draw success counts every sampled response; it is not best-of-k.\n\n| cost | seconds | peak RSS (MB) | updates | rollouts | zero-variance groups |\n|---|---|---|---|---|---|\n");
        let mut run_costs = Vec::new();
        for (name, input) in p.runs.iter().zip(&training) {
            let m = TrainingMetrics::read(&input.path)?;
            let (rollouts, zero, zero_text) = match &m {
                TrainingMetrics::Grpo(g) => {
                    let zero: usize = g.history.iter().map(|h| h.zero_variance_groups).sum();
                    let groups = g.history.len() * g.identity.params.prompts_per_iteration;
                    (Some(g.rollouts_consumed), Some(zero), format!("{zero} of {groups}"))
                }
                TrainingMetrics::Sft(_) => (None, None, "-".to_string()),
            };
            let costs = m.costs();
            let rss = mebibytes(costs.peak_rss_bytes);
            md.push_str(&format!(
                "| {name} ({}) | {} | {rss} | {} | {} | {zero_text} |\n",
                m.kind(),
                num(Some(costs.seconds), 1),
                m.updates(),
                rollouts.map_or("-".into(), |r| r.to_string())
            ));
            run_costs.push(TrainingCost {
                run: name.clone(),
                kind: m.kind().to_string(),
                seconds: costs.seconds,
                peak_rss_bytes: costs.peak_rss_bytes,
                updates: m.updates(),
                rollouts,
                zero_variance_groups: zero,
            });
        }
        for c in &eval_costs {
            let rss = mebibytes(c.peak_rss_bytes);
            md.push_str(&format!(
                "| eval {} | {} | {rss} | - | - | - |\n",
                c.policy,
                num(Some(c.generation_seconds), 1)
            ));
        }
        for n in &p.notes {
            md.push_str(&format!("\n{n}\n"));
        }
        let table = ResultsTableFile {
            rows,
            training_costs: run_costs,
            evaluation_costs: eval_costs,
            notes: p.notes.clone(),
            per_draw_success: "every sampled response counts; not best-of-k".into(),
        };
        std::fs::write(
            ctx.output_path("table.json"),
            serde_json::to_string_pretty(&table).expect("a table serializes") + "\n",
        )
        .map_err(|e| OpError::io("writing table.json", e))?;
        std::fs::write(ctx.output_path("table.md"), md).map_err(|e| OpError::io("writing table.md", e))
    }
}

#[cfg(test)]
mod tests {
    use super::ResultsTableFile;

    #[test]
    fn the_committed_table_reads_and_a_missing_rate_is_an_error_naming_the_field() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../artifacts/grpo-main-tiny/v0.1.0/outputs/results/table.json");
        let table: ResultsTableFile = crate::canonical::read_typed(&path).expect("the committed table reads");
        assert!(!table.rows.is_empty());
        // Written as before, byte for byte: a cached table stays what a new run writes.
        let written = serde_json::to_string_pretty(&table).unwrap() + "\n";
        assert_eq!(written, std::fs::read_to_string(&path).unwrap());

        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["rows"][1].as_object_mut().unwrap().remove("no_eos");
        let dir = tempfile::tempdir().unwrap();
        let edited = dir.path().join("table.json");
        std::fs::write(&edited, v.to_string()).unwrap();
        let err = crate::canonical::read_typed::<ResultsTableFile>(&edited).unwrap_err().to_string();
        assert!(err.contains("table.json") && err.contains("rows[1]") && err.contains("no_eos"), "{err}");
    }
}

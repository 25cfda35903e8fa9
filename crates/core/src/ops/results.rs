//! `results.table`: the results of several policies side by side (JSON and
//! Markdown), with the cost rows of the runs that produced them; printed at the
//! end of `orchestrate run`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::eval::{EvalResults, POPULATIONS};
use super::{InputDecl, Op, OpError, OutputDecl, RunContext};
use crate::train::metrics::TrainingMetrics;

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

fn pct(v: &Value) -> String {
    v.as_f64().map_or_else(|| "undefined".to_string(), |x| format!("{:.1} %", 100.0 * x))
}

/// A byte count as whole MiB, or `undefined` where it was not measured.
fn mebibytes(bytes: &Value) -> String {
    bytes.as_f64().map(|b| format!("{:.0}", b / 1048576.0)).unwrap_or_else(|| "undefined".into())
}

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().map_or_else(|| "undefined".to_string(), |x| format!("{x:.digits$}"))
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
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let p = params;
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
                let row = json!({
                    "policy": name, "population": population,
                    "greedy_pass_at_1": g.success_rate, "per_draw_success": s.success_rate,
                    "per_draw_responses": s.responses,
                    "json_validity": of_all(g.valid_json, s.valid_json), "no_eos": of_all(g.without_eos, s.without_eos),
                    "mean_tokens": tokens,
                });
                md.push_str(&format!(
                    "| {name} | {population} | {} | {} ({} draws) | {} | {} | {} |\n",
                    pct(&row["greedy_pass_at_1"]),
                    pct(&row["per_draw_success"]),
                    s.responses,
                    pct(&row["json_validity"]),
                    pct(&row["no_eos"]),
                    num(&row["mean_tokens"], 1)
                ));
                rows.push(row);
            }
            eval_costs.push(
                json!({"policy": name, "generation_seconds": r.generation_seconds, "peak_rss_bytes": r.peak_rss_bytes}),
            );
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
            let rss = mebibytes(&json!(costs.peak_rss_bytes));
            md.push_str(&format!(
                "| {name} ({}) | {} | {rss} | {} | {} | {zero_text} |\n",
                m.kind(),
                num(&json!(costs.seconds), 1),
                m.updates(),
                rollouts.map_or("-".into(), |r| r.to_string())
            ));
            run_costs.push(
                json!({"run": name, "kind": m.kind(), "seconds": costs.seconds, "peak_rss_bytes": costs.peak_rss_bytes,
                "updates": m.updates(), "rollouts": rollouts, "zero_variance_groups": zero}),
            );
        }
        for c in &eval_costs {
            let rss = mebibytes(&c["peak_rss_bytes"]);
            md.push_str(&format!(
                "| eval {} | {} | {rss} | - | - | - |\n",
                c["policy"].as_str().unwrap_or("?"),
                num(&c["generation_seconds"], 1)
            ));
        }
        for n in &p.notes {
            md.push_str(&format!("\n{n}\n"));
        }
        let table = json!({"rows": rows, "training_costs": run_costs, "evaluation_costs": eval_costs, "notes": p.notes,
            "per_draw_success": "every sampled response counts; not best-of-k"});
        std::fs::write(ctx.output_path("table.json"), serde_json::to_string_pretty(&table).unwrap_or_default() + "\n")
            .map_err(|e| OpError::io("writing table.json", e))?;
        std::fs::write(ctx.output_path("table.md"), md).map_err(|e| OpError::io("writing table.md", e))
    }
}

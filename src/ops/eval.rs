//! Evaluation: `eval.generate` (no labels: one greedy response per test problem
//! and `draws` sampled ones, with seeds common to every policy) and
//! `eval.score` (with labels: per-population success, JSON validity, no-EOS,
//! lengths). Every output is kept, invalid ones included.

use std::collections::{BTreeMap, BTreeSet};

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{parse_params, read_jsonl, schema_of, InputDecl, Op, OpError, OutputDecl, ParamError, Role, RunContext};
use crate::data::verifier::{FinishReason, Response, VerifierRegistry};
use crate::model::DEFAULT_SYSTEM;

fn failed(e: impl std::fmt::Display) -> OpError {
    OpError::Failed(e.to_string())
}

/// Params of `eval.generate`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalGenerateParams {
    /// Sampled draws per problem (besides the greedy one).
    #[serde(default = "d_draws")]
    pub draws: usize,
    /// The sampling seed; with the draw's rollout id it fixes every sample, the
    /// same for every policy evaluated with it.
    #[serde(default = "d_eval_seed")]
    pub seed: u64,
    #[serde(default = "d_tokens")]
    pub max_new_tokens: usize,
    #[serde(default = "d_prompt")]
    pub max_prompt_tokens: usize,
    /// Rows generated together.
    #[serde(default = "d_batch")]
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// Evaluate only the first N problems (small budgets for tests); all by default.
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default = "d_system")]
    pub system: String,
    /// A name for the evaluated policy (recorded; handy as a matrix axis).
    #[serde(default)]
    pub policy: Option<String>,
}

fn d_draws() -> usize {
    4
}
fn d_eval_seed() -> u64 {
    20_000
}
fn d_tokens() -> usize {
    crate::model::MAX_RESPONSE_TOKENS
}
fn d_prompt() -> usize {
    crate::model::MAX_PROMPT_TOKENS
}
fn d_batch() -> usize {
    100
}
fn d_system() -> String {
    DEFAULT_SYSTEM.to_string()
}

/// One evaluated response, as `eval.generate` writes it (JSON lines).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalResponse {
    pub id: String,
    pub population: String,
    /// "greedy" or "sample".
    pub mode: String,
    pub draw: usize,
    pub rollout_id: Option<u64>,
    pub ids: Vec<i64>,
    pub text: String,
    pub finish: FinishReason,
    pub undecodable: Vec<u32>,
}

/// `eval.generate`.
pub struct EvalGenerate;

impl Op for EvalGenerate {
    fn name(&self) -> &'static str {
        "eval.generate"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "greedy and sampled responses of a policy to test problems; no labels (runs in the worker)"
    }
    fn params_schema(&self, generator: &mut SchemaGenerator) -> Schema {
        schema_of::<EvalGenerateParams>(generator)
    }
    fn resolve_params(&self, params: &Value) -> Result<Value, ParamError> {
        super::resolve::<EvalGenerateParams>(params, super::no_checks)
    }
    fn inputs(&self, _params: &Value) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("model", "the policy's model folder"),
            InputDecl::required("pages", "the pages to answer (data:pages.test)"),
        ])
    }
    fn outputs(&self, _params: &Value) -> Vec<OutputDecl> {
        vec![OutputDecl::file("responses"), OutputDecl::file("summary")]
    }
    fn numerical(&self) -> bool {
        true
    }
    fn role(&self, _params: &Value) -> Role {
        Role::Inference
    }
    fn run(&self, ctx: &RunContext<'_>) -> Result<(), OpError> {
        super::worker::run_in_worker(self.name(), ctx)
    }
}

/// Params of `eval.score`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScoreParams {
    /// A name for the evaluated policy (recorded).
    #[serde(default)]
    pub policy: Option<String>,
}

/// `eval.score`.
pub struct EvalScore;

impl Op for EvalScore {
    fn name(&self) -> &'static str {
        "eval.score"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "per-population success, JSON validity, no-EOS and lengths of evaluated responses"
    }
    fn params_schema(&self, generator: &mut SchemaGenerator) -> Schema {
        schema_of::<ScoreParams>(generator)
    }
    fn resolve_params(&self, params: &Value) -> Result<Value, ParamError> {
        super::resolve::<ScoreParams>(params, super::no_checks)
    }
    fn inputs(&self, _params: &Value) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("responses", "eval.generate's responses"),
            InputDecl::required("summary", "eval.generate's summary (costs)"),
            InputDecl::required("labels", "the labels of the same split (data:labels.test)"),
        ])
    }
    fn outputs(&self, _params: &Value) -> Vec<OutputDecl> {
        vec![OutputDecl::file("results")]
    }
    fn role(&self, _params: &Value) -> Role {
        Role::Scoring
    }
    fn run(&self, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let responses: Vec<EvalResponse> = read_jsonl(ctx.input_path("responses")?)?;
        let summary: Value = serde_json::from_str(
            &std::fs::read_to_string(ctx.input_path("summary")?).map_err(|e| OpError::io("reading the summary", e))?,
        )
        .map_err(failed)?;
        let labels: BTreeMap<String, Value> = read_jsonl::<Value>(ctx.input_path("labels")?)?
            .into_iter()
            .filter_map(|l| l["id"].as_str().map(|id| (id.to_string(), l.clone())))
            .collect();
        let mut results = score(&responses, &labels, &summary)?;
        let p: ScoreParams = parse_params(ctx.params).map_err(failed)?;
        results["policy"] = json!(p.policy);
        let text = serde_json::to_string_pretty(&results).map_err(failed)? + "\n";
        std::fs::write(ctx.output_path("results"), text).map_err(|e| OpError::io("writing results", e))
    }
}

#[derive(Default)]
struct Tally {
    responses: usize,
    problems: BTreeSet<String>,
    correct: usize,
    valid: usize,
    without_eos: usize,
    tokens: usize,
    reasons: BTreeMap<String, usize>,
}

impl Tally {
    fn to_json(&self) -> Value {
        let rate = |n: usize| if self.responses == 0 { Value::Null } else { json!(n as f64 / self.responses as f64) };
        let undefined = if self.responses == 0 { json!("no responses in this population") } else { Value::Null };
        json!({
            "responses": self.responses,
            "problems": self.problems.len(),
            "correct": self.correct,
            "success_rate": rate(self.correct),
            "valid_json": self.valid,
            "json_validity": rate(self.valid),
            "without_eos": self.without_eos,
            "mean_response_tokens": if self.responses == 0 { Value::Null } else { json!(self.tokens as f64 / self.responses as f64) },
            "undefined_because": undefined,
            "zero_reasons": self.reasons,
        })
    }
}

/// Scores evaluated responses against labels, per population and mode.
pub fn score(responses: &[EvalResponse], labels: &BTreeMap<String, Value>, summary: &Value) -> Result<Value, OpError> {
    let registry = VerifierRegistry::builtin();
    let verifier = registry.get("stock_arithmetic_v1").expect("builtin verifier");
    let mut tallies: BTreeMap<(String, String), Tally> = BTreeMap::new();
    for r in responses {
        let label = labels.get(&r.id).ok_or_else(|| failed(format!("response for {} has no label", r.id)))?;
        let verdict = verifier
            .verify(
                &label["problem"],
                &Response { text: &r.text, finish: r.finish, tokenization_valid: r.undecodable.is_empty() },
            )
            .map_err(failed)?;
        for population in ["ALL".to_string(), r.population.clone()] {
            let t = tallies.entry((r.mode.clone(), population)).or_default();
            t.responses += 1;
            t.problems.insert(r.id.clone());
            t.correct += usize::from(verdict.reward);
            t.valid += usize::from(verdict.valid);
            t.without_eos += usize::from(r.finish != FinishReason::Eos);
            t.tokens += r.ids.len();
            if let Some(reason) = verdict.reason {
                let name =
                    serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
                *t.reasons.entry(name).or_default() += 1;
            }
        }
    }
    let mut by_mode = serde_json::Map::new();
    for mode in ["greedy", "sample"] {
        let mut pops = serde_json::Map::new();
        for population in ["ALL", "ID50", "OOD100"] {
            let t = tallies.remove(&(mode.to_string(), population.to_string())).unwrap_or_default();
            pops.insert(population.to_string(), t.to_json());
        }
        by_mode.insert(mode.to_string(), Value::Object(pops));
    }
    Ok(json!({
        "verifier": {"name": verifier.name(), "protocol_hash": verifier.protocol_hash()},
        "greedy": by_mode["greedy"],
        "sample": by_mode["sample"],
        "metrics": {
            "greedy_pass_at_1": "greedy.<population>.success_rate: one greedy response per problem",
            "per_draw_success": "sample.<population>.success_rate: every sampled response counts (problems × draws); it is not best-of-k",
        },
        "generation_seconds": summary["generation_seconds"],
        "peak_rss_bytes": summary["peak_rss_bytes"],
        "device": summary["device"],
    }))
}

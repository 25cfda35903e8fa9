//! `analysis.constant_groups`: how often a group of G rewards is constant (so
//! every advantage is exactly zero and the group gives no reward gradient), on
//! constructed rewards, clearly labelled as such, next to the analytic value.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{parse_params, schema_of, InputDecl, Op, OpError, OutputDecl, ParamError, RunContext};
use crate::data::rng::Stream;
use crate::train::group_advantages;

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
    fn params_schema(&self, generator: &mut SchemaGenerator) -> Schema {
        schema_of::<ConstantGroupsParams>(generator)
    }
    fn check_params(&self, params: &serde_json::Value) -> Result<(), ParamError> {
        let p: ConstantGroupsParams = parse_params(params)?;
        if let Some(bad) = p.success_rates.iter().find(|r| !(0.0..=1.0).contains(*r)) {
            return Err(ParamError {
                path: vec!["success_rates".into()],
                message: format!("{bad} is not a probability"),
                unknown_key: false,
            });
        }
        Ok(())
    }
    fn inputs(&self, _params: &serde_json::Value) -> Option<Vec<InputDecl>> {
        Some(Vec::new())
    }
    fn outputs(&self, _params: &serde_json::Value) -> Vec<OutputDecl> {
        vec![OutputDecl::file("table.json"), OutputDecl::file("table.md")]
    }
    fn printed_output(&self) -> Option<&'static str> {
        Some("table.md")
    }
    fn run(&self, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let p: ConstantGroupsParams = parse_params(ctx.params).map_err(|e| OpError::Failed(e.to_string()))?;
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

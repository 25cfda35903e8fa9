//! `orchestrate generate`: the arguments, shared by the CLI (which forwards
//! them) and the worker (which runs the model).

use std::path::PathBuf;

use clap::Args;

/// Try a policy by hand: one response to one prompt.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// A Hugging Face model folder (any we can load: model.init's, a trained one, Qwen2.5).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A user message; the ChatML format (system + user + generation prompt) is applied.
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
    pub prompt: Option<String>,
    /// Raw prompt ids, fed untouched: `--prompt-ids 1,2,3`.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<i64>>,
    /// The system message for `--prompt`.
    #[arg(long, value_name = "TEXT", default_value = crate::model::DEFAULT_SYSTEM)]
    pub system: String,
    /// Greedy decoding (the default unless --seed is given).
    #[arg(long, conflicts_with = "seed")]
    pub greedy: bool,
    /// Sample at temperature 1 over the full vocabulary, reproducibly from (seed, rollout id, position).
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// The rollout id of the draw (with --seed).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "seed")]
    pub rollout_id: u64,
    #[arg(long, value_name = "N", default_value_t = crate::model::MAX_RESPONSE_TOKENS)]
    pub max_new_tokens: usize,
    /// Refuse prompts longer than this (nothing is truncated).
    #[arg(long, value_name = "N", default_value_t = crate::model::MAX_PROMPT_TOKENS)]
    pub max_prompt_tokens: usize,
    /// Recompute the whole prefix at every step instead of using the KV cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Print ids, behavior log-probs and the finish reason as JSON.
    #[arg(long)]
    pub json: bool,
}

impl GenerateArgs {
    /// The arguments again, to hand to the worker.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec!["--model".to_string(), self.model.display().to_string()];
        if let Some(p) = &self.prompt {
            a.extend(["--prompt".into(), p.clone()]);
        }
        if let Some(ids) = &self.prompt_ids {
            a.extend(["--prompt-ids".into(), ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")]);
        }
        a.extend(["--system".into(), self.system.clone()]);
        if self.greedy {
            a.push("--greedy".into());
        }
        if let Some(s) = self.seed {
            a.extend(["--seed".into(), s.to_string(), "--rollout-id".into(), self.rollout_id.to_string()]);
        }
        a.extend(["--max-new-tokens".into(), self.max_new_tokens.to_string()]);
        a.extend(["--max-prompt-tokens".into(), self.max_prompt_tokens.to_string()]);
        if self.no_cache {
            a.push("--no-cache".into());
        }
        if self.json {
            a.push("--json".into());
        }
        a
    }
}

//! `orchestrate generate`: the arguments, which the CLI parses and hands to
//! the worker (which runs the model) as a [`GenerateRequest`].

use std::path::PathBuf;

use clap::Args;
use orchestrate_core::model::GenerateRequest;

/// Try a policy by hand: one response to one prompt.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// A Hugging Face model folder (any we can load: model.init's, a trained one, Qwen2.5).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A user message; the model's chat template (system + user + generation
    /// prompt) is applied: its own, or the built-in ChatML (see --chat-template).
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
    pub prompt: Option<String>,
    /// Raw prompt ids, fed untouched: `--prompt-ids 1,2,3`.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<i64>>,
    /// The system message for `--prompt`.
    #[arg(long, value_name = "TEXT", default_value = orchestrate_core::model::DEFAULT_SYSTEM)]
    pub system: String,
    /// `model`: the folder's own chat template (tokenizer_config.json), ChatML when it ships none; `chatml`: always ChatML.
    #[arg(long, value_name = "WHICH", default_value = "model", value_parser = ["model", "chatml"])]
    pub chat_template: String,
    /// Greedy decoding (the default unless --seed is given).
    #[arg(long, conflicts_with = "seed")]
    pub greedy: bool,
    /// Sample at temperature 1 over the full vocabulary, reproducibly from (seed, rollout id, position).
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// The rollout id of the draw (with --seed).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "seed")]
    pub rollout_id: u64,
    #[arg(long, value_name = "N", default_value_t = orchestrate_core::model::MAX_RESPONSE_TOKENS)]
    pub max_new_tokens: usize,
    /// Refuse prompts longer than this (nothing is truncated).
    #[arg(long, value_name = "N", default_value_t = orchestrate_core::model::MAX_PROMPT_TOKENS)]
    pub max_prompt_tokens: usize,
    /// Recompute the whole prefix at every step instead of using the KV cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Print ids, behavior log-probs and the finish reason as JSON.
    #[arg(long)]
    pub json: bool,
}

impl GenerateArgs {
    /// What the worker runs.
    pub fn request(&self) -> GenerateRequest {
        GenerateRequest {
            model: self.model.clone(),
            prompt: self.prompt.clone(),
            prompt_ids: self.prompt_ids.clone(),
            system: self.system.clone(),
            chat_template: if self.chat_template == "chatml" {
                orchestrate_core::model::chat::TemplateChoice::Chatml
            } else {
                orchestrate_core::model::chat::TemplateChoice::Model
            },
            greedy: self.greedy,
            seed: self.seed,
            rollout_id: self.rollout_id,
            max_new_tokens: self.max_new_tokens,
            max_prompt_tokens: self.max_prompt_tokens,
            no_cache: self.no_cache,
            json: self.json,
        }
    }
}

//! `orchestrate-torch bench`: generation and scoring speed on a random model,
//! printed as JSON for `benches/model.rs`, which runs transformers beside it.

use std::time::Instant;

use anyhow::{bail, Result};
use orchestrate::model::Qwen2Config;

use super::generate::{generate, score, Sampling};
use super::qwen2::Qwen2;

pub fn preset(name: &str) -> Result<Qwen2Config> {
    let v = match name {
        "tiny" => {
            serde_json::json!({"vocab_size": 832, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "rope_theta": 10000.0})
        }
        "qwen2.5-0.5b" => serde_json::json!({"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
        other => bail!("unknown preset '{other}'; presets: tiny, qwen2.5-0.5b"),
    };
    Ok(serde_json::from_value(v)?)
}

pub fn run(
    preset_name: &str,
    batch: usize,
    prompt_len: usize,
    new_tokens: usize,
    no_cache: bool,
) -> Result<serde_json::Value> {
    let config = preset(preset_name)?;
    let device = super::generate::pick_device()?;
    let mut model = Qwen2::new(&config, device)?;
    model.init_weights(0);
    let prompts: Vec<Vec<i64>> = (0..batch)
        .map(|b| (0..prompt_len).map(|i| ((i * 31 + b * 7) % (config.vocab_size - 1) + 1) as i64).collect())
        .collect();
    // Warm-up, then the timed runs. EOS -1 never matches: every row runs to the budget.
    generate(&model, &prompts, 2, -1, &Sampling::Greedy, true)?;
    let timed = |use_cache: bool| -> Result<f64> {
        let start = Instant::now();
        let out = generate(&model, &prompts, new_tokens, -1, &Sampling::Greedy, use_cache)?;
        assert!(out.iter().all(|g| g.ids.len() == new_tokens));
        Ok(start.elapsed().as_secs_f64())
    };
    let cached = timed(true)?;
    let full = if no_cache { Some(timed(false)?) } else { None };
    let responses: Vec<Vec<i64>> = prompts.iter().map(|p| p.iter().rev().take(new_tokens).copied().collect()).collect();
    score(&model, &prompts, &responses)?;
    let start = Instant::now();
    score(&model, &prompts, &responses)?;
    let scoring = start.elapsed().as_secs_f64();
    let tokens = (batch * new_tokens) as f64;
    Ok(serde_json::json!({
        "impl": "orchestrate",
        "device": format!("{device:?}"),
        "threads": tch::get_num_threads(),
        "parameters": config.parameter_count(),
        "kv_cache_tokens_per_s": tokens / cached,
        "no_cache_tokens_per_s": full.map(|f| tokens / f),
        "scoring_s": scoring,
    }))
}

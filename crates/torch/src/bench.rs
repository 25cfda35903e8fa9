//! `orchestrate-torch bench`: generation and scoring speed on a random model,
//! printed as JSON for `benches/model.rs`, which runs transformers beside it.

use std::time::Instant;

use crate::error::{bail, Result};
use orchestrate_core::model::ModelConfig;

use super::decoder::CausalLm;
use super::generate::{generate, score, Sampling};

pub fn preset(name: &str) -> Result<ModelConfig> {
    let v = match name {
        "tiny" => {
            serde_json::json!({"vocab_size": 832, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "rope_theta": 10000.0,
            "tie_word_embeddings": true})
        }
        "qwen2.5-0.5b" => serde_json::json!({"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}),
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
    let mut model = CausalLm::new(&config, device)?;
    model.init_weights(0);
    let prompts: Vec<Vec<i64>> = (0..batch)
        .map(|b| (0..prompt_len).map(|i| ((i * 31 + b * 7) % (config.vocab_size - 1) + 1) as i64).collect())
        .collect();
    // Warm-up, then the timed runs. EOS -1 never matches: every row runs to the budget.
    generate(&model, &prompts, 2, &[], &Sampling::Greedy, true)?;
    let timed = |use_cache: bool| -> Result<f64> {
        let start = Instant::now();
        let out = generate(&model, &prompts, new_tokens, &[], &Sampling::Greedy, use_cache)?;
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

/// One GRPO iteration's cost categories on a random model (constructed rewards).
pub fn grpo_iteration(
    preset_name: &str,
    prompt_len: usize,
    iterations: usize,
    micro_groups: usize,
) -> Result<serde_json::Value> {
    use super::train::adamw::{digest, AdamW, AdamWConfig};
    use super::train::objective::group_advantages;
    use super::train::update::{behavior_gap, grpo_update, GrpoHyper};
    use orchestrate_core::guard::{TokenArtifacts, UpdateBatch};
    use std::collections::BTreeMap;

    let config = preset(preset_name)?;
    let device = super::generate::pick_device()?;
    let mut policy = CausalLm::new(&config, device)?;
    policy.init_weights(0);
    let mut reference = CausalLm::new(&config, device)?;
    reference.init_weights(0);
    let params: BTreeMap<String, tch::Tensor> = policy.vs.variables().into_iter().collect();
    let mut adam = AdamW::new(AdamWConfig::new(0.01), &params);
    let hyper = GrpoHyper { clip_eps: 0.2, beta: 0.02, kl_block: 4096, max_grad_norm: 1.0, micro_groups };
    let (prompts_n, group) = (4usize, 4usize);
    let mut totals: BTreeMap<&str, f64> = BTreeMap::new();
    let scratch_dir = std::env::temp_dir().join(format!("orchestrate-bench-grpo-{}", std::process::id()));
    std::fs::create_dir_all(&scratch_dir)?;
    let mut scratch = orchestrate_core::guard::Ledger::open_at(&scratch_dir.join("guard.sqlite"))?;
    // The high-water mark of resident memory after each phase (the first iteration's
    // are where it is reached), also printed as it goes: a run the OS kills for
    // memory still shows how far it got.
    let mut peaks: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let mut mark = |phase: &str| {
        let peak = super::train::common::peak_rss_bytes();
        eprintln!("bench-grpo: peak RSS {} MB after {phase}", peak.map_or(0, |b| b >> 20));
        peaks.entry(phase.to_string()).or_insert(peak);
    };
    mark("model, reference and optimizer");
    for it in 0..iterations {
        let loop_start = Instant::now();
        let prompts: Vec<Vec<i64>> = (0..prompts_n * group)
            .map(|r| {
                (0..prompt_len)
                    .map(|i| ((i * 31 + (r / group) * 7 + it) % (config.vocab_size - 1) + 1) as i64)
                    .collect()
            })
            .collect();
        let ids: Vec<u64> = (0..(prompts_n * group) as u64).map(|r| it as u64 * 16 + r).collect();
        let t = Instant::now();
        let out = generate(&policy, &prompts, 64, &[], &Sampling::Sample { seed: 0, rollout_ids: ids }, true)?;
        let generation = t.elapsed().as_secs_f64();
        mark("generation");
        let responses: Vec<Vec<i64>> = out.iter().map(|g| g.ids.clone()).collect();
        let behavior: Vec<Vec<f32>> = out.iter().map(|g| g.behavior_logprobs.clone()).collect();
        let t = Instant::now();
        let gap = behavior_gap(&policy, &prompts, &responses, &behavior)?;
        let verification = t.elapsed().as_secs_f64();
        mark("behavior verification");
        crate::error::ensure!(gap <= 2e-4, "behavior gap {gap}");
        let rewards: Vec<f64> = (0..prompts_n * group).map(|r| ((r * 7 + it) % 3 == 0) as u8 as f64).collect();
        let advantages: Vec<f64> = rewards.chunks(group).flat_map(group_advantages).collect();
        let rollouts: Vec<TokenArtifacts> = prompts
            .iter()
            .zip(&responses)
            .zip(&behavior)
            .map(|((p, r), b)| TokenArtifacts {
                prompt_ids: p.clone(),
                response_ids: r.clone(),
                old_logprobs: b.clone(),
                mask_start: p.len(),
                mask_len: r.len(),
            })
            .collect();
        let t = Instant::now();
        let _ = digest(&params);
        let hashing = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for update in 0..2 {
            // Constructed rewards on a random model: nothing to validate, so the
            // benchmark's updates are unguarded, on its own scratch log.
            let batch = UpdateBatch::unguarded(rollouts.clone(), &mut scratch, "bench", it, update)?;
            grpo_update(&policy, &reference, &params, &mut adam, &batch, advantages.clone(), group, &hyper, 1e-6)?;
        }
        let optimization = t.elapsed().as_secs_f64();
        mark("optimization");
        let whole = loop_start.elapsed().as_secs_f64();
        if it > 0 {
            // The first iteration is a warm-up.
            for (k, v) in [
                ("generation", generation),
                ("behavior_verification", verification),
                ("optimization_with_reference", optimization),
                ("state_hashing", hashing),
                ("loop", whole),
            ] {
                *totals.entry(k).or_default() += v;
            }
        }
    }
    let n = (iterations.max(2) - 1) as f64;
    drop(scratch);
    let _ = std::fs::remove_dir_all(&scratch_dir);
    Ok(serde_json::json!({
        "impl": "orchestrate",
        "threads": tch::get_num_threads(),
        "micro_groups": micro_groups,
        "seconds_per_iteration": totals.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v / n))).collect::<serde_json::Map<_, _>>(),
        "peak_rss_bytes": super::train::common::peak_rss_bytes(),
        "peak_rss_bytes_after": peaks,
    }))
}

/// The same random model on the CPU and on the device `ORCHESTRATE_DEVICE`
/// picks: the largest logit difference over a batch of prompts, and greedy
/// generation on both. A divergence where the CPU's top two logits are closer
/// than the devices' largest logit difference is a numerical tie (a random model's
/// logits are nearly flat), said as such; any other is not.
pub fn device_parity(preset_name: &str, prompt_len: usize, new_tokens: usize) -> Result<serde_json::Value> {
    use super::decoder::attention_mask;
    use tch::{Device, Kind, Tensor};

    let config = preset(preset_name)?;
    let device = super::generate::pick_device()?;
    let mut cpu = CausalLm::new(&config, Device::Cpu)?;
    cpu.init_weights(0);
    let mut other = CausalLm::new(&config, device)?;
    other.vs.copy(&cpu.vs)?;
    let (b, w) = (4i64, prompt_len as i64);
    let ids: Vec<i64> = (0..b * w).map(|i| (i * 131 + 7) % (config.vocab_size as i64 - 1) + 1).collect();
    let logits = |m: &CausalLm| -> Result<Tensor> {
        let d = m.device();
        let seq = Tensor::from_slice(&ids).view([b, w]).to_device(d);
        let valid = Tensor::ones([b, w], (Kind::Int64, d));
        let positions = Tensor::arange(w, (Kind::Int64, d)).view([1, w]).expand([b, w], false);
        let mask = attention_mask(&valid, w);
        Ok(tch::no_grad(|| m.forward(&seq, &positions, &mask, None)).to_kind(Kind::Float).to_device(Device::Cpu))
    };
    let (a, c) = (logits(&cpu)?, logits(&other)?);
    let max_diff = f64::try_from((&a - &c).abs().max())?;
    let scale = f64::try_from(a.abs().max())?;
    let prompts: Vec<Vec<i64>> = ids.chunks(prompt_len).map(<[i64]>::to_vec).collect();
    let on_cpu = generate(&cpu, &prompts, new_tokens, &[], &Sampling::Greedy, true)?;
    let on_device = generate(&other, &prompts, new_tokens, &[], &Sampling::Greedy, true)?;
    let mut equal_rows = 0;
    let mut divergences = Vec::new();
    for (row, (x, y)) in on_cpu.iter().zip(&on_device).enumerate() {
        match x.ids.iter().zip(&y.ids).position(|(p, q)| p != q) {
            None => equal_rows += 1,
            Some(step) => {
                // The CPU's top-two margin where the two greedy paths part.
                let context: Vec<i64> = prompts[row].iter().chain(&x.ids[..step]).copied().collect();
                let n = context.len() as i64;
                let seq = Tensor::from_slice(&context).view([1, n]);
                let valid = Tensor::ones([1, n], (Kind::Int64, Device::Cpu));
                let positions = Tensor::arange(n, (Kind::Int64, Device::Cpu)).view([1, n]);
                let last = tch::no_grad(|| cpu.forward_last(&seq, &positions, &attention_mask(&valid, n), None));
                let (top, _) = last.to_kind(Kind::Float).view([-1]).topk(2, -1, true, true);
                let margin = f64::try_from(top.get(0) - top.get(1))?;
                divergences.push(serde_json::json!({
                    "row": row, "step": step, "cpu_top2_margin": margin, "numerical_tie": margin <= max_diff
                }));
            }
        }
    }
    Ok(serde_json::json!({
        "device": format!("{device:?}"),
        "parameters": config.parameter_count(),
        "logits_max_abs_difference": max_diff,
        "logits_max_abs": scale,
        "greedy_rows": prompts.len(),
        "greedy_equal_rows": equal_rows,
        "greedy_tokens_per_row": new_tokens,
        "divergences": divergences,
    }))
}

//! Generation and teacher-forced scoring.
//!
//! Sampling is reproducible from (seed, rollout id, position) alone: each draw
//! is an inverse-CDF lookup, on the device, of a uniform that a counter-based
//! generator derives from those three numbers. No RNG state exists, so a
//! resumed run draws exactly what a continuous one would, and a row's draws do
//! not depend on which other rows share its batch. The behavior log-prob of
//! each token is taken from the very logits it was sampled from.

use crate::error::{bail, Result};
use orchestrate_core::data::verifier::FinishReason;
use tch::{Device, Kind, Tensor};

use super::decoder::{attention_mask, CausalLm, KvCache};

/// How tokens are chosen. Temperature is 1 over the full vocabulary: no top-k,
/// no top-p, nothing suppressed.
#[derive(Debug, Clone)]
pub enum Sampling {
    Greedy,
    /// One rollout id per prompt.
    Sample {
        seed: u64,
        rollout_ids: Vec<u64>,
    },
}

/// One generated response.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// Response ids, the final EOS included when there is one.
    pub ids: Vec<i64>,
    /// log p(token) under the logits it was sampled from, one per id.
    pub behavior_logprobs: Vec<f32>,
    pub finish: FinishReason,
}

/// A uniform in [0, 1) that depends only on (seed, rollout id, position).
pub fn uniform(seed: u64, rollout_id: u64, position: u64) -> f64 {
    let mut h = blake3::Hasher::new();
    h.update(b"orchestrate.sample.v1\0");
    h.update(&seed.to_le_bytes());
    h.update(&rollout_id.to_le_bytes());
    h.update(&position.to_le_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.finalize().as_bytes()[..8]);
    (u64::from_le_bytes(b) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Picks one token per row from (batch, vocab) float logits; returns ids and their log-probs.
fn choose(logits: &Tensor, sampling: &Sampling, position: u64) -> (Tensor, Tensor) {
    let logp = logits.to_kind(Kind::Float).log_softmax(-1, Kind::Float);
    let ids = match sampling {
        Sampling::Greedy => logp.argmax(-1, false),
        Sampling::Sample { seed, rollout_ids } => {
            let u: Vec<f64> = rollout_ids.iter().map(|r| uniform(*seed, *r, position)).collect();
            let u = Tensor::from_slice(&u).to_device(logits.device());
            let cdf = logp.to_kind(Kind::Double).exp().cumsum(-1, Kind::Double);
            let total = cdf.select(1, cdf.size()[1] - 1);
            let threshold = (u * total).unsqueeze(1);
            // The first token whose cumulative probability reaches the threshold.
            let idx = cdf.lt_tensor(&threshold).sum_dim_intlist(-1, false, Kind::Int64);
            idx.clamp_max(logits.size()[1] - 1)
        }
    };
    let chosen = logp.gather(1, &ids.unsqueeze(1), false).squeeze_dim(1);
    (ids, chosen)
}

/// Generates for a batch of prompts (token ids), up to `max_new_tokens` each,
/// stopping a row at any of `stops` (its end-of-sequence ids). Prompts are left-padded; with `use_cache` the
/// prefix is computed once and each step feeds one token per row.
pub fn generate(
    model: &CausalLm,
    prompts: &[Vec<i64>],
    max_new_tokens: usize,
    stops: &[i64],
    sampling: &Sampling,
    use_cache: bool,
) -> Result<Vec<Generated>> {
    if prompts.is_empty() {
        return Ok(Vec::new());
    }
    if let Sampling::Sample { rollout_ids, .. } = sampling {
        if rollout_ids.len() != prompts.len() {
            bail!("{} rollout ids for {} prompts", rollout_ids.len(), prompts.len());
        }
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        bail!("prompt {i} is empty");
    }
    let device = model.device();
    let b = prompts.len() as i64;
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(prompts.len() * width);
    let mut valid = Vec::with_capacity(prompts.len() * width);
    for p in prompts {
        let pad = width - p.len();
        ids.extend(std::iter::repeat_n(0i64, pad).chain(p.iter().copied()));
        valid.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1i64, p.len())));
    }
    let mut seq = Tensor::from_slice(&ids).view([b, width as i64]).to_device(device);
    let mut key_valid = Tensor::from_slice(&valid).view([b, width as i64]).to_device(device);
    // Left padding: a row's positions count its own tokens only.
    let positions_of = |kv: &Tensor| (kv.cumsum(1, Kind::Int64) - 1).clamp_min(0);
    let mut out: Vec<Generated> = prompts
        .iter()
        .map(|_| Generated { ids: Vec::new(), behavior_logprobs: Vec::new(), finish: FinishReason::Length })
        .collect();
    let mut done = vec![false; prompts.len()];
    let mut cache: KvCache = Vec::new();
    tch::no_grad(|| -> Result<()> {
        let mut step_input = seq.shallow_clone();
        // Positions of the next token of each row (decode steps only need these).
        let mut next_position = key_valid.sum_dim_intlist(1, true, Kind::Int64);
        for position in 0..max_new_tokens {
            let (logits, last) = if use_cache && position > 0 {
                let mask = attention_mask(&key_valid, 1);
                // A new tensor: `+=` would also move `pos`, which shares storage.
                let pos = std::mem::replace(&mut next_position, Tensor::zeros([1], (Kind::Int64, device)));
                next_position = &pos + 1;
                (model.forward_last(&step_input, &pos, &mask, Some(&mut cache)), 1)
            } else {
                let q = seq.size()[1];
                let positions = positions_of(&key_valid);
                let mask = attention_mask(&key_valid, q);
                let cache = if use_cache { Some(&mut cache) } else { None };
                (model.forward_last(&seq, &positions, &mask, cache), 1)
            };
            let last = logits.select(1, last - 1);
            let (next, logp) = choose(&last, sampling, position as u64);
            let next_v: Vec<i64> = Vec::<i64>::try_from(&next)?;
            let logp_v: Vec<f32> = Vec::<f32>::try_from(&logp)?;
            for (i, row) in out.iter_mut().enumerate() {
                if done[i] {
                    continue;
                }
                row.ids.push(next_v[i]);
                row.behavior_logprobs.push(logp_v[i]);
                if stops.contains(&next_v[i]) {
                    row.finish = FinishReason::Eos;
                    done[i] = true;
                }
            }
            if done.iter().all(|d| *d) {
                break;
            }
            // Finished rows keep being fed (their outputs are ignored).
            let next_col = next.view([b, 1]);
            if !use_cache {
                seq = Tensor::cat(&[&seq, &next_col], 1);
            }
            key_valid = Tensor::cat(&[&key_valid, &Tensor::ones([b, 1], (Kind::Int64, device))], 1);
            step_input = next_col;
        }
        Ok(())
    })?;
    Ok(out)
}

/// Teacher-forced log-probs of each response's tokens given its prompt, at
/// temperature 1 (the trainer's behavior check). Rows are right-padded, so
/// padding never precedes a scored token.
pub fn score(model: &CausalLm, prompts: &[Vec<i64>], responses: &[Vec<i64>]) -> Result<Vec<Vec<f32>>> {
    if prompts.len() != responses.len() {
        bail!("{} prompts for {} responses", prompts.len(), responses.len());
    }
    if prompts.is_empty() {
        return Ok(Vec::new());
    }
    if prompts.iter().any(Vec::is_empty) {
        bail!("an empty prompt has no position that predicts its response's first token");
    }
    let device = model.device();
    tch::no_grad(|| {
        let (logits, _, _) = response_logits(model, prompts, responses);
        let mut out = Vec::with_capacity(prompts.len());
        for (i, r) in responses.iter().enumerate() {
            if r.is_empty() {
                out.push(Vec::new());
                continue;
            }
            let rows = logits.get(i as i64).narrow(0, 0, r.len() as i64);
            let logp = rows.to_kind(Kind::Float).log_softmax(-1, Kind::Float);
            let targets = Tensor::from_slice(r).to_device(device).unsqueeze(1);
            let chosen = logp.gather(1, &targets, false).squeeze_dim(1);
            out.push(Vec::<f32>::try_from(&chosen)?);
        }
        Ok(out)
    })
}

/// Logits at the response positions of each row: (rows, tokens, vocab), with
/// the response ids and a mask, from one right-padded forward pass. The LM head
/// runs at those positions only ([`Qwen2::forward_rows`]).
pub fn response_logits(model: &CausalLm, prompts: &[Vec<i64>], responses: &[Vec<i64>]) -> (Tensor, Tensor, Tensor) {
    response_logits_with(model, prompts, responses, false)
}

/// The same, with the LM head run at every position and the response rows picked
/// from its output: what SFT uses. It rounds differently from
/// [`response_logits`] (another matmul shape), and SFT's results are keyed and
/// cached (`train.sft` v2, and `experiments/tiny-sweep.yaml`'s table), so SFT keeps
/// the path its cached results came from.
pub fn response_logits_every_position(
    model: &CausalLm,
    prompts: &[Vec<i64>],
    responses: &[Vec<i64>],
) -> (Tensor, Tensor, Tensor) {
    response_logits_with(model, prompts, responses, true)
}

fn response_logits_with(
    model: &CausalLm,
    prompts: &[Vec<i64>],
    responses: &[Vec<i64>],
    every_position: bool,
) -> (Tensor, Tensor, Tensor) {
    let device = model.device();
    let b = prompts.len() as i64;
    let width = prompts.iter().zip(responses).map(|(p, r)| p.len() + r.len()).max().unwrap_or(1) as i64;
    let t_max = responses.iter().map(Vec::len).max().unwrap_or(1).max(1) as i64;
    let (mut ids, mut valid, mut index, mut targets, mut mask) = (vec![], vec![], vec![], vec![], vec![]);
    for (p, r) in prompts.iter().zip(responses) {
        let n = (p.len() + r.len()) as i64;
        ids.extend(p.iter().chain(r).copied().chain(std::iter::repeat_n(0, (width - n) as usize)));
        valid.extend(std::iter::repeat_n(1i64, n as usize).chain(std::iter::repeat_n(0, (width - n) as usize)));
        for j in 0..t_max {
            let inside = (j as usize) < r.len();
            // Logits at position t predict token t + 1.
            index.push(if inside { p.len() as i64 - 1 + j } else { 0 });
            targets.push(if inside { r[j as usize] } else { 0 });
            mask.push(if inside { 1.0f32 } else { 0.0 });
        }
    }
    let seq = Tensor::from_slice(&ids).view([b, width]).to_device(device);
    let key_valid = Tensor::from_slice(&valid).view([b, width]).to_device(device);
    let positions = Tensor::arange(width, (Kind::Int64, device)).view([1, width]).expand([b, width], false);
    let index = Tensor::from_slice(&index).view([b, t_max]).to_device(device);
    let mask_4d = attention_mask(&key_valid, width);
    let picked = if every_position {
        let logits = model.forward(&seq, &positions, &mask_4d, None);
        let v = logits.size()[2];
        logits.gather(1, &index.view([b, t_max, 1]).expand([b, t_max, v], false), false)
    } else {
        model.forward_rows(&seq, &positions, &mask_4d, &index)
    };
    let targets = Tensor::from_slice(&targets).view([b, t_max]).to_device(device);
    let mask = Tensor::from_slice(&mask).view([b, t_max]).to_device(device);
    (picked, targets, mask)
}

/// CUDA when available, else CPU; `ORCHESTRATE_DEVICE=cpu|cuda|cuda:N` overrides.
pub fn pick_device() -> Result<Device> {
    let asked = std::env::var("ORCHESTRATE_DEVICE").ok();
    let index = match asked.as_deref() {
        None | Some("") => return Ok(Device::cuda_if_available()),
        Some("cpu") => return Ok(Device::Cpu),
        Some("cuda") => 0,
        Some(other) => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => bail!("ORCHESTRATE_DEVICE={other}: expected cpu, cuda or cuda:N"),
        },
    };
    // A device libtorch cannot see is refused here, not keyed and failed on later.
    let count = tch::Cuda::device_count().max(0) as usize;
    if index >= count {
        bail!(
            "ORCHESTRATE_DEVICE={}: libtorch sees {} (is this libtorch built with CUDA, and the GPU visible: \
             CUDA_VISIBLE_DEVICES, nvidia-smi?)",
            asked.unwrap_or_default(),
            if count == 0 {
                "no CUDA device".to_string()
            } else {
                format!("{count} CUDA device(s), 0 to {}", count - 1)
            }
        );
    }
    Ok(Device::Cuda(index))
}

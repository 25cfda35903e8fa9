//! The worker's `generate` command.

use std::process::ExitCode;

use crate::error::{bail, Result};
use orchestrate_core::data::verifier::FinishReason;
use orchestrate_core::model::chat::ChatTemplate;
use orchestrate_core::model::GenerateRequest;

use super::decoder::load_folder;
use super::generate::{generate, pick_device, Sampling};

pub fn generate_command(args: &GenerateRequest) -> Result<ExitCode> {
    let device = pick_device()?;
    let (model, tokenizer) = load_folder(&args.model, device)?;
    let prompt_ids = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) => {
            let template = ChatTemplate::of_folder(&args.model, args.chat_template)?;
            tokenizer.encode(&template.render(&args.system, text)?)?
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    if prompt_ids.len() > args.max_prompt_tokens {
        bail!(
            "the prompt is {} tokens, over the budget of {} (--max-prompt-tokens); nothing is truncated",
            prompt_ids.len(),
            args.max_prompt_tokens
        );
    }
    let vocab = model.config.vocab_size as i64;
    if let Some(bad) = prompt_ids.iter().find(|&&i| i < 0 || i >= vocab) {
        bail!("prompt id {bad} is outside the model's vocabulary (0..{vocab})");
    }
    if prompt_ids.len() + args.max_new_tokens > model.config.max_position_embeddings {
        bail!(
            "prompt ({}) + max new tokens ({}) exceed the model's {} positions",
            prompt_ids.len(),
            args.max_new_tokens,
            model.config.max_position_embeddings
        );
    }
    let sampling = match args.seed {
        Some(seed) if !args.greedy => Sampling::Sample { seed, rollout_ids: vec![args.rollout_id] },
        _ => Sampling::Greedy,
    };
    let stops = tokenizer.stop_ids();
    let start = std::time::Instant::now();
    let out =
        generate(&model, std::slice::from_ref(&prompt_ids), args.max_new_tokens, &stops, &sampling, !args.no_cache)?
            .remove(0);
    let seconds = start.elapsed().as_secs_f64();
    // The final EOS is not part of the text; every other special token is.
    let body = match out.finish {
        FinishReason::Eos => &out.ids[..out.ids.len() - 1],
        FinishReason::Length => &out.ids[..],
    };
    let decoded = tokenizer.decode(body)?;
    if args.json {
        use orchestrate_core::model::{GenerateResponse, GenerateSampling, Greedy};
        let v = GenerateResponse {
            prompt_ids,
            ids: out.ids,
            text: decoded.text,
            behavior_logprobs: out.behavior_logprobs,
            finish_reason: out.finish,
            undecodable_ids: decoded.undecodable,
            sampling: match sampling {
                Sampling::Greedy => GenerateSampling::Greedy(Greedy::Greedy),
                Sampling::Sample { seed, .. } => GenerateSampling::Sample { seed, rollout_id: args.rollout_id },
            },
            device: format!("{device:?}"),
            seconds,
        };
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!("{}", decoded.text);
        if !decoded.undecodable.is_empty() {
            eprintln!("warning: undecodable ids {:?} (the response would be invalid)", decoded.undecodable);
        }
        eprintln!("[{:?}, {} tokens, {:.2}s]", out.finish, out.ids.len(), seconds);
    }
    Ok(ExitCode::SUCCESS)
}

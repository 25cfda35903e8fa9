//! `train.sft`: cross-entropy on reference responses (EOS included), prompt and
//! padding masked by position, normalized over all active tokens of the update
//! (not a mean of per-response means). Validation NLL after each epoch is
//! recorded and never used to pick a checkpoint.

use orchestrate_core::train::metrics::{
    NodeCosts, RunCosts, Scheduler, SftIdentity, SftMetrics, SftUpdate, SftValidation, TrainingMetrics, TrainingSummary,
};
use std::time::Instant;

use crate::error::{bail, Error, Result};
use orchestrate_core::data::rows::reference_response;
use orchestrate_core::ops::worker::{WorkerJob, WorkerOp};
use orchestrate_core::ops::{Mode, SftBranch, SftParams};
use tch::Kind;

use super::adamw::{clip_grad_norm, digest, learning_rate, zero_grad, AdamW, AdamWConfig};
use super::common::{
    examples, input_path, load_model, params, peak_rss_bytes, permutation, restore_state, write_outputs, Prompter,
};
use crate::decoder::CausalLm;
use crate::generate::{pick_device, response_logits_every_position};

struct Encoded {
    prompt: Vec<i64>,
    response: Vec<i64>,
}

/// Sum of response-token log-probs and the number of tokens, for some rows.
fn summed_logprob(model: &CausalLm, rows: &[&Encoded]) -> (tch::Tensor, f64) {
    let prompts: Vec<Vec<i64>> = rows.iter().map(|r| r.prompt.clone()).collect();
    let responses: Vec<Vec<i64>> = rows.iter().map(|r| r.response.clone()).collect();
    let (logits, targets, mask) = response_logits_every_position(model, &prompts, &responses);
    let logp = logits.log_softmax(-1, Kind::Float).gather(2, &targets.unsqueeze(2), false).squeeze_dim(2);
    let tokens = mask.sum(Kind::Float).double_value(&[]);
    ((logp * mask).sum(Kind::Float), tokens)
}

pub fn run(job: &WorkerJob, p: SftParams) -> Result<(NodeCosts, TrainingSummary)> {
    let started = Instant::now();
    let device = pick_device()?;
    let model_dir = input_path(job, "model")?;
    let (model, tokenizer) = load_model(model_dir, device)?;
    let prompter = Prompter::new(model_dir, p.chat_template, &p.system, p.prompt_template.as_deref())?;
    let eos = tokenizer.eos_id()?;
    let encode = |e: &super::common::Example| -> Result<Encoded> {
        let prompt = prompter.ids(&tokenizer, &e.statement, p.max_prompt_tokens, &e.id)?;
        let reference = reference_response(&e.label, WorkerOp::TrainSft.name())?;
        let mut response = tokenizer.encode(reference)?;
        response.push(eos);
        if response.len() > p.max_response_tokens {
            bail!(
                "example {}: the response is {} tokens, over the budget of {}; nothing is truncated",
                e.id,
                response.len(),
                p.max_response_tokens
            );
        }
        Ok(Encoded { prompt, response })
    };
    let mut rows = examples(job, "pages", "labels")?;
    let total = rows.len();
    match p.branch {
        SftBranch::Warmstart => rows.retain(|e| e.label.warmstart),
        SftBranch::Sft => rows.retain(|e| !e.label.warmstart),
        SftBranch::Pretrain => {}
    }
    let mut validation = examples(job, "validation_pages", "validation_labels")?;
    if let Some(n) = p.limit_examples {
        rows.truncate(n);
        validation.truncate(n);
    }
    if rows.is_empty() {
        match p.branch {
            SftBranch::Pretrain => bail!("the labels have no examples"),
            b => bail!(
                "no {b:?} examples among the {total} labels: 'warmstart: {}' selects the {} set (the field each label carries)",
                b == SftBranch::Warmstart,
                if b == SftBranch::Warmstart { "warm-start" } else { "SFT" }
            ),
        }
    }
    if let Some(n) = p.mix_examples {
        let mut mix = examples(job, "mix_pages", "mix_labels")?;
        if mix.len() < n {
            bail!("mix_examples is {n}, but the second corpus (mix_pages, mix_labels) has {} examples", mix.len());
        }
        mix.truncate(n);
        rows.extend(mix);
    }
    let rows: Vec<Encoded> = rows.iter().map(&encode).collect::<Result<_>>()?;
    let validation: Vec<Encoded> = validation.iter().map(&encode).collect::<Result<_>>()?;

    let params = params(&model);
    let mut adam = AdamW::new(AdamWConfig::new(p.weight_decay), &params);
    let total = rows.len().div_ceil(p.batch_size) * p.epochs;
    let identity = SftIdentity::new(&p, digest(&params), rows.len());
    let (mut start_epoch, mut updates) = (0usize, 0usize);
    let (mut history, mut validation_history): (Vec<SftUpdate>, Vec<SftValidation>) = (Vec::new(), Vec::new());
    if p.mode == Mode::Resume {
        let m = restore_state(input_path(job, "resume_from")?, "the resume state", &params, &mut adam, |m| match m {
            TrainingMetrics::Sft(m) if m.identity == identity => Ok(m),
            TrainingMetrics::Sft(_) => Err(Error::Input(
                "the resume state belongs to another SFT run (identity differs): refusing to resume".into(),
            )),
            other => {
                Err(Error::Input(format!("the resume state is the state of a {} run, not of an SFT run", other.kind())))
            }
        })?;
        (start_epoch, updates, history, validation_history) =
            (m.next_epoch, m.updates, m.history, m.validation_history);
        if m.scheduler != (Scheduler { next_update: updates, total }) {
            bail!("the scheduler position in the state does not match this run");
        }
    }
    let stop = if p.mode == Mode::Interrupt { p.interrupt_after_epochs } else { p.epochs };
    let mut optimization_seconds = 0.0;
    for epoch in start_epoch..stop {
        let order = permutation(rows.len(), p.seed, &format!("sft/{:?}", p.branch), epoch);
        for chunk in order.chunks(p.batch_size) {
            let t = Instant::now();
            let batch: Vec<&Encoded> = chunk.iter().map(|&i| &rows[i]).collect();
            let lr = learning_rate(updates, total, p.lr, p.warmup_ratio, p.min_lr_ratio);
            let (sum, tokens) = summed_logprob(&model, &batch);
            let loss = -sum / tokens;
            let loss_value = loss.double_value(&[]);
            if !loss_value.is_finite() {
                bail!("non-finite SFT loss at update {updates}");
            }
            zero_grad(&params);
            loss.backward();
            let grad_norm = clip_grad_norm(&params, p.max_grad_norm);
            adam.step(&params, lr);
            updates += 1;
            optimization_seconds += t.elapsed().as_secs_f64();
            history.push(SftUpdate { update: updates, epoch, loss: loss_value, tokens, lr, grad_norm });
        }
        let (mut nll, mut count) = (0.0, 0.0);
        tch::no_grad(|| {
            for chunk in validation.chunks(16) {
                let batch: Vec<&Encoded> = chunk.iter().collect();
                let (sum, tokens) = summed_logprob(&model, &batch);
                nll -= sum.double_value(&[]);
                count += tokens;
            }
        });
        validation_history.push(SftValidation { epoch, validation_nll: nll / count.max(1.0), tokens: count });
        eprintln!("sft {:?} epoch {epoch}: {updates} updates, validation NLL {:.4}", p.branch, nll / count.max(1.0));
        eprintln!(
            "{}epoch {}/{}  validation NLL {:.4}",
            orchestrate_core::exec::report::PROGRESS_PREFIX,
            epoch + 1,
            p.epochs,
            nll / count.max(1.0)
        );
    }
    let meta = TrainingMetrics::Sft(SftMetrics {
        identity,
        next_epoch: stop,
        complete: stop == p.epochs,
        updates,
        adam_step: adam.step,
        scheduler: Scheduler { next_update: updates, total },
        history,
        validation_history,
        final_model_digest: digest(&params),
        costs: None,
    });
    let costs = NodeCosts {
        process: RunCosts {
            seconds: started.elapsed().as_secs_f64(),
            optimization_seconds: Some(optimization_seconds),
            peak_rss_bytes: peak_rss_bytes(),
        },
        iterations: Default::default(),
    };
    let summary = TrainingSummary::of(&meta);
    write_outputs(job, &model, model_dir, &params, &adam, meta)?;
    Ok((costs, summary))
}

//! The worker side of `eval.generate`.

use std::io::Write;
use std::time::Instant;

use crate::error::Result;
use orchestrate_core::data::rows::read_pages;
use orchestrate_core::data::verifier::FinishReason;
use orchestrate_core::ops::eval::{EvalGenerateParams, EvalResponse};
use orchestrate_core::ops::worker::WorkerJob;
use orchestrate_core::store::fsx;

use super::generate::{generate, pick_device, Sampling};
use super::train::common::{input_path, load_model, peak_rss_bytes, Prompter};

pub fn run(job: &WorkerJob, p: EvalGenerateParams) -> Result<orchestrate_core::costs::NodeCosts> {
    let device = pick_device()?;
    let model_dir = input_path(job, "model")?;
    let (model, tokenizer) = load_model(model_dir, device)?;
    let prompter = Prompter::new(model_dir, p.chat_template, &p.system, p.prompt_template.as_deref())?;
    let stops = tokenizer.stop_ids();
    let mut pages = read_pages(input_path(job, "pages")?, "pages")?;
    if let Some(n) = p.limit {
        pages.truncate(n);
    }
    // (page index, mode, draw): one greedy row, then `draws` sampled rows per problem.
    let mut rows: Vec<(usize, bool, usize)> = Vec::new();
    for i in 0..pages.len() {
        rows.push((i, true, 0));
        rows.extend((0..p.draws).map(|d| (i, false, d)));
    }
    let prompts: Vec<Vec<i64>> = pages
        .iter()
        .map(|pg| prompter.ids(&tokenizer, &pg.statement, p.max_prompt_tokens, &pg.id))
        .collect::<Result<_>>()?;
    let started = Instant::now();
    let mut out = std::io::BufWriter::new(fsx::open_truncate(&job.staging.join("responses"))?);
    let (mut greedy_rows, mut sampled_rows): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.1);
    for (greedy, rows) in [(true, &mut greedy_rows), (false, &mut sampled_rows)] {
        for chunk in rows.chunks(p.batch_size) {
            let batch: Vec<Vec<i64>> = chunk.iter().map(|(i, _, _)| prompts[*i].clone()).collect();
            // Rollout ids depend on (problem, draw) only: every policy gets the same draws.
            let ids: Vec<u64> = chunk.iter().map(|(i, _, d)| (*i * p.draws.max(1) + d) as u64).collect();
            let sampling =
                if greedy { Sampling::Greedy } else { Sampling::Sample { seed: p.seed, rollout_ids: ids.clone() } };
            let generated = generate(&model, &batch, p.max_new_tokens, &stops, &sampling, true)?;
            for ((row, g), rid) in chunk.iter().zip(generated).zip(ids) {
                let page = &pages[row.0];
                let body = if g.finish == FinishReason::Eos { &g.ids[..g.ids.len() - 1] } else { &g.ids[..] };
                let decoded = tokenizer.decode(body)?;
                let r = EvalResponse {
                    id: page.id.clone(),
                    population: page.population.clone(),
                    mode: if greedy { "greedy".into() } else { "sample".into() },
                    draw: row.2,
                    rollout_id: (!greedy).then_some(rid),
                    ids: g.ids,
                    text: decoded.text,
                    finish: g.finish,
                    undecodable: decoded.undecodable,
                };
                serde_json::to_writer(&mut out, &r)?;
                out.write_all(b"\n")?;
            }
        }
    }
    out.flush()?;
    let summary = orchestrate_core::ops::eval::EvalSummary {
        problems: pages.len(),
        draws: p.draws,
        generation_seconds: None,
        peak_rss_bytes: None,
        device: format!("{device:?}"),
    };
    fsx::write_file(&job.staging.join("summary"), serde_json::to_string_pretty(&summary)? + "\n")?;
    // What the generation cost goes beside the outputs, into the node's record.
    let costs = orchestrate_core::costs::NodeCosts {
        process: orchestrate_core::costs::RunCosts {
            seconds: started.elapsed().as_secs_f64(),
            optimization_seconds: None,
            peak_rss_bytes: peak_rss_bytes(),
        },
        iterations: Default::default(),
    };
    Ok(costs)
}

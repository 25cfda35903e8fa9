//! The worker's implementations of numerical ops.

use crate::error::{Context, Result};
use orchestrate_core::costs::NodeCosts;
use orchestrate_core::guard::Ledger;
use orchestrate_core::model::TextTokenizer;
use orchestrate_core::ops::worker::{WorkerJob, WorkerTask};
use orchestrate_core::ops::ModelInitParams;
use orchestrate_core::store::fsx;
use tch::Device;

use super::decoder::CausalLm;

/// Runs one job from `orchestrate run`: what its process cost, for an op
/// that measures it. `ledger` is the guard's ledger as the executor serves it
/// (only GRPO asks it anything).
pub fn run(job: &WorkerJob, ledger: Ledger) -> Result<Option<NodeCosts>> {
    match job.task.clone() {
        WorkerTask::ModelInit(p) => model_init(job, p).map(|()| None),
        WorkerTask::TrainSft(p) => super::train::sft::run(job, p).map(Some),
        WorkerTask::TrainGrpo(p) => super::train::grpo::run(job, p, ledger).map(Some),
        WorkerTask::EvalGenerate(p) => super::eval::run(job, p).map(Some),
        WorkerTask::Replay(p) => super::train::replay::run(job, p).map(|()| None),
    }
}

fn model_init(job: &WorkerJob, p: ModelInitParams) -> Result<()> {
    let tokenizer_path = job.inputs.get("tokenizer").and_then(|v| v.first()).context("input 'tokenizer' is missing")?;
    let tokenizer = TextTokenizer::from_file(tokenizer_path)?;
    let eos = tokenizer.eos_id()?;
    let config = p.config(tokenizer.vocab_size() as usize, eos)?;
    let vocab = config.vocab_size;
    // Initialised on the CPU generator so the weights do not depend on the device.
    let mut model = CausalLm::new(&config, Device::Cpu)?;
    model.init_weights(p.seed);
    let out = job.staging.join("model");
    model.save(&out)?;
    fsx::copy_file(tokenizer_path, &out.join("tokenizer.json")).context("copying tokenizer.json")?;
    let generation = orchestrate_core::model::GenerationConfig::sampling(eos);
    fsx::write_file(&out.join("generation_config.json"), serde_json::to_string_pretty(&generation)? + "\n")?;
    eprintln!(
        "model.init: {} parameters, vocab {vocab} (tokenizer {}), eos {eos}",
        config.parameter_count(),
        tokenizer.vocab_size()
    );
    Ok(())
}
